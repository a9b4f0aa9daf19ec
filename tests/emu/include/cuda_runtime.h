/* cuda_runtime.h — under the emulator, <cuda_runtime.h> is tests/emu/emu.h (force-included
 * already): the toolkit's own cuda_runtime.h pulls in device-compiler headers a host
 * compiler cannot take. */
#include "../emu.h"

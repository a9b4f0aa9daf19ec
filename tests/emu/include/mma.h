/* mma.h — under the emulator, <mma.h> is the emulated nvcuda::wmma (tests/emu/wmma.h,
 * already force-included with emu.h). */
#include "../emu.h"

/* membw.h — measures this machine's memory read bandwidth, the denominator of the
 * decode roofline (a memory-bound decode step reads every weight once).
 *
 * The buffer is much larger than the last-level cache so the figure is DRAM bandwidth.
 * Runs on the given thread pool (so it uses the same number of threads as the forward
 * pass it is compared with). Takes about 0.1–0.5 s. */
#ifndef TESSERA_UTIL_MEMBW_H
#define TESSERA_UTIL_MEMBW_H

#include <stddef.h>

struct threadpool;

/* Returns the best read bandwidth in bytes/second over `reps` passes of a `bytes`-sized
 * buffer (0 picks 256 MiB), or a negative value if the buffer cannot be allocated. */
double membw_read(struct threadpool *tp, size_t bytes, int reps);

#endif

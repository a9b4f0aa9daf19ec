/* grow.h — geometric growth of a caller-owned array (the one helper for buffers that
 * reach a high-water mark and are then reused, e.g. per-request output buffers). */
#ifndef TESSERA_UTIL_GROW_H
#define TESSERA_UTIL_GROW_H

#include <stdbool.h>
#include <stddef.h>

/* Makes *p (elements of elem bytes, capacity *cap elements) hold at least need elements,
 * doubling from 64. Returns false on allocation failure (*p and *cap unchanged). Any
 * thread; no shared state. */
bool grow_array(void **p, size_t *cap, size_t need, size_t elem);

#endif

/* bigalloc.h — large, long-lived buffers on memory the kernel may back with 2 MiB pages.
 *
 * A CPU decode step streams every packed weight once through the TLB: with 4 KiB pages
 * the default model's ~92 MB of packed weights are ~23,000 pages, a page walk for every
 * 4 KiB read. big_alloc maps anonymous memory aligned to 2 MiB and advises transparent
 * huge pages on it (madvise MADV_HUGEPAGE, which the common `madvise` THP setting
 * honours), so the same stream takes 46 walks. Pages are still committed on first touch
 * and read as zeros, as calloc's do. Buffers under 2 MiB, builds without MADV_HUGEPAGE
 * and AddressSanitizer builds (whose redzones need the allocator) come from the heap
 * instead, zeroed up front.
 *
 * Used for the packed weights (written whole at load, so 2 MiB pages cost no extra
 * memory) and the bandwidth probe the decode roofline is measured with (the same page
 * size as the weights it is compared with). Not for the KV pool: a sequence touches a few
 * KiB of every layer's part of it, and 2 MiB pages would commit 2 MiB per layer.
 *
 * The caller keeps the size: big_free takes the same `bytes` big_alloc was given.
 */
#ifndef TESSERA_UTIL_BIGALLOC_H
#define TESSERA_UTIL_BIGALLOC_H

#include <stddef.h>

/* bytes of zeroed memory, 64-byte aligned at least; NULL when out of memory. */
void *big_alloc(size_t bytes);
/* Frees p (NULL: nothing) from big_alloc(bytes). */
void big_free(void *p, size_t bytes);
/* Hands the whole pages inside [p, p + n), a range of a buffer of big_alloc(bytes), back
 * to the kernel and makes them inaccessible (PROT_NONE), for bytes that have been
 * copied elsewhere and must never be read again: a stray read faults at once instead of
 * reading zeros. Returns the bytes handed back: 0 for a heap buffer (under 2 MiB, or
 * builds without the mmap path), whose range AddressSanitizer poisons instead so that a
 * stray read is reported there. big_free frees the buffer as usual. */
size_t big_release(size_t bytes, const void *p, size_t n);

#endif

/* bigalloc.c — see bigalloc.h. */
#define _GNU_SOURCE
#include "util/bigalloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define BIG_PAGE ((size_t)2 << 20)

/* mmap + MADV_HUGEPAGE where the system has the advice and no AddressSanitizer runs */
#if defined(__SANITIZE_ADDRESS__)
#define BIG_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BIG_ASAN 1
#endif
#endif
#ifdef BIG_ASAN
#define BIG_USE_MMAP 0
#include <sanitizer/asan_interface.h>
#define BIG_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define BIG_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define BIG_POISON(p, n) ((void)(p), (void)(n))
#define BIG_UNPOISON(p, n) ((void)(p), (void)(n))
#endif
#ifndef BIG_USE_MMAP
#ifdef MADV_HUGEPAGE
#define BIG_USE_MMAP 1
#else
#define BIG_USE_MMAP 0
#endif
#endif

/* The heap fallback: 64-byte aligned, zeroed (every page touched, unlike calloc's). */
static void *heap_alloc(size_t bytes)
{
    size_t n = bytes ? (bytes + 63) & ~(size_t)63 : 64;
    if (n < bytes) return NULL;
    void *p = aligned_alloc(64, n);
    if (p) memset(p, 0, n);
    return p;
}

#if BIG_USE_MMAP
static size_t round_up(size_t n) { return (n + BIG_PAGE - 1) / BIG_PAGE * BIG_PAGE; }

void *big_alloc(size_t bytes)
{
    if (bytes < BIG_PAGE) return heap_alloc(bytes);
    size_t len = round_up(bytes);
    if (len < bytes || len > SIZE_MAX - BIG_PAGE) return NULL;
    /* one page more than needed, then the unaligned head and the tail given back */
    uint8_t *raw = mmap(NULL, len + BIG_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + BIG_PAGE - 1) & ~(uintptr_t)(BIG_PAGE - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    if (raw + len + BIG_PAGE > p + len) munmap(p + len, (size_t)(raw + len + BIG_PAGE - (p + len)));
    madvise(p, len, MADV_HUGEPAGE); /* advice only: without it the memory is still usable */
    return p;
}

void big_free(void *p, size_t bytes)
{
    if (!p) return;
    if (bytes < BIG_PAGE) {
        BIG_UNPOISON(p, bytes);
        free(p);
    } else {
        munmap(p, round_up(bytes));
    }
}

size_t big_release(size_t bytes, const void *p, size_t n)
{
    if (bytes < BIG_PAGE) {
        BIG_POISON(p, n);
        return 0;
    }
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1), b = ((uintptr_t)p + n) & ~(page - 1);
    if (b <= a) return 0;
    /* both are advice-like: if either fails the bytes stay, readable, and nothing breaks */
    if (madvise((void *)a, b - a, MADV_DONTNEED) != 0) return 0;
    mprotect((void *)a, b - a, PROT_NONE);
    return b - a;
}
#else
void *big_alloc(size_t bytes) { return heap_alloc(bytes); }

void big_free(void *p, size_t bytes)
{
    if (!p) return;
    BIG_UNPOISON(p, bytes);
    free(p);
}

size_t big_release(size_t bytes, const void *p, size_t n)
{
    (void)bytes;
    BIG_POISON(p, n);
    return 0;
}
#endif

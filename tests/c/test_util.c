/* test_util.c — util/: fp16/bf16 conversion, dtype traits, thread pool, growth of
 * arrays, map_release (pages of a file mapping leave RSS, data reads back the same;
 * anything outside the mapping is never touched), big_alloc (zeroed, aligned, whole,
 * huge pages advised) and big_release (whole pages inside the range leave, reading them
 * faults or, under ASan, is reported; the bytes around stay). */
#define _POSIX_C_SOURCE 200809L
#include "test.h"
#include "util/bigalloc.h"
#include "util/grow.h"
#include "util/half.h"
#include "util/mapfile.h"
#include "util/query.h"
#include "util/tensor.h"
#include "util/threadpool.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_fp16_roundtrip(void)
{
    /* every finite fp16 value converts to float and back exactly */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue; /* inf/nan */
        float f = fp16_to_fp32((uint16_t)h);
        uint16_t back = fp32_to_fp16(f);
        CHECK(back == h, "h=%04x f=%g back=%04x", h, f, back);
    }
    CHECK(fp32_to_fp16(65520.0f) == 0x7c00, "overflow to inf");
    CHECK(fp32_to_fp16(1.0f + 1.0f / 2048) == 0x3c00, "tie rounds to even");
    CHECK(fp32_to_fp16(1.0f + 3.0f / 2048) == 0x3c02, "tie rounds to even (up)");
    CHECK(fp16_to_fp32(0x0001) == 5.9604644775390625e-8f, "smallest subnormal");
}

static void test_bf16(void)
{
    CHECK(bf16_to_fp32(0x3f80) == 1.0f, "one");
    CHECK(fp32_to_bf16(1.0f) == 0x3f80, "one back");
    CHECK(fp32_to_bf16(fp32_from_bits(0x3f808000u)) == 0x3f80, "tie to even");
    CHECK(fp32_to_bf16(fp32_from_bits(0x3f818000u)) == 0x3f82, "tie to even up");
}

static void test_dtype(void)
{
    CHECK(dtype_row_bytes(DT_Q4_1, 576) == 18 * 20, "q4_1 row");
    CHECK(dtype_row_bytes(DT_Q4_1, 577) == 0, "not a block multiple");
    CHECK(dtype_row_bytes(DT_Q6_K, 512) == 2 * 210, "q6_k row");
    CHECK(dtype_row_bytes(DT_F32, INT64_MAX) == 0, "overflow");
    CHECK(!dtype_is_supported(4) && !dtype_is_supported(-1) && !dtype_is_supported(1000), "unknown types");
    CHECK(dtype_is_supported(DT_BF16), "bf16");
}

struct sum_arg { atomic_long total; long n; };

static void sum_fn(void *p, int ith, int nth)
{
    struct sum_arg *a = p;
    long b, e, s = 0;
    tp_split(a->n, ith, nth, &b, &e);
    for (long i = b; i < e; i++) s += i;
    atomic_fetch_add(&a->total, s);
}

static void test_threadpool(void)
{
    for (int n = 1; n <= 4; n++) {
        struct threadpool *tp = tp_create(n);
        CHECK(tp && tp_size(tp) == n, "create %d", n);
        for (int rep = 0; rep < 2000; rep++) {
            struct sum_arg a = { 0, 1000 + rep };
            tp_run(tp, sum_fn, &a);
            long want = (long)(a.n - 1) * a.n / 2;
            if (atomic_load(&a.total) != want) { CHECK(0, "n=%d rep=%d", n, rep); break; }
        }
        tp_free(tp);
    }
}

static void test_grow_array(void)
{
    int *a = NULL;
    size_t cap = 0;
    CHECK(grow_array((void **)&a, &cap, 0, sizeof *a) && a == NULL && cap == 0, "need 0: no-op");
    CHECK(grow_array((void **)&a, &cap, 1, sizeof *a) && a && cap == 64, "first: 64, cap %zu", cap);
    for (int i = 0; i < 64; i++) a[i] = i;
    CHECK(grow_array((void **)&a, &cap, 65, sizeof *a) && cap == 128, "doubles: cap %zu", cap);
    CHECK(grow_array((void **)&a, &cap, 1000, sizeof *a) && cap == 1024, "to fit: cap %zu", cap);
    int ok = 1;
    for (int i = 0; i < 64; i++) ok &= a[i] == i;
    CHECK(ok, "contents kept");
    int *keep = a;
    CHECK(grow_array((void **)&a, &cap, 1024, sizeof *a) && a == keep, "fits: unchanged");
    CHECK(!grow_array((void **)&a, &cap, (size_t)-1 / 2, sizeof *a) && a == keep && cap == 1024,
          "overflow refused, unchanged");
    free(a);
}

/* ---- map_release ---------------------------------------------------------------------- */

#define MAP_PAGES 16

static uint8_t map_byte(size_t i, size_t page) { return (uint8_t)(i * 7 + i / page); }

/* Writes a MAP_PAGES-page file of map_byte values, maps it and unlinks it (the mapping
 * keeps the file alive, and released pages must come back from it), then faults every
 * page in. Returns 0 on success. */
static int map_pattern(struct mapped_file *m, size_t page)
{
    char path[256], err[256];
    snprintf(path, sizeof path, "/tmp/tessera_test_util_%d.bin", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    for (size_t i = 0; i < MAP_PAGES * page; i++) fputc(map_byte(i, page), f);
    fclose(f);
    int rc = map_open(path, m, err, sizeof err);
    unlink(path);
    if (rc) {
        fprintf(stderr, "  %s\n", err);
        return rc;
    }
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < m->size; i += page) sink ^= m->data[i];
    (void)sink;
    return 0;
}

static int pattern_intact(const uint8_t *p, size_t n, size_t page)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != map_byte(i, page)) return 0;
    return 1;
}

static void test_map_release_drops_pages(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    struct mapped_file m;
    if (map_pattern(&m, page)) { CHECK(0, "cannot map a temp file"); return; }
    long all = test_pages_present(m.data, m.size, page);
    if (all < 0) {
        map_close(&m);
        SKIP("/proc/self/pagemap is not readable");
        return;
    }
    CHECK(all == MAP_PAGES, "after reading, %ld of %d pages resident", all, MAP_PAGES);
    /* less than a whole page: rounds inward to nothing */
    CHECK(map_release(&m, m.data + 2 * page + 1, page) == 0, "a part of a page was released");
    CHECK(test_pages_present(m.data + 2 * page, 2 * page, page) == 2, "pages 2-3 stay");
    /* from inside page 3 to inside page 9: pages 4..8 go, the partly covered 3 and 9 stay */
    size_t got = map_release(&m, m.data + 3 * page + 100, 6 * page);
    CHECK(got == 5 * page, "released %zu bytes, want %zu", got, 5 * page);
    CHECK(test_pages_present(m.data + 4 * page, 5 * page, page) == 0, "pages 4-8 still resident");
    CHECK(test_pages_present(m.data + 3 * page, page, page) == 1, "page 3 (partly outside) released");
    CHECK(test_pages_present(m.data + 9 * page, page, page) == 1, "page 9 (partly outside) released");
    CHECK(test_pages_present(m.data, m.size, page) == MAP_PAGES - 5, "other pages released");
    /* reading faults them back from the file, unchanged */
    CHECK(pattern_intact(m.data, m.size, page), "data changed after map_release");
    CHECK(test_pages_present(m.data, m.size, page) == MAP_PAGES, "pages not faulted back");
    map_close(&m);
}

static void test_map_release_outside_mapping(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    struct mapped_file m, none = { 0 };
    if (map_pattern(&m, page)) { CHECK(0, "cannot map a temp file"); return; }
    /* page-aligned heap memory: MADV_DONTNEED here would zero it */
    uint8_t *heap = aligned_alloc(page, MAP_PAGES * page);
    if (!heap) { map_close(&m); CHECK(0, "out of memory"); return; }
    for (size_t i = 0; i < MAP_PAGES * page; i++) heap[i] = map_byte(i, page);
    CHECK(map_release(&m, heap, MAP_PAGES * page) == 0, "heap range released");
    CHECK(map_release(&m, heap + page, page) == 0, "heap page released");
    CHECK(map_release(&none, heap, MAP_PAGES * page) == 0, "released through an empty mapping");
    CHECK(pattern_intact(heap, MAP_PAGES * page, page), "heap memory changed");
    /* a range that runs past the end of the mapping, and an empty one */
    CHECK(map_release(&m, m.data + 8 * page, 9 * page) == 0, "range past the end released");
    CHECK(map_release(&m, m.data + 8 * page, 0) == 0, "empty range released");
    long present = test_pages_present(m.data, m.size, page);
    CHECK(present < 0 || present == MAP_PAGES, "%ld of %d pages resident", present, MAP_PAGES);
    CHECK(pattern_intact(m.data, m.size, page), "mapped data changed");
    free(heap);
    map_close(&m);
}

#if defined(__SANITIZE_ADDRESS__)
#define TEST_BIG_MMAP 0 /* big_alloc is calloc under ASan */
#else
#define TEST_BIG_MMAP 1
#endif

/* 1 if /proc/self/smaps lists the mapping holding p with the hugepage advice (VmFlags
 * "hg"), 0 if without, -1 if it cannot tell (no /proc, no such mapping). */
static int huge_advised(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int inside = 0, found = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) /* a mapping's header line */
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (inside && !strncmp(line, "VmFlags:", 8)) {
            found = strstr(line, " hg") != NULL;
            break;
        }
    }
    fclose(f);
    return found;
}

static void test_big_alloc(void)
{
    const size_t mib2 = (size_t)2 << 20;
    const size_t sizes[] = { 0, 100, mib2 - 64, mib2, 5 * mib2 + 123 };
    for (int round = 0; round < 2; round++) /* the second round gets memory the first freed */
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            size_t n = sizes[k];
            uint8_t *p = big_alloc(n);
            CHECK(p != NULL, "big_alloc(%zu)", n);
            if (!p) continue;
            CHECK((uintptr_t)p % 64 == 0, "big_alloc(%zu) at %p: not 64-byte aligned", n, (void *)p);
            size_t nonzero = 0;
            for (size_t i = 0; i < n; i++) nonzero += p[i] != 0;
            CHECK(nonzero == 0, "big_alloc(%zu): %zu bytes not zero", n, nonzero);
            for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 7 + 1);
            size_t wrong = 0;
            for (size_t i = 0; i < n; i++) wrong += p[i] != (uint8_t)(i * 7 + 1);
            CHECK(wrong == 0, "big_alloc(%zu): %zu bytes read back wrong", n, wrong);
            if (TEST_BIG_MMAP && n >= mib2) {
                CHECK((uintptr_t)p % mib2 == 0, "big_alloc(%zu) at %p: not 2 MiB aligned", n, (void *)p);
                /* a kernel built without transparent huge pages refuses the advice */
                if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0)
                    CHECK(huge_advised(p) != 0, "big_alloc(%zu): no MADV_HUGEPAGE on its mapping", n);
            }
            big_free(p, n);
        }
    big_free(NULL, 5 * mib2); /* nothing */
    big_free(NULL, 10);
}

/* 1 if reading p in a child process kills it (a fault, or AddressSanitizer's report,
 * which exits non-zero), 0 if the child reads it and exits 0, -1 if it could not tell. */
static int read_kills(const volatile uint8_t *p)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(2); /* the report is expected: quiet */
        uint8_t v = *p;
        (void)v;
        _exit(0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || (WIFEXITED(st) && WEXITSTATUS(st) == 2)) return -1;
    return WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) != 0);
}

static void test_big_release(void)
{
    const size_t mib2 = (size_t)2 << 20, n = 3 * mib2, page = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *p = big_alloc(n);
    if (!p) { CHECK(0, "big_alloc"); return; }
    memset(p, 0x5a, n);
    /* from inside page 3 to inside page 9 of the second 2 MiB: pages 4..8 go */
    uint8_t *at = p + mib2 + 3 * page + 100;
    size_t got = big_release(n, at, 6 * page);
    if (TEST_BIG_MMAP) {
        CHECK(got == 5 * page, "released %zu bytes, want %zu", got, 5 * page);
        long present = test_pages_present(p + mib2 + 4 * page, 5 * page, page);
        CHECK(present <= 0, "%ld released pages still resident", present);
    } else {
        CHECK(got == 0, "a heap buffer handed back %zu bytes", got);
    }
    /* the bytes around stay, and reading the released range faults (ASan: is reported) */
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++)
        if (p + i < at || p + i >= at + 6 * page) wrong += p[i] != 0x5a;
    CHECK(wrong == 0, "%zu bytes outside the released range changed", wrong);
    CHECK(read_kills(p + mib2 + 5 * page) == 1, "reading a released page did not fault");
    CHECK(read_kills(p + mib2 + 4 * page - 1) == !TEST_BIG_MMAP,
          "a partly released page: readable with mmap, reported under ASan");
    CHECK(read_kills(p) == 0, "reading outside the released range faulted");
    /* a small (heap) buffer: nothing handed back */
    uint8_t *q = big_alloc(100 * 1024);
    CHECK(q && big_release(100 * 1024, q + page, 4 * page) == 0, "a heap buffer handed pages back");
    big_free(q, 100 * 1024);
    big_free(p, n);
}

/* query_get: the first pair of the key, decoded; absent, empty and bad values. */
static void test_query_get(void)
{
    char v[8];
    const char *q = "stream=true&starting_after=12&x=a+b%2Fc&flag&stream=false&enc=%4";
    CHECK(query_get(q, "stream", v, sizeof v) == 1 && !strcmp(v, "true"), "first pair wins: %s", v);
    CHECK(query_get(q, "starting_after", v, sizeof v) == 1 && !strcmp(v, "12"), "%s", v);
    CHECK(query_get(q, "x", v, sizeof v) == 1 && !strcmp(v, "a b/c"), "decoded: %s", v);
    CHECK(query_get(q, "flag", v, sizeof v) == 1 && !strcmp(v, ""), "no '=': empty");
    CHECK(query_get(q, "enc", v, sizeof v) == 1 && !strcmp(v, "%4"), "a cut escape stays: %s", v);
    CHECK(query_get(q, "start", v, sizeof v) == 0 && !strcmp(v, ""), "a key prefix is not the key");
    CHECK(query_get(NULL, "stream", v, sizeof v) == 0 && query_get("", "stream", v, sizeof v) == 0, "empty");
    CHECK(query_get("a=%00", "a", v, sizeof v) == -1 && !strcmp(v, ""), "a NUL byte");
    CHECK(query_get("a=12345678", "a", v, sizeof v) == -1 && !strcmp(v, ""), "too long for 8 bytes");
    CHECK(query_get("a=1234567", "a", v, sizeof v) == 1 && !strcmp(v, "1234567"), "just fits");
}

int main(void)
{
    RUN(test_fp16_roundtrip);
    RUN(test_bf16);
    RUN(test_dtype);
    RUN(test_threadpool);
    RUN(test_grow_array);
    RUN(test_map_release_drops_pages);
    RUN(test_map_release_outside_mapping);
    RUN(test_big_alloc);
    RUN(test_big_release);
    RUN(test_query_get);
    return test_summary();
}

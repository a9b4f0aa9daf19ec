/* test.h — the tiny harness every C unit test uses.
 *
 *   static void test_something(void) { CHECK(x == 1, "x was %d", x); }
 *   int main(void) { RUN(test_something); return test_summary(); }
 *
 * A test function fails if any CHECK in it fails; the first few failures print their
 * location and message. A test that does not apply on this machine (never one whose data
 * is merely missing: that is a failure) calls SKIP(reason) and returns. test_summary()
 * prints "N passed, N failed" (counting test functions), with ", N skipped" when any
 * skipped, and returns the exit status. test_path() resolves paths relative to the
 * repository root (TESSERA_ROOT, default "."), test_data_path() inside the reference data
 * scripts/get-testdata.py provisions (TESSERA_TESTDATA, default ROOT/build/testdata).
 * test_pages_present() counts the pages of a range that are in this process's RSS.
 */
#ifndef TESSERA_TEST_H
#define TESSERA_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_passed_, test_failed_, test_skipped_, test_cur_failed_, test_cur_skipped_;

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            if (test_cur_failed_++ < 5) {                                         \
                fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
                fprintf(stderr, __VA_ARGS__);                                     \
                fputc('\n', stderr);                                              \
            }                                                                     \
        }                                                                         \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define CHECK_CLOSE(a, b, atol, rtol)                                                   \
    CHECK(fabs((double)(a) - (double)(b)) <= (atol) + (rtol) * fabs((double)(b)),       \
          "%s=%.9g %s=%.9g", #a, (double)(a), #b, (double)(b))

/* Marks the running test skipped (the caller returns); a CHECK that failed first wins. */
#define SKIP(...)                                \
    do {                                         \
        test_cur_skipped_ = 1;                   \
        printf("  skip: ");                      \
        printf(__VA_ARGS__);                     \
        putchar('\n');                           \
    } while (0)

#define RUN(fn)                                               \
    do {                                                      \
        test_cur_failed_ = 0;                                 \
        test_cur_skipped_ = 0;                                \
        fn();                                                 \
        if (test_cur_failed_) {                               \
            test_failed_++;                                   \
            printf("FAIL %s\n", #fn);                         \
        } else if (test_cur_skipped_) {                       \
            test_skipped_++;                                  \
            printf("skip %s\n", #fn);                         \
        } else {                                              \
            test_passed_++;                                   \
            printf("ok   %s\n", #fn);                         \
        }                                                     \
        fflush(stdout);                                       \
    } while (0)

static inline int test_summary(void)
{
    if (test_skipped_)
        printf("%d passed, %d failed, %d skipped\n", test_passed_, test_failed_, test_skipped_);
    else
        printf("%d passed, %d failed\n", test_passed_, test_failed_);
    return test_failed_ ? 1 : 0;
}

/* Writes ROOT/rel (root = TESSERA_ROOT or ".") into a static buffer. */
static inline const char *test_path(const char *rel)
{
    static char buf[4][1024];
    static int i;
    const char *root = getenv("TESSERA_ROOT");
    char *b = buf[i++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", root ? root : ".", rel);
    return b;
}

/* Writes TESTDATA/rel (TESSERA_TESTDATA, or ROOT/build/testdata) into a static buffer. */
static inline const char *test_data_path(const char *rel)
{
    static char buf[4][1024];
    static int i;
    const char *dir = getenv("TESSERA_TESTDATA");
    const char *root = getenv("TESSERA_ROOT");
    char *b = buf[i++ & 3];
    if (dir)
        snprintf(b, sizeof buf[0], "%s/%s", dir, rel);
    else
        snprintf(b, sizeof buf[0], "%s/build/testdata/%s", root ? root : ".", rel);
    return b;
}

/* How many of the whole pages inside [p, p + n) are mapped into this process (count in
 * its RSS), by the present bit of /proc/self/pagemap; -1 when pagemap cannot be read.
 * page: the page size. mincore() cannot tell this for a file mapping: it reports
 * whether the file's page is in the page cache, which MADV_DONTNEED leaves alone. */
static inline long test_pages_present(const void *p, size_t n, size_t page)
{
    uintptr_t lo = ((uintptr_t)p + page - 1) / page, hi = ((uintptr_t)p + n) / page;
    FILE *f = fopen("/proc/self/pagemap", "rb");
    if (!f) return -1;
    long present = 0;
    if (lo < hi && fseek(f, (long)(lo * sizeof(uint64_t)), SEEK_SET) != 0) present = -1;
    for (uintptr_t i = lo; i < hi && present >= 0; i++) {
        uint64_t e;
        if (fread(&e, sizeof e, 1, f) != 1) present = -1;
        else present += (long)(e >> 63);
    }
    fclose(f);
    return present;
}

#endif

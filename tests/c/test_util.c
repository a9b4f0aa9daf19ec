/* test_util.c — util/: fp16/bf16 conversion, dtype traits, thread pool. */
#include "test.h"
#include "util/grow.h"
#include "util/half.h"
#include "util/tensor.h"
#include "util/threadpool.h"

#include <stdatomic.h>

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

int main(void)
{
    RUN(test_fp16_roundtrip);
    RUN(test_bf16);
    RUN(test_dtype);
    RUN(test_threadpool);
    RUN(test_grow_array);
    return test_summary();
}

/* bench_rowwise.cu — benchmarks of the row-wise kernels (kernels/norm.cu, rope.cu,
 * activation.cu) at Qwen2.5-7B shapes (dim 3584, 28 heads, 4 KV heads, head_dim 128,
 * ffn 18944; the per-head norm at Qwen3-8B's 32 / 8 heads), BF16 activations and cache.
 * All memory-bound: each row reports the bytes one call must move (every input read
 * once, every output written once) against the measured copy bandwidth; the issue's
 * target is >= 80% at the large (4096-token) shapes. b->tiny: a few small rows only.
 */
#include "kbench.h"

#include "kernels/activation.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

extern "C" {
#include "util/kv_dtype.h"
#include "util/rope.h"
}

#include <stdlib.h>

#include <vector>

static void bench_rmsnorm(struct kbench *b, int T, int dim)
{
    float *res = (float *)kbench_alloc_filled((size_t)T * dim * 4, 0), *delta = (float *)kbench_alloc_filled((size_t)T * dim * 4, 0);
    float *w = (float *)kbench_alloc_filled((size_t)dim * 4, 0);
    void *out = kbench_alloc_filled((size_t)T * dim * 2, 0);
    double s = kbench_time(b, [&] {
        KB_CHECK(cuda_rmsnorm_residual(out, DT_BF16, res, delta, w, T, dim, 1e-6f, NULL, NULL, 0, b->stream));
    });
    char shape[64];
    snprintf(shape, sizeof shape, "T=%d d=%d bf16 out", T, dim);
    /* residual read + written, delta read, out written (2 bytes), w read */
    kbench_row(b, "rmsnorm+residual", shape, s, (double)T * dim * (4 + 4 + 4 + 2) + dim * 4.0, 0.0, KB_MEMORY);
    cudaFree(res);
    cudaFree(delta);
    cudaFree(w);
    cudaFree(out);
}

static void bench_head_rmsnorm(struct kbench *b, int T, int nh, int nkv, int hd)
{
    const int64_t stride = (int64_t)(nh + 2 * nkv) * hd;
    float *qkv = (float *)kbench_alloc_filled((size_t)T * stride * 4, 0), *qn = (float *)kbench_alloc_filled(hd * 4, 0), *kn = (float *)kbench_alloc_filled(hd * 4, 0);
    double s = kbench_time(b, [&] {
        KB_CHECK(cuda_head_rmsnorm(qkv, stride, qn, kn, T, nh, nkv, hd, 1e-6f, 0, b->stream));
    });
    char shape[64];
    snprintf(shape, sizeof shape, "T=%d %dq+%dk x %d", T, nh, nkv, hd);
    kbench_row(b, "head_rmsnorm", shape, s, (double)T * (nh + nkv) * hd * 8, 0.0, KB_MEMORY);
    cudaFree(qkv);
    cudaFree(qn);
    cudaFree(kn);
}

static void bench_rope(struct kbench *b, int T, int nh, int nkv, int hd, enum kv_dtype kvt)
{
    const int bs = 16, nblocks = T / bs + 1;
    const int64_t stride = (int64_t)(nh + 2 * nkv) * hd;
    struct kv_layer kv = {};
    kv.dtype = kvt;
    kv.num_blocks = nblocks;
    kv.block_size = bs;
    kv.n_kv_heads = nkv;
    kv.head_dim = hd;
    kv.k_scale = kv.v_scale = 1.0f;
    kv.data = kbench_alloc_filled((size_t)nblocks * 2 * nkv * bs * hd * kv_dtype_size(kvt), 0);
    float *qkv = (float *)kbench_alloc_filled((size_t)T * stride * 4, 0), *bias = (float *)kbench_alloc_filled(stride * 4, 0);
    float *q = (float *)kbench_alloc_filled((size_t)T * nh * hd * 4, 0), *inv = (float *)kbench_alloc_filled(hd / 2 * 4, 0);
    int32_t *pos = (int32_t *)kbench_alloc_filled(T * 4, 0);
    int64_t *slots = (int64_t *)kbench_alloc_filled(T * 8, 0);
    std::vector<int32_t> hp(T);
    std::vector<int64_t> hs(T);
    std::vector<float> hinv(hd / 2);
    for (int t = 0; t < T; t++) {
        hp[t] = 1000 + 37 * t;
        hs[t] = t;
    }
    struct rope_params rp = {};
    rp.theta = 1000000.0;
    rp.factor = 1.0;
    rope_inv_freq(hinv.data(), hd, &rp, NULL);
    KB_CHECK(cudaMemcpy(pos, hp.data(), T * 4, cudaMemcpyHostToDevice));
    KB_CHECK(cudaMemcpy(slots, hs.data(), T * 8, cudaMemcpyHostToDevice));
    KB_CHECK(cudaMemcpy(inv, hinv.data(), hd / 2 * 4, cudaMemcpyHostToDevice));
    double s = kbench_time(b, [&] {
        KB_CHECK(cuda_rope_kv_write(q, &kv, qkv, stride, bias, pos, slots, inv, 1.0f, ROPE_NEOX, T, nh, NULL, 0, b->stream));
    });
    char shape[64];
    snprintf(shape, sizeof shape, "T=%d %d/%d x %d, %s kv", T, nh, nkv, hd, kv_dtype_name(kvt));
    /* qkv read; q written (F32); k and v written in the cache dtype; bias, positions, slots */
    double bytes = (double)T * (stride * 4 + (double)nh * hd * 4 + 2.0 * nkv * hd * kv_dtype_size(kvt) + 12) +
                   stride * 4.0;
    kbench_row(b, "rope+kv_write", shape, s, bytes, 0.0, KB_MEMORY);
    cudaFree(kv.data);
    cudaFree(qkv);
    cudaFree(bias);
    cudaFree(q);
    cudaFree(inv);
    cudaFree(pos);
    cudaFree(slots);
}

static void bench_silu(struct kbench *b, int T, int ffn)
{
    float *gu = (float *)kbench_alloc_filled((size_t)T * 2 * ffn * 4, 0);
    void *out = kbench_alloc_filled((size_t)T * ffn * 2, 0);
    double s = kbench_time(b, [&] {
        KB_CHECK(cuda_silu_mul_rows(out, DT_BF16, gu, gu + ffn, 2 * (int64_t)ffn, T, ffn, NULL, 0, b->stream));
    });
    char shape[64];
    snprintf(shape, sizeof shape, "T=%d ffn=%d bf16 out", T, ffn);
    kbench_row(b, "silu_mul", shape, s, (double)T * ffn * (8 + 2), 0.0, KB_MEMORY);
    cudaFree(gu);
    cudaFree(out);
}

static void bench_rowwise(struct kbench *b)
{
    if (b->tiny) {
        bench_rmsnorm(b, 3, 64);
        bench_head_rmsnorm(b, 3, 4, 2, 64);
        bench_rope(b, 3, 4, 2, 64, KV_BF16);
        bench_silu(b, 3, 64);
        return;
    }
    for (int T : { 1, 64, 4096 }) bench_rmsnorm(b, T, 3584);
    for (int T : { 64, 4096 }) bench_head_rmsnorm(b, T, 32, 8, 128);
    for (int T : { 64, 4096 }) bench_rope(b, T, 28, 4, 128, KV_BF16);
    bench_rope(b, 4096, 28, 4, 128, KV_FP8_E4M3);
    for (int T : { 64, 4096 }) bench_silu(b, T, 18944);
}
KBENCH_REGISTER(bench_rowwise);

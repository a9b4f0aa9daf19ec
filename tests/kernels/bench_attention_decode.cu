/* bench_attention_decode.cu — decode attention (kernels/attention_decode.cu) at Qwen2.5-7B
 * shapes: 28 query heads over 4 KV heads, head_dim 128, block_size 16, BF16 output.
 * Memory-bound: each row counts the bytes one call must move (every K/V element of every
 * context once, q read, out written; not the split-K partials) against the device-to-device
 * copy bandwidth measured in the same run. Rows:
 *   S=64 ctx=2048          the issue's target: >= 80% of copy bandwidth with a BF16 cache,
 *                          and the FP8 cache in <= 0.6x the BF16 time (printed after the rows)
 *   part=512, nosplit      the same batch with the partitioning forced (automatic: two
 *                          partitions of 1024), to tune the automatic cap on a real GPU
 *   S=1 / S=8 ctx=1024     the batch-1 and batch-8 decode steps' shapes (tool_bench_cuda's
 *                          context): automatic (16 partitions of 64 positions) against
 *                          "part=512" (fixed: the backend's split before the automatic cap,
 *                          TESSERA_CUDA_DECODE_SPLIT=fixed)
 *   S=8 ctx=4096, S=1 ctx=32768   few sequences, long contexts: split-K must fill the GPU
 *   S=256 ctx=512          many short contexts
 *   rows=16                S=1 / S=8 ctx=1024, S=64 ctx=2048 (BF16, FP8) and S=256 ctx=512
 *                          again with 16 query heads per block (16x16x16 fragments, the
 *                          layout before 8-head blocks; automatic here is 8: Qwen's group
 *                          is 7); the rows=8 / rows=16 time ratios are printed after the rows
 * Blocks are interleaved across sequences (a pool after some churn), not contiguous.
 * b->tiny: two sequences of 100 positions (emulator: proves the bench runs).
 */
#include "kbench.h"

#include "kernels/attention_decode.h"

extern "C" {
#include "util/kv_dtype.h"
}

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

/* Times num_seqs sequences of ctx positions; returns seconds per call. */
static double bench_one(struct kbench *b, const char *label, int num_seqs, int ctx, int partition,
                        enum kv_dtype kvt, int rows = 0)
{
    const int max_partitions = partition ? INT_MAX : 0; /* a forced partition size is not capped */
    const int nh = b->tiny ? 7 : 28, nkv = b->tiny ? 1 : 4, hd = 128, bs = 16;
    const int max_blocks = (ctx + bs - 1) / bs, num_blocks = num_seqs * max_blocks;
    std::vector<int32_t> meta((size_t)num_seqs + (size_t)num_blocks);
    for (int s = 0; s < num_seqs; s++) meta[s] = ctx;
    for (int s = 0; s < num_seqs; s++)
        for (int i = 0; i < max_blocks; i++) meta[num_seqs + (size_t)s * max_blocks + i] = i * num_seqs + s;
    int32_t *d_meta;
    KB_CHECK(cudaMalloc((void **)&d_meta, meta.size() * 4));
    KB_CHECK(cudaMemcpy(d_meta, meta.data(), meta.size() * 4, cudaMemcpyHostToDevice));
    const size_t kv_bytes = (size_t)num_blocks * 2 * nkv * bs * hd * kv_dtype_size(kvt);
    struct kv_layer kv = {};
    kv.data = kbench_alloc_filled(kv_bytes, 0x3c);
    kv.dtype = kvt;
    kv.num_blocks = num_blocks;
    kv.block_size = bs;
    kv.n_kv_heads = nkv;
    kv.head_dim = hd;
    kv.k_scale = kv.v_scale = 1.0f;
    float *q = (float *)kbench_alloc_filled((size_t)num_seqs * nh * hd * 4, 0x3c);
    void *out = kbench_alloc_filled((size_t)num_seqs * nh * hd * 2, 0x3c);
    const size_t ws_bytes = cuda_attention_decode_workspace_size(num_seqs, nh, hd, ctx, partition, max_partitions);
    void *ws = kbench_alloc_filled(ws_bytes, 0x3c);
    double s = kbench_time(b, [&] {
        KB_CHECK(cuda_attention_decode(out, DT_BF16, q, (int64_t)nh * hd, &kv, d_meta, d_meta + num_seqs, max_blocks,
                                       num_seqs, nh, 0.08838835f, ctx, partition, max_partitions, rows, ws, ws_bytes,
                                       nullptr, 0, b->stream));
    });
    double bytes = (double)num_seqs * ctx * nkv * 2.0 * hd * kv_dtype_size(kvt) + (double)num_seqs * nh * hd * (4 + 2);
    char kernel[64], shape[64];
    snprintf(kernel, sizeof kernel, "attention_decode %s kv", kv_dtype_name(kvt));
    snprintf(shape, sizeof shape, "%s h%d/%d d%d bs%d", label, nh, nkv, hd, bs);
    kbench_row(b, kernel, shape, s, bytes, 0.0, KB_MEMORY);
    cudaFree(kv.data);
    cudaFree(q);
    cudaFree(out);
    cudaFree(ws);
    cudaFree(d_meta);
    return s;
}

static void bench_attention_decode(struct kbench *b)
{
    if (b->filter && !strstr("attention_decode", b->filter) && !strstr(b->filter, "attention_decode")) return;
    if (b->tiny) {
        double t16 = bench_one(b, "S=2 ctx=100", 2, 100, 0, KV_BF16);
        double t8 = bench_one(b, "S=2 ctx=100", 2, 100, 0, KV_FP8_E4M3);
        bench_one(b, "S=2 ctx=100 part=32", 2, 100, 32, KV_BF16);
        bench_one(b, "S=2 ctx=100 rows=16", 2, 100, 0, KV_BF16, 16);
        printf("attention_decode fp8/bf16 time at S=2 ctx=100: %.2f (emulator: meaningless)\n", t8 / t16);
        return;
    }
    double t16 = bench_one(b, "S=64 ctx=2048", 64, 2048, 0, KV_BF16);
    double t8 = bench_one(b, "S=64 ctx=2048", 64, 2048, 0, KV_FP8_E4M3);
    bench_one(b, "S=64 ctx=2048 part=512", 64, 2048, 512, KV_BF16);
    bench_one(b, "S=64 ctx=2048 nosplit", 64, 2048, 2048, KV_BF16);
    bench_one(b, "S=64 ctx=2048 part=512", 64, 2048, 512, KV_FP8_E4M3);
    const double s1 = bench_one(b, "S=1 ctx=1024", 1, 1024, 0, KV_BF16);
    const double s1f = bench_one(b, "S=1 ctx=1024 part=512", 1, 1024, 512, KV_BF16);
    const double s8 = bench_one(b, "S=8 ctx=1024", 8, 1024, 0, KV_BF16);
    const double s8f = bench_one(b, "S=8 ctx=1024 part=512", 8, 1024, 512, KV_BF16);
    bench_one(b, "S=8 ctx=1024", 8, 1024, 0, KV_FP8_E4M3);
    bench_one(b, "S=8 ctx=4096", 8, 4096, 0, KV_BF16);
    bench_one(b, "S=1 ctx=32768", 1, 32768, 0, KV_BF16);
    bench_one(b, "S=1 ctx=32768", 1, 32768, 0, KV_FP8_E4M3);
    const double s256 = bench_one(b, "S=256 ctx=512", 256, 512, 0, KV_BF16);
    /* the same shapes with 16 heads per block */
    const double r1 = bench_one(b, "S=1 ctx=1024 rows=16", 1, 1024, 0, KV_BF16, 16);
    const double r8 = bench_one(b, "S=8 ctx=1024 rows=16", 8, 1024, 0, KV_BF16, 16);
    const double r64 = bench_one(b, "S=64 ctx=2048 rows=16", 64, 2048, 0, KV_BF16, 16);
    const double r64f = bench_one(b, "S=64 ctx=2048 rows=16", 64, 2048, 0, KV_FP8_E4M3, 16);
    const double r256 = bench_one(b, "S=256 ctx=512 rows=16", 256, 512, 0, KV_BF16, 16);
    /* F16 KV at the same shape: BF16 fragments load without ldmatrix (docs/kernels.md) */
    const double f64 = bench_one(b, "S=64 ctx=2048", 64, 2048, 0, KV_F16);
    const double f64r = bench_one(b, "S=64 ctx=2048 rows=16", 64, 2048, 0, KV_F16, 16);
    printf("attention_decode fp8/bf16 time at S=64 ctx=2048: %.2f (target <= 0.60)\n", t8 / t16);
    printf("attention_decode automatic/fixed-512 split time at ctx=1024: S=1 %.2f, S=8 %.2f "
           "(x 28 layers: %.0f / %.0f us per step saved)\n",
           s1 / s1f, s8 / s8f, 28e6 * (s1f - s1), 28e6 * (s8f - s8));
    printf("attention_decode 8-head/16-head block time: S=1 ctx=1024 %.2f, S=8 ctx=1024 %.2f, S=64 ctx=2048 %.2f "
           "(fp8 %.2f), S=256 ctx=512 %.2f\n",
           s1 / r1, s8 / r8, t16 / r64, t8 / r64f, s256 / r256);
    printf("attention_decode bf16/f16 KV time at S=64 ctx=2048: %.2f (16 heads per block %.2f; the same bytes: "
           "above 1, the BF16 fragment loads' cost)\n",
           t16 / f64, r64 / f64r);
}
KBENCH_REGISTER(bench_attention_decode);

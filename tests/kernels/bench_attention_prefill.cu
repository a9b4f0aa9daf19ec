/* bench_attention_prefill.cu — prefill attention (kernels/attention_prefill.cu) at
 * Qwen2.5-7B shapes: 28 query heads over 4 KV heads, head_dim 128, block_size 16, BF16
 * output; BF16 and FP8 caches. Rows:
 *   1 x 4096   one 4096-token prompt from scratch
 *   8 x 512    eight 512-token prompts (4096 query rows in all)
 *   chunk      a 512-row chunk after a cached 3584-token prefix (chunked prefill)
 * Compute-bound: each row counts the FLOPs causal attention needs, 4 * head_dim FLOPs per
 * visible (query row, key, head) triple (2 for Q·K^T, 2 for P·V; about 2·2·T·ctx/2·head_dim
 * per head for a prompt), against the cuBLAS BF16 GEMM rate measured in the same run.
 * b->tiny: 32-token versions of the same rows (emulator: proves the bench runs).
 */
#include "kbench.h"

#include "kernels/attention_prefill.h"

extern "C" {
#include "util/kv_dtype.h"
}

#include <stdlib.h>

#include <vector>

/* num_seqs sequences of q_len new rows after a cached prefix of `prefix` tokens */
static void bench_one(struct kbench *b, const char *label, int num_seqs, int q_len, int prefix,
                      enum kv_dtype kvt)
{
    const int nh = 28, nkv = 4, hd = 128, bs = 16;
    const int T = num_seqs * q_len, seq_len = prefix + q_len, max_blocks = (seq_len + bs - 1) / bs;
    const int num_blocks = num_seqs * max_blocks;
    std::vector<int32_t> qstart(num_seqs + 1), lens(num_seqs, seq_len), bt((size_t)num_blocks);
    for (int s = 0; s <= num_seqs; s++) qstart[s] = s * q_len;
    /* blocks interleaved across sequences (a pool after some churn), not contiguous */
    for (int s = 0; s < num_seqs; s++)
        for (int i = 0; i < max_blocks; i++) bt[(size_t)s * max_blocks + i] = i * num_seqs + s;
    int32_t *d_meta;
    KB_CHECK(cudaMalloc((void **)&d_meta, (qstart.size() + lens.size() + bt.size()) * 4));
    KB_CHECK(cudaMemcpy(d_meta, qstart.data(), qstart.size() * 4, cudaMemcpyHostToDevice));
    KB_CHECK(cudaMemcpy(d_meta + qstart.size(), lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
    KB_CHECK(cudaMemcpy(d_meta + qstart.size() + lens.size(), bt.data(), bt.size() * 4, cudaMemcpyHostToDevice));
    const size_t pool_bytes = (size_t)num_blocks * 2 * nkv * bs * hd * kv_dtype_size(kvt);
    struct kv_layer kv = {};
    kv.data = kbench_alloc_filled(pool_bytes, 0x3c);
    kv.dtype = kvt;
    kv.num_blocks = num_blocks;
    kv.block_size = bs;
    kv.n_kv_heads = nkv;
    kv.head_dim = hd;
    kv.k_scale = kv.v_scale = 1.0f;
    float *q = (float *)kbench_alloc_filled((size_t)T * nh * hd * 4, 0x3c);
    void *out = kbench_alloc_filled((size_t)T * nh * hd * 2, 0x3c);
    double s = kbench_time(b, [&] {
        KB_CHECK(cuda_attention_prefill(out, DT_BF16, q, (int64_t)nh * hd, &kv, d_meta, d_meta + qstart.size(),
                                      d_meta + qstart.size() + lens.size(), max_blocks, num_seqs, T, nh,
                                      0.08838835f, b->stream));
    });
    /* visible (row, key) pairs: row i of a chunk sees prefix + i + 1 keys */
    double pairs = (double)num_seqs * ((double)q_len * prefix + (double)q_len * (q_len + 1) / 2.0);
    double flops = 4.0 * hd * nh * pairs;
    /* the K/V each CTA reads (every query tile re-reads its context), q read, out written */
    double tiles_per_head = (double)num_seqs * q_len * (nh / nkv) / 64.0;
    double bytes = tiles_per_head * nkv * 2.0 * hd * kv_dtype_size(kvt) * (prefix + q_len / 2.0) +
                   (double)T * nh * hd * (4 + 2);
    char kernel[64], shape[64];
    snprintf(kernel, sizeof kernel, "attention_prefill %s kv", kv_dtype_name(kvt));
    snprintf(shape, sizeof shape, "%s h28/4 d128 bs16", label);
    kbench_row(b, kernel, shape, s, bytes, flops, KB_COMPUTE);
    cudaFree(kv.data);
    cudaFree(q);
    cudaFree(out);
    cudaFree(d_meta);
}

static void bench_attention_prefill(struct kbench *b)
{
    const enum kv_dtype types[2] = { KV_BF16, KV_FP8_E4M3 };
    for (enum kv_dtype t : types) {
        if (b->tiny) {
            bench_one(b, "1x32", 1, 32, 0, t);
            bench_one(b, "2x16", 2, 16, 0, t);
            bench_one(b, "chunk 16 after 32", 1, 16, 32, t);
        } else {
            bench_one(b, "1x4096", 1, 4096, 0, t);
            bench_one(b, "8x512", 8, 512, 0, t);
            bench_one(b, "chunk 512 after 3584", 1, 512, 3584, t);
        }
    }
}
KBENCH_REGISTER(bench_attention_prefill);

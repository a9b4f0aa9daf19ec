/* ktest_paged.h — the paged-KV fixture shared by the attention kernel tests
 * (test_kernel_attention_decode.cu, test_kernel_attention_prefill.cu).
 *
 * ktest_make_paged() builds a host pool in the layout of struct kv_layer
 * ([num_blocks][2][n_kv_heads][block_size][head_dim]) holding every sequence's context,
 * with block tables that are a random permutation of the pool. Three extra blocks are
 * never owned by anyone; every slot no sequence owns (those blocks, the tail of each last
 * block, and table entries past a sequence's blocks, which point at the extra blocks)
 * holds NaN, so a kernel that reads one fails. FP8 pools use scales != 1.
 * ktest_attention_ref() runs the CPU twin, cpu_paged_attention, over a host copy of the
 * pool, and ktest_out_to_float() widens a kernel's F32/F16/BF16 output for comparison.
 */
#ifndef TESSERA_KTEST_PAGED_H
#define TESSERA_KTEST_PAGED_H

#include "ktest.h"

#include "backend/cpu/ops.h"
#include "util/fp8.h"
#include "util/tensor.h"

#include <algorithm>
#include <vector>

static inline size_t ktest_act_size(enum dtype t) { return t == DT_F32 ? 4 : 2; }

static inline const char *ktest_act_name(enum dtype t)
{
    return t == DT_F32 ? "f32" : t == DT_F16 ? "f16" : "bf16";
}

/* element i of a pool of type t := x (already divided by the FP8 scale); NaN stays NaN */
static inline void ktest_pool_put(std::vector<unsigned char> &pool, enum kv_dtype t, int64_t i, float x)
{
    if (t == KV_FP8_E4M3) {
        pool[i] = fp32_to_fp8_e4m3(x);
    } else {
        uint16_t h = t == KV_F16 ? fp32_to_fp16(x) : fp32_to_bf16(x);
        memcpy(&pool[2 * i], &h, 2);
    }
}

struct ktest_paged {
    std::vector<unsigned char> pool;   /* host bytes of the pool */
    std::vector<int32_t> block_tables; /* [num_seqs][max_blocks] */
    int num_blocks;
    float k_scale, v_scale;
};

/* The pool for sequences of seq_lens[s] tokens. climbing: keys grow along the context
 * (k ~ 0.5 N(0,1) + 0.02 p * 64 / head_dim) so that with q = 1 the scaled score rises by
 * ~15 log2 units per 64 positions — past the kernels' lazy-rescale threshold of 8, so every
 * tile exercises the O rescale; otherwise K and V are N(0, 1). */
static inline ktest_paged ktest_make_paged(ktest_rng &rng, enum kv_dtype kvt, const std::vector<int32_t> &seq_lens,
                                           int max_blocks, int bs, int nkv, int hd, bool climbing)
{
    const int num_seqs = (int)seq_lens.size();
    ktest_paged p;
    int used = 0;
    for (int s = 0; s < num_seqs; s++) used += (seq_lens[s] + bs - 1) / bs;
    p.num_blocks = used + 3;
    std::vector<int> perm(p.num_blocks);
    for (int i = 0; i < p.num_blocks; i++) perm[i] = i;
    for (int i = p.num_blocks - 1; i > 0; i--) std::swap(perm[i], perm[rng.below(i + 1)]);
    p.block_tables.assign((size_t)num_seqs * max_blocks, 0);
    int next = 0;
    for (int s = 0; s < num_seqs; s++) {
        int nb = (seq_lens[s] + bs - 1) / bs;
        for (int i = 0; i < max_blocks; i++)
            p.block_tables[(size_t)s * max_blocks + i] = i < nb ? perm[next++] : perm[used + rng.below(3)];
    }
    const int64_t elems = (int64_t)p.num_blocks * 2 * nkv * bs * hd;
    p.pool.assign((size_t)(elems * (int64_t)kv_dtype_size(kvt)), 0);
    for (int64_t i = 0; i < elems; i++) ktest_pool_put(p.pool, kvt, i, NAN);
    p.k_scale = kvt == KV_FP8_E4M3 ? 0.05f : 1.0f;
    p.v_scale = kvt == KV_FP8_E4M3 ? 0.02f : 1.0f;
    for (int s = 0; s < num_seqs; s++)
        for (int pos = 0; pos < seq_lens[s]; pos++) {
            int64_t blk = p.block_tables[(size_t)s * max_blocks + pos / bs];
            for (int g = 0; g < nkv; g++) {
                int64_t k0 = (((blk * 2 + 0) * nkv + g) * bs + pos % bs) * hd;
                int64_t v0 = (((blk * 2 + 1) * nkv + g) * bs + pos % bs) * hd;
                for (int d = 0; d < hd; d++) {
                    float k = climbing ? 0.5f * rng.normal() + 0.02f * pos * 64.0f / hd : rng.normal();
                    ktest_pool_put(p.pool, kvt, k0 + d, k / p.k_scale);
                    ktest_pool_put(p.pool, kvt, v0 + d, rng.normal() / p.v_scale);
                }
            }
        }
    return p;
}

/* A kv_layer over data (host or device) with the fixture's geometry and scales. */
static inline struct kv_layer ktest_kv_layer(void *data, enum kv_dtype kvt, const ktest_paged &p, int bs, int nkv,
                                             int hd)
{
    struct kv_layer kv = {};
    kv.data = data;
    kv.dtype = kvt;
    kv.num_blocks = p.num_blocks;
    kv.block_size = bs;
    kv.n_kv_heads = nkv;
    kv.head_dim = hd;
    kv.k_scale = p.k_scale;
    kv.v_scale = p.v_scale;
    return kv;
}

/* The twin: cpu_paged_attention over host_kv (a kv_layer over host bytes) for num_tokens
 * dense query rows q [num_tokens][n_heads][head_dim]. */
static inline std::vector<float> ktest_attention_ref(const struct kv_layer &host_kv, const float *q,
                                                     const std::vector<int32_t> &query_start,
                                                     const std::vector<int32_t> &seq_lens,
                                                     const std::vector<int32_t> &block_tables, int max_blocks,
                                                     int num_tokens, int n_heads, float scale)
{
    const int num_seqs = (int)seq_lens.size();
    int max_ctx = 1;
    for (int32_t l : seq_lens) max_ctx = std::max(max_ctx, (int)l);
    std::vector<float> ref((size_t)num_tokens * n_heads * host_kv.head_dim),
        scratch(cpu_paged_attention_scratch_floats(1, max_ctx));
    struct paged_attention_args a = {};
    a.out = ref.data();
    a.q = q;
    a.kv = &host_kv;
    a.query_start = query_start.data();
    a.seq_lens = seq_lens.data();
    a.block_tables = block_tables.data();
    a.max_blocks_per_seq = max_blocks;
    a.num_seqs = num_seqs;
    a.num_tokens = num_tokens;
    a.n_heads = n_heads;
    a.scale = scale;
    a.scratch = scratch.data();
    a.max_ctx = max_ctx;
    cpu_paged_attention(NULL, &a);
    return ref;
}

/* The first n elements of a kernel output in type t, as floats. */
static inline std::vector<float> ktest_out_to_float(const std::vector<unsigned char> &raw, enum dtype t, size_t n)
{
    if (t == DT_F16) return ktest_from_f16((const uint16_t *)raw.data(), n);
    if (t == DT_BF16) return ktest_from_bf16((const uint16_t *)raw.data(), n);
    std::vector<float> got(n);
    memcpy(got.data(), raw.data(), n * 4);
    return got;
}

#endif

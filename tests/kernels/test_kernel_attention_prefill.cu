/* test_kernel_attention_prefill.cu — kernels/attention_prefill.cu against its CPU twin,
 * cpu_paged_attention (src/backend/cpu/ops.h), over the same pool bytes: the device pool is
 * copied back to the host (and checked unchanged) and the twin runs on that copy.
 *
 * Grid: single prompts of 1, 17, 64 and 200 tokens; chunked prefill (a cached prefix of 48
 * or 100 tokens, then a chunk of 33 rows); batches mixing prompts, chunks and 1-row
 * (decode) sequences, up to 12 sequences; contexts of exactly 64 and 128 keys (tile
 * edges); block sizes 16 and 32; head dims 64, 96 and 128; GQA 1, 2, 3, 4, 7 (also at
 * Qwen2.5-7B's 28 / 4 heads), 8 (7 rows per token leave query tiles that split a token's
 * heads);
 * KV F16, BF16 and FP8 with k_scale / v_scale != 1; outputs F32, F16, BF16; q read in place
 * from a fused QKV-shaped buffer (row stride, K/V columns NaN); batch padding rows past
 * query_start[num_seqs] (must stay unwritten); calls over a batch's later sequences only
 * (a mixed step's, after the decode kernel took the leading one-row ones: the rows before
 * must stay unwritten too); scores that climb by more
 * than the kernel's lazy-rescale threshold from one key tile to the next (the O rescale
 * path); invalid arguments. Block tables are a random permutation of the pool; every
 * cache slot no sequence owns (whole blocks, the tail of each last block, table entries
 * past a sequence's blocks, which point at NaN blocks) holds NaN, so reading one fails.
 */
#include "ktest_paged.h"

#include "kernels/attention_prefill.h"

#include <algorithm>
#include <vector>

struct ap_case {
    const char *name;
    int head_dim, n_heads, n_kv_heads, block_size;
    enum kv_dtype kvt;
    enum dtype out;
    std::vector<int> q_lens; /* query rows of each sequence */
    std::vector<int> prefix; /* cached context before them (seq_len = prefix + q_len) */
    bool fused_q;            /* q read from a [T][(n_heads + 2 n_kv_heads) head_dim] buffer */
    bool climbing;           /* scores rise along the context: forces O rescales */
    int pad_rows;            /* batch padding: rows past query_start[num_seqs], not written */
};

/* Bounds. The kernel differs from the twin only by rounding Q and the probabilities P to
 * its 16-bit compute type (F16 for F16/FP8 caches: unit roundoff u = 2^-11; BF16: 2^-8),
 * by the output's rounding, and by F32 summation order. A relative error ~u on each score
 * term and on each weight moves an output by ~u * |v - out| / sqrt(keys): NMSE below u^2
 * (2.4e-7 for F16, 1.5e-5 for BF16) and max |err| a few u * max|v| (v ~ N(0, 1)). The
 * ktest.h rows (F16: 1e-6 / 1e-2, BF16: 1e-4 / 5e-2) sit 10-25x above what this grid
 * gives (F16: NMSE <= 1.1e-7, max <= 1e-3; BF16: NMSE <= 6.2e-6, max <= 7.7e-3, the latter
 * with a BF16 output, whose own rounding is 2^-9 relative): loose enough for any correct
 * summation order, tight enough that one wrong key, mask position or rescale fails. */
static ktol tol_for(enum kv_dtype kvt, enum dtype out)
{
    if (kvt == KV_BF16 || out == DT_BF16) return KTOL_BF16;
    return KTOL_F16;
}

/* The kernel over sequences first.. of case c (first > 0: the call a mixed step makes
 * after cuda_attention_decode took its leading one-row sequences; query_start then starts
 * at row query_start[first]), against the twin's rows of the whole batch; the rows before
 * stay unwritten like the padding after. */
static void run_case(const ap_case &c, uint64_t seed, int first = 0)
{
    const int hd = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads, bs = c.block_size;
    const int num_seqs = (int)c.q_lens.size();
    const enum kv_dtype kvt = c.kvt;
    ktest_rng rng(seed);

    /* batch metadata */
    std::vector<int32_t> qstart(num_seqs + 1, 0), seq_lens(num_seqs);
    int max_ctx = 1, max_blocks = 1;
    for (int s = 0; s < num_seqs; s++) {
        qstart[s + 1] = qstart[s] + c.q_lens[s];
        seq_lens[s] = c.prefix[s] + c.q_lens[s];
        max_ctx = std::max(max_ctx, seq_lens[s]);
        max_blocks = std::max(max_blocks, (seq_lens[s] + bs - 1) / bs);
    }
    const int T = qstart[num_seqs], T_all = T + c.pad_rows;
    max_blocks += 2; /* slack entries: they point at NaN blocks */

    /* pool (NaN wherever no sequence owns a slot) and permuted block tables */
    const ktest_paged pg = ktest_make_paged(rng, kvt, seq_lens, max_blocks, bs, nkv, hd, c.climbing);
    const std::vector<unsigned char> &pool = pg.pool;
    const std::vector<int32_t> &bt = pg.block_tables;

    /* q: dense [T][nh][hd], or inside a fused QKV row whose K/V part is NaN */
    const int64_t q_stride = c.fused_q ? (int64_t)(nh + 2 * nkv) * hd : (int64_t)nh * hd;
    std::vector<float> q((size_t)(T_all * q_stride), NAN), q_dense((size_t)T * nh * hd);
    for (int t = 0; t < T_all; t++)
        for (int i = 0; i < nh * hd; i++) {
            /* climbing: the heads' scores rise at different rates (or fall: every third
             * head), so rows sharing a token still need different rescales */
            const int h = i / hd;
            float x = c.climbing ? (h % 3 == 2 ? -1.0f : 1.0f + 0.5f * (h % 3)) : rng.normal();
            q[(size_t)(t * q_stride + i)] = x;
            if (t < T) q_dense[(size_t)t * nh * hd + i] = x;
        }

    kbuf<unsigned char> d_pool(pool.size()), d_out((size_t)T_all * nh * hd * ktest_act_size(c.out));
    kbuf<float> d_q(q.size());
    kbuf<int32_t> d_qstart(qstart.size()), d_lens(seq_lens.size()), d_bt(bt.size());
    d_pool.upload(pool);
    d_q.upload(q);
    d_qstart.upload(qstart);
    d_lens.upload(seq_lens);
    d_bt.upload(bt);
    struct kv_layer kv = ktest_kv_layer(d_pool.ptr, kvt, pg, bs, nkv, hd);
    const float scale = 1.0f / sqrtf((float)hd);

    /* the twin, over the device pool's bytes */
    std::vector<unsigned char> host_pool = d_pool.download();
    CHECK(host_pool == pool, "%s: pool upload differs", c.name);
    struct kv_layer hkv = kv;
    hkv.data = host_pool.data();
    const std::vector<float> ref =
        ktest_attention_ref(hkv, q_dense.data(), qstart, seq_lens, bt, max_blocks, T, nh, scale);

    char what[200];
    snprintf(what, sizeof what, "%s (hd %d, %d/%d heads, bs %d, kv %s, out %s, from sequence %d)", c.name, hd, nh,
             nkv, bs, kv_dtype_name(kvt), ktest_act_name(c.out), first);
    const int q0 = qstart[first];
    const size_t row_bytes = (size_t)nh * hd * ktest_act_size(c.out);
    KTEST_SEEDS(s) {
        d_out.poison();
        int rc = cuda_attention_prefill(d_out.ptr, c.out, d_q.ptr, q_stride, &kv, d_qstart.ptr + first,
                                        d_lens.ptr + first, d_bt.ptr + (size_t)first * max_blocks, max_blocks,
                                        num_seqs - first, T_all - q0, nh, scale, 0);
        CHECK(rc == 0, "%s: cuda_attention_prefill returned %d", what, rc);
        const std::vector<unsigned char> raw = d_out.download();
        const std::vector<float> got = ktest_out_to_float(raw, c.out, (size_t)T * nh * hd);
        const size_t skip = (size_t)q0 * nh * hd;
        CHECK_CLOSE_ARRAYS(what, got.data() + skip, ref.data() + skip, got.size() - skip, tol_for(kvt, c.out));
        bool untouched = true; /* rows before q0 and padding rows keep the poison (0xFF bytes: NaN) */
        for (size_t i = 0; i < raw.size(); i++)
            if (i < (size_t)q0 * row_bytes || i >= (size_t)T * row_bytes) untouched = untouched && raw[i] == 0xff;
        CHECK(untouched, "%s: a row outside the call's was written", what);
    }
    CHECK(d_pool.download() == pool, "%s: the kernel wrote into the pool", what);
    CHECK_GUARD(d_pool);
    CHECK_GUARD(d_out);
    CHECK_GUARD(d_q);
    CHECK_GUARD(d_qstart);
    CHECK_GUARD(d_lens);
    CHECK_GUARD(d_bt);
}

/* ---- the grid --------------------------------------------------------------------------- */

static void test_single_prompts(void)
{
    const ap_case cases[] = {
        { "prompt of 1", 64, 4, 4, 16, KV_F16, DT_F32, { 1 }, { 0 }, false, false, 0 },
        { "prompt of 17", 128, 6, 2, 32, KV_BF16, DT_BF16, { 17 }, { 0 }, false, false, 0 },
        { "prompt of 64", 64, 7, 1, 16, KV_FP8_E4M3, DT_F16, { 64 }, { 0 }, false, false, 0 },
        { "prompt of 200", 64, 8, 1, 32, KV_F16, DT_F32, { 200 }, { 0 }, false, false, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(cases[i], 0x5100 + i);
}

static void test_chunked_prefill(void)
{
    const ap_case cases[] = {
        { "prefix 48 + chunk 33", 128, 7, 1, 16, KV_BF16, DT_F32, { 33 }, { 48 }, false, false, 0 },
        { "prefix 100 + chunk 33", 64, 6, 2, 32, KV_FP8_E4M3, DT_BF16, { 33 }, { 100 }, false, false, 0 },
        { "prefix 48 + chunk 33, fused q", 128, 3, 1, 32, KV_F16, DT_F16, { 33 }, { 48 }, true, false, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(cases[i], 0x5200 + i);
}

static void test_mixed_batches(void)
{
    const ap_case cases[] = {
        /* a prompt, decode rows with context, a chunk, a 1-token prompt, a short chunk */
        { "mixed batch", 128, 8, 2, 16, KV_F16, DT_F16, { 5, 1, 40, 1, 17 }, { 0, 70, 20, 0, 3 }, false, false, 0 },
        { "12 sequences", 64, 2, 2, 32, KV_BF16, DT_F32, { 3, 1, 9, 1, 1, 4, 7, 2, 1, 5, 8, 1 },
          { 0, 31, 12, 64, 0, 5, 40, 0, 17, 26, 0, 9 }, false, false, 0 },
        { "mixed batch, fp8, fused q, padding", 64, 8, 1, 16, KV_FP8_E4M3, DT_F32, { 9, 1, 20 }, { 30, 90, 0 }, true,
          false, 3 },
        { "head_dim 96", 96, 4, 2, 16, KV_F16, DT_F32, { 23, 1 }, { 10, 40 }, false, false, 0 },
        { "head_dim 96, bf16", 96, 3, 1, 32, KV_BF16, DT_BF16, { 12 }, { 21 }, false, false, 0 },
        /* contexts and row counts on the 64-key / 64-row tile edges (64, 128 keys) */
        { "tile edges", 128, 2, 2, 32, KV_FP8_E4M3, DT_BF16, { 64, 63, 65, 1 }, { 0, 1, 63, 127 }, false, false,
          0 },
        { "gqa 7 chunk, fp8", 128, 14, 2, 16, KV_FP8_E4M3, DT_F16, { 20 }, { 44 }, false, false, 0 },
        { "qwen2.5-7b heads", 128, 28, 4, 16, KV_BF16, DT_BF16, { 9, 1 }, { 30, 57 }, true, false, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(cases[i], 0x5300 + i);
}

static void test_rescale(void)
{
    const ap_case cases[] = {
        { "climbing scores", 64, 2, 2, 16, KV_F16, DT_F32, { 150 }, { 60 }, false, true, 0 },
        { "climbing scores, bf16 batch", 64, 7, 1, 32, KV_BF16, DT_F32, { 40, 1 }, { 90, 200 }, false, true, 0 },
        { "climbing scores, fp8", 64, 3, 1, 16, KV_FP8_E4M3, DT_F32, { 20 }, { 150 }, false, true, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(cases[i], 0x5400 + i);
}

/* A mixed step's call after the decode kernel took its leading one-row sequences
 * (src/backend/cuda/forward.cu): query_start begins past row 0; the rows before it are not
 * written. Also a first sequence that is itself one row (a 1-token chunk: only the leading
 * run goes to the decode kernel) and tile edges counted from the call's first row. */
static void test_after_decode_rows(void)
{
    const ap_case cases[] = {
        { "3 decode rows, then a prompt and a chunk", 128, 8, 2, 16, KV_F16, DT_F16, { 1, 1, 1, 40, 17 },
          { 70, 5, 130, 0, 3 }, false, false, 0 },
        { "decode rows, a 1-row chunk, a prompt, fp8, fused q, padding", 64, 8, 1, 16, KV_FP8_E4M3, DT_F32,
          { 1, 1, 1, 20 }, { 90, 33, 0, 0 }, true, false, 3 },
    };
    run_case(cases[0], 0x5500, 3);
    run_case(cases[1], 0x5501, 2);
    /* Qwen2.5-7B's heads: 21 decode rows (147 flattened rows before the call's first: the
     * tile numbering must start from query_start[0], not row 0), then a 64-row chunk */
    ap_case qwen = { "qwen2.5-7b heads, 21 decode rows, bf16", 128, 28, 4, 16, KV_BF16, DT_BF16, {}, {}, true, false,
                     0 };
    for (int i = 0; i < 21; i++) {
        qwen.q_lens.push_back(1);
        qwen.prefix.push_back((i * 37) % 130);
    }
    qwen.q_lens.push_back(64);
    qwen.prefix.push_back(30);
    run_case(qwen, 0x5502, 21);
    run_case(qwen, 0x5503, 10); /* some one-row sequences left to this kernel */
}

/* Unsupported shapes and types are refused before any launch; zero tokens is a no-op. */
static void test_invalid(void)
{
    kbuf<unsigned char> pool(2 * 2 * 1 * 16 * 128 * 2);
    kbuf<float> q(4 * 2 * 128 + 4);
    kbuf<float> out(4 * 2 * 128);
    kbuf<int32_t> meta(16);
    std::vector<int32_t> m = { 0, 4, 4, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }; /* qstart, lens, bt */
    meta.upload(m);
    struct kv_layer kv = {};
    kv.data = pool.ptr;
    kv.dtype = KV_F16;
    kv.num_blocks = 2;
    kv.block_size = 16;
    kv.n_kv_heads = 1;
    kv.head_dim = 128;
    kv.k_scale = kv.v_scale = 1.0f;
    auto call = [&](const struct kv_layer &k, enum dtype od, const float *qp, int64_t qs, int nh, int T) {
        return cuda_attention_prefill(out.ptr, od, qp, qs, &k, meta.ptr, meta.ptr + 2, meta.ptr + 3, 2, 1, T, nh,
                                      0.1f, 0);
    };
    const int inval = (int)cudaErrorInvalidValue;
    struct kv_layer k = kv;
    k.head_dim = 80;
    CHECK(call(k, DT_F32, q.ptr, 2 * 80, 2, 4) == inval, "head_dim 80 accepted");
    k = kv;
    k.dtype = KV_F32;
    CHECK(call(k, DT_F32, q.ptr, 256, 2, 4) == inval, "KV_F32 accepted");
    k = kv;
    k.block_size = 24;
    CHECK(call(k, DT_F32, q.ptr, 256, 2, 4) == inval, "block_size 24 accepted");
    k = kv;
    k.n_kv_heads = 2;
    CHECK(call(k, DT_F32, q.ptr, 3 * 128, 3, 4) == inval, "3 heads over 2 kv heads accepted");
    CHECK(call(kv, DT_Q8_0, q.ptr, 256, 2, 4) == inval, "Q8_0 output accepted");
    CHECK(call(kv, DT_F32, q.ptr, 200, 2, 4) == inval, "q_stride < n_heads * head_dim accepted");
    CHECK(call(kv, DT_F32, q.ptr, 258, 2, 4) == inval, "q_stride not a multiple of 4 accepted");
    CHECK(call(kv, DT_F32, q.ptr + 1, 256, 2, 4) == inval, "unaligned q accepted");
    CHECK(cudaGetLastError() == cudaSuccess, "a refused call left an error behind");
    out.poison();
    CHECK(call(kv, DT_F32, q.ptr, 256, 2, 0) == 0, "zero tokens failed");
    std::vector<float> o = out.download();
    bool untouched = true;
    for (float x : o) untouched = untouched && isnan(x);
    CHECK(untouched, "zero tokens wrote output");
    CHECK_GUARD(pool);
    CHECK_GUARD(q);
    CHECK_GUARD(out);
    CHECK_GUARD(meta);
}

int main(void)
{
    RUN(test_single_prompts);
    RUN(test_chunked_prefill);
    RUN(test_mixed_batches);
    RUN(test_rescale);
    RUN(test_after_decode_rows);
    RUN(test_invalid);
    return test_summary();
}

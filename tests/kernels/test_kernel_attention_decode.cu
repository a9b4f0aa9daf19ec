/* test_kernel_attention_decode.cu — kernels/attention_decode.cu against its CPU twin,
 * cpu_paged_attention (src/backend/cpu/ops.h) with one query row per sequence, over the same
 * pool bytes: the device pool is copied back to the host (and checked unchanged) and the
 * twin runs on that copy.
 *
 * Grid: every KV dtype (F16, BF16, FP8 with k_scale / v_scale != 1) x head dims 64 and 128
 * x GQA 1, 3, 7, 8 over contexts of 1, 15, 16, 17 and 100 positions, block sizes 16 and 32,
 * outputs F32 / F16 / BF16, split-K forced at partitions of 16..48 positions (so the reduce
 * runs at small sizes) or automatic; contexts of 2,000+ split automatically and forced
 * unsplit; 64 sequences; batch padding (seq_lens 0 -> zero rows); groups over 16 heads (two
 * thread blocks per kv head); head_dim 96; q read in place from a fused QKV row; a
 * max_seq_len far above the real contexts (empty partitions); Qwen2.5-7B's 28 heads over 4
 * kv heads (BF16, FP8; split automatically); scores that climb past the kernel's
 * lazy-rescale threshold tile after tile (the O rescale path), split and unsplit;
 * per-sequence splits under caps of 1, 2, 3 partitions and none (one grid holding
 * sequences split 1 to 5 ways), and the batch-1 / batch-8 decode steps' shapes split
 * automatically; with an F32 output, the quantized copy for the O projection's GEMV (qact:
 * the bytes of cuda_quantize_act over the output, from the attention kernel and from the
 * reduce, padding rows included); invalid arguments. Block tables are a random permutation of the pool; every cache slot no
 * sequence owns (whole blocks, the tail of each last block, table entries past a
 * sequence's blocks, which point at NaN blocks) holds NaN, so reading one fails. */
#include "ktest_paged.h"

#include "kernels/attention_decode.h"
#include "kernels/quant_matmul.h"

#include <algorithm>
#include <vector>

struct ad_case {
    const char *name;
    int head_dim, n_heads, n_kv_heads, block_size;
    enum kv_dtype kvt;
    enum dtype out;
    std::vector<int> seq_lens;
    int partition_size; /* positions per partition (more past the cap); 0: automatic (64) */
    int extra_max;      /* max_seq_len = max(seq_lens) + extra_max */
    bool fused_q;       /* q read from a [S][(n_heads + 2 n_kv_heads) head_dim] buffer */
    bool climbing;      /* scores rise along the context: forces O rescales */
    int max_partitions; /* 0: automatic (one wave of resident blocks) */
};

/* Bounds. The kernel feeds the tensor cores Q and the probabilities P as two 16-bit terms
 * each (hi + lo), so they keep ~16 significant bits with a BF16 cache (8 + 8: relative
 * error <= 2^-17 = 7.6e-6 per score term and weight) and ~22 with F16 / FP8 caches (which
 * compute in F16: 2^-23); the rest is F32 summed in another order than the twin's, and
 * exp2 for exp. The unit-variance inputs here give output errors of ~1e-6 relative
 * (observed worst over this grid, F32 output: NMSE 1.5e-11 / max 7.5e-6 with BF16 caches,
 * 1.6e-12 / 1.1e-6 with F16 / FP8), so F32 outputs are held to ktest.h's F32 row
 * (1e-10 / 1e-4) for F16 / FP8 caches and to 1e-9 / 1e-4 for BF16 caches. Dropping the lo
 * terms (plain 16-bit Q or P) fails these bounds, and one missed or wrong context position
 * moves the output by ~1e-2 or more. F16 / BF16 outputs are dominated by their own rounding
 * (2^-11 / 2^-8 relative of |out| < ~3; observed NMSE 4e-8 / 3e-6): ktest.h's rows. */
static ktol tol_for(enum kv_dtype kvt, enum dtype out)
{
    if (out == DT_BF16) return KTOL_BF16;
    if (out == DT_F16) return KTOL_F16;
    if (kvt == KV_BF16) return ktol{ 1e-9, 1e-4 };
    return KTOL_F32;
}

static void run_case(const ad_case &c, uint64_t seed)
{
    const int hd = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads, bs = c.block_size;
    const int num_seqs = (int)c.seq_lens.size();
    const enum kv_dtype kvt = c.kvt;
    ktest_rng rng(seed);

    /* batch metadata */
    const std::vector<int32_t> seq_lens(c.seq_lens.begin(), c.seq_lens.end());
    int max_ctx = 0;
    for (int s = 0; s < num_seqs; s++) max_ctx = std::max(max_ctx, seq_lens[s]);
    const int max_seq_len = max_ctx + c.extra_max;
    const int max_blocks = std::max(1, (max_seq_len + bs - 1) / bs) + 2; /* slack entries: NaN blocks */

    /* pool (NaN wherever no sequence owns a slot) and permuted block tables */
    const ktest_paged pg = ktest_make_paged(rng, kvt, seq_lens, max_blocks, bs, nkv, hd, c.climbing);
    const std::vector<unsigned char> &pool = pg.pool;
    const std::vector<int32_t> &bt = pg.block_tables;

    /* q: dense [S][nh][hd], or inside a fused QKV row whose K/V part is NaN */
    const int64_t q_stride = c.fused_q ? (int64_t)(nh + 2 * nkv) * hd : (int64_t)nh * hd;
    std::vector<float> q((size_t)(num_seqs * q_stride), NAN), q_dense((size_t)num_seqs * nh * hd);
    for (int s = 0; s < num_seqs; s++)
        for (int i = 0; i < nh * hd; i++) {
            /* climbing: the heads' scores rise at different rates (or fall: every third
             * head), so their rows rescale at different tiles by different factors */
            const int h = i / hd;
            float x = c.climbing ? (h % 3 == 2 ? -1.0f : 1.0f + 0.5f * (h % 3)) : rng.normal();
            q[(size_t)(s * q_stride + i)] = x;
            q_dense[(size_t)s * nh * hd + i] = x;
        }

    const size_t ws_bytes =
        cuda_attention_decode_workspace_size(num_seqs, nh, hd, max_seq_len, c.partition_size, c.max_partitions);
    kbuf<unsigned char> d_pool(pool.size()), d_out((size_t)num_seqs * nh * hd * ktest_act_size(c.out));
    kbuf<unsigned char> d_ws(std::max<size_t>(ws_bytes, 16));
    kbuf<float> d_q(q.size());
    kbuf<int32_t> d_lens(seq_lens.size()), d_bt(bt.size());
    d_pool.upload(pool);
    d_q.upload(q);
    d_lens.upload(seq_lens);
    d_bt.upload(bt);
    struct kv_layer kv = ktest_kv_layer(d_pool.ptr, kvt, pg, bs, nkv, hd);
    const float scale = 1.0f / sqrtf((float)hd);

    /* the twin, over the device pool's bytes (seq_lens 0 gives zero rows there too) */
    std::vector<unsigned char> host_pool = d_pool.download();
    CHECK(host_pool == pool, "%s: pool upload differs", c.name);
    struct kv_layer hkv = kv;
    hkv.data = host_pool.data();
    std::vector<int32_t> qstart(num_seqs + 1);
    for (int s = 0; s <= num_seqs; s++) qstart[s] = s;
    const std::vector<float> ref =
        ktest_attention_ref(hkv, q_dense.data(), qstart, seq_lens, bt, max_blocks, num_seqs, nh, scale);

    /* F32 out: the quantized copy for the O projection's GEMV (qact), against
       cuda_quantize_act over the kernel's out */
    const bool with_q = c.out == DT_F32;
    const int64_t width = (int64_t)nh * hd;
    const size_t qbytes = with_q ? cuda_quant_act_size(width, num_seqs) : 16;
    kbuf<unsigned char> d_qact(qbytes), d_qref(qbytes);

    char what[200];
    /* both tensor-core layouts on every case: 8 heads per block (32x8x16 fragments), 16
       (16x16x16) */
    for (int rows = 8; rows <= 16; rows += 8) KTEST_SEEDS(s) {
        snprintf(what, sizeof what, "%s (hd %d, %d/%d heads, bs %d, kv %s, out %s, partition %d, max %d, rows %d)",
                 c.name, hd, nh, nkv, bs, kv_dtype_name(kvt), ktest_act_name(c.out), c.partition_size,
                 c.max_partitions, rows);
        d_out.poison();
        d_ws.poison();
        d_qact.poison();
        int rc = cuda_attention_decode(d_out.ptr, c.out, d_q.ptr, q_stride, &kv, d_lens.ptr, d_bt.ptr, max_blocks,
                                       num_seqs, nh, scale, max_seq_len, c.partition_size, c.max_partitions, rows,
                                       d_ws.ptr, ws_bytes, with_q ? d_qact.ptr : nullptr,
                                       (s + num_seqs + rows / 8) & 1, 0);
        CHECK(rc == 0, "%s: cuda_attention_decode returned %d", what, rc);
        if (with_q) {
            d_qref.poison();
            CHECK(cuda_quantize_act((const float *)d_out.ptr, width, num_seqs, d_qref.ptr, 0, 0) == 0,
                  "%s: cuda_quantize_act failed", what);
            CHECK(d_qact.download() == d_qref.download(), "%s: qact differs from cuda_quantize_act(out)", what);
        }
        const std::vector<float> got = ktest_out_to_float(d_out.download(), c.out, (size_t)num_seqs * nh * hd);
        CHECK_CLOSE_ARRAYS(what, got.data(), ref.data(), got.size(), tol_for(kvt, c.out));
        for (int q0 = 0; q0 < num_seqs; q0++) { /* padding rows: exactly zero */
            if (seq_lens[q0] > 0) continue;
            bool zero = true;
            for (int i = 0; i < nh * hd; i++) zero = zero && got[(size_t)q0 * nh * hd + i] == 0.0f;
            CHECK(zero, "%s: sequence %d with seq_len 0 is not all zero", what, q0);
        }
    }
    CHECK(d_pool.download() == pool, "%s: the kernel wrote into the pool", what);
    CHECK_GUARD(d_pool);
    CHECK_GUARD(d_out);
    CHECK_GUARD(d_ws);
    CHECK_GUARD(d_qact);
    CHECK_GUARD(d_qref);
    CHECK_GUARD(d_q);
    CHECK_GUARD(d_lens);
    CHECK_GUARD(d_bt);
}

/* ---- the grid --------------------------------------------------------------------------- */

/* Every KV dtype x head dim x GQA ratio over contexts 1, 15, 16, 17, 100. Within each
 * (KV dtype, head dim) the four GQA cases take the four partitionings (automatic, which
 * leaves these contexts unsplit, and forced 16 / 32 / 48) and both block sizes; the out
 * dtype rotates over all 24 cases. */
static void test_shapes(void)
{
    const enum kv_dtype kvts[] = { KV_F16, KV_BF16, KV_FP8_E4M3 };
    const int hds[] = { 64, 128 }, groups[] = { 1, 3, 7, 8 }, parts[] = { 0, 16, 32, 48 };
    const enum dtype outs[] = { DT_F32, DT_F16, DT_BF16 };
    int n = 0;
    for (int ki = 0; ki < 3; ki++)
        for (int hi = 0; hi < 2; hi++)
            for (int gi = 0; gi < 4; gi++, n++) {
                const int g = groups[gi], nkv = g == 1 ? 3 : g == 8 ? 1 : 2;
                ad_case c = { "shapes", hds[hi], g * nkv, nkv, gi % 2 ? 32 : 16, kvts[ki], outs[n % 3],
                              { 1, 15, 16, 17, 100 }, parts[(gi + hi + ki) % 4], 0, false, false, 0 };
                run_case(c, 0x6100 + n);
            }
}

/* Long contexts: split automatically (few sequences), and forced into one partition. */
static void test_long_context(void)
{
    const ad_case cases[] = {
        { "2100 positions, auto split", 128, 7, 1, 16, KV_BF16, DT_F32, { 2100 }, 0, 0, false, false, 0 },
        { "2100 positions, one partition", 128, 7, 1, 16, KV_BF16, DT_F32, { 2100 }, 2112, 0, false, false, 0 },
        { "2049 + 700, fp8, auto split", 128, 8, 1, 32, KV_FP8_E4M3, DT_BF16, { 2049, 700 }, 0, 0, false, false, 0 },
        { "2049 + 700, f16, auto split", 64, 3, 1, 16, KV_F16, DT_F16, { 700, 2049 }, 0, 0, false, false, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(cases[i], 0x6200 + i);
}

/* 64 sequences of random short contexts; one batch split into 16-position partitions. */
static void test_many_sequences(void)
{
    ktest_rng rng(0x6300);
    std::vector<int> lens(64), lens2(64);
    for (int i = 0; i < 64; i++) {
        lens[i] = 1 + rng.below(40);
        lens2[i] = 1 + rng.below(70);
    }
    const ad_case cases[] = {
        { "64 sequences", 64, 8, 1, 16, KV_F16, DT_F16, lens, 0, 0, false, false, 0 },
        { "64 sequences, split", 64, 3, 1, 32, KV_BF16, DT_F32, lens2, 16, 0, false, false, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(cases[i], 0x6310 + i);
}

/* Batch padding, big groups, head_dim 96, q in place, slack in max_seq_len. */
static void test_layouts(void)
{
    const ad_case cases[] = {
        { "padding rows", 64, 4, 2, 16, KV_F16, DT_F32, { 0, 5, 0, 33 }, 0, 0, false, false, 0 },
        { "padding rows, split", 128, 7, 1, 32, KV_FP8_E4M3, DT_F16, { 0, 70, 0, 1 }, 16, 0, false, false, 0 },
        { "all padding", 64, 2, 1, 16, KV_BF16, DT_BF16, { 0, 0 }, 0, 0, false, false, 0 },
        { "group of 20 heads", 64, 20, 1, 16, KV_F16, DT_F32, { 37, 1 }, 0, 0, false, false, 0 },
        { "group of 16 heads, split", 64, 32, 2, 32, KV_BF16, DT_F32, { 50 }, 16, 0, false, false, 0 },
        { "head_dim 96", 96, 4, 2, 16, KV_F16, DT_F32, { 23, 70 }, 0, 0, false, false, 0 },
        { "head_dim 96, fp8, split", 96, 3, 1, 32, KV_FP8_E4M3, DT_BF16, { 90 }, 32, 0, false, false, 0 },
        { "fused q", 128, 6, 2, 16, KV_BF16, DT_F32, { 17, 40 }, 0, 0, true, false, 0 },
        { "fused q, split", 64, 7, 1, 16, KV_F16, DT_F16, { 80 }, 32, 0, true, false, 0 },
        { "max_seq_len slack, split", 64, 3, 1, 16, KV_F16, DT_F32, { 17, 100 }, 32, 200, false, false, 0 },
        { "max_seq_len slack, auto", 128, 8, 1, 16, KV_FP8_E4M3, DT_F32, { 3, 60 }, 0, 1000, false, false, 0 },
        { "Qwen2.5-7B heads", 128, 28, 4, 16, KV_BF16, DT_BF16, { 1, 300, 777 }, 0, 0, false, false, 0 },
        { "Qwen2.5-7B heads, fp8", 128, 28, 4, 16, KV_FP8_E4M3, DT_F32, { 513, 2 }, 0, 0, false, false, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(cases[i], 0x6400 + i);
}

static void test_rescale(void)
{
    const ad_case cases[] = {
        /* unsplit (max_partitions 1): the automatic split gives these contexts one tile per
         * partition, where nothing is ever rescaled */
        { "climbing scores, unsplit", 64, 2, 2, 16, KV_F16, DT_F32, { 300 }, 0, 0, false, true, 1 },
        { "climbing scores, unsplit, 7 heads", 64, 7, 1, 32, KV_BF16, DT_F32, { 300, 130 }, 0, 0, false, true, 1 },
        { "climbing scores, unsplit, fp8", 128, 3, 1, 16, KV_FP8_E4M3, DT_F32, { 200 }, 0, 0, false, true, 1 },
        { "climbing scores, 2 tiles per partition", 128, 7, 1, 16, KV_BF16, DT_F32, { 300 }, 128, 0, false, true,
          1 << 30 },
        { "climbing scores", 64, 2, 2, 16, KV_F16, DT_F32, { 300 }, 0, 0, false, true, 0 },
        { "climbing scores, split", 64, 7, 1, 32, KV_BF16, DT_F32, { 300, 130 }, 128, 0, false, true, 0 },
        { "climbing scores, fp8", 128, 3, 1, 16, KV_FP8_E4M3, DT_F32, { 200 }, 0, 0, false, true, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(cases[i], 0x6500 + i);
}

/* Per-sequence splits: each context cut into the partitions of partition_size positions it
 * needs, at most max_partitions of them (the grid's width), all of one size rounded up to 64
 * (16 when partition_size is not a multiple of 64); contexts of every length in one batch,
 * so one grid holds sequences split 1, 2, ... ways. The decode step's shapes: one and eight
 * sequences of ~1,024 positions over Qwen2.5-7B's heads, split automatically (16 partitions
 * of 64: one tile each). */
static void test_split(void)
{
    const ad_case cases[] = {
        { "cap 3", 64, 7, 1, 16, KV_BF16, DT_F32, { 100, 1, 47, 200, 16 }, 16, 0, false, false, 3 },
        { "cap 2, fp8", 128, 8, 1, 32, KV_FP8_E4M3, DT_BF16, { 129, 700, 64, 65 }, 64, 0, false, false, 2 },
        { "cap 1: unsplit", 128, 4, 2, 16, KV_F16, DT_F32, { 2100, 3 }, 64, 0, false, false, 1 },
        { "no cap, 16 per partition", 64, 3, 1, 16, KV_F16, DT_F16, { 300, 31 }, 16, 0, false, false, 1 << 30 },
        { "partitions of 64, uneven", 128, 7, 1, 16, KV_BF16, DT_F32, { 1000, 1100, 65, 64, 63 }, 64, 0, false,
          false, 0 },
        { "batch 1, 1,024 positions", 128, 28, 4, 16, KV_BF16, DT_BF16, { 1030 }, 0, 0, false, false, 0 },
        { "batch 8, ~1,024 positions, fp8", 128, 28, 4, 16, KV_FP8_E4M3, DT_BF16,
          { 1030, 1024, 1000, 1090, 1, 640, 1031, 1029 }, 0, 0, false, false, 0 },
        { "climbing, split by 64", 64, 7, 1, 32, KV_BF16, DT_F32, { 300, 130 }, 64, 0, false, true, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(cases[i], 0x6600 + i);
}

/* The workspace bound covers every choice the launcher can make, and is 0 when nothing
 * can split. (Every run_case call also passes exactly this many bytes: the launcher
 * refuses a short workspace, so a bound below its need fails those cases.) */
static void test_workspace_size(void)
{
    CHECK(cuda_attention_decode_workspace_size(8, 28, 128, 64, 0, 0) == 0, "64 positions cannot split");
    CHECK(cuda_attention_decode_workspace_size(8, 28, 128, 0, 0, 0) == 0, "an empty context cannot split");
    CHECK(cuda_attention_decode_workspace_size(8, 28, 128, 32, 32, 0) == 0, "one forced partition");
    CHECK(cuda_attention_decode_workspace_size(8, 28, 128, 4096, 0, 1) == 0, "a cap of one partition");
    CHECK(cuda_attention_decode_workspace_size(2, 4, 64, 100, 16, 0) == (size_t)2 * 4 * 7 * 66 * 4,
          "forced partitions of 16: %zu", cuda_attention_decode_workspace_size(2, 4, 64, 100, 16, 0));
    CHECK(cuda_attention_decode_workspace_size(2, 4, 64, 100, 16, 3) == (size_t)2 * 4 * 3 * 66 * 4,
          "partitions of 16, at most 3: %zu", cuda_attention_decode_workspace_size(2, 4, 64, 100, 16, 3));
    CHECK(cuda_attention_decode_workspace_size(2, 4, 64, 100, 16, -1) == 0, "a negative cap sized");
    size_t a = cuda_attention_decode_workspace_size(64, 28, 128, 32768, 0, 0);
    size_t b = cuda_attention_decode_workspace_size(64, 28, 128, 2048, 0, 0);
    size_t c = cuda_attention_decode_workspace_size(1, 28, 128, 32768, 0, 0);
    CHECK(a >= b && a >= c && c > 0, "not monotone: %zu %zu %zu", a, b, c);
    /* the automatic cap: 4 resident blocks per multiprocessor over (sequences x kv heads x
       head groups of head_rows: automatically 8 for groups of up to 8 heads, else 16) */
    CHECK(cuda_attention_decode_max_partitions(1, 28, 4, 0, 132) == 132, "batch 1: %d",
          cuda_attention_decode_max_partitions(1, 28, 4, 0, 132));
    CHECK(cuda_attention_decode_max_partitions(8, 28, 4, 0, 132) == 16, "batch 8");
    CHECK(cuda_attention_decode_max_partitions(64, 28, 4, 0, 132) == 2, "batch 64");
    CHECK(cuda_attention_decode_max_partitions(256, 28, 4, 0, 132) == 1, "batch 256");
    CHECK(cuda_attention_decode_max_partitions(8, 28, 4, 16, 132) == 16, "batch 8, 16 rows");
    CHECK(cuda_attention_decode_max_partitions(1, 64, 2, 0, 132) == 132, "two head groups: %d",
          cuda_attention_decode_max_partitions(1, 64, 2, 0, 132));
    CHECK(cuda_attention_decode_max_partitions(2, 64, 2, 0, 132) == 66, "two head groups of 16, 2 sequences: %d",
          cuda_attention_decode_max_partitions(2, 64, 2, 0, 132));
    CHECK(cuda_attention_decode_max_partitions(2, 64, 2, 8, 132) == 33, "four head groups of 8, 2 sequences: %d",
          cuda_attention_decode_max_partitions(2, 64, 2, 8, 132));
    CHECK(cuda_attention_decode_max_partitions(1, 28, 3, 0, 132) == 1, "28 heads over 3 kv heads");
    CHECK(cuda_attention_decode_max_partitions(1, 28, 4, 0, 0) == 1, "no multiprocessors");
    CHECK(cuda_attention_decode_max_partitions(1, 28, 4, 4, 132) == 1, "head_rows 4");
}

/* Unsupported shapes and types are refused before any launch; zero sequences is a no-op. */
static void test_invalid(void)
{
    kbuf<unsigned char> pool(2 * 2 * 1 * 16 * 128 * 2);
    kbuf<float> q(2 * 2 * 128 + 4);
    kbuf<float> out(2 * 2 * 128);
    kbuf<unsigned char> ws(4096);
    kbuf<int32_t> meta(4);
    std::vector<int32_t> m = { 16, 0, 0, 1 }; /* seq_lens = {16}, block_tables [1][2] = {0, 1} */
    meta.upload(m);
    struct kv_layer kv = {};
    kv.data = pool.ptr;
    kv.dtype = KV_F16;
    kv.num_blocks = 2;
    kv.block_size = 16;
    kv.n_kv_heads = 1;
    kv.head_dim = 128;
    kv.k_scale = kv.v_scale = 1.0f;
    auto call = [&](const struct kv_layer &k, enum dtype od, const float *qp, int64_t qs, int nh, int ns, int maxlen,
                    int part, size_t wsb, int maxp = 0, int rows = 0, void *qa = nullptr) {
        return cuda_attention_decode(out.ptr, od, qp, qs, &k, meta.ptr, meta.ptr + 2, 2, ns, nh, 0.1f, maxlen, part,
                                     maxp, rows, ws.ptr, wsb, qa, 0, 0);
    };
    const int inval = (int)cudaErrorInvalidValue;
    struct kv_layer k = kv;
    k.head_dim = 80;
    CHECK(call(k, DT_F32, q.ptr, 2 * 80, 2, 1, 16, 0, 0) == inval, "head_dim 80 accepted");
    k = kv;
    k.dtype = KV_F32;
    CHECK(call(k, DT_F32, q.ptr, 256, 2, 1, 16, 0, 0) == inval, "KV_F32 accepted");
    k = kv;
    k.block_size = 24;
    CHECK(call(k, DT_F32, q.ptr, 256, 2, 1, 16, 0, 0) == inval, "block_size 24 accepted");
    k = kv;
    k.block_size = 8;
    CHECK(call(k, DT_F32, q.ptr, 256, 2, 1, 8, 0, 0) == inval, "block_size 8 accepted");
    k = kv;
    k.n_kv_heads = 2;
    CHECK(call(k, DT_F32, q.ptr, 3 * 128, 3, 1, 16, 0, 0) == inval, "3 heads over 2 kv heads accepted");
    k = kv;
    k.dtype = KV_FP8_E4M3;
    k.k_scale = 0.0f;
    CHECK(call(k, DT_F32, q.ptr, 256, 2, 1, 16, 0, 0) == inval, "FP8 k_scale 0 accepted");
    CHECK(call(kv, DT_Q8_0, q.ptr, 256, 2, 1, 16, 0, 0) == inval, "Q8_0 output accepted");
    CHECK(call(kv, DT_F32, q.ptr, 200, 2, 1, 16, 0, 0) == inval, "q_stride < n_heads * head_dim accepted");
    CHECK(call(kv, DT_F32, q.ptr, 258, 2, 1, 16, 0, 0) == inval, "q_stride not a multiple of 4 accepted");
    CHECK(call(kv, DT_F32, q.ptr + 1, 256, 2, 1, 16, 0, 0) == inval, "unaligned q accepted");
    CHECK(call(kv, DT_F32, q.ptr, 256, 2, 1, 16, 24, 0) == inval, "partition_size 24 accepted");
    CHECK(call(kv, DT_F32, q.ptr, 256, 2, 1, 16, 0, 0, -1) == inval, "max_partitions -1 accepted");
    CHECK(call(kv, DT_F32, q.ptr, 256, 2, 1, 16, 0, 0, 0, 4) == inval, "head_rows 4 accepted");
    CHECK(call(kv, DT_F32, q.ptr, 256, 2, 1, 16, 0, 0, 0, 32) == inval, "head_rows 32 accepted");
    CHECK(call(kv, DT_F32, q.ptr, 256, 2, 1, 16, 0, 0, 0, -8) == inval, "head_rows -8 accepted");
    CHECK(call(kv, DT_F32, q.ptr, 256, 2, 1, 33, 0, 0) == inval, "max_seq_len past the block table accepted");
    CHECK(call(kv, DT_F32, q.ptr, 256, 2, 1, 32, 16, 100) == inval, "a short workspace accepted");
    CHECK(call(kv, DT_BF16, q.ptr, 256, 2, 1, 16, 0, 0, 0, 0, ws.ptr) == inval, "qact beside a BF16 out accepted");
    CHECK(call(kv, DT_F32, q.ptr, 256, 2, 1, 16, 0, 0, 0, 0, (char *)ws.ptr + 4) == inval, "unaligned qact accepted");
    CHECK(cudaGetLastError() == cudaSuccess, "a refused call left an error behind");
    std::vector<float> o = out.download();
    bool untouched = true;
    for (float x : o) untouched = untouched && isnan(x);
    CHECK(untouched, "a refused call wrote output");
    CHECK(call(kv, DT_F32, q.ptr, 256, 2, 0, 16, 0, 0) == 0, "zero sequences failed");
    o = out.download();
    for (float x : o) untouched = untouched && isnan(x);
    CHECK(untouched, "zero sequences wrote output");
    CHECK_GUARD(pool);
    CHECK_GUARD(q);
    CHECK_GUARD(out);
    CHECK_GUARD(ws);
    CHECK_GUARD(meta);
}

int main(void)
{
    RUN(test_shapes);
    RUN(test_long_context);
    RUN(test_many_sequences);
    RUN(test_layouts);
    RUN(test_rescale);
    RUN(test_split);
    RUN(test_workspace_size);
    RUN(test_invalid);
    return test_summary();
}

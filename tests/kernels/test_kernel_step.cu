/* test_kernel_step.cu — kernels/step.cu (the CUDA backend's glue: step unpack, row gather,
 * F32 -> F16/BF16) against plain-loop CPU twins written here (the CPU backend has no use
 * for these ops).
 *
 * step_unpack: random steps of 0-300 tokens over 1-40 sequences, decode-only and mixed,
 * with one-step-lag tokens (-1 - k) resolved from a fake previous sampling output whose
 * rows are sizeof(struct sampling_output) apart, an index past the previous step's
 * rows (-1), padding of tokens / sequences / logits rows (graph buckets), block tables of
 * 0 to max_blocks_per_seq entries into a poisoned [pad_seqs][max_blocks] table (entries
 * past a sequence's blocks must keep their poison). Every output compared exactly.
 * gather_rows: dims on the float4 path and odd dims, repeated and reversed rows.
 * convert_f32: F16 and BF16, lengths around the float4 tail, bitwise against util/half.h.
 */
#include "ktest.h"

#include "kernels/sampling.h"
#include "kernels/step.h"

static const ktol EXACT = { 0.0, 0.0 };

#define PREV_STRIDE ((int64_t)(sizeof(struct sampling_output) / sizeof(int32_t))) /* the backend's stride */

/* The CPU twin of cuda_step_unpack, on host arrays with the same meaning. */
static void cpu_step_unpack(const struct step_unpack_args *a)
{
    for (int i = 0; i < a->pad_tokens; i++) {
        int32_t tok = 0, pos = 0;
        int64_t slot = -1;
        if (i < a->num_tokens) {
            tok = a->token_ids[i];
            if (tok < 0) {
                int k = -1 - tok;
                tok = k < a->prev_count ? a->prev_tokens[(int64_t)k * a->prev_stride] : -1;
            }
            pos = a->positions[i];
            slot = a->slot_mapping[i];
        }
        a->out_token_ids[i] = tok;
        a->out_positions[i] = pos;
        a->out_slot_mapping[i] = slot;
    }
    for (int i = 0; i < a->pad_logits; i++) a->out_logits_indices[i] = i < a->num_logits ? a->logits_indices[i] : i;
    if (a->pad_seqs) a->out_query_start[0] = a->num_seqs ? a->query_start[0] : 0;
    for (int s = 0; s < a->pad_seqs; s++) {
        if (s >= a->num_seqs) {
            a->out_seq_lens[s] = 0;
            int q = a->num_tokens + (s + 1 - a->num_seqs);
            a->out_query_start[s + 1] = q < a->pad_tokens ? q : a->pad_tokens;
            continue;
        }
        a->out_seq_lens[s] = a->seq_lens[s];
        a->out_query_start[s + 1] = a->query_start[s + 1];
        int n = a->bt_start[s + 1] - a->bt_start[s];
        if (n > a->max_blocks_per_seq) n = a->max_blocks_per_seq;
        for (int j = 0; j < n; j++)
            a->out_block_tables[(int64_t)s * a->max_blocks_per_seq + j] = a->bt_ids[a->bt_start[s] + j];
    }
}

template <typename T> static bool same(const char *what, const std::vector<T> &got, const std::vector<T> &ref)
{
    for (size_t i = 0; i < ref.size(); i++)
        if (memcmp(&got[i], &ref[i], sizeof(T)) != 0) {
            fprintf(stderr, "    %s[%zu]: got %lld, ref %lld\n", what, i, (long long)got[i], (long long)ref[i]);
            return false;
        }
    return true;
}

/* One random step: S sequences (decode-only when decode, else 0-40 new tokens each),
 * padded by pad_extra tokens / sequences. */
static void unpack_case(int S, bool decode, int pad_extra, int max_blocks, int prev_count, uint64_t seed)
{
    ktest_rng r(seed);
    std::vector<int32_t> qs(S + 1), lens(S), bt_start(S + 1), bt_ids, tok, pos, logits_idx;
    std::vector<int64_t> slots;
    qs[0] = 0;
    bt_start[0] = 0;
    for (int s = 0; s < S; s++) {
        int n = decode ? 1 : r.below(41);
        int len = n + r.below(100);
        qs[s + 1] = qs[s] + n;
        lens[s] = len;
        int nblk = (len + 15) / 16;
        if (nblk > max_blocks) nblk = max_blocks + (s & 1); /* one over, clipped by the kernel */
        for (int j = 0; j < nblk; j++) bt_ids.push_back(r.below(1000));
        bt_start[s + 1] = (int32_t)bt_ids.size();
        for (int t = 0; t < n; t++) {
            tok.push_back(r.below(4) == 0 ? -1 - r.below(prev_count + 2) : r.below(50000));
            pos.push_back(len - n + t);
            slots.push_back(r.below(5) == 0 ? -1 : (int64_t)r.below(1 << 20));
        }
        if (n) logits_idx.push_back(qs[s + 1] - 1);
    }
    const int T = qs[S], L = (int)logits_idx.size();
    const int padT = T + pad_extra, padS = S + pad_extra, padL = L + pad_extra;
    std::vector<int32_t> prev((size_t)(prev_count + 1) * PREV_STRIDE);
    for (auto &p : prev) p = r.below(60000);
    if (bt_ids.empty()) bt_ids.push_back(0);

    kbuf<int32_t> d_tok(T ? T : 1), d_pos(T ? T : 1), d_qs(S + 1), d_lens(S ? S : 1), d_bts(S + 1),
        d_btid(bt_ids.size()), d_li(L ? L : 1), d_prev(prev.size());
    kbuf<int64_t> d_slots(T ? T : 1);
    kbuf<int32_t> o_tok(padT ? padT : 1), o_pos(padT ? padT : 1), o_qs(padS + 1), o_lens(padS ? padS : 1),
        o_bt((size_t)(padS ? padS : 1) * max_blocks + 1), o_li(padL ? padL : 1);
    kbuf<int64_t> o_slots(padT ? padT : 1);
    if (T) {
        d_tok.upload(tok);
        d_pos.upload(pos);
        d_slots.upload(slots);
    }
    d_qs.upload(qs);
    if (S) d_lens.upload(lens);
    d_bts.upload(bt_start);
    d_btid.upload(bt_ids);
    if (L) d_li.upload(logits_idx);
    d_prev.upload(prev);

    struct step_unpack_args a = {};
    a.token_ids = d_tok.ptr;
    a.positions = d_pos.ptr;
    a.slot_mapping = d_slots.ptr;
    a.query_start = d_qs.ptr;
    a.seq_lens = d_lens.ptr;
    a.bt_start = d_bts.ptr;
    a.bt_ids = d_btid.ptr;
    a.logits_indices = d_li.ptr;
    a.prev_tokens = d_prev.ptr;
    a.prev_stride = PREV_STRIDE;
    a.prev_count = prev_count;
    a.num_tokens = T;
    a.num_seqs = S;
    a.num_logits = L;
    a.pad_tokens = padT;
    a.pad_seqs = padS;
    a.pad_logits = padL;
    a.out_token_ids = o_tok.ptr;
    a.out_positions = o_pos.ptr;
    a.out_slot_mapping = o_slots.ptr;
    a.out_query_start = o_qs.ptr;
    a.out_seq_lens = o_lens.ptr;
    a.out_block_tables = o_bt.ptr;
    a.max_blocks_per_seq = max_blocks;
    a.out_logits_indices = o_li.ptr;

    /* the twin on host copies; outputs start as the device ones do (0xFF poison) */
    std::vector<int32_t> h_tok(o_tok.n, -1), h_pos(o_pos.n, -1), h_qs(o_qs.n, -1), h_lens(o_lens.n, -1),
        h_bt(o_bt.n, -1), h_li(o_li.n, -1);
    std::vector<int64_t> h_slots(o_slots.n, -1);
    struct step_unpack_args h = a;
    h.token_ids = tok.data();
    h.positions = pos.data();
    h.slot_mapping = slots.data();
    h.query_start = qs.data();
    h.seq_lens = lens.data();
    h.bt_start = bt_start.data();
    h.bt_ids = bt_ids.data();
    h.logits_indices = logits_idx.data();
    h.prev_tokens = prev.data();
    h.out_token_ids = h_tok.data();
    h.out_positions = h_pos.data();
    h.out_slot_mapping = h_slots.data();
    h.out_query_start = h_qs.data();
    h.out_seq_lens = h_lens.data();
    h.out_block_tables = h_bt.data();
    h.out_logits_indices = h_li.data();
    cpu_step_unpack(&h);

    char what[96];
    snprintf(what, sizeof what, "unpack S=%d T=%d decode=%d pad=%d maxblk=%d", S, T, decode, pad_extra, max_blocks);
    KTEST_SEEDS(sd) {
        for (auto *b : { &o_tok, &o_pos, &o_qs, &o_lens, &o_bt, &o_li }) b->poison();
        o_slots.poison();
        int e = cuda_step_unpack(&a, 0);
        CHECK(e == 0, "%s: error %d", what, e);
        CHECK(same("token_ids", o_tok.download(), h_tok), "%s: token ids", what);
        CHECK(same("positions", o_pos.download(), h_pos), "%s: positions", what);
        CHECK(same("slots", o_slots.download(), h_slots), "%s: slots", what);
        CHECK(same("query_start", o_qs.download(), h_qs), "%s: query_start", what);
        CHECK(same("seq_lens", o_lens.download(), h_lens), "%s: seq_lens", what);
        CHECK(same("block_tables", o_bt.download(), h_bt), "%s: block tables", what);
        CHECK(same("logits_indices", o_li.download(), h_li), "%s: logits indices", what);
        for (auto *b : { &d_tok, &d_pos, &d_qs, &d_lens, &d_bts, &d_btid, &d_li, &d_prev, &o_tok, &o_pos, &o_qs,
                         &o_lens, &o_bt, &o_li })
            CHECK_GUARD(*b);
        CHECK_GUARD(d_slots);
        CHECK_GUARD(o_slots);
    }
}

static void test_step_unpack(void)
{
    unpack_case(1, true, 0, 8, 1, 1);        /* batch-1 decode */
    unpack_case(5, true, 3, 8, 5, 2);        /* decode padded to a graph bucket of 8 */
    unpack_case(24, true, 0, 64, 24, 3);
    unpack_case(7, false, 0, 16, 0, 4);      /* prefill, no previous step: every lag token -> -1 */
    unpack_case(40, false, 0, 4, 40, 5);     /* long tables clipped at max_blocks_per_seq */
    unpack_case(12, false, 9, 32, 3, 6);     /* mixed, padded */
    unpack_case(300, true, 0, 2, 300, 7);    /* more rows than one CTA */
    unpack_case(0, true, 4, 8, 0, 8);        /* an all-padding step */
}

static void test_step_unpack_invalid(void)
{
    struct step_unpack_args a = {};
    a.num_tokens = 2;
    a.pad_tokens = 1; /* pad below the count */
    CHECK(cuda_step_unpack(&a, 0) == (int)cudaErrorInvalidValue, "pad_tokens < num_tokens accepted");
    a.pad_tokens = 2; /* inputs missing */
    CHECK(cuda_step_unpack(&a, 0) == (int)cudaErrorInvalidValue, "NULL inputs accepted");
    CHECK(cuda_step_unpack(NULL, 0) == (int)cudaErrorInvalidValue, "NULL args accepted");
    struct step_unpack_args z = {};
    CHECK(cuda_step_unpack(&z, 0) == 0, "an empty step must launch nothing and succeed");
    CHECK(cudaGetLastError() == cudaSuccess, "an error was left behind");
}

static void gather_case(int64_t dim, int num_rows, int in_rows, uint64_t seed)
{
    ktest_rng r(seed);
    std::vector<float> in((size_t)in_rows * dim);
    r.fill_normal(in.data(), in.size());
    std::vector<int32_t> rows(num_rows);
    for (int i = 0; i < num_rows; i++) rows[i] = i % 3 == 2 ? rows[i - 1] : r.below(in_rows);
    std::vector<float> ref((size_t)num_rows * dim);
    for (int i = 0; i < num_rows; i++) memcpy(&ref[(size_t)i * dim], &in[(size_t)rows[i] * dim], sizeof(float) * dim);
    kbuf<float> d_in(in.size()), out(ref.size());
    kbuf<int32_t> d_rows(rows.size());
    d_in.upload(in);
    d_rows.upload(rows);
    char what[64];
    snprintf(what, sizeof what, "gather dim=%lld rows=%d", (long long)dim, num_rows);
    KTEST_SEEDS(s) {
        out.poison();
        CHECK(cuda_gather_rows(out.ptr, d_in.ptr, dim, d_rows.ptr, num_rows, 0) == 0, "%s: launch", what);
        std::vector<float> got = out.download();
        CHECK_CLOSE_ARRAYS(what, got.data(), ref.data(), ref.size(), EXACT);
        CHECK_GUARD(out);
    }
}

static void test_gather_rows(void)
{
    gather_case(576, 1, 7, 11);
    gather_case(3584, 9, 40, 12);
    gather_case(64, 64, 64, 13);
    gather_case(37, 5, 9, 14);     /* scalar path */
    gather_case(8192 + 4, 3, 4, 15); /* more than one CTA along the row */
    CHECK(cuda_gather_rows(NULL, NULL, 4, NULL, 1, 0) == (int)cudaErrorInvalidValue, "NULL accepted");
}

static void convert_case(enum dtype dt, int64_t n, uint64_t seed)
{
    ktest_rng r(seed);
    std::vector<float> in(n);
    r.fill_normal(in.data(), in.size(), 3.0f);
    if (n > 3) {
        in[0] = 65520.0f; /* rounds to F16 inf */
        in[1] = 1e-8f;    /* F16 subnormal */
        in[2] = -0.0f;
    }
    std::vector<uint16_t> ref = dt == DT_F16 ? ktest_to_f16(in.data(), n) : ktest_to_bf16(in.data(), n);
    kbuf<float> d_in(n);
    kbuf<uint16_t> out(n);
    d_in.upload(in);
    KTEST_SEEDS(s) {
        out.poison();
        CHECK(cuda_convert_f32(out.ptr, dt, d_in.ptr, n, 0) == 0, "convert %s n=%lld", dtype_name(dt), (long long)n);
        std::vector<uint16_t> got = out.download();
        CHECK(same(dtype_name(dt), got, ref), "convert %s n=%lld differs", dtype_name(dt), (long long)n);
        CHECK_GUARD(out);
    }
}

static void test_convert_f32(void)
{
    for (enum dtype dt : { DT_F16, DT_BF16 })
        for (int64_t n : { 1, 3, 4, 5, 1023, 4096, 100003 }) convert_case(dt, n, 20 + n);
    CHECK(cuda_convert_f32(NULL, DT_F16, NULL, 4, 0) == (int)cudaErrorInvalidValue, "NULL accepted");
    kbuf<float> x(4);
    CHECK(cuda_convert_f32(x.ptr, DT_F32, x.ptr, 4, 0) == (int)cudaErrorInvalidValue, "F32 output accepted");
    CHECK(cudaGetLastError() == cudaSuccess, "an error was left behind");
}

int main(void)
{
    RUN(test_step_unpack);
    RUN(test_step_unpack_invalid);
    RUN(test_gather_rows);
    RUN(test_convert_f32);
    return test_summary();
}

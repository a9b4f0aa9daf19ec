/* test_kernel_embedding.cu — kernels/embedding.cu (cuda_embedding) against its CPU twin
 * cpu_embedding, and cpu_embedding against quant_dequant_row.
 *
 * Every table type (F32, F16, BF16 and the seven GGUF quant types) with random rows
 * (ktest_quant.h); dims: 16-byte vector paths and the scalar fallbacks (odd dims, a
 * misaligned table), the 32-element types at 32 * odd (rows not 16-byte aligned), the
 * K-quants at 256 and 3584; ids repeated, the first and last row, and out of range
 * (-1, vocab, INT32_MIN, INT32_MAX) which must give zero rows. Both sides dequantize with
 * the same operations in the same order, so the comparison is bitwise (max error 0).
 */
#include "ktest.h"
#include "ktest_quant.h"

#include "kernels/embedding.h"

#include <limits.h>

extern "C" {
#include "backend/cpu/embedding.h"
#include "backend/cpu/quant.h"
}

static const ktol EXACT = { 0.0, 0.0 };

static std::vector<int32_t> make_ids(int num_tokens, int64_t vocab, ktest_rng &r)
{
    const int32_t special[] = { -1, (int32_t)vocab, INT32_MIN, INT32_MAX, 0, (int32_t)vocab - 1 };
    std::vector<int32_t> ids(num_tokens);
    for (int t = 0; t < num_tokens; t++) {
        if (t % 5 == 4) ids[t] = special[(t / 5) % 6];
        else if (t % 3 == 2 && t > 0) ids[t] = ids[t - 1]; /* repeats */
        else ids[t] = r.below((int)vocab);
    }
    return ids;
}

/* cuda_embedding vs cpu_embedding, bitwise; table_offset shifts the table off 16-byte
 * alignment (the scalar path for float types). */
static void run_case(enum dtype type, int64_t dim, int64_t vocab, int num_tokens, uint64_t seed, int table_offset = 0)
{
    ktest_rng r(seed);
    std::vector<uint8_t> th = ktest_rand_weights(type, dim, vocab, r);
    std::vector<int32_t> ids = make_ids(num_tokens, vocab, r);
    std::vector<float> ref((size_t)num_tokens * dim);
    cpu_embedding(type, th.data(), vocab, dim, ids.data(), num_tokens, ref.data());

    kbuf<uint8_t> table(th.size() + table_offset);
    kbuf<int32_t> d_ids(ids.size());
    kbuf<float> out((size_t)num_tokens * dim);
    KCHECK_CUDA(cudaMemcpy(table.ptr + table_offset, th.data(), th.size(), cudaMemcpyHostToDevice));
    d_ids.upload(ids);
    KTEST_SEEDS(s) {
        out.poison();
        int e = cuda_embedding(type, table.ptr + table_offset, vocab, dim, d_ids.ptr, num_tokens, out.ptr, 0);
        CHECK(e == 0, "cuda_embedding %s dim=%lld: error %d", dtype_name(type), (long long)dim, e);
        std::vector<float> got = out.download();
        char what[80];
        snprintf(what, sizeof what, "embedding %s dim=%lld vocab=%lld T=%d off=%d", dtype_name(type), (long long)dim,
                 (long long)vocab, num_tokens, table_offset);
        CHECK_CLOSE_ARRAYS(what, got.data(), ref.data(), got.size(), EXACT);
        CHECK(memcmp(got.data(), ref.data(), got.size() * sizeof(float)) == 0, "%s: not bitwise equal", what);
        CHECK_GUARD(table);
        CHECK_GUARD(d_ids);
        CHECK_GUARD(out);
    }
}

/* The twin itself: each row is quant_dequant_row of its id's row, zeros out of range. */
static void test_cpu_twin(void)
{
    ktest_rng r(0xe0);
    const int64_t dim = 256, vocab = 11;
    std::vector<uint8_t> th = ktest_rand_weights(DT_Q4_K, dim, vocab, r);
    std::vector<int32_t> ids = make_ids(15, vocab, r);
    std::vector<float> out(15 * dim, NAN), row(dim);
    cpu_embedding(DT_Q4_K, th.data(), vocab, dim, ids.data(), 15, out.data());
    int bad = 0, zero_rows = 0;
    for (int t = 0; t < 15; t++) {
        if (ids[t] < 0 || ids[t] >= vocab) {
            zero_rows++;
            for (int64_t i = 0; i < dim; i++) bad += out[t * dim + i] != 0.0f;
        } else {
            quant_dequant_row(DT_Q4_K, th.data() + (size_t)ids[t] * dtype_row_bytes(DT_Q4_K, dim), row.data(), dim);
            bad += memcmp(row.data(), out.data() + t * dim, dim * sizeof(float)) != 0;
        }
    }
    CHECK(bad == 0, "cpu_embedding: %d wrong values/rows", bad);
    CHECK(zero_rows >= 3, "the ids hold %d out-of-range ids, want at least 3", zero_rows);
}

static void test_float_tables(void)
{
    int n = 0;
    for (enum dtype type : { DT_F32, DT_F16, DT_BF16 }) {
        run_case(type, 64, 50, 7, 0xe100 + n++);        /* vector path */
        run_case(type, 3584, 20, 5, 0xe100 + n++);      /* vector path, model width */
        run_case(type, 37, 50, 33, 0xe100 + n++);       /* odd dim: scalar */
        run_case(type, 64, 50, 10, 0xe100 + n++, 4);    /* misaligned table: scalar */
        run_case(type, 12, 9, 1, 0xe100 + n++);         /* F32 vector, 16-bit scalar */
    }
}

static void test_quant_tables(void)
{
    int n = 0;
    for (enum dtype type : { DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q4_K, DT_Q6_K }) {
        bool k = dtype_block_elems(type) == 256;
        run_case(type, 256, 30, 1, 0xe200 + n++);
        run_case(type, k ? 3584 : 224, 17, 12, 0xe200 + n++);
        run_case(type, k ? 4608 : 800, 9, 33, 0xe200 + n++);
        if (!k) run_case(type, 32, 40, 9, 0xe200 + n++);
    }
}

/* Unsupported types and shapes fail loudly and write nothing. */
static void test_invalid(void)
{
    kbuf<uint8_t> table(4096);
    kbuf<int32_t> ids(4);
    kbuf<float> out(256);
    std::vector<int32_t> z(4, 0);
    ids.upload(z);
    out.poison();
    const int inval = (int)cudaErrorInvalidValue;
    CHECK(cuda_embedding(DT_Q8_K, table.ptr, 4, 64, ids.ptr, 4, out.ptr, 0) == inval, "Q8_K table");
    CHECK(cuda_embedding(DT_Q8_1, table.ptr, 4, 64, ids.ptr, 4, out.ptr, 0) == inval, "Q8_1 table");
    CHECK(cuda_embedding(DT_Q4_K, table.ptr, 4, 64, ids.ptr, 4, out.ptr, 0) == inval, "Q4_K with dim 64");
    CHECK(cuda_embedding(DT_Q4_0, table.ptr + 2, 4, 64, ids.ptr, 4, out.ptr, 0) == inval, "misaligned Q4_0 table");
    CHECK(cuda_embedding(DT_F32, table.ptr, 4, 0, ids.ptr, 4, out.ptr, 0) == inval, "dim 0");
    CHECK(cuda_embedding(DT_F32, table.ptr, 4, 64, ids.ptr, 0, out.ptr, 0) == 0, "0 tokens");
    std::vector<float> got = out.download();
    bool untouched = true;
    for (float v : got) untouched = untouched && isnan(v);
    CHECK(untouched, "a rejected call wrote out");
    CHECK_GUARD(table);
    CHECK_GUARD(ids);
    CHECK_GUARD(out);
}

int main(void)
{
    RUN(test_cpu_twin);
    RUN(test_float_tables);
    RUN(test_quant_tables);
    RUN(test_invalid);
    return test_summary();
}

/* quant_kernels.h — internal to backend/cpu: the per-type dot kernels behind cpu_matmul,
 * the quantized-activation layout they read, and the two kernel sets (portable scalar,
 * SIMD). Included by the kernel files, matmul.c and the kernel tests only; the model
 * uses quant.h.
 *
 * Activations. For a quantized weight type, each activation row x[n] (f32) is quantized
 * once per matmul into the caller's scratch, in the integer format its kernel wants:
 *   weight Q4_0, Q5_0, Q8_0 -> Q8_0: q[i] = round(x[i] / d_b), d_b = amax(block of 32)/127
 *   weight Q4_1, Q5_1       -> Q8_1: as Q8_0 plus s_b = d_b * sum(q in block), stored
 *                              interleaved with d as ds[2b] = d_b, ds[2b+1] = s_b so one
 *                              load gives the (d, s) of 4 blocks to match 4 weight (d, m)
 *   weight Q4_K, Q6_K       -> Q8_K: one d per 256, plus bsums[16 per 256] = sum of q per 16
 * stored structure-of-arrays so SIMD loads of q are contiguous:
 *   Q8_0: q[n] int8 | d[n / 32] f32
 *   Q8_1: q[Q81_QBYTES(n)] int8 (regrouped, below) | ds[n / 32][2] f32
 *   Q8_K: q[n] int8 | d[n / 256] f32 | bsums[n / 16] int16
 * Q8_1 codes are regrouped per 4 blocks (A, B, C, D) to match how the 4-bit weight codes
 * unpack: a byte permute gathers the four blocks' 16 code bytes as [A B C D], and the low
 * nibbles are then elements 0-15 of each block, the high nibbles elements 16-31. So a
 * group of 4 blocks occupies 128 bytes
 *   [A0-15 B0-15 C0-15 D0-15 | A16-31 B16-31 C16-31 D16-31]
 * (q81_lo(b) / q81_hi(b): offset of block b's elements 0-15 / 16-31). A last group of
 * fewer than 4 blocks keeps the same 128-byte stride (its unused slots are never read),
 * so a block's position does not depend on the row length.
 * (QA = 32 or 256). d is kept in f32, not fp16 as in ggml, so the only activation error is
 * the rounding of q: |x[i] - d_b q[i]| <= d_b / 2 (plus f32 rounding of x*1/d).
 * Float weight types (F32, F16, BF16) read x directly and need no scratch.
 */
#ifndef TESSERA_BACKEND_CPU_QUANT_KERNELS_H
#define TESSERA_BACKEND_CPU_QUANT_KERNELS_H

#include "util/tensor.h"
#include "util/threadpool.h"

#include <stddef.h>
#include <stdint.h>

static inline int64_t q81_lo(int64_t b) { return (b >> 2) * 128 + (b & 3) * 16; }
static inline int64_t q81_hi(int64_t b) { return q81_lo(b) + 64; }
/* bytes of the Q8_1 code array of an n-element row (whole 128-byte groups) */
#define Q81_QBYTES(n) ((((int64_t)(n) / 32 + 3) / 4) * 128)

/* One quantized activation row (views into scratch). Unused arrays are NULL. */
struct qact {
    int8_t *q;       /* [n] (Q8_1: [Q81_QBYTES(n)], regrouped) */
    float *d;        /* [n / 32] (Q8_0) or [n / 256] (Q8_K) */
    float *ds;       /* [n / 32][2] Q8_1 only: (d, d * sum(q)) per block */
    int16_t *bsums;  /* [n / 16] Q8_K only: sum(q) per 16 elements */
};

/* out[r] = sum_i W_r[i] * x[i] for r < nrows, over n elements (a multiple of the weight's
 * block size); row r starts at w + r * row_bytes (block-aligned). One call covers a run
 * of rows so per-call setup (constants, tail masks) is paid once, not once per row.
 *   xq: x quantized to the kernel's activation type (quantized weights), or NULL
 *   xf: x[n] f32 (float weights), or NULL */
typedef void (*quant_dot_fn)(int64_t n, const void *w, size_t row_bytes, int64_t nrows,
                             const struct qact *xq, const float *xf, float *out);

/* Quantizes x[n] into out in format act (DT_Q8_0, DT_Q8_1 or DT_Q8_K); blocks
 * [b0, b1) of the activation block size only (so rows can be split across threads). */
typedef void (*quant_act_fn)(enum dtype act, const float *x, int64_t b0, int64_t b1,
                             const struct qact *out);

/* ---- packed-weight kernels (gemm_*.c) ----
 *
 * Activations are packed once per matmul into tiles of GEMM_TILE tokens (the last tile
 * of a batch padded with zero tokens; a lone token, decode, is packed as a tile of width 1:
 * the same fields with GEMM_TILE read as 1, so a block is 40 (Q6_K: 44) contiguous bytes),
 * token-interleaved so a micro-kernel reads one sequential
 * stream with constant offsets per token:
 *   quantized weights: per tile, per block b of 32 elements, GEMM_QACT_BLOCK bytes
 *   (GEMM_QACT16_BLOCK for Q6_K):
 *       int32 q4[8][GEMM_TILE]  token t's codes 4j..4j+3 of the block (int8, packed)
 *       f32   d[GEMM_TILE]      the activation scale (amax / 127) of the block's scale
 *                               group: the block itself for 32-element weights (as the
 *                               Q8_0 activations), its 256-element super-block for Q4_K
 *                               and Q6_K (as Q8_K, repeated in each of the 8 blocks)
 *       c[GEMM_TILE]            offset weights (Q8_0, Q4_0, Q5_0): int32 -o * sum(q),
 *                               o = the weight code offset (128, 8, 16); weights with a
 *                               min (Q4_1, Q5_1, Q4_K): f32 d * sum(q)
 *       Q6_K instead: int32 c[2][GEMM_TILE], -32 * sum(q) of elements 0-15 / 16-31
 *   float weights (F32, F16, BF16): per tile f32 x[n][GEMM_TILE]; except BF16 weights in
 *     builds with GEMM_BF16_DOT (below): per tile u32 x2[ceil(n / 2)][GEMM_TILE], each the
 *     pair (bf16(x[2j]), bf16(x[2j+1])) of a token, x[2j] in the low half, rounded to
 *     nearest even, an odd n's last pair padded with 0 (one token: u32 x2[ceil(n / 2)]).
 *     gemm_act_bytes' f32 size holds it.
 * The codes and scales are bitwise those of the per-token path's activations, so the
 * two paths differ only in the order of the f32 accumulation. */
#define GEMM_TILE 12
#define GEMM_QACT_BLOCK (40 * GEMM_TILE)
#define GEMM_QACT16_BLOCK (44 * GEMM_TILE)

/* Kind of packed activations a weight type takes in the batched path:
 *   GEMM_OFFSET  32-element scales, int32 offset sum per block (Q8_0, Q4_0, Q5_0)
 *   GEMM_MIN     32-element scales, f32 d * sum(q) per block (Q4_1, Q5_1)
 *   GEMM_KMIN    as GEMM_MIN with one scale per 256 elements (Q4_K)
 *   GEMM_K16     one scale per 256, int32 offset sums per 16 elements (Q6_K)
 *   GEMM_FLOAT   f32 activations (F32, F16, BF16) */
enum gemm_kind { GEMM_NONE, GEMM_OFFSET, GEMM_MIN, GEMM_KMIN, GEMM_K16, GEMM_FLOAT };

static inline enum gemm_kind gemm_kind_of(enum dtype t)
{
    switch (t) {
    case DT_Q8_0: case DT_Q4_0: case DT_Q5_0: return GEMM_OFFSET;
    case DT_Q4_1: case DT_Q5_1: return GEMM_MIN;
    case DT_Q4_K: return GEMM_KMIN;
    case DT_Q6_K: return GEMM_K16;
    case DT_F32: case DT_F16: case DT_BF16: return GEMM_FLOAT;
    default: return GEMM_NONE;
    }
}

/* Bytes per token of one packed 32-element activation block of a quantized kind. */
static inline int gemm_qact_token_bytes(enum gemm_kind k) { return k == GEMM_K16 ? 44 : 40; }

/* Code offset o of an offset type: stored code u = w + o is unsigned (Q8_0: w + 128). */
static inline int gemm_code_offset(enum dtype t)
{
    return t == DT_Q8_0 ? 128 : t == DT_Q4_0 ? 8 : t == DT_Q5_0 ? 16 : 0;
}

/* Bytes of packed activations for num_tokens rows of n elements (0: no batched path). */
size_t gemm_act_bytes(enum dtype wtype, int64_t n, int num_tokens);

/* A packed-weight kernel set: matmul over weights repacked once, at load time, into the
 * set's strip layout (cpu_weight_pack), for any number of tokens.
 *   strip_rows[type]: rows per packed strip (0 = type not packed: per-token dots);
 *     work units are (strip, tile of tokens), strip-major (one token: strips).
 *   packed_bytes: bytes of the packed copy of an nrows x n matrix (0: not packed).
 *   pack_weight: packs strips [s0, s1) of the matrix at w (rows row_bytes apart) into
 *     dst (packed_bytes, 64-byte aligned; strips are independent, so threads can split).
 *   pack_act: packs tokens [t0, t1) of x[num_tokens][n] into act (gemm_act_bytes); the
 *     call with t1 == num_tokens also zeroes the last tile's padding tokens.
 *   run: y[t * y_stride + r] = sum_i W_r[i] x_t[i] for the units [u0, u1). Each output
 *     is computed the same way whatever the unit range and whatever num_tokens (one token
 *     included), so any split and any batch give bitwise equal results.
 * Called from pool threads on disjoint ranges; nothing is allocated. */
struct quant_gemm {
    unsigned char strip_rows[DT_COUNT_];
    size_t (*packed_bytes)(enum dtype wtype, int64_t n, int64_t nrows);
    void (*pack_weight)(enum dtype wtype, int64_t n, const void *w, size_t row_bytes, int64_t nrows,
                        int64_t s0, int64_t s1, void *dst);
    void (*pack_act)(enum dtype wtype, const float *x, int64_t n, int num_tokens, int t0, int t1,
                     void *act);
    void (*run)(enum dtype wtype, int64_t n, const void *packed, int64_t nrows, const void *act,
                int num_tokens, float *y, int64_t y_stride, long u0, long u1);
};

/* The AVX-512 (F/BW/VL/VBMI/VNNI) batched set (gemm_avx512.c); defined only in builds with
 * those extensions (GEMM_HAVE_AVX512). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VBMI__) && defined(__AVX512VNNI__) && defined(__F16C__) && defined(__FMA__)
#define GEMM_HAVE_AVX512 1
extern const struct quant_gemm quant_gemm_avx512; /* float, 32-block and K-quant types */
/* BF16 weights on vdpbf16ps (activations rounded to bf16, layout above): only where the
 * build has AVX512_BF16 and asks for it with -DTESSERA_BF16_DOT=1 (off by default: the
 * rounding of x exceeds the f32 tolerance of the float kernels, docs/cpu-kernels.md). */
#if defined(__AVX512BF16__) && defined(TESSERA_BF16_DOT) && TESSERA_BF16_DOT
#define GEMM_BF16_DOT 1
#endif
#endif

/* The AVX2 + FMA + F16C batched set (gemm_avx2.c; its own strip layout and tiles for 16
 * ymm registers, pure AVX2 integer path); defined in every build with those extensions
 * (GEMM_HAVE_AVX2), the packed set of x86-64-v3 builds. */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define GEMM_HAVE_AVX2 1
extern const struct quant_gemm quant_gemm_avx2; /* float, 32-block and K-quant types */
#endif

struct quant_impl {
    const char *name;                 /* "scalar", "avx2", "avx2+vnni" */
    quant_dot_fn dot[DT_COUNT_];      /* indexed by weight type; NULL = unsupported */
    quant_act_fn quantize;
    const struct quant_gemm *gemm;    /* packed-weight kernels, or NULL: per-token dots only */
};

/* The portable kernels (always compiled) and the best SIMD set (NULL when this build has
 * no AVX2+FMA+F16C; AVX-512 kernels for Q8_0/Q4_1/Q5_1 when it has F/BW/VL/VBMI/VNNI).
 * quant_impl_simd_list writes every SIMD set this build has (up to max; the AVX2 set
 * first; the one with batched kernels last) so tests can check each one.
 * quant_impl_best() is what cpu_matmul uses. All
 * return static tables. */
const struct quant_impl *quant_impl_scalar(void);
const struct quant_impl *quant_impl_simd(void);
int quant_impl_simd_list(const struct quant_impl **out, int max);
const struct quant_impl *quant_impl_best(void);

/* Activation format for a weight type: DT_F32 for float weights, else DT_Q8_0/1/K. */
enum dtype quant_act_type(enum dtype wtype);
/* Elements per activation scale block of act (32 or 256). */
int quant_act_block(enum dtype act);

/* Scalar helper shared by both kernel sets: unpacks the 6-bit scales and mins of a Q4_K
 * block (12 bytes) into sc[8], m[8]. */
void quant_q4k_scales(const uint8_t *packed, uint8_t sc[8], uint8_t m[8]);
/* Scalar helpers of the packed sets' weight packing: the 256 codes of one GGUF super-block
 * in element order. Q4_K: the 4-bit codes (element 64k + l, l < 32, is the low nibble of
 * qs[32k + l], 64k + 32 + l its high one). Q6_K: u = q + 32 (6 bits), as dequantization
 * reads them. */
void quant_q4k_codes(const uint8_t *blk, uint8_t u[256]);
void quant_q6k_codes(const uint8_t *blk, uint8_t u[256]);

/* cpu_matmul with an explicit kernel set (tests run the scalar set through the same
 * driver). Same contract as cpu_matmul. */
void cpu_matmul_impl(struct threadpool *tp, const struct quant_impl *impl,
                     const struct tensor *w, const float *x, float *y, int num_tokens,
                     void *scratch);

/* cpu_matmul_multi with an explicit kernel set. */
void cpu_matmul_multi_impl(struct threadpool *tp, const struct quant_impl *impl,
                           const struct tensor *const *ws, int nw, const float *x, float *const *ys,
                           int num_tokens, void *scratch);

/* cpu_weight_pack_bytes / cpu_weight_pack for an explicit kernel set's layout (0 bytes:
 * the set has none for w's type). */
size_t cpu_weight_pack_bytes_impl(const struct quant_impl *impl, const struct tensor *w);
void cpu_weight_pack_impl(struct threadpool *tp, const struct quant_impl *impl, const struct tensor *w,
                          void *dst);

/* Views of token t's quantized row inside scratch (layout above). */
struct qact quant_act_row(void *scratch, enum dtype act, int64_t n_in, int t);


/* Defines dot_NAME, the row-run entry of a kernel set, from its one-row kernel dot1_NAME:
 * out[r] = dot(row r of w, x) for r < nrows. Inlining dot1 into the loop lets a SIMD set
 * set up its constants once per run. */
#define QK_ROWS(NAME)                                                                      \
    static void dot_##NAME(int64_t n, const void *w, size_t row_bytes, int64_t nrows,      \
                           const struct qact *xq, const float *xf, float *out)             \
    {                                                                                      \
        for (int64_t r = 0; r < nrows; r++)                                                \
            out[r] = dot1_##NAME(n, (const uint8_t *)w + (size_t)r * row_bytes, xq, xf);   \
    }

/* The row-run entries of a whole kernel set (one dot1_<type> per storage type). */
#define QK_ROWS_ALL()                                                                      \
    QK_ROWS(f32) QK_ROWS(f16) QK_ROWS(bf16) QK_ROWS(q8_0) QK_ROWS(q4_0) QK_ROWS(q4_1)      \
    QK_ROWS(q5_0) QK_ROWS(q5_1) QK_ROWS(q4_k) QK_ROWS(q6_k)

#endif

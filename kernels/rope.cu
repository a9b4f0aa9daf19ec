/* rope.cu — RoPE fused with the paged KV-cache write (vLLM's rotary_embedding +
 * reshape_and_cache). Contract in kernels/rope.h; CPU twin cpu_rope_kv_write
 * (src/backend/cpu/ops_fused.c).
 *
 * Math, for token t and head h of the fused QKV row (bias added first when given):
 *   q, k heads: pairs (a, b) -> (a cos - b sin, a sin + b cos), angle positions[t] * inv_freq[i],
 *               cos and sin times mscale; NORMAL pairs (x[2i], x[2i+1]), NEOX (x[i], x[i+hd/2])
 *   q -> q_out (F32); k (rotated) and v -> pool slot slot_mapping[t] in the cache dtype.
 *
 * Parallelisation: one CTA of 128 threads per token (blockIdx.x), its q | k | v heads
 * optionally split over blockIdx.y when there are too few tokens to fill the GPU (decode).
 * head_dim / 8 threads cover one head, 8 elements each, as two float4: for NEOX elements
 * [4g, 4g+4) and [hd/2 + 4g, hd/2 + 4g + 4), for NORMAL [8g, 8g+8) — so in both layouts
 * thread g rotates with frequencies 4g .. 4g+3 only. It computes those four cos/sin once
 * and reuses them for every head it visits (the CTA's 128 / (head_dim/8) head lanes stride
 * over the heads), so the sincos cost is spread over the heads. All global accesses are
 * 16-byte loads / stores coalesced across a head's threads (cache stores are 8 bytes for
 * F16/BF16 and 4 for FP8 per float4). No shared memory, no barriers.
 *
 * Accuracy: positions reach 131071, where the f32 product pos * inv_freq is already off by
 * ~0.008 rad. The product is taken in double (exact for positions < 2^29), reduced by
 * k * pi/2 with a two-part pi/2 in double (error ~1e-16 rad), and only the reduced angle
 * |r| <= pi/4 goes to an f32 sin/cos polynomial; the quadrant k mod 4 swaps and negates.
 * cos/sin then agree with the CPU's (float)cos((double)pos * inv_freq) to 1 ulp at any
 * position below 2^17 (measured on the host over every position and frequency).
 */
#include "kernels/common.cuh"
#include "kernels/rowwise.cuh"

#include "kernels/rope.h"

#define ROPE_THREADS 128
/* Below this many CTAs (two per SM of a 132-SM H100/H200) the heads of a token are split
 * over blockIdx.y. */
#define ROPE_TARGET_CTAS 264

/* c, s = cos and sin of pos * inv_freq, times mscale. */
__device__ __forceinline__ void rope_cos_sin(int pos, float inv_freq, float mscale, float &c, float &s)
{
    const double a = (double)pos * (double)inv_freq;
    const double k = rint(a * 0x1.45f306dc9c883p-1); /* 2/pi */
    double r = fma(-k, 0x1.921fb54442d18p+0, a);      /* pi/2, high part */
    r = fma(-k, 0x1.1a62633145c07p-54, r);            /* pi/2, low part */
    /* |r| <= pi/4: Cephes' sinf/cosf polynomials (relative error ~3e-8); CUDA's sincosf
     * would carry its large-argument path (a local-memory table walk) for nothing */
    const float x = (float)r, z = x * x;
    const float sr = ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f) * z * x + x;
    const float cr = ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f) * z * z -
                     0.5f * z + 1.0f;
    const int q = (int)((long long)k & 3);
    /* cos(k pi/2 + r), sin(k pi/2 + r) for k mod 4 = 0, 1, 2, 3:
     * (cr, sr), (-sr, cr), (-cr, -sr), (sr, -cr) */
    const float c0 = (q & 1) ? sr : cr, s0 = (q & 1) ? cr : sr;
    c = (q == 1 || q == 2 ? -c0 : c0) * mscale;
    s = (q >= 2 ? -s0 : s0) * mscale;
}

__device__ __forceinline__ float4 ld4(const float *p) { return *reinterpret_cast<const float4 *>(p); }

__device__ __forceinline__ float4 add4(float4 a, float4 b)
{
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

/* Four consecutive elements into the pool at element index i. */
template <int KV> __device__ __forceinline__ void kv_put4(void *cache, int64_t i, float4 v, float scale)
{
    if constexpr (KV == KV_F32) ts_store4((float *)cache + i, v);
    else if constexpr (KV == KV_F16) ts_store4((__half *)cache + i, v);
    else if constexpr (KV == KV_BF16) ts_store4((__nv_bfloat16 *)cache + i, v);
    else ts_store4_e4m3((uint8_t *)cache + i, v, scale);
}

template <int KV, int LAYOUT>
__global__ void __launch_bounds__(ROPE_THREADS)
rope_kv_write_kernel(float *__restrict__ q_out,               // [num_tokens][n_heads][head_dim]
                     void *__restrict__ cache,                // [num_blocks][2][n_kv_heads][block_size][head_dim]
                     const float *__restrict__ qkv,           // [num_tokens][row_stride]
                     int64_t row_stride,
                     const float *__restrict__ bias,          // [(n_heads + 2*n_kv_heads)*head_dim] or NULL
                     const int32_t *__restrict__ positions,   // [num_tokens]
                     const int64_t *__restrict__ slot_mapping,// [num_tokens]
                     const float *__restrict__ inv_freq,      // [head_dim/2]
                     float mscale, int n_heads, int n_kv_heads, int head_dim, int block_size,
                     float k_scale, float v_scale, int heads_per_cta,
                     const void *l2_p, uint64_t l2_bytes)     // l2_hint.h: issued once the inputs are ready
{
    ts_pdl_begin();
    ts_l2_prefetch(l2_p, l2_bytes);
    const int tph = head_dim >> 3; /* threads per head */
    const int g = threadIdx.x % tph;
    const int lane_head = threadIdx.x / tph;
    const int head_lanes = blockDim.x / tph;
    if (lane_head >= head_lanes) return; /* the few threads 128 % tph leaves over */

    const int64_t t = blockIdx.x;
    const int n_rot = n_heads + n_kv_heads;
    const int h0 = blockIdx.y * heads_per_cta;
    const int h1 = min(h0 + heads_per_cta, n_rot + n_kv_heads);
    const int e0 = LAYOUT == ROPE_NEOX ? 4 * g : 8 * g;
    const int e1 = LAYOUT == ROPE_NEOX ? (head_dim >> 1) + 4 * g : 8 * g + 4;

    float c[4] = { 1.0f, 1.0f, 1.0f, 1.0f }, s[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
    if (h0 < n_rot) { /* this CTA rotates something */
        const int pos = positions[t];
        const float4 f = ld4(inv_freq + 4 * g);
        rope_cos_sin(pos, f.x, mscale, c[0], s[0]);
        rope_cos_sin(pos, f.y, mscale, c[1], s[1]);
        rope_cos_sin(pos, f.z, mscale, c[2], s[2]);
        rope_cos_sin(pos, f.w, mscale, c[3], s[3]);
    }
    const int64_t slot = slot_mapping[t];
    const int64_t blk = slot >= 0 ? slot / block_size : 0;
    const int64_t off = slot >= 0 ? slot - blk * block_size : 0;
    const float *row = qkv + t * row_stride;

    for (int h = h0 + lane_head; h < h1; h += head_lanes) {
        const int64_t col = (int64_t)h * head_dim;
        float4 a = ld4(row + col + e0), b = ld4(row + col + e1);
        if (bias) {
            a = add4(a, ld4(bias + col + e0));
            b = add4(b, ld4(bias + col + e1));
        }
        if (h < n_rot) {
            float4 ra, rb;
            if (LAYOUT == ROPE_NEOX) { /* pairs (a_j, b_j), frequency 4g + j */
                ra = make_float4(a.x * c[0] - b.x * s[0], a.y * c[1] - b.y * s[1], a.z * c[2] - b.z * s[2],
                                 a.w * c[3] - b.w * s[3]);
                rb = make_float4(a.x * s[0] + b.x * c[0], a.y * s[1] + b.y * c[1], a.z * s[2] + b.z * c[2],
                                 a.w * s[3] + b.w * c[3]);
            } else { /* pairs (a.x, a.y), (a.z, a.w), (b.x, b.y), (b.z, b.w): frequencies 4g .. 4g+3 */
                ra = make_float4(a.x * c[0] - a.y * s[0], a.x * s[0] + a.y * c[0], a.z * c[1] - a.w * s[1],
                                 a.z * s[1] + a.w * c[1]);
                rb = make_float4(b.x * c[2] - b.y * s[2], b.x * s[2] + b.y * c[2], b.z * c[3] - b.w * s[3],
                                 b.z * s[3] + b.w * c[3]);
            }
            a = ra;
            b = rb;
            if (h < n_heads) {
                float *qo = q_out + (t * n_heads + h) * (int64_t)head_dim;
                ts_store4(qo + e0, a);
                ts_store4(qo + e1, b);
                continue;
            }
        }
        if (slot < 0) continue; /* padding row: q only */
        const int which = h < n_rot ? 0 : 1;
        const int kh = h - (which ? n_rot : n_heads);
        const int64_t base = (((blk * 2 + which) * n_kv_heads + kh) * block_size + off) * head_dim;
        const float scale = which ? v_scale : k_scale;
        kv_put4<KV>(cache, base + e0, a, scale);
        kv_put4<KV>(cache, base + e1, b, scale);
    }
}

extern "C" int cuda_rope_kv_write(float *q_out, const struct kv_layer *kv, const float *qkv, int64_t row_stride,
                                  const float *qkv_bias, const int32_t *positions, const int64_t *slot_mapping,
                                  const float *inv_freq, float mscale, enum rope_layout layout, int num_tokens,
                                  int n_heads, const struct cuda_l2_hint *l2, int pdl, cudaStream_t stream)
{
    const void *l2_p;
    uint64_t l2_n;
    if (!kv || !q_out || !qkv || !positions || !slot_mapping || !inv_freq || num_tokens < 0 || n_heads < 0 ||
        !ts_l2_hint_args(l2, &l2_p, &l2_n))
        return (int)cudaErrorInvalidValue;
    const int hd = kv->head_dim, nkv = kv->n_kv_heads;
    if (hd < 8 || hd % 8 || hd > 8 * ROPE_THREADS || nkv < 1 || kv->block_size < 1 || !kv->data ||
        row_stride % 4 || row_stride < (int64_t)(n_heads + 2 * nkv) * hd)
        return (int)cudaErrorInvalidValue;
    if (!ts_aligned(q_out, 16) || !ts_aligned(qkv, 16) || !ts_aligned(inv_freq, 16) || !ts_aligned(kv->data, 16) ||
        (qkv_bias && !ts_aligned(qkv_bias, 16)))
        return (int)cudaErrorInvalidValue;
    if (num_tokens == 0) return 0;

    /* heads per CTA: a multiple of the CTA's head lanes, few enough that small batches
     * still launch ~ROPE_TARGET_CTAS CTAs */
    const int heads = n_heads + 2 * nkv;
    const int head_lanes = ROPE_THREADS / (hd / 8);
    const int rounds = (int)ts_div_up(heads, head_lanes);
    int split = (int)ts_div_up(ROPE_TARGET_CTAS, num_tokens);
    if (split > rounds) split = rounds;
    if (split < 1) split = 1;
    const int heads_per_cta = (int)ts_div_up(rounds, split) * head_lanes;
    const dim3 grid(num_tokens, ts_div_up(heads, heads_per_cta));

    void (*k)(float *, void *, const float *, int64_t, const float *, const int32_t *, const int64_t *,
              const float *, float, int, int, int, int, float, float, int, const void *, uint64_t) = nullptr;
#define ROPE_PICK(KVT)                                                                           \
    k = layout == ROPE_NEOX ? rope_kv_write_kernel<KVT, ROPE_NEOX> : rope_kv_write_kernel<KVT, ROPE_NORMAL>
    if (layout != ROPE_NEOX && layout != ROPE_NORMAL) return (int)cudaErrorInvalidValue;
    switch (kv->dtype) {
    case KV_F32: ROPE_PICK(KV_F32); break;
    case KV_F16: ROPE_PICK(KV_F16); break;
    case KV_BF16: ROPE_PICK(KV_BF16); break;
    case KV_FP8_E4M3: ROPE_PICK(KV_FP8_E4M3); break;
    default: return (int)cudaErrorInvalidValue;
    }
#undef ROPE_PICK
    TS_LAUNCH_PDL(k, grid, ROPE_THREADS, 0, stream, pdl, q_out, kv->data, qkv, row_stride, qkv_bias, positions,
                  slot_mapping, inv_freq, mscale, n_heads, nkv, hd, kv->block_size, kv->k_scale, kv->v_scale,
                  heads_per_cta, l2_p, l2_n);
    return TS_LAUNCH_RESULT();
}

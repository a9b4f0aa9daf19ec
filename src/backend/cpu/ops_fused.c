/* ops_fused.c — CPU twins of the fused row-wise CUDA kernels (contracts in ops_fused.h).
 *
 * Plain loops over the ops in ops.c: the F32 results are exactly what cpu_rmsnorm,
 * cpu_silu_mul, cpu_rope and cpu_kv_write give, then rounded once to the activation dtype.
 */
#include "backend/cpu/ops_fused.h"

#include "backend/cpu/ops.h"
#include "util/err.h"
#include "util/half.h"

#include <math.h>

/* One F32 value stored as element i of an out_dtype array (F32, F16 or BF16). */
static inline void store_act(void *out, enum dtype t, int64_t i, float v)
{
    if (t == DT_F32) ((float *)out)[i] = v;
    else if (t == DT_F16) ((uint16_t *)out)[i] = fp32_to_fp16(v);
    else ((uint16_t *)out)[i] = fp32_to_bf16(v);
}

static inline int act_dtype_ok(enum dtype t) { return t == DT_F32 || t == DT_F16 || t == DT_BF16; }

int cpu_rmsnorm_residual(void *out, enum dtype out_dtype, float *residual, const float *delta,
                         const float *w, int num_rows, int dim, float eps)
{
    if (!act_dtype_ok(out_dtype) || dim < 1) return ERR_INVALID;
    for (int r = 0; r < num_rows; r++) {
        float *x = residual + (int64_t)r * dim;
        if (delta) {
            const float *d = delta + (int64_t)r * dim;
            for (int i = 0; i < dim; i++) x[i] += d[i];
        }
        if (out_dtype == DT_F32) {
            cpu_rmsnorm((float *)out + (int64_t)r * dim, x, w, 1, dim, eps);
            continue;
        }
        /* cpu_rmsnorm's arithmetic, element by element, rounded to the 16-bit type */
        float ss = cpu_dot_f32(x, x, dim);
        float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int i = 0; i < dim; i++) store_act(out, out_dtype, (int64_t)r * dim + i, x[i] * inv * w[i]);
    }
    return 0;
}

int cpu_head_rmsnorm(float *qkv, int64_t row_stride, const float *q_norm, const float *k_norm,
                     int num_tokens, int n_heads, int n_kv_heads, int head_dim, float eps)
{
    if (head_dim < 1) return ERR_INVALID;
    for (int t = 0; t < num_tokens; t++) {
        float *q = qkv + (int64_t)t * row_stride;
        float *k = q + (int64_t)n_heads * head_dim;
        cpu_rmsnorm(q, q, q_norm, n_heads, head_dim, eps);
        cpu_rmsnorm(k, k, k_norm, n_kv_heads, head_dim, eps);
    }
    return 0;
}

/* dst[i] = src[i] (+ bias[i]) for i < n */
static void copy_bias(float *dst, const float *src, const float *bias, int64_t n)
{
    if (bias)
        for (int64_t i = 0; i < n; i++) dst[i] = src[i] + bias[i];
    else
        for (int64_t i = 0; i < n; i++) dst[i] = src[i];
}

int cpu_rope_kv_write(float *q_out, const struct kv_layer *kv, const float *qkv, int64_t row_stride,
                      const float *qkv_bias, const int32_t *positions, const int64_t *slot_mapping,
                      const float *inv_freq, float mscale, enum rope_layout layout, int num_tokens,
                      int n_heads)
{
    int hd = kv->head_dim, nkv = kv->n_kv_heads;
    int64_t qd = (int64_t)n_heads * hd, kvd = (int64_t)nkv * hd;
    if (hd < 2 || hd % 2 || hd > 1024 || kvd > ROPE_KV_ROW_MAX || kv_dtype_size(kv->dtype) == 0)
        return ERR_INVALID;
    float kb[ROPE_KV_ROW_MAX], vb[ROPE_KV_ROW_MAX];
    for (int t = 0; t < num_tokens; t++) {
        const float *row = qkv + (int64_t)t * row_stride;
        float *q = q_out + (int64_t)t * qd;
        copy_bias(q, row, qkv_bias, qd);
        copy_bias(kb, row + qd, qkv_bias ? qkv_bias + qd : NULL, kvd);
        copy_bias(vb, row + qd + kvd, qkv_bias ? qkv_bias + qd + kvd : NULL, kvd);
        cpu_rope(q, positions + t, 1, n_heads, hd, inv_freq, layout);
        cpu_rope(kb, positions + t, 1, nkv, hd, inv_freq, layout);
        if (mscale != 1.0f) {
            for (int64_t i = 0; i < qd; i++) q[i] *= mscale;
            for (int64_t i = 0; i < kvd; i++) kb[i] *= mscale;
        }
        cpu_kv_write(kv, kb, vb, slot_mapping + t, 1);
    }
    return 0;
}

int cpu_silu_mul_rows(void *out, enum dtype out_dtype, const float *gate, const float *up,
                      int64_t in_stride, int num_tokens, int ffn)
{
    if (!act_dtype_ok(out_dtype)) return ERR_INVALID;
    for (int t = 0; t < num_tokens; t++) {
        const float *g = gate + (int64_t)t * in_stride, *u = up + (int64_t)t * in_stride;
        if (out_dtype == DT_F32) {
            cpu_silu_mul((float *)out + (int64_t)t * ffn, g, u, ffn);
            continue;
        }
        /* cpu_silu_mul's arithmetic, rounded to the 16-bit type */
        for (int i = 0; i < ffn; i++)
            store_act(out, out_dtype, (int64_t)t * ffn + i, g[i] / (1.0f + expf(-g[i])) * u[i]);
    }
    return 0;
}

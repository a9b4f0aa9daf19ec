/* attention_ref.h — the previous per-row paged attention, kept as a reference for
 * test_ops and tool_bench_attention.
 *
 * For each (query row, head): one dot product per key (a horizontal sum per key), a
 * softmax over the whole context, then one axpy per V row, over the same arguments as
 * cpu_paged_attention. Its scratch is ref_paged_attention_scratch_floats(nth, max_ctx)
 * floats (one context-length score row per thread) passed in a->scratch.
 */
#ifndef TESSERA_TESTS_ATTENTION_REF_H
#define TESSERA_TESTS_ATTENTION_REF_H

#include "backend/cpu/ops.h"
#include "util/threadpool.h"

#include <math.h>
#include <string.h>

static inline size_t ref_paged_attention_scratch_floats(int n_threads, int max_ctx)
{
    return (size_t)(n_threads > 0 ? n_threads : 1) * (size_t)max_ctx;
}

static inline int64_t ref_kv_off(const struct kv_layer *kv, int64_t block, int which, int h)
{
    return ((block * 2 + which) * kv->n_kv_heads + h) * (int64_t)kv->block_size * kv->head_dim;
}

/* One query row and head: two passes over the context (scores, then weighted V sum). */
static inline void ref_attend_one(const struct paged_attention_args *a, int s, int t, int h, float *sc)
{
    const struct kv_layer *kv = a->kv;
    int hd = kv->head_dim, bs = kv->block_size;
    int kvh = h / (a->n_heads / kv->n_kv_heads);
    int q_end = a->query_start[s + 1];
    int ctx = a->seq_lens[s] - (q_end - t) + 1;
    const int32_t *bt = a->block_tables + (int64_t)s * a->max_blocks_per_seq;
    const float *q = a->q + ((int64_t)t * a->n_heads + h) * hd;
    float *out = a->out + ((int64_t)t * a->n_heads + h) * hd;
    int f16 = kv->dtype == KV_F16, bf16 = kv->dtype == KV_BF16, fp8 = kv->dtype == KV_FP8_E4M3;

    float max = -INFINITY;
    for (int p0 = 0; p0 < ctx; p0 += bs) {
        int64_t base = ref_kv_off(kv, bt[p0 / bs], 0, kvh);
        int n = ctx - p0 < bs ? ctx - p0 : bs;
        for (int j = 0; j < n; j++) {
            float d;
            if (fp8)
                d = kv->k_scale * cpu_dot_fp8(q, (const uint8_t *)kv->data + base + (int64_t)j * hd, hd);
            else if (f16)
                d = cpu_dot_f16(q, (const uint16_t *)kv->data + base + (int64_t)j * hd, hd);
            else if (bf16)
                d = cpu_dot_bf16(q, (const uint16_t *)kv->data + base + (int64_t)j * hd, hd);
            else
                d = cpu_dot_f32(q, (const float *)kv->data + base + (int64_t)j * hd, hd);
            d *= a->scale;
            sc[p0 + j] = d;
            if (d > max) max = d;
        }
    }
    float sum = 0.0f;
    for (int p = 0; p < ctx; p++) {
        sc[p] = expf(sc[p] - max);
        sum += sc[p];
    }
    float inv = 1.0f / sum;
    memset(out, 0, sizeof(float) * hd);
    for (int p0 = 0; p0 < ctx; p0 += bs) {
        int64_t base = ref_kv_off(kv, bt[p0 / bs], 1, kvh);
        int n = ctx - p0 < bs ? ctx - p0 : bs;
        for (int j = 0; j < n; j++) {
            float w = sc[p0 + j] * inv;
            if (fp8) cpu_axpy_fp8(out, w * kv->v_scale, (const uint8_t *)kv->data + base + (int64_t)j * hd, hd);
            else if (f16) cpu_axpy_f16(out, w, (const uint16_t *)kv->data + base + (int64_t)j * hd, hd);
            else if (bf16) cpu_axpy_bf16(out, w, (const uint16_t *)kv->data + base + (int64_t)j * hd, hd);
            else cpu_axpy_f32(out, w, (const float *)kv->data + base + (int64_t)j * hd, hd);
        }
    }
}

static inline void ref_attention_worker(void *arg, int ith, int nth)
{
    const struct paged_attention_args *a = arg;
    long begin, end;
    tp_split((long)a->num_tokens * a->n_heads, ith, nth, &begin, &end);
    float *sc = a->scratch + (size_t)ith * a->max_ctx;
    int s = 0;
    for (long w = begin; w < end; w++) {
        int t = (int)(w / a->n_heads), h = (int)(w % a->n_heads);
        while (t >= a->query_start[s + 1]) s++; /* rows are in sequence order */
        ref_attend_one(a, s, t, h, sc);
    }
}

/* The same contract as cpu_paged_attention; tp may be NULL. */
static inline void ref_paged_attention(struct threadpool *tp, const struct paged_attention_args *a)
{
    if (a->num_tokens <= 0) return;
    if (tp) tp_run(tp, ref_attention_worker, (void *)a);
    else ref_attention_worker((void *)a, 0, 1);
}

#endif

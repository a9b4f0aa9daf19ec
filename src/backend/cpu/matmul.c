/* matmul.c — cpu_matmul: y[t][o] = sum_i W[o][i] * x[t][i] over stored weight types.
 *
 * Steps:
 *  1. Quantized weights: quantize every activation row once into the caller's scratch
 *     (Q8_0 / Q8_1 / Q8_K, see quant_kernels.h). Small inputs (decode) are quantized by
 *     the calling thread — a few hundred ns, less than waking the pool; large ones
 *     (prefill) are split across the pool by (token, activation block).
 *  2. Each thread takes one contiguous range of output rows (tp_split), so it streams a
 *     contiguous stretch of the weight matrix and the hardware prefetcher sees one
 *     sequential stream per thread. Within the range rows go in tiles of ~TILE_BYTES of
 *     weights; for each tile all tokens are processed before the next tile, so with
 *     num_tokens > 1 every weight byte comes from DRAM once per call and is reused from
 *     L1/L2 for the other tokens. With many tokens and fewer rows than threads, the
 *     split is by tokens instead.
 *  3. Per (row, token) one dot kernel call (quant_dot_*.c) — F32 accumulation.
 * Matrices packed at load time (cpu_weight_pack) go instead through the kernel set's
 * packed-weight kernels for every number of tokens (gemm_*.c): activations packed in
 * token tiles, work split by (strip of rows, token tile).
 * Nothing is allocated; the threads write disjoint parts of y.
 */
#include "backend/cpu/quant.h"
#include "backend/cpu/quant_kernels.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

/* Weight bytes per tile: half of a 32-48 KB L1d, so the tile and one activation row stay
 * in L1 while the tokens loop over it. */
#define TILE_BYTES (16 * 1024)
/* Quantize x on the calling thread below this many elements (pool wake-up ~1-2 us). */
#define QUANT_PARALLEL_MIN (32 * 1024)

#define MM_MULTI_MAX 4

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Bytes of one quantized activation row (q, d, s / bsums), 64-byte aligned. */
static size_t act_row_bytes(enum dtype act, int64_t n)
{
    if (act == DT_F32) return 0;
    int qa = quant_act_block(act);
    size_t qb = act == DT_Q8_1 ? (size_t)Q81_QBYTES(n) : (size_t)n;
    size_t b = align64(qb) + align64((size_t)(n / qa) * sizeof(float) * (act == DT_Q8_1 ? 2 : 1));
    if (act == DT_Q8_K) b += align64((size_t)(n / 16) * sizeof(int16_t));
    return b;
}

static uint8_t *scratch_base(void *scratch) { return (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63); }

struct qact quant_act_row(void *scratch, enum dtype act, int64_t n, int t)
{
    struct qact a = { 0 };
    int qa = quant_act_block(act);
    uint8_t *p = scratch_base(scratch) + (size_t)t * act_row_bytes(act, n);
    a.q = (int8_t *)p;
    p += align64(act == DT_Q8_1 ? (size_t)Q81_QBYTES(n) : (size_t)n);
    if (act == DT_Q8_1) {
        a.ds = (float *)p;
        return a;
    }
    a.d = (float *)p;
    p += align64((size_t)(n / qa) * sizeof(float));
    if (act == DT_Q8_K) a.bsums = (int16_t *)p;
    return a;
}

size_t gemm_act_bytes(enum dtype wtype, int64_t n, int num_tokens)
{
    size_t tiles = (size_t)((num_tokens + GEMM_TILE - 1) / GEMM_TILE);
    switch (gemm_kind_of(wtype)) {
    case GEMM_OFFSET: case GEMM_MIN: case GEMM_KMIN: return tiles * (size_t)(n / 32) * GEMM_QACT_BLOCK;
    case GEMM_K16: return tiles * (size_t)(n / 32) * GEMM_QACT16_BLOCK;
    case GEMM_FLOAT: return tiles * (size_t)n * GEMM_TILE * sizeof(float);
    default: return 0;
    }
}

size_t cpu_matmul_scratch_size(enum dtype type, int64_t n_in, int max_tokens)
{
    enum dtype act = quant_act_type(type);
    size_t per_token = act == DT_F32 ? 0 : (size_t)(max_tokens > 0 ? max_tokens : 1) * act_row_bytes(act, n_in);
    size_t batched = gemm_act_bytes(type, n_in, max_tokens > 0 ? max_tokens : 1);
    return 64 + (per_token > batched ? per_token : batched);
}

struct mm_job {
    const struct quant_impl *impl;
    quant_dot_fn dot;
    enum dtype act;
    const uint8_t *w;     /* [n_out][row_bytes] */
    size_t row_bytes;
    int64_t n_in, n_out;
    int num_tokens;
    const float *x;       /* [num_tokens][n_in] */
    float *y;             /* [num_tokens][n_out] */
    void *scratch;
};

static void mm_quantize_range(const struct mm_job *j, int64_t begin, int64_t end)
{
    int64_t nb = j->n_in / quant_act_block(j->act);
    for (int64_t k = begin; k < end;) {
        int t = (int)(k / nb);
        int64_t b0 = k % nb, b1 = nb;
        if (b1 - b0 > end - k) b1 = b0 + (end - k);
        struct qact a = quant_act_row(j->scratch, j->act, j->n_in, t);
        j->impl->quantize(j->act, j->x + (size_t)t * (size_t)j->n_in, b0, b1, &a);
        k += b1 - b0;
    }
}

static void mm_quantize_task(void *arg, int ith, int nth)
{
    const struct mm_job *j = arg;
    long begin, end;
    long total = (long)j->num_tokens * (long)(j->n_in / quant_act_block(j->act));
    tp_split(total, ith, nth, &begin, &end);
    mm_quantize_range(j, begin, end);
}

/* rows [r0, r1) x tokens [t0, t1), tile by tile */
static void mm_block(const struct mm_job *j, int64_t r0, int64_t r1, int t0, int t1)
{
    int64_t tile = (int64_t)(TILE_BYTES / j->row_bytes);
    if (tile < 1) tile = 1;
    if (t1 - t0 == 1) tile = r1 - r0; /* decode: nothing to reuse, one pass */
    for (int64_t a = r0; a < r1; a += tile) {
        int64_t b = a + tile < r1 ? a + tile : r1;
        for (int t = t0; t < t1; t++) {
            struct qact xq = { 0 };
            const float *xf = j->x + (size_t)t * (size_t)j->n_in;
            if (j->act != DT_F32) xq = quant_act_row(j->scratch, j->act, j->n_in, t);
            float *yt = j->y + (size_t)t * (size_t)j->n_out;
            j->dot(j->n_in, j->w + (size_t)a * j->row_bytes, j->row_bytes, b - a, &xq, xf, yt + a);
        }
    }
}

static void mm_task(void *arg, int ith, int nth)
{
    const struct mm_job *j = arg;
    long begin, end;
    if (j->n_out < 4L * nth && j->num_tokens >= 2L * nth) {
        tp_split(j->num_tokens, ith, nth, &begin, &end);
        mm_block(j, 0, j->n_out, (int)begin, (int)end);
    } else {
        tp_split((long)j->n_out, ith, nth, &begin, &end);
        if (begin < end) mm_block(j, begin, end, 0, j->num_tokens);
    }
}

/* ---- packed weights: packed activations, register-tiled kernels (gemm_*.c) ---- */

/* What precedes the packed bytes: the layout's owner and the matrix it was made from. */
struct pack_header {
    const struct quant_gemm *gemm;
    enum dtype type;
    int64_t n_in, n_out;
};
#define PACK_HEADER_BYTES 64

size_t cpu_weight_pack_bytes_impl(const struct quant_impl *impl, const struct tensor *w)
{
    if (!impl->gemm || w->n_dims > 2 || !impl->gemm->strip_rows[w->type]) return 0;
    size_t b = impl->gemm->packed_bytes(w->type, w->ne[0], w->ne[1]);
    return b ? PACK_HEADER_BYTES + b : 0;
}

struct pack_job {
    const struct quant_gemm *g;
    const struct tensor *w;
    void *dst;
};

static void pack_task(void *arg, int ith, int nth)
{
    const struct pack_job *p = arg;
    const struct tensor *w = p->w;
    const int strip = p->g->strip_rows[w->type];
    long s0, s1;
    tp_split((long)((w->ne[1] + strip - 1) / strip), ith, nth, &s0, &s1);
    if (s0 < s1)
        p->g->pack_weight(w->type, w->ne[0], w->data, dtype_row_bytes(w->type, w->ne[0]), w->ne[1], s0, s1,
                          (uint8_t *)p->dst + PACK_HEADER_BYTES);
}

void cpu_weight_pack_impl(struct threadpool *tp, const struct quant_impl *impl, const struct tensor *w, void *dst)
{
    assert(cpu_weight_pack_bytes_impl(impl, w) > 0 && ((uintptr_t)dst & 63) == 0);
    struct pack_header h = { .gemm = impl->gemm, .type = w->type, .n_in = w->ne[0], .n_out = w->ne[1] };
    memcpy(dst, &h, sizeof h);
    struct pack_job p = { .g = impl->gemm, .w = w, .dst = dst };
    tp_run(tp, pack_task, &p);
}

size_t cpu_weight_pack_bytes(const struct tensor *w) { return cpu_weight_pack_bytes_impl(quant_impl_best(), w); }

void cpu_weight_pack(struct threadpool *tp, const struct tensor *w, void *dst)
{
    cpu_weight_pack_impl(tp, quant_impl_best(), w, dst);
}

/* The packed bytes of w for impl's kernels, or NULL (not packed, or packed for another
 * set's layout). */
static const uint8_t *packed_for(const struct quant_impl *impl, const struct tensor *w)
{
    const struct pack_header *h = w->cpu_packed;
    if (!h || !impl->gemm || h->gemm != impl->gemm) return NULL;
    assert(h->type == w->type && h->n_in == w->ne[0] && h->n_out == w->ne[1]);
    return (const uint8_t *)w->cpu_packed + PACK_HEADER_BYTES;
}

struct gemm_w {
    const uint8_t *w;     /* packed */
    int64_t n_out;
    float *y;             /* [num_tokens][n_out] */
    long units;           /* strips * token tiles */
};

struct gemm_job {
    const struct quant_gemm *g;
    enum dtype type;      /* of every weight (one activation packing serves all) */
    int64_t n_in;
    int num_tokens;
    const float *x;       /* [num_tokens][n_in] */
    void *act;            /* packed activations (scratch) */
    struct gemm_w ws[MM_MULTI_MAX];
    int nw;
    long total_units;
};


static void gemm_pack_task(void *arg, int ith, int nth)
{
    const struct gemm_job *g = arg;
    long begin, end;
    tp_split(g->num_tokens, ith, nth, &begin, &end);
    if (begin < end || ith == nth - 1)
        g->g->pack_act(g->type, g->x, g->n_in, g->num_tokens, (int)begin, (int)end, g->act);
}

/* The weights' units (strip, token tile), concatenated, split into one contiguous range
 * per thread: shares differ by at most one unit on every shape. */
static void gemm_task(void *arg, int ith, int nth)
{
    const struct gemm_job *g = arg;
    long begin, end, base = 0;
    tp_split(g->total_units, ith, nth, &begin, &end);
    for (int k = 0; k < g->nw && base < end; k++) {
        const struct gemm_w *gw = &g->ws[k];
        long u0 = begin > base ? begin : base, u1 = end < base + gw->units ? end : base + gw->units;
        if (u0 < u1)
            g->g->run(g->type, g->n_in, gw->w, gw->n_out, g->act, g->num_tokens, gw->y, gw->n_out, u0 - base,
                      u1 - base);
        base += gw->units;
    }
}

/* Runs the packed path for nw weights of one type over one input (caller checked that
 * all are packed for impl, with equal n_in). */
static void gemm_matmul(struct threadpool *tp, const struct quant_impl *impl, const struct tensor *const *ws,
                        int nw, const float *x, float *const *ys, int num_tokens, void *scratch)
{
    struct gemm_job g = {
        .g = impl->gemm,
        .type = ws[0]->type,
        .n_in = ws[0]->ne[0],
        .num_tokens = num_tokens,
        .x = x,
        .act = scratch_base(scratch),
        .nw = nw,
    };
    assert(scratch);
    long tiles = (num_tokens + GEMM_TILE - 1) / GEMM_TILE;
    int strip = impl->gemm->strip_rows[g.type];
    for (int k = 0; k < nw; k++) {
        struct gemm_w *gw = &g.ws[k];
        gw->w = packed_for(impl, ws[k]);
        gw->n_out = ws[k]->ne[1];
        gw->y = ys[k];
        gw->units = (long)((gw->n_out + strip - 1) / strip) * tiles;
        g.total_units += gw->units;
    }
    if ((int64_t)num_tokens * g.n_in < QUANT_PARALLEL_MIN || tp_size(tp) == 1)
        g.g->pack_act(g.type, x, g.n_in, num_tokens, 0, num_tokens, g.act);
    else
        tp_run(tp, gemm_pack_task, &g);
    tp_run(tp, gemm_task, &g);
}

void cpu_matmul_impl(struct threadpool *tp, const struct quant_impl *impl,
                     const struct tensor *w, const float *x, float *y, int num_tokens,
                     void *scratch)
{
    if (packed_for(impl, w) && num_tokens > 0 && w->ne[1] > 0) {
        gemm_matmul(tp, impl, &w, 1, x, &y, num_tokens, scratch);
        return;
    }

    struct mm_job j = {
        .impl = impl,
        .dot = impl->dot[w->type],
        .act = quant_act_type(w->type),
        .w = w->data,
        .n_in = w->ne[0],
        .n_out = w->ne[1],
        .num_tokens = num_tokens,
        .x = x,
        .y = y,
        .scratch = scratch,
    };
    assert(j.dot && "unsupported weight type");
    j.row_bytes = dtype_row_bytes(w->type, j.n_in);
    assert(j.row_bytes > 0 && "n_in must be a multiple of the block size");
    if (num_tokens <= 0 || j.n_out <= 0) return;
    if (j.act != DT_F32) {
        assert(scratch);
        int64_t total = (int64_t)num_tokens * j.n_in;
        if (total < QUANT_PARALLEL_MIN || tp_size(tp) == 1)
            mm_quantize_range(&j, 0, (int64_t)num_tokens * (j.n_in / quant_act_block(j.act)));
        else
            tp_run(tp, mm_quantize_task, &j);
    }
    tp_run(tp, mm_task, &j);
}

/* ---- several weights over one input: one quantization, one dispatch ---- */

struct mm_multi_job {
    struct mm_job j[MM_MULTI_MAX];
    int nw;
    int64_t total_rows;
};

/* The weights' rows, concatenated, are split into one contiguous range per share; a
 * range may span two weights. Each output is still one kernel call over its whole row,
 * so the results do not depend on the split. */
static void mm_multi_task(void *arg, int ith, int nth)
{
    const struct mm_multi_job *m = arg;
    long begin, end;
    tp_split((long)m->total_rows, ith, nth, &begin, &end);
    int64_t base = 0;
    for (int k = 0; k < m->nw && base < end; k++) {
        const struct mm_job *j = &m->j[k];
        int64_t r0 = begin > base ? begin : base, r1 = end < base + j->n_out ? end : base + j->n_out;
        if (r0 < r1) mm_block(j, r0 - base, r1 - base, 0, j->num_tokens);
        base += j->n_out;
    }
}

void cpu_matmul_multi_impl(struct threadpool *tp, const struct quant_impl *impl,
                           const struct tensor *const *ws, int nw, const float *x, float *const *ys,
                           int num_tokens, void *scratch)
{
    int same = nw >= 1 && nw <= MM_MULTI_MAX;
    for (int k = 1; same && k < nw; k++)
        same = ws[k]->ne[0] == ws[0]->ne[0] && quant_act_type(ws[k]->type) == quant_act_type(ws[0]->type);
    if (!same) { /* different inputs formats: one call each */
        for (int k = 0; k < nw; k++) cpu_matmul_impl(tp, impl, ws[k], x, ys[k], num_tokens, scratch);
        return;
    }
    int packed = 0;
    for (int k = 0; k < nw; k++) packed += packed_for(impl, ws[k]) != NULL;
    if (packed && num_tokens > 0) {
        int one_type = packed == nw;
        for (int k = 1; k < nw; k++) one_type = one_type && ws[k]->type == ws[0]->type && ws[k]->ne[1] > 0;
        if (one_type && ws[0]->ne[1] > 0) gemm_matmul(tp, impl, ws, nw, x, ys, num_tokens, scratch);
        else
            for (int k = 0; k < nw; k++) cpu_matmul_impl(tp, impl, ws[k], x, ys[k], num_tokens, scratch);
        return;
    }
    struct mm_multi_job m = { .nw = nw };
    for (int k = 0; k < nw; k++) {
        struct mm_job *j = &m.j[k];
        *j = (struct mm_job){
            .impl = impl,
            .dot = impl->dot[ws[k]->type],
            .act = quant_act_type(ws[k]->type),
            .w = ws[k]->data,
            .n_in = ws[k]->ne[0],
            .n_out = ws[k]->ne[1],
            .num_tokens = num_tokens,
            .x = x,
            .y = ys[k],
            .scratch = scratch,
        };
        assert(j->dot && "unsupported weight type");
        j->row_bytes = dtype_row_bytes(ws[k]->type, j->n_in);
        assert(j->row_bytes > 0 && "n_in must be a multiple of the block size");
        m.total_rows += j->n_out;
    }
    if (num_tokens <= 0 || m.total_rows <= 0) return;
    /* many tokens over few rows: the per-weight calls split by tokens instead */
    if (m.total_rows < 4L * tp_size(tp) && num_tokens >= 2 * tp_size(tp)) {
        for (int k = 0; k < nw; k++) cpu_matmul_impl(tp, impl, ws[k], x, ys[k], num_tokens, scratch);
        return;
    }
    const struct mm_job *j0 = &m.j[0];
    if (j0->act != DT_F32) {
        assert(scratch);
        int64_t total = (int64_t)num_tokens * j0->n_in;
        if (total < QUANT_PARALLEL_MIN || tp_size(tp) == 1)
            mm_quantize_range(j0, 0, (int64_t)num_tokens * (j0->n_in / quant_act_block(j0->act)));
        else
            tp_run(tp, mm_quantize_task, (void *)j0);
    }
    tp_run(tp, mm_multi_task, &m);
}

void cpu_matmul_multi(struct threadpool *tp, const struct tensor *const *ws, int nw, const float *x,
                      float *const *ys, int num_tokens, void *scratch)
{
    cpu_matmul_multi_impl(tp, quant_impl_best(), ws, nw, x, ys, num_tokens, scratch);
}

void cpu_matmul(struct threadpool *tp, const struct tensor *w, const float *x, float *y,
                int num_tokens, void *scratch)
{
    cpu_matmul_impl(tp, quant_impl_best(), w, x, y, num_tokens, scratch);
}

void cpu_matmul_ref(const struct tensor *w, const float *x, float *y, int num_tokens)
{
    int64_t n_in = w->ne[0], n_out = w->ne[1];
    size_t rb = dtype_row_bytes(w->type, n_in);
    assert(rb > 0);
    float *row = malloc((size_t)n_in * sizeof *row);
    assert(row && "cpu_matmul_ref is a test twin; allocation failure is fatal");
    for (int64_t o = 0; o < n_out; o++) {
        quant_dequant_row(w->type, (const uint8_t *)w->data + (size_t)o * rb, row, n_in);
        for (int t = 0; t < num_tokens; t++) {
            const float *xt = x + (size_t)t * (size_t)n_in;
            double s = 0.0;
            for (int64_t i = 0; i < n_in; i++) s += (double)row[i] * (double)xt[i];
            y[(size_t)t * (size_t)n_out + (size_t)o] = (float)s;
        }
    }
    free(row);
}

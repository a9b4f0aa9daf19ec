/* weights_convert.c — see weights_convert.h. Two passes over the model's matrix slots: one
 * sizes the converted copies (one allocation for all), one fills them, row ranges split
 * over a thread pool, and re-points every slot that held the source view. */
#include "model/weights_convert.h"
#include "backend/cpu/quant.h"

#include "util/bigalloc.h"
#include "util/err.h"
#include "util/half.h"
#include "util/mapfile.h"
#include "util/threadpool.h"

#include <time.h>
#include <stdlib.h>
#include <string.h>

#define Q8_0_BLOCK 32
#define Q8_0_BYTES 34

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

int quant_row_q8_0(const float *x, int64_t n, uint8_t *out)
{
    int bad = 0;
    for (int64_t b = 0; b < n / Q8_0_BLOCK; b++, x += Q8_0_BLOCK, out += Q8_0_BYTES) {
        /* max |x| on the bit patterns: for |x| (sign cleared) unsigned order is float
         * order, and an integer max vectorizes where a float one may not (NaN rules);
         * anything at or above the infinity pattern is NaN or infinite */
        uint32_t amax_bits = 0;
        for (int j = 0; j < Q8_0_BLOCK; j++) {
            uint32_t u;
            memcpy(&u, &x[j], 4);
            u &= 0x7fffffffu;
            amax_bits = u > amax_bits ? u : amax_bits;
        }
        if (amax_bits >= 0x7f800000u) {
            bad = 1;
            memset(out, 0, Q8_0_BYTES);
            continue;
        }
        const float d = fp32_from_bits(amax_bits) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t d16 = fp32_to_fp16(d);
        memcpy(out, &d16, 2);
        int8_t *q = (int8_t *)(out + 2);
        for (int j = 0; j < Q8_0_BLOCK; j++) {
            /* roundf (half away from zero), in a form that vectorizes: |v| <= 127 up to the
             * rounding of id, so the int conversion truncates exactly, v - t is exact, and
             * comparing it with +-0.5 decides the rounding exactly; the result is within
             * [-127, 127] */
            const float v = x[j] * id;
            const int32_t t = (int32_t)v;
            const float frac = v - (float)t;
            q[j] = (int8_t)(t + (frac >= 0.5f) - (frac <= -0.5f));
        }
    }
    return bad ? -1 : 0;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static bool is_float_type(enum dtype t) { return t == DT_F32 || t == DT_F16 || t == DT_BF16; }

/* A matrix of type t is converted to `to` when it is a float type other than `to`. */
static bool converts(enum dtype t, enum dtype to) { return is_float_type(t) && t != to; }

/* n F32 values into one row of `to` at out. Returns -1 when a value is not finite or
 * (F16) beyond the type's range. */
static int convert_row(enum dtype to, const float *x, int64_t n, uint8_t *out)
{
    if (to == DT_Q8_0) return quant_row_q8_0(x, n, out);
    uint16_t *h = (uint16_t *)out;
    uint16_t all = 0; /* exponent bits of every result: all ones means inf or NaN */
    const uint16_t exp_mask = to == DT_F16 ? 0x7c00u : 0x7f80u;
    for (int64_t i = 0; i < n; i++) {
        h[i] = to == DT_F16 ? fp32_to_fp16(x[i]) : fp32_to_bf16(x[i]);
        all |= (uint16_t)((h[i] & exp_mask) == exp_mask);
    }
    return all ? -1 : 0;
}

/* Row r of a float matrix t as F32 into row[t->ne[0]]. */
static void read_row(const struct tensor *t, int64_t r, float *row)
{
    const int64_t n = t->ne[0];
    const char *src = (const char *)t->data + (size_t)r * dtype_row_bytes(t->type, n);
    if (t->type == DT_F32) {
        memcpy(row, src, sizeof(float) * (size_t)n);
        return;
    }
    const uint16_t *h = (const uint16_t *)src;
    for (int64_t i = 0; i < n; i++) row[i] = t->type == DT_F16 ? fp16_to_fp32(h[i]) : bf16_to_fp32(h[i]);
}

struct convert_job {
    const struct tensor *src;
    enum dtype to;
    uint8_t *dst;
    int64_t *bad_row; /* [threads]: each thread's first row that could not be converted, or -1 */
    int no_memory;    /* a thread could not get its row buffer */
};

static void convert_task(void *arg, int ith, int nth)
{
    struct convert_job *j = arg;
    const struct tensor *t = j->src;
    const int64_t n = t->ne[0];
    const size_t row_bytes = dtype_row_bytes(j->to, n);
    long r0, r1;
    tp_split((long)t->ne[1], ith, nth, &r0, &r1);
    j->bad_row[ith] = -1;
    if (r0 >= r1) return;
    float *row = malloc(sizeof(float) * (size_t)n);
    if (!row) {
        j->no_memory = 1; /* each thread writes the same value */
        return;
    }
    for (long r = r0; r < r1; r++) {
        read_row(t, r, row);
        if (convert_row(j->to, row, n, j->dst + (size_t)r * row_bytes) && j->bad_row[ith] < 0) j->bad_row[ith] = r;
    }
    free(row);
}

/* Points every slot of w that holds `from` at `to` (a tied head and the embedding are one
 * view in two slots). */
static void repoint(struct model_weights *w, const struct tensor *from, const struct tensor *to)
{
    for (int i = 0; i < weights_n_slots(w); i++)
        if (*weights_slot(w, i) == from) *weights_slot(w, i) = to;
}

/* True if slot i holds the same view as an earlier slot (so it is converted once). */
static bool seen_before(struct model_weights *w, int i)
{
    for (int k = 0; k < i; k++)
        if (*weights_slot(w, k) == *weights_slot(w, i)) return true;
    return false;
}

/* The option that asked for `to`, for messages. */
static const char *option_of(enum dtype to)
{
    return to == DT_Q8_0 ? "--quantization q8_0" : to == DT_F16 ? "--dtype float16" : "--dtype bfloat16";
}

int weights_convert(struct converted_weights **out, struct model_weights *w, enum dtype to, char *err, size_t errlen)
{
    *out = NULL;
    if (to != DT_Q8_0 && to != DT_F16 && to != DT_BF16)
        return err_set(err, errlen, ERR_INVALID, "converting weights to %s is not supported", dtype_name(to));
    const double t0 = now_s();
    const int n_slots = weights_n_slots(w);
    size_t names_len = 0;
    struct converted_weights *cw = calloc(1, sizeof *cw);
    if (!cw) return err_set(err, errlen, ERR_NOMEM, "converting the weights: out of memory");
    cw->to = to;
    for (int i = 0; i < n_slots; i++) { /* sizes, and shapes checked before anything changes */
        const struct tensor *t = *weights_slot(w, i);
        if (seen_before(w, i)) continue;
        if (!converts(t->type, to)) {
            cw->n_kept++;
            continue;
        }
        if (t->ne[0] % dtype_block_elems(to)) {
            converted_weights_free(cw);
            return err_set(err, errlen, ERR_INVALID, "%s: tensor '%s' has rows of %lld values, not a multiple of %d",
                           option_of(to), t->name, (long long)t->ne[0], dtype_block_elems(to));
        }
        cw->bytes += align64(dtype_row_bytes(to, t->ne[0]) * (size_t)t->ne[1]);
        cw->bytes_before += t->nbytes;
        cw->n_converted++;
        names_len += strlen(t->name) + 1;
    }
    if (cw->n_converted == 0) {
        *out = cw;
        return 0;
    }
    cw->views = calloc((size_t)cw->n_converted, sizeof *cw->views);
    cw->names = malloc(names_len);
    cw->data = big_alloc(cw->bytes);
    struct threadpool *tp = tp_create(0);
    struct convert_job job = { .to = to };
    if (tp) job.bad_row = calloc((size_t)tp_size(tp), sizeof *job.bad_row);
    if (!cw->views || !cw->names || !cw->data || !job.bad_row) {
        double mib = (double)cw->bytes / 1048576.0;
        tp_free(tp);
        converted_weights_free(cw);
        return err_set(err, errlen, ERR_NOMEM, "converting the weights: cannot allocate %.1f MiB", mib);
    }

    /* convert into the new views first; re-point the slots only once all succeeded */
    int rc = 0, k = 0;
    size_t off = 0, name_off = 0;
    for (int i = 0; i < n_slots && !rc; i++) {
        const struct tensor *t = *weights_slot(w, i);
        if (seen_before(w, i) || !converts(t->type, to)) continue;
        job.src = t;
        job.dst = (uint8_t *)cw->data + off;
        tp_run(tp, convert_task, &job);
        if (job.no_memory) rc = err_set(err, errlen, ERR_NOMEM, "converting the weights: out of memory");
        for (int th = 0; th < tp_size(tp) && !rc; th++)
            if (job.bad_row[th] >= 0)
                rc = err_set(err, errlen, ERR_INVALID, "%s: tensor '%s' row %lld holds a value that is not finite%s",
                             option_of(to), t->name, (long long)job.bad_row[th],
                             to == DT_F16 ? " or beyond float16's range (65504)" : " (NaN or infinity)");
        struct tensor *v = &cw->views[k++];
        *v = *t;
        v->type = to;
        v->data = job.dst;
        v->nbytes = dtype_row_bytes(to, t->ne[0]) * (size_t)t->ne[1];
        v->cpu_packed = NULL;
        v->name = strcpy(cw->names + name_off, t->name);
        /* the source's file pages go back now, not after the last matrix, so the peak is
         * one matrix above the converted size; should a later matrix fail, reads of this one
         * fault its bytes back unchanged (map_release) */
        for (int m = 0; m < w->n_maps && !rc; m++) cw->released += map_release(w->maps[m], t->data, t->nbytes);
        name_off += strlen(t->name) + 1;
        off += align64(v->nbytes);
    }
    tp_free(tp);
    free(job.bad_row);
    if (rc) {
        converted_weights_free(cw);
        return rc;
    }
    k = 0;
    for (int i = 0; i < n_slots; i++) {
        const struct tensor *t = *weights_slot(w, i);
        if (seen_before(w, i) || !converts(t->type, to)) continue;
        repoint(w, t, &cw->views[k++]);
    }
    w->matrix_bytes = 0;
    for (int i = 0; i < n_slots; i++)
        if (!seen_before(w, i)) w->matrix_bytes += (*weights_slot(w, i))->nbytes;
    cw->seconds = now_s() - t0;
    *out = cw;
    return 0;
}

void converted_weights_free(struct converted_weights *c)
{
    if (!c) return;
    big_free(c->data, c->bytes);
    free(c->names);
    free(c->views);
    free(c);
}

size_t converted_weights_release_packed(struct converted_weights *c, const struct tensor *keep)
{
    size_t released = 0;
    for (int i = 0; c && c->data && i < c->n_converted; i++) {
        const struct tensor *v = &c->views[i];
        if ((keep && v->data == keep->data) || cpu_weight_pack_bytes(v) == 0) continue;
        released += big_release(c->bytes, v->data, v->nbytes);
    }
    return released;
}

size_t converted_weights_release(struct converted_weights *c)
{
    if (!c || !c->data) return 0;
    const size_t bytes = c->bytes;
    big_free(c->data, c->bytes);
    c->data = NULL;
    for (int i = 0; i < c->n_converted; i++) c->views[i].data = NULL;
    return bytes;
}

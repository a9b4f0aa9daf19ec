/* weights_pack.c — see weights_pack.h. Two passes over the model's matrices: one sizes
 * every packed copy (one allocation for all), one packs them. */
#include "model/weights_pack.h"

#include "backend/cpu/quant.h"
#include "util/err.h"

#include <stdlib.h>
#include <string.h>

#define MATS_PER_LAYER 7

/* The matrix slots of a layer, in a fixed order. */
static const struct tensor **layer_slot(struct layer_weights *L, int i)
{
    const struct tensor **s[MATS_PER_LAYER] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down };
    return s[i];
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Calls visit on every matrix slot of p->w (the output head last). */
static void for_each_slot(struct packed_weights *p, void (*visit)(struct packed_weights *, const struct tensor **, void *),
                          void *arg)
{
    for (int l = 0; l < p->w.n_layers; l++)
        for (int i = 0; i < MATS_PER_LAYER; i++) visit(p, layer_slot(&p->layers[l], i), arg);
    visit(p, &p->w.output, arg);
}

static void count_slot(struct packed_weights *p, const struct tensor **slot, void *arg)
{
    (void)arg;
    size_t b = cpu_weight_pack_bytes(*slot);
    if (!b) return;
    p->bytes += align64(b);
    p->n_packed++;
}

struct pack_pass {
    struct threadpool *tp;
    size_t off;
    int next;
};

static void pack_slot(struct packed_weights *p, const struct tensor **slot, void *arg)
{
    struct pack_pass *pp = arg;
    size_t b = cpu_weight_pack_bytes(*slot);
    if (!b) return;
    uint8_t *dst = (uint8_t *)p->data + pp->off;
    cpu_weight_pack(pp->tp, *slot, dst);
    struct tensor *v = &p->views[pp->next++];
    *v = **slot;
    v->cpu_packed = dst;
    *slot = v;
    pp->off += align64(b);
}

int packed_weights_create(struct packed_weights **out, const struct model_weights *src, struct threadpool *tp,
                          char *err, size_t errlen)
{
    *out = NULL;
    struct packed_weights *p = calloc(1, sizeof *p);
    if (!p) return err_set(err, errlen, ERR_NOMEM, "packing the weights: out of memory");
    p->w = *src;
    p->layers = malloc(sizeof *p->layers * (size_t)(src->n_layers > 0 ? src->n_layers : 1));
    if (!p->layers) goto nomem;
    memcpy(p->layers, src->layers, sizeof *p->layers * (size_t)src->n_layers);
    p->w.layers = p->layers;
    for_each_slot(p, count_slot, NULL);
    if (p->n_packed > 0) {
        p->views = calloc((size_t)p->n_packed, sizeof *p->views);
        p->data = aligned_alloc(64, p->bytes); /* bytes: a sum of multiples of 64 */
        if (!p->views || !p->data) {
            double mib = (double)p->bytes / 1048576.0;
            packed_weights_free(p);
            return err_set(err, errlen, ERR_NOMEM, "packing the weights: cannot allocate %.1f MiB", mib);
        }
        struct pack_pass pp = { .tp = tp };
        for_each_slot(p, pack_slot, &pp);
    }
    *out = p;
    return 0;
nomem:
    packed_weights_free(p);
    return err_set(err, errlen, ERR_NOMEM, "packing the weights: out of memory");
}

void packed_weights_free(struct packed_weights *p)
{
    if (!p) return;
    free(p->data);
    free(p->views);
    free(p->layers);
    free(p);
}

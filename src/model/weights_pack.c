/* weights_pack.c — see weights_pack.h. Two passes over the model's matrices: one sizes
 * every packed copy (one allocation for all), one packs them and gives the file pages
 * of each packed matrix back to the kernel. */
#include "model/weights_pack.h"

#include "backend/cpu/quant.h"
#include "util/bigalloc.h"
#include "util/err.h"
#include "util/mapfile.h"

#include <stdlib.h>
#include <string.h>

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Calls visit on every matrix slot of p->w but the token embedding (the lookup reads
 * single rows; a tied head is packed through the output slot, and the lookup keeps
 * reading the embedding's own view). */
static void for_each_slot(struct packed_weights *p, void (*visit)(struct packed_weights *, const struct tensor **, void *),
                          void *arg)
{
    const int n = weights_n_slots(&p->w) - 1; /* the embedding is the last slot */
    for (int i = 0; i < n; i++) visit(p, weights_slot(&p->w, i), arg);
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

/* Drops t's file pages from the process once its packed copy is made, so the weights
 * are not resident twice (RSS ~ 2x the model otherwise). Only ranges inside one of the
 * loader's read-only mappings are released (map_release checks); a matrix in allocated
 * memory (dummy weights) is left alone. Nothing relies on the pages staying resident
 * (nothing mlocks or registers them): whatever still reads the original bytes faults
 * them back from the page cache, unchanged. Readers after packing are the embedding
 * lookup when the output head is tied (only the rows of the tokens seen come back), a
 * second forward state packing the same model, a kernel set without this packed layout,
 * and the CUDA backend's upload. */
static void release_source(struct packed_weights *p, const struct tensor *t)
{
    for (int i = 0; i < p->w.n_maps; i++) p->released += map_release(p->w.maps[i], t->data, t->nbytes);
}

static void pack_slot(struct packed_weights *p, const struct tensor **slot, void *arg)
{
    struct pack_pass *pp = arg;
    size_t b = cpu_weight_pack_bytes(*slot);
    if (!b) return;
    uint8_t *dst = (uint8_t *)p->data + pp->off;
    cpu_weight_pack(pp->tp, *slot, dst); /* returns when every thread is done reading */
    release_source(p, *slot);
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
        p->data = big_alloc(p->bytes); /* 2 MiB pages where the system gives them (bigalloc.h) */
        if (!p->views || !p->data) {
            double mib = (double)p->bytes / 1048576.0;
            packed_weights_free(p);
            return err_set(err, errlen, ERR_NOMEM, "packing the weights: cannot allocate %.1f MiB", mib);
        }
        struct pack_pass pp = { .tp = tp };
        for_each_slot(p, pack_slot, &pp);
        /* Reading a matrix whose pages were released (a second forward state packing the
         * same model) faults them back, and Linux may map the whole page-cache folio
         * around a fault at once (up to 2 MiB with large folios; measured on a 6.18
         * kernel: one fault just past a released range mapped 128 of its pages back),
         * reaching into the matrix released just before it. Every source is released
         * once more now that nothing is read after it (already counted in p->released). */
        for (int i = 0; i < p->n_packed; i++)
            for (int k = 0; k < p->w.n_maps; k++) map_release(p->w.maps[k], p->views[i].data, p->views[i].nbytes);
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
    big_free(p->data, p->bytes);
    free(p->views);
    free(p->layers);
    free(p);
}

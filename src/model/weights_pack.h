/* weights_pack.h — a model's matrices repacked once, at load time, for the CPU's
 * packed-weight kernels (backend/cpu/quant.h, cpu_weight_pack).
 *
 * struct packed_weights holds a struct model_weights that the forward reads in place of
 * the loader's: every matrix the kernels have a packed layout for is an owned copy of its
 * view with .cpu_packed set (its .data still the mapped bytes); the rest (norms, biases,
 * the embedding table's rows, matrices of a type without a packed layout) are the
 * loader's, borrowed. With tied embeddings the output head is packed and the embedding
 * lookup keeps reading the file.
 * Once a matrix is packed, its pages in the loader's file mappings (model_weights.maps)
 * are handed back to the kernel (map_release), so a model is not resident twice; its
 * .data stays valid, and a read of it faults the bytes back from the page cache.
 * The source weights must outlive the packed ones.
 */
#ifndef TESSERA_MODEL_WEIGHTS_PACK_H
#define TESSERA_MODEL_WEIGHTS_PACK_H

#include "model/weights.h"
#include "util/threadpool.h"

#include <stddef.h>

struct packed_weights {
    struct model_weights w;       /* the view the forward reads */
    struct layer_weights *layers; /* owned [n_layers] (w.layers) */
    struct tensor *views;         /* owned: the packed matrices' views */
    void *data;                   /* owned: the packed bytes of every matrix, 64-byte aligned */
    size_t bytes;                 /* of data (0: nothing packed, this build or these types) */
    int n_packed;                 /* matrices packed */
    size_t released;              /* bytes of file pages handed back after packing */
};

/* Packs every matrix of src that has a packed layout, splitting the work over tp, and
 * releases each one's file pages in src->maps. Errors: ERR_NOMEM (message says how
 * much). Called once per forward state, at start-up. */
int packed_weights_create(struct packed_weights **out, const struct model_weights *src, struct threadpool *tp,
                          char *err, size_t errlen);
void packed_weights_free(struct packed_weights *p);

#endif

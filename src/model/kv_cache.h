/* kv_cache.h — the paged KV cache: one pool per layer of fixed-size blocks.
 *
 * Layer pool layout (see backend/cpu/ops.h):
 *   [num_blocks][2 (k, v)][n_kv_heads][block_size][head_dim] of kv_dtype
 * Block b of every layer belongs to the same owner; which sequence owns which block is
 * the block manager's business (engine), not the cache's: the forward only follows the
 * batch's slot_mapping and block_tables. The memory is allocated once at create.
 *
 * struct kv_seq is a trivial allocator for ONE sequence at a time (CLI, tests): blocks
 * are handed out sequentially from a caller-chosen range. The engine's block manager
 * (free list, refcounts, prefix cache) replaces it.
 */
#ifndef TESSERA_MODEL_KV_CACHE_H
#define TESSERA_MODEL_KV_CACHE_H

#include "model/config.h"
#include "util/kv_dtype.h"

#include <stddef.h>
#include <stdint.h>

struct kv_cache {
    enum kv_dtype dtype;
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int block_size;
    int num_blocks;
    size_t layer_bytes;  /* bytes of one layer's pool */
    void *data;          /* [n_layers][num_blocks][2][n_kv_heads][block_size][head_dim] */
    float *k_scale;      /* [n_layers] FP8: stored code * k_scale = value; 1.0 at create
                          * (a caller may set calibrated scales before the first write,
                          * never after: codes already stored would be misread). Unused
                          * by F32/F16/BF16. */
    float *v_scale;      /* [n_layers] */
};

/* Bytes one block costs across all layers (for sizing the pool from a memory budget). */
size_t kv_cache_block_bytes(const struct model_config *cfg, int block_size, enum kv_dtype dtype);

/* Allocates a zeroed cache of F32, F16, BF16 or FP8 e4m3 elements (FP8 scales all 1.0).
 * block_size <= 0 means KV_DEFAULT_BLOCK_SIZE. Caller frees with kv_cache_free. */
int kv_cache_create(struct kv_cache **out, const struct model_config *cfg, int num_blocks,
                    int block_size, enum kv_dtype dtype, char *err, size_t errlen);
void kv_cache_free(struct kv_cache *kv);

/* View of layer l's pool for the ops. */
struct kv_layer kv_cache_layer(const struct kv_cache *kv, int l);

/* ---- trivial single-sequence block allocation ---------------------------------------- */

struct kv_seq {
    int32_t *block_table; /* [max_blocks] physical ids: first_block, first_block + 1, ... */
    int max_blocks;
    int len;              /* tokens stored (or scheduled) so far */
};

/* Reserves blocks [first_block, first_block + max_blocks) of kv for one sequence. */
int kv_seq_init(struct kv_seq *s, const struct kv_cache *kv, int first_block, int max_blocks,
                char *err, size_t errlen);
void kv_seq_free(struct kv_seq *s);
/* Writes the slots of the next n tokens (positions len .. len+n-1) to slots[n], their
 * positions to positions[n] (may be NULL) and advances len. ERR_RANGE if they would not
 * fit. */
int kv_seq_append(struct kv_seq *s, int block_size, int n, int64_t *slots, int32_t *positions,
                  char *err, size_t errlen);

#endif

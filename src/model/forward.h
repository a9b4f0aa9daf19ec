/* forward.h — the CPU forward pass over a varlen batch with a paged KV cache.
 *
 * One forward for every supported architecture (llama, qwen2, qwen3): differences are
 * flags in struct model_config. struct forward_state preallocates every activation
 * buffer for up to max_tokens rows per step (and max_logits logits rows), so
 * model_forward never allocates. The state is single-threaded: one caller (the
 * scheduler / CLI thread) at a time; the work inside runs on its thread pool.
 */
#ifndef TESSERA_MODEL_FORWARD_H
#define TESSERA_MODEL_FORWARD_H

#include "model/batch.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/weights.h"
#include "model/weights_pack.h"
#include "util/threadpool.h"

#include <stddef.h>

struct forward_opts {
    int max_tokens;          /* rows per step (prefill chunk + decode tokens) */
    int max_logits;          /* logits rows per step; <= 0 means max_tokens */
    int max_ctx;             /* longest sequence (seq_lens bound); <= 0 means cfg max_seq_len */
    int n_threads;           /* pool size when tp is NULL; <= 0 means all CPUs */
    struct threadpool *tp;   /* borrowed pool, or NULL to create one */
};

struct forward_state {
    const struct model_config *cfg; /* borrowed */
    const struct model_weights *w;  /* &packed->w, or the caller's weights when nothing is packed */
    struct packed_weights *packed;  /* owned: the matrices repacked for the CPU kernels */
    struct threadpool *tp;
    int own_tp;
    int max_tokens, max_logits, max_ctx;
    float *inv_freq;  /* (head_dim / 2,) RoPE frequencies after scaling */
    float *rope_cs, *rope_sn; /* (max_tokens, head_dim / 2) one step's RoPE cos / sin */
    float *x;         /* (max_tokens, dim) residual stream */
    float *xb;        /* (max_tokens, dim) normed input / projection output */
    float *q;         /* (max_tokens, n_heads * head_dim) */
    float *k;         /* (max_tokens, n_kv_heads * head_dim) */
    float *v;         /* (max_tokens, n_kv_heads * head_dim) */
    float *att;       /* (max_tokens, n_heads * head_dim) attention output */
    float *hb;        /* (max_tokens, ffn_dim) gate, then silu(gate) * up */
    float *hb2;       /* (max_tokens, ffn_dim) up */
    float *xl;        /* (max_logits, dim) final-normed rows that need logits */
    float *logits;    /* (max_logits, vocab_size) output of the last model_forward */
    void *mm_scratch; /* cpu_matmul scratch, sized for the largest weight */
    float *att_scratch; /* cpu_paged_attention scratch */
};

/* Builds the state: repacks the matrices for the CPU kernels (model/weights_pack.h),
 * computes RoPE frequencies and allocates every buffer. cfg and w are borrowed and must
 * outlive the state. */
int forward_create(struct forward_state **out, const struct model_config *cfg,
                   const struct model_weights *w, const struct forward_opts *opts, char *err,
                   size_t errlen);
void forward_free(struct forward_state *fs);

/* Runs one step: embeds b->token_ids, writes every layer's new K/V into kv at
 * b->slot_mapping, attends through b->block_tables, and writes the logits of rows
 * b->logits_indices[i] to fs->logits[i][0 .. vocab). Checks the batch invariants of
 * batch.h and the state's limits first (ERR_INVALID / ERR_RANGE, nothing computed).
 * Does not allocate. */
int model_forward(struct forward_state *fs, struct kv_cache *kv, const struct batch *b, char *err,
                  size_t errlen);

#endif

/* backend.h — the one interface between the engine and a compute backend (CPU, CUDA).
 *
 * A backend owns the model's weights in its memory, the paged KV cache, every buffer a
 * forward step needs, and sampling. The engine owns everything else and stays
 * backend-independent: the scheduler decides which tokens run in a step and where their
 * K/V go (struct batch: slot_mapping, block_tables — model/batch.h), the block manager
 * and prefix cache own the block ids, and each sequence's struct sampler (params, penalty
 * history, logit bias, step counter) lives with the sequence.
 *
 * Life cycle:
 *   backend_create(model, config)  loads the weights into the backend's memory and sizes
 *                                  the KV cache from the memory budget (CUDA: after a
 *                                  profiling step at the step's maximum size, as vLLM does)
 *                                  → backend_get_info()->num_blocks
 *   backend_submit(batch, samples) starts one step: the forward of every row (K/V written
 *                                  at slot_mapping) and, for logits row i, sampling with
 *                                  samples[i]
 *   backend_wait(out)              waits for the step submitted last and writes one
 *                                  struct backend_token per logits row
 *   backend_free()
 * backend_step() is submit + wait. At most one step is in flight: submit, wait, submit,
 * wait, … The CPU backend computes inside submit; the CUDA backend returns from submit
 * with the step queued on the GPU, so the caller can prepare the next step (and stream the
 * previous one's text) while the GPU works (overlapped scheduling).
 *
 * One-step lag: a batch may name a token it does not know yet. token_ids[r] ==
 * BACKEND_TOKEN_PREV(k) (a negative value) stands for the token sampled for logits row k
 * of the step submitted just before this one (the CUDA backend keeps those on the device,
 * so a decode step can be queued before the previous step's tokens reach the host). The
 * previous step must have completed sampling for row k without error; the caller records
 * the real token (sampler_accept, its own token list) when backend_wait of that step
 * returns it. Samplers are read, never advanced, by the backend: the engine calls
 * sampler_accept with each token it keeps.
 *
 * Errors: functions return 0 or a negative ERR_* code with the detail in err. A per-row
 * sampling failure (nothing samplable: all -inf/NaN after the bias) is not an error of
 * the step: that row's backend_token.status says so and the other rows are fine. A failed
 * step (ERR_IO for a device fault, ERR_NOMEM) leaves the backend unusable: the engine
 * fails every live request and reports unhealthy.
 *
 * Threading: a backend is used by one thread at a time (the scheduler thread, or a CLI's
 * thread). backend_get_info's result is immutable after create and may be read by any
 * thread.
 */
#ifndef TESSERA_BACKEND_BACKEND_H
#define TESSERA_BACKEND_BACKEND_H

#include "model/batch.h"
#include "sampler/sampler.h"
#include "util/kv_dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct model;
struct backend;

enum backend_device {
    BACKEND_DEVICE_AUTO = 0, /* the GPU when one is usable, else the CPU (with a log line why) */
    BACKEND_DEVICE_CPU = 1,
    BACKEND_DEVICE_CUDA = 2,
};

/* "auto", "cpu", "cuda" -> 0 and *out; ERR_INVALID otherwise. */
int backend_device_parse(const char *s, enum backend_device *out);
const char *backend_device_name(enum backend_device d);

struct backend_config {
    enum backend_device device;
    int device_index;              /* CUDA: which visible GPU (CUDA_VISIBLE_DEVICES applies); the
                                      first of tensor_parallel_size consecutive ones */
    int tensor_parallel_size;      /* CUDA: GPUs the model is split over (NCCL); <= 0: 1 */
    int max_num_seqs;              /* sequences (= logits rows) per step */
    int max_num_batched_tokens;    /* rows per step */
    int max_model_len;             /* longest sequence (prompt + generation) */
    int block_size;                /* tokens per KV block; <= 0: KV_DEFAULT_BLOCK_SIZE */
    bool kv_dtype_auto;            /* the backend picks (CPU: f16; CUDA: the model's bf16/f16) */
    enum kv_dtype kv_dtype;        /* used when !kv_dtype_auto */
    int num_blocks;                /* > 0: exactly this many KV blocks; 0: size from the budget */
    size_t cpu_kv_bytes;           /* CPU: KV budget in bytes when num_blocks == 0 */
    double gpu_memory_utilization; /* CUDA: fraction of device memory for weights, activations,
                                      graphs and KV cache (vLLM's meaning), (0, 1] */
    int n_threads;                 /* CPU forward pool; <= 0: all CPUs */
    bool enforce_eager;            /* CUDA: no CUDA graphs */
};

/* Defaults: auto device, one GPU, 256 seqs, 2048 batched tokens, max_model_len 0 (= the model's),
 * block size 16, auto KV dtype, budget 1 GiB CPU / 0.9 GPU, all CPU threads, graphs on. */
void backend_config_default(struct backend_config *c);

/* What backend_create decided. */
struct backend_info {
    char name[16];          /* "cpu" or "cuda" */
    char device[160];       /* e.g. "2 threads" or "NVIDIA H200, cc 9.0, 139.8 GiB" */
    char fallback[256];     /* device auto picked the CPU: why the GPU was not used; else "" */
    enum kv_dtype kv_dtype;
    int block_size;
    int num_blocks;         /* KV capacity */
    size_t weight_bytes;    /* bytes of weights in the backend's memory */
    size_t kv_bytes;        /* bytes of the KV cache */
    size_t activation_bytes;/* CUDA: measured peak of the profiling step; CPU: step buffers */
    int max_concurrency;    /* num_blocks * block_size / max_model_len: max_model_len sequences
                               that fit at once */
    bool graphs;            /* CUDA graphs captured for decode steps */
};

/* Stands for "the token sampled for logits row k of the previous step" in
 * batch.token_ids (k >= 0). */
#define BACKEND_TOKEN_PREV(k) (-1 - (int32_t)(k))

/* How to sample one logits row. */
struct backend_sample {
    struct sampler *sampler; /* the sequence's sampler (params, history, bias, step); borrowed
                                until backend_wait returns; the backend may use its scratch
                                but does not record the token */
    int n_logprobs;          /* -1: none; 0..SAMPLER_MAX_TOP_LOGPROBS: the sampled token's raw
                                logprob plus that many top alternatives (sampler_logprobs) */
    const uint32_t *mask;    /* NULL, or the tokens allowed next (constrained decoding, grammar/
                                grammar.h): [grammar_mask_words(vocab)] words, bit id%32 of
                                word id/32 set = allowed; borrowed until backend_wait returns.
                                Applied as sampler_sample_masked does */
    bool score;              /* a scoring row (prompt logprobs): nothing is sampled; the row's
                                token is score_token, with its raw logprob and n_logprobs
                                (< 0: 0) top alternatives, as sampler_logprobs gives them.
                                The sampler (still given) and the mask are not consulted:
                                no params, penalties or bias apply; score_token outside
                                [0, vocab) fails the row (status ERR_INVALID) */
    int32_t score_token;
    uint32_t ahead;          /* speculative rows (engine/speculative.h): draw as the sampler
                                would after the `ahead` tokens prior[0, ahead) (the proposed
                                tokens before this row) were accepted: the random bits of
                                step sampler_step + ahead, those tokens counted for the
                                penalties (sampler_sample_ahead, sampler_history_ahead).
                                Consecutive rows may then share one sampler: the backend
                                samples them one after another, never at once. 0 otherwise */
    const int32_t *prior;    /* [ahead] (<= SAMPLER_MAX_AHEAD), borrowed until backend_wait
                                returns; NULL when ahead is 0 */
};

/* One sampled token. Layout and meaning as kernels/sampling.h's struct sampling_output. */
struct backend_token {
    int32_t token;          /* sampled id; -1 when status != 0 */
    int32_t status;         /* 0, or a negative ERR_* (ERR_RANGE: nothing samplable;
                               ERR_INVALID: a scoring row's score_token out of range) */
    float logprob;          /* raw logprob of token (when asked) */
    int32_t n_top;          /* entries in top_* (0 when not asked) */
    int32_t rank;           /* scoring rows (status 0): the number of ids whose raw logit is >=
                               the token's, the token included (vLLM's rank: 1 = the most
                               likely; NaN logits never count); 0 for sampled rows */
    int32_t top_ids[SAMPLER_MAX_TOP_LOGPROBS];      /* most likely first */
    float top_logprobs[SAMPLER_MAX_TOP_LOGPROBS];
};

/* Creates the backend for model m (borrowed; must outlive the backend) on cfg->device.
 * Validates cfg (ERR_INVALID / ERR_RANGE naming the option), loads the weights, sizes the
 * KV cache; ERR_NOMEM with what is missing and which option to change when not even one
 * max_model_len sequence fits. With BACKEND_DEVICE_AUTO and no usable GPU, falls back to
 * the CPU and says why in info.fallback. */
int backend_create(struct backend **out, const struct model *m, const struct backend_config *cfg,
                   char *err, size_t errlen);
void backend_free(struct backend *b);

const struct backend_info *backend_get_info(const struct backend *b);

/* Starts one step over batch (borrowed until backend_wait returns; model/batch.h
 * invariants; num_tokens <= max_num_batched_tokens, num_logits <= max_num_seqs) with
 * samples[0, batch->num_logits). ERR_INVALID for a batch that breaks the invariants
 * (nothing computed), ERR_BUSY when a step is already in flight. */
int backend_submit(struct backend *b, const struct batch *batch, const struct backend_sample *samples,
                   char *err, size_t errlen);

/* Waits for the step in flight and writes out[0, num_logits) of it. ERR_INVALID when no
 * step is in flight. */
int backend_wait(struct backend *b, struct backend_token *out, char *err, size_t errlen);

/* backend_submit + backend_wait. */
int backend_step(struct backend *b, const struct batch *batch, const struct backend_sample *samples,
                 struct backend_token *out, char *err, size_t errlen);

/* The forward only, for tests and `tessera logits`: runs batch and points *logits at its
 * num_logits x vocab_size raw logits in host memory (valid until the next call; the CUDA
 * backend copies them off the device only here). No step may be in flight. */
int backend_logits(struct backend *b, const struct batch *batch, const float **logits, char *err,
                   size_t errlen);

#ifdef __cplusplus
}
#endif

#endif

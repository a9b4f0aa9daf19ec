/* scheduler.h — the continuous-batching step loop (ARCHITECTURE.md "Scheduler", "Batch").
 *
 * struct sched owns everything one engine needs to run many sequences at once: the
 * compute backend (backend.h: weights, KV cache, forward, sampling — CPU or CUDA), the
 * block manager and the per-sequence state. Each sched_step builds ONE flat batch that
 * mixes the decode tokens of running sequences with prefill chunks, hands it to the
 * backend with each logits row's sampler, and reports the sampled tokens through a
 * callback. The scheduler knows nothing of a backend but backend.h.
 *
 * Policy (vLLM V1 style, one token budget per step):
 *   - running sequences first, oldest first: each gets its remaining uncomputed tokens
 *     (1 when decoding; a prefill chunk when chunked prefill is on);
 *   - out of KV blocks for a running sequence → preempt the NEWEST running sequence:
 *     release its blocks, put it back at the FRONT of the waiting queue; it is recomputed
 *     (prompt + tokens generated so far) when readmitted. No admission in a step that
 *     preempted;
 *   - then waiting sequences FCFS while seats (max_num_seqs), the token budget and blocks
 *     allow; the first that does not fit stops admission (no overtaking);
 *   - with the PRIORITY policy (vLLM's --scheduling-policy priority) both lists are kept
 *     ordered by (priority, arrival), lower values first: the waiting queue admits in
 *     that order, a preempted sequence goes back to its place in it (not the front),
 *     running sequences are planned in that order and the victim of a preemption is the
 *     last one — the lowest priority, the newest among equals. A waiting sequence never
 *     preempts a running one (as in vLLM V1). Cached prefix
 *     blocks are taken from the prefix cache and not recomputed; when every token is
 *     cached (a block-aligned context), only the last one is forwarded, for its logits,
 *     with slot -1 (its KV stays in the shared block). A sequence's sampler
 *     (about 24 bytes per vocabulary entry) is created at its first admission, kept
 *     through preemption (its history and step must survive the recompute) and freed when
 *     it finishes: a queued sequence holds none. A constrained sequence's grammar matcher
 *     (grammar/grammar.h) lives exactly as long as its sampler.
 *
 * Constrained decoding (sched_seq_params.grammar): every logits row of a constrained
 * sequence carries a token mask (backend_sample.mask) filled from its matcher right
 * before the step is submitted — after the previous step's tokens are recorded, so with
 * overlap the mask already covers the token the row's input names BACKEND_TOKEN_PREV.
 * Each kept token advances the matcher (gm_accept); a token the grammar refuses (a
 * backend that ignored the mask) ends the sequence with FINISH_ERROR. The grammar also
 * decides the end: once it is complete only end-of-generation tokens are allowed, and a
 * constrained sequence ends at that token even with ignore_eos (the grammar has nothing
 * more to emit). A deferred grammar (grammar_deferred: a reasoning model thinks first)
 * applies from the token after grammar_start_token; before that the rows carry no mask.
 * The mask rows ([2][max_num_seqs][grammar_mask_words(vocab_size)]) are allocated at
 * sched_create.
 *
 * Overlapped scheduling (sched_config.overlap): sched_step plans step N+1 while step N
 * runs on the backend, waits for N, records N's tokens (each sequence's token list and
 * sampler), submits N+1, and only then reports N's tokens through the callback — so the
 * caller's detokenizing, stop strings and notifications run while N+1 computes. A decode
 * row whose token is N's output names it BACKEND_TOKEN_PREV(k). The lag is invisible in
 * the results: a sequence that finished at N (end of generation, a failed row, an
 * abort or a stop string found by the caller) may already be in N+1; its extra token is
 * discarded, never reported, and its blocks are freed when N+1 has completed. Outputs
 * are byte-identical with overlap on and off (tests/c/test_scheduler.c).
 *
 * Speculative decoding (sched_config.spec, engine/speculative.h): a decoding sequence whose
 * context ends with an n-gram seen earlier gets the tokens that followed it as extra rows of
 * its step, each with its own logits row, sampled as a decode step would sample it (row i
 * draws with the random bits of step + i: backend_sample.ahead). The sampled tokens are kept
 * up to and including the first that differs from the proposal (or ends the sequence); the
 * slots of the rows after it are given back (bm_seq_truncate) and their KV, never
 * committed, is overwritten later. Outputs are those of one token per step: each row's
 * penalties count the proposed tokens before it (backend_sample.prior) and its mask is the
 * one they lead to (grammar state, min_tokens, bad words). A sequence is proposed for
 * only when its grammar (if deferred) has started, no request waits for a seat, not more
 * sequences run than spec.disable_by_batch_size (when set), and with logits rows, tokens,
 * KV blocks and max_tokens to spare (a proposal never preempts). Rows are not free (on the
 * CPU a step's cost grows with them), so each sequence's proposals adapt to what it keeps: after a proposal kept whole the next may be
 * twice as long (up to num_tokens), otherwise one longer than what was kept; after k
 * proposals in a row of which nothing was kept, none for the next 2^k - 1 steps (at most
 * 31). The proposal needs the sequence's last token, so speculation runs
 * without overlap (as vLLM first did): sched_create resolves overlap to OFF.
 *
 * Invariants: every RUNNING sequence's num_computed equals its block-manager num_tokens
 * (the slots of every planned or running step are appended when it is planned); the KV
 * of [0, num_done) is written and committed to the prefix cache; a WAITING sequence
 * holds no blocks; a FINISHED / ABORTED sequence is off both lists and is freed as soon
 * as no step in flight refers to it.
 *
 * Memory: per-step arrays (two sets: the step in flight and the one being planned) are
 * allocated at sched_create; per-sequence state at sched_add; the sampler at first
 * admission. sched_step allocates nothing else.
 * Threading: NOT thread-safe. One thread (the scheduler thread) makes every call.
 */
#ifndef TESSERA_ENGINE_SCHEDULER_H
#define TESSERA_ENGINE_SCHEDULER_H

#include "backend/backend.h"
#include "engine/block_manager.h"
#include "engine/speculative.h"
#include "sampler/sampler.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct model;
struct sched;
struct grammar;
struct grammar_matcher;

/* Overlapped scheduling (see above). AUTO: on when the backend runs asynchronously
 * (backend_get_info()->name is "cuda"); the CPU backend computes inside submit, so there
 * the overlap only costs a step of lag — tests force it ON to prove the lag correct. */
enum sched_overlap { SCHED_OVERLAP_AUTO = 0, SCHED_OVERLAP_OFF, SCHED_OVERLAP_ON };

/* How waiting sequences are ordered and which running one is preempted (policy above). */
enum sched_policy { SCHED_FCFS = 0, SCHED_PRIORITY };

struct sched_config {
    enum sched_policy policy;   /* SCHED_FCFS: arrival order, sched_seq_params.priority ignored */
    int max_num_seqs;           /* sequences per step (logits rows) */
    int max_num_batched_tokens; /* rows per step (token budget) */
    int max_model_len;          /* prompt + generation limit per sequence */
    int block_size;             /* tokens per KV block; <= 0: KV_DEFAULT_BLOCK_SIZE */
    bool enable_prefix_caching;
    bool enable_chunked_prefill;/* off: max_num_batched_tokens >= max_model_len */
    enum sched_overlap overlap;
    struct spec_config spec;    /* speculative decoding (n-gram); num_tokens 0: off. On, it
                                   turns overlap off (see "Speculative decoding" above) */
    /* The backend to create: device, KV cache dtype and size (num_blocks, or the
     * cpu_kv_bytes / gpu_memory_utilization budget; one max_model_len sequence must fit),
     * threads, graphs. Its max_num_seqs, max_num_batched_tokens, max_model_len and
     * block_size are ignored: the scheduler's fields above are passed. */
    struct backend_config backend;
};

/* Defaults: backend_config_default, 256 seqs, 2048 batched tokens, max_model_len 0 (must be
 * set), block size 16, prefix caching and chunked prefill on, overlap AUTO. */
void sched_config_default(struct sched_config *c);

enum sched_status { SEQ_WAITING = 0, SEQ_RUNNING, SEQ_FINISHED, SEQ_ABORTED };
/* FINISH_ERROR: this sequence's row could not be sampled (backend_token.status != 0, e.g.
 * NaN logits); the other sequences are unaffected. */
enum sched_finish { FINISH_NONE = 0, FINISH_STOP, FINISH_LENGTH, FINISH_ABORT, FINISH_ERROR };

#define SCHED_MAX_STOP_IDS 16 /* stop token ids per sequence */
#define SCHED_MAX_BAD_WORDS 128      /* bad-word token sequences per sequence */
#define SCHED_MAX_BAD_WORD_TOKENS 32 /* tokens per bad word */

/* What one sequence asks for; everything is copied by sched_add. */
struct sched_seq_params {
    struct sampler_params sp;
    int max_tokens;           /* <= 0 or past the context: max_model_len - prompt length */
    bool ignore_eos;          /* keep sampling past end-of-generation tokens */
    int32_t stop_ids[SCHED_MAX_STOP_IDS]; /* [n_stop_ids] more tokens that end the sequence
                                 (FINISH_STOP, as an end-of-generation token: vLLM's
                                 stop_token_ids), ignore_eos or not */
    int n_stop_ids;
    int min_tokens;           /* >= 0: before this many generated tokens no end-of-generation
                                 token and no stop id can be sampled (masked out, as vLLM's
                                 min_tokens) */
    const int32_t *allowed_ids; /* [n_allowed] the only tokens that may be sampled (vLLM's
                                 allowed_token_ids; end tokens only if listed), or NULL */
    int n_allowed;
    const int32_t *bad_words; /* [bad_words_len] token sequences that must not be generated
                                 (vLLM's bad_words), one after another, each as its length
                                 (1..SCHED_MAX_BAD_WORD_TOKENS) then its ids: a sequence's
                                 last token is masked out wherever the generated tokens end
                                 with the ones before it (a one-token word: always), or NULL */
    int bad_words_len;
    int logprobs;             /* -1: none; 0..SAMPLER_MAX_TOP_LOGPROBS: report the sampled
                                 token's raw logprob and that many top alternatives */
    int prompt_logprobs;      /* -1: none; 0..SAMPLER_MAX_TOP_LOGPROBS: report the raw logprob
                                 of every prompt token from position 1 on (given the tokens
                                 before it) and that many top alternatives: prompt events */
    const int32_t *bias_ids;  /* [n_bias] logit bias (sampler_set_logit_bias) */
    const float *bias;        /* [n_bias] */
    int n_bias;
    const void *salt;         /* [salt_len] prefix-cache salt (<= BM_SALT_MAX bytes), or NULL */
    size_t salt_len;
    void *user;               /* opaque, reported in every sched_output of the sequence */
    struct grammar *grammar;  /* NULL: unconstrained; else the output must match it (the
                                 scheduler takes its own reference, dropped when the
                                 sequence is freed). Its vocabulary must be the model's
                                 tokenizer with no more than vocab_size ids */
    bool grammar_deferred;    /* the grammar applies only after the sequence has generated
                                 grammar_start_token (not matched itself: the grammar
                                 starts with the next token); before it, no mask */
    int32_t grammar_start_token;
    int priority;             /* SCHED_PRIORITY: lower is served sooner (vLLM's priority);
                                 ties in arrival order */
};

/* Defaults: sampler_params_default, max_tokens 0, logprobs -1, prompt_logprobs -1; no bias,
 * salt, user or grammar. */
void sched_seq_params_default(struct sched_seq_params *p);

/* Per-sequence state. Read-only for callers (sched_find); the scheduler owns it. */
struct sched_seq {
    int64_t id;             /* in arrival order */
    int priority;           /* (sched_seq_params) */
    enum sched_status status;
    enum sched_finish finish;
    int32_t *tokens;        /* [n_prompt + max_tokens] prompt ids, then generated ids */
    int n_prompt;
    int n_tokens;           /* n_prompt + generated so far (known on the host) */
    int max_tokens;         /* generation limit (clamped to max_model_len - n_prompt) */
    int num_computed;       /* positions whose KV is written or in a planned / running step
                               (0 while waiting) */
    int num_done;           /* positions whose KV is written and committed */
    int n_cached;           /* tokens whose KV came from the prefix cache at the last
                               admission (all of them on a full hit, whose last token is
                               still forwarded for its logits, without a KV write) */
    bool ignore_eos;
    int32_t stop_ids[SCHED_MAX_STOP_IDS]; /* [n_stop_ids] (sched_seq_params) */
    int n_stop_ids;
    int min_tokens;         /* (sched_seq_params) */
    bool abort_requested;   /* sched_abort: dropped at the start of the next step */
    int logprobs;           /* -1 or the number of top alternatives */
    int prompt_logprobs;    /* -1 or the number of top alternatives (sched_seq_params) */
    int plp_next;           /* the next prompt position whose logprob is due (from 1; n_prompt:
                               all reported). Its logits come from the row of position
                               plp_next - 1, so while any is due the prefix cache serves at
                               most positions [0, plp_next - 1) */
    int num_preemptions;
    size_t salt_len;
    uint8_t salt[BM_SALT_MAX];
    void *user;
    struct sampler_params sp;    /* the sampler is created from these at first admission */
    uint32_t *allowed;           /* NULL, or the allowed_ids as a token mask (grammar_mask_words
                                    words), made at sched_add */
    int32_t *bad_words;          /* NULL, or [bad_words_len] (sched_seq_params), copied */
    int bad_words_len;
    int32_t *bias_ids;           /* [n_bias] logit bias, copied at sched_add */
    float *bias;                 /* [n_bias] */
    int n_bias;
    struct sampler *sampler;     /* NULL until the first admission */
    struct grammar *grammar;     /* reference held, or NULL (unconstrained) */
    struct grammar_matcher *gm;  /* with grammar: created with the sampler, kept through
                                    preemption (it covers the generated tokens) */
    struct grammar_matcher *gm_spec; /* with grammar and speculation: a scratch copy of gm
                                    advanced along a proposal (the speculative rows' masks),
                                    created with gm */
    bool gm_on;                  /* the grammar applies (not deferred, or its start token
                                    has been generated) */
    int32_t grammar_start_token; /* the deferred grammar's start token */
    struct bm_seq *bs;
    int pending_row;        /* logits row of the step in flight that samples this sequence's
                               next token (decode rows of the next step name it
                               BACKEND_TOKEN_PREV(pending_row)); -1: none */
    int pending_plan;       /* which of the scheduler's two step plans pending_row is in */
    int refs;               /* planned or running steps that include this sequence */
    int spec_cap;           /* speculative: the most tokens its next proposal may have
                               (spec_next, scheduler.c) */
    int spec_wait;          /* speculative: steps to go before it is proposed for again */
    int spec_misses;        /* speculative: proposals in a row of which nothing was kept */
    struct sched_seq *next_zombie; /* finished, waiting for its steps to complete */
};

/* One token's logprobs (generated or, for a prompt event, of the prompt): raw model
 * logprobs (sampler_logprobs). The same layout and field names as engine.h's struct
 * req_logprob. */
struct sched_logprob {
    int32_t token;
    float logprob;
    int32_t rank;                                /* prompt events: backend_token.rank; else 0 */
    int n_top;                                   /* entries in top_* */
    int32_t top_ids[SAMPLER_MAX_TOP_LOGPROBS];   /* most likely first */
    float top_logprobs[SAMPLER_MAX_TOP_LOGPROBS];
};

/* One event of a step. Kinds:
 *   admitted: the sequence entered the running set (first admission or readmission after
 *             a preemption); token -1, not finished; n_cached = tokens of its context
 *             served from the prefix cache at this admission. Reported after the forward,
 *             before the same step's token event of that sequence.
 *   token:    token >= 0 was sampled (logprob != NULL when the sequence asked for
 *             logprobs); finished tells whether it ended the sequence (EOS: FINISH_STOP,
 *             the token is the end-of-generation token; FINISH_LENGTH).
 *   abort:    token -1, finished, FINISH_ABORT (sched_abort).
 *   error:    token -1, finished, FINISH_ERROR, error says why (the row could not be
 *             sampled); the other sequences go on.
 *   prompt:   (prompt_logprobs >= 0) prompt is true, token = the prompt token at position
 *             (1 .. n_prompt - 1), logprob its raw logprob given the tokens before it; not
 *             finished. Every position once, in order, all before the first token event
 *             (a preempted sequence's recompute reports none again). */
struct sched_output {
    int64_t seq_id;
    void *user;             /* sched_seq_params.user */
    int32_t token;          /* -1 when none (admitted, aborted) */
    bool finished;
    enum sched_finish finish;
    bool admitted;
    int n_cached;           /* admitted events */
    const struct sched_logprob *logprob; /* token events with logprobs >= 0 and prompt events,
                                            else NULL */
    bool prompt;            /* a prompt event */
    int position;           /* prompt events: the prompt position of token */
    const char *error;      /* FINISH_ERROR events: why (static text), else NULL */
    bool request_error;     /* FINISH_ERROR: the request's own constraints (a token mask: grammar,
                               allowed_token_ids, min_tokens, bad_words) left no token */
};

/* Called once per event during sched_step, in batch order; the output is borrowed for the
 * call. The sequence may be freed right after the call that reports it finished. The
 * callback may call sched_abort (taking effect at the next step) and nothing else. */
typedef void (*sched_output_fn)(void *ud, const struct sched_output *o);

struct sched_stats {
    uint64_t steps;
    uint64_t preemptions;
    uint64_t prefill_tokens;  /* rows computed that were not the last token (incl. recompute) */
    uint64_t batched_tokens;  /* rows computed in total */
    uint64_t discarded_tokens;/* overlap: tokens sampled for sequences that had finished */
    int num_waiting, num_running;
    int num_samplers;         /* live samplers (one per admitted, unfinished sequence) */
    int num_matchers;         /* live grammar matchers (admitted constrained sequences) */
    uint64_t masked_rows;     /* logits rows sampled under a grammar mask */
    uint64_t mask_ns;         /* time spent filling those masks (scheduler thread) */
    uint64_t spec_drafts;     /* speculative: proposals checked (sequence-steps with rows) */
    uint64_t spec_draft_tokens;   /* tokens proposed */
    uint64_t spec_accepted_tokens;/* proposed tokens that were sampled, hence kept */
    struct bm_stats bm;
};

/* Builds the scheduler for model m (borrowed, must outlive it). Validates cfg, creates the
 * backend (backend_create: ERR_NOMEM with the knob to turn when one max_model_len sequence
 * does not fit), the block manager over its KV blocks and the per-step arrays. */
int sched_create(struct sched **out, const struct model *m, const struct sched_config *cfg,
                 char *err, size_t errlen);
/* Frees everything, live sequences included. NULL is a no-op. */
void sched_free(struct sched *s);

/* Checks a sequence's end parameters (sched_seq_params.stop_ids / n_stop_ids / min_tokens)
 * against a vocabulary of vocab ids: 0 or ERR_INVALID naming what is wrong. sched_add runs
 * it; the engine runs it at submit. */
int sched_check_end_params(const int32_t *stop_ids, int n_stop_ids, int min_tokens, int vocab, char *err,
                           size_t errlen);

/* Checks bad words (sched_seq_params.bad_words / bad_words_len) against a vocabulary of
 * vocab ids: 0 or ERR_INVALID naming what is wrong. sched_add runs it; the engine at
 * submit. */
int sched_check_bad_words(const int32_t *words, int len, int vocab, char *err, size_t errlen);

/* Queues a sequence for prompt ids[0, n) (copied) with params p (copied, validated).
 * ERR_RANGE if the prompt leaves no room to generate; ERR_INVALID / ERR_RANGE for bad
 * ids, sampling params, logit bias, logprobs or salt. Writes the new sequence's id
 * (increasing from 1) to *seq_id. Allocates. */
int sched_add(struct sched *s, const int32_t *ids, int n, const struct sched_seq_params *p,
              int64_t *seq_id, char *err, size_t errlen);

/* Marks seq_id aborted; the next sched_step frees its blocks and reports it (token -1,
 * FINISH_ABORT). ERR_NOT_FOUND if no live sequence has that id. */
int sched_abort(struct sched *s, int64_t seq_id, char *err, size_t errlen);

/* One warm-up step through the backend (a single token at block 0, sampled greedily), so
 * that lazy initialisation and page faults happen before the first request. Call it right
 * after sched_create, before any sched_add. */
int sched_warmup(struct sched *s, char *err, size_t errlen);

/* Runs one step (see the policy above); cb (may be NULL) gets every event. Returns 0, or a
 * negative code: the backend failed (a device fault: the scheduler is unusable, fail
 * everything) or work remains but nothing could be scheduled. A row that cannot be
 * sampled is not an error of the step: its sequence finishes with FINISH_ERROR. */
int sched_step(struct sched *s, sched_output_fn cb, void *ud, char *err, size_t errlen);

/* True while any sequence is waiting or running, or a step is in flight. */
bool sched_has_work(const struct sched *s);

/* The live sequence seq_id (borrowed until the next step), or NULL. */
const struct sched_seq *sched_find(const struct sched *s, int64_t seq_id);

void sched_get_stats(const struct sched *s, struct sched_stats *st);
/* The effective configuration (block_size defaulted, overlap resolved to ON / OFF (OFF with
 * speculation),
 * backend.num_blocks / kv_dtype as the backend chose them). Immutable after sched_create,
 * so any thread may read it. */
const struct sched_config *sched_get_config(const struct sched *s);
/* What the backend decided (device, KV blocks, bytes). Immutable; any thread. */
const struct backend_info *sched_backend_info(const struct sched *s);
/* The block manager, for tests and debugging (bm_check). */
const struct block_manager *sched_block_manager(const struct sched *s);

#endif

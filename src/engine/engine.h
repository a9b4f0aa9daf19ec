/* engine.h — the thread-safe request API over the scheduler, and the scheduler thread.
 *
 * struct engine owns one struct sched (scheduler.h) and the one thread that drives it.
 * Any thread may submit a request or abort it; requests cross into the scheduler thread
 * through an inbox (mutex + condition variable) and come back through each request's
 * output buffer. Per step, the scheduler thread, for each sequence that produced a token:
 * detokenizes it incrementally (UTF-8 safe: a character split across tokens is held until
 * complete), runs the stop-string matcher (text that could still start a stop string is
 * held back until it cannot; a completed stop string ends the request with finish STOP and
 * is never emitted), computes logprobs when asked, appends text / ids / logprobs to the
 * request's pending output, and then calls the request's notify callback.
 *
 * Lifecycle of a request:  submitted → waiting → running → finished (stop | length |
 * abort | error), with preemption back to waiting inside the scheduler (invisible here).
 *
 * Ownership: struct request is refcounted. engine_submit returns it with one reference
 * for the caller; the engine holds its own until the request is finished and the final
 * notify has been made. The caller drops its reference with request_release (after
 * request_abort if it no longer wants the output); the memory goes with the last one.
 *
 * Validation happens in engine_submit, on the caller's thread, before anything is queued,
 * so an HTTP layer can answer 400 / 429 / 503 before it sends 200.
 *
 * Statistics (stats.h) are written by the scheduler thread each step and may be read by
 * any thread with engine_get_stats.
 */
#ifndef TESSERA_ENGINE_ENGINE_H
#define TESSERA_ENGINE_ENGINE_H

#include "engine/scheduler.h"
#include "engine/stats.h"
#include "sampler/sampler.h"
#include "sampler/stop.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct model;
struct engine;
struct request;
struct grammar;

/* A liveness hook: called on the scheduler thread at least every tick_interval_s while
 * the loop runs (idle or busy), between steps — never while a step is stuck. For a
 * supervisor's watchdog (systemd WATCHDOG=1). Must be quick; must not call the engine. */
typedef void (*engine_tick_fn)(void *ud);

struct engine_config {
    struct sched_config sched; /* scheduler and backend (sched_config_default) */
    int max_queued_requests;   /* submitted but not yet running; beyond it submit → ERR_BUSY.
                                  <= 0: unlimited. A request's sibling choices (req_params.
                                  sibling) are not counted */
    int64_t max_queued_tokens; /* prompt tokens of those requests; <= 0: unlimited */
    /* Called once, on the scheduler thread, when the engine fails (a backend error), with
     * the reason — engine_failed() is already true and every later submit gets
     * ERR_UNAVAILABLE; right after it returns, every live request finishes ERROR. The
     * process should exit (house style); may be NULL. No engine call from inside. */
    void (*on_failure)(void *ud, const char *reason);
    void *failure_ud;
    engine_tick_fn tick;       /* NULL: none */
    void *tick_ud;
    double tick_interval_s;    /* <= 0 with a tick: 1 s */
};

/* What a request asks for. Everything is copied by engine_submit. */
struct req_params {
    struct sampler_params sp;
    int max_tokens;            /* <= 0: up to max_model_len; clamped to the remaining context
                                  (finish LENGTH) */
    bool ignore_eos;           /* keep generating past end-of-generation tokens */
    bool skip_special_tokens;  /* text omits special tokens (the usual: true) */
    const char *stops[STOP_MAX_STRINGS]; /* stop strings (validated with stop_validate) */
    int n_stops;
    bool include_stop_str;     /* the stop string that ended the text is part of it (vLLM's
                                  include_stop_str_in_output); else it is cut */
    int32_t stop_ids[SCHED_MAX_STOP_IDS]; /* [n_stop_ids] tokens that end generation like an
                                  end-of-generation token, ignore_eos or not; their text is
                                  not output (vLLM's stop_token_ids) */
    int n_stop_ids;
    const int32_t *allowed_ids; /* [n_allowed] the only tokens that may be sampled (vLLM's
                                  allowed_token_ids), or NULL; copied */
    int n_allowed;
    const int32_t *bad_words;  /* [bad_words_len] token sequences not to generate (vLLM's
                                  bad_words; layout: sched_seq_params.bad_words), or NULL;
                                  copied */
    int bad_words_len;
    int min_tokens;            /* >= 0: no end-of-generation token or stop id is sampled before
                                  this many tokens, and stop strings are matched only in the
                                  text of the tokens after them (vLLM's min_tokens) */
    int logprobs;              /* -1: none; 0..SAMPLER_MAX_TOP_LOGPROBS: the sampled token's
                                  logprob plus that many top alternatives per token */
    int prompt_logprobs;       /* -1: none; 0..SAMPLER_MAX_TOP_LOGPROBS: the raw logprob of
                                  every prompt token from the second on (given the tokens
                                  before it) plus that many top alternatives (req_output.plp;
                                  those positions are computed, not taken from the prefix
                                  cache) */
    const int32_t *bias_ids;   /* [n_bias] logit bias (OpenAI logit_bias) */
    const float *bias;         /* [n_bias] */
    int n_bias;
    const char *cache_salt;    /* NULL or a string (<= BM_SALT_MAX bytes) separating this
                                  request's prefix-cache entries from other salts */
    struct grammar *grammar;   /* NULL, or structured output: the generated text must match
                                  it (grammar/grammar.h; compiled against this model's
                                  tokenizer). The request takes its own reference; the
                                  caller keeps its own. The request ends with the grammar
                                  (finish STOP at the end token it allows), ignore_eos or not */
    bool grammar_deferred;     /* the grammar starts only after the request has generated
                                  grammar_start_token (a reasoning model's "</think>": the
                                  model thinks freely, then answers under the grammar, as
                                  vLLM does); until then the output is unconstrained */
    int32_t grammar_start_token;
    int priority;              /* with the scheduler's PRIORITY policy: lower is served
                                  sooner (vLLM's priority); ignored under FCFS */
    bool sibling;              /* another choice (n > 1) of the request the caller submitted
                                  just before: not counted against max_queued_requests /
                                  max_queued_tokens (the first choice was), never ERR_BUSY */
};

/* Sets the usual defaults: sampler_params_default, max_tokens 0, skip_special_tokens true,
 * logprobs -1, prompt_logprobs -1, no stops / bias / salt. */
void req_params_default(struct req_params *p);

enum req_finish {
    REQ_FINISH_NONE = 0, /* still running */
    REQ_FINISH_STOP,     /* end-of-generation token or a stop string */
    REQ_FINISH_LENGTH,   /* max_tokens or the context limit */
    REQ_FINISH_ABORT,    /* request_abort, or engine shutdown */
    REQ_FINISH_ERROR,    /* the request failed — its row could not be sampled (the others go
                            on) — or the engine failed (message in req_output.error) */
};

/* One token's logprobs, generated or of the prompt (raw model logprobs, see
 * sampler_logprobs). */
struct req_logprob {
    int32_t token;
    float logprob;
    int32_t rank;                                /* prompt logprobs: how many ids are at least as
                                                    likely, the token included (1 = the most
                                                    likely); 0 for generated tokens */
    int n_top;                                   /* entries in top_* */
    int32_t top_ids[SAMPLER_MAX_TOP_LOGPROBS];   /* most likely first */
    float top_logprobs[SAMPLER_MAX_TOP_LOGPROBS];
};

/* Output taken from a request: everything appended since the previous take. The buffers
 * belong to whoever holds this struct; request_take swaps them with the request's pending
 * ones (no copy; each side's buffers grow to their high-water mark and are reused). Zero
 * it before the first take; free it with req_output_free. */
struct req_output {
    char *text;                /* [text_len] new text (valid UTF-8, never part of a stop
                                  string); not NUL-terminated */
    size_t text_len, text_cap;
    int32_t *ids;              /* [n_ids] new generated token ids (incl. an end token) */
    int n_ids, ids_cap;
    struct req_logprob *lp;    /* [n_lp] one per id when logprobs >= 0, else n_lp == 0 */
    int n_lp, lp_cap;
    struct req_logprob *plp;   /* [n_plp] prompt_logprobs >= 0: the prompt's tokens from
                                  position 1 on, in order, all before the first id */
    int n_plp, plp_cap;
    /* state at the time of the take (not deltas) */
    enum req_finish finish;    /* REQ_FINISH_NONE while running */
    int stop_index;            /* index of the stop string that ended it, or -1 */
    int n_prompt;              /* prompt tokens */
    int n_cached;              /* prompt tokens served from the prefix cache (first admission) */
    int n_generated;           /* generated tokens so far (incl. an end token) */
    double t_first_token;      /* seconds from submit to the first token, or -1 */
    double t_total;            /* seconds from submit to finish, or -1 while running */
    char error[256];           /* REQ_FINISH_ERROR: why */
    bool request_error;        /* REQ_FINISH_ERROR caused by the request itself (its constraints
                                  left no token: an HTTP server answers 400), not the server */
};

void req_output_free(struct req_output *o);

/* Called on the scheduler thread, with no engine lock held, after new output or the
 * finish has been appended to a request. It must be quick and must not call back into
 * the engine except request_take / request_abort / request_release. */
typedef void (*req_notify_fn)(void *ud);

/* Creates the scheduler and its backend for m (borrowed; must outlive the engine), runs
 * one warm-up step through the backend, and starts the scheduler thread. Returns 0 or a
 * negative code with the reason in err. */
int engine_create(struct engine **out, const struct model *m, const struct engine_config *cfg,
                  char *err, size_t errlen);

/* Stops accepting (submit → ERR_UNAVAILABLE), aborts every live request (each gets its
 * final notify with REQ_FINISH_ABORT), joins the thread and frees the engine. Requests
 * still referenced by callers stay valid until released. NULL is a no-op. */
void engine_free(struct engine *e);

/* Submits prompt ids[0, n) (copied) with params p. On success returns 0 and *out (one
 * reference for the caller). notify(ud) (may be NULL) is called as described above; it
 * may run before engine_submit returns. Errors, nothing queued, *out = NULL:
 *   ERR_INVALID      empty prompt, id outside the vocabulary, bad sampling params, stops,
 *                    logit bias, logprobs or salt (the reason names the parameter)
 *   ERR_RANGE        prompt of n tokens leaves no room in max_model_len (context length)
 *   ERR_BUSY         the queue is full (max_queued_requests / max_queued_tokens; not for
 *                    a sibling)
 *   ERR_UNAVAILABLE  the engine is draining or shutting down
 *   ERR_NOMEM
 * Any thread. */
int engine_submit(struct engine *e, const int32_t *ids, int n, const struct req_params *p,
                  req_notify_fn notify, void *ud, struct request **out, char *err,
                  size_t errlen);

/* Stops new submits (ERR_UNAVAILABLE) while live requests finish. Any thread. */
void engine_drain(struct engine *e);
/* Aborts every live request (as request_abort on each); the engine stays usable. For
 * the end of a drain. Any thread. */
void engine_abort_all(struct engine *e);
/* Requests submitted and not yet finished. Any thread. */
int engine_num_active(struct engine *e);
/* The effective scheduler configuration (max_model_len etc.). */
const struct sched_config *engine_sched_config(const struct engine *e);
/* What the backend decided (device, KV blocks). Immutable; any thread. */
const struct backend_info *engine_backend_info(const struct engine *e);
/* True once a step failed: the engine serves nothing more (health: 503). Any thread. */
bool engine_failed(struct engine *e);
/* A consistent copy of the statistics (stats.h). Any thread. */
void engine_get_stats(struct engine *e, struct engine_stats *out);

/* For tests and debugging: waits until the scheduler thread is idle (inbox empty, nothing
 * waiting or running in the scheduler, every finished request released by the engine),
 * then copies the scheduler's statistics into *st (may be NULL) and returns bm_check's
 * verdict: 0, or ERR_FORMAT with the first violation in err. ERR_UNAVAILABLE if the
 * engine failed or is shutting down. Any thread but the scheduler thread (so never from a
 * notify callback). */
int engine_debug_check(struct engine *e, struct sched_stats *st, char *err, size_t errlen);

/* Asks the engine to stop r: its KV blocks are freed at the next step (queued, prefilling
 * or decoding) and its final notify reports REQ_FINISH_ABORT unless it had finished
 * already. Idempotent. Any thread, including from the notify callback. */
void request_abort(struct request *r);
/* Drops the caller's reference. Any thread. */
void request_release(struct request *r);
/* The engine's id of r (increasing from 1; for logs). */
int64_t request_id(const struct request *r);

/* Swaps r's pending output into *o (see struct req_output) and fills the state fields.
 * Returns true if anything new was taken or the request is finished. Never blocks on the
 * scheduler's step. Any thread; one consumer per request. */
bool request_take(struct request *r, struct req_output *o);
/* Waits until r has pending output or is finished, or timeout_s passes (< 0: forever).
 * Returns true if output/finish is ready. For CLI callers and tests. */
bool request_wait(struct request *r, double timeout_s);

#endif

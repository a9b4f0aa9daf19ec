/* stats.h — the engine's statistics, in the shape /metrics will export (vLLM's metric
 * names, so existing dashboards work).
 *
 * The scheduler thread is the only writer; any thread may take a consistent copy with
 * stats_snapshot (a mutex guards the copy, so the writer's critical sections are a few
 * stores). Histograms use fixed bucket bounds (vLLM's) and cumulative counts are
 * computed only when formatted. No allocation after stats_init.
 */
#ifndef TESSERA_ENGINE_STATS_H
#define TESSERA_ENGINE_STATS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define STATS_MAX_BUCKETS 24

enum stats_hist {
    HIST_TTFT = 0,       /* vllm:time_to_first_token_seconds */
    HIST_ITL,            /* vllm:inter_token_latency_seconds */
    HIST_E2E,            /* vllm:e2e_request_latency_seconds */
    HIST_QUEUE,          /* vllm:request_queue_time_seconds */
    HIST_COUNT_
};

struct histogram {
    int n_bounds;                            /* upper bounds, ascending; +Inf is implicit */
    double bounds[STATS_MAX_BUCKETS];
    uint64_t counts[STATS_MAX_BUCKETS + 1];  /* per bucket (not cumulative); last = +Inf */
    uint64_t count;
    double sum;
};

/* vllm:request_success_total's finished_reason label values (vLLM's FinishReason):
 * "error" is a request the engine failed (a row that could not be sampled, a backend
 * fault), never counted as "abort" (client disconnect, shutdown). */
enum stats_finish { STATS_FINISH_STOP = 0, STATS_FINISH_LENGTH, STATS_FINISH_ABORT, STATS_FINISH_ERROR,
                    STATS_FINISH_COUNT_ };

struct engine_stats {
    /* gauges */
    int num_running, num_waiting;
    int64_t kv_blocks_used, kv_blocks_total;
    /* counters (vLLM's definitions: an engine request — one choice of n — counts its whole
     * prompt, cached tokens included, once, at its first token; prompt_tokens_cached is the
     * part of it served from the prefix cache at its first admission) */
    uint64_t prompt_tokens, prompt_tokens_cached, generation_tokens, preemptions;
    uint64_t prefix_cache_queries, prefix_cache_hits; /* in tokens */
    uint64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens; /* speculative decoding:
                                 proposals checked, tokens proposed, proposed tokens kept */
    uint64_t finished[STATS_FINISH_COUNT_];
    struct histogram hist[HIST_COUNT_];
};

struct stats {
    pthread_mutex_t mu;
    struct engine_stats s; /* written under mu by the scheduler thread */
};

void stats_init(struct stats *st);
void stats_destroy(struct stats *st);

/* Writer side (scheduler thread). */
void stats_observe(struct stats *st, enum stats_hist h, double seconds);
void stats_set_gauges(struct stats *st, int running, int waiting, int64_t blocks_used,
                      int64_t blocks_total);
void stats_add_tokens(struct stats *st, uint64_t prompt, uint64_t generation);
void stats_add_cached_prompt_tokens(struct stats *st, uint64_t cached);
void stats_add_prefix_cache(struct stats *st, uint64_t queries, uint64_t hits);
void stats_add_preemption(struct stats *st);
void stats_add_spec(struct stats *st, uint64_t drafts, uint64_t draft_tokens, uint64_t accepted);
void stats_add_finished(struct stats *st, enum stats_finish reason);

/* Reader side (any thread): a consistent copy. */
void stats_snapshot(struct stats *st, struct engine_stats *out);

/* Writes the snapshot in Prometheus text exposition format (vLLM names, label
 * model_name="..."), NUL-terminated, into buf. Returns the length it needed (excluding
 * the NUL); if that is >= cap the output was truncated. */
size_t stats_format_prometheus(const struct engine_stats *s, const char *model_name, char *buf,
                               size_t cap);

#endif

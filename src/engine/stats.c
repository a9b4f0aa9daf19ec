/* stats.c — see stats.h. */
#include "engine/stats.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* vLLM's bucket bounds for the same metrics. */
static const double ttft_bounds[] = { 0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                      0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
                                      640.0, 2560.0 };
static const double itl_bounds[] = { 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                     0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0 };
static const double latency_bounds[] = { 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                         30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
                                         1920.0, 7680.0 };

struct hist_info {
    const char *name;
    const char *help;
    const double *bounds;
    int n;
};

static const struct hist_info hist_info[HIST_COUNT_] = {
    [HIST_TTFT] = { "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                    ttft_bounds, (int)(sizeof ttft_bounds / sizeof ttft_bounds[0]) },
    [HIST_ITL] = { "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                   itl_bounds, (int)(sizeof itl_bounds / sizeof itl_bounds[0]) },
    [HIST_E2E] = { "vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
                   latency_bounds, (int)(sizeof latency_bounds / sizeof latency_bounds[0]) },
    [HIST_QUEUE] = { "vllm:request_queue_time_seconds", "Histogram of time spent waiting in the queue in seconds.",
                     latency_bounds, (int)(sizeof latency_bounds / sizeof latency_bounds[0]) },
};

static const char *const finish_names[STATS_FINISH_COUNT_] = { "stop", "length", "abort", "error" };

void stats_init(struct stats *st)
{
    memset(st, 0, sizeof *st);
    pthread_mutex_init(&st->mu, NULL);
    for (int h = 0; h < HIST_COUNT_; h++) {
        st->s.hist[h].n_bounds = hist_info[h].n;
        memcpy(st->s.hist[h].bounds, hist_info[h].bounds, sizeof(double) * (size_t)hist_info[h].n);
    }
}

void stats_destroy(struct stats *st) { pthread_mutex_destroy(&st->mu); }

void stats_observe(struct stats *st, enum stats_hist h, double seconds)
{
    struct histogram *hg = &st->s.hist[h];
    int b = 0;
    while (b < hg->n_bounds && seconds > hg->bounds[b]) b++; /* Prometheus buckets are "le" */
    pthread_mutex_lock(&st->mu);
    hg->counts[b]++;
    hg->count++;
    hg->sum += seconds;
    pthread_mutex_unlock(&st->mu);
}

void stats_set_gauges(struct stats *st, int running, int waiting, int64_t blocks_used,
                      int64_t blocks_total)
{
    pthread_mutex_lock(&st->mu);
    st->s.num_running = running;
    st->s.num_waiting = waiting;
    st->s.kv_blocks_used = blocks_used;
    st->s.kv_blocks_total = blocks_total;
    pthread_mutex_unlock(&st->mu);
}

void stats_add_tokens(struct stats *st, uint64_t prompt, uint64_t generation)
{
    pthread_mutex_lock(&st->mu);
    st->s.prompt_tokens += prompt;
    st->s.generation_tokens += generation;
    pthread_mutex_unlock(&st->mu);
}

void stats_add_cached_prompt_tokens(struct stats *st, uint64_t cached)
{
    pthread_mutex_lock(&st->mu);
    st->s.prompt_tokens_cached += cached;
    pthread_mutex_unlock(&st->mu);
}

void stats_add_prefix_cache(struct stats *st, uint64_t queries, uint64_t hits)
{
    pthread_mutex_lock(&st->mu);
    st->s.prefix_cache_queries += queries;
    st->s.prefix_cache_hits += hits;
    pthread_mutex_unlock(&st->mu);
}

void stats_add_preemption(struct stats *st)
{
    pthread_mutex_lock(&st->mu);
    st->s.preemptions++;
    pthread_mutex_unlock(&st->mu);
}

void stats_add_spec(struct stats *st, uint64_t drafts, uint64_t draft_tokens, uint64_t accepted)
{
    pthread_mutex_lock(&st->mu);
    st->s.spec_drafts += drafts;
    st->s.spec_draft_tokens += draft_tokens;
    st->s.spec_accepted_tokens += accepted;
    pthread_mutex_unlock(&st->mu);
}

void stats_add_finished(struct stats *st, enum stats_finish reason)
{
    pthread_mutex_lock(&st->mu);
    st->s.finished[reason]++;
    pthread_mutex_unlock(&st->mu);
}

void stats_snapshot(struct stats *st, struct engine_stats *out)
{
    pthread_mutex_lock(&st->mu);
    *out = st->s;
    pthread_mutex_unlock(&st->mu);
}

/* Appends to a bounded buffer, counting what would have been written. */
struct sbuf {
    char *p;
    size_t cap, len;
};

__attribute__((format(printf, 2, 3))) static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->len < b->cap ? b->cap - b->len : 0;
    int n = vsnprintf(room ? b->p + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) b->len += (size_t)n;
}

static void fmt_metric(struct sbuf *b, const char *name, const char *type, const char *help)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Prometheus label values escape backslash, double quote and newline. Model names come
 * from model files, so they are untrusted. Longer names are cut at cap - 1 bytes. */
static void escape_label(const char *in, char *out, size_t cap)
{
    size_t n = 0;
    for (; *in && n + 3 < cap; in++) {
        if (*in == '\\' || *in == '"') out[n++] = '\\', out[n++] = *in;
        else if (*in == '\n') out[n++] = '\\', out[n++] = 'n';
        else out[n++] = *in;
    }
    out[n] = 0;
}

size_t stats_format_prometheus(const struct engine_stats *s, const char *model_name, char *buf,
                               size_t cap)
{
    char model[512];
    escape_label(model_name, model, sizeof model);
    struct sbuf b = { buf, cap, 0 };
    if (cap) buf[0] = 0;
    fmt_metric(&b, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.");
    sb_printf(&b, "vllm:num_requests_running{model_name=\"%s\"} %d\n", model, s->num_running);
    fmt_metric(&b, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.");
    sb_printf(&b, "vllm:num_requests_waiting{model_name=\"%s\"} %d\n", model, s->num_waiting);
    fmt_metric(&b, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.");
    sb_printf(&b, "vllm:kv_cache_usage_perc{model_name=\"%s\"} %.6g\n", model,
              s->kv_blocks_total ? (double)s->kv_blocks_used / (double)s->kv_blocks_total : 0.0);
    const struct { const char *name, *help; uint64_t v; } counters[] = {
        { "vllm:prompt_tokens_total", "Number of prefill tokens processed.", s->prompt_tokens },
        { "vllm:prompt_tokens_cached_total", "Number of cached tokens processed.", s->prompt_tokens_cached },
        { "vllm:generation_tokens_total", "Number of generation tokens processed.", s->generation_tokens },
        { "vllm:num_preemptions_total", "Cumulative number of preemptions from the engine.", s->preemptions },
        { "vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", s->prefix_cache_queries },
        { "vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", s->prefix_cache_hits },
        { "vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", s->spec_drafts },
        { "vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", s->spec_draft_tokens },
        { "vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", s->spec_accepted_tokens },
    };
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) {
        fmt_metric(&b, counters[i].name, "counter", counters[i].help);
        sb_printf(&b, "%s{model_name=\"%s\"} %llu\n", counters[i].name, model,
                  (unsigned long long)counters[i].v);
    }
    fmt_metric(&b, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
    for (int r = 0; r < STATS_FINISH_COUNT_; r++)
        sb_printf(&b, "vllm:request_success_total{finished_reason=\"%s\",model_name=\"%s\"} %llu\n",
                  finish_names[r], model, (unsigned long long)s->finished[r]);
    for (int h = 0; h < HIST_COUNT_; h++) {
        const struct histogram *hg = &s->hist[h];
        const char *name = hist_info[h].name;
        fmt_metric(&b, name, "histogram", hist_info[h].help);
        uint64_t cum = 0;
        for (int i = 0; i < hg->n_bounds; i++) {
            cum += hg->counts[i];
            /* "le" printed as Python's prometheus client does (1.0, not 1) */
            double v = hg->bounds[i];
            sb_printf(&b, v == (double)(long long)v ? "%s_bucket{le=\"%.1f\",model_name=\"%s\"} %llu\n"
                                                    : "%s_bucket{le=\"%g\",model_name=\"%s\"} %llu\n",
                      name, v, model, (unsigned long long)cum);
        }
        cum += hg->counts[hg->n_bounds];
        sb_printf(&b, "%s_bucket{le=\"+Inf\",model_name=\"%s\"} %llu\n", name, model, (unsigned long long)cum);
        sb_printf(&b, "%s_sum{model_name=\"%s\"} %.9g\n", name, model, hg->sum);
        sb_printf(&b, "%s_count{model_name=\"%s\"} %llu\n", name, model, (unsigned long long)hg->count);
    }
    return b.len;
}

/* test_stats.c — engine/stats: bucket placement, Prometheus text, label escaping,
 * truncation, and consistent snapshots under a concurrent writer. */
#include "test.h"
#include "engine/stats.h"

#include <pthread.h>
#include <stdatomic.h>

static void test_buckets(void)
{
    struct stats st;
    stats_init(&st);
    stats_observe(&st, HIST_TTFT, 0.001);  /* == first bound: "le" puts it in bucket 0 */
    stats_observe(&st, HIST_TTFT, 0.0011); /* bucket 1 */
    stats_observe(&st, HIST_TTFT, 1e9);    /* +Inf */
    struct engine_stats s;
    stats_snapshot(&st, &s);
    const struct histogram *h = &s.hist[HIST_TTFT];
    CHECK(h->counts[0] == 1 && h->counts[1] == 1 && h->counts[h->n_bounds] == 1, "bucket counts");
    CHECK(h->count == 3, "count %llu", (unsigned long long)h->count);
    CHECK_CLOSE(h->sum, 1e9 + 0.0021, 1e-6, 0);
    stats_destroy(&st);
}

static void test_prometheus_text(void)
{
    struct stats st;
    stats_init(&st);
    stats_set_gauges(&st, 3, 5, 25, 100);
    stats_add_tokens(&st, 1000, 42);
    stats_add_prefix_cache(&st, 64, 48);
    stats_add_preemption(&st);
    stats_add_finished(&st, STATS_FINISH_LENGTH);
    stats_observe(&st, HIST_E2E, 0.9);
    stats_observe(&st, HIST_E2E, 3.0);
    struct engine_stats s;
    stats_snapshot(&st, &s);
    char buf[32768];
    size_t n = stats_format_prometheus(&s, "smol\"lm\\2\n", buf, sizeof buf);
    CHECK(n < sizeof buf && strlen(buf) == n, "length %zu", n);
    CHECK(strstr(buf, "vllm:num_requests_running{model_name=\"smol\\\"lm\\\\2\\n\"} 3\n") != NULL, "running gauge / escaping");
    CHECK(strstr(buf, "vllm:kv_cache_usage_perc{model_name=\"smol\\\"lm\\\\2\\n\"} 0.25\n") != NULL, "kv usage");
    CHECK(strstr(buf, "vllm:prompt_tokens_total{model_name=\"smol\\\"lm\\\\2\\n\"} 1000\n") != NULL, "prompt tokens");
    CHECK(strstr(buf, "vllm:request_success_total{finished_reason=\"length\",") != NULL, "finish reason");
    /* cumulative buckets: 0.9 is counted from le=1 on, 3.0 from le=5 on */
    CHECK(strstr(buf, "vllm:e2e_request_latency_seconds_bucket{le=\"0.8\",model_name=\"smol\\\"lm\\\\2\\n\"} 0\n") != NULL, "le 0.8");
    CHECK(strstr(buf, "vllm:e2e_request_latency_seconds_bucket{le=\"1.0\",model_name=\"smol\\\"lm\\\\2\\n\"} 1\n") != NULL, "le 1");
    CHECK(strstr(buf, "vllm:e2e_request_latency_seconds_bucket{le=\"5.0\",model_name=\"smol\\\"lm\\\\2\\n\"} 2\n") != NULL, "le 5");
    CHECK(strstr(buf, "vllm:e2e_request_latency_seconds_bucket{le=\"+Inf\",model_name=\"smol\\\"lm\\\\2\\n\"} 2\n") != NULL, "+Inf");
    CHECK(strstr(buf, "# TYPE vllm:time_to_first_token_seconds histogram\n") != NULL, "type line");
    /* truncation: the needed length is reported and the buffer stays terminated */
    char small[64];
    size_t need = stats_format_prometheus(&s, "m", small, sizeof small);
    CHECK(need > sizeof small && strlen(small) == sizeof small - 1, "truncation need=%zu", need);
    stats_destroy(&st);
}

struct writer_arg { struct stats *st; atomic_int stop; };

static void *writer(void *p)
{
    struct writer_arg *w = p;
    for (int i = 0; !atomic_load(&w->stop); i++) stats_observe(w->st, HIST_ITL, (i % 100) * 0.01);
    return NULL;
}

static void test_snapshot_consistent(void)
{
    struct stats st;
    stats_init(&st);
    struct writer_arg w = { &st, 0 };
    pthread_t t;
    pthread_create(&t, NULL, writer, &w);
    int bad = 0;
    for (int r = 0; r < 20000; r++) {
        struct engine_stats s;
        stats_snapshot(&st, &s);
        const struct histogram *h = &s.hist[HIST_ITL];
        uint64_t sum = 0;
        for (int b = 0; b <= h->n_bounds; b++) sum += h->counts[b];
        if (sum != h->count) bad++;
    }
    atomic_store(&w.stop, 1);
    pthread_join(t, NULL);
    CHECK(bad == 0, "%d inconsistent snapshots", bad);
    stats_destroy(&st);
}

int main(void)
{
    RUN(test_buckets);
    RUN(test_prometheus_text);
    RUN(test_snapshot_consistent);
    return test_summary();
}

/* test_speculative.c — the n-gram proposer and vLLM's --speculative-config parsing
 * (engine/speculative.h). The scheduler's use of them: test_sched_spec.c. */
#include "engine/speculative.h"
#include "test.h"
#include "util/err.h"

#include <string.h>

static int parse(const char *json, struct spec_config *c, char *err)
{
    return spec_config_parse(json, c, err, ERR_BUF);
}

static void test_config(void)
{
    char err[ERR_BUF];
    struct spec_config c;
    CHECK(parse(NULL, &c, err) == 0 && c.num_tokens == 0, "NULL: off");
    CHECK(parse("", &c, err) == 0 && c.num_tokens == 0, "empty: off");
    CHECK(parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 5, \"prompt_lookup_max\": 4, "
                "\"prompt_lookup_min\": 2}", &c, err) == 0,
          "%s", err);
    CHECK(c.num_tokens == 5 && c.lookup_min == 2 && c.lookup_max == 4, "%d %d..%d", c.num_tokens, c.lookup_min,
          c.lookup_max);
    /* vLLM's defaults for the n-gram window */
    CHECK(parse("{\"method\":\"ngram\",\"num_speculative_tokens\":3}", &c, err) == 0 && c.lookup_min == 5 &&
              c.lookup_max == 5,
          "neither bound: %d..%d", c.lookup_min, c.lookup_max);
    CHECK(parse("{\"method\":\"ngram\",\"num_speculative_tokens\":3,\"prompt_lookup_max\":4}", &c, err) == 0 &&
              c.lookup_min == 4 && c.lookup_max == 4,
          "max only: %d..%d", c.lookup_min, c.lookup_max);
    CHECK(parse("{\"method\":\"ngram\",\"num_speculative_tokens\":3,\"prompt_lookup_min\":2}", &c, err) == 0 &&
              c.lookup_min == 2 && c.lookup_max == 2,
          "min only: %d..%d", c.lookup_min, c.lookup_max);
    char buf[96];
    spec_config_describe(&c, buf, sizeof buf);
    CHECK(!strcmp(buf, "ngram, 3 tokens, n-gram 2..2"), "describe: %s", buf);
    CHECK(parse("{\"method\":\"ngram\",\"num_speculative_tokens\":3,\"disable_by_batch_size\":4}", &c, err) == 0 &&
              c.disable_by_batch_size == 4,
          "disable_by_batch_size: %s", err);
    spec_config_describe(&c, buf, sizeof buf);
    CHECK(!strcmp(buf, "ngram, 3 tokens, n-gram 5..5, up to 4 running"), "describe: %s", buf);

    static const struct { const char *json; int rc; const char *says; } bad[] = {
        { "ngram", ERR_INVALID, "not a JSON object" },
        { "[1]", ERR_INVALID, "not a JSON object" },
        { "{\"num_speculative_tokens\":5}", ERR_INVALID, "\"method\" must be \"ngram\"" },
        { "{\"method\":\"eagle\",\"num_speculative_tokens\":5}", ERR_INVALID, "must be \"ngram\"" },
        { "{\"method\":\"ngram\"}", ERR_INVALID, "\"num_speculative_tokens\" is required" },
        { "{\"method\":\"ngram\",\"num_speculative_tokens\":0}", ERR_RANGE, "\"num_speculative_tokens\" is 0" },
        { "{\"method\":\"ngram\",\"num_speculative_tokens\":17}", ERR_RANGE, "[1, 16]" },
        { "{\"method\":\"ngram\",\"num_speculative_tokens\":2.5}", ERR_INVALID, "must be an integer" },
        { "{\"method\":\"ngram\",\"num_speculative_tokens\":\"5\"}", ERR_INVALID, "must be an integer" },
        { "{\"method\":\"ngram\",\"num_speculative_tokens\":5,\"prompt_lookup_max\":65}", ERR_RANGE, "[1, 64]" },
        { "{\"method\":\"ngram\",\"num_speculative_tokens\":5,\"prompt_lookup_min\":0}", ERR_RANGE,
          "\"prompt_lookup_min\" is 0" },
        { "{\"method\":\"ngram\",\"num_speculative_tokens\":5,\"prompt_lookup_min\":4,\"prompt_lookup_max\":3}",
          ERR_RANGE, "above \"prompt_lookup_max\" 3" },
        { "{\"method\":\"ngram\",\"num_speculative_tokens\":5,\"disable_by_batch_size\":1}", ERR_RANGE,
          "\"disable_by_batch_size\" is 1" },
        { "{\"method\":\"ngram\",\"num_speculative_tokens\":5,\"model\":\"x\"}", ERR_INVALID,
          "unknown key \"model\"" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        c.num_tokens = 99;
        int rc = parse(bad[i].json, &c, err);
        CHECK(rc == bad[i].rc && strstr(err, bad[i].says) && strstr(err, "--speculative-config"),
              "%s: rc %d, \"%s\"", bad[i].json, rc, err);
        CHECK(c.num_tokens == 0, "%s: left speculation on", bad[i].json);
    }
}

/* The struct check sched_create runs for callers that fill the configuration themselves. */
static void test_check(void)
{
    char err[ERR_BUF];
    struct spec_config off = { 0 }, ok = { 5, 1, 4, 0 };
    CHECK(spec_config_check(&off, err, sizeof err) == 0, "off: %s", err);
    CHECK(spec_config_check(&ok, err, sizeof err) == 0, "5 tokens 1..4: %s", err);
    const struct spec_config bad[] = { { -1, 1, 4, 0 }, { SPEC_MAX_TOKENS + 1, 1, 4, 0 }, { 5, 0, 4, 0 },
                                       { 5, 4, 3, 0 }, { 5, 1, SPEC_MAX_NGRAM + 1, 0 }, { 5, 1, 4, -1 } };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECK(spec_config_check(&bad[i], err, sizeof err) == ERR_RANGE && strstr(err, "speculative decoding"),
              "case %zu accepted (%s)", i, err);
    }
}

static int propose(const int32_t *t, int n, int lo, int hi, int k, int max, int32_t *out)
{
    struct spec_config c = { .num_tokens = k, .lookup_min = lo, .lookup_max = hi };
    return spec_ngram_propose(t, n, &c, max, out);
}

static void test_propose(void)
{
    int32_t out[SPEC_MAX_TOKENS];
    /* ... 1 2 3 [7 8 9] ... 1 2 3: the 3-gram "1 2 3" matched, what followed proposed */
    const int32_t a[] = { 1, 2, 3, 7, 8, 9, 4, 5, 1, 2, 3 };
    int n = propose(a, 11, 1, 3, 5, 5, out);
    CHECK(n == 5 && out[0] == 7 && out[1] == 8 && out[2] == 9 && out[3] == 4 && out[4] == 5, "n %d: %d %d %d", n,
          out[0], out[1], out[2]);
    CHECK(propose(a, 11, 1, 3, 5, 2, out) == 2 && out[1] == 8, "max_tokens 2");
    CHECK(propose(a, 11, 1, 3, 2, 5, out) == 2, "num_tokens 2");
    /* never past the context: the match right before the end leaves 1..k tokens */
    const int32_t b[] = { 5, 6, 9, 9, 5, 6 };
    n = propose(b, 6, 1, 2, 5, 5, out);
    CHECK(n == 4 && out[0] == 9 && out[1] == 9 && out[2] == 5 && out[3] == 6, "n %d", n);
    /* the longest match wins over a more recent shorter one */
    const int32_t c[] = { 1, 2, 3, 40, 41, 9, 3, 50, 1, 2, 3 };
    n = propose(c, 11, 1, 3, 2, 2, out);
    CHECK(n == 2 && out[0] == 40 && out[1] == 41, "longest: n %d, %d %d", n, out[0], out[1]);
    /* equally long: the most recent with max_tokens to follow */
    const int32_t d[] = { 7, 10, 11, 7, 20, 21, 7 };
    n = propose(d, 7, 1, 1, 2, 2, out);
    CHECK(n == 2 && out[0] == 20 && out[1] == 21, "most recent: n %d, %d %d", n, out[0], out[1]);
    /* a run: the occurrence right before the end is followed by one token, an earlier one by more */
    const int32_t e[] = { 3, 3, 3, 3, 3, 3 };
    n = propose(e, 6, 1, 2, 4, 4, out);
    CHECK(n == 4 && out[0] == 3 && out[3] == 3, "a run: n %d", n);
    /* below prompt_lookup_min: nothing */
    CHECK(propose(c, 11, 4, 4, 2, 2, out) == 0, "no 4-gram repeats");
    const int32_t f[] = { 1, 2, 3, 4 };
    CHECK(propose(f, 4, 1, 3, 5, 5, out) == 0, "no repeat at all");
    CHECK(propose(f, 1, 1, 3, 5, 5, out) == 0, "one token");
    CHECK(propose(a, 11, 1, 3, 0, 5, out) == 0, "off");
    CHECK(propose(a, 11, 1, 3, 5, 0, out) == 0, "no room");
    /* the match may start at position 0 (the suffix may not reach before it) */
    const int32_t g[] = { 8, 9, 1, 8, 9 };
    n = propose(g, 5, 2, 2, 3, 3, out);
    CHECK(n == 3 && out[0] == 1 && out[1] == 8 && out[2] == 9, "at the start: n %d", n);
}

int main(void)
{
    RUN(test_config);
    RUN(test_check);
    RUN(test_propose);
    return test_summary();
}

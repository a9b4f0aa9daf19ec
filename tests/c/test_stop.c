/* test_stop.c — unit tests for src/sampler/stop.c.
 *
 * Every case is checked against an independent reference computed on the whole text
 * (earliest-ending occurrence, longest among those ending together), fed in many ways:
 * whole, byte by byte, at every split point, at every pair of split points, and at random
 * splits. After every feed the harness also checks that what was emitted plus what is held
 * equals the text so far, and that the held bytes are exactly the longest suffix that is a
 * proper prefix of a stop string — nothing leaks, nothing is held without reason.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "sampler/stop.h"
#include "test.h"
#include "util/err.h"

/* Reference: bytes of text[0, n) to emit, and the stop index (-1 if none). */
static size_t ref_emit(const char *text, size_t n, const char *const *stops, int ns, int *which)
{
    *which = -1;
    for (size_t end = 1; end <= n; end++) { /* the first end position wins */
        size_t best_start = SIZE_MAX;
        for (int i = 0; i < ns; i++) {
            size_t l = strlen(stops[i]);
            if (l <= end && memcmp(text + end - l, stops[i], l) == 0 && end - l < best_start) {
                best_start = end - l;
                *which = i;
            }
        }
        if (*which >= 0)
            return best_start;
    }
    return n;
}

/* Reference hold: the longest suffix of text[0, n) that is a proper prefix of a stop. */
static size_t ref_hold(const char *text, size_t n, const char *const *stops, int ns)
{
    for (size_t k = n; k > 0; k--)
        for (int i = 0; i < ns; i++)
            if (strlen(stops[i]) > k && memcmp(text + n - k, stops[i], k) == 0)
                return k;
    return 0;
}

/* Feeds text cut at cuts[0, ncuts) (ascending offsets), then flushes if no stop; checks
 * the result and the per-feed invariants. Returns false on the first mismatch. */
static bool feed_split(const char *const *stops, int ns, const char *text, size_t n,
                       const size_t *cuts, int ncuts, const char *what)
{
    struct stop_matcher m;
    int rc = stop_init(&m, stops, ns);
    CHECK(rc == 0, "%s: init %d", what, rc);
    if (rc)
        return false;
    char emitted[4096], out[4096];
    size_t ne = 0, prev = 0;
    bool hit = false;
    for (int c = 0; c <= ncuts && !hit; c++) {
        size_t next = c < ncuts ? cuts[c] : n, n_out = 12345;
        rc = stop_feed(&m, text + prev, next - prev, out, sizeof out, &n_out);
        CHECK(rc == STOP_CONTINUE || rc == STOP_HIT, "%s: feed rc %d", what, rc);
        if (rc < 0)
            return false;
        memcpy(emitted + ne, out, n_out);
        ne += n_out;
        prev = next;
        if (rc == STOP_HIT) {
            hit = true;
            break;
        }
        size_t h = ref_hold(text, prev, stops, ns);
        if (ne + (size_t)m.n_hold != prev || (size_t)m.n_hold != h ||
            memcmp(emitted, text, ne) != 0) {
            CHECK(false, "%s: after %zu bytes emitted %zu held %d (want held %zu)", what, prev, ne,
                  m.n_hold, h);
            return false;
        }
    }
    if (!hit) {
        size_t n_out;
        rc = stop_flush(&m, out, sizeof out, &n_out);
        CHECK(rc == STOP_CONTINUE, "%s: flush rc %d", what, rc);
        memcpy(emitted + ne, out, n_out);
        ne += n_out;
    }
    int which;
    size_t want = ref_emit(text, n, stops, ns, &which);
    bool ok = ne == want && memcmp(emitted, text, ne) == 0 && stop_matched(&m) == which &&
              hit == (which >= 0);
    CHECK(ok, "%s: text '%.*s' emitted '%.*s' (stop %d), want '%.*s' (stop %d)", what, (int)n,
          text, (int)ne, emitted, stop_matched(&m), (int)want, text, which);
    return ok;
}

/* Whole, byte by byte, every single split, every pair of splits. */
static void check_all_splits(const char *const *stops, int ns, const char *text)
{
    size_t n = strlen(text), cuts[4096];
    bool ok = feed_split(stops, ns, text, n, NULL, 0, "whole");
    for (size_t i = 0; i < n; i++)
        cuts[i] = i + 1;
    ok = ok && feed_split(stops, ns, text, n, cuts, (int)n, "bytewise");
    for (size_t a = 0; a <= n && ok; a++) {
        cuts[0] = a;
        ok = feed_split(stops, ns, text, n, cuts, 1, "one split");
        for (size_t b = a; b <= n && ok && n <= 64; b++) {
            cuts[0] = a;
            cuts[1] = b;
            ok = feed_split(stops, ns, text, n, cuts, 2, "two splits");
        }
    }
}

static void test_stop_across_deltas(void)
{
    const char *s1[] = {"abc"};
    check_all_splits(s1, 1, "xxabcyy");
    check_all_splits(s1, 1, "abc");
    check_all_splits(s1, 1, "ab");
    check_all_splits(s1, 1, "the quick brown fox abc jumps abc");
    const char *s2[] = {"</answer>"};
    check_all_splits(s2, 1, "42 is <b>bold</b> and </answ</answer> trailing");
    /* the documented example: "ab" | "ab" | "c!" emits "" | "ab" | "" */
    struct stop_matcher m;
    char out[64];
    size_t n;
    stop_init(&m, s1, 1);
    CHECK(stop_feed(&m, "ab", 2, out, sizeof out, &n) == STOP_CONTINUE && n == 0, "first");
    CHECK(stop_feed(&m, "ab", 2, out, sizeof out, &n) == STOP_CONTINUE && n == 2 &&
              memcmp(out, "ab", 2) == 0, "second");
    CHECK(stop_feed(&m, "c!", 2, out, sizeof out, &n) == STOP_HIT && n == 0, "third");
    CHECK(stop_matched(&m) == 0, "matched");
    /* after the stop: nothing more, the stop is reported again */
    CHECK(stop_feed(&m, "zzz", 3, out, sizeof out, &n) == STOP_HIT && n == 0, "after stop");
    CHECK(stop_flush(&m, out, sizeof out, &n) == STOP_HIT && n == 0, "flush after stop");
}

static void test_overlapping_prefixes(void)
{
    const char *s1[] = {"abc"};
    check_all_splits(s1, 1, "abab");
    check_all_splits(s1, 1, "ababc");
    check_all_splits(s1, 1, "aababcab");
    const char *s2[] = {"aab"};
    check_all_splits(s2, 1, "aaaab");
    check_all_splits(s2, 1, "aaaa");
    const char *s3[] = {"abab"};
    check_all_splits(s3, 1, "abababab");
    check_all_splits(s3, 1, "abaabab");
    const char *s4[] = {"\n\nUser:"};
    check_all_splits(s4, 1, "Sure.\n\nUs\n\nUser: hi");
}

static void test_multiple_stops(void)
{
    const char *s[] = {"b", "ab"}; /* both end at the same byte: the longer one wins */
    check_all_splits(s, 2, "xab");
    const char *s2[] = {"cd", "bcde"}; /* "cd" ends first */
    check_all_splits(s2, 2, "abcde");
    const char *s3[] = {"bcde", "cd"};
    check_all_splits(s3, 2, "abcde");
    const char *s4[] = {"###", "END", "\n\n", "<|im_end|>"};
    check_all_splits(s4, 4, "one\ntwo ## E three<|im_end|>four END");
    check_all_splits(s4, 4, "aaa ENEND");
    check_all_splits(s4, 4, "no stop here at all ## EN <|im_end");
    const char *s5[] = {"abc", "abc"}; /* duplicates: the first index */
    check_all_splits(s5, 2, "zabc");
}

static void test_stop_at_start(void)
{
    const char *s[] = {"Hello"};
    check_all_splits(s, 1, "Hello world");
    check_all_splits(s, 1, "Hello");
    struct stop_matcher m;
    char out[64];
    size_t n = 99;
    stop_init(&m, s, 1);
    CHECK(stop_feed(&m, "Hello", 5, out, sizeof out, &n) == STOP_HIT && n == 0, "start");
    const char *one[] = {"x"};
    check_all_splits(one, 1, "x");
    check_all_splits(one, 1, "abx");
}

static void test_utf8_stops(void)
{
    const char *s[] = {"é", "🛑", "。\n"};
    check_all_splits(s, 3, "caf\xc3\xa8 then caf\xc3\xa9!");  /* è shares é's lead byte */
    check_all_splits(s, 3, "traffic 🚦 then 🛑 stop");     /* 🚦 and 🛑 share F0 9F */
    check_all_splits(s, 3, "中文。不是。\n后面");
    /* a held partial multibyte match starts on a character boundary */
    struct stop_matcher m;
    char out[64];
    size_t n;
    stop_init(&m, s, 3);
    CHECK(stop_feed(&m, "x\xf0\x9f", 3, out, sizeof out, &n) == STOP_CONTINUE && n == 1 &&
              m.n_hold == 2,
          "partial emoji held: n=%zu hold=%d", n, m.n_hold);
    CHECK(stop_feed(&m, "\x9a\xa6", 2, out, sizeof out, &n) == STOP_CONTINUE && n == 4 &&
              memcmp(out, "🚦", 4) == 0,
          "other emoji released whole");
}

static void test_no_false_holding(void)
{
    const char *s[] = {"xyz", "STOP"};
    struct stop_matcher m;
    char out[64];
    size_t n;
    stop_init(&m, s, 2);
    const char *deltas[] = {"hello", " wor", "ld ", "", "yx", "zSTO"};
    size_t want[] = {5, 4, 3, 0, 1, 2};
    int want_hold[] = {0, 0, 0, 0, 1, 3};
    for (int i = 0; i < 6; i++) {
        int rc = stop_feed(&m, deltas[i], strlen(deltas[i]), out, sizeof out, &n);
        CHECK(rc == STOP_CONTINUE && n == want[i] && m.n_hold == want_hold[i],
              "delta %d: rc %d n %zu hold %d", i, rc, n, m.n_hold);
    }
    /* no stop strings: everything passes straight through */
    stop_init(&m, NULL, 0);
    CHECK(stop_feed(&m, "abc", 3, out, sizeof out, &n) == STOP_CONTINUE && n == 3 &&
              m.n_hold == 0,
          "pass-through");
    CHECK(stop_flush(&m, out, sizeof out, &n) == STOP_CONTINUE && n == 0, "empty flush");
}

static void test_flush(void)
{
    const char *s[] = {"<end>"};
    struct stop_matcher m;
    char out[64];
    size_t n;
    stop_init(&m, s, 1);
    CHECK(stop_feed(&m, "answer <en", 10, out, sizeof out, &n) == STOP_CONTINUE && n == 7,
          "held '<en'");
    CHECK(stop_flush(&m, out, 2, &n) == ERR_RANGE, "small flush buffer");
    CHECK(stop_flush(&m, out, sizeof out, &n) == STOP_CONTINUE && n == 3 &&
              memcmp(out, "<en", 3) == 0,
          "flush emits the held bytes");
    CHECK(stop_flush(&m, out, sizeof out, &n) == STOP_CONTINUE && n == 0, "second flush");
    CHECK(stop_matched(&m) == -1, "no stop");
}

static void test_limits_and_errors(void)
{
    char err[ERR_BUF], long_stop[STOP_MAX_LEN + 2];
    memset(long_stop, 'a', sizeof long_stop);
    long_stop[STOP_MAX_LEN] = 0; /* exactly the maximum: accepted */
    const char *ok[] = {long_stop};
    struct stop_matcher m;
    CHECK(stop_init(&m, ok, 1) == 0, "256-byte stop rejected");
    /* a 255-byte prefix is held, then released by one byte that breaks it */
    char out[STOP_MAX_LEN + 64];
    size_t n;
    CHECK(stop_feed(&m, long_stop, STOP_MAX_LEN - 1, out, sizeof out, &n) == STOP_CONTINUE &&
              n == 0 && m.n_hold == STOP_MAX_LEN - 1,
          "hold 255");
    CHECK(stop_feed(&m, "b", 1, out, 100, &n) == ERR_RANGE, "out_cap < hold + len");
    CHECK(stop_feed(&m, "b", 1, out, sizeof out, &n) == STOP_CONTINUE && n == STOP_MAX_LEN,
          "release 256");
    CHECK(stop_feed(&m, long_stop, STOP_MAX_LEN, out, sizeof out, &n) == STOP_HIT && n == 0,
          "256-byte match");

    long_stop[STOP_MAX_LEN] = 'a';
    long_stop[STOP_MAX_LEN + 1] = 0;
    const char *too_long[] = {"fine", long_stop};
    CHECK(stop_validate(too_long, 2, err, sizeof err) == ERR_RANGE && strstr(err, "stop[1]"),
          "257 bytes: %s", err);
    CHECK(stop_init(&m, too_long, 2) == ERR_RANGE, "init 257 bytes");
    const char *five[] = {"a", "b", "c", "d", "e"};
    CHECK(stop_validate(five, 5, err, sizeof err) == ERR_RANGE, "5 stops");
    CHECK(stop_validate(five, -1, err, sizeof err) == ERR_RANGE, "n < 0");
    const char *empty[] = {"a", ""};
    CHECK(stop_validate(empty, 2, err, sizeof err) == ERR_INVALID && strstr(err, "empty"),
          "empty stop: %s", err);
    const char *null[] = {NULL};
    CHECK(stop_validate(null, 1, err, sizeof err) == ERR_INVALID, "NULL stop");
    CHECK(stop_validate(NULL, 1, err, sizeof err) == ERR_INVALID, "NULL list");
    const char *bad_utf8[][1] = {{"\xff"}, {"ab\xc3"}, {"\xc0\xaf"}, {"\xed\xa0\x80"},
                                 {"\xf4\x90\x80\x80"}, {"\x80x"}};
    for (size_t i = 0; i < sizeof bad_utf8 / sizeof bad_utf8[0]; i++)
        CHECK(stop_validate(bad_utf8[i], 1, err, sizeof err) == ERR_INVALID, "bad UTF-8 #%zu", i);
    const char *good_utf8[] = {"é", "中", "🛑", "\x7f"};
    CHECK(stop_validate(good_utf8, 4, err, sizeof err) == 0, "good UTF-8: %s", err);
    CHECK(stop_init(&m, five, 4) == 0, "4 stops");
    CHECK(stop_feed(&m, NULL, 1, out, sizeof out, &n) == ERR_INVALID, "NULL delta");
    CHECK(stop_feed(&m, NULL, 0, out, sizeof out, &n) == STOP_CONTINUE && n == 0, "empty delta");
}

/* Random texts over a small alphabet (so stops and near-misses are frequent), random stop
 * sets, random splits, against the reference. */
static void test_random(void)
{
    uint64_t x = 12345;
    char text[200], stops_buf[4][8];
    const char *stops[4];
    size_t cuts[200];
    int failures = 0;
    for (int iter = 0; iter < 4000 && failures == 0; iter++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int ns = 1 + (int)((x >> 33) % 4);
        for (int i = 0; i < ns; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            int len = 1 + (int)((x >> 33) % 5);
            for (int j = 0; j < len; j++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                stops_buf[i][j] = "abc"[(x >> 33) % 3];
            }
            stops_buf[i][len] = 0;
            stops[i] = stops_buf[i];
        }
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        size_t n = (x >> 33) % 60;
        for (size_t j = 0; j < n; j++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            text[j] = "abcd"[(x >> 33) % 4];
        }
        text[n] = 0;
        int ncuts = 0;
        for (size_t j = 0; j < n; j++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            if ((x >> 33) % 3 == 0)
                cuts[ncuts++] = j;
        }
        if (!feed_split(stops, ns, text, n, cuts, ncuts, "random"))
            failures++;
    }
}

int main(void)
{
    RUN(test_stop_across_deltas);
    RUN(test_overlapping_prefixes);
    RUN(test_multiple_stops);
    RUN(test_stop_at_start);
    RUN(test_utf8_stops);
    RUN(test_no_false_holding);
    RUN(test_flush);
    RUN(test_limits_and_errors);
    RUN(test_random);
    return test_summary();
}

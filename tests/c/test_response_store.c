/* test_response_store.c — the Responses API's store (src/api/response_store.h): copies
 * in and out, replacing an id, deleting, the byte budget (oldest entries go first; an
 * entry larger than the budget is refused and drops nothing), thousands of ids sharing
 * buckets, and threads putting, reading and deleting at once.
 */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include "api/response_store.h"
#include "util/err.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Whether id's entry holds exactly response and items. */
static bool holds(struct resp_store *s, const char *id, const char *response, const char *items)
{
    char *r = NULL, *t = NULL;
    int rc = resp_store_get(s, id, &r, &t);
    bool ok = rc == 0 && r && t && !strcmp(r, response) && !strcmp(t, items);
    free(r);
    free(t);
    return ok;
}

static bool absent(struct resp_store *s, const char *id)
{
    char *r = (char *)"x";
    int rc = resp_store_get(s, id, &r, NULL);
    bool gone = rc == ERR_NOT_FOUND && r == NULL;
    if (rc == 0) free(r);
    return gone;
}

static void test_put_get_delete(void)
{
    struct resp_store *s = resp_store_create(1 << 20);
    CHECK(s != NULL, "create");
    if (!s) return;
    char resp[] = "{\"id\":\"resp_a\"}", items[] = "[{\"role\":\"user\",\"content\":\"hi\"}]";
    CHECK(resp_store_put(s, "resp_a", resp, items) == 0, "put");
    resp[2] = 'X'; /* the store kept its own copy */
    CHECK(holds(s, "resp_a", "{\"id\":\"resp_a\"}", "[{\"role\":\"user\",\"content\":\"hi\"}]"), "get");
    CHECK(absent(s, "resp_b") && absent(s, "resp_") && absent(s, ""), "unknown ids");
    char *only = NULL;
    CHECK(resp_store_get(s, "resp_a", NULL, &only) == 0 && only && !strcmp(only, items), "items alone");
    free(only);

    int n;
    size_t bytes, one;
    resp_store_usage(s, &n, &one);
    CHECK(n == 1 && one > strlen(resp) + strlen(items), "usage %d %zu", n, one);
    CHECK(resp_store_put(s, "resp_a", "{\"v\":2}", "[]") == 0, "replace");
    resp_store_usage(s, &n, &bytes);
    CHECK(n == 1 && bytes < one, "a replaced entry is counted once: %d entries, %zu bytes", n, bytes);
    CHECK(holds(s, "resp_a", "{\"v\":2}", "[]"), "replaced texts");

    CHECK(resp_store_delete(s, "resp_a") == 0, "delete");
    CHECK(resp_store_delete(s, "resp_a") == ERR_NOT_FOUND, "deleted twice");
    CHECK(absent(s, "resp_a"), "gone after delete");
    resp_store_usage(s, &n, &bytes);
    CHECK(n == 0 && bytes == 0, "empty: %d entries, %zu bytes", n, bytes);
    resp_store_free(s);
}

/* The budget: entries of ~1 KiB in a 4 KiB store; the oldest go first, a replaced entry
 * becomes the newest, and an entry over the whole budget is refused without evicting. */
static void test_budget(void)
{
    struct resp_store *s = resp_store_create(4096);
    if (!s) {
        CHECK(0, "create");
        return;
    }
    char big[1001];
    memset(big, 'a', 1000);
    big[1000] = '\0';
    char id[32];
    for (int i = 0; i < 6; i++) {
        snprintf(id, sizeof id, "resp_%d", i);
        CHECK(resp_store_put(s, id, big, "[]") == 0, "put %d", i);
    }
    int n;
    size_t bytes;
    resp_store_usage(s, &n, &bytes);
    CHECK(n == 3 && bytes <= 4096, "%d entries, %zu bytes", n, bytes);
    CHECK(absent(s, "resp_0") && absent(s, "resp_1") && absent(s, "resp_2"), "the oldest were dropped");
    CHECK(holds(s, "resp_3", big, "[]") && holds(s, "resp_5", big, "[]"), "the newest stay");

    CHECK(resp_store_put(s, "resp_3", big, "[1]") == 0, "replace the oldest");
    CHECK(resp_store_put(s, "resp_6", big, "[]") == 0, "one more");
    CHECK(absent(s, "resp_4") && holds(s, "resp_3", big, "[1]"), "the replaced entry counts as new");

    char *huge = malloc(5000);
    if (huge) {
        memset(huge, 'b', 4999);
        huge[4999] = '\0';
        CHECK(resp_store_put(s, "resp_huge", huge, "[]") == ERR_RANGE, "over the budget");
        free(huge);
    }
    resp_store_usage(s, &n, &bytes);
    CHECK(n == 3 && absent(s, "resp_huge") && holds(s, "resp_5", big, "[]"), "a refused entry drops nothing");
    resp_store_free(s);
}

/* Replacing ids while the budget evicts from the same short chains (64 buckets, ~40
 * entries fit): every entry the store counts is found, and only those. */
static void test_churn(void)
{
    struct resp_store *s = resp_store_create(4096);
    if (!s) {
        CHECK(0, "create");
        return;
    }
    char id[32];
    uint64_t x = 12345;
    for (int i = 0; i < 3000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        snprintf(id, sizeof id, "resp_%d", (int)(x >> 33) % 200);
        CHECK(resp_store_put(s, id, "{}", "[]") == 0, "put %d", i);
    }
    int n, found = 0;
    resp_store_usage(s, &n, NULL);
    for (int k = 0; k < 200; k++) {
        snprintf(id, sizeof id, "resp_%d", k);
        found += !absent(s, id);
    }
    CHECK(found == n && n > 20, "%d entries found, %d counted", found, n);
    resp_store_free(s);
}

/* 5,000 ids in the smallest table (64 buckets): every one found, deletes in the middle of
 * chains keep the others. */
static void test_many_ids(void)
{
    struct resp_store *s = resp_store_create(16 << 20);
    if (!s) {
        CHECK(0, "create");
        return;
    }
    char id[32], text[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(id, sizeof id, "resp_%08d", i);
        snprintf(text, sizeof text, "{\"n\":%d}", i);
        CHECK(resp_store_put(s, id, text, "[]") == 0, "put %d", i);
    }
    for (int i = 0; i < 5000; i += 2) {
        snprintf(id, sizeof id, "resp_%08d", i);
        CHECK(resp_store_delete(s, id) == 0, "delete %d", i);
    }
    int bad = 0;
    for (int i = 0; i < 5000; i++) {
        snprintf(id, sizeof id, "resp_%08d", i);
        snprintf(text, sizeof text, "{\"n\":%d}", i);
        if (i % 2 ? !holds(s, id, text, "[]") : !absent(s, id)) bad++;
    }
    int n;
    resp_store_usage(s, &n, NULL);
    CHECK(bad == 0 && n == 2500, "%d wrong lookups, %d entries", bad, n);
    resp_store_free(s);
}

struct worker {
    struct resp_store *s;
    int index;
    int bad;
};

/* Puts, reads back and deletes its own ids, and overwrites one shared id. */
static void *worker_main(void *arg)
{
    struct worker *w = arg;
    char id[32], text[64];
    for (int i = 0; i < 2000; i++) {
        snprintf(id, sizeof id, "resp_w%d_%d", w->index, i);
        snprintf(text, sizeof text, "{\"w\":%d,\"i\":%d}", w->index, i);
        if (resp_store_put(w->s, id, text, "[]") || resp_store_put(w->s, "resp_shared", text, "[]")) w->bad++;
        char *r = NULL;
        int rc = resp_store_get(w->s, id, &r, NULL);
        /* the budget may have pushed it out already, never changed it */
        if (rc == 0 ? strcmp(r, text) != 0 : rc != ERR_NOT_FOUND) w->bad++;
        free(r);
        if (i % 3 == 0 && (rc = resp_store_delete(w->s, id)) && rc != ERR_NOT_FOUND) w->bad++;
    }
    return NULL;
}

static void test_threads(void)
{
    struct resp_store *s = resp_store_create(64 << 10); /* small: evictions happen throughout */
    if (!s) {
        CHECK(0, "create");
        return;
    }
    struct worker w[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct worker){ .s = s, .index = i };
        CHECK(pthread_create(&t[i], NULL, worker_main, &w[i]) == 0, "thread %d", i);
    }
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 4; i++) CHECK(w[i].bad == 0, "worker %d: %d bad results", i, w[i].bad);
    int n;
    size_t bytes;
    resp_store_usage(s, &n, &bytes);
    CHECK(n > 0 && bytes <= (64 << 10), "%d entries, %zu bytes", n, bytes);
    char *r = NULL;
    CHECK(resp_store_get(s, "resp_shared", &r, NULL) == 0 && r && strstr(r, "\"i\":1999"), "the last write of "
          "the shared id wins: %s", r ? r : "(none)");
    free(r);
    resp_store_free(s);
}

int main(void)
{
    RUN(test_put_get_delete);
    RUN(test_budget);
    RUN(test_churn);
    RUN(test_many_ids);
    RUN(test_threads);
    return test_summary();
}

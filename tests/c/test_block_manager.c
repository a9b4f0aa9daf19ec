/* test_block_manager.c — unit tests for src/engine/block_manager.c.
 *
 * Operation-by-operation tests (allocation, slots, prefix hits across sequences, salts,
 * partial and fully cached prompts, LRU eviction order, refcounts, duplicate commits),
 * SipHash-2-4 reference vectors, a forced-collision test, and a randomized scheduler
 * simulation that after every operation checks the manager's invariants against the
 * test's own model, including a shadow KV cache: every written slot records which prefix
 * produced it, so a wrong prefix hit or a write into a shared block is caught.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/block_manager.h"
#include "test.h"
#include "util/err.h"

static const uint8_t KEY[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

static void check_ok(struct block_manager *bm, const char *where)
{
    char err[ERR_BUF] = "";
    int rc = bm_check(bm, err, sizeof err);
    CHECK(rc == 0, "%s: %s", where, err);
}

/* ---- SipHash ------------------------------------------------------------------------- */

static void test_siphash_vectors(void)
{
    /* reference vectors: key 00..0f, message 00..(len-1) (SipHash paper, appendix A) */
    uint8_t msg[64];
    for (int i = 0; i < 64; i++) msg[i] = (uint8_t)i;
    CHECK(bm_siphash24(KEY, msg, 0) == 0x726fdb47dd0e0e31ULL, "len 0: %016llx",
          (unsigned long long)bm_siphash24(KEY, msg, 0));
    CHECK(bm_siphash24(KEY, msg, 8) == 0x93f5f5799a932462ULL, "len 8: %016llx",
          (unsigned long long)bm_siphash24(KEY, msg, 8));
    CHECK(bm_siphash24(KEY, msg, 15) == 0xa129ca6149be45e5ULL, "len 15: %016llx",
          (unsigned long long)bm_siphash24(KEY, msg, 15));
    uint8_t key2[16];
    memcpy(key2, KEY, 16);
    key2[0] ^= 1;
    CHECK(bm_siphash24(key2, msg, 15) != bm_siphash24(KEY, msg, 15), "key must matter");
}

/* ---- basic operations ---------------------------------------------------------------- */

static void test_create_errors(void)
{
    struct block_manager *bm = NULL;
    char err[ERR_BUF];
    CHECK(bm_create(&bm, 0, 16, true, KEY, err, sizeof err) == ERR_INVALID, "0 blocks");
    CHECK(bm_create(&bm, 8, 0, true, KEY, err, sizeof err) == ERR_INVALID, "block_size 0");
    CHECK(bm_create(&bm, 8, 4, true, NULL, err, sizeof err) == ERR_INVALID, "no key");
    CHECK(bm == NULL, "out stays NULL");
    CHECK(bm_create(&bm, 8, 4, true, KEY, err, sizeof err) == 0, "%s", err);
    struct bm_seq *s = NULL;
    CHECK(bm_seq_create(bm, 33, NULL, 0, &s, err, sizeof err) == ERR_RANGE, "33 > 8*4");
    CHECK(bm_seq_create(bm, 0, NULL, 0, &s, err, sizeof err) == ERR_RANGE, "0 tokens");
    char salt[BM_SALT_MAX + 1] = {0};
    CHECK(bm_seq_create(bm, 8, salt, sizeof salt, &s, err, sizeof err) == ERR_INVALID,
          "salt too long");
    CHECK(bm_seq_create(bm, 32, NULL, 0, &s, err, sizeof err) == 0, "%s", err);
    bm_seq_free(bm, s);
    bm_free(bm);
}

static void test_alloc_append_release(void)
{
    struct block_manager *bm;
    struct bm_seq *s;
    char err[ERR_BUF];
    int32_t prompt[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    CHECK(bm_create(&bm, 5, 4, false, KEY, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_create(bm, 20, NULL, 0, &s, err, sizeof err) == 0, "%s", err);
    int64_t nc = -1;
    CHECK(bm_seq_alloc_prompt(bm, s, prompt, 10, &nc, err, sizeof err) == 0, "%s", err);
    CHECK(nc == 0 && bm_seq_num_tokens(s) == 0, "no caching: nc %lld", (long long)nc);
    CHECK(bm_seq_alloc_prompt(bm, s, prompt, 10, &nc, err, sizeof err) == 0, "empty again ok");
    CHECK(bm_seq_append_slots(bm, s, 10, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_alloc_prompt(bm, s, prompt, 10, &nc, err, sizeof err) == ERR_INVALID,
          "non-empty sequence");
    int nb = 0;
    const int32_t *bt = bm_seq_block_table(s, &nb);
    CHECK(nb == 3 && bt[0] == 0 && bt[1] == 1 && bt[2] == 2, "table %d: %d %d %d", nb, bt[0],
          bt[1], bt[2]);
    int64_t slots[10];
    CHECK(bm_seq_slot_mapping(bm, s, 0, 10, slots, err, sizeof err) == 0, "%s", err);
    for (int p = 0; p < 10; p++)
        CHECK(slots[p] == (int64_t)bt[p / 4] * 4 + p % 4, "slot %d = %lld", p,
              (long long)slots[p]);
    CHECK(bm_seq_slot_mapping(bm, s, 8, 3, slots, err, sizeof err) == ERR_RANGE,
          "position 10 has no slot");
    CHECK(bm_seq_commit(bm, s, prompt, 10, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_commit(bm, s, prompt, 9, err, sizeof err) == ERR_INVALID, "backwards");
    CHECK(bm_seq_commit(bm, s, prompt, 11, err, sizeof err) == ERR_INVALID, "past slots");
    /* decode: positions 10, 11 fit the third block, 12 needs a fourth */
    CHECK(bm_seq_append_slots(bm, s, 1, err, sizeof err) == 0 &&
              bm_seq_append_slots(bm, s, 1, err, sizeof err) == 0,
          "%s", err);
    bm_seq_block_table(s, &nb);
    CHECK(nb == 3, "still 3 blocks: %d", nb);
    CHECK(bm_seq_append_slots(bm, s, 1, err, sizeof err) == 0, "%s", err);
    bm_seq_block_table(s, &nb);
    CHECK(nb == 4 && bm_seq_num_tokens(s) == 13, "4 blocks: %d", nb);
    struct bm_stats st;
    bm_get_stats(bm, &st);
    CHECK(st.num_used == 4 && st.num_free == 1 && st.num_cached == 0, "used %d free %d",
          st.num_used, st.num_free);
    /* 8 more tokens need 2 blocks, 1 is free: refused without change */
    CHECK(!bm_seq_can_append(bm, s, 8), "8 should not fit");
    CHECK(bm_seq_append_slots(bm, s, 8, err, sizeof err) == ERR_RANGE, "8 refused");
    CHECK(bm_seq_num_tokens(s) == 13, "unchanged");
    CHECK(bm_seq_append_slots(bm, s, 7, err, sizeof err) == 0, "%s", err); /* 20 = max */
    CHECK(bm_seq_append_slots(bm, s, 1, err, sizeof err) == ERR_RANGE, "past max_tokens");
    check_ok(bm, "full");
    bm_seq_release(bm, s);
    bm_get_stats(bm, &st);
    CHECK(st.num_free == 5 && st.num_used == 0, "all free: %d", st.num_free);
    CHECK(bm_seq_num_tokens(s) == 0 && bm_seq_num_computed(s) == 0, "reset");
    check_ok(bm, "released");
    bm_seq_free(bm, s);
    bm_free(bm);
}

/* Speculative rows not kept: their slots go back, emptied blocks return to the free list,
 * the committed and cached blocks stay. */
static void test_truncate(void)
{
    struct block_manager *bm;
    struct bm_seq *s;
    char err[ERR_BUF];
    int32_t tokens[16];
    for (int i = 0; i < 16; i++) tokens[i] = 100 + i;
    CHECK(bm_create(&bm, 6, 4, true, KEY, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_create(bm, 24, NULL, 0, &s, err, sizeof err) == 0, "%s", err);
    int64_t nc;
    CHECK(bm_seq_alloc_prompt(bm, s, tokens, 6, &nc, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_append_slots(bm, s, 6, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_commit(bm, s, tokens, 5, err, sizeof err) == 0, "%s", err); /* 1 full block cached */
    /* a step of 6 rows (positions 5..10: the last token and 5 proposals): blocks 2 and 3 */
    CHECK(bm_seq_append_slots(bm, s, 5, err, sizeof err) == 0, "%s", err);
    int nb;
    bm_seq_block_table(s, &nb);
    CHECK(nb == 3 && bm_seq_num_tokens(s) == 11, "%d blocks, %lld tokens", nb, (long long)bm_seq_num_tokens(s));
    CHECK(bm_seq_truncate(bm, s, 4, err, sizeof err) == ERR_INVALID, "below the computed 5");
    CHECK(bm_seq_truncate(bm, s, 12, err, sizeof err) == ERR_INVALID, "above the 11 slots");
    CHECK(bm_seq_num_tokens(s) == 11, "unchanged after refusals");
    /* two rows kept: positions 5, 6; the third block holds none of them any more */
    CHECK(bm_seq_truncate(bm, s, 7, err, sizeof err) == 0, "%s", err);
    bm_seq_block_table(s, &nb);
    struct bm_stats st;
    bm_get_stats(bm, &st);
    CHECK(nb == 2 && bm_seq_num_tokens(s) == 7, "%d blocks, %lld tokens", nb, (long long)bm_seq_num_tokens(s));
    CHECK(st.num_used == 2 && st.num_free == 4 && st.num_cached == 1, "used %d free %d cached %d", st.num_used,
          st.num_free, st.num_cached);
    check_ok(bm, "truncated");
    CHECK(bm_seq_commit(bm, s, tokens, 7, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_truncate(bm, s, 7, err, sizeof err) == 0, "to itself");
    /* the next step's slots continue at position 7 */
    CHECK(bm_seq_append_slots(bm, s, 2, err, sizeof err) == 0, "%s", err);
    int64_t slots[2];
    const int32_t *bt = bm_seq_block_table(s, &nb);
    CHECK(bm_seq_slot_mapping(bm, s, 7, 2, slots, err, sizeof err) == 0 && slots[0] == (int64_t)bt[1] * 4 + 3 &&
              slots[1] == (int64_t)bt[2] * 4,
          "slots %lld %lld", (long long)slots[0], (long long)slots[1]);
    check_ok(bm, "appended again");
    bm_seq_free(bm, s);
    bm_get_stats(bm, &st);
    CHECK(st.num_used == 0 && st.num_free + st.num_cached_idle == 6, "free %d idle %d", st.num_free,
          st.num_cached_idle);
    bm_free(bm);
}

/* A sequence on tokens[0, n): alloc_prompt, slots for the rest, commit all. */
static struct bm_seq *run_prompt(struct block_manager *bm, const int32_t *tokens, int64_t n,
                                 const char *salt, int64_t *n_cached)
{
    struct bm_seq *s = NULL;
    char err[ERR_BUF] = "";
    int rc = bm_seq_create(bm, n + 1, salt, salt ? strlen(salt) : 0, &s, err, sizeof err);
    CHECK(rc == 0, "%s", err);
    if (rc) return NULL;
    int64_t nc = -1;
    CHECK(bm_seq_alloc_prompt(bm, s, tokens, n, &nc, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_append_slots(bm, s, n - bm_seq_num_computed(s), err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_commit(bm, s, tokens, n, err, sizeof err) == 0, "%s", err);
    if (n_cached) *n_cached = nc;
    return s;
}

static void test_prefix_hits(void)
{
    struct block_manager *bm;
    char err[ERR_BUF];
    CHECK(bm_create(&bm, 32, 4, true, KEY, err, sizeof err) == 0, "%s", err);
    int32_t p[14] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    int64_t nc;
    struct bm_seq *a = run_prompt(bm, p, 14, NULL, &nc);
    CHECK(nc == 0, "cold cache: %lld", (long long)nc);
    struct bm_stats st;
    bm_get_stats(bm, &st);
    CHECK(st.num_cached == 3 && st.num_used == 4, "3 full blocks cached: %d", st.num_cached);

    /* same prompt: 3 full blocks shared, partial last block private */
    struct bm_seq *b = run_prompt(bm, p, 14, NULL, &nc);
    CHECK(nc == 12, "same prompt hits 12: %lld", (long long)nc);
    int na, nb;
    const int32_t *ta = bm_seq_block_table(a, &na), *tb = bm_seq_block_table(b, &nb);
    CHECK(na == 4 && nb == 4, "%d %d", na, nb);
    for (int i = 0; i < 3; i++) {
        CHECK(ta[i] == tb[i], "block %d shared", i);
        CHECK(bm_block_refcount(bm, ta[i]) == 2, "refcount %d", bm_block_refcount(bm, ta[i]));
    }
    CHECK(ta[3] != tb[3], "partial last block not shared");
    CHECK(bm_block_refcount(bm, tb[3]) == 1, "private block refcount 1");

    /* shared prefix of 2 full blocks, then different */
    int32_t q[14];
    memcpy(q, p, sizeof q);
    q[9] = 99;
    struct bm_seq *c = run_prompt(bm, q, 14, NULL, &nc);
    CHECK(nc == 8, "2 blocks hit: %lld", (long long)nc);
    int ncb;
    const int32_t *tc = bm_seq_block_table(c, &ncb);
    CHECK(tc[0] == ta[0] && tc[1] == ta[1] && tc[2] != ta[2], "k = 2 shared");
    CHECK(bm_block_refcount(bm, ta[0]) == 3 && bm_block_refcount(bm, ta[2]) == 2, "refs");

    /* a different first block hides the rest even if later blocks are equal */
    int32_t r[14];
    memcpy(r, p, sizeof r);
    r[0] = 77;
    struct bm_seq *d = run_prompt(bm, r, 14, NULL, &nc);
    CHECK(nc == 0, "parent differs: %lld", (long long)nc);

    bm_get_stats(bm, &st);
    CHECK(st.query_tokens == 56 && st.hit_tokens == 20, "queries %llu hits %llu",
          (unsigned long long)st.query_tokens, (unsigned long long)st.hit_tokens);
    check_ok(bm, "prefix");
    bm_seq_free(bm, a);
    CHECK(bm_block_refcount(bm, tb[0]) == 2, "after freeing a");
    bm_seq_free(bm, b);
    bm_seq_free(bm, c);
    bm_seq_free(bm, d);
    bm_get_stats(bm, &st);
    CHECK(st.num_used == 0 && st.num_cached_idle == st.num_cached && st.num_cached > 0,
          "all idle: used %d", st.num_used);
    CHECK(st.num_free + st.num_cached_idle == 32, "free %d idle %d", st.num_free,
          st.num_cached_idle);
    /* idle cached blocks are still hit after everyone left */
    struct bm_seq *e = run_prompt(bm, p, 14, NULL, &nc);
    CHECK(nc == 12, "idle blocks reused: %lld", (long long)nc);
    check_ok(bm, "reuse");
    bm_seq_free(bm, e);
    bm_free(bm);
}

static void test_salt_separation(void)
{
    struct block_manager *bm;
    char err[ERR_BUF];
    CHECK(bm_create(&bm, 32, 4, true, KEY, err, sizeof err) == 0, "%s", err);
    int32_t p[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    int64_t nc;
    struct bm_seq *a = run_prompt(bm, p, 9, "tenant-a", &nc);
    struct bm_seq *b = run_prompt(bm, p, 9, "tenant-b", &nc);
    CHECK(nc == 0, "different salt: %lld", (long long)nc);
    struct bm_seq *c = run_prompt(bm, p, 9, NULL, &nc);
    CHECK(nc == 0, "no salt vs salt: %lld", (long long)nc);
    struct bm_seq *d = run_prompt(bm, p, 9, "tenant-a", &nc);
    CHECK(nc == 8, "same salt shares: %lld", (long long)nc);
    struct bm_seq *e = run_prompt(bm, p, 9, "tenant-a2", &nc);
    CHECK(nc == 0, "salt prefix is not the salt: %lld", (long long)nc);
    int64_t ncq = -1;
    CHECK(bm_can_allocate(bm, p, 9, "tenant-b", 8, 9, &ncq, NULL) && ncq == 8,
          "can_allocate sees salt b: %lld", (long long)ncq);
    check_ok(bm, "salt");
    bm_seq_free(bm, a);
    bm_seq_free(bm, b);
    bm_seq_free(bm, c);
    bm_seq_free(bm, d);
    bm_seq_free(bm, e);
    bm_free(bm);
}

static void test_partial_and_full_hit(void)
{
    struct block_manager *bm;
    char err[ERR_BUF];
    CHECK(bm_create(&bm, 32, 4, true, KEY, err, sizeof err) == 0, "%s", err);
    int32_t p[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    int64_t nc;
    /* 6 tokens: the partial second block is never cached, so never hit */
    struct bm_seq *a = run_prompt(bm, p, 6, NULL, &nc);
    struct bm_seq *b = run_prompt(bm, p, 6, NULL, &nc);
    CHECK(nc == 4, "only the full block: %lld", (long long)nc);
    int n;
    const int32_t *ta = bm_seq_block_table(a, &n), *tb = bm_seq_block_table(b, &n);
    CHECK(ta[1] != tb[1] && bm_block_cached_tokens(bm, ta[1]) == NULL, "partial private");
    bm_seq_free(bm, a);
    bm_seq_free(bm, b);

    /* 8 tokens = 2 full blocks: the first block was cached by a and b */
    struct bm_seq *c = run_prompt(bm, p, 8, NULL, &nc);
    CHECK(nc == 4, "first: %lld", (long long)nc);
    /* now both are cached: a full hit takes both, nothing new */
    struct bm_seq *d = run_prompt(bm, p, 8, NULL, &nc);
    CHECK(nc == 8, "full hit: %lld", (long long)nc);
    int64_t q = -1;
    int nnew = -1;
    CHECK(bm_can_allocate(bm, p, 8, NULL, 0, 8, &q, &nnew) && q == 8 && nnew == 0,
          "can_allocate %lld %d", (long long)q, nnew);
    CHECK(bm_can_allocate(bm, p, 8, NULL, 0, 9, &q, &nnew) && q == 8 && nnew == 1,
          "can_allocate one more %lld %d", (long long)q, nnew);
    struct bm_seq *e = run_prompt(bm, p, 9, NULL, &nc);
    CHECK(nc == 8, "one more token: both blocks hit: %lld", (long long)nc);
    struct bm_seq *f = run_prompt(bm, p, 4, NULL, &nc);
    CHECK(nc == 4, "a one-block prompt hits in full too: %lld", (long long)nc);
    check_ok(bm, "full hit");
    bm_seq_free(bm, c);
    bm_seq_free(bm, d);
    bm_seq_free(bm, e);
    bm_seq_free(bm, f);
    bm_free(bm);
}

/* bm_seq_limit_lookup: the cache serves at most the first n tokens' full blocks (prompt
 * logprobs need the positions after them computed); the blocks are still committed. */
static void test_limit_lookup(void)
{
    struct block_manager *bm;
    char err[ERR_BUF];
    CHECK(bm_create(&bm, 32, 4, true, KEY, err, sizeof err) == 0, "%s", err);
    int32_t p[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    int64_t nc;
    struct bm_seq *a = run_prompt(bm, p, 9, NULL, &nc); /* caches blocks [1-4] and [5-8] */
    int limits[5] = { 0, 3, 4, 7, 8 }, want[5] = { 0, 0, 4, 4, 8 };
    for (int i = 0; i < 5; i++) {
        struct bm_seq *b;
        CHECK(bm_seq_create(bm, 16, NULL, 0, &b, err, sizeof err) == 0, "%s", err);
        bm_seq_limit_lookup(b, limits[i]);
        CHECK(bm_seq_alloc_prompt(bm, b, p, 9, &nc, err, sizeof err) == 0 && nc == want[i],
              "limit %d: %lld cached, want %d", limits[i], (long long)nc, want[i]);
        bm_seq_free(bm, b);
    }
    check_ok(bm, "limited lookups");
    bm_seq_free(bm, a);
    bm_free(bm);
}

/* A block-aligned prompt whose blocks are all cached: every block is taken (refcount++),
 * only position n - 1 is left to forward and its slot is -1 (its KV is in the shared
 * block); commit adds nothing to the cache; the first generated token starts a fresh
 * block; freeing gives every block back. */
static void test_full_hit_last_token(void)
{
    struct block_manager *bm;
    char err[ERR_BUF];
    CHECK(bm_create(&bm, 16, 4, true, KEY, err, sizeof err) == 0, "%s", err);
    int32_t p[13] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
    int64_t nc = -1;
    struct bm_seq *a = run_prompt(bm, p, 12, NULL, &nc); /* computes and caches 3 blocks */
    CHECK(nc == 0, "cold: %lld", (long long)nc);
    int na;
    const int32_t *ta = bm_seq_block_table(a, &na);
    int32_t a_blocks[3] = {ta[0], ta[1], ta[2]};
    struct bm_stats st0, st;
    bm_get_stats(bm, &st0);
    CHECK(st0.num_cached == 3 && st0.num_free == 13, "cached %d free %d", st0.num_cached,
          st0.num_free);

    int64_t q = -1;
    int nnew = -1;
    CHECK(bm_can_allocate(bm, p, 12, NULL, 0, 12, &q, &nnew) && q == 12 && nnew == 0,
          "can_allocate: %lld cached, %d new blocks", (long long)q, nnew);
    struct bm_seq *b = NULL;
    CHECK(bm_seq_create(bm, 13, NULL, 0, &b, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_alloc_prompt(bm, b, p, 12, &nc, err, sizeof err) == 0, "%s", err);
    CHECK(nc == 12, "full hit: %lld cached", (long long)nc);
    CHECK(bm_seq_num_computed(b) == 11 && bm_seq_num_tokens(b) == 11 &&
          bm_seq_num_cached(b) == 12, "computed %lld tokens %lld cached %lld",
          (long long)bm_seq_num_computed(b), (long long)bm_seq_num_tokens(b),
          (long long)bm_seq_num_cached(b));
    int nb;
    const int32_t *tb = bm_seq_block_table(b, &nb);
    CHECK(nb == 3, "%d blocks", nb);
    for (int i = 0; i < 3 && i < nb; i++) {
        CHECK(tb[i] == a_blocks[i], "block %d: %d, a has %d", i, tb[i], a_blocks[i]);
        CHECK(bm_block_refcount(bm, tb[i]) == 2, "block %d refcount %d", i,
              bm_block_refcount(bm, tb[i]));
    }
    bm_get_stats(bm, &st);
    CHECK(st.num_free == st0.num_free && st.num_used == st0.num_used,
          "a full hit takes no block: free %d used %d", st.num_free, st.num_used);
    CHECK(st.hit_tokens - st0.hit_tokens == 12 && st.query_tokens - st0.query_tokens == 12,
          "hit %llu of %llu", (unsigned long long)(st.hit_tokens - st0.hit_tokens),
          (unsigned long long)(st.query_tokens - st0.query_tokens));

    /* the last position: a slot in no new block, mapped to -1 */
    CHECK(bm_seq_can_append(bm, b, 1), "room for the last token");
    CHECK(bm_seq_append_slots(bm, b, 1, err, sizeof err) == 0, "%s", err);
    bm_get_stats(bm, &st);
    CHECK(st.num_free == st0.num_free && bm_seq_num_tokens(b) == 12, "free %d tokens %lld",
          st.num_free, (long long)bm_seq_num_tokens(b));
    int64_t slot = 123;
    CHECK(bm_seq_slot_mapping(bm, b, 11, 1, &slot, err, sizeof err) == 0 && slot == -1,
          "slot of the cached last position: %lld", (long long)slot);
    CHECK(bm_seq_commit(bm, b, p, 12, err, sizeof err) == 0, "%s", err);
    bm_get_stats(bm, &st);
    CHECK(st.num_cached == 3, "commit re-registered blocks: %d cached", st.num_cached);
    check_ok(bm, "full hit committed");

    /* the first generated token: a fresh private block */
    CHECK(bm_seq_append_slots(bm, b, 1, err, sizeof err) == 0, "%s", err);
    tb = bm_seq_block_table(b, &nb);
    CHECK(nb == 4 && bm_block_refcount(bm, tb[3]) == 1 && bm_block_cached_tokens(bm, tb[3]) == NULL,
          "decode block: %d blocks, refcount %d", nb, nb == 4 ? bm_block_refcount(bm, tb[3]) : -1);
    CHECK(bm_seq_slot_mapping(bm, b, 12, 1, &slot, err, sizeof err) == 0 && nb == 4 &&
          slot == (int64_t)tb[3] * 4, "decode slot %lld", (long long)slot);
    CHECK(bm_seq_commit(bm, b, p, 13, err, sizeof err) == 0, "%s", err);
    bm_get_stats(bm, &st);
    CHECK(st.num_free == st0.num_free - 1 && st.num_cached == 3, "free %d cached %d",
          st.num_free, st.num_cached);
    check_ok(bm, "decode");

    /* preempted and readmitted on prompt + the generated token: 3 hits, 1 to compute */
    bm_seq_release(bm, b);
    CHECK(bm_seq_alloc_prompt(bm, b, p, 13, &nc, err, sizeof err) == 0 && nc == 12 &&
          bm_seq_num_computed(b) == 12, "readmitted: %lld cached, %lld computed",
          (long long)nc, (long long)bm_seq_num_computed(b));
    CHECK(bm_seq_append_slots(bm, b, 1, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_slot_mapping(bm, b, 12, 1, &slot, err, sizeof err) == 0 && slot >= 0,
          "a partial block is written: %lld", (long long)slot);

    bm_seq_free(bm, a);
    bm_seq_free(bm, b);
    bm_get_stats(bm, &st);
    CHECK(st.num_used == 0 && st.num_free + st.num_cached_idle == 16 && st.num_cached == 3,
          "every block back: used %d free %d idle %d", st.num_used, st.num_free,
          st.num_cached_idle);
    check_ok(bm, "freed");

    /* without prefix caching nothing is hit, even block-aligned */
    struct block_manager *off;
    CHECK(bm_create(&off, 8, 4, false, KEY, err, sizeof err) == 0, "%s", err);
    struct bm_seq *c = run_prompt(off, p, 8, NULL, &nc);
    struct bm_seq *d = run_prompt(off, p, 8, NULL, &nc);
    CHECK(nc == 0, "caching off: %lld", (long long)nc);
    bm_seq_free(off, c);
    bm_seq_free(off, d);
    bm_free(off);
    bm_free(bm);
}

static void test_lru_eviction_order(void)
{
    struct block_manager *bm;
    char err[ERR_BUF];
    /* 6 blocks of 2 tokens */
    CHECK(bm_create(&bm, 6, 2, true, KEY, err, sizeof err) == 0, "%s", err);
    int32_t pa[5] = {1, 2, 3, 4, 5}, pb[5] = {6, 7, 8, 9, 10}, pc[1] = {11};
    int n;
    struct bm_seq *a = run_prompt(bm, pa, 5, NULL, NULL);
    int32_t a0 = bm_seq_block_table(a, &n)[0], a1 = bm_seq_block_table(a, &n)[1];
    bm_seq_free(bm, a); /* LRU: a1 a0 (tail first), third block back to free */
    struct bm_seq *b = run_prompt(bm, pb, 5, NULL, NULL);
    int32_t b0 = bm_seq_block_table(b, &n)[0], b1 = bm_seq_block_table(b, &n)[1];
    bm_seq_free(bm, b); /* LRU: a1 a0 b1 b0 */
    struct bm_stats st;
    bm_get_stats(bm, &st);
    CHECK(st.num_cached_idle == 4 && st.num_free == 2, "idle %d free %d", st.num_cached_idle,
          st.num_free);

    /* touching a0 (a hit) moves it to the most recent end on release */
    int64_t nc;
    struct bm_seq *d = run_prompt(bm, pa, 3, NULL, &nc);
    CHECK(nc == 2 && bm_seq_block_table(d, &n)[0] == a0, "hit a0: %lld", (long long)nc);
    bm_seq_free(bm, d); /* LRU: a1 b1 b0 a0 */

    struct bm_seq *c = NULL;
    CHECK(bm_seq_create(bm, 12, NULL, 0, &c, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_alloc_prompt(bm, c, pc, 1, &nc, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_append_slots(bm, c, 4, err, sizeof err) == 0, "%s", err); /* the 2 free */
    bm_get_stats(bm, &st);
    CHECK(st.evictions == 0 && st.num_free == 0, "free list first: ev %llu",
          (unsigned long long)st.evictions);
    int32_t expect[4] = {a1, b1, b0, a0};
    for (int i = 0; i < 4; i++) {
        CHECK(bm_block_cached_tokens(bm, expect[i]) != NULL, "still cached %d", i);
        CHECK(bm_seq_append_slots(bm, c, 2, err, sizeof err) == 0, "%s", err);
        const int32_t *tc = bm_seq_block_table(c, &n);
        CHECK(tc[n - 1] == expect[i], "eviction %d took %d, want %d", i, tc[n - 1], expect[i]);
        CHECK(bm_block_cached_tokens(bm, expect[i]) == NULL, "evicted %d", i);
        check_ok(bm, "evict");
    }
    bm_get_stats(bm, &st);
    CHECK(st.evictions == 4 && st.num_cached == 0 && st.num_used == 6, "ev %llu",
          (unsigned long long)st.evictions);
    CHECK(!bm_seq_can_append(bm, c, 1), "pool exhausted");
    /* evicted prefixes no longer hit */
    int64_t q = -1;
    CHECK(!bm_can_allocate(bm, pa, 5, NULL, 0, 5, &q, NULL) && q == 0, "a gone: %lld",
          (long long)q);
    bm_seq_free(bm, c);
    check_ok(bm, "end");
    bm_free(bm);
}

static void test_can_allocate_counts_idle_hits(void)
{
    struct block_manager *bm;
    char err[ERR_BUF];
    CHECK(bm_create(&bm, 4, 2, true, KEY, err, sizeof err) == 0, "%s", err);
    int32_t p[7] = {1, 2, 3, 4, 5, 6, 7};
    struct bm_seq *a = run_prompt(bm, p, 7, NULL, NULL); /* 4 blocks, 3 cached */
    bm_seq_free(bm, a);                                  /* 3 idle + 1 free */
    int64_t nc;
    int nnew;
    /* the same 7 tokens: 3 idle hits + 1 new block, 4 available - 3 hits = 1 left: fits */
    CHECK(bm_can_allocate(bm, p, 7, NULL, 0, 7, &nc, &nnew) && nc == 6 && nnew == 1,
          "fits: %lld %d", (long long)nc, nnew);
    /* 9 slots would need 2 new blocks but hits pin 3 of the 4: does not fit */
    CHECK(!bm_can_allocate(bm, p, 7, NULL, 0, 9, &nc, &nnew) && nnew == 2, "no: %d", nnew);
    /* an unrelated prompt may evict them: 4 blocks fit */
    int32_t q[8] = {9, 9, 9, 9, 9, 9, 9, 9};
    CHECK(bm_can_allocate(bm, q, 8, NULL, 0, 8, &nc, &nnew) && nc == 0 && nnew == 4, "q");
    CHECK(!bm_can_allocate(bm, q, 8, NULL, 0, 9, &nc, &nnew), "5 blocks");
    bm_free(bm);
}

/* Two sequences compute the same prompt before either commits: the second commit finds
 * the first's blocks, keeps its own private, and links its later blocks to the cached
 * chain so a third sequence still hits all of them. */
static void test_duplicate_commit(void)
{
    struct block_manager *bm;
    char err[ERR_BUF];
    CHECK(bm_create(&bm, 32, 4, true, KEY, err, sizeof err) == 0, "%s", err);
    int32_t p[13] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    struct bm_seq *a, *b;
    int64_t nc;
    CHECK(bm_seq_create(bm, 16, NULL, 0, &a, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_create(bm, 16, NULL, 0, &b, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_alloc_prompt(bm, a, p, 8, &nc, err, sizeof err) == 0 && nc == 0, "a");
    CHECK(bm_seq_alloc_prompt(bm, b, p, 8, &nc, err, sizeof err) == 0 && nc == 0, "b");
    CHECK(bm_seq_append_slots(bm, a, 8, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_append_slots(bm, b, 8, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_commit(bm, a, p, 8, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_commit(bm, b, p, 8, err, sizeof err) == 0, "%s", err);
    struct bm_stats st;
    bm_get_stats(bm, &st);
    CHECK(st.num_cached == 2, "only a's copies cached: %d", st.num_cached);
    /* b decodes 4 more tokens (9..12), filling its third block */
    CHECK(bm_seq_append_slots(bm, b, 4, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_commit(bm, b, p, 12, err, sizeof err) == 0, "%s", err);
    bm_get_stats(bm, &st);
    CHECK(st.num_cached == 3, "b's third block cached: %d", st.num_cached);
    struct bm_seq *c = run_prompt(bm, p, 13, NULL, &nc);
    CHECK(nc == 12, "chain a0 a1 b2 hit: %lld", (long long)nc);
    int n;
    const int32_t *ta = bm_seq_block_table(a, &n), *tb = bm_seq_block_table(b, &n),
                  *tc = bm_seq_block_table(c, &n);
    CHECK(tc[0] == ta[0] && tc[1] == ta[1] && tc[2] == tb[2], "canonical chain");
    check_ok(bm, "dup");
    bm_seq_free(bm, a);
    bm_seq_free(bm, b);
    bm_seq_free(bm, c);
    check_ok(bm, "dup end");
    bm_free(bm);
}

/* ---- forced collisions --------------------------------------------------------------- */

static uint64_t hash_const(const uint8_t key[16], const void *data, size_t len)
{
    (void)key;
    (void)data;
    (void)len;
    return 42;
}

static void test_crafted_collision(void)
{
    struct block_manager *bm;
    char err[ERR_BUF];
    CHECK(bm_create(&bm, 64, 4, true, KEY, err, sizeof err) == 0, "%s", err);
    bm_set_hash_fn(bm, hash_const); /* every block hashes to 42 */
    int32_t x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 0};
    int32_t y[9] = {1, 2, 3, 5, 5, 6, 7, 8, 0}; /* first block differs in one token */
    int32_t z[9] = {1, 2, 3, 4, 5, 6, 7, 9, 0}; /* second block differs */
    int32_t w[9] = {5, 6, 7, 8, 5, 6, 7, 8, 0}; /* second block of x under another parent */
    int64_t nc;
    struct bm_seq *a = run_prompt(bm, x, 9, NULL, &nc);
    struct bm_seq *b = run_prompt(bm, y, 9, NULL, &nc);
    CHECK(nc == 0, "colliding first block refused: %lld", (long long)nc);
    struct bm_seq *c = run_prompt(bm, z, 9, NULL, &nc);
    CHECK(nc == 4, "only the true first block: %lld", (long long)nc);
    struct bm_seq *d = run_prompt(bm, w, 9, NULL, &nc);
    CHECK(nc == 0, "block under a different parent refused: %lld", (long long)nc);
    struct bm_seq *e = run_prompt(bm, x, 9, "s", &nc);
    CHECK(nc == 0, "colliding salt refused: %lld", (long long)nc);
    struct bm_seq *f = run_prompt(bm, x, 9, NULL, &nc);
    CHECK(nc == 8, "the genuine prompt still hits: %lld", (long long)nc);
    int n;
    const int32_t *ta = bm_seq_block_table(a, &n), *tf = bm_seq_block_table(f, &n);
    CHECK(ta[0] == tf[0] && ta[1] == tf[1], "same blocks");
    /* every hit's stored tokens equal the prompt */
    for (int i = 0; i < 2; i++) {
        const int32_t *ct = bm_block_cached_tokens(bm, tf[i]);
        CHECK(ct && memcmp(ct, x + 4 * i, 16) == 0, "tokens of block %d", i);
    }
    check_ok(bm, "collide");
    bm_seq_free(bm, a);
    bm_seq_free(bm, b);
    bm_seq_free(bm, c);
    bm_seq_free(bm, d);
    bm_seq_free(bm, e);
    bm_seq_free(bm, f);
    bm_free(bm);
}

/* A child cached under parent block P must not be hit after P is evicted and its id is
 * reused for other content at the same depth, even when every hash collides (the stored
 * parent id and parent hash then match; only the parent's generation tells them apart). */
static void test_collision_after_parent_reuse(void)
{
    struct block_manager *bm;
    char err[ERR_BUF];
    CHECK(bm_create(&bm, 6, 4, true, KEY, err, sizeof err) == 0, "%s", err);
    bm_set_hash_fn(bm, hash_const);
    int32_t pa[5] = {1, 2, 3, 4, 100};                      /* X a */
    int32_t pb[9] = {1, 2, 3, 4, 5, 6, 7, 8, 101};          /* X Y b */
    int32_t pn[9] = {9, 9, 9, 9, 5, 6, 7, 8, 102};          /* N Y d */
    int32_t junk[1] = {50};
    struct bm_seq *a, *b, *f, *c;
    int64_t nc;
    CHECK(bm_seq_create(bm, 16, NULL, 0, &a, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_create(bm, 16, NULL, 0, &b, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_alloc_prompt(bm, a, pa, 5, &nc, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_alloc_prompt(bm, b, pb, 9, &nc, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_append_slots(bm, a, 5, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_append_slots(bm, b, 9, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_commit(bm, a, pa, 5, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_commit(bm, b, pb, 9, err, sizeof err) == 0, "%s", err); /* Y under a's X */
    int n;
    int32_t xa = bm_seq_block_table(a, &n)[0], yb = bm_seq_block_table(b, &n)[1];
    bm_seq_free(bm, a);
    bm_seq_free(bm, b); /* LRU: xa, yb; 4 free */
    CHECK(bm_seq_create(bm, 16, NULL, 0, &f, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_alloc_prompt(bm, f, junk, 1, &nc, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_append_slots(bm, f, 16, err, sizeof err) == 0, "%s", err); /* takes free */
    CHECK(bm_seq_create(bm, 16, NULL, 0, &c, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_alloc_prompt(bm, c, pn, 5, &nc, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_append_slots(bm, c, 4, err, sizeof err) == 0, "%s", err);
    CHECK(bm_seq_block_table(c, &n)[0] == xa, "N evicted X and took its id");
    CHECK(bm_seq_commit(bm, c, pn, 4, err, sizeof err) == 0, "%s", err);
    CHECK(bm_block_cached_tokens(bm, yb) != NULL, "the stale child is still cached");
    bm_seq_free(bm, f);
    struct bm_seq *d = run_prompt(bm, pn, 9, NULL, &nc);
    CHECK(nc == 4, "N hits, stale Y under the old X refused: %lld", (long long)nc);
    check_ok(bm, "reuse");
    bm_seq_free(bm, c);
    bm_seq_free(bm, d);
    bm_free(bm);
}

/* ---- randomized scheduler simulation ------------------------------------------------- */

#define R_MAX_SEQS 8
#define R_MAX_TOK 48

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int rng_int(uint64_t *s, int n) { return (int)(rng_next(s) % (uint64_t)n); }

struct rseq {
    bool live;               /* has a handle */
    bool running;            /* admitted (blocks held) */
    struct bm_seq *h;
    int salt;                /* 0 none, 1 "a", 2 "b" */
    int n_tok;               /* known tokens: prompt + generated */
    int max_tok;
    int32_t tok[R_MAX_TOK];
    uint64_t ctx[R_MAX_TOK]; /* identity of prefix tok[0..p] under the salt */
};

static const char *r_salt(int s) { return s == 1 ? "a" : s == 2 ? "b" : NULL; }

static uint64_t ctx_step(uint64_t prev, int32_t t)
{
    uint64_t x = (prev ^ (uint64_t)(uint32_t)t) * 0x9E3779B97F4A7C15ULL;
    return x ^ (x >> 29);
}

static void rseq_set_ctx(struct rseq *q)
{
    uint64_t c = 0x1234567ULL + (uint64_t)q->salt;
    for (int p = 0; p < q->n_tok; p++) q->ctx[p] = c = ctx_step(c, q->tok[p]);
}

struct rstate {
    struct block_manager *bm;
    int num_blocks, bs;
    uint64_t *kv;            /* shadow KV: [num_blocks * bs] prefix identity per slot */
    int *cnt, *stamp;
    struct rseq q[R_MAX_SEQS];
    int hits, full_hits, evict_ops, refusals, preempts, finishes;
};

/* Every position < num_computed must hold its own prefix's identity in the shadow KV. */
static bool r_kv_ok(struct rstate *r, struct rseq *q, int64_t upto)
{
    int nb;
    const int32_t *bt = bm_seq_block_table(q->h, &nb);
    if (upto > (int64_t)nb * r->bs) {
        CHECK(0, "%lld positions in %d blocks", (long long)upto, nb);
        return false;
    }
    /* the physical slot of each position (slot_mapping gives -1 for cache hits) */
    for (int64_t p = 0; p < upto; p++) {
        int64_t slot = (int64_t)bt[p / r->bs] * r->bs + p % r->bs;
        if (r->kv[slot] != q->ctx[p]) {
            CHECK(0, "position %lld slot %lld holds another prefix's KV", (long long)p,
                  (long long)slot);
            return false;
        }
    }
    return true;
}

static bool r_invariants(struct rstate *r)
{
    char err[ERR_BUF] = "";
    if (bm_check(r->bm, err, sizeof err)) {
        CHECK(0, "bm_check: %s", err);
        return false;
    }
    struct bm_stats st;
    bm_get_stats(r->bm, &st);
    if (st.num_free + st.num_used + st.num_cached_idle != st.num_blocks) {
        CHECK(0, "free %d + used %d + idle %d != %d", st.num_free, st.num_used,
              st.num_cached_idle, st.num_blocks);
        return false;
    }
    memset(r->cnt, 0, (size_t)r->num_blocks * sizeof *r->cnt);
    for (int i = 0; i < R_MAX_SEQS; i++) {
        struct rseq *q = &r->q[i];
        if (!q->live) continue;
        int nb;
        const int32_t *bt = bm_seq_block_table(q->h, &nb);
        int64_t ntok = bm_seq_num_tokens(q->h), ncomp = bm_seq_num_computed(q->h);
        int64_t ncached = bm_seq_num_cached(q->h);
        int64_t nwritten = ncomp > ncached ? ncomp : ncached; /* KV present */
        if (!q->running && nb != 0) {
            CHECK(0, "waiting seq holds %d blocks", nb);
            return false;
        }
        /* after a full hit ncached = ncomp + 1 = ntok + 1, a block boundary */
        if (nb != (ntok + r->bs - 1) / r->bs || ncomp > ntok || ntok > q->max_tok ||
            ncached % r->bs || (ncached > ncomp && ncached != ncomp + 1)) {
            CHECK(0, "seq %d: %d blocks for %lld tokens, %lld computed", i, nb,
                  (long long)ntok, (long long)ncomp);
            return false;
        }
        for (int k = 0; k < nb; k++) {
            int32_t b = bt[k];
            if (b < 0 || b >= r->num_blocks || r->stamp[b] == i + 1) {
                CHECK(0, "seq %d: block %d bad or twice in one table", i, b);
                return false;
            }
            r->stamp[b] = i + 1;
            r->cnt[b]++;
            const int32_t *ct = bm_block_cached_tokens(r->bm, b);
            bool writable = (int64_t)(k + 1) * r->bs > nwritten; /* slots still to write */
            if (ct && (writable || memcmp(ct, q->tok + k * r->bs, (size_t)r->bs * 4))) {
                CHECK(0, "seq %d block %d (id %d): cached tokens differ or still written", i,
                      k, b);
                return false;
            }
            if (writable && bm_block_refcount(r->bm, b) != 1) {
                CHECK(0, "seq %d writes block %d with refcount %d", i, b,
                      bm_block_refcount(r->bm, b));
                return false;
            }
        }
        for (int k = 0; k < nb; k++) r->stamp[bt[k]] = 0;
        if (!r_kv_ok(r, q, nwritten < q->n_tok ? nwritten : q->n_tok)) return false;
    }
    for (int b = 0; b < r->num_blocks; b++)
        if (bm_block_refcount(r->bm, b) != r->cnt[b]) {
            CHECK(0, "block %d refcount %d, held by %d tables", b, bm_block_refcount(r->bm, b),
                  r->cnt[b]);
            return false;
        }
    return true;
}

/* Admit a waiting sequence: all known tokens are its prompt (recompute after preempt). */
static void r_admit(struct rstate *r, struct rseq *q, uint64_t *rng)
{
    char err[ERR_BUF] = "";
    int64_t want_nc = -1, nc = -1;
    int chunk = 1 + rng_int(rng, q->n_tok);
    bool fits = bm_can_allocate(r->bm, q->tok, q->n_tok, r_salt(q->salt),
                                q->salt ? 1 : 0, chunk, &want_nc, NULL);
    if (!fits) {
        r->refusals++;
        return;
    }
    struct bm_stats st0, st1;
    bm_get_stats(r->bm, &st0);
    CHECK(bm_seq_alloc_prompt(r->bm, q->h, q->tok, q->n_tok, &nc, err, sizeof err) == 0, "%s",
          err);
    int64_t start = bm_seq_num_computed(q->h);
    CHECK(nc == want_nc && nc <= q->n_tok && nc % r->bs == 0 &&
          start == (nc < q->n_tok ? nc : q->n_tok - 1) && bm_seq_num_tokens(q->h) == start,
          "nc %lld, predicted %lld, start %lld", (long long)nc, (long long)want_nc,
          (long long)start);
    if (nc > 0) r->hits++;
    if (nc == q->n_tok) r->full_hits++;
    r_kv_ok(r, q, nc); /* a hit must bring exactly this prefix's KV */
    int64_t more = chunk > start ? chunk - start : 0;
    CHECK(bm_seq_append_slots(r->bm, q->h, more, err, sizeof err) == 0,
          "can_allocate said yes: %s", err);
    bm_get_stats(r->bm, &st1);
    if (st1.evictions > st0.evictions) r->evict_ops++;
    q->running = true;
}

/* One forward step for q: compute its scheduled slots (write the shadow KV), commit. */
static void r_compute(struct rstate *r, struct rseq *q)
{
    char err[ERR_BUF] = "";
    int64_t c0 = bm_seq_num_computed(q->h), c1 = bm_seq_num_tokens(q->h);
    int64_t slots[R_MAX_TOK];
    CHECK(bm_seq_slot_mapping(r->bm, q->h, c0, c1 - c0, slots, err, sizeof err) == 0, "%s",
          err);
    for (int64_t p = c0; p < c1; p++) {
        int64_t slot = slots[p - c0];
        if (slot >= 0) {
            r->kv[slot] = q->ctx[p];
            continue;
        }
        /* a full hit's last position: its KV is in the shared block already */
        CHECK(p < bm_seq_num_cached(q->h), "position %lld: slot -1 but not a cache hit",
              (long long)p);
    }
    CHECK(bm_seq_commit(r->bm, q->h, q->tok, c1, err, sizeof err) == 0, "%s", err);
}

static void r_preempt(struct rstate *r, struct rseq *q)
{
    bm_seq_release(r->bm, q->h);
    q->running = false;
    r->preempts++;
}

static void r_step(struct rstate *r, uint64_t *rng, const int32_t prefixes[4][24])
{
    char err[ERR_BUF] = "";
    struct rseq *q = &r->q[rng_int(rng, R_MAX_SEQS)];
    int op = rng_int(rng, 10);
    if (!q->live) { /* new request */
        q->salt = rng_int(rng, 4) == 0 ? 1 + rng_int(rng, 2) : 0;
        const int32_t *pre = prefixes[rng_int(rng, 4)];
        int npre = rng_int(rng, 25), ntail = 1 + rng_int(rng, 8);
        q->n_tok = 0;
        for (int i = 0; i < npre; i++) q->tok[q->n_tok++] = pre[i];
        for (int i = 0; i < ntail; i++) q->tok[q->n_tok++] = rng_int(rng, 2);
        q->max_tok = q->n_tok + 1 + rng_int(rng, R_MAX_TOK - q->n_tok);
        if (q->max_tok > R_MAX_TOK) q->max_tok = R_MAX_TOK;
        rseq_set_ctx(q);
        const char *salt = r_salt(q->salt);
        CHECK(bm_seq_create(r->bm, q->max_tok, salt, salt ? 1 : 0, &q->h, err, sizeof err) == 0,
              "%s", err);
        q->live = true;
        q->running = false;
        return;
    }
    if (op == 0) { /* abort (running or waiting) */
        bm_seq_free(r->bm, q->h);
        q->live = q->running = false;
        return;
    }
    if (!q->running) {
        r_admit(r, q, rng);
        return;
    }
    if (op == 1) {
        r_preempt(r, q);
        return;
    }
    int64_t ntok = bm_seq_num_tokens(q->h), ncomp = bm_seq_num_computed(q->h);
    if (ncomp < ntok) {
        r_compute(r, q);
        return;
    }
    int64_t n_new;
    if (ntok < q->n_tok) { /* next prefill chunk */
        n_new = 1 + rng_int(rng, (int)(q->n_tok - ntok));
    } else { /* decode: the sampled token joins the sequence */
        if (q->n_tok == q->max_tok) { /* finished */
            bm_seq_free(r->bm, q->h);
            q->live = q->running = false;
            r->finishes++;
            return;
        }
        q->tok[q->n_tok] = rng_int(rng, 2);
        q->n_tok++;
        rseq_set_ctx(q);
        n_new = 1;
    }
    if (!bm_seq_can_append(r->bm, q->h, n_new)) {
        CHECK(bm_seq_append_slots(r->bm, q->h, n_new, err, sizeof err) == ERR_RANGE,
              "append must refuse");
        r_preempt(r, q); /* out of blocks: preempt, recompute later */
        return;
    }
    struct bm_stats st0, st1;
    bm_get_stats(r->bm, &st0);
    CHECK(bm_seq_append_slots(r->bm, q->h, n_new, err, sizeof err) == 0, "%s", err);
    bm_get_stats(r->bm, &st1);
    if (st1.evictions > st0.evictions) r->evict_ops++;
}

static void run_random(uint64_t seed, int num_blocks, int bs, bool caching, int ops)
{
    struct rstate r;
    memset(&r, 0, sizeof r);
    char err[ERR_BUF] = "";
    uint8_t key[16];
    uint64_t rng = seed;
    for (int i = 0; i < 16; i++) key[i] = (uint8_t)rng_next(&rng);
    CHECK(bm_create(&r.bm, num_blocks, bs, caching, key, err, sizeof err) == 0, "%s", err);
    r.num_blocks = num_blocks;
    r.bs = bs;
    r.kv = calloc((size_t)num_blocks * (size_t)bs, sizeof *r.kv);
    r.cnt = calloc((size_t)num_blocks, sizeof *r.cnt);
    r.stamp = calloc((size_t)num_blocks, sizeof *r.stamp);
    int32_t prefixes[4][24];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 24; j++) prefixes[i][j] = rng_int(&rng, 3);
    int k;
    for (k = 0; k < ops; k++) {
        r_step(&r, &rng, prefixes);
        if (test_cur_failed_ || !r_invariants(&r)) break;
    }
    CHECK(k == ops, "seed %llu: stopped at op %d", (unsigned long long)seed, k);
    printf("  seed %llu: %d hits (%d full), %d evicting ops, %d preemptions\n",
           (unsigned long long)seed, r.hits, r.full_hits, r.evict_ops, r.preempts);
    for (int i = 0; i < R_MAX_SEQS; i++)
        if (r.q[i].live) bm_seq_free(r.bm, r.q[i].h);
    struct bm_stats st;
    bm_get_stats(r.bm, &st);
    CHECK(st.num_used == 0 && st.num_free + st.num_cached_idle == num_blocks,
          "after all: used %d free %d idle %d", st.num_used, st.num_free, st.num_cached_idle);
    CHECK(bm_check(r.bm, err, sizeof err) == 0, "%s", err);
    /* the run must have exercised what it claims to test */
    CHECK(r.preempts > 0 && r.refusals > 0 && r.finishes > 0, "preempts %d refusals %d "
          "finishes %d", r.preempts, r.refusals, r.finishes);
    if (caching)
        CHECK(r.hits > 50 && r.full_hits > 0 && r.evict_ops > 50 && st.hit_tokens > 0,
              "hits %d (full %d) evictions %d", r.hits, r.full_hits, r.evict_ops);
    else
        CHECK(r.hits == 0 && st.num_cached == 0, "no caching: hits %d", r.hits);
    free(r.kv);
    free(r.cnt);
    free(r.stamp);
    bm_free(r.bm);
}

static void test_random_small_pool(void)
{
    static const uint64_t seeds[] = {1, 42, 0x9e3779b97f4a7c15ULL, 12345};
    for (int i = 0; i < 4; i++) run_random(seeds[i], 12, 4, true, 5000);
}

static void test_random_other_shapes(void)
{
    run_random(7, 24, 2, true, 5000);
    run_random(8, 7, 8, true, 5000);
    run_random(9, 12, 4, false, 3000);
}

int main(void)
{
    RUN(test_siphash_vectors);
    RUN(test_create_errors);
    RUN(test_alloc_append_release);
    RUN(test_truncate);
    RUN(test_prefix_hits);
    RUN(test_salt_separation);
    RUN(test_partial_and_full_hit);
    RUN(test_full_hit_last_token);
    RUN(test_limit_lookup);
    RUN(test_lru_eviction_order);
    RUN(test_can_allocate_counts_idle_hits);
    RUN(test_duplicate_commit);
    RUN(test_crafted_collision);
    RUN(test_collision_after_parent_reuse);
    RUN(test_random_small_pool);
    RUN(test_random_other_shapes);
    return test_summary();
}

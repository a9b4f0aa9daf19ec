/* block_manager.c — free list, refcounts, block tables and the prefix cache.
 *
 * See block_manager.h for the API and invariants. Internals:
 *   - free list: a stack of block ids (free_stack[0, num_free)).
 *   - LRU: a doubly linked list (lru_prev/lru_next, head = oldest) of IDLE blocks
 *     (cached, refcount 0). Eviction pops the head; a release appends to the tail.
 *   - hash table: power-of-two buckets of singly linked chains through bucket_next,
 *     holding every cached block (USED or IDLE). Duplicate hashes may coexist.
 *   - a generation number per block, renewed whenever the block is (re)cached or evicted,
 *     so a child's stored (parent id, parent gen) can never name a reused block.
 * Single-threaded: the scheduler thread only.
 */
#include "engine/block_manager.h"

#include "util/err.h"

#include <stdlib.h>
#include <string.h>

struct bm_seq {
    int32_t *block_table;    /* [max_blocks] physical block ids */
    int num_blocks;          /* entries used in block_table */
    int max_blocks;          /* ceil(max_tokens / block_size) */
    int64_t max_tokens;
    int64_t num_tokens;      /* positions with a slot */
    int64_t num_computed;    /* positions whose KV is written (or, after a full hit,
                                every position but the last, which is still to forward) */
    int64_t num_cached;      /* positions whose KV came from prefix-cache hits at
                                admission: slot_mapping gives -1 for them (never written) */
    int64_t lookup_limit;    /* prefix-cache lookups see tokens [0, lookup_limit) only */
    int chain_len;           /* leading blocks hashed into the chain (hits + committed) */
    uint64_t chain_hash;     /* hash of block chain_len - 1 (0 when chain_len == 0) */
    int32_t chain_block;     /* canonical cached block of that hash (-1: none) */
    uint64_t chain_gen;      /* its generation when linked */
    size_t salt_len;
    uint8_t salt[BM_SALT_MAX];
};

struct block_manager {
    int num_blocks;
    int block_size;
    bool caching;
    uint8_t key[16];
    uint64_t (*hash_fn)(const uint8_t key[16], const void *data, size_t len);

    int32_t *refcount;       /* [num_blocks] */
    uint8_t *cached;         /* [num_blocks] 1 if in the hash table */
    uint64_t *hash;          /* [num_blocks] chained hash of a cached block */
    uint64_t *parent_hash;   /* [num_blocks] */
    int32_t *parent_block;   /* [num_blocks] canonical parent id, -1 for a first block */
    uint64_t *parent_gen;    /* [num_blocks] parent's generation when cached */
    uint64_t *gen;           /* [num_blocks] */
    int32_t *tokens;         /* [num_blocks][block_size] token ids of a cached block */
    uint8_t *salt;           /* [num_blocks][BM_SALT_MAX] salt of a cached first block */
    uint8_t *salt_len;       /* [num_blocks] */
    int32_t *bucket_next;    /* [num_blocks] next cached block in the same bucket, -1 */
    int32_t *lru_prev;       /* [num_blocks] */
    int32_t *lru_next;       /* [num_blocks] */
    int32_t *free_stack;     /* [num_blocks] */
    int32_t *buckets;        /* [num_buckets] first block of each chain, -1 */
    uint8_t *scratch;        /* [8 + block_size*4 + BM_SALT_MAX] hash input */
    size_t num_buckets;      /* power of two */

    int num_free;
    int num_used;
    int num_cached;
    int num_idle;
    int32_t lru_head, lru_tail;
    uint64_t next_gen;
    uint64_t query_tokens, hit_tokens, evictions;
};

/* ---- SipHash-2-4 --------------------------------------------------------------------- */

static uint64_t rotl64(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

static uint64_t load_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

#define SIPROUND                                                        \
    do {                                                                \
        v0 += v1; v1 = rotl64(v1, 13); v1 ^= v0; v0 = rotl64(v0, 32);   \
        v2 += v3; v3 = rotl64(v3, 16); v3 ^= v2;                        \
        v0 += v3; v3 = rotl64(v3, 21); v3 ^= v0;                        \
        v2 += v1; v1 = rotl64(v1, 17); v1 ^= v2; v2 = rotl64(v2, 32);   \
    } while (0)

uint64_t bm_siphash24(const uint8_t key[16], const void *data, size_t len)
{
    const uint8_t *in = data;
    uint64_t k0 = load_le64(key), k1 = load_le64(key + 8);
    uint64_t v0 = k0 ^ 0x736f6d6570736575ULL, v1 = k1 ^ 0x646f72616e646f6dULL;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ULL, v3 = k1 ^ 0x7465646279746573ULL;
    size_t full = len - len % 8;
    for (size_t i = 0; i < full; i += 8) {
        uint64_t m = load_le64(in + i);
        v3 ^= m;
        SIPROUND;
        SIPROUND;
        v0 ^= m;
    }
    /* last word: remaining bytes, then len mod 256 in the top byte */
    uint64_t b = (uint64_t)(len & 0xff) << 56;
    for (size_t i = 0; i < len % 8; i++) b |= (uint64_t)in[full + i] << (8 * i);
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* ---- hashing and lookup -------------------------------------------------------------- */

/* Hash of a full block: parent_hash || tokens[block_size] || salt (first block only, since
 * every later hash already chains the first one). */
static uint64_t block_hash(struct block_manager *bm, uint64_t parent_hash,
                           const int32_t *tokens, const uint8_t *salt, size_t salt_len)
{
    uint8_t *p = bm->scratch;
    size_t tok_bytes = (size_t)bm->block_size * sizeof(int32_t);
    memcpy(p, &parent_hash, 8);
    memcpy(p + 8, tokens, tok_bytes);
    if (salt_len) memcpy(p + 8 + tok_bytes, salt, salt_len);
    return bm->hash_fn(bm->key, p, 8 + tok_bytes + salt_len);
}

/* A verified cached block for (h, parent, tokens, salt), or -1. parent_block -1 means a
 * first block, whose salt must match exactly; later blocks inherit the salt through the
 * verified parent. */
static int32_t cache_find(const struct block_manager *bm, uint64_t h, uint64_t parent_hash,
                          int32_t parent_block, uint64_t parent_gen, const int32_t *tokens,
                          const uint8_t *salt, size_t salt_len)
{
    size_t bs = (size_t)bm->block_size;
    for (int32_t b = bm->buckets[h & (bm->num_buckets - 1)]; b >= 0; b = bm->bucket_next[b]) {
        if (bm->hash[b] != h || bm->parent_hash[b] != parent_hash ||
            bm->parent_block[b] != parent_block)
            continue;
        if (parent_block >= 0 && bm->parent_gen[b] != parent_gen) continue;
        if (parent_block < 0 && (bm->salt_len[b] != salt_len ||
                                 (salt_len && memcmp(bm->salt + (size_t)b * BM_SALT_MAX, salt,
                                                     salt_len))))
            continue;
        if (memcmp(bm->tokens + (size_t)b * bs, tokens, bs * sizeof(int32_t))) continue;
        return b;
    }
    return -1;
}

/* Walks the prompt's cached chain: writes hit ids to hits[] (if non-NULL) and returns how
 * many full blocks hit, at most n / block_size (a block-aligned prompt may hit entirely).
 * *idle_hits counts hits that are currently IDLE. *last_hash gets the hash of the last hit. */
static int cache_lookup(struct block_manager *bm, const int32_t *tokens, int64_t n,
                        const uint8_t *salt, size_t salt_len, int32_t *hits, int *idle_hits,
                        uint64_t *last_hash)
{
    int nh = 0, idle = 0;
    uint64_t ph = 0;
    int32_t pb = -1;
    if (bm->caching && n > 0) {
        int64_t max_hits = n / bm->block_size;
        for (int64_t i = 0; i < max_hits; i++) {
            const int32_t *t = tokens + i * bm->block_size;
            bool first = (pb < 0);
            uint64_t h = block_hash(bm, ph, t, salt, first ? salt_len : 0);
            int32_t b = cache_find(bm, h, ph, pb, pb >= 0 ? bm->gen[pb] : 0, t, salt, salt_len);
            if (b < 0) break;
            if (hits) hits[nh] = b;
            if (bm->refcount[b] == 0) idle++;
            nh++;
            ph = h;
            pb = b;
        }
    }
    if (idle_hits) *idle_hits = idle;
    if (last_hash) *last_hash = ph;
    return nh;
}

static void bucket_insert(struct block_manager *bm, int32_t b)
{
    size_t k = bm->hash[b] & (bm->num_buckets - 1);
    bm->bucket_next[b] = bm->buckets[k];
    bm->buckets[k] = b;
}

static void bucket_remove(struct block_manager *bm, int32_t b)
{
    int32_t *pp = &bm->buckets[bm->hash[b] & (bm->num_buckets - 1)];
    while (*pp != b) pp = &bm->bucket_next[*pp]; /* b is in this chain (cached) */
    *pp = bm->bucket_next[b];
    bm->bucket_next[b] = -1;
}

/* ---- LRU list of IDLE blocks --------------------------------------------------------- */

static void lru_push_tail(struct block_manager *bm, int32_t b)
{
    bm->lru_prev[b] = bm->lru_tail;
    bm->lru_next[b] = -1;
    if (bm->lru_tail >= 0) bm->lru_next[bm->lru_tail] = b;
    else bm->lru_head = b;
    bm->lru_tail = b;
    bm->num_idle++;
}

static void lru_remove(struct block_manager *bm, int32_t b)
{
    int32_t p = bm->lru_prev[b], n = bm->lru_next[b];
    if (p >= 0) bm->lru_next[p] = n;
    else bm->lru_head = n;
    if (n >= 0) bm->lru_prev[n] = p;
    else bm->lru_tail = p;
    bm->lru_prev[b] = bm->lru_next[b] = -1;
    bm->num_idle--;
}

/* ---- block allocation ---------------------------------------------------------------- */

/* One block with refcount 1, not cached: from the free list, else the LRU head (evicted
 * from the cache). The caller has checked num_free + num_idle > 0. */
static int32_t block_take(struct block_manager *bm)
{
    int32_t b;
    if (bm->num_free > 0) {
        b = bm->free_stack[--bm->num_free];
    } else {
        b = bm->lru_head;
        lru_remove(bm, b);
        bucket_remove(bm, b);
        bm->cached[b] = 0;
        bm->num_cached--;
        bm->gen[b] = ++bm->next_gen; /* children's (id, gen) links die with it */
        bm->evictions++;
    }
    bm->refcount[b] = 1;
    bm->num_used++;
    return b;
}

/* refcount--; at 0 a cached block becomes IDLE (LRU tail), any other goes back free. */
static void block_put(struct block_manager *bm, int32_t b)
{
    if (--bm->refcount[b] > 0) return;
    bm->num_used--;
    if (bm->cached[b]) lru_push_tail(bm, b);
    else bm->free_stack[bm->num_free++] = b;
}

/* A hit: refcount++, leaving the LRU list if it was IDLE. */
static void block_ref(struct block_manager *bm, int32_t b)
{
    if (bm->refcount[b]++ == 0) {
        lru_remove(bm, b);
        bm->num_used++;
    }
}

static int64_t blocks_for(const struct block_manager *bm, int64_t ntok)
{
    return (ntok + bm->block_size - 1) / bm->block_size;
}

/* ---- manager ------------------------------------------------------------------------- */

int bm_create(struct block_manager **out, int num_blocks, int block_size,
              bool enable_prefix_caching, const uint8_t key[16], char *err, size_t errlen)
{
    *out = NULL;
    if (num_blocks <= 0 || block_size <= 0 || !key)
        return err_set(err, errlen, ERR_INVALID,
                       "block manager: num_blocks %d, block_size %d must be > 0 (and a key)",
                       num_blocks, block_size);
    struct block_manager *bm = calloc(1, sizeof *bm);
    if (!bm) return err_set(err, errlen, ERR_NOMEM, "block manager: out of memory");
    size_t nb = (size_t)num_blocks, bs = (size_t)block_size;
    bm->num_blocks = num_blocks;
    bm->block_size = block_size;
    bm->caching = enable_prefix_caching;
    memcpy(bm->key, key, 16);
    bm->hash_fn = bm_siphash24;
    bm->num_buckets = 1;
    while (bm->num_buckets < 2 * nb) bm->num_buckets <<= 1;
    bm->refcount = calloc(nb, sizeof *bm->refcount);
    bm->cached = calloc(nb, 1);
    bm->hash = calloc(nb, sizeof *bm->hash);
    bm->parent_hash = calloc(nb, sizeof *bm->parent_hash);
    bm->parent_block = calloc(nb, sizeof *bm->parent_block);
    bm->parent_gen = calloc(nb, sizeof *bm->parent_gen);
    bm->gen = calloc(nb, sizeof *bm->gen);
    bm->tokens = calloc(nb * bs, sizeof *bm->tokens);
    bm->salt = calloc(nb, BM_SALT_MAX);
    bm->salt_len = calloc(nb, 1);
    bm->bucket_next = malloc(nb * sizeof *bm->bucket_next);
    bm->lru_prev = malloc(nb * sizeof *bm->lru_prev);
    bm->lru_next = malloc(nb * sizeof *bm->lru_next);
    bm->free_stack = malloc(nb * sizeof *bm->free_stack);
    bm->buckets = malloc(bm->num_buckets * sizeof *bm->buckets);
    bm->scratch = malloc(8 + bs * sizeof(int32_t) + BM_SALT_MAX);
    if (!bm->refcount || !bm->cached || !bm->hash || !bm->parent_hash || !bm->parent_block ||
        !bm->parent_gen || !bm->gen || !bm->tokens || !bm->salt || !bm->salt_len ||
        !bm->bucket_next || !bm->lru_prev || !bm->lru_next || !bm->free_stack ||
        !bm->buckets || !bm->scratch)
        goto fail;
    for (size_t i = 0; i < nb; i++) {
        bm->bucket_next[i] = bm->lru_prev[i] = bm->lru_next[i] = -1;
        bm->free_stack[i] = (int32_t)(nb - 1 - i); /* pops 0, 1, 2, ... */
    }
    for (size_t i = 0; i < bm->num_buckets; i++) bm->buckets[i] = -1;
    bm->num_free = num_blocks;
    bm->lru_head = bm->lru_tail = -1;
    *out = bm;
    return 0;
fail:
    bm_free(bm);
    return err_set(err, errlen, ERR_NOMEM, "block manager: out of memory for %d blocks",
                   num_blocks);
}

void bm_free(struct block_manager *bm)
{
    if (!bm) return;
    free(bm->refcount);
    free(bm->cached);
    free(bm->hash);
    free(bm->parent_hash);
    free(bm->parent_block);
    free(bm->parent_gen);
    free(bm->gen);
    free(bm->tokens);
    free(bm->salt);
    free(bm->salt_len);
    free(bm->bucket_next);
    free(bm->lru_prev);
    free(bm->lru_next);
    free(bm->free_stack);
    free(bm->buckets);
    free(bm->scratch);
    free(bm);
}

void bm_set_hash_fn(struct block_manager *bm,
                    uint64_t (*fn)(const uint8_t key[16], const void *data, size_t len))
{
    bm->hash_fn = fn ? fn : bm_siphash24;
}

void bm_get_stats(const struct block_manager *bm, struct bm_stats *st)
{
    st->num_blocks = bm->num_blocks;
    st->num_free = bm->num_free;
    st->num_used = bm->num_used;
    st->num_cached = bm->num_cached;
    st->num_cached_idle = bm->num_idle;
    st->query_tokens = bm->query_tokens;
    st->hit_tokens = bm->hit_tokens;
    st->evictions = bm->evictions;
}

/* ---- sequences ----------------------------------------------------------------------- */

static void seq_reset(struct bm_seq *seq)
{
    seq->num_blocks = 0;
    seq->num_tokens = seq->num_computed = seq->num_cached = 0;
    seq->chain_len = 0;
    seq->chain_hash = 0;
    seq->chain_block = -1;
    seq->chain_gen = 0;
}

int bm_seq_create(struct block_manager *bm, int64_t max_tokens, const void *salt,
                  size_t salt_len, struct bm_seq **out, char *err, size_t errlen)
{
    *out = NULL;
    if (max_tokens <= 0 || blocks_for(bm, max_tokens) > bm->num_blocks)
        return err_set(err, errlen, ERR_RANGE,
                       "sequence of %lld tokens cannot fit in %d blocks of %d",
                       (long long)max_tokens, bm->num_blocks, bm->block_size);
    if (salt_len > BM_SALT_MAX || (salt_len > 0 && !salt))
        return err_set(err, errlen, ERR_INVALID, "cache salt of %zu bytes (max %d)", salt_len,
                       BM_SALT_MAX);
    struct bm_seq *seq = calloc(1, sizeof *seq);
    if (!seq) return err_set(err, errlen, ERR_NOMEM, "block manager: out of memory");
    seq->max_blocks = (int)blocks_for(bm, max_tokens);
    seq->block_table = malloc((size_t)seq->max_blocks * sizeof *seq->block_table);
    if (!seq->block_table) {
        free(seq);
        return err_set(err, errlen, ERR_NOMEM, "block manager: out of memory");
    }
    seq->max_tokens = max_tokens;
    seq->lookup_limit = max_tokens;
    seq->salt_len = salt_len;
    if (salt_len) memcpy(seq->salt, salt, salt_len);
    seq_reset(seq);
    *out = seq;
    return 0;
}

void bm_seq_release(struct block_manager *bm, struct bm_seq *seq)
{
    /* last block first: the LRU then evicts a prompt's tail before its shared head */
    for (int i = seq->num_blocks - 1; i >= 0; i--) block_put(bm, seq->block_table[i]);
    seq_reset(seq);
}

void bm_seq_free(struct block_manager *bm, struct bm_seq *seq)
{
    if (!seq) return;
    bm_seq_release(bm, seq);
    free(seq->block_table);
    free(seq);
}

bool bm_can_allocate(struct block_manager *bm, const int32_t *tokens, int64_t n,
                     const void *salt, size_t salt_len, int64_t n_slots, int64_t *n_cached,
                     int *n_new_blocks)
{
    int idle = 0, hits = 0;
    if (salt_len <= BM_SALT_MAX) /* a longer salt is refused by bm_seq_create anyway */
        hits = cache_lookup(bm, tokens, n, salt, salt_len, NULL, &idle, NULL);
    int64_t cached = (int64_t)hits * bm->block_size;
    if (n_slots < cached) n_slots = cached;
    int64_t need = blocks_for(bm, n_slots) - hits;
    if (n_cached) *n_cached = cached;
    if (n_new_blocks) *n_new_blocks = (int)(need < bm->num_blocks ? need : bm->num_blocks);
    return need <= (int64_t)bm->num_free + bm->num_idle - idle;
}

int bm_seq_alloc_prompt(struct block_manager *bm, struct bm_seq *seq, const int32_t *tokens,
                        int64_t n, int64_t *n_cached, char *err, size_t errlen)
{
    if (seq->num_blocks != 0)
        return err_set(err, errlen, ERR_INVALID, "alloc_prompt on a non-empty sequence");
    if (n <= 0 || n > seq->max_tokens || !tokens)
        return err_set(err, errlen, ERR_RANGE, "prompt of %lld tokens (max %lld)",
                       (long long)n, (long long)seq->max_tokens);
    uint64_t h = 0;
    int hits = cache_lookup(bm, tokens, n < seq->lookup_limit ? n : seq->lookup_limit, seq->salt,
                            seq->salt_len, seq->block_table, NULL, &h);
    for (int i = 0; i < hits; i++) block_ref(bm, seq->block_table[i]);
    seq->num_blocks = hits;
    seq->num_cached = (int64_t)hits * bm->block_size;
    /* a full hit still forwards the last position for its logits; its KV is in the last
     * hit block already, so its slot maps to -1 and nothing is written there */
    seq->num_tokens = seq->num_computed = seq->num_cached < n ? seq->num_cached : n - 1;
    seq->chain_len = hits;
    seq->chain_hash = h;
    seq->chain_block = hits ? seq->block_table[hits - 1] : -1;
    seq->chain_gen = hits ? bm->gen[seq->chain_block] : 0;
    if (bm->caching) {
        bm->query_tokens += (uint64_t)n;
        bm->hit_tokens += (uint64_t)seq->num_cached;
    }
    if (n_cached) *n_cached = seq->num_cached;
    return 0;
}

void bm_seq_limit_lookup(struct bm_seq *seq, int64_t n) { seq->lookup_limit = n > 0 ? n : 0; }

bool bm_seq_can_append(const struct block_manager *bm, const struct bm_seq *seq,
                       int64_t n_new)
{
    if (n_new < 0 || seq->num_tokens + n_new > seq->max_tokens) return false;
    int64_t need = blocks_for(bm, seq->num_tokens + n_new) - seq->num_blocks;
    return need <= (int64_t)bm->num_free + bm->num_idle;
}

int bm_seq_append_slots(struct block_manager *bm, struct bm_seq *seq, int64_t n_new,
                        char *err, size_t errlen)
{
    if (!bm_seq_can_append(bm, seq, n_new))
        return err_set(err, errlen, ERR_RANGE,
                       "no room for %lld more tokens (have %lld of %lld, %d free + %d "
                       "evictable blocks)",
                       (long long)n_new, (long long)seq->num_tokens,
                       (long long)seq->max_tokens, bm->num_free, bm->num_idle);
    int64_t want = blocks_for(bm, seq->num_tokens + n_new);
    while (seq->num_blocks < want) seq->block_table[seq->num_blocks++] = block_take(bm);
    seq->num_tokens += n_new;
    return 0;
}

int bm_seq_truncate(struct block_manager *bm, struct bm_seq *seq, int64_t n_tokens, char *err,
                    size_t errlen)
{
    if (n_tokens < seq->num_computed || n_tokens > seq->num_tokens)
        return err_set(err, errlen, ERR_INVALID, "truncate to %lld tokens (computed %lld, slots for %lld)",
                       (long long)n_tokens, (long long)seq->num_computed, (long long)seq->num_tokens);
    int64_t want = blocks_for(bm, n_tokens);
    while (seq->num_blocks > want) block_put(bm, seq->block_table[--seq->num_blocks]);
    seq->num_tokens = n_tokens;
    return 0;
}

int bm_seq_commit(struct block_manager *bm, struct bm_seq *seq, const int32_t *tokens,
                  int64_t n_computed, char *err, size_t errlen)
{
    if (n_computed < seq->num_computed || n_computed > seq->num_tokens)
        return err_set(err, errlen, ERR_INVALID,
                       "commit of %lld computed tokens (had %lld, slots for %lld)",
                       (long long)n_computed, (long long)seq->num_computed,
                       (long long)seq->num_tokens);
    seq->num_computed = n_computed;
    if (!bm->caching) return 0;
    size_t bs = (size_t)bm->block_size;
    int64_t full = n_computed / bm->block_size;
    while (seq->chain_len < full) {
        int i = seq->chain_len;
        const int32_t *t = tokens + (size_t)i * bs;
        bool first = (seq->chain_block < 0);
        uint64_t h = block_hash(bm, seq->chain_hash, t, seq->salt, first ? seq->salt_len : 0);
        int32_t dup = cache_find(bm, h, seq->chain_hash, seq->chain_block, seq->chain_gen, t,
                                 seq->salt, seq->salt_len);
        int32_t canon = dup;
        if (dup < 0) { /* our block becomes the cached one; it is ours alone (refcount 1) */
            int32_t b = seq->block_table[i];
            bm->cached[b] = 1;
            bm->num_cached++;
            bm->hash[b] = h;
            bm->parent_hash[b] = seq->chain_hash;
            bm->parent_block[b] = seq->chain_block;
            bm->parent_gen[b] = seq->chain_gen;
            bm->gen[b] = ++bm->next_gen;
            memcpy(bm->tokens + (size_t)b * bs, t, bs * sizeof(int32_t));
            bm->salt_len[b] = (uint8_t)(first ? seq->salt_len : 0);
            if (first && seq->salt_len) memcpy(bm->salt + (size_t)b * BM_SALT_MAX, seq->salt,
                                               seq->salt_len);
            bucket_insert(bm, b);
            canon = b;
        }
        /* else another sequence cached the same block first: ours stays private and the
         * chain continues from the canonical copy, so our later blocks link to it */
        seq->chain_hash = h;
        seq->chain_block = canon;
        seq->chain_gen = bm->gen[canon];
        seq->chain_len++;
    }
    return 0;
}

int bm_seq_slot_mapping(const struct block_manager *bm, const struct bm_seq *seq,
                        int64_t pos0, int64_t n, int64_t *slots, char *err, size_t errlen)
{
    if (pos0 < 0 || n < 0 || pos0 + n > seq->num_tokens)
        return err_set(err, errlen, ERR_RANGE, "positions %lld..%lld have no slot (%lld)",
                       (long long)pos0, (long long)(pos0 + n - 1), (long long)seq->num_tokens);
    int64_t bs = bm->block_size;
    for (int64_t i = 0; i < n; i++) {
        int64_t p = pos0 + i;
        slots[i] = p < seq->num_cached ? -1 : (int64_t)seq->block_table[p / bs] * bs + p % bs;
    }
    return 0;
}

const int32_t *bm_seq_block_table(const struct bm_seq *seq, int *num_blocks)
{
    if (num_blocks) *num_blocks = seq->num_blocks;
    return seq->block_table;
}

int64_t bm_seq_num_tokens(const struct bm_seq *seq) { return seq->num_tokens; }
int64_t bm_seq_num_computed(const struct bm_seq *seq) { return seq->num_computed; }
int64_t bm_seq_num_cached(const struct bm_seq *seq) { return seq->num_cached; }

/* ---- introspection ------------------------------------------------------------------- */

int bm_block_refcount(const struct block_manager *bm, int id)
{
    return id >= 0 && id < bm->num_blocks ? bm->refcount[id] : -1;
}

const int32_t *bm_block_cached_tokens(const struct block_manager *bm, int id)
{
    if (id < 0 || id >= bm->num_blocks || !bm->cached[id]) return NULL;
    return bm->tokens + (size_t)id * (size_t)bm->block_size;
}

int bm_check(const struct block_manager *bm, char *err, size_t errlen)
{
    int nb = bm->num_blocks;
    int used = 0, cached = 0, in_free = 0, in_lru = 0, in_buckets = 0;
    int rc = 0;
    /* place[b]: bit 1 free list, bit 2 LRU, bit 4 hash table */
    uint8_t *place = calloc((size_t)nb, 1);
    if (!place) return err_set(err, errlen, ERR_NOMEM, "bm_check: out of memory");
    for (int i = 0; i < bm->num_free; i++) {
        int32_t b = bm->free_stack[i];
        if (b < 0 || b >= nb || (place[b] & 1)) {
            rc = err_set(err, errlen, ERR_FORMAT, "free list entry %d: bad or repeated %d", i, b);
            goto out;
        }
        place[b] |= 1;
        in_free++;
    }
    int32_t prev = -1;
    for (int32_t b = bm->lru_head; b >= 0; b = bm->lru_next[b]) {
        if (b >= nb || (place[b] & 2) || bm->lru_prev[b] != prev || in_lru > nb) {
            rc = err_set(err, errlen, ERR_FORMAT, "LRU list broken at block %d", b);
            goto out;
        }
        place[b] |= 2;
        in_lru++;
        prev = b;
    }
    if (prev != bm->lru_tail) {
        rc = err_set(err, errlen, ERR_FORMAT, "LRU tail %d, list ends at %d", bm->lru_tail, prev);
        goto out;
    }
    for (size_t k = 0; k < bm->num_buckets; k++) {
        for (int32_t b = bm->buckets[k]; b >= 0; b = bm->bucket_next[b]) {
            if (b >= nb || (place[b] & 4) || (bm->hash[b] & (bm->num_buckets - 1)) != k) {
                rc = err_set(err, errlen, ERR_FORMAT, "hash bucket %zu broken at block %d", k, b);
                goto out;
            }
            place[b] |= 4;
            in_buckets++;
        }
    }
    for (int b = 0; b < nb; b++) {
        int r = bm->refcount[b];
        bool c = bm->cached[b];
        used += r > 0;
        cached += c;
        bool ok;
        if (r < 0) ok = false;
        else if (r > 0) ok = !(place[b] & 3) && (c == !!(place[b] & 4));    /* USED */
        else if (c) ok = place[b] == (2 | 4);                               /* IDLE */
        else ok = place[b] == 1;                                            /* FREE */
        if (!ok) {
            rc = err_set(err, errlen, ERR_FORMAT,
                         "block %d: refcount %d cached %d but in places 0x%x", b, r, (int)c,
                         place[b]);
            goto out;
        }
    }
    if (used != bm->num_used || cached != bm->num_cached || in_lru != bm->num_idle ||
        in_buckets != cached || in_free + used + in_lru != nb)
        rc = err_set(err, errlen, ERR_FORMAT,
                     "counts: used %d/%d cached %d/%d idle %d/%d free %d, total %d", used,
                     bm->num_used, cached, bm->num_cached, in_lru, bm->num_idle, in_free, nb);
out:
    free(place);
    return rc;
}

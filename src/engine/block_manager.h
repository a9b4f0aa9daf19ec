/* block_manager.h — KV block allocation for the continuous-batching engine.
 *
 * Owns which sequence holds which of the num_blocks KV blocks (block_size tokens each;
 * the same ids index every layer pool of struct kv_cache), per-block refcounts, a free
 * list, and an automatic prefix cache. Pure bookkeeping: no device memory, no KV data.
 *
 * Threading: NOT thread-safe. The scheduler thread is the only caller of every function
 * here (ARCHITECTURE.md "Threads"); nothing is locked.
 *
 * Prefix cache (when enabled). A block that is FULL and whose KV has been computed
 * (bm_seq_commit) is cached under h = SipHash-2-4(key, parent_h || tokens[block_size]
 * || salt), where parent_h is the hash of the previous block of the same sequence (0 for
 * the first block) and key is the creator's 16-byte secret. A new sequence reuses the
 * longest chain of cached full blocks that starts its prompt (refcount++, no copy).
 * Lookups never trust the hash alone: a candidate must also match the stored parent
 * block id and its generation, the parent hash, the exact token ids, and (for the first
 * block) the exact salt bytes — so by induction along the chain a hit always holds KV
 * computed for exactly this prefix, even under a crafted 64-bit collision. Different
 * salts never share a block.
 *
 * Invariants:
 *   - every block is in exactly one state: FREE (on the free list, not cached),
 *     USED (refcount > 0, cached or not), or IDLE (refcount 0, cached, on the LRU list);
 *     num_free + num_used + num_cached_idle == num_blocks.
 *   - refcount of a block == number of sequence block tables that hold it.
 *   - only full blocks whose KV is computed are cached; cached blocks are immutable.
 *     A sequence writes KV only at positions >= max(num_computed, num_cached), which lie
 *     in blocks it allocated itself and that are not cached, hence refcount 1. So no
 *     copy-on-write.
 *   - the last, partial block of a prompt is never shared. A block-aligned prompt whose
 *     blocks are all cached (a full hit: n = num_cached) takes every block, and only its
 *     last position n - 1 is forwarded again (the forward needs a row to produce logits):
 *     num_computed = n - 1, and bm_seq_slot_mapping maps that position to slot -1, so its
 *     KV, already in the shared cached block, is read by attention and never rewritten.
 *     The first generated token (position n) then starts a fresh block.
 *   - eviction takes the least recently released IDLE block, and only when the free list
 *     is empty. A sequence's blocks are released last-first, so a prompt's tail is
 *     evicted before its head.
 *   - memory: per-block arrays are allocated at bm_create; a sequence's block table at
 *     bm_seq_create (sized for its max_tokens). Nothing is allocated per step.
 */
#ifndef TESSERA_ENGINE_BLOCK_MANAGER_H
#define TESSERA_ENGINE_BLOCK_MANAGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BM_SALT_MAX 64 /* longest salt (bytes) kept for exact comparison */

struct block_manager;
struct bm_seq;

/* Counters for /metrics. Block counts are a snapshot; token counts are cumulative. */
struct bm_stats {
    int num_blocks;          /* total */
    int num_free;            /* on the free list (never cached or evicted) */
    int num_used;            /* refcount > 0 */
    int num_cached;          /* in the prefix cache (used or idle) */
    int num_cached_idle;     /* cached with refcount 0: reusable, evictable */
    uint64_t query_tokens;   /* prompt tokens looked up in the prefix cache */
    uint64_t hit_tokens;     /* of those, whose KV came from cached blocks (a full hit
                                counts all n, though position n - 1 is forwarded again) */
    uint64_t evictions;      /* idle cached blocks reclaimed for new data */
};

/* Creates a manager of num_blocks blocks of block_size tokens. key is the 16-byte
 * SipHash key (caller keeps ownership; copied) — use a random secret so clients cannot
 * aim collisions. With enable_prefix_caching false nothing is ever cached or shared.
 * *out is owned by the caller and freed with bm_free. Scheduler thread. */
int bm_create(struct block_manager **out, int num_blocks, int block_size,
              bool enable_prefix_caching, const uint8_t key[16], char *err, size_t errlen);

/* Frees the manager. All sequences must have been freed first (their handles point
 * into it). NULL is a no-op. */
void bm_free(struct block_manager *bm);

/* Creates an empty sequence handle able to hold up to max_tokens tokens (prompt plus
 * generation), with a salt (salt_len <= BM_SALT_MAX bytes; NULL/0 = no salt) that
 * separates its prefix-cache entries from other salts. The salt is copied. The handle is
 * owned by the caller; release it with bm_seq_free. Allocates its block table here, once. */
int bm_seq_create(struct block_manager *bm, int64_t max_tokens, const void *salt,
                  size_t salt_len, struct bm_seq **out, char *err, size_t errlen);

/* Releases the sequence's blocks (as bm_seq_release) and frees the handle. NULL ok. */
void bm_seq_free(struct block_manager *bm, struct bm_seq *seq);

/* Releases every block of seq (finished, aborted or preempted) and resets it to empty, so
 * the same handle can be admitted again with bm_seq_alloc_prompt (recompute after
 * preemption). Computed full blocks stay cached as IDLE for later hits. */
void bm_seq_release(struct block_manager *bm, struct bm_seq *seq);

/* Admission check, no state change: looks up the prompt tokens[0, n) (borrowed) under
 * salt, and says whether a new sequence could take its cache hits and then have slots for
 * max(n_slots, hits) tokens. *n_cached (tokens whose KV the cache holds: n on a full hit,
 * after which bm_seq_alloc_prompt leaves num_computed = n - 1) and *n_new_blocks (blocks
 * to take from free/evictable) may be NULL. Returns true if it fits. */
bool bm_can_allocate(struct block_manager *bm, const int32_t *tokens, int64_t n,
                     const void *salt, size_t salt_len, int64_t n_slots, int64_t *n_cached,
                     int *n_new_blocks);

/* Starts an EMPTY sequence on the prompt tokens[0, n) (borrowed, n <= max_tokens): takes
 * the longest cached prefix (refcount++ on each hit block) and writes to *n_cached the
 * tokens whose KV came from the cache (num_cached, a multiple of block_size, <= n). Sets
 * num_tokens = num_computed = min(*n_cached, n - 1): on a full hit (*n_cached == n) the
 * last position is still to forward, for its logits, but its KV is not rewritten (its
 * slot maps to -1). Never needs a free block, so it cannot run out; then call
 * bm_seq_append_slots for the n - num_computed tokens to compute. Counts n query tokens
 * and *n_cached hit tokens in the stats. */
int bm_seq_alloc_prompt(struct block_manager *bm, struct bm_seq *seq, const int32_t *tokens,
                        int64_t n, int64_t *n_cached, char *err, size_t errlen);

/* From now on, bm_seq_alloc_prompt looks up only the prompt's first n tokens in the prefix
 * cache (at most n / block_size hit blocks; n <= 0: none), so the positions from there on
 * are computed, e.g. for their logits (prompt logprobs). Commits still cache the blocks. */
void bm_seq_limit_lookup(struct bm_seq *seq, int64_t n);

/* True if n_new more slots fit: within max_tokens and enough free + evictable blocks. */
bool bm_seq_can_append(const struct block_manager *bm, const struct bm_seq *seq,
                       int64_t n_new);

/* Reserves slots for positions num_tokens .. num_tokens + n_new - 1 (a decode token or a
 * prefill chunk), taking blocks from the free list, else evicting LRU idle cached blocks.
 * ERR_RANGE (and no change) if they do not fit; the scheduler then preempts. */
int bm_seq_append_slots(struct block_manager *bm, struct bm_seq *seq, int64_t n_new,
                        char *err, size_t errlen);

/* Gives back the slots of positions n_tokens .. num_tokens - 1 (speculative rows whose
 * tokens were not kept): blocks left holding none return to the free list. Those
 * positions are never committed, so the blocks are not cached and only this sequence
 * holds them. ERR_INVALID (and no change) if n_tokens is below num_computed or above
 * num_tokens. */
int bm_seq_truncate(struct block_manager *bm, struct bm_seq *seq, int64_t n_tokens, char *err,
                    size_t errlen);

/* Records that the KV of positions [0, n_computed) is now written (after a forward
 * step); tokens[0, n_computed) (borrowed) are the sequence's token ids, prompt and
 * generated. Newly completed full blocks enter the prefix cache. num_computed must not
 * go backwards nor pass num_tokens (ERR_INVALID). */
int bm_seq_commit(struct block_manager *bm, struct bm_seq *seq, const int32_t *tokens,
                  int64_t n_computed, char *err, size_t errlen);

/* Writes the KV write slots of positions pos0 .. pos0 + n - 1 of seq (a batch's
 * slot_mapping): slots[i] = block_table[p / block_size] * block_size + p % block_size,
 * or -1 for a position < num_cached, whose KV is in a shared cached block already and
 * must not be written (attention still reads it through the block table). ERR_RANGE if
 * a position has no slot. slots is the caller's [n] array. */
int bm_seq_slot_mapping(const struct block_manager *bm, const struct bm_seq *seq,
                        int64_t pos0, int64_t n, int64_t *slots, char *err, size_t errlen);

/* The sequence's block table [*num_blocks] of physical ids, borrowed until the next
 * call that changes seq. */
const int32_t *bm_seq_block_table(const struct bm_seq *seq, int *num_blocks);
int64_t bm_seq_num_tokens(const struct bm_seq *seq);   /* positions with a slot */
int64_t bm_seq_num_computed(const struct bm_seq *seq); /* positions with KV written */
int64_t bm_seq_num_cached(const struct bm_seq *seq);   /* positions hit at admission */

void bm_get_stats(const struct block_manager *bm, struct bm_stats *st);

/* ---- introspection for tests and debugging ------------------------------------------ */

/* Refcount of block id, or -1 if out of range. */
int bm_block_refcount(const struct block_manager *bm, int id);
/* If block id is cached, returns its stored token ids [block_size] (borrowed), else NULL. */
const int32_t *bm_block_cached_tokens(const struct block_manager *bm, int id);
/* Walks every internal structure (free list, LRU list, hash buckets, counters) and
 * returns 0 if they agree with the invariants above, else ERR_FORMAT with the first
 * violation. O(num_blocks). */
int bm_check(const struct block_manager *bm, char *err, size_t errlen);

/* SipHash-2-4 of data[0, len) under a 16-byte key (Aumasson & Bernstein, 2012). */
uint64_t bm_siphash24(const uint8_t key[16], const void *data, size_t len);

/* TEST ONLY: replaces the block hash function (NULL restores SipHash-2-4), e.g. with one
 * that collides on purpose. Call only while no block is cached. */
void bm_set_hash_fn(struct block_manager *bm,
                    uint64_t (*fn)(const uint8_t key[16], const void *data, size_t len));

#endif

/* bpe.c — the BPE model: the piece -> id map, the merge map (pair -> rank, merged id),
 * merges derived from SentencePiece scores, and the merge loop for one pre-tokenized
 * word. A word starts as one symbol per byte (byte-level vocabularies) or per character
 * (SentencePiece-style ones, with HF's byte fallback and unk fusing); the loop is shared.
 *
 * The merge loop is Hugging Face's Word::merge_all, step for step, so ties and stale
 * candidates resolve identically: a min-heap of (rank, left position) candidates over a
 * doubly linked list of symbols; popping a candidate whose pair no longer yields the
 * same merged id skips it; after a merge the new pairs with the left and right
 * neighbours are pushed. Cost O(n log n) per word of n bytes. Maps use open addressing
 * with linear probing and are read-only after loading.
 */
#include "tokenizer/tok_internal.h"

#include "util/err.h"

#include <stdlib.h>
#include <string.h>

struct tok_bpe_sym {
    int32_t id;
    int32_t prev, next; /* indices into syms, -1 at the ends */
    uint32_t len;       /* bytes covered; 0 = merged away */
};

struct tok_bpe_cand {
    int32_t rank;
    int32_t pos; /* index of the left symbol */
    int32_t id;  /* merged id */
};

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ULL;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t key)
{
    key *= 0x9E3779B97F4A7C15ULL;
    return key ^ (key >> 31);
}

int tok_vocab_map_build(struct tokenizer *t, char *err, size_t errlen)
{
    uint32_t cap = 16;
    while (cap < (uint32_t)t->n_vocab * 2u + 16u)
        cap *= 2;
    free(t->vocab.slots);
    t->vocab.slots = malloc(sizeof(int32_t) * cap);
    if (!t->vocab.slots)
        return err_set(err, errlen, ERR_NOMEM, "tokenizer: out of memory for the vocabulary map");
    memset(t->vocab.slots, 0xFF, sizeof(int32_t) * cap);
    t->vocab.cap = cap;
    /* Regular pieces first, then added ones replace an equal string (HF token_to_id
     * looks the added vocabulary up first). */
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t id = 0; id < t->n_vocab; id++) {
            bool added = (t->flags[id] & TOK_F_ADDED) != 0;
            if (added != (pass == 1) || t->piece_len[id] == 0)
                continue;
            const char *s = t->strs.data + t->piece_off[id];
            size_t n = t->piece_len[id];
            uint32_t i = (uint32_t)hash_bytes(s, n) & (cap - 1);
            for (;; i = (i + 1) & (cap - 1)) {
                int32_t o = t->vocab.slots[i];
                if (o < 0) {
                    t->vocab.slots[i] = id;
                    break;
                }
                if (t->piece_len[o] == n && memcmp(t->strs.data + t->piece_off[o], s, n) == 0) {
                    /* duplicate string: the later id wins within a pass, as a HF
                     * vocab dict holds one id per string anyway */
                    if (pass == 1 || o < id)
                        t->vocab.slots[i] = id;
                    break;
                }
            }
        }
    }
    return 0;
}

int32_t tok_vocab_lookup(const struct tokenizer *t, const char *s, size_t n)
{
    if (!t->vocab.slots)
        return -1;
    uint32_t cap = t->vocab.cap;
    uint32_t i = (uint32_t)hash_bytes(s, n) & (cap - 1);
    for (;; i = (i + 1) & (cap - 1)) {
        int32_t o = t->vocab.slots[i];
        if (o < 0)
            return -1;
        if (t->piece_len[o] == n && memcmp(t->strs.data + t->piece_off[o], s, n) == 0)
            return o;
    }
}

static int merge_map_grow(struct tok_merge_map *m)
{
    uint32_t cap = m->cap ? m->cap * 2 : 1024;
    struct tok_merge_entry *s = malloc(sizeof *s * cap);
    if (!s)
        return ERR_NOMEM;
    for (uint32_t i = 0; i < cap; i++)
        s[i].key = UINT64_MAX;
    for (uint32_t i = 0; i < m->cap; i++) {
        if (m->slots[i].key == UINT64_MAX)
            continue;
        uint32_t j = (uint32_t)hash_pair(m->slots[i].key) & (cap - 1);
        while (s[j].key != UINT64_MAX)
            j = (j + 1) & (cap - 1);
        s[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = s;
    m->cap = cap;
    return 0;
}

int tok_merge_map_put(struct tok_merge_map *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    if ((m->n + 1) * 2 > m->cap && merge_map_grow(m) < 0)
        return ERR_NOMEM;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = (uint32_t)hash_pair(key) & (m->cap - 1);
    for (;; i = (i + 1) & (m->cap - 1)) {
        if (m->slots[i].key == UINT64_MAX) {
            m->slots[i].key = key;
            m->n++;
            break;
        }
        if (m->slots[i].key == key)
            break; /* a repeated merge: the later rank wins, as in HF's HashMap collect */
    }
    m->slots[i].rank = rank;
    m->slots[i].id = id;
    return 0;
}

const struct tok_merge_entry *tok_merge_lookup(const struct tok_merge_map *m, int32_t a, int32_t b)
{
    if (!m->cap)
        return NULL;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = (uint32_t)hash_pair(key) & (m->cap - 1);
    for (;; i = (i + 1) & (m->cap - 1)) {
        const struct tok_merge_entry *e = &m->slots[i];
        if (e->key == key)
            return e;
        if (e->key == UINT64_MAX)
            return NULL;
    }
}

void tok_merge_map_free(struct tok_merge_map *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

void tok_bpe_scratch_free(struct tok_bpe_scratch *s)
{
    free(s->syms);
    free(s->heap);
    free(s->mapped);
    memset(s, 0, sizeof *s);
}

static bool cand_less(const struct tok_bpe_cand *a, const struct tok_bpe_cand *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct tok_bpe_cand *h, size_t *n, struct tok_bpe_cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static struct tok_bpe_cand heap_pop(struct tok_bpe_cand *h, size_t *n)
{
    struct tok_bpe_cand top = h[0];
    struct tok_bpe_cand last = h[--(*n)];
    size_t i = 0, m = *n;
    for (;;) {
        size_t l = 2 * i + 1, best = i;
        const struct tok_bpe_cand *bv = &last;
        if (l < m && cand_less(&h[l], bv)) {
            best = l;
            bv = &h[l];
        }
        if (l + 1 < m && cand_less(&h[l + 1], bv))
            best = l + 1;
        if (best == i)
            break;
        h[i] = h[best];
        i = best;
    }
    if (m)
        h[i] = last;
    return top;
}

static int ensure(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return ERR_NOMEM;
    *p = q;
    *cap = c;
    return 0;
}

static void push_sym(struct tok_bpe_sym *sym, int32_t *ns, int32_t id, uint32_t len)
{
    int32_t i = (*ns)++;
    sym[i] = (struct tok_bpe_sym){ id, i - 1, i + 1, len };
}

/* Character mode (HF BPE::merge_word without ByteLevel): one symbol per UTF-8
 * character that is a vocab entry; a missing one becomes its <0xXX> tokens when the
 * model has byte_fallback and all of them exist, else unk (consecutive unks fused when
 * fuse_unk), else nothing. sym has room for n symbols. Returns the symbol count. */
static int32_t char_symbols(const struct tokenizer *t, struct tok_bpe_sym *sym, const uint8_t *w, size_t n)
{
    int32_t ns = 0;
    int32_t unk_len = 0; /* bytes of a pending unk symbol, 0 = none */
    for (size_t i = 0; i < n;) {
        int l = tok_utf8_valid_len(w + i, n - i);
        if (l <= 0)
            l = 1; /* callers pass valid UTF-8; stay safe */
        int32_t id = tok_vocab_lookup(t, (const char *)w + i, (size_t)l);
        bool bytes_ok = false;
        if (id < 0 && t->byte_fallback) {
            bytes_ok = true;
            for (int k = 0; k < l; k++)
                bytes_ok = bytes_ok && t->byte_id[w[i + k]] >= 0;
        }
        if (id >= 0 || bytes_ok) {
            if (unk_len) {
                push_sym(sym, &ns, t->unk_id, (uint32_t)unk_len);
                unk_len = 0;
            }
            if (id >= 0)
                push_sym(sym, &ns, id, (uint32_t)l);
            else
                for (int k = 0; k < l; k++)
                    push_sym(sym, &ns, t->byte_id[w[i + k]], 1);
        } else if (t->unk_id >= 0) {
            if (unk_len && !t->fuse_unk) {
                push_sym(sym, &ns, t->unk_id, (uint32_t)unk_len);
                unk_len = 0;
            }
            unk_len += l;
        }
        i += (size_t)l;
    }
    if (unk_len)
        push_sym(sym, &ns, t->unk_id, (uint32_t)unk_len);
    return ns;
}

int tok_bpe_word(const struct tokenizer *t, struct tok_bpe_scratch *s, const uint8_t *w,
                 size_t n, tok_emit_fn emit, void *ctx)
{
    if (n == 0)
        return 0;
    if (t->byte_level && n == 1 && t->byte_id[w[0]] >= 0) {
        emit(ctx, t->byte_id[w[0]]);
        return 0;
    }
    if (!t->byte_level && t->ignore_merges) {
        int32_t id = tok_vocab_lookup(t, (const char *)w, n);
        if (id >= 0 && !(t->flags[id] & TOK_F_ADDED)) {
            emit(ctx, id);
            return 0;
        }
    } else if (t->ignore_merges) {
        /* HF BPE with ignore_merges: a word that is a vocab entry is one token */
        if (ensure((void **)&s->mapped, &s->cap_mapped, 2 * n, 1) < 0)
            return ERR_NOMEM;
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            m += (size_t)tok_byte_to_char(w[i], s->mapped + m);
        int32_t id = tok_vocab_lookup(t, s->mapped, m);
        if (id >= 0 && !(t->flags[id] & TOK_F_ADDED)) {
            emit(ctx, id);
            return 0;
        }
    }
    if (ensure((void **)&s->syms, &s->cap_syms, n, sizeof *s->syms) < 0 ||
        ensure((void **)&s->heap, &s->cap_heap, 2 * n, sizeof *s->heap) < 0)
        return ERR_NOMEM;

    /* One symbol per byte; bytes without a vocab entry become unk or are dropped. */
    struct tok_bpe_sym *sym = s->syms;
    int32_t ns = 0;
    if (!t->byte_level)
        ns = char_symbols(t, sym, w, n);
    for (size_t i = 0; t->byte_level && i < n; i++) {
        int32_t id = t->byte_id[w[i]];
        if (id < 0) {
            if (t->unk_id < 0)
                continue;
            if (t->fuse_unk && ns > 0 && sym[ns - 1].id == t->unk_id) {
                sym[ns - 1].len++;
                continue;
            }
            id = t->unk_id;
        }
        sym[ns].id = id;
        sym[ns].prev = ns - 1;
        sym[ns].next = ns + 1;
        sym[ns].len = 1;
        ns++;
    }
    if (ns == 0)
        return 0;
    sym[ns - 1].next = -1;

    struct tok_bpe_cand *heap = s->heap;
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < ns; i++) {
        const struct tok_merge_entry *e = tok_merge_lookup(&t->merges, sym[i].id, sym[i + 1].id);
        if (e)
            heap_push(heap, &nh, (struct tok_bpe_cand){ e->rank, i, e->id });
    }
    while (nh > 0) {
        struct tok_bpe_cand top = heap_pop(heap, &nh);
        struct tok_bpe_sym *cur = &sym[top.pos];
        if (cur->len == 0 || cur->next < 0)
            continue;
        int32_t next = cur->next;
        const struct tok_merge_entry *e = tok_merge_lookup(&t->merges, cur->id, sym[next].id);
        if (!e || e->id != top.id)
            continue; /* stale candidate */
        cur->id = top.id;
        cur->len += sym[next].len;
        cur->next = sym[next].next;
        sym[next].len = 0;
        if (cur->next >= 0)
            sym[cur->next].prev = top.pos;
        /* heap size never exceeds n-1 initial + 2 per merge (at most n-1 merges) */
        if (cur->prev >= 0) {
            e = tok_merge_lookup(&t->merges, sym[cur->prev].id, cur->id);
            if (e)
                heap_push(heap, &nh, (struct tok_bpe_cand){ e->rank, cur->prev, e->id });
        }
        if (cur->next >= 0) {
            e = tok_merge_lookup(&t->merges, cur->id, sym[cur->next].id);
            if (e)
                heap_push(heap, &nh, (struct tok_bpe_cand){ e->rank, top.pos, e->id });
        }
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next)
        emit(ctx, sym[i].id);
    return 0;
}

/* ---------------------------------------------------------------- merges from scores */

struct score_merge {
    float score;
    int32_t id, left, right;
};

static int score_merge_cmp(const void *pa, const void *pb)
{
    const struct score_merge *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    if (a->id != b->id)
        return a->id < b->id ? -1 : 1;
    if (a->left != b->left)
        return a->left < b->left ? -1 : 1;
    return (a->right > b->right) - (a->right < b->right);
}

int tok_merges_from_scores(struct tokenizer *t, const float *scores, char *err, size_t errlen)
{
    size_t n = 0, cap = 0;
    struct score_merge *m = NULL;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *p = t->strs.data + t->piece_off[id];
        size_t len = t->piece_len[id];
        /* every split at a character boundary into two vocab pieces */
        for (size_t k = 1; k < len; k++) {
            if (((uint8_t)p[k] & 0xC0) == 0x80)
                continue;
            int32_t l = tok_vocab_lookup(t, p, k);
            if (l < 0)
                continue;
            int32_t r = tok_vocab_lookup(t, p + k, len - k);
            if (r < 0)
                continue;
            if (n == cap) {
                size_t c = cap ? cap * 2 : 4096;
                struct score_merge *q = realloc(m, c * sizeof *q);
                if (!q) {
                    free(m);
                    return err_set(err, errlen, ERR_NOMEM, "out of memory for merges");
                }
                m = q;
                cap = c;
            }
            m[n++] = (struct score_merge){ scores[id], id, l, r };
        }
    }
    qsort(m, n, sizeof *m, score_merge_cmp);
    for (size_t i = 0; i < n; i++) {
        if (i >= (size_t)INT32_MAX || tok_merge_map_put(&t->merges, m[i].left, m[i].right, (int32_t)i, m[i].id) < 0) {
            free(m);
            return err_set(err, errlen, ERR_NOMEM, "out of memory for merges");
        }
    }
    free(m);
    return 0;
}

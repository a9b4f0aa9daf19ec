/* tokenizer.c — the tokenizer's core: building the tables the loaders fill, encoding
 * (added tokens -> normalizer -> added tokens flagged normalized -> pre-tokenizer ->
 * BPE, with the post-processor's BOS/EOS), decoding and the streaming decoder.
 *
 * The encode pipeline is Hugging Face `tokenizers`' (AddedVocabulary::
 * extract_and_normalize, then pre_tokenize, then BPE) with the same two added-token
 * passes. Text that is not valid UTF-8 (HF only takes str) is cut at the invalid bytes,
 * and each invalid byte becomes its own byte token. A struct tokenizer is immutable once
 * loaded; all per-call state (BPE heap, regex match data) is allocated by tok_encode and
 * freed before it returns, so any thread may encode concurrently.
 */
#include "tokenizer/tok_internal.h"

#include "util/err.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---------------------------------------------------------------- construction */

struct tokenizer *tok_new(void)
{
    struct tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->unk_id = -1;
    t->byte_level = true;
    t->bos_id = -1;
    t->eos_id = -1;
    for (int b = 0; b < 256; b++)
        t->byte_id[b] = -1;
    return t;
}

static int grow_ids(struct tokenizer *t, int32_t n)
{
    if (n <= t->n_vocab)
        return 0;
    if (n > t->cap_ids) {
        /* geometric growth: vocabularies arrive one id at a time */
        int32_t cap = t->cap_ids ? t->cap_ids : 1024;
        while (cap < n)
            cap *= 2;
        uint32_t *po = realloc(t->piece_off, sizeof *po * (size_t)cap);
        if (po)
            t->piece_off = po;
        uint32_t *pl = realloc(t->piece_len, sizeof *pl * (size_t)cap);
        if (pl)
            t->piece_len = pl;
        uint8_t *fl = realloc(t->flags, (size_t)cap);
        if (fl)
            t->flags = fl;
        if (!po || !pl || !fl)
            return ERR_NOMEM;
        t->cap_ids = cap;
    }
    for (int32_t i = t->n_vocab; i < n; i++) {
        t->piece_off[i] = 0;
        t->piece_len[i] = 0;
        t->flags[i] = 0;
    }
    t->n_vocab = n;
    return 0;
}

int tok_set_piece(struct tokenizer *t, int32_t id, const char *s, size_t n, uint8_t flags,
                  char *err, size_t errlen)
{
    if (id < 0 || id >= (1 << 24))
        return err_set(err, errlen, ERR_FORMAT, "token id %d out of range [0, 16777216)", (int)id);
    if (n > 65536)
        return err_set(err, errlen, ERR_FORMAT, "token %d is %zu bytes long (max 65536)", (int)id, n);
    if (t->strs.len + n > UINT32_MAX / 2)
        return err_set(err, errlen, ERR_FORMAT, "token strings exceed 2 GiB");
    if (grow_ids(t, id + 1) < 0)
        return err_set(err, errlen, ERR_NOMEM, "out of memory for %d tokens", (int)id + 1);
    t->piece_off[id] = (uint32_t)t->strs.len;
    t->piece_len[id] = (uint32_t)n;
    t->flags[id] = flags;
    if (tok_strbuf_append(&t->strs, s, n) < 0)
        return err_set(err, errlen, ERR_NOMEM, "out of memory for token strings");
    return 0;
}

/* The <0xXX> byte of a byte-fallback token, or -1. */
static int byte_token(const char *s, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    const char *h = strchr(hex, s[3]), *l = strchr(hex, s[4]);
    if (!h || !l || !s[3] || !s[4])
        return -1;
    return (int)((h - hex) * 16 + (l - hex));
}

/* Character-mode decoding of one piece, in place (the result is never longer): a byte
 * token becomes its byte (ByteFallback decoder), each U+2581 a space (Replace or
 * Metaspace decoder). Returns the new length. */
static int spm_decode_piece(const struct tokenizer *t, char *buf, size_t n)
{
    int b = t->dec_byte_fallback ? byte_token(buf, n) : -1;
    if (b >= 0) {
        buf[0] = (char)b;
        return 1;
    }
    if (!t->dec_replace_meta)
        return (int)n;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (i + 3 <= n && memcmp(buf + i, TOK_META, 3) == 0) {
            buf[o++] = ' ';
            i += 3;
        } else {
            buf[o++] = buf[i++];
        }
    }
    return (int)o;
}

int tok_finish_vocab(struct tokenizer *t, char *err, size_t errlen)
{
    if (t->n_vocab == 0)
        return err_set(err, errlen, ERR_FORMAT, "empty vocabulary");
    int rc = tok_vocab_map_build(t, err, errlen);
    if (rc < 0)
        return rc;
    t->dec_off = malloc(sizeof *t->dec_off * (size_t)t->n_vocab);
    t->dec_len = malloc(sizeof *t->dec_len * (size_t)t->n_vocab);
    if (!t->dec_off || !t->dec_len)
        return err_set(err, errlen, ERR_NOMEM, "out of memory for decode tables");
    /* HF's ByteLevel decoder: a token made only of alphabet characters decodes to their
     * bytes, any other token (e.g. "<｜User｜>") to its own UTF-8. Character mode: the
     * ByteFallback decoder turns <0xXX> into its byte, Replace/Metaspace U+2581 into " ". */
    char tmp[1024];
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint32_t n = t->piece_len[id];
        char *buf = n <= sizeof tmp ? tmp : malloc(n);
        if (!buf)
            return err_set(err, errlen, ERR_NOMEM, "out of memory");
        /* copy first: appending may move the arena */
        memcpy(buf, t->strs.data + t->piece_off[id], n);
        int m = t->byte_level ? tok_chars_to_bytes(buf, n, buf) : spm_decode_piece(t, buf, n);
        t->dec_off[id] = (uint32_t)t->strs.len;
        if (m >= 0) {
            t->dec_len[id] = (uint32_t)m;
            rc = tok_strbuf_append(&t->strs, buf, (size_t)m);
        } else {
            memcpy(buf, t->strs.data + t->piece_off[id], n);
            t->dec_len[id] = n;
            rc = tok_strbuf_append(&t->strs, buf, n);
        }
        if (buf != tmp)
            free(buf);
        if (rc < 0)
            return err_set(err, errlen, ERR_NOMEM, "out of memory for decode tables");
    }
    for (int b = 0; b < 256; b++) {
        char c[8];
        int n = t->byte_level ? tok_byte_to_char((uint8_t)b, c) : snprintf(c, sizeof c, "<0x%02X>", b);
        t->byte_id[b] = tok_vocab_lookup(t, c, (size_t)n);
    }
    return 0;
}

int tok_add_merge(struct tokenizer *t, const char *a, size_t na, const char *b, size_t nb,
                  int32_t rank, char *err, size_t errlen)
{
    int32_t ia = tok_vocab_lookup(t, a, na), ib = tok_vocab_lookup(t, b, nb);
    if (ia < 0 || ib < 0)
        return err_set(err, errlen, ERR_FORMAT, "merge %d \"%.*s %.*s\": \"%.*s\" is not in the vocabulary",
                       (int)rank, (int)(na > 64 ? 64 : na), a, (int)(nb > 64 ? 64 : nb), b,
                       (int)((ia < 0 ? na : nb) > 64 ? 64 : (ia < 0 ? na : nb)), ia < 0 ? a : b);
    char tmp[512];
    char *ab = na + nb <= sizeof tmp ? tmp : malloc(na + nb);
    if (!ab)
        return err_set(err, errlen, ERR_NOMEM, "out of memory");
    memcpy(ab, a, na);
    memcpy(ab + na, b, nb);
    int32_t im = tok_vocab_lookup(t, ab, na + nb);
    if (ab != tmp)
        free(ab);
    if (im < 0)
        return err_set(err, errlen, ERR_FORMAT, "merge %d \"%.*s %.*s\": the merged token is not in the vocabulary",
                       (int)rank, (int)(na > 64 ? 64 : na), a, (int)(nb > 64 ? 64 : nb), b);
    if (tok_merge_map_put(&t->merges, ia, ib, rank, im) < 0)
        return err_set(err, errlen, ERR_NOMEM, "out of memory for merges");
    return 0;
}

int tok_finish(struct tokenizer *t, char *err, size_t errlen)
{
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!(t->flags[id] & TOK_F_ADDED))
            continue;
        const char *s = t->strs.data + t->piece_off[id];
        size_t n = t->piece_len[id];
        int rc;
        if (t->flags[id] & TOK_F_NORMALIZED) {
            /* matched against normalized text, so its pattern is normalized too */
            const char *q = s;
            size_t qn = n;
            char *owned = NULL;
            if (tok_utf8_valid_len((const uint8_t *)s, n) > 0 || n == 0) {
                rc = tok_normalize(t, s, n, &q, &qn, &owned);
                if (rc < 0)
                    return err_set(err, errlen, rc, "added token %d: normalization failed", (int)id);
            }
            rc = tok_trie_insert(&t->norm_trie, q, qn, id);
            free(owned);
        } else {
            rc = tok_trie_insert(&t->raw_trie, s, n, id);
        }
        if (rc < 0)
            return err_set(err, errlen, ERR_NOMEM, "out of memory for added tokens");
    }
    return 0;
}

void tok_free(struct tokenizer *t)
{
    if (!t)
        return;
    free(t->strs.data);
    free(t->piece_off);
    free(t->piece_len);
    free(t->dec_off);
    free(t->dec_len);
    free(t->flags);
    free(t->vocab.slots);
    tok_merge_map_free(&t->merges);
    tok_steps_free(t);
    tok_trie_free(&t->raw_trie);
    tok_trie_free(&t->norm_trie);
    for (int i = 0; i < t->n_norms; i++) {
        free(t->norms[i].a);
        free(t->norms[i].b);
    }
    free(t);
}

/* ---------------------------------------------------------------- accessors */

int tok_vocab_size(const struct tokenizer *t) { return t->n_vocab; }
int tok_bos_id(const struct tokenizer *t) { return t->bos_id; }
int tok_eos_id(const struct tokenizer *t) { return t->eos_id; }

bool tok_adds_bos(const struct tokenizer *t)
{
    return t->n_prefix > 0;
}

void tok_set_adds_bos(struct tokenizer *t, bool on)
{
    if (!on) {
        t->n_prefix = 0;
    } else if (t->n_prefix == 0 && t->bos_id >= 0) {
        t->prefix[0] = t->bos_id;
        t->n_prefix = 1;
    }
}

int tok_find(const struct tokenizer *t, const char *piece)
{
    return tok_vocab_lookup(t, piece, strlen(piece));
}

bool tok_is_special(const struct tokenizer *t, int id)
{
    return id >= 0 && id < t->n_vocab && (t->flags[id] & TOK_F_SPECIAL);
}

/* ---------------------------------------------------------------- normalize */

static char *dup_str(const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

int tok_add_norm(struct tokenizer *t, enum tok_norm_kind kind, const char *a, const char *b,
                 char *err, size_t errlen)
{
    if (t->n_norms >= TOK_MAX_NORMS)
        return err_set(err, errlen, ERR_UNSUPPORTED, "more than %d normalizers", TOK_MAX_NORMS);
    struct tok_norm *nm = &t->norms[t->n_norms];
    nm->kind = kind;
    nm->a = dup_str(a);
    nm->b = dup_str(b);
    if ((a && !nm->a) || (b && !nm->b)) {
        free(nm->a);
        free(nm->b);
        return err_set(err, errlen, ERR_NOMEM, "out of memory");
    }
    t->n_norms++;
    return 0;
}

/* Prepend / Replace of s[0..n) into a new malloc'd buffer (*dst, *dst_len); *dst stays
 * NULL when the text is unchanged. */
static int norm_strings(const struct tok_norm *nm, const char *s, size_t n, char **dst, size_t *dst_len)
{
    *dst = NULL;
    size_t na = strlen(nm->a);
    if (nm->kind == TOK_NORM_PREPEND) {
        if (n == 0 || na == 0)
            return 0; /* HF prepends to non-empty text only */
        char *d = malloc(na + n);
        if (!d)
            return ERR_NOMEM;
        memcpy(d, nm->a, na);
        memcpy(d + na, s, n);
        *dst = d;
        *dst_len = na + n;
        return 0;
    }
    size_t nb = strlen(nm->b), hits = 0;
    if (na == 0)
        return 0;
    for (size_t i = 0; i + na <= n;) {
        if (memcmp(s + i, nm->a, na) == 0) {
            hits++;
            i += na;
        } else {
            i++;
        }
    }
    if (hits == 0)
        return 0;
    char *d = malloc(n - hits * na + hits * nb + 1);
    if (!d)
        return ERR_NOMEM;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (i + na <= n && memcmp(s + i, nm->a, na) == 0) {
            memcpy(d + o, nm->b, nb);
            o += nb;
            i += na;
        } else {
            d[o++] = s[i++];
        }
    }
    *dst = d;
    *dst_len = o;
    return 0;
}

int tok_normalize(const struct tokenizer *t, const char *s, size_t n, const char **out,
                  size_t *out_len, char **owned)
{
    *out = s;
    *out_len = n;
    *owned = NULL;
    bool ascii = true;
    for (size_t i = 0; i < n && ascii; i++)
        ascii = (uint8_t)s[i] < 0x80;
    for (int k = 0; k < t->n_norms; k++) {
        const struct tok_norm *nm = &t->norms[k];
        char *dst = NULL;
        size_t dst_len = 0;
        if (nm->kind == TOK_NORM_PREPEND || nm->kind == TOK_NORM_REPLACE) {
            int rc = norm_strings(nm, *out, *out_len, &dst, &dst_len);
            if (rc < 0) {
                free(*owned);
                *owned = NULL;
                return rc;
            }
            if (!dst)
                continue;
            ascii = false; /* the new strings may hold any character */
        } else {
            if (ascii)
                continue; /* every Unicode normal form leaves ASCII unchanged */
            utf8proc_option_t opt = UTF8PROC_STABLE;
            switch (nm->kind) {
            case TOK_NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
            case TOK_NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
            case TOK_NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
            case TOK_NORM_NFKD: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
            default: break;
            }
            utf8proc_uint8_t *u = NULL;
            utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)*out, (utf8proc_ssize_t)*out_len,
                                              &u, opt);
            if (m < 0) {
                free(*owned);
                *owned = NULL;
                return m == UTF8PROC_ERROR_NOMEM ? ERR_NOMEM : ERR_FORMAT;
            }
            dst = (char *)u;
            dst_len = (size_t)m;
        }
        free(*owned);
        *owned = dst;
        *out = dst;
        *out_len = dst_len;
    }
    return 0;
}

/* ---------------------------------------------------------------- encode */

struct enc {
    const struct tokenizer *t;
    int32_t *ids;
    int cap;
    int64_t n;
    bool parse_special;
    struct tok_bpe_scratch bpe;
    struct tok_pretok_scratch pre;
};

static void enc_emit(void *ctx, int32_t id)
{
    struct enc *e = ctx;
    if (e->n < e->cap)
        e->ids[e->n] = id;
    e->n++;
}

static int enc_word(void *ctx, const char *w, size_t n)
{
    struct enc *e = ctx;
    return tok_bpe_word(e->t, &e->bpe, (const uint8_t *)w, n, enc_emit, e);
}

/* Oniguruma/Rust White_Space, for lstrip/rstrip of added tokens. */
static bool is_ws(uint32_t c)
{
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

static bool is_word_char(uint32_t c)
{
    if (c == '_')
        return true;
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
           (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

/* Code point ending at s[end) (valid UTF-8 before end), its start in *at. */
static uint32_t cp_before(const char *s, size_t end, size_t *at)
{
    size_t i = end - 1;
    while (i > 0 && ((uint8_t)s[i] & 0xC0) == 0x80 && end - i < 4)
        i--;
    int l = tok_utf8_valid_len((const uint8_t *)s + i, end - i);
    if (l <= 0 || (size_t)l != end - i) {
        *at = end - 1;
        return 0xFFFD;
    }
    *at = i;
    return tok_utf8_decode((const uint8_t *)s + i, l);
}

static uint32_t cp_at(const char *s, size_t n, size_t i, int *len)
{
    int l = tok_utf8_valid_len((const uint8_t *)s + i, n - i);
    if (l <= 0) {
        *len = 1;
        return 0xFFFD;
    }
    *len = l;
    return tok_utf8_decode((const uint8_t *)s + i, l);
}

/* at_start: the text begins at offset 0 of the whole input (HF's offsets_original().0
 * == 0, which Metaspace's prepend_scheme "first" asks). */
typedef int (*gap_fn)(struct enc *e, const char *s, size_t n, bool at_start);

/* AddedVocabulary::find_matches over s[0..n) with one trie: calls gap() for the text
 * between added tokens and emits the tokens' ids. */
static int split_added(struct enc *e, const struct tok_trie *tr, const char *s, size_t n, bool at_start,
                       gap_fn gap)
{
    const struct tokenizer *t = e->t;
    size_t start_offset = 0, from = 0, ms, me;
    int32_t id;
    int rc;
    while (tr->n > 0 && (id = tok_trie_find(tr, s, n, from, &ms, &me)) >= 0) {
        from = me;
        uint8_t f = t->flags[id];
        if (!e->parse_special && (f & TOK_F_SPECIAL))
            continue;
        if (f & TOK_F_SINGLE_WORD) {
            size_t at;
            int l;
            bool start_ok = ms == 0 || !is_word_char(cp_before(s, ms, &at));
            bool stop_ok = me == n || !is_word_char(cp_at(s, n, me, &l));
            if (!start_ok || !stop_ok)
                continue;
        }
        if (f & TOK_F_LSTRIP) {
            size_t ns = ms, at;
            while (ns > 0 && is_ws(cp_before(s, ns, &at)))
                ns = at;
            ms = ns > start_offset ? ns : start_offset;
        }
        if (f & TOK_F_RSTRIP) {
            int l;
            while (me < n && is_ws(cp_at(s, n, me, &l)))
                me += (size_t)l;
        }
        if (ms > start_offset && (rc = gap(e, s + start_offset, ms - start_offset, at_start && start_offset == 0)) < 0)
            return rc;
        enc_emit(e, id);
        start_offset = me;
    }
    if (start_offset < n && (rc = gap(e, s + start_offset, n - start_offset, at_start && start_offset == 0)) < 0)
        return rc;
    return 0;
}

static int gap_pretokenize(struct enc *e, const char *s, size_t n, bool at_start)
{
    return tok_pretokenize(e->t, &e->pre, 0, s, n, at_start, enc_word, e);
}

/* Valid UTF-8 between raw added tokens: normalize, then the normalized added tokens. */
static int gap_valid(struct enc *e, const char *s, size_t n, bool at_start)
{
    const char *q;
    size_t qn;
    char *owned;
    int rc = tok_normalize(e->t, s, n, &q, &qn, &owned);
    if (rc < 0)
        return rc;
    rc = split_added(e, &e->t->norm_trie, q, qn, at_start, gap_pretokenize);
    free(owned);
    return rc;
}

/* Text between raw added tokens: valid UTF-8 runs go on, invalid bytes become their
 * byte tokens. */
static int gap_raw(struct enc *e, const char *s, size_t n, bool at_start)
{
    size_t i = 0, run = 0;
    const uint8_t *u = (const uint8_t *)s;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int l = tok_utf8_valid_len(u + i, n - i);
        if (l > 0) {
            i += (size_t)l;
            continue;
        }
        int rc;
        if (i > run && (rc = gap_valid(e, s + run, i - run, at_start && run == 0)) < 0)
            return rc;
        if (e->t->byte_id[u[i]] >= 0)
            enc_emit(e, e->t->byte_id[u[i]]);
        run = ++i;
    }
    return i > run ? gap_valid(e, s + run, i - run, at_start && run == 0) : 0;
}

int tok_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
               bool parse_special, int32_t *ids, int cap)
{
    if (!t || (!text && len) || cap < 0 || (cap > 0 && !ids))
        return ERR_INVALID;
    if (len > (size_t)INT_MAX / 2)
        return ERR_RANGE;
    struct enc e = { .t = t, .ids = ids, .cap = cap, .parse_special = parse_special };
    if (add_special)
        for (int i = 0; i < t->n_prefix; i++)
            enc_emit(&e, t->prefix[i]);
    int rc = split_added(&e, &t->raw_trie, text ? text : "", len, true, gap_raw);
    if (rc == 0 && add_special)
        for (int i = 0; i < t->n_suffix; i++)
            enc_emit(&e, t->suffix[i]);
    tok_bpe_scratch_free(&e.bpe);
    tok_pretok_scratch_free(&e.pre);
    if (rc < 0)
        return rc;
    return e.n > INT_MAX ? ERR_RANGE : (int)e.n;
}

/* ---------------------------------------------------------------- decode */

int tok_token_bytes(const struct tokenizer *t, int id, bool skip_special, char *buf, int cap)
{
    if (id < 0 || id >= t->n_vocab)
        return ERR_RANGE;
    if (skip_special && (t->flags[id] & TOK_F_SPECIAL))
        return 0;
    int n = (int)t->dec_len[id];
    if (buf && cap > 0)
        memcpy(buf, t->strs.data + t->dec_off[id], (size_t)(n < cap ? n : cap));
    return n;
}

char *tok_decode(const struct tokenizer *t, const int32_t *ids, int n, bool skip_special)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->n_vocab && !(skip_special && (t->flags[ids[i]] & TOK_F_SPECIAL)))
            total += t->dec_len[ids[i]];
    char *out = malloc(total + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    bool first = true;
    for (int i = 0; i < n; i++) {
        int id = ids[i];
        if (id < 0 || id >= t->n_vocab || (skip_special && (t->flags[id] & TOK_F_SPECIAL)))
            continue; /* unknown ids decode to nothing, as HF's id_to_token misses do */
        const char *d = t->strs.data + t->dec_off[id];
        size_t dn = t->dec_len[id];
        const char *p = t->strs.data + t->piece_off[id];
        if (first && t->dec_meta_first && byte_token(p, t->piece_len[id]) < 0) {
            /* HF's Metaspace decoder drops every U+2581 of the first token */
            for (size_t k = 0; k < t->piece_len[id];) {
                if (k + 3 <= t->piece_len[id] && memcmp(p + k, TOK_META, 3) == 0) {
                    k += 3;
                    continue;
                }
                out[o++] = p[k++];
            }
        } else {
            memcpy(out + o, d, dn);
            o += dn;
        }
        first = false;
    }
    out[o] = 0;
    /* Strip decoder after Fuse: leading spaces of the whole text */
    size_t cut = 0;
    while ((int)cut < t->dec_strip_lead && cut < o && out[cut] == ' ')
        cut++;
    if (cut) {
        memmove(out, out + cut, o - cut + 1);
    }
    return out;
}

/* ---------------------------------------------------------------- streaming */

void tok_stream_init(struct tok_stream *s)
{
    memset(s, 0, sizeof *s);
}

static const char replacement[3] = { (char)0xEF, (char)0xBF, (char)0xBD };

/* Expected length of a sequence starting with lead byte c, or 0 if c cannot start one. */
static int utf8_lead_len(uint8_t c)
{
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return 2;
    if (c >= 0xE0 && c <= 0xEF)
        return 3;
    if (c >= 0xF0 && c <= 0xF4)
        return 4;
    return 0;
}

/* Whether p[0..n) (n < full length) is a valid start of a UTF-8 sequence. */
static bool utf8_valid_prefix(const uint8_t *p, int n)
{
    uint8_t tmp[4] = { p[0], 0x80, 0x80, 0x80 };
    for (int i = 1; i < n; i++)
        tmp[i] = p[i];
    /* pad with the smallest continuation that keeps the second-byte ranges valid */
    if (n == 1) {
        if (p[0] == 0xE0)
            tmp[1] = 0xA0;
        else if (p[0] == 0xF0)
            tmp[1] = 0x90;
    }
    return tok_utf8_valid_len(tmp, (size_t)utf8_lead_len(p[0])) > 0;
}

/* Appends bytes to out, keeping at most 3 bytes of an incomplete character in s. */
static int stream_push(struct tok_stream *s, const uint8_t *src, int n, char *out, int cap, int *o)
{
    for (int i = 0; i < n; i++) {
        s->pending[s->n_pending++] = (char)src[i];
        for (;;) {
            const uint8_t *p = (const uint8_t *)s->pending;
            int np = s->n_pending;
            if (np == 0)
                break;
            int want = utf8_lead_len(p[0]);
            if (want == 0 || (np < want && !utf8_valid_prefix(p, np)) ||
                (np >= want && tok_utf8_valid_len(p, (size_t)want) == 0)) {
                /* an invalid sequence: U+FFFD for its first byte, retry the rest */
                if (*o + 3 >= cap)
                    return ERR_RANGE;
                memcpy(out + *o, replacement, 3);
                *o += 3;
                memmove(s->pending, s->pending + 1, (size_t)(np - 1));
                s->n_pending--;
                continue;
            }
            if (np < want)
                break; /* wait for the continuation */
            if (*o + want >= cap)
                return ERR_RANGE;
            memcpy(out + *o, p, (size_t)want);
            *o += want;
            s->n_pending = 0;
            break;
        }
    }
    return 0;
}

int tok_stream_feed(const struct tokenizer *t, struct tok_stream *s, int id, bool skip_special,
                    char *out, int cap)
{
    if (!out || cap < 1)
        return ERR_RANGE;
    out[0] = 0;
    if (id < 0 || id >= t->n_vocab)
        return ERR_RANGE;
    if (skip_special && (t->flags[id] & TOK_F_SPECIAL))
        return 0;
    struct tok_stream saved = *s;
    int o = 0;
    int rc = stream_push(s, (const uint8_t *)t->strs.data + t->dec_off[id], (int)t->dec_len[id],
                         out, cap, &o);
    if (rc < 0) {
        *s = saved; /* nothing consumed: the caller may retry with a bigger buffer */
        out[0] = 0;
        return rc;
    }
    out[o] = 0;
    return o;
}

int tok_stream_flush(struct tok_stream *s, char *out, int cap)
{
    if (!out || cap < 1)
        return ERR_RANGE;
    if (s->n_pending == 0) {
        out[0] = 0;
        return 0;
    }
    if (cap < 4)
        return ERR_RANGE;
    memcpy(out, replacement, 3);
    out[3] = 0;
    s->n_pending = 0;
    return 3;
}

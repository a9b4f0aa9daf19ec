/* tok_internal.h — the layout of struct tokenizer, shared by the tokenizer's own files
 * (tokenizer.c encode and decode, bpe.c merges and vocab maps, pretok.c pre-tokenizer,
 * added.c added-token matcher, byte_alpha.c GPT-2 byte alphabet, load_hf.c and
 * load_gguf.c). Nothing outside src/tokenizer/ includes it.
 *
 * Two BPE flavours share the tables: byte-level (GPT-2 style: the model sees every byte
 * as a GPT-2 alphabet character; byte_level = true) and character-level with byte
 * fallback (SentencePiece style: Llama 2, Mistral, Phi-3, Gemma; the model sees UTF-8
 * characters, spaces turned into U+2581 by the normalizer or the Metaspace
 * pre-tokenizer, and a character missing from the vocabulary becomes its <0xXX> tokens).
 *
 * Invariants once a loader returns: every id in [0, n_vocab) has a piece (possibly empty
 * for holes), merges reference valid ids, byte_id[b] is the id that stands for byte b
 * (the alphabet character of b when byte_level, else the <0xXX> token; -1 if none), and
 * the struct is never written again except through tok_set_adds_bos (which callers do
 * before sharing it between threads).
 */
#ifndef TESSERA_TOKENIZER_INTERNAL_H
#define TESSERA_TOKENIZER_INTERNAL_H

#include "tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- growable byte arena for token strings (byte_alpha.c) ---- */
struct tok_strbuf {
    char *data;
    size_t len, cap;
};
int tok_strbuf_append(struct tok_strbuf *b, const void *p, size_t n);

/* ---- GPT-2 byte alphabet (byte_alpha.c) ---- */
/* UTF-8 of the alphabet character for byte b: writes 1 or 2 bytes to out, returns count. */
int tok_byte_to_char(uint8_t b, char out[2]);
/* Undoes the alphabet for a whole string: if every character of s is an alphabet
 * character, writes the bytes to out (capacity >= n) and returns their count; else -1. */
int tok_chars_to_bytes(const char *s, size_t n, char *out);
/* Length of the valid UTF-8 sequence at s (1..4), or 0 if s[0..] is not valid UTF-8
 * (overlong, surrogate, > U+10FFFF, truncated). */
int tok_utf8_valid_len(const uint8_t *s, size_t n);
/* Decodes one valid UTF-8 character (caller checked validity); returns the code point. */
uint32_t tok_utf8_decode(const uint8_t *s, int len);

/* ---- string -> id map over the piece arena (bpe.c) ---- */
struct tok_vocab_map {
    int32_t *slots; /* [cap] id or -1 */
    uint32_t cap;   /* power of two */
};
/* ---- (left id, right id) -> (rank, merged id) map (bpe.c) ---- */
struct tok_merge_entry {
    uint64_t key; /* left << 32 | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t id;
};
struct tok_merge_map {
    struct tok_merge_entry *slots; /* [cap] */
    uint32_t cap;
    uint32_t n;
};

/* ---- pre-tokenizer steps (pretok.c) ---- */
enum tok_split_behavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_PREV,
    TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS,
};
enum tok_step_kind {
    TOK_STEP_SPLIT,     /* regex split (Split, Digits, Punctuation, ByteLevel's regex) */
    TOK_STEP_PREFIX_SPACE, /* ByteLevel add_prefix_space: prepend " " unless present */
    TOK_STEP_BYTELEVEL, /* ByteLevel followed by more steps: they see alphabet characters */
    TOK_STEP_METASPACE, /* Metaspace: " " -> U+2581, prepend_scheme, optional split */
};
enum tok_prepend_scheme {
    TOK_PREPEND_ALWAYS,
    TOK_PREPEND_FIRST, /* only on the piece at offset 0 of the whole input */
    TOK_PREPEND_NEVER,
};
struct tok_step {
    enum tok_step_kind kind;
    pcre2_code *re;  /* TOK_STEP_SPLIT: compiled (JIT when available) */
    enum tok_split_behavior behavior;
    bool invert;
    enum tok_prepend_scheme prepend; /* TOK_STEP_METASPACE */
    bool meta_split;                 /* TOK_STEP_METASPACE: split before each U+2581 */
};

/* Normalizers, applied in order: the Unicode forms through utf8proc; Prepend and
 * Replace (String pattern) with their two strings. */
enum tok_norm_kind {
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_PREPEND, /* a = the prefix, added to non-empty text */
    TOK_NORM_REPLACE, /* every a -> b */
};
struct tok_norm {
    enum tok_norm_kind kind;
    char *a, *b; /* owned, NUL-terminated (Prepend/Replace) */
};
#define TOK_MAX_NORMS 8
#define TOK_MAX_STEPS 16
#define TOK_MAX_AFFIX 4

/* ---- added-token matcher: byte trie (added.c) ---- */
struct tok_trie_node {
    int32_t first_child; /* index or -1 */
    int32_t next_sibling;
    int32_t token;       /* id ending here, or -1 */
    uint8_t byte;
};
struct tok_trie {
    struct tok_trie_node *nodes; /* [n]; node 0 is the root */
    int32_t n, cap;
    uint8_t first[32];           /* bitmap of bytes that start some token */
};

/* Per-id flags. */
enum {
    TOK_F_ADDED = 1,   /* an added token (matched in text, never split) */
    TOK_F_SPECIAL = 2, /* special: skipped by parse_special=false and skip_special */
    TOK_F_LSTRIP = 4,
    TOK_F_RSTRIP = 8,
    TOK_F_SINGLE_WORD = 16,
    TOK_F_NORMALIZED = 32, /* matched on normalized text (second pass) */
};

struct tokenizer {
    int32_t n_vocab;       /* ids are [0, n_vocab) */
    int32_t cap_ids;       /* allocated length of the per-id arrays while loading */
    struct tok_strbuf strs; /* piece strings, then decoded bytes */
    uint32_t *piece_off;    /* [n_vocab] offset of the stored form in strs */
    uint32_t *piece_len;    /* [n_vocab] */
    uint32_t *dec_off;      /* [n_vocab] offset of the decoded bytes in strs */
    uint32_t *dec_len;      /* [n_vocab] */
    uint8_t *flags;         /* [n_vocab] TOK_F_* */
    struct tok_vocab_map vocab;   /* piece -> id (added tokens take precedence) */
    struct tok_merge_map merges;
    bool byte_level;        /* GPT-2 byte alphabet (else characters + byte fallback) */
    int32_t byte_id[256];   /* id standing for byte b (alphabet char or <0xXX>), or -1 */
    bool byte_fallback;     /* character mode: unknown characters -> their <0xXX> ids */
    bool ignore_merges;     /* look the whole word up before merging */
    int32_t unk_id;         /* -1: unknown characters are dropped (HF without unk_token) */
    bool fuse_unk;
    /* decoding (character mode): <0xXX> -> its byte (ByteFallback decoder), U+2581 ->
     * " " (Replace or Metaspace decoder) per token; then dec_strip_lead leading spaces
     * of the whole text are removed (Strip decoder after Fuse), or every U+2581 of the
     * first token is dropped (Metaspace decoder with a prepend scheme) */
    bool dec_byte_fallback;
    bool dec_replace_meta;
    int dec_strip_lead;
    bool dec_meta_first;

    int n_norms;
    struct tok_norm norms[TOK_MAX_NORMS];
    int n_steps;
    struct tok_step steps[TOK_MAX_STEPS];

    struct tok_trie raw_trie;  /* added tokens matched on raw text */
    struct tok_trie norm_trie; /* added tokens flagged normalized, matched after normalizing */

    int32_t bos_id, eos_id;
    int n_prefix, n_suffix; /* ids the post-processor adds around the sequence */
    int32_t prefix[TOK_MAX_AFFIX];
    int32_t suffix[TOK_MAX_AFFIX];
};

/* ---- construction helpers (tokenizer.c) ---- */
struct tokenizer *tok_new(void);
/* Sets piece id (grows the tables); a later call for the same id replaces it. */
int tok_set_piece(struct tokenizer *t, int32_t id, const char *s, size_t n, uint8_t flags,
                  char *err, size_t errlen);
/* After all pieces are set (and byte_level / the decoder fields chosen): builds the vocab
 * map, decoded bytes and byte_id table. */
int tok_finish_vocab(struct tokenizer *t, char *err, size_t errlen);
/* Adds merge a+b (by piece strings) with the next rank; after tok_finish_vocab. */
int tok_add_merge(struct tokenizer *t, const char *a, size_t na, const char *b, size_t nb,
                  int32_t rank, char *err, size_t errlen);
/* After merges: builds the added-token tries (normalizing contents flagged normalized). */
int tok_finish(struct tokenizer *t, char *err, size_t errlen);
/* Appends a normalizer (a, b copied; NULL where unused). */
int tok_add_norm(struct tokenizer *t, enum tok_norm_kind kind, const char *a, const char *b,
                 char *err, size_t errlen);
/* SentencePiece-style merges from piece scores, as Hugging Face's converter
 * (SentencePieceExtractor) writes them into tokenizer.json: every split of every piece
 * into two pieces is a merge, ranked by the merged piece's score (higher first), then
 * the merged piece's id, then the left and right ids. scores[n_vocab]. */
int tok_merges_from_scores(struct tokenizer *t, const float *scores, char *err, size_t errlen);

/* ---- bpe.c ---- */
int tok_vocab_map_build(struct tokenizer *t, char *err, size_t errlen);
int32_t tok_vocab_lookup(const struct tokenizer *t, const char *s, size_t n);
int tok_merge_map_put(struct tok_merge_map *m, int32_t a, int32_t b, int32_t rank, int32_t id);
const struct tok_merge_entry *tok_merge_lookup(const struct tok_merge_map *m, int32_t a, int32_t b);
void tok_merge_map_free(struct tok_merge_map *m);

/* Scratch for one encode call's BPE (caller-owned, reused across words). */
struct tok_bpe_scratch {
    struct tok_bpe_sym *syms;
    struct tok_bpe_cand *heap;
    char *mapped;
    size_t cap_syms, cap_heap, cap_mapped;
};
void tok_bpe_scratch_free(struct tok_bpe_scratch *s);
/* Emits the ids of one pre-tokenized word through emit: raw bytes when t->byte_level,
 * else valid UTF-8 characters. Returns 0 or ERR_NOMEM. */
typedef void (*tok_emit_fn)(void *ctx, int32_t id);
int tok_bpe_word(const struct tokenizer *t, struct tok_bpe_scratch *s, const uint8_t *w,
                 size_t n, tok_emit_fn emit, void *ctx);

/* ---- pretok.c ---- */
/* Compiles a Hugging Face (Oniguruma-syntax) regex for a split step; literal=true for
 * Split's String pattern. */
int tok_step_add_split(struct tokenizer *t, const char *pattern, size_t len, bool literal,
                       enum tok_split_behavior behavior, bool invert, const char *what,
                       char *err, size_t errlen);
int tok_step_add_prefix_space(struct tokenizer *t, char *err, size_t errlen);
/* Appends a step of a kind without a regex (TOK_STEP_BYTELEVEL, TOK_STEP_METASPACE);
 * returns it for the caller to fill, or NULL (error written) when the table is full. */
struct tok_step *tok_step_add(struct tokenizer *t, enum tok_step_kind kind, char *err, size_t errlen);
/* The GPT-2 regex ByteLevel(use_regex=true) applies. */
extern const char tok_gpt2_regex[];
/* The class HF's Punctuation pre-tokenizer splits on (one character per match). */
extern const char tok_punct_regex[];
void tok_steps_free(struct tokenizer *t);

/* Scratch for pre-tokenizing (caller-owned, per encode call). */
struct tok_span {
    uint32_t start, end;
};
struct tok_pretok_level {
    struct tok_span *spans;
    size_t n, cap;
    char *buf; /* transformed copy of the piece (prefix space, alphabet, Metaspace) */
    size_t buf_cap;
};
struct tok_pretok_scratch {
    pcre2_match_data *md;
    struct tok_pretok_level level[TOK_MAX_STEPS];
    char *bytes; /* a word mapped back from the alphabet */
    size_t bytes_cap;
};
void tok_pretok_scratch_free(struct tok_pretok_scratch *s);
/* Runs the steps from `step` on text[0..n) (valid UTF-8) and calls word() for each
 * final piece in order. at_start: text begins at offset 0 of the whole input (Metaspace
 * prepend_scheme "first"). Returns 0 or a negative code. */
typedef int (*tok_word_fn)(void *ctx, const char *w, size_t n);
int tok_pretokenize(const struct tokenizer *t, struct tok_pretok_scratch *s, int step,
                    const char *text, size_t n, bool at_start, tok_word_fn word, void *ctx);

/* ---- added.c ---- */
int tok_trie_insert(struct tok_trie *tr, const char *s, size_t n, int32_t id);
void tok_trie_free(struct tok_trie *tr);
/* Leftmost-longest match in s[from..n): returns the id and sets start and end, or -1. */
int32_t tok_trie_find(const struct tok_trie *tr, const char *s, size_t n, size_t from,
                      size_t *start, size_t *end);

/* ---- normalize (tokenizer.c) ---- */
/* Applies t's normalizers to s[0..n) (valid UTF-8): *out is s itself when nothing
 * changes, else a malloc'd buffer stored in *owned (caller frees). */
#define TOK_META "\xe2\x96\x81" /* U+2581, SentencePiece's space */
int tok_normalize(const struct tokenizer *t, const char *s, size_t n, const char **out,
                  size_t *out_len, char **owned);

#endif

/* tok_internal.h — the layout of struct tokenizer, shared by the tokenizer's own files
 * (tokenizer.c encode and decode, bpe.c merges and vocab maps, pretok.c pre-tokenizer,
 * added.c added-token matcher, byte_alpha.c GPT-2 byte alphabet, load_hf.c and
 * load_gguf.c). Nothing outside src/tokenizer/ includes it.
 *
 * Invariants once a loader returns: every id in [0, n_vocab) has a piece (possibly empty
 * for holes), merges reference valid ids, byte_id[b] is the vocab id of the alphabet
 * character of byte b (or -1), and the struct is never written again except through
 * tok_set_adds_bos (which callers do before sharing it between threads).
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
    TOK_STEP_SPLIT,     /* regex split (Split, Digits, ByteLevel's regex) */
    TOK_STEP_PREFIX_SPACE, /* ByteLevel add_prefix_space: prepend " " unless present */
};
struct tok_step {
    enum tok_step_kind kind;
    pcre2_code *re;  /* TOK_STEP_SPLIT: compiled (JIT when available) */
    enum tok_split_behavior behavior;
    bool invert;
};

/* Normalizers that utf8proc implements, applied in order. */
enum tok_norm {
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
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
    int32_t byte_id[256];   /* alphabet char of byte b -> id, or -1 */
    bool ignore_merges;     /* look the whole word up before merging */
    int32_t unk_id;         /* -1: unknown characters are dropped (HF without unk_token) */
    bool fuse_unk;

    int n_norms;
    enum tok_norm norms[TOK_MAX_NORMS];
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
/* After all pieces are set: builds the vocab map, decoded bytes and byte_id table. */
int tok_finish_vocab(struct tokenizer *t, char *err, size_t errlen);
/* Adds merge a+b (by piece strings) with the next rank; after tok_finish_vocab. */
int tok_add_merge(struct tokenizer *t, const char *a, size_t na, const char *b, size_t nb,
                  int32_t rank, char *err, size_t errlen);
/* After merges: builds the added-token tries (normalizing contents flagged normalized). */
int tok_finish(struct tokenizer *t, char *err, size_t errlen);

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
/* Emits the ids of one pre-tokenized word (raw bytes) through emit. Returns 0 or
 * ERR_NOMEM. */
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
/* The GPT-2 regex ByteLevel(use_regex=true) applies. */
extern const char tok_gpt2_regex[];
void tok_steps_free(struct tokenizer *t);

/* Scratch for pre-tokenizing (caller-owned, per encode call). */
struct tok_span {
    uint32_t start, end;
};
struct tok_pretok_level {
    struct tok_span *spans;
    size_t n, cap;
    char *buf; /* prefix-space copy of the piece */
    size_t buf_cap;
};
struct tok_pretok_scratch {
    pcre2_match_data *md;
    struct tok_pretok_level level[TOK_MAX_STEPS];
};
void tok_pretok_scratch_free(struct tok_pretok_scratch *s);
/* Runs the steps from `step` on text[0..n) (valid UTF-8) and calls word() for each
 * final piece in order. Returns 0 or a negative code. */
typedef int (*tok_word_fn)(void *ctx, const char *w, size_t n);
int tok_pretokenize(const struct tokenizer *t, struct tok_pretok_scratch *s, int step,
                    const char *text, size_t n, tok_word_fn word, void *ctx);

/* ---- added.c ---- */
int tok_trie_insert(struct tok_trie *tr, const char *s, size_t n, int32_t id);
void tok_trie_free(struct tok_trie *tr);
/* Leftmost-longest match in s[from..n): returns the id and sets start and end, or -1. */
int32_t tok_trie_find(const struct tok_trie *tr, const char *s, size_t n, size_t from,
                      size_t *start, size_t *end);

/* ---- normalize (tokenizer.c) ---- */
/* Applies t's normalizers to s[0..n) (valid UTF-8): *out is s itself when nothing
 * changes, else a malloc'd buffer stored in *owned (caller frees). */
int tok_normalize(const struct tokenizer *t, const char *s, size_t n, const char **out,
                  size_t *out_len, char **owned);

#endif

/* grammar_int.h — the compiled form of a grammar, shared by the compilers (regex.c,
 * schema.c, gbnf.c, grammar.c) and the matcher (matcher.c). Private to src/grammar.
 *
 * A grammar is a set of rules; a rule is a list of alternatives; an alternative is a run
 * of elements in one flat array, closed by GEL_END. Elements:
 *   GEL_CLASS  one byte out of a 256-bit set (literal text is one CLASS per byte)
 *   GEL_REF    a rule (the matcher pushes the continuation and enters each alternative)
 *   GEL_DFA    a lexeme matched by a byte DFA (strings, numbers, whitespace, regexes);
 *              the matcher keeps the DFA state in the stack frame, so a long string
 *              costs one frame and one table lookup per byte
 * Rule 0 is the start rule. Everything is immutable once compiled.
 */
#ifndef TESSERA_GRAMMAR_INT_H
#define TESSERA_GRAMMAR_INT_H

#include "grammar/grammar.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Compile-time limits (docs/grammar.md). */
#define GR_MAX_DFA_STATES 16384  /* one lexeme's DFA */
#define GR_MAX_NFA_STATES 65536  /* one regex's NFA before determinisation */
#define GR_MAX_ELEMS (1 << 20)   /* elements of one grammar */
#define GR_MAX_TOTAL_DFA_STATES 65536
#define GR_MAX_DEPTH 64          /* schema nesting while compiling */

enum gel_kind { GEL_END = 0, GEL_CLASS, GEL_REF, GEL_DFA };

struct gel {
    uint32_t kind; /* enum gel_kind */
    uint32_t arg;  /* CLASS: class index; REF: rule; DFA: dfa index */
};

/* A deterministic automaton over bytes. Bytes the automaton treats alike share a class
 * bc[b] < n_bc; trans[s * n_bc + bc[b]] is the next state or -1 (gdfa_step). */
struct gdfa {
    int n_states;
    int start;
    int n_bc;
    uint8_t bc[256];
    int32_t *trans;  /* [n_states * n_bc] */
    uint8_t *accept; /* [n_states] 1 = a lexeme may end here */
    uint8_t *live;   /* [n_states] 1 = some byte continues from here */
    uint32_t *next;  /* [n_states * 8] 256-bit set of the bytes that continue */
    uint32_t cont[8]; /* bytes that continue from some accepting state */
    int32_t *cls;    /* [n_states] behaviour class: states of one class do the same to every
                        text up to the longest token (+1 byte), so they have one mask */
};

struct gtrie_node {
    uint32_t size;      /* nodes in the subtree, this one included */
    uint32_t tok_first; /* into tok_ids */
    uint16_t tok_count;
    uint8_t byte;       /* the byte leading here from the parent */
};

struct grammar_vocab {
    int vocab_size;
    int32_t *eog;         /* [n_eog] */
    int n_eog;
    uint8_t *is_eog;      /* [vocab_size] */
    uint8_t *is_special;  /* [vocab_size] */
    char *bytes;          /* all tokens' text bytes */
    uint32_t *off;        /* [vocab_size + 1] token id's bytes are bytes[off[id], off[id+1]) */
    /* Byte trie in depth-first preorder: node 0 is the root (no byte); node i's subtree is
     * [i, i + size); its first child is i + 1 (when size > 1); the next sibling of a child
     * c is c + nodes[c].size. tok_ids[tok_first, tok_first + tok_count) are the tokens
     * whose bytes end at the node. */
    int n_nodes;
    struct gtrie_node *nodes;
    int32_t *tok_ids;
    int max_token_len;
};

/* A cached mask: the state key it was computed for and the mask. */
struct gcache_entry {
    uint64_t hash;
    uint32_t *key;
    int key_len, key_cap;
    uint32_t *mask;
    bool used;
};

#define GR_CACHE_SLOTS 128
#define GR_MEMO_SLOTS 32

/* What one DFA state does to the whole vocabulary, independent of the stack below it:
 * `inside` = tokens the DFA consumes entirely from `state`; `bnd` = the trie nodes where
 * the DFA cannot take the node's byte right after an accepting state (below the first
 * byte): the only places where the text after the lexeme can start inside a token. */
struct gdfa_memo {
    int dfa, state;
    uint32_t *inside;   /* [mask words] */
    uint32_t (*bnd)[2]; /* [n_bnd] (trie node, DFA state at its parent) */
    int n_bnd;
};

struct grammar {
    atomic_int refs;
    const struct grammar_vocab *vocab;
    struct gel *elems; /* all alternatives, each closed by GEL_END */
    int n_elems;
    int n_rules;
    int32_t *rule_alt_first; /* [n_rules] index into alt_start */
    int32_t *rule_alt_count; /* [n_rules] */
    int32_t *alt_start;      /* [n_alts] element index */
    int n_alts;
    uint32_t (*classes)[8];  /* [n_classes] 256-bit sets */
    int n_classes;
    struct gdfa *dfas;
    int n_dfas;
    /* Mask cache: keyed by the matcher state (exact comparison on a hit); a mutex makes it
     * safe should matchers of one grammar ever run on several threads (today all run on
     * the scheduler thread). Replacement is round robin. */
    pthread_mutex_t cache_lock;
    struct gcache_entry cache[GR_CACHE_SLOTS];
    int cache_next;
    atomic_long cache_hits, cache_misses;
    struct gdfa_memo memo[GR_MEMO_SLOTS]; /* under cache_lock; filled once, never evicted */
    int n_memo;
};

static inline bool gr_class_has(const uint32_t *cls, unsigned b) { return (cls[b >> 5] >> (b & 31)) & 1u; }

static inline int32_t gdfa_step(const struct gdfa *d, int s, unsigned b)
{
    return d->trans[(size_t)s * (size_t)d->n_bc + d->bc[b & 255]];
}

/* ---- Grammar builder (grammar.c) --------------------------------------------------- */

/* A growable run of elements (one alternative under construction). */
struct gseq {
    struct gel *v;
    int n;
    size_t cap;
};

struct gbuild {
    struct gel *elems;
    size_t elems_cap;
    int n_elems;
    /* alternatives, kept per rule while building: (rule, start) pairs */
    int32_t *alt_rule, *alt_pos;
    size_t alt_cap;
    int n_alts;
    int n_rules;
    uint32_t (*classes)[8];
    size_t classes_cap;
    int n_classes;
    int byte_class[256]; /* class of one byte, -1 until made */
    struct gdfa *dfas;
    size_t dfas_cap;
    int n_dfas;
    int total_dfa_states;
    char *err;
    size_t errlen;
};

void gb_init(struct gbuild *b, char *err, size_t errlen);
void gb_free(struct gbuild *b);
/* A new rule without alternatives; returns its id or a negative ERR_*. */
int gb_new_rule(struct gbuild *b);
/* Appends the alternative s (copied, END added) to rule. */
int gb_add_alt(struct gbuild *b, int rule, const struct gseq *s);
/* Class index of a 256-bit set / of one byte, or a negative ERR_*. */
int gb_class(struct gbuild *b, const uint32_t set[8]);
int gb_byte_class(struct gbuild *b, unsigned byte);
/* Takes ownership of d (its arrays) and returns its index, or a negative ERR_*. */
int gb_add_dfa(struct gbuild *b, struct gdfa *d);

int gseq_push(struct gseq *s, uint32_t kind, uint32_t arg);
/* Appends one CLASS element per byte of text[0, len). */
int gseq_lit(struct gbuild *b, struct gseq *s, const char *text, size_t len);
void gseq_free(struct gseq *s);

void gdfa_free(struct gdfa *d);

/* ---- Regex → DFA (regex.c) ---------------------------------------------------------- */

enum { RX_JSON = 1, /* the pattern describes a JSON string's value: literal '"', '\\' and
                       control characters are matched in their escaped JSON form */
       RX_SEARCH = 2 /* JSON Schema "pattern": unanchored unless ^ / $ anchor it */ };

/* Compiles the regular expression re[0, len) into a DFA over the UTF-8 bytes of the text.
 * Errors: ERR_INVALID (malformed; err says where), ERR_UNSUPPORTED (names the feature),
 * ERR_RANGE (too many states), ERR_NOMEM. */
int rx_compile(const char *re, size_t len, unsigned flags, struct gdfa *out, char *err, size_t errlen);

/* Fills d->cls: states equivalent on every text of up to `horizon` bytes share a class
 * (Moore refinement stopped at the horizon). */
int gdfa_classes(struct gdfa *d, int horizon);

/* out = strings that a accepts and b does not (product construction). */
int gdfa_difference(const struct gdfa *a, const struct gdfa *b, struct gdfa *out, char *err, size_t errlen);

/* ---- JSON Schema → rules (schema.c) ------------------------------------------------- */

/* Compiles a JSON Schema document (json_object: any object) and returns the element that
 * matches one value in *out. */
int sc_compile_schema(struct gbuild *b, const char *text, size_t len, struct gel *out);
int sc_compile_any_object(struct gbuild *b, struct gel *out);

/* ---- GBNF → rules (gbnf.c) ---------------------------------------------------------------- */

/* Compiles the GBNF grammar text[0, len) (start rule `root`) into rules of b and returns
 * the element that matches it in *out. Errors (ERR_INVALID, ERR_UNSUPPORTED, ERR_RANGE,
 * ERR_NOMEM) carry "GBNF line L col C: ..." in b->err. */
int gbnf_compile(struct gbuild *b, const char *text, size_t len, struct gel *out);

/* ---- matcher internals for tests and benchmarks (matcher.c) --------------------------- */

/* gm_create with the reason of a failure: ERR_NOMEM, or ERR_RANGE when the start state
 * alone exceeds the matcher's work bound (a grammar too ambiguous to run). */
int gm_start(struct grammar *g, struct grammar_matcher **out);
/* gm_fill_mask without the cache (neither read nor written). */
int gm_fill_mask_uncached(struct grammar_matcher *m, uint32_t *mask);
/* Trie nodes the last uncached mask visited. */
long gm_last_walk_nodes(const struct grammar_matcher *m);

#endif

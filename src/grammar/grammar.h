/* grammar.h — constrained decoding: grammars compiled from a JSON schema, a regular
 * expression, a GBNF grammar, a list of choices or "any JSON object", and the per-sequence matcher that
 * turns a grammar's state into a mask over the vocabulary (which tokens may come next).
 *
 * Three objects, three lifetimes:
 *   struct grammar_vocab    every token's bytes as they appear in text, arranged for the
 *                           mask computation (a trie); built once per model at start-up
 *                           (grammar_vocab_create), immutable, shared by every thread.
 *   struct grammar          one compiled grammar (grammar_compile): immutable and
 *                           refcounted, shared by the choices (n > 1) of one request and
 *                           by the scheduler's sequences; the api layer compiles it on a
 *                           worker thread, never on the scheduler thread.
 *   struct grammar_matcher  one sequence's position in its grammar (gm_create): owned by
 *                           the sequence, created at its first admission, kept through
 *                           preemption (the generated tokens are not recomputed, so the
 *                           state stays valid), freed when it finishes. One thread at a
 *                           time.
 *
 * Matching is over the bytes of the generated text (UTF-8), exactly as the detokenizer
 * produces them (tok_token_bytes with skip_special = false). Special tokens never match
 * grammar text; the end-of-generation tokens (vocab's eog ids) are allowed exactly when
 * the text so far is a complete match (gm_can_end). When the grammar cannot continue
 * (gm_is_done), only the end tokens are allowed.
 *
 * Masks: uint32_t words, bit (id % 32) of word (id / 32) set = token id allowed; a mask
 * has grammar_mask_words(vocab) words. The same layout is copied to the GPU, whose
 * sampling kernel applies it (disallowed → -inf after the logit bias).
 *
 * Errors follow util/err.h: 0 or a negative ERR_* with the reason in err.
 */
#ifndef TESSERA_GRAMMAR_GRAMMAR_H
#define TESSERA_GRAMMAR_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct tokenizer;
struct grammar_vocab;
struct grammar;
struct grammar_matcher;

/* Words in a mask over vocab_size tokens. */
static inline int grammar_mask_words(int vocab_size) { return (vocab_size + 31) / 32; }

/* Builds the vocabulary view of tok: each token's text bytes (special tokens excluded
 * from text matching) and the end-of-generation ids eog[0, n_eog) (copied). Allocates
 * O(vocabulary bytes); call once at start-up. */
int grammar_vocab_create(struct grammar_vocab **out, const struct tokenizer *tok,
                         const int32_t *eog, int n_eog, char *err, size_t errlen);
void grammar_vocab_free(struct grammar_vocab *v);
int grammar_vocab_size(const struct grammar_vocab *v);

enum grammar_kind {
    GRAMMAR_JSON_SCHEMA = 0, /* text: a JSON Schema document (response_format json_schema,
                                guided_json) */
    GRAMMAR_JSON_OBJECT,     /* any JSON object (response_format json_object); text unused */
    GRAMMAR_REGEX,           /* text: a regular expression matched against the whole output
                                (guided_regex) */
    GRAMMAR_CHOICE,          /* exactly one of choices[0, n_choices) (guided_choice) */
    GRAMMAR_GBNF,            /* text: a GBNF grammar (llama.cpp's format; guided_grammar),
                                start rule `root` */
};

/* What to compile. Borrowed for the duration of grammar_compile only.
 *
 * The optional wrapper is for tool calls: the output is then
 *     prefix VALUE suffix ( separator prefix VALUE suffix )*
 * with between min_items and max_items values (max_items <= 0: unbounded), where VALUE is
 * what kind/text describe (e.g. prefix "<tool_call>\n", a schema with anyOf one object per
 * tool, suffix "\n</tool_call>", separator "\n"). Without a wrapper (all NULL, items 0):
 * the output is exactly one VALUE. */
struct grammar_spec {
    enum grammar_kind kind;
    const char *text;        /* [text_len] schema JSON, regex or GBNF; need not be NUL-terminated */
    size_t text_len;
    const char *const *choices; /* GRAMMAR_CHOICE */
    int n_choices;
    const char *prefix, *suffix, *separator; /* wrapper; NULL = none / "" */
    int min_items, max_items;
};

/* Compiles spec against v's vocabulary (borrowed; must outlive the grammar). Errors:
 *   ERR_UNSUPPORTED  a schema keyword or regex feature this compiler does not implement;
 *                    err names it ("unsupported JSON Schema keyword 'patternProperties'")
 *   ERR_INVALID      not valid JSON / not a schema / a malformed regex or GBNF grammar /
 *                    empty choices; err says where
 *   ERR_RANGE        a grammar too large (limits in docs/grammar.md)
 *   ERR_NOMEM
 * Returns the grammar with one reference (grammar_unref). Any thread. */
int grammar_compile(struct grammar **out, const struct grammar_vocab *v,
                    const struct grammar_spec *spec, char *err, size_t errlen);
/* Reference counting (atomic; any thread). grammar_unref frees with the last reference;
 * NULL is a no-op for both. */
struct grammar *grammar_ref(struct grammar *g);
void grammar_unref(struct grammar *g);

/* A matcher at the start of g (takes its own reference to g). NULL on OOM. */
struct grammar_matcher *gm_create(struct grammar *g);
void gm_free(struct grammar_matcher *m);

/* Writes the mask of tokens allowed next into mask[grammar_mask_words(vocab)]. No
 * allocation in the common case (masks of recently seen states are cached inside the
 * grammar). Returns 0, ERR_NOMEM, or ERR_RANGE when the state is too ambiguous to follow
 * (a GBNF grammar built so that its parses multiply: the matcher's work bound). */
int gm_fill_mask(struct grammar_matcher *m, uint32_t *mask);
/* Advances past token (its bytes, or the end of the text for an eog id). Returns 0, or
 * ERR_INVALID (the token is not allowed here: the state is unchanged), ERR_NOMEM or
 * ERR_RANGE (the work bound, as for gm_fill_mask). */
int gm_accept(struct grammar_matcher *m, int32_t token);
/* Puts dst (a matcher of the same grammar) in src's state, for advancing a copy along
 * guessed tokens (speculative decoding) while src stays. Returns 0, ERR_INVALID (another
 * grammar) or ERR_NOMEM (dst unchanged then). Allocates only to grow dst's arrays. */
int gm_copy(struct grammar_matcher *dst, const struct grammar_matcher *src);
/* True when the text so far is a complete match (an end token is allowed). */
bool gm_can_end(const struct grammar_matcher *m);
/* True when nothing but an end token can follow (or an end token was accepted). */
bool gm_is_done(const struct grammar_matcher *m);

#ifdef __cplusplus
}
#endif

#endif

/* gbnf.c — GBNF grammars (llama.cpp's grammar format, which vLLM's XGrammar backend also
 * takes as the EBNF of guided_grammar) to rules. The start rule is `root`.
 *
 * Three passes over one intermediate form (rules, alternatives, elements):
 *   1. Parse. Every rule, named or made by the lowering, gets its builder rule id at once,
 *      so elements are already `struct gel` (REF args are builder ids). Terminals become
 *      builder classes and DFAs while parsing:
 *        "literal"          one CLASS per UTF-8 byte of its code points
 *        [class] / .        one code point: an ASCII-only class that is not negated is one
 *                           CLASS; anything else one DFA (a regex class of \x{H} ranges,
 *                           the same class text sharing one DFA)
 *        ( ... )            a helper rule with the group's alternatives
 *        X* X+ X? X{m,n}    X once per mandatory copy, then right-recursive helpers:
 *                           star ::= X star | ε, or a chain opt_k ::= X opt_{k-1} | ε for
 *                           the optional copies. A reference in tail position pushes no
 *                           matcher frame, so repetition runs in constant stack.
 *                           A class or '.' under * + ? becomes one DFA (faster masks).
 *   2. Check. Undefined rules and a missing root are errors; then the rules that can match
 *      empty text (nullable) are computed, and a cycle among "leftmost" references (the
 *      references reachable before the first element that must consume a byte) is left
 *      recursion, which the matcher's closure cannot run, so it is refused naming the rule.
 *      Along the same acyclic graph we bound how deep the matcher's closure can nest rules
 *      without consuming a byte (it stops at GM_CLOSURE_DEPTH = 512 in matcher.c); deeper
 *      grammars are refused rather than silently cut.
 *   3. Emit. Alternatives that can never finish (they refer to a rule with no finite text,
 *      e.g. `a ::= "x" a`) are dropped, so the model is never led into them; a root with
 *      no finite text is an error. The rest go to the builder unchanged.
 *
 * Errors are ERR_INVALID / ERR_UNSUPPORTED / ERR_RANGE with "GBNF line L col C: ..." in
 * the builder's err buffer. Everything here is owned by one struct gbnf and freed on return.
 */
#include "grammar/grammar_int.h"

#include "util/err.h"
#include "util/grow.h"
#include "util/utf8.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GBNF_MAX_REPEAT 1000   /* m, n of {m,n} */
#define GBNF_MAX_NEST 64       /* parentheses */
#define GBNF_MAX_EMPTY_DEPTH 256 /* rule expansions without a byte; half the matcher's cut */
#define CP_MAX 0x10FFFF

/* A rule: named (name into the text) or a helper made by the lowering. */
struct gbnf_rule {
    const char *name; /* [name_len]; NULL for a helper */
    size_t name_len;
    size_t at;        /* named: its definition (its first reference until defined); helper:
                         the construct that made it */
    char op;          /* helper: '(' group, or the repetition operator '*' '+' '?' '{' */
    bool defined;
    int first_alt, n_alts; /* into alt_of, filled after parsing */
};

struct gbnf_alt {
    int rule;       /* rule index (builder id - base) */
    int first, n;   /* elements el[first, first + n) */
};

/* A string → int map with borrowed keys (open addressing; cap a power of two). */
struct gbnf_map {
    struct gbnf_slot {
        const char *key; /* NULL = empty */
        size_t len;
        int val;
    } *slot;
    size_t cap, used;
};

struct cprange {
    uint32_t lo, hi;
};

struct gbnf {
    struct gbuild *b;
    const char *s; /* [len] the grammar text */
    size_t len, i;
    int base;      /* builder id of rule index 0 */
    struct gbnf_rule *rules;
    int n_rules;
    size_t rules_cap;
    struct gbnf_alt *alts;
    int n_alts;
    size_t alts_cap;
    struct gel *el;
    size_t n_el, el_cap;
    struct gbnf_map names;   /* rule name → rule index */
    struct gbnf_map regexes; /* class regex → DFA id; keys owned by re_keys */
    char **re_keys;
    int n_re_keys;
    size_t re_keys_cap;
    struct cprange *cls;     /* scratch: the code points of the class just parsed */
    int n_cls;
    size_t cls_cap;
    char *lit;               /* scratch: a literal's bytes */
    size_t lit_cap;
    int nest, n_defined;
    /* checks */
    int32_t *alt_of;         /* [n_alts] alternatives grouped by rule (rules[r].first_alt) */
    uint8_t *nullable, *productive; /* [n_rules] */
};

/* ---- errors ------------------------------------------------------------------------------ */

static void where(const struct gbnf *p, size_t at, int *line, int *col)
{
    int l = 1, c = 1;
    for (size_t k = 0; k < at && k < p->len; k++) {
        if (p->s[k] == '\n') {
            l++;
            c = 1;
        } else if (((uint8_t)p->s[k] & 0xC0) != 0x80) {
            c++; /* columns count characters, not bytes */
        }
    }
    *line = l;
    *col = c;
}

__attribute__((format(printf, 4, 5))) static int fail_at(struct gbnf *p, size_t at, int code, const char *fmt, ...)
{
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    where(p, at, &line, &col);
    return err_set(p->b->err, p->b->errlen, code, "GBNF line %d col %d: %s", line, col, msg);
}

/* The character at i for a message. */
static const char *show_char(const struct gbnf *p, size_t i, char buf[16])
{
    if (i >= p->len)
        return "the end of the text";
    uint8_t c = (uint8_t)p->s[i];
    if (c == '\n' || c == '\r')
        return "a line break";
    if (c > 0x20 && c < 0x7f)
        snprintf(buf, 16, "'%c'", c);
    else
        snprintf(buf, 16, "byte 0x%02X", c);
    return buf;
}

/* "rule 'x'" or the construct a helper came from, for messages. */
static const char *rule_desc(const struct gbnf *p, int r, char *buf, size_t n)
{
    const struct gbnf_rule *R = &p->rules[r];
    if (R->name)
        snprintf(buf, n, "rule '%.*s'", (int)(R->name_len > 64 ? 64 : R->name_len), R->name);
    else if (R->op == '(')
        snprintf(buf, n, "the group");
    else if (R->op == '{')
        snprintf(buf, n, "the '{m,n}' repetition");
    else
        snprintf(buf, n, "the '%c' repetition", R->op);
    return buf;
}

/* ---- string map ----------------------------------------------------------------------------- */

static size_t map_hash(const char *k, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)k[i]) * 1099511628211ull;
    return (size_t)h;
}

static struct gbnf_slot *map_find(const struct gbnf_map *m, const char *k, size_t n)
{
    if (!m->cap)
        return NULL;
    for (size_t i = map_hash(k, n) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        struct gbnf_slot *s = &m->slot[i];
        if (!s->key || (s->len == n && !memcmp(s->key, k, n)))
            return s;
    }
}

/* The value of k, or -1. */
static int map_get(const struct gbnf_map *m, const char *k, size_t n)
{
    const struct gbnf_slot *s = map_find(m, k, n);
    return s && s->key ? s->val : -1;
}

/* Adds k (borrowed: it must outlive the map), not yet present. */
static int map_put(struct gbnf_map *m, const char *k, size_t n, int val)
{
    if ((m->used + 1) * 2 > m->cap) {
        struct gbnf_map g = { .cap = m->cap ? m->cap * 2 : 64 };
        if (!(g.slot = calloc(g.cap, sizeof *g.slot)))
            return ERR_NOMEM;
        for (size_t i = 0; i < m->cap; i++)
            if (m->slot[i].key)
                *map_find(&g, m->slot[i].key, m->slot[i].len) = m->slot[i];
        free(m->slot);
        g.used = m->used;
        *m = g;
    }
    *map_find(m, k, n) = (struct gbnf_slot){ k, n, val };
    m->used++;
    return 0;
}

/* ---- the intermediate form -------------------------------------------------------------------- */

/* A new rule (named when name != NULL); returns its index or a negative ERR_*. */
static int new_rule(struct gbnf *p, const char *name, size_t name_len, size_t at, char op)
{
    int id = gb_new_rule(p->b);
    if (id < 0)
        return id;
    if (!grow_array((void **)&p->rules, &p->rules_cap, (size_t)p->n_rules + 1, sizeof *p->rules))
        return ERR_NOMEM;
    if (id != p->base + p->n_rules) /* nothing else makes rules while we parse */
        return err_set(p->b->err, p->b->errlen, ERR_INVALID, "GBNF: internal error: rule ids out of order");
    p->rules[p->n_rules] = (struct gbnf_rule){ .name = name, .name_len = name_len, .at = at, .op = op };
    return p->n_rules++;
}

/* The rule named s[at, at + n), made on first mention. */
static int named_rule(struct gbnf *p, size_t at, size_t n)
{
    int r = map_get(&p->names, p->s + at, n);
    if (r >= 0)
        return r;
    if ((r = new_rule(p, p->s + at, n, at, 0)) < 0)
        return r;
    int rc = map_put(&p->names, p->s + at, n, r);
    return rc ? rc : r;
}

static int add_alt(struct gbnf *p, int rule, const struct gel *v, int n)
{
    if (p->n_el + (size_t)n + (size_t)p->n_alts + 1 > GR_MAX_ELEMS)
        return err_set(p->b->err, p->b->errlen, ERR_RANGE, "GBNF: grammar too large (over %d elements)", GR_MAX_ELEMS);
    if (!grow_array((void **)&p->el, &p->el_cap, p->n_el + (size_t)n + 1, sizeof *p->el) ||
        !grow_array((void **)&p->alts, &p->alts_cap, (size_t)p->n_alts + 1, sizeof *p->alts))
        return ERR_NOMEM;
    if (n)
        memcpy(p->el + p->n_el, v, sizeof *v * (size_t)n);
    p->alts[p->n_alts++] = (struct gbnf_alt){ rule, (int)p->n_el, n };
    p->n_el += (size_t)n;
    return 0;
}

static int ref_of(const struct gbnf *p, struct gel e) { return (int)e.arg - p->base; }

/* ---- characters ------------------------------------------------------------------------------- */

static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static bool is_scalar(uint32_t cp) { return cp <= CP_MAX && (cp < 0xD800 || cp > 0xDFFF); }

/* Reads one character of a literal or class at p->i: an escape or one UTF-8 sequence. */
static int read_char(struct gbnf *p, uint32_t *cp)
{
    size_t at = p->i;
    const uint8_t *s = (const uint8_t *)p->s;
    if (s[at] == '\\') {
        if (at + 1 >= p->len)
            return fail_at(p, at, ERR_INVALID, "unfinished escape at the end of the text");
        char e = (char)s[at + 1];
        int ndig = 0;
        p->i = at + 2;
        switch (e) {
        case 'n': *cp = '\n'; return 0;
        case 'r': *cp = '\r'; return 0;
        case 't': *cp = '\t'; return 0;
        case '\\': case '"': case '\'': case '[': case ']':
            *cp = (uint8_t)e;
            return 0;
        case 'x': ndig = 2; break;
        case 'u': ndig = 4; break;
        case 'U': ndig = 8; break;
        default: {
            char buf[16];
            return fail_at(p, at, ERR_INVALID, "unknown escape '\\' followed by %s", show_char(p, at + 1, buf));
        }
        }
        uint32_t v = 0;
        for (int k = 0; k < ndig; k++, p->i++) {
            if (p->i >= p->len || hexval(p->s[p->i]) < 0)
                return fail_at(p, at, ERR_INVALID, "bad escape: '\\%c' needs %d hex digits", e, ndig);
            v = v * 16 + (uint32_t)hexval(p->s[p->i]);
        }
        if (!is_scalar(v))
            return fail_at(p, at, ERR_INVALID, "escape for U+%X: not a Unicode character (surrogate or above U+10FFFF)", v);
        *cp = v;
        return 0;
    }
    /* UTF-8: the shortest form of a scalar value */
    uint32_t c = s[at], v;
    int n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
    v = n == 0 ? c : n == 1 ? c & 0x1F : n == 2 ? c & 0x0F : c & 0x07;
    bool ok = n >= 0 && at + (size_t)n < p->len;
    for (int k = 1; ok && k <= n; k++) {
        if ((s[at + (size_t)k] & 0xC0) != 0x80)
            ok = false;
        v = (v << 6) | (s[at + (size_t)k] & 0x3F);
    }
    static const uint32_t min_of[4] = { 0, 0x80, 0x800, 0x10000 };
    if (!ok || v < min_of[n] || !is_scalar(v))
        return fail_at(p, at, ERR_INVALID, "invalid UTF-8");
    p->i = at + (size_t)n + 1;
    *cp = v;
    return 0;
}

/* ---- terminals --------------------------------------------------------------------------------- */

static int cls_add(struct gbnf *p, uint32_t lo, uint32_t hi)
{
    if (!grow_array((void **)&p->cls, &p->cls_cap, (size_t)p->n_cls + 1, sizeof *p->cls))
        return ERR_NOMEM;
    p->cls[p->n_cls++] = (struct cprange){ lo, hi };
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    const struct cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Makes p->cls sorted, merged, negated when asked (within Unicode) and clipped to the
 * scalar values (surrogates have no UTF-8 form). */
static int cls_finish(struct gbnf *p, bool negate)
{
    static const struct cprange scalar[2] = { { 0, 0xD7FF }, { 0xE000, CP_MAX } };
    int n = 0, m = 0;
    if (p->n_cls > 1)
        qsort(p->cls, (size_t)p->n_cls, sizeof *p->cls, cmp_range);
    for (int k = 0; k < p->n_cls; k++) {
        if (n && p->cls[k].lo <= p->cls[n - 1].hi + 1) {
            if (p->cls[k].hi > p->cls[n - 1].hi)
                p->cls[n - 1].hi = p->cls[k].hi;
        } else {
            p->cls[n++] = p->cls[k];
        }
    }
    /* the complement of n ranges is at most n + 1 ranges; clipping splits each in two */
    struct cprange *out = malloc(sizeof *out * (2 * (size_t)n + 2));
    if (!out)
        return ERR_NOMEM;
    uint32_t next = 0;
    for (int k = 0; k <= n; k++) {
        uint32_t lo, hi;
        if (negate) {
            if (k < n && p->cls[k].lo == 0) {
                next = p->cls[k].hi + 1;
                continue;
            }
            lo = next;
            hi = k < n ? p->cls[k].lo - 1 : CP_MAX;
            if (k < n)
                next = p->cls[k].hi + 1;
            if (lo > hi || lo > CP_MAX)
                continue;
        } else {
            if (k == n)
                break;
            lo = p->cls[k].lo;
            hi = p->cls[k].hi;
        }
        for (int j = 0; j < 2; j++) {
            uint32_t l = lo > scalar[j].lo ? lo : scalar[j].lo, h = hi < scalar[j].hi ? hi : scalar[j].hi;
            if (l <= h)
                out[m++] = (struct cprange){ l, h };
        }
    }
    free(p->cls);
    p->cls = out;
    p->cls_cap = 2 * (size_t)n + 2;
    p->n_cls = m;
    return 0;
}

/* The DFA of regex re (malloc'd; taken over), shared by equal regexes. */
static int regex_dfa(struct gbnf *p, char *re, int *id)
{
    size_t n = strlen(re);
    int d = map_get(&p->regexes, re, n);
    if (d >= 0) {
        free(re);
        *id = d;
        return 0;
    }
    if (!grow_array((void **)&p->re_keys, &p->re_keys_cap, (size_t)p->n_re_keys + 1, sizeof *p->re_keys)) {
        free(re);
        return ERR_NOMEM;
    }
    p->re_keys[p->n_re_keys++] = re;
    struct gdfa dfa;
    int rc = rx_compile(re, n, 0, &dfa, p->b->err, p->b->errlen);
    if (rc)
        return rc;
    if ((d = gb_add_dfa(p->b, &dfa)) < 0)
        return d;
    if ((rc = map_put(&p->regexes, re, n, d)))
        return rc;
    *id = d;
    return 0;
}

/* p->cls (finished, non-empty) as a regex class followed by op ("", "*", "+", "?"). */
static char *cls_regex(const struct gbnf *p, const char *op)
{
    size_t cap = (size_t)p->n_cls * 24 + 8, n = 0;
    char *re = malloc(cap);
    if (!re)
        return NULL;
    re[n++] = '[';
    for (int k = 0; k < p->n_cls; k++)
        n += (size_t)snprintf(re + n, cap - n, p->cls[k].lo == p->cls[k].hi ? "\\x{%X}" : "\\x{%X}-\\x{%X}",
                              p->cls[k].lo, p->cls[k].hi);
    snprintf(re + n, cap - n, "]%s", op);
    return re;
}

/* The regular-expression text of a part of the grammar being parsed (parse_seq and the
 * parsers below it append to it): literals, classes, groups and repetitions of them are
 * regular; `ok` turns false at the first rule reference. A repeated regular item becomes
 * one DFA (see repeat_as_dfa). Out of memory only turns `ok` off: the rules still work. */
struct rxbuf {
    char *s;
    size_t n, cap;
    bool ok;
};

static void rx_put(struct rxbuf *r, const char *t, size_t n)
{
    if (!r || !r->ok)
        return;
    if (!grow_array((void **)&r->s, &r->cap, r->n + n + 1, 1)) {
        r->ok = false;
        return;
    }
    memcpy(r->s + r->n, t, n);
    r->n += n;
    r->s[r->n] = 0;
}

static void rx_puts(struct rxbuf *r, const char *t) { rx_put(r, t, strlen(t)); }

/* Appends t even while r->ok is off: the last item's own text, which parse_seq keeps for
 * its postfixes when the alternative as a whole is not regular. */
static void rx_item_puts(struct rxbuf *r, const char *t)
{
    bool ok = r->ok;
    r->ok = true;
    rx_puts(r, t);
    r->ok = ok && r->ok;
}

static void rx_cp(struct rxbuf *r, uint32_t cp)
{
    char t[16];
    rx_put(r, t, (size_t)snprintf(t, sizeof t, "\\x{%X}", cp));
}

/* Appends the element for one character of p->cls (finished), and its regex to rx. */
static int emit_class(struct gbnf *p, struct gseq *s, struct rxbuf *rx)
{
    int c;
    if (!p->n_cls) {
        if (rx)
            rx->ok = false; /* matches nothing: left to the rules (its alternative is dropped) */
    } else if (rx && rx->ok) {
        char *re = cls_regex(p, "");
        if (re)
            rx_puts(rx, re);
        else
            rx->ok = false;
        free(re);
    }
    if (p->n_cls == 1 && p->cls[0].lo == p->cls[0].hi && p->cls[0].lo < 0x80) {
        c = gb_byte_class(p->b, p->cls[0].lo);
    } else if (!p->n_cls || p->cls[p->n_cls - 1].hi < 0x80) {
        /* ASCII only (or empty: matches nothing, and its alternative is dropped) */
        uint32_t set[8] = { 0 };
        for (int k = 0; k < p->n_cls; k++)
            for (uint32_t b = p->cls[k].lo; b <= p->cls[k].hi; b++)
                set[b >> 5] |= 1u << (b & 31);
        c = gb_class(p->b, set);
    } else {
        char *re = cls_regex(p, "");
        int id, rc;
        if (!re)
            return ERR_NOMEM;
        if ((rc = regex_dfa(p, re, &id)))
            return rc;
        return gseq_push(s, GEL_DFA, (uint32_t)id);
    }
    return c < 0 ? c : gseq_push(s, GEL_CLASS, (uint32_t)c);
}

static int parse_string(struct gbnf *p, struct gseq *s, struct rxbuf *rx)
{
    size_t at = p->i++, n = 0;
    for (;;) {
        if (p->i >= p->len)
            return fail_at(p, at, ERR_INVALID, "unterminated string literal");
        if (p->s[p->i] == '"') {
            p->i++;
            break;
        }
        uint32_t cp;
        int rc = read_char(p, &cp);
        if (rc)
            return rc;
        if (!grow_array((void **)&p->lit, &p->lit_cap, n + 4, 1))
            return ERR_NOMEM;
        n += (size_t)utf8_encode(cp, p->lit + n);
        rx_cp(rx, cp);
    }
    return gseq_lit(p->b, s, p->lit, n);
}

static int parse_class(struct gbnf *p, struct gseq *s, struct rxbuf *rx)
{
    size_t at = p->i++;
    bool negate = p->i < p->len && p->s[p->i] == '^';
    int rc;
    if (negate)
        p->i++;
    p->n_cls = 0;
    for (;;) {
        if (p->i >= p->len)
            return fail_at(p, at, ERR_INVALID, "unterminated character class");
        if (p->s[p->i] == ']') {
            p->i++;
            break;
        }
        size_t item = p->i;
        uint32_t lo, hi;
        if ((rc = read_char(p, &lo)))
            return rc;
        hi = lo;
        if (p->i + 1 < p->len && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            if ((rc = read_char(p, &hi)))
                return rc;
            if (hi < lo)
                return fail_at(p, item, ERR_INVALID, "reversed range in character class (U+%04X after U+%04X)", hi, lo);
        }
        if ((rc = cls_add(p, lo, hi)))
            return rc;
    }
    if ((rc = cls_finish(p, negate)))
        return rc;
    return emit_class(p, s, rx);
}

/* ---- structure ------------------------------------------------------------------------------------ */

static void skip_space(struct gbnf *p)
{
    while (p->i < p->len) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
            p->i++;
        } else if (c == '#') {
            while (p->i < p->len && p->s[p->i] != '\n')
                p->i++;
        } else {
            break;
        }
    }
}

static size_t name_end(const struct gbnf *p, size_t i)
{
    while (i < p->len && is_name_char(p->s[i]))
        i++;
    return i;
}

/* True when "name ::=" (spaces or tabs before "::=") starts at i: a new rule. */
static bool rule_starts(const struct gbnf *p, size_t i)
{
    size_t e = name_end(p, i);
    if (e == i)
        return false;
    while (e < p->len && (p->s[e] == ' ' || p->s[e] == '\t'))
        e++;
    return p->len - e >= 3 && !memcmp(p->s + e, "::=", 3);
}

static int parse_alts(struct gbnf *p, int rule, struct rxbuf *rx);

/* A count of {m,n} at p->i (after spaces). */
static int parse_count(struct gbnf *p, size_t at, int *out)
{
    if (p->i >= p->len || p->s[p->i] < '0' || p->s[p->i] > '9') {
        char buf[16];
        return fail_at(p, p->i, ERR_INVALID, "expected a number in '{...}', found %s", show_char(p, p->i, buf));
    }
    long v = 0;
    while (p->i < p->len && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        v = v * 10 + (p->s[p->i++] - '0');
        if (v > GBNF_MAX_REPEAT)
            return fail_at(p, at, ERR_RANGE, "repetition count above %d", GBNF_MAX_REPEAT);
    }
    *out = (int)v;
    return 0;
}

/* A postfix operator at p->i: * + ? {m} {m,} {m,n}; max -1 = unbounded. */
static int parse_postfix(struct gbnf *p, int *mn, int *mx)
{
    size_t at = p->i;
    char c = p->s[p->i++];
    int rc;
    if (c != '{') {
        *mn = c == '+';
        *mx = c == '?' ? 1 : -1;
        return 0;
    }
    skip_space(p);
    if ((rc = parse_count(p, at, mn)))
        return rc;
    skip_space(p);
    *mx = *mn;
    if (p->i < p->len && p->s[p->i] == ',') {
        p->i++;
        skip_space(p);
        *mx = -1;
        if (p->i < p->len && p->s[p->i] >= '0' && p->s[p->i] <= '9' && (rc = parse_count(p, at, mx)))
            return rc;
        skip_space(p);
    }
    if (p->i >= p->len || p->s[p->i] != '}') {
        char buf[16];
        return fail_at(p, p->i, ERR_INVALID, "expected '}' to close '{', found %s", show_char(p, p->i, buf));
    }
    p->i++;
    if (*mx >= 0 && *mx < *mn)
        return fail_at(p, at, ERR_INVALID, "repetition {%d,%d}: the maximum is below the minimum", *mn, *mx);
    return 0;
}

/* Replaces the item s[last, n) with its repetition {mn, mx} (mx -1: unbounded). */
static int repeat(struct gbnf *p, struct gseq *s, int last, int mn, int mx, size_t at, char op)
{
    struct gel x;
    int r, rc;
    if (s->n - last == 1) {
        x = s->v[last];
    } else { /* a literal of several bytes (or an empty item): one helper rule */
        if ((r = new_rule(p, NULL, 0, at, op)) < 0)
            return r;
        if ((rc = add_alt(p, r, s->v + last, s->n - last)))
            return rc;
        x = (struct gel){ GEL_REF, (uint32_t)(p->base + r) };
    }
    s->n = last;
    for (int k = 0; k < mn; k++)
        if ((rc = gseq_push(s, x.kind, x.arg)))
            return rc;
    if (mx < 0) { /* star ::= X star | ε */
        if ((r = new_rule(p, NULL, 0, at, op)) < 0)
            return r;
        struct gel loop[2] = { x, { GEL_REF, (uint32_t)(p->base + r) } };
        if ((rc = add_alt(p, r, loop, 2)) || (rc = add_alt(p, r, NULL, 0)))
            return rc;
        return gseq_push(s, GEL_REF, (uint32_t)(p->base + r));
    }
    /* opt_1 ::= X | ε; opt_k ::= X opt_{k-1} | ε */
    int prev = -1;
    for (int k = mn; k < mx; k++) {
        if ((r = new_rule(p, NULL, 0, at, op)) < 0)
            return r;
        struct gel two[2] = { x, { GEL_REF, (uint32_t)(p->base + prev) } };
        if ((rc = add_alt(p, r, two, prev < 0 ? 1 : 2)) || (rc = add_alt(p, r, NULL, 0)))
            return rc;
        prev = r;
    }
    return prev < 0 ? 0 : gseq_push(s, GEL_REF, (uint32_t)(p->base + prev));
}

static int parse_group(struct gbnf *p, struct gseq *s, struct rxbuf *rx)
{
    size_t at = p->i++;
    int r, rc;
    if (++p->nest > GBNF_MAX_NEST)
        return fail_at(p, at, ERR_RANGE, "parentheses nested deeper than %d", GBNF_MAX_NEST);
    if ((r = new_rule(p, NULL, 0, at, '(')) < 0)
        return r;
    struct rxbuf g = { .ok = rx && rx->ok };
    rc = parse_alts(p, r, &g);
    if (!rc && rx && rx->ok) {
        if (g.ok) {
            rx_puts(rx, "(?:");
            rx_put(rx, g.s, g.n);
            rx_puts(rx, ")");
        } else {
            rx->ok = false;
        }
    }
    free(g.s);
    if (rc)
        return rc;
    if (p->i >= p->len || p->s[p->i] != ')')
        return fail_at(p, at, ERR_INVALID, "unclosed '('");
    p->i++;
    p->nest--;
    return gseq_push(s, GEL_REF, (uint32_t)(p->base + r));
}

/* One primary at p->i; *is_class when it was a class or '.' (one element, p->cls). Its
 * regex goes to rx (rx->ok false after a rule reference). */
static int parse_item(struct gbnf *p, struct gseq *s, bool *is_class, struct rxbuf *rx)
{
    char c = p->s[p->i], buf[16];
    *is_class = false;
    if (c == '"')
        return parse_string(p, s, rx);
    if (c == '[') {
        *is_class = true;
        return parse_class(p, s, rx);
    }
    if (c == '.') { /* any character, line breaks included */
        p->i++;
        p->n_cls = 0;
        int rc = cls_add(p, 0, CP_MAX);
        if (!rc)
            rc = cls_finish(p, false);
        *is_class = true;
        return rc ? rc : emit_class(p, s, rx);
    }
    if (c == '(')
        return parse_group(p, s, rx);
    if (is_name_char(c)) {
        rx->ok = false; /* rules are not inlined */
        size_t at = p->i, e = name_end(p, at);
        int r = named_rule(p, at, e - at);
        if (r < 0)
            return r;
        p->i = e;
        return gseq_push(s, GEL_REF, (uint32_t)(p->base + r));
    }
    if (c == '<')
        return fail_at(p, p->i, ERR_UNSUPPORTED, "token references ('<...>') are not supported");
    return fail_at(p, p->i, ERR_INVALID, "unexpected %s", show_char(p, p->i, buf));
}

/* The last item's text rx->s[from, n) becomes its repetition's: (?:X){mn,mx} (mx -1:
 * unbounded). */
static void rx_wrap_item(struct rxbuf *rx, size_t from, int mn, int mx)
{
    char op[32];
    if (mx < 0)
        snprintf(op, sizeof op, mn == 0 ? ")*" : mn == 1 ? ")+" : "){%d,}", mn);
    else if (mn == 0 && mx == 1)
        snprintf(op, sizeof op, ")?");
    else if (mn == mx)
        snprintf(op, sizeof op, "){%d}", mn);
    else
        snprintf(op, sizeof op, "){%d,%d}", mn, mx);
    size_t item = rx->n - from;
    char *x = malloc(item + 1);
    if (!x) {
        rx->ok = false;
        rx->n = from;
        return;
    }
    if (item)
        memcpy(x, rx->s + from, item);
    x[item] = 0;
    rx->n = from;
    rx_item_puts(rx, "(?:");
    rx_item_puts(rx, x);
    rx_item_puts(rx, op);
    free(x);
}

/* The repeated regular item s[last, n), whose regex (repetition included) is
 * rx->s[from, n), as one DFA in its place: the matcher then walks a repeated run (a JSON
 * string's characters, say) as one memoised lexeme instead of a closure per byte. 1 when
 * done; 0 when the regex compiler refuses it (too many states...: the rules do it); or a
 * negative ERR_*. */
static int repeat_as_dfa(struct gbnf *p, struct gseq *s, int last, const struct rxbuf *rx, size_t from)
{
    size_t n = rx->n - from;
    char *re = malloc(n + 1); /* regex_dfa takes it over */
    if (!re)
        return ERR_NOMEM;
    if (n)
        memcpy(re, rx->s + from, n);
    re[n] = 0;
    size_t errlen = p->b->errlen;
    char *keep = p->b->err, scratch[ERR_BUF];
    p->b->err = scratch; /* a refusal here is not the grammar's error */
    p->b->errlen = sizeof scratch;
    int id, rc = regex_dfa(p, re, &id);
    p->b->err = keep;
    p->b->errlen = errlen;
    if (rc == ERR_NOMEM)
        return rc;
    if (rc)
        return 0;
    s->n = last;
    return (rc = gseq_push(s, GEL_DFA, (uint32_t)id)) ? rc : 1;
}

/* One alternative into s: items until '|', ')', the next rule or the end; its regex into
 * rx (NULL: not wanted). */
static int parse_seq(struct gbnf *p, struct gseq *s, struct rxbuf *rx)
{
    int last = -1, rc; /* where the last item starts in s */
    bool last_class = false;
    struct rxbuf none = { .ok = false };
    size_t last_rx = 0;       /* where the last item's regex starts in rx */
    bool last_regular = false; /* ... and whether it has one */
    if (!rx)
        rx = &none;
    for (;;) {
        skip_space(p);
        if (p->i >= p->len)
            return 0;
        char c = p->s[p->i];
        if (c == '|' || c == ')' || (is_name_char(c) && rule_starts(p, p->i)))
            return 0;
        if (c == '*' || c == '+' || c == '?' || c == '{') {
            size_t at = p->i;
            int mn, mx;
            if (last < 0)
                return fail_at(p, at, ERR_INVALID, "'%c' has nothing to repeat", c);
            if ((rc = parse_postfix(p, &mn, &mx)))
                return rc;
            if (last_regular)
                rx_wrap_item(rx, last_rx, mn, mx);
            /* unbounded repetitions of a regular item become one DFA; a bounded one stays a
             * short chain of rules (as a DFA it could end at every byte of a long token,
             * which the mask walk follows once per parse: ambiguous grammars multiply) */
            if (last_regular && mx < 0 && !(last_class && c != '{' && p->n_cls)) {
                if ((rc = repeat_as_dfa(p, s, last, rx, last_rx)) < 0)
                    return rc;
                if (rc == 1) {
                    last_class = false;
                    continue;
                }
            }
            if (last_class && c != '{' && p->n_cls) { /* [class]* and the like: one DFA */
                char op[2] = { c, 0 };
                char *re = cls_regex(p, op);
                int id;
                if (!re)
                    return ERR_NOMEM;
                if ((rc = regex_dfa(p, re, &id)))
                    return rc;
                s->v[last] = (struct gel){ GEL_DFA, (uint32_t)id };
            } else if ((rc = repeat(p, s, last, mn, mx, at, c))) {
                return rc;
            }
            last_class = false;
            continue;
        }
        last = s->n;
        /* an item's regex is wanted while the alternative's is, or for its own repetition */
        bool was_ok = rx->ok;
        if (!was_ok) {
            rx->n = 0;
            rx->ok = true;
        }
        last_rx = rx->n;
        if ((rc = parse_item(p, s, &last_class, rx)))
            return rc;
        last_regular = rx->ok;
        if (!was_ok)
            rx->ok = false;
    }
}

/* The alternatives of rule; their regex "a|b|..." into rx (NULL: not wanted). */
static int parse_alts(struct gbnf *p, int rule, struct rxbuf *rx)
{
    for (bool first = true;; first = false) {
        struct gseq s = { 0 };
        struct rxbuf a = { .ok = rx && rx->ok };
        int rc = parse_seq(p, &s, &a);
        if (rx && rx->ok) {
            if (a.ok) {
                if (!first)
                    rx_puts(rx, "|");
                rx_put(rx, a.s ? a.s : "", a.n);
            } else {
                rx->ok = false;
            }
        }
        free(a.s);
        if (!rc)
            rc = add_alt(p, rule, s.v, s.n);
        gseq_free(&s);
        if (rc)
            return rc;
        if (p->i >= p->len || p->s[p->i] != '|')
            return 0;
        p->i++;
    }
}

static int parse_grammar(struct gbnf *p)
{
    char buf[16];
    skip_space(p);
    while (p->i < p->len) {
        size_t at = p->i, e = name_end(p, at);
        if (e == at)
            return fail_at(p, at, ERR_INVALID, "expected a rule name, found %s", show_char(p, at, buf));
        if (!rule_starts(p, at))
            return fail_at(p, e, ERR_INVALID, "expected '::=' after '%.*s'", (int)(e - at > 64 ? 64 : e - at), p->s + at);
        int r = named_rule(p, at, e - at), rc;
        if (r < 0)
            return r;
        if (p->rules[r].defined) {
            int line, col;
            where(p, p->rules[r].at, &line, &col);
            return fail_at(p, at, ERR_INVALID, "rule '%.*s' is defined twice (first at line %d col %d)",
                           (int)(e - at > 64 ? 64 : e - at), p->s + at, line, col);
        }
        p->rules[r].defined = true;
        p->rules[r].at = at;
        p->n_defined++;
        for (p->i = e; p->s[p->i] != ':'; p->i++) /* spaces or tabs (rule_starts) */
            ;
        p->i += 3;
        if ((rc = parse_alts(p, r, NULL)))
            return rc;
        if (p->i < p->len && p->s[p->i] == ')')
            return fail_at(p, p->i, ERR_INVALID, "unmatched ')'");
    }
    return 0;
}

/* ---- checks ----------------------------------------------------------------------------------------- */

static bool elem_nullable(const struct gbnf *p, struct gel e)
{
    if (e.kind == GEL_REF)
        return p->nullable[ref_of(p, e)];
    if (e.kind == GEL_DFA)
        return p->b->dfas[e.arg].accept[p->b->dfas[e.arg].start];
    return false;
}

/* A terminal in a text of the kind derive() looks for: nullable = empty texts only. */
static bool term_ok(const struct gbnf *p, struct gel e, bool nullable)
{
    if (nullable)
        return elem_nullable(p, e);
    if (e.kind == GEL_DFA)
        return true; /* regex DFAs are pruned: they match some text */
    for (int k = 0; k < 8; k++) /* a class with no byte matches nothing */
        if (p->b->classes[e.arg][k])
            return true;
    return false;
}

/* Marks in out[] the rules that derive an empty text (nullable) or any finite text (not
 * nullable: "productive"). Worklist: an alternative is satisfied when its terminals are
 * and all the rules it refers to are marked; each reference is counted down once. */
static int derive(struct gbnf *p, bool nullable, uint8_t *out)
{
    int rc = 0, n_refs = 0, head = 0, tail = 0;
    int *need = calloc((size_t)p->n_alts + 1, sizeof *need);
    int *occ_first = calloc((size_t)p->n_rules + 1, sizeof *occ_first);
    int *queue = malloc(sizeof *queue * ((size_t)p->n_rules + 1));
    int *occ = NULL, *fill = NULL;
    if (!need || !occ_first || !queue) {
        rc = ERR_NOMEM;
        goto out;
    }
    memset(out, 0, (size_t)p->n_rules);
    for (int a = 0; a < p->n_alts; a++) {
        const struct gel *e = p->el + p->alts[a].first;
        for (int k = 0; k < p->alts[a].n; k++) {
            if (e[k].kind == GEL_REF) {
                need[a]++;
                occ_first[ref_of(p, e[k]) + 1]++;
                n_refs++;
            } else if (!term_ok(p, e[k], nullable)) {
                need[a] = -1; /* never satisfied */
                break;
            }
        }
    }
    for (int r = 0; r < p->n_rules; r++)
        occ_first[r + 1] += occ_first[r];
    occ = malloc(sizeof *occ * ((size_t)n_refs + 1));
    fill = calloc((size_t)p->n_rules + 1, sizeof *fill);
    if (!occ || !fill) {
        rc = ERR_NOMEM;
        goto out;
    }
    for (int a = 0; a < p->n_alts; a++) {
        if (need[a] < 0)
            continue;
        const struct gel *e = p->el + p->alts[a].first;
        for (int k = 0; k < p->alts[a].n; k++)
            if (e[k].kind == GEL_REF) {
                int t = ref_of(p, e[k]);
                occ[occ_first[t] + fill[t]++] = a;
            }
    }
    for (int a = 0; a < p->n_alts; a++)
        if (need[a] == 0 && !out[p->alts[a].rule]) {
            out[p->alts[a].rule] = 1;
            queue[tail++] = p->alts[a].rule;
        }
    while (head < tail) {
        int t = queue[head++];
        for (int k = occ_first[t]; k < occ_first[t] + fill[t]; k++) {
            int a = occ[k];
            if (--need[a] == 0 && !out[p->alts[a].rule]) {
                out[p->alts[a].rule] = 1;
                queue[tail++] = p->alts[a].rule;
            }
        }
    }
out:
    free(need);
    free(occ_first);
    free(queue);
    free(occ);
    free(fill);
    return rc;
}

/* Groups the alternatives by rule (alt_of, rules[].first_alt / n_alts). */
static int index_alts(struct gbnf *p)
{
    if (!(p->alt_of = malloc(sizeof *p->alt_of * ((size_t)p->n_alts + 1))))
        return ERR_NOMEM;
    for (int a = 0; a < p->n_alts; a++)
        p->rules[p->alts[a].rule].n_alts++;
    int at = 0;
    for (int r = 0; r < p->n_rules; r++) {
        p->rules[r].first_alt = at;
        at += p->rules[r].n_alts;
        p->rules[r].n_alts = 0;
    }
    for (int a = 0; a < p->n_alts; a++) {
        struct gbnf_rule *R = &p->rules[p->alts[a].rule];
        p->alt_of[R->first_alt + R->n_alts++] = a;
    }
    return 0;
}

/* The leftmost references of rule r: those reachable before an element that must
 * consume a byte. Writes them to out (when not NULL); returns their count. */
static int leftmost_refs(const struct gbnf *p, int r, int *out)
{
    int n = 0;
    for (int j = 0; j < p->rules[r].n_alts; j++) {
        const struct gbnf_alt *A = &p->alts[p->alt_of[p->rules[r].first_alt + j]];
        for (int k = 0; k < A->n; k++) {
            struct gel e = p->el[A->first + k];
            if (e.kind == GEL_REF) {
                if (out)
                    out[n] = ref_of(p, e);
                n++;
            }
            if (!elem_nullable(p, e))
                break;
        }
    }
    return n;
}

/* Reports the cycle stack[from, top) of leftmost references (left recursion). */
static int report_cycle(struct gbnf *p, const int *stack, int from, int top)
{
    int start = -1;
    for (int k = from; k < top && start < 0; k++)
        if (p->rules[stack[k]].name)
            start = k;
    if (start < 0) { /* helpers only: a repetition of something that can be empty */
        int r = stack[from];
        for (int k = from; k < top; k++)
            if (p->rules[stack[k]].op != '(')
                r = stack[k];
        char what[64];
        return fail_at(p, p->rules[r].at, ERR_INVALID, "%s repeats something that can match empty text (left recursion)",
                       rule_desc(p, r, what, sizeof what));
    }
    /* the named rules around the cycle: a -> b -> a */
    char path[200];
    size_t n = 0;
    for (int k = 0; k <= top - from; k++) {
        const struct gbnf_rule *R = &p->rules[stack[from + (start - from + k) % (top - from)]];
        if (!R->name || n >= sizeof path)
            continue;
        n += (size_t)snprintf(path + n, sizeof path - n, "%s%.*s", n ? " -> " : "", (int)(R->name_len > 48 ? 48 : R->name_len), R->name);
    }
    const struct gbnf_rule *R = &p->rules[stack[start]];
    return fail_at(p, R->at, ERR_INVALID, "rule '%.*s' is left-recursive: it reaches itself without consuming text (%s)",
                   (int)(R->name_len > 64 ? 64 : R->name_len), R->name, path);
}

/* Walks alternative a backwards: r(k) = the deepest rule nesting the matcher's closure
 * reaches from element k without consuming a byte (entering a rule: +1; passing a
 * nullable rule: +1, its own passage, +1 for the return). Returns r(0), *all = max r(k). */
static int alt_depth(const struct gbnf *p, int a, const int *dn, const int *pass, int *all)
{
    const struct gbnf_alt *A = &p->alts[a];
    int r = 0, mx = 0;
    for (int k = A->n - 1; k >= 0; k--) {
        struct gel e = p->el[A->first + k];
        if (e.kind == GEL_CLASS) {
            r = 0;
        } else if (e.kind == GEL_DFA) {
            r = elem_nullable(p, e) ? r : 0;
        } else {
            int t = ref_of(p, e), through = p->nullable[t] ? pass[t] + 1 + r : 0;
            r = 1 + (dn[t] > through ? dn[t] : through);
        }
        if (r > GBNF_MAX_EMPTY_DEPTH + 1)
            r = GBNF_MAX_EMPTY_DEPTH + 1;
        if (r > mx)
            mx = r;
    }
    *all = mx;
    return r;
}

/* Refuses left recursion (a cycle among leftmost references, found by an iterative
 * depth-first search) and closure nesting deeper than GBNF_MAX_EMPTY_DEPTH (computed in
 * the search's post-order: a rule after everything it reaches leftmost). */
static int check_recursion(struct gbnf *p)
{
    int n = p->n_rules, rc = 0, n_edges = 0;
    int *edge_first = calloc((size_t)n + 1, sizeof *edge_first), *edges = NULL;
    int *stack = malloc(sizeof *stack * ((size_t)n + 1)), *next = malloc(sizeof *next * ((size_t)n + 1));
    int *pos = malloc(sizeof *pos * ((size_t)n + 1)), *order = malloc(sizeof *order * ((size_t)n + 1));
    int *dn = calloc((size_t)n + 1, sizeof *dn), *pass = calloc((size_t)n + 1, sizeof *pass);
    uint8_t *color = calloc((size_t)n + 1, 1); /* 0 unseen, 1 on the stack, 2 done */
    if (!edge_first || !stack || !next || !pos || !order || !dn || !pass || !color) {
        rc = ERR_NOMEM;
        goto out;
    }
    for (int r = 0; r < n; r++)
        edge_first[r + 1] = edge_first[r] + leftmost_refs(p, r, NULL);
    n_edges = edge_first[n];
    if (!(edges = malloc(sizeof *edges * ((size_t)n_edges + 1)))) {
        rc = ERR_NOMEM;
        goto out;
    }
    for (int r = 0; r < n; r++)
        leftmost_refs(p, r, edges + edge_first[r]);
    int n_order = 0;
    for (int r0 = 0; r0 < n; r0++) {
        if (color[r0])
            continue;
        int top = 0;
        stack[top] = r0;
        next[top] = edge_first[r0];
        pos[r0] = top++;
        color[r0] = 1;
        while (top) {
            int r = stack[top - 1];
            if (next[top - 1] < edge_first[r + 1]) {
                int t = edges[next[top - 1]++];
                if (color[t] == 1) {
                    rc = report_cycle(p, stack, pos[t], top);
                    goto out;
                }
                if (!color[t]) {
                    color[t] = 1;
                    stack[top] = t;
                    next[top] = edge_first[t];
                    pos[t] = top++;
                }
                continue;
            }
            color[r] = 2;
            order[n_order++] = r;
            top--;
        }
    }
    /* depths, everything a rule reaches leftmost first */
    for (int k = 0; k < n_order; k++) {
        int r = order[k], all;
        for (int j = 0; j < p->rules[r].n_alts; j++) {
            int a = p->alt_of[p->rules[r].first_alt + j];
            int d = alt_depth(p, a, dn, pass, &all);
            if (d > dn[r])
                dn[r] = d;
            const struct gbnf_alt *A = &p->alts[a];
            int through = 0;
            bool empty = true;
            for (int i = 0; i < A->n && empty; i++) {
                struct gel e = p->el[A->first + i];
                empty = elem_nullable(p, e);
                if (e.kind == GEL_REF)
                    through += 2 + pass[ref_of(p, e)];
            }
            if (empty && through > pass[r])
                pass[r] = through > GBNF_MAX_EMPTY_DEPTH + 1 ? GBNF_MAX_EMPTY_DEPTH + 1 : through;
        }
        if (dn[r] > GBNF_MAX_EMPTY_DEPTH || pass[r] > GBNF_MAX_EMPTY_DEPTH) {
            char what[64];
            rc = fail_at(p, p->rules[r].at, ERR_RANGE, "%s nests rules more than %d deep without consuming text",
                         rule_desc(p, r, what, sizeof what), GBNF_MAX_EMPTY_DEPTH);
            goto out;
        }
    }
    /* every starting point inside an alternative (the closure after a byte) */
    for (int a = 0; a < p->n_alts; a++) {
        int all;
        alt_depth(p, a, dn, pass, &all);
        if (all > GBNF_MAX_EMPTY_DEPTH) {
            char what[64];
            int r = p->alts[a].rule;
            rc = fail_at(p, p->rules[r].at, ERR_RANGE, "%s nests rules more than %d deep without consuming text",
                         rule_desc(p, r, what, sizeof what), GBNF_MAX_EMPTY_DEPTH);
            goto out;
        }
    }
out:
    free(edge_first);
    free(edges);
    free(stack);
    free(next);
    free(pos);
    free(order);
    free(dn);
    free(pass);
    free(color);
    return rc;
}

/* ---- entry -------------------------------------------------------------------------------------------- */

static int gbnf_run(struct gbnf *p, struct gel *out)
{
    int rc;
    if ((rc = parse_grammar(p)))
        return rc;
    if (!p->n_defined)
        return err_set(p->b->err, p->b->errlen, ERR_INVALID, "GBNF: empty grammar (no rules)");
    int root = map_get(&p->names, "root", 4);
    if (root < 0 || !p->rules[root].defined)
        return err_set(p->b->err, p->b->errlen, ERR_INVALID, "GBNF: no rule named 'root' (the start rule)");
    for (int r = 0; r < p->n_rules; r++)
        if (p->rules[r].name && !p->rules[r].defined)
            return fail_at(p, p->rules[r].at, ERR_INVALID, "undefined rule '%.*s'",
                           (int)(p->rules[r].name_len > 64 ? 64 : p->rules[r].name_len), p->rules[r].name);
    p->nullable = malloc((size_t)p->n_rules + 1);
    p->productive = malloc((size_t)p->n_rules + 1);
    if (!p->nullable || !p->productive)
        return ERR_NOMEM;
    if ((rc = index_alts(p)) || (rc = derive(p, true, p->nullable)) || (rc = check_recursion(p)) ||
        (rc = derive(p, false, p->productive)))
        return rc;
    if (!p->productive[root])
        return fail_at(p, p->rules[root].at, ERR_INVALID, "rule 'root' matches no finite text (every alternative refers back to a rule that never finishes)");
    /* emit the alternatives that can finish */
    for (int a = 0; a < p->n_alts; a++) {
        const struct gbnf_alt *A = &p->alts[a];
        bool ok = true;
        for (int k = 0; k < A->n && ok; k++) {
            struct gel e = p->el[A->first + k];
            ok = e.kind == GEL_REF ? p->productive[ref_of(p, e)] : term_ok(p, e, false);
        }
        if (!ok)
            continue;
        struct gseq s = { .v = A->n ? p->el + A->first : NULL, .n = A->n };
        if ((rc = gb_add_alt(p->b, p->base + A->rule, &s)))
            return rc;
    }
    *out = (struct gel){ GEL_REF, (uint32_t)(p->base + root) };
    return 0;
}

int gbnf_compile(struct gbuild *b, const char *text, size_t len, struct gel *out)
{
    struct gbnf p = { .b = b, .s = text, .len = len, .base = b->n_rules };
    int rc = gbnf_run(&p, out);
    free(p.rules);
    free(p.alts);
    free(p.el);
    free(p.names.slot);
    free(p.regexes.slot);
    for (int k = 0; k < p.n_re_keys; k++)
        free(p.re_keys[k]);
    free(p.re_keys);
    free(p.cls);
    free(p.lit);
    free(p.alt_of);
    free(p.nullable);
    free(p.productive);
    return rc;
}

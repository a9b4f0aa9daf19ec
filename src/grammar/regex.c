/* regex.c — regular expressions to byte DFAs: the lexemes of every grammar (guided_regex,
 * JSON Schema "pattern" and formats, and the JSON strings, numbers and whitespace the
 * schema compiler writes as regexes).
 *
 * Pipeline: parse into a small AST over Unicode code point sets → Thompson NFA over bytes
 * (each code point range split into UTF-8 byte-range sequences) → subset construction →
 * pruning of states that cannot reach an accepting state (so a grammar never lets the
 * model write a prefix it cannot finish).
 *
 * Supported syntax: literals, escapes (\n \r \t \f \v \0 \xHH \x{H..} \uHHHH \u{H..} and escaped
 * punctuation), '.', classes [...] with ranges, negation and \d \w \s \D \W \S inside,
 * groups (...), (?:...), (?<name>...), (?P<name>...), '|', '?', '*', '+', {m}, {m,},
 * {m,n} (lazy '?' suffixes accepted: same language), '^' as the first and '$' as the last
 * character. Backreferences, lookaround, word boundaries, inline flags, possessive
 * quantifiers, Unicode properties and POSIX classes are refused (ERR_UNSUPPORTED).
 */
#include "grammar/grammar_int.h"

#include "util/err.h"
#include "util/grow.h"
#include "util/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CP_MAX 0x10FFFF
#define RX_MAX_REPEAT 1000

/* ---- code point sets: sorted, disjoint, non-adjacent ranges ------------------------- */

struct cpset {
    uint32_t (*r)[2];
    int n;
    size_t cap;
};

static int cps_add(struct cpset *s, uint32_t lo, uint32_t hi)
{
    if (!grow_array((void **)&s->r, &s->cap, (size_t)s->n + 1, sizeof s->r[0]))
        return ERR_NOMEM;
    s->r[s->n][0] = lo;
    s->r[s->n][1] = hi;
    s->n++;
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Sorts and merges the ranges. */
static void cps_norm(struct cpset *s)
{
    if (s->n < 2)
        return;
    qsort(s->r, (size_t)s->n, sizeof s->r[0], cmp_range);
    int w = 0;
    for (int i = 1; i < s->n; i++) {
        if (s->r[i][0] <= s->r[w][1] + 1) {
            if (s->r[i][1] > s->r[w][1])
                s->r[w][1] = s->r[i][1];
        } else {
            w++;
            s->r[w][0] = s->r[i][0];
            s->r[w][1] = s->r[i][1];
        }
    }
    s->n = w + 1;
}

/* Complement within the Unicode scalar values (surrogates excluded). */
static int cps_negate(struct cpset *s)
{
    cps_norm(s);
    struct cpset out = { 0 };
    uint32_t next = 0;
    int rc = 0;
    for (int i = 0; i < s->n && !rc; i++) {
        if (s->r[i][0] > next)
            rc = cps_add(&out, next, s->r[i][0] - 1);
        next = s->r[i][1] + 1;
    }
    if (!rc && next <= CP_MAX)
        rc = cps_add(&out, next, CP_MAX);
    free(s->r);
    *s = out;
    return rc;
}

/* Removes the surrogate range (not encodable in UTF-8). */
static int cps_drop_surrogates(struct cpset *s)
{
    struct cpset out = { 0 };
    int rc = 0;
    for (int i = 0; i < s->n && !rc; i++) {
        uint32_t lo = s->r[i][0], hi = s->r[i][1];
        if (hi < 0xD800 || lo > 0xDFFF) {
            rc = cps_add(&out, lo, hi);
            continue;
        }
        if (lo < 0xD800)
            rc = cps_add(&out, lo, 0xD7FF);
        if (!rc && hi > 0xDFFF)
            rc = cps_add(&out, 0xE000, hi);
    }
    free(s->r);
    *s = out;
    return rc;
}

static int cps_add_shorthand(struct cpset *s, char c)
{
    struct cpset t = { 0 };
    int rc = 0;
    char lc = (char)(c | 0x20);
    if (lc == 'd') {
        rc = cps_add(&t, '0', '9');
    } else if (lc == 'w') {
        rc = cps_add(&t, '0', '9');
        rc = rc ? rc : cps_add(&t, 'A', 'Z');
        rc = rc ? rc : cps_add(&t, 'a', 'z');
        rc = rc ? rc : cps_add(&t, '_', '_');
    } else { /* s: ASCII whitespace */
        rc = cps_add(&t, '\t', '\r');
        rc = rc ? rc : cps_add(&t, ' ', ' ');
    }
    if (!rc && c != lc)
        rc = cps_negate(&t);
    for (int i = 0; i < t.n && !rc; i++)
        rc = cps_add(s, t.r[i][0], t.r[i][1]);
    free(t.r);
    return rc;
}

/* ---- AST ------------------------------------------------------------------------------ */

enum rx_kind { RXN_SET, RXN_CAT, RXN_ALT, RXN_REP };

struct rxnode {
    int kind;
    int first, next; /* children list (CAT/ALT/REP) and sibling link */
    int min, max;    /* REP; max -1 = unbounded */
    struct cpset set;
};

struct rxparse {
    const char *s;
    size_t len, i;
    struct rxnode *nodes;
    int n;
    size_t cap;
    int depth;
    char *err;
    size_t errlen;
};

static int rx_new(struct rxparse *p, int kind)
{
    if (!grow_array((void **)&p->nodes, &p->cap, (size_t)p->n + 1, sizeof p->nodes[0]))
        return ERR_NOMEM;
    memset(&p->nodes[p->n], 0, sizeof p->nodes[0]);
    p->nodes[p->n].kind = kind;
    p->nodes[p->n].first = p->nodes[p->n].next = -1;
    return p->n++;
}

static void rx_append(struct rxparse *p, int parent, int child)
{
    int *link = &p->nodes[parent].first;
    while (*link >= 0)
        link = &p->nodes[*link].next;
    *link = child;
}

/* Decodes one UTF-8 character at p->i (invalid bytes stand for themselves as Latin-1). */
static uint32_t rx_getc(struct rxparse *p)
{
    const unsigned char *u = (const unsigned char *)p->s + p->i;
    size_t left = p->len - p->i;
    uint32_t c = u[0];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if ((size_t)n > left)
        n = 1;
    if (n > 1) {
        c &= 0x3Fu >> (n - 1);
        for (int k = 1; k < n; k++) {
            if ((u[k] & 0xC0) != 0x80) {
                n = 1;
                c = u[0];
                break;
            }
            c = (c << 6) | (u[k] & 0x3F);
        }
    }
    p->i += (size_t)n;
    return c;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)(c | 0x20);
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

static int rx_hex(struct rxparse *p, int ndig, uint32_t *out)
{
    uint32_t v = 0;
    for (int k = 0; k < ndig; k++) {
        if (p->i >= p->len || hexval(p->s[p->i]) < 0)
            return err_set(p->err, p->errlen, ERR_INVALID, "regex: bad hex escape at offset %zu", p->i);
        v = v * 16 + (uint32_t)hexval(p->s[p->i++]);
    }
    *out = v;
    return 0;
}

/* Parses an escape after '\' into a single code point (*cp) or, for \d \w \s and their
 * negations, adds to set and sets *cp = UINT32_MAX. */
static int rx_escape(struct rxparse *p, struct cpset *set, uint32_t *cp)
{
    if (p->i >= p->len)
        return err_set(p->err, p->errlen, ERR_INVALID, "regex: trailing backslash");
    char c = p->s[p->i++];
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        *cp = UINT32_MAX;
        return cps_add_shorthand(set, c);
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0': *cp = 0; return 0;
    case 'x':
    case 'u':
        if (c == 'x' && !(p->i < p->len && p->s[p->i] == '{'))
            return rx_hex(p, 2, cp);
        if (p->i < p->len && p->s[p->i] == '{') {
            p->i++;
            uint32_t v = 0;
            int nd = 0;
            while (p->i < p->len && hexval(p->s[p->i]) >= 0 && nd < 6) {
                v = v * 16 + (uint32_t)hexval(p->s[p->i++]);
                nd++;
            }
            if (!nd || p->i >= p->len || p->s[p->i] != '}' || v > CP_MAX)
                return err_set(p->err, p->errlen, ERR_INVALID, "regex: bad \\%c{...} escape at offset %zu", c, p->i);
            p->i++;
            *cp = v;
            return 0;
        }
        return rx_hex(p, 4, cp);
    case 'b': case 'B': case 'A': case 'z': case 'Z': case 'G':
        return err_set(p->err, p->errlen, ERR_UNSUPPORTED, "unsupported regex feature: anchor \\%c", c);
    case 'p': case 'P':
        return err_set(p->err, p->errlen, ERR_UNSUPPORTED, "unsupported regex feature: Unicode property \\%c", c);
    case 'k':
        return err_set(p->err, p->errlen, ERR_UNSUPPORTED, "unsupported regex feature: backreference \\k");
    default:
        if (c >= '1' && c <= '9')
            return err_set(p->err, p->errlen, ERR_UNSUPPORTED, "unsupported regex feature: backreference \\%c", c);
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return err_set(p->err, p->errlen, ERR_INVALID, "regex: unknown escape \\%c", c);
        p->i--;
        *cp = rx_getc(p);
        return 0;
    }
}

static int rx_class(struct rxparse *p, int node)
{
    struct cpset *set = &p->nodes[node].set;
    bool neg = false;
    if (p->i < p->len && p->s[p->i] == '^') {
        neg = true;
        p->i++;
    }
    bool first = true;
    for (;;) {
        if (p->i >= p->len)
            return err_set(p->err, p->errlen, ERR_INVALID, "regex: unterminated character class");
        char c = p->s[p->i];
        if (c == ']' && !first) {
            p->i++;
            break;
        }
        first = false;
        if (c == '[' && p->i + 1 < p->len && p->s[p->i + 1] == ':')
            return err_set(p->err, p->errlen, ERR_UNSUPPORTED, "unsupported regex feature: POSIX class");
        uint32_t lo;
        int rc;
        set = &p->nodes[node].set;
        if (c == '\\') {
            p->i++;
            if ((rc = rx_escape(p, set, &lo)))
                return rc;
            if (lo == UINT32_MAX)
                continue;
        } else {
            lo = rx_getc(p);
        }
        uint32_t hi = lo;
        if (p->i + 1 < p->len && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            if (p->s[p->i] == '\\') {
                p->i++;
                struct cpset dummy = { 0 };
                rc = rx_escape(p, &dummy, &hi);
                free(dummy.r);
                if (rc)
                    return rc;
                if (hi == UINT32_MAX)
                    return err_set(p->err, p->errlen, ERR_INVALID, "regex: class shorthand as a range end");
            } else {
                hi = rx_getc(p);
            }
            if (hi < lo)
                return err_set(p->err, p->errlen, ERR_INVALID, "regex: reversed range in class at offset %zu", p->i);
        }
        if ((rc = cps_add(set, lo, hi)))
            return rc;
    }
    set = &p->nodes[node].set;
    if (neg)
        return cps_negate(set);
    cps_norm(set);
    return 0;
}

static int rx_alt(struct rxparse *p, int *out);

static int rx_atom(struct rxparse *p, int *out)
{
    char c = p->s[p->i];
    int n, rc;
    if (c == '(') {
        p->i++;
        if (p->i < p->len && p->s[p->i] == '?') {
            const char *r = p->s + p->i + 1;
            size_t left = p->len - p->i - 1;
            if (left >= 1 && r[0] == ':') {
                p->i += 2;
            } else if (left >= 2 && (r[0] == '<' || (r[0] == 'P' && r[1] == '<')) && r[1] != '=' && r[1] != '!') {
                const char *close = memchr(r, '>', left);
                if (!close)
                    return err_set(p->err, p->errlen, ERR_INVALID, "regex: unterminated group name");
                p->i = (size_t)(close - p->s) + 1;
            } else if (left >= 1 && (r[0] == '=' || r[0] == '!' || r[0] == '<')) {
                return err_set(p->err, p->errlen, ERR_UNSUPPORTED, "unsupported regex feature: lookaround");
            } else {
                return err_set(p->err, p->errlen, ERR_UNSUPPORTED, "unsupported regex feature: group flags (?%c", left ? r[0] : ' ');
            }
        }
        if (++p->depth > 200)
            return err_set(p->err, p->errlen, ERR_RANGE, "regex: groups nested too deeply");
        if ((rc = rx_alt(p, out)))
            return rc;
        p->depth--;
        if (p->i >= p->len || p->s[p->i] != ')')
            return err_set(p->err, p->errlen, ERR_INVALID, "regex: missing ')'");
        p->i++;
        return 0;
    }
    if ((n = rx_new(p, RXN_SET)) < 0)
        return n;
    *out = n;
    if (c == '[') {
        p->i++;
        return rx_class(p, n);
    }
    if (c == '.') {
        p->i++;
        rc = cps_add(&p->nodes[n].set, '\n', '\n');
        return rc ? rc : cps_negate(&p->nodes[n].set);
    }
    if (c == '\\') {
        p->i++;
        uint32_t cp;
        if ((rc = rx_escape(p, &p->nodes[n].set, &cp)))
            return rc;
        return cp == UINT32_MAX ? 0 : cps_add(&p->nodes[n].set, cp, cp);
    }
    if (c == '^' || c == '$')
        return err_set(p->err, p->errlen, ERR_UNSUPPORTED, "unsupported regex feature: anchor '%c' inside the pattern", c);
    if (c == '*' || c == '+' || c == '?' || c == '{')
        return err_set(p->err, p->errlen, ERR_INVALID, "regex: nothing to repeat at offset %zu", p->i);
    uint32_t cp = rx_getc(p);
    return cps_add(&p->nodes[n].set, cp, cp);
}

static bool rx_number(struct rxparse *p, int *v)
{
    size_t st = p->i;
    long x = 0;
    while (p->i < p->len && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        x = x * 10 + (p->s[p->i++] - '0');
        if (x > 100000)
            x = 100000;
    }
    *v = (int)x;
    return p->i > st;
}

static int rx_repeat(struct rxparse *p, int *out)
{
    int atom, rc;
    if ((rc = rx_atom(p, &atom)))
        return rc;
    while (p->i < p->len) {
        char c = p->s[p->i];
        int mn, mx;
        if (c == '*') {
            mn = 0, mx = -1;
            p->i++;
        } else if (c == '+') {
            mn = 1, mx = -1;
            p->i++;
        } else if (c == '?') {
            mn = 0, mx = 1;
            p->i++;
        } else if (c == '{') {
            size_t save = p->i++;
            if (!rx_number(p, &mn)) {
                p->i = save; /* a literal '{' */
                break;
            }
            mx = mn;
            if (p->i < p->len && p->s[p->i] == ',') {
                p->i++;
                if (!rx_number(p, &mx))
                    mx = -1;
            }
            if (p->i >= p->len || p->s[p->i] != '}')
                return err_set(p->err, p->errlen, ERR_INVALID, "regex: bad {m,n} at offset %zu", save);
            p->i++;
            if (mx >= 0 && mx < mn)
                return err_set(p->err, p->errlen, ERR_INVALID, "regex: {%d,%d} has max < min", mn, mx);
            if (mn > RX_MAX_REPEAT || mx > RX_MAX_REPEAT)
                return err_set(p->err, p->errlen, ERR_RANGE, "regex: repetition count above %d", RX_MAX_REPEAT);
        } else {
            break;
        }
        if (p->i < p->len && p->s[p->i] == '?')
            p->i++; /* lazy: same language */
        else if (p->i < p->len && p->s[p->i] == '+')
            return err_set(p->err, p->errlen, ERR_UNSUPPORTED, "unsupported regex feature: possessive quantifier");
        int r = rx_new(p, RXN_REP);
        if (r < 0)
            return r;
        p->nodes[r].min = mn;
        p->nodes[r].max = mx;
        p->nodes[r].first = atom;
        atom = r;
    }
    *out = atom;
    return 0;
}

static int rx_alt(struct rxparse *p, int *out)
{
    int alt = rx_new(p, RXN_ALT);
    if (alt < 0)
        return alt;
    for (;;) {
        int cat = rx_new(p, RXN_CAT), rc;
        if (cat < 0)
            return cat;
        rx_append(p, alt, cat);
        while (p->i < p->len && p->s[p->i] != '|' && p->s[p->i] != ')') {
            int item = -1;
            if ((rc = rx_repeat(p, &item)))
                return rc;
            rx_append(p, cat, item);
        }
        if (p->i < p->len && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        break;
    }
    *out = alt;
    return 0;
}

/* ---- NFA -------------------------------------------------------------------------------- */

struct nedge {
    int from, to;
    int lo, hi; /* byte range; lo < 0: epsilon */
};

struct nfa {
    struct nedge *e;
    int n_edges;
    size_t cap;
    int n_states;
    unsigned flags;
    char *err;
    size_t errlen;
};

static int nfa_state(struct nfa *a)
{
    if (a->n_states >= GR_MAX_NFA_STATES)
        return err_set(a->err, a->errlen, ERR_RANGE, "regex too large (over %d automaton states)", GR_MAX_NFA_STATES);
    return a->n_states++;
}

static int nfa_edge(struct nfa *a, int from, int to, int lo, int hi)
{
    if (!grow_array((void **)&a->e, &a->cap, (size_t)a->n_edges + 1, sizeof a->e[0]))
        return ERR_NOMEM;
    a->e[a->n_edges++] = (struct nedge){ from, to, lo, hi };
    return 0;
}

/* Adds paths s → e for the code points [lo, hi] (same or different UTF-8 lengths). */
static int nfa_utf8_range(struct nfa *a, int s, int e, uint32_t lo, uint32_t hi)
{
    static const uint32_t bounds[] = { 0x7F, 0x7FF, 0xFFFF };
    for (int k = 0; k < 3; k++)
        if (lo <= bounds[k] && hi > bounds[k]) {
            int rc = nfa_utf8_range(a, s, e, lo, bounds[k]);
            return rc ? rc : nfa_utf8_range(a, s, e, bounds[k] + 1, hi);
        }
    char cl[4], ch[4];
    int n = utf8_encode(lo, cl);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            int rc;
            if ((lo & m) != 0) {
                rc = nfa_utf8_range(a, s, e, lo, lo | m);
                return rc ? rc : nfa_utf8_range(a, s, e, (lo | m) + 1, hi);
            }
            if ((hi & m) != m) {
                rc = nfa_utf8_range(a, s, e, lo, (hi & ~m) - 1);
                return rc ? rc : nfa_utf8_range(a, s, e, hi & ~m, hi);
            }
        }
    }
    utf8_encode(hi, ch);
    const uint8_t *bl = (const uint8_t *)cl, *bh = (const uint8_t *)ch;
    int cur = s;
    for (int i = 0; i < n; i++) {
        int to = i == n - 1 ? e : nfa_state(a);
        if (to < 0)
            return to;
        int rc = nfa_edge(a, cur, to, bl[i], bh[i]);
        if (rc)
            return rc;
        cur = to;
    }
    return 0;
}

static int nfa_literal(struct nfa *a, int s, int e, const char *text)
{
    int cur = s;
    size_t n = strlen(text);
    for (size_t i = 0; i < n; i++) {
        int to = i + 1 == n ? e : nfa_state(a);
        if (to < 0)
            return to;
        int rc = nfa_edge(a, cur, to, (uint8_t)text[i], (uint8_t)text[i]);
        if (rc)
            return rc;
        cur = to;
    }
    return 0;
}

/* Adds the path for one character that a JSON string must escape. */
static int nfa_json_escape(struct nfa *a, int s, int e, uint32_t c)
{
    int rc = 0;
    char buf[8];
    const char *shortesc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                           : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
    if (shortesc)
        rc = nfa_literal(a, s, e, shortesc);
    if (rc || c >= 0x20)
        return rc;
    /* \u00XX with either letter case */
    int mid = nfa_state(a);
    if (mid < 0)
        return mid;
    snprintf(buf, sizeof buf, "\\u00%x", c >> 4);
    if ((rc = nfa_literal(a, s, mid, buf)))
        return rc;
    static const char hex[] = "0123456789abcdef";
    char d = hex[c & 15];
    if ((rc = nfa_edge(a, mid, e, (uint8_t)d, (uint8_t)d)))
        return rc;
    if (d >= 'a')
        rc = nfa_edge(a, mid, e, d - 32, d - 32);
    return rc;
}

static int nfa_set(struct nfa *a, int s, int e, const struct cpset *set)
{
    int rc = 0;
    if (!(a->flags & RX_JSON)) {
        for (int i = 0; i < set->n && !rc; i++)
            rc = nfa_utf8_range(a, s, e, set->r[i][0], set->r[i][1]);
        return rc;
    }
    /* JSON: '"', '\\' and controls escaped; every scalar value otherwise. A set covering
     * every character also takes \uXXXX escapes and "\/". */
    bool all = set->n == 2 && set->r[0][0] == 0 && set->r[0][1] == 0xD7FF && set->r[1][0] == 0xE000 &&
               set->r[1][1] == CP_MAX;
    for (int i = 0; i < set->n && !rc; i++) {
        uint32_t lo = set->r[i][0], hi = set->r[i][1];
        for (uint32_t c = lo; c <= hi && c < 0x20 && !rc; c++)
            rc = nfa_json_escape(a, s, e, c);
        uint32_t c = lo < 0x20 ? 0x20 : lo;
        while (c <= hi && !rc) {
            if (c == 0x22 || c == 0x5C) {
                rc = nfa_json_escape(a, s, e, c);
                c++;
                continue;
            }
            uint32_t stop = hi;
            if (c < 0x22 && hi >= 0x22)
                stop = 0x21;
            else if (c < 0x5C && hi >= 0x5C)
                stop = 0x5B;
            rc = nfa_utf8_range(a, s, e, c, stop);
            c = stop + 1;
        }
    }
    if (!rc && all) {
        rc = nfa_literal(a, s, e, "\\/");
        int st = s;
        for (int k = 0; k < 6 && !rc; k++) {
            int to = k == 5 ? e : nfa_state(a);
            if (to < 0)
                return to;
            if (k == 0)
                rc = nfa_edge(a, st, to, '\\', '\\');
            else if (k == 1)
                rc = nfa_edge(a, st, to, 'u', 'u');
            else {
                rc = nfa_edge(a, st, to, '0', '9');
                rc = rc ? rc : nfa_edge(a, st, to, 'a', 'f');
                rc = rc ? rc : nfa_edge(a, st, to, 'A', 'F');
            }
            st = to;
        }
    }
    return rc;
}

/* One copy of node starting at s; the end state in *end. */
static int nfa_emit(struct nfa *a, const struct rxparse *p, int node, int s, int *end)
{
    const struct rxnode *x = &p->nodes[node];
    int rc, e;
    switch (x->kind) {
    case RXN_SET:
        if ((e = nfa_state(a)) < 0)
            return e;
        *end = e;
        return nfa_set(a, s, e, &x->set);
    case RXN_CAT: {
        int cur = s;
        for (int c = x->first; c >= 0; c = p->nodes[c].next)
            if ((rc = nfa_emit(a, p, c, cur, &cur)))
                return rc;
        *end = cur;
        return 0;
    }
    case RXN_ALT: {
        if ((e = nfa_state(a)) < 0)
            return e;
        for (int c = x->first; c >= 0; c = p->nodes[c].next) {
            int cs = nfa_state(a), ce;
            if (cs < 0)
                return cs;
            if ((rc = nfa_edge(a, s, cs, -1, -1)) || (rc = nfa_emit(a, p, c, cs, &ce)) ||
                (rc = nfa_edge(a, ce, e, -1, -1)))
                return rc;
        }
        *end = e;
        return 0;
    }
    default: { /* RXN_REP */
        int cur = s;
        for (int k = 0; k < x->min; k++)
            if ((rc = nfa_emit(a, p, x->first, cur, &cur)))
                return rc;
        if ((e = nfa_state(a)) < 0)
            return e;
        if (x->max < 0) {
            /* loop state: cur → body → cur, cur → e */
            int ce, cs = nfa_state(a);
            if (cs < 0)
                return cs;
            if ((rc = nfa_edge(a, cur, cs, -1, -1)) || (rc = nfa_emit(a, p, x->first, cs, &ce)) ||
                (rc = nfa_edge(a, ce, cur, -1, -1)) || (rc = nfa_edge(a, cur, e, -1, -1)))
                return rc;
        } else {
            for (int k = x->min; k < x->max; k++) {
                int cs = nfa_state(a), ce;
                if (cs < 0)
                    return cs;
                if ((rc = nfa_edge(a, cur, e, -1, -1)) || (rc = nfa_edge(a, cur, cs, -1, -1)) ||
                    (rc = nfa_emit(a, p, x->first, cs, &ce)))
                    return rc;
                cur = ce;
            }
            if ((rc = nfa_edge(a, cur, e, -1, -1)))
                return rc;
        }
        *end = e;
        return 0;
    }
    }
}

/* ---- subset construction ----------------------------------------------------------------- */

struct dset_table {
    int32_t *items; /* concatenated sorted NFA state lists */
    size_t items_cap;
    size_t n_items;
    int32_t *first, *count; /* per DFA state */
    size_t st_cap;
    int n;
    int32_t *hash; /* open addressing: DFA state or -1 */
    int hash_cap;
};

static uint64_t hash_ints(const int32_t *v, int n)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) {
        h ^= (uint32_t)v[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static int dset_rehash(struct dset_table *t)
{
    int cap = t->hash_cap ? t->hash_cap * 2 : 1024;
    int32_t *h = malloc(sizeof *h * (size_t)cap);
    if (!h)
        return ERR_NOMEM;
    memset(h, 0xFF, sizeof *h * (size_t)cap);
    for (int s = 0; s < t->n; s++) {
        uint64_t k = hash_ints(t->items + t->first[s], t->count[s]) & (uint64_t)(cap - 1);
        while (h[k] >= 0)
            k = (k + 1) & (uint64_t)(cap - 1);
        h[k] = s;
    }
    free(t->hash);
    t->hash = h;
    t->hash_cap = cap;
    return 0;
}

/* The DFA state of the sorted set v[0, n) (new if unseen; *is_new tells). */
static int dset_intern(struct dset_table *t, const int32_t *v, int n, bool *is_new)
{
    if ((t->n + 1) * 2 > t->hash_cap) {
        int rc = dset_rehash(t);
        if (rc)
            return rc;
    }
    uint64_t k = hash_ints(v, n) & (uint64_t)(t->hash_cap - 1);
    while (t->hash[k] >= 0) {
        int s = t->hash[k];
        if (t->count[s] == n && !memcmp(t->items + t->first[s], v, sizeof *v * (size_t)n)) {
            *is_new = false;
            return s;
        }
        k = (k + 1) & (uint64_t)(t->hash_cap - 1);
    }
    if (!grow_array((void **)&t->items, &t->items_cap, t->n_items + (size_t)n, sizeof *t->items))
        return ERR_NOMEM;
    size_t cap0 = t->st_cap;
    if (!grow_array((void **)&t->first, &cap0, (size_t)t->n + 1, sizeof *t->first))
        return ERR_NOMEM;
    cap0 = t->st_cap;
    if (!grow_array((void **)&t->count, &cap0, (size_t)t->n + 1, sizeof *t->count))
        return ERR_NOMEM;
    t->st_cap = cap0;
    memcpy(t->items + t->n_items, v, sizeof *v * (size_t)n);
    t->first[t->n] = (int32_t)t->n_items;
    t->count[t->n] = n;
    t->n_items += (size_t)n;
    t->hash[k] = t->n;
    *is_new = true;
    return t->n++;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* Epsilon closure of v[0, *n) in place (buffer capacity n_states), sorted unique. */
static void nfa_closure(const int32_t *eps_first, const int32_t *eps_to, int32_t *v, int *n, uint8_t *mark)
{
    int top = *n;
    for (int i = 0; i < top; i++)
        mark[v[i]] = 1;
    for (int i = 0; i < top; i++) {
        int s = v[i];
        for (int k = eps_first[s]; k < eps_first[s + 1]; k++) {
            int t = eps_to[k];
            if (!mark[t]) {
                mark[t] = 1;
                v[top++] = t;
            }
        }
    }
    for (int i = 0; i < top; i++)
        mark[v[i]] = 0;
    qsort(v, (size_t)top, sizeof *v, cmp_i32);
    *n = top;
}

void gdfa_free(struct gdfa *d)
{
    if (!d)
        return;
    free(d->trans);
    free(d->accept);
    free(d->live);
    free(d->next);
    free(d->cls);
    memset(d, 0, sizeof *d);
}

/* Drops transitions into states that cannot reach an accepting state and recomputes
 * live. Returns false when the start state itself cannot accept anything. */
static bool gdfa_prune(struct gdfa *d)
{
    int n = d->n_states, nbc = d->n_bc;
    size_t ne = (size_t)n * (size_t)nbc;
    /* reverse edges (CSR), then a search back from the accepting states */
    uint8_t *good = calloc((size_t)n, 1);
    int32_t *rfirst = calloc((size_t)n + 1, sizeof *rfirst), *rfrom = malloc(sizeof *rfrom * (ne ? ne : 1));
    int32_t *queue = malloc(sizeof *queue * (size_t)n);
    if (!good || !rfirst || !rfrom || !queue) {
        free(good);
        free(rfirst);
        free(rfrom);
        free(queue);
        return false;
    }
    for (size_t i = 0; i < ne; i++)
        if (d->trans[i] >= 0)
            rfirst[d->trans[i] + 1]++;
    for (int s = 0; s < n; s++)
        rfirst[s + 1] += rfirst[s];
    for (size_t i = 0; i < ne; i++)
        if (d->trans[i] >= 0)
            rfrom[rfirst[d->trans[i]]++] = (int32_t)(i / (size_t)nbc);
    for (int s = n; s > 0; s--)
        rfirst[s] = rfirst[s - 1];
    rfirst[0] = 0;
    int qn = 0;
    for (int s = 0; s < n; s++)
        if (d->accept[s]) {
            good[s] = 1;
            queue[qn++] = s;
        }
    for (int qi = 0; qi < qn; qi++)
        for (int k = rfirst[queue[qi]]; k < rfirst[queue[qi] + 1]; k++)
            if (!good[rfrom[k]]) {
                good[rfrom[k]] = 1;
                queue[qn++] = rfrom[k];
            }
    free(rfirst);
    free(rfrom);
    free(queue);
    for (int s = 0; s < n; s++) {
        d->live[s] = 0;
        uint32_t *next = d->next + (size_t)s * 8;
        memset(next, 0, 8 * sizeof *next);
        for (int c = 0; c < d->n_bc; c++) {
            int32_t *t = &d->trans[(size_t)s * (size_t)d->n_bc + c];
            if (*t >= 0 && !good[*t])
                *t = -1;
            if (*t >= 0)
                d->live[s] = 1;
        }
        for (int b = 0; b < 256; b++)
            if (gdfa_step(d, s, (unsigned)b) >= 0)
                next[b >> 5] |= 1u << (b & 31);
    }
    memset(d->cont, 0, sizeof d->cont);
    for (int s = 0; s < n; s++)
        if (d->accept[s])
            for (int k = 0; k < 8; k++)
                d->cont[k] |= d->next[(size_t)s * 8 + k];
    bool ok = good[d->start];
    free(good);
    return ok;
}

/* Allocates n states over the byte classes d->n_bc (set by the caller). */
static int dfa_alloc(struct gdfa *d, int n)
{
    d->n_states = n;
    d->trans = malloc(sizeof *d->trans * (size_t)n * (size_t)d->n_bc);
    d->accept = calloc((size_t)n, 1);
    d->live = calloc((size_t)n, 1);
    d->next = calloc((size_t)n * 8, sizeof *d->next);
    if (!d->trans || !d->accept || !d->live || !d->next)
        return ERR_NOMEM;
    memset(d->trans, 0xFF, sizeof *d->trans * (size_t)n * (size_t)d->n_bc);
    return 0;
}

static int nfa_to_dfa(struct nfa *a, int start, int final, struct gdfa *out)
{
    int ns = a->n_states, rc = 0;
    int32_t *eps_first = calloc((size_t)ns + 1, sizeof *eps_first);
    int32_t *byte_first = calloc((size_t)ns + 1, sizeof *byte_first);
    int32_t *eps_to = malloc(sizeof *eps_to * ((size_t)a->n_edges + 1));
    int32_t *byte_e = malloc(sizeof *byte_e * ((size_t)a->n_edges + 1));
    int32_t *buf = malloc(sizeof *buf * (size_t)ns);
    int32_t *bucket_n = calloc(256, sizeof *bucket_n);
    int32_t *bucket = NULL; /* [n_bc][ns]: the targets of each byte class */
    uint8_t *mark = calloc((size_t)ns, 1);
    struct dset_table t = { 0 };
    int32_t *trans = NULL;
    size_t trans_cap = 0;
    if (!eps_first || !byte_first || !eps_to || !byte_e || !buf || !bucket_n || !mark) {
        rc = ERR_NOMEM;
        goto fail;
    }
    for (int i = 0; i < a->n_edges; i++)
        (a->e[i].lo < 0 ? eps_first : byte_first)[a->e[i].from + 1]++;
    for (int s = 0; s < ns; s++) {
        eps_first[s + 1] += eps_first[s];
        byte_first[s + 1] += byte_first[s];
    }
    {
        int32_t *ef = malloc(sizeof *ef * (size_t)ns), *bf = malloc(sizeof *bf * (size_t)ns);
        if (!ef || !bf) {
            free(ef);
            free(bf);
            rc = ERR_NOMEM;
            goto fail;
        }
        memcpy(ef, eps_first, sizeof *ef * (size_t)ns);
        memcpy(bf, byte_first, sizeof *bf * (size_t)ns);
        for (int i = 0; i < a->n_edges; i++) {
            if (a->e[i].lo < 0)
                eps_to[ef[a->e[i].from]++] = a->e[i].to;
            else
                byte_e[bf[a->e[i].from]++] = i;
        }
        free(ef);
        free(bf);
    }
    /* per-byte target lists, each up to ns entries: allocate lazily as one block */
    /* byte classes: the bytes between two consecutive edge range boundaries */
    uint8_t cut[257] = { 0 };
    for (int i = 0; i < a->n_edges; i++)
        if (a->e[i].lo >= 0) {
            cut[a->e[i].lo] = 1;
            cut[a->e[i].hi + 1] = 1;
        }
    int n_bc = 0;
    for (int b = 0; b < 256; b++) {
        if (b > 0 && cut[b])
            n_bc++;
        out->bc[b] = (uint8_t)n_bc;
    }
    n_bc++;
    out->n_bc = n_bc;
    size_t bucket_bytes = sizeof *bucket * (size_t)ns * (size_t)n_bc;
    if (bucket_bytes > (size_t)64 << 20) {
        rc = err_set(a->err, a->errlen, ERR_RANGE, "regex too large (%d automaton states)", ns);
        goto fail;
    }
    if (!(bucket = malloc(bucket_bytes))) {
        rc = ERR_NOMEM;
        goto fail;
    }
    int n = 1;
    buf[0] = start;
    nfa_closure(eps_first, eps_to, buf, &n, mark);
    bool is_new;
    if ((rc = dset_intern(&t, buf, n, &is_new)) < 0)
        goto fail;
    rc = 0;
    for (int d = 0; d < t.n; d++) {
        if (d >= GR_MAX_DFA_STATES) {
            rc = err_set(a->err, a->errlen, ERR_RANGE, "regex too large (over %d DFA states)", GR_MAX_DFA_STATES);
            goto fail;
        }
        if (!grow_array((void **)&trans, &trans_cap, (size_t)(d + 1) * (size_t)n_bc, sizeof *trans)) {
            rc = ERR_NOMEM;
            goto fail;
        }
        memset(bucket_n, 0, (size_t)n_bc * sizeof *bucket_n);
        for (int k = 0; k < t.count[d]; k++) {
            int s = t.items[t.first[d] + k];
            for (int j = byte_first[s]; j < byte_first[s + 1]; j++) {
                const struct nedge *e = &a->e[byte_e[j]];
                for (int c = out->bc[e->lo]; c <= out->bc[e->hi]; c++) {
                    int32_t *bl = bucket + (size_t)c * (size_t)ns;
                    if (bucket_n[c] && bl[bucket_n[c] - 1] == e->to)
                        continue;
                    bool dup = false;
                    for (int q = 0; q < bucket_n[c] && !dup; q++)
                        dup = bl[q] == e->to;
                    if (!dup)
                        bl[bucket_n[c]++] = e->to;
                }
            }
        }
        for (int c = 0; c < n_bc; c++) {
            if (!bucket_n[c]) {
                trans[(size_t)d * (size_t)n_bc + c] = -1;
                continue;
            }
            n = bucket_n[c];
            memcpy(buf, bucket + (size_t)c * (size_t)ns, sizeof *buf * (size_t)n);
            nfa_closure(eps_first, eps_to, buf, &n, mark);
            int id = dset_intern(&t, buf, n, &is_new);
            if (id < 0) {
                rc = id;
                goto fail;
            }
            trans[(size_t)d * (size_t)n_bc + c] = id;
        }
    }
    if ((rc = dfa_alloc(out, t.n)))
        goto fail;
    memcpy(out->trans, trans, sizeof *trans * (size_t)t.n * (size_t)n_bc);
    out->start = 0;
    for (int d = 0; d < t.n; d++) {
        const int32_t *v = t.items + t.first[d];
        out->accept[d] = bsearch(&final, v, (size_t)t.count[d], sizeof *v, cmp_i32) != NULL;
    }
    if (!gdfa_prune(out)) {
        gdfa_free(out);
        rc = err_set(a->err, a->errlen, ERR_INVALID, "regex matches no text");
    }
fail:
    free(eps_first);
    free(byte_first);
    free(eps_to);
    free(byte_e);
    free(buf);
    free(bucket_n);
    free(bucket);
    free(mark);
    free(t.items);
    free(t.first);
    free(t.count);
    free(t.hash);
    free(trans);
    return rc;
}

int rx_compile(const char *re, size_t len, unsigned flags, struct gdfa *out, char *err, size_t errlen)
{
    struct rxparse p = { .s = re, .len = len, .err = err, .errlen = errlen };
    struct nfa a = { .flags = flags, .err = err, .errlen = errlen };
    int rc, root;
    memset(out, 0, sizeof *out);
    bool anchor_start = false, anchor_end = false;
    if (p.len && p.s[0] == '^') {
        anchor_start = true;
        p.i = 1;
    }
    if (p.len > p.i && p.s[p.len - 1] == '$') {
        size_t bs = 0; /* an escaped '$' is a literal */
        for (size_t k = p.len - 1; k > p.i && p.s[k - 1] == '\\'; k--)
            bs++;
        if (!(bs & 1)) {
            anchor_end = true;
            p.len--;
        }
    }
    if ((rc = rx_alt(&p, &root)))
        goto fail;
    if (p.i < p.len) {
        rc = err_set(err, errlen, ERR_INVALID, "regex: unbalanced ')' at offset %zu", p.i);
        goto fail;
    }
    for (int i = 0; i < p.n; i++)
        if (p.nodes[i].kind == RXN_SET && (rc = cps_drop_surrogates(&p.nodes[i].set)))
            goto fail;
    int s = nfa_state(&a), e;
    if (s < 0) {
        rc = s;
        goto fail;
    }
    int cur = s;
    /* JSON Schema patterns search: an unanchored end takes any characters. */
    struct cpset any = { 0 };
    if ((flags & RX_SEARCH) && (!anchor_start || !anchor_end)) {
        if ((rc = cps_add(&any, 0, 0xD7FF)) || (rc = cps_add(&any, 0xE000, CP_MAX))) {
            free(any.r);
            goto fail;
        }
    }
    if ((flags & RX_SEARCH) && !anchor_start) {
        int loop = cur;
        if ((rc = nfa_set(&a, loop, loop, &any))) {
            free(any.r);
            goto fail;
        }
    }
    if ((rc = nfa_emit(&a, &p, root, cur, &e))) {
        free(any.r);
        goto fail;
    }
    if ((flags & RX_SEARCH) && !anchor_end) {
        int f = nfa_state(&a);
        if (f < 0 || (rc = nfa_edge(&a, e, f, -1, -1)) || (rc = nfa_set(&a, f, f, &any))) {
            free(any.r);
            rc = f < 0 ? f : rc;
            goto fail;
        }
        e = f;
    }
    free(any.r);
    rc = nfa_to_dfa(&a, s, e, out);
fail:
    for (int i = 0; i < p.n; i++)
        free(p.nodes[i].set.r);
    free(p.nodes);
    free(a.e);
    return rc;
}

/* ---- DFA difference -------------------------------------------------------------------- */

int gdfa_difference(const struct gdfa *a, const struct gdfa *b, struct gdfa *out, char *err, size_t errlen)
{
    /* pair (x, y) with y = -1 when b is dead; interned through a hash of x * (nb + 1) + y + 1 */
    int64_t nb1 = (int64_t)b->n_states + 1;
    int cap = 1024, n = 0, rc = 0;
    int64_t *keys = NULL;
    int32_t *hash = NULL, *trans = NULL;
    size_t keys_cap = 0, trans_cap = 0;
    memset(out, 0, sizeof *out);
    hash = malloc(sizeof *hash * (size_t)cap);
    if (!hash)
        return ERR_NOMEM;
    memset(hash, 0xFF, sizeof *hash * (size_t)cap);
    int64_t start_key = (int64_t)a->start * nb1 + b->start + 1;
#define DIFF_INTERN(KEY, OUTID)                                                                  \
    do {                                                                                         \
        if ((n + 1) * 2 > cap) {                                                                 \
            int ncap = cap * 2;                                                                  \
            int32_t *nh = malloc(sizeof *nh * (size_t)ncap);                                     \
            if (!nh) {                                                                           \
                rc = ERR_NOMEM;                                                                  \
                goto fail;                                                                       \
            }                                                                                    \
            memset(nh, 0xFF, sizeof *nh * (size_t)ncap);                                         \
            for (int q = 0; q < n; q++) {                                                        \
                uint64_t h = ((uint64_t)keys[q] * 0x9E3779B97F4A7C15ull >> 20) & (uint64_t)(ncap - 1); \
                while (nh[h] >= 0)                                                               \
                    h = (h + 1) & (uint64_t)(ncap - 1);                                          \
                nh[h] = q;                                                                       \
            }                                                                                    \
            free(hash);                                                                          \
            hash = nh;                                                                           \
            cap = ncap;                                                                          \
        }                                                                                        \
        uint64_t h = ((uint64_t)(KEY) * 0x9E3779B97F4A7C15ull >> 20) & (uint64_t)(cap - 1);      \
        while (hash[h] >= 0 && keys[hash[h]] != (KEY))                                           \
            h = (h + 1) & (uint64_t)(cap - 1);                                                   \
        if (hash[h] < 0) {                                                                       \
            if (n >= GR_MAX_DFA_STATES) {                                                        \
                rc = err_set(err, errlen, ERR_RANGE, "property names automaton too large");      \
                goto fail;                                                                       \
            }                                                                                    \
            if (!grow_array((void **)&keys, &keys_cap, (size_t)n + 1, sizeof *keys)) {           \
                rc = ERR_NOMEM;                                                                  \
                goto fail;                                                                       \
            }                                                                                    \
            keys[n] = (KEY);                                                                     \
            hash[h] = n++;                                                                       \
        }                                                                                        \
        OUTID = hash[h];                                                                         \
    } while (0)
    /* byte classes of the product: pairs of the operands' classes */
    int pair_id[256], rep[256], n_bc = 0;
    for (int x = 0; x < 256; x++) {
        int pair = a->bc[x] * 256 + b->bc[x], found = -1;
        for (int c = 0; c < n_bc && found < 0; c++)
            if (pair_id[c] == pair)
                found = c;
        if (found < 0) {
            pair_id[n_bc] = pair;
            rep[n_bc] = x;
            found = n_bc++;
        }
        out->bc[x] = (uint8_t)found;
    }
    out->n_bc = n_bc;
    int id;
    DIFF_INTERN(start_key, id);
    for (int d = 0; d < n; d++) {
        if (!grow_array((void **)&trans, &trans_cap, (size_t)(d + 1) * (size_t)n_bc, sizeof *trans)) {
            rc = ERR_NOMEM;
            goto fail;
        }
        int x = (int)(keys[d] / nb1), y = (int)(keys[d] % nb1) - 1;
        for (int c = 0; c < n_bc; c++) {
            int nx = gdfa_step(a, x, (unsigned)rep[c]);
            if (nx < 0) {
                trans[(size_t)d * (size_t)n_bc + c] = -1;
                continue;
            }
            int ny = y >= 0 ? gdfa_step(b, y, (unsigned)rep[c]) : -1;
            int64_t key = (int64_t)nx * nb1 + ny + 1;
            DIFF_INTERN(key, id);
            trans[(size_t)d * (size_t)n_bc + c] = id;
        }
    }
#undef DIFF_INTERN
    if ((rc = dfa_alloc(out, n)))
        goto fail;
    memcpy(out->trans, trans, sizeof *trans * (size_t)n * (size_t)n_bc);
    for (int d = 0; d < n; d++) {
        int x = (int)(keys[d] / nb1), y = (int)(keys[d] % nb1) - 1;
        out->accept[d] = a->accept[x] && !(y >= 0 && b->accept[y]);
    }
    out->start = 0;
    if (!gdfa_prune(out))
        rc = err_set(err, errlen, ERR_INVALID, "no property name is left for additional properties");
fail:
    if (rc)
        gdfa_free(out);
    free(keys);
    free(hash);
    free(trans);
    return rc;
}

/* ---- behaviour classes ------------------------------------------------------------------ */

int gdfa_classes(struct gdfa *d, int horizon)
{
    int n = d->n_states, rc = 0;
    int nrep = d->n_bc; /* one column per byte class */
    int32_t *cls = malloc(sizeof *cls * (size_t)n), *next = malloc(sizeof *next * (size_t)n);
    int32_t *sig = malloc(sizeof *sig * (size_t)n * (size_t)(nrep + 1));
    int hcap = 16;
    while (hcap < 2 * n)
        hcap *= 2;
    int32_t *hash = malloc(sizeof *hash * (size_t)hcap);
    if (!cls || !next || !sig || !hash) {
        rc = ERR_NOMEM;
        goto fail;
    }
    int k = 0;
    for (int s = 0; s < n; s++)
        cls[s] = d->accept[s];
    for (int s = 0; s < n; s++)
        k = cls[s] + 1 > k ? cls[s] + 1 : k;
    for (int round = 0; round < horizon; round++) {
        int w = nrep + 1, nk = 0;
        memset(hash, 0xFF, sizeof *hash * (size_t)hcap);
        for (int s = 0; s < n; s++) {
            int32_t *v = sig + (size_t)s * (size_t)w;
            v[0] = cls[s];
            for (int r = 0; r < nrep; r++) {
                int32_t t = d->trans[(size_t)s * (size_t)nrep + r];
                v[r + 1] = t < 0 ? -1 : cls[t];
            }
            uint64_t h = 1469598103934665603ull;
            for (int i = 0; i < w; i++) {
                h ^= (uint32_t)v[i];
                h *= 1099511628211ull;
            }
            size_t slot = (size_t)(h ^ (h >> 31)) & (size_t)(hcap - 1);
            for (;;) {
                int32_t o = hash[slot];
                if (o < 0) {
                    hash[slot] = s;
                    next[s] = nk++;
                    break;
                }
                if (!memcmp(sig + (size_t)o * (size_t)w, v, sizeof *v * (size_t)w)) {
                    next[s] = next[o];
                    break;
                }
                slot = (slot + 1) & (size_t)(hcap - 1);
            }
        }
        memcpy(cls, next, sizeof *cls * (size_t)n);
        if (nk == k)
            break; /* stable: refining further changes nothing */
        k = nk;
    }
    free(d->cls);
    d->cls = cls;
    cls = NULL;
fail:
    free(cls);
    free(next);
    free(sig);
    free(hash);
    return rc;
}

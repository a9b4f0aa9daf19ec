/* schema.c — JSON Schema (and "any JSON object") to grammar rules.
 *
 * Structure (objects, arrays, anyOf, $ref) becomes rules; every lexeme (strings, numbers,
 * integer ranges, formats, patterns, whitespace) becomes a DFA element compiled from a
 * regex (regex.c). The text is standard JSON with bounded whitespace: wherever JSON
 * allows whitespace the grammar takes an optional line break ("\n" or "\r\n") followed by
 * at most GR_WS_MAX spaces or tabs (docs/grammar.md has the rest of the rules).
 */
#include "grammar/grammar_int.h"

#include "util/err.h"
#include "util/grow.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GR_WS_MAX 20        /* spaces/tabs after an optional line break */
#define GR_ANY_DEPTH 10     /* nesting of free-form JSON values */
#define GR_INT_DIGITS 16    /* digits of an unbounded integer part */
#define GR_MAX_ITEMS 1000   /* minItems / maxItems / minLength / maxLength */
#define INT_CAP 9999999999999999LL /* 10^16 - 1 */
#define GR_LEN_DFA_MAX 128  /* string length bounds up to this compile to one DFA */
#define GR_MAX_PROPERTIES 256 /* properties of one object */

struct sc_ref {
    char *name;
    int rule;
};

struct sctx {
    struct gbuild *b;
    const cJSON *root;
    struct sc_ref *refs;
    int n_refs;
    size_t refs_cap;
    int ws, str_body, num, integer, one_char; /* DFA ids, -1 until made */
    int any_value[GR_ANY_DEPTH + 1];          /* rule ids, -1 until made */
    int str_rule;                             /* rule: a free string */
    char *err;
    size_t errlen;
};

static int sc_value(struct sctx *c, const cJSON *s, int depth, struct gel *out);

/* ---- lexemes -------------------------------------------------------------------------- */

static int dfa_of(struct sctx *c, const char *re, unsigned flags, int *id)
{
    struct gdfa d;
    int rc = rx_compile(re, strlen(re), flags, &d, c->err, c->errlen);
    if (rc)
        return rc;
    int r = gb_add_dfa(c->b, &d);
    if (r < 0)
        return r;
    *id = r;
    return 0;
}

/* Unbounded JSON numbers (at most 16 integer digits, so a model cannot run on forever). */
#define INTEGER_RE "-?(0|[1-9][0-9]{0,15})"
#define NUMBER_RE INTEGER_RE "(\\.[0-9]{1,16})?([eE][+-]?[0-9]{1,3})?"

static int lazy_dfa(struct sctx *c, int *slot, const char *re, unsigned flags)
{
    if (*slot >= 0)
        return 0;
    return dfa_of(c, re, flags, slot);
}

static int push_ws(struct sctx *c, struct gseq *s)
{
    char re[64];
    snprintf(re, sizeof re, "(\\r?\\n)?[ \\t]{0,%d}", GR_WS_MAX);
    int rc = lazy_dfa(c, &c->ws, re, 0);
    return rc ? rc : gseq_push(s, GEL_DFA, (uint32_t)c->ws);
}

static int push_lit(struct sctx *c, struct gseq *s, const char *text) { return gseq_lit(c->b, s, text, strlen(text)); }

/* A rule with the single alternative s (consumed: s is reset). */
static int rule_of(struct sctx *c, struct gseq *s, struct gel *out)
{
    int r = gb_new_rule(c->b);
    if (r < 0)
        return r;
    int rc = gb_add_alt(c->b, r, s);
    s->n = 0;
    if (rc)
        return rc;
    *out = (struct gel){ GEL_REF, (uint32_t)r };
    return 0;
}

/* '"' body '"' where body is the DFA dfa (JSON-escaped characters). */
static int string_with_body(struct sctx *c, int dfa, struct gel *out)
{
    struct gseq s = { 0 };
    int rc = push_lit(c, &s, "\"");
    rc = rc ? rc : gseq_push(&s, GEL_DFA, (uint32_t)dfa);
    rc = rc ? rc : push_lit(c, &s, "\"");
    rc = rc ? rc : rule_of(c, &s, out);
    gseq_free(&s);
    return rc;
}

static int any_string(struct sctx *c, struct gel *out)
{
    if (c->str_rule >= 0) {
        *out = (struct gel){ GEL_REF, (uint32_t)c->str_rule };
        return 0;
    }
    int rc = lazy_dfa(c, &c->str_body, "[\\s\\S]*", RX_JSON);
    if (rc || (rc = string_with_body(c, c->str_body, out)))
        return rc;
    c->str_rule = (int)out->arg;
    return 0;
}

/* A literal JSON text (the value printed compactly by cJSON). */
static int literal_value(struct sctx *c, const cJSON *v, struct gseq *s)
{
    char *txt = cJSON_PrintUnformatted(v);
    if (!txt)
        return ERR_NOMEM;
    int rc = push_lit(c, s, txt);
    cJSON_free(txt);
    return rc;
}

/* ---- free-form JSON values --------------------------------------------------------------- */

static int any_value(struct sctx *c, int d, struct gel *out);

static int any_value(struct sctx *c, int d, struct gel *out)
{
    if (c->any_value[d] >= 0) {
        *out = (struct gel){ GEL_REF, (uint32_t)c->any_value[d] };
        return 0;
    }
    int r = gb_new_rule(c->b), rc;
    if (r < 0)
        return r;
    c->any_value[d] = r;
    struct gseq s = { 0 };
    struct gel str;
    if ((rc = any_string(c, &str)) || (rc = gseq_push(&s, str.kind, str.arg)) || (rc = gb_add_alt(c->b, r, &s)))
        goto fail;
    s.n = 0;
    if ((rc = lazy_dfa(c, &c->num, NUMBER_RE, 0)) ||
        (rc = gseq_push(&s, GEL_DFA, (uint32_t)c->num)) || (rc = gb_add_alt(c->b, r, &s)))
        goto fail;
    static const char *const lits[] = { "true", "false", "null" };
    for (int i = 0; i < 3; i++) {
        s.n = 0;
        if ((rc = push_lit(c, &s, lits[i])) || (rc = gb_add_alt(c->b, r, &s)))
            goto fail;
    }
    if (d < GR_ANY_DEPTH) {
        struct gel inner;
        if ((rc = any_value(c, d + 1, &inner)))
            goto fail;
        /* object: "{" ws ( "}" | member more "}" ), member ::= string ws ":" ws value ws,
         * more ::= "," ws member more | ε */
        int member = gb_new_rule(c->b), more = gb_new_rule(c->b);
        if (member < 0 || more < 0) {
            rc = member < 0 ? member : more;
            goto fail;
        }
        s.n = 0;
        if ((rc = gseq_push(&s, str.kind, str.arg)) || (rc = push_ws(c, &s)) || (rc = push_lit(c, &s, ":")) ||
            (rc = push_ws(c, &s)) || (rc = gseq_push(&s, inner.kind, inner.arg)) || (rc = push_ws(c, &s)) ||
            (rc = gb_add_alt(c->b, member, &s)))
            goto fail;
        s.n = 0;
        if ((rc = push_lit(c, &s, ",")) || (rc = push_ws(c, &s)) || (rc = gseq_push(&s, GEL_REF, (uint32_t)member)) ||
            (rc = gseq_push(&s, GEL_REF, (uint32_t)more)) || (rc = gb_add_alt(c->b, more, &s)))
            goto fail;
        s.n = 0;
        if ((rc = gb_add_alt(c->b, more, &s)))
            goto fail;
        int body = gb_new_rule(c->b);
        if (body < 0) {
            rc = body;
            goto fail;
        }
        s.n = 0;
        if ((rc = push_lit(c, &s, "}")) || (rc = gb_add_alt(c->b, body, &s)))
            goto fail;
        s.n = 0;
        if ((rc = gseq_push(&s, GEL_REF, (uint32_t)member)) || (rc = gseq_push(&s, GEL_REF, (uint32_t)more)) ||
            (rc = push_lit(c, &s, "}")) || (rc = gb_add_alt(c->b, body, &s)))
            goto fail;
        s.n = 0;
        if ((rc = push_lit(c, &s, "{")) || (rc = push_ws(c, &s)) || (rc = gseq_push(&s, GEL_REF, (uint32_t)body)) ||
            (rc = gb_add_alt(c->b, r, &s)))
            goto fail;
        /* array: "[" ws ( "]" | value ws amore "]" ), amore ::= "," ws value ws amore | ε */
        int amore = gb_new_rule(c->b), abody = gb_new_rule(c->b);
        if (amore < 0 || abody < 0) {
            rc = amore < 0 ? amore : abody;
            goto fail;
        }
        s.n = 0;
        if ((rc = push_lit(c, &s, ",")) || (rc = push_ws(c, &s)) || (rc = gseq_push(&s, inner.kind, inner.arg)) ||
            (rc = push_ws(c, &s)) || (rc = gseq_push(&s, GEL_REF, (uint32_t)amore)) ||
            (rc = gb_add_alt(c->b, amore, &s)))
            goto fail;
        s.n = 0;
        if ((rc = gb_add_alt(c->b, amore, &s)))
            goto fail;
        s.n = 0;
        if ((rc = push_lit(c, &s, "]")) || (rc = gb_add_alt(c->b, abody, &s)))
            goto fail;
        s.n = 0;
        if ((rc = gseq_push(&s, inner.kind, inner.arg)) || (rc = push_ws(c, &s)) ||
            (rc = gseq_push(&s, GEL_REF, (uint32_t)amore)) || (rc = push_lit(c, &s, "]")) ||
            (rc = gb_add_alt(c->b, abody, &s)))
            goto fail;
        s.n = 0;
        if ((rc = push_lit(c, &s, "[")) || (rc = push_ws(c, &s)) || (rc = gseq_push(&s, GEL_REF, (uint32_t)abody)) ||
            (rc = gb_add_alt(c->b, r, &s)))
            goto fail;
    }
    *out = (struct gel){ GEL_REF, (uint32_t)r };
fail:
    gseq_free(&s);
    return rc;
}

/* ---- keywords ------------------------------------------------------------------------------ */

static const char *const annotation_kw[] = { "title", "description", "default", "examples", "$schema", "$id",
                                             "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
                                             "definitions", NULL };
static const char *const constraint_kw[] = { "type", "properties", "required", "additionalProperties", "enum",
                                             "const", "items", "prefixItems", "minItems", "maxItems", "anyOf",
                                             "oneOf", "allOf", "$ref", "minLength", "maxLength", "pattern",
                                             "format", "minimum", "maximum", "exclusiveMinimum",
                                             "exclusiveMaximum", NULL };

static bool in_list(const char *const *list, const char *k)
{
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], k))
            return true;
    return false;
}

/* Refuses keywords outside both lists; returns the number of constraint keywords. */
static int check_keywords(struct sctx *c, const cJSON *s, int *n_constraints)
{
    int n = 0;
    for (const cJSON *k = s->child; k; k = k->next) {
        if (in_list(constraint_kw, k->string))
            n++;
        else if (!in_list(annotation_kw, k->string))
            return err_set(c->err, c->errlen, ERR_UNSUPPORTED, "unsupported JSON Schema keyword '%s'", k->string);
    }
    *n_constraints = n;
    return 0;
}

/* ---- integers and numbers ------------------------------------------------------------------ */

struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
};

static void sb_puts(struct sbuf *b, const char *s)
{
    size_t l = strlen(s);
    if (!grow_array((void **)&b->p, &b->cap, b->n + l + 1, 1)) {
        b->oom = true;
        return;
    }
    memcpy(b->p + b->n, s, l + 1);
    b->n += l;
}

/* Alternatives for the decimal strings of the same length between a and b (inclusive),
 * each preceded by prefix; items separated by '|'. */
static void range_same(struct sbuf *out, const char *prefix, const char *a, const char *b)
{
    size_t L = strlen(a);
    char buf[128];
    if (L == 0 || !strcmp(a, b)) {
        if (out->n)
            sb_puts(out, "|");
        sb_puts(out, prefix);
        sb_puts(out, a);
        return;
    }
    if (a[0] == b[0]) {
        snprintf(buf, sizeof buf, "%s%c", prefix, a[0]);
        range_same(out, buf, a + 1, b + 1);
        return;
    }
    bool a_zero = strspn(a + 1, "0") == L - 1, b_nine = strspn(b + 1, "9") == L - 1;
    char lo = a[0], hi = b[0];
    char nines[40], zeros[40];
    memset(nines, '9', L - 1);
    nines[L - 1] = 0;
    memset(zeros, '0', L - 1);
    zeros[L - 1] = 0;
    if (!a_zero) {
        snprintf(buf, sizeof buf, "%s%c", prefix, a[0]);
        range_same(out, buf, a + 1, nines);
        lo++;
    }
    if (!b_nine)
        hi--;
    if (lo <= hi) {
        if (out->n)
            sb_puts(out, "|");
        snprintf(buf, sizeof buf, "%s[%c-%c]", prefix, lo, hi);
        sb_puts(out, buf);
        if (L > 1) {
            snprintf(buf, sizeof buf, "[0-9]{%zu}", L - 1);
            sb_puts(out, buf);
        }
    }
    if (!b_nine) {
        snprintf(buf, sizeof buf, "%s%c", prefix, b[0]);
        range_same(out, buf, zeros, b + 1);
    }
}

/* Alternatives for the integers a..b (0 <= a <= b), decimal without leading zeros. */
static void range_pos(struct sbuf *out, const char *prefix, long long a, long long b)
{
    long long p10 = 1;
    for (int len = 1; len <= 18 && a <= b; len++, p10 *= 10) {
        long long lo = len == 1 ? 0 : p10, hi = p10 * 10 - 1;
        if (hi < a)
            continue;
        if (lo < a)
            lo = a;
        if (hi > b)
            hi = b;
        if (lo > hi)
            continue;
        char sa[32], sbv[32];
        snprintf(sa, sizeof sa, "%lld", lo);
        snprintf(sbv, sizeof sbv, "%lld", hi);
        range_same(out, prefix, sa, sbv);
    }
}

/* Regex alternatives for integers in [lo, hi]. */
static void range_regex(struct sbuf *out, long long lo, long long hi)
{
    if (lo < 0)
        range_pos(out, "-", hi < 0 ? -hi : 1, -lo);
    if (hi >= 0)
        range_pos(out, "", lo > 0 ? lo : 0, hi);
}

/* Reads a numeric bound; *present false when absent. */
static int read_bound(struct sctx *c, const cJSON *s, const char *kw, double *v, bool *present)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, kw);
    *present = false;
    if (!x)
        return 0;
    if (!cJSON_IsNumber(x))
        return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: '%s' is not a number", kw);
    if (fabs(x->valuedouble) > (double)INT_CAP)
        return err_set(c->err, c->errlen, ERR_UNSUPPORTED, "unsupported JSON Schema '%s': magnitude above 10^16", kw);
    *v = x->valuedouble;
    *present = true;
    return 0;
}

struct bounds {
    double lo, hi;
    bool has_lo, has_hi, lo_excl, hi_excl;
};

static int read_bounds(struct sctx *c, const cJSON *s, struct bounds *bd)
{
    double v;
    bool p;
    int rc;
    memset(bd, 0, sizeof *bd);
    if ((rc = read_bound(c, s, "minimum", &v, &p)))
        return rc;
    if (p)
        bd->lo = v, bd->has_lo = true;
    if ((rc = read_bound(c, s, "maximum", &v, &p)))
        return rc;
    if (p)
        bd->hi = v, bd->has_hi = true;
    if ((rc = read_bound(c, s, "exclusiveMinimum", &v, &p)))
        return rc;
    if (p && (!bd->has_lo || v >= bd->lo))
        bd->lo = v, bd->has_lo = true, bd->lo_excl = true;
    if ((rc = read_bound(c, s, "exclusiveMaximum", &v, &p)))
        return rc;
    if (p && (!bd->has_hi || v <= bd->hi))
        bd->hi = v, bd->has_hi = true, bd->hi_excl = true;
    return 0;
}

static int regex_rule(struct sctx *c, const char *re, unsigned flags, struct gel *out)
{
    int id;
    int rc = dfa_of(c, re, flags, &id);
    if (rc)
        return rc;
    *out = (struct gel){ GEL_DFA, (uint32_t)id };
    return 0;
}

/* Numeric formats: int32 / int64 on integers (int32 narrows the bounds), float / double
 * on numbers (no constraint); anything else is refused. */
static int numeric_format(struct sctx *c, const cJSON *s, bool integer, struct bounds *bd)
{
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    if (!fmt)
        return 0;
    const char *f = cJSON_IsString(fmt) ? fmt->valuestring : "";
    if (integer && !strcmp(f, "int32")) {
        if (!bd->has_lo || bd->lo < -2147483648.0)
            bd->lo = -2147483648.0, bd->has_lo = true, bd->lo_excl = false;
        if (!bd->has_hi || bd->hi > 2147483647.0)
            bd->hi = 2147483647.0, bd->has_hi = true, bd->hi_excl = false;
        return 0;
    }
    if ((integer && !strcmp(f, "int64")) || !strcmp(f, "float") || !strcmp(f, "double"))
        return 0;
    return err_set(c->err, c->errlen, ERR_UNSUPPORTED, "unsupported JSON Schema format '%s' on a %s", f,
                   integer ? "integer" : "number");
}

/* The bounds and format of an integer or number schema s. Without bounds the value is
 * the shared unbounded automaton: *out is set and *done true. */
static int numeric_start(struct sctx *c, const cJSON *s, bool integer, struct bounds *bd, struct gel *out,
                         bool *done)
{
    *done = false;
    int rc = read_bounds(c, s, bd);
    if (!rc)
        rc = numeric_format(c, s, integer, bd);
    if (rc || bd->has_lo || bd->has_hi)
        return rc;
    int *slot = integer ? &c->integer : &c->num;
    if ((rc = lazy_dfa(c, slot, integer ? INTEGER_RE : NUMBER_RE, 0)))
        return rc;
    *out = (struct gel){ GEL_DFA, (uint32_t)*slot };
    *done = true;
    return 0;
}

static int integer_value(struct sctx *c, const cJSON *s, struct gel *out)
{
    struct bounds bd;
    bool done;
    int rc = numeric_start(c, s, true, &bd, out, &done);
    if (rc || done)
        return rc;
    long long lo = -INT_CAP, hi = INT_CAP;
    if (bd.has_lo)
        lo = bd.lo_excl ? (long long)floor(bd.lo) + 1 : (long long)ceil(bd.lo);
    if (bd.has_hi)
        hi = bd.hi_excl ? (long long)ceil(bd.hi) - 1 : (long long)floor(bd.hi);
    if (lo > hi)
        return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: no integer lies between the bounds");
    struct sbuf re = { 0 };
    range_regex(&re, lo, hi);
    if (re.oom) {
        free(re.p);
        return ERR_NOMEM;
    }
    rc = regex_rule(c, re.p, 0, out);
    free(re.p);
    return rc;
}

/* Pieces of the non-negative magnitudes m + f (f fraction digits after '.') within
 * [lo, hi] (integers, each bound inclusive or exclusive), appended with prefix. */
static void number_pieces(struct sbuf *out, const char *prefix, long long lo, bool lo_ex, long long hi, bool hi_ex,
                          bool no_zero)
{
    static const char *const f_any = "(\\.[0-9]{1,16})?", *const f_zero = "(\\.0{1,16})?",
                             *const f_pos = "\\.0{0,15}[1-9][0-9]{0,15}";
    if (hi < 0 || (hi == 0 && hi_ex))
        return;
    /* n with any fraction: n >= lo (+1 when exclusive), n <= hi - 1 */
    long long a = lo < 0 ? 0 : (lo_ex ? lo + 1 : lo), b = hi - 1;
    if (lo < 0)
        a = 0;
    struct sbuf alts = { 0 };
    if (a <= b) {
        long long a2 = a;
        if (no_zero && a == 0) {
            /* -0.x only with a non-zero fraction */
            if (out->n)
                sb_puts(out, "|");
            sb_puts(out, prefix);
            sb_puts(out, "0");
            sb_puts(out, f_pos);
            a2 = 1;
        }
        if (a2 <= b) {
            range_pos(&alts, "", a2, b);
            if (out->n)
                sb_puts(out, "|");
            sb_puts(out, prefix);
            sb_puts(out, "(");
            sb_puts(out, alts.p ? alts.p : "");
            sb_puts(out, ")");
            sb_puts(out, f_any);
        }
    }
    free(alts.p);
    char buf[64];
    /* n == lo with a non-zero fraction when the lower bound is exclusive */
    if (lo >= 0 && lo_ex && lo < hi) {
        snprintf(buf, sizeof buf, "%lld", lo);
        if (out->n)
            sb_puts(out, "|");
        sb_puts(out, prefix);
        sb_puts(out, buf);
        sb_puts(out, f_pos);
    }
    /* n == hi with a zero fraction when the upper bound is inclusive */
    if (!hi_ex && (hi > lo || (hi == lo && !lo_ex) || lo < 0) && !(no_zero && hi == 0)) {
        snprintf(buf, sizeof buf, "%lld", hi);
        if (out->n)
            sb_puts(out, "|");
        sb_puts(out, prefix);
        sb_puts(out, buf);
        sb_puts(out, f_zero);
    }
}

static int number_value(struct sctx *c, const cJSON *s, struct gel *out)
{
    struct bounds bd;
    bool done;
    int rc = numeric_start(c, s, false, &bd, out, &done);
    if (rc || done)
        return rc;
    if ((bd.has_lo && bd.lo != floor(bd.lo)) || (bd.has_hi && bd.hi != floor(bd.hi)))
        return err_set(c->err, c->errlen, ERR_UNSUPPORTED,
                       "unsupported JSON Schema number bound: only integer minimum/maximum values on numbers");
    long long lo = bd.has_lo ? (long long)bd.lo : -INT_CAP - 1, hi = bd.has_hi ? (long long)bd.hi : INT_CAP + 1;
    bool lo_ex = bd.has_lo ? bd.lo_excl : true, hi_ex = bd.has_hi ? bd.hi_excl : true;
    if (lo > hi || (lo == hi && (lo_ex || hi_ex)))
        return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: no number lies between the bounds");
    struct sbuf re = { 0 };
    /* non-negative x in [lo, hi]; negative x: magnitude in [-hi, -lo] */
    number_pieces(&re, "", lo, lo_ex, hi, hi_ex, false);
    if (lo < 0)
        number_pieces(&re, "-", -hi, hi_ex, -lo, lo_ex, true);
    if (re.oom || !re.p) {
        free(re.p);
        return re.oom ? ERR_NOMEM : err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: no number lies between the bounds");
    }
    rc = regex_rule(c, re.p, 0, out);
    free(re.p);
    return rc;
}

/* ---- strings ------------------------------------------------------------------------------- */

static int read_count(struct sctx *c, const cJSON *s, const char *kw, int *v)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, kw);
    if (!x)
        return 0;
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble != floor(x->valuedouble))
        return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: '%s' is not a non-negative integer", kw);
    if (x->valuedouble > GR_MAX_ITEMS)
        return err_set(c->err, c->errlen, ERR_RANGE, "JSON Schema: '%s' above %d", kw, GR_MAX_ITEMS);
    *v = (int)x->valuedouble;
    return 0;
}

static const struct {
    const char *name, *re;
} formats[] = {
    { "date", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])" },
    { "time", "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])" },
    { "date-time", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)"
                   "(\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])" },
    { "email", "[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\\.[A-Za-z0-9-]{1,63}){0,7}\\.[A-Za-z]{2,24}" },
    { "uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}" },
    { "ipv4", "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])" },
};

static int string_value(struct sctx *c, const cJSON *s, struct gel *out)
{
    int mn = 0, mx = -1, rc;
    if ((rc = read_count(c, s, "minLength", &mn)) || (rc = read_count(c, s, "maxLength", &mx)))
        return rc;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    bool has_len = cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength");
    if ((pat || fmt) && has_len)
        return err_set(c->err, c->errlen, ERR_UNSUPPORTED,
                       "unsupported JSON Schema keyword combination: minLength/maxLength with pattern/format");
    if (pat && fmt)
        return err_set(c->err, c->errlen, ERR_UNSUPPORTED, "unsupported JSON Schema keyword combination: pattern with format");
    if (pat || fmt) {
        const char *re = NULL;
        unsigned flags = RX_JSON;
        if (pat) {
            if (!cJSON_IsString(pat))
                return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: 'pattern' is not a string");
            re = pat->valuestring;
            flags |= RX_SEARCH;
        } else {
            if (!cJSON_IsString(fmt))
                return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: 'format' is not a string");
            for (size_t i = 0; i < sizeof formats / sizeof formats[0] && !re; i++)
                if (!strcmp(formats[i].name, fmt->valuestring))
                    re = formats[i].re;
            if (!re)
                return err_set(c->err, c->errlen, ERR_UNSUPPORTED, "unsupported JSON Schema format '%s'", fmt->valuestring);
        }
        int id;
        if ((rc = dfa_of(c, re, flags, &id)))
            return rc;
        return string_with_body(c, id, out);
    }
    if (!has_len)
        return any_string(c, out);
    if (mx >= 0 && mx < mn)
        return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: maxLength below minLength");
    if ((mx >= 0 ? mx : mn) <= GR_LEN_DFA_MAX) {
        /* one DFA: fast masks (one table lookup per trie node) */
        char re[64];
        if (mx >= 0)
            snprintf(re, sizeof re, "[\\s\\S]{%d,%d}", mn, mx);
        else
            snprintf(re, sizeof re, "[\\s\\S]{%d}[\\s\\S]*", mn);
        int id;
        if ((rc = dfa_of(c, re, RX_JSON, &id)))
            return rc;
        return string_with_body(c, id, out);
    }
    /* longer bounds: '"' C^mn then up to (mx - mn) more (or any number), '"'; one rule per
     * count so the automata stay small: len_k ::= C len_{k+1} | ε (k >= mn) */
    if ((rc = lazy_dfa(c, &c->one_char, "[\\s\\S]", RX_JSON)))
        return rc;
    int last = mx >= 0 ? mx : mn;
    int first = c->b->n_rules;
    for (int k = 0; k <= last; k++)
        if ((rc = gb_new_rule(c->b)) < 0)
            return rc;
    struct gseq q = { 0 };
    rc = 0;
    for (int k = 0; k <= last && !rc; k++) {
        int r = first + k;
        q.n = 0;
        if (k >= mn)
            rc = gb_add_alt(c->b, r, &q);
        if (rc || (mx >= 0 && k == mx))
            continue;
        int next = k == last ? r : r + 1;
        q.n = 0;
        rc = gseq_push(&q, GEL_DFA, (uint32_t)c->one_char);
        rc = rc ? rc : gseq_push(&q, GEL_REF, (uint32_t)next);
        rc = rc ? rc : gb_add_alt(c->b, r, &q);
    }
    q.n = 0;
    rc = rc ? rc : push_lit(c, &q, "\"");
    rc = rc ? rc : gseq_push(&q, GEL_REF, (uint32_t)first);
    rc = rc ? rc : push_lit(c, &q, "\"");
    rc = rc ? rc : rule_of(c, &q, out);
    gseq_free(&q);
    return rc;
}

/* ---- objects ---------------------------------------------------------------------------------- */

static int json_string_literal(const char *s, char **out)
{
    cJSON *x = cJSON_CreateString(s);
    if (!x)
        return ERR_NOMEM;
    *out = cJSON_PrintUnformatted(x);
    cJSON_Delete(x);
    return *out ? 0 : ERR_NOMEM;
}

static int object_value(struct sctx *c, const cJSON *s, int depth, struct gel *out)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props))
        return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: 'properties' is not an object");
    if (req && !cJSON_IsArray(req))
        return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: 'required' is not an array");
    /* Default: without "properties" any members; with them, no others (strict). */
    bool extra = addl ? !cJSON_IsFalse(addl) : !props;
    int n_props = 0, rc = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next)
        n_props++;
    /* required names missing from properties become properties with any value */
    int n_req_extra = 0;
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r))
            return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: 'required' holds a non-string");
        if (!props || !cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            n_req_extra++;
    }
    int n = n_props + n_req_extra;
    /* optional properties chain empty alternatives (A_i -> A_i+1): keep the chain within
     * the matcher's closure depth */
    if (n > GR_MAX_PROPERTIES)
        return err_set(c->err, c->errlen, ERR_RANGE, "JSON Schema: more than %d properties in one object", GR_MAX_PROPERTIES);
    const char **names = calloc((size_t)n + 1, sizeof *names);
    const cJSON **schemas = calloc((size_t)n + 1, sizeof *schemas);
    bool *required = calloc((size_t)n + 1, sizeof *required);
    struct gseq s1 = { 0 };
    char *key = NULL;
    struct gdfa names_dfa = { 0 }, key_dfa = { 0 };
    if (!names || !schemas || !required) {
        rc = ERR_NOMEM;
        goto fail;
    }
    {
        int i = 0;
        for (const cJSON *p = props ? props->child : NULL; p; p = p->next, i++) {
            names[i] = p->string;
            schemas[i] = p;
            for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
                if (!strcmp(r->valuestring, p->string))
                    required[i] = true;
        }
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
            if (!props || !cJSON_GetObjectItemCaseSensitive(props, r->valuestring)) {
                names[i] = r->valuestring;
                schemas[i] = NULL;
                required[i++] = true;
            }
    }
    /* kv_i ::= "name" ws ":" ws VALUE ws */
    int *kv = calloc((size_t)n + 2, sizeof *kv);
    if (!kv) {
        rc = ERR_NOMEM;
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        struct gel v;
        if (schemas[i])
            rc = sc_value(c, schemas[i], depth + 1, &v);
        else
            rc = any_value(c, 0, &v);
        if (rc)
            goto fail_kv;
        free(key);
        key = NULL;
        if ((rc = json_string_literal(names[i], &key)))
            goto fail_kv;
        s1.n = 0;
        struct gel kg;
        if ((rc = push_lit(c, &s1, key)) || (rc = push_ws(c, &s1)) || (rc = push_lit(c, &s1, ":")) ||
            (rc = push_ws(c, &s1)) || (rc = gseq_push(&s1, v.kind, v.arg)) || (rc = push_ws(c, &s1)) ||
            (rc = rule_of(c, &s1, &kg)))
            goto fail_kv;
        kv[i] = (int)kg.arg;
    }
    /* the extra member: a key not among the names, then a value */
    int kv_extra = -1, extra_more = -1;
    if (extra) {
        struct gel v;
        if (addl && cJSON_IsObject(addl))
            rc = sc_value(c, addl, depth + 1, &v);
        else
            rc = any_value(c, 0, &v);
        if (rc)
            goto fail_kv;
        /* key DFA: any JSON string body minus the declared names */
        int key_id;
        if (n > 0) {
            struct sbuf alt = { 0 };
            for (int i = 0; i < n; i++) {
                /* regex of the literal name: escape every non-alphanumeric ASCII char */
                if (i)
                    sb_puts(&alt, "|");
                for (const unsigned char *p = (const unsigned char *)names[i]; *p; p++) {
                    char one[8];
                    if ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p >= 0x80)
                        snprintf(one, sizeof one, "%c", *p);
                    else
                        snprintf(one, sizeof one, "\\x%02x", *p);
                    sb_puts(&alt, one);
                }
            }
            if (alt.oom || !alt.p) {
                free(alt.p);
                rc = ERR_NOMEM;
                goto fail_kv;
            }
            struct gdfa any;
            rc = rx_compile("[\\s\\S]*", strlen("[\\s\\S]*"), RX_JSON, &any, c->err, c->errlen);
            if (!rc)
                rc = rx_compile(alt.p, strlen(alt.p), RX_JSON, &names_dfa, c->err, c->errlen);
            free(alt.p);
            if (!rc)
                rc = gdfa_difference(&any, &names_dfa, &key_dfa, c->err, c->errlen);
            gdfa_free(&any);
            if (rc)
                goto fail_kv;
            if ((key_id = gb_add_dfa(c->b, &key_dfa)) < 0) {
                rc = key_id;
                goto fail_kv;
            }
        } else {
            if ((rc = lazy_dfa(c, &c->str_body, "[\\s\\S]*", RX_JSON)))
                goto fail_kv;
            key_id = c->str_body;
        }
        s1.n = 0;
        struct gel kg;
        if ((rc = push_lit(c, &s1, "\"")) || (rc = gseq_push(&s1, GEL_DFA, (uint32_t)key_id)) ||
            (rc = push_lit(c, &s1, "\"")) || (rc = push_ws(c, &s1)) || (rc = push_lit(c, &s1, ":")) ||
            (rc = push_ws(c, &s1)) || (rc = gseq_push(&s1, v.kind, v.arg)) || (rc = push_ws(c, &s1)) ||
            (rc = rule_of(c, &s1, &kg)))
            goto fail_kv;
        kv_extra = (int)kg.arg;
        /* extra_more ::= "," ws kv_extra extra_more | ε */
        if ((extra_more = gb_new_rule(c->b)) < 0) {
            rc = extra_more;
            goto fail_kv;
        }
        s1.n = 0;
        if ((rc = push_lit(c, &s1, ",")) || (rc = push_ws(c, &s1)) || (rc = gseq_push(&s1, GEL_REF, (uint32_t)kv_extra)) ||
            (rc = gseq_push(&s1, GEL_REF, (uint32_t)extra_more)) || (rc = gb_add_alt(c->b, extra_more, &s1)))
            goto fail_kv;
        s1.n = 0;
        if ((rc = gb_add_alt(c->b, extra_more, &s1)))
            goto fail_kv;
    }
    /* A_i: properties i.. after at least one member; B_i: before any member.
     *   B_i ::= kv_i A_{i+1} | B_{i+1} (optional)      B_n ::= ε | kv_extra extra_more
     *   A_i ::= "," ws kv_i A_{i+1} | A_{i+1} (optional)   A_n ::= extra_more | ε */
    int a0 = c->b->n_rules;
    for (int i = 0; i <= 2 * n + 1; i++)
        if ((rc = gb_new_rule(c->b)) < 0)
            goto fail_kv;
    rc = 0;
#define RULE_A(i) (a0 + (i))
#define RULE_B(i) (a0 + n + 1 + (i))
    for (int i = n; i >= 0; i--) {
        if (i == n) {
            s1.n = 0;
            if (extra)
                rc = gseq_push(&s1, GEL_REF, (uint32_t)extra_more);
            rc = rc ? rc : gb_add_alt(c->b, RULE_A(n), &s1);
            s1.n = 0;
            rc = rc ? rc : gb_add_alt(c->b, RULE_B(n), &s1);
            if (!rc && extra) {
                s1.n = 0;
                rc = gseq_push(&s1, GEL_REF, (uint32_t)kv_extra);
                rc = rc ? rc : gseq_push(&s1, GEL_REF, (uint32_t)extra_more);
                rc = rc ? rc : gb_add_alt(c->b, RULE_B(n), &s1);
            }
            if (rc)
                goto fail_kv;
            continue;
        }
        s1.n = 0;
        if ((rc = push_lit(c, &s1, ",")) || (rc = push_ws(c, &s1)) || (rc = gseq_push(&s1, GEL_REF, (uint32_t)kv[i])) ||
            (rc = gseq_push(&s1, GEL_REF, (uint32_t)RULE_A(i + 1))) || (rc = gb_add_alt(c->b, RULE_A(i), &s1)))
            goto fail_kv;
        s1.n = 0;
        if ((rc = gseq_push(&s1, GEL_REF, (uint32_t)kv[i])) || (rc = gseq_push(&s1, GEL_REF, (uint32_t)RULE_A(i + 1))) ||
            (rc = gb_add_alt(c->b, RULE_B(i), &s1)))
            goto fail_kv;
        if (!required[i]) {
            s1.n = 0;
            if ((rc = gseq_push(&s1, GEL_REF, (uint32_t)RULE_A(i + 1))) || (rc = gb_add_alt(c->b, RULE_A(i), &s1)))
                goto fail_kv;
            s1.n = 0;
            if ((rc = gseq_push(&s1, GEL_REF, (uint32_t)RULE_B(i + 1))) || (rc = gb_add_alt(c->b, RULE_B(i), &s1)))
                goto fail_kv;
        }
    }
    s1.n = 0;
    if ((rc = push_lit(c, &s1, "{")) || (rc = push_ws(c, &s1)) || (rc = gseq_push(&s1, GEL_REF, (uint32_t)RULE_B(0))) ||
        (rc = push_lit(c, &s1, "}")) || (rc = rule_of(c, &s1, out)))
        goto fail_kv;
#undef RULE_A
#undef RULE_B
fail_kv:
    free(kv);
fail:
    free(key);
    free(names);
    free(schemas);
    free(required);
    gseq_free(&s1);
    gdfa_free(&names_dfa);
    gdfa_free(&key_dfa);
    return rc;
}

/* ---- arrays ------------------------------------------------------------------------------------ */

static int array_value(struct sctx *c, const cJSON *s, int depth, struct gel *out)
{
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    int mn = 0, mx = -1, rc;
    if ((rc = read_count(c, s, "minItems", &mn)) || (rc = read_count(c, s, "maxItems", &mx)))
        return rc;
    if (mx >= 0 && mx < mn)
        return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: maxItems below minItems");
    if (prefix && !cJSON_IsArray(prefix))
        return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: 'prefixItems' is not an array");
    if (items && cJSON_IsArray(items))
        return err_set(c->err, c->errlen, ERR_UNSUPPORTED, "unsupported JSON Schema keyword form: 'items' as an array (use prefixItems)");
    int np = prefix ? cJSON_GetArraySize(prefix) : 0;
    bool more_allowed = !(items && cJSON_IsFalse(items));
    if (!more_allowed) {
        if (mx < 0 || mx > np)
            mx = np;
        if (mn > np)
            return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: minItems above the prefixItems allowed");
    }
    /* element elements: el[i] for i < np, el_rest for the others */
    struct gel *el = calloc((size_t)np + 1, sizeof *el), rest = { 0 };
    if (!el)
        return ERR_NOMEM;
    for (int i = 0; i < np && !rc; i++)
        rc = sc_value(c, cJSON_GetArrayItem(prefix, i), depth + 1, &el[i]);
    if (!rc && more_allowed)
        rc = items ? sc_value(c, items, depth + 1, &rest) : any_value(c, 0, &rest);
    if (rc) {
        free(el);
        return rc;
    }
    /* L_k (k items so far, k >= 1): "," ws item_k ws L_{k+1} | ε (k >= mn); the last
     * distinct count loops on itself when unbounded. */
    int last = mx >= 0 ? mx : (mn > np + 1 ? mn : np + 1);
    if (last < 1)
        last = 1;
    int first = c->b->n_rules;
    for (int k = 1; k <= last; k++)
        if ((rc = gb_new_rule(c->b)) < 0) {
            free(el);
            return rc;
        }
    rc = 0;
    struct gseq q = { 0 };
    for (int k = 1; k <= last && !rc; k++) {
        int r = first + k - 1;
        q.n = 0;
        if (k >= mn)
            rc = gb_add_alt(c->b, r, &q);
        if (rc || (mx >= 0 && k >= mx))
            continue;
        struct gel item = k < np ? el[k] : rest;
        int next = k == last ? r : r + 1;
        q.n = 0;
        rc = push_lit(c, &q, ",");
        rc = rc ? rc : push_ws(c, &q);
        rc = rc ? rc : gseq_push(&q, item.kind, item.arg);
        rc = rc ? rc : push_ws(c, &q);
        rc = rc ? rc : gseq_push(&q, GEL_REF, (uint32_t)next);
        rc = rc ? rc : gb_add_alt(c->b, r, &q);
    }
    /* body ::= "]" (mn == 0) | item_0 ws L_1 "]" (mx != 0) */
    int body = rc ? -1 : gb_new_rule(c->b);
    if (!rc && body < 0)
        rc = body;
    if (!rc && mn == 0) {
        q.n = 0;
        rc = push_lit(c, &q, "]");
        rc = rc ? rc : gb_add_alt(c->b, body, &q);
    }
    if (!rc && mx != 0) {
        struct gel item = np > 0 ? el[0] : rest;
        q.n = 0;
        rc = gseq_push(&q, item.kind, item.arg);
        rc = rc ? rc : push_ws(c, &q);
        rc = rc ? rc : gseq_push(&q, GEL_REF, (uint32_t)first);
        rc = rc ? rc : push_lit(c, &q, "]");
        rc = rc ? rc : gb_add_alt(c->b, body, &q);
    }
    if (!rc) {
        q.n = 0;
        rc = push_lit(c, &q, "[");
        rc = rc ? rc : push_ws(c, &q);
        rc = rc ? rc : gseq_push(&q, GEL_REF, (uint32_t)body);
        rc = rc ? rc : rule_of(c, &q, out);
    }
    gseq_free(&q);
    free(el);
    return rc;
}

/* ---- dispatch ------------------------------------------------------------------------------------ */

static int ref_value(struct sctx *c, const char *ref, struct gel *out)
{
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].name, ref)) {
            *out = (struct gel){ GEL_REF, (uint32_t)c->refs[i].rule };
            return 0;
        }
    const cJSON *target = NULL;
    if (!strcmp(ref, "#")) {
        target = c->root;
    } else if (!strncmp(ref, "#/$defs/", 8) || !strncmp(ref, "#/definitions/", 14)) {
        const char *name = ref + (ref[2] == '$' ? 8 : 14);
        const cJSON *defs = cJSON_GetObjectItemCaseSensitive(c->root, ref[2] == '$' ? "$defs" : "definitions");
        if (strchr(name, '/'))
            return err_set(c->err, c->errlen, ERR_UNSUPPORTED, "unsupported JSON Schema $ref '%s'", ref);
        target = defs ? cJSON_GetObjectItemCaseSensitive(defs, name) : NULL;
        if (!target)
            return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: $ref '%s' not found", ref);
    } else {
        return err_set(c->err, c->errlen, ERR_UNSUPPORTED, "unsupported JSON Schema $ref '%s' (only #/$defs/... and #/definitions/...)", ref);
    }
    int r = gb_new_rule(c->b);
    if (r < 0)
        return r;
    if (!grow_array((void **)&c->refs, &c->refs_cap, (size_t)c->n_refs + 1, sizeof *c->refs))
        return ERR_NOMEM;
    size_t rl = strlen(ref) + 1;
    if (!(c->refs[c->n_refs].name = malloc(rl)))
        return ERR_NOMEM;
    memcpy(c->refs[c->n_refs].name, ref, rl);
    c->refs[c->n_refs++].rule = r;
    struct gel v;
    int rc = sc_value(c, target, 1, &v);
    if (rc)
        return rc;
    struct gseq q = { 0 };
    rc = gseq_push(&q, v.kind, v.arg);
    rc = rc ? rc : gb_add_alt(c->b, r, &q);
    gseq_free(&q);
    *out = (struct gel){ GEL_REF, (uint32_t)r };
    return rc;
}

static int type_value(struct sctx *c, const cJSON *s, const char *type, int depth, struct gel *out)
{
    struct gseq q = { 0 };
    int rc;
    if (!strcmp(type, "string"))
        return string_value(c, s, out);
    if (!strcmp(type, "integer"))
        return integer_value(c, s, out);
    if (!strcmp(type, "number"))
        return number_value(c, s, out);
    if (!strcmp(type, "object"))
        return object_value(c, s, depth, out);
    if (!strcmp(type, "array"))
        return array_value(c, s, depth, out);
    if (!strcmp(type, "boolean")) {
        int r = gb_new_rule(c->b);
        if (r < 0)
            return r;
        rc = push_lit(c, &q, "true");
        rc = rc ? rc : gb_add_alt(c->b, r, &q);
        q.n = 0;
        rc = rc ? rc : push_lit(c, &q, "false");
        rc = rc ? rc : gb_add_alt(c->b, r, &q);
        gseq_free(&q);
        *out = (struct gel){ GEL_REF, (uint32_t)r };
        return rc;
    }
    if (!strcmp(type, "null")) {
        rc = push_lit(c, &q, "null");
        rc = rc ? rc : rule_of(c, &q, out);
        gseq_free(&q);
        return rc;
    }
    return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: unknown type '%s'", type);
}

/* A rule whose alternatives are the members of list (anyOf / oneOf). */
static int any_of(struct sctx *c, const cJSON *list, int depth, struct gel *out)
{
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0)
        return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: anyOf/oneOf is not a non-empty array");
    int r = gb_new_rule(c->b), rc = 0;
    if (r < 0)
        return r;
    struct gseq q = { 0 };
    for (const cJSON *m = list->child; m && !rc; m = m->next) {
        struct gel v;
        if ((rc = sc_value(c, m, depth + 1, &v)))
            break;
        q.n = 0;
        rc = gseq_push(&q, v.kind, v.arg);
        rc = rc ? rc : gb_add_alt(c->b, r, &q);
    }
    gseq_free(&q);
    *out = (struct gel){ GEL_REF, (uint32_t)r };
    return rc;
}

static bool has_any(const cJSON *s, const char *const *kws)
{
    for (int i = 0; kws[i]; i++)
        if (cJSON_GetObjectItemCaseSensitive(s, kws[i]))
            return true;
    return false;
}

static int sc_value(struct sctx *c, const cJSON *s, int depth, struct gel *out)
{
    int rc, nk = 0;
    if (depth > GR_MAX_DEPTH)
        return err_set(c->err, c->errlen, ERR_RANGE, "JSON Schema nested deeper than %d", GR_MAX_DEPTH);
    if (cJSON_IsTrue(s))
        return any_value(c, 0, out);
    if (cJSON_IsFalse(s))
        return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: 'false' matches nothing");
    if (!cJSON_IsObject(s))
        return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: a schema is not an object");
    if ((rc = check_keywords(c, s, &nk)))
        return rc;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    int n_combinators = !!ref + !!any + !!one + !!all;
    if (n_combinators > 1 || (n_combinators == 1 && nk > 1))
        return err_set(c->err, c->errlen, ERR_UNSUPPORTED,
                       "unsupported JSON Schema keyword combination: $ref/anyOf/oneOf/allOf beside other constraints");
    if (ref) {
        if (!cJSON_IsString(ref))
            return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: $ref is not a string");
        return ref_value(c, ref->valuestring, out);
    }
    if (any || one)
        return any_of(c, any ? any : one, depth, out);
    if (all) {
        if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) != 1)
            return err_set(c->err, c->errlen, ERR_UNSUPPORTED, "unsupported JSON Schema keyword 'allOf' with other than one schema");
        return sc_value(c, all->child, depth + 1, out);
    }
    if (cst || en) {
        /* the literal(s), checked against "type" when given */
        int r = gb_new_rule(c->b);
        if (r < 0)
            return r;
        struct gseq q = { 0 };
        rc = 0;
        if (cst) {
            rc = literal_value(c, cst, &q);
            rc = rc ? rc : gb_add_alt(c->b, r, &q);
        } else {
            if (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0)
                rc = err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: 'enum' is not a non-empty array");
            for (const cJSON *e = rc ? NULL : en->child; e && !rc; e = e->next) {
                q.n = 0;
                rc = literal_value(c, e, &q);
                rc = rc ? rc : gb_add_alt(c->b, r, &q);
            }
        }
        gseq_free(&q);
        *out = (struct gel){ GEL_REF, (uint32_t)r };
        return rc;
    }
    if (type) {
        if (cJSON_IsString(type))
            return type_value(c, s, type->valuestring, depth, out);
        if (!cJSON_IsArray(type) || cJSON_GetArraySize(type) == 0)
            return err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: 'type' is not a string or a non-empty array");
        int r = gb_new_rule(c->b);
        if (r < 0)
            return r;
        struct gseq q = { 0 };
        rc = 0;
        for (const cJSON *t = type->child; t && !rc; t = t->next) {
            struct gel v;
            if (!cJSON_IsString(t)) {
                rc = err_set(c->err, c->errlen, ERR_INVALID, "JSON Schema: 'type' holds a non-string");
                break;
            }
            if ((rc = type_value(c, s, t->valuestring, depth, &v)))
                break;
            q.n = 0;
            rc = gseq_push(&q, v.kind, v.arg);
            rc = rc ? rc : gb_add_alt(c->b, r, &q);
        }
        gseq_free(&q);
        *out = (struct gel){ GEL_REF, (uint32_t)r };
        return rc;
    }
    /* no type: inferred from the keywords present */
    static const char *const obj_kw[] = { "properties", "required", "additionalProperties", NULL };
    static const char *const arr_kw[] = { "items", "prefixItems", "minItems", "maxItems", NULL };
    static const char *const str_kw[] = { "minLength", "maxLength", "pattern", "format", NULL };
    static const char *const num_kw[] = { "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL };
    if (has_any(s, obj_kw))
        return object_value(c, s, depth, out);
    if (has_any(s, arr_kw))
        return array_value(c, s, depth, out);
    if (has_any(s, str_kw))
        return string_value(c, s, out);
    if (has_any(s, num_kw))
        return number_value(c, s, out);
    return any_value(c, 0, out);
}

static void sctx_init(struct sctx *c, struct gbuild *b)
{
    memset(c, 0, sizeof *c);
    c->b = b;
    c->ws = c->str_body = c->num = c->integer = c->one_char = c->str_rule = -1;
    for (int i = 0; i <= GR_ANY_DEPTH; i++)
        c->any_value[i] = -1;
    c->err = b->err;
    c->errlen = b->errlen;
}

static void sctx_free(struct sctx *c)
{
    for (int i = 0; i < c->n_refs; i++)
        free(c->refs[i].name);
    free(c->refs);
}

int sc_compile_schema(struct gbuild *b, const char *text, size_t len, struct gel *out)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!root) {
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        return err_set(b->err, b->errlen, ERR_INVALID, "JSON Schema is not valid JSON (near offset %zu)", at);
    }
    struct sctx c;
    sctx_init(&c, b);
    c.root = root;
    int rc = sc_value(&c, root, 0, out);
    sctx_free(&c);
    cJSON_Delete(root);
    return rc;
}

int sc_compile_any_object(struct gbuild *b, struct gel *out)
{
    struct sctx c;
    sctx_init(&c, b);
    cJSON *obj = cJSON_CreateObject();
    if (!obj)
        return ERR_NOMEM;
    c.root = obj;
    int rc = object_value(&c, obj, 0, out);
    sctx_free(&c);
    cJSON_Delete(obj);
    return rc;
}

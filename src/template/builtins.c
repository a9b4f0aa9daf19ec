/* builtins.c — the filters (`x|trim`, `x|tojson(indent=4)`, ...) and the argument
 * binding and Python string helpers that filters, tests, globals and methods share.
 *
 * Filters are declared once in a const table (name → function); the parser resolves
 * names through it, so an unknown filter is a parse error. Semantics follow jinja2 3.1's
 * filters.py (generators become lists) with transformers' tojson. Case mapping uses
 * utf8proc's simple mappings (Python uses full mappings: 'ß'.upper() is 'SS' there).
 * Tests are in predicates.c, globals in globals.c, methods in methods.c.
 */
#include "template/jinja_internal.h"
#include "util/err.h"
#include "util/utf8.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>


#define NOPOS ((size_t)-1)

/* ---- arguments ------------------------------------------------------------------- */

bool jargs_get(struct jargs *a, size_t pos, const char *name, struct jv *out)
{
    if (pos != NOPOS && pos < a->npos) {
        *out = a->pos[pos];
        return true;
    }
    size_t n = strlen(name);
    for (size_t i = 0; i < a->nkw && i < 32; i++)
        if (a->kwl[i] == n && !memcmp(a->kwn[i], name, n)) {
            a->used |= 1u << i;
            *out = a->kwv[i];
            return true;
        }
    return false;
}

int jargs_done(struct jrender *r, struct jargs *a, size_t max, const char *fn)
{
    if (a->npos > max) return jr_fail(r, "%s() takes at most %zu positional argument(s) (%zu given)", fn, max, a->npos);
    for (size_t i = 0; i < a->nkw; i++)
        if (i >= 32 || !(a->used & (1u << i)))
            return jr_fail(r, "%s() got an unexpected keyword argument '%.*s'", fn, (int)a->kwl[i], a->kwn[i]);
    return 0;
}

int jinja_want_str(struct jrender *r, struct jv v, const char *what)
{
    if (v.type != JV_STRING) return jr_fail(r, "%s must be a string, not '%s'", what, jv_type_name(v));
    return 0;
}

int jinja_want_int(struct jrender *r, struct jv v, const char *what, int64_t *out)
{
    if (v.type == JV_INT) *out = v.i;
    else if (v.type == JV_BOOL) *out = v.b;
    else return jr_fail(r, "%s must be an integer, not '%s'", what, jv_type_name(v));
    return 0;
}

int jinja_mklist(struct jrender *r, struct jv_list *l, struct jv *out)
{
    if (!l) return jr_oom(r);
    out->type = JV_LIST;
    out->l = l;
    return 0;
}

int jinja_str_from_buf(struct jrender *r, struct jbuf *b, struct jv *out)
{
    int rc = 0;
    if (b->oom) rc = jr_oom(r);
    else {
        char *s = jarena_strdup(&r->arena, b->p ? b->p : "", b->n);
        if (!s) rc = jr_oom(r);
        else *out = jv_str(s, b->n);
    }
    jbuf_free(b);
    return rc;
}

/* ---- string helpers (code points, Python semantics) ------------------------------- */

uint32_t jinja_cp_upper(uint32_t c) { return c > 0x10ffff ? c : (uint32_t)utf8proc_toupper((utf8proc_int32_t)c); }
uint32_t jinja_cp_lower(uint32_t c) { return c > 0x10ffff ? c : (uint32_t)utf8proc_tolower((utf8proc_int32_t)c); }
static uint32_t cp_title(uint32_t c) { return c > 0x10ffff ? c : (uint32_t)utf8proc_totitle((utf8proc_int32_t)c); }
int jinja_cp_cat(uint32_t c) { return c > 0x10ffff ? 0 : utf8proc_category((utf8proc_int32_t)c); }
bool jinja_cp_cased(uint32_t c)
{
    int k = jinja_cp_cat(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}
bool jinja_cp_alpha(uint32_t c) { int k = jinja_cp_cat(c); return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO; }
bool jinja_cp_digit(uint32_t c) { return jinja_cp_cat(c) == UTF8PROC_CATEGORY_ND; }
bool jinja_cp_alnum(uint32_t c) { int k = jinja_cp_cat(c); return jinja_cp_alpha(c) || (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO); }

static void put_cp(struct jbuf *b, uint32_t c)
{
    char tmp[4];
    jbuf_put(b, tmp, (size_t)utf8_encode(c, tmp));
}

/* mode 0: map all; 1: capitalize; 2: str.title(); 3: jinja title filter */
int jinja_case_map(struct jrender *r, struct jv s, jinja_cp_map map, int mode, struct jv *out)
{
    struct jbuf b = { 0 };
    const char *p = s.s.p, *end = p + s.s.n;
    bool first = true, prev_cased = false;
    while (p < end) {
        int l;
        uint32_t c = jinja_utf8_dec(p, end, &l), o;
        if (mode == 0) o = map(c);
        else if (mode == 1) o = first ? cp_title(c) : jinja_cp_lower(c);
        else if (mode == 2) {
            o = prev_cased ? jinja_cp_lower(c) : cp_title(c);
            prev_cased = jinja_cp_cased(c);
        } else {
            o = first ? jinja_cp_upper(c) : jinja_cp_lower(c);
        }
        if (mode == 3) first = jinja_is_space(c) || (c < 0x80 && strchr("-({[<", (int)c) != NULL);
        else first = false;
        put_cp(&b, o);
        p += l;
    }
    return jinja_str_from_buf(r, &b, out);
}

static bool in_chars(uint32_t c, const struct jv *chars)
{
    if (!chars) return jinja_is_space(c);
    const char *p = chars->s.p, *end = p + chars->s.n;
    while (p < end) {
        int l;
        if (jinja_utf8_dec(p, end, &l) == c) return true;
        p += l;
    }
    return false;
}

/* Python str.strip/lstrip/rstrip (which: 1 left, 2 right, 3 both) */
struct jv jinja_strip(struct jv s, const struct jv *chars, int which)
{
    const char *p = s.s.p, *end = p + s.s.n;
    if (which & 1)
        while (p < end) {
            int l;
            uint32_t c = jinja_utf8_dec(p, end, &l);
            if (!in_chars(c, chars)) break;
            p += l;
        }
    if (which & 2)
        while (end > p) {
            const char *q = end - 1;
            while (q > p && ((unsigned char)*q & 0xc0) == 0x80) q--;
            int l;
            uint32_t c = jinja_utf8_dec(q, end, &l);
            if (q + l != end) q = end - 1, c = (unsigned char)*q;
            if (!in_chars(c, chars)) break;
            end = q;
        }
    return jv_str(p, (size_t)(end - p));
}

const char *jinja_find_bytes(const char *h, size_t hn, const char *n, size_t nn)
{
    if (nn == 0) return h;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == n[0] && !memcmp(h + i, n, nn)) return h + i;
    return NULL;
}

const char *jinja_rfind_bytes(const char *h, size_t hn, const char *n, size_t nn)
{
    if (nn > hn) return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (!memcmp(h + i, n, nn)) return h + i;
    return NULL;
}

int jinja_replace(struct jrender *r, struct jv s, struct jv old, struct jv new, int64_t count, struct jv *out)
{
    struct jbuf b = { 0 };
    const char *p = s.s.p, *end = p + s.s.n;
    if (old.s.n == 0) {
        int64_t done = 0;
        while (count < 0 || done < count) {
            jbuf_put(&b, new.s.p, new.s.n);
            done++;
            if (p >= end) break;
            int l;
            jinja_utf8_dec(p, end, &l);
            jbuf_put(&b, p, (size_t)l);
            p += l;
        }
        jbuf_put(&b, p, (size_t)(end - p));
        return jinja_str_from_buf(r, &b, out);
    }
    int64_t done = 0;
    while (count < 0 || done < count) {
        const char *q = jinja_find_bytes(p, (size_t)(end - p), old.s.p, old.s.n);
        if (!q) break;
        jbuf_put(&b, p, (size_t)(q - p));
        jbuf_put(&b, new.s.p, new.s.n);
        p = q + old.s.n;
        done++;
    }
    jbuf_put(&b, p, (size_t)(end - p));
    return jinja_str_from_buf(r, &b, out);
}

int jinja_split(struct jrender *r, struct jv s, const struct jv *sep, int64_t maxsplit, bool from_right, struct jv *out)
{
    struct jv_list *l = jv_list_new(r, 0);
    if (!l) return jr_oom(r);
    const char *p = s.s.p, *end = p + s.s.n;
    if (sep) {
        if (sep->s.n == 0) return jr_fail(r, "empty separator");
        if (from_right) {
            struct jv_list *rev = jv_list_new(r, 0);
            if (!rev) return jr_oom(r);
            int64_t done = 0;
            while (maxsplit < 0 || done < maxsplit) {
                const char *q = jinja_rfind_bytes(p, (size_t)(end - p), sep->s.p, sep->s.n);
                if (!q) break;
                TRY(jv_list_push(r, rev, jv_str(q + sep->s.n, (size_t)(end - q - sep->s.n))));
                end = q;
                done++;
            }
            TRY(jv_list_push(r, l, jv_str(p, (size_t)(end - p))));
            for (size_t i = rev->n; i-- > 0;) TRY(jv_list_push(r, l, rev->v[i]));
            return jinja_mklist(r, l, out);
        }
        int64_t done = 0;
        while (maxsplit < 0 || done < maxsplit) {
            const char *q = jinja_find_bytes(p, (size_t)(end - p), sep->s.p, sep->s.n);
            if (!q) break;
            TRY(jv_list_push(r, l, jv_str(p, (size_t)(q - p))));
            p = q + sep->s.n;
            done++;
        }
        TRY(jv_list_push(r, l, jv_str(p, (size_t)(end - p))));
        return jinja_mklist(r, l, out);
    }
    /* whitespace runs; rsplit with maxsplit differs only in where the rest is kept */
    struct jv_list *words = jv_list_new(r, 0);
    if (!words) return jr_oom(r);
    while (p < end) {
        int len;
        uint32_t c = jinja_utf8_dec(p, end, &len);
        if (jinja_is_space(c)) {
            p += len;
            continue;
        }
        const char *w = p;
        while (p < end) {
            c = jinja_utf8_dec(p, end, &len);
            if (jinja_is_space(c)) break;
            p += len;
        }
        TRY(jv_list_push(r, words, jv_str(w, (size_t)(p - w))));
    }
    if (maxsplit < 0 || (uint64_t)maxsplit >= words->n) return jinja_mklist(r, words, out);
    /* join the remainder back using the original text */
    if (!from_right) {
        for (int64_t i = 0; i < maxsplit; i++) TRY(jv_list_push(r, l, words->v[i]));
        const char *rest = words->v[maxsplit].s.p;
        struct jv tail = jinja_strip(jv_str(rest, (size_t)(s.s.p + s.s.n - rest)), NULL, 2);
        TRY(jv_list_push(r, l, tail));
    } else {
        size_t first = words->n - (size_t)maxsplit;
        const char *stop = words->v[first - 1].s.p + words->v[first - 1].s.n;
        struct jv head = jinja_strip(jv_str(s.s.p, (size_t)(stop - s.s.p)), NULL, 1);
        TRY(jv_list_push(r, l, head));
        for (size_t i = first; i < words->n; i++) TRY(jv_list_push(r, l, words->v[i]));
    }
    return jinja_mklist(r, l, out);
}

static bool is_line_break(uint32_t c)
{
    return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
           c == 0x85 || c == 0x2028 || c == 0x2029;
}

int jinja_splitlines(struct jrender *r, struct jv s, bool keepends, struct jv_list **out)
{
    struct jv_list *l = jv_list_new(r, 0);
    if (!l) return jr_oom(r);
    const char *p = s.s.p, *end = p + s.s.n, *start = p;
    while (p < end) {
        int len;
        uint32_t c = jinja_utf8_dec(p, end, &len);
        if (!is_line_break(c)) {
            p += len;
            continue;
        }
        const char *eol = p + len;
        if (c == '\r' && eol < end && *eol == '\n') eol++;
        TRY(jv_list_push(r, l, jv_str(start, (size_t)((keepends ? eol : p) - start))));
        p = start = eol;
    }
    if (start < end) TRY(jv_list_push(r, l, jv_str(start, (size_t)(end - start))));
    *out = l;
    return 0;
}

/* ---- attribute getter (jinja2 make_attrgetter) --------------------------------------- */

static int get_path(struct jrender *r, struct jv item, struct jv attr, struct jv *out)
{
    if (attr.type != JV_STRING) return jinja_getitem(r, item, attr, out);
    const char *p = attr.s.p, *end = p + attr.s.n;
    for (;;) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        const char *e = dot ? dot : end;
        struct jv key = jv_str(p, (size_t)(e - p));
        bool digits = e > p;
        for (const char *q = p; q < e; q++)
            if (*q < '0' || *q > '9') digits = false;
        if (digits && e - p < 18) key = jv_int(strtoll(p, NULL, 10));
        TRY(jinja_getitem(r, item, key, &item));
        if (!dot) break;
        p = dot + 1;
    }
    *out = item;
    return 0;
}

static int lower_key(struct jrender *r, struct jv v, bool case_sensitive, struct jv *out)
{
    if (!case_sensitive && v.type == JV_STRING) return jinja_case_map(r, v, jinja_cp_lower, 0, out);
    *out = v;
    return 0;
}

/* Stable merge sort of keys[] carrying vals[] along; errors from jv_compare propagate. */
static int sort_pairs(struct jrender *r, struct jv *keys, struct jv *vals, size_t n, bool reverse)
{
    if (n < 2) return 0;
    struct jv *tk = jarena_alloc(&r->arena, n * sizeof *tk), *tv = jarena_alloc(&r->arena, n * sizeof *tv);
    if (!tk || !tv) return jr_oom(r);
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int c;
                TRY(jv_compare(r, keys[j], keys[i], &c));
                bool take_right = reverse ? c > 0 : c < 0;
                if (take_right) tk[k] = keys[j], tv[k++] = vals[j++];
                else tk[k] = keys[i], tv[k++] = vals[i++];
            }
            while (i < mid) tk[k] = keys[i], tv[k++] = vals[i++];
            while (j < hi) tk[k] = keys[j], tv[k++] = vals[j++];
        }
        memcpy(keys, tk, n * sizeof *keys);
        memcpy(vals, tv, n * sizeof *vals);
    }
    return 0;
}

/* ---- filters ------------------------------------------------------------------------- */

#define FILTER(name) static int name(struct jrender *r, struct jv in, struct jargs *a, struct jv *out)

static int to_s(struct jrender *r, struct jv v, struct jv *out) { return jv_stringify(r, v, out); }

FILTER(f_trim)
{
    struct jv chars, s;
    bool has = jargs_get(a, 0, "chars", &chars) && chars.type != JV_NONE;
    TRY(jargs_done(r, a, 1, "trim"));
    if (has) TRY(jinja_want_str(r, chars, "trim() chars"));
    TRY(to_s(r, in, &s));
    *out = jinja_strip(s, has ? &chars : NULL, 3);
    return 0;
}

FILTER(f_length)
{
    int64_t n;
    TRY(jargs_done(r, a, 0, "length"));
    TRY(jv_len(r, in, &n));
    *out = jv_int(n);
    return 0;
}

static int f_case(struct jrender *r, struct jv in, struct jargs *a, struct jv *out, jinja_cp_map map, int mode, const char *nm)
{
    struct jv s;
    TRY(jargs_done(r, a, 0, nm));
    TRY(to_s(r, in, &s));
    return jinja_case_map(r, s, map, mode, out);
}
FILTER(f_upper) { return f_case(r, in, a, out, jinja_cp_upper, 0, "upper"); }
FILTER(f_lower) { return f_case(r, in, a, out, jinja_cp_lower, 0, "lower"); }
FILTER(f_capitalize) { return f_case(r, in, a, out, NULL, 1, "capitalize"); }
FILTER(f_title) { return f_case(r, in, a, out, NULL, 3, "title"); }

FILTER(f_replace)
{
    struct jv old, new, cnt, s;
    int64_t count = -1;
    if (!jargs_get(a, 0, "old", &old) || !jargs_get(a, 1, "new", &new)) return jr_fail(r, "jinja_replace() needs old and new");
    if (jargs_get(a, 2, "count", &cnt) && cnt.type != JV_NONE) TRY(jinja_want_int(r, cnt, "jinja_replace() count", &count));
    TRY(jargs_done(r, a, 3, "replace"));
    TRY(to_s(r, in, &s));
    TRY(to_s(r, old, &old));
    TRY(to_s(r, new, &new));
    return jinja_replace(r, s, old, new, count, out);
}

FILTER(f_default)
{
    struct jv def = jv_str("", 0), boolean = jv_bool(false);
    jargs_get(a, 0, "default_value", &def);
    jargs_get(a, 1, "boolean", &boolean);
    TRY(jargs_done(r, a, 2, "default"));
    bool use = in.type == JV_UNDEFINED || (jv_truthy(boolean) && !jv_truthy(in));
    *out = use ? def : in;
    return 0;
}

FILTER(f_tojson)
{
    struct jv ascii = jv_bool(false), indent = jv_none(), seps = jv_none(), sortk = jv_bool(false);
    jargs_get(a, 0, "ensure_ascii", &ascii);
    jargs_get(a, 1, "indent", &indent);
    jargs_get(a, 2, "separators", &seps);
    jargs_get(a, 3, "sort_keys", &sortk);
    TRY(jargs_done(r, a, 4, "tojson"));
    char ind[64];
    const char *indp = NULL;
    if (indent.type == JV_INT || indent.type == JV_BOOL) {
        int64_t n = indent.type == JV_INT ? indent.i : indent.b;
        if (n > 32) return jr_fail(r, "tojson() indent larger than 32 is not supported");
        if (n < 0) n = 0;
        memset(ind, ' ', (size_t)n);
        ind[n] = 0;
        indp = ind;
    } else if (indent.type == JV_STRING) {
        snprintf(ind, sizeof ind, "%.*s", (int)(indent.s.n > 63 ? 63 : indent.s.n), indent.s.p);
        indp = ind;
    } else if (indent.type != JV_NONE) {
        return jr_fail(r, "tojson() indent must be an int or a string");
    }
    char isep[64], ksep[64];
    snprintf(isep, sizeof isep, "%s", indp ? "," : ", ");
    snprintf(ksep, sizeof ksep, ": ");
    if (seps.type == JV_LIST) {
        if (seps.l->n != 2 || seps.l->v[0].type != JV_STRING || seps.l->v[1].type != JV_STRING)
            return jr_fail(r, "tojson() separators must be a pair of strings");
        snprintf(isep, sizeof isep, "%.*s", (int)(seps.l->v[0].s.n > 63 ? 63 : seps.l->v[0].s.n), seps.l->v[0].s.p);
        snprintf(ksep, sizeof ksep, "%.*s", (int)(seps.l->v[1].s.n > 63 ? 63 : seps.l->v[1].s.n), seps.l->v[1].s.p);
    } else if (seps.type != JV_NONE) {
        return jr_fail(r, "tojson() separators must be a pair of strings");
    }
    struct jbuf b = { 0 };
    int rc = jinja_tojson(r, &b, in, indp, isep, ksep, jv_truthy(sortk), jv_truthy(ascii));
    if (rc) {
        jbuf_free(&b);
        return rc;
    }
    return jinja_str_from_buf(r, &b, out);
}

FILTER(f_join)
{
    struct jv sep = jv_str("", 0), attr;
    jargs_get(a, 0, "d", &sep);
    bool has_attr = jargs_get(a, 1, "attribute", &attr);
    TRY(jargs_done(r, a, 2, "join"));
    TRY(to_s(r, sep, &sep));
    struct jv_list *l;
    TRY(jv_iterate(r, in, &l));
    struct jbuf b = { 0 };
    for (size_t i = 0; i < l->n; i++) {
        struct jv item = l->v[i];
        if (i) jbuf_put(&b, sep.s.p, sep.s.n);
        int rc = has_attr ? get_path(r, item, attr, &item) : 0;
        if (!rc) rc = jv_to_str(r, &b, item);
        if (rc) {
            jbuf_free(&b);
            return rc;
        }
    }
    return jinja_str_from_buf(r, &b, out);
}

FILTER(f_first)
{
    struct jv_list *l;
    TRY(jargs_done(r, a, 0, "first"));
    TRY(jv_iterate(r, in, &l));
    *out = l->n ? l->v[0] : jv_undef_hint(r, "No first item, sequence was empty.");
    return 0;
}

FILTER(f_last)
{
    struct jv_list *l;
    TRY(jargs_done(r, a, 0, "last"));
    TRY(jv_iterate(r, in, &l));
    *out = l->n ? l->v[l->n - 1] : jv_undef_hint(r, "No last item, sequence was empty.");
    return 0;
}

FILTER(f_list)
{
    struct jv_list *l, *c;
    TRY(jargs_done(r, a, 0, "list"));
    TRY(jv_iterate(r, in, &l));
    c = jv_list_new(r, l->n);
    if (!c) return jr_oom(r);
    for (size_t i = 0; i < l->n; i++) c->v[i] = l->v[i];
    c->n = l->n;
    return jinja_mklist(r, c, out);
}

FILTER(f_string)
{
    TRY(jargs_done(r, a, 0, "string"));
    return to_s(r, in, out);
}

/* Python int(str): optional sign, digits with single underscores, surrounding spaces. */
static bool parse_py_int(struct jv s, int base, int64_t *out)
{
    struct jv t = jinja_strip(s, NULL, 3);
    char buf[80];
    size_t n = 0;
    const char *p = t.s.p, *end = p + t.s.n;
    if (p < end && (*p == '+' || *p == '-')) buf[n++] = *p++;
    if (p >= end) return false;
    for (; p < end && n < sizeof buf - 1; p++) {
        if (*p == '_' && p + 1 < end && p > t.s.p && p[-1] != '_' && isalnum((unsigned char)p[-1])) continue;
        if (!isalnum((unsigned char)*p)) return false;
        buf[n++] = *p;
    }
    if (p < end) return false;
    buf[n] = 0;
    char *e;
    errno = 0;
    long long v = strtoll(buf, &e, base);
    if (*e || errno || e == buf) return false;
    *out = v;
    return true;
}

static bool parse_py_float(struct jv s, double *out)
{
    struct jv t = jinja_strip(s, NULL, 3);
    char buf[128];
    if (t.s.n == 0 || t.s.n >= sizeof buf) return false;
    size_t n = 0;
    for (size_t i = 0; i < t.s.n; i++)
        if (t.s.p[i] != '_') buf[n++] = t.s.p[i];
    buf[n] = 0;
    if (strpbrk(buf, "xXpP")) return false; /* C accepts hex floats, Python does not */
    char *e;
    double v = strtod(buf, &e);
    if (*e || e == buf) return false;
    *out = v;
    return true;
}

FILTER(f_int)
{
    struct jv def = jv_int(0), basev = jv_int(10);
    jargs_get(a, 0, "default", &def);
    jargs_get(a, 1, "base", &basev);
    TRY(jargs_done(r, a, 2, "int"));
    int64_t base = 10, iv;
    TRY(jinja_want_int(r, basev, "int() base", &base));
    if (base < 2 || base > 36) return jr_fail(r, "int() base must be >= 2 and <= 36");
    double d;
    switch (in.type) {
    case JV_INT: *out = in; return 0;
    case JV_BOOL: *out = jv_int(in.b); return 0;
    case JV_FLOAT:
        if (!isfinite(in.f)) return jr_fail(r, "cannot convert float %s to integer", isnan(in.f) ? "NaN" : "infinity");
        if (fabs(in.f) >= 9.2e18) return jr_fail(r, "int() result outside the supported 64-bit range");
        *out = jv_int((int64_t)in.f);
        return 0;
    case JV_STRING:
        if (parse_py_int(in, (int)base, &iv)) *out = jv_int(iv);
        else if (parse_py_float(in, &d) && isfinite(d) && fabs(d) < 9.2e18) *out = jv_int((int64_t)d);
        else *out = def;
        return 0;
    default: *out = def; return 0;
    }
}

FILTER(f_float)
{
    struct jv def = jv_float(0.0);
    jargs_get(a, 0, "default", &def);
    TRY(jargs_done(r, a, 1, "float"));
    double d;
    if (in.type == JV_FLOAT) *out = in;
    else if (in.type == JV_INT || in.type == JV_BOOL) *out = jv_float(in.type == JV_INT ? (double)in.i : in.b);
    else if (in.type == JV_STRING && parse_py_float(in, &d)) *out = jv_float(d);
    else *out = def;
    return 0;
}

FILTER(f_round)
{
    struct jv precv = jv_int(0), method = jv_str("common", 6);
    jargs_get(a, 0, "precision", &precv);
    jargs_get(a, 1, "method", &method);
    TRY(jargs_done(r, a, 2, "round"));
    int64_t prec = 0;
    TRY(jinja_want_int(r, precv, "round() precision", &prec));
    TRY(jinja_want_str(r, method, "round() method"));
    bool common = method.s.n == 6 && !memcmp(method.s.p, "common", 6);
    bool ceil_m = method.s.n == 4 && !memcmp(method.s.p, "ceil", 4);
    bool floor_m = method.s.n == 5 && !memcmp(method.s.p, "floor", 5);
    if (!common && !ceil_m && !floor_m) return jr_fail(r, "method must be common, ceil or floor");
    if (in.type != JV_INT && in.type != JV_BOOL && in.type != JV_FLOAT)
        return jr_fail(r, "type %s doesn't define __round__ method", jv_type_name(in));
    if (prec < -300 || prec > 300) return jr_fail(r, "round() precision out of range");
    if (common && in.type != JV_FLOAT && prec >= 0) {
        *out = jv_int(in.type == JV_INT ? in.i : in.b);
        return 0;
    }
    double x = in.type == JV_FLOAT ? in.f : in.type == JV_INT ? (double)in.i : in.b;
    if (common) {
        if (!isfinite(x)) {
            *out = jv_float(x);
            return 0;
        }
        if (prec >= 0) {
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, x); /* correctly rounded, ties to even */
            *out = jv_float(strtod(buf, NULL));
        } else {
            double p10 = pow(10.0, (double)-prec);
            *out = jv_float(nearbyint(x / p10) * p10);
        }
        if (in.type != JV_FLOAT) *out = jv_int((int64_t)out->f);
        return 0;
    }
    double p10 = pow(10.0, (double)prec);
    *out = jv_float((ceil_m ? ceil(x * p10) : floor(x * p10)) / p10);
    return 0;
}

FILTER(f_abs)
{
    TRY(jargs_done(r, a, 0, "abs"));
    if (in.type == JV_FLOAT) *out = jv_float(fabs(in.f));
    else if (in.type == JV_INT) {
        if (in.i == INT64_MIN) return jr_fail(r, "abs() result outside the supported 64-bit range");
        *out = jv_int(in.i < 0 ? -in.i : in.i);
    } else if (in.type == JV_BOOL) *out = jv_int(in.b);
    else return jr_fail(r, "bad operand type for abs(): '%s'", jv_type_name(in));
    return 0;
}

static int pair(struct jrender *r, struct jv k, struct jv v, struct jv *out)
{
    struct jv_list *t = jv_list_new(r, 2);
    if (!t) return jr_oom(r);
    t->v[0] = k;
    t->v[1] = v;
    t->n = 2;
    t->tuple = true;
    return jinja_mklist(r, t, out);
}

int jinja_dict_items(struct jrender *r, struct jv d, struct jv *out)
{
    struct jv_list *l = jv_list_new(r, d.d->n);
    if (!l) return jr_oom(r);
    for (size_t i = 0; i < d.d->n; i++) TRY(pair(r, d.d->k[i], d.d->v[i], &l->v[i]));
    l->n = d.d->n;
    return jinja_mklist(r, l, out);
}

FILTER(f_items)
{
    TRY(jargs_done(r, a, 0, "items"));
    if (in.type == JV_UNDEFINED) return jinja_mklist(r, jv_list_new(r, 0), out);
    if (in.type != JV_DICT) return jr_fail(r, "Can only get item pairs from a mapping.");
    return jinja_dict_items(r, in, out);
}

FILTER(f_dictsort)
{
    struct jv cs = jv_bool(false), by = jv_str("key", 3), rev = jv_bool(false);
    jargs_get(a, 0, "case_sensitive", &cs);
    jargs_get(a, 1, "by", &by);
    jargs_get(a, 2, "reverse", &rev);
    TRY(jargs_done(r, a, 3, "dictsort"));
    if (in.type != JV_DICT) return jr_fail(r, "dictsort() needs a mapping");
    TRY(jinja_want_str(r, by, "dictsort() by"));
    int pos = by.s.n == 3 && !memcmp(by.s.p, "key", 3) ? 0 : by.s.n == 5 && !memcmp(by.s.p, "value", 5) ? 1 : -1;
    if (pos < 0) return jr_fail(r, "You can only sort by either \"key\" or \"value\"");
    struct jv items;
    TRY(jinja_dict_items(r, in, &items));
    size_t n = items.l->n;
    struct jv *keys = jarena_alloc(&r->arena, (n + 1) * sizeof *keys);
    if (!keys) return jr_oom(r);
    for (size_t i = 0; i < n; i++) TRY(lower_key(r, items.l->v[i].l->v[pos], jv_truthy(cs), &keys[i]));
    TRY(sort_pairs(r, keys, items.l->v, n, jv_truthy(rev)));
    *out = items;
    return 0;
}

/* select/reject/selectattr/rejectattr: attr_mode takes an attribute first; keep = select */
static int select_common(struct jrender *r, struct jv in, struct jargs *a, struct jv *out, bool attr_mode, bool keep)
{
    size_t base = attr_mode ? 1 : 0;
    struct jv attr = jv_none();
    if (attr_mode && (a->npos < 1 || a->pos[0].type != JV_STRING)) return jr_fail(r, "selectattr/rejectattr need an attribute name");
    if (attr_mode) attr = a->pos[0];
    int test = -1;
    if (a->npos > base) {
        if (a->pos[base].type != JV_STRING) return jr_fail(r, "test name must be a string");
        test = jinja_test_id(a->pos[base].s.p, a->pos[base].s.n);
        if (test < 0) return jr_fail(r, "no test named '%.*s'", (int)a->pos[base].s.n, a->pos[base].s.p);
    }
    if (a->nkw) return jr_fail(r, "unexpected keyword argument to select/reject filters");
    struct jargs targs = { 0 };
    if (a->npos > base + 1) {
        targs.pos = a->pos + base + 1;
        targs.npos = a->npos - base - 1;
    }
    struct jv_list *l;
    TRY(jv_iterate(r, in, &l));
    struct jv_list *res = jv_list_new(r, 0);
    if (!res) return jr_oom(r);
    for (size_t i = 0; i < l->n; i++) {
        struct jv v = l->v[i];
        if (attr_mode) TRY(get_path(r, v, attr, &v));
        bool ok;
        if (test >= 0) {
            targs.used = 0;
            TRY(jinja_call_test(r, test, v, &targs, &ok));
        } else {
            ok = jv_truthy(v);
        }
        if (ok == keep) TRY(jv_list_push(r, res, l->v[i]));
    }
    return jinja_mklist(r, res, out);
}
FILTER(f_select) { return select_common(r, in, a, out, false, true); }
FILTER(f_reject) { return select_common(r, in, a, out, false, false); }
FILTER(f_selectattr) { return select_common(r, in, a, out, true, true); }
FILTER(f_rejectattr) { return select_common(r, in, a, out, true, false); }

FILTER(f_map)
{
    struct jv attr, def = jv_undef();
    bool has_attr = jargs_get(a, NOPOS, "attribute", &attr);
    bool has_def = jargs_get(a, NOPOS, "default", &def);
    struct jv_list *l;
    TRY(jv_iterate(r, in, &l));
    struct jv_list *res = jv_list_new(r, l->n);
    if (!res) return jr_oom(r);
    if (has_attr) {
        TRY(jargs_done(r, a, 0, "map"));
        for (size_t i = 0; i < l->n; i++) {
            struct jv v;
            TRY(get_path(r, l->v[i], attr, &v));
            if (v.type == JV_UNDEFINED && has_def) v = def;
            res->v[res->n++] = v;
        }
        return jinja_mklist(r, res, out);
    }
    if (a->npos < 1 || a->pos[0].type != JV_STRING) return jr_fail(r, "map() needs a filter name or attribute=");
    int id = jinja_filter_id(a->pos[0].s.p, a->pos[0].s.n);
    if (id < 0) return jr_fail(r, "no filter named '%.*s'", (int)a->pos[0].s.n, a->pos[0].s.p);
    struct jargs fa = *a;
    fa.pos = a->pos + 1;
    fa.npos = a->npos - 1;
    for (size_t i = 0; i < l->n; i++) {
        fa.used = 0;
        TRY(jinja_call_filter(r, id, l->v[i], &fa, &res->v[res->n]));
        res->n++;
    }
    return jinja_mklist(r, res, out);
}

FILTER(f_unique)
{
    struct jv cs = jv_bool(false), attr;
    jargs_get(a, 0, "case_sensitive", &cs);
    bool has_attr = jargs_get(a, 1, "attribute", &attr);
    TRY(jargs_done(r, a, 2, "unique"));
    struct jv_list *l;
    TRY(jv_iterate(r, in, &l));
    struct jv_list *res = jv_list_new(r, 0), *seen = jv_list_new(r, 0);
    if (!res || !seen) return jr_oom(r);
    for (size_t i = 0; i < l->n; i++) {
        struct jv key = l->v[i];
        if (has_attr) TRY(get_path(r, key, attr, &key));
        TRY(lower_key(r, key, jv_truthy(cs), &key));
        bool dup = false;
        for (size_t k = 0; k < seen->n && !dup; k++) dup = jv_equal(seen->v[k], key);
        if (dup) continue;
        TRY(jv_list_push(r, seen, key));
        TRY(jv_list_push(r, res, l->v[i]));
    }
    return jinja_mklist(r, res, out);
}

FILTER(f_reverse)
{
    TRY(jargs_done(r, a, 0, "reverse"));
    if (in.type == JV_STRING) {
        struct jv_list *chars;
        TRY(jv_iterate(r, in, &chars));
        struct jbuf b = { 0 };
        for (size_t i = chars->n; i-- > 0;) jbuf_put(&b, chars->v[i].s.p, chars->v[i].s.n);
        return jinja_str_from_buf(r, &b, out);
    }
    struct jv_list *l;
    TRY(jv_iterate(r, in, &l));
    struct jv_list *res = jv_list_new(r, l->n);
    if (!res) return jr_oom(r);
    for (size_t i = l->n; i-- > 0;) res->v[res->n++] = l->v[i];
    return jinja_mklist(r, res, out);
}

FILTER(f_sort)
{
    struct jv rev = jv_bool(false), cs = jv_bool(false), attr;
    jargs_get(a, 0, "reverse", &rev);
    jargs_get(a, 1, "case_sensitive", &cs);
    bool has_attr = jargs_get(a, 2, "attribute", &attr);
    TRY(jargs_done(r, a, 3, "sort"));
    struct jv_list *l;
    TRY(jv_iterate(r, in, &l));
    struct jv_list *res = jv_list_new(r, l->n);
    struct jv *keys = jarena_alloc(&r->arena, (l->n + 1) * sizeof *keys);
    if (!res || !keys) return jr_oom(r);
    for (size_t i = 0; i < l->n; i++) {
        struct jv k = l->v[i];
        if (has_attr) TRY(get_path(r, k, attr, &k));
        TRY(lower_key(r, k, jv_truthy(cs), &keys[i]));
        res->v[i] = l->v[i];
    }
    res->n = l->n;
    TRY(sort_pairs(r, keys, res->v, res->n, jv_truthy(rev)));
    return jinja_mklist(r, res, out);
}

static int minmax(struct jrender *r, struct jv in, struct jargs *a, struct jv *out, bool want_max)
{
    struct jv cs = jv_bool(false), attr;
    jargs_get(a, 0, "case_sensitive", &cs);
    bool has_attr = jargs_get(a, 1, "attribute", &attr);
    TRY(jargs_done(r, a, 2, want_max ? "max" : "min"));
    struct jv_list *l;
    TRY(jv_iterate(r, in, &l));
    if (!l->n) {
        *out = jv_undef_hint(r, "No aggregated item, sequence was empty.");
        return 0;
    }
    size_t best = 0;
    struct jv bestk;
    for (size_t i = 0; i < l->n; i++) {
        struct jv k = l->v[i];
        if (has_attr) TRY(get_path(r, k, attr, &k));
        TRY(lower_key(r, k, jv_truthy(cs), &k));
        if (i == 0) {
            bestk = k;
            continue;
        }
        int c;
        TRY(jv_compare(r, k, bestk, &c));
        if (want_max ? c > 0 : c < 0) {
            best = i;
            bestk = k;
        }
    }
    *out = l->v[best];
    return 0;
}
FILTER(f_min) { return minmax(r, in, a, out, false); }
FILTER(f_max) { return minmax(r, in, a, out, true); }

/* Python + on two values, via the evaluator's rules (numbers / strings / lists). */
static int py_add(struct jrender *r, struct jv x, struct jv y, struct jv *out)
{
    if ((x.type == JV_INT || x.type == JV_BOOL) && (y.type == JV_INT || y.type == JV_BOOL)) {
        int64_t s;
        if (__builtin_add_overflow(x.type == JV_INT ? x.i : x.b, y.type == JV_INT ? y.i : y.b, &s))
            return jr_fail(r, "sum() result outside the supported 64-bit range");
        *out = jv_int(s);
        return 0;
    }
    if ((x.type == JV_INT || x.type == JV_BOOL || x.type == JV_FLOAT) && (y.type == JV_INT || y.type == JV_BOOL || y.type == JV_FLOAT)) {
        double fx = x.type == JV_FLOAT ? x.f : x.type == JV_INT ? (double)x.i : x.b;
        double fy = y.type == JV_FLOAT ? y.f : y.type == JV_INT ? (double)y.i : y.b;
        *out = jv_float(fx + fy);
        return 0;
    }
    return jr_fail(r, "unsupported operand type(s) for +: '%s' and '%s'", jv_type_name(x), jv_type_name(y));
}

FILTER(f_sum)
{
    struct jv attr, start = jv_int(0);
    bool has_attr = jargs_get(a, 0, "attribute", &attr);
    jargs_get(a, 1, "start", &start);
    TRY(jargs_done(r, a, 2, "sum"));
    struct jv_list *l;
    TRY(jv_iterate(r, in, &l));
    struct jv acc = start;
    for (size_t i = 0; i < l->n; i++) {
        struct jv v = l->v[i];
        if (has_attr) TRY(get_path(r, v, attr, &v));
        TRY(py_add(r, acc, v, &acc));
    }
    *out = acc;
    return 0;
}

FILTER(f_attr)
{
    struct jv name;
    if (!jargs_get(a, 0, "name", &name)) return jr_fail(r, "attr() needs a name");
    TRY(jargs_done(r, a, 1, "attr"));
    TRY(jinja_want_str(r, name, "attr() name"));
    if (in.type == JV_UNDEFINED) return jr_undefined(r, in);
    int id = jinja_method_id(name.s.p, name.s.n);
    if (id >= 0 && jinja_has_method(in, id)) return jinja_getattr(r, in, name.s.p, name.s.n, out);
    if (in.type == JV_NAMESPACE || in.type == JV_LOOP) return jinja_getattr(r, in, name.s.p, name.s.n, out);
    *out = jv_undef_attr(r, in, name.s.p, name.s.n);
    return 0;
}

FILTER(f_escape)
{
    struct jv s;
    TRY(jargs_done(r, a, 0, "escape"));
    TRY(to_s(r, in, &s));
    struct jbuf b = { 0 };
    for (size_t i = 0; i < s.s.n; i++) {
        char c = s.s.p[i];
        if (c == '&') jbuf_puts(&b, "&amp;");
        else if (c == '<') jbuf_puts(&b, "&lt;");
        else if (c == '>') jbuf_puts(&b, "&gt;");
        else if (c == '"') jbuf_puts(&b, "&#34;");
        else if (c == '\'') jbuf_puts(&b, "&#39;");
        else jbuf_putc(&b, c);
    }
    return jinja_str_from_buf(r, &b, out);
}

FILTER(f_safe)
{
    TRY(jargs_done(r, a, 0, "safe"));
    return to_s(r, in, out);
}

FILTER(f_indent)
{
    struct jv width = jv_int(4), first = jv_bool(false), blank = jv_bool(false), s;
    jargs_get(a, 0, "width", &width);
    jargs_get(a, 1, "first", &first);
    jargs_get(a, 2, "blank", &blank);
    TRY(jargs_done(r, a, 3, "indent"));
    struct jv ind;
    if (width.type == JV_STRING) ind = width;
    else {
        int64_t w = 0;
        TRY(jinja_want_int(r, width, "indent() width", &w));
        if (w > 1024) return jr_fail(r, "indent() width too large");
        if (w < 0) w = 0;
        char *p = jarena_alloc(&r->arena, (size_t)w + 1);
        if (!p) return jr_oom(r);
        memset(p, ' ', (size_t)w);
        ind = jv_str(p, (size_t)w);
    }
    TRY(to_s(r, in, &s));
    /* s += "\n"; then jinja_splitlines() — the quirk jinja2 relies on */
    struct jbuf tmp = { 0 };
    jbuf_put(&tmp, s.s.p, s.s.n);
    jbuf_putc(&tmp, '\n');
    struct jv s2;
    TRY(jinja_str_from_buf(r, &tmp, &s2));
    struct jv_list *lines;
    TRY(jinja_splitlines(r, s2, false, &lines));
    struct jbuf b = { 0 };
    if (jv_truthy(first)) jbuf_put(&b, ind.s.p, ind.s.n);
    for (size_t i = 0; i < lines->n; i++) {
        struct jv ln = lines->v[i];
        if (i) {
            jbuf_putc(&b, '\n');
            if (jv_truthy(blank) || ln.s.n) jbuf_put(&b, ind.s.p, ind.s.n);
        }
        jbuf_put(&b, ln.s.p, ln.s.n);
    }
    return jinja_str_from_buf(r, &b, out);
}

FILTER(f_center)
{
    struct jv width = jv_int(80), s;
    jargs_get(a, 0, "width", &width);
    TRY(jargs_done(r, a, 1, "center"));
    int64_t w = 0;
    TRY(jinja_want_int(r, width, "center() width", &w));
    TRY(to_s(r, in, &s));
    int64_t len = (int64_t)jinja_utf8_count(s.s.p, s.s.n);
    if (w > 1 << 20) return jr_fail(r, "center() width too large");
    if (w <= len) {
        *out = s;
        return 0;
    }
    int64_t marg = w - len, left = marg / 2 + (marg & w & 1);
    struct jbuf b = { 0 };
    for (int64_t i = 0; i < left; i++) jbuf_putc(&b, ' ');
    jbuf_put(&b, s.s.p, s.s.n);
    for (int64_t i = 0; i < marg - left; i++) jbuf_putc(&b, ' ');
    return jinja_str_from_buf(r, &b, out);
}

FILTER(f_wordcount)
{
    struct jv s;
    TRY(jargs_done(r, a, 0, "wordcount"));
    TRY(to_s(r, in, &s));
    int64_t n = 0;
    bool in_word = false;
    const char *p = s.s.p, *end = p + s.s.n;
    while (p < end) {
        int l;
        uint32_t c = jinja_utf8_dec(p, end, &l);
        bool w = c == '_' || jinja_cp_alnum(c);
        if (w && !in_word) n++;
        in_word = w;
        p += l;
    }
    *out = jv_int(n);
    return 0;
}

static const struct {
    const char *name;
    jinja_filter_fn fn;
} filters[] = {
    { "abs", f_abs }, { "attr", f_attr }, { "capitalize", f_capitalize }, { "center", f_center },
    { "count", f_length }, { "d", f_default }, { "default", f_default }, { "dictsort", f_dictsort },
    { "e", f_escape }, { "escape", f_escape }, { "first", f_first }, { "float", f_float },
    { "indent", f_indent }, { "int", f_int }, { "items", f_items }, { "join", f_join },
    { "last", f_last }, { "length", f_length }, { "list", f_list }, { "lower", f_lower },
    { "map", f_map }, { "max", f_max }, { "min", f_min }, { "reject", f_reject },
    { "rejectattr", f_rejectattr }, { "replace", f_replace }, { "reverse", f_reverse },
    { "round", f_round }, { "safe", f_safe }, { "select", f_select }, { "selectattr", f_selectattr },
    { "sort", f_sort }, { "string", f_string }, { "sum", f_sum }, { "title", f_title },
    { "tojson", f_tojson }, { "trim", f_trim }, { "unique", f_unique }, { "upper", f_upper },
    { "wordcount", f_wordcount },
};


int jinja_filter_id(const char *name, size_t n) { NAME_LOOKUP(filters, name, n); }

int jinja_call_filter(struct jrender *r, int id, struct jv in, struct jargs *a, struct jv *out)
{
    return filters[id].fn(r, in, a, out);
}

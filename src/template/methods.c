/* methods.c — Python methods callable from templates: str (strip, split, startswith,
 * replace, format, ...), dict (items, keys, values, get), list (index, count) and
 * loop.cycle. One const table maps a name to the receiver types that have it; the
 * parser rejects method names absent from it. Methods that mutate (list.append,
 * dict.update, ...) are absent, as in jinja2's ImmutableSandboxedEnvironment.
 */
#include "template/jinja_internal.h"

#include <stdio.h>
#include <string.h>


enum { M_STR = 1, M_DICT = 2, M_LIST = 4, M_LOOP = 8 };

#define METHOD(name) static int name(struct jrender *r, struct jv self, struct jargs *a, struct jv *out)

static int opt_chars(struct jrender *r, struct jargs *a, const char *fn, struct jv *chars, bool *has)
{
    *has = jargs_get(a, 0, "chars", chars) && chars->type != JV_NONE;
    TRY(jargs_done(r, a, 1, fn));
    if (*has) TRY(jinja_want_str(r, *chars, "strip chars"));
    return 0;
}

static int strip_m(struct jrender *r, struct jv self, struct jargs *a, struct jv *out, int which, const char *fn)
{
    struct jv chars;
    bool has;
    TRY(opt_chars(r, a, fn, &chars, &has));
    *out = jinja_strip(self, has ? &chars : NULL, which);
    return 0;
}
METHOD(m_strip) { return strip_m(r, self, a, out, 3, "strip"); }
METHOD(m_lstrip) { return strip_m(r, self, a, out, 1, "lstrip"); }
METHOD(m_rstrip) { return strip_m(r, self, a, out, 2, "rstrip"); }

static int split_m(struct jrender *r, struct jv self, struct jargs *a, struct jv *out, bool right)
{
    struct jv sep = jv_none(), maxv = jv_int(-1);
    jargs_get(a, 0, "sep", &sep);
    jargs_get(a, 1, "maxsplit", &maxv);
    TRY(jargs_done(r, a, 2, right ? "rsplit" : "split"));
    int64_t maxsplit;
    TRY(jinja_want_int(r, maxv, "maxsplit", &maxsplit));
    if (sep.type != JV_NONE) TRY(jinja_want_str(r, sep, "split separator"));
    return jinja_split(r, self, sep.type == JV_NONE ? NULL : &sep, maxsplit, right, out);
}
METHOD(m_split) { return split_m(r, self, a, out, false); }
METHOD(m_rsplit) { return split_m(r, self, a, out, true); }

METHOD(m_splitlines)
{
    struct jv keep = jv_bool(false);
    jargs_get(a, 0, "keepends", &keep);
    TRY(jargs_done(r, a, 1, "splitlines"));
    struct jv_list *l;
    TRY(jinja_splitlines(r, self, jv_truthy(keep), &l));
    return jinja_mklist(r, l, out);
}

static int affix(struct jrender *r, struct jv self, struct jargs *a, struct jv *out, bool end)
{
    struct jv x;
    if (!jargs_get(a, 0, end ? "suffix" : "prefix", &x)) return jr_fail(r, "%s() takes at least 1 argument", end ? "endswith" : "startswith");
    TRY(jargs_done(r, a, 1, end ? "endswith" : "startswith"));
    size_t n = x.type == JV_LIST && x.l->tuple ? x.l->n : 1;
    for (size_t i = 0; i < n; i++) {
        struct jv p = x.type == JV_LIST && x.l->tuple ? x.l->v[i] : x;
        if (p.type != JV_STRING)
            return jr_fail(r, "%s first arg must be str or a tuple of str, not %s", end ? "endswith" : "startswith", jv_type_name(p));
        if (p.s.n <= self.s.n && !memcmp(self.s.p + (end ? self.s.n - p.s.n : 0), p.s.p, p.s.n)) {
            *out = jv_bool(true);
            return 0;
        }
    }
    *out = jv_bool(false);
    return 0;
}
METHOD(m_startswith) { return affix(r, self, a, out, false); }
METHOD(m_endswith) { return affix(r, self, a, out, true); }

static int case_m(struct jrender *r, struct jv self, struct jargs *a, struct jv *out, jinja_cp_map map, int mode, const char *fn)
{
    TRY(jargs_done(r, a, 0, fn));
    return jinja_case_map(r, self, map, mode, out);
}
METHOD(m_upper) { return case_m(r, self, a, out, jinja_cp_upper, 0, "upper"); }
METHOD(m_lower) { return case_m(r, self, a, out, jinja_cp_lower, 0, "lower"); }
METHOD(m_title) { return case_m(r, self, a, out, NULL, 2, "title"); }
METHOD(m_capitalize) { return case_m(r, self, a, out, NULL, 1, "capitalize"); }

METHOD(m_replace)
{
    struct jv old, new, cnt = jv_int(-1);
    if (!jargs_get(a, 0, "old", &old) || !jargs_get(a, 1, "new", &new)) return jr_fail(r, "replace() takes at least 2 arguments");
    jargs_get(a, 2, "count", &cnt);
    TRY(jargs_done(r, a, 3, "replace"));
    int64_t count;
    TRY(jinja_want_str(r, old, "replace() argument 1"));
    TRY(jinja_want_str(r, new, "replace() argument 2"));
    TRY(jinja_want_int(r, cnt, "replace() count", &count));
    return jinja_replace(r, self, old, new, count, out);
}

static int find_m(struct jrender *r, struct jv self, struct jargs *a, struct jv *out, bool right, bool raise)
{
    struct jv sub;
    if (!jargs_get(a, 0, "sub", &sub)) return jr_fail(r, "find() takes at least 1 argument");
    TRY(jargs_done(r, a, 1, "find"));
    TRY(jinja_want_str(r, sub, "find() argument"));
    const char *p = right ? jinja_rfind_bytes(self.s.p, self.s.n, sub.s.p, sub.s.n)
                          : jinja_find_bytes(self.s.p, self.s.n, sub.s.p, sub.s.n);
    if (right && !p && sub.s.n == 0) p = self.s.p + self.s.n;
    if (!p && raise) return jr_fail(r, "substring not found");
    *out = jv_int(p ? (int64_t)jinja_utf8_count(self.s.p, (size_t)(p - self.s.p)) : -1);
    return 0;
}
METHOD(m_find) { return find_m(r, self, a, out, false, false); }
METHOD(m_rfind) { return find_m(r, self, a, out, true, false); }

METHOD(m_index)
{
    if (self.type == JV_STRING) return find_m(r, self, a, out, false, true);
    struct jv x;
    if (!jargs_get(a, 0, "value", &x)) return jr_fail(r, "index() takes at least 1 argument");
    TRY(jargs_done(r, a, 1, "index"));
    for (size_t i = 0; i < self.l->n; i++)
        if (jv_equal(self.l->v[i], x)) {
            *out = jv_int((int64_t)i);
            return 0;
        }
    return jr_fail(r, "value is not in list");
}

METHOD(m_count)
{
    struct jv x;
    if (!jargs_get(a, 0, "value", &x)) return jr_fail(r, "count() takes exactly one argument");
    TRY(jargs_done(r, a, 1, "count"));
    int64_t n = 0;
    if (self.type == JV_LIST) {
        for (size_t i = 0; i < self.l->n; i++) n += jv_equal(self.l->v[i], x);
    } else {
        TRY(jinja_want_str(r, x, "count() argument"));
        if (x.s.n == 0) n = (int64_t)jinja_utf8_count(self.s.p, self.s.n) + 1;
        else
            for (const char *p = self.s.p, *end = p + self.s.n;;) {
                const char *q = jinja_find_bytes(p, (size_t)(end - p), x.s.p, x.s.n);
                if (!q) break;
                n++;
                p = q + x.s.n;
            }
    }
    *out = jv_int(n);
    return 0;
}

METHOD(m_join)
{
    struct jv it;
    if (!jargs_get(a, 0, "iterable", &it)) return jr_fail(r, "join() takes exactly one argument");
    TRY(jargs_done(r, a, 1, "join"));
    struct jv_list *l;
    TRY(jv_iterate(r, it, &l));
    struct jbuf b = { 0 };
    for (size_t i = 0; i < l->n; i++) {
        if (l->v[i].type != JV_STRING) {
            jbuf_free(&b);
            return jr_fail(r, "sequence item %zu: expected str instance, %s found", i, jv_type_name(l->v[i]));
        }
        if (i) jbuf_put(&b, self.s.p, self.s.n);
        jbuf_put(&b, l->v[i].s.p, l->v[i].s.n);
    }
    return jinja_str_from_buf(r, &b, out);
}

static int classify(struct jrender *r, struct jv self, struct jargs *a, struct jv *out, int kind)
{
    TRY(jargs_done(r, a, 0, "is*"));
    bool ok = self.s.n > 0, cased = false, has_lower = false, has_upper = false;
    const char *p = self.s.p, *end = p + self.s.n;
    while (p < end) {
        int l;
        uint32_t c = jinja_utf8_dec(p, end, &l);
        int cat = jinja_cp_cat(c);
        switch (kind) {
        case 0: ok = ok && jinja_cp_digit(c); break;
        case 1: ok = ok && jinja_cp_alpha(c); break;
        case 2: ok = ok && jinja_cp_alnum(c); break;
        case 3: ok = ok && jinja_is_space(c); break;
        default:
            if (jinja_cp_cased(c)) cased = true;
            if (cat == 2 /* Ll */) has_lower = true;
            if (cat == 1 /* Lu */ || cat == 3 /* Lt */) has_upper = true;
        }
        p += l;
    }
    if (kind == 4) ok = cased && !has_lower;
    if (kind == 5) ok = cased && !has_upper;
    *out = jv_bool(ok);
    return 0;
}
METHOD(m_isdigit) { return classify(r, self, a, out, 0); }
METHOD(m_isalpha) { return classify(r, self, a, out, 1); }
METHOD(m_isalnum) { return classify(r, self, a, out, 2); }
METHOD(m_isspace) { return classify(r, self, a, out, 3); }
METHOD(m_isupper) { return classify(r, self, a, out, 4); }
METHOD(m_islower) { return classify(r, self, a, out, 5); }

static int affix_remove(struct jrender *r, struct jv self, struct jargs *a, struct jv *out, bool end)
{
    struct jv x;
    if (!jargs_get(a, 0, end ? "suffix" : "prefix", &x)) return jr_fail(r, "removeprefix/removesuffix take one argument");
    TRY(jargs_done(r, a, 1, end ? "removesuffix" : "removeprefix"));
    TRY(jinja_want_str(r, x, "argument"));
    *out = self;
    if (x.s.n && x.s.n <= self.s.n && !memcmp(self.s.p + (end ? self.s.n - x.s.n : 0), x.s.p, x.s.n))
        *out = jv_str(self.s.p + (end ? 0 : x.s.n), self.s.n - x.s.n);
    return 0;
}
METHOD(m_removeprefix) { return affix_remove(r, self, a, out, false); }
METHOD(m_removesuffix) { return affix_remove(r, self, a, out, true); }

/* str.format with {} / {0} / {name} fields, {{ and }} escapes and !s / !r conversions;
 * format specs (":...") are not supported. */
METHOD(m_format)
{
    struct jbuf b = { 0 };
    size_t auto_idx = 0;
    const char *p = self.s.p, *end = p + self.s.n;
    int rc = 0;
    while (p < end && !rc) {
        if (*p == '{' && p + 1 < end && p[1] == '{') { jbuf_putc(&b, '{'); p += 2; continue; }
        if (*p == '}' && p + 1 < end && p[1] == '}') { jbuf_putc(&b, '}'); p += 2; continue; }
        if (*p == '}') { rc = jr_fail(r, "Single '}' encountered in format string"); break; }
        if (*p != '{') { jbuf_putc(&b, *p++); continue; }
        const char *q = memchr(p, '}', (size_t)(end - p));
        if (!q) { rc = jr_fail(r, "Single '{' encountered in format string"); break; }
        const char *f = p + 1, *fe = q, *conv = memchr(f, '!', (size_t)(fe - f));
        if (memchr(f, ':', (size_t)(fe - f))) { rc = jr_fail(r, "unsupported construct: format spec in str.format()"); break; }
        if (conv) fe = conv;
        struct jv v;
        bool found;
        if (fe == f) found = jargs_get(a, auto_idx++, "\x01", &v);
        else if (*f >= '0' && *f <= '9') {
            size_t idx = 0;
            for (const char *d = f; d < fe; d++) idx = idx * 10 + (size_t)(*d - '0');
            found = idx < a->npos && (v = a->pos[idx], true);
        } else {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(fe - f > 63 ? 63 : fe - f), f);
            found = jargs_get(a, (size_t)-1, name, &v);
        }
        if (!found) { rc = jr_fail(r, "format field '%.*s' has no argument", (int)(q - p - 1), p + 1); break; }
        rc = conv && conv + 1 < q && conv[1] == 'r' ? jv_repr(r, &b, v, 0) : jv_to_str(r, &b, v);
        p = q + 1;
    }
    if (rc) {
        jbuf_free(&b);
        return rc;
    }
    a->used = ~0u;
    return jinja_str_from_buf(r, &b, out);
}

METHOD(m_items)
{
    TRY(jargs_done(r, a, 0, "items"));
    return jinja_dict_items(r, self, out);
}

static int keys_values(struct jrender *r, struct jv self, struct jargs *a, struct jv *out, bool values)
{
    TRY(jargs_done(r, a, 0, values ? "values" : "keys"));
    struct jv_list *l = jv_list_new(r, self.d->n);
    if (!l) return jr_oom(r);
    for (size_t i = 0; i < self.d->n; i++) l->v[i] = values ? self.d->v[i] : self.d->k[i];
    l->n = self.d->n;
    return jinja_mklist(r, l, out);
}
METHOD(m_keys) { return keys_values(r, self, a, out, false); }
METHOD(m_values) { return keys_values(r, self, a, out, true); }

METHOD(m_get)
{
    struct jv key, def = jv_none();
    if (!jargs_get(a, 0, "key", &key)) return jr_fail(r, "get expected at least 1 argument, got 0");
    jargs_get(a, 1, "default", &def);
    TRY(jargs_done(r, a, 2, "get"));
    struct jv *v = jv_dict_get(self.d, key);
    *out = v ? *v : def;
    return 0;
}

METHOD(m_cycle)
{
    if (a->npos == 0) return jr_fail(r, "no items for cycling given");
    TRY(jargs_done(r, a, a->npos, "cycle"));
    *out = a->pos[self.loop->index0 % a->npos];
    return 0;
}

static const struct {
    const char *name;
    int types;
    int (*fn)(struct jrender *, struct jv, struct jargs *, struct jv *);
} methods[] = {
    { "strip", M_STR, m_strip }, { "lstrip", M_STR, m_lstrip }, { "rstrip", M_STR, m_rstrip },
    { "split", M_STR, m_split }, { "rsplit", M_STR, m_rsplit }, { "splitlines", M_STR, m_splitlines },
    { "startswith", M_STR, m_startswith }, { "endswith", M_STR, m_endswith },
    { "upper", M_STR, m_upper }, { "lower", M_STR, m_lower }, { "title", M_STR, m_title },
    { "capitalize", M_STR, m_capitalize }, { "replace", M_STR, m_replace },
    { "find", M_STR, m_find }, { "rfind", M_STR, m_rfind }, { "index", M_STR | M_LIST, m_index },
    { "count", M_STR | M_LIST, m_count }, { "join", M_STR, m_join },
    { "isdigit", M_STR, m_isdigit }, { "isalpha", M_STR, m_isalpha }, { "isalnum", M_STR, m_isalnum },
    { "isspace", M_STR, m_isspace }, { "isupper", M_STR, m_isupper }, { "islower", M_STR, m_islower },
    { "removeprefix", M_STR, m_removeprefix }, { "removesuffix", M_STR, m_removesuffix },
    { "format", M_STR, m_format },
    { "items", M_DICT, m_items }, { "keys", M_DICT, m_keys }, { "values", M_DICT, m_values },
    { "get", M_DICT, m_get }, { "cycle", M_LOOP, m_cycle },
};

int jinja_method_id(const char *name, size_t n)
{
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (strlen(methods[i].name) == n && !memcmp(methods[i].name, name, n)) return (int)i;
    return -1;
}

bool jinja_has_method(struct jv obj, int id)
{
    int t = obj.type == JV_STRING ? M_STR : obj.type == JV_DICT ? M_DICT : obj.type == JV_LIST ? M_LIST
          : obj.type == JV_LOOP ? M_LOOP : 0;
    return id >= 0 && (methods[id].types & t) != 0;
}

int jinja_call_method(struct jrender *r, int id, struct jv self, struct jargs *a, struct jv *out)
{
    if (!jinja_has_method(self, id))
        return jr_fail(r, "'%s' object has no attribute '%s'", jv_type_name(self), methods[id].name);
    return methods[id].fn(r, self, a, out);
}

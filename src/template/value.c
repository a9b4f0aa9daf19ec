/* value.c — the template value model (struct jv) with Python semantics: truthiness,
 * ==, ordering, len(), iteration, str() and repr() (Python's float repr, quote choice
 * and escapes for strings in lists/dicts), and conversion from a cJSON context.
 *
 * All memory comes from the render arena (struct jrender); nothing here frees. Lists
 * and dicts are immutable once built, except namespaces (set ns.x = ...). Dict keys
 * keep insertion order and compare with Python ==, so 1, 1.0 and True are one key.
 */
#include "template/jinja_internal.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

struct jv_list *jv_list_new(struct jrender *r, size_t cap)
{
    struct jv_list *l = jarena_alloc(&r->arena, sizeof *l);
    if (!l) return NULL;
    if (cap) {
        l->v = jarena_alloc(&r->arena, cap * sizeof *l->v);
        if (!l->v) return NULL;
        l->cap = cap;
    }
    return l;
}

int jv_list_push(struct jrender *r, struct jv_list *l, struct jv v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        struct jv *nv = jarena_alloc(&r->arena, cap * sizeof *nv);
        if (!nv) return jr_oom(r);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return 0;
}

struct jv_dict *jv_dict_new(struct jrender *r, size_t cap)
{
    struct jv_dict *d = jarena_alloc(&r->arena, sizeof *d);
    if (!d) return NULL;
    if (cap) {
        d->k = jarena_alloc(&r->arena, cap * sizeof *d->k);
        d->v = jarena_alloc(&r->arena, cap * sizeof *d->v);
        if (!d->k || !d->v) return NULL;
        d->cap = cap;
    }
    return d;
}

struct jv *jv_dict_get(const struct jv_dict *d, struct jv key)
{
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(d->k[i], key)) return &d->v[i];
    return NULL;
}

struct jv *jv_dict_gets(const struct jv_dict *d, const char *k, size_t n)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].type == JV_STRING && d->k[i].s.n == n && !memcmp(d->k[i].s.p, k, n)) return &d->v[i];
    return NULL;
}

int jv_dict_set(struct jrender *r, struct jv_dict *d, struct jv key, struct jv v)
{
    struct jv *slot = jv_dict_get(d, key);
    if (slot) {
        *slot = v;
        return 0;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        struct jv *nk = jarena_alloc(&r->arena, cap * sizeof *nk);
        struct jv *nv = jarena_alloc(&r->arena, cap * sizeof *nv);
        if (!nk || !nv) return jr_oom(r);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n] = v;
    d->n++;
    return 0;
}

/* ---- undefined ------------------------------------------------------------------- */

struct jv jv_undef_named(struct jrender *r, const char *name, size_t n)
{
    struct jv v = jv_undef();
    struct jv_undef *u = jarena_alloc(&r->arena, sizeof *u);
    if (u) {
        u->name = name;
        u->n = n;
    }
    v.u = u;
    return v;
}

static const char *obj_type_repr(struct jv obj)
{
    switch (obj.type) {
    case JV_NONE: return "None";
    case JV_BOOL: return "bool object";
    case JV_INT: return "int object";
    case JV_FLOAT: return "float object";
    case JV_STRING: return "str object";
    case JV_LIST: return obj.l->tuple ? "tuple object" : "list object";
    case JV_DICT: return "dict object";
    case JV_NAMESPACE: return "jinja2.utils.Namespace object";
    case JV_LOOP: return "jinja2.runtime.LoopContext object";
    default: return "object";
    }
}

struct jv jv_undef_attr(struct jrender *r, struct jv obj, const char *name, size_t n)
{
    struct jv v = jv_undef_named(r, name, n);
    if (v.u) ((struct jv_undef *)v.u)->obj_type = obj_type_repr(obj);
    return v;
}

struct jv jv_undef_hint(struct jrender *r, const char *hint)
{
    struct jv v = jv_undef_named(r, NULL, 0);
    if (v.u) ((struct jv_undef *)v.u)->hint = hint;
    return v;
}

void jv_undef_msg(struct jv v, char *buf, size_t len)
{
    const struct jv_undef *u = v.u;
    if (!u) snprintf(buf, len, "value is undefined");
    else if (u->hint) snprintf(buf, len, "%s", u->hint);
    else if (!u->obj_type) snprintf(buf, len, "'%.*s' is undefined", (int)(u->n > 200 ? 200 : u->n), u->name);
    else if (!u->name) snprintf(buf, len, "%s has no element %lld", u->obj_type, (long long)u->index);
    else snprintf(buf, len, "'%s' has no attribute '%.*s'", u->obj_type, (int)(u->n > 200 ? 200 : u->n), u->name);
}

/* ---- JSON input ------------------------------------------------------------------ */

int jv_from_json(struct jrender *r, const struct cJSON *j, struct jv *out, int depth)
{
    if (depth > JINJA_MAX_DEPTH) return jr_fail(r, "context JSON nested too deeply");
    if (cJSON_IsNull(j) || cJSON_IsInvalid(j)) {
        *out = jv_none();
    } else if (cJSON_IsBool(j)) {
        *out = jv_bool(cJSON_IsTrue(j));
    } else if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        /* cJSON keeps no int/float distinction: integral values become Python ints */
        if (d == floor(d) && fabs(d) < 9.2e18) *out = jv_int((int64_t)d);
        else *out = jv_float(d);
    } else if (cJSON_IsString(j)) {
        const char *s = j->valuestring ? j->valuestring : "";
        *out = jv_str(s, strlen(s));
    } else if (cJSON_IsArray(j)) {
        struct jv_list *l = jv_list_new(r, (size_t)cJSON_GetArraySize(j));
        if (!l) return jr_oom(r);
        for (const cJSON *c = j->child; c; c = c->next) {
            struct jv v;
            int rc = jv_from_json(r, c, &v, depth + 1);
            if (rc) return rc;
            if ((rc = jv_list_push(r, l, v))) return rc;
        }
        out->type = JV_LIST;
        out->l = l;
    } else if (cJSON_IsObject(j)) {
        struct jv_dict *d = jv_dict_new(r, (size_t)cJSON_GetArraySize(j));
        if (!d) return jr_oom(r);
        for (const cJSON *c = j->child; c; c = c->next) {
            struct jv v;
            int rc = jv_from_json(r, c, &v, depth + 1);
            if (rc) return rc;
            const char *k = c->string ? c->string : "";
            if ((rc = jv_dict_set(r, d, jv_str(k, strlen(k)), v))) return rc;
        }
        out->type = JV_DICT;
        out->d = d;
    } else {
        *out = jv_none();
    }
    return 0;
}

/* ---- Python semantics ------------------------------------------------------------ */

bool jv_truthy(struct jv v)
{
    switch (v.type) {
    case JV_UNDEFINED:
    case JV_NONE: return false;
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0.0;
    case JV_STRING: return v.s.n != 0;
    case JV_LIST: return v.l->n != 0;
    case JV_DICT: return v.d->n != 0;
    default: return true;
    }
}

static bool is_num(struct jv v) { return v.type == JV_BOOL || v.type == JV_INT || v.type == JV_FLOAT; }
static double num_f(struct jv v) { return v.type == JV_FLOAT ? v.f : v.type == JV_INT ? (double)v.i : (double)v.b; }
static int64_t num_i(struct jv v) { return v.type == JV_INT ? v.i : (int64_t)v.b; }

static bool equal_depth(struct jv a, struct jv b, int depth)
{
    if (depth > JINJA_MAX_DEPTH) return false;
    if (is_num(a) && is_num(b)) {
        if (a.type != JV_FLOAT && b.type != JV_FLOAT) return num_i(a) == num_i(b);
        return num_f(a) == num_f(b);
    }
    if (a.type != b.type) return false;
    switch (a.type) {
    case JV_UNDEFINED:
    case JV_NONE: return true;
    case JV_STRING: return a.s.n == b.s.n && !memcmp(a.s.p, b.s.p, a.s.n);
    case JV_LIST:
        if (a.l->tuple != b.l->tuple || a.l->is_range != b.l->is_range || a.l->n != b.l->n) return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!equal_depth(a.l->v[i], b.l->v[i], depth + 1)) return false;
        return true;
    case JV_DICT:
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            struct jv *o = jv_dict_get(b.d, a.d->k[i]);
            if (!o || !equal_depth(a.d->v[i], *o, depth + 1)) return false;
        }
        return true;
    case JV_NAMESPACE: return a.d == b.d;
    case JV_LOOP: return a.loop == b.loop;
    case JV_CALLABLE:
        return a.c == b.c || (a.c->kind == b.c->kind && a.c->id == b.c->id && a.c->node == b.c->node &&
                              a.c->kind != JC_METHOD);
    default: return false;
    }
}

bool jv_equal(struct jv a, struct jv b) { return equal_depth(a, b, 0); }

const char *jv_type_name(struct jv v)
{
    switch (v.type) {
    case JV_UNDEFINED: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STRING: return "str";
    case JV_LIST: return v.l->tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NAMESPACE: return "Namespace";
    case JV_CALLABLE: return v.c->kind == JC_METHOD ? "builtin_function_or_method" : v.c->kind == JC_GLOBAL ? "function" : "Macro";
    case JV_LOOP: return "LoopContext";
    }
    return "object";
}

static int compare_depth(struct jrender *r, struct jv a, struct jv b, int *res, int depth)
{
    if (depth > JINJA_MAX_DEPTH) return jr_fail(r, "values nested too deeply to compare");
    if (is_num(a) && is_num(b)) {
        if (a.type != JV_FLOAT && b.type != JV_FLOAT) {
            int64_t x = num_i(a), y = num_i(b);
            *res = x < y ? -1 : x > y;
        } else {
            double x = num_f(a), y = num_f(b);
            *res = x < y ? -1 : x > y ? 1 : 0; /* NaN compares "equal" here; Python: all false */
        }
        return 0;
    }
    if (a.type == JV_STRING && b.type == JV_STRING) {
        size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
        int c = n ? memcmp(a.s.p, b.s.p, n) : 0;
        *res = c < 0 ? -1 : c > 0 ? 1 : a.s.n < b.s.n ? -1 : a.s.n > b.s.n;
        return 0;
    }
    if (a.type == JV_LIST && b.type == JV_LIST && a.l->tuple == b.l->tuple) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (jv_equal(a.l->v[i], b.l->v[i])) continue;
            return compare_depth(r, a.l->v[i], b.l->v[i], res, depth + 1);
        }
        *res = a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
        return 0;
    }
    return jr_fail(r, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a), jv_type_name(b));
}

int jv_compare(struct jrender *r, struct jv a, struct jv b, int *res) { return compare_depth(r, a, b, res, 0); }

/* ---- str() / repr() -------------------------------------------------------------- */

void jv_fmt_float(double f, char out[40])
{
    if (isnan(f)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(out, f < 0 ? "-inf" : "inf");
        return;
    }
    char buf[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf: [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0, neg = 0;
    const char *p = buf;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int decpt = exp10 + 1; /* value = 0.digits * 10^decpt */
    char *o = out;
    if (neg) *o++ = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -decpt; i++) *o++ = '0';
            memcpy(o, digits, (size_t)nd);
            o += nd;
        } else if (decpt >= nd) {
            memcpy(o, digits, (size_t)nd);
            o += nd;
            for (int i = nd; i < decpt; i++) *o++ = '0';
            *o++ = '.';
            *o++ = '0';
        } else {
            memcpy(o, digits, (size_t)decpt);
            o += decpt;
            *o++ = '.';
            memcpy(o, digits + decpt, (size_t)(nd - decpt));
            o += nd - decpt;
        }
        *o = 0;
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)(nd - 1));
            o += nd - 1;
        }
        sprintf(o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
}

static bool py_printable(uint32_t cp)
{
    if (cp < 0x20 || cp == 0x7f) return false;
    if (cp < 0x7f) return true;
    if (cp > 0x10ffff) return false;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
    }
}

static void repr_str(struct jbuf *b, const char *s, size_t n)
{
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jbuf_putc(b, q);
    const char *end = s + n;
    while (s < end) {
        int l;
        uint32_t cp = jinja_utf8_dec(s, end, &l);
        if (cp == (uint32_t)q || cp == '\\') {
            jbuf_putc(b, '\\');
            jbuf_putc(b, (char)cp);
        } else if (cp == '\t') jbuf_puts(b, "\\t");
        else if (cp == '\n') jbuf_puts(b, "\\n");
        else if (cp == '\r') jbuf_puts(b, "\\r");
        else if (py_printable(cp)) jbuf_put(b, s, (size_t)l);
        else if (cp <= 0xff) jbuf_printf(b, "\\x%02x", cp);
        else if (cp <= 0xffff) jbuf_printf(b, "\\u%04x", cp);
        else jbuf_printf(b, "\\U%08x", cp);
        s += l;
    }
    jbuf_putc(b, q);
}

static void put_callable(struct jbuf *b, struct jv v)
{
    const struct jv_callable *c = v.c;
    if (c->kind == JC_MACRO) jbuf_printf(b, "<Macro '%.*s'>", (int)(c->node->name_n > 100 ? 100 : c->node->name_n), c->node->name);
    else if (c->kind == JC_CALLER) jbuf_puts(b, "<Macro 'caller'>");
    else if (c->kind == JC_METHOD) jbuf_printf(b, "<built-in method of %s object>", jv_type_name(c->self));
    else jbuf_puts(b, "<function>");
}

int jv_repr(struct jrender *r, struct jbuf *b, struct jv v, int depth)
{
    if (depth > JINJA_MAX_DEPTH) return jr_fail(r, "value nested too deeply to print");
    char tmp[40];
    switch (v.type) {
    case JV_UNDEFINED: jbuf_puts(b, "Undefined"); break;
    case JV_NONE: jbuf_puts(b, "None"); break;
    case JV_BOOL: jbuf_puts(b, v.b ? "True" : "False"); break;
    case JV_INT: jbuf_printf(b, "%lld", (long long)v.i); break;
    case JV_FLOAT: jv_fmt_float(v.f, tmp); jbuf_puts(b, tmp); break;
    case JV_STRING: repr_str(b, v.s.p, v.s.n); break;
    case JV_LIST:
        if (v.l->is_range) {
            jbuf_printf(b, "range(%lld, %lld", (long long)v.l->range[0], (long long)v.l->range[1]);
            if (v.l->range[2] != 1) jbuf_printf(b, ", %lld", (long long)v.l->range[2]);
            jbuf_putc(b, ')');
            break;
        }
        jbuf_putc(b, v.l->tuple ? '(' : '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jbuf_puts(b, ", ");
            int rc = jv_repr(r, b, v.l->v[i], depth + 1);
            if (rc) return rc;
        }
        if (v.l->tuple && v.l->n == 1) jbuf_putc(b, ',');
        jbuf_putc(b, v.l->tuple ? ')' : ']');
        break;
    case JV_NAMESPACE:
    case JV_DICT:
        if (v.type == JV_NAMESPACE) jbuf_puts(b, "<Namespace ");
        jbuf_putc(b, '{');
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) jbuf_puts(b, ", ");
            int rc = jv_repr(r, b, v.d->k[i], depth + 1);
            if (!rc) {
                jbuf_puts(b, ": ");
                rc = jv_repr(r, b, v.d->v[i], depth + 1);
            }
            if (rc) return rc;
        }
        jbuf_putc(b, '}');
        if (v.type == JV_NAMESPACE) jbuf_putc(b, '>');
        break;
    case JV_CALLABLE: put_callable(b, v); break;
    case JV_LOOP:
        jbuf_printf(b, "<LoopContext %zu/%zu>", v.loop->index0 + 1, v.loop->items ? v.loop->items->n : 0);
        break;
    }
    return 0;
}

int jv_to_str(struct jrender *r, struct jbuf *b, struct jv v)
{
    if (v.type == JV_STRING) {
        jbuf_put(b, v.s.p, v.s.n);
        return 0;
    }
    if (v.type == JV_UNDEFINED) return 0;
    return jv_repr(r, b, v, 0);
}

int jv_stringify(struct jrender *r, struct jv v, struct jv *out)
{
    if (v.type == JV_STRING) {
        *out = v;
        return 0;
    }
    if (v.type == JV_UNDEFINED) {
        *out = jv_str("", 0);
        return 0;
    }
    if (v.type == JV_NONE) {
        *out = jv_str("None", 4);
        return 0;
    }
    if (v.type == JV_BOOL) {
        *out = v.b ? jv_str("True", 4) : jv_str("False", 5);
        return 0;
    }
    struct jbuf b = { 0 };
    int rc = jv_repr(r, &b, v, 0);
    if (!rc && b.oom) rc = jr_oom(r);
    if (!rc) {
        char *s = jarena_strdup(&r->arena, b.p ? b.p : "", b.n);
        if (!s) rc = jr_oom(r);
        else *out = jv_str(s, b.n);
    }
    jbuf_free(&b);
    return rc;
}

int jv_len(struct jrender *r, struct jv v, int64_t *out)
{
    switch (v.type) {
    case JV_UNDEFINED: *out = 0; return 0;
    case JV_STRING: *out = (int64_t)jinja_utf8_count(v.s.p, v.s.n); return 0;
    case JV_LIST: *out = (int64_t)v.l->n; return 0;
    case JV_DICT: *out = (int64_t)v.d->n; return 0;
    case JV_LOOP: *out = v.loop->items ? (int64_t)v.loop->items->n : 0; return 0;
    default: return jr_fail(r, "object of type '%s' has no len()", jv_type_name(v));
    }
}

int jv_iterate(struct jrender *r, struct jv v, struct jv_list **out)
{
    switch (v.type) {
    case JV_UNDEFINED:
        *out = jv_list_new(r, 0);
        return *out ? 0 : jr_oom(r);
    case JV_LIST:
        *out = v.l;
        return 0;
    case JV_DICT: {
        struct jv_list *l = jv_list_new(r, v.d->n);
        if (!l) return jr_oom(r);
        for (size_t i = 0; i < v.d->n; i++) l->v[i] = v.d->k[i];
        l->n = v.d->n;
        *out = l;
        return 0;
    }
    case JV_STRING: {
        size_t n = jinja_utf8_count(v.s.p, v.s.n);
        struct jv_list *l = jv_list_new(r, n);
        if (!l) return jr_oom(r);
        const char *p = v.s.p, *end = p + v.s.n;
        while (p < end) {
            int len;
            jinja_utf8_dec(p, end, &len);
            l->v[l->n++] = jv_str(p, (size_t)len);
            p += len;
        }
        *out = l;
        return 0;
    }
    default: return jr_fail(r, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* tojson.c — the tojson filter as transformers defines it:
 * json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
 *
 * Output matches Python's json module byte for byte: default separators ", " / ": "
 * (item separator "," when indenting), newline + indent per level, "[]" / "{}" for
 * empty containers, floats via repr (NaN / Infinity / -Infinity), non-string dict keys
 * converted like Python (true / null / 1 / 1.5), control characters as \uXXXX and
 * non-ASCII kept unless ensure_ascii. Undefined, namespaces and callables are not JSON
 * serializable (render error), as in Python.
 */
#include "template/jinja_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

struct jsonw {
    struct jrender *r;
    struct jbuf *b;
    const char *indent, *isep, *ksep;
    bool sort_keys, ascii;
};

static void put_json_str(struct jsonw *w, const char *s, size_t n)
{
    struct jbuf *b = w->b;
    const char *end = s + n;
    jbuf_putc(b, '"');
    while (s < end) {
        int l;
        uint32_t c = jinja_utf8_dec(s, end, &l);
        switch (c) {
        case '"': jbuf_puts(b, "\\\""); break;
        case '\\': jbuf_puts(b, "\\\\"); break;
        case '\n': jbuf_puts(b, "\\n"); break;
        case '\r': jbuf_puts(b, "\\r"); break;
        case '\t': jbuf_puts(b, "\\t"); break;
        case '\b': jbuf_puts(b, "\\b"); break;
        case '\f': jbuf_puts(b, "\\f"); break;
        default:
            if (c < 0x20) jbuf_printf(b, "\\u%04x", c);
            else if (c < 0x7f || !w->ascii) jbuf_put(b, s, (size_t)l);
            else if (c < 0x10000) jbuf_printf(b, "\\u%04x", c);
            else {
                uint32_t v = c - 0x10000;
                jbuf_printf(b, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
            }
        }
        s += l;
    }
    jbuf_putc(b, '"');
}

static void newline(struct jsonw *w, int level)
{
    if (!w->indent) return;
    jbuf_putc(w->b, '\n');
    for (int i = 0; i < level; i++) jbuf_puts(w->b, w->indent);
}

static void put_float(struct jsonw *w, double f)
{
    char tmp[40];
    if (isnan(f)) jbuf_puts(w->b, "NaN");
    else if (isinf(f)) jbuf_puts(w->b, f < 0 ? "-Infinity" : "Infinity");
    else {
        jv_fmt_float(f, tmp);
        jbuf_puts(w->b, tmp);
    }
}

/* Python converts non-string keys: True -> "true", None -> "null", 1 -> "1". */
static int key_string(struct jsonw *w, struct jv k, struct jv *out)
{
    char tmp[40];
    switch (k.type) {
    case JV_STRING: *out = k; return 0;
    case JV_BOOL: *out = k.b ? jv_str("true", 4) : jv_str("false", 5); return 0;
    case JV_NONE: *out = jv_str("null", 4); return 0;
    case JV_INT:
    case JV_FLOAT: {
        if (k.type == JV_INT) snprintf(tmp, sizeof tmp, "%lld", (long long)k.i);
        else if (isnan(k.f)) strcpy(tmp, "NaN");
        else if (isinf(k.f)) strcpy(tmp, k.f < 0 ? "-Infinity" : "Infinity");
        else jv_fmt_float(k.f, tmp);
        char *s = jarena_strdup(&w->r->arena, tmp, strlen(tmp));
        if (!s) return jr_oom(w->r);
        *out = jv_str(s, strlen(s));
        return 0;
    }
    default:
        return jr_fail(w->r, "keys must be str, int, float, bool or None, not %s", jv_type_name(k));
    }
}

static int write_value(struct jsonw *w, struct jv v, int level)
{
    if (level > JINJA_MAX_DEPTH) return jr_fail(w->r, "value nested too deeply for tojson");
    switch (v.type) {
    case JV_NONE: jbuf_puts(w->b, "null"); return 0;
    case JV_BOOL: jbuf_puts(w->b, v.b ? "true" : "false"); return 0;
    case JV_INT: jbuf_printf(w->b, "%lld", (long long)v.i); return 0;
    case JV_FLOAT: put_float(w, v.f); return 0;
    case JV_STRING: put_json_str(w, v.s.p, v.s.n); return 0;
    case JV_LIST:
        if (v.l->n == 0) {
            jbuf_puts(w->b, "[]");
            return 0;
        }
        jbuf_putc(w->b, '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jbuf_puts(w->b, w->isep);
            newline(w, level + 1);
            int rc = write_value(w, v.l->v[i], level + 1);
            if (rc) return rc;
        }
        newline(w, level);
        jbuf_putc(w->b, ']');
        return 0;
    case JV_DICT: {
        if (v.d->n == 0) {
            jbuf_puts(w->b, "{}");
            return 0;
        }
        size_t n = v.d->n;
        struct jv *keys = jarena_alloc(&w->r->arena, n * sizeof *keys);
        struct jv *vals = jarena_alloc(&w->r->arena, n * sizeof *vals);
        if (!keys || !vals) return jr_oom(w->r);
        for (size_t i = 0; i < n; i++) {
            keys[i] = v.d->k[i];
            vals[i] = v.d->v[i];
        }
        if (w->sort_keys) /* insertion sort: stable, and dicts in templates are small */
            for (size_t i = 1; i < n; i++)
                for (size_t j = i; j > 0; j--) {
                    int c;
                    int rc = jv_compare(w->r, keys[j], keys[j - 1], &c);
                    if (rc) return rc;
                    if (c >= 0) break;
                    struct jv tk = keys[j], tv = vals[j];
                    keys[j] = keys[j - 1];
                    vals[j] = vals[j - 1];
                    keys[j - 1] = tk;
                    vals[j - 1] = tv;
                }
        jbuf_putc(w->b, '{');
        for (size_t i = 0; i < n; i++) {
            struct jv ks = jv_str("", 0);
            int rc = key_string(w, keys[i], &ks);
            if (rc) return rc;
            if (i) jbuf_puts(w->b, w->isep);
            newline(w, level + 1);
            put_json_str(w, ks.s.p, ks.s.n);
            jbuf_puts(w->b, w->ksep);
            if ((rc = write_value(w, vals[i], level + 1))) return rc;
        }
        newline(w, level);
        jbuf_putc(w->b, '}');
        return 0;
    }
    default:
        return jr_fail(w->r, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
}

int jinja_tojson(struct jrender *r, struct jbuf *b, struct jv v, const char *indent,
                 const char *item_sep, const char *key_sep, bool sort_keys, bool ascii)
{
    struct jsonw w = { r, b, indent, item_sep, key_sep, sort_keys, ascii };
    int rc = write_value(&w, v, 0);
    if (!rc && b->oom) rc = jr_oom(r);
    return rc;
}

/* globals.c — global functions templates may call: raise_exception(msg) (Hugging Face:
 * aborts the render with exactly msg), strftime_now(fmt) (fixed string from the render
 * options in tests, else UTC now), namespace(...), dict(...) and range(...) capped at
 * 100000 items like jinja2's sandbox. One const table; the parser rejects other names.
 */
#define _POSIX_C_SOURCE 200809L /* gmtime_r */
#include "template/jinja_internal.h"
#include "util/err.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>



/* ---- globals ------------------------------------------------------------------------ */

#define GLOBAL(name) static int name(struct jrender *r, struct jargs *a, struct jv *out)

GLOBAL(g_raise_exception)
{
    (void)out;
    struct jv msg = jv_str("", 0);
    jargs_get(a, 0, "message", &msg);
    TRY(jv_stringify(r, msg, &msg));
    if (!r->failed) {
        err_set(r->err, r->errlen, ERR_INVALID, "%.*s", (int)msg.s.n, msg.s.p);
        r->failed = true;
    }
    return ERR_INVALID;
}

GLOBAL(g_strftime_now)
{
    struct jv fmt;
    if (!jargs_get(a, 0, "format", &fmt)) return jr_fail(r, "strftime_now() needs a format");
    TRY(jargs_done(r, a, 1, "strftime_now"));
    TRY(jinja_want_str(r, fmt, "strftime_now() format"));
    if (r->opts->fixed_strftime) {
        *out = jv_str(r->opts->fixed_strftime, strlen(r->opts->fixed_strftime));
        return 0;
    }
    time_t t = r->opts->now ? (time_t)r->opts->now : time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    char f[256], buf[512];
    snprintf(f, sizeof f, "%.*s", (int)(fmt.s.n > 255 ? 255 : fmt.s.n), fmt.s.p);
    size_t n = f[0] ? strftime(buf, sizeof buf, f, &tm) : 0;
    char *s = jarena_strdup(&r->arena, buf, n);
    if (!s) return jr_oom(r);
    *out = jv_str(s, n);
    return 0;
}

/* dict(mapping_or_pairs?, **kwargs) into d */
static int fill_dict(struct jrender *r, struct jv_dict *d, struct jargs *a, const char *fn)
{
    if (a->npos > 1) return jr_fail(r, "%s() takes at most 1 positional argument", fn);
    if (a->npos == 1) {
        struct jv src = a->pos[0];
        if (src.type == JV_DICT || src.type == JV_NAMESPACE) {
            for (size_t i = 0; i < src.d->n; i++) TRY(jv_dict_set(r, d, src.d->k[i], src.d->v[i]));
        } else if (src.type == JV_LIST) {
            for (size_t i = 0; i < src.l->n; i++) {
                struct jv p = src.l->v[i];
                if (p.type != JV_LIST || p.l->n != 2) return jr_fail(r, "%s() sequence elements must be pairs", fn);
                TRY(jv_dict_set(r, d, p.l->v[0], p.l->v[1]));
            }
        } else {
            return jr_fail(r, "'%s' object is not iterable", jv_type_name(src));
        }
    }
    for (size_t i = 0; i < a->nkw; i++) TRY(jv_dict_set(r, d, jv_str(a->kwn[i], a->kwl[i]), a->kwv[i]));
    return 0;
}

GLOBAL(g_namespace)
{
    struct jv_dict *d = jv_dict_new(r, 0);
    if (!d) return jr_oom(r);
    TRY(fill_dict(r, d, a, "namespace"));
    out->type = JV_NAMESPACE;
    out->d = d;
    return 0;
}

GLOBAL(g_dict)
{
    struct jv_dict *d = jv_dict_new(r, 0);
    if (!d) return jr_oom(r);
    TRY(fill_dict(r, d, a, "dict"));
    out->type = JV_DICT;
    out->d = d;
    return 0;
}

GLOBAL(g_range)
{
    if (a->nkw) return jr_fail(r, "range() takes no keyword arguments");
    if (a->npos < 1 || a->npos > 3) return jr_fail(r, "range expected 1 to 3 arguments, got %zu", a->npos);
    int64_t v[3] = { 0, 0, 1 };
    for (size_t i = 0; i < a->npos; i++) TRY(jinja_want_int(r, a->pos[i], "range() argument", &v[i]));
    int64_t start = a->npos == 1 ? 0 : v[0], stop = a->npos == 1 ? v[0] : v[1], stepv = a->npos == 3 ? v[2] : 1;
    if (stepv == 0) return jr_fail(r, "range() arg 3 must not be zero");
    double count = stepv > 0 ? ceil(((double)stop - (double)start) / (double)stepv) : ceil(((double)start - (double)stop) / (double)-stepv);
    if (count < 0) count = 0;
    if (count > 100000) return jr_fail(r, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    struct jv_list *l = jv_list_new(r, (size_t)count);
    if (!l) return jr_oom(r);
    for (int64_t x = start; stepv > 0 ? x < stop : x > stop; x += stepv) {
        l->v[l->n++] = jv_int(x);
        if (l->n == (size_t)count) break;
    }
    l->is_range = true;
    l->range[0] = start;
    l->range[1] = stop;
    l->range[2] = stepv;
    return jinja_mklist(r, l, out);
}

static const struct {
    const char *name;
    int (*fn)(struct jrender *, struct jargs *, struct jv *);
} globals[] = {
    { "raise_exception", g_raise_exception }, { "strftime_now", g_strftime_now },
    { "namespace", g_namespace }, { "range", g_range }, { "dict", g_dict },
};

int jinja_global_id(const char *name, size_t n) { NAME_LOOKUP(globals, name, n); }

int jinja_call_global(struct jrender *r, int id, struct jargs *a, struct jv *out)
{
    return globals[id].fn(r, a, out);
}

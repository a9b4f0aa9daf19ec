/* eval.c — executes a parsed template: statements, expressions, scopes, macros, and the
 * public jinja_parse / jinja_render / jinja_free.
 *
 * Scoping follows jinja2: the root frame holds the context variables and top-level
 * `set`s; each for-loop iteration, macro call, call-block body and `with` gets a child
 * frame (so a `set` inside a loop does not leak out of the iteration); `if` opens no
 * scope. Attribute/item access follows jinja2's Environment.getattr/getitem: obj.name
 * is a Python attribute (a method) first and a key second, obj[key] the reverse, and
 * a miss yields Undefined — except on an Undefined, which raises UndefinedError.
 * Arithmetic follows Python (int/float, floor division and modulo signs, str*int);
 * ints are 64-bit and overflow is a render error.
 *
 * Thread safety: jinja_render touches only its own struct jrender; the template is
 * read-only, so one template may be rendered by many threads at once.
 */
#include "template/jinja_internal.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { JR_BREAK = 1, JR_CONTINUE = 2 };


int jr_fail(struct jrender *r, const char *fmt, ...)
{
    if (!r->failed) {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        err_set(r->err, r->errlen, ERR_INVALID, "line %d: %s", r->line, msg);
        r->failed = true;
    }
    return ERR_INVALID;
}

int jr_oom(struct jrender *r)
{
    if (!r->failed) {
        err_set(r->err, r->errlen, ERR_NOMEM, "line %d: template render exceeded its memory limit", r->line);
        r->failed = true;
    }
    return ERR_NOMEM;
}

int jr_undefined(struct jrender *r, struct jv v)
{
    char msg[300];
    jv_undef_msg(v, msg, sizeof msg);
    return jr_fail(r, "%s", msg);
}

/* ---- frames ------------------------------------------------------------------------ */

static struct jframe *frame_new(struct jrender *r, struct jframe *parent)
{
    struct jframe *f = jarena_alloc(&r->arena, sizeof *f);
    if (f) f->parent = parent;
    return f;
}

static int frame_set(struct jrender *r, struct jframe *f, const char *name, size_t n, struct jv v)
{
    for (size_t i = 0; i < f->n; i++)
        if (f->lens[i] == n && !memcmp(f->names[i], name, n)) {
            f->vals[i] = v;
            return 0;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        const char **nn = jarena_alloc(&r->arena, cap * sizeof *nn);
        size_t *nl = jarena_alloc(&r->arena, cap * sizeof *nl);
        struct jv *nv = jarena_alloc(&r->arena, cap * sizeof *nv);
        if (!nn || !nl || !nv) return jr_oom(r);
        if (f->n) {
            memcpy(nn, f->names, f->n * sizeof *nn);
            memcpy(nl, f->lens, f->n * sizeof *nl);
            memcpy(nv, f->vals, f->n * sizeof *nv);
        }
        f->names = nn;
        f->lens = nl;
        f->vals = nv;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->lens[f->n] = n;
    f->vals[f->n] = v;
    f->n++;
    return 0;
}

static struct jv *frame_lookup(struct jframe *f, const char *name, size_t n)
{
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (f->lens[i] == n && !memcmp(f->names[i], name, n)) return &f->vals[i];
    return NULL;
}

/* ---- helpers ------------------------------------------------------------------------ */

static int step(struct jrender *r)
{
    if (++r->steps > JINJA_MAX_STEPS) return jr_fail(r, "template exceeded its execution step limit");
    return 0;
}

static int new_callable(struct jrender *r, enum jcall_kind kind, int id, struct jv self,
                        const struct jnode *node, struct jframe *closure, struct jv *out)
{
    struct jv_callable *c = jarena_alloc(&r->arena, sizeof *c);
    if (!c) return jr_oom(r);
    c->kind = kind;
    c->id = id;
    c->self = self;
    c->node = node;
    c->closure = closure;
    out->type = JV_CALLABLE;
    out->c = c;
    return 0;
}

static int buf_to_value(struct jrender *r, struct jbuf *b, struct jv *out)
{
    if (b->oom) return jr_oom(r);
    char *s = jarena_strdup(&r->arena, b->p ? b->p : "", b->n);
    if (!s) return jr_oom(r);
    *out = jv_str(s, b->n);
    return 0;
}

/* ---- attribute / item access ------------------------------------------------------- */

static int loop_attr(struct jrender *r, struct jv lv, const char *name, size_t n, struct jv *out)
{
    const struct jv_loop *L = lv.loop;
    int64_t len = L->items ? (int64_t)L->items->n : 0, i0 = (int64_t)L->index0;
#define IS(s) (n == strlen(s) && !memcmp(name, s, n))
    if (IS("index")) *out = jv_int(i0 + 1);
    else if (IS("index0")) *out = jv_int(i0);
    else if (IS("revindex")) *out = jv_int(len - i0);
    else if (IS("revindex0")) *out = jv_int(len - i0 - 1);
    else if (IS("first")) *out = jv_bool(i0 == 0);
    else if (IS("last")) *out = jv_bool(i0 == len - 1);
    else if (IS("length")) *out = jv_int(len);
    else if (IS("depth")) *out = jv_int(L->depth);
    else if (IS("depth0")) *out = jv_int(L->depth - 1);
    else if (IS("previtem")) *out = i0 > 0 ? L->items->v[i0 - 1] : jv_undef_hint(r, "there is no previous item");
    else if (IS("nextitem")) *out = i0 + 1 < len ? L->items->v[i0 + 1] : jv_undef_hint(r, "there is no next item");
    else {
        int id = jinja_method_id(name, n);
        if (id >= 0 && jinja_has_method(lv, id)) return new_callable(r, JC_METHOD, id, lv, NULL, NULL, out);
        *out = jv_undef_attr(r, lv, name, n);
    }
#undef IS
    return 0;
}

int jinja_getattr(struct jrender *r, struct jv obj, const char *name, size_t n, struct jv *out)
{
    if (obj.type == JV_UNDEFINED) return jr_undefined(r, obj);
    if (obj.type == JV_LOOP) return loop_attr(r, obj, name, n, out);
    int id = jinja_method_id(name, n);
    if (id >= 0 && jinja_has_method(obj, id)) return new_callable(r, JC_METHOD, id, obj, NULL, NULL, out);
    if (obj.type == JV_DICT || obj.type == JV_NAMESPACE) {
        struct jv *v = jv_dict_gets(obj.d, name, n);
        if (v) {
            *out = *v;
            return 0;
        }
    }
    *out = jv_undef_attr(r, obj, name, n);
    return 0;
}

/* Python index into n elements; false when out of range. */
static bool norm_index(int64_t i, size_t n, size_t *out)
{
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return false;
    *out = (size_t)i;
    return true;
}

/* Byte offset of code point k in s (ASCII fast path). */
static size_t cp_offset(const char *s, size_t n, size_t k)
{
    const char *p = s, *end = s + n;
    while (k-- > 0 && p < end) {
        int l;
        jinja_utf8_dec(p, end, &l);
        p += l;
    }
    return (size_t)(p - s);
}

static bool is_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

int jinja_getitem(struct jrender *r, struct jv obj, struct jv key, struct jv *out)
{
    if (obj.type == JV_UNDEFINED) return jr_undefined(r, obj);
    bool int_key = key.type == JV_INT || key.type == JV_BOOL;
    int64_t ik = key.type == JV_INT ? key.i : key.type == JV_BOOL ? key.b : 0;
    if (obj.type == JV_DICT) {
        struct jv *v = jv_dict_get(obj.d, key);
        if (v) {
            *out = *v;
            return 0;
        }
    } else if (obj.type == JV_LIST && int_key) {
        size_t i;
        if (norm_index(ik, obj.l->n, &i)) {
            *out = obj.l->v[i];
            return 0;
        }
    } else if (obj.type == JV_STRING && int_key) {
        size_t n = is_ascii(obj.s.p, obj.s.n) ? obj.s.n : jinja_utf8_count(obj.s.p, obj.s.n), i;
        if (norm_index(ik, n, &i)) {
            size_t a = cp_offset(obj.s.p, obj.s.n, i);
            int l;
            jinja_utf8_dec(obj.s.p + a, obj.s.p + obj.s.n, &l);
            *out = jv_str(obj.s.p + a, (size_t)l);
            return 0;
        }
    }
    if (key.type == JV_STRING && obj.type != JV_DICT) return jinja_getattr(r, obj, key.s.p, key.s.n, out);
    if (key.type == JV_STRING) {
        int id = jinja_method_id(key.s.p, key.s.n);
        if (id >= 0 && jinja_has_method(obj, id)) return new_callable(r, JC_METHOD, id, obj, NULL, NULL, out);
        *out = jv_undef_attr(r, obj, key.s.p, key.s.n);
        return 0;
    }
    struct jv u = jv_undef_attr(r, obj, NULL, 0);
    if (u.u) ((struct jv_undef *)u.u)->index = ik;
    *out = u;
    return 0;
}

static int slice_bound(struct jrender *r, const struct jnode *n, struct jframe *f, bool *given, int64_t *v, bool *ok);
static int eval(struct jrender *r, struct jframe *f, const struct jnode *n, struct jv *out);

static int eval_slice(struct jrender *r, struct jframe *f, const struct jnode *n, struct jv *out)
{
    struct jv obj;
    TRY(eval(r, f, n->a, &obj));
    if (obj.type == JV_UNDEFINED) return jr_undefined(r, obj);
    bool has[3], ok = true;
    int64_t b[3] = { 0, 0, 0 };
    TRY(slice_bound(r, n->b, f, &has[0], &b[0], &ok));
    TRY(slice_bound(r, n->c, f, &has[1], &b[1], &ok));
    TRY(slice_bound(r, n->d, f, &has[2], &b[2], &ok));
    if (!ok || (obj.type != JV_LIST && obj.type != JV_STRING)) {
        *out = jv_undef_attr(r, obj, NULL, 0);
        return 0;
    }
    int64_t stepv = has[2] ? b[2] : 1;
    if (stepv == 0) return jr_fail(r, "slice step cannot be zero");
    bool ascii = obj.type == JV_STRING && is_ascii(obj.s.p, obj.s.n);
    int64_t len = obj.type == JV_LIST ? (int64_t)obj.l->n : ascii ? (int64_t)obj.s.n : (int64_t)jinja_utf8_count(obj.s.p, obj.s.n);
    int64_t lower = stepv > 0 ? 0 : -1, upper = stepv > 0 ? len : len - 1;
    int64_t start, stop;
    if (!has[0]) start = stepv > 0 ? lower : upper;
    else if (b[0] < 0) start = b[0] + len < lower ? lower : b[0] + len;
    else start = b[0] > upper ? upper : b[0];
    if (!has[1]) stop = stepv > 0 ? upper : lower;
    else if (b[1] < 0) stop = b[1] + len < lower ? lower : b[1] + len;
    else stop = b[1] > upper ? upper : b[1];
    if (obj.type == JV_STRING && stepv == 1) {
        if (stop <= start) {
            *out = jv_str("", 0);
        } else if (ascii) {
            *out = jv_str(obj.s.p + start, (size_t)(stop - start));
        } else {
            size_t a = cp_offset(obj.s.p, obj.s.n, (size_t)start);
            size_t e = a + cp_offset(obj.s.p + a, obj.s.n - a, (size_t)(stop - start));
            *out = jv_str(obj.s.p + a, e - a);
        }
        return 0;
    }
    struct jv_list *src = NULL;
    if (obj.type == JV_STRING) TRY(jv_iterate(r, obj, &src));
    else src = obj.l;
    struct jv_list *l = jv_list_new(r, 0);
    if (!l) return jr_oom(r);
    for (int64_t i = start; stepv > 0 ? i < stop : i > stop; i += stepv) TRY(jv_list_push(r, l, src->v[i]));
    if (obj.type == JV_LIST) {
        l->tuple = obj.l->tuple;
        out->type = JV_LIST;
        out->l = l;
        return 0;
    }
    struct jbuf buf = { 0 };
    for (size_t i = 0; i < l->n; i++) jbuf_put(&buf, l->v[i].s.p, l->v[i].s.n);
    int rc = buf_to_value(r, &buf, out);
    jbuf_free(&buf);
    return rc;
}

static int slice_bound(struct jrender *r, const struct jnode *n, struct jframe *f, bool *given, int64_t *v, bool *ok)
{
    *given = false;
    if (!n) return 0;
    struct jv x;
    TRY(eval(r, f, n, &x));
    if (x.type == JV_NONE) return 0;
    if (x.type == JV_INT || x.type == JV_BOOL) {
        *given = true;
        *v = x.type == JV_INT ? x.i : x.b;
        return 0;
    }
    *ok = false;
    return 0;
}

/* ---- arithmetic -------------------------------------------------------------------- */

static bool numeric(struct jv v) { return v.type == JV_INT || v.type == JV_BOOL || v.type == JV_FLOAT; }
static int64_t as_i(struct jv v) { return v.type == JV_INT ? v.i : v.type == JV_BOOL ? v.b : 0; }
static double as_f(struct jv v) { return v.type == JV_FLOAT ? v.f : (double)as_i(v); }

static const char *op_sym(enum jop op)
{
    static const char *const s[] = { "?", "+", "-", "*", "/", "//", "%", "**", "~" };
    return op <= JOP_CONCAT ? s[op] : "?";
}

static int repeat(struct jrender *r, struct jv seq, int64_t times, struct jv *out)
{
    if (times < 0) times = 0;
    if (seq.type == JV_STRING) {
        if (times && seq.s.n && (uint64_t)times > JINJA_MAX_OUTPUT / seq.s.n) return jr_oom(r);
        size_t n = seq.s.n * (size_t)times;
        char *p = jarena_alloc(&r->arena, n + 1);
        if (!p) return jr_oom(r);
        for (int64_t i = 0; i < times; i++) memcpy(p + (size_t)i * seq.s.n, seq.s.p, seq.s.n);
        *out = jv_str(p, n);
        return 0;
    }
    if (times && seq.l->n && (uint64_t)times > (JINJA_MAX_ARENA / sizeof(struct jv)) / seq.l->n) return jr_oom(r);
    struct jv_list *l = jv_list_new(r, seq.l->n * (size_t)times);
    if (!l) return jr_oom(r);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.l->n; k++) l->v[l->n++] = seq.l->v[k];
    l->tuple = seq.l->tuple;
    out->type = JV_LIST;
    out->l = l;
    return 0;
}

static int py_floordiv_f(struct jrender *r, double a, double b, double *q, double *m)
{
    if (b == 0.0) return jr_fail(r, "float floor division by zero");
    double mod = fmod(a, b);
    double div = (a - mod) / b;
    if (mod != 0.0) {
        if ((b < 0) != (mod < 0)) {
            mod += b;
            div -= 1.0;
        }
    } else {
        mod = copysign(0.0, b);
    }
    double fl;
    if (div != 0.0) {
        fl = floor(div);
        if (div - fl > 0.5) fl += 1.0;
    } else {
        fl = copysign(0.0, a / b);
    }
    *q = fl;
    *m = mod;
    return 0;
}

static int binop(struct jrender *r, enum jop op, struct jv a, struct jv b, struct jv *out)
{
    if (op == JOP_CONCAT) {
        struct jbuf buf = { 0 };
        int rc = jv_to_str(r, &buf, a);
        if (!rc) rc = jv_to_str(r, &buf, b);
        if (!rc) rc = buf_to_value(r, &buf, out);
        jbuf_free(&buf);
        return rc;
    }
    if (a.type == JV_UNDEFINED) return jr_undefined(r, a);
    if (b.type == JV_UNDEFINED) return jr_undefined(r, b);
    if (numeric(a) && numeric(b)) {
        bool ints = a.type != JV_FLOAT && b.type != JV_FLOAT;
        int64_t x = as_i(a), y = as_i(b), z;
        double fx = as_f(a), fy = as_f(b);
        switch (op) {
        case JOP_ADD:
            if (!ints) { *out = jv_float(fx + fy); return 0; }
            if (__builtin_add_overflow(x, y, &z)) goto overflow;
            *out = jv_int(z);
            return 0;
        case JOP_SUB:
            if (!ints) { *out = jv_float(fx - fy); return 0; }
            if (__builtin_sub_overflow(x, y, &z)) goto overflow;
            *out = jv_int(z);
            return 0;
        case JOP_MUL:
            if (!ints) { *out = jv_float(fx * fy); return 0; }
            if (__builtin_mul_overflow(x, y, &z)) goto overflow;
            *out = jv_int(z);
            return 0;
        case JOP_DIV:
            if (fy == 0.0) return jr_fail(r, "division by zero");
            *out = jv_float(fx / fy);
            return 0;
        case JOP_FLOORDIV:
        case JOP_MOD:
            if (ints) {
                if (y == 0) return jr_fail(r, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) goto overflow;
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    m += y;
                    q -= 1;
                }
                *out = jv_int(op == JOP_MOD ? m : q);
                return 0;
            } else {
                double q, m;
                if (fy == 0.0) return jr_fail(r, op == JOP_MOD ? "float modulo" : "float floor division by zero");
                TRY(py_floordiv_f(r, fx, fy, &q, &m));
                *out = jv_float(op == JOP_MOD ? m : q);
                return 0;
            }
        case JOP_POW:
            if (ints && y >= 0) {
                int64_t res = 1, base = x;
                for (int64_t e = y; e > 0; e >>= 1) {
                    if (e & 1 && __builtin_mul_overflow(res, base, &res)) goto overflow;
                    if (e > 1 && __builtin_mul_overflow(base, base, &base)) goto overflow;
                }
                *out = jv_int(res);
                return 0;
            }
            if (fx == 0.0 && fy < 0) return jr_fail(r, "0.0 cannot be raised to a negative power");
            if (fx < 0 && fy != floor(fy)) return jr_fail(r, "negative number raised to a fractional power (complex result) is not supported");
            *out = jv_float(pow(fx, fy));
            return 0;
        default: break;
        }
    }
    if (op == JOP_ADD && a.type == JV_STRING && b.type == JV_STRING) {
        struct jbuf buf = { 0 };
        jbuf_put(&buf, a.s.p, a.s.n);
        jbuf_put(&buf, b.s.p, b.s.n);
        int rc = buf_to_value(r, &buf, out);
        jbuf_free(&buf);
        return rc;
    }
    if (op == JOP_ADD && a.type == JV_LIST && b.type == JV_LIST && a.l->tuple == b.l->tuple) {
        struct jv_list *l = jv_list_new(r, a.l->n + b.l->n);
        if (!l) return jr_oom(r);
        for (size_t i = 0; i < a.l->n; i++) l->v[l->n++] = a.l->v[i];
        for (size_t i = 0; i < b.l->n; i++) l->v[l->n++] = b.l->v[i];
        l->tuple = a.l->tuple;
        out->type = JV_LIST;
        out->l = l;
        return 0;
    }
    if (op == JOP_MUL) {
        if ((a.type == JV_STRING || a.type == JV_LIST) && (b.type == JV_INT || b.type == JV_BOOL)) return repeat(r, a, as_i(b), out);
        if ((b.type == JV_STRING || b.type == JV_LIST) && (a.type == JV_INT || a.type == JV_BOOL)) return repeat(r, b, as_i(a), out);
    }
    if (op == JOP_ADD && (a.type == JV_STRING || a.type == JV_LIST))
        return jr_fail(r, "can only concatenate %s (not \"%s\") to %s", jv_type_name(a), jv_type_name(b), jv_type_name(a));
    if (op == JOP_MOD && a.type == JV_STRING) return jr_fail(r, "unsupported construct: printf-style string formatting with '%%'");
    return jr_fail(r, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op), jv_type_name(a), jv_type_name(b));
overflow:
    return jr_fail(r, "integer result of '%s' outside the supported 64-bit range", op_sym(op));
}

static int contains(struct jrender *r, struct jv container, struct jv item, bool *out)
{
    switch (container.type) {
    case JV_UNDEFINED: *out = false; return 0;
    case JV_STRING:
        if (item.type != JV_STRING)
            return jr_fail(r, "'in <string>' requires string as left operand, not %s", jv_type_name(item));
        if (item.s.n == 0) *out = true;
        else if (item.s.n > container.s.n) *out = false;
        else {
            *out = false;
            for (size_t i = 0; i + item.s.n <= container.s.n; i++)
                if (!memcmp(container.s.p + i, item.s.p, item.s.n)) {
                    *out = true;
                    break;
                }
        }
        return 0;
    case JV_LIST:
        *out = false;
        for (size_t i = 0; i < container.l->n && !*out; i++) *out = jv_equal(container.l->v[i], item);
        return 0;
    case JV_DICT: *out = jv_dict_get(container.d, item) != NULL; return 0;
    default: return jr_fail(r, "argument of type '%s' is not iterable", jv_type_name(container));
    }
}

/* ---- calls --------------------------------------------------------------------------- */

static int eval_args(struct jrender *r, struct jframe *f, const struct jnode *call, struct jargs *a, size_t extra_kw)
{
    memset(a, 0, sizeof *a);
    a->npos = call->body.n;
    a->nkw = call->kw.n;
    if (a->npos) {
        a->pos = jarena_alloc(&r->arena, a->npos * sizeof *a->pos);
        if (!a->pos) return jr_oom(r);
        for (size_t i = 0; i < a->npos; i++) TRY(eval(r, f, call->body.v[i], &a->pos[i]));
    }
    size_t cap = a->nkw + extra_kw;
    if (cap) {
        a->kwn = jarena_alloc(&r->arena, cap * sizeof *a->kwn);
        a->kwl = jarena_alloc(&r->arena, cap * sizeof *a->kwl);
        a->kwv = jarena_alloc(&r->arena, cap * sizeof *a->kwv);
        if (!a->kwn || !a->kwl || !a->kwv) return jr_oom(r);
        for (size_t i = 0; i < a->nkw; i++) {
            a->kwn[i] = call->kw.v[i]->name;
            a->kwl[i] = call->kw.v[i]->name_n;
            TRY(eval(r, f, call->kw.v[i]->a, &a->kwv[i]));
        }
    }
    return 0;
}

static int exec_body(struct jrender *r, struct jframe *f, const struct jnodes *body, struct jbuf *out);

/* Calls a macro (params in node->kw, body in node->body) or a call-block's caller. */
static int call_macro(struct jrender *r, const struct jv_callable *c, struct jargs *a, struct jv *out)
{
    const struct jnode *m = c->node;
    if (r->depth >= JINJA_MAX_DEPTH / 2) return jr_fail(r, "macro recursion too deep");
    struct jframe *f = frame_new(r, c->closure);
    if (!f) return jr_oom(r);
    const char *mname = c->kind == JC_CALLER ? "caller" : m->name;
    int mlen = c->kind == JC_CALLER ? 6 : (int)m->name_n;
    if (a->npos > m->kw.n) return jr_fail(r, "macro '%.*s' takes not more than %zu argument(s)", mlen, mname, m->kw.n);
    for (size_t i = 0; i < a->nkw; i++) {
        bool known = a->kwl[i] == 6 && !memcmp(a->kwn[i], "caller", 6);
        for (size_t k = 0; k < m->kw.n && !known; k++)
            known = m->kw.v[k]->name_n == a->kwl[i] && !memcmp(m->kw.v[k]->name, a->kwn[i], a->kwl[i]);
        if (!known) return jr_fail(r, "macro '%.*s' takes no keyword argument '%.*s'", mlen, mname, (int)a->kwl[i], a->kwn[i]);
        TRY(frame_set(r, f, a->kwn[i], a->kwl[i], a->kwv[i]));
    }
    for (size_t k = 0; k < m->kw.n; k++) {
        const struct jnode *p = m->kw.v[k];
        if (k < a->npos) {
            TRY(frame_set(r, f, p->name, p->name_n, a->pos[k]));
            continue;
        }
        bool given = false;
        for (size_t i = 0; i < a->nkw && !given; i++) given = a->kwl[i] == p->name_n && !memcmp(a->kwn[i], p->name, p->name_n);
        if (given) continue;
        struct jv v;
        if (p->a) TRY(eval(r, f, p->a, &v));
        else v = jv_undef_named(r, p->name, p->name_n);
        TRY(frame_set(r, f, p->name, p->name_n, v));
    }
    struct jbuf buf = { 0 };
    r->depth++;
    int saved_loop = r->loop_depth;
    r->loop_depth = 0;
    int rc = exec_body(r, f, &m->body, &buf);
    r->loop_depth = saved_loop;
    r->depth--;
    if (rc > 0) rc = 0;
    if (!rc) rc = buf_to_value(r, &buf, out);
    jbuf_free(&buf);
    return rc;
}

int jinja_call_value(struct jrender *r, struct jv fn, struct jargs *a, struct jv *out)
{
    if (fn.type == JV_UNDEFINED) return jr_undefined(r, fn);
    if (fn.type != JV_CALLABLE) return jr_fail(r, "'%s' object is not callable", jv_type_name(fn));
    switch (fn.c->kind) {
    case JC_MACRO:
    case JC_CALLER: return call_macro(r, fn.c, a, out);
    case JC_METHOD: return jinja_call_method(r, fn.c->id, fn.c->self, a, out);
    case JC_GLOBAL: return jinja_call_global(r, fn.c->id, a, out);
    }
    return jr_fail(r, "not callable");
}

static int eval_call(struct jrender *r, struct jframe *f, const struct jnode *n, struct jv *caller, struct jv *out)
{
    struct jargs a;
    const struct jnode *fn = n->a;
    struct jv callee;
    if (fn->kind == JN_GETATTR && n->id >= 0) {
        struct jv obj;
        TRY(eval(r, f, fn->a, &obj));
        if (obj.type == JV_UNDEFINED) return jr_undefined(r, obj);
        TRY(eval_args(r, f, n, &a, caller ? 1 : 0));
        r->line = n->line;
        if (jinja_has_method(obj, n->id)) return jinja_call_method(r, n->id, obj, &a, out);
        TRY(jinja_getattr(r, obj, fn->name, fn->name_n, &callee));
    } else if (fn->kind == JN_NAME) {
        struct jv *v = frame_lookup(f, fn->name, fn->name_n);
        TRY(eval_args(r, f, n, &a, caller ? 1 : 0));
        r->line = n->line;
        if (!v && n->id >= 0) return jinja_call_global(r, n->id, &a, out);
        callee = v ? *v : jv_undef_named(r, fn->name, fn->name_n);
    } else {
        TRY(eval(r, f, fn, &callee));
        TRY(eval_args(r, f, n, &a, caller ? 1 : 0));
    }
    if (caller) {
        a.kwn[a.nkw] = "caller";
        a.kwl[a.nkw] = 6;
        a.kwv[a.nkw] = *caller;
        a.nkw++;
    }
    return jinja_call_value(r, callee, &a, out);
}

/* ---- expressions -------------------------------------------------------------------- */

static int eval(struct jrender *r, struct jframe *f, const struct jnode *n, struct jv *out)
{
    r->line = n->line;
    switch (n->kind) {
    case JN_CONST: *out = n->cval; return 0;
    case JN_NAME: {
        struct jv *v = frame_lookup(f, n->name, n->name_n);
        if (v) {
            *out = *v;
            return 0;
        }
        int id = jinja_global_id(n->name, n->name_n);
        if (id >= 0) return new_callable(r, JC_GLOBAL, id, jv_none(), NULL, NULL, out);
        *out = jv_undef_named(r, n->name, n->name_n);
        return 0;
    }
    case JN_BLOCKVAL: *out = r->blockval; return 0;
    case JN_LIST:
    case JN_TUPLE: {
        struct jv_list *l = jv_list_new(r, n->body.n);
        if (!l) return jr_oom(r);
        for (size_t i = 0; i < n->body.n; i++) TRY(eval(r, f, n->body.v[i], &l->v[i]));
        l->n = n->body.n;
        l->tuple = n->kind == JN_TUPLE;
        out->type = JV_LIST;
        out->l = l;
        return 0;
    }
    case JN_DICT: {
        struct jv_dict *d = jv_dict_new(r, n->body.n);
        if (!d) return jr_oom(r);
        for (size_t i = 0; i < n->body.n; i++) {
            struct jv k, v;
            TRY(eval(r, f, n->body.v[i], &k));
            TRY(eval(r, f, n->body2.v[i], &v));
            if (k.type == JV_LIST && !k.l->tuple) return jr_fail(r, "unhashable type: 'list'");
            if (k.type == JV_DICT) return jr_fail(r, "unhashable type: 'dict'");
            TRY(jv_dict_set(r, d, k, v));
        }
        out->type = JV_DICT;
        out->d = d;
        return 0;
    }
    case JN_GETATTR: {
        struct jv obj;
        TRY(eval(r, f, n->a, &obj));
        r->line = n->line;
        return jinja_getattr(r, obj, n->name, n->name_n, out);
    }
    case JN_GETITEM: {
        struct jv obj, key;
        TRY(eval(r, f, n->a, &obj));
        TRY(eval(r, f, n->b, &key));
        r->line = n->line;
        return jinja_getitem(r, obj, key, out);
    }
    case JN_SLICE: return eval_slice(r, f, n, out);
    case JN_CALL: return eval_call(r, f, n, NULL, out);
    case JN_FILTER: {
        struct jv in;
        struct jargs a;
        TRY(eval(r, f, n->a, &in));
        TRY(eval_args(r, f, n, &a, 0));
        r->line = n->line;
        return jinja_call_filter(r, n->id, in, &a, out);
    }
    case JN_TEST: {
        struct jv in;
        struct jargs a;
        bool res;
        TRY(eval(r, f, n->a, &in));
        TRY(eval_args(r, f, n, &a, 0));
        r->line = n->line;
        TRY(jinja_call_test(r, n->id, in, &a, &res));
        *out = jv_bool(res != n->neg);
        return 0;
    }
    case JN_NOT: {
        struct jv v;
        TRY(eval(r, f, n->a, &v));
        *out = jv_bool(!jv_truthy(v));
        return 0;
    }
    case JN_NEG:
    case JN_POS: {
        struct jv v;
        TRY(eval(r, f, n->a, &v));
        r->line = n->line;
        if (v.type == JV_UNDEFINED) return jr_undefined(r, v);
        if (v.type == JV_FLOAT) *out = jv_float(n->kind == JN_NEG ? -v.f : v.f);
        else if (v.type == JV_INT || v.type == JV_BOOL) {
            int64_t x = as_i(v);
            if (n->kind == JN_NEG && x == INT64_MIN) return jr_fail(r, "integer negation outside the supported 64-bit range");
            *out = jv_int(n->kind == JN_NEG ? -x : x);
        } else {
            return jr_fail(r, "bad operand type for unary %c: '%s'", n->kind == JN_NEG ? '-' : '+', jv_type_name(v));
        }
        return 0;
    }
    case JN_BINOP: {
        struct jv a, b;
        TRY(eval(r, f, n->a, &a));
        TRY(eval(r, f, n->b, &b));
        r->line = n->line;
        return binop(r, n->op, a, b, out);
    }
    case JN_COMPARE: {
        struct jv left;
        TRY(eval(r, f, n->a, &left));
        for (size_t i = 0; i < n->body.n; i++) {
            const struct jnode *o = n->body.v[i];
            struct jv right;
            TRY(eval(r, f, o->a, &right));
            r->line = n->line;
            bool res;
            int c;
            switch (o->op) {
            case JOP_EQ: res = jv_equal(left, right); break;
            case JOP_NE: res = !jv_equal(left, right); break;
            case JOP_IN: TRY(contains(r, right, left, &res)); break;
            case JOP_NOTIN: TRY(contains(r, right, left, &res)); res = !res; break;
            default:
                if (left.type == JV_UNDEFINED) return jr_undefined(r, left);
                if (right.type == JV_UNDEFINED) return jr_undefined(r, right);
                if ((left.type == JV_FLOAT && isnan(left.f)) || (right.type == JV_FLOAT && isnan(right.f))) {
                    res = false;
                    break;
                }
                TRY(jv_compare(r, left, right, &c));
                res = o->op == JOP_LT ? c < 0 : o->op == JOP_LE ? c <= 0 : o->op == JOP_GT ? c > 0 : c >= 0;
            }
            if (!res) {
                *out = jv_bool(false);
                return 0;
            }
            left = right;
        }
        *out = jv_bool(true);
        return 0;
    }
    case JN_AND:
    case JN_OR: {
        TRY(eval(r, f, n->a, out));
        if (jv_truthy(*out) == (n->kind == JN_OR)) return 0;
        return eval(r, f, n->b, out);
    }
    case JN_COND: {
        struct jv c;
        TRY(eval(r, f, n->a, &c));
        if (jv_truthy(c)) return eval(r, f, n->b, out);
        if (n->c) return eval(r, f, n->c, out);
        *out = jv_undef_hint(r, "the inline if-expression evaluated to false and no else section was defined.");
        return 0;
    }
    default: return jr_fail(r, "internal error: node %d is not an expression", (int)n->kind);
    }
}

/* ---- statements ------------------------------------------------------------------ */

static int assign(struct jrender *r, struct jframe *f, const struct jnode *target, struct jv v)
{
    if (target->kind == JN_NAME) return frame_set(r, f, target->name, target->name_n, v);
    if (target->kind == JN_NSREF) {
        struct jv *ns = frame_lookup(f, target->name, target->name_n);
        if (!ns) return jr_fail(r, "'%.*s' is undefined", (int)target->name_n, target->name);
        if (ns->type != JV_NAMESPACE) return jr_fail(r, "cannot assign attribute on non-namespace object");
        return jv_dict_set(r, ns->d, target->a->cval, v);
    }
    /* tuple unpacking */
    struct jv_list *items;
    if (v.type == JV_DICT || v.type == JV_STRING || v.type == JV_LIST) TRY(jv_iterate(r, v, &items));
    else return jr_fail(r, "cannot unpack non-iterable %s object", jv_type_name(v));
    if (items->n != target->body.n)
        return jr_fail(r, items->n > target->body.n ? "too many values to unpack (expected %zu)" : "not enough values to unpack (expected %zu)",
                       target->body.n);
    for (size_t i = 0; i < items->n; i++) TRY(assign(r, f, target->body.v[i], items->v[i]));
    return 0;
}

static int emit(struct jrender *r, struct jbuf *out, struct jv v)
{
    TRY(jv_to_str(r, out, v));
    if (out->oom) return jr_oom(r);
    return 0;
}

static int exec_for(struct jrender *r, struct jframe *f, const struct jnode *n, struct jbuf *out)
{
    struct jv seq;
    struct jv_list *items;
    TRY(eval(r, f, n->b, &seq));
    r->line = n->line;
    if (seq.type == JV_NAMESPACE || seq.type == JV_NONE || seq.type == JV_INT || seq.type == JV_FLOAT ||
        seq.type == JV_BOOL || seq.type == JV_CALLABLE || seq.type == JV_LOOP)
        return jr_fail(r, "'%s' object is not iterable", jv_type_name(seq));
    TRY(jv_iterate(r, seq, &items));
    struct jframe *it = frame_new(r, f);
    if (!it) return jr_oom(r);
    if (n->c) { /* {% for x in xs if cond %}: filter first, loop.* counts what is left */
        struct jv_list *kept = jv_list_new(r, 0);
        if (!kept) return jr_oom(r);
        for (size_t i = 0; i < items->n; i++) {
            struct jv keep;
            TRY(step(r));
            it->n = 0;
            TRY(assign(r, it, n->a, items->v[i]));
            TRY(eval(r, it, n->c, &keep));
            if (jv_truthy(keep)) TRY(jv_list_push(r, kept, items->v[i]));
        }
        items = kept;
    }
    if (items->n == 0) {
        it->n = 0;
        return exec_body(r, it, &n->body2, out);
    }
    struct jv_loop *L = jarena_alloc(&r->arena, sizeof *L);
    if (!L) return jr_oom(r);
    L->items = items;
    L->depth = 1;
    struct jv lv = { .type = JV_LOOP, .loop = L };
    r->loop_depth++;
    for (size_t i = 0; i < items->n; i++) {
        TRY(step(r));
        L->index0 = i;
        it->n = 0; /* fresh scope per iteration, as in jinja2 */
        TRY(frame_set(r, it, "loop", 4, lv));
        TRY(assign(r, it, n->a, items->v[i]));
        int rc = exec_body(r, it, &n->body, out);
        if (rc < 0) {
            r->loop_depth--;
            return rc;
        }
        if (rc == JR_BREAK) break;
    }
    r->loop_depth--;
    return 0;
}

static int capture(struct jrender *r, struct jframe *f, const struct jnodes *body, struct jv *out)
{
    struct jbuf buf = { 0 };
    if (r->depth >= JINJA_MAX_DEPTH / 2) return jr_fail(r, "template nested too deeply");
    r->depth++;
    int rc = exec_body(r, f, body, &buf);
    r->depth--;
    if (rc >= 0) rc = buf_to_value(r, &buf, out);
    jbuf_free(&buf);
    return rc;
}

static int apply_block_filters(struct jrender *r, struct jframe *f, const struct jnode *chain, struct jv in, struct jv *out)
{
    if (!chain) {
        *out = in;
        return 0;
    }
    struct jv saved = r->blockval;
    r->blockval = in;
    int rc = eval(r, f, chain, out);
    r->blockval = saved;
    return rc;
}

static int exec_stmt(struct jrender *r, struct jframe *f, const struct jnode *n, struct jbuf *out)
{
    TRY(step(r));
    r->line = n->line;
    switch (n->kind) {
    case JN_DATA:
        jbuf_put(out, n->cval.s.p, n->cval.s.n);
        return out->oom ? jr_oom(r) : 0;
    case JN_OUTPUT: {
        struct jv v;
        TRY(eval(r, f, n->a, &v));
        return emit(r, out, v);
    }
    case JN_IF: {
        struct jv c;
        TRY(eval(r, f, n->a, &c));
        return exec_body(r, f, jv_truthy(c) ? &n->body : &n->body2, out);
    }
    case JN_FOR: return exec_for(r, f, n, out);
    case JN_SET: {
        struct jv v;
        TRY(eval(r, f, n->b, &v));
        r->line = n->line;
        return assign(r, f, n->a, v);
    }
    case JN_SETBLOCK: {
        struct jv v;
        TRY(capture(r, f, &n->body, &v));
        TRY(apply_block_filters(r, f, n->b, v, &v));
        return assign(r, f, n->a, v);
    }
    case JN_FILTERBLOCK: {
        struct jv v;
        TRY(capture(r, f, &n->body, &v));
        TRY(apply_block_filters(r, f, n->b, v, &v));
        return emit(r, out, v);
    }
    case JN_MACRO: {
        struct jv m;
        TRY(new_callable(r, JC_MACRO, -1, jv_none(), n, f, &m));
        return frame_set(r, f, n->name, n->name_n, m);
    }
    case JN_CALLBLOCK: {
        struct jv caller, v;
        TRY(new_callable(r, JC_CALLER, -1, jv_none(), n, f, &caller));
        TRY(eval_call(r, f, n->a, &caller, &v));
        return emit(r, out, v);
    }
    case JN_WITH: {
        struct jframe *w = frame_new(r, f);
        if (!w) return jr_oom(r);
        for (size_t i = 0; i < n->kw.n; i++) {
            struct jv v;
            TRY(eval(r, f, n->kw.v[i]->a, &v));
            TRY(frame_set(r, w, n->kw.v[i]->name, n->kw.v[i]->name_n, v));
        }
        return exec_body(r, w, &n->body, out);
    }
    case JN_BREAK: return JR_BREAK;
    case JN_CONTINUE: return JR_CONTINUE;
    default: return jr_fail(r, "internal error: node %d is not a statement", (int)n->kind);
    }
}

static int exec_body(struct jrender *r, struct jframe *f, const struct jnodes *body, struct jbuf *out)
{
    for (size_t i = 0; i < body->n; i++) {
        int rc = exec_stmt(r, f, body->v[i], out);
        if (rc) return rc;
    }
    return 0;
}

/* ---- public API ------------------------------------------------------------------------ */

int jinja_parse(const char *src, size_t len, struct jinja_template **out, char *err, size_t errlen)
{
    *out = NULL;
    struct jinja_template *t = calloc(1, sizeof *t);
    if (!t) return err_set(err, errlen, ERR_NOMEM, "out of memory");
    struct jtoks toks = { 0 };
    int rc = jinja_lex(src, len, &t->arena, &toks, err, errlen);
    if (!rc) rc = jinja_parse_tokens(t, &toks, err, errlen);
    free(toks.v);
    if (rc) {
        jinja_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void jinja_free(struct jinja_template *t)
{
    if (!t) return;
    jarena_free(&t->arena);
    free(t);
}

int jinja_render(const struct jinja_template *t, const struct cJSON *ctx,
                 const struct jinja_render_opts *opts, char **out, size_t *out_len,
                 char *err, size_t errlen)
{
    static const struct jinja_render_opts default_opts = { 0 };
    *out = NULL;
    if (out_len) *out_len = 0;
    struct jrender r = { .opts = opts ? opts : &default_opts, .err = err, .errlen = errlen };
    r.arena.limit = JINJA_MAX_ARENA;
    struct jbuf buf = { 0 };
    int rc = 0;
    r.root = frame_new(&r, NULL);
    if (!r.root) {
        rc = jr_oom(&r);
        goto done;
    }
    if (ctx && !cJSON_IsObject(ctx) && !cJSON_IsNull(ctx)) {
        rc = err_set(err, errlen, ERR_INVALID, "template context must be a JSON object");
        goto done;
    }
    if (ctx && cJSON_IsObject(ctx))
        for (const cJSON *c = ctx->child; c; c = c->next) {
            struct jv v;
            if ((rc = jv_from_json(&r, c, &v, 1))) goto done;
            const char *k = c->string ? c->string : "";
            if ((rc = frame_set(&r, r.root, k, strlen(k), v))) goto done;
        }
    rc = exec_body(&r, r.root, &t->body, &buf);
    if (rc > 0) rc = 0;
    if (!rc && buf.oom) rc = jr_oom(&r);
    if (rc) goto done;
    if (!buf.p) {
        buf.p = malloc(1);
        if (!buf.p) {
            rc = err_set(err, errlen, ERR_NOMEM, "out of memory");
            goto done;
        }
        buf.p[0] = 0;
    }
    *out = buf.p;
    if (out_len) *out_len = buf.n;
    buf.p = NULL;
done:
    if (rc && !r.failed && err && errlen && !err[0]) err_set(err, errlen, rc, "template render failed");
    jbuf_free(&buf);
    jarena_free(&r.arena);
    return rc;
}

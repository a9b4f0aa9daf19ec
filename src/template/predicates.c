/* predicates.c — jinja2 tests (`x is defined`, `is string`, `is equalto 3`, ...), as in
 * jinja2 3.1's tests.py, in one const table that the parser resolves names against.
 * Python type rules apply: bool counts as a number, Undefined is iterable and a sequence
 * (its __iter__/__len__ exist), `is false` / `is true` are identity tests on bools.
 */
#include "template/jinja_internal.h"
#include "util/err.h"

#include <math.h>
#include <string.h>
#include <utf8proc.h>



/* ---- tests ----------------------------------------------------------------------------- */

#define TEST(name) static int name(struct jrender *r, struct jv v, struct jargs *a, bool *out)

static int test_arg(struct jrender *r, struct jargs *a, const char *nm, struct jv *x)
{
    if (!jargs_get(a, 0, "other", x) && !jargs_get(a, 0, "value", x) && !jargs_get(a, 0, "num", x) && !jargs_get(a, 0, "seq", x))
        return jr_fail(r, "test '%s' needs an argument", nm);
    return jargs_done(r, a, 1, nm);
}

#define SIMPLE_TEST(name, label, expr)               \
    TEST(name)                                \
    {                                         \
        TRY(jargs_done(r, a, 0, label));      \
        (void)v;                              \
        *out = (expr);                        \
        return 0;                             \
    }

SIMPLE_TEST(t_defined, "defined", v.type != JV_UNDEFINED)
SIMPLE_TEST(t_undefined, "undefined", v.type == JV_UNDEFINED)
SIMPLE_TEST(t_none, "none", v.type == JV_NONE)
SIMPLE_TEST(t_boolean, "boolean", v.type == JV_BOOL)
SIMPLE_TEST(t_false, "false", v.type == JV_BOOL && !v.b)
SIMPLE_TEST(t_true, "true", v.type == JV_BOOL && v.b)
SIMPLE_TEST(t_integer, "integer", v.type == JV_INT)
SIMPLE_TEST(t_float, "float", v.type == JV_FLOAT)
SIMPLE_TEST(t_number, "number", v.type == JV_INT || v.type == JV_FLOAT || v.type == JV_BOOL)
SIMPLE_TEST(t_string, "string", v.type == JV_STRING)
SIMPLE_TEST(t_mapping, "mapping", v.type == JV_DICT)
SIMPLE_TEST(t_iterable, "iterable", v.type == JV_STRING || v.type == JV_LIST || v.type == JV_DICT || v.type == JV_UNDEFINED || v.type == JV_LOOP)
SIMPLE_TEST(t_sequence, "sequence", v.type == JV_STRING || v.type == JV_LIST || v.type == JV_DICT || v.type == JV_UNDEFINED)
SIMPLE_TEST(t_callable, "callable", v.type == JV_CALLABLE || v.type == JV_LOOP)
SIMPLE_TEST(t_escaped, "escaped", false)

static int parity(struct jrender *r, struct jv v, int64_t *out)
{
    if (v.type == JV_INT || v.type == JV_BOOL) *out = (v.type == JV_INT ? v.i : v.b) & 1;
    else if (v.type == JV_FLOAT) *out = fmod(fabs(v.f), 2.0) == 1.0;
    else return jr_fail(r, "not all arguments converted during string formatting");
    return 0;
}
TEST(t_odd)
{
    int64_t p = 0;
    TRY(jargs_done(r, a, 0, "odd"));
    TRY(parity(r, v, &p));
    *out = p == 1;
    return 0;
}
TEST(t_even)
{
    int64_t p = 0;
    TRY(jargs_done(r, a, 0, "even"));
    TRY(parity(r, v, &p));
    *out = p == 0;
    return 0;
}
TEST(t_divisibleby)
{
    struct jv n;
    TRY(test_arg(r, a, "divisibleby", &n));
    if ((v.type == JV_INT || v.type == JV_BOOL) && (n.type == JV_INT || n.type == JV_BOOL)) {
        int64_t x = v.type == JV_INT ? v.i : v.b, y = n.type == JV_INT ? n.i : n.b;
        if (y == 0) return jr_fail(r, "integer division or modulo by zero");
        *out = y == -1 || x % y == 0;
        return 0;
    }
    if ((v.type == JV_FLOAT || v.type == JV_INT) && (n.type == JV_FLOAT || n.type == JV_INT)) {
        double y = n.type == JV_FLOAT ? n.f : (double)n.i;
        if (y == 0) return jr_fail(r, "float modulo");
        *out = fmod(v.type == JV_FLOAT ? v.f : (double)v.i, y) == 0;
        return 0;
    }
    return jr_fail(r, "divisibleby needs numbers");
}
TEST(t_eq)
{
    struct jv x;
    TRY(test_arg(r, a, "eq", &x));
    *out = jv_equal(v, x);
    return 0;
}
TEST(t_ne)
{
    struct jv x;
    TRY(test_arg(r, a, "ne", &x));
    *out = !jv_equal(v, x);
    return 0;
}
static int ordered(struct jrender *r, struct jv v, struct jargs *a, bool *out, int want)
{
    struct jv x;
    int c;
    TRY(test_arg(r, a, "comparison", &x));
    if (v.type == JV_UNDEFINED) return jr_undefined(r, v);
    if (x.type == JV_UNDEFINED) return jr_undefined(r, x);
    TRY(jv_compare(r, v, x, &c));
    *out = want == 0 ? c < 0 : want == 1 ? c <= 0 : want == 2 ? c > 0 : c >= 0;
    return 0;
}
TEST(t_lt) { return ordered(r, v, a, out, 0); }
TEST(t_le) { return ordered(r, v, a, out, 1); }
TEST(t_gt) { return ordered(r, v, a, out, 2); }
TEST(t_ge) { return ordered(r, v, a, out, 3); }
TEST(t_in)
{
    struct jv seq;
    TRY(test_arg(r, a, "in", &seq));
    if (seq.type == JV_STRING) {
        if (v.type != JV_STRING) return jr_fail(r, "'in <string>' requires string as left operand, not %s", jv_type_name(v));
        *out = jinja_find_bytes(seq.s.p, seq.s.n, v.s.p, v.s.n) != NULL;
    } else if (seq.type == JV_LIST) {
        *out = false;
        for (size_t i = 0; i < seq.l->n && !*out; i++) *out = jv_equal(seq.l->v[i], v);
    } else if (seq.type == JV_DICT) {
        *out = jv_dict_get(seq.d, v) != NULL;
    } else if (seq.type == JV_UNDEFINED) {
        *out = false;
    } else {
        return jr_fail(r, "argument of type '%s' is not iterable", jv_type_name(seq));
    }
    return 0;
}
TEST(t_sameas)
{
    struct jv x;
    TRY(test_arg(r, a, "sameas", &x));
    if (v.type != x.type) *out = false;
    else if (v.type == JV_LIST) *out = v.l == x.l;
    else if (v.type == JV_DICT || v.type == JV_NAMESPACE) *out = v.d == x.d;
    else *out = jv_equal(v, x);
    return 0;
}
static int case_test(struct jrender *r, struct jv v, struct jargs *a, bool *out, bool upper)
{
    struct jv s;
    TRY(jargs_done(r, a, 0, upper ? "upper" : "lower"));
    TRY(jv_stringify(r, v, &s));
    bool cased = false, ok = true;
    const char *p = s.s.p, *end = p + s.s.n;
    while (p < end) {
        int l;
        uint32_t c = jinja_utf8_dec(p, end, &l);
        int k = jinja_cp_cat(c);
        if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) {
            if (!upper) ok = false;
            cased = true;
        } else if (k == UTF8PROC_CATEGORY_LL) {
            if (upper) ok = false;
            cased = true;
        }
        p += l;
    }
    *out = ok && cased;
    return 0;
}
TEST(t_lower) { return case_test(r, v, a, out, false); }
TEST(t_upper) { return case_test(r, v, a, out, true); }
TEST(t_filter)
{
    TRY(jargs_done(r, a, 0, "filter"));
    *out = v.type == JV_STRING && jinja_filter_id(v.s.p, v.s.n) >= 0;
    return 0;
}
TEST(t_test)
{
    TRY(jargs_done(r, a, 0, "test"));
    *out = v.type == JV_STRING && jinja_test_id(v.s.p, v.s.n) >= 0;
    return 0;
}

static const struct {
    const char *name;
    jinja_test_fn fn;
} tests[] = {
    { "boolean", t_boolean }, { "callable", t_callable }, { "defined", t_defined },
    { "divisibleby", t_divisibleby }, { "eq", t_eq }, { "equalto", t_eq }, { "==", t_eq },
    { "escaped", t_escaped }, { "even", t_even }, { "false", t_false }, { "filter", t_filter },
    { "float", t_float }, { "ge", t_ge }, { ">=", t_ge }, { "gt", t_gt }, { "greaterthan", t_gt },
    { ">", t_gt }, { "in", t_in }, { "integer", t_integer }, { "iterable", t_iterable },
    { "le", t_le }, { "<=", t_le }, { "lower", t_lower }, { "lt", t_lt }, { "lessthan", t_lt },
    { "<", t_lt }, { "mapping", t_mapping }, { "ne", t_ne }, { "!=", t_ne }, { "none", t_none },
    { "number", t_number }, { "odd", t_odd }, { "sameas", t_sameas }, { "sequence", t_sequence },
    { "string", t_string }, { "test", t_test }, { "true", t_true }, { "undefined", t_undefined },
    { "upper", t_upper },
};

int jinja_test_id(const char *name, size_t n) { NAME_LOOKUP(tests, name, n); }

int jinja_call_test(struct jrender *r, int id, struct jv in, struct jargs *a, bool *out)
{
    return tests[id].fn(r, in, a, out);
}


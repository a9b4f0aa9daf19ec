/* parser.c — token stream → AST, following jinja2 3.1's Parser (same precedence, same
 * statement grammar) for the subset in jinja.h.
 *
 * Every name that must resolve to code is resolved here: filters, tests, globals and
 * method names get their builtin ids, calls of plain names must be a global, a macro
 * defined somewhere in the template, or `caller` inside a macro. Anything else —
 * unknown tags, filters, tests, functions, methods, `recursive` loops, `*args` — is a
 * parse error naming the line and the construct, so rendering never meets an unknown
 * construct. Nesting (statements and expression trees) is capped at JINJA_MAX_DEPTH
 * (expression height at 2x) so a hostile template cannot exhaust the stack.
 */
#include "template/jinja_internal.h"
#include "util/err.h"

#include <stdio.h>
#include <string.h>

struct parser {
    const struct jtoks *t;
    size_t i;
    struct jarena *a;
    char *err;
    size_t errlen;
    int depth;      /* statement + expression recursion */
    int loop_depth; /* for break/continue */
    int macro_depth;
    struct jnodes calls;  /* JN_CALL nodes with a JN_NAME callee, checked at the end */
    struct jnodes macros; /* JN_MACRO nodes */
};

#define MAX_HEIGHT (2 * JINJA_MAX_DEPTH)

static const struct jtok *cur(struct parser *p) { return &p->t->v[p->i]; }
static const struct jtok *peek(struct parser *p, size_t k)
{
    size_t j = p->i + k;
    return j < p->t->n ? &p->t->v[j] : &p->t->v[p->t->n - 1];
}
static void advance(struct parser *p)
{
    if (p->i + 1 < p->t->n) p->i++;
}

static bool tok_is(const struct jtok *t, enum jtok_type type, const char *s)
{
    return t->type == type && (!s || (t->n == strlen(s) && memcmp(t->s, s, t->n) == 0));
}
static bool is_op(struct parser *p, const char *op) { return tok_is(cur(p), JT_OP, op); }
static bool is_name(struct parser *p, const char *nm) { return tok_is(cur(p), JT_NAME, nm); }

static const char *tok_desc(const struct jtok *t, char *buf, size_t len)
{
    switch (t->type) {
    case JT_EOF: return "end of template";
    case JT_DATA: return "template data";
    case JT_VAR_BEGIN: return "'{{'";
    case JT_VAR_END: return "end of print statement";
    case JT_BLOCK_BEGIN: return "'{%'";
    case JT_BLOCK_END: return "end of statement block";
    case JT_STRING: return "string literal";
    case JT_INT: return "integer";
    case JT_FLOAT: return "float";
    default:
        snprintf(buf, len, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s);
        return buf;
    }
}

static int fail(struct parser *p, const char *fmt, const char *arg)
{
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg);
    return err_set(p->err, p->errlen, ERR_FORMAT, "line %d: %s", cur(p)->line, msg);
}

static int fail_tok(struct parser *p, const char *what)
{
    char buf[64], msg[256];
    snprintf(msg, sizeof msg, "%s, got %s", what, tok_desc(cur(p), buf, sizeof buf));
    return err_set(p->err, p->errlen, ERR_FORMAT, "line %d: %s", cur(p)->line, msg);
}

static int expect_op(struct parser *p, const char *op)
{
    if (!is_op(p, op)) {
        char what[32];
        snprintf(what, sizeof what, "expected '%s'", op);
        return fail_tok(p, what);
    }
    advance(p);
    return 0;
}

static int expect_type(struct parser *p, enum jtok_type type, const char *what)
{
    if (cur(p)->type != type) return fail_tok(p, what);
    advance(p);
    return 0;
}

static struct jnode *node_new(struct parser *p, enum jnode_kind kind)
{
    struct jnode *n = jarena_alloc(p->a, sizeof *n);
    if (!n) return NULL;
    n->kind = kind;
    n->line = cur(p)->line;
    n->id = -1;
    return n;
}

static int push(struct parser *p, struct jnodes *l, struct jnode *n)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        struct jnode **v = jarena_alloc(p->a, cap * sizeof *v);
        if (!v) return err_set(p->err, p->errlen, ERR_NOMEM, "out of memory");
        if (l->n) memcpy(v, l->v, l->n * sizeof *v);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = n;
    return 0;
}

#define NEW(var, kind)                                                                \
    struct jnode *var = node_new(p, kind);                                            \
    if (!var) return err_set(p->err, p->errlen, ERR_NOMEM, "out of memory")

/* ---- expressions ----------------------------------------------------------------- */

static int parse_expression(struct parser *p, bool condexpr, struct jnode **out);
static int parse_tuple(struct parser *p, bool simplified, bool condexpr, const char *extra_end,
                       bool explicit_parens, struct jnode **out);
static int parse_unary(struct parser *p, bool with_filter, struct jnode **out);

static int enter(struct parser *p)
{
    if (++p->depth > JINJA_MAX_DEPTH) return fail(p, "template nested too deeply (limit %s)", "256");
    return 0;
}

/* Operator chains (a + b + c ...) build left-deep trees without recursing in the
 * parser; their length is capped so evaluation recursion stays bounded too. */
static int bump_chain(struct parser *p, int *chain)
{
    if (++*chain > MAX_HEIGHT) return fail(p, "expression chain too long (limit %s operators)", "512");
    return 0;
}

static int parse_call_args(struct parser *p, struct jnode *call)
{
    TRY(expect_op(p, "("));
    bool first = true;
    while (!is_op(p, ")")) {
        if (!first) TRY(expect_op(p, ","));
        first = false;
        if (is_op(p, ")")) break;
        if (is_op(p, "*") || is_op(p, "**")) return fail(p, "unsupported construct: %s in call arguments", "*args/**kwargs");
        if (cur(p)->type == JT_NAME && tok_is(peek(p, 1), JT_OP, "=")) {
            NEW(kw, JN_KWARG);
            kw->name = cur(p)->s;
            kw->name_n = cur(p)->n;
            advance(p);
            advance(p);
            TRY(parse_expression(p, true, &kw->a));
            TRY(push(p, &call->kw, kw));
        } else {
            if (call->kw.n) return fail(p, "positional argument follows keyword argument%s", "");
            struct jnode *arg;
            TRY(parse_expression(p, true, &arg));
            TRY(push(p, &call->body, arg));
        }
    }
    advance(p);
    return 0;
}

static int dotted_name(struct parser *p, char *buf, size_t len)
{
    if (cur(p)->type != JT_NAME) return fail_tok(p, "expected a name");
    size_t n = 0;
    for (;;) {
        const struct jtok *t = cur(p);
        if (n + t->n + 2 > len) return fail(p, "name too long%s", "");
        memcpy(buf + n, t->s, t->n);
        n += t->n;
        advance(p);
        if (is_op(p, ".") && peek(p, 1)->type == JT_NAME) {
            buf[n++] = '.';
            advance(p);
        } else {
            break;
        }
    }
    buf[n] = 0;
    return 0;
}

static int parse_filter(struct parser *p, struct jnode *node, struct jnode **out)
{
    int chain = 0;
    while (is_op(p, "|")) {
        advance(p);
        TRY(bump_chain(p, &chain));
        char name[128];
        int line = cur(p)->line;
        TRY(dotted_name(p, name, sizeof name));
        NEW(f, JN_FILTER);
        f->line = line;
        f->a = node;
        f->name = jarena_strdup(p->a, name, strlen(name));
        f->name_n = strlen(name);
        f->id = jinja_filter_id(name, f->name_n);
        if (f->id < 0) return err_set(p->err, p->errlen, ERR_UNSUPPORTED, "line %d: no filter named '%s'", line, name);
        if (is_op(p, "(")) TRY(parse_call_args(p, f));
        node = f;
    }
    *out = node;
    return 0;
}

static int parse_primary(struct parser *p, struct jnode **out);
static int parse_postfix(struct parser *p, struct jnode *node, struct jnode **out);

static int parse_test(struct parser *p, struct jnode *node, struct jnode **out)
{
    int line = cur(p)->line;
    advance(p); /* 'is' */
    bool neg = false;
    if (is_name(p, "not")) {
        neg = true;
        advance(p);
    }
    char name[128];
    TRY(dotted_name(p, name, sizeof name));
    NEW(t, JN_TEST);
    t->line = line;
    t->a = node;
    t->neg = neg;
    t->name = jarena_strdup(p->a, name, strlen(name));
    t->name_n = strlen(name);
    t->id = jinja_test_id(name, t->name_n);
    if (t->id < 0) return err_set(p->err, p->errlen, ERR_UNSUPPORTED, "line %d: no test named '%s'", line, name);
    const struct jtok *c = cur(p);
    if (is_op(p, "(")) {
        TRY(parse_call_args(p, t));
    } else if ((c->type == JT_NAME || c->type == JT_STRING || c->type == JT_INT || c->type == JT_FLOAT ||
                is_op(p, "(") || is_op(p, "[") || is_op(p, "{")) &&
               !is_name(p, "else") && !is_name(p, "or") && !is_name(p, "and")) {
        if (is_name(p, "is")) return fail(p, "you cannot chain multiple tests with 'is'%s", "");
        struct jnode *arg;
        TRY(parse_primary(p, &arg));
        TRY(parse_postfix(p, arg, &arg));
        TRY(push(p, &t->body, arg));
    }
    *out = t;
    return 0;
}

static int parse_subscribed(struct parser *p, struct jnode **out)
{
    struct jnode *args[3] = { NULL, NULL, NULL };
    if (is_op(p, ":")) {
        advance(p);
    } else {
        struct jnode *n;
        TRY(parse_expression(p, true, &n));
        if (!is_op(p, ":")) {
            *out = n;
            return 0;
        }
        advance(p);
        args[0] = n;
    }
    if (!is_op(p, ":") && !is_op(p, "]") && !is_op(p, ",")) TRY(parse_expression(p, true, &args[1]));
    if (is_op(p, ":")) {
        advance(p);
        if (!is_op(p, "]") && !is_op(p, ",")) TRY(parse_expression(p, true, &args[2]));
    }
    NEW(s, JN_SLICE);
    s->b = args[0];
    s->c = args[1];
    s->d = args[2];
    *out = s;
    return 0;
}

static int parse_postfix_one(struct parser *p, struct jnode *node, struct jnode **out)
{
    if (is_op(p, ".")) {
        advance(p);
        const struct jtok *t = cur(p);
        if (t->type == JT_NAME) {
            NEW(g, JN_GETATTR);
            g->a = node;
            g->name = t->s;
            g->name_n = t->n;
            advance(p);
            *out = g;
            return 0;
        }
        if (t->type == JT_INT) {
            NEW(g, JN_GETITEM);
            NEW(k, JN_CONST);
            k->cval = jv_int(t->i);
            g->a = node;
            g->b = k;
            advance(p);
            *out = g;
            return 0;
        }
        return fail_tok(p, "expected a name or number after '.'");
    }
    if (is_op(p, "[")) {
        advance(p);
        NEW(g, JN_GETITEM);
        struct jnode *first = NULL;
        TRY(parse_subscribed(p, &first));
        if (is_op(p, ",")) {
            NEW(tup, JN_TUPLE);
            TRY(push(p, &tup->body, first));
            while (is_op(p, ",")) {
                advance(p);
                if (is_op(p, "]")) break;
                struct jnode *n;
                TRY(parse_subscribed(p, &n));
                TRY(push(p, &tup->body, n));
            }
            first = tup;
        }
        TRY(expect_op(p, "]"));
        if (first->kind == JN_SLICE) {
            first->a = node;
            *out = first;
        } else {
            g->a = node;
            g->b = first;
            *out = g;
        }
        return 0;
    }
    /* call */
    NEW(c, JN_CALL);
    c->a = node;
    TRY(parse_call_args(p, c));
    if (node->kind == JN_NAME) {
        c->id = jinja_global_id(node->name, node->name_n);
        if (c->id < 0) TRY(push(p, &p->calls, c));
    } else if (node->kind == JN_GETATTR) {
        c->id = jinja_method_id(node->name, node->name_n);
        if (c->id < 0) {
            char nm[64];
            snprintf(nm, sizeof nm, "%.*s", (int)(node->name_n > 60 ? 60 : node->name_n), node->name);
            return err_set(p->err, p->errlen, ERR_UNSUPPORTED, "line %d: unsupported method call '.%s()'", c->line, nm);
        }
    } else {
        return fail(p, "unsupported construct: call of a computed value%s", "");
    }
    *out = c;
    return 0;
}

static int parse_postfix(struct parser *p, struct jnode *node, struct jnode **out)
{
    int chain = 0;
    while (is_op(p, ".") || is_op(p, "[") || is_op(p, "(")) {
        TRY(bump_chain(p, &chain));
        TRY(parse_postfix_one(p, node, &node));
    }
    *out = node;
    return 0;
}

static int parse_filter_expr(struct parser *p, struct jnode *node, struct jnode **out)
{
    int chain = 0;
    for (;;) {
        TRY(bump_chain(p, &chain));
        if (is_op(p, "|")) TRY(parse_filter(p, node, &node));
        else if (is_name(p, "is")) TRY(parse_test(p, node, &node));
        else if (is_op(p, "(")) TRY(parse_postfix_one(p, node, &node));
        else break;
    }
    *out = node;
    return 0;
}

static int parse_primary(struct parser *p, struct jnode **out)
{
    const struct jtok *t = cur(p);
    TRY(enter(p));
    if (t->type == JT_NAME) {
        static const struct { const char *s; int v; } consts[] = {
            { "true", 1 }, { "True", 1 }, { "false", 0 }, { "False", 0 }, { "none", 2 }, { "None", 2 },
        };
        for (size_t k = 0; k < sizeof consts / sizeof consts[0]; k++)
            if (tok_is(t, JT_NAME, consts[k].s)) {
                NEW(c, JN_CONST);
                c->cval = consts[k].v == 2 ? jv_none() : jv_bool(consts[k].v);
                advance(p);
                *out = c;
                p->depth--;
                return 0;
            }
        NEW(n, JN_NAME);
        n->name = t->s;
        n->name_n = t->n;
        advance(p);
        *out = n;
    } else if (t->type == JT_STRING) {
        NEW(c, JN_CONST);
        c->cval = jv_str(t->s, t->n);
        advance(p);
        if (cur(p)->type == JT_STRING) { /* implicit concatenation 'a' 'b' */
            size_t n = c->cval.s.n;
            for (size_t k = p->i; p->t->v[k].type == JT_STRING; k++) n += p->t->v[k].n;
            char *s = jarena_alloc(p->a, n + 1);
            if (!s) return err_set(p->err, p->errlen, ERR_NOMEM, "out of memory");
            memcpy(s, c->cval.s.p, c->cval.s.n);
            size_t o = c->cval.s.n;
            while (cur(p)->type == JT_STRING) {
                memcpy(s + o, cur(p)->s, cur(p)->n);
                o += cur(p)->n;
                advance(p);
            }
            c->cval = jv_str(s, o);
        }
        *out = c;
    } else if (t->type == JT_INT || t->type == JT_FLOAT) {
        NEW(c, JN_CONST);
        c->cval = t->type == JT_INT ? jv_int(t->i) : jv_float(t->f);
        advance(p);
        *out = c;
    } else if (is_op(p, "(")) {
        advance(p);
        TRY(parse_tuple(p, false, true, NULL, true, out));
        TRY(expect_op(p, ")"));
    } else if (is_op(p, "[")) {
        advance(p);
        NEW(l, JN_LIST);
        while (!is_op(p, "]")) {
            if (l->body.n) TRY(expect_op(p, ","));
            if (is_op(p, "]")) break;
            struct jnode *n;
            TRY(parse_expression(p, true, &n));
            TRY(push(p, &l->body, n));
        }
        advance(p);
        *out = l;
    } else if (is_op(p, "{")) {
        advance(p);
        NEW(d, JN_DICT);
        while (!is_op(p, "}")) {
            if (d->body.n) TRY(expect_op(p, ","));
            if (is_op(p, "}")) break;
            struct jnode *k, *v;
            TRY(parse_expression(p, true, &k));
            TRY(expect_op(p, ":"));
            TRY(parse_expression(p, true, &v));
            TRY(push(p, &d->body, k));
            TRY(push(p, &d->body2, v));
        }
        advance(p);
        *out = d;
    } else {
        p->depth--;
        return fail_tok(p, "expected an expression");
    }
    p->depth--;
    return 0;
}

static int parse_unary(struct parser *p, bool with_filter, struct jnode **out)
{
    struct jnode *node;
    if (is_op(p, "-") || is_op(p, "+")) {
        TRY(enter(p));
        NEW(u, is_op(p, "-") ? JN_NEG : JN_POS);
        advance(p);
        TRY(parse_unary(p, false, &u->a));
        p->depth--;
        node = u;
    } else {
        TRY(parse_primary(p, &node));
    }
    TRY(parse_postfix(p, node, &node));
    if (with_filter) TRY(parse_filter_expr(p, node, &node));
    *out = node;
    return 0;
}

static int binop(struct parser *p, enum jop op, struct jnode *l, struct jnode *r, struct jnode **out)
{
    NEW(b, JN_BINOP);
    b->op = op;
    b->a = l;
    b->b = r;
    *out = b;
    return 0;
}

static int parse_pow(struct parser *p, struct jnode **out)
{
    int chain = 0;
    TRY(parse_unary(p, true, out));
    while (is_op(p, "**")) {
        int line = cur(p)->line;
        advance(p);
        TRY(bump_chain(p, &chain));
        struct jnode *r;
        TRY(parse_unary(p, true, &r));
        TRY(binop(p, JOP_POW, *out, r, out));
        (*out)->line = line;
    }
    return 0;
}

static int parse_math2(struct parser *p, struct jnode **out)
{
    int chain = 0;
    TRY(parse_pow(p, out));
    for (;;) {
        enum jop op = is_op(p, "*") ? JOP_MUL : is_op(p, "/") ? JOP_DIV : is_op(p, "//") ? JOP_FLOORDIV
                    : is_op(p, "%") ? JOP_MOD : JOP_NONE;
        if (op == JOP_NONE) return 0;
        int line = cur(p)->line;
        advance(p);
        TRY(bump_chain(p, &chain));
        struct jnode *r;
        TRY(parse_pow(p, &r));
        TRY(binop(p, op, *out, r, out));
        (*out)->line = line;
    }
}

static int parse_concat(struct parser *p, struct jnode **out)
{
    int chain = 0;
    TRY(parse_math2(p, out));
    while (is_op(p, "~")) {
        int line = cur(p)->line;
        advance(p);
        TRY(bump_chain(p, &chain));
        struct jnode *r;
        TRY(parse_math2(p, &r));
        TRY(binop(p, JOP_CONCAT, *out, r, out));
        (*out)->line = line;
    }
    return 0;
}

static int parse_math1(struct parser *p, struct jnode **out)
{
    int chain = 0;
    TRY(parse_concat(p, out));
    for (;;) {
        enum jop op = is_op(p, "+") ? JOP_ADD : is_op(p, "-") ? JOP_SUB : JOP_NONE;
        if (op == JOP_NONE) return 0;
        int line = cur(p)->line;
        advance(p);
        TRY(bump_chain(p, &chain));
        struct jnode *r;
        TRY(parse_concat(p, &r));
        TRY(binop(p, op, *out, r, out));
        (*out)->line = line;
    }
}

static int parse_compare(struct parser *p, struct jnode **out)
{
    struct jnode *first;
    TRY(parse_math1(p, &first));
    struct jnode *cmp = NULL;
    for (;;) {
        enum jop op = is_op(p, "==") ? JOP_EQ : is_op(p, "!=") ? JOP_NE : is_op(p, "<") ? JOP_LT
                    : is_op(p, "<=") ? JOP_LE : is_op(p, ">") ? JOP_GT : is_op(p, ">=") ? JOP_GE
                    : is_name(p, "in") ? JOP_IN : JOP_NONE;
        if (op != JOP_NONE) {
            advance(p);
        } else if (is_name(p, "not") && tok_is(peek(p, 1), JT_NAME, "in")) {
            op = JOP_NOTIN;
            advance(p);
            advance(p);
        } else {
            break;
        }
        if (!cmp) {
            cmp = node_new(p, JN_COMPARE);
            if (!cmp) return err_set(p->err, p->errlen, ERR_NOMEM, "out of memory");
            cmp->a = first;
        }
        if (cmp->body.n >= MAX_HEIGHT) return fail(p, "comparison chain too long%s", "");
        struct jnode *r;
        TRY(parse_math1(p, &r));
        NEW(operand, JN_KWARG);
        operand->op = op;
        operand->a = r;
        TRY(push(p, &cmp->body, operand));
    }
    *out = cmp ? cmp : first;
    return 0;
}

static int parse_not(struct parser *p, struct jnode **out)
{
    if (is_name(p, "not")) {
        TRY(enter(p));
        NEW(n, JN_NOT);
        advance(p);
        TRY(parse_not(p, &n->a));
        p->depth--;
        *out = n;
        return 0;
    }
    return parse_compare(p, out);
}

/* A left-associative chain `a KW b KW c ...` of one boolean operator (and / or). */
static int parse_bool_chain(struct parser *p, struct jnode **out, const char *kw, enum jnode_kind kind,
                            int (*operand)(struct parser *, struct jnode **))
{
    int chain = 0;
    TRY(operand(p, out));
    while (is_name(p, kw)) {
        advance(p);
        TRY(bump_chain(p, &chain));
        NEW(n, kind);
        n->a = *out;
        TRY(operand(p, &n->b));
        *out = n;
    }
    return 0;
}

static int parse_and(struct parser *p, struct jnode **out)
{
    return parse_bool_chain(p, out, "and", JN_AND, parse_not);
}

static int parse_or(struct parser *p, struct jnode **out)
{
    return parse_bool_chain(p, out, "or", JN_OR, parse_and);
}

static int parse_condexpr(struct parser *p, struct jnode **out)
{
    int chain = 0;
    TRY(parse_or(p, out));
    while (is_name(p, "if")) {
        advance(p);
        TRY(bump_chain(p, &chain));
        NEW(c, JN_COND);
        c->b = *out;
        TRY(parse_or(p, &c->a));
        if (is_name(p, "else")) {
            advance(p);
            TRY(enter(p));
            TRY(parse_condexpr(p, &c->c));
            p->depth--;
        }
        *out = c;
    }
    return 0;
}

static int parse_expression(struct parser *p, bool condexpr, struct jnode **out)
{
    return condexpr ? parse_condexpr(p, out) : parse_or(p, out);
}

static bool tuple_end(struct parser *p, const char *extra_end)
{
    const struct jtok *t = cur(p);
    if (t->type == JT_VAR_END || t->type == JT_BLOCK_END || t->type == JT_EOF || is_op(p, ")")) return true;
    return extra_end && is_name(p, extra_end);
}

static int parse_tuple(struct parser *p, bool simplified, bool condexpr, const char *extra_end,
                       bool explicit_parens, struct jnode **out)
{
    NEW(tup, JN_TUPLE);
    bool is_tuple = false;
    for (;;) {
        if (tup->body.n) TRY(expect_op(p, ","));
        if (tuple_end(p, extra_end)) break;
        struct jnode *n;
        if (simplified) TRY(parse_primary(p, &n));
        else TRY(parse_expression(p, condexpr, &n));
        TRY(push(p, &tup->body, n));
        if (is_op(p, ",")) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (tup->body.n) {
            *out = tup->body.v[0];
            return 0;
        }
        if (!explicit_parens) return fail_tok(p, "expected an expression");
    }
    *out = tup;
    return 0;
}

/* name | name.attr (with_namespace) | tuple of names */
static int parse_assign_target(struct parser *p, bool with_namespace, const char *extra_end, struct jnode **out)
{
    if (with_namespace && cur(p)->type == JT_NAME && tok_is(peek(p, 1), JT_OP, ".")) {
        NEW(ns, JN_NSREF);
        ns->name = cur(p)->s;
        ns->name_n = cur(p)->n;
        advance(p);
        advance(p);
        if (cur(p)->type != JT_NAME) return fail_tok(p, "expected an attribute name");
        NEW(attr, JN_CONST);
        attr->cval = jv_str(cur(p)->s, cur(p)->n);
        ns->a = attr;
        advance(p);
        *out = ns;
        return 0;
    }
    struct jnode *t;
    TRY(parse_tuple(p, true, false, extra_end, false, &t));
    if (t->kind == JN_NAME) {
        *out = t;
        return 0;
    }
    if (t->kind == JN_TUPLE) {
        for (size_t k = 0; k < t->body.n; k++)
            if (t->body.v[k]->kind != JN_NAME) return fail(p, "can't assign to this expression%s", "");
        *out = t;
        return 0;
    }
    return fail(p, "can't assign to this expression%s", "");
}

/* ---- statements ------------------------------------------------------------------- */

static int parse_body(struct parser *p, const char *const *ends, struct jnodes *out);

static int expect_block_end(struct parser *p)
{
    return expect_type(p, JT_BLOCK_END, "expected end of statement block");
}

/* After parse_body stopped at `{% name`, consumes `{%` and returns the end tag name. */
static const struct jtok *take_end_tag(struct parser *p)
{
    advance(p); /* {% */
    const struct jtok *t = cur(p);
    advance(p);
    return t;
}

static int parse_if(struct parser *p, struct jnode **out)
{
    NEW(n, JN_IF);
    TRY(parse_tuple(p, false, false, NULL, false, &n->a));
    TRY(expect_block_end(p));
    static const char *const ends[] = { "elif", "else", "endif", NULL };
    TRY(parse_body(p, ends, &n->body));
    const struct jtok *t = take_end_tag(p);
    if (tok_is(t, JT_NAME, "elif")) {
        struct jnode *e;
        TRY(parse_if(p, &e));
        TRY(push(p, &n->body2, e));
    } else if (tok_is(t, JT_NAME, "else")) {
        TRY(expect_block_end(p));
        static const char *const ends2[] = { "endif", NULL };
        TRY(parse_body(p, ends2, &n->body2));
        take_end_tag(p);
        TRY(expect_block_end(p));
    } else {
        TRY(expect_block_end(p));
    }
    *out = n;
    return 0;
}

static int parse_for(struct parser *p, struct jnode **out)
{
    NEW(n, JN_FOR);
    TRY(parse_assign_target(p, false, "in", &n->a));
    if (!is_name(p, "in")) return fail_tok(p, "expected 'in'");
    advance(p);
    TRY(parse_tuple(p, false, false, "recursive", false, &n->b));
    if (is_name(p, "if")) {
        advance(p);
        TRY(parse_expression(p, true, &n->c));
    }
    if (is_name(p, "recursive")) return fail(p, "unsupported construct: recursive for loops%s", "");
    TRY(expect_block_end(p));
    static const char *const ends[] = { "endfor", "else", NULL };
    p->loop_depth++;
    TRY(parse_body(p, ends, &n->body));
    p->loop_depth--;
    const struct jtok *t = take_end_tag(p);
    if (tok_is(t, JT_NAME, "else")) {
        TRY(expect_block_end(p));
        static const char *const ends2[] = { "endfor", NULL };
        TRY(parse_body(p, ends2, &n->body2));
        take_end_tag(p);
    }
    TRY(expect_block_end(p));
    *out = n;
    return 0;
}

static int parse_set(struct parser *p, struct jnode **out)
{
    struct jnode *target;
    TRY(parse_assign_target(p, true, NULL, &target));
    if (is_op(p, "=")) {
        advance(p);
        NEW(n, JN_SET);
        n->a = target;
        TRY(parse_tuple(p, false, true, NULL, false, &n->b));
        TRY(expect_block_end(p));
        *out = n;
        return 0;
    }
    NEW(n, JN_SETBLOCK);
    n->a = target;
    if (is_op(p, "|")) {
        NEW(bv, JN_BLOCKVAL);
        TRY(parse_filter(p, bv, &n->b));
    }
    TRY(expect_block_end(p));
    static const char *const ends[] = { "endset", NULL };
    TRY(parse_body(p, ends, &n->body));
    take_end_tag(p);
    TRY(expect_block_end(p));
    *out = n;
    return 0;
}

static int parse_macro_params(struct parser *p, struct jnode *n)
{
    TRY(expect_op(p, "("));
    while (!is_op(p, ")")) {
        if (n->kw.n) TRY(expect_op(p, ","));
        if (is_op(p, ")")) break;
        if (cur(p)->type != JT_NAME) return fail_tok(p, "expected a parameter name");
        NEW(param, JN_KWARG);
        param->name = cur(p)->s;
        param->name_n = cur(p)->n;
        advance(p);
        if (is_op(p, "=")) {
            advance(p);
            TRY(parse_expression(p, true, &param->a));
        }
        TRY(push(p, &n->kw, param));
    }
    advance(p);
    return 0;
}

static int parse_macro(struct parser *p, struct jnode **out)
{
    NEW(n, JN_MACRO);
    if (cur(p)->type != JT_NAME) return fail_tok(p, "expected a macro name");
    n->name = cur(p)->s;
    n->name_n = cur(p)->n;
    advance(p);
    TRY(parse_macro_params(p, n));
    TRY(expect_block_end(p));
    static const char *const ends[] = { "endmacro", NULL };
    int saved_loop = p->loop_depth;
    p->loop_depth = 0;
    p->macro_depth++;
    TRY(parse_body(p, ends, &n->body));
    p->macro_depth--;
    p->loop_depth = saved_loop;
    take_end_tag(p);
    TRY(expect_block_end(p));
    TRY(push(p, &p->macros, n));
    *out = n;
    return 0;
}

static int parse_call_block(struct parser *p, struct jnode **out)
{
    NEW(n, JN_CALLBLOCK);
    if (is_op(p, "(")) TRY(parse_macro_params(p, n));
    struct jnode *call;
    TRY(parse_expression(p, true, &call));
    if (call->kind != JN_CALL) return fail(p, "expected a call expression after 'call'%s", "");
    n->a = call;
    TRY(expect_block_end(p));
    static const char *const ends[] = { "endcall", NULL };
    int saved_loop = p->loop_depth;
    p->loop_depth = 0;
    p->macro_depth++;
    TRY(parse_body(p, ends, &n->body));
    p->macro_depth--;
    p->loop_depth = saved_loop;
    take_end_tag(p);
    TRY(expect_block_end(p));
    *out = n;
    return 0;
}

static int parse_filter_block(struct parser *p, struct jnode **out)
{
    NEW(n, JN_FILTERBLOCK);
    NEW(bv, JN_BLOCKVAL);
    if (!is_op(p, "|")) {
        /* the first filter has no leading pipe */
        char name[128];
        int line = cur(p)->line;
        TRY(dotted_name(p, name, sizeof name));
        NEW(f, JN_FILTER);
        f->line = line;
        f->a = bv;
        f->name = jarena_strdup(p->a, name, strlen(name));
        f->name_n = strlen(name);
        f->id = jinja_filter_id(name, f->name_n);
        if (f->id < 0) return err_set(p->err, p->errlen, ERR_UNSUPPORTED, "line %d: no filter named '%s'", line, name);
        if (is_op(p, "(")) TRY(parse_call_args(p, f));
        TRY(parse_filter(p, f, &n->b));
    } else {
        return fail_tok(p, "expected a filter name");
    }
    TRY(expect_block_end(p));
    static const char *const ends[] = { "endfilter", NULL };
    TRY(parse_body(p, ends, &n->body));
    take_end_tag(p);
    TRY(expect_block_end(p));
    *out = n;
    return 0;
}

static int parse_with(struct parser *p, struct jnode **out)
{
    NEW(n, JN_WITH);
    while (cur(p)->type != JT_BLOCK_END) {
        if (n->kw.n) TRY(expect_op(p, ","));
        if (cur(p)->type != JT_NAME) return fail_tok(p, "expected a variable name");
        NEW(a, JN_KWARG);
        a->name = cur(p)->s;
        a->name_n = cur(p)->n;
        advance(p);
        TRY(expect_op(p, "="));
        TRY(parse_expression(p, true, &a->a));
        TRY(push(p, &n->kw, a));
    }
    TRY(expect_block_end(p));
    static const char *const ends[] = { "endwith", NULL };
    TRY(parse_body(p, ends, &n->body));
    take_end_tag(p);
    TRY(expect_block_end(p));
    *out = n;
    return 0;
}

static int parse_statement(struct parser *p, struct jnode **out)
{
    const struct jtok *t = cur(p);
    if (t->type != JT_NAME) return fail_tok(p, "expected a statement name");
    char nm[48];
    snprintf(nm, sizeof nm, "%.*s", (int)(t->n > 40 ? 40 : t->n), t->s);
    advance(p);
    if (!strcmp(nm, "if")) return parse_if(p, out);
    if (!strcmp(nm, "for")) return parse_for(p, out);
    if (!strcmp(nm, "set")) return parse_set(p, out);
    if (!strcmp(nm, "macro")) return parse_macro(p, out);
    if (!strcmp(nm, "call")) return parse_call_block(p, out);
    if (!strcmp(nm, "filter")) return parse_filter_block(p, out);
    if (!strcmp(nm, "with")) return parse_with(p, out);
    if (!strcmp(nm, "break") || !strcmp(nm, "continue")) {
        if (p->loop_depth == 0) return err_set(p->err, p->errlen, ERR_FORMAT, "line %d: '%s' outside of a loop", t->line, nm);
        NEW(n, nm[0] == 'b' ? JN_BREAK : JN_CONTINUE);
        n->line = t->line;
        TRY(expect_block_end(p));
        *out = n;
        return 0;
    }
    static const char *const unsupported[] = { "include", "import", "from", "extends", "block", "do",
                                               "autoescape", "trans", "pluralize", "print", NULL };
    for (size_t k = 0; unsupported[k]; k++)
        if (!strcmp(nm, unsupported[k]))
            return err_set(p->err, p->errlen, ERR_UNSUPPORTED, "line %d: unsupported tag '%s'", t->line, nm);
    if (!strncmp(nm, "end", 3) || !strcmp(nm, "else") || !strcmp(nm, "elif"))
        return err_set(p->err, p->errlen, ERR_FORMAT, "line %d: unexpected '%s' (no open block it could close)", t->line, nm);
    return err_set(p->err, p->errlen, ERR_FORMAT, "line %d: unknown tag '%s'", t->line, nm);
}

static int parse_body(struct parser *p, const char *const *ends, struct jnodes *out)
{
    TRY(enter(p));
    int open_line = cur(p)->line;
    for (;;) {
        const struct jtok *t = cur(p);
        if (t->type == JT_EOF) {
            if (ends && ends[0]) {
                char want[96] = "";
                for (size_t k = 0; ends[k]; k++) {
                    if (k) strncat(want, " or ", sizeof want - strlen(want) - 1);
                    strncat(want, "'", sizeof want - strlen(want) - 1);
                    strncat(want, ends[k], sizeof want - strlen(want) - 1);
                    strncat(want, "'", sizeof want - strlen(want) - 1);
                }
                return err_set(p->err, p->errlen, ERR_FORMAT,
                               "line %d: unexpected end of template: block opened on line %d needs %s",
                               t->line, open_line, want);
            }
            break;
        }
        if (t->type == JT_DATA) {
            NEW(d, JN_DATA);
            d->cval = jv_str(t->s, t->n);
            TRY(push(p, out, d));
            advance(p);
        } else if (t->type == JT_VAR_BEGIN) {
            advance(p);
            NEW(o, JN_OUTPUT);
            TRY(parse_tuple(p, false, true, NULL, false, &o->a));
            TRY(expect_type(p, JT_VAR_END, "expected end of print statement '}}'"));
            TRY(push(p, out, o));
        } else if (t->type == JT_BLOCK_BEGIN) {
            const struct jtok *nm = peek(p, 1);
            if (ends)
                for (size_t k = 0; ends[k]; k++)
                    if (tok_is(nm, JT_NAME, ends[k])) {
                        p->depth--;
                        return 0;
                    }
            advance(p);
            struct jnode *s;
            TRY(parse_statement(p, &s));
            TRY(push(p, out, s));
        } else {
            return fail_tok(p, "unexpected token");
        }
    }
    p->depth--;
    return 0;
}

int jinja_parse_tokens(struct jinja_template *t, const struct jtoks *toks, char *err, size_t errlen)
{
    struct parser p = { .t = toks, .a = &t->arena, .err = err, .errlen = errlen };
    TRY(parse_body(&p, NULL, &t->body));
    /* plain-name calls must name a macro of this template (or `caller`) */
    for (size_t i = 0; i < p.calls.n; i++) {
        const struct jnode *c = p.calls.v[i], *fn = c->a;
        bool ok = fn->name_n == 6 && !memcmp(fn->name, "caller", 6);
        for (size_t k = 0; k < p.macros.n && !ok; k++)
            ok = p.macros.v[k]->name_n == fn->name_n && !memcmp(p.macros.v[k]->name, fn->name, fn->name_n);
        if (!ok)
            return err_set(err, errlen, ERR_UNSUPPORTED, "line %d: call of unknown function '%.*s' (not a supported global or a macro of this template)",
                           c->line, (int)(fn->name_n > 60 ? 60 : fn->name_n), fn->name);
    }
    return 0;
}

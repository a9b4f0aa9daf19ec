/* jinja_internal.h — shared types of the template module (not a public API).
 *
 * Pieces: an arena allocator (jarena_*), a growable byte buffer (jbuf_*), the lexer's
 * token stream (lexer.c), the AST (parser.c), the value model (value.c: struct jv and
 * Python-compatible str()/repr()/==/<), the evaluator (eval.c), builtins (builtins.c:
 * filters, tests, methods, globals) and JSON output (tojson.c).
 *
 * Ownership: a parsed template owns one arena holding its tokens' decoded strings and
 * its AST; it is never written after jinja_parse returns. A render owns a second arena
 * for every value it creates; values never outlive the render, so nothing is refcounted
 * and cycles (a namespace stored in itself) are harmless. Strings in values point into
 * the template arena, the cJSON context, or the render arena.
 */
#ifndef TESSERA_TEMPLATE_JINJA_INTERNAL_H
#define TESSERA_TEMPLATE_JINJA_INTERNAL_H

#include "template/jinja.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Limits that keep a hostile template or context from exhausting stack, memory or time. */
#define JINJA_MAX_DEPTH 256              /* parser nesting, macro recursion, value nesting */
#define JINJA_MAX_ARENA (256u << 20)     /* bytes a render may allocate */
#define JINJA_MAX_OUTPUT (64u << 20)     /* bytes of rendered text */
#define JINJA_MAX_STEPS 20000000         /* statements executed + loop iterations */

/* ---- arena ---------------------------------------------------------------------- */

struct jarena_chunk;
struct jarena {
    struct jarena_chunk *head;
    size_t used;  /* total bytes handed out */
    size_t limit; /* 0 = unlimited */
};

/* Returns zeroed memory aligned for any type, or NULL when out of memory or past limit. */
void *jarena_alloc(struct jarena *a, size_t n);
/* Copies [p, p+n) and NUL-terminates. */
char *jarena_strdup(struct jarena *a, const char *p, size_t n);
void jarena_free(struct jarena *a);

/* ---- byte buffer (malloc'd; the render's output and temporary captures) ----------- */

struct jbuf {
    char *p;
    size_t n, cap;
    bool oom; /* set once an append failed or passed JINJA_MAX_OUTPUT */
};
void jbuf_put(struct jbuf *b, const char *s, size_t n);
void jbuf_puts(struct jbuf *b, const char *s);
void jbuf_putc(struct jbuf *b, char c);
void jbuf_printf(struct jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void jbuf_free(struct jbuf *b);

/* ---- UTF-8 helpers ----------------------------------------------------------------- */

/* Decodes one code point at p (p < end); invalid bytes decode as themselves (U+0080..FF)
 * with length 1, so any byte string can be walked. */
uint32_t jinja_utf8_dec(const char *p, const char *end, int *len);
/* Python str.isspace() for one code point. */
bool jinja_is_space(uint32_t cp);
/* Number of code points. */
size_t jinja_utf8_count(const char *p, size_t n);

/* ---- tokens ------------------------------------------------------------------------ */

enum jtok_type {
    JT_EOF,
    JT_DATA,       /* template text; s/n is the (already whitespace-controlled) text */
    JT_VAR_BEGIN,  /* {{ */
    JT_VAR_END,    /* }} */
    JT_BLOCK_BEGIN,/* {% */
    JT_BLOCK_END,  /* %} */
    JT_NAME,
    JT_STRING,     /* s/n is the decoded value */
    JT_INT,
    JT_FLOAT,
    JT_OP,         /* s/n is the operator text */
};

struct jtok {
    enum jtok_type type;
    int line;
    const char *s;
    size_t n;
    int64_t i;
    double f;
};

struct jtoks {
    struct jtok *v;
    size_t n, cap;
};

/* Tokenizes src with trim_blocks + lstrip_blocks, newline normalisation and removal of
 * one trailing newline, exactly as jinja2's lexer. Token strings live in arena; the
 * token array is malloc'd (caller frees toks->v). */
int jinja_lex(const char *src, size_t len, struct jarena *arena, struct jtoks *toks,
              char *err, size_t errlen);

/* ---- values ------------------------------------------------------------------------ */

enum jv_type {
    JV_UNDEFINED, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STRING,
    JV_LIST,      /* also tuples (l->tuple) */
    JV_DICT,
    JV_NAMESPACE, /* a dict with attribute access and assignment */
    JV_CALLABLE,  /* macro, global function, bound method, caller */
    JV_LOOP,      /* the `loop` object of a for loop */
};

struct jv_list;
struct jv_dict;
struct jv_undef;
struct jv_callable;
struct jv_loop;

struct jv {
    enum jv_type type;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        struct jv_list *l;
        struct jv_dict *d; /* JV_DICT and JV_NAMESPACE */
        const struct jv_undef *u; /* may be NULL: anonymous undefined */
        struct jv_callable *c;
        struct jv_loop *loop;
    };
};

struct jv_list {
    struct jv *v;
    size_t n, cap;
    bool tuple;
    bool is_range;     /* made by range(): prints as range(start, stop[, step]) */
    int64_t range[3];  /* start, stop, step */
};

struct jv_dict {
    struct jv *k, *v;
    size_t n, cap;
};

/* Why a value is undefined, for jinja2-style error messages. */
struct jv_undef {
    const char *name; /* variable or attribute name (NULL for an element index) */
    size_t n;
    int64_t index;
    const char *obj_type; /* NULL: a plain variable ("'x' is undefined") */
    const char *hint;     /* overrides everything when set */
};

struct jnode;
struct jframe;

enum jcall_kind { JC_MACRO, JC_GLOBAL, JC_METHOD, JC_CALLER };
struct jv_callable {
    enum jcall_kind kind;
    int id;                   /* global / method id */
    struct jv self;           /* bound object of a method */
    const struct jnode *node; /* macro definition or call-block */
    struct jframe *closure;   /* frame a macro or caller body resolves names in */
};

struct jv_loop {
    const struct jv_list *items;
    size_t index0;
    int depth;
};

struct jrender;

static inline struct jv jv_undef(void) { struct jv v = { .type = JV_UNDEFINED }; return v; }
static inline struct jv jv_none(void) { struct jv v = { .type = JV_NONE }; return v; }
static inline struct jv jv_bool(bool b) { struct jv v = { .type = JV_BOOL, .b = b }; return v; }
static inline struct jv jv_int(int64_t i) { struct jv v = { .type = JV_INT, .i = i }; return v; }
static inline struct jv jv_float(double f) { struct jv v = { .type = JV_FLOAT, .f = f }; return v; }
static inline struct jv jv_str(const char *p, size_t n)
{
    struct jv v = { .type = JV_STRING };
    v.s.p = p;
    v.s.n = n;
    return v;
}

/* Allocation (render arena). NULL / error flag on exhaustion is reported by the caller
 * through jr_oom(). */
struct jv_list *jv_list_new(struct jrender *r, size_t cap);
int jv_list_push(struct jrender *r, struct jv_list *l, struct jv v);
struct jv_dict *jv_dict_new(struct jrender *r, size_t cap);
/* Sets key to v (replacing an equal key in place, Python dict order). */
int jv_dict_set(struct jrender *r, struct jv_dict *d, struct jv key, struct jv v);
/* Looks a key up; returns NULL when absent. */
struct jv *jv_dict_get(const struct jv_dict *d, struct jv key);
struct jv *jv_dict_gets(const struct jv_dict *d, const char *k, size_t n);
struct jv jv_undef_named(struct jrender *r, const char *name, size_t n);
struct jv jv_undef_attr(struct jrender *r, struct jv obj, const char *name, size_t n);
struct jv jv_undef_hint(struct jrender *r, const char *hint);
/* Writes the jinja2 UndefinedError message of an undefined value. */
void jv_undef_msg(struct jv v, char *buf, size_t len);

/* Converts a cJSON tree (objects, arrays, strings, numbers, bools, null); strings are
 * borrowed from the tree. */
int jv_from_json(struct jrender *r, const struct cJSON *j, struct jv *out, int depth);

/* Python semantics. */
bool jv_truthy(struct jv v);
bool jv_equal(struct jv a, struct jv b);
/* Python ordering a < b etc.: *res = -1/0/1; returns ERR_INVALID (message set) when the
 * types do not order. */
int jv_compare(struct jrender *r, struct jv a, struct jv b, int *res);
const char *jv_type_name(struct jv v); /* Python type name: 'str', 'int', 'dict', ... */
/* Appends Python str(v) / repr(v). */
int jv_to_str(struct jrender *r, struct jbuf *b, struct jv v);
int jv_repr(struct jrender *r, struct jbuf *b, struct jv v, int depth);
void jv_fmt_float(double f, char out[40]);
/* str(v) as a value (strings pass through without copying). */
int jv_stringify(struct jrender *r, struct jv v, struct jv *out);
/* Length like Python len(); ERR_INVALID for types without one. */
int jv_len(struct jrender *r, struct jv v, int64_t *out);
/* list(v): iterates strings (chars), lists, dicts (keys), undefined (empty). */
int jv_iterate(struct jrender *r, struct jv v, struct jv_list **out);

/* ---- AST --------------------------------------------------------------------------- */

enum jnode_kind {
    /* statements */
    JN_DATA, JN_OUTPUT, JN_IF, JN_FOR, JN_SET, JN_SETBLOCK, JN_MACRO, JN_CALLBLOCK,
    JN_FILTERBLOCK, JN_WITH, JN_BREAK, JN_CONTINUE,
    /* expressions */
    JN_CONST, JN_NAME, JN_LIST, JN_TUPLE, JN_DICT, JN_GETATTR, JN_GETITEM, JN_SLICE,
    JN_CALL, JN_FILTER, JN_TEST, JN_NOT, JN_NEG, JN_POS, JN_BINOP, JN_COMPARE, JN_AND,
    JN_OR, JN_COND, JN_NSREF, /* `ns.attr` as an assignment target */
    JN_BLOCKVAL,             /* the captured body inside {% set x | f %} / {% filter %} */
    JN_KWARG,                /* name=value in a call, or a macro parameter */
};

enum jop {
    JOP_NONE, JOP_ADD, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_CONCAT,
    JOP_EQ, JOP_NE, JOP_LT, JOP_LE, JOP_GT, JOP_GE, JOP_IN, JOP_NOTIN,
};

struct jnodes {
    struct jnode **v;
    size_t n, cap;
};

struct jnode {
    enum jnode_kind kind;
    int line;
    enum jop op;      /* JN_BINOP; JN_COMPARE operands carry their operator */
    bool neg;         /* JN_TEST: `is not` */
    int id;           /* resolved filter / test / global / method id, -1 if none */
    const char *name; /* names, attributes, filter / test / macro names */
    size_t name_n;
    struct jv cval;   /* JN_CONST, JN_DATA (a string) */
    struct jnode *a, *b, *c, *d;
    struct jnodes body;  /* statements; list items; call args; compare operands */
    struct jnodes body2; /* else branch; dict values; */
    struct jnodes kw;    /* JN_KWARG: keyword arguments / macro params / with-assignments */
};

struct jinja_template {
    struct jarena arena;
    struct jnodes body;
};

int jinja_parse_tokens(struct jinja_template *t, const struct jtoks *toks, char *err,
                       size_t errlen);

/* ---- render state and builtins ------------------------------------------------------ */

struct jframe {
    struct jframe *parent;
    const char **names;
    size_t *lens;
    struct jv *vals;
    size_t n, cap;
};

struct jrender {
    struct jarena arena;
    const struct jinja_render_opts *opts;
    struct jframe *root;
    char *err;
    size_t errlen;
    int line;       /* line of the node being evaluated, for messages */
    int depth;      /* macro / capture nesting */
    int64_t steps;
    struct jv blockval; /* JN_BLOCKVAL */
    bool failed;        /* an error message is already in err */
    int loop_depth;     /* nesting of for loops being executed */
};

/* Records a render error "line N: ..." (unless one is already set) and returns ERR_INVALID. */
int jr_fail(struct jrender *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int jr_oom(struct jrender *r);
/* Raises UndefinedError for an undefined value. */
int jr_undefined(struct jrender *r, struct jv v);

/* Arguments of a builtin call, already evaluated. */
struct jargs {
    struct jv *pos;
    size_t npos;
    const char **kwn;
    size_t *kwl;
    struct jv *kwv;
    size_t nkw;
    uint32_t used; /* bit i: keyword i was consumed */
};
/* Fetches argument `name` at position `pos` (or by keyword); returns true if given. */
bool jargs_get(struct jargs *a, size_t pos, const char *name, struct jv *out);
/* Fails when a positional beyond max or an unconsumed keyword was passed. */
int jargs_done(struct jrender *r, struct jargs *a, size_t max, const char *fn);

typedef int (*jinja_filter_fn)(struct jrender *r, struct jv in, struct jargs *a, struct jv *out);
typedef int (*jinja_test_fn)(struct jrender *r, struct jv in, struct jargs *a, bool *out);

int jinja_filter_id(const char *name, size_t n);
int jinja_test_id(const char *name, size_t n);
int jinja_global_id(const char *name, size_t n);
int jinja_method_id(const char *name, size_t n);
/* Whether the object has the method (for attribute access returning a bound method). */
bool jinja_has_method(struct jv obj, int id);
int jinja_call_filter(struct jrender *r, int id, struct jv in, struct jargs *a, struct jv *out);
int jinja_call_test(struct jrender *r, int id, struct jv in, struct jargs *a, bool *out);
int jinja_call_global(struct jrender *r, int id, struct jargs *a, struct jv *out);
int jinja_call_method(struct jrender *r, int id, struct jv self, struct jargs *a, struct jv *out);

/* eval.c services used by builtins */
int jinja_getattr(struct jrender *r, struct jv obj, const char *name, size_t n, struct jv *out);
int jinja_getitem(struct jrender *r, struct jv obj, struct jv key, struct jv *out);
int jinja_call_value(struct jrender *r, struct jv fn, struct jargs *a, struct jv *out);

/* builtins.c helpers shared with methods.c (Python str semantics on code points) */
typedef uint32_t (*jinja_cp_map)(uint32_t);
uint32_t jinja_cp_upper(uint32_t c);
uint32_t jinja_cp_lower(uint32_t c);
int jinja_cp_cat(uint32_t c); /* utf8proc category */
bool jinja_cp_cased(uint32_t c);
bool jinja_cp_alpha(uint32_t c);
bool jinja_cp_digit(uint32_t c);
bool jinja_cp_alnum(uint32_t c);
int jinja_want_str(struct jrender *r, struct jv v, const char *what);
int jinja_want_int(struct jrender *r, struct jv v, const char *what, int64_t *out);
int jinja_mklist(struct jrender *r, struct jv_list *l, struct jv *out);
/* Copies b into the arena as a string value and frees b. */
int jinja_str_from_buf(struct jrender *r, struct jbuf *b, struct jv *out);
/* mode 0: map every char; 1: str.capitalize(); 2: str.title(); 3: jinja's title filter */
int jinja_case_map(struct jrender *r, struct jv s, jinja_cp_map map, int mode, struct jv *out);
/* str.strip(chars) — chars NULL means whitespace; which: 1 left, 2 right, 3 both */
struct jv jinja_strip(struct jv s, const struct jv *chars, int which);
const char *jinja_find_bytes(const char *h, size_t hn, const char *n, size_t nn);
const char *jinja_rfind_bytes(const char *h, size_t hn, const char *n, size_t nn);
int jinja_replace(struct jrender *r, struct jv s, struct jv old, struct jv new, int64_t count, struct jv *out);
int jinja_split(struct jrender *r, struct jv s, const struct jv *sep, int64_t maxsplit, bool from_right, struct jv *out);
int jinja_splitlines(struct jrender *r, struct jv s, bool keepends, struct jv_list **out);
int jinja_dict_items(struct jrender *r, struct jv d, struct jv *out);

/* tojson.c */
int jinja_tojson(struct jrender *r, struct jbuf *b, struct jv v, const char *indent,
                 const char *item_sep, const char *key_sep, bool sort_keys, bool ascii);


/* Propagates a non-zero return code (the module's error convention). */
#define TRY(x)               \
    do {                     \
        int rc_ = (x);       \
        if (rc_) return rc_; \
    } while (0)

/* Body of a "name -> index in table" lookup over a static table with a .name field;
 * returns the index or -1. */
#define NAME_LOOKUP(table, name, n)                                                          \
    for (size_t i_ = 0; i_ < sizeof table / sizeof table[0]; i_++)                           \
        if (strlen(table[i_].name) == n && !memcmp(table[i_].name, name, n)) return (int)i_; \
    return -1

#endif

/* test_jinja.c — the template interpreter (src/template/): whitespace control, expressions,
 * Python value printing, filters, tests, loops, macros, namespaces, parse-time rejection
 * of unsupported constructs, malformed templates, nesting limits and render errors.
 * Expected strings in `golden` were produced by Python jinja2 3.1.6 with Hugging Face's
 * settings (tests/python/test_templates.py compares many more against jinja2 live).
 */
#include "test.h"
#include "template/jinja.h"
#include "util/err.h"

#include <cjson/cJSON.h>

/* Renders src with context JSON ctx_json (NULL = {}); returns malloc'd output or NULL
 * with the error in err. */
static char *render(const char *src, const char *ctx_json, char *err, size_t errlen, int *rc_out)
{
    struct jinja_template *t = NULL;
    char *out = NULL;
    size_t n = 0;
    err[0] = 0;
    int rc = jinja_parse(src, strlen(src), &t, err, errlen);
    if (!rc) {
        cJSON *ctx = cJSON_Parse(ctx_json ? ctx_json : "{}");
        struct jinja_render_opts opts = { 0, "26 Jul 2024" };
        rc = jinja_render(t, ctx, &opts, &out, &n, err, errlen);
        cJSON_Delete(ctx);
    }
    jinja_free(t);
    if (rc_out) *rc_out = rc;
    return rc ? NULL : out;
}

static void expect_render(const char *src, const char *ctx, const char *want)
{
    char err[ERR_BUF];
    char *out = render(src, ctx, err, sizeof err, NULL);
    CHECK(out && !strcmp(out, want), "template %s\n    got  [%s] (err %s)\n    want [%s]", src, out ? out : "(null)", err, want);
    free(out);
}

/* The template must fail (parse or render) with an error containing needle. */
static void expect_error(const char *src, const char *ctx, const char *needle)
{
    char err[ERR_BUF];
    int rc;
    char *out = render(src, ctx, err, sizeof err, &rc);
    CHECK(!out && rc < 0 && strstr(err, needle), "template %.80s: rc=%d err [%s] want [%s]", src, rc, err, needle);
    free(out);
}

static const struct {
    const char *src, *want;
} golden[] = {
    { "a  \n  {% if true %}\n  x\n  {% endif %}\n  b\n",
      "a  \n  x\n  b" },
    { "{{ 'a' }}  \n  {# c #}\n  x {%+ if true %}y{% endif %}",
      "a  \n  x y" },
    { "x {{- ' y ' -}} z",
      "x y z" },
    { "  {%- if true -%}  \n  t  {%- endif %}\n\nend",
      "t\nend" },
    { "{% if true +%}\nkeep{% endif %}",
      "\nkeep" },
    { "{% raw %}{{ x }}{% endraw %}",
      "{{ x }}" },
    { "a\r\nb\n\n",
      "a\nb\n" },
    { "{{ 1 + 2 * 3 }} {{ 2 ** 3 ** 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 1 / 4 }} {{ 'ab' * 2 }}",
      "7 64 3 -4 -2 0.25 abab" },
    { "{{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 100.0 }} {{ -0.0 }} {{ 2.5|round }} {{ 3|float }}",
      "0.30000000000000004 1e+20 1.5e-07 100.0 -0.0 2.0 3.0" },
    { "{{ [1, 'a', none, true, 1.5] }} {{ {'k': 'v'} }} {{ (1, 2) }} {{ ('x',) }} {{ \"it's\" }}",
      "[1, 'a', None, True, 1.5] {'k': 'v'} (1, 2) ('x',) it's" },
    { "{{ 'a' ~ 1 ~ none ~ true }} {{ x ~ 'y' }}",
      "a1NoneTrue y" },
    { "{{ '  x  '|trim }}|{{ 'Ab'|upper }}{{ 'Ab'|lower }}|{{ 'ab cd'|title }}|{{ [1,2,3]|join('+') }}|{{ 'abc'|length }}",
      "x|ABab|Ab Cd|1+2+3|3" },
    { "{{ [{'a':1},{'a':2}]|map(attribute='a')|list }} {{ ['x','y']|reject('equalto','x')|list }} {{ {'b':2,'a':1}|dictsort }}",
      "[1, 2] ['y'] [('a', 1), ('b', 2)]" },
    { "{{ {'a': [1, '\xc3""\xa9""', none]}|tojson }} {{ [1,2]|tojson(indent=2) }}",
      "{\"a\": [1, \"\xc3""\xa9""\", null]} [\n  1,\n  2\n]" },
    { "{% for x in ['a','b','c'] %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}",
      "1a,2b,3c" },
    { "{% for x in [] %}{% else %}none{% endfor %}",
      "none" },
    { "{% for k, v in {'a': 1}.items() %}{{ k }}{{ v }}{% endfor %}",
      "a1" },
    { "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
      "02" },
    { "{% macro m(a, b='d') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, b='x') }}",
      "[1d][2x]" },
    { "{% set ns = namespace(c=0) %}{% for i in range(3) %}{% set ns.c = ns.c + 1 %}{% endfor %}{{ ns.c }}",
      "3" },
    { "{% set s %}in{{ 1 }}{% endset %}{{ s }}",
      "in1" },
    { "{{ 'a,b'.split(',') }} {{ 'xhix'.strip('x') }} {{ 'abc'.startswith('ab') }} {{ 'A'.lower() }} {{ {'a':1}.get('z', 0) }}",
      "['a', 'b'] hi True a 0" },
    { "{{ x is defined }} {{ none is none }} {{ 1 is number }} {{ 'a' is string }} {{ {} is mapping }} {{ 3 is odd }}",
      "False True True True True True" },
    { "{{ 'abcdef'[1:4] }} {{ 'abc'[::-1] }} {{ [1,2,3][-1] }} {{ [1,2,3][:2] }}",
      "bcd cba 3 [1, 2]" },
    { "{{ 1 if x else 2 }} {{ 'y' if true }}|{{ 'n' if false }}|",
      "2 y||" },
};

static void test_golden_vs_jinja2(void)
{
    for (size_t i = 0; i < sizeof golden / sizeof golden[0]; i++) expect_render(golden[i].src, NULL, golden[i].want);
}

static void test_whitespace_control(void)
{
    expect_render("{% if true %}\nA\n{% endif %}\nB", NULL, "A\nB");
    expect_render("  {% if true %}x{% endif %}", NULL, "x");      /* lstrip at line start */
    expect_render("a {% if true %}x{% endif %}", NULL, "a x");    /* not at line start: kept */
    expect_render("  {{ 'v' }}", NULL, "  v");                     /* never for {{ }} */
    expect_render("  {%+ if true %}x{% endif %}", NULL, "  x");   /* + disables lstrip */
    expect_render("{# c #}\nx", NULL, "x");                       /* trim after comments */
    expect_render("{{ 'a' }}\nb", NULL, "a\nb");                   /* no trim after }} */
    expect_render("x\t \n\t{%- if true %}y{% endif %}", NULL, "xy");
    expect_render("{% if true -%}\n\n   y{% endif %}", NULL, "y");
    expect_render("text\n", NULL, "text");                          /* one trailing newline dropped */
    expect_render("text\n\n", NULL, "text\n");
    expect_render("{{ '}}' }}", NULL, "}}");
    expect_render("{{ {'a': 1}['a']}}", NULL, "1");                /* '}}' inside braces */
}

static void test_string_literals(void)
{
    expect_render("{{ 'a\\nb' }}", NULL, "a\nb");
    expect_render("{{ \"tab\\there\" }}", NULL, "tab\there");
    expect_render("{{ '\\u00e9\\x41\\101' }}", NULL, "\xc3\xa9" "AA");
    expect_render("{{ 'keep \\d' }}", NULL, "keep \\d");
    expect_render("{{ 'a' 'b' }}", NULL, "ab");
    expect_render("{{ 'it\\'s' }}", NULL, "it's");
}

static void test_context_values(void)
{
    const char *ctx = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":3,\"f\":0.5,\"b\":true,\"z\":null,"
                      "\"d\":{\"k\":[1,2]}}";
    expect_render("{{ messages[0].role }}:{{ messages[0]['content'] }}", ctx, "user:hi");
    expect_render("{{ n * 2 }} {{ f }} {{ b }} {{ z }} {{ d }}", ctx, "6 0.5 True None {'k': [1, 2]}");
    expect_render("{{ messages|length }}{{ messages[5] }}{{ d.missing }}", ctx, "1");
    expect_render("{{ d.k|tojson }}{{ messages|tojson }}", ctx, "[1, 2][{\"role\": \"user\", \"content\": \"hi\"}]");
    expect_render("{% set messages = messages + messages %}{{ messages|length }}", ctx, "2");
}

static void test_scoping(void)
{
    expect_render("{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}", NULL, "0001020");
    expect_render("{% if true %}{% set y = 3 %}{% endif %}{{ y }}", NULL, "3");
    expect_render("{% macro m() %}{{ g }}{% endmacro %}{% set g = 5 %}{{ m() }}", NULL, "5");
    expect_render("{% with a = 1 %}{{ a }}{% endwith %}[{{ a }}]", NULL, "1[]");
    expect_render("{% macro outer() %}<{{ caller() }}>{% endmacro %}{% call outer() %}in{% endcall %}", NULL, "<in>");
    expect_render("{% filter upper %}abc{% endfilter %}", NULL, "ABC");
}

static void test_raise_exception(void)
{
    expect_error("{{ raise_exception('System role not supported') }}", NULL, "System role not supported");
    char err[ERR_BUF];
    int rc;
    char *out = render("ok{{ raise_exception('exact msg') }}", NULL, err, sizeof err, &rc);
    CHECK(!out && rc == ERR_INVALID && !strcmp(err, "exact msg"), "rc=%d err=[%s]", rc, err);
    expect_render("{{ strftime_now('%Y') }}", NULL, "26 Jul 2024");
}

static void test_unsupported_is_parse_error(void)
{
    /* these must fail in jinja_parse, before any rendering */
    static const struct {
        const char *src, *needle;
    } cases[] = {
        { "{{ x|nosuch }}", "line 1: no filter named 'nosuch'" },
        { "\n\n{{ x is nosuch }}", "line 3: no test named 'nosuch'" },
        { "{{ lipsum() }}", "unknown function 'lipsum'" },
        { "{% include 'a' %}", "unsupported tag 'include'" },
        { "{% extends 'a' %}", "unsupported tag 'extends'" },
        { "{% frobnicate %}", "unknown tag 'frobnicate'" },
        { "{{ x.append(1) }}", "unsupported method call '.append()'" },
        { "{% for a in b recursive %}{% endfor %}", "recursive" },
        { "{{ f(*args) }}", "*args" },
        { "{% break %}", "'break' outside of a loop" },
        { "{{ x[0](1) }}", "call of a computed value" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct jinja_template *t = NULL;
        char err[ERR_BUF] = "";
        int rc = jinja_parse(cases[i].src, strlen(cases[i].src), &t, err, sizeof err);
        CHECK(rc < 0 && !t && strstr(err, cases[i].needle), "%s: rc=%d err=[%s] want [%s]", cases[i].src, rc, err, cases[i].needle);
        jinja_free(t);
    }
}

static void test_malformed(void)
{
    expect_error("{{ x", NULL, "not closed");
    expect_error("{% if x", NULL, "not closed");
    expect_error("{# comment", NULL, "missing end of comment");
    expect_error("{{ 'abc }}", NULL, "unterminated string");
    expect_error("{% if x %}", NULL, "needs 'elif' or 'else' or 'endif'");
    expect_error("{% endif %}", NULL, "unexpected 'endif'");
    expect_error("{% for x in y %}{% endif %}", NULL, "unexpected 'endif'");
    expect_error("{{ (1 }}", NULL, "line 1");
    expect_error("{{ 1) }}", NULL, "unexpected ')'");
    expect_error("{{ }}", NULL, "expected an expression");
    expect_error("{{ a b }}", NULL, "expected end of print statement");
    expect_error("{% raw %}never closed", NULL, "raw");
    expect_error("{{ $ }}", NULL, "unexpected character");
    expect_error("{{ '\\N{BULLET}' }}", NULL, "\\N");
    expect_error("{{ 99999999999999999999 }}", NULL, "64-bit");
}

static char *repeat_str(const char *a, int n, const char *mid, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), lm = strlen(mid);
    char *s = malloc(la * (size_t)n + lm + lb * (size_t)n + 1), *p = s;
    for (int i = 0; i < n; i++, p += la) memcpy(p, a, la);
    memcpy(p, mid, lm);
    p += lm;
    for (int i = 0; i < n; i++, p += lb) memcpy(p, b, lb);
    *p = 0;
    return s;
}

static void test_nesting_limits(void)
{
    /* 100 levels are fine, 10000 are refused without exhausting the stack */
    char *ok = repeat_str("(", 100, "1", ")");
    char *src = malloc(strlen(ok) + 8);
    sprintf(src, "{{ %s }}", ok);
    expect_render(src, NULL, "1");
    free(src);
    free(ok);
    char *deep = repeat_str("(", 10000, "1", ")");
    src = malloc(strlen(deep) + 8);
    sprintf(src, "{{ %s }}", deep);
    expect_error(src, NULL, "nested too deeply");
    free(src);
    free(deep);
    char *blocks = repeat_str("{% if true %}", 5000, "x", "{% endif %}");
    expect_error(blocks, NULL, "nested too deeply");
    free(blocks);
    char *nots = repeat_str("not ", 5000, "x", "");
    src = malloc(strlen(nots) + 8);
    sprintf(src, "{{ %s }}", nots);
    expect_error(src, NULL, "nested too deeply");
    free(src);
    free(nots);
    char *chain = repeat_str("1 + ", 5000, "1", "");
    src = malloc(strlen(chain) + 8);
    sprintf(src, "{{ %s }}", chain);
    expect_error(src, NULL, "too long");
    free(src);
    free(chain);
    expect_error("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", NULL, "recursion too deep");
    expect_error("{% set r = range(1000) %}{% for i in r %}{% for j in r %}{% for k in r %}{% endfor %}{% endfor %}{% endfor %}", NULL, "step limit");
    expect_error("{{ range(100001)|length }}", NULL, "Range too big");
    expect_error("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", NULL, "limit");
}

static void test_render_errors(void)
{
    expect_error("{{ x.y }}", NULL, "'x' is undefined");
    expect_error("{{ d.a.b }}", "{\"d\":{}}", "'dict object' has no attribute 'a'");
    expect_error("{{ x + 1 }}", NULL, "'x' is undefined");
    expect_error("{{ 'a' + 1 }}", NULL, "can only concatenate str (not \"int\") to str");
    expect_error("{{ 1 // 0 }}", NULL, "division or modulo by zero");
    expect_error("{{ [1] < 'a' }}", NULL, "not supported between");
    expect_error("{% for x in 3 %}{% endfor %}", NULL, "'int' object is not iterable");
    expect_error("{% set n = 1 %}{% set n.a = 2 %}", NULL, "non-namespace");
    expect_error("{{ x|tojson }}", NULL, "not JSON serializable");
    expect_error("{{ 9223372036854775807 + 1 }}", NULL, "64-bit");
    expect_error("{{ m(1, 2) }}{% macro m(a) %}{% endmacro %}", NULL, "'m' is undefined");
}

static void test_reuse_and_threads_safe_shape(void)
{
    /* one parsed template renders many contexts; outputs are independent */
    struct jinja_template *t = NULL;
    char err[ERR_BUF];
    const char *src = "{% for m in messages %}{{ m }};{% endfor %}";
    CHECK(jinja_parse(src, strlen(src), &t, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < 3 && t; i++) {
        char json[64];
        snprintf(json, sizeof json, "{\"messages\":[%d,%d]}", i, i + 1);
        cJSON *ctx = cJSON_Parse(json);
        char *out = NULL, want[32];
        size_t n = 0;
        snprintf(want, sizeof want, "%d;%d;", i, i + 1);
        int rc = jinja_render(t, ctx, NULL, &out, &n, err, sizeof err);
        CHECK(rc == 0 && out && n == strlen(want) && !strcmp(out, want), "got %s", out ? out : err);
        free(out);
        cJSON_Delete(ctx);
    }
    jinja_free(t);
    CHECK(jinja_render != NULL, "linked");
}

static void test_reference_templates_parse(void)
{
    /* every reference template (build/testdata/templates, from scripts/get-testdata.py)
     * parses and renders a one-message chat; the byte-exact comparison with jinja2 is in
     * tests/python/test_templates.py */
    static const char *const names[] = { "qwen2.5-7b-instruct", "llama-3.1-8b-instruct", "deepseek-r1-distill-qwen-7b",
                                         "deepseek-r1-distill-qwen-7b-initial", "smollm2-135m-instruct",
                                         "mistral-7b-instruct-v0.3", "qwen3", "gemma-2-2b-it", "phi-3.5-mini-instruct" };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "templates/%s.jinja", names[i]);
        FILE *f = fopen(test_data_path(rel), "rb");
        CHECK(f, "%s missing: run scripts/get-testdata.py", test_data_path(rel));
        if (!f)
            continue;
        char *buf = malloc(1 << 16);
        size_t n = fread(buf, 1, (1 << 16) - 1, f);
        fclose(f);
        struct jinja_template *t = NULL;
        char err[ERR_BUF] = "";
        int rc = jinja_parse(buf, n, &t, err, sizeof err);
        CHECK(rc == 0, "%s: %s", names[i], err);
        if (!rc) {
            cJSON *ctx = cJSON_Parse("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"add_generation_prompt\":true,"
                                     "\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"tools\":null}");
            char *out = NULL;
            size_t on = 0;
            rc = jinja_render(t, ctx, NULL, &out, &on, err, sizeof err);
            CHECK(rc == 0 && out && strstr(out, "Hi"), "%s: %s", names[i], err);
            free(out);
            cJSON_Delete(ctx);
        }
        jinja_free(t);
        free(buf);
    }
}

int main(void)
{
    RUN(test_golden_vs_jinja2);
    RUN(test_whitespace_control);
    RUN(test_string_literals);
    RUN(test_context_values);
    RUN(test_scoping);
    RUN(test_raise_exception);
    RUN(test_unsupported_is_parse_error);
    RUN(test_malformed);
    RUN(test_nesting_limits);
    RUN(test_render_errors);
    RUN(test_reuse_and_threads_safe_shape);
    RUN(test_reference_templates_parse);
    return test_summary();
}

/* test_grammar.c — the grammar engine against the default model's tokenizer (SmolLM2,
 * vocab 49152; TESSERA_TEST_MODEL picks another GGUF): compile errors, accepted and
 * refused texts, masks equal to "gm_accept would take this token" at sampled states for
 * every token of the vocabulary, seeded random walks to completion over many schemas
 * (the output parsed with cJSON and checked against the schema by a small validator
 * below), the tool-call wrapper, choices, regexes (the compiler against PCRE2 on seeded
 * and mutated strings), end-token handling, and matchers of one grammar on three threads
 * (cached masks equal to uncached ones).
 */
#include "grammar/grammar.h"
#include "grammar/grammar_int.h"

#include "loader/gguf.h"
#include "grammar_setup.h"
#include "test.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"
#include "util/mapfile.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

static struct tokenizer *tok;
static struct grammar_vocab *vocab;
static int32_t eog_ids[2];
static int n_eog;
static int nwords;

static bool setup(void)
{
    if (!grammar_test_setup(&tok, &vocab, eog_ids, &n_eog))
        return false;
    nwords = grammar_mask_words(grammar_vocab_size(vocab));
    return true;
}

static struct grammar *compile_kind(enum grammar_kind kind, const char *text, char *err)
{
    struct grammar_spec spec = { .kind = kind, .text = text, .text_len = text ? strlen(text) : 0 };
    struct grammar *g = NULL;
    if (grammar_compile(&g, vocab, &spec, err, ERR_BUF))
        return NULL;
    return g;
}

static struct grammar *schema(const char *text)
{
    char err[ERR_BUF];
    struct grammar *g = compile_kind(GRAMMAR_JSON_SCHEMA, text, err);
    CHECK(g, "schema %s: %s", text, err);
    return g;
}

/* Feeds text's tokens; returns the number accepted (== count when all were), *count the
 * number of tokens. */
static int feed(struct grammar_matcher *m, const char *text, int *count)
{
    int32_t ids[4096];
    int n = tok_encode(tok, text, strlen(text), false, false, ids, 4096);
    *count = n;
    for (int i = 0; i < n; i++)
        if (gm_accept(m, ids[i]))
            return i;
    return n;
}

/* True when the whole text is accepted and complete. */
static bool accepts(struct grammar *g, const char *text)
{
    struct grammar_matcher *m = gm_create(g);
    int n, k = feed(m, text, &n);
    bool ok = k == n && gm_can_end(m) && gm_accept(m, eog_ids[0]) == 0;
    gm_free(m);
    return ok;
}

static bool mask_has(const uint32_t *mask, int id) { return (mask[id >> 5] >> (id & 31)) & 1u; }

/* ---- compile errors --------------------------------------------------------------------- */

static void test_compile_errors(void)
{
    static const struct {
        enum grammar_kind kind;
        const char *text;
        int rc;
        const char *needle;
    } cases[] = {
        { GRAMMAR_JSON_SCHEMA, "{\"type\": \"object\", \"patternProperties\": {}}", ERR_UNSUPPORTED, "patternProperties" },
        { GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"contentEncoding\": \"base64\"}", ERR_UNSUPPORTED, "contentEncoding" },
        { GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"format\": \"hostname\"}", ERR_UNSUPPORTED, "hostname" },
        { GRAMMAR_JSON_SCHEMA, "{\"allOf\": [{\"type\": \"string\"}, {\"minLength\": 2}]}", ERR_UNSUPPORTED, "allOf" },
        { GRAMMAR_JSON_SCHEMA, "{\"type\": \"number\", \"minimum\": 0.5}", ERR_UNSUPPORTED, "number" },
        { GRAMMAR_JSON_SCHEMA, "{\"$ref\": \"http://example.com/s.json\"}", ERR_UNSUPPORTED, "$ref" },
        { GRAMMAR_JSON_SCHEMA, "{\"type\": \"object\",", ERR_INVALID, "not valid JSON" },
        { GRAMMAR_JSON_SCHEMA, "[1, 2]", ERR_INVALID, "not an object" },
        { GRAMMAR_JSON_SCHEMA, "{\"type\": \"strin\"}", ERR_INVALID, "strin" },
        { GRAMMAR_JSON_SCHEMA, "{\"$ref\": \"#/$defs/missing\"}", ERR_INVALID, "missing" },
        { GRAMMAR_JSON_SCHEMA, "{\"type\": \"integer\", \"minimum\": 5, \"maximum\": 4}", ERR_INVALID, "bounds" },
        { GRAMMAR_JSON_SCHEMA, "{\"$ref\": \"#/$defs/a\", \"$defs\": {\"a\": {\"$ref\": \"#/$defs/a\"}}}", ERR_INVALID, "no text" },
        { GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"maxLength\": 100000}", ERR_RANGE, "maxLength" },
        { GRAMMAR_JSON_SCHEMA, "{\"type\": \"integer\", \"minimum\": 1e30}", ERR_UNSUPPORTED, "minimum" },
        { GRAMMAR_JSON_SCHEMA, "{\"anyOf\": [{\"type\": \"string\"}, {\"nope\": 1}]}", ERR_UNSUPPORTED, "'nope'" },
        { GRAMMAR_JSON_SCHEMA, "false", ERR_INVALID, "false" },
        { GRAMMAR_JSON_SCHEMA, "{\"type\": \"integer\", \"format\": \"uint8\"}", ERR_UNSUPPORTED, "uint8" },
        { GRAMMAR_REGEX, "(?i)abc", ERR_UNSUPPORTED, "flags" },
        { GRAMMAR_REGEX, "a{1001}", ERR_RANGE, "1000" },
        { GRAMMAR_JSON_SCHEMA, "{\"type\": \"string\", \"pattern\": \"(a\"}", ERR_INVALID, "')'" },
        { GRAMMAR_REGEX, "(a|b", ERR_INVALID, "')'" },
        { GRAMMAR_REGEX, "[a-", ERR_INVALID, "class" },
        { GRAMMAR_REGEX, "a{3,2}", ERR_INVALID, "max < min" },
        { GRAMMAR_REGEX, "*a", ERR_INVALID, "nothing to repeat" },
        { GRAMMAR_REGEX, "(a)\\1", ERR_UNSUPPORTED, "backreference" },
        { GRAMMAR_REGEX, "a(?=b)", ERR_UNSUPPORTED, "lookaround" },
        { GRAMMAR_REGEX, "a\\bb", ERR_UNSUPPORTED, "anchor" },
        { GRAMMAR_REGEX, "a^b", ERR_UNSUPPORTED, "anchor" },
        { GRAMMAR_REGEX, "[^\\s\\S]", ERR_INVALID, "no text" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[ERR_BUF] = "";
        struct grammar_spec spec = { .kind = cases[i].kind, .text = cases[i].text, .text_len = strlen(cases[i].text) };
        struct grammar *g = NULL;
        int rc = grammar_compile(&g, vocab, &spec, err, sizeof err);
        CHECK(rc == cases[i].rc && !g, "%s: rc %d (%s), want %d", cases[i].text, rc, err, cases[i].rc);
        CHECK(strstr(err, cases[i].needle), "%s: message '%s' lacks '%s'", cases[i].text, err, cases[i].needle);
        grammar_unref(g);
    }
    /* 257 properties */
    char big[8192] = "{\"properties\": {";
    for (int i = 0; i < 257; i++)
        snprintf(big + strlen(big), sizeof big - strlen(big), "%s\"p%d\": {}", i ? ", " : "", i);
    strcat(big, "}}");
    char err[ERR_BUF] = "";
    struct grammar *gb = NULL;
    struct grammar_spec bigspec = { .kind = GRAMMAR_JSON_SCHEMA, .text = big, .text_len = strlen(big) };
    CHECK(grammar_compile(&gb, vocab, &bigspec, err, sizeof err) == ERR_RANGE && strstr(err, "256"), "257 properties: %s", err);
    /* 256 optional properties: the last one alone is reachable */
    char *last = strstr(big, ", \"p256\": {}");
    if (last)
        strcpy(last, "}}");
    CHECK(grammar_compile(&gb, vocab, &bigspec, err, sizeof err) == 0, "256 properties: %s", err);
    if (gb) {
        CHECK(accepts(gb, "{\"p255\": 1}") && accepts(gb, "{\"p0\": 1, \"p255\": [2]}") && !accepts(gb, "{\"p256\": 1}"),
              "optional property 256 of 256");
        grammar_unref(gb);
    }
    struct grammar_spec spec = { .kind = GRAMMAR_CHOICE, .n_choices = 0 };
    struct grammar *g = NULL;
    CHECK(grammar_compile(&g, vocab, &spec, err, sizeof err) == ERR_INVALID && strstr(err, "choices"), "empty choices: %s", err);
    grammar_unref(g);
}

/* ---- accept / reject ---------------------------------------------------------------------- */

static void expect_texts(const char *schema_text, const char *const *good, const char *const *bad)
{
    struct grammar *g = schema(schema_text);
    if (!g)
        return;
    for (int i = 0; good[i]; i++)
        CHECK(accepts(g, good[i]), "%s should accept %s", schema_text, good[i]);
    for (int i = 0; bad[i]; i++)
        CHECK(!accepts(g, bad[i]), "%s should refuse %s", schema_text, bad[i]);
    grammar_unref(g);
}

static void test_accept_basic(void)
{
    {
        const char *good[] = { "{\"name\": \"Ann\", \"age\": 31}", "{\"name\":\"\",\"age\":-4,\"ok\":true}",
                               "{\n  \"name\": \"A\\\"b\\\\c\\n\\u00e9\",\n  \"age\": 0\n}", "{ \"name\" : \"x\" , \"age\" : 7 }", NULL };
        const char *bad[] = { "{\"age\": 31, \"name\": \"Ann\"}", "{\"name\": \"Ann\"}", "{\"name\": \"Ann\", \"age\": 3.5}",
                              "{\"name\": \"Ann\", \"age\": 31, \"x\": 1}", "{\"name\": \"a\nb\", \"age\": 1}",
                              "{\"name\": \"Ann\", \"age\": 012}", "{\"name\": \"Ann\", \"age\": 31,}",
                              "{\"name\": \"Ann\",\n\n\"age\": 31}", NULL };
        expect_texts("{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": "
                     "\"integer\"}, \"ok\": {\"type\": \"boolean\"}}, \"required\": [\"name\", \"age\"]}",
                     good, bad);
    }
    {
        const char *good[] = { "\"red\"", "\"green\"", "null", "3", NULL };
        const char *bad[] = { "\"blue\"", "\"Red\"", "4", NULL };
        expect_texts("{\"enum\": [\"red\", \"green\", null, 3]}", good, bad);
    }
    {
        const char *good[] = { "[]", "[1, 2.5, -3e2]", "[ 0 ]", NULL };
        const char *bad[] = { "[1,]", "[01]", "[1 2]", "{}", NULL };
        expect_texts("{\"type\": \"array\", \"items\": {\"type\": \"number\"}}", good, bad);
    }
    {
        const char *good[] = { "{}", "{\"a\": [1, {\"b\": null}], \"c\": \"d\"}", NULL };
        const char *bad[] = { "[]", "{\"a\" 1}", "{'a': 1}", NULL };
        expect_texts("{\"type\": \"object\"}", good, bad);
    }
    {
        const char *good[] = { "\"x\"", "5", "null", NULL };
        const char *bad[] = { "true", "[]", NULL };
        expect_texts("{\"type\": [\"string\", \"integer\", \"null\"]}", good, bad);
    }
}

static void test_accept_constraints(void)
{
    {
        const char *good[] = { "-7", "0", "12", "-10", NULL };
        const char *bad[] = { "13", "-11", "-0", "1.0", NULL };
        expect_texts("{\"type\": \"integer\", \"minimum\": -10, \"maximum\": 12}", good, bad);
    }
    {
        const char *good[] = { "1", "99", "100", NULL };
        const char *bad[] = { "0", "101", "-1", NULL };
        expect_texts("{\"type\": \"integer\", \"exclusiveMinimum\": 0, \"maximum\": 100}", good, bad);
    }
    {
        const char *good[] = { "0", "0.5", "10", "10.0", "-2", "-1.25", "9.999", NULL };
        const char *bad[] = { "10.5", "-2.5", "11", "1e2", NULL };
        expect_texts("{\"type\": \"number\", \"minimum\": -2, \"maximum\": 10}", good, bad);
    }
    {
        const char *good[] = { "0.5", "0.001", "3", NULL };
        const char *bad[] = { "0", "-0.5", "0.0", NULL };
        expect_texts("{\"type\": \"number\", \"exclusiveMinimum\": 0}", good, bad);
    }
    {
        const char *good[] = { "\"ab\"", "\"abcd\"", "\"\\n\\\"\"", "\"\xc3\xa9t\xc3\xa9\"", NULL };
        const char *bad[] = { "\"a\"", "\"abcde\"", NULL };
        expect_texts("{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 4}", good, bad);
    }
    {
        const char *good[] = { "\"ab-12\"", "\"zz-0\"", NULL };
        const char *bad[] = { "\"ab-\"", "\"AB-1\"", "\"ab-1x\"", NULL };
        expect_texts("{\"type\": \"string\", \"pattern\": \"^[a-z]+-[0-9]+$\"}", good, bad);
    }
    {
        const char *good[] = { "\"xx abc yy\"", "\"abc\"", NULL };
        const char *bad[] = { "\"ab c\"", NULL };
        expect_texts("{\"type\": \"string\", \"pattern\": \"abc\"}", good, bad);
    }
    {
        const char *good[] = { "\"2024-02-29\"", NULL };
        const char *bad[] = { "\"2024-13-01\"", "\"24-01-01\"", NULL };
        expect_texts("{\"type\": \"string\", \"format\": \"date\"}", good, bad);
    }
    {
        const char *good[] = { "\"2024-02-29T12:30:00Z\"", "\"2024-02-29T23:59:59.123+05:30\"", NULL };
        const char *bad[] = { "\"2024-02-29 12:30:00Z\"", "\"2024-02-29T24:00:00Z\"", NULL };
        expect_texts("{\"type\": \"string\", \"format\": \"date-time\"}", good, bad);
    }
    {
        const char *good[] = { "\"123e4567-e89b-12d3-a456-426614174000\"", NULL };
        const char *bad[] = { "\"123e4567e89b12d3a456426614174000\"", NULL };
        expect_texts("{\"type\": \"string\", \"format\": \"uuid\"}", good, bad);
    }
    {
        const char *good[] = { "\"192.168.0.1\"", "\"255.255.255.255\"", NULL };
        const char *bad[] = { "\"256.1.1.1\"", "\"1.2.3\"", "\"01.2.3.4\"", NULL };
        expect_texts("{\"type\": \"string\", \"format\": \"ipv4\"}", good, bad);
    }
    {
        const char *good[] = { "\"a.b@example.com\"", NULL };
        const char *bad[] = { "\"a.b@\"", "\"example.com\"", NULL };
        expect_texts("{\"type\": \"string\", \"format\": \"email\"}", good, bad);
    }
    {
        const char *good[] = { "\"10:20:30Z\"", NULL };
        const char *bad[] = { "\"10:20\"", NULL };
        expect_texts("{\"type\": \"string\", \"format\": \"time\"}", good, bad);
    }
    {
        const char *good[] = { "[1, 2]", "[1, 2, 3]", NULL };
        const char *bad[] = { "[1]", "[1, 2, 3, 4]", "[]", NULL };
        expect_texts("{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"minItems\": 2, \"maxItems\": 3}", good, bad);
    }
    {
        const char *good[] = { "[\"a\", 1]", "[\"a\", 1, true, false]", NULL };
        const char *bad[] = { "[1, \"a\"]", "[\"a\"]", "[\"a\", 1, 2]", NULL };
        expect_texts("{\"type\": \"array\", \"prefixItems\": [{\"type\": \"string\"}, {\"type\": \"integer\"}], "
                     "\"items\": {\"type\": \"boolean\"}, \"minItems\": 2}",
                     good, bad);
    }
    {
        const char *good[] = { "{\"a\": 1}", "{\"a\": 1, \"b\": \"x\", \"zz\": \"y\"}", "{\"zz\": \"y\"}", NULL };
        const char *bad[] = { "{\"a\": 1, \"zz\": 2}", "{\"a\": 1, \"a\": 2}", "{\"b\": 1}", NULL };
        expect_texts("{\"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"string\"}}, "
                     "\"additionalProperties\": {\"type\": \"string\"}}",
                     good, bad);
    }
    {
        const char *good[] = { "{\"v\": 1, \"next\": {\"v\": 2, \"next\": null}}", "{\"v\": 3, \"next\": null}", NULL };
        const char *bad[] = { "{\"v\": 1, \"next\": {\"v\": 2}}", NULL };
        expect_texts("{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": {\"type\": \"integer\"}, "
                     "\"next\": {\"anyOf\": [{\"$ref\": \"#/$defs/node\"}, {\"type\": \"null\"}]}}, \"required\": [\"v\", "
                     "\"next\"]}}, \"$ref\": \"#/$defs/node\"}",
                     good, bad);
    }
    {
        const char *good[] = { "{\"kind\": \"circle\", \"r\": 1}", "{\"kind\": \"rect\", \"w\": 1, \"h\": 2}", NULL };
        const char *bad[] = { "{\"kind\": \"circle\", \"w\": 1}", "{\"kind\": \"tri\"}", NULL };
        expect_texts("{\"oneOf\": [{\"type\": \"object\", \"properties\": {\"kind\": {\"const\": \"circle\"}, \"r\": "
                     "{\"type\": \"number\"}}, \"required\": [\"kind\", \"r\"]}, {\"type\": \"object\", \"properties\": "
                     "{\"kind\": {\"const\": \"rect\"}, \"w\": {\"type\": \"number\"}, \"h\": {\"type\": \"number\"}}, "
                     "\"required\": [\"kind\", \"w\", \"h\"]}]}",
                     good, bad);
    }
}

static void test_accept_more(void)
{
    {
        /* a bound above the one-DFA limit: one rule per count */
        const char *good[] = { "\"abc\"", NULL };
        const char *bad[] = { "\"ab\"", NULL };
        expect_texts("{\"type\": \"string\", \"minLength\": 3, \"maxLength\": 300}", good, bad);
        char text[512] = "\"", text2[512] = "\"";
        for (int i = 0; i < 300; i++)
            strcat(text, i % 7 ? "x" : " ");
        strcat(text, "\"");
        for (int i = 0; i < 301; i++)
            strcat(text2, "y");
        strcat(text2, "\"");
        struct grammar *g = schema("{\"type\": \"string\", \"maxLength\": 300}");
        if (g) {
            CHECK(accepts(g, text) && !accepts(g, text2), "300 characters in, 301 out");
            grammar_unref(g);
        }
    }
    {
        const char *good[] = { "{\"a\": 1, \"x\": [true], \"y\": {}}", "{\"a\": 2}", NULL };
        const char *bad[] = { "{\"x\": 1}", "{\"a\": 1, \"a\": 1}", NULL };
        expect_texts("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}, \"required\": "
                     "[\"a\"], \"additionalProperties\": true}",
                     good, bad);
    }
    {
        /* names that need escaping, also as excluded extra keys */
        const char *good[] = { "{\"q\\\"x\": 1, \"\\u00e9\": 2}", "{\"q\\\"x\": 1, \"z\": 3}", NULL };
        const char *bad[] = { "{\"q\\\"x\": 1, \"q\\\"x\": 3}", "{\"qx\": 1}", NULL };
        expect_texts("{\"properties\": {\"q\\\"x\": {\"type\": \"integer\"}}, \"required\": [\"q\\\"x\"], "
                     "\"additionalProperties\": {\"type\": \"integer\"}}",
                     good, bad);
    }
    {
        const char *good[] = { "{\"n\": {\"n\": null}}", "null", NULL };
        const char *bad[] = { "{\"n\": 1}", "{}", NULL };
        expect_texts("{\"definitions\": {\"l\": {\"anyOf\": [{\"type\": \"null\"}, {\"type\": \"object\", "
                     "\"properties\": {\"n\": {\"$ref\": \"#/definitions/l\"}}, \"required\": [\"n\"]}]}}, "
                     "\"$ref\": \"#/definitions/l\"}",
                     good, bad);
    }
    {
        /* recursion 300 levels deep (the matcher's stacks grow with it) */
        struct grammar *g = schema("{\"$defs\": {\"l\": {\"anyOf\": [{\"type\": \"null\"}, {\"type\": \"array\", "
                                   "\"items\": {\"$ref\": \"#/$defs/l\"}, \"minItems\": 1, \"maxItems\": 1}]}}, "
                                   "\"$ref\": \"#/$defs/l\"}");
        if (g) {
            char deep[1024] = "", bad[1024] = "";
            for (int i = 0; i < 300; i++)
                strcat(deep, "[");
            strcat(deep, "null");
            for (int i = 0; i < 300; i++)
                strcat(deep, "]");
            memcpy(bad, deep, strlen(deep) - 1);
            strcat(bad, ",null]");
            CHECK(accepts(g, deep), "300 nested arrays");
            CHECK(!accepts(g, bad), "a second item refused at depth 300");
            grammar_unref(g);
        }
    }
    {
        const char *good[] = { "2147483647", "-2147483648", "0", NULL };
        const char *bad[] = { "2147483648", "-2147483649", NULL };
        expect_texts("{\"type\": \"integer\", \"format\": \"int32\"}", good, bad);
        const char *good2[] = { "1.5e3", NULL };
        const char *bad2[] = { "\"1.5\"", NULL };
        expect_texts("{\"type\": \"number\", \"format\": \"double\"}", good2, bad2);
    }
    {
        /* inferred types, {} and allOf with one member */
        const char *good[] = { "{\"s\": \"ab\", \"i\": [1], \"any\": [{\"k\": null}]}", NULL };
        const char *bad[] = { "{\"s\": \"a\", \"i\": [1], \"any\": 1}", "{\"s\": \"ab\", \"i\": [], \"any\": 1}", NULL };
        expect_texts("{\"properties\": {\"s\": {\"minLength\": 2}, \"i\": {\"items\": {\"minimum\": 0}, "
                     "\"minItems\": 1}, \"any\": {}}, \"required\": [\"s\", \"i\", \"any\"], \"title\": \"t\", "
                     "\"description\": \"d\", \"$schema\": \"x\"}",
                     good, bad);
        const char *good2[] = { "\"abc\"", NULL };
        const char *bad2[] = { "\"ab\"", NULL };
        expect_texts("{\"allOf\": [{\"type\": \"string\", \"minLength\": 3}]}", good2, bad2);
    }
    {
        /* enum values are written as cJSON prints them: non-ASCII characters raw */
        const char *good[] = { "\"caf\xc3\xa9 \\\"q\\\"\"", "[1,\"\xc3\xa9\"]", NULL };
        const char *bad[] = { "\"cafe\"", "[1,\"\\u00e9\"]", "[1, \"\xc3\xa9\"]", NULL };
        expect_texts("{\"enum\": [\"caf\xc3\xa9 \\\"q\\\"\", [1, \"\\u00e9\"]]}", good, bad);
    }
}

static void test_refused_token_keeps_state(void)
{
    struct grammar *g = schema("{\"type\": \"object\", \"properties\": {\"k\": {\"type\": \"integer\"}}, "
                               "\"required\": [\"k\"]}");
    if (!g)
        return;
    struct grammar_matcher *m = gm_create(g);
    int n;
    CHECK(feed(m, "{\"k\": 1", &n) == n, "prefix");
    uint32_t *a = calloc((size_t)nwords, 4), *b = calloc((size_t)nwords, 4);
    gm_fill_mask(m, a);
    int32_t bad[8];
    int nb = tok_encode(tok, "\"x", 2, false, false, bad, 8);
    CHECK(nb >= 1 && gm_accept(m, bad[0]) == ERR_INVALID, "quote refused inside a number's object");
    CHECK(gm_accept(m, -1) == ERR_INVALID && gm_accept(m, grammar_vocab_size(vocab)) == ERR_INVALID, "ids out of range");
    gm_fill_mask(m, b);
    CHECK(!memcmp(a, b, (size_t)nwords * 4), "mask unchanged after refusals");
    CHECK(feed(m, "2}", &n) == n && gm_can_end(m) && gm_is_done(m), "continues and completes");
    gm_free(m);
    free(a);
    free(b);
    grammar_unref(g);
}

/* gm_copy: a copy continues exactly as the original would (the same masks, the same
 * accepted and refused tokens) and advancing it leaves the original where it was, also
 * when the copy is reused from a later state. */
static void test_copy(void)
{
    struct grammar *g = schema("{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, "
                               "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"integer\"}}}, "
                               "\"required\": [\"name\", \"tags\"]}");
    struct grammar *other = schema("{\"type\": \"integer\"}");
    if (!g || !other)
        return;
    struct grammar_matcher *a = gm_create(g), *b = gm_create(g), *c = gm_create(g), *o = gm_create(other);
    uint32_t *ma = calloc((size_t)nwords, 4), *mb = calloc((size_t)nwords, 4), *m0 = calloc((size_t)nwords, 4);
    int n;
    CHECK(gm_copy(o, a) == ERR_INVALID, "a copy across grammars");
    CHECK(feed(a, "{\"name\": \"ab", &n) == n, "prefix");
    gm_fill_mask(a, m0);
    for (int round = 0; round < 2; round++) { /* round 1 reuses b from a later state */
        CHECK(gm_copy(b, a) == 0, "copy");
        gm_fill_mask(b, mb);
        CHECK(!memcmp(m0, mb, (size_t)nwords * 4), "round %d: the copy's mask differs", round);
        const char *rest = round ? ", 4]}" : "c\", \"tags\": [1, 22]}";
        CHECK(gm_copy(c, a) == 0 && feed(b, rest, &n) == n && feed(c, rest, &n) == n, "round %d: rest", round);
        gm_fill_mask(b, mb);
        gm_fill_mask(c, ma);
        CHECK(!memcmp(ma, mb, (size_t)nwords * 4) && gm_can_end(b) == gm_can_end(c) && gm_is_done(b) == gm_is_done(c),
              "round %d: two copies advanced alike differ", round);
        CHECK(gm_can_end(b) && gm_is_done(b) && gm_accept(b, eog_ids[0]) == 0, "round %d: the copy completes", round);
        gm_fill_mask(a, ma);
        CHECK(!memcmp(ma, m0, (size_t)nwords * 4), "round %d: the original moved", round);
        if (!round) {
            CHECK(feed(a, "c\", \"tags\": [3", &n) == n, "the original goes on");
            gm_fill_mask(a, m0);
        }
    }
    /* a state of two configurations (either alternative's first byte) */
    struct grammar *alt = schema("{\"anyOf\": [{\"type\": \"integer\"}, {\"type\": \"string\"}]}");
    if (alt) {
        struct grammar_matcher *x = gm_create(alt), *y = gm_create(alt);
        CHECK(feed(y, "\"ab", &n) == n && gm_copy(y, x) == 0, "copy of the start over a later state");
        gm_fill_mask(x, ma);
        gm_fill_mask(y, mb);
        CHECK(!memcmp(ma, mb, (size_t)nwords * 4), "two configurations: the copy's mask differs");
        CHECK(feed(y, "\"x\"", &n) == n && gm_can_end(y) && feed(x, "12", &n) == n && gm_can_end(x),
              "each alternative from the copy point");
        gm_free(x);
        gm_free(y);
        grammar_unref(alt);
    }
    /* a lexeme state and a complete one */
    char err[ERR_BUF];
    struct grammar *r = compile_kind(GRAMMAR_REGEX, "(a+b|a+c)+", err);
    CHECK(r, "regex: %s", err);
    if (r) {
        struct grammar_matcher *x = gm_create(r), *y = gm_create(r);
        CHECK(feed(x, "aaa", &n) == n && gm_copy(y, x) == 0, "regex prefix");
        gm_fill_mask(x, ma);
        gm_fill_mask(y, mb);
        CHECK(!memcmp(ma, mb, (size_t)nwords * 4), "two configurations: the copy's mask differs");
        CHECK(feed(y, "c", &n) == n && feed(x, "b", &n) == n && gm_can_end(x) && gm_can_end(y),
              "each way on from the copy point");
        CHECK(gm_copy(y, x) == 0 && gm_can_end(y) && gm_accept(y, eog_ids[0]) == 0, "a complete state copied");
        gm_free(x);
        gm_free(y);
        grammar_unref(r);
    }
    gm_free(a);
    gm_free(b);
    gm_free(c);
    gm_free(o);
    free(ma);
    free(mb);
    free(m0);
    grammar_unref(g);
    grammar_unref(other);
}

static void test_regex_and_choice(void)
{
    char err[ERR_BUF];
    struct grammar *g = compile_kind(GRAMMAR_REGEX, "(\\+1 )?\\(\\d{3}\\) \\d{3}-\\d{4}", err);
    CHECK(g, "%s", err);
    if (g) {
        CHECK(accepts(g, "(555) 123-4567") && accepts(g, "+1 (555) 123-4567"), "phone accepted");
        CHECK(!accepts(g, "555-123-4567") && !accepts(g, "(555) 123-45678"), "bad phone refused");
        grammar_unref(g);
    }
    g = compile_kind(GRAMMAR_REGEX, "^[^a-z\\s]{2,3}\xc3\xa9.$", err);
    CHECK(g, "%s", err);
    if (g) {
        CHECK(accepts(g, "AB\xc3\xa9\xe4\xb8\x80") && accepts(g, "\xe4\xb8\x80\xe4\xb8\x80!\xc3\xa9x"), "utf-8 classes");
        CHECK(!accepts(g, "ab\xc3\xa9x") && !accepts(g, "A B\xc3\xa9x") && !accepts(g, "AB\xc3\xa9\n"), "utf-8 classes refuse");
        grammar_unref(g);
    }
    g = compile_kind(GRAMMAR_REGEX, "(yes|no|maybe)!*", err);
    CHECK(g, "%s", err);
    if (g) {
        CHECK(accepts(g, "yes") && accepts(g, "maybe!!!"), "alternation");
        CHECK(!accepts(g, "ye") && !accepts(g, "nope"), "alternation refuses");
        grammar_unref(g);
    }
    const char *choices[] = { "Paris", "London", "Pari", "New York" };
    struct grammar_spec spec = { .kind = GRAMMAR_CHOICE, .choices = choices, .n_choices = 4 };
    CHECK(grammar_compile(&g, vocab, &spec, err, sizeof err) == 0, "%s", err);
    if (g) {
        for (int i = 0; i < 4; i++)
            CHECK(accepts(g, choices[i]), "choice %s", choices[i]);
        CHECK(!accepts(g, "Par") && !accepts(g, "Parisx") && !accepts(g, "paris"), "non-choices refused");
        /* after "Pari": may end (choice 3) or continue with "s" */
        struct grammar_matcher *m = gm_create(g);
        int n;
        CHECK(feed(m, "Pari", &n) == n, "prefix");
        CHECK(gm_can_end(m) && !gm_is_done(m), "Pari can end but is not done");
        CHECK(feed(m, "s", &n) == n && gm_is_done(m) && gm_can_end(m), "Paris is done");
        uint32_t *mask = calloc((size_t)nwords, 4);
        gm_fill_mask(m, mask);
        int allowed = 0;
        for (int id = 0; id < grammar_vocab_size(vocab); id++)
            allowed += mask_has(mask, id);
        CHECK(allowed == n_eog && mask_has(mask, eog_ids[0]), "done: only end tokens (%d allowed)", allowed);
        CHECK(gm_accept(m, eog_ids[0]) == 0 && gm_is_done(m), "end accepted");
        int32_t x;
        tok_encode(tok, "a", 1, false, false, &x, 1);
        CHECK(gm_accept(m, x) == ERR_INVALID, "nothing after the end");
        free(mask);
        gm_free(m);
        grammar_unref(g);
    }
}

/* ---- regex compiler against PCRE2 ----------------------------------------------------------- */

static bool dfa_matches(const struct gdfa *d, const char *s, size_t n)
{
    int st = d->start;
    for (size_t i = 0; i < n && st >= 0; i++)
        st = gdfa_step(d, st, (uint8_t)s[i]);
    return st >= 0 && d->accept[st];
}

/* Well-formed UTF-8 (no overlongs, surrogates or values above U+10FFFF). */
static bool utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        int len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!len || i + (size_t)len > n)
            return false;
        uint32_t cp = len == 1 ? c : c & (0x7Fu >> len);
        for (int k = 1; k < len; k++) {
            if ((u[i + k] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (u[i + k] & 0x3F);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return false;
        i += (size_t)len;
    }
    return true;
}

static void test_regex_vs_pcre2(void)
{
    static const struct {
        const char *re;
        const char *seeds[4];
    } cases[] = {
        { "(\\+1 )?\\(\\d{3}\\) \\d{3}-\\d{4}", { "(555) 123-4567", "+1 (555) 123-4567" } },
        { "[a-z]+(\\.[a-z]+)*@[a-z]+\\.(com|org)", { "a.b@c.com", "x@y.org" } },
        { "(ab|a)(bc|c)*d?", { "abc", "abcbcd", "ad" } },
        { "[^a-c\\s]{2,4}x*", { "dd", "\xc3\xa9\xe4\xb8\x80" "zx", "!!!!xx" } },
        { ".\\..{1,3}", { "a.b", "\xe4\xb8\x80.\xf0\x9f\x98\x80" "bc" } },
        { "(a*b*)*c", { "c", "aabbabc" } },
        { "\\w+\\s\\W?\\D{0,2}", { "ab_1 ", "x\t!ab" } },
        { "[\\x{4e00}-\\x{9fff}]+|[\\x{e0}-\\x{ff}]", { "\xe4\xb8\x80\xe4\xb8\x81", "\xc3\xa9" } },
        { "(?:0|[1-9][0-9]{0,2})(\\.[0-9]+)?", { "0", "105.25", "99" } },
        { "x{2,}y{0,1}z{3}", { "xxzzz", "xxxxyzzz" } },
        { "[-+]?[.][0-9]|[\\]\\[]", { "+.5", "]", "[" } },
    };
    static const char *const extras[] = { "a", "b", "c", "x", "0", "1", "9", " ", "\n", ".", "-", "(", ")", "@",
                                          "\xc3\xa9", "\xe4\xb8\x80", "\xf0\x9f\x98\x80", "\xff", "_", "!" };
    unsigned seed = 7;
    int compared = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const char *re = cases[ci].re;
        char err[ERR_BUF];
        struct gdfa d;
        if (rx_compile(re, strlen(re), 0, &d, err, sizeof err)) {
            CHECK(0, "%s: %s", re, err);
            continue;
        }
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *pc = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
        CHECK(pc, "pcre2 cannot compile %s", re);
        if (!pc) {
            gdfa_free(&d);
            continue;
        }
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(pc, NULL);
        for (int trial = 0; trial < 600; trial++) {
            char buf[128];
            size_t n = 0;
            int nseeds = 0;
            while (nseeds < 4 && cases[ci].seeds[nseeds])
                nseeds++;
            if (trial % 3 != 2 && nseeds) {
                /* a seed with a few random edits */
                const char *sd = cases[ci].seeds[rand_r(&seed) % (unsigned)nseeds];
                n = strlen(sd);
                memcpy(buf, sd, n);
                int edits = trial % 3 == 0 ? 0 : 1 + (int)(rand_r(&seed) % 2);
                for (int e = 0; e < edits; e++) {
                    const char *x = extras[rand_r(&seed) % (sizeof extras / sizeof extras[0])];
                    size_t xl = strlen(x), at = n ? rand_r(&seed) % (unsigned)(n + 1) : 0;
                    if (rand_r(&seed) % 2 && n > 0 && at < n) { /* delete one byte */
                        memmove(buf + at, buf + at + 1, n - at - 1);
                        n--;
                    } else if (n + xl < sizeof buf) {
                        memmove(buf + at + xl, buf + at, n - at);
                        memcpy(buf + at, x, xl);
                        n += xl;
                    }
                }
            } else {
                int len = (int)(rand_r(&seed) % 8);
                for (int k = 0; k < len; k++) {
                    const char *x = extras[rand_r(&seed) % (sizeof extras / sizeof extras[0])];
                    size_t xl = strlen(x);
                    if (n + xl < sizeof buf) {
                        memcpy(buf + n, x, xl);
                        n += xl;
                    }
                }
            }
            bool got = dfa_matches(&d, buf, n);
            if (!utf8_valid(buf, n)) { /* PCRE2 skips such bytes; a grammar never matches them */
                CHECK(!got, "%s matched invalid UTF-8 '%.*s'", re, (int)n, buf);
                continue;
            }
            int prc = pcre2_match(pc, (PCRE2_SPTR)buf, n, 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED, md, NULL);
            bool want = prc >= 0;
            CHECK(want == got, "%s on '%.*s': pcre2 %d, ours %d", re, (int)n, buf, want, got);
            compared++;
        }
        pcre2_match_data_free(md);
        pcre2_code_free(pc);
        gdfa_free(&d);
    }
    printf("  %d strings compared with PCRE2\n", compared);
}

static void test_wrapper(void)
{
    char err[ERR_BUF];
    const char *sch = "{\"anyOf\": [{\"type\": \"object\", \"properties\": {\"name\": {\"const\": \"get_weather\"}, "
                      "\"arguments\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
                      "\"required\": [\"city\"]}}, \"required\": [\"name\", \"arguments\"]}]}";
    struct grammar_spec spec = { .kind = GRAMMAR_JSON_SCHEMA, .text = sch, .text_len = strlen(sch),
                                 .prefix = "<tool_call>\n", .suffix = "\n</tool_call>", .separator = "\n",
                                 .min_items = 1, .max_items = 2 };
    struct grammar *g = NULL;
    CHECK(grammar_compile(&g, vocab, &spec, err, sizeof err) == 0, "%s", err);
    if (!g)
        return;
    const char *one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    char two[512], three[1024];
    snprintf(two, sizeof two, "%s\n%s", one, one);
    snprintf(three, sizeof three, "%s\n%s", two, one);
    CHECK(accepts(g, one) && accepts(g, two), "one and two calls");
    CHECK(!accepts(g, three) && !accepts(g, "") && !accepts(g, "{\"name\": \"get_weather\"}"), "three / none / bare refused");
    grammar_unref(g);
    /* zero or more, unbounded */
    spec.min_items = 0;
    spec.max_items = 0;
    CHECK(grammar_compile(&g, vocab, &spec, err, sizeof err) == 0, "%s", err);
    if (g) {
        CHECK(accepts(g, "") && accepts(g, one) && accepts(g, three), "0..n calls");
        grammar_unref(g);
    }
}

/* ---- masks against gm_accept -------------------------------------------------------------- */

/* A matcher that has accepted ids[0, n). */
static struct grammar_matcher *replay(struct grammar *g, const int32_t *ids, int n)
{
    struct grammar_matcher *m = gm_create(g);
    for (int i = 0; i < n; i++)
        if (gm_accept(m, ids[i])) {
            gm_free(m);
            return NULL;
        }
    return m;
}

/* Compares the mask at the state after ids[0, n) with gm_accept for every token (or
 * `sample` random tokens plus every allowed one when sample > 0). Returns mismatches. */
static int check_mask_state(struct grammar *g, const int32_t *ids, int n, int sample, unsigned *seed)
{
    int V = grammar_vocab_size(vocab), bad = 0;
    uint32_t *mask = calloc((size_t)nwords, 4), *mask2 = calloc((size_t)nwords, 4);
    struct grammar_matcher *m = replay(g, ids, n);
    if (!m || !mask || !mask2) {
        gm_free(m);
        free(mask);
        free(mask2);
        return 1;
    }
    gm_fill_mask(m, mask);
    gm_fill_mask_uncached(m, mask2);
    if (memcmp(mask, mask2, (size_t)nwords * 4))
        bad++;
    for (int k = 0; k < (sample > 0 ? sample : V); k++) {
        int id = sample > 0 ? (int)(rand_r(seed) % (unsigned)V) : k;
        bool want = mask_has(mask, id);
        int rc = gm_accept(m, id);
        if ((rc == 0) != want) {
            if (bad < 3) {
                char *piece = tok_decode(tok, &id, 1, false);
                fprintf(stderr, "  mask mismatch at step %d token %d (%s): mask %d accept %d\n", n, id, piece, want, rc);
                free(piece);
            }
            bad++;
        }
        if (rc == 0) {
            gm_free(m);
            m = replay(g, ids, n);
            if (!m) {
                free(mask);
                free(mask2);
                return bad + 1;
            }
        }
    }
    gm_free(m);
    free(mask);
    free(mask2);
    return bad;
}

/* ---- random walks -------------------------------------------------------------------------- */

static bool has_closing_byte(int id)
{
    char buf[256];
    int len = tok_token_bytes(tok, id, false, buf, sizeof buf);
    for (int i = 0; i < len && i < (int)sizeof buf; i++)
        if (buf[i] == '"' || buf[i] == '}' || buf[i] == ']' || buf[i] == ',')
            return true;
    return false;
}

/* Walks g with seeded random allowed tokens until an end token; writes the text (malloc)
 * and the tokens. Late in the walk tokens that close something are preferred so walks
 * finish. Returns the number of steps or -1 on a dead end. */
static int random_walk(struct grammar *g, unsigned seed, int32_t *ids, int cap, char **text)
{
    int V = grammar_vocab_size(vocab), n = 0;
    uint32_t *mask = calloc((size_t)nwords, 4);
    int32_t *allowed = malloc(sizeof *allowed * (size_t)V), *closing = malloc(sizeof *closing * (size_t)V);
    struct grammar_matcher *m = gm_create(g);
    int result = -1;
    while (n < cap) {
        if (gm_fill_mask(m, mask))
            break;
        int na = 0, nc = 0;
        bool end_ok = false;
        for (int id = 0; id < V; id++) {
            if (!mask_has(mask, id))
                continue;
            bool is_eog = id == eog_ids[0] || (n_eog > 1 && id == eog_ids[1]);
            if (is_eog) {
                end_ok = true;
                continue;
            }
            allowed[na++] = id;
            if (has_closing_byte(id))
                closing[nc++] = id;
        }
        if (end_ok && (na == 0 || n > 30 || rand_r(&seed) % 4 == 0)) {
            CHECK(gm_accept(m, eog_ids[0]) == 0, "end token refused though allowed");
            result = n;
            break;
        }
        if (na == 0) {
            CHECK(0, "dead end after %d tokens: no token allowed and no end", n);
            break;
        }
        int id;
        if (n > 20 && nc > 0 && rand_r(&seed) % 3)
            id = closing[rand_r(&seed) % (unsigned)nc];
        else
            id = allowed[rand_r(&seed) % (unsigned)na];
        if (gm_accept(m, id)) {
            CHECK(0, "allowed token %d refused", id);
            break;
        }
        ids[n++] = id;
    }
    *text = tok_decode(tok, ids, n, false);
    gm_free(m);
    free(mask);
    free(allowed);
    free(closing);
    return result;
}

/* A small validator for the schema subset the walks use. */
static bool validate(const cJSON *v, const cJSON *s, const cJSON *root, char *why, size_t whylen)
{
    if (!s || cJSON_IsTrue(s))
        return true;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref) {
        const char *name = strrchr(ref->valuestring, '/') + 1;
        const cJSON *defs = cJSON_GetObjectItemCaseSensitive(root, "$defs");
        return validate(v, cJSON_GetObjectItemCaseSensitive(defs, name), root, why, whylen);
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (!any)
        any = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    if (any) {
        for (const cJSON *m = any->child; m; m = m->next)
            if (validate(v, m, root, why, whylen))
                return true;
        snprintf(why, whylen, "no anyOf member matches");
        return false;
    }
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (cst && !cJSON_Compare(v, cst, true)) {
        snprintf(why, whylen, "const differs");
        return false;
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (en) {
        bool found = false;
        for (const cJSON *e = en->child; e && !found; e = e->next)
            found = cJSON_Compare(v, e, true);
        if (!found) {
            snprintf(why, whylen, "not in enum");
            return false;
        }
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    const char *t = type && cJSON_IsString(type) ? type->valuestring : NULL;
    if (type && cJSON_IsArray(type)) {
        bool ok = false;
        for (const cJSON *x = type->child; x && !ok; x = x->next) {
            const char *tn = x->valuestring;
            ok = (!strcmp(tn, "string") && cJSON_IsString(v)) || (!strcmp(tn, "null") && cJSON_IsNull(v)) ||
                 (!strcmp(tn, "number") && cJSON_IsNumber(v)) || (!strcmp(tn, "boolean") && cJSON_IsBool(v)) ||
                 (!strcmp(tn, "integer") && cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble));
        }
        if (!ok)
            snprintf(why, whylen, "type list");
        return ok;
    }
    if (t && !strcmp(t, "string")) {
        if (!cJSON_IsString(v)) {
            snprintf(why, whylen, "not a string");
            return false;
        }
        const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minLength"), *mx = cJSON_GetObjectItemCaseSensitive(s, "maxLength");
        int len = 0;
        for (const unsigned char *p = (const unsigned char *)v->valuestring; *p; p++)
            len += (*p & 0xC0) != 0x80;
        if ((mn && len < mn->valueint) || (mx && len > mx->valueint)) {
            snprintf(why, whylen, "string length %d", len);
            return false;
        }
    }
    if (t && (!strcmp(t, "integer") || !strcmp(t, "number"))) {
        if (!cJSON_IsNumber(v) || (!strcmp(t, "integer") && v->valuedouble != floor(v->valuedouble))) {
            snprintf(why, whylen, "not a %s", t);
            return false;
        }
        const cJSON *b;
        double x = v->valuedouble;
        if (((b = cJSON_GetObjectItemCaseSensitive(s, "minimum")) && x < b->valuedouble) ||
            ((b = cJSON_GetObjectItemCaseSensitive(s, "maximum")) && x > b->valuedouble) ||
            ((b = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum")) && x <= b->valuedouble) ||
            ((b = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum")) && x >= b->valuedouble)) {
            snprintf(why, whylen, "%g out of bounds", x);
            return false;
        }
    }
    if (t && !strcmp(t, "boolean") && !cJSON_IsBool(v)) {
        snprintf(why, whylen, "not a boolean");
        return false;
    }
    if (t && !strcmp(t, "null") && !cJSON_IsNull(v)) {
        snprintf(why, whylen, "not null");
        return false;
    }
    if (t && !strcmp(t, "array")) {
        if (!cJSON_IsArray(v)) {
            snprintf(why, whylen, "not an array");
            return false;
        }
        int n = cJSON_GetArraySize(v);
        const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minItems"), *mx = cJSON_GetObjectItemCaseSensitive(s, "maxItems");
        if ((mn && n < mn->valueint) || (mx && n > mx->valueint)) {
            snprintf(why, whylen, "%d items", n);
            return false;
        }
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        for (const cJSON *e = v->child; e; e = e->next)
            if (!validate(e, items, root, why, whylen))
                return false;
    }
    if (t && !strcmp(t, "object")) {
        if (!cJSON_IsObject(v)) {
            snprintf(why, whylen, "not an object");
            return false;
        }
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
        const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
        const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
            if (!cJSON_GetObjectItemCaseSensitive(v, r->valuestring)) {
                snprintf(why, whylen, "required '%s' missing", r->valuestring);
                return false;
            }
        for (const cJSON *m = v->child; m; m = m->next) {
            const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, m->string) : NULL;
            if (!ps && props && (!addl || cJSON_IsFalse(addl))) {
                snprintf(why, whylen, "extra member '%s'", m->string);
                return false;
            }
            if (!validate(m, ps ? ps : (addl && cJSON_IsObject(addl) ? addl : NULL), root, why, whylen))
                return false;
        }
    }
    return true;
}

static const char *const walk_schemas[] = {
    "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": \"integer\"}}, "
    "\"required\": [\"name\", \"age\"]}",
    "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"boolean\"}, \"b\": {\"type\": \"null\"}, \"c\": "
    "{\"type\": \"number\"}}}",
    "{\"type\": \"array\", \"items\": {\"type\": \"integer\", \"minimum\": -5, \"maximum\": 300}, \"minItems\": 1, "
    "\"maxItems\": 4}",
    "{\"enum\": [\"alpha\", \"beta\", \"gamma\", 42, null, true]}",
    "{\"type\": \"string\", \"minLength\": 3, \"maxLength\": 8}",
    "{\"type\": \"object\", \"properties\": {\"color\": {\"enum\": [\"red\", \"green\"]}, \"size\": {\"type\": "
    "\"integer\", \"exclusiveMinimum\": 0, \"exclusiveMaximum\": 10}}, \"required\": [\"color\", \"size\"]}",
    "{\"type\": \"object\", \"properties\": {\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\", "
    "\"maxLength\": 5}}, \"id\": {\"type\": \"string\", \"format\": \"uuid\"}}, \"required\": [\"tags\", \"id\"]}",
    "{\"type\": \"number\", \"minimum\": -3, \"maximum\": 7}",
    "{\"type\": \"object\", \"properties\": {\"when\": {\"type\": \"string\", \"format\": \"date\"}, \"ip\": "
    "{\"type\": \"string\", \"format\": \"ipv4\"}}, \"required\": [\"when\"]}",
    "{\"anyOf\": [{\"type\": \"integer\"}, {\"type\": \"string\", \"maxLength\": 4}, {\"type\": \"object\", "
    "\"properties\": {\"x\": {\"type\": \"integer\"}}, \"required\": [\"x\"]}]}",
    "{\"type\": [\"string\", \"null\", \"boolean\"], \"maxLength\": 6}",
    "{\"type\": \"object\", \"properties\": {\"p\": {\"type\": \"object\", \"properties\": {\"q\": {\"type\": "
    "\"object\", \"properties\": {\"r\": {\"type\": \"integer\"}}, \"required\": [\"r\"]}}, \"required\": [\"q\"]}}, "
    "\"required\": [\"p\"]}",
    "{\"$defs\": {\"t\": {\"type\": \"object\", \"properties\": {\"v\": {\"type\": \"integer\", \"minimum\": 0, "
    "\"maximum\": 9}, \"kids\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/t\"}, \"maxItems\": 2}}, "
    "\"required\": [\"v\", \"kids\"]}}, \"$ref\": \"#/$defs/t\"}",
    "{\"type\": \"object\"}",
    "{\"type\": \"object\", \"properties\": {\"k\": {\"type\": \"string\", \"pattern\": \"^[A-Z]{2}[0-9]{2,3}$\"}}, "
    "\"required\": [\"k\"]}",
    "{\"type\": \"array\", \"prefixItems\": [{\"type\": \"string\", \"maxLength\": 3}, {\"type\": \"integer\"}], "
    "\"items\": false, \"minItems\": 2}",
    "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}, \"additionalProperties\": {\"type\": "
    "\"boolean\"}, \"required\": [\"a\"]}",
    "{\"type\": \"integer\", \"minimum\": 1000, \"maximum\": 123456}",
    "{\"const\": {\"fixed\": [1, 2, \"three\"]}}",
    "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 10}, \"email\": "
    "{\"type\": \"string\", \"format\": \"email\"}, \"score\": {\"type\": \"number\", \"minimum\": 0, \"maximum\": "
    "100}, \"active\": {\"type\": \"boolean\"}}, \"required\": [\"name\", \"score\", \"active\"]}",
    "{\"type\": \"array\", \"items\": {\"type\": \"array\", \"items\": {\"type\": \"boolean\"}, \"maxItems\": 2}, "
    "\"maxItems\": 3}",
    "{\"type\": \"string\", \"format\": \"date-time\"}",
};

static void test_random_walks(void)
{
    int32_t ids[512];
    int n_schemas = (int)(sizeof walk_schemas / sizeof walk_schemas[0]);
    for (int si = 0; si < n_schemas; si++) {
        struct grammar *g = schema(walk_schemas[si]);
        if (!g)
            continue;
        cJSON *sch = cJSON_Parse(walk_schemas[si]);
        for (unsigned seed = 1; seed <= 6; seed++) {
            char *text = NULL;
            int n = random_walk(g, seed * 7919u + (unsigned)si, ids, 512, &text);
            CHECK(n >= 0, "schema %d seed %u: walk did not finish: %s", si, seed, text ? text : "");
            if (n >= 0) {
                cJSON *v = cJSON_Parse(text);
                char why[256] = "";
                CHECK(v, "schema %d seed %u: output is not JSON: %s", si, seed, text);
                CHECK(!v || validate(v, sch, sch, why, sizeof why), "schema %d seed %u: %s: %s", si, seed, why, text);
                CHECK(accepts(g, text), "schema %d seed %u: the output re-tokenised is refused: %s", si, seed, text);
                cJSON_Delete(v);
            }
            free(text);
        }
        cJSON_Delete(sch);
        grammar_unref(g);
    }
}

static void test_mask_consistency(void)
{
    int32_t ids[512];
    unsigned seed = 12345;
    int n_schemas = (int)(sizeof walk_schemas / sizeof walk_schemas[0]);
    int states = 0, full = 0;
    for (int si = 0; si < n_schemas; si++) {
        struct grammar *g = schema(walk_schemas[si]);
        if (!g)
            continue;
        char *text = NULL;
        int n = random_walk(g, 99u + (unsigned)si, ids, 512, &text);
        free(text);
        if (n < 0) {
            grammar_unref(g);
            continue;
        }
        /* every vocabulary token at three states (start, middle, end), sampled elsewhere */
        int picks[3] = { 0, n / 2, n };
        for (int k = 0; k < 3; k++) {
            int bad = check_mask_state(g, ids, picks[k], 0, &seed);
            CHECK(bad == 0, "schema %d state %d: %d mismatches", si, picks[k], bad);
            full++;
        }
        for (int step = 1; step < n; step += 3) {
            int bad = check_mask_state(g, ids, step, 300, &seed);
            CHECK(bad == 0, "schema %d state %d (sampled): %d mismatches", si, step, bad);
            states++;
        }
        grammar_unref(g);
    }
    /* regexes, choices, the wrapper, any object, a long bounded string */
    static const char *const regexes[] = { "(\\+1 )?\\(\\d{3}\\) \\d{3}-\\d{4}", "[^\\n]{1,40}\\.", "(ab|a)+c?\\s*[\\x{4e00}-\\x{9fff}]{0,3}" };
    const char *choices[] = { "positive", "negative", "neutral", "pos" };
    const char *tool = "{\"type\": \"object\", \"properties\": {\"name\": {\"const\": \"f\"}, \"arguments\": {\"type\": "
                       "\"object\", \"properties\": {\"x\": {\"type\": \"integer\"}}, \"required\": [\"x\"]}}, "
                       "\"required\": [\"name\", \"arguments\"]}";
    const char *long_str = "{\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\", \"maxLength\": 200}}, "
                           "\"required\": [\"s\"]}";
    struct grammar_spec specs[] = {
        { .kind = GRAMMAR_REGEX, .text = regexes[0], .text_len = strlen(regexes[0]) },
        { .kind = GRAMMAR_REGEX, .text = regexes[1], .text_len = strlen(regexes[1]) },
        { .kind = GRAMMAR_REGEX, .text = regexes[2], .text_len = strlen(regexes[2]) },
        { .kind = GRAMMAR_CHOICE, .choices = choices, .n_choices = 4 },
        { .kind = GRAMMAR_JSON_SCHEMA, .text = tool, .text_len = strlen(tool), .prefix = "<tool_call>\n",
          .suffix = "\n</tool_call>", .separator = "\n", .min_items = 1, .max_items = 3 },
        { .kind = GRAMMAR_JSON_OBJECT },
        { .kind = GRAMMAR_JSON_SCHEMA, .text = long_str, .text_len = strlen(long_str) },
    };
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        char err[ERR_BUF];
        struct grammar *g = NULL;
        if (grammar_compile(&g, vocab, &specs[k], err, sizeof err)) {
            CHECK(0, "spec %zu: %s", k, err);
            continue;
        }
        char *text = NULL;
        int n = random_walk(g, 500u + (unsigned)k, ids, 512, &text);
        CHECK(n >= 0, "spec %zu: walk did not finish: %s", k, text ? text : "");
        if (specs[k].kind == GRAMMAR_REGEX && n >= 0) {
            /* the walk's text matches the regex by PCRE2 too */
            int ec;
            PCRE2_SIZE eo;
            pcre2_code *pc = pcre2_compile((PCRE2_SPTR)specs[k].text, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &ec, &eo, NULL);
            pcre2_match_data *md = pc ? pcre2_match_data_create_from_pattern(pc, NULL) : NULL;
            CHECK(pc && md && pcre2_match(pc, (PCRE2_SPTR)text, strlen(text), 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED, md, NULL) >= 0,
                  "spec %zu: PCRE2 refuses the walk's text '%s'", k, text);
            pcre2_match_data_free(md);
            pcre2_code_free(pc);
        }
        free(text);
        if (n >= 0) {
            int picks[3] = { 0, n / 2, n };
            for (int q = 0; q < 3; q++) {
                int bad = check_mask_state(g, ids, picks[q], 0, &seed);
                CHECK(bad == 0, "spec %zu state %d: %d mismatches", k, picks[q], bad);
                full++;
            }
            for (int step = 1; step < n; step += 4) {
                int bad = check_mask_state(g, ids, step, 200, &seed);
                CHECK(bad == 0, "spec %zu state %d (sampled): %d mismatches", k, step, bad);
                states++;
            }
        }
        grammar_unref(g);
    }
    printf("  mask consistency: %d states over the whole vocabulary, %d sampled\n", full, states);
}

struct thread_arg {
    struct grammar *g;
    unsigned seed;
    int bad, steps;
};

/* Random walk that checks every cached mask against an uncached one. */
static void *walk_thread(void *p)
{
    struct thread_arg *a = p;
    int V = grammar_vocab_size(vocab);
    uint32_t *mask = calloc((size_t)nwords, 4), *ref = calloc((size_t)nwords, 4);
    for (int rep = 0; rep < 4; rep++) {
        struct grammar_matcher *m = gm_create(a->g);
        for (int n = 0; n < 150 && !gm_is_done(m); n++) {
            gm_fill_mask(m, mask);
            gm_fill_mask_uncached(m, ref);
            if (memcmp(mask, ref, (size_t)nwords * 4))
                a->bad++;
            int pick = -1, seen = 0;
            for (int id = 0; id < V; id++)
                if (mask_has(mask, id) && id != eog_ids[0] && (n_eog < 2 || id != eog_ids[1]) &&
                    rand_r(&a->seed) % (unsigned)++seen == 0)
                    pick = id;
            if (pick < 0 || gm_accept(m, pick))
                break;
            a->steps++;
        }
        gm_free(m);
    }
    free(mask);
    free(ref);
    return NULL;
}

static void test_threads_share_grammar(void)
{
    struct grammar *g = schema(walk_schemas[0]);
    if (!g)
        return;
    pthread_t th[3];
    struct thread_arg args[3];
    for (int i = 0; i < 3; i++) {
        args[i] = (struct thread_arg){ g, 1000u + (unsigned)i, 0, 0 };
        pthread_create(&th[i], NULL, walk_thread, &args[i]);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        CHECK(args[i].bad == 0 && args[i].steps > 0, "thread %d: %d of %d cached masks differ", i, args[i].bad, args[i].steps);
    }
    grammar_unref(g);
}

static void test_json_object(void)
{
    char err[ERR_BUF];
    struct grammar *g = compile_kind(GRAMMAR_JSON_OBJECT, NULL, err);
    CHECK(g, "%s", err);
    if (!g)
        return;
    CHECK(accepts(g, "{}") && accepts(g, "{\"a\": {\"b\": [1, \"x\", null, true, {\"c\": -1.5e3}]}}"), "objects");
    CHECK(!accepts(g, "[]") && !accepts(g, "\"s\"") && !accepts(g, "{\"a\": }") && !accepts(g, "{} {}"), "non-objects");
    int32_t ids[512];
    for (unsigned seed = 1; seed <= 8; seed++) {
        char *text = NULL;
        int n = random_walk(g, seed, ids, 512, &text);
        CHECK(n >= 0, "walk %u: %s", seed, text ? text : "");
        cJSON *v = n >= 0 ? cJSON_Parse(text) : NULL;
        CHECK(n < 0 || (v && cJSON_IsObject(v)), "walk %u not an object: %s", seed, text);
        cJSON_Delete(v);
        free(text);
    }
    grammar_unref(g);
}

static void test_eog_and_special(void)
{
    struct grammar *g = schema("{\"type\": \"integer\"}");
    if (!g)
        return;
    struct grammar_matcher *m = gm_create(g);
    uint32_t *mask = calloc((size_t)nwords, 4);
    gm_fill_mask(m, mask);
    CHECK(!mask_has(mask, eog_ids[0]) && !gm_can_end(m), "no end before a value");
    CHECK(gm_accept(m, eog_ids[0]) == ERR_INVALID, "end refused at the start");
    int bos = tok_bos_id(tok);
    CHECK(bos < 0 || (!mask_has(mask, bos) && gm_accept(m, bos) == ERR_INVALID), "special tokens never match");
    int n;
    CHECK(feed(m, "42", &n) == n, "digits");
    gm_fill_mask(m, mask);
    CHECK(gm_can_end(m) && !gm_is_done(m) && mask_has(mask, eog_ids[0]), "end allowed after a number");
    if (n_eog > 1)
        CHECK(mask_has(mask, eog_ids[1]), "every end token allowed");
    CHECK(gm_accept(m, eog_ids[0]) == 0 && gm_is_done(m), "accepted end");
    gm_fill_mask(m, mask);
    int allowed = 0;
    for (int id = 0; id < grammar_vocab_size(vocab); id++)
        allowed += mask_has(mask, id);
    CHECK(allowed == n_eog, "after the end only end tokens (%d)", allowed);
    gm_free(m);
    free(mask);
    /* refcounts: the matcher keeps the grammar alive */
    m = gm_create(g);
    grammar_unref(g);
    CHECK(feed(m, "7", &n) == n && gm_can_end(m), "matcher outlives the caller's reference");
    gm_free(m);
}

int main(void)
{
    if (!setup()) {
        printf("0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_compile_errors);
    RUN(test_accept_basic);
    RUN(test_accept_constraints);
    RUN(test_accept_more);
    RUN(test_refused_token_keeps_state);
    RUN(test_copy);
    RUN(test_regex_and_choice);
    RUN(test_regex_vs_pcre2);
    RUN(test_wrapper);
    RUN(test_json_object);
    RUN(test_eog_and_special);
    RUN(test_random_walks);
    RUN(test_threads_share_grammar);
    RUN(test_mask_consistency);
    grammar_vocab_free(vocab);
    tok_free(tok);
    return test_summary();
}

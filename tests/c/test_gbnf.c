/* test_gbnf.c — GBNF grammars (GRAMMAR_GBNF) against the default model's tokenizer
 * (SmolLM2; TESSERA_TEST_MODEL picks another GGUF): every syntax feature on accepted and
 * refused texts (fed as the tokenizer splits them and again one byte-token at a time),
 * Unicode and negated classes, '.', repetition bounds, nullable and recursive rules,
 * pruning of alternatives that cannot finish, ambiguous grammars (masks stay cheap, or
 * fail fast at the matcher's work bound), every compile error with its message, seeded
 * random walks over a JSON grammar (output parsed with cJSON) and an arithmetic grammar
 * (output checked by a recursive-descent parser below) with masks compared to gm_accept
 * over the whole vocabulary at sampled states, and seeded mutations of both grammars
 * (each compiles or fails with a GBNF message).
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
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

static struct tokenizer *tok;
static struct grammar_vocab *vocab;
static int32_t eog_ids[2];
static int n_eog;
static int nwords;
static int32_t byte_tok[256]; /* a token whose text is exactly that byte, -1 if none */

static bool setup(void)
{
    if (!grammar_test_setup(&tok, &vocab, eog_ids, &n_eog))
        return false;
    nwords = grammar_mask_words(grammar_vocab_size(vocab));
    for (int b = 0; b < 256; b++)
        byte_tok[b] = -1;
    for (int id = 0; id < grammar_vocab_size(vocab); id++) {
        char buf[8];
        bool special = id == eog_ids[0] || (n_eog > 1 && id == eog_ids[1]) || tok_is_special(tok, id);
        if (!special && tok_token_bytes(tok, id, false, buf, sizeof buf) == 1 && byte_tok[(uint8_t)buf[0]] < 0)
            byte_tok[(uint8_t)buf[0]] = id;
    }
    return true;
}

static struct grammar *gbnf_try(const char *text, char *err, int *rc)
{
    struct grammar_spec spec = { .kind = GRAMMAR_GBNF, .text = text, .text_len = strlen(text) };
    struct grammar *g = NULL;
    *rc = grammar_compile(&g, vocab, &spec, err, ERR_BUF);
    return g;
}

static struct grammar *gbnf(const char *text)
{
    char err[ERR_BUF] = "";
    int rc;
    struct grammar *g = gbnf_try(text, err, &rc);
    CHECK(g && rc == 0, "compile failed (%d: %s):\n%s", rc, err, text);
    return g;
}

/* Feeds text as the tokenizer splits it (checking the split spells text byte for byte);
 * true when every token is accepted and the match is complete. */
static bool accepts(struct grammar *g, const char *text)
{
    int32_t ids[4096];
    size_t len = strlen(text), at = 0;
    int n = tok_encode(tok, text, len, false, false, ids, 4096);
    CHECK(n >= 0 && n <= 4096, "encode %s", text);
    bool spelled = true;
    for (int i = 0; i < n && spelled; i++) {
        char buf[256];
        int bl = tok_token_bytes(tok, ids[i], false, buf, sizeof buf);
        spelled = bl > 0 && bl <= (int)sizeof buf && at + (size_t)bl <= len && !memcmp(text + at, buf, (size_t)bl);
        at += (size_t)(bl > 0 ? bl : 0);
    }
    CHECK(spelled && at == len, "the tokenizer does not spell '%s' byte for byte", text);
    struct grammar_matcher *m = gm_create(g);
    bool ok = m != NULL;
    for (int i = 0; i < n && ok; i++)
        ok = gm_accept(m, ids[i]) == 0;
    ok = ok && gm_can_end(m) && gm_accept(m, eog_ids[0]) == 0;
    gm_free(m);
    return ok;
}

/* The same one byte-token at a time. */
static bool accepts_bytes(struct grammar *g, const char *text)
{
    struct grammar_matcher *m = gm_create(g);
    bool ok = m != NULL;
    for (const char *c = text; *c && ok; c++) {
        int id = byte_tok[(uint8_t)*c];
        CHECK(id >= 0, "no token for byte 0x%02X", (uint8_t)*c);
        ok = id >= 0 && gm_accept(m, id) == 0;
    }
    ok = ok && gm_can_end(m);
    gm_free(m);
    return ok;
}

static bool mask_has(const uint32_t *mask, int id) { return (mask[id >> 5] >> (id & 31)) & 1u; }

static void expect_texts(const char *grammar_text, const char *const *good, const char *const *bad)
{
    struct grammar *g = gbnf(grammar_text);
    if (!g)
        return;
    for (int i = 0; good && good[i]; i++) {
        CHECK(accepts(g, good[i]), "should accept '%s' (tokens):\n%s", good[i], grammar_text);
        CHECK(accepts_bytes(g, good[i]), "should accept '%s' (bytes):\n%s", good[i], grammar_text);
    }
    for (int i = 0; bad && bad[i]; i++) {
        CHECK(!accepts(g, bad[i]), "should refuse '%s' (tokens):\n%s", bad[i], grammar_text);
        CHECK(!accepts_bytes(g, bad[i]), "should refuse '%s' (bytes):\n%s", bad[i], grammar_text);
    }
    grammar_unref(g);
}

#define TEXTS(...) ((const char *const[]){ __VA_ARGS__, NULL })

/* ---- syntax ------------------------------------------------------------------------------------ */

static void test_literals_and_alternatives(void)
{
    expect_texts("root ::= \"yes\" | \"no\"", TEXTS("yes", "no"), TEXTS("", "y", "yesno", "maybe", "Yes"));
    /* rules in any order, names with - _ and digits, groups, comments, rules over lines */
    expect_texts("# a greeting\n"
                 "root ::= greet-1 \" \" who_2   # trailing comment\n"
                 "    \"!\"\n"
                 "greet-1 ::= \"hi\" |\n"
                 "            \"hello\"\n"
                 "who_2 ::= ( \"Ann\"\n"
                 "          | \"Bob\" ) ( \", \" ( \"Ann\" | \"Bob\" ) )?\n",
                 TEXTS("hi Ann!", "hello Bob!", "hi Ann, Bob!"), TEXTS("hi Ann", "hey Ann!", "hi Ann,Bob!", "hiAnn!"));
    /* an empty alternative, an empty literal, an empty group */
    expect_texts("root ::= \"a\" opt \"\" ()\nopt ::= \"b\" | ", TEXTS("a", "ab"), TEXTS("", "b", "abb"));
    /* escapes: code points written as UTF-8 (\x is a code point, as in llama.cpp) */
    expect_texts("root ::= \"\\x41\\u00e9\\t\\\"\\\\\\n\\U0001F600\\r\\'\\[\\]\\xe9\"",
                 TEXTS("A\xc3\xa9\t\"\\\n\xf0\x9f\x98\x80\r'[]\xc3\xa9"), TEXTS("A\xc3\xa9\t\"\\\n", "Ae"));
    /* raw UTF-8 in literals */
    expect_texts("root ::= \"caf\xc3\xa9 \xe4\xb8\xad\"", TEXTS("caf\xc3\xa9 \xe4\xb8\xad"), TEXTS("cafe \xe4\xb8\xad"));
    /* a reference chain and a rule used twice */
    expect_texts("root ::= a \"-\" a\na ::= b\nb ::= \"x\" | \"yy\"", TEXTS("x-x", "yy-x", "x-yy"), TEXTS("x-", "xx-x"));
    /* unreachable rules are fine */
    expect_texts("root ::= \"a\"\nunused ::= \"b\" unused2\nunused2 ::= \"c\"", TEXTS("a"), TEXTS("b", "bc"));
}

static void test_classes(void)
{
    expect_texts("root ::= [a-cx] [0-9A-F]", TEXTS("a0", "cF", "x9"), TEXTS("d0", "aG", "a", "a0a"));
    /* '-' first or last and escaped ']' are literals */
    expect_texts("root ::= [-a] [b-] [\\]\\[]", TEXTS("-b]", "a-["), TEXTS("bb]", "--a"));
    /* negated: any character not listed, multi-byte ones included */
    expect_texts("root ::= [^a-z\"]",
                 TEXTS("A", "\n", "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "{"),
                 TEXTS("a", "q", "\"", "", "AB", "\xc3\xa9\xc3\xa9"));
    expect_texts("root ::= [^\xc3\xa9]+", TEXTS("e", "abc", "\xe4\xb8\xad\xe4\xb8\xad"),
                 TEXTS("\xc3\xa9", "a\xc3\xa9"));
    /* non-ASCII members and ranges, raw and escaped */
    expect_texts("root ::= [\xc3\xa9\xe4\xb8\xad-\xe4\xb8\xaf\\u00e0-\\u00e2x]*",
                 TEXTS("", "\xc3\xa9", "\xe4\xb8\xad\xe4\xb8\xae\xe4\xb8\xaf", "x\xc3\xa0\xc3\xa2"),
                 TEXTS("\xe4\xb8\xb0", "\xc3\xa3", "e", "\xc3\xa8"));
    /* '.' is any character, a line break included (as in llama.cpp) */
    expect_texts("root ::= \"<\" . \">\"", TEXTS("<a>", "<\n>", "<\xe4\xb8\xad>", "<\xf0\x9f\x98\x80>", "<>>"),
                 TEXTS("<>", "<ab>", "<\xe4\xb8\xad\xe4\xb8\xad>"));
    /* class repetitions (one DFA) against the same through a group (rules) */
    const char *g1 = "root ::= [a-c]* \"|\" [0-9]+ \"|\" [x]?";
    const char *g2 = "root ::= ([a-c])* \"|\" ([0-9])+ \"|\" ([x])?";
    const char *good[] = { "|5|", "abc|1|", "|0123|x", "cab|9|x", NULL };
    const char *bad[] = { "|", "||", "abd|1|", "a||", "|1|xx", "a|1|y", NULL };
    expect_texts(g1, good, bad);
    expect_texts(g2, good, bad);
    /* a class that matches nothing: its alternative is dropped */
    expect_texts("root ::= [] | \"ok\"", TEXTS("ok"), TEXTS(""));
}

static void test_repetition(void)
{
    expect_texts("root ::= \"ab\"{2,3}", TEXTS("abab", "ababab"), TEXTS("ab", "abababab", "aba", ""));
    expect_texts("root ::= [0-9]{2,3}", TEXTS("12", "123"), TEXTS("1", "1234", ""));
    expect_texts("root ::= (\"x\" | \"yz\"){ 2 , 3 }", TEXTS("xx", "xyz", "yzyzx"), TEXTS("x", "xxxx", "yzyzyzx"));
    expect_texts("root ::= \"a\"{3}", TEXTS("aaa"), TEXTS("aa", "aaaa"));
    expect_texts("root ::= \"a\"{2,}", TEXTS("aa", "aaa", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"), TEXTS("a", ""));
    expect_texts("root ::= \"a\"{0} \"b\"", TEXTS("b"), TEXTS("ab"));
    expect_texts("root ::= \"a\"{0,2} \"b\"", TEXTS("b", "ab", "aab"), TEXTS("aaab"));
    expect_texts("root ::= \"ab\"* \"c\"", TEXTS("c", "abc", "ababc"), TEXTS("ac", "abac"));
    expect_texts("root ::= \"ab\"+ \"c\"", TEXTS("abc", "ababc"), TEXTS("c", "abac"));
    expect_texts("root ::= \"ab\"? \"c\"", TEXTS("c", "abc"), TEXTS("ababc"));
    /* a postfix applies to the item before it, postfixes stack, spaces allowed */
    expect_texts("root ::= \"a\" \"b\" *", TEXTS("a", "abbb"), TEXTS("abab"));
    expect_texts("root ::= (\"a\" \"b\"?){2}", TEXTS("aa", "aba", "abab", "aab"), TEXTS("a", "abb", "aaa"));
    expect_texts("root ::= \"ab\"{2}? \"c\"", TEXTS("c", "ababc"), TEXTS("abc"));
    /* long repetitions: up to 1000, 1000 exactly */
    {
        struct grammar *g = gbnf("root ::= \"x\"{1000}");
        char text[1002];
        memset(text, 'x', 1000);
        text[1000] = 0;
        if (g) {
            CHECK(accepts(g, text), "x{1000} of 1000");
            text[999] = 0;
            CHECK(!accepts(g, text), "x{1000} of 999");
            grammar_unref(g);
        }
        g = gbnf("root ::= (\"x\" [yz]){0,1000}");
        if (g) {
            CHECK(accepts(g, "xyxzxy") && !accepts(g, "xyx"), "(x[yz]){0,1000}");
            grammar_unref(g);
        }
    }
}

static void test_nullable_and_recursion(void)
{
    /* nullable rules in front of and between others */
    expect_texts("root ::= a b \"c\"\na ::= \"x\"?\nb ::= a a | \"y\"",
                 TEXTS("c", "xc", "xxc", "xxxc", "yc", "xyc"), TEXTS("xxxxc", "yyc", "x"));
    /* nullable items under a bounded repetition are fine */
    expect_texts("root ::= (\"a\"?){0,20} \"b\"", TEXTS("b", "ab", "aaaaab"), TEXTS("a", "bb"));
    /* an unbounded repetition of a regular part is one DFA: ("a"?)* is a*, which the rules
     * could not run (the same with a rule inside is refused: test_compile_errors) */
    expect_texts("root ::= (\"a\"?)* \"b\"", TEXTS("b", "ab", "aaaaab"), TEXTS("a", "bb", "ba"));
    expect_texts("root ::= (\"a\"?){3,} \"b\"", TEXTS("b", "aaaab"), TEXTS("a", "bab"));
    expect_texts("root ::= \"\\\"\" ( [^\"\\\\] | \"\\\\\" [\"\\\\nt] )* \"\\\"\"",
                 TEXTS("\"\"", "\"a b\"", "\"q\\\"x\\n\\\\\"", "\"\xc3\xa9\""),
                 TEXTS("\"a", "\"a\"b", "\"\\x\"", "\"\\\""));
    /* balanced parentheses: right recursion with an empty alternative */
    const char *paren = "root ::= p\np ::= \"(\" p \")\" p | \"\"";
    expect_texts(paren, TEXTS("", "()", "(())()", "()()(()(()))"), TEXTS("(", ")", "(()", "())(", ")("));
    struct grammar *g = gbnf(paren);
    if (g) {
        char deep[401];
        for (int i = 0; i < 200; i++) {
            deep[i] = '(';
            deep[200 + i] = ')';
        }
        deep[400] = 0;
        CHECK(accepts(g, deep), "200 nested parentheses");
        deep[399] = 0;
        CHECK(!accepts(g, deep), "one ')' short");
        grammar_unref(g);
    }
    /* an alternative that can never finish is dropped: "b" is refused at once */
    g = gbnf("root ::= \"a\" | \"b\" loop\nloop ::= \"c\" loop");
    if (g) {
        CHECK(accepts(g, "a") && !accepts(g, "b") && !accepts(g, "bc"), "unfinishable alternative");
        struct grammar_matcher *m = gm_create(g);
        CHECK(gm_accept(m, byte_tok['b']) != 0, "'b' leads only into a rule that never finishes: refused");
        gm_free(m);
        grammar_unref(g);
    }
}

/* Ambiguous grammars: many parses of one text reach equal configurations along different
 * paths; the matcher keeps one, so masks stay cheap (without that the set doubles with
 * every byte of a long token of dashes and a mask takes minutes). Grammars whose parses
 * really multiply hit the matcher's work bound and fail fast. */
static void test_ambiguous(void)
{
    const char *grammars[] = {
        "root ::= (\"-\"+)+ \"!\"",
        "root ::= (\"-\" | \"--\" | \"-\"* \"-\")+ \"!\"",
        "root ::= e \"!\"\ne ::= t ( \"-\" t )*\nt ::= \"-\"? [-9]{1,6}",
    };
    uint32_t *mask = calloc((size_t)nwords, 4);
    for (size_t i = 0; i < sizeof grammars / sizeof grammars[0] && mask; i++) {
        struct grammar *g = gbnf(grammars[i]);
        if (!g)
            continue;
        CHECK(accepts(g, "----------------!") && !accepts(g, "----------------"), "%s", grammars[i]);
        struct grammar_matcher *m = gm_create(g);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int k = 0; k < 8 && m; k++) {
            int rc = gm_fill_mask_uncached(m, mask);
            CHECK(rc == 0, "%s: mask %d: rc %d", grammars[i], k, rc);
            CHECK(mask_has(mask, byte_tok['-']) && gm_accept(m, byte_tok['-']) == 0, "'-' at %d", k);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        CHECK(s < 2.0, "%s: 8 masks took %.2f s", grammars[i], s);
        gm_free(m);
        grammar_unref(g);
    }
    /* parses that really multiply (2^k pending endings after k dashes) hit the matcher's
     * work bound: the mask fails fast with ERR_RANGE instead of holding the thread */
    struct grammar *g = gbnf("root ::= s \"!\"\ns ::= \"-\" s \"a\" | \"-\" s \"b\" | \"\"");
    if (g && mask) {
        CHECK(accepts_bytes(g, "--ab!") && !accepts_bytes(g, "--a!"), "2^k grammar texts");
        struct grammar_matcher *m = gm_create(g);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int rc = gm_fill_mask(m, mask);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        CHECK(rc == ERR_RANGE && s < 5.0, "2^k grammar: mask rc %d after %.2f s", rc, s);
        gm_free(m);
    }
    grammar_unref(g);
    /* a start that expands 2^30 ways without a byte is refused at compile time */
    char text[2048];
    int n = snprintf(text, sizeof text, "root ::= r0\n");
    for (int k = 0; k < 30; k++)
        n += snprintf(text + n, sizeof text - (size_t)n, "r%d ::= r%d | r%d\n", k, k + 1, k + 1);
    snprintf(text + n, sizeof text - (size_t)n, "r30 ::= \"-\"\n");
    char err[ERR_BUF] = "";
    int rc;
    g = gbnf_try(text, err, &rc);
    CHECK(!g && rc == ERR_RANGE && strstr(err, "ambiguous"), "2^30 expansions: rc %d %s", rc, err);
    grammar_unref(g);
    free(mask);
}

/* ---- compile errors --------------------------------------------------------------------------- */

static void test_compile_errors(void)
{
    static const struct {
        const char *text;
        int rc;
        const char *needle, *needle2;
    } cases[] = {
        { "", ERR_INVALID, "empty grammar", "" },
        { "  # just a comment\n\n", ERR_INVALID, "empty grammar", "" },
        { "start ::= \"a\"", ERR_INVALID, "'root'", "" },
        { "root ::= \"a\" foo", ERR_INVALID, "undefined rule 'foo'", "line 1 col 14" },
        { "root ::= a\na ::= \"x\" b\n", ERR_INVALID, "undefined rule 'b'", "line 2 col 11" },
        { "root ::= \"a\"\nroot ::= \"b\"", ERR_INVALID, "defined twice", "line 2 col 1" },
        { "root ::= \"abc", ERR_INVALID, "unterminated string", "col 10" },
        { "root ::= [abc", ERR_INVALID, "unterminated character class", "" },
        { "root ::= \"\\q\"", ERR_INVALID, "unknown escape", "" },
        { "root ::= \"\\x4\"", ERR_INVALID, "2 hex digits", "" },
        { "root ::= \"\\uD800\"", ERR_INVALID, "not a Unicode character", "" },
        { "root ::= \"\xff\"", ERR_INVALID, "invalid UTF-8", "" },
        { "root ::= [z-a]", ERR_INVALID, "reversed range", "" },
        { "root ::= \"a\"{3,2}", ERR_INVALID, "below the minimum", "" },
        { "root ::= \"a\"{1001}", ERR_RANGE, "above 1000", "" },
        { "root ::= \"a\"{2,1001}", ERR_RANGE, "above 1000", "" },
        { "root ::= \"a\"{,3}", ERR_INVALID, "expected a number", "" },
        { "root ::= \"a\"{2", ERR_INVALID, "expected '}'", "" },
        { "root ::= * \"a\"", ERR_INVALID, "nothing to repeat", "" },
        { "root ::= \"a\" )", ERR_INVALID, "unmatched ')'", "" },
        { "root ::= ( \"a\"", ERR_INVALID, "unclosed '('", "col 10" },
        { "root ::= ( \"a\"\nb ::= \"c\" )", ERR_INVALID, "unclosed '('", "" },
        { "root ::= \"a\" @", ERR_INVALID, "unexpected '@'", "" },
        { "root ::= \"a\"\n::= \"b\"", ERR_INVALID, "unexpected ':'", "line 2 col 1" },
        { "\n\nfoo bar ::= \"a\"", ERR_INVALID, "expected '::=' after 'foo'", "line 3 col 4" },
        /* a rule runs on to the next "name ::=", so a stray name is a reference */
        { "root ::= \"a\"\n\nfoo bar", ERR_INVALID, "undefined rule 'foo'", "line 3 col 1" },
        { "\"a\" ::= root", ERR_INVALID, "expected a rule name", "" },
        { "root ::= <think>", ERR_UNSUPPORTED, "token references", "" },
        /* left recursion: direct, indirect, through a nullable prefix, through a group */
        { "root ::= a\na ::= a \"x\" | \"y\"", ERR_INVALID, "rule 'a' is left-recursive", "(a -> a)" },
        { "root ::= a\na ::= b \"x\"\nb ::= a | \"y\"", ERR_INVALID, "left-recursive", "a -> b -> a" },
        { "root ::= a\na ::= c a \"x\" | \"y\"\nc ::= \"z\"?", ERR_INVALID, "rule 'a' is left-recursive", "line 2 col 1" },
        { "root ::= ( root \"x\" ) | \"y\"", ERR_INVALID, "rule 'root' is left-recursive", "" },
        { "root ::= \"a\"\nx ::= y\ny ::= x", ERR_INVALID, "left-recursive", "" },
        /* a repetition of something empty loops without consuming text */
        { "root ::= (a?)*\na ::= \"a\"", ERR_INVALID, "'*' repetition repeats something that can match empty text",
          "col 14" },
        { "root ::= e+ \"b\"\ne ::= \"\" | \"a\"", ERR_INVALID, "'+' repetition repeats something", "" },
        { "root ::= (a?){3,}\na ::= \"a\"", ERR_INVALID, "'{m,n}' repetition repeats something", "" },
        /* a root with no finite text */
        { "root ::= \"a\" root", ERR_INVALID, "matches no finite text", "" },
        { "root ::= []", ERR_INVALID, "matches no finite text", "" },
        { "root ::= [^\\x00-\\U0010FFFF]", ERR_INVALID, "matches no finite text", "" },
        /* closure nesting the matcher could not follow */
        { "root ::= (\"a\"?){0,100} \"b\"", ERR_RANGE, "more than 256 deep", "" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[ERR_BUF] = "";
        int rc;
        struct grammar *g = gbnf_try(cases[i].text, err, &rc);
        CHECK(rc == cases[i].rc && !g, "%s: rc %d (%s), want %d", cases[i].text, rc, err, cases[i].rc);
        CHECK(strstr(err, cases[i].needle) && strstr(err, cases[i].needle2) && strstr(err, "GBNF"),
              "%s: message '%s' lacks '%s' / '%s'", cases[i].text, err, cases[i].needle, cases[i].needle2);
        grammar_unref(g);
    }
    /* parentheses nested 64 deep compile, 65 do not */
    char text[256];
    for (int depth = 64; depth <= 65; depth++) {
        int n = snprintf(text, sizeof text, "root ::= ");
        for (int k = 0; k < depth; k++)
            text[n++] = '(';
        text[n++] = '"';
        text[n++] = 'a';
        text[n++] = '"';
        for (int k = 0; k < depth; k++)
            text[n++] = ')';
        text[n] = 0;
        char err[ERR_BUF] = "";
        int rc;
        struct grammar *g = gbnf_try(text, err, &rc);
        if (depth == 64)
            CHECK(g && accepts(g, "a"), "64 nested groups: %s", err);
        else
            CHECK(!g && rc == ERR_RANGE && strstr(err, "64"), "65 nested groups: %d %s", rc, err);
        grammar_unref(g);
    }
    /* the wrapper works around a GBNF value too */
    struct grammar_spec spec = { .kind = GRAMMAR_GBNF, .text = "root ::= [0-9]+", .text_len = 15,
                                 .prefix = "<", .suffix = ">", .separator = ",", .min_items = 1, .max_items = 2 };
    struct grammar *g = NULL;
    char err[ERR_BUF] = "";
    CHECK(grammar_compile(&g, vocab, &spec, err, sizeof err) == 0, "wrapped GBNF: %s", err);
    if (g) {
        CHECK(accepts(g, "<12>") && accepts(g, "<1>,<23>") && !accepts(g, "<1>,<2>,<3>") && !accepts(g, "<>"),
              "wrapped GBNF texts");
        grammar_unref(g);
    }
    spec = (struct grammar_spec){ .kind = GRAMMAR_GBNF };
    CHECK(grammar_compile(&g, vocab, &spec, err, sizeof err) == ERR_INVALID && !g, "no text: %s", err);
}

/* ---- random walks ------------------------------------------------------------------------------- */

static bool is_eog(int id) { return id == eog_ids[0] || (n_eog > 1 && id == eog_ids[1]); }

/* True when the token's text holds one of the bytes in closers (ends something). */
static bool closes(int id, const char *closers)
{
    char buf[256];
    int len = tok_token_bytes(tok, id, false, buf, sizeof buf);
    for (int i = 0; i < len && i < (int)sizeof buf; i++)
        if (strchr(closers, buf[i]))
            return true;
    return false;
}

/* Compares the mask at m's state with gm_accept (on a copy) for every token of the
 * vocabulary; returns the mismatches. */
static int mask_mismatches(struct grammar *g, const struct grammar_matcher *m, const uint32_t *mask)
{
    int V = grammar_vocab_size(vocab), bad = 0;
    struct grammar_matcher *c = gm_create(g);
    if (!c || gm_copy(c, m)) {
        gm_free(c);
        return 1;
    }
    for (int id = 0; id < V; id++) {
        bool ok = gm_accept(c, id) == 0;
        if (ok != mask_has(mask, id)) {
            if (bad++ < 3) {
                char buf[64];
                int len = tok_token_bytes(tok, id, false, buf, sizeof buf);
                fprintf(stderr, "  mask mismatch: token %d '%.*s': mask %d, accept %d\n", id,
                        len < 0 ? 0 : len > 64 ? 64 : len, buf, mask_has(mask, id), ok);
            }
        }
        if (ok && gm_copy(c, m))
            bad++;
    }
    gm_free(c);
    return bad;
}

/* Walks g with seeded random allowed tokens until an end token: the end is taken when
 * allowed after min_end steps (or with a 1 in 16 chance before); tokens without a byte of
 * closers are preferred in the first min_end / 3 steps (so walks go somewhere) and tokens
 * with one past 2 * min_end / 3 steps (so walks finish). Every check_every
 * steps (0: never) the mask is compared with gm_accept. Writes the text's bytes (malloc)
 * and returns the number of tokens, or -1 (dead end or cap tokens). */
static int walk(struct grammar *g, unsigned seed, const char *closers, int min_end, int cap, int check_every,
                char **text)
{
    int V = grammar_vocab_size(vocab), n = 0, result = -1;
    size_t len = 0;
    uint32_t *mask = calloc((size_t)nwords, 4);
    int32_t *allowed = malloc(sizeof *allowed * (size_t)V), *closing = malloc(sizeof *closing * (size_t)V);
    int32_t *opening = malloc(sizeof *opening * (size_t)V);
    char *out = malloc((size_t)cap * 256 + 1);
    struct grammar_matcher *m = gm_create(g);
    while (m && mask && allowed && closing && opening && out && n < cap) {
        if (gm_fill_mask(m, mask))
            break;
        if (check_every && n % check_every == 0)
            CHECK(mask_mismatches(g, m, mask) == 0, "seed %u step %d: mask differs from gm_accept", seed, n);
        int na = 0, nc = 0, no = 0;
        bool end_ok = false;
        for (int id = 0; id < V; id++) {
            if (!mask_has(mask, id))
                continue;
            if (is_eog(id)) {
                end_ok = true;
                continue;
            }
            allowed[na++] = id;
            if (closes(id, closers))
                closing[nc++] = id;
            else
                opening[no++] = id;
        }
        CHECK(end_ok == gm_can_end(m), "seed %u step %d: end allowed %d, gm_can_end %d", seed, n, end_ok, gm_can_end(m));
        CHECK(!gm_is_done(m) || na == 0, "seed %u step %d: done yet %d tokens allowed", seed, n, na);
        if (end_ok && (na == 0 || n >= min_end || rand_r(&seed) % 16 == 0)) {
            CHECK(gm_accept(m, eog_ids[0]) == 0 && gm_is_done(m), "end token refused though allowed");
            result = n;
            break;
        }
        if (na == 0) {
            CHECK(0, "seed %u: dead end after %d tokens: no token allowed and no end", seed, n);
            break;
        }
        int id = allowed[rand_r(&seed) % (unsigned)na];
        if (n > 2 * min_end / 3 && nc > 0 && rand_r(&seed) % 3)
            id = closing[rand_r(&seed) % (unsigned)nc];
        else if (n < min_end / 3 && no > 0 && rand_r(&seed) % 3)
            id = opening[rand_r(&seed) % (unsigned)no];
        if (gm_accept(m, id)) {
            CHECK(0, "seed %u: allowed token %d refused", seed, id);
            break;
        }
        int bl = tok_token_bytes(tok, id, false, out + len, 256);
        len += (size_t)(bl > 0 && bl <= 256 ? bl : 0);
        n++;
    }
    if (out)
        out[len] = 0;
    *text = out;
    gm_free(m);
    free(mask);
    free(allowed);
    free(closing);
    free(opening);
    return result;
}

/* JSON, written from RFC 8259 (whitespace bounded so that walks stay short). */
static const char *const json_gbnf =
    "root    ::= object\n"
    "value   ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object  ::= \"{\" ws ( member ( \",\" ws member )* )? \"}\"\n"
    "member  ::= string ws \":\" ws value ws\n"
    "array   ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
    "string  ::= \"\\\"\" char* \"\\\"\"\n"
    "char    ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "number  ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?\n"
    "ws      ::= | \" \" | \"\\n\" [ ]{0,8}\n";

static void test_json_walks(void)
{
    struct grammar *g = gbnf(json_gbnf);
    if (!g)
        return;
    expect_texts(json_gbnf, TEXTS("{}", "{\"a\": 1}", "{\"a\":[1, -2.5e3, true, null, {\"b\": \"\\u00e9\\n\"}]}",
                                  "{\n  \"k\": \"caf\xc3\xa9\"\n}"),
                 TEXTS("[]", "{\"a\" 1}", "{\"a\": 01}", "{\"a\": \"\x01\"}", "{\"a\": tru}", "{,}"));
    int finished = 0, long_walks = 0;
    for (unsigned seed = 1; seed <= 10; seed++) {
        char *text = NULL;
        int n = walk(g, seed * 7919u, "\"}],", 45, 600, seed <= 2 ? 11 : 0, &text);
        long_walks += n >= 10;
        CHECK(n >= 0, "seed %u: walk did not finish: %s", seed, text ? text : "");
        if (n >= 0) {
            finished++;
            cJSON *v = cJSON_Parse(text);
            CHECK(v && cJSON_IsObject(v), "seed %u: not a JSON object: %s", seed, text);
            CHECK(accepts(g, text), "seed %u: the output re-tokenised is refused: %s", seed, text);
            cJSON_Delete(v);
        }
        free(text);
    }
    CHECK(finished == 10, "%d of 10 walks finished", finished);
    CHECK(long_walks >= 6, "only %d of 10 walks reached 10 tokens", long_walks);
    grammar_unref(g);
}

/* Arithmetic expressions, and a recursive-descent parser of the same language. */
static const char *const arith_gbnf =
    "root   ::= expr\n"
    "expr   ::= term ( ws [-+] ws term )*\n"
    "term   ::= factor ( ws [*/] ws factor )*\n"
    "factor ::= \"-\"? ( number | \"(\" ws expr ws \")\" )\n"
    "number ::= [0-9]{1,6} ( \".\" [0-9]{1,3} )?\n"
    "ws     ::= \" \"?\n";

static bool rd_expr(const char **s, int depth);

static int rd_digits(const char **s, int max)
{
    int n = 0;
    while (**s >= '0' && **s <= '9') {
        (*s)++;
        n++;
    }
    return n <= max ? n : 0;
}

static bool rd_factor(const char **s, int depth)
{
    if (**s == '-')
        (*s)++;
    if (**s == '(') {
        (*s)++;
        if (**s == ' ')
            (*s)++;
        if (depth > 200 || !rd_expr(s, depth + 1))
            return false;
        if (**s == ' ')
            (*s)++;
        if (**s != ')')
            return false;
        (*s)++;
        return true;
    }
    if (!rd_digits(s, 6))
        return false;
    if (**s == '.') {
        (*s)++;
        return rd_digits(s, 3) > 0;
    }
    return true;
}

/* item (ws op ws item)* with the operators in ops */
static bool rd_chain(const char **s, int depth, const char *ops, bool (*item)(const char **, int))
{
    if (!item(s, depth))
        return false;
    for (;;) {
        const char *save = *s;
        if (**s == ' ')
            (*s)++;
        if (!**s || !strchr(ops, **s)) {
            *s = save;
            return true;
        }
        (*s)++;
        if (**s == ' ')
            (*s)++;
        if (!item(s, depth))
            return false;
    }
}

static bool rd_term(const char **s, int depth) { return rd_chain(s, depth, "*/", rd_factor); }

static bool rd_expr(const char **s, int depth) { return rd_chain(s, depth, "+-", rd_term); }

static bool arith_valid(const char *text) { return rd_expr(&text, 0) && !*text; }

static void test_arith_walks(void)
{
    struct grammar *g = gbnf(arith_gbnf);
    if (!g)
        return;
    const char *good[] = { "1", "-2.5", "1 + 2*3", "(1 - -2) / 3.25", "((4))", "1+2 - 3", NULL };
    const char *bad[] = { "", "1 +", "(1", "1  + 2", "1.2345", "1234567", "a", "()", NULL };
    expect_texts(arith_gbnf, good, bad);
    for (int i = 0; good[i]; i++)
        CHECK(arith_valid(good[i]), "checker refuses '%s'", good[i]);
    for (int i = 0; bad[i]; i++)
        CHECK(!arith_valid(bad[i]), "checker accepts '%s'", bad[i]);
    int finished = 0, long_walks = 0;
    for (unsigned seed = 1; seed <= 10; seed++) {
        char *text = NULL;
        int n = walk(g, seed * 104729u, ")", 30, 400, seed == 1 ? 7 : 0, &text);
        long_walks += n >= 10;
        CHECK(n >= 0, "seed %u: walk did not finish: %s", seed, text ? text : "");
        if (n >= 0) {
            finished++;
            CHECK(arith_valid(text), "seed %u: not an expression: %s", seed, text);
            CHECK(accepts(g, text), "seed %u: the output re-tokenised is refused: %s", seed, text);
        }
        free(text);
    }
    CHECK(finished == 10, "%d of 10 walks finished", finished);
    CHECK(long_walks >= 6, "only %d of 10 walks reached 10 tokens", long_walks);
    grammar_unref(g);
}

/* Seeded mutations of the two grammars (bytes deleted, duplicated or replaced by syntax
 * characters) compile or fail cleanly: a known error code with a GBNF message; a grammar
 * that compiles gives a mask and accepts its first allowed token. Run under ASan by
 * `make asan`. */
static void test_mutations(void)
{
    static const char alphabet[] = "\"[]()|*+?{},.-^\\ \n#:=axr0u9";
    const char *bases[] = { json_gbnf, arith_gbnf };
    unsigned seed = 12345;
    int compiled = 0, refused = 0;
    uint32_t *mask = calloc((size_t)nwords, 4);
    for (int it = 0; it < 600 && mask; it++) {
        const char *base = bases[it % 2];
        size_t n = strlen(base);
        char *t = malloc(n * 2 + 16);
        memcpy(t, base, n + 1);
        for (int k = 0, edits = 1 + (int)(rand_r(&seed) % 4); k < edits; k++) {
            size_t at = rand_r(&seed) % (n ? n : 1);
            switch (rand_r(&seed) % 3) {
            case 0: /* delete */
                memmove(t + at, t + at + 1, n - at);
                n--;
                break;
            case 1: /* duplicate */
                memmove(t + at + 1, t + at, n - at + 1);
                n++;
                break;
            default:
                t[at] = alphabet[rand_r(&seed) % (sizeof alphabet - 1)];
            }
        }
        char err[ERR_BUF] = "";
        int rc;
        struct grammar *g = gbnf_try(t, err, &rc);
        if (rc == 0) {
            compiled++;
            struct grammar_matcher *m = gm_create(g);
            CHECK(m && gm_fill_mask(m, mask) == 0, "mask of a mutated grammar");
            int first = -1;
            for (int id = 0; m && id < grammar_vocab_size(vocab) && first < 0; id++)
                if (mask_has(mask, id))
                    first = id;
            CHECK(first >= 0 && gm_accept(m, first) == 0, "mutated grammar: no token allowed or the first refused:\n%s", t);
            gm_free(m);
        } else {
            refused++;
            CHECK(!g && (rc == ERR_INVALID || rc == ERR_RANGE || rc == ERR_UNSUPPORTED) &&
                      (strstr(err, "GBNF") || strstr(err, "grammar too large")),
                  "mutated grammar: rc %d '%s':\n%s", rc, err, t);
        }
        grammar_unref(g);
        free(t);
    }
    free(mask);
    CHECK(compiled > 50 && refused > 50, "mutations: %d compiled, %d refused", compiled, refused);
}

int main(void)
{
    if (!setup()) {
        printf("0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_literals_and_alternatives);
    RUN(test_classes);
    RUN(test_repetition);
    RUN(test_nullable_and_recursion);
    RUN(test_ambiguous);
    RUN(test_compile_errors);
    RUN(test_json_walks);
    RUN(test_arith_walks);
    RUN(test_mutations);
    grammar_vocab_free(vocab);
    tok_free(tok);
    return test_summary();
}

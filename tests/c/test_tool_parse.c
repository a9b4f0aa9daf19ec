/* test_tool_parse.c — unit tests for src/api/tool_parse.c and src/api/reasoning.c.
 *
 * Each case is a recorded-style model output and the events it must give, written as one
 * string: "C[text]" content, "R[text]" reasoning, "T0[name](args)" call 0 (consecutive
 * content / reasoning events merged, since how text is cut into events is free). Every
 * case is fed whole, byte by byte, split at every byte position and at every pair of
 * positions; the result must be the same each time, so nothing of a tag leaks into the
 * content whatever the deltas. Ids must look like OpenAI's ("call_" + 24 alphanumerics).
 */
#include "api/openai.h"
#include "api/openai_internal.h"
#include "api/reasoning.h"
#include "api/tool_parse.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "test.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define DS_CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define DS_CALLS_END "<｜tool▁calls▁end｜>"
#define DS_CALL_BEGIN "<｜tool▁call▁begin｜>"
#define DS_CALL_END "<｜tool▁call▁end｜>"
#define DS_SEP "<｜tool▁sep｜>"

struct rec {
    char out[8192];
    size_t len;
    int last_kind;   /* kind of the last text event, -1 after a tool event */
    int bad_ids;
    int starts, args; /* TOOL_START / TOOL_ARGS seen */
    int order_errors; /* ARGS for a call that has not started */
    int fail_after;   /* > 0: the n-th event returns an error */
    int n_events;
};

static void app(struct rec *r, const char *s, size_t n)
{
    if (r->len + n >= sizeof r->out) n = sizeof r->out - 1 - r->len;
    memcpy(r->out + r->len, s, n);
    r->len += n;
    r->out[r->len] = 0;
}

static int on_event(void *ud, const struct tparse_event *ev)
{
    struct rec *r = ud;
    if (r->fail_after > 0 && ++r->n_events >= r->fail_after) return ERR_NOMEM;
    char tmp[600];
    switch (ev->kind) {
    case TP_EV_CONTENT:
    case TP_EV_REASONING:
        if (ev->len == 0) {
            app(r, "<empty>", 7);
            return 0;
        }
        if (r->last_kind == (int)ev->kind) { /* merge: drop the closing ']' */
            r->len--;
        } else {
            app(r, ev->kind == TP_EV_CONTENT ? "C[" : "R[", 2);
        }
        app(r, ev->text, ev->len);
        app(r, "]", 1);
        r->last_kind = (int)ev->kind;
        return 0;
    case TP_EV_TOOL_START: {
        bool ok = !strncmp(ev->id, "call_", 5) && strlen(ev->id) == 29;
        for (int i = 5; ok && ev->id[i]; i++) ok = isalnum((unsigned char)ev->id[i]);
        if (!ok) r->bad_ids++;
        if (ev->index != r->starts) r->order_errors++;
        r->starts++;
        snprintf(tmp, sizeof tmp, "T%d[%s]", ev->index, ev->name);
        app(r, tmp, strlen(tmp));
        break;
    }
    case TP_EV_TOOL_ARGS:
        if (ev->index != r->starts - 1) r->order_errors++;
        r->args++;
        app(r, "(", 1);
        app(r, ev->text, ev->len);
        app(r, ")", 1);
        break;
    }
    r->last_kind = -1;
    return 0;
}

struct tcase {
    const char *name;
    enum tparse_format fmt;
    enum rsn_kind rk;
    bool opened;
    int max_calls;
    const char *text;
    const char *want;
};

/* Feeds text cut at cuts[0, ncuts); returns the recorder's output in r. */
static int run_split(const struct tcase *c, const size_t *cuts, int ncuts, struct rec *r)
{
    struct tparse p;
    memset(r, 0, sizeof *r);
    r->last_kind = -1;
    int rc = tparse_init(&p, c->fmt, c->max_calls, c->rk, c->opened, on_event, r);
    size_t n = strlen(c->text), prev = 0;
    for (int i = 0; i <= ncuts && !rc; i++) {
        size_t at = i < ncuts ? cuts[i] : n;
        rc = tparse_feed(&p, c->text + prev, at - prev);
        prev = at;
    }
    if (!rc) rc = tparse_finish(&p);
    tparse_free(&p);
    return rc;
}

static bool check_case(const struct tcase *c, bool pairs)
{
    struct rec r;
    size_t n = strlen(c->text);
    int rc = run_split(c, NULL, 0, &r);
    CHECK(rc == 0, "%s: rc %d", c->name, rc);
    CHECK(!strcmp(r.out, c->want), "%s whole:\n    got  %s\n    want %s", c->name, r.out, c->want);
    CHECK(r.bad_ids == 0 && r.order_errors == 0 && r.starts == r.args, "%s: ids/order", c->name);
    if (strcmp(r.out, c->want)) return false;
    /* byte by byte */
    size_t cuts[8192];
    for (size_t i = 0; i < n && i < 8192; i++) cuts[i] = i;
    rc = run_split(c, cuts + 1, (int)(n > 0 ? n - 1 : 0), &r);
    CHECK(rc == 0 && !strcmp(r.out, c->want), "%s bytewise:\n    got  %s", c->name, r.out);
    /* every single split point */
    for (size_t a = 0; a <= n; a++) {
        rc = run_split(c, &a, 1, &r);
        if (rc || strcmp(r.out, c->want)) {
            CHECK(false, "%s split at %zu:\n    got  %s\n    want %s", c->name, a, r.out, c->want);
            return false;
        }
    }
    if (!pairs) return true;
    for (size_t a = 0; a <= n; a++)
        for (size_t b = a; b <= n; b++) {
            size_t two[2] = { a, b };
            rc = run_split(c, two, 2, &r);
            if (rc || strcmp(r.out, c->want)) {
                CHECK(false, "%s split at %zu,%zu:\n    got  %s", c->name, a, b, r.out);
                return false;
            }
        }
    return true;
}

static void run_cases(const struct tcase *cs, size_t n, bool pairs)
{
    for (size_t i = 0; i < n; i++) check_case(&cs[i], pairs);
}

#define N(a) (sizeof(a) / sizeof *(a))

static void test_hermes(void)
{
    static const struct tcase cs[] = {
        { "hermes one call", TP_HERMES, RSN_NONE, false, 0,
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
          "T0[get_weather]({\"city\": \"Paris\"})" },
        { "hermes text around", TP_HERMES, RSN_NONE, false, 0,
          "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\nDone <b>.",
          "C[Let me check.\n]T0[f]({})C[\nDone <b>.]" },
        { "hermes two calls", TP_HERMES, RSN_NONE, false, 0,
          "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, 2.5e3, -0.1, true, null]}}\n</tool_call>\n"
          "<tool_call>\n{\"arguments\": {\"y\": \"q\\\"uote\\\\ \\u00e9\"}, \"name\": \"b\"}\n</tool_call>",
          "T0[a]({\"x\": [1, 2.5e3, -0.1, true, null]})C[\n]T1[b]({\"y\": \"q\\\"uote\\\\ \\u00e9\"})" },
        { "hermes parallel off", TP_HERMES, RSN_NONE, false, 1,
          "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>",
          "T0[a]({})" },
        { "hermes malformed json", TP_HERMES, RSN_NONE, false, 0,
          "Hi <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call> bye",
          "C[Hi <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call> bye]" },
        { "hermes closing tag inside a string", TP_HERMES, RSN_NONE, false, 0,
          "<tool_call>{\"name\": \"echo\", \"arguments\": {\"s\": \"a</tool_call>b\"}}</tool_call> ok",
          "T0[echo]({\"s\": \"a</tool_call>b\"})C[ ok]" },
        { "hermes junk after the JSON", TP_HERMES, RSN_NONE, false, 0,
          "<tool_call>{\"name\": \"f\", \"arguments\": {}} oops</tool_call>",
          "C[<tool_call>{\"name\": \"f\", \"arguments\": {}} oops</tool_call>]" },
        { "hermes open string never closed", TP_HERMES, RSN_NONE, false, 0,
          "<tool_call>{\"name\": \"f</tool_call> and more",
          "C[<tool_call>{\"name\": \"f</tool_call> and more]" },
        { "hermes no name", TP_HERMES, RSN_NONE, false, 0,
          "<tool_call>{\"arguments\": {}}</tool_call>",
          "C[<tool_call>{\"arguments\": {}}</tool_call>]" },
        { "hermes unicode args", TP_HERMES, RSN_NONE, false, 0,
          "<tool_call>{\"name\": \"translate\", \"arguments\": {\"text\": \"東京で会いましょう 🙂\", \"to\": \"fr\"}}</tool_call>",
          "T0[translate]({\"text\": \"東京で会いましょう 🙂\", \"to\": \"fr\"})" },
        { "hermes unterminated complete", TP_HERMES, RSN_NONE, false, 0,
          "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"k\": 1}}\n",
          "T0[f]({\"k\": 1})" },
        { "hermes unterminated cut", TP_HERMES, RSN_NONE, false, 0,
          "ok <tool_call>\n{\"name\": \"f\", \"argu",
          "C[ok <tool_call>\n{\"name\": \"f\", \"argu]" },
        { "hermes held prefix released", TP_HERMES, RSN_NONE, false, 0,
          "a < b and <tool_ca", "C[a < b and <tool_ca]" },
        { "hermes arguments as string", TP_HERMES, RSN_NONE, false, 0,
          "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
          "T0[f]({\"a\": 1})" },
        { "hermes no arguments", TP_HERMES, RSN_NONE, false, 0,
          "<tool_call>{\"name\": \"now\"}</tool_call>", "T0[now]({})" },
        { "hermes plain text", TP_HERMES, RSN_NONE, false, 0,
          "The weather in Paris is sunny.", "C[The weather in Paris is sunny.]" },
    };
    run_cases(cs, N(cs), true);
}

static void test_llama3(void)
{
    static const struct tcase cs[] = {
        { "llama3 one", TP_LLAMA3_JSON, RSN_NONE, false, 0,
          "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\"}}",
          "T0[get_weather]({\"city\": \"Lima\"})" },
        { "llama3 python_tag two", TP_LLAMA3_JSON, RSN_NONE, false, 0,
          "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"n\": 1}}; {\"name\": \"b\", \"parameters\": {}}",
          "T0[a]({\"n\": 1})T1[b]({})" },
        { "llama3 text", TP_LLAMA3_JSON, RSN_NONE, false, 0,
          "It is {probably} sunny.", "C[It is {probably} sunny.]" },
        { "llama3 json answer", TP_LLAMA3_JSON, RSN_NONE, false, 0,
          "{\"answer\": 42} is it", "C[{\"answer\": 42} is it]" },
        { "llama3 cut off", TP_LLAMA3_JSON, RSN_NONE, false, 0,
          "{\"name\": \"a\", \"parameters\": {\"n\":", "C[{\"name\": \"a\", \"parameters\": {\"n\":]" },
        { "llama3 text after", TP_LLAMA3_JSON, RSN_NONE, false, 0,
          "{\"name\": \"a\", \"parameters\": {}} thanks", "T0[a]({})C[thanks]" },
    };
    run_cases(cs, N(cs), true);
}

static void test_mistral(void)
{
    static const struct tcase cs[] = {
        { "mistral two", TP_MISTRAL, RSN_NONE, false, 0,
          "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": \"1\"}}, {\"name\": \"b\", \"arguments\": {\"y\": [2]}}]",
          "T0[a]({\"x\": \"1\"})T1[b]({\"y\": [2]})" },
        { "mistral text before", TP_MISTRAL, RSN_NONE, false, 0,
          "Sure.[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}]",
          "C[Sure.]T0[a]({})" },
        { "mistral malformed element", TP_MISTRAL, RSN_NONE, false, 0,
          "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"nome\": 1}]",
          "C[[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"nome\": 1}]]" },
        { "mistral named (v11 tokenizers)", TP_MISTRAL, RSN_NONE, false, 0,
          "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]now[ARGS]{}",
          "T0[get_weather]({\"city\": \"Paris\"})T1[now]({})" },
        { "mistral named cut off", TP_MISTRAL, RSN_NONE, false, 0,
          "[TOOL_CALLS]get_weather[AR", "C[[TOOL_CALLS]get_weather[AR]" },
        { "mistral named bad", TP_MISTRAL, RSN_NONE, false, 0,
          "[TOOL_CALLS]get weather[ARGS]{}", "C[[TOOL_CALLS]get weather[ARGS]{}]" },
        { "mistral bad json", TP_MISTRAL, RSN_NONE, false, 0,
          "[TOOL_CALLS][{\"name\": \"a\",, }] rest",
          "C[[TOOL_CALLS][{\"name\": \"a\",, }] rest]" },
    };
    run_cases(cs, N(cs), true);
}

static void test_deepseek(void)
{
    static const struct tcase cs[] = {
        { "deepseek two", TP_DEEPSEEK_V3, RSN_NONE, false, 0,
          "Checking." DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP "get_weather\n```json\n{\"city\": \"Oslo\"}\n```"
          DS_CALL_END "\n" DS_CALL_BEGIN "function" DS_SEP "get_time\n```json\n{\"tz\": \"CET\"}\n```" DS_CALL_END
          DS_CALLS_END,
          "C[Checking.]T0[get_weather]({\"city\": \"Oslo\"})T1[get_time]({\"tz\": \"CET\"})" },
        { "deepseek malformed", TP_DEEPSEEK_V3, RSN_NONE, false, 0,
          DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP "f\n```json\n{\"a\": tru}\n```" DS_CALL_END DS_CALLS_END,
          "C[" DS_CALL_BEGIN "function" DS_SEP "f\n```json\n{\"a\": tru}\n```" DS_CALL_END "]" },
    };
    run_cases(cs, N(cs), false);
}

static void test_reasoning(void)
{
    static const struct tcase cs[] = {
        { "r1 opened in prompt", TP_NONE, RSN_DEEPSEEK_R1, true, 0,
          "Let me think: 2+2.\n</think>\n\nIt is 4.", "R[Let me think: 2+2.\n]C[\n\nIt is 4.]" },
        { "r1 model opens", TP_NONE, RSN_DEEPSEEK_R1, false, 0,
          "<think>\nhmm</think>4", "R[\nhmm]C[4]" },
        { "r1 no end tag", TP_NONE, RSN_DEEPSEEK_R1, true, 0,
          "still thinking </thi", "R[still thinking </thi]" },
        { "r1 lookalike tags", TP_NONE, RSN_DEEPSEEK_R1, true, 0,
          "a </thinx> <think> b</think>c</think>", "R[a </thinx> <think> b]C[c</think>]" },
        { "qwen3 model opens", TP_NONE, RSN_QWEN3, false, 0,
          "<think>\nThe user greets.\n</think>\n\nHello!", "R[\nThe user greets.\n]C[\n\nHello!]" },
        { "qwen3 thinking off", TP_NONE, RSN_QWEN3, false, 0,
          "Hello! <think>no</think>", "C[Hello! <think>no</think>]" },
        { "qwen3 short answer", TP_NONE, RSN_QWEN3, false, 0, "<th", "C[<th]" },
        { "qwen3 opened in prompt", TP_NONE, RSN_QWEN3, true, 0, "hmm</think>ok", "R[hmm]C[ok]" },
        { "qwen3 missing end", TP_NONE, RSN_QWEN3, false, 0, "<think>hmm", "R[hmm]" },
        { "qwen3 then hermes call", TP_HERMES, RSN_QWEN3, false, 0,
          "<think>need weather</think>\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"<tool_call>\"}}\n</tool_call>",
          "R[need weather]C[\n]T0[w]({\"c\": \"<tool_call>\"})" },
        { "r1 call inside reasoning is reasoning", TP_HERMES, RSN_DEEPSEEK_R1, true, 0,
          "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call></think>ok",
          "R[<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>]C[ok]" },
        { "none passes through", TP_NONE, RSN_NONE, false, 0, "<think>x</think>", "C[<think>x</think>]" },
    };
    run_cases(cs, N(cs), true);
}

/* The in-reasoning state used to count reasoning tokens. */
static void test_reasoning_state(void)
{
    struct rec r;
    memset(&r, 0, sizeof r);
    r.last_kind = -1;
    struct tparse p;
    CHECK(tparse_init(&p, TP_NONE, 0, RSN_QWEN3, false, on_event, &r) == 0, "init");
    CHECK(!tparse_in_reasoning(&p), "qwen3 starts outside the reasoning");
    tparse_feed(&p, "<think>", 7);
    CHECK(tparse_in_reasoning(&p), "inside");
    tparse_feed(&p, "x</think>y", 10);
    CHECK(!tparse_in_reasoning(&p), "after the end tag");
    tparse_finish(&p);
    tparse_free(&p);
    CHECK(tparse_init(&p, TP_NONE, 0, RSN_DEEPSEEK_R1, false, on_event, &r) == 0, "init");
    CHECK(tparse_in_reasoning(&p), "deepseek_r1 starts inside the reasoning");
    tparse_free(&p);
    CHECK(tparse_init(&p, TP_NONE, 0, RSN_NONE, false, on_event, &r) == 0, "init");
    CHECK(!tparse_in_reasoning(&p), "no reasoning parser");
    tparse_free(&p);
    CHECK(rsn_prompt_opens("<|im_start|>assistant\n<think>\n", 30), "opens");
    CHECK(!rsn_prompt_opens("<think>\n\n</think>\n\n", 19), "closed in prompt");
}

/* An error from the callback stops the parser and is returned. */
static void test_emit_error(void)
{
    static const struct tcase c = { "err", TP_HERMES, RSN_NONE, false, 0,
                                    "a<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>b", "" };
    struct rec r;
    memset(&r, 0, sizeof r);
    r.last_kind = -1;
    r.fail_after = 2;
    struct tparse p;
    tparse_init(&p, c.fmt, 0, RSN_NONE, false, on_event, &r);
    int rc = tparse_feed(&p, c.text, strlen(c.text));
    CHECK(rc == ERR_NOMEM, "feed rc %d", rc);
    CHECK(tparse_feed(&p, "x", 1) == ERR_NOMEM, "sticky");
    CHECK(tparse_finish(&p) == ERR_NOMEM, "finish");
    tparse_free(&p);
}

static void test_names(void)
{
    CHECK(tparse_format_from_name("hermes") == TP_HERMES, "hermes");
    CHECK(tparse_format_from_name("llama3_json") == TP_LLAMA3_JSON, "llama3");
    CHECK(tparse_format_from_name("mistral") == TP_MISTRAL, "mistral");
    CHECK(tparse_format_from_name("deepseek_v3") == TP_DEEPSEEK_V3, "deepseek");
    CHECK(tparse_format_from_name("pythonic") == -1, "unknown");
    CHECK(!strcmp(tparse_format_name(TP_LLAMA3_JSON), "llama3_json"), "name");
    CHECK(rsn_kind_from_name("deepseek_r1") == RSN_DEEPSEEK_R1, "r1");
    CHECK(rsn_kind_from_name("qwen3") == RSN_QWEN3, "qwen3");
    CHECK(rsn_kind_from_name("granite") == -1, "unknown reasoning");
    CHECK(tparse_format_detect("{{ '<tool_call>\\n' }}") == TP_HERMES, "detect hermes");
    CHECK(tparse_format_detect("[AVAILABLE_TOOLS] [TOOL_CALLS]") == TP_MISTRAL, "detect mistral");
    CHECK(tparse_format_detect("{{'<｜Assistant｜><｜tool▁calls▁begin｜>'}}") == TP_DEEPSEEK_V3, "detect ds");
    CHECK(tparse_format_detect("<|im_start|>{{ message.content }}") == TP_NONE, "detect none");
    CHECK(tparse_format_detect(NULL) == TP_NONE, "detect NULL");
}

/* The shipped reference templates: each detected as the format its model emits. */
static void test_detect_templates(void)
{
    static const struct { const char *file; enum tparse_format want; } t[] = {
        { "templates/qwen2.5-7b-instruct.jinja", TP_HERMES },
        { "templates/qwen3.jinja", TP_HERMES },
        { "templates/llama-3.1-8b-instruct.jinja", TP_LLAMA3_JSON },
        { "templates/mistral-7b-instruct-v0.3.jinja", TP_MISTRAL },
        { "templates/deepseek-r1-distill-qwen-7b.jinja", TP_DEEPSEEK_V3 },
        { "templates/smollm2-135m-instruct.jinja", TP_NONE },
        { "templates/gemma-2-2b-it.jinja", TP_NONE },
    };
    for (size_t i = 0; i < N(t); i++) {
        const char *path = test_data_path(t[i].file);
        FILE *f = fopen(path, "rb");
        CHECK(f != NULL, "%s missing (scripts/get-testdata.py)", path);
        if (!f) continue;
        static char buf[1 << 16];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        CHECK(tparse_format_detect(buf) == t[i].want, "%s: detected %s", t[i].file,
              tparse_format_name(tparse_format_detect(buf)));
    }
}

static const char TOOLS_JSON[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"now\"}}]";

/* The grammar of tool_choice "required" / named: valid JSON of the documented shape, the
 * format's wrapper, the call limit. */
static void test_grammar_spec(void)
{
    cJSON *tools = cJSON_Parse(TOOLS_JSON);
    struct grammar_spec spec;
    char *schema = NULL;
    int rc = oai_tool_grammar_spec(tools, NULL, TP_HERMES, true, &spec, &schema);
    CHECK(rc == 0 && schema, "required: rc %d", rc);
    cJSON *doc = schema ? cJSON_ParseWithLength(spec.text, spec.text_len) : NULL;
    CHECK(doc != NULL, "schema is not valid JSON: %s", schema ? schema : "(null)");
    cJSON *any = cJSON_GetObjectItemCaseSensitive(doc, "anyOf");
    CHECK(cJSON_GetArraySize(any) == 2, "two branches");
    cJSON *b0 = cJSON_GetArrayItem(any, 0), *b1 = cJSON_GetArrayItem(any, 1);
    cJSON *props0 = cJSON_GetObjectItemCaseSensitive(b0, "properties");
    cJSON *c0 = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(props0, "name"), "const");
    CHECK(cJSON_IsString(c0) && !strcmp(c0->valuestring, "get_weather"), "const name");
    cJSON *a0 = cJSON_GetObjectItemCaseSensitive(props0, "arguments");
    CHECK(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(a0, "properties"), "city") != NULL,
          "the tool's parameters");
    cJSON *a1 = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(b1, "properties"), "arguments");
    cJSON *t1 = cJSON_GetObjectItemCaseSensitive(a1, "type");
    CHECK(cJSON_IsString(t1) && !strcmp(t1->valuestring, "object"), "no parameters: any object");
    cJSON *req = cJSON_GetObjectItemCaseSensitive(b0, "required");
    CHECK(cJSON_GetArraySize(req) == 2 && !strcmp(cJSON_GetArrayItem(req, 1)->valuestring, "arguments"), "required");
    CHECK(spec.kind == GRAMMAR_JSON_SCHEMA && spec.min_items == 1 && spec.max_items == 0, "items");
    CHECK(!strcmp(spec.prefix, "<tool_call>\n") && !strcmp(spec.suffix, "\n</tool_call>") &&
          !strcmp(spec.separator, "\n"), "hermes wrapper");
    cJSON_Delete(doc);
    free(schema);

    /* named, llama3_json, parallel off */
    rc = oai_tool_grammar_spec(tools, "now", TP_LLAMA3_JSON, false, &spec, &schema);
    doc = rc == 0 ? cJSON_ParseWithLength(spec.text, spec.text_len) : NULL;
    any = cJSON_GetObjectItemCaseSensitive(doc, "anyOf");
    CHECK(cJSON_GetArraySize(any) == 1, "named: one branch");
    b0 = cJSON_GetArrayItem(any, 0);
    CHECK(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(b0, "properties"), "parameters") != NULL,
          "llama3: parameters");
    CHECK(spec.max_items == 1 && !strcmp(spec.separator, "; "), "llama3 wrapper, one call");
    cJSON_Delete(doc);
    free(schema);

    rc = oai_tool_grammar_spec(tools, "nope", TP_HERMES, true, &spec, &schema);
    CHECK(rc == ERR_NOT_FOUND && schema == NULL, "unknown name: rc %d", rc);
    rc = oai_tool_grammar_spec(tools, NULL, TP_MISTRAL, true, &spec, &schema);
    CHECK(rc == 0 && !strcmp(spec.prefix, "[TOOL_CALLS][") && !strcmp(spec.suffix, "]"), "mistral wrapper");
    free(schema);
    cJSON_Delete(tools);
}

/* Assistant tool_calls: string arguments become objects for templates that tojson them. */
static void test_messages_for_template(void)
{
    const char *msgs =
        "[{\"role\": \"user\", \"content\": \"weather?\"},"
        " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\","
        "   \"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
        " {\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"content\": \"sunny\"}]";
    cJSON *m = cJSON_Parse(msgs);
    CHECK(m != NULL, "messages JSON");
    struct model mo;
    memset(&mo, 0, sizeof mo);
    mo.chat_template = "{{ tool_call.arguments | tojson }}";
    cJSON *copy = NULL;
    struct api_error e;
    int rc = oai_messages_for_template(&mo, m, &copy, &e);
    CHECK(rc == 0 && copy, "converted: rc %d", rc);
    cJSON *args = copy ? cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(
                             cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(copy, 1),
                                                                                 "tool_calls"), 0),
                             "function"), "arguments")
                       : NULL;
    CHECK(cJSON_IsObject(args) && !strcmp(cJSON_GetObjectItemCaseSensitive(args, "city")->valuestring, "Paris"),
          "arguments parsed into an object");
    cJSON_Delete(copy);
    /* R1-Distill concatenates strings */
    mo.chat_template = "{% for tool in message['tool_calls'] %}{{ tool['function']['arguments'] }}{% endfor %}";
    rc = oai_messages_for_template(&mo, m, &copy, &e);
    CHECK(rc == 0 && copy == NULL, "left as strings");
    cJSON_Delete(m);
    m = cJSON_Parse("[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"arguments\": \"{}\"}}]}]");
    rc = oai_messages_for_template(&mo, m, &copy, &e);
    CHECK(rc == ERR_INVALID && e.status == 400 && !strcmp(e.param, "messages[0].tool_calls"),
          "a call without a name: rc %d param %s", rc, e.param);
    cJSON_Delete(m);
}

/* 1 if item i of msgs has content "" (want_null 0) or null (want_null 1). */
static int content_is(const cJSON *msgs, int i, int want_null)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(msgs, i), "content");
    return want_null ? cJSON_IsNull(c) : cJSON_IsString(c) && c->valuestring[0] == 0;
}

/* Content null or left out, tool_calls null or []: what the template sees. */
static void test_messages_null_content(void)
{
    const char *msgs =
        "[{\"role\": \"user\", \"content\": null},"
        " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": []},"
        " {\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]},"
        " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"function\": {\"name\": \"f\"}}]},"
        " {\"role\": \"assistant\", \"content\": \"hi\", \"tool_calls\": null}]";
    struct model mo;
    memset(&mo, 0, sizeof mo);
    struct api_error e;
    cJSON *copy = NULL;
    int rc;
    cJSON *m = cJSON_Parse(msgs);
    CHECK(m != NULL, "messages JSON");
    for (int reads = 0; reads < 2; reads++) {
        /* SmolLM2-like (concatenates content, no tool calls) / one that renders the calls */
        mo.chat_template = reads ? "{% for c in message.tool_calls %}{{ c.function.name }}{% endfor %}"
                                 : "{{ message['content'] }}";
        rc = oai_messages_for_template(&mo, m, &copy, &e);
        CHECK(rc == 0 && copy, "reads %d: a copy, rc %d", reads, rc);
        if (!copy) continue;
        CHECK(content_is(copy, 0, 0), "reads %d: user null -> \"\"", reads);
        CHECK(content_is(copy, 1, 0) && !cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(copy, 1), "tool_calls"),
              "reads %d: tool_calls [] dropped, content \"\"", reads);
        CHECK(content_is(copy, 2, reads), "reads %d: content left out beside calls", reads);
        CHECK(content_is(copy, 3, reads), "reads %d: content null beside calls", reads);
        const cJSON *last = cJSON_GetArrayItem(copy, 4);
        CHECK(!strcmp(cJSON_GetObjectItemCaseSensitive(last, "content")->valuestring, "hi") &&
                  !cJSON_GetObjectItemCaseSensitive(last, "tool_calls"),
              "reads %d: tool_calls null dropped, content kept", reads);
        cJSON_Delete(copy);
    }
    cJSON_Delete(m);
    /* nothing to change: no copy */
    m = cJSON_Parse("[{\"role\": \"user\", \"content\": \"x\"},"
                    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"function\": {\"name\": \"f\"}}]}]");
    rc = oai_messages_for_template(&mo, m, &copy, &e);
    CHECK(rc == 0 && copy == NULL, "null beside calls the template renders: used as sent");
    cJSON_Delete(m);
}

int main(void)
{
    RUN(test_hermes);
    RUN(test_llama3);
    RUN(test_mistral);
    RUN(test_deepseek);
    RUN(test_reasoning);
    RUN(test_reasoning_state);
    RUN(test_emit_error);
    RUN(test_names);
    RUN(test_detect_templates);
    RUN(test_grammar_spec);
    RUN(test_messages_for_template);
    RUN(test_messages_null_content);
    return test_summary();
}

/* test_api.c — the OpenAI wire format (src/api/openai.h) against the real default model:
 * a table of bad bodies (each checked for status, type, param and code), good bodies
 * (defaults, every parameter, prompt ids equal to an independent chat_render + tok_encode),
 * and the produced JSON parsed back with cJSON and checked field by field.
 * DUMP=1 prints every bad case's status, param and message (to review the wording).
 */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include "api/error.h"
#include "api/openai.h"
#include "api/openai_internal.h"
#include "chat/chat.h"
#include "model/model.h"
#include "template/jinja.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdint.h>

static struct model *g_model;
static const char *const g_names[] = { "SmolLM2-135M-Instruct", "smol" };

/* A context over the test model with recognisable defaults. */
static struct oai_ctx make_ctx(int max_model_len)
{
    struct oai_ctx c;
    memset(&c, 0, sizeof c);
    c.m = g_model;
    c.served_names = g_names;
    c.n_served = 2;
    c.max_model_len = max_model_len;
    c.max_logprobs = SAMPLER_MAX_TOP_LOGPROBS;
    sampler_params_default(&c.defaults.sp);
    c.defaults.sp.temperature = 0.7f;
    c.defaults.sp.top_p = 0.9f;
    c.defaults.sp.top_k = 50;
    c.defaults.sp.repetition_penalty = 1.05f;
    c.defaults.max_tokens = 0;
    return c;
}

/* ---------------------------------------------------------------- bad inputs */

enum { CHAT = 0, COMPL = 1 };

struct bad_case {
    int kind;
    const char *body;
    int status;
    const char *param; /* "" = null */
    const char *code;  /* NULL = null */
    int small;         /* use a context of 40 tokens */
};

#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]"
#define B400(k, body, param) { k, body, 400, param, NULL, 0 }

static const struct bad_case bad_cases[] = {
    /* not a JSON object */
    B400(CHAT, "{", ""),
    B400(CHAT, "", ""),
    B400(CHAT, "[]", ""),
    B400(CHAT, "\"hello\"", ""),
    B400(CHAT, "42", ""),
    B400(CHAT, "null", ""),
    B400(CHAT, "{} {}", ""),
    B400(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],}", ""),
    B400(COMPL, "[{\"prompt\":\"x\"}]", ""),
    /* messages */
    B400(CHAT, "{}", "messages"),
    B400(CHAT, "{\"messages\":null}", "messages"),
    B400(CHAT, "{\"messages\":[]}", "messages"),
    B400(CHAT, "{\"messages\":\"Hi\"}", "messages"),
    B400(CHAT, "{\"messages\":[\"Hi\"]}", "messages[0]"),
    B400(CHAT, "{\"messages\":[{\"content\":\"Hi\"}]}", "messages[0].role"),
    B400(CHAT, "{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content"),
    B400(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"wizard\",\"content\":\"x\"}]}",
         "messages[1].role"),
    B400(CHAT, "{\"messages\":[{\"role\":7,\"content\":\"x\"}]}", "messages[0].role"),
    B400(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content"),
    B400(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"http://x\"}}]}]}",
         "messages[0].content[0].type"),
    B400(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", "messages[0].content[0].text"),
    /* invalid UTF-8: raw 0xff, overlong '/', a raw-encoded surrogate, a truncated sequence */
    B400(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\xff\"}]}", "messages[0].content"),
    B400(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc0\xaf\"}]}", "messages[0].content"),
    B400(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}", "messages[0].content"),
    B400(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xe2\x82\"}]}", "messages[0].content"),
    B400(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"\xf5\x80\x80\x80\"}]}]}",
         "messages[0].content[0].text"),
    B400(CHAT, "{\"model\":\"\xff\"," MSG "}", "model"),
    B400(CHAT, "{\"\xff\":1," MSG "}", ""),
    /* escapes cJSON refuses (lone surrogates) or that would cut a string (NUL) */
    B400(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\\ud800\"}]}", ""),
    B400(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\\udc00x\"}]}", ""),
    B400(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", ""),
    /* sampling parameters */
    B400(CHAT, "{" MSG ",\"temperature\":\"1\"}", "temperature"),
    B400(CHAT, "{" MSG ",\"temperature\":true}", "temperature"),
    B400(CHAT, "{" MSG ",\"temperature\":2.5}", "temperature"),
    B400(CHAT, "{" MSG ",\"temperature\":-0.1}", "temperature"),
    B400(CHAT, "{" MSG ",\"temperature\":1e999}", "temperature"),
    B400(CHAT, "{" MSG ",\"top_p\":0}", "top_p"),
    B400(CHAT, "{" MSG ",\"top_p\":1.01}", "top_p"),
    B400(CHAT, "{" MSG ",\"top_k\":-2}", "top_k"),
    B400(CHAT, "{" MSG ",\"top_k\":1.5}", "top_k"),
    B400(CHAT, "{" MSG ",\"top_k\":\"5\"}", "top_k"),
    B400(CHAT, "{" MSG ",\"min_p\":1.5}", "min_p"),
    B400(CHAT, "{" MSG ",\"presence_penalty\":2.5}", "presence_penalty"),
    B400(CHAT, "{" MSG ",\"frequency_penalty\":-3}", "frequency_penalty"),
    B400(CHAT, "{" MSG ",\"repetition_penalty\":0}", "repetition_penalty"),
    B400(CHAT, "{" MSG ",\"repetition_penalty\":2.5}", "repetition_penalty"),
    B400(CHAT, "{" MSG ",\"seed\":\"7\"}", "seed"),
    B400(CHAT, "{" MSG ",\"seed\":1.5}", "seed"),
    B400(CHAT, "{" MSG ",\"seed\":1e30}", "seed"),
    /* lengths and choices */
    B400(CHAT, "{" MSG ",\"max_tokens\":0}", "max_tokens"),
    B400(CHAT, "{" MSG ",\"max_tokens\":-5}", "max_tokens"),
    B400(CHAT, "{" MSG ",\"max_tokens\":\"10\"}", "max_tokens"),
    B400(CHAT, "{" MSG ",\"max_tokens\":2.5}", "max_tokens"),
    B400(CHAT, "{" MSG ",\"max_completion_tokens\":0}", "max_completion_tokens"),
    { CHAT, "{" MSG ",\"max_tokens\":1e12}", 400, "messages", "context_length_exceeded", 0 },
    { CHAT, "{" MSG ",\"max_tokens\":4096}", 400, "messages", "context_length_exceeded", 0 },
    B400(CHAT, "{" MSG ",\"n\":0}", "n"),
    B400(CHAT, "{" MSG ",\"n\":17}", "n"),
    B400(CHAT, "{" MSG ",\"n\":\"2\"}", "n"),
    /* logprobs */
    B400(CHAT, "{" MSG ",\"logprobs\":\"yes\"}", "logprobs"),
    B400(CHAT, "{" MSG ",\"logprobs\":1}", "logprobs"),
    B400(CHAT, "{" MSG ",\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs"),
    B400(CHAT, "{" MSG ",\"logprobs\":true,\"top_logprobs\":-1}", "top_logprobs"),
    B400(CHAT, "{" MSG ",\"top_logprobs\":2}", "top_logprobs"),
    B400(CHAT, "{" MSG ",\"logprobs\":false,\"top_logprobs\":2}", "top_logprobs"),
    /* logit_bias */
    B400(CHAT, "{" MSG ",\"logit_bias\":[1]}", "logit_bias"),
    B400(CHAT, "{" MSG ",\"logit_bias\":{\"abc\":1}}", "logit_bias"),
    B400(CHAT, "{" MSG ",\"logit_bias\":{\"-1\":1}}", "logit_bias"),
    B400(CHAT, "{" MSG ",\"logit_bias\":{\"49152\":1}}", "logit_bias"),
    B400(CHAT, "{" MSG ",\"logit_bias\":{\"99999999999\":1}}", "logit_bias"),
    B400(CHAT, "{" MSG ",\"logit_bias\":{\"5\":101}}", "logit_bias"),
    B400(CHAT, "{" MSG ",\"logit_bias\":{\"5\":-100.5}}", "logit_bias"),
    B400(CHAT, "{" MSG ",\"logit_bias\":{\"5\":\"x\"}}", "logit_bias"),
    /* stop */
    B400(CHAT, "{" MSG ",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop"),
    B400(CHAT, "{" MSG ",\"stop\":[\"a\",\"\"]}", "stop"),
    B400(CHAT, "{" MSG ",\"stop\":\"\"}", "stop"),
    B400(CHAT, "{" MSG ",\"stop\":[1]}", "stop"),
    B400(CHAT, "{" MSG ",\"stop\":5}", "stop"),
    /* streaming */
    B400(CHAT, "{" MSG ",\"stream\":\"true\"}", "stream"),
    B400(CHAT, "{" MSG ",\"stream_options\":{\"include_usage\":true}}", "stream_options"),
    B400(CHAT, "{" MSG ",\"stream\":false,\"stream_options\":{\"include_usage\":true}}", "stream_options"),
    B400(CHAT, "{" MSG ",\"stream\":true,\"stream_options\":\"x\"}", "stream_options"),
    B400(CHAT, "{" MSG ",\"stream\":true,\"stream_options\":{\"include_usage\":1}}", "stream_options.include_usage"),
    /* model */
    { CHAT, "{" MSG ",\"model\":\"gpt-4\"}", 404, "model", "model_not_found", 0 },
    { COMPL, "{\"prompt\":\"x\",\"model\":\"\"}", 404, "model", "model_not_found", 0 },
    B400(CHAT, "{" MSG ",\"model\":5}", "model"),
    /* other fields */
    B400(CHAT, "{" MSG ",\"user\":5}", "user"),
    B400(CHAT, "{" MSG ",\"cache_salt\":\"\"}", "cache_salt"),
    B400(CHAT, "{" MSG ",\"cache_salt\":5}", "cache_salt"),
    B400(CHAT, "{" MSG ",\"cache_salt\":\"0123456789012345678901234567890123456789012345678901234567890123x\"}",
         "cache_salt"),
    B400(CHAT, "{" MSG ",\"ignore_eos\":\"x\"}", "ignore_eos"),
    B400(CHAT, "{" MSG ",\"skip_special_tokens\":1}", "skip_special_tokens"),
    B400(CHAT, "{" MSG ",\"tools\":\"x\"}", "tools"),
    B400(CHAT, "{" MSG ",\"chat_template_kwargs\":[]}", "chat_template_kwargs"),
    B400(CHAT, "{" MSG ",\"add_generation_prompt\":\"x\"}", "add_generation_prompt"),
    /* completions prompt */
    B400(COMPL, "{}", "prompt"),
    B400(COMPL, "{\"prompt\":5}", "prompt"),
    B400(COMPL, "{\"prompt\":\"\"}", "prompt"),
    B400(COMPL, "{\"prompt\":[]}", "prompt"),
    B400(COMPL, "{\"prompt\":[[]]}", "prompt"),
    B400(COMPL, "{\"prompt\":[\"a\",5]}", "prompt"),
    B400(COMPL, "{\"prompt\":[[1,2],[3.5]]}", "prompt"),
    B400(COMPL, "{\"prompt\":[\"a\",[]]}", "prompt"),
    B400(COMPL, "{\"prompt\":[[1],\"\"]}", "prompt"),
    B400(COMPL, "{\"prompt\":[49152]}", "prompt"),
    B400(COMPL, "{\"prompt\":[1,-1]}", "prompt"),
    B400(COMPL, "{\"prompt\":[1.5]}", "prompt"),
    B400(COMPL, "{\"prompt\":[1,\"a\"]}", "prompt"),
    B400(COMPL, "{\"prompt\":[true]}", "prompt"),
    B400(COMPL, "{\"prompt\":{\"text\":\"a\"}}", "prompt"),
    B400(COMPL, "{\"prompt\":\"x\",\"echo\":false,\"max_tokens\":0}", "max_tokens"),
    B400(COMPL, "{\"prompt\":\"x\",\"echo\":true,\"max_tokens\":-1}", "max_tokens"),
    B400(COMPL, "{\"prompt\":\"x\",\"suffix\":\"end\"}", "suffix"),
    B400(COMPL, "{\"prompt\":\"x\",\"best_of\":2}", "best_of"),
    B400(COMPL, "{\"prompt\":\"x\",\"best_of\":0}", "best_of"),
    B400(COMPL, "{\"prompt\":\"x\",\"logprobs\":6}", "logprobs"),
    B400(COMPL, "{\"prompt\":\"x\",\"logprobs\":true}", "logprobs"),
    B400(COMPL, "{\"prompt\":\"x\",\"logprobs\":-1}", "logprobs"),
    B400(COMPL, "{\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens"),
    /* context length (small context of 40 tokens) */
    { COMPL, "{\"prompt\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,"
             "31,32,33,34,35,36,37,38,39,40]}", 400, "prompt", "context_length_exceeded", 1 },
    { COMPL, "{\"prompt\":[1,2,3,4,5,6,7,8,9,10],\"max_tokens\":31}", 400, "prompt", "context_length_exceeded", 1 },
    { CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"one two three four five six seven eight nine ten "
            "eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty\"}]}",
      400, "messages", "context_length_exceeded", 1 },
    /* parameters a request depends on that are not implemented (or, for structured output,
       not available without a grammar vocabulary): 400 naming them */
    B400(CHAT, "{" MSG ",\"response_format\":{\"type\":\"json_object\"}}", "response_format"),
    B400(CHAT, "{" MSG ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}}}",
         "response_format"),
    B400(CHAT, "{" MSG ",\"response_format\":\"text\"}", "response_format"),
    B400(CHAT, "{" MSG ",\"response_format\":{}}", "response_format"),
    B400(COMPL, "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"}}", "response_format"),
    B400(CHAT, "{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}", "tool_choice"),
    B400(CHAT, "{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
               "\"tool_choice\":\"auto\"}", "tool_choice"),
    B400(CHAT, "{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
               "\"tool_choice\":\"required\"}", "tool_choice"),
    B400(CHAT, "{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
               "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}", "tool_choice"),
    B400(CHAT, "{" MSG ",\"tool_choice\":\"required\"}", "tool_choice"),
    B400(CHAT, "{" MSG ",\"tool_choice\":\"sometimes\"}", "tool_choice"),
    B400(CHAT, "{" MSG ",\"tool_choice\":5}", "tool_choice"),
    B400(CHAT, "{" MSG ",\"functions\":[{\"name\":\"f\"}]}", "functions"),
    B400(CHAT, "{" MSG ",\"function_call\":{\"name\":\"f\"}}", "function_call"),
    B400(CHAT, "{" MSG ",\"modalities\":[\"text\",\"audio\"]}", "modalities"),
    B400(CHAT, "{" MSG ",\"audio\":{\"voice\":\"alloy\"}}", "audio"),
    B400(CHAT, "{" MSG ",\"reasoning_effort\":\"low\"}", "reasoning_effort"),
    /* structured output with no grammar vocabulary in the context (this test's): 400 naming
       the parameter; with one, tests/python/test_structured_output.py */
    B400(CHAT, "{" MSG ",\"guided_json\":{\"type\":\"object\"}}", "guided_json"),
    B400(COMPL, "{\"prompt\":\"x\",\"guided_regex\":\"a+\"}", "guided_regex"),
    B400(COMPL, "{\"prompt\":\"x\",\"guided_choice\":[\"a\"]}", "guided_choice"),
    B400(CHAT, "{" MSG ",\"structured_outputs\":{\"json\":{}}}", "structured_outputs.json"),
    B400(CHAT, "{" MSG ",\"guided_grammar\":\"root ::= x\"}", "guided_grammar"),
    B400(CHAT, "{" MSG ",\"min_tokens\":-1}", "min_tokens"),
    B400(CHAT, "{" MSG ",\"min_tokens\":5,\"max_tokens\":4}", "min_tokens"),
    B400(COMPL, "{\"prompt\":\"x\",\"min_tokens\":1.5}", "min_tokens"),
    B400(CHAT, "{" MSG ",\"allowed_token_ids\":[49152]}", "allowed_token_ids"),
    B400(CHAT, "{" MSG ",\"allowed_token_ids\":{}}", "allowed_token_ids"),
    B400(COMPL, "{\"prompt\":\"x\",\"stop_token_ids\":[49152]}", "stop_token_ids"),
    B400(COMPL, "{\"prompt\":\"x\",\"stop_token_ids\":[1.5]}", "stop_token_ids"),
    B400(COMPL, "{\"prompt\":\"x\",\"stop_token_ids\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", "stop_token_ids"),
    B400(CHAT, "{" MSG ",\"prompt_logprobs\":1,\"stream\":true}", "prompt_logprobs"),
    B400(COMPL, "{\"prompt\":\"x\",\"prompt_logprobs\":21}", "prompt_logprobs"),
    B400(COMPL, "{\"prompt\":\"x\",\"prompt_logprobs\":-1}", "prompt_logprobs"),
    B400(CHAT, "{" MSG ",\"use_beam_search\":true}", "use_beam_search"),
    B400(CHAT, "{" MSG ",\"include_stop_str_in_output\":1}", "include_stop_str_in_output"),
    B400(CHAT, "{" MSG ",\"echo\":true}", "echo"),
    B400(CHAT, "{" MSG ",\"chat_template\":\"{{ messages }}\"}", "chat_template"),
    B400(CHAT, "{" MSG ",\"structural_tag\":\"{}\"}", "structural_tag"),
    B400(COMPL, "{\"prompt\":\"x\",\"guided_whitespace_pattern\":\" \"}", "guided_whitespace_pattern"),
    B400(CHAT, "{" MSG ",\"return_tokens_as_token_ids\":true}", "return_tokens_as_token_ids"),
    B400(CHAT, "{" MSG ",\"best_of\":2}", "best_of"),
    B400(CHAT, "{" MSG ",\"add_special_tokens\":1}", "add_special_tokens"),
    B400(CHAT, "{" MSG ",\"bad_words\":[\"\"]}", "bad_words"),
    B400(CHAT, "{" MSG ",\"bad_words\":[\"  \"]}", "bad_words"),
    B400(CHAT, "{" MSG ",\"bad_words\":[1]}", "bad_words"),
    B400(CHAT, "{" MSG ",\"bad_words\":\"x\"}", "bad_words"),
    B400(CHAT, "{" MSG ",\"truncate_prompt_tokens\":0}", "truncate_prompt_tokens"),
    /* chat_template_kwargs cannot replace what the server sets */
    B400(CHAT, "{" MSG ",\"chat_template_kwargs\":{\"messages\":[]}}", "chat_template_kwargs.messages"),
    B400(CHAT, "{" MSG ",\"chat_template_kwargs\":{\"bos_token\":\"<x>\"}}", "chat_template_kwargs.bos_token"),
    B400(CHAT, "{" MSG ",\"chat_template_kwargs\":{\"enable_thinking\":false,\"eos_token\":\"\"}}",
         "chat_template_kwargs.eos_token"),
    B400(CHAT, "{" MSG ",\"chat_template_kwargs\":{\"tools\":[{\"x\":1}]}}", "chat_template_kwargs.tools"),
    B400(CHAT, "{" MSG ",\"chat_template_kwargs\":{\"add_generation_prompt\":false}}",
         "chat_template_kwargs.add_generation_prompt"),
    B400(CHAT, "{" MSG ",\"chat_template_kwargs\":{\"raise_exception\":1}}", "chat_template_kwargs.raise_exception"),
};

static void test_bad_inputs(void)
{
    struct oai_ctx ctx = make_ctx(2048), small = make_ctx(40);
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const struct bad_case *c = &bad_cases[i];
        struct oai_request r;
        struct api_error e;
        memset(&e, 0, sizeof e);
        const struct oai_ctx *cx = c->small ? &small : &ctx;
        int rc = c->kind == CHAT ? oai_parse_chat(cx, c->body, strlen(c->body), &r, &e)
                                 : oai_parse_completion(cx, c->body, strlen(c->body), &r, &e);
        CHECK(rc < 0, "case %zu accepted: %s", i, c->body);
        if (rc >= 0) { oai_request_free(&r); continue; }
        CHECK(r.prompt_ids == NULL && r.n_prompt == 0, "case %zu: out not empty", i);
        CHECK(e.status == c->status, "case %zu: status %d want %d (%s)", i, e.status, c->status, e.message);
        CHECK(e.type && !strcmp(e.type, API_ERR_INVALID_REQUEST), "case %zu: type %s", i, e.type);
        CHECK(!strcmp(e.param, c->param), "case %zu: param '%s' want '%s' (%s)", i, e.param, c->param, e.message);
        CHECK(c->code ? e.code && !strcmp(e.code, c->code) : e.code == NULL, "case %zu: code %s want %s (%s)",
              i, e.code ? e.code : "null", c->code ? c->code : "null", e.message);
        CHECK(e.message[0] != 0, "case %zu: empty message", i);
        if (getenv("DUMP")) printf("%3zu %d %-30s %s\n", i, e.status, e.param, e.message);
    }
}

/* What is harmless to ignore is accepted: the neutral values of the parameters above,
 * and fields such as user, store, metadata. */
static void test_harmless_params(void)
{
    struct oai_ctx ctx = make_ctx(2048);
    static const char *const chat_ok[] = {
        "{" MSG ",\"user\":\"u-123\"}",
        "{" MSG ",\"response_format\":{\"type\":\"text\"}}",
        "{" MSG ",\"response_format\":null}",
        "{" MSG ",\"tool_choice\":\"none\"}",
        "{" MSG ",\"tool_choice\":\"auto\"}",
        "{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"none\"}",
        "{" MSG ",\"tools\":[],\"parallel_tool_calls\":false}",
        "{" MSG ",\"function_call\":\"none\",\"functions\":[]}",
        "{" MSG ",\"modalities\":[\"text\"],\"store\":false,\"metadata\":{\"a\":\"b\"},\"service_tier\":\"auto\"}",
        "{" MSG ",\"min_tokens\":0,\"stop_token_ids\":[],\"use_beam_search\":false,\"echo\":false,"
        "\"include_stop_str_in_output\":false,\"guided_json\":null,\"prompt_logprobs\":null,"
        "\"chat_template\":null,\"return_tokens_as_token_ids\":false,\"best_of\":1,\"length_penalty\":1}",
        "{" MSG ",\"chat_template_kwargs\":{\"enable_thinking\":false,\"custom_tools\":[]}}",
    };
    for (size_t i = 0; i < sizeof chat_ok / sizeof chat_ok[0]; i++) {
        struct oai_request r;
        struct api_error e;
        int rc = oai_parse_chat(&ctx, chat_ok[i], strlen(chat_ok[i]), &r, &e);
        CHECK(rc == 0, "refused: %s: %s", chat_ok[i], rc ? e.message : "");
        if (!rc) oai_request_free(&r);
    }
    const char *compl_ok = "{\"prompt\":\"x\",\"response_format\":{\"type\":\"text\"},\"user\":\"u\","
                           "\"tool_choice\":\"required\"}"; /* not a completions parameter */
    struct oai_request r;
    struct api_error e;
    int rc = oai_parse_completion(&ctx, compl_ok, strlen(compl_ok), &r, &e);
    CHECK(rc == 0, "completion refused: %s", rc ? e.message : "");
    if (!rc) oai_request_free(&r);
}

/* A prompt longer than max_model_len tokens could ever cover is refused by its length in
 * bytes, before tokenizing (which would take a worker a second for 16 MiB). */
static void test_prompt_bytes(void)
{
    struct oai_ctx ctx = make_ctx(40);
    ctx.max_prompt_bytes = oai_max_prompt_bytes(g_model, 40);
    CHECK(ctx.max_prompt_bytes > 40 * 4 && ctx.max_prompt_bytes < 40 * 4 * 256 + 4096, "bound %zu",
          ctx.max_prompt_bytes);
    size_t n = ctx.max_prompt_bytes + 1;
    char *text = malloc(n + 1);
    memset(text, 'a', n);
    text[n] = 0;
    cJSON *body = cJSON_CreateObject();
    cJSON_AddStringToObject(body, "prompt", text);
    char *json = cJSON_PrintUnformatted(body);
    struct oai_request r;
    struct api_error e;
    int rc = oai_parse_completion(&ctx, json, strlen(json), &r, &e);
    CHECK(rc == ERR_RANGE && e.status == 400 && e.code && !strcmp(e.code, "context_length_exceeded") &&
              !strcmp(e.param, "prompt") && strstr(e.message, "bytes"), "completion: %d %s", rc, e.message);
    free(json);
    cJSON_Delete(body);
    body = cJSON_Parse("{\"messages\":[{\"role\":\"user\",\"content\":\"\"}]}");
    cJSON_SetValuestring(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(body, "messages"), 0),
                                             "content"), text);
    json = cJSON_PrintUnformatted(body);
    rc = oai_parse_chat(&ctx, json, strlen(json), &r, &e);
    CHECK(rc == ERR_RANGE && !strcmp(e.param, "messages") && strstr(e.message, "bytes"), "chat: %d %s", rc,
          e.message);
    /* with truncate_prompt_tokens the text is tokenized and cut, not refused */
    cJSON_AddNumberToObject(body, "truncate_prompt_tokens", 30);
    free(json);
    json = cJSON_PrintUnformatted(body);
    rc = oai_parse_chat(&ctx, json, strlen(json), &r, &e);
    CHECK(rc == 0 && r.n_prompt == 30, "chat, truncated: %d %s", rc, rc ? e.message : "");
    if (!rc) oai_request_free(&r);
    /* /tokenize has no such limit: it reports the count whatever it is */
    char *out = NULL;
    struct oai_ctx big = ctx;
    rc = oai_tokenize(&big, json, strlen(json), &out, &e);
    CHECK(rc == 0 && out && strstr(out, "\"count\""), "tokenize: %d", rc);
    free(out);
    free(json);
    cJSON_Delete(body);
    free(text);
}

/* continue_final_message: the prompt ends right after the final message's content (as it
 * is, else trimmed); not found, or together with add_generation_prompt true, is 400. */
static void test_continue_final(void)
{
    struct model m = *g_model;
    struct oai_ctx ctx = make_ctx(2048);
    ctx.m = &m;
    char src[] = "{% for x in messages %}<{{ x.role }}>{{ x.content | trim }}</{{ x.role }}>{% endfor %}"
                  "{% if add_generation_prompt %}<assistant>{% endif %}";
    char err[256];
    CHECK(jinja_parse(src, strlen(src), &m.tmpl, err, sizeof err) == 0, "template: %s", err);
    m.chat_template = src;
    struct oai_request r;
    struct api_error e;
    const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                    "{\"role\":\"assistant\",\"content\":\" The sea is \"}],\"continue_final_message\":true}";
    int rc = oai_parse_chat(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0, "continue: rc %d %s", rc, e.message);
    if (!rc) {
        int32_t *want = NULL;
        int n = 0;
        const char *text = "<user>hi</user><assistant>The sea is"; /* trimmed content, cut after it */
        CHECK(oai_encode_text(&ctx, text, strlen(text), false, false, "x", &want, &n, &e) == 0, "encode");
        CHECK(n == r.n_prompt && want && !memcmp(want, r.prompt_ids, sizeof *want * (size_t)n),
              "prompt %d tokens, want %d", r.n_prompt, n);
        free(want);
        oai_request_free(&r);
    }
    b = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"continue_final_message\":true,"
        "\"add_generation_prompt\":true}";
    oai_parse_chat(&ctx, b, strlen(b), &r, &e);
    CHECK(e.status == 400 && !strcmp(e.param, "continue_final_message") && strstr(e.message, "cannot both be true"),
          "both: %s", e.message);
    jinja_free(m.tmpl);
    const char *upper = "{% for x in messages %}{{ x.content | upper }}{% endfor %}";
    CHECK(jinja_parse(upper, strlen(upper), &m.tmpl, err, sizeof err) == 0, "template: %s", err);
    b = "{\"messages\":[{\"role\":\"user\",\"content\":\"quiet\"}],\"continue_final_message\":true}";
    oai_parse_chat(&ctx, b, strlen(b), &r, &e);
    CHECK(e.status == 400 && strstr(e.message, "does not appear in the prompt"), "not found: %s", e.message);
    jinja_free(m.tmpl);
}

/* documents reach the template; add_special_tokens adds the tokenizer's BOS on top of
 * the template's (vLLM's behaviour, duplicates included). */
static void test_chat_documents_and_specials(void)
{
    struct model m = *g_model;
    struct oai_ctx ctx = make_ctx(2048);
    ctx.m = &m;
    const char *src = "{% for d in documents %}[{{ d.text }}]{% endfor %}{{ messages[0].content }}";
    char err[256];
    CHECK(jinja_parse(src, strlen(src), &m.tmpl, err, sizeof err) == 0, "template: %s", err);
    struct oai_request r;
    struct api_error e;
    const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                    "\"documents\":[{\"text\":\"one\"},{\"text\":\"two\"}]}";
    int rc = oai_parse_chat(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0, "documents: %s", rc ? e.message : "");
    int32_t *want = NULL;
    int n = 0;
    CHECK(oai_encode_text(&ctx, "[one][two]hi", 12, false, false, "x", &want, &n, &e) == 0, "encode");
    CHECK(!rc && n == r.n_prompt && !memcmp(want, r.prompt_ids, sizeof *want * (size_t)n), "documents rendered");
    free(want);
    if (!rc) oai_request_free(&r);
    b = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"documents\":{}}";
    oai_parse_chat(&ctx, b, strlen(b), &r, &e);
    CHECK(e.status == 400 && !strcmp(e.param, "documents"), "documents not an array: %s", e.message);
    jinja_free(m.tmpl);
    m.tmpl = g_model->tmpl;
    /* a tokenizer that adds BOS: the template's own BOS is kept alone without
       add_special_tokens, and doubled with it */
    struct tokenizer *tok = (struct tokenizer *)g_model->tok;
    int bos = tok_bos_id(tok);
    bool adds = tok_adds_bos(tok);
    tok_set_adds_bos(tok, true);
    b = "{" MSG "}";
    rc = oai_parse_chat(&ctx, b, strlen(b), &r, &e);
    int plain = rc ? -1 : r.n_prompt;
    CHECK(!rc && r.prompt_ids[0] == bos && r.prompt_ids[1] != bos, "plain: first %d", rc ? -1 : r.prompt_ids[0]);
    if (!rc) oai_request_free(&r);
    b = "{" MSG ",\"add_special_tokens\":true}";
    rc = oai_parse_chat(&ctx, b, strlen(b), &r, &e);
    CHECK(!rc && r.n_prompt == plain + 1 && r.prompt_ids[0] == bos && r.prompt_ids[1] == bos,
          "add_special_tokens: %d tokens, plain %d", rc ? -1 : r.n_prompt, plain);
    if (!rc) oai_request_free(&r);
    tok_set_adds_bos(tok, adds);
}

/* completions echo: each prompt's text as given, or its ids decoded with specials */
static void test_completion_echo(void)
{
    struct oai_ctx ctx = make_ctx(2048);
    struct oai_request r;
    struct api_error e;
    const char *b = "{\"prompt\":[\"Hello\",[1,504]],\"echo\":true}";
    int rc = oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0 && r.echo_on, "echo batch: %s", rc ? e.message : "");
    if (!rc) {
        char *want = tok_decode(g_model->tok, (const int32_t[]){ 1, 504 }, 2, false);
        CHECK(!strcmp(r.echo[0], "Hello") && want && !strcmp(r.echo[1], want), "echo texts '%s' '%s'", r.echo[0],
              r.echo[1]);
        free(want);
        oai_request_free(&r);
    }
    b = "{\"prompt\":[5,6],\"echo\":true}";
    rc = oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0 && r.echo[0] && !r.echo[1], "echo of one id prompt");
    if (!rc) oai_request_free(&r);
    b = "{\"prompt\":\"x\",\"echo\":false}";
    rc = oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0 && !r.echo_on && !r.echo[0] && r.rp.prompt_logprobs == -1, "no echo");
    if (!rc) oai_request_free(&r);
    /* echo with logprobs asks the engine for the prompt's logprobs; max_tokens 0 with echo
       is the prompt alone (one token generated, dropped) */
    b = "{\"prompt\":\"x\",\"echo\":true,\"logprobs\":3,\"max_tokens\":0}";
    rc = oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0 && r.rp.prompt_logprobs == 3 && r.rp.logprobs == 3 && r.echo_only && r.rp.max_tokens == 1,
          "echo + logprobs: %s", rc ? e.message : "");
    if (!rc) oai_request_free(&r);
    b = "{\"prompt\":\"x\",\"logprobs\":2}";
    rc = oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0 && r.rp.prompt_logprobs == -1 && !r.echo_only, "logprobs without echo");
    if (!rc) oai_request_free(&r);
    /* vLLM's prompt_logprobs field asks the engine for as many alternatives as the larger
       of it and echo's logprobs */
    b = "{\"prompt\":\"x\",\"prompt_logprobs\":7}";
    rc = oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0 && r.prompt_logprobs == 7 && r.rp.prompt_logprobs == 7 && r.rp.logprobs == -1, "prompt_logprobs");
    if (!rc) oai_request_free(&r);
    b = "{\"prompt\":\"x\",\"prompt_logprobs\":1,\"echo\":true,\"logprobs\":4}";
    rc = oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0 && r.prompt_logprobs == 1 && r.rp.prompt_logprobs == 4, "prompt_logprobs with echo");
    if (!rc) oai_request_free(&r);
    b = "{\"prompt\":\"x\",\"prompt_logprobs\":null}";
    rc = oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0 && r.prompt_logprobs == -1 && r.rp.prompt_logprobs == -1, "prompt_logprobs null");
    if (!rc) oai_request_free(&r);
}

/* bad_words: each word's tokens as the tokenizer writes it at the start of a text and, when
 * that differs as a word of its own, after a space (vLLM's rule) */
static void test_bad_words(void)
{
    struct oai_ctx ctx = make_ctx(2048);
    struct oai_request r;
    struct api_error e;
    const char *b = "{\"prompt\":\"x\",\"bad_words\":[\"  Paris\",\"hello world\"]}";
    int rc = oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0, "bad_words: %s", rc ? e.message : "");
    if (rc) return;
    int32_t want[64];
    int n = 0;
    const char *words[2] = { "Paris", "hello world" };
    for (int w = 0; w < 2; w++) {
        char spaced[32];
        snprintf(spaced, sizeof spaced, " %s", words[w]);
        int32_t a[16], c[16];
        int na = tok_encode(g_model->tok, words[w], strlen(words[w]), false, false, a, 16);
        int nc = tok_encode(g_model->tok, spaced, strlen(spaced), false, false, c, 16);
        want[n++] = na;
        for (int k = 0; k < na; k++) want[n++] = a[k];
        if (nc == na && c[0] != a[0]) {
            want[n++] = nc;
            for (int k = 0; k < nc; k++) want[n++] = c[k];
        }
    }
    CHECK(r.rp.bad_words_len == n && r.rp.bad_words == r.bad_words &&
              !memcmp(r.bad_words, want, sizeof *want * (size_t)n),
          "bad_words: %d entries, want %d", r.rp.bad_words_len, n);
    CHECK(n > 6, "both words had their spaced form (%d entries)", n);
    oai_request_free(&r);
}

/* truncate_prompt_tokens (vLLM): each prompt keeps its last k tokens; the echo is what
 * remains; -1 = max_model_len; 0 or past max_model_len: 400 */
static void test_truncate_prompt(void)
{
    struct oai_ctx ctx = make_ctx(64);
    struct oai_request r;
    struct api_error e;
    const char *b = "{\"prompt\":[[1,2,3,4,5,6],[7,8],[9,10,11,12,13]],\"truncate_prompt_tokens\":3,\"echo\":true}";
    int rc = oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0, "truncate batch: %s", rc ? e.message : "");
    if (!rc) {
        const int32_t want[] = { 4, 5, 6, 7, 8, 11, 12, 13 };
        CHECK(r.n_prompt == 8 && !memcmp(r.prompt_ids, want, sizeof want) && r.prompt_off[1] == 3 &&
                  r.prompt_off[2] == 5 && r.prompt_off[3] == 8, "truncated ids: %d", r.n_prompt);
        char *e0 = tok_decode(g_model->tok, want, 3, false);
        CHECK(e0 && !strcmp(r.echo[0], e0), "echo of the kept tokens '%s'", r.echo[0]);
        free(e0);
        oai_request_free(&r);
    }
    /* a text: its last tokens, the echo decoded from them */
    b = "{\"prompt\":\"one two three four five six seven\",\"truncate_prompt_tokens\":2,\"echo\":true}";
    rc = oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0 && r.n_prompt == 2 && !strcmp(r.echo[0], " six seven"), "text: %d '%s'", r.n_prompt,
          rc ? e.message : r.echo[0]);
    if (!rc) oai_request_free(&r);
    b = "{\"prompt\":[1,2],\"truncate_prompt_tokens\":-1}";
    rc = oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0 && r.truncate == 64 && r.n_prompt == 2, "-1: %d", r.truncate);
    if (!rc) oai_request_free(&r);
    const char *bad[] = { "{\"prompt\":[1],\"truncate_prompt_tokens\":0}", "{\"prompt\":[1],\"truncate_prompt_tokens\":65}",
                          "{\"prompt\":[1],\"truncate_prompt_tokens\":-2}", "{\"prompt\":[1],\"truncate_prompt_tokens\":1.5}" };
    for (int i = 0; i < 4; i++) {
        rc = oai_parse_completion(&ctx, bad[i], strlen(bad[i]), &r, &e);
        CHECK(rc < 0 && e.status == 400 && e.param && !strcmp(e.param, "truncate_prompt_tokens"), "%s: %d", bad[i], rc);
        if (!rc) oai_request_free(&r);
    }
}

/* A few messages named precisely; the JSON error body of a bad request. */
static void test_bad_messages(void)
{
    struct oai_ctx ctx = make_ctx(2048), small = make_ctx(40);
    struct oai_request r;
    struct api_error e;
    const char *b = "{" MSG ",\"temperature\":\"hot\"}";
    oai_parse_chat(&ctx, b, strlen(b), &r, &e);
    CHECK(!strcmp(e.message, "'temperature' must be a number"), "%s", e.message);
    b = "{" MSG ",\"model\":\"gpt-4\"}";
    oai_parse_chat(&ctx, b, strlen(b), &r, &e);
    CHECK(!strcmp(e.message, "The model 'gpt-4' does not exist."), "%s", e.message);
    /* a batch: prompts one after another, each checked against the context on its own */
    b = "{\"prompt\":[[1],[2,3]],\"n\":2}";
    int rc = oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0 && r.n_prompts == 2 && r.n_prompt == 3 && oai_n_choices(&r) == 4, "batch: rc %d", rc);
    int len = 0;
    const int32_t *p1 = rc ? NULL : oai_prompt(&r, 1, &len);
    CHECK(p1 && len == 2 && p1[0] == 2 && p1[1] == 3, "prompt 1");
    if (!rc) oai_request_free(&r);
    b = "{\"prompt\":[[1],[]]}";
    oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(!strcmp(e.message, "'prompt'[1] must not be empty"), "%s", e.message);
    b = "{\"prompt\":[[1],[2,-1]]}";
    oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(strstr(e.message, "'prompt'[1][1] = -1 is not a token id"), "%s", e.message);
    b = "{\"prompt\":[[1],[2]],\"n\":16,\"max_tokens\":1}";
    rc = oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0, "2 x 16 choices: %s", e.message);
    if (!rc) oai_request_free(&r);
    b = "{\"prompt\":[[1],[2],[3],[4],[5]],\"n\":13}";
    oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(!strcmp(e.message, "5 prompts x n = 13 would be 65 choices, more than 64"), "%s", e.message);
    b = "{\"prompt\":[[1],[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,"
        "31,32,33,34,35,36,37,38,39,40,41]]}";
    oai_parse_completion(&small, b, strlen(b), &r, &e);
    CHECK(strstr(e.message, "41 input tokens"), "the batch's longest prompt: %s", e.message);
    b = "{\"prompt\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,"
        "31,32,33,34,35,36,37,38,39,40,41]}";
    oai_parse_completion(&small, b, strlen(b), &r, &e);
    CHECK(strstr(e.message, "maximum context length is 40 tokens") && strstr(e.message, "41 input tokens"),
          "%s", e.message);
    b = "{\"prompt\":[1,2,3],\"max_tokens\":38}";
    oai_parse_completion(&small, b, strlen(b), &r, &e);
    CHECK(strstr(e.message, "you requested 41 tokens (3 in the prompt, 38 in the completion)"), "%s", e.message);
    /* the no-template model */
    struct model nt = *g_model;
    nt.tmpl = NULL;
    struct oai_ctx nctx = make_ctx(2048);
    nctx.m = &nt;
    b = "{" MSG "}";
    rc = oai_parse_chat(&nctx, b, strlen(b), &r, &e);
    CHECK(rc < 0 && e.status == 400 && strstr(e.message, "no chat template"), "rc %d: %s", rc, e.message);
    /* the error JSON */
    char *j = api_error_json(&e);
    cJSON *root = cJSON_Parse(j);
    cJSON *err = cJSON_GetObjectItem(root, "error");
    CHECK(cJSON_IsString(cJSON_GetObjectItem(err, "message")) && cJSON_IsNull(cJSON_GetObjectItem(err, "param")) &&
          cJSON_IsNull(cJSON_GetObjectItem(err, "code")), "%s", j);
    cJSON_Delete(root);
    free(j);
    /* 301 logit_bias entries */
    char big[8192];
    int n = snprintf(big, sizeof big, "{" MSG ",\"logit_bias\":{");
    for (int i = 0; i < 301; i++) n += snprintf(big + n, sizeof big - (size_t)n, "%s\"%d\":1", i ? "," : "", i);
    snprintf(big + n, sizeof big - (size_t)n, "}}");
    rc = oai_parse_chat(&ctx, big, strlen(big), &r, &e);
    CHECK(rc < 0 && !strcmp(e.param, "logit_bias"), "rc %d param %s", rc, e.param);
    /* exactly 300 is fine */
    n = snprintf(big, sizeof big, "{" MSG ",\"logit_bias\":{");
    for (int i = 0; i < 300; i++) n += snprintf(big + n, sizeof big - (size_t)n, "%s\"%d\":1", i ? "," : "", i);
    snprintf(big + n, sizeof big - (size_t)n, "}}");
    rc = oai_parse_chat(&ctx, big, strlen(big), &r, &e);
    CHECK(rc == 0 && r.rp.n_bias == 300, "rc %d: %s", rc, e.message);
    if (rc == 0) oai_request_free(&r);
}

/* ---------------------------------------------------------------- good inputs */

/* The ids chat_render + tok_encode give for messages (the SmolLM2 template writes no BOS
 * and its tokenizer adds none: the specials-parsed template text is the whole prompt). */
static int reference_chat_ids(const char *messages_json, bool agp, int32_t *ids, int cap)
{
    cJSON *msgs = cJSON_Parse(messages_json);
    struct chat_specials sp = { g_model->bos_token ? g_model->bos_token : "",
                                g_model->eos_token ? g_model->eos_token : "" };
    char *text = NULL, err[ERR_BUF];
    size_t len = 0;
    int rc = chat_render(g_model->tmpl, &sp, msgs, NULL, NULL, agp, &text, &len, err, sizeof err);
    cJSON_Delete(msgs);
    if (rc) return rc;
    int n = tok_encode(g_model->tok, text, len, false, true, ids, cap);
    free(text);
    return n;
}

static void test_defaults(void)
{
    struct oai_ctx ctx = make_ctx(2048);
    struct oai_request r, r2;
    struct api_error e;
    const char *b = "{" MSG "}";
    int rc = oai_parse_chat(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0, "rc %d: %s", rc, e.message);
    if (rc) return;
    CHECK(r.kind == OAI_CHAT && r.model == g_names[0], "model %s", r.model);
    CHECK(!r.stream && !r.include_usage && r.n == 1 && !r.seed_given, "flags");
    CHECK(r.top_logprobs == -1 && r.rp.logprobs == -1, "logprobs %d %d", r.top_logprobs, r.rp.logprobs);
    CHECK(r.rp.sp.temperature == 0.7f && r.rp.sp.top_p == 0.9f && r.rp.sp.top_k == 50 &&
          r.rp.sp.repetition_penalty == 1.05f && r.rp.sp.min_p == 0 && r.rp.sp.presence_penalty == 0 &&
          r.rp.sp.frequency_penalty == 0, "defaults not applied");
    CHECK(r.rp.max_tokens == 0 && !r.rp.ignore_eos && r.rp.skip_special_tokens, "max %d", r.rp.max_tokens);
    CHECK(r.rp.n_stops == 0 && r.rp.n_bias == 0 && r.rp.cache_salt == NULL, "extras");
    rc = oai_parse_chat(&ctx, b, strlen(b), &r2, &e);
    CHECK(rc == 0 && r2.rp.sp.seed != r.rp.sp.seed, "random seeds equal");
    oai_request_free(&r2);
    oai_request_free(&r);
    CHECK(r.prompt_ids == NULL, "free did not clear");

    /* nulls are "absent"; unknown fields ignored; the server's max_tokens default */
    ctx.defaults.max_tokens = 100;
    b = "{" MSG ",\"temperature\":null,\"stop\":null,\"seed\":null,\"n\":null,\"model\":null,"
        "\"stream_options\":null,\"logit_bias\":null,\"frobnicate\":{\"x\":[1,2]},\"tool_choice\":\"auto\"}";
    rc = oai_parse_chat(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0, "rc %d: %s", rc, e.message);
    if (rc) return;
    CHECK(r.rp.sp.temperature == 0.7f && !r.seed_given && r.n == 1 && r.rp.max_tokens == 100,
          "nulls: t %g max %d", (double)r.rp.sp.temperature, r.rp.max_tokens);
    oai_request_free(&r);
}

static void test_all_params(void)
{
    struct oai_ctx ctx = make_ctx(2048);
    struct oai_request r;
    struct api_error e;
    const char *b =
        "{\"model\":\"smol\"," MSG ",\"temperature\":0.5,\"top_p\":0.8,\"top_k\":40,\"min_p\":0.05,"
        "\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,\"repetition_penalty\":1.1,\"n\":3,"
        "\"seed\":42,\"stop\":[\"a\",\"bc\"],\"logit_bias\":{\"5\":-100,\"10\":2.5},\"logprobs\":true,"
        "\"top_logprobs\":5,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"max_completion_tokens\":7,\"max_tokens\":9,\"cache_salt\":\"tenant-1\",\"ignore_eos\":true,"
        "\"skip_special_tokens\":false,\"user\":\"u1\",\"tools\":[],\"chat_template_kwargs\":{\"x\":1}}";
    int rc = oai_parse_chat(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0, "rc %d: %s", rc, e.message);
    if (rc) return;
    CHECK(r.model == g_names[1], "model");
    const struct sampler_params *sp = &r.rp.sp;
    CHECK(sp->temperature == 0.5f && sp->top_p == 0.8f && sp->top_k == 40 && sp->min_p == 0.05f &&
          sp->presence_penalty == 0.5f && sp->frequency_penalty == -0.5f && sp->repetition_penalty == 1.1f,
          "sampling params");
    CHECK(r.n == 3 && r.seed_given && sp->seed == 42, "n %d seed %llu", r.n, (unsigned long long)sp->seed);
    CHECK(r.rp.n_stops == 2 && !strcmp(r.rp.stops[0], "a") && !strcmp(r.rp.stops[1], "bc") &&
          r.rp.stops[0] == r.stop_strs[0], "stops");
    CHECK(r.rp.n_bias == 2 && r.rp.bias_ids[0] == 5 && r.rp.bias[0] == -100.0f && r.rp.bias_ids[1] == 10 &&
          r.rp.bias[1] == 2.5f && r.rp.bias_ids == r.bias_ids, "bias");
    CHECK(r.top_logprobs == 5 && r.rp.logprobs == 5, "logprobs");
    CHECK(r.stream && r.include_usage, "stream");
    CHECK(r.rp.max_tokens == 7, "max_completion_tokens wins: %d", r.rp.max_tokens);
    CHECK(r.rp.cache_salt && !strcmp(r.rp.cache_salt, "tenant-1"), "salt");
    CHECK(r.rp.ignore_eos && !r.rp.skip_special_tokens, "flags");
    oai_request_free(&r);

    /* negative seed wraps; top_k -1; logprobs without top_logprobs → 0; top_logprobs 20 */
    b = "{" MSG ",\"seed\":-1,\"top_k\":-1,\"logprobs\":true,\"stop\":\"\\n\\n\"}";
    rc = oai_parse_chat(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0 && r.rp.sp.seed == UINT64_MAX && r.rp.sp.top_k == -1 && r.top_logprobs == 0 &&
          r.rp.n_stops == 1 && !strcmp(r.rp.stops[0], "\n\n"), "rc %d: %s", rc, e.message);
    if (!rc) oai_request_free(&r);
    b = "{" MSG ",\"logprobs\":true,\"top_logprobs\":20,\"temperature\":0,\"top_p\":1,\"n\":16,\"max_tokens\":1}";
    rc = oai_parse_chat(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0 && r.top_logprobs == 20 && r.n == 16 && r.rp.max_tokens == 1, "rc %d: %s", rc, e.message);
    if (!rc) oai_request_free(&r);
    /* stream_options with include_usage false / absent */
    b = "{" MSG ",\"stream\":true,\"stream_options\":{}}";
    rc = oai_parse_chat(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0 && r.stream && !r.include_usage, "rc %d: %s", rc, e.message);
    if (!rc) oai_request_free(&r);
}

static void test_chat_prompt_ids(void)
{
    struct oai_ctx ctx = make_ctx(2048);
    static const char *const convs[] = {
        "[{\"role\":\"user\",\"content\":\"Hi\"}]",
        "[{\"role\":\"system\",\"content\":\"You are terse.\"},{\"role\":\"user\",\"content\":\"What is 2+2? <|im_end|>\"},"
        "{\"role\":\"assistant\",\"content\":\"4\"},{\"role\":\"user\",\"content\":\"caf\\u00e9 \\ud83d\\ude00\"}]",
        "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"part one\"},{\"type\":\"text\",\"text\":\"part two\"}]}]",
    };
    int32_t ref[4096];
    char body[4096];
    for (size_t i = 0; i < sizeof convs / sizeof convs[0]; i++)
        for (int agp = 0; agp < 2; agp++) {
            int n = reference_chat_ids(convs[i], agp, ref, 4096);
            CHECK(n > 0, "reference failed for %zu: %d", i, n);
            snprintf(body, sizeof body, "{\"messages\":%s%s}", convs[i], agp ? "" : ",\"add_generation_prompt\":false");
            struct oai_request r;
            struct api_error e;
            int rc = oai_parse_chat(&ctx, body, strlen(body), &r, &e);
            CHECK(rc == 0, "conv %zu rc %d: %s", i, rc, e.message);
            if (rc) continue;
            CHECK(r.n_prompt == n && !memcmp(r.prompt_ids, ref, sizeof *ref * (size_t)n),
                  "conv %zu agp %d: %d ids vs reference %d", i, agp, r.n_prompt, n);
            oai_request_free(&r);
        }
    /* the "<|im_end|>" typed by the user is a special token in the rendered template (as in
     * HF apply_chat_template): the prompt holds the id */
    CHECK(tok_find(g_model->tok, "<|im_end|>") >= 0, "no <|im_end|>");
}

static void test_completion_prompts(void)
{
    struct oai_ctx ctx = make_ctx(2048);
    struct oai_request r;
    struct api_error e;
    const char *text = "Hello <|im_start|> world";
    int32_t ref[64];
    int n = tok_encode(g_model->tok, text, strlen(text), true, false, ref, 64);
    int im_start = tok_find(g_model->tok, "<|im_start|>");
    const char *b = "{\"prompt\":\"Hello <|im_start|> world\",\"logprobs\":3,\"max_tokens\":5,\"echo\":false,"
                    "\"suffix\":null,\"best_of\":1}";
    int rc = oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0, "rc %d: %s", rc, e.message);
    if (!rc) {
        CHECK(r.kind == OAI_COMPLETION && r.n_prompt == n && !memcmp(r.prompt_ids, ref, sizeof *ref * (size_t)n),
              "string prompt ids differ (%d vs %d)", r.n_prompt, n);
        bool has_special = false;
        for (int i = 0; i < r.n_prompt; i++) has_special |= r.prompt_ids[i] == im_start;
        CHECK(!has_special, "user text turned into a special token");
        CHECK(r.top_logprobs == 3 && r.rp.logprobs == 3 && r.rp.max_tokens == 5, "logprobs %d", r.top_logprobs);
        oai_request_free(&r);
    }
    b = "{\"prompt\":[\"Hello <|im_start|> world\"]}";
    rc = oai_parse_completion(&ctx, b, strlen(b), &r, &e);
    CHECK(rc == 0 && r.n_prompt == n && !memcmp(r.prompt_ids, ref, sizeof *ref * (size_t)n), "[string] prompt");
    if (!rc) oai_request_free(&r);
    static const char *const id_bodies[] = { "{\"prompt\":[1,2,49151,0]}", "{\"prompt\":[[1,2,49151,0]]}",
                                             "{\"prompt\":[1.0,2,49151,0e0]}" };
    const int32_t want[] = { 1, 2, 49151, 0 };
    for (size_t i = 0; i < 3; i++) {
        rc = oai_parse_completion(&ctx, id_bodies[i], strlen(id_bodies[i]), &r, &e);
        CHECK(rc == 0 && r.n_prompt == 4 && !memcmp(r.prompt_ids, want, sizeof want), "%s: rc %d %s",
              id_bodies[i], rc, e.message);
        if (!rc) oai_request_free(&r);
    }
    /* exactly filling the context with max_tokens is fine; max_tokens absent never fails */
    struct oai_ctx small = make_ctx(40);
    b = "{\"prompt\":[1,2,3,4,5,6,7,8,9,10],\"max_tokens\":30}";
    rc = oai_parse_completion(&small, b, strlen(b), &r, &e);
    CHECK(rc == 0 && r.rp.max_tokens == 30, "rc %d: %s", rc, e.message);
    if (!rc) oai_request_free(&r);
    b = "{\"prompt\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,"
        "31,32,33,34,35,36,37,38,39]}";
    rc = oai_parse_completion(&small, b, strlen(b), &r, &e);
    CHECK(rc == 0 && r.n_prompt == 39, "rc %d: %s", rc, e.message);
    if (!rc) oai_request_free(&r);
}

/* ---------------------------------------------------------------- formatting */

/* Parses an SSE event: checks the framing and returns the JSON. */
static cJSON *parse_sse(const char *s, size_t len)
{
    CHECK(s != NULL, "NULL event");
    if (!s) return NULL;
    CHECK(len == strlen(s), "len %zu vs %zu", len, strlen(s));
    CHECK(!strncmp(s, "data: ", 6), "no 'data: ' prefix: %.20s", s);
    CHECK(len >= 8 && !strcmp(s + len - 2, "\n\n") && s[len - 3] != '\n', "bad end");
    CHECK(!memchr(s + 6, '\n', len - 8), "newline inside the JSON");
    cJSON *j = cJSON_Parse(s + 6);
    CHECK(j != NULL, "not JSON: %s", s);
    return j;
}

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

static int count_keys(const cJSON *o)
{
    return cJSON_GetArraySize(o);
}

static void check_meta(const cJSON *j, const char *object)
{
    CHECK(jstr(j, "id") && !strcmp(jstr(j, "id"), "chatcmpl-abc"), "id");
    CHECK(jstr(j, "object") && !strcmp(jstr(j, "object"), object), "object %s", jstr(j, "object"));
    CHECK(cJSON_GetObjectItem(j, "created")->valuedouble == 1700000000.0, "created");
    CHECK(jstr(j, "model") && !strcmp(jstr(j, "model"), "smol"), "model");
}

static void test_chat_chunks(void)
{
    struct oai_meta meta = { OAI_CHAT, "chatcmpl-abc", 1700000000, "smol" };
    struct oai_piece p;
    memset(&p, 0, sizeof p);
    size_t len = 0;
    /* the role chunk */
    char *s = oai_chunk_sse(g_model, &meta, &p, true, &len);
    cJSON *j = parse_sse(s, len);
    check_meta(j, "chat.completion.chunk");
    CHECK(count_keys(j) == 5, "keys %d", count_keys(j));
    cJSON *choices = cJSON_GetObjectItem(j, "choices");
    CHECK(cJSON_GetArraySize(choices) == 1, "choices");
    cJSON *c = cJSON_GetArrayItem(choices, 0), *d = cJSON_GetObjectItem(c, "delta");
    CHECK(cJSON_GetObjectItem(c, "index")->valueint == 0 && count_keys(c) == 4, "choice shape");
    CHECK(count_keys(d) == 2 && !strcmp(jstr(d, "role"), "assistant") && !strcmp(jstr(d, "content"), ""), "role delta");
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(c, "logprobs")) && cJSON_IsNull(cJSON_GetObjectItem(c, "finish_reason")),
          "nulls");
    cJSON_Delete(j);
    free(s);
    /* a content chunk: bytes beyond text_len are not read; quotes, controls, NUL, an
     * invalid byte */
    const char text[] = "say \"hi\"\n\x01\0x\xff!TRAILING";
    p.index = 2;
    p.text = text;
    p.text_len = 14;
    s = oai_chunk_sse(g_model, &meta, &p, false, &len);
    j = parse_sse(s, len);
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    d = cJSON_GetObjectItem(c, "delta");
    CHECK(cJSON_GetObjectItem(c, "index")->valueint == 2, "index");
    CHECK(count_keys(d) == 1 && !cJSON_GetObjectItem(d, "role"), "content-only delta");
    CHECK(s && strstr(s, "\\u0000x"), "NUL escaped: %s", s);
    /* cJSON's parsed string stops at the NUL: compare the part before it */
    CHECK(jstr(d, "content") && !strcmp(jstr(d, "content"), "say \"hi\"\n\x01"), "content '%s'", jstr(d, "content"));
    CHECK(s && strstr(s, "x\xef\xbf\xbd!\""), "invalid byte not replaced: %s", s);
    cJSON_Delete(j);
    free(s);
    /* the final chunk */
    p.text_len = 0;
    p.finish_reason = "length";
    s = oai_chunk_sse(g_model, &meta, &p, false, &len);
    j = parse_sse(s, len);
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    d = cJSON_GetObjectItem(c, "delta");
    CHECK(cJSON_IsObject(d) && count_keys(d) == 0, "final delta not {}");
    CHECK(jstr(c, "finish_reason") && !strcmp(jstr(c, "finish_reason"), "length"), "finish_reason");
    cJSON_Delete(j);
    free(s);
    /* the usage chunk */
    struct oai_usage u = { .prompt_tokens = 12, .completion_tokens = 5, .cached_tokens = 8 };
    s = oai_usage_chunk_sse(&meta, &u, &len);
    j = parse_sse(s, len);
    check_meta(j, "chat.completion.chunk");
    choices = cJSON_GetObjectItem(j, "choices");
    CHECK(cJSON_IsArray(choices) && cJSON_GetArraySize(choices) == 0, "usage chunk choices not []");
    cJSON *us = cJSON_GetObjectItem(j, "usage");
    CHECK(cJSON_GetObjectItem(us, "prompt_tokens")->valueint == 12 &&
          cJSON_GetObjectItem(us, "completion_tokens")->valueint == 5 &&
          cJSON_GetObjectItem(us, "total_tokens")->valueint == 17 &&
          cJSON_GetObjectItem(cJSON_GetObjectItem(us, "prompt_tokens_details"), "cached_tokens")->valueint == 8,
          "usage");
    cJSON_Delete(j);
    free(s);
    /* an error event */
    struct api_error e;
    api_error_set(&e, 500, API_ERR_SERVER, NULL, NULL, "engine failed");
    s = oai_error_sse(&e, &len);
    j = parse_sse(s, len);
    cJSON *err = cJSON_GetObjectItem(j, "error");
    CHECK(jstr(err, "message") && !strcmp(jstr(err, "message"), "engine failed") &&
          !strcmp(jstr(err, "type"), "server_error"), "error event");
    cJSON_Delete(j);
    free(s);
    CHECK(!strcmp(OAI_SSE_DONE, "data: [DONE]\n\n"), "done");
}

/* Logprobs over real tokens: "Hello" plus a byte token that is not valid UTF-8 alone. */
static void make_logprobs(struct req_logprob lp[3], int32_t ids[3])
{
    int n = tok_encode(g_model->tok, "Hello world", 11, false, false, ids, 3);
    CHECK(n == 2, "Hello world: %d tokens", n);
    /* the token for the single byte 0xe2 (the GPT-2 alphabet maps it to 'â') */
    ids[2] = tok_find(g_model->tok, "\xc3\xa2");
    CHECK(ids[2] >= 0, "no byte token");
    memset(lp, 0, sizeof *lp * 3);
    for (int i = 0; i < 3; i++) {
        lp[i].token = ids[i];
        lp[i].logprob = -0.25f * (float)(i + 1);
        lp[i].n_top = 3;
        lp[i].top_ids[0] = ids[i];
        lp[i].top_logprobs[0] = lp[i].logprob;
        lp[i].top_ids[1] = ids[(i + 1) % 3];
        lp[i].top_logprobs[1] = -2.0f;
        lp[i].top_ids[2] = 0;
        lp[i].top_logprobs[2] = -INFINITY;
    }
    lp[1].logprob = -INFINITY;
}

static void test_chat_logprobs(void)
{
    struct oai_meta meta = { OAI_CHAT, "chatcmpl-abc", 1700000000, "smol" };
    struct req_logprob lp[3];
    int32_t ids[3];
    make_logprobs(lp, ids);
    struct oai_piece p = { .index = 0, .text = "Hello world", .text_len = 11, .lp = lp, .n_lp = 3, .top_logprobs = 2, .finish_reason = NULL, .text_offset = 0 };
    size_t len = 0;
    char *s = oai_chunk_sse(g_model, &meta, &p, false, &len);
    cJSON *j = parse_sse(s, len);
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cJSON *lpo = cJSON_GetObjectItem(c, "logprobs");
    CHECK(cJSON_IsObject(lpo) && count_keys(lpo) == 1, "logprobs object");
    cJSON *content = cJSON_GetObjectItem(lpo, "content");
    CHECK(cJSON_GetArraySize(content) == 3, "content entries %d", cJSON_GetArraySize(content));
    for (int i = 0; i < 3 && i < cJSON_GetArraySize(content); i++) {
        cJSON *t = cJSON_GetArrayItem(content, i);
        char raw[64];
        int n = tok_token_bytes(g_model->tok, ids[i], false, raw, sizeof raw);
        cJSON *bytes = cJSON_GetObjectItem(t, "bytes");
        CHECK(count_keys(t) == 4 && cJSON_GetArraySize(bytes) == n, "token %d shape", i);
        for (int k = 0; k < n && k < cJSON_GetArraySize(bytes); k++)
            CHECK(cJSON_GetArrayItem(bytes, k)->valueint == (unsigned char)raw[k], "byte %d", k);
        double want = i == 1 ? -9999.0 : -0.25 * (i + 1);
        CHECK(cJSON_GetObjectItem(t, "logprob")->valuedouble == want, "logprob %d: %g", i,
              cJSON_GetObjectItem(t, "logprob")->valuedouble);
        if (i == 2)
            CHECK(!strcmp(jstr(t, "token"), "\xef\xbf\xbd") && n == 1 && (unsigned char)raw[0] == 0xe2,
                  "byte token string '%s'", jstr(t, "token"));
        else
            CHECK(jstr(t, "token") && strlen(jstr(t, "token")) == (size_t)n && !memcmp(jstr(t, "token"), raw, (size_t)n),
                  "token string %d", i);
        cJSON *top = cJSON_GetObjectItem(t, "top_logprobs");
        CHECK(cJSON_GetArraySize(top) == 2, "top_logprobs %d", cJSON_GetArraySize(top));
        cJSON *a = cJSON_GetArrayItem(top, 1);
        CHECK(count_keys(a) == 3 && cJSON_GetObjectItem(a, "logprob")->valuedouble == -2.0 &&
              cJSON_IsArray(cJSON_GetObjectItem(a, "bytes")) && jstr(a, "token"), "alternative shape");
    }
    cJSON_Delete(j);
    free(s);
    /* top_logprobs 0: empty lists */
    p.top_logprobs = 0;
    s = oai_chunk_sse(g_model, &meta, &p, false, &len);
    j = parse_sse(s, len);
    content = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0),
                                                      "logprobs"), "content");
    cJSON *top0 = cJSON_GetObjectItem(cJSON_GetArrayItem(content, 0), "top_logprobs");
    CHECK(cJSON_IsArray(top0) && cJSON_GetArraySize(top0) == 0, "top_logprobs 0");
    cJSON_Delete(j);
    free(s);
}

static void test_completion_format(void)
{
    struct oai_meta meta = { OAI_COMPLETION, "chatcmpl-abc", 1700000000, "smol" };
    struct req_logprob lp[3];
    int32_t ids[3];
    make_logprobs(lp, ids);
    struct oai_piece p = { .index = 1, .text = "Hello world", .text_len = 11, .lp = lp, .n_lp = 3, .top_logprobs = 1, .finish_reason = NULL, .text_offset = 100 };
    size_t len = 0;
    char *s = oai_chunk_sse(g_model, &meta, &p, true, &len);
    cJSON *j = parse_sse(s, len);
    check_meta(j, "text_completion");
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    CHECK(count_keys(c) == 4 && cJSON_GetObjectItem(c, "index")->valueint == 1 && !strcmp(jstr(c, "text"), "Hello world") &&
          cJSON_IsNull(cJSON_GetObjectItem(c, "finish_reason")) && !cJSON_GetObjectItem(c, "delta"), "choice");
    cJSON *l = cJSON_GetObjectItem(c, "logprobs");
    cJSON *toks = cJSON_GetObjectItem(l, "tokens"), *tl = cJSON_GetObjectItem(l, "token_logprobs");
    cJSON *top = cJSON_GetObjectItem(l, "top_logprobs"), *off = cJSON_GetObjectItem(l, "text_offset");
    CHECK(count_keys(l) == 4 && cJSON_GetArraySize(toks) == 3 && cJSON_GetArraySize(tl) == 3 &&
          cJSON_GetArraySize(top) == 3 && cJSON_GetArraySize(off) == 3, "completion logprobs shape");
    CHECK(!strcmp(cJSON_GetArrayItem(toks, 0)->valuestring, "Hello") &&
          !strcmp(cJSON_GetArrayItem(toks, 1)->valuestring, " world"), "tokens");
    CHECK(cJSON_GetArrayItem(tl, 0)->valuedouble == -0.25 && cJSON_GetArrayItem(tl, 1)->valuedouble == -9999.0,
          "token_logprobs");
    CHECK(cJSON_GetArrayItem(off, 0)->valueint == 100 && cJSON_GetArrayItem(off, 1)->valueint == 105 &&
          cJSON_GetArrayItem(off, 2)->valueint == 111, "text_offset %d %d %d", cJSON_GetArrayItem(off, 0)->valueint,
          cJSON_GetArrayItem(off, 1)->valueint, cJSON_GetArrayItem(off, 2)->valueint);
    cJSON *t0 = cJSON_GetArrayItem(top, 0);
    CHECK(cJSON_IsObject(t0) && count_keys(t0) == 1 && cJSON_GetObjectItem(t0, "Hello")->valuedouble == -0.25,
          "top map 0");
    cJSON *t1 = cJSON_GetArrayItem(top, 1); /* the top-1 alternative is the sampled token */
    CHECK(count_keys(t1) == 1 && cJSON_GetObjectItem(t1, " world"), "top map 1");
    cJSON_Delete(j);
    free(s);
    /* a whole response */
    struct oai_piece pieces[2] = { { .index = 0, .text = "abc", .text_len = 3, .lp = NULL, .n_lp = 0, .top_logprobs = 0, .finish_reason = "stop", .text_offset = 0 }, { .index = 1, .text = "de", .text_len = 2, .lp = NULL, .n_lp = 0, .top_logprobs = 0, .finish_reason = "length", .text_offset = 0 } };
    struct oai_usage u = { .prompt_tokens = 4, .completion_tokens = 5 };
    s = oai_response_json(g_model, &meta, pieces, 2, &u, &len);
    j = cJSON_Parse(s);
    CHECK(j && len == strlen(s), "response JSON");
    check_meta(j, "text_completion");
    cJSON *ch = cJSON_GetObjectItem(j, "choices");
    CHECK(cJSON_GetArraySize(ch) == 2 && !strcmp(jstr(cJSON_GetArrayItem(ch, 1), "text"), "de") &&
          !strcmp(jstr(cJSON_GetArrayItem(ch, 1), "finish_reason"), "length") &&
          cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(ch, 0), "logprobs")), "choices");
    CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "total_tokens")->valueint == 9, "usage");
    cJSON_Delete(j);
    free(s);
}

static void test_chat_response(void)
{
    struct oai_meta meta = { OAI_CHAT, "chatcmpl-abc", 1700000000, "smol" };
    struct req_logprob lp[3];
    int32_t ids[3];
    make_logprobs(lp, ids);
    struct oai_piece pieces[2] = { { .index = 0, .text = "Hello world", .text_len = 11, .lp = lp, .n_lp = 3, .top_logprobs = 1, .finish_reason = "stop", .text_offset = 0 },
                                   { .index = 1, .text = "", .text_len = 0, .lp = NULL, .n_lp = 0, .top_logprobs = 0, .finish_reason = "length", .text_offset = 0 } };
    struct oai_usage u = { .prompt_tokens = 20, .completion_tokens = 3, .cached_tokens = 16 };
    size_t len = 0;
    char *s = oai_response_json(g_model, &meta, pieces, 2, &u, &len);
    cJSON *j = cJSON_Parse(s);
    CHECK(j && len == strlen(s), "JSON");
    check_meta(j, "chat.completion");
    CHECK(count_keys(j) == 6, "top-level keys %d", count_keys(j));
    cJSON *ch = cJSON_GetObjectItem(j, "choices");
    cJSON *c0 = cJSON_GetArrayItem(ch, 0), *c1 = cJSON_GetArrayItem(ch, 1);
    cJSON *m0 = cJSON_GetObjectItem(c0, "message"), *m1 = cJSON_GetObjectItem(c1, "message");
    CHECK(cJSON_GetArraySize(ch) == 2 && cJSON_GetObjectItem(c1, "index")->valueint == 1, "choices");
    CHECK(!strcmp(jstr(m0, "role"), "assistant") && !strcmp(jstr(m0, "content"), "Hello world") &&
          !strcmp(jstr(m1, "content"), "") && !strcmp(jstr(m1, "role"), "assistant"), "messages");
    CHECK(!strcmp(jstr(c0, "finish_reason"), "stop") && !strcmp(jstr(c1, "finish_reason"), "length"), "finish");
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "logprobs"), "content")) == 3 &&
          cJSON_IsNull(cJSON_GetObjectItem(c1, "logprobs")), "logprobs");
    cJSON *us = cJSON_GetObjectItem(j, "usage");
    CHECK(cJSON_GetObjectItem(us, "total_tokens")->valueint == 23 &&
          cJSON_GetObjectItem(cJSON_GetObjectItem(us, "prompt_tokens_details"), "cached_tokens")->valueint == 16, "usage");
    cJSON_Delete(j);
    free(s);
}

static void test_models_ids_finish(void)
{
    char *s = oai_models_json(g_names, 2, 1700000000, "/models/x.gguf", 2048);
    cJSON *j = cJSON_Parse(s);
    CHECK(j && !strcmp(jstr(j, "object"), "list"), "list");
    cJSON *data = cJSON_GetObjectItem(j, "data");
    CHECK(cJSON_GetArraySize(data) == 2, "data");
    cJSON *m1 = cJSON_GetArrayItem(data, 1);
    CHECK(!strcmp(jstr(m1, "id"), "smol") && !strcmp(jstr(m1, "object"), "model") &&
          !strcmp(jstr(m1, "owned_by"), "tessera") && !strcmp(jstr(m1, "root"), "/models/x.gguf") &&
          cJSON_GetObjectItem(m1, "max_model_len")->valueint == 2048 &&
          cJSON_GetObjectItem(m1, "created")->valuedouble == 1700000000.0, "model entry");
    cJSON_Delete(j);
    free(s);

    char a[64], b[64], small[10];
    oai_make_id("chatcmpl-", a, sizeof a);
    oai_make_id("chatcmpl-", b, sizeof b);
    CHECK(strlen(a) == 9 + 24 && !strncmp(a, "chatcmpl-", 9) && strcmp(a, b) != 0, "ids %s %s", a, b);
    bool alnum = true;
    for (const char *p = a + 9; *p; p++)
        alnum &= (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9');
    CHECK(alnum, "id chars %s", a);
    oai_make_id("cmpl-", small, sizeof small);
    CHECK(strlen(small) == 9 && !strncmp(small, "cmpl-", 5), "truncated id %s", small);

    CHECK(oai_finish_reason(REQ_FINISH_NONE) == NULL && !strcmp(oai_finish_reason(REQ_FINISH_STOP), "stop") &&
          !strcmp(oai_finish_reason(REQ_FINISH_LENGTH), "length") &&
          !strcmp(oai_finish_reason(REQ_FINISH_ABORT), "abort") &&
          !strcmp(oai_finish_reason(REQ_FINISH_ERROR), "error"), "finish reasons");
    CHECK(oai_utf8_chars("a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xff", 11) == 5, "utf8 chars");
}

static void test_tokenize(void)
{
    struct oai_ctx ctx = make_ctx(2048);
    struct api_error e;
    char *out = NULL;
    const char *b = "{\"prompt\":\"Hello world\"}";
    int rc = oai_tokenize(&ctx, b, strlen(b), &out, &e);
    CHECK(rc == 0, "rc %d: %s", rc, e.message);
    cJSON *j = cJSON_Parse(out);
    int32_t ref[8];
    int n = tok_encode(g_model->tok, "Hello world", 11, true, false, ref, 8);
    cJSON *toks = cJSON_GetObjectItem(j, "tokens");
    CHECK(cJSON_GetObjectItem(j, "count")->valueint == n && cJSON_GetArraySize(toks) == n &&
          cJSON_GetObjectItem(j, "max_model_len")->valueint == 2048, "tokenize %s", out);
    for (int i = 0; i < n && i < cJSON_GetArraySize(toks); i++)
        CHECK(cJSON_GetArrayItem(toks, i)->valueint == ref[i], "token %d", i);
    cJSON_Delete(j);
    free(out);

    /* messages count what the chat endpoint would send */
    b = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"add_generation_prompt\":false}";
    rc = oai_tokenize(&ctx, b, strlen(b), &out, &e);
    CHECK(rc == 0, "rc %d: %s", rc, e.message);
    int32_t chat_ref[256];
    n = reference_chat_ids("[{\"role\":\"user\",\"content\":\"Hi\"}]", false, chat_ref, 256);
    j = cJSON_Parse(out);
    CHECK(cJSON_GetObjectItem(j, "count")->valueint == n, "messages count %s vs %d", out, n);
    cJSON_Delete(j);
    free(out);

    /* detokenize round trip; the byte token 0xe2 comes back as U+FFFD */
    int32_t ids[3];
    struct req_logprob lp[3];
    make_logprobs(lp, ids);
    char body[128];
    snprintf(body, sizeof body, "{\"tokens\":[%d,%d]}", ids[0], ids[1]);
    rc = oai_detokenize(&ctx, body, strlen(body), &out, &e);
    j = cJSON_Parse(out);
    CHECK(rc == 0 && jstr(j, "prompt") && !strcmp(jstr(j, "prompt"), "Hello world"), "detokenize %s", out);
    cJSON_Delete(j);
    free(out);
    snprintf(body, sizeof body, "{\"tokens\":[%d,%d]}", ids[0], ids[2]);
    rc = oai_detokenize(&ctx, body, strlen(body), &out, &e);
    j = cJSON_Parse(out);
    CHECK(rc == 0 && jstr(j, "prompt") && !strcmp(jstr(j, "prompt"), "Hello\xef\xbf\xbd"), "detokenize %s", out);
    cJSON_Delete(j);
    free(out);
    b = "{\"tokens\":[]}";
    rc = oai_detokenize(&ctx, b, strlen(b), &out, &e);
    CHECK(rc == 0 && out && !strcmp(out, "{\"prompt\":\"\"}"), "empty %s", out ? out : "");
    free(out);

    /* errors */
    static const struct { int detok; const char *body; const char *param; int status; } bad[] = {
        { 0, "{", "", 400 },
        { 0, "[1]", "", 400 },
        { 0, "{}", "", 400 },
        { 0, "{\"prompt\":5}", "prompt", 400 },
        { 0, "{\"prompt\":\"x\",\"add_special_tokens\":\"yes\"}", "add_special_tokens", 400 },
        { 0, "{\"messages\":[]}", "messages", 400 },
        { 0, "{\"prompt\":\"x\",\"model\":\"nope\"}", "model", 404 },
        { 1, "{}", "tokens", 400 },
        { 1, "{\"tokens\":[49152]}", "tokens", 400 },
        { 1, "{\"tokens\":[-1]}", "tokens", 400 },
        { 1, "{\"tokens\":[\"a\"]}", "tokens", 400 },
        { 1, "{\"tokens\":\"1\"}", "tokens", 400 },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        out = NULL;
        rc = bad[i].detok ? oai_detokenize(&ctx, bad[i].body, strlen(bad[i].body), &out, &e)
                          : oai_tokenize(&ctx, bad[i].body, strlen(bad[i].body), &out, &e);
        CHECK(rc < 0 && out == NULL && e.status == bad[i].status && !strcmp(e.param, bad[i].param),
              "case %zu: rc %d status %d param '%s' (%s)", i, rc, e.status, e.param, e.message);
        free(out);
    }
}

/* Several threads parse and format at once (run under TSan/ASan in make asan). */
static void *parse_worker(void *arg)
{
    const struct oai_ctx *ctx = arg;
    const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story about threads.\"}],\"n\":2}";
    intptr_t fails = 0;
    for (int i = 0; i < 50; i++) {
        struct oai_request r;
        struct api_error e;
        if (oai_parse_chat(ctx, b, strlen(b), &r, &e) || r.n != 2) fails++;
        else oai_request_free(&r);
    }
    return (void *)fails;
}

static void test_threads(void)
{
    struct oai_ctx ctx = make_ctx(2048);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, parse_worker, &ctx);
    for (int i = 0; i < 4; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        CHECK(ret == NULL, "thread %d: %ld failures", i, (long)(intptr_t)ret);
    }
}

int main(void)
{
    char err[ERR_BUF];
    if (model_load(test_path("models/SmolLM2-135M-Instruct.Q4_1.gguf"), 0, &g_model, err, sizeof err)) {
        fprintf(stderr, "cannot load the test model: %s\n", err);
        return 1;
    }
    RUN(test_bad_inputs);
    RUN(test_bad_messages);
    RUN(test_continue_final);
    RUN(test_completion_echo);
    RUN(test_bad_words);
    RUN(test_truncate_prompt);
    RUN(test_chat_documents_and_specials);
    RUN(test_harmless_params);
    RUN(test_prompt_bytes);
    RUN(test_defaults);
    RUN(test_all_params);
    RUN(test_chat_prompt_ids);
    RUN(test_completion_prompts);
    RUN(test_chat_chunks);
    RUN(test_chat_logprobs);
    RUN(test_completion_format);
    RUN(test_chat_response);
    RUN(test_models_ids_finish);
    RUN(test_tokenize);
    RUN(test_threads);
    model_free(g_model);
    return test_summary();
}

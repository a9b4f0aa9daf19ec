/* openai_internal.h — helpers shared by the openai*.c files (not part of the API).
 *
 * JSON strings: cJSON neither validates UTF-8 on input nor can it hold a string with an
 * embedded NUL, so request strings are checked here (oai_check_utf8_tree) and response
 * text goes out through oai_json_string, which escapes bytes itself and hands cJSON a
 * raw, already-quoted value.
 */
#ifndef TESSERA_API_OPENAI_INTERNAL_H
#define TESSERA_API_OPENAI_INTERNAL_H

#include "api/openai.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cJSON;

/* Length of the valid UTF-8 sequence at s[0, len) (1..4), or 0 if s does not start
 * with one (overlong forms, surrogates and code points above U+10FFFF are invalid). */
int oai_utf8_seq_len(const unsigned char *s, size_t len);
/* True if s[0, len) is entirely valid UTF-8. */
bool oai_utf8_valid(const char *s, size_t len);

/* Parses body[0, len) as one JSON value with nothing but whitespace after it and checks
 * that every string and key in it is valid UTF-8 without NUL. Returns the tree (caller
 * frees with cJSON_Delete) or NULL with *e filled (400, param naming the bad string). */
struct cJSON *oai_parse_body(const char *body, size_t len, struct api_error *e);

/* A cJSON raw item holding s[0, len) as a quoted JSON string: invalid UTF-8 bytes become
 * U+FFFD, control characters and NUL are \u-escaped. NULL on OOM. */
struct cJSON *oai_json_string(const char *s, size_t len);

/* What a chat request asks of its prompt besides the messages (oai_chat_options). */
struct oai_chat_opts {
    const struct cJSON *tools;     /* an array, or NULL */
    const struct cJSON *kwargs;    /* chat_template_kwargs: an object, or NULL */
    const struct cJSON *documents; /* an array (the template's `documents`, as vLLM passes
                                      them to retrieval templates), or NULL */
    bool add_generation_prompt;    /* default true; false by default with continue_final */
    bool continue_final;           /* continue_final_message: the rendered prompt is cut right
                                      after the final message's content (as Hugging Face
                                      does), so the model continues that message */
    bool add_special;              /* add_special_tokens (default false): the tokenizer's own
                                      specials (BOS) added to the rendered text, as vLLM does */
};
/* Reads tools, chat_template_kwargs, documents, add_generation_prompt,
 * continue_final_message (both true: 400) and add_special_tokens from a chat request (or
 * a /tokenize with messages); null is the same as left out. Returns 0 or a negative code
 * with *e filled. */
int oai_chat_options(const struct cJSON *root, struct oai_chat_opts *o, struct api_error *e);

/* Renders messages with m's chat template and tokenizes the result the way the chat API
 * does (specials parsed; without add_special, BOS prepended only if the tokenizer always
 * adds one and the template did not write it). A kwarg named like a variable the server
 * sets (messages, bos_token, ...) is 400. With limit, a rendered text longer than
 * ctx->max_prompt_bytes is 400 context_length_exceeded before tokenizing. Returns 0 and
 * *ids (malloc'd) / *n, or a negative code with *e filled. */
int oai_encode_chat(const struct oai_ctx *ctx, const struct cJSON *messages, const struct oai_chat_opts *o,
                    bool limit, int32_t **ids, int *n, struct api_error *e);
/* Tokenizes plain text (specials not parsed; BOS per the tokenizer when add_special),
 * with limit as above. Returns 0 and *ids / *n, or a negative code with *e filled (param
 * names the field). */
int oai_encode_text(const struct oai_ctx *ctx, const char *text, size_t len, bool add_special,
                    bool limit, const char *param, int32_t **ids, int *n, struct api_error *e);

/* Reads the structured-output parameters of root (response_format, guided_json,
 * guided_regex, guided_choice, structured_outputs), refuses more than one, and compiles
 * the one given into r->grammar (oai_attach_grammar). 0 when there is none or it
 * compiled; else a negative code with *e filled (400 naming the parameter). In
 * openai_structured.c. */
int oai_parse_structured(const struct oai_ctx *ctx, const struct cJSON *root,
                         struct oai_request *r, struct api_error *e);

/* Error helpers shared by the request parsers. oai_bad: 400 invalid_request_error with
 * param (may be NULL) and a printf message, returns ERR_INVALID (`return oai_bad(...)`);
 * oai_nomem: out of memory, returns ERR_NOMEM. */
int oai_bad(struct api_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int oai_nomem(struct api_error *e);
/* The member key of obj, or NULL when absent or JSON null. */
const struct cJSON *oai_opt(const struct cJSON *obj, const char *key);

/* The generated tokens' logprobs as chat writes them (and the Responses API): [{"token",
 * "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...]}, ...] with up
 * to top_logprobs alternatives each. NULL on OOM. In openai_format.c. */
struct cJSON *oai_token_logprobs(const struct model *m, const struct req_logprob *lps, int n, int top_logprobs);

/* oai_parse_chat over a parsed body (root borrowed): the Responses API's rewritten
 * request (openai_responses.c). */
int oai_parse_chat_root(const struct oai_ctx *ctx, const struct cJSON *root, struct oai_request *out,
                        struct api_error *e);

/* Checks "model" (absent/null → served_names[0]); sets *name. 404 model_not_found. */
int oai_check_model(const struct oai_ctx *ctx, const struct cJSON *root, const char **name,
                    struct api_error *e);

/* openai_tools.c. Validates tools, tool_choice and parallel_tool_calls of a chat body and
 * sets r's tool fields (the format the output is parsed with, the call limit, the forced
 * calls' grammar). 400 naming the parameter for a malformed tool, a tool_choice naming a
 * function not in tools, "required" without tools, or "auto" with tools when the server
 * has no tool-call parser. Returns 0 or a negative code with *e filled. */
int oai_parse_tools(const struct oai_ctx *ctx, const struct cJSON *root, struct oai_request *r,
                    struct api_error *e);
/* Sets r's reasoning fields from ctx, the body root (chat_template_kwargs.enable_thinking
 * false: no split) and the rendered prompt r->prompt_ids (whether it ends inside
 * "<think>"). Call after the prompt is encoded. */
void oai_parse_reasoning(const struct oai_ctx *ctx, const struct cJSON *root,
                         struct oai_request *r);
/* A constrained answer (r->grammar) from a request with a reasoning split: the grammar
 * starts after the reasoning's end token "</think>" (rp.grammar_deferred), so the model
 * thinks freely and then answers under the grammar, as vLLM does. A vocabulary without
 * "</think>" as one token cannot say where thinking ends: the split is turned off and the
 * constrained output is all content. Call after oai_parse_structured. */
void oai_defer_grammar_for_reasoning(const struct oai_ctx *ctx, struct oai_request *r);
/* Checks the tool_calls of assistant messages (an array of {id, type "function",
 * function: {name, arguments}}) and returns in *copy the messages as m's template should
 * see them, or NULL when they can be used as they are:
 *   - content null or left out: "" (vLLM's rendering), or null on a message with tool
 *     calls when the template reads tool_calls (Hugging Face passes null there, and
 *     R1-Distill's template tests `content is none`);
 *   - a tool_calls that is null or [] dropped (the template's plain-message path);
 *   - when the template renders arguments with tojson, string arguments holding a JSON
 *     object parsed into that object (as Hugging Face and vLLM do).
 * Returns 0 or a negative code with *e filled. */
int oai_messages_for_template(const struct model *m, const struct cJSON *messages,
                              struct cJSON **copy, struct api_error *e);

#endif

/* openai.h — the OpenAI wire format: parsing and validating request bodies into engine
 * requests, and formatting responses, stream chunks and the small endpoints' bodies.
 * All JSON goes through cJSON. No HTTP here (api never includes libmicrohttpd) and no
 * engine state: these are pure functions over a read-only context, callable from any
 * thread at once.
 *
 * Parsing = validation: every rejected body gets an api_error (status 400 with the
 * offending parameter named in param and message, 404 model_not_found for an unknown
 * model, 400 context_length_exceeded when the prompt leaves no room). Unknown fields are
 * ignored. Strings must be valid UTF-8.
 */
#ifndef TESSERA_API_OPENAI_H
#define TESSERA_API_OPENAI_H

#include "api/error.h"
#include "api/reasoning.h"
#include "api/tool_parse.h"
#include "engine/engine.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct model;
struct cJSON;
struct grammar;
struct grammar_spec;
struct grammar_vocab;
struct resp_store;

#define OAI_MAX_N 16        /* most choices per prompt (n) */
#define OAI_MAX_PROMPTS 32  /* most prompts in one /v1/completions batch */
#define OAI_MAX_CHOICES 64  /* most choices of one request: prompts x n */

/* Sampling defaults for requests that leave a parameter out: the model's
 * generation_config.json, overridden by server flags; the glue fills this once. */
struct oai_defaults {
    struct sampler_params sp; /* temperature, top_p, top_k, min_p, repetition_penalty */
    int max_tokens;           /* <= 0: up to the context limit */
};

/* What the parser reads; everything borrowed and read-only. */
struct oai_ctx {
    const struct model *m;            /* tokenizer, chat template, bos/eos, vocab size */
    const char *const *served_names;  /* [n_served] accepted "model" values; [0] is the
                                         default when a request omits "model" */
    int n_served;
    int max_model_len;
    int max_logprobs;                 /* --max-logprobs: the most alternatives per token a request
                                         may ask for (0..SAMPLER_MAX_TOP_LOGPROBS) */
    size_t max_prompt_bytes;          /* a prompt text longer than this cannot fit in
                                         max_model_len tokens: refused before tokenizing
                                         (oai_max_prompt_bytes); 0: no such check */
    struct oai_defaults defaults;
    const struct grammar_vocab *gv;   /* the model's vocabulary for structured output
                                         (grammar_vocab_create once at start-up); NULL:
                                         structured output is refused (400) */
    enum tparse_format tool_format; /* --tool-call-parser, else the format the template
                                       shows (tparse_format_detect); TP_NONE: none, so
                                       tool_choice "auto" with tools is refused */
    enum rsn_kind reasoning;        /* --reasoning-parser; RSN_NONE: no split */
    bool priority_scheduling;       /* --scheduling-policy priority: requests may set
                                       "priority" (else a non-zero one is 400, as in vLLM) */
    struct resp_store *responses;   /* the Responses API's stored responses (thread-safe);
                                       NULL: none are kept (--response-store-mb 0) */
};

/* The longest text that might still tokenize to fewer than max_model_len tokens with m's
 * tokenizer: max_model_len × the longest token's bytes, times 4 for normalizers that
 * shrink text (NFC composition, replacements) and the BOS / template specials. Walks the
 * vocabulary once: call it at start-up. */
size_t oai_max_prompt_bytes(const struct model *m, int max_model_len);

/* OAI_RESPONSES: POST /v1/responses, parsed as the chat request it means (n is 1) and
 * answered in the Responses API's shapes (api/responses.h). */
enum oai_kind { OAI_CHAT = 0, OAI_COMPLETION, OAI_RESPONSES };

/* A parsed, validated request. Owns its arrays; free with oai_request_free. */
struct oai_request {
    enum oai_kind kind;
    const char *model;      /* the matching served name (points into ctx->served_names) */
    bool stream;
    bool include_usage;     /* stream_options.include_usage */
    bool continuous_usage;  /* stream_options.continuous_usage_stats (vLLM; with include_usage
                               only): every chunk carries its choice's usage so far */
    int n;                  /* choices, 1..OAI_MAX_N */
    bool seed_given;        /* rp.sp.seed came from the request (else random) */
    int top_logprobs;       /* chat: top_logprobs when logprobs is true; completions:
                               logprobs. -1 when logprobs are not requested */
    struct req_params rp;   /* engine parameters; rp.stops / rp.bias_ids / rp.bias point at
                               the arrays below */
    int32_t *prompt_ids;    /* [n_prompt] malloc'd: the rendered + tokenized prompt, or a
                               batch's prompts one after another */
    int n_prompt;           /* tokens of all prompts together */
    int truncate;           /* truncate_prompt_tokens: each prompt keeps its last this many
                               tokens (the echo shows what remains); 0: off */
    int n_prompts;          /* 1, or a /v1/completions batch (prompt: [...] of strings or of
                               id arrays): prompt k is prompt_ids[prompt_off[k], prompt_off[k + 1]) */
    int prompt_off[OAI_MAX_PROMPTS + 1];
    int prompt_logprobs;    /* vLLM's "prompt_logprobs": alternatives per prompt token (0..20), or
                               -1 when not asked */
    bool echo_on;           /* completions "echo" */
    bool echo_only;         /* completions "max_tokens": 0 with "echo": the answer is the prompt
                               alone (with its logprobs); one token is generated and dropped */
    char *echo[OAI_MAX_PROMPTS]; /* completions "echo": prompt k's text (malloc'd; as given, or
                               the ids decoded), put before each of its choices' text; all
                               NULL without echo */
    char *stop_strs[STOP_MAX_STRINGS];
    int32_t *allowed_ids;   /* [rp.n_allowed] allowed_token_ids (malloc'd) or NULL */
    int32_t *bad_words;     /* [rp.bad_words_len] bad_words as token sequences (malloc'd;
                               layout: sched_seq_params.bad_words) or NULL */
    int32_t *bias_ids;      /* [rp.n_bias] */
    float *bias_vals;
    char *cache_salt;       /* NULL or the malloc'd cache_salt; rp.cache_salt points here */
    struct grammar *grammar;/* NULL, or the structured-output grammar (one reference, owned;
                               rp.grammar points here; every choice shares it) */
    /* chat output parsing (oai_output_parser sets a choice's parser up from these) */
    enum tparse_format tool_format; /* TP_NONE: the output is not parsed for tool calls
                                       (no tools, or tool_choice "none") */
    int max_tool_calls;     /* 1 when parallel_tool_calls is false; 0: any number */
    bool tool_forced;       /* tool_choice "required" or a named function: the calls are
                               enforced by constrained decoding */
    char *tool_schema;      /* NULL or the malloc'd schema of the forced calls */
    enum rsn_kind reasoning;/* RSN_NONE: no reasoning split */
    bool reasoning_opened;  /* the rendered prompt ends inside "<think>" */
    char *resp_echo;        /* OAI_RESPONSES: the request fields the response object repeats
                               (instructions, tools, text, ..., store), one JSON object's text */
    char *resp_items;       /* OAI_RESPONSES to be stored: the conversation's items before
                               the response's output, a JSON array's text; NULL: not stored */
    bool resp_background;   /* OAI_RESPONSES with "background": true (then stored, not streamed) */
};

/* Parse a POST /v1/chat/completions (resp. /v1/completions) body of len bytes: validate,
 * render the chat template (chat), tokenize, check the context length. Chat parameters:
 * model, messages (string content or text parts; roles system/developer/user/assistant/
 * tool), stream, stream_options.include_usage, max_tokens / max_completion_tokens,
 * temperature, top_p, top_k, min_p, n, stop (string or list), seed, presence_penalty,
 * frequency_penalty, repetition_penalty, logprobs + top_logprobs, logit_bias, ignore_eos,
 * user, tools + tool_choice + parallel_tool_calls (openai_tools.c: validated, passed to the
 * template, the output parsed into tool_calls), chat_template_kwargs, add_generation_prompt,
 * skip_special_tokens, cache_salt. Completions: prompt (a string or [int] checked against
 * the vocabulary, or a batch of up to OAI_MAX_PROMPTS of those with prompts x n at most
 * OAI_MAX_CHOICES) instead of messages, logprobs as an integer 0..5, and echo (not
 * with logprobs: the prompt's logprobs are not computed).
 * Structured output (both endpoints): response_format ({"type": "text" | "json_object" |
 * "json_schema"}), vLLM's guided_json / guided_regex / guided_choice and structured_outputs
 * ({"json" | "regex" | "choice" | "json_object"}), at most one per request; compiled
 * here against ctx->gv into r->grammar (see oai_attach_grammar for the errors).
 * Parameters this server knows but does not implement are 400 naming them when a request
 * depends on them (guided_grammar, tool_choice "auto" with tools and no tool-call
 * parser, ...; the list is in docs/api.md); harmless ones (user, parallel_tool_calls,
 * store, metadata, ...) are accepted.
 * Returns 0 and fills *out, or a negative code with *e filled (out is then empty). */
int oai_parse_chat(const struct oai_ctx *ctx, const char *body, size_t len,
                   struct oai_request *out, struct api_error *e);
int oai_parse_completion(const struct oai_ctx *ctx, const char *body, size_t len,
                         struct oai_request *out, struct api_error *e);
/* Parse a POST /v1/responses body: the Responses API's fields are checked and rewritten
 * into the chat request they mean, which oai_parse_chat's checks then see (errors name
 * the Responses fields: input, max_output_tokens, text.format). out->kind is
 * OAI_RESPONSES. The rewrite and what is refused: openai_responses.c. */
int oai_parse_responses(const struct oai_ctx *ctx, const char *body, size_t len,
                        struct oai_request *out, struct api_error *e);
void oai_request_free(struct oai_request *r);

/* The choices of r: n per prompt. Choice i belongs to prompt i / n (OpenAI's order). */
static inline int oai_n_choices(const struct oai_request *r) { return r->n * r->n_prompts; }

/* Prompt k of r: its first id, and its length in *len. */
static inline const int32_t *oai_prompt(const struct oai_request *r, int k, int *len)
{
    *len = r->prompt_off[k + 1] - r->prompt_off[k];
    return r->prompt_ids + r->prompt_off[k];
}

/* Compiles spec against ctx->gv and makes it r's structured-output grammar (r owns the
 * reference; rp.grammar points at it), for callers that build a grammar themselves (tool
 * calls: tool_choice "required" or a named function). param names the request parameter
 * the grammar comes from, for errors. Errors (r unchanged, *e filled):
 *   400 invalid_request_error, param: r already has a grammar (two constraints), no
 *       vocabulary in ctx, or the compiler refused spec (ERR_INVALID / ERR_UNSUPPORTED /
 *       ERR_RANGE: its message, e.g. "unsupported JSON Schema keyword 'not'")
 *   500 server_error: out of memory
 * Any thread (compiling may take milliseconds: a worker, not the event loop). */
int oai_attach_grammar(const struct oai_ctx *ctx, struct oai_request *r,
                       const struct grammar_spec *spec, const char *param, struct api_error *e);
/* Starts the output parser of one choice of r (a chat request): its tool format, call
 * limit and reasoning split; emit receives the events (tool_parse.h). Returns 0 or
 * ERR_NOMEM. Any thread. */
int oai_output_parser(const struct oai_request *r, struct tparse *p, tparse_emit_fn emit,
                      void *ud);

/* The constrained-decoding grammar of tool_choice "required" (name NULL: any of tools)
 * or a named function: a JSON schema with one anyOf branch per allowed tool,
 * {"type":"object","properties":{"name":{"const":NAME},KEY:PARAMETERS},"required":["name",
 * KEY]} (KEY "parameters" for llama3_json, else "arguments"; PARAMETERS the tool's, or
 * {"type":"object"}), wrapped in fmt's call markup (hermes "<tool_call>\n" … "\n</tool_call>"
 * separated by "\n"; llama3_json separated by "; "; mistral "[TOOL_CALLS][" … "]"), at least
 * one call and at most one when parallel is false. tools must have been validated. Fills
 * *spec (borrowing *schema and static strings) and *schema (malloc'd; caller frees).
 * Returns 0, ERR_NOT_FOUND when name is not among tools, or ERR_NOMEM. */
int oai_tool_grammar_spec(const struct cJSON *tools, const char *name, enum tparse_format fmt,
                          bool parallel, struct grammar_spec *spec, char **schema);

/* Token counts for "usage". */
struct oai_usage {
    int prompt_tokens;
    int completion_tokens;
    int cached_tokens;      /* prompt_tokens_details.cached_tokens */
    int reasoning_tokens;   /* completion_tokens_details.reasoning_tokens */
    bool has_reasoning;     /* a reasoning parser ran: completion_tokens_details is sent */
};

/* The fixed parts of every chunk / response of one request. */
struct oai_meta {
    enum oai_kind kind;
    const char *id;         /* "chatcmpl-…" or "cmpl-…" */
    int64_t created;        /* unix seconds, the same on every chunk */
    const char *model;
};

/* A tool call of a chat message, or a delta of one in a chunk. */
struct oai_tool_call {
    int index;              /* the call's index in its choice */
    const char *id;         /* "call_…"; in a chunk: set in the call's first delta only
                               (with type and name), NULL in later ones */
    const char *name;       /* NUL-terminated; NULL when id is NULL */
    const char *args;       /* [args_len] JSON text of the arguments (a chunk: a fragment) */
    size_t args_len;
};

/* One piece of a choice: a text delta with its tokens' logprobs (lp may be NULL). */
struct oai_piece {
    int index;              /* choice index */
    const char *text;       /* [text_len] not NUL-terminated; may be empty */
    size_t text_len;
    const struct req_logprob *lp; /* [n_lp] logprobs of the tokens in this piece */
    int n_lp;
    int top_logprobs;       /* alternatives to list per token (<= lp->n_top) */
    const char *finish_reason; /* NULL, "stop", "length" */
    int text_offset;        /* completions logprobs: characters (code points) of this
                               choice's text sent before this piece; 0 for a whole text */
    /* completions echo with logprobs: the prompt's tokens come first in the logprobs */
    bool prompt_lp;         /* list prompt_first (logprob null) and plp before lp */
    int32_t prompt_first;   /* the prompt's first token */
    const struct req_logprob *plp; /* [n_plp] the prompt's other tokens */
    int n_plp;
    /* vLLM's prompt_logprobs field (completions: in the choice; chat: the response's, from
       piece 0): [null, {"id": {logprob, rank, decoded_token}, ...}, ...] over prompt_first
       and plp, each with the token and up to vllm_top alternatives */
    bool vllm_prompt;
    int vllm_top;
    /* chat only */
    const char *reasoning;  /* [reasoning_len] reasoning_content; NULL: none */
    size_t reasoning_len;
    const struct oai_tool_call *calls; /* [n_calls] tool_calls (message or delta) */
    int n_calls;
    bool content_null;      /* a whole message: "content": null when text_len is 0 */
    const struct oai_usage *usage; /* a chunk: "usage" so far (vLLM's continuous_usage_stats);
                                      NULL: none */
};

/* One SSE event "data: {json}\n\n" (malloc'd, *len set; caller frees). Chat chunks are
 * object "chat.completion.chunk" with choices[{index, delta, logprobs, finish_reason}];
 * delta carries "role":"assistant" when role is true, "content" when text_len > 0 or
 * role is true (""), "reasoning_content" when reasoning_len > 0, and "tool_calls":
 * [{index, id, type:"function", function:{name, arguments}}] (a call's first delta) or
 * [{index, function:{arguments}}] (later ones) when n_calls > 0. Completion chunks are "text_completion" with choices[{index, text,
 * logprobs, finish_reason}]. NULL on OOM. m is for token strings in logprobs. */
char *oai_chunk_sse(const struct model *m, const struct oai_meta *meta,
                    const struct oai_piece *p, bool role, size_t *len);
/* The usage chunk of include_usage: "choices": [] and "usage". */
char *oai_usage_chunk_sse(const struct oai_meta *meta, const struct oai_usage *u, size_t *len);
/* An error event inside a started stream: "data: {"error":{...}}\n\n". */
char *oai_error_sse(const struct api_error *e, size_t *len);
/* "data: [DONE]\n\n" is a constant: */
#define OAI_SSE_DONE "data: [DONE]\n\n"

/* A whole non-streaming response: object "chat.completion" with choices[{index, message:
 * {role, content, reasoning_content?, tool_calls?}, logprobs, finish_reason}] or "text_completion" with choices[{index,
 * text, logprobs, finish_reason}], and usage. pieces[i] is choice i's whole text. */
char *oai_response_json(const struct model *m, const struct oai_meta *meta,
                        const struct oai_piece *pieces, int n, const struct oai_usage *u,
                        size_t *len);

/* GET /v1/models: {"object":"list","data":[{id, object:"model", created, owned_by:
 * "tessera", root, max_model_len}, ...]} for every served name. */
char *oai_models_json(const char *const *names, int n, int64_t created, const char *root,
                      int max_model_len);
/* GET /v1/models/{name}: that one object (OpenAI's "retrieve model"). */
char *oai_model_json(const char *name, int64_t created, const char *root, int max_model_len);

/* POST /tokenize: {"prompt": "..."} or {"messages": [...], "add_generation_prompt"?},
 * optional "add_special_tokens" (default true for prompt) →
 * {"count", "max_model_len", "tokens": [...]}. POST /detokenize: {"tokens": [...]} →
 * {"prompt": "..."}. Return 0 and a malloc'd body, or a negative code and *e. */
int oai_tokenize(const struct oai_ctx *ctx, const char *body, size_t len, char **out,
                 struct api_error *e);
int oai_detokenize(const struct oai_ctx *ctx, const char *body, size_t len, char **out,
                   struct api_error *e);

/* Writes a fresh request id, prefix + 24 random hex/alnum chars, into buf. */
void oai_make_id(const char *prefix, char *buf, size_t cap);
/* Characters (code points; an invalid byte counts as the one U+FFFD it is sent as) in
 * s[0, len): the running total a streaming caller keeps for oai_piece.text_offset. */
size_t oai_utf8_chars(const char *s, size_t len);
/* The finish_reason string for f ("stop", "length", "abort", "error"), NULL while running.
 * A chat choice that made tool calls and stopped reports "tool_calls" instead of "stop"
 * (the caller substitutes it). */
const char *oai_finish_reason(enum req_finish f);

#endif

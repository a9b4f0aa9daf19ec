/* responses.h — the output of POST /v1/responses (OpenAI's Responses API): the response
 * object and, for a stream, its typed events.
 *
 * A response's output is a list of items, in the order the model starts them:
 *   {"type": "reasoning", "id": "rs_…", "summary": [], "content": [{"type": "reasoning_text",
 *    "text"}]}                                       (with a reasoning parser)
 *   {"type": "message", "id": "msg_…", "role": "assistant", "status", "content":
 *    [{"type": "output_text", "text", "annotations": [], "logprobs": [...]}]}
 *   {"type": "function_call", "id": "fc_…", "call_id": "call_…", "name", "arguments",
 *    "status"}                                       (tool calls)
 * struct resp_out collects them from the chat output parser's events (api/tool_parse.h;
 * plain text is content). Streaming, every change is also an SSE event
 * "event: TYPE\ndata: {"type": TYPE, "sequence_number": N, ...}\n\n" handed to a sink:
 *   response.created, response.in_progress                      (resp_out_start)
 *   response.output_item.added                                  (an item starts)
 *   response.content_part.added                                 (message, reasoning)
 *   response.output_text.delta | response.reasoning_text.delta |
 *   response.function_call_arguments.delta                      (text)
 *   …text.done / …arguments.done, response.content_part.done,
 *   response.output_item.done                                   (the item ends: another
 *                                                                 starts, or the finish)
 *   response.completed | response.incomplete | response.failed  (resp_out_finish)
 * No "data: [DONE]" follows (OpenAI's Responses streams end with the last event).
 * Pure formatting: no engine, no HTTP; one resp_out per response, used by one thread at
 * a time.
 */
#ifndef TESSERA_API_RESPONSES_H
#define TESSERA_API_RESPONSES_H

#include "api/error.h"
#include "api/openai.h"
#include "api/tool_parse.h"
#include "engine/engine.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum resp_item_kind { RESP_REASONING = 0, RESP_MESSAGE, RESP_CALL };

struct resp_item {
    enum resp_item_kind kind;
    char id[40];        /* "rs_…", "msg_…" or "fc_…" */
    char *call_id;      /* RESP_CALL: the parser's "call_…" (malloc'd) */
    char *name;         /* RESP_CALL: the function's name (malloc'd) */
    char *text;         /* [len] reasoning text, message text or the call's arguments */
    size_t len, cap;
    struct req_logprob *lp; /* RESP_MESSAGE with logprobs: its tokens' (n_lp, lp_cap) */
    int n_lp, lp_cap;
};

/* How a response ended (RESP_CANCELLED: a background response cancelled), or where it is
 * (RESP_QUEUED, RESP_IN_PROGRESS: no output or usage yet in its object). */
enum resp_status { RESP_COMPLETED = 0, RESP_INCOMPLETE, RESP_FAILED, RESP_CANCELLED, RESP_QUEUED, RESP_IN_PROGRESS };

/* "completed", "incomplete", "failed", "cancelled", "queued" or "in_progress". */
const char *resp_status_name(enum resp_status st);

/* The fixed parts of one response (borrowed). */
struct resp_meta {
    const char *id;     /* "resp_…" */
    int64_t created_at; /* unix seconds */
    const char *model;
    const char *echo;   /* oai_request.resp_echo: the request fields the object repeats */
    const struct model *m; /* token strings of logprobs */
    int top_logprobs;   /* alternatives per token; -1: no logprobs */
};

/* Receives one malloc'd SSE event (it frees it; NULL when formatting ran out of memory). */
typedef void (*resp_sink_fn)(void *ud, char *event);

struct resp_out {
    const struct resp_meta *meta;
    resp_sink_fn sink;  /* streaming; NULL: the items are only collected */
    void *ud;
    struct resp_item *items;
    int n, cap;
    bool open;          /* items[n - 1] may still grow */
    int seq;            /* the next event's sequence_number */
    const struct req_logprob *take_lp; /* logprobs of the take being fed, not yet placed */
    int take_n;
};

void resp_out_init(struct resp_out *o, const struct resp_meta *meta, resp_sink_fn sink, void *ud);
void resp_out_free(struct resp_out *o);

/* Streaming: response.created and response.in_progress. */
void resp_out_start(struct resp_out *o);
/* One output parser event (a tparse_emit_fn with ud = the resp_out): text joins the open
 * item of its kind, or ends the open item and starts one. Returns 0 or ERR_NOMEM. */
int resp_out_event(void *ud, const struct tparse_event *ev);
/* Plain output text (no parser): a content event. */
int resp_out_text(struct resp_out *o, const char *text, size_t len);
/* Logprobs (meta->top_logprobs >= 0). resp_out_take_begin: the logprobs of the take about
 * to be fed; they go with the first message text it makes (streaming: on that
 * output_text delta), and the message's output_text lists every token's. resp_out_take_end:
 * with all_content (no parser: every token is message text) logprobs still unplaced go
 * to the message anyway (streaming: on an empty delta), so the list holds every generated
 * token, as chat's does; otherwise (the take made only reasoning or call text) they are
 * dropped. Returns 0 or ERR_NOMEM. */
void resp_out_take_begin(struct resp_out *o, const struct req_logprob *lp, int n);
int resp_out_take_end(struct resp_out *o, bool all_content);
/* Streaming: ends the open item and sends the last event (status RESP_COMPLETED:
 * response.completed; RESP_INCOMPLETE: response.incomplete with incomplete_details
 * {"reason": "max_output_tokens"}; RESP_FAILED: response.failed with err; no other
 * status). u: the usage. */
void resp_out_finish(struct resp_out *o, enum resp_status st, const struct oai_usage *u,
                     const struct api_error *err);
/* The whole response object ("object": "response") with the items so far as its output
 * (none while RESP_QUEUED / RESP_IN_PROGRESS; RESP_CANCELLED: the last item
 * "incomplete"); malloc'd JSON text, *len set; NULL on OOM. */
char *resp_out_json(const struct resp_out *o, enum resp_status st, const struct oai_usage *u,
                    const struct api_error *err, size_t *len);

#endif

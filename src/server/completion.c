/* completion.c — POST /v1/chat/completions, /v1/completions and /v1/responses: one HTTP
 * request becomes a job of n engine requests (one per choice), streamed back as SSE or
 * answered as one JSON body. A Responses job is a chat job of one choice whose output
 * goes through api/responses.h (output items, typed events) instead of chat chunks.
 *
 * Threads. The handler runs on an HTTP thread and does nothing that takes time: it defers
 * the reply (not yet streaming), takes the body and queues the job on the server's worker
 * pool (server_work). A worker parses the body (api/: JSON, chat template, tokenizer),
 * answers an error status if it is bad, else submits the n requests and — for a stream —
 * turns the reply into a stream, all under the job's mutex, so an engine notify for this
 * job waits until the job is fully set up. Notifies run on the scheduler thread: each
 * takes its choice's new output (request_take), formats the SSE chunks (streaming) or
 * accumulates the text (non-streaming), and the last choice to finish ends the reply. A
 * client disconnect (or a stream whose client reads too slowly for its queue) arrives as
 * on_close from an HTTP thread: it only calls request_abort on the choices submitted so
 * far, never takes the job's mutex (a notify holds the job's mutex while it ends the
 * reply, which waits for a running on_close).
 *
 * Chat output parsing. A chat choice whose request asked for tool calls or reasoning runs
 * its output through its own output parser (api/tool_parse.h), on the notify's thread:
 * the parser's events become content, reasoning_content and tool_calls deltas (a take's
 * logprobs ride on its first chunk, or on an empty delta when all its text is held back),
 * or the parts of the whole message. A take's tokens count as reasoning tokens when the
 * parser was inside the reasoning before or after it.
 *
 * Background responses (/v1/responses with "background": true). Once its choice is
 * submitted, the job stores its "queued" object, registers with the server's background
 * registry (server/background.h: cancel and delete find it there) and answers that object
 * at once; the reply is gone from then on (j->reply NULL). Its first output stores an
 * "in_progress" snapshot, and its end stores the final object through the registry, which
 * also answers any cancel waiting for it; the usage is charged to the API key through
 * the meter taken before the reply went.
 *
 * Lifetime. The job is refcounted: one reference for the worker's task, one per
 * submitted choice, dropped at that choice's final notify. The engine requests are
 * released only when the job is freed, so on_close can abort them for as long as the
 * reply is open (and the background registry for as long as the job is registered: it
 * leaves the registry at its end, before its last reference goes).
 */
#include "api/response_store.h"
#include "api/responses.h"
#include "server/background.h"
#include "server/server_internal.h"
#include "util/err.h"
#include "util/grow.h"
#include "util/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct job;

/* A tool call collected for a non-streamed message: offsets into choice.calls_text,
 * which holds "id\0name\0" followed by the arguments. */
struct call_rec {
    size_t id, name, args, args_len;
};

/* One choice: one engine request and what has come out of it. */
struct choice {
    struct job *job;
    int index;
    struct request *rq;          /* one reference, released in job_free */
    struct req_output out;       /* take buffer, reused */
    bool done;
    enum req_finish finish;
    int n_generated, n_cached;
    double ttft;
    int text_chars;              /* characters streamed so far (completions text_offset) */
    /* non-streaming: the whole text and logprobs so far */
    char *text;
    size_t text_len, text_cap;
    struct req_logprob *lp;
    int n_lp, lp_cap;
    /* completions echo with logprobs: the prompt's logprobs (from its second token) */
    struct req_logprob *plp;
    int n_plp, plp_cap;
    bool echo_sent;              /* streaming: the prompt's chunk went out */
    /* chat output parsing (parsing: the request asked for tool calls or reasoning) */
    bool parsing;
    struct tparse parser;
    int n_calls;                 /* tool calls so far */
    int n_reasoning;             /* generated tokens counted as reasoning */
    const struct req_output *take; /* streaming: the take being parsed ... */
    bool take_lp_sent;           /* ... and whether its logprobs went out with a chunk */
    char *reasoning;             /* non-streaming: reasoning text and calls so far */
    size_t reasoning_len, reasoning_cap;
    struct call_rec *calls;
    size_t calls_cap;
    char *calls_text;
    size_t calls_text_len, calls_text_cap;
    struct resp_out resp;        /* /v1/responses: the output items (streaming: their events) */
};

struct job {
    struct server *s;
    enum oai_kind kind;
    char *body;                  /* [body_len] taken from the request, freed once parsed */
    size_t body_len;
    struct oai_request req;
    struct oai_meta meta;
    struct resp_meta rmeta;      /* /v1/responses */
    char id[64];
    uint64_t req_id;             /* the HTTP request's id, for logs (the reply may be gone) */
    pthread_mutex_t mu;          /* guards everything below and the choices */
    int refs;
    struct http_reply *reply;    /* deferred by the handler */
    atomic_int n_submitted;      /* ch[0, n) have their engine request (for on_close) */
    atomic_bool gone;            /* on_close ran: abort what gets submitted */
    bool failed;                 /* setup failed: notifies only drop their references */
    int n_done;
    struct api_error error;      /* the first engine error or abort, if any */
    bool has_error;
    bool background;             /* a background response, answered at submission */
    atomic_bool detached;        /* background: on_close no longer aborts it */
    bool bg_started;             /* background: its "in_progress" snapshot is stored */
    struct http_meter *meter;    /* background: charges its usage to the request's API key */
    struct choice ch[OAI_MAX_CHOICES]; /* [oai_n_choices(&req)] */
};

static void job_free(struct job *j)
{
    free(j->body);
    for (int i = 0; i < OAI_MAX_CHOICES; i++) {
        struct choice *c = &j->ch[i];
        if (c->rq) request_release(c->rq);
        req_output_free(&c->out);
        free(c->text);
        free(c->lp);
        free(c->plp);
        if (c->parsing) tparse_free(&c->parser);
        free(c->reasoning);
        free(c->calls);
        free(c->calls_text);
        resp_out_free(&c->resp);
    }
    oai_request_free(&j->req);
    http_meter_free(j->meter);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

/* Drops one reference; the caller holds j->mu, which this releases. */
static void job_unref_unlock(struct job *j)
{
    bool last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (last) job_free(j);
}

/* Appends s[0, len) to a growing text; false on OOM. */
static bool append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (!grow_array((void **)buf, cap, *len + n + 1, 1)) return false;
    if (n > 0) memcpy(*buf + *len, s, n);
    *len += n;
    return true;
}

/* Non-streaming: the output parser's events build the message's parts. */
static int collect_event(void *ud, const struct tparse_event *ev)
{
    struct choice *c = ud;
    bool ok = true;
    switch (ev->kind) {
    case TP_EV_CONTENT:
        ok = append(&c->text, &c->text_len, &c->text_cap, ev->text, ev->len);
        break;
    case TP_EV_REASONING:
        ok = append(&c->reasoning, &c->reasoning_len, &c->reasoning_cap, ev->text, ev->len);
        break;
    case TP_EV_TOOL_START: {
        if (!grow_array((void **)&c->calls, &c->calls_cap, (size_t)c->n_calls + 1, sizeof *c->calls))
            return ERR_NOMEM;
        struct call_rec *r = &c->calls[c->n_calls];
        r->id = c->calls_text_len;
        ok = append(&c->calls_text, &c->calls_text_len, &c->calls_text_cap, ev->id, strlen(ev->id) + 1);
        r->name = c->calls_text_len;
        ok = ok && append(&c->calls_text, &c->calls_text_len, &c->calls_text_cap, ev->name,
                          strlen(ev->name) + 1);
        r->args = c->calls_text_len;
        r->args_len = 0;
        c->n_calls++;
        break;
    }
    case TP_EV_TOOL_ARGS:
        ok = append(&c->calls_text, &c->calls_text_len, &c->calls_text_cap, ev->text, ev->len);
        c->calls[c->n_calls - 1].args_len += ev->len;
        break;
    }
    return ok ? 0 : ERR_NOMEM;
}

/* Counts the take's tokens as reasoning when the parser was inside the reasoning before
 * or after it, and feeds it (and, at the finish, the end) to the parser. */
static int parse_take(struct choice *c, const struct req_output *o)
{
    bool in = tparse_in_reasoning(&c->parser);
    int rc = tparse_feed(&c->parser, o->text, o->text_len);
    if (in || tparse_in_reasoning(&c->parser)) c->n_reasoning += o->n_ids;
    if (!rc && o->finish != REQ_FINISH_NONE) rc = tparse_finish(&c->parser);
    return rc;
}

/* Appends the take's prompt logprobs to the choice's; false on OOM. */
static bool keep_prompt_logprobs(struct choice *c, const struct req_output *o)
{
    size_t cap = (size_t)c->plp_cap;
    if (!grow_array((void **)&c->plp, &cap, (size_t)(c->n_plp + o->n_plp), sizeof *c->plp)) return false;
    c->plp_cap = (int)cap;
    if (o->n_plp > 0) memcpy(c->plp + c->n_plp, o->plp, sizeof *o->plp * (size_t)o->n_plp);
    c->n_plp += o->n_plp;
    return true;
}

/* A choice that has failed on its own (out of memory): the job answers with an error. */
static void fail_choice(struct job *j, struct choice *c, const char *why)
{
    if (!j->has_error) api_error_from_code(&j->error, ERR_NOMEM, NULL, NULL, why);
    j->has_error = true;
    request_abort(c->rq);
}

/* Non-streaming: appends the taken output to the choice's totals (max_tokens 0 with echo:
 * the prompt's logprobs only, the generated token is dropped). */
static void collect(struct job *j, struct choice *c)
{
    const struct req_output *o = &c->out;
    if (!keep_prompt_logprobs(c, o)) {
        fail_choice(j, c, "out of memory collecting output");
        return;
    }
    if (j->req.echo_only) return;
    size_t lp_cap = (size_t)c->lp_cap;
    bool ok = grow_array((void **)&c->lp, &lp_cap, (size_t)(c->n_lp + o->n_lp), sizeof *c->lp);
    if (ok) {
        c->lp_cap = (int)lp_cap;
        if (c->parsing) ok = parse_take(c, o) == 0;
        else ok = append(&c->text, &c->text_len, &c->text_cap, o->text, o->text_len);
    }
    if (!ok) {
        fail_choice(j, c, "out of memory collecting output");
        return;
    }
    if (o->n_lp > 0) memcpy(c->lp + c->n_lp, o->lp, sizeof *o->lp * (size_t)o->n_lp);
    c->n_lp += o->n_lp;
}

/* Aborts every choice submitted so far (client gone, queue over its bound). Idempotent;
 * takes no lock of the job. */
static void abort_choices(struct job *j)
{
    int n = atomic_load(&j->n_submitted);
    for (int i = 0; i < n; i++) request_abort(j->ch[i].rq);
}

/* Writes one formatted SSE event (NUL-terminated JSON text: the formatter escapes NUL)
 * and frees it; NULL (out of memory) is skipped. A failed write means the client is gone
 * or reads too slowly for the stream queue's bound: the choices are aborted now rather
 * than at the HTTP layer's on_close, so their KV blocks are freed at the next step. */
static void write_sse(struct job *j, char *ev)
{
    if (ev && !http_reply_write(j->reply, ev, strlen(ev))) abort_choices(j);
    free(ev);
}

/* Streaming: one choice's chunk; with vLLM's continuous_usage_stats it carries that
 * choice's usage so far (its prompt, the tokens generated until now). */
static void write_chunk(struct job *j, struct oai_piece *p, bool role)
{
    const struct choice *c = &j->ch[p->index];
    struct oai_usage u;
    if (j->req.continuous_usage) {
        int plen;
        oai_prompt(&j->req, p->index / j->req.n, &plen);
        u = (struct oai_usage){ .prompt_tokens = plen, .completion_tokens = c->n_generated,
                                .cached_tokens = c->n_cached, .reasoning_tokens = c->n_reasoning,
                                .has_reasoning = j->req.reasoning != RSN_NONE };
        p->usage = &u;
    }
    size_t len;
    write_sse(j, oai_chunk_sse(j->s->m, &j->meta, p, role, &len));
}

/* The finish_reason of a choice that ended with f: "tool_calls" for a chat choice that
 * made calls and stopped; "length" for max_tokens 0 (echo). */
static const char *finish_reason_of(const struct choice *c, enum req_finish f)
{
    if (c->job->req.echo_only && (f == REQ_FINISH_STOP || f == REQ_FINISH_LENGTH)) return "length";
    return c->n_calls > 0 && f == REQ_FINISH_STOP ? "tool_calls" : oai_finish_reason(f);
}

/* echo with logprobs: the logprobs list the prompt's tokens first */
static bool echo_logprobs(const struct oai_request *r) { return r->echo_on && r->top_logprobs >= 0; }

/* The prompt part of choice c's piece (echo with logprobs). */
static void piece_prompt(const struct job *j, const struct choice *c, struct oai_piece *p)
{
    int len;
    p->prompt_lp = true;
    p->prompt_first = oai_prompt(&j->req, c->index / j->req.n, &len)[0];
    p->plp = c->plp;
    p->n_plp = c->n_plp;
    p->top_logprobs = j->req.top_logprobs;
}

/* Streaming: one output parser event becomes one chunk; the take's logprobs ride on the
 * first chunk it makes. */
static int stream_event(void *ud, const struct tparse_event *ev)
{
    struct choice *c = ud;
    struct job *j = c->job;
    struct oai_piece p = { .index = c->index };
    struct oai_tool_call call = { .index = ev->index };
    switch (ev->kind) {
    case TP_EV_CONTENT:
        p.text = ev->text;
        p.text_len = ev->len;
        break;
    case TP_EV_REASONING:
        p.reasoning = ev->text;
        p.reasoning_len = ev->len;
        break;
    case TP_EV_TOOL_START:
        call.id = ev->id;
        call.name = ev->name;
        c->n_calls++;
        p.calls = &call;
        p.n_calls = 1;
        break;
    case TP_EV_TOOL_ARGS:
        call.args = ev->text;
        call.args_len = ev->len;
        p.calls = &call;
        p.n_calls = 1;
        break;
    }
    if (c->take && !c->take_lp_sent && c->take->n_lp > 0) {
        p.lp = c->take->lp;
        p.n_lp = c->take->n_lp;
        p.top_logprobs = j->req.top_logprobs;
        c->take_lp_sent = true;
    }
    write_chunk(j, &p, false);
    return 0;
}

/* Streaming, echo with logprobs: the prompt's chunk, once its logprobs are all in (they
 * come before the first generated token). False while they are still coming. */
static bool stream_echo(struct job *j, struct choice *c)
{
    const struct req_output *o = &c->out;
    if (c->echo_sent) return true;
    if (!keep_prompt_logprobs(c, o)) {
        fail_choice(j, c, "out of memory collecting output");
        return false;
    }
    if (o->n_ids == 0 && o->finish != REQ_FINISH_STOP && o->finish != REQ_FINISH_LENGTH) return false;
    const char *t = j->req.echo[c->index / j->req.n];
    struct oai_piece p = { .index = c->index, .text = t, .text_len = strlen(t) };
    piece_prompt(j, c, &p);
    write_chunk(j, &p, false);
    c->text_chars += (int)oai_utf8_chars(t, p.text_len);
    c->echo_sent = true;
    return true;
}

/* Streaming: the taken text (and logprobs) as chunks. */
static void stream_text(struct job *j, struct choice *c)
{
    const struct req_output *o = &c->out;
    if (c->parsing) {
        c->take = o;
        c->take_lp_sent = false;
        int rc = parse_take(c, o);
        if (rc && !j->has_error) {
            api_error_from_code(&j->error, rc, NULL, NULL, "out of memory parsing the output");
            j->has_error = true;
            request_abort(c->rq);
        }
        if (!c->take_lp_sent && o->n_lp > 0) { /* all of its text is held back: an empty delta */
            struct oai_piece p = { .index = c->index, .lp = o->lp, .n_lp = o->n_lp,
                                   .top_logprobs = j->req.top_logprobs };
            write_chunk(j, &p, false);
        }
        c->take = NULL;
    } else if (o->text_len > 0 || o->n_lp > 0) {
        struct oai_piece p = { .index = c->index, .text = o->text, .text_len = o->text_len,
                               .lp = o->lp, .n_lp = o->n_lp,
                               .top_logprobs = j->req.top_logprobs,
                               .text_offset = c->text_chars };
        write_chunk(j, &p, false);
        c->text_chars += (int)oai_utf8_chars(o->text, o->text_len);
    }
}

/* Streaming: turns the taken output into chunks (max_tokens 0 with echo: nothing of the
 * generated token). */
static void stream_out(struct job *j, struct choice *c)
{
    const struct req_output *o = &c->out;
    if (echo_logprobs(&j->req) && !stream_echo(j, c)) return;
    if (!j->req.echo_only) stream_text(j, c);
    const char *fr = o->finish == REQ_FINISH_STOP || o->finish == REQ_FINISH_LENGTH
                         ? finish_reason_of(c, o->finish) : NULL;
    if (fr) {
        struct oai_piece p = { .index = c->index, .finish_reason = fr };
        write_chunk(j, &p, false);
    }
}

/* A prompt counts once however many choices share it (OpenAI; a batch's prompts each
 * once), so its cached part is what was cached for every one of its choices: the least any
 * of them got from the prefix cache at its first admission (choices admitted together each
 * compute the prompt: 0). */
static void usage_of(const struct job *j, struct oai_usage *u, double *ttft)
{
    const struct oai_request *r = &j->req;
    *u = (struct oai_usage){ .prompt_tokens = r->n_prompt, .has_reasoning = r->reasoning != RSN_NONE };
    *ttft = -1;
    for (int k = 0; k < r->n_prompts; k++) {
        int cached = j->ch[k * r->n].n_cached;
        for (int i = k * r->n; i < (k + 1) * r->n; i++) {
            const struct choice *c = &j->ch[i];
            u->completion_tokens += c->n_generated;
            u->reasoning_tokens += c->n_reasoning;
            if (c->n_cached < cached) cached = c->n_cached;
            if (c->ttft >= 0 && (*ttft < 0 || c->ttft < *ttft)) *ttft = c->ttft;
        }
        u->cached_tokens += cached;
    }
}

/* /v1/responses streaming: an event from api/responses.c */
static void resp_sink(void *ud, char *ev)
{
    struct job *j = ud;
    if (!j->background) {
        write_sse(j, ev);
        return;
    }
    if (ev && bg_event(j->s->bg, j->id, ev, strlen(ev))) /* its followers had it; a resumed stream will not */
        LOG_WARN("server", "req-%llu: background response %s: an event not kept (out of memory)",
                 (unsigned long long)j->req_id, j->id);
    free(ev);
}

/* /v1/responses: the taken text into the output items (streaming: their events). */
static void respond_out(struct job *j, struct choice *c)
{
    const struct req_output *o = &c->out;
    resp_out_take_begin(&c->resp, o->lp, o->n_lp);
    int rc = c->parsing ? parse_take(c, o) : resp_out_text(&c->resp, o->text, o->text_len);
    if (!rc) rc = resp_out_take_end(&c->resp, !c->parsing);
    if (rc) fail_choice(j, c, "out of memory formatting the output");
}

/* How a Responses job ended. */
static enum resp_status resp_status_of(const struct job *j)
{
    if (j->has_error) return RESP_FAILED;
    return j->ch[0].finish == REQ_FINISH_LENGTH ? RESP_INCOMPLETE : RESP_COMPLETED;
}

/* The whole chat / completions response body (malloc'd), or NULL on OOM. */
static char *chat_response_body(const struct job *j, const struct oai_usage *u, size_t *len)
{
    struct oai_piece pieces[OAI_MAX_CHOICES];
    struct oai_tool_call *calls[OAI_MAX_CHOICES] = { 0 };
    bool ok = true;
    for (int i = 0; i < oai_n_choices(&j->req); i++) {
        const struct choice *c = &j->ch[i];
        if (c->n_calls > 0 && !(calls[i] = calloc((size_t)c->n_calls, sizeof *calls[i]))) ok = false;
        for (int k = 0; calls[i] && k < c->n_calls; k++) {
            const struct call_rec *r = &c->calls[k];
            calls[i][k] = (struct oai_tool_call){ .index = k, .id = c->calls_text + r->id,
                                                  .name = c->calls_text + r->name,
                                                  .args = c->calls_text + r->args,
                                                  .args_len = r->args_len };
        }
        pieces[i] = (struct oai_piece){ .index = i, .text = c->text ? c->text : "",
                                        .text_len = c->text_len, .lp = c->lp,
                                        .n_lp = c->n_lp, .top_logprobs = j->req.top_logprobs,
                                        .finish_reason = finish_reason_of(c, c->finish),
                                        .reasoning = c->reasoning_len > 0 ? c->reasoning : NULL,
                                        .reasoning_len = c->reasoning_len,
                                        .calls = calls[i], .n_calls = c->n_calls,
                                        .content_null = c->n_calls > 0 || c->reasoning_len > 0 };
        if (echo_logprobs(&j->req)) piece_prompt(j, c, &pieces[i]);
        if (j->req.prompt_logprobs >= 0) { /* vLLM's prompt_logprobs field */
            int plen;
            pieces[i].prompt_first = oai_prompt(&j->req, c->index / j->req.n, &plen)[0];
            pieces[i].plp = c->plp;
            pieces[i].n_plp = c->n_plp;
            pieces[i].vllm_prompt = true;
            pieces[i].vllm_top = j->req.prompt_logprobs;
        }
    }
    char *body = ok ? oai_response_json(j->s->m, &j->meta, pieces, oai_n_choices(&j->req), u, len) : NULL;
    for (int i = 0; i < oai_n_choices(&j->req); i++) free(calls[i]);
    return body;
}

/* /v1/responses with store: keeps the finished response object (as a GET will return
 * it) with its conversation's items. Runs before the client sees the end, so that a
 * request continuing from it right after finds it. */
static void keep_response(struct job *j, const struct oai_usage *u)
{
    size_t len;
    char *obj = resp_out_json(&j->ch[0].resp, resp_status_of(j), u, &j->error, &len);
    int rc = obj ? resp_store_put(j->s->ctx.responses, j->id, obj, j->req.resp_items) : ERR_NOMEM;
    if (rc)
        LOG_WARN("server", "req-%llu: response %s not stored: %s", (unsigned long long)j->req_id, j->id,
                 rc == ERR_RANGE ? "larger than --response-store-mb" : "out of memory");
    free(obj);
}

/* A background job's final object, for bg_end. */
struct bg_final {
    struct job *j;
    const struct oai_usage *u;
    enum resp_status st;         /* set by final_object */
};

static char *final_object(void *ud, bool cancelled)
{
    struct bg_final *f = ud;
    f->st = cancelled ? RESP_CANCELLED : resp_status_of(f->j);
    return resp_out_json(&f->j->ch[0].resp, f->st, f->u, &f->j->error, NULL);
}

/* A background job is over: its final object goes to the store, then (streamed) its last
 * event to the followers, whose streams end, and to the cancels waiting for it; its usage
 * to the API key. A cancelled stream ends without a last event (the API has none for it:
 * GET tells the status). */
static void end_detached(struct job *j, const struct oai_usage *u)
{
    struct bg_final f = { .j = j, .u = u, .st = RESP_FAILED };
    int rc = bg_finish(j->s->bg, j->id, final_object, &f, j->req.resp_items);
    if (j->req.stream && f.st != RESP_CANCELLED) resp_out_finish(&j->ch[0].resp, f.st, u, &j->error);
    bg_end(j->s->bg, j->id);
    http_meter_charge(j->meter, u->prompt_tokens, u->completion_tokens);
    LOG_INFO("server", "req-%llu: background response %s %s: %d prompt + %d completion tokens%s",
             (unsigned long long)j->req_id, j->id, resp_status_name(f.st), u->prompt_tokens, u->completion_tokens,
             !rc ? "" : rc == ERR_RANGE ? " (not stored: larger than --response-store-mb)"
                                   : " (not stored: out of memory)");
}

/* All choices are done: the end of the stream, or the whole response. */
static void finish_job(struct job *j)
{
    struct oai_usage u;
    double ttft;
    usage_of(j, &u, &ttft);
    if (j->background) {
        end_detached(j, &u);
        return;
    }
    http_reply_set_usage(j->reply, u.prompt_tokens, u.completion_tokens, ttft);
    size_t len;
    if (j->kind == OAI_RESPONSES && j->req.resp_items) keep_response(j, &u);
    if (j->kind == OAI_RESPONSES && j->req.stream) { /* no "data: [DONE]" in this API */
        resp_out_finish(&j->ch[0].resp, resp_status_of(j), &u, &j->error);
        http_reply_end(j->reply);
        return;
    }
    if (j->req.stream) {
        if (j->has_error) write_sse(j, oai_error_sse(&j->error, &len));
        else if (j->req.include_usage)
            write_sse(j, oai_usage_chunk_sse(&j->meta, &u, &len));
        http_reply_write(j->reply, OAI_SSE_DONE, strlen(OAI_SSE_DONE));
        http_reply_end(j->reply);
        return;
    }
    if (!j->has_error) {
        char *body = j->kind == OAI_RESPONSES ? resp_out_json(&j->ch[0].resp, resp_status_of(j), &u, NULL, &len)
                                        : chat_response_body(j, &u, &len);
        if (body) {
            http_reply_send(j->reply, 200, "application/json", body, len, NULL);
            free(body);
            return;
        }
        api_error_from_code(&j->error, ERR_NOMEM, NULL, NULL, "out of memory formatting the response");
    }
    server_reply_api_error(j->reply, &j->error);
}

/* Engine notify for one choice (scheduler thread). */
static void on_notify(void *ud)
{
    struct choice *c = ud;
    struct job *j = c->job;
    pthread_mutex_lock(&j->mu);
    if (c->done) { /* no notify follows the final one; be safe anyway */
        pthread_mutex_unlock(&j->mu);
        return;
    }
    request_take(c->rq, &c->out);
    c->n_generated = j->req.echo_only ? 0 : c->out.n_generated;
    c->n_cached = c->out.n_cached;
    c->ttft = c->out.t_first_token;
    if (j->background && !j->bg_started && c->out.finish == REQ_FINISH_NONE) { /* it has started */
        j->bg_started = true;
        char *obj = resp_out_json(&c->resp, RESP_IN_PROGRESS, NULL, NULL, NULL);
        if (obj) bg_update(j->s->bg, j->id, obj, j->req.resp_items);
        free(obj);
    }
    if (!j->failed) {
        if (j->kind == OAI_RESPONSES) respond_out(j, c);
        else if (j->req.stream) stream_out(j, c);
        else collect(j, c);
    }
    if (c->out.finish == REQ_FINISH_NONE) {
        pthread_mutex_unlock(&j->mu);
        return;
    }
    c->done = true;
    c->finish = c->out.finish;
    if (!j->has_error && (c->finish == REQ_FINISH_ERROR || c->finish == REQ_FINISH_ABORT)) {
        j->has_error = true;
        if (c->finish == REQ_FINISH_ERROR && c->out.request_error)
            api_error_set(&j->error, 400, API_ERR_INVALID_REQUEST, NULL, NULL, "%s", c->out.error);
        else if (c->finish == REQ_FINISH_ERROR)
            api_error_set(&j->error, 500, API_ERR_SERVER, NULL, NULL, "%s", c->out.error);
        else
            api_error_set(&j->error, 503, API_ERR_OVERLOADED, NULL, NULL,
                          "the request was aborted (client disconnect or server shutdown)");
    }
    if (++j->n_done == oai_n_choices(&j->req) && !j->failed) {
        finish_job(j);
        LOG_DEBUG("server", "req-%llu done", (unsigned long long)j->req_id);
    }
    job_unref_unlock(j);
}

/* HTTP on_close: the client went away. Must not take j->mu (see the file comment). */
static void on_close(void *ud)
{
    struct job *j = ud;
    if (atomic_load(&j->detached)) return; /* a background response outlives its client */
    atomic_store(&j->gone, true);
    abort_choices(j);
}

/* bg_abort_fn: a cancel or delete of a background job. */
static void bg_abort(void *ud) { abort_choices(ud); }

/* /v1/responses background, its choice submitted: stores the queued object, registers the
 * job and answers with that object — or, streamed, makes the reply the job's first
 * follower and starts its events; the job runs on without its client. Returns 0, or an
 * error code with e set (nothing stored or registered; the caller answers e). Caller holds
 * j->mu. */
static int run_detached(struct job *j, struct api_error *e)
{
    size_t len;
    bool stream = j->req.stream;
    char *obj = resp_out_json(&j->ch[0].resp, RESP_QUEUED, NULL, NULL, &len);
    int rc = obj ? http_reply_meter(j->reply, &j->meter) : ERR_NOMEM;
    if (!rc)
        rc = bg_start(j->s->bg, j->id, obj, j->req.resp_items, bg_abort, j, stream ? &server_reply_follower : NULL,
                      stream ? j->reply : NULL);
    if (rc) {
        free(obj);
        if (rc == ERR_RANGE)
            api_error_set(e, 400, API_ERR_INVALID_REQUEST, "input", NULL,
                          "this background response's conversation is larger than the response store "
                          "(--response-store-mb)");
        else
            api_error_from_code(e, rc, NULL, NULL, "out of memory");
        return rc;
    }
    j->background = true;
    atomic_store(&j->detached, true);
    if (stream) { /* no event can come before this one: notifies wait for j->mu */
        http_reply_start_stream(j->reply);
        j->reply = NULL; /* the registry's follower from now on */
        resp_out_start(&j->ch[0].resp);
    } else {
        http_reply_send(j->reply, 200, "application/json", obj, len, NULL);
        j->reply = NULL; /* released by the send */
    }
    free(obj);
    return 0;
}

/* The worker's part: parse, submit, start the stream. Worker thread. */
static void job_run(void *arg)
{
    struct job *j = arg;
    struct server *s = j->s;
    enum oai_kind kind = j->kind;
    struct api_error e;
    const char *body = j->body ? j->body : ""; /* no body: "" is not JSON either */
    int rc = kind == OAI_CHAT        ? oai_parse_chat(&s->ctx, body, j->body_len, &j->req, &e)
             : kind == OAI_RESPONSES ? oai_parse_responses(&s->ctx, body, j->body_len, &j->req, &e)
                                     : oai_parse_completion(&s->ctx, body, j->body_len, &j->req, &e);
    free(j->body);
    j->body = NULL;
    pthread_mutex_lock(&j->mu);
    if (rc) {
        j->failed = true;
        server_reply_api_error(j->reply, &e);
        job_unref_unlock(j);
        return;
    }
    const struct oai_request *r = &j->req;
    if (kind != OAI_COMPLETION && (r->tool_format != TP_NONE || r->reasoning != RSN_NONE)) {
        for (int i = 0; i < oai_n_choices(r) && !rc; i++) {
            struct choice *c = &j->ch[i];
            rc = kind == OAI_RESPONSES ? oai_output_parser(r, &c->parser, resp_out_event, &c->resp)
                                       : oai_output_parser(r, &c->parser, r->stream ? stream_event : collect_event, c);
            c->parsing = rc == 0;
        }
        if (rc) {
            j->failed = true;
            api_error_from_code(&e, rc, NULL, NULL, "out of memory");
            server_reply_api_error(j->reply, &e);
            job_unref_unlock(j);
            return;
        }
    }
    static const char *const id_prefix[] = { "chatcmpl-", "cmpl-", "resp_" };
    oai_make_id(id_prefix[kind], j->id, sizeof j->id);
    j->meta = (struct oai_meta){ .kind = kind, .id = j->id, .created = (int64_t)time(NULL),
                                 .model = r->model };
    if (kind == OAI_RESPONSES) {
        j->rmeta = (struct resp_meta){ .id = j->id, .created_at = j->meta.created, .model = r->model,
                                       .echo = r->resp_echo, .m = s->m, .top_logprobs = r->top_logprobs };
        resp_out_init(&j->ch[0].resp, &j->rmeta, r->stream ? resp_sink : NULL, j);
    }
    char err[ERR_BUF] = "";
    if (r->echo_on && !r->stream) /* echo: the prompt's text starts each choice's text */
        for (int i = 0; i < oai_n_choices(r) && !rc; i++) {
            struct choice *c = &j->ch[i];
            const char *t = r->echo[i / r->n];
            if (!append(&c->text, &c->text_len, &c->text_cap, t, strlen(t)))
                rc = err_set(err, sizeof err, ERR_NOMEM, "out of memory");
        }
    for (int i = 0; i < oai_n_choices(r) && !rc; i++) {
        struct req_params p = r->rp;
        /* n choices: distinct, reproducible streams. With a seed, a batch's prompt gets the
           seeds it would get alone; without one every choice of the batch gets its own (two
           equal prompts must not sample alike) */
        p.sp.seed = r->rp.sp.seed + (uint64_t)(r->seed_given ? i % r->n : i);
        /* a prompt's n choices are one request against the queue limits; a batch's prompts are
           a request each (past a limit the submitted ones are aborted below: 429) */
        p.sibling = i % r->n > 0;
        int len;
        const int32_t *ids = oai_prompt(r, i / r->n, &len);
        rc = engine_submit(s->e, ids, len, &p, on_notify, &j->ch[i], &j->ch[i].rq, err, sizeof err);
        if (rc) break;
        j->refs++;
        atomic_store(&j->n_submitted, i + 1);
    }
    if (rc) {
        api_error_from_code(&e, rc, kind == OAI_CHAT ? "messages" : kind == OAI_RESPONSES ? "input" : "prompt",
                            rc == ERR_RANGE ? "context_length_exceeded" : NULL, err);
    } else if (r->resp_background && !atomic_load(&j->gone)) {
        rc = run_detached(j, &e);
        if (!rc) {
            job_unref_unlock(j);
            return;
        }
    }
    if (rc) {
        /* nothing was sent yet: a real HTTP status (the submitted choices are aborted and
           drop their references at their final notify) */
        j->failed = true;
        abort_choices(j);
        server_reply_api_error(j->reply, &e);
        job_unref_unlock(j);
        return;
    }
    if (atomic_load(&j->gone)) abort_choices(j); /* on_close ran before they existed */
    if (r->stream) {
        http_reply_start_stream(j->reply);
        if (kind == OAI_RESPONSES) {
            resp_out_start(&j->ch[0].resp);
        } else if (kind == OAI_CHAT) {
            /* the role chunk of every choice goes out at once: the client sees the stream open */
            for (int i = 0; i < oai_n_choices(r); i++) {
                struct oai_piece p = { .index = i };
                write_chunk(j, &p, true);
            }
        } else if (r->echo_on && !echo_logprobs(r)) { /* echo: each choice's first chunk is its prompt
                                                         (with logprobs: once they are in) */
            for (int i = 0; i < oai_n_choices(r); i++) {
                const char *t = r->echo[i / r->n];
                struct oai_piece p = { .index = i, .text = t, .text_len = strlen(t), .top_logprobs = -1 };
                write_chunk(j, &p, false);
            }
        }
    }
    job_unref_unlock(j);
}

/* The handler's part: defer, hand the body to a worker. HTTP thread; never blocks. */
static void handle(struct server *s, const struct http_request *req, enum oai_kind kind)
{
    if (server_refuse_unless_ready(s, req)) return;
    struct job *j = calloc(1, sizeof *j);
    if (!j) {
        http_respond_error(req->conn, 500, "out of memory", API_ERR_SERVER, NULL, NULL, NULL);
        return;
    }
    j->s = s;
    j->kind = kind;
    j->req_id = req->id;
    pthread_mutex_init(&j->mu, NULL);
    j->refs = 1; /* the worker's task */
    atomic_init(&j->n_submitted, 0);
    atomic_init(&j->gone, false);
    atomic_init(&j->detached, false);
    for (int i = 0; i < OAI_MAX_CHOICES; i++) {
        j->ch[i].job = j;
        j->ch[i].index = i;
        j->ch[i].ttft = -1;
    }
    j->reply = http_reply_defer(req->conn, false, on_close, j);
    if (!j->reply) { /* the HTTP layer answers 500 */
        job_free(j);
        return;
    }
    j->body = http_take_body(req->conn, &j->body_len);
    if (!server_work(s, job_run, j)) {
        struct api_error e;
        api_error_set(&e, 429, API_ERR_RATE_LIMIT, NULL, "rate_limit_exceeded",
                      "too many requests are waiting to be parsed; retry later");
        server_reply_api_error(j->reply, &e);
        job_free(j);
    }
}

void server_handle_chat(void *ud, const struct http_request *req) { handle(ud, req, OAI_CHAT); }

void server_handle_completion(void *ud, const struct http_request *req)
{
    handle(ud, req, OAI_COMPLETION);
}

void server_handle_responses(void *ud, const struct http_request *req) { handle(ud, req, OAI_RESPONSES); }

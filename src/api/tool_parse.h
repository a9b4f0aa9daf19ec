/* tool_parse.h — the per-choice output parser of a chat answer: reasoning, content and
 * tool calls, streamed.
 *
 * The parser is fed each text delta the engine produces for one choice and emits events:
 * content text, reasoning text, the start of a tool call (index, id, name) and the call's
 * arguments (one JSON text per call, emitted when the call is complete and valid). The
 * reasoning split (reasoning.h) runs first; tool calls are parsed in the content part
 * only. Text that may be the start of a call's markup is held back until it is decided,
 * so markup never reaches the content; tparse_finish releases what is still held.
 *
 * Formats (vLLM's --tool-call-parser names):
 *   hermes       <tool_call>{"name": …, "arguments": {…}}</tool_call>, any number, with
 *                text around them (Hermes, Qwen2.5, Qwen3)
 *   llama3_json  an answer that starts with {"name": …, "parameters": {…}}, optionally
 *                after <|python_tag|>, several separated by ";" (Llama 3.1 / 3.2)
 *   mistral      [TOOL_CALLS] followed by a JSON array of {"name", "arguments"} objects,
 *                or (newer tokenizers) [TOOL_CALLS]NAME[ARGS]{…}
 *   deepseek_v3  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n
 *                ```json\n{…}\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜> (DeepSeek V3, R1
 *                and the R1-Distill templates)
 * A call whose JSON is malformed, or that is not an object with a string "name" and an
 * object "arguments" ("parameters" for llama3_json), is passed on as content, markup
 * included, as vLLM does.
 *
 * Memory: the parser owns a text buffer that grows to the longest undecided stretch (a
 * call's markup and JSON); no other allocation. One parser per choice; one thread at a
 * time; no globals.
 */
#ifndef TESSERA_API_TOOL_PARSE_H
#define TESSERA_API_TOOL_PARSE_H

#include "api/reasoning.h"

#include <stdbool.h>
#include <stddef.h>

enum tparse_format { TP_NONE = 0, TP_HERMES, TP_LLAMA3_JSON, TP_MISTRAL, TP_DEEPSEEK_V3 };

/* "hermes", "llama3_json", "mistral", "deepseek_v3" (and "none") → the format, or -1. */
int tparse_format_from_name(const char *name);
/* The format's name ("none" for TP_NONE). */
const char *tparse_format_name(enum tparse_format f);
/* The format a chat template's tool-call markup shows (template source text, may be
 * NULL), or TP_NONE when it shows none this parser knows. */
enum tparse_format tparse_format_detect(const char *chat_template);
/* The key holding a call's arguments in the format's JSON: "parameters" for llama3_json,
 * else "arguments". */
const char *tparse_format_args_key(enum tparse_format f);

enum tparse_event_kind {
    TP_EV_CONTENT = 0, /* text: answer text */
    TP_EV_REASONING,   /* text: reasoning text */
    TP_EV_TOOL_START,  /* index, id, name: a call begins */
    TP_EV_TOOL_ARGS,   /* index, text: (a fragment of) the call's arguments, JSON text */
};

/* One event. Every pointer is borrowed for the duration of the callback only. */
struct tparse_event {
    enum tparse_event_kind kind;
    const char *text;  /* [len] CONTENT, REASONING, TOOL_ARGS; not NUL-terminated */
    size_t len;
    int index;         /* TOOL_*: the call's index in this choice (0, 1, ...) */
    const char *id;    /* TOOL_START: "call_…" */
    const char *name;  /* TOOL_START: the function name (NUL-terminated) */
};

/* Receives events. Returns 0, or a negative code the feed returns at once. */
typedef int (*tparse_emit_fn)(void *ud, const struct tparse_event *ev);

struct tparse {
    enum tparse_format fmt;
    int max_calls;          /* calls after this many are dropped (parallel_tool_calls
                               false: 1); <= 0 unbounded */
    tparse_emit_fn emit;
    void *ud;
    struct rsn_split rsn;
    int state;              /* internal */
    bool started;           /* content seen (llama3_json only looks at the start) */
    size_t skip;            /* bytes of markup at the start of buf already matched */
    char *buf;              /* [len] undecided content text, cap bytes */
    size_t len, cap;
    int n_calls;            /* calls emitted */
    int err;                /* the first error an emit returned (sticky) */
};

/* Starts p. fmt TP_NONE: no tool-call parsing; rk RSN_NONE: no reasoning split;
 * reasoning_opened: the prompt opened "<think>" (rsn_prompt_opens). Returns 0 or
 * ERR_NOMEM. */
int tparse_init(struct tparse *p, enum tparse_format fmt, int max_calls, enum rsn_kind rk,
            bool reasoning_opened, tparse_emit_fn emit, void *ud);
/* Feeds s[0, len) (any split, even inside a UTF-8 sequence or a tag). Returns 0, ERR_NOMEM,
 * or the first error emit returned (then the parser stops emitting). */
int tparse_feed(struct tparse *p, const char *s, size_t len);
/* The end of the output: decides everything held (an unterminated call is parsed if its
 * JSON is complete, else passed on as content). Call once. */
int tparse_finish(struct tparse *p);
/* rsn_in_reasoning of the parser's reasoning split. */
bool tparse_in_reasoning(const struct tparse *p);
void tparse_free(struct tparse *p);

#endif

/* tool_parse.c — the streaming output parser (see tool_parse.h).
 *
 * Content text (what the reasoning split passes on) is appended to buf and decided from
 * the front. States:
 *   TEXT   answer text; watch for the format's opening marker, holding back a suffix of
 *          buf that is a proper prefix of it
 *   CALL   after a call's opening marker (hermes <tool_call>, deepseek <｜tool▁call▁begin｜>):
 *          wait for the closing marker, then parse the call between them (hermes: the
 *          call's JSON ends it, so the closing tag inside a string is just text)
 *   BLOCK  deepseek_v3 between calls: the next call, or the end of the block
 *   JSON   mistral after [TOOL_CALLS], llama3_json at the start: wait until the JSON
 *          value is complete (json_scan), then parse it
 *   SEP    llama3_json after a call: ";" and another call, or plain text
 *   PASS   everything else is content (llama3_json answers that are not calls, or text
 *          after malformed JSON)
 * `skip` counts the markup bytes at the front of buf that belong to the undecided call,
 * so a call that turns out malformed is passed on as content with its markup.
 */
#define _POSIX_C_SOURCE 200809L
#include "api/tool_parse.h"
#include "api/openai.h"
#include "util/err.h"
#include "util/grow.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

enum { ST_TEXT = 0, ST_CALL, ST_BLOCK, ST_JSON, ST_SEP, ST_PASS };

#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define MISTRAL_OPEN "[TOOL_CALLS]"
#define LLAMA_TAG "<|python_tag|>"
#define DS_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALLS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"

#define MAX_NAME 256   /* longest function name accepted in a call (OpenAI allows 64) */
#define MAX_DEPTH 128  /* deepest JSON nesting accepted in a call */

/* ---------------------------------------------------------------- formats */

int tparse_format_from_name(const char *name)
{
    if (!name || !name[0] || !strcmp(name, "none")) return TP_NONE;
    if (!strcmp(name, "hermes")) return TP_HERMES;
    if (!strcmp(name, "llama3_json")) return TP_LLAMA3_JSON;
    if (!strcmp(name, "mistral")) return TP_MISTRAL;
    if (!strcmp(name, "deepseek_v3")) return TP_DEEPSEEK_V3;
    return -1;
}

const char *tparse_format_name(enum tparse_format f)
{
    switch (f) {
    case TP_HERMES: return "hermes";
    case TP_LLAMA3_JSON: return "llama3_json";
    case TP_MISTRAL: return "mistral";
    case TP_DEEPSEEK_V3: return "deepseek_v3";
    case TP_NONE: break;
    }
    return "none";
}

enum tparse_format tparse_format_detect(const char *t)
{
    if (!t) return TP_NONE;
    if (strstr(t, HERMES_OPEN)) return TP_HERMES;
    if (strstr(t, MISTRAL_OPEN)) return TP_MISTRAL;
    if (strstr(t, DS_CALLS_BEGIN)) return TP_DEEPSEEK_V3;
    /* Llama 3.1 / 3.2: tools described in the prompt, calls answered as JSON with
       "parameters" (the template also knows <|python_tag|> for built-in tools) */
    if (strstr(t, LLAMA_TAG) || (strstr(t, "<|start_header_id|>") && strstr(t, "\"parameters\"")))
        return TP_LLAMA3_JSON;
    return TP_NONE;
}

const char *tparse_format_args_key(enum tparse_format f)
{
    return f == TP_LLAMA3_JSON ? "parameters" : "arguments";
}

/* ---------------------------------------------------------------- JSON scanning */

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static size_t skip_ws(const char *s, size_t len, size_t i)
{
    while (i < len && is_ws(s[i])) i++;
    return i;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static bool is_hex(char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* The scanners return 1 (complete: *pos past the value), 0 (the text ends before the
 * value does: it may still become valid) or -1 (invalid). */
static int scan_string(const char *s, size_t len, size_t *pos)
{
    size_t i = *pos + 1; /* past the opening quote */
    for (;;) {
        if (i >= len) return 0;
        unsigned char c = (unsigned char)s[i];
        if (c == '"') break;
        if (c < 0x20) return -1;
        if (c == '\\') {
            if (++i >= len) return 0;
            if (s[i] == 'u') {
                for (int k = 1; k <= 4; k++) {
                    if (i + (size_t)k >= len) return 0;
                    if (!is_hex(s[i + (size_t)k])) return -1;
                }
                i += 4;
            } else if (!strchr("\"\\/bfnrt", s[i])) {
                return -1;
            }
        }
        i++;
    }
    *pos = i + 1;
    return 1;
}

static int scan_number(const char *s, size_t len, size_t *pos)
{
    size_t i = *pos;
    if (s[i] == '-') i++;
    if (i >= len) return 0;
    if (s[i] == '0') i++;
    else if (is_digit(s[i])) while (i < len && is_digit(s[i])) i++;
    else return -1;
    if (i < len && s[i] == '.') {
        if (++i >= len) return 0;
        if (!is_digit(s[i])) return -1;
        while (i < len && is_digit(s[i])) i++;
    }
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        if (++i >= len) return 0;
        if (s[i] == '+' || s[i] == '-') i++;
        if (i >= len) return 0;
        if (!is_digit(s[i])) return -1;
        while (i < len && is_digit(s[i])) i++;
    }
    if (i >= len) return 0; /* more digits may follow */
    *pos = i;
    return 1;
}

static int scan_value(const char *s, size_t len, size_t *pos, int depth)
{
    size_t i = skip_ws(s, len, *pos);
    if (i >= len) return 0;
    int rc;
    char c = s[i];
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        if (depth >= MAX_DEPTH) return -1;
        i = skip_ws(s, len, i + 1);
        if (i >= len) return 0;
        if (s[i] == close) {
            *pos = i + 1;
            return 1;
        }
        for (;;) {
            if (c == '{') {
                i = skip_ws(s, len, i);
                if (i >= len) return 0;
                if (s[i] != '"') return -1;
                if ((rc = scan_string(s, len, &i)) <= 0) return rc;
                i = skip_ws(s, len, i);
                if (i >= len) return 0;
                if (s[i++] != ':') return -1;
            }
            if ((rc = scan_value(s, len, &i, depth + 1)) <= 0) return rc;
            i = skip_ws(s, len, i);
            if (i >= len) return 0;
            if (s[i] == close) break;
            if (s[i++] != ',') return -1;
        }
        *pos = i + 1;
        return 1;
    }
    if (c == '"') {
        rc = scan_string(s, len, &i);
        if (rc > 0) *pos = i;
        return rc;
    }
    if (c == '-' || is_digit(c)) {
        rc = scan_number(s, len, &i);
        if (rc > 0) *pos = i;
        return rc;
    }
    const char *lit = c == 't' ? "true" : c == 'f' ? "false" : c == 'n' ? "null" : NULL;
    if (!lit) return -1;
    for (size_t k = 0; lit[k]; k++) {
        if (i + k >= len) return 0;
        if (s[i + k] != lit[k]) return -1;
    }
    *pos = i + strlen(lit);
    return 1;
}

/* Scans one JSON value at the start of s[0, len) (leading whitespace allowed); *end is
 * past it when complete. */
static int json_scan(const char *s, size_t len, size_t *end)
{
    size_t pos = 0;
    int rc = scan_value(s, len, &pos, 0);
    if (rc > 0) *end = pos;
    return rc;
}

/* In the complete, valid object s[0, len): the raw span [*vs, *ve) of member key's value.
 * False when there is no such member. */
static bool obj_member(const char *s, size_t len, const char *key, size_t *vs, size_t *ve)
{
    size_t klen = strlen(key), i = skip_ws(s, len, 0) + 1;
    for (;;) {
        i = skip_ws(s, len, i);
        if (i >= len || s[i] != '"') return false; /* '}' of an empty object */
        size_t ks = i + 1;
        if (scan_string(s, len, &i) <= 0) return false;
        bool match = i - 1 - ks == klen && !memcmp(s + ks, key, klen);
        i = skip_ws(s, len, i) + 1; /* past ':' */
        i = skip_ws(s, len, i);
        size_t start = i;
        if (scan_value(s, len, &i, 1) <= 0) return false;
        if (match) {
            *vs = start;
            *ve = i;
            return true;
        }
        i = skip_ws(s, len, i);
        if (i >= len || s[i] != ',') return false;
        i++;
    }
}

/* Decodes the JSON string s[0, len) (quotes included) into out[cap]; false if it is not a
 * string, is empty, or does not fit. */
static bool decode_string(const char *s, size_t len, char *out, size_t cap)
{
    cJSON *v = cJSON_ParseWithLength(s, len);
    bool ok = cJSON_IsString(v) && v->valuestring[0] && strlen(v->valuestring) < cap;
    if (ok) strcpy(out, v->valuestring);
    cJSON_Delete(v);
    return ok;
}

/* ---------------------------------------------------------------- emitting */

static int emit(struct tparse *p, const struct tparse_event *ev)
{
    if (p->err) return p->err;
    int rc = p->emit(p->ud, ev);
    if (rc) p->err = rc;
    return rc;
}

static int emit_text(struct tparse *p, enum tparse_event_kind kind, const char *s, size_t len)
{
    if (len == 0) return p->err;
    struct tparse_event ev = { .kind = kind, .text = s, .len = len };
    return emit(p, &ev);
}

/* Emits one call (or drops it past max_calls). args[0, args_len) is JSON text. */
static int emit_call(struct tparse *p, const char *name, const char *args, size_t args_len)
{
    if (p->max_calls > 0 && p->n_calls >= p->max_calls) return p->err;
    char id[64];
    oai_make_id("call_", id, sizeof id);
    struct tparse_event ev = { .kind = TP_EV_TOOL_START, .index = p->n_calls, .id = id, .name = name };
    int rc = emit(p, &ev);
    if (rc) return rc;
    ev = (struct tparse_event){ .kind = TP_EV_TOOL_ARGS, .index = p->n_calls, .text = args,
                            .len = args_len };
    p->n_calls++;
    return emit(p, &ev);
}

/* A call object {"name": "...", "arguments": {...}} at s[0, len) (a complete value):
 * fills name and the arguments' span. Arguments given as a JSON string holding an object
 * are accepted too (*args_str then holds the malloc'd decoded text). */
static bool parse_call_object(const struct tparse *p, const char *s, size_t len,
                              char *name, size_t *as, size_t *ae, char **args_str)
{
    size_t i = skip_ws(s, len, 0), vs, ve;
    *args_str = NULL;
    if (i >= len || s[i] != '{') return false;
    if (!obj_member(s, len, "name", &vs, &ve) || !decode_string(s + vs, ve - vs, name, MAX_NAME))
        return false;
    const char *key = tparse_format_args_key(p->fmt);
    if (!obj_member(s, len, key, &vs, &ve) &&
        !obj_member(s, len, p->fmt == TP_LLAMA3_JSON ? "arguments" : "parameters", &vs, &ve)) {
        *as = *ae = 0; /* no arguments: "{}" */
        return true;
    }
    if (s[vs] == '{') {
        *as = vs;
        *ae = ve;
        return true;
    }
    if (s[vs] != '"') return false;
    cJSON *v = cJSON_ParseWithLength(s + vs, ve - vs);
    size_t end;
    bool ok = cJSON_IsString(v) && json_scan(v->valuestring, strlen(v->valuestring), &end) > 0 &&
              v->valuestring[skip_ws(v->valuestring, end, 0)] == '{' &&
              skip_ws(v->valuestring, strlen(v->valuestring), end) == strlen(v->valuestring);
    if (ok) {
        *args_str = v->valuestring;
        v->valuestring = NULL;
    }
    cJSON_Delete(v);
    return ok;
}

/* Emits the call object at s[0, len) if it is one; false (nothing emitted) if not. */
static bool try_object(struct tparse *p, const char *s, size_t len)
{
    char name[MAX_NAME];
    size_t as, ae;
    char *str;
    if (!parse_call_object(p, s, len, name, &as, &ae, &str)) return false;
    if (str) emit_call(p, name, str, strlen(str));
    else if (ae > as) emit_call(p, name, s + as, ae - as);
    else emit_call(p, name, "{}", 2);
    free(str);
    return true;
}

/* hermes: the text between <tool_call> and </tool_call> is one call object. */
static bool try_hermes(struct tparse *p, const char *s, size_t len)
{
    size_t end;
    size_t i = skip_ws(s, len, 0);
    if (json_scan(s + i, len - i, &end) <= 0 || skip_ws(s, len, i + end) != len) return false;
    return try_object(p, s + i, end);
}

/* deepseek_v3: TYPE<｜tool▁sep｜>NAME\n```json\n{...}\n``` */
static bool try_deepseek(struct tparse *p, const char *s, size_t len)
{
    const size_t sep_len = strlen(DS_SEP);
    const char *sep = NULL;
    for (size_t i = 0; i + sep_len <= len && !sep; i++)
        if (!memcmp(s + i, DS_SEP, sep_len)) sep = s + i;
    if (!sep) return false;
    size_t i = (size_t)(sep - s) + sep_len, ns, ne;
    ns = i = skip_ws(s, len, i);
    while (i < len && s[i] != '\n') i++;
    ne = i;
    while (ne > ns && is_ws(s[ne - 1])) ne--;
    if (ne == ns || ne - ns >= MAX_NAME) return false;
    char name[MAX_NAME];
    memcpy(name, s + ns, ne - ns);
    name[ne - ns] = 0;
    for (size_t k = 0; k < ne - ns; k++)
        if ((unsigned char)name[k] < 0x20) return false;
    i = skip_ws(s, len, i);
    bool fenced = len - i >= 3 && !memcmp(s + i, "```", 3);
    if (fenced) {
        i += 3;
        if (len - i >= 4 && !memcmp(s + i, "json", 4)) i += 4;
        i = skip_ws(s, len, i);
    }
    size_t end;
    if (i >= len || s[i] != '{' || json_scan(s + i, len - i, &end) <= 0) return false;
    size_t as = i, ae = i + end;
    i = skip_ws(s, len, ae);
    if (fenced) {
        if (len - i < 3 || memcmp(s + i, "```", 3)) return false;
        i = skip_ws(s, len, i + 3);
    }
    if (i != len) return false;
    emit_call(p, name, s + as, ae - as);
    return true;
}

/* mistral: an array of call objects (or one object); all or nothing. */
static bool try_mistral(struct tparse *p, const char *s, size_t len)
{
    size_t i = skip_ws(s, len, 0);
    if (s[i] == '{') return try_object(p, s + i, len - i);
    if (s[i] != '[') return false;
    char name[MAX_NAME];
    size_t as, ae;
    char *str;
    /* check every element first: a malformed one makes the whole array content */
    for (int pass = 0; pass < 2; pass++) {
        size_t k = skip_ws(s, len, i + 1);
        if (k < len && s[k] == ']') return true; /* [] : no calls */
        for (;;) {
            size_t end;
            k = skip_ws(s, len, k);
            if (json_scan(s + k, len - k, &end) <= 0) return false;
            if (pass == 0) {
                if (!parse_call_object(p, s + k, end, name, &as, &ae, &str)) return false;
                free(str);
            } else {
                try_object(p, s + k, end);
            }
            k = skip_ws(s, len, k + end);
            if (k >= len || s[k] == ']') break;
            k++; /* ',' */
        }
    }
    return true;
}

/* ---------------------------------------------------------------- the state machine */

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_' ||
           c == '-' || c == '.';
}

/* mistral, newer tokenizers: [TOOL_CALLS]NAME[ARGS]{...} — s[0, len) starts at NAME.
 * Returns 1 (call emitted; *end past its JSON), 0 (undecided: more text needed) or -1
 * (not such a call). */
static int mistral_named(struct tparse *p, const char *s, size_t len, bool final, size_t *end)
{
    static const char ARGS[] = "[ARGS]";
    const size_t alen = sizeof ARGS - 1;
    size_t k = 0;
    while (k < len && name_char(s[k]) && k < MAX_NAME) k++;
    if (k == 0 || k >= MAX_NAME) return -1;
    if (len - k < alen) /* the name may go on, or [ARGS] be on its way */
        return !final && !memcmp(s + k, ARGS, len - k) ? 0 : -1;
    if (memcmp(s + k, ARGS, alen) != 0) return -1;
    size_t j = k + alen, e;
    int rc = json_scan(s + j, len - j, &e);
    if (rc == 0) return final ? -1 : 0;
    if (rc < 0 || s[skip_ws(s, len, j)] != '{') return -1;
    char name[MAX_NAME];
    memcpy(name, s, k);
    name[k] = 0;
    emit_call(p, name, s + skip_ws(s, len, j), j + e - skip_ws(s, len, j));
    *end = j + e;
    return 1;
}

static void drop(struct tparse *p, size_t n)
{
    memmove(p->buf, p->buf + n, p->len - n);
    p->len -= n;
}

static bool starts_with(const char *s, size_t len, const char *lit)
{
    size_t n = strlen(lit);
    return len >= n && !memcmp(s, lit, n);
}

/* s[0, len) is a proper prefix of lit (more text may complete it). */
static bool prefix_of(const char *s, size_t len, const char *lit)
{
    size_t n = strlen(lit);
    return len < n && !memcmp(s, lit, len);
}

/* The first occurrence of lit in s[from, len), or len. */
static size_t find(const char *s, size_t len, size_t from, const char *lit)
{
    size_t n = strlen(lit);
    for (size_t i = from; i + n <= len; i++)
        if (s[i] == lit[0] && !memcmp(s + i, lit, n)) return i;
    return len;
}

/* The longest suffix of s[0, len) that is a proper prefix of lit. */
static size_t partial(const char *s, size_t len, const char *lit)
{
    size_t n = strlen(lit);
    for (size_t k = len < n - 1 ? len : n - 1; k > 0; k--)
        if (!memcmp(s + len - k, lit, k)) return k;
    return 0;
}

/* Passes buf[0, n) on as content and drops it. */
static int pass_on(struct tparse *p, size_t n)
{
    int rc = emit_text(p, TP_EV_CONTENT, p->buf, n);
    drop(p, n);
    return rc;
}

static const char *open_marker(enum tparse_format f)
{
    switch (f) {
    case TP_HERMES: return HERMES_OPEN;
    case TP_MISTRAL: return MISTRAL_OPEN;
    case TP_DEEPSEEK_V3: return DS_CALLS_BEGIN;
    default: return NULL;
    }
}

/* Decides as much of buf as can be decided; final: nothing more will come. */
static int process(struct tparse *p, bool final)
{
    while (!p->err) {
        const char *s = p->buf;
        size_t len = p->len, i, end;
        switch (p->state) {
        case ST_TEXT: {
            if (p->fmt == TP_LLAMA3_JSON && !p->started) {
                i = skip_ws(s, len, 0);
                if (i == len) return final ? pass_on(p, len) : 0;
                if (s[i] == '{' || starts_with(s + i, len - i, LLAMA_TAG)) {
                    p->skip = s[i] == '{' ? i : i + strlen(LLAMA_TAG);
                    p->state = ST_JSON;
                } else if (!final && prefix_of(s + i, len - i, LLAMA_TAG)) {
                    return 0;
                } else {
                    p->state = ST_PASS;
                }
                p->started = true;
                continue;
            }
            const char *m = open_marker(p->fmt);
            if (!m) return pass_on(p, len);
            i = find(s, len, 0, m);
            if (i < len) {
                int rc = pass_on(p, i);
                if (rc) return rc;
                p->skip = strlen(m);
                p->state = p->fmt == TP_HERMES ? ST_CALL : p->fmt == TP_MISTRAL ? ST_JSON : ST_BLOCK;
                if (p->state == ST_BLOCK) { /* the block's opening marker is not part of a call */
                    drop(p, p->skip);
                    p->skip = 0;
                }
                continue;
            }
            return pass_on(p, len - (final ? 0 : partial(s, len, m)));
        }
        case ST_PASS:
            return pass_on(p, len);
        case ST_CALL: {
            const char *close = p->fmt == TP_HERMES ? HERMES_CLOSE : DS_CALL_END;
            if (p->fmt == TP_HERMES) {
                /* the JSON decides where the call ends, so a "</tool_call>" inside one of
                   its strings does not cut it short; a body that is not one JSON value
                   falls back to the first closing tag below */
                size_t js = skip_ws(s, len, p->skip), je = 0;
                int jr = js < len ? json_scan(s + js, len - js, &je) : 0;
                if (jr == 0 && !final) return 0;
                size_t k = jr > 0 ? skip_ws(s, len, js + je) : 0;
                if (jr > 0 && !final && prefix_of(s + k, len - k, close)) return 0;
                if (jr > 0 && (k == len || starts_with(s + k, len - k, close))) {
                    end = k == len ? len : k + strlen(close);
                    if (try_object(p, s + js, je)) drop(p, end);
                    else if (pass_on(p, end)) return p->err;
                    p->skip = 0;
                    p->state = ST_TEXT;
                    continue;
                }
            }
            i = find(s, len, p->skip, close);
            int next = p->fmt == TP_HERMES ? ST_TEXT : ST_BLOCK;
            if (i == len) {
                if (!final) return 0;
                /* unterminated (the output ended): a complete call is still a call */
                bool ok = p->fmt == TP_HERMES ? try_hermes(p, s + p->skip, len - p->skip)
                                              : try_deepseek(p, s + p->skip, len - p->skip);
                p->state = ST_TEXT;
                if (ok) drop(p, len);
                else if (pass_on(p, len)) return p->err;
                continue;
            }
            end = i + strlen(close);
            bool ok = p->fmt == TP_HERMES ? try_hermes(p, s + p->skip, i - p->skip)
                                          : try_deepseek(p, s + p->skip, i - p->skip);
            if (ok) drop(p, end);
            else if (pass_on(p, end)) return p->err;
            p->skip = 0;
            p->state = next;
            continue;
        }
        case ST_BLOCK:
            i = skip_ws(s, len, 0);
            if (starts_with(s + i, len - i, DS_CALL_BEGIN)) {
                drop(p, i);
                p->skip = strlen(DS_CALL_BEGIN);
                p->state = ST_CALL;
            } else if (starts_with(s + i, len - i, DS_CALLS_END)) {
                drop(p, i + strlen(DS_CALLS_END));
                p->state = ST_TEXT;
            } else if (!final && (prefix_of(s + i, len - i, DS_CALL_BEGIN) ||
                                  prefix_of(s + i, len - i, DS_CALLS_END))) {
                return 0;
            } else {
                drop(p, i);
                p->state = ST_TEXT;
                if (final && p->len == 0) return 0;
            }
            continue;
        case ST_JSON: {
            i = skip_ws(s, len, p->skip);
            if (p->fmt == TP_MISTRAL && i < len && s[i] != '[' && s[i] != '{') {
                int rc = mistral_named(p, s + i, len - i, final, &end);
                if (rc == 0) return 0;
                if (rc < 0) p->state = ST_PASS;
                else {
                    drop(p, i + end);
                    p->state = ST_TEXT;
                }
                p->skip = 0;
                continue;
            }
            int rc = i < len ? json_scan(s + i, len - i, &end) : 0;
            if (rc == 0 && !final) return 0;
            if (rc <= 0) { /* malformed, or cut off by the end of the output */
                p->state = ST_PASS;
                p->skip = 0;
                continue;
            }
            bool ok = p->fmt == TP_MISTRAL ? try_mistral(p, s + i, end) : try_object(p, s + i, end);
            if (!ok) {
                if (p->fmt == TP_LLAMA3_JSON) { /* a JSON answer, not a call */
                    p->state = ST_PASS;
                    p->skip = 0;
                    continue;
                }
                if (pass_on(p, i + end)) return p->err;
            } else {
                drop(p, i + end);
            }
            p->skip = 0;
            p->state = p->fmt == TP_LLAMA3_JSON ? ST_SEP : ST_TEXT;
            continue;
        }
        case ST_SEP:
            i = skip_ws(s, len, 0);
            if (i == len) {
                if (final) drop(p, len);
                return 0;
            }
            if (s[i] == ';') {
                drop(p, i + 1);
                p->state = ST_JSON;
            } else {
                drop(p, i);
                p->state = ST_PASS;
            }
            continue;
        }
    }
    return p->err;
}

/* ---------------------------------------------------------------- the interface */

/* The reasoning split's output: reasoning goes out, content into the tool stage. */
static int on_split(void *ud, bool reasoning, const char *s, size_t len)
{
    struct tparse *p = ud;
    if (reasoning) return emit_text(p, TP_EV_REASONING, s, len);
    if (p->fmt == TP_NONE) return emit_text(p, TP_EV_CONTENT, s, len);
    if (!grow_array((void **)&p->buf, &p->cap, p->len + len, 1)) {
        p->err = ERR_NOMEM;
        return ERR_NOMEM;
    }
    memcpy(p->buf + p->len, s, len);
    p->len += len;
    return process(p, false);
}

int tparse_init(struct tparse *p, enum tparse_format fmt, int max_calls, enum rsn_kind rk,
            bool reasoning_opened, tparse_emit_fn emit_fn, void *ud)
{
    memset(p, 0, sizeof *p);
    p->fmt = fmt;
    p->max_calls = max_calls;
    p->emit = emit_fn;
    p->ud = ud;
    rsn_init(&p->rsn, rk, reasoning_opened);
    if (fmt != TP_NONE && !grow_array((void **)&p->buf, &p->cap, 256, 1)) return ERR_NOMEM;
    return 0;
}

int tparse_feed(struct tparse *p, const char *s, size_t len)
{
    if (p->err) return p->err;
    int rc = rsn_feed(&p->rsn, s, len, on_split, p);
    return rc ? rc : p->err;
}

int tparse_finish(struct tparse *p)
{
    if (p->err) return p->err;
    int rc = rsn_flush(&p->rsn, on_split, p);
    if (rc) return rc;
    return p->fmt == TP_NONE ? p->err : process(p, true);
}

bool tparse_in_reasoning(const struct tparse *p)
{
    return rsn_in_reasoning(&p->rsn);
}

void tparse_free(struct tparse *p)
{
    free(p->buf);
    p->buf = NULL;
    p->len = p->cap = 0;
}

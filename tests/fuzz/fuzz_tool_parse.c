/* fuzz_tool_parse.c — libFuzzer target for api/tool_parse (and api/reasoning).
 *
 * The first input byte picks the tool-call format, the reasoning parser, whether the
 * prompt opened <think>, and a call limit; the rest is model output. It is fed whole and
 * again cut into deltas at positions derived from the input; both runs must give the same
 * events (ids aside). Every call's arguments must parse as a JSON object, every name be
 * non-empty, and the content + reasoning + markup-free text may never exceed the input.
 * Any crash, sanitizer report or failed invariant (__builtin_trap) is a bug.
 *
 *   make fuzz   (builds every tests/fuzz/fuzz_*.c with clang -fsanitize=fuzzer,address,undefined)
 */
#include "api/tool_parse.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_ASSERT(c) do { if (!(c)) __builtin_trap(); } while (0)

struct rec {
    char *out;
    size_t len, cap;
    size_t text_bytes;
};

static void app(struct rec *r, const void *s, size_t n)
{
    if (r->len + n > r->cap) {
        size_t cap = (r->len + n) * 2 + 64;
        char *p = realloc(r->out, cap);
        FUZZ_ASSERT(p != NULL);
        r->out = p;
        r->cap = cap;
    }
    memcpy(r->out + r->len, s, n);
    r->len += n;
}

static int on_event(void *ud, const struct tparse_event *ev)
{
    struct rec *r = ud;
    /* text events are recorded byte by byte with their kind, so cuts do not matter */
    switch (ev->kind) {
    case TP_EV_CONTENT:
    case TP_EV_REASONING:
        FUZZ_ASSERT(ev->len > 0);
        for (size_t i = 0; i < ev->len; i++) {
            char k = ev->kind == TP_EV_CONTENT ? 'C' : 'R';
            app(r, &k, 1);
            app(r, ev->text + i, 1);
        }
        r->text_bytes += ev->len;
        break;
    case TP_EV_TOOL_START:
        FUZZ_ASSERT(ev->name && ev->name[0] && ev->id && !strncmp(ev->id, "call_", 5));
        app(r, "S", 1);
        app(r, ev->name, strlen(ev->name) + 1);
        break;
    case TP_EV_TOOL_ARGS: {
        cJSON *v = cJSON_ParseWithLength(ev->text, ev->len);
        FUZZ_ASSERT(cJSON_IsObject(v));
        cJSON_Delete(v);
        app(r, "A", 1);
        app(r, ev->text, ev->len);
        app(r, "", 1);
        break;
    }
    }
    return 0;
}

static void run(const uint8_t *data, size_t size, uint8_t cfg, size_t step, struct rec *r)
{
    struct tparse p;
    enum tparse_format fmt = (enum tparse_format)(cfg % 5);
    enum rsn_kind rk = (enum rsn_kind)((cfg / 5) % 3);
    bool opened = (cfg / 15) & 1;
    int max_calls = (cfg / 30) & 1;
    FUZZ_ASSERT(tparse_init(&p, fmt, max_calls, rk, opened, on_event, r) == 0);
    for (size_t at = 0; at < size;) {
        size_t n = step ? step + (data[at] & 3) : size - at;
        if (n > size - at) n = size - at;
        FUZZ_ASSERT(tparse_feed(&p, (const char *)data + at, n) == 0);
        at += n;
    }
    FUZZ_ASSERT(tparse_finish(&p) == 0);
    tparse_free(&p);
    FUZZ_ASSERT(r->text_bytes <= size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint8_t cfg = data[0];
    struct rec a = { 0 }, b = { 0 };
    run(data + 1, size - 1, cfg, 0, &a);
    run(data + 1, size - 1, cfg, 1 + (cfg & 7), &b);
    FUZZ_ASSERT(a.len == b.len && (a.len == 0 || !memcmp(a.out, b.out, a.len)));
    free(a.out);
    free(b.out);
    return 0;
}

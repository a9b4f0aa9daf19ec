/* reasoning.c — the <think> … </think> splitter (see reasoning.h).
 *
 * Three states: START (nothing decided yet: the output may begin with "<think>"),
 * REASON (inside the reasoning, watching for "</think>") and CONTENT (pass-through). The
 * hold buffer keeps the bytes that are a proper prefix of the tag being watched; it is
 * never longer than that tag, so it fits a fixed array.
 */
#include "api/reasoning.h"

#include <string.h>

enum { ST_START = 0, ST_REASON, ST_CONTENT };

static const char OPEN_TAG[] = "<think>";
static const char CLOSE_TAG[] = "</think>";
#define OPEN_LEN (sizeof OPEN_TAG - 1)
#define CLOSE_LEN (sizeof CLOSE_TAG - 1)

int rsn_kind_from_name(const char *name)
{
    if (!name || !strcmp(name, "none") || !name[0]) return RSN_NONE;
    if (!strcmp(name, "deepseek_r1")) return RSN_DEEPSEEK_R1;
    if (!strcmp(name, "qwen3")) return RSN_QWEN3;
    return -1;
}

const char *rsn_kind_name(enum rsn_kind k)
{
    switch (k) {
    case RSN_DEEPSEEK_R1: return "deepseek_r1";
    case RSN_QWEN3: return "qwen3";
    case RSN_NONE: break;
    }
    return "none";
}

bool rsn_prompt_opens(const char *s, size_t len)
{
    while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\n' || s[len - 1] == '\r' ||
                       s[len - 1] == '\t'))
        len--;
    return len >= OPEN_LEN && !memcmp(s + len - OPEN_LEN, OPEN_TAG, OPEN_LEN);
}

void rsn_init(struct rsn_split *r, enum rsn_kind kind, bool opened)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->state = kind == RSN_NONE ? ST_CONTENT : ST_START;
    r->default_in = kind == RSN_DEEPSEEK_R1 || opened;
}

bool rsn_in_reasoning(const struct rsn_split *r)
{
    return r->state == ST_REASON || (r->state == ST_START && r->default_in);
}

static int put(rsn_out_fn out, void *ud, bool reasoning, const char *s, size_t len)
{
    return len > 0 ? out(ud, reasoning, s, len) : 0;
}

/* The longest suffix of s[0, len) that is a proper prefix of tag. */
static size_t partial_tag(const char *s, size_t len, const char *tag, size_t tag_len)
{
    size_t k = len < tag_len - 1 ? len : tag_len - 1;
    for (; k > 0; k--)
        if (!memcmp(s + len - k, tag, k)) return k;
    return 0;
}

/* Inside the reasoning: text (held bytes first, then s) up to "</think>" is reasoning. */
static int feed_reason(struct rsn_split *r, const char *s, size_t len, rsn_out_fn out, void *ud)
{
    /* the held bytes plus the first few new ones may complete the tag */
    while (r->n_hold > 0 && len > 0) {
        size_t take = CLOSE_LEN - r->n_hold < len ? CLOSE_LEN - r->n_hold : len;
        memcpy(r->hold + r->n_hold, s, take);
        size_t n = r->n_hold + take;
        if (n == CLOSE_LEN && !memcmp(r->hold, CLOSE_TAG, CLOSE_LEN)) {
            r->n_hold = 0;
            r->state = ST_CONTENT;
            return put(out, ud, false, s + take, len - take);
        }
        if (!memcmp(r->hold, CLOSE_TAG, n)) { /* still a prefix: all consumed */
            r->n_hold = n;
            return 0;
        }
        /* not the tag: the first held byte is reasoning; retry from the next one */
        int rc = put(out, ud, true, r->hold, 1);
        if (rc) return rc;
        memmove(r->hold, r->hold + 1, r->n_hold - 1);
        r->n_hold--;
    }
    if (len == 0) return 0;
    for (size_t i = 0; i + CLOSE_LEN <= len; i++)
        if (s[i] == '<' && !memcmp(s + i, CLOSE_TAG, CLOSE_LEN)) {
            int rc = put(out, ud, true, s, i);
            if (rc) return rc;
            r->state = ST_CONTENT;
            return put(out, ud, false, s + i + CLOSE_LEN, len - i - CLOSE_LEN);
        }
    size_t keep = partial_tag(s, len, CLOSE_TAG, CLOSE_LEN);
    int rc = put(out, ud, true, s, len - keep);
    if (rc) return rc;
    memcpy(r->hold, s + len - keep, keep);
    r->n_hold = keep;
    return 0;
}

int rsn_feed(struct rsn_split *r, const char *s, size_t len, rsn_out_fn out, void *ud)
{
    if (r->state == ST_CONTENT) return put(out, ud, false, s, len);
    if (r->state == ST_REASON) return feed_reason(r, s, len, out, ud);
    /* START: collect bytes while they can still be "<think>" */
    size_t take = OPEN_LEN - r->n_hold < len ? OPEN_LEN - r->n_hold : len;
    memcpy(r->hold + r->n_hold, s, take);
    size_t n = r->n_hold + take;
    if (!memcmp(r->hold, OPEN_TAG, n)) {
        if (n < OPEN_LEN) {
            r->n_hold = n;
            return 0;
        }
        r->n_hold = 0;
        r->state = ST_REASON;
        return feed_reason(r, s + take, len - take, out, ud);
    }
    /* no opening tag: the held bytes and s go to the default part */
    size_t held = r->n_hold;
    r->n_hold = 0;
    if (!r->default_in) {
        r->state = ST_CONTENT;
        int rc = put(out, ud, false, r->hold, held);
        return rc ? rc : put(out, ud, false, s, len);
    }
    r->state = ST_REASON;
    char again[sizeof r->hold];
    memcpy(again, r->hold, held);
    int rc = feed_reason(r, again, held, out, ud);
    return rc ? rc : feed_reason(r, s, len, out, ud);
}

int rsn_flush(struct rsn_split *r, rsn_out_fn out, void *ud)
{
    bool reasoning = r->state == ST_REASON || (r->state == ST_START && r->default_in);
    size_t n = r->n_hold;
    r->n_hold = 0;
    if (r->state == ST_START) r->state = reasoning ? ST_REASON : ST_CONTENT;
    return put(out, ud, reasoning, r->hold, n);
}

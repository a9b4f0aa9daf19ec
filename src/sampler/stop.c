/* stop.c — stop-string matcher over streamed text (contract and examples in stop.h).
 *
 * Owns nothing outside struct stop_matcher. Each feed works on W = hold + delta, built in
 * the caller's out buffer: it finds the stop occurrence in W that ends first (W is where
 * it must be: hold contains no complete stop string, and every byte emitted earlier was
 * one that no stop string can start at), else keeps as the new hold the longest suffix of
 * W that is a proper prefix of some stop string and emits the rest. Every position before
 * that suffix can start no stop string: the text from there on is neither a prefix of
 * one nor (being complete occurrences checked above) contains one.
 *
 * Invariant: n_hold < max_len (or 0), and hold is a proper prefix of some str[i].
 */
#include "sampler/stop.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "util/err.h"

/* Length of the valid UTF-8 sequence at s[0, n), or 0 if it is not one (overlong forms,
 * surrogates and code points above U+10FFFF are invalid). */
static size_t utf8_seq_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    uint32_t cp, min;
    if (c < 0x80)
        return 1;
    else if ((c & 0xe0) == 0xc0)
        len = 2, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0)
        len = 3, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0)
        len = 4, cp = c & 0x07, min = 0x10000;
    else
        return 0;
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

int stop_validate(const char *const *stops, int n, char *err, size_t errlen)
{
    if (n < 0 || n > STOP_MAX_STRINGS)
        return err_set(err, errlen, ERR_RANGE, "stop: at most %d stop strings, got %d",
                       STOP_MAX_STRINGS, n);
    if (n > 0 && !stops)
        return err_set(err, errlen, ERR_INVALID, "stop: NULL list");
    for (int i = 0; i < n; i++) {
        if (!stops[i])
            return err_set(err, errlen, ERR_INVALID, "stop[%d]: NULL", i);
        size_t len = 0;
        while (len <= STOP_MAX_LEN && stops[i][len])
            len++;
        if (len == 0)
            return err_set(err, errlen, ERR_INVALID, "stop[%d]: empty string", i);
        if (len > STOP_MAX_LEN)
            return err_set(err, errlen, ERR_RANGE, "stop[%d]: longer than %d bytes", i,
                           STOP_MAX_LEN);
        const unsigned char *s = (const unsigned char *)stops[i];
        for (size_t j = 0; j < len;) {
            size_t k = utf8_seq_len(s + j, len - j);
            if (k == 0)
                return err_set(err, errlen, ERR_INVALID, "stop[%d]: invalid UTF-8 at byte %zu",
                               i, j);
            j += k;
        }
    }
    return 0;
}

int stop_init(struct stop_matcher *m, const char *const *stops, int n)
{
    int rc = stop_validate(stops, n, NULL, 0);
    if (rc)
        return rc;
    memset(m, 0, sizeof *m);
    m->matched = -1;
    m->n_stops = n;
    for (int i = 0; i < n; i++) {
        m->len[i] = (int)strlen(stops[i]);
        memcpy(m->str[i], stops[i], (size_t)m->len[i]);
        if (m->len[i] > m->max_len)
            m->max_len = m->len[i];
    }
    return 0;
}

/* First occurrence of needle[0, nl) in hay[0, hl), or SIZE_MAX. Stop strings are short
 * and deltas small, so the naive search is the right tool. */
static size_t find(const char *hay, size_t hl, const char *needle, size_t nl)
{
    if (nl > hl)
        return SIZE_MAX;
    for (size_t i = 0; i + nl <= hl; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, nl) == 0)
            return i;
    return SIZE_MAX;
}

/* Is w[0, k) a proper prefix (k < len) of some stop string? */
static bool is_partial(const struct stop_matcher *m, const char *w, size_t k)
{
    for (int i = 0; i < m->n_stops; i++)
        if ((size_t)m->len[i] > k && memcmp(w, m->str[i], k) == 0)
            return true;
    return false;
}

int stop_feed(struct stop_matcher *m, const char *delta, size_t len, char *out, size_t out_cap,
              size_t *n_out)
{
    if (!m || !n_out || (len > 0 && !delta) || !out)
        return ERR_INVALID;
    *n_out = 0;
    if (m->matched >= 0)
        return STOP_HIT;
    size_t n = (size_t)m->n_hold + len;
    if (out_cap < n)
        return ERR_RANGE;
    memcpy(out, m->hold, (size_t)m->n_hold);
    if (len > 0)
        memcpy(out + m->n_hold, delta, len);

    size_t best_end = SIZE_MAX, best_start = SIZE_MAX;
    for (int i = 0; i < m->n_stops; i++) {
        size_t pos = find(out, n, m->str[i], (size_t)m->len[i]);
        if (pos == SIZE_MAX)
            continue;
        size_t end = pos + (size_t)m->len[i];
        if (end < best_end || (end == best_end && pos < best_start)) {
            best_end = end;
            best_start = pos;
            m->matched = i;
        }
    }
    if (m->matched >= 0) {
        m->n_hold = 0;
        *n_out = best_start;
        return STOP_HIT;
    }

    size_t k = m->max_len > 0 ? (size_t)m->max_len - 1 : 0;
    if (k > n)
        k = n;
    for (; k > 0; k--)
        if (is_partial(m, out + n - k, k))
            break;
    memcpy(m->hold, out + n - k, k);
    m->n_hold = (int)k;
    *n_out = n - k;
    return STOP_CONTINUE;
}

int stop_flush(struct stop_matcher *m, char *out, size_t out_cap, size_t *n_out)
{
    if (!m || !n_out || !out)
        return ERR_INVALID;
    *n_out = 0;
    if (m->matched >= 0)
        return STOP_HIT;
    if (out_cap < (size_t)m->n_hold)
        return ERR_RANGE;
    memcpy(out, m->hold, (size_t)m->n_hold);
    *n_out = (size_t)m->n_hold;
    m->n_hold = 0;
    return STOP_CONTINUE;
}

int stop_matched(const struct stop_matcher *m) { return m->matched; }

const char *stop_matched_str(const struct stop_matcher *m, size_t *len)
{
    int i = stop_matched(m);
    *len = i >= 0 ? (size_t)m->len[i] : 0;
    return i >= 0 ? m->str[i] : NULL;
}

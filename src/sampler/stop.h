/* stop.h — stop-string matching over streamed text (OpenAI's `stop`).
 *
 * The engine feeds each detokenized text delta to stop_feed(); it says how many bytes may
 * be sent to the client now and whether a stop string has completed. Bytes that could
 * still be the start of a stop string are held back (at most STOP_MAX_LEN - 1 of them)
 * until the following text resolves them, so no part of a stop string is ever emitted,
 * even when it arrives split across deltas. stop_flush() releases the held bytes at the
 * end of generation (EOS, max_tokens).
 *
 * Semantics (the result does not depend on how the text is split into deltas):
 *   Let T be the concatenation of every delta fed so far. The text ends at the stop-string
 *   occurrence in T that *ends* first; among occurrences ending at the same byte, the one
 *   that starts first (the longest). Everything before that occurrence is emitted; the
 *   stop string and everything after it are not. Matching is on bytes (UTF-8 stop strings
 *   match exactly their bytes; no normalisation, case-sensitive).
 *   Examples, stops {"abc"}:     "xxabcyy"           → emits "xx", stop 0
 *                                "ab" | "ab" | "c!"  → "" | "ab" | "" , stop 0  (total "ab")
 *            stops {"b", "ab"}:  "xab"               → "x", stop 1 (both end at 'b'; "ab"
 *                                                       starts first)
 *            stops {"cd", "bcde"}: "abcde"           → "ab", stop 0 ("cd" ends first)
 *   After a stop, further feeds emit nothing and report the stop again; flush emits nothing.
 *
 * The struct is caller-owned (embed it in the request); no allocation. Not thread-safe:
 * one matcher per sequence, used by one thread at a time.
 */
#ifndef TESSERA_SAMPLER_STOP_H
#define TESSERA_SAMPLER_STOP_H

#include <stddef.h>

#define STOP_MAX_STRINGS 4 /* OpenAI's limit */
#define STOP_MAX_LEN 256   /* bytes per stop string, without the NUL */

/* stop_feed's non-error results */
enum { STOP_CONTINUE = 0, STOP_HIT = 1 };

struct stop_matcher {
    int n_stops;
    int max_len;                            /* longest stop string, 0 if none */
    int len[STOP_MAX_STRINGS];              /* (n_stops) byte length, 1..STOP_MAX_LEN */
    char str[STOP_MAX_STRINGS][STOP_MAX_LEN]; /* (n_stops, len[i]) not NUL-terminated */
    int n_hold;                             /* bytes in hold, < max_len */
    char hold[STOP_MAX_LEN];                /* unemitted tail of T: the longest suffix of T
                                               that is a proper prefix of a stop string */
    int matched;                            /* index of the stop string found, -1 if none */
};

/* Checks n stop strings: 0 <= n <= STOP_MAX_STRINGS, each non-empty, at most STOP_MAX_LEN
 * bytes, valid UTF-8 (so held-back text always starts on a character boundary). Returns 0,
 * or ERR_RANGE / ERR_INVALID with the reason ("stop[2]: ...") in err (may be NULL). */
int stop_validate(const char *const *stops, int n, char *err, size_t errlen);
/* Initialises m with copies of stops[0, n) (the caller keeps ownership of stops). n == 0
 * gives a matcher that passes everything through. Returns 0, or the stop_validate error,
 * leaving m unusable. Also the way to reuse a matcher for a new request. */
int stop_init(struct stop_matcher *m, const char *const *stops, int n);
/* Feeds delta[0, len) (any bytes, may be empty). Writes the bytes that may be emitted now
 * (held bytes released by this delta, then delta bytes) into the caller's out and their
 * count into *n_out. out_cap must be at least m->n_hold + len; STOP_MAX_LEN + len always
 * suffices. Returns STOP_CONTINUE, STOP_HIT (a stop string completed: out holds the text
 * before it; see stop_matched), or ERR_RANGE (out_cap too small; nothing consumed) /
 * ERR_INVALID (NULL argument). O(len * total stop length) worst case. */
int stop_feed(struct stop_matcher *m, const char *delta, size_t len, char *out, size_t out_cap,
              size_t *n_out);
/* End of generation without a stop: writes the held bytes (< STOP_MAX_LEN) into out and
 * their count into *n_out, and empties the hold. Returns STOP_CONTINUE, STOP_HIT (a stop
 * already completed; nothing written) or ERR_RANGE (out_cap < m->n_hold). */
int stop_flush(struct stop_matcher *m, char *out, size_t out_cap, size_t *n_out);
/* Index into the stops given to stop_init of the stop string that ended the text, or -1. */
int stop_matched(const struct stop_matcher *m);
/* The bytes of the stop string that ended the text (*len of them, not NUL-terminated), or
 * NULL with *len 0 when none did. For include_stop_str_in_output: the engine emits them
 * after the text before the stop. */
const char *stop_matched_str(const struct stop_matcher *m, size_t *len);

#endif

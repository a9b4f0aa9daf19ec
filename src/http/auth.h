/* auth.h — the API keys of the HTTP front end: constant-time matching, the per-key
 * request and token rate limits, and per-key counters (private to src/http/).
 *
 * The table is a list of slots that only grows: a slot holds one key NAME and, while the
 * name is configured, its key and limits. Replacing the key set (start-up, SIGHUP)
 * updates the slots of names that stay (their limiter state is kept), deactivates the
 * others (they never match again, but requests still running under them are counted)
 * and adds new names. So a slot index, taken when a request authenticates, stays valid
 * for the life of the table, whatever reloads happen meanwhile.
 *
 * Limits are token buckets: `rpm` requests per minute is a bucket of rpm that refills at
 * rpm/60 per second, and a metered request takes one; `tpm` tokens per minute is a bucket
 * of tpm that refills at tpm/60 per second, is charged the prompt + completion tokens of
 * each request when they are known (at its end) and admits a request while it is above
 * zero. A refused request is told when to retry.
 *
 * Threads: every function takes the table's mutex; any thread. The table is refcounted
 * (the server and each reply that may still report usage hold a reference).
 */
#ifndef TESSERA_HTTP_AUTH_H
#define TESSERA_HTTP_AUTH_H

#include "http/http.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AUTH_MAX_SLOTS 4096 /* distinct key names over the life of a server */

struct http_auth;

/* An empty table with one reference. NULL on allocation failure. */
struct http_auth *auth_create(void);
void auth_ref(struct http_auth *a);
void auth_unref(struct http_auth *a);

/* Replaces the active key set with keys[0, n) (copied). Names must be unique and valid
 * (http_key_name_valid), keys non-empty and unique. On error nothing changes and err
 * names the entry by its name (never by its key). */
int auth_set_keys(struct http_auth *a, const struct http_key *keys, int n, char *err,
                  size_t errlen);
/* Number of active keys (0: no authentication). */
int auth_active(struct http_auth *a);
/* The slot of the active key equal to key[0, len), or -1. Every byte of every active key
 * is visited, whatever the input. */
int auth_match(struct http_auth *a, const char *key, size_t len);
/* Counts a request under slot; when metered, applies its limits: returns 0 (admitted),
 * or 1 with *retry_after_s (> 0) and *limit ("rpm" / "tpm") when refused. now is
 * monotonic seconds. */
int auth_admit(struct http_auth *a, int slot, bool metered, double now, double *retry_after_s,
               const char **limit);
/* Charges tokens to slot's tpm bucket and counters. */
void auth_charge(struct http_auth *a, int slot, int prompt_tokens, int completion_tokens,
                 double now);
/* Copies slot's name into buf ("" for a bad slot). */
void auth_name(struct http_auth *a, int slot, char *buf, size_t cap);
/* Copies up to cap slots' counters (active or not) into out; returns the slot count. */
int auth_stats(struct http_auth *a, struct http_key_stats *out, int cap);

#endif

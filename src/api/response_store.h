/* response_store.h — the responses a server keeps for the Responses API: what
 * `previous_response_id` continues from, GET /v1/responses/{id} returns and DELETE
 * removes.
 *
 * In memory only (lost at restart, like vLLM's store), bounded by a byte budget: a new
 * entry pushes out the oldest ones until it fits. An entry is two JSON texts:
 *   response  the response object as the client got it ("object": "response")
 *   items     the conversation's items before that response's output: its previous
 *             response's items and output, then its own input items (a JSON array; its
 *             instructions are not in it, as they do not carry over)
 * so the next turn's conversation is items + response.output + its own input.
 * Ids are the server's random "resp_…" ids (143 bits): holding one is what gives access.
 *
 * Every function is thread-safe (one mutex; lookups copy out, nothing is borrowed).
 */
#ifndef TESSERA_API_RESPONSE_STORE_H
#define TESSERA_API_RESPONSE_STORE_H

#include <stddef.h>

struct resp_store;

/* A store of at most max_bytes (entry texts plus a small fixed overhead each); NULL on
 * OOM. */
struct resp_store *resp_store_create(size_t max_bytes);
void resp_store_free(struct resp_store *s);

/* Keeps copies of response and items under id (replacing an entry of that id), dropping
 * the oldest entries as needed. Returns 0, ERR_RANGE (the entry alone is larger than the
 * budget: nothing is kept, nothing dropped) or ERR_NOMEM. */
int resp_store_put(struct resp_store *s, const char *id, const char *response, const char *items);

/* Malloc'd copies of id's texts into *response and *items (either may be NULL: not
 * wanted). Returns 0, ERR_NOT_FOUND or ERR_NOMEM. */
int resp_store_get(struct resp_store *s, const char *id, char **response, char **items);

/* Removes id's entry. Returns 0 or ERR_NOT_FOUND. */
int resp_store_delete(struct resp_store *s, const char *id);

/* The number of entries and the bytes they count against the budget. */
void resp_store_usage(struct resp_store *s, int *n_entries, size_t *bytes);

#endif

/* response_items.h — GET /v1/responses/{id}/input_items: the conversation items a stored
 * response was made from (its previous responses' input and output items, then its own
 * input: api/response_store.h's items text), as OpenAI's list object
 *   {"object": "list", "data": [items], "first_id", "last_id", "has_more"}
 * paged by item id.
 *
 * Items are shown as the Responses API types them, whatever shape they were sent in:
 * a message's string content becomes one input_text part (output_text with annotations
 * for an assistant message), and messages, calls and call outputs carry "status":
 * "completed". Stored input items have ids (api/openai_responses.c gives them when
 * storing; output items have theirs).
 */
#ifndef TESSERA_API_RESPONSE_ITEMS_H
#define TESSERA_API_RESPONSE_ITEMS_H

#include "api/error.h"

#include <stdbool.h>
#include <stddef.h>

/* The list's query: ?order=asc|desc (default desc: the newest item first), limit=1..100
 * (default 20), after=ITEM_ID (the items following that one in this order). Other keys
 * (include) are accepted and ignored. */
struct resp_items_query {
    bool asc;
    int limit;
    char after[128];          /* "" when not given */
};

/* Parses the raw query string (no '?'; percent-escapes decoded). Returns 0, or
 * ERR_INVALID with e naming the parameter. */
int resp_items_query_parse(const char *query, struct resp_items_query *q, struct api_error *e);

/* The list for the stored items text (a JSON array) under q: malloc'd JSON text into
 * *out. Returns 0, ERR_INVALID (e: 'after' names no item of this response) or ERR_NOMEM
 * (e set). */
int resp_items_list(const char *items, const struct resp_items_query *q, char **out, struct api_error *e);

#endif

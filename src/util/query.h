/* query.h — one value of a URL query string ("a=1&b=x%20y"): the HTTP front end hands
 * handlers the raw query, and the few endpoints that read one (GET /v1/responses/{id}
 * and its input_items) take their parameters with this.
 */
#ifndef TESSERA_UTIL_QUERY_H
#define TESSERA_UTIL_QUERY_H

#include <stddef.h>

/* The value of the first key=value pair named key in query (no leading '?'; NULL is
 * empty), decoded ('+' is a space, %XX a byte), into out (cap bytes, NUL-terminated; a key
 * without '=' has the value ""). Returns 1 when found, 0 when absent, -1 when the value
 * does not fit or decodes to a NUL byte (out is then ""). */
int query_get(const char *query, const char *key, char *out, size_t cap);

#endif

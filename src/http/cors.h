/* cors.h — Cross-Origin Resource Sharing for browser clients (a web page calling the API
 * with fetch / the OpenAI JavaScript SDK), as the Fetch standard defines it and as
 * vLLM's --allowed-origins / --allowed-methods / --allowed-headers / --allow-credentials
 * configure it (Starlette's CORSMiddleware).
 *
 * Off unless origins are configured: a page on any other site cannot read this server's
 * answers (a server on 127.0.0.1 is otherwise open to every page the user visits). vLLM
 * allows every origin by default; "*" here gives its behaviour.
 *
 * Two cases, both decided from request headers only, so that http.c can answer before
 * authentication (a browser's preflight never carries the API key):
 *   - a preflight: OPTIONS with Origin and Access-Control-Request-Method, on a path the
 *     server serves. Allowed when the origin is, the requested method is one the path
 *     serves and the configured methods hold, and every requested header is configured
 *     (or CORS-safelisted: Accept, Accept-Language, Content-Language, Content-Type).
 *   - any other request with an allowed Origin: its response (errors and streams too)
 *     says which origin may read it.
 * Pure functions over borrowed strings; any thread.
 */
#ifndef TESSERA_HTTP_CORS_H
#define TESSERA_HTTP_CORS_H

#include <stdbool.h>
#include <stddef.h>

struct http_cors {
    const char *const *origins; /* [n_origins] exact Origin values, or "*" (any); none: off */
    int n_origins;
    const char *const *methods; /* [n_methods]; none or "*": every method a path serves */
    int n_methods;
    const char *const *headers; /* [n_headers] request header names; none or "*": any */
    int n_headers;
    bool credentials;           /* Access-Control-Allow-Credentials: true (the origin is
                                   then named, never "*") */
};

#define CORS_MAX_HEADERS 7 /* response headers one call adds, at most */

/* Response headers for a request with Origin origin (NULL: none): "Name: value" strings
 * written into buf[cap], pointers in out[CORS_MAX_HEADERS + 1], NULL-terminated. None when
 * CORS is off or the origin is not allowed. Returns how many. */
int cors_response_headers(const struct http_cors *c, const char *origin, char *buf, size_t cap,
                          const char **out);

/* A preflight for a path serving path_methods ("POST", "GET, DELETE"): origin, the
 * Access-Control-Request-Method and the Access-Control-Request-Headers (NULL: none).
 * Allowed: returns true with the response headers in out as above (allowed origin,
 * methods, headers, max age). Refused: false, with the reason in err. */
bool cors_preflight(const struct http_cors *c, const char *origin, const char *method,
                    const char *req_headers, const char *path_methods, char *buf, size_t cap,
                    const char **out, char *err, size_t errlen);

#endif

/* error.h — every error body the server sends, in OpenAI's shape:
 *   {"error":{"message":"...","type":"invalid_request_error","param":null|"x","code":null|"y"}}
 * and the one table that maps the project's error codes (util/err.h) to an HTTP status,
 * an OpenAI error type and code. No allocation beyond the returned string; any thread.
 */
#ifndef TESSERA_API_ERROR_H
#define TESSERA_API_ERROR_H

#include <stddef.h>

/* An error on its way to the client. */
struct api_error {
    int status;           /* HTTP status: 400, 401, 404, 405, 413, 415, 429, 500, 503 */
    const char *type;     /* "invalid_request_error", "authentication_error", ... (static) */
    const char *code;     /* NULL or "context_length_exceeded", "invalid_api_key",
                             "model_not_found", "rate_limit_exceeded", ... (static) */
    char param[64];       /* "" → null; else the offending parameter ("messages[1].role") */
    char message[512];
};

/* OpenAI error types */
#define API_ERR_INVALID_REQUEST "invalid_request_error"
#define API_ERR_AUTHENTICATION "authentication_error"
#define API_ERR_NOT_FOUND "not_found_error"
#define API_ERR_RATE_LIMIT "rate_limit_error"     /* 429 */
#define API_ERR_SERVER "server_error"             /* 500 */
#define API_ERR_OVERLOADED "service_unavailable"  /* 503 */

/* Fills e from a project error code (util/err.h) and a message:
 *   ERR_INVALID/FORMAT/UNSUPPORTED → 400 invalid_request_error
 *   ERR_RANGE        → 400 invalid_request_error (code given by the caller, e.g.
 *                      "context_length_exceeded"; NULL otherwise)
 *   ERR_NOT_FOUND    → 404 not_found_error
 *   ERR_BUSY         → 429 rate_limit_error, code "rate_limit_exceeded"
 *   ERR_UNAVAILABLE  → 503 service_unavailable
 *   ERR_NOMEM/IO/other → 500 server_error
 * param may be NULL. Returns e. */
struct api_error *api_error_from_code(struct api_error *e, int err_code, const char *param,
                                      const char *code, const char *message);
/* Fills e with explicit fields (param/code may be NULL); message is printf-formatted. */
struct api_error *api_error_set(struct api_error *e, int status, const char *type,
                                const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* The JSON body for e (malloc'd, NUL-terminated; caller frees). NULL only on OOM. */
char *api_error_json(const struct api_error *e);
/* Same, from loose fields (param/code may be NULL). */
char *api_error_json_fields(const char *message, const char *type, const char *param,
                            const char *code);

#endif

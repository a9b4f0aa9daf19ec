/* err.h — the project's error convention.
 *
 * Functions that can fail return 0 on success or a negative ERR_* code, and write a
 * human-readable reason into a caller-owned buffer (char *err, size_t errlen).
 * ERR_BUF is a good size for such buffers. Nothing reachable from user input
 * calls exit() or abort().
 */
#ifndef TESSERA_UTIL_ERR_H
#define TESSERA_UTIL_ERR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ERR_BUF 512

enum err_code {
    ERR_OK = 0,
    ERR_IO = -1,        /* open/read/mmap failed */
    ERR_FORMAT = -2,    /* malformed, truncated or lying file / input */
    ERR_UNSUPPORTED = -3, /* valid but not supported (tensor type, architecture, ...) */
    ERR_NOMEM = -4,     /* allocation failed */
    ERR_INVALID = -5,   /* bad argument or request parameter */
    ERR_NOT_FOUND = -6, /* missing key, tensor or file */
    ERR_RANGE = -7,     /* value out of bounds */
    ERR_BUSY = -8,      /* queue full: try again later (HTTP 429) */
    ERR_UNAVAILABLE = -9, /* shutting down / draining / not ready (HTTP 503) */
};

/* Formats a message into err (if err != NULL) and returns code, so callers can write
 * `return err_set(err, errlen, ERR_FORMAT, "%s: bad magic", path);` */
int err_set(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Short name of an error code ("format", "io", ...). */
const char *err_name(int code);

#ifdef __cplusplus
}
#endif

#endif

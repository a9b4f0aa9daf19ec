/* err.c — error message formatting (see err.h). */
#include "util/err.h"

#include <stdarg.h>
#include <stdio.h>

int err_set(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

const char *err_name(int code)
{
    switch (code) {
    case ERR_OK: return "ok";
    case ERR_IO: return "io";
    case ERR_FORMAT: return "format";
    case ERR_UNSUPPORTED: return "unsupported";
    case ERR_NOMEM: return "nomem";
    case ERR_INVALID: return "invalid";
    case ERR_NOT_FOUND: return "not_found";
    case ERR_RANGE: return "range";
    case ERR_BUSY: return "busy";
    case ERR_UNAVAILABLE: return "unavailable";
    default: return "unknown";
    }
}

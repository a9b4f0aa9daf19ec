/* query.c — URL query values (query.h). */
#include "util/query.h"

#include <stdbool.h>
#include <string.h>

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes src[0, n) into out (cap bytes); false when it does not fit or holds a NUL. */
static bool decode(const char *src, size_t n, char *out, size_t cap)
{
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)src[i];
        if (c == '+') {
            c = ' ';
        } else if (c == '%' && i + 2 < n && hexval(src[i + 1]) >= 0 && hexval(src[i + 2]) >= 0) {
            c = hexval(src[i + 1]) * 16 + hexval(src[i + 2]);
            i += 2;
        }
        if (c == 0 || j + 1 >= cap) return false;
        out[j++] = (char)c;
    }
    out[j] = 0;
    return true;
}

int query_get(const char *query, const char *key, char *out, size_t cap)
{
    size_t klen = strlen(key);
    if (cap > 0) out[0] = 0;
    for (const char *p = query ? query : ""; *p;) {
        const char *amp = strchr(p, '&'), *end = amp ? amp : p + strlen(p);
        const char *eq = memchr(p, '=', (size_t)(end - p)), *kend = eq ? eq : end;
        if ((size_t)(kend - p) == klen && !strncmp(p, key, klen)) {
            const char *val = eq ? eq + 1 : end;
            if (cap > 0 && decode(val, (size_t)(end - val), out, cap)) return 1;
            if (cap > 0) out[0] = 0;
            return -1;
        }
        p = amp ? amp + 1 : end;
    }
    return 0;
}

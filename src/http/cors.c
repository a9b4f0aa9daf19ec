/* cors.c — Cross-Origin Resource Sharing decisions and headers (see cors.h). */
#define _POSIX_C_SOURCE 200809L
#include "http/cors.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define CORS_MAX_AGE_S 600 /* how long a browser may cache a preflight's answer */

/* Request headers a browser may send without asking (the Fetch standard's safelist). */
static const char *const safelisted[] = { "Accept", "Accept-Language", "Content-Language", "Content-Type" };

/* Does v[0, n) hold s (icase: compared case-insensitively)? */
static bool list_has(const char *const *v, int n, const char *s, size_t len, bool icase)
{
    for (int i = 0; i < n; i++)
        if (strlen(v[i]) == len && (icase ? strncasecmp(v[i], s, len) : strncmp(v[i], s, len)) == 0) return true;
    return false;
}

/* An empty list or one holding "*" allows anything. */
static bool list_any(const char *const *v, int n) { return n == 0 || list_has(v, n, "*", 1, false); }

/* The next comma-separated token of *p, trimmed: *tok and *len; false at the end. */
static bool next_token(const char **p, const char **tok, size_t *len)
{
    const char *s = *p;
    while (*s == ' ' || *s == '\t' || *s == ',') s++;
    if (!*s) return false;
    const char *e = s;
    while (*e && *e != ',') e++;
    *p = e;
    while (e > s && (e[-1] == ' ' || e[-1] == '\t')) e--;
    *tok = s;
    *len = (size_t)(e - s);
    return true;
}

static bool origin_allowed(const struct http_cors *c, const char *origin)
{
    return origin && c->n_origins > 0 &&
           (list_has(c->origins, c->n_origins, "*", 1, false) ||
            list_has(c->origins, c->n_origins, origin, strlen(origin), false));
}

/* Writes "Name: value" strings into a caller's buffer. */
struct hdr_writer {
    char *buf;
    size_t cap, len;
    const char **out;
    int n;
    bool overflow;
};

static void hdr_add(struct hdr_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void hdr_add(struct hdr_writer *w, const char *fmt, ...)
{
    if (w->overflow || w->n >= CORS_MAX_HEADERS) {
        w->overflow = true;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(w->buf + w->len, w->cap - w->len, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= w->cap - w->len) {
        w->overflow = true;
        return;
    }
    w->out[w->n++] = w->buf + w->len;
    w->out[w->n] = NULL;
    w->len += (size_t)k + 1;
}

/* Allow-Origin (the origin itself, with Vary, unless "*" may be said) and credentials. */
static void add_origin_headers(const struct http_cors *c, const char *origin, struct hdr_writer *w)
{
    if (list_has(c->origins, c->n_origins, "*", 1, false) && !c->credentials) {
        hdr_add(w, "Access-Control-Allow-Origin: *");
    } else {
        hdr_add(w, "Access-Control-Allow-Origin: %s", origin);
        hdr_add(w, "Vary: Origin");
    }
    if (c->credentials) hdr_add(w, "Access-Control-Allow-Credentials: true");
}

int cors_response_headers(const struct http_cors *c, const char *origin, char *buf, size_t cap,
                          const char **out)
{
    struct hdr_writer w = { buf, cap, 0, out, 0, false };
    out[0] = NULL;
    if (!origin_allowed(c, origin)) return 0;
    add_origin_headers(c, origin, &w);
    if (w.overflow) {
        out[0] = NULL;
        return 0;
    }
    return w.n;
}

/* Is the requested header name[0, len) allowed? */
static bool header_allowed(const struct http_cors *c, const char *name, size_t len)
{
    return list_any(c->headers, c->n_headers) || list_has(c->headers, c->n_headers, name, len, true) ||
           list_has(safelisted, (int)(sizeof safelisted / sizeof safelisted[0]), name, len, true);
}

bool cors_preflight(const struct http_cors *c, const char *origin, const char *method,
                    const char *req_headers, const char *path_methods, char *buf, size_t cap,
                    const char **out, char *err, size_t errlen)
{
    out[0] = NULL;
    if (!origin_allowed(c, origin)) {
        snprintf(err, errlen, "CORS: origin '%s' is not allowed (--allowed-origins)", origin ? origin : "");
        return false;
    }
    bool served = false;
    const char *p = path_methods, *tok;
    size_t len;
    while (next_token(&p, &tok, &len)) served |= strlen(method) == len && !strncmp(tok, method, len);
    if (!served || !(list_any(c->methods, c->n_methods) ||
                     list_has(c->methods, c->n_methods, method, strlen(method), false))) {
        snprintf(err, errlen, "CORS: method '%s' is not allowed here (allowed: %s)", method, path_methods);
        return false;
    }
    for (p = req_headers ? req_headers : ""; next_token(&p, &tok, &len);)
        if (!header_allowed(c, tok, len)) {
            snprintf(err, errlen, "CORS: request header '%.*s' is not allowed (--allowed-headers)",
                     (int)(len < 64 ? len : 64), tok);
            return false;
        }

    struct hdr_writer w = { buf, cap, 0, out, 0, false };
    add_origin_headers(c, origin, &w);
    if (list_any(c->methods, c->n_methods)) {
        hdr_add(&w, "Access-Control-Allow-Methods: %s", path_methods);
    } else { /* the path's methods that are configured */
        char m[128] = "";
        for (p = path_methods; next_token(&p, &tok, &len);)
            if (list_has(c->methods, c->n_methods, tok, len, false))
                snprintf(m + strlen(m), sizeof m - strlen(m), "%s%.*s", m[0] ? ", " : "", (int)len, tok);
        hdr_add(&w, "Access-Control-Allow-Methods: %s", m);
    }
    if (list_any(c->headers, c->n_headers)) {
        if (req_headers && *req_headers) hdr_add(&w, "Access-Control-Allow-Headers: %s", req_headers);
    } else {
        char h[512] = "";
        for (int i = 0; i < c->n_headers; i++)
            snprintf(h + strlen(h), sizeof h - strlen(h), "%s%s", i ? ", " : "", c->headers[i]);
        hdr_add(&w, "Access-Control-Allow-Headers: %s", h);
    }
    hdr_add(&w, "Access-Control-Max-Age: %d", CORS_MAX_AGE_S);
    if (w.overflow) {
        out[0] = NULL;
        snprintf(err, errlen, "CORS: the preflight's headers are too long");
        return false;
    }
    return true;
}

/* test_cors.c — http/cors.h: which origins, methods and headers a browser is allowed,
 * and the exact headers of the answers (the HTTP side is in test_http.c). */
#include "test.h"
#include "http/cors.h"

#include <string.h>

/* Index of header "Name: value" in h (name compared case-sensitively), or -1. */
static int find(const char **h, const char *line)
{
    for (int i = 0; h[i]; i++)
        if (!strcmp(h[i], line)) return i;
    return -1;
}

static int count(const char **h)
{
    int n = 0;
    while (h[n]) n++;
    return n;
}

static void test_off_by_default(void)
{
    struct http_cors c = { 0 };
    char buf[512], err[128];
    const char *h[CORS_MAX_HEADERS + 1];
    CHECK(cors_response_headers(&c, "http://a", buf, sizeof buf, h) == 0 && h[0] == NULL, "no origins: none");
    CHECK(!cors_preflight(&c, "http://a", "POST", NULL, "POST", buf, sizeof buf, h, err, sizeof err) &&
              strstr(err, "origin 'http://a' is not allowed"),
          "no origins: preflight refused: %s", err);
}

static void test_any_origin(void)
{
    const char *any[] = { "*" };
    struct http_cors c = { .origins = any, .n_origins = 1 };
    char buf[512], err[128];
    const char *h[CORS_MAX_HEADERS + 1];
    CHECK(cors_response_headers(&c, "https://x.example", buf, sizeof buf, h) == 1 &&
              !strcmp(h[0], "Access-Control-Allow-Origin: *"),
          "any origin: '*'");
    CHECK(cors_response_headers(&c, NULL, buf, sizeof buf, h) == 0, "no Origin header: none");
    /* requested headers reflected; the path's methods */
    CHECK(cors_preflight(&c, "https://x.example", "DELETE", "Authorization, X-Stainless-Os", "GET, DELETE", buf,
                         sizeof buf, h, err, sizeof err),
          "preflight: %s", err);
    CHECK(find(h, "Access-Control-Allow-Origin: *") >= 0 && find(h, "Access-Control-Allow-Methods: GET, DELETE") >= 0 &&
              find(h, "Access-Control-Allow-Headers: Authorization, X-Stainless-Os") >= 0 &&
              find(h, "Access-Control-Max-Age: 600") >= 0 && count(h) == 4,
          "preflight headers (%d)", count(h));
    CHECK(!cors_preflight(&c, "https://x.example", "PUT", NULL, "GET, DELETE", buf, sizeof buf, h, err, sizeof err) &&
              strstr(err, "method 'PUT'") && strstr(err, "allowed: GET, DELETE"),
          "a method the path does not serve: %s", err);
    CHECK(!cors_preflight(&c, "https://x.example", "GE", NULL, "GET", buf, sizeof buf, h, err, sizeof err),
          "a method's prefix is not the method");
    /* credentials: the origin is named, never "*" */
    c.credentials = true;
    CHECK(cors_response_headers(&c, "https://x.example", buf, sizeof buf, h) == 3 &&
              find(h, "Access-Control-Allow-Origin: https://x.example") >= 0 && find(h, "Vary: Origin") >= 0 &&
              find(h, "Access-Control-Allow-Credentials: true") >= 0,
          "credentials");
}

static void test_listed(void)
{
    const char *origins[] = { "http://localhost:3000", "https://app.example" };
    const char *methods[] = { "POST" };
    const char *headers[] = { "Authorization", "X-Api-Key" };
    struct http_cors c = { .origins = origins, .n_origins = 2, .methods = methods, .n_methods = 1,
                           .headers = headers, .n_headers = 2 };
    char buf[512], err[128];
    const char *h[CORS_MAX_HEADERS + 1];
    CHECK(cors_response_headers(&c, "https://app.example", buf, sizeof buf, h) == 2 &&
              find(h, "Access-Control-Allow-Origin: https://app.example") >= 0 && find(h, "Vary: Origin") >= 0,
          "a listed origin is named");
    CHECK(cors_response_headers(&c, "https://app.example.evil", buf, sizeof buf, h) == 0, "exact match only");
    CHECK(cors_response_headers(&c, "HTTP://LOCALHOST:3000", buf, sizeof buf, h) == 0, "case-sensitive");
    /* header names case-insensitively, safelisted ones always */
    CHECK(cors_preflight(&c, "http://localhost:3000", "POST", " authorization ,content-type,, X-API-KEY", "POST",
                         buf, sizeof buf, h, err, sizeof err),
          "listed + safelisted headers: %s", err);
    CHECK(find(h, "Access-Control-Allow-Headers: Authorization, X-Api-Key") >= 0 &&
              find(h, "Access-Control-Allow-Methods: POST") >= 0,
          "configured lists answered");
    CHECK(!cors_preflight(&c, "http://localhost:3000", "POST", "authorization, x-secret", "POST", buf, sizeof buf, h,
                          err, sizeof err) &&
              strstr(err, "'x-secret'"),
          "unlisted header: %s", err);
    CHECK(!cors_preflight(&c, "http://localhost:3000", "GET", NULL, "GET", buf, sizeof buf, h, err, sizeof err) &&
              strstr(err, "method 'GET'"),
          "a served method that is not configured: %s", err);
    /* too small a buffer: refused, not truncated */
    CHECK(!cors_preflight(&c, "http://localhost:3000", "POST", NULL, "POST", buf, 40, h, err, sizeof err) &&
              h[0] == NULL && strstr(err, "too long"),
          "overflow: %s", err);
}

int main(void)
{
    RUN(test_off_by_default);
    RUN(test_any_origin);
    RUN(test_listed);
    return test_summary();
}

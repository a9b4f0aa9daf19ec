/* test_http.c — http/: the libmicrohttpd front end, over real sockets on 127.0.0.1.
 *
 * A server with test routes (immediate JSON, deferred answers and streams written from
 * other threads, replies that never write) and a small blocking HTTP/1.1 client with
 * chunked decoding. Checks routing and error bodies, limits, authentication, streaming
 * order and incrementality, SSE keep-alive comments, disconnect detection, HTTP
 * keep-alive, many concurrent streams, and a clean stop with live suspended replies.
 */
#define _GNU_SOURCE
#include "test.h"
#include "http/http.h"
#include "util/log.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* Waits up to timeout_s for *v >= want; returns whether it got there. */
static bool wait_atomic(atomic_int *v, int want, double timeout_s)
{
    double end = now_s() + timeout_s;
    while (atomic_load(v) < want) {
        if (now_s() > end) return false;
        sleep_ms(5);
    }
    return true;
}

/* ------------------------------------------------------------------ the application */

static atomic_int g_workers;   /* live worker threads */
static atomic_int g_closed;    /* on_close calls */
static atomic_int g_deferred;  /* replies deferred by the silent routes */
static atomic_int g_gate;      /* the gated stream writes piece i once g_gate >= i */
static struct http_reply *g_held; /* a reply the application keeps past server stop */

struct job {
    struct http_reply *r;
    int pieces;
    int delay_ms;
    bool gated;
};

static void respond_text(struct http_conn *c, const char *s)
{
    http_respond(c, 200, "text/plain", s, strlen(s), NULL);
}

static void h_health(void *ud, const struct http_request *req)
{
    (void)ud;
    respond_text(req->conn, "ok");
}

static void h_models(void *ud, const struct http_request *req)
{
    (void)ud;
    const char *body = "{\"object\":\"list\",\"data\":[]}";
    const char *extra[] = { "X-Test: yes", NULL };
    http_respond(req->conn, 200, "application/json", body, strlen(body), extra);
}

/* Echoes the body; path, query and request id in headers. */
static void h_echo(void *ud, const struct http_request *req)
{
    (void)ud;
    char path[300], query[300], id[64];
    snprintf(path, sizeof path, "X-Path: %s", req->path);
    snprintf(query, sizeof query, "X-Query: %s", req->query);
    snprintf(id, sizeof id, "X-Body-Len: %zu", req->body_len);
    const char *extra[] = { path, query, id, NULL };
    http_respond(req->conn, 200, "application/json", req->body, req->body_len, extra);
}

static void h_noanswer(void *ud, const struct http_request *req)
{
    (void)ud;
    (void)req;
}

static void *deferred_worker(void *arg)
{
    struct job *j = arg;
    sleep_ms(j->delay_ms);
    const char *body = "{\"deferred\":true}";
    http_reply_set_usage(j->r, 3, 4, 0.01);
    http_reply_send(j->r, 200, "application/json", body, strlen(body), NULL);
    free(j);
    atomic_fetch_sub(&g_workers, 1);
    return NULL;
}

/* Answers at once, and charges 3 + 4 tokens through a meter 30 ms after (a background
 * job's way). */
static void *metered_later_worker(void *arg)
{
    struct job *j = arg;
    struct http_meter *m = NULL;
    int rc = http_reply_meter(j->r, &m);
    const char *body = rc ? "{\"meter\":false}" : "{\"meter\":true}";
    http_reply_send(j->r, 200, "application/json", body, strlen(body), NULL);
    sleep_ms(30);
    http_meter_charge(m, 3, 4);
    http_meter_free(m);
    free(j);
    atomic_fetch_sub(&g_workers, 1);
    return NULL;
}

static void *stream_worker(void *arg)
{
    struct job *j = arg;
    for (int i = 0; i < j->pieces; i++) {
        if (j->gated) {
            double end = now_s() + 3;
            while (atomic_load(&g_gate) < i && now_s() < end) sleep_ms(1);
        } else if (j->delay_ms) {
            sleep_ms(j->delay_ms);
        }
        char piece[64];
        int n = snprintf(piece, sizeof piece, "data: %d\n\n", i);
        if (!http_reply_write(j->r, piece, (size_t)n)) break;
    }
    http_reply_set_usage(j->r, 5, j->pieces, 0.002);
    http_reply_end(j->r);
    free(j);
    atomic_fetch_sub(&g_workers, 1);
    return NULL;
}

/* Starts worker(job) on a detached thread; answers 500 if it cannot. */
static void start_worker(const struct http_request *req, bool streaming, int pieces,
                         int delay_ms, bool gated, void *(*worker)(void *))
{
    struct job *j = calloc(1, sizeof *j);
    j->r = http_reply_defer(req->conn, streaming, NULL, NULL);
    j->pieces = pieces;
    j->delay_ms = delay_ms;
    j->gated = gated;
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    atomic_fetch_add(&g_workers, 1);
    if (pthread_create(&t, &a, worker, j) != 0) {
        atomic_fetch_sub(&g_workers, 1);
        http_reply_send(j->r, 500, "text/plain", "no thread", 9, NULL);
        free(j);
    }
    pthread_attr_destroy(&a);
}

static void h_deferred(void *ud, const struct http_request *req)
{
    (void)ud;
    start_worker(req, false, 0, 200, false, deferred_worker);
}

static void h_metered_later(void *ud, const struct http_request *req)
{
    (void)ud;
    start_worker(req, false, 0, 0, false, metered_later_worker);
}

static void h_stream_fast(void *ud, const struct http_request *req)
{
    (void)ud;
    start_worker(req, true, 10, 5, false, stream_worker);
}

static void h_stream_burst(void *ud, const struct http_request *req)
{
    (void)ud;
    start_worker(req, true, 300, 0, false, stream_worker);
}

static void h_busy(void *ud, const struct http_request *req)
{
    (void)ud;
    const char *extra[] = { "Retry-After: 1", NULL };
    http_respond_error(req->conn, 429, "Too many requests: the queue is full",
                       "rate_limit_error", "model", "rate_limit_exceeded", extra);
}

static void h_stream_gated(void *ud, const struct http_request *req)
{
    (void)ud;
    start_worker(req, true, 3, 0, true, stream_worker);
}

/* The silent routes never write; on_close ends the reply (as an engine would on
 * cancellation) and frees the job. */
static void silent_closed(void *ud)
{
    struct job *j = ud;
    /* the client is gone: writes fail from now on */
    if (j->gated) { /* streaming */
        CHECK(!http_reply_write(j->r, "x", 1), "write after close succeeded");
        http_reply_end(j->r);
    } else {
        http_reply_send(j->r, 500, "text/plain", "gone", 4, NULL);
    }
    free(j);
    atomic_fetch_add(&g_closed, 1);
}

static void h_silent(void *ud, const struct http_request *req)
{
    bool streaming = ud != NULL;
    struct job *j = calloc(1, sizeof *j);
    j->gated = streaming; /* reused as "streaming" */
    j->r = http_reply_defer(req->conn, streaming, silent_closed, j);
    atomic_fetch_add(&g_deferred, 1);
}

static atomic_int g_held_closed;
static void held_closed(void *ud)
{
    (void)ud;
    atomic_fetch_add(&g_held_closed, 1);
}

static void h_held(void *ud, const struct http_request *req)
{
    (void)ud;
    g_held = http_reply_defer(req->conn, true, held_closed, NULL);
    atomic_fetch_add(&g_deferred, 1);
}

/* Flood: writes 1 KiB pieces until a write fails (the client reads nothing), then ends;
 * records how much it wrote and whether on_close came. */
static atomic_long g_flood_bytes;
static atomic_int g_flood_done, g_flood_closed;
static struct http_reply *g_flood_reply;

static void flood_closed(void *ud)
{
    (void)ud;
    atomic_fetch_add(&g_flood_closed, 1);
}

static void *flood_worker(void *arg)
{
    (void)arg;
    char piece[1024];
    memset(piece, 'x', sizeof piece);
    memcpy(piece, "data: ", 6);
    piece[sizeof piece - 2] = piece[sizeof piece - 1] = '\n';
    long total = 0;
    while (total < (64L << 20) && http_reply_write(g_flood_reply, piece, sizeof piece))
        total += (long)sizeof piece;
    atomic_store(&g_flood_bytes, total);
    /* wait for on_close before ending, as an engine would (on_close must not run after end) */
    double end = now_s() + 5;
    while (!atomic_load(&g_flood_closed) && now_s() < end) sleep_ms(5);
    http_reply_end(g_flood_reply);
    atomic_store(&g_flood_done, 1);
    atomic_fetch_sub(&g_workers, 1);
    return NULL;
}

static void h_flood(void *ud, const struct http_request *req)
{
    (void)ud;
    g_flood_reply = http_reply_defer(req->conn, true, flood_closed, NULL);
    pthread_t t;
    atomic_fetch_add(&g_workers, 1);
    pthread_create(&t, NULL, flood_worker, NULL);
    pthread_detach(t);
}

/* Late stream: deferred as non-streaming; a worker decides later that it is a stream
 * (what a server does after parsing the body on another thread). */
static void *late_stream_worker(void *arg)
{
    struct job *j = arg;
    sleep_ms(j->delay_ms);
    bool ok = http_reply_start_stream(j->r);
    CHECK(ok, "start_stream refused");
    CHECK(!http_reply_start_stream(j->r), "start_stream twice accepted");
    for (int i = 0; i < j->pieces; i++) {
        char piece[64];
        int n = snprintf(piece, sizeof piece, "data: late %d\n\n", i);
        http_reply_write(j->r, piece, (size_t)n);
        sleep_ms(20);
    }
    http_reply_end(j->r);
    free(j);
    atomic_fetch_sub(&g_workers, 1);
    return NULL;
}

static void h_late_stream(void *ud, const struct http_request *req)
{
    /* ud: start at once (while the handler still runs) or after 100 ms */
    start_worker(req, false, 3, ud ? 0 : 100, false, late_stream_worker);
}

static int g_streaming_flag = 1;

static const struct http_route g_routes[] = {
    { "GET", "/health", h_health, NULL, HTTP_ROUTE_PUBLIC },
    { "GET", "/v1/models", h_models, NULL, 0 },
    { "DELETE", "/v1/models", h_models, NULL, 0 },
    { "POST", "/private", h_echo, NULL, 0 },
    { "POST", "/echo", h_echo, NULL, HTTP_ROUTE_PUBLIC },
    { "GET", "/echo", h_echo, NULL, HTTP_ROUTE_PUBLIC },
    { "GET", "/echo", h_echo, NULL, HTTP_ROUTE_PUBLIC | HTTP_ROUTE_SUBPATHS },
    { "GET", "/noanswer", h_noanswer, NULL, HTTP_ROUTE_PUBLIC },
    { "POST", "/deferred", h_deferred, NULL, HTTP_ROUTE_PUBLIC },
    { "POST", "/stream", h_stream_fast, NULL, HTTP_ROUTE_PUBLIC },
    { "POST", "/stream-gated", h_stream_gated, NULL, HTTP_ROUTE_PUBLIC },
    { "POST", "/stream-burst", h_stream_burst, NULL, HTTP_ROUTE_PUBLIC },
    { "GET", "/busy", h_busy, NULL, HTTP_ROUTE_PUBLIC },
    { "POST", "/silent", h_silent, &g_streaming_flag, HTTP_ROUTE_PUBLIC },
    { "POST", "/silent-json", h_silent, NULL, HTTP_ROUTE_PUBLIC },
    { "POST", "/held", h_held, NULL, HTTP_ROUTE_PUBLIC },
    { "POST", "/flood", h_flood, NULL, HTTP_ROUTE_PUBLIC },
    { "POST", "/late-stream", h_late_stream, NULL, HTTP_ROUTE_PUBLIC },
    { "POST", "/late-stream-now", h_late_stream, &g_streaming_flag, HTTP_ROUTE_PUBLIC },
    { "POST", "/metered", h_deferred, NULL, HTTP_ROUTE_METERED },
    { "POST", "/metered-later", h_metered_later, NULL, HTTP_ROUTE_METERED },
};
#define N_ROUTES ((int)(sizeof g_routes / sizeof g_routes[0]))

static const struct http_key g_keys[] = {
    { .name = "one", .key = "sk-one" },
    { .name = "second", .key = "sk-second-key" },
    { .name = "limited", .key = "sk-limited", .rpm = 2 },
    { .name = "tokens", .key = "sk-tokens", .tpm = 5 },
    { .name = "later", .key = "sk-later", .tpm = 5 },
};
#define N_KEYS 5
static struct http_server *g_srv;
static int g_port;

/* ------------------------------------------------------------------ the client */

struct cli {
    int fd;
    char buf[16384];
    size_t head, len; /* unread bytes: buf[head, head+len) */
};

struct resp {
    int status;
    char head[16384]; /* status line and headers */
    char *body;       /* malloc'd, NUL-terminated, de-chunked */
    size_t body_len;
};

static bool cli_open(struct cli *c, int port)
{
    c->head = c->len = 0;
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (c->fd < 0) return false;
    struct timeval tv = { 5, 0 };
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(c->fd);
        c->fd = -1;
        return false;
    }
    return true;
}

static void cli_close(struct cli *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

static bool cli_send(struct cli *c, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = send(c->fd, s, n, MSG_NOSIGNAL);
        if (w <= 0) return false;
        s += w;
        n -= (size_t)w;
    }
    return true;
}

static bool cli_sends(struct cli *c, const char *s) { return cli_send(c, s, strlen(s)); }

/* Reads more bytes; false on EOF, error or timeout. */
static bool cli_fill(struct cli *c)
{
    if (c->head > 0) {
        memmove(c->buf, c->buf + c->head, c->len);
        c->head = 0;
    }
    if (c->len == sizeof c->buf) return false;
    ssize_t n = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
    if (n <= 0) return false;
    c->len += (size_t)n;
    return true;
}

/* One CRLF-terminated line (without the CRLF) into out[cap]. */
static bool cli_line(struct cli *c, char *out, size_t cap)
{
    for (;;) {
        char *start = c->buf + c->head;
        char *nl = memmem(start, c->len, "\r\n", 2);
        if (nl) {
            size_t n = (size_t)(nl - start);
            if (n >= cap) return false;
            memcpy(out, start, n);
            out[n] = 0;
            c->head += n + 2;
            c->len -= n + 2;
            return true;
        }
        if (!cli_fill(c)) return false;
    }
}

/* Exactly n bytes appended to *dst (grown). */
static bool cli_bytes(struct cli *c, size_t n, char **dst, size_t *dlen)
{
    char *d = realloc(*dst, *dlen + n + 1);
    if (!d) return false;
    *dst = d;
    while (n > 0) {
        if (c->len == 0 && !cli_fill(c)) return false;
        size_t k = c->len < n ? c->len : n;
        memcpy(*dst + *dlen, c->buf + c->head, k);
        *dlen += k;
        c->head += k;
        c->len -= k;
        n -= k;
    }
    (*dst)[*dlen] = 0;
    return true;
}

/* The value of header name in r (static buffer, "" → absent returns NULL). */
static const char *resp_header(const struct resp *r, const char *name)
{
    static _Thread_local char val[4][1024]; /* client threads run at once */
    static _Thread_local int k;
    size_t nl = strlen(name);
    for (const char *p = strstr(r->head, "\r\n"); p; p = strstr(p + 2, "\r\n")) {
        const char *line = p + 2;
        if (strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (*v == ' ') v++;
            const char *e = strstr(v, "\r\n");
            size_t n = e ? (size_t)(e - v) : strlen(v);
            char *out = val[k++ & 3];
            if (n >= sizeof val[0]) n = sizeof val[0] - 1;
            memcpy(out, v, n);
            out[n] = 0;
            return out;
        }
    }
    return NULL;
}

/* Status line and headers. */
static bool cli_read_head(struct cli *c, struct resp *r)
{
    memset(r, 0, sizeof *r);
    char line[8192];
    if (!cli_line(c, line, sizeof line)) return false;
    if (sscanf(line, "HTTP/1.%*d %d", &r->status) != 1) return false;
    size_t used = (size_t)snprintf(r->head, sizeof r->head, "%s", line);
    for (;;) {
        if (!cli_line(c, line, sizeof line)) return false;
        if (!line[0]) break;
        used += (size_t)snprintf(r->head + used, sizeof r->head - used, "\r\n%s", line);
        if (used >= sizeof r->head) return false;
    }
    strncat(r->head, "\r\n", sizeof r->head - strlen(r->head) - 1);
    return true;
}

/* One chunk of a chunked body appended to *dst; *last set on the terminating chunk. */
static bool cli_read_chunk(struct cli *c, char **dst, size_t *dlen, bool *last)
{
    char line[256];
    if (!cli_line(c, line, sizeof line)) return false;
    unsigned long n = strtoul(line, NULL, 16);
    *last = n == 0;
    if (n == 0) {
        while (cli_line(c, line, sizeof line) && line[0]) {} /* trailers */
        return true;
    }
    if (!cli_bytes(c, n, dst, dlen)) return false;
    return cli_line(c, line, sizeof line) && line[0] == 0;
}

/* The body after cli_read_head: chunked, Content-Length, or until EOF. */
static bool cli_read_body(struct cli *c, struct resp *r)
{
    const char *te = resp_header(r, "Transfer-Encoding");
    const char *cl = resp_header(r, "Content-Length");
    r->body = calloc(1, 1);
    if (te && strcasecmp(te, "chunked") == 0) {
        bool last = false;
        while (!last)
            if (!cli_read_chunk(c, &r->body, &r->body_len, &last)) return false;
        return true;
    }
    if (cl) return cli_bytes(c, strtoul(cl, NULL, 10), &r->body, &r->body_len);
    while (c->len > 0 || cli_fill(c)) {
        if (!cli_bytes(c, c->len, &r->body, &r->body_len)) return false;
    }
    return true;
}

static bool cli_read(struct cli *c, struct resp *r)
{
    return cli_read_head(c, r) && cli_read_body(c, r);
}

/* One request on a fresh connection. Returns the status (0: no response). */
static int roundtrip(const char *raw, struct resp *r)
{
    struct cli c;
    memset(r, 0, sizeof *r);
    if (!cli_open(&c, g_port)) return 0;
    bool ok = cli_sends(&c, raw) && cli_read(&c, r);
    cli_close(&c);
    return ok ? r->status : 0;
}

static void resp_free(struct resp *r)
{
    free(r->body);
    r->body = NULL;
}

/* Checks an OpenAI error body: type, code (NULL → JSON null), message containing msg. */
static void check_error_body(const struct resp *r, const char *type, const char *code,
                             const char *msg)
{
    cJSON *root = r->body ? cJSON_Parse(r->body) : NULL;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "error");
    CHECK(cJSON_IsObject(e), "error body: %s", r->body ? r->body : "(null)");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "type");
    const cJSON *cd = cJSON_GetObjectItemCaseSensitive(e, "code");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "param");
    CHECK(cJSON_IsString(t) && strcmp(t->valuestring, type) == 0, "type in %s", r->body);
    CHECK(code ? cJSON_IsString(cd) && strcmp(cd->valuestring, code) == 0 : cJSON_IsNull(cd),
          "code in %s", r->body);
    CHECK(cJSON_IsNull(p), "param null in %s", r->body);
    CHECK(cJSON_IsString(m) && (!msg || strstr(m->valuestring, msg)), "message in %s", r->body);
    const char *ct = resp_header(r, "Content-Type");
    CHECK(ct && strstr(ct, "application/json"), "content type %s", ct ? ct : "(none)");
    cJSON_Delete(root);
}

/* ------------------------------------------------------------------ tests */

static void test_basic(void)
{
    struct resp r;
    CHECK(roundtrip("GET /health HTTP/1.1\r\nHost: x\r\n\r\n", &r) == 200, "health %d", r.status);
    CHECK(r.body && strcmp(r.body, "ok") == 0, "body %s", r.body);
    resp_free(&r);
    CHECK(roundtrip("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-one\r\n\r\n",
                    &r) == 200, "models %d", r.status);
    CHECK(r.body && strstr(r.body, "\"list\""), "body %s", r.body);
    CHECK(resp_header(&r, "X-Test") && strcmp(resp_header(&r, "X-Test"), "yes") == 0,
          "extra header");
    resp_free(&r);
    const char *req = "POST /echo?a=1&b=two HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: 13\r\n\r\n{\"hello\":\"x\"}";
    CHECK(roundtrip(req, &r) == 200, "echo %d", r.status);
    CHECK(r.body && strcmp(r.body, "{\"hello\":\"x\"}") == 0, "echo body %s", r.body);
    CHECK(resp_header(&r, "X-Query") && strcmp(resp_header(&r, "X-Query"), "a=1&b=two") == 0,
          "query %s", resp_header(&r, "X-Query"));
    resp_free(&r);
    /* a GET body is refused (test_get_body) */
}

static void test_errors(void)
{
    struct resp r;
    CHECK(roundtrip("POST /v1/foo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", &r) == 404,
          "404: %d", r.status);
    check_error_body(&r, "invalid_request_error", NULL, "Invalid URL (POST /v1/foo)");
    resp_free(&r);
    CHECK(roundtrip("POST /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", &r) == 405,
          "405: %d", r.status);
    check_error_body(&r, "invalid_request_error", "method_not_allowed", NULL);
    const char *allow = resp_header(&r, "Allow");
    CHECK(allow && strcmp(allow, "GET, DELETE") == 0, "Allow: %s", allow ? allow : "(none)");
    resp_free(&r);
    CHECK(roundtrip("GET /noanswer HTTP/1.1\r\nHost: x\r\n\r\n", &r) == 500, "500: %d", r.status);
    check_error_body(&r, "server_error", NULL, NULL);
    resp_free(&r);
    /* http_respond_error: param, code and extra headers */
    CHECK(roundtrip("GET /busy HTTP/1.1\r\nHost: x\r\n\r\n", &r) == 429, "429: %d", r.status);
    CHECK(resp_header(&r, "Retry-After") && strcmp(resp_header(&r, "Retry-After"), "1") == 0,
          "Retry-After");
    CHECK(r.body && strcmp(r.body, "{\"error\":{\"message\":\"Too many requests: the queue is "
                                   "full\",\"type\":\"rate_limit_error\",\"param\":\"model\","
                                   "\"code\":\"rate_limit_exceeded\"}}") == 0,
          "body %s", r.body);
    resp_free(&r);
}

static void test_path_normalisation(void)
{
    struct resp r;
    const char *paths[] = { "//health", "/health/", "//health//", "/health?x=1" };
    for (int i = 0; i < 4; i++) {
        char req[256];
        snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", paths[i]);
        CHECK(roundtrip(req, &r) == 200, "%s → %d", paths[i], r.status);
        resp_free(&r);
    }
    CHECK(roundtrip("GET //v1//models/ HTTP/1.1\r\nHost: x\r\nX-Api-Key: sk-one\r\n\r\n", &r) == 200,
          "//v1//models/ → %d", r.status);
    resp_free(&r);
    CHECK(roundtrip("POST /echo/?q=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", &r) == 200,
          "/echo/ → %d", r.status);
    CHECK(resp_header(&r, "X-Path") && strcmp(resp_header(&r, "X-Path"), "/echo") == 0,
          "normalised path %s", resp_header(&r, "X-Path"));
    CHECK(resp_header(&r, "X-Query") && strcmp(resp_header(&r, "X-Query"), "q=1") == 0, "query");
    resp_free(&r);
    CHECK(roundtrip("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", &r) == 404, "/healthz %d", r.status);
    resp_free(&r);
    /* HTTP_ROUTE_SUBPATHS: /echo/... reaches the GET subpath route; /echo itself stays exact */
    CHECK(roundtrip("GET /echo//a/b/ HTTP/1.1\r\nHost: x\r\n\r\n", &r) == 200, "subpath %d", r.status);
    CHECK(resp_header(&r, "X-Path") && !strcmp(resp_header(&r, "X-Path"), "/echo/a/b"), "subpath path %s",
          resp_header(&r, "X-Path"));
    resp_free(&r);
    CHECK(roundtrip("POST /echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", &r) == 405 &&
              resp_header(&r, "Allow") && !strcmp(resp_header(&r, "Allow"), "GET"),
          "subpath, other method: %d", r.status);
    resp_free(&r);
    CHECK(roundtrip("GET /echoes HTTP/1.1\r\nHost: x\r\n\r\n", &r) == 404, "a longer name is not a subpath");
    resp_free(&r);
}

static void test_limits(void)
{
    struct resp r;
    /* declared too large: answered from the headers, without sending the body */
    double t0 = now_s();
    CHECK(roundtrip("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    "Content-Length: 100000\r\n\r\n", &r) == 413, "413 (declared): %d", r.status);
    CHECK(now_s() - t0 < 2, "413 came without the body");
    check_error_body(&r, "invalid_request_error", "request_too_large", NULL);
    resp_free(&r);

    /* chunked body growing past the limit (4096) */
    struct cli c;
    CHECK(cli_open(&c, g_port), "connect");
    char chunk[2100];
    memset(chunk, ' ', sizeof chunk);
    int hl = snprintf(chunk, sizeof chunk, "7d0\r\n");
    chunk[hl + 2000] = '\r';
    chunk[hl + 2001] = '\n';
    bool ok = cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            "Transfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 3 && ok; i++) ok = cli_send(&c, chunk, (size_t)hl + 2002);
    ok = ok && cli_sends(&c, "0\r\n\r\n") && cli_read(&c, &r);
    CHECK(ok && r.status == 413, "413 (chunked): %d", r.status);
    check_error_body(&r, "invalid_request_error", "request_too_large", NULL);
    resp_free(&r);
    cli_close(&c);

    /* a chunked body under the limit is accepted */
    CHECK(cli_open(&c, g_port), "connect");
    ok = cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n5\r\n[1,2]\r\n0\r\n\r\n") &&
         cli_read(&c, &r);
    CHECK(ok && r.status == 200 && r.body && strcmp(r.body, "[1,2]") == 0, "chunked body ok");
    resp_free(&r);
    cli_close(&c);

    CHECK(roundtrip("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                    "Content-Length: 2\r\n\r\nhi", &r) == 415, "415 text/plain: %d", r.status);
    check_error_body(&r, "invalid_request_error", "unsupported_media_type", NULL);
    resp_free(&r);
    CHECK(roundtrip("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", &r) == 415,
          "415 missing type: %d", r.status);
    resp_free(&r);
    CHECK(roundtrip("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json; "
                    "charset=utf-8\r\nContent-Length: 2\r\n\r\n{}", &r) == 200,
          "charset param: %d", r.status);
    resp_free(&r);
    CHECK(roundtrip("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: Application/JSON\r\n"
                    "Content-Length: 2\r\n\r\n{}", &r) == 200, "case: %d", r.status);
    resp_free(&r);
    CHECK(roundtrip("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/jsonx\r\n"
                    "Content-Length: 2\r\n\r\n{}", &r) == 415, "jsonx: %d", r.status);
    resp_free(&r);

    /* headers past max_header_bytes (8 KiB): libmicrohttpd answers by itself */
    size_t big = 20000;
    char *req = malloc(big + 200);
    int n = snprintf(req, 200, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(req + n, 'a', big);
    strcpy(req + n + big, "\r\n\r\n");
    int st = roundtrip(req, &r);
    CHECK(st == 431 || st == 413, "header too large: %d", st);
    printf("  (headers too large → %d)\n", st);
    resp_free(&r);
    free(req);
}

static void test_auth(void)
{
    struct resp r;
    CHECK(roundtrip("GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", &r) == 401, "no key: %d", r.status);
    check_error_body(&r, "authentication_error", "invalid_api_key", NULL);
    resp_free(&r);
    const char *bad[] = { "Authorization: Bearer sk-on", "Authorization: Bearer sk-one1",
                          "Authorization: Bearer sk-second-ke", "Authorization: Basic sk-one",
                          "Authorization: Bearer ", "X-Api-Key: sk-two", "X-Api-Key: " };
    for (int i = 0; i < 7; i++) {
        char req[256];
        snprintf(req, sizeof req, "GET /v1/models HTTP/1.1\r\nHost: x\r\n%s\r\n\r\n", bad[i]);
        CHECK(roundtrip(req, &r) == 401, "'%s' → %d", bad[i], r.status);
        resp_free(&r);
    }
    const char *good[] = { "Authorization: Bearer sk-one", "Authorization: bearer  sk-second-key",
                           "X-Api-Key: sk-second-key", "x-api-key: sk-one" };
    for (int i = 0; i < 4; i++) {
        char req[256];
        snprintf(req, sizeof req, "GET /v1/models HTTP/1.1\r\nHost: x\r\n%s\r\n\r\n", good[i]);
        CHECK(roundtrip(req, &r) == 200, "'%s' → %d", good[i], r.status);
        resp_free(&r);
    }
    /* 401 comes before the body is read (and before the content type is looked at) */
    double t0 = now_s();
    CHECK(roundtrip("POST /private HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                    "Content-Length: 1000\r\n\r\n", &r) == 401, "401 first: %d", r.status);
    CHECK(now_s() - t0 < 2, "401 came without the body");
    resp_free(&r);
    CHECK(roundtrip("POST /private HTTP/1.1\r\nHost: x\r\nX-Api-Key: sk-one\r\n"
                    "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", &r) == 200,
          "private with key: %d", r.status);
    resp_free(&r);
    /* public routes need no key */
    CHECK(roundtrip("GET /health HTTP/1.1\r\nHost: x\r\n\r\n", &r) == 200, "public %d", r.status);
    resp_free(&r);
}

static void test_deferred(void)
{
    struct resp r;
    double t0 = now_s();
    CHECK(roundtrip("POST /deferred HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", &r) == 200,
          "deferred %d", r.status);
    double dt = now_s() - t0;
    CHECK(dt >= 0.19 && dt < 2, "took %.3f s", dt);
    CHECK(r.body && strcmp(r.body, "{\"deferred\":true}") == 0, "body %s", r.body);
    resp_free(&r);
}

/* Reads chunks until one (not a keep-alive comment) arrives; appends it to *acc. */
static bool read_data_chunk(struct cli *c, char **acc, size_t *acc_len, bool *last)
{
    for (;;) {
        char *d = NULL;
        size_t n = 0;
        if (!cli_read_chunk(c, &d, &n, last)) {
            free(d);
            return false;
        }
        bool comment = d && strcmp(d, ": keep-alive\n\n") == 0;
        if (!comment && n > 0) {
            char *a = realloc(*acc, *acc_len + n + 1);
            memcpy(a + *acc_len, d, n + 1);
            *acc = a;
            *acc_len += n;
        }
        free(d);
        if (!comment) return true;
    }
}

static void test_stream_incremental(void)
{
    atomic_store(&g_gate, 0);
    struct cli c;
    struct resp r;
    CHECK(cli_open(&c, g_port), "connect");
    bool ok = cli_sends(&c, "POST /stream-gated HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n") &&
              cli_read_head(&c, &r);
    CHECK(ok && r.status == 200, "status %d", r.status);
    const char *ct = resp_header(&r, "Content-Type");
    const char *cc = resp_header(&r, "Cache-Control");
    const char *xa = resp_header(&r, "X-Accel-Buffering");
    const char *te = resp_header(&r, "Transfer-Encoding");
    CHECK(ct && strcmp(ct, "text/event-stream") == 0, "content type %s", ct ? ct : "-");
    CHECK(cc && strcmp(cc, "no-cache") == 0, "cache-control %s", cc ? cc : "-");
    CHECK(xa && strcmp(xa, "no") == 0, "x-accel-buffering");
    CHECK(te && strcasecmp(te, "chunked") == 0, "chunked");
    char *acc = NULL;
    size_t n = 0;
    bool last = false;
    for (int i = 0; i < 3 && ok; i++) {
        /* piece i arrives before the writer is allowed to write piece i + 1 */
        ok = read_data_chunk(&c, &acc, &n, &last);
        char want[64];
        snprintf(want, sizeof want, "data: %d\n\n", i);
        CHECK(ok && acc && strstr(acc, want), "piece %d: %s", i, acc ? acc : "(none)");
        CHECK(atomic_load(&g_gate) == i, "gate");
        atomic_store(&g_gate, i + 1);
    }
    while (ok && !last) ok = read_data_chunk(&c, &acc, &n, &last);
    CHECK(ok && last, "terminating chunk");
    CHECK(acc && strcmp(acc, "data: 0\n\ndata: 1\n\ndata: 2\n\n") == 0, "order: %s", acc);
    free(acc);
    cli_close(&c);
}

static void test_keepalive_comment_and_disconnect(void)
{
    /* a silent stream gets ": keep-alive" every keepalive_s (0.3 s) */
    int closed0 = atomic_load(&g_closed);
    struct cli c;
    struct resp r;
    CHECK(cli_open(&c, g_port), "connect");
    bool ok = cli_sends(&c, "POST /silent HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n") &&
              cli_read_head(&c, &r);
    CHECK(ok && r.status == 200, "status %d", r.status);
    double t0 = now_s();
    for (int i = 0; i < 2 && ok; i++) {
        char *d = NULL;
        size_t n = 0;
        bool last;
        ok = cli_read_chunk(&c, &d, &n, &last);
        CHECK(ok && d && strcmp(d, ": keep-alive\n\n") == 0, "comment %d: %s", i, d ? d : "-");
        free(d);
    }
    double dt = now_s() - t0;
    CHECK(dt > 0.35 && dt < 1.5, "two comments took %.3f s", dt);
    /* the client goes away: on_close within ~2 s */
    cli_close(&c);
    t0 = now_s();
    CHECK(wait_atomic(&g_closed, closed0 + 1, 2.0), "on_close not called (stream)");
    printf("  (stream disconnect noticed after %.0f ms)\n", (now_s() - t0) * 1e3);

    /* a deferred non-streaming reply, suspended while the client leaves */
    int def0 = atomic_load(&g_deferred);
    CHECK(cli_open(&c, g_port), "connect");
    CHECK(cli_sends(&c, "POST /silent-json HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
          "send");
    CHECK(wait_atomic(&g_deferred, def0 + 1, 2.0), "deferred");
    sleep_ms(100);
    cli_close(&c);
    t0 = now_s();
    CHECK(wait_atomic(&g_closed, closed0 + 2, 2.0), "on_close not called (deferred)");
    printf("  (deferred disconnect noticed after %.0f ms)\n", (now_s() - t0) * 1e3);
}

static void test_http_keepalive(void)
{
    struct cli c;
    struct resp r;
    CHECK(cli_open(&c, g_port), "connect");
    const char *reqs[] = {
        "GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 2\r\n\r\n{}",
        "POST /deferred HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        "POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    };
    const char *want[] = { "ok", "{}", "{\"deferred\":true}", NULL, "ok" };
    for (int i = 0; i < 5; i++) {
        bool ok = cli_sends(&c, reqs[i]) && cli_read(&c, &r);
        CHECK(ok && r.status == 200, "request %d on one connection: %d", i, r.status);
        if (want[i]) CHECK(r.body && strcmp(r.body, want[i]) == 0, "body %d: %s", i, r.body);
        else CHECK(r.body && strstr(r.body, "data: 9\n\n"), "stream body %s", r.body);
        resp_free(&r);
    }
    cli_close(&c);
}

#define N_CONCURRENT 50

static void *concurrent_client(void *arg)
{
    int *ok = arg;
    struct cli c;
    struct resp r = { 0 };
    *ok = 0;
    if (!cli_open(&c, g_port)) return NULL;
    if (cli_sends(&c, "POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n") &&
        cli_read(&c, &r) && r.status == 200) {
        char want[256] = "";
        for (int i = 0; i < 10; i++) {
            size_t n = strlen(want);
            snprintf(want + n, sizeof want - n, "data: %d\n\n", i);
        }
        /* keep-alive comments may interleave when the machine is slow */
        char *got = r.body, *w = got;
        for (char *p = got; *p;) {
            if (strncmp(p, ": keep-alive\n\n", 14) == 0) p += 14;
            else *w++ = *p++;
        }
        *w = 0;
        *ok = strcmp(got, want) == 0;
    }
    resp_free(&r);
    cli_close(&c);
    return NULL;
}

static void test_concurrent_streams(void)
{
    pthread_t t[N_CONCURRENT];
    int ok[N_CONCURRENT];
    double t0 = now_s();
    for (int i = 0; i < N_CONCURRENT; i++) pthread_create(&t[i], NULL, concurrent_client, &ok[i]);
    int good = 0;
    for (int i = 0; i < N_CONCURRENT; i++) {
        pthread_join(t[i], NULL);
        good += ok[i];
    }
    CHECK(good == N_CONCURRENT, "%d of %d streams complete", good, N_CONCURRENT);
    printf("  (%d streams in %.0f ms)\n", N_CONCURRENT, (now_s() - t0) * 1e3);
}

/* Writers that never pause race every suspend in the content reader with a resume. */
static void *burst_client(void *arg)
{
    int *ok = arg;
    struct cli c;
    struct resp r = { 0 };
    *ok = 0;
    if (!cli_open(&c, g_port)) return NULL;
    if (cli_sends(&c, "POST /stream-burst HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n") &&
        cli_read(&c, &r) && r.status == 200) {
        int next = 0;
        *ok = 1;
        for (char *p = r.body; *p;) {
            if (strncmp(p, ": keep-alive\n\n", 14) == 0) {
                p += 14;
                continue;
            }
            int v, used = 0;
            if (sscanf(p, "data: %d\n\n%n", &v, &used) != 1 || used == 0 || v != next) {
                *ok = 0;
                break;
            }
            next++;
            p += used;
        }
        if (next != 300) *ok = 0;
    }
    resp_free(&r);
    cli_close(&c);
    return NULL;
}

static void test_stream_burst(void)
{
    enum { N = 16 };
    pthread_t t[N];
    int ok[N];
    for (int i = 0; i < N; i++) pthread_create(&t[i], NULL, burst_client, &ok[i]);
    int good = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        good += ok[i];
    }
    CHECK(good == N, "%d of %d burst streams complete and in order", good, N);
}

/* A separate server stopped while replies are suspended (stream and non-stream), plus a
 * reply the application keeps and ends after the stop. */
static void test_stop_with_live_replies(void)
{
    struct http_config cfg;
    http_config_default(&cfg);
    cfg.port = 0;
    cfg.keepalive_s = 30;
    struct http_server *s;
    char err[256];
    CHECK(http_server_start(&s, &cfg, g_routes, N_ROUTES, err, sizeof err) == 0, "start: %s", err);
    int port = http_server_port(s);
    int closed0 = atomic_load(&g_closed), def0 = atomic_load(&g_deferred);
    struct cli c[3];
    const char *paths[] = { "/silent", "/silent-json", "/held" };
    for (int i = 0; i < 3; i++) {
        char req[128];
        snprintf(req, sizeof req, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
                 paths[i]);
        CHECK(cli_open(&c[i], port) && cli_sends(&c[i], req), "client %d", i);
    }
    CHECK(wait_atomic(&g_deferred, def0 + 3, 2.0), "all deferred");
    sleep_ms(100); /* let the stream suspend in its reader */
    double t0 = now_s();
    http_server_stop(s);
    double dt = now_s() - t0;
    CHECK(dt < 2, "stop took %.3f s", dt);
    CHECK(atomic_load(&g_closed) == closed0 + 2, "on_close: %d", atomic_load(&g_closed) - closed0);
    CHECK(atomic_load(&g_held_closed) == 1, "held reply's on_close");
    /* the application still holds g_held: writes fail, end frees it */
    CHECK(g_held && !http_reply_write(g_held, "x", 1), "write after stop");
    if (g_held) http_reply_end(g_held);
    g_held = NULL;
    /* the clients see their connections closed */
    for (int i = 0; i < 3; i++) {
        struct resp r;
        /* a stream may have its headers, but no response completes */
        bool complete = cli_read(&c[i], &r);
        CHECK(!complete, "client %d got a complete response after stop (%d)", i, r.status);
        resp_free(&r);
        cli_close(&c[i]);
    }
    http_server_stop(NULL);
}

/* CORS (http/cors.h) on a separate server with keys: a preflight is answered before
 * authentication, every answer to an allowed Origin names it (401s and streams too), and
 * without CORS configured (the main server) nothing changes. */
static void test_cors(void)
{
    const char *origins[] = { "http://app.example" };
    struct http_config cfg;
    http_config_default(&cfg);
    cfg.port = 0;
    cfg.keys = g_keys;
    cfg.n_keys = N_KEYS;
    cfg.cors = (struct http_cors){ .origins = origins, .n_origins = 1 };
    struct http_server *s;
    char err[256];
    CHECK(http_server_start(&s, &cfg, g_routes, N_ROUTES, err, sizeof err) == 0, "start: %s", err);
    int main_port = g_port;
    g_port = http_server_port(s);
    struct resp r;
    const char *pre = "OPTIONS /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: http://app.example\r\n"
                      "Access-Control-Request-Method: DELETE\r\nAccess-Control-Request-Headers: authorization\r\n\r\n";
    CHECK(roundtrip(pre, &r) == 204, "preflight without a key: %d", r.status);
    const char *v = resp_header(&r, "Access-Control-Allow-Origin");
    CHECK(v && !strcmp(v, "http://app.example"), "Allow-Origin %s", v ? v : "(none)");
    v = resp_header(&r, "Access-Control-Allow-Methods");
    CHECK(v && !strcmp(v, "GET, DELETE"), "Allow-Methods %s", v ? v : "(none)");
    v = resp_header(&r, "Access-Control-Allow-Headers");
    CHECK(v && !strcmp(v, "authorization"), "Allow-Headers %s", v ? v : "(none)");
    resp_free(&r);
    CHECK(roundtrip("OPTIONS /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: http://other.example\r\n"
                    "Access-Control-Request-Method: GET\r\n\r\n", &r) == 403,
          "preflight from another origin: %d", r.status);
    check_error_body(&r, "invalid_request_error", "cors_not_allowed", "origin 'http://other.example'");
    CHECK(!resp_header(&r, "Access-Control-Allow-Origin"), "no Allow-Origin on a refusal");
    resp_free(&r);
    CHECK(roundtrip("OPTIONS /nowhere HTTP/1.1\r\nHost: x\r\nOrigin: http://app.example\r\n"
                    "Access-Control-Request-Method: GET\r\n\r\n", &r) == 404, "unknown path: %d", r.status);
    resp_free(&r);
    CHECK(roundtrip("OPTIONS /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: http://app.example\r\n\r\n", &r) == 405,
          "OPTIONS that is not a preflight: %d", r.status);
    resp_free(&r);
    /* actual requests */
    CHECK(roundtrip("GET /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: http://app.example\r\n\r\n", &r) == 401,
          "no key: %d", r.status);
    v = resp_header(&r, "Access-Control-Allow-Origin");
    CHECK(v && !strcmp(v, "http://app.example"), "the 401 is readable by the page");
    resp_free(&r);
    CHECK(roundtrip("GET /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: http://app.example\r\n"
                    "Authorization: Bearer sk-one\r\n\r\n", &r) == 200, "with key: %d", r.status);
    CHECK(resp_header(&r, "Access-Control-Allow-Origin") && resp_header(&r, "Vary"), "200 with Allow-Origin, Vary");
    resp_free(&r);
    CHECK(roundtrip("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-one\r\n\r\n", &r) == 200 &&
              !resp_header(&r, "Access-Control-Allow-Origin"),
          "no Origin: no CORS headers");
    resp_free(&r);
    CHECK(roundtrip("POST /stream HTTP/1.1\r\nHost: x\r\nOrigin: http://app.example\r\nContent-Length: 0\r\n\r\n",
                    &r) == 200, "stream: %d", r.status);
    CHECK(resp_header(&r, "Access-Control-Allow-Origin") && r.body && strstr(r.body, "data:"),
          "a stream names the origin");
    resp_free(&r);
    http_server_stop(s);
    g_port = main_port;
    /* the main server has no CORS: a preflight is an OPTIONS like any other */
    CHECK(roundtrip(pre, &r) == 405, "no CORS: %d", r.status);
    resp_free(&r);
    CHECK(roundtrip("GET /health HTTP/1.1\r\nHost: x\r\nOrigin: http://app.example\r\n\r\n", &r) == 200 &&
              !resp_header(&r, "Access-Control-Allow-Origin"),
          "no CORS: no headers");
    resp_free(&r);
}

static void test_bind_error(void)
{
    struct http_config cfg;
    http_config_default(&cfg);
    cfg.port = g_port; /* taken */
    struct http_server *s = NULL;
    char err[256] = "";
    CHECK(http_server_start(&s, &cfg, g_routes, N_ROUTES, err, sizeof err) != 0 && !s,
          "bind to a used port");
    CHECK(strstr(err, "127.0.0.1") && strstr(err, "in use"), "error: %s", err);
    cfg.host = "not an address";
    CHECK(http_server_start(&s, &cfg, g_routes, N_ROUTES, err, sizeof err) != 0, "bad host");
}

/* A GET with a body is refused before the body is read (it used to be read and ignored,
 * without a limit). */
static void test_get_body(void)
{
    struct resp r;
    CHECK(roundtrip("GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", &r) == 400,
          "GET with Content-Length: %d", r.status);
    check_error_body(&r, "invalid_request_error", NULL, NULL);
    resp_free(&r);
    CHECK(roundtrip("GET /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "5\r\nhello\r\n0\r\n\r\n", &r) == 400, "GET chunked: %d", r.status);
    resp_free(&r);
    CHECK(roundtrip("GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", &r) == 200,
          "GET with an empty body: %d", r.status);
    resp_free(&r);
}

/* A client that reads nothing: the stream's queue stops at max_stream_queue_bytes (256 KiB
 * here), the write fails, on_close comes, and the queue is gone. */
static void test_stream_queue_bound(void)
{
    atomic_store(&g_flood_bytes, 0);
    atomic_store(&g_flood_done, 0);
    atomic_store(&g_flood_closed, 0);
    struct cli c;
    CHECK(cli_open(&c, g_port), "connect");
    int small = 4096;
    setsockopt(c.fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    cli_sends(&c, "POST /flood HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    double end = now_s() + 10;
    while (!atomic_load(&g_flood_done) && now_s() < end) sleep_ms(10);
    long wrote = atomic_load(&g_flood_bytes);
    CHECK(atomic_load(&g_flood_done), "the flood writer never stopped (queue unbounded?)");
    /* the queue bound plus what the kernel's socket buffers absorbed */
    CHECK(wrote > 0 && wrote < (32L << 20), "wrote %ld bytes before a write failed", wrote);
    CHECK(atomic_load(&g_flood_closed) == 1, "on_close calls: %d", atomic_load(&g_flood_closed));
    /* the server is fine afterwards */
    struct resp r;
    CHECK(roundtrip("GET /health HTTP/1.1\r\nHost: x\r\n\r\n", &r) == 200, "health %d", r.status);
    resp_free(&r);
    cli_close(&c);
}

/* A deferred reply turned into a stream later (and at once, racing the handler's return). */
static void test_late_stream(void)
{
    const char *paths[] = { "/late-stream", "/late-stream-now" };
    for (int k = 0; k < 2; k++) {
        char req[128];
        snprintf(req, sizeof req, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
                 paths[k]);
        struct resp r;
        CHECK(roundtrip(req, &r) == 200, "%s: %d", paths[k], r.status);
        const char *ct = resp_header(&r, "Content-Type");
        CHECK(ct && !strcmp(ct, "text/event-stream"), "%s content type %s", paths[k], ct ? ct : "-");
        CHECK(r.body && !strcmp(r.body, "data: late 0\n\ndata: late 1\n\ndata: late 2\n\n"),
              "%s body '%s'", paths[k], r.body ? r.body : "");
        resp_free(&r);
    }
}

static int metered_at(const char *path, const char *key, struct resp *r)
{
    char req[256];
    snprintf(req, sizeof req, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
             "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", path, key);
    return roundtrip(req, r);
}

static int metered(const char *key, struct resp *r) { return metered_at("/metered", key, r); }

/* A meter charges the key after its reply was sent: the next request meets the tpm limit
 * once the charge is in, and the key's counters hold the tokens. */
static void test_meter_after_reply(void)
{
    struct resp r;
    CHECK(metered_at("/metered-later", "sk-later", &r) == 200 && r.body && strstr(r.body, "\"meter\":true"),
          "answered, with a meter: %d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
    double end = now_s() + 3;
    struct http_key_stats ks[8];
    bool charged = false;
    while (!charged && now_s() < end) {
        int n = http_server_key_stats(g_srv, ks, 8);
        for (int i = 0; i < n && i < 8; i++)
            if (!strcmp(ks[i].name, "later")) charged = ks[i].prompt_tokens == 3 && ks[i].completion_tokens == 4;
        if (!charged) sleep_ms(5);
    }
    CHECK(charged, "3 + 4 tokens charged after the reply");
    CHECK(metered_at("/metered-later", "sk-later", &r) == 429, "tpm after the late charge: %d", r.status);
    CHECK(r.body && strstr(r.body, "tokens per minute"), "%s", r.body ? r.body : "");
    resp_free(&r);
}

/* rpm=2: two requests pass, the third is 429 with Retry-After; tpm=5: the first request
 * reports 7 tokens (deferred_worker), so the next is 429 until the bucket refills. Other
 * keys are unaffected, and unmetered routes are not limited. */
static void test_rate_limits(void)
{
    struct resp r;
    CHECK(metered("sk-limited", &r) == 200, "rpm 1: %d", r.status);
    resp_free(&r);
    CHECK(metered("sk-limited", &r) == 200, "rpm 2: %d", r.status);
    resp_free(&r);
    CHECK(metered("sk-limited", &r) == 429, "rpm 3: %d", r.status);
    check_error_body(&r, "rate_limit_error", "rate_limit_exceeded", NULL);
    const char *ra = resp_header(&r, "Retry-After");
    CHECK(ra && atoi(ra) >= 1 && atoi(ra) <= 30, "Retry-After %s", ra ? ra : "-");
    CHECK(r.body && strstr(r.body, "'limited'") && strstr(r.body, "requests per minute") &&
              !strstr(r.body, "sk-limited"), "message names the key's name only: %s", r.body);
    resp_free(&r);
    CHECK(roundtrip("GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Api-Key: sk-limited\r\n\r\n", &r) == 200,
          "unmetered route: %d", r.status);
    resp_free(&r);
    CHECK(metered("sk-one", &r) == 200, "other key: %d", r.status);
    resp_free(&r);

    CHECK(metered("sk-tokens", &r) == 200, "tpm 1: %d", r.status);
    resp_free(&r);
    sleep_ms(50); /* usage is charged when the reply is sent */
    CHECK(metered("sk-tokens", &r) == 429, "tpm 2: %d", r.status);
    ra = resp_header(&r, "Retry-After");
    CHECK(ra && atoi(ra) >= 30 && atoi(ra) <= 37, "tpm Retry-After %s", ra ? ra : "-");
    CHECK(r.body && strstr(r.body, "tokens per minute"), "%s", r.body);
    resp_free(&r);

    struct http_key_stats ks[8];
    int n = http_server_key_stats(g_srv, ks, 8);
    CHECK(n == N_KEYS, "%d key names", n);
    for (int i = 0; i < n && i < 8; i++) {
        if (!strcmp(ks[i].name, "limited"))
            CHECK(ks[i].requests == 4 && ks[i].rate_limited_rpm == 1 && ks[i].prompt_tokens == 6,
                  "limited: %llu requests, %llu limited, %llu prompt", (unsigned long long)ks[i].requests,
                  (unsigned long long)ks[i].rate_limited_rpm, (unsigned long long)ks[i].prompt_tokens);
        if (!strcmp(ks[i].name, "tokens"))
            CHECK(ks[i].rate_limited_tpm == 1 && ks[i].completion_tokens == 4, "tokens stats");
    }
}

/* Replacing the keys: the old one stops working, the new one works, a bad set changes
 * nothing and its error never shows a key. */
static void test_key_reload(void)
{
    char err[256];
    const struct http_key next[] = { { .name = "one", .key = "sk-one-rotated" },
                                     { .name = "fresh", .key = "sk-fresh" } };
    CHECK(http_server_set_keys(g_srv, next, 2, err, sizeof err) == 0, "%s", err);
    struct resp r;
    CHECK(roundtrip("GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Api-Key: sk-one\r\n\r\n", &r) == 401,
          "old key: %d", r.status);
    resp_free(&r);
    CHECK(roundtrip("GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Api-Key: sk-second-key\r\n\r\n", &r) == 401,
          "removed key: %d", r.status);
    resp_free(&r);
    CHECK(roundtrip("GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Api-Key: sk-fresh\r\n\r\n", &r) == 200,
          "new key: %d", r.status);
    resp_free(&r);
    const struct http_key dup[] = { { .name = "a", .key = "sk-secret-1" },
                                    { .name = "b", .key = "sk-secret-1" } };
    CHECK(http_server_set_keys(g_srv, dup, 2, err, sizeof err) != 0, "duplicate keys accepted");
    CHECK(!strstr(err, "sk-secret"), "error shows a key: %s", err);
    const struct http_key badname[] = { { .name = "has space", .key = "k" } };
    CHECK(http_server_set_keys(g_srv, badname, 1, err, sizeof err) != 0, "bad name accepted");
    CHECK(roundtrip("GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Api-Key: sk-one-rotated\r\n\r\n", &r) == 200,
          "keys kept after a failed reload: %d", r.status);
    resp_free(&r);
    /* back to the original set for the tests that follow */
    CHECK(http_server_set_keys(g_srv, g_keys, N_KEYS, err, sizeof err) == 0, "%s", err);
    struct http_key_stats ks[8];
    int n = http_server_key_stats(g_srv, ks, 8);
    CHECK(n == N_KEYS + 1, "names ever seen: %d", n);
}

int main(void)
{
    if (!getenv("TESSERA_HTTP_LOG")) log_set_level(LOG_LEVEL_ERR);
    else log_set_level(LOG_LEVEL_INFO);
    struct http_config cfg;
    http_config_default(&cfg);
    cfg.port = 0;
    cfg.keys = g_keys;
    cfg.n_keys = N_KEYS;
    cfg.max_stream_queue_bytes = 256 << 10;
    cfg.max_body_bytes = 4096;
    cfg.max_header_bytes = 8192;
    cfg.keepalive_s = 0.3;
    cfg.n_threads = 2;
    char err[256];
    if (http_server_start(&g_srv, &cfg, g_routes, N_ROUTES, err, sizeof err) != 0) {
        printf("cannot start: %s\n", err);
        return 1;
    }
    g_port = http_server_port(g_srv);
    double t0 = now_s();
    RUN(test_basic);
    RUN(test_errors);
    RUN(test_path_normalisation);
    RUN(test_limits);
    RUN(test_auth);
    RUN(test_deferred);
    RUN(test_stream_incremental);
    RUN(test_keepalive_comment_and_disconnect);
    RUN(test_http_keepalive);
    RUN(test_concurrent_streams);
    RUN(test_stream_burst);
    RUN(test_stop_with_live_replies);
    RUN(test_cors);
    RUN(test_bind_error);
    RUN(test_get_body);
    RUN(test_stream_queue_bound);
    RUN(test_late_stream);
    RUN(test_rate_limits);
    RUN(test_meter_after_reply);
    RUN(test_key_reload);
    http_server_stop(g_srv);
    /* detached workers finish their replies */
    double end = now_s() + 5;
    while (atomic_load(&g_workers) > 0 && now_s() < end) sleep_ms(5);
    printf("  (%.1f s)\n", now_s() - t0);
    return test_summary();
}

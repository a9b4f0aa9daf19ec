/* support.c — arena allocator, growable byte buffer and UTF-8 helpers for the template
 * module. The arena hands out zeroed, max-aligned memory from chunks and frees them all
 * at once; an optional byte limit turns runaway templates into errors, not OOM kills.
 */
#include "template/jinja_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct jarena_chunk {
    struct jarena_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

void *jarena_alloc(struct jarena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->limit && (n > a->limit || a->used + n > a->limit)) return NULL;
    struct jarena_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > 65536 ? n : 65536;
        if (c && c->size * 2 > size && c->size < (16u << 20)) size = c->size * 2;
        if (size < n) size = n;
        c = malloc(sizeof *c + size);
        if (!c) return NULL;
        c->size = size;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

char *jarena_strdup(struct jarena *a, const char *p, size_t n)
{
    char *s = jarena_alloc(a, n + 1);
    if (!s) return NULL;
    if (n) memcpy(s, p, n);
    s[n] = 0;
    return s;
}

void jarena_free(struct jarena *a)
{
    struct jarena_chunk *c = a->head;
    while (c) {
        struct jarena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

void jbuf_put(struct jbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        if (b->n + n + 1 > JINJA_MAX_OUTPUT) {
            b->oom = true;
            return;
        }
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jbuf_puts(struct jbuf *b, const char *s) { jbuf_put(b, s, strlen(s)); }
void jbuf_putc(struct jbuf *b, char c) { jbuf_put(b, &c, 1); }

void jbuf_printf(struct jbuf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof tmp) n = sizeof tmp - 1;
    jbuf_put(b, tmp, (size_t)n);
}

void jbuf_free(struct jbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

uint32_t jinja_utf8_dec(const char *p, const char *end, int *len)
{
    const unsigned char *s = (const unsigned char *)p;
    size_t avail = (size_t)(end - p);
    unsigned c = s[0];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    int n = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 ? (c < 0xf0 ? 3 : 0) : c >= 0xc2 ? 2 : 0;
    if (n == 0 || (size_t)n > avail) goto bad;
    uint32_t cp = c & (0x3f >> (n - 1));
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) goto bad;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff))) goto bad;
    *len = n;
    return cp;
bad:
    *len = 1;
    return c;
}

bool jinja_is_space(uint32_t c)
{
    if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f);
    return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
           c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

size_t jinja_utf8_count(const char *p, size_t n)
{
    size_t count = 0;
    const char *end = p + n;
    while (p < end) {
        int l;
        jinja_utf8_dec(p, end, &l);
        p += l;
        count++;
    }
    return count;
}

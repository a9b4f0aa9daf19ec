/* byte_alpha.c — the GPT-2 byte alphabet and the UTF-8 helpers the tokenizer uses.
 *
 * Byte-level BPE vocabularies store every byte as a printable character: bytes
 * '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves (as code points), the other
 * 68 bytes map in order to U+0100.. (so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ' U+010A). This
 * is `bytes_to_unicode()` of GPT-2 and Hugging Face's ByteLevel. Everything here is pure
 * and thread-safe.
 */
#include "tokenizer/tok_internal.h"

#include "util/err.h"

#include <stdlib.h>
#include <string.h>

/* Whether byte b stands for itself in the alphabet. */
static bool byte_is_direct(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* Code point of byte b's alphabet character. */
static uint32_t byte_to_cp(unsigned b)
{
    if (byte_is_direct(b))
        return b;
    /* the n-th non-direct byte (in byte order) maps to U+0100 + n */
    unsigned n = 0;
    for (unsigned i = 0; i < b; i++)
        n += !byte_is_direct(i);
    return 0x100 + n;
}

int tok_byte_to_char(uint8_t b, char out[2])
{
    uint32_t cp = byte_to_cp(b);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* Inverse map for code points < 0x200 (all alphabet characters are below U+0144). */
static int cp_to_byte(uint32_t cp)
{
    if (cp < 0x100)
        return byte_is_direct(cp) ? (int)cp : -1;
    if (cp >= 0x100 + 68)
        return -1;
    unsigned n = cp - 0x100;
    for (unsigned b = 0; b < 256; b++) {
        if (!byte_is_direct(b)) {
            if (n == 0)
                return (int)b;
            n--;
        }
    }
    return -1;
}

int tok_chars_to_bytes(const char *s, size_t n, char *out)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    int o = 0;
    while (i < n) {
        int l = tok_utf8_valid_len(u + i, n - i);
        if (l == 0 || l > 2)
            return -1;
        int b = cp_to_byte(tok_utf8_decode(u + i, l));
        if (b < 0)
            return -1;
        out[o++] = (char)b;
        i += (size_t)l;
    }
    return o;
}

int tok_utf8_valid_len(const uint8_t *s, size_t n)
{
    if (n == 0)
        return 0;
    uint8_t c = s[0];
    if (c < 0x80)
        return 1;
    int len;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0; /* overlong */
        else if (c == 0xED)
            hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F; /* > U+10FFFF */
    } else {
        return 0;
    }
    if ((size_t)len > n)
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (int i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return len;
}

uint32_t tok_utf8_decode(const uint8_t *s, int len)
{
    switch (len) {
    case 1: return s[0];
    case 2: return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    case 3: return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    default:
        return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
               ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    }
}

int tok_strbuf_append(struct tok_strbuf *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d)
            return ERR_NOMEM;
        b->data = d;
        b->cap = cap;
    }
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

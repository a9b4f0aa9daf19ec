/* lexer.c — template source → token stream, mirroring jinja2 3.1's Lexer with
 * trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False.
 *
 * Rules reproduced exactly: newlines (\r\n, \r, \n) are normalised to \n and one
 * trailing newline is dropped before lexing; `{%-`/`{{-`/`{#-` strip all whitespace
 * before the tag; otherwise, for block and comment tags (never `{{`) not marked `+`,
 * spaces/tabs between the last newline (or the start of a line) and the tag are removed;
 * `-%}`/`-}}`/`-#}` strip all whitespace after; `%}`/`#}` eat one following newline
 * (trim_blocks) unless written `+%}`. Inside tags, an end marker only counts while
 * brackets are balanced, as in jinja2. String literals are decoded here (Python
 * unicode-escape rules). Comments produce no tokens; {% raw %} produces one DATA token.
 */
#include "template/jinja_internal.h"
#include "util/err.h"
#include "util/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct lexer {
    const char *s;
    size_t n, pos;
    int line;
    bool line_starting;
    struct jarena *arena;
    struct jtoks *toks;
    char *err;
    size_t errlen;
};

static int lex_emit(struct lexer *lx, enum jtok_type type, int line, const char *s, size_t n,
                    struct jtok **out)
{
    struct jtoks *t = lx->toks;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        struct jtok *v = realloc(t->v, cap * sizeof *v);
        if (!v) return err_set(lx->err, lx->errlen, ERR_NOMEM, "out of memory");
        t->v = v;
        t->cap = cap;
    }
    struct jtok *tk = &t->v[t->n++];
    memset(tk, 0, sizeof *tk);
    tk->type = type;
    tk->line = line;
    tk->s = s;
    tk->n = n;
    if (out) *out = tk;
    return 0;
}

static void count_lines(struct lexer *lx, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        if (lx->s[i] == '\n') lx->line++;
}

/* Length of a (Unicode) whitespace character at position i, 0 if none. */
static int space_at(const struct lexer *lx, size_t i)
{
    if (i >= lx->n) return 0;
    int l;
    uint32_t cp = jinja_utf8_dec(lx->s + i, lx->s + lx->n, &l);
    return jinja_is_space(cp) ? l : 0;
}

static size_t skip_space(struct lexer *lx, size_t i)
{
    int l;
    while ((l = space_at(lx, i)) > 0) i += (size_t)l;
    return i;
}

static bool at(const struct lexer *lx, size_t i, const char *lit)
{
    size_t n = strlen(lit);
    return i + n <= lx->n && memcmp(lx->s + i, lit, n) == 0;
}

/* Applies jinja2's OptionalLStrip rule to text [from, to) preceding a tag and emits it. */
static int emit_text(struct lexer *lx, size_t from, size_t to, char sign, bool is_var)
{
    int line = lx->line;
    size_t end = to;
    if (sign == '-') {
        /* rstrip() of Python: Unicode whitespace, walking back over UTF-8 */
        while (end > from) {
            size_t b = end - 1;
            while (b > from && ((unsigned char)lx->s[b] & 0xc0) == 0x80) b--;
            int l = space_at(lx, b);
            if (l == 0 || b + (size_t)l != end) break;
            end = b;
        }
    } else if (sign != '+' && !is_var) {
        size_t l_pos = from;
        for (size_t i = to; i > from; i--)
            if (lx->s[i - 1] == '\n') {
                l_pos = i;
                break;
            }
        if (l_pos > from || lx->line_starting) {
            bool only_blank = true;
            for (size_t i = l_pos; i < to; i++)
                if (lx->s[i] != ' ' && lx->s[i] != '\t') only_blank = false;
            if (only_blank) end = l_pos;
        }
    }
    count_lines(lx, from, to);
    if (end > from) return lex_emit(lx, JT_DATA, line, lx->s + from, end - from, NULL);
    return 0;
}

static int lex_fail(struct lexer *lx, const char *msg, const char *what)
{
    return err_set(lx->err, lx->errlen, ERR_FORMAT, "line %d: %s%s", lx->line, msg, what ? what : "");
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes the body of a string literal like Python's
 * value.encode("ascii", "backslashreplace").decode("unicode-escape"). */
static int decode_string(struct lexer *lx, const char *p, size_t n, struct jtok *tk)
{
    char *out = jarena_alloc(lx->arena, n * 3 + 1);
    if (!out) return err_set(lx->err, lx->errlen, ERR_NOMEM, "out of memory");
    size_t o = 0;
    const char *end = p + n;
    while (p < end) {
        if (*p != '\\') {
            out[o++] = *p++;
            continue;
        }
        p++;
        if (p >= end) return lex_fail(lx, "string literal ends with a backslash", NULL);
        char c = *p++;
        uint32_t cp;
        switch (c) {
        case '\n': continue;
        case '\\': out[o++] = '\\'; continue;
        case '\'': out[o++] = '\''; continue;
        case '"': out[o++] = '"'; continue;
        case 'a': out[o++] = '\a'; continue;
        case 'b': out[o++] = '\b'; continue;
        case 'f': out[o++] = '\f'; continue;
        case 'n': out[o++] = '\n'; continue;
        case 'r': out[o++] = '\r'; continue;
        case 't': out[o++] = '\t'; continue;
        case 'v': out[o++] = '\v'; continue;
        case 'N': return lex_fail(lx, "unsupported \\N{...} escape in string literal", NULL);
        case 'x':
        case 'u':
        case 'U': {
            int digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            cp = 0;
            for (int i = 0; i < digits; i++) {
                int h = p + i < end ? hexval(p[i]) : -1;
                if (h < 0) return lex_fail(lx, "truncated \\", c == 'x' ? "xXX escape" : "uXXXX escape");
                cp = cp * 16 + (uint32_t)h;
            }
            p += digits;
            if (cp > 0x10ffff) return lex_fail(lx, "illegal Unicode character in string literal", NULL);
            break;
        }
        default:
            if (c >= '0' && c <= '7') {
                cp = (uint32_t)(c - '0');
                for (int i = 0; i < 2 && p < end && *p >= '0' && *p <= '7'; i++) cp = cp * 8 + (uint32_t)(*p++ - '0');
                break;
            }
            if ((unsigned char)c >= 0x80) {
                /* backslashreplace turned the character into an escape whose own
                 * backslash was consumed by ours: the result is the escape text */
                int l;
                uint32_t u = jinja_utf8_dec(p - 1, end, &l);
                p += l - 1;
                char tmp[16];
                int k = u <= 0xff ? snprintf(tmp, sizeof tmp, "\\x%02x", u)
                        : u <= 0xffff ? snprintf(tmp, sizeof tmp, "\\u%04x", u)
                                      : snprintf(tmp, sizeof tmp, "\\U%08x", u);
                memcpy(out + o, tmp, (size_t)k);
                o += (size_t)k;
                continue;
            }
            out[o++] = '\\';
            out[o++] = c;
            continue;
        }
        o += (size_t)utf8_encode(cp, out + o);
    }
    out[o] = 0;
    tk->s = out;
    tk->n = o;
    return 0;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (unsigned char)c >= 0x80; }
static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/* digits with single underscores between: (\d+_)*\d+ ; returns end or start if none */
static size_t scan_digits(const struct lexer *lx, size_t i)
{
    if (i >= lx->n || !is_digit(lx->s[i])) return i;
    while (i < lx->n) {
        if (is_digit(lx->s[i])) i++;
        else if (lx->s[i] == '_' && i + 1 < lx->n && is_digit(lx->s[i + 1])) i++;
        else break;
    }
    return i;
}

static int lex_number(struct lexer *lx)
{
    size_t start = lx->pos, i = scan_digits(lx, start);
    bool is_float = false;
    bool after_dot = start > 0 && lx->s[start - 1] == '.';
    if (!after_dot) {
        size_t j = i;
        if (j < lx->n && lx->s[j] == '.' && scan_digits(lx, j + 1) > j + 1) {
            j = scan_digits(lx, j + 1);
            is_float = true;
        }
        if (j < lx->n && (lx->s[j] == 'e' || lx->s[j] == 'E')) {
            size_t k = j + 1;
            if (k < lx->n && (lx->s[k] == '+' || lx->s[k] == '-')) k++;
            if (scan_digits(lx, k) > k) {
                j = scan_digits(lx, k);
                is_float = true;
            }
        }
        if (is_float) i = j;
    }
    char buf[128];
    size_t bn = 0;
    for (size_t k = start; k < i && bn < sizeof buf - 1; k++)
        if (lx->s[k] != '_') buf[bn++] = lx->s[k];
    buf[bn] = 0;
    struct jtok *tk;
    int rc;
    if (is_float) {
        if ((rc = lex_emit(lx, JT_FLOAT, lx->line, lx->s + start, i - start, &tk))) return rc;
        tk->f = strtod(buf, NULL);
    } else {
        int base = 10;
        if (bn >= 1 && buf[0] == '0' && i < lx->n && strchr("xXoObB", lx->s[i]) && i == start + 1) {
            char b = lx->s[i];
            base = (b == 'x' || b == 'X') ? 16 : (b == 'o' || b == 'O') ? 8 : 2;
            i++;
            bn = 0;
            while (i < lx->n && (hexval(lx->s[i]) >= 0 || lx->s[i] == '_') && bn < sizeof buf - 1) {
                if (lx->s[i] != '_') {
                    if (hexval(lx->s[i]) >= base) break;
                    buf[bn++] = lx->s[i];
                }
                i++;
            }
            buf[bn] = 0;
            if (bn == 0) return lex_fail(lx, "invalid integer literal", NULL);
        } else if (bn > 1 && buf[0] == '0') {
            for (size_t k = 0; k < bn; k++)
                if (buf[k] != '0') return lex_fail(lx, "invalid integer literal with leading zero", NULL);
        }
        if ((rc = lex_emit(lx, JT_INT, lx->line, lx->s + start, i - start, &tk))) return rc;
        char *e;
        unsigned long long v = strtoull(buf, &e, base);
        if (bn > 19 || v > (unsigned long long)INT64_MAX)
            return lex_fail(lx, "integer literal out of the supported 64-bit range", NULL);
        tk->i = (int64_t)v;
    }
    lx->pos = i;
    return 0;
}

static const char *const ops2[] = { "**", "//", "==", "!=", ">=", "<=" };
static const char ops1[] = "+-/*%~[](){}><=.:|,;";

static int lex_tag(struct lexer *lx, bool is_var)
{
    char stack[JINJA_MAX_DEPTH];
    int depth = 0;
    int open_line = lx->line;
    for (;;) {
        size_t p = lx->pos;
        if (p >= lx->n)
            return err_set(lx->err, lx->errlen, ERR_FORMAT, "line %d: unexpected end of template: '%s' opened on line %d is not closed",
                           lx->line, is_var ? "{{" : "{%", open_line);
        if (depth == 0) {
            size_t e = 0;
            if (!is_var && at(lx, p, "+%}")) e = p + 3;
            else if (at(lx, p, is_var ? "-}}" : "-%}")) e = skip_space(lx, p + 3);
            else if (at(lx, p, is_var ? "}}" : "%}")) {
                e = p + 2;
                if (!is_var && e < lx->n && lx->s[e] == '\n') e++;
            }
            if (e) {
                int rc = lex_emit(lx, is_var ? JT_VAR_END : JT_BLOCK_END, lx->line, NULL, 0, NULL);
                if (rc) return rc;
                count_lines(lx, p, e);
                lx->line_starting = lx->s[e - 1] == '\n';
                lx->pos = e;
                return 0;
            }
        }
        int sl = space_at(lx, p);
        if (sl) {
            size_t e = skip_space(lx, p);
            count_lines(lx, p, e);
            lx->pos = e;
            continue;
        }
        char c = lx->s[p];
        int rc;
        if (is_digit(c)) {
            if ((rc = lex_number(lx))) return rc;
            continue;
        }
        if (is_name_start(c)) {
            size_t e = p;
            while (e < lx->n && is_name_char(lx->s[e])) e++;
            if ((rc = lex_emit(lx, JT_NAME, lx->line, lx->s + p, e - p, NULL))) return rc;
            lx->pos = e;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t e = p + 1;
            while (e < lx->n && lx->s[e] != c) e += lx->s[e] == '\\' ? 2 : 1;
            if (e >= lx->n) return lex_fail(lx, "unterminated string literal", NULL);
            struct jtok *tk;
            if ((rc = lex_emit(lx, JT_STRING, lx->line, NULL, 0, &tk))) return rc;
            if ((rc = decode_string(lx, lx->s + p + 1, e - p - 1, tk))) return rc;
            count_lines(lx, p, e);
            lx->pos = e + 1;
            continue;
        }
        size_t oplen = 0;
        for (size_t k = 0; k < sizeof ops2 / sizeof ops2[0]; k++)
            if (at(lx, p, ops2[k])) oplen = 2;
        if (!oplen && strchr(ops1, c) && c) oplen = 1;
        if (!oplen) {
            char what[8] = { c, '\'', 0 };
            return lex_fail(lx, "unexpected character '", what);
        }
        if (oplen == 1 && (c == '(' || c == '[' || c == '{')) {
            if (depth >= JINJA_MAX_DEPTH) return lex_fail(lx, "brackets nested too deeply", NULL);
            stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        } else if (oplen == 1 && (c == ')' || c == ']' || c == '}')) {
            if (depth == 0 || stack[depth - 1] != c) {
                char what[4] = { c, '\'', 0 };
                return lex_fail(lx, "unexpected '", what);
            }
            depth--;
        }
        if ((rc = lex_emit(lx, JT_OP, lx->line, lx->s + p, oplen, NULL))) return rc;
        lx->pos = p + oplen;
    }
}

/* {%[-+]?\s*raw\s*(-%}\s*|%}) at i: returns end or 0; *sign gets the sign */
static size_t match_raw_begin(struct lexer *lx, size_t i, char *sign)
{
    size_t p = i + 2;
    *sign = 0;
    if (p < lx->n && (lx->s[p] == '-' || lx->s[p] == '+')) *sign = lx->s[p++];
    p = skip_space(lx, p);
    if (!at(lx, p, "raw")) return 0;
    p = skip_space(lx, p + 3);
    if (at(lx, p, "-%}")) return skip_space(lx, p + 3);
    if (at(lx, p, "%}")) return p + 2;
    return 0;
}

static int lex_raw(struct lexer *lx)
{
    for (size_t q = lx->pos; q + 1 < lx->n; q++) {
        if (lx->s[q] != '{' || lx->s[q + 1] != '%') continue;
        size_t p = q + 2;
        char sign = 0;
        if (p < lx->n && (lx->s[p] == '-' || lx->s[p] == '+')) sign = lx->s[p++];
        p = skip_space(lx, p);
        if (!at(lx, p, "endraw")) continue;
        p = skip_space(lx, p + 6);
        size_t e = 0;
        if (at(lx, p, "+%}")) e = p + 3;
        else if (at(lx, p, "-%}")) e = skip_space(lx, p + 3);
        else if (at(lx, p, "%}")) e = p + 2 + (p + 2 < lx->n && lx->s[p + 2] == '\n');
        if (!e) continue;
        int rc = emit_text(lx, lx->pos, q, sign, false);
        if (rc) return rc;
        count_lines(lx, q, e);
        lx->line_starting = lx->s[e - 1] == '\n';
        lx->pos = e;
        return 0;
    }
    return lex_fail(lx, "missing end of raw directive", NULL);
}

static int lex_comment(struct lexer *lx)
{
    for (size_t p = lx->pos; p < lx->n; p++) {
        size_t e = 0;
        if (at(lx, p, "+#}")) e = p + 3;
        else if (at(lx, p, "-#}")) e = skip_space(lx, p + 3);
        else if (at(lx, p, "#}")) e = p + 2 + (p + 2 < lx->n && lx->s[p + 2] == '\n');
        if (!e) continue;
        count_lines(lx, lx->pos, e);
        lx->line_starting = lx->s[e - 1] == '\n';
        lx->pos = e;
        return 0;
    }
    return lex_fail(lx, "missing end of comment tag", NULL);
}

int jinja_lex(const char *src, size_t len, struct jarena *arena, struct jtoks *toks,
              char *err, size_t errlen)
{
    /* normalise newlines and drop one trailing newline (keep_trailing_newline=False) */
    char *s = jarena_alloc(arena, len + 1);
    if (!s) return err_set(err, errlen, ERR_NOMEM, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n > 0 && s[n - 1] == '\n') n--;
    s[n] = 0;

    struct lexer lx = { .s = s, .n = n, .line = 1, .line_starting = true, .arena = arena,
                        .toks = toks, .err = err, .errlen = errlen };
    int rc;
    while (lx.pos < lx.n) {
        size_t q = lx.pos;
        while (q + 1 < lx.n && !(lx.s[q] == '{' && (lx.s[q + 1] == '{' || lx.s[q + 1] == '%' || lx.s[q + 1] == '#'))) q++;
        if (q + 1 >= lx.n) {
            if ((rc = lex_emit(&lx, JT_DATA, lx.line, lx.s + lx.pos, lx.n - lx.pos, NULL))) return rc;
            count_lines(&lx, lx.pos, lx.n);
            lx.pos = lx.n;
            break;
        }
        char kind = lx.s[q + 1];
        char sign = 0, raw_sign = 0;
        size_t raw_end = kind == '%' ? match_raw_begin(&lx, q, &raw_sign) : 0;
        if (raw_end) sign = raw_sign;
        else if (q + 2 < lx.n && (lx.s[q + 2] == '-' || lx.s[q + 2] == '+')) sign = lx.s[q + 2];
        if ((rc = emit_text(&lx, lx.pos, q, sign, kind == '{'))) return rc;
        if (raw_end) {
            count_lines(&lx, q, raw_end);
            lx.line_starting = lx.s[raw_end - 1] == '\n';
            lx.pos = raw_end;
            if ((rc = lex_raw(&lx))) return rc;
            continue;
        }
        lx.pos = q + 2 + (sign ? 1 : 0);
        lx.line_starting = false;
        if (kind == '#') {
            if ((rc = lex_comment(&lx))) return rc;
            continue;
        }
        if ((rc = lex_emit(&lx, kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, lx.line, NULL, 0, NULL))) return rc;
        if ((rc = lex_tag(&lx, kind == '{'))) return rc;
    }
    return lex_emit(&lx, JT_EOF, lx.line, NULL, 0, NULL);
}

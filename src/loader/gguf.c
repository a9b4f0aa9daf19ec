/* gguf.c — GGUF v2/v3 parser (see gguf.h for the contract).
 *
 * Owns: struct gguf_file, i.e. a compact index over a caller's buffer. Nothing from the
 * buffer is copied except tensor names (NUL-terminated copies in one block, because
 * struct tensor.name is a C string) and the file name (for error messages).
 *
 * Layout parsed (little-endian, read with memcpy so unaligned buffers are fine):
 *   "GGUF" u32 version u64 tensor_count u64 kv_count
 *   kv_count × { str key, u32 vtype, value }        str = u64 len + bytes
 *   tensor_count × { str name, u32 n_dims, n_dims × u64 ne, u32 type, u64 offset }
 *   padding to general.alignment (default 32), then the data section.
 *
 * Invariants after a successful gguf_parse: every kv's value (and every array element,
 * nested arrays included) lies inside the buffer; keys and tensor names are unique and
 * contain no NUL byte; every tensor is a supported type with positive dims, an exact
 * byte size, an aligned offset, and data inside the buffer not overlapping another
 * tensor. Lookups go through open-addressing hash tables (FNV-1a), so gguf_find_key and
 * gguf_find_tensor are O(1). String-array elements are indexed at parse time (one u64
 * offset per element) so gguf_arr_str is O(1) too.
 */
#include "loader/gguf.h"

#include "util/err.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_NESTING 8       /* arrays of arrays of ... deeper than this are refused */
#define GGUF_MIN_KV_BYTES 14    /* u64 key len + >=1 key byte + u32 type + >=1 value byte */
#define GGUF_MIN_TINFO_BYTES 33 /* u64 len + >=1 name byte + u32 n_dims + u64 ne + u32 type + u64 offset */

struct gguf_kv {
    uint64_t key_off;   /* key bytes (after the u64 length) */
    uint64_t key_len;
    uint64_t val_off;   /* scalars: the value; arrays: the first element */
    uint64_t count;     /* arrays: element count; scalars: 1 */
    uint64_t str_base;  /* string arrays: first index into gguf_file.str_offs */
    uint32_t type;      /* enum gguf_vtype */
    uint32_t elem_type; /* arrays: element type */
};

struct gguf_tensor_rec {
    struct tensor t;    /* t.name points into gguf_file.names */
    uint64_t offset;    /* relative to the data section, as in the file */
    uint64_t name_off;  /* name bytes in buf (used while parsing) */
    uint64_t name_len;
};

struct gguf_file {
    const uint8_t *buf; /* [len], caller-owned */
    size_t len;
    char *name;         /* copy of the file name, for getter error messages */
    uint32_t version;
    uint32_t alignment;
    uint64_t data_off;  /* start of the data section in buf */

    int64_t n_kv;
    struct gguf_kv *kv;        /* [n_kv] */
    uint64_t *kv_slots;        /* [kv_cap] hash slots: kv index + 1, 0 = empty */
    uint64_t kv_cap;           /* power of two >= 2 * n_kv */

    uint64_t *str_offs;        /* offsets of each string-array element's u64 length */
    uint64_t n_str, cap_str;

    int64_t n_tensors;
    struct gguf_tensor_rec *tensors; /* [n_tensors] */
    char *names;                     /* all tensor names, each NUL-terminated */
    uint64_t *t_slots;               /* [t_cap] hash slots: tensor index + 1 */
    uint64_t t_cap;
};

/* ---- little-endian bounds-checked reader --------------------------------------------- */

struct reader {
    const uint8_t *buf;
    size_t len;
    size_t pos;
};

static int rd_has(const struct reader *r, uint64_t n) { return n <= r->len - r->pos; }

static uint32_t rd_u32_at(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static uint64_t rd_u64_at(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* Each returns 0 on success, -1 if fewer than the needed bytes remain (pos unchanged). */
static int rd_u32(struct reader *r, uint32_t *v)
{
    if (!rd_has(r, 4)) return -1;
    *v = rd_u32_at(r->buf + r->pos);
    r->pos += 4;
    return 0;
}

static int rd_u64(struct reader *r, uint64_t *v)
{
    if (!rd_has(r, 8)) return -1;
    *v = rd_u64_at(r->buf + r->pos);
    r->pos += 8;
    return 0;
}

/* ---- value types ---------------------------------------------------------------------- */

static const char *vtype_name(uint32_t t)
{
    static const char *names[] = { "uint8", "int8", "uint16", "int16", "uint32", "int32",
                                   "float32", "bool", "string", "array", "uint64", "int64",
                                   "float64" };
    return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

/* Bytes of one fixed-size value, 0 for string/array/unknown. */
static uint64_t vtype_size(uint32_t t)
{
    switch (t) {
    case GGUF_UINT8: case GGUF_INT8: case GGUF_BOOL: return 1;
    case GGUF_UINT16: case GGUF_INT16: return 2;
    case GGUF_UINT32: case GGUF_INT32: case GGUF_FLOAT32: return 4;
    case GGUF_UINT64: case GGUF_INT64: case GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static int vtype_is_int(uint32_t t)
{
    switch (t) {
    case GGUF_UINT8: case GGUF_INT8: case GGUF_UINT16: case GGUF_INT16: case GGUF_UINT32:
    case GGUF_INT32: case GGUF_UINT64: case GGUF_INT64: case GGUF_BOOL: return 1;
    default: return 0;
    }
}

static int vtype_is_float(uint32_t t) { return t == GGUF_FLOAT32 || t == GGUF_FLOAT64; }

/* Reads a fixed-size integer value at p as int64; uint64 above INT64_MAX sets *big. */
static int64_t val_int_at(const uint8_t *p, uint32_t t, int *big)
{
    *big = 0;
    switch (t) {
    case GGUF_UINT8: return p[0];
    case GGUF_BOOL: return p[0] != 0;
    case GGUF_INT8: return (int8_t)p[0];
    case GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case GGUF_INT16: { int16_t v; memcpy(&v, p, 2); return v; }
    case GGUF_UINT32: return rd_u32_at(p);
    case GGUF_INT32: return (int32_t)rd_u32_at(p);
    case GGUF_INT64: return (int64_t)rd_u64_at(p);
    case GGUF_UINT64: {
        uint64_t v = rd_u64_at(p);
        if (v > INT64_MAX) { *big = 1; return INT64_MAX; }
        return (int64_t)v;
    }
    default: assert(0 && "not an integer type"); return 0;
    }
}

static double val_float_at(const uint8_t *p, uint32_t t)
{
    if (t == GGUF_FLOAT32) { uint32_t b = rd_u32_at(p); float f; memcpy(&f, &b, 4); return f; }
    if (t == GGUF_FLOAT64) { uint64_t b = rd_u64_at(p); double d; memcpy(&d, &b, 8); return d; }
    if (t == GGUF_UINT64) return (double)rd_u64_at(p);
    int big;
    return (double)val_int_at(p, t, &big);
}

/* ---- ggml tensor type names (for messages about types we do not support) ------------- */

static const char *ggml_type_name(uint32_t t)
{
    static const char *names[] = {
        [0] = "F32", [1] = "F16", [2] = "Q4_0", [3] = "Q4_1", [4] = "Q4_2", [5] = "Q4_3",
        [6] = "Q5_0", [7] = "Q5_1", [8] = "Q8_0", [9] = "Q8_1", [10] = "Q2_K", [11] = "Q3_K",
        [12] = "Q4_K", [13] = "Q5_K", [14] = "Q6_K", [15] = "Q8_K", [16] = "IQ2_XXS",
        [17] = "IQ2_XS", [18] = "IQ3_XXS", [19] = "IQ1_S", [20] = "IQ4_NL", [21] = "IQ3_S",
        [22] = "IQ2_S", [23] = "IQ4_XS", [24] = "I8", [25] = "I16", [26] = "I32",
        [27] = "I64", [28] = "F64", [29] = "IQ1_M", [30] = "BF16", [31] = "Q4_0_4_4",
        [32] = "Q4_0_4_8", [33] = "Q4_0_8_8", [34] = "TQ1_0", [35] = "TQ2_0",
        [36] = "IQ4_NL_4_4", [37] = "IQ4_NL_4_8", [38] = "IQ4_NL_8_8", [39] = "MXFP4",
    };
    return t < sizeof names / sizeof names[0] ? names[t] : NULL;
}

#define GGUF_SUPPORTED_TYPES "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K"

/* ---- hash tables ---------------------------------------------------------------------- */

static uint64_t hash_bytes(const void *p, size_t n)
{
    const uint8_t *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

/* Smallest power of two >= 2n (at least 16). n is bounded by the buffer length, so this
 * cannot overflow. */
static uint64_t table_cap(uint64_t n)
{
    uint64_t c = 16;
    while (c < 2 * n) c <<= 1;
    return c;
}

static int kv_key_eq(const struct gguf_file *g, uint64_t i, const char *key, size_t n)
{
    return g->kv[i].key_len == n && memcmp(g->buf + g->kv[i].key_off, key, n) == 0;
}

/* Finds key (n bytes) in the kv table; returns the index or -1. Empty slot => absent. */
static int64_t kv_lookup(const struct gguf_file *g, const char *key, size_t n)
{
    if (!g->kv_cap) return -1;
    uint64_t mask = g->kv_cap - 1;
    for (uint64_t s = hash_bytes(key, n) & mask;; s = (s + 1) & mask) {
        uint64_t v = g->kv_slots[s];
        if (!v) return -1;
        if (kv_key_eq(g, v - 1, key, n)) return (int64_t)(v - 1);
    }
}

/* Inserts kv i; returns the index of an existing kv with the same key, or -1. */
static int64_t kv_insert(struct gguf_file *g, uint64_t i)
{
    const char *key = (const char *)g->buf + g->kv[i].key_off;
    size_t n = (size_t)g->kv[i].key_len;
    uint64_t mask = g->kv_cap - 1;
    for (uint64_t s = hash_bytes(key, n) & mask;; s = (s + 1) & mask) {
        uint64_t v = g->kv_slots[s];
        if (!v) { g->kv_slots[s] = i + 1; return -1; }
        if (kv_key_eq(g, v - 1, key, n)) return (int64_t)(v - 1);
    }
}

static int64_t tensor_lookup(const struct gguf_file *g, const char *name)
{
    if (!g->t_cap) return -1;
    uint64_t mask = g->t_cap - 1;
    for (uint64_t s = hash_bytes(name, strlen(name)) & mask;; s = (s + 1) & mask) {
        uint64_t v = g->t_slots[s];
        if (!v) return -1;
        if (strcmp(g->tensors[v - 1].t.name, name) == 0) return (int64_t)(v - 1);
    }
}

static int64_t tensor_insert(struct gguf_file *g, uint64_t i)
{
    const char *name = g->tensors[i].t.name;
    uint64_t mask = g->t_cap - 1;
    for (uint64_t s = hash_bytes(name, strlen(name)) & mask;; s = (s + 1) & mask) {
        uint64_t v = g->t_slots[s];
        if (!v) { g->t_slots[s] = i + 1; return -1; }
        if (strcmp(g->tensors[v - 1].t.name, name) == 0) return (int64_t)(v - 1);
    }
}

/* ---- parsing -------------------------------------------------------------------------- */

/* Context shared by the parse helpers, so messages can name the file and the key. */
struct parse_ctx {
    struct gguf_file *g;
    struct reader r;
    const char *name;
    char *err;
    size_t errlen;
};

/* Reads a GGUF string header; on success *off and *n give the bytes and pos moves past them.
 * `what` describes the string in messages ("key of kv 3", "name of tensor 5"). */
static int parse_str(struct parse_ctx *c, const char *what, const char *ctx_key,
                     uint64_t *off, uint64_t *n)
{
    size_t at = c->r.pos;
    if (rd_u64(&c->r, n) < 0)
        return err_set(c->err, c->errlen, ERR_FORMAT, "%s: truncated at offset %zu reading %s%s%s%s",
                       c->name, at, what, ctx_key ? " '" : "", ctx_key ? ctx_key : "", ctx_key ? "'" : "");
    if (!rd_has(&c->r, *n))
        return err_set(c->err, c->errlen, ERR_FORMAT,
                       "%s: %s%s%s%s at offset %zu has length %llu, past the end of the file (%zu bytes)",
                       c->name, what, ctx_key ? " '" : "", ctx_key ? ctx_key : "", ctx_key ? "'" : "",
                       at, (unsigned long long)*n, c->r.len);
    *off = c->r.pos;
    c->r.pos += (size_t)*n;
    return 0;
}

/* Returns p grown to twice its capacity (*cap elements of sz bytes, at least 64), or NULL
 * with p untouched. Arrays grow as entries are parsed, so a lying count in a header
 * costs no memory beyond what the file actually holds. */
static void *grow(void *p, uint64_t *cap, size_t sz)
{
    uint64_t c = *cap ? *cap * 2 : 64;
    if (c > SIZE_MAX / sz) return NULL;
    void *q = realloc(p, (size_t)c * sz);
    if (q) *cap = c;
    return q;
}

/* Appends a string-array element offset to g->str_offs. */
static int push_str_off(struct parse_ctx *c, uint64_t off)
{
    struct gguf_file *g = c->g;
    if (g->n_str == g->cap_str) {
        void *p = grow(g->str_offs, &g->cap_str, sizeof *g->str_offs);
        if (!p)
            return err_set(c->err, c->errlen, ERR_NOMEM, "%s: out of memory indexing string arrays",
                           c->name);
        g->str_offs = p;
    }
    g->str_offs[g->n_str++] = off;
    return 0;
}

/* Validates and skips one value of type t (key is the kv's key, NUL-terminated copy for
 * messages). For arrays at depth 0, fills kv->elem_type/count/val_off and indexes string
 * elements. Recursion is bounded by GGUF_MAX_NESTING; total work is linear in the
 * bytes consumed because every element occupies at least one byte. */
static int parse_value(struct parse_ctx *c, uint32_t t, const char *key, int depth,
                       struct gguf_kv *kv)
{
    size_t at = c->r.pos;
    uint64_t sz = vtype_size(t);
    if (sz) {
        if (!rd_has(&c->r, sz))
            return err_set(c->err, c->errlen, ERR_FORMAT,
                           "%s: key '%s': truncated at offset %zu reading a %s value", c->name, key,
                           at, vtype_name(t));
        c->r.pos += (size_t)sz;
        return 0;
    }
    if (t == GGUF_STRING) {
        uint64_t off, n;
        return parse_str(c, "string value of key", key, &off, &n);
    }
    if (t != GGUF_ARRAY)
        return err_set(c->err, c->errlen, ERR_FORMAT,
                       "%s: key '%s' at offset %zu has unknown value type %u", c->name, key, at, t);

    if (depth >= GGUF_MAX_NESTING)
        return err_set(c->err, c->errlen, ERR_FORMAT,
                       "%s: key '%s': arrays nested deeper than %d levels", c->name, key,
                       GGUF_MAX_NESTING);
    uint32_t et;
    uint64_t count;
    if (rd_u32(&c->r, &et) < 0 || rd_u64(&c->r, &count) < 0)
        return err_set(c->err, c->errlen, ERR_FORMAT,
                       "%s: key '%s': truncated at offset %zu reading an array header", c->name,
                       key, at);
    uint64_t esz = vtype_size(et);
    uint64_t min = esz ? esz : et == GGUF_STRING ? 8 : et == GGUF_ARRAY ? 12 : 0;
    if (!min)
        return err_set(c->err, c->errlen, ERR_FORMAT,
                       "%s: key '%s': array at offset %zu has unknown element type %u", c->name,
                       key, at, et);
    uint64_t rem = c->r.len - c->r.pos;
    if (count > rem / min)
        return err_set(c->err, c->errlen, ERR_FORMAT,
                       "%s: key '%s': array of %llu %s elements cannot fit in the %llu bytes left",
                       c->name, key, (unsigned long long)count, vtype_name(et),
                       (unsigned long long)rem);
    if (depth == 0) {
        kv->elem_type = et;
        kv->count = count;
        kv->val_off = c->r.pos;
        kv->str_base = c->g->n_str;
    }
    if (esz) {
        c->r.pos += (size_t)(count * esz); /* fits: checked against rem above */
        return 0;
    }
    for (uint64_t i = 0; i < count; i++) {
        if (et == GGUF_STRING && depth == 0) {
            int rc = push_str_off(c, c->r.pos);
            if (rc) return rc;
        }
        int rc = parse_value(c, et, key, depth + 1, kv);
        if (rc) return rc;
    }
    return 0;
}

static int parse_kvs(struct parse_ctx *c, uint64_t kv_count)
{
    struct gguf_file *g = c->g;
    uint64_t rem = c->r.len - c->r.pos;
    if (kv_count > rem / GGUF_MIN_KV_BYTES)
        return err_set(c->err, c->errlen, ERR_FORMAT,
                       "%s: kv_count %llu cannot fit in a file of %zu bytes", c->name,
                       (unsigned long long)kv_count, c->r.len);

    uint64_t cap = 0;
    char key[256]; /* NUL-terminated, possibly shortened copy of the key for messages */
    for (uint64_t i = 0; i < kv_count; i++) {
        if (i == cap) {
            void *p = grow(g->kv, &cap, sizeof *g->kv);
            if (!p) goto nomem;
            g->kv = p;
        }
        struct gguf_kv *kv = &g->kv[i];
        memset(kv, 0, sizeof *kv);
        char what[64];
        snprintf(what, sizeof what, "key of kv %llu", (unsigned long long)i);
        int rc = parse_str(c, what, NULL, &kv->key_off, &kv->key_len);
        if (rc) return rc;
        size_t kn = kv->key_len < sizeof key - 1 ? (size_t)kv->key_len : sizeof key - 1;
        memcpy(key, c->r.buf + kv->key_off, kn);
        key[kn] = 0;
        if (kv->key_len == 0)
            return err_set(c->err, c->errlen, ERR_FORMAT, "%s: kv %llu has an empty key",
                           c->name, (unsigned long long)i);
        if (memchr(c->r.buf + kv->key_off, 0, (size_t)kv->key_len))
            return err_set(c->err, c->errlen, ERR_FORMAT, "%s: key '%s' (kv %llu) contains a NUL byte",
                           c->name, key, (unsigned long long)i);
        if (rd_u32(&c->r, &kv->type) < 0)
            return err_set(c->err, c->errlen, ERR_FORMAT,
                           "%s: key '%s': truncated at offset %zu reading the value type", c->name,
                           key, c->r.pos);
        kv->val_off = c->r.pos;
        kv->count = 1;
        rc = parse_value(c, kv->type, key, 0, kv);
        if (rc) return rc;
        g->n_kv = (int64_t)i + 1;
    }

    g->kv_cap = table_cap(kv_count);
    g->kv_slots = calloc((size_t)g->kv_cap, sizeof *g->kv_slots);
    if (!g->kv_slots) goto nomem;
    for (uint64_t i = 0; i < kv_count; i++) {
        int64_t dup = kv_insert(g, i);
        if (dup >= 0) {
            const struct gguf_kv *kv = &g->kv[i];
            return err_set(c->err, c->errlen, ERR_FORMAT, "%s: duplicate key '%.*s' (kvs %lld and %llu)",
                           c->name, kv->key_len > 255 ? 255 : (int)kv->key_len,
                           (const char *)g->buf + kv->key_off, (long long)dup, (unsigned long long)i);
        }
    }
    return 0;
nomem:
    return err_set(c->err, c->errlen, ERR_NOMEM, "%s: out of memory for %llu kvs", c->name,
                   (unsigned long long)kv_count);
}

/* Reads general.alignment (must be uint32, non-zero power of two) into g->alignment. */
static int parse_alignment(struct parse_ctx *c)
{
    struct gguf_file *g = c->g;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = kv_lookup(g, "general.alignment", strlen("general.alignment"));
    if (i < 0) return 0;
    const struct gguf_kv *kv = &g->kv[i];
    if (kv->type != GGUF_UINT32)
        return err_set(c->err, c->errlen, ERR_FORMAT,
                       "%s: key 'general.alignment' has type %s, expected uint32", c->name,
                       vtype_name(kv->type));
    uint32_t a = rd_u32_at(g->buf + kv->val_off);
    if (a == 0 || (a & (a - 1)))
        return err_set(c->err, c->errlen, ERR_FORMAT,
                       "%s: key 'general.alignment' is %u, must be a non-zero power of two",
                       c->name, a);
    g->alignment = a;
    return 0;
}

/* Parses tensor info i into rec (the name stays in buf: rec->name_off/name_len). */
static int parse_tensor_info(struct parse_ctx *c, uint64_t i, struct gguf_tensor_rec *rec)
{
    uint64_t *name_off = &rec->name_off, *name_len = &rec->name_len;
    char what[64];
    snprintf(what, sizeof what, "name of tensor %llu", (unsigned long long)i);
    int rc = parse_str(c, what, NULL, name_off, name_len);
    if (rc) return rc;
    char nm[256];
    size_t nn = *name_len < sizeof nm - 1 ? (size_t)*name_len : sizeof nm - 1;
    memcpy(nm, c->r.buf + *name_off, nn);
    nm[nn] = 0;
    if (*name_len == 0)
        return err_set(c->err, c->errlen, ERR_FORMAT, "%s: tensor %llu has an empty name",
                       c->name, (unsigned long long)i);
    if (memchr(c->r.buf + *name_off, 0, (size_t)*name_len))
        return err_set(c->err, c->errlen, ERR_FORMAT, "%s: tensor '%s' name contains a NUL byte",
                       c->name, nm);

    uint32_t n_dims;
    if (rd_u32(&c->r, &n_dims) < 0) goto truncated;
    if (n_dims < 1 || n_dims > TENSOR_MAX_DIMS)
        return err_set(c->err, c->errlen, ERR_FORMAT,
                       "%s: tensor '%s' has n_dims %u, must be 1..%d", c->name, nm, n_dims,
                       TENSOR_MAX_DIMS);
    struct tensor *t = &rec->t;
    t->n_dims = (int)n_dims;
    for (int d = 0; d < TENSOR_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t v;
        if (rd_u64(&c->r, &v) < 0) goto truncated;
        t->ne[d] = (int64_t)v;
    }
    uint32_t type;
    if (rd_u32(&c->r, &type) < 0 || rd_u64(&c->r, &rec->offset) < 0) goto truncated;

    for (uint32_t d = 0; d < n_dims; d++)
        if (t->ne[d] <= 0)
            return err_set(c->err, c->errlen, ERR_FORMAT,
                           "%s: tensor '%s' has ne[%u] = %lld, must be positive", c->name, nm, d,
                           (long long)t->ne[d]);
    if (!dtype_is_supported(type > INT32_MAX ? -1 : (int)type)) {
        const char *tn = ggml_type_name(type);
        if (tn)
            return err_set(c->err, c->errlen, ERR_UNSUPPORTED,
                           "%s: tensor '%s' has type %u (%s), which is not supported; supported: "
                           GGUF_SUPPORTED_TYPES, c->name, nm, type, tn);
        return err_set(c->err, c->errlen, ERR_UNSUPPORTED,
                       "%s: tensor '%s' has type %u, which is not supported; supported: "
                       GGUF_SUPPORTED_TYPES, c->name, nm, type);
    }
    t->type = (enum dtype)type;
    int be = dtype_block_elems(t->type);
    if (t->ne[0] % be)
        return err_set(c->err, c->errlen, ERR_FORMAT,
                       "%s: tensor '%s' has ne[0] = %lld, not a multiple of the %s block size %d",
                       c->name, nm, (long long)t->ne[0], dtype_name(t->type), be);
    if (tensor_nelements(t) < 0) goto overflow;
    size_t row = dtype_row_bytes(t->type, t->ne[0]);
    if (!row) goto overflow;
    size_t nbytes = row;
    for (int d = 1; d < TENSOR_MAX_DIMS; d++) {
        if ((uint64_t)t->ne[d] > SIZE_MAX / nbytes) goto overflow;
        nbytes *= (size_t)t->ne[d];
    }
    t->nbytes = nbytes;
    if (rec->offset % c->g->alignment)
        return err_set(c->err, c->errlen, ERR_FORMAT,
                       "%s: tensor '%s' offset %llu is not a multiple of the alignment %u",
                       c->name, nm, (unsigned long long)rec->offset, c->g->alignment);
    return 0;
truncated:
    return err_set(c->err, c->errlen, ERR_FORMAT, "%s: tensor '%s': truncated at offset %zu",
                   c->name, nm, c->r.pos);
overflow:
    return err_set(c->err, c->errlen, ERR_FORMAT,
                   "%s: tensor '%s' element or byte count overflows (ne = %lld x %lld x %lld x %lld)",
                   c->name, nm, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                   (long long)t->ne[3]);
}

struct span { uint64_t begin, end; int64_t idx; };

static int span_cmp(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int parse_tensors(struct parse_ctx *c, uint64_t tensor_count)
{
    struct gguf_file *g = c->g;
    uint64_t rem = c->r.len - c->r.pos;
    if (tensor_count > rem / GGUF_MIN_TINFO_BYTES)
        return err_set(c->err, c->errlen, ERR_FORMAT,
                       "%s: tensor_count %llu cannot fit in the %llu bytes after the metadata",
                       c->name, (unsigned long long)tensor_count, (unsigned long long)rem);
    int rc = 0;
    struct span *spans = NULL;
    uint64_t cap = 0, name_bytes = 0;
    for (uint64_t i = 0; i < tensor_count; i++) {
        if (i == cap) {
            void *p = grow(g->tensors, &cap, sizeof *g->tensors);
            if (!p) goto nomem;
            g->tensors = p;
        }
        memset(&g->tensors[i], 0, sizeof g->tensors[i]);
        rc = parse_tensor_info(c, i, &g->tensors[i]);
        if (rc) return rc;
        name_bytes += g->tensors[i].name_len + 1; /* bounded by the buffer length */
    }

    /* One block of NUL-terminated names; every struct tensor.name points into it. */
    g->names = malloc((size_t)name_bytes + 1);
    g->t_cap = table_cap(tensor_count);
    g->t_slots = calloc((size_t)g->t_cap, sizeof *g->t_slots);
    spans = malloc((tensor_count ? (size_t)tensor_count : 1) * sizeof *spans);
    if (!g->names || !g->t_slots || !spans) goto nomem;
    char *p = g->names;
    for (uint64_t i = 0; i < tensor_count; i++) {
        struct gguf_tensor_rec *r = &g->tensors[i];
        memcpy(p, g->buf + r->name_off, (size_t)r->name_len);
        p[r->name_len] = 0;
        r->t.name = p;
        p += r->name_len + 1;
        g->n_tensors = (int64_t)i + 1;
        int64_t dup = tensor_insert(g, i);
        if (dup >= 0) {
            rc = err_set(c->err, c->errlen, ERR_FORMAT, "%s: duplicate tensor '%s' (tensors %lld and %llu)",
                         c->name, r->t.name, (long long)dup, (unsigned long long)i);
            goto done;
        }
    }

    /* The data section starts at the next multiple of the alignment after the infos.
     * pos <= len and alignment < 2^32, so this cannot wrap. */
    uint64_t a = g->alignment, pos = c->r.pos;
    g->data_off = pos + (a - pos % a) % a;
    uint64_t avail = g->data_off <= g->len ? g->len - g->data_off : 0;
    for (uint64_t i = 0; i < tensor_count; i++) {
        struct gguf_tensor_rec *r = &g->tensors[i];
        uint64_t nb = r->t.nbytes;
        if (r->offset > avail || nb > avail - r->offset) {
            rc = err_set(c->err, c->errlen, ERR_FORMAT,
                         "%s: tensor '%s' data at offset %llu (+%llu bytes) runs past the end of "
                         "the file (data section holds %llu bytes)", c->name, r->t.name,
                         (unsigned long long)r->offset, (unsigned long long)nb,
                         (unsigned long long)avail);
            goto done;
        }
        r->t.data = g->buf + g->data_off + r->offset;
        spans[i] = (struct span){ r->offset, r->offset + nb, (int64_t)i };
    }
    qsort(spans, (size_t)tensor_count, sizeof *spans, span_cmp);
    for (uint64_t i = 1; i < tensor_count; i++) {
        const struct span *x = &spans[i - 1], *y = &spans[i];
        if (y->begin < x->end) {
            rc = err_set(c->err, c->errlen, ERR_FORMAT,
                         "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap", c->name,
                         g->tensors[x->idx].t.name, (unsigned long long)x->begin,
                         (unsigned long long)x->end, g->tensors[y->idx].t.name,
                         (unsigned long long)y->begin, (unsigned long long)y->end);
            goto done;
        }
    }
    goto done;
nomem:
    rc = err_set(c->err, c->errlen, ERR_NOMEM, "%s: out of memory for %llu tensors", c->name,
                 (unsigned long long)tensor_count);
done:
    free(spans);
    return rc;
}

int gguf_parse(const uint8_t *buf, size_t len, const char *name, struct gguf_file **out,
               char *err, size_t errlen)
{
    *out = NULL;
    if (!name) name = "<gguf>";
    if (!buf && len)
        return err_set(err, errlen, ERR_INVALID, "%s: NULL buffer", name);
    struct gguf_file *g = calloc(1, sizeof *g);
    size_t nl = strlen(name);
    if (g) g->name = malloc(nl + 1);
    if (!g || !g->name) {
        gguf_free(g);
        return err_set(err, errlen, ERR_NOMEM, "%s: out of memory", name);
    }
    memcpy(g->name, name, nl + 1);
    g->buf = buf;
    g->len = len;

    struct parse_ctx c = { g, { buf, len, 0 }, name, err, errlen };
    int rc;
    uint32_t version;
    uint64_t tensor_count, kv_count;
    if (len < 4 || memcmp(buf, "GGUF", 4) != 0) {
        rc = err_set(err, errlen, ERR_FORMAT, "%s: not a GGUF file (bad magic)", name);
        goto fail;
    }
    c.r.pos = 4;
    if (rd_u32(&c.r, &version) < 0) {
        rc = err_set(err, errlen, ERR_FORMAT, "%s: truncated at offset 4 reading the version", name);
        goto fail;
    }
    if (version != 2 && version != 3) {
        uint32_t sw = __builtin_bswap32(version);
        rc = err_set(err, errlen, ERR_UNSUPPORTED,
                     "%s: GGUF version %u is not supported (only versions 2 and 3)%s", name,
                     version,
                     version == 1 ? "; re-convert the model with a current llama.cpp"
                     : sw == 2 || sw == 3 ? "; the file looks big-endian, which is not supported"
                                          : "");
        goto fail;
    }
    g->version = version;
    if (rd_u64(&c.r, &tensor_count) < 0 || rd_u64(&c.r, &kv_count) < 0) {
        rc = err_set(err, errlen, ERR_FORMAT, "%s: truncated at offset %zu reading the header",
                     name, c.r.pos);
        goto fail;
    }
    if ((rc = parse_kvs(&c, kv_count))) goto fail;
    if ((rc = parse_alignment(&c))) goto fail;
    if ((rc = parse_tensors(&c, tensor_count))) goto fail;
    *out = g;
    return 0;
fail:
    gguf_free(g);
    return rc;
}

void gguf_free(struct gguf_file *g)
{
    if (!g) return;
    free(g->name);
    free(g->kv);
    free(g->kv_slots);
    free(g->str_offs);
    free(g->tensors);
    free(g->names);
    free(g->t_slots);
    free(g);
}

/* ---- accessors ------------------------------------------------------------------------ */

uint32_t gguf_version(const struct gguf_file *g) { return g->version; }

int64_t gguf_n_kv(const struct gguf_file *g) { return g->n_kv; }

int64_t gguf_find_key(const struct gguf_file *g, const char *key)
{
    return kv_lookup(g, key, strlen(key));
}

struct gguf_str gguf_key_name(const struct gguf_file *g, int64_t i)
{
    assert(i >= 0 && i < g->n_kv);
    return (struct gguf_str){ (const char *)g->buf + g->kv[i].key_off, g->kv[i].key_len };
}

enum gguf_vtype gguf_kv_type(const struct gguf_file *g, int64_t i)
{
    assert(i >= 0 && i < g->n_kv);
    return (enum gguf_vtype)g->kv[i].type;
}

/* Looks key up for a getter: the kv, or NULL with ERR_NOT_FOUND written to err. */
static const struct gguf_kv *get_kv(const struct gguf_file *g, const char *key, char *err,
                                    size_t errlen)
{
    int64_t i = gguf_find_key(g, key);
    if (i < 0) {
        err_set(err, errlen, ERR_NOT_FOUND, "%s: key '%s' not found", g->name, key);
        return NULL;
    }
    return &g->kv[i];
}

static int wrong_type(const struct gguf_file *g, const char *key, const struct gguf_kv *kv,
                      const char *want, char *err, size_t errlen)
{
    if (kv->type == GGUF_ARRAY)
        return err_set(err, errlen, ERR_FORMAT, "%s: key '%s' is an array of %s, expected %s",
                       g->name, key, vtype_name(kv->elem_type), want);
    return err_set(err, errlen, ERR_FORMAT, "%s: key '%s' has type %s, expected %s", g->name,
                   key, vtype_name(kv->type), want);
}

int gguf_get_int(const struct gguf_file *g, const char *key, int64_t *out, char *err, size_t errlen)
{
    const struct gguf_kv *kv = get_kv(g, key, err, errlen);
    if (!kv) return ERR_NOT_FOUND;
    if (!vtype_is_int(kv->type)) return wrong_type(g, key, kv, "an integer", err, errlen);
    int big;
    int64_t v = val_int_at(g->buf + kv->val_off, kv->type, &big);
    if (big)
        return err_set(err, errlen, ERR_FORMAT, "%s: key '%s' value %llu does not fit int64",
                       g->name, key, (unsigned long long)rd_u64_at(g->buf + kv->val_off));
    *out = v;
    return 0;
}

int gguf_get_float(const struct gguf_file *g, const char *key, double *out, char *err, size_t errlen)
{
    const struct gguf_kv *kv = get_kv(g, key, err, errlen);
    if (!kv) return ERR_NOT_FOUND;
    if (kv->type == GGUF_BOOL || (!vtype_is_int(kv->type) && !vtype_is_float(kv->type)))
        return wrong_type(g, key, kv, "a number", err, errlen);
    *out = val_float_at(g->buf + kv->val_off, kv->type);
    return 0;
}

int gguf_get_bool(const struct gguf_file *g, const char *key, bool *out, char *err, size_t errlen)
{
    const struct gguf_kv *kv = get_kv(g, key, err, errlen);
    if (!kv) return ERR_NOT_FOUND;
    if (kv->type != GGUF_BOOL) return wrong_type(g, key, kv, "bool", err, errlen);
    *out = g->buf[kv->val_off] != 0;
    return 0;
}

int gguf_get_str(const struct gguf_file *g, const char *key, struct gguf_str *out, char *err, size_t errlen)
{
    const struct gguf_kv *kv = get_kv(g, key, err, errlen);
    if (!kv) return ERR_NOT_FOUND;
    if (kv->type != GGUF_STRING) return wrong_type(g, key, kv, "string", err, errlen);
    out->len = rd_u64_at(g->buf + kv->val_off);
    out->ptr = (const char *)g->buf + kv->val_off + 8;
    return 0;
}

int gguf_get_arr(const struct gguf_file *g, const char *key, enum gguf_vtype *elem_type,
                 uint64_t *count, char *err, size_t errlen)
{
    const struct gguf_kv *kv = get_kv(g, key, err, errlen);
    if (!kv) return ERR_NOT_FOUND;
    if (kv->type != GGUF_ARRAY)
        return err_set(err, errlen, ERR_FORMAT, "%s: key '%s' has type %s, expected an array",
                       g->name, key, vtype_name(kv->type));
    *elem_type = (enum gguf_vtype)kv->elem_type;
    *count = kv->count;
    return 0;
}

/* The array kv for an element accessor, or NULL if key is absent or not an array. */
static const struct gguf_kv *arr_kv(const struct gguf_file *g, const char *key, uint64_t i)
{
    int64_t k = gguf_find_key(g, key);
    if (k < 0 || g->kv[k].type != GGUF_ARRAY) return NULL;
    assert(i < g->kv[k].count && "array index out of range");
    return &g->kv[k];
}

int64_t gguf_arr_int(const struct gguf_file *g, const char *key, uint64_t i)
{
    const struct gguf_kv *kv = arr_kv(g, key, i);
    if (!kv) return 0;
    uint64_t sz = vtype_size(kv->elem_type);
    const uint8_t *p = g->buf + kv->val_off + i * sz;
    if (vtype_is_int(kv->elem_type)) {
        int big;
        return val_int_at(p, kv->elem_type, &big); /* saturates uint64 at INT64_MAX */
    }
    if (vtype_is_float(kv->elem_type)) {
        double d = val_float_at(p, kv->elem_type);
        if (d != d) return 0;
        if (d >= 9223372036854775807.0) return INT64_MAX;
        if (d <= -9223372036854775808.0) return INT64_MIN;
        return (int64_t)d;
    }
    return 0;
}

double gguf_arr_float(const struct gguf_file *g, const char *key, uint64_t i)
{
    const struct gguf_kv *kv = arr_kv(g, key, i);
    if (!kv || !vtype_size(kv->elem_type)) return 0.0;
    return val_float_at(g->buf + kv->val_off + i * vtype_size(kv->elem_type), kv->elem_type);
}

struct gguf_str gguf_arr_str(const struct gguf_file *g, const char *key, uint64_t i)
{
    const struct gguf_kv *kv = arr_kv(g, key, i);
    if (!kv || kv->elem_type != GGUF_STRING) return (struct gguf_str){ "", 0 };
    uint64_t off = g->str_offs[kv->str_base + i];
    return (struct gguf_str){ (const char *)g->buf + off + 8, rd_u64_at(g->buf + off) };
}

int64_t gguf_n_tensors(const struct gguf_file *g) { return g->n_tensors; }

const struct tensor *gguf_tensor(const struct gguf_file *g, int64_t i)
{
    assert(i >= 0 && i < g->n_tensors);
    return &g->tensors[i].t;
}

const struct tensor *gguf_find_tensor(const struct gguf_file *g, const char *name)
{
    int64_t i = tensor_lookup(g, name);
    return i < 0 ? NULL : &g->tensors[i].t;
}

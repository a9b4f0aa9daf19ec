/* test_gguf.c — loader/gguf: the real model header, round-trips of small files built by
 * a writer in this file (every value type, v2/v3, alignment 32/64, every supported
 * tensor type), and a matrix of malformed files that must each be refused with the
 * right code and a message naming the file and the offending key or tensor.
 *
 * Every parse runs on a heap copy of exactly the file's length, so ASan catches any
 * read past the end.
 */
#include "test.h"
#include "loader/gguf.h"
#include "util/err.h"
#include "util/mapfile.h"

#include <stdint.h>

/* ---- a little GGUF writer ------------------------------------------------------------- */

struct gw {
    uint8_t *b;
    size_t n, cap;
};

static void gw_put(struct gw *w, const void *p, size_t n)
{
    if (w->n + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->n + n) cap *= 2;
        uint8_t *q = realloc(w->b, cap);
        if (!q) { fprintf(stderr, "test_gguf: out of memory\n"); exit(2); }
        w->b = q;
        w->cap = cap;
    }
    if (n) memcpy(w->b + w->n, p, n);
    w->n += n;
}

static void gw_u8(struct gw *w, uint8_t v) { gw_put(w, &v, 1); }
static void gw_u16(struct gw *w, uint16_t v) { gw_put(w, &v, 2); } /* tests run on little-endian hosts */
static void gw_u32(struct gw *w, uint32_t v) { gw_put(w, &v, 4); }
static void gw_u64(struct gw *w, uint64_t v) { gw_put(w, &v, 8); }
static void gw_f32(struct gw *w, float v) { gw_put(w, &v, 4); }
static void gw_f64(struct gw *w, double v) { gw_put(w, &v, 8); }
static void gw_strn(struct gw *w, const char *s, size_t n) { gw_u64(w, n); gw_put(w, s, n); }
static void gw_str(struct gw *w, const char *s) { gw_strn(w, s, strlen(s)); }
static void gw_key(struct gw *w, const char *key, uint32_t type) { gw_str(w, key); gw_u32(w, type); }
static void gw_pad(struct gw *w, size_t a) { while (w->n % a) gw_u8(w, 0); }
static void gw_free(struct gw *w) { free(w->b); *w = (struct gw){ 0 }; }

static void gw_header(struct gw *w, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    gw_put(w, "GGUF", 4);
    gw_u32(w, version);
    gw_u64(w, n_tensors);
    gw_u64(w, n_kv);
}

static void gw_tinfo(struct gw *w, const char *name, uint32_t n_dims, const int64_t *ne,
                     uint32_t type, uint64_t offset)
{
    gw_str(w, name);
    gw_u32(w, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) gw_u64(w, (uint64_t)ne[d]);
    gw_u32(w, type);
    gw_u64(w, offset);
}

/* Parses the first len bytes of w from an exact-size heap copy. */
struct parsed {
    uint8_t *buf;
    struct gguf_file *g;
    int rc;
    char err[ERR_BUF];
};

static void parse_gw(struct parsed *p, const struct gw *w, size_t len, const char *name)
{
    p->buf = malloc(len ? len : 1);
    if (len) memcpy(p->buf, w->b, len);
    p->err[0] = 0;
    p->rc = gguf_parse(len ? p->buf : NULL, len, name, &p->g, p->err, sizeof p->err);
}

static void parsed_free(struct parsed *p)
{
    gguf_free(p->g);
    free(p->buf);
    p->g = NULL;
    p->buf = NULL;
}

/* Parses w as "bad.gguf"; it must fail with code and a message containing each of the
 * non-NULL needles (the file name is always required). */
static void expect_fail(const char *label, const struct gw *w, int code, const char *needle1,
                        const char *needle2)
{
    struct parsed p;
    parse_gw(&p, w, w->n, "bad.gguf");
    CHECK(p.rc == code, "%s: rc %d (%s), want %d (%s); err: %s", label, p.rc, err_name(p.rc), code,
          err_name(code), p.err);
    CHECK(p.g == NULL, "%s: out set on failure", label);
    CHECK(strstr(p.err, "bad.gguf") != NULL, "%s: message lacks the file name: %s", label, p.err);
    CHECK(!needle1 || strstr(p.err, needle1), "%s: message lacks '%s': %s", label, needle1, p.err);
    CHECK(!needle2 || strstr(p.err, needle2), "%s: message lacks '%s': %s", label, needle2, p.err);
    parsed_free(&p);
}

/* ---- the real model --------------------------------------------------------------------- */

static int str_eq(struct gguf_str s, const char *c) { return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0; }

static void test_real_model(void)
{
    const char *path = test_path("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    char err[ERR_BUF];
    struct mapped_file m;
    if (map_open(path, &m, err, sizeof err) != 0) {
        CHECK(0, "%s is missing (%s): run `make model`", path, err);
        return;
    }
    struct gguf_file *g = NULL;
    int rc = gguf_parse(m.data, m.size, "SmolLM2.gguf", &g, err, sizeof err);
    CHECK(rc == 0, "parse: %s", err);
    if (rc) { map_close(&m); return; }

    CHECK(gguf_version(g) == 3, "version %u", gguf_version(g));
    CHECK(gguf_n_tensors(g) == 272, "n_tensors %lld", (long long)gguf_n_tensors(g));
    CHECK(gguf_n_kv(g) == 33, "n_kv %lld", (long long)gguf_n_kv(g));

    struct gguf_str s;
    CHECK(gguf_get_str(g, "general.architecture", &s, err, sizeof err) == 0 && str_eq(s, "llama"),
          "architecture: %s", err);
    int64_t v = 0;
    CHECK(gguf_get_int(g, "llama.block_count", &v, err, sizeof err) == 0 && v == 30, "block_count %lld", (long long)v);
    double f = 0;
    CHECK(gguf_get_float(g, "llama.rope.freq_base", &f, err, sizeof err) == 0 && f == 100000.0, "freq_base %g", f);
    bool b = true;
    CHECK(gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b, err, sizeof err) == 0 && !b, "add_bos_token");

    enum gguf_vtype et;
    uint64_t n = 0;
    CHECK(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, err, sizeof err) == 0 && et == GGUF_STRING && n == 49152,
          "tokens: type %d n %llu", et, (unsigned long long)n);
    CHECK(str_eq(gguf_arr_str(g, "tokenizer.ggml.tokens", 0), "<|endoftext|>"), "token 0");
    CHECK(str_eq(gguf_arr_str(g, "tokenizer.ggml.tokens", 49151), "ectable"), "token 49151");
    CHECK(gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n, err, sizeof err) == 0 && et == GGUF_STRING && n == 48900,
          "merges: type %d n %llu", et, (unsigned long long)n);
    CHECK(str_eq(gguf_arr_str(g, "tokenizer.ggml.merges", 0), "\xc4\xa0 t"), "merge 0");
    CHECK(str_eq(gguf_arr_str(g, "tokenizer.ggml.merges", 48899), "ect able"), "merge 48899");
    CHECK(gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, err, sizeof err) == 0 && et == GGUF_INT32 && n == 49152,
          "token_type");
    CHECK(gguf_arr_int(g, "tokenizer.ggml.token_type", 0) == 3, "token_type[0]");

    const char *tpl = "{% for message in messages %}";
    CHECK(gguf_get_str(g, "tokenizer.chat_template", &s, err, sizeof err) == 0 && s.len > strlen(tpl) &&
          memcmp(s.ptr, tpl, strlen(tpl)) == 0, "chat_template: %s", err);

    const struct tensor *t = gguf_find_tensor(g, "token_embd.weight");
    CHECK(t && t->type == DT_Q8_0 && t->n_dims == 2 && t->ne[0] == 576 && t->ne[1] == 49152 &&
          t->nbytes == (size_t)576 / 32 * 34 * 49152, "token_embd.weight");
    t = gguf_find_tensor(g, "blk.0.ffn_down.weight");
    CHECK(t && t->type == DT_Q4_1 && t->n_dims == 2 && t->ne[0] == 1536 && t->ne[1] == 576 &&
          t->nbytes == (size_t)1536 / 32 * 20 * 576, "blk.0.ffn_down.weight");
    t = gguf_find_tensor(g, "output_norm.weight");
    CHECK(t && t->type == DT_F32 && t->n_dims == 1 && t->ne[0] == 576 && t->ne[1] == 1, "output_norm");
    if (t) {
        float x;
        memcpy(&x, t->data, 4);
        CHECK(x == 1.7578125f, "output_norm[0] = %g", x);
        CHECK((const uint8_t *)t->data + t->nbytes == m.data + m.size, "last tensor ends the file");
    }
    CHECK(gguf_find_tensor(g, "blk.30.ffn_down.weight") == NULL, "absent tensor");
    CHECK(gguf_find_key(g, "llama.nonexistent") == -1, "absent key");

    /* every tensor is found by its name, and every key by its name */
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const struct tensor *ti = gguf_tensor(g, i);
        CHECK(gguf_find_tensor(g, ti->name) == ti, "find %s", ti->name);
        CHECK((const uint8_t *)ti->data >= m.data && (const uint8_t *)ti->data + ti->nbytes <= m.data + m.size,
              "%s inside the file", ti->name);
    }
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        struct gguf_str k = gguf_key_name(g, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
        CHECK(gguf_find_key(g, key) == i, "find key %s", key);
    }
    gguf_free(g);
    map_close(&m);
}

/* ---- round trip of every value type ------------------------------------------------------ */

struct ttype {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[4];
    size_t nbytes; /* computed by hand from the block tables, not by dtype_row_bytes */
};

static const struct ttype all_types[] = {
    { "t.f32", DT_F32, 3, { 5, 3, 2, 1 }, 5 * 3 * 2 * 4 },
    { "t.f16", DT_F16, 1, { 7, 1, 1, 1 }, 7 * 2 },
    { "t.bf16", DT_BF16, 4, { 4, 1, 1, 2 }, 4 * 2 * 2 },
    { "t.q8_0", DT_Q8_0, 2, { 64, 3, 1, 1 }, 2 * 34 * 3 },
    { "t.q4_0", DT_Q4_0, 2, { 64, 3, 1, 1 }, 2 * 18 * 3 },
    { "t.q4_1", DT_Q4_1, 2, { 64, 3, 1, 1 }, 2 * 20 * 3 },
    { "t.q5_0", DT_Q5_0, 2, { 96, 1, 1, 1 }, 3 * 22 },
    { "t.q5_1", DT_Q5_1, 2, { 32, 5, 1, 1 }, 24 * 5 },
    { "t.q4_k", DT_Q4_K, 2, { 256, 2, 1, 1 }, 144 * 2 },
    { "t.q6_k", DT_Q6_K, 3, { 512, 1, 3, 1 }, 2 * 210 * 3 },
};
#define N_TYPES (sizeof all_types / sizeof all_types[0])

static const char *const str_elems[] = { "alpha", "", "with\nnewline", "\xe2\x82\xac", "last" };

/* Writes a valid file with every value type. filler pads a string kv so the tensor infos
 * end where 32- and 64-byte alignment put the data section in different places. Fills
 * offs[] with each tensor's offset and *data_start with where the data section begins. */
static void build_all(struct gw *w, uint32_t version, uint32_t align, size_t filler,
                      uint64_t *offs, size_t *infos_end, size_t *data_start)
{
    int with_align = align != 32; /* 32 is the default: exercise the absent key too */
    gw_header(w, version, N_TYPES, 27 + with_align);
    gw_key(w, "k.u8", GGUF_UINT8); gw_u8(w, 200);
    gw_key(w, "k.i8", GGUF_INT8); gw_u8(w, (uint8_t)-100);
    gw_key(w, "k.u16", GGUF_UINT16); gw_u16(w, 65535);
    gw_key(w, "k.i16", GGUF_INT16); gw_u16(w, (uint16_t)-32768);
    gw_key(w, "k.u32", GGUF_UINT32); gw_u32(w, 4000000000u);
    gw_key(w, "k.i32", GGUF_INT32); gw_u32(w, (uint32_t)INT32_MIN);
    gw_key(w, "k.f32", GGUF_FLOAT32); gw_f32(w, 0.15625f);
    gw_key(w, "k.bool_t", GGUF_BOOL); gw_u8(w, 1);
    gw_key(w, "k.bool_f", GGUF_BOOL); gw_u8(w, 0);
    gw_key(w, "k.str", GGUF_STRING); gw_str(w, "hello, gguf");
    gw_key(w, "k.str_empty", GGUF_STRING); gw_str(w, "");
    gw_key(w, "k.u64", GGUF_UINT64); gw_u64(w, 1ull << 40);
    gw_key(w, "k.u64_max", GGUF_UINT64); gw_u64(w, UINT64_MAX);
    gw_key(w, "k.i64", GGUF_INT64); gw_u64(w, (uint64_t)INT64_MIN);
    gw_key(w, "k.f64", GGUF_FLOAT64); gw_f64(w, -1e300);

    gw_key(w, "a.u8", GGUF_ARRAY); gw_u32(w, GGUF_UINT8); gw_u64(w, 3);
    gw_u8(w, 0); gw_u8(w, 128); gw_u8(w, 255);
    gw_key(w, "a.i16", GGUF_ARRAY); gw_u32(w, GGUF_INT16); gw_u64(w, 2);
    gw_u16(w, (uint16_t)-5); gw_u16(w, 32767);
    gw_key(w, "a.i32", GGUF_ARRAY); gw_u32(w, GGUF_INT32); gw_u64(w, 3);
    gw_u32(w, (uint32_t)-1); gw_u32(w, 7); gw_u32(w, (uint32_t)INT32_MAX);
    gw_key(w, "a.u64", GGUF_ARRAY); gw_u32(w, GGUF_UINT64); gw_u64(w, 2);
    gw_u64(w, 12345678901234ull); gw_u64(w, UINT64_MAX);
    gw_key(w, "a.f32", GGUF_ARRAY); gw_u32(w, GGUF_FLOAT32); gw_u64(w, 3);
    gw_f32(w, 1.5f); gw_f32(w, -2.25f); gw_f32(w, 1e30f);
    gw_key(w, "a.f64", GGUF_ARRAY); gw_u32(w, GGUF_FLOAT64); gw_u64(w, 1);
    gw_f64(w, 3.141592653589793);
    gw_key(w, "a.bool", GGUF_ARRAY); gw_u32(w, GGUF_BOOL); gw_u64(w, 2);
    gw_u8(w, 0); gw_u8(w, 1);
    gw_key(w, "a.str", GGUF_ARRAY); gw_u32(w, GGUF_STRING); gw_u64(w, 5);
    for (int i = 0; i < 5; i++) gw_str(w, str_elems[i]);
    gw_key(w, "a.empty", GGUF_ARRAY); gw_u32(w, GGUF_INT32); gw_u64(w, 0);
    /* [[1, 2], [], [3]] as int32, and [["x"], ["y", "z"]] */
    gw_key(w, "a.nested", GGUF_ARRAY); gw_u32(w, GGUF_ARRAY); gw_u64(w, 3);
    gw_u32(w, GGUF_INT32); gw_u64(w, 2); gw_u32(w, 1); gw_u32(w, 2);
    gw_u32(w, GGUF_INT32); gw_u64(w, 0);
    gw_u32(w, GGUF_INT32); gw_u64(w, 1); gw_u32(w, 3);
    gw_key(w, "a.nested_str", GGUF_ARRAY); gw_u32(w, GGUF_ARRAY); gw_u64(w, 2);
    gw_u32(w, GGUF_STRING); gw_u64(w, 1); gw_str(w, "x");
    gw_u32(w, GGUF_STRING); gw_u64(w, 2); gw_str(w, "y"); gw_str(w, "z");
    if (with_align) { gw_key(w, "general.alignment", GGUF_UINT32); gw_u32(w, align); }
    char *fill = calloc(filler + 1, 1);
    memset(fill, 'f', filler);
    gw_key(w, "k.filler", GGUF_STRING); gw_str(w, fill);
    free(fill);

    uint64_t off = 0;
    for (size_t i = 0; i < N_TYPES; i++) {
        offs[i] = off;
        gw_tinfo(w, all_types[i].name, all_types[i].n_dims, all_types[i].ne, all_types[i].type, off);
        off += (all_types[i].nbytes + align - 1) / align * align;
    }
    *infos_end = w->n;
    gw_pad(w, align);
    *data_start = w->n;
    for (size_t i = 0; i < N_TYPES; i++) {
        gw_pad(w, align);
        for (size_t j = 0; j < all_types[i].nbytes; j++) gw_u8(w, (uint8_t)(i * 31 + j));
    }
}

static void check_all(const struct gguf_file *g, const uint8_t *buf, uint32_t version,
                      const uint64_t *offs, size_t data_start)
{
    char err[ERR_BUF];
    int64_t v;
    double f;
    bool b;
    struct gguf_str s;
    CHECK(gguf_version(g) == version, "version");

    static const struct { const char *key; int64_t want; } ints[] = {
        { "k.u8", 200 }, { "k.i8", -100 }, { "k.u16", 65535 }, { "k.i16", -32768 },
        { "k.u32", 4000000000ll }, { "k.i32", INT32_MIN }, { "k.bool_t", 1 }, { "k.bool_f", 0 },
        { "k.u64", 1ll << 40 }, { "k.i64", INT64_MIN },
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        v = 0;
        CHECK(gguf_get_int(g, ints[i].key, &v, err, sizeof err) == 0 && v == ints[i].want,
              "%s = %lld: %s", ints[i].key, (long long)v, err);
        if (strncmp(ints[i].key, "k.bool", 6) != 0) {
            f = 0;
            CHECK(gguf_get_float(g, ints[i].key, &f, err, sizeof err) == 0 && f == (double)ints[i].want,
                  "%s as float = %g", ints[i].key, f);
        }
    }
    CHECK(gguf_get_int(g, "k.u64_max", &v, err, sizeof err) == ERR_FORMAT && strstr(err, "k.u64_max") &&
          strstr(err, "ok.gguf"), "u64 max does not fit int64: %s", err);
    CHECK(gguf_get_float(g, "k.u64_max", &f, err, sizeof err) == 0 && f == 18446744073709551615.0, "u64 max float");
    CHECK(gguf_get_float(g, "k.f32", &f, err, sizeof err) == 0 && f == 0.15625, "f32 %g", f);
    CHECK(gguf_get_float(g, "k.f64", &f, err, sizeof err) == 0 && f == -1e300, "f64 %g", f);
    CHECK(gguf_get_int(g, "k.f32", &v, err, sizeof err) == ERR_FORMAT && strstr(err, "k.f32"), "float as int: %s", err);
    CHECK(gguf_get_float(g, "k.str", &f, err, sizeof err) == ERR_FORMAT && strstr(err, "k.str"), "str as float: %s", err);
    CHECK(gguf_get_float(g, "k.bool_t", &f, err, sizeof err) == ERR_FORMAT, "bool as float");
    CHECK(gguf_get_bool(g, "k.bool_t", &b, err, sizeof err) == 0 && b, "bool true");
    CHECK(gguf_get_bool(g, "k.bool_f", &b, err, sizeof err) == 0 && !b, "bool false");
    CHECK(gguf_get_bool(g, "k.u8", &b, err, sizeof err) == ERR_FORMAT, "u8 as bool");
    CHECK(gguf_get_str(g, "k.str", &s, err, sizeof err) == 0 && str_eq(s, "hello, gguf"), "str");
    CHECK(gguf_get_str(g, "k.str_empty", &s, err, sizeof err) == 0 && s.len == 0, "empty str");
    CHECK(gguf_get_str(g, "k.u32", &s, err, sizeof err) == ERR_FORMAT && strstr(err, "k.u32") &&
          strstr(err, "ok.gguf"), "u32 as str: %s", err);
    CHECK(gguf_get_str(g, "a.str", &s, err, sizeof err) == ERR_FORMAT && strstr(err, "a.str"), "array as str: %s", err);
    CHECK(gguf_get_int(g, "k.missing", &v, err, sizeof err) == ERR_NOT_FOUND && strstr(err, "k.missing"), "missing: %s", err);
    CHECK(gguf_get_str(g, "k.missing", &s, err, sizeof err) == ERR_NOT_FOUND, "missing str");
    CHECK(gguf_get_arr(g, "k.missing", &(enum gguf_vtype){ 0 }, &(uint64_t){ 0 }, err, sizeof err) == ERR_NOT_FOUND,
          "missing arr");
    CHECK(gguf_find_key(g, "k") == -1 && gguf_find_key(g, "k.u8x") == -1 && gguf_find_key(g, "") == -1, "prefix keys");

    enum gguf_vtype et;
    uint64_t n;
    CHECK(gguf_get_arr(g, "k.u8", &et, &n, err, sizeof err) == ERR_FORMAT, "scalar as array");
    CHECK(gguf_get_arr(g, "a.u8", &et, &n, err, sizeof err) == 0 && et == GGUF_UINT8 && n == 3, "a.u8");
    CHECK(gguf_arr_int(g, "a.u8", 0) == 0 && gguf_arr_int(g, "a.u8", 1) == 128 && gguf_arr_int(g, "a.u8", 2) == 255, "a.u8 values");
    CHECK(gguf_arr_float(g, "a.u8", 2) == 255.0, "a.u8 as float");
    CHECK(gguf_get_arr(g, "a.i16", &et, &n, err, sizeof err) == 0 && et == GGUF_INT16 && n == 2, "a.i16");
    CHECK(gguf_arr_int(g, "a.i16", 0) == -5 && gguf_arr_int(g, "a.i16", 1) == 32767, "a.i16 values");
    CHECK(gguf_get_arr(g, "a.i32", &et, &n, err, sizeof err) == 0 && et == GGUF_INT32 && n == 3, "a.i32");
    CHECK(gguf_arr_int(g, "a.i32", 0) == -1 && gguf_arr_int(g, "a.i32", 1) == 7 && gguf_arr_int(g, "a.i32", 2) == INT32_MAX,
          "a.i32 values");
    CHECK(gguf_get_arr(g, "a.u64", &et, &n, err, sizeof err) == 0 && et == GGUF_UINT64 && n == 2, "a.u64");
    CHECK(gguf_arr_int(g, "a.u64", 0) == 12345678901234ll && gguf_arr_int(g, "a.u64", 1) == INT64_MAX,
          "a.u64 values (saturated)");
    CHECK(gguf_get_arr(g, "a.f32", &et, &n, err, sizeof err) == 0 && et == GGUF_FLOAT32 && n == 3, "a.f32");
    CHECK(gguf_arr_float(g, "a.f32", 0) == 1.5 && gguf_arr_float(g, "a.f32", 1) == -2.25 &&
          gguf_arr_float(g, "a.f32", 2) == (double)1e30f, "a.f32 values");
    CHECK(gguf_arr_int(g, "a.f32", 1) == -2 && gguf_arr_int(g, "a.f32", 2) == INT64_MAX, "a.f32 as int");
    CHECK(gguf_get_arr(g, "a.f64", &et, &n, err, sizeof err) == 0 && et == GGUF_FLOAT64 && n == 1 &&
          gguf_arr_float(g, "a.f64", 0) == 3.141592653589793, "a.f64");
    CHECK(gguf_get_arr(g, "a.bool", &et, &n, err, sizeof err) == 0 && et == GGUF_BOOL && n == 2 &&
          gguf_arr_int(g, "a.bool", 0) == 0 && gguf_arr_int(g, "a.bool", 1) == 1, "a.bool");
    CHECK(gguf_get_arr(g, "a.str", &et, &n, err, sizeof err) == 0 && et == GGUF_STRING && n == 5, "a.str");
    for (uint64_t i = 0; i < 5; i++)
        CHECK(str_eq(gguf_arr_str(g, "a.str", i), str_elems[i]), "a.str[%llu]", (unsigned long long)i);
    CHECK(gguf_arr_int(g, "a.str", 0) == 0 && gguf_arr_str(g, "a.i32", 0).len == 0, "wrong element accessor");
    CHECK(gguf_get_arr(g, "a.empty", &et, &n, err, sizeof err) == 0 && et == GGUF_INT32 && n == 0, "a.empty");
    CHECK(gguf_get_arr(g, "a.nested", &et, &n, err, sizeof err) == 0 && et == GGUF_ARRAY && n == 3, "a.nested");
    CHECK(gguf_get_arr(g, "a.nested_str", &et, &n, err, sizeof err) == 0 && et == GGUF_ARRAY && n == 2, "a.nested_str");
    CHECK(gguf_arr_int(g, "a.nested", 0) == 0 && gguf_arr_str(g, "a.nested_str", 1).len == 0, "nested elements rejected");
    CHECK(gguf_get_int(g, "a.nested", &v, err, sizeof err) == ERR_FORMAT && strstr(err, "array"), "nested as int: %s", err);

    /* keys in file order, with their types */
    static const struct { const char *key; enum gguf_vtype t; } order[] = {
        { "k.u8", GGUF_UINT8 }, { "k.i8", GGUF_INT8 }, { "k.u16", GGUF_UINT16 }, { "k.i16", GGUF_INT16 },
        { "k.u32", GGUF_UINT32 }, { "k.i32", GGUF_INT32 }, { "k.f32", GGUF_FLOAT32 }, { "k.bool_t", GGUF_BOOL },
        { "k.bool_f", GGUF_BOOL }, { "k.str", GGUF_STRING }, { "k.str_empty", GGUF_STRING },
        { "k.u64", GGUF_UINT64 }, { "k.u64_max", GGUF_UINT64 }, { "k.i64", GGUF_INT64 },
        { "k.f64", GGUF_FLOAT64 }, { "a.u8", GGUF_ARRAY },
    };
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        CHECK(str_eq(gguf_key_name(g, (int64_t)i), order[i].key), "key %zu", i);
        CHECK(gguf_kv_type(g, (int64_t)i) == order[i].t, "type of key %zu", i);
        CHECK(gguf_find_key(g, order[i].key) == (int64_t)i, "find %s", order[i].key);
    }

    CHECK(gguf_n_tensors(g) == (int64_t)N_TYPES, "n_tensors");
    for (size_t i = 0; i < N_TYPES && (int64_t)i < gguf_n_tensors(g); i++) {
        const struct ttype *e = &all_types[i];
        const struct tensor *t = gguf_tensor(g, (int64_t)i);
        CHECK(strcmp(t->name, e->name) == 0, "tensor %zu name %s", i, t->name);
        CHECK(gguf_find_tensor(g, e->name) == t, "find %s", e->name);
        CHECK(t->type == (enum dtype)e->type && t->n_dims == (int)e->n_dims, "%s type/n_dims", e->name);
        for (int d = 0; d < 4; d++) CHECK(t->ne[d] == e->ne[d], "%s ne[%d] = %lld", e->name, d, (long long)t->ne[d]);
        CHECK(t->nbytes == e->nbytes, "%s nbytes %zu want %zu", e->name, t->nbytes, e->nbytes);
        CHECK((const uint8_t *)t->data == buf + data_start + offs[i], "%s data at %td want %zu", e->name,
              (const uint8_t *)t->data - buf, (size_t)(data_start + offs[i]));
        const uint8_t *d = t->data;
        CHECK(d[0] == (uint8_t)(i * 31) && d[e->nbytes - 1] == (uint8_t)(i * 31 + e->nbytes - 1), "%s contents", e->name);
    }
    CHECK(gguf_find_tensor(g, "t.f3") == NULL && gguf_find_tensor(g, "") == NULL, "absent tensors");
}

static void test_roundtrip(void)
{
    static const uint32_t versions[] = { 2, 3 };
    static const uint32_t aligns[] = { 32, 64 };
    for (int vi = 0; vi < 2; vi++) {
        for (int ai = 0; ai < 2; ai++) {
            uint32_t version = versions[vi], align = aligns[ai];
            uint64_t offs[N_TYPES];
            size_t infos_end, data_start;
            /* Pick the filler so the infos end 8 bytes past a multiple of 64: the data
             * section then starts 24 bytes later with alignment 32 but 56 bytes later with
             * 64, so a parser that ignored general.alignment would misplace every tensor. */
            struct gw w = { 0 };
            build_all(&w, version, align, 0, offs, &infos_end, &data_start);
            size_t filler = (8 + 64 - infos_end % 64) % 64;
            gw_free(&w);
            build_all(&w, version, align, filler, offs, &infos_end, &data_start);
            CHECK(infos_end % 64 == 8 && data_start - infos_end == align - 8, "writer layout");

            struct parsed p;
            parse_gw(&p, &w, w.n, "ok.gguf");
            CHECK(p.rc == 0, "v%u align %u: %s", version, align, p.err);
            if (p.rc == 0) check_all(p.g, p.buf, version, offs, data_start);
            parsed_free(&p);
            gw_free(&w);
        }
    }
}

/* ---- malformed files ------------------------------------------------------------------- */

/* Every proper prefix of a valid file is refused (never a crash, never an overread). */
static void test_truncated_everywhere(void)
{
    uint64_t offs[N_TYPES];
    size_t infos_end, data_start;
    struct gw w = { 0 };
    build_all(&w, 3, 64, 5, offs, &infos_end, &data_start);
    int bad = 0;
    for (size_t len = 0; len < w.n; len++) {
        struct parsed p;
        parse_gw(&p, &w, len, "bad.gguf");
        if (p.rc != ERR_FORMAT || p.g || !strstr(p.err, "bad.gguf")) {
            if (bad++ < 5) CHECK(0, "prefix %zu of %zu: rc %d, err: %s", len, w.n, p.rc, p.err);
        }
        parsed_free(&p);
    }
    CHECK(bad == 0, "%d of %zu prefixes not refused as format errors", bad, w.n);
    struct parsed p;
    parse_gw(&p, &w, w.n, "ok.gguf");
    CHECK(p.rc == 0, "the whole file parses: %s", p.err);
    parsed_free(&p);
    gw_free(&w);
}

static void test_header_errors(void)
{
    struct gw w = { 0 };
    expect_fail("empty", &w, ERR_FORMAT, "magic", NULL);
    gw_put(&w, "GGU", 3);
    expect_fail("3 bytes", &w, ERR_FORMAT, "magic", NULL);
    gw_free(&w);
    gw_put(&w, "GGUX", 4); gw_u32(&w, 3); gw_u64(&w, 0); gw_u64(&w, 0);
    expect_fail("bad magic", &w, ERR_FORMAT, "magic", NULL);
    gw_free(&w);
    gw_header(&w, 1, 0, 0);
    expect_fail("version 1", &w, ERR_UNSUPPORTED, "version 1", NULL);
    gw_free(&w);
    gw_header(&w, 4, 0, 0);
    expect_fail("version 4", &w, ERR_UNSUPPORTED, "version 4", NULL);
    gw_free(&w);
    gw_header(&w, 0x03000000, 0, 0);
    expect_fail("big-endian", &w, ERR_UNSUPPORTED, "big-endian", NULL);
    gw_free(&w);
    gw_header(&w, 3, UINT64_MAX, 0);
    expect_fail("huge tensor_count", &w, ERR_FORMAT, "tensor_count", NULL);
    gw_free(&w);
    gw_header(&w, 3, 1ull << 40, 1);
    gw_key(&w, "k", GGUF_UINT32); gw_u32(&w, 1);
    expect_fail("tensor_count 2^40", &w, ERR_FORMAT, "tensor_count", NULL);
    gw_free(&w);
    gw_header(&w, 3, 0, UINT64_MAX);
    expect_fail("huge kv_count", &w, ERR_FORMAT, "kv_count", NULL);
    gw_free(&w);
    gw_header(&w, 2, 0, 1ull << 40);
    gw_key(&w, "k", GGUF_UINT32); gw_u32(&w, 1);
    expect_fail("kv_count 2^40", &w, ERR_FORMAT, "kv_count", NULL);
    gw_free(&w);
    /* header alone with zero counts is a valid (empty) file */
    gw_header(&w, 3, 0, 0);
    struct parsed p;
    parse_gw(&p, &w, w.n, "empty.gguf");
    CHECK(p.rc == 0 && gguf_n_kv(p.g) == 0 && gguf_n_tensors(p.g) == 0 && gguf_find_key(p.g, "x") == -1 &&
          gguf_find_tensor(p.g, "x") == NULL, "empty file: %s", p.err);
    parsed_free(&p);
    gw_free(&w);
}

static void test_kv_errors(void)
{
    struct gw w = { 0 };
    gw_header(&w, 3, 0, 1); gw_u64(&w, 1000); gw_put(&w, "abcdefghijklmnop", 16);
    expect_fail("key length past EOF", &w, ERR_FORMAT, "kv 0", "past the end");
    gw_free(&w);
    gw_header(&w, 3, 0, 1); gw_u64(&w, UINT64_MAX); gw_put(&w, "abcdefghijklmnop", 16);
    expect_fail("key length 2^64-1", &w, ERR_FORMAT, "kv 0", NULL);
    gw_free(&w);
    gw_header(&w, 3, 0, 1); gw_key(&w, "k.s", GGUF_STRING); gw_u64(&w, 100); gw_put(&w, "short", 5);
    expect_fail("string past EOF", &w, ERR_FORMAT, "'k.s'", "past the end");
    gw_free(&w);
    gw_header(&w, 3, 0, 1); gw_key(&w, "k.s", GGUF_STRING); gw_u64(&w, UINT64_MAX - 3); gw_put(&w, "short", 5);
    expect_fail("string length wraps", &w, ERR_FORMAT, "'k.s'", NULL);
    gw_free(&w);
    gw_header(&w, 3, 0, 2); gw_key(&w, "k.a", GGUF_UINT8); gw_u8(&w, 1); gw_key(&w, "k.x", 13); gw_u32(&w, 0);
    expect_fail("unknown type 13", &w, ERR_FORMAT, "'k.x'", "type 13");
    gw_free(&w);
    gw_header(&w, 3, 0, 1); gw_key(&w, "k.x", UINT32_MAX); gw_u32(&w, 0);
    expect_fail("unknown type 2^32-1", &w, ERR_FORMAT, "'k.x'", "4294967295");
    gw_free(&w);
    gw_header(&w, 3, 0, 1); gw_key(&w, "k.arr", GGUF_ARRAY); gw_u32(&w, 13); gw_u64(&w, 1); gw_u32(&w, 0);
    expect_fail("unknown element type", &w, ERR_FORMAT, "'k.arr'", "element type 13");
    gw_free(&w);
    gw_header(&w, 3, 0, 1); gw_key(&w, "k.arr", GGUF_ARRAY); gw_u32(&w, GGUF_UINT64); gw_u64(&w, (1ull << 61) + 1);
    gw_u64(&w, 0);
    expect_fail("array count * 8 wraps", &w, ERR_FORMAT, "'k.arr'", "cannot fit");
    gw_free(&w);
    gw_header(&w, 3, 0, 1); gw_key(&w, "k.arr", GGUF_ARRAY); gw_u32(&w, GGUF_STRING); gw_u64(&w, 1000);
    gw_str(&w, "one");
    expect_fail("string array count", &w, ERR_FORMAT, "'k.arr'", NULL);
    gw_free(&w);
    gw_header(&w, 3, 0, 1); gw_key(&w, "k.arr", GGUF_ARRAY); gw_u32(&w, GGUF_STRING); gw_u64(&w, 2);
    gw_str(&w, "one"); gw_u64(&w, 50); gw_put(&w, "two", 3);
    expect_fail("string element past EOF", &w, ERR_FORMAT, "'k.arr'", "past the end");
    gw_free(&w);
    gw_header(&w, 3, 0, 1); gw_key(&w, "k.arr", GGUF_ARRAY); gw_u32(&w, GGUF_INT32); gw_u64(&w, 3);
    gw_u32(&w, 1); gw_u32(&w, 2);
    expect_fail("int array truncated", &w, ERR_FORMAT, "'k.arr'", NULL);
    gw_free(&w);
    gw_header(&w, 3, 0, 1); gw_key(&w, "k.deep", GGUF_ARRAY);
    for (int i = 0; i < 100; i++) { gw_u32(&w, GGUF_ARRAY); gw_u64(&w, 1); }
    gw_u32(&w, GGUF_INT32); gw_u64(&w, 0);
    expect_fail("arrays nested 100 deep", &w, ERR_FORMAT, "'k.deep'", "nested");
    gw_free(&w);
    gw_header(&w, 3, 0, 3);
    gw_key(&w, "dup.key", GGUF_UINT32); gw_u32(&w, 1);
    gw_key(&w, "other", GGUF_UINT32); gw_u32(&w, 2);
    gw_key(&w, "dup.key", GGUF_STRING); gw_str(&w, "x");
    expect_fail("duplicate key", &w, ERR_FORMAT, "duplicate key 'dup.key'", NULL);
    gw_free(&w);
    gw_header(&w, 3, 0, 1); gw_key(&w, "", GGUF_UINT32); gw_u32(&w, 1);
    expect_fail("empty key", &w, ERR_FORMAT, "empty key", NULL);
    gw_free(&w);
    gw_header(&w, 3, 0, 1); gw_strn(&w, "a\0b", 3); gw_u32(&w, GGUF_UINT32); gw_u32(&w, 1);
    expect_fail("NUL in key", &w, ERR_FORMAT, "NUL", NULL);
    gw_free(&w);
    gw_header(&w, 3, 0, 1); gw_key(&w, "k.u32", GGUF_UINT32); gw_u16(&w, 1);
    expect_fail("scalar truncated", &w, ERR_FORMAT, "'k.u32'", NULL);
    gw_free(&w);

    /* a nesting depth within the limit parses */
    gw_header(&w, 3, 0, 1); gw_key(&w, "k.deep", GGUF_ARRAY);
    for (int i = 0; i < 6; i++) { gw_u32(&w, GGUF_ARRAY); gw_u64(&w, 1); }
    gw_u32(&w, GGUF_STRING); gw_u64(&w, 1); gw_str(&w, "leaf");
    struct parsed p;
    parse_gw(&p, &w, w.n, "ok.gguf");
    CHECK(p.rc == 0, "7 levels of arrays: %s", p.err);
    parsed_free(&p);
    gw_free(&w);
}

/* One tensor description for build_tensors. */
struct tspec {
    const char *name;
    uint32_t n_dims;
    int64_t ne[4];
    uint32_t type;
    uint64_t offset;
};

/* Writes a file with one kv (plus general.alignment = align_key as uint32 unless it is 0
 * or align_type says otherwise), the given tensors, padding, and a data section that ends
 * data_delta bytes after the furthest tensor end (for tensors of sane size). */
static void build_tensors(struct gw *w, uint32_t align_type, uint64_t align_key,
                          const struct tspec *ts, int n, int64_t data_delta)
{
    gw_header(w, 3, (uint64_t)n, align_type ? 2 : 1);
    gw_key(w, "general.architecture", GGUF_STRING); gw_str(w, "llama");
    if (align_type == GGUF_UINT32) { gw_key(w, "general.alignment", GGUF_UINT32); gw_u32(w, (uint32_t)align_key); }
    if (align_type == GGUF_UINT64) { gw_key(w, "general.alignment", GGUF_UINT64); gw_u64(w, align_key); }
    for (int i = 0; i < n; i++) gw_tinfo(w, ts[i].name, ts[i].n_dims, ts[i].ne, ts[i].type, ts[i].offset);
    size_t a = align_type && align_key && !(align_key & (align_key - 1)) ? (size_t)align_key : 32;
    gw_pad(w, a);
    uint64_t end = 0;
    for (int i = 0; i < n; i++) {
        uint64_t rows = 1;
        int sane = ts[i].n_dims >= 1 && ts[i].n_dims <= 4;
        for (uint32_t d = 1; sane && d < ts[i].n_dims; d++) {
            sane = ts[i].ne[d] > 0 && ts[i].ne[d] < (1 << 20);
            rows *= (uint64_t)ts[i].ne[d];
        }
        size_t row = sane && ts[i].ne[0] < (1 << 20) ? dtype_row_bytes((enum dtype)ts[i].type, ts[i].ne[0]) : 0;
        if (row && ts[i].offset < (1 << 20) && ts[i].offset + row * rows > end) end = ts[i].offset + row * rows;
    }
    end = (uint64_t)((int64_t)end + data_delta);
    for (uint64_t i = 0; i < end; i++) gw_u8(w, (uint8_t)i);
}

static void expect_tensors_fail(const char *label, uint32_t align_type, uint64_t align_key,
                                const struct tspec *ts, int n, int64_t data_delta, int code,
                                const char *needle1, const char *needle2)
{
    struct gw w = { 0 };
    build_tensors(&w, align_type, align_key, ts, n, data_delta);
    expect_fail(label, &w, code, needle1, needle2);
    gw_free(&w);
}

#define T1(...) ((const struct tspec[]){ __VA_ARGS__ })

static void test_tensor_errors(void)
{
    /* control: the builder makes valid files, so each case below fails for its own reason */
    {
        struct gw w = { 0 };
        build_tensors(&w, GGUF_UINT32, 64,
                      T1({ "a", 2, { 16, 2 }, DT_F32, 0 }, { "b", 1, { 32 }, DT_Q8_0, 128 }), 2, 0);
        struct parsed p;
        parse_gw(&p, &w, w.n, "ok.gguf");
        CHECK(p.rc == 0 && gguf_n_tensors(p.g) == 2, "control file: %s", p.err);
        if (p.rc == 0) {
            const struct tensor *b = gguf_find_tensor(p.g, "b");
            CHECK(b && b->nbytes == 34 && (const uint8_t *)b->data + 34 == p.buf + w.n, "b ends the file");
        }
        parsed_free(&p);
        gw_free(&w);
    }
    expect_tensors_fail("duplicate tensor", 0, 0,
                        T1({ "blk.0.w", 1, { 8 }, DT_F32, 0 }, { "x", 1, { 8 }, DT_F32, 32 },
                           { "blk.0.w", 1, { 8 }, DT_F32, 64 }), 3, 0, ERR_FORMAT, "duplicate tensor 'blk.0.w'", NULL);
    expect_tensors_fail("n_dims 0", 0, 0, T1({ "t.nd0", 0, { 0 }, DT_F32, 0 }), 1, 0, ERR_FORMAT, "'t.nd0'", "n_dims 0");
    expect_tensors_fail("n_dims 5", 0, 0, T1({ "t.nd5", 5, { 1, 1, 1, 1 }, DT_F32, 0 }), 1, 0, ERR_FORMAT, "'t.nd5'",
                        "n_dims 5");
    expect_tensors_fail("ne 0", 0, 0, T1({ "t.ne0", 2, { 8, 0 }, DT_F32, 0 }), 1, 0, ERR_FORMAT, "'t.ne0'", "ne[1] = 0");
    expect_tensors_fail("ne negative", 0, 0, T1({ "t.neg", 2, { 8, -3 }, DT_F32, 0 }), 1, 0, ERR_FORMAT, "'t.neg'",
                        "ne[1] = -3");
    expect_tensors_fail("ne[0] huge unsigned", 0, 0, T1({ "t.big", 1, { INT64_MIN }, DT_F32, 0 }), 1, 0, ERR_FORMAT,
                        "'t.big'", "ne[0]");
    expect_tensors_fail("element count overflow", 0, 0,
                        T1({ "t.ovf", 3, { 1ll << 40, 1ll << 20, 1ll << 10 }, DT_F32, 0 }), 1, 0, ERR_FORMAT,
                        "'t.ovf'", "overflow");
    expect_tensors_fail("byte count overflow", 0, 0, T1({ "t.ovb", 2, { 1ll << 31, 1ll << 31 }, DT_F32, 0 }), 1, 0,
                        ERR_FORMAT, "'t.ovb'", "overflow");
    expect_tensors_fail("block size", 0, 0, T1({ "t.blk", 2, { 33, 2 }, DT_Q4_0, 0 }), 1, 0, ERR_FORMAT, "'t.blk'",
                        "block size 32");
    expect_tensors_fail("k block size", 0, 0, T1({ "t.kblk", 1, { 128 }, DT_Q6_K, 0 }), 1, 0, ERR_FORMAT, "'t.kblk'",
                        "block size 256");
    expect_tensors_fail("type 99", 0, 0, T1({ "t.t99", 1, { 32 }, 99, 0 }), 1, 0, ERR_UNSUPPORTED, "'t.t99'",
                        "type 99, which is not supported; supported: F32");
    expect_tensors_fail("type Q8_K", 0, 0, T1({ "t.q8k", 1, { 256 }, DT_Q8_K, 0 }), 1, 0, ERR_UNSUPPORTED, "'t.q8k'",
                        "type 15 (Q8_K)");
    expect_tensors_fail("type 2^32-1", 0, 0, T1({ "t.tmax", 1, { 32 }, UINT32_MAX, 0 }), 1, 0, ERR_UNSUPPORTED,
                        "'t.tmax'", "4294967295");
    {
        /* the exact message the model loader's users will see */
        struct gw w = { 0 };
        build_tensors(&w, 0, 0, T1({ "blk.0.attn_q.weight", 2, { 256, 4 }, 16, 0 }), 1, 0);
        struct parsed p;
        parse_gw(&p, &w, w.n, "model.gguf");
        const char *want = "model.gguf: tensor 'blk.0.attn_q.weight' has type 16 (IQ2_XXS), which is not "
                           "supported; supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K";
        CHECK(p.rc == ERR_UNSUPPORTED && strcmp(p.err, want) == 0, "rc %d err: %s", p.rc, p.err);
        parsed_free(&p);
        gw_free(&w);
    }
    expect_tensors_fail("offset past EOF", 0, 0, T1({ "t.far", 1, { 8 }, DT_F32, 1ull << 40 }), 1, 0, ERR_FORMAT,
                        "'t.far'", "past the end");
    expect_tensors_fail("offset near 2^64", 0, 0, T1({ "t.wrap", 1, { 8 }, DT_F32, UINT64_MAX & ~31ull }), 1, 0,
                        ERR_FORMAT, "'t.wrap'", "past the end");
    expect_tensors_fail("data 1 byte past EOF", 0, 0,
                        T1({ "t.a", 1, { 8 }, DT_F32, 0 }, { "t.last", 2, { 32, 3 }, DT_Q8_0, 32 }), 2, -1, ERR_FORMAT,
                        "'t.last'", "past the end");
    expect_tensors_fail("overlap", 0, 0,
                        T1({ "t.one", 1, { 16 }, DT_F32, 32 }, { "t.two", 1, { 16 }, DT_F32, 64 },
                           { "t.three", 1, { 8 }, DT_F32, 0 }), 3, 0, ERR_FORMAT, "'t.one'", "'t.two'");
    expect_tensors_fail("same offset", 0, 0,
                        T1({ "t.x", 1, { 4 }, DT_F32, 0 }, { "t.y", 1, { 4 }, DT_F32, 0 }), 2, 0, ERR_FORMAT, "'t.x'",
                        "overlap");
    expect_tensors_fail("misaligned", 0, 0, T1({ "t.mis", 1, { 4 }, DT_F32, 16 }), 1, 0, ERR_FORMAT, "'t.mis'",
                        "alignment 32");
    expect_tensors_fail("misaligned 64", GGUF_UINT32, 64, T1({ "t.mis", 1, { 4 }, DT_F32, 32 }), 1, 0, ERR_FORMAT,
                        "'t.mis'", "alignment 64");
    expect_tensors_fail("alignment 0", GGUF_UINT32, 0, T1({ "t", 1, { 4 }, DT_F32, 0 }), 1, 0, ERR_FORMAT,
                        "'general.alignment'", "power of two");
    expect_tensors_fail("alignment 3", GGUF_UINT32, 3, T1({ "t", 1, { 4 }, DT_F32, 0 }), 1, 0, ERR_FORMAT,
                        "'general.alignment'", "is 3");
    expect_tensors_fail("alignment u64", GGUF_UINT64, 32, T1({ "t", 1, { 4 }, DT_F32, 0 }), 1, 0, ERR_FORMAT,
                        "'general.alignment'", "uint32");
    expect_tensors_fail("empty name", 0, 0, T1({ "", 1, { 4 }, DT_F32, 0 }), 1, 0, ERR_FORMAT, "empty name", NULL);
    {
        struct gw w = { 0 };
        gw_header(&w, 3, 1, 0);
        gw_strn(&w, "t\0x", 3); gw_u32(&w, 1); gw_u64(&w, 4); gw_u32(&w, DT_F32); gw_u64(&w, 0);
        gw_pad(&w, 32);
        gw_u64(&w, 0); gw_u64(&w, 0);
        expect_fail("NUL in tensor name", &w, ERR_FORMAT, "NUL", NULL);
        gw_free(&w);
    }
}

int main(void)
{
    RUN(test_real_model);
    RUN(test_roundtrip);
    RUN(test_truncated_everywhere);
    RUN(test_header_errors);
    RUN(test_kv_errors);
    RUN(test_tensor_errors);
    return test_summary();
}

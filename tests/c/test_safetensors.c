/* test_safetensors.c — loader/safetensors (st_parse) and Hugging Face directories
 * (hf_open). Files are built in memory by a tiny writer below and, for directories,
 * written to a mkdtemp() directory under /tmp that is removed afterwards. */
#define _DEFAULT_SOURCE
#include "test.h"
#include "loader/safetensors.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdint.h>
#include <unistd.h>

/* ---- a tiny safetensors writer ---------------------------------------------------- */

/* 8-byte LE length, header padded with spaces to pad (1 = no padding), then data.
 * hdr_len_override (if nonzero) is written instead of the real header length. */
static uint8_t *st_raw(const char *hdr, size_t pad, const void *data, size_t dlen, size_t *len)
{
    size_t h = strlen(hdr);
    size_t hp = (h + pad - 1) / pad * pad;
    *len = 8 + hp + dlen;
    uint8_t *b = malloc(*len ? *len : 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hp >> (8 * i));
    memcpy(b + 8, hdr, h);
    memset(b + 8 + h, ' ', hp - h);
    if (dlen) {
        if (data) memcpy(b + 8 + hp, data, dlen);
        else for (size_t i = 0; i < dlen; i++) b[8 + hp + i] = (uint8_t)(i * 7 + 3);
    }
    return b;
}

struct spec {
    const char *name, *dtype;
    int nd;
    int64_t shape[4];
};

static int esize(const char *dt) { return strcmp(dt, "F32") == 0 ? 4 : 2; }

/* A valid file holding specs[0..n) laid out back to back (8-aligned), data filled with
 * a pattern; offs[i] receives each tensor's offset in the data section. */
static uint8_t *st_make(const struct spec *s, int n, size_t *len, size_t *offs)
{
    char hdr[8192];
    int p = snprintf(hdr, sizeof hdr, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t off = 0, end = 0;
    for (int i = 0; i < n; i++) {
        size_t nb = (size_t)esize(s[i].dtype);
        for (int d = 0; d < s[i].nd; d++) nb *= (size_t)s[i].shape[d];
        p += snprintf(hdr + p, sizeof hdr - (size_t)p, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", s[i].name, s[i].dtype);
        for (int d = 0; d < s[i].nd; d++)
            p += snprintf(hdr + p, sizeof hdr - (size_t)p, "%s%lld", d ? "," : "", (long long)s[i].shape[d]);
        p += snprintf(hdr + p, sizeof hdr - (size_t)p, "],\"data_offsets\":[%zu,%zu]}", off, off + nb);
        if (offs) offs[i] = off;
        end = off + nb;
        off = (end + 7) / 8 * 8;
    }
    snprintf(hdr + p, sizeof hdr - (size_t)p, "}");
    return st_raw(hdr, 8, NULL, end, len); /* no bytes after the last tensor */
}

static void write_file(const char *dir, const char *name, const void *data, size_t len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); return; }
    if (len) fwrite(data, 1, len, f);
    fclose(f);
}

static void write_text(const char *dir, const char *name, const char *text)
{
    write_file(dir, name, text, strlen(text));
}

static void write_st(const char *dir, const char *name, const struct spec *s, int n)
{
    size_t len;
    uint8_t *b = st_make(s, n, &len, NULL);
    write_file(dir, name, b, len);
    free(b);
}

/* Removes every file in a flat temp directory, then the directory. */
static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static char *make_tmpdir(char *buf, size_t n)
{
    snprintf(buf, n, "/tmp/tessera-st-XXXXXX");
    return mkdtemp(buf);
}

#define FILE_NAME "/tmp/some dir/model.safetensors"

/* ---- st_parse ----------------------------------------------------------------------- */

static void test_views(void)
{
    const struct spec s[] = {
        { "w.f32", "F32", 2, { 3, 5 } },
        { "v.f16", "F16", 1, { 7 } },
        { "c.bf16", "BF16", 3, { 2, 3, 4 } },
        { "q.f32_4d", "F32", 4, { 2, 1, 3, 5 } },
        { "scalar", "F32", 0, { 0 } },
        { "empty", "F16", 2, { 0, 9 } },
    };
    int n = (int)(sizeof s / sizeof s[0]);
    size_t len, offs[8];
    uint8_t *b = st_make(s, n, &len, offs);
    size_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (size_t)b[i] << (8 * i);
    struct st_file *f = NULL;
    char err[ERR_BUF] = "";
    int rc = st_parse(b, len, FILE_NAME, &f, err, sizeof err);
    CHECK(rc == 0 && f, "rc=%d %s", rc, err);
    if (!f) { free(b); return; }
    CHECK(st_n_tensors(f) == n, "n=%lld", (long long)st_n_tensors(f));
    for (int i = 0; i < n; i++) {
        const struct tensor *t = st_find_tensor(f, s[i].name);
        CHECK(t && t == st_tensor(f, i), "%s found in header order", s[i].name);
        if (!t) continue;
        CHECK(strcmp(t->name, s[i].name) == 0, "name %s", t->name);
        enum dtype want = !strcmp(s[i].dtype, "F32") ? DT_F32 : !strcmp(s[i].dtype, "F16") ? DT_F16 : DT_BF16;
        CHECK(t->type == want, "%s type %d", s[i].name, t->type);
        CHECK(t->n_dims == (s[i].nd ? s[i].nd : 1), "%s n_dims %d", s[i].name, t->n_dims);
        size_t nb = (size_t)esize(s[i].dtype);
        for (int d = 0; d < 4; d++) {
            int64_t w = d < s[i].nd ? s[i].shape[s[i].nd - 1 - d] : 1;
            CHECK(t->ne[d] == w, "%s ne[%d]=%lld want %lld", s[i].name, d, (long long)t->ne[d], (long long)w);
        }
        for (int d = 0; d < s[i].nd; d++) nb *= (size_t)s[i].shape[d];
        CHECK(t->nbytes == nb, "%s nbytes %zu want %zu", s[i].name, t->nbytes, nb);
        CHECK(t->data == b + 8 + hlen + offs[i], "%s data pointer", s[i].name);
        CHECK(tensor_nelements(t) * esize(s[i].dtype) == (int64_t)nb, "%s nelements", s[i].name);
        for (size_t k = 0; k < t->nbytes; k++) {
            size_t pos = offs[i] + k;
            if (((const uint8_t *)t->data)[k] != (uint8_t)(pos * 7 + 3)) {
                CHECK(0, "%s byte %zu", s[i].name, k);
                break;
            }
        }
    }
    /* the 2-d weight: HF [out=3, in=5] -> ne = {in, out} */
    const struct tensor *w = st_find_tensor(f, "w.f32");
    CHECK(w && w->ne[0] == 5 && w->ne[1] == 3, "weight ne order");
    CHECK(!st_find_tensor(f, "__metadata__"), "metadata is not a tensor");
    CHECK(!st_find_tensor(f, "w"), "prefix is not a match");
    CHECK(!st_find_tensor(f, "zzz") && !st_find_tensor(f, ""), "absent names");
    CHECK(!st_tensor(f, -1) && !st_tensor(f, n), "index out of range");
    st_free(f);
    st_free(NULL);
    free(b);
}

static void test_empty_header_and_many(void)
{
    char err[ERR_BUF];
    size_t len;
    struct st_file *f = NULL;
    uint8_t *b = st_raw("{}", 8, NULL, 0, &len);
    CHECK(st_parse(b, len, FILE_NAME, &f, err, sizeof err) == 0 && st_n_tensors(f) == 0, "%s", err);
    st_free(f);
    free(b);

    /* 600 tensors named in an order unrelated to sort order: every one is found */
    enum { N = 600 };
    char *hdr = malloc(N * 96 + 16);
    int p = sprintf(hdr, "{");
    for (int i = 0; i < N; i++)
        p += sprintf(hdr + p, "%s\"t.%d\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[%d,%d]}",
                     i ? "," : "", (i * 37) % N, i * 8, i * 8 + 8);
    sprintf(hdr + p, "}");
    b = st_raw(hdr, 8, NULL, N * 8, &len);
    f = NULL;
    CHECK(st_parse(b, len, FILE_NAME, &f, err, sizeof err) == 0, "%s", err);
    if (f) {
        char name[32];
        for (int i = 0; i < N; i++) {
            snprintf(name, sizeof name, "t.%d", i);
            const struct tensor *t = st_find_tensor(f, name);
            CHECK(t && !strcmp(t->name, name), "%s", name);
        }
    }
    st_free(f);
    free(b);
    free(hdr);
}

struct bad_case {
    const char *hdr;   /* header JSON */
    size_t dlen;       /* data section bytes */
    int code;          /* expected error */
    const char *what;  /* substring the message must contain (tensor or key) */
};

#define E(dt, shape, offs) "{\"dtype\":" dt ",\"shape\":" shape ",\"data_offsets\":" offs "}"

static void test_malformed(void)
{
    static const struct bad_case cases[] = {
        { "not json at all", 16, ERR_FORMAT, "'{'" },
        { "{\"a\": ", 16, ERR_FORMAT, "JSON" },
        { "{\"a\":" E("\"F32\"", "[1]", "[0,4]") "}garbage", 16, ERR_FORMAT, "trailing" },
        { "[1,2,3]", 16, ERR_FORMAT, "'{'" },
        { "{\"w\": 5}", 16, ERR_FORMAT, "'w'" },
        { "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 16, ERR_FORMAT, "'w': missing \"dtype\"" },
        { "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 16, ERR_FORMAT, "'w': missing \"shape\"" },
        { "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 16, ERR_FORMAT, "'w': missing \"data_offsets\"" },
        { "{\"w\":" E("32", "[1]", "[0,4]") "}", 16, ERR_FORMAT, "'w'" },
        { "{\"w\":" E("\"F32\"", "\"1\"", "[0,4]") "}", 16, ERR_FORMAT, "'w'" },
        { "{\"w\":" E("\"F32\"", "[\"1\"]", "[0,4]") "}", 16, ERR_FORMAT, "'w'" },
        { "{\"w\":" E("\"F32\"", "[1]", "{}") "}", 16, ERR_FORMAT, "'w'" },
        { "{\"w\":" E("\"F32\"", "[1]", "[0]") "}", 16, ERR_FORMAT, "'w'" },
        { "{\"w\":" E("\"F32\"", "[1]", "[0,4,8]") "}", 16, ERR_FORMAT, "'w'" },
        { "{\"w\":" E("\"F32\"", "[1]", "[\"0\",4]") "}", 16, ERR_FORMAT, "'w'" },
        { "{\"w\":" E("\"F32\"", "[1]", "[null,4]") "}", 16, ERR_FORMAT, "'w'" },
        { "{\"w\":" E("\"I64\"", "[1]", "[0,8]") "}", 16, ERR_UNSUPPORTED, "'w': dtype I64" },
        { "{\"w\":" E("\"F64\"", "[1]", "[0,8]") "}", 16, ERR_UNSUPPORTED, "'w': dtype F64" },
        { "{\"w\":" E("\"U8\"", "[1]", "[0,1]") "}", 16, ERR_UNSUPPORTED, "'w': dtype U8" },
        { "{\"w\":" E("\"F8_E4M3\"", "[1]", "[0,1]") "}", 16, ERR_UNSUPPORTED, "'w': dtype F8_E4M3" },
        { "{\"w\":" E("\"f32\"", "[1]", "[0,4]") "}", 16, ERR_FORMAT, "'w': unknown dtype" },
        { "{\"w\":" E("\"F32\"", "[1,1,1,1,1]", "[0,4]") "}", 16, ERR_UNSUPPORTED, "'w': 5 dimensions" },
        { "{\"w\":" E("\"F32\"", "[4]", "[0,16]") "}", 8, ERR_FORMAT, "'w': data_offsets end 16" },
        { "{\"w\":" E("\"F32\"", "[1]", "[8,4]") "}", 16, ERR_FORMAT, "'w': data_offsets begin" },
        { "{\"w\":" E("\"F32\"", "[2]", "[0,4]") "}", 16, ERR_FORMAT, "'w': data_offsets span" },
        { "{\"w\":" E("\"F16\"", "[3]", "[0,4]") "}", 16, ERR_FORMAT, "'w': data_offsets span" },
        { "{\"w\":" E("\"F32\"", "[2]", "[0,8]") ",\"x\":" E("\"F32\"", "[2]", "[4,12]") "}", 16,
          ERR_FORMAT, "overlap" },
        { "{\"w\":" E("\"F32\"", "[4]", "[0,16]") ",\"x\":" E("\"F32\"", "[1]", "[8,12]") "}", 16,
          ERR_FORMAT, "overlap" },
        { "{\"w\":" E("\"F32\"", "[2]", "[0,8]") ",\"w\":" E("\"F32\"", "[2]", "[8,16]") "}", 16,
          ERR_FORMAT, "'w' appears twice" },
        { "{\"w\":" E("\"F32\"", "[4294967296,4294967296,4294967296]", "[0,4]") "}", 16, ERR_FORMAT,
          "'w': shape product overflows" },
        { "{\"w\":" E("\"F32\"", "[4611686018427387904]", "[0,4]") "}", 16, ERR_FORMAT, "'w': shape[0]" },
        { "{\"w\":" E("\"F32\"", "[4294967296, 1073741824]", "[0,4]") "}", 16, ERR_FORMAT,
          "'w': shape product overflows" }, /* 2^62 elements fit, 2^64 bytes do not */
        { "{\"w\":" E("\"F32\"", "[1152921504606846976, 4]", "[0,4]") "}", 16, ERR_FORMAT, "'w': shape[0]" },
        { "{\"w\":" E("\"F32\"", "[-1]", "[0,4]") "}", 16, ERR_FORMAT, "'w': shape[0]" },
        { "{\"w\":" E("\"F32\"", "[1.5]", "[0,4]") "}", 16, ERR_FORMAT, "'w': shape[0]" },
        { "{\"w\":" E("\"F32\"", "[1e400]", "[0,4]") "}", 16, ERR_FORMAT, "'w': shape[0]" },
        { "{\"w\":" E("\"F32\"", "[1]", "[0.5,4.5]") "}", 16, ERR_FORMAT, "'w': data_offsets" },
        { "{\"w\":" E("\"F32\"", "[1]", "[-4,0]") "}", 16, ERR_FORMAT, "'w': data_offsets" },
        { "{\"w\":" E("\"F32\"", "[1]", "[18446744073709551612,18446744073709551616]") "}", 16, ERR_FORMAT,
          "'w': data_offsets" },
        { "{\"w\":" E("\"F32\"", "[1]", "[9007199254740990,9007199254740994]") "}", 16, ERR_FORMAT,
          "'w': data_offsets" },
        { "{\"__metadata__\": 3}", 16, ERR_FORMAT, "__metadata__" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct bad_case *c = &cases[i];
        size_t len;
        uint8_t *b = st_raw(c->hdr, 8, NULL, c->dlen, &len);
        struct st_file *f = (struct st_file *)&len; /* must be reset to NULL */
        char err[ERR_BUF] = "";
        int rc = st_parse(b, len, FILE_NAME, &f, err, sizeof err);
        CHECK(rc == c->code, "case %zu (%s): rc=%d want %d: %s", i, c->hdr, rc, c->code, err);
        CHECK(f == NULL, "case %zu: out not NULL", i);
        CHECK(strstr(err, FILE_NAME), "case %zu: message lacks the file: %s", i, err);
        CHECK(strstr(err, c->what), "case %zu: message lacks \"%s\": %s", i, c->what, err);
        free(b);
    }
}

static void test_header_length(void)
{
    char err[ERR_BUF];
    struct st_file *f = NULL;
    uint8_t b[64];
    memset(b, ' ', sizeof b);
    memcpy(b + 8, "{}", 2);
    const struct { uint64_t n; size_t len; const char *what; } cases[] = {
        { 0, 16, "header length 0" },
        { 1, 16, "header length 1 " },
        { 57, 64, "past the end" },
        { 1000, 64, "past the end" },
        { 100000001, 64, "out of range" },
        { UINT64_MAX, 64, "out of range" },
        { UINT64_MAX - 7, 64, "out of range" },
        { 2, 7, "too short" },
        { 2, 0, "too short" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int k = 0; k < 8; k++) b[k] = (uint8_t)(cases[i].n >> (8 * k));
        uint8_t *copy = malloc(cases[i].len ? cases[i].len : 1); /* exact size for ASan */
        memcpy(copy, b, cases[i].len);
        err[0] = 0;
        int rc = st_parse(copy, cases[i].len, FILE_NAME, &f, err, sizeof err);
        CHECK(rc == ERR_FORMAT && !f, "case %zu rc=%d", i, rc);
        CHECK(strstr(err, FILE_NAME) && strstr(err, cases[i].what), "case %zu: %s", i, err);
        free(copy);
    }
    CHECK(st_parse(NULL, 0, FILE_NAME, &f, err, sizeof err) == ERR_FORMAT && !f, "NULL buffer");
    /* exact fit with no data section is fine */
    for (int k = 0; k < 8; k++) b[k] = (uint8_t)((uint64_t)2 >> (8 * k));
    CHECK(st_parse(b, 10, FILE_NAME, &f, err, sizeof err) == 0 && f && st_n_tensors(f) == 0, "%s", err);
    st_free(f);
}

static void test_truncated_prefixes(void)
{
    const struct spec s[] = {
        { "a", "F32", 2, { 2, 3 } },
        { "b", "BF16", 1, { 5 } },
        { "c", "F16", 0, { 0 } },
    };
    size_t len;
    uint8_t *b = st_make(s, 3, &len, NULL);
    char err[ERR_BUF];
    int failures = 0;
    for (size_t n = 0; n < len; n++) {
        uint8_t *copy = malloc(n ? n : 1); /* exact size: ASan catches any over-read */
        memcpy(copy, b, n);
        struct st_file *f = NULL;
        err[0] = 0;
        int rc = st_parse(copy, n, FILE_NAME, &f, err, sizeof err);
        if (rc == 0 || f || !strstr(err, FILE_NAME)) failures++;
        CHECK(rc != 0 && !f, "prefix %zu of %zu accepted", n, len);
        st_free(f);
        free(copy);
    }
    CHECK(failures == 0, "%d prefixes misbehaved", failures);
    struct st_file *f = NULL;
    CHECK(st_parse(b, len, FILE_NAME, &f, err, sizeof err) == 0, "whole file: %s", err);
    st_free(f);
    free(b);
}

static void test_alignment_and_padding(void)
{
    /* header of 69 bytes, not padded: the F32 tensor starts at offset 77 -> refused */
    const char *hdr = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    size_t len;
    uint8_t *b = st_raw(hdr, 1, NULL, 4, &len);
    char err[ERR_BUF] = "";
    struct st_file *f = NULL;
    int rc = st_parse(b, len, FILE_NAME, &f, err, sizeof err);
    if ((8 + strlen(hdr)) % 4) CHECK(rc == ERR_UNSUPPORTED && strstr(err, "'w'") && strstr(err, "aligned"), "%d %s", rc, err);
    st_free(f);
    free(b);
    /* padded with spaces (as the safetensors library does): accepted */
    b = st_raw(hdr, 8, NULL, 4, &len);
    f = NULL;
    CHECK(st_parse(b, len, FILE_NAME, &f, err, sizeof err) == 0 && st_find_tensor(f, "w"), "%s", err);
    st_free(f);
    free(b);
    /* BF16 has 2-byte elements: an odd-aligned start is refused, an even one accepted */
    const char *h2 = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[1,3]}}";
    b = st_raw(h2, 8, NULL, 4, &len);
    f = NULL;
    CHECK(st_parse(b, len, FILE_NAME, &f, err, sizeof err) == ERR_UNSUPPORTED && !f, "odd bf16: %s", err);
    st_free(f);
    free(b);
}

/* ---- Hugging Face directories ------------------------------------------------------- */

static const char *CONFIG = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":8,\"num_hidden_layers\":1}";

static const struct spec SHARD1[] = {
    { "model.embed_tokens.weight", "BF16", 2, { 16, 8 } },
    { "model.layers.0.self_attn.q_proj.weight", "F32", 2, { 8, 8 } },
};
static const struct spec SHARD2[] = {
    { "model.layers.0.mlp.up_proj.weight", "F16", 2, { 12, 8 } },
    { "model.norm.weight", "F32", 1, { 8 } },
    { "lm_head.weight", "BF16", 2, { 16, 8 } },
};

static const char *INDEX =
    "{\"metadata\":{\"total_size\":1},\"weight_map\":{"
    "\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
    "\"model.layers.0.self_attn.q_proj.weight\":\"model-00001-of-00002.safetensors\","
    "\"model.layers.0.mlp.up_proj.weight\":\"model-00002-of-00002.safetensors\","
    "\"model.norm.weight\":\"model-00002-of-00002.safetensors\","
    "\"lm_head.weight\":\"model-00002-of-00002.safetensors\"}}";

static void test_hf_single(void)
{
    char dir[64], err[ERR_BUF] = "";
    if (!make_tmpdir(dir, sizeof dir)) { CHECK(0, "mkdtemp"); return; }
    write_text(dir, "config.json", CONFIG);
    write_st(dir, "model.safetensors", SHARD1, 2);
    write_text(dir, "tokenizer_config.json",
               "{\"add_bos_token\":true,\"bos_token\":\"<s>\","
               "\"eos_token\":{\"__type\":\"AddedToken\",\"content\":\"</s>\",\"lstrip\":false},"
               "\"chat_template\":\"{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}\"}");
    write_text(dir, "generation_config.json",
               "{\"bos_token_id\":1,\"eos_token_id\":2,\"temperature\":0.6,\"top_p\":0.9,\"top_k\":0,"
               "\"repetition_penalty\":1.1,\"do_sample\":true}");
    struct hf_dir *d = NULL;
    int rc = hf_open(dir, &d, err, sizeof err);
    CHECK(rc == 0 && d, "rc=%d %s", rc, err);
    if (d) {
        CHECK(!strcmp(hf_path(d), dir), "path");
        const cJSON *c = hf_config(d);
        const cJSON *hs = cJSON_GetObjectItemCaseSensitive(c, "hidden_size");
        CHECK(cJSON_IsNumber(hs) && hs->valueint == 8, "config hidden_size");
        CHECK(hf_n_tensors(d) == 2, "n=%lld", (long long)hf_n_tensors(d));
        const struct tensor *q = hf_find_tensor(d, "model.layers.0.self_attn.q_proj.weight");
        CHECK(q && q->type == DT_F32 && q->ne[0] == 8 && q->ne[1] == 8 && q->nbytes == 256, "q_proj");
        const struct tensor *e = hf_find_tensor(d, "model.embed_tokens.weight");
        CHECK(e && e->type == DT_BF16 && e->ne[0] == 8 && e->ne[1] == 16, "embed ne = {hidden, vocab}");
        CHECK(!hf_find_tensor(d, "lm_head.weight"), "absent");
        CHECK(hf_tensor(d, 0) && hf_tensor(d, 1) && !hf_tensor(d, 2) && !hf_tensor(d, -1), "hf_tensor range");
        char want[128];
        snprintf(want, sizeof want, "%s/tokenizer.json", dir);
        CHECK(!strcmp(hf_tokenizer_json_path(d), want), "%s", hf_tokenizer_json_path(d));
        const struct hf_tokenizer_config *tc = hf_tokenizer_config(d);
        CHECK(tc->chat_template && !strncmp(tc->chat_template, "{{ bos_token }}", 15), "template");
        CHECK(tc->bos_token && !strcmp(tc->bos_token, "<s>"), "bos");
        CHECK(tc->eos_token && !strcmp(tc->eos_token, "</s>"), "eos from object");
        CHECK(tc->add_bos_token == 1, "add_bos %d", tc->add_bos_token);
        const struct hf_generation_config *g = hf_generation_config(d);
        CHECK(g->n_eos == 1 && g->eos_ids[0] == 2, "eos int");
        CHECK(g->bos_id == 1 && g->top_k == 0, "bos %d top_k %d", g->bos_id, g->top_k);
        CHECK_CLOSE(g->temperature, 0.6, 0, 0);
        CHECK_CLOSE(g->top_p, 0.9, 0, 0);
        CHECK_CLOSE(g->repetition_penalty, 1.1, 0, 0);
    }
    hf_close(d);
    hf_close(NULL);
    rm_dir(dir);
}

static void test_hf_sharded(void)
{
    char dir[64], err[ERR_BUF] = "";
    if (!make_tmpdir(dir, sizeof dir)) { CHECK(0, "mkdtemp"); return; }
    write_text(dir, "config.json", CONFIG);
    write_st(dir, "model-00001-of-00002.safetensors", SHARD1, 2);
    write_st(dir, "model-00002-of-00002.safetensors", SHARD2, 3);
    write_text(dir, "model.safetensors.index.json", INDEX);
    write_text(dir, "tokenizer_config.json",
               "{\"add_bos_token\":false,\"bos_token\":null,\"eos_token\":\"<|im_end|>\",\"chat_template\":["
               "{\"name\":\"tool_use\",\"template\":\"TOOLS\"},{\"name\":\"default\",\"template\":\"DEFAULT\"}]}");
    write_text(dir, "generation_config.json", "{\"eos_token_id\":[128001,128008,128009],\"temperature\":null}");
    struct hf_dir *d = NULL;
    int rc = hf_open(dir, &d, err, sizeof err);
    CHECK(rc == 0 && d, "rc=%d %s", rc, err);
    if (d) {
        CHECK(hf_n_tensors(d) == 5, "n=%lld", (long long)hf_n_tensors(d));
        for (int i = 0; i < 2; i++) CHECK(hf_find_tensor(d, SHARD1[i].name), "%s", SHARD1[i].name);
        for (int i = 0; i < 3; i++) CHECK(hf_find_tensor(d, SHARD2[i].name), "%s", SHARD2[i].name);
        const struct tensor *up = hf_find_tensor(d, "model.layers.0.mlp.up_proj.weight");
        CHECK(up && up->type == DT_F16 && up->ne[0] == 8 && up->ne[1] == 12, "up_proj");
        for (int64_t i = 1; i < hf_n_tensors(d); i++)
            CHECK(strcmp(hf_tensor(d, i - 1)->name, hf_tensor(d, i)->name) < 0, "name order");
        /* one mapping per shard, and every tensor lies inside exactly one (packing gives
         * pages back only through them) */
        CHECK(hf_n_maps(d) == 2 && !hf_map(d, 2) && !hf_map(d, -1), "%d maps", hf_n_maps(d));
        for (int64_t i = 0; i < hf_n_tensors(d); i++) {
            const struct tensor *t = hf_tensor(d, i);
            int in = 0;
            for (int k = 0; k < hf_n_maps(d); k++) {
                const struct mapped_file *mf = hf_map(d, k);
                uintptr_t a = (uintptr_t)t->data, base = (uintptr_t)mf->data;
                in += a >= base && a + t->nbytes <= base + mf->size;
            }
            CHECK(in == 1, "%s lies in %d mappings", t->name, in);
        }
        const struct hf_tokenizer_config *tc = hf_tokenizer_config(d);
        CHECK(tc->chat_template && !strcmp(tc->chat_template, "DEFAULT"), "list template");
        CHECK(!tc->bos_token && tc->eos_token && !strcmp(tc->eos_token, "<|im_end|>"), "null bos");
        CHECK(tc->add_bos_token == 0, "add_bos false");
        const struct hf_generation_config *g = hf_generation_config(d);
        CHECK(g->n_eos == 3 && g->eos_ids[0] == 128001 && g->eos_ids[2] == 128009, "eos list");
        CHECK(g->bos_id == -1 && g->temperature < 0 && g->top_p < 0 && g->top_k == -1 &&
              g->repetition_penalty < 0, "absent sentinels");
    }
    hf_close(d);
    rm_dir(dir);
}

static void test_hf_chat_template_file(void)
{
    char dir[64], err[ERR_BUF] = "";
    if (!make_tmpdir(dir, sizeof dir)) { CHECK(0, "mkdtemp"); return; }
    write_text(dir, "config.json", CONFIG);
    write_st(dir, "model.safetensors", SHARD1, 2);
    write_text(dir, "tokenizer_config.json", "{\"eos_token\":\"<eos>\"}");
    write_text(dir, "chat_template.jinja", "{{ messages[0].content }}\n");
    struct hf_dir *d = NULL;
    CHECK(hf_open(dir, &d, err, sizeof err) == 0, "%s", err);
    if (d) {
        const struct hf_tokenizer_config *tc = hf_tokenizer_config(d);
        CHECK(tc->chat_template && !strcmp(tc->chat_template, "{{ messages[0].content }}\n"), "jinja file");
        CHECK(tc->add_bos_token == -1 && !tc->bos_token, "absent add_bos, bos");
        const struct hf_generation_config *g = hf_generation_config(d);
        CHECK(g->n_eos == 0 && g->bos_id == -1, "no generation_config");
    }
    hf_close(d);
    /* as in transformers, the file wins over the tokenizer_config key */
    write_text(dir, "tokenizer_config.json", "{\"chat_template\":\"FROM CONFIG\"}");
    d = NULL;
    CHECK(hf_open(dir, &d, err, sizeof err) == 0, "%s", err);
    if (d) CHECK(!strcmp(hf_tokenizer_config(d)->chat_template, "{{ messages[0].content }}\n"), "file wins");
    hf_close(d);
    /* no tokenizer_config.json, no template file: all absent */
    char p[128];
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    unlink(p);
    d = NULL;
    CHECK(hf_open(dir, &d, err, sizeof err) == 0, "%s", err);
    if (d) {
        const struct hf_tokenizer_config *tc = hf_tokenizer_config(d);
        CHECK(!tc->chat_template && !tc->bos_token && !tc->eos_token && tc->add_bos_token == -1, "absent");
    }
    hf_close(d);
    rm_dir(dir);
}

/* One broken directory: the files (name, text) over a valid base, then hf_open must
 * fail with code and a message containing every one of want[]. */
struct hf_bad {
    const char *label;
    const char *files[4][2]; /* extra or replacing files; text NULL = delete */
    int sharded;             /* base layout: 0 single file, 1 index + 2 shards */
    int code;
    const char *want[3];     /* substrings ("@" = the failing file's full path marker, see below) */
};

static void test_hf_errors(void)
{
    static const struct hf_bad cases[] = {
        { "config missing", { { "config.json", NULL } }, 0, ERR_NOT_FOUND, { "/config.json", "not found" } },
        { "config invalid", { { "config.json", "{\"a\":" } }, 0, ERR_FORMAT, { "/config.json", "JSON" } },
        { "config not object", { { "config.json", "[]" } }, 0, ERR_FORMAT, { "/config.json", "object" } },
        { "no weights", { { "model.safetensors", NULL } }, 0, ERR_NOT_FOUND, { "model.safetensors.index.json" } },
        { "pytorch only", { { "model.safetensors", NULL }, { "pytorch_model.bin", "x" } }, 0, ERR_UNSUPPORTED,
          { "/pytorch_model.bin" } },
        { "bad weights", { { "model.safetensors", "\x02\0\0\0\0\0\0\0[]" } }, 0, ERR_FORMAT,
          { "/model.safetensors" } },
        { "index missing shard", { { "model-00002-of-00002.safetensors", NULL } }, 1, ERR_NOT_FOUND,
          { "/model.safetensors.index.json", "model-00002-of-00002.safetensors" } },
        { "index ../", { { "model.safetensors.index.json", "{\"weight_map\":{\"w\":\"../x.safetensors\"}}" } }, 1,
          ERR_FORMAT, { "/model.safetensors.index.json", "\"w\"", "../x.safetensors" } },
        { "index /abs", { { "model.safetensors.index.json", "{\"weight_map\":{\"w\":\"/etc/passwd\"}}" } }, 1,
          ERR_FORMAT, { "/model.safetensors.index.json", "/etc/passwd" } },
        { "index sub/dir", { { "model.safetensors.index.json", "{\"weight_map\":{\"w\":\"a/b.safetensors\"}}" } }, 1,
          ERR_FORMAT, { "a/b.safetensors" } },
        { "index ..", { { "model.safetensors.index.json", "{\"weight_map\":{\"w\":\"..\"}}" } }, 1, ERR_FORMAT,
          { "\"..\"" } },
        { "index not string", { { "model.safetensors.index.json", "{\"weight_map\":{\"w\":3}}" } }, 1, ERR_FORMAT,
          { "\"w\"" } },
        { "index no map", { { "model.safetensors.index.json", "{\"metadata\":{}}" } }, 1, ERR_FORMAT,
          { "/model.safetensors.index.json", "weight_map" } },
        { "index invalid", { { "model.safetensors.index.json", "{" } }, 1, ERR_FORMAT,
          { "/model.safetensors.index.json", "JSON" } },
        { "tensor not in shard",
          { { "model.safetensors.index.json",
              "{\"weight_map\":{\"model.norm.weight\":\"model-00001-of-00002.safetensors\","
              "\"lm_head.weight\":\"model-00002-of-00002.safetensors\"}}" } },
          1, ERR_NOT_FOUND, { "/model.safetensors.index.json", "'model.norm.weight'", "/model-00001-of-00002.safetensors" } },
        { "tokenizer_config invalid", { { "tokenizer_config.json", "{,}" } }, 0, ERR_FORMAT,
          { "/tokenizer_config.json", "JSON" } },
        { "chat_template wrong type", { { "tokenizer_config.json", "{\"chat_template\":5}" } }, 0, ERR_FORMAT,
          { "/tokenizer_config.json", "chat_template" } },
        { "chat_template bad list", { { "tokenizer_config.json", "{\"chat_template\":[{\"name\":1}]}" } }, 0,
          ERR_FORMAT, { "/tokenizer_config.json", "chat_template" } },
        { "eos_token wrong type", { { "tokenizer_config.json", "{\"eos_token\":[1]}" } }, 0, ERR_FORMAT,
          { "/tokenizer_config.json", "eos_token" } },
        { "add_bos wrong type", { { "tokenizer_config.json", "{\"add_bos_token\":\"yes\"}" } }, 0, ERR_FORMAT,
          { "/tokenizer_config.json", "add_bos_token" } },
        { "eos list too long", { { "generation_config.json", "{\"eos_token_id\":[1,2,3,4,5,6,7,8,9]}" } }, 0,
          ERR_RANGE, { "/generation_config.json", "eos_token_id" } },
        { "eos negative", { { "generation_config.json", "{\"eos_token_id\":-2}" } }, 0, ERR_FORMAT,
          { "/generation_config.json", "eos_token_id" } },
        { "eos float in list", { { "generation_config.json", "{\"eos_token_id\":[1, 2.5]}" } }, 0, ERR_FORMAT,
          { "/generation_config.json", "eos_token_id" } },
        { "temperature string", { { "generation_config.json", "{\"temperature\":\"hot\"}" } }, 0, ERR_FORMAT,
          { "/generation_config.json", "temperature" } },
        { "top_k float", { { "generation_config.json", "{\"top_k\":2.5}" } }, 0, ERR_FORMAT,
          { "/generation_config.json", "top_k" } },
        { "generation_config invalid", { { "generation_config.json", "nope" } }, 0, ERR_FORMAT,
          { "/generation_config.json" } },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct hf_bad *c = &cases[i];
        char dir[64], err[ERR_BUF] = "";
        if (!make_tmpdir(dir, sizeof dir)) { CHECK(0, "mkdtemp"); return; }
        write_text(dir, "config.json", CONFIG);
        if (c->sharded) {
            write_st(dir, "model-00001-of-00002.safetensors", SHARD1, 2);
            write_st(dir, "model-00002-of-00002.safetensors", SHARD2, 3);
            write_text(dir, "model.safetensors.index.json", INDEX);
        } else {
            write_st(dir, "model.safetensors", SHARD1, 2);
        }
        for (int k = 0; k < 4 && c->files[k][0]; k++) {
            char p[256];
            snprintf(p, sizeof p, "%s/%s", dir, c->files[k][0]);
            if (!c->files[k][1]) unlink(p);
            else if (!strcmp(c->files[k][0], "model.safetensors")) write_file(dir, c->files[k][0], c->files[k][1], 10);
            else write_text(dir, c->files[k][0], c->files[k][1]);
        }
        struct hf_dir *d = (struct hf_dir *)&i; /* must be reset to NULL */
        int rc = hf_open(dir, &d, err, sizeof err);
        CHECK(rc == c->code && !d, "%s: rc=%d want %d: %s", c->label, rc, c->code, err);
        for (int k = 0; k < 3 && c->want[k]; k++)
            CHECK(strstr(err, c->want[k]), "%s: message lacks '%s': %s", c->label, c->want[k], err);
        /* every message names the directory (full path of the file) */
        CHECK(strstr(err, dir), "%s: message lacks the directory: %s", c->label, err);
        if (!d || d == (struct hf_dir *)&i) d = NULL;
        hf_close(d);
        rm_dir(dir);
    }
}

static void test_hf_duplicate_across_shards(void)
{
    char dir[64], err[ERR_BUF] = "";
    if (!make_tmpdir(dir, sizeof dir)) { CHECK(0, "mkdtemp"); return; }
    const struct spec s2[] = { { "model.norm.weight", "F32", 1, { 8 } },
                               { "model.embed_tokens.weight", "BF16", 2, { 16, 8 } } };
    write_text(dir, "config.json", CONFIG);
    write_st(dir, "a.safetensors", SHARD1, 2);
    write_st(dir, "b.safetensors", s2, 2);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"model.embed_tokens.weight\":\"a.safetensors\",\"model.norm.weight\":\"b.safetensors\"}}");
    struct hf_dir *d = NULL;
    int rc = hf_open(dir, &d, err, sizeof err);
    CHECK(rc == ERR_FORMAT && !d && strstr(err, "'model.embed_tokens.weight'") && strstr(err, "a.safetensors") &&
              strstr(err, "b.safetensors"),
          "rc=%d %s", rc, err);
    hf_close(d);
    CHECK(hf_open("/nonexistent/tessera/dir", &d, err, sizeof err) == ERR_NOT_FOUND && !d &&
              strstr(err, "/nonexistent/tessera/dir/config.json"),
          "%s", err);
    rm_dir(dir);
}

int main(void)
{
    RUN(test_views);
    RUN(test_empty_header_and_many);
    RUN(test_malformed);
    RUN(test_header_length);
    RUN(test_truncated_prefixes);
    RUN(test_alignment_and_padding);
    RUN(test_hf_single);
    RUN(test_hf_sharded);
    RUN(test_hf_chat_template_file);
    RUN(test_hf_errors);
    RUN(test_hf_duplicate_across_shards);
    return test_summary();
}

/* fuzz_gguf.c — libFuzzer target for loader/gguf.
 *
 * Parses the input as a GGUF file; if it parses, walks every key through the typed
 * getters (arrays element by element), every tensor's first and last data byte, and
 * looks every key and tensor up by name, then frees. Any crash, sanitizer report, or
 * failed invariant (abort via __builtin_trap) is a bug in the parser.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Isrc tests/fuzz/fuzz_gguf.c \
 *       src/loader/gguf.c src/util/err.c src/util/tensor.c -o build/fuzz_gguf
 *   build/fuzz_gguf -max_total_time=60 corpus_dir/
 *
 * Good seeds: small files written by gguf-py's GGUFWriter, and the first few KB of a
 * real model (see docs/formats-gguf.md).
 */
#include "loader/gguf.h"
#include "util/err.h"

#include <stdlib.h>
#include <string.h>

#define FUZZ_ASSERT(c) do { if (!(c)) __builtin_trap(); } while (0)

static void walk_key(const struct gguf_file *g, int64_t i, volatile uint64_t *sink)
{
    char err[ERR_BUF];
    struct gguf_str k = gguf_key_name(g, i);
    char *key = malloc(k.len + 1);
    if (!key) return;
    memcpy(key, k.ptr, k.len);
    key[k.len] = 0;
    FUZZ_ASSERT(gguf_find_key(g, key) == i);

    int64_t v;
    double f;
    bool b;
    struct gguf_str s;
    enum gguf_vtype et;
    uint64_t n;
    int rc = gguf_get_int(g, key, &v, err, sizeof err);
    FUZZ_ASSERT(rc == 0 || rc == ERR_FORMAT);
    if (!rc) *sink += (uint64_t)v;
    if (!gguf_get_float(g, key, &f, err, sizeof err)) *sink += f == f;
    if (!gguf_get_bool(g, key, &b, err, sizeof err)) *sink += b;
    if (!gguf_get_str(g, key, &s, err, sizeof err)) {
        FUZZ_ASSERT(gguf_kv_type(g, i) == GGUF_STRING);
        if (s.len) *sink += (uint8_t)s.ptr[0] + (uint8_t)s.ptr[s.len - 1];
    }
    if (!gguf_get_arr(g, key, &et, &n, err, sizeof err)) {
        FUZZ_ASSERT(gguf_kv_type(g, i) == GGUF_ARRAY);
        for (uint64_t j = 0; j < n; j++) {
            if (et == GGUF_STRING) {
                struct gguf_str e = gguf_arr_str(g, key, j);
                if (e.len) *sink += (uint8_t)e.ptr[0] + (uint8_t)e.ptr[e.len - 1];
            } else {
                *sink += (uint64_t)gguf_arr_int(g, key, j);
                double d = gguf_arr_float(g, key, j);
                *sink += d == d;
            }
        }
    }
    free(key);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[ERR_BUF];
    struct gguf_file *g = NULL;
    volatile uint64_t sink = 0;
    int rc = gguf_parse(data, size, "fuzz.gguf", &g, err, sizeof err);
    if (rc) {
        FUZZ_ASSERT(g == NULL && strstr(err, "fuzz.gguf") != NULL);
        return 0;
    }
    FUZZ_ASSERT(gguf_version(g) == 2 || gguf_version(g) == 3);
    for (int64_t i = 0; i < gguf_n_kv(g); i++) walk_key(g, i, &sink);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const struct tensor *t = gguf_tensor(g, i);
        FUZZ_ASSERT(gguf_find_tensor(g, t->name) == t);
        FUZZ_ASSERT(t->nbytes > 0 && t->n_dims >= 1 && t->n_dims <= TENSOR_MAX_DIMS);
        const uint8_t *p = t->data;
        FUZZ_ASSERT(p >= data && p + t->nbytes <= data + size);
        sink += p[0] + p[t->nbytes - 1];
    }
    gguf_free(g);
    return 0;
}

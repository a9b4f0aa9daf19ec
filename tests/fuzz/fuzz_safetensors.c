/* fuzz_safetensors.c — libFuzzer target over st_parse (loader/safetensors.c).
 *
 * Build and run (not part of the Makefile):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Isrc tests/fuzz/fuzz_safetensors.c \
 *       src/loader/safetensors.c src/util/err.c src/util/tensor.c -lcjson -lm -o build/fuzz_safetensors
 *   build/fuzz_safetensors -max_total_time=60 -max_len=4096 CORPUS_DIR
 *
 * Beyond "no crash", it checks the parser's promises on every accepted input: each
 * tensor's bytes lie inside the input (touching the first and last byte lets ASan
 * verify it), nbytes matches the element count, and lookup by name finds the same view.
 */
#include "loader/safetensors.h"
#include "util/err.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct st_file *f = NULL;
    char err[ERR_BUF];
    if (st_parse(data, size, "fuzz.safetensors", &f, err, sizeof err) != 0) {
        if (f || !err[0]) abort(); /* a failure must leave *out NULL and say why */
        return 0;
    }
    volatile uint8_t sink = 0;
    for (int64_t i = 0; i < st_n_tensors(f); i++) {
        const struct tensor *t = st_tensor(f, i);
        if (!t || st_find_tensor(f, t->name) != t) abort();
        int64_t n = tensor_nelements(t);
        size_t es = t->type == DT_F32 ? 4 : 2;
        if (n < 0 || (size_t)n * es != t->nbytes) abort();
        const uint8_t *p = t->data;
        if (t->nbytes) {
            if (p < data || p + t->nbytes > data + size) abort();
            sink ^= p[0];
            sink ^= p[t->nbytes - 1];
        }
    }
    (void)sink;
    st_free(f);
    return 0;
}

/* tool_bench_tokenizer.c — encode throughput of the tokenizer on one core.
 *
 *   build/tests/tool_bench_tokenizer TOKENIZER(.json|.gguf) CORPUS [chunk_bytes=4096] [seconds=3]
 *
 * Loads the tokenizer (timed), cuts CORPUS into chunks of about chunk_bytes (at UTF-8
 * character boundaries, as requests of that size would arrive), encodes them all
 * repeatedly for at least `seconds` on the calling thread and prints one line:
 * load seconds, MB/s, tokens/s, bytes per token. scripts/bench_tokenizer.sh runs it next
 * to Hugging Face `tokenizers` on the same corpus and chunks.
 */
#include "loader/gguf.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"
#include "util/mapfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int load(const char *path, struct tokenizer **t, char *err, size_t errlen)
{
    size_t n = strlen(path);
    if (n < 5 || strcmp(path + n - 5, ".gguf") != 0)
        return tok_load_hf_json(path, t, err, errlen);
    struct mapped_file mf;
    int rc = map_open(path, &mf, err, errlen);
    if (rc < 0)
        return rc;
    struct gguf_file *g = NULL;
    rc = gguf_parse(mf.data, mf.size, path, &g, err, errlen);
    if (rc == 0)
        rc = tok_load_gguf(g, t, err, errlen);
    gguf_free(g);
    map_close(&mf);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s TOKENIZER(.json|.gguf) CORPUS [chunk_bytes] [seconds]\n", argv[0]);
        return 2;
    }
    size_t chunk = argc > 3 ? (size_t)atol(argv[3]) : 4096;
    double seconds = argc > 4 ? atof(argv[4]) : 3.0;
    if (chunk < 16)
        chunk = 16;
    char err[ERR_BUF];
    struct tokenizer *t = NULL;
    double t0 = now();
    if (load(argv[1], &t, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    double load_s = now() - t0;
    char *text = NULL;
    size_t len = 0;
    if (read_text_file(argv[2], &text, &len, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        tok_free(t);
        return 1;
    }
    int cap = (int)(chunk + 64);
    int32_t *ids = malloc(sizeof *ids * (size_t)cap);
    if (!ids) {
        free(text);
        tok_free(t);
        return 1;
    }
    double bytes = 0, tokens = 0;
    int passes = 0;
    t0 = now();
    do {
        for (size_t off = 0; off < len;) {
            size_t n = len - off < chunk ? len - off : chunk;
            while (off + n < len && ((unsigned char)text[off + n] & 0xC0) == 0x80)
                n++; /* do not cut a character */
            int k = tok_encode(t, text + off, n, false, true, ids, cap);
            if (k < 0 || k > cap) {
                fprintf(stderr, "encode failed (%d)\n", k);
                return 1;
            }
            tokens += k;
            bytes += (double)n;
            off += n;
        }
        passes++;
    } while (now() - t0 < seconds);
    double dt = now() - t0;
    printf("load %.3f s  encode %.2f MB/s  %.0f tokens/s  %.2f bytes/token  (%d passes over %zu bytes)\n", load_s,
           bytes / dt / 1e6, tokens / dt, bytes / tokens, passes, len);
    free(ids);
    free(text);
    tok_free(t);
    return 0;
}

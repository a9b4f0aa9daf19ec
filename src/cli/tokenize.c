/* tokenize.c — `tessera tokenize`: encode text to token ids or decode ids to text with
 * a GGUF file's tokenizer, a Hugging Face directory or a tokenizer.json.
 *
 *   tessera tokenize (--model FILE.gguf|DIR | --tokenizer tokenizer.json)
 *                    (--text STR | --file PATH | --decode 1,2,3 | --jsonl PATH)
 *                    [--add-special] [--no-parse-special] [--add-bos {0,1}] [--skip-special]
 *
 * Encode prints the ids as one JSON array line; decode writes the raw bytes. --jsonl
 * runs a batch (one process for a whole test corpus): each input line is a JSON string
 * (encode: prints an id array line) or a JSON array of ids (decode: prints a JSON
 * string line, bytes >= 0x80 unescaped). --model DIR also applies
 * DIR/tokenizer_config.json; --tokenizer FILE uses tokenizer.json alone, like
 * `tokenizers.Tokenizer.from_file`. Exit 0 ok, 1 load/runtime error, 2 usage error.
 */
#include "cli/args.h"
#include "cli/cli.h"
#include "loader/gguf.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"
#include "util/mapfile.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tessera tokenize (--model FILE.gguf|DIR | --tokenizer tokenizer.json)\n"
            "                        (--text STR | --file PATH | --decode 1,2,3 | --jsonl PATH)\n"
            "                        [--add-special] [--no-parse-special] [--add-bos {0,1}] [--skip-special]\n"
            "  encode prints the ids as a JSON array; decode writes the raw text.\n"
            "  --jsonl: one JSON string (encode) or JSON id array (decode) per line, one result line each.\n");
}

static int load_tokenizer(const char *model, const char *tokfile, struct tokenizer **tok, char *err, size_t errlen)
{
    if (tokfile)
        return tok_load_hf_json(tokfile, tok, err, errlen);
    struct stat st;
    if (stat(model, &st) != 0)
        return err_set(err, errlen, ERR_IO, "%s: no such file or directory", model);
    if (S_ISDIR(st.st_mode))
        return tok_load_hf_dir(model, tok, err, errlen);
    struct mapped_file mf;
    int rc = map_open(model, &mf, err, errlen);
    if (rc < 0)
        return rc;
    struct gguf_file *g = NULL;
    rc = gguf_parse(mf.data, mf.size, model, &g, err, errlen);
    if (rc == 0)
        rc = tok_load_gguf(g, tok, err, errlen);
    gguf_free(g);
    map_close(&mf);
    return rc;
}

/* Encodes and prints one JSON id array line. */
static int encode_print(const struct tokenizer *tok, const char *text, size_t len, bool add_special,
                        bool parse_special, FILE *out)
{
    int cap = (int)(len < 1000 ? 1024 : len + 16);
    int32_t *ids = malloc(sizeof *ids * (size_t)cap);
    if (!ids)
        return ERR_NOMEM;
    int n = tok_encode(tok, text, len, add_special, parse_special, ids, cap);
    if (n > cap) {
        free(ids);
        cap = n;
        ids = malloc(sizeof *ids * (size_t)cap);
        if (!ids)
            return ERR_NOMEM;
        n = tok_encode(tok, text, len, add_special, parse_special, ids, cap);
    }
    if (n < 0) {
        free(ids);
        return n;
    }
    fputc('[', out);
    for (int i = 0; i < n; i++)
        fprintf(out, i ? ",%d" : "%d", (int)ids[i]);
    fputs("]\n", out);
    free(ids);
    return 0;
}

/* A JSON string literal of s; bytes >= 0x80 are copied as they are. */
static void print_json_string(const char *s, FILE *out)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(out, "\\u%04x", *p);
        else
            fputc(*p, out);
    }
    fputc('"', out);
}

/* One --jsonl line: a string to encode or an id array to decode. */
static int jsonl_line(const struct tokenizer *tok, const char *line, bool add_special, bool parse_special,
                      bool skip_special, char *err, size_t errlen)
{
    cJSON *v = cJSON_Parse(line);
    int rc = 0;
    if (cJSON_IsString(v)) {
        /* cJSON strings are NUL-terminated: "\u0000" would cut them; count the real
         * length by re-scanning is impossible, so NUL is not supported in --jsonl */
        rc = encode_print(tok, v->valuestring, strlen(v->valuestring), add_special, parse_special, stdout);
        if (rc < 0)
            err_set(err, errlen, rc, "encode failed");
    } else if (cJSON_IsArray(v)) {
        int n = cJSON_GetArraySize(v), i = 0;
        int32_t *ids = malloc(sizeof *ids * (size_t)(n ? n : 1));
        const cJSON *it;
        if (!ids) {
            cJSON_Delete(v);
            return err_set(err, errlen, ERR_NOMEM, "out of memory");
        }
        cJSON_ArrayForEach(it, v) ids[i++] = cJSON_IsNumber(it) ? (int32_t)it->valuedouble : -1;
        char *text = tok_decode(tok, ids, n, skip_special);
        free(ids);
        if (!text) {
            cJSON_Delete(v);
            return err_set(err, errlen, ERR_NOMEM, "out of memory");
        }
        print_json_string(text, stdout);
        fputc('\n', stdout);
        free(text);
    } else {
        rc = err_set(err, errlen, ERR_FORMAT, "--jsonl line is neither a JSON string nor an id array: %.60s", line);
    }
    cJSON_Delete(v);
    return rc;
}

static int run_jsonl(const struct tokenizer *tok, const char *path, bool add_special, bool parse_special,
                     bool skip_special, char *err, size_t errlen)
{
    char *text = NULL;
    size_t len = 0;
    int rc = read_text_file(path, &text, &len, err, errlen);
    if (rc < 0)
        return rc;
    char *line = text;
    while (rc == 0 && line < text + len) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        if (nl)
            *nl = 0;
        if (*line)
            rc = jsonl_line(tok, line, add_special, parse_special, skip_special, err, errlen);
        line = nl ? nl + 1 : text + len;
    }
    free(text);
    return rc;
}

int cli_tokenize(int argc, char **argv)
{
    const char *model = NULL, *tokfile = NULL, *text = NULL, *file = NULL, *decode = NULL, *jsonl = NULL;
    bool add_special = false, parse_special = true, skip_special = false;
    int add_bos = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = !strcmp(a, "--model") ? &model
                         : !strcmp(a, "--tokenizer") ? &tokfile
                         : !strcmp(a, "--text") ? &text
                         : !strcmp(a, "--file") ? &file
                         : !strcmp(a, "--decode") ? &decode
                         : !strcmp(a, "--jsonl") ? &jsonl : NULL;
        if (dst) {
            if (!(*dst = args_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--add-special")) {
            add_special = true;
        } else if (!strcmp(a, "--no-parse-special")) {
            parse_special = false;
        } else if (!strcmp(a, "--skip-special")) {
            skip_special = true;
        } else if (!strcmp(a, "--add-bos")) {
            const char *v = args_value(argc, argv, &i);
            if (!v || args_int("--add-bos", v, 0, 1, &add_bos) < 0)
                return 2;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "tokenize: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    int n_inputs = !!text + !!file + !!decode + !!jsonl;
    if (!model == !tokfile || n_inputs != 1) {
        fprintf(stderr, "tokenize: give one of --model/--tokenizer and one of --text/--file/--decode/--jsonl\n");
        usage(stderr);
        return 2;
    }
    int32_t *dec_ids = NULL;
    int n_dec = 0;
    if (decode && (n_dec = args_ids("--decode", decode, &dec_ids)) < 0)
        return 2;

    char err[ERR_BUF];
    struct tokenizer *tok = NULL;
    int rc = load_tokenizer(model, tokfile, &tok, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "tokenize: %s\n", err);
        free(dec_ids);
        return 1;
    }
    if (add_bos >= 0)
        tok_set_adds_bos(tok, add_bos != 0);

    if (decode) {
        for (int i = 0; i < n_dec; i++)
            if (dec_ids[i] >= tok_vocab_size(tok)) {
                fprintf(stderr, "tokenize: --decode: id %d is outside the vocabulary (%d tokens)\n",
                        (int)dec_ids[i], tok_vocab_size(tok));
                rc = ERR_RANGE;
                break;
            }
        char *s = rc == 0 ? tok_decode(tok, dec_ids, n_dec, skip_special) : NULL;
        if (s) {
            size_t n = 0;
            for (int i = 0; i < n_dec; i++)
                n += (size_t)tok_token_bytes(tok, dec_ids[i], skip_special, NULL, 0);
            fwrite(s, 1, n, stdout); /* n, not strlen: decoded text may hold NUL */
            free(s);
        } else if (rc == 0) {
            fprintf(stderr, "tokenize: out of memory\n");
            rc = ERR_NOMEM;
        }
    } else if (jsonl) {
        rc = run_jsonl(tok, jsonl, add_special, parse_special, skip_special, err, sizeof err);
        if (rc < 0)
            fprintf(stderr, "tokenize: %s\n", err);
    } else {
        char *buf = NULL;
        size_t len = text ? strlen(text) : 0;
        if (file && (rc = read_text_file(file, &buf, &len, err, sizeof err)) < 0) {
            fprintf(stderr, "tokenize: %s\n", err);
        } else {
            rc = encode_print(tok, file ? buf : text, len, add_special, parse_special, stdout);
            if (rc < 0)
                fprintf(stderr, "tokenize: encode failed: %s\n", err_name(rc));
        }
        free(buf);
    }
    free(dec_ids);
    tok_free(tok);
    return rc < 0 ? 1 : 0;
}

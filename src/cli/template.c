/* template.c — `tessera template`: render a chat template with a JSON context.
 *
 *   tessera template (--template FILE | --model FILE.gguf) --context CONTEXT.json
 *                    [--fixed-date "26 Jul 2024"]
 *
 * Writes the rendering to stdout with nothing added. Exit 0 on success, 1 when the
 * template fails to parse or render (raise_exception's message, or the error, on
 * stderr), 2 on usage errors. --model reads the GGUF key tokenizer.chat_template.
 * --fixed-date makes strftime_now() return that string (tests); otherwise it formats
 * the current UTC time.
 */
#include "cli/cli.h"
#include "loader/gguf.h"
#include "template/jinja.h"
#include "util/err.h"
#include "util/mapfile.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: tessera template (--template FILE | --model FILE.gguf) --context CONTEXT.json\n"
               "                        [--fixed-date STRING]\n"
               "Renders a chat template (Jinja2 subset, Hugging Face settings) to stdout.\n");
}

/* Reads tokenizer.chat_template from a GGUF file into a malloc'd string. */
static int read_gguf_template(const char *path, char **out, size_t *len, char *err, size_t errlen)
{
    struct mapped_file m;
    int rc = map_open(path, &m, err, errlen);
    if (rc) return rc;
    struct gguf_file *g = NULL;
    rc = gguf_parse(m.data, m.size, path, &g, err, errlen);
    if (!rc) {
        struct gguf_str s;
        rc = gguf_get_str(g, "tokenizer.chat_template", &s, err, errlen);
        if (rc == ERR_NOT_FOUND) err_set(err, errlen, rc, "%s: no tokenizer.chat_template key", path);
        if (!rc) {
            *out = malloc(s.len + 1);
            if (!*out) rc = err_set(err, errlen, ERR_NOMEM, "out of memory");
            else {
                memcpy(*out, s.ptr, s.len);
                (*out)[s.len] = 0;
                *len = s.len;
            }
        }
    }
    gguf_free(g);
    map_close(&m);
    return rc;
}

int cli_template(int argc, char **argv)
{
    const char *tpath = NULL, *mpath = NULL, *cpath = NULL, *fixed = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        const char **dst = !strcmp(a, "--template") ? &tpath : !strcmp(a, "--model") ? &mpath
                         : !strcmp(a, "--context") ? &cpath : !strcmp(a, "--fixed-date") ? &fixed : NULL;
        if (!dst || i + 1 >= argc) {
            fprintf(stderr, dst ? "template: %s needs a value\n" : "template: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        *dst = argv[++i];
    }
    if ((!tpath == !mpath) || !cpath) {
        fprintf(stderr, "template: give exactly one of --template/--model, and --context\n");
        usage(stderr);
        return 2;
    }

    char err[ERR_BUF] = "";
    char *src = NULL, *ctx_text = NULL, *out = NULL;
    size_t src_len = 0, ctx_len = 0, out_len = 0;
    struct jinja_template *t = NULL;
    cJSON *ctx = NULL;
    int status = 1;
    int rc = tpath ? read_text_file(tpath, &src, &src_len, err, sizeof err)
                   : read_gguf_template(mpath, &src, &src_len, err, sizeof err);
    if (rc) goto fail;
    if ((rc = read_text_file(cpath, &ctx_text, &ctx_len, err, sizeof err))) goto fail;
    ctx = cJSON_ParseWithLength(ctx_text, ctx_len);
    if (!ctx || !cJSON_IsObject(ctx)) {
        snprintf(err, sizeof err, "%s: not a JSON object", cpath);
        goto fail;
    }
    if ((rc = jinja_parse(src, src_len, &t, err, sizeof err))) goto fail;
    struct jinja_render_opts opts = { .now = 0, .fixed_strftime = fixed };
    if ((rc = jinja_render(t, ctx, &opts, &out, &out_len, err, sizeof err))) goto fail;
    if (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout)) {
        snprintf(err, sizeof err, "writing stdout failed");
        goto fail;
    }
    status = 0;
    goto done;
fail:
    fprintf(stderr, "%s\n", err);
done:
    free(out);
    jinja_free(t);
    cJSON_Delete(ctx);
    free(ctx_text);
    free(src);
    return status;
}

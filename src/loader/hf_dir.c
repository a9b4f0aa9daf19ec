/* hf_dir.c — Hugging Face model directories (hf_*). See safetensors.h and
 * docs/formats-hf.md.
 *
 * Owns: the parsed config.json (cJSON), one mapping + st_file per distinct weight file,
 * a by-name table of every tensor across the files, and copies of the strings taken
 * from tokenizer_config.json / chat_template.jinja. Nothing here is modified after
 * hf_open returns, so the read-only accessors may be called from any thread; hf_close
 * must not race with them.
 *
 * Invariants after hf_open: every shard file name came from the index and is a plain
 * file name inside the directory, each shard is mapped once, every tensor the index
 * lists is in the shard it names, and tensor names are unique across all shards.
 */
#define _POSIX_C_SOURCE 200809L
#include "loader/safetensors.h"
#include "util/err.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct hf_shard {
    char *file;             /* file name inside the directory (from the index) */
    char *path;             /* dir/file, used in messages */
    struct mapped_file map; /* owns the bytes st points into */
    struct st_file *st;
};

struct hf_entry {
    const struct tensor *t; /* owned by shards[shard].st */
    int shard;
};

struct hf_dir {
    char *path;                   /* the directory as given */
    char *tokenizer_json;         /* path/tokenizer.json (may not exist) */
    cJSON *config;                /* config.json */
    struct hf_shard *shards;      /* [n_shards], sorted by file name */
    int n_shards;
    struct hf_entry *tensors;     /* [n_tensors] across all shards, sorted by name */
    int64_t n_tensors;
    struct hf_tokenizer_config tok; /* strings point at the owned copies below */
    char *chat_template, *bos_token, *eos_token;
    struct hf_generation_config gen;
};

/* "dir/name" in a malloc'd buffer (no doubled '/'), NULL when out of memory. */
static char *hf_join(const char *dir, const char *name)
{
    size_t dl = strlen(dir), nl = strlen(name);
    int slash = dl > 0 && dir[dl - 1] != '/';
    char *p = malloc(dl + (size_t)slash + nl + 1);
    if (!p) return NULL;
    memcpy(p, dir, dl);
    if (slash) p[dl] = '/';
    memcpy(p + dl + (size_t)slash, name, nl + 1);
    return p;
}

static char *hf_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* 1 if path exists (any type: a directory or unreadable file is then reported by the
 * read that follows), 0 if it does not. */
static int hf_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 || errno != ENOENT;
}

/* Reads and parses a JSON file that must hold an object. *out owned by the caller. */
static int hf_read_json(const char *path, cJSON **out, char *err, size_t errlen)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = read_text_file(path, &text, &len, err, errlen);
    if (rc) return rc;
    const char *endp = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &endp, 0);
    if (!j) {
        size_t at = endp && endp >= text && endp <= text + len ? (size_t)(endp - text) : 0;
        free(text);
        return err_set(err, errlen, ERR_FORMAT, "%s: not valid JSON (near byte %zu)", path, at);
    }
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return err_set(err, errlen, ERR_FORMAT, "%s: not a JSON object", path);
    }
    *out = j;
    return 0;
}

/* A shard name from the index must name a file in the directory itself: no path
 * separators, not "." or "..", not empty. Symlinks (the HF cache layout) are fine. */
static int hf_plain_file_name(const char *s)
{
    return s[0] && strcmp(s, ".") != 0 && strcmp(s, "..") != 0 && !strchr(s, '/') && !strchr(s, '\\');
}

static int hf_cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int hf_cmp_entry(const void *a, const void *b)
{
    return strcmp(((const struct hf_entry *)a)->t->name, ((const struct hf_entry *)b)->t->name);
}

static int hf_find_shard(const struct hf_dir *d, const char *file)
{
    int lo = 0, hi = d->n_shards;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(d->shards[mid].file, file);
        if (c == 0) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

/* Sets up d->shards from distinct file names, already sorted (copied). */
static int hf_add_shards(struct hf_dir *d, const char *const *files, int n, char *err, size_t errlen)
{
    d->shards = calloc(n ? (size_t)n : 1, sizeof *d->shards);
    if (!d->shards) return err_set(err, errlen, ERR_NOMEM, "%s: out of memory", d->path);
    for (int i = 0; i < n; i++) {
        struct hf_shard *s = &d->shards[d->n_shards++];
        s->file = hf_strdup(files[i]);
        s->path = hf_join(d->path, files[i]);
        if (!s->file || !s->path) return err_set(err, errlen, ERR_NOMEM, "%s: out of memory", d->path);
    }
    return 0;
}

/* Maps and parses every shard. */
static int hf_open_shards(struct hf_dir *d, const char *index_path, char *err, size_t errlen)
{
    for (int i = 0; i < d->n_shards; i++) {
        struct hf_shard *s = &d->shards[i];
        if (!hf_exists(s->path)) {
            if (index_path)
                return err_set(err, errlen, ERR_NOT_FOUND, "%s: shard '%s' does not exist (%s)",
                               index_path, s->file, s->path);
            return err_set(err, errlen, ERR_NOT_FOUND, "%s: not found", s->path);
        }
        int rc = map_open(s->path, &s->map, err, errlen);
        if (rc) return rc;
        rc = st_parse(s->map.data, s->map.size, s->path, &s->st, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

/* Builds the by-name table over all shards; a name in two shards is an error. */
static int hf_index_tensors(struct hf_dir *d, char *err, size_t errlen)
{
    int64_t n = 0;
    for (int i = 0; i < d->n_shards; i++) n += st_n_tensors(d->shards[i].st);
    d->tensors = calloc(n ? (size_t)n : 1, sizeof *d->tensors);
    if (!d->tensors) return err_set(err, errlen, ERR_NOMEM, "%s: out of memory", d->path);
    for (int i = 0; i < d->n_shards; i++)
        for (int64_t k = 0; k < st_n_tensors(d->shards[i].st); k++)
            d->tensors[d->n_tensors++] = (struct hf_entry){ st_tensor(d->shards[i].st, k), i };
    qsort(d->tensors, (size_t)d->n_tensors, sizeof *d->tensors, hf_cmp_entry);
    for (int64_t i = 1; i < d->n_tensors; i++) {
        const struct hf_entry *a = &d->tensors[i - 1], *b = &d->tensors[i];
        if (strcmp(a->t->name, b->t->name) == 0)
            return err_set(err, errlen, ERR_FORMAT, "%s: tensor '%.128s' is in both %s and %s", d->path,
                           a->t->name, d->shards[a->shard].path, d->shards[b->shard].path);
    }
    return 0;
}

/* model.safetensors.index.json: {"weight_map": {tensor: shard file}}. */
static int hf_load_index(struct hf_dir *d, const char *index_path, char *err, size_t errlen)
{
    cJSON *idx = NULL;
    const char **files = NULL;
    int rc = hf_read_json(index_path, &idx, err, errlen);
    if (rc) return rc;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    if (!cJSON_IsObject(wm)) {
        rc = err_set(err, errlen, ERR_FORMAT, "%s: \"weight_map\" %s", index_path,
                     wm ? "is not an object" : "is missing");
        goto fail;
    }
    int n = cJSON_GetArraySize(wm);
    if (n == 0) {
        rc = err_set(err, errlen, ERR_FORMAT, "%s: \"weight_map\" is empty", index_path);
        goto fail;
    }
    files = calloc((size_t)n, sizeof *files);
    if (!files) { rc = err_set(err, errlen, ERR_NOMEM, "%s: out of memory", index_path); goto fail; }
    int nf = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, wm)
    {
        if (!cJSON_IsString(e) || !e->valuestring) {
            rc = err_set(err, errlen, ERR_FORMAT, "%s: weight_map[\"%.128s\"] is not a string", index_path,
                         e->string ? e->string : "");
            goto fail;
        }
        if (!hf_plain_file_name(e->valuestring)) {
            rc = err_set(err, errlen, ERR_FORMAT,
                         "%s: weight_map[\"%.128s\"] = \"%.128s\" is not a plain file name in the directory",
                         index_path, e->string ? e->string : "", e->valuestring);
            goto fail;
        }
        files[nf++] = e->valuestring;
    }
    /* Distinct shards, sorted, so each is mapped once and found by bsearch. */
    qsort(files, (size_t)nf, sizeof *files, hf_cmp_str);
    int nu = 0;
    for (int i = 0; i < nf; i++)
        if (nu == 0 || strcmp(files[nu - 1], files[i]) != 0) files[nu++] = files[i];
    rc = hf_add_shards(d, files, nu, err, errlen);
    if (rc) goto fail;
    rc = hf_open_shards(d, index_path, err, errlen);
    if (rc) goto fail;
    cJSON_ArrayForEach(e, wm)
    {
        int s = hf_find_shard(d, e->valuestring);
        const char *tname = e->string ? e->string : "";
        if (s < 0 || !st_find_tensor(d->shards[s].st, tname)) {
            rc = err_set(err, errlen, ERR_NOT_FOUND, "%s: tensor '%.128s' is not in shard %s", index_path,
                         tname, s < 0 ? e->valuestring : d->shards[s].path);
            goto fail;
        }
    }
fail:
    free(files);
    cJSON_Delete(idx);
    return rc;
}

/* A token given as "text", {"content": "text", ...} (AddedToken) or null (absent). */
static int hf_token_string(const cJSON *tc, const char *key, const char *path, char **out, char *err,
                           size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(tc, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v) || !v->valuestring)
        return err_set(err, errlen, ERR_FORMAT, "%s: \"%s\" is not a string or {\"content\": string}", path, key);
    *out = hf_strdup(v->valuestring);
    if (!*out) return err_set(err, errlen, ERR_NOMEM, "%s: out of memory", path);
    return 0;
}

/* tokenizer_config.json (optional) and chat_template.jinja (optional). As in
 * transformers, a chat_template.jinja file takes priority over the config's key. */
static int hf_load_tokenizer_config(struct hf_dir *d, char *err, size_t errlen)
{
    d->tok.add_bos_token = -1;
    cJSON *tc = NULL;
    char *path = hf_join(d->path, "tokenizer_config.json");
    char *jpath = hf_join(d->path, "chat_template.jinja");
    int rc = 0;
    if (!path || !jpath) { rc = err_set(err, errlen, ERR_NOMEM, "%s: out of memory", d->path); goto fail; }

    if (hf_exists(path)) {
        rc = hf_read_json(path, &tc, err, errlen);
        if (rc) goto fail;
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(tc, "chat_template");
        if (cJSON_IsString(ct) && ct->valuestring) {
            d->chat_template = hf_strdup(ct->valuestring);
            if (!d->chat_template) { rc = err_set(err, errlen, ERR_NOMEM, "%s: out of memory", path); goto fail; }
        } else if (cJSON_IsArray(ct)) {
            /* [{"name": "default", "template": "..."}, {"name": "tool_use", ...}] */
            const cJSON *e;
            int i = 0;
            cJSON_ArrayForEach(e, ct)
            {
                const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
                const cJSON *tp = cJSON_GetObjectItemCaseSensitive(e, "template");
                if (!cJSON_IsString(nm) || !nm->valuestring || !cJSON_IsString(tp) || !tp->valuestring) {
                    rc = err_set(err, errlen, ERR_FORMAT,
                                 "%s: \"chat_template\"[%d] is not {\"name\": string, \"template\": string}",
                                 path, i);
                    goto fail;
                }
                if (strcmp(nm->valuestring, "default") == 0 && !d->chat_template) {
                    d->chat_template = hf_strdup(tp->valuestring);
                    if (!d->chat_template) { rc = err_set(err, errlen, ERR_NOMEM, "%s: out of memory", path); goto fail; }
                }
                i++;
            }
        } else if (ct && !cJSON_IsNull(ct)) {
            rc = err_set(err, errlen, ERR_FORMAT, "%s: \"chat_template\" is not a string or a list", path);
            goto fail;
        }
        rc = hf_token_string(tc, "bos_token", path, &d->bos_token, err, errlen);
        if (rc) goto fail;
        rc = hf_token_string(tc, "eos_token", path, &d->eos_token, err, errlen);
        if (rc) goto fail;
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(tc, "add_bos_token");
        if (cJSON_IsBool(ab)) d->tok.add_bos_token = cJSON_IsTrue(ab) ? 1 : 0;
        else if (ab && !cJSON_IsNull(ab)) {
            rc = err_set(err, errlen, ERR_FORMAT, "%s: \"add_bos_token\" is not a boolean", path);
            goto fail;
        }
    }
    if (hf_exists(jpath)) {
        char *text = NULL;
        rc = read_text_file(jpath, &text, NULL, err, errlen);
        if (rc) goto fail;
        free(d->chat_template);
        d->chat_template = text;
    }
    d->tok.chat_template = d->chat_template;
    d->tok.bos_token = d->bos_token;
    d->tok.eos_token = d->eos_token;
fail:
    cJSON_Delete(tc);
    free(path);
    free(jpath);
    return rc;
}

/* A token id: an integer in [0, INT_MAX]; -1 when not one. */
static int hf_json_id(const cJSON *v)
{
    if (!cJSON_IsNumber(v)) return -1;
    double x = v->valuedouble;
    if (!isfinite(x) || x < 0 || x > INT_MAX || x != floor(x)) return -1;
    return (int)x;
}

/* A non-negative finite number, or null/absent -> keeps the sentinel in *out. */
static int hf_json_param(const cJSON *g, const char *key, const char *path, double *out, char *err,
                         size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(g, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0)
        return err_set(err, errlen, ERR_FORMAT, "%s: \"%s\" is not a non-negative number", path, key);
    *out = v->valuedouble;
    return 0;
}

/* generation_config.json (optional). */
static int hf_load_generation_config(struct hf_dir *d, char *err, size_t errlen)
{
    struct hf_generation_config *gc = &d->gen;
    gc->n_eos = 0;
    gc->bos_id = -1;
    gc->temperature = gc->top_p = gc->repetition_penalty = -1.0;
    gc->top_k = -1;
    cJSON *g = NULL;
    char *path = hf_join(d->path, "generation_config.json");
    int rc = 0;
    if (!path) return err_set(err, errlen, ERR_NOMEM, "%s: out of memory", d->path);
    if (!hf_exists(path)) goto fail;
    rc = hf_read_json(path, &g, err, errlen);
    if (rc) goto fail;

    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(g, "eos_token_id");
    if (cJSON_IsArray(eos)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, eos)
        {
            int id = hf_json_id(e);
            if (id < 0) {
                rc = err_set(err, errlen, ERR_FORMAT, "%s: \"eos_token_id\"[%d] is not a token id", path, gc->n_eos);
                goto fail;
            }
            if (gc->n_eos == (int)(sizeof gc->eos_ids / sizeof gc->eos_ids[0])) {
                rc = err_set(err, errlen, ERR_RANGE, "%s: \"eos_token_id\" lists more than %d ids", path,
                             gc->n_eos);
                goto fail;
            }
            gc->eos_ids[gc->n_eos++] = id;
        }
    } else if (eos && !cJSON_IsNull(eos)) {
        int id = hf_json_id(eos);
        if (id < 0) {
            rc = err_set(err, errlen, ERR_FORMAT, "%s: \"eos_token_id\" is not a token id or a list of them", path);
            goto fail;
        }
        gc->eos_ids[gc->n_eos++] = id;
    }
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(g, "bos_token_id");
    if (bos && !cJSON_IsNull(bos)) {
        gc->bos_id = hf_json_id(bos);
        if (gc->bos_id < 0) {
            rc = err_set(err, errlen, ERR_FORMAT, "%s: \"bos_token_id\" is not a token id", path);
            goto fail;
        }
    }
    rc = hf_json_param(g, "temperature", path, &gc->temperature, err, errlen);
    if (!rc) rc = hf_json_param(g, "top_p", path, &gc->top_p, err, errlen);
    if (!rc) rc = hf_json_param(g, "repetition_penalty", path, &gc->repetition_penalty, err, errlen);
    if (rc) goto fail;
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(g, "top_k");
    if (tk && !cJSON_IsNull(tk)) {
        gc->top_k = hf_json_id(tk);
        if (gc->top_k < 0) {
            rc = err_set(err, errlen, ERR_FORMAT, "%s: \"top_k\" is not a non-negative integer", path);
            goto fail;
        }
    }
fail:
    cJSON_Delete(g);
    free(path);
    return rc;
}

/* Opens a Hugging Face model directory: config.json (required), the weights
 * (model.safetensors, else the shards of model.safetensors.index.json), and the
 * optional tokenizer_config.json, chat_template.jinja and generation_config.json.
 * Weight files are mapped, not read. On success *out is owned by the caller (hf_close);
 * on failure *out is NULL and err names the file (full path) and key or tensor. */
static int hf_open_impl(const char *dir, bool weights, struct hf_dir **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!dir || !dir[0]) return err_set(err, errlen, ERR_INVALID, "hf_open: empty directory path");
    int rc = 0;
    char *cfg = NULL, *single = NULL, *index = NULL, *pt = NULL;
    struct hf_dir *d = calloc(1, sizeof *d);
    if (!d) return err_set(err, errlen, ERR_NOMEM, "%s: out of memory", dir);
    d->path = hf_strdup(dir);
    if (!d->path) { rc = err_set(err, errlen, ERR_NOMEM, "%s: out of memory", dir); goto fail; }
    d->tokenizer_json = hf_join(dir, "tokenizer.json");
    cfg = hf_join(dir, "config.json");
    single = hf_join(dir, "model.safetensors");
    index = hf_join(dir, "model.safetensors.index.json");
    pt = hf_join(dir, "pytorch_model.bin");
    if (!d->tokenizer_json || !cfg || !single || !index || !pt) {
        rc = err_set(err, errlen, ERR_NOMEM, "%s: out of memory", dir);
        goto fail;
    }

    if (!hf_exists(cfg)) {
        rc = err_set(err, errlen, ERR_NOT_FOUND, "%s: not found (a Hugging Face model directory needs it)", cfg);
        goto fail;
    }
    rc = hf_read_json(cfg, &d->config, err, errlen);
    if (rc) goto fail;

    /* transformers prefers the single file when both layouts are present. */
    if (!weights) {
        rc = 0;
    } else if (hf_exists(single)) {
        const char *name = "model.safetensors";
        rc = hf_add_shards(d, &name, 1, err, errlen);
        if (!rc) rc = hf_open_shards(d, NULL, err, errlen);
    } else if (hf_exists(index)) {
        rc = hf_load_index(d, index, err, errlen);
    } else if (hf_exists(pt)) {
        rc = err_set(err, errlen, ERR_UNSUPPORTED, "%s: PyTorch pickle weights are not supported; "
                     "convert the model to safetensors", pt);
    } else {
        rc = err_set(err, errlen, ERR_NOT_FOUND,
                     "%s: no model.safetensors or model.safetensors.index.json", dir);
    }
    if (rc) goto fail;
    rc = hf_index_tensors(d, err, errlen);
    if (!rc) rc = hf_load_tokenizer_config(d, err, errlen);
    if (!rc) rc = hf_load_generation_config(d, err, errlen);
    if (rc) goto fail;
    *out = d;
    d = NULL;
fail:
    hf_close(d);
    free(cfg);
    free(single);
    free(index);
    free(pt);
    return rc;
}

int hf_open(const char *dir, struct hf_dir **out, char *err, size_t errlen)
{
    return hf_open_impl(dir, true, out, err, errlen);
}

int hf_open_config_only(const char *dir, struct hf_dir **out, char *err, size_t errlen)
{
    return hf_open_impl(dir, false, out, err, errlen);
}

/* Unmaps every shard and frees everything hf_open allocated. NULL is a no-op. */
void hf_close(struct hf_dir *d)
{
    if (!d) return;
    for (int i = 0; i < d->n_shards; i++) {
        st_free(d->shards[i].st);
        map_close(&d->shards[i].map);
        free(d->shards[i].file);
        free(d->shards[i].path);
    }
    free(d->shards);
    free(d->tensors);
    cJSON_Delete(d->config);
    free(d->chat_template);
    free(d->bos_token);
    free(d->eos_token);
    free(d->tokenizer_json);
    free(d->path);
    free(d);
}

const char *hf_path(const struct hf_dir *d) { return d->path; }
const struct cJSON *hf_config(const struct hf_dir *d) { return d->config; }
const char *hf_tokenizer_json_path(const struct hf_dir *d) { return d->tokenizer_json; }
const struct hf_tokenizer_config *hf_tokenizer_config(const struct hf_dir *d) { return &d->tok; }
const struct hf_generation_config *hf_generation_config(const struct hf_dir *d) { return &d->gen; }
int64_t hf_n_tensors(const struct hf_dir *d) { return d->n_tensors; }

/* The i-th tensor in name order across all shards; NULL when out of range. */
const struct tensor *hf_tensor(const struct hf_dir *d, int64_t i)
{
    if (i < 0 || i >= d->n_tensors) return NULL;
    return d->tensors[i].t;
}

int hf_n_maps(const struct hf_dir *d) { return d->n_shards; }

const struct mapped_file *hf_map(const struct hf_dir *d, int i)
{
    if (i < 0 || i >= d->n_shards) return NULL;
    return &d->shards[i].map;
}

/* Binary search over all shards; NULL if absent. The view is owned by d. */
const struct tensor *hf_find_tensor(const struct hf_dir *d, const char *name)
{
    if (!name) return NULL;
    int64_t lo = 0, hi = d->n_tensors;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(d->tensors[mid].t->name, name);
        if (c == 0) return d->tensors[mid].t;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

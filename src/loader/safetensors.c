/* safetensors.c — the safetensors file parser (st_*). See safetensors.h for the format.
 *
 * Owns: a struct st_file holding one struct tensor per header entry (in header order),
 * the tensor names (NUL-terminated copies) and a by-name index sorted with strcmp.
 * Tensor data pointers point into the caller's buffer, which must outlive the st_file.
 *
 * Invariants after a successful st_parse: every tensor has a weight dtype (F32, F16,
 * BF16), 1..4 dims with ne[0] innermost, nbytes == product(ne) * element size, data
 * inside [buf + 8 + N, buf + len), aligned to its element size, no two tensors
 * overlap, and names are unique. The parser never reads outside [buf, buf + len).
 * Hugging Face directories (hf_*) live in hf_dir.c.
 */
#include "loader/safetensors.h"
#include "util/err.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Header JSON may be at most this large (the same limit the reference implementation
 * uses); real models have headers of tens of kilobytes to a few megabytes. */
#define ST_MAX_HEADER (100u * 1000u * 1000u)
/* Largest integer a JSON number (a double in cJSON) holds exactly. */
#define ST_MAX_JSON_INT 9007199254740992.0 /* 2^53 */

struct st_file {
    struct tensor *tensors;  /* [n] in header order */
    char **names;            /* [n] owned copies; tensors[i].name == names[i] */
    int64_t *by_name;        /* [n] indices into tensors, sorted by name */
    int64_t n;
};

struct st_dtype_name {
    const char *name;
    enum dtype type;
    int size;
};

/* Weight dtypes we accept; everything else in the format is ERR_UNSUPPORTED. */
static const struct st_dtype_name st_dtypes[] = {
    { "F32", DT_F32, 4 },
    { "F16", DT_F16, 2 },
    { "BF16", DT_BF16, 2 },
};

/* Other dtypes the safetensors format defines; named so a valid-but-unsupported file
 * gets ERR_UNSUPPORTED rather than ERR_FORMAT. */
static const char *const st_other_dtypes[] = {
    "BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64", "F64",
    "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64",
};

static uint64_t st_read_u64le(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* A JSON number that is an exact non-negative integer <= 2^53, else -1. */
static int64_t st_json_uint(const cJSON *v)
{
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!isfinite(d) || d < 0 || d > ST_MAX_JSON_INT || d != floor(d)) return -1;
    return (int64_t)d;
}

static int st_cmp_name_idx(const void *a, const void *b, const struct tensor *t)
{
    return strcmp(t[*(const int64_t *)a].name, t[*(const int64_t *)b].name);
}

/* Sorts idx[0..n) by tensors[idx].name (insertion-free merge sort so that no global
 * context is needed for the comparator). tmp has room for n entries. */
static void st_sort_by_name(int64_t *idx, int64_t *tmp, int64_t n, const struct tensor *t)
{
    if (n < 2) return;
    int64_t h = n / 2;
    st_sort_by_name(idx, tmp, h, t);
    st_sort_by_name(idx + h, tmp, n - h, t);
    int64_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = st_cmp_name_idx(&idx[j], &idx[i], t) < 0 ? idx[j++] : idx[i++];
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, (size_t)n * sizeof *idx);
}

/* Same merge sort keyed by data offset (begin, then end), for the overlap check. */
static void st_sort_by_offset(int64_t *idx, int64_t *tmp, int64_t n, const uint64_t *begin)
{
    if (n < 2) return;
    int64_t h = n / 2;
    st_sort_by_offset(idx, tmp, h, begin);
    st_sort_by_offset(idx + h, tmp, n - h, begin);
    int64_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = begin[idx[j]] < begin[idx[i]] ? idx[j++] : idx[i++];
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, (size_t)n * sizeof *idx);
}

void st_free(struct st_file *f)
{
    if (!f) return;
    if (f->names)
        for (int64_t i = 0; i < f->n; i++) free(f->names[i]);
    free(f->names);
    free(f->tensors);
    free(f->by_name);
    free(f);
}

/* Validates one header entry and fills *t (name set by the caller). begin/end receive
 * the absolute byte range inside buf. */
static int st_parse_entry(const cJSON *e, const char *file, const char *tname,
                          const uint8_t *buf, size_t data_start, size_t data_len,
                          struct tensor *t, uint64_t *begin_out, uint64_t *end_out,
                          char *err, size_t errlen)
{
    if (!cJSON_IsObject(e))
        return err_set(err, errlen, ERR_FORMAT, "%s: tensor '%.128s': entry is not a JSON object", file, tname);

    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!jd) return err_set(err, errlen, ERR_FORMAT, "%s: tensor '%.128s': missing \"dtype\"", file, tname);
    if (!js) return err_set(err, errlen, ERR_FORMAT, "%s: tensor '%.128s': missing \"shape\"", file, tname);
    if (!jo) return err_set(err, errlen, ERR_FORMAT, "%s: tensor '%.128s': missing \"data_offsets\"", file, tname);

    if (!cJSON_IsString(jd) || !jd->valuestring)
        return err_set(err, errlen, ERR_FORMAT, "%s: tensor '%.128s': \"dtype\" is not a string", file, tname);
    int esize = 0;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (strcmp(jd->valuestring, st_dtypes[i].name) == 0) {
            t->type = st_dtypes[i].type;
            esize = st_dtypes[i].size;
        }
    }
    if (!esize) {
        for (size_t i = 0; i < sizeof st_other_dtypes / sizeof st_other_dtypes[0]; i++)
            if (strcmp(jd->valuestring, st_other_dtypes[i]) == 0)
                return err_set(err, errlen, ERR_UNSUPPORTED,
                               "%s: tensor '%.128s': dtype %s is not supported (F32, F16, BF16 only)",
                               file, tname, jd->valuestring);
        return err_set(err, errlen, ERR_FORMAT, "%s: tensor '%.128s': unknown dtype \"%.32s\"", file,
                       tname, jd->valuestring);
    }

    if (!cJSON_IsArray(js))
        return err_set(err, errlen, ERR_FORMAT, "%s: tensor '%.128s': \"shape\" is not an array", file, tname);
    int nd = cJSON_GetArraySize(js);
    if (nd > TENSOR_MAX_DIMS)
        return err_set(err, errlen, ERR_UNSUPPORTED, "%s: tensor '%.128s': %d dimensions (at most %d)",
                       file, tname, nd, TENSOR_MAX_DIMS);
    int64_t dims[TENSOR_MAX_DIMS];
    int k = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, js)
    {
        int64_t v = st_json_uint(d);
        if (v < 0)
            return err_set(err, errlen, ERR_FORMAT,
                           "%s: tensor '%.128s': shape[%d] is not a non-negative integer <= 2^53",
                           file, tname, k);
        dims[k++] = v;
    }
    /* Element count with overflow checks; a dimension of 0 makes an empty tensor. */
    uint64_t nel = 1;
    int overflow = 0;
    for (int i = 0; i < nd; i++) {
        uint64_t v = (uint64_t)dims[i];
        if (v != 0 && nel > UINT64_MAX / v) overflow = 1;
        else nel *= v;
    }
    for (int i = 0; i < nd; i++)
        if (dims[i] == 0) { nel = 0; overflow = 0; }
    if (overflow || nel > UINT64_MAX / (uint64_t)esize)
        return err_set(err, errlen, ERR_FORMAT, "%s: tensor '%.128s': shape product overflows", file, tname);
    uint64_t want = nel * (uint64_t)esize;

    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2)
        return err_set(err, errlen, ERR_FORMAT,
                       "%s: tensor '%.128s': \"data_offsets\" is not an array [begin, end]", file, tname);
    int64_t b = st_json_uint(jo->child), en = st_json_uint(jo->child->next);
    if (b < 0 || en < 0)
        return err_set(err, errlen, ERR_FORMAT,
                       "%s: tensor '%.128s': data_offsets are not non-negative integers <= 2^53", file, tname);
    if (b > en)
        return err_set(err, errlen, ERR_FORMAT, "%s: tensor '%.128s': data_offsets begin %lld > end %lld",
                       file, tname, (long long)b, (long long)en);
    if ((uint64_t)en > data_len)
        return err_set(err, errlen, ERR_FORMAT,
                       "%s: tensor '%.128s': data_offsets end %lld is past the data section (%zu bytes)",
                       file, tname, (long long)en, data_len);
    if ((uint64_t)(en - b) != want)
        return err_set(err, errlen, ERR_FORMAT,
                       "%s: tensor '%.128s': data_offsets span %lld bytes but shape x %s needs %llu",
                       file, tname, (long long)(en - b), jd->valuestring, (unsigned long long)want);

    const uint8_t *p = buf + data_start + (size_t)b;
    /* The safetensors library pads the header to 8 bytes and orders tensors by
     * alignment, so real files are aligned; callers read data as float/uint16_t. */
    if (want && (uintptr_t)p % (uintptr_t)esize)
        return err_set(err, errlen, ERR_UNSUPPORTED,
                       "%s: tensor '%.128s': data at offset %zu is not aligned to its %d-byte elements",
                       file, tname, data_start + (size_t)b, esize);

    t->n_dims = nd ? nd : 1;
    for (int i = 0; i < TENSOR_MAX_DIMS; i++) t->ne[i] = 1;
    for (int i = 0; i < nd; i++) t->ne[i] = dims[nd - 1 - i];
    t->data = p;
    t->nbytes = (size_t)want;
    *begin_out = (uint64_t)b;
    *end_out = (uint64_t)en;
    return 0;
}

/* Parses a safetensors image buf[0..len) named `name` (the file path, used in every
 * message). On success *out owns the tensor table and name copies; tensor data points
 * into buf, which the caller keeps alive until st_free(*out). On failure *out is NULL
 * and err says why: ERR_FORMAT for a malformed or truncated file, ERR_UNSUPPORTED for a
 * valid file with a dtype other than F32/F16/BF16, more than 4 dims or unaligned data,
 * ERR_NOMEM. Thread-safe: touches nothing but its arguments. */
int st_parse(const uint8_t *buf, size_t len, const char *name, struct st_file **out,
             char *err, size_t errlen)
{
    *out = NULL;
    if (!name) name = "(buffer)";
    if (!buf || len < 8)
        return err_set(err, errlen, ERR_FORMAT, "%s: %zu bytes, too short for a safetensors header",
                       name, buf ? len : 0);
    uint64_t hlen = st_read_u64le(buf);
    if (hlen < 2 || hlen > ST_MAX_HEADER)
        return err_set(err, errlen, ERR_FORMAT,
                       "%s: header length %llu out of range (2..%u bytes; not a safetensors file?)",
                       name, (unsigned long long)hlen, ST_MAX_HEADER);
    if (hlen > len - 8)
        return err_set(err, errlen, ERR_FORMAT,
                       "%s: header length %llu runs past the end of the file (%zu bytes)", name,
                       (unsigned long long)hlen, len);
    size_t data_start = 8 + (size_t)hlen, data_len = len - data_start;

    int rc = 0;
    struct st_file *f = NULL;
    uint64_t *begin = NULL, *end = NULL;
    int64_t *tmp = NULL, *by_off = NULL;
    cJSON *root = NULL;
    /* A NUL-terminated copy: cJSON then cannot read past the header whatever it does. */
    char *text = malloc((size_t)hlen + 1);
    if (!text) { rc = err_set(err, errlen, ERR_NOMEM, "%s: out of memory for the header", name); goto fail; }
    memcpy(text, buf + 8, (size_t)hlen);
    text[hlen] = 0;
    if (text[0] != '{') {
        rc = err_set(err, errlen, ERR_FORMAT, "%s: header does not start with '{' (not a safetensors file?)", name);
        goto fail;
    }
    const char *endp = NULL;
    root = cJSON_ParseWithLengthOpts(text, (size_t)hlen, &endp, 0);
    if (!root) {
        /* cJSON reports the error position through endp (its global error pointer is
         * not thread-safe, so it is not read here). */
        size_t at = endp && endp >= text && endp <= text + hlen ? (size_t)(endp - text) : 0;
        rc = err_set(err, errlen, ERR_FORMAT, "%s: header is not valid JSON (near byte %zu of %llu)", name,
                     at, (unsigned long long)hlen);
        goto fail;
    }
    /* The format allows trailing spaces as padding; anything else is a lie about N. */
    for (const char *q = endp; q && q < text + hlen; q++) {
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
            rc = err_set(err, errlen, ERR_FORMAT, "%s: trailing bytes after the header JSON (byte %zu)",
                         name, (size_t)(q - text));
            goto fail;
        }
    }
    if (!cJSON_IsObject(root)) {
        rc = err_set(err, errlen, ERR_FORMAT, "%s: header is not a JSON object", name);
        goto fail;
    }

    int64_t cap = cJSON_GetArraySize(root);
    f = calloc(1, sizeof *f);
    if (!f) { rc = err_set(err, errlen, ERR_NOMEM, "%s: out of memory", name); goto fail; }
    size_t ncap = cap ? (size_t)cap : 1;
    f->tensors = calloc(ncap, sizeof *f->tensors);
    f->names = calloc(ncap, sizeof *f->names);
    f->by_name = calloc(ncap, sizeof *f->by_name);
    begin = calloc(ncap, sizeof *begin);
    end = calloc(ncap, sizeof *end);
    tmp = calloc(ncap, sizeof *tmp);
    by_off = calloc(ncap, sizeof *by_off);
    if (!f->tensors || !f->names || !f->by_name || !begin || !end || !tmp || !by_off) {
        rc = err_set(err, errlen, ERR_NOMEM, "%s: out of memory for %lld tensors", name, (long long)cap);
        goto fail;
    }

    const cJSON *e;
    cJSON_ArrayForEach(e, root)
    {
        const char *key = e->string ? e->string : "";
        if (strcmp(key, "__metadata__") == 0) {
            if (!cJSON_IsObject(e)) {
                rc = err_set(err, errlen, ERR_FORMAT, "%s: \"__metadata__\" is not an object", name);
                goto fail;
            }
            continue;
        }
        int64_t i = f->n;
        size_t kl = strlen(key);
        f->names[i] = malloc(kl + 1);
        if (!f->names[i]) { rc = err_set(err, errlen, ERR_NOMEM, "%s: out of memory", name); goto fail; }
        memcpy(f->names[i], key, kl + 1);
        f->n++;
        f->tensors[i].name = f->names[i];
        rc = st_parse_entry(e, name, key, buf, data_start, data_len, &f->tensors[i], &begin[i], &end[i],
                            err, errlen);
        if (rc) goto fail;
    }

    /* Unique names (cJSON keeps duplicate keys; a \u0000 in a key also truncates it). */
    for (int64_t i = 0; i < f->n; i++) f->by_name[i] = i;
    st_sort_by_name(f->by_name, tmp, f->n, f->tensors);
    for (int64_t i = 1; i < f->n; i++) {
        const char *a = f->tensors[f->by_name[i - 1]].name, *b = f->tensors[f->by_name[i]].name;
        if (strcmp(a, b) == 0) {
            rc = err_set(err, errlen, ERR_FORMAT, "%s: tensor '%.128s' appears twice in the header", name, a);
            goto fail;
        }
    }

    /* No overlap: sorted by begin, each non-empty tensor starts at or after the furthest
     * end seen so far. Empty tensors own no bytes and cannot overlap anything. */
    int64_t m = 0;
    for (int64_t i = 0; i < f->n; i++)
        if (end[i] > begin[i]) by_off[m++] = i;
    st_sort_by_offset(by_off, tmp, m, begin);
    for (int64_t i = 1; i < m; i++) {
        int64_t a = by_off[i - 1], b = by_off[i];
        if (begin[b] < end[a]) {
            rc = err_set(err, errlen, ERR_FORMAT,
                         "%s: tensors '%.128s' [%llu, %llu) and '%.128s' [%llu, %llu) overlap", name,
                         f->tensors[a].name, (unsigned long long)begin[a], (unsigned long long)end[a],
                         f->tensors[b].name, (unsigned long long)begin[b], (unsigned long long)end[b]);
            goto fail;
        }
    }

    *out = f;
    f = NULL;
fail:
    st_free(f);
    cJSON_Delete(root);
    free(text);
    free(begin);
    free(end);
    free(tmp);
    free(by_off);
    return rc;
}

/* Number of tensors (excluding __metadata__). */
int64_t st_n_tensors(const struct st_file *f) { return f ? f->n : 0; }

/* The i-th tensor in header order, or NULL when i is out of range. Owned by f. */
const struct tensor *st_tensor(const struct st_file *f, int64_t i)
{
    if (!f || i < 0 || i >= f->n) return NULL;
    return &f->tensors[i];
}

/* Binary search over the by-name index; NULL if absent. Owned by f. */
const struct tensor *st_find_tensor(const struct st_file *f, const char *name)
{
    if (!f || !name) return NULL;
    int64_t lo = 0, hi = f->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const struct tensor *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(t->name, name);
        if (c == 0) return t;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* safetensors.h — safetensors file parser and Hugging Face model directories.
 *
 * st_parse works on a memory buffer (mmap or fuzzer input): an 8-byte little-endian
 * header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {}},
 * then the data. Every entry is validated: known dtype (F32, F16, BF16 accepted as
 * weights; others ERR_UNSUPPORTED naming the tensor), shape product times element size
 * equals the offset span, offsets inside the data section, no overlapping tensors,
 * header length inside the file, no integer overflow. Errors name the file and tensor.
 * Shapes are reversed into util/tensor.h order (ne[0] innermost): HF [out, in] becomes
 * ne = {in, out}; a 0-dim scalar becomes n_dims 1, ne[0] = 1. Tensor data must be
 * aligned to its element size (files written by the safetensors library always are);
 * an unaligned tensor is ERR_UNSUPPORTED, so callers may read data as float/uint16_t.
 * Unused bytes in the data section (gaps, trailing bytes) are tolerated.
 * The hf_* half (hf_dir.c) is summarised in docs/formats-hf.md.
 */
#ifndef TESSERA_LOADER_SAFETENSORS_H
#define TESSERA_LOADER_SAFETENSORS_H

#include "util/mapfile.h"
#include "util/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct st_file; /* one parsed .safetensors buffer; tensor views point into the buffer */

/* Parses buf[0..len); `name` (the file path) prefixes every error message. On success
 * *out owns the tensor table and NUL-terminated name copies; tensor data points into
 * buf, which the caller keeps alive (mapped) until st_free. On failure *out is NULL.
 * Never reads outside buf. Any thread; read-only accessors below may run concurrently. */
int st_parse(const uint8_t *buf, size_t len, const char *name, struct st_file **out,
             char *err, size_t errlen);
void st_free(struct st_file *f);                   /* NULL is a no-op; buf is not touched */
int64_t st_n_tensors(const struct st_file *f);     /* excludes __metadata__ */
/* i-th tensor in header order; NULL when out of range. Views are owned by f. */
const struct tensor *st_tensor(const struct st_file *f, int64_t i);
/* By exact name (binary search); NULL if absent. */
const struct tensor *st_find_tensor(const struct st_file *f, const char *name);

/* A Hugging Face model directory: config.json, model.safetensors or the shards listed
 * in model.safetensors.index.json (each shard mapped once; every indexed tensor must be
 * in the shard the index names), tokenizer.json, tokenizer_config.json,
 * generation_config.json (optional). model.safetensors wins when both weight layouts
 * exist (as in transformers); shard names must be plain file names in the directory.
 * Tensor names must be unique across shards.
 *
 * hf_open returns 0 and *out (caller owns; hf_close frees it and unmaps the weights), or
 * a negative ERR_* with *out NULL and err naming the file's full path and the key or
 * tensor. Nothing changes after hf_open, so the accessors may be called from any thread
 * while no one calls hf_close. Every pointer they return is owned by d. */
struct hf_dir;
struct cJSON;

int hf_open(const char *dir, struct hf_dir **out, char *err, size_t errlen);
/* hf_open without the weights (--load-format dummy): config.json, tokenizer_config.json
 * and generation_config.json only; hf_find_tensor finds nothing. */
int hf_open_config_only(const char *dir, struct hf_dir **out, char *err, size_t errlen);
void hf_close(struct hf_dir *d);
const char *hf_path(const struct hf_dir *d); /* the directory */

/* Parsed config.json (owned by d). */
const struct cJSON *hf_config(const struct hf_dir *d);
/* Tensor lookup across all shards; NULL if absent. */
const struct tensor *hf_find_tensor(const struct hf_dir *d, const char *name);
int64_t hf_n_tensors(const struct hf_dir *d);
/* i-th tensor across all shards in name (strcmp) order; NULL when out of range. */
const struct tensor *hf_tensor(const struct hf_dir *d, int64_t i);
/* The weight files' read-only mappings, one per shard (none after hf_open_config_only);
 * every tensor view points into one of them. NULL when i is out of range. */
int hf_n_maps(const struct hf_dir *d);
const struct mapped_file *hf_map(const struct hf_dir *d, int i);

/* tokenizer.json path inside the directory (may not exist: the caller's load reports). */
const char *hf_tokenizer_json_path(const struct hf_dir *d);

/* What tokenizer_config.json and generation_config.json contribute. Strings are owned
 * by d; NULL when absent. bos/eos tokens may be given as strings or {"content": ...}.
 * A chat_template.jinja file in the directory takes priority over tokenizer_config's
 * chat_template (as in transformers). JSON null counts as absent. */
struct hf_tokenizer_config {
    const char *chat_template; /* chat_template.jinja, else the string or the "default"
                                  entry of a list; NULL if a list has no "default" */
    const char *bos_token;
    const char *eos_token;
    int add_bos_token;         /* -1 absent, 0/1 */
};
struct hf_generation_config {
    int eos_ids[8];            /* eos_token_id (int or list; more than 8 is ERR_RANGE) */
    int n_eos;                 /* 0 when absent */
    int bos_id;                /* -1 absent */
    double temperature, top_p; /* < 0 when absent */
    int top_k;                 /* -1 absent */
    double repetition_penalty; /* < 0 absent */
};
const struct hf_tokenizer_config *hf_tokenizer_config(const struct hf_dir *d);
const struct hf_generation_config *hf_generation_config(const struct hf_dir *d);

#endif

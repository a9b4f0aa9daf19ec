/* gguf.h — GGUF v2/v3 parser (metadata key/values and tensor infos).
 *
 * gguf_parse works on a memory buffer (an mmap of the file, or fuzzer input) and never
 * reads outside [buf, buf+len). Every offset, count and size is validated: strings and
 * arrays must fit in the buffer, tensor data must lie inside the data section, tensors
 * must not overlap, dimensions must be positive with no overflow in element or byte
 * counts, and tensor types must be supported storage types (util/tensor.h). Any
 * violation returns ERR_FORMAT (or ERR_UNSUPPORTED for an unknown tensor type) with a
 * message naming `name` (the file) and the offending key or tensor.
 *
 * The returned struct gguf_file references `buf` (strings and tensor data point into
 * it); the caller keeps the buffer alive until gguf_free. Not thread-safe to free while
 * in use; read-only accessors may be called from any thread.
 */
#ifndef TESSERA_LOADER_GGUF_H
#define TESSERA_LOADER_GGUF_H

#include "util/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum gguf_vtype {
    GGUF_UINT8 = 0, GGUF_INT8 = 1, GGUF_UINT16 = 2, GGUF_INT16 = 3, GGUF_UINT32 = 4,
    GGUF_INT32 = 5, GGUF_FLOAT32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9,
    GGUF_UINT64 = 10, GGUF_INT64 = 11, GGUF_FLOAT64 = 12,
};

struct gguf_file;

/* A string inside the buffer: NOT NUL-terminated. */
struct gguf_str {
    const char *ptr;
    uint64_t len;
};

int gguf_parse(const uint8_t *buf, size_t len, const char *name, struct gguf_file **out,
               char *err, size_t errlen);
void gguf_free(struct gguf_file *g);

uint32_t gguf_version(const struct gguf_file *g);
int64_t gguf_n_kv(const struct gguf_file *g);
/* Index of key, or -1. */
int64_t gguf_find_key(const struct gguf_file *g, const char *key);
struct gguf_str gguf_key_name(const struct gguf_file *g, int64_t i);
enum gguf_vtype gguf_kv_type(const struct gguf_file *g, int64_t i);

/* Typed getters by key. Each returns 0, ERR_NOT_FOUND if the key is absent, or
 * ERR_FORMAT (message in err) if the value has an incompatible type or is out of range.
 * gguf_get_int accepts any integer type (and bool) that fits int64; gguf_get_float any
 * float or integer type. */
int gguf_get_int(const struct gguf_file *g, const char *key, int64_t *out, char *err, size_t errlen);
int gguf_get_float(const struct gguf_file *g, const char *key, double *out, char *err, size_t errlen);
int gguf_get_bool(const struct gguf_file *g, const char *key, bool *out, char *err, size_t errlen);
int gguf_get_str(const struct gguf_file *g, const char *key, struct gguf_str *out, char *err, size_t errlen);

/* Arrays: element type and count; elements of fixed-size types are read with
 * gguf_arr_int / gguf_arr_float (converted), strings with gguf_arr_str. Index must be
 * < count (checked by the caller; asserted). */
int gguf_get_arr(const struct gguf_file *g, const char *key, enum gguf_vtype *elem_type,
                 uint64_t *count, char *err, size_t errlen);
int64_t gguf_arr_int(const struct gguf_file *g, const char *key, uint64_t i);
double gguf_arr_float(const struct gguf_file *g, const char *key, uint64_t i);
struct gguf_str gguf_arr_str(const struct gguf_file *g, const char *key, uint64_t i);

/* Tensors (views into buf). */
int64_t gguf_n_tensors(const struct gguf_file *g);
const struct tensor *gguf_tensor(const struct gguf_file *g, int64_t i);
const struct tensor *gguf_find_tensor(const struct gguf_file *g, const char *name);

#endif

/* gguf.h — GGUF v2/v3 parser (metadata key/values and tensor infos).
 *
 * gguf_parse works on a memory buffer (an mmap of the file, or fuzzer input) and never
 * reads outside [buf, buf+len). Every offset, count and size is validated: strings and
 * arrays must fit in the buffer, tensor data must lie inside the data section, tensors
 * must not overlap, dimensions must be positive with no overflow in element or byte
 * counts, and tensor types must be supported storage types (util/tensor.h). Any
 * violation returns ERR_FORMAT (ERR_UNSUPPORTED for a tensor type we do not implement
 * or a GGUF version other than 2 and 3) with a message naming `name` (the file) and
 * the offending key or tensor. Nested arrays (arrays of arrays, up to 8 levels) are
 * validated and skipped; gguf_get_arr reports them as element type GGUF_ARRAY and the
 * element accessors return nothing for them. See docs/formats-gguf.md.
 *
 * The returned struct gguf_file references `buf` (strings and tensor data point into
 * it); the caller keeps the buffer alive until gguf_free. It owns copies of the tensor
 * names (struct tensor.name is NUL-terminated) and of `name`. Not thread-safe to free
 * while in use; read-only accessors may be called from any thread. Lookups by key or
 * tensor name are hash-table O(1).
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

/* Parses buf[0..len) (buf may be NULL when len is 0). On success sets *out (free with
 * gguf_free) and returns 0; on failure sets *out = NULL, returns ERR_FORMAT,
 * ERR_UNSUPPORTED or ERR_NOMEM and writes "<name>: <what is wrong>" to err. */
int gguf_parse(const uint8_t *buf, size_t len, const char *name, struct gguf_file **out,
               char *err, size_t errlen);
/* Frees g (NULL is fine). Tensor views and strings obtained from g become invalid. */
void gguf_free(struct gguf_file *g);

uint32_t gguf_version(const struct gguf_file *g);
int64_t gguf_n_kv(const struct gguf_file *g);
/* Index of key (0..gguf_n_kv-1, in file order), or -1. */
int64_t gguf_find_key(const struct gguf_file *g, const char *key);
/* Key and value type of kv i (0 <= i < gguf_n_kv; asserted). */
struct gguf_str gguf_key_name(const struct gguf_file *g, int64_t i);
enum gguf_vtype gguf_kv_type(const struct gguf_file *g, int64_t i);

/* Typed getters by key. Each returns 0, ERR_NOT_FOUND if the key is absent, or
 * ERR_FORMAT (message in err) if the value has an incompatible type or is out of range.
 * gguf_get_int accepts any integer type (and bool) that fits int64 (a uint64 above
 * INT64_MAX is ERR_FORMAT); gguf_get_float any float or integer type (not bool);
 * gguf_get_bool only bool; gguf_get_str only string (the result points into buf). */
int gguf_get_int(const struct gguf_file *g, const char *key, int64_t *out, char *err, size_t errlen);
int gguf_get_float(const struct gguf_file *g, const char *key, double *out, char *err, size_t errlen);
int gguf_get_bool(const struct gguf_file *g, const char *key, bool *out, char *err, size_t errlen);
int gguf_get_str(const struct gguf_file *g, const char *key, struct gguf_str *out, char *err, size_t errlen);

/* Arrays: element type and count; elements of fixed-size types are read with
 * gguf_arr_int / gguf_arr_float (converted), strings with gguf_arr_str (O(1): string
 * elements are indexed at parse time). Index must be < count (checked by the caller;
 * asserted). gguf_arr_int saturates (uint64 above INT64_MAX, out-of-range floats) and
 * truncates floats toward zero (NaN gives 0). An accessor used on a key that is absent,
 * not an array, or of the wrong element kind returns 0 / 0.0 / an empty string. */
int gguf_get_arr(const struct gguf_file *g, const char *key, enum gguf_vtype *elem_type,
                 uint64_t *count, char *err, size_t errlen);
int64_t gguf_arr_int(const struct gguf_file *g, const char *key, uint64_t i);
double gguf_arr_float(const struct gguf_file *g, const char *key, uint64_t i);
struct gguf_str gguf_arr_str(const struct gguf_file *g, const char *key, uint64_t i);

/* Tensors (views into buf, valid until gguf_free), in file order; gguf_tensor asserts
 * 0 <= i < gguf_n_tensors; gguf_find_tensor returns NULL when name is absent. */
int64_t gguf_n_tensors(const struct gguf_file *g);
const struct tensor *gguf_tensor(const struct gguf_file *g, int64_t i);
const struct tensor *gguf_find_tensor(const struct gguf_file *g, const char *name);

#endif

/* tensor.h — element types and the read-only tensor view shared by loaders, model and
 * backends.
 *
 * Type numbers are GGUF's (ggml_type), so a GGUF tensor's type field maps directly.
 * Quantized types store rows as consecutive blocks of dtype_block_elems() elements;
 * a row's length must be a multiple of the block size.
 *
 * Dimensions follow GGUF order: ne[0] is the innermost (contiguous) dimension. A weight
 * matrix W used as y = W x with x of length n_in and y of length n_out has
 * ne[0] = n_in, ne[1] = n_out (rows of n_in elements). Safetensors shapes are listed
 * outermost first and are reversed into this order by their loader.
 */
#ifndef TESSERA_UTIL_TENSOR_H
#define TESSERA_UTIL_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum dtype {
    DT_F32 = 0,
    DT_F16 = 1,
    DT_Q4_0 = 2,
    DT_Q4_1 = 3,
    DT_Q5_0 = 6,
    DT_Q5_1 = 7,
    DT_Q8_0 = 8,
    DT_Q8_1 = 9,   /* only as an activation format inside matmuls */
    DT_Q4_K = 12,
    DT_Q6_K = 14,
    DT_Q8_K = 15,  /* only as an activation format inside matmuls */
    DT_BF16 = 30,
    DT_COUNT_ = 40 /* upper bound on type numbers, for tables */
};

#define TENSOR_MAX_DIMS 4

/* A read-only view of tensor data owned by someone else (usually an mmap). */
struct tensor {
    const char *name;            /* owned by the loader that produced the view */
    enum dtype type;
    int n_dims;                  /* 1..TENSOR_MAX_DIMS */
    int64_t ne[TENSOR_MAX_DIMS]; /* elements per dimension, ne[0] innermost; unused dims = 1 */
    const void *data;            /* nbytes bytes */
    size_t nbytes;
    /* The same matrix repacked for the CPU's packed-weight kernels (backend/cpu/quant.h,
     * cpu_weight_pack), owned by whoever packed it; NULL: not packed (the usual case for
     * a loader's view). */
    const void *cpu_packed;
};

/* Traits of a storage type. Returns 0 for block_elems if the type is unknown or not a
 * storage type we accept in model files. */
int dtype_block_elems(enum dtype t);  /* elements per block (1 for F32/F16/BF16) */
int dtype_block_bytes(enum dtype t);  /* bytes per block */
const char *dtype_name(enum dtype t); /* "Q4_1", ...; "type#N" for unknown (static buffer-free: returns "unknown") */
/* True for the types a model file may use for weights (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q6_K). */
int dtype_is_supported(int t);

/* Bytes for n elements of type t, or 0 if n is not a multiple of the block size, the type
 * is unknown, or the product overflows. */
size_t dtype_row_bytes(enum dtype t, int64_t n);

/* Total element count of a view (product of ne), -1 on overflow. */
int64_t tensor_nelements(const struct tensor *t);

#ifdef __cplusplus
}
#endif

#endif

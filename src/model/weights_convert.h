/* weights_convert.h — a model's F32 / F16 / BF16 matrices converted once, at load time,
 * before any backend sees them:
 *   --quantization q8_0   to GGUF's Q8_0 blocks, so that both backends serve a Hugging Face
 *                         checkpoint (or an F16 GGUF, or --load-format dummy) with the
 *                         quantized kernels they already run for llama.cpp's Q8_0 files;
 *   --dtype float16 / bfloat16   to that 16-bit type (vLLM's --dtype for the weights).
 *
 * Why Q8_0: a decode step reads every weight once, so its time is the weights' bytes over
 * the memory bandwidth; Q8_0 is 34 bytes per 32 weights (8.5 bits), 53% of BF16's bytes.
 *
 * Q8_0 (one block = 32 weights): d = max |x| / 127 in float, stored as fp16; codes
 * q = roundf(x / d) as int8 (x * (1 / d), rounded half away from zero; all zero when
 * d = 0). Bit for bit llama.cpp's reference quantizer (quantize_row_q8_0_ref) and the
 * `gguf` Python package's, so a checkpoint quantized here holds the bytes of the same
 * checkpoint converted to a Q8_0 GGUF (tests/python/test_quantization.py compares).
 * F16 / BF16: round to nearest even (util/half.h), as torch's .to() does.
 *
 * Every matrix is converted: the layers' seven, the output head and the token embedding
 * (a tied head stays one view, as in a GGUF file). Matrices already quantized, or already
 * of the target type, are kept as they are. Norms and biases are F32 arrays of the model
 * and stay so. Once a matrix is converted, its pages in the loader's file mappings are
 * handed back to the kernel (map_release), as packing does.
 */
#ifndef TESSERA_MODEL_WEIGHTS_CONVERT_H
#define TESSERA_MODEL_WEIGHTS_CONVERT_H

#include "model/weights.h"

#include <stddef.h>
#include <stdint.h>

struct converted_weights {
    enum dtype to;         /* DT_Q8_0, DT_F16 or DT_BF16 */
    struct tensor *views;  /* owned [n_converted]: the converted matrices' views */
    char *names;           /* owned: their names, copied (the views they replace may go) */
    void *data;            /* owned: every converted matrix, each 64-byte aligned */
    size_t bytes;          /* of data */
    int n_converted;       /* matrices converted */
    int n_kept;            /* matrices already quantized or of type `to`, left as they were */
    size_t bytes_before;   /* the converted matrices' bytes as loaded */
    size_t released;       /* bytes of file pages handed back */
    double seconds;        /* wall time of weights_convert */
};

/* Converts every F32 / F16 / BF16 matrix of w that is not already of type `to` (DT_Q8_0,
 * DT_F16 or DT_BF16) and points w's slots at the new views (w->matrix_bytes becomes the
 * new total). w's other fields and views are untouched. The work is split over all CPUs.
 * Errors (w unchanged): ERR_INVALID naming the option, tensor and row for a value that is
 * not finite (or, to F16, beyond its range) and for a Q8_0 row length that is not a
 * multiple of 32; ERR_NOMEM naming the size. Called once, by model_load, before any backend
 * sees the weights; *out must outlive every use of w. */
int weights_convert(struct converted_weights **out, struct model_weights *w, enum dtype to, char *err,
                    size_t errlen);
void converted_weights_free(struct converted_weights *c);

/* Frees the converted bytes (data) but keeps the views, whose data becomes NULL, so that a
 * reader that should not be there faults at once instead of reading stale bytes. For a
 * backend that has copied every matrix to its own memory (the CUDA backend, after
 * create): the host copy is then dead weight (a 70B model's Q8_0 is 75 GB). Returns the
 * bytes freed. Called once, by the thread that owns the model, when nothing else reads
 * its matrices. */
size_t converted_weights_release(struct converted_weights *c);

/* For a model served by the CPU backend: its forward state has packed every matrix that
 * has a packed layout (model/weights_pack.h) and reads only the packed copy, so the
 * converted bytes of those matrices are dead weight (a second copy of the model). Hands
 * their whole pages back to the kernel and makes them inaccessible (big_release: a
 * stray read faults), except keep (the token embedding, whose rows the lookup reads; a
 * tied output head is the same view). Returns the bytes handed back. Call only when no
 * other reader of the matrices will come (no second backend or forward state on this
 * model); the views keep their data pointers. */
size_t converted_weights_release_packed(struct converted_weights *c, const struct tensor *keep);

/* One row: n F32 values (n a multiple of 32) into n / 32 Q8_0 blocks at out (34 bytes
 * each: fp16 d, then 32 int8 codes). Returns 0, or -1 when a value is NaN or infinite
 * (that block is then all zeros). Any thread. */
int quant_row_q8_0(const float *x, int64_t n, uint8_t *out);

#endif

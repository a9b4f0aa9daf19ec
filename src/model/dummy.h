/* dummy.h — `--load-format dummy` (vLLM's name): weights of a model's real shapes filled
 * with deterministic random values, so that a Hugging Face directory holding only
 * config.json (+ tokenizer files) loads, and speed can be measured on any machine
 * without downloading weights.
 *
 * Every tensor a config needs (weights.c's table, under the Hugging Face names) lives in
 * one host buffer: matrices BF16 (what the checkpoints of the supported families ship),
 * uniform in [-0.02 sqrt 3, 0.02 sqrt 3] (standard deviation 0.02, the models'
 * initializer_range); norm weights 1; biases of the same distribution as the matrices.
 * Element i of tensor k is a hash of (k, i): the values do not depend on the thread
 * count, and two loads of the same config give the same bytes. The fill runs on all
 * CPUs (a 7B model: 15 GB, a few seconds).
 */
#ifndef TESSERA_MODEL_DUMMY_H
#define TESSERA_MODEL_DUMMY_H

#include "model/config.h"
#include "util/tensor.h"

#include <stddef.h>

struct dummy_weights;

/* Allocates and fills the tensors of cfg. ERR_NOMEM (naming the size) when the host
 * memory is not there. The caller owns *out (dummy_weights_free). */
int dummy_weights_create(const struct model_config *cfg, struct dummy_weights **out, char *err, size_t errlen);
void dummy_weights_free(struct dummy_weights *d);

/* The tensor of that Hugging Face name ("model.layers.3.mlp.up_proj.weight"), or NULL.
 * Views are owned by d. */
const struct tensor *dummy_weights_find(const struct dummy_weights *d, const char *name);

/* Bytes of the buffer holding every tensor. */
size_t dummy_weights_bytes(const struct dummy_weights *d);

#endif

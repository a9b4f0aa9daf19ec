/* rope.h — rotary position embedding parameters, shared by the model config and every
 * backend. Both backends rotate with the same inverse-frequency table, computed once on
 * the host by rope_inv_freq (so scaling rules live here, not in kernels).
 */
#ifndef TESSERA_UTIL_ROPE_H
#define TESSERA_UTIL_ROPE_H

#ifdef __cplusplus
extern "C" {
#endif

enum rope_layout {
    ROPE_NORMAL = 0, /* rotate adjacent pairs (x[2i], x[2i+1]): GGUF llama (rows permuted) */
    ROPE_NEOX = 1,   /* rotate halves (x[i], x[i + head_dim/2]): HF checkpoints, GGUF qwen */
};

enum rope_scaling_type {
    ROPE_SCALING_NONE = 0,
    ROPE_SCALING_LINEAR = 1,  /* inv_freq / factor */
    ROPE_SCALING_LLAMA3 = 2,  /* HF _compute_llama3_parameters */
};

struct rope_params {
    double theta;                          /* base, e.g. 10000, 500000 */
    enum rope_scaling_type scaling;
    double factor;                         /* linear and llama3 */
    double low_freq_factor;                /* llama3 */
    double high_freq_factor;               /* llama3 */
    int original_max_position_embeddings;  /* llama3 */
};

/* inv_freq[i] for i < head_dim/2: theta^(-2i/head_dim), then the scaling rule.
 * freq_factors (may be NULL): GGUF's rope_freqs.weight, a divisor per frequency, applied
 * after the scaling rule (GGUF files carry llama3 scaling this way). */
void rope_inv_freq(float *inv_freq, int head_dim, const struct rope_params *p,
                   const float *freq_factors);

#ifdef __cplusplus
}
#endif

#endif

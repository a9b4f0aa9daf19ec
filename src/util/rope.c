/* rope.c — the inverse-frequency table of rotary embeddings (rope.h). */
#include "util/rope.h"

#include <math.h>

void rope_inv_freq(float *inv_freq, int head_dim, const struct rope_params *p,
                   const float *freq_factors)
{
    const double two_pi = 6.283185307179586;
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        /* HF computes base ** (arange(0, dim, 2).float() / dim) in f32; the difference to
         * a double computation is below 1 ulp of the f32 result we store. */
        double f = 1.0 / pow(p->theta, (double)(2 * i) / (double)head_dim);
        if (p->scaling == ROPE_SCALING_LINEAR) {
            f /= p->factor;
        } else if (p->scaling == ROPE_SCALING_LLAMA3) {
            double old_ctx = (double)p->original_max_position_embeddings;
            double low_wavelen = old_ctx / p->low_freq_factor;
            double high_wavelen = old_ctx / p->high_freq_factor;
            double wavelen = two_pi / f;
            if (wavelen > low_wavelen) {
                f = f / p->factor;  /* low frequency: fully scaled */
            } else if (wavelen >= high_wavelen) {
                /* medium: interpolate between scaled and unscaled */
                double smooth = (old_ctx / wavelen - p->low_freq_factor) /
                                (p->high_freq_factor - p->low_freq_factor);
                f = (1.0 - smooth) * f / p->factor + smooth * f;
            } /* high frequency (wavelen < high_wavelen): unchanged */
        }
        if (freq_factors) f /= (double)freq_factors[i];
        inv_freq[i] = (float)f;
    }
}

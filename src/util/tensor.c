/* tensor.c — element type traits (see tensor.h). Block sizes follow GGUF/ggml. */
#include "util/tensor.h"

struct dtype_info {
    const char *name;
    int block_elems;
    int block_bytes;
    int storage; /* accepted as a weight type in model files */
};

static const struct dtype_info dtype_table[DT_COUNT_] = {
    [DT_F32] = { "F32", 1, 4, 1 },
    [DT_F16] = { "F16", 1, 2, 1 },
    [DT_BF16] = { "BF16", 1, 2, 1 },
    [DT_Q4_0] = { "Q4_0", 32, 18, 1 },   /* f16 d, 16 bytes of nibbles */
    [DT_Q4_1] = { "Q4_1", 32, 20, 1 },   /* f16 d, f16 m, 16 bytes of nibbles */
    [DT_Q5_0] = { "Q5_0", 32, 22, 1 },   /* f16 d, 4 bytes high bits, 16 bytes nibbles */
    [DT_Q5_1] = { "Q5_1", 32, 24, 1 },   /* f16 d, f16 m, 4 bytes high bits, 16 bytes */
    [DT_Q8_0] = { "Q8_0", 32, 34, 1 },   /* f16 d, 32 int8 */
    [DT_Q8_1] = { "Q8_1", 32, 36, 0 },   /* f16 d, f16 s, 32 int8 */
    [DT_Q4_K] = { "Q4_K", 256, 144, 1 }, /* f16 d, f16 dmin, 12 bytes scales, 128 bytes */
    [DT_Q6_K] = { "Q6_K", 256, 210, 1 }, /* 128 ql, 64 qh, 16 int8 scales, f16 d */
    [DT_Q8_K] = { "Q8_K", 256, 292, 0 }, /* f32 d, 256 int8, 16 int16 bsums */
};

static const struct dtype_info *info(int t)
{
    if (t < 0 || t >= DT_COUNT_ || !dtype_table[t].name) return NULL;
    return &dtype_table[t];
}

int dtype_block_elems(enum dtype t) { const struct dtype_info *i = info((int)t); return i ? i->block_elems : 0; }
int dtype_block_bytes(enum dtype t) { const struct dtype_info *i = info((int)t); return i ? i->block_bytes : 0; }
const char *dtype_name(enum dtype t) { const struct dtype_info *i = info((int)t); return i ? i->name : "unknown"; }
int dtype_is_supported(int t) { const struct dtype_info *i = info(t); return i && i->storage; }

size_t dtype_row_bytes(enum dtype t, int64_t n)
{
    const struct dtype_info *i = info((int)t);
    if (!i || n < 0 || n % i->block_elems) return 0;
    uint64_t blocks = (uint64_t)(n / i->block_elems);
    if (blocks > SIZE_MAX / (uint64_t)i->block_bytes) return 0;
    return (size_t)(blocks * (uint64_t)i->block_bytes);
}

int64_t tensor_nelements(const struct tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->n_dims; d++) {
        if (t->ne[d] < 0) return -1;
        if (t->ne[d] != 0 && n > INT64_MAX / t->ne[d]) return -1;
        n *= t->ne[d];
    }
    return n;
}

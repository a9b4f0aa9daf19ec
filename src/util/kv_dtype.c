/* kv_dtype.c — names and sizes of the KV cache element types (kv_dtype.h). */
#include "util/kv_dtype.h"

#include "util/err.h"

#include <string.h>

size_t kv_dtype_size(enum kv_dtype t)
{
    switch (t) {
    case KV_F32: return 4;
    case KV_F16: return 2;
    case KV_BF16: return 2;
    case KV_FP8_E4M3: return 1;
    }
    return 0;
}

const char *kv_dtype_name(enum kv_dtype t)
{
    switch (t) {
    case KV_F32: return "f32";
    case KV_F16: return "f16";
    case KV_BF16: return "bf16";
    case KV_FP8_E4M3: return "fp8";
    }
    return "unknown";
}

int kv_dtype_parse(const char *s, enum kv_dtype *out)
{
    if (!strcmp(s, "f32")) *out = KV_F32;
    else if (!strcmp(s, "f16") || !strcmp(s, "fp16")) *out = KV_F16;
    else if (!strcmp(s, "bf16")) *out = KV_BF16;
    else if (!strcmp(s, "fp8") || !strcmp(s, "fp8_e4m3")) *out = KV_FP8_E4M3;
    else return ERR_INVALID;
    return 0;
}

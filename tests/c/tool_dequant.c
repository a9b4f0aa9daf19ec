/* tool_dequant.c — tool_dequant TYPE N IN.bin OUT.f32
 *
 * Reads the raw blocks of N elements of TYPE (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1, Q4_K, Q6_K; N a multiple of the block size) from IN.bin and writes N
 * little-endian f32 from quant_dequant_row to OUT.f32. For tests/python/test_quant.py,
 * which compares the output with gguf-py's dequantize. Exit status 0 on success,
 * 2 on bad usage, 1 on I/O errors.
 */
#include "backend/cpu/quant.h"
#include "util/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s TYPE N IN.bin OUT.f32\n", argv[0]);
        return 2;
    }
    int type = -1;
    for (int t = 0; t < DT_COUNT_; t++)
        if (dtype_is_supported(t) && strcmp(dtype_name((enum dtype)t), argv[1]) == 0) type = t;
    char *end;
    long long n = strtoll(argv[2], &end, 10);
    if (type < 0 || *end || n <= 0) {
        fprintf(stderr, "bad TYPE or N\n");
        return 2;
    }
    size_t nbytes = dtype_row_bytes((enum dtype)type, n);
    if (!nbytes) {
        fprintf(stderr, "N=%lld is not a multiple of the %s block size\n", n, argv[1]);
        return 2;
    }
    void *in = malloc(nbytes);
    float *out = malloc((size_t)n * sizeof *out);
    FILE *f = fopen(argv[3], "rb");
    if (!in || !out || !f || fread(in, 1, nbytes, f) != nbytes) {
        fprintf(stderr, "%s: cannot read %zu bytes\n", argv[3], nbytes);
        return 1;
    }
    fclose(f);
    quant_dequant_row((enum dtype)type, in, out, n);
    f = fopen(argv[4], "wb");
    if (!f || fwrite(out, sizeof *out, (size_t)n, f) != (size_t)n || fclose(f) != 0) {
        fprintf(stderr, "%s: cannot write\n", argv[4]);
        return 1;
    }
    free(in);
    free(out);
    return 0;
}

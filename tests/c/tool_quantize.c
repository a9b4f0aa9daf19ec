/* tool_quantize.c — tool_quantize N IN.f32 OUT.bin
 *
 * Reads N little-endian f32 (N a multiple of 32) from IN.f32 and writes their Q8_0 blocks
 * from quant_row_q8_0 (the --quantization q8_0 weight quantizer) to OUT.bin. For
 * tests/python/test_quantization.py, which compares the bytes with gguf-py's quantize.
 * Exit status 0 on success, 3 when a value is not finite (nothing written), 2 on bad
 * usage, 1 on I/O errors.
 */
#include "model/weights_convert.h"
#include "util/tensor.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s N IN.f32 OUT.bin\n", argv[0]);
        return 2;
    }
    char *end;
    long long n = strtoll(argv[1], &end, 10);
    if (*end || n <= 0 || n % 32) {
        fprintf(stderr, "N must be a positive multiple of 32\n");
        return 2;
    }
    const size_t nbytes = dtype_row_bytes(DT_Q8_0, n);
    float *in = malloc((size_t)n * sizeof *in);
    unsigned char *out = malloc(nbytes);
    FILE *f = fopen(argv[2], "rb");
    if (!in || !out || !f || fread(in, sizeof *in, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "%s: cannot read %lld floats\n", argv[2], n);
        return 1;
    }
    fclose(f);
    const int bad = quant_row_q8_0(in, n, out);
    if (bad) {
        free(in);
        free(out);
        fprintf(stderr, "a value is not finite\n");
        return 3;
    }
    f = fopen(argv[3], "wb");
    if (!f || fwrite(out, 1, nbytes, f) != nbytes || fclose(f) != 0) {
        fprintf(stderr, "%s: cannot write\n", argv[3]);
        return 1;
    }
    free(in);
    free(out);
    return 0;
}

/* args.h — small helpers the subcommands share for parsing their flags. Each prints a
 * message naming the flag to stderr on bad input and returns -1 (the caller exits 2). */
#ifndef TESSERA_CLI_ARGS_H
#define TESSERA_CLI_ARGS_H

#include <stdint.h>

/* The value after flag argv[*i] (advancing *i), or NULL with a message if missing. */
const char *args_value(int argc, char **argv, int *i);
/* Integer in [min, max]. */
int args_int(const char *flag, const char *s, long min, long max, int *out);
/* Unsigned 64-bit integer. */
int args_u64(const char *flag, const char *s, uint64_t *out);
/* Finite float in [min, max]. */
int args_float(const char *flag, const char *s, double min, double max, float *out);
/* --quantization none|q8_0 into model_load flags: *flags gets MODEL_LOAD_Q8_0 set or
 * cleared. */
int args_quantization(const char *flag, const char *s, unsigned *flags);
/* --dtype auto|bfloat16|float16|half likewise (MODEL_LOAD_BF16 / MODEL_LOAD_F16). */
int args_dtype(const char *flag, const char *s, unsigned *flags);
/* Comma-separated non-negative token ids "1,2,3" into a malloc'd array (caller frees).
 * Returns the count (>= 1) or -1. */
int args_ids(const char *flag, const char *s, int32_t **out);

#endif

/* args.c — see args.h. */
#include "cli/args.h"

#include "model/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

const char *args_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "%s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int args_int(const char *flag, const char *s, long min, long max, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (end == s || *end || errno || x < min || x > max) {
        fprintf(stderr, "%s: '%s' is not an integer in [%ld, %ld]\n", flag, s, min, max);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int args_u64(const char *flag, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (end == s || *end || errno || *s == '-') {
        fprintf(stderr, "%s: '%s' is not a non-negative integer\n", flag, s);
        return -1;
    }
    *out = (uint64_t)x;
    return 0;
}

int args_float(const char *flag, const char *s, double min, double max, float *out)
{
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(x) || x < min || x > max) {
        fprintf(stderr, "%s: '%s' is not a number in [%g, %g]\n", flag, s, min, max);
        return -1;
    }
    *out = (float)x;
    return 0;
}

int args_ids(const char *flag, const char *s, int32_t **out)
{
    int cap = 16, n = 0;
    int32_t *v = malloc(sizeof *v * (size_t)cap);
    if (!v) return -1;
    while (*s) {
        char *end;
        errno = 0;
        long x = strtol(s, &end, 10);
        if (end == s || errno || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "%s: expected comma-separated token ids, got '%s'\n", flag, s);
            free(v);
            return -1;
        }
        if (n == cap) {
            int32_t *nv = realloc(v, sizeof *v * (size_t)(cap *= 2));
            if (!nv) { free(v); return -1; }
            v = nv;
        }
        v[n++] = (int32_t)x;
        s = *end ? end + 1 : end;
    }
    if (n == 0) {
        fprintf(stderr, "%s: no token ids given\n", flag);
        free(v);
        return -1;
    }
    *out = v;
    return n;
}

int args_quantization(const char *flag, const char *s, unsigned *flags)
{
    if (!model_convert_flags(s, NULL, flags)) return 0;
    fprintf(stderr, "%s: '%s' is not one of none, q8_0\n", flag, s);
    return -1;
}

int args_dtype(const char *flag, const char *s, unsigned *flags)
{
    if (!model_convert_flags(NULL, s, flags)) return 0;
    fprintf(stderr, "%s: '%s' is not one of auto, bfloat16, float16, half\n", flag, s);
    return -1;
}

/* grow.c — see grow.h. */
#include "util/grow.h"

#include <stdint.h>
#include <stdlib.h>

bool grow_array(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) {
        if (c > SIZE_MAX / 2 / elem) return false;
        c *= 2;
    }
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

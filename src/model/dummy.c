/* dummy.c — random weights of a config's real shapes (contract in dummy.h). */
#include "model/dummy.h"

#include "util/err.h"
#include "util/half.h"
#include "util/threadpool.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DUMMY_HALF_RANGE 0.034641016f /* 0.02 * sqrt(3): uniform with standard deviation 0.02 */

enum fill { FILL_RANDOM, FILL_ONES };

struct dummy_entry {
    char name[96];
    struct tensor t;
    enum fill fill;
};

struct dummy_weights {
    struct dummy_entry *e;
    int n, cap;
    uint8_t *buf;
    size_t bytes;
};

/* splitmix64's finaliser: a 64-bit hash of x */
static inline uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* uniform in [-DUMMY_HALF_RANGE, DUMMY_HALF_RANGE) from 24 random bits */
static inline float uval(uint32_t bits)
{
    return DUMMY_HALF_RANGE * ((float)(bits >> 8) * (2.0f / 16777216.0f) - 1.0f);
}

static int add(struct dummy_weights *d, const char *name, enum dtype type, int64_t n_in, int64_t n_out, enum fill fill)
{
    if (d->n == d->cap) {
        int cap = d->cap ? 2 * d->cap : 64;
        struct dummy_entry *e = realloc(d->e, sizeof *e * (size_t)cap);
        if (!e) return ERR_NOMEM;
        d->e = e;
        d->cap = cap;
    }
    struct dummy_entry *x = &d->e[d->n++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->t.name = x->name;
    x->t.type = type;
    x->t.n_dims = n_out > 1 ? 2 : 1;
    x->t.ne[0] = n_in;
    x->t.ne[1] = n_out;
    x->t.ne[2] = x->t.ne[3] = 1;
    x->t.nbytes = dtype_row_bytes(type, n_in) * (size_t)n_out;
    x->fill = fill;
    return 0;
}

struct fill_job {
    const struct dummy_entry *e;
    uint64_t key;
};

/* Element pairs [2j, 2j + 1] of the tensor from one hash of (key, j). */
static void fill_worker(void *arg, int ith, int nth)
{
    const struct fill_job *j = arg;
    const struct tensor *t = &j->e->t;
    const int64_t n = t->ne[0] * t->ne[1], pairs = (n + 1) / 2;
    long b, e;
    tp_split(pairs, ith, nth, &b, &e);
    if (t->type == DT_BF16) {
        uint16_t *p = (uint16_t *)t->data;
        for (int64_t k = b; k < e; k++) {
            uint64_t h = mix64(j->key ^ (uint64_t)k);
            p[2 * k] = fp32_to_bf16(uval((uint32_t)h));
            if (2 * k + 1 < n) p[2 * k + 1] = fp32_to_bf16(uval((uint32_t)(h >> 32)));
        }
    } else {
        float *p = (float *)t->data;
        for (int64_t k = b; k < e; k++) {
            uint64_t h = mix64(j->key ^ (uint64_t)k);
            p[2 * k] = uval((uint32_t)h);
            if (2 * k + 1 < n) p[2 * k + 1] = uval((uint32_t)(h >> 32));
        }
    }
}

int dummy_weights_create(const struct model_config *c, struct dummy_weights **out, char *err, size_t errlen)
{
    *out = NULL;
    struct dummy_weights *d = calloc(1, sizeof *d);
    if (!d) return err_set(err, errlen, ERR_NOMEM, "dummy weights: out of memory");
    const int64_t dim = c->dim, qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim,
                  ffn = c->ffn_dim, V = c->vocab_size;
    char nb[96];
    int rc = add(d, "model.embed_tokens.weight", DT_BF16, dim, V, FILL_RANDOM);
    rc = rc ? rc : add(d, "model.norm.weight", DT_F32, dim, 1, FILL_ONES);
    if (!c->tied_embeddings) rc = rc ? rc : add(d, "lm_head.weight", DT_BF16, dim, V, FILL_RANDOM);
    for (int l = 0; l < c->n_layers && !rc; l++) {
        static const struct {
            const char *name;
            int out, in; /* 0 dim, 1 qd, 2 kvd, 3 ffn, 4 head_dim, -1 vector */
            int flag;    /* 0 always, 1 qkv_bias, 2 qk_norm */
            enum fill fill;
        } L[] = {
            { "input_layernorm.weight", 0, -1, 0, FILL_ONES },
            { "post_attention_layernorm.weight", 0, -1, 0, FILL_ONES },
            { "self_attn.q_proj.weight", 1, 0, 0, FILL_RANDOM },
            { "self_attn.k_proj.weight", 2, 0, 0, FILL_RANDOM },
            { "self_attn.v_proj.weight", 2, 0, 0, FILL_RANDOM },
            { "self_attn.o_proj.weight", 0, 1, 0, FILL_RANDOM },
            { "self_attn.q_proj.bias", 1, -1, 1, FILL_RANDOM },
            { "self_attn.k_proj.bias", 2, -1, 1, FILL_RANDOM },
            { "self_attn.v_proj.bias", 2, -1, 1, FILL_RANDOM },
            { "self_attn.q_norm.weight", 4, -1, 2, FILL_ONES },
            { "self_attn.k_norm.weight", 4, -1, 2, FILL_ONES },
            { "mlp.gate_proj.weight", 3, 0, 0, FILL_RANDOM },
            { "mlp.up_proj.weight", 3, 0, 0, FILL_RANDOM },
            { "mlp.down_proj.weight", 0, 3, 0, FILL_RANDOM },
        };
        const int64_t size[5] = { dim, qd, kvd, ffn, c->head_dim };
        for (size_t i = 0; i < sizeof L / sizeof L[0] && !rc; i++) {
            if ((L[i].flag == 1 && !c->qkv_bias) || (L[i].flag == 2 && !c->qk_norm)) continue;
            snprintf(nb, sizeof nb, "model.layers.%d.%s", l, L[i].name);
            if (L[i].in < 0) rc = add(d, nb, DT_F32, size[L[i].out], 1, L[i].fill);
            else rc = add(d, nb, DT_BF16, size[L[i].in], size[L[i].out], L[i].fill);
        }
    }
    if (rc) {
        dummy_weights_free(d);
        return err_set(err, errlen, ERR_NOMEM, "dummy weights: out of memory");
    }
    /* one buffer, every tensor 64-byte aligned */
    size_t total = 0;
    for (int i = 0; i < d->n; i++) total += (d->e[i].t.nbytes + 63) & ~(size_t)63;
    d->buf = aligned_alloc(64, total ? total : 64);
    if (!d->buf) {
        dummy_weights_free(d);
        return err_set(err, errlen, ERR_NOMEM, "dummy weights: cannot allocate %.2f GiB of host memory",
                       (double)total / (1024.0 * 1024.0 * 1024.0));
    }
    d->bytes = total;
    struct threadpool *tp = tp_create(0);
    size_t off = 0;
    for (int i = 0; i < d->n; i++) {
        struct dummy_entry *e = &d->e[i];
        e->t.data = d->buf + off;
        off += (e->t.nbytes + 63) & ~(size_t)63;
        const int64_t n = e->t.ne[0] * e->t.ne[1];
        if (e->fill == FILL_ONES) {
            float *p = (float *)e->t.data;
            for (int64_t k = 0; k < n; k++) p[k] = 1.0f;
            continue;
        }
        struct fill_job j = { e, mix64(0x7e55e7a000000000ull + (uint64_t)i) };
        if (tp) tp_run(tp, fill_worker, &j);
        else fill_worker(&j, 0, 1);
    }
    tp_free(tp);
    *out = d;
    return 0;
}

void dummy_weights_free(struct dummy_weights *d)
{
    if (!d) return;
    free(d->e);
    free(d->buf);
    free(d);
}

const struct tensor *dummy_weights_find(const struct dummy_weights *d, const char *name)
{
    for (int i = 0; i < d->n; i++)
        if (!strcmp(d->e[i].name, name)) return &d->e[i].t;
    return NULL;
}

size_t dummy_weights_bytes(const struct dummy_weights *d) { return d->bytes; }

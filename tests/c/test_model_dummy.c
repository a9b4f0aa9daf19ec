/* test_model_dummy.c — `--load-format dummy` (model/dummy.h, MODEL_LOAD_DUMMY) and the
 * model configs shipped for it (config/models/).
 *
 *   - a config-only directory loads: every tensor of the config's shapes, matrices BF16
 *     with mean ~0 and standard deviation 0.02, norms 1, biases for qwen2, q/k norms for
 *     qwen3, an LM head unless tied; the same bytes on a second load; the CPU forward
 *     runs on it with finite logits; with tokenizer files beside it, the tokenizer and
 *     chat template load too
 *   - refused: a GGUF file with the dummy format, a config-only directory without it
 *   - config/models/: tessera reads the published dimensions, RoPE settings and
 *     generation defaults of Qwen2.5-7B-Instruct, Llama-3.1-8B-Instruct and
 *     DeepSeek-R1-Distill-Qwen-7B (the dummy weights themselves, 15 GB, are not made here)
 */
#define _GNU_SOURCE
#include "test.h"

#include "loader/safetensors.h"
#include "model/config.h"
#include "model/dummy.h"
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "util/err.h"
#include "util/half.h"

#include <stdint.h>
#include <unistd.h>

static char g_dir[64];

static void write_file(const char *name, const char *text)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void copy_file(const char *from, const char *name)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *in = fopen(from, "rb"), *out = fopen(p, "wb");
    char buf[65536];
    size_t n;
    while (in && out && (n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
    if (in) fclose(in);
    if (out) fclose(out);
}

static void clear_dir(void)
{
    const char *names[] = { "config.json", "tokenizer.json", "tokenizer_config.json" };
    char p[256];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", g_dir, names[i]);
        unlink(p);
    }
}

#define QWEN3_CONFIG                                                                              \
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 128,"   \
    " \"intermediate_size\": 384, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"           \
    " \"num_key_value_heads\": 2, \"head_dim\": 64, \"max_position_embeddings\": 2048,"             \
    " \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0, \"tie_word_embeddings\": true,"           \
    " \"vocab_size\": 49152, \"torch_dtype\": \"bfloat16\"}"

static void matrix_stats(const struct tensor *t, double *mean, double *sd, float *amax)
{
    int64_t n = t->ne[0] * t->ne[1];
    const uint16_t *p = t->data;
    double s = 0, s2 = 0;
    *amax = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = bf16_to_fp32(p[i]);
        s += v;
        s2 += (double)v * v;
        if (fabsf(v) > *amax) *amax = fabsf(v);
    }
    *mean = s / n;
    *sd = sqrt(s2 / n - *mean * *mean);
}

static void test_dummy_load(void)
{
    char err[ERR_BUF];
    write_file("config.json", QWEN3_CONFIG);
    struct model *m = NULL, *m2 = NULL;
    int rc = model_load(g_dir, MODEL_LOAD_DUMMY | MODEL_LOAD_NO_TOKENIZER, &m, err, sizeof err);
    CHECK(rc == 0, "dummy load: %s", err);
    if (rc) return;
    const struct model_config *c = &m->cfg;
    CHECK(c->arch == ARCH_QWEN3 && c->dim == 128 && c->n_layers == 3 && c->head_dim == 64 && c->qk_norm &&
          c->tied_embeddings, "config");
    const struct layer_weights *L = &m->w.layers[2];
    CHECK(L->wq->type == DT_BF16 && L->wq->ne[0] == 128 && L->wq->ne[1] == 256, "wq shape/type");
    CHECK(L->wk->ne[1] == 128 && L->wv->ne[1] == 128 && L->wo->ne[0] == 256 && L->wo->ne[1] == 128, "k/v/o shapes");
    CHECK(L->w_gate->ne[1] == 384 && L->w_down->ne[0] == 384, "mlp shapes");
    CHECK(m->w.output == m->w.token_embd && m->w.token_embd->ne[1] == 49152, "tied embedding");
    CHECK(L->q_norm && L->k_norm && L->q_norm[0] == 1.0f && L->k_norm[63] == 1.0f, "q/k norms are 1");
    CHECK(L->attn_norm[5] == 1.0f && m->w.output_norm[127] == 1.0f, "norms are 1");
    double mean, sd;
    float amax;
    matrix_stats(m->w.token_embd, &mean, &sd, &amax);
    CHECK(fabs(mean) < 1e-3 && fabs(sd - 0.02) < 0.0005 && amax <= 0.035f, "embedding: mean %g sd %g max %g", mean, sd,
          amax);
    matrix_stats(L->w_up, &mean, &sd, &amax);
    CHECK(fabs(mean) < 2e-3 && fabs(sd - 0.02) < 0.001, "up: mean %g sd %g", mean, sd);
    /* the same bytes again; different tensors differ */
    rc = model_load(g_dir, MODEL_LOAD_DUMMY | MODEL_LOAD_NO_TOKENIZER, &m2, err, sizeof err);
    CHECK(rc == 0, "second load: %s", err);
    if (!rc) {
        CHECK(!memcmp(m->w.layers[1].w_down->data, m2->w.layers[1].w_down->data, m->w.layers[1].w_down->nbytes),
              "dummy weights are not deterministic");
        CHECK(memcmp(m->w.layers[1].w_gate->data, m->w.layers[1].w_up->data, 1024), "two tensors are equal");
    }

    /* the CPU forward runs on it. The random weights are heap memory, which must never be
     * released after packing (MADV_DONTNEED would zero it): they list no file mapping,
     * and packing leaves them as they were. */
    CHECK(m->w.n_maps == 0, "dummy weights list %d file mappings", m->w.n_maps);
    struct forward_state *fs = NULL;
    struct kv_cache *kv = NULL;
    struct forward_opts fo = { .max_tokens = 4, .n_threads = 1, .max_ctx = 64 };
    rc = forward_create(&fs, c, &m->w, &fo, err, sizeof err);
    if (!rc && m2)
        CHECK(!memcmp(m->w.layers[1].w_down->data, m2->w.layers[1].w_down->data, m->w.layers[1].w_down->nbytes),
              "packing changed the dummy weights");
    model_free(m2);
    if (!rc) rc = kv_cache_create(&kv, c, 4, 16, KV_F32, err, sizeof err);
    CHECK(rc == 0, "%s", err);
    if (!rc) {
        int32_t tok[3] = { 1, 200, 3000 }, pos[3] = { 0, 1, 2 }, qs[2] = { 0, 3 }, lens[1] = { 3 }, bt[4] = { 0, 1, 2, 3 },
                li[1] = { 2 };
        int64_t slot[3] = { 0, 1, 2 };
        struct batch b = { 3, 1, tok, pos, slot, qs, lens, bt, 4, 1, li };
        rc = model_forward(fs, kv, &b, err, sizeof err);
        CHECK(rc == 0, "forward: %s", err);
        bool finite = true;
        for (int i = 0; i < c->vocab_size; i++) finite = finite && isfinite(fs->logits[i]);
        CHECK(finite, "dummy logits are not finite");
    }
    forward_free(fs);
    kv_cache_free(kv);
    char desc[512];
    model_describe(m, desc, sizeof desc);
    CHECK(strstr(desc, "dummy") != NULL, "model_describe says dummy: %s", desc);
    model_free(m);
    clear_dir();
}

/* With tokenizer files beside the config, the model loads whole (tokenizer, template). */
static void test_dummy_with_tokenizer(void)
{
    const char *b = getenv("TESSERA_BUILD");
    char tj[1024], tc[1024];
    snprintf(tj, sizeof tj, "%s/testmodels/smollm2-hf/tokenizer.json", b && *b ? b : test_path("build"));
    snprintf(tc, sizeof tc, "%s/testmodels/smollm2-hf/tokenizer_config.json", b && *b ? b : test_path("build"));
    CHECK(access(tj, R_OK) == 0, "%s missing (scripts/make-test-models.py makes it)", tj);
    write_file("config.json", QWEN3_CONFIG);
    copy_file(tj, "tokenizer.json");
    copy_file(tc, "tokenizer_config.json");
    char err[ERR_BUF];
    struct model *m = NULL;
    int rc = model_load(g_dir, MODEL_LOAD_DUMMY, &m, err, sizeof err);
    CHECK(rc == 0, "dummy with tokenizer: %s", err);
    if (!rc) CHECK(m->tok && m->tmpl && m->n_eog > 0, "tokenizer, template, end-of-generation ids");
    model_free(m);
    clear_dir();
}

static void test_dummy_refused(void)
{
    char err[ERR_BUF];
    struct model *m = NULL;
    write_file("config.json", QWEN3_CONFIG);
    int rc = model_load(g_dir, MODEL_LOAD_NO_TOKENIZER, &m, err, sizeof err);
    CHECK(rc != 0 && m == NULL && strstr(err, "model.safetensors"), "config only without dummy: %d %s", rc, err);
    rc = model_load(test_path("models/SmolLM2-135M-Instruct.Q4_1.gguf"), MODEL_LOAD_DUMMY, &m, err, sizeof err);
    CHECK(rc == ERR_INVALID && m == NULL && strstr(err, "dummy"), "GGUF with dummy: %d %s", rc, err);
    clear_dir();
}

struct want {
    const char *dir;
    enum model_arch arch;
    int dim, layers, heads, kv_heads, head_dim, ffn, vocab, ctx;
    double theta, eps;
    bool bias, tied;
    enum rope_scaling_type scaling;
    int n_eos;
    double temperature;
};

static void test_shipped_configs(void)
{
    const struct want ws[] = {
        { "config/models/Qwen2.5-7B-Instruct", ARCH_QWEN2, 3584, 28, 28, 4, 128, 18944, 152064, 32768, 1e6, 1e-6, true,
          false, ROPE_SCALING_NONE, 2, 0.7 },
        { "config/models/Llama-3.1-8B-Instruct", ARCH_LLAMA, 4096, 32, 32, 8, 128, 14336, 128256, 131072, 500000,
          1e-5, false, false, ROPE_SCALING_LLAMA3, 3, 0.6 },
        { "config/models/DeepSeek-R1-Distill-Qwen-7B", ARCH_QWEN2, 3584, 28, 28, 4, 128, 18944, 152064, 131072, 10000,
          1e-6, true, false, ROPE_SCALING_NONE, 1, 0.6 },
    };
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        const struct want *w = &ws[i];
        char err[ERR_BUF];
        struct hf_dir *d = NULL;
        struct model_config c;
        int rc = hf_open_config_only(test_path(w->dir), &d, err, sizeof err);
        if (!rc) rc = config_from_hf(hf_config(d), w->dir, true, &c, err, sizeof err);
        CHECK(rc == 0, "%s: %s", w->dir, err);
        if (!rc) {
            CHECK(c.arch == w->arch && c.dim == w->dim && c.n_layers == w->layers && c.n_heads == w->heads &&
                  c.n_kv_heads == w->kv_heads && c.head_dim == w->head_dim && c.ffn_dim == w->ffn &&
                  c.vocab_size == w->vocab && c.max_seq_len == w->ctx,
                  "%s: dims %d/%d/%d/%d/%d/%d/%d/%d", w->dir, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim,
                  c.ffn_dim, c.vocab_size, c.max_seq_len);
            CHECK(c.rope.theta == w->theta && fabsf(c.rms_eps - (float)w->eps) < 1e-12f && c.qkv_bias == w->bias &&
                  c.tied_embeddings == w->tied && c.rope.scaling == w->scaling && c.rope_layout == ROPE_NEOX,
                  "%s: rope/eps/bias/tie", w->dir);
            if (w->scaling == ROPE_SCALING_LLAMA3)
                CHECK(c.rope.factor == 8 && c.rope.low_freq_factor == 1 && c.rope.high_freq_factor == 4 &&
                      c.rope.original_max_position_embeddings == 8192, "%s: llama3 scaling", w->dir);
            const struct hf_generation_config *g = hf_generation_config(d);
            CHECK(g->n_eos == w->n_eos && fabs(g->temperature - w->temperature) < 1e-9, "%s: generation config (%d eos, "
                  "temperature %g)", w->dir, g->n_eos, g->temperature);
            /* what the dummy weights and the GPU will hold: ~15 GB of BF16 */
            double params = (double)c.vocab_size * c.dim * (c.tied_embeddings ? 1 : 2) +
                            (double)c.n_layers * ((double)c.dim * (c.n_heads + 2 * c.n_kv_heads) * c.head_dim +
                                                  (double)c.n_heads * c.head_dim * c.dim + 3.0 * c.dim * c.ffn_dim);
            CHECK(params > 7.0e9 && params < 8.1e9, "%s: %.2fB parameters", w->dir, params / 1e9);
        }
        hf_close(d);
    }
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/tessera_dummy_XXXXXX");
    if (!mkdtemp(g_dir)) {
        printf("0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_dummy_load);
    RUN(test_dummy_with_tokenizer);
    RUN(test_dummy_refused);
    RUN(test_shipped_configs);
    rmdir(g_dir);
    return test_summary();
}

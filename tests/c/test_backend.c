/* test_backend.c — backend.h on the default model: device names, configuration defaults
 * and checks, the choice of implementation (--device auto falls back to the CPU with the
 * reason when no CUDA backend can be used; --device cuda then fails naming it), the step
 * protocol (one step in flight, BACKEND_TOKEN_PREV of the previous step only), that a
 * PREV row computes exactly what the same row with the token spelled out does, token masks
 * (constrained decoding) on some rows of a step, scoring rows (prompt logprobs) beside a
 * sampled row, per-row sampling failures, and a failed step leaving the backend unusable.
 *
 * TESSERA_TEST_DEVICE selects the device of the protocol tests (default cpu); the
 * selection tests always exercise auto and cuda with TESSERA_CUDA_LIB pointed away.
 */
#define _POSIX_C_SOURCE 200809L
#include "backend/backend.h"
#include "model/model.h"
#include "test.h"
#include "test_backend_env.h"
#include "util/err.h"

#include <stdlib.h>

#define MODEL_REL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define MAX_LEN 64
#define BS 16

static struct model *g_model;
static enum backend_device g_device = BACKEND_DEVICE_CPU;

static struct backend_config small_cfg(void)
{
    struct backend_config c;
    backend_config_default(&c);
    c.device = g_device;
    c.tensor_parallel_size = test_backend_tp();
    c.max_num_seqs = 4;
    c.max_num_batched_tokens = 64;
    c.max_model_len = MAX_LEN;
    c.block_size = BS;
    c.num_blocks = 16;
    c.n_threads = 2;
    return c;
}

/* A one-sequence batch over arrays the caller owns: n tokens from position pos0, blocks
 * 0, 1, 2, ... of the table, the last row's logits when want_logits. */
struct one_seq {
    int32_t ids[MAX_LEN], pos[MAX_LEN], qs[2], len, bt[MAX_LEN / BS], last;
    int64_t slots[MAX_LEN];
    struct batch b;
};

static void one_seq_fill(struct one_seq *o, const int32_t *ids, int n, int pos0, bool want_logits)
{
    for (int i = 0; i < MAX_LEN / BS; i++) o->bt[i] = i;
    for (int i = 0; i < n; i++) {
        o->ids[i] = ids[i];
        o->pos[i] = pos0 + i;
        o->slots[i] = (int64_t)o->bt[(pos0 + i) / BS] * BS + (pos0 + i) % BS;
    }
    o->qs[0] = 0;
    o->qs[1] = n;
    o->len = pos0 + n;
    o->last = n - 1;
    o->b = (struct batch){ .num_tokens = n, .num_seqs = 1, .token_ids = o->ids, .positions = o->pos,
                           .slot_mapping = o->slots, .query_start = o->qs, .seq_lens = &o->len,
                           .block_tables = o->bt, .max_blocks_per_seq = MAX_LEN / BS,
                           .num_logits = want_logits ? 1 : 0, .logits_indices = &o->last };
}

static struct sampler *greedy_sampler(void)
{
    struct sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0;
    return sampler_create(&sp, g_model->cfg.vocab_size);
}

static void test_device_names(void)
{
    enum backend_device d;
    const char *names[] = { "auto", "cpu", "cuda" };
    for (int i = 0; i < 3; i++) {
        CHECK(backend_device_parse(names[i], &d) == 0 && !strcmp(backend_device_name(d), names[i]), "%s",
              names[i]);
    }
    CHECK(backend_device_parse("gpu", &d) == ERR_INVALID && backend_device_parse("", &d) == ERR_INVALID &&
              backend_device_parse(NULL, &d) == ERR_INVALID, "bad names accepted");
    struct backend_config c;
    backend_config_default(&c);
    CHECK(c.device == BACKEND_DEVICE_AUTO && c.kv_dtype_auto && c.block_size == KV_DEFAULT_BLOCK_SIZE &&
              c.gpu_memory_utilization == 0.9 && c.cpu_kv_bytes == (size_t)1 << 30 && !c.enforce_eager &&
              c.max_model_len == 0 && c.num_blocks == 0, "defaults");
}

/* Without a usable CUDA backend: auto falls back to the CPU and says why; cuda fails. */
static void test_selection(void)
{
    char err[ERR_BUF], saved[1024] = "";
    const char *lib = getenv("TESSERA_CUDA_LIB"); /* restored at the end (TESSERA_TEST_DEVICE=cuda) */
    if (lib) snprintf(saved, sizeof saved, "%s", lib);
    const char *libs[] = { "none", "/nonexistent/libtessera-cuda.so" };
    const char *why[] = { "disabled", "/nonexistent/libtessera-cuda.so" };
    for (int i = 0; i < 2; i++) {
        setenv("TESSERA_CUDA_LIB", libs[i], 1);
        struct backend_config c = small_cfg();
        c.device = BACKEND_DEVICE_AUTO;
        struct backend *b = NULL;
        int rc = backend_create(&b, g_model, &c, err, sizeof err);
        CHECK(rc == 0, "auto with TESSERA_CUDA_LIB=%s: %s", libs[i], err);
        if (b) {
            const struct backend_info *info = backend_get_info(b);
            CHECK(!strcmp(info->name, "cpu") && strstr(info->fallback, why[i]), "%s: fallback '%s'", info->name,
                  info->fallback);
            backend_free(b);
        }
        c.device = BACKEND_DEVICE_CUDA;
        rc = backend_create(&b, g_model, &c, err, sizeof err);
        CHECK(rc != 0 && b == NULL && strstr(err, "--device cuda") && strstr(err, why[i]), "cuda: rc %d: %s", rc,
              err);
        c.device = BACKEND_DEVICE_CPU;
        CHECK(backend_create(&b, g_model, &c, err, sizeof err) == 0, "cpu: %s", err);
        if (b) {
            CHECK(backend_get_info(b)->fallback[0] == 0, "cpu asked for, fallback set");
            backend_free(b);
        }
    }
    if (saved[0]) setenv("TESSERA_CUDA_LIB", saved, 1);
    else unsetenv("TESSERA_CUDA_LIB");
}

/* Configuration errors name the knob; the CPU sizing from the budget. */
static void test_config(void)
{
    char err[ERR_BUF];
    struct backend *b = NULL;
    struct backend_config c = small_cfg();
    c.device = BACKEND_DEVICE_CPU;
    c.max_model_len = g_model->cfg.max_seq_len + 1;
    CHECK(backend_create(&b, g_model, &c, err, sizeof err) == ERR_RANGE && strstr(err, "max_model_len"), "%s", err);
    c = small_cfg();
    c.device = BACKEND_DEVICE_CPU;
    c.gpu_memory_utilization = 0;
    CHECK(backend_create(&b, g_model, &c, err, sizeof err) == ERR_RANGE && strstr(err, "gpu_memory_utilization"),
          "%s", err);
    c = small_cfg();
    c.device = BACKEND_DEVICE_CPU;
    c.num_blocks = MAX_LEN / BS - 1;
    CHECK(backend_create(&b, g_model, &c, err, sizeof err) == ERR_INVALID && strstr(err, "max_model_len"), "%s",
          err);
    c = small_cfg();
    c.device = BACKEND_DEVICE_CPU;
    c.num_blocks = 0;
    c.cpu_kv_bytes = 4096; /* not one block of SmolLM2 (30 layers) */
    CHECK(backend_create(&b, g_model, &c, err, sizeof err) == ERR_NOMEM && strstr(err, "--kv-cache-memory") &&
              strstr(err, "max_model_len"), "%s", err);
    c.cpu_kv_bytes = (size_t)8 << 20;
    CHECK(backend_create(&b, g_model, &c, err, sizeof err) == 0, "%s", err);
    if (b) {
        const struct backend_info *info = backend_get_info(b);
        size_t per_block = (size_t)2 * g_model->cfg.n_layers * g_model->cfg.n_kv_heads * g_model->cfg.head_dim * BS * 2;
        CHECK(!strcmp(info->name, "cpu") && info->kv_dtype == KV_F16 && info->block_size == BS &&
                  info->num_blocks == (int)(((size_t)8 << 20) / per_block) &&
                  info->kv_bytes == (size_t)info->num_blocks * per_block &&
                  info->max_concurrency == info->num_blocks * BS / MAX_LEN && info->weight_bytes > 50000000 &&
                  !info->graphs,
              "info: %s %s %d blocks of %d, %zu KV bytes, concurrency %d", info->name, kv_dtype_name(info->kv_dtype),
              info->num_blocks, info->block_size, info->kv_bytes, info->max_concurrency);
        backend_free(b);
    }
    c.kv_dtype_auto = false;
    c.kv_dtype = KV_BF16;
    CHECK(backend_create(&b, g_model, &c, err, sizeof err) == 0, "bf16: %s", err);
    if (b) {
        CHECK(backend_get_info(b)->kv_dtype == KV_BF16, "bf16 KV");
        backend_free(b);
    }
}

/* One step in flight; PREV only of the previous step; bad batches leave it usable. */
static void test_protocol(void)
{
    char err[ERR_BUF];
    struct backend *b = NULL;
    struct backend_config c = small_cfg();
    if (backend_create(&b, g_model, &c, err, sizeof err)) {
        CHECK(0, "create: %s", err);
        return;
    }
    struct sampler *smp = greedy_sampler();
    struct backend_sample s = { .sampler = smp, .n_logprobs = -1 };
    struct backend_token out[4];
    int32_t prompt[8] = { 1, 504, 3458, 314, 253, 1345, 281, 260 };
    struct one_seq o;
    one_seq_fill(&o, prompt, 8, 0, true);
    CHECK(backend_wait(b, out, err, sizeof err) == ERR_INVALID, "wait with nothing in flight");
    o.ids[3] = BACKEND_TOKEN_PREV(0);
    CHECK(backend_submit(b, &o.b, &s, err, sizeof err) == ERR_INVALID, "PREV before any step: %s", err);
    o.ids[3] = 314;
    CHECK(backend_submit(b, &o.b, NULL, err, sizeof err) == ERR_INVALID, "no samples");
    CHECK(backend_submit(b, &o.b, &s, err, sizeof err) == 0, "submit: %s", err);
    CHECK(backend_submit(b, &o.b, &s, err, sizeof err) == ERR_BUSY, "second submit");
    const float *lg;
    CHECK(backend_logits(b, &o.b, &lg, err, sizeof err) == ERR_BUSY, "logits in flight");
    CHECK(backend_wait(b, out, err, sizeof err) == 0 && out[0].status == 0 && out[0].token >= 0, "wait: %s", err);
    int32_t next = BACKEND_TOKEN_PREV(1); /* the previous step had one logits row */
    one_seq_fill(&o, &next, 1, 8, true);
    CHECK(backend_submit(b, &o.b, &s, err, sizeof err) == ERR_INVALID, "PREV(1) of a 1-row step");
    struct one_seq big;
    int32_t many[MAX_LEN] = { 0 };
    one_seq_fill(&big, many, MAX_LEN, 0, true);
    big.b.num_tokens = 65; /* over max_num_batched_tokens */
    CHECK(backend_step(b, &big.b, &s, out, err, sizeof err) == ERR_INVALID, "65 rows");
    o.pos[0] = 3; /* breaks the batch invariants: the forward refuses, nothing computed */
    o.ids[0] = 100;
    CHECK(backend_step(b, &o.b, &s, out, err, sizeof err) == ERR_INVALID, "bad positions accepted");
    struct one_seq two; /* two logits rows for one row */
    one_seq_fill(&two, prompt, 1, 0, true);
    int32_t li2[2] = { 0, 0 };
    struct backend_sample s2[2] = { s, s };
    two.b.num_logits = 2;
    two.b.logits_indices = li2;
    CHECK(backend_step(b, &two.b, s2, out, err, sizeof err) == ERR_INVALID && strstr(err, "logits rows"),
          "more logits rows than rows: %s", err);
    one_seq_fill(&o, prompt, 8, 0, true);
    CHECK(backend_step(b, &o.b, &s, out, err, sizeof err) == 0, "usable after bad batches: %s", err);
    sampler_free(smp);
    backend_free(b);
}

/* A decode row naming the previous step's token computes exactly what spelling it out
 * does: same sampled token, same logprobs (two backends, same steps). */
static void test_prev_token(void)
{
    char err[ERR_BUF];
    struct backend *b[2] = { NULL, NULL };
    struct backend_config c = small_cfg();
    for (int i = 0; i < 2; i++)
        if (backend_create(&b[i], g_model, &c, err, sizeof err)) {
            CHECK(0, "create: %s", err);
            backend_free(b[0]);
            return;
        }
    struct sampler *smp[2] = { greedy_sampler(), greedy_sampler() };
    int32_t prompt[6] = { 1, 504, 3458, 314, 253, 1345 };
    int32_t toks[2][6];
    float lps[2][6];
    for (int i = 0; i < 2; i++) {
        struct backend_sample s = { .sampler = smp[i], .n_logprobs = 5 };
        struct backend_token out;
        struct one_seq o;
        one_seq_fill(&o, prompt, 6, 0, true);
        CHECK(backend_step(b[i], &o.b, &s, &out, err, sizeof err) == 0, "%s", err);
        toks[i][0] = out.token;
        lps[i][0] = out.logprob;
        for (int k = 1; k < 6; k++) {
            sampler_accept(smp[i], toks[i][k - 1]);
            int32_t t = i == 0 ? toks[i][k - 1] : BACKEND_TOKEN_PREV(0);
            one_seq_fill(&o, &t, 1, 5 + k, true);
            CHECK(backend_step(b[i], &o.b, &s, &out, err, sizeof err) == 0, "%s", err);
            CHECK(out.status == 0 && out.n_top == 5 && out.top_ids[0] == out.token, "row %d: n_top %d", k, out.n_top);
            toks[i][k] = out.token;
            lps[i][k] = out.logprob;
        }
    }
    for (int k = 0; k < 6; k++)
        CHECK(toks[0][k] == toks[1][k] && lps[0][k] == lps[1][k], "token %d: %d vs %d (PREV)", k, toks[0][k],
              toks[1][k]);
    for (int i = 0; i < 2; i++) {
        sampler_free(smp[i]);
        backend_free(b[i]);
    }
}

/* Token masks on some rows of a step: a masked row samples exactly what
 * sampler_sample_masked picks on the step's raw logits (backend_logits of the same batch),
 * never a banned token; unmasked rows are unaffected; a row whose mask allows nothing
 * fails alone with ERR_RANGE; logprobs stay raw; the next step without masks samples as
 * if there had never been any. */
static void test_masks(void)
{
    enum { NS = 4, PL = 5 };
    char err[ERR_BUF];
    struct backend *b = NULL;
    struct backend_config c = small_cfg();
    if (backend_create(&b, g_model, &c, err, sizeof err)) {
        CHECK(0, "create: %s", err);
        return;
    }
    const int vocab = g_model->cfg.vocab_size, words = (vocab + 31) / 32;
    int32_t ids[NS * PL] = { 1, 504, 3458, 314, 253, 1, 1345, 281, 260, 504, 1, 253, 3458, 314, 1345,
                             1, 260, 281, 504, 3458 };
    int32_t pos[NS * PL], qs[NS + 1], lens[NS], bt[NS][MAX_LEN / BS], li[NS];
    int64_t slots[NS * PL];
    memset(bt, 0, sizeof bt);
    for (int s = 0; s < NS; s++) {
        qs[s] = s * PL;
        lens[s] = PL;
        bt[s][0] = s;
        li[s] = s * PL + PL - 1;
        for (int i = 0; i < PL; i++) {
            pos[s * PL + i] = i;
            slots[s * PL + i] = (int64_t)s * BS + i;
        }
    }
    qs[NS] = NS * PL;
    struct batch bb = { .num_tokens = NS * PL, .num_seqs = NS, .token_ids = ids, .positions = pos,
                        .slot_mapping = slots, .query_start = qs, .seq_lens = lens, .block_tables = &bt[0][0],
                        .max_blocks_per_seq = MAX_LEN / BS, .num_logits = NS, .logits_indices = li };
    float *raw = malloc(sizeof(float) * (size_t)vocab * NS), *row = malloc(sizeof(float) * (size_t)vocab);
    uint32_t *mask[NS];
    for (int s = 0; s < NS; s++) mask[s] = calloc((size_t)words, sizeof(uint32_t));
    struct sampler_params sp[NS];
    struct sampler *smp[NS], *ref[NS];
    const float *lg = NULL;
    if (!raw || !row) goto done;
    CHECK(backend_logits(b, &bb, &lg, err, sizeof err) == 0, "logits: %s", err);
    if (!lg) goto done;
    memcpy(raw, lg, sizeof(float) * (size_t)vocab * NS);
    int argmax[NS];
    for (int s = 0; s < NS; s++) {
        argmax[s] = 0;
        for (int i = 1; i < vocab; i++)
            if (raw[(size_t)s * vocab + i] > raw[(size_t)s * vocab + argmax[s]]) argmax[s] = i;
    }
    /* row 0 greedy, every third id allowed but not its argmax; row 1 greedy, no mask; row 2
     * sampled (top-k, penalties, a bias raising a banned id) over ids 1000-1999 except its
     * argmax; row 3 nothing allowed */
    for (int i = 0; i < vocab; i++)
        if (i % 3 == 0 && i != argmax[0]) mask[0][i / 32] |= 1u << (i % 32);
    for (int i = 1000; i < 2000; i++)
        if (i != argmax[2]) mask[2][i / 32] |= 1u << (i % 32);
    for (int s = 0; s < NS; s++) {
        sampler_params_default(&sp[s]);
        sp[s].temperature = s == 2 ? 0.9f : 0.0f;
        sp[s].top_k = s == 2 ? 40 : 0;
        sp[s].presence_penalty = s == 2 ? -1.0f : 0.0f;
        sp[s].seed = 77;
        smp[s] = sampler_create(&sp[s], vocab);
        ref[s] = sampler_create(&sp[s], vocab);
        int32_t hist[3] = { 1200, 5, 1500 }, bid = 7;
        float bv = 30.0f;
        if (s == 2) {
            for (int j = 0; j < 3; j++) {
                sampler_accept(smp[s], hist[j]);
                sampler_accept(ref[s], hist[j]);
            }
            sampler_set_logit_bias(smp[s], &bid, &bv, 1);
            sampler_set_logit_bias(ref[s], &bid, &bv, 1);
        }
    }
    struct backend_sample bs[NS];
    for (int s = 0; s < NS; s++)
        bs[s] = (struct backend_sample){ .sampler = smp[s], .n_logprobs = s == 2 ? 5 : -1,
                                         .mask = s == 1 ? NULL : mask[s] };
    struct backend_token out[NS];
    CHECK(backend_step(b, &bb, bs, out, err, sizeof err) == 0, "masked step: %s", err);
    for (int s = 0; s < 3; s++) {
        memcpy(row, raw + (size_t)s * vocab, sizeof(float) * (size_t)vocab);
        int32_t want = sampler_sample_masked(ref[s], row, bs[s].mask);
        CHECK(out[s].status == 0 && out[s].token == want, "row %d: status %d token %d, the sampler on the raw logits %d",
              s, out[s].status, out[s].token, want);
        if (bs[s].mask && out[s].token >= 0)
            CHECK((bs[s].mask[out[s].token / 32] >> (out[s].token % 32)) & 1u, "row %d: banned token %d", s,
                  out[s].token);
    }
    CHECK(out[0].token != argmax[0] && out[1].token == argmax[1], "masked greedy %d (argmax %d), unmasked %d (%d)",
          out[0].token, argmax[0], out[1].token, argmax[1]);
    CHECK(out[2].token >= 1000 && out[2].token < 2000, "row 2 sampled %d outside the mask", out[2].token);
    /* raw logprobs: the banned argmax still tops the list */
    float lp = 0.0f;
    sampler_logprobs(raw + 2 * (size_t)vocab, vocab, out[2].token >= 0 ? out[2].token : 0, 0, NULL, NULL, &lp);
    CHECK(out[2].n_top == 5 && out[2].top_ids[0] == argmax[2] && fabsf(out[2].logprob - lp) <= 1e-4f,
          "row 2 logprobs: n_top %d top %d (argmax %d), logprob %g (raw %g)", out[2].n_top, out[2].top_ids[0],
          argmax[2], (double)out[2].logprob, (double)lp);
    CHECK(out[3].status == ERR_RANGE && out[3].token == -1, "row 3 (nothing allowed): status %d token %d",
          out[3].status, out[3].token);
    /* the same step without masks: every greedy row takes its argmax again */
    for (int s = 0; s < NS; s++) bs[s].mask = NULL;
    CHECK(backend_step(b, &bb, bs, out, err, sizeof err) == 0, "unmasked step: %s", err);
    CHECK(out[0].token == argmax[0] && out[1].token == argmax[1] && out[3].token == argmax[3],
          "after the masks: %d %d %d, argmax %d %d %d", out[0].token, out[1].token, out[3].token, argmax[0],
          argmax[1], argmax[3]);
    for (int s = 0; s < NS; s++) {
        sampler_free(smp[s]);
        sampler_free(ref[s]);
    }
done:
    for (int s = 0; s < NS; s++) free(mask[s]);
    free(raw);
    free(row);
    backend_free(b);
}

/* The rank of score_token in raw: the ids whose logit is >= its own (NaN never counts). */
static int plain_rank(const float *raw, int vocab, int32_t score_token)
{
    int n = 0;
    for (int i = 0; i < vocab; i++) n += raw[i] >= raw[score_token];
    return n;
}

/* Checks scoring row out (n_logprobs asked) against sampler_logprobs of score_token over
 * the raw row: status 0, the token, its logprob and the top alternatives; and its rank
 * against a plain count over the same row. */
static void check_scored(const struct backend_token *out, const float *raw, int32_t score_token, int n_logprobs,
                         const char *what)
{
    const int vocab = g_model->cfg.vocab_size, want_n = n_logprobs > 0 ? n_logprobs : 0;
    int32_t ids[SAMPLER_MAX_TOP_LOGPROBS];
    float lps[SAMPLER_MAX_TOP_LOGPROBS], lp = 0.0f;
    int n = sampler_logprobs(raw, vocab, score_token, want_n, ids, lps, &lp);
    CHECK(n == want_n, "%s: sampler_logprobs gave %d", what, n);
    bool ok = out->status == 0 && out->token == score_token && out->n_top == n && fabsf(out->logprob - lp) <= 1e-4f;
    CHECK(ok, "%s: status %d token %d (scored %d) logprob %g (raw %g) n_top %d (%d)", what, out->status, out->token,
          score_token, (double)out->logprob, (double)lp, out->n_top, n);
    for (int j = 0; ok && j < n; j++)
        CHECK(out->top_ids[j] == ids[j] && fabsf(out->top_logprobs[j] - lps[j]) <= 1e-4f,
              "%s: top %d: %d %g, raw %d %g", what, j, out->top_ids[j], (double)out->top_logprobs[j], ids[j],
              (double)lps[j]);
    const int rank = plain_rank(raw, vocab, score_token);
    CHECK(out->rank == rank && rank >= 1, "%s: rank %d, a plain count %d", what, out->rank, rank);
}

/* Scoring rows (prompt logprobs): one sequence's prompt positions scored against the next
 * prompt token, beside the sequence's sampled last row, in one step. Each scoring row gives
 * its token with the raw logprobs and the rank of the step's logits (backend_logits of the
 * same batch; the rank against a plain count, the sampled and failed rows' rank 0):
 * the sequence's bias (banning a scored token), repetition penalty and mask (excluding the
 * scored tokens) are ignored, top-N of 20 / 5 / 0 / none; a score_token outside the
 * vocabulary fails its row only (ERR_INVALID); the sampled row samples as without them.
 * Then decode-shaped steps (one row per sequence: the CUDA graph path) with a scoring row
 * for a second sequence's one-token prompt chunk, beside a sampled row and alone. */
static void test_scoring(void)
{
    enum { PL = 8, NL = 7 };
    char err[ERR_BUF];
    struct backend *b = NULL;
    struct backend_config c = small_cfg();
    c.max_num_seqs = NL;
    if (backend_create(&b, g_model, &c, err, sizeof err)) {
        CHECK(0, "create: %s", err);
        return;
    }
    const int vocab = g_model->cfg.vocab_size, words = (vocab + 31) / 32;
    int32_t prompt[PL] = { 1, 504, 3458, 314, 253, 1345, 281, 260 };
    struct one_seq o;
    one_seq_fill(&o, prompt, PL, 0, true);
    /* logits rows: positions 0-5 scored (the next prompt token; rows 3 and 4 out of range),
     * the last position sampled */
    int32_t li[NL] = { 0, 1, 2, 3, 4, 5, PL - 1 };
    const int32_t score_tok[NL] = { prompt[1], prompt[2], prompt[3], -1, vocab, prompt[6], 0 };
    const int n_lp[NL] = { 5, -1, 20, 5, 5, 0, 3 };
    o.b.num_logits = NL;
    o.b.logits_indices = li;
    struct sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0.0f;
    sp.repetition_penalty = 1.3f;
    struct sampler *smp = sampler_create(&sp, vocab), *ref = sampler_create(&sp, vocab), *smp_b = greedy_sampler();
    int32_t bid = prompt[1];
    float bv = -INFINITY;
    uint32_t *mask = calloc((size_t)words, sizeof(uint32_t));
    float *raw = malloc(sizeof(float) * (size_t)vocab * NL), *row = malloc(sizeof(float) * (size_t)vocab);
    const float *lg = NULL;
    if (!smp || !ref || !smp_b || !mask || !raw || !row) {
        CHECK(0, "out of memory");
        goto done;
    }
    sampler_accept_prompt(smp, prompt, PL);
    sampler_accept_prompt(ref, prompt, PL);
    sampler_set_logit_bias(smp, &bid, &bv, 1);
    sampler_set_logit_bias(ref, &bid, &bv, 1);
    for (int i = 1000; i < 2000; i++) mask[i / 32] |= 1u << (i % 32); /* no prompt token allowed */
    CHECK(backend_logits(b, &o.b, &lg, err, sizeof err) == 0, "logits: %s", err);
    if (!lg) goto done;
    memcpy(raw, lg, sizeof(float) * (size_t)vocab * NL);
    struct backend_sample bs[NL];
    for (int i = 0; i < NL; i++)
        bs[i] = (struct backend_sample){ .sampler = smp, .n_logprobs = n_lp[i], .mask = mask, .score = i < NL - 1,
                                         .score_token = score_tok[i] };
    struct backend_token out[NL];
    memset(out, 0xff, sizeof out); /* rank included: every field must be written */
    CHECK(backend_step(b, &o.b, bs, out, err, sizeof err) == 0, "scoring step: %s", err);
    char what[64];
    for (int i = 0; i < NL - 1; i++) {
        snprintf(what, sizeof what, "scoring row %d (position %d)", i, li[i]);
        if (score_tok[i] < 0 || score_tok[i] >= vocab)
            CHECK(out[i].status == ERR_INVALID && out[i].token == -1 && out[i].rank == 0,
                  "%s: score_token %d: status %d token %d rank %d", what, score_tok[i], out[i].status, out[i].token,
                  out[i].rank);
        else
            check_scored(&out[i], raw + (size_t)i * vocab, score_tok[i], n_lp[i], what);
    }
    memcpy(row, raw + (size_t)(NL - 1) * vocab, sizeof(float) * (size_t)vocab);
    int32_t want = sampler_sample_masked(ref, row, mask);
    float lp = 0.0f;
    sampler_logprobs(row, vocab, want >= 0 ? want : 0, 0, NULL, NULL, &lp);
    CHECK(out[NL - 1].status == 0 && out[NL - 1].token == want && out[NL - 1].n_top == 3 &&
              fabsf(out[NL - 1].logprob - lp) <= 1e-4f && out[NL - 1].rank == 0,
          "sampled row: status %d token %d (the sampler %d) n_top %d logprob %g (%g) rank %d", out[NL - 1].status,
          out[NL - 1].token, want, out[NL - 1].n_top, (double)out[NL - 1].logprob, (double)lp, out[NL - 1].rank);

    /* decode-shaped: the first sequence's next token (sampled) and a second sequence's
     * one-token prompt chunk (scored against 504), then the scoring row alone */
    int32_t ids[2] = { out[NL - 1].token >= 0 ? out[NL - 1].token : 0, 1 }, pos[2] = { PL, 0 }, qs[3] = { 0, 1, 2 },
            lens[2] = { PL + 1, 1 }, bt[2][MAX_LEN / BS] = { { 0, 1, 2, 3 }, { 4, 5, 6, 7 } }, dli[2] = { 0, 1 };
    int64_t slots[2] = { PL, 4 * BS };
    struct batch db = { .num_tokens = 2, .num_seqs = 2, .token_ids = ids, .positions = pos, .slot_mapping = slots,
                        .query_start = qs, .seq_lens = lens, .block_tables = &bt[0][0],
                        .max_blocks_per_seq = MAX_LEN / BS, .num_logits = 2, .logits_indices = dli };
    struct backend_sample ds[2] = { { .sampler = smp, .n_logprobs = 2 },
                                    { .sampler = smp_b, .n_logprobs = 4, .score = true, .score_token = 504 } };
    for (int alone = 0; alone < 2; alone++) {
        db.num_logits = alone ? 1 : 2;
        db.logits_indices = alone ? &dli[1] : dli;
        const struct backend_sample *dsp = alone ? &ds[1] : ds;
        lg = NULL;
        CHECK(backend_logits(b, &db, &lg, err, sizeof err) == 0, "decode logits: %s", err);
        if (!lg) break;
        memcpy(raw, lg, sizeof(float) * (size_t)vocab * (size_t)db.num_logits);
        memset(out, 0xff, sizeof out);
        CHECK(backend_step(b, &db, dsp, out, err, sizeof err) == 0, "decode step: %s", err);
        const int k = alone ? 0 : 1; /* the scoring row */
        check_scored(&out[k], raw + (size_t)k * vocab, 504, 4, alone ? "decode scoring row alone" : "decode scoring row");
        if (!alone) {
            memcpy(row, raw, sizeof(float) * (size_t)vocab);
            want = sampler_sample(ref, row);
            CHECK(out[0].status == 0 && out[0].token == want && out[0].rank == 0,
                  "decode sampled row: status %d token %d (the sampler %d) rank %d", out[0].status, out[0].token, want,
                  out[0].rank);
        }
    }
done:
    sampler_free(smp);
    sampler_free(ref);
    sampler_free(smp_b);
    free(mask);
    free(raw);
    free(row);
    backend_free(b);
}

/* TESSERA_TEST_FAULT: a NaN row fails alone; a failed step breaks the backend. */
static void test_faults(void)
{
    if (g_device != BACKEND_DEVICE_CPU) { SKIP("TESSERA_TEST_FAULT is the CPU backend's hook"); return; }
    char err[ERR_BUF];
    struct backend *b = NULL;
    struct backend_config c = small_cfg();
    setenv("TESSERA_TEST_FAULT", "nan-row=2", 1);
    int rc = backend_create(&b, g_model, &c, err, sizeof err);
    unsetenv("TESSERA_TEST_FAULT");
    if (rc) {
        CHECK(0, "create: %s", err);
        return;
    }
    /* two sequences of 4 tokens in blocks 0 and 1: rows 1 and 2 of the backend */
    int32_t ids[8] = { 1, 504, 3458, 314, 1, 253, 1345, 281 }, pos[8], qs[3] = { 0, 4, 8 }, lens[2] = { 4, 4 };
    int32_t bt[2][MAX_LEN / BS] = { { 0 }, { 1 } }, li[2] = { 3, 7 };
    int64_t slots[8];
    for (int i = 0; i < 8; i++) {
        pos[i] = i % 4;
        slots[i] = (int64_t)(i / 4) * BS + i % 4;
    }
    struct batch bb = { .num_tokens = 8, .num_seqs = 2, .token_ids = ids, .positions = pos, .slot_mapping = slots,
                        .query_start = qs, .seq_lens = lens, .block_tables = &bt[0][0],
                        .max_blocks_per_seq = MAX_LEN / BS, .num_logits = 2, .logits_indices = li };
    struct sampler *smp[2] = { greedy_sampler(), greedy_sampler() };
    struct backend_sample s[2] = { { .sampler = smp[0], .n_logprobs = 3 }, { .sampler = smp[1], .n_logprobs = 3 } };
    struct backend_token out[2];
    CHECK(backend_step(b, &bb, s, out, err, sizeof err) == 0, "%s", err);
    CHECK(out[0].status == 0 && out[0].token >= 0 && out[0].n_top == 3, "row 0: status %d", out[0].status);
    CHECK(out[1].status == ERR_RANGE && out[1].token == -1, "row 1: status %d token %d", out[1].status, out[1].token);
    /* the failed row cannot be named by the next step */
    int32_t prev = BACKEND_TOKEN_PREV(1);
    struct one_seq o;
    one_seq_fill(&o, &prev, 1, 4, true);
    o.bt[0] = 1;
    o.slots[0] = BS + 4;
    CHECK(backend_submit(b, &o.b, s, err, sizeof err) == ERR_INVALID, "PREV of a failed row");
    backend_free(b);

    setenv("TESSERA_TEST_FAULT", "fail-step=2", 1);
    rc = backend_create(&b, g_model, &c, err, sizeof err);
    unsetenv("TESSERA_TEST_FAULT");
    if (rc) {
        CHECK(0, "create: %s", err);
        return;
    }
    CHECK(backend_step(b, &bb, s, out, err, sizeof err) == 0, "step 1: %s", err);
    CHECK(backend_step(b, &bb, s, out, err, sizeof err) == ERR_IO && strstr(err, "injected"), "step 2: %s", err);
    CHECK(backend_step(b, &bb, s, out, err, sizeof err) == ERR_UNAVAILABLE && strstr(err, "injected"),
          "step 3 after the fault: %s", err);
    const float *lg;
    CHECK(backend_logits(b, &bb, &lg, err, sizeof err) == ERR_UNAVAILABLE, "logits after the fault");
    backend_free(b);
    for (int i = 0; i < 2; i++) sampler_free(smp[i]);
}

int main(void)
{
    if (!test_backend_env(&g_device, MODEL_REL, MODEL_LOAD_NO_TOKENIZER, &g_model)) return 1;
    RUN(test_device_names);
    RUN(test_selection);
    RUN(test_config);
    RUN(test_protocol);
    RUN(test_prev_token);
    RUN(test_masks);
    RUN(test_scoring);
    RUN(test_faults);
    model_free(g_model);
    return test_summary();
}

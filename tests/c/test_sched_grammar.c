/* test_sched_grammar.c — constrained decoding in the scheduler, on the real default model.
 *
 * A batch of eight sequences mixes every kind of grammar (a list of choices, a JSON
 * schema, a regular expression, any JSON object; greedy and seeded sampling; one with
 * ignore_eos) with unconstrained neighbours. Properties:
 *   - every constrained output matches its grammar (parsed and checked here, independently
 *     of the grammar engine) and ends with an end-of-generation token (finish STOP), even
 *     with ignore_eos;
 *   - the unconstrained sequences produce exactly what they produce without constrained
 *     neighbours (masks are per row);
 *   - the outputs are identical with overlapped scheduling off and on (the mask of step
 *     N+1 is filled after step N's token is recorded) and under preemption with chunked
 *     prefill (the matcher survives the recompute);
 *   - the mask applies after the logit bias: a grammar whose every allowed token is banned
 *     fails its sequence alone (FINISH_ERROR), and a banned choice is never produced;
 *   - no matcher outlives its sequence; freeing the scheduler mid-run leaks nothing (ASan).
 * A mask costs time on the scheduler thread: the stats count masked rows and their time.
 *
 * TESSERA_TEST_DEVICE=cuda (TESSERA_CUDA_LIB=build/libtessera-cuda-emu.so) runs the same on
 * the emulated CUDA backend, whose sampling kernel applies the masks; with
 * TESSERA_TEST_MODEL=build/testmodels/llama3-tiny-hd64 (random weights) under preemption /
 * chunked prefill the
 * CUDA arithmetic may part at most 2 sequences from the reference (as in
 * test_scheduler.c); every output still matches its grammar.
 * The json_object sequence is unbounded (any object is allowed, and SmolLM2 likes to
 * write long URLs into it), so it may run to max_tokens on any model; then its text must
 * still open an object, and the grammar must not have ended it with an error.
 */
#define _POSIX_C_SOURCE 200809L
#include "engine/scheduler.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "test.h"
#include "test_backend_env.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdlib.h>

#define MODEL_REL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define NSEQ 8
#define GEN 64          /* max_tokens of every sequence */
#define MAX_LEN 160
#define SMALL_POOL 12   /* KV blocks: 8 sequences of ~40 + 64 tokens cannot all fit */

enum kind { K_NONE = 0, K_CHOICE, K_SCHEMA, K_REGEX, K_OBJECT };

static const char *const COLORS[] = { "red", "green", "blue", "yellow" };
static const char SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},"
    "\"pets\":{\"type\":\"array\",\"items\":{\"enum\":[\"cat\",\"dog\",\"fish\"]},\"maxItems\":3}},"
    "\"required\":[\"name\",\"age\",\"pets\"],\"additionalProperties\":false}";
static const char REGEX[] = "[0-9]{3}-[0-9]{4}";

static const struct {
    enum kind kind;
    const char *question;
    float temperature;
    bool ignore_eos;
} SEQS[NSEQ] = {
    { K_CHOICE, "What colour is the sky? Answer with one word.", 0, false },
    { K_SCHEMA, "Describe a person called Ann who is 31 and has a cat, as JSON.", 0, false },
    { K_NONE, "Write a short poem about the sea.", 0, false },
    { K_REGEX, "Give me a phone number.", 0, false },
    { K_SCHEMA, "Describe a young man with two dogs, as JSON.", 0.8f, false },
    { K_OBJECT, "List three fruits and their colours as a JSON object.", 0, false },
    { K_NONE, "Tell me about the moon.", 0.8f, true },
    { K_CHOICE, "Which colour do bananas have?", 0.8f, true },
};

static struct model *g_model;
static enum backend_device g_device = BACKEND_DEVICE_CPU;
static bool g_random_model; /* TESSERA_TEST_MODEL given: not the trained default */
static struct grammar_vocab *g_vocab;
static struct grammar *g_grammar[5]; /* by kind */
static int32_t g_prompt[NSEQ][96];
static int g_len[NSEQ];

struct run {
    int64_t id[NSEQ];
    int32_t out[NSEQ][GEN];
    int n[NSEQ];
    enum sched_finish finish[NSEQ];
    const char *error[NSEQ];
    int after_finish;
    struct sched_stats st;       /* at the end */
    int most_matchers;
};

static void on_output(void *ud, const struct sched_output *o)
{
    struct run *r = ud;
    for (int i = 0; i < NSEQ; i++) {
        if (r->id[i] != o->seq_id) continue;
        if (r->finish[i] != FINISH_NONE) r->after_finish++;
        if (o->token >= 0 && r->n[i] < GEN) r->out[i][r->n[i]++] = o->token;
        if (o->finished) {
            r->finish[i] = o->finish;
            r->error[i] = o->error;
        }
        return;
    }
}

static struct sched_config base_cfg(enum sched_overlap overlap)
{
    struct sched_config c;
    sched_config_default(&c);
    c.max_num_seqs = NSEQ;
    c.max_num_batched_tokens = 512;
    c.max_model_len = MAX_LEN;
    c.block_size = 16;
    c.enable_prefix_caching = false;
    c.enable_chunked_prefill = false;
    c.overlap = overlap;
    c.backend.device = g_device;
    c.backend.tensor_parallel_size = test_backend_tp();
    c.backend.num_blocks = 128;
    c.backend.n_threads = 2;
    c.backend.kv_dtype_auto = false;
    c.backend.kv_dtype = KV_F16;
    return c;
}

/* Runs the sequences whose bit is set in which; steps_before_free > 0 frees the scheduler
 * after that many steps instead of draining it. */
static void run_batch(const struct sched_config *cfg, unsigned which, int steps_before_free, struct run *r)
{
    char err[ERR_BUF];
    memset(r, 0, sizeof *r);
    struct sched *s = NULL;
    if (sched_create(&s, g_model, cfg, err, sizeof err)) {
        CHECK(0, "sched_create: %s", err);
        return;
    }
    for (int i = 0; i < NSEQ; i++) {
        if (!(which >> i & 1)) continue;
        struct sched_seq_params p;
        sched_seq_params_default(&p);
        p.sp.temperature = SEQS[i].temperature;
        p.sp.seed = 1000 + (uint64_t)i;
        p.max_tokens = GEN;
        p.ignore_eos = SEQS[i].ignore_eos;
        p.grammar = g_grammar[SEQS[i].kind];
        CHECK(sched_add(s, g_prompt[i], g_len[i], &p, &r->id[i], err, sizeof err) == 0, "sched_add %d: %s", i, err);
    }
    /* the scheduler holds its own references: the caller's may go at once */
    for (int steps = 0; sched_has_work(s); steps++) {
        if (steps_before_free > 0 && steps == steps_before_free) break;
        if (steps > 10000 || sched_step(s, on_output, r, err, sizeof err)) {
            CHECK(0, "sched_step: %s", err);
            break;
        }
        struct sched_stats st;
        sched_get_stats(s, &st);
        if (st.num_matchers > r->most_matchers) r->most_matchers = st.num_matchers;
        /* a matcher per admitted constrained sequence, like the samplers */
        CHECK(st.num_matchers <= st.num_samplers, "%d matchers, %d samplers", st.num_matchers, st.num_samplers);
    }
    sched_get_stats(s, &r->st);
    if (steps_before_free <= 0) {
        CHECK(r->st.num_matchers == 0 && r->st.num_samplers == 0, "%d matchers, %d samplers left",
              r->st.num_matchers, r->st.num_samplers);
        CHECK(r->st.bm.num_used == 0, "%d blocks still used", r->st.bm.num_used);
        CHECK(bm_check(sched_block_manager(s), err, sizeof err) == 0, "%s", err);
    }
    sched_free(s);
}

/* The generated text of sequence i, without a final end-of-generation token. */
static void text_of(const struct run *r, int i, char *buf, size_t cap)
{
    size_t len = 0;
    for (int k = 0; k < r->n[i]; k++) {
        if (k == r->n[i] - 1 && model_is_eog(g_model, r->out[i][k])) break;
        char piece[256];
        int n = tok_token_bytes(g_model->tok, r->out[i][k], false, piece, sizeof piece);
        if (n > (int)sizeof piece) n = (int)sizeof piece;
        for (int b = 0; b < n && len + 1 < cap; b++) buf[len++] = piece[b];
    }
    buf[len] = 0;
}

static bool is_regex_match(const char *t)
{
    if (strlen(t) != 8 || t[3] != '-') return false;
    for (int i = 0; i < 8; i++)
        if (i != 3 && !isdigit((unsigned char)t[i])) return false;
    return true;
}

static void check_schema_value(const char *t, int i)
{
    cJSON *v = cJSON_Parse(t);
    CHECK(cJSON_IsObject(v), "seq %d: not a JSON object: %s", i, t);
    if (!cJSON_IsObject(v)) { cJSON_Delete(v); return; }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(v, "name"), *age = cJSON_GetObjectItemCaseSensitive(v, "age"),
                *pets = cJSON_GetObjectItemCaseSensitive(v, "pets"), *it;
    CHECK(cJSON_GetArraySize(v) == 3, "seq %d: %d members: %s", i, cJSON_GetArraySize(v), t);
    CHECK(cJSON_IsString(name) && strlen(name->valuestring) <= 12, "seq %d: name: %s", i, t);
    CHECK(cJSON_IsNumber(age) && age->valuedouble == (int)age->valuedouble && age->valuedouble >= 0 &&
              age->valuedouble <= 120, "seq %d: age: %s", i, t);
    CHECK(cJSON_IsArray(pets) && cJSON_GetArraySize(pets) <= 3, "seq %d: pets: %s", i, t);
    cJSON_ArrayForEach(it, pets)
        CHECK(cJSON_IsString(it) && (!strcmp(it->valuestring, "cat") || !strcmp(it->valuestring, "dog") ||
                                     !strcmp(it->valuestring, "fish")), "seq %d: pet: %s", i, t);
    cJSON_Delete(v);
}

/* Every constrained output matches its grammar and ended with an end token. */
static void check_grammars(const struct run *r, const char *what)
{
    char t[4096];
    for (int i = 0; i < NSEQ; i++) {
        if (SEQS[i].kind == K_NONE) continue;
        text_of(r, i, t, sizeof t);
        printf("  %s seq %d: %s\n", what, i, t);
        if (SEQS[i].kind == K_OBJECT && r->finish[i] == FINISH_LENGTH) {
            CHECK(r->n[i] == GEN && t[strspn(t, " \t\n\r")] == '{', "%s seq %d: a cut object: %s", what, i, t);
            continue;
        }
        CHECK(r->finish[i] == FINISH_STOP, "%s seq %d: finish %d (%s): %s", what, i, r->finish[i],
              r->error[i] ? r->error[i] : "", t);
        if (r->finish[i] != FINISH_STOP) continue;
        CHECK(r->n[i] > 0 && model_is_eog(g_model, r->out[i][r->n[i] - 1]), "%s seq %d: no end token", what, i);
        switch (SEQS[i].kind) {
        case K_CHOICE: {
            bool ok = false;
            for (size_t c = 0; c < sizeof COLORS / sizeof *COLORS; c++) ok = ok || !strcmp(t, COLORS[c]);
            CHECK(ok, "%s seq %d: '%s' is not a choice", what, i, t);
            break;
        }
        case K_SCHEMA: check_schema_value(t, i); break;
        case K_REGEX: CHECK(is_regex_match(t), "%s seq %d: '%s' does not match %s", what, i, t, REGEX); break;
        case K_OBJECT: {
            cJSON *v = cJSON_Parse(t);
            CHECK(cJSON_IsObject(v), "%s seq %d: not a JSON object: %s", what, i, t);
            cJSON_Delete(v);
            break;
        }
        case K_NONE: break;
        }
    }
}

/* Identical outputs; parted (may be NULL: none allowed) counts the sequences allowed to
 * differ instead. */
static void check_same_or_part(const struct run *a, const struct run *b, unsigned which, const char *what,
                               int *parted)
{
    CHECK(a->after_finish == 0 && b->after_finish == 0, "%s: events after a finish", what);
    for (int i = 0; i < NSEQ; i++) {
        if (!(which >> i & 1)) continue;
        if (parted && (a->n[i] != b->n[i] || memcmp(a->out[i], b->out[i], sizeof a->out[i][0] * (size_t)a->n[i]))) {
            (*parted)++;
            continue;
        }
        CHECK(a->finish[i] == b->finish[i], "%s seq %d: finish %d vs %d", what, i, a->finish[i], b->finish[i]);
        CHECK(a->n[i] == b->n[i], "%s seq %d: %d vs %d tokens", what, i, a->n[i], b->n[i]);
        for (int k = 0; k < a->n[i] && k < b->n[i]; k++)
            if (a->out[i][k] != b->out[i][k]) {
                CHECK(0, "%s seq %d token %d: %d vs %d", what, i, k, a->out[i][k], b->out[i][k]);
                break;
            }
    }
}

static void check_same(const struct run *a, const struct run *b, unsigned which, const char *what)
{
    check_same_or_part(a, b, which, what, NULL);
}

static struct run g_ref; /* everything, overlap off, a pool that fits all */
static bool g_have_ref;

static void test_reference(void)
{
    struct sched_config cfg = base_cfg(SCHED_OVERLAP_OFF);
    run_batch(&cfg, (1u << NSEQ) - 1, 0, &g_ref);
    check_grammars(&g_ref, "reference");
    CHECK(g_ref.st.masked_rows > 0 && g_ref.st.mask_ns > 0, "masked rows %llu, %llu ns",
          (unsigned long long)g_ref.st.masked_rows, (unsigned long long)g_ref.st.mask_ns);
    CHECK(g_ref.most_matchers == 6, "at most %d matchers live, 6 constrained sequences", g_ref.most_matchers);
    CHECK(g_ref.after_finish == 0, "events after a finish");
    printf("  %llu masked rows in %llu steps, %.1f us per mask\n", (unsigned long long)g_ref.st.masked_rows,
           (unsigned long long)g_ref.st.steps, g_ref.st.mask_ns / 1e3 / (double)(g_ref.st.masked_rows + !g_ref.st.masked_rows));
    g_have_ref = true;
}

/* Masks are per row: the unconstrained sequences are what they are alone. */
static void test_unconstrained_neighbours(void)
{
    unsigned free_only = 0;
    for (int i = 0; i < NSEQ; i++) free_only |= (unsigned)(SEQS[i].kind == K_NONE) << i;
    struct sched_config cfg = base_cfg(SCHED_OVERLAP_OFF);
    static struct run r;
    run_batch(&cfg, free_only, 0, &r);
    CHECK(r.st.masked_rows == 0, "%llu masked rows without a grammar", (unsigned long long)r.st.masked_rows);
    if (test_backend_real_gpu(g_device)) { /* other batches, other cuBLAS kernels: other rounding */
        int parted = 0;
        check_same_or_part(&r, &g_ref, free_only, "unconstrained alone vs mixed", &parted);
        CHECK(parted <= 1, "unconstrained alone vs mixed: %d sequences part", parted);
    } else {
        check_same(&r, &g_ref, free_only, "unconstrained alone vs mixed");
    }
}

static void test_overlap(void)
{
    struct sched_config cfg = base_cfg(SCHED_OVERLAP_ON);
    static struct run r;
    run_batch(&cfg, (1u << NSEQ) - 1, 0, &r);
    check_same(&r, &g_ref, (1u << NSEQ) - 1, "overlap on vs off");
    check_grammars(&r, "overlap");
}

static void test_preemption(void)
{
    for (int ov = 0; ov < 2; ov++) {
        struct sched_config cfg = base_cfg(ov ? SCHED_OVERLAP_ON : SCHED_OVERLAP_OFF);
        cfg.enable_chunked_prefill = true;
        cfg.max_num_batched_tokens = 32;
        cfg.backend.num_blocks = SMALL_POOL;
        static struct run r;
        run_batch(&cfg, (1u << NSEQ) - 1, 0, &r);
        CHECK(r.st.preemptions > 0, "no preemption");
        const char *what = ov ? "preemption (overlap)" : "preemption";
        if (g_device == BACKEND_DEVICE_CUDA) { /* prefill shapes change the rounding there */
            int parted = 0;
            check_same_or_part(&r, &g_ref, (1u << NSEQ) - 1, what, &parted);
            CHECK(parted <= 2, "%s: %d sequences part from the reference", what, parted);
            check_grammars(&r, what);
        } else {
            check_same(&r, &g_ref, (1u << NSEQ) - 1, what);
        }
        printf("  %s: %llu preemptions\n", ov ? "overlap" : "no overlap", (unsigned long long)r.st.preemptions);
    }
}

/* Freed with constrained sequences mid-flight (ASan: matchers and grammars all go). */
static void test_free_live(void)
{
    for (int ov = 0; ov < 2; ov++) {
        struct sched_config cfg = base_cfg(ov ? SCHED_OVERLAP_ON : SCHED_OVERLAP_OFF);
        static struct run r;
        run_batch(&cfg, (1u << NSEQ) - 1, 4, &r);
        CHECK(r.st.num_matchers > 0, "no matcher live after 4 steps");
    }
}

/* The mask comes after the logit bias: banning every token that can start "blue" leaves
 * {"blue", "red"} only "red", and leaves {"blue"} nothing at all — that row fails
 * (FINISH_ERROR) and its neighbour goes on. */
static void test_mask_and_bias(void)
{
    char err[ERR_BUF];
    static const char *const two[] = { "blue", "red" }, *const one[] = { "blue" };
    struct grammar *g2 = NULL, *g1 = NULL;
    struct grammar_spec s2 = { .kind = GRAMMAR_CHOICE, .choices = two, .n_choices = 2 };
    struct grammar_spec s1 = { .kind = GRAMMAR_CHOICE, .choices = one, .n_choices = 1 };
    CHECK(grammar_compile(&g2, g_vocab, &s2, err, sizeof err) == 0, "%s", err);
    CHECK(grammar_compile(&g1, g_vocab, &s1, err, sizeof err) == 0, "%s", err);
    int32_t ban[SAMPLER_MAX_LOGIT_BIAS];
    float bias[SAMPLER_MAX_LOGIT_BIAS];
    int n_ban = 0;
    for (int id = 0; id < tok_vocab_size(g_model->tok) && n_ban < SAMPLER_MAX_LOGIT_BIAS; id++) {
        char b[64];
        int len = tok_token_bytes(g_model->tok, id, false, b, sizeof b);
        if (len > 0 && len <= 4 && !tok_is_special(g_model->tok, id) && !memcmp(b, "blue", (size_t)len)) {
            ban[n_ban] = id;
            bias[n_ban++] = -INFINITY;
        }
    }
    CHECK(n_ban > 0 && n_ban < SAMPLER_MAX_LOGIT_BIAS, "%d tokens start \"blue\"", n_ban);
    struct sched_config cfg = base_cfg(SCHED_OVERLAP_ON);
    struct sched *s = NULL;
    if (!g1 || !g2 || sched_create(&s, g_model, &cfg, err, sizeof err)) {
        CHECK(0, "setup: %s", err);
        grammar_unref(g1);
        grammar_unref(g2);
        return;
    }
    static struct run r;
    memset(&r, 0, sizeof r);
    for (int i = 0; i < 3; i++) {
        struct sched_seq_params p;
        sched_seq_params_default(&p);
        p.sp.temperature = 0;
        p.max_tokens = 16;
        p.grammar = i == 0 ? g2 : i == 1 ? g1 : g_grammar[K_CHOICE];
        p.bias_ids = ban;
        p.bias = bias;
        p.n_bias = n_ban;
        CHECK(sched_add(s, g_prompt[0], g_len[0], &p, &r.id[i], err, sizeof err) == 0, "%s", err);
    }
    grammar_unref(g1); /* the scheduler holds its own references */
    grammar_unref(g2);
    for (int steps = 0; sched_has_work(s) && steps < 1000; steps++)
        if (sched_step(s, on_output, &r, err, sizeof err)) {
            CHECK(0, "sched_step: %s", err);
            break;
        }
    char t[256];
    text_of(&r, 0, t, sizeof t);
    CHECK(r.finish[0] == FINISH_STOP && !strcmp(t, "red"), "{blue, red} with 'blue' banned: '%s' (finish %d)", t,
          r.finish[0]);
    CHECK(r.finish[1] == FINISH_ERROR && r.n[1] == 0 && r.error[1], "{blue} with 'blue' banned: finish %d, %d tokens",
          r.finish[1], r.n[1]);
    text_of(&r, 2, t, sizeof t);
    CHECK(r.finish[2] == FINISH_STOP && strcmp(t, "blue") != 0, "colours without blue: '%s' (finish %d)", t,
          r.finish[2]);
    CHECK(r.after_finish == 0, "events after a finish");
    sched_free(s);
}

/* A grammar whose parses multiply (after k dashes, 2^k pending endings), with only the
 * "-" token allowed: the matcher reaches its work bound (SmolLM2 has tokens of 16 and
 * more dashes, so already the first mask's walk does) and the sequence ends with an
 * error saying so (not "out of memory", not a hang). */
static void test_too_ambiguous(void)
{
    char err[ERR_BUF];
    static const char GBNF[] = "root ::= s\ns ::= \"-\" s \"a\" | \"-\" s \"b\" | \"\"";
    struct grammar_spec spec = { .kind = GRAMMAR_GBNF, .text = GBNF, .text_len = sizeof GBNF - 1 };
    struct grammar *g = NULL;
    CHECK(grammar_compile(&g, g_vocab, &spec, err, sizeof err) == 0, "compile: %s", err);
    int32_t dash = -1;
    for (int id = 0; id < tok_vocab_size(g_model->tok) && dash < 0; id++) {
        char b[8];
        if (!tok_is_special(g_model->tok, id) && tok_token_bytes(g_model->tok, id, false, b, sizeof b) == 1 &&
            b[0] == '-')
            dash = id;
    }
    CHECK(dash >= 0, "no \"-\" token");
    struct sched_config cfg = base_cfg(SCHED_OVERLAP_ON);
    struct sched *s = NULL;
    if (!g || dash < 0 || sched_create(&s, g_model, &cfg, err, sizeof err)) {
        CHECK(0, "setup: %s", err);
        grammar_unref(g);
        return;
    }
    static struct run r;
    memset(&r, 0, sizeof r);
    struct sched_seq_params p;
    sched_seq_params_default(&p);
    p.sp.temperature = 0;
    p.max_tokens = GEN;
    p.grammar = g;
    p.allowed_ids = &dash;
    p.n_allowed = 1;
    CHECK(sched_add(s, g_prompt[0], g_len[0], &p, &r.id[0], err, sizeof err) == 0, "%s", err);
    grammar_unref(g);
    for (int steps = 0; sched_has_work(s) && steps < 1000; steps++)
        if (sched_step(s, on_output, &r, err, sizeof err)) {
            CHECK(0, "sched_step: %s", err);
            break;
        }
    printf("    %d dashes, then: %s\n", r.n[0], r.error[0] ? r.error[0] : "(no error)");
    CHECK(r.finish[0] == FINISH_ERROR && r.n[0] < GEN, "finish %d after %d tokens", r.finish[0], r.n[0]);
    CHECK(r.error[0] && strstr(r.error[0], "too ambiguous"), "error: %s", r.error[0] ? r.error[0] : "(none)");
    sched_free(s);
}

/* Runs prompt 2 alone (greedy, GEN tokens, overlap on) with grammar g, deferred until
 * start_token when deferred. */
static void run_one(struct grammar *g, bool deferred, int32_t start_token, struct run *r)
{
    char err[ERR_BUF];
    memset(r, 0, sizeof *r);
    struct sched_config cfg = base_cfg(SCHED_OVERLAP_ON);
    struct sched *s = NULL;
    if (sched_create(&s, g_model, &cfg, err, sizeof err)) {
        CHECK(0, "sched_create: %s", err);
        return;
    }
    struct sched_seq_params p;
    sched_seq_params_default(&p);
    p.sp.temperature = 0;
    p.max_tokens = GEN;
    p.grammar = g;
    p.grammar_deferred = deferred;
    p.grammar_start_token = start_token;
    CHECK(sched_add(s, g_prompt[2], g_len[2], &p, &r->id[0], err, sizeof err) == 0, "sched_add: %s", err);
    for (int steps = 0; sched_has_work(s) && steps < 1000; steps++)
        if (sched_step(s, on_output, r, err, sizeof err)) {
            CHECK(0, "sched_step: %s", err);
            break;
        }
    sched_free(s);
}

/* A deferred grammar (a reasoning model's answer after "</think>"): the output is free
 * up to and including the start token and matches the grammar after it; a start token
 * that never comes leaves the output unconstrained, token for token. */
static void test_deferred(void)
{
    static struct run free_run, after, never;
    run_one(NULL, false, 0, &free_run);
    CHECK(free_run.n[0] >= 8, "unconstrained run: %d tokens", free_run.n[0]);
    /* the start token: the first greedy token from the 3rd on that did not come before */
    int k = -1;
    for (int i = 2; i < free_run.n[0] - 1 && k < 0; i++) {
        bool seen = model_is_eog(g_model, free_run.out[0][i]);
        for (int j = 0; j < i; j++) seen |= free_run.out[0][j] == free_run.out[0][i];
        if (!seen) k = i;
    }
    CHECK(k > 0, "no start token in the unconstrained output");
    if (k < 0) return;
    run_one(g_grammar[K_CHOICE], true, free_run.out[0][k], &after);
    CHECK(after.n[0] > k + 1 && !memcmp(after.out[0], free_run.out[0], sizeof(int32_t) * (size_t)(k + 1)),
          "the %d tokens up to the start token differ from the free run", k + 1);
    char text[512];
    size_t len = 0;
    for (int i = k + 1; i < after.n[0] && !model_is_eog(g_model, after.out[0][i]); i++) {
        int n = tok_token_bytes(g_model->tok, after.out[0][i], false, text + len, (int)(sizeof text - 1 - len));
        if (n > 0) len += (size_t)n;
    }
    text[len] = 0;
    bool colour = false;
    for (size_t c = 0; c < sizeof COLORS / sizeof *COLORS; c++) colour |= !strcmp(text, COLORS[c]);
    CHECK(after.finish[0] == FINISH_STOP && colour, "after the start token: '%s' (finish %d)", text, after.finish[0]);
    /* a start token the output never has: an id not in the free run */
    int32_t absent = 1000;
    for (bool in = true; in; absent++) {
        in = false;
        for (int i = 0; i < free_run.n[0]; i++) in |= free_run.out[0][i] == absent;
        if (!in) break;
    }
    run_one(g_grammar[K_CHOICE], true, absent, &never);
    CHECK(never.n[0] == free_run.n[0] && never.finish[0] == free_run.finish[0] &&
              !memcmp(never.out[0], free_run.out[0], sizeof(int32_t) * (size_t)free_run.n[0]),
          "a start token that never comes: %d tokens (free run %d)", never.n[0], free_run.n[0]);
}

static int compile(enum kind k, const struct grammar_spec *spec)
{
    char err[ERR_BUF];
    int rc = grammar_compile(&g_grammar[k], g_vocab, spec, err, sizeof err);
    CHECK(rc == 0, "grammar_compile kind %d: %s", k, err);
    return rc;
}

static int setup(void)
{
    char err[ERR_BUF];
    if (grammar_vocab_create(&g_vocab, g_model->tok, g_model->eog_ids, g_model->n_eog, err, sizeof err)) {
        fprintf(stderr, "grammar_vocab_create: %s\n", err);
        return -1;
    }
    struct grammar_spec choice = { .kind = GRAMMAR_CHOICE, .choices = COLORS,
                                   .n_choices = (int)(sizeof COLORS / sizeof *COLORS) };
    struct grammar_spec schema = { .kind = GRAMMAR_JSON_SCHEMA, .text = SCHEMA, .text_len = strlen(SCHEMA) };
    struct grammar_spec regex = { .kind = GRAMMAR_REGEX, .text = REGEX, .text_len = strlen(REGEX) };
    struct grammar_spec object = { .kind = GRAMMAR_JSON_OBJECT };
    if (compile(K_CHOICE, &choice) || compile(K_SCHEMA, &schema) || compile(K_REGEX, &regex) ||
        compile(K_OBJECT, &object))
        return -1;
    for (int i = 0; i < NSEQ; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n"
                 "<|im_start|>assistant\n", SEQS[i].question);
        g_len[i] = tok_encode(g_model->tok, text, strlen(text), false, true, g_prompt[i], 96);
        if (g_len[i] <= 0 || g_len[i] > 96) {
            fprintf(stderr, "prompt %d: %d tokens\n", i, g_len[i]);
            return -1;
        }
    }
    return 0;
}

int main(void)
{
    if (!test_backend_env(&g_device, MODEL_REL, 0, &g_model)) return 1;
    printf("device %s\n", backend_device_name(g_device));
    g_random_model = getenv("TESSERA_TEST_MODEL") != NULL;
    if (setup()) {
        printf("0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_reference);
    if (g_have_ref) {
        RUN(test_unconstrained_neighbours);
        RUN(test_overlap);
        RUN(test_preemption);
    }
    RUN(test_mask_and_bias);
    RUN(test_too_ambiguous);
    RUN(test_deferred);
    RUN(test_free_live);
    for (int k = 0; k < 5; k++) grammar_unref(g_grammar[k]);
    grammar_vocab_free(g_vocab);
    model_free(g_model);
    return test_summary();
}

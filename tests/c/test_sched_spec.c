/* test_sched_spec.c — speculative decoding (n-gram proposals) in the scheduler, on the real
 * default model.
 *
 * The property under test: speculation changes how many steps a sequence takes, never what
 * it produces. Eight sequences whose prompts repeat a random segment (so the n-gram
 * proposer finds matches in the prompt, and in the output once the model copies) mix
 * greedy and seeded sampling, logprobs, allowed_token_ids (a mask on every speculative
 * row; one sequence over four ids, whose output soon repeats on any model), a stop id,
 * ignore_eos, short max_tokens, min_tokens and penalties (each speculative row counting
 * the proposed tokens before it; greedy and seeded). They run once without speculation
 * (the reference) and then with it: together, and with chunked prefill, a KV pool small
 * enough to preempt, prefix caching and overlap requested (speculation resolves it to
 * off). Tokens, logprobs and finish reasons must be the reference's — exactly on the CPU
 * — while the proposals are really used (proposed and kept tokens counted; on the CPU
 * each kept one saves a sequence-step). The block manager is checked after every step
 * (the slots of rejected rows are given back), and no block is held at the end. Also: no
 * proposals without spare logits rows; a sequence whose penalties decide its choices,
 * eight whose end token comes up as soon as min_tokens allows it (each speculative row
 * masks the end only while its own token is short), and eight copying prompts that hold
 * their bad words (each row masks the words the proposed tokens before it would complete)
 * are proposed for, keep tokens and give the reference's output.
 *
 * TESSERA_TEST_DEVICE=cuda (TESSERA_CUDA_LIB=build/libtessera-cuda-emu.so,
 * TESSERA_TEST_MODEL=build/testmodels/llama3-tiny-hd64) runs the same on the emulated CUDA
 * backend: a speculative step meets the prefill attention kernels where the reference
 * decoded, so rounding differs; a greedy sequence may part from the reference at a near tie
 * (its two best logprobs within 0.05 and the other one chosen), a seeded one anywhere but
 * for at most 2 sequences in all, and logprobs agree within 0.05 (test_scheduler.c allows
 * 0.02 over its 8-token outputs; over these 40, measured: up to 0.029). On a real GPU both
 * bounds are 0.1: an H200 gave 0.053 on a -9.4 logprob (a token that far down carries its
 * logit's absolute rounding, BF16 activations rounded to ~2^-9 of logits of ~10).
 */
#define _POSIX_C_SOURCE 200809L
#include "engine/scheduler.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "test.h"
#include "test_backend_env.h"
#include "util/err.h"

#include <math.h>
#include <stdlib.h>

#define MODEL_REL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define NSEQ 8
#define GEN 40
#define MAX_LEN 192

static struct model *g_model;
static enum backend_device g_device = BACKEND_DEVICE_CPU;
static int32_t g_prompt[NSEQ][96];
static int g_len[NSEQ];
static int32_t g_allowed[96], g_allowed4[4]; /* sequence 2's allowed ids; 7's and the pair's */
static int32_t g_allowed5[5];                 /* g_allowed4 and the end token (test_min_tokens) */
static int32_t g_bad[NSEQ][7];                /* sequence i's bad words (test_bad_words) */
/* which sequences seq_params gives: the mix, test_min_tokens' or test_bad_words' */
enum seq_case { CASE_MIX, CASE_MIN_TOKENS, CASE_BAD_WORDS, CASE_GRAMMAR };
static enum seq_case g_case;
static struct grammar *g_grammar[2];          /* test_grammar's: a JSON schema, a choice */
static int g_n_allowed;

struct run {
    int64_t id[NSEQ];
    int32_t out[NSEQ][GEN];
    float lp[NSEQ][GEN][2];   /* the token's logprob, the best alternative's */
    int32_t second[NSEQ][GEN];/* the best alternative other than the token */
    int n[NSEQ];
    enum sched_finish finish[NSEQ];
    int after_finish;
    int steps;
    int seq_steps;            /* sequence-steps that produced tokens (all sequences) */
    int last_step[NSEQ];      /* the step of sequence i's last token event, + 1 */
    struct sched_stats st;
    const struct sched_config *cfg; /* as the scheduler resolved it (valid during the run) */
    bool overlap_off;
};

static void on_output(void *ud, const struct sched_output *o)
{
    struct run *r = ud;
    for (int i = 0; i < NSEQ; i++) {
        if (r->id[i] != o->seq_id) continue;
        if (r->finish[i] != FINISH_NONE) r->after_finish++;
        if (o->token >= 0 && r->last_step[i] != r->steps + 1) {
            r->last_step[i] = r->steps + 1;
            r->seq_steps++;
        }
        if (o->token >= 0 && r->n[i] < GEN) {
            int k = r->n[i]++;
            r->out[i][k] = o->token;
            if (o->logprob) {
                r->lp[i][k][0] = o->logprob->logprob;
                const struct sched_logprob *l = o->logprob;
                int alt = l->n_top > 0 && l->top_ids[0] != o->token ? 0 : 1;
                r->second[i][k] = alt < l->n_top ? l->top_ids[alt] : -1;
                r->lp[i][k][1] = alt < l->n_top ? l->top_logprobs[alt] : -INFINITY;
            }
        }
        if (o->finished) r->finish[i] = o->finish;
        return;
    }
}

/* Prompt i: a random segment of 6 + i tokens three times, then its first two tokens again. */
static void make_prompts(void)
{
    uint32_t x = 4242;
    int span = g_model->cfg.vocab_size / 2;
    for (int i = 0; i < NSEQ; i++) {
        int seg = 6 + i, n = 0;
        int32_t s[16];
        for (int k = 0; k < seg; k++) {
            x = x * 1664525u + 1013904223u;
            s[k] = 100 + (int32_t)((x >> 8) % (uint32_t)span);
        }
        for (int rep = 0; rep < 3; rep++)
            for (int k = 0; k < seg; k++) g_prompt[i][n++] = s[k];
        g_prompt[i][n++] = s[0];
        g_prompt[i][n++] = s[1];
        g_len[i] = n;
    }
    /* sequence 2 may only use its own prompt's tokens (and the end token, if any) */
    g_n_allowed = 0;
    for (int k = 0; k < 8; k++) g_allowed[g_n_allowed++] = g_prompt[2][k];
    if (g_model->n_eog > 0) g_allowed[g_n_allowed++] = g_model->eog_ids[0];
    /* four ids: any model's output over them soon repeats, so proposals come even where
     * the model does not copy its prompt (the random test models on the GPU pass) */
    memcpy(g_allowed4, g_prompt[7], sizeof g_allowed4);
    memcpy(g_allowed5, g_allowed4, sizeof g_allowed4);
    g_allowed5[4] = g_model->n_eog > 0 ? g_model->eog_ids[0] : g_allowed4[0];
    /* two words the copied segment contains: its tokens 2, 3 and 4, 5, 6 (wrapping) */
    for (int i = 0; i < NSEQ; i++) {
        const int32_t *seg = g_prompt[i];
        const int32_t words[7] = { 2, seg[2], seg[3], 3, seg[4], seg[5], seg[6 % (6 + i)] };
        memcpy(g_bad[i], words, sizeof words);
    }
}

static void seq_params(int i, struct sched_seq_params *sp)
{
    sched_seq_params_default(sp);
    sp->max_tokens = GEN;
    sp->logprobs = 2;
    sp->sp.temperature = 0;
    if (g_case == CASE_GRAMMAR) { /* structured output that repeats itself; 2 and 3 seeded */
        sp->grammar = g_grammar[i % 2];
        if (i == 2 || i == 3) {
            sp->sp.temperature = 0.8f;
            sp->sp.seed = 300 + (uint64_t)i;
        }
        return;
    }
    if (g_case == CASE_BAD_WORDS) { /* greedy, copying its prompt but for two words of it */
        sp->bad_words = g_bad[i];
        sp->bad_words_len = 7;
        return;
    }
    if (g_case == CASE_MIN_TOKENS) { /* greedy over four ids and the end token, each used one
                                      * penalised: the end token, never drawn, comes up as soon
                                      * as min_tokens allows it */
        sp->allowed_ids = g_allowed5;
        sp->n_allowed = 5;
        sp->min_tokens = 5 + 3 * i;
        sp->sp.frequency_penalty = 2.0f;
        sp->sp.presence_penalty = 2.0f;
        return;
    }
    switch (i) {
    case 1: case 5: /* seeded sampling (5: with a frequency penalty) */
        sp->sp.temperature = 0.8f;
        sp->sp.top_p = 0.95f;
        sp->sp.seed = 100 + (uint64_t)i;
        if (i == 5) sp->sp.frequency_penalty = 0.5f;
        break;
    case 2:
        sp->allowed_ids = g_allowed;
        sp->n_allowed = g_n_allowed;
        break;
    case 3: /* penalties, greedy over four ids: the output cycles through them, so proposals
             * are kept, and each row's choice turns on the counts of the proposed tokens
             * before it */
        sp->sp.repetition_penalty = 1.05f;
        sp->sp.presence_penalty = 0.3f;
        sp->sp.frequency_penalty = 1.0f;
        sp->allowed_ids = g_allowed4;
        sp->n_allowed = 4;
        break;
    case 4:
        sp->max_tokens = 11;
        sp->ignore_eos = true;
        break;
    case 6: /* ends at the prompt's 4th token, which the proposals are full of */
        sp->stop_ids[0] = g_prompt[6][3];
        sp->n_stop_ids = 1;
        break;
    case 7: /* seeded over four ids, nearly uniform: draws that rounding hardly moves, on
             * any model, and that each speculative row must take from its own step */
        sp->sp.temperature = 5.0f;
        sp->sp.seed = 107;
        sp->min_tokens = 12;
        sp->ignore_eos = true;
        sp->allowed_ids = g_allowed4;
        sp->n_allowed = 4;
        break;
    }
}

static struct sched_config base_cfg(bool spec)
{
    struct sched_config c;
    sched_config_default(&c);
    c.max_num_seqs = 16;
    c.max_num_batched_tokens = 256;
    c.max_model_len = MAX_LEN;
    c.enable_prefix_caching = false;
    c.enable_chunked_prefill = false;
    c.overlap = SCHED_OVERLAP_OFF;
    c.backend.device = g_device;
    c.backend.tensor_parallel_size = test_backend_tp();
    c.backend.num_blocks = 128;
    c.backend.n_threads = 2;
    c.backend.kv_dtype_auto = false;
    c.backend.kv_dtype = KV_F16;
    if (spec) c.spec = (struct spec_config){ .num_tokens = 5, .lookup_min = 1, .lookup_max = 3 };
    return c;
}

/* Runs sequences [0, n) of the mask `which` together under cfg. */
static void run(const struct sched_config *cfg, unsigned which, struct run *r, const char *what)
{
    char err[ERR_BUF];
    memset(r, 0, sizeof *r);
    struct sched *s = NULL;
    if (sched_create(&s, g_model, cfg, err, sizeof err)) {
        CHECK(0, "%s: sched_create: %s", what, err);
        return;
    }
    r->overlap_off = sched_get_config(s)->overlap == SCHED_OVERLAP_OFF;
    for (int i = 0; i < NSEQ; i++) {
        if (!(which & (1u << i))) continue;
        struct sched_seq_params sp;
        seq_params(i, &sp);
        if (sched_add(s, g_prompt[i], g_len[i], &sp, &r->id[i], err, sizeof err)) CHECK(0, "%s: add %d: %s", what, i, err);
    }
    while (sched_has_work(s) && r->steps < 10000) {
        if (sched_step(s, on_output, r, err, sizeof err)) {
            CHECK(0, "%s: sched_step: %s", what, err);
            break;
        }
        r->steps++;
        if (bm_check(sched_block_manager(s), err, sizeof err)) {
            CHECK(0, "%s: step %d: %s", what, r->steps, err);
            break;
        }
    }
    sched_get_stats(s, &r->st);
    CHECK(r->st.num_running == 0 && r->st.num_waiting == 0 && r->st.bm.num_used == 0,
          "%s: %d running, %d waiting, %d blocks used at the end", what, r->st.num_running, r->st.num_waiting,
          r->st.bm.num_used);
    CHECK(r->after_finish == 0, "%s: events after a finish", what);
    sched_free(s);
}

/* r against the reference, sequence by sequence (see the file comment for the GPU). */
static void check_same(const struct run *ref, const struct run *r, unsigned which, const char *what)
{
    const bool exact = g_device != BACKEND_DEVICE_CUDA;
    const float tol = test_backend_real_gpu(g_device) ? 0.1f : 0.05f; /* GPU: logprobs, near ties (file comment) */
    int parted_seeded = 0;
    for (int i = 0; i < NSEQ; i++) {
        if (!(which & (1u << i))) continue;
        CHECK(r->finish[i] != FINISH_NONE, "%s: sequence %d did not finish", what, i);
        struct sched_seq_params sp;
        seq_params(i, &sp);
        /* seeded ones may part on the GPU; 7 (nearly uniform over four ids) may not */
        bool seeded = sp.sp.temperature > 0 && i != 7, parted = false;
        int k = 0;
        for (; k < r->n[i] && k < ref->n[i]; k++) {
            if (r->out[i][k] != ref->out[i][k]) {
                if (!exact && seeded) parted = true;
                else if (!exact && r->out[i][k] == ref->second[i][k] && ref->lp[i][k][0] - ref->lp[i][k][1] <= tol)
                    parted = true;
                else
                    CHECK(0, "%s: sequence %d token %d: %d, reference %d (logprob %.4f; best other %d, %.4f)", what,
                          i, k, r->out[i][k], ref->out[i][k], ref->lp[i][k][0], ref->second[i][k], ref->lp[i][k][1]);
                break;
            }
            if (exact)
                CHECK(r->lp[i][k][0] == ref->lp[i][k][0], "%s: sequence %d logprob %d: %.9g vs %.9g", what, i, k,
                      r->lp[i][k][0], ref->lp[i][k][0]);
            else
                CHECK(fabsf(r->lp[i][k][0] - ref->lp[i][k][0]) <= tol, "%s: sequence %d logprob %d: %g vs %g",
                      what, i, k, r->lp[i][k][0], ref->lp[i][k][0]);
        }
        if (parted) {
            printf("  %s: sequence %d parts from the reference at token %d (GPU rounding)\n", what, i, k);
            parted_seeded += seeded;
            continue;
        }
        CHECK(r->n[i] == ref->n[i], "%s: sequence %d made %d tokens, reference %d", what, i, r->n[i], ref->n[i]);
        CHECK(r->finish[i] == ref->finish[i], "%s: sequence %d finish %d, reference %d", what, i, r->finish[i],
              ref->finish[i]);
    }
    CHECK(parted_seeded <= 2, "%s: %d seeded sequences part from the reference", what, parted_seeded);
}

static void test_same_outputs(void)
{
    static struct run ref, got;
    const unsigned all = (1u << NSEQ) - 1;
    struct sched_config cfg = base_cfg(false);
    run(&cfg, all, &ref, "reference");
    CHECK(ref.st.spec_drafts == 0, "reference: %llu proposals without speculation",
          (unsigned long long)ref.st.spec_drafts);
    CHECK(ref.finish[4] == FINISH_LENGTH && ref.n[4] == 11, "reference: max_tokens 11 gave %d tokens", ref.n[4]);
    CHECK(ref.n[7] >= 12, "reference: min_tokens 12 gave %d tokens", ref.n[7]);
    for (int k = 0; k < ref.n[2]; k++) {
        bool ok = false;
        for (int j = 0; j < g_n_allowed; j++) ok = ok || ref.out[2][k] == g_allowed[j];
        CHECK(ok, "reference: sequence 2 token %d (%d) is not an allowed id", k, ref.out[2][k]);
    }

    cfg = base_cfg(true);
    run(&cfg, all, &got, "speculative");
    check_same(&ref, &got, all, "speculative");
    printf("  speculative: %d steps (reference %d), %d sequence-steps with tokens (reference %d), %llu proposals, "
           "%llu of %llu proposed tokens kept\n", got.steps, ref.steps, got.seq_steps, ref.seq_steps,
           (unsigned long long)got.st.spec_drafts, (unsigned long long)got.st.spec_accepted_tokens,
           (unsigned long long)got.st.spec_draft_tokens);
    CHECK(got.st.spec_drafts > 0 && got.st.spec_accepted_tokens > 0, "speculative: nothing proposed or kept");
    CHECK(got.st.spec_accepted_tokens <= got.st.spec_draft_tokens, "speculative: more kept than proposed");
    /* the same tokens in fewer sequence-steps: each kept proposed token saves one (on the
     * GPU a parted sequence may end at another length) */
    if (g_device != BACKEND_DEVICE_CUDA)
        CHECK(got.seq_steps == ref.seq_steps - (int)got.st.spec_accepted_tokens,
              "speculative: %d sequence-steps, reference %d, %llu proposed tokens kept", got.seq_steps,
              ref.seq_steps, (unsigned long long)got.st.spec_accepted_tokens);

    /* chunked prefill of 32-token steps, 14 KV blocks (preemptions), prefix caching, and
     * overlap asked for: speculation turns it off */
    cfg = base_cfg(true);
    cfg.enable_chunked_prefill = true;
    cfg.max_num_batched_tokens = 32;
    cfg.enable_prefix_caching = true;
    cfg.backend.num_blocks = 14;
    cfg.overlap = SCHED_OVERLAP_ON;
    run(&cfg, all, &got, "speculative+chunked+preemption+prefix");
    CHECK(got.overlap_off, "overlap stayed on with speculation");
    check_same(&ref, &got, all, "speculative+chunked+preemption+prefix");
    CHECK(got.st.preemptions > 0, "no preemption with 14 blocks");
    CHECK(got.st.spec_accepted_tokens > 0, "speculative+chunked+preemption+prefix: nothing kept");
    printf("  speculative+chunked+preemption+prefix: %d steps, %llu preemptions, %llu of %llu kept\n", got.steps,
           (unsigned long long)got.st.preemptions, (unsigned long long)got.st.spec_accepted_tokens,
           (unsigned long long)got.st.spec_draft_tokens);
}

/* Two greedy ignore_eos sequences of GEN tokens over g_allowed4 under max_num_seqs rows: checks after each
 * step that the tokens proposed never outnumber the logits rows the step had to spare;
 * returns the proposed tokens. */
static unsigned long long run_pair(int max_num_seqs, int disable_by_batch_size)
{
    char err[ERR_BUF];
    struct sched_config cfg = base_cfg(true);
    cfg.max_num_seqs = max_num_seqs;
    cfg.spec.disable_by_batch_size = disable_by_batch_size;
    struct sched *s = NULL;
    if (sched_create(&s, g_model, &cfg, err, sizeof err)) {
        CHECK(0, "sched_create: %s", err);
        return 0;
    }
    for (int i = 0; i < 2; i++) {
        struct sched_seq_params sp;
        sched_seq_params_default(&sp);
        sp.sp.temperature = 0;
        sp.max_tokens = GEN;
        sp.ignore_eos = true;
        sp.allowed_ids = g_allowed4;
        sp.n_allowed = 4;
        int64_t id;
        if (sched_add(s, g_prompt[i], g_len[i], &sp, &id, err, sizeof err)) CHECK(0, "add %d: %s", i, err);
    }
    struct sched_stats before, after;
    for (int steps = 0; sched_has_work(s) && steps < 1000; steps++) {
        sched_get_stats(s, &before);
        if (sched_step(s, NULL, NULL, err, sizeof err)) {
            CHECK(0, "sched_step: %s", err);
            break;
        }
        sched_get_stats(s, &after);
        uint64_t spare = before.num_running ? (uint64_t)(max_num_seqs - before.num_running) : 0;
        CHECK(after.spec_draft_tokens - before.spec_draft_tokens <= spare,
              "max_num_seqs %d, step %d: %llu tokens proposed with %llu rows to spare", max_num_seqs, steps,
              (unsigned long long)(after.spec_draft_tokens - before.spec_draft_tokens), (unsigned long long)spare);
    }
    sched_free(s);
    return (unsigned long long)after.spec_draft_tokens;
}

/* Runs the sequences of `which` as seq_params gives them under case c, without (ref) and
 * with (got) speculation, and checks that the outputs are the same and that proposed
 * tokens were kept. */
static void run_case(enum seq_case c, unsigned which, struct run *ref, struct run *got, const char *what)
{
    char label[64];
    snprintf(label, sizeof label, "%s, reference", what);
    g_case = c;
    struct sched_config cfg = base_cfg(false);
    run(&cfg, which, ref, label);
    cfg = base_cfg(true);
    run(&cfg, which, got, what);
    check_same(ref, got, which, what);
    g_case = CASE_MIX;
    printf("  %s: %llu of %llu proposed tokens kept\n", what, (unsigned long long)got->st.spec_accepted_tokens,
           (unsigned long long)got->st.spec_draft_tokens);
    CHECK(got->st.spec_drafts > 0 && got->st.spec_accepted_tokens > 0, "%s: %llu proposals, %llu tokens kept", what,
          (unsigned long long)got->st.spec_drafts, (unsigned long long)got->st.spec_accepted_tokens);
}

/* The sequence with penalties alone: proposed for, tokens kept, the reference's output
 * (each speculative row's penalties count the proposed tokens before it). */
static void test_penalties(void)
{
    static struct run ref, got;
    run_case(CASE_MIX, 1u << 3, &ref, &got, "penalties");
}

/* min_tokens with proposals: a speculative row keeps the end token out only while its
 * own token is short of min_tokens, so the sequences end where the reference's do. */
static void test_min_tokens(void)
{
    static struct run ref, got;
    const unsigned all = (1u << NSEQ) - 1;
    if (g_model->n_eog == 0) {
        printf("  skip: the model has no end token\n");
        return;
    }
    run_case(CASE_MIN_TOKENS, all, &ref, &got, "min_tokens");
    int ended = 0;
    for (int i = 0; i < NSEQ; i++) {
        CHECK(ref.n[i] >= 5 + 3 * i, "min_tokens: sequence %d ended after %d tokens", i, ref.n[i]);
        ended += ref.finish[i] == FINISH_STOP;
    }
    CHECK(ended >= NSEQ / 2, "min_tokens: only %d of %d sequences ended on the end token", ended, NSEQ);
}

/* Whether out[0, n) contains the word w[0, len). */
static bool contains(const int32_t *out, int n, const int32_t *w, int len)
{
    for (int k = 0; k + len <= n; k++)
        if (!memcmp(out + k, w, sizeof *w * (size_t)len)) return true;
    return false;
}

/* Bad words with proposals: the proposals copy the prompt, which holds the words; a
 * speculative row keeps out the word that the proposed tokens before it would complete. */
static void test_bad_words(void)
{
    static struct run ref, got;
    const unsigned all = (1u << NSEQ) - 1;
    run_case(CASE_BAD_WORDS, all, &ref, &got, "bad_words");
    for (int i = 0; i < NSEQ; i++)
        CHECK(!contains(got.out[i], got.n[i], g_bad[i] + 1, 2) && !contains(got.out[i], got.n[i], g_bad[i] + 4, 3),
              "bad_words: sequence %d generated a bad word", i);
}

/* A grammar with proposals: each speculative row's mask is the grammar's after the
 * proposed tokens before it (a copy of the matcher advanced along them). Six objects with
 * the same keys, and one repetitive text to be spelled in tokens of the model's choosing:
 * the output repeats, so proposals are kept. */
static void test_grammar(void)
{
    static const char schema[] =
        "{\"type\":\"array\",\"minItems\":6,\"maxItems\":6,\"items\":{\"type\":\"object\","
        "\"properties\":{\"color\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"size\":{\"enum\":[1,2,3]}},"
        "\"required\":[\"color\",\"size\"],\"additionalProperties\":false}}";
    static const char *const text[] = { "red, green, blue; red, green, blue; red, green, blue; red, green, blue" };
    static struct run ref, got;
    char err[ERR_BUF];
    struct grammar_vocab *v = NULL;
    if (grammar_vocab_create(&v, g_model->tok, g_model->eog_ids, g_model->n_eog, err, sizeof err)) {
        CHECK(0, "grammar_vocab_create: %s", err);
        return;
    }
    struct grammar_spec js = { .kind = GRAMMAR_JSON_SCHEMA, .text = schema, .text_len = strlen(schema) };
    struct grammar_spec ch = { .kind = GRAMMAR_CHOICE, .choices = text, .n_choices = 1 };
    if (grammar_compile(&g_grammar[0], v, &js, err, sizeof err) ||
        grammar_compile(&g_grammar[1], v, &ch, err, sizeof err)) {
        CHECK(0, "grammar_compile: %s", err);
    } else {
        run_case(CASE_GRAMMAR, (1u << NSEQ) - 1, &ref, &got, "grammar");
        for (int i = 0; i < NSEQ; i++)
            CHECK(got.finish[i] == FINISH_STOP || got.finish[i] == FINISH_LENGTH, "grammar: sequence %d finish %d", i,
                  got.finish[i]);
    }
    grammar_unref(g_grammar[0]);
    grammar_unref(g_grammar[1]);
    g_grammar[0] = g_grammar[1] = NULL;
    grammar_vocab_free(v);
}

/* Nothing is proposed where it would take a row another sequence needs. */
static void test_not_proposed(void)
{
    /* the pair runs in step (same length): with two rows never one to spare */
    CHECK(run_pair(2, 0) == 0, "proposals without a spare logits row");
    CHECK(run_pair(3, 0) > 0, "no proposals with a spare logits row");
    /* disable_by_batch_size: none while more sequences than that run, as before at 2 */
    CHECK(run_pair(3, 1) == 0, "proposals with 2 running, disable_by_batch_size 1");
    CHECK(run_pair(3, 2) > 0, "no proposals with 2 running, disable_by_batch_size 2");
}

static void test_config_checked(void)
{
    char err[ERR_BUF];
    struct sched *s = NULL;
    struct sched_config cfg = base_cfg(true);
    cfg.spec.num_tokens = SPEC_MAX_TOKENS + 1;
    CHECK(sched_create(&s, g_model, &cfg, err, sizeof err) == ERR_RANGE, "17 speculative tokens accepted");
    cfg = base_cfg(true);
    cfg.spec.lookup_min = 4;
    CHECK(sched_create(&s, g_model, &cfg, err, sizeof err) == ERR_RANGE, "n-gram 4..3 accepted");
    CHECK(s == NULL, "a scheduler after an error");
}

int main(void)
{
    if (!test_backend_env(&g_device, MODEL_REL, 0, &g_model)) return 1;
    printf("device %s\n", backend_device_name(g_device));
    make_prompts();
    RUN(test_config_checked);
    RUN(test_same_outputs);
    RUN(test_penalties);
    RUN(test_min_tokens);
    RUN(test_bad_words);
    RUN(test_grammar);
    RUN(test_not_proposed);
    model_free(g_model);
    return test_summary();
}

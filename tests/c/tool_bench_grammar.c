/* tool_bench_grammar.c — cost of token masks against a decode step.
 *
 *   build/tests/tool_bench_grammar [MODEL.gguf] [--threads N] [--no-step] [--generate]
 *
 * For a few realistic grammars, replays a fixed conforming JSON text (tokenized by the
 * model's tokenizer) and at every step times gm_fill_mask three ways: as a first request
 * sees it (fresh grammar: the first visit of a state is computed, repeats hit the mask
 * cache), as a second request of the same grammar sees it (cache warm), and without the
 * mask cache at all (gm_fill_mask_uncached on another fresh grammar; the per-DFA-state
 * memos still fill as they are met). Then times a batch-8 decode step of the model on the CPU backend
 * (forward + logits of 8 sequences at context 64) and prints 8 masks per step as a
 * fraction of it. --generate also decodes greedily under the first schema with the model
 * (masked argmax over the logits) and prints the text.
 */
#include "backend/backend.h"
#include "grammar/grammar.h"
#include "grammar/grammar_int.h"
#include "model/batch.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct stats {
    double mean, p50, p99, max;
};

static struct stats summarize(double *v, int n)
{
    struct stats s = { 0 };
    if (n <= 0)
        return s;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    for (int i = 0; i < n; i++)
        s.mean += v[i];
    s.mean /= n;
    s.p50 = v[n / 2];
    s.p99 = v[(int)((n - 1) * 0.99)];
    s.max = v[n - 1];
    return s;
}

struct bench_case {
    const char *name;
    struct grammar_spec spec;
    const char *text;
};

static const char *const tools_schema =
    "{\"anyOf\": ["
    "{\"type\": \"object\", \"properties\": {\"name\": {\"const\": \"get_weather\"}, \"arguments\": {\"type\": "
    "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"unit\": {\"enum\": [\"celsius\", "
    "\"fahrenheit\"]}}, \"required\": [\"city\"]}}, \"required\": [\"name\", \"arguments\"]},"
    "{\"type\": \"object\", \"properties\": {\"name\": {\"const\": \"search_web\"}, \"arguments\": {\"type\": "
    "\"object\", \"properties\": {\"query\": {\"type\": \"string\"}, \"max_results\": {\"type\": \"integer\", "
    "\"minimum\": 1, \"maximum\": 50}}, \"required\": [\"query\"]}}, \"required\": [\"name\", \"arguments\"]},"
    "{\"type\": \"object\", \"properties\": {\"name\": {\"const\": \"send_email\"}, \"arguments\": {\"type\": "
    "\"object\", \"properties\": {\"to\": {\"type\": \"string\", \"format\": \"email\"}, \"subject\": {\"type\": "
    "\"string\", \"maxLength\": 80}, \"body\": {\"type\": \"string\"}}, \"required\": [\"to\", \"subject\", "
    "\"body\"]}}, \"required\": [\"name\", \"arguments\"]}]}";

static const char *const person_schema =
    "{\"type\": \"object\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 100},"
    "\"age\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 150},"
    "\"email\": {\"type\": \"string\", \"format\": \"email\"},"
    "\"role\": {\"enum\": [\"admin\", \"editor\", \"viewer\"]},"
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"maxItems\": 10},"
    "\"address\": {\"type\": \"object\", \"properties\": {\"street\": {\"type\": \"string\"}, \"city\": {\"type\": "
    "\"string\"}, \"zip\": {\"type\": \"string\", \"pattern\": \"^[0-9]{5}$\"}}, \"required\": [\"street\", \"city\"]},"
    "\"score\": {\"type\": \"number\", \"minimum\": 0, \"maximum\": 100},"
    "\"bio\": {\"type\": \"string\"}},"
    "\"required\": [\"name\", \"age\", \"role\", \"bio\"]}";

static const char *const person_text =
    "{\n  \"name\": \"Ada Lovelace\",\n  \"age\": 36,\n  \"email\": \"ada@example.org\",\n  \"role\": \"editor\",\n"
    "  \"tags\": [\"mathematics\", \"poetry\", \"engines\"],\n  \"address\": {\"street\": \"12 St James's Square\", "
    "\"city\": \"London\", \"zip\": \"10001\"},\n  \"score\": 97.5,\n  \"bio\": \"Augusta Ada King, Countess of "
    "Lovelace, was an English mathematician and writer, chiefly known for her work on Charles Babbage's proposed "
    "mechanical general-purpose computer, the Analytical Engine. She was the first to recognise that the machine had "
    "applications beyond pure calculation.\"\n}";

static const char *const tools_text =
    "<tool_call>\n{\"name\": \"search_web\", \"arguments\": {\"query\": \"best hiking trails near Lake Tahoe in "
    "autumn with waterfalls\", \"max_results\": 5}}\n</tool_call>\n<tool_call>\n{\"name\": \"send_email\", "
    "\"arguments\": {\"to\": \"friend@example.com\", \"subject\": \"Hiking plans\", \"body\": \"Hi! I found a few "
    "trails we could try next weekend. Let me know which one you like best.\"}}\n</tool_call>";

static const char *const object_text =
    "{\"id\": 18234, \"items\": [{\"sku\": \"A-100\", \"qty\": 2, \"price\": 19.99}, {\"sku\": \"B-220\", "
    "\"qty\": 1, \"price\": 5.5}], \"note\": \"Leave the parcel at the back door, please; the bell does not work.\", "
    "\"paid\": true, \"coupon\": null}";

/* Any JSON object again, written as a GBNF grammar: the GBNF compiler's rules against the
 * schema compiler's lexeme DFAs on the same text. */
static const char *const json_gbnf =
    "root   ::= object\n"
    "value  ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws ( string \":\" ws value ws ( \",\" ws string \":\" ws value ws )* )? \"}\"\n"
    "array  ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) )* \"\\\"\"\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
    "ws     ::= [ \\t\\n]*\n";

/* Replays text under g, timing masks. */
static int run_case(const struct model *model, const struct grammar_vocab *v, const struct bench_case *bc,
                    double *uncached_mean, double *cold_mean, double *warm_mean)
{
    char err[ERR_BUF];
    struct grammar *g = NULL;
    double t0 = now_us();
    if (grammar_compile(&g, v, &bc->spec, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", bc->name, err);
        return 1;
    }
    double compile_ms = (now_us() - t0) / 1e3;
    int32_t ids[4096];
    int n = tok_encode(model->tok, bc->text, strlen(bc->text), false, false, ids, 4096);
    int words = grammar_mask_words(grammar_vocab_size(v));
    uint32_t *mask = malloc(sizeof *mask * (size_t)words);
    double *unc = malloc(sizeof *unc * (size_t)(n + 1)), *cold = malloc(sizeof *cold * (size_t)(n + 1)),
           *warm = malloc(sizeof *warm * (size_t)(n + 1));
    long nodes = 0;
    /* pass 1: a first request (fresh grammar: empty mask cache and DFA memos) */
    struct grammar_matcher *m = gm_create(g);
    double accept_us = 0;
    for (int i = 0; i <= n; i++) {
        double a = now_us();
        gm_fill_mask(m, mask);
        double b = now_us();
        cold[i] = b - a;
        if (i < n && gm_accept(m, ids[i])) {
            fprintf(stderr, "%s: token %d (step %d) refused\n", bc->name, ids[i], i);
            return 1;
        }
        accept_us += now_us() - b;
    }
    bool can_end = gm_can_end(m);
    gm_free(m);
    /* pass 2: a second request of the same grammar */
    m = gm_create(g);
    for (int i = 0; i <= n; i++) {
        double a = now_us();
        gm_fill_mask(m, mask);
        warm[i] = now_us() - a;
        if (i < n)
            gm_accept(m, ids[i]);
    }
    gm_free(m);
    /* pass 3: a fresh grammar without the mask cache (DFA memos fill as they are met) */
    struct grammar *g2 = NULL;
    if (grammar_compile(&g2, v, &bc->spec, err, sizeof err))
        return 1;
    m = gm_create(g2);
    for (int i = 0; i <= n; i++) {
        double a = now_us();
        gm_fill_mask_uncached(m, mask);
        unc[i] = now_us() - a;
        nodes += gm_last_walk_nodes(m);
        if (getenv("BENCH_GRAMMAR_TRACE") && unc[i] > 300) {
            char *prefix = tok_decode(model->tok, ids, i, false);
            size_t pl = strlen(prefix);
            printf("  slow step %d: %.0f µs, %ld nodes, after ...%s\n", i, unc[i], gm_last_walk_nodes(m),
                   prefix + (pl > 40 ? pl - 40 : 0));
            free(prefix);
        }
        if (i < n)
            gm_accept(m, ids[i]);
    }
    gm_free(m);
    grammar_unref(g2);
    struct stats su = summarize(unc, n + 1), sc = summarize(cold, n + 1), sw = summarize(warm, n + 1);
    printf("| %-12s | %5d | %6.1f | %6.1f / %6.1f / %7.1f | %6.1f / %6.1f / %7.1f | %5.1f / %5.1f / %5.1f | %5.2f | %6ld | %s |\n",
           bc->name, n, compile_ms, su.mean, su.p50, su.p99, sc.mean, sc.p50, sc.p99, sw.mean, sw.p50, sw.p99,
           accept_us / n, nodes / (n + 1), can_end ? "yes" : "NO");
    *uncached_mean = su.mean;
    *cold_mean = sc.mean;
    *warm_mean = sw.mean;
    free(mask);
    free(unc);
    free(cold);
    free(warm);
    grammar_unref(g);
    return can_end ? 0 : 1;
}

/* Median time of a batch-8 decode step (forward + logits) at context 64, in µs. */
static double time_decode_step(const struct model *model, int threads)
{
    char err[ERR_BUF];
    struct backend_config cfg;
    backend_config_default(&cfg);
    cfg.device = BACKEND_DEVICE_CPU;
    cfg.n_threads = threads;
    cfg.max_num_seqs = 8;
    cfg.max_num_batched_tokens = 64;
    cfg.max_model_len = 128;
    cfg.num_blocks = 8 * 8;
    struct backend *b = NULL;
    if (backend_create(&b, model, &cfg, err, sizeof err)) {
        fprintf(stderr, "backend: %s\n", err);
        return -1;
    }
    int bs = backend_get_info(b)->block_size, ctx = 64, nblk = (ctx + bs) / bs + 1;
    enum { S = 8 };
    int32_t tok[S], pos[S], qs[S + 1], lens[S], li[S];
    int64_t slots[S];
    int32_t *tables = calloc((size_t)S * (size_t)nblk, sizeof *tables);
    for (int s = 0; s < S; s++) {
        tok[s] = 100 + s;
        pos[s] = ctx;
        qs[s] = s;
        lens[s] = ctx + 1;
        li[s] = s;
        for (int k = 0; k < nblk; k++)
            tables[s * nblk + k] = s * nblk + k;
        slots[s] = (int64_t)tables[s * nblk + ctx / bs] * bs + ctx % bs;
    }
    qs[S] = S;
    struct batch bt = { .num_tokens = S, .num_seqs = S, .token_ids = tok, .positions = pos, .slot_mapping = slots,
                        .query_start = qs, .seq_lens = lens, .block_tables = tables, .max_blocks_per_seq = nblk,
                        .num_logits = S, .logits_indices = li };
    double t[12];
    const float *logits;
    int reps = 12;
    for (int r = 0; r < reps; r++) {
        double a = now_us();
        if (backend_logits(b, &bt, &logits, err, sizeof err)) {
            fprintf(stderr, "step: %s\n", err);
            backend_free(b);
            free(tables);
            return -1;
        }
        t[r] = now_us() - a;
    }
    backend_free(b);
    free(tables);
    struct stats st = summarize(t + 2, reps - 2);
    return st.p50;
}

/* Greedy generation of one sequence under g with the model on the CPU backend: prints
 * the text and the per-step mask and forward times. Returns 0 when the output completed
 * the grammar. */
static int generate(const struct model *model, const struct grammar_vocab *v, struct grammar *g, const char *prompt,
                    int threads)
{
    char err[ERR_BUF];
    enum { MAXGEN = 200, CAP = 512 };
    int32_t ids[CAP];
    int np = tok_encode(model->tok, prompt, strlen(prompt), false, true, ids, CAP);
    if (np <= 0 || np + MAXGEN > CAP)
        return 1;
    struct backend_config cfg;
    backend_config_default(&cfg);
    cfg.device = BACKEND_DEVICE_CPU;
    cfg.n_threads = threads;
    cfg.max_num_seqs = 1;
    cfg.max_num_batched_tokens = CAP;
    cfg.max_model_len = CAP;
    struct backend *b = NULL;
    if (backend_create(&b, model, &cfg, err, sizeof err)) {
        fprintf(stderr, "backend: %s\n", err);
        return 1;
    }
    int bs = backend_get_info(b)->block_size, nblk = CAP / bs + 1, V = grammar_vocab_size(v);
    int32_t *table = malloc(sizeof *table * (size_t)nblk), pos[CAP], qs[2], len[1], li[1];
    int64_t slots[CAP];
    for (int k = 0; k < nblk; k++)
        table[k] = k;
    for (int p = 0; p < CAP; p++) {
        pos[p] = p;
        slots[p] = (int64_t)table[p / bs] * bs + p % bs;
    }
    uint32_t *mask = malloc(sizeof *mask * (size_t)grammar_mask_words(V));
    struct grammar_matcher *m = gm_create(g);
    double mask_us = 0, fwd_us = 0;
    int n = np, gen = 0, rc = 1;
    for (; gen < MAXGEN; gen++) {
        /* first step: the whole prompt; then the last token */
        int first = gen == 0 ? 0 : n - 1, count = n - first;
        qs[0] = 0;
        qs[1] = count;
        len[0] = n;
        li[0] = count - 1;
        struct batch bt = { .num_tokens = count, .num_seqs = 1, .token_ids = ids + first, .positions = pos + first,
                            .slot_mapping = slots + first, .query_start = qs, .seq_lens = len,
                            .block_tables = table, .max_blocks_per_seq = nblk, .num_logits = 1,
                            .logits_indices = li };
        const float *logits;
        double t0 = now_us();
        if (backend_logits(b, &bt, &logits, err, sizeof err)) {
            fprintf(stderr, "step: %s\n", err);
            break;
        }
        double t1 = now_us();
        gm_fill_mask(m, mask);
        double t2 = now_us();
        if (gen > 0)
            fwd_us += t1 - t0;
        mask_us += t2 - t1;
        int best = -1;
        for (int id = 0; id < V; id++)
            if (((mask[id >> 5] >> (id & 31)) & 1u) && (best < 0 || logits[id] > logits[best]))
                best = id;
        if (best < 0 || gm_accept(m, best))
            break;
        if (model_is_eog(model, best)) {
            rc = 0;
            break;
        }
        ids[n++] = best;
    }
    char *text = tok_decode(model->tok, ids + np, n - np, false);
    printf("\ngreedy generation under the person schema (%d tokens, %s):\n%s\n", n - np,
           rc ? "did not finish" : "complete", text);
    printf("mean per step: mask %.1f µs, forward (batch 1) %.2f ms\n", mask_us / (gen + 1), fwd_us / (gen > 0 ? gen : 1) / 1e3);
    free(text);
    gm_free(m);
    free(mask);
    free(table);
    backend_free(b);
    return rc;
}

int main(int argc, char **argv)
{
    const char *path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    int threads = 2;
    bool step = true, gen = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-step"))
            step = false;
        else if (!strcmp(argv[i], "--generate"))
            gen = true;
        else
            path = argv[i];
    }
    char err[ERR_BUF];
    struct model *model = NULL;
    if (model_load(path, 0, &model, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", path, err);
        return 1;
    }
    struct grammar_vocab *v = NULL;
    double t0 = now_us();
    if (grammar_vocab_create(&v, model->tok, model->eog_ids, model->n_eog, err, sizeof err)) {
        fprintf(stderr, "vocab: %s\n", err);
        return 1;
    }
    printf("model %s: vocabulary %d tokens, trie %d nodes, built in %.1f ms\n\n", path, grammar_vocab_size(v),
           v->n_nodes, (now_us() - t0) / 1e3);
    struct bench_case cases[] = {
        { "person", { .kind = GRAMMAR_JSON_SCHEMA, .text = person_schema, .text_len = strlen(person_schema) },
          person_text },
        { "tool calls", { .kind = GRAMMAR_JSON_SCHEMA, .text = tools_schema, .text_len = strlen(tools_schema),
                          .prefix = "<tool_call>\n", .suffix = "\n</tool_call>", .separator = "\n",
                          .min_items = 1 },
          tools_text },
        { "json_object", { .kind = GRAMMAR_JSON_OBJECT }, object_text },
        { "JSON as GBNF", { .kind = GRAMMAR_GBNF, .text = json_gbnf, .text_len = strlen(json_gbnf) }, object_text },
    };
    int nc = (int)(sizeof cases / sizeof cases[0]), fails = 0;
    double unc[8], cold[8], warm[8]; /* up to 8 cases */
    printf("per-mask µs (mean / p50 / p99) over every step of the text; accept = µs per gm_accept; nodes = trie\n"
           "nodes visited per mask without the mask cache\n\n");
    printf("| grammar | steps | compile ms | no mask cache | first request | second request | accept | nodes | complete |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (int i = 0; i < nc; i++)
        fails += run_case(model, v, &cases[i], &unc[i], &cold[i], &warm[i]);
    if (step) {
        double st = time_decode_step(model, threads);
        if (st > 0) {
            printf("\nbatch-8 decode step (CPU, %d threads, forward + logits, context 64): %.2f ms (median of 10)\n",
                   threads, st / 1e3);
            printf("\n| grammar | 8 masks, no mask cache / step | 8 masks, first request / step | 8 masks, second request / step |\n");
            printf("| --- | --- | --- | --- |\n");
            for (int i = 0; i < nc; i++)
                printf("| %s | %.1f%% | %.1f%% | %.1f%% |\n", cases[i].name, 100 * 8 * unc[i] / st, 100 * 8 * cold[i] / st,
                       100 * 8 * warm[i] / st);
        }
    }
    if (gen) {
        struct grammar *g = NULL;
        if (grammar_compile(&g, v, &cases[0].spec, err, sizeof err) == 0) {
            fails += generate(model, v, g,
                              "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nDescribe "
                              "a fictional software engineer as a JSON object.<|im_end|>\n<|im_start|>assistant\n",
                              threads);
            grammar_unref(g);
        }
    }
    grammar_vocab_free(v);
    model_free(model);
    return fails ? 1 : 0;
}

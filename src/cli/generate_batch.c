/* generate_batch.c — `tessera generate --prompts-file FILE`: every non-empty line is a
 * prompt; all are submitted to the continuous-batching scheduler (src/engine/) at once
 * and stepped until every sequence finishes. Each sequence decodes its tokens through its
 * own streaming detokenizer and stop matcher (a completed stop string aborts it in the
 * engine). Results are printed as one JSON object per line, in input order:
 *   {"index":0,"prompt_tokens":12,"completion_tokens":40,"finish_reason":"length","text":"..."}
 * (with --print-ids, "token_ids" replaces "text"). Sequence i samples with seed + i.
 * --json-schema FILE constrains every sequence to the schema (one compiled grammar).
 */
#define _GNU_SOURCE
#include "cli/generate.h"
#include "engine/scheduler.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"
#include "util/mapfile.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct batch_item {
    int64_t seq_id;
    int n_prompt, n_gen;
    const char *finish;     /* NULL while running */
    struct tok_stream ts;
    struct stop_matcher stop;
    char *text;             /* [text_cap] emitted text, preallocated */
    size_t text_len, text_cap;
    int32_t *gen;           /* [max_tokens] generated ids */
};

struct batch_run {
    const struct gen_args *a;
    const struct model *m;
    struct sched *s;
    struct batch_item *items;
    int n_items;
    int64_t first_id;       /* sequence ids are consecutive from the first sched_add */
    char *piece;            /* [piece_cap] scratch for one token's text */
    int piece_cap;
    int n_open;
};

static void item_append(struct batch_item *it, const char *p, size_t n)
{
    if (n > it->text_cap - it->text_len) n = it->text_cap - it->text_len; /* cannot happen: sized for max_tokens */
    memcpy(it->text + it->text_len, p, n);
    it->text_len += n;
}

/* Passes text through the item's stop matcher; returns 1 when a stop string completed. */
static int item_emit(struct batch_item *it, const char *text, size_t len)
{
    char out[STOP_MAX_LEN + 256 + 8];
    while (len > 0) {
        size_t piece = len < 256 ? len : 256, n_out = 0;
        int hit = stop_feed(&it->stop, text, piece, out, sizeof out, &n_out) == STOP_HIT;
        item_append(it, out, n_out);
        if (hit) return 1;
        text += piece;
        len -= piece;
    }
    return 0;
}

static void item_close(struct batch_run *r, struct batch_item *it, const char *finish)
{
    if (it->finish) return;
    it->finish = finish;
    r->n_open--;
    if (!stop_matched(&it->stop)) { /* flush held bytes: a trailing partial char, a held stop prefix */
        char tail[STOP_MAX_LEN + 16];
        int len = tok_stream_flush(&it->ts, tail, sizeof tail);
        if (len > 0) item_emit(it, tail, (size_t)len);
        size_t n_out = 0;
        if (!stop_matched(&it->stop)) {
            stop_flush(&it->stop, tail, sizeof tail, &n_out);
            item_append(it, tail, n_out);
        }
    }
}

static void on_output(void *ud, const struct sched_output *o)
{
    struct batch_run *r = ud;
    struct batch_item *it = &r->items[o->seq_id - r->first_id];
    if (it->finish || o->admitted) return; /* e.g. the abort that follows a stop string */
    bool eog = o->finished && o->finish == FINISH_STOP; /* the end-of-turn token itself */
    if (o->token >= 0 && !eog) {
        it->gen[it->n_gen++] = o->token;
        int len = tok_stream_feed(r->m->tok, &it->ts, o->token, true, r->piece, r->piece_cap);
        if (len > 0 && item_emit(it, r->piece, (size_t)len)) {
            item_close(r, it, "stop");
            if (!o->finished) sched_abort(r->s, o->seq_id, NULL, 0);
            return;
        }
    }
    if (o->finished)
        item_close(r, it, o->finish == FINISH_LENGTH ? "length" : o->finish == FINISH_STOP ? "stop"
                          : o->finish == FINISH_ERROR ? "error" : "abort");
}

static void print_item(const struct batch_run *r, int i)
{
    const struct batch_item *it = &r->items[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", i);
    cJSON_AddNumberToObject(o, "prompt_tokens", it->n_prompt);
    cJSON_AddNumberToObject(o, "completion_tokens", it->n_gen);
    cJSON_AddStringToObject(o, "finish_reason", it->finish ? it->finish : "abort");
    if (r->a->print_ids) {
        cJSON *ids = cJSON_AddArrayToObject(o, "token_ids");
        for (int k = 0; k < it->n_gen; k++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(it->gen[k]));
    } else {
        /* cJSON needs a NUL-terminated string; the text buffer keeps one spare byte */
        it->text[it->text_len] = 0;
        cJSON_AddStringToObject(o, "text", it->text);
    }
    char *line = cJSON_PrintUnformatted(o);
    if (line) puts(line);
    free(line);
    cJSON_Delete(o);
}

/* Splits the file into its non-empty lines (pointers into buf, which is modified). */
static int split_lines(char *buf, char ***lines, int *n, char *err, size_t errlen)
{
    int cap = 16;
    *n = 0;
    *lines = malloc(sizeof **lines * (size_t)cap);
    if (!*lines) return err_set(err, errlen, ERR_NOMEM, "out of memory");
    for (char *p = buf; *p;) {
        char *e = strchr(p, '\n');
        if (e) *e = 0;
        size_t len = strlen(p);
        if (len && p[len - 1] == '\r') p[--len] = 0;
        if (len) {
            if (*n == cap) {
                char **nl = realloc(*lines, sizeof **lines * (size_t)(cap *= 2));
                if (!nl) return err_set(err, errlen, ERR_NOMEM, "out of memory");
                *lines = nl;
            }
            (*lines)[(*n)++] = p;
        }
        if (!e) break;
        p = e + 1;
    }
    if (*n == 0) return err_set(err, errlen, ERR_INVALID, "%s: no prompts (every line is empty)", "--prompts-file");
    return 0;
}

/* --json-schema FILE compiled against m's vocabulary into *g (*gv its vocabulary). */
static int compile_schema(const char *path, const struct model *m, struct grammar_vocab **gv, struct grammar **g,
                          char *err, size_t errlen)
{
    char *text = NULL, why[ERR_BUF];
    size_t len = 0;
    int rc = read_text_file(path, &text, &len, err, errlen);
    if (!rc) rc = grammar_vocab_create(gv, m->tok, m->eog_ids, m->n_eog, err, errlen);
    if (!rc) {
        struct grammar_spec spec = { .kind = GRAMMAR_JSON_SCHEMA, .text = text, .text_len = len };
        if ((rc = grammar_compile(g, *gv, &spec, why, sizeof why)))
            err_set(err, errlen, rc, "--json-schema %s: %s", path, why);
    }
    free(text);
    return rc;
}

int gen_run_batch(const struct gen_args *a, const struct model *m, char *err, size_t errlen)
{
    struct batch_run r = { .a = a, .m = m };
    char *buf = NULL, **lines = NULL;
    struct grammar_vocab *gv = NULL;
    struct grammar *g = NULL;
    int rc;
    if ((rc = read_text_file(a->prompts_file, &buf, NULL, err, errlen))) return 1;
    if ((rc = split_lines(buf, &lines, &r.n_items, err, errlen))) goto out;
    if (a->json_schema && (rc = compile_schema(a->json_schema, m, &gv, &g, err, errlen))) goto out;

    int ctx = a->ctx > 0 ? a->ctx : (m->cfg.max_seq_len < 4096 ? m->cfg.max_seq_len : 4096);
    if (ctx > m->cfg.max_seq_len) ctx = m->cfg.max_seq_len;
    struct sched_config cfg;
    sched_config_default(&cfg);
    cfg.max_num_seqs = a->max_num_seqs;
    cfg.max_num_batched_tokens = a->max_num_batched_tokens;
    cfg.max_model_len = ctx;
    cfg.block_size = KV_DEFAULT_BLOCK_SIZE;
    cfg.spec = a->spec;
    gen_backend_config(a, &cfg.backend);
    /* the backend sizes the KV cache and says which knob to turn when it is too small */
    cfg.backend.cpu_kv_bytes = (size_t)a->kv_cache_mib << 20;
    cfg.backend.num_blocks = a->kv_blocks;
    if ((rc = sched_create(&r.s, m, &cfg, err, errlen))) goto out;

    r.piece_cap = gen_piece_cap(m);
    r.items = calloc((size_t)r.n_items, sizeof *r.items);
    r.piece = malloc((size_t)r.piece_cap);
    if (!r.items || !r.piece) { rc = err_set(err, errlen, ERR_NOMEM, "out of memory"); goto out; }
    for (int i = 0; i < r.n_items; i++) {
        struct batch_item *it = &r.items[i];
        int32_t *ids = NULL;
        int n = 0;
        rc = gen_encode_text(a, m, lines[i], &ids, &n, err, errlen);
        if (!rc) {
            struct sched_seq_params sp;
            sched_seq_params_default(&sp);
            sp.sp = a->sp;
            sp.sp.seed += (uint64_t)i;
            sp.max_tokens = a->max_tokens;
            sp.ignore_eos = a->ignore_eos;
            sp.grammar = g;
            rc = sched_add(r.s, ids, n, &sp, &it->seq_id, err, errlen);
        }
        free(ids);
        if (rc) {
            char why[ERR_BUF];
            snprintf(why, sizeof why, "%s", err);
            rc = err_set(err, errlen, rc, "%s line %d: %s", a->prompts_file, i + 1, why);
            goto out;
        }
        if (i == 0) r.first_id = it->seq_id;
        it->n_prompt = n;
        const struct sched_seq *q = sched_find(r.s, it->seq_id);
        int max_new = q ? q->max_tokens : a->max_tokens;
        it->text_cap = (size_t)max_new * (size_t)r.piece_cap + STOP_MAX_LEN + 16;
        it->text = malloc(it->text_cap + 1);
        it->gen = malloc(sizeof *it->gen * (size_t)(max_new > 0 ? max_new : 1));
        if (!it->text || !it->gen) { rc = err_set(err, errlen, ERR_NOMEM, "out of memory"); goto out; }
        tok_stream_init(&it->ts);
        stop_init(&it->stop, a->stops, a->n_stops);
    }
    r.n_open = r.n_items;

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (sched_has_work(r.s))
        if ((rc = sched_step(r.s, on_output, &r, err, errlen))) goto out;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (int i = 0; i < r.n_items; i++) print_item(&r, i);
    fflush(stdout);
    if (!a->quiet) {
        struct sched_stats st;
        sched_get_stats(r.s, &st);
        long gen = 0;
        for (int i = 0; i < r.n_items; i++) gen += r.items[i].n_gen;
        double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        fprintf(stderr, "[%d prompts | %llu steps | %ld generated tokens in %.2f s, %.1f tok/s | preemptions %llu | "
                "prefix-cache hits %llu of %llu tokens | speculative: %llu of %llu proposed tokens kept]\n",
                r.n_items, (unsigned long long)st.steps, gen, dt, dt > 0 ? (double)gen / dt : 0.0,
                (unsigned long long)st.preemptions, (unsigned long long)st.bm.hit_tokens,
                (unsigned long long)st.bm.query_tokens, (unsigned long long)st.spec_accepted_tokens,
                (unsigned long long)st.spec_draft_tokens);
    }
out:
    if (r.items)
        for (int i = 0; i < r.n_items; i++) {
            free(r.items[i].text);
            free(r.items[i].gen);
        }
    free(r.items);
    free(r.piece);
    if (r.s) sched_free(r.s);
    grammar_unref(g);
    if (gv) grammar_vocab_free(gv);
    free(lines);
    free(buf);
    return rc ? 1 : 0;
}

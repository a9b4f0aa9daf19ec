/* grammar.c — the vocabulary view (token bytes and their trie), the grammar builder the
 * compilers share, and grammar_compile: choices, regexes, schemas, GBNF grammars and the
 * tool-call wrapper become one set of rules (grammar_int.h), start rule 0.
 */
#include "grammar/grammar_int.h"

#include "tokenizer/tokenizer.h"
#include "util/err.h"
#include "util/grow.h"

#include <stdlib.h>
#include <string.h>

/* ---- vocabulary -------------------------------------------------------------------------- */

/* One text token for sorting: its bytes and id. */
struct tok_key {
    const char *b;
    uint32_t len;
    int32_t id;
};

static int cmp_token_bytes(const void *pa, const void *pb)
{
    const struct tok_key *a = pa, *b = pb;
    int c = memcmp(a->b, b->b, a->len < b->len ? a->len : b->len);
    if (c)
        return c;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

int grammar_vocab_create(struct grammar_vocab **out, const struct tokenizer *tok, const int32_t *eog, int n_eog,
                         char *err, size_t errlen)
{
    int rc = 0;
    *out = NULL;
    struct grammar_vocab *v = calloc(1, sizeof *v);
    struct tok_key *order = NULL;
    if (!v)
        return ERR_NOMEM;
    int n = tok_vocab_size(tok);
    if (n <= 0) {
        free(v);
        return err_set(err, errlen, ERR_INVALID, "grammar: empty vocabulary");
    }
    v->vocab_size = n;
    v->n_eog = n_eog;
    v->eog = malloc(sizeof *v->eog * (size_t)(n_eog > 0 ? n_eog : 1));
    v->is_eog = calloc((size_t)n, 1);
    v->is_special = calloc((size_t)n, 1);
    v->off = calloc((size_t)n + 1, sizeof *v->off);
    order = malloc(sizeof *order * (size_t)n);
    if (!v->eog || !v->is_eog || !v->is_special || !v->off || !order) {
        rc = ERR_NOMEM;
        goto fail;
    }
    for (int i = 0; i < n_eog; i++) {
        if (eog[i] < 0 || eog[i] >= n) {
            rc = err_set(err, errlen, ERR_INVALID, "grammar: end token %d outside the vocabulary", eog[i]);
            goto fail;
        }
        v->eog[i] = eog[i];
        v->is_eog[eog[i]] = 1;
    }
    size_t total = 0, cap = 0;
    char tmp[1024];
    for (int id = 0; id < n; id++) {
        v->off[id] = (uint32_t)total;
        v->is_special[id] = tok_is_special(tok, id);
        if (v->is_special[id] || v->is_eog[id])
            continue; /* never text */
        int len = tok_token_bytes(tok, id, false, tmp, (int)sizeof tmp);
        if (len < 0 || len > UINT16_MAX) {
            rc = err_set(err, errlen, ERR_RANGE, "grammar: token %d has %d bytes", id, len);
            goto fail;
        }
        if (!grow_array((void **)&v->bytes, &cap, total + (size_t)len + 1, 1)) {
            rc = ERR_NOMEM;
            goto fail;
        }
        if (len <= (int)sizeof tmp)
            memcpy(v->bytes + total, tmp, (size_t)len);
        else
            tok_token_bytes(tok, id, false, v->bytes + total, len);
        total += (size_t)len;
        if (len > v->max_token_len)
            v->max_token_len = len;
    }
    v->off[n] = (uint32_t)total;
    if (!v->bytes && !(v->bytes = malloc(1))) {
        rc = ERR_NOMEM;
        goto fail;
    }
    /* trie: sort the text tokens by bytes, then build nodes in preorder from the common
     * prefix of neighbours */
    int nt = 0;
    for (int id = 0; id < n; id++)
        if (!v->is_special[id] && !v->is_eog[id] && v->off[id + 1] > v->off[id])
            order[nt++] = (struct tok_key){ v->bytes + v->off[id], v->off[id + 1] - v->off[id], id };
    qsort(order, (size_t)nt, sizeof *order, cmp_token_bytes);
    size_t node_cap = total + 1;
    v->nodes = calloc(node_cap, sizeof *v->nodes);
    v->tok_ids = malloc(sizeof *v->tok_ids * (size_t)(nt ? nt : 1));
    int *path = malloc(sizeof *path * ((size_t)v->max_token_len + 1));
    if (!v->nodes || !v->tok_ids || !path) {
        free(path);
        rc = ERR_NOMEM;
        goto fail;
    }
    int nn = 1, depth = 0;
    path[0] = 0;
    v->nodes[0].byte = 0;
    const char *prev = NULL;
    uint32_t prev_len = 0;
    for (int k = 0; k < nt; k++) {
        int id = order[k].id;
        const char *b = order[k].b;
        uint32_t len = order[k].len, l = 0;
        while (prev && l < len && l < prev_len && b[l] == prev[l])
            l++;
        /* close nodes deeper than the common prefix */
        while (depth > (int)l) {
            int node = path[depth--];
            v->nodes[node].size = (uint32_t)(nn - node);
        }
        for (uint32_t d = l; d < len; d++) {
            v->nodes[nn].byte = (uint8_t)b[d];
            path[++depth] = nn++;
        }
        int at = path[len];
        if (!v->nodes[at].tok_count)
            v->nodes[at].tok_first = (uint32_t)k;
        if (v->nodes[at].tok_count == UINT16_MAX) {
            free(path);
            rc = err_set(err, errlen, ERR_RANGE, "grammar: too many tokens with the same text");
            goto fail;
        }
        v->nodes[at].tok_count++;
        v->tok_ids[k] = id;
        prev = b;
        prev_len = len;
    }
    while (depth >= 0) {
        int node = path[depth--];
        v->nodes[node].size = (uint32_t)(nn - node);
    }
    free(path);
    v->n_nodes = nn;
    free(order);
    *out = v;
    return 0;
fail:
    free(order);
    grammar_vocab_free(v);
    return rc;
}

void grammar_vocab_free(struct grammar_vocab *v)
{
    if (!v)
        return;
    free(v->eog);
    free(v->is_eog);
    free(v->is_special);
    free(v->bytes);
    free(v->off);
    free(v->nodes);
    free(v->tok_ids);
    free(v);
}

int grammar_vocab_size(const struct grammar_vocab *v) { return v ? v->vocab_size : 0; }

/* ---- builder ------------------------------------------------------------------------------ */

void gb_init(struct gbuild *b, char *err, size_t errlen)
{
    memset(b, 0, sizeof *b);
    for (int i = 0; i < 256; i++)
        b->byte_class[i] = -1;
    b->err = err;
    b->errlen = errlen;
}

void gb_free(struct gbuild *b)
{
    free(b->elems);
    free(b->alt_rule);
    free(b->alt_pos);
    free(b->classes);
    for (int i = 0; i < b->n_dfas; i++)
        gdfa_free(&b->dfas[i]);
    free(b->dfas);
    memset(b, 0, sizeof *b);
}

int gb_new_rule(struct gbuild *b)
{
    if (b->n_rules >= GR_MAX_ELEMS)
        return err_set(b->err, b->errlen, ERR_RANGE, "grammar too large (rules)");
    return b->n_rules++;
}

int gb_add_alt(struct gbuild *b, int rule, const struct gseq *s)
{
    if ((size_t)b->n_elems + (size_t)s->n + 1 > GR_MAX_ELEMS)
        return err_set(b->err, b->errlen, ERR_RANGE, "grammar too large (over %d elements)", GR_MAX_ELEMS);
    if (!grow_array((void **)&b->elems, &b->elems_cap, (size_t)b->n_elems + (size_t)s->n + 1, sizeof *b->elems))
        return ERR_NOMEM;
    size_t cap = b->alt_cap;
    if (!grow_array((void **)&b->alt_rule, &cap, (size_t)b->n_alts + 1, sizeof *b->alt_rule))
        return ERR_NOMEM;
    cap = b->alt_cap;
    if (!grow_array((void **)&b->alt_pos, &cap, (size_t)b->n_alts + 1, sizeof *b->alt_pos))
        return ERR_NOMEM;
    b->alt_cap = cap;
    b->alt_rule[b->n_alts] = rule;
    b->alt_pos[b->n_alts++] = b->n_elems;
    if (s->n)
        memcpy(b->elems + b->n_elems, s->v, sizeof *s->v * (size_t)s->n);
    b->n_elems += s->n;
    b->elems[b->n_elems++] = (struct gel){ GEL_END, 0 };
    return 0;
}

int gb_class(struct gbuild *b, const uint32_t set[8])
{
    if (!grow_array((void **)&b->classes, &b->classes_cap, (size_t)b->n_classes + 1, sizeof *b->classes))
        return ERR_NOMEM;
    memcpy(b->classes[b->n_classes], set, sizeof b->classes[0]);
    return b->n_classes++;
}

int gb_byte_class(struct gbuild *b, unsigned byte)
{
    if (b->byte_class[byte & 255] >= 0)
        return b->byte_class[byte & 255];
    uint32_t set[8] = { 0 };
    set[(byte & 255) >> 5] |= 1u << (byte & 31);
    int c = gb_class(b, set);
    if (c >= 0)
        b->byte_class[byte & 255] = c;
    return c;
}

int gb_add_dfa(struct gbuild *b, struct gdfa *d)
{
    if (b->total_dfa_states + d->n_states > GR_MAX_TOTAL_DFA_STATES) {
        gdfa_free(d);
        return err_set(b->err, b->errlen, ERR_RANGE, "grammar too large (over %d automaton states)",
                       GR_MAX_TOTAL_DFA_STATES);
    }
    if (!grow_array((void **)&b->dfas, &b->dfas_cap, (size_t)b->n_dfas + 1, sizeof *b->dfas)) {
        gdfa_free(d);
        return ERR_NOMEM;
    }
    b->dfas[b->n_dfas] = *d;
    memset(d, 0, sizeof *d);
    b->total_dfa_states += b->dfas[b->n_dfas].n_states;
    return b->n_dfas++;
}

int gseq_push(struct gseq *s, uint32_t kind, uint32_t arg)
{
    if (!grow_array((void **)&s->v, &s->cap, (size_t)s->n + 1, sizeof *s->v))
        return ERR_NOMEM;
    s->v[s->n++] = (struct gel){ kind, arg };
    return 0;
}

int gseq_lit(struct gbuild *b, struct gseq *s, const char *text, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        int c = gb_byte_class(b, (uint8_t)text[i]);
        if (c < 0)
            return c;
        int rc = gseq_push(s, GEL_CLASS, (uint32_t)c);
        if (rc)
            return rc;
    }
    return 0;
}

void gseq_free(struct gseq *s)
{
    free(s->v);
    memset(s, 0, sizeof *s);
}

/* ---- compile --------------------------------------------------------------------------------- */

/* The element matching one VALUE of spec. */
static int compile_value(struct gbuild *b, const struct grammar_spec *spec, struct gel *out, char *err, size_t errlen)
{
    int rc;
    switch (spec->kind) {
    case GRAMMAR_JSON_SCHEMA:
        if (!spec->text)
            return err_set(err, errlen, ERR_INVALID, "grammar: no schema text");
        return sc_compile_schema(b, spec->text, spec->text_len, out);
    case GRAMMAR_JSON_OBJECT:
        return sc_compile_any_object(b, out);
    case GRAMMAR_REGEX: {
        if (!spec->text)
            return err_set(err, errlen, ERR_INVALID, "grammar: no regex text");
        struct gdfa d;
        if ((rc = rx_compile(spec->text, spec->text_len, 0, &d, err, errlen)))
            return rc;
        int id = gb_add_dfa(b, &d);
        if (id < 0)
            return id;
        *out = (struct gel){ GEL_DFA, (uint32_t)id };
        return 0;
    }
    case GRAMMAR_GBNF:
        if (!spec->text)
            return err_set(err, errlen, ERR_INVALID, "grammar: no GBNF text");
        return gbnf_compile(b, spec->text, spec->text_len, out);
    case GRAMMAR_CHOICE: {
        if (spec->n_choices <= 0 || !spec->choices)
            return err_set(err, errlen, ERR_INVALID, "grammar: empty list of choices");
        int r = gb_new_rule(b);
        if (r < 0)
            return r;
        for (int i = 0; i < spec->n_choices; i++) {
            if (!spec->choices[i])
                return err_set(err, errlen, ERR_INVALID, "grammar: choice %d is null", i);
            struct gseq s = { 0 };
            rc = gseq_lit(b, &s, spec->choices[i], strlen(spec->choices[i]));
            if (!rc)
                rc = gb_add_alt(b, r, &s);
            gseq_free(&s);
            if (rc)
                return rc;
        }
        *out = (struct gel){ GEL_REF, (uint32_t)r };
        return 0;
    }
    }
    return err_set(err, errlen, ERR_INVALID, "grammar: unknown kind %d", (int)spec->kind);
}

static bool spec_has_wrapper(const struct grammar_spec *spec)
{
    return spec->prefix || spec->suffix || spec->separator || spec->min_items || spec->max_items;
}

/* Start rule 0: VALUE, or the wrapper's list of items. */
static int compile_start(struct gbuild *b, const struct grammar_spec *spec, char *err, size_t errlen)
{
    int start = gb_new_rule(b), rc = 0;
    if (start < 0)
        return start;
    struct gel value;
    if ((rc = compile_value(b, spec, &value, err, errlen)))
        return rc;
    struct gseq s = { 0 };
    if (!spec_has_wrapper(spec)) {
        rc = gseq_push(&s, value.kind, value.arg);
        rc = rc ? rc : gb_add_alt(b, start, &s);
        gseq_free(&s);
        return rc;
    }
    int mn = spec->min_items > 0 ? spec->min_items : 0, mx = spec->max_items > 0 ? spec->max_items : -1;
    if (mx >= 0 && mx < mn)
        return err_set(err, errlen, ERR_INVALID, "grammar: max_items %d < min_items %d", mx, mn);
    if (mn > 1000 || mx > 1000)
        return err_set(err, errlen, ERR_RANGE, "grammar: more than 1000 wrapped items");
    const char *pre = spec->prefix ? spec->prefix : "", *suf = spec->suffix ? spec->suffix : "";
    const char *sep = spec->separator ? spec->separator : "";
    /* item ::= prefix VALUE suffix */
    int item = gb_new_rule(b);
    if (item < 0)
        return item;
    if ((rc = gseq_lit(b, &s, pre, strlen(pre))) || (rc = gseq_push(&s, value.kind, value.arg)) ||
        (rc = gseq_lit(b, &s, suf, strlen(suf))) || (rc = gb_add_alt(b, item, &s)))
        goto fail;
    s.n = 0;
    /* more_k: after k items; more_k ::= sep item more_{k+1} | ε (k >= mn). Beyond the last
     * distinct count (mx, or mn when unbounded) the rule loops on itself. */
    int last = mx >= 0 ? mx : (mn > 1 ? mn : 1);
    int first_more = b->n_rules;
    for (int k = 1; k <= last; k++)
        if ((rc = gb_new_rule(b)) < 0)
            goto fail;
    rc = 0;
    for (int k = 1; k <= last; k++) {
        int r = first_more + k - 1;
        if (k >= mn) {
            s.n = 0;
            if ((rc = gb_add_alt(b, r, &s)))
                goto fail;
        }
        if (mx >= 0 && k == mx)
            continue;
        int next = k == last ? r : r + 1;
        s.n = 0;
        if ((rc = gseq_lit(b, &s, sep, strlen(sep))) || (rc = gseq_push(&s, GEL_REF, (uint32_t)item)) ||
            (rc = gseq_push(&s, GEL_REF, (uint32_t)next)) || (rc = gb_add_alt(b, r, &s)))
            goto fail;
    }
    s.n = 0;
    if (mn == 0 && (rc = gb_add_alt(b, start, &s)))
        goto fail;
    if (mx != 0) {
        s.n = 0;
        if ((rc = gseq_push(&s, GEL_REF, (uint32_t)item)) || (rc = gseq_push(&s, GEL_REF, (uint32_t)first_more)) ||
            (rc = gb_add_alt(b, start, &s)))
            goto fail;
    }
fail:
    gseq_free(&s);
    return rc;
}

int grammar_compile(struct grammar **out, const struct grammar_vocab *v, const struct grammar_spec *spec, char *err,
                    size_t errlen)
{
    *out = NULL;
    if (!v || !spec)
        return err_set(err, errlen, ERR_INVALID, "grammar: no vocabulary or spec");
    struct gbuild b;
    gb_init(&b, err, errlen);
    struct grammar *g = NULL;
    int rc = compile_start(&b, spec, err, errlen);
    if (rc)
        goto fail;
    g = calloc(1, sizeof *g);
    if (!g) {
        rc = ERR_NOMEM;
        goto fail;
    }
    atomic_init(&g->refs, 1);
    g->vocab = v;
    /* alternatives grouped by rule (stable: a rule's alternatives keep their order) */
    g->rule_alt_first = calloc((size_t)b.n_rules + 1, sizeof *g->rule_alt_first);
    g->rule_alt_count = calloc((size_t)b.n_rules + 1, sizeof *g->rule_alt_count);
    g->alt_start = malloc(sizeof *g->alt_start * ((size_t)b.n_alts + 1));
    if (!g->rule_alt_first || !g->rule_alt_count || !g->alt_start) {
        rc = ERR_NOMEM;
        goto fail;
    }
    for (int i = 0; i < b.n_alts; i++)
        g->rule_alt_count[b.alt_rule[i]]++;
    for (int r = 1; r < b.n_rules; r++)
        g->rule_alt_first[r] = g->rule_alt_first[r - 1] + g->rule_alt_count[r - 1];
    {
        int32_t *fill = calloc((size_t)b.n_rules + 1, sizeof *fill);
        if (!fill) {
            rc = ERR_NOMEM;
            goto fail;
        }
        for (int i = 0; i < b.n_alts; i++) {
            int r = b.alt_rule[i];
            g->alt_start[g->rule_alt_first[r] + fill[r]++] = b.alt_pos[i];
        }
        free(fill);
    }
    g->n_rules = b.n_rules;
    g->n_alts = b.n_alts;
    g->elems = b.elems;
    g->n_elems = b.n_elems;
    g->classes = b.classes;
    g->n_classes = b.n_classes;
    g->dfas = b.dfas;
    g->n_dfas = b.n_dfas;
    for (int i = 0; i < g->n_dfas && !rc; i++)
        rc = gdfa_classes(&g->dfas[i], v->max_token_len + 1);
    b.elems = NULL;
    b.classes = NULL;
    b.dfas = NULL;
    b.n_dfas = 0;
    pthread_mutex_init(&g->cache_lock, NULL);
    gb_free(&b);
    if (!rc) {
        /* a grammar whose start reaches neither text nor the end (e.g. a $ref that only
         * refers to itself) matches nothing */
        struct grammar_matcher *m = NULL;
        rc = gm_start(g, &m);
        if (rc == ERR_RANGE)
            rc = err_set(err, errlen, ERR_RANGE, "grammar too ambiguous: its start exceeds the matcher's work bound");
        else if (!rc && gm_is_done(m) && !gm_can_end(m))
            rc = err_set(err, errlen, ERR_INVALID, "grammar matches no text (a reference cycle without content?)");
        gm_free(m);
    }
    if (rc) {
        grammar_unref(g);
        return rc;
    }
    *out = g;
    return 0;
fail:
    gb_free(&b);
    if (g) {
        free(g->rule_alt_first);
        free(g->rule_alt_count);
        free(g->alt_start);
        free(g);
    }
    return rc;
}

struct grammar *grammar_ref(struct grammar *g)
{
    if (g)
        atomic_fetch_add(&g->refs, 1);
    return g;
}

void grammar_unref(struct grammar *g)
{
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1)
        return;
    free(g->elems);
    free(g->rule_alt_first);
    free(g->rule_alt_count);
    free(g->alt_start);
    free(g->classes);
    for (int i = 0; i < g->n_dfas; i++)
        gdfa_free(&g->dfas[i]);
    free(g->dfas);
    for (int i = 0; i < GR_CACHE_SLOTS; i++) {
        free(g->cache[i].key);
        free(g->cache[i].mask);
    }
    for (int i = 0; i < g->n_memo; i++) {
        free(g->memo[i].inside);
        free(g->memo[i].bnd);
    }
    pthread_mutex_destroy(&g->cache_lock);
    free(g);
}

/* matcher.c — one sequence's position in a grammar, advanced byte by byte, and the token
 * mask computed from it.
 *
 * State: a set of parse configurations. Each configuration is a stack of frames kept as a
 * linked list in an arena (struct snode: element position, DFA state, parent frame); the
 * top frame sits on a CLASS or DFA element, the frames below are return positions pushed
 * by rule references (a reference in tail position pushes nothing, so repetition written
 * as right recursion runs in constant stack). After each accepted token the surviving
 * configurations are copied into a fresh arena with hash-consing, so equal stacks share
 * one node and the state has a canonical serialisation (the mask cache key).
 *
 * Mask: the union over configurations of "tokens this configuration consumes entirely".
 * Configurations on literal bytes walk the vocabulary trie together depth-first (new
 * frames go to the arena above the base and are dropped when the walk returns; children
 * whose byte no configuration takes are skipped). A configuration inside a lexeme uses
 * its DFA state's memo (the tokens the DFA consumes from that state, and the trie nodes
 * where the lexeme can end inside a token), so only those nodes are walked with the
 * stack. Masks of expensive states are cached in the grammar, keyed by the exact state
 * with DFA states replaced by their behaviour class.
 *
 * Within one advance a configuration is added once per distinct stack (frames compared,
 * not nodes), and each gm_accept / mask is bounded by GM_MAX_WORK closure calls plus
 * configuration comparisons: past it the call fails with ERR_RANGE, so a grammar whose
 * parses multiply (possible in GBNF) cannot hold the scheduler thread.
 *
 * A matcher is used by one thread at a time; the grammar's cache takes its mutex.
 */
#include "grammar/grammar_int.h"

#include "util/err.h"
#include "util/grow.h"

#include <stdlib.h>
#include <string.h>

#define GM_CLOSURE_DEPTH 512  /* rule expansions without consuming a byte (cuts ε-cycles) */
#define GM_CACHE_MIN_NODES 512 /* walks cheaper than this are not cached */
#define GM_MEMO_MIN_NODES 4096 /* DFA-state memos cheaper than this are not kept */
#define GM_MAX_WORK (1L << 26) /* closure calls + set comparisons in one gm_accept / mask */

struct snode {
    int32_t pos;    /* element index */
    int32_t aux;    /* DFA state when elems[pos] is GEL_DFA (top frames only) */
    int32_t parent; /* frame below, -1 = bottom */
};

struct grammar_matcher {
    struct grammar *g;
    /* arena: [0, n_base) the committed state's frames, above it scratch frames */
    struct snode *nodes;
    size_t nodes_cap;
    int n_nodes, n_base;
    /* configuration sets: [0, n_tops) committed; walk levels above */
    int32_t *set;
    size_t set_cap;
    int n_tops;
    bool can_end; /* the text so far is a complete match */
    bool ended;   /* an end token was accepted */
    bool w_end;   /* scratch: the advance being computed reached the end */
    bool oom;     /* the call in progress failed: out of memory, or over the work bound */
    bool over;    /* ... and it was the work bound */
    long work;    /* closure calls and set comparisons of the call in progress */
    /* canonical key of the committed state */
    uint32_t *key;
    size_t key_cap;
    int key_len;
    uint64_t key_hash;
    /* compaction scratch */
    struct snode *nodes2;
    size_t nodes2_cap;
    int32_t *remap, *hash;
    size_t remap_cap, hash_cap;
    uint32_t *chain;
    size_t chain_cap;
    int32_t *offs;
    size_t offs_cap;
    int32_t *path;
    size_t path_cap;
    long walk_nodes;
};

/* Counts n units of work; past GM_MAX_WORK the call in progress fails (ERR_RANGE). The
 * bound stops a grammar whose configurations multiply (deliberately ambiguous GBNF, e.g.
 * `s ::= "-" s "a" | "-" s "b" | ""`: 2^k stacks after k dashes) from holding the
 * scheduler thread; grammars that are not built that way stay orders of magnitude below. */
static bool spend(struct grammar_matcher *m, long n)
{
    m->work += n;
    if (m->work <= GM_MAX_WORK)
        return true;
    m->oom = m->over = true;
    return false;
}

static int node_new(struct grammar_matcher *m, int32_t pos, int32_t aux, int32_t parent)
{
    if ((size_t)m->n_nodes >= m->nodes_cap &&
        !grow_array((void **)&m->nodes, &m->nodes_cap, (size_t)m->n_nodes + 1, sizeof *m->nodes)) {
        m->oom = true;
        return -1;
    }
    m->nodes[m->n_nodes] = (struct snode){ pos, aux, parent };
    return m->n_nodes++;
}

/* True when the stacks from frames a and b down are equal: the same frames, possibly in
 * different nodes (frames pushed during one advance are not hash-consed). */
static bool same_stack(const struct grammar_matcher *m, int32_t a, int32_t b)
{
    while (a != b) {
        if (a < 0 || b < 0)
            return false;
        const struct snode *x = &m->nodes[a], *y = &m->nodes[b];
        if (x->pos != y->pos || x->aux != y->aux)
            return false;
        a = x->parent;
        b = y->parent;
    }
    return true;
}

/* Appends a configuration (top frame pos/aux over parent) to the set being built at
 * [sb, *se), unless an equal one is there. Equal means equal stacks, not equal nodes:
 * an ambiguous grammar (e.g. GBNF `("-"+)+`) reaches one configuration along several
 * paths, each pushing its own copy of the frames, and keeping the copies would double
 * the set at every byte. */
static void set_add(struct grammar_matcher *m, int sb, int *se, int32_t pos, int32_t aux, int32_t parent)
{
    if (!spend(m, *se - sb + 1))
        return;
    for (int i = sb; i < *se; i++) {
        const struct snode *n = &m->nodes[m->set[i]];
        if (n->pos == pos && n->aux == aux && same_stack(m, n->parent, parent))
            return;
    }
    int id = node_new(m, pos, aux, parent);
    if (id < 0)
        return;
    if ((size_t)*se >= m->set_cap && !grow_array((void **)&m->set, &m->set_cap, (size_t)*se + 1, sizeof *m->set)) {
        m->oom = true;
        return;
    }
    m->set[(*se)++] = id;
}

/* Adds every configuration reached from "continue at element pos over stack parent"
 * without consuming a byte. */
static void closure(struct grammar_matcher *m, int32_t pos, int32_t parent, int sb, int *se, int depth)
{
    const struct grammar *g = m->g;
    if (depth > GM_CLOSURE_DEPTH || m->oom || !spend(m, 1))
        return;
    for (;;) {
        const struct gel *e = &g->elems[pos];
        switch (e->kind) {
        case GEL_END:
            if (parent < 0) {
                m->w_end = true;
                return;
            }
            pos = m->nodes[parent].pos;
            parent = m->nodes[parent].parent;
            if (++depth > GM_CLOSURE_DEPTH)
                return;
            continue;
        case GEL_CLASS:
            set_add(m, sb, se, pos, 0, parent);
            return;
        case GEL_DFA: {
            const struct gdfa *d = &g->dfas[e->arg];
            if (d->live[d->start])
                set_add(m, sb, se, pos, d->start, parent);
            if (!d->accept[d->start])
                return;
            pos++;
            continue;
        }
        default: { /* GEL_REF */
            int32_t cont = parent;
            if (g->elems[pos + 1].kind != GEL_END && (cont = node_new(m, pos + 1, 0, parent)) < 0)
                return;
            int r = (int)e->arg;
            int a0 = g->rule_alt_first[r], na = g->rule_alt_count[r];
            for (int a = 0; a < na; a++)
                closure(m, g->alt_start[a0 + a], cont, sb, se, depth + 1);
            return;
        }
        }
    }
}

/* Advances the set [ib, ie) by byte c into [ob, *oe) (ob >= ie); sets m->w_end. */
static void advance_ex(struct grammar_matcher *m, int ib, int ie, unsigned c, int ob, int *oe, bool skip_dfa)
{
    const struct grammar *g = m->g;
    m->w_end = false;
    *oe = ob;
    for (int i = ib; i < ie; i++) {
        struct snode n = m->nodes[m->set[i]];
        const struct gel *e = &g->elems[n.pos];
        if (e->kind == GEL_CLASS) {
            if (gr_class_has(g->classes[e->arg], c))
                closure(m, n.pos + 1, n.parent, ob, oe, 0);
        } else if (!skip_dfa) {
            const struct gdfa *d = &g->dfas[e->arg];
            int32_t t = gdfa_step(d, n.aux, c);
            if (t < 0)
                continue;
            if (d->live[t])
                set_add(m, ob, oe, n.pos, t, n.parent);
            if (d->accept[t])
                closure(m, n.pos + 1, n.parent, ob, oe, 0);
        }
    }
}

static void advance(struct grammar_matcher *m, int ib, int ie, unsigned c, int ob, int *oe)
{
    advance_ex(m, ib, ie, c, ob, oe, false);
}

/* Makes sure the set buffer holds n more entries past at (so that advance rarely grows). */
static bool set_reserve(struct grammar_matcher *m, size_t need)
{
    if (need <= m->set_cap)
        return true;
    if (!grow_array((void **)&m->set, &m->set_cap, need, sizeof *m->set)) {
        m->oom = true;
        return false;
    }
    return true;
}

/* ---- committing a state: hash-consed copy and canonical key ----------------------------- */

static int cmp_chain(const uint32_t *a, const uint32_t *b)
{
    /* chains are length-prefixed */
    uint32_t la = a[0], lb = b[0];
    for (uint32_t i = 1; i <= la && i <= lb; i++)
        if (a[i] != b[i])
            return a[i] < b[i] ? -1 : 1;
    return la < lb ? -1 : la > lb;
}

/* Copies frame old (and those below) into nodes2 with hash-consing; returns its new id.
 * Iterative: recursive schemas can nest frames deeply. */
static int32_t compact_node(struct grammar_matcher *m, int32_t old, int *n2)
{
    int np = 0;
    for (int32_t id = old; id >= 0 && m->remap[id] < 0; id = m->nodes[id].parent) {
        if ((size_t)np >= m->path_cap && !grow_array((void **)&m->path, &m->path_cap, (size_t)np + 1, sizeof *m->path))
            return -2;
        m->path[np++] = id;
    }
    int32_t result = old < 0 ? -1 : m->remap[old];
    while (np > 0) {
        int32_t id = m->path[--np], p = m->nodes[id].parent;
        struct snode x = { m->nodes[id].pos, m->nodes[id].aux, p < 0 ? -1 : m->remap[p] };
        uint64_t h = ((uint64_t)(uint32_t)x.pos * 0x9E3779B97F4A7C15ull) ^
                     ((uint64_t)(uint32_t)x.aux * 0xC2B2AE3D27D4EB4Full) ^
                     ((uint64_t)(uint32_t)x.parent * 0x165667B19E3779F9ull);
        size_t mask = m->hash_cap - 1, k = (size_t)(h ^ (h >> 31)) & mask;
        while (m->hash[k] >= 0) {
            const struct snode *y = &m->nodes2[m->hash[k]];
            if (y->pos == x.pos && y->aux == x.aux && y->parent == x.parent)
                break;
            k = (k + 1) & mask;
        }
        if (m->hash[k] < 0) {
            m->nodes2[*n2] = x;
            m->hash[k] = (*n2)++;
        }
        result = m->remap[id] = m->hash[k];
    }
    return result;
}

/* Makes the configurations set[sb, se) the committed state (with can_end = end).
 * Returns 0 or ERR_NOMEM (state unchanged). */
static int commit(struct grammar_matcher *m, int sb, int se, bool end)
{
    size_t n_old = (size_t)m->n_nodes, hcap = 64;
    while (hcap < n_old * 2 + 2)
        hcap *= 2;
    if (!grow_array((void **)&m->nodes2, &m->nodes2_cap, n_old + 1, sizeof *m->nodes2) ||
        !grow_array((void **)&m->remap, &m->remap_cap, n_old + 1, sizeof *m->remap) ||
        !grow_array((void **)&m->hash, &m->hash_cap, hcap, sizeof *m->hash))
        return ERR_NOMEM;
    hcap = m->hash_cap;
    /* hash_cap must be a power of two for the probe mask */
    while (hcap & (hcap - 1))
        hcap &= hcap - 1;
    m->hash_cap = hcap;
    memset(m->remap, 0xFF, sizeof *m->remap * n_old);
    memset(m->hash, 0xFF, sizeof *m->hash * hcap);
    int n2 = 0, nt = 0;
    int32_t *tops = m->set + se; /* room after the set */
    if (!set_reserve(m, (size_t)se + (size_t)(se - sb) + 1))
        return ERR_NOMEM;
    tops = m->set + se;
    for (int i = sb; i < se; i++) {
        int32_t id = compact_node(m, m->set[i], &n2);
        if (id == -2)
            return ERR_NOMEM;
        bool dup = false;
        for (int j = 0; j < nt && !dup; j++)
            dup = tops[j] == id;
        if (!dup)
            tops[nt++] = id;
    }
    /* key: per configuration its frames top to bottom (pos, aux), sorted; then can_end */
    size_t need = 2;
    for (int j = 0; j < nt; j++)
        for (int32_t id = tops[j]; id >= 0; id = m->nodes2[id].parent)
            need += 2;
    need += (size_t)nt;
    if (!grow_array((void **)&m->chain, &m->chain_cap, need, sizeof *m->chain) ||
        !grow_array((void **)&m->key, &m->key_cap, need, sizeof *m->key))
        return ERR_NOMEM;
    /* chains into m->chain, then sort their offsets (insertion sort: sets are small) */
    if (!grow_array((void **)&m->offs, &m->offs_cap, (size_t)nt + 1, sizeof *m->offs))
        return ERR_NOMEM;
    int32_t *offs = m->offs;
    size_t w = 0;
    for (int j = 0; j < nt; j++) {
        offs[j] = (int32_t)w;
        size_t at = w++;
        uint32_t len = 0;
        for (int32_t id = tops[j]; id >= 0; id = m->nodes2[id].parent) {
            const struct snode *x = &m->nodes2[id];
            const struct gel *e = &m->g->elems[x->pos];
            /* a DFA state stands for its behaviour class: same class, same mask */
            m->chain[w++] = (uint32_t)x->pos;
            m->chain[w++] = (uint32_t)(id == tops[j] && e->kind == GEL_DFA ? m->g->dfas[e->arg].cls[x->aux] : x->aux);
            len += 2;
        }
        m->chain[at] = len;
    }
    for (int j = 1; j < nt; j++) {
        int32_t o = offs[j], t = tops[j];
        int k = j - 1;
        while (k >= 0 && cmp_chain(m->chain + offs[k], m->chain + o) > 0) {
            offs[k + 1] = offs[k];
            tops[k + 1] = tops[k];
            k--;
        }
        offs[k + 1] = o;
        tops[k + 1] = t;
    }
    size_t kl = 0;
    for (int j = 0; j < nt; j++) {
        const uint32_t *c = m->chain + offs[j];
        memcpy(m->key + kl, c, sizeof *c * (c[0] + 1));
        kl += c[0] + 1;
    }
    m->key[kl++] = end ? 1u : 0u;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < kl; i++) {
        h ^= m->key[i];
        h *= 1099511628211ull;
    }
    m->key_len = (int)kl;
    m->key_hash = h;
    /* swap arenas and install the tops at set[0, nt) */
    struct snode *tn = m->nodes;
    size_t tc = m->nodes_cap;
    m->nodes = m->nodes2;
    m->nodes_cap = m->nodes2_cap;
    m->nodes2 = tn;
    m->nodes2_cap = tc;
    m->n_nodes = m->n_base = n2;
    memmove(m->set, tops, sizeof *tops * (size_t)nt);
    m->n_tops = nt;
    m->can_end = end;
    return 0;
}

/* ---- public API ----------------------------------------------------------------------- */

int gm_start(struct grammar *g, struct grammar_matcher **out)
{
    *out = NULL;
    struct grammar_matcher *m = calloc(1, sizeof *m);
    if (!m)
        return ERR_NOMEM;
    m->g = grammar_ref(g);
    int se = 0;
    m->w_end = false;
    int a0 = g->rule_alt_first[0], na = g->rule_alt_count[0];
    for (int a = 0; a < na; a++)
        closure(m, g->alt_start[a0 + a], -1, 0, &se, 0);
    if (m->oom || commit(m, 0, se, m->w_end)) {
        int rc = m->over ? ERR_RANGE : ERR_NOMEM;
        gm_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

struct grammar_matcher *gm_create(struct grammar *g)
{
    struct grammar_matcher *m;
    gm_start(g, &m);
    return m;
}

void gm_free(struct grammar_matcher *m)
{
    if (!m)
        return;
    grammar_unref(m->g);
    free(m->nodes);
    free(m->nodes2);
    free(m->set);
    free(m->key);
    free(m->remap);
    free(m->hash);
    free(m->chain);
    free(m->offs);
    free(m->path);
    free(m);
}

int gm_copy(struct grammar_matcher *dst, const struct grammar_matcher *src)
{
    if (dst->g != src->g)
        return ERR_INVALID;
    /* the committed state: the arena's base frames, the top configurations and the key */
    if (!grow_array((void **)&dst->nodes, &dst->nodes_cap, (size_t)src->n_base + 1, sizeof *dst->nodes) ||
        !grow_array((void **)&dst->set, &dst->set_cap, (size_t)src->n_tops + 1, sizeof *dst->set) ||
        !grow_array((void **)&dst->key, &dst->key_cap, (size_t)src->key_len + 1, sizeof *dst->key))
        return ERR_NOMEM;
    memcpy(dst->nodes, src->nodes, sizeof *dst->nodes * (size_t)src->n_base);
    memcpy(dst->set, src->set, sizeof *dst->set * (size_t)src->n_tops);
    memcpy(dst->key, src->key, sizeof *dst->key * (size_t)src->key_len);
    dst->n_nodes = dst->n_base = src->n_base;
    dst->n_tops = src->n_tops;
    dst->key_len = src->key_len;
    dst->key_hash = src->key_hash;
    dst->can_end = src->can_end;
    dst->ended = src->ended;
    dst->oom = dst->over = false;
    return 0;
}

bool gm_can_end(const struct grammar_matcher *m) { return m->ended || m->can_end; }

bool gm_is_done(const struct grammar_matcher *m) { return m->ended || m->n_tops == 0; }

int gm_accept(struct grammar_matcher *m, int32_t token)
{
    const struct grammar_vocab *v = m->g->vocab;
    if (token < 0 || token >= v->vocab_size)
        return ERR_INVALID;
    if (v->is_eog[token]) {
        if (!gm_can_end(m))
            return ERR_INVALID;
        m->ended = true;
        return 0;
    }
    if (m->ended || v->is_special[token] || v->off[token + 1] == v->off[token])
        return ERR_INVALID;
    const uint8_t *b = (const uint8_t *)v->bytes + v->off[token];
    int len = (int)(v->off[token + 1] - v->off[token]);
    int ib = 0, ie = m->n_tops;
    bool end = false, dead = false;
    m->oom = m->over = false;
    m->work = 0;
    for (int i = 0; i < len && !dead; i++) {
        int oe;
        if (ie == ib || !set_reserve(m, (size_t)ie + 64)) {
            dead = true;
            break;
        }
        advance(m, ib, ie, b[i], ie, &oe);
        end = m->w_end;
        ib = ie;
        ie = oe;
        dead = m->oom || (ie == ib && !end);
    }
    if (dead || m->oom) {
        m->n_nodes = m->n_base;
        return m->oom ? (m->over ? ERR_RANGE : ERR_NOMEM) : ERR_INVALID;
    }
    int rc = commit(m, ib, ie, end);
    if (rc) {
        m->n_nodes = m->n_base;
        return rc;
    }
    return 0;
}

/* The mask walk. A token is allowed when some configuration consumes all its bytes, so
 * configurations can be walked separately and their results OR-ed: the CLASS ones (short
 * literal paths, few bytes each) together by walk(), each DFA one by dfa_walk(), which
 * follows only the DFA's table (one lookup per trie node: free text costs little) and
 * hands the text after the lexeme ends ("exits") back to walk(). */

struct dfa_walk_ctx {
    const struct gdfa *d;
    int eb, ee;   /* set[eb, ee): the configurations after the lexeme (its exit closure) */
    bool e_end;   /* the exit reaches the end of the grammar */
    uint32_t e_first[8]; /* bytes the exit configurations can take */
};

static void walk(struct grammar_matcher *m, int node, int sb, int se, uint32_t *mask);

static inline void mark_tokens(const struct grammar_vocab *v, int c, uint32_t *mask)
{
    uint32_t n = v->nodes[c].tok_count;
    const int32_t *ids = v->tok_ids + v->nodes[c].tok_first;
    for (uint32_t t = 0; t < n; t++)
        mask[ids[t] >> 5] |= 1u << (ids[t] & 31);
}

static void first_bytes(const struct grammar_matcher *m, int sb, int se, uint32_t out[8], bool skip_dfa)
{
    const struct grammar *g = m->g;
    memset(out, 0, 8 * sizeof *out);
    for (int i = sb; i < se; i++) {
        const struct snode *n = &m->nodes[m->set[i]];
        const struct gel *e = &g->elems[n->pos];
        if (e->kind != GEL_CLASS && skip_dfa)
            continue;
        const uint32_t *bits = e->kind == GEL_CLASS ? g->classes[e->arg] : g->dfas[e->arg].next + (size_t)n->aux * 8;
        for (int k = 0; k < 8; k++)
            out[k] |= bits[k];
    }
}

/* Below trie node `node` with the DFA in state s; exits: whether ending the lexeme at
 * this node is walked here (not at the first node, whose set already holds the exit). */
static void dfa_walk(struct grammar_matcher *m, const struct dfa_walk_ctx *x, int node, int s, bool exits,
                     uint32_t *mask)
{
    const struct grammar_vocab *v = m->g->vocab;
    const struct gdfa *d = x->d;
    const int32_t *tr = d->trans + (size_t)s * (size_t)d->n_bc;
    const uint8_t *bc = d->bc;
    bool can_exit = exits && d->accept[s] && x->ee > x->eb;
    const struct gtrie_node *tn = v->nodes;
    int end = node + (int)tn[node].size;
    long visited = 0;
    bool exit_alive = x->ee > x->eb || x->e_end;
    for (int c = node + 1; c < end; c += (int)tn[c].size) {
        unsigned b = tn[c].byte;
        int32_t t = tr[bc[b]];
        visited++;
        if (t >= 0 && (d->live[t] || exit_alive)) {
            if (tn[c].tok_count)
                mark_tokens(v, c, mask);
            if (tn[c].size > 1)
                dfa_walk(m, x, c, t, true, mask);
        }
        if (can_exit && gr_class_has(x->e_first, b)) {
            int mark = m->n_nodes, oe;
            if (!set_reserve(m, (size_t)x->ee + 64))
                return;
            advance(m, x->eb, x->ee, b, x->ee, &oe);
            if (oe > x->ee || m->w_end) {
                mark_tokens(v, c, mask);
                if (oe > x->ee && tn[c].size > 1)
                    walk(m, c, x->ee, oe, mask);
            }
            m->n_nodes = mark;
            if (m->oom)
                break;
        }
    }
    m->walk_nodes += visited;
}

/* ---- per-DFA-state memo ---------------------------------------------------------------- */

struct memo_build {
    const struct grammar_vocab *v;
    const struct gdfa *d;
    uint32_t *inside;
    uint32_t (*bnd)[2];
    size_t cap;
    int n;
    long visited;
    bool oom;
};

static void memo_walk(struct memo_build *b, int node, int s, int depth)
{
    const struct gtrie_node *tn = b->v->nodes;
    const struct gdfa *d = b->d;
    const int32_t *tr = d->trans + (size_t)s * (size_t)d->n_bc;
    bool acc = depth > 0 && d->accept[s];
    int end = node + (int)tn[node].size;
    for (int c = node + 1; c < end; c += (int)tn[c].size) {
        int32_t t = tr[d->bc[tn[c].byte]];
        b->visited++;
        if (t >= 0) {
            if (tn[c].tok_count)
                mark_tokens(b->v, c, b->inside);
            if (tn[c].size > 1)
                memo_walk(b, c, t, depth + 1);
        } else if (acc) {
            if (!grow_array((void **)&b->bnd, &b->cap, (size_t)b->n + 1, sizeof *b->bnd)) {
                b->oom = true;
                return;
            }
            b->bnd[b->n][0] = (uint32_t)c;
            b->bnd[b->n][1] = (uint32_t)s;
            b->n++;
        }
    }
}

/* The memo of (dfa, state): found in the grammar, or computed and kept there (a computed
 * one is returned in *tmp when the grammar's slots are full; the caller frees it). */
static const struct gdfa_memo *memo_get(struct grammar_matcher *m, int dfa, int state, struct gdfa_memo *tmp)
{
    struct grammar *g = m->g;
    pthread_mutex_lock(&g->cache_lock);
    /* one memo per behaviour class: equivalent states consume the same tokens */
    int cls = g->dfas[dfa].cls[state];
    for (int i = 0; i < g->n_memo; i++)
        if (g->memo[i].dfa == dfa && g->dfas[dfa].cls[g->memo[i].state] == cls) {
            pthread_mutex_unlock(&g->cache_lock);
            return &g->memo[i];
        }
    pthread_mutex_unlock(&g->cache_lock);
    struct memo_build b = { .v = g->vocab, .d = &g->dfas[dfa] };
    b.inside = calloc((size_t)grammar_mask_words(g->vocab->vocab_size), sizeof *b.inside);
    if (!b.inside) {
        m->oom = true;
        return NULL;
    }
    memo_walk(&b, 0, state, 0);
    m->walk_nodes += b.visited;
    if (b.oom) {
        free(b.inside);
        free(b.bnd);
        m->oom = true;
        return NULL;
    }
    struct gdfa_memo e = { dfa, state, b.inside, b.bnd, b.n };
    if (b.visited < GM_MEMO_MIN_NODES) { /* cheap to redo: keep the slots for free text */
        *tmp = e;
        return tmp;
    }
    pthread_mutex_lock(&g->cache_lock);
    const struct gdfa_memo *out = NULL;
    for (int i = 0; i < g->n_memo && !out; i++) /* another thread may have added it */
        if (g->memo[i].dfa == dfa && g->dfas[dfa].cls[g->memo[i].state] == cls)
            out = &g->memo[i];
    if (!out && g->n_memo < GR_MEMO_SLOTS) {
        g->memo[g->n_memo] = e;
        out = &g->memo[g->n_memo++];
        e.inside = NULL;
        e.bnd = NULL;
    }
    pthread_mutex_unlock(&g->cache_lock);
    if (out) {
        free(e.inside);
        free(e.bnd);
        return out;
    }
    *tmp = e;
    return tmp;
}

/* One DFA configuration through its memo: the tokens inside the lexeme, then the exits at
 * the boundary nodes whose byte the text after the lexeme can take. */
static void dfa_memo_walk(struct grammar_matcher *m, const struct dfa_walk_ctx *x, int dfa, int state, uint32_t *mask)
{
    const struct grammar_vocab *v = m->g->vocab;
    struct gdfa_memo tmp = { 0 };
    const struct gdfa_memo *e = memo_get(m, dfa, state, &tmp);
    if (!e)
        return;
    int words = grammar_mask_words(v->vocab_size);
    for (int i = 0; i < words; i++)
        mask[i] |= e->inside[i];
    for (int i = 0; i < e->n_bnd && !m->oom; i++) {
        int c = (int)e->bnd[i][0];
        unsigned b = v->nodes[c].byte;
        if (!gr_class_has(x->e_first, b))
            continue;
        int mark = m->n_nodes, oe;
        if (!set_reserve(m, (size_t)x->ee + 64))
            break;
        advance(m, x->eb, x->ee, b, x->ee, &oe);
        if (oe > x->ee || m->w_end) {
            mark_tokens(v, c, mask);
            if (oe > x->ee && v->nodes[c].size > 1)
                walk(m, c, x->ee, oe, mask);
        }
        m->n_nodes = mark;
    }
    if (e == &tmp) {
        free(tmp.inside);
        free(tmp.bnd);
    }
}

/* Below trie node `node` with configurations set[sb, se) (se is the first free entry). */
static void walk(struct grammar_matcher *m, int node, int sb, int se, uint32_t *mask)
{
    const struct grammar *g = m->g;
    const struct grammar_vocab *v = g->vocab;
    /* DFA configurations: each walked on its own */
    bool any_class = false;
    for (int i = sb; i < se && !m->oom; i++) {
        struct snode n = m->nodes[m->set[i]];
        const struct gel *e = &g->elems[n.pos];
        if (e->kind == GEL_CLASS) {
            any_class = true;
            continue;
        }
        struct dfa_walk_ctx x = { .d = &g->dfas[e->arg], .eb = se, .ee = se };
        int mark = m->n_nodes;
        m->w_end = false;
        closure(m, n.pos + 1, n.parent, x.eb, &x.ee, 0);
        x.e_end = m->w_end;
        first_bytes(m, x.eb, x.ee, x.e_first, false);
        bool disjoint = true;
        for (int k = 0; k < 8; k++)
            disjoint &= !(x.e_first[k] & x.d->cont[k]);
        /* the memo holds for the whole vocabulary below the root: use it there when the
         * text after the lexeme never starts with a byte the lexeme could also take */
        if (node == 0 && disjoint && (x.ee > x.eb || x.e_end))
            dfa_memo_walk(m, &x, (int)e->arg, n.aux, mask);
        else
            dfa_walk(m, &x, node, n.aux, false, mask);
        m->n_nodes = mark;
    }
    if (!any_class)
        return;
    uint32_t next[8];
    first_bytes(m, sb, se, next, true);
    int end = node + (int)v->nodes[node].size;
    for (int c = node + 1; c < end; c += (int)v->nodes[c].size) {
        unsigned byte = v->nodes[c].byte;
        if (!gr_class_has(next, byte))
            continue;
        m->walk_nodes++;
        int mark = m->n_nodes, oe;
        if (!set_reserve(m, (size_t)se + 64))
            return;
        advance_ex(m, sb, se, byte, se, &oe, true);
        if (oe > se || m->w_end) {
            mark_tokens(v, c, mask);
            if (oe > se && v->nodes[c].size > 1)
                walk(m, c, se, oe, mask);
        }
        m->n_nodes = mark;
        if (m->oom)
            return;
    }
}

static void set_eog(const struct grammar_vocab *v, uint32_t *mask)
{
    for (int i = 0; i < v->n_eog; i++)
        mask[v->eog[i] >> 5] |= 1u << (v->eog[i] & 31);
}

int gm_fill_mask_uncached(struct grammar_matcher *m, uint32_t *mask)
{
    const struct grammar_vocab *v = m->g->vocab;
    memset(mask, 0, sizeof *mask * (size_t)grammar_mask_words(v->vocab_size));
    m->walk_nodes = 0;
    if (!m->ended && m->n_tops > 0) {
        m->oom = m->over = false;
        m->work = 0;
        walk(m, 0, 0, m->n_tops, mask);
        m->n_nodes = m->n_base;
        if (m->oom)
            return m->over ? ERR_RANGE : ERR_NOMEM;
    }
    if (gm_can_end(m))
        set_eog(v, mask);
    return 0;
}

long gm_last_walk_nodes(const struct grammar_matcher *m) { return m->walk_nodes; }

int gm_fill_mask(struct grammar_matcher *m, uint32_t *mask)
{
    struct grammar *g = m->g;
    size_t words = (size_t)grammar_mask_words(g->vocab->vocab_size);
    if (m->ended || m->n_tops == 0)
        return gm_fill_mask_uncached(m, mask);
    pthread_mutex_lock(&g->cache_lock);
    for (int i = 0; i < GR_CACHE_SLOTS; i++) {
        struct gcache_entry *c = &g->cache[i];
        if (c->used && c->hash == m->key_hash && c->key_len == m->key_len &&
            !memcmp(c->key, m->key, sizeof *m->key * (size_t)m->key_len)) {
            memcpy(mask, c->mask, sizeof *mask * words);
            pthread_mutex_unlock(&g->cache_lock);
            atomic_fetch_add(&g->cache_hits, 1);
            return 0;
        }
    }
    pthread_mutex_unlock(&g->cache_lock);
    atomic_fetch_add(&g->cache_misses, 1);
    int rc = gm_fill_mask_uncached(m, mask);
    if (rc || m->walk_nodes < GM_CACHE_MIN_NODES)
        return rc;
    pthread_mutex_lock(&g->cache_lock);
    struct gcache_entry *c = &g->cache[g->cache_next];
    g->cache_next = (g->cache_next + 1) % GR_CACHE_SLOTS;
    bool ok = true;
    if (!c->mask)
        ok = (c->mask = malloc(sizeof *c->mask * words)) != NULL;
    if (ok && (size_t)m->key_len > (size_t)c->key_cap) {
        uint32_t *k = realloc(c->key, sizeof *k * (size_t)m->key_len);
        ok = k != NULL;
        if (ok) {
            c->key = k;
            c->key_cap = m->key_len;
        }
    }
    if (ok) {
        memcpy(c->key, m->key, sizeof *m->key * (size_t)m->key_len);
        c->key_len = m->key_len;
        c->hash = m->key_hash;
        memcpy(c->mask, mask, sizeof *mask * words);
        c->used = true;
    } else {
        c->used = false;
    }
    pthread_mutex_unlock(&g->cache_lock);
    return 0;
}

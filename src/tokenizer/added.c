/* added.c — the added-token matcher: a byte trie over the added tokens' contents and a
 * leftmost-longest search, the semantics of the Aho-Corasick automaton (MatchKind::
 * LeftmostLongest) that Hugging Face's AddedVocabulary uses. A bitmap of first bytes
 * lets the scan skip positions where no token starts. Read-only after loading.
 */
#include "tokenizer/tok_internal.h"

#include "util/err.h"

#include <stdlib.h>
#include <string.h>

static int32_t trie_new_node(struct tok_trie *tr, uint8_t byte)
{
    if (tr->n == tr->cap) {
        int32_t cap = tr->cap ? tr->cap * 2 : 64;
        struct tok_trie_node *nodes = realloc(tr->nodes, (size_t)cap * sizeof *nodes);
        if (!nodes)
            return ERR_NOMEM;
        tr->nodes = nodes;
        tr->cap = cap;
    }
    struct tok_trie_node *nd = &tr->nodes[tr->n];
    nd->first_child = -1;
    nd->next_sibling = -1;
    nd->token = -1;
    nd->byte = byte;
    return tr->n++;
}

static int32_t trie_child(const struct tok_trie *tr, int32_t node, uint8_t byte)
{
    for (int32_t c = tr->nodes[node].first_child; c >= 0; c = tr->nodes[c].next_sibling)
        if (tr->nodes[c].byte == byte)
            return c;
    return -1;
}

int tok_trie_insert(struct tok_trie *tr, const char *s, size_t n, int32_t id)
{
    if (n == 0)
        return 0; /* an empty token can never match */
    if (tr->n == 0 && trie_new_node(tr, 0) < 0)
        return ERR_NOMEM;
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = trie_child(tr, node, b);
        if (c < 0) {
            c = trie_new_node(tr, b);
            if (c < 0)
                return ERR_NOMEM;
            tr->nodes[c].next_sibling = tr->nodes[node].first_child;
            tr->nodes[node].first_child = c;
        }
        node = c;
    }
    if (tr->nodes[node].token < 0) /* duplicates: the first pattern wins, as in aho-corasick */
        tr->nodes[node].token = id;
    tr->first[(uint8_t)s[0] >> 3] |= (uint8_t)(1u << ((uint8_t)s[0] & 7));
    return 0;
}

void tok_trie_free(struct tok_trie *tr)
{
    free(tr->nodes);
    memset(tr, 0, sizeof *tr);
}

int32_t tok_trie_find(const struct tok_trie *tr, const char *s, size_t n, size_t from,
                      size_t *start, size_t *end)
{
    if (tr->n == 0)
        return -1;
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = from; i < n; i++) {
        if (!(tr->first[u[i] >> 3] & (1u << (u[i] & 7))))
            continue;
        int32_t node = 0, best = -1;
        size_t best_end = 0;
        for (size_t j = i; j < n; j++) {
            node = trie_child(tr, node, u[j]);
            if (node < 0)
                break;
            if (tr->nodes[node].token >= 0) {
                best = tr->nodes[node].token;
                best_end = j + 1;
            }
        }
        if (best >= 0) {
            *start = i;
            *end = best_end;
            return best;
        }
    }
    return -1;
}

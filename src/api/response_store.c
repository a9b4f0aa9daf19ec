/* response_store.c — the Responses API's in-memory store (response_store.h).
 *
 * Entries are one allocation each (node, id, response text, items text), linked oldest
 * to newest for eviction and chained into a hash table by id for lookups. The table has a
 * fixed bucket count chosen from the budget (about one bucket per 4 KiB), so a chain
 * stays short for any realistic mix of entry sizes; it never rehashes.
 */
#define _POSIX_C_SOURCE 200809L
#include "api/response_store.h"
#include "util/err.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct entry {
    struct entry *older, *newer; /* insertion order */
    struct entry *chain;         /* the next entry of the same bucket */
    size_t bytes;                /* counted against the budget */
    const char *response, *items;/* into text[] */
    char text[];                 /* id '\0' response '\0' items '\0' */
};

struct resp_store {
    pthread_mutex_t mu;
    size_t max_bytes, bytes;
    int n;
    struct entry *oldest, *newest;
    struct entry **buckets;      /* [n_buckets], a power of two */
    size_t n_buckets;
};

/* FNV-1a over the id's bytes. */
static uint64_t hash_id(const char *id)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return h;
}

struct resp_store *resp_store_create(size_t max_bytes)
{
    struct resp_store *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n_buckets = 64;
    while (s->n_buckets < max_bytes / 4096 && s->n_buckets < ((size_t)1 << 20)) s->n_buckets *= 2;
    if (!(s->buckets = calloc(s->n_buckets, sizeof *s->buckets))) {
        free(s);
        return NULL;
    }
    s->max_bytes = max_bytes;
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

void resp_store_free(struct resp_store *s)
{
    if (!s) return;
    for (struct entry *e = s->oldest, *next; e; e = next) {
        next = e->newer;
        free(e);
    }
    free(s->buckets);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* The bucket slot of id, and the slot that points at its entry (or at NULL). Caller
 * holds mu. */
static struct entry **find_slot(struct resp_store *s, const char *id)
{
    struct entry **slot = &s->buckets[hash_id(id) & (s->n_buckets - 1)];
    while (*slot && strcmp((*slot)->text, id)) slot = &(*slot)->chain;
    return slot;
}

/* Unlinks and frees the entry *slot points at. Caller holds mu. */
static void remove_at(struct resp_store *s, struct entry **slot)
{
    struct entry *e = *slot;
    *slot = e->chain;
    if (e->older) e->older->newer = e->newer;
    else s->oldest = e->newer;
    if (e->newer) e->newer->older = e->older;
    else s->newest = e->older;
    s->bytes -= e->bytes;
    s->n--;
    free(e);
}

int resp_store_put(struct resp_store *s, const char *id, const char *response, const char *items)
{
    size_t li = strlen(id), lr = strlen(response), lt = strlen(items);
    size_t bytes = sizeof(struct entry) + li + lr + lt + 3;
    if (bytes > s->max_bytes) return ERR_RANGE;
    struct entry *e = malloc(bytes);
    if (!e) return ERR_NOMEM;
    char *p = e->text;
    memcpy(p, id, li + 1);
    e->response = p += li + 1;
    memcpy(p, response, lr + 1);
    e->items = p += lr + 1;
    memcpy(p, items, lt + 1);
    e->bytes = bytes;

    pthread_mutex_lock(&s->mu);
    struct entry **slot = find_slot(s, id);
    if (*slot) remove_at(s, slot); /* replaced: *slot now holds the rest of the chain */
    while (s->bytes + bytes > s->max_bytes) remove_at(s, find_slot(s, s->oldest->text));
    slot = find_slot(s, id); /* evictions may have changed this chain */
    e->chain = NULL;
    *slot = e;
    e->older = s->newest;
    e->newer = NULL;
    if (s->newest) s->newest->newer = e;
    else s->oldest = e;
    s->newest = e;
    s->bytes += bytes;
    s->n++;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int resp_store_get(struct resp_store *s, const char *id, char **response, char **items)
{
    if (response) *response = NULL;
    if (items) *items = NULL;
    pthread_mutex_lock(&s->mu);
    const struct entry *e = *find_slot(s, id);
    int rc = e ? 0 : ERR_NOT_FOUND;
    if (e && response && !(*response = strdup(e->response))) rc = ERR_NOMEM;
    if (e && !rc && items && !(*items = strdup(e->items))) rc = ERR_NOMEM;
    pthread_mutex_unlock(&s->mu);
    if (rc == ERR_NOMEM && response) {
        free(*response);
        *response = NULL;
    }
    return rc;
}

int resp_store_delete(struct resp_store *s, const char *id)
{
    pthread_mutex_lock(&s->mu);
    struct entry **slot = find_slot(s, id);
    int rc = *slot ? 0 : ERR_NOT_FOUND;
    if (*slot) remove_at(s, slot);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void resp_store_usage(struct resp_store *s, int *n_entries, size_t *bytes)
{
    pthread_mutex_lock(&s->mu);
    if (n_entries) *n_entries = s->n;
    if (bytes) *bytes = s->bytes;
    pthread_mutex_unlock(&s->mu);
}

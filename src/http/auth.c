/* auth.c — API keys: matching, token-bucket rate limits, counters (see auth.h).
 *
 * Invariants (under a->mu): slots [0, n_slots) never move or disappear; an active slot
 * has a non-empty key and a name unique among all slots; a bucket never holds more than
 * its limit. Keys are compared in constant time with respect to their contents.
 */
#define _POSIX_C_SOURCE 200809L
#include "http/auth.h"
#include "util/err.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct slot {
    char name[HTTP_KEY_NAME_MAX + 1];
    char *key;                   /* NULL when inactive */
    size_t key_len;
    int64_t rpm, tpm;            /* <= 0: no limit */
    double rpm_bucket, tpm_bucket;
    double rpm_t, tpm_t;         /* monotonic seconds of the last refill; < 0: full */
    struct http_key_stats st;
};

struct http_auth {
    atomic_int refs;
    pthread_mutex_t mu;
    struct slot *slots;          /* [n_slots] */
    int n_slots, cap_slots;
    int n_active;
};

bool http_key_name_valid(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > HTTP_KEY_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '-' || c == '_' || c == '.' || c == '@' || c == ':';
        if (!ok) return false;
    }
    return true;
}

struct http_auth *auth_create(void)
{
    struct http_auth *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    atomic_init(&a->refs, 1);
    pthread_mutex_init(&a->mu, NULL);
    return a;
}

void auth_ref(struct http_auth *a) { atomic_fetch_add(&a->refs, 1); }

void auth_unref(struct http_auth *a)
{
    if (!a || atomic_fetch_sub(&a->refs, 1) != 1) return;
    for (int i = 0; i < a->n_slots; i++) {
        if (a->slots[i].key) memset(a->slots[i].key, 0, a->slots[i].key_len);
        free(a->slots[i].key);
    }
    free(a->slots);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

static int find_name(const struct http_auth *a, const char *name)
{
    for (int i = 0; i < a->n_slots; i++)
        if (!strcmp(a->slots[i].name, name)) return i;
    return -1;
}

/* Refills b (limit per minute) up to now. */
static void refill(double *bucket, double *t, int64_t limit, double now)
{
    if (limit <= 0) return;
    if (*t < 0) {
        *bucket = (double)limit;
    } else if (now > *t) {
        *bucket += (now - *t) * (double)limit / 60.0;
        if (*bucket > (double)limit) *bucket = (double)limit;
    }
    *t = now;
}

int auth_set_keys(struct http_auth *a, const struct http_key *keys, int n, char *err,
                  size_t errlen)
{
    if (n < 0 || n > AUTH_MAX_SLOTS)
        return err_set(err, errlen, ERR_RANGE, "%d keys (at most %d)", n, AUTH_MAX_SLOTS);
    for (int i = 0; i < n; i++) {
        if (!http_key_name_valid(keys[i].name))
            return err_set(err, errlen, ERR_INVALID,
                           "key %d: invalid name (1..%d of A-Z a-z 0-9 - _ . @ :)", i + 1,
                           HTTP_KEY_NAME_MAX);
        if (!keys[i].key || !keys[i].key[0])
            return err_set(err, errlen, ERR_INVALID, "key '%s': empty key", keys[i].name);
        for (int k = 0; k < i; k++) {
            if (!strcmp(keys[k].name, keys[i].name))
                return err_set(err, errlen, ERR_INVALID, "key name '%s' given twice", keys[i].name);
            if (!strcmp(keys[k].key, keys[i].key))
                return err_set(err, errlen, ERR_INVALID, "keys '%s' and '%s' are the same key",
                               keys[k].name, keys[i].name);
        }
    }
    /* copies first, so that a failure changes nothing */
    char **copies = calloc((size_t)(n ? n : 1), sizeof *copies);
    if (!copies) return err_set(err, errlen, ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        if (!(copies[i] = strdup(keys[i].key))) {
            for (int k = 0; k < i; k++) free(copies[k]);
            free(copies);
            return err_set(err, errlen, ERR_NOMEM, "out of memory");
        }

    pthread_mutex_lock(&a->mu);
    int new_names = 0;
    for (int i = 0; i < n; i++) new_names += find_name(a, keys[i].name) < 0;
    int rc = 0;
    if (a->n_slots + new_names > AUTH_MAX_SLOTS) {
        rc = err_set(err, errlen, ERR_RANGE, "more than %d distinct key names", AUTH_MAX_SLOTS);
    } else if (a->n_slots + new_names > a->cap_slots) {
        int cap = a->cap_slots ? a->cap_slots : 16;
        while (cap < a->n_slots + new_names) cap *= 2;
        struct slot *s = realloc(a->slots, sizeof *s * (size_t)cap);
        if (!s) rc = err_set(err, errlen, ERR_NOMEM, "out of memory");
        else {
            a->slots = s;
            a->cap_slots = cap;
        }
    }
    if (rc) {
        pthread_mutex_unlock(&a->mu);
        for (int i = 0; i < n; i++) free(copies[i]);
        free(copies);
        return rc;
    }
    for (int i = 0; i < a->n_slots; i++) { /* deactivate all; the loop below revives */
        struct slot *s = &a->slots[i];
        if (s->key) memset(s->key, 0, s->key_len);
        free(s->key);
        s->key = NULL;
        s->key_len = 0;
    }
    for (int i = 0; i < n; i++) {
        int k = find_name(a, keys[i].name);
        struct slot *s;
        if (k < 0) {
            s = &a->slots[a->n_slots++];
            memset(s, 0, sizeof *s);
            snprintf(s->name, sizeof s->name, "%s", keys[i].name);
            snprintf(s->st.name, sizeof s->st.name, "%s", keys[i].name);
            s->rpm_t = s->tpm_t = -1;
        } else {
            s = &a->slots[k];
        }
        s->key = copies[i];
        s->key_len = strlen(copies[i]);
        if (s->rpm != keys[i].rpm) s->rpm_t = -1; /* a new limit starts full */
        if (s->tpm != keys[i].tpm) s->tpm_t = -1;
        s->rpm = keys[i].rpm;
        s->tpm = keys[i].tpm;
    }
    a->n_active = n;
    pthread_mutex_unlock(&a->mu);
    free(copies);
    return 0;
}

int auth_active(struct http_auth *a)
{
    pthread_mutex_lock(&a->mu);
    int n = a->n_active;
    pthread_mutex_unlock(&a->mu);
    return n;
}

int auth_match(struct http_auth *a, const char *key, size_t len)
{
    pthread_mutex_lock(&a->mu);
    unsigned found = 0, which = 0;
    for (int k = 0; k < a->n_slots; k++) {
        const struct slot *s = &a->slots[k];
        if (!s->key) continue; /* which slots are active is not secret */
        const unsigned char *want = (const unsigned char *)s->key;
        size_t n = s->key_len > len ? s->key_len : len;
        unsigned diff = (unsigned)(s->key_len != len);
        for (size_t i = 0; i < n; i++) {
            unsigned x = i < len ? (unsigned char)key[i] : 0u;
            unsigned y = i < s->key_len ? want[i] : 0u;
            diff |= x ^ y;
        }
        unsigned eq = (unsigned)(diff == 0);
        found |= eq;
        which |= (0u - eq) & (unsigned)k; /* keys are unique: at most one matches */
    }
    pthread_mutex_unlock(&a->mu);
    return found ? (int)which : -1;
}

int auth_admit(struct http_auth *a, int slot, bool metered, double now, double *retry_after_s,
               const char **limit)
{
    pthread_mutex_lock(&a->mu);
    int rc = 0;
    if (slot >= 0 && slot < a->n_slots) {
        struct slot *s = &a->slots[slot];
        s->st.requests++;
        if (metered) {
            refill(&s->rpm_bucket, &s->rpm_t, s->rpm, now);
            refill(&s->tpm_bucket, &s->tpm_t, s->tpm, now);
            if (s->rpm > 0 && s->rpm_bucket < 1.0) {
                *retry_after_s = (1.0 - s->rpm_bucket) * 60.0 / (double)s->rpm;
                *limit = "rpm";
                s->st.rate_limited_rpm++;
                rc = 1;
            } else if (s->tpm > 0 && s->tpm_bucket <= 0) {
                *retry_after_s = (1.0 - s->tpm_bucket) * 60.0 / (double)s->tpm;
                *limit = "tpm";
                s->st.rate_limited_tpm++;
                rc = 1;
            } else if (s->rpm > 0) {
                s->rpm_bucket -= 1.0;
            }
        }
    }
    pthread_mutex_unlock(&a->mu);
    return rc;
}

void auth_charge(struct http_auth *a, int slot, int prompt_tokens, int completion_tokens,
                 double now)
{
    pthread_mutex_lock(&a->mu);
    if (slot >= 0 && slot < a->n_slots) {
        struct slot *s = &a->slots[slot];
        if (prompt_tokens > 0) s->st.prompt_tokens += (uint64_t)prompt_tokens;
        if (completion_tokens > 0) s->st.completion_tokens += (uint64_t)completion_tokens;
        refill(&s->tpm_bucket, &s->tpm_t, s->tpm, now);
        if (s->tpm > 0)
            s->tpm_bucket -= (double)(prompt_tokens > 0 ? prompt_tokens : 0) +
                             (double)(completion_tokens > 0 ? completion_tokens : 0);
    }
    pthread_mutex_unlock(&a->mu);
}

void auth_name(struct http_auth *a, int slot, char *buf, size_t cap)
{
    pthread_mutex_lock(&a->mu);
    snprintf(buf, cap, "%s", slot >= 0 && slot < a->n_slots ? a->slots[slot].name : "");
    pthread_mutex_unlock(&a->mu);
}

int auth_stats(struct http_auth *a, struct http_key_stats *out, int cap)
{
    pthread_mutex_lock(&a->mu);
    int n = a->n_slots;
    for (int i = 0; i < n && i < cap; i++) {
        out[i] = a->slots[i].st;
        out[i].active = a->slots[i].key != NULL;
    }
    pthread_mutex_unlock(&a->mu);
    return n;
}

/* keyfile.c — the API key file parser (see keyfile.h). Key bytes are wiped before their
 * buffers are freed. */
#define _POSIX_C_SOURCE 200809L
#include "config/keyfile.h"
#include "util/err.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int keyfile_name_valid(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 64) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!isalnum(c) && !strchr("-_.@:", c)) return 0;
    }
    return 1;
}

static void wipe_free(char *s)
{
    if (!s) return;
    memset(s, 0, strlen(s));
    free(s);
}

void keyfile_free(struct keyfile *kf)
{
    if (!kf) return;
    for (int i = 0; i < kf->n; i++) {
        free(kf->e[i].name);
        wipe_free(kf->e[i].key);
    }
    free(kf->e);
    kf->e = NULL;
    kf->n = 0;
}

/* "rpm=N" / "tpm=N" into e. */
static int parse_limit(const char *f, struct keyfile_entry *e, char *why, size_t whylen)
{
    int64_t *dst = !strncmp(f, "rpm=", 4) ? &e->rpm : !strncmp(f, "tpm=", 4) ? &e->tpm : NULL;
    if (!dst) {
        /* never echo the field: a misplaced key would end up in a log */
        return err_set(why, whylen, ERR_INVALID,
                       "unexpected field %d characters long after the key (want rpm=N or tpm=N)",
                       (int)strlen(f));
    }
    char *end;
    errno = 0;
    long long v = strtoll(f + 4, &end, 10);
    if (!f[4] || *end || errno || v < 1)
        return err_set(why, whylen, ERR_INVALID, "%.3s: must be an integer >= 1", f);
    if (*dst)
        return err_set(why, whylen, ERR_INVALID, "%.3s given twice", f);
    *dst = v;
    return 0;
}

int keyfile_load(const char *path, struct keyfile *kf, char *err, size_t errlen)
{
    kf->e = NULL;
    kf->n = 0;
    FILE *f = fopen(path, "r");
    if (!f) return err_set(err, errlen, ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *line = NULL, why[256];
    size_t cap = 0;
    int lineno = 0, rc = 0, cap_e = 0;
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        char *fields[8];
        int nf = 0;
        for (char *p = line; *p && nf < 8;) {
            while (*p && isspace((unsigned char)*p)) p++;
            if (!*p || (nf == 0 && *p == '#')) break;
            fields[nf++] = p;
            while (*p && !isspace((unsigned char)*p)) p++;
            if (*p) *p++ = 0;
        }
        if (nf == 0) continue;
        if (nf > 4) {
            rc = err_set(err, errlen, ERR_INVALID, "%s:%d: too many fields (NAME KEY [rpm=N] [tpm=N])",
                         path, lineno);
            goto done;
        }
        if (kf->n == KEYFILE_MAX_KEYS) {
            rc = err_set(err, errlen, ERR_RANGE, "%s:%d: more than %d keys", path, lineno,
                         KEYFILE_MAX_KEYS);
            goto done;
        }
        if (kf->n == cap_e) {
            int c = cap_e ? cap_e * 2 : 16;
            struct keyfile_entry *e = realloc(kf->e, sizeof *e * (size_t)c);
            if (!e) {
                rc = err_set(err, errlen, ERR_NOMEM, "out of memory");
                goto done;
            }
            kf->e = e;
            cap_e = c;
        }
        struct keyfile_entry *e = &kf->e[kf->n];
        memset(e, 0, sizeof *e);
        e->line = lineno;
        char name[32];
        const char *nm = fields[0], *key = nf >= 2 ? fields[1] : fields[0];
        if (nf == 1) {
            snprintf(name, sizeof name, "line-%d", lineno);
            nm = name;
        } else if (!keyfile_name_valid(nm)) {
            rc = err_set(err, errlen, ERR_INVALID,
                         "%s:%d: invalid key name (1..64 of A-Z a-z 0-9 - _ . @ :)", path, lineno);
            goto done;
        }
        e->name = strdup(nm);
        e->key = strdup(key);
        kf->n++;
        if (!e->name || !e->key) {
            rc = err_set(err, errlen, ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int i = 2; i < nf; i++)
            if ((rc = parse_limit(fields[i], e, why, sizeof why))) {
                rc = err_set(err, errlen, rc, "%s:%d: %s", path, lineno, why);
                goto done;
            }
        for (int i = 0; i < kf->n - 1; i++) {
            if (!strcmp(kf->e[i].name, e->name)) {
                rc = err_set(err, errlen, ERR_INVALID, "%s:%d: name '%s' already used on line %d",
                             path, lineno, e->name, kf->e[i].line);
                goto done;
            }
            if (!strcmp(kf->e[i].key, e->key)) {
                rc = err_set(err, errlen, ERR_INVALID, "%s:%d: the same key as line %d", path,
                             lineno, kf->e[i].line);
                goto done;
            }
        }
    }
    if (ferror(f)) rc = err_set(err, errlen, ERR_IO, "%s: read error", path);
    else if (kf->n == 0) rc = err_set(err, errlen, ERR_INVALID, "%s: no keys in the file", path);
done:
    if (line) memset(line, 0, cap);
    free(line);
    fclose(f);
    if (rc) keyfile_free(kf);
    return rc;
}

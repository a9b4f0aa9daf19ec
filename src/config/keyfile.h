/* keyfile.h — the API key file (`api-key-file`): named keys with optional limits.
 *
 * One key per line; blank lines and lines whose first non-blank character is '#' are
 * skipped; fields are separated by spaces or tabs:
 *
 *     NAME KEY [rpm=N] [tpm=N]
 *     KEY                          (a key alone: its name is "line-<line number>")
 *
 * NAME: 1..64 of A-Z a-z 0-9 - _ . @ : (shown in the access log and as a metric label;
 * the key itself never is). rpm: requests per minute, tpm: prompt + completion tokens per
 * minute, each an integer >= 1 (absent: unlimited). Names and keys must be unique. A file
 * that cannot be read, or that holds no key, is an error (an empty file never turns
 * authentication off). Errors read "FILE:LINE: reason" and never contain a key.
 *
 * Read at start-up and again on SIGHUP (server.c); no state, any thread.
 */
#ifndef TESSERA_CONFIG_KEYFILE_H
#define TESSERA_CONFIG_KEYFILE_H

#include <stddef.h>
#include <stdint.h>

#define KEYFILE_MAX_KEYS 1024

struct keyfile_entry {
    char *name;
    char *key;
    int64_t rpm;   /* 0: unlimited */
    int64_t tpm;   /* 0: unlimited */
    int line;
};

struct keyfile {
    struct keyfile_entry *e; /* [n] */
    int n;
};

/* Reads path into *kf. Returns 0, or a negative code with "path:line: reason" in err
 * (kf then holds nothing). */
int keyfile_load(const char *path, struct keyfile *kf, char *err, size_t errlen);
/* Is name a valid key name? */
int keyfile_name_valid(const char *name);
void keyfile_free(struct keyfile *kf);

#endif

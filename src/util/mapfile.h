/* mapfile.h — read-only memory mapping of a whole file.
 *
 * Loaders map model files instead of reading them, so weights stay in the page cache
 * and are never copied. A mapping owns its file descriptor-free region; map_close
 * releases it. Empty files map to data == NULL, size == 0.
 */
#ifndef TESSERA_UTIL_MAPFILE_H
#define TESSERA_UTIL_MAPFILE_H

#include <stddef.h>
#include <stdint.h>

struct mapped_file {
    const uint8_t *data; /* [size] bytes, read-only */
    size_t size;
};

/* Maps path read-only. On failure returns ERR_IO and writes why (naming path) to err. */
int map_open(const char *path, struct mapped_file *out, char *err, size_t errlen);
void map_close(struct mapped_file *m);

/* Reads a whole (small) text file into a NUL-terminated malloc'd buffer (caller frees).
 * Used for JSON/YAML/template files. Returns 0 or ERR_IO/ERR_NOMEM. */
int read_text_file(const char *path, char **out, size_t *len, char *err, size_t errlen);

#endif

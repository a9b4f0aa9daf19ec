/* mapfile.h — read-only memory mapping of a whole file.
 *
 * Loaders map model files instead of reading them, so weights stay in the page cache
 * and are never copied. A mapping owns its file descriptor-free region; map_close
 * releases it. Empty files map to data == NULL, size == 0. The mapping is PROT_READ and
 * MAP_PRIVATE, so none of its pages is ever a private (written) copy: every page can be
 * dropped from the process and faulted back, unchanged, from the file (map_release).
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

/* Tells the kernel this process no longer needs the pages that lie wholly inside
 * [p, p + n) (madvise MADV_DONTNEED): they leave the process's RSS but stay in the page
 * cache, and a later read faults them back in with the same bytes. For data that has
 * been copied elsewhere (the CPU's packed weights). Does nothing unless the whole range
 * lies inside m: on anonymous (malloc'd) memory MADV_DONTNEED would zero the data, so the
 * mapping, not the pointer, is what makes it safe. The range is rounded inward to page
 * boundaries, so pages shared with a neighbouring range stay. Returns the bytes released
 * (0: nothing, or the kernel declined, which is harmless). Any thread; m must be open. */
size_t map_release(const struct mapped_file *m, const void *p, size_t n);

/* Reads a whole (small) text file into a NUL-terminated malloc'd buffer (caller frees).
 * Used for JSON/YAML/template files. Returns 0 or ERR_IO/ERR_NOMEM. */
int read_text_file(const char *path, char **out, size_t *len, char *err, size_t errlen);

#endif

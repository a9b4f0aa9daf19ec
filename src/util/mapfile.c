/* mapfile.c — see mapfile.h. */
#define _GNU_SOURCE
#include "util/mapfile.h"
#include "util/err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int map_open(const char *path, struct mapped_file *out, char *err, size_t errlen)
{
    out->data = NULL;
    out->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(err, errlen, ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return err_set(err, errlen, ERR_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(err, errlen, ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return err_set(err, errlen, ERR_IO, "%s: mmap: %s", path, strerror(e));
        }
        out->data = p;
        out->size = (size_t)st.st_size;
    }
    close(fd);
    return 0;
}

void map_close(struct mapped_file *m)
{
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

size_t map_release(const struct mapped_file *m, const void *p, size_t n)
{
    uintptr_t base = (uintptr_t)m->data, a = (uintptr_t)p;
    /* inside [data, data + size), written so that nothing overflows */
    if (!m->data || n == 0 || a < base || a - base > m->size || n > m->size - (a - base)) return 0;
    long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0) return 0;
    uintptr_t page = (uintptr_t)ps;
    /* mmap returns a page-aligned base, so the rounded range stays inside the mapping */
    uintptr_t lo = (a + page - 1) & ~(page - 1), hi = (a + n) & ~(page - 1);
    if (lo >= hi) return 0;
    if (madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0) return 0;
    return hi - lo;
}

int read_text_file(const char *path, char **out, size_t *len, char *err, size_t errlen)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(err, errlen, ERR_IO, "%s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) { fclose(f); return err_set(err, errlen, ERR_NOMEM, "%s: out of memory", path); }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); fclose(f); return err_set(err, errlen, ERR_NOMEM, "%s: out of memory", path); }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        if (r == 0) break;
        n += r;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); return err_set(err, errlen, ERR_IO, "%s: read error", path); }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return 0;
}

/* shared.cc — the per-worker shared-memory arena.
 *
 * Each worker (block.cc) owns one arena, reused by every block it runs. Layout per block:
 *   [redzone][dynamic smem][redzone][static 1][redzone][static 2][redzone] ...
 * The dynamic region is filled with 0xFF bytes at block start; a static variable is
 * allocated (aligned, filled with 0xFF) when the block's first thread reaches its
 * TS_SHARED, keyed by the address of the macro's marker variable. 0xFF bytes read as NaN
 * for float/half/bf16 and -1 for integers, so a read before any write shows up.
 *
 * Under ASan the whole arena is poisoned and only the allocations are unpoisoned: the
 * redzones (>= 32 bytes) between them and after the dynamic region make an out-of-bounds
 * shared access an ASan report.
 *
 * Limits, as on an H200: static shared memory at most 48 KiB per kernel; static + dynamic
 * at most the kernel's limit (48 KiB, or 227 KiB after cudaFuncSetAttribute opt-in).
 * A violation found while running aborts (on a GPU the launch or the compile would fail).
 */
#include "internal.h"

#include <sys/mman.h>

#if EMU_ASAN
#include <sanitizer/asan_interface.h>
#define EMU_POISON(p, n) __asan_poison_memory_region((p), (n))
#define EMU_UNPOISON(p, n) __asan_unpoison_memory_region((p), (n))
#else
#define EMU_POISON(p, n) ((void)(p), (void)(n))
#define EMU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace emu {

enum : size_t {
    REDZONE = 64,
    STATIC_LIMIT = 48 * 1024,
    MAX_STATICS = 128,
    ARENA_BYTES = 232448 + STATIC_LIMIT + (MAX_STATICS + 2) * (REDZONE + 16),
};

struct shared_var {
    const void *site;
    size_t off, size;
    const char *name;
};

struct arena {
    char *base;
    size_t cap;
    size_t dyn_size;     /* this block's dynamic bytes */
    size_t top;          /* next free offset */
    size_t static_bytes; /* this block's static bytes */
    size_t limit;        /* static + dynamic allowed */
    size_t high_water;   /* bytes unpoisoned since the last full poisoning */
    int nvars;
    shared_var vars[MAX_STATICS];
};

arena *arena_create()
{
    arena *a = new arena();
    a->cap = ARENA_BYTES;
    void *m = mmap(nullptr, a->cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) fail("cannot map the shared-memory arena");
    a->base = (char *)m;
    EMU_POISON(a->base, a->cap);
    return a;
}

void arena_destroy(arena *a)
{
    EMU_UNPOISON(a->base, a->cap);
    munmap(a->base, a->cap);
    delete a;
}

void arena_begin_block(arena *a, size_t dyn, size_t limit)
{
    if (a->high_water) EMU_POISON(a->base, a->high_water);
    a->dyn_size = dyn;
    a->limit = limit;
    a->static_bytes = 0;
    a->nvars = 0;
    EMU_UNPOISON(a->base + REDZONE, dyn);
    memset(a->base + REDZONE, 0xff, dyn);
    a->top = REDZONE + dyn;
    a->high_water = a->top;
}

bool arena_contains(const void *p, size_t n)
{
    const arena *a = current_arena();
    const char *c = static_cast<const char *>(p);
    if (c < a->base || c + n > a->base + a->cap) return false;
    const size_t off = (size_t)(c - a->base);
    if (off >= REDZONE && off + n <= REDZONE + a->dyn_size) return true;
    for (int i = 0; i < a->nvars; i++)
        if (off >= a->vars[i].off && off + n <= a->vars[i].off + a->vars[i].size) return true;
    return false;
}

} // namespace emu

void *emu_shared_static(const void *site, size_t size, size_t align, const char *name)
{
    using namespace emu;
    arena *a = current_arena();
    for (int i = 0; i < a->nvars; i++) {
        shared_var *v = &a->vars[i];
        if (v->site != site) continue;
        if (v->size != size)
            fail("shared variable %s: %zu bytes here, %zu bytes when first allocated in this block", name, size,
                 v->size);
        return a->base + v->off;
    }
    if (a->nvars == MAX_STATICS) fail("more than %d static shared variables in one kernel", (int)MAX_STATICS);
    if (align < 16) align = 16;
    size_t off = (a->top + REDZONE + align - 1) / align * align;
    a->static_bytes += size;
    if (a->static_bytes > STATIC_LIMIT)
        fail("static shared memory reaches %zu bytes with %s: CUDA allows at most 48 KiB per kernel",
             a->static_bytes, name);
    if (a->static_bytes + a->dyn_size > a->limit)
        fail("shared memory: %zu static (reached with %s) + %zu dynamic bytes exceed this kernel's limit of %zu "
             "(a GPU would refuse the launch; raise it with cudaFuncSetAttribute("
             "cudaFuncAttributeMaxDynamicSharedMemorySize))", a->static_bytes, name, a->dyn_size, a->limit);
    if (off + size + REDZONE > a->cap) fail("shared-memory arena exhausted by %s", name);
    a->vars[a->nvars++] = shared_var{ site, off, size, name };
    EMU_UNPOISON(a->base + off, size);
    memset(a->base + off, 0xff, size);
    a->top = off + size;
    if (a->top > a->high_water) a->high_water = a->top;
    return a->base + off;
}

void *emu_shared_dynamic(void)
{
    using namespace emu;
    arena *a = current_arena();
    return a->base + REDZONE;
}

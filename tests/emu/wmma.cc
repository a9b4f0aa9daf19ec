/* wmma.cc — argument checks for the emulated nvcuda::wmma loads and stores (wmma.h).
 *
 * Run by the last lane of a warp to arrive at load_matrix_sync / store_matrix_sync, with
 * every lane's descriptor: the warp must agree on pointer, ldm and layout, and CUDA's
 * alignment rules must hold. A violation is undefined behaviour on a GPU: abort.
 */
#include "internal.h"

namespace nvcuda {
namespace wmma {
namespace detail {

void check_memop(emu_collective *const lanes[32])
{
    const memop *m0 = static_cast<const memop *>(lanes[0]);
    for (int l = 1; l < 32; l++) {
        const memop *m = static_cast<const memop *>(lanes[l]);
        if (m->mem != m0->mem || m->ldm != m0->ldm || m->layout != m0->layout)
            emu::fail("%s at %s:%d: lanes disagree: lane 0 passes (%p, ldm %u, %s), lane %d (%p, ldm %u, %s) at %s:%d",
                      m0->what, m0->file, m0->line, m0->mem, m0->ldm,
                      m0->layout == mem_row_major ? "row-major" : "col-major", l, m->mem, m->ldm,
                      m->layout == mem_row_major ? "row-major" : "col-major", m->file, m->line);
    }
    if (!m0->mem) emu::fail("%s at %s:%d: null pointer", m0->what, m0->file, m0->line);
    if ((uintptr_t)m0->mem % 32)
        emu::fail("%s at %s:%d: pointer %p is not 256-bit (32-byte) aligned, as CUDA requires", m0->what, m0->file,
                  m0->line, m0->mem);
    if ((m0->ldm * (unsigned)m0->elem_size) % 16)
        emu::fail("%s at %s:%d: ldm %u is not a multiple of 16 bytes (%d elements of %d bytes), as CUDA requires",
                  m0->what, m0->file, m0->line, m0->ldm, 16 / m0->elem_size, m0->elem_size);
    unsigned need = m0->layout == mem_row_major ? (unsigned)m0->cols : (unsigned)m0->rows;
    if (m0->ldm < need)
        emu::fail("%s at %s:%d: ldm %u is smaller than the %s tile's %u", m0->what, m0->file, m0->line, m0->ldm,
                  m0->layout == mem_row_major ? "row-major" : "col-major", need);
}

} // namespace detail
} // namespace wmma
} // namespace nvcuda

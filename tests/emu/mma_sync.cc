/* mma_sync.cc — the emulated ldmatrix.x4 (mma_sync.h): run by the last lane of a warp to
 * arrive, with every lane's row address.
 *
 * Lanes 8i .. 8i + 7 name rows 0..7 of matrix i (8 x 8 16-bit elements); register i of
 * lane l receives row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix i (the lower
 * column in the low half). A row that is not 16-byte aligned or not inside the block's
 * shared memory is undefined behaviour on a GPU: abort, naming the lane and call site.
 */
#include "internal.h"

namespace emu_mma {

void run_ldmatrix_x4(emu_collective *const lanes[32])
{
    uint32_t rows[32][4];
    for (int l = 0; l < 32; l++) {
        const ldm_op *o = static_cast<const ldm_op *>(lanes[l]);
        if ((uintptr_t)o->row % 16)
            emu::fail("ldmatrix.x4 at %s:%d: lane %d's row address %p is not 16-byte aligned", o->file, o->line, l,
                      o->row);
        if (!emu::arena_contains(o->row, 16))
            emu::fail("ldmatrix.x4 at %s:%d: lane %d's row address %p is not in the block's shared memory", o->file,
                      o->line, l, o->row);
        memcpy(rows[l], o->row, 16);
    }
    for (int l = 0; l < 32; l++) {
        const ldm_op *o = static_cast<const ldm_op *>(lanes[l]);
        for (int i = 0; i < 4; i++) o->r[i] = rows[8 * i + l / 4][l % 4];
    }
}

} // namespace emu_mma

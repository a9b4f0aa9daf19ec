/* mma_sync.cc — the emulated ldmatrix.x4 (mma_sync.h): run by the last lane of a warp to
 * arrive, with every lane's row address.
 *
 * Lanes 8i .. 8i + 7 name rows 0..7 of matrix i (8 x 8 16-bit elements); register i of
 * lane l receives row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix i (the lower
 * column in the low half); with .trans, rows 2 (l % 4) and 2 (l % 4) + 1 of column l / 4
 * (the lower row in the low half). A row that is not 16-byte aligned or not inside the block's
 * shared memory is undefined behaviour on a GPU: abort, naming the lane and call site.
 */
#include "internal.h"

namespace emu_mma {

void run_ldmatrix_x4(emu_collective *const lanes[32])
{
    uint16_t rows[32][8];
    for (int l = 0; l < 32; l++) {
        const ldm_op *o = static_cast<const ldm_op *>(lanes[l]);
        if (o->trans != static_cast<const ldm_op *>(lanes[0])->trans)
            emu::fail("%s at %s:%d: lanes disagree on .trans (lane %d)", o->what, o->file, o->line, l);
        if ((uintptr_t)o->row % 16)
            emu::fail("%s at %s:%d: lane %d's row address %p is not 16-byte aligned", o->what, o->file, o->line, l,
                      o->row);
        if (!emu::arena_contains(o->row, 16))
            emu::fail("%s at %s:%d: lane %d's row address %p is not in the block's shared memory", o->what, o->file,
                      o->line, l, o->row);
        memcpy(rows[l], o->row, 16);
    }
    for (int l = 0; l < 32; l++) {
        const ldm_op *o = static_cast<const ldm_op *>(lanes[l]);
        const int g = l / 4, t = l % 4;
        for (int i = 0; i < 4; i++) {
            const uint16_t *m = rows[8 * i]; /* matrix i: rows m[0..7 * 8] (lanes 8i..8i+7) */
            uint32_t lo, hi;
            if (o->trans) {
                lo = m[(2 * t) * 8 + g];
                hi = m[(2 * t + 1) * 8 + g];
            } else {
                lo = m[g * 8 + 2 * t];
                hi = m[g * 8 + 2 * t + 1];
            }
            o->r[i] = lo | hi << 16;
        }
    }
}

} // namespace emu_mma

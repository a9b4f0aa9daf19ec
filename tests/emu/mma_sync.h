/* mma_sync.h — ts_ldmatrix_x4(_trans) and ts_mma_16816 under the emulator (included by emu.h; the
 * GPU versions, inline PTX, are in kernels/common.cuh, which documents the layouts).
 *
 * Both are warp-collective, as ldmatrix.sync / mma.sync: all 32 lanes of a full warp call
 * them (a missing lane is a deadlock abort). Their fragment layouts are PTX's documented
 * ones (PTX ISA: "ldmatrix", "Matrix Fragments for mma.m16n8k16"), and the
 * emulator implements exactly those, so a kernel that indexes the registers gets the same
 * elements here as on a GPU.
 *
 * ts_ldmatrix_x4 checks what a GPU requires or would fault on: every lane's row address
 * 16-byte aligned and inside the block's shared memory. ts_mma_16816 gathers every lane's
 * registers when the last lane arrives and computes D = A * B + C in float (k ascending).
 */
#ifndef TESSERA_EMU_MMA_SYNC_H
#define TESSERA_EMU_MMA_SYNC_H

namespace emu_mma {

struct ldm_op : emu_collective {
    const void *row; /* this lane's 16-byte row */
    uint32_t *r;     /* its four result registers */
    bool trans;      /* ldmatrix .trans */
    const char *file;
    int line;
};
void run_ldmatrix_x4(emu_collective *const lanes[32]); /* mma_sync.cc */

template <typename T> static inline float b16_to_f(uint32_t bits);
template <> inline float b16_to_f<__half>(uint32_t bits) { return __half2float(__ushort_as_half((unsigned short)bits)); }
template <> inline float b16_to_f<__nv_bfloat16>(uint32_t bits)
{
    return __bfloat162float(__ushort_as_bfloat16((unsigned short)bits));
}

struct mma_op : emu_collective {
    const uint32_t *a; /* 4 registers: A 16 x 16, row-major */
    uint32_t b0, b1;   /* B 16 x 8, column-major */
    float *d;          /* 4 floats: C in, D out (16 x 8) */
};

/* Element (i of the lane's two in register reg) of the documented layouts, g = lane / 4,
 * t = lane % 4: A reg 0 (g, 2t + i), 1 (g + 8, 2t + i), 2 (g, 2t + 8 + i), 3 (g + 8, 2t + 8 + i);
 * B reg 0 (k 2t + i, n g), 1 (k 2t + 8 + i, n g); C/D float j: (g + 8 (j / 2), 2t + j % 2). */
template <typename T> static void run_mma_16816(emu_collective *const lanes[32])
{
    float A[16][16], B[16][8], D[16][8];
    for (int l = 0; l < 32; l++) {
        const mma_op *o = static_cast<const mma_op *>(lanes[l]);
        const int g = l / 4, t = l % 4;
        for (int reg = 0; reg < 4; reg++)
            for (int i = 0; i < 2; i++)
                A[g + 8 * (reg & 1)][2 * t + 8 * (reg >> 1) + i] = b16_to_f<T>(o->a[reg] >> (16 * i) & 0xffffu);
        for (int i = 0; i < 2; i++) {
            B[2 * t + i][g] = b16_to_f<T>(o->b0 >> (16 * i) & 0xffffu);
            B[2 * t + 8 + i][g] = b16_to_f<T>(o->b1 >> (16 * i) & 0xffffu);
        }
        for (int j = 0; j < 4; j++) D[g + 8 * (j / 2)][2 * t + j % 2] = o->d[j];
    }
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 8; c++) {
            float acc = D[r][c];
            for (int k = 0; k < 16; k++) acc += A[r][k] * B[k][c];
            D[r][c] = acc;
        }
    for (int l = 0; l < 32; l++) {
        const mma_op *o = static_cast<const mma_op *>(lanes[l]);
        const int g = l / 4, t = l % 4;
        for (int j = 0; j < 4; j++) o->d[j] = D[g + 8 * (j / 2)][2 * t + j % 2];
    }
}

} // namespace emu_mma

namespace emu_mma {
static inline void ldmatrix_x4(uint32_t (&r)[4], const void *row, bool trans, const char *file, int line)
{
    ldm_op o;
    o.run = &run_ldmatrix_x4;
    o.what = trans ? "ldmatrix.x4.trans" : "ldmatrix.x4";
    o.row = row;
    o.r = r;
    o.trans = trans;
    o.file = file;
    o.line = line;
    emu_warp_op(emu_site{ file, line }, EMU_COLLECTIVE, 0xffffffffu, 0, 0, 0, 32, &o);
}
} // namespace emu_mma

static inline void ts_ldmatrix_x4(uint32_t (&r)[4], const void *row, const char *file = __builtin_FILE(),
                                  int line = __builtin_LINE())
{
    emu_mma::ldmatrix_x4(r, row, false, file, line);
}

static inline void ts_ldmatrix_x4_trans(uint32_t (&r)[4], const void *row, const char *file = __builtin_FILE(),
                                        int line = __builtin_LINE())
{
    emu_mma::ldmatrix_x4(r, row, true, file, line);
}

template <typename T>
static inline void ts_mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    static_assert(std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value,
                  "ts_mma_16816: __half or __nv_bfloat16 inputs");
    emu_mma::mma_op o;
    o.run = &emu_mma::run_mma_16816<T>;
    o.what = "mma.sync.m16n8k16";
    o.a = a;
    o.b0 = b0;
    o.b1 = b1;
    o.d = d;
    emu_warp_op(emu_site{ file, line }, EMU_COLLECTIVE, 0xffffffffu, 0, 0, 0, 32, &o);
}

#endif

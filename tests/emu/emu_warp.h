/* emu_warp.h — block barriers and warp primitives under the emulator (included by emu.h).
 *
 * Every intrinsic here is a macro that records its call site, then a member of emu_at:
 *   __syncthreads()  ->  emu_at{__FILE__, __LINE__}.syncthreads()
 * so divergence and mask errors can say where each thread waits.
 *
 * __syncthreads (and _count/_and/_or) is a block barrier: the calling fiber waits until
 * every thread of the block waits at the same call site. Threads that exit while others
 * wait, or wait at different call sites, abort the process (barrier divergence).
 *
 * The warp primitives meet per warp, not per block: the lanes named in `mask` (lane =
 * linear thread id % 32) must all call the same primitive; the last one to arrive computes
 * every lane's result and the others resume. Aborts: a lane calling with a mask that does
 * not name it, a mask naming lanes that do not exist or have exited, lanes that disagree
 * on the mask or the primitive, a named lane that exits or never arrives (it waits at a
 * block barrier or another warp op: detected when nothing in the block can run).
 * A shuffle reading a lane outside the mask gets 0xFF bytes (CUDA: undefined).
 * __activemask() returns the warp's lanes that have not exited: the emulator does not track
 * divergence inside a warp, which is its one approximation (CUDA returns the lanes
 * converged at the call).
 */
#ifndef TESSERA_EMU_WARP_H
#define TESSERA_EMU_WARP_H

enum emu_warp_op_kind {
    EMU_SHFL_IDX,
    EMU_SHFL_UP,
    EMU_SHFL_DOWN,
    EMU_SHFL_XOR,
    EMU_VOTE_BALLOT,
    EMU_VOTE_ANY,
    EMU_VOTE_ALL,
    EMU_SYNCWARP,
    EMU_REDUCE_ADD_U,
    EMU_REDUCE_ADD_S,
    EMU_REDUCE_MIN_U,
    EMU_REDUCE_MIN_S,
    EMU_REDUCE_MAX_U,
    EMU_REDUCE_MAX_S,
    EMU_REDUCE_AND,
    EMU_REDUCE_OR,
    EMU_REDUCE_XOR,
    EMU_MATCH_ANY,
    EMU_MATCH_ALL,
    EMU_COLLECTIVE, /* ldmatrix, mma.sync: ptr is an emu_collective, run once by the last lane */
    EMU_WARP_OP_COUNT
};

/* A warp-collective operation's per-lane argument (mma_sync.h): run(lanes) is called once, by the
 * last lane to arrive, with every lane's descriptor (lanes[l] for lane l). */
struct emu_collective {
    void (*run)(emu_collective *const lanes[32]);
    const char *what;
};

/* One warp op by the calling thread (block.cc). val: the lane's operand, zero-extended
 * bits of `size` bytes; arg: source lane / delta / lane mask; returns the lane's result
 * bits (match_all: pred in bit 32). */
uint64_t emu_warp_op(emu_site site, int kind, unsigned mask, uint64_t val, int size, int arg, int width,
                     emu_collective *coll);

/* Block barrier by the calling thread (block.cc); kind 0 plain, 1 count, 2 and, 3 or.
 * Returns the number of threads whose pred was non-zero. */
int emu_barrier(emu_site site, int kind, int pred);

/* Lanes of the calling thread's warp that have not exited (block.cc). */
unsigned emu_active_mask(void);

/* Lets the other runnable threads of the block run first (__nanosleep). */
void emu_yield(void);

/* A value of at most 8 bytes as zero-extended bits, and back (the fp16/bf16 pair types are
 * not trivially copyable by the letter of C++, but are plain bits). */
template <typename T> static inline uint64_t emu_to_bits_(const T &v)
{
    static_assert(sizeof(T) <= 8 && std::is_standard_layout<T>::value,
                  "warp operations move plain values of at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, (const void *)&v, sizeof(T));
    return b;
}
template <typename T> static inline T emu_from_bits_(uint64_t b)
{
    T r;
    memcpy((void *)&r, &b, sizeof(T));
    return r;
}

struct emu_at {
    const char *file;
    int line;

    emu_site site() const { return emu_site{ file, line }; }

    void syncthreads() const { emu_barrier(site(), 0, 0); }
    int syncthreads_count(int pred) const { return emu_barrier(site(), 1, pred); }
    int syncthreads_and(int pred) const { return emu_barrier(site(), 2, pred) == (int)(blockDim.x * blockDim.y * blockDim.z); }
    int syncthreads_or(int pred) const { return emu_barrier(site(), 3, pred) > 0; }
    void syncwarp(unsigned mask = 0xffffffffu) const { emu_warp_op(site(), EMU_SYNCWARP, mask, 0, 0, 0, 32, nullptr); }

    template <typename T> T shfl_op(int kind, unsigned mask, T v, int arg, int width) const
    {
        return emu_from_bits_<T>(emu_warp_op(site(), kind, mask, emu_to_bits_(v), (int)sizeof(T), arg, width, nullptr));
    }
    template <typename T> T shfl(unsigned mask, T v, int src_lane, int width = 32) const
    {
        return shfl_op(EMU_SHFL_IDX, mask, v, src_lane, width);
    }
    template <typename T> T shfl_up(unsigned mask, T v, unsigned delta, int width = 32) const
    {
        return shfl_op(EMU_SHFL_UP, mask, v, (int)delta, width);
    }
    template <typename T> T shfl_down(unsigned mask, T v, unsigned delta, int width = 32) const
    {
        return shfl_op(EMU_SHFL_DOWN, mask, v, (int)delta, width);
    }
    template <typename T> T shfl_xor(unsigned mask, T v, int lane_mask, int width = 32) const
    {
        return shfl_op(EMU_SHFL_XOR, mask, v, lane_mask, width);
    }

    unsigned ballot(unsigned mask, int pred) const
    {
        return (unsigned)emu_warp_op(site(), EMU_VOTE_BALLOT, mask, pred != 0, 4, 0, 32, nullptr);
    }
    int any(unsigned mask, int pred) const
    {
        return (int)emu_warp_op(site(), EMU_VOTE_ANY, mask, pred != 0, 4, 0, 32, nullptr);
    }
    int all(unsigned mask, int pred) const
    {
        return (int)emu_warp_op(site(), EMU_VOTE_ALL, mask, pred != 0, 4, 0, 32, nullptr);
    }

    unsigned reduce(int kind, unsigned mask, uint32_t v) const
    {
        return (unsigned)emu_warp_op(site(), kind, mask, v, 4, 0, 32, nullptr);
    }
    unsigned reduce_add(unsigned mask, unsigned v) const { return reduce(EMU_REDUCE_ADD_U, mask, v); }
    int reduce_add(unsigned mask, int v) const { return (int)reduce(EMU_REDUCE_ADD_S, mask, (uint32_t)v); }
    unsigned reduce_min(unsigned mask, unsigned v) const { return reduce(EMU_REDUCE_MIN_U, mask, v); }
    int reduce_min(unsigned mask, int v) const { return (int)reduce(EMU_REDUCE_MIN_S, mask, (uint32_t)v); }
    unsigned reduce_max(unsigned mask, unsigned v) const { return reduce(EMU_REDUCE_MAX_U, mask, v); }
    int reduce_max(unsigned mask, int v) const { return (int)reduce(EMU_REDUCE_MAX_S, mask, (uint32_t)v); }
    unsigned reduce_and(unsigned mask, unsigned v) const { return reduce(EMU_REDUCE_AND, mask, v); }
    unsigned reduce_or(unsigned mask, unsigned v) const { return reduce(EMU_REDUCE_OR, mask, v); }
    unsigned reduce_xor(unsigned mask, unsigned v) const { return reduce(EMU_REDUCE_XOR, mask, v); }

    template <typename T> unsigned match_any(unsigned mask, T v) const
    {
        static_assert(std::is_arithmetic<T>::value, "__match_any_sync takes a number");
        return (unsigned)emu_warp_op(site(), EMU_MATCH_ANY, mask, emu_to_bits_(v), (int)sizeof(T), 0, 32, nullptr);
    }
    template <typename T> unsigned match_all(unsigned mask, T v, int *pred) const
    {
        static_assert(std::is_arithmetic<T>::value, "__match_all_sync takes a number");
        uint64_t r = emu_warp_op(site(), EMU_MATCH_ALL, mask, emu_to_bits_(v), (int)sizeof(T), 0, 32, nullptr);
        *pred = (int)(r >> 32);
        return (unsigned)r;
    }
};

#define EMU_AT_ emu_at{ __FILE__, __LINE__ }
#define __syncthreads() EMU_AT_.syncthreads()
#define __syncthreads_count(pred) EMU_AT_.syncthreads_count(pred)
#define __syncthreads_and(pred) EMU_AT_.syncthreads_and(pred)
#define __syncthreads_or(pred) EMU_AT_.syncthreads_or(pred)
#define __syncwarp EMU_AT_.syncwarp
#define __shfl_sync EMU_AT_.shfl
#define __shfl_up_sync EMU_AT_.shfl_up
#define __shfl_down_sync EMU_AT_.shfl_down
#define __shfl_xor_sync EMU_AT_.shfl_xor
#define __ballot_sync EMU_AT_.ballot
#define __any_sync EMU_AT_.any
#define __all_sync EMU_AT_.all
#define __reduce_add_sync EMU_AT_.reduce_add
#define __reduce_min_sync EMU_AT_.reduce_min
#define __reduce_max_sync EMU_AT_.reduce_max
#define __reduce_and_sync EMU_AT_.reduce_and
#define __reduce_or_sync EMU_AT_.reduce_or
#define __reduce_xor_sync EMU_AT_.reduce_xor
#define __match_any_sync EMU_AT_.match_any
#define __match_all_sync EMU_AT_.match_all

static inline unsigned __activemask(void) { return emu_active_mask(); }

/* __nanosleep: a spin-wait loop around it lets the block's other threads run (fibers are
 * never preempted, so a loop waiting for a thread of its own block would otherwise hang). */
static inline void __nanosleep(unsigned ns)
{
    (void)ns;
    emu_yield();
}

#endif

/* sampling.cu — one token per row of logits on the device, by tessera's sampling rule
 * (docs/sampling.md), the same token the CPU sampler picks; plus raw logprobs. Contract in
 * kernels/sampling.h; CPU twin sampler_sample + sampler_logprobs (src/sampler/sampler.c).
 *
 * The rule, per row (l = raw logit + bias, -inf where the row's token mask bans the token,
 * then penalties; every number that decides the token comes from src/sampler/exact.h,
 * bit-identical on both backends):
 *   greedy (T = 0): lowest id with the largest l. A +inf l: the lowest such id.
 *   m = max l;  W_i = rint(e((l_i - m) * RN(1/T)) * 2^31)  (integers, 0 below -22 nats);
 *   top-k:  keep l >= the k-th largest l (ties kept);
 *   top-p:  keep W >= theta_p, the largest W whose mass (sum of W >= it) reaches
 *           RN(top_p * S) (ties kept);  min-p: keep W >= ceil(min_p * 2^31);
 *   draw:   r = floor(philox(seed, step) * S_F / 2^64); the token whose interval of the
 *           cumulative support weight, in token-id order, holds r.
 * Since W is monotone in l (checked exhaustively), every support is an upper set in l.
 *
 * Parallelisation: one CTA of 512 threads per row; no full sort. Every pass over the row
 * is a `sweep`: 16-byte loads (4 consecutive ids per thread, tiles of 2048 ids), 8 tiles in
 * flight per thread on the first pass (from HBM) and 4 on the others (from L2), then the
 * tokens the bias or penalties modify (a bitmap of them in shared memory keeps their raw
 * value out of the raw sweep; they are visited from the CSR lists with their processed
 * value). A row's token mask is read beside its logits (one 32-bit word per 32 ids, the
 * same word for 8 threads: a warp loads 16 contiguous bytes per tile, 1/32 of the logits'
 * traffic); a banned token counts as not samplable, exactly as a -inf processed logit,
 * while its raw logit still feeds the logprobs. Passes:
 *   A  max / argmax / samplable count of l, max of the raw logits, and a strided sample
 *      of l and of the raw logits (at most `cap` values each, in shared memory).
 *      A 256-bin histogram of the sample, in steps below the max, gives a threshold that
 *      at least s real tokens pass (s = k for top-k, N for top-N logprobs, ~cap/2 / stride
 *      for top-p): the candidates.
 *   B  appends the candidates (warp-aggregated) to shared memory — l for sampling, raw
 *      logits for top-N logprobs — and sums exp(raw - max) for the log-sum-exp. Without
 *      top-k and top-p it instead sums W per 128-id segment for a direct draw.
 *   Then, in shared memory: bitonic sort of the candidates (l descending, id ascending),
 *   top-k boundary, W, a block scan for the top-p boundary, min-p, a sort of the support
 *   by id and a scan for the draw. The candidates are provably a superset of the support
 *   (top-k: >= k of them, an upper set; top-p / min-p: checked against the largest l left
 *   out and the mass they hold); when not, or when they overflow shared memory, an exact
 *   fallback runs: radix select over the row (3 passes of 11-bit digits, histograms of
 *   counts or of exact integer masses), then a segment-sum pass and the draw.
 *   Draw by segments: per-segment sums of W (one warp per 128 ids), a block scan finds
 *   the segment holding r, one warp rescans its 128 ids.
 * Logprobs: log-sum-exp in float per thread, combined in double; the top-N are the sorted
 * raw candidates (fallback: radix select, then the lowest ids among ties in id order).
 * Scoring rows (prompt logprobs) take the same passes as an unmodified, unmasked row that
 * samples nothing: pass A for the raw max, pass B for the log-sum-exp and the raw
 * candidates; their token is the given one. Its rank (the raw logits >= its own) takes one
 * more raw sweep, scoring rows only (from L2): a count per thread, then a block sum.
 */
#include "kernels/common.cuh"

#include <limits.h>

#include "kernels/sampling.h"
#include "sampler/exact.h"

#define SMP_THREADS 512
#define SMP_WARPS (SMP_THREADS / 32)
#define SMP_TILE (4 * SMP_THREADS) /* ids per tile: 4 consecutive ids per thread */
#define SMP_UNROLL 4               /* tiles loaded before any is processed (L2-resident passes) */
#define SMP_UNROLL_FIRST 8         /* the first pass, from HBM: 64 KiB in flight per SM */
#define SMP_SEG 128                /* ids per segment: one warp's share of a tile */
#define SMP_RCAP 2048              /* raw (top-N logprob) candidates */
#define SMP_HBINS 256              /* sample histogram bins */
#define SMP_RMAX 32.0f             /* the sample bins span at most this many logits */
#define SMP_RADIX_BITS 11
#define SMP_RADIX_BINS (1 << SMP_RADIX_BITS)
#define SMP_MAX_SEGS (SAMPLING_MAX_VOCAB / SMP_SEG)
#define SMP_STATIC_SMEM_MAX 8192   /* bound on this kernel's static shared memory */
/* The candidate area (cap * 8 bytes) also holds the radix histograms and the segment
 * sums: 2048 eight-byte entries. */
#define SMP_MIN_CAP 2048

#define SMP_SEGS_PER_THREAD (SMP_MAX_SEGS / SMP_THREADS)
#define SMP_DIGITS_PER_THREAD (SMP_RADIX_BINS / SMP_THREADS)
static_assert(SMP_MAX_SEGS % SMP_THREADS == 0 && SMP_RADIX_BINS % SMP_THREADS == 0, "even split");
static_assert(SMP_RADIX_BINS <= SMP_MIN_CAP && SMP_MAX_SEGS <= SMP_MIN_CAP, "the candidate area holds them");

/* Row-wide values every thread needs, in shared memory. */
struct smp_state {
    int bad;          /* setup found malformed CSR data */
    int n_cand;       /* appended candidates (may exceed cap: overflow) */
    int n_rcand;
    int b_p, b_r;     /* sample thresholds: candidates have bin <= b */
    float scale_p, scale_r;
    int idx;          /* result of a block search */
    int seg;          /* segment holding the draw point */
    int token;
    int taken;        /* ordered collection: ties taken so far */
    uint64_t r_in;    /* draw point inside the segment */
    uint32_t digit;   /* radix select: the chosen digit */
    uint64_t above;   /* radix select: mass above the chosen digit */
};

/* What a sweep needs to read one row and its modified tokens. */
struct smp_row {
    const float *row;
    int V, ntiles;
    bool vec, has_mod;
    const uint32_t *bitmap;   /* [ceil(V/32)] shared: ids the bias or penalties modify */
    const int32_t *pen_ids;   /* [n_pen] global, this row's slice */
    const uint32_t *pen_info; /* [n_pen] */
    int n_pen;                /* 0 when the penalties are off */
    const int32_t *sb_id;     /* [n_bias] shared, sorted */
    const float *sb_val;      /* [n_bias] shared */
    const int32_t *sb_in_pen; /* [n_bias] shared: the id is also in the penalty list */
    int n_bias;
    float rep, pres, freq;
    const uint32_t *mask;     /* [ceil(V/32)] global: this row's allowed tokens; NULL: all */
};

/* ---- small helpers ------------------------------------------------------------------------ */

__device__ __forceinline__ uint64_t smp_warp_sum_u64(uint64_t v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(TS_FULL_MASK, v, o);
    return v;
}

/* Exclusive prefix of v over the block (thread order) and the block total. scratch: 32
 * words of shared memory, reusable after the call. */
__device__ __forceinline__ uint64_t smp_block_exscan(uint64_t v, uint64_t *total, uint64_t *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint64_t x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        uint64_t y = __shfl_up_sync(TS_FULL_MASK, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads(); /* scratch may still be read by a previous call */
    if (lane == 31) scratch[warp] = x;
    __syncthreads();
    uint64_t before = 0, all = 0;
    for (int w = 0; w < SMP_WARPS; w++) {
        uint64_t s = scratch[w];
        before += w < warp ? s : 0;
        all += s;
    }
    *total = all;
    return before + x - v;
}

__device__ __forceinline__ uint64_t smp_block_sum(uint64_t v, uint64_t *scratch)
{
    uint64_t total;
    smp_block_exscan(v, &total, scratch);
    return total;
}

/* Appends val to buf[*counter] when pred, one shared atomic per warp. Every lane of the
 * warp must call it. Positions past cap are counted but not stored (overflow). */
__device__ __forceinline__ void smp_append(bool pred, uint64_t val, uint64_t *buf, int cap, int *counter)
{
    unsigned m = __ballot_sync(TS_FULL_MASK, pred);
    if (!m) return;
    const int lane = threadIdx.x & 31, leader = __ffs(m) - 1;
    int base = 0;
    if (lane == leader) base = atomicAdd(counter, __popc(m));
    base = __shfl_sync(TS_FULL_MASK, base, leader);
    if (pred) {
        int pos = base + __popc(m & ((1u << lane) - 1u));
        if (pos < cap) buf[pos] = val;
    }
}

/* Ascending bitonic sort of a[0, P), P a power of two; all threads. */
__device__ void smp_bitonic_sort(uint64_t *a, int P)
{
    for (int k = 2; k <= P; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < (P >> 1); i += SMP_THREADS) {
                int lo = 2 * i - (i & (j - 1)), hi = lo + j;
                uint64_t x = a[lo], y = a[hi];
                if ((x > y) == ((lo & k) == 0)) {
                    a[lo] = y;
                    a[hi] = x;
                }
            }
            __syncthreads();
        }
    }
}

/* Pads a[n, P) with the largest key and sorts a[0, P), P = the power of two >= n (>= 2). */
__device__ void smp_sort(uint64_t *a, int n)
{
    int P = 2;
    while (P < n) P <<= 1;
    for (int i = n + (int)threadIdx.x; i < P; i += SMP_THREADS) a[i] = ~0ull;
    __syncthreads();
    smp_bitonic_sort(a, P);
}

/* Over x(a[0]), x(a[1]), ... x(a[n-1]): the first i whose inclusive prefix sum reaches thr
 * (n when none does); *sum = the total. All threads; contiguous chunks per thread. */
template <typename X>
__device__ int smp_first_reaching(const uint64_t *a, int n, uint64_t thr, X x, uint64_t *sum,
                                  uint64_t *scratch, smp_state *st)
{
    const int per = (n + SMP_THREADS - 1) / SMP_THREADS;
    const int lo = min(n, (int)threadIdx.x * per), hi = min(n, lo + per);
    uint64_t s = 0;
    for (int i = lo; i < hi; i++) s += x(a[i]);
    uint64_t total, pre = smp_block_exscan(s, &total, scratch);
    if (threadIdx.x == 0) st->idx = n;
    __syncthreads();
    if (pre < thr && pre + s >= thr) { /* the one chunk where the prefix crosses thr */
        uint64_t acc = pre;
        for (int i = lo; i < hi; i++) {
            acc += x(a[i]);
            if (acc >= thr) {
                st->idx = i;
                break;
            }
        }
    }
    __syncthreads();
    *sum = total;
    return st->idx;
}

/* ---- the processed logit of a modified token ---------------------------------------------- */

/* Index of id in the sorted bias ids, or -1. */
__device__ __forceinline__ int smp_bias_find(const smp_row &c, int id)
{
    int lo = 0, hi = c.n_bias;
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (c.sb_id[mid] < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < c.n_bias && c.sb_id[lo] == id ? lo : -1;
}

/* Whether the row's token mask bans id (< V). */
__device__ __forceinline__ bool smp_banned(const smp_row &c, int id)
{
    return c.mask && !((__ldg(c.mask + (id >> 5)) >> (id & 31)) & 1u);
}

/* Modified-token entry j < n_pen + n_bias: its id and processed logit (bias, mask, then
 * the penalties), as the CPU sampler computes them. False for a bias entry whose id is
 * also a penalty entry (that one handles it). */
__device__ __forceinline__ bool smp_mod_entry(const smp_row &c, int j, int *id_out, float *l_out)
{
    if (j < c.n_pen) {
        int id = c.pen_ids[j];
        float l = c.row[id];
        if (c.n_bias > 0) {
            int jb = smp_bias_find(c, id);
            if (jb >= 0) l = l + c.sb_val[jb];
        }
        if (smp_banned(c, id)) l = -INFINITY; /* the penalties keep -inf */
        uint32_t info = c.pen_info[j];
        if (info != 0) l = smp_penalize(l, c.rep, c.pres, c.freq, info);
        *id_out = id;
        *l_out = l;
        return true;
    }
    int jb = j - c.n_pen;
    if (c.sb_in_pen[jb]) return false;
    int id = c.sb_id[jb];
    *id_out = id;
    *l_out = smp_banned(c, id) ? -INFINITY : c.row[id] + c.sb_val[jb];
    return true;
}

/* ---- sweeps ------------------------------------------------------------------------------- */

/* Visits every token of the row: f(id, x, raw_ok, proc_ok) is called by every thread the
 * same number of times (so f may use warp votes):
 *   raw sweep:  x = the raw logit; raw_ok = id < V; proc_ok = raw_ok && not modified &&
 *               not banned by the mask (then x is also the processed logit; a banned
 *               token's processed logit is -inf: not samplable);
 *   mod sweep:  x = the processed logit of a modified token; raw_ok = false; proc_ok =
 *               whether the entry is one (see smp_mod_entry).
 * tile_end(tile) runs after each tile of the raw sweep (every thread). A barrier separates
 * the two sweeps (plain stores in the first may be followed by atomics in the second).
 * UNROLL tiles of 16-byte loads are in flight per thread before the first is used. */
template <int UNROLL = SMP_UNROLL, typename F, typename T>
__device__ __forceinline__ void smp_sweep(const smp_row &c, F f, T tile_end)
{
    const int tid = threadIdx.x;
    for (int t0 = 0; t0 < c.ntiles; t0 += UNROLL) {
        float v[UNROLL][4];
        uint32_t mw[UNROLL]; /* the mask word holding this thread's 4 ids */
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int b = (t0 + u) * SMP_TILE + 4 * tid;
            mw[u] = c.mask && b < c.V ? __ldg(c.mask + (b >> 5)) : ~0u;
            if (c.vec && b + 4 <= c.V) {
                float4 q = __ldg(reinterpret_cast<const float4 *>(c.row + b));
                v[u][0] = q.x;
                v[u][1] = q.y;
                v[u][2] = q.z;
                v[u][3] = q.w;
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++) v[u][e] = b + e < c.V ? __ldg(c.row + b + e) : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int tile = t0 + u;
            if (tile >= c.ntiles) break; /* uniform */
            const int b = tile * SMP_TILE + 4 * tid;
            unsigned mod = ~(mw[u] >> (b & 31)) & 0xFu; /* banned, or modified: */
            if (c.has_mod && b < c.V) mod |= (c.bitmap[b >> 5] >> (b & 31)) & 0xFu;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const bool in = b + e < c.V;
                f(b + e, v[u][e], in, in && !((mod >> e) & 1u));
            }
            tile_end(tile);
        }
    }
    if (c.has_mod) {
        __syncthreads();
        const int n_mod = c.n_pen + c.n_bias;
        for (int j0 = 0; j0 < n_mod; j0 += SMP_THREADS) {
            const int j = j0 + tid;
            int id = 0;
            float l = 0.0f;
            bool ok = j < n_mod && smp_mod_entry(c, j, &id, &l);
            f(id, l, false, ok);
        }
    }
}

struct smp_no_tile_end {
    __device__ void operator()(int) const {}
};

/* The support of the draw: samplable, l >= the top-k threshold (key vk; 0: none), and
 * W >= theta. Returns W, or 0 outside the support. */
struct smp_support {
    float m, inv_t;
    uint32_t vk, theta;
    __device__ __forceinline__ uint32_t weight(float l) const
    {
        if (!(l > -INFINITY) || smp_key(l) < vk) return 0;
        uint32_t w = smp_weight(smp_scaled(l, m, inv_t));
        return w >= theta ? w : 0;
    }
};

/* Per-segment sums of the support's weights into seg[ntiles * 32]: plain stores, one warp
 * per 128 ids; modified tokens added atomically. Ends with a barrier. */
__device__ void smp_segment_pass(const smp_row &c, const smp_support sup, uint64_t *seg)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint64_t acc = 0;
    smp_sweep(
        c,
        [&](int id, float x, bool raw_ok, bool proc_ok) {
            uint32_t w = proc_ok ? sup.weight(x) : 0u;
            if (raw_ok) acc += w;
            else if (w) atomicAdd((unsigned long long *)&seg[id / SMP_SEG], (unsigned long long)w);
        },
        [&](int tile) {
            uint64_t s = smp_warp_sum_u64(acc);
            if (lane == 0) seg[tile * SMP_WARPS + warp] = s;
            acc = 0;
        });
    __syncthreads();
}

/* The draw over seg[0, nseg) (from smp_segment_pass with the same support): the token
 * whose interval of the cumulative weight, in id order, holds floor(bits * total / 2^64).
 * All threads; returns the token to every thread. */
__device__ int smp_segment_draw(const smp_row &c, const smp_support sup, const uint64_t *seg, int nseg,
                                uint64_t bits, uint64_t *scratch, uint32_t *segw, smp_state *st)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int s0 = SMP_SEGS_PER_THREAD * tid; /* this thread's segments: s0 .. s0 + SPT - 1 */
    uint64_t mine = 0;
#pragma unroll
    for (int i = 0; i < SMP_SEGS_PER_THREAD; i++) mine += s0 + i < nseg ? seg[s0 + i] : 0;
    uint64_t total, pre = smp_block_exscan(mine, &total, scratch);
    const uint64_t r = smp_draw_point(bits, total);
    if (pre <= r && r < pre + mine) {
        uint64_t acc = pre;
#pragma unroll
        for (int i = 0; i < SMP_SEGS_PER_THREAD; i++) {
            uint64_t a = s0 + i < nseg ? seg[s0 + i] : 0;
            if (acc <= r && r < acc + a) {
                st->seg = s0 + i;
                st->r_in = r - acc;
            }
            acc += a;
        }
    }
    __syncthreads();
    if (warp == 0) {
        const int s = st->seg;
        const uint64_t rin = st->r_in;
        const int base = s * SMP_SEG + 4 * lane;
        unsigned mod = 0; /* banned or modified */
        if (c.mask && base < c.V) mod = ~(__ldg(c.mask + (base >> 5)) >> (base & 31)) & 0xFu;
        if (c.has_mod && base < c.V) mod |= (c.bitmap[base >> 5] >> (base & 31)) & 0xFu;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int id = base + e;
            segw[4 * lane + e] = id < c.V && !((mod >> e) & 1u) ? sup.weight(c.row[id]) : 0u;
        }
        __syncwarp();
        if (c.has_mod) {
            const int n_mod = c.n_pen + c.n_bias;
            for (int j = lane; j < n_mod; j += 32) {
                int id;
                float l;
                if (smp_mod_entry(c, j, &id, &l) && id / SMP_SEG == s) segw[id % SMP_SEG] = sup.weight(l);
            }
            __syncwarp();
        }
        uint64_t w[4], mine = 0;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            w[e] = segw[4 * lane + e];
            mine += w[e];
        }
        uint64_t x = mine;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            uint64_t y = __shfl_up_sync(TS_FULL_MASK, x, o);
            if (lane >= o) x += y;
        }
        uint64_t acc = x - mine;
        if (acc <= rin && rin < x) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (acc <= rin && rin < acc + w[e]) st->token = base + e;
                acc += w[e];
            }
        }
    }
    __syncthreads();
    return st->token;
}

/* ---- exact radix select over the row ------------------------------------------------------ */

/* The largest key K such that the sum of val over the tokens kv selects with key >= K
 * reaches target (which the selected total must reach); *above = that sum over key > K.
 * top_p > 0: the target is smp_top_p_target(top_p, the selected total) instead, the total
 * coming from the first sweep's histogram. kv(id, x, raw_ok, proc_ok, &key, &val) ->
 * selected. Three sweeps (11-bit digits), histograms of exact integer sums in shared
 * memory. All threads. */
template <typename KV>
__device__ uint32_t smp_radix_select(const smp_row &c, KV kv, double target, float top_p, uint64_t *above,
                                     uint64_t *hist, uint64_t *scratch, smp_state *st)
{
    uint32_t prefix = 0;
    uint64_t acc = 0;
    const int tid = threadIdx.x;
    for (int round = 0; round < 3; round++) {
        const int width = round < 2 ? SMP_RADIX_BITS : 32 - 2 * SMP_RADIX_BITS;
        const int shift = 32 - SMP_RADIX_BITS * (round + 1) < 0 ? 0 : 32 - SMP_RADIX_BITS * (round + 1);
        const int nb = 1 << width;
        const uint32_t high = round == 0 ? 0u : ~0u << (shift + width); /* digits chosen so far */
        for (int i = tid; i < nb; i += SMP_THREADS) hist[i] = 0;
        __syncthreads();
        smp_sweep(
            c,
            [&](int id, float x, bool raw_ok, bool proc_ok) {
                uint32_t key;
                uint64_t val;
                if (kv(id, x, raw_ok, proc_ok, &key, &val) && (key & high) == prefix && val)
                    atomicAdd((unsigned long long *)&hist[(key >> shift) & (nb - 1)], (unsigned long long)val);
            },
            smp_no_tile_end());
        __syncthreads();
        /* suffix sums from the top digit down: thread t holds digits nb-1-DPT*t downwards */
        const int d0 = nb - 1 - SMP_DIGITS_PER_THREAD * tid;
        uint64_t h[SMP_DIGITS_PER_THREAD], mine = 0;
#pragma unroll
        for (int i = 0; i < SMP_DIGITS_PER_THREAD; i++) {
            h[i] = d0 - i >= 0 ? hist[d0 - i] : 0;
            mine += h[i];
        }
        uint64_t total, pre = smp_block_exscan(mine, &total, scratch);
        if (round == 0 && top_p > 0.0f) target = smp_top_p_target(top_p, total);
        /* the largest digit d with acc + (sum of digits >= d) >= target */
        uint64_t run = acc + pre;
#pragma unroll
        for (int i = 0; i < SMP_DIGITS_PER_THREAD; i++) {
            if (d0 - i >= 0 && (double)(run + h[i]) >= target && !((double)run >= target)) {
                st->digit = (uint32_t)(d0 - i);
                st->above = run;
            }
            run += h[i];
        }
        __syncthreads();
        prefix |= st->digit << shift;
        acc = st->above;
        __syncthreads(); /* st is rewritten by the next round */
    }
    *above = acc;
    return prefix;
}

/* ---- raw logprobs -------------------------------------------------------------------------- */

/* Ordered collection for the top-N fallback: every finite raw logit with key > K, and the
 * first `need` ids (in id order) with key == K, appended to rc. All threads. */
__device__ void smp_collect_ties(const smp_row &c, uint32_t K, int need, uint64_t *rc, uint64_t *scratch,
                                 smp_state *st)
{
    const int tid = threadIdx.x;
    if (tid == 0) st->taken = 0;
    __syncthreads();
    for (int tile = 0; tile < c.ntiles; tile++) {
        const int b = tile * SMP_TILE + 4 * tid;
        uint32_t key[4];
        unsigned eq = 0;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float z = b + e < c.V ? c.row[b + e] : -INFINITY;
            bool ok = z > -INFINITY;
            key[e] = ok ? smp_key(z) : 0u;
            smp_append(ok && key[e] > K, ((uint64_t)~key[e] << 32) | (uint32_t)(b + e), rc, SMP_RCAP,
                       &st->n_rcand);
            eq |= (ok && key[e] == K) ? 1u << e : 0u;
        }
        uint64_t total, pre = smp_block_exscan((uint64_t)__popc(eq), &total, scratch);
        int rank = st->taken + (int)pre;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            bool take = ((eq >> e) & 1u) && rank < need;
            rank += (eq >> e) & 1u;
            smp_append(take, ((uint64_t)~K << 32) | (uint32_t)(b + e), rc, SMP_RCAP, &st->n_rcand);
        }
        __syncthreads();
        if (tid == 0) st->taken += (int)total;
        __syncthreads();
    }
}

/* ---- the kernel ---------------------------------------------------------------------------- */

/* Sample-histogram bin of a value v <= top: steps of 1/scale below top, 255 = the rest. */
__device__ __forceinline__ int smp_bin(float v, float top, float scale)
{
    float d = top - v;
    return d > 0.0f ? (int)fminf(255.0f, d * scale) : 0;
}

/* The smallest bin b whose cumulative count reaches s (255 when none): warp-wide. */
__device__ __forceinline__ int smp_hist_threshold(const uint32_t *h, int s)
{
    const int lane = threadIdx.x & 31;
    uint32_t c[8], mine = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        c[i] = h[8 * lane + i];
        mine += c[i];
    }
    uint32_t x = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        uint32_t y = __shfl_up_sync(TS_FULL_MASK, x, o);
        if (lane >= o) x += y;
    }
    int b = 255;
    uint32_t acc = x - mine;
    if (acc < (uint32_t)s && x >= (uint32_t)s) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if (acc < (uint32_t)s && acc + c[i] >= (uint32_t)s) b = 8 * lane + i;
            acc += c[i];
        }
    }
    unsigned who = __ballot_sync(TS_FULL_MASK, b != 255);
    return who ? __shfl_sync(TS_FULL_MASK, b, __ffs(who) - 1) : 255;
}

__global__ void __launch_bounds__(SMP_THREADS, 1)
sampling_kernel(const float *__restrict__ logits,                 // [num_rows][row_stride]
                int64_t row_stride, int vocab,
                const struct sampling_params *__restrict__ params, // [num_rows]
                const int32_t *__restrict__ pen_start,             // [num_rows + 1] or NULL
                const int32_t *__restrict__ pen_ids,               // [nnz]
                const uint32_t *__restrict__ pen_info,             // [nnz]
                const int32_t *__restrict__ bias_start,            // [num_rows + 1] or NULL
                const int32_t *__restrict__ bias_ids,              // [nnz]
                const float *__restrict__ bias_vals,               // [nnz]
                const int32_t *__restrict__ mask_row,              // [num_rows] or NULL
                const uint32_t *__restrict__ masks,                // [num_masks][ceil(vocab/32)]
                struct sampling_output *__restrict__ out,          // [num_rows]
                int cap)
{
    TS_DYNAMIC_SHARED(uint64_t, dyn);
    TS_SHARED(smp_state, st, );
    TS_SHARED(uint64_t, scratch, [32]);
    TS_SHARED(float, red_f, [3][SMP_WARPS]);
    TS_SHARED(int, red_i, [2][SMP_WARPS]);
    TS_SHARED(uint32_t, hist, [2][SMP_HBINS]);
    TS_SHARED(uint32_t, segw, [SMP_SEG]);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int V = vocab;
    const int nwords = (V + 31) / 32;
    uint64_t *cand = dyn;                                            /* [cap] */
    uint64_t *rcand = cand + cap;                                    /* [SMP_RCAP] */
    uint32_t *bitmap = reinterpret_cast<uint32_t *>(rcand + SMP_RCAP); /* [nwords] */
    int32_t *sb_id = reinterpret_cast<int32_t *>(bitmap + nwords);  /* [SAMPLING_MAX_BIAS] */
    float *sb_val = reinterpret_cast<float *>(sb_id + SAMPLING_MAX_BIAS);
    int32_t *sb_in_pen = reinterpret_cast<int32_t *>(sb_val + SAMPLING_MAX_BIAS);
    float *sample_p = reinterpret_cast<float *>(cand); /* [cap] during pass A */
    float *sample_r = sample_p + cap;                  /* [cap] */
    uint64_t *seg = cand;                              /* [ntiles * 32] */
    uint64_t *rhist = cand;                            /* [SMP_RADIX_BINS] */

    const int r = blockIdx.x;
    const struct sampling_params P = params[r];
    struct sampling_output *o = out + r;
    const float *row = logits + (int64_t)r * row_stride;
    /* a scoring row samples nothing: no sampling parameter, penalty, bias or mask is read */
    const bool score = P.score != 0;

    /* ---- parameters and CSR data (uniform decisions) ---- */
    int status = SAMPLING_OK;
    if (P.n_logprobs < -1 || P.n_logprobs > SAMPLING_MAX_TOP_LOGPROBS)
        status = SAMPLING_ERR_PARAMS;
    else if (score && !(P.score_token >= 0 && P.score_token < V))
        status = SAMPLING_ERR_TARGET;
    else if (!score && (!(P.temperature >= 0.0f && P.temperature < INFINITY) ||
                        !(P.top_p > 0.0f && P.top_p <= 1.0f) || !(P.min_p >= 0.0f && P.min_p <= 1.0f) ||
                        !(P.repetition_penalty > 0.0f && P.repetition_penalty < INFINITY) ||
                        !(P.presence_penalty >= -2.0f && P.presence_penalty <= 2.0f) ||
                        !(P.frequency_penalty >= -2.0f && P.frequency_penalty <= 2.0f)))
        status = SAMPLING_ERR_PARAMS;
    const bool pen_on = P.repetition_penalty != 1.0f || P.presence_penalty != 0.0f || P.frequency_penalty != 0.0f;
    int n_pen = 0, n_bias = 0;
    int64_t ps = 0, bs = 0;
    if (pen_start && pen_on && !score) {
        ps = pen_start[r];
        n_pen = pen_start[r + 1] - pen_start[r];
    }
    if (bias_start && !score) {
        bs = bias_start[r];
        n_bias = bias_start[r + 1] - bias_start[r];
    }
    if (status == SAMPLING_OK && (n_pen < 0 || n_bias < 0 || n_bias > SAMPLING_MAX_BIAS))
        status = SAMPLING_ERR_INPUT;

    smp_row c;
    c.row = row;
    c.V = V;
    c.ntiles = (V + SMP_TILE - 1) / SMP_TILE;
    c.vec = (reinterpret_cast<uintptr_t>(row) & 15u) == 0;
    c.has_mod = status == SAMPLING_OK && n_pen + n_bias > 0;
    c.bitmap = bitmap;
    c.pen_ids = pen_ids + ps;
    c.pen_info = pen_info + ps;
    c.n_pen = n_pen;
    c.sb_id = sb_id;
    c.sb_val = sb_val;
    c.sb_in_pen = sb_in_pen;
    c.n_bias = n_bias;
    c.rep = P.repetition_penalty;
    c.pres = P.presence_penalty;
    c.freq = P.frequency_penalty;
    const int32_t mrow = mask_row && !score ? mask_row[r] : -1;
    c.mask = mrow >= 0 ? masks + (int64_t)mrow * nwords : NULL;

    if (c.has_mod) {
        int bad = 0;
        for (int i = tid; i < nwords; i += SMP_THREADS) bitmap[i] = 0;
        /* bias entries sorted by id (in cand, free until pass A) */
        int nbp = 2;
        while (nbp < n_bias) nbp <<= 1;
        for (int j = tid; j < nbp; j += SMP_THREADS) {
            uint64_t e = ~0ull;
            if (j < n_bias) {
                int id = bias_ids[bs + j];
                float bv = bias_vals[bs + j];
                if (id < 0 || id >= V || !(bv < INFINITY)) bad = 1; /* NaN fails too */
                else e = ((uint64_t)(uint32_t)id << 32) | (uint32_t)j;
            }
            cand[j] = e;
        }
        __syncthreads();
        smp_bitonic_sort(cand, nbp);
        for (int j = tid; j < n_bias; j += SMP_THREADS) {
            uint64_t e = cand[j];
            sb_id[j] = (int32_t)(e >> 32);
            sb_val[j] = e == ~0ull ? 0.0f : bias_vals[bs + (uint32_t)e];
            if (j > 0 && cand[j - 1] >> 32 == e >> 32) bad = 1; /* repeated id (or a bad one) */
        }
        for (int j = tid; j < n_pen; j += SMP_THREADS) {
            int id = c.pen_ids[j];
            if (id < 0 || id >= V) {
                bad = 1;
                continue;
            }
            uint32_t bit = 1u << (id & 31);
            if (atomicOr(&bitmap[id >> 5], bit) & bit) bad = 1; /* repeated id */
        }
        __syncthreads();
        for (int j = tid; j < n_bias; j += SMP_THREADS) {
            int id = sb_id[j];
            sb_in_pen[j] = id >= 0 && id < V ? (int32_t)((bitmap[id >> 5] >> (id & 31)) & 1u) : 0;
        }
        __syncthreads();
        for (int j = tid; j < n_bias; j += SMP_THREADS) {
            int id = sb_id[j];
            if (id >= 0 && id < V) atomicOr(&bitmap[id >> 5], 1u << (id & 31));
        }
        if (__syncthreads_or(bad)) status = SAMPLING_ERR_INPUT;
    }
    if (status != SAMPLING_OK) {
        if (tid == 0) {
            o->token = -1;
            o->status = status;
            o->logprob = -INFINITY;
            o->n_top = 0;
            o->rank = 0;
            for (int j = 0; j < SAMPLING_MAX_TOP_LOGPROBS; j++) {
                o->top_ids[j] = -1;
                o->top_logprobs[j] = -INFINITY;
            }
        }
        return;
    }

    const bool want_lp = score || P.n_logprobs >= 0;
    const int n_lp = score ? max(P.n_logprobs, 0) : P.n_logprobs; /* top logprobs asked for */
    const bool greedy_req = !score && P.temperature == 0.0f;
    const int k_req = score ? 0 : P.top_k;
    const bool topp = !score && P.top_p < 1.0f;
    /* sample stride: a power of two giving at most cap samples */
    int sshift = 0;
    while (((V + (1 << sshift) - 1) >> sshift) > cap) sshift++;
    const int smask = (1 << sshift) - 1;
    const int nsamp = (V + smask) >> sshift;
    const bool want_sp = !greedy_req && (k_req > 0 || topp); /* candidates may be needed */
    const bool want_sr = want_lp && n_lp > 0;

    /* ---- pass A: max / argmax / count of l, max of the raw logits, the samples ---- */
    float best_v = -INFINITY, rmax = -INFINITY;
    int best_id = INT_MAX, n_ok = 0;
    smp_sweep<SMP_UNROLL_FIRST>(
        c,
        [&](int id, float x, bool raw_ok, bool proc_ok) {
            if (raw_ok) {
                rmax = x > rmax ? x : rmax;
                if (want_sr && !(id & smask)) sample_r[id >> sshift] = x;
            }
            if (proc_ok) {
                if (x > best_v || (x == best_v && id < best_id)) {
                    best_v = x;
                    best_id = id;
                }
                n_ok += x > -INFINITY;
            }
            /* a banned token samples as -inf; a modified one is written again by the mod sweep */
            if (want_sp && (raw_ok || proc_ok) && !(id & smask))
                sample_p[id >> sshift] = proc_ok && x > -INFINITY ? x : -INFINITY;
        },
        smp_no_tile_end());
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        float ov = __shfl_xor_sync(TS_FULL_MASK, best_v, off);
        int oi = __shfl_xor_sync(TS_FULL_MASK, best_id, off);
        if (ov > best_v || (ov == best_v && oi < best_id)) {
            best_v = ov;
            best_id = oi;
        }
        float orm = __shfl_xor_sync(TS_FULL_MASK, rmax, off);
        rmax = orm > rmax ? orm : rmax;
        n_ok += __shfl_xor_sync(TS_FULL_MASK, n_ok, off);
    }
    if (lane == 0) {
        red_f[0][warp] = best_v;
        red_f[1][warp] = rmax;
        red_i[0][warp] = best_id;
        red_i[1][warp] = n_ok;
    }
    __syncthreads();
    best_v = -INFINITY;
    best_id = INT_MAX;
    rmax = -INFINITY;
    n_ok = 0;
    for (int w = 0; w < SMP_WARPS; w++) {
        float v = red_f[0][w];
        int i = red_i[0][w];
        if (v > best_v || (v == best_v && i < best_id)) {
            best_v = v;
            best_id = i;
        }
        rmax = red_f[1][w] > rmax ? red_f[1][w] : rmax;
        n_ok += red_i[1][w];
    }

    /* ---- what this row needs ---- */
    int token = score ? P.score_token : -1;
    if (n_ok == 0 && !score) status = SAMPLING_ERR_NO_TOKEN;
    const bool greedy = status == SAMPLING_OK && !score && (greedy_req || best_v == INFINITY);
    if (greedy) token = best_id;
    const bool sampling = status == SAMPLING_OK && !score && !greedy;
    const float m = best_v, inv_t = smp_inv_temperature(greedy_req || score ? 1.0f : P.temperature);
    const bool topk = k_req > 0 && k_req < n_ok;
    const uint32_t minp_w = score ? 0u : smp_min_p_weight(P.min_p);
    const bool direct = sampling && !topk && !topp;
    const bool use_cand = sampling && !direct && !(topk && k_req > cap / 2);
    const bool lp_ok = want_lp && status == SAMPLING_OK && rmax > -INFINITY && rmax < INFINITY;
    const int n_top_req = lp_ok ? n_lp : 0;
    const bool rcands = n_top_req > 0;

    /* ---- sample thresholds ---- */
    if (use_cand || rcands) {
        __syncthreads(); /* red_* are still being read */
        float dp = 0.0f, dr = 0.0f;
        for (int i = tid; i < nsamp; i += SMP_THREADS) {
            if (use_cand && sample_p[i] > -INFINITY) dp = fmaxf(dp, m - sample_p[i]);
            if (rcands && sample_r[i] > -INFINITY) dr = fmaxf(dr, rmax - sample_r[i]);
        }
        for (int i = tid; i < 2 * SMP_HBINS; i += SMP_THREADS) hist[i / SMP_HBINS][i % SMP_HBINS] = 0;
        dp = warp_max(dp);
        dr = warp_max(dr);
        if (lane == 0) {
            red_f[2][warp] = dp;
            red_f[0][warp] = dr;
        }
        __syncthreads();
        dp = 0.0f;
        dr = 0.0f;
        for (int w = 0; w < SMP_WARPS; w++) {
            dp = fmaxf(dp, red_f[2][w]);
            dr = fmaxf(dr, red_f[0][w]);
        }
        const float scale_p = (float)SMP_HBINS / fminf(SMP_RMAX, dp);
        const float scale_r = (float)SMP_HBINS / fminf(SMP_RMAX, dr);
        for (int i = tid; i < nsamp; i += SMP_THREADS) {
            if (use_cand && sample_p[i] > -INFINITY) atomicAdd(&hist[0][smp_bin(sample_p[i], m, scale_p)], 1u);
            if (rcands && sample_r[i] > -INFINITY) atomicAdd(&hist[1][smp_bin(sample_r[i], rmax, scale_r)], 1u);
        }
        __syncthreads();
        const int s_p = topk ? k_req : max(1, (cap / 2) >> sshift);
        if (warp == 0) {
            int b = smp_hist_threshold(hist[0], s_p);
            if (lane == 0) {
                st.b_p = b;
                st.scale_p = scale_p;
                st.n_cand = 0;
            }
        } else if (warp == 1) {
            int b = smp_hist_threshold(hist[1], n_top_req);
            if (lane == 0) {
                st.b_r = b;
                st.scale_r = scale_r;
                st.n_rcand = 0;
            }
        }
        __syncthreads();
    }

    /* ---- pass B: candidates, log-sum-exp, or the direct draw's segment sums ---- */
    const int b_p = use_cand ? st.b_p : 0, b_r = rcands ? st.b_r : 0;
    const float scale_p = use_cand ? st.scale_p : 0.0f, scale_r = rcands ? st.scale_r : 0.0f;
    const bool sum_all = use_cand && topp && !topk;
    smp_support sup;
    sup.m = m;
    sup.inv_t = inv_t;
    sup.vk = 0;
    sup.theta = minp_w > 1u ? minp_w : 1u;
    float rsum = 0.0f, lout = -INFINITY;
    double rsum_all = 0.0; /* sum of exp(raw - rmax): float per thread, double across them */
    int n_fin = 0;
    uint64_t s_all = 0, seg_acc = 0;
    if (lp_ok || use_cand || direct) {
        __syncthreads(); /* the samples are read above; seg / cand overwrite them */
        smp_sweep(
            c,
            [&](int id, float x, bool raw_ok, bool proc_ok) {
                if (lp_ok && raw_ok && x > -INFINITY) {
                    rsum += __expf(x - rmax);
                    n_fin++;
                }
                if (rcands) {
                    bool in = raw_ok && x > -INFINITY && smp_bin(x, rmax, scale_r) <= b_r;
                    smp_append(in, ((uint64_t)~smp_key(x) << 32) | (uint32_t)id, rcand, SMP_RCAP, &st.n_rcand);
                }
                if (use_cand) {
                    bool ok = proc_ok && x > -INFINITY;
                    bool in = ok && smp_bin(x, m, scale_p) <= b_p;
                    smp_append(in, ((uint64_t)~smp_key(x) << 32) | (uint32_t)id, cand, cap, &st.n_cand);
                    if (ok && !in) lout = x > lout ? x : lout;
                    if (sum_all && ok) s_all += smp_weight(smp_scaled(x, m, inv_t));
                }
                if (direct) {
                    uint32_t w = proc_ok ? sup.weight(x) : 0u;
                    if (raw_ok) seg_acc += w;
                    else if (w) atomicAdd((unsigned long long *)&seg[id / SMP_SEG], (unsigned long long)w);
                }
            },
            [&](int tile) {
                if (direct) {
                    uint64_t s = smp_warp_sum_u64(seg_acc);
                    if (lane == 0) seg[tile * SMP_WARPS + warp] = s;
                    seg_acc = 0;
                }
            });
        rsum = warp_sum(rsum);
        lout = warp_max(lout);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) n_fin += __shfl_xor_sync(TS_FULL_MASK, n_fin, off);
        __syncthreads();
        if (lane == 0) {
            red_f[0][warp] = rsum;
            red_f[1][warp] = lout;
            red_i[0][warp] = n_fin;
        }
        s_all = smp_block_sum(s_all, scratch); /* its barriers publish red_* */
        lout = -INFINITY;
        n_fin = 0;
        for (int w = 0; w < SMP_WARPS; w++) {
            rsum_all += (double)red_f[0][w];
            lout = fmaxf(lout, red_f[1][w]);
            n_fin += red_i[0][w];
        }
    }

    /* ---- sampling ---- */
    const uint64_t bits = smp_draw_bits(P.seed, P.step);
    if (direct) {
        token = smp_segment_draw(c, sup, seg, c.ntiles * SMP_WARPS, bits, scratch, segw, &st);
    } else if (sampling) {
        bool done = false;
        const int n = use_cand ? st.n_cand : cap + 1;
        if (use_cand && n <= cap) {
            const bool all_in = b_p == 255; /* every samplable token is a candidate */
            smp_sort(cand, n);              /* l descending, id ascending */
            int nK = n;
            if (topk && k_req < n) {
                const uint32_t hk = (uint32_t)(cand[k_req - 1] >> 32);
                int cnt = 0;
                for (int i = tid; i < n; i += SMP_THREADS) cnt += (uint32_t)(cand[i] >> 32) <= hk;
                nK = (int)smp_block_sum((uint64_t)cnt, scratch);
            }
            for (int i = tid; i < nK; i += SMP_THREADS) {
                uint64_t e = cand[i];
                uint32_t w = smp_weight(smp_scaled(smp_key_value(~(uint32_t)(e >> 32)), m, inv_t));
                cand[i] = ((uint64_t)w << 32) | (uint32_t)e;
            }
            __syncthreads();
            const bool within = topk || all_in; /* the candidates hold every token of K */
            bool ok = true;
            uint32_t theta = 1;
            auto wof = [](uint64_t e) { return e >> 32; };
            if (topp) {
                uint64_t sK = s_all;
                if (within) {
                    uint64_t part = 0;
                    for (int i = tid; i < nK; i += SMP_THREADS) part += cand[i] >> 32;
                    sK = smp_block_sum(part, scratch);
                }
                const uint64_t thr = (uint64_t)ceil(smp_top_p_target(P.top_p, sK));
                uint64_t dummy;
                const int j = smp_first_reaching(cand, nK, thr, wof, &dummy, scratch, &st);
                if (j >= nK) ok = false; /* the nucleus reaches below the candidates */
                else theta = (uint32_t)(cand[j] >> 32);
            }
            theta = theta > minp_w ? theta : minp_w;
            if (ok && !within && lout > -INFINITY && smp_weight(smp_scaled(lout, m, inv_t)) >= theta)
                ok = false; /* a token left out would be in the support */
            if (ok) {
                int cnt = 0;
                for (int i = tid; i < nK; i += SMP_THREADS) cnt += (uint32_t)(cand[i] >> 32) >= theta;
                const int nF = (int)smp_block_sum((uint64_t)cnt, scratch);
                for (int i = tid; i < nF; i += SMP_THREADS) {
                    uint64_t e = cand[i];
                    cand[i] = ((uint64_t)(uint32_t)e << 32) | (e >> 32); /* id, W */
                }
                __syncthreads();
                smp_sort(cand, nF); /* id ascending */
                uint64_t part = 0;
                for (int i = tid; i < nF; i += SMP_THREADS) part += cand[i] & 0xffffffffull;
                const uint64_t total = smp_block_sum(part, scratch);
                auto wlo = [](uint64_t e) { return e & 0xffffffffull; };
                const uint64_t rr = smp_draw_point(bits, total);
                uint64_t dummy;
                const int t = smp_first_reaching(cand, nF, rr + 1, wlo, &dummy, scratch, &st);
                token = (int)(cand[t] >> 32);
                done = true;
            }
            __syncthreads();
        }
        if (!done) {
            /* exact fallback: radix select over the row, then the segment draw */
            uint64_t above;
            uint32_t vk = 0;
            if (topk) {
                vk = smp_radix_select(
                    c,
                    [&](int, float x, bool, bool proc_ok, uint32_t *key, uint64_t *val) {
                        if (!(proc_ok && x > -INFINITY)) return false;
                        *key = smp_key(x);
                        *val = 1;
                        return true;
                    },
                    (double)k_req, 0.0f, &above, rhist, scratch, &st);
            }
            uint32_t theta = 1;
            if (topp) /* the nucleus among the tokens top-k keeps, by mass */
                theta = smp_radix_select(
                    c,
                    [&](int, float x, bool, bool proc_ok, uint32_t *key, uint64_t *val) {
                        if (!(proc_ok && x > -INFINITY && smp_key(x) >= vk)) return false;
                        uint32_t w = smp_weight(smp_scaled(x, m, inv_t));
                        *key = w;
                        *val = w;
                        return true;
                    },
                    0.0, P.top_p, &above, rhist, scratch, &st);
            smp_support fs = sup;
            fs.vk = vk;
            fs.theta = theta > sup.theta ? theta : sup.theta;
            smp_segment_pass(c, fs, seg);
            token = smp_segment_draw(c, fs, seg, c.ntiles * SMP_WARPS, bits, scratch, segw, &st);
        }
    }

    /* ---- raw logprobs ---- */
    double lse = 0.0;
    int n_top = 0;
    if (lp_ok) {
        lse = (double)rmax + log(rsum_all);
        n_top = min(n_top_req, n_fin);
        if (n_top > 0) {
            if (st.n_rcand > SMP_RCAP) {
                uint64_t above;
                uint32_t K = smp_radix_select(
                    c,
                    [&](int, float x, bool raw_ok, bool, uint32_t *key, uint64_t *val) {
                        if (!(raw_ok && x > -INFINITY)) return false;
                        *key = smp_key(x);
                        *val = 1;
                        return true;
                    },
                    (double)n_top, 0.0f, &above, rhist, scratch, &st);
                __syncthreads();
                if (tid == 0) st.n_rcand = 0;
                __syncthreads();
                smp_collect_ties(c, K, n_top - (int)above, rcand, scratch, &st);
            }
            smp_sort(rcand, min(st.n_rcand, SMP_RCAP));
        }
    }

    /* ---- rank (scoring rows): the ids whose raw logit is >= the token's, itself included;
     * an IEEE compare, so NaN never counts (and a NaN token counts nothing) ---- */
    int rank = 0;
    if (score && status == SAMPLING_OK) { /* uniform; token is in [0, V) */
        const float xt = row[token];
        int n_ge = 0;
        smp_sweep(c, [&](int, float x, bool raw_ok, bool) { n_ge += raw_ok && x >= xt; }, smp_no_tile_end());
        rank = (int)smp_block_sum((uint64_t)n_ge, scratch);
    }

    if (tid == 0) {
        o->token = status == SAMPLING_OK ? token : -1;
        o->status = status;
        float lp = -INFINITY;
        if (lp_ok && status == SAMPLING_OK) {
            float z = row[token];
            lp = z > -INFINITY ? (float)((double)z - lse) : -INFINITY;
        }
        o->logprob = lp;
        o->n_top = n_top;
        o->rank = rank;
        for (int j = 0; j < SAMPLING_MAX_TOP_LOGPROBS; j++) {
            int id = -1;
            float v = -INFINITY;
            if (j < n_top) {
                uint64_t e = rcand[j];
                id = (int)(uint32_t)e;
                v = (float)((double)smp_key_value(~(uint32_t)(e >> 32)) - lse);
            }
            o->top_ids[j] = id;
            o->top_logprobs[j] = v;
        }
    }
}

/* ---- launcher ----------------------------------------------------------------------------- */

/* Dynamic shared memory for a vocabulary and candidate capacity. */
static size_t smp_smem_bytes(int vocab, int cap)
{
    size_t nwords = ((size_t)vocab + 31) / 32;
    return (size_t)cap * 8 + (size_t)SMP_RCAP * 8 + nwords * 4 + (size_t)SAMPLING_MAX_BIAS * 12;
}

extern "C" int cuda_sampling(const float *logits, int64_t row_stride, int num_rows, int vocab,
                             const struct sampling_params *params, const int32_t *pen_start,
                             const int32_t *pen_ids, const uint32_t *pen_info, const int32_t *bias_start,
                             const int32_t *bias_ids, const float *bias_vals, const int32_t *mask_row,
                             const uint32_t *masks, struct sampling_output *out, cudaStream_t stream)
{
    if (num_rows < 0 || vocab < 1 || vocab > SAMPLING_MAX_VOCAB || row_stride < vocab)
        return (int)cudaErrorInvalidValue;
    if (num_rows == 0) return 0;
    if (!logits || !params || !out || (pen_start && (!pen_ids || !pen_info)) ||
        (bias_start && (!bias_ids || !bias_vals)) || (mask_row && !masks))
        return (int)cudaErrorInvalidValue;
    int dev = 0, optin = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess) return (int)e;
    /* the largest candidate capacity the device's shared memory allows (8192 on sm_80 /
     * sm_90, 4096 on sm_89's 99 KiB) */
    int cap = 8192;
    while (cap > SMP_MIN_CAP && smp_smem_bytes(vocab, cap) + SMP_STATIC_SMEM_MAX > (size_t)optin) cap >>= 1;
    const size_t smem = smp_smem_bytes(vocab, cap);
    if (smem + SMP_STATIC_SMEM_MAX > (size_t)optin) return (int)cudaErrorInvalidValue;
    e = cudaFuncSetAttribute(sampling_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return (int)e;
    TS_LAUNCH(sampling_kernel, num_rows, SMP_THREADS, smem, stream, logits, row_stride, vocab, params, pen_start,
              pen_ids, pen_info, bias_start, bias_ids, bias_vals, mask_row, masks, out, cap);
    return TS_LAUNCH_RESULT();
}

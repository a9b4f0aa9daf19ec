/* wmma.h — nvcuda::wmma under the emulator (included by emu.h; <mma.h> maps here).
 *
 * Shapes 16x16x16, 32x8x16 and 8x32x16; inputs __half or __nv_bfloat16 (row_major or
 * col_major); accumulators float, or __half for 16x16x16. A fragment has CUDA's number of
 * elements per lane (mma.h): the matrix once over the warp (rows x cols / 32) for
 * accumulators and __nv_bfloat16 inputs, but 16 for every __half input, so that a __half
 * A or B fragment of 16x16x16, a __half B of 32x8x16 and a __half A of 8x32x16 hold each
 * element 2 or 4 times. The elements sit in the emulator's OWN layout: lane l holds the
 * matrix's row-major elements [l * E, (l + 1) * E) (E = rows x cols / 32, A: M x K,
 * B: K x N, C/D: M x N), each repeated in adjacent slots where the type holds copies.
 * Code that applies the same operation to every x[i] (scaling, conversion, activation)
 * works with any layout; code that assumes NVIDIA's layout, or that one type's fragment
 * matches another's slot for slot (a __half load's bits copied into a __nv_bfloat16
 * fragment), does not, on purpose: on a GPU that layout is unspecified.
 *
 * load_matrix_sync, store_matrix_sync and mma_sync are warp-collective: all 32 lanes of a
 * full warp must call them (a missing lane is a deadlock abort, a partial warp an abort).
 * Loads and stores check CUDA's requirements: the same pointer, ldm and layout on every
 * lane, the pointer 256-bit (32-byte) aligned, ldm a multiple of 16 bytes. mma_sync gathers
 * every lane's fragments when the last lane arrives and computes D = A * B + C in float
 * (k ascending), rounding once to D's type. fill_fragment is per-lane, as in CUDA.
 */
#ifndef TESSERA_EMU_WMMA_H
#define TESSERA_EMU_WMMA_H

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {

template <typename Use, int M, int N, int K> struct dims;
template <int M, int N, int K> struct dims<matrix_a, M, N, K> {
    static constexpr int rows = M, cols = K;
};
template <int M, int N, int K> struct dims<matrix_b, M, N, K> {
    static constexpr int rows = K, cols = N;
};
template <int M, int N, int K> struct dims<accumulator, M, N, K> {
    static constexpr int rows = M, cols = N;
};

/* Elements per lane: CUDA's count (value) and the distinct ones (exact), each held
 * value / exact times. */
template <typename Use, int M, int N, int K, typename T> struct per_lane {
    static constexpr int exact = dims<Use, M, N, K>::rows * dims<Use, M, N, K>::cols / 32;
    static constexpr int value =
        !std::is_same<Use, accumulator>::value && std::is_same<T, __half>::value ? 16 : exact;
    static constexpr int copies = value / exact;
};

template <int M, int N, int K> struct shape_ok {
    static constexpr bool value = K == 16 && ((M == 16 && N == 16) || (M == 32 && N == 8) || (M == 8 && N == 32));
};

template <typename T> struct is_input : std::false_type {};
template <> struct is_input<__half> : std::true_type {};
template <> struct is_input<__nv_bfloat16> : std::true_type {};

static inline float to_f(float v) { return v; }
static inline float to_f(__half v) { return __half2float(v); }
static inline float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> static inline T from_f(float v);
template <> inline float from_f<float>(float v) { return v; }
template <> inline __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> inline __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename L> struct layout_of;
template <> struct layout_of<row_major> {
    static constexpr layout_t value = mem_row_major;
};
template <> struct layout_of<col_major> {
    static constexpr layout_t value = mem_col_major;
};

/* One lane's load or store: the element array of its fragment and the memory matrix. */
struct memop : emu_collective {
    void *x;        /* the lane's fragment elements */
    void *mem;      /* the matrix in memory (const for loads) */
    unsigned ldm;
    layout_t layout;
    int rows, cols, elem_size, per_lane, copies; /* per_lane slots, each element in `copies` of them */
    bool store;
    const char *file;
    int line;
};

/* Checks the warp agrees on the arguments and CUDA's alignment rules (wmma.cc). */
void check_memop(emu_collective *const lanes[32]);

template <typename TF, typename TM> static void run_memop(emu_collective *const lanes[32])
{
    check_memop(lanes);
    const memop *m0 = static_cast<const memop *>(lanes[0]);
    TM *mem = static_cast<TM *>(m0->mem);
    for (int l = 0; l < 32; l++) {
        const memop *m = static_cast<const memop *>(lanes[l]);
        TF *x = static_cast<TF *>(m->x);
        for (int e = 0; e < m->per_lane; e++) {
            if (m->store && e % m->copies) continue; /* a copy: stored from its first slot */
            int i = l * (m->per_lane / m->copies) + e / m->copies, r = i / m->cols, c = i % m->cols;
            size_t off = m->layout == mem_row_major ? (size_t)r * m->ldm + c : (size_t)c * m->ldm + r;
            if (m->store) mem[off] = from_f<TM>(to_f(x[e]));
            else x[e] = from_f<TF>(to_f(mem[off]));
        }
    }
}

/* One lane's mma: its fragments' element arrays. */
template <int M, int N, int K, typename TA, typename TB, typename TC, typename TD> struct mmaop : emu_collective {
    const TA *a;
    const TB *b;
    const TC *c;
    TD *d;
};

template <int M, int N, int K, typename TA, typename TB, typename TC, typename TD>
static void run_mma(emu_collective *const lanes[32])
{
    typedef mmaop<M, N, K, TA, TB, TC, TD> op_t;
    typedef per_lane<matrix_a, M, N, K, TA> pa;
    typedef per_lane<matrix_b, M, N, K, TB> pb;
    enum { EA = pa::exact, RA = pa::copies, EB = pb::exact, RB = pb::copies, EC = M * N / 32 };
    float A[M * K], B[K * N], D[M * N];
    for (int l = 0; l < 32; l++) { /* each element from its first slot */
        const op_t *o = static_cast<const op_t *>(lanes[l]);
        for (int e = 0; e < EA; e++) A[l * EA + e] = to_f(o->a[e * RA]);
        for (int e = 0; e < EB; e++) B[l * EB + e] = to_f(o->b[e * RB]);
        for (int e = 0; e < EC; e++) D[l * EC + e] = to_f(o->c[e]);
    }
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) {
            float acc = D[r * N + c];
            for (int k = 0; k < K; k++) acc += A[r * K + k] * B[k * N + c];
            D[r * N + c] = acc;
        }
    for (int l = 0; l < 32; l++) {
        const op_t *o = static_cast<const op_t *>(lanes[l]);
        for (int e = 0; e < EC; e++) o->d[e] = from_f<TD>(D[l * EC + e]);
    }
}

} // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void> class fragment {
    static_assert(detail::shape_ok<M, N, K>::value, "emulated wmma shapes: 16x16x16, 32x8x16, 8x32x16");
    static_assert(std::is_same<Use, accumulator>::value ? (std::is_same<T, float>::value ||
                                                           (std::is_same<T, __half>::value && M == 16 && N == 16))
                                                        : detail::is_input<T>::value,
                  "emulated wmma types: __half / __nv_bfloat16 inputs, float accumulators (or __half for 16x16x16)");

  public:
    typedef T element_type;
    typedef T storage_element_type;
    static constexpr int num_elements = detail::per_lane<Use, M, N, K, T>::value;
    T x[num_elements];
};

template <typename Use, int M, int N, int K, typename T, typename Layout, typename V>
static inline void fill_fragment(fragment<Use, M, N, K, T, Layout> &f, const V &v)
{
    for (int i = 0; i < f.num_elements; i++) f.x[i] = (T)v;
}

namespace detail {
template <typename Use, int M, int N, int K, typename TF, typename TM, typename Layout>
static inline void memop_sync(fragment<Use, M, N, K, TF, Layout> &f, TM *p, unsigned ldm, layout_t layout, bool store,
                              const char *what, const char *file, int line)
{
    memop m;
    m.run = &run_memop<TF, typename std::remove_const<TM>::type>;
    m.what = what;
    m.x = f.x;
    m.mem = (void *)p;
    m.ldm = ldm;
    m.layout = layout;
    m.rows = dims<Use, M, N, K>::rows;
    m.cols = dims<Use, M, N, K>::cols;
    m.elem_size = (int)sizeof(TM);
    m.per_lane = f.num_elements;
    m.copies = per_lane<Use, M, N, K, TF>::copies;
    m.store = store;
    m.file = file;
    m.line = line;
    emu_warp_op(emu_site{ file, line }, EMU_COLLECTIVE, 0xffffffffu, 0, 0, 0, 32, &m);
}
} // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout>
static inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout> &f, const T *p, unsigned ldm,
                                    const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    static_assert(!std::is_same<Use, accumulator>::value, "an accumulator load needs a layout_t argument");
    detail::memop_sync(f, p, ldm, detail::layout_of<Layout>::value, false, "wmma::load_matrix_sync", file, line);
}

template <int M, int N, int K, typename T>
static inline void load_matrix_sync(fragment<accumulator, M, N, K, T> &f, const T *p, unsigned ldm, layout_t layout,
                                    const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    detail::memop_sync(f, p, ldm, layout, false, "wmma::load_matrix_sync", file, line);
}

template <int M, int N, int K, typename T>
static inline void store_matrix_sync(T *p, const fragment<accumulator, M, N, K, T> &f, unsigned ldm, layout_t layout,
                                     const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    detail::memop_sync(const_cast<fragment<accumulator, M, N, K, T> &>(f), p, ldm, layout, true,
                       "wmma::store_matrix_sync", file, line);
}

template <int M, int N, int K, typename TA, typename LA, typename TB, typename LB, typename TC, typename TD>
static inline void mma_sync(fragment<accumulator, M, N, K, TD> &d, const fragment<matrix_a, M, N, K, TA, LA> &a,
                            const fragment<matrix_b, M, N, K, TB, LB> &b, const fragment<accumulator, M, N, K, TC> &c,
                            bool satf = false, const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    static_assert(std::is_same<TA, TB>::value, "wmma::mma_sync: A and B must have the same element type");
    (void)satf;
    detail::mmaop<M, N, K, TA, TB, TC, TD> o;
    o.run = &detail::run_mma<M, N, K, TA, TB, TC, TD>;
    o.what = "wmma::mma_sync";
    o.a = a.x;
    o.b = b.x;
    o.c = c.x;
    o.d = d.x;
    emu_warp_op(emu_site{ file, line }, EMU_COLLECTIVE, 0xffffffffu, 0, 0, 0, 32, &o);
}

} // namespace wmma
} // namespace nvcuda

#endif

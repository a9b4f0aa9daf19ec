/* internal.h — what the emulator's runtime files (the .cc files here) share. Never included
 * by kernels or tests.
 *
 * Per-process emulator state, all of it behind these functions and each owned by one file:
 *   device.cc  configuration (env), the per-host-thread last error and current device,
 *              the seed, aborts and warnings, device properties
 *   fiber.cc   fiber stacks and the context switch
 *   pool.cc    the block worker pool (parallel_for)
 *   block.cc   running a grid: per-worker fibers, the block scheduler, barriers, warp ops,
 *              the watchdog
 *   shared.cc  the per-worker shared-memory arena
 *   launch.cc  emu_launch, per-kernel attributes, occupancy
 *   stream.cc  streams, events, host functions, synchronisation (one global lock)
 *   graph.cc   stream capture and CUDA graphs
 *   memory.cc  allocations, the registry of live ones, bounds-checked copies and memsets
 *   cublas.cc  the cuBLAS subset; mma_sync.cc ldmatrix (the rest is in mma_sync.h)
 */
#ifndef TESSERA_EMU_INTERNAL_H
#define TESSERA_EMU_INTERNAL_H

#include "emu.h"

#include <stdarg.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifndef EMU_ASAN
#define EMU_ASAN 0
#endif

#if EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__x86_64__)
#define EMU_ASM_SWITCH 1
/* fiber.cc's context switch: saves the running context's registers on its stack and its
 * stack pointer in *save_sp, then resumes the context whose stack pointer is new_sp. */
extern "C" void emu_ctx_switch(void **save_sp, void *new_sp);
#else
#define EMU_ASM_SWITCH 0
#include <ucontext.h>
#endif

namespace emu {

/* ---- device.cc -------------------------------------------------------------------------- */

struct config {
    int threads;        /* TESSERA_EMU_THREADS: block workers per grid (default min(nproc, 4)) */
    size_t stack_bytes; /* TESSERA_EMU_STACK_KB: fiber stack size (default 256 KiB, min 64) */
    size_t mem_bytes;   /* TESSERA_EMU_MEM_MB: emulated device memory (default 16384 MiB) */
    int devices;        /* TESSERA_EMU_DEVICES: device count (default 1) */
    int watchdog_s;     /* TESSERA_EMU_WATCHDOG_S: abort a block stuck without a fiber switch
                           for this long (default 120, 0 = off) */
};
const config &cfg();

/* Records e as the calling host thread's last error unless it is cudaSuccess; returns e. */
cudaError_t set_error(cudaError_t e);
int current_device();

/* Injected device faults, for testing error paths (TESSERA_EMU_FAULT=NAME or NAME@N). The
 * first (or N-th) kernel launch whose name contains NAME "faults": instead of running, it sets the
 * sticky error a GPU reports after an illegal memory access (cudaErrorIllegalAddress);
 * from then on every launch and every call that waits for the device returns it, as on a
 * GPU whose context is lost. Each new value of the variable fires once. */
bool fault_requested(const char *kernel_name);
cudaError_t sticky_error();
void set_sticky_error(cudaError_t e);

/* Prints "tessera-emu: <message>" and what the calling thread is running (kernel, launch
 * site, block, thread, seed), then aborts. For what would be undefined behaviour or a hang
 * on a GPU. */
[[noreturn]] void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints "tessera-emu: <message>" (why an API call returned an error). */
void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- fiber.cc --------------------------------------------------------------------------- */

/* An execution context: a stack and the saved stack pointer. The OS thread's own context
 * (fiber_init_native) has no stack of ours. */
struct fiber {
    void *sp = nullptr;         /* saved stack pointer while switched out */
    char *stack_lo = nullptr;   /* usable stack [stack_lo, stack_lo + stack_size) */
    size_t stack_size = 0;
    void *map = nullptr;        /* mapping incl. the PROT_NONE guard page */
    size_t map_size = 0;
    void *impl = nullptr;       /* ucontext_t on the non-x86-64 fallback */
};
void fiber_init_native(fiber *f);
/* A fiber that calls entry(arg) when first switched to; entry must never return. `index`
 * (the fiber's number on its worker) staggers where the stack starts within a page. */
void fiber_create(fiber *f, size_t stack_bytes, unsigned index, void (*entry)(void *), void *arg);
void fiber_destroy(fiber *f);
/* Saves the running context into from and resumes to (inline: it is the hot path). */
inline void fiber_switch(fiber *from, fiber *to)
{
#if EMU_ASAN
    void *fake_stack = nullptr;
    __sanitizer_start_switch_fiber(&fake_stack, to->stack_lo, to->stack_size);
#endif
#if EMU_ASM_SWITCH
    emu_ctx_switch(&from->sp, to->sp);
#else
    swapcontext((ucontext_t *)from->impl, (ucontext_t *)to->impl);
#endif
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}
/* First thing a new fiber does (sanitizer bookkeeping for the switch that started it). */
void fiber_started(fiber *f);

/* ---- pool.cc ---------------------------------------------------------------------------- */

/* Calls fn(i) for every i in [0, n), spread over the worker pool and the calling thread;
 * returns when all calls have returned. Any thread; calls may nest only from outside the pool. */
void parallel_for(size_t n, const std::function<void(size_t)> &fn);

/* ---- launch.cc / block.cc --------------------------------------------------------------- */

struct launch {
    std::function<void()> body;
    const void *func;
    const char *name;
    const char *file;
    int line;
    dim3 grid, block;
    size_t smem;       /* dynamic shared memory bytes */
    size_t smem_limit; /* static + dynamic bytes allowed for this kernel */
    uint64_t seed;
    bool fault;        /* TESSERA_EMU_FAULT: set the sticky error instead of running */
    bool pdl;          /* launched with programmatic stream serialization (TS_LAUNCH_PDL) */
};
/* Runs every block of the grid and returns when all are done (block.cc). */
void run_grid(const launch &L);

/* What the calling OS thread is running, for diagnostics; false outside a kernel. */
struct kernel_context {
    const launch *L;
    uint3 block, thread;
};
bool current_kernel(kernel_context *kc);

/* ---- shared.cc -------------------------------------------------------------------------- */

struct arena;
arena *arena_create();
void arena_destroy(arena *a);
/* Starts a block: dynamic region of dyn bytes filled with 0xFF, statics forgotten. */
void arena_begin_block(arena *a, size_t dyn, size_t limit);
arena *current_arena(); /* block.cc: the calling worker's arena, or fail() outside a kernel */
/* Whether [p, p + n) lies inside one of the calling block's shared allocations. */
bool arena_contains(const void *p, size_t n);

/* ---- stream.cc -------------------------------------------------------------------------- */

struct capture;

/* One unit of stream work. run() executes on the stream's worker thread. */
struct op {
    std::function<void()> run;
    const char *what;
};

/* The global lock over streams, events and captures, and its condition variable. */
std::mutex &sched_mutex();
std::condition_variable &sched_cv();

struct progress {
    uint64_t submitted = 0, done = 0;
};
struct event_state {
    uint64_t recorded = 0, done = 0;
    std::chrono::steady_clock::time_point when;
};

/* Enqueues o on s in stream order (the legacy stream's implicit synchronisation included),
 * or records it when s is capturing. *seq (optional) receives the op's position for
 * wait_op. Returns cudaSuccess or the error (not recorded as last error). Any thread. */
cudaError_t enqueue(cudaStream_t s, op o, uint64_t *seq = nullptr);
/* Waits until op seq of s has run. */
void wait_op(cudaStream_t s, uint64_t seq);
/* Waits until every stream is drained. */
void sync_all_streams();
/* True when s is capturing (takes the lock). */
bool stream_capturing(cudaStream_t s);
/* The error a synchronous, device-wide call (sync cudaMemcpy, cudaMalloc, ...) made now
 * must return because a capture in global mode is active (and invalidates it), or success. */
cudaError_t check_sync_allowed(const char *what);

/* Lookups under sched_mutex: the stream behind a handle (0, cudaStreamLegacy and
 * cudaStreamPerThread are the legacy stream) or null; the event or null; all streams and
 * events created and not destroyed. */
CUstream_st *stream_locked(cudaStream_t s);
CUevent_st *event_locked(cudaEvent_t e);
std::vector<CUstream_st *> &streams_locked();
std::vector<CUevent_st *> &events_locked();

/* ---- graph.cc --------------------------------------------------------------------------- */

/* A capture in progress: the ops recorded so far, in the order they were issued (a valid
 * serialisation of the streams that joined it). Owned by the origin stream's cap pointer
 * until cudaStreamEndCapture. */
struct capture {
    std::vector<op> ops;
    cudaStreamCaptureMode mode;
    std::thread::id thread; /* that began it (ThreadLocal mode binds only this thread) */
    cudaStream_t origin;
    bool invalidated = false;
    unsigned long long id;
};

/* ---- memory.cc -------------------------------------------------------------------------- */

enum mem_kind { MEM_PAGEABLE, MEM_DEVICE, MEM_PINNED };
/* Checks that [p, p + n) lies in one live allocation of a device kind (device, or pinned
 * when allow_pinned); prints why not (naming `what`) and returns false. */
bool check_device_span(const void *p, size_t n, bool allow_pinned, const char *what);

} // namespace emu

/* Streams and events are plain structs behind the CUDA handles (stream.cc). */
struct CUstream_st {
    unsigned flags = 0;
    int priority = 0;
    int device = 0;
    bool legacy = false;
    std::shared_ptr<emu::progress> prog = std::make_shared<emu::progress>();
    struct pending {
        emu::op o;
        uint64_t seq;
        std::vector<std::pair<std::shared_ptr<emu::progress>, uint64_t>> after; /* prog->done >= n */
        std::shared_ptr<emu::event_state> wait_ev;                             /* ev->done >= wait_gen */
        uint64_t wait_gen = 0;
        std::shared_ptr<emu::event_state> signal_ev; /* marks ev done (gen) when run */
        uint64_t signal_gen = 0;
    };
    std::deque<pending> q;
    bool worker_started = false, quit = false;
    void *worker = nullptr; /* std::thread * */
    emu::capture *cap = nullptr;
};

struct CUevent_st {
    unsigned flags = 0;
    std::shared_ptr<emu::event_state> st = std::make_shared<emu::event_state>();
    emu::capture *cap = nullptr; /* recorded into this capture (fork/join across streams) */
};

struct CUgraph_st {
    std::vector<emu::op> ops;
};

struct CUgraphExec_st {
    std::shared_ptr<const std::vector<emu::op>> ops;
};

#endif

/* block.cc — running a grid: per-worker fibers, the block scheduler, barriers, warp ops.
 *
 * Each OS thread that runs blocks (pool helpers and stream workers) owns one `worker`:
 * fibers (thread i of a block always runs on fiber i, fibers are reused from block to
 * block and never leave their OS thread), the shared-memory arena and the state of the
 * block it is running. A block runs cooperatively: a fiber runs until it blocks (barrier,
 * warp op, exit); then the next fiber in the run queue runs; when the queue is empty the
 * worker's own context decides: every thread done (block finished), every thread at the
 * same barrier (release it), anything else aborts (divergence or deadlock).
 *
 * Fiber order: at block start and at every barrier release the queue is a random
 * permutation drawn from a PRNG seeded by (seed, linear block index, barrier count), so the
 * order is a function of the seed alone, whichever worker runs the block. Lanes woken by a
 * warp op are queued in a random rotation of lane order drawn from the same generator.
 *
 * Warp ops meet per warp (warp = linear thread id / 32): a meeting is opened by the first
 * lane of a mask to arrive, and the last one computes every lane's result. A warp may
 * have several meetings open at once when their masks are disjoint.
 */
#include "internal.h"

#include <pthread.h>

#include <thread>
#include <unordered_map>

namespace emu {

enum thread_state : uint8_t { T_RUN, T_BARRIER, T_WARP, T_DONE };

struct worker;

/* A fiber and whom it runs for: thread `index` of its worker's current block. The hot
 * per-thread state lives in arrays in the worker (fewer cache lines per warp op). */
struct thread_rec {
    fiber f;
    worker *w;
    unsigned index; /* linear thread id in the block = fiber index */
};

struct meeting {
    unsigned mask, arrived;
    int kind, size, width;
    const char *name; /* the op, for messages (a collective names itself) */
    emu_site site;
};

enum { MAX_MEETINGS = 8 };

struct warp_rec {
    unsigned exists, live; /* lanes in the block; lanes not exited */
    int nopen;
    meeting m[MAX_MEETINGS];
    uint64_t val[32], res[32];
    int arg[32];
    emu_collective *coll[32];
};

struct worker {
    fiber native;
    std::vector<thread_rec *> th;
    arena *ar = nullptr;
    /* the block being run */
    const launch *L = nullptr;
    uint64_t bidx = 0;
    uint3 bid;
    unsigned n = 0;
    thread_state st[1024];
    uint3 tid[1024];
    emu_site where[1024]; /* barrier or warp op a thread waits at */
    int wait_kind[1024];  /* barrier kind */
    bool dep_waited[1024]; /* called cudaGridDependencySynchronize() (checked for pdl launches) */
    const char *wait_name[1024]; /* barrier or warp op name */
    uint32_t queue[1024];
    unsigned qhead = 0, qtail = 0;
    unsigned bar_arrived = 0, bar_pred = 0, bar_result = 0;
    uint64_t bar_no = 0;
    uint64_t rng = 0; /* xorshift64 state, reseeded from (seed, block, barrier count) */
    warp_rec warps[32];
    /* read by the watchdog thread */
    std::atomic<uint64_t> switches{ 0 };       /* fiber switches so far */
    std::atomic<const launch *> busy{ nullptr }; /* the launch whose block runs, or null */
    std::atomic<unsigned> running{ 0 };        /* the thread that runs now */

    ~worker();
};



static __thread worker *tl_worker EMU_TLS_HOT;    /* this OS thread's worker, once it ran a block */
static __thread thread_rec *tl_cur EMU_TLS_HOT;   /* the fiber running now, null in the worker's own context */
static thread_local std::unique_ptr<worker> tl_worker_owner;

} // namespace emu

__thread uint3 threadIdx EMU_TLS_HOT;
__thread uint3 blockIdx EMU_TLS_HOT;
__thread dim3 blockDim EMU_TLS_HOT;
__thread dim3 gridDim EMU_TLS_HOT;

namespace emu {

/* ---- random order ----------------------------------------------------------------------- */

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t rng_below(worker *w, uint32_t n)
{
    uint64_t x = w->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    w->rng = x;
    return (uint32_t)(((x >> 32) * (uint64_t)n) >> 32);
}

/* Queue = a permutation of all threads, drawn from (seed, block, barrier count). */
static void queue_permutation(worker *w)
{
    w->rng = mix64(mix64(mix64(w->L->seed) ^ w->bidx) ^ w->bar_no) | 1; /* xorshift: never 0 */
    for (unsigned i = 0; i < w->n; i++) {
        unsigned j = rng_below(w, i + 1);
        w->queue[i] = w->queue[j];
        w->queue[j] = i;
    }
    w->qhead = 0;
    w->qtail = w->n;
}

static void queue_push(worker *w, unsigned index)
{
    w->st[index] = T_RUN;
    w->queue[w->qtail++ & 1023] = index;
}

/* Queues index to run next (the ring's counters are unsigned: wrap-around is fine). */
static void queue_push_front(worker *w, unsigned index)
{
    w->st[index] = T_RUN;
    w->queue[--w->qhead & 1023] = index;
}

/* ---- switching -------------------------------------------------------------------------- */

static inline void switch_to(worker *w, fiber *from, thread_rec *to)
{
    w->switches.store(w->switches.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    w->running.store(to->index, std::memory_order_relaxed);
    tl_cur = to;
    threadIdx = w->tid[to->index];
    fiber_switch(from, &to->f);
}

/* The calling fiber stops running (its state says why) until someone queues it: runs the
 * next queued fiber, or returns to the worker's context when none is runnable. */
static void block_wait(worker *w, thread_rec *self)
{
    if (w->qhead != w->qtail) {
        thread_rec *next = w->th[w->queue[w->qhead++ & 1023]];
        if (next != self) switch_to(w, &self->f, next);
        return;
    }
    tl_cur = nullptr;
    fiber_switch(&self->f, &w->native);
}

static void thread_exit(thread_rec *t);

static void fiber_main(void *arg)
{
    thread_rec *t = (thread_rec *)arg;
    fiber_started(&t->f);
    for (;;) {
        t->w->L->body();
        thread_exit(t); /* returns when the fiber is reused by a later block */
    }
}

/* ---- diagnostics ------------------------------------------------------------------------ */

static const char *op_name(int kind)
{
    static const char *names[EMU_WARP_OP_COUNT] = {
        "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync", "__ballot_sync",
        "__any_sync", "__all_sync", "__syncwarp", "__reduce_add_sync", "__reduce_add_sync",
        "__reduce_min_sync", "__reduce_min_sync", "__reduce_max_sync", "__reduce_max_sync",
        "__reduce_and_sync", "__reduce_or_sync", "__reduce_xor_sync", "__match_any_sync",
        "__match_all_sync", "a warp-collective tensor-core operation",
    };
    return kind >= 0 && kind < EMU_WARP_OP_COUNT ? names[kind] : "?";
}

static const char *barrier_name(int kind)
{
    static const char *names[4] = { "__syncthreads()", "__syncthreads_count()", "__syncthreads_and()",
                                    "__syncthreads_or()" };
    return names[kind & 3];
}

static bool same_site(emu_site a, emu_site b)
{
    return a.line == b.line && (a.file == b.file || strcmp(a.file, b.file) == 0);
}

/* Appends printf-style text to buf (bounded). */
static void appendf(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void appendf(char *buf, size_t cap, const char *fmt, ...)
{
    size_t len = strlen(buf);
    if (len + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
}

/* Where thread t is: "exited", "waits at __syncthreads() at f:l", ... */
static void describe_thread(char *buf, size_t cap, const worker *w, unsigned i)
{
    appendf(buf, cap, "thread (%u,%u,%u) (warp %u lane %u) ", w->tid[i].x, w->tid[i].y, w->tid[i].z, i / 32, i % 32);
    switch (w->st[i]) {
    case T_DONE: appendf(buf, cap, "has exited"); break;
    case T_RUN: appendf(buf, cap, "is runnable"); break;
    case T_BARRIER:
    case T_WARP:
        appendf(buf, cap, "waits at %s at %s:%d", w->wait_name[i], w->where[i].file, w->where[i].line);
        break;
    }
}

bool current_kernel(kernel_context *kc)
{
    worker *w = tl_worker;
    if (!w || !w->L) return false;
    kc->L = w->L;
    kc->block = w->bid;
    kc->thread = tl_cur ? w->tid[tl_cur->index] : make_uint3(~0u, ~0u, ~0u);
    return true;
}

static thread_rec *current_thread(const char *what)
{
    thread_rec *t = tl_cur;
    if (!t) fail("%s called outside a kernel", what);
    return t;
}

/* ---- the block scheduler ---------------------------------------------------------------- */

/* ---- the watchdog ----------------------------------------------------------------------- */

/* Fibers are never preempted: a thread that spins waiting for another thread of its own
 * block (legal on a GPU, which interleaves them) spins forever here. A watchdog thread
 * looks at every worker once a second; one that has run a block for TESSERA_EMU_WATCHDOG_S
 * seconds (default 120, 0 = off) without a fiber switch is reported and the process aborts,
 * rather than leaving a silent hang. Time the process spends stopped (a debugger) does not
 * count. */
namespace {

struct watch_state {
    std::mutex mu;
    std::vector<worker *> workers;
    bool started = false;
};

watch_state &watch();

/* fork(): the child starts its own watchdog with its first worker. */
void watch_fork_prepare() { watch().mu.lock(); }
void watch_fork_parent() { watch().mu.unlock(); }
void watch_fork_child()
{
    watch().started = false;
    watch().mu.unlock();
}

watch_state &watch()
{
    static watch_state *w = [] {
        watch_state *n = new watch_state();
        pthread_atfork(watch_fork_prepare, watch_fork_parent, watch_fork_child);
        return n;
    }();
    return *w;
}

[[noreturn]] void report_stall(worker *w, double seconds)
{
    const launch *L = w->busy.load();
    unsigned i = w->running.load();
    fprintf(stderr,
            "tessera-emu: thread (%u,%u,%u) of block (%u,%u,%u) has run %.0f s without reaching a barrier, a warp "
            "operation or its end: fibers are never preempted, so a loop that waits for another thread of its own "
            "block never ends here; call __nanosleep() in the loop (TESSERA_EMU_WATCHDOG_S sets this limit)\n"
            "tessera-emu:   in kernel %s launched at %s:%d, grid (%u,%u,%u) block (%u,%u,%u)\n"
            "tessera-emu:   fiber-order seed 0x%llx (replay with TESSERA_EMU_SEED=0x%llx)\n",
            w->tid[i].x, w->tid[i].y, w->tid[i].z, w->bid.x, w->bid.y, w->bid.z, seconds, L->name, L->file, L->line,
            L->grid.x, L->grid.y, L->grid.z, L->block.x, L->block.y, L->block.z, (unsigned long long)L->seed,
            (unsigned long long)L->seed);
    fflush(stderr);
    abort();
}

void watchdog_main(int limit_s)
{
    struct seen {
        uint64_t switches;
        const launch *L;
        double stalled;
    };
    std::vector<std::pair<worker *, seen>> last;
    auto prev = std::chrono::steady_clock::now();
    for (;;) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        auto now = std::chrono::steady_clock::now();
        double dt = std::chrono::duration<double>(now - prev).count();
        prev = now;
        if (dt > 3.0) dt = 0.0; /* the process was stopped */
        std::lock_guard<std::mutex> lk(watch().mu);
        std::vector<std::pair<worker *, seen>> cur;
        for (worker *w : watch().workers) {
            seen s = { w->switches.load(), w->busy.load(), 0.0 };
            for (auto &p : last)
                if (p.first == w && p.second.switches == s.switches && p.second.L == s.L && s.L)
                    s.stalled = p.second.stalled + dt;
            if (s.L && s.stalled >= limit_s) report_stall(w, s.stalled);
            cur.emplace_back(w, s);
        }
        last.swap(cur);
    }
}

void watch_worker(worker *w)
{
    int limit = cfg().watchdog_s;
    if (!limit) return;
    watch_state &ws = watch();
    std::lock_guard<std::mutex> lk(ws.mu);
    ws.workers.push_back(w);
    if (!ws.started) {
        ws.started = true;
        std::thread(watchdog_main, limit).detach();
    }
}

void unwatch_worker(worker *w)
{
    watch_state &ws = watch();
    std::lock_guard<std::mutex> lk(ws.mu);
    auto it = std::find(ws.workers.begin(), ws.workers.end(), w);
    if (it != ws.workers.end()) ws.workers.erase(it);
}

} // namespace

worker::~worker()
{
    unwatch_worker(this);
    for (thread_rec *t : th) {
        fiber_destroy(&t->f);
        delete t;
    }
    if (ar) arena_destroy(ar);
}

static worker *get_worker()
{
    if (!tl_worker) {
        tl_worker_owner.reset(new worker());
        tl_worker = tl_worker_owner.get();
        fiber_init_native(&tl_worker->native);
        tl_worker->ar = arena_create();
        watch_worker(tl_worker);
    }
    return tl_worker;
}

arena *current_arena()
{
    worker *w = tl_worker;
    if (!w || !w->L || !tl_cur) fail("shared memory used outside a kernel");
    return w->ar;
}

static void ensure_fibers(worker *w, unsigned n)
{
    while (w->th.size() < n) {
        thread_rec *t = new thread_rec();
        t->w = w;
        t->index = (unsigned)w->th.size();
        fiber_create(&t->f, cfg().stack_bytes, t->index, fiber_main, t);
        w->th.push_back(t);
    }
}

/* Nothing is runnable: finish the block (true = done), release a barrier, or abort. */
static bool resolve_stall(worker *w)
{
    unsigned done = 0, at_bar = 0, at_warp = 0;
    for (unsigned i = 0; i < w->n; i++) {
        thread_state s = w->st[i];
        done += s == T_DONE;
        at_bar += s == T_BARRIER;
        at_warp += s == T_WARP;
    }
    if (done == w->n) return true;

    char msg[8192];
    msg[0] = 0;
    if (at_warp) {
        /* A warp op whose named lanes cannot all arrive. */
        for (unsigned wi = 0; wi < 32; wi++) {
            warp_rec *wr = &w->warps[wi];
            for (int k = 0; k < wr->nopen; k++) {
                meeting *m = &wr->m[k];
                appendf(msg, sizeof msg, "\n  warp %u: %s at %s:%d with mask 0x%08x: lanes 0x%08x arrived; ", wi,
                        m->name, m->site.file, m->site.line, m->mask, m->arrived);
                unsigned missing = m->mask & ~m->arrived;
                int shown = 0;
                for (unsigned l = 0; l < 32 && shown < 4; l++) {
                    if (!(missing & (1u << l))) continue;
                    appendf(msg, sizeof msg, "%s", shown++ ? "; " : "");
                    describe_thread(msg, sizeof msg, w, wi * 32 + l);
                }
            }
        }
        fail("deadlock: a warp operation waits for lanes that never arrive%s", msg);
    }
    /* Everyone not exited waits at a barrier. */
    if (done) {
        unsigned waiter = ~0u, gone = ~0u;
        for (unsigned i = 0; i < w->n; i++) {
            if (w->st[i] == T_BARRIER && waiter == ~0u) waiter = i;
            if (w->st[i] == T_DONE && gone == ~0u) gone = i;
        }
        describe_thread(msg, sizeof msg, w, waiter);
        appendf(msg, sizeof msg, " (and %u more), while %u threads have exited, e.g. ", at_bar - 1, done);
        describe_thread(msg, sizeof msg, w, gone);
        fail("barrier divergence: %s", msg);
    }
    bool same = true;
    for (unsigned i = 1; i < w->n && same; i++)
        same = same_site(w->where[i], w->where[0]) && w->wait_kind[i] == w->wait_kind[0];
    if (!same) {
        /* List the distinct call sites with a count and an example thread each. */
        std::vector<unsigned> reps;
        for (unsigned i = 0; i < w->n; i++) {
            bool seen = false;
            for (unsigned r : reps) seen = seen || same_site(w->where[r], w->where[i]);
            if (!seen) reps.push_back(i);
        }
        for (unsigned r : reps) {
            unsigned count = 0;
            for (unsigned i = 0; i < w->n; i++) count += same_site(w->where[r], w->where[i]);
            appendf(msg, sizeof msg, "\n  %u threads at %s:%d, e.g. ", count, w->where[r].file, w->where[r].line);
            describe_thread(msg, sizeof msg, w, r);
        }
        fail("barrier divergence: threads of one block wait at different barriers%s", msg);
    }
    /* Release the barrier: everyone runs again, in a fresh random order. */
    w->bar_result = w->bar_pred;
    w->bar_pred = 0;
    w->bar_arrived = 0;
    w->bar_no++;
    for (unsigned i = 0; i < w->n; i++) w->st[i] = T_RUN;
    queue_permutation(w);
    return false;
}

static void run_block(worker *w, const launch &L, uint64_t bidx)
{
    unsigned bx = L.block.x, by = L.block.y;
    unsigned n = bx * by * L.block.z;
    ensure_fibers(w, n);
    w->L = &L;
    w->bidx = bidx;
    w->n = n;
    w->bid = make_uint3((unsigned)(bidx % L.grid.x), (unsigned)(bidx / L.grid.x % L.grid.y),
                        (unsigned)(bidx / ((uint64_t)L.grid.x * L.grid.y)));
    blockIdx = w->bid;
    blockDim = L.block;
    gridDim = L.grid;
    for (unsigned i = 0; i < n; i++) {
        w->tid[i] = make_uint3(i % bx, i / bx % by, i / (bx * by));
        w->st[i] = T_RUN;
        w->dep_waited[i] = false;
    }
    for (unsigned wi = 0; wi < (n + 31) / 32; wi++) {
        warp_rec *wr = &w->warps[wi];
        unsigned lanes = n - wi * 32 >= 32 ? 32 : n - wi * 32;
        wr->exists = lanes == 32 ? ~0u : (1u << lanes) - 1;
        wr->live = wr->exists;
        wr->nopen = 0;
    }
    w->bar_arrived = w->bar_pred = w->bar_result = 0;
    w->bar_no = 0;
    arena_begin_block(w->ar, L.smem, L.smem_limit);
    queue_permutation(w);
    w->busy.store(&L, std::memory_order_relaxed);
    for (;;) {
        if (w->qhead != w->qtail) {
            thread_rec *t = w->th[w->queue[w->qhead++ & 1023]];
            switch_to(w, &w->native, t);
            continue;
        }
        if (resolve_stall(w)) break;
    }
    w->busy.store(nullptr, std::memory_order_relaxed);
    w->L = nullptr;
    threadIdx = make_uint3(0, 0, 0);
}

/* Grids run so far per kernel name (the launch's name pointer: a string literal per launch
 * site), for tests that count launches (tessera_cuda_emu_grids_run). */
static std::mutex g_runs_mu;
static std::unordered_map<const char *, uint64_t> g_runs;

void run_grid(const launch &L)
{
    {
        std::lock_guard<std::mutex> lk(g_runs_mu);
        g_runs[L.name]++;
    }
    uint64_t nblocks = (uint64_t)L.grid.x * L.grid.y * L.grid.z;
    parallel_for((size_t)nblocks, [&L](size_t i) { run_block(get_worker(), L, i); });
}

/* ---- thread exit ------------------------------------------------------------------------ */

static void thread_exit(thread_rec *t)
{
    worker *w = t->w;
    unsigned lane = t->index & 31;
    warp_rec *wr = &w->warps[t->index / 32];
    unsigned bit = 1u << lane;
    if (w->L->pdl && !w->dep_waited[t->index])
        fail("a thread of a grid launched with programmatic stream serialization (TS_LAUNCH_PDL) exited without "
             "calling cudaGridDependencySynchronize(): on a GPU it may run before the previous kernel on the "
             "stream has finished");
    w->st[t->index] = T_DONE;
    wr->live &= ~bit;
    for (int k = 0; k < wr->nopen; k++) {
        meeting *m = &wr->m[k];
        if (m->mask & bit)
            fail("lane %u exited while lanes 0x%08x wait for it at %s at %s:%d (mask 0x%08x)", lane, m->arrived,
                 m->name, m->site.file, m->site.line, m->mask);
    }
    block_wait(w, t);
}

/* ---- barriers --------------------------------------------------------------------------- */

} // namespace emu

void cudaGridDependencySynchronize(void)
{
    using namespace emu;
    thread_rec *t = current_thread("cudaGridDependencySynchronize()");
    t->w->dep_waited[t->index] = true;
}

int emu_barrier(emu_site site, int kind, int pred)
{
    using namespace emu;
    thread_rec *t = current_thread("__syncthreads()");
    worker *w = t->w;
    w->st[t->index] = T_BARRIER;
    w->where[t->index] = site;
    w->wait_kind[t->index] = kind;
    w->wait_name[t->index] = barrier_name(kind);
    w->bar_arrived++;
    w->bar_pred += pred != 0;
    block_wait(w, t);
    return (int)w->bar_result;
}

/* ---- warp ops --------------------------------------------------------------------------- */

namespace emu {

static uint64_t poison_bits(int size) { return size >= 8 ? ~0ull : (1ull << (8 * size)) - 1; }

/* The last lane of meeting m arrived: compute every lane's result. */
static void complete(warp_rec *wr, const meeting *m)
{
    unsigned mask = m->mask;
    int width = m->width;
    switch (m->kind) {
    case EMU_SHFL_IDX:
    case EMU_SHFL_UP:
    case EMU_SHFL_DOWN:
    case EMU_SHFL_XOR:
        for (unsigned l = 0; l < 32; l++) {
            if (!(mask & (1u << l))) continue;
            unsigned seg = l & ~(unsigned)(width - 1), in = l & (unsigned)(width - 1), src = l;
            unsigned a = (unsigned)wr->arg[l];
            if (m->kind == EMU_SHFL_IDX) src = seg + (a & (unsigned)(width - 1));
            else if (m->kind == EMU_SHFL_UP) src = in >= a ? l - a : l;
            else if (m->kind == EMU_SHFL_DOWN) src = a < 32 && in + a < (unsigned)width ? l + a : l;
            else {
                src = l ^ (a & 31);
                if (src > (seg | (unsigned)(width - 1))) src = l;
            }
            wr->res[l] = (mask & (1u << src)) ? wr->val[src] : poison_bits(m->size);
        }
        break;
    case EMU_VOTE_BALLOT:
    case EMU_VOTE_ANY:
    case EMU_VOTE_ALL: {
        unsigned ballot = 0;
        for (unsigned l = 0; l < 32; l++)
            if ((mask & (1u << l)) && wr->val[l]) ballot |= 1u << l;
        uint64_t r = m->kind == EMU_VOTE_BALLOT ? ballot : m->kind == EMU_VOTE_ANY ? ballot != 0 : ballot == mask;
        for (unsigned l = 0; l < 32; l++)
            if (mask & (1u << l)) wr->res[l] = r;
        break;
    }
    case EMU_SYNCWARP: break;
    case EMU_MATCH_ANY:
    case EMU_MATCH_ALL: {
        bool all_same = true;
        int first = __builtin_ctz(mask);
        for (unsigned l = 0; l < 32; l++)
            if ((mask & (1u << l)) && wr->val[l] != wr->val[first]) all_same = false;
        for (unsigned l = 0; l < 32; l++) {
            if (!(mask & (1u << l))) continue;
            if (m->kind == EMU_MATCH_ALL) {
                wr->res[l] = all_same ? ((1ull << 32) | mask) : 0;
                continue;
            }
            unsigned same = 0;
            for (unsigned k = 0; k < 32; k++)
                if ((mask & (1u << k)) && wr->val[k] == wr->val[l]) same |= 1u << k;
            wr->res[l] = same;
        }
        break;
    }
    case EMU_COLLECTIVE: {
        emu_collective *lanes[32];
        for (unsigned l = 0; l < 32; l++) lanes[l] = (mask & (1u << l)) ? wr->coll[l] : nullptr;
        wr->coll[__builtin_ctz(mask)]->run(lanes);
        break;
    }
    default: { /* reductions over 32-bit values */
        bool is_signed = m->kind == EMU_REDUCE_ADD_S || m->kind == EMU_REDUCE_MIN_S || m->kind == EMU_REDUCE_MAX_S;
        int64_t acc = 0;
        bool first = true;
        for (unsigned l = 0; l < 32; l++) {
            if (!(mask & (1u << l))) continue;
            int64_t v = is_signed ? (int64_t)(int32_t)(uint32_t)wr->val[l] : (int64_t)(uint32_t)wr->val[l];
            if (first) {
                acc = v;
                first = false;
                continue;
            }
            switch (m->kind) {
            case EMU_REDUCE_ADD_U:
            case EMU_REDUCE_ADD_S: acc += v; break;
            case EMU_REDUCE_MIN_U:
            case EMU_REDUCE_MIN_S: acc = v < acc ? v : acc; break;
            case EMU_REDUCE_MAX_U:
            case EMU_REDUCE_MAX_S: acc = v > acc ? v : acc; break;
            case EMU_REDUCE_AND: acc &= v; break;
            case EMU_REDUCE_OR: acc |= v; break;
            case EMU_REDUCE_XOR: acc ^= v; break;
            }
        }
        for (unsigned l = 0; l < 32; l++)
            if (mask & (1u << l)) wr->res[l] = (uint32_t)acc;
        break;
    }
    }
}

/* A warp op that cannot meet (cold: the checks on the fast path only decide that one of
 * these fails). */
[[noreturn]] __attribute__((noinline, cold)) static void warp_op_error(const worker *w, const warp_rec *wr,
                                                                       unsigned lane, unsigned warp, emu_site site,
                                                                       const char *name, int kind, unsigned mask,
                                                                       int size, int width)
{
    if (!(mask & (1u << lane)))
        fail("%s at %s:%d: lane %u calls it with mask 0x%08x, which does not include the lane", name,
             site.file, site.line, lane, mask);
    if (mask & ~wr->exists)
        fail("%s at %s:%d: mask 0x%08x names lanes that do not exist in warp %u (lanes 0x%08x; the block has %u "
             "threads)", name, site.file, site.line, mask, warp, wr->exists, w->n);
    if (mask & ~wr->live)
        fail("%s at %s:%d: mask 0x%08x names lanes 0x%08x that have exited", name, site.file, site.line,
             mask, mask & ~wr->live);
    if (kind <= EMU_SHFL_XOR && (width < 1 || width > 32 || (width & (width - 1))))
        fail("%s at %s:%d: width %d is not a power of two in [1, 32]", name, site.file, site.line, width);
    for (int k = 0; k < wr->nopen; k++) {
        const meeting *o = &wr->m[k];
        if (!(o->mask & mask)) continue;
        if (o->mask != mask)
            fail("%s at %s:%d: lane %u uses mask 0x%08x while lanes 0x%08x wait at %s at %s:%d with mask 0x%08x "
                 "(the masks overlap but differ)", name, site.file, site.line, lane, mask, o->arrived,
                 o->name, o->site.file, o->site.line, o->mask);
        fail("mixed warp operations: lane %u calls %s at %s:%d (%d-byte operand, width %d) while lanes 0x%08x "
             "wait at %s at %s:%d (%d-byte operand, width %d) with mask 0x%08x", lane, name,
             site.file, site.line, size, width, o->arrived, o->name, o->site.file, o->site.line,
             o->size, o->width, mask);
    }
    fail("more than %d warp operations pending in one warp", MAX_MEETINGS);
}

/* The last lane of meeting m arrived (bit: its lane): compute every lane's result, close
 * the meeting and queue the others. Out of line, so the other lanes' arrivals stay short. */
__attribute__((noinline)) static void finish_meeting(worker *w, warp_rec *wr, meeting *m, unsigned warp,
                                                     unsigned bit)
{
    complete(wr, m);
    unsigned others = m->mask & ~bit;
    *m = wr->m[--wr->nopen];
    /* Wake order: the lanes in a random rotation of lane order, either direction (one draw
     * from the block's generator; the full shuffles happen at block start and barriers).
     * Half the time (another draw) they go to the FRONT of the queue, so this warp runs
     * ahead of the others until its next block barrier; otherwise to the back, so warps
     * interleave. Without the run-ahead, warps would advance in lockstep between barriers
     * and a missing __syncthreads between two warps' phases could never show. */
    unsigned lanes[32], nl = 0;
    for (unsigned l = 0; l < 32; l++)
        if (others & (1u << l)) lanes[nl++] = l;
    if (!nl) return;
    uint32_t r = rng_below(w, 4 * nl);
    unsigned start = (r >> 2) % nl;
    bool ahead = r & 2;
    /* k walks the rotation from `start`, up or down (by r & 1); front pushes reverse the
     * order, so for them the walk starts at the rotation's end and goes the other way (no
     * division per lane: this runs for every warp operation) */
    bool up = (r & 1) != ahead;
    unsigned k = start;
    if (ahead) k = (r & 1) ? (start + nl - 1) % nl : (start + 1) % nl;
    for (unsigned i = 0; i < nl; i++) {
        if (ahead) queue_push_front(w, warp * 32 + lanes[k]);
        else queue_push(w, warp * 32 + lanes[k]);
        if (up) k = k + 1 == nl ? 0 : k + 1;
        else k = k == 0 ? nl - 1 : k - 1;
    }
}

} // namespace emu

/* A lane arrives at a warp op: joins the open meeting of its mask (or opens one), then
 * waits, unless it is the last to arrive. This runs once per lane per shuffle, the
 * emulator's hottest path: checks are one combined test, the rest is out of line. */
uint64_t emu_warp_op(emu_site site, int kind, unsigned mask, uint64_t val, int size, int arg, int width,
                     emu_collective *coll)
{
    using namespace emu;
    const char *name = kind == EMU_COLLECTIVE && coll ? coll->what : op_name(kind);
    thread_rec *t = current_thread(name);
    worker *w = t->w;
    unsigned lane = t->index & 31, warp = t->index / 32;
    warp_rec *wr = &w->warps[warp];
    unsigned bit = 1u << lane;

    /* mask must name the lane and only live lanes (live lanes exist); widths are powers of
     * two in [1, 32] */
    if (__builtin_expect(!(mask & bit) || (mask & ~wr->live) ||
                             (kind <= EMU_SHFL_XOR && (width < 1 || width > 32 || (width & (width - 1)))), 0))
        warp_op_error(w, wr, lane, warp, site, name, kind, mask, size, width);

    meeting *m = nullptr;
    for (int k = 0; k < wr->nopen; k++) {
        meeting *o = &wr->m[k];
        if (!(o->mask & mask)) continue;
        if (__builtin_expect(o->mask != mask || o->kind != kind || o->size != size || o->width != width ||
                                 (o->name != name && strcmp(o->name, name) != 0), 0)) /* collectives differ by name only */
            warp_op_error(w, wr, lane, warp, site, name, kind, mask, size, width);
        m = o;
        break;
    }
    if (!m) {
        if (__builtin_expect(wr->nopen == MAX_MEETINGS, 0))
            warp_op_error(w, wr, lane, warp, site, name, kind, mask, size, width);
        m = &wr->m[wr->nopen++];
        m->mask = mask;
        m->arrived = 0;
        m->kind = kind;
        m->size = size;
        m->width = width;
        m->name = name;
        m->site = site;
    }
    wr->val[lane] = val;
    wr->arg[lane] = arg;
    wr->coll[lane] = coll;
    m->arrived |= bit;

    if (m->arrived != m->mask) {
        w->st[t->index] = T_WARP;
        w->where[t->index] = site;
        w->wait_name[t->index] = name;
        block_wait(w, t);
        return wr->res[lane];
    }
    finish_meeting(w, wr, m, warp, bit);
    return wr->res[lane];
}

unsigned emu_active_mask(void)
{
    using namespace emu;
    thread_rec *t = current_thread("__activemask()");
    return t->w->warps[t->index / 32].live;
}

void emu_yield(void)
{
    using namespace emu;
    thread_rec *t = tl_cur;
    if (!t) return;
    queue_push(t->w, t->index);
    block_wait(t->w, t);
}

/* Grids of kernel `name` (as launched: TS_LAUNCH's first argument) run so far, eagerly or in
 * graph replays. Exported by the emulated backend library (exports.map: tessera_cuda_*)
 * for test_cuda_backend, which counts the activation quantizer's launches per step. */
extern "C" uint64_t tessera_cuda_emu_grids_run(const char *name)
{
    std::lock_guard<std::mutex> lk(emu::g_runs_mu);
    uint64_t n = 0;
    for (const auto &e : emu::g_runs)
        if (!strcmp(e.first, name)) n += e.second;
    return n;
}

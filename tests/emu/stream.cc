/* stream.cc — streams, events, host functions and synchronisation.
 *
 * Every stream (the legacy default stream included) is an in-order queue run by its own
 * worker thread, started at the stream's first op: work really is asynchronous to the
 * host, so a host that rewrites a pinned buffer before its async copy ran reads back the
 * wrong data, as on a GPU. Ordering rules, fixed when an op is enqueued:
 *   - ops of one stream run in order;
 *   - an op on the legacy stream (0, cudaStreamLegacy; cudaStreamPerThread maps to it)
 *     waits for everything already enqueued on every blocking stream, and an op on a
 *     blocking stream waits for everything already enqueued on the legacy stream;
 *     cudaStreamNonBlocking streams are exempt;
 *   - cudaStreamWaitEvent waits for the event's latest record at the time of the call.
 * An event record is an op that stamps the event (generation, host time) when it runs.
 *
 * State: one global mutex and condition variable (sched_mutex/sched_cv) over all queues,
 * progress counters, events and captures; the state is heap-allocated once and never freed,
 * because the legacy stream's worker may still be waiting on it while the process exits.
 * While a stream captures (graph.cc), enqueue records ops instead of queueing them.
 */
#include "internal.h"

#include <pthread.h>

#include <new>
#include <thread>

namespace emu {

namespace {

struct sched_state {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<CUstream_st *> streams; /* created streams, not the legacy one */
    std::vector<CUevent_st *> events;
    CUstream_st *legacy;
};

sched_state &S();

/* fork(): the child has none of the worker threads. Hold the lock across the fork so the
 * child's copy is consistent, then let the child start fresh workers on demand (ops still
 * queued run there). Death tests fork a child that launches a bad kernel. */
void fork_prepare() { S().mu.lock(); }
void fork_parent() { S().mu.unlock(); }
void fork_child()
{
    sched_state &s = S();
    new (&s.cv) std::condition_variable(); /* the parent's waiters are gone */
    for (CUstream_st *st : s.streams) {
        st->worker_started = false;
        st->worker = nullptr; /* the parent's thread object; not joinable here */
    }
    s.legacy->worker_started = false;
    s.mu.unlock();
}

sched_state &S()
{
    static sched_state *s = [] {
        sched_state *n = new sched_state();
        n->legacy = new CUstream_st();
        n->legacy->legacy = true;
        pthread_atfork(fork_prepare, fork_parent, fork_child);
        return n;
    }();
    return *s;
}

typedef std::unique_lock<std::mutex> lock_t;

/* Set on stream worker threads: a synchronising call from one (a host function, or the
 * destructor of an object a launch captured by value) would wait for itself. */
thread_local bool tl_on_stream_worker = false;

void refuse_on_worker(const char *what)
{
    if (tl_on_stream_worker)
        fail("%s called on a stream's worker thread, where it would wait for itself: a host function called the "
             "CUDA API (not allowed in CUDA either), or an object captured by value by TS_LAUNCH (an argument like "
             "buf.ptr copies buf) freed device memory in its destructor; pass plain pointers to TS_LAUNCH", what);
}

bool ready(const CUstream_st::pending &p)
{
    for (const auto &a : p.after)
        if (a.first->done < a.second) return false;
    return !p.wait_ev || p.wait_ev->done >= p.wait_gen;
}

void worker_main(CUstream_st *st)
{
    tl_on_stream_worker = true;
    sched_state &s = S();
    lock_t lk(s.mu);
    for (;;) {
        s.cv.wait(lk, [&] { return (!st->q.empty() && ready(st->q.front())) || (st->quit && st->q.empty()); });
        if (st->q.empty()) return;
        CUstream_st::pending p = std::move(st->q.front());
        st->q.pop_front();
        lk.unlock();
        if (p.o.run) p.o.run();
        lk.lock();
        if (p.signal_ev) {
            p.signal_ev->when = std::chrono::steady_clock::now();
            if (p.signal_ev->done < p.signal_gen) p.signal_ev->done = p.signal_gen;
        }
        st->prog->done = p.seq;
        s.cv.notify_all();
    }
}

/* Queues p on st with the implicit legacy-stream dependencies. Lock held. */
uint64_t push_locked(CUstream_st *st, CUstream_st::pending &&p)
{
    sched_state &s = S();
    if (st->legacy) {
        for (CUstream_st *o : s.streams)
            if (!(o->flags & cudaStreamNonBlocking) && o->prog->submitted > o->prog->done)
                p.after.emplace_back(o->prog, o->prog->submitted);
    } else if (!(st->flags & cudaStreamNonBlocking)) {
        const auto &lp = s.legacy->prog;
        if (lp->submitted > lp->done) p.after.emplace_back(lp, lp->submitted);
    }
    p.seq = ++st->prog->submitted;
    uint64_t seq = p.seq;
    st->q.push_back(std::move(p));
    if (!st->worker_started) {
        st->worker_started = true;
        std::thread *t = new std::thread(worker_main, st);
        if (st->legacy) {
            t->detach();
            delete t;
        } else {
            st->worker = t;
        }
    }
    s.cv.notify_all();
    return seq;
}

/* Marks every capture that a synchronising call by this thread would break as
 * invalidated (CUDA's rule: a Global-mode capture binds every thread, a ThreadLocal one
 * only the thread that began it, a Relaxed one none). Lock held. */
bool invalidate_captures_locked(bool global_only)
{
    bool any = false;
    for (CUstream_st *o : S().streams) {
        if (!o->cap || o->cap->invalidated) continue;
        if (global_only && o->cap->mode == cudaStreamCaptureModeRelaxed) continue;
        if (global_only && o->cap->mode == cudaStreamCaptureModeThreadLocal &&
            o->cap->thread != std::this_thread::get_id())
            continue;
        o->cap->invalidated = true;
        any = true;
    }
    return any;
}

void wait_done_locked(lock_t &lk, const std::shared_ptr<progress> &pr, uint64_t target)
{
    S().cv.wait(lk, [&] { return pr->done >= target; });
}

} // namespace

std::mutex &sched_mutex() { return S().mu; }
std::condition_variable &sched_cv() { return S().cv; }

CUstream_st *stream_locked(cudaStream_t s)
{
    sched_state &st = S();
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return st.legacy;
    for (CUstream_st *o : st.streams)
        if (o == s) return o;
    return nullptr;
}

CUevent_st *event_locked(cudaEvent_t e)
{
    for (CUevent_st *o : S().events)
        if (o == e) return o;
    return nullptr;
}

std::vector<CUstream_st *> &streams_locked() { return S().streams; }
std::vector<CUevent_st *> &events_locked() { return S().events; }

cudaError_t enqueue(cudaStream_t s, op o, uint64_t *seq)
{
    lock_t lk(S().mu);
    if (seq) *seq = 0;
    CUstream_st *st = stream_locked(s);
    if (!st) return cudaErrorInvalidResourceHandle;
    if (st->cap) {
        if (st->cap->invalidated) return cudaErrorStreamCaptureInvalidated;
        st->cap->ops.push_back(std::move(o));
        return cudaSuccess;
    }
    if (st->legacy) {
        /* The legacy stream would have to wait for a capturing blocking stream. */
        bool any = false;
        for (CUstream_st *c : S().streams)
            if (c->cap && !(c->flags & cudaStreamNonBlocking) && !c->cap->invalidated) any = true;
        if (any) {
            for (CUstream_st *c : S().streams)
                if (c->cap && !(c->flags & cudaStreamNonBlocking)) c->cap->invalidated = true;
            return cudaErrorStreamCaptureImplicit;
        }
    }
    CUstream_st::pending p;
    p.o = std::move(o);
    uint64_t n = push_locked(st, std::move(p));
    if (seq) *seq = n;
    return cudaSuccess;
}

void wait_op(cudaStream_t s, uint64_t seq)
{
    if (!seq) return;
    refuse_on_worker("a synchronous copy or memset");
    lock_t lk(S().mu);
    CUstream_st *st = stream_locked(s);
    if (st) wait_done_locked(lk, st->prog, seq);
}

void sync_all_streams()
{
    refuse_on_worker("a call that waits for the device (cudaDeviceSynchronize, cudaFree, ...)");
    lock_t lk(S().mu);
    std::vector<std::pair<std::shared_ptr<progress>, uint64_t>> targets;
    targets.emplace_back(S().legacy->prog, S().legacy->prog->submitted);
    for (CUstream_st *o : S().streams) targets.emplace_back(o->prog, o->prog->submitted);
    for (auto &t : targets) wait_done_locked(lk, t.first, t.second);
}

bool stream_capturing(cudaStream_t s)
{
    lock_t lk(S().mu);
    CUstream_st *st = stream_locked(s);
    return st && st->cap;
}

cudaError_t check_sync_allowed(const char *what)
{
    lock_t lk(S().mu);
    if (!invalidate_captures_locked(true)) return cudaSuccess;
    warn("%s while a stream is capturing: not permitted (the capture is invalidated)", what);
    return cudaErrorStreamCaptureUnsupported;
}

} // namespace emu

using namespace emu;

/* ---- streams ---------------------------------------------------------------------------- */

extern "C" cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int priority)
{
    if (!s || (flags & ~cudaStreamNonBlocking)) return set_error(cudaErrorInvalidValue);
    CUstream_st *st = new CUstream_st();
    st->flags = flags;
    st->priority = priority;
    st->device = current_device();
    lock_t lk(sched_mutex());
    streams_locked().push_back(st);
    *s = st;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    return cudaStreamCreateWithPriority(s, flags, 0);
}

extern "C" cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithPriority(s, 0, 0); }

/* Unlike CUDA, waits for the stream's queued work before returning. */
extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    lock_t lk(sched_mutex());
    CUstream_st *st = stream_locked(s);
    if (!st || st->legacy) return set_error(cudaErrorInvalidResourceHandle);
    if (st->cap) st->cap->invalidated = true;
    st->cap = nullptr;
    st->quit = true;
    sched_cv().notify_all();
    std::thread *t = (std::thread *)st->worker;
    lk.unlock();
    if (t) {
        t->join();
        delete t;
    }
    lk.lock();
    auto &v = streams_locked();
    v.erase(std::find(v.begin(), v.end(), st));
    delete st;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned int *flags)
{
    lock_t lk(sched_mutex());
    CUstream_st *st = stream_locked(s);
    if (!st || !flags) return set_error(cudaErrorInvalidValue);
    *flags = st->flags;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamGetPriority(cudaStream_t s, int *priority)
{
    lock_t lk(sched_mutex());
    CUstream_st *st = stream_locked(s);
    if (!st || !priority) return set_error(cudaErrorInvalidValue);
    *priority = st->priority;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    lock_t lk(sched_mutex());
    CUstream_st *st = stream_locked(s);
    if (!st) return set_error(cudaErrorInvalidResourceHandle);
    if (st->cap) {
        st->cap->invalidated = true;
        warn("cudaStreamSynchronize on a capturing stream: not permitted (the capture is invalidated)");
        return set_error(cudaErrorStreamCaptureUnsupported);
    }
    refuse_on_worker("cudaStreamSynchronize");
    wait_done_locked(lk, st->prog, st->prog->submitted);
    return set_error(sticky_error());
}

extern "C" cudaError_t cudaStreamQuery(cudaStream_t s)
{
    lock_t lk(sched_mutex());
    CUstream_st *st = stream_locked(s);
    if (!st) return set_error(cudaErrorInvalidResourceHandle);
    if (st->cap) {
        st->cap->invalidated = true;
        return set_error(cudaErrorStreamCaptureUnsupported);
    }
    return st->prog->done == st->prog->submitted ? cudaSuccess : cudaErrorNotReady;
}

extern "C" cudaError_t cudaDeviceSynchronize(void)
{
    cudaError_t e = check_sync_allowed("cudaDeviceSynchronize");
    if (e != cudaSuccess) return set_error(e);
    sync_all_streams();
    return set_error(sticky_error());
}

extern "C" cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data)
{
    if (!fn) return set_error(cudaErrorInvalidValue);
    return set_error(enqueue(s, op{ [fn, data] { fn(data); }, "host function" }));
}

extern "C" cudaError_t cudaStreamAddCallback(cudaStream_t s, cudaStreamCallback_t cb, void *data, unsigned int flags)
{
    if (!cb || flags) return set_error(cudaErrorInvalidValue);
    return set_error(enqueue(s, op{ [cb, s, data] { cb(s, cudaSuccess, data); }, "stream callback" }));
}

/* ---- events ----------------------------------------------------------------------------- */

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    if (!e) return set_error(cudaErrorInvalidValue);
    CUevent_st *ev = new CUevent_st();
    ev->flags = flags;
    lock_t lk(sched_mutex());
    S().events.push_back(ev);
    *e = ev;
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    lock_t lk(sched_mutex());
    CUevent_st *ev = event_locked(e);
    if (!ev) return set_error(cudaErrorInvalidResourceHandle);
    auto &v = S().events;
    v.erase(std::find(v.begin(), v.end(), ev));
    delete ev; /* ops still waiting on it hold its state */
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int flags)
{
    (void)flags;
    lock_t lk(sched_mutex());
    CUevent_st *ev = event_locked(e);
    CUstream_st *st = stream_locked(s);
    if (!ev || !st) return set_error(cudaErrorInvalidResourceHandle);
    if (st->cap) {
        /* In a capture an event only marks a point other streams can join at. */
        ev->cap = st->cap;
        return cudaSuccess;
    }
    ev->cap = nullptr;
    CUstream_st::pending p;
    p.o.what = "event record";
    p.signal_ev = ev->st;
    p.signal_gen = ++ev->st->recorded;
    push_locked(st, std::move(p));
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { return cudaEventRecordWithFlags(e, s, 0); }

extern "C" cudaError_t cudaEventQuery(cudaEvent_t e)
{
    lock_t lk(sched_mutex());
    CUevent_st *ev = event_locked(e);
    if (!ev) return set_error(cudaErrorInvalidResourceHandle);
    if (ev->cap) return set_error(cudaErrorCapturedEvent);
    return ev->st->done >= ev->st->recorded ? cudaSuccess : cudaErrorNotReady;
}

extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    lock_t lk(sched_mutex());
    CUevent_st *ev = event_locked(e);
    if (!ev) return set_error(cudaErrorInvalidResourceHandle);
    if (ev->cap) return set_error(cudaErrorCapturedEvent);
    refuse_on_worker("cudaEventSynchronize");
    std::shared_ptr<event_state> st = ev->st;
    uint64_t target = st->recorded;
    sched_cv().wait(lk, [&] { return st->done >= target; });
    return set_error(sticky_error());
}

/* Host wall-clock milliseconds between the moments the two records ran. */
extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    lock_t lk(sched_mutex());
    CUevent_st *a = event_locked(start), *b = event_locked(end);
    if (!ms || !a || !b) return set_error(a && b ? cudaErrorInvalidValue : cudaErrorInvalidResourceHandle);
    if ((a->flags | b->flags) & cudaEventDisableTiming) return set_error(cudaErrorInvalidResourceHandle);
    if (!a->st->recorded || !b->st->recorded) return set_error(cudaErrorInvalidResourceHandle);
    if (a->st->done < a->st->recorded || b->st->done < b->st->recorded) return set_error(cudaErrorNotReady);
    *ms = std::chrono::duration<float, std::milli>(b->st->when - a->st->when).count();
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    (void)flags;
    lock_t lk(sched_mutex());
    CUevent_st *ev = event_locked(e);
    CUstream_st *st = stream_locked(s);
    if (!ev || !st) return set_error(cudaErrorInvalidResourceHandle);
    if (ev->cap) {
        if (st->cap == ev->cap) return cudaSuccess;
        if (st->cap) return set_error(cudaErrorStreamCaptureMerge);
        if (st->legacy) return set_error(cudaErrorStreamCaptureImplicit);
        st->cap = ev->cap; /* the stream joins the capture (fork) */
        return cudaSuccess;
    }
    if (st->cap) {
        st->cap->invalidated = true;
        warn("cudaStreamWaitEvent: a capturing stream cannot wait for an event recorded outside the capture");
        return set_error(cudaErrorStreamCaptureIsolation);
    }
    if (!ev->st->recorded) return cudaSuccess;
    CUstream_st::pending p;
    p.o.what = "event wait";
    p.wait_ev = ev->st;
    p.wait_gen = ev->st->recorded;
    push_locked(st, std::move(p));
    return cudaSuccess;
}

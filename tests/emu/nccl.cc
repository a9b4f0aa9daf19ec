/* nccl.cc — the NCCL subset on the CPU: all-reduce and broadcast between the emulated
 * devices of this process, in stream order, with results identical on every rank.
 *
 * A clique is the communicators one ncclCommInitAll made, one rank per device. A collective
 * is validated at the call (the comm, type, op, root, the stream's device, the buffers
 * against the live allocations: any of these wrong returns ncclInvalidArgument and prints
 * why), then becomes one op on the caller's stream — recorded instead when the stream
 * captures, so every graph replay takes part again. Inside ncclGroupStart/ncclGroupEnd
 * (nestable, per host thread) the validated calls are kept and enqueued at the outermost
 * ncclGroupEnd, so one host thread may drive every rank; one host thread per rank without
 * groups works too.
 *
 * Rendezvous, when the op runs on its stream's worker thread: each comm counts the
 * collectives it has executed, and the k-th of every rank form round k of the clique (by
 * execution, not enqueue, so graph replays pair up). The ranks must agree on kind, count,
 * type, op and root; a mismatch is a programming error and aborts. The last rank to arrive
 * computes the result into the round's own buffer, then each rank copies it into its
 * recvbuff: every input is read only after all ranks have arrived and every output written
 * only after the result is complete, so in-place buffers are safe. Reductions run in rank
 * order 0..n-1 — fp16, bf16 and fp32 accumulate in float and are rounded once at the end,
 * fp64 in double, integers in their own type (wrapping) — and Avg is the sum divided by n,
 * so every rank gets the same bits (a GPU's NCCL picks its own order: compare with a
 * tolerance there). A rank that waits longer than TESSERA_EMU_WATCHDOG_S (0 = forever) for
 * its peers aborts, naming the ranks that never arrived.
 *
 * Choices where NCCL leaves room or the emulator differs:
 *   - count 0 is validated, then nothing is enqueued on any rank (all ranks see count 0,
 *     so their execution counters stay in step);
 *   - ncclCommDestroy waits until the comm's queued collectives have run, then frees the
 *     handle; a graph that replays a collective of a destroyed comm aborts, naming it;
 *   - ncclCommAbort does not wait: it marks the whole clique aborted — queued and waiting
 *     collectives of every rank finish without touching their buffers, and the other ranks'
 *     ncclCommGetAsyncError reports ncclRemoteError — then frees the handle;
 *   - the legacy stream (0, cudaStreamLegacy, cudaStreamPerThread) is refused: the emulator
 *     has one for all devices, and ranks queued on one stream would wait for each other;
 *   - ncclGetLastError returns the calling host thread's last error message.
 *
 * State: the set of live comm handles (refuses stale ones); per clique a mutex, condition
 * variable, the rounds in progress and the aborted flag; per comm (shared by its handle and
 * its ops) the execution counter, the count of queued ops and the destroyed flag, under its
 * clique's mutex; per host thread the group depth, the deferred calls and the last error.
 */
#include "internal.h"

#include <nccl.h>

#include <map>
#include <set>
#include <string>

namespace emu {

namespace {

typedef std::unique_lock<std::mutex> lock_t;

enum coll_kind { COLL_ALL_REDUCE, COLL_BROADCAST };

/* One rank's call: what every rank of a round must agree on, and its buffers. */
struct coll {
    coll_kind kind;
    size_t count;
    ncclDataType_t dtype;
    ncclRedOp_t op; /* all-reduce */
    int root;       /* broadcast */
    const void *send;
    void *recv;
};

/* The k-th collective of a clique while its ranks meet. */
struct rendezvous {
    coll first;                     /* the first arriver's call, which the others must match */
    int first_rank = -1;
    std::vector<const void *> send; /* [rank] */
    std::vector<bool> here;         /* [rank] arrived */
    std::vector<char> result;       /* count elements of the type, once done */
    int arrived = 0, left = 0;
    bool done = false;
};

struct clique {
    int n;
    std::vector<int> devices; /* [rank] */
    std::mutex mu;
    std::condition_variable cv;
    std::map<uint64_t, rendezvous> rounds; /* by collective number */
    bool aborted = false;
};

/* A comm's state, shared by its handle and every op that uses it (so a replay after
 * ncclCommDestroy finds `destroyed`, not freed memory). Fields under the clique's mutex. */
struct comm_state {
    std::shared_ptr<clique> q;
    int rank;
    const void *handle;    /* the ncclComm_t, for messages */
    uint64_t executed = 0; /* collectives run so far */
    int queued = 0;        /* ops in a stream queue (not graph replays) not yet finished */
    bool destroyed = false;
};

/* A validated call, kept until the outermost ncclGroupEnd or enqueued at once. */
struct deferred {
    std::shared_ptr<comm_state> c;
    coll a;
    cudaStream_t stream;
    const char *api;
};

thread_local int tl_group_depth = 0;
thread_local std::vector<deferred> tl_group;
thread_local std::string tl_last_error; /* on the heap: the TLS block stays small (emu.h) */

} // namespace

} // namespace emu

struct ncclComm {
    std::shared_ptr<emu::comm_state> st;
};

namespace emu {

namespace {

/* The live handles; heap-allocated once and never freed (ops may run while the process exits). */
std::mutex &live_mu()
{
    static std::mutex *m = new std::mutex();
    return *m;
}

std::set<ncclComm *> &live()
{
    static std::set<ncclComm *> *s = new std::set<ncclComm *>();
    return *s;
}

std::shared_ptr<comm_state> find_comm(ncclComm_t comm)
{
    std::lock_guard<std::mutex> lk(live_mu());
    if (!comm || !live().count(comm)) return nullptr;
    return comm->st;
}

/* Records "tessera-emu: ..." as the thread's last NCCL error, prints it, returns r. */
ncclResult_t refuse(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t refuse(ncclResult_t r, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tl_last_error = msg;
    warn("%s", msg);
    return r;
}

size_t dtype_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

const char *dtype_name(ncclDataType_t t)
{
    static const char *const names[] = { "ncclInt8",    "ncclUint8",   "ncclInt32",   "ncclUint32", "ncclInt64",
                                         "ncclUint64",  "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16" };
    return (unsigned)t <= ncclBfloat16 ? names[t] : "an unsupported ncclDataType_t";
}

const char *op_name(ncclRedOp_t op)
{
    static const char *const names[] = { "ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg" };
    return (unsigned)op < ncclNumOps ? names[op] : "an unsupported ncclRedOp_t";
}

const char *kind_name(coll_kind k) { return k == COLL_ALL_REDUCE ? "ncclAllReduce" : "ncclBroadcast"; }

std::string describe(const coll &a)
{
    char buf[160];
    if (a.kind == COLL_ALL_REDUCE)
        snprintf(buf, sizeof buf, "ncclAllReduce(count %zu, %s, %s)", a.count, dtype_name(a.dtype), op_name(a.op));
    else
        snprintf(buf, sizeof buf, "ncclBroadcast(count %zu, %s, root %d)", a.count, dtype_name(a.dtype), a.root);
    return buf;
}

bool same_call(const coll &a, const coll &b)
{
    if (a.kind != b.kind || a.count != b.count || a.dtype != b.dtype) return false;
    return a.kind == COLL_ALL_REDUCE ? a.op == b.op : a.root == b.root;
}

/* ---- reductions ------------------------------------------------------------------------- */

/* a + b and a * b; integers wrap (through the unsigned type: signed overflow is undefined). */
template <typename A> A add(A a, A b)
{
    if constexpr (std::is_integral<A>::value) {
        typedef typename std::make_unsigned<A>::type U;
        return (A)(U)((U)a + (U)b);
    } else {
        return a + b;
    }
}

template <typename A> A mul(A a, A b)
{
    if constexpr (std::is_integral<A>::value) {
        typedef typename std::make_unsigned<A>::type U;
        return (A)(U)((U)a * (U)b);
    } else {
        return a * b;
    }
}

/* out[i] = op over ranks 0..n-1 of in[r][i], accumulated in A in rank order; T is the
 * element type, load/store convert between T and A. */
template <typename T, typename A, typename Load, typename Store>
void reduce(const std::vector<const void *> &in, void *out, size_t count, ncclRedOp_t op, Load load, Store store)
{
    const int n = (int)in.size();
    std::vector<A> acc(count);
    const T *x0 = (const T *)in[0];
    for (size_t i = 0; i < count; i++) acc[i] = load(x0[i]);
    for (int r = 1; r < n; r++) {
        const T *x = (const T *)in[r];
        for (size_t i = 0; i < count; i++) {
            A v = load(x[i]);
            switch (op) {
            case ncclSum: case ncclAvg: acc[i] = add(acc[i], v); break;
            case ncclProd: acc[i] = mul(acc[i], v); break;
            case ncclMax: acc[i] = v > acc[i] ? v : acc[i]; break;
            default: acc[i] = v < acc[i] ? v : acc[i]; break; /* ncclMin */
            }
        }
    }
    T *o = (T *)out;
    for (size_t i = 0; i < count; i++) o[i] = store(op == ncclAvg ? (A)(acc[i] / (A)n) : acc[i]);
}

template <typename T> void reduce_plain(const std::vector<const void *> &in, void *out, size_t count, ncclRedOp_t op)
{
    reduce<T, T>(in, out, count, op, [](T v) { return v; }, [](T v) { return v; });
}

/* Fills R.result: root's sendbuff for a broadcast, the reduction for an all-reduce. Runs
 * once per round, when every rank has arrived (so no rank's stream writes its inputs). */
void compute(rendezvous &R)
{
    const coll &a = R.first;
    R.result.resize(a.count * dtype_size(a.dtype));
    if (a.kind == COLL_BROADCAST) {
        memcpy(R.result.data(), R.send[(size_t)a.root], R.result.size());
        return;
    }
    void *out = R.result.data();
    switch (a.dtype) {
    case ncclInt8: reduce_plain<int8_t>(R.send, out, a.count, a.op); break;
    case ncclUint8: reduce_plain<uint8_t>(R.send, out, a.count, a.op); break;
    case ncclInt32: reduce_plain<int32_t>(R.send, out, a.count, a.op); break;
    case ncclUint32: reduce_plain<uint32_t>(R.send, out, a.count, a.op); break;
    case ncclInt64: reduce_plain<int64_t>(R.send, out, a.count, a.op); break;
    case ncclUint64: reduce_plain<uint64_t>(R.send, out, a.count, a.op); break;
    case ncclFloat32: reduce_plain<float>(R.send, out, a.count, a.op); break;
    case ncclFloat64: reduce_plain<double>(R.send, out, a.count, a.op); break;
    case ncclFloat16:
        reduce<__half, float>(R.send, out, a.count, a.op, [](__half v) { return __half2float(v); },
                              [](float v) { return __float2half_rn(v); });
        break;
    case ncclBfloat16:
        reduce<__nv_bfloat16, float>(R.send, out, a.count, a.op, [](__nv_bfloat16 v) { return __bfloat162float(v); },
                                     [](float v) { return __float2bfloat16_rn(v); });
        break;
    default: fail("ncclAllReduce: %s reached the reduction", dtype_name(a.dtype));
    }
}

/* ---- running a collective (on the stream's worker) ------------------------------------- */

/* Waits for the round's result; aborts past the watchdog naming the ranks not there. */
void wait_for_peers(lock_t &lk, clique &q, rendezvous &R, const comm_state &c, uint64_t k, const coll &a)
{
    auto ready = [&] { return R.done || q.aborted; };
    const int wd = cfg().watchdog_s;
    if (wd <= 0) {
        q.cv.wait(lk, ready);
        return;
    }
    if (q.cv.wait_for(lk, std::chrono::seconds(wd), ready)) return;
    std::string missing;
    for (int r = 0; r < q.n; r++)
        if (!R.here[(size_t)r]) missing += (missing.empty() ? "rank " : ", rank ") + std::to_string(r);
    fail("%s: rank %d of %d (communicator %p, device %d) waited %d s (TESSERA_EMU_WATCHDOG_S) in collective #%llu: "
         "%s never arrived (it never issued its collective #%llu, or its stream is blocked: a rank that waits on "
         "another, or a group left open)",
         describe(a).c_str(), c.rank, q.n, c.handle, q.devices[(size_t)c.rank], wd, (unsigned long long)k,
         missing.c_str(), (unsigned long long)k);
}

void run_coll(const std::shared_ptr<comm_state> &c, const coll &a)
{
    clique &q = *c->q;
    const size_t bytes = a.count * dtype_size(a.dtype);
    /* A graph replay may find a buffer freed since the capture: on a GPU that faults. */
    char label[224];
    snprintf(label, sizeof label, "%s on rank %d", describe(a).c_str(), c->rank);
    bool reads = a.kind == COLL_ALL_REDUCE || a.root == c->rank;
    if ((reads && !check_device_span(a.send, bytes, false, label)) || !check_device_span(a.recv, bytes, false, label))
        fail("%s: reading or writing the buffer would fault on a GPU", label);

    lock_t lk(q.mu);
    if (q.aborted) return;
    if (c->destroyed)
        fail("%s: its communicator was destroyed (ncclCommDestroy) before this collective ran: a graph replayed it "
             "afterwards", label);
    const uint64_t k = c->executed++;
    rendezvous &R = q.rounds[k];
    if (R.arrived == 0) {
        R.first = a;
        R.first_rank = c->rank;
        R.send.assign((size_t)q.n, nullptr);
        R.here.assign((size_t)q.n, false);
    } else if (!same_call(R.first, a)) {
        fail("collective #%llu of a clique of %d: rank %d called %s but rank %d called %s (every rank must make "
             "the same collective calls in the same order)",
             (unsigned long long)k, q.n, R.first_rank, describe(R.first).c_str(), c->rank, describe(a).c_str());
    }
    R.send[(size_t)c->rank] = a.send;
    R.here[(size_t)c->rank] = true;
    if (++R.arrived == q.n) {
        compute(R);
        R.done = true;
        q.cv.notify_all();
    } else {
        wait_for_peers(lk, q, R, *c, k, a);
        if (!R.done) return; /* aborted */
    }
    lk.unlock();
    memcpy(a.recv, R.result.data(), bytes); /* R stays until every rank has left */
    lk.lock();
    if (++R.left == q.n) q.rounds.erase(k);
}

/* Enqueues a validated call on its stream (or records it into the stream's capture). */
ncclResult_t submit(const deferred &d)
{
    /* Queued ops count for ncclCommDestroy; a captured one runs at each replay instead. */
    const bool counted = !stream_capturing(d.stream);
    std::shared_ptr<comm_state> c = d.c;
    clique &q = *c->q;
    if (counted) {
        lock_t lk(q.mu);
        c->queued++;
    }
    coll a = d.a;
    cudaError_t e = enqueue(d.stream, op{ [c, a, counted] {
                                             run_coll(c, a);
                                             if (counted) {
                                                 lock_t lk(c->q->mu);
                                                 c->queued--;
                                                 c->q->cv.notify_all();
                                             }
                                         },
                                          d.api });
    if (e == cudaSuccess) return ncclSuccess;
    if (counted) {
        lock_t lk(q.mu);
        c->queued--;
        q.cv.notify_all();
    }
    set_error(e);
    return refuse(ncclUnhandledCudaError, "%s on rank %d: the stream refused it: %s", d.api, c->rank,
                  cudaGetErrorString(e));
}

/* Validates one rank's call, then enqueues it or, inside a group, keeps it. */
ncclResult_t collective(coll a, ncclComm_t comm, cudaStream_t stream)
{
    const char *api = kind_name(a.kind);
    std::shared_ptr<comm_state> c = find_comm(comm);
    if (!c) return refuse(ncclInvalidArgument, "%s: %p is not a live communicator", api, (void *)comm);
    const clique &q = *c->q;
    const int device = q.devices[(size_t)c->rank];
    if ((unsigned)a.dtype > ncclBfloat16)
        return refuse(ncclInvalidArgument, "%s: data type %d is not supported", api, (int)a.dtype);
    if (a.kind == COLL_ALL_REDUCE && (unsigned)a.op >= ncclNumOps)
        return refuse(ncclInvalidArgument, "%s: reduction op %d is not supported", api, (int)a.op);
    if (a.kind == COLL_BROADCAST && (a.root < 0 || a.root >= q.n))
        return refuse(ncclInvalidArgument, "%s: root %d is not a rank of this clique of %d", api, a.root, q.n);
    int stream_device;
    bool legacy;
    {
        lock_t lk(sched_mutex());
        CUstream_st *st = stream_locked(stream);
        if (!st) return refuse(ncclInvalidArgument, "%s: %p is not a live stream", api, (void *)stream);
        stream_device = st->device;
        legacy = st->legacy;
    }
    if (legacy)
        return refuse(ncclInvalidArgument, "%s: the legacy stream (0 or cudaStreamPerThread) is one stream for every "
                      "emulated device, where ranks would wait for each other; use a created stream", api);
    if (stream_device != device)
        return refuse(ncclInvalidArgument, "%s: rank %d's communicator is on device %d but the stream was created on "
                      "device %d", api, c->rank, device, stream_device);
    if (a.count == 0) return ncclSuccess; /* no op on any rank: see the top of the file */
    const size_t esize = dtype_size(a.dtype);
    if (a.count > SIZE_MAX / esize) return refuse(ncclInvalidArgument, "%s: count %zu overflows", api, a.count);
    char label[224];
    snprintf(label, sizeof label, "%s on rank %d", describe(a).c_str(), c->rank);
    bool reads = a.kind == COLL_ALL_REDUCE || a.root == c->rank; /* NCCL ignores a non-root's sendbuff */
    if (reads && !check_device_span(a.send, a.count * esize, false, label))
        return refuse(ncclInvalidArgument, "%s: sendbuff %p is not %zu bytes of device memory", label, a.send,
                      a.count * esize);
    if (!check_device_span(a.recv, a.count * esize, false, label))
        return refuse(ncclInvalidArgument, "%s: recvbuff %p is not %zu bytes of device memory", label, a.recv,
                      a.count * esize);
    if (!reads) a.send = nullptr;
    deferred d{ c, a, stream, api };
    if (tl_group_depth > 0) {
        tl_group.push_back(d);
        return ncclSuccess;
    }
    return submit(d);
}

} // namespace

} // namespace emu

using namespace emu;

extern "C" {

ncclResult_t ncclGetVersion(int *version)
{
    if (!version) return refuse(ncclInvalidArgument, "ncclGetVersion: null pointer");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
    if (!comm) return refuse(ncclInvalidArgument, "ncclCommInitAll: null comm array");
    if (ndev < 1) return refuse(ncclInvalidArgument, "ncclCommInitAll: ndev %d", ndev);
    std::vector<int> devices((size_t)ndev);
    for (int i = 0; i < ndev; i++) {
        int d = devlist ? devlist[i] : i;
        if (d < 0 || d >= cfg().devices)
            return refuse(ncclInvalidArgument, "ncclCommInitAll: device %d (rank %d) does not exist "
                          "(TESSERA_EMU_DEVICES=%d)", d, i, cfg().devices);
        for (int j = 0; j < i; j++)
            if (devices[(size_t)j] == d)
                return refuse(ncclInvalidUsage, "ncclCommInitAll: device %d is both rank %d and rank %d (duplicate "
                              "GPU)", d, j, i);
        devices[(size_t)i] = d;
    }
    auto q = std::make_shared<clique>();
    q->n = ndev;
    q->devices = devices;
    std::lock_guard<std::mutex> lk(live_mu());
    for (int i = 0; i < ndev; i++) {
        ncclComm *h = new ncclComm();
        h->st = std::make_shared<comm_state>();
        h->st->q = q;
        h->st->rank = i;
        h->st->handle = h;
        live().insert(h);
        comm[i] = h;
    }
    return ncclSuccess;
}

/* Waits for the comm's queued collectives (its peers must issue theirs, or the watchdog
 * aborts), then frees the handle. Any host thread but a stream worker (a host function),
 * which would wait for itself. */
ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    std::shared_ptr<comm_state> c = find_comm(comm);
    if (!c) return refuse(ncclInvalidArgument, "ncclCommDestroy: %p is not a live communicator", (void *)comm);
    {
        lock_t lk(c->q->mu);
        c->q->cv.wait(lk, [&] { return c->queued == 0; });
        c->destroyed = true;
    }
    {
        std::lock_guard<std::mutex> lk(live_mu());
        live().erase(comm);
    }
    delete comm;
    return ncclSuccess;
}

/* Aborts the whole clique (see the top of the file) and frees the handle at once. */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    std::shared_ptr<comm_state> c = find_comm(comm);
    if (!c) return refuse(ncclInvalidArgument, "ncclCommAbort: %p is not a live communicator", (void *)comm);
    {
        lock_t lk(c->q->mu);
        c->q->aborted = true;
        c->destroyed = true;
        c->q->cv.notify_all();
    }
    {
        std::lock_guard<std::mutex> lk(live_mu());
        live().erase(comm);
    }
    delete comm;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return tl_last_error.c_str();
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    std::shared_ptr<comm_state> c = find_comm(comm);
    if (!c || !asyncError) return refuse(ncclInvalidArgument, "ncclCommGetAsyncError: bad communicator or pointer");
    lock_t lk(c->q->mu);
    *asyncError = c->q->aborted ? ncclRemoteError : ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    std::shared_ptr<comm_state> c = find_comm(comm);
    if (!c || !count) return refuse(ncclInvalidArgument, "ncclCommCount: bad communicator or pointer");
    *count = c->q->n;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    std::shared_ptr<comm_state> c = find_comm(comm);
    if (!c || !device) return refuse(ncclInvalidArgument, "ncclCommCuDevice: bad communicator or pointer");
    *device = c->q->devices[(size_t)c->rank];
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    std::shared_ptr<comm_state> c = find_comm(comm);
    if (!c || !rank) return refuse(ncclInvalidArgument, "ncclCommUserRank: bad communicator or pointer");
    *rank = c->rank;
    return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream)
{
    return collective(coll{ COLL_BROADCAST, count, datatype, ncclSum, root, sendbuff, recvbuff }, comm, stream);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return collective(coll{ COLL_ALL_REDUCE, count, datatype, op, 0, sendbuff, recvbuff }, comm, stream);
}

ncclResult_t ncclGroupStart(void)
{
    tl_group_depth++;
    return ncclSuccess;
}

/* The outermost end enqueues the kept calls in call order and returns the first error; the
 * calls after a failed one are still enqueued (their ranks then wait for the failed rank and
 * abort at the watchdog, naming it). */
ncclResult_t ncclGroupEnd(void)
{
    if (tl_group_depth == 0) return refuse(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--tl_group_depth > 0) return ncclSuccess;
    std::vector<deferred> calls;
    calls.swap(tl_group);
    ncclResult_t first = ncclSuccess;
    for (const deferred &d : calls) {
        ncclResult_t r = submit(d);
        if (first == ncclSuccess) first = r;
    }
    return first;
}

} /* extern "C" */

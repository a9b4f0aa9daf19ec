/* graph.cc — stream capture and CUDA graphs.
 *
 * While a stream captures, enqueue (stream.cc) appends each op — kernel launch, async copy
 * or memset, host function, cuBLAS call — to the capture instead of running it. A stream
 * that waits on an event recorded in the capture joins it, and its ops are appended too,
 * so the recorded order is a valid serialisation of the captured work. The graph is that
 * list; cudaGraphLaunch enqueues one op that runs the list in order on the launch stream.
 * Kernel arguments were captured by value when recorded, so a replay reads the buffers'
 * current contents, as on a GPU.
 *
 * Synchronising calls during a capture (cudaStreamSynchronize on the capturing stream,
 * cudaDeviceSynchronize, synchronous copies, cudaMalloc in global mode, work on the legacy
 * stream) return cudaErrorStreamCaptureUnsupported / ...Implicit and invalidate the capture;
 * cudaStreamEndCapture then returns cudaErrorStreamCaptureInvalidated and no graph.
 */
#include "internal.h"

using namespace emu;

typedef std::unique_lock<std::mutex> lock_t;

static thread_local cudaStreamCaptureMode tl_capture_mode = cudaStreamCaptureModeGlobal;

extern "C" cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode)
{
    static unsigned long long next_id = 1;
    lock_t lk(sched_mutex());
    CUstream_st *st = stream_locked(s);
    if (!st) return set_error(cudaErrorInvalidResourceHandle);
    if (st->legacy) return set_error(cudaErrorStreamCaptureUnsupported);
    if (st->cap) return set_error(cudaErrorIllegalState);
    capture *c = new capture();
    c->mode = mode;
    c->thread = std::this_thread::get_id();
    c->origin = s;
    c->id = next_id++;
    st->cap = c;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    if (!graph) return set_error(cudaErrorInvalidValue);
    lock_t lk(sched_mutex());
    CUstream_st *st = stream_locked(s);
    if (!st) return set_error(cudaErrorInvalidResourceHandle);
    capture *c = st->cap;
    if (!c) return set_error(cudaErrorIllegalState);
    if (c->origin != s) return set_error(cudaErrorStreamCaptureUnmatched);
    for (CUstream_st *o : streams_locked())
        if (o->cap == c) o->cap = nullptr;
    for (CUevent_st *e : events_locked())
        if (e->cap == c) e->cap = nullptr;
    *graph = nullptr;
    if (c->invalidated) {
        delete c;
        return set_error(cudaErrorStreamCaptureInvalidated);
    }
    CUgraph_st *g = new CUgraph_st();
    g->ops = std::move(c->ops);
    delete c;
    *graph = g;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status)
{
    if (!status) return set_error(cudaErrorInvalidValue);
    lock_t lk(sched_mutex());
    CUstream_st *st = stream_locked(s);
    if (!st) return set_error(cudaErrorInvalidResourceHandle);
    *status = !st->cap ? cudaStreamCaptureStatusNone
              : st->cap->invalidated ? cudaStreamCaptureStatusInvalidated
                                     : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

extern "C" cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode *mode)
{
    if (!mode) return set_error(cudaErrorInvalidValue);
    cudaStreamCaptureMode old = tl_capture_mode;
    tl_capture_mode = *mode;
    *mode = old;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphCreate(cudaGraph_t *graph, unsigned int flags)
{
    if (!graph || flags) return set_error(cudaErrorInvalidValue);
    *graph = new CUgraph_st();
    return cudaSuccess;
}

/* Only the count: nodes must be null (the emulator's graphs are a list, not real nodes). */
extern "C" cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *num_nodes)
{
    if (!graph || !num_nodes || nodes) return set_error(cudaErrorInvalidValue);
    *num_nodes = graph->ops.size();
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t graph,
                                                     unsigned long long flags)
{
    (void)flags;
    if (!exec || !graph) return set_error(cudaErrorInvalidValue);
    CUgraphExec_st *x = new CUgraphExec_st();
    x->ops = std::make_shared<const std::vector<op>>(graph->ops);
    *exec = x;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    return cudaGraphInstantiateWithFlags(exec, graph, flags);
}

extern "C" cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    if (!exec) return set_error(cudaErrorInvalidValue);
    std::shared_ptr<const std::vector<op>> ops = exec->ops;
    return set_error(enqueue(s, op{ [ops] {
                                       for (const op &o : *ops) o.run();
                                   },
                                    "graph launch" }));
}

extern "C" cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t s)
{
    (void)s;
    return exec ? cudaSuccess : set_error(cudaErrorInvalidValue);
}

extern "C" cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    delete exec; /* launches still queued hold the op list */
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    delete graph;
    return cudaSuccess;
}

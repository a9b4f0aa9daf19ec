/* cuda_backend.h — the CUDA backend's private state, shared by the .cu files of src/backend/cuda/ only
 * (the engine sees struct backend_ops; design in docs/cuda-backend.md).
 *
 * The engine's backend is one struct cu_group: `world` GPUs (tensor parallelism, group.cu),
 * each a struct cuda_backend (a rank). Rank r holds heads [r*H/world, (r+1)*H/world) of every
 * attention layer (their Q/K/V rows, their O columns, their KV cache) and the same share of
 * the MLP (gate/up rows, down columns); after the O and down projections the ranks' partial
 * outputs are summed with an NCCL all-reduce. Embedding, norms and the residual stream are
 * replicated; rank 0 alone computes the LM head and samples, then broadcasts the sampled
 * tokens so every rank has the next step's lag tokens. world 1 is the single-GPU backend,
 * with no NCCL and no worker thread.
 *
 * One struct cuda_backend per GPU, used by one host thread at a time. It owns:
 *   - the weights in device memory (struct cu_weights), uploaded once at create;
 *   - the paged KV cache, one pool per layer (struct kv_layer views of device memory);
 *   - every buffer a step needs, sized once for the largest step (max_num_batched_tokens
 *     rows, max_num_seqs logits rows) — nothing is allocated per step;
 *   - one pinned staging buffer for a step's packed inputs (one H2D copy; room for a token
 *     mask on every logits row) and one for the sampled tokens (one D2H copy);
 *   - the CUDA graphs of decode-only steps, one per batch-size bucket.
 * Invariants: at most one step in flight (submit, wait, submit, ...); the fixed device
 * input buffers (token ids, positions, slots, query starts, sequence lengths, block
 * tables, logits rows) never move, because the graphs baked their addresses in; after any
 * CUDA error the backend is `broken` and refuses further steps.
 */
#ifndef TESSERA_BACKEND_CUDA_BACKEND_H
#define TESSERA_BACKEND_CUDA_BACKEND_H

#include <cuda_runtime_api.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "backend/backend_impl.h"
#include "kernels/sampling.h"
#include "model/model.h"
#include "util/kv_dtype.h"
#include "util/tensor.h"
}

struct cublasContext;

/* One linear layer on the device: y[t][col + o] = sum_i W[o][i] x[t][i], o < n_out. */
/* The kernels a linear can run on (linear.cu): chosen per row count at start-up. F16/BF16:
 * cuBLAS, our GEMV or skinny GEMM; *_PDL: the same kernel launched with programmatic stream
 * serialization (sm_90+). Quantized, 1..QMM_GEMV_MAX_TOKENS rows: the quantized GEMV with
 * its weights loaded straight into registers (QMM_DIRECT, Q4_K only) or through shared
 * memory (QMM_STAGED, every other type's one way). */
enum cu_linear_kernel {
    CU_LK_CUBLAS = 0, CU_LK_GEMV, CU_LK_SKINNY, CU_LK_GEMV_PDL, CU_LK_SKINNY_PDL,
    CU_LK_QMM_DIRECT, CU_LK_QMM_STAGED, CU_LK_COUNT
};
#define CU_TUNED_TOKENS 16 /* row counts with a measured choice; more rows: cuBLAS */

/* The decode batch buckets (1, 2, 4, then multiples of 8: cu_bucket_ceil) that keep their
 * own decode attention layout (cuda_backend.decode_rows): up to CU_DECODE_MAX_ROWS rows;
 * larger batches share the last bucket's. */
#define CU_DECODE_MAX_ROWS 512
#define CU_DECODE_SLOTS (3 + CU_DECODE_MAX_ROWS / 8)

struct cu_linear {
    enum dtype type; /* a GGUF quant type (cuda_quant_matmul) or F16 / BF16 (linear.cu's choice) */
    const void *w;   /* device [n_out][dtype_row_bytes(type, n_in)] */
    int64_t n_in, n_out;
    int64_t col;     /* first output column (q, k, v of different types share the QKV rows) */
    uint8_t kern[CU_TUNED_TOKENS + 1]; /* enum cu_linear_kernel for T rows at [T] */
};

struct cu_layer {
    float *attn_norm, *ffn_norm; /* [dim] F32 */
    float *qkv_bias;             /* [(n_heads + 2 n_kv_heads) head_dim] F32, NULL without bias */
    float *q_norm, *k_norm;      /* [head_dim] F32, NULL without q/k norm */
    struct cu_linear qkv[3];     /* rows q | k | v fused into qkv[0] when their types match */
    int n_qkv;
    struct cu_linear o;
    struct cu_linear gate_up[2]; /* gate | up fused into gate_up[0] when their types match */
    int n_gate_up;
    struct cu_linear down;
};

struct cu_weights {
    enum dtype embd_type;        /* token embedding as stored (F32 tables become BF16) */
    const void *embd;            /* device [vocab][dim] */
    struct cu_linear output;     /* LM head; its w is embd when the embeddings are tied */
    float *output_norm;          /* [dim] F32 */
    float *inv_freq;             /* [head_dim / 2] RoPE inverse frequencies (rope_inv_freq) */
    struct cu_layer *layers;     /* [n_layers] (host array of device pointers) */
    enum dtype act;              /* activation dtype of the linear inputs: F16 / BF16 when every
                                    linear is stored so (cuBLAS reads them directly), else F32
                                    (the quantized kernels quantize F32 themselves; a dense
                                    linear then converts into bufs.cast first) */
    bool any_dense_cast;         /* act == F32 and some linear is F16/BF16: bufs.cast needed */
    size_t bytes;                /* device bytes of all weights */
};

/* Device buffers of one step, sized for Tmax rows / Lmax logits rows / Smax sequences. */
struct cu_bufs {
    float *x;          /* [Tmax][dim] residual stream */
    float *delta;      /* [Tmax][dim] O-projection / down-projection output */
    void *act;         /* [Tmax][act_width] normed rows, attention output, SiLU·mul output */
    void *cast;        /* [Tmax][act_width] 16-bit copy for dense linears of an F32-act model */
    float *qkv;        /* [Tmax][qkv_dim] fused QKV output */
    float *q;          /* [Tmax][n_heads * head_dim] rotated queries */
    float *gu;         /* [Tmax][2 ffn] fused gate|up output */
    float *xl, *dl;    /* [Lmax][dim] residual and last delta of the logits rows */
    void *xln;         /* [Lmax][dim] final-normed logits rows (act dtype) */
    float *logits;     /* [Lmax][vocab] */
    void *qmm_ws;      /* cuda_quant_matmul workspace */
    size_t qmm_ws_bytes;
    void *qact;        /* a norm's or SiLU·mul's output quantized for the quantized GEMVs after
                          it, up to QMM_GEMV_MAX_TOKENS rows of act_width (forward.cu,
                          act_qact); NULL in a model without quantized linears */
    void *att_ws;      /* cuda_attention_decode workspace */
    size_t att_ws_bytes;
    void *cublas_ws;   /* cublasSetWorkspace (graph capture needs one) */
    size_t cublas_ws_bytes;
    /* the fixed step inputs the forward reads (written by cuda_step_unpack) */
    int32_t *token_ids, *positions;  /* [Tmax] */
    int64_t *slots;                  /* [Tmax] */
    int32_t *query_start;            /* [Smax + 1] */
    int32_t *seq_lens;               /* [Smax] */
    int32_t *block_tables;           /* [Smax][max_blocks] */
    int32_t *logits_idx;             /* [Lmax] */
    struct sampling_output *samples; /* [Lmax] sampled tokens (the next step's lag tokens) */
    unsigned char *staging;          /* [staging_bytes] device copy of the packed inputs */
};

/* Section offsets of one step's packed inputs (host staging = device staging). */
struct cu_layout {
    size_t tok, pos, slot, qs, lens, bt_start, bt_ids, li, params, pen_start, pen_ids, pen_info, bias_start,
        bias_ids, bias_vals, mask_row, masks, total;
    size_t npen, nbias; /* penalty-history and logit-bias entries */
    size_t nmask;       /* token masks (rows with backend_sample.mask) */
};

/* The shape of one forward: T rows over S sequences, L logits rows; decode = every
 * sequence has exactly one row (the decode attention kernel, max_seq_len bounding the
 * contexts and the grid). */
struct cu_shape {
    int T, S, L;
    bool decode;
    int max_seq_len;
    int partition, max_partitions; /* the decode attention's split (cu_decode_split) */
    int head_rows;                 /* its query heads per thread block (cu_decode_split) */
    /* a mixed step's leading one-row sequences (rows 0 .. lead-1), whose attention goes
     * through the decode kernel (split as a decode step of lead rows, their longest
     * context lead_max_len); the rest through the prefill kernel. 0: all through it. */
    int lead, lead_max_len;
};

struct cu_graph {
    int batch;             /* decode rows it was captured for */
    cudaGraphExec_t exec;
};

/* NCCL, loaded at run time (nccl.cu) only when world > 1: a single-GPU build and
 * deployment need no NCCL. Its stable C ABI is declared here (enums as int), so building
 * needs no nccl.h; under the emulator the emulator's NCCL stands in. */
typedef struct ncclComm *cu_nccl_comm;
#define CU_NCCL_UINT8 1   /* ncclUint8 */
#define CU_NCCL_FLOAT32 7 /* ncclFloat32 */
#define CU_NCCL_SUM 0     /* ncclSum */
struct cu_nccl {
    void *lib; /* dlopen handle (NULL under the emulator) */
    int (*comm_init_all)(cu_nccl_comm *comms, int ndev, const int *devlist);
    int (*comm_destroy)(cu_nccl_comm comm);
    int (*comm_abort)(cu_nccl_comm comm);
    int (*all_reduce)(const void *send, void *recv, size_t count, int dtype, int op, cu_nccl_comm comm,
                      cudaStream_t stream);
    int (*broadcast)(const void *send, void *recv, size_t count, int dtype, int root, cu_nccl_comm comm,
                     cudaStream_t stream);
    const char *(*error_string)(int result);
    int (*get_version)(int *version);
};

struct cuda_backend {
    const struct model *m;          /* borrowed */
    struct backend_config cfg;      /* validated copy */
    struct backend_info info;       /* what create decided */
    int device;
    int rank, world;                /* tensor-parallel position (0, 1 on one GPU) */
    int nh, nkv;                    /* this rank's query and KV heads (n_heads / world; n_kv_heads /
                                       world, or 1 when world exceeds n_kv_heads) */
    int kv0;                        /* this rank's first KV head: rank * nkv, or with fewer KV
                                       heads than GPUs the one its query heads share (each KV
                                       head replicated on world / n_kv_heads GPUs, as vLLM) */
    int64_t ffn;                    /* this rank's MLP width (ffn_dim / world) */
    cu_nccl_comm comm;              /* world > 1: this rank's communicator (owned by the group) */
    const struct cu_nccl *nccl;     /* world > 1: the group's NCCL entry points */
    const unsigned char *h_src;     /* the packed step inputs to copy: rank 0's h_staging (pinned,
                                       portable), so one pack serves every rank */
    size_t free0, total;            /* device memory free at start, and in all (create) */
    size_t free_w;                  /* free after the weights (create) */
    size_t graph_reserve;           /* bytes held back for the decode graphs (create) */
    void *kv_scratch;               /* the profiling step's one-block KV pool (create) */
    int fit_blocks;                 /* KV blocks this rank's budget holds (create) */
    char fit_msg[768];              /* why not even one max_model_len sequence fits, or "" */
    cudaStream_t stream;
    bool pdl;                       /* the forward's kernels are programmatic dependent launches
                                       (sm_90+ unless TESSERA_CUDA_PDL=off; create) */
    bool fuse;                      /* fused kernels where the plan allows (cu_gate_up_fused;
                                       unless TESSERA_CUDA_FUSE=off; create) */
    bool split_fixed;               /* TESSERA_CUDA_DECODE_SPLIT=fixed (cu_decode_split; create) */
    bool mixed_split;               /* a mixed step's leading one-row sequences through the decode
                                       attention (cu_shape.lead; unless
                                       TESSERA_CUDA_MIXED_SPLIT=off; create) */
    bool qmm_direct;                /* Q4_K GEMV weights loaded straight into registers (unless
                                       TESSERA_CUDA_QUANT_LOADS=staged; create) where not
                                       measured (qmm_tune) */
    bool qmm_tune;                  /* TESSERA_CUDA_QUANT_LOADS=tune: the Q4_K GEMV's loads
                                       measured per matrix shape and row count (linear.cu) */
    bool decode_rows_tune;          /* TESSERA_CUDA_DECODE_ROWS=tune: decode_rows measured per
                                       batch bucket (attention_plan.cu; create) */
    int8_t decode_rows[CU_DECODE_SLOTS]; /* the decode attention's head_rows per batch bucket
                                       (cu_decode_slot): 16, 8 or 0 (auto), set by
                                       TESSERA_CUDA_DECODE_ROWS or measured (attention_plan.cu) */
    bool l2_prefetch;               /* decode steps of up to CU_TUNED_TOKENS rows prefetch the next
                                       linear's weights into the L2 from the norms and RoPE
                                       (forward.cu, l2_next; sm_90+ unless
                                       TESSERA_CUDA_L2_PREFETCH=off; create) */
    uint64_t l2_window;             /* bytes prefetched per window at most: half the L2 (create) */
    int num_sms;                    /* the device's multiprocessors (create) */
    struct cublasContext *cublas;
    cudaEvent_t ev_done;            /* end of the step in flight (no timing) */
    cudaEvent_t ev_start[2], ev_end[2]; /* step boundaries, alternating, for the idle figure */

    struct cu_weights w;
    struct kv_layer *kv;            /* [n_layers] device pools */
    int Tmax, Smax, Lmax;           /* rows, sequences, logits rows per step */
    int max_blocks;                 /* block-table row length: ceil(max_model_len / block_size) */
    size_t pen_cap;                 /* penalty-history entries the staging holds */
    size_t act_width;               /* max(dim, n_heads * head_dim, ffn) */
    struct cu_bufs d;
    size_t staging_bytes;
    unsigned char *h_staging;       /* pinned [staging_bytes] */
    struct sampling_output *h_samples; /* pinned [Lmax] */
    int32_t *h_bias_ids;            /* [Lmax * SAMPLER_MAX_LOGIT_BIAS] scratch for the packing */
    float *h_bias_vals;
    int32_t *h_bias_start;          /* [Lmax + 1] */
    float *h_logits;                /* [Lmax][vocab] for backend_logits, allocated on first use */

    /* device allocations, freed in reverse order */
    void **allocs;
    int n_allocs, cap_allocs;

    struct cu_graph *graphs;        /* ascending batch */
    int n_graphs;

    /* step state */
    bool in_flight;
    int cur_logits;                 /* logits rows of the step in flight */
    int prev_logits;                /* sampled rows of the previous step (lag tokens) */
    long step_no;
    bool broken;                    /* a CUDA error happened: every later call fails */
    char broken_msg[384];
    /* the shape of the last forward enqueued (a graph's bucket shape for a replay), which
     * tessera_cuda_profile_forward runs again over the inputs still in the buffers */
    struct cu_shape last_shape;
    bool has_last_shape;
    /* tessera_cuda_profile_forward: while prof_ev is set, cu_forward records prof_ev[i]
     * after its i-th kernel and names it in prof_name[i] (prof_cap of each) */
    cudaEvent_t *prof_ev;
    const char **prof_name;
    int prof_n, prof_cap;
    /* GPU time between steps (ev_end of one step to ev_start of the next) */
    int parity;
    bool timed_prev;
    double busy_ms, idle_ms;
    long timed_steps;
};

/* The engine's backend: `world` ranks (tensor parallelism). world > 1: one worker thread
 * per rank runs the rank's part of every call, so each rank's CUDA and NCCL calls come
 * from its own thread (NCCL's rule for one thread per GPU without group calls). */
#define CU_MAX_RANKS 8
struct cu_workers;
struct cu_group {
    int world;
    struct cuda_backend *ranks[CU_MAX_RANKS];
    struct cu_workers *workers;     /* the worker threads when world > 1 (group.cu) */
    struct cu_nccl nccl;
    cu_nccl_comm comms[CU_MAX_RANKS];
    bool aborted;                   /* the communicators were aborted after a rank failed */
};

/* A rank's part of a group call: 0 or an ERR_* code with the detail in err. */
typedef int (*cu_rank_fn)(struct cuda_backend *b, void *arg, char *err, size_t errlen);

/* ---- group.cu ------------------------------------------------------------------------- */

/* Runs fn(rank, arg) on every rank at once (world 1: inline on the caller's thread, with
 * its current device set) and waits for all. Returns the first failing rank's code and
 * message (prefixed "GPU r" when world > 1). When a rank fails, the communicators are
 * aborted so no other rank waits forever for a collective. */
int cu_group_run(struct cu_group *g, cu_rank_fn fn, void *arg, char *err, size_t errlen);

/* Starts the worker threads and NCCL communicators of g (world > 1). */
int cu_group_start(struct cu_group *g, char *err, size_t errlen);

/* Stops the workers and destroys the communicators (safe on a half-started group). */
void cu_group_stop(struct cu_group *g);

/* In-place sum of n floats over the ranks on b's stream (world 1: nothing). */
int cu_all_reduce(struct cuda_backend *b, float *x, size_t n);

/* ---- nccl.cu -------------------------------------------------------------------------- */

/* Fills n with NCCL's entry points (libnccl.so.2, or the emulator's). */
int cu_nccl_open(struct cu_nccl *n, char *err, size_t errlen);
void cu_nccl_close(struct cu_nccl *n);

/* ---- create.cu ------------------------------------------------------------------------ */

/* cudaMalloc of bytes (what names it in errors), recorded for cu_free_all. ERR_NOMEM with
 * the size, the name, what is free and the CUDA error string when it fails. */
int cu_alloc(struct cuda_backend *b, void **out, size_t bytes, const char *what, char *err, size_t errlen);

/* The start-up measurements' timing (linear.cu, attention_plan.cu): call(b, 0, ctx) once as
 * a warm-up, then call(b, i, ctx) for i = 1..reps back to back on b->stream between events
 * e0 and e1; the mean time of one of those calls (ms), or a negative value when a call or
 * an event fails. */
float cu_time_calls(struct cuda_backend *b, int reps, int (*call)(struct cuda_backend *b, int i, void *ctx), void *ctx,
                    cudaEvent_t e0, cudaEvent_t e1);

/* Formats "what: CUDA error string" into err and returns ERR_NOMEM for an allocation
 * failure, ERR_IO otherwise. Marks the backend broken when `fatal`. */
int cu_error(struct cuda_backend *b, bool fatal, int cuda_err, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* ---- weights.cu ----------------------------------------------------------------------- */

/* Uploads m's weights (fusing Q/K/V and gate/up rows when types match, converting F32
 * matrices to BF16) and picks the activation dtype. */
int cu_weights_load(struct cuda_backend *b, char *err, size_t errlen);

/* ---- linear.cu ------------------------------------------------------------------------ */

/* y[t * ldy + L->col + o] = x[t] . W[o] for T rows on b->stream. x: the step's activation
 * rows (b->w.act; F32 for quantized weights, converted into bufs.cast for a dense matrix of
 * an F32-act model). Quantized: cuda_quant_matmul, or with xq (x already quantized, as
 * cuda_quantize_act lays it out for T <= QMM_GEMV_MAX_TOKENS rows: the norm's qact) the
 * GEMV on it alone; F16/BF16: the kernel L->kern[T] names (xq unused). */
int cu_linear_forward(struct cuda_backend *b, const struct cu_linear *L, const void *x, const void *xq, float *y,
                      int64_t ldy, int T);

/* Whether L's weights are GGUF-quantized (cuda_quant_matmul), not F16/BF16. */
static inline bool cu_linear_quantized(const struct cu_linear *L) { return L->type != DT_F16 && L->type != DT_BF16; }

/* Whether layer cl's gate/up projection for T rows runs as one kernel with its SiLU·mul
 * (cuda_dense_gemv_silu / cuda_skinny_gemm_silu): b->fuse, one dense gate | up matrix, and
 * our GEMV or skinny GEMM chosen for T rows (not cuBLAS). The fused kernel streams the
 * same weights as the chosen one and saves the SiLU·mul launch and the gate/up rows' round
 * trip through memory, bit for bit the same act. */
bool cu_gate_up_fused(const struct cuda_backend *b, const struct cu_layer *cl, const void *x, int T);

/* act[t][j] = silu(gate) * up of layer cl's gate/up projection of x, T rows, in b->w.act
 * (act must not be x); only where cu_gate_up_fused. */
int cu_gate_up_silu(struct cuda_backend *b, const struct cu_layer *cl, const void *x, void *act, int T);

/* Chooses the kernel of every F16/BF16 linear for 1..16 rows (TESSERA_CUDA_LINEAR: tune =
 * time the candidates on this GPU, the default; fixed; cublas) and the weight loads of
 * every Q4_K linear's GEMV for 1..8 rows (TESSERA_CUDA_QUANT_LOADS: tune, the default on a
 * GPU; direct; staged), after the weights and step buffers exist and before anything is
 * captured. Logs the choices. */
int cu_linear_plan(struct cuda_backend *b, char *err, size_t errlen);

/* ---- forward.cu ----------------------------------------------------------------------- */

/* Enqueues the forward on b->stream, reading the fixed step inputs (b->d) and writing
 * b->d.logits[0, L). Returns 0 or a CUDA error with *where naming the kernel and layer
 * (a static string plus the layer index in *layer). Captured as is into the graphs. */
int cu_forward(struct cuda_backend *b, const struct cu_shape *sh, const char **where, int *layer);

/* The smallest canonical decode batch bucket (vLLM's: 1, 2, 4, then multiples of 8) of at
 * least rows rows (create.cu's graph buckets; cu_decode_split). */
static inline int cu_bucket_ceil(int rows) { return rows <= 2 ? rows : rows <= 4 ? 4 : (rows + 7) / 8 * 8; }

/* The index in cuda_backend.decode_rows of the bucket of `rows` decode rows (1 -> 0, 2 -> 1,
 * 3..4 -> 2, 5..8 -> 3, 9..16 -> 4, ...; past CU_DECODE_MAX_ROWS: the last). */
static inline int cu_decode_slot(int rows)
{
    const int v = cu_bucket_ceil(rows < 1 ? 1 : rows > CU_DECODE_MAX_ROWS ? CU_DECODE_MAX_ROWS : rows);
    return v <= 2 ? v - 1 : v == 4 ? 2 : 2 + v / 8;
}

/* The shape a decode graph of `rows` rows is captured with (create.cu's capture; submit
 * records it as the last step's shape when it replays the graph). */
struct cu_shape cu_decode_graph_shape(const struct cuda_backend *b, int rows);

/* The decode attention's plan for a decode step of `rows` rows (or a mixed step's `rows`
 * leading one-row sequences) into sh: head_rows, the layout of the rows' bucket
 * (b->decode_rows), and the split for it (cu_decode_split_for). */
void cu_decode_split(const struct cuda_backend *b, int rows, struct cu_shape *sh);

/* The decode attention's split (kernels/attention_decode.h: partition_size,
 * max_partitions) for a decode step of `rows` rows in blocks of head_rows query heads:
 * partitions of 64 positions (longer
 * when a long context meets the cap), as many per sequence as fill one wave of resident thread blocks at the rows' batch
 * bucket (1, 2, 4, then multiples of 8), so a graph and an eager step of the same bucket
 * split every context alike and their tokens are equal. TESSERA_CUDA_DECODE_SPLIT=fixed:
 * the earlier rule, partitions of 512 / 1024 / 2048 positions for up to 8 / 64 / more
 * rows, as many as the context needs. */
void cu_decode_split_for(const struct cuda_backend *b, int rows, int head_rows, int *partition, int *max_partitions);

/* ---- attention_plan.cu ---------------------------------------------------------------- */

/* The decode attention's layout per batch bucket (b->decode_rows): with b->decode_rows_tune,
 * both layouts timed on this GPU over the KV cache, else left as TESSERA_CUDA_DECODE_ROWS
 * set them. After the KV cache exists, before the graphs are captured; logs the choice.
 * A cu_rank_fn (arg unused). */
int cu_decode_plan(struct cuda_backend *b, void *arg, char *err, size_t errlen);

/* ---- submit.cu ------------------------------------------------------------------------ */

/* Bytes of the staging buffer for the limits in b (Tmax, Smax, Lmax, max_blocks, pen_cap). */
size_t cu_staging_capacity(const struct cuda_backend *b);

/* The smallest captured graph bucket holding `rows` decode rows, or NULL. */
const struct cu_graph *cu_graph_for(const struct cuda_backend *b, int rows);

/* The backend_ops entry points; impl is the struct cu_group. */
int cu_submit(void *impl, const struct batch *batch, const struct backend_sample *samples, char *err,
              size_t errlen);
int cu_wait(void *impl, struct backend_token *out, char *err, size_t errlen);
int cu_logits(void *impl, const struct batch *batch, const float **logits, char *err, size_t errlen);

#endif

/* backend.c — the one backend interface (backend.h): configuration defaults and checks,
 * the choice of implementation, and the step protocol every implementation relies on.
 *
 * Owns struct backend: the implementation's ops + state, what create decided (info), and
 * the step state machine: IDLE --submit--> IN_FLIGHT --wait--> IDLE. At most one step is
 * in flight; a BACKEND_TOKEN_PREV(k) row must name a logits row of the step waited for
 * last. A step that fails (an error other than ERR_INVALID for a bad batch) marks the
 * backend broken: every later call fails with ERR_UNAVAILABLE, so a device fault can
 * never be half-ignored by a caller.
 *
 * CUDA: the implementation lives in libtessera-cuda.so (cuda_lib.c), which stays loaded
 * for the life of the backend. CUDA_VISIBLE_DEVICES is honoured by the CUDA runtime
 * itself. --device auto tries CUDA and falls back to the CPU, saying why in
 * info.fallback and in a log line.
 */
#include "backend/backend.h"
#include "backend/backend_impl.h"
#include "backend/cuda_lib.h"
#include "model/model.h"
#include "util/err.h"
#include "util/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct backend {
    const struct backend_ops *ops;
    void *impl;
    struct backend_info info;
    struct backend_config cfg;    /* validated, defaulted */
    struct cuda_lib lib;          /* loaded when the CUDA implementation is used */
    bool in_flight;
    bool broken;
    int in_flight_logits;         /* num_logits of the step in flight */
    int prev_logits;              /* num_logits of the step waited for last (-1: none) */
    char broken_msg[ERR_BUF];
};

int backend_device_parse(const char *s, enum backend_device *out)
{
    if (!s) return ERR_INVALID;
    if (!strcmp(s, "auto")) *out = BACKEND_DEVICE_AUTO;
    else if (!strcmp(s, "cpu")) *out = BACKEND_DEVICE_CPU;
    else if (!strcmp(s, "cuda")) *out = BACKEND_DEVICE_CUDA;
    else return ERR_INVALID;
    return 0;
}

const char *backend_device_name(enum backend_device d)
{
    switch (d) {
    case BACKEND_DEVICE_AUTO: return "auto";
    case BACKEND_DEVICE_CPU: return "cpu";
    case BACKEND_DEVICE_CUDA: return "cuda";
    }
    return "unknown";
}

void backend_config_default(struct backend_config *c)
{
    *c = (struct backend_config){
        .device = BACKEND_DEVICE_AUTO,
        .tensor_parallel_size = 1,
        .max_num_seqs = 256,
        .max_num_batched_tokens = 2048,
        .max_model_len = 0,
        .block_size = KV_DEFAULT_BLOCK_SIZE,
        .kv_dtype_auto = true,
        .kv_dtype = KV_F16,
        .num_blocks = 0,
        .cpu_kv_bytes = (size_t)1 << 30,
        .gpu_memory_utilization = 0.9,
        .n_threads = 0,
        .enforce_eager = false,
    };
}

/* Checks cfg against m and fills the defaults into *c. */
static int config_check(const struct model *m, const struct backend_config *cfg, struct backend_config *c,
                        char *err, size_t errlen)
{
    *c = *cfg;
    if (c->device != BACKEND_DEVICE_AUTO && c->device != BACKEND_DEVICE_CPU && c->device != BACKEND_DEVICE_CUDA)
        return err_set(err, errlen, ERR_INVALID, "backend: unknown device %d", (int)c->device);
    if (c->tensor_parallel_size <= 0) c->tensor_parallel_size = 1;
    if (c->tensor_parallel_size > 1 && c->device == BACKEND_DEVICE_CPU)
        return err_set(err, errlen, ERR_UNSUPPORTED,
                       "backend: --tensor-parallel-size %d splits the model over GPUs; the CPU backend runs on one "
                       "machine's cores (use --threads)", c->tensor_parallel_size);
    if (c->block_size <= 0) c->block_size = KV_DEFAULT_BLOCK_SIZE;
    if (c->block_size > 4096)
        return err_set(err, errlen, ERR_RANGE, "backend: block_size %d is over 4096", c->block_size);
    if (c->max_model_len <= 0) c->max_model_len = m->cfg.max_seq_len;
    if (c->max_model_len > m->cfg.max_seq_len)
        return err_set(err, errlen, ERR_RANGE, "backend: max_model_len %d exceeds the model's context length %d",
                       c->max_model_len, m->cfg.max_seq_len);
    if (c->max_num_seqs <= 0 || c->max_num_batched_tokens <= 0)
        return err_set(err, errlen, ERR_INVALID, "backend: max_num_seqs (%d) and max_num_batched_tokens (%d) "
                       "must be > 0", c->max_num_seqs, c->max_num_batched_tokens);
    if (c->num_blocks < 0) return err_set(err, errlen, ERR_INVALID, "backend: num_blocks %d < 0", c->num_blocks);
    if (!(c->gpu_memory_utilization > 0.0 && c->gpu_memory_utilization <= 1.0))
        return err_set(err, errlen, ERR_RANGE, "backend: gpu_memory_utilization %g must be in (0, 1]",
                       c->gpu_memory_utilization);
    if (!c->kv_dtype_auto && !kv_dtype_size(c->kv_dtype))
        return err_set(err, errlen, ERR_INVALID, "backend: unknown KV cache dtype %d", (int)c->kv_dtype);
    if (c->cpu_kv_bytes == 0) c->cpu_kv_bytes = (size_t)1 << 30;
    return 0;
}

/* Loads libtessera-cuda.so and creates the CUDA implementation into b. */
static int create_cuda(struct backend *b, const struct model *m, char *err, size_t errlen)
{
    int rc = cuda_lib_open(&b->lib, err, errlen);
    if (rc) return rc;
    char why[ERR_BUF] = "";
    int n = b->lib.device_count(why, sizeof why);
    if (n <= 0) {
        rc = err_set(err, errlen, ERR_UNSUPPORTED, "no usable CUDA device (%s)", n < 0 ? why : "0 devices");
        goto fail;
    }
    if (b->cfg.device_index < 0 || b->cfg.device_index >= n) {
        rc = err_set(err, errlen, ERR_RANGE, "CUDA device %d does not exist (%d visible)", b->cfg.device_index, n);
        goto fail;
    }
    if (b->cfg.device_index + b->cfg.tensor_parallel_size > n) {
        rc = err_set(err, errlen, ERR_RANGE, "--tensor-parallel-size %d needs %d GPUs, %d visible (CUDA_VISIBLE_DEVICES)",
                     b->cfg.tensor_parallel_size, b->cfg.device_index + b->cfg.tensor_parallel_size, n);
        goto fail;
    }
    rc = b->lib.create(m, &b->cfg, &b->ops, &b->impl, &b->info, err, errlen);
    if (rc) goto fail;
    return 0;
fail:
    cuda_lib_close(&b->lib);
    b->ops = NULL;
    b->impl = NULL;
    return rc;
}

int backend_create(struct backend **out, const struct model *m, const struct backend_config *cfg, char *err,
                   size_t errlen)
{
    *out = NULL;
    struct backend *b = calloc(1, sizeof *b);
    if (!b) return err_set(err, errlen, ERR_NOMEM, "backend: out of memory");
    int rc = config_check(m, cfg, &b->cfg, err, errlen);
    if (rc) goto fail;
    b->prev_logits = -1;
    char why[ERR_BUF] = "";
    if (b->cfg.device != BACKEND_DEVICE_CPU) {
        memset(&b->info, 0, sizeof b->info);
        rc = create_cuda(b, m, why, sizeof why);
        /* several GPUs asked for: never quietly one CPU instead */
        if (rc && (b->cfg.device == BACKEND_DEVICE_CUDA || b->cfg.tensor_parallel_size > 1)) {
            err_set(err, errlen, rc, "--device %s: %s", backend_device_name(b->cfg.device), why);
            goto fail;
        }
    }
    if (!b->ops) { /* the CPU: asked for, or the fallback of auto */
        memset(&b->info, 0, sizeof b->info);
        rc = backend_cpu_create(m, &b->cfg, &b->ops, &b->impl, &b->info, err, errlen);
        if (rc) goto fail;
        if (b->cfg.device == BACKEND_DEVICE_AUTO) {
            snprintf(b->info.fallback, sizeof b->info.fallback, "%.*s", (int)sizeof b->info.fallback - 1, why);
            LOG_INFO("backend", "device auto: using the CPU (%s)", why);
        }
    }
    if (b->info.block_size <= 0) b->info.block_size = b->cfg.block_size;
    if (b->info.max_concurrency <= 0 && b->cfg.max_model_len > 0)
        b->info.max_concurrency = (int)((int64_t)b->info.num_blocks * b->info.block_size / b->cfg.max_model_len);
    *out = b;
    return 0;
fail:
    backend_free(b);
    return rc;
}

void backend_free(struct backend *b)
{
    if (!b) return;
    if (b->ops && b->impl) {
        if (b->in_flight) { /* a caller that gives up mid-step: let the step finish first */
            struct backend_token *tmp = calloc((size_t)(b->in_flight_logits > 0 ? b->in_flight_logits : 1),
                                               sizeof *tmp);
            if (tmp) b->ops->wait(b->impl, tmp, NULL, 0);
            free(tmp);
        }
        b->ops->destroy(b->impl);
    }
    if (b->lib.handle) cuda_lib_close(&b->lib);
    free(b);
}

const struct backend_info *backend_get_info(const struct backend *b) { return &b->info; }

/* Checks what every implementation relies on; 0 or ERR_INVALID with nothing computed. */
static int batch_check(const struct backend *b, const struct batch *batch, const struct backend_sample *samples,
                       bool sampling, char *err, size_t errlen)
{
    const struct backend_config *c = &b->cfg;
    if (!batch || batch->num_tokens <= 0 || batch->num_seqs <= 0)
        return err_set(err, errlen, ERR_INVALID, "backend: empty batch");
    if (batch->num_tokens > c->max_num_batched_tokens)
        return err_set(err, errlen, ERR_INVALID, "backend: %d rows, at most %d (max_num_batched_tokens)",
                       batch->num_tokens, c->max_num_batched_tokens);
    if (batch->num_logits < 0 || batch->num_logits > c->max_num_seqs || batch->num_seqs > c->max_num_seqs)
        return err_set(err, errlen, ERR_INVALID, "backend: %d sequences / %d logits rows, at most %d (max_num_seqs)",
                       batch->num_seqs, batch->num_logits, c->max_num_seqs);
    if (batch->num_logits > batch->num_tokens) /* a row's logits once (scoring rows: distinct rows) */
        return err_set(err, errlen, ERR_INVALID, "backend: %d logits rows for %d rows", batch->num_logits,
                       batch->num_tokens);
    if (sampling && batch->num_logits > 0 && !samples)
        return err_set(err, errlen, ERR_INVALID, "backend: %d logits rows and no sampling parameters",
                       batch->num_logits);
    for (int i = 0; sampling && i < batch->num_logits; i++)
        if (!samples[i].sampler || samples[i].n_logprobs < -1 || samples[i].n_logprobs > SAMPLER_MAX_TOP_LOGPROBS)
            return err_set(err, errlen, ERR_INVALID, "backend: logits row %d: no sampler or n_logprobs %d", i,
                           samples[i].n_logprobs);
    for (int r = 0; r < batch->num_tokens; r++) {
        int32_t t = batch->token_ids[r];
        if (t >= 0) continue;
        int k = -1 - t;
        if (!sampling || k >= b->prev_logits)
            return err_set(err, errlen, ERR_INVALID,
                           "backend: row %d names logits row %d of the previous step, which had %d", r, k,
                           sampling ? b->prev_logits : 0);
    }
    return 0;
}

/* Refuses every call on a broken backend. */
static int check_usable(const struct backend *b, char *err, size_t errlen)
{
    if (b->broken) return err_set(err, errlen, ERR_UNAVAILABLE, "backend failed earlier: %s", b->broken_msg);
    return 0;
}

static int mark_broken(struct backend *b, int rc, const char *err)
{
    b->broken = true;
    snprintf(b->broken_msg, sizeof b->broken_msg, "%s", err ? err : err_name(rc));
    return rc;
}

int backend_submit(struct backend *b, const struct batch *batch, const struct backend_sample *samples, char *err,
                   size_t errlen)
{
    int rc = check_usable(b, err, errlen);
    if (rc) return rc;
    if (b->in_flight) return err_set(err, errlen, ERR_BUSY, "backend: a step is already in flight");
    if ((rc = batch_check(b, batch, samples, true, err, errlen))) return rc;
    char why[ERR_BUF] = "";
    rc = b->ops->submit(b->impl, batch, samples, why, sizeof why);
    if (rc) {
        err_set(err, errlen, rc, "%s", why);
        return rc == ERR_INVALID ? rc : mark_broken(b, rc, why);
    }
    b->in_flight = true;
    b->in_flight_logits = batch->num_logits;
    return 0;
}

int backend_wait(struct backend *b, struct backend_token *out, char *err, size_t errlen)
{
    int rc = check_usable(b, err, errlen);
    if (rc) return rc;
    if (!b->in_flight) return err_set(err, errlen, ERR_INVALID, "backend: no step in flight");
    char why[ERR_BUF] = "";
    rc = b->ops->wait(b->impl, out, why, sizeof why);
    b->in_flight = false;
    if (rc) {
        err_set(err, errlen, rc, "%s", why);
        return mark_broken(b, rc, why);
    }
    b->prev_logits = b->in_flight_logits;
    return 0;
}

int backend_step(struct backend *b, const struct batch *batch, const struct backend_sample *samples,
                 struct backend_token *out, char *err, size_t errlen)
{
    int rc = backend_submit(b, batch, samples, err, errlen);
    return rc ? rc : backend_wait(b, out, err, errlen);
}

int backend_logits(struct backend *b, const struct batch *batch, const float **logits, char *err, size_t errlen)
{
    int rc = check_usable(b, err, errlen);
    if (rc) return rc;
    if (b->in_flight) return err_set(err, errlen, ERR_BUSY, "backend: a step is in flight");
    if ((rc = batch_check(b, batch, NULL, false, err, errlen))) return rc;
    char why[ERR_BUF] = "";
    rc = b->ops->logits(b->impl, batch, logits, why, sizeof why);
    if (rc) {
        err_set(err, errlen, rc, "%s", why);
        return rc == ERR_INVALID ? rc : mark_broken(b, rc, why);
    }
    b->prev_logits = -1; /* a forward without sampling: nothing for BACKEND_TOKEN_PREV */
    return 0;
}

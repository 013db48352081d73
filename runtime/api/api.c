/* runtime/api/api.c — the C API of include/hpc.h: handles, argument checks,
 * errors; the work is done by the trainer's backend interface
 * (runtime/train/train_backend.h, on the cpu or cuda executor). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_handle.h"
#include "api/api_model.h"
#include "formats/hf_names.h"
#include "formats/safetensors.h"

_Static_assert(HPC_API_OK == (int)HPC_OK && HPC_API_ERR_INPUT == (int)HPC_ERR_INPUT &&
                   HPC_API_ERR_USAGE == (int)HPC_ERR_USAGE && HPC_API_ERR_IO == (int)HPC_ERR_IO &&
                   HPC_API_ERR_NO_GPU == (int)HPC_ERR_NO_GPU && HPC_API_ERR_CUDA == (int)HPC_ERR_CUDA &&
                   HPC_API_ERR_OOM == (int)HPC_ERR_OOM && HPC_API_ERR_NUMERIC == (int)HPC_ERR_NUMERIC &&
                   HPC_API_ERR_INTERNAL == (int)HPC_ERR_INTERNAL,
               "hpc.h status codes must equal util/error.h's");

/* Weak: a program that wants the GPU links the cuda backend with
 * -Wl,--undefined=train_cuda_open (docs/embedding.md); NULL otherwise, so
 * that a cpu-only program links no CUDA code or libraries. */
#pragma weak train_cuda_open
/* Weak: see api_model.h.  NULL when the program did not link the `.model`
 * road (and so no compiler). */
#pragma weak api_program_from_model

/* A compiled artifact's file name ends so (program/artifact.h's ARTIFACT_EXT). */
#define API_ARTIFACT_EXT ".hpc"

/* Used when the model file counts epochs: the API sees single steps. */
#define API_DEFAULT_TOTAL_STEPS 1000

uint32_t hpc_api_version(void) { return HPC_API_VERSION; }

const char *hpc_api_status_name(HpcApiStatus s) { return s == HPC_API_OK ? "ok" : hpc_status_name((HpcStatus)s); }

void hpc_model_options_init(HpcModelOptions *o)
{
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->api_version = HPC_API_VERSION;
    o->backend = HPC_BACKEND_CPU;
    o->precision = HPC_PRECISION_DEFAULT;
}

/* A handle is valid when it is non-NULL and carries the magic; a freed one
 * (magic cleared) is refused while its memory is not reused. */
static bool api_valid(const HpcModel *m) { return m && m->magic == API_MAGIC; }

/* Starts a call: clears the last message. */
static HpcError *api_begin(HpcModel *m)
{
    m->err.code = HPC_OK;
    m->err.msg[0] = '\0';
    return &m->err;
}

const char *hpc_model_error(const HpcModel *m)
{
    if (!m) return "hpc: NULL model handle (hpc_model_open failed or was not called)";
    if (!api_valid(m)) return "hpc: invalid model handle (freed, or not from hpc_model_open)";
    return m->err.msg;
}

/* Messages from other modules name their own call; the API function
 * goes in front so the caller sees which call failed. */
static HpcStatus api_prefix(HpcError *err, const char *fn, HpcStatus st)
{
    if (st && strncmp(err->msg, fn, strlen(fn)) != 0) {
        char tmp[sizeof err->msg];
        snprintf(tmp, sizeof tmp, "%s", err->msg);
        snprintf(err->msg, sizeof err->msg, "%s: %.*s", fn, (int)(sizeof err->msg - strlen(fn) - 3), tmp);
    }
    return st;
}

/* ---- opening ---------------------------------------------------------- */

static bool api_has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The requested policy, PREC_DEFAULT for "the artifact's own (fp32 for a
 * model file)". */
static SpecPrecision api_policy(HpcPrecision p)
{
    switch (p) {
    case HPC_PRECISION_FP32: return PREC_FP32;
    case HPC_PRECISION_FP16: return PREC_FP16;
    case HPC_PRECISION_BF16: return PREC_BF16;
    default: return PREC_DEFAULT;
    }
}

/* The `.model` road (api_model.h), or a message saying how to link it. */
static HpcStatus api_compile(const char *path, const char *text, const ModelSpec *spec, SpecPrecision want,
                             StepProgram *out, HpcError *err)
{
    if (!api_program_from_model)
        return hpc_fail(err, HPC_ERR_USAGE, "hpc_model_open: %s%s needs hpc's compiler, which this program "
                        "was linked without; compile it with `hpc compile` and open the NAME.hpc, or link "
                        "with -Wl,--undefined=api_program_from_model (docs/embedding.md)",
                        spec ? "another policy than the artifact's for " : "",
                        path ? path : "options.model_text");
    return api_program_from_model(path, text, spec, want, out, err);
}

/* A NAME.hpc's step program as it is (compiled again from its model only
 * for another policy), or a model file or text compiled in-process: the
 * same road afterwards. */
static HpcStatus api_load_program(HpcModel *m, const HpcModelOptions *o, HpcError *err)
{
    SpecPrecision want = api_policy(o->precision);
    HpcStatus st;
    if (o->path && api_has_suffix(o->path, API_ARTIFACT_EXT)) {
        st = step_program_read_file(o->path, &m->prog, err);
        if (!st && want != PREC_DEFAULT && want != m->prog.policy) {
            ModelSpec spec = m->prog.spec;
            step_program_free(&m->prog);
            st = api_compile(o->path, NULL, &spec, want, &m->prog, err);
        }
    } else {
        st = api_compile(o->path, o->model_text, NULL, want, &m->prog, err);
    }
    if (st) return st;
    m->spec = m->prog.spec;
    m->policy = m->prog.policy;
    return HPC_OK;
}

static HpcStatus api_check_options(const HpcModelOptions *o, HpcError *err)
{
    if (!o) return hpc_fail(err, HPC_ERR_USAGE, "hpc_model_open: options is NULL "
                            "(fill one with hpc_model_options_init)");
    uint32_t major = o->api_version >> 16, minor = o->api_version & 0xffffu;
    if (major != HPC_API_VERSION_MAJOR || minor > HPC_API_VERSION_MINOR)
        return hpc_fail(err, HPC_ERR_USAGE, "hpc_model_open: the program was built against hpc API "
                        "%u.%u but the library is %d.%d; rebuild the program against this library's "
                        "hpc.h (and call hpc_model_options_init)", major, minor,
                        HPC_API_VERSION_MAJOR, HPC_API_VERSION_MINOR);
    if (!o->path && !o->model_text)
        return hpc_fail(err, HPC_ERR_USAGE, "hpc_model_open: options.path is NULL "
                        "(want a NAME.hpc artifact or a .model file, or set options.model_text)");
    if ((unsigned)o->backend > HPC_BACKEND_AUTO || (unsigned)o->precision > HPC_PRECISION_BF16)
        return hpc_fail(err, HPC_ERR_USAGE, "hpc_model_open: options.backend %d or precision %d is "
                        "not a value of hpc.h", (int)o->backend, (int)o->precision);
    if (o->max_batch < 0 || o->max_seq_len < 0 || o->total_steps < 0)
        return hpc_fail(err, HPC_ERR_USAGE, "hpc_model_open: max_batch, max_seq_len and total_steps "
                        "must be >= 0 (0 = the model file's)");
    return HPC_OK;
}

/* Sizes of the handle from the options and the spec. */
static HpcStatus api_size(HpcModel *m, const HpcModelOptions *o, HpcError *err)
{
    const SpecStack *s = &m->spec.stack;
    m->max_B = o->max_batch ? o->max_batch : m->spec.train.batch_size;
    m->max_L = o->max_seq_len ? o->max_seq_len : m->spec.train.max_seq_len;
    int64_t positions = s->max_positions - s->position_offset;
    if (m->max_L > positions)
        return hpc_fail(err, HPC_ERR_USAGE, "hpc_model_open: max_seq_len %lld is over the model's "
                        "%lld positions; pass a smaller options.max_seq_len", (long long)m->max_L,
                        (long long)positions);
    if (m->max_B > (1 << 20) || m->max_B * m->max_L > ((int64_t)1 << 30))
        return hpc_fail(err, HPC_ERR_USAGE, "hpc_model_open: max_batch %lld x max_seq_len %lld is "
                        "too large", (long long)m->max_B, (long long)m->max_L);
    m->total_steps = o->total_steps ? o->total_steps
                     : m->spec.train.steps > 0 ? m->spec.train.steps : API_DEFAULT_TOTAL_STEPS;
    if (o->seed) m->spec.train.seed = o->seed;
    m->spec.train.grad_accum = 1;  /* one batch per hpc_model_train_step */
    m->zeros_i32 = calloc((size_t)(m->max_B * m->max_L), sizeof(int32_t));
    m->zeros_f32 = calloc((size_t)m->max_B, sizeof(float));
    if (!m->zeros_i32 || !m->zeros_f32)
        return hpc_fail(err, HPC_ERR_OOM, "hpc_model_open: out of host memory");
    return HPC_OK;
}

int api_find_hidden(const IrGraph *g, int64_t hidden)
{
    int found = -1;
    for (int i = 0; i < g->n_forward; i++) {
        const IrNode *v = &g->nodes[i];
        if (v->op == IR_OP_ATTENTION && v->attr.attn.first_query) return -1;   /* the last layer has token 0 only */
        if (strncmp(v->name, "head.", 5) == 0 || i == g->logits) break;
        if (v->op == IR_OP_OUTPUT) continue;   /* a fused LayerNorm's s or 16-bit y: its y is the op itself */
        if (v->rank == 3 && v->dims[0] == IR_DIM_B && v->dims[1] == IR_DIM_L && v->dims[2] == hidden &&
            ir_dtype_is_float(v->dtype))
            found = i;
    }
    return found;
}

/* The initial loss scale of the spec's scaler. */
static double api_initial_scale(const HpcModel *m)
{
    LossScaler ls;
    ls_init(&ls, &m->ls_cfg);
    return ls.scale;
}

/* One backend device for the handle: the cpu, or the cuda backend with the
 * caller's device, stream and allocator. */
static HpcStatus api_open_device(HpcModel *m, TrainDevice dev, const HpcModelOptions *o, HpcError *err)
{
    TrainDeviceAllocator alloc = {0};
    if (o->allocator) alloc = (TrainDeviceAllocator){o->allocator->alloc, o->allocator->free, o->allocator->user};
    TrainBackendOptions bo = {.gpu = o->device, .cuda_stream = o->cuda_stream,
                              .allocator = o->allocator ? &alloc : NULL, .cuda_open = train_cuda_open};
    HpcStatus st = train_backend_open_with(&m->be, dev, &m->prog, m->total_steps, m->max_B, m->max_L, &bo, err);
    if (st) return st;
    m->be_open = true;
    snprintf(m->backend_name, sizeof m->backend_name, "%s", m->be.name);
    return HPC_OK;
}

/* cpu, cuda, or auto: cuda when it opens, else the cpu. */
static HpcStatus api_open_backend(HpcModel *m, const HpcModelOptions *o, HpcError *err)
{
    if (o->backend == HPC_BACKEND_CPU) return api_open_device(m, TRAIN_DEVICE_CPU, o, err);
    if (o->allocator && (!o->allocator->alloc || !o->allocator->free))
        return hpc_fail(err, HPC_ERR_USAGE, "hpc_model_open: options.allocator needs both alloc and free");
    HpcStatus st;
    if (!train_cuda_open)
        st = hpc_fail(err, HPC_ERR_NO_GPU, "hpc_model_open: this program was linked without hpc's cuda "
                      "backend; link it with -Wl,--undefined=train_cuda_open and the CUDA libraries "
                      "(docs/embedding.md), or use HPC_BACKEND_CPU");
    else
        st = api_open_device(m, TRAIN_DEVICE_CUDA, o, err);
    if (!st || o->backend == HPC_BACKEND_CUDA || st != HPC_ERR_NO_GPU) return st;
    /* auto: the cpu, saying why not the GPU. */
    char why[160];
    snprintf(why, sizeof why, "%.150s", err->msg);
    st = api_open_device(m, TRAIN_DEVICE_CPU, o, err);
    snprintf(m->backend_name, sizeof m->backend_name, "cpu (no GPU: %.140s)", why);
    return st;
}

static HpcStatus api_build(HpcModel *m, const HpcModelOptions *o, HpcError *err)
{
    if (m->prog.g.logits < 0 || m->prog.g.loss < 0)
        return hpc_fail(err, HPC_ERR_INTERNAL, "hpc_model_open: the graph of %s has no logits or loss",
                        m->spec.name);
    m->hidden_value = api_find_hidden(&m->prog.g, m->spec.stack.hidden);
    m->prog.spec = m->spec;   /* the backend trains the API's settings */
    ls_config_from_spec(&m->ls_cfg, &m->spec.train);
    m->loss_scale = api_initial_scale(m);
    return api_open_backend(m, o, err);
}

static void api_release(HpcModel *m)
{
    if (m->be_open) train_backend_close(&m->be);
    step_program_free(&m->prog);
    free(m->zeros_i32);
    free(m->zeros_f32);
    m->magic = 0;
    free(m);
}

HpcApiStatus hpc_model_open(const HpcModelOptions *o, HpcModel **out, char *errbuf, size_t errcap)
{
    HpcError err = {0};
    HpcStatus st = HPC_OK;
    HpcModel *m = NULL;
    if (errbuf && errcap) errbuf[0] = '\0';
    if (!out) st = hpc_fail(&err, HPC_ERR_USAGE, "hpc_model_open: out is NULL");
    else *out = NULL;
    if (!st) st = api_check_options(o, &err);
    if (!st) {
        m = calloc(1, sizeof *m);
        if (!m) st = hpc_fail(&err, HPC_ERR_OOM, "hpc_model_open: out of host memory");
    }
    if (!st) {
        m->magic = API_MAGIC;
        st = api_load_program(m, o, &err);
    }
    if (!st) st = api_size(m, o, &err);
    if (!st) st = api_build(m, o, &err);
    if (st) {
        if (m) api_release(m);
        api_prefix(&err, "hpc_model_open", st);
        if (errbuf && errcap) snprintf(errbuf, errcap, "%s", err.msg);
        return (HpcApiStatus)st;
    }
    *out = m;
    return HPC_API_OK;
}

void hpc_model_free(HpcModel *m)
{
    if (!api_valid(m)) return;
    api_release(m);
}

HpcApiStatus hpc_model_info(HpcModel *m, HpcModelInfo *info)
{
    if (!api_valid(m)) return HPC_API_ERR_USAGE;
    HpcError *err = api_begin(m);
    if (!info) return (HpcApiStatus)hpc_fail(err, HPC_ERR_USAGE, "hpc_model_info: info is NULL");
    const IrNode *lg = &m->prog.g.nodes[m->prog.g.logits];
    static const HpcPrecision prec[] = {[PREC_DEFAULT] = HPC_PRECISION_FP32, [PREC_FP32] = HPC_PRECISION_FP32,
                                        [PREC_FP16] = HPC_PRECISION_FP16, [PREC_BF16] = HPC_PRECISION_BF16};
    *info = (HpcModelInfo){
        .name = m->spec.name, .backend = m->backend_name, .head = spec_head_kind_name(m->spec.head.kind),
        .precision = prec[m->policy], .vocab_size = m->spec.stack.vocab_size,
        .hidden = m->spec.stack.hidden, .layers = m->spec.stack.layers,
        .num_labels = m->spec.head.num_labels, .max_batch = m->max_B, .max_seq_len = m->max_L,
        .logits_per_row = lg->dims[lg->rank - 1], .logits_per_token = lg->rank == 3,
        .n_params = params_total(&m->prog.pl), .steps = m->steps, .loss_scale = m->loss_scale};
    return HPC_API_OK;
}

/* ---- batches ---------------------------------------------------------- */

static HpcStatus api_check_ids(const char *fn, const char *what, const int32_t *a, int64_t n, int32_t lo,
                               int64_t hi, bool allow_ignore, HpcError *err)
{
    for (int64_t i = 0; i < n; i++) {
        if (allow_ignore && a[i] == IR_IGNORE_INDEX) continue;
        if (a[i] < lo || a[i] >= hi)
            return hpc_fail(err, HPC_ERR_INPUT, "%s: %s[%lld] = %d is outside [%d, %lld)", fn, what,
                            (long long)i, a[i], lo, (long long)hi);
    }
    return HPC_OK;
}

static HpcStatus api_check_labels(HpcModel *m, const char *fn, const HpcBatch *b, HpcError *err)
{
    const SpecHead *h = &m->spec.head;
    int64_t B = b->batch, BL = b->batch * b->seq_len;
    switch (h->kind) {
    case HEAD_SEQ_CLASSIFICATION:
        if (h->regression) {
            if (!b->targets) return hpc_fail(err, HPC_ERR_USAGE, "%s: batch.targets is NULL (a "
                                             "regression head needs (B) targets)", fn);
            for (int64_t i = 0; i < B; i++)
                if (!isfinite(b->targets[i]))
                    return hpc_fail(err, HPC_ERR_INPUT, "%s: targets[%lld] is not finite", fn, (long long)i);
            return HPC_OK;
        }
        if (!b->labels) return hpc_fail(err, HPC_ERR_USAGE, "%s: batch.labels is NULL (want (B) class ids)", fn);
        return api_check_ids(fn, "labels", b->labels, B, 0, h->num_labels, false, err);
    case HEAD_TOKEN_CLASSIFICATION:
    case HEAD_MASKED_LM:
        if (!b->labels) return hpc_fail(err, HPC_ERR_USAGE, "%s: batch.labels is NULL (want (B, L) ids, "
                                        "-100 = ignore)", fn);
        return api_check_ids(fn, "labels", b->labels, BL, 0,
                             h->kind == HEAD_MASKED_LM ? m->spec.stack.vocab_size : h->num_labels, true, err);
    case HEAD_CAUSAL_LM:
        return HPC_OK;
    }
    return HPC_OK;
}

/* Checks an HpcBatch against the compiled limits and fills a Batch that
 * borrows its arrays (zero buffers stand in for absent optional fields). */
static HpcStatus api_batch(HpcModel *m, const char *fn, const HpcBatch *hb, bool need_labels, Batch *out,
                           HpcError *err)
{
    if (!hb) return hpc_fail(err, HPC_ERR_USAGE, "%s: batch is NULL", fn);
    if (hb->batch < 1 || hb->batch > m->max_B || hb->seq_len < 1 || hb->seq_len > m->max_L)
        return hpc_fail(err, HPC_ERR_USAGE, "%s: batch %lld x seq_len %lld is outside the compiled "
                        "maximum %lld x %lld (open the model with larger options.max_batch / max_seq_len)",
                        fn, (long long)hb->batch, (long long)hb->seq_len, (long long)m->max_B,
                        (long long)m->max_L);
    if (!hb->input_ids || !hb->attention_mask)
        return hpc_fail(err, HPC_ERR_USAGE, "%s: batch.input_ids and batch.attention_mask must not be NULL", fn);
    int64_t BL = hb->batch * hb->seq_len;
    HpcStatus st = api_check_ids(fn, "input_ids", hb->input_ids, BL, 0, m->spec.stack.vocab_size, false, err);
    if (!st) st = api_check_ids(fn, "attention_mask", hb->attention_mask, BL, 0, 2, false, err);
    if (!st && hb->token_type_ids)
        st = api_check_ids(fn, "token_type_ids", hb->token_type_ids, BL, 0,
                           m->spec.stack.type_vocab_size > 0 ? m->spec.stack.type_vocab_size : 1, false, err);
    for (int64_t r = 0; !st && r < hb->batch; r++) {
        int64_t n = 0;
        for (int64_t t = 0; t < hb->seq_len; t++) n += hb->attention_mask[r * hb->seq_len + t];
        if (n == 0) st = hpc_fail(err, HPC_ERR_INPUT, "%s: row %lld of attention_mask has no token", fn,
                                  (long long)r);
    }
    if (!st && need_labels) st = api_check_labels(m, fn, hb, err);
    if (st) return st;
    *out = (Batch){
        .B = hb->batch, .L = hb->seq_len, .input_ids = (int32_t *)hb->input_ids,
        .attention_mask = (int32_t *)hb->attention_mask,
        .token_type_ids = hb->token_type_ids ? (int32_t *)hb->token_type_ids : m->zeros_i32,
        .labels = need_labels && hb->labels ? (int32_t *)hb->labels : m->zeros_i32,
        .targets = need_labels && hb->targets ? (float *)hb->targets : m->zeros_f32};
    return HPC_OK;
}

static HpcStatus api_check_cap(HpcModel *m, const char *fn, const char *what, int v, const Batch *b,
                               size_t cap, HpcError *err)
{
    int64_t need = ir_numel(&m->prog.g.nodes[v], b->B, b->L);
    if ((uint64_t)need > cap)
        return hpc_fail(err, HPC_ERR_USAGE, "%s: %s needs %lld floats for this batch, the array holds %zu",
                        fn, what, (long long)need, cap);
    return HPC_OK;
}

/* ---- running ---------------------------------------------------------- */

/* Forward with dropout off; copies what is asked for (each may be NULL). */
static HpcStatus api_forward(HpcModel *m, const Batch *b, double *loss, float *logits, float *hidden,
                             HpcError *err)
{
    TrainBackend *be = &m->be;
    if (hidden && !be->read_value)
        return hpc_fail(err, HPC_ERR_USAGE, "hpc_model_hidden: not available on the cuda backend (open the "
                        "model with HPC_BACKEND_CPU for hidden states)");
    double l = 0;
    const float *lg = NULL;
    HpcStatus st = be->forward(be, b, &l, logits ? &lg : NULL, err);
    if (st) return st;
    if (loss) *loss = l;
    if (logits)
        memcpy(logits, lg, (size_t)ir_numel(&m->prog.g.nodes[m->prog.g.logits], b->B, b->L) * sizeof(float));
    return hidden ? be->read_value(be, m->hidden_value, hidden, err) : HPC_OK;
}

/* One micro-batch, one optimizer step, its record. */
static HpcStatus api_train(HpcModel *m, const Batch *b, HpcStepReport *rep, HpcError *err)
{
    TrainBackend *be = &m->be;
    TrainStepStat rec;
    int n = 0;
    HpcStatus st = be->micro(be, b, 0, err);
    if (!st) st = be->step(be, false, err);
    if (!st) st = be->collect(be, &rec, 1, &n, err);
    if (!st && n != 1) st = hpc_fail(err, HPC_ERR_INTERNAL, "hpc_model_train_step: the step left no record");
    if (st) return st;
    if (!rec.skipped) m->steps++;
    m->loss_scale = rec.loss_scale;
    *rep = (HpcStepReport){.loss = rec.loss, .lr = rec.lr, .loss_scale = rec.loss_scale,
                           .grad_norm = rec.grad_norm, .skipped = rec.skipped, .step = m->steps};
    /* the scaler as the step left it, for its give-up rule and message */
    LossScaler ls = {.cfg = m->ls_cfg, .scale = rec.loss_scale, .consecutive_skips = rec.consecutive_skips,
                     .total_skips = rec.total_skips};
    if (ls_gave_up(&ls)) {
        char why[512];
        ls_describe_give_up(&ls, why, sizeof why);
        return hpc_fail(err, HPC_ERR_NUMERIC, "hpc_model_train_step: %s", why);
    }
    return HPC_OK;
}

HpcApiStatus hpc_model_forward(HpcModel *m, const HpcBatch *b, float *logits, size_t cap)
{
    if (!api_valid(m)) return HPC_API_ERR_USAGE;
    HpcError *err = api_begin(m);
    Batch bt;
    HpcStatus st = api_batch(m, "hpc_model_forward", b, false, &bt, err);
    if (!st && !logits) st = hpc_fail(err, HPC_ERR_USAGE, "hpc_model_forward: logits is NULL");
    if (!st) st = api_check_cap(m, "hpc_model_forward", "logits", m->prog.g.logits, &bt, cap, err);
    if (!st) st = api_forward(m, &bt, NULL, logits, NULL, err);
    return (HpcApiStatus)st;
}

HpcApiStatus hpc_model_hidden(HpcModel *m, const HpcBatch *b, float *hidden, size_t cap)
{
    if (!api_valid(m)) return HPC_API_ERR_USAGE;
    HpcError *err = api_begin(m);
    for (int i = 0; m->hidden_value < 0 && i < m->prog.g.n; i++)
        if (m->prog.g.nodes[i].op == IR_OP_ATTENTION && m->prog.g.nodes[i].attr.attn.first_query)
            return (HpcApiStatus)hpc_fail(err, HPC_ERR_USAGE, "hpc_model_hidden: %s was compiled with its last "
                                          "layer for token 0 only (a classification head), so it has no last "
                                          "hidden states; compile it with HPC_LAST_LAYER=all, or open its .model",
                                          m->spec.name);
    if (m->hidden_value < 0)
        return (HpcApiStatus)hpc_fail(err, HPC_ERR_INTERNAL, "hpc_model_hidden: no hidden-state value "
                                      "found in the graph of %s", m->spec.name);
    Batch bt;
    HpcStatus st = api_batch(m, "hpc_model_hidden", b, false, &bt, err);
    if (!st && !hidden) st = hpc_fail(err, HPC_ERR_USAGE, "hpc_model_hidden: hidden is NULL");
    if (!st) st = api_check_cap(m, "hpc_model_hidden", "hidden", m->hidden_value, &bt, cap, err);
    if (!st) st = api_forward(m, &bt, NULL, NULL, hidden, err);
    return (HpcApiStatus)st;
}

HpcApiStatus hpc_model_evaluate(HpcModel *m, const HpcBatch *b, double *loss, float *logits, size_t cap)
{
    if (!api_valid(m)) return HPC_API_ERR_USAGE;
    HpcError *err = api_begin(m);
    Batch bt;
    HpcStatus st = api_batch(m, "hpc_model_evaluate", b, true, &bt, err);
    if (!st && !loss) st = hpc_fail(err, HPC_ERR_USAGE, "hpc_model_evaluate: loss is NULL");
    if (!st && logits) st = api_check_cap(m, "hpc_model_evaluate", "logits", m->prog.g.logits, &bt, cap, err);
    if (!st) st = api_forward(m, &bt, loss, logits, NULL, err);
    return (HpcApiStatus)st;
}

HpcApiStatus hpc_model_train_step(HpcModel *m, const HpcBatch *b, HpcStepReport *report)
{
    if (!api_valid(m)) return HPC_API_ERR_USAGE;
    HpcError *err = api_begin(m);
    Batch bt;
    HpcStepReport rep;
    HpcStatus st = api_batch(m, "hpc_model_train_step", b, true, &bt, err);
    if (!st) st = api_train(m, &bt, &rep, err);
    if (report && (!st || st == HPC_ERR_NUMERIC)) *report = rep;
    return (HpcApiStatus)st;
}

/* ---- weights ---------------------------------------------------------- */


/* Host copies of every storage-owning parameter (tied entries NULL). */
static HpcStatus api_host_params(HpcModel *m, float ***out, HpcError *err)
{
    const ParamList *pl = &m->prog.pl;
    float **w = xcalloc((size_t)pl->n + 1, sizeof *w);
    *out = w;
    for (int p = 0; p < pl->n; p++) {
        if (pl->p[p].tied_to >= 0) continue;
        w[p] = malloc((size_t)params_numel(&pl->p[p]) * sizeof(float));
        if (!w[p]) return hpc_fail(err, HPC_ERR_OOM, "out of host memory for %s", pl->p[p].name);
        HpcStatus st = m->be.read_param(&m->be, p, w[p], err);
        if (st) return st;
    }
    return HPC_OK;
}

static void api_free_params(HpcModel *m, float **w)
{
    if (!w) return;
    for (int p = 0; p < m->prog.pl.n; p++) free(w[p]);
    free(w);
}

HpcApiStatus hpc_model_load_weights(HpcModel *m, const char *path)
{
    if (!api_valid(m)) return HPC_API_ERR_USAGE;
    HpcError *err = api_begin(m);
    if (!path) return (HpcApiStatus)hpc_fail(err, HPC_ERR_USAGE, "hpc_model_load_weights: path is NULL");
    float **w = NULL;
    StFile *f = NULL;
    int n_new = 0;
    HpcStatus st = api_host_params(m, &w, err);
    if (!st) st = st_open(path, &f, err);
    /* Loaded into copies, so a failure halfway leaves the model unchanged. */
    if (!st) st = hf_names_load_all(hf_names_detect(f), f, &m->prog.pl, w, &n_new, err);
    if (!st) st = m->be.set_weights(&m->be, w, err);
    if (!st) {
        m->steps = 0;
        m->loss_scale = api_initial_scale(m);
    }
    if (f) st_close(f);
    api_free_params(m, w);
    return (HpcApiStatus)api_prefix(err, "hpc_model_load_weights", st);
}

HpcApiStatus hpc_model_save_weights(HpcModel *m, const char *path)
{
    if (!api_valid(m)) return HPC_API_ERR_USAGE;
    HpcError *err = api_begin(m);
    if (!path) return (HpcApiStatus)hpc_fail(err, HPC_ERR_USAGE, "hpc_model_save_weights: path is NULL");
    const ParamList *pl = &m->prog.pl;
    float **w = NULL;
    StWriter wr;
    st_writer_init(&wr);
    HpcStatus st = api_host_params(m, &w, err);
    for (int p = 0; !st && p < pl->n; p++)
        if (pl->p[p].tied_to < 0)
            st = st_writer_add(&wr, pl->p[p].name, ST_F32, pl->p[p].rank, pl->p[p].dims, w[p], err);
    if (!st) st = st_writer_meta(&wr, "format", "pt", err);
    if (!st) st = st_writer_meta(&wr, "hpc_model", m->spec.name, err);
    if (!st) st = st_writer_save(&wr, path, err);
    st_writer_free(&wr);
    api_free_params(m, w);
    return (HpcApiStatus)api_prefix(err, "hpc_model_save_weights", st);
}

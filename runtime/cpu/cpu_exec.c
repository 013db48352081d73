/* runtime/cpu/cpu_exec.c — the cpu backend; see cpu_exec.h.  The per-op CPU
 * references live in cpu_exec_ops.inc (one body, two precisions), the fast
 * mode's ops in cpu_fast_ops.inc (f32 only). */
#include "cpu/cpu_exec.h"

#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_fast_gemm.h"
#include "cpu/cpu_fast_kernels.h"
#include "cpu/cpu_threads.h"
#include "cpu/cpu_kernels.h"
#include "cpu/half.h"
#include "cpu/philox.h"

typedef HpcStatus (*CpuOpFn)(CpuExec *ex, int id, HpcError *err);

#define NODE(id) (&ex->g->nodes[(id)])
#define IN(id, k) (NODE(id)->in[(k)])
#define V(id) ((REAL *)ex->buf[(id)])
#define IV(id) ((int32_t *)ex->buf[(id)])
#define V_F32(id) ((float *)ex->buf[(id)])
#define DIM(d) ir_dim((d), ex->B, ex->L)
#define NUMEL(id) ir_numel(NODE(id), ex->B, ex->L)
#define ROWS(id) ir_rows(NODE(id), ex->B, ex->L)
#define LAST(id) DIM(NODE(id)->dims[NODE(id)->rank - 1])
#define EX_CAT_(a, b) a##b
#define EX_CAT(a, b) EX_CAT_(a, b)
#define EX(name) EX_CAT(name, EX_SFX)

/* A temporary of `bytes` in slot `slot`, valid until the next call for it. */
static void *scratch(CpuExec *ex, int slot, int64_t bytes)
{
    if ((size_t)bytes > ex->scratch_cap[slot]) {
        free(ex->scratch[slot]);
        ex->scratch[slot] = xmalloc((size_t)bytes);
        ex->scratch_cap[slot] = (size_t)bytes;
    }
    return ex->scratch[slot];
}

/* The reference of every activation and of its derivative (program/activations.h). */
static const CkActFn act_ref_fn[IR_ACT_COUNT] = {
#define ACT_REF_(E, name, ffn, hf, ref, grad, cuda) ref,
    HPC_ACTIVATIONS(ACT_REF_)
#undef ACT_REF_
};
static const CkActFn act_grad_ref_fn[IR_ACT_COUNT] = {
#define ACT_GRAD_(E, name, ffn, hf, ref, grad, cuda) grad,
    HPC_ACTIVATIONS(ACT_GRAD_)
#undef ACT_GRAD_
};

#define REAL float
#define EX_SFX _f32
#include "cpu/cpu_exec_ops.inc"
#undef REAL
#undef EX_SFX
#define REAL double
#define EX_SFX _f64
#include "cpu/cpu_exec_ops.inc"
#undef REAL
#undef EX_SFX
#include "cpu/cpu_fast_ops.inc"

/* Written before threads start (hpc run sets it while parsing options). */
static CpuExecMode training_mode = CPU_EXEC_REFERENCE;

void cpu_exec_set_training_mode(CpuExecMode mode) { training_mode = mode; }
CpuExecMode cpu_exec_training_mode(void) { return training_mode; }
const char *cpu_exec_mode_name(CpuExecMode mode) { return mode == CPU_EXEC_FAST ? "fast" : "reference"; }

void cpu_exec_set_mode(CpuExec *ex, CpuExecMode mode) { ex->mode = mode; }

void cpu_exec_init(CpuExec *ex, const IrGraph *g, CpuExecPrecision prec)
{
    memset(ex, 0, sizeof *ex);
    ex->g = g;
    ex->prec = prec;
    ex->buf = xcalloc((size_t)g->n, sizeof *ex->buf);
    ex->cap = xcalloc((size_t)g->n, sizeof *ex->cap);
    ex->param = xcalloc((size_t)(g->n_params > 0 ? g->n_params : 1), sizeof *ex->param);
}

void cpu_exec_free(CpuExec *ex)
{
    if (!ex->g) return;
    for (int i = 0; i < ex->g->n; i++)
        if (ex->cap[i]) free(ex->buf[i]); /* owned; bound parameters have cap 0 */
    for (int s = 0; s < CPU_EXEC_SCRATCH; s++) free(ex->scratch[s]);
    free(ex->buf);
    free(ex->cap);
    free(ex->param);
    memset(ex, 0, sizeof *ex);
}

void cpu_exec_bind_param(CpuExec *ex, int index, void *data)
{
    HPC_ASSERT(index >= 0 && index < ex->g->n_params);
    ex->param[index] = data;
}

int64_t cpu_exec_numel(const CpuExec *ex, int v) { return NUMEL(v); }

static size_t elem_size(const CpuExec *ex, DType dt)
{
    if (dt == DT_I32) return sizeof(int32_t);
    return ex->prec == CPU_EXEC_F64 ? sizeof(double) : sizeof(float);
}

static HpcStatus ensure_buffer(CpuExec *ex, int id, HpcError *err)
{
    size_t bytes = (size_t)NUMEL(id) * elem_size(ex, NODE(id)->dtype);
    if (bytes == 0) bytes = 1;
    if (bytes <= ex->cap[id]) return HPC_OK;
    free(ex->buf[id]);
    ex->buf[id] = malloc(bytes);
    ex->cap[id] = ex->buf[id] ? bytes : 0;
    if (!ex->buf[id])
        return hpc_fail(err, HPC_ERR_OOM, "cpu_exec: out of host memory for value %d (%s, %zu bytes); "
                        "use a smaller batch or sequence length", id, NODE(id)->name, bytes);
    return HPC_OK;
}

/* Emulates 16-bit storage in f32 mode: the value is rounded in place. */
static void round_low_precision(CpuExec *ex, int id)
{
    DType dt = NODE(id)->dtype;
    if (ex->prec != CPU_EXEC_F32 || (dt != DT_F16 && dt != DT_BF16)) return;
    if (ex->mode == CPU_EXEC_FAST) fast_round(V_F32(id), NUMEL(id), dt == DT_BF16);
    else if (dt == DT_F16) half_round_array(V_F32(id), NUMEL(id));
    else bf16_round_array(V_F32(id), NUMEL(id));
}

/* A PARAM node reads the bound storage.  In f32 mode a PARAM of dtype
 * f16/bf16 (the precision pass's low-precision weight copy) gets its own
 * buffer holding the rounded master, which is what the optimizer's copy
 * holds on a GPU. */
static HpcStatus bind_param_node(CpuExec *ex, int id, HpcError *err)
{
    int p = NODE(id)->attr.param.index;
    DType dt = NODE(id)->dtype;
    if (!ex->param[p])
        return hpc_fail(err, HPC_ERR_USAGE, "cpu_exec: parameter %d (%s) is not bound; call "
                        "cpu_exec_bind_param first", p, NODE(id)->name);
    if (ex->prec == CPU_EXEC_F64 || (dt != DT_F16 && dt != DT_BF16)) {
        ex->buf[id] = ex->param[p];
        return HPC_OK;
    }
    if (!ex->cap[id]) ex->buf[id] = NULL; /* was borrowed */
    HpcStatus st = ensure_buffer(ex, id, err);
    if (st) return st;
    memcpy(ex->buf[id], ex->param[p], (size_t)NUMEL(id) * sizeof(float));
    round_low_precision(ex, id);
    return HPC_OK;
}

HpcStatus cpu_exec_run(CpuExec *ex, const Batch *batch, const CpuRunOptions *opts, HpcError *err)
{
    const CpuOpFn *table = ex->prec == CPU_EXEC_F64 ? cpu_op_table_f64 : cpu_op_table_f32;
    bool fast = ex->prec == CPU_EXEC_F32 && ex->mode == CPU_EXEC_FAST;
    ex->B = batch->B;
    ex->L = batch->L;
    ex->batch = batch;
    ex->training = opts->training;
    ex->backward = opts->backward;
    ex->seed = opts->seed;
    ex->step = opts->step;
    ex->loss_scale = opts->loss_scale;
    int end = opts->backward ? ex->g->n : ex->g->n_forward;
    HpcStatus st = HPC_OK;
    for (int i = 0; i < end && st == HPC_OK; i++) {
        if (NODE(i)->op == IR_OP_PARAM) {
            st = bind_param_node(ex, i, err);
            continue;
        }
        st = ensure_buffer(ex, i, err);
        /* A multi-output op writes its OUTPUT nodes' values too. */
        for (int k = 1; k < ir_op_info(NODE(i)->op)->n_outputs && st == HPC_OK; k++) {
            int j = ir_output(ex->g, i, k);
            if (j >= 0) st = ensure_buffer(ex, j, err);
        }
        CpuOpFn fn = fast ? fast_op(NODE(i)->op) : NULL;
        if (st == HPC_OK) st = (fn ? fn : table[NODE(i)->op])(ex, i, err);
        if (st == HPC_OK) round_low_precision(ex, i);
    }
    ex->batch = NULL;
    return st;
}

const void *cpu_exec_value(const CpuExec *ex, int v)
{
    HPC_ASSERT(v >= 0 && v < ex->g->n);
    return ex->buf[v];
}

double cpu_exec_loss(const CpuExec *ex)
{
    int l = ex->g->loss;
    HPC_ASSERT(l >= 0 && ex->buf[l]);
    return ex->prec == CPU_EXEC_F64 ? ((double *)ex->buf[l])[0] : ((float *)ex->buf[l])[0];
}

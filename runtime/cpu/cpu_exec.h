/* runtime/cpu/cpu_exec.h — the cpu backend: runs an IR graph on the host.
 *
 * The reference executor every faster path is checked against.  It keeps
 * one buffer per value, binds INPUT values from a Batch and PARAM values
 * from caller-owned parameter storage, and dispatches each node to the
 * numerical kernels of runtime/cpu/cpu_kernels.h (the CPU reference of the op;
 * the dispatch table is generated from program/ops.def).
 *
 * Precision: the whole graph runs in one storage type.
 *   CPU_EXEC_F32: float buffers; values whose dtype is DT_F16 or DT_BF16 are
 *     rounded to that format after the op that produces them (and by CAST),
 *     so a mixed-precision graph gives the numbers of a GPU that stores 16
 *     bits (runtime/cpu/half.h).  A PARAM node of dtype f16/bf16 (the precision
 *     pass's low-precision weight copy) reads the bound f32 master rounded
 *     to that format, into a buffer of its own; the master is not changed.
 *   CPU_EXEC_F64: double buffers, no rounding; for gradient checks.
 * Integer values (ids, masks, labels) are int32 in both.
 *
 * Mode (f32 only; f64 always runs the reference):
 *   CPU_EXEC_REFERENCE (the zero value, what every test uses): the kernels
 *     of cpu_kernels.h, one thread, the numbers every faster path is held to.
 *   CPU_EXEC_FAST: the same graph on every core (runtime/cpu/cpu_threads.h);
 *     gemms through cpu_fast_gemm.h (FMA, its own blocking: NOT bitwise,
 *     within the float dot-product bound stated there, about 1e-6 relative
 *     on the models' sizes), every other op bitwise equal to the reference
 *     (runtime/cpu/cpu_fast_kernels.h).  Results do not depend on the thread
 *     count.  fp16/bf16 emulation is kept (values rounded as in reference).
 *
 * Dropout draws its mask from Philox with (seed, step, salt = the dropout
 * op's attribute salt), runtime/cpu/philox.h; with training = false it is the
 * identity.  The backward part (nodes past g->n_forward) runs only when
 * CpuRunOptions.backward is set; it seeds d(loss) = loss_scale.
 *
 * Ownership: the executor borrows the graph (which must outlive it and not
 * change) and the parameter storage bound with cpu_exec_bind_param; it owns
 * all other buffers.  Pointers from cpu_exec_value are valid until the next
 * cpu_exec_run or cpu_exec_free.
 *
 * Usage:
 *   CpuExec ex;
 *   cpu_exec_init(&ex, &g, CPU_EXEC_F32);
 *   for (int p = 0; p < pl.n; p++) if (pl.p[p].tied_to < 0) cpu_exec_bind_param(&ex, p, w[p]);
 *   CpuRunOptions o = {.training = true, .backward = true, .seed = 42, .step = 0, .loss_scale = 1};
 *   if (cpu_exec_run(&ex, batch, &o, &err)) return err.code;
 *   const float *dW = cpu_exec_value(&ex, g.param_grad[p]);   // (dims of p) f32
 *   cpu_exec_free(&ex);
 */
#ifndef HPC_RUNTIME_CPU_EXEC_H
#define HPC_RUNTIME_CPU_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/batch.h"
#include "util/error.h"
#include "program/ir.h"

typedef enum { CPU_EXEC_F32, CPU_EXEC_F64 } CpuExecPrecision;
typedef enum { CPU_EXEC_REFERENCE, CPU_EXEC_FAST } CpuExecMode;

#define CPU_EXEC_SCRATCH 4

typedef struct {
    const IrGraph *g;          /* borrowed */
    CpuExecPrecision prec;
    CpuExecMode mode;          /* CPU_EXEC_REFERENCE after cpu_exec_init */
    int64_t B, L;              /* binding of the last run */
    void **buf;                /* (g->n) value buffers; PARAM entries are borrowed */
    size_t *cap;               /* (g->n) bytes allocated per owned buffer */
    void **param;              /* (g->n_params) bound parameter storage */
    void *scratch[CPU_EXEC_SCRATCH];  /* temporaries inside one op */
    size_t scratch_cap[CPU_EXEC_SCRATCH];
    const Batch *batch;        /* during a run */
    bool training, backward;
    uint64_t seed;
    uint32_t step;
    double loss_scale;
} CpuExec;

typedef struct {
    bool training;             /* dropout on */
    bool backward;             /* run the backward part too */
    uint64_t seed;             /* dropout seed */
    uint32_t step;             /* micro-step counter for dropout */
    double loss_scale;         /* d(loss) seed of the backward pass */
} CpuRunOptions;

void cpu_exec_init(CpuExec *ex, const IrGraph *g, CpuExecPrecision prec);
void cpu_exec_free(CpuExec *ex);

/* Selects the mode of later runs (ignored in CPU_EXEC_F64). */
void cpu_exec_set_mode(CpuExec *ex, CpuExecMode mode);

/* The mode the cpu training backend (runtime/train/train_cpu.c) gives the
 * executors it opens: CPU_EXEC_REFERENCE unless a program sets another
 * (`hpc run` sets CPU_EXEC_FAST unless --cpu-reference).  Process-wide. */
void cpu_exec_set_training_mode(CpuExecMode mode);
CpuExecMode cpu_exec_training_mode(void);
/* "reference" or "fast". */
const char *cpu_exec_mode_name(CpuExecMode mode);

/* Binds parameter `index` to data: (numel) float for CPU_EXEC_F32, double
 * for CPU_EXEC_F64, laid out as the parameter's dims.  Borrowed. */
void cpu_exec_bind_param(CpuExec *ex, int index, void *data);

/* Runs the forward part (and the backward part if opts->backward) for the
 * batch's B and L.  Fails with HPC_ERR_INPUT on an id or label out of range
 * or a batch without a field the graph needs, HPC_ERR_USAGE when a
 * parameter is unbound, HPC_ERR_OOM when buffers cannot be allocated. */
HpcStatus cpu_exec_run(CpuExec *ex, const Batch *batch, const CpuRunOptions *opts, HpcError *err);

/* The buffer of value v after a run (float, double or int32_t by its dtype
 * and the executor's precision); stale or NULL if v did not run in
 * the last run (e.g. a backward value after a forward-only run). */
const void *cpu_exec_value(const CpuExec *ex, int v);
/* The scalar loss of the last run (as double in both precisions). */
double cpu_exec_loss(const CpuExec *ex);
/* Elements of value v under the last run's binding of B and L. */
int64_t cpu_exec_numel(const CpuExec *ex, int v);

#endif

/* runtime/cuda/cuda_optim.h — the optimizer step and the loss scaler on the GPU.
 *
 * The device twin of runtime/train/optim.h + runtime/train/lossscale.h + schedule.h,
 * driving the multi-tensor kernels that end the step program's own CUDA
 * module (rendered by compiler/emit_optim.c into the step's source, so
 * they are compiled, cached and exported with the step and need no module
 * of their own): [opt_mark_rows,] opt_check_norm, opt_decide,
 * [opt_lamb_norms, opt_lamb_ratio,] opt_update, and opt_accumulate for
 * gradient accumulation.
 * Every parameter tensor is cut into chunks of at most CUDA_OPTIM_CHUNK
 * elements (cuda_optim_chunks), so each pass is one launch over all of
 * them with 16-byte accesses.  Everything a step decides lives on the
 * device: the CudaOptState (loss scale, growth tracker, found_inf, the
 * applied-step counter from which bias correction and the learning rate
 * follow, skip counters, last grad norm and lr) and the step's decision
 * that opt_decide writes for the update.  So a step queues kernels and
 * never waits for the device; cuda_optim_read_state reads the state when
 * the host wants to log.
 *
 * Inside the step's CUDA graph.  cuda_optim_step_tail() is a CudaExecTail
 * (runtime/cuda/cuda_exec.h): passed to cuda_exec_launch it queues the
 * optimizer after the backward pass inside the same captured graph, so no
 * host work separates them; train_cuda.c does that.  cuda_optim_step queues
 * the same kernels on their own.
 *
 * Gradients.  The executor leaves each parameter's gradient (times the
 * loss scale) in its arena after a backward run, overwritten by the next
 * run: f32, or f16 / bf16 where the graph stores it so (the kernels widen
 * each element as they load it; the sums over micro-batches are f32).
 * With grad_accum == 1 the optimizer reads those directly.  With
 * grad_accum = A > 1 each micro-batch adds grad / A into a buffer per
 * parameter (the first micro-batch overwrites): cuda_optim_accumulate, or
 * the tails, so the optimizer sees the mean over micro-batches, as the cpu
 * trainer's inv_scale = 1 / (scale * A) does.
 *
 * The 16-bit copy.  The update writes each parameter's f16 or bf16 copy
 * (the one the step reads) in the same pass; the module was rendered for
 * the graph's copy dtype, and the table points at the graph's copies.
 *
 * The loss scale feeds the next backward pass without the host: pass
 * cuda_optim_scale_ptr() as CudaRunOptions.loss_scale_dev.
 *
 * Deferred fixes.  compiler/fuse_ln_dw.c puts the LN_DW_FIX(_DB) nodes
 * (dW = raw * gamma[col] + db[row] * beta[col] for a GEMM that read a
 * LayerNorm's xhat) at the end of the graph when only views read their
 * gradients (CudaExec.fix_from).  The optimizer then reads each such
 * gradient as raw, gamma, beta and db where they lie and computes the fix
 * as it goes (CudaOptFix, the kernels' opt_fix: the same arithmetic, so
 * the same bits), and its tails say so (CudaExecTail.applies_fixes): the
 * step skips BERT-base's 24 fix passes (48 M f32 gradient elements in all,
 * each read and written), and the optimizer reads raw's bytes in place of
 * the fixed gradient's.  gamma and beta are parameters the update itself
 * changes, so the norm pass copies them (the snaps) and the update reads
 * the copies.  Only the tails apply the
 * fixes; cuda_optim_step and cuda_optim_accumulate on their own read the
 * executor's fixed gradients (a run without such a tail ran the fixes).
 * HPC_OPT_LN_FIX=0 turns this off (the executor runs the fixes).
 *
 * Untouched rows.  In the step's tail with grad_accum 1, the chunks of an
 * embedding table's gradient that hold no row of the step's tokens are
 * taken as 0 without loads (runtime/cuda/cuda_optim_rows.h); the same bits.
 *
 * Ownership: borrows the executor (which must outlive it, and whose module
 * holds the kernels); the device buffers (m, v, accumulators, tables,
 * state, partials) come from the executor's arena (counted in its peak)
 * and are released by cuda_optim_free.  A CudaOptim must not move after
 * init (its tails point into it); each init gets new tail keys, so graphs
 * captured with an earlier optimizer are never replayed for a new one.
 *
 * Usage:
 *   CudaOptim o;
 *   if (cuda_optim_init(&o, &ex, &spec, PREC_FP16, total_steps, &err)) return err.code;
 *   for each step: for m in 0..A-1 { cuda_exec_run(...loss_scale_dev = cuda_optim_scale_ptr(&o));
 *                                    cuda_optim_accumulate(&o, m, &err); }
 *                  cuda_optim_step(&o, &err);
 *   CudaOptState s; cuda_optim_read_state(&o, &s, &err);   // waits
 *   cuda_optim_free(&o);
 */
#ifndef HPC_RUNTIME_CUDA_OPTIM_H
#define HPC_RUNTIME_CUDA_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda/cuda_exec.h"
#include "cuda/cuda_optim_rows.h"
#include "util/error.h"
#include "program/spec.h"

/* The arguments of one opt_mark_rows launch (cuda_optim_rows.h). */
typedef struct {
    int tensor;          /* in the plan's table */
    int first, n;        /* its chunks: cuda_optim_plan_rows fills them */
    CUdeviceptr ids;     /* i32 token ids of the table */
    int64_t n_ids;       /* how many the step has: set before each queue */
    int64_t rows, cols;  /* the table */
} CudaOptRows;

/* Device structs of the optimizer kernels (layouts fixed: the kernels of
 * compiler/emit_optim.c see the same fields in the same order as
 * opt_tensor, opt_params, opt_state; pointers are device addresses). */
/* The dtype of a gradient the kernels read (CudaOptTensor.grad_dtype and
 * src_dtype; the kernels' OPT_G_*): f32, or the 16 bits of f16 / bf16. */
enum { CUDA_OPT_GRAD_F32 = 0, CUDA_OPT_GRAD_F16 = 1, CUDA_OPT_GRAD_BF16 = 2 };

typedef struct {
    uint64_t master;   /* float (n): f32 master weights, updated */
    uint64_t grad;     /* (n) of grad_dtype: gradient times the loss scale */
    uint64_t m, v;     /* float (n): optimizer state, 0 where not needed */
    uint64_t low;      /* f16/bf16 (n): copy written after the update, or 0 */
    int64_t n;
    int32_t decay;     /* weight decay applies to this tensor */
    uint8_t grad_dtype;   /* CUDA_OPT_GRAD_*: of grad (f32 where grad is the accumulator) */
    uint8_t src_dtype;    /* CUDA_OPT_GRAD_*: of the executor's gradient, which opt_accumulate reads */
    uint8_t pad_[2];
} CudaOptTensor;

typedef struct {
    int32_t kind;       /* SpecOptimizer */
    int32_t nesterov;
    int32_t sched_kind; /* SpecSchedule */
    int32_t ls_mode;    /* SpecLossScaling */
    double beta1, beta2, eps, weight_decay, momentum, max_grad_norm;
    double lr, min_lr_ratio;            /* schedule: runtime/train/schedule.h */
    int64_t warmup_steps, total_steps;
    double ls_growth, ls_backoff;       /* loss scaler: runtime/train/lossscale.h */
    int64_t ls_interval;
} CudaOptParams;

typedef struct {
    float scale;              /* loss scale; the loss kernels read it as dscale */
    int32_t growth_tracker;
    int32_t found_inf;        /* the last step's: 1 = skipped */
    int32_t pad_;
    int64_t step;             /* applied steps (bias correction, schedule) */
    int64_t consecutive_skips, total_skips;
    double grad_norm;         /* last step, unscaled, before clipping; inf when skipped */
    double clip_coef, lr;     /* last step */
} CudaOptState;


/* Elements per chunk (OPT_CHUNK in the kernels) and chunks per block of
 * the norm pass (OPT_CHECK_CHUNKS). */
#define CUDA_OPTIM_CHUNK 4096
#define CUDA_OPTIM_CHECK_CHUNKS 4
/* Bytes of the device step decision (opt_step, at most this). */
#define CUDA_OPTIM_DECISION_BYTES 128

/* A gradient read through its fix (device layout of the kernels'
 * opt_fix): element (r, c) of the (rows, cols) tensor is
 * raw[r ld + c] * gamma[c] + db[r db_ld] * beta[c], or raw[r ld + c] where
 * gamma is 0 (a bias gradient in raw's ones column), rounded to the
 * tensor's grad_dtype as the LN_DW_FIX kernel stores it.  raw 0: plain.
 * Pointers are device addresses: raw of the tensor's grad_dtype, db too
 * where db_low (in raw's ones column), else f32, gamma and beta f32; snap
 * is cuda_optim_plan_build's. */
typedef struct {
    uint64_t raw, gamma, beta, db, snap;
    int64_t cols, ld, db_ld;
    int32_t db_low, pad_;
} CudaOptFix;

/* One chunk: elements [begin, begin + len) of tensor `tensor` (device
 * layout of the kernels' opt_chunk). */
typedef struct {
    uint32_t tensor, len;
    uint64_t begin;
} CudaOptChunk;

/* Cuts tensors of numel[k] elements (k < count) into chunks of at most
 * CUDA_OPTIM_CHUNK, in tensor order, each starting at a multiple of
 * CUDA_OPTIM_CHUNK within its tensor; empty tensors get none.  Writes
 * chunks[] (when not NULL) and chunk_first[0..count] (when not NULL:
 * tensor k's chunks are chunk_first[k] .. chunk_first[k + 1] - 1).
 * Returns the number of chunks. */
int cuda_optim_chunks(const int64_t *numel, int count, CudaOptChunk *chunks, int *chunk_first);

/* Blocks of the norm pass (and partials) for n_chunks chunks. */
int cuda_optim_check_blocks(int n_chunks);

/* Bytes one step moves for these tensors, each element once per pass
 * (AdamW with a 16-bit copy: 34 per parameter); the profile's rate. */
double cuda_optim_step_bytes(const CudaOptTensor *t, int count, SpecOptimizer kind);

/* The kernels of one compiled module. */
typedef struct {
    CUfunction check, decide, lamb_norms, lamb_ratio, update, accumulate, mark_rows;
} CudaOptKernels;

/* The kernel names, in CudaOptKernels order. */
extern const char *const cuda_optim_kernel_names[7];

/* Looks the kernels up in a module whose source holds the optimizer block
 * (a training step's module, or compiler/emit_optim.h's module alone);
 * HPC_ERR_INPUT naming the kernel when it is missing (a step program
 * written before the optimizer joined the step module). */
HpcStatus cuda_optim_kernels(CUmodule module, CudaOptKernels *k, HpcError *err);

/* Device tables and scratch of one set of tensors. */
typedef struct {
    int count, n_chunks, parts;
    CUdeviceptr tensors;      /* (count) CudaOptTensor */
    CUdeviceptr src_grads;    /* (count) u64: the executor's gradients, for opt_accumulate; 0 if unused */
    CUdeviceptr chunks;       /* (n_chunks) CudaOptChunk */
    CUdeviceptr chunk_first;  /* (count + 1) i32 */
    CUdeviceptr state;        /* CudaOptState */
    CUdeviceptr decision;     /* CUDA_OPTIM_DECISION_BYTES */
    CUdeviceptr part_sq, part_inf;   /* (parts) f64, i32 */
    CUdeviceptr part_pu, ratio;      /* LAMB: (n_chunks, 2) f64, (count) f32; else 0 */
    CUdeviceptr poison;       /* i32: set = the next check writes +inf into the first gradient */
    CUdeviceptr fixes, snaps; /* (count) CudaOptFix and the snaps' block; 0 when no tensor is fixed */
    CudaOptParams prm;
    /* Untouched rows (cuda_optim_rows.h): live, a byte a chunk (0 unless
     * cuda_optim_plan_rows ran), and the tables opt_mark_rows marks in it
     * before each step's norm pass (none when n_rows is 0). */
    CUdeviceptr live;
    int n_rows;
    CudaOptRows rows[CUDA_OPTIM_MAX_ROW_TABLES];
} CudaOptPlan;

/* Device allocation for cuda_optim_plan_build (the arena in the trainer,
 * plain cuMemAlloc in tests/gpu). */
typedef HpcStatus (*CudaOptAlloc)(void *ctx, CUdeviceptr *p, size_t bytes, const char *what, HpcError *err);

/* Allocates the tables and scratch for t[0..count) (device pointers in t;
 * src_grads may be NULL; fixes (count, their snap ignored) NULL when no
 * gradient is read through a fix), uploads them and *init with the
 * parameters prm, zeroes poison, and waits for the stream. */
HpcStatus cuda_optim_plan_build(CudaOptPlan *p, const CudaOptTensor *t, const uint64_t *src_grads,
                                const CudaOptFix *fixes, int count, const CudaOptParams *prm,
                                const CudaOptState *init, CudaOptAlloc alloc, void *ctx, CUstream s,
                                HpcError *err);

/* Gives plan p, built for the tensors t, the tables rows[0..n) (n <=
 * CUDA_OPTIM_MAX_ROW_TABLES; tensor, ids, rows and cols set; first and n
 * are filled here) and live, every chunk marked read (queued on s). */
HpcStatus cuda_optim_plan_rows(CudaOptPlan *p, const CudaOptTensor *t, const CudaOptRows *rows, int n,
                               CudaOptAlloc alloc, void *ctx, CUstream s, HpcError *err);

/* Queues one optimizer step of plan p: [mark the rows' chunks,] check,
 * decide, [LAMB,] update; `fixed`: the tensors' gradients through the
 * plan's fixes.  Each of p->rows[0..p->n_rows) is marked from its n_ids
 * ids, which must be this step's. */
HpcStatus cuda_optim_queue_step(const CudaOptKernels *k, const CudaOptPlan *p, bool fixed, CUstream s,
                                HpcError *err);

/* Queues acc = (first ? 0 : acc) + src * mul for every tensor (acc is the
 * tensor's grad, src its src_grads entry, through the plan's fixes when
 * `fixed`). */
HpcStatus cuda_optim_queue_accumulate(const CudaOptKernels *k, const CudaOptPlan *p, float mul, int first,
                                      bool fixed, CUstream s, HpcError *err);

typedef struct CudaOptim CudaOptim;

/* What a tail needs: the optimizer and which work it queues. */
typedef struct {
    CudaOptim *o;
    int what;                     /* 0: accumulate (first), 1: accumulate, 2: [accumulate +] step */
} CudaOptTailCtx;

struct CudaOptim {
    CudaExec *ex;                 /* borrowed */
    CudaOptKernels k;
    int count;                    /* tensors updated */
    int *param;                   /* (count) ParamList index of each */
    CudaOptTensor *host_t;       /* (count) host copy of the table */
    CUdeviceptr *acc;             /* (count) f32 accumulators, 0 when grad_accum == 1 */
    CUdeviceptr m_block, v_block, acc_block;   /* one allocation each for every tensor's m, v, acc */
    CudaOptFix *host_fix;         /* (count) how each gradient is read through its fix (raw 0: plain) */
    int row_ids[CUDA_OPTIM_MAX_ROW_TABLES];   /* the ids node of each of plan.rows (cuda_optim_rows.h) */
    bool applies_fixes;           /* the tails apply the executor's trailing fixes ("Deferred fixes") */
    CudaOptPlan plan;
    int64_t grad_accum;
    CudaOptTailCtx tail_ctx[3];
    CudaExecTail tails[3];
};

/* Builds the tensor table from the executor's graph (every parameter with
 * a gradient, its 16-bit copy where the graph has one), allocates zeroed
 * m/v (as the optimizer needs), looks the kernels up in the executor's
 * module and uploads the initial state: scale from the spec's loss scaling
 * (1 for none), step 0.  policy must be the program's (PREC_FP16 and
 * PREC_BF16 graphs keep 16-bit copies).  HPC_ERR_INPUT when the module has
 * no optimizer kernels (recompile the program). */
HpcStatus cuda_optim_init(CudaOptim *o, CudaExec *ex, const ModelSpec *spec, SpecPrecision policy,
                          int64_t total_steps, HpcError *err);
void cuda_optim_free(CudaOptim *o);

/* After micro-batch `micro` (0-based) of a step: acc (=|+=) grad / A.
 * Nothing to do when grad_accum == 1. */
HpcStatus cuda_optim_accumulate(CudaOptim *o, int64_t micro, HpcError *err);

/* Queues the optimizer step (check, decide, update); no host wait. */
HpcStatus cuda_optim_step(CudaOptim *o, HpcError *err);

/* The same work as tails of cuda_exec_launch (inside the step's graph):
 * for micro-batch m < A - 1 the accumulation (NULL when A == 1); for the
 * last micro-batch its accumulation (A > 1) and then the step. */
const CudaExecTail *cuda_optim_accumulate_tail(CudaOptim *o, int64_t micro);
const CudaExecTail *cuda_optim_step_tail(CudaOptim *o);

/* Test hook: the next step's check writes +inf into element 0 of the first
 * tensor's gradient (what that step reads), so the step must be skipped.
 * Queued on the stream; works inside a graph replay. */
HpcStatus cuda_optim_poison(CudaOptim *o, HpcError *err);

/* The device loss scale (f32), for CudaRunOptions.loss_scale_dev. */
CUdeviceptr cuda_optim_scale_ptr(const CudaOptim *o);
/* The device state; a DtoD copy source for per-step snapshots. */
CUdeviceptr cuda_optim_state_ptr(const CudaOptim *o);

/* Waits for the stream and reads the state. */
HpcStatus cuda_optim_read_state(CudaOptim *o, CudaOptState *s, HpcError *err);

/* Copies parameter p's f32 master (numel floats) to host memory (waits). */
HpcStatus cuda_optim_read_master(CudaOptim *o, int p, float *out, HpcError *err);

#endif

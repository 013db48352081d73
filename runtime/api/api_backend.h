/* runtime/api/api_backend.h — inside the C API (include/hpc.h): the handle and
 * the small interface a backend implements for it.
 *
 * runtime/api/api.c owns the handle: it checks every argument (handle magic,
 * shapes against the compiled maximum, token ids, labels), turns an HpcBatch
 * into a Batch and calls the backend, which may therefore trust its input.
 * A backend keeps its state in m->impl:
 *   forward  dropout off; fills what is asked for (loss, logits, hidden may
 *            each be NULL): logits as the graph's logits value, hidden as
 *            value m->hidden_value, both f32 on the host;
 *   train    forward + backward + optimizer step with the loss scaler;
 *   get/set  parameter p's f32 master ((numel) floats); set_params resets
 *            the optimizer state and the loss scaler;
 *   close    frees m->impl.
 * Backends: cpu (runtime/api/api_cpu.c), cuda (runtime/api/api_cuda.c).
 *
 * Ownership: the handle owns the step program (graph, parameter list,
 * launch records, CUDA; compiler/step_program.h), the
 * backend state and the zero buffers that stand in for optional batch
 * fields.
 */
#ifndef HPC_RUNTIME_API_BACKEND_H
#define HPC_RUNTIME_API_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "hpc.h"
#include "data/batch.h"
#include "util/error.h"
#include "compiler/step_program.h"

#define API_MAGIC 0x48504331u  /* "HPC1"; cleared by hpc_model_free */

typedef struct {
    const char *name;
    HpcStatus (*forward)(HpcModel *m, const Batch *b, double *loss, float *logits, float *hidden,
                         HpcError *err);
    HpcStatus (*train)(HpcModel *m, const Batch *b, HpcStepReport *rep, HpcError *err);
    HpcStatus (*get_param)(HpcModel *m, int p, float *out, HpcError *err);
    HpcStatus (*set_params)(HpcModel *m, float *const *w, HpcError *err); /* (pl.n), tied entries ignored */
    void (*close)(HpcModel *m);
} ApiBackendOps;

struct HpcModel {
    uint32_t magic;
    ModelSpec spec;
    SpecPrecision policy;
    StepProgram prog;          /* graph, parameter list, launch records, CUDA */
    int hidden_value;          /* value id of the (B, L, H) head input */
    int64_t max_B, max_L, total_steps;
    int64_t steps;             /* optimizer steps applied */
    double loss_scale;         /* the scaler's scale, kept current by the backend */
    char backend_name[160];
    HpcError err;              /* the last failure; msg "" after a success */
    int32_t *zeros_i32;        /* (max_B, max_L) stand-in for NULL type ids / labels */
    float *zeros_f32;          /* (max_B) stand-in for NULL regression targets */
    const ApiBackendOps *ops;
    void *impl;
};

/* Opens the cpu backend on a handle whose program is loaded. */
HpcStatus api_cpu_open(HpcModel *m, HpcError *err);
/* Opens the cuda backend (runtime/api/api_cuda.c).  api.c references it
 * weakly, so a program that only uses the cpu backend does not link the
 * CUDA code and libraries; a program that wants the GPU links with
 * -Wl,--undefined=api_cuda_open (docs/embedding.md). */
HpcStatus api_cuda_open(HpcModel *m, const HpcModelOptions *o, HpcError *err);

/* The value id of the head's input, the last (B, L, hidden) float value of
 * the forward part before the first head node; -1 if none. */
int api_find_hidden(const IrGraph *g, int64_t hidden);

#endif

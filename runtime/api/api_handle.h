/* runtime/api/api_handle.h — inside the C API (include/hpc.h): the handle.
 *
 * runtime/api/api.c owns the handle: it checks every argument (handle magic,
 * shapes against the compiled maximum, token ids, labels), turns an HpcBatch
 * into a Batch and calls the backend, which may therefore trust its input.
 * The backend is the trainer's (runtime/train/train_backend.h): one
 * interface over the cpu and cuda executors for both the trainer and the
 * C API.  One hpc_model_train_step is one micro-batch, one optimizer step
 * and one collect of its record.
 *
 * Ownership: the handle owns the step program (graph, parameter list,
 * launch records, CUDA; program/step_program.h), the backend opened on it
 * and the zero buffers that stand in for optional batch fields.
 */
#ifndef HPC_RUNTIME_API_HANDLE_H
#define HPC_RUNTIME_API_HANDLE_H

#include <stdbool.h>
#include <stdint.h>

#include "hpc.h"
#include "data/batch.h"
#include "train/lossscale.h"
#include "train/train_backend.h"
#include "util/error.h"
#include "program/step_program.h"

#define API_MAGIC 0x48504331u  /* "HPC1"; cleared by hpc_model_free */

struct HpcModel {
    uint32_t magic;
    ModelSpec spec;            /* the program's, with the API's seed and grad_accum 1 */
    SpecPrecision policy;
    StepProgram prog;          /* graph, parameter list, launch records, CUDA (prog.spec == spec) */
    int hidden_value;          /* value id of the (B, L, H) head input */
    int64_t max_B, max_L, total_steps;
    int64_t steps;             /* optimizer steps applied (skipped ones not counted) */
    double loss_scale;         /* the scaler's scale after the last step */
    LossScaleConfig ls_cfg;    /* for the give-up check */
    char backend_name[160];
    HpcError err;              /* the last failure; msg "" after a success */
    int32_t *zeros_i32;        /* (max_B, max_L) stand-in for NULL type ids / labels */
    float *zeros_f32;          /* (max_B) stand-in for NULL regression targets */
    TrainBackend be;
    bool be_open;
};

/* The value id of the head's input, the last (B, L, hidden) float value of
 * the forward part before the first head node; -1 if none, or if the last
 * layer was lowered for token 0 only (compiler/lower.h). */
int api_find_hidden(const IrGraph *g, int64_t hidden);

#endif

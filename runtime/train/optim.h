/* runtime/train/optim.h — the fused multi-tensor optimizer step (the CPU
 * reference of the CUDA kernel).
 *
 * One call updates every parameter tensor of the model:
 *   1. non-finite check: if any grad element is inf/NaN, nothing is written
 *      (master, m, v, low, state->step all untouched), found_inf = true;
 *   2. unscale: g = grad * inv_scale (grad still carries the loss scale);
 *   3. global L2 norm over all tensors of the unscaled g (in f64);
 *      clipping as torch.nn.utils.clip_grad_norm_: if max_grad_norm > 0,
 *      coef = max_grad_norm / (norm + 1e-6), applied only if coef < 1;
 *   4. the update (state->step is incremented first, so t = 1 on the first
 *      applied step; t drives bias correction):
 *      AdamW (torch.optim.AdamW): p -= lr*wd*p; m = b1 m + (1-b1) g;
 *            v = b2 v + (1-b2) g^2; p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)
 *      Adam  (torch.optim.Adam): g += wd*p, then the same moments and update
 *      SGD   (torch.optim.SGD): g += wd*p; if momentum: buf = momentum*buf + g
 *            (buf = g on the first step), g = nesterov ? g + momentum*buf : buf;
 *            p -= lr*g.  State: m is the momentum buffer (NULL if momentum 0)
 *      LAMB  (You et al. 2019): Adam moments with bias correction,
 *            u = mhat/(sqrt(vhat)+eps) + wd*p (decoupled decay inside the update),
 *            r = ||p|| / ||u|| per tensor (1 if either is 0), p -= lr * r * u
 *      Weight decay applies only where OptimTensor.decay is true.
 *   5. the low-precision copy: low[i] = fp16/bf16 of the new master[i]
 *      (cfg->low_dtype), if low is not NULL.
 *      LAMB's trust ratio applies to every tensor, decayed or not.
 * Storage is f32 as in PyTorch's fp32 kernels; each element's update is
 * evaluated in f64 and rounded once when stored, and norms are accumulated
 * in f64, so the result is within f32 rounding of the formulas above (the
 * CUDA kernel, computing in f32, agrees to a few ulp per step).
 * On a skipped step report->grad_norm is +inf and clip_coef 1.
 * The caller zeroes m and v before the first step (as torch does); SGD's
 * momentum buffer is overwritten by the first step whatever it holds.
 * The caller owns all buffers; nothing is allocated.
 */
#ifndef HPC_RUNTIME_OPTIM_H
#define HPC_RUNTIME_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "program/spec.h"

typedef struct {
    float *master;    /* (n) f32 master weights, updated in place */
    const float *grad;/* (n) f32 gradient, still multiplied by the loss scale */
    float *m, *v;     /* (n) f32 state (NULL where the optimizer needs none) */
    uint16_t *low;    /* (n) fp16/bf16 copy written after the update, or NULL */
    int64_t n;
    bool decay;       /* weight decay applies (false for biases and LayerNorm, as HF does) */
} OptimTensor;
typedef struct { SpecOptimizer kind; double beta1, beta2, eps, weight_decay, momentum; bool nesterov;
                 double max_grad_norm; SpecPrecision low_dtype; /* PREC_FP16/PREC_BF16 for the copy */ } OptimConfig;
typedef struct { int64_t step; } OptimState;   /* applied steps so far (bias correction); skipped steps do not count */
typedef struct { bool found_inf; double grad_norm; double clip_coef; } OptimReport;

/* low_dtype is PREC_FP16 from the spec; the trainer sets it from the policy. */
void optim_config_from_spec(OptimConfig *cfg, const SpecTraining *train);
/* If any grad is inf/NaN: changes nothing, report->found_inf = true. Otherwise unscales by inv_scale,
   computes the global L2 norm, clips to max_grad_norm (if > 0), updates master/m/v/low with learning
   rate lr, and increments state->step.  report->grad_norm is the unscaled norm before clipping,
   report->clip_coef the factor applied (1 when no clipping happened). */
void optim_step(const OptimConfig *cfg, OptimState *state, OptimTensor *tensors, int count,
                float inv_scale, double lr, OptimReport *report);

/* optim_step in two halves, for data-parallel runs whose ranks each hold part
 * of the tensors (runtime/dist/dp_optim.h) and must agree before updating:
 * optim_scan tells whether any unscaled gradient is inf/NaN and, if none, the
 * sum of squares of the unscaled gradient (f64); optim_apply makes the update
 * of step 4 with the global norm `grad_norm` (clipping from it), incrementing
 * state->step.  optim_step = scan, then apply unless found_inf. */
void optim_scan(const OptimTensor *tensors, int count, float inv_scale, bool *found_inf, double *sumsq);
void optim_apply(const OptimConfig *cfg, OptimState *state, OptimTensor *tensors, int count,
                 float inv_scale, double lr, double grad_norm, OptimReport *report);
/* True if the optimizer keeps a second moment v (adam, adamw, lamb); m is
 * needed by those and by sgd with momentum != 0. */
bool optim_needs_m(const OptimConfig *cfg);
bool optim_needs_v(const OptimConfig *cfg);

#endif

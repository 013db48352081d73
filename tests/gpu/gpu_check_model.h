/* tests/gpu/gpu_check_model.h — the model-level data the GPU step tests
 * share (gpu_step, gpu_attention_step, gpu_fuse, gpu_bgrad): random
 * parameters, a random padded classifier batch and the gradient-norm floor.
 *
 * Promises:
 *   - gpu_check_random_params(pl, prec, uniform): every untied parameter
 *     drawn from the caller's uniform() in [-1, 1): LayerNorm gamma
 *     1 +- 0.1, zero-initialised tensors (biases, beta) +- 0.02, weights
 *     +- 0.0346 (std 0.02), then rounded to prec so the cpu's f32 masters
 *     equal the GPU's low copies; tied entries share their target's array.
 *     The draws come in parameter order, element order: a fixed seed gives
 *     the same weights as the copies this replaced;
 *   - gpu_check_random_batch(s, B, L, labels, rnd): rows of random length in
 *     [L/2, L] (padded after), ids in [1, vocab), and with labels set a
 *     class in [0, num_labels) per row;
 *   - gpu_check_load_model(file, s): models/FILE under $HPC_ROOT (or the
 *     working directory) into *s, or a failed check naming the path;
 *   - gpu_check_free_params(pl, w): frees what gpu_check_random_params made;
 *   - gpu_check_max_grad_norm(g, cx): the largest L2 norm of a parameter
 *     gradient on the cpu executor (the step tests take 1e-3 of it as the
 *     floor of their relative errors).
 * Static functions; include after gpu_check.h in a test's .c. */
#ifndef HPC_TESTS_GPU_CHECK_MODEL_H
#define HPC_TESTS_GPU_CHECK_MODEL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "cpu/cpu_exec.h"
#include "cpu/half.h"
#include "data/batch.h"
#include "util/error.h"
#include "program/ir.h"
#include "program/params.h"
#include "program/spec.h"
#include "compiler/spec_load.h"

static inline float **gpu_check_random_params(const ParamList *pl, SpecPrecision prec, float (*uniform)(void))
{
    float **w = xcalloc((size_t)pl->n, sizeof *w);
    for (int q = 0; q < pl->n; q++) {
        const ParamInfo *p = &pl->p[q];
        if (p->tied_to >= 0) continue;
        int64_t n = params_numel(p);
        w[q] = xmalloc((size_t)n * sizeof **w);
        for (int64_t i = 0; i < n; i++) {
            float u = uniform();
            w[q][i] = p->init == PARAM_INIT_ONES ? 1.0f + 0.1f * u
                    : p->init == PARAM_INIT_ZEROS ? 0.02f * u : 0.0346f * u;
        }
        prec_round_array(prec, w[q], n);
    }
    for (int q = 0; q < pl->n; q++)
        if (pl->p[q].tied_to >= 0) w[q] = w[pl->p[q].tied_to];
    return w;
}

static inline void gpu_check_free_params(const ParamList *pl, float **w)
{
    for (int q = 0; q < pl->n; q++)
        if (pl->p[q].tied_to < 0) free(w[q]);
    free(w);
}

static inline bool gpu_check_load_model(const char *file, ModelSpec *s)
{
    const char *root = getenv("HPC_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/models/%s", root ? root : ".", file);
    if (spec_load(path, s, stderr) == 0) return true;
    result(0, "cannot load %s (run from the repository root or set HPC_ROOT)", path);
    return false;
}

static inline Batch *gpu_check_random_batch(const ModelSpec *s, int64_t B, int64_t L, bool labels,
                                            uint32_t (*rnd)(void))
{
    Batch *b = batch_new(B, L, 0);
    for (int64_t r = 0; r < B; r++) {
        int64_t len = L / 2 + (int64_t)(rnd() % (uint32_t)(L / 2 + 1));
        for (int64_t t = 0; t < L; t++) {
            int64_t i = r * L + t;
            b->input_ids[i] = t < len ? (int32_t)(1 + rnd() % (uint32_t)(s->stack.vocab_size - 1)) : 0;
            b->attention_mask[i] = t < len;
        }
        if (labels) b->labels[r] = (int32_t)(rnd() % (uint32_t)s->head.num_labels);
    }
    return b;
}

static inline double gpu_check_max_grad_norm(const IrGraph *g, const CpuExec *cx)
{
    double m = 0;
    for (int p = 0; p < g->n_params; p++) {
        int v = g->param_grad[p];
        if (v < 0) continue;
        const float *x = cpu_exec_value(cx, v);
        double s = 0;
        for (int64_t i = 0; i < cpu_exec_numel(cx, v); i++) s += (double)x[i] * x[i];
        m = fmax(m, sqrt(s));
    }
    return m;
}

#endif

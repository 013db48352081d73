/* tests/cpu_step.h — one training step of a graph on the cpu executor, for
 * the tests that compare two graphs or two plans on the same weights and
 * batch (tests/test_fuse.c, tests/test_fuse_accum.c).  Header-only (static inline
 * functions, Criterion asserts): each test is its own program.
 *
 * Weights come as doubles, one array per parameter (tied parameters share
 * their owner's); the f64 executor takes them as they are, the f32 one a
 * float copy.  The step runs in training mode with the backward pass,
 * dropout seed 77 and step 3, so two graphs of one model draw the same
 * masks (cpu_step_run_dropout: with dropout off too; tests/test_pack.c).  StepOut holds the loss and every parameter gradient as doubles
 * (NULL where a parameter has none).  cpu_step_run_f32 is the same step for
 * tests whose weights are floats already (tests/test_fuse_ln.c,
 * tests/test_ln_xhat.c): the f32 executor, gradients as floats.
 * cpu_step_padded_batch is the padded batch tests/test_attention_step.c and
 * tests/test_first_token.c run. */
#ifndef HPC_TESTS_CPU_STEP_H
#define HPC_TESTS_CPU_STEP_H

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_exec.h"
#include "cpu/philox.h"
#include "data/batch.h"
#include "program/ir.h"
#include "program/params.h"

typedef struct {
    double loss;
    double **grad;   /* (n) NULL where none */
    int n;
} StepOut;

/* Random weights for every parameter (f64), uniform in [-scale, scale)
 * from Philox stream `seed`; LayerNorm gammas around 1.  Tied parameters
 * point at their owner's array (free with cpu_step_free_weights). */
static inline double **cpu_step_random_weights(const ParamList *pl, uint64_t seed, double scale)
{
    double **w = calloc((size_t)pl->n, sizeof *w);
    uint64_t ctr = 0;
    for (int i = 0; i < pl->n; i++) {
        const ParamInfo *p = &pl->p[i];
        if (p->tied_to >= 0) continue;
        int64_t n = params_numel(p);
        bool gamma = strstr(p->name, "LayerNorm.weight") || strstr(p->name, "gamma");
        w[i] = malloc((size_t)n * sizeof(double));
        for (int64_t k = 0; k < n; k++)
            w[i][k] = (gamma ? 1.0 : 0.0) + scale * (2.0 * philox_uniform(seed, ctr++, 0, 99) - 1.0);
    }
    for (int i = 0; i < pl->n; i++)
        if (pl->p[i].tied_to >= 0) w[i] = w[pl->p[i].tied_to];
    return w;
}

static inline void cpu_step_free_weights(const ParamList *pl, double **w)
{
    for (int i = 0; i < pl->n; i++)
        if (pl->p[i].tied_to < 0) free(w[i]);
    free(w);
}

/* B rows of length L for a sequence-classification head: row r has
 * L - 3r real tokens (at least 1; row 0 unpadded), ids from Philox stream 7
 * in [0, vocab), token type 1 from position 3 on, label r % classes. */
static inline Batch *cpu_step_padded_batch(int B, int L, int vocab, int classes)
{
    Batch *b = batch_new(B, L, 1);
    for (int r = 0; r < B; r++) {
        int len = L - 3 * r > 1 ? L - 3 * r : 1;
        for (int t = 0; t < L; t++) {
            int i = r * L + t;
            bool real = t < len;
            b->input_ids[i] = real ? (int)(philox_uniform(7, (uint64_t)i, 0, 1) * vocab) : 0;
            b->token_type_ids[i] = real && t >= 3;
            b->attention_mask[i] = real;
        }
        b->labels[r] = r % classes;
    }
    return b;
}

/* Binds w to ex; returns the float copies to free with cpu_step_unbind
 * (all NULL for the f64 executor). */
static inline float **cpu_step_bind(CpuExec *ex, const ParamList *pl, double **w, CpuExecPrecision prec)
{
    float **wf = calloc((size_t)pl->n, sizeof *wf);
    for (int p = 0; p < pl->n; p++) {
        if (pl->p[p].tied_to >= 0) continue;
        if (prec == CPU_EXEC_F64) {
            cpu_exec_bind_param(ex, p, w[p]);
            continue;
        }
        int64_t n = params_numel(&pl->p[p]);
        wf[p] = malloc((size_t)n * sizeof(float));
        for (int64_t k = 0; k < n; k++) wf[p][k] = (float)w[p][k];
        cpu_exec_bind_param(ex, p, wf[p]);
    }
    return wf;
}

static inline void cpu_step_unbind(const ParamList *pl, float **wf)
{
    for (int p = 0; p < pl->n; p++) free(wf[p]);
    free(wf);
}

/* The step itself: training (dropout on) or not, backward, the tests'
 * fixed seed and step. */
static inline void cpu_step_exec(CpuExec *ex, const Batch *b, double loss_scale, bool training)
{
    CpuRunOptions o = {.training = training, .backward = true, .seed = 77, .step = 3, .loss_scale = loss_scale};
    HpcError err = {0};
    cr_assert_eq(cpu_exec_run(ex, b, &o, &err), HPC_OK, "cpu_exec_run: %s", err.msg);
}

/* cpu_step_run with dropout on (training) or off. */
static inline StepOut cpu_step_run_dropout(const IrGraph *g, const ParamList *pl, double **w, CpuExecPrecision prec,
                                           CpuExecMode mode, double loss_scale, const Batch *b, bool training)
{
    CpuExec ex;
    cpu_exec_init(&ex, g, prec);
    cpu_exec_set_mode(&ex, mode);
    float **wf = cpu_step_bind(&ex, pl, w, prec);
    cpu_step_exec(&ex, b, loss_scale, training);
    StepOut s = {cpu_exec_loss(&ex), calloc((size_t)pl->n, sizeof(double *)), pl->n};
    for (int p = 0; p < pl->n; p++) {
        int gv = g->param_grad[p];
        if (gv < 0) continue;
        int64_t n = params_numel(&pl->p[p]);
        s.grad[p] = malloc((size_t)n * sizeof(double));
        const void *v = cpu_exec_value(&ex, gv);
        for (int64_t k = 0; k < n; k++)
            s.grad[p][k] = prec == CPU_EXEC_F64 ? ((const double *)v)[k] : ((const float *)v)[k];
    }
    cpu_step_unbind(pl, wf);
    cpu_exec_free(&ex);
    return s;
}

static inline StepOut cpu_step_run(const IrGraph *g, const ParamList *pl, double **w, CpuExecPrecision prec,
                                   CpuExecMode mode, double loss_scale, const Batch *b)
{
    return cpu_step_run_dropout(g, pl, w, prec, mode, loss_scale, b, true);
}

static inline void step_free(StepOut *s)
{
    for (int p = 0; p < s->n; p++) free(s->grad[p]);
    free(s->grad);
}

typedef struct {
    double loss;
    float **grad;    /* (n) NULL where none */
    int n;
} StepOutF32;

/* The step on the f32 executor with float weights w (tied parameters
 * skipped), dropout on (training) or off; gradients copied out as floats. */
static inline StepOutF32 cpu_step_run_f32(const IrGraph *g, const ParamList *pl, float **w, const Batch *b,
                                         bool training)
{
    CpuExec ex;
    cpu_exec_init(&ex, g, CPU_EXEC_F32);
    for (int p = 0; p < pl->n; p++)
        if (pl->p[p].tied_to < 0) cpu_exec_bind_param(&ex, p, w[p]);
    cpu_step_exec(&ex, b, 1, training);
    StepOutF32 s = {cpu_exec_loss(&ex), calloc((size_t)pl->n, sizeof(float *)), pl->n};
    for (int p = 0; p < pl->n; p++) {
        int gv = g->param_grad[p];
        if (gv < 0) continue;
        int64_t n = params_numel(&pl->p[p]);
        s.grad[p] = malloc((size_t)n * sizeof(float));
        memcpy(s.grad[p], cpu_exec_value(&ex, gv), (size_t)n * sizeof(float));
    }
    cpu_exec_free(&ex);
    return s;
}

static inline void step_free_f32(StepOutF32 *s)
{
    for (int p = 0; p < s->n; p++) free(s->grad[p]);
    free(s->grad);
}

#endif

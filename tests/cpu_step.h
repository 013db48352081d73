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
 * tests/test_first_token.c run, cpu_step_packed_batch its rows packed; cpu_step_tiny_spec the bert_tiny-shaped
 * model and cpu_step_worst_rel the comparison of two steps that
 * tests/test_first_token.c and tests/test_fuse_embed.c share;
 * cpu_step_load_model loads one of models/ for the tests that build a real
 * model's graph. */
#ifndef HPC_TESTS_CPU_STEP_H
#define HPC_TESTS_CPU_STEP_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_exec.h"
#include "cpu/philox.h"
#include "data/batch.h"
#include "program/ir.h"
#include "program/params.h"
#include "program/spec.h"
#include "compiler/spec_load.h"

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

/* cpu_step_padded_batch(B, L, ...)'s rows packed back to back
 * (docs/packing.md): the same real tokens, types and labels, sequence r at
 * flat slot start_r, L' = ceil(tokens / B) slots a row, the tail padding. */
static inline Batch *cpu_step_packed_batch(int B, int L, int vocab, int classes)
{
    Batch *pad = cpu_step_padded_batch(B, L, vocab, classes);
    int64_t tokens = 0;
    for (int r = 0; r < B; r++)
        for (int t = 0; t < L; t++) tokens += pad->attention_mask[r * L + t] != 0;
    Batch *b = batch_new_packed(B, (tokens + B - 1) / B, 1);
    int64_t at = 0;
    for (int r = 0; r < B; r++) {
        b->seq_spans[2 * r] = (int32_t)at;
        for (int t = 0; t < L && pad->attention_mask[r * L + t]; t++, at++) {
            b->input_ids[at] = pad->input_ids[r * L + t];
            b->token_type_ids[at] = pad->token_type_ids[r * L + t];
            b->attention_mask[at] = 1;
        }
        b->seq_spans[2 * r + 1] = (int32_t)(at - b->seq_spans[2 * r]);
        b->labels[r] = pad->labels[r];
    }
    batch_free(pad);
    return b;
}

/* models/FILE (under $HPC_ROOT, else the current directory) into s; the
 * test stops if it does not load. */
static inline void cpu_step_load_model(const char *file, ModelSpec *s)
{
    const char *root = getenv("HPC_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/models/%s", root ? root : ".", file);
    cr_assert_eq(spec_load(path, s, stderr), 0, "cannot load %s", path);
}

/* A bert_tiny-shaped classifier: hidden 32, 2 heads, 2 layers, ffn 64,
 * LayerNorm eps 1e-5, `vocab` tokens, `positions` positions, `classes` labels. */
static inline void cpu_step_tiny_spec(ModelSpec *s, const char *name, int vocab, int positions, int classes)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->stack.vocab_size = vocab;
    s->stack.max_positions = positions;
    s->stack.hidden = 32;
    s->stack.heads = 2;
    s->stack.layers = 2;
    s->stack.ffn = 64;
    s->stack.ln_eps = 1e-5;
    s->head.num_labels = classes;
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


/* Worst relative L2 error over the loss and every gradient of b against
 * a (NaN is the worst); a gradient's norm is floored at 1e-3 of the
 * largest one's (the key bias gradient is zero in exact arithmetic:
 * softmax ignores a shift of its row, so both steps hold rounding noise
 * there).  *which names the worst, *compared counts the nonzero gradients;
 * a gradient in one step only fails. */
static inline double cpu_step_worst_rel(const StepOut *a, const StepOut *b, const ParamList *pl, const char **which,
                                        int *compared)
{
    double worst = fabs(a->loss - b->loss) / fabs(a->loss), largest = 0;
    *which = "loss";
    *compared = 0;
    for (int q = 0; q < pl->n; q++) {
        double den = 0;
        for (int64_t k = 0; a->grad[q] && k < params_numel(&pl->p[q]); k++) den += a->grad[q][k] * a->grad[q][k];
        largest = fmax(largest, sqrt(den));
    }
    for (int q = 0; q < pl->n; q++) {
        if (!a->grad[q]) {
            cr_expect(!b->grad[q], "%s: a gradient in one step only", pl->p[q].name);
            continue;
        }
        cr_expect(b->grad[q] != NULL, "%s: a gradient in one step only", pl->p[q].name);
        if (!b->grad[q]) continue;
        double num = 0, den = 0;
        for (int64_t k = 0; k < params_numel(&pl->p[q]); k++) {
            double d = b->grad[q][k] - a->grad[q][k];
            num += d * d;
            den += a->grad[q][k] * a->grad[q][k];
        }
        double e = sqrt(num) / fmax(sqrt(den), 1e-3 * largest);
        *compared += den > 0;
        if (!(e <= worst)) {
            worst = e;
            *which = pl->p[q].name;
        }
    }
    return worst;
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

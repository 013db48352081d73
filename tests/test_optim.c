/* tests/test_optim.c — the fused optimizer step against plain per-tensor
 * references written here from the PyTorch docs / the LAMB paper (in f64),
 * over several steps and several tensors of odd sizes, with weight decay,
 * bias correction and gradient clipping; and the skipped step, which must
 * leave every byte of the state as it was. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/half.h"
#include "train/lossscale.h"
#include "train/optim.h"

#define NT 4
static const int64_t sizes[NT] = {1, 7, 33, 130};
static const bool decays[NT] = {true, false, true, true};
#define LOSS_SCALE 1024.0f   /* a power of two: grad/scale*scale is exact */

typedef struct {
    float master[NT][130], m[NT][130], v[NT][130];
    uint16_t low[NT][130];
    float grad[NT][130];
    double rp[NT][130], rm[NT][130], rv[NT][130];   /* reference state in f64 */
    OptimTensor t[NT];
} Model;

static uint64_t rng = 1;

static double uniform(void)   /* in [-1, 1) */
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * 0x1p-52 - 1.0;
}

static void model_init(Model *md, bool with_low)
{
    memset(md, 0, sizeof *md);
    for (int k = 0; k < NT; k++) {
        for (int64_t i = 0; i < sizes[k]; i++) {
            md->master[k][i] = (float)(0.5 * uniform());
            md->rp[k][i] = md->master[k][i];
        }
        md->t[k] = (OptimTensor){ md->master[k], md->grad[k], md->m[k], md->v[k],
                                  with_low ? md->low[k] : NULL, sizes[k], decays[k] };
    }
}

/* New random gradients for a step, multiplied by the loss scale as the
 * backward pass leaves them; grows with the step so clipping kicks in
 * on some steps and not on others. */
static void model_new_grads(Model *md, int step)
{
    double amp = 0.05 * (1 + 3 * (step % 3));
    for (int k = 0; k < NT; k++)
        for (int64_t i = 0; i < sizes[k]; i++)
            md->grad[k][i] = (float)(amp * uniform()) * LOSS_SCALE;
}

static double ref_grad(const Model *md, int k, int64_t i)
{
    return (double)md->grad[k][i] / LOSS_SCALE;
}

static double ref_clip_coef(const Model *md, double max_norm, double *norm_out)
{
    double s = 0;
    for (int k = 0; k < NT; k++)
        for (int64_t i = 0; i < sizes[k]; i++) s += ref_grad(md, k, i) * ref_grad(md, k, i);
    double norm = sqrt(s), coef = max_norm / (norm + 1e-6);
    *norm_out = norm;
    return (max_norm > 0 && coef < 1) ? coef : 1.0;
}

/* One reference step of the optimizer in cfg, straight from the formulas,
 * in f64 from the f32 state of the previous step. */
static void ref_step(Model *md, const OptimConfig *c, int t, double lr, double coef)
{
    double bc1 = 1 - pow(c->beta1, t), bc2 = 1 - pow(c->beta2, t);
    for (int k = 0; k < NT; k++) {
        double wd = decays[k] ? c->weight_decay : 0, pn = 0, un = 0;
        double *p = md->rp[k], *m = md->rm[k], *v = md->rv[k];
        double u[130];
        for (int64_t i = 0; i < sizes[k]; i++) {
            double g = ref_grad(md, k, i) * coef;
            switch (c->kind) {
            case OPT_ADAMW:                          /* torch.optim.AdamW */
                p[i] -= lr * wd * p[i];
                m[i] = c->beta1 * m[i] + (1 - c->beta1) * g;
                v[i] = c->beta2 * v[i] + (1 - c->beta2) * g * g;
                p[i] -= lr * (m[i] / bc1) / (sqrt(v[i] / bc2) + c->eps);
                break;
            case OPT_ADAM:                           /* torch.optim.Adam, L2 */
                g += wd * p[i];
                m[i] = c->beta1 * m[i] + (1 - c->beta1) * g;
                v[i] = c->beta2 * v[i] + (1 - c->beta2) * g * g;
                p[i] -= lr * (m[i] / bc1) / (sqrt(v[i] / bc2) + c->eps);
                break;
            case OPT_SGD: {                          /* torch.optim.SGD */
                g += wd * p[i];
                double d = g;
                if (c->momentum != 0) {
                    m[i] = t == 1 ? g : c->momentum * m[i] + g;
                    d = c->nesterov ? g + c->momentum * m[i] : m[i];
                }
                p[i] -= lr * d;
                break;
            }
            case OPT_LAMB:                           /* You et al., Algorithm 2 */
                m[i] = c->beta1 * m[i] + (1 - c->beta1) * g;
                v[i] = c->beta2 * v[i] + (1 - c->beta2) * g * g;
                u[i] = (m[i] / bc1) / (sqrt(v[i] / bc2) + c->eps) + wd * p[i];
                pn += p[i] * p[i];
                un += u[i] * u[i];
                break;
            }
        }
        if (c->kind == OPT_LAMB) {
            double r = (pn > 0 && un > 0) ? sqrt(pn) / sqrt(un) : 1.0;
            for (int64_t i = 0; i < sizes[k]; i++) p[i] -= lr * r * u[i];
        }
        /* PyTorch keeps weights and moments in f32 tensors between steps;
         * without this, a moment that cancels to near 0 would carry an f64
         * history no f32 optimizer can match. */
        for (int64_t i = 0; i < sizes[k]; i++) {
            p[i] = (float)p[i];
            m[i] = (float)m[i];
            v[i] = (float)v[i];
        }
    }
}

/* |got - want| <= 1e-6 * max(|want|, |prev|, 1e-3 * max|want| over the
 * array): relative error, judged against the larger of the value and its
 * value before the step (prev, may be NULL), so that an update that
 * cancels a weight to near 0 (p - lr*d with p ~ lr*d) is measured against
 * the size of its terms, as f32 arithmetic can only be. */
static void expect_close(const float *got, const double *want, const double *prev, int64_t n,
                         const char *what, int step)
{
    double big = 0;
    for (int64_t i = 0; i < n; i++) big = fmax(big, fabs(want[i]));
    for (int64_t i = 0; i < n; i++) {
        double den = fmax(fmax(fabs(want[i]), prev ? fabs(prev[i]) : 0.0), 1e-3 * big);
        double err = fabs((double)got[i] - want[i]) / (den > 0 ? den : 1);
        cr_assert(err <= 1e-6, "%s[%lld] step %d: got %.9g want %.9g (rel %.3g)",
                  what, (long long)i, step, got[i], want[i], err);
    }
}

static OptimConfig config(SpecOptimizer kind, double wd, double max_norm)
{
    return (OptimConfig){ .kind = kind, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                          .weight_decay = wd, .momentum = 0.9, .nesterov = false,
                          .max_grad_norm = max_norm, .low_dtype = PREC_FP16 };
}

static void run_against_reference(OptimConfig c, int steps)
{
    static Model md;
    model_init(&md, true);
    OptimState st = {0};
    int clipped = 0;
    for (int s = 1; s <= steps; s++) {
        double lr = 1e-2 * (1.0 + 0.1 * s);   /* the lr may change every step */
        model_new_grads(&md, s);
        double norm;
        double coef = ref_clip_coef(&md, c.max_grad_norm, &norm);
        clipped += coef < 1;
        OptimReport rep;
        optim_step(&c, &st, md.t, NT, 1.0f / LOSS_SCALE, lr, &rep);
        cr_assert(!rep.found_inf);
        cr_assert_eq(st.step, s);
        cr_assert(fabs(rep.grad_norm - norm) <= 1e-9 * norm, "norm %.12g vs %.12g", rep.grad_norm, norm);
        cr_assert(fabs(rep.clip_coef - coef) <= 1e-6 * coef, "coef %.9g vs %.9g", rep.clip_coef, coef);
        static double prev_p[NT][130], prev_m[NT][130], prev_v[NT][130];
        memcpy(prev_p, md.rp, sizeof prev_p);
        memcpy(prev_m, md.rm, sizeof prev_m);
        memcpy(prev_v, md.rv, sizeof prev_v);
        ref_step(&md, &c, s, lr, coef);
        for (int k = 0; k < NT; k++) {
            expect_close(md.master[k], md.rp[k], prev_p[k], sizes[k], "master", s);
            if (optim_needs_m(&c)) expect_close(md.m[k], md.rm[k], prev_m[k], sizes[k], "m", s);
            if (optim_needs_v(&c)) expect_close(md.v[k], md.rv[k], prev_v[k], sizes[k], "v", s);
            for (int64_t i = 0; i < sizes[k]; i++)
                cr_assert_eq(md.low[k][i], half_from_f32(md.master[k][i]), "low copy [%d][%lld]", k, (long long)i);
        }
    }
    if (c.max_grad_norm > 0) cr_expect(clipped > 0 && clipped < steps, "clipped on %d of %d steps", clipped, steps);
}

Test(optim, adamw_matches_reference)     { run_against_reference(config(OPT_ADAMW, 0.01, 0), 6); }
Test(optim, adamw_clipped)               { run_against_reference(config(OPT_ADAMW, 0.1, 1.0), 6); }
Test(optim, adam_l2_matches_reference)   { run_against_reference(config(OPT_ADAM, 0.01, 1.0), 6); }
Test(optim, sgd_plain)                   { OptimConfig c = config(OPT_SGD, 0.0, 0); c.momentum = 0; run_against_reference(c, 6); }
Test(optim, sgd_momentum_l2_clipped)     { run_against_reference(config(OPT_SGD, 1e-3, 1.0), 6); }
Test(optim, sgd_first_step_overwrites_buffer)
{
    /* torch sets buf = g on the first step, whatever the buffer held */
    static Model md;
    model_init(&md, false);
    for (int k = 0; k < NT; k++)
        for (int64_t i = 0; i < sizes[k]; i++) md.m[k][i] = 123.0f;
    OptimConfig c = config(OPT_SGD, 1e-3, 0);
    OptimState st = {0};
    OptimReport rep;
    model_new_grads(&md, 1);
    optim_step(&c, &st, md.t, NT, 1.0f / LOSS_SCALE, 0.1, &rep);
    ref_step(&md, &c, 1, 0.1, 1.0);
    for (int k = 0; k < NT; k++) {
        expect_close(md.master[k], md.rp[k], NULL, sizes[k], "master", 1);
        expect_close(md.m[k], md.rm[k], NULL, sizes[k], "m", 1);
    }
}
Test(optim, sgd_nesterov)                { OptimConfig c = config(OPT_SGD, 1e-3, 0); c.nesterov = true; run_against_reference(c, 6); }
Test(optim, lamb_matches_reference)      { run_against_reference(config(OPT_LAMB, 0.01, 1.0), 6); }

Test(optim, lamb_trust_ratio_one_for_zero_weights)
{
    static Model md;
    model_init(&md, false);
    for (int k = 0; k < NT; k++) {
        memset(md.master[k], 0, sizeof md.master[k]);
        memset(md.rp[k], 0, sizeof md.rp[k]);
    }
    OptimConfig c = config(OPT_LAMB, 0.01, 0);
    OptimState st = {0};
    OptimReport rep;
    model_new_grads(&md, 1);
    optim_step(&c, &st, md.t, NT, 1.0f / LOSS_SCALE, 1e-3, &rep);
    ref_step(&md, &c, 1, 1e-3, 1.0);
    for (int k = 0; k < NT; k++) expect_close(md.master[k], md.rp[k], NULL, sizes[k], "master", 1);
    /* ||p|| = 0 -> ratio 1: the first Adam step moves each weight by ~lr */
    cr_expect(fabs(fabs(md.master[3][5]) - 1e-3) < 1e-5, "%g", md.master[3][5]);
}

Test(optim, bf16_low_copy)
{
    static Model md;
    model_init(&md, true);
    OptimConfig c = config(OPT_ADAMW, 0.01, 0);
    c.low_dtype = PREC_BF16;
    OptimState st = {0};
    OptimReport rep;
    model_new_grads(&md, 1);
    optim_step(&c, &st, md.t, NT, 1.0f / LOSS_SCALE, 1e-3, &rep);
    for (int k = 0; k < NT; k++)
        for (int64_t i = 0; i < sizes[k]; i++) cr_assert_eq(md.low[k][i], bf16_from_f32(md.master[k][i]));
}

/* Snapshot of everything a step may write. */
typedef struct { Model md; OptimState st; } Snapshot;

static void expect_unchanged(const Snapshot *a, const Model *md, const OptimState *st)
{
    cr_expect_eq(memcmp(a->md.master, md->master, sizeof md->master), 0, "master changed");
    cr_expect_eq(memcmp(a->md.m, md->m, sizeof md->m), 0, "m changed");
    cr_expect_eq(memcmp(a->md.v, md->v, sizeof md->v), 0, "v changed");
    cr_expect_eq(memcmp(a->md.low, md->low, sizeof md->low), 0, "low copy changed");
    cr_expect_eq(a->st.step, st->step, "step count changed");
}

static void check_skip(SpecOptimizer kind, float bad, int where_k, int64_t where_i, float inv_scale)
{
    static Model md;
    static Snapshot snap;
    model_init(&md, true);
    OptimConfig c = config(kind, 0.01, 1.0);
    OptimState st = {0};
    OptimReport rep;
    LossScaleConfig lc;
    ls_config_default(&lc);
    LossScaler ls;
    ls_init(&ls, &lc);
    for (int s = 1; s <= 3; s++) {       /* some real state first */
        model_new_grads(&md, s);
        optim_step(&c, &st, md.t, NT, 1.0f / LOSS_SCALE, 1e-2, &rep);
        cr_assert(!ls_update(&ls, rep.found_inf));
    }
    model_new_grads(&md, 4);
    md.grad[where_k][where_i] = bad;
    memcpy(&snap.md, &md, sizeof md);
    snap.st = st;
    optim_step(&c, &st, md.t, NT, inv_scale, 1e-2, &rep);
    cr_expect(rep.found_inf);
    cr_expect(ls_update(&ls, rep.found_inf), "the step must be skipped");
    cr_expect_eq(ls.scale, 32768.0, "only the scale changes");
    expect_unchanged(&snap, &md, &st);
    /* the next clean step proceeds from the untouched state as step 4 */
    model_new_grads(&md, 5);
    optim_step(&c, &st, md.t, NT, 1.0f / LOSS_SCALE, 1e-2, &rep);
    cr_expect(!rep.found_inf);
    cr_expect_eq(st.step, 4);
}

Test(optim, skip_on_inf_adamw)      { check_skip(OPT_ADAMW, INFINITY, 3, 129, 1.0f / LOSS_SCALE); }
Test(optim, skip_on_nan_sgd)        { check_skip(OPT_SGD, NAN, 0, 0, 1.0f / LOSS_SCALE); }
Test(optim, skip_on_neg_inf_lamb)   { check_skip(OPT_LAMB, -INFINITY, 1, 3, 1.0f / LOSS_SCALE); }
Test(optim, skip_on_nan_adam)       { check_skip(OPT_ADAM, NAN, 2, 32, 1.0f / LOSS_SCALE); }
/* finite in the buffer, inf once unscaled (a scale under 1 makes inv_scale > 1) */
Test(optim, skip_when_unscale_overflows) { check_skip(OPT_ADAMW, 3e38f, 2, 10, 4.0f); }

Test(optim, scale_invariance)
{
    /* a power-of-two loss scale is exact: scaled grads with inv_scale give
     * bit-identical results to unscaled grads */
    static Model a, b;
    rng = 5;
    model_init(&a, true);
    rng = 5;
    model_init(&b, true);
    OptimConfig c = config(OPT_ADAMW, 0.01, 1.0);
    OptimState sa = {0}, sb = {0};
    OptimReport ra, rb;
    for (int s = 1; s <= 3; s++) {
        model_new_grads(&a, s);
        for (int k = 0; k < NT; k++)
            for (int64_t i = 0; i < sizes[k]; i++) b.grad[k][i] = a.grad[k][i] / LOSS_SCALE;
        optim_step(&c, &sa, a.t, NT, 1.0f / LOSS_SCALE, 1e-2, &ra);
        optim_step(&c, &sb, b.t, NT, 1.0f, 1e-2, &rb);
    }
    cr_expect_eq(memcmp(a.master, b.master, sizeof a.master), 0);
    cr_expect_eq(memcmp(a.v, b.v, sizeof a.v), 0);
}

Test(optim, config_from_spec_and_needs)
{
    SpecTraining t;
    memset(&t, 0, sizeof t);
    t.optimizer = OPT_SGD;
    t.momentum = 0;
    t.weight_decay = 0.5;
    t.max_grad_norm = 2;
    OptimConfig c;
    optim_config_from_spec(&c, &t);
    cr_expect_eq(c.kind, OPT_SGD);
    cr_expect_eq(c.weight_decay, 0.5);
    cr_expect_eq(c.max_grad_norm, 2.0);
    cr_expect(!optim_needs_m(&c) && !optim_needs_v(&c));
    c.momentum = 0.9;
    cr_expect(optim_needs_m(&c) && !optim_needs_v(&c));
    c.kind = OPT_LAMB;
    cr_expect(optim_needs_m(&c) && optim_needs_v(&c));
}

/* ---- the device optimizer's chunk table (runtime/cuda/cuda_optim.h) ----- */

#include "cuda/cuda_optim.h"

/* Every element of every tensor in exactly one chunk, chunks in tensor
 * order, each at most CUDA_OPTIM_CHUNK long and starting at a multiple of
 * it (so 16-byte aligned tensors give 16-byte aligned chunks), and
 * chunk_first indexing them. */
Test(optim_chunks, cover_every_element_once)
{
    const int64_t numel[] = {1, 0, CUDA_OPTIM_CHUNK, CUDA_OPTIM_CHUNK + 1, 3 * CUDA_OPTIM_CHUNK - 5, 768, 0,
                             23440896};   /* BERT-base's word embeddings */
    const int count = (int)(sizeof numel / sizeof numel[0]);
    int n = cuda_optim_chunks(numel, count, NULL, NULL);
    int64_t want = 0;
    for (int k = 0; k < count; k++) want += (numel[k] + CUDA_OPTIM_CHUNK - 1) / CUDA_OPTIM_CHUNK;
    cr_assert_eq(n, want);
    CudaOptChunk *c = calloc((size_t)n, sizeof *c);
    int first[16];
    cr_assert_eq(cuda_optim_chunks(numel, count, c, first), n);
    cr_expect_eq(first[0], 0);
    cr_expect_eq(first[count], n);
    for (int k = 0; k < count; k++) {
        int64_t next = 0;   /* the next element of tensor k a chunk must start at */
        for (int i = first[k]; i < first[k + 1]; i++) {
            cr_assert_eq(c[i].tensor, (uint32_t)k, "chunk %d", i);
            cr_expect_eq(c[i].begin, (uint64_t)next, "chunk %d of tensor %d", i, k);
            cr_expect_eq(c[i].begin % CUDA_OPTIM_CHUNK, 0u);
            cr_expect(c[i].len >= 1 && c[i].len <= CUDA_OPTIM_CHUNK, "chunk %d len %u", i, c[i].len);
            next += c[i].len;
        }
        cr_expect_eq(next, numel[k], "tensor %d: chunks cover %lld of %lld", k, (long long)next,
                     (long long)numel[k]);
    }
    free(c);
}

Test(optim_chunks, norm_pass_blocks_and_bytes)
{
    cr_expect_eq(cuda_optim_check_blocks(0), 0);
    cr_expect_eq(cuda_optim_check_blocks(1), 1);
    cr_expect_eq(cuda_optim_check_blocks(CUDA_OPTIM_CHECK_CHUNKS), 1);
    cr_expect_eq(cuda_optim_check_blocks(CUDA_OPTIM_CHECK_CHUNKS + 1), 2);
    /* AdamW with an fp16 copy moves 34 bytes per parameter (issue #15's figure). */
    CudaOptTensor t[2] = {{.master = 1, .grad = 2, .m = 3, .v = 4, .low = 5, .n = 1000},
                           {.master = 1, .grad = 2, .m = 3, .v = 4, .low = 0, .n = 10}};
    cr_expect_eq(cuda_optim_step_bytes(t, 2, OPT_ADAMW), 34.0 * 1000 + 32.0 * 10);
    CudaOptTensor sgd = {.master = 1, .grad = 2, .n = 8};
    cr_expect_eq(cuda_optim_step_bytes(&sgd, 1, OPT_SGD), 16.0 * 8);
}

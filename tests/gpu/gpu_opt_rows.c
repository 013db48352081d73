/* tests/gpu/gpu_opt_rows.c — the optimizer skipping the loads of the
 * embedding rows a step left untouched (runtime/cuda/cuda_optim_rows.h)
 * trains as the dense reads do.
 *
 * bert_tiny fp16 (a word table of 30522 x 128: 954 chunks), random
 * parameters, two executors with an optimizer each, one opened with
 * HPC_OPT_ROWS=0; both train 3 steps on the same batches of 4 x 32 tokens
 * (at most 128 of the 954 chunks touched), the optimizer as the step's
 * tail in a CUDA graph (the third step replays it), with AdamW and with
 * LAMB (whose norm pass reads the gradients too).  Checks:
 *   - the word table, and only it, is marked with HPC_OPT_ROWS unset, and
 *     nothing with 0 or with grad_accum 2;
 *   - after each step the chunk bytes are what the step's ids say: a word
 *     table chunk is read exactly when some id's row lies in it, every
 *     other chunk always; and most of the table's chunks were skipped;
 *   - each step's loss agrees; after the last step every master's change
 *     from the initial weights agrees to 1e-3 relative L2 (NaN fails),
 *     bit for bit on the emulator (one thread); on a GPU the embedding
 *     backward's atomics make the touched rows differ in the last bits,
 *     but the rows no step touched (m and v stay 0) must be equal bit for
 *     bit there too: a skipped chunk whose gradient was not 0 moves them;
 *   - the test hook's +inf in the first gradient element, in a chunk no id
 *     touches, still skips the step (found_inf, weights unchanged).
 * Exit 0 when every check passes, 1 on a failure, 4 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_exec.h"
#include "cuda/cuda_optim.h"
#include "pipeline.h"
#include "precision.h"
#include "program/ir.h"
#include "program/params.h"
#include "gpu_check.h"
#include "gpu_check_model.h"
#include "gpu_check_trainer.h"

enum { B = 4, L = 32, STEPS = 3 };

static CudaDevice g_dev;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { return (uint32_t)(gpu_check_xorshift(&g_rng) >> 32); }
static float uniform(void) { return gpu_check_uniform24(rnd() >> 8); }

static bool open_trainer(GpuTrainer *t, const ModelSpec *spec, const IrGraph *g, const ParamList *pl, float **w,
                         const char *rows)
{
    return gpu_trainer_open(t, &g_dev, spec, g, pl, w, B, L, "HPC_OPT_ROWS", rows);
}

/* The optimizer tensor of the word table, or -1. */
static int word_tensor(const GpuTrainer *t, const ParamList *pl)
{
    for (int i = 0; i < t->opt.count; i++)
        if (strstr(pl->p[t->opt.param[i]].name, "word_embeddings")) return i;
    return -1;
}

/* Whether the live bytes on the device are what batch b's ids say for
 * row table r (every other chunk read); *skipped: the table's unread
 * chunks. */
static bool live_matches(const GpuTrainer *t, const CudaOptRows *r, const Batch *b, int *skipped)
{
    int n = t->opt.plan.n_chunks;
    unsigned char *got = xmalloc((size_t)n), *want = xmalloc((size_t)n);
    memset(want, 1, (size_t)n);
    memset(want + r->first, 0, (size_t)r->n);
    for (int64_t i = 0; i < b->B * b->L; i++) {
        int64_t e = (int64_t)b->input_ids[i] * r->cols;
        for (int64_t c = e / CUDA_OPTIM_CHUNK; c <= (e + r->cols - 1) / CUDA_OPTIM_CHUNK; c++)
            want[r->first + c] = 1;
    }
    DRV(cuda_driver()->cuMemcpyDtoH(got, t->opt.plan.live, (size_t)n));
    *skipped = 0;
    for (int c = 0; c < r->n; c++) *skipped += !got[r->first + c];
    bool same = memcmp(got, want, (size_t)n) == 0;
    free(got);
    free(want);
    return same;
}

/* Rows of parameter q no batch of the steps touched, equal bit for bit in
 * both trainers: how many there are (*rows) and how many differ. */
static int untouched_rows_differing(GpuTrainer *on, GpuTrainer *off, int q, const ParamList *pl,
                                    Batch *const *batches, int n_batches, int64_t *rows)
{
    int64_t V = pl->p[q].dims[0], H = pl->p[q].dims[1];
    bool *touched = xcalloc((size_t)V, sizeof *touched);
    for (int s = 0; s < n_batches; s++)
        for (int64_t i = 0; i < batches[s]->B * batches[s]->L; i++) touched[batches[s]->input_ids[i]] = true;
    float *x = xmalloc((size_t)(V * H) * sizeof *x), *y = xmalloc((size_t)(V * H) * sizeof *y);
    HpcError err = {0};
    int differ = 0;
    *rows = 0;
    if (cuda_optim_read_master(&on->opt, q, x, &err) || cuda_optim_read_master(&off->opt, q, y, &err)) {
        result(0, "read %s: %s", pl->p[q].name, err.msg);
        differ = -1;
    } else {
        for (int64_t r = 0; r < V; r++) {
            if (touched[r]) continue;
            (*rows)++;
            differ += memcmp(x + r * H, y + r * H, (size_t)H * sizeof *x) != 0;
        }
    }
    free(touched);
    free(x);
    free(y);
    return differ;
}

static void check_training(ModelSpec spec, const IrGraph *g, const ParamList *pl, float **w, SpecOptimizer kind)
{
    spec.train.max_grad_norm = 1.0;
    spec.train.optimizer = kind;
    char tag[80];
    snprintf(tag, sizeof tag, "bert_tiny fp16 B=%d L=%d %s", B, L, spec_optimizer_name(kind));
    GpuTrainer on, off;
    if (!open_trainer(&on, &spec, g, pl, w, NULL)) return;
    if (!open_trainer(&off, &spec, g, pl, w, "0")) {
        gpu_trainer_close(&on);
        return;
    }
    int word = word_tensor(&on, pl);
    const CudaOptRows *r = &on.opt.plan.rows[0];
    bool marked = on.opt.plan.n_rows == 1 && r->tensor == word && word >= 0 && r->rows == 30522 && r->cols == 128;
    result(marked && off.opt.plan.n_rows == 0, "%s: the word table's rows are marked with HPC_OPT_ROWS unset "
           "(%d tables), none with 0 (%d)", tag, on.opt.plan.n_rows, off.opt.plan.n_rows);
    if (!marked) goto done;
    Batch *batch[STEPS];
    for (int s = 0; s < STEPS; s++) batch[s] = gpu_check_random_batch(&spec, B, L, true, rnd);
    uint32_t ms_on = 0, ms_off = 0;
    double worst_loss = 0;
    bool ran = true, live_ok = true;
    int fewest_skipped = r->n;
    for (int s = 0; s < STEPS && ran; s++) {
        double lo = 0, lf = 0;
        ran = gpu_trainer_step(&on, &batch[s], 1, &ms_on, &lo) && gpu_trainer_step(&off, &batch[s], 1, &ms_off, &lf);
        double e = fabs(lo - lf) / fmax(fabs(lf), 1e-30);
        worst_loss = isnan(e) || e > worst_loss ? e : worst_loss;
        int skipped = 0;
        if (ran) live_ok &= live_matches(&on, r, batch[s], &skipped);
        if (skipped < fewest_skipped) fewest_skipped = skipped;
    }
    if (ran) {
        result(live_ok, "%s: after each of %d steps a word-table chunk is read exactly when an id's row lies in "
               "it, every other chunk always", tag, STEPS);
        result(fewest_skipped >= r->n / 2, "%s: at least %d of the table's %d chunks skipped in every step", tag,
               fewest_skipped, r->n);
        result(worst_loss <= 1e-3, "%s: %d steps' losses agree: worst rel %.3g <= 1e-3", tag, STEPS, worst_loss);
        char what[120];
        snprintf(what, sizeof what, "%s, %d steps", tag, STEPS);
        gpu_trainer_compare_masters(&on, &off, pl, w, what, 1e-3, NULL);
        int64_t rows = 0;
        int differ = untouched_rows_differing(&on, &off, on.opt.param[word], pl, batch, STEPS, &rows);
        result(differ == 0 && rows > 0, "%s: the %lld word-table rows no step touched are equal bit for bit (%d "
               "differ)", tag, (long long)rows, differ);
    }
    for (int s = 0; s < STEPS; s++) batch_free(batch[s]);
done:
    gpu_trainer_close(&off);
    gpu_trainer_close(&on);
}

/* grad_accum 2: the sums over micro-batches touch the union of their
 * rows; nothing is marked. */
static void check_accum_is_dense(ModelSpec spec, const IrGraph *g, const ParamList *pl, float **w)
{
    spec.train.grad_accum = 2;
    GpuTrainer t;
    if (!open_trainer(&t, &spec, g, pl, w, NULL)) return;
    result(t.opt.plan.n_rows == 0 && t.opt.plan.live == 0, "bert_tiny fp16 grad_accum 2: no table marked (%d)",
           t.opt.plan.n_rows);
    gpu_trainer_close(&t);
}

/* The poison hook's +inf lies in chunk 0 (the word table's first rows, the
 * first tensor); a batch whose ids all lie past that chunk must still skip
 * the step. */
static void check_poison(ModelSpec spec, const IrGraph *g, const ParamList *pl, float **w)
{
    const char *tag = "bert_tiny fp16 poisoned step";
    GpuTrainer t;
    if (!open_trainer(&t, &spec, g, pl, w, NULL)) return;
    const CudaOptRows *r = &t.opt.plan.rows[0];
    int64_t first_row = (CUDA_OPTIM_CHUNK + r->cols - 1) / r->cols;   /* the first row outside chunk 0 */
    Batch *b = gpu_check_random_batch(&spec, B, L, true, rnd);
    for (int64_t i = 0; i < B * L; i++)
        if (b->input_ids[i] < first_row) b->input_ids[i] += (int32_t)first_row;
    int q = t.opt.param[0];
    int64_t n = params_numel(&pl->p[q]);
    float *after = xmalloc((size_t)n * sizeof *after);
    HpcError err = {0};
    uint32_t ms = 0;
    double loss;
    int skipped = -1;
    bool ok = t.opt.plan.n_rows == 1 && r->first == 0 && !cuda_optim_poison(&t.opt, &err) &&
              gpu_trainer_step(&t, &b, 1, &ms, &loss);
    CudaOptState st = {0};
    if (ok) ok = !cuda_optim_read_state(&t.opt, &st, &err) && !cuda_optim_read_master(&t.opt, q, after, &err);
    bool marks = ok && live_matches(&t, r, b, &skipped);
    result(marks && skipped > 0, "%s: the word table is the first tensor, its chunk 0 unread by the ids (%d "
           "chunks skipped) %s", tag, skipped, err.msg);
    result(ok && st.found_inf == 1 && st.total_skips == 1 && st.step == 0, "%s: found_inf %d, skips %lld, "
           "applied %lld", tag, st.found_inf, (long long)st.total_skips, (long long)st.step);
    result(ok && memcmp(after, w[q], (size_t)n * sizeof *after) == 0, "%s: %s unchanged", tag, pl->p[q].name);
    free(after);
    batch_free(b);
    gpu_trainer_close(&t);
}

int main(void)
{
    gpu_check_flush = 1;
    if (!gpu_check_open_device("gpu_opt_rows", &g_dev)) return 4;
    ModelSpec spec;
    Pipeline p;
    float **w;
    if (!gpu_trainer_bert_tiny(&spec, &p, &w, uniform)) return gpu_check_summary();
    check_training(spec, &p.g, &p.pl, w, OPT_ADAMW);
    check_training(spec, &p.g, &p.pl, w, OPT_LAMB);
    check_accum_is_dense(spec, &p.g, &p.pl, w);
    check_poison(spec, &p.g, &p.pl, w);
    gpu_check_free_params(&p.pl, w);
    pipeline_free(&p);
    cuda_device_close(&g_dev);
    return gpu_check_summary();
}

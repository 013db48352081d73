/* tests/test_opt_overlap.c — the deferred optimizer update's planning
 * (HPC_OPT_OVERLAP=1: program/opt_overlap.h, the plan's wrap in
 * program/plan.h, the groups of runtime/cuda/cuda_optim.h), on the cpu:
 *   - wait positions on the fused bert_tiny and BERT-base fp16 graphs:
 *     each parameter waits at a forward node that reads it (itself or
 *     through a STACK of parameters), and no earlier forward node reads
 *     it; the word embeddings wait at the embedding node, the classifier's
 *     weight at the logits;
 *   - the wrapped plan: plan_check holds, every gradient's storage wraps
 *     to its parameter's wait, and (checked again here, apart from
 *     plan_check) no arena range live anywhere in [-1, wrap] shares a byte
 *     with that gradient; at BERT-base fp16 32 x 128 the arena grows by at
 *     most 1 % over the plan without wraps (757.8 -> 758.1 MiB when
 *     written), and it holds the peak of live bytes, wraps counted;
 *   - plan_check refuses a wrap cut short and a forward value moved onto a
 *     wrapped gradient;
 *   - cuda_optim_groups: where runs end, their waits, the minimum size;
 *     on BERT-base's table the group waits never go back (each group is
 *     needed no earlier than the one before: the update runs in the order
 *     the forward pass wants it);
 *   - ready positions on BERT-base: in the backward pass, and no node
 *     after a gradient's ready position writes its bytes;
 *   - cuda_optim_check_runs: a small table by hand; on BERT-base the runs
 *     cover every check block once, each starts no earlier than every
 *     gradient it reads is final, in ascending order;
 *   - the side work's schedule on BERT-base (cuda_optim_side_items and
 *     the executor's fork and join rules, walked here without a GPU):
 *     every group is forked once, right after its start position; each
 *     update group is joined before the forward node that first reads its
 *     parameters and before the backward pass; each check run after every
 *     gradient it reads is final and before the tail; the update groups
 *     cover every chunk once and the runs every check block once;
 *   - HPC_OPT_OVERLAP's forms. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/pipeline.h"
#include "compiler/plan_graph.h"
#include "compiler/spec_load.h"
#include "cuda/cuda_exec.h"
#include "cuda/cuda_optim.h"
#include "program/opt_overlap.h"
#include "program/plan.h"
#include "cpu_step.h"

static void fused_graph(const char *model, Pipeline *pp)
{
    ModelSpec s;
    cpu_step_load_model(model, &s);
    PipeOptions o = pipeline_defaults(PREC_FP16);
    HpcError err = {0};
    cr_assert_eq(pipeline_build(&s, &o, pp, &err), HPC_OK, "%s", err.msg);
}

/* Node i reads parameter q: an input is q's PARAM node or a STACK with
 * q's PARAM node among its inputs (written apart from opt_overlap.c). */
static bool reads_param(const IrGraph *g, int i, int q)
{
    const IrNode *n = &g->nodes[i];
    for (int k = 0; k < n->n_in; k++) {
        const IrNode *x = &g->nodes[n->in[k]];
        if (x->op == IR_OP_PARAM && x->attr.param.index == q) return true;
        if (x->op != IR_OP_STACK) continue;
        for (int j = 0; j < x->n_in; j++) {
            const IrNode *y = &g->nodes[x->in[j]];
            if (y->op == IR_OP_PARAM && y->attr.param.index == q) return true;
        }
    }
    return false;
}

static bool is_reader(const IrGraph *g, int i)
{
    return g->nodes[i].op != IR_OP_PARAM && g->nodes[i].op != IR_OP_STACK;
}

static void check_wait_positions(const char *model)
{
    Pipeline pp;
    fused_graph(model, &pp);
    const IrGraph *g = &pp.g;
    int *wait = calloc((size_t)g->n_params + 1, sizeof *wait);
    opt_overlap_wait_positions(g, wait);
    int waiting = 0;
    for (int q = 0; q < g->n_params; q++) {
        cr_assert(wait[q] >= 0 && wait[q] <= g->n_forward, "%s: parameter %d waits at %d", model, q, wait[q]);
        int first = g->n_forward;
        for (int i = 0; i < g->n_forward && first == g->n_forward; i++)
            if (is_reader(g, i) && reads_param(g, i, q)) first = i;
        cr_expect_eq(wait[q], first, "%s: %s waits at %d, first read at %d", model, pp.pl.p[q].name, wait[q], first);
        waiting += wait[q] < g->n_forward;
    }
    cr_expect_gt(waiting, g->n_params / 2, "%s: only %d of %d parameters read in the forward pass", model, waiting,
                 g->n_params);
    int word = params_find(&pp.pl, "bert.embeddings.word_embeddings.weight");
    int cls = params_find(&pp.pl, "classifier.weight");
    cr_assert(word >= 0 && cls >= 0);
    cr_expect_eq(g->nodes[wait[word]].op, IR_OP_EMBED_LN, "%s: word embeddings wait at %s", model,
                 g->nodes[wait[word]].name);
    cr_expect_eq(g->nodes[wait[cls]].op, IR_OP_LINEAR, "%s", g->nodes[wait[cls]].name);
    cr_expect_eq(wait[cls], g->logits, "%s: the classifier waits at %d, the logits are %d", model, wait[cls],
                 g->logits);
    free(wait);
    pipeline_free(&pp);
}

Test(opt_overlap, wait_positions_bert_tiny) { check_wait_positions("bert_tiny.model"); }
Test(opt_overlap, wait_positions_bert_base) { check_wait_positions("bert_base.model"); }

/* The storage root of gradient value v (its view's base, then its chain's first value). */
static int grad_root(const StepPlan *p, const IrGraph *g, int v)
{
    int base;
    int64_t off;
    if (plan_view_of(g, v, &base, &off)) v = base;
    return p->v[v].storage;
}

/* Apart from plan_check: no arena value or scratch live at a position in
 * [-1, wrap] of a wrapped gradient shares a byte with it. */
static void expect_wraps_alone(const StepPlan *p, const IrGraph *g, const int *wait)
{
    int checked = 0;
    for (int q = 0; q < g->n_params; q++) {
        if (g->param_grad[q] < 0) continue;
        int r = grad_root(p, g, g->param_grad[q]);
        cr_assert_eq(p->v[r].kind, PLAN_ARENA);
        cr_expect_geq(p->v[r].wrap, wait[q], "gradient of %d wraps to %d, waits at %d", q, p->v[r].wrap, wait[q]);
        int64_t lo = p->v[r].offset, hi = lo + p->v[r].bytes;
        for (int i = 0; i < p->n; i++) {
            const PlanValue *v = &p->v[i];
            if (i != r && v->kind == PLAN_ARENA && v->storage == i && v->def <= p->v[r].wrap) {
                bool shares = v->offset < hi && lo < v->offset + v->bytes;
                cr_expect_not(shares, "value %d (%s) live from %d shares bytes with the gradient of %d, wrapped to %d",
                              i, g->nodes[i].name, v->def, q, p->v[r].wrap);
                checked++;
            }
            if (p->scratch_bytes[i] > 0 && i <= p->v[r].wrap) {
                int64_t s = p->scratch_off[i];
                cr_expect_not(s < hi && lo < s + p->scratch_bytes[i], "node %d's scratch on a wrapped gradient", i);
            }
        }
    }
    cr_expect_gt(checked, 0);
}

static void check_wrapped_plan(const char *model, int64_t B, int64_t L, bool print)
{
    Pipeline pp;
    fused_graph(model, &pp);
    const IrGraph *g = &pp.g;
    HpcError err = {0};
    StepPlan plain, wrapped;
    cr_assert_eq(plan_build(g, B, L, &plain, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(plan_build_with(g, B, L, &(PlanOptions){.wrap_grads = true}, &wrapped, &err), HPC_OK, "%s",
                 err.msg);
    char why[512] = "";
    cr_expect(plan_check(&wrapped, g, why, sizeof why), "%s: %s", model, why);
    cr_expect(wrapped.wrap_grads);
    int *wait = calloc((size_t)g->n_params + 1, sizeof *wait);
    opt_overlap_wait_positions(g, wait);
    expect_wraps_alone(&wrapped, g, wait);
    for (int i = 0; i < plain.n; i++) cr_expect_eq(plain.v[i].wrap, -1, "no wraps without the option");
    if (print)
        printf("plan %s fp16 %lldx%lld: arena %.1f MiB, %.1f MiB with the gradients wrapped\n", model, (long long)B,
               (long long)L, plain.arena_bytes / 1048576.0, wrapped.arena_bytes / 1048576.0);
    cr_expect_leq(wrapped.arena_bytes, plain.arena_bytes + plain.arena_bytes / 100, "%lld against %lld",
                  (long long)wrapped.arena_bytes, (long long)plain.arena_bytes);
    /* the wraps count in the live bytes, and the arena still holds them */
    int64_t live = plan_peak_live_bytes(&wrapped);
    cr_expect_geq(live, plan_peak_live_bytes(&plain));
    cr_expect_geq(wrapped.arena_bytes, live);
    free(wait);
    plan_free(&plain);
    plan_free(&wrapped);
    pipeline_free(&pp);
}

Test(opt_overlap, wrapped_plan_bert_tiny) { check_wrapped_plan("bert_tiny.model", 8, 64, false); }
Test(opt_overlap, wrapped_plan_bert_base) { check_wrapped_plan("bert_base.model", 32, 128, true); }

/* The fused fp16 graph of model and its plan at B x L with the gradients wrapped. */
static void wrapped_plan(const char *model, int64_t B, int64_t L, Pipeline *pp, StepPlan *p)
{
    fused_graph(model, pp);
    HpcError err = {0};
    cr_assert_eq(plan_build_with(&pp->g, B, L, &(PlanOptions){.wrap_grads = true}, p, &err), HPC_OK, "%s", err.msg);
}

Test(opt_overlap, plan_check_refuses_broken_wraps)
{
    Pipeline pp;
    StepPlan p;
    wrapped_plan("bert_tiny.model", 4, 32, &pp, &p);
    const IrGraph *g = &pp.g;
    char why[512] = "";
    cr_assert(plan_check(&p, g, why, sizeof why), "%s", why);
    int cls = params_find(&pp.pl, "classifier.weight");
    int r = grad_root(&p, g, g->param_grad[cls]);
    int saved = p.v[r].wrap;
    /* cut short: the next forward pass could overwrite it before the update */
    p.v[r].wrap = saved - 1;
    cr_expect_not(plan_check(&p, g, why, sizeof why));
    cr_expect(strstr(why, "short of its wait position") != NULL, "%s", why);
    p.v[r].wrap = saved;
    /* a forward value written before the classifier moved onto its gradient */
    int x = g->nodes[g->logits].in[0];
    cr_assert_leq(p.v[x].def, saved);
    int64_t off = p.v[x].offset;
    p.v[x].offset = p.v[r].offset;
    cr_expect_not(plan_check(&p, g, why, sizeof why));
    cr_expect(strstr(why, "overlap") != NULL, "%s", why);
    p.v[x].offset = off;
    cr_expect(plan_check(&p, g, why, sizeof why), "%s", why);
    plan_free(&p);
    pipeline_free(&pp);
}

Test(opt_overlap, groups_cut_where_waits_change)
{
    int64_t numel[] = {10, 10, 5, 5, 20, 1, 7};
    int wait[] = {3, 3, 8, 8, 12, 12, 20};
    int first[8], gw[7];
    /* min 1: every change of wait starts a group */
    int n = cuda_optim_groups(numel, wait, 7, 1, first, gw);
    cr_assert_eq(n, 4);
    int want_first[] = {0, 2, 4, 6, 7}, want_wait[] = {3, 8, 12, 20};
    for (int g = 0; g <= n; g++) cr_expect_eq(first[g], want_first[g], "group %d", g);
    for (int g = 0; g < n; g++) cr_expect_eq(gw[g], want_wait[g], "group %d", g);
    /* min 25: a group closes only once it holds 25 elements */
    n = cuda_optim_groups(numel, wait, 7, 25, first, gw);
    cr_assert_eq(n, 2);
    cr_expect_eq(first[1], 4);   /* 10 + 10 + 5 = 25 after tensor 2, but 3 shares its wait: it stays */
    cr_expect_eq(first[2], 7);
    cr_expect_eq(gw[0], 3);
    cr_expect_eq(gw[1], 12);
    /* the least wait of a group's tensors, when the table is not in forward order */
    int64_t n2[] = {4, 4};
    int w2[] = {9, 2};
    n = cuda_optim_groups(n2, w2, 2, 100, first, gw);
    cr_assert_eq(n, 1);
    cr_expect_eq(gw[0], 2);
    cr_expect_eq(cuda_optim_groups(n2, w2, 0, 1, first, gw), 0);
    cr_expect_eq(first[0], 0);
}

/* The optimizer's table order (ParamList order, parameters with a
 * gradient): BERT-base's groups wait in forward order. */
Test(opt_overlap, bert_base_groups_in_forward_order)
{
    Pipeline pp;
    fused_graph("bert_base.model", &pp);
    const IrGraph *g = &pp.g;
    int *wait_p = calloc((size_t)g->n_params + 1, sizeof *wait_p);
    opt_overlap_wait_positions(g, wait_p);
    int64_t *numel = calloc((size_t)g->n_params + 1, sizeof *numel);
    int *wait = calloc((size_t)g->n_params + 1, sizeof *wait), *first = calloc((size_t)g->n_params + 2, sizeof *first);
    int *gw = calloc((size_t)g->n_params + 1, sizeof *gw);
    int c = 0;
    for (int q = 0; q < pp.pl.n; q++)
        if (g->param_grad[q] >= 0) {
            numel[c] = params_numel(&pp.pl.p[q]);
            wait[c++] = wait_p[q];
        }
    int n = cuda_optim_groups(numel, wait, c, CUDA_OPTIM_GROUP_MIN_ELEMS, first, gw);
    printf("bert_base: %d tensors in %d groups; waits", c, n);
    for (int k = 0; k < n; k++) printf(" %d", gw[k]);
    printf(" (forward pass: %d nodes)\n", g->n_forward);
    cr_expect_geq(n, 24, "at least two groups a layer");
    for (int k = 1; k < n; k++) cr_expect_geq(gw[k], gw[k - 1], "group %d waits at %d, before group %d's %d", k, gw[k],
                                              k - 1, gw[k - 1]);
    free(wait_p);
    free(numel);
    free(wait);
    free(first);
    free(gw);
    pipeline_free(&pp);
}

Test(opt_overlap, env_forms)
{
    HpcError err = {0};
    bool on = true;
    unsetenv("HPC_OPT_OVERLAP");
    cr_expect_eq(opt_overlap_from_env(&on, &err), HPC_OK);
    cr_expect_not(on);
    setenv("HPC_OPT_OVERLAP", "0", 1);
    cr_expect_eq(opt_overlap_from_env(&on, &err), HPC_OK);
    cr_expect_not(on);
    setenv("HPC_OPT_OVERLAP", "1", 1);
    cr_expect_eq(opt_overlap_from_env(&on, &err), HPC_OK);
    cr_expect(on);
    setenv("HPC_OPT_OVERLAP", "yes", 1);
    cr_expect_eq(opt_overlap_from_env(&on, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "HPC_OPT_OVERLAP=yes") != NULL, "%s", err.msg);
    unsetenv("HPC_OPT_OVERLAP");
}

/* ---- the norm check beside the backward pass ----------------------------- */

Test(opt_overlap, check_runs_by_hand)
{
    /* tensors of 10000, 5000, 20000, 3000 elements: chunks 3, 2, 5, 1; check
     * blocks of 4 chunks: b0 = t0 t0 t0 t1, b1 = t1 t2 t2 t2, b2 = t2 t2 t3 */
    int64_t numel[] = {10000, 5000, 20000, 3000};
    CudaOptChunk chunks[16];
    int n_chunks = cuda_optim_chunks(numel, 4, chunks, NULL);
    cr_assert_eq(n_chunks, 11);
    cr_assert_eq(cuda_optim_check_blocks(n_chunks), 3);
    int ready[] = {50, 40, 30, 20};   /* as a backward pass finishes them: the last first */
    int b0[4], b1[4], start[4];
    int n = cuda_optim_check_runs(chunks, n_chunks, ready, 1, b0, b1, start);
    cr_assert_eq(n, 3);
    int want_b0[] = {2, 1, 0}, want_start[] = {30, 40, 50};
    for (int r = 0; r < n; r++) {
        cr_expect_eq(b0[r], want_b0[r], "run %d", r);
        cr_expect_eq(b1[r], want_b0[r] + 1, "run %d", r);
        cr_expect_eq(start[r], want_start[r], "run %d", r);
    }
    /* a large minimum: one run of every block, once all are final */
    n = cuda_optim_check_runs(chunks, n_chunks, ready, 1 << 30, b0, b1, start);
    cr_assert_eq(n, 1);
    cr_expect(b0[0] == 0 && b1[0] == 3 && start[0] == 50);
    /* a table not in backward order: the runs still come by start */
    int odd[] = {20, 40, 30, 50};
    n = cuda_optim_check_runs(chunks, n_chunks, odd, 1, b0, b1, start);
    for (int r = 1; r < n; r++) cr_expect_geq(start[r], start[r - 1]);
}

/* The storage root of value v, as the planner resolves it after planning. */
static int root_of(const StepPlan *p, int v)
{
    while (p->v[v].storage != v) v = p->v[v].storage;
    return v;
}

Test(opt_overlap, bert_base_ready_positions_and_check_runs)
{
    Pipeline pp;
    StepPlan p;
    wrapped_plan("bert_base.model", 32, 128, &pp, &p);
    const IrGraph *g = &pp.g;
    int *ready_p = calloc((size_t)g->n_params + 1, sizeof *ready_p);
    opt_overlap_ready_positions(g, &p, ready_p);
    for (int q = 0; q < g->n_params; q++) {
        if (g->param_grad[q] < 0) {
            cr_expect_eq(ready_p[q], -1);
            continue;
        }
        cr_expect(ready_p[q] >= g->n_forward && ready_p[q] < g->n, "%s ready at %d", pp.pl.p[q].name, ready_p[q]);
        int r = root_of(&p, g->param_grad[q]);
        for (int j = ready_p[q] + 1; j < g->n; j++)
            if (p.v[j].kind == PLAN_ARENA && j != r && root_of(&p, j) == r)
                cr_expect(false, "node %d (%s) writes the gradient of %s after its ready position %d", j,
                          g->nodes[j].name, pp.pl.p[q].name, ready_p[q]);
    }
    /* the optimizer's table: parameters with a gradient, in ParamList order */
    int c = 0;
    int64_t *numel = calloc((size_t)g->n_params + 1, sizeof *numel);
    int *ready = calloc((size_t)g->n_params + 1, sizeof *ready);
    for (int q = 0; q < pp.pl.n; q++)
        if (g->param_grad[q] >= 0) {
            numel[c] = params_numel(&pp.pl.p[q]);
            ready[c++] = ready_p[q];
        }
    int n_chunks = cuda_optim_chunks(numel, c, NULL, NULL);
    CudaOptChunk *chunks = calloc((size_t)n_chunks + 1, sizeof *chunks);
    cuda_optim_chunks(numel, c, chunks, NULL);
    int blocks = cuda_optim_check_blocks(n_chunks);
    int *b0 = calloc((size_t)blocks + 1, sizeof *b0), *b1 = calloc((size_t)blocks + 1, sizeof *b1);
    int *start = calloc((size_t)blocks + 1, sizeof *start), *seen = calloc((size_t)blocks + 1, sizeof *seen);
    int n = cuda_optim_check_runs(chunks, n_chunks, ready, CUDA_OPTIM_GROUP_MIN_ELEMS, b0, b1, start);
    printf("bert_base: %d check blocks in %d runs beside the backward pass (from position %d to %d of %d)\n", blocks,
           n, n ? start[0] : -1, n ? start[n - 1] : -1, g->n);
    cr_expect_gt(n, 12, "at least a run a layer");
    for (int r = 0; r < n; r++) {
        if (r > 0) cr_expect_geq(start[r], start[r - 1]);
        for (int b = b0[r]; b < b1[r]; b++) {
            seen[b]++;
            for (int k = b * CUDA_OPTIM_CHECK_CHUNKS; k < (b + 1) * CUDA_OPTIM_CHECK_CHUNKS && k < n_chunks; k++)
                cr_expect_geq(start[r], ready[chunks[k].tensor], "run %d starts at %d before tensor %u is final at %d",
                              r, start[r], chunks[k].tensor, ready[chunks[k].tensor]);
        }
    }
    for (int b = 0; b < blocks; b++) cr_expect_eq(seen[b], 1, "check block %d in %d runs", b, seen[b]);
    free(ready_p);
    free(numel);
    free(ready);
    free(chunks);
    free(b0);
    free(b1);
    free(start);
    free(seen);
    plan_free(&p);
    pipeline_free(&pp);
}

/* ---- the side work's schedule, walked without a GPU ----------------------- */

Test(opt_overlap, bert_base_side_schedule)
{
    Pipeline pp;
    StepPlan p;
    wrapped_plan("bert_base.model", 32, 128, &pp, &p);
    const IrGraph *g = &pp.g;
    int *wait_p = calloc((size_t)g->n_params + 1, sizeof *wait_p), *ready_p = calloc((size_t)g->n_params + 1, sizeof *ready_p);
    opt_overlap_wait_positions(g, wait_p);
    opt_overlap_ready_positions(g, &p, ready_p);
    int c = 0, *param = calloc((size_t)g->n_params + 1, sizeof *param);
    int64_t *numel = calloc((size_t)g->n_params + 1, sizeof *numel);
    int *wait = calloc((size_t)g->n_params + 1, sizeof *wait), *ready = calloc((size_t)g->n_params + 1, sizeof *ready);
    for (int q = 0; q < pp.pl.n; q++)
        if (g->param_grad[q] >= 0) {
            param[c] = q;
            numel[c] = params_numel(&pp.pl.p[q]);
            wait[c] = wait_p[q];
            ready[c++] = ready_p[q];
        }
    CudaOptSideItems it;
    cuda_optim_side_items(numel, wait, ready, c, &it);
    int n = it.n_groups + it.n_runs, end = p.n_order, bad = -1;
    CudaExecSide side = {.n_groups = n, .start = it.start, .wait = it.wait};
    cr_assert(cuda_exec_side_valid(&side, &bad), "group %d", bad);

    /* walk the executor's rules: forks after a node (or at -1), joins before one (or at the end) */
    int *forked_at = calloc((size_t)n + 1, sizeof *forked_at), *joined_at = calloc((size_t)n + 1, sizeof *joined_at);
    for (int k = 0; k < n; k++) forked_at[k] = joined_at[k] = INT32_MIN;
    int forked = cuda_exec_side_forks(&side, -1, 0);
    for (int k = 0; k < forked; k++) forked_at[k] = -1;
    for (int t = 0; t < end; t++) {
        for (int k = 0; k < forked; k++)
            if (cuda_exec_side_joins(&side, k, t, false) && joined_at[k] == INT32_MIN) joined_at[k] = t;
        int until = cuda_exec_side_forks(&side, t, forked);
        for (int k = forked; k < until; k++) forked_at[k] = t;
        forked = until;
    }
    for (int k = 0; k < forked; k++)
        if (cuda_exec_side_joins(&side, k, end, true) && joined_at[k] == INT32_MIN) joined_at[k] = end;
    cr_expect_eq(forked, n, "%d of %d groups forked", forked, n);
    for (int k = 0; k < n; k++) {
        cr_expect_eq(forked_at[k], it.start[k], "group %d forked after %d, starts at %d", k, forked_at[k], it.start[k]);
        cr_expect(joined_at[k] > forked_at[k], "group %d joined at %d, forked after %d", k, joined_at[k], forked_at[k]);
    }
    /* the update groups: their chunks, joined before their parameters' first forward reader */
    int n_chunks = cuda_optim_chunks(numel, c, NULL, NULL);
    int *chunk_first = calloc((size_t)c + 1, sizeof *chunk_first), *seen = calloc((size_t)n_chunks + 1, sizeof *seen);
    cuda_optim_chunks(numel, c, NULL, chunk_first);
    for (int k = 0; k < it.n_groups; k++) {
        cr_expect_leq(joined_at[k], g->n_forward, "update group %d joined at %d, after the forward pass", k, joined_at[k]);
        for (int ch = it.first[k]; ch < it.first[k] + it.count[k]; ch++) seen[ch]++;
        for (int tk = 0; tk < c; tk++)
            if (chunk_first[tk] >= it.first[k] && chunk_first[tk] < it.first[k] + it.count[k])
                cr_expect_leq(joined_at[k], wait[tk], "%s: its group %d joined at %d, read at %d",
                              pp.pl.p[param[tk]].name, k, joined_at[k], wait[tk]);
    }
    for (int ch = 0; ch < n_chunks; ch++) cr_expect_eq(seen[ch], 1, "chunk %d in %d update groups", ch, seen[ch]);
    /* the check runs: after their gradients are final, joined at the end (before the tail) */
    int blocks = cuda_optim_check_blocks(n_chunks);
    int *bseen = calloc((size_t)blocks + 1, sizeof *bseen);
    CudaOptChunk *chunks = calloc((size_t)n_chunks + 1, sizeof *chunks);
    cuda_optim_chunks(numel, c, chunks, NULL);
    for (int k = it.n_groups; k < n; k++) {
        cr_expect_eq(joined_at[k], end, "check run %d joined at %d", k, joined_at[k]);
        for (int b = it.first[k]; b < it.first[k] + it.count[k]; b++) {
            bseen[b]++;
            for (int ch = b * CUDA_OPTIM_CHECK_CHUNKS; ch < (b + 1) * CUDA_OPTIM_CHECK_CHUNKS && ch < n_chunks; ch++)
                cr_expect_geq(forked_at[k], ready[chunks[ch].tensor], "check run %d forked after %d, a gradient is final at %d",
                              k, forked_at[k], ready[chunks[ch].tensor]);
        }
    }
    for (int b = 0; b < blocks; b++) cr_expect_eq(bseen[b], 1, "check block %d in %d runs", b, bseen[b]);
    printf("bert_base side: %d update groups, %d check runs; the last forked after node %d of %d\n", it.n_groups,
           it.n_runs, forked_at[n - 1], end);
    /* a side the executor must refuse: a start after its wait */
    int bad_start[] = {-1, 5}, bad_wait[] = {3, 4};
    CudaExecSide broken = {.n_groups = 2, .start = bad_start, .wait = bad_wait};
    cr_expect_not(cuda_exec_side_valid(&broken, &bad));
    cr_expect_eq(bad, 1);
    cuda_optim_side_items_free(&it);
    free(wait_p);
    free(ready_p);
    free(param);
    free(numel);
    free(wait);
    free(ready);
    free(forked_at);
    free(joined_at);
    free(chunk_first);
    free(seen);
    free(bseen);
    free(chunks);
    plan_free(&p);
    pipeline_free(&pp);
}

/* tests/test_plan_side.c — the dW GEMMs beside the step (program/plan_side.h):
 * which nodes, where they are joined, and that the plan keeps what they
 * read and write safe until then.
 *
 * On BERT-base (fp16, 32 x 32 and 32 x 128) and bert_tiny: every LINEAR_DW
 * is a side node; each join lies after its node, before or at its first
 * reader, and at the next side node that has a launch of the step's own
 * between them (BERT's two FFN dW GEMMs back to back share one); with
 * PlanOptions.side no node the step's stream launches between a side node
 * and its join writes (its value, its other outputs or its scratch) over
 * what the side node reads or writes, or reads its value; the plan passes
 * plan_check.  The same check finds such writes in the plan without the
 * option (so it is no check that cannot fail). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/plan_graph.h"
#include "compiler/spec_load.h"
#include "pipeline.h"
#include "program/plan.h"
#include "program/plan_side.h"

static bool range_of(const StepPlan *p, int v, int64_t *a, int64_t *b)
{
    const PlanValue *x = &p->v[v];
    if (x->offset < 0 || (x->kind != PLAN_ARENA && x->kind != PLAN_VIEW)) return false;
    *a = x->offset;
    *b = x->offset + x->bytes;
    return true;
}

static bool overlap(int64_t a, int64_t b, int64_t c, int64_t d) { return a < d && c < b; }

/* Whether node t's writes (its value, the OUTPUT values of a multi-output
 * node, its scratch) overlap [a, b). */
static bool writes_into(const IrGraph *g, const StepPlan *p, int t, int64_t a, int64_t b)
{
    int64_t x, y;
    if (g->nodes[t].op != IR_OP_OUTPUT && range_of(p, t, &x, &y) && overlap(x, y, a, b)) return true;
    for (int m = t + 1; m < g->n; m++)
        if (g->nodes[m].op == IR_OP_OUTPUT && g->nodes[m].in[0] == t && range_of(p, m, &x, &y) &&
            overlap(x, y, a, b))
            return true;
    return p->scratch_off[t] >= 0 && overlap(p->scratch_off[t], p->scratch_off[t] + p->scratch_bytes[t], a, b);
}

static bool reads(const IrGraph *g, int t, int v)
{
    for (int k = 0; k < g->nodes[t].n_in; k++) {
        int b;
        int64_t off;
        if (g->nodes[t].in[k] == v || (plan_view_of(g, g->nodes[t].in[k], &b, &off) && b == v)) return true;
    }
    return false;
}

/* Hazards in plan p: step-stream nodes between a side node and its join
 * that write over its inputs or its value, or read its value. */
static int hazards(const IrGraph *g, const StepPlan *p, const bool *side, bool print)
{
    int found = 0;
    for (int s = 0; s < g->n; s++) {
        if (!side[s]) continue;
        int join = plan_side_join(g, side, s);
        const IrNode *n = &g->nodes[s];
        for (int t = s + 1; t < join; t++) {
            if (side[t] || g->nodes[t].op == IR_OP_OUTPUT) continue;   /* the side stream's own order */
            bool bad = reads(g, t, s);
            int64_t a, b;
            for (int k = 0; k <= n->n_in && !bad; k++) {
                int v = k < n->n_in ? n->in[k] : s;
                bad = range_of(p, v, &a, &b) && writes_into(g, p, t, a, b);
            }
            if (bad && print && found < 3) printf("  hazard: %s (%d) beside %s (%d)\n", g->nodes[t].name, t, n->name, s);
            found += bad;
        }
    }
    return found;
}

static void check_model(const ModelSpec *s, int64_t B, int64_t L)
{
    PipeOptions po = pipeline_defaults(PREC_FP16);
    Pipeline pl;
    HpcError err = {0};
    cr_assert_eq(pipeline_build(s, &po, &pl, &err), HPC_OK, "%s", err.msg);
    const IrGraph *g = &pl.g;
    bool *side = calloc((size_t)g->n, sizeof *side);
    int n = plan_side_nodes(g, NULL, side), dw = 0;
    for (int i = 0; i < g->n; i++) dw += g->nodes[i].op == IR_OP_LINEAR_DW;
    cr_expect(n == dw && n > 0, "%s: %d side nodes, %d LINEAR_DW", s->name, n, dw);
    int shared = 0;
    for (int i = 0; i < g->n; i++) {
        if (!side[i]) continue;
        int join = plan_side_join(g, side, i);
        cr_expect(join > i && join <= g->n, "%s: node %d joined at %d", s->name, i, join);
        for (int t = i + 1; t < join; t++)
            cr_expect(!reads(g, t, i), "%s: %s reads %s before its join", s->name, g->nodes[t].name,
                      g->nodes[i].name);
        shared += i + 1 < g->n && side[i + 1] && plan_side_join(g, side, i + 1) == join;
    }
    cr_expect_geq(shared, 1, "%s: back-to-back side nodes share a join", s->name);
    StepPlan plain, with;
    PlanOptions opt = {.side = side};
    cr_assert_eq(plan_build(g, B, L, &plain, &err), HPC_OK, "%s", err.msg);
    int64_t *scratch = calloc((size_t)g->n, sizeof *scratch);
    for (int i = 0; i < g->n; i++) scratch[i] = plain.scratch_bytes[i];
    cr_assert_eq(plan_build_scratch_with(g, B, L, scratch, &opt, &with, &err), HPC_OK, "%s", err.msg);
    char why[512] = "";
    cr_expect(plan_check(&with, g, why, sizeof why), "%s: %s", s->name, why);
    int h = hazards(g, &with, side, true), h0 = hazards(g, &plain, side, false);
    cr_expect_eq(h, 0, "%s B=%lld L=%lld: %d writes or reads beside a side node", s->name, (long long)B,
                 (long long)L, h);
    cr_expect_gt(h0, 0, "%s: the plan without PlanOptions.side has no such hazard, so the check proves nothing",
                 s->name);
    printf("%s B=%lld L=%lld: %d side nodes; arena %.1f MiB beside, %.1f MiB without; %d hazards without\n",
           s->name, (long long)B, (long long)L, n, with.arena_bytes / 1048576.0, plain.arena_bytes / 1048576.0, h0);
    plan_free(&with);
    plan_free(&plain);
    free(scratch);
    free(side);
    pipeline_free(&pl);
}

static void load(const char *file, ModelSpec *s)
{
    char path[512];
    const char *root = getenv("HPC_ROOT");
    snprintf(path, sizeof path, "%s/models/%s", root ? root : ".", file);
    cr_assert_eq(spec_load(path, s, stderr), 0, "cannot load %s", path);
}

Test(plan_side, bert_base_32x32, .timeout = 120)
{
    ModelSpec s;
    load("bert_base.model", &s);
    check_model(&s, 32, 32);
}

Test(plan_side, bert_base_32x128, .timeout = 120)
{
    ModelSpec s;
    load("bert_base.model", &s);
    check_model(&s, 32, 128);
}

Test(plan_side, bert_tiny, .timeout = 120)
{
    ModelSpec s;
    load("bert_tiny.model", &s);
    check_model(&s, 8, 32);
}

/* tests/test_plan_order.c — the schedule with the dW GEMMs of one shape side
 * by side (program/plan_order.c) and plan.c's choice of it.
 *
 * On BERT-base fp16 (the last layer for token 0, the default): the order is
 * a permutation in which every node comes after its inputs, the forward
 * pass and the nodes after the last dW GEMM keep their positions, and the
 * 11 layers' Q/K/V, attention-output, FFN-up and FFN-down dW GEMMs each
 * stand side by side.  Under PLAN_DW_GROUP_AUTO the plan keeps that order
 * at 32 x 32, where the arena grows by under 5 %, and not at 32 x 128,
 * where it would grow by half (unless told to: PLAN_DW_GROUP_ALWAYS, a
 * valid plan with a larger arena); never under PLAN_DW_GROUP_NEVER; by
 * default as AUTO.  plan_check checks every span of dW GEMMs: their
 * inputs live to its end, their outputs are written from its start; and
 * no member's output shares arena bytes with another member's input.  On a hand-made graph a dW GEMM read before
 * its group's last member stays where it is. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/ir_build.h"
#include "compiler/spec_load.h"
#include "cpu_step.h"
#include "pipeline.h"
#include "program/ir.h"
#include "program/plan.h"

static void bert_base_spec(Pipeline *pp, ModelSpec *s_out)
{
    ModelSpec s;
    cpu_step_load_model("bert_base.model", &s);
    if (s_out) *s_out = s;
    PipeOptions o = pipeline_defaults(PREC_FP16);
    HpcError err = {0};
    cr_assert_eq(pipeline_build(&s, &o, pp, &err), HPC_OK, "%s", err.msg);
}

static void bert_base(Pipeline *pp) { bert_base_spec(pp, NULL); }

/* Runs of at least `min` consecutive LINEAR_DWs of one shape in order. */
static int long_dw_runs(const IrGraph *g, const int *order, int min)
{
    int runs = 0;
    for (int t = 0; t < g->n;) {
        int len = 1;
        const IrNode *a = &g->nodes[order[t]];
        while (a->op == IR_OP_LINEAR_DW && t + len < g->n) {
            const IrNode *b = &g->nodes[order[t + len]];
            if (b->op != IR_OP_LINEAR_DW || !ir_same_shape(a, b)) break;
            len++;
        }
        runs += a->op == IR_OP_LINEAR_DW && len >= min;
        t += len;
    }
    return runs;
}

static bool bytes_overlap(const StepPlan *p, int a, int b)
{
    const PlanValue *x = &p->v[a], *y = &p->v[b];
    if (x->offset < 0 || y->offset < 0) return false;   /* parameters: outside the arena */
    return x->offset < y->offset + y->bytes && y->offset < x->offset + x->bytes;
}

/* Spans of dW GEMMs in p whose member's output shares arena bytes with
 * another member's input: one batched call reads and writes them at once
 * (the first form of the batched call did, on an H100). */
static int spans_overlapping(const StepPlan *p, const IrGraph *g, int *spans)
{
    int bad = 0;
    *spans = 0;
    for (int t = 0; t < p->n_order; t++) {
        int end = p->dw_span_end[t];
        if (end < 0) continue;
        (*spans)++;
        for (int a = t; a <= end; a++)
            for (int b = t; b <= end; b++)
                for (int k = 0; k < 2; k++)
                    if (a != b && bytes_overlap(p, p->order[a], g->nodes[p->order[b]].in[k])) bad++;
        t = end;
    }
    return bad;
}

static bool is_identity(const StepPlan *p)
{
    for (int t = 0; t < p->n_order; t++)
        if (p->order[t] != t) return false;
    return true;
}

Test(plan_order, bert_base_groups_are_a_valid_schedule)
{
    Pipeline pp;
    bert_base(&pp);
    const IrGraph *g = &pp.g;
    int *order = malloc((size_t)g->n * sizeof *order), *pos = malloc((size_t)g->n * sizeof *pos);
    int moved = plan_order_dw_groups(g, order);
    cr_expect_geq(moved, 40, "%d dW GEMMs moved", moved);
    for (int i = 0; i < g->n; i++) pos[i] = -1;
    for (int t = 0; t < g->n; t++) {
        cr_assert(order[t] >= 0 && order[t] < g->n && pos[order[t]] < 0, "position %d: node %d", t, order[t]);
        pos[order[t]] = t;
    }
    int last_dw = -1;
    for (int i = 0; i < g->n; i++) {
        for (int k = 0; k < g->nodes[i].n_in; k++)
            cr_expect_lt(pos[g->nodes[i].in[k]], pos[i], "node %d (%s) before its input %d", i, g->nodes[i].name,
                         g->nodes[i].in[k]);
        if (pos[i] != i) cr_expect_geq(i, g->n_forward, "forward node %d (%s) moved", i, g->nodes[i].name);
        if (g->nodes[i].op == IR_OP_LINEAR_DW) last_dw = i;
    }
    /* the trailing LN_DW_FIXes among them: the CUDA executor stops before them (cuda_exec.h, fix_from) */
    for (int i = last_dw + 1; i < g->n; i++) cr_expect_eq(pos[i], i, "node %d after the last dW GEMM moved", i);
    cr_expect_geq(long_dw_runs(g, order, 11), 4, "the four weight shapes of 11 layers side by side");
    free(order);
    free(pos);
    pipeline_free(&pp);
}

Test(plan_order, plan_keeps_groups_where_the_arena_stays)
{
    Pipeline pp;
    ModelSpec spec;
    bert_base_spec(&pp, &spec);
    const IrGraph *g = &pp.g;
    HpcError err = {0};
    char why[512] = "";
    StepPlan small, big, big_forced, small_never;
    PlanOptions always = {.dw_group = PLAN_DW_GROUP_ALWAYS}, never = {.dw_group = PLAN_DW_GROUP_NEVER};
    PlanOptions automatic = {.dw_group = PLAN_DW_GROUP_AUTO};
    cr_assert_eq(plan_build_scratch_with(g, 32, 32, NULL, &automatic, &small, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(plan_build_scratch_with(g, 32, 128, NULL, &automatic, &big, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(plan_build_scratch_with(g, 32, 128, NULL, &always, &big_forced, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(plan_build_scratch_with(g, 32, 32, NULL, &never, &small_never, &err), HPC_OK, "%s", err.msg);
    cr_expect(!is_identity(&small) && long_dw_runs(g, small.order, 11) >= 4, "32 x 32: grouped");
    cr_expect_leq(small.arena_bytes, small_never.arena_bytes + small_never.arena_bytes / PLAN_DW_GROUP_GROWTH);
    cr_expect(is_identity(&small_never), "PLAN_DW_GROUP_NEVER: the graph's order");
    cr_expect(is_identity(&big), "32 x 128: the graph's order");
    cr_expect(!is_identity(&big_forced), "32 x 128, PLAN_DW_GROUP_ALWAYS: grouped");
    cr_expect_gt(big_forced.arena_bytes, big.arena_bytes, "the groups keep dy and x alive longer");
    /* what plan_print reports: the choice and the other schedule's arena */
    cr_expect(small.dw_grouped && small.dw_mode == PLAN_DW_GROUP_AUTO && small.dw_moved > 0);
    cr_expect_eq(small.dw_other_arena, small_never.arena_bytes, "32 x 32: the graph order's arena beside");
    cr_expect(!big.dw_grouped && big.dw_moved > 0);
    cr_expect_eq(big.dw_other_arena, big_forced.arena_bytes, "32 x 128: the grouped arena beside");
    cr_expect(big_forced.dw_grouped && big_forced.dw_mode == PLAN_DW_GROUP_ALWAYS);
    cr_expect_eq(big_forced.dw_other_arena, big.arena_bytes);
    cr_expect(!small_never.dw_grouped && small_never.dw_mode == PLAN_DW_GROUP_NEVER);
    cr_expect_eq(small_never.dw_other_arena, 0, "NEVER plans no other schedule");
    char *text = NULL;
    size_t text_len = 0;
    FILE *f = open_memstream(&text, &text_len);
    plan_print(&big, g, &pp.pl, &spec.train, f);
    fclose(f);
    cr_expect(strstr(text, "schedule: the graph's order (HPC_DW_GROUP=auto; the dW GEMMs side by side would plan"),
              "%.400s", text);
    free(text);
    printf("plan_order bert_base fp16: 32x32 arena %.1f MiB grouped (%.1f not); 32x128 %.1f MiB (%.1f grouped)\n",
           small.arena_bytes / 1048576.0, small_never.arena_bytes / 1048576.0, big.arena_bytes / 1048576.0,
           big_forced.arena_bytes / 1048576.0);
    int spans = 0;
    cr_expect_eq(spans_overlapping(&small, g, &spans), 0, "32 x 32: a span's output over another member's input");
    cr_expect_geq(spans, 4);
    cr_expect_eq(spans_overlapping(&big_forced, g, &spans), 0, "32 x 128: a span's output over another's input");
    cr_expect_geq(spans, 4);
    cr_expect_eq(spans_overlapping(&small_never, g, &spans), 0);
    cr_expect_eq(spans, 0, "the graph's order has no spans");
    /* plan_check finds the first form's lifetimes: a span's second member written from its own position */
    bool tampered = false;
    for (int t = 1; t < small.n_order && !tampered; t++)
        if (small.dw_span_end[t] >= 0 && small.dw_span_end[t - 1] == small.dw_span_end[t]) {
            PlanValue *member = &small.v[small.order[t]];
            int def = member->def;
            member->def = t;
            cr_expect(!plan_check(&small, g, why, sizeof why), "a member written from its own position passes");
            cr_expect(strstr(why, "not the span's start"), "%s", why);
            member->def = def;
            tampered = true;
        }
    cr_expect(tampered, "32 x 32: a span with a second member");
    StepPlan *all[] = {&small, &big, &big_forced, &small_never};
    for (int k = 0; k < 4; k++) {
        cr_expect(plan_check(all[k], g, why, sizeof why), "plan %d: %s", k, why);
        for (int t = 0; t < all[k]->n_order; t++) cr_expect_eq(all[k]->position[all[k]->order[t]], t);
        plan_free(all[k]);
    }
    if (!getenv("HPC_DW_GROUP")) {   /* the default is AUTO (plan.h) */
        StepPlan dflt_small, dflt_big;
        cr_assert_eq(plan_build_scratch_with(g, 32, 32, NULL, NULL, &dflt_small, &err), HPC_OK, "%s", err.msg);
        cr_assert_eq(plan_build_scratch_with(g, 32, 128, NULL, NULL, &dflt_big, &err), HPC_OK, "%s", err.msg);
        cr_expect(!is_identity(&dflt_small), "the default at 32 x 32: grouped, as AUTO");
        cr_expect(is_identity(&dflt_big), "the default at 32 x 128: the graph's order, as AUTO");
        plan_free(&dflt_small);
        plan_free(&dflt_big);
    }
    pipeline_free(&pp);
}

/* p0 (4, 8) and p1 (4, 16) f16; dw_a, dw_b, dw_c = LINEAR_DW(p0, p1); r
 * reads dw_a before dw_c, q reads nothing moved.  Graph order: p0 p1 dw_a
 * r dw_b q dw_c; dw_a must stay, dw_b joins dw_c. */
static void early_reader_graph(IrGraph *g)
{
    ir_init(g);
    int p0 = ir_param(g, 0, DT_F16, 2, (int64_t[]){4, 8}, "p0");
    int p1 = ir_param(g, 1, DT_F16, 2, (int64_t[]){4, 16}, "p1");
    int dw_a = ir_add(g, IR_OP_LINEAR_DW, (int[]){p0, p1}, 2, NULL, "dw_a");
    int r = ir_add(g, IR_OP_ADD, (int[]){dw_a, dw_a}, 2, NULL, "r");
    ir_add(g, IR_OP_LINEAR_DW, (int[]){p0, p1}, 2, NULL, "dw_b");
    ir_add(g, IR_OP_ADD, (int[]){r, r}, 2, NULL, "q");
    int dw_c = ir_add(g, IR_OP_LINEAR_DW, (int[]){p0, p1}, 2, NULL, "dw_c");
    cr_assert_eq(g->nodes[dw_c].dims[0], 8);
    g->n_forward = dw_a;   /* ir_add counts every node as forward (autodiff sets the split) */
}

Test(plan_order, a_member_read_early_stays)
{
    IrGraph g;
    early_reader_graph(&g);
    int order[7];
    cr_expect_eq(plan_order_dw_groups(&g, order), 1);
    int want[7] = {0, 1, 2, 3, 5, 4, 6};   /* p0 p1 dw_a r q dw_b dw_c */
    for (int t = 0; t < 7; t++) cr_expect_eq(order[t], want[t], "position %d: %d, want %d", t, order[t], want[t]);
    ir_free(&g);
}

/* HPC_DW_GROUP as plan.h says: 1 groups, 0 keeps the graph's order,
 * anything but those, auto and empty fails with HPC_ERR_USAGE naming the
 * setting. */
Test(plan_order, the_setting_is_read_or_refused)
{
    IrGraph g;
    early_reader_graph(&g);
    StepPlan p;
    HpcError err = {0};
    setenv("HPC_DW_GROUP", "1", 1);
    cr_assert_eq(plan_build_scratch_with(&g, 1, 1, NULL, NULL, &p, &err), HPC_OK, "%s", err.msg);
    cr_expect(!is_identity(&p), "HPC_DW_GROUP=1: dw_b next to dw_c");
    plan_free(&p);
    setenv("HPC_DW_GROUP", "0", 1);
    cr_assert_eq(plan_build_scratch_with(&g, 1, 1, NULL, NULL, &p, &err), HPC_OK, "%s", err.msg);
    cr_expect(is_identity(&p), "HPC_DW_GROUP=0: the graph's order");
    plan_free(&p);
    setenv("HPC_DW_GROUP", "", 1);
    cr_assert_eq(plan_build_scratch_with(&g, 1, 1, NULL, NULL, &p, &err), HPC_OK, "%s", err.msg);
    plan_free(&p);
    setenv("HPC_DW_GROUP", "yes", 1);
    cr_expect_eq(plan_build_scratch_with(&g, 1, 1, NULL, NULL, &p, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "HPC_DW_GROUP=yes") && strstr(err.msg, "auto"), "%s", err.msg);
    /* PlanOptions.dw_group wins over the environment */
    cr_assert_eq(plan_build_scratch_with(&g, 1, 1, NULL, &(PlanOptions){.dw_group = PLAN_DW_GROUP_NEVER}, &p, &err),
                 HPC_OK, "%s", err.msg);
    cr_expect(is_identity(&p));
    plan_free(&p);
    unsetenv("HPC_DW_GROUP");
    ir_free(&g);
}

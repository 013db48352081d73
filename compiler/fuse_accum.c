/* compiler/fuse_accum.c — the fuse rule that sums a gradient inside its dX
 * GEMM (see fuse.h for the rewrite, fuse_internal.h for the matcher).
 *
 * ADD(acc, LINEAR_DX(dy, W)) (either order), with acc and the ADD stored in
 * f32 and the LINEAR_DX read by nothing else, becomes
 * LINEAR_DX_ACC(dy, W, acc) = acc + dy W, placed at the ADD.  In a BERT
 * backward pass acc is the residual stream's gradient (LayerNorm-site
 * backward's ds) and the LINEAR_DX the FFN input's or Q/K/V's dX; a chain
 * ds + dXq + dXk + dXv becomes three LINEAR_DX_ACC, each reading the one
 * before as its acc.  Nothing stores dX in 16 bits any more and no ADD
 * kernel reads it back: on the GPU the GEMM's epilogue adds C (beta = 1).
 * The sum is also more exact: the unfused chain rounds dy W to f16/bf16
 * before the f32 add; the fused op never does (cpu_linear_dx_acc says
 * which roundings remain).
 *
 * The executor writes the result over acc (cuBLASLt with C = D), so the
 * rule fuses only where that is legal in the graph it builds:
 *   - acc is a value of the backward pass that the step computes (not a
 *     parameter, a batch input, the loss, the logits or a gradient the
 *     optimizer reads: those must survive the step);
 *   - no node after the ADD reads acc, counting the inputs of the fused
 *     nodes other rules placed (they may read later than their members);
 *   - dy and W are not overwritten before the ADD by an earlier fused
 *     node of this rule: the LINEAR_DX's reads move to the ADD's place.
 * plan.h then gives the output acc's storage (plan_inplace_input); the
 * planner checks the same conditions again and keeps them apart when they
 * fail (the GEMM then reads C and writes a separate D).
 *
 * FuseOptions.accumulate (HPC_FUSE_ACCUM=0 turns it off) decides whether
 * the rule runs. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "fuse_internal.h"

static bool is_role(const IrGraph *g, int v)
{
    if (v == g->loss || v == g->logits) return true;
    for (int p = 0; p < g->n_params && g->param_grad; p++)
        if (g->param_grad[p] == v) return true;
    return false;
}

/* The inputs node i has in the rebuilt graph: its own (COPY), its fused
 * node's (REPLACE), none (DROP, ALIAS: the fused node elsewhere reads). */
static int effective_inputs(const Matcher *M, int i, const int **in)
{
    if (M->action[i] == FUSE_COPY) {
        *in = fuse_node(M, i)->in;
        return fuse_node(M, i)->n_in;
    }
    if (M->action[i] == FUSE_REPLACE) {
        *in = M->repl[i].in;
        return M->repl[i].n_in;
    }
    return 0;
}

static bool read_after(const Matcher *M, int v, int after)
{
    for (int i = after + 1; i < M->g->n; i++) {
        const int *in;
        int n = effective_inputs(M, i, &in);
        for (int k = 0; k < n; k++)
            if (in[k] == v) return true;
    }
    return false;
}

static bool is_free_dx(const Matcher *M, int d)
{
    const IrNode *x = fuse_node(M, d);
    return x->op == IR_OP_LINEAR_DX && x->backward && M->action[d] == FUSE_COPY && M->n_uses[d] == 1;
}

static bool computed_backward(const IrNode *n)
{
    return n->backward && n->op != IR_OP_PARAM && n->op != IR_OP_INPUT && n->op != IR_OP_POSITIONS;
}

/* clobbered[v]: the place of the fused node that writes over v (INT_MAX: none). */
static void match_accum(Matcher *M, int a, int *clobbered)
{
    const IrNode *add = fuse_node(M, a);
    if (!add->backward || M->action[a] != FUSE_COPY || add->dtype != DT_F32) return;
    for (int k = 0; k < 2; k++) {
        int d = add->in[k], acc = add->in[1 - k];
        if (d == acc || !is_free_dx(M, d)) continue;
        const IrNode *x = fuse_node(M, d), *an = fuse_node(M, acc);
        if (an->dtype != DT_F32 || !computed_backward(an) || is_role(M->g, acc) || clobbered[acc] != INT_MAX)
            continue;
        if (clobbered[x->in[0]] < a || clobbered[x->in[1]] < a || read_after(M, acc, a)) continue;
        IrNode *r = &M->repl[a];
        *r = *add;   /* name, dtype (f32), flags and region of the sum */
        r->op = IR_OP_LINEAR_DX_ACC;
        r->n_in = 3;
        int in[3] = {x->in[0], x->in[1], acc};
        for (int q = 0; q < IR_MAX_INPUTS; q++) r->in[q] = q < 3 ? in[q] : -1;
        /* mid: the 16 bits the unfused chain stored dX in (listings say so). */
        fuse_attr_set(&r->attr, (IrFusedAttr){.mid = (uint8_t)x->dtype});
        M->action[a] = FUSE_REPLACE;
        M->action[d] = FUSE_DROP;
        clobbered[acc] = a;
        M->stats->linear_dx_acc++;
        return;
    }
}

void fuse_match_accum(Matcher *M)
{
    if (!M->opts.accumulate) return;
    int n = M->g->n;
    int *clobbered = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *clobbered);
    for (int i = 0; i < n; i++) clobbered[i] = INT_MAX;
    for (int i = 0; i < n; i++)
        if (fuse_node(M, i)->op == IR_OP_ADD) match_accum(M, i, clobbered);
    free(clobbered);
}

void fuse_accum_plan(const IrGraph *out, PrecisionPlan *plan)
{
    for (int i = 0; i < out->n; i++) {
        const IrNode *n = &out->nodes[i];
        if (n->op != IR_OP_LINEAR_DX_ACC) continue;
        /* A GEMM: LOW class, computed in its operands' dtype (f32 accumulate). */
        plan->info[i].cls = PREC_CLASS_LOW;
        plan->info[i].compute = out->nodes[n->in[0]].dtype;
    }
}

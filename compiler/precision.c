/* compiler/precision.c — the precision planner; see precision.h. */
#include "precision.h"

#include <stdlib.h>
#include <string.h>

#include "compiler/ir_build.h"

/* dtype slots of the per-value caches */
enum { SLOT_F32, SLOT_F16, SLOT_BF16, N_SLOTS };

typedef struct {
    const IrGraph *in;
    IrGraph *out;
    PrecisionPlan *plan;
    int info_cap;
    int (*cast)[N_SLOTS];      /* (in->n) id in out of the value cast to a dtype, -1 */
    int (*low_param)[2];       /* (n_params) id in out of the f16 / bf16 copy, -1 */
    bool *grad_f32;            /* (in->n) a parameter gradient: stored in f32 */
    bool *grad_sum;            /* (in->n) an ADD summing a parameter's gradient */
    bool *lin_grad;            /* (in->n) a LINEAR's weight or bias gradient (mark_linear_grads) */
    bool backward;             /* the node being planned is a backward node */
    unsigned keep;             /* PrecisionOptions.keep_f32 */
    bool low_dw;               /* PrecisionOptions.low_weight_grads */
    int *user;                 /* (in->n) the forward LINEAR (weight) or MATMUL (operand)
                                  reading a value: -1 none, -2 several */
    int *dropout_of_salt;      /* (in->n) forward DROPOUT with that salt, -1 */
    int *target;               /* (in->n) grad_target of each backward node, -1 unknown */
    unsigned char *attn;       /* (in->n) ATTN_SCORES / ATTN_PROBS for forward values */
} Planner;

/* Roles of forward values in attention (PREC_KEEP_SCORES). */
enum { ATTN_NONE, ATTN_SCORES, ATTN_PROBS };
/* The `prec` column of program/ops.def. */
static const PrecClass op_class[] = {
#define IR_OP(E, name, nmin, nmax, nout, prec, ...) PREC_CLASS_##prec,
#include "program/ops.def"
#undef IR_OP
};
_Static_assert(sizeof op_class / sizeof op_class[0] == IR_OP_COUNT, "ops.def and the class table disagree");

PrecClass precision_op_class(IrOpKind op)
{
    HPC_ASSERT(op >= 0 && op < IR_OP_COUNT);
    return op_class[op];
}

const char *precision_class_name(PrecClass c)
{
    switch (c) {
    case PREC_CLASS_NONE: return "-";
    case PREC_CLASS_LOW: return "low";
    case PREC_CLASS_F32_COMPUTE: return "f32-compute";
    case PREC_CLASS_F32: return "f32";
    case PREC_CLASS_CAST: return "cast";
    }
    return "?";
}

_Static_assert((int)PREC_REGION_EMBEDDINGS == (int)IR_REGION_EMBEDDINGS && (int)PREC_REGION_STACK ==
                   (int)IR_REGION_STACK && (int)PREC_REGION_HEAD == (int)IR_REGION_HEAD,
               "PrecRegion and IrRegion list the regions in one order");

const char *precision_region_name(PrecRegion r)
{
    switch (r) {
    case PREC_REGION_EMBEDDINGS: return "embeddings";
    case PREC_REGION_STACK: return "stack";
    case PREC_REGION_HEAD: return "head";
    }
    return "?";
}

static int slot_of(DType dt)
{
    return dt == DT_F16 ? SLOT_F16 : dt == DT_BF16 ? SLOT_BF16 : SLOT_F32;
}

static DType dtype_of_prec(SpecPrecision p, DType policy_low)
{
    switch (p) {
    case PREC_DEFAULT: return policy_low;
    case PREC_FP32: return DT_F32;
    case PREC_FP16: return DT_F16;
    case PREC_BF16: return DT_BF16;
    }
    return policy_low;
}

/* ---- regions ---------------------------------------------------------- */

/* A node's region is the field lowering set (program/ir.h: IrRegion, in
 * the order of PrecRegion).  A backward node is planned with the forward
 * op whose backward rule made it: the region of its incoming gradient (the
 * first backward input), which is that of the op's output.  An ADD that sums the contributions to one
 * gradient goes with its first contribution, so that a gradient crossing
 * a region boundary is summed on the producers' side and cast once. */
static PrecRegion region_of(const IrGraph *g, int id)
{
    const IrNode *n = &g->nodes[id];
    if (n->backward && n->op == IR_OP_ADD) return region_of(g, n->in[0]);
    if (n->backward)
        for (int k = 0; k < n->n_in; k++)
            if (g->nodes[n->in[k]].backward) return (PrecRegion)g->nodes[n->in[k]].region;
    return (PrecRegion)n->region;
}

/* ---- parameter gradients ---------------------------------------------- */

static bool produces_param_grad(IrOpKind op)
{
    return op == IR_OP_LINEAR_DW || op == IR_OP_BIAS_GRAD || op == IR_OP_LAYERNORM_DGAMMA ||
           op == IR_OP_EMBEDDING_BWD || op == IR_OP_ADD;
}

/* For low_weight_grads: marks in P->lin_grad the gradients of the
 * parameters a forward LINEAR reads as its weight (directly or stacked:
 * fuse_qkv), which AMP keeps in 16 bits (the dW GEMM's output); for a
 * stacked one also its UNSTACK and the node that UNSTACK splits.  A bias
 * gradient is marked only where stacked: the Q/K/V bias gradient comes
 * out of the dW GEMM (its ones column, docs/fuse.md: xhat_ones), one dtype
 * with the weight's, while an unstacked bias gradient stays f32 so that the
 * LayerNorm site after its LINEAR sums it in its backward kernel
 * (fuse_layernorm), as without the option, and no dW GEMM takes a bias
 * epilogue for it (the BGRADB epilogue costs a GEMM 15-35 %); a bias is one
 * row of its weight, its bytes do not matter.  A gradient summed from
 * several uses (a tied weight) stays f32, as the sum of its contributions. */
static void mark_linear_grads(Planner *P)
{
    const IrGraph *g = P->in;
    if (!g->param_grad) return;
    for (int i = 0; i < g->n_forward; i++) {
        const IrNode *n = &g->nodes[i];
        if (n->op != IR_OP_LINEAR) continue;
        for (int k = 1; k < n->n_in && k < 3; k++) {
            const IrNode *w = &g->nodes[n->in[k]];
            if (k == 2 && w->op != IR_OP_STACK) continue;   /* an unstacked bias: f32 (above) */
            int parts = w->op == IR_OP_STACK ? w->n_in : 1;
            for (int j = 0; j < parts; j++) {
                const IrNode *q = w->op == IR_OP_STACK ? &g->nodes[w->in[j]] : w;
                if (q->op != IR_OP_PARAM || q->attr.param.index >= g->n_params) continue;
                int v = g->param_grad[q->attr.param.index], s = v;
                if (v < 0) continue;
                const IrNode *u = &g->nodes[v];
                if (u->op == IR_OP_OUTPUT && g->nodes[u->in[0]].op == IR_OP_UNSTACK) s = u->in[0], u = &g->nodes[s];
                int src = u->op == IR_OP_UNSTACK ? u->in[0] : s;
                IrOpKind op = g->nodes[src].op;
                /* only a gradient one GEMM or column sum writes: not a sum of uses (a tied weight) */
                if (op != IR_OP_LINEAR_DW && op != IR_OP_BIAS_GRAD) continue;
                P->lin_grad[v] = P->lin_grad[s] = P->lin_grad[src] = true;
            }
        }
    }
}

/* Marks v (and, through gradient-summing ADDs, its contributions) as a
 * parameter gradient stored in f32, if v is used by nothing else. */
static void mark_grad(Planner *P, const int *n_uses, int v, int allowed_uses)
{
    const IrNode *n = &P->in->nodes[v];
    /* The gradient of a STACK of parameters (compiler/fuse_qkv.c): the
     * UNSTACK's three parts are the gradients, so they, the UNSTACK (read
     * by its two OUTPUT nodes) and the gradient it splits are f32. */
    if (n->backward && n->op == IR_OP_OUTPUT && P->in->nodes[n->in[0]].op == IR_OP_UNSTACK) {
        if (n_uses[v] == allowed_uses && !(P->low_dw && P->lin_grad[v])) P->grad_f32[v] = true;
        return;
    }
    if (n->backward && n->op == IR_OP_UNSTACK) {
        if (n_uses[v] != allowed_uses + 2) return;
        if (P->low_dw && P->lin_grad[v]) return;   /* views of the low gradient */
        P->grad_f32[v] = true;
        mark_grad(P, n_uses, n->in[0], 1);
        return;
    }
    if (!n->backward || !produces_param_grad(n->op) || n_uses[v] != allowed_uses) return;
    if (P->low_dw && P->lin_grad[v]) return;   /* stored low, as AMP keeps it */
    P->grad_f32[v] = true;
    if (n->op != IR_OP_ADD) return;
    P->grad_sum[v] = true;
    for (int k = 0; k < n->n_in; k++) mark_grad(P, n_uses, n->in[k], 1);
}

static void mark_param_grads(Planner *P)
{
    const IrGraph *g = P->in;
    int *n_uses = xcalloc((size_t)g->n, sizeof *n_uses);
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) n_uses[g->nodes[i].in[k]]++;
    for (int p = 0; p < g->n_params && g->param_grad; p++)
        if (g->param_grad[p] >= 0) mark_grad(P, n_uses, g->param_grad[p], 0);
    free(n_uses);
}

/* ---- building the planned graph --------------------------------------- */

static void plan_note(Planner *P, int id, PrecClass cls, PrecRegion region, DType compute, int origin)
{
    PrecisionPlan *pl = P->plan;
    if (id >= P->info_cap) {
        P->info_cap = 2 * id + 64;
        pl->info = xrealloc(pl->info, (size_t)P->info_cap * sizeof *pl->info);
    }
    pl->info[id] = (PrecNodeInfo){ cls, region, compute, origin };
    pl->n = id + 1;
}

/* The value of input node u (an id in `in`) as dtype dt, casting once. */
static int value_as(Planner *P, int u, DType dt, PrecRegion region)
{
    int v = P->plan->map[u];
    const IrNode *src = &P->out->nodes[v];
    if (src->dtype == dt || !ir_dtype_is_float(src->dtype)) return v;
    int *slot = &P->cast[u][slot_of(dt)];
    if (*slot >= 0) return *slot;
    char name[IR_NAME_MAX];
    snprintf(name, sizeof name, "%.*s.to_%s", IR_NAME_MAX - 9, src->name, ir_dtype_name(dt));
    IrAttr a = {.cast = {dt}};
    bool rg = src->requires_grad;
    *slot = ir_add(P->out, IR_OP_CAST, &v, 1, &a, name);
    P->out->nodes[*slot].backward = P->backward;
    P->out->nodes[*slot].requires_grad = rg;
    plan_note(P, *slot, PREC_CLASS_CAST, region, DT_F32, -1);
    P->plan->n_casts++;
    return *slot;
}

/* The low-precision copy of parameter node u: a PARAM node of dtype dt that
 * the optimizer writes; a second low dtype of one parameter is a cast. */
static int param_as(Planner *P, int u, DType dt, PrecRegion region)
{
    const IrNode *p = &P->in->nodes[u];
    int idx = p->attr.param.index, s = dt == DT_F16 ? 0 : 1;
    if (dt == DT_F32) return P->plan->map[u];
    if (P->low_param[idx][s] >= 0) return P->low_param[idx][s];
    DType *low = &P->plan->param_low[idx];
    if (*low != DT_F32 && *low != dt) return P->low_param[idx][s] = value_as(P, u, dt, region);
    *low = dt;
    int id = ir_param(P->out, idx, dt, p->rank, p->dims, p->name);
    plan_note(P, id, PREC_CLASS_NONE, region, dt, -1);
    return P->low_param[idx][s] = id;
}

/* The dtype op input k of class cls in a region of dtype low wants;
 * `stored` is the input's planned dtype (f32-compute ops read it as it is). */
static DType wanted_input(PrecClass cls, bool is_param, DType low, DType stored)
{
    switch (cls) {
    case PREC_CLASS_LOW: return low;
    case PREC_CLASS_F32_COMPUTE: return is_param ? DT_F32 : stored;
    default: return DT_F32;
    }
}

/* ---- storage of f32-compute outputs ------------------------------------ */

static DType wider(DType a, DType b) { return a == b ? a : DT_F32; }

static DType planned_dtype(const Planner *P, int u) { return P->out->nodes[P->plan->map[u]].dtype; }

/* Forward users the gradient rules look up: the LINEAR that reads a weight,
 * the MATMUL that reads an operand, the DROPOUT of each salt. */
static void index_users(Planner *P)
{
    const IrGraph *g = P->in;
    for (int i = 0; i < g->n_forward; i++) {
        const IrNode *n = &g->nodes[i];
        if (n->op == IR_OP_DROPOUT && n->attr.dropout.salt >= 0 && n->attr.dropout.salt < g->n)
            P->dropout_of_salt[n->attr.dropout.salt] = i;
        if (n->op == IR_OP_SOFTMAX) {
            P->attn[i] = ATTN_PROBS;
            if (g->nodes[n->in[0]].op == IR_OP_MATMUL) P->attn[n->in[0]] = ATTN_SCORES;
        }
        if (n->op == IR_OP_DROPOUT && P->attn[n->in[0]] == ATTN_PROBS) P->attn[i] = ATTN_PROBS;
        int from = n->op == IR_OP_LINEAR ? 1 : 0, to = n->op == IR_OP_LINEAR ? 2 : n->op == IR_OP_MATMUL ? 2 : 0;
        for (int k = from; k < to; k++) {
            int *u = &P->user[n->in[k]];
            *u = *u == -1 || *u == i ? i : -2;
        }
    }
}

/* The forward value (an id of the input graph) whose gradient backward node
 * i holds, or -1 when the rule cannot tell.  Each case reads the forward
 * inputs that the op's backward rule (compiler/ops.c) gave the node. */
static int grad_target(const Planner *P, int i)
{
    const IrGraph *g = P->in;
    const IrNode *n = &g->nodes[i];
    switch (n->op) {
    case IR_OP_ADD:                  /* a sum of contributions: the value of the first */
        return g->nodes[n->in[0]].backward ? P->target[n->in[0]] : -1;
    case IR_OP_LAYERNORM_DX:         /* (dy, x, gamma) */
    case IR_OP_ACT_BWD:              /* (dy, x) */
    case IR_OP_CROSS_ENTROPY_BWD:    /* (dy, logits, labels) */
    case IR_OP_MSE_BWD:              /* (dy, pred, targets) */
    case IR_OP_SOFTMAX_DROPOUT_BWD:  /* (dy, scores, mask) */
        return n->in[1];
    case IR_OP_SOFTMAX_BWD: {        /* (dy, probs): the scores */
        const IrNode *y = &g->nodes[n->in[1]];
        return y->op == IR_OP_SOFTMAX && !y->backward ? y->in[0] : -1;
    }
    case IR_OP_DROPOUT: {            /* the forward dropout of the same mask */
        int s = n->attr.dropout.salt, f = s >= 0 && s < g->n ? P->dropout_of_salt[s] : -1;
        return f >= 0 ? g->nodes[f].in[0] : -1;
    }
    case IR_OP_LINEAR_DX: {          /* (dy, W): the x of the LINEAR reading W */
        int f = P->user[n->in[1]];
        return f >= 0 && g->nodes[f].op == IR_OP_LINEAR ? g->nodes[f].in[0] : -1;
    }
    case IR_OP_MATMUL: {             /* reads dy and one forward operand: the other */
        int u = g->nodes[n->in[0]].backward ? n->in[1] : n->in[0];
        int f = P->user[u];
        if (f < 0 || g->nodes[f].op != IR_OP_MATMUL) return -1;
        return g->nodes[f].in[0] == u ? g->nodes[f].in[1] : g->nodes[f].in[0];
    }
    case IR_OP_SPLIT_HEADS:          /* layout ops: the input of the forward op */
    case IR_OP_MERGE_HEADS:          /* whose output dy is the gradient of */
    case IR_OP_SLICE_FIRST_BWD:
    case IR_OP_SLICE_LAST_BWD:
    case IR_OP_SPAN_TOKEN_BWD:
    case IR_OP_CAST: {
        IrOpKind fwd = n->op == IR_OP_SPLIT_HEADS ? IR_OP_MERGE_HEADS
                     : n->op == IR_OP_MERGE_HEADS ? IR_OP_SPLIT_HEADS
                     : n->op == IR_OP_SLICE_FIRST_BWD ? IR_OP_SLICE_FIRST
                     : n->op == IR_OP_SLICE_LAST_BWD ? IR_OP_SLICE_LAST
                     : n->op == IR_OP_SPAN_TOKEN_BWD ? IR_OP_SPAN_TOKEN : IR_OP_CAST;
        int t = g->nodes[n->in[0]].backward ? P->target[n->in[0]] : -1;
        return t >= 0 && g->nodes[t].op == fwd && !g->nodes[t].backward ? g->nodes[t].in[0] : -1;
    }
    default:
        return -1;
    }
}

/* The storage dtype of forward node n (class f32-compute) whose inputs are
 * planned as ins, in a region of dtype low. */
static DType forward_storage(const Planner *P, const IrNode *n, const int *ins, PrecRegion region, DType low)
{
    unsigned keep = P->keep;
    bool any_f32 = false;
    for (int k = 0; k < n->n_in; k++)
        any_f32 |= P->out->nodes[ins[k]].dtype == DT_F32 && P->out->nodes[ins[k]].op != IR_OP_PARAM;
    switch (n->op) {
    case IR_OP_MATMUL:   /* class low: only the attention scores may be f32 */
        return keep & PREC_KEEP_SCORES && P->attn[n - P->in->nodes] == ATTN_SCORES ? DT_F32 : low;
    case IR_OP_EMBEDDING:
        return keep & PREC_KEEP_EMBEDDINGS ? DT_F32 : low;
    case IR_OP_ADD:
        return keep & PREC_KEEP_RESIDUAL || (keep && any_f32) ? DT_F32 : low;
    case IR_OP_LAYERNORM:
        return keep & PREC_KEEP_NORM_OUT ||
               (keep & PREC_KEEP_EMBEDDINGS && region == PREC_REGION_EMBEDDINGS) ? DT_F32 : low;
    case IR_OP_SOFTMAX:
        return keep & PREC_KEEP_PROBS ? DT_F32 : low;
    case IR_OP_ACT:
        return keep & PREC_KEEP_ACT ? DT_F32 : low;
    case IR_OP_DROPOUT:
    case IR_OP_SPLIT_HEADS:
    case IR_OP_MERGE_HEADS:
    case IR_OP_SLICE_FIRST:
    case IR_OP_SLICE_LAST:
    case IR_OP_SPAN_TOKEN:
        return keep ? P->out->nodes[ins[0]].dtype : low;
    default:
        return low;
    }
}

/* The storage dtype of backward node i (not a parameter gradient). */
static DType backward_storage(Planner *P, int i, const int *ins, DType low)
{
    const IrNode *n = &P->in->nodes[i];
    if (!(P->keep & PREC_KEEP_GRADS)) return low;
    if (P->low_dw && P->lin_grad[i] && n->op == IR_OP_BIAS_GRAD) return low;   /* as AMP keeps it */
    /* A GEMM's input gradient is low: its input was low (autocast's cast),
     * and autograd stores the gradient of that cast in 16 bits; the sums
     * and f32-compute ops after it widen it to the value's format. */
    if (n->op == IR_OP_ADD) {   /* summed in the wider of the contributions and the value's format */
        DType d = wider(P->out->nodes[ins[0]].dtype, P->out->nodes[ins[1]].dtype);
        for (int k = 0; k < 2; k++) {
            int t = P->target[n->in[k]];
            if (t >= 0 && !P->in->nodes[t].backward && ir_dtype_is_float(planned_dtype(P, t)))
                d = wider(d, planned_dtype(P, t));
        }
        return d;
    }
    /* A scatter of dy into zeros (the slices' backward) computes nothing:
     * it keeps at least dy's format, so a wide dy stays wide (the last
     * layer lowered for token 0 scatters the f32 residual gradient). */
    bool scatter = n->op == IR_OP_SLICE_FIRST_BWD || n->op == IR_OP_SLICE_LAST_BWD || n->op == IR_OP_SPAN_TOKEN_BWD;
    DType least = scatter ? P->out->nodes[ins[0]].dtype : low;
    int t = P->target[i];
    if (t < 0 || P->in->nodes[t].backward || !ir_dtype_is_float(planned_dtype(P, t))) return wider(low, least);
    if (P->keep & PREC_KEEP_SCORES && P->attn[t] == ATTN_PROBS) return DT_F32;   /* dP, as in flash attention */
    if (P->keep & PREC_KEEP_SCORES && P->attn[t] == ATTN_SCORES) return low;     /* dS: read by GEMMs only */
    if (precision_op_class(n->op) == PREC_CLASS_LOW) return low;
    return wider(planned_dtype(P, t), least);
}

static void plan_leaf(Planner *P, int i)
{
    const IrNode *n = &P->in->nodes[i];
    int id = n->op == IR_OP_PARAM
        ? ir_param(P->out, n->attr.param.index, n->dtype, n->rank, n->dims, n->name)
        : ir_add(P->out, n->op, NULL, 0, &n->attr, n->name);
    P->out->nodes[id].requires_grad = n->requires_grad;
    P->out->nodes[id].backward = n->backward;
    P->plan->map[i] = id;
    plan_note(P, id, PREC_CLASS_NONE, region_of(P->in, i), n->dtype, i);
}

static void plan_op(Planner *P, int i)
{
    const IrNode *n = &P->in->nodes[i];
    PrecClass cls = P->grad_sum[i] ? PREC_CLASS_F32 : precision_op_class(n->op);
    PrecRegion region = region_of(P->in, i);
    DType low = P->plan->region_dtype[region];
    int ins[IR_MAX_INPUTS];
    P->backward = n->backward;
    if (n->backward) P->target[i] = grad_target(P, i);
    for (int k = 0; k < n->n_in; k++) {
        int u = n->in[k];
        if (n->op == IR_OP_OUTPUT) { ins[k] = P->plan->map[u]; continue; } /* the op itself, never a cast */
        bool is_param = P->in->nodes[u].op == IR_OP_PARAM;
        DType want = wanted_input(cls, is_param, low, planned_dtype(P, u));
        ins[k] = is_param ? param_as(P, u, want, region) : value_as(P, u, want, region);
    }
    DType store = DT_F32;
    if (P->grad_f32[i] || cls == PREC_CLASS_F32 || low == DT_F32) store = DT_F32;
    else if (n->backward) store = backward_storage(P, i, ins, low);
    else if (cls == PREC_CLASS_F32_COMPUTE || n->op == IR_OP_MATMUL) store = forward_storage(P, n, ins, region, low);
    else store = low;
    IrAttr attr = n->attr;
    if (n->op == IR_OP_CAST) attr.cast.to = store;   /* a cast already in the graph keeps its place */
    int id = ir_add(P->out, n->op, ins, n->n_in, &attr, n->name);
    IrNode *o = &P->out->nodes[id];
    o->requires_grad = n->requires_grad;
    o->backward = n->backward;
    if (ir_dtype_is_float(o->dtype) && n->op != IR_OP_OUTPUT) o->dtype = store;   /* a projection's dtype is its op's rule */
    P->plan->map[i] = id;
    plan_note(P, id, cls, region, cls == PREC_CLASS_LOW ? low : DT_F32, i);
}

/* Parameter gradients the f32 rule could not cover (a gradient value also
 * used elsewhere) get a cast, so the optimizer reads f32; but for
 * low_weight_grads, which the optimizer reads as they are. */
static void plan_param_grads(Planner *P)
{
    const IrGraph *in = P->in;
    IrGraph *out = P->out;
    out->n_params = in->n_params;
    if (!in->param_grad) return;
    out->param_grad = xmalloc((size_t)in->n_params * sizeof *out->param_grad);
    P->backward = true;
    for (int p = 0; p < in->n_params; p++) {
        int v = in->param_grad[p];
        bool as_is = v >= 0 && P->low_dw && P->lin_grad[v];
        out->param_grad[p] = v < 0 ? -1 : as_is ? P->plan->map[v] : value_as(P, v, DT_F32, region_of(in, v));
    }
}

static HpcStatus plan_check_input(const IrGraph *in, SpecPrecision policy, HpcError *err)
{
    if (policy != PREC_FP32 && policy != PREC_FP16 && policy != PREC_BF16)
        return hpc_fail(err, HPC_ERR_USAGE, "precision_plan: policy must be fp32, fp16 or bf16, not %s",
                        spec_precision_name(policy));
    for (int i = 0; i < in->n; i++) {
        DType dt = in->nodes[i].dtype;
        if (dt != DT_F32 && dt != DT_I32)
            return hpc_fail(err, HPC_ERR_USAGE,
                            "precision_plan: value %d (%s) is already %s; the pass plans the all-f32 "
                            "graph that lower and autodiff produce, once", i, in->nodes[i].name,
                            ir_dtype_name(dt));
    }
    return HPC_OK;
}

static void plan_regions(PrecisionPlan *pl, const ModelSpec *spec, SpecPrecision policy)
{
    DType low = policy == PREC_FP16 ? DT_F16 : policy == PREC_BF16 ? DT_BF16 : DT_F32;
    bool pins = policy != PREC_FP32;   /* the fp32 policy changes nothing */
    pl->region_dtype[PREC_REGION_EMBEDDINGS] = pins ? dtype_of_prec(spec->stack.embedding_precision, low) : low;
    pl->region_dtype[PREC_REGION_STACK] = pins ? dtype_of_prec(spec->stack.precision, low) : low;
    pl->region_dtype[PREC_REGION_HEAD] = pins ? dtype_of_prec(spec->head.precision, low) : low;
}

static int max_param_index(const IrGraph *g)
{
    int n = g->n_params;
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i].op == IR_OP_PARAM && g->nodes[i].attr.param.index >= n)
            n = g->nodes[i].attr.param.index + 1;
    return n;
}

static void planner_init(Planner *P, const IrGraph *in, IrGraph *out, PrecisionPlan *pl)
{
    *P = (Planner){ .in = in, .out = out, .plan = pl };
    pl->n_in = in->n;
    pl->map = xmalloc((size_t)(in->n > 0 ? in->n : 1) * sizeof *pl->map);
    pl->n_params = max_param_index(in);
    pl->param_low = xmalloc((size_t)(pl->n_params > 0 ? pl->n_params : 1) * sizeof *pl->param_low);
    P->low_param = xmalloc((size_t)(pl->n_params > 0 ? pl->n_params : 1) * sizeof *P->low_param);
    for (int p = 0; p < pl->n_params; p++) {
        pl->param_low[p] = DT_F32;
        P->low_param[p][0] = P->low_param[p][1] = -1;
    }
    P->cast = xmalloc((size_t)(in->n > 0 ? in->n : 1) * sizeof *P->cast);
    for (int i = 0; i < in->n; i++) P->cast[i][0] = P->cast[i][1] = P->cast[i][2] = -1;
    P->grad_f32 = xcalloc((size_t)(in->n > 0 ? in->n : 1), sizeof *P->grad_f32);
    P->grad_sum = xcalloc((size_t)(in->n > 0 ? in->n : 1), sizeof *P->grad_sum);
    P->lin_grad = xcalloc((size_t)(in->n > 0 ? in->n : 1), sizeof *P->lin_grad);
    P->user = xmalloc((size_t)(in->n > 0 ? in->n : 1) * sizeof *P->user);
    P->dropout_of_salt = xmalloc((size_t)(in->n > 0 ? in->n : 1) * sizeof *P->dropout_of_salt);
    P->target = xmalloc((size_t)(in->n > 0 ? in->n : 1) * sizeof *P->target);
    P->attn = xcalloc((size_t)(in->n > 0 ? in->n : 1), sizeof *P->attn);
    for (int i = 0; i < in->n; i++) P->user[i] = P->dropout_of_salt[i] = P->target[i] = -1;
}

static void planner_free(Planner *P)
{
    free(P->cast);
    free(P->low_param);
    free(P->grad_f32);
    free(P->grad_sum);
    free(P->lin_grad);
    free(P->user);
    free(P->dropout_of_salt);
    free(P->target);
    free(P->attn);
}

PrecisionOptions precision_defaults(void) { return (PrecisionOptions){.keep_f32 = PREC_KEEP_DEFAULT}; }

static const struct {
    unsigned bit;
    const char *name;
} keep_names[] = {
    {PREC_KEEP_EMBEDDINGS, "embeddings"}, {PREC_KEEP_RESIDUAL, "residual"}, {PREC_KEEP_NORM_OUT, "norm"},
    {PREC_KEEP_GRADS, "grads"},           {PREC_KEEP_PROBS, "probs"},       {PREC_KEEP_ACT, "act"},
    {PREC_KEEP_SCORES, "scores"},
};
#define N_KEEP_NAMES (int)(sizeof keep_names / sizeof keep_names[0])

void precision_keep_format(unsigned keep, char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int k = 0; k < N_KEEP_NAMES && len < size; k++)
        if (keep & keep_names[k].bit)
            len += (size_t)snprintf(buf + len, size - len, "%s%s", len ? "," : "", keep_names[k].name);
    if (len == 0) snprintf(buf, size, "none");
}

bool precision_keep_parse(const char *list, unsigned *keep)
{
    unsigned bits = 0;
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        bool found = false;
        if (len == 4 && strncmp(p, "none", 4) == 0) found = true;
        else if (len == 7 && strncmp(p, "default", 7) == 0) bits |= PREC_KEEP_DEFAULT, found = true;
        else if (len == 3 && strncmp(p, "all", 3) == 0) bits |= PREC_KEEP_ALL, found = true;
        for (int k = 0; k < N_KEEP_NAMES && !found; k++)
            if (strlen(keep_names[k].name) == len && strncmp(p, keep_names[k].name, len) == 0) {
                bits |= keep_names[k].bit;
                found = true;
            }
        if (!found) return false;
        p += len;
        if (*p == ',') p++;
    }
    *keep = bits;
    return true;
}

HpcStatus precision_plan(const IrGraph *in, const ModelSpec *spec, SpecPrecision policy,
                         IrGraph *out, PrecisionPlan *plan, HpcError *err)
{
    return precision_plan_opts(in, spec, policy, NULL, out, plan, err);
}

HpcStatus precision_plan_opts(const IrGraph *in, const ModelSpec *spec, SpecPrecision policy,
                              const PrecisionOptions *opts, IrGraph *out, PrecisionPlan *plan,
                              HpcError *err)
{
    memset(plan, 0, sizeof *plan);
    PrecisionOptions o = opts ? *opts : precision_defaults();
    const char *env = opts ? NULL : getenv("HPC_KEEP_F32");   /* a hook for comparisons (bench/) */
    if (env && *env && !precision_keep_parse(env, &o.keep_f32))
        return hpc_fail(err, HPC_ERR_USAGE, "HPC_KEEP_F32=%s: want none, default, all or a comma list of "
                        "embeddings, residual, norm, grads, probs, act, scores", env);
    const char *wg = opts ? NULL : getenv("HPC_WEIGHT_GRAD");
    if (wg && *wg && strcmp(wg, "low") != 0 && strcmp(wg, "f32") != 0)
        return hpc_fail(err, HPC_ERR_USAGE, "HPC_WEIGHT_GRAD=%s: want f32 (the default) or low (weight "
                        "gradients as the dW GEMM writes them)", wg);
    if (wg && strcmp(wg, "low") == 0) o.low_weight_grads = true;
    if (o.keep_f32 & ~(unsigned)PREC_KEEP_ALL)
        return hpc_fail(err, HPC_ERR_USAGE, "precision_plan: unknown keep_f32 bits 0x%x", o.keep_f32);
    HpcStatus st = plan_check_input(in, policy, err);
    if (st != HPC_OK) return st;
    HPC_ASSERT(out->n == 0);
    plan->policy = policy;
    plan->keep_f32 = policy == PREC_FP32 ? 0 : o.keep_f32;
    plan_regions(plan, spec, policy);
    Planner P;
    planner_init(&P, in, out, plan);
    P.keep = plan->keep_f32;
    P.low_dw = plan->low_weight_grads = policy != PREC_FP32 && o.low_weight_grads;
    index_users(&P);
    if (P.low_dw) mark_linear_grads(&P);
    mark_param_grads(&P);
    int n_forward = 0;
    for (int i = 0; i < in->n; i++) {
        if (in->nodes[i].n_in == 0) plan_leaf(&P, i);
        else plan_op(&P, i);
        if (i == in->n_forward - 1) n_forward = out->n;
    }
    out->loss = in->loss >= 0 ? plan->map[in->loss] : -1;
    out->logits = in->logits >= 0 ? plan->map[in->logits] : -1;
    plan_param_grads(&P);
    out->n_forward = n_forward;
    planner_free(&P);
    return HPC_OK;
}

void precision_plan_free(PrecisionPlan *plan)
{
    free(plan->info);
    free(plan->map);
    free(plan->param_low);
    memset(plan, 0, sizeof *plan);
}

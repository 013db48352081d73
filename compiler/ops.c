/* compiler/ops.c — the compiler's half of the op table: the shape/dtype rule
 * and the backward rule of every op kind listed in ops.def (names, arities
 * and outputs: program/op_info.c).  The CPU reference of each op lives in
 * runtime/cpu/cpu_exec.c (the runtime library may not be used by the compiler). */
#include <string.h>

#include "error.h"
#include "fuse.h"
#include "compiler/ir_build.h"
#include "program/ir.h"

#define NODE(id) (&g->nodes[(id)])
#define IN(k) NODE(n->in[k])

/* ---- shape helpers ---------------------------------------------------- */

static void set_shape(IrNode *n, DType dt, int rank, const int64_t *dims)
{
    n->dtype = dt;
    n->rank = rank;
    if (rank > 0) memcpy(n->dims, dims, (size_t)rank * sizeof *dims);   /* scalars pass dims = NULL */
}

static void copy_shape(IrNode *n, const IrNode *from)
{
    set_shape(n, from->dtype, from->rank, from->dims);
}

static void require(bool ok, const IrNode *n, const char *what)
{
    if (!ok) hpc_panic(__FILE__, __LINE__, "op %s (%s): %s", ir_op_name(n->op), n->name, what);
}

static void require_same(const IrNode *n, const IrNode *a, const IrNode *b)
{
    char sa[64], sb[64];
    if (ir_same_shape(a, b)) return;
    ir_shape_str(a, sa, sizeof sa);
    ir_shape_str(b, sb, sizeof sb);
    hpc_panic(__FILE__, __LINE__, "op %s (%s): shapes %s and %s differ", ir_op_name(n->op),
              n->name, sa, sb);
}

static int64_t last(const IrNode *v) { return v->dims[v->rank - 1]; }

static bool is_BL(const IrNode *v)
{
    return v->rank == 2 && v->dims[0] == IR_DIM_B && v->dims[1] == IR_DIM_L && v->dtype == DT_I32;
}

/* The spans of a packed batch: (B, 2) i32 (docs/packing.md). */
static bool is_spans(const IrNode *v)
{
    return v->rank == 2 && v->dims[0] == IR_DIM_B && v->dims[1] == 2 && v->dtype == DT_I32;
}

/* ---- shape rules, one per op ------------------------------------------ */

static void ir_shape_input(const IrGraph *g, IrNode *n)
{
    static const int64_t bl[] = {IR_DIM_B, IR_DIM_L}, b[] = {IR_DIM_B};
    switch (n->attr.input.kind) {
    case IR_IN_INPUT_IDS:
    case IR_IN_TOKEN_TYPES:
    case IR_IN_ATTN_MASK:
    case IR_IN_TOKEN_LABELS: set_shape(n, DT_I32, 2, bl); break;
    case IR_IN_LABELS: set_shape(n, DT_I32, 1, b); break;
    case IR_IN_TARGETS: set_shape(n, DT_F32, 1, b); break;
    case IR_IN_LOSS_SCALE: set_shape(n, DT_F32, 0, NULL); break;
    case IR_IN_SEQ_SPANS: set_shape(n, DT_I32, 2, (int64_t[]){IR_DIM_B, 2}); break;
    case IR_IN_COUNT: require(false, n, "bad input kind");
    }
}

static void ir_shape_param(const IrGraph *g, IrNode *n)
{
    require(false, n, "parameters are made with ir_param");
}

static void ir_shape_positions(const IrGraph *g, IrNode *n)
{
    set_shape(n, DT_I32, 2, (int64_t[]){IR_DIM_B, IR_DIM_L});
}

static void ir_shape_embedding(const IrGraph *g, IrNode *n)
{
    const IrNode *t = IN(0), *ids = IN(1);
    require(t->rank == 2 && ir_dtype_is_float(t->dtype), n, "table must be (V, H) float");
    require(is_BL(ids), n, "ids must be (B, L) i32");
    set_shape(n, t->dtype, 3, (int64_t[]){IR_DIM_B, IR_DIM_L, t->dims[1]});
}

static void ir_shape_linear(const IrGraph *g, IrNode *n)
{
    const IrNode *x = IN(0), *w = IN(1);
    require(w->rank == 2 && x->rank >= 1 && last(x) == w->dims[1], n, "x (.., in) with W (out, in)");
    if (n->n_in == 3) require(IN(2)->rank == 1 && IN(2)->dims[0] == w->dims[0], n, "bias (out)");
    copy_shape(n, x);
    n->dims[n->rank - 1] = w->dims[0];
}

static void ir_shape_matmul(const IrGraph *g, IrNode *n)
{
    const IrNode *a = IN(0), *b = IN(1);
    const IrMatmulAttr *m = &n->attr.matmul;
    int r = a->rank;
    require(r >= 2 && b->rank == r && a->dtype == b->dtype, n, "operands of equal rank >= 2");
    for (int i = 0; i < r - 2; i++) require(a->dims[i] == b->dims[i], n, "batch dims differ");
    int64_t am = a->dims[r - 2], ak = a->dims[r - 1], bk = b->dims[r - 2], bn = b->dims[r - 1];
    if (m->trans_a) { int64_t t = am; am = ak; ak = t; }
    if (m->trans_b) { int64_t t = bk; bk = bn; bn = t; }
    require(ak == bk, n, "inner dims differ");
    copy_shape(n, a);
    n->dims[r - 2] = am;
    n->dims[r - 1] = bn;
}

static void ir_shape_add(const IrGraph *g, IrNode *n)
{
    require_same(n, IN(0), IN(1));
    /* mixed float formats (a 16-bit branch onto an f32 residual) add in f32 */
    bool floats = ir_dtype_is_float(IN(0)->dtype) && ir_dtype_is_float(IN(1)->dtype);
    require(IN(0)->dtype == IN(1)->dtype || floats, n, "dtypes differ");
    copy_shape(n, IN(0));
    if (IN(0)->dtype != IN(1)->dtype) n->dtype = DT_F32;
}

static void ir_shape_layernorm(const IrGraph *g, IrNode *n)
{
    const IrNode *x = IN(0);
    for (int k = 1; k < 3; k++) require(IN(k)->rank == 1 && IN(k)->dims[0] == last(x), n, "gamma/beta (H)");
    copy_shape(n, x);
}

static void ir_shape_act(const IrGraph *g, IrNode *n) { copy_shape(n, IN(0)); }

static void ir_shape_softmax(const IrGraph *g, IrNode *n)
{
    const IrNode *s = IN(0);
    require(s->rank == 4 && s->dims[0] == IR_DIM_B && s->dims[2] == IR_DIM_L && s->dims[3] == IR_DIM_L,
            n, "scores must be (B, h, L, L)");
    require(is_BL(IN(1)), n, "mask must be (B, L) i32");
    copy_shape(n, s);
}

static void ir_shape_dropout(const IrGraph *g, IrNode *n)
{
    if (n->attr.dropout.salt < 0) n->attr.dropout.salt = (int)(n - g->nodes);
    copy_shape(n, IN(0));
}

static void ir_shape_split_heads(const IrGraph *g, IrNode *n)
{
    const IrNode *x = IN(0);
    int64_t h = n->attr.heads.heads;
    require(x->rank == 3 && h >= 1 && x->dims[2] % h == 0, n, "(B, L, H) with H % heads == 0");
    set_shape(n, x->dtype, 4, (int64_t[]){x->dims[0], h, x->dims[1], x->dims[2] / h});
}

static void ir_shape_merge_heads(const IrGraph *g, IrNode *n)
{
    const IrNode *x = IN(0);
    require(x->rank == 4, n, "(B, h, L, d)");
    set_shape(n, x->dtype, 3, (int64_t[]){x->dims[0], x->dims[2], x->dims[1] * x->dims[3]});
}

static void ir_shape_slice_first(const IrGraph *g, IrNode *n)
{
    const IrNode *x = IN(0);
    require(x->rank == 3 && x->dims[1] == IR_DIM_L, n, "(B, L, H)");
    set_shape(n, x->dtype, 2, (int64_t[]){x->dims[0], x->dims[2]});
}

static void ir_shape_slice_last(const IrGraph *g, IrNode *n)
{
    const IrNode *x = IN(0);
    require(x->rank == 3 && x->dims[0] == IR_DIM_B && x->dims[1] == IR_DIM_L, n, "x must be (B, L, H)");
    require(is_BL(IN(1)), n, "mask must be (B, L) i32");
    set_shape(n, x->dtype, 2, (int64_t[]){x->dims[0], x->dims[2]});
}

static void ir_shape_shift_labels(const IrGraph *g, IrNode *n)
{
    require(is_BL(IN(0)) && is_BL(IN(1)), n, "ids and mask (B, L) i32");
    copy_shape(n, IN(0));
}

static void ir_shape_cross_entropy(const IrGraph *g, IrNode *n)
{
    const IrNode *x = IN(0), *y = IN(1);
    require(y->dtype == DT_I32 && y->rank == x->rank - 1, n, "labels (..) i32 for logits (.., C)");
    for (int i = 0; i < y->rank; i++) require(y->dims[i] == x->dims[i], n, "labels/logits dims");
    set_shape(n, DT_F32, 0, NULL);
}

static void ir_shape_mse(const IrGraph *g, IrNode *n)
{
    const IrNode *p = IN(0), *t = IN(1);
    require(p->rank == 2 && p->dims[1] == 1 && t->rank == 1 && t->dims[0] == p->dims[0], n,
            "pred (B, 1), targets (B)");
    set_shape(n, DT_F32, 0, NULL);
}

static void ir_shape_cast(const IrGraph *g, IrNode *n)
{
    require(ir_dtype_is_float(IN(0)->dtype) && ir_dtype_is_float(n->attr.cast.to), n, "float to float");
    copy_shape(n, IN(0));
    n->dtype = n->attr.cast.to;
}

static void ir_shape_embedding_bwd(const IrGraph *g, IrNode *n)
{
    const IrNode *dy = IN(0);
    require(dy->rank == 3 && is_BL(IN(1)), n, "dy (B, L, H), ids (B, L)");
    set_shape(n, dy->dtype, 2, (int64_t[]){n->attr.embed_bwd.rows, dy->dims[2]});
}

static void ir_shape_linear_dx(const IrGraph *g, IrNode *n)
{
    const IrNode *dy = IN(0), *w = IN(1);
    require(w->rank == 2 && last(dy) == w->dims[0], n, "dy (.., out) with W (out, in)");
    copy_shape(n, dy);
    n->dims[n->rank - 1] = w->dims[1];
}

static void ir_shape_linear_dw(const IrGraph *g, IrNode *n)
{
    const IrNode *dy = IN(0), *x = IN(1);
    require(dy->rank == x->rank, n, "dy and x of equal rank");
    for (int i = 0; i + 1 < x->rank; i++) require(dy->dims[i] == x->dims[i], n, "row dims differ");
    set_shape(n, dy->dtype, 2, (int64_t[]){last(dy), last(x)});
}

static void ir_shape_bias_grad(const IrGraph *g, IrNode *n)
{
    set_shape(n, IN(0)->dtype, 1, (int64_t[]){last(IN(0))});
}

static void ir_shape_layernorm_dx(const IrGraph *g, IrNode *n)
{
    require_same(n, IN(0), IN(1));
    copy_shape(n, IN(0));
}

static void ir_shape_layernorm_dgamma(const IrGraph *g, IrNode *n)
{
    require_same(n, IN(0), IN(1));
    set_shape(n, IN(0)->dtype, 1, (int64_t[]){last(IN(0))});
}

static void ir_shape_act_bwd(const IrGraph *g, IrNode *n)
{
    require_same(n, IN(0), IN(1));
    copy_shape(n, IN(0));
}

static void ir_shape_softmax_bwd(const IrGraph *g, IrNode *n)
{
    require_same(n, IN(0), IN(1));
    copy_shape(n, IN(0));
}

static void ir_shape_slice_first_bwd(const IrGraph *g, IrNode *n)
{
    const IrNode *dy = IN(0);
    require(dy->rank == 2, n, "dy (B, H)");
    set_shape(n, dy->dtype, 3, (int64_t[]){dy->dims[0], IR_DIM_L, dy->dims[1]});
}

static void ir_shape_slice_last_bwd(const IrGraph *g, IrNode *n)
{
    const IrNode *dy = IN(0);
    require(dy->rank == 2 && dy->dims[0] == IR_DIM_B, n, "dy must be (B, H)");
    require(is_BL(IN(1)), n, "mask must be (B, L) i32");
    set_shape(n, dy->dtype, 3, (int64_t[]){dy->dims[0], IR_DIM_L, dy->dims[1]});
}

static void ir_shape_cross_entropy_bwd(const IrGraph *g, IrNode *n)
{
    require(IN(0)->rank == 0, n, "dloss is a scalar");
    copy_shape(n, IN(1));
}

static void ir_shape_mse_bwd(const IrGraph *g, IrNode *n)
{
    require(IN(0)->rank == 0, n, "dloss is a scalar");
    copy_shape(n, IN(1));
}

static void ir_shape_softmax_dropout(const IrGraph *g, IrNode *n) { ir_shape_softmax(g, n); }

static void ir_shape_layernorm_fwd(const IrGraph *g, IrNode *n) { ir_shape_layernorm(g, n); }

/* ---- packed batches (docs/packing.md) ---------------------------------- */

static void ir_shape_span_positions(const IrGraph *g, IrNode *n)
{
    require(is_spans(IN(0)), n, "spans must be (B, 2) i32");
    set_shape(n, DT_I32, 2, (int64_t[]){IR_DIM_B, IR_DIM_L});
}

static void ir_shape_span_token(const IrGraph *g, IrNode *n)
{
    const IrNode *x = IN(0);
    require(x->rank == 3 && x->dims[0] == IR_DIM_B && x->dims[1] == IR_DIM_L, n, "x must be (B, L, H)");
    require(is_spans(IN(1)), n, "spans must be (B, 2) i32");
    set_shape(n, x->dtype, 2, (int64_t[]){IR_DIM_B, x->dims[2]});
}

static void ir_shape_span_token_bwd(const IrGraph *g, IrNode *n)
{
    const IrNode *dy = IN(0);
    require(dy->rank == 2 && dy->dims[0] == IR_DIM_B, n, "dy (B, H)");
    require(is_spans(IN(1)), n, "spans must be (B, 2) i32");
    set_shape(n, dy->dtype, 3, (int64_t[]){IR_DIM_B, IR_DIM_L, dy->dims[1]});
}

/* ATTENTION: q, k, v (B, L, H) of one dtype, H a multiple of heads, the
 * padding mask (B, L) i32; ctx (B, L, H) in the dtype of q.  The salt
 * defaults to the node's own id (as a dropout's). */
static void ir_shape_attention(const IrGraph *g, IrNode *n)
{
    const IrNode *q = IN(0);
    int64_t heads = n->attr.attn.heads;
    require(q->rank == 3 && q->dims[0] == IR_DIM_B && q->dims[1] == IR_DIM_L, n, "q must be (B, L, H)");
    require(heads >= 1 && q->dims[2] % heads == 0, n, "H must be a multiple of heads");
    require(ir_dtype_is_float(q->dtype), n, "q, k, v must be float");
    for (int k = 1; k < 3; k++) {
        require_same(n, q, IN(k));
        require(IN(k)->dtype == q->dtype, n, "q, k and v must have one dtype");
    }
    bool packed = n->attr.attn.packed;
    require(!packed || (n->in[1] == n->in[0] && n->in[2] == n->in[0] && q->dims[2] % 3 == 0), n,
            "packed: q, k and v are one (B, L, 3H) value");
    require(n->attr.attn.varlen ? is_spans(IN(3)) : is_BL(IN(3)), n,
            n->attr.attn.varlen ? "varlen: spans must be (B, 2) i32" : "mask must be (B, L) i32");
    require(n->attr.attn.p >= 0 && n->attr.attn.p < 1, n, "dropout p must be in [0, 1)");
    if (n->attr.attn.salt < 0) n->attr.attn.salt = (int32_t)(n - g->nodes);
    require(!n->attr.attn.first_query || !n->attr.attn.causal, n,
            "first_query: a bidirectional attention only (query 0, or each span's first slot, sees every key)");
    int64_t H = q->dims[2] / (packed ? 3 : 1);
    require(H % heads == 0, n, "H must be a multiple of heads");
    if (n->attr.attn.first_query) set_shape(n, q->dtype, 2, (int64_t[]){q->dims[0], H});   /* ctx (B, H) */
    else set_shape(n, q->dtype, 3, (int64_t[]){q->dims[0], q->dims[1], H});               /* ctx (B, L, H) */
}

/* ATTENTION_BWD: (dctx, q, k, v, mask, ctx, lse[, keep]) -> dq, dk, dv like q. */
static void ir_shape_attention_bwd(const IrGraph *g, IrNode *n)
{
    const IrNode *q = IN(1), *lse = IN(6), *dctx = IN(0);
    int64_t H = dctx->dims[dctx->rank - 1];
    require(q->rank == 3 && dctx->dims[0] == q->dims[0], n, "q (B, L, ..) and dctx of the same B");
    if (n->attr.attn.first_query) require(dctx->rank == 2, n, "first_query: dctx (B, H)");
    else require(dctx->rank == 3 && dctx->dims[1] == q->dims[1], n, "dctx (B, L, H)");
    require(q->dims[2] == (n->attr.attn.packed ? 3 * H : H), n, "q (B, L, H), or packed qkv (B, L, 3H)");
    require_same(n, IN(5), dctx);
    for (int k = 2; k < 4; k++) require_same(n, q, IN(k));
    require(n->attr.attn.varlen ? is_spans(IN(4)) : is_BL(IN(4)), n,
            n->attr.attn.varlen ? "varlen: spans must be (B, 2) i32" : "mask must be (B, L) i32");
    require(lse->rank == 3 && lse->dtype == DT_F32 && lse->dims[1] == n->attr.attn.heads, n,
            "lse must be (B, heads, L) f32");
    if (n->n_in == 8) {
        const IrNode *keep = IN(7);
        require(keep->op == IR_OP_OUTPUT && keep->attr.output.index == 2 && keep->dtype == DT_I32, n,
                "keep must be the forward ATTENTION's keep bits (its output 2)");
    }
    copy_shape(n, q);
    n->dtype = IN(0)->dtype;
}

/* STACK: three values of one shape and dtype, concatenated along dim 0. */
static void ir_shape_stack(const IrGraph *g, IrNode *n)
{
    const IrNode *a = IN(0);
    require(a->rank >= 1 && a->dims[0] > 0, n, "parts must have a fixed dim 0");
    for (int k = 1; k < 3; k++) {
        require_same(n, a, IN(k));
        require(IN(k)->dtype == a->dtype, n, "parts must have one dtype");
    }
    copy_shape(n, a);
    n->dims[0] *= 3;
}

/* UNSTACK: dim 0 split in three equal parts; output 0 the first. */
static void ir_shape_unstack(const IrGraph *g, IrNode *n)
{
    const IrNode *x = IN(0);
    require(x->rank >= 1 && x->dims[0] > 0 && x->dims[0] % 3 == 0, n, "dim 0 must be a multiple of 3");
    copy_shape(n, x);
    n->dims[0] /= 3;
}

/* Output k >= 1 of a multi-output op: each such op has its case here. */
static void ir_shape_output(const IrGraph *g, IrNode *n)
{
    const IrNode *p = IN(0);
    int k = n->attr.output.index;
    require(k >= 1 && k < ir_op_info(p->op)->n_outputs, n, "index must name output 1.. of a multi-output op");
    switch (p->op) {
    case IR_OP_LAYERNORM_FWD: /* mean, rstd: one f32 per row of x */
        set_shape(n, DT_F32, p->rank - 1, p->dims);
        break;
    case IR_OP_LN_RESIDUAL: { /* mean, rstd (rows) f32; s; y in 16 bits */
        IrLnFusedAttr la = fuse_ln_attr_get(p);
        if (k <= 2) set_shape(n, DT_F32, p->rank - 1, p->dims);
        else set_shape(n, (DType)(k == 3 ? (la.xhat ? DT_F16 : la.aux) : la.low), p->rank, p->dims);
        if (k == 3 && la.xhat && la.ones) n->dims[n->rank - 1] += IR_XHAT_ONES_PAD;   /* [xhat | 1 | 0] */
        break;
    }
    case IR_OP_LN_RESIDUAL_BWD: { /* dx like ds; dgamma, dbeta, dbias (H) */
        IrLnFusedAttr la = fuse_ln_attr_get(p);
        if (k == 1) set_shape(n, (DType)la.mid, p->rank, p->dims);
        else set_shape(n, (DType)la.aux, 1, &p->dims[p->rank - 1]);
        break;
    }
    case IR_OP_LINEAR_DW_BGRAD: /* db (out): the column sums of dy, stored as dW */
    case IR_OP_LN_DW_FIX_DB:    /* db (out): raw's column in, stored as dW */
        set_shape(n, p->dtype, 1, p->dims);
        break;
    case IR_OP_ACT_BWD_BGRAD: /* db (n) the column sums of dx; y = act(x) like x */
        if (k == 1) set_shape(n, (DType)p->attr.act_bgrad.db, 1, &p->dims[p->rank - 1]);
        else set_shape(n, (DType)p->attr.act_bgrad.y, p->rank, p->dims);
        break;
    case IR_OP_EMBED_LN: /* xhat f16 like y; rstd (B, L) f32; y in 16 bits */
        if (k == 2) set_shape(n, DT_F32, p->rank - 1, p->dims);
        else set_shape(n, k == 1 ? DT_F16 : (DType)p->attr.embed_ln.low, p->rank, p->dims);
        break;
    case IR_OP_EMBED_LN_BWD: { /* the tables' gradients (V, H) f32; dgamma, dbeta (H) f32 */
        const IrEmbedLnBwdAttr *ea = &p->attr.embed_ln_bwd;
        int64_t rows = k == 1 ? ea->rows1 : ea->rows2;
        if (k <= 2) set_shape(n, DT_F32, 2, (int64_t[]){rows, p->dims[1]});
        else set_shape(n, DT_F32, 1, &p->dims[1]);
        break;
    }
    case IR_OP_ATTENTION: /* lse: one f32 per (batch row, head, query); first_query: one query */
        if (k == 2) { /* keep: the dropout's keep bits of keys 0 .. IR_ATTN_KEEP_KEYS - 1 per query */
            require(!p->attr.attn.first_query && !p->attr.attn.varlen, n, "keep bits: a padded attention of every query");
            set_shape(n, DT_I32, 4, (int64_t[]){p->dims[0], p->attr.attn.heads, p->dims[1], IR_ATTN_KEEP_KEYS / 32});
            break;
        }
        set_shape(n, DT_F32, 3, (int64_t[]){p->dims[0], p->attr.attn.heads, p->attr.attn.first_query ? 1 : p->dims[1]});
        break;
    case IR_OP_ATTENTION_BWD: /* dk, dv: as dq */
    case IR_OP_UNSTACK:       /* the second and third parts: as the first */
        copy_shape(n, p);
        break;
    default:
        require(false, n, "no shape rule for this output");
    }
}


/* ACT_BWD_BGRAD: dx as ACT_BWD; db and y are its OUTPUTs 1, 2 (ir_shape_output). */
static void ir_shape_act_bwd_bgrad(const IrGraph *g, IrNode *n)
{
    ir_shape_act_bwd(g, n);
    require(n->rank >= 1, n, "dy, x (.., n)");
}

/* LINEAR_DW_BGRAD: dW as LINEAR_DW; db is its OUTPUT 1 (ir_shape_output). */
static void ir_shape_linear_dw_bgrad(const IrGraph *g, IrNode *n) { ir_shape_linear_dw(g, n); }

/* LINEAR_DX_ACC (compiler/fuse_accum.c): LINEAR_DX's shape, which acc must
 * have; stored as acc (f32). */
static void ir_shape_linear_dx_acc(const IrGraph *g, IrNode *n)
{
    const IrNode *acc = IN(2);
    ir_shape_linear_dx(g, n);
    require(acc->rank == n->rank, n, "acc of dx's shape");
    for (int i = 0; i < n->rank; i++) require(acc->dims[i] == n->dims[i], n, "acc of dx's shape");
    n->dtype = acc->dtype;
}

static void ir_shape_softmax_dropout_bwd(const IrGraph *g, IrNode *n)
{
    const IrNode *s = IN(1);
    require(s->rank == 4 && s->dims[0] == IR_DIM_B && s->dims[2] == IR_DIM_L && s->dims[3] == IR_DIM_L,
            n, "scores must be (B, h, L, L)");
    require(is_BL(IN(2)), n, "mask must be (B, L) i32");
    require_same(n, IN(0), s);
    copy_shape(n, IN(0));
}

static void ir_shape_dropout_add(const IrGraph *g, IrNode *n)
{
    require_same(n, IN(0), IN(1));
    require(ir_dtype_is_float(IN(0)->dtype) && ir_dtype_is_float(IN(1)->dtype), n, "float inputs");
    copy_shape(n, IN(1));
}

/* LN_RESIDUAL: x (.., H) float, r like x, gamma/beta (H), bias (H) if given;
 * y has r's dtype (fuse sets the storage dtype it replaces). */
static void ir_shape_ln_residual(const IrGraph *g, IrNode *n)
{
    require_same(n, IN(0), IN(1));
    require(ir_dtype_is_float(IN(0)->dtype) && ir_dtype_is_float(IN(1)->dtype), n, "float x and r");
    for (int k = 2; k < n->n_in; k++) require(IN(k)->rank == 1 && IN(k)->dims[0] == last(IN(0)), n, "gamma/beta/bias (H)");
    copy_shape(n, IN(1));
}

/* LN_RESIDUAL_BWD: dy and s alike, mean/rstd one per row, gamma (H); with
 * IrLnFusedAttr.xhat (dy, xhat, rstd, gamma), xhat f16 like dy. */
static void ir_shape_ln_residual_bwd(const IrGraph *g, IrNode *n)
{
    bool xhat = fuse_ln_attr_get(n).xhat;
    int stats = xhat ? 1 : 2;
    require(n->n_in == 3 + stats, n, xhat ? "inputs (dy, xhat, rstd, gamma)" : "inputs (dy, s, mean, rstd, gamma)");
    if (xhat && last(IN(1)) == last(IN(0)) + IR_XHAT_ONES_PAD) {   /* xhat saved with its ones column */
        require(IN(1)->rank == IN(0)->rank, n, "xhat (.., H + 8)");
        for (int i = 0; i + 1 < IN(0)->rank; i++) require(IN(1)->dims[i] == IN(0)->dims[i], n, "xhat's rows as dy's");
    } else {
        require_same(n, IN(0), IN(1));
    }
    require(!xhat || IN(1)->dtype == DT_F16, n, "xhat f16");
    for (int k = 2; k < 2 + stats; k++) require(IN(k)->rank == IN(0)->rank - 1, n, "mean/rstd (rows)");
    require(IN(2 + stats)->rank == 1 && IN(2 + stats)->dims[0] == last(IN(0)), n, "gamma (H)");
    copy_shape(n, IN(0));
}

/* EMBED_LN: gamma, beta (H); pairs (table (V, H), ids (B, L) i32); y
 * (B, L, H) f32 (the fuse rule keeps the dtype of the value it replaces). */
static void ir_shape_embed_ln(const IrGraph *g, IrNode *n)
{
    require(n->n_in == 6 || n->n_in == 8, n, "inputs (gamma, beta, table0, ids0, table1, ids1[, table2, ids2])");
    int64_t H = last(IN(0));
    require(IN(0)->rank == 1 && IN(1)->rank == 1 && IN(1)->dims[0] == H, n, "gamma, beta (H)");
    for (int k = 2; k < n->n_in; k += 2) {
        require(IN(k)->rank == 2 && IN(k)->dims[1] == H, n, "tables (V, H)");
        require(is_BL(IN(k + 1)), n, "ids (B, L) i32");
    }
    set_shape(n, DT_F32, 3, (int64_t[]){IR_DIM_B, IR_DIM_L, H});
}

/* EMBED_LN_BWD: dy and xhat (B, L, H), xhat f16, rstd (B, L), gamma (H),
 * ids (B, L) i32; output 0 the first table's gradient (V0, H) f32. */
static void ir_shape_embed_ln_bwd(const IrGraph *g, IrNode *n)
{
    const IrEmbedLnBwdAttr *a = &n->attr.embed_ln_bwd;
    require_same(n, IN(0), IN(1));
    require(IN(0)->rank == 3 && IN(1)->dtype == DT_F16, n, "dy (B, L, H), xhat f16");
    require(IN(2)->rank == 2 && IN(2)->dtype == DT_F32, n, "rstd (B, L) f32");
    require(IN(3)->rank == 1 && IN(3)->dims[0] == last(IN(0)), n, "gamma (H)");
    for (int k = 4; k < n->n_in; k++) require(is_BL(IN(k)), n, "ids (B, L) i32");
    require(a->rows0 > 0 && a->rows1 > 0 && (a->rows2 > 0) == (n->n_in == 7), n, "the tables' rows");
    set_shape(n, DT_F32, 2, (int64_t[]){a->rows0, last(IN(0))});
}

/* LN_DW_FIX: raw (out, in), gamma and beta (in), db (out); raw's shape and dtype. */
static void ir_shape_ln_dw_fix(const IrGraph *g, IrNode *n)
{
    const IrNode *raw = IN(0);
    require(raw->rank == 2, n, "raw dW (out, in)");
    require(IN(1)->rank == 1 && IN(1)->dims[0] == raw->dims[1], n, "gamma (in)");
    require(IN(2)->rank == 1 && IN(2)->dims[0] == raw->dims[1], n, "beta (in)");
    require(IN(3)->rank == 1 && IN(3)->dims[0] == raw->dims[0], n, "db (out)");
    copy_shape(n, raw);
}

/* LN_DW_FIX_DB: raw (out, in + IR_XHAT_ONES_PAD) f32, gamma and beta (in);
 * dW (out, in) in raw's dtype, db its OUTPUT 1 (ir_shape_output). */
static void ir_shape_ln_dw_fix_db(const IrGraph *g, IrNode *n)
{
    const IrNode *raw = IN(0);
    require(raw->rank == 2 && raw->dims[1] > IR_XHAT_ONES_PAD, n, "raw dW (out, in + 8)");
    int64_t in = raw->dims[1] - IR_XHAT_ONES_PAD;
    require(IN(1)->rank == 1 && IN(1)->dims[0] == in, n, "gamma (in)");
    require(IN(2)->rank == 1 && IN(2)->dims[0] == in, n, "beta (in)");
    set_shape(n, raw->dtype, 2, (int64_t[]){raw->dims[0], in});
}

/* ---- backward rules --------------------------------------------------- */

/* Appends node op(inputs) named "d.<name of forward input k>". */
static int grad_node(IrGraph *g, int fwd, int k, IrOpKind op, const int *in, int n_in,
                     const IrAttr *attr)
{
    char name[IR_NAME_MAX];
    snprintf(name, sizeof name, "d.%.*s", IR_NAME_MAX - 3, NODE(NODE(fwd)->in[k])->name);
    int id = ir_add(g, op, in, n_in, attr, name);
    NODE(id)->backward = true;
    NODE(id)->region = NODE(NODE(fwd)->in[k])->region;
    return id;
}

static bool needs(const IrGraph *g, int fwd, int k)
{
    return NODE(fwd)->n_in > k && NODE(NODE(fwd)->in[k])->requires_grad;
}

static void grad_matmul(IrGraph *g, int id, int dy, int *dx)
{
    IrNode f = *NODE(id); /* copy: ir_add may move the node array */
    int a = f.in[0], b = f.in[1];
    bool ta = f.attr.matmul.trans_a, tb = f.attr.matmul.trans_b;
    double al = f.attr.matmul.alpha;
    IrAttr da, db;
    int ia[2], ib[2];
    /* C = al op(A) op(B); each case below is dC pushed through the product. */
    if (!ta && !tb) {        /* dA = al dC B^T,   dB = al A^T dC */
        da.matmul = (IrMatmulAttr){false, true, al}; ia[0] = dy; ia[1] = b;
        db.matmul = (IrMatmulAttr){true, false, al}; ib[0] = a; ib[1] = dy;
    } else if (!ta && tb) {  /* dA = al dC B,     dB = al dC^T A */
        da.matmul = (IrMatmulAttr){false, false, al}; ia[0] = dy; ia[1] = b;
        db.matmul = (IrMatmulAttr){true, false, al}; ib[0] = dy; ib[1] = a;
    } else if (ta && !tb) {  /* dA = al B dC^T,   dB = al A dC */
        da.matmul = (IrMatmulAttr){false, true, al}; ia[0] = b; ia[1] = dy;
        db.matmul = (IrMatmulAttr){false, false, al}; ib[0] = a; ib[1] = dy;
    } else {                 /* dA = al B^T dC^T, dB = al dC^T A^T */
        da.matmul = (IrMatmulAttr){true, true, al}; ia[0] = b; ia[1] = dy;
        db.matmul = (IrMatmulAttr){true, true, al}; ib[0] = dy; ib[1] = a;
    }
    if (needs(g, id, 0)) dx[0] = grad_node(g, id, 0, IR_OP_MATMUL, ia, 2, &da);
    if (needs(g, id, 1)) dx[1] = grad_node(g, id, 1, IR_OP_MATMUL, ib, 2, &db);
}

/* The fused ops' backward rules: the rule of the unfused chain, fused.
 * SOFTMAX_DROPOUT: dscores = SOFTMAX_DROPOUT_BWD(dy, scores, mask), which
 * recomputes the probabilities. */
static void grad_softmax_dropout(IrGraph *g, int id, int dy, int *dx)
{
    IrNode f = *NODE(id); /* copy: ir_add may move the node array */
    IrFusedAttr fa = fuse_attr_get(&f);
    IrAttr a;
    fa.mid2 = (uint8_t)NODE(dy)->dtype;
    fuse_attr_set(&a, fa);
    if (needs(g, id, 0))
        dx[0] = grad_node(g, id, 0, IR_OP_SOFTMAX_DROPOUT_BWD, (int[]){dy, f.in[0], f.in[1]}, 3, &a);
}

/* DROPOUT_ADD: dx = DROPOUT(dy) with the same mask (p, salt), dr = dy. */
static void grad_dropout_add(IrGraph *g, int id, int dy, int *dx)
{
    IrNode f = *NODE(id);
    IrFusedAttr fa = fuse_attr_get(&f);
    IrAttr a;
    a.dropout = (IrDropoutAttr){fa.p, fa.salt};
    if (needs(g, id, 0)) dx[0] = grad_node(g, id, 0, IR_OP_DROPOUT, &dy, 1, &a);
    dx[1] = needs(g, id, 1) ? dy : -1;
}

/* LN_RESIDUAL (a forward graph fused before autodiff): one LN_RESIDUAL_BWD
 * from the saved s, mean and rstd.  Only y (output 0) is differentiable:
 * the fuse rule leaves a site unfused before autodiff when s or the 16-bit
 * y has other readers. */
static void grad_ln_residual(IrGraph *g, int id, int dy, int *dx)
{
    IrNode f = *NODE(id);
    int s = ir_output(g, id, 3), mean = ir_output(g, id, 1), rstd = ir_output(g, id, 2);
    HPC_ASSERT(s >= 0 && mean >= 0 && rstd >= 0);
    IrLnFusedAttr la = fuse_ln_attr_get(&f);
    la.mid = NODE(f.in[0])->dtype;
    la.aux = NODE(f.in[2])->dtype;
    IrAttr a;
    fuse_ln_attr_set(&a, la);
    int outs[5];
    char name[IR_NAME_MAX];
    snprintf(name, sizeof name, "d.%.*s", IR_NAME_MAX - 3, NODE(f.in[1])->name);
    ir_add_outputs(g, IR_OP_LN_RESIDUAL_BWD, (int[]){dy, s, mean, rstd, f.in[2]}, 5, &a, name, outs);
    for (int k = 0; k < 5; k++) {
        NODE(outs[k])->backward = true;
        NODE(outs[k])->region = f.region;
    }
    int from[5] = {1, 0, 2, 3, 4};   /* input k's gradient is output from[k] */
    for (int k = 0; k < f.n_in; k++) dx[k] = needs(g, id, k) ? outs[from[k]] : -1;
}

/* EMBED_LN is made by the fuse pass after autodiff only (compiler/
 * fuse_embed.c matches its backward with it), so no graph differentiates it. */
static void grad_embed_ln(IrGraph *g, int id, int dy, int *dx)
{
    (void)dy;
    (void)dx;
    hpc_panic(__FILE__, __LINE__, "%s: EMBED_LN has no backward rule (the fuse pass makes it after autodiff "
              "only, with its EMBED_LN_BWD)", NODE(id)->name);
}

/* The rules named by the `grad` column of ops.def.  Each appends the nodes
 * of the gradient of every input that needs one (dx[k], -1 for the others);
 * f is a copy of the forward node because ir_add may move the node array. */
#define GRAD_RULE(name) static void grad_##name(IrGraph *g, int id, int dy, int *dx)
#define F (*NODE(id))

/* Nothing flows back: leaves and integer-valued ops. */
GRAD_RULE(none) { (void)g; (void)id; (void)dy; (void)dx; }

/* A backward op: second derivatives are not supported. */
GRAD_RULE(second)
{
    hpc_panic(__FILE__, __LINE__, "no backward rule for %s (second derivatives unsupported)",
              ir_op_name(NODE(id)->op));
}

GRAD_RULE(embedding)
{
    IrNode f = F;
    IrAttr a = f.attr;
    a.embed_bwd.rows = NODE(f.in[0])->dims[0];
    if (needs(g, id, 0)) dx[0] = grad_node(g, id, 0, IR_OP_EMBEDDING_BWD, (int[]){dy, f.in[1]}, 2, &a);
}

GRAD_RULE(linear)
{
    IrNode f = F;
    if (needs(g, id, 0)) dx[0] = grad_node(g, id, 0, IR_OP_LINEAR_DX, (int[]){dy, f.in[1]}, 2, NULL);
    if (needs(g, id, 1)) dx[1] = grad_node(g, id, 1, IR_OP_LINEAR_DW, (int[]){dy, f.in[0]}, 2, NULL);
    if (needs(g, id, 2)) dx[2] = grad_node(g, id, 2, IR_OP_BIAS_GRAD, &dy, 1, NULL);
}

GRAD_RULE(add)
{
    dx[0] = needs(g, id, 0) ? dy : -1;
    dx[1] = needs(g, id, 1) ? dy : -1;
}

GRAD_RULE(layernorm)
{
    IrNode f = F;
    IrAttr a = f.attr;
    if (needs(g, id, 0))
        dx[0] = grad_node(g, id, 0, IR_OP_LAYERNORM_DX, (int[]){dy, f.in[0], f.in[1]}, 3, &a);
    if (needs(g, id, 1)) dx[1] = grad_node(g, id, 1, IR_OP_LAYERNORM_DGAMMA, (int[]){dy, f.in[0]}, 2, &a);
    if (needs(g, id, 2)) dx[2] = grad_node(g, id, 2, IR_OP_BIAS_GRAD, &dy, 1, NULL);
}

GRAD_RULE(act)
{
    IrNode f = F;
    IrAttr a = f.attr;
    if (needs(g, id, 0)) dx[0] = grad_node(g, id, 0, IR_OP_ACT_BWD, (int[]){dy, f.in[0]}, 2, &a);
}

GRAD_RULE(softmax)
{
    if (needs(g, id, 0)) dx[0] = grad_node(g, id, 0, IR_OP_SOFTMAX_BWD, (int[]){dy, id}, 2, NULL);
}

/* The same mask: same p, same salt. */
GRAD_RULE(dropout)
{
    IrAttr a = F.attr;
    if (needs(g, id, 0)) dx[0] = grad_node(g, id, 0, IR_OP_DROPOUT, &dy, 1, &a);
}

GRAD_RULE(split_heads)
{
    if (needs(g, id, 0)) dx[0] = grad_node(g, id, 0, IR_OP_MERGE_HEADS, &dy, 1, NULL);
}

GRAD_RULE(merge_heads)
{
    IrNode f = F;
    IrAttr a = f.attr;
    a.heads.heads = NODE(f.in[0])->dims[1];
    if (needs(g, id, 0)) dx[0] = grad_node(g, id, 0, IR_OP_SPLIT_HEADS, &dy, 1, &a);
}

GRAD_RULE(slice_first)
{
    if (needs(g, id, 0)) dx[0] = grad_node(g, id, 0, IR_OP_SLICE_FIRST_BWD, &dy, 1, NULL);
}

/* The same spans pick the same slot. */
GRAD_RULE(span_token)
{
    IrNode f = F;
    if (needs(g, id, 0)) dx[0] = grad_node(g, id, 0, IR_OP_SPAN_TOKEN_BWD, (int[]){dy, f.in[1]}, 2, &f.attr);
}

/* The same mask picks the same token. */
GRAD_RULE(slice_last)
{
    IrNode f = F;
    if (needs(g, id, 0)) dx[0] = grad_node(g, id, 0, IR_OP_SLICE_LAST_BWD, (int[]){dy, f.in[1]}, 2, NULL);
}

GRAD_RULE(cross_entropy)
{
    IrNode f = F;
    if (needs(g, id, 0))
        dx[0] = grad_node(g, id, 0, IR_OP_CROSS_ENTROPY_BWD, (int[]){dy, f.in[0], f.in[1]}, 3, NULL);
}

GRAD_RULE(mse)
{
    IrNode f = F;
    if (needs(g, id, 0)) dx[0] = grad_node(g, id, 0, IR_OP_MSE_BWD, (int[]){dy, f.in[0], f.in[1]}, 3, NULL);
}

GRAD_RULE(cast)
{
    IrNode f = F;
    IrAttr a = f.attr;
    a.cast.to = NODE(f.in[0])->dtype;
    if (needs(g, id, 0)) dx[0] = grad_node(g, id, 0, IR_OP_CAST, &dy, 1, &a);
}
/* ATTENTION: one ATTENTION_BWD (dctx, q, k, v, mask, ctx, lse) gives dq
 * and, as its outputs 1 and 2, dk and dv (packed: dqkv only).  The backward reads the lse the
 * forward saved (and ctx, for rowsum(dctx * ctx)); it regenerates the
 * dropout mask from the same salt. */
GRAD_RULE(attention)
{
    IrNode f = F;
    if (!needs(g, id, 0) && !needs(g, id, 1) && !needs(g, id, 2)) return;
    int lse = ir_output(g, id, 1);
    HPC_ASSERT(lse >= 0);
    int outs[3];
    char name[IR_NAME_MAX];
    snprintf(name, sizeof name, "d.%.*s", IR_NAME_MAX - 3, f.name);
    const int in[7] = {dy, f.in[0], f.in[1], f.in[2], f.in[3], id, lse};
    /* packed: q, k and v are one value and output 0 its whole (B, L, 3H)
     * gradient, so the node gets no dk, dv OUTPUT nodes (no storage for
     * values nothing writes) and autodiff sums nothing for inputs 1, 2 */
    if (f.attr.attn.packed) {
        int b = ir_add(g, IR_OP_ATTENTION_BWD, in, 7, &f.attr, name);
        NODE(b)->backward = true;
        NODE(b)->region = NODE(f.in[0])->region;
        if (needs(g, id, 0)) dx[0] = b;
        return;
    }
    ir_add_outputs(g, IR_OP_ATTENTION_BWD, in, 7, &f.attr, name, outs);
    for (int k = 0; k < 3; k++) {
        NODE(outs[k])->backward = true;
        NODE(outs[k])->region = NODE(f.in[k])->region;
        if (needs(g, id, k)) dx[k] = outs[k];
    }
}

/* STACK: the gradient's three parts, one per input (UNSTACK). */
GRAD_RULE(stack)
{
    IrNode f = F;
    if (!needs(g, id, 0) && !needs(g, id, 1) && !needs(g, id, 2)) return;
    int outs[3];
    char name[IR_NAME_MAX];
    snprintf(name, sizeof name, "d.%.*s", IR_NAME_MAX - 3, f.name);
    ir_add_outputs(g, IR_OP_UNSTACK, &dy, 1, NULL, name, outs);
    for (int k = 0; k < 3; k++) {
        NODE(outs[k])->backward = true;
        NODE(outs[k])->region = NODE(f.in[k])->region;
        if (needs(g, id, k)) dx[k] = outs[k];
    }
}

/* UNSTACK appears only in backward passes (STACK's rule). */
GRAD_RULE(unstack)
{
    hpc_panic(__FILE__, __LINE__, "no gradient through %s: unstack is made by the backward pass only",
              NODE(id)->name);
}

/* Outputs past the first (statistics kept for a backward op) carry no
 * gradient; a graph that differentiates through one is not supported. */
GRAD_RULE(output)
{
    hpc_panic(__FILE__, __LINE__, "no gradient through %s (output %d of %s): only a multi-output op's "
              "first output is differentiable", NODE(id)->name, NODE(id)->attr.output.index,
              ir_op_name(NODE(NODE(id)->in[0])->op));
}
#undef F

/* ---- the rule tables ------------------------------------------------- */

static const IrShapeFn shape_table[] = {
#define IR_OP(E, name, nmin, nmax, nout, prec, grad, cuda) ir_shape_##name,
#include "program/ops.def"
#undef IR_OP
};
static const IrGradFn grad_table[] = {
#define IR_OP(E, name, nmin, nmax, nout, prec, grad, cuda) grad_##grad,
#include "program/ops.def"
#undef IR_OP
};
_Static_assert(sizeof shape_table / sizeof shape_table[0] == IR_OP_COUNT, "ops.def and the shape rules disagree");
_Static_assert(sizeof grad_table / sizeof grad_table[0] == IR_OP_COUNT, "ops.def and the backward rules disagree");

IrShapeFn ir_shape_rule(IrOpKind op)
{
    HPC_ASSERT(op >= 0 && op < IR_OP_COUNT);
    return shape_table[op];
}

IrGradFn ir_grad_rule(IrOpKind op)
{
    HPC_ASSERT(op >= 0 && op < IR_OP_COUNT);
    return grad_table[op];
}

void ir_backward(IrGraph *g, int id, int dy, int dx[IR_MAX_INPUTS])
{
    for (int k = 0; k < IR_MAX_INPUTS; k++) dx[k] = -1;
    ir_grad_rule(g->nodes[id].op)(g, id, dy, dx);
}

/* compiler/ir_print.c — the readable listing of a graph (`hpc compile --ir`).
 *
 * One line per value:
 *   %ID  NAME  = OP(%IN, ...) ATTRS  : SHAPE DTYPE [grad]
 * Forward and backward parts are separated by a comment line; parameters
 * show their index, and the footer lists the gradient value of every
 * parameter.  The format is pinned by tests/golden/bert_tiny.ir. */
#include <stdio.h>

#include "fuse.h"
#include "program/ir.h"
#include "ir_print.h"

void ir_attr_str(const IrNode *n, char *buf, size_t size)
{
    const IrAttr *a = &n->attr;
    buf[0] = '\0';
    switch (n->op) {
    case IR_OP_PARAM: snprintf(buf, size, "index=%d", a->param.index); break;
    case IR_OP_POSITIONS: snprintf(buf, size, "offset=%lld", (long long)a->pos.offset); break;
    case IR_OP_MATMUL:
        snprintf(buf, size, "%s%salpha=%.6g", a->matmul.trans_a ? "trans_a " : "",
                 a->matmul.trans_b ? "trans_b " : "", a->matmul.alpha);
        break;
    case IR_OP_OUTPUT: snprintf(buf, size, "index=%d", a->output.index); break;
    case IR_OP_ATTENTION:
    case IR_OP_ATTENTION_BWD:
        snprintf(buf, size, "heads=%d p=%g salt=%d%s%s%s%s", a->attn.heads, (double)a->attn.p, a->attn.salt,
                 a->attn.causal ? " causal" : "", a->attn.packed ? " packed" : "", a->attn.varlen ? " varlen" : "",
                 a->attn.first_query ? " first_query" : "");
        break;
    case IR_OP_SPAN_POSITIONS: snprintf(buf, size, "offset=%lld", (long long)a->pos.offset); break;
    case IR_OP_SPAN_TOKEN:
    case IR_OP_SPAN_TOKEN_BWD: snprintf(buf, size, "%s", a->span.last ? "last" : "first"); break;
    case IR_OP_LAYERNORM:
    case IR_OP_LAYERNORM_FWD:
    case IR_OP_LAYERNORM_DX:
    case IR_OP_LAYERNORM_DGAMMA: snprintf(buf, size, "eps=%g", a->norm.eps); break;
    case IR_OP_ACT:
    case IR_OP_ACT_BWD:
    case IR_OP_ACT_BWD_BGRAD: snprintf(buf, size, "%s", ir_act_name(a->act.kind)); break;
    case IR_OP_SOFTMAX: snprintf(buf, size, "%s", a->softmax.causal ? "causal" : "padding"); break;
    case IR_OP_DROPOUT: snprintf(buf, size, "p=%g salt=%d", a->dropout.p, a->dropout.salt); break;
    case IR_OP_SPLIT_HEADS: snprintf(buf, size, "heads=%lld", (long long)a->heads.heads); break;
    case IR_OP_CAST: snprintf(buf, size, "to=%s", ir_dtype_name(a->cast.to)); break;
    case IR_OP_EMBEDDING_BWD: snprintf(buf, size, "rows=%lld", (long long)a->embed_bwd.rows); break;
    case IR_OP_LN_RESIDUAL:
    case IR_OP_LN_RESIDUAL_BWD: {
        IrLnFusedAttr la = fuse_ln_attr_get(n);
        snprintf(buf, size, "eps=%g p=%g salt=%d%s", la.eps, (double)la.p, (int)la.salt, la.xhat ? (la.ones ? " save=xhat+ones" : " save=xhat") : "");
        break;
    }
    case IR_OP_EMBED_LN:
        snprintf(buf, size, "eps=%g p=%g salt=%d", a->embed_ln.eps, (double)a->embed_ln.p, (int)a->embed_ln.salt);
        break;
    case IR_OP_EMBED_LN_BWD:
        snprintf(buf, size, "p=%g salt=%d rows=%d,%d,%d", (double)a->embed_ln_bwd.p, (int)a->embed_ln_bwd.salt,
                 a->embed_ln_bwd.rows0, a->embed_ln_bwd.rows1, (int)a->embed_ln_bwd.rows2);
        break;
    case IR_OP_LINEAR_DX_ACC:   /* compiler/fuse_accum.c: the sum is f32, dX no longer stored */
        snprintf(buf, size, "+=%%%d unrounded=%s", n->in[2], ir_dtype_name((DType)a->fused.mid));
        break;
    default: break;
    }
}

static void print_node(const IrGraph *g, int id, FILE *out)
{
    const IrNode *n = &g->nodes[id];
    char call[160], attr[96], shape[64];
    int used = snprintf(call, sizeof call, "%s(", ir_op_name(n->op));
    for (int k = 0; k < n->n_in && used < (int)sizeof call; k++)
        used += snprintf(call + used, sizeof call - (size_t)used, "%s%%%d", k ? ", " : "", n->in[k]);
    if (used < (int)sizeof call) snprintf(call + used, sizeof call - (size_t)used, ")");
    ir_attr_str(n, attr, sizeof attr);
    ir_shape_str(n, shape, sizeof shape);
    fprintf(out, "%%%-5d %-56s = %-34s %-26s : %s %s%s\n", id, n->name, call, attr, shape,
            ir_dtype_name(n->dtype), n->requires_grad ? " grad" : "");
}

void ir_print(const IrGraph *g, FILE *out)
{
    fprintf(out, "# %d values: %d forward, %d backward; loss %%%d, logits %%%d\n", g->n,
            g->n_forward, g->n - g->n_forward, g->loss, g->logits);
    for (int i = 0; i < g->n; i++) {
        if (i == g->n_forward) fprintf(out, "# backward\n");
        print_node(g, i, out);
    }
    if (!g->param_grad) return;
    fprintf(out, "# parameter gradients\n");
    for (int p = 0; p < g->n_params; p++)
        if (g->param_grad[p] >= 0) fprintf(out, "# param %d -> %%%d\n", p, g->param_grad[p]);
}

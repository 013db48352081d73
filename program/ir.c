/* program/ir.c — the graph's data and small queries; see ir.h (building:
 * compiler/ir_build.c). */
#include "program/ir.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

void ir_init(IrGraph *g)
{
    memset(g, 0, sizeof *g);
    g->loss = -1;
    g->logits = -1;
    g->region = IR_REGION_HEAD;
}

void ir_free(IrGraph *g)
{
    free(g->nodes);
    free(g->param_grad);
    ir_init(g);
}

int ir_output(const IrGraph *g, int id, int k)
{
    if (k == 0) return id;
    for (int j = id + 1; j < g->n; j++)
        if (g->nodes[j].op == IR_OP_OUTPUT && g->nodes[j].in[0] == id && g->nodes[j].attr.output.index == k)
            return j;
    return -1;
}

int ir_readers(const IrGraph *g, int v)
{
    int n = 0;
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) n += g->nodes[i].in[k] == v;
    return n;
}

const char *ir_dtype_name(DType dt)
{
    switch (dt) {
    case DT_F32: return "f32";
    case DT_F16: return "f16";
    case DT_BF16: return "bf16";
    case DT_F64: return "f64";
    case DT_I32: return "i32";
    }
    return "?";
}

bool ir_dtype_is_float(DType dt) { return dt != DT_I32; }

const char *ir_input_name(IrInputKind kind)
{
    static const char *names[IR_IN_COUNT] = {
        "input_ids", "token_type_ids", "attention_mask", "labels", "token_labels",
        "targets", "loss_scale", "seq_spans",
    };
    return kind >= 0 && kind < IR_IN_COUNT ? names[kind] : "?";
}

const char *ir_act_name(IrActKind kind)
{
    static const char *const names[IR_ACT_COUNT] = {
#define ACT_NAME_(E, name, ...) #name,
        HPC_ACTIVATIONS(ACT_NAME_)
#undef ACT_NAME_
    };
    return kind >= 0 && kind < IR_ACT_COUNT ? names[kind] : "?";
}

int64_t ir_dim(int64_t d, int64_t B, int64_t L)
{
    return d == IR_DIM_B ? B : d == IR_DIM_L ? L : d;
}

int64_t ir_numel(const IrNode *v, int64_t B, int64_t L)
{
    int64_t n = 1;
    for (int i = 0; i < v->rank; i++) n *= ir_dim(v->dims[i], B, L);
    return n;
}

int64_t ir_rows(const IrNode *v, int64_t B, int64_t L)
{
    int64_t n = 1;
    for (int i = 0; i + 1 < v->rank; i++) n *= ir_dim(v->dims[i], B, L);
    return n;
}

bool ir_graph_packed(const IrGraph *g)
{
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i].op == IR_OP_INPUT && g->nodes[i].attr.input.kind == IR_IN_SEQ_SPANS) return true;
    return false;
}

int64_t ir_span_max(const IrGraph *g)
{
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i].op == IR_OP_INPUT && g->nodes[i].attr.input.kind == IR_IN_SEQ_SPANS)
            return g->nodes[i].attr.input.span_max;
    return 0;
}

bool ir_same_shape(const IrNode *a, const IrNode *b)
{
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

void ir_shape_str(const IrNode *v, char *buf, size_t size)
{
    size_t used = 0;
    used += (size_t)snprintf(buf, size, "(");
    for (int i = 0; i < v->rank && used < size; i++) {
        const char *sep = i ? ", " : "";
        if (v->dims[i] == IR_DIM_B) used += (size_t)snprintf(buf + used, size - used, "%sB", sep);
        else if (v->dims[i] == IR_DIM_L) used += (size_t)snprintf(buf + used, size - used, "%sL", sep);
        else used += (size_t)snprintf(buf + used, size - used, "%s%lld", sep, (long long)v->dims[i]);
    }
    if (used < size) snprintf(buf + used, size - used, ")");
}

void ir_copy_roles(IrGraph *g, const IrGraph *src, const int *map)
{
    g->loss = src->loss >= 0 ? map[src->loss] : -1;
    g->logits = src->logits >= 0 ? map[src->logits] : -1;
    g->n_forward = src->n_forward > 0 ? map[src->n_forward - 1] + 1 : 0;
    g->n_params = src->n_params;
    free(g->param_grad);
    g->param_grad = NULL;
    if (!src->param_grad) return;
    g->param_grad = xmalloc((size_t)(src->n_params > 0 ? src->n_params : 1) * sizeof *g->param_grad);
    for (int p = 0; p < src->n_params; p++)
        g->param_grad[p] = src->param_grad[p] >= 0 ? map[src->param_grad[p]] : -1;
}

int ir_count_op(const IrGraph *g, IrOpKind op, int from)
{
    int n = 0;
    for (int i = from; i < g->n; i++) n += g->nodes[i].op == op;
    return n;
}

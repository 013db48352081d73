/* program/ir.c — graph construction and small queries; see ir.h. */
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

static int ir_append(IrGraph *g, IrOpKind op, const char *name)
{
    if (g->n == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 256;
        g->nodes = xrealloc(g->nodes, (size_t)g->cap * sizeof *g->nodes);
    }
    IrNode *n = &g->nodes[g->n];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->region = g->region;
    for (int i = 0; i < IR_MAX_INPUTS; i++) n->in[i] = -1;
    snprintf(n->name, sizeof n->name, "%s", name ? name : ir_op_name(op));
    g->n_forward = g->n + 1; /* autodiff resets this after it appends */
    return g->n++;
}

int ir_add(IrGraph *g, IrOpKind op, const int *inputs, int n_in, const IrAttr *attr,
           const char *name)
{
    const IrOpInfo *info = ir_op_info(op);
    if (n_in < info->min_inputs || n_in > info->max_inputs)
        hpc_panic(__FILE__, __LINE__, "op %s given %d inputs (wants %d..%d)", info->name, n_in,
                  info->min_inputs, info->max_inputs);
    for (int i = 0; i < n_in; i++) HPC_ASSERT(inputs[i] >= 0 && inputs[i] < g->n);
    int id = ir_append(g, op, name);
    IrNode *n = &g->nodes[id];
    for (int i = 0; i < n_in; i++) n->in[i] = inputs[i];
    n->n_in = n_in;
    if (attr) n->attr = *attr;
    info->shape(g, n);
    return id;
}

int ir_add_outputs(IrGraph *g, IrOpKind op, const int *inputs, int n_in, const IrAttr *attr,
                   const char *name, int *outs)
{
    int id = ir_add(g, op, inputs, n_in, attr, name);
    outs[0] = id;
    for (int k = 1; k < ir_op_info(op)->n_outputs; k++) {
        char pname[IR_NAME_MAX];
        snprintf(pname, sizeof pname, "%.*s.%s", IR_NAME_MAX - 16, g->nodes[id].name, ir_output_name(op, k));
        IrAttr a = {.output = {k}};
        outs[k] = ir_add(g, IR_OP_OUTPUT, &id, 1, &a, pname);
    }
    return id;
}

int ir_output(const IrGraph *g, int id, int k)
{
    if (k == 0) return id;
    for (int j = id + 1; j < g->n; j++)
        if (g->nodes[j].op == IR_OP_OUTPUT && g->nodes[j].in[0] == id && g->nodes[j].attr.output.index == k)
            return j;
    return -1;
}

int ir_input(IrGraph *g, IrInputKind kind)
{
    IrAttr a = {.input = {kind}};
    return ir_add(g, IR_OP_INPUT, NULL, 0, &a, ir_input_name(kind));
}

int ir_param(IrGraph *g, int index, DType dtype, int rank, const int64_t *dims, const char *name)
{
    HPC_ASSERT(rank >= 1 && rank <= IR_MAX_RANK);
    int id = ir_append(g, IR_OP_PARAM, name);
    IrNode *n = &g->nodes[id];
    n->attr.param.index = index;
    n->dtype = dtype;
    n->rank = rank;
    memcpy(n->dims, dims, (size_t)rank * sizeof *dims);
    return id;
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
        "targets", "loss_scale",
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

int ir_copy_node(IrGraph *g, const IrNode *n, const int *map)
{
    int id;
    if (n->op == IR_OP_PARAM) {
        id = ir_param(g, n->attr.param.index, n->dtype, n->rank, n->dims, n->name);
    } else {
        int in[IR_MAX_INPUTS];
        for (int k = 0; k < n->n_in; k++) in[k] = map[n->in[k]];
        id = ir_add(g, n->op, in, n->n_in, &n->attr, n->name);
    }
    g->nodes[id].requires_grad = n->requires_grad;
    g->nodes[id].backward = n->backward;
    g->nodes[id].region = n->region;
    return id;
}

int ir_cast(IrGraph *g, int v, DType to)
{
    if (g->nodes[v].dtype == to) return v;
    char name[IR_NAME_MAX];
    snprintf(name, sizeof name, "%.*s.%s", IR_NAME_MAX - 6, g->nodes[v].name, ir_dtype_name(to));
    IrAttr a = {.cast = {to}};
    int id = ir_add(g, IR_OP_CAST, &v, 1, &a, name);
    g->nodes[id].requires_grad = g->nodes[v].requires_grad;
    g->nodes[id].backward = g->nodes[v].backward;
    g->nodes[id].region = g->nodes[v].region;
    return id;
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

/* compiler/precision_report.c — `hpc compile --precision-report`: the
 * precision plan, one line per op; see precision.h. */
#include <stdbool.h>
#include <stdio.h>

#include "precision.h"

static void report_header(const PrecisionPlan *pl, FILE *out)
{
    int low_copies = 0;
    for (int p = 0; p < pl->n_params; p++) low_copies += pl->param_low[p] != DT_F32;
    fprintf(out, "precision plan: policy %s; embeddings %s, stack %s, head %s\n",
            spec_precision_name(pl->policy), ir_dtype_name(pl->region_dtype[PREC_REGION_EMBEDDINGS]),
            ir_dtype_name(pl->region_dtype[PREC_REGION_STACK]),
            ir_dtype_name(pl->region_dtype[PREC_REGION_HEAD]));
    char keep[128];
    precision_keep_format(pl->keep_f32, keep, sizeof keep);
    fprintf(out, "kept in f32: %s%s\n", keep,
            pl->policy == PREC_FP32 ? "" : pl->keep_f32 == 0 ? " (every activation and gradient is low)"
                                                              : " (docs/precision.md)");
    fprintf(out, "%d casts inserted; %d of %d parameters keep a low-precision copy written by the "
            "optimizer; master weights, optimizer state and parameter gradients are f32%s\n",
            pl->n_casts, low_copies, pl->n_params,
            pl->low_weight_grads ? ", but the weight gradients that dW GEMMs write, which are low "
                                   "(HPC_WEIGHT_GRAD=low)" : "");
    fprintf(out, "%5s  %-18s %-11s %-10s %-16s %-7s %-6s %s\n", "id", "op", "class", "region",
            "inputs", "compute", "output", "name");
}

/* "f16,f16,f32" into buf; integer inputs (ids, masks, labels) included. */
static void input_dtypes(const IrGraph *g, const IrNode *n, char *buf, size_t size)
{
    buf[0] = '\0';
    size_t len = 0;
    for (int k = 0; k < n->n_in && len < size; k++)
        len += (size_t)snprintf(buf + len, size - len, "%s%s", k ? "," : "",
                                ir_dtype_name(g->nodes[n->in[k]].dtype));
    if (n->n_in == 0) snprintf(buf, size, "-");
}

void precision_report(const IrGraph *g, const PrecisionPlan *pl, FILE *out)
{
    report_header(pl, out);
    bool backward = false;
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = &g->nodes[i];
        const PrecNodeInfo *info = &pl->info[i];
        if (n->op == IR_OP_INPUT || n->op == IR_OP_POSITIONS) continue;
        if (!backward && i >= g->n_forward) {
            fputs("  -- backward --\n", out);
            backward = true;
        }
        if (n->op == IR_OP_PARAM && n->dtype == DT_F32) continue;   /* masters: see the header */
        char ins[64];
        input_dtypes(g, n, ins, sizeof ins);
        const char *op = n->op == IR_OP_PARAM ? "param copy" : ir_op_name(n->op);
        fprintf(out, "%5d  %-18s %-11s %-10s %-16s %-7s %-6s %s\n", i, op,
                precision_class_name(info->cls), precision_region_name(info->region), ins,
                ir_dtype_name(info->compute), ir_dtype_name(n->dtype), n->name);
    }
}

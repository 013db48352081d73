/* program/op_info.c — the op table's facts both halves read: each op kind's
 * name, arity and outputs (ops.def), and its outputs' names.  The shape and
 * backward rules are the compiler's (compiler/ops.c). */
#include "program/ir.h"

#include "error.h"

static const IrOpInfo op_table[] = {
#define IR_OP(E, name, nmin, nmax, nout, prec, grad, cuda) {#name, nmin, nmax, nout},
#include "program/ops.def"
#undef IR_OP
};
_Static_assert(sizeof op_table / sizeof op_table[0] == IR_OP_COUNT, "ops.def and the op table disagree");
_Static_assert(IR_OP_COUNT == 52, "an op was added or removed: update docs/ir.md (the row names its functions)");

const IrOpInfo *ir_op_info(IrOpKind op)
{
    HPC_ASSERT(op >= 0 && op < IR_OP_COUNT);
    return &op_table[op];
}

const char *ir_op_name(IrOpKind op) { return ir_op_info(op)->name; }

const char *ir_output_name(IrOpKind op, int k)
{
    if (k == 0) return "out";
    if (op == IR_OP_LAYERNORM_FWD) return k == 1 ? "mean" : k == 2 ? "rstd" : "?";
    if (op == IR_OP_LN_RESIDUAL) {
        static const char *const nm[] = {"out", "mean", "rstd", "sum", "low"};
        return k < 5 ? nm[k] : "?";
    }
    if (op == IR_OP_LN_RESIDUAL_BWD) {
        static const char *const nm[] = {"out", "dx", "dgamma", "dbeta", "dbias"};
        return k < 5 ? nm[k] : "?";
    }
    if (op == IR_OP_LINEAR_DW_BGRAD || op == IR_OP_LN_DW_FIX_DB) return k == 1 ? "db" : "?";
    if (op == IR_OP_ACT_BWD_BGRAD) return k == 1 ? "db" : k == 2 ? "act" : "?";
    if (op == IR_OP_ATTENTION) return k == 1 ? "lse" : k == 2 ? "keep" : "?";
    if (op == IR_OP_ATTENTION_BWD) return k == 1 ? "dk" : k == 2 ? "dv" : "?";
    if (op == IR_OP_UNSTACK) return k == 1 ? "second" : k == 2 ? "third" : "?";
    if (op == IR_OP_EMBED_LN) {
        static const char *const nm[] = {"out", "xhat", "rstd", "low"};
        return k < 4 ? nm[k] : "?";
    }
    if (op == IR_OP_EMBED_LN_BWD) {
        static const char *const nm[] = {"out", "dtable1", "dtable2", "dgamma", "dbeta"};
        return k < 5 ? nm[k] : "?";
    }
    return "?";
}

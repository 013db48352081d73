/* compiler/emit_lib_step.c — DIR/NAME_step.cuh for --emit-cuda and
 * --emit-lib: the CUDA the training step itself runs (the step program's
 * module, program/step_program.h, the kernels tests/gpu checks against the
 * cpu reference), with the ABI and one line per launch so another program
 * can call them: which kernel, its launch type and its count as a function
 * of B and L.  See emit_lib.h. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "emit_lib.h"
#include "emit_lib_internal.h"
#include "step_program_build.h"

static const char *const lt_names[EOP_LT_COUNT] = {
    [EOP_LT_ELEMS] = "elems: grid-stride, min(ceil(count/256), 2^20) x 256",
    [EOP_LT_ROWS] = "rows: count blocks of THREADS, one per row",
    [EOP_LT_WARP_ROWS] = "warp rows: ceil(count/4) x 128, one warp per row",
    [EOP_LT_ONE] = "one block of 1024",
    [EOP_LT_COLPART] = "column partials: (ceil(count/32), 128) x (32, 8)",
    [EOP_LT_COLFIN] = "column sums: ceil(count/256) x 256",
    [EOP_LT_HEAD_TILES] = "head tiles: (count, HEADS, B) x 128",
    [EOP_LT_HEAD_BLOCKS] = "head blocks: (count, HEADS, B) x 256",
};

/* "min(cap, (c0 + c1*B*L) / div)" in the fewest words. */
static void size_text(const StepSize *s, char *buf, size_t cap)
{
    char prod[96];
    int n = snprintf(prod, sizeof prod, "%" PRId64, s->c1);
    for (int i = 0; i < s->pB && n < (int)sizeof prod; i++) n += snprintf(prod + n, sizeof prod - (size_t)n, "*B");
    for (int i = 0; i < s->pL && n < (int)sizeof prod; i++) n += snprintf(prod + n, sizeof prod - (size_t)n, "*L");
    char sum[160];
    if (s->c1 == 0) snprintf(sum, sizeof sum, "%" PRId64, s->c0);
    else if (s->c0) snprintf(sum, sizeof sum, "(%" PRId64 " + %s)", s->c0, prod);
    else snprintf(sum, sizeof sum, "%s", prod);
    char q[200];
    if (s->div > 1) snprintf(q, sizeof q, "%s / %" PRId64, sum, s->div);
    else snprintf(q, sizeof q, "%s", sum);
    if (s->cap > 0) snprintf(buf, cap, "min(%s, %" PRId64 ")", q, s->cap);
    else snprintf(buf, cap, "%s", q);
}

static void print_intro(FILE *f, const StepProgram *p)
{
    fprintf(f, "// %s_step.cuh — the kernels of %s's training step (%s), written by `hpc compile\n"
               "// --emit-cuda`: the same module hpc's cuda backend compiles and tests/gpu checks\n"
               "// against the cpu reference.  Every node's kernel is\n"
               "//   extern \"C\" __global__ void NAME(EopArgs a)\n"
               "// with a.y the node's output, a.x[k] its inputs, a.scratch its scratch (bytes\n"
               "// below), a.ctl a device EopCtl (dropout seed and step, training flag, loss\n"
               "// scale), a.B and a.L the batch and padded length, a.salt the node's dropout\n"
               "// salt (its code line's); every other size is a\n"
               "// constant; a.yk[k-1] is output k of a multi-output node.  Layouts (144 and 24 bytes):\n"
               "//   struct EopArgs { u64 y; u64 x[8]; u64 yk[4]; u64 scratch; u64 ctl; i64 B; i64 L; u64 salt; };\n"
               "//   struct EopCtl { u64 seed; u32 step; u32 training; float loss_scale; u32 pad_; };\n"
               "// GEMM nodes (linear, matmul, linear_dx, linear_dw, linear_dw_bgrad, and\n"
               "// linear_dx_acc: beta = 1, written over its input 2) run on\n"
               "// cuBLASLt in hpc; a kernel listed after one runs after the GEMM (a\n"
               "// linear_dw_bgrad's column sums into db only where cuBLASLt has no BGRADB\n"
               "// epilogue for it).  The module ends with the optimizer and loss\n"
               "// scaler (hpc's compiler/emit_optim.h), with their own signatures: one\n"
               "// multi-tensor pass each over a table of 4096-element chunks (structs opt_tensor,\n"
               "// opt_chunk, opt_params, opt_state in the block), queued after the backward:\n"
               "//   [opt_mark_rows  1 x 1024 per embedding table whose untouched rows are skipped]\n"
               "//   opt_check_norm  ceil(chunks / 4) x 256\n"
               "//   opt_decide      1 x 1024\n"
               "//   [LAMB: opt_lamb_norms  chunks x 256, opt_lamb_ratio  tensors x 256]\n"
               "//   opt_update      chunks x 256\n"
               "//   opt_accumulate  chunks x 256, per micro-batch when gradients accumulate\n"
               "// Launches of the step's nodes, in step order:\n",
            p->name, p->name, spec_precision_name(p->policy));
    for (int i = 0; i < p->kernels.n; i++) {
        const StepNodeCode *c = &p->kernels.node[i];
        const IrNode *n = &p->g.nodes[i];
        if (c->kind == EOP_GEMM) fprintf(f, "//   %4d %-36s %s (GEMM)\n", i, n->name, ir_op_name(n->op));
        if (c->kind == EOP_GEMM && c->n_phases == 0) continue;
        for (int k = 0; k < c->n_phases; k++) {
            char count[256];
            size_text(&c->phase[k].count, count, sizeof count);
            fprintf(f, "//   %4d %-36s %s  count %s; %s", i, n->name, c->phase[k].name, count,
                    lt_names[c->phase[k].lt]);
            if (c->phase[k].lt == EOP_LT_ROWS) fprintf(f, " (THREADS %d)", c->phase[k].threads);
            if (c->phase[k].lt == EOP_LT_HEAD_TILES || c->phase[k].lt == EOP_LT_HEAD_BLOCKS) fprintf(f, " (HEADS %d)", c->phase[k].threads);
            if (c->phase[k].above_l > 0)   /* its blocks return at once at L <= above_l */
                fprintf(f, "; only where L > %lld", (long long)c->phase[k].above_l);
            if (c->phase[k].at_most_l > 0)
                fprintf(f, "; only where L <= %lld", (long long)c->phase[k].at_most_l);
            if (c->phase[k].target == STEP_TARGET_SM90A) fprintf(f, "; only from a module built for sm_90a");
            if (c->phase[k].target == STEP_TARGET_NOT_SM90A) fprintf(f, "; only from a module not built for sm_90a");
            fputc('\n', f);
        }
        if (c->n_phases && (c->scratch.c0 || c->scratch.c1)) {
            char sc[256];
            size_text(&c->scratch, sc, sizeof sc);
            fprintf(f, "//        scratch bytes %s\n", sc);
        }
    }
}

HpcStatus emitlib_check_cuda(const ModelSpec *spec, SpecPrecision policy, HpcError *err)
{
    /* compiler/step_program_build.c: a packed program's varlen attention
     * exists in 16 bits only, so under fp32 it gets no CUDA kernels */
    if (!spec->train.pack || (policy != PREC_FP32 && policy != PREC_DEFAULT)) return HPC_OK;
    return hpc_fail(err, HPC_ERR_USAGE, "emit: %s is packed (pack = true, docs/packing.md) and compiled for fp32, "
                    "which gives it no CUDA kernels (the packed attention runs in 16 bits only); emit it under "
                    "fp16 or bf16", spec->name);
}

HpcStatus emitlib_step(const ModelSpec *spec, SpecPrecision policy, const char *dir, HpcError *err)
{
    HpcStatus st = emitlib_check_cuda(spec, policy, err);
    if (st) return st;
    StepProgram p;
    st = step_program_compile(spec, policy, true, &p, err);
    if (st) return st;
    char path[4096], name[128];
    snprintf(name, sizeof name, "%s_step", spec->name);
    FILE *f = NULL;
    st = emitlib_mkdir(dir, err);
    if (!st) st = emitlib_open(dir, name, ".cuh", path, sizeof path, &f, err);
    if (!st) {
        print_intro(f, &p);
        fprintf(f, "\n#ifndef HPC_STEP_%s_CUH\n#define HPC_STEP_%s_CUH\n\n", spec->name, spec->name);
        fputs(p.kernels.cuda_source, f);
        fputs("\n#endif\n", f);
        st = emitlib_close(f, path, err);
    }
    step_program_free(&p);
    return st;
}

/* compiler/emit_lib.h — what `hpc compile MODEL --emit-cuda DIR` and
 * `--emit-lib DIR` write: a model's code for other programs' builds.
 *
 * --emit-cuda DIR writes DIR/NAME_step.cuh, the kernels of the training
 * step itself (emitlib_step below: every node's kernel, then the optimizer
 * and loss scaler, compiler/emit_optim.h), and DIR/NAME_kernels.cuh: the
 * model's fused CUDA templates (compiler/emit_kernels.h: LayerNorm,
 * softmax, GELU, embeddings, losses) as one header for projects that build
 * with nvcc.  It
 * opens with a comment that documents the constants, the storage type, the
 * conventions and every kernel's signature (extracted from the source, so
 * it cannot drift), then the source itself, then one alias per kernel,
 *   #define HPC_KERNEL_ln_fwd ln_fwd_f32_h128_3fa9c1
 * so calling code need not spell the hash.  Include it in exactly one .cu
 * file (it defines the kernels); compile for sm_80 or newer.
 *
 * --emit-lib DIR writes a self-contained package a C program builds
 * against libhpcrt.a (docs/embedding.md):
 *   NAME.h              typed entry points (NAME_open, NAME_forward, ...) and
 *                       the model's sizes as constants, over include/hpc.h
 *   NAME.c              the entry points, with the resolved model text
 *                       embedded as a C array (no file to ship beside the
 *                       program; opened through HpcModelOptions.model_text)
 *   NAME_demo.c         a program that opens the model and runs a forward
 *   NAME.hpc            the artifact (program/artifact.h)
 *   NAME_kernels.cuh    as --emit-cuda
 *   NAME.plan.txt       the memory plan of a step (plan_print)
 *   NAME_step.cuh       the step's own kernels and optimizer, as --emit-cuda
 *   NAME_step.sm_XX.cubin  NAME_step.cuh compiled for each arch asked for
 *                       (opts.archs); NAME.hpc then carries the same cubins
 *   NAME_kernels.sm_XX.cubin  the .cuh's kernels for each arch asked for
 *                       (opts.archs), compiled by
 *                       opts.compile (NVRTC lives in the runtime library,
 *                       which the compiler library must not use)
 *   Makefile            builds libNAME.a and NAME_demo: make HPC_ROOT=...
 * The version of include/hpc.h the package was written for is recorded in
 * NAME.h; NAME_open refuses a library of another major version.
 *
 * Ownership: the functions borrow everything; nothing is kept.
 *
 * Usage (cli/cmd_compile.c):
 *   EmitLibOptions o = {.policy = PREC_FP16, .archs = {80, 90}, .n_archs = 2, .compile = cb};
 *   if (emitlib_cuda(&spec, PREC_FP16, "out", &err)) return err.code;
 *   if (emitlib_package(&spec, &o, "pkg", &err)) return err.code;
 */
#ifndef HPC_COMPILER_EMIT_LIB_H
#define HPC_COMPILER_EMIT_LIB_H

#include <stdbool.h>
#include <stddef.h>

#include "error.h"
#include "program/spec.h"

#define EMITLIB_MAX_ARCHS 8

/* Compiles CUDA source for sm_<arch> into a malloc'd cubin. */
typedef HpcStatus (*EmitLibCompileFn)(const char *source, const char *name, int arch, void **cubin,
                                      size_t *size, HpcError *err);

typedef struct {
    SpecPrecision policy;          /* PREC_FP32, PREC_FP16 or PREC_BF16 */
    int archs[EMITLIB_MAX_ARCHS];  /* cubins to write, e.g. 80, 90 */
    int n_archs;
    EmitLibCompileFn compile;      /* needed when n_archs > 0 */
    const char *plan_text;         /* the plan summary to store, or NULL */
    const char *cuda_source;       /* unused: NAME.hpc's step program carries its own CUDA */
    const char *hpc_root;          /* default HPC_ROOT of the Makefile, or NULL */
} EmitLibOptions;

/* HPC_ERR_USAGE when the model under policy has no CUDA step to emit: a
 * packed model (train.pack) under fp32 runs on the cpu backend only.
 * emitlib_step, emitlib_cuda and emitlib_package check it before writing
 * anything. */
HpcStatus emitlib_check_cuda(const ModelSpec *spec, SpecPrecision policy, HpcError *err);

/* DIR/NAME_step.cuh: the training step's own kernels (the step program's
 * module, the ones hpc runs and tests), with the ABI and a launch table in
 * its opening comment (compiler/emit_lib_step.c).  emitlib_cuda and
 * emitlib_package write it beside NAME_kernels.cuh. */
HpcStatus emitlib_step(const ModelSpec *spec, SpecPrecision policy, const char *dir, HpcError *err);

/* Writes DIR/NAME_kernels.cuh and DIR/NAME_step.cuh (DIR is created if
 * missing).  HPC_ERR_IO naming the path; HPC_ERR_INPUT if the kernels do not
 * support the model. */
HpcStatus emitlib_cuda(const ModelSpec *spec, SpecPrecision policy, const char *dir, HpcError *err);

/* Writes the package described above into DIR. */
HpcStatus emitlib_package(const ModelSpec *spec, const EmitLibOptions *opts, const char *dir, HpcError *err);

/* Parses "80,90" or "sm_80,sm_90" into archs (each 50..200; one given
 * twice counts once); false on junk or more than EMITLIB_MAX_ARCHS. */
bool emitlib_parse_archs(const char *s, int *archs, int *n);

#endif

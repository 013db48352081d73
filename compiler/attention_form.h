/* compiler/attention_form.h — which form lowering gives self-attention:
 * the fused ATTENTION node (compiler/kernels/attention.cu) or the unfused
 * chain (split heads, two batched GEMMs, softmax + dropout, merge heads).
 *
 * AUTO (the default) picks the fused form where its tensor-core kernels
 * run: the stack computes in fp16 or bf16 (the policy, unless the stack is
 * pinned to fp32) and the head size is a multiple of 16, at most
 * ATTN_FUSED_MAX_HEAD_DIM.  Everything else (fp32 steps, odd head sizes)
 * keeps the unfused chain.  FUSED forces the node for any model (the cpu
 * backend runs it at any dtype; the cuda emitter refuses what the
 * kernels do not cover, naming HPC_ATTENTION=unfused as the way out);
 * UNFUSED forces the old chain, for comparisons.
 *
 * The environment variable HPC_ATTENTION=auto|fused|unfused overrides an
 * AUTO request, so `hpc run`, `hpc compile` and bench/ can compare the two
 * forms without a rebuild.
 *
 * A packed program (train.pack, docs/packing.md) is always fused: only the
 * fused op attends within each sequence's span of the flat token slots.
 * Asking for the unfused form there (UNFUSED, HPC_ATTENTION=unfused) is an
 * HPC_ERR_USAGE naming pack.
 */
#ifndef HPC_COMPILER_ATTENTION_FORM_H
#define HPC_COMPILER_ATTENTION_FORM_H

#include <stdbool.h>

#include "error.h"
#include "program/spec.h"

#define ATTN_FUSED_MAX_HEAD_DIM 128

typedef enum { ATTN_FORM_AUTO, ATTN_FORM_FUSED, ATTN_FORM_UNFUSED } AttnForm;

/* *fused for `spec` under `policy` and request `req` (AUTO reads
 * HPC_ATTENTION first).  HPC_ERR_USAGE for an HPC_ATTENTION value that is
 * not auto, fused or unfused. */
HpcStatus attention_form_choose(const ModelSpec *spec, SpecPrecision policy, AttnForm req, bool *fused,
                                HpcError *err);

/* "auto", "fused", "unfused". */
const char *attention_form_name(AttnForm f);

#endif

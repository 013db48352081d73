/* compiler/attention_form.c — see attention_form.h. */
#include "attention_form.h"

#include <stdlib.h>
#include <string.h>

const char *attention_form_name(AttnForm f)
{
    return f == ATTN_FORM_FUSED ? "fused" : f == ATTN_FORM_UNFUSED ? "unfused" : "auto";
}

/* The stack's compute dtype is 16-bit: the policy, unless pinned to fp32. */
static bool stack_is_16bit(const ModelSpec *spec, SpecPrecision policy)
{
    if (policy != PREC_FP16 && policy != PREC_BF16) return false;
    return spec->stack.precision != PREC_FP32;
}

HpcStatus attention_form_choose(const ModelSpec *spec, SpecPrecision policy, AttnForm req, bool *fused,
                                HpcError *err)
{
    *fused = false;
    if (req == ATTN_FORM_AUTO) {
        const char *e = getenv("HPC_ATTENTION");
        if (e && *e) {
            if (strcmp(e, "fused") == 0) req = ATTN_FORM_FUSED;
            else if (strcmp(e, "unfused") == 0) req = ATTN_FORM_UNFUSED;
            else if (strcmp(e, "auto") != 0)
                return hpc_fail(err, HPC_ERR_USAGE, "HPC_ATTENTION=%s: want auto, fused or unfused", e);
        }
    }
    /* A packed program (docs/packing.md) has no (B, L) mask: only the
     * fused op, which attends within each sequence's span, can run it. */
    if (spec->train.pack) {
        if (req == ATTN_FORM_UNFUSED)
            return hpc_fail(err, HPC_ERR_USAGE,
                            "%s: pack = true needs the fused attention op (the unfused chain of batched score "
                            "GEMMs cannot keep packed sequences apart), but the unfused one was asked for%s; "
                            "unset HPC_ATTENTION or train without pack",
                            spec->name, getenv("HPC_ATTENTION") ? " (HPC_ATTENTION=unfused)" : "");
        *fused = true;
        return HPC_OK;
    }
    if (req != ATTN_FORM_AUTO) {
        *fused = req == ATTN_FORM_FUSED;
        return HPC_OK;
    }
    const SpecStack *s = &spec->stack;
    int64_t d = s->heads > 0 ? s->hidden / s->heads : 0;
    *fused = stack_is_16bit(spec, policy) && d > 0 && d % 16 == 0 && d <= ATTN_FUSED_MAX_HEAD_DIM;
    return HPC_OK;
}

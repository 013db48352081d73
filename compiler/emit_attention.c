/* compiler/emit_attention.c — see emit_attention.h.  Cuts the attention
 * translation unit out of kemit_source()'s output, so the constants, the
 * template text and the names' hash are the step module's own. */
#include "emit_attention.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strbuf.h"

/* The templates kept, in the order kemit_source() emits them. */
static const char *const attn_templates[] = {"common.cu", "philox.cu", "attention.cu"};

/* Start of the section of template `name` in src (its "// ---- name ----"
 * line), or NULL; *len gets its length up to the next section. */
static const char *section(const char *src, const char *name, size_t *len)
{
    char mark[96];
    snprintf(mark, sizeof mark, "\n// ---- %s ----\n", name);
    const char *s = strstr(src, mark);
    if (!s) return NULL;
    const char *e = strstr(s + strlen(mark), "\n// ---- ");
    *len = e ? (size_t)(e - s) : strlen(s);
    return s;
}

HpcStatus kemit_attention_source(const KernelConfig *cfg, char **source, char suffix[KEMIT_SUFFIX_MAX],
                                 HpcError *err)
{
    *source = NULL;
    if (cfg->head_dim > KEMIT_ATTN_MAX_HEAD_DIM)
        return hpc_fail(err, HPC_ERR_INPUT, "attention emitter: head size %lld is above %d, the "
                        "largest the fused attention kernels keep in shared memory; use the unfused path",
                        (long long)cfg->head_dim, KEMIT_ATTN_MAX_HEAD_DIM);
    char *full;
    HpcStatus st = kemit_source(cfg, &full, suffix, err);
    if (st) return st;
    const char *first = strstr(full, "\n// ---- ");
    if (!first) {
        free(full);
        return hpc_fail(err, HPC_ERR_INTERNAL, "attention emitter: kemit_source output has no template sections");
    }
    StrBuf out = {0};
    strbuf_addn(&out, full, (size_t)(first - full));   /* the constants */
    for (size_t i = 0; i < sizeof attn_templates / sizeof attn_templates[0]; i++) {
        size_t len;
        const char *s = section(full, attn_templates[i], &len);
        if (!s) {
            free(full);
            free(out.p);
            return hpc_fail(err, HPC_ERR_INTERNAL, "attention emitter: template compiler/kernels/%s missing "
                            "from the step source; rebuild with `make`", attn_templates[i]);
        }
        strbuf_addn(&out, s, len);
    }
    strbuf_add(&out, "\n");
    free(full);
    *source = out.p;
    return HPC_OK;
}

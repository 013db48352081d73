/* tests/test_dropout_ptx.c — the dropout kernels draw one Philox-4x32-10
 * per 8 elements (runtime/cpu/philox.h), seen in the PTX NVRTC makes of
 * them; no GPU needed.
 *
 * A draw is ten rounds, each with one low-half product by 0xD2511F53, so
 * the count of those in a kernel's PTX over ten is the number of draws the
 * kernel's code holds.  The vectorised element kernels of the step module
 * (dropout_*, dropout_add_*: 8 elements per iteration plus a scalar tail)
 * must hold at most 2 — a draw per element would show 8 or more — the fused
 * LayerNorm sites (ln_residual_fwd_*, ln_residual_bwd_*: one 8-column chunk
 * per thread at hidden 768) 1, and the
 * standalone dropout_fwd / dropout_bwd of compiler/kernels/dropout.cu 2
 * (one a copy of their loop). */
#include <criterion/criterion.h>
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emit_kernels.h"
#include "emit_ops.h"
#include "pipeline.h"
#include "program/spec.h"
#include "compiler/spec_load.h"

static char *ptx_of(const char *src)
{
    nvrtcProgram prog;
    cr_assert_eq(nvrtcCreateProgram(&prog, src, "hpc_dropout_ptx.cu", 0, NULL, NULL), NVRTC_SUCCESS);
    const char *opts[] = {"--gpu-architecture=compute_90", "-std=c++17"};
    nvrtcResult r = nvrtcCompileProgram(prog, 2, opts);
    if (r != NVRTC_SUCCESS) {
        size_t n = 0;
        nvrtcGetProgramLogSize(prog, &n);
        char *log = malloc(n + 1);
        nvrtcGetProgramLog(prog, log);
        cr_assert_fail("NVRTC: %s", log);
    }
    size_t n = 0;
    nvrtcGetPTXSize(prog, &n);
    char *ptx = malloc(n + 1);
    nvrtcGetPTX(prog, ptx);
    nvrtcDestroyProgram(&prog);
    return ptx;
}

/* Low-half products by the Philox multiplier (decimal, signed or hex) in
 * [a, b): PTX lines with the constant and "mul.lo" or "mul.wide".  A round
 * has one; its high half is a mul.hi that may take the constant from a
 * register, so it is not counted (compiler/kernels/philox.cu). */
static int multiplier_count(const char *a, const char *b)
{
    static const char *const forms[] = {"3528531795", "-766435501", "0dD2511F53", "0xD2511F53", "0xd2511f53"};
    int count = 0;
    for (const char *line = a; line < b; ) {
        const char *nl = memchr(line, '\n', (size_t)(b - line));
        const char *end = nl ? nl : b;
        char buf[256];
        size_t len = (size_t)(end - line) < sizeof buf - 1 ? (size_t)(end - line) : sizeof buf - 1;
        memcpy(buf, line, len);
        buf[len] = 0;
        if (strstr(buf, "mul.lo") || strstr(buf, "mul.wide"))
            for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++)
                if (strstr(buf, forms[f])) {
                    count++;
                    break;
                }
        line = end + 1;
    }
    return count;
}

/* Calls check(name, draws) for every .entry whose name starts with prefix;
 * returns how many there were. */
static int each_entry(const char *ptx, const char *prefix, void (*check)(const char *, int, int), int limit)
{
    int seen = 0;
    for (const char *p = ptx; (p = strstr(p, ".entry ")); ) {
        const char *name = p + 7, *end = strstr(name, ".entry ");
        if (!end) end = ptx + strlen(ptx);
        if (strncmp(name, prefix, strlen(prefix)) == 0) {
            char nm[128];
            size_t len = strcspn(name, "(");
            snprintf(nm, sizeof nm, "%.*s", (int)(len < sizeof nm ? len : sizeof nm - 1), name);
            check(nm, multiplier_count(name, end), limit);
            seen++;
        }
        p = end;
    }
    return seen;
}

/* A draw is 10 products by the constant: limit draws allow limit * 10 + 5,
 * where one draw per element of an 8-wide loop would show 80 or more. */
static void expect_draws(const char *name, int mults, int limit)
{
    cr_expect(mults >= 10 && mults <= limit * 10 + 5, "%s: %d Philox multiplies, about %d draws (limit %d)", name,
              mults, (mults + 5) / 10, limit);
}

Test(dropout_ptx, step_module_draws_once_per_8, .timeout = 300)
{
    const char *root = getenv("HPC_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/models/bert_base.model", root ? root : ".");
    ModelSpec spec;
    cr_assert_eq(spec_load(path, &spec, stderr), 0, "cannot load %s", path);
    spec.stack.layers = 1;
    HpcError err = {0};
    PipeOptions o = pipeline_defaults(PREC_FP16);
    Pipeline p;
    cr_assert_eq(pipeline_build(&spec, &o, &p, &err), HPC_OK, "%s", err.msg);
    char *src = NULL;
    cr_assert_eq(eop_module_source(&p.g, &src, &err), HPC_OK, "%s", err.msg);
    char *ptx = ptx_of(src);
    /* BERT-base fp16: the classifier's dropout (dropout + residual is inside
     * the fused LayerNorm sites now: one draw per 8-column chunk). */
    int n = each_entry(ptx, "dropout_", expect_draws, 2);
    cr_expect_geq(n, 1, "only %d dropout kernels in the step module", n);
    /* the embedding layer's dropout, inside its fused kernels (compiler/fuse_embed.c) */
    int emb = each_entry(ptx, "embed_ln_fwd_", expect_draws, 1) + each_entry(ptx, "embed_ln_bwd_f32_", expect_draws, 1);
    cr_expect_eq(emb, 2, "%d fused embedding kernels with a dropout (one forward, one backward)", emb);
    int ln = each_entry(ptx, "ln_residual_fwd_", expect_draws, 1) + each_entry(ptx, "ln_residual_bwd_f32_", expect_draws, 1);
    /* 1 layer: 2 sites.  Their dropout salt is a launch argument, so one
     * forward kernel serves both; the backward takes two, because the layer
     * is lowered for token 0 (compiler/lower.h) and its FFN site's dy is
     * the pooler's 16-bit gradient while the attention site's is the f32
     * residual sum. */
    cr_expect_eq(ln, 3, "%d fused LayerNorm site kernels (1 layer: 2 sites, one forward, two backward)", ln);
    free(ptx);
    free(src);
    pipeline_free(&p);
}

Test(dropout_ptx, standalone_kernels_draw_once_per_8, .timeout = 300)
{
    ModelSpec spec;
    spec_defaults(&spec);
    KernelConfig kc;
    kemit_config_from_spec(&kc, &spec, KEMIT_F16);
    char *src = NULL, suffix[KEMIT_SUFFIX_MAX];
    HpcError err = {0};
    cr_assert_eq(kemit_source(&kc, &src, suffix, &err), HPC_OK, "%s", err.msg);
    char *ptx = ptx_of(src);
    /* 2: NVVM may unswitch the grid-stride loop on the 16-byte-access test,
     * two copies of the loop with one draw each (a draw per element would
     * show 8 a copy) */
    cr_expect_eq(each_entry(ptx, "dropout_fwd", expect_draws, 2), 1);
    cr_expect_eq(each_entry(ptx, "dropout_bwd", expect_draws, 2), 1);
    free(ptx);
    free(src);
}

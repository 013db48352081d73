/* tests/test_ln_fwd_warp.c — HPC_LN_FWD=warp, the LayerNorm-site forward
 * with one warp a row (compiler/emit_ops_ln_site.c, ln_fwd_rows; LnRows in
 * compiler/emit_ops_body_internal.h), on the cpu: what can be checked
 * without a GPU (tests/gpu/gpu_lnfuse.c runs its cases under it on one).
 *
 *  - BERT-base's fp16 step module under warp holds ln_residual_fwd_w_
 *    kernels of 128 threads and no block-a-row site forward; the default
 *    module has none of the warp kernels; it compiles with NVRTC (sm_80,
 *    sm_90);
 *  - sites at D = 128 and 1024 (half a warp's lanes idle; four chunks a
 *    lane) compile under warp; at D = 4096 the module is the default's,
 *    byte for byte (a lane would hold 128 values);
 *  - "block" is the default, byte for byte; other values are refused with
 *    a message naming the value and the choices. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/spec_load.h"
#include "emit_ops.h"
#include "ln_site_graph.h"
#include "module_compiles.h"
#include "pipeline.h"
#include "program/spec.h"
#include "cpu_step.h"

#define WARP_KERNEL "__launch_bounds__(128) ln_residual_fwd_w_"
#define BLOCK_KERNEL "ln_residual_fwd_f"

/* HPC_LN_FWD set to value (NULL: unset); returns what it was. */
static char *fwd_set(const char *value)
{
    const char *v = getenv("HPC_LN_FWD");
    char *was = v ? strdup(v) : NULL;
    if (value) setenv("HPC_LN_FWD", value, 1);
    else unsetenv("HPC_LN_FWD");
    return was;
}

static void fwd_restore(char *was)
{
    if (was) setenv("HPC_LN_FWD", was, 1);
    else unsetenv("HPC_LN_FWD");
    free(was);
}

/* g's module source under HPC_LN_FWD=value; HPC_OK or the error. */
static HpcStatus source_under(const IrGraph *g, const char *value, char **src, HpcError *err)
{
    char *was = fwd_set(value);
    *src = NULL;
    HpcStatus st = eop_module_source(g, src, err);
    fwd_restore(was);
    return st;
}

static void build(const char *model, Pipeline *p)
{
    ModelSpec s;
    cpu_step_load_model(model, &s);
    PipeOptions o = pipeline_defaults(PREC_FP16);
    HpcError err = {0};
    cr_assert_eq(pipeline_build(&s, &o, p, &err), HPC_OK, "%s: pipeline_build: %s", model, err.msg);
}

Test(ln_fwd_warp, bert_base_fp16, .timeout = 600)
{
    Pipeline p;
    build("bert_base.model", &p);
    HpcError err = {0};
    char *dflt = NULL, *block = NULL, *warp = NULL;
    cr_assert_eq(source_under(&p.g, NULL, &dflt, &err), HPC_OK, "default: %s", err.msg);
    cr_assert_eq(source_under(&p.g, "block", &block, &err), HPC_OK, "block: %s", err.msg);
    cr_assert_eq(source_under(&p.g, "warp", &warp, &err), HPC_OK, "warp: %s", err.msg);
    cr_expect(strcmp(dflt, block) == 0, "HPC_LN_FWD=block is not the default module");
    cr_expect(strstr(dflt, "ln_residual_fwd_w_") == NULL, "the default module has a warp-a-row site forward");
    cr_expect(strstr(dflt, BLOCK_KERNEL) != NULL, "the default module has no site forward");
    cr_expect(strstr(warp, WARP_KERNEL) != NULL, "no warp-a-row site forward of 128 threads under warp");
    cr_expect(strstr(warp, BLOCK_KERNEL) == NULL, "a block-a-row site forward under warp");
    free(dflt);
    free(block);
    free(warp);
    char *was = fwd_set("warp");
    expect_module_compiles(&p.g, "bert_base_ln_fwd_warp", "ln_residual_fwd_w_");
    fwd_restore(was);
    pipeline_free(&p);
}

/* One fused site of R rows of D (tests/ln_site_graph.h, f16). */
static void site_graph(int64_t R, int64_t D, LnSite *f)
{
    LnSite u;
    ln_site_build(&u, R, D, DT_F16, 1e-12, 0.1f);
    HpcError err = {0};
    cr_assert_eq(ln_site_fuse(&u, f, NULL, &err), 2, "R=%lld D=%lld: the site did not fuse: %s", (long long)R,
                 (long long)D, err.msg);
    ln_site_free(&u);
}

Test(ln_fwd_warp, sites, .timeout = 600)
{
    static const int64_t Ds[] = {128, 1024};
    for (int d = 0; d < 2; d++) {
        LnSite f;
        site_graph(3, Ds[d], &f);
        char name[64];
        snprintf(name, sizeof name, "hpc_ln_fwd_warp_d%lld", (long long)Ds[d]);
        char *was = fwd_set("warp");
        expect_module_compiles(&f.g, name, WARP_KERNEL);
        fwd_restore(was);
        ln_site_free(&f);
    }
    LnSite f;
    site_graph(5, 4096, &f);
    char *dflt = NULL, *warp = NULL;
    HpcError err = {0};
    cr_assert_eq(source_under(&f.g, NULL, &dflt, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(source_under(&f.g, "warp", &warp, &err), HPC_OK, "%s", err.msg);
    cr_expect(strcmp(dflt, warp) == 0, "D = 4096: the warp module is not the default's");
    free(dflt);
    free(warp);
    ln_site_free(&f);
}

Test(ln_fwd_warp, bad_values, .timeout = 120)
{
    LnSite f;
    site_graph(3, 768, &f);
    static const char *const bad[] = {"warps", "Warp", "v2", "1"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        char *src = NULL;
        HpcError err = {0};
        HpcStatus st = source_under(&f.g, bad[k], &src, &err);
        cr_expect_neq(st, HPC_OK, "HPC_LN_FWD=%s was taken", bad[k]);
        if (st == HPC_OK) {
            free(src);
            continue;
        }
        char want[64];
        snprintf(want, sizeof want, "HPC_LN_FWD=%s is not a variant", bad[k]);
        cr_expect(strstr(err.msg, want) != NULL && strstr(err.msg, "block or warp") != NULL,
                  "HPC_LN_FWD=%s: the message does not name the value and the choices: %s", bad[k], err.msg);
    }
    ln_site_free(&f);
}

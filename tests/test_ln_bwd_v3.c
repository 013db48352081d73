/* tests/test_ln_bwd_v3.c — HPC_LN_BWD=v3, the LayerNorm-site backward that
 * keeps two rows' loads in flight as raw 16-byte vectors
 * (compiler/emit_ops_ln_site.c, "LN_RESIDUAL_BWD v3"), on the cpu: what can
 * be checked without a GPU (tests/gpu/gpu_lnfuse.c runs its cases under v3
 * on one).
 *
 *  - the step modules of models/bert_tiny.model and models/bert_base.model
 *    under fp16 and bf16 compile with NVRTC (sm_80, sm_90) under v3, hold
 *    the v3 kernel (two rows ahead: the loop's slot 1) and differ from the
 *    default module, which has none of it;
 *  - under HPC_LN_SAVE=s (an f32 s and an f32 or 16-bit dy) v3 keeps one
 *    row ahead, and the module compiles;
 *  - one site at D = 128, 768, 1024, 2048 (a thread's one chunk of 8: v3)
 *    compiles with NVRTC, R = 3 rows (fewer than a block's groups); at
 *    D = 4096 (two chunks a thread) v3 emits v2's kernel, byte for byte;
 *  - the parameter forms: v3,GROUPS,MAXBLOCKS[,ROWS[,AHEAD]] taken (AHEAD 1:
 *    no slot 1), and bad values (v3x, v4, AHEAD 3, AHEAD with v2, too few
 *    fields) refused with a message naming the forms. */
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

/* The text only v3's row loop has: its second slot (two rows ahead). */
#define V3_MARK "// v3: the loads of"
#define V3_SLOT1 "slot 1: its row's loads were issued"

/* HPC_LN_BWD (and HPC_LN_SAVE) set for a while and put back as they were. */
typedef struct { char *was_bwd, *was_save; } EnvSaved;

static char *dup_env(const char *name)
{
    const char *v = getenv(name);
    return v ? strdup(v) : NULL;
}

static void restore_env(const char *name, char *was)
{
    if (was) setenv(name, was, 1);
    else unsetenv(name);
    free(was);
}

static EnvSaved env_set(const char *bwd, const char *save)
{
    EnvSaved e = {dup_env("HPC_LN_BWD"), dup_env("HPC_LN_SAVE")};
    if (bwd) setenv("HPC_LN_BWD", bwd, 1);
    else unsetenv("HPC_LN_BWD");
    if (save) setenv("HPC_LN_SAVE", save, 1);
    return e;
}

static void env_restore(EnvSaved e)
{
    restore_env("HPC_LN_BWD", e.was_bwd);
    restore_env("HPC_LN_SAVE", e.was_save);
}

/* The model's fused step graph under policy (HPC_LN_SAVE=save when not NULL,
 * read by the fuse pass). */
static void build(const char *model, SpecPrecision policy, const char *save, Pipeline *p)
{
    ModelSpec s;
    cpu_step_load_model(model, &s);
    PipeOptions o = pipeline_defaults(policy);
    EnvSaved e = env_set(NULL, save);
    HpcError err = {0};
    HpcStatus st = pipeline_build(&s, &o, p, &err);
    env_restore(e);
    cr_assert_eq(st, HPC_OK, "%s: pipeline_build: %s", model, err.msg);
}

/* g's module source under HPC_LN_BWD=bwd (NULL: unset); HPC_OK or the
 * error, its message in err. */
static HpcStatus source_under(const IrGraph *g, const char *bwd, char **src, HpcError *err)
{
    EnvSaved e = env_set(bwd, NULL);
    *src = NULL;
    HpcStatus st = eop_module_source(g, src, err);
    env_restore(e);
    return st;
}

/* The step module of model under policy: v3 in it (two rows ahead when
 * `two_ahead`), not in the default module, and it compiles. */
static void model_case(const char *model, SpecPrecision policy, const char *save, bool two_ahead)
{
    Pipeline p;
    build(model, policy, save, &p);
    HpcError err = {0};
    char *v2 = NULL, *v3 = NULL;
    cr_assert_eq(source_under(&p.g, NULL, &v2, &err), HPC_OK, "%s default: %s", model, err.msg);
    cr_assert_eq(source_under(&p.g, "v3", &v3, &err), HPC_OK, "%s v3: %s", model, err.msg);
    cr_expect(strstr(v2, V3_MARK) == NULL, "%s: the default module has v3's loop", model);
    cr_expect(strstr(v3, V3_MARK) != NULL, "%s: no v3 loop under HPC_LN_BWD=v3", model);
    cr_expect_eq(strstr(v3, V3_SLOT1) != NULL, two_ahead, "%s: v3 %s two rows ahead", model,
                 two_ahead ? "does not keep" : "keeps");
    cr_expect(strcmp(v2, v3) != 0, "%s: the modules are the same", model);
    free(v2);
    free(v3);
    EnvSaved e = env_set("v3", NULL);
    expect_module_compiles(&p.g, model, "ln_residual_bwd_");
    env_restore(e);
    pipeline_free(&p);
}

Test(ln_bwd_v3, bert_tiny_fp16, .timeout = 300) { model_case("bert_tiny.model", PREC_FP16, NULL, true); }
Test(ln_bwd_v3, bert_tiny_bf16, .timeout = 300) { model_case("bert_tiny.model", PREC_BF16, NULL, true); }
Test(ln_bwd_v3, bert_tiny_fp16_s, .timeout = 300) { model_case("bert_tiny.model", PREC_FP16, "s", false); }
Test(ln_bwd_v3, bert_base_fp16, .timeout = 600) { model_case("bert_base.model", PREC_FP16, NULL, true); }
Test(ln_bwd_v3, bert_base_bf16, .timeout = 600) { model_case("bert_base.model", PREC_BF16, NULL, true); }

/* One fused site of R rows of D (tests/ln_site_graph.h, 16-bit `low`). */
static void site_graph(int64_t R, int64_t D, DType low, LnSite *f)
{
    LnSite u;
    ln_site_build(&u, R, D, low, 1e-12, 0.1f);
    HpcError err = {0};
    cr_assert_eq(ln_site_fuse(&u, f, NULL, &err), 2, "R=%lld D=%lld: the site did not fuse: %s", (long long)R,
                 (long long)D, err.msg);
    ln_site_free(&u);
}

Test(ln_bwd_v3, sites_compile, .timeout = 600)
{
    static const int64_t Ds[] = {128, 768, 1024, 2048};
    for (int d = 0; d < 4; d++) {
        LnSite f;
        site_graph(3, Ds[d], DT_F16, &f);
        char name[64], *src = NULL;
        HpcError err = {0};
        snprintf(name, sizeof name, "hpc_ln_bwd_v3_d%lld", (long long)Ds[d]);
        cr_assert_eq(source_under(&f.g, "v3", &src, &err), HPC_OK, "D=%lld: %s", (long long)Ds[d], err.msg);
        cr_expect(strstr(src, V3_SLOT1) != NULL, "D=%lld: no v3 loop two rows ahead", (long long)Ds[d]);
        free(src);
        EnvSaved e = env_set("v3", NULL);
        expect_module_compiles(&f.g, name, "ln_residual_bwd_");
        env_restore(e);
        ln_site_free(&f);
    }
}

Test(ln_bwd_v3, two_chunks_a_thread_is_v2)
{
    LnSite f;
    site_graph(4099, 4096, DT_BF16, &f);
    char *v2 = NULL, *v3 = NULL;
    HpcError err = {0};
    cr_assert_eq(source_under(&f.g, NULL, &v2, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(source_under(&f.g, "v3", &v3, &err), HPC_OK, "%s", err.msg);
    cr_expect(strcmp(v2, v3) == 0, "D = 4096: v3's module is not v2's");
    free(v2);
    free(v3);
    ln_site_free(&f);
}

Test(ln_bwd_v3, parameter_forms, .timeout = 120)
{
    Pipeline p;
    build("bert_tiny.model", PREC_FP16, NULL, &p);
    HpcError err = {0};
    char *src = NULL;
    cr_assert_eq(source_under(&p.g, "v3,4,264,1,1", &src, &err), HPC_OK, "v3,4,264,1,1: %s", err.msg);
    cr_expect(strstr(src, V3_MARK) != NULL && strstr(src, V3_SLOT1) == NULL, "AHEAD 1: not v3 with one slot");
    free(src);
    cr_assert_eq(source_under(&p.g, "v3,6,132", &src, &err), HPC_OK, "v3,6,132: %s", err.msg);
    cr_expect(strstr(src, "6 groups of 32 threads") != NULL && strstr(src, "at most 132 blocks") != NULL,
              "v3,6,132: not 6 groups and 132 blocks");
    free(src);
    static const char *const bad[] = {"v3x", "v4", "v3,4,264,1,3", "v2,4,264,1,1", "v3,4", "v3,0,264", "V3", "v3,4,264,"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        err = (HpcError){0};
        HpcStatus st = source_under(&p.g, bad[k], &src, &err);
        cr_expect_neq(st, HPC_OK, "HPC_LN_BWD=%s was taken", bad[k]);
        if (st == HPC_OK) {
            free(src);
            continue;
        }
        char want[64];
        snprintf(want, sizeof want, "HPC_LN_BWD=%s is not a variant", bad[k]);
        cr_expect(strstr(err.msg, want) != NULL && strstr(err.msg, "v3,GROUPS,MAXBLOCKS[,ROWS[,AHEAD]]") != NULL,
                  "HPC_LN_BWD=%s: the message does not name the value and the forms: %s", bad[k], err.msg);
    }
    pipeline_free(&p);
}

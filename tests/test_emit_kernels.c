/* tests/test_emit_kernels.c — every emitted kernel source compiles with
 * NVRTC for sm_80 and sm_90 (no GPU needed), for the shipped model shapes in
 * each dtype; names, hashes and config checks of the emitter. */
#include <criterion/criterion.h>
#include <glob.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emit_attention.h"
#include "emit_kernels.h"
#include "kernel_sources.h"
#include "program/spec.h"
#include "compiler/spec_load.h"

/* Shapes for the unit tests below, and one beside the shipped models
 * whose hidden size is no multiple of 8 (8-byte and 4-byte row vectors)
 * with a causal mask, compiled with them. */
typedef struct { const char *name; int64_t H, NH, F, V, P, T, off; bool causal, emb_ln; SpecActivation act; } Shape;
static const Shape shapes[] = {
    {"bert-base", 768, 12, 3072, 30522, 512, 2, 0, false, true, ACT_GELU},
    {"bert-large", 1024, 16, 4096, 30522, 512, 2, 0, false, true, ACT_GELU},
    {"odd", 100, 4, 300, 97, 40, 2, 0, true, true, ACT_GELU},
};
#define ODD_SHAPE 2

static KernelConfig shape_config(const Shape *s, KemitDtype dt)
{
    ModelSpec spec;
    spec_defaults(&spec);
    spec.stack.hidden = s->H;
    spec.stack.heads = s->NH;
    spec.stack.ffn = s->F;
    spec.stack.vocab_size = s->V;
    spec.stack.max_positions = s->P;
    spec.stack.type_vocab_size = s->T;
    spec.stack.position_offset = s->off;
    spec.stack.attention = s->causal ? ATTN_CAUSAL : ATTN_BIDIRECTIONAL;
    spec.stack.embedding_ln = s->emb_ln;
    spec.stack.activation = s->act;
    KernelConfig kc;
    kemit_config_from_spec(&kc, &spec, dt);
    return kc;
}

/* One compile job: a source for one arch, run on its own thread. */
typedef struct {
    const char *src;
    int arch;
    char what[160];
    size_t cubin_size;
    char *log;      /* NVRTC's log when the compile failed */
    int created;    /* nvrtcCreateProgram result */
} Job;

static void *compile_job(void *arg)
{
    Job *j = arg;
    nvrtcProgram prog;
    j->created = nvrtcCreateProgram(&prog, j->src, "hpc_kernels.cu", 0, NULL, NULL);
    if (j->created != NVRTC_SUCCESS) return NULL;
    char opt[64];
    snprintf(opt, sizeof opt, "--gpu-architecture=sm_%d", j->arch);
    const char *opts[] = {opt, "-std=c++17"};
    if (nvrtcCompileProgram(prog, 2, opts) != NVRTC_SUCCESS) {
        size_t n = 0;
        nvrtcGetProgramLogSize(prog, &n);
        j->log = malloc(n + 1);
        nvrtcGetProgramLog(prog, j->log);
    } else {
        nvrtcGetCUBINSize(prog, &j->cubin_size);
    }
    nvrtcDestroyProgram(&prog);
    return NULL;
}

static void check_names_present(const char *src)
{
    for (int i = 0; i < kemit_kernel_count; i++) {
        char macro[128];
        snprintf(macro, sizeof macro, "KN(%s)", kemit_kernel_bases[i]);
        /* The activation kernels come from one macro; the others appear literally. */
        if (strncmp(kemit_kernel_bases[i], "bias_", 5) != 0)
            cr_expect(strstr(src, macro) != NULL, "%s not defined in the source", macro);
    }
}

#define MAX_SOURCES 96

/* Compiling is the slow part of `make test` (about 2 s of CPU a source and
 * arch), so sources that must compile alike are compiled once:
 *   - constants the templates never read (the runtime's, and the names'
 *     suffix): the test templates_do_not_read_unused_constants keeps this
 *     list honest;
 *   - constants read only as a value (eps, position offset, head count):
 *     the checked config keeps them in range, and their value cannot decide
 *     whether the code compiles.
 * What changes the code (dtype, hidden size and row layout, softmax row
 * length, token types, causal, embedding LN) keeps sources apart. */
static const char *const unused_constants[] = {
    "HPC_SUFFIX", "HPC_FFN", "HPC_VOCAB", "HPC_LABELS", "HPC_HIDDEN_DROPOUT",
    "HPC_ATTN_DROPOUT", "HPC_ACTIVATION", "HPC_MAX_POSITIONS",
    /* value-only: */ "HPC_LN_EPS", "HPC_POS_OFFSET", "HPC_HEADS",
};
#define N_UNUSED ((int)(sizeof unused_constants / sizeof unused_constants[0]))
#define N_NEVER_READ 8   /* the first eight are never read by a template */

/* The source without the #define lines of unused_constants (malloc'd). */
static char *compile_key(const char *src)
{
    char *key = malloc(strlen(src) + 1), *o = key;
    for (const char *line = src; *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line + 1) : strlen(line);
        bool skip = false;
        for (int i = 0; i < N_UNUSED; i++) {
            char def[64];
            snprintf(def, sizeof def, "#define %s ", unused_constants[i]);
            if (strncmp(line, def, strlen(def)) == 0) skip = true;
        }
        if (!skip) {
            memcpy(o, line, len);
            o += len;
        }
        line += len;
    }
    *o = 0;
    return key;
}

typedef struct { char *src[MAX_SOURCES]; char *key[MAX_SOURCES]; char what[MAX_SOURCES][128]; int n; } Sources;

/* Adds the source of kc unless one that compiles the same is in. */
static void sources_add(Sources *s, const KernelConfig *kc, const char *name)
{
    char *src, suffix[KEMIT_SUFFIX_MAX];
    HpcError err = {0};
    cr_assert_eq(kemit_source(kc, &src, suffix, &err), HPC_OK, "%s: %s", name, err.msg);
    check_names_present(src);
    char *key = compile_key(src);
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->key[i], key) == 0) {
            free(src);
            free(key);
            return;
        }
    cr_assert(s->n < MAX_SOURCES);
    s->src[s->n] = src;
    s->key[s->n] = key;
    snprintf(s->what[s->n], sizeof s->what[0], "%s %s", name, kemit_dtype_name(kc->dtype));
    s->n++;
}

/* Every .model file in models/ (under $HPC_ROOT or the current directory). */
static int add_shipped_models(Sources *s)
{
    const char *root = getenv("HPC_ROOT");
    char pattern[1024];
    snprintf(pattern, sizeof pattern, "%s/models/*.model", root && *root ? root : ".");
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0) return 0;
    int n = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        ModelSpec spec;
        cr_assert_eq(spec_load(g.gl_pathv[i], &spec, stderr), 0, "cannot load %s", g.gl_pathv[i]);
        for (int dt = KEMIT_F32; dt <= KEMIT_BF16; dt++) {
            KernelConfig kc;
            kemit_config_from_spec(&kc, &spec, (KemitDtype)dt);
            sources_add(s, &kc, spec.name);
        }
        n++;
    }
    globfree(&g);
    return n;
}

Test(emit_kernels, shipped_models_and_shapes_compile_for_sm80_and_sm90, .timeout = 900)
{
    static Sources s;
    int models = add_shipped_models(&s);
    cr_expect(models > 0, "no models/*.model found (run from the repository root or set HPC_ROOT)");
    for (int dt = KEMIT_F32; dt <= KEMIT_F16; dt++) {   /* f16 and bf16 share the row layout */
        KernelConfig kc = shape_config(&shapes[ODD_SHAPE], (KemitDtype)dt);
        sources_add(&s, &kc, shapes[ODD_SHAPE].name);
    }
    /* HPC_NVRTC_QUICK=1 (local runs): the first source only, sm_90 only. */
    bool quick = getenv("HPC_NVRTC_QUICK") != NULL;
    for (int i = 0; i < (quick ? 1 : s.n); i++) {
        /* sm_80 and sm_90 side by side: NVRTC is thread-safe. */
        Job jobs[2] = {{.src = s.src[i], .arch = 80}, {.src = s.src[i], .arch = 90}};
        pthread_t th[2];
        int first = quick ? 1 : 0;
        for (int a = first; a < 2; a++) cr_assert_eq(pthread_create(&th[a], NULL, compile_job, &jobs[a]), 0);
        for (int a = first; a < 2; a++) pthread_join(th[a], NULL);
        for (int a = first; a < 2; a++) {
            cr_assert_eq(jobs[a].created, NVRTC_SUCCESS);
            cr_assert(jobs[a].log == NULL, "%s sm_%d: NVRTC failed:\n%s", s.what[i], jobs[a].arch,
                      jobs[a].log ? jobs[a].log : "");
            cr_expect(jobs[a].cubin_size > 1000, "%s sm_%d: cubin of %zu bytes", s.what[i], jobs[a].arch,
                      jobs[a].cubin_size);
        }
    }
    for (int i = 0; i < s.n; i++) {
        free(s.src[i]);
        free(s.key[i]);
    }
}

Test(emit_kernels, templates_do_not_read_unused_constants)
{
    for (int t = 0; t < kernel_source_count; t++)
        for (int i = 1; i < N_NEVER_READ; i++)   /* HPC_SUFFIX is read, through KN() */
            cr_expect(strstr(kernel_sources[t].text, unused_constants[i]) == NULL,
                      "%s reads %s: remove it from unused_constants in this test", kernel_sources[t].name,
                      unused_constants[i]);
}

Test(emit_kernels, names_carry_dtype_hidden_and_a_config_hash)
{
    KernelConfig a = shape_config(&shapes[0], KEMIT_F16);
    char *src, sa[KEMIT_SUFFIX_MAX], sb[KEMIT_SUFFIX_MAX], sc[KEMIT_SUFFIX_MAX];
    HpcError err = {0};
    cr_assert_eq(kemit_source(&a, &src, sa, &err), HPC_OK);
    free(src);
    char name[128];
    kemit_name(sa, "ln_fwd", name, sizeof name);
    cr_expect(strncmp(name, "ln_fwd_f16_h768_", 16) == 0 && strlen(name) == 22, "name %s", name);
    /* Same config: same name; another eps or dtype: another hash. */
    cr_assert_eq(kemit_source(&a, &src, sb, &err), HPC_OK);
    free(src);
    cr_expect_str_eq(sa, sb);
    KernelConfig b = a;
    b.ln_eps = 1e-5;
    cr_assert_eq(kemit_source(&b, &src, sc, &err), HPC_OK);
    free(src);
    cr_expect_str_neq(sa, sc);
    cr_expect(strncmp(sc, "_f16_h768_", 10) == 0);
    b = a;
    b.dtype = KEMIT_BF16;
    cr_assert_eq(kemit_source(&b, &src, sc, &err), HPC_OK);
    cr_expect(strstr(src, "#define HPC_DTYPE 2") != NULL);
    free(src);
    cr_expect(strncmp(sc, "_bf16_h768_", 11) == 0, "suffix %s", sc);
}

Test(emit_kernels, constants_are_baked_in)
{
    KernelConfig kc = shape_config(&shapes[1], KEMIT_F32);
    char *src, suffix[KEMIT_SUFFIX_MAX];
    HpcError err = {0};
    cr_assert_eq(kemit_source(&kc, &src, suffix, &err), HPC_OK);
    cr_expect(strstr(src, "#define HPC_HIDDEN 1024\n") != NULL);
    cr_expect(strstr(src, "#define HPC_HEADS 16\n") != NULL);
    cr_expect(strstr(src, "#define HPC_FFN 4096\n") != NULL);
    cr_expect(strstr(src, "#define HPC_LN_EPS 9.99999996e-13f\n") != NULL);
    cr_expect(strstr(src, "#include") == NULL, "the source must need no headers");
    free(src);
}

Test(emit_kernels, row_layout_covers_the_row)
{
    for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++)
        for (int dt = KEMIT_F32; dt <= KEMIT_BF16; dt++) {
            KernelConfig kc = shape_config(&shapes[s], (KemitDtype)dt);
            KemitRowLayout r = kemit_row_layout(&kc);
            cr_expect(kc.hidden % r.vec == 0);
            cr_expect(r.threads % 32 == 0 && r.threads <= 1024);
            cr_expect((int64_t)r.threads * r.npt * r.vec >= kc.hidden);
            cr_expect((int64_t)r.threads * (r.npt - 1) * r.vec < kc.hidden, "no idle chunk");
            cr_expect(r.vec * (dt == KEMIT_F32 ? 4 : 2) <= 16);
            cr_expect(r.rpb >= 1 && r.rpb <= 4 && r.threads * r.rpb <= 1024);
        }
    KernelConfig kc = shape_config(&shapes[0], KEMIT_F16);
    KemitRowLayout r = kemit_row_layout(&kc);
    cr_expect(r.vec == 8 && r.threads == 96 && r.npt == 1, "bert-base f16: %d %d %d", r.vec, r.threads, r.npt);
}

Test(emit_kernels, bad_configs_are_refused_with_a_reason)
{
    KernelConfig kc = shape_config(&shapes[0], KEMIT_F16);
    char *src, suffix[KEMIT_SUFFIX_MAX];
    HpcError err = {0};
    kc.max_positions = 4096;
    cr_expect_eq(kemit_source(&kc, &src, suffix, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "max_positions 4096") != NULL, "%s", err.msg);
    cr_expect(src == NULL);
    kc = shape_config(&shapes[0], KEMIT_F16);
    kc.heads = 7;
    cr_expect_eq(kemit_source(&kc, &src, suffix, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "heads 7") != NULL, "%s", err.msg);
}

Test(emit_kernels, every_template_file_is_used)
{
    KernelConfig kc = shape_config(&shapes[0], KEMIT_F16);
    char *src, suffix[KEMIT_SUFFIX_MAX];
    HpcError err = {0};
    cr_assert_eq(kemit_source(&kc, &src, suffix, &err), HPC_OK);
    char *attn;   /* the fused attention is emitted on its own (emit_attention.h) */
    cr_assert_eq(kemit_attention_source(&kc, &attn, suffix, &err), HPC_OK, "%s", err.msg);
    for (int i = 0; i < kernel_source_count; i++) {
        char mark[128];
        /* hpc's own GEMMs: appended to the step module where an f16 linear feeds a GELU
         * (tests/test_gemm_own.c), or run on their own (tests/gpu/gpu_gemm.c) */
        if (strcmp(kernel_sources[i].name, "gemm_wgmma.cu") == 0 || strcmp(kernel_sources[i].name, "gemm_wgmma_tma.cu") == 0 ||
            strcmp(kernel_sources[i].name, "gemm_wgmma_pp.cu") == 0)
            continue;
        snprintf(mark, sizeof mark, "// ---- %s ----", kernel_sources[i].name);
        cr_expect(strstr(src, mark) != NULL || strstr(attn, mark) != NULL,
                  "template %s is embedded but never emitted", kernel_sources[i].name);
    }
    free(src);
    free(attn);
}

/* tests/test_emit_optim.c — the optimizer and loss scaler as part of the
 * step module (compiler/emit_optim.h), without a GPU:
 *   - a training graph's module ends with exactly one optimizer block, for
 *     the graph's 16-bit copy dtype; a graph that trains nothing has none;
 *   - the block alone compiles with NVRTC for sm_80 and sm_90 in every
 *     dtype, small (no template bulk), its kernels in the cubin;
 *   - its structs and codes have the layouts of runtime/cuda/cuda_optim.h
 *     (NVRTC checks field order and sizes from the C side's offsetof and
 *     sizeof; a wrong size fails);
 *   - the kernel cache key of the step module changes with the block;
 *   - --emit-cuda's NAME_step.cuh and --emit-lib's package (with cubins
 *     for sm_90, also inside NAME.hpc) carry the kernels that run. */
#include <criterion/criterion.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compiler/emit_lib.h"
#include "compiler/emit_ops.h"
#include "compiler/emit_optim.h"
#include "compiler/pipeline.h"
#include "compiler/step_program_build.h"
#include "cuda/cuda_optim.h"
#include "cuda/kernel_cache.h"
#include "cuda/nvrtc_compile.h"
#include "compiler/spec_load.h"

static void tiny_spec(ModelSpec *s)
{
    cr_assert_eq(spec_load("models/bert_tiny.model", s, stderr), 0);
}

/* The module of bert_tiny's training graph under a policy (malloc'd). */
static char *tiny_module(SpecPrecision policy, Pipeline *keep)
{
    ModelSpec spec;
    tiny_spec(&spec);
    HpcError err = {0};
    PipeOptions o = pipeline_defaults(policy);
    Pipeline p;
    cr_assert_eq(pipeline_build(&spec, &o, &p, &err), HPC_OK, "%s", err.msg);
    char *src = NULL;
    cr_assert_eq(eop_module_source(&p.g, &src, &err), HPC_OK, "%s", err.msg);
    if (keep) *keep = p;
    else pipeline_free(&p);
    return src;
}

static int count_of(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what)) n++;
    return n;
}

/* Each kernel is defined once: `extern "C" ... NAME(` at a line start. */
static void expect_kernels_defined(const char *src, const char *where)
{
    for (int k = 0; k < eopt_kernel_count; k++) {
        char def[96];
        snprintf(def, sizeof def, "\n%s(", eopt_kernel_names[k]);
        cr_expect_eq(count_of(src, def), 1, "%s: kernel %s defined %d times", where, eopt_kernel_names[k],
                     count_of(src, def));
    }
}

Test(emit_optim, training_module_ends_with_one_optimizer_block)
{
    static const struct { SpecPrecision policy; const char *line; } cases[] = {
        {PREC_FP32, "#define OPT_LOW 0\n"},
        {PREC_FP16, "opt_low_from(float x) { return st_f16(x); }"},
        {PREC_BF16, "opt_low_from(float x) { return st_bf16(x); }"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *src = tiny_module(cases[i].policy, NULL);
        const char *pol = spec_precision_name(cases[i].policy);
        cr_expect_eq(count_of(src, "// ---- optimizer + loss scaler"), 1, "%s", pol);
        cr_expect_not_null(strstr(src, cases[i].line), "%s: no `%s`", pol, cases[i].line);
        expect_kernels_defined(src, pol);
        /* the block comes after every node kernel */
        const char *block = strstr(src, "// ---- optimizer + loss scaler");
        cr_expect_null(strstr(block, "(EopArgs a)"), "%s: a node kernel after the optimizer", pol);
        free(src);
    }
}

Test(emit_optim, untrained_graph_has_no_optimizer)
{
    Pipeline p;
    free(tiny_module(PREC_FP16, &p));
    cr_assert(eopt_wanted(&p.g));
    for (int q = 0; q < p.g.n_params; q++) p.g.param_grad[q] = -1;
    cr_expect(!eopt_wanted(&p.g));
    char *src = NULL;
    HpcError err = {0};
    cr_assert_eq(eop_module_source(&p.g, &src, &err), HPC_OK, "%s", err.msg);
    cr_expect_null(strstr(src, "opt_update"), "a graph without gradients got an optimizer");
    free(src);
    pipeline_free(&p);
}

static double cpu_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static bool bytes_contain(const void *data, size_t n, const char *s)
{
    return memmem(data, n, s, strlen(s)) != NULL;
}

/* The compile time is printed for the record (BENCHMARKS.md "Start-up");
 * the templates' optimizer module took 3.1-3.4 s cpu here. */
Test(emit_optim, block_alone_compiles_for_sm80_and_sm90, .timeout = 300)
{
    const DType lows[] = {DT_F32, DT_F16, DT_BF16};
    for (int d = 0; d < 3; d++) {
        char *src = NULL;
        HpcError err = {0};
        cr_assert_eq(eopt_module_source(lows[d], &src, &err), HPC_OK, "%s", err.msg);
        cr_expect_lt(strlen(src), 40000u, "optimizer module %zu bytes: template bulk?", strlen(src));
        cr_expect_null(strstr(src, "// ---- layernorm.cu"), "template text in the optimizer module");
        expect_kernels_defined(src, ir_dtype_name(lows[d]));
        for (int arch = 80; arch <= 90; arch += 10) {
            void *cubin = NULL;
            size_t n = 0;
            double t0 = cpu_seconds();
            HpcStatus st = nvrtc_compile(src, "hpc_optimizer", arch, NULL, 0, &cubin, &n, NULL, &err);
            cr_assert_eq(st, HPC_OK, "%s sm_%d: %s", ir_dtype_name(lows[d]), arch, err.msg);
            fprintf(stderr, "optimizer block (%s copy) sm_%d: %.2f s cpu, %zu-byte source, %zu-byte cubin\n",
                    ir_dtype_name(lows[d]), arch, cpu_seconds() - t0, strlen(src), n);
            for (int k = 0; k < eopt_kernel_count; k++)
                cr_expect(bytes_contain(cubin, n, eopt_kernel_names[k]), "cubin lacks %s", eopt_kernel_names[k]);
            free(cubin);
        }
        free(src);
    }
}

/* One field of a C struct: name, offset, size. */
typedef struct { const char *name; size_t off, size; } Field;
#define F(cs, f) {#f, offsetof(cs, f), sizeof(((cs *)0)->f)}

static int by_offset(const void *a, const void *b)
{
    const Field *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Checks for NVRTC that the CUDA struct `ks` has the C struct's fields:
 * the same names, in the same order (an aggregate initialised with 1, 2,
 * ... in the C side's offset order reads them back by name), each of the
 * C size, and the same total size; so every offset agrees.  size_shift
 * (the control) claims a wrong size for the first field. */
static void probe_struct(StrBuf *b, const char *ks, size_t total, Field *f, int n, int size_shift)
{
    qsort(f, (size_t)n, sizeof *f, by_offset);
    strbuf_printf(b, "constexpr %s probe_%s = {", ks, ks);
    for (int i = 0; i < n; i++) strbuf_printf(b, "%s%d", i ? ", " : "", i + 1);
    strbuf_add(b, "};\n");
    for (int i = 0; i < n; i++)
        strbuf_printf(b, "static_assert(probe_%s.%s == %d && sizeof(probe_%s.%s) == %zu, \"%s.%s\");\n", ks,
                      f[i].name, i + 1, ks, f[i].name, f[i].size + (i == 0 ? (size_t)size_shift : 0), ks,
                      f[i].name);
    strbuf_printf(b, "static_assert(sizeof(%s) == %zu, \"sizeof %s\");\n", ks, total, ks);
}

/* The optimizer block, then checks of its structs, codes and chunking as
 * runtime/cuda/cuda_optim.h and program/spec.h have them. */
static char *layout_probe(int size_shift)
{
    char *src = NULL;
    HpcError err = {0};
    cr_assert_eq(eopt_module_source(DT_F16, &src, &err), HPC_OK, "%s", err.msg);
    StrBuf b = {0};
    strbuf_add(&b, src);
    strbuf_add(&b, "\n// ---- layout probe (tests/test_emit_optim.c) ----\n");
    free(src);
    Field t[] = {F(CudaOptTensor, master), F(CudaOptTensor, grad), F(CudaOptTensor, m), F(CudaOptTensor, v),
                 F(CudaOptTensor, low), F(CudaOptTensor, n), F(CudaOptTensor, decay), F(CudaOptTensor, grad_dtype),
                 F(CudaOptTensor, src_dtype)};
    Field p[] = {F(CudaOptParams, kind), F(CudaOptParams, nesterov), F(CudaOptParams, sched_kind),
                 F(CudaOptParams, ls_mode), F(CudaOptParams, beta1), F(CudaOptParams, beta2), F(CudaOptParams, eps),
                 F(CudaOptParams, weight_decay), F(CudaOptParams, momentum), F(CudaOptParams, max_grad_norm),
                 F(CudaOptParams, lr), F(CudaOptParams, min_lr_ratio), F(CudaOptParams, warmup_steps),
                 F(CudaOptParams, total_steps), F(CudaOptParams, ls_growth), F(CudaOptParams, ls_backoff),
                 F(CudaOptParams, ls_interval)};
    Field st[] = {F(CudaOptState, scale), F(CudaOptState, growth_tracker), F(CudaOptState, found_inf),
                  F(CudaOptState, pad_), F(CudaOptState, step), F(CudaOptState, consecutive_skips),
                  F(CudaOptState, total_skips), F(CudaOptState, grad_norm), F(CudaOptState, clip_coef),
                  F(CudaOptState, lr)};
    Field c[] = {F(CudaOptChunk, tensor), F(CudaOptChunk, len), F(CudaOptChunk, begin)};
    Field fx[] = {F(CudaOptFix, raw), F(CudaOptFix, gamma), F(CudaOptFix, beta), F(CudaOptFix, db),
                  F(CudaOptFix, snap), F(CudaOptFix, cols), F(CudaOptFix, ld), F(CudaOptFix, db_ld),
                  F(CudaOptFix, db_low)};
    probe_struct(&b, "opt_tensor", sizeof(CudaOptTensor), t, (int)(sizeof t / sizeof t[0]), size_shift);
    probe_struct(&b, "opt_params", sizeof(CudaOptParams), p, (int)(sizeof p / sizeof p[0]), 0);
    probe_struct(&b, "opt_state", sizeof(CudaOptState), st, (int)(sizeof st / sizeof st[0]), 0);
    probe_struct(&b, "opt_chunk", sizeof(CudaOptChunk), c, (int)(sizeof c / sizeof c[0]), 0);
    probe_struct(&b, "opt_fix", sizeof(CudaOptFix), fx, (int)(sizeof fx / sizeof fx[0]), 0);
    strbuf_printf(&b, "static_assert(OPT_ADAMW == %d && OPT_ADAM == %d && OPT_SGD == %d && OPT_LAMB == %d, "
                  "\"optimizer codes\");\n", OPT_ADAMW, OPT_ADAM, OPT_SGD, OPT_LAMB);
    strbuf_printf(&b, "static_assert(SCHED_LINEAR == %d && SCHED_COSINE == %d && LS_DYNAMIC == %d, \"codes\");\n",
                  SCHED_LINEAR, SCHED_COSINE, LOSS_SCALE_DYNAMIC);
    strbuf_printf(&b, "static_assert(OPT_CHUNK == %d && OPT_CHECK_CHUNKS == %d, \"chunking\");\n",
                  CUDA_OPTIM_CHUNK, CUDA_OPTIM_CHECK_CHUNKS);
    return b.p;
}

static HpcStatus compile_probe(const char *src, HpcError *err)
{
    void *cubin = NULL;
    size_t n = 0;
    char *log = NULL;
    HpcStatus st = nvrtc_compile(src, "optim_layout_probe", 90, NULL, 0, &cubin, &n, &log, err);
    free(cubin);
    free(log);
    return st;
}

Test(emit_optim, device_structs_match_cuda_optim_h, .timeout = 300)
{
    char dir[] = "/tmp/hpc-optim-probe-XXXXXX";   /* a failed compile saves its files here */
    cr_assert_not_null(mkdtemp(dir));
    setenv("HPC_CACHE_DIR", dir, 1);
    char *good = layout_probe(0);
    HpcError err = {0};
    cr_expect_eq(compile_probe(good, &err), HPC_OK, "layouts disagree: %s", err.msg);
    char *bad = layout_probe(4);   /* the control: opt_tensor.master 4 bytes wider must fail */
    cr_expect_eq(compile_probe(bad, &err), HPC_ERR_CUDA, "a wrong layout passed");
    free(good);
    free(bad);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

/* The runtime compiles StepKernels.cuda_source through the cache: the
 * block is inside what is keyed, so another optimizer is another entry. */
Test(emit_optim, cache_key_changes_with_the_optimizer_block)
{
    char *f16 = tiny_module(PREC_FP16, NULL);
    KcacheKey a, b, c;
    kcache_key(&a, f16, NULL, 0, 90, 13000);
    char *block = strstr(f16, "// ---- optimizer + loss scaler");
    cr_assert_not_null(block);
    char *upd = strstr(block, "p = p - o.flr * d;");   /* the SGD update, one character changed */
    cr_assert_not_null(upd);
    upd[4] = '+';
    kcache_key(&b, f16, NULL, 0, 90, 13000);
    *block = '\0';   /* the module without its optimizer */
    kcache_key(&c, f16, NULL, 0, 90, 13000);
    cr_expect_neq(memcmp(&a, &b, sizeof a), 0, "an edit of the optimizer kept the key");
    cr_expect_neq(memcmp(&a, &c, sizeof a), 0, "the optimizer is not in the keyed source");
    free(f16);
}

/* The whole file, NUL-terminated (cubins hold NULs: *len is the size). */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *t = calloc(1, (size_t)n + 1);
    cr_assert_eq(fread(t, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    if (len) *len = (size_t)n;
    return t;
}

static void rm_rf(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

Test(emit_optim, emit_cuda_exports_the_optimizer_that_runs)
{
    char dir[] = "/tmp/hpc-optim-emit-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    ModelSpec spec;
    tiny_spec(&spec);
    HpcError err = {0};
    cr_assert_eq(emitlib_cuda(&spec, PREC_FP16, dir, &err), HPC_OK, "%s", err.msg);
    StepProgram p;
    cr_assert_eq(step_program_compile(&spec, PREC_FP16, true, &p, &err), HPC_OK, "%s", err.msg);
    char path[512];
    snprintf(path, sizeof path, "%s/bert_tiny_step.cuh", dir);
    char *step = slurp(path, NULL);
    cr_assert_not_null(step, "%s", path);
    cr_expect_not_null(strstr(step, p.kernels.cuda_source), "NAME_step.cuh is not the module hpc compiles");
    expect_kernels_defined(step, "bert_tiny_step.cuh");
    snprintf(path, sizeof path, "%s/bert_tiny_kernels.cuh", dir);
    char *tmpl = slurp(path, NULL);
    cr_assert_not_null(tmpl, "%s", path);
    cr_expect_null(strstr(tmpl, "opt_update"), "the templates' header still exports an optimizer");
    free(step);
    free(tmpl);
    step_program_free(&p);
    rm_rf(dir);
}

static HpcStatus nvrtc_cb(const char *src, const char *name, int arch, void **cubin, size_t *n, HpcError *err)
{
    return nvrtc_compile(src, name, arch, NULL, 0, cubin, n, NULL, err);
}

Test(emit_optim, emit_lib_package_carries_the_step_cubin, .timeout = 600)
{
    char dir[] = "/tmp/hpc-optim-pkg-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    ModelSpec spec;
    tiny_spec(&spec);
    HpcError err = {0};
    EmitLibOptions o = {.policy = PREC_BF16, .archs = {90}, .n_archs = 1, .compile = nvrtc_cb};
    cr_assert_eq(emitlib_package(&spec, &o, dir, &err), HPC_OK, "%s", err.msg);
    char path[512];
    size_t n = 0;
    snprintf(path, sizeof path, "%s/bert_tiny_step.sm_90.cubin", dir);
    char *cubin = slurp(path, &n);
    cr_assert_not_null(cubin, "%s", path);
    cr_expect(n > 1000 && memcmp(cubin, "\x7f" "ELF", 4) == 0, "%s is no cubin", path);
    for (int k = 0; k < eopt_kernel_count; k++)
        cr_expect(bytes_contain(cubin, n, eopt_kernel_names[k]), "step cubin lacks %s", eopt_kernel_names[k]);
    StepProgram p;
    snprintf(path, sizeof path, "%s/bert_tiny.hpc", dir);
    cr_assert_eq(step_program_read_file(path, &p, &err), HPC_OK, "%s", err.msg);
    const StepCubin *c = step_kernels_cubin(&p.kernels, 90);
    cr_assert_not_null(c, "NAME.hpc carries no sm_90 cubin");
    cr_expect(c->size == n && memcmp(c->data, cubin, n) == 0, "NAME.hpc's cubin is not NAME_step.sm_90.cubin");
    free(cubin);
    step_program_free(&p);
    rm_rf(dir);
}

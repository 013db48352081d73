/* tests/gpu/gpu_kernels.c — every emitted CUDA kernel against the cpu
 * reference (runtime/cpu/cpu_kernels.h in f64, runtime/train/optim.h, lossscale.h,
 * schedule.h, philox.c) on fresh random inputs, in f32, f16 and bf16, then
 * timings at BERT-base sizes (B=32, L=128, H=768) with achieved bandwidth.
 *
 * Inputs are rounded to the storage dtype on the host first, so kernel and
 * reference see the same values; outputs are poisoned with NaN (0xFF bytes
 * are NaN in f32, f16 and bf16) before each launch, and a NaN never passes.
 * Error = ||got - ref||_2 / ||ref||_2 per output; limits: f32 outputs 1e-5,
 * f16 outputs 4e-3, bf16 outputs 2e-2 (a few units of the dtype's rounding,
 * 2^-11 and 2^-8), f32 outputs of low-precision kernels (mean, rstd, loss,
 * parameter gradients, optimizer state) 1e-5.  Exit status 1 on any failure.
 *
 * Seed: fresh each run (printed); HPC_TEST_SEED=N repeats one.  Set
 * HPC_GPU_TEST_NO_TIMING=1 to skip the timings, HPC_GPU_TEST_TUNE=1 to add
 * the row-layout variants of ln_bwd/emb_bwd (how the defaults were chosen).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_kernels.h"
#include "cuda/cuda_driver.h"
#include "cuda/gemm_cublas.h"
#include "cuda/gemm_tune.h"
#include "emit_kernels.h"
#include "emit_optim.h"
#include "cpu/half.h"
#include "train/lossscale.h"
#include "cuda/cuda_optim.h"
#include "cuda/nvrtc_compile.h"
#include "train/optim.h"
#include "cpu/philox.h"
#include "train/schedule.h"

/* ---- the harness --------------------------------------------------------- */

static const CudaDriver *cu;
static CudaDevice dev;
static int failures, checks;

static void die(const char *what, const HpcError *err)
{
    fprintf(stderr, "gpu_kernels: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

#define DRV(call)                                                  \
    do {                                                           \
        HpcError e_;                                               \
        if (CUDA_CHECK(&e_, call)) die(#call, &e_);                \
    } while (0)

static uint64_t rng_state;
static uint64_t rnd64(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rnd_uniform(void) { return (double)(rnd64() >> 11) * (1.0 / 9007199254740992.0); }
static float rnd_sym(float a) { return (float)((rnd_uniform() * 2 - 1) * a); }

typedef struct {
    KernelConfig kc;
    CUmodule mod;
    CUmodule opt_mod;         /* the step module's optimizer block alone (compiler/emit_optim.h) */
    char suffix[KEMIT_SUFFIX_MAX];
    int es;                   /* bytes per st_t */
    const char *label;        /* "f16", "f16 causal" */
} Mod;

static Mod mod_build(KernelConfig kc, const char *label)
{
    Mod m = { .kc = kc, .es = kc.dtype == KEMIT_F32 ? 4 : 2, .label = label };
    char *src;
    HpcError err;
    if (kemit_source(&kc, &src, m.suffix, &err)) die("kemit_source", &err);
    void *cubin;
    size_t size;
    if (nvrtc_compile(src, "gpu_kernels", dev.arch, NULL, 0, &cubin, &size, NULL, &err))
        die("nvrtc_compile", &err);
    free(src);
    DRV(cu->cuModuleLoadData(&m.mod, cubin));
    free(cubin);
    return m;
}

/* The optimizer block the step module ends with, for m's 16-bit copy dtype,
 * compiled alone (compiler/emit_optim.h): the kernels the trainer runs. */
static void opt_mod_build(Mod *m)
{
    DType low = m->kc.dtype == KEMIT_F16 ? DT_F16 : m->kc.dtype == KEMIT_BF16 ? DT_BF16 : DT_F32;
    char *src;
    void *cubin;
    size_t size;
    HpcError err;
    if (eopt_module_source(low, &src, &err)) die("eopt_module_source", &err);
    if (nvrtc_compile(src, "gpu_optimizer", dev.arch, NULL, 0, &cubin, &size, NULL, &err))
        die("nvrtc_compile (optimizer)", &err);
    free(src);
    DRV(cu->cuModuleLoadData(&m->opt_mod, cubin));
    free(cubin);
}

static CUfunction fn(const Mod *m, const char *base)
{
    char name[128];
    kemit_name(m->suffix, base, name, sizeof name);
    CUfunction f;
    DRV(cu->cuModuleGetFunction(&f, m->mod, name));
    return f;
}

static void launch(const Mod *m, const char *base, unsigned gx, unsigned gy, unsigned bx, unsigned by,
                   void **args)
{
    unsigned grid[3] = {gx, gy, 1}, block[3] = {bx, by, 1};
    HpcError err;
    if (cuda_launch(fn(m, base), grid, block, 0, dev.stream, args, &err)) die(base, &err);
}

static void sync(void) { DRV(cu->cuStreamSynchronize(dev.stream)); }

static CUdeviceptr dalloc(size_t bytes)
{
    CUdeviceptr p;
    DRV(cu->cuMemAlloc(&p, bytes ? bytes : 4));
    return p;
}

/* Memsets go on the kernels' stream: a plain cuMemsetD8 runs on the legacy
 * stream, which does not order against dev.stream (non-blocking), and under
 * load it landed after a kernel had written the buffer (H200, 2026-12-01:
 * the mask-bits softmax and AdamW v checks failed only when other GPU
 * programs ran beside this one). */
static void poison(CUdeviceptr p, size_t bytes) { DRV(cu->cuMemsetD8Async(p, 0xFF, bytes, dev.stream)); }

static SpecPrecision prec_of(KemitDtype dt) { return dt == KEMIT_BF16 ? PREC_BF16 : PREC_FP16; }

/* Rounds x to the module's storage dtype in place. */
static void round_st(const Mod *m, float *x, size_t n)
{
    if (m->kc.dtype != KEMIT_F32) prec_round_array(prec_of(m->kc.dtype), x, (int64_t)n);
}

/* Random (n) f32 host array in [-a, a], already rounded to st_t. */
static float *rand_st(const Mod *m, size_t n, float a)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = rnd_sym(a);
    round_st(m, x, n);
    return x;
}

static CUdeviceptr up_st(const Mod *m, const float *x, size_t n)
{
    CUdeviceptr p = dalloc(n * m->es);
    if (m->kc.dtype == KEMIT_F32) {
        DRV(cu->cuMemcpyHtoD(p, x, n * 4));
        DRV(cu->cuCtxSynchronize());   /* a pageable upload may still be in DMA when it returns */
        return p;
    }
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = prec_from_f32(prec_of(m->kc.dtype), x[i]);
    DRV(cu->cuMemcpyHtoD(p, h, n * 2));
    DRV(cu->cuCtxSynchronize());
    free(h);
    return p;
}

static CUdeviceptr up_raw(const void *x, size_t bytes)
{
    CUdeviceptr p = dalloc(bytes);
    DRV(cu->cuMemcpyHtoD(p, x, bytes));
    return p;
}

static float *down_st(const Mod *m, CUdeviceptr p, size_t n)
{
    float *x = malloc(n * sizeof *x);
    if (m->kc.dtype == KEMIT_F32) {
        DRV(cu->cuMemcpyDtoH(x, p, n * 4));
        return x;
    }
    uint16_t *h = malloc(n * 2);
    DRV(cu->cuMemcpyDtoH(h, p, n * 2));
    for (size_t i = 0; i < n; i++) x[i] = prec_to_f32(prec_of(m->kc.dtype), h[i]);
    free(h);
    return x;
}

static float *down_f32(CUdeviceptr p, size_t n)
{
    float *x = malloc(n * sizeof *x);
    DRV(cu->cuMemcpyDtoH(x, p, n * 4));
    return x;
}

static double *to_f64(const float *x, size_t n)
{
    double *d = malloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static double *zeros64(size_t n) { return calloc(n ? n : 1, sizeof(double)); }

static double tol_st(const Mod *m)
{
    return m->kc.dtype == KEMIT_F32 ? 1e-5 : m->kc.dtype == KEMIT_F16 ? 4e-3 : 2e-2;
}

/* Norm-wise relative error of got against ref; NaN/inf in got fails. */
static void check(const Mod *m, const char *what, const float *got, const double *ref, size_t n, double tol)
{
    double num = 0, den = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) && isfinite(ref[i])) bad++;
        double d = got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    bool ok = bad == 0 && rel <= tol && isfinite(rel);
    checks++;
    if (!ok) failures++;
    printf("%s  %-12s %-34s rel %.2e (limit %.0e)%s\n", ok ? "ok  " : "FAIL", m->label, what, rel, tol,
           bad ? " NON-FINITE OUTPUT" : "");
}

/* ---- philox and dropout -------------------------------------------------- */

static void test_philox(const Mod *m)
{
    long long n = 1 << 20;
    uint64_t base = 0xFFFFFFFFull - 1000, seed = rnd64();
    uint32_t step = (uint32_t)rnd64(), salt = (uint32_t)rnd64();
    CUdeviceptr out = dalloc((size_t)n * 16);
    poison(out, (size_t)n * 16);
    void *args[] = {&out, &base, &n, &seed, &step, &salt};
    launch(m, "philox_test", (unsigned)((n + 255) / 256), 1, 256, 1, args);
    sync();
    uint32_t *got = malloc((size_t)n * 16);
    DRV(cu->cuMemcpyDtoH(got, out, (size_t)n * 16));
    long long wrong = 0;
    PhiloxKey key = {{(uint32_t)seed, (uint32_t)(seed >> 32)}};
    for (long long i = 0; i < n; i++) {
        uint64_t idx = base + (uint64_t)i;
        Philox4x32 c = {{(uint32_t)idx, (uint32_t)(idx >> 32), step, salt}};
        Philox4x32 r = philox4x32_10(c, key);
        for (int k = 0; k < 4; k++) wrong += got[4 * i + k] != r.x[k];
    }
    checks++;
    if (wrong) failures++;
    printf("%s  %-12s %-34s %lld of %lld words differ from runtime/cpu/philox.c\n", wrong ? "FAIL" : "ok  ",
           m->label, "philox4x32_10 bitwise", wrong, 4 * n);
    free(got);
    cu->cuMemFree(out);
}

/* Elements that one side keeps and the other drops (x is never 0). */
static long long mask_mismatches(const float *got, const double *ref, const float *x, long long n)
{
    long long bad = 0;
    for (long long i = 0; i < n; i++) bad += x[i] != 0.0f && ((got[i] == 0.0f) != (ref[i] == 0.0));
    return bad;
}

/* dropout_fwd / dropout_bwd against the cpu kernels: values within the
 * dtype's tolerance and the keep mask identical element for element, at
 * an aligned base (16-byte accesses) and one element off it (scalar path),
 * n odd so the last group of 8 is partial. */
static void test_dropout_at(const Mod *m, long long off)
{
    long long n = 100003;
    float p = 0.1f;
    uint64_t seed = rnd64();
    uint32_t step = 7, salt = 3;
    float *x = rand_st(m, n, 2), *pre = rand_st(m, n, 1);
    CUdeviceptr bx = dalloc((n + 8) * m->es), by = dalloc((n + 8) * m->es), bacc = dalloc((n + 8) * m->es);
    CUdeviceptr dx = bx + off * m->es, dy = by + off * m->es, dacc = bacc + off * m->es;
    CUdeviceptr tx = up_st(m, x, n), tacc = up_st(m, pre, n);
    DRV(cu->cuMemcpyDtoD(dx, tx, n * m->es));
    DRV(cu->cuMemcpyDtoD(dacc, tacc, n * m->es));
    poison(dy, n * m->es);
    void *a1[] = {&dy, &dx, &n, &p, &seed, &step, &salt};
    launch(m, "dropout_fwd", 256, 1, 256, 1, a1);
    int acc = 1;
    void *a2[] = {&dacc, &dx, &n, &p, &seed, &step, &salt, &acc};
    launch(m, "dropout_bwd", 256, 1, 256, 1, a2);
    sync();
    double *xd = to_f64(x, n), *ref = zeros64(n), *refb = to_f64(pre, n);
    ck_dropout_fwd_f64(ref, xd, n, p, seed, step, salt);
    ck_dropout_bwd_f64(refb, xd, n, p, seed, step, salt);
    float *got = down_st(m, dy, n), *gotb = down_st(m, dacc, n);
    char what[64];
    snprintf(what, sizeof what, "dropout_fwd y (offset %lld)", off);
    check(m, what, got, ref, n, tol_st(m));
    snprintf(what, sizeof what, "dropout_bwd dx acc (offset %lld)", off);
    check(m, what, gotb, refb, n, tol_st(m));
    long long wrong = mask_mismatches(got, ref, x, n);
    checks++;
    if (wrong) failures++;
    printf("%s  %-12s %-34s %lld of %lld keep decisions differ from the cpu\n", wrong ? "FAIL" : "ok  ", m->label,
           "dropout mask (8 per Philox draw)", wrong, n);
    free(x); free(pre); free(xd); free(ref); free(refb); free(got); free(gotb);
    cu->cuMemFree(bx); cu->cuMemFree(by); cu->cuMemFree(bacc); cu->cuMemFree(tx); cu->cuMemFree(tacc);
}

static void test_dropout(const Mod *m)
{
    test_dropout_at(m, 0);
    test_dropout_at(m, 1);
}

/* ---- LayerNorm ----------------------------------------------------------- */

static void test_layernorm(const Mod *m)
{
    int R = 300, H = (int)m->kc.hidden;
    size_t n = (size_t)R * H;
    float p = 0.1f;
    uint64_t seed = rnd64();
    uint32_t step = 2, salt = 11;
    float *x = rand_st(m, n, 2), *res = rand_st(m, n, 2), *bias = rand_st(m, H, 0.5f);
    float *gamma = malloc(H * 4), *beta = rand_st(m, H, 0.5f);
    for (int i = 0; i < H; i++) gamma[i] = 1 + rnd_sym(0.5f);
    round_st(m, gamma, H);
    CUdeviceptr dx_ = up_st(m, x, n), dres = up_st(m, res, n), dbias = up_st(m, bias, H),
                dg = up_st(m, gamma, H), db = up_st(m, beta, H);
    CUdeviceptr y = dalloc(n * m->es), z = dalloc(n * m->es), mean = dalloc(R * 4), rstd = dalloc(R * 4);
    poison(y, n * m->es); poison(z, n * m->es); poison(mean, R * 4); poison(rstd, R * 4);
    void *a[] = {&y, &z, &mean, &rstd, &dx_, &dbias, &dres, &dg, &db, &R, &p, &seed, &step, &salt};
    launch(m, "ln_fwd", R, 1, kemit_row_layout(&m->kc).threads, 1, a);
    sync();

    /* Reference: z = res + dropout(x + bias), LN in f64. */
    double *zr = zeros64(n), *xb = to_f64(x, n), *bd = to_f64(bias, H);
    ck_bias_add_f64(xb, bd, R, H);
    ck_dropout_fwd_f64(zr, xb, n, p, seed, step, salt);
    double *rd = to_f64(res, n);
    ck_axpy_f64(zr, 1.0, rd, n);
    double *yr = zeros64(n), *mr = zeros64(R), *sr = zeros64(R), *gd = to_f64(gamma, H), *bed = to_f64(beta, H);
    ck_layernorm_fwd_f64(yr, mr, sr, zr, gd, bed, R, H, m->kc.ln_eps);
    float *gy = down_st(m, y, n), *gz = down_st(m, z, n), *gm = down_f32(mean, R), *gs = down_f32(rstd, R);
    check(m, "ln_fwd y", gy, yr, n, tol_st(m));
    check(m, "ln_fwd z_out", gz, zr, n, tol_st(m));
    check(m, "ln_fwd mean", gm, mr, R, 1e-5);
    check(m, "ln_fwd rstd", gs, sr, R, 1e-5);

    /* Backward from the stored z and the saved statistics. */
    float *dyv = rand_st(m, n, 1), *dres_pre = rand_st(m, n, 1);
    float *pg = malloc(H * 4), *pb = malloc(H * 4), *pbias = malloc(H * 4);
    for (int i = 0; i < H; i++) pg[i] = rnd_sym(1), pb[i] = rnd_sym(1), pbias[i] = rnd_sym(1);
    CUdeviceptr ddy = up_st(m, dyv, n), ddres = up_st(m, dres_pre, n), ddx = dalloc(n * m->es);
    CUdeviceptr dgam = up_raw(pg, H * 4), dbet = up_raw(pb, H * 4), dbia = up_raw(pbias, H * 4);
    int parts = 64, acc = 1;
    CUdeviceptr partials = dalloc((size_t)parts * 3 * H * 4);
    poison(ddx, n * m->es); poison(partials, (size_t)parts * 3 * H * 4);
    void *b[] = {&ddx, &ddres, &partials, &ddy, &z, &mean, &rstd, &dg, &R, &p, &seed, &step, &salt, &acc};
    KemitRowLayout rl = kemit_row_layout(&m->kc);
    launch(m, "ln_bwd", parts, 1, rl.threads, rl.rpb, b);
    void *c[] = {&dgam, &dbet, &dbia, &partials, &parts};
    launch(m, "ln_grad_reduce", (H + 255) / 256, 1, 256, 1, c);
    sync();
    double *zin = to_f64(gz, n), *mean_in = to_f64(gm, R), *rstd_in = to_f64(gs, R), *dyd = to_f64(dyv, n);
    double *dz = zeros64(n), *dgr = to_f64(pg, H), *dbr = to_f64(pb, H);
    ck_layernorm_bwd_f64(dz, dgr, dbr, dyd, zin, mean_in, rstd_in, gd, R, H);
    double *dresr = to_f64(dres_pre, n), *dxr = zeros64(n), *dbiasr = to_f64(pbias, H);
    ck_axpy_f64(dresr, 1.0, dz, n);
    ck_dropout_bwd_f64(dxr, dz, n, p, seed, step, salt);
    ck_bias_grad_f64(dbiasr, dxr, R, H);
    float *g1 = down_st(m, ddx, n), *g2 = down_st(m, ddres, n), *g3 = down_f32(dgam, H),
          *g4 = down_f32(dbet, H), *g5 = down_f32(dbia, H);
    check(m, "ln_bwd dx", g1, dxr, n, tol_st(m));
    check(m, "ln_bwd dresid (accumulate)", g2, dresr, n, tol_st(m));
    check(m, "ln_bwd+reduce dgamma", g3, dgr, H, 1e-5);
    check(m, "ln_bwd+reduce dbeta", g4, dbr, H, 1e-5);
    check(m, "ln_bwd+reduce dbias", g5, dbiasr, H, 1e-5);
    free(x); free(res); free(bias); free(gamma); free(beta); free(zr); free(xb); free(bd); free(rd);
    free(yr); free(mr); free(sr); free(gd); free(bed); free(gy); free(gz); free(gm); free(gs);
    free(dyv); free(dres_pre); free(pg); free(pb); free(pbias); free(zin); free(mean_in); free(rstd_in);
    free(dyd); free(dz); free(dgr); free(dbr); free(dresr); free(dxr); free(dbiasr);
    free(g1); free(g2); free(g3); free(g4); free(g5);
    CUdeviceptr all[] = {dx_, dres, dbias, dg, db, y, z, mean, rstd, ddy, ddres, ddx, dgam, dbet, dbia, partials};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu->cuMemFree(all[i]);
}

/* ---- embeddings ---------------------------------------------------------- */

static void test_embedding(const Mod *m)
{
    int B = 4, L = 64, H = (int)m->kc.hidden, V = 1000, P = (int)m->kc.max_positions, T = 2;
    int R = B * L, off = (int)m->kc.position_offset;
    size_t n = (size_t)R * H;
    float p = 0.1f;
    uint64_t seed = rnd64();
    uint32_t step = 5, salt = 1;
    int32_t *ids = malloc(R * 4), *tt = malloc(R * 4), *pids = malloc(R * 4);
    for (int i = 0; i < R; i++) {
        ids[i] = (int32_t)(rnd64() % 50);  /* few distinct ids: repeated rows in the scatter */
        tt[i] = (int32_t)(rnd64() % T);
        pids[i] = i % L + off;
    }
    float *word = rand_st(m, (size_t)V * H, 1), *pos = rand_st(m, (size_t)P * H, 1),
          *type = rand_st(m, (size_t)T * H, 1), *gamma = malloc(H * 4), *beta = rand_st(m, H, 0.5f);
    for (int i = 0; i < H; i++) gamma[i] = 1 + rnd_sym(0.5f);
    round_st(m, gamma, H);
    CUdeviceptr dids = up_raw(ids, R * 4), dtt = up_raw(tt, R * 4), dword = up_st(m, word, (size_t)V * H),
                dpos = up_st(m, pos, (size_t)P * H), dtype = up_st(m, type, (size_t)T * H),
                dg = up_st(m, gamma, H), db = up_st(m, beta, H);
    CUdeviceptr out = dalloc(n * m->es), mean = dalloc(R * 4), rstd = dalloc(R * 4);
    poison(out, n * m->es); poison(mean, R * 4); poison(rstd, R * 4);
    void *a[] = {&out, &mean, &rstd, &dids, &dtt, &dword, &dpos, &dtype, &dg, &db, &B, &L, &p, &seed, &step, &salt};
    int threads = kemit_row_layout(&m->kc).threads;
    launch(m, "emb_fwd", R, 1, threads, 1, a);
    sync();

    double *wd = to_f64(word, (size_t)V * H), *pd = to_f64(pos, (size_t)P * H), *td = to_f64(type, (size_t)T * H);
    double *x = zeros64(n), *tmp = zeros64(n);
    HpcError err;
    if (ck_embedding_fwd_f64(x, wd, ids, R, V, H, &err)) die("ck_embedding_fwd", &err);
    if (ck_embedding_fwd_f64(tmp, pd, pids, R, P, H, &err)) die("ck_embedding_fwd", &err);
    ck_axpy_f64(x, 1.0, tmp, n);
    if (ck_embedding_fwd_f64(tmp, td, tt, R, T, H, &err)) die("ck_embedding_fwd", &err);
    ck_axpy_f64(x, 1.0, tmp, n);
    double *ln = zeros64(n), *mr = zeros64(R), *sr = zeros64(R), *gd = to_f64(gamma, H), *bd = to_f64(beta, H);
    if (m->kc.embedding_ln) ck_layernorm_fwd_f64(ln, mr, sr, x, gd, bd, R, H, m->kc.ln_eps);
    else memcpy(ln, x, n * sizeof *ln);
    double *yr = zeros64(n);
    ck_dropout_fwd_f64(yr, ln, n, p, seed, step, salt);
    float *gy = down_st(m, out, n), *gm = down_f32(mean, R), *gs = down_f32(rstd, R);
    check(m, "emb_fwd out", gy, yr, n, tol_st(m));
    if (m->kc.embedding_ln) {
        check(m, "emb_fwd mean", gm, mr, R, 1e-5);
        check(m, "emb_fwd rstd", gs, sr, R, 1e-5);
    }

    /* Backward: table gradients accumulate onto random prefills. */
    float *dout = rand_st(m, n, 1);
    size_t nw = (size_t)V * H, np = (size_t)P * H, nt = (size_t)T * H;
    float *pw = malloc(nw * 4), *pp = malloc(np * 4), *pt = malloc(nt * 4), *pg = malloc(H * 4), *pb = malloc(H * 4);
    for (size_t i = 0; i < nw; i++) pw[i] = rnd_sym(1);
    for (size_t i = 0; i < np; i++) pp[i] = rnd_sym(1);
    for (size_t i = 0; i < nt; i++) pt[i] = rnd_sym(1);
    for (int i = 0; i < H; i++) pg[i] = rnd_sym(1), pb[i] = rnd_sym(1);
    CUdeviceptr ddout = up_st(m, dout, n), gw = up_raw(pw, nw * 4), gp = up_raw(pp, np * 4), gt = up_raw(pt, nt * 4),
                ggam = up_raw(pg, H * 4), gbet = up_raw(pb, H * 4);
    int parts = 48, tcols = T * H;
    CUdeviceptr partials = dalloc((size_t)parts * 3 * H * 4), tpart = dalloc((size_t)parts * T * H * 4);
    poison(partials, (size_t)parts * 3 * H * 4);
    poison(tpart, (size_t)parts * T * H * 4);
    void *b[] = {&gw, &gp, &gt, &partials, &tpart, &ddout, &dids, &dtt, &dword, &dpos, &dtype, &mean, &rstd,
                 &dg, &B, &L, &p, &seed, &step, &salt};
    launch(m, "emb_bwd", parts, 1, threads, kemit_row_layout(&m->kc).rpb, b);
    CUdeviceptr null = 0;
    void *c[] = {&ggam, &gbet, &null, &partials, &parts};
    if (m->kc.embedding_ln) launch(m, "ln_grad_reduce", (H + 255) / 256, 1, 256, 1, c);
    void *c2[] = {&gt, &tpart, &parts, &tcols};   /* type_vocab 2: dtype from the partials */
    launch(m, "colsum_finish", (tcols + 255) / 256, 1, 256, 1, c2);
    sync();
    double *doutd = to_f64(dout, n), *dn = zeros64(n), *dx = zeros64(n);
    ck_dropout_bwd_f64(dn, doutd, n, p, seed, step, salt);
    double *dgr = to_f64(pg, H), *dbr = to_f64(pb, H);
    double *mean_in = to_f64(gm, R), *rstd_in = to_f64(gs, R);
    if (m->kc.embedding_ln) ck_layernorm_bwd_f64(dx, dgr, dbr, dn, x, mean_in, rstd_in, gd, R, H);
    else memcpy(dx, dn, n * sizeof *dx);
    double *rw = to_f64(pw, nw), *rp = to_f64(pp, np), *rt = to_f64(pt, nt);
    if (ck_embedding_bwd_f64(rw, dx, ids, R, V, H, &err) || ck_embedding_bwd_f64(rp, dx, pids, R, P, H, &err) ||
        ck_embedding_bwd_f64(rt, dx, tt, R, T, H, &err))
        die("ck_embedding_bwd", &err);
    float *g1 = down_f32(gw, nw), *g2 = down_f32(gp, np), *g3 = down_f32(gt, nt);
    check(m, "emb_bwd dword (atomics)", g1, rw, nw, 1e-5);
    check(m, "emb_bwd dpos", g2, rp, np, 1e-5);
    check(m, "emb_bwd dtype", g3, rt, nt, 1e-5);
    if (m->kc.embedding_ln) {
        float *g4 = down_f32(ggam, H), *g5 = down_f32(gbet, H);
        check(m, "emb_bwd+reduce dgamma", g4, dgr, H, 1e-5);
        check(m, "emb_bwd+reduce dbeta", g5, dbr, H, 1e-5);
        free(g4); free(g5);
    }
    free(ids); free(tt); free(pids); free(word); free(pos); free(type); free(gamma); free(beta);
    free(wd); free(pd); free(td); free(x); free(tmp); free(ln); free(mr); free(sr); free(gd); free(bd);
    free(yr); free(gy); free(gm); free(gs); free(dout); free(pw); free(pp); free(pt); free(pg); free(pb);
    free(doutd); free(dn); free(dx); free(dgr); free(dbr); free(mean_in); free(rstd_in); free(rw); free(rp);
    free(rt); free(g1); free(g2); free(g3);
    CUdeviceptr all[] = {dids, dtt, dword, dpos, dtype, dg, db, out, mean, rstd, ddout, gw, gp, gt, ggam, gbet,
                         partials, tpart};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu->cuMemFree(all[i]);
}

/* ---- bias + activation and column sums ------------------------------------ */

typedef void (*ActFwd)(double *, const double *, int64_t);
typedef void (*ActBwd)(double *, const double *, const double *, int64_t);

static void test_act_one(const Mod *m, const char *name, ActFwd fwd, ActBwd bwd, bool bwd_takes_output,
                         int rows, int cols)
{
    size_t n = (size_t)rows * cols;
    float *x = rand_st(m, n, 3), *bias = rand_st(m, cols, 1), *dy = rand_st(m, n, 1);
    CUdeviceptr dx_ = up_st(m, x, n), db = up_st(m, bias, cols), ddy = up_st(m, dy, n);
    CUdeviceptr y = dalloc(n * m->es), dx = dalloc(n * m->es);
    poison(y, n * m->es); poison(dx, n * m->es);
    char kf[64], kb[64], what[80];
    snprintf(kf, sizeof kf, "bias_%s_fwd", name);
    snprintf(kb, sizeof kb, "bias_%s_bwd", name);
    void *a[] = {&y, &dx_, &db, &rows, &cols};
    launch(m, kf, 120, 1, 256, 1, a);
    void *b[] = {&dx, &ddy, &dx_, &db, &rows, &cols};
    launch(m, kb, 120, 1, 256, 1, b);
    sync();
    double *xb = to_f64(x, n), *bd = to_f64(bias, cols), *yr = zeros64(n), *dxr = zeros64(n), *dyd = to_f64(dy, n);
    ck_bias_add_f64(xb, bd, rows, cols);
    fwd(yr, xb, n);
    bwd(dxr, dyd, bwd_takes_output ? yr : xb, n);
    float *gy = down_st(m, y, n), *gdx = down_st(m, dx, n);
    snprintf(what, sizeof what, "%s y (C=%d)", kf, cols);
    check(m, what, gy, yr, n, tol_st(m));
    snprintf(what, sizeof what, "%s dx (C=%d)", kb, cols);
    check(m, what, gdx, dxr, n, tol_st(m));
    free(x); free(bias); free(dy); free(xb); free(bd); free(yr); free(dxr); free(dyd); free(gy); free(gdx);
    cu->cuMemFree(dx_); cu->cuMemFree(db); cu->cuMemFree(ddy); cu->cuMemFree(y); cu->cuMemFree(dx);
}

static void test_colsum(const Mod *m, int rows, int cols)
{
    size_t n = (size_t)rows * cols;
    float *dy = rand_st(m, n, 1), *pre = malloc(cols * 4);
    for (int i = 0; i < cols; i++) pre[i] = rnd_sym(1);
    int parts = 16;
    CUdeviceptr ddy = up_st(m, dy, n), out = up_raw(pre, cols * 4), partials = dalloc((size_t)parts * cols * 4);
    poison(partials, (size_t)parts * cols * 4);
    void *a[] = {&partials, &ddy, &rows, &cols};
    launch(m, "colsum_partial", (cols + 31) / 32, parts, 32, 8, a);
    void *b[] = {&out, &partials, &parts, &cols};
    launch(m, "colsum_finish", (cols + 255) / 256, 1, 256, 1, b);
    sync();
    double *ref = to_f64(pre, cols), *dyd = to_f64(dy, n);
    ck_bias_grad_f64(ref, dyd, rows, cols);
    float *got = down_f32(out, cols);
    char what[64];
    snprintf(what, sizeof what, "colsum dbias (C=%d)", cols);
    check(m, what, got, ref, cols, 1e-5);
    free(dy); free(pre); free(ref); free(dyd); free(got);
    cu->cuMemFree(ddy); cu->cuMemFree(out); cu->cuMemFree(partials);
}

static void test_activations(const Mod *m)
{
    int cols[2] = {(int)m->kc.ffn, 77};
    for (int c = 0; c < 2; c++) {
        test_act_one(m, "gelu", ck_gelu_fwd_f64, ck_gelu_bwd_f64, false, 64, cols[c]);
        test_act_one(m, "gelu_tanh", ck_gelu_tanh_fwd_f64, ck_gelu_tanh_bwd_f64, false, 64, cols[c]);
        test_act_one(m, "relu", ck_relu_fwd_f64, ck_relu_bwd_f64, false, 64, cols[c]);
        test_act_one(m, "tanh", ck_tanh_fwd_f64, ck_tanh_bwd_f64, true, 64, cols[c]);
        test_colsum(m, 300, cols[c]);
    }
}

/* ---- attention softmax --------------------------------------------------- */

static void test_softmax(const Mod *m, int L)
{
    int B = 3, NH = (int)m->kc.heads;
    size_t n = (size_t)B * NH * L * L;
    int64_t rows = (int64_t)B * NH * L;
    float scale = 1.0f / sqrtf((float)m->kc.head_dim), p = 0.1f;
    uint64_t seed = rnd64();
    uint32_t step = 9, salt = 4;
    int32_t *mask = malloc(B * L * 4);
    for (int b = 0; b < B; b++)        /* b0: no padding, b1: 37 padded keys, b2: every key masked */
        for (int k = 0; k < L; k++) mask[b * L + k] = b == 0 ? 1 : b == 1 ? k < L - 37 : 0;
    float *s = rand_st(m, n, 8);
    size_t nbits = (size_t)rows * 4 * ((L + 127) / 128);
    CUdeviceptr ds = up_st(m, s, n), dmask = up_raw(mask, B * L * 4), out = dalloc(n * m->es),
                probs = dalloc(n * m->es), bits = dalloc(nbits * 4);
    poison(out, n * m->es); poison(probs, n * m->es); poison(bits, nbits * 4);
    void *a[] = {&out, &probs, &ds, &dmask, &bits, &scale, &B, &L, &L, &p, &seed, &step, &salt};
    unsigned grid = (unsigned)((rows + 3) / 4);
    launch(m, "attn_softmax_fwd", grid, 1, 128, 1, a);
    sync();
    double *sd = to_f64(s, n), *pr = zeros64(n), *outr = zeros64(n);
    ck_attn_softmax_fwd_f64(pr, sd, mask, m->kc.causal, scale, B, NH, L, L);
    ck_dropout_fwd_f64(outr, pr, n, p, seed, step, salt);
    float *gout = down_st(m, out, n), *gpr = down_st(m, probs, n);
    char w1[64], w2[64], w3[64], w4[64];
    snprintf(w1, sizeof w1, "attn_softmax_fwd out (L=%d)", L);
    snprintf(w2, sizeof w2, "attn_softmax_fwd probs (L=%d)", L);
    snprintf(w3, sizeof w3, "attn_softmax_bwd (Philox, L=%d)", L);
    snprintf(w4, sizeof w4, "attn_softmax_bwd (mask bits, L=%d)", L);
    check(m, w1, gout, outr, n, tol_st(m));
    check(m, w2, gpr, pr, n, tol_st(m));

    float *dout = rand_st(m, n, 1);
    CUdeviceptr ddout = up_st(m, dout, n), dsc = dalloc(n * m->es), dsc2 = dalloc(n * m->es), null = 0;
    poison(dsc, n * m->es); poison(dsc2, n * m->es);
    void *b[] = {&dsc, &ddout, &probs, &null, &scale, &B, &L, &L, &p, &seed, &step, &salt};
    launch(m, "attn_softmax_bwd", grid, 1, 128, 1, b);
    void *b2[] = {&dsc2, &ddout, &probs, &bits, &scale, &B, &L, &L, &p, &seed, &step, &salt};
    launch(m, "attn_softmax_bwd", grid, 1, 128, 1, b2);
    sync();
    double *pin = to_f64(gpr, n), *dp = zeros64(n), *dsr = zeros64(n), *doutd = to_f64(dout, n);
    ck_dropout_bwd_f64(dp, doutd, n, p, seed, step, salt);
    ck_attn_softmax_bwd_f64(dsr, pin, dp, scale, rows, L);
    float *gds = down_st(m, dsc, n), *gds2 = down_st(m, dsc2, n);
    check(m, w3, gds, dsr, n, tol_st(m));
    check(m, w4, gds2, dsr, n, tol_st(m));
    free(gds2);
    free(mask); free(s); free(sd); free(pr); free(outr); free(gout); free(gpr); free(dout); free(pin);
    free(dp); free(dsr); free(doutd); free(gds);
    cu->cuMemFree(ds); cu->cuMemFree(dmask); cu->cuMemFree(out); cu->cuMemFree(probs);
    cu->cuMemFree(ddout); cu->cuMemFree(dsc); cu->cuMemFree(dsc2); cu->cuMemFree(bits);
}

/* ---- losses -------------------------------------------------------------- */

static void test_xent(const Mod *m, bool f32_logits, int C)
{
    int N = 64;
    size_t n = (size_t)N * C;
    Mod m32 = *m;
    if (f32_logits) m32.kc.dtype = KEMIT_F32, m32.es = 4;
    int32_t *labels = malloc(N * 4);
    for (int i = 0; i < N; i++) labels[i] = i % 5 == 3 ? -100 : (int32_t)(rnd64() % C);
    float *x = rand_st(&m32, n, 4), dscale_h = 1024.0f;
    CUdeviceptr dx = up_st(&m32, x, n), dl = up_raw(labels, N * 4), dsc = up_raw(&dscale_h, 4);
    CUdeviceptr inv = dalloc(4), rowl = dalloc(N * 4), loss = dalloc(4), dlog = dalloc(n * m32.es);
    poison(inv, 4); poison(rowl, N * 4); poison(loss, 4); poison(dlog, n * m32.es);
    void *a[] = {&inv, &dl, &N};
    launch(m, "xent_count", 1, 1, 1024, 1, a);
    void *b[] = {&dlog, &rowl, &dx, &dl, &inv, &dsc, &N, &C};
    launch(m, f32_logits ? "xent_fwd_bwd_f32" : "xent_fwd_bwd", N, 1, 256, 1, b);
    void *c[] = {&loss, &rowl, &inv, &N};
    launch(m, "xent_loss_reduce", 1, 1, 1024, 1, c);
    sync();
    double *xd = to_f64(x, n), lr = 0, *dr = zeros64(n);
    HpcError err;
    if (ck_xent_fwd_f64(&lr, xd, labels, N, C, &err)) die("ck_xent_fwd", &err);
    ck_xent_bwd_f64(dr, xd, labels, N, C, dscale_h);
    float *gl = down_f32(loss, 1), *gd = down_st(&m32, dlog, n);
    char w1[64], w2[64];
    snprintf(w1, sizeof w1, "%s loss (C=%d)", f32_logits ? "xent_fwd_bwd_f32" : "xent_fwd_bwd", C);
    snprintf(w2, sizeof w2, "%s dlogits (C=%d)", f32_logits ? "xent_fwd_bwd_f32" : "xent_fwd_bwd", C);
    check(m, w1, gl, &lr, 1, 1e-5);
    check(m, w2, gd, dr, n, tol_st(&m32));
    free(labels); free(x); free(xd); free(dr); free(gl); free(gd);
    CUdeviceptr all[] = {dx, dl, dsc, inv, rowl, loss, dlog};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu->cuMemFree(all[i]);
}

static void test_mse(const Mod *m, bool f32_pred)
{
    int N = 37;
    Mod m32 = *m;
    if (f32_pred) m32.kc.dtype = KEMIT_F32, m32.es = 4;
    float *pred = rand_st(&m32, N, 2), *tgt = malloc(N * 4), dscale_h = 512.0f;
    for (int i = 0; i < N; i++) tgt[i] = rnd_sym(2);
    CUdeviceptr dp = up_st(&m32, pred, N), dt = up_raw(tgt, N * 4), dsc = up_raw(&dscale_h, 4);
    CUdeviceptr loss = dalloc(4), dpred = dalloc(N * m32.es);
    poison(loss, 4); poison(dpred, N * m32.es);
    void *a[] = {&dpred, &loss, &dp, &dt, &dsc, &N};
    launch(m, f32_pred ? "mse_fwd_bwd_f32" : "mse_fwd_bwd", 1, 1, 1024, 1, a);
    sync();
    double *pd = to_f64(pred, N), *td = to_f64(tgt, N), *dr = zeros64(N);
    double lr = ck_mse_fwd_f64(pd, td, N);
    ck_mse_bwd_f64(dr, pd, td, N, dscale_h);
    float *gl = down_f32(loss, 1), *gd = down_st(&m32, dpred, N);
    check(m, f32_pred ? "mse_fwd_bwd_f32 loss" : "mse_fwd_bwd loss", gl, &lr, 1, 1e-5);
    check(m, f32_pred ? "mse_fwd_bwd_f32 dpred" : "mse_fwd_bwd dpred", gd, dr, N, tol_st(&m32));
    free(pred); free(tgt); free(pd); free(td); free(dr); free(gl); free(gd);
    cu->cuMemFree(dp); cu->cuMemFree(dt); cu->cuMemFree(dsc); cu->cuMemFree(loss); cu->cuMemFree(dpred);
}

/* ---- the optimizer and the loss scaler ------------------------------------ */

#define OPT_TENSORS 6

static HpcStatus opt_alloc(void *ctx, CUdeviceptr *p, size_t bytes, const char *what, HpcError *err)
{
    (void)ctx;
    (void)what;
    return CUDA_CHECK(err, cu->cuMemAlloc(p, bytes ? bytes : 4));
}

static void opt_plan_free(CudaOptPlan *p)
{
    CUdeviceptr bufs[] = {p->tensors, p->src_grads, p->chunks, p->chunk_first, p->state, p->decision,
                          p->part_sq, p->part_inf, p->part_pu, p->ratio, p->poison};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) cu->cuMemFree(bufs[i]);
}

static CudaOptKernels opt_kernels(const Mod *m)
{
    CudaOptKernels k;
    HpcError err;
    if (cuda_optim_kernels(m->opt_mod, &k, &err)) die("cuda_optim_kernels", &err);
    return k;
}

/* The executor's gradients of one tensor in dtype gdt (CUDA_OPT_GRAD_*):
 * x rounded to it in place, and uploaded to p. */
static void opt_put_grads(CUdeviceptr p, float *x, int64_t n, int gdt)
{
    if (gdt == CUDA_OPT_GRAD_F32) {
        DRV(cu->cuMemcpyHtoD(p, x, (size_t)n * 4));
        return;
    }
    SpecPrecision pr = gdt == CUDA_OPT_GRAD_F16 ? PREC_FP16 : PREC_BF16;
    uint16_t *h = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) {
        h[i] = prec_from_f32(pr, x[i]);
        x[i] = prec_to_f32(pr, h[i]);
    }
    DRV(cu->cuMemcpyHtoD(p, h, (size_t)n * 2));
    free(h);
}

/* runtime/cuda/cuda_optim.c's launch sequence (chunk table, check, decide,
 * update) against runtime/train/optim.c + lossscale.c over 5 steps: sizes
 * across chunk boundaries and below one float4, one tensor whose pointers
 * are 4 bytes off 16 (the scalar path), clipping active, step 3 overflows
 * (nothing may change, the scale backs off), the poison hook on step 4
 * (skipped again).  The executor's gradients are of dtype gdt
 * (CUDA_OPT_GRAD_*: f32, or f16 / bf16 as AMP keeps weight gradients);
 * with `direct` the update reads them (grad_accum = 1; the poison hook
 * writes a 16-bit inf there), else grad_accum = 2 through opt_accumulate
 * into f32 sums. */
static void test_optimizer(const Mod *m, SpecOptimizer kind, int gdt, bool direct)
{
    static const int64_t sizes[OPT_TENSORS] = {1000, 4096 * 3 + 1, 768, 77777, 5, 4099};
    const int misaligned = 5;   /* tensor whose device buffers start 4 bytes past 16 */
    bool low = m->kc.dtype != KEMIT_F32;
    OptimConfig oc = {.kind = kind, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                      .momentum = kind == OPT_SGD ? 0.9 : 0, .nesterov = kind == OPT_SGD,
                      .max_grad_norm = 1.0, .low_dtype = prec_of(m->kc.dtype)};
    ScheduleConfig sc = {.kind = SCHED_LINEAR, .lr = kind == OPT_SGD ? 0.05 : 1e-3, .warmup_steps = 1,
                         .total_steps = 10};
    LossScaleConfig lc;
    ls_config_default(&lc);
    lc.init = 1024;
    lc.interval = 2;
    LossScaler ls;
    ls_init(&ls, &lc);
    OptimState ost = {0};
    OptimTensor t[OPT_TENSORS];
    CudaOptTensor dt[OPT_TENSORS];
    uint64_t src[OPT_TENSORS];
    float *grads[OPT_TENSORS], *halves[OPT_TENSORS][2];
    CUdeviceptr dbufs[OPT_TENSORS][6], base[OPT_TENSORS][6];
    for (int k = 0; k < OPT_TENSORS; k++) {
        int64_t n = sizes[k];
        size_t off = k == misaligned ? 4 : 0;
        t[k] = (OptimTensor){.master = malloc(n * 4), .m = calloc(n, 4), .v = calloc(n, 4),
                             .low = low ? malloc(n * 2) : NULL, .n = n, .decay = k % 2 == 0};
        grads[k] = malloc(n * 4);
        halves[k][0] = malloc(n * 4);
        halves[k][1] = malloc(n * 4);
        for (int64_t i = 0; i < n; i++) {
            t[k].master[i] = rnd_sym(0.1f);
            /* two micro-batches whose mean is the gradient; norm well over 1: clipping is active */
            halves[k][0][i] = rnd_sym(1) * 1024.0f * 0.05f;
            halves[k][1][i] = rnd_sym(1) * 1024.0f * 0.05f;
        }
        t[k].grad = grads[k];
        if (kind == OPT_SGD) { free(t[k].v); t[k].v = NULL; }
        for (int j = 0; j < 6; j++) {
            base[k][j] = dalloc(n * 4 + 16);
            dbufs[k][j] = base[k][j] + off;
        }
        DRV(cu->cuMemcpyHtoD(dbufs[k][0], t[k].master, n * 4));
        DRV(cu->cuMemcpyHtoD(dbufs[k][2], t[k].m, n * 4));
        if (t[k].v) DRV(cu->cuMemcpyHtoD(dbufs[k][3], t[k].v, n * 4));
        if (low) poison(dbufs[k][4], n * 2);
        poison(dbufs[k][1], n * 4);   /* the accumulator: the first micro-batch overwrites it */
        src[k] = dbufs[k][5];         /* the executor's gradient of one micro-batch */
        /* the gradients as the executor stores them, the cpu's from the same values */
        opt_put_grads(src[k], halves[k][0], n, gdt);
        opt_put_grads(src[k], halves[k][1], n, gdt);
        for (int64_t i = 0; i < n; i++)
            grads[k][i] = direct ? halves[k][0][i] : (float)(halves[k][0][i] * 0.5f) + halves[k][1][i] * 0.5f;
        dt[k] = (CudaOptTensor){.master = dbufs[k][0], .grad = direct ? src[k] : dbufs[k][1], .m = dbufs[k][2],
                                 .v = t[k].v ? dbufs[k][3] : 0, .low = low ? dbufs[k][4] : 0, .n = n,
                                 .decay = t[k].decay, .grad_dtype = direct ? gdt : CUDA_OPT_GRAD_F32,
                                 .src_dtype = gdt};
    }
    size_t gsize = gdt == CUDA_OPT_GRAD_F32 ? 4 : 2;
    /* +inf in the executor's dtype */
    float inf32 = INFINITY;
    uint16_t inf16 = gdt == CUDA_OPT_GRAD_F16 ? 0x7c00 : 0x7f80;
    const void *inf = gsize == 4 ? (const void *)&inf32 : (const void *)&inf16;
    CudaOptParams prm = {.kind = kind, .nesterov = oc.nesterov, .sched_kind = sc.kind, .ls_mode = lc.mode,
                          .beta1 = oc.beta1, .beta2 = oc.beta2, .eps = oc.eps, .weight_decay = oc.weight_decay,
                          .momentum = oc.momentum, .max_grad_norm = oc.max_grad_norm, .lr = sc.lr,
                          .min_lr_ratio = 0, .warmup_steps = sc.warmup_steps, .total_steps = sc.total_steps,
                          .ls_growth = lc.growth, .ls_backoff = lc.backoff, .ls_interval = lc.interval};
    CudaOptState st0 = {.scale = (float)lc.init};
    CudaOptPlan plan;
    CudaOptKernels kern = opt_kernels(m);
    HpcError err;
    if (cuda_optim_plan_build(&plan, dt, src, NULL, OPT_TENSORS, &prm, &st0, opt_alloc, NULL, dev.stream, &err))
        die("cuda_optim_plan_build", &err);
    char kname[32];
    snprintf(kname, sizeof kname, "%s%s%s", spec_optimizer_name(kind),
             gdt == CUDA_OPT_GRAD_F32 ? "" : gdt == CUDA_OPT_GRAD_F16 ? " f16 grads" : " bf16 grads",
             direct ? " direct" : "");
    OptimReport rep = {0};
    for (int s = 0; s < 6; s++) {
        if (s == 3) grads[1][17] = INFINITY;   /* an overflowing step */
        for (int h = 0; h < (direct ? 1 : 2); h++) {
            sync();   /* the last accumulation or step has read src */
            for (int k = 0; k < OPT_TENSORS; k++) opt_put_grads(src[k], halves[k][h], sizes[k], gdt);
            if (s == 3 && h == (direct ? 0 : 1)) DRV(cu->cuMemcpyHtoD(src[1] + 17 * gsize, inf, gsize));
            if (!direct && cuda_optim_queue_accumulate(&kern, &plan, 0.5f, h == 0, false, dev.stream, &err))
                die("accumulate", &err);
        }
        bool poisoned = s == 4;
        if (poisoned) {
            DRV(cu->cuMemsetD32Async(plan.poison, 1, 1, dev.stream));
            grads[0][0] = INFINITY;
        }
        if (cuda_optim_queue_step(&kern, &plan, false, dev.stream, &err)) die("cuda_optim_queue_step", &err);
        double lr = schedule_lr(&sc, ost.step);
        optim_step(&oc, &ost, t, OPT_TENSORS, (float)(1.0 / ls.scale), lr, &rep);
        ls_update(&ls, rep.found_inf);
        if (poisoned) grads[0][0] = direct ? halves[0][0][0] : 0.5f * halves[0][0][0] + 0.5f * halves[0][1][0];
        if (s == 3) grads[1][17] = direct ? halves[1][0][17] : 0.5f * halves[1][0][17] + 0.5f * halves[1][1][17];
        if (s == 3 || s == 4) {
            checks++;
            if (!rep.found_inf) failures++;
            printf("%s  %-12s %-34s step %d skipped on the cpu\n", rep.found_inf ? "ok  " : "FAIL", m->label,
                   kname, s);
        }
    }
    sync();
    CudaOptState st;
    DRV(cu->cuMemcpyDtoH(&st, plan.state, sizeof st));
    int flag = -1;
    DRV(cu->cuMemcpyDtoH(&flag, plan.poison, 4));
    bool state_ok = st.scale == (float)ls.scale && st.step == ost.step && st.total_skips == ls.total_skips &&
                    st.total_skips == 2 && st.growth_tracker == ls.growth_tracker &&
                    st.found_inf == (int)rep.found_inf && flag == 0 &&
                    fabs(st.grad_norm - rep.grad_norm) <= 1e-5 * rep.grad_norm &&
                    fabs(st.clip_coef - rep.clip_coef) <= 1e-5 && fabs(st.lr - schedule_lr(&sc, ost.step - 1)) <= 1e-12;
    checks++;
    if (!state_ok) failures++;
    printf("%s  %-12s %-34s scale %g/%g step %lld/%lld skips %lld/%lld norm %.6g/%.6g coef %.4g/%.4g\n",
           state_ok ? "ok  " : "FAIL", m->label, kname, st.scale, ls.scale, (long long)st.step,
           (long long)ost.step, (long long)st.total_skips, (long long)ls.total_skips, st.grad_norm,
           rep.grad_norm, st.clip_coef, rep.clip_coef);
    for (int k = 0; k < OPT_TENSORS; k++) {
        int64_t n = sizes[k];
        char what[80];
        float *g = down_f32(dbufs[k][0], n);
        double *r = to_f64(t[k].master, n);
        snprintf(what, sizeof what, "%s master[%d] n=%lld%s", kname, k, (long long)n,
                 k == misaligned ? " (unaligned)" : "");
        check(m, what, g, r, n, 1e-5);
        free(g); free(r);
        g = down_f32(dbufs[k][2], n);
        r = to_f64(t[k].m, n);
        snprintf(what, sizeof what, "%s m[%d]", kname, k);
        check(m, what, g, r, n, 1e-5);
        free(g); free(r);
        if (t[k].v) {
            g = down_f32(dbufs[k][3], n);
            r = to_f64(t[k].v, n);
            snprintf(what, sizeof what, "%s v[%d]", kname, k);
            check(m, what, g, r, n, 1e-5);
            free(g); free(r);
        }
        if (low) {
            g = down_st(m, dbufs[k][4], n);
            r = malloc(n * sizeof *r);
            for (int64_t i = 0; i < n; i++) r[i] = prec_to_f32(oc.low_dtype, t[k].low[i]);
            snprintf(what, sizeof what, "%s low copy[%d]", kname, k);
            check(m, what, g, r, n, tol_st(m));
            free(g); free(r);
        }
        free(t[k].master); free(t[k].m); free(t[k].v); free(t[k].low); free(grads[k]);
        free(halves[k][0]); free(halves[k][1]);
        for (int j = 0; j < 6; j++) cu->cuMemFree(base[k][j]);
    }
    opt_plan_free(&plan);
}

static KernelConfig bert_base(KemitDtype dt, bool causal)
{
    ModelSpec spec;
    spec_defaults(&spec);
    if (causal) {   /* GPT-2-like: causal, no embedding LayerNorm, position offset */
        spec.stack.attention = ATTN_CAUSAL;
        spec.stack.embedding_ln = false;
        spec.stack.position_offset = 2;
    }
    KernelConfig kc;
    kemit_config_from_spec(&kc, &spec, dt);
    return kc;
}

/* ---- timing at BERT-base sizes ------------------------------------------- */

typedef struct { const char *name; double ms, gbs; } Timing;
static Timing timings[64];
static int n_timings;
static double copy_gbs;

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median of 50 timed launches (after 5 warm-ups) of the launches in `fnc`. */
typedef void (*LaunchFn)(const Mod *m, void *ctx);
static double time_median(const Mod *m, LaunchFn f, void *ctx)
{
    CUevent e0, e1;
    DRV(cu->cuEventCreate(&e0, 0));
    DRV(cu->cuEventCreate(&e1, 0));
    for (int i = 0; i < 5; i++) f(m, ctx);
    float ms[50];
    for (int i = 0; i < 50; i++) {
        DRV(cu->cuEventRecord(e0, dev.stream));
        f(m, ctx);
        DRV(cu->cuEventRecord(e1, dev.stream));
        DRV(cu->cuEventSynchronize(e1));
        DRV(cu->cuEventElapsedTime(&ms[i], e0, e1));
    }
    qsort(ms, 50, sizeof ms[0], cmp_float);
    cu->cuEventDestroy(e0);
    cu->cuEventDestroy(e1);
    return (ms[24] + ms[25]) / 2;
}

static void record(const Mod *m, const char *name, double ms, double bytes)
{
    static char names[64][96];
    if (n_timings == 64) return;
    snprintf(names[n_timings], sizeof names[0], "%s %s", m->label, name);
    timings[n_timings] = (Timing){names[n_timings], ms, bytes / (ms * 1e-3) / 1e9};
    n_timings++;
}

/* Device buffer of n st_t (or f32 when es == 4) random values in [-a, a]. */
static CUdeviceptr rand_dev(const Mod *m, size_t n, int es, float a)
{
    Mod mm = *m;
    if (es == 4) mm.kc.dtype = KEMIT_F32, mm.es = 4;
    size_t chunk = n < (1u << 22) ? n : (1u << 22);
    float *x = rand_st(&mm, chunk, a);
    CUdeviceptr src = up_st(&mm, x, chunk), p = dalloc(n * es);
    for (size_t off = 0; off < n; off += chunk) {
        size_t c = n - off < chunk ? n - off : chunk;
        DRV(cu->cuMemcpyDtoD(p + off * es, src, c * es));
    }
    cu->cuMemFree(src);
    free(x);
    return p;
}

typedef struct { const char *kernel; unsigned grid[2], block[2]; void **args; } Launch;
static void run_launch(const Mod *m, void *ctx)
{
    Launch *l = ctx;
    launch(m, l->kernel, l->grid[0], l->grid[1], l->block[0], l->block[1], l->args);
}

typedef struct { Launch l[3]; int n; } Launches;
static void run_launches(const Mod *m, void *ctx)
{
    Launches *ls = ctx;
    for (int i = 0; i < ls->n; i++) run_launch(m, &ls->l[i]);
}

/* ---- GEMM algorithm choice (runtime/cuda/gemm_cublas.c + gemm_tune.h) ---- */

typedef struct {
    const char *what;
    int64_t M, N, K, batch;
    GemmDtype ab, c;
    float beta;
    bool bias;
} TuneCase;

static const TuneCase tune_cases[] = {
    {"linear FFN up (f16, bias)", 4096, 3072, 768, 1, GEMM_F16, GEMM_F16, 0, true},
    {"linear FFN down (f16, bias)", 4096, 768, 3072, 1, GEMM_F16, GEMM_F16, 0, true},
    {"attention scores (batched)", 128, 128, 64, 384, GEMM_F16, GEMM_F16, 0, false},
    {"weight gradient += (beta 1, f32 out)", 768, 768, 4096, 1, GEMM_F16, GEMM_F32, 1, false},
};
#define N_TUNE_CASES ((int)(sizeof tune_cases / sizeof tune_cases[0]))

typedef struct { CUdeviceptr A, B, C, C0, bias; GemmDesc d; size_t c_bytes; } TuneBufs;

static TuneBufs tune_bufs(const Mod *m16, const TuneCase *t)
{
    TuneBufs b;
    size_t ab = (size_t)(t->M * t->K + t->K * t->N) * (size_t)t->batch;
    int ces = t->c == GEMM_F32 ? 4 : 2;
    b.c_bytes = (size_t)(t->M * t->N * t->batch) * (size_t)ces;
    b.A = rand_dev(m16, (size_t)(t->M * t->K * t->batch), 2, 1);
    b.B = rand_dev(m16, ab - (size_t)(t->M * t->K * t->batch), 2, 1);
    b.C0 = rand_dev(m16, (size_t)(t->M * t->N * t->batch), ces, 1);   /* what C holds before (beta != 0) */
    b.C = dalloc(b.c_bytes);
    b.bias = t->bias ? rand_dev(m16, (size_t)t->N, ces, 1) : 0;
    gemm_desc_rm(&b.d, t->ab, t->c, t->M, t->N, t->K, b.A, b.B, b.C);
    b.d.trans_b = true;   /* B stored (N, K), as a linear layer's weight */
    b.d.ldb = t->K;
    b.d.beta = t->beta;
    if (t->batch > 1) {
        b.d.batch = t->batch;
        b.d.stride_a = t->M * t->K;
        b.d.stride_b = t->N * t->K;
        b.d.stride_c = t->M * t->N;
    }
    if (t->bias) {
        b.d.epilogue = GEMM_EPI_BIAS;
        b.d.bias = b.bias;
    }
    return b;
}

static void tune_bufs_free(TuneBufs *b)
{
    CUdeviceptr all[] = {b->A, b->B, b->C, b->C0, b->bias};
    for (int i = 0; i < 5; i++) if (all[i]) cu->cuMemFree(all[i]);
}

/* C = the GEMM of case t through ctx, from C0; host copy as floats. */
static float *tune_run(GemmContext *ctx, TuneBufs *b, const TuneCase *t)
{
    DRV(cu->cuMemcpyDtoD(b->C, b->C0, b->c_bytes));
    HpcError err;
    if (gemm_run(ctx, &b->d, &err)) die("gemm_run", &err);
    sync();
    size_t n = (size_t)(t->M * t->N * t->batch);
    Mod m = {.kc = {.dtype = t->c == GEMM_F32 ? KEMIT_F32 : t->c == GEMM_BF16 ? KEMIT_BF16 : KEMIT_F16},
             .es = t->c == GEMM_F32 ? 4 : 2};
    return t->c == GEMM_F32 ? down_f32(b->C, n) : down_st(&m, b->C, n);
}

/* How many of n values differ in their bits between a and b. */
static size_t count_diff(const float *a, const float *b, size_t n)
{
    size_t d = 0;
    for (size_t k = 0; k < n; k++) d += memcmp(&a[k], &b[k], sizeof *a) != 0;
    return d;
}

/* After a cache-hit mismatch (seen now and then, NOTES.md): whether each
 * context repeats its own bits when run again.  If not, the algorithm is
 * not deterministic; if so, the cached bytes ran another kernel. */
static void tune_mismatch_note(GemmContext *tuned, GemmContext *again, TuneBufs *b, const TuneCase *t,
                               const float *first, const float *hit)
{
    size_t n = (size_t)(t->M * t->N * t->batch);
    float *first2 = tune_run(tuned, b, t), *hit2 = tune_run(again, b, t);
    printf("note  gemm tune    %-38s run again, the timed context differs from itself in %.0f values, the "
           "cache-hit context in %.0f\n", t->what, (double)count_diff(first2, first, n),
           (double)count_diff(hit2, hit, n));
    free(first2);
    free(hit2);
}

static double tune_median_us(GemmContext *ctx, TuneBufs *b)
{
    CUevent e0, e1;
    DRV(cu->cuEventCreate(&e0, 0));
    DRV(cu->cuEventCreate(&e1, 0));
    float ms[21];
    HpcError err;
    for (int i = 0; i < 21; i++) {
        DRV(cu->cuEventRecord(e0, dev.stream));
        for (int k = 0; k < 10; k++)
            if (gemm_run(ctx, &b->d, &err)) die("gemm_run", &err);
        DRV(cu->cuEventRecord(e1, dev.stream));
        DRV(cu->cuEventSynchronize(e1));
        DRV(cu->cuEventElapsedTime(&ms[i], e0, e1));
    }
    qsort(ms, 21, sizeof ms[0], cmp_float);
    cu->cuEventDestroy(e0);
    cu->cuEventDestroy(e1);
    return 100.0 * ms[10];   /* us per GEMM */
}

static void tune_result(bool ok, const char *fmt, const char *a, double x, double y)
{
    checks++;
    if (!ok) failures++;
    printf("%s  %-12s ", ok ? "ok  " : "FAIL", "gemm tune");
    printf(fmt, a, x, y);
    printf("\n");
}

/* Checks got (a tuned context's result of t) against ref (the heuristic's
 * first algorithm): finite, relative L2 error under 2e-3; frees both. */
static void tune_check(const TuneCase *t, float *got, float *ref, const char *what)
{
    size_t n = (size_t)(t->M * t->N * t->batch);
    double num = 0, den = 0;
    int bad = 0;
    for (size_t k = 0; k < n; k++) {
        bad += !isfinite(got[k]);
        num += ((double)got[k] - ref[k]) * ((double)got[k] - ref[k]);
        den += (double)ref[k] * ref[k];
    }
    double rel = sqrt(num / (den > 0 ? den : 1));
    char label[96];
    snprintf(label, sizeof label, "%s %s", t->what, what);
    tune_result(bad == 0 && rel < 2e-3, "%-52s vs heuristic rel %.2e (limit %.0e)", label, rel, 2e-3);
    free(ref);
    free(got);
}

/* The timed choice gives the heuristic's result (within fp32-accumulation
 * reordering), a GEMM that reads C is timed without changing it, the
 * choices reach the cache file (under their shape's key and their class's:
 * gemm_tune.h) at gemm_tune_flush and a second context reuses them without
 * timing, a new shape of a timed class is either given the class's choice
 * or timed, once, with the heuristic's result, and HPC_GEMM_AUTOTUNE=0
 * times nothing.  Then each case's time, heuristic first against the timed
 * choice. */
static void test_gemm_autotune(const Mod *m16, bool timing)
{
    char dir[64] = "/tmp/hpc-gemm-tune-gpu-XXXXXX";
    if (!mkdtemp(dir)) die("mkdtemp", NULL);
    const char *old_cache = getenv("HPC_CACHE_DIR");
    char *saved_cache = old_cache ? strdup(old_cache) : NULL;
    setenv("HPC_CACHE_DIR", dir, 1);
    HpcError err;
    GemmContext plain, tuned, again;
    setenv("HPC_GEMM_AUTOTUNE", "0", 1);
    if (gemm_init(&plain, dev.stream, 0, &err)) die("gemm_init", &err);
    unsetenv("HPC_GEMM_AUTOTUNE");
    if (gemm_init(&tuned, dev.stream, 0, &err)) die("gemm_init", &err);
    TuneBufs bufs[N_TUNE_CASES];
    for (int i = 0; i < N_TUNE_CASES; i++) {
        const TuneCase *t = &tune_cases[i];
        bufs[i] = tune_bufs(m16, t);
        float *ref = tune_run(&plain, &bufs[i], t), *got = tune_run(&tuned, &bufs[i], t);
        tune_check(t, got, ref, "tuned");
    }
    tune_result(plain.tuned == 0 && plain.tune_hits == 0, "%s tuned %.0f shapes, %.0f cache hits",
                "HPC_GEMM_AUTOTUNE=0:", plain.tuned, plain.tune_hits);
    tune_result(tuned.tuned >= 1 && tuned.tune_hits == 0, "%s tuned %.0f shapes, %.0f cache hits",
                "first context:", tuned.tuned, tuned.tune_hits);
    GemmTuneCache file;
    char path[160];
    snprintf(path, sizeof path, "%s/%s", dir, GEMM_TUNE_FILE);
    gemm_tune_flush(&tuned);
    gemm_tune_load(&file, path, stdout);
    int classes = 0;
    for (int i = 0; i < file.n; i++) classes += strncmp(file.e[i].key, "class|", 6) == 0;
    tune_result(file.n - classes == tuned.tuned && classes >= 1 && classes <= tuned.tuned,
                "%s %.0f shape entries for %.0f timed shapes", path, file.n - classes, tuned.tuned);
    gemm_tune_free(&file);
    int cases_timed = tuned.tuned;
    {   /* FFN up at 4000 tokens: 4096's class (gemm_tune_bucket), a shape not yet seen */
        TuneCase near = tune_cases[0];
        near.what = "linear FFN up, 4000 tokens";
        near.M = 4000;
        TuneBufs nb = tune_bufs(m16, &near);
        int timed0 = tuned.tuned, class0 = tuned.tune_class_hits, hits0 = tuned.tune_hits;
        float *ref = tune_run(&plain, &nb, &near), *got = tune_run(&tuned, &nb, &near);
        tune_check(&near, got, ref, "class or timed");
        int timed = tuned.tuned - timed0, by_class = tuned.tune_class_hits - class0;
        tune_result(timed + by_class == 1 && tuned.tune_hits == hits0, "%s %.0f timed, %.0f by its class",
                    "a new shape of a timed class:", timed, by_class);
        tune_bufs_free(&nb);
    }
    if (gemm_init(&again, dev.stream, 0, &err)) die("gemm_init", &err);
    /* A cache hit skips the heuristic (cublasLtMatmulAlgoCheck of the cached
     * algorithm): the same algorithm as the timed choice, so the same bits. */
    for (int i = 0; i < N_TUNE_CASES; i++) {
        const TuneCase *t = &tune_cases[i];
        float *hit = tune_run(&again, &bufs[i], t), *first = tune_run(&tuned, &bufs[i], t);
        size_t n = (size_t)(t->M * t->N * t->batch);
        size_t same = n - count_diff(hit, first, n);
        tune_result(same == n, "%-38s cache hit vs timed choice: %.0f of %.0f values bit for bit", t->what,
                    (double)same, (double)n);
        if (same != n) tune_mismatch_note(&tuned, &again, &bufs[i], t, first, hit);
        free(hit);
        free(first);
    }
    tune_result(again.tuned == 0 && again.tune_hits == cases_timed, "%s tuned %.0f shapes, %.0f cache hits",
                "second context, same cache:", again.tuned, again.tune_hits);
    if (timing)
        for (int i = 0; i < N_TUNE_CASES; i++) {
            double h = tune_median_us(&plain, &bufs[i]), t = tune_median_us(&tuned, &bufs[i]);
            printf("time  gemm tune    %-38s heuristic %8.1f us, timed choice %8.1f us (%+.1f%%)\n",
                   tune_cases[i].what, h, t, 100.0 * (t - h) / h);
        }
    for (int i = 0; i < N_TUNE_CASES; i++) tune_bufs_free(&bufs[i]);
    gemm_free(&plain);
    gemm_free(&tuned);
    gemm_free(&again);
    if (saved_cache) setenv("HPC_CACHE_DIR", saved_cache, 1);
    else unsetenv("HPC_CACHE_DIR");
    free(saved_cache);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", dir);
}

typedef struct { CudaOptKernels k; const CudaOptPlan *plan; } OptTiming;
static void run_opt_step(const Mod *m, void *ctx)
{
    (void)m;
    OptTiming *t = ctx;
    HpcError err;
    if (cuda_optim_queue_step(&t->k, t->plan, false, dev.stream, &err)) die("cuda_optim_queue_step", &err);
}

static void time_kernels(const Mod *m)
{
    int B = 32, L = 128, H = (int)m->kc.hidden, F = (int)m->kc.ffn, NH = (int)m->kc.heads, V = (int)m->kc.vocab;
    KemitRowLayout rl = kemit_row_layout(&m->kc);
    int R = B * L, es = m->es, threads = rl.threads, rpb = rl.rpb;
    /* Backward row kernels: about 4 blocks a multiprocessor (timed: see docs/cuda_kernels.md). */
    int want = 4 * dev.sm_count, need = (R + rpb - 1) / rpb;
    unsigned bgrid = (unsigned)(need < want ? need : want);
    float p0 = 0.0f;
    size_t n = (size_t)R * H;
    float p = 0.1f, scale = 0.125f;
    uint64_t seed = 1;
    uint32_t step = 1, salt = 1;
    int zero = 0, parts = KEMIT_PARTS;
    CUdeviceptr x = rand_dev(m, n, es, 1), res = rand_dev(m, n, es, 1), y = rand_dev(m, n, es, 1),
                z = rand_dev(m, n, es, 1), vec = rand_dev(m, H, es, 1), mean = rand_dev(m, R, 4, 1),
                rstd = rand_dev(m, R, 4, 1), partials = dalloc((size_t)parts * 3 * H * 4);
    {   /* LayerNorm */
        void *a[] = {&y, &z, &mean, &rstd, &x, &vec, &res, &vec, &vec, &R, &p, &seed, &step, &salt};
        Launch l = {"ln_fwd", {R, 1}, {threads, 1}, a};
        record(m, "ln_fwd (bias+drop+res+LN)", time_median(m, run_launch, &l), 4.0 * n * es);
        void *a0[] = {&y, &z, &mean, &rstd, &x, &vec, &res, &vec, &vec, &R, &p0, &seed, &step, &salt};
        Launch l0 = {"ln_fwd", {R, 1}, {threads, 1}, a0};
        record(m, "ln_fwd p=0", time_median(m, run_launch, &l0), 4.0 * n * es);
        void *b[] = {&x, &res, &partials, &y, &z, &mean, &rstd, &vec, &R, &p, &seed, &step, &salt, &zero};
        Launch lb = {"ln_bwd", {bgrid, 1}, {threads, rpb}, b};
        record(m, "ln_bwd", time_median(m, run_launch, &lb), 4.0 * n * es);
        void *b0[] = {&x, &res, &partials, &y, &z, &mean, &rstd, &vec, &R, &p0, &seed, &step, &salt, &zero};
        Launch lb0 = {"ln_bwd", {bgrid, 1}, {threads, rpb}, b0};
        record(m, "ln_bwd p=0", time_median(m, run_launch, &lb0), 4.0 * n * es);
    }
    {   /* embeddings */
        int32_t *ids = malloc(R * 4), *tt = malloc(R * 4);
        for (int i = 0; i < R; i++) ids[i] = (int32_t)(rnd64() % V), tt[i] = (int32_t)(rnd64() % 2);
        CUdeviceptr dids = up_raw(ids, R * 4), dtt = up_raw(tt, R * 4);
        CUdeviceptr word = rand_dev(m, (size_t)V * H, es, 1), pos = rand_dev(m, (size_t)m->kc.max_positions * H, es, 1),
                    type = rand_dev(m, 2 * H, es, 1), gw = rand_dev(m, (size_t)V * H, 4, 1),
                    gp = rand_dev(m, (size_t)m->kc.max_positions * H, 4, 1), gt = rand_dev(m, 2 * H, 4, 1);
        void *a[] = {&y, &mean, &rstd, &dids, &dtt, &word, &pos, &type, &vec, &vec, &B, &L, &p, &seed, &step, &salt};
        Launch l = {"emb_fwd", {R, 1}, {threads, 1}, a};
        record(m, "emb_fwd (3 gathers+LN+drop)", time_median(m, run_launch, &l), 4.0 * n * es);
        CUdeviceptr tpart = dalloc((size_t)parts * 2 * H * 4);
        void *b[] = {&gw, &gp, &gt, &partials, &tpart, &y, &dids, &dtt, &word, &pos, &type, &mean, &rstd, &vec,
                     &B, &L, &p, &seed, &step, &salt};
        Launch lb = {"emb_bwd", {bgrid, 1}, {threads, rpb}, b};
        record(m, "emb_bwd (word atomics)", time_median(m, run_launch, &lb), 4.0 * n * es + 1.0 * n * 8);
        cu->cuMemFree(tpart);
        CUdeviceptr all[] = {dids, dtt, word, pos, type, gw, gp, gt};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu->cuMemFree(all[i]);
        free(ids); free(tt);
    }
    {   /* FFN activation and bias gradient */
        size_t nf = (size_t)R * F;
        CUdeviceptr fx = rand_dev(m, nf, es, 2), fy = rand_dev(m, nf, es, 1), fb = rand_dev(m, F, es, 1);
        CUdeviceptr dy = rand_dev(m, nf, es, 1), cp = dalloc((size_t)64 * F * 4), db = dalloc(F * 4);
        unsigned grid = (unsigned)(dev.sm_count * 8);
        void *a[] = {&fy, &fx, &fb, &R, &F};
        Launch l = {"bias_gelu_fwd", {grid, 1}, {256, 1}, a};
        record(m, "bias_gelu_fwd (R x FFN)", time_median(m, run_launch, &l), 2.0 * nf * es);
        void *b[] = {&fy, &dy, &fx, &fb, &R, &F};
        Launch lb = {"bias_gelu_bwd", {grid, 1}, {256, 1}, b};
        record(m, "bias_gelu_bwd", time_median(m, run_launch, &lb), 3.0 * nf * es);
        int cparts = 64;
        void *c1[] = {&cp, &dy, &R, &F};
        void *c2[] = {&db, &cp, &cparts, &F};
        Launches cs = {{{"colsum_partial", {(F + 31) / 32, cparts}, {32, 8}, c1},
                        {"colsum_finish", {(F + 255) / 256, 1}, {256, 1}, c2}}, 2};
        record(m, "colsum dbias (R x FFN)", time_median(m, run_launches, &cs), 1.0 * nf * es);
        CUdeviceptr all[] = {fx, fy, fb, dy, cp, db};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu->cuMemFree(all[i]);
    }
    {   /* attention softmax */
        size_t ns = (size_t)B * NH * L * L;
        int32_t *mask = malloc(B * L * 4);
        for (int i = 0; i < B * L; i++) mask[i] = i % L < L - 16;
        size_t nb = (size_t)B * NH * L * 4 * ((L + 127) / 128);
        CUdeviceptr dm = up_raw(mask, B * L * 4), s = rand_dev(m, ns, es, 8), o = rand_dev(m, ns, es, 1),
                    pr = rand_dev(m, ns, es, 1), bits = dalloc(nb * 4), null = 0;
        unsigned grid = (unsigned)(((size_t)B * NH * L + 3) / 4);
        void *a[] = {&o, &pr, &s, &dm, &null, &scale, &B, &L, &L, &p, &seed, &step, &salt};
        Launch l = {"attn_softmax_fwd", {grid, 1}, {128, 1}, a};
        record(m, "attn_softmax_fwd (+drop)", time_median(m, run_launch, &l), 3.0 * ns * es);
        void *a0[] = {&o, &null, &s, &dm, &null, &scale, &B, &L, &L, &p0, &seed, &step, &salt};
        Launch l0 = {"attn_softmax_fwd", {grid, 1}, {128, 1}, a0};
        record(m, "attn_softmax_fwd p=0", time_median(m, run_launch, &l0), 2.0 * ns * es);
        void *a1[] = {&o, &pr, &s, &dm, &bits, &scale, &B, &L, &L, &p, &seed, &step, &salt};
        Launch l1 = {"attn_softmax_fwd", {grid, 1}, {128, 1}, a1};
        record(m, "attn_softmax_fwd (+drop, bits)", time_median(m, run_launch, &l1), 3.0 * ns * es + nb * 4);
        void *b[] = {&s, &o, &pr, &null, &scale, &B, &L, &L, &p, &seed, &step, &salt};
        Launch lb = {"attn_softmax_bwd", {grid, 1}, {128, 1}, b};
        record(m, "attn_softmax_bwd (Philox)", time_median(m, run_launch, &lb), 3.0 * ns * es);
        void *b1[] = {&s, &o, &pr, &bits, &scale, &B, &L, &L, &p, &seed, &step, &salt};
        Launch lb1 = {"attn_softmax_bwd", {grid, 1}, {128, 1}, b1};
        record(m, "attn_softmax_bwd (bits)", time_median(m, run_launch, &lb1), 3.0 * ns * es + nb * 4);
        cu->cuMemFree(dm); cu->cuMemFree(s); cu->cuMemFree(o); cu->cuMemFree(pr); cu->cuMemFree(bits);
        free(mask);
    }
    {   /* cross-entropy over the vocabulary (MLM-sized: every token) */
        size_t nl = (size_t)R * V;
        int32_t *labels = malloc(R * 4);
        for (int i = 0; i < R; i++) labels[i] = i % 7 == 0 ? (int32_t)(rnd64() % V) : -100;
        CUdeviceptr dl = up_raw(labels, R * 4), lg = rand_dev(m, nl, es, 4), dlg = rand_dev(m, nl, es, 1);
        CUdeviceptr inv = dalloc(4), rowl = dalloc(R * 4), loss = dalloc(4);
        void *a[] = {&inv, &dl, &R};
        CUdeviceptr null = 0;   /* dscale NULL: 1 */
        void *b[] = {&dlg, &rowl, &lg, &dl, &inv, &null, &R, &V};
        void *c[] = {&loss, &rowl, &inv, &R};
        Launches xs = {{{"xent_count", {1, 1}, {1024, 1}, a}, {"xent_fwd_bwd", {R, 1}, {256, 1}, b},
                        {"xent_loss_reduce", {1, 1}, {1024, 1}, c}}, 3};
        record(m, "xent (4096 x 30522, 3 kernels)", time_median(m, run_launches, &xs), 2.0 * nl * es);
        cu->cuMemFree(dl); cu->cuMemFree(lg); cu->cuMemFree(dlg); cu->cuMemFree(inv); cu->cuMemFree(rowl);
        cu->cuMemFree(loss);
        free(labels);
    }
    {   /* optimizer over BERT-base's 110M parameters: 110M / 199 tensors of
         * BERT-base's sizes would be closer, but the chunk table makes tensor
         * count irrelevant; 8 tensors plus small ones (biases) */
        enum { NT = 10 };
        int64_t per = 110000000 / 8;
        int64_t ns[NT] = {per, per, per, per, per, per, per, per, 768, 2};
        CudaOptTensor dt[NT];
        CUdeviceptr bufs[NT][5];
        for (int k = 0; k < NT; k++) {
            bufs[k][0] = rand_dev(m, ns[k], 4, 0.1f);
            bufs[k][1] = rand_dev(m, ns[k], 4, 0.01f);
            bufs[k][2] = rand_dev(m, ns[k], 4, 0.001f);
            bufs[k][3] = dalloc(ns[k] * 4);
            DRV(cu->cuMemsetD8Async(bufs[k][3], 0, ns[k] * 4, dev.stream));   /* v >= 0 */
            bufs[k][4] = es == 2 ? dalloc(ns[k] * 2) : 0;
            dt[k] = (CudaOptTensor){.master = bufs[k][0], .grad = bufs[k][1], .m = bufs[k][2], .v = bufs[k][3],
                                     .low = bufs[k][4], .n = ns[k], .decay = k % 2};
        }
        CudaOptParams prm = {.kind = OPT_ADAMW, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                              .max_grad_norm = 1.0, .lr = 1e-4, .sched_kind = SCHED_CONSTANT,
                              .ls_growth = 2, .ls_backoff = 0.5, .ls_interval = 1000000};
        CudaOptState st0 = {.scale = 1.0f};
        CudaOptPlan plan;
        HpcError err;
        if (cuda_optim_plan_build(&plan, dt, NULL, NULL, NT, &prm, &st0, opt_alloc, NULL, dev.stream, &err))
            die("cuda_optim_plan_build", &err);
        OptTiming ot = {opt_kernels(m), &plan};
        double bytes = cuda_optim_step_bytes(dt, NT, OPT_ADAMW);
        record(m, "optimizer AdamW 110M params (goal 0.9 ms)", time_median(m, run_opt_step, &ot), bytes);
        for (int k = 0; k < NT; k++)
            for (int j = 0; j < 5; j++) if (bufs[k][j]) cu->cuMemFree(bufs[k][j]);
        opt_plan_free(&plan);
    }
    CUdeviceptr all[] = {x, res, y, z, vec, mean, rstd, partials};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu->cuMemFree(all[i]);
}

/* ln_bwd and emb_bwd with 1, 2 and 4 rows per block and three grid sizes,
 * f16, to choose the emitter's default (KEMIT_DEFAULT_RPB). */
static void time_row_variants(void)
{
    int B = 32, L = 128, R = B * L;
    float p = 0.1f;
    uint64_t seed = 1;
    uint32_t step = 1, salt = 1;
    int zero = 0;
    for (int rpb = 1; rpb <= 4; rpb *= 2) {
        KernelConfig kc = bert_base(KEMIT_F16, false);
        kc.row_rpb = rpb;
        char label[32];
        snprintf(label, sizeof label, "f16 rpb=%d", rpb);
        Mod m = mod_build(kc, label);
        int H = (int)kc.hidden, threads = kemit_row_layout(&kc).threads, es = 2;
        size_t n = (size_t)R * H;
        CUdeviceptr x = rand_dev(&m, n, es, 1), res = rand_dev(&m, n, es, 1), y = rand_dev(&m, n, es, 1),
                    z = rand_dev(&m, n, es, 1), vec = rand_dev(&m, H, es, 1), mean = rand_dev(&m, R, 4, 1),
                    rstd = rand_dev(&m, R, 4, 1), partials = dalloc((size_t)KEMIT_PARTS * 3 * H * 4),
                    tpart = dalloc((size_t)KEMIT_PARTS * 2 * H * 4);
        int32_t *ids = malloc(R * 4), *tt = malloc(R * 4);
        for (int i = 0; i < R; i++) ids[i] = (int32_t)(rnd64() % 30522), tt[i] = (int32_t)(rnd64() % 2);
        CUdeviceptr dids = up_raw(ids, R * 4), dtt = up_raw(tt, R * 4);
        CUdeviceptr word = rand_dev(&m, (size_t)30522 * H, es, 1), pos = rand_dev(&m, (size_t)512 * H, es, 1),
                    type = rand_dev(&m, 2 * H, es, 1), gw = rand_dev(&m, (size_t)30522 * H, 4, 1),
                    gp = rand_dev(&m, (size_t)512 * H, 4, 1), gt = rand_dev(&m, 2 * H, 4, 1);
        static const unsigned grids[3] = {264, 512, 1024};
        for (int gi = 0; gi < 3; gi++) {
            unsigned grid = grids[gi];
            if (grid * (unsigned)rpb > (unsigned)R) continue;
            char name[64];
            void *b[] = {&x, &res, &partials, &y, &z, &mean, &rstd, &vec, &R, &p, &seed, &step, &salt, &zero};
            Launch lb = {"ln_bwd", {grid, 1}, {threads, rpb}, b};
            snprintf(name, sizeof name, "ln_bwd grid %u", grid);
            record(&m, name, time_median(&m, run_launch, &lb), 4.0 * n * es);
            void *e[] = {&gw, &gp, &gt, &partials, &tpart, &y, &dids, &dtt, &word, &pos, &type, &mean, &rstd, &vec,
                         &B, &L, &p, &seed, &step, &salt};
            Launch le = {"emb_bwd", {grid, 1}, {threads, rpb}, e};
            snprintf(name, sizeof name, "emb_bwd grid %u", grid);
            record(&m, name, time_median(&m, run_launch, &le), 4.0 * n * es + 1.0 * n * 8);
        }
        CUdeviceptr all[] = {x, res, y, z, vec, mean, rstd, partials, tpart, dids, dtt, word, pos, type, gw, gp, gt};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu->cuMemFree(all[i]);
        free(ids); free(tt);
        cu->cuModuleUnload(m.mod);
    }
}

static void time_copy(void)
{
    size_t bytes = (size_t)1 << 30;
    CUdeviceptr a = dalloc(bytes), b = dalloc(bytes);
    DRV(cu->cuMemsetD8Async(a, 0x3c, bytes, dev.stream));
    CUevent e0, e1;
    DRV(cu->cuEventCreate(&e0, 0));
    DRV(cu->cuEventCreate(&e1, 0));
    float ms[20];
    for (int i = 0; i < 23; i++) {
        DRV(cu->cuEventRecord(e0, dev.stream));
        DRV(cu->cuMemcpyDtoDAsync(b, a, bytes, dev.stream));
        DRV(cu->cuEventRecord(e1, dev.stream));
        DRV(cu->cuEventSynchronize(e1));
        if (i >= 3) DRV(cu->cuEventElapsedTime(&ms[i - 3], e0, e1));
    }
    qsort(ms, 20, sizeof ms[0], cmp_float);
    copy_gbs = 2.0 * bytes / (ms[10] * 1e-3) / 1e9;
    cu->cuEventDestroy(e0); cu->cuEventDestroy(e1);
    cu->cuMemFree(a); cu->cuMemFree(b);
}

/* ---- main ---------------------------------------------------------------- */

int main(void)
{
    HpcError err;
    const char *seed_env = getenv("HPC_TEST_SEED");
    uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)clock() << 20;
    rng_state = seed;
    if (cuda_device_open(&dev, 0, &err)) {
        fprintf(stderr, "gpu_kernels: %s\n", err.msg);
        return err.code == HPC_ERR_NO_GPU ? 77 : 1;
    }
    cu = cuda_driver();
    printf("gpu_kernels: %s (sm_%d, %d SMs), seed %llu (HPC_TEST_SEED to repeat)\n", dev.name, dev.arch,
           dev.sm_count, (unsigned long long)seed);
    bool timing = !getenv("HPC_GPU_TEST_NO_TIMING");
    static const char *labels[3][2] = {{"f32", "f32 causal"}, {"f16", "f16 causal"}, {"bf16", "bf16 causal"}};
    Mod mods[3];
    for (int d = 0; d < 3; d++) {
        Mod m = mod_build(bert_base((KemitDtype)d, false), labels[d][0]);
        Mod mc = mod_build(bert_base((KemitDtype)d, true), labels[d][1]);
        opt_mod_build(&m);
        if (d == 0) test_philox(&m);
        test_dropout(&m);
        test_layernorm(&m);
        test_embedding(&m);
        test_embedding(&mc);
        test_activations(&m);
        test_softmax(&m, 100);   /* L % 4 == 0: 4 keys a lane */
        test_softmax(&m, 77);    /* single keys */
        test_softmax(&mc, 100);
        test_softmax(&mc, 77);
        test_xent(&m, false, (int)m.kc.vocab);   /* rows at every 16-byte offset */
        test_xent(&m, true, (int)m.kc.vocab);
        test_xent(&m, false, 3);                 /* narrower than one vector */
        test_mse(&m, false);
        test_mse(&m, true);
        test_optimizer(&m, OPT_ADAMW, CUDA_OPT_GRAD_F32, false);
        test_optimizer(&m, OPT_ADAM, CUDA_OPT_GRAD_F32, false);
        test_optimizer(&m, OPT_SGD, CUDA_OPT_GRAD_F32, false);
        test_optimizer(&m, OPT_LAMB, CUDA_OPT_GRAD_F32, false);
        /* 16-bit gradients (a weight gradient as AMP keeps it), read directly and summed over micro-batches */
        test_optimizer(&m, OPT_ADAMW, CUDA_OPT_GRAD_F32, true);
        test_optimizer(&m, OPT_ADAMW, CUDA_OPT_GRAD_F16, true);
        test_optimizer(&m, OPT_ADAMW, CUDA_OPT_GRAD_F16, false);
        test_optimizer(&m, OPT_LAMB, CUDA_OPT_GRAD_BF16, true);
        test_optimizer(&m, OPT_SGD, CUDA_OPT_GRAD_BF16, false);
        cu->cuModuleUnload(mc.mod);
        mods[d] = m;
    }
    test_gemm_autotune(&mods[1], timing);
    if (timing) {
        time_copy();
        for (int d = 0; d < 3; d++) time_kernels(&mods[d]);
        if (getenv("HPC_GPU_TEST_TUNE")) time_row_variants();
        printf("\nTimings at B=32 L=128 H=768 (median of 50; GB/s = fewest bytes moved / time; "
               "device-to-device copy: %.0f GB/s)\n", copy_gbs);
        printf("%-44s %10s %10s %8s\n", "kernel", "ms", "GB/s", "of copy");
        for (int i = 0; i < n_timings; i++)
            printf("%-44s %10.4f %10.0f %7.0f%%\n", timings[i].name, timings[i].ms, timings[i].gbs,
                   100.0 * timings[i].gbs / copy_gbs);
    }
    for (int d = 0; d < 3; d++) {
        cu->cuModuleUnload(mods[d].mod);
        cu->cuModuleUnload(mods[d].opt_mod);
    }
    cuda_device_close(&dev);
    printf("\n%d of %d checks passed%s\n", checks - failures, checks, failures ? " — FAILURES above" : "");
    return failures ? 1 : 0;
}

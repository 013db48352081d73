/* tests/gpu/gpu_attention.c — the fused attention kernels
 * (compiler/kernels/attention.cu, SIMT version) against the cpu reference
 * composed from the unfused kernels (runtime/cpu/cpu_attention.h, f64), then
 * timings at B = 32 and 256, L = 128, BERT-base heads.
 *
 * Cases: fp16 and bf16; head size 64 (12 heads, BERT-base), 32 (12 heads,
 * MiniLM) and 128 (6 heads); L = 1, 7, 17, 32, 64, 65, 100, 127, 128, 512;
 * dropout 0 and 0.1; B = 3 batch
 * rows: row 0 without padding, row 1 with its last third padded, row 2
 * fully masked.  Q, K, V and dctx are random, rounded to the dtype on the
 * host, so kernel and reference read the same values; every output buffer
 * is poisoned with NaN (0xFF bytes) first, and a NaN or inf where the
 * reference is finite fails.
 *
 * Error = ||got - ref||_2 / ||ref||_2 per output.  Limits from the 16-bit
 * storage (u = 2^-11 fp16, 2^-8 bf16, the unit roundoff being u / 2):
 *   ctx 4 u: the kernel keeps everything in f32, so the final rounding
 *     (<= u / 2 per element) dominates; 4 u leaves room for f32 sums;
 *   dQ, dK, dV 16 u: they also carry the rounded ctx in delta = rowsum(dO*O)
 *     and the cancellation in dP - delta;
 *   lse 1e-5 (f32 output); rows the reference gives +inf (no visible key)
 *     must be +inf exactly.
 * The fully masked batch row must give ctx exactly 0 and no NaN anywhere.
 * Dropout bits: with V one-hot over windows of D keys, ctx reads out
 * Z = keep * P / (1 - p) key by key; every (head, query, key) of L = 7, 100
 * and 512 must be kept exactly when philox_dropout_keep says so.
 *
 * The forward is checked three times: attn_simt_fwd (whose ctx feeds the
 * backward's delta) and both tensor-core families, attn_mma_fwd (v1) and
 * attn_mma2_fwd (v2, the step's), against the same reference; the
 * gradients three times: attn_simt_bwd_dq/dkv,
 * attn_mma_bwd_dq/dkv and attn_mma2_bwd_dq/dkv; and the one-pass backward
 * attn_mma3_bwd (the step's default, L <= 128 and D <= 64; its delta from
 * the v2 forward's ctx, as in the step) at both register budgets (the
 * kernel and attn_mma3_bwd_r128), dQ, dK, dV each.  The per-(b, head)
 * delta attn_head_bwd_dot (the step's v3 phase above L 128) is held to
 * 1e-5 of attn_simt_bwd_dot's, and feeds the families' dQ/dK/dV checks.
 * attn_mma4_bwd (HPC_ATTN_KERNELS=v4: dS of every query in dynamic shared
 * memory, the step's default) the same way where the one-pass backward
 * runs.
 * With dropout and L <= 128, HPC_ATTN_KEEP=1's pair: attn_mma2_fwd_keep
 * (ctx, and its saved keep bits byte for byte against the cpu's draws) and
 * attn_mma3_bwd_keep and attn_mma4_bwd_keep reading them (dQ, dK, dV as
 * above).
 * At head size 128 v1's dQ kernels and attn_mma3_bwd do not exist (48 KiB
 * of shared memory), so there only the SIMT forward and v2 are checked.
 * The first-query kernels attn_first_fwd / attn_first_bwd (the last
 * layer under a first-token head) are checked in every case: ctx, lse, the
 * fully masked row, dQ, dK and dV against the reference's query 0.
 * Check counts: 3306 before the v4 kernel (H200, 2026-12-05), which adds
 * 3 a case where the one-pass backward runs (4 modules x 9 lengths x 2 p)
 * and 3 more for its keep pair (p 0.1): 3306 + 216 + 108 = 3630 (1494 on
 * the emulator with HPC_GPU_TEST_MAX_L=32, 2026-12-06).
 *
 * Output: one "ok"/"FAIL" line per check, timing lines per shape (simt,
 * mma, mma2, mma3 at both register budgets, mma4, the keep pairs of mma3
 * and mma4), then "N checks, M failed"; exit 1 on any failure, 77 without
 * a GPU.
 * HPC_TEST_SEED=N repeats a seed; HPC_GPU_TEST_NO_TIMING=1 skips timings;
 * HPC_GPU_TEST_MAX_L=N skips the cases longer than N (for tools/cuemu). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_attention.h"
#include "cpu/half.h"
#include "cpu/philox.h"
#include "cuda/cuda_driver.h"
#include "cuda/nvrtc_compile.h"
#include "emit_attention.h"

static const CudaDriver *cu;
static CudaDevice dev;
static int failures, checks;

static void die(const char *what, const HpcError *err)
{
    fprintf(stderr, "gpu_attention: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

#define DRV(call)                                   \
    do {                                            \
        HpcError e_;                                \
        if (CUDA_CHECK(&e_, call)) die(#call, &e_); \
    } while (0)

static uint64_t rng_state;
static uint64_t rnd64(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rnd_sym(float a) { return (float)(((double)(rnd64() >> 11) / 9007199254740992.0 * 2 - 1) * a); }

typedef struct {
    KemitDtype dt;
    int NH, D, H;
    CUmodule mod;
    char suffix[KEMIT_SUFFIX_MAX];
    char label[32];
} Mod;

static SpecPrecision prec(const Mod *m) { return m->dt == KEMIT_BF16 ? PREC_BF16 : PREC_FP16; }
static double unit(const Mod *m) { return m->dt == KEMIT_BF16 ? 1.0 / 256 : 1.0 / 2048; }

static Mod mod_build(KemitDtype dt, int heads, int head_dim)
{
    Mod m = {.dt = dt, .NH = heads, .D = head_dim, .H = heads * head_dim};
    snprintf(m.label, sizeof m.label, "%s D%d", kemit_dtype_name(dt), head_dim);
    ModelSpec spec;
    spec_defaults(&spec);
    spec.stack.hidden = m.H;
    spec.stack.heads = heads;
    KernelConfig kc;
    kemit_config_from_spec(&kc, &spec, dt);
    char *src;
    HpcError err;
    if (kemit_attention_source(&kc, &src, m.suffix, &err)) die("kemit_attention_source", &err);
    void *cubin;
    size_t size;
    if (nvrtc_compile(src, "gpu_attention", dev.arch, NULL, 0, &cubin, &size, NULL, &err)) die("nvrtc_compile", &err);
    free(src);
    DRV(cu->cuModuleLoadData(&m.mod, cubin));
    free(cubin);
    return m;
}

/* A launch with `shared` bytes of dynamic shared memory a block. */
static void launch_shared(const Mod *m, const char *base, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned shared, void **args)
{
    char name[128];
    kemit_name(m->suffix, base, name, sizeof name);
    CUfunction f;
    DRV(cu->cuModuleGetFunction(&f, m->mod, name));
    unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, 1, 1};
    HpcError err;
    if (cuda_func_allow_shared(f, shared, &err) || cuda_launch(f, grid, block, shared, dev.stream, args, &err))
        die(base, &err);
}

static void launch(const Mod *m, const char *base, unsigned gx, unsigned gy, unsigned gz, unsigned bx, void **args)
{
    launch_shared(m, base, gx, gy, gz, bx, 0, args);
}

static CUdeviceptr dalloc(size_t bytes)
{
    CUdeviceptr p;
    DRV(cu->cuMemAlloc(&p, bytes ? bytes : 4));
    DRV(cu->cuMemsetD8Async(p, 0xFF, bytes ? bytes : 4, dev.stream));   /* NaN in f32, f16 and bf16 */
    /* The plain copies below run on the legacy stream, which does not wait
     * for dev.stream (non-blocking): without this the poison could land
     * after the data (seen on the H200 as NaN inputs). */
    DRV(cu->cuStreamSynchronize(dev.stream));
    return p;
}

static CUdeviceptr up_st(const Mod *m, const float *x, size_t n)
{
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = prec_from_f32(prec(m), x[i]);
    CUdeviceptr p = dalloc(n * 2);
    DRV(cu->cuMemcpyHtoD(p, h, n * 2));
    DRV(cu->cuCtxSynchronize());   /* a pageable upload may still be in DMA when it returns */
    free(h);
    return p;
}

static float *down_st(const Mod *m, CUdeviceptr p, size_t n)
{
    uint16_t *h = malloc(n * 2);
    float *x = malloc(n * sizeof *x);
    DRV(cu->cuMemcpyDtoH(h, p, n * 2));
    for (size_t i = 0; i < n; i++) x[i] = prec_to_f32(prec(m), h[i]);
    free(h);
    return x;
}

/* Random (n) values in [-a, a], rounded to the dtype. */
static float *rand_st(const Mod *m, size_t n, float a)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = rnd_sym(a);
    prec_round_array(prec(m), x, (int64_t)n);
    return x;
}

static double *to_f64(const float *x, size_t n)
{
    double *d = malloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static void report(bool ok, const char *label, const char *what, double rel, double tol, const char *note)
{
    checks++;
    if (!ok) failures++;
    printf("%s  %-9s %-40s rel %.2e (limit %.1e)%s\n", ok ? "ok  " : "FAIL", label, what, rel, tol, note);
}

/* Norm-wise relative error of got[i * stride + c], c < width, i < rows,
 * against ref laid out the same; non-finite got where ref is finite fails. */
static void check_strided(const Mod *m, const char *what, const float *got, const double *ref, size_t rows,
                          size_t stride, size_t width, double tol)
{
    double num = 0, den = 0;
    size_t bad = 0;
    for (size_t i = 0; i < rows; i++)
        for (size_t c = 0; c < width; c++) {
            double g = got[i * stride + c], r = ref[i * stride + c];
            if (!isfinite(g) && isfinite(r)) bad++;
            num += (g - r) * (g - r);
            den += r * r;
        }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    report(bad == 0 && rel <= tol && isfinite(rel), m->label, what, rel, tol, bad ? " NON-FINITE OUTPUT" : "");
}

static void check_lse(const Mod *m, const char *what, const float *got, const double *ref, size_t n)
{
    double num = 0, den = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(ref[i])) {
            bad += !(isinf(got[i]) && got[i] > 0);
            continue;
        }
        if (!isfinite(got[i])) bad++;
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    report(bad == 0 && rel <= 1e-5 && isfinite(rel), m->label, what, rel, 1e-5, bad ? " WRONG INF/NAN ROWS" : "");
}

/* Mask of B rows: row 0 all keys, row 1 its first ceil(2L/3), row 2 none. */
static int32_t *make_mask(int B, int L)
{
    int32_t *mask = malloc((size_t)B * L * sizeof *mask);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < L; t++) mask[b * L + t] = b == 0 ? 1 : b == 1 ? (3 * t < 2 * L) : 0;
    return mask;
}

typedef struct {
    CUdeviceptr qkv, dctx, mask, ctx, lse, delta, dqkv;
    CUdeviceptr keep;   /* the keep bits: B x NH x L rows of KEEP_BYTES */
} Bufs;

/* compiler/kernels/attention_mma.cu's AT_KEEP_BYTES: keys 0 .. 127 of a query row */
enum { KEEP_BYTES = 16, KEEP_KEYS = 8 * KEEP_BYTES };

/* The forward kernels: the same arguments, 16 or 64 query rows per block.
 * FWD_MMA and FWD_MMA2 are the two tensor-core families (HPC_ATTN_KERNELS
 * v1 and v2 in the step); fam below is 0 for attn_mma_*, 1 for attn_mma2_*. */
typedef enum { FWD_SIMT, FWD_MMA, FWD_MMA2 } FwdKind;
static const char *const fwd_names[3] = {"attn_simt_fwd", "attn_mma_fwd", "attn_mma2_fwd"};
static const char *const fwd_tag[3] = {"simt", "mma", "mma2"};
static const char *const fam_tag[2] = {"mma", "mma2"};
static const char *const gname[3] = {"dQ", "dK", "dV"};   /* the gradients, in dqkv's column order */

/* v1's dQ kernels (SIMT and tensor-core) exist for head sizes up to 64. */
static bool has_v1_dq(const Mod *m) { return m->D <= 64; }

static void run_fwd_kind(FwdKind kind, const Mod *m, Bufs *d, int B, int L, float p, uint64_t seed, uint32_t step,
                         uint32_t salt)
{
    CUdeviceptr q = d->qkv, k = d->qkv + 2 * (size_t)m->H, v = d->qkv + 4 * (size_t)m->H;
    int ld = 3 * m->H;
    unsigned rows = kind == FWD_SIMT ? 16 : 64;
    void *args[] = {&d->ctx, &d->lse, &q, &k, &v, &ld, &d->mask, &B, &L, &p, &seed, &step, &salt};
    launch(m, fwd_names[kind], (unsigned)(L + rows - 1) / rows, (unsigned)m->NH, (unsigned)B, 128, args);
}

static void run_fwd(const Mod *m, Bufs *d, int B, int L, float p, uint64_t seed, uint32_t step, uint32_t salt)
{
    run_fwd_kind(FWD_SIMT, m, d, B, L, p, seed, step, salt);
}

static void run_bwd(const Mod *m, Bufs *d, int B, int L, float p, uint64_t seed, uint32_t step, uint32_t salt)
{
    CUdeviceptr q = d->qkv, k = d->qkv + 2 * (size_t)m->H, v = d->qkv + 4 * (size_t)m->H;
    CUdeviceptr dq = d->dqkv, dk = d->dqkv + 2 * (size_t)m->H, dv = d->dqkv + 4 * (size_t)m->H;
    int ld = 3 * m->H;
    void *a0[] = {&d->delta, &d->dctx, &d->ctx, &B, &L};
    launch(m, "attn_simt_bwd_dot", (unsigned)(((long long)B * L * m->NH + 3) / 4), 1, 1, 128, a0);
    void *a1[] = {&dq, &ld, &d->dctx, &q, &k, &v, &ld, &d->lse, &d->delta, &d->mask, &B, &L, &p, &seed, &step, &salt};
    launch(m, "attn_simt_bwd_dq", (unsigned)(L + 15) / 16, (unsigned)m->NH, (unsigned)B, 128, a1);
    void *a2[] = {&dk, &dv, &ld, &d->dctx, &q, &k, &v, &ld, &d->lse, &d->delta, &d->mask, &B, &L, &p, &seed, &step, &salt};
    launch(m, "attn_simt_bwd_dkv", (unsigned)(L + 31) / 32, (unsigned)m->NH, (unsigned)B, 32, a2);
}

/* delta = rowsum(dctx * ctx) alone. */
static void run_dot(const Mod *m, Bufs *d, int B, int L)
{
    void *a0[] = {&d->delta, &d->dctx, &d->ctx, &B, &L};
    launch(m, "attn_simt_bwd_dot", (unsigned)(((long long)B * L * m->NH + 3) / 4), 1, 1, 128, a0);
}

/* The tensor-core dQ kernel of family fam alone (delta and lse must be in place). */
static void run_mma_dq(int fam, const Mod *m, Bufs *d, int B, int L, float p, uint64_t seed, uint32_t step,
                       uint32_t salt)
{
    CUdeviceptr q = d->qkv, k = d->qkv + 2 * (size_t)m->H, v = d->qkv + 4 * (size_t)m->H, dq = d->dqkv;
    int ld = 3 * m->H;
    void *a[] = {&dq, &ld, &d->dctx, &q, &k, &v, &ld, &d->lse, &d->delta, &d->mask, &B, &L, &p, &seed, &step, &salt};
    char base[32];
    snprintf(base, sizeof base, "attn_%s_bwd_dq", fam_tag[fam]);
    launch(m, base, (unsigned)(L + 63) / 64, (unsigned)m->NH, (unsigned)B, 128, a);
}

static void run_mma_dkv(int fam, const Mod *m, Bufs *d, int B, int L, float p, uint64_t seed, uint32_t step,
                        uint32_t salt)
{
    CUdeviceptr q = d->qkv, k = d->qkv + 2 * (size_t)m->H, v = d->qkv + 4 * (size_t)m->H;
    CUdeviceptr dk = d->dqkv + 2 * (size_t)m->H, dv = d->dqkv + 4 * (size_t)m->H;
    int ld = 3 * m->H;
    void *a[] = {&dk, &dv, &ld, &d->dctx, &q, &k, &v, &ld, &d->lse, &d->delta, &d->mask, &B, &L, &p, &seed, &step, &salt};
    char base[32];
    snprintf(base, sizeof base, "attn_%s_bwd_dkv", fam_tag[fam]);
    launch(m, base, (unsigned)(L + 63) / 64, (unsigned)m->NH, (unsigned)B, 128, a);
}

/* The one-pass backward (v3 in the step): dQ, dK, dV from dctx, ctx and
 * lse (delta computed inside); grid (1, NH, B) x 256, L <= 128, D <= 64.
 * r128 takes the same body held to 128 registers. */
static bool has_mma3(const Mod *m, int L) { return m->D <= 64 && L <= 128; }
static void run_mma3(bool r128, const Mod *m, Bufs *d, int B, int L, float p, uint64_t seed, uint32_t step,
                     uint32_t salt)
{
    CUdeviceptr q = d->qkv, k = d->qkv + 2 * (size_t)m->H, v = d->qkv + 4 * (size_t)m->H;
    CUdeviceptr dq = d->dqkv, dk = d->dqkv + 2 * (size_t)m->H, dv = d->dqkv + 4 * (size_t)m->H;
    int ld = 3 * m->H;
    void *a[] = {&dq, &dk, &dv, &ld, &d->dctx, &d->ctx, &q, &k, &v, &ld, &d->lse, &d->mask, &B, &L, &p, &seed,
                 &step, &salt};
    launch(m, r128 ? "attn_mma3_bwd_r128" : "attn_mma3_bwd", 1, (unsigned)m->NH, (unsigned)B, 256, a);
}

/* attn_mma4_bwd (HPC_ATTN_KERNELS=v4): the one-pass backward with dS of
 * every query in dynamic shared memory; keep: reading d->keep
 * (attn_mma4_bwd_keep) instead of drawing.  Same grid and arguments as
 * run_mma3 / run_mma3_keep. */
static void run_mma4(bool keep, const Mod *m, Bufs *d, int B, int L, float p, uint64_t seed, uint32_t step,
                     uint32_t salt)
{
    CUdeviceptr q = d->qkv, k = d->qkv + 2 * (size_t)m->H, v = d->qkv + 4 * (size_t)m->H;
    CUdeviceptr dq = d->dqkv, dk = d->dqkv + 2 * (size_t)m->H, dv = d->dqkv + 4 * (size_t)m->H;
    int ld = 3 * m->H;
    void *a[] = {&dq, &dk, &dv, &ld, &d->dctx, &d->ctx, &q, &k, &v, &ld, &d->lse, &d->mask, &B, &L, &p, &seed,
                 &step, &salt, &d->keep};
    launch_shared(m, keep ? "attn_mma4_bwd_keep" : "attn_mma4_bwd", 1, (unsigned)m->NH, (unsigned)B, 256,
                  (unsigned)kemit_attn4_smem_bytes(m->D), a);
}

/* attn_mma2_fwd_keep: v2's forward, saving the dropout's keep bits in d->keep. */
static void run_fwd_keep(const Mod *m, Bufs *d, int B, int L, float p, uint64_t seed, uint32_t step, uint32_t salt)
{
    CUdeviceptr q = d->qkv, k = d->qkv + 2 * (size_t)m->H, v = d->qkv + 4 * (size_t)m->H;
    int ld = 3 * m->H;
    void *args[] = {&d->ctx, &d->lse, &q, &k, &v, &ld, &d->mask, &B, &L, &p, &seed, &step, &salt, &d->keep};
    launch(m, "attn_mma2_fwd_keep", (unsigned)(L + 63) / 64, (unsigned)m->NH, (unsigned)B, 128, args);
}

/* attn_mma3_bwd_keep: the one-pass backward reading d->keep instead of drawing. */
static void run_mma3_keep(const Mod *m, Bufs *d, int B, int L, float p, uint64_t seed, uint32_t step, uint32_t salt)
{
    CUdeviceptr q = d->qkv, k = d->qkv + 2 * (size_t)m->H, v = d->qkv + 4 * (size_t)m->H;
    CUdeviceptr dq = d->dqkv, dk = d->dqkv + 2 * (size_t)m->H, dv = d->dqkv + 4 * (size_t)m->H;
    int ld = 3 * m->H;
    void *a[] = {&dq, &dk, &dv, &ld, &d->dctx, &d->ctx, &q, &k, &v, &ld, &d->lse, &d->mask, &B, &L, &p, &seed,
                 &step, &salt, &d->keep};
    launch(m, "attn_mma3_bwd_keep", 1, (unsigned)m->NH, (unsigned)B, 256, a);
}

/* The one-pass backwards (L <= 128, D <= 64): v3's kernel at both register
 * budgets, v4's, and both reading the saved keep bits. */
typedef enum {
    ONE_PASS_MMA3, ONE_PASS_MMA3_R128, ONE_PASS_MMA4, ONE_PASS_MMA3_KEEP, ONE_PASS_MMA4_KEEP
} OnePassKind;
static const char *const one_pass_tag[] = {"mma3", "mma3 r128", "mma4", "mma3 keep", "mma4 keep"};
static void run_one_pass(OnePassKind kind, const Mod *m, Bufs *d, int B, int L, float p, uint64_t seed,
                         uint32_t step, uint32_t salt)
{
    switch (kind) {
    case ONE_PASS_MMA3: run_mma3(false, m, d, B, L, p, seed, step, salt); break;
    case ONE_PASS_MMA3_R128: run_mma3(true, m, d, B, L, p, seed, step, salt); break;
    case ONE_PASS_MMA4: run_mma4(false, m, d, B, L, p, seed, step, salt); break;
    case ONE_PASS_MMA3_KEEP: run_mma3_keep(m, d, B, L, p, seed, step, salt); break;
    case ONE_PASS_MMA4_KEEP: run_mma4(true, m, d, B, L, p, seed, step, salt); break;
    }
}

/* One-pass backward `kind` from d's inputs, its dQ, dK, dV (*dqkv, the
 * host copy, replaced) against the reference rg (B L x 3H, tolerance tol). */
static void check_one_pass(OnePassKind kind, const Mod *m, Bufs *d, int B, int L, float p, uint64_t seed,
                           uint32_t step, uint32_t salt, float **dqkv, const double *rg, double tol)
{
    size_t rows = (size_t)B * L, H = (size_t)m->H, nq = rows * 3 * H;
    DRV(cu->cuMemsetD8Async(d->dqkv, 0xFF, nq * 2, dev.stream));
    run_one_pass(kind, m, d, B, L, p, seed, step, salt);
    DRV(cu->cuStreamSynchronize(dev.stream));
    free(*dqkv);
    *dqkv = down_st(m, d->dqkv, nq);
    for (int g = 0; g < 3; g++) {
        char what[96];
        snprintf(what, sizeof what, "L%d p%.1f %s (%s bwd)", L, p, gname[g], one_pass_tag[kind]);
        check_strided(m, what, *dqkv + g * H, rg + g * H, rows, 3 * H, H, tol);
    }
}

/* The saved keep bits against the draws the cpu makes: byte j of query row r
 * holds the decisions of flat elements r L + 8 j .. + 7 (runtime/cpu/
 * cpu_exec_attention.inc writes the same), over the bytes of keys below L. */
static void check_keep_bits(const Mod *m, const Bufs *d, int B, int L, float p, uint64_t seed, uint32_t step,
                            uint32_t salt)
{
    size_t rows = (size_t)B * m->NH * L, bytes = (size_t)(L + 7) / 8, bad = 0;
    unsigned char *got = malloc(rows * KEEP_BYTES);
    DRV(cu->cuMemcpyDtoH(got, d->keep, rows * KEEP_BYTES));
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < bytes; j++) {
            unsigned want = 0;
            for (unsigned i = 0; i < 8; i++) {
                uint64_t f = (uint64_t)r * (uint64_t)L + 8 * j + i;
                want |= (philox_dropout_mask8(seed, f >> 3, step, salt, p) >> (f & 7) & 1u) << i;
            }
            bad += got[r * KEEP_BYTES + j] != want;
        }
    char what[64];
    snprintf(what, sizeof what, "L%d p%.1f keep bits (mma2 fwd)", L, p);
    report(bad == 0, m->label, what, (double)bad, 0, bad ? " BYTES DIFFER" : "");
    free(got);
}

/* The tensor-core backward of family fam: delta, then dQ and dK/dV. */
static void run_mma_bwd(int fam, const Mod *m, Bufs *d, int B, int L, float p, uint64_t seed, uint32_t step,
                        uint32_t salt)
{
    run_dot(m, d, B, L);
    run_mma_dq(fam, m, d, B, L, p, seed, step, salt);
    run_mma_dkv(fam, m, d, B, L, p, seed, step, salt);
}

static Bufs bufs_alloc(const Mod *m, int B, int L)
{
    size_t rows = (size_t)B * L;
    Bufs d = {
        .qkv = dalloc(rows * 3 * m->H * 2), .dctx = dalloc(rows * m->H * 2), .mask = dalloc(rows * 4),
        .ctx = dalloc(rows * m->H * 2), .lse = dalloc(rows * m->NH * 4), .delta = dalloc(rows * m->NH * 4),
        .dqkv = dalloc(rows * 3 * m->H * 2), .keep = dalloc(rows * m->NH * KEEP_BYTES),
    };
    return d;
}

static void bufs_free(Bufs *d)
{
    CUdeviceptr all[] = {d->qkv, d->dctx, d->mask, d->ctx, d->lse, d->delta, d->dqkv, d->keep};
    for (int i = 0; i < 8; i++) DRV(cu->cuMemFree(all[i]));
}

/* attn_first_fwd / attn_first_bwd (query 0 alone, the step's last layer
 * under a first-token head) on the case's inputs: ctx (B, H) and lse
 * (B, NH) against the reference's query 0, and dQ, dK, dV against the
 * reference backward whose dctx is zero past query 0 (so dQ past row 0 is
 * 0, which the NaN poison proves is written).  The backward reads the
 * first-query forward's own ctx and lse, as in the step. */
static void test_first_query(const Mod *m, Bufs *d, const float *qkv, const float *dctx, const int32_t *mask, int B,
                             int L, float p, uint64_t seed, uint32_t step, uint32_t salt)
{
    size_t H = (size_t)m->H, nq = (size_t)B * L * 3 * H, nc = (size_t)B * L * H, nl = (size_t)B * L * m->NH;
    CkAttnShape s = {.B = B, .L = L, .NH = m->NH, .D = m->D, .p = p, .seed = seed, .step = step, .salt = salt};
    double *q64 = to_f64(qkv, nq), *g0 = calloc(nc, 8);
    float *dctx0 = malloc((size_t)B * H * sizeof *dctx0);
    for (int b = 0; b < B; b++)
        for (size_t c = 0; c < H; c++) g0[(size_t)b * L * H + c] = dctx0[b * H + c] = dctx[(size_t)b * L * H + c];
    double *rc = malloc(nc * 8), *rl = malloc(nl * 8), *rg = calloc(nq, 8);
    ck_attention_fwd_f64(rc, rl, q64, q64 + H, q64 + 2 * H, 3 * (int64_t)H, mask, &s);
    ck_attention_bwd_f64(rg, rg + H, rg + 2 * H, 3 * (int64_t)H, g0, q64, q64 + H, q64 + 2 * H, 3 * (int64_t)H, mask,
                         &s);
    for (int b = 0; b < B; b++) {   /* query 0's rows, packed (B, H) and (B, NH) */
        memmove(rc + b * H, rc + (size_t)b * L * H, H * sizeof *rc);
        for (int h = 0; h < m->NH; h++) rl[b * m->NH + h] = rl[((size_t)b * m->NH + h) * L];
    }
    CUdeviceptr q = d->qkv, k = d->qkv + 2 * H, v = d->qkv + 4 * H, g = up_st(m, dctx0, (size_t)B * H);
    CUdeviceptr dq = d->dqkv, dk = d->dqkv + 2 * H, dv = d->dqkv + 4 * H;
    int ld = 3 * m->H;
    DRV(cu->cuMemsetD8Async(d->ctx, 0xFF, nc * 2, dev.stream));
    DRV(cu->cuMemsetD8Async(d->lse, 0xFF, nl * 4, dev.stream));
    DRV(cu->cuMemsetD8Async(d->dqkv, 0xFF, nq * 2, dev.stream));
    void *fa[] = {&d->ctx, &d->lse, &q, &k, &v, &ld, &d->mask, &B, &L, &p, &seed, &step, &salt};
    launch(m, "attn_first_fwd", 1, (unsigned)m->NH, (unsigned)B, 128, fa);
    void *ba[] = {&dq, &dk, &dv, &ld, &g, &d->ctx, &q, &k, &v, &ld, &d->lse, &d->mask, &B, &L, &p, &seed, &step, &salt};
    launch(m, "attn_first_bwd", 1, (unsigned)m->NH, (unsigned)B, 128, ba);
    DRV(cu->cuStreamSynchronize(dev.stream));
    float *ctx = down_st(m, d->ctx, (size_t)B * H), *dqkv = down_st(m, d->dqkv, nq);
    float *lse = malloc((size_t)B * m->NH * 4);
    DRV(cu->cuMemcpyDtoH(lse, d->lse, (size_t)B * m->NH * 4));
    char what[96];
    double u = unit(m);
    snprintf(what, sizeof what, "L%d p%.1f ctx (first query)", L, p);
    check_strided(m, what, ctx, rc, (size_t)B, H, H, 4 * u);
    snprintf(what, sizeof what, "L%d p%.1f lse (first query)", L, p);
    check_lse(m, what, lse, rl, (size_t)B * m->NH);
    size_t nonzero = 0;
    for (size_t i = 2 * H; i < 3 * H; i++) nonzero += ctx[i] != 0.0f;
    snprintf(what, sizeof what, "L%d p%.1f fully masked row is 0 (first query)", L, p);
    report(nonzero == 0, m->label, what, (double)nonzero, 0, nonzero ? " NONZERO CONTEXT" : "");
    for (int j = 0; j < 3; j++) {
        snprintf(what, sizeof what, "L%d p%.1f %s (first query)", L, p, gname[j]);
        check_strided(m, what, dqkv + j * H, rg + j * H, (size_t)B * L, 3 * H, H, 16 * u);
    }
    DRV(cu->cuMemFree(g));
    free(q64);
    free(g0);
    free(dctx0);
    free(rc);
    free(rl);
    free(rg);
    free(ctx);
    free(dqkv);
    free(lse);
}

/* Forward `kind` on d's inputs (B x L, mask: rows past 2 L of batch row 2
 * fully masked) against the reference ctx rc and lse rl: ctx, lse and the
 * fully masked rows' zeros; *ctx (the host copy) is replaced. */
static void check_forward(FwdKind kind, const Mod *m, Bufs *d, int B, int L, float p, uint64_t seed, uint32_t step,
                          uint32_t salt, float **ctx, float *lse, const double *rc, const double *rl)
{
    size_t rows = (size_t)B * L, H = (size_t)m->H, nc = rows * H, nl = rows * m->NH;
    double u = unit(m);
    char what[96];
    DRV(cu->cuMemsetD8Async(d->ctx, 0xFF, nc * 2, dev.stream));
    DRV(cu->cuMemsetD8Async(d->lse, 0xFF, nl * 4, dev.stream));
    run_fwd_kind(kind, m, d, B, L, p, seed, step, salt);
    DRV(cu->cuStreamSynchronize(dev.stream));
    free(*ctx);
    *ctx = down_st(m, d->ctx, nc);
    DRV(cu->cuMemcpyDtoH(lse, d->lse, nl * 4));
    snprintf(what, sizeof what, "L%d p%.1f ctx (%s fwd)", L, p, fwd_tag[kind]);
    check_strided(m, what, *ctx, rc, rows, H, H, 4 * u);
    snprintf(what, sizeof what, "L%d p%.1f lse (%s fwd)", L, p, fwd_tag[kind]);
    check_lse(m, what, lse, rl, nl);
    size_t nonzero = 0;
    for (size_t i = 2 * (size_t)L * H; i < nc; i++) nonzero += (*ctx)[i] != 0.0f;
    snprintf(what, sizeof what, "L%d p%.1f fully masked row is 0 (%s fwd)", L, p, fwd_tag[kind]);
    report(nonzero == 0, m->label, what, (double)nonzero, 0, nonzero ? " NONZERO CONTEXT" : "");
}

static void test_case(const Mod *m, int L, float p)
{
    const int B = 3;
    size_t rows = (size_t)B * L, H = (size_t)m->H, nq = rows * 3 * H, nc = rows * H, nl = rows * m->NH;
    uint64_t seed = rnd64();
    uint32_t step = (uint32_t)rnd64(), salt = (uint32_t)(rnd64() & 0xFFFF);
    float *qkv = rand_st(m, nq, 1.5f), *dctx = rand_st(m, nc, 1.0f);
    int32_t *mask = make_mask(B, L);
    Bufs d = bufs_alloc(m, B, L);
    CUdeviceptr t;
    t = up_st(m, qkv, nq);
    DRV(cu->cuMemcpyDtoD(d.qkv, t, nq * 2));
    DRV(cu->cuMemFree(t));
    t = up_st(m, dctx, nc);
    DRV(cu->cuMemcpyDtoD(d.dctx, t, nc * 2));
    DRV(cu->cuMemFree(t));
    DRV(cu->cuMemcpyHtoD(d.mask, mask, rows * 4));
    DRV(cu->cuCtxSynchronize());
    run_fwd(m, &d, B, L, p, seed, step, salt);
    if (has_v1_dq(m)) run_bwd(m, &d, B, L, p, seed, step, salt);
    else run_dot(m, &d, B, L);   /* the SIMT dQ kernel does not exist above D 64 */
    DRV(cu->cuStreamSynchronize(dev.stream));
    float *ctx = down_st(m, d.ctx, nc), *dqkv = down_st(m, d.dqkv, nq);
    float *lse = malloc(nl * 4);
    DRV(cu->cuMemcpyDtoH(lse, d.lse, nl * 4));
    char what[96];
    {   /* delta per (b, head) block (the step's v3 phase for L > 128) against attn_simt_bwd_dot's */
        float *dsimt = malloc(nl * 4), *dhead = malloc(nl * 4);
        DRV(cu->cuMemcpyDtoH(dsimt, d.delta, nl * 4));
        DRV(cu->cuMemsetD8Async(d.delta, 0xFF, nl * 4, dev.stream));
        int Bv = B, Lv = L;
        void *a[] = {&d.delta, &d.dctx, &d.ctx, &Bv, &Lv};
        launch(m, "attn_head_bwd_dot", 1, (unsigned)m->NH, (unsigned)B, 256, a);
        DRV(cu->cuStreamSynchronize(dev.stream));
        DRV(cu->cuMemcpyDtoH(dhead, d.delta, nl * 4));
        double *r = malloc(nl * 8);
        for (size_t i = 0; i < nl; i++) r[i] = dsimt[i];
        snprintf(what, sizeof what, "L%d p%.1f delta (head dot)", L, p);
        check_strided(m, what, dhead, r, nl, 1, 1, 1e-5);
        free(r);
        free(dsimt);
        free(dhead);
    }

    CkAttnShape s = {.B = B, .L = L, .NH = m->NH, .D = m->D, .p = p, .seed = seed, .step = step, .salt = salt};
    double *q64 = to_f64(qkv, nq), *g64 = to_f64(dctx, nc);
    double *rc = malloc(nc * 8), *rl = malloc(nl * 8), *rg = calloc(nq, 8);
    ck_attention_fwd_f64(rc, rl, q64, q64 + H, q64 + 2 * H, 3 * (int64_t)H, mask, &s);
    ck_attention_bwd_f64(rg, rg + H, rg + 2 * H, 3 * (int64_t)H, g64, q64, q64 + H, q64 + 2 * H, 3 * (int64_t)H, mask,
                         &s);
    double u = unit(m);
    snprintf(what, sizeof what, "L%d p%.1f ctx", L, p);
    check_strided(m, what, ctx, rc, rows, H, H, 4 * u);
    snprintf(what, sizeof what, "L%d p%.1f lse", L, p);
    check_lse(m, what, lse, rl, nl);
    for (int g = 0; g < 3 && has_v1_dq(m); g++) {
        snprintf(what, sizeof what, "L%d p%.1f %s", L, p, gname[g]);
        check_strided(m, what, dqkv + g * H, rg + g * H, rows, 3 * H, H, 16 * u);
    }
    size_t nonzero = 0;
    for (size_t i = 2 * (size_t)L * H; i < nc; i++) nonzero += ctx[i] != 0.0f;
    snprintf(what, sizeof what, "L%d p%.1f fully masked row is 0", L, p);
    report(nonzero == 0, m->label, what, (double)nonzero, 0, nonzero ? " NONZERO CONTEXT" : "");

    /* Both tensor-core families on the same inputs (P rounded to the dtype
     * before P V: still within 4 u, the rounding is u / 2 per term); v1
     * only where its dQ kernel exists. */
    for (int fam = has_v1_dq(m) ? 0 : 1; fam < 2; fam++) {
        check_forward(fam ? FWD_MMA2 : FWD_MMA, m, &d, B, L, p, seed, step, salt, &ctx, lse, rc, rl);

        /* The family's dQ, dK, dV from its own forward's lse and the delta
         * of the SIMT forward's ctx (computed above). */
        DRV(cu->cuMemsetD8Async(d.dqkv, 0xFF, nq * 2, dev.stream));
        run_mma_dq(fam, m, &d, B, L, p, seed, step, salt);
        run_mma_dkv(fam, m, &d, B, L, p, seed, step, salt);
        DRV(cu->cuStreamSynchronize(dev.stream));
        free(dqkv);
        dqkv = down_st(m, d.dqkv, nq);
        for (int g = 0; g < 3; g++) {
            snprintf(what, sizeof what, "L%d p%.1f %s (%s bwd)", L, p, gname[g], fam_tag[fam]);
            check_strided(m, what, dqkv + g * H, rg + g * H, rows, 3 * H, H, 16 * u);
        }
    }
    /* The one-pass backwards (v3's at both register budgets, v4's), from
     * v2's lse (left in d.lse by the last family above) and the same delta. */
    for (int kind = ONE_PASS_MMA3; kind <= ONE_PASS_MMA4 && has_mma3(m, L); kind++)
        check_one_pass((OnePassKind)kind, m, &d, B, L, p, seed, step, salt, &dqkv, rg, 16 * u);
    /* HPC_ATTN_KEEP=1's pair: v2's forward saving the keep bits (the same
     * ctx, and the bits the cpu draws), then the one-pass backward reading
     * them (the same gradients) */
    if (p > 0 && L <= KEEP_KEYS) {
        DRV(cu->cuMemsetD8Async(d.ctx, 0xFF, nc * 2, dev.stream));
        DRV(cu->cuMemsetD8Async(d.keep, 0xA5, (size_t)B * m->NH * L * KEEP_BYTES, dev.stream));
        run_fwd_keep(m, &d, B, L, p, seed, step, salt);
        DRV(cu->cuStreamSynchronize(dev.stream));
        free(ctx);
        ctx = down_st(m, d.ctx, nc);
        snprintf(what, sizeof what, "L%d p%.1f ctx (mma2 fwd keep)", L, p);
        check_strided(m, what, ctx, rc, rows, H, H, 4 * u);
        check_keep_bits(m, &d, B, L, p, seed, step, salt);
        for (int kind = ONE_PASS_MMA3_KEEP; kind <= ONE_PASS_MMA4_KEEP && has_mma3(m, L); kind++)
            check_one_pass((OnePassKind)kind, m, &d, B, L, p, seed, step, salt, &dqkv, rg, 16 * u);
    }
    test_first_query(m, &d, qkv, dctx, mask, B, L, p, seed, step, salt);
    bufs_free(&d);
    free(qkv);
    free(dctx);
    free(mask);
    free(ctx);
    free(dqkv);
    free(lse);
    free(q64);
    free(g64);
    free(rc);
    free(rl);
    free(rg);
}

/* The kernel's own dropout bits, read out through one-hot values. */
static void test_dropout_bits(FwdKind kind, const Mod *m, int L, float p)
{
    const int B = 1;
    size_t rows = (size_t)L, H = (size_t)m->H, nq = rows * 3 * H, nc = rows * H;
    uint64_t seed = rnd64();
    uint32_t step = (uint32_t)rnd64(), salt = (uint32_t)(rnd64() & 0xFFFF);
    float *qkv = rand_st(m, nq, 0.5f);
    int32_t *mask = make_mask(B, L);
    Bufs d = bufs_alloc(m, B, L);
    DRV(cu->cuMemcpyHtoD(d.mask, mask, rows * 4));
    DRV(cu->cuCtxSynchronize());
    size_t wrong = 0, kept = 0, total = 0;
    for (int t0 = 0; t0 < L; t0 += m->D) {
        for (size_t t = 0; t < rows; t++)
            for (size_t c = 0; c < H; c++) qkv[t * 3 * H + 2 * H + c] = (int)t - t0 == (int)(c % m->D) ? 1.0f : 0.0f;
        CUdeviceptr up = up_st(m, qkv, nq);
        DRV(cu->cuMemcpyDtoD(d.qkv, up, nq * 2));
        DRV(cu->cuCtxSynchronize());   /* the legacy-stream copy before dev.stream's kernel */
        DRV(cu->cuMemFree(up));
        run_fwd_kind(kind, m, &d, B, L, p, seed, step, salt);
        DRV(cu->cuStreamSynchronize(dev.stream));
        float *ctx = down_st(m, d.ctx, nc);
        for (int h = 0; h < m->NH; h++)
            for (int q = 0; q < L; q++)
                for (int j = 0; j < m->D && t0 + j < L; j++) {
                    uint64_t idx = ((uint64_t)h * L + q) * L + t0 + j;
                    bool want = philox_dropout_keep(seed, idx, step, salt, p);
                    float z = ctx[(size_t)q * H + h * m->D + j];
                    bool got = z != 0.0f;
                    wrong += want != got || !isfinite(z);
                    kept += got;
                    total++;
                }
        free(ctx);
    }
    char what[96], note[96];
    snprintf(what, sizeof what, "L%d p%.1f %s dropout bits (%zu/%zu kept)", L, p, fwd_tag[kind], kept, total);
    snprintf(note, sizeof note, wrong ? " %zu BITS DIFFER" : "", wrong);
    report(wrong == 0, m->label, what, (double)wrong, 0, note);
    bufs_free(&d);
    free(qkv);
    free(mask);
}

/* Milliseconds one launch of one-pass backward kind takes on dev.stream:
 * after 3 launches to warm up, the mean of iters launches, each timed alone
 * between events e0 and e1. */
static float mean_launch_ms(OnePassKind kind, const Mod *m, Bufs *d, int B, int L, float p, uint64_t seed,
                            uint32_t step, uint32_t salt, CUevent e0, CUevent e1, int iters)
{
    float ms = 0;
    for (int i = -3; i < iters; i++) {
        if (i >= 0) DRV(cu->cuEventRecord(e0, dev.stream));
        run_one_pass(kind, m, d, B, L, p, seed, step, salt);
        if (i < 0) continue;
        float a;
        DRV(cu->cuEventRecord(e1, dev.stream));
        DRV(cu->cuEventSynchronize(e1));
        DRV(cu->cuEventElapsedTime(&a, e0, e1));
        ms += a;
    }
    return ms / iters;
}

static void timing(const Mod *m, int B, int L)
{
    float p = 0.1f;
    uint64_t seed = 1;
    uint32_t step = 2, salt = 3;
    size_t rows = (size_t)B * L;
    Bufs d = bufs_alloc(m, B, L);
    float *qkv = rand_st(m, rows * 3 * m->H, 1.0f);
    CUdeviceptr up = up_st(m, qkv, rows * 3 * m->H);
    DRV(cu->cuMemcpyDtoD(d.qkv, up, rows * 3 * m->H * 2));
    DRV(cu->cuMemcpyDtoD(d.dctx, up, rows * m->H * 2));
    DRV(cu->cuMemFree(up));
    free(qkv);
    int32_t *mask = malloc(rows * 4);
    for (size_t i = 0; i < rows; i++) mask[i] = 1;
    DRV(cu->cuMemcpyHtoD(d.mask, mask, rows * 4));
    DRV(cu->cuCtxSynchronize());
    free(mask);
    CUevent e0, e1, e2;
    DRV(cu->cuEventCreate(&e0, CU_EVENT_DEFAULT));
    DRV(cu->cuEventCreate(&e1, CU_EVENT_DEFAULT));
    DRV(cu->cuEventCreate(&e2, CU_EVENT_DEFAULT));
    for (int i = 0; i < 3; i++) {
        run_fwd(m, &d, B, L, p, seed, step, salt);
        run_bwd(m, &d, B, L, p, seed, step, salt);
    }
    const int iters = 20;
    float fwd_ms = 0, bwd_ms = 0;
    for (int i = 0; i < iters; i++) {
        float a, b;
        DRV(cu->cuEventRecord(e0, dev.stream));
        run_fwd(m, &d, B, L, p, seed, step, salt);
        DRV(cu->cuEventRecord(e1, dev.stream));
        run_bwd(m, &d, B, L, p, seed, step, salt);
        DRV(cu->cuEventRecord(e2, dev.stream));
        DRV(cu->cuEventSynchronize(e2));
        DRV(cu->cuEventElapsedTime(&a, e0, e1));
        DRV(cu->cuEventElapsedTime(&b, e1, e2));
        fwd_ms += a;
        bwd_ms += b;
    }
    fwd_ms /= iters;
    bwd_ms /= iters;
    /* The matrix products of attention: QK^T and PV forward (4 B NH L^2 D),
     * twice that backward (dV, dP, dQ, dK), recomputation not counted. */
    double f = 4.0 * B * m->NH * (double)L * L * m->D;
    printf("timing  %-9s B%d L%d NH%d p0.1: simt fwd %.3f ms (%.1f TFLOP/s), simt bwd %.3f ms (%.1f TFLOP/s)\n",
           m->label, B, L, m->NH, fwd_ms, f / fwd_ms * 1e-9, bwd_ms, 2 * f / bwd_ms * 1e-9);
    for (int fam = 0; fam < 2; fam++) {
        float mma_ms = 0, mbwd_ms = 0;
        for (int i = 0; i < 3; i++) {   /* warm-up */
            run_fwd_kind(fam ? FWD_MMA2 : FWD_MMA, m, &d, B, L, p, seed, step, salt);
            run_mma_bwd(fam, m, &d, B, L, p, seed, step, salt);
        }
        for (int i = 0; i < iters; i++) {
            float a, b;
            DRV(cu->cuEventRecord(e0, dev.stream));
            run_fwd_kind(fam ? FWD_MMA2 : FWD_MMA, m, &d, B, L, p, seed, step, salt);
            DRV(cu->cuEventRecord(e1, dev.stream));
            run_mma_bwd(fam, m, &d, B, L, p, seed, step, salt);
            DRV(cu->cuEventRecord(e2, dev.stream));
            DRV(cu->cuEventSynchronize(e2));
            DRV(cu->cuEventElapsedTime(&a, e0, e1));
            DRV(cu->cuEventElapsedTime(&b, e1, e2));
            mma_ms += a;
            mbwd_ms += b;
        }
        mma_ms /= iters;
        mbwd_ms /= iters;
        printf("timing  %-9s B%d L%d NH%d p0.1: %-4s fwd %.3f ms (%.1f TFLOP/s), %-4s bwd %.3f ms (%.1f TFLOP/s); "
               "fwd+bwd %.3f ms\n", m->label, B, L, m->NH, fam_tag[fam], mma_ms, f / mma_ms * 1e-9, fam_tag[fam],
               mbwd_ms, 2 * f / mbwd_ms * 1e-9, mma_ms + mbwd_ms);
    }
    /* The step's backwards: v3's one-pass kernel, delta inside, at both
     * register budgets, and v4's (the default); then the step's own pairs
     * (HPC_ATTN_KEEP, the default) reading the keep bits the forward saved:
     * v3's and v4's.
     * TFLOP/s as above (4 products counted); "executed" counts the 5 it
     * computes (S, dP, dV, dK, dQ; v2 computes 7). */
    if (has_mma3(m, L)) {
        run_fwd_keep(m, &d, B, L, p, seed, step, salt);
        for (int kind = ONE_PASS_MMA3; kind <= ONE_PASS_MMA4_KEEP; kind++) {
            if (kind >= ONE_PASS_MMA3_KEEP && L > KEEP_KEYS) break;
            float ms = mean_launch_ms((OnePassKind)kind, m, &d, B, L, p, seed, step, salt, e0, e1, iters);
            printf("timing  %-9s B%d L%d NH%d p0.1: %s bwd %.3f ms (%.1f TFLOP/s counted as above, %.1f executed)\n",
                   m->label, B, L, m->NH, one_pass_tag[kind], ms, 2 * f / ms * 1e-9, 2.5 * f / ms * 1e-9);
        }
    }
    DRV(cu->cuEventDestroy(e0));
    DRV(cu->cuEventDestroy(e1));
    DRV(cu->cuEventDestroy(e2));
    bufs_free(&d);
}

int main(void)
{
    HpcError err;
    const char *seed_env = getenv("HPC_TEST_SEED");
    uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)clock() << 20;
    rng_state = seed;
    if (cuda_device_open(&dev, 0, &err)) {
        fprintf(stderr, "gpu_attention: %s\n", err.msg);
        return err.code == HPC_ERR_NO_GPU ? 77 : 1;
    }
    cu = cuda_driver();
    printf("gpu_attention: %s (sm_%d), seed %llu (HPC_TEST_SEED to repeat)\n", dev.name, dev.arch,
           (unsigned long long)seed);
    static const int lengths[] = {1, 7, 17, 32, 64, 65, 100, 127, 128, 512};
    enum { NMODS = 6 };
    Mod mods[NMODS] = {
        mod_build(KEMIT_F16, 12, 64), mod_build(KEMIT_BF16, 12, 64), mod_build(KEMIT_F16, 12, 32),
        mod_build(KEMIT_BF16, 12, 32), mod_build(KEMIT_F16, 6, 128), mod_build(KEMIT_BF16, 6, 128),
    };
    /* HPC_GPU_TEST_MAX_L=N leaves out the cases longer than N (the CUDA
     * emulator, tools/cuemu, would take hours over L 512); all by default */
    const char *max_env = getenv("HPC_GPU_TEST_MAX_L");
    int max_l = max_env ? atoi(max_env) : 1 << 30;
    for (int i = 0; i < NMODS; i++)
        for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
            if (lengths[l] > max_l) continue;
            test_case(&mods[i], lengths[l], 0.0f);
            test_case(&mods[i], lengths[l], 0.1f);
        }
    static const int bits_lengths[] = {7, 100, 512};
    for (int i = 0; i < 4; i += 3)
        for (int kind = FWD_SIMT; kind <= FWD_MMA2; kind++)
            for (int l = 0; l < 3; l++)
                if (bits_lengths[l] <= max_l) test_dropout_bits((FwdKind)kind, &mods[i], bits_lengths[l], 0.1f);
    if (!getenv("HPC_GPU_TEST_NO_TIMING")) {
        timing(&mods[0], 32, 128);
        timing(&mods[0], 256, 128);
    }
    for (int i = 0; i < NMODS; i++) DRV(cu->cuModuleUnload(mods[i].mod));
    cuda_device_close(&dev);
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}

/* tests/gpu/gpu_check.h — the harness every GPU test program shares
 * (plain C programs run by `make test-gpu`; no Criterion on the GPU machine).
 *
 * Promises, for a program that includes it once (one translation unit):
 *   - result(ok, fmt, ...) prints one line "ok  " or "FAIL", a gap and the
 *     message, and counts it in g_checks / g_failures (the lead's scripts grep
 *     these lines);  gpu_check_gap is the gap ("  "; gpu_lnfuse prints one
 *     space) and gpu_check_flush set makes every line flush stdout at once
 *     (the programs that print from long runs set it);
 *   - gpu_check_summary() prints the last line "N checks, M failed" and
 *     returns the exit status, 1 on any failure, else 0;
 *   - gpu_check_open_device(prog, dev) opens device 0; without a usable GPU
 *     it prints "PROG: no usable GPU: why" and returns 0 (the caller exits 4,
 *     the no-GPU status of these programs); gpu_check_open_sm90(prog, what,
 *     dev) the same for checks of sm_90a code (wgmma, TMA, clusters): 0 also
 *     on another architecture, and on success the "PROG on NAME" line;
 *     gpu_check_load_sm90a(src, name) compiles a probe's source for sm_90a
 *     and loads it (NVRTC's log and exit 1 on a failure);
 *   - gpu_check_rel_l2 / gpu_check_rel_l2_floor: ||got - ref||_2 / ||ref||_2
 *     in f64, the first falling back to ||got - ref|| when ref is all zero,
 *     the second dividing by max(||ref||, floor_norm); a NaN anywhere gives
 *     NaN, which fails every `err <= tol` check;
 *   - DRV(call): a driver call that must succeed; otherwise a FAIL line with
 *     the call and the driver's message, and exit 1 (the checks after it
 *     would only repeat the failure); gpu_check_die(what, err) the same for
 *     a failed hpc call;
 *   - gpu_check_xorshift(&state): one xorshift64 step (the fixed-seed data
 *     generators of the step tests; each keeps its own seed and bits) and
 *     gpu_check_uniform24(bits) maps 24 random bits onto [-1, 1);
 *   - gpu_check_seconds(): a monotonic clock in seconds, for the lines that
 *     say where a long program's time went.
 * Everything is static: include it in the test's .c, nothing to link. */
#ifndef HPC_TESTS_GPU_CHECK_H
#define HPC_TESTS_GPU_CHECK_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda/cuda_driver.h"
#include "cuda/nvrtc_compile.h"

static int g_failures, g_checks;
static const char *gpu_check_gap = "  ";
static int gpu_check_flush;

static inline void result(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void result(int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s%s", ok ? "ok  " : "FAIL", gpu_check_gap);
    vprintf(fmt, ap);
    putchar('\n');
    va_end(ap);
    if (gpu_check_flush) fflush(stdout);
    g_checks++;
    g_failures += !ok;
}

static inline int gpu_check_summary(void)
{
    printf("%d checks, %d failed\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}

static inline void gpu_check_die(const char *what, const HpcError *err)
{
    printf("FAIL  %s: %s\n", what, err->msg);
    exit(1);
}

#define DRV(call)                                                                                            \
    do {                                                                                                     \
        HpcError e_ = {0};                                                                                   \
        if (CUDA_CHECK(&e_, call)) gpu_check_die(#call, &e_);                                                \
    } while (0)

/* 1 when device 0 is open in *dev; 0 (and the reason printed) without one. */
static inline int gpu_check_open_device(const char *prog, CudaDevice *dev)
{
    HpcError err = {0};
    if (cuda_device_open(dev, 0, &err)) {
        printf("%s: no usable GPU: %s\n", prog, err.msg);
        return 0;
    }
    return 1;
}

/* src compiled by NVRTC for sm_90a (the architecture-specific target
 * wgmma and clusters need) and loaded as a module. */
static inline CUmodule gpu_check_load_sm90a(const char *src, const char *name)
{
    const char *opts[] = {"--gpu-architecture=sm_90a"};
    void *cubin;
    size_t size;
    char *log = NULL;
    HpcError err = {0};
    if (nvrtc_compile(src, name, 90, opts, 1, &cubin, &size, &log, &err)) {
        printf("%s\n", log ? log : "");
        gpu_check_die("nvrtc_compile", &err);
    }
    free(log);
    CUmodule mod;
    DRV(cuda_driver()->cuModuleLoadData(&mod, cubin));
    free(cubin);
    return mod;
}

/* The same for a check of `what` (wgmma, clusters), which needs sm_90. */
static inline int gpu_check_open_sm90(const char *prog, const char *what, CudaDevice *dev)
{
    if (!gpu_check_open_device(prog, dev)) return 0;
    if (dev->arch != 90) {
        printf("%s: %s needs an sm_90 GPU; this is sm_%d\n", prog, what, dev->arch);
        return 0;
    }
    printf("%s on %s (sm_%d)\n", prog, dev->name, dev->arch);
    return 1;
}

static inline double gpu_check_rel_l2(const float *got, const float *ref, int64_t n)
{
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = (double)got[i] - ref[i];
        d += e * e;
        r += (double)ref[i] * ref[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

/* The floor keeps tiny reference vectors (a gradient ~1e-3 of the largest)
 * from turning rounding noise into a large relative error. */
static inline double gpu_check_rel_l2_floor(const float *got, const float *ref, int64_t n, double floor_norm)
{
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = (double)got[i] - ref[i];
        d += e * e;
        r += (double)ref[i] * ref[i];
    }
    return sqrt(d) / fmax(sqrt(r), floor_norm);
}

/* The same against an f64 reference (a host GEMM or reduction computed in
 * double); floor 0 means none, so a zero reference with any error is inf. */
static inline double gpu_check_rel_l2_f64(const float *got, const double *ref, int64_t n, double floor_norm)
{
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = (double)got[i] - ref[i];
        d += e * e;
        r += ref[i] * ref[i];
    }
    return sqrt(d) / fmax(sqrt(r), floor_norm);
}

static inline uint64_t gpu_check_xorshift(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

static inline float gpu_check_uniform24(uint32_t bits24)
{
    return (float)bits24 * (2.0f / 16777216.0f) - 1.0f;
}

static inline double gpu_check_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#endif

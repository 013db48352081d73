/* runtime/cpu/cpu_fast_gelu.c — see cpu_fast_gelu.h.  libmvec is looked up
 * with dlopen once (pthread_once), so a libc without it only loses speed. */
#include "cpu/cpu_fast_gelu.h"

#include <dlfcn.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>

#include "program/activations.h"
#include "cpu/cpu_kernels.h"
#include "cpu/cpu_threads.h"

typedef __m256d (*VecFn)(__m256d);

static VecFn vec_erf, vec_exp;
static pthread_once_t vec_once = PTHREAD_ONCE_INIT;

static void vec_load(void)
{
    if (!__builtin_cpu_supports("avx2") || getenv("HPC_FAST_GEMM_PORTABLE")) return;
    void *lib = dlopen("libmvec.so.1", RTLD_NOW | RTLD_LOCAL);   /* kept open: the pointers live on */
    if (!lib) return;
    VecFn e = (VecFn)dlsym(lib, "_ZGVdN4v_erf"), x = (VecFn)dlsym(lib, "_ZGVdN4v_exp");
    if (e && x) vec_erf = e, vec_exp = x;
}

bool fast_gelu_vectorised(void)
{
    pthread_once(&vec_once, vec_load);
    return vec_erf != NULL;
}

typedef struct { float *out; const float *x, *dy; } GeluJob;

/* Below this x, 1 + erf(x / sqrt 2) (< 6.4e-5) cancels so much that a few
 * double ulps of erf show in the float result, which the scalar reference
 * has with its own erf: such groups of four (and NaN) take the reference. */
#define GELU_VEC_MIN (-4.0)

/* Whether all four lanes are >= GELU_VEC_MIN (false for NaN). */
__attribute__((target("avx2"))) static inline bool lanes_ok(__m256d x)
{
    return _mm256_movemask_pd(_mm256_cmp_pd(x, _mm256_set1_pd(GELU_VEC_MIN), _CMP_GE_OQ)) == 0xF;
}

/* 0.5 x (1 + erf(x / sqrt 2)), four lanes; the tail goes to the reference. */
__attribute__((target("avx2"))) static void gelu_fwd_range(void *ctx, int64_t s, int64_t e)
{
    const GeluJob *j = ctx;
    const __m256d half = _mm256_set1_pd(0.5), one = _mm256_set1_pd(1.0), r2 = _mm256_set1_pd(ACT_SQRT1_2);
    int64_t i = s;
    for (; i + 4 <= e; i += 4) {
        __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(j->x + i));
        if (!lanes_ok(x)) {
            ck_act_fwd_f32(act_ref_gelu, j->out + i, j->x + i, 4);
            continue;
        }
        __m256d erf = vec_erf(_mm256_mul_pd(x, r2));
        __m256d y = _mm256_mul_pd(_mm256_mul_pd(half, x), _mm256_add_pd(one, erf));
        _mm_storeu_ps(j->out + i, _mm256_cvtpd_ps(y));
    }
    ck_act_fwd_f32(act_ref_gelu, j->out + i, j->x + i, e - i);
}

/* dx += dy * (0.5 (1 + erf(x / sqrt 2)) + x / sqrt(2 pi) exp(-0.5 x x)). */
__attribute__((target("avx2"))) static void gelu_bwd_range(void *ctx, int64_t s, int64_t e)
{
    const GeluJob *j = ctx;
    const __m256d half = _mm256_set1_pd(0.5), one = _mm256_set1_pd(1.0), r2 = _mm256_set1_pd(ACT_SQRT1_2),
                  k = _mm256_set1_pd(ACT_INV_SQRT_2PI), mhalf = _mm256_set1_pd(-0.5);
    int64_t i = s;
    for (; i + 4 <= e; i += 4) {
        __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(j->x + i));
        if (!lanes_ok(x)) {
            ck_act_bwd_f32(act_grad_ref_gelu, j->out + i, j->dy + i, j->x + i, 4);
            continue;
        }
        __m256d cdf = _mm256_mul_pd(half, _mm256_add_pd(one, vec_erf(_mm256_mul_pd(x, r2))));
        __m256d pdf = vec_exp(_mm256_mul_pd(_mm256_mul_pd(mhalf, x), x));
        __m256d g = _mm256_add_pd(cdf, _mm256_mul_pd(_mm256_mul_pd(x, k), pdf));
        __m256d dy = _mm256_cvtps_pd(_mm_loadu_ps(j->dy + i));
        __m128 add = _mm256_cvtpd_ps(_mm256_mul_pd(dy, g));
        _mm_storeu_ps(j->out + i, _mm_add_ps(_mm_loadu_ps(j->out + i), add));
    }
    ck_act_bwd_f32(act_grad_ref_gelu, j->out + i, j->dy + i, j->x + i, e - i);
}

static void ref_fwd_range(void *ctx, int64_t s, int64_t e)
{
    const GeluJob *j = ctx;
    ck_act_fwd_f32(act_ref_gelu, j->out + s, j->x + s, e - s);
}

static void ref_bwd_range(void *ctx, int64_t s, int64_t e)
{
    const GeluJob *j = ctx;
    ck_act_bwd_f32(act_grad_ref_gelu, j->out + s, j->dy + s, j->x + s, e - s);
}

void fast_gelu_fwd(float *y, const float *x, int64_t n)
{
    GeluJob j = {.out = y, .x = x};
    cpu_parallel_for(n, 4096, fast_gelu_vectorised() ? gelu_fwd_range : ref_fwd_range, &j);
}

void fast_gelu_bwd(float *dx, const float *dy, const float *x, int64_t n)
{
    GeluJob j = {.out = dx, .x = x, .dy = dy};
    cpu_parallel_for(n, 4096, fast_gelu_vectorised() ? gelu_bwd_range : ref_bwd_range, &j);
}

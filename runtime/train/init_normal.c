/* runtime/train/init_normal.c — see init_normal.h. */
#include "train/init_normal.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "train/init.h"
#include "train/init_normal_guard.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Philox constants, as in runtime/cpu/philox.c. */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* Step reserved for init in philox_normal. */
#define INIT_STEP 0xFFFFFFFFu

enum { BLOCK = 64 };

/* The same double expression as philox_normal, then the init's scale:
 * the reference every fast value must equal. */
static float normal_exact(uint32_t x0, uint32_t x1)
{
    double u1 = ((x0 >> 8) + 1.0) / 16777217.0;
    double u2 = (x1 >> 8) / 16777216.0;
    float z = (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
    return (float)(INIT_STD * z);
}

/* cos and sin of 2 pi h / 2^14 for h < 2^12 (a quarter turn), from libm
 * once per process. */
enum { COARSE = 1 << 12 };
static double coarse_cos[COARSE + 1], coarse_sin[COARSE + 1];
static pthread_once_t coarse_once = PTHREAD_ONCE_INIT;
static bool use_avx2;   /* the cpu has AVX2 and HPC_INIT_AVX2 is not "0" (set once, with the table) */

static void coarse_fill(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    const char *off = getenv("HPC_INIT_AVX2");
    use_avx2 = __builtin_cpu_supports("avx2") && !(off && strcmp(off, "0") == 0);
#endif
    for (int h = 0; h <= COARSE; h++) {
        double angle = 6.283185307179586477 * ((double)h / (1 << 14));
        coarse_cos[h] = cos(angle);
        coarse_sin[h] = sin(angle);
    }
}

/* cos(2 pi b / 2^24) for b < 2^24: the quadrant from b's top two bits,
 * a coarse angle A from the next 12 (table) and a fine angle d < 2 pi 2^-14
 * from the last 10: cos(A + d) = cos A cos d - sin A sin d with Taylor
 * series of cos d to d^6 and sin d to d^7 (remainders < 1e-25). */
static inline double fast_cos_turn(uint32_t b)
{
    uint32_t q = b >> 22, h = (b >> 10) & 0xFFFu, t = b & 0x3FFu;
    double d = (double)t * (6.283185307179586477 / 16777216.0), d2 = d * d;
    double cd = 1.0 + d2 * (-0.5 + d2 * (1.0 / 24 + d2 * (-1.0 / 720)));
    double sd = d * (1.0 + d2 * (-1.0 / 6 + d2 * (1.0 / 120 + d2 * (-1.0 / 5040))));
    double c = coarse_cos[h] * cd - coarse_sin[h] * sd;  /* cos of the angle within the quadrant */
    double s = coarse_sin[h] * cd + coarse_cos[h] * sd;  /* its sin */
    switch (q) {
    case 0: return c;
    case 1: return -s;
    case 2: return -c;
    default: return s;
    }
}

double init_normal_cos_fast(uint32_t b)
{
    pthread_once(&coarse_once, coarse_fill);
    return fast_cos_turn(b);
}
double init_normal_cos_exact(uint32_t b) { return cos(2.0 * M_PI * (b / 16777216.0)); }

/* Fast cosine with a rounding guard.  The radius r < 5.8 is libm's, as in
 * philox_normal; the exact product v = r c lies within delta of the fast
 * one, since |c_fast - c_libm| <= INIT_NORMAL_C_ERR (tests/test_init_normal.c
 * checks all 2^24 cosines) and each product rounds by at most 2^-53 |v|.
 * If both ends of [v - delta, v + delta] round to the same float, that is
 * the exact float; otherwise (about 1 value in 10^6) take the exact path. */
static void normals_from_words(const uint32_t *x0, const uint32_t *x1, int n, float *out)
{
    /* In passes over the block, so that the libm calls, the square roots and
     * the cosines of different elements overlap instead of one long chain. */
    double r[BLOCK];
    for (int k = 0; k < n; k++) r[k] = -2.0 * log(((x0[k] >> 8) + 1.0) / 16777217.0);
    for (int k = 0; k < n; k++) r[k] = sqrt(r[k]);  /* r >= 0: no errno path taken */
    for (int k = 0; k < n; k++) {
        double v = r[k] * fast_cos_turn(x1[k] >> 8);
        const double delta = 2.0 * 6.0 * INIT_NORMAL_C_ERR + 1e-15 * fabs(v);
        float lo = (float)(v - delta), hi = (float)(v + delta);
        out[k] = lo == hi ? (float)(INIT_STD * lo) : normal_exact(x0[k], x1[k]);
    }
}

/* Words x[0], x[1] of the draws at counters {first + k, step, salt}, k < n <= BLOCK,
 * one lane at a time (the reference the vector path must match). */
static void draws_scalar(uint64_t seed, uint32_t salt, uint64_t first, int n,
                         uint32_t *x0, uint32_t *x1)
{
    for (int k = 0; k < n; k++) {
        uint64_t idx = first + (uint64_t)k;
        uint32_t c0 = (uint32_t)idx, c1 = (uint32_t)(idx >> 32), c2 = INIT_STEP, c3 = salt;
        uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
        for (int r = 0; r < 10; r++) {
            if (r > 0) { k0 += PHILOX_W0; k1 += PHILOX_W1; }
            uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n1 = (uint32_t)p1;
            uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1, n3 = (uint32_t)p0;
            c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        }
        x0[k] = c0;
        x1[k] = c1;
    }
}

#if defined(__SSE2__)
/* Low and high 32 bits of the four products a[l] * m (unsigned 32 x 32 -> 64). */
static inline void mul_lo_hi(__m128i a, __m128i m, __m128i *lo, __m128i *hi)
{
    __m128i even = _mm_mul_epu32(a, m);                       /* lanes 0, 2 */
    __m128i odd = _mm_mul_epu32(_mm_srli_epi64(a, 32), m);   /* lanes 1, 3 */
    __m128i e = _mm_shuffle_epi32(even, _MM_SHUFFLE(3, 1, 2, 0)); /* e0lo e2lo e0hi e2hi */
    __m128i o = _mm_shuffle_epi32(odd, _MM_SHUFFLE(3, 1, 2, 0));
    *lo = _mm_unpacklo_epi32(e, o);
    *hi = _mm_unpackhi_epi32(e, o);
}

/* Four lanes at a time; n a multiple of 4.  Each lane carries its own high
 * index word, so a block may cross a multiple of 2^32. */
static void draws_sse2(uint64_t seed, uint32_t salt, uint64_t first, int n,
                       uint32_t *x0, uint32_t *x1)
{
    const __m128i m0 = _mm_set1_epi32((int)PHILOX_M0), m1 = _mm_set1_epi32((int)PHILOX_M1);
    for (int k = 0; k < n; k += 4) {
        uint64_t i0 = first + (uint64_t)k;
        __m128i c0 = _mm_setr_epi32((int)(uint32_t)i0, (int)(uint32_t)(i0 + 1),
                                    (int)(uint32_t)(i0 + 2), (int)(uint32_t)(i0 + 3));
        __m128i c1 = _mm_setr_epi32((int)(uint32_t)(i0 >> 32), (int)(uint32_t)((i0 + 1) >> 32),
                                    (int)(uint32_t)((i0 + 2) >> 32), (int)(uint32_t)((i0 + 3) >> 32));
        __m128i c2 = _mm_set1_epi32((int)INIT_STEP), c3 = _mm_set1_epi32((int)salt);
        uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
        for (int r = 0; r < 10; r++) {
            if (r > 0) { k0 += PHILOX_W0; k1 += PHILOX_W1; }
            __m128i lo0, hi0, lo1, hi1;
            mul_lo_hi(c0, m0, &lo0, &hi0);
            mul_lo_hi(c2, m1, &lo1, &hi1);
            c0 = _mm_xor_si128(_mm_xor_si128(hi1, c1), _mm_set1_epi32((int)k0));
            c1 = lo1;
            c2 = _mm_xor_si128(_mm_xor_si128(hi0, c3), _mm_set1_epi32((int)k1));
            c3 = lo0;
        }
        _mm_storeu_si128((__m128i *)(x0 + k), c0);
        _mm_storeu_si128((__m128i *)(x1 + k), c1);
    }
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_AVX2_PATH 1
#include <immintrin.h>

/* As draws_sse2, eight lanes at a time in AVX2 (n a multiple of 8): the
 * products' low words are the even lanes of one _mm256_mul_epu32 and the
 * odd lanes of the other shifted up, the high words the other way round,
 * so no lane crosses.  Used where the cpu has AVX2 (checked once). */
__attribute__((target("avx2"))) static void draws_avx2(uint64_t seed, uint32_t salt, uint64_t first, int n,
                                                       uint32_t *x0, uint32_t *x1)
{
    const __m256i m0 = _mm256_set1_epi32((int)PHILOX_M0), m1 = _mm256_set1_epi32((int)PHILOX_M1);
    for (int k = 0; k < n; k += 8) {
        uint32_t lo[8], hi[8];
        for (int l = 0; l < 8; l++) {
            uint64_t idx = first + (uint64_t)(k + l);
            lo[l] = (uint32_t)idx;
            hi[l] = (uint32_t)(idx >> 32);
        }
        __m256i c0 = _mm256_loadu_si256((const __m256i *)lo), c1 = _mm256_loadu_si256((const __m256i *)hi);
        __m256i c2 = _mm256_set1_epi32((int)INIT_STEP), c3 = _mm256_set1_epi32((int)salt);
        uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
        for (int r = 0; r < 10; r++) {
            if (r > 0) { k0 += PHILOX_W0; k1 += PHILOX_W1; }
            __m256i e0 = _mm256_mul_epu32(c0, m0), o0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
            __m256i e1 = _mm256_mul_epu32(c2, m1), o1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
            __m256i lo0 = _mm256_blend_epi32(e0, _mm256_slli_epi64(o0, 32), 0xAA);
            __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(e0, 32), o0, 0xAA);
            __m256i lo1 = _mm256_blend_epi32(e1, _mm256_slli_epi64(o1, 32), 0xAA);
            __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(e1, 32), o1, 0xAA);
            c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32((int)k0));
            c1 = lo1;
            c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32((int)k1));
            c3 = lo0;
        }
        _mm256_storeu_si256((__m256i *)(x0 + k), c0);
        _mm256_storeu_si256((__m256i *)(x1 + k), c1);
    }
}

#endif

void init_normals(uint64_t seed, uint32_t salt, int64_t first, int64_t n, float *out)
{
    pthread_once(&coarse_once, coarse_fill);
    uint32_t x0[BLOCK], x1[BLOCK];
    for (int64_t b = 0; b < n; b += BLOCK) {
        int len = n - b < BLOCK ? (int)(n - b) : BLOCK;
        uint64_t start = (uint64_t)(first + b);
        int done = 0;
#if defined(HAVE_AVX2_PATH)
        if (use_avx2) {
            done = len & ~7;
            draws_avx2(seed, salt, start, done, x0, x1);
        }
#endif
#if defined(__SSE2__)
        int vec = done + ((len - done) & ~3);
        draws_sse2(seed, salt, start + (uint64_t)done, vec - done, x0 + done, x1 + done);
        done = vec;
#endif
        draws_scalar(seed, salt, start + (uint64_t)done, len - done, x0 + done, x1 + done);
        normals_from_words(x0, x1, len, out + b);
    }
}

/* runtime/train/init_normal.c — see init_normal.h. */
#include "train/init_normal.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
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

/* Values that left the fast path, for the test's rate check (rare, so one
 * shared relaxed counter costs nothing). */
static atomic_uint_fast64_t fallbacks;

static float normal_fallback(uint32_t x0, uint32_t x1)
{
    atomic_fetch_add_explicit(&fallbacks, 1, memory_order_relaxed);
    return normal_exact(x0, x1);
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

/* The radius sqrt(-2 log u1) without libm's log.  u1 = 2^k z with z in
 * [sqrt(2)/2, sqrt(2)): the exponent split is integer work on u1's bits
 * (below), then log z = 2 atanh(s) with s = (z - 1) / (z + 1), |s| < 0.1716,
 * as the series 2 s (1 + s^2/3 + ... + s^18/19) (remainder < 3e-17 of it,
 * summed in Estrin's order for short dependency chains),
 * and log u1 = k ln2 + log z with ln2 in two parts (k ln2_hi exact).  z - 1
 * is exact (Sterbenz), so the error stays a few ulps relative even for u1
 * near 1; INIT_NORMAL_R_ERR bounds it against libm (checked for all 2^24
 * u1 by tests/test_init_normal.c).  The AVX2 lanes below do the same
 * operations in the same order, without FMA. */
#define LOG_SPLIT 0x3FE6A09E667F3BCDull   /* bits of sqrt(2)/2 */
#define K_BIAS (64ull << 52)              /* keeps k + 64 > 0 in the top bits */
#define LN2_HI 6.93147180369123816490e-01 /* ln 2 to 32 bits: k ln2_hi is exact */
#define LN2_LO 1.90821492927058770002e-10 /* ln 2 - LN2_HI */

/* The series' coefficients 2 / (2 i + 3) for i = 0..8 (the 2 s term apart). */
#define A0 (2.0 / 3)
#define A1 (2.0 / 5)
#define A2 (2.0 / 7)
#define A3 (2.0 / 9)
#define A4 (2.0 / 11)
#define A5 (2.0 / 13)
#define A6 (2.0 / 15)
#define A7 (2.0 / 17)
#define A8 (2.0 / 19)

static inline double radius_from(double k, double z)
{
    double f = z - 1.0;
    double s = f / (2.0 + f), s2 = s * s, s4 = s2 * s2, s8 = s4 * s4;
    /* q = A0 + A1 s^2 + ... + A8 s^16 in Estrin's order (short dependency chains) */
    double p01 = A0 + s2 * A1, p23 = A2 + s2 * A3, p45 = A4 + s2 * A5, p67 = A6 + s2 * A7;
    double p03 = p01 + s4 * p23, p47 = p45 + s4 * p67;
    double q = p03 + s8 * (p47 + s8 * A8);
    double log_z = 2.0 * s + s * (s2 * q);
    double log_u = k * LN2_HI + (k * LN2_LO + log_z);
    return sqrt(-2.0 * log_u);   /* log_u < 0: no errno path taken */
}

static inline double fast_radius(uint32_t x0)
{
    double u1 = ((x0 >> 8) + 1.0) / 16777217.0;
    uint64_t bits, zbits;
    memcpy(&bits, &u1, sizeof bits);
    uint64_t kb = (bits + (K_BIAS - LOG_SPLIT)) >> 52;  /* k + 64 */
    zbits = bits + (K_BIAS - (kb << 52));              /* u1 / 2^k */
    double z;
    memcpy(&z, &zbits, sizeof z);
    return radius_from((double)(int64_t)kb - 64.0, z);
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

double init_normal_cos_exact(uint32_t b) { return cos(2.0 * M_PI * (b / 16777216.0)); }
double init_normal_radius_exact(uint32_t a) { return sqrt(-2.0 * log((a + 1.0) / 16777217.0)); }

/* The rounding guard.  The exact value is p = r c (rounded), r and c libm's
 * as in philox_normal; the fast one is v = r' c' with |r' - r| <= R_ERR r
 * and |c' - c| <= C_ERR (tests/test_init_normal.c checks all 2^24 radii and
 * all 2^24 cosines), so |v - p| <= R_ERR r |c'| + r C_ERR plus each
 * product's rounding (2^-53 of it); r < 5.8.  The slack of the factor 2 and
 * of 1e-15 |v| covers r/r' and the rounding of v -+ delta.  If both ends of
 * [v - delta, v + delta] round to the same float, that is the exact float;
 * otherwise (about 1 value in 10^6) take the exact path. */
static inline double guard_delta(double r, double abs_v)
{
    return 2.0 * (INIT_NORMAL_C_ERR * r + INIT_NORMAL_R_ERR * abs_v) + 1e-15 * abs_v;
}

static void normals_scalar(const uint32_t *x0, const uint32_t *x1, int n, float *out)
{
    for (int k = 0; k < n; k++) {
        double r = fast_radius(x0[k]), v = r * fast_cos_turn(x1[k] >> 8);
        double delta = guard_delta(r, fabs(v));
        float lo = (float)(v - delta), hi = (float)(v + delta);
        out[k] = lo == hi ? (float)(INIT_STD * lo) : normal_fallback(x0[k], x1[k]);
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

/* fast_radius of four words' x[0], lane by lane: the same operations in
 * the same order (IEEE division and square root are exact-rounded in
 * vector form too), the exponent k turned to a double through 2^52 + k. */
__attribute__((target("avx2"))) static inline __m256d radius4(__m128i w0)
{
    const __m256d one = _mm256_set1_pd(1.0), two = _mm256_set1_pd(2.0);
    __m256d u1 = _mm256_div_pd(_mm256_add_pd(_mm256_cvtepi32_pd(_mm_srli_epi32(w0, 8)), one),
                               _mm256_set1_pd(16777217.0));
    __m256i bits = _mm256_castpd_si256(u1);
    __m256i kb = _mm256_srli_epi64(_mm256_add_epi64(bits, _mm256_set1_epi64x((long long)(K_BIAS - LOG_SPLIT))), 52);
    __m256i zbits = _mm256_add_epi64(bits, _mm256_sub_epi64(_mm256_set1_epi64x((long long)K_BIAS),
                                                            _mm256_slli_epi64(kb, 52)));
    __m256d k = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(kb, _mm256_set1_epi64x(0x4330000000000000ll))),
                              _mm256_set1_pd(4503599627370496.0 + 64.0));   /* (2^52 + k + 64) - (2^52 + 64) */
    __m256d f = _mm256_sub_pd(_mm256_castsi256_pd(zbits), one);
    __m256d s = _mm256_div_pd(f, _mm256_add_pd(two, f)), s2 = _mm256_mul_pd(s, s);
    __m256d s4 = _mm256_mul_pd(s2, s2), s8 = _mm256_mul_pd(s4, s4);
    __m256d p01 = _mm256_add_pd(_mm256_set1_pd(A0), _mm256_mul_pd(s2, _mm256_set1_pd(A1)));
    __m256d p23 = _mm256_add_pd(_mm256_set1_pd(A2), _mm256_mul_pd(s2, _mm256_set1_pd(A3)));
    __m256d p45 = _mm256_add_pd(_mm256_set1_pd(A4), _mm256_mul_pd(s2, _mm256_set1_pd(A5)));
    __m256d p67 = _mm256_add_pd(_mm256_set1_pd(A6), _mm256_mul_pd(s2, _mm256_set1_pd(A7)));
    __m256d p03 = _mm256_add_pd(p01, _mm256_mul_pd(s4, p23)), p47 = _mm256_add_pd(p45, _mm256_mul_pd(s4, p67));
    __m256d q = _mm256_add_pd(p03, _mm256_mul_pd(s8, _mm256_add_pd(p47, _mm256_mul_pd(s8, _mm256_set1_pd(A8)))));
    __m256d log_z = _mm256_add_pd(_mm256_mul_pd(two, s), _mm256_mul_pd(s, _mm256_mul_pd(s2, q)));
    __m256d log_u = _mm256_add_pd(_mm256_mul_pd(k, _mm256_set1_pd(LN2_HI)),
                                  _mm256_add_pd(_mm256_mul_pd(k, _mm256_set1_pd(LN2_LO)), log_z));
    return _mm256_sqrt_pd(_mm256_mul_pd(_mm256_set1_pd(-2.0), log_u));
}

/* fast_cos_turn of four words' x[1] >> 8: the coarse table through two
 * gathers and the quadrant's switch as a select on q's low bit (sin for
 * q = 1, 3) and a sign flip where bit 1 of q + 1 is set (q = 1, 2). */
__attribute__((target("avx2"))) static inline __m256d cos4(__m128i w1)
{
    __m128i b = _mm_srli_epi32(w1, 8);
    __m128i h = _mm_and_si128(_mm_srli_epi32(b, 10), _mm_set1_epi32(0xFFF));
    __m128i t = _mm_and_si128(b, _mm_set1_epi32(0x3FF));
    __m256i q = _mm256_cvtepu32_epi64(_mm_srli_epi32(b, 22));
    __m256d d = _mm256_mul_pd(_mm256_cvtepi32_pd(t), _mm256_set1_pd(6.283185307179586477 / 16777216.0));
    __m256d d2 = _mm256_mul_pd(d, d);
    __m256d cd = _mm256_add_pd(_mm256_set1_pd(1.0 / 24), _mm256_mul_pd(d2, _mm256_set1_pd(-1.0 / 720)));
    cd = _mm256_add_pd(_mm256_set1_pd(-0.5), _mm256_mul_pd(d2, cd));
    cd = _mm256_add_pd(_mm256_set1_pd(1.0), _mm256_mul_pd(d2, cd));
    __m256d sd = _mm256_add_pd(_mm256_set1_pd(1.0 / 120), _mm256_mul_pd(d2, _mm256_set1_pd(-1.0 / 5040)));
    sd = _mm256_add_pd(_mm256_set1_pd(-1.0 / 6), _mm256_mul_pd(d2, sd));
    sd = _mm256_mul_pd(d, _mm256_add_pd(_mm256_set1_pd(1.0), _mm256_mul_pd(d2, sd)));
    __m256d cc = _mm256_i32gather_pd(coarse_cos, h, 8), cs = _mm256_i32gather_pd(coarse_sin, h, 8);
    __m256d c = _mm256_sub_pd(_mm256_mul_pd(cc, cd), _mm256_mul_pd(cs, sd));
    __m256d s = _mm256_add_pd(_mm256_mul_pd(cs, cd), _mm256_mul_pd(cc, sd));
    __m256d pick = _mm256_blendv_pd(c, s, _mm256_castsi256_pd(_mm256_slli_epi64(q, 63)));
    __m256i flip = _mm256_slli_epi64(_mm256_and_si256(_mm256_add_epi64(q, _mm256_set1_epi64x(1)),
                                                      _mm256_set1_epi64x(2)), 62);
    return _mm256_xor_pd(pick, _mm256_castsi256_pd(flip));
}

/* normals_scalar four lanes at a time (n <= BLOCK, a multiple of 4), the
 * guard's failures one by one on the exact path.  In two passes over the
 * block, so that more independent lanes are in flight in each loop than in
 * one long chain of divisions, square roots and gathers. */
__attribute__((target("avx2"))) static void normals_avx2(const uint32_t *x0, const uint32_t *x1, int n, float *out)
{
    double r[BLOCK];
    for (int k = 0; k < n; k += 4) _mm256_storeu_pd(r + k, radius4(_mm_loadu_si128((const __m128i *)(x0 + k))));
    const __m256d c_err = _mm256_set1_pd(INIT_NORMAL_C_ERR), r_err = _mm256_set1_pd(INIT_NORMAL_R_ERR);
    for (int k = 0; k < n; k += 4) {
        __m256d rk = _mm256_loadu_pd(r + k);
        __m256d v = _mm256_mul_pd(rk, cos4(_mm_loadu_si128((const __m128i *)(x1 + k))));
        __m256d abs_v = _mm256_andnot_pd(_mm256_set1_pd(-0.0), v);
        __m256d delta = _mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(2.0), _mm256_add_pd(_mm256_mul_pd(c_err, rk),
                                                                                      _mm256_mul_pd(r_err, abs_v))),
                                      _mm256_mul_pd(_mm256_set1_pd(1e-15), abs_v));
        __m128 lo = _mm256_cvtpd_ps(_mm256_sub_pd(v, delta)), hi = _mm256_cvtpd_ps(_mm256_add_pd(v, delta));
        _mm_storeu_ps(out + k, _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_set1_pd(INIT_STD), _mm256_cvtps_pd(lo))));
        for (int bad = ~_mm_movemask_ps(_mm_cmpeq_ps(lo, hi)) & 0xF; bad; bad &= bad - 1) {
            int l = __builtin_ctz((unsigned)bad);
            out[k + l] = normal_fallback(x0[k + l], x1[k + l]);
        }
    }
}

__attribute__((target("avx2"))) static void parts_avx2(const uint32_t *x0, const uint32_t *x1, int n,
                                                       double *r, double *c)
{
    for (int k = 0; k < n; k += 4) {
        _mm256_storeu_pd(r + k, radius4(_mm_loadu_si128((const __m128i *)(x0 + k))));
        _mm256_storeu_pd(c + k, cos4(_mm_loadu_si128((const __m128i *)(x1 + k))));
    }
}

#endif

/* The Box-Muller stage of a block: AVX2 lanes where used, the rest scalar. */
static void normals_from_words(const uint32_t *x0, const uint32_t *x1, int n, float *out)
{
    int done = 0;
#if defined(HAVE_AVX2_PATH)
    if (use_avx2) {
        done = n & ~3;
        normals_avx2(x0, x1, done, out);
    }
#endif
    normals_scalar(x0 + done, x1 + done, n - done, out + done);
}

void init_normal_fast_parts(const uint32_t *x0, const uint32_t *x1, int n, double *r, double *c)
{
    pthread_once(&coarse_once, coarse_fill);
    int done = 0;
#if defined(HAVE_AVX2_PATH)
    if (use_avx2) {
        done = n & ~3;
        parts_avx2(x0, x1, done, r, c);
    }
#endif
    for (int k = done; k < n; k++) {
        r[k] = fast_radius(x0[k]);
        c[k] = fast_cos_turn(x1[k] >> 8);
    }
}

bool init_normal_uses_avx2(void)
{
    pthread_once(&coarse_once, coarse_fill);
    return use_avx2;
}

uint64_t init_normal_fallback_count(void) { return atomic_load(&fallbacks); }

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

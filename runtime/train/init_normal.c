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

/* The radius sqrt(-2 log u1) without libm's log (nor any division).
 * u1 = w / (2^24 + 1) with w = a + 1 an integer in [1, 2^24], so
 *   log u1 = log(w / 2^24) - log1p(2^-24) = (k - 24) ln2 + log z - log1p(2^-24)
 * with w = 2^k z, z in [LOG_SPLIT, 2 LOG_SPLIT) split off w's bits exactly
 * (both logs are <= 0 for k = 24, so nothing cancels near u1 = 1).  z falls
 * in one of LOG_ROWS rows by its next bits; the row's inv has 24 bits and
 * z at most 24, so z inv is exact, and within 2^-8 of 1, so t = z inv - 1 is
 * exact too (Sterbenz); log z = -log(inv) + log1p(t) with log1p's series to
 * t^7 (remainder < 2^-59 of it).  The two rows beside 1.0 have inv = 1, so
 * log z keeps its relative accuracy for z near 1; elsewhere |log z| >
 * 0.66 |log inv|.  ln2 is in two parts (k ln2_hi exact).  INIT_NORMAL_R_ERR
 * bounds the radius against libm's (checked for all 2^24 a by
 * tests/test_init_normal.c); most of that difference is libm's own, from
 * rounding u1 = w / (2^24 + 1) to a double before its log (up to ~2^-48 of
 * log u1 for u1 near 1), which this path never does.  The AVX2 lanes below
 * do the same operations in the same order, without FMA. */
enum { LOG_ROWS = 256, LOG_ROW_SHIFT = 44 };
#define LOG_SPLIT 0x3FE6A00000000000ull   /* bits of 0.70703125 (about sqrt(2)/2); a row starts at 1.0 */
#define LN2_HI 6.93147180369123816490e-01 /* ln 2 to 32 bits: k ln2_hi is exact */
#define LN2_LO 1.90821492927058770002e-10 /* ln 2 - LN2_HI */
#define LOG1P_2M24 0x1.ffffff000000bp-25  /* log1p(2^-24), rounded */
static double log_rows[LOG_ROWS][2];   /* (inv, -log(inv)) by row */

static double double_of_bits(uint64_t bits)
{
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

static void log_rows_fill(void)
{
    for (int i = 0; i < LOG_ROWS; i++) {
        double lo = double_of_bits(LOG_SPLIT + ((uint64_t)i << LOG_ROW_SHIFT));
        double hi = double_of_bits(LOG_SPLIT + ((uint64_t)(i + 1) << LOG_ROW_SHIFT));
        bool beside_one = lo == 1.0 || hi == 1.0;
        log_rows[i][0] = beside_one ? 1.0 : (double)(float)(2.0 / (lo + hi));
        log_rows[i][1] = beside_one ? 0.0 : -log(log_rows[i][0]);
    }
}

/* The coarse angles A = 2 pi h / 2^14 for h < 2^12 (a quarter turn), from
 * libm once per process, laid out for fast_cos_turn: row o 2^12 + h holds
 * the factors of cos d and sin d, (cos A, -sin A) for o = 0 and
 * (sin A, cos A) for o = 1 (pairs, so that a row is one 16-byte load). */
enum { COARSE = 1 << 12 };
static double turn_rows[2 * COARSE][2];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;
static bool use_avx2;   /* the cpu has AVX2 and HPC_INIT_AVX2 is not "0" (set once, with the tables) */

static void tables_fill(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    const char *off = getenv("HPC_INIT_AVX2");
    use_avx2 = __builtin_cpu_supports("avx2") && !(off && strcmp(off, "0") == 0);
#endif
    log_rows_fill();
    for (int h = 0; h < COARSE; h++) {
        double angle = 6.283185307179586477 * ((double)h / (1 << 14));
        turn_rows[h][0] = cos(angle);
        turn_rows[h][1] = -sin(angle);
        turn_rows[COARSE + h][0] = sin(angle);
        turn_rows[COARSE + h][1] = cos(angle);
    }
}

/* log1p's coefficients (-1)^(n+1) / n for n = 2..7. */
#define B2 (-1.0 / 2)
#define B3 (1.0 / 3)
#define B4 (-1.0 / 4)
#define B5 (1.0 / 5)
#define B6 (-1.0 / 6)
#define B7 (1.0 / 7)

static inline double fast_radius(uint32_t x0)
{
    double w = (double)((x0 >> 8) + 1);
    uint64_t bits;
    memcpy(&bits, &w, sizeof bits);
    uint64_t tmp = bits - LOG_SPLIT;   /* w >= 1 > LOG_SPLIT: no borrow */
    uint64_t k = tmp >> 52, row = (tmp >> LOG_ROW_SHIFT) & (LOG_ROWS - 1);
    double z = double_of_bits(bits - (k << 52));   /* w / 2^k */
    double t = z * log_rows[row][0] - 1.0, t2 = t * t, t4 = t2 * t2;
    /* log1p(t) = t + t^2 (B2 + B3 t + ... + B7 t^5), in Estrin's order (short dependency chains) */
    double p = ((B2 + t * B3) + t2 * (B4 + t * B5)) + t4 * (B6 + t * B7);
    double log1p_t = t + t2 * p, j = (double)k - 24.0;
    double log_u = j * LN2_HI + (((j * LN2_LO + log_rows[row][1]) + log1p_t) - LOG1P_2M24);
    return sqrt(-2.0 * log_u);   /* log_u < 0: no errno path taken */
}

/* cos(2 pi b / 2^24) for b < 2^24: the quadrant q from b's top two bits,
 * a coarse angle A from the next 12 (table) and a fine angle d < 2 pi 2^-14
 * from the last 10, with Taylor series of cos d to d^6 and sin d to d^7
 * (remainders < 1e-25).  By quadrant the cosine is c, -s, -c, s with
 * c = cos(A + d) = cos A cos d + (-sin A) sin d and
 * s = sin(A + d) = sin A cos d + cos A sin d: one table row picks c or s
 * (q's low bit, the index's bit 12) and the sign flips for q = 1, 2. */
static inline double fast_cos_turn(uint32_t b)
{
    uint32_t q = b >> 22, i = (b >> 10) & 0x1FFFu, t = b & 0x3FFu;
    double d = (double)t * (6.283185307179586477 / 16777216.0), d2 = d * d;
    double cd = 1.0 + d2 * (-0.5 + d2 * (1.0 / 24 + d2 * (-1.0 / 720)));
    double sd = d * (1.0 + d2 * (-1.0 / 6 + d2 * (1.0 / 120 + d2 * (-1.0 / 5040))));
    double v = turn_rows[i][0] * cd + turn_rows[i][1] * sd;
    return (q + 1) & 2 ? -v : v;
}

double init_normal_cos_exact(uint32_t b) { return cos(2.0 * M_PI * (b / 16777216.0)); }
double init_normal_radius_exact(uint32_t a) { return sqrt(-2.0 * log((a + 1.0) / 16777217.0)); }

/* The rounding guard.  The exact value is p = r c (rounded), r and c libm's
 * as in philox_normal; the fast one is v = r' c' (rounded) with
 * |r' - r| <= R_ERR r and |c' - c| <= C_ERR (tests/test_init_normal.c
 * checks all 2^24 radii and all 2^24 cosines), so
 *   |v - p| <= R_ERR r |c'| + C_ERR r + 2^-53 (|v| + |p|)
 * and r <= r' / (1 - R_ERR), r |c'| <= |v| (1 + 2^-52) / (1 - R_ERR).
 * delta = 2 C_ERR r' + (2 R_ERR + 1e-15) |v| covers that twice over, and the
 * slack covers the rounding of delta and of v -+ delta.  If both ends of
 * [v - delta, v + delta] round to the same float, that is the exact float
 * (rounding is monotone); otherwise (about 2 values in 10^6, counted by
 * init_normal_fallback_count) take the exact path. */
#define GUARD_R (2.0 * INIT_NORMAL_C_ERR)
#define GUARD_V (2.0 * INIT_NORMAL_R_ERR + 1e-15)

static inline double guard_delta(double r, double abs_v) { return GUARD_R * r + GUARD_V * abs_v; }

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

/* As draws_sse2 in AVX2, sixteen lanes at a time (n a multiple of 16).
 * Each draw's words sit in the low half of a 64-bit lane: _mm256_mul_epu32
 * reads only those halves and gives the whole product, whose high word is
 * one shift away, so a round is two products, two shifts and four xors
 * for four draws (what the upper halves carry is never read).  The counter
 * starts as the 64-bit index itself (low word c0, c1 = index >> 32), and
 * four independent groups of lanes are in flight, for the multiplier's
 * latency.  Used where the cpu has AVX2 (checked once). */
enum { AVX2_GROUPS = 4, AVX2_LANES = 4 * AVX2_GROUPS };

/* The low words of a's and b's four 64-bit lanes, in order (a's first). */
__attribute__((target("avx2"))) static inline __m256i low_words(__m256i a, __m256i b)
{
    __m256 ab = _mm256_shuffle_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), _MM_SHUFFLE(2, 0, 2, 0));
    return _mm256_permute4x64_epi64(_mm256_castps_si256(ab), _MM_SHUFFLE(3, 1, 2, 0));
}

__attribute__((target("avx2"))) static void draws_avx2(uint64_t seed, uint32_t salt, uint64_t first, int n,
                                                       uint32_t *x0, uint32_t *x1)
{
    __m256i key0[10], key1[10];
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        if (r > 0) { k0 += PHILOX_W0; k1 += PHILOX_W1; }
        key0[r] = _mm256_set1_epi32((int)k0);
        key1[r] = _mm256_set1_epi32((int)k1);
    }
    const __m256i m0 = _mm256_set1_epi32((int)PHILOX_M0), m1 = _mm256_set1_epi32((int)PHILOX_M1);
    const __m256i step = _mm256_set1_epi32((int)INIT_STEP), lane = _mm256_setr_epi64x(0, 1, 2, 3);
    for (int k = 0; k < n; k += AVX2_LANES) {
        __m256i c0[AVX2_GROUPS], c1[AVX2_GROUPS], c2[AVX2_GROUPS], c3[AVX2_GROUPS];
        for (int g = 0; g < AVX2_GROUPS; g++) {
            c0[g] = _mm256_add_epi64(_mm256_set1_epi64x((long long)(first + (uint64_t)(k + 4 * g))), lane);
            c1[g] = _mm256_srli_epi64(c0[g], 32);
            c2[g] = step;
            c3[g] = _mm256_set1_epi32((int)salt);
        }
#pragma GCC unroll 10
        for (int r = 0; r < 10; r++) {
#pragma GCC unroll 4
            for (int g = 0; g < AVX2_GROUPS; g++) {
                __m256i p0 = _mm256_mul_epu32(c0[g], m0), p1 = _mm256_mul_epu32(c2[g], m1);
                c0[g] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1[g]), key0[r]);
                c1[g] = p1;
                c2[g] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3[g]), key1[r]);
                c3[g] = p0;
            }
        }
        for (int g = 0; g < AVX2_GROUPS; g += 2) {
            _mm256_storeu_si256((__m256i *)(x0 + k + 4 * g), low_words(c0[g], c0[g + 1]));
            _mm256_storeu_si256((__m256i *)(x1 + k + 4 * g), low_words(c1[g], c1[g + 1]));
        }
    }
}

/* The first and second doubles of four table rows (16-byte pairs) whose
 * indices are r0..r3: two rows to each 128-bit half, then unpacked (four
 * loads, cheaper here than two gathers). */
__attribute__((target("avx2"))) static inline void rows4(const double (*rows)[2], long long r0, long long r1,
                                                         long long r2, long long r3, __m256d *first, __m256d *second)
{
    __m256d a = _mm256_insertf128_pd(_mm256_castpd128_pd256(_mm_loadu_pd(rows[r0])), _mm_loadu_pd(rows[r2]), 1);
    __m256d b = _mm256_insertf128_pd(_mm256_castpd128_pd256(_mm_loadu_pd(rows[r1])), _mm_loadu_pd(rows[r3]), 1);
    *first = _mm256_unpacklo_pd(a, b);
    *second = _mm256_unpackhi_pd(a, b);
}

/* fast_radius of four words' x[0], lane by lane: the same operations in
 * the same order (IEEE square root is exact-rounded in vector form too),
 * k - 24 turned to a double through 2^52 + k. */
__attribute__((target("avx2"))) static inline __m256d radius4(__m128i w0)
{
    __m256d w = _mm256_cvtepi32_pd(_mm_add_epi32(_mm_srli_epi32(w0, 8), _mm_set1_epi32(1)));
    __m256i bits = _mm256_castpd_si256(w);
    __m256i tmp = _mm256_sub_epi64(bits, _mm256_set1_epi64x((long long)LOG_SPLIT));
    __m256i k = _mm256_srli_epi64(tmp, 52);
    __m256i row = _mm256_and_si256(_mm256_srli_epi64(tmp, LOG_ROW_SHIFT), _mm256_set1_epi64x(LOG_ROWS - 1));
    __m256d z = _mm256_castsi256_pd(_mm256_sub_epi64(bits, _mm256_slli_epi64(k, 52)));
    __m256d inv, log_c;
    rows4(log_rows, _mm256_extract_epi64(row, 0), _mm256_extract_epi64(row, 1), _mm256_extract_epi64(row, 2),
          _mm256_extract_epi64(row, 3), &inv, &log_c);
    __m256d t = _mm256_sub_pd(_mm256_mul_pd(z, inv), _mm256_set1_pd(1.0));
    __m256d t2 = _mm256_mul_pd(t, t), t4 = _mm256_mul_pd(t2, t2);
    __m256d p01 = _mm256_add_pd(_mm256_set1_pd(B2), _mm256_mul_pd(t, _mm256_set1_pd(B3)));
    __m256d p23 = _mm256_add_pd(_mm256_set1_pd(B4), _mm256_mul_pd(t, _mm256_set1_pd(B5)));
    __m256d p45 = _mm256_add_pd(_mm256_set1_pd(B6), _mm256_mul_pd(t, _mm256_set1_pd(B7)));
    __m256d p = _mm256_add_pd(_mm256_add_pd(p01, _mm256_mul_pd(t2, p23)), _mm256_mul_pd(t4, p45));
    __m256d log1p_t = _mm256_add_pd(t, _mm256_mul_pd(t2, p));
    __m256d j = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(k, _mm256_set1_epi64x(0x4330000000000000ll))),
                              _mm256_set1_pd(4503599627370496.0 + 24.0));   /* (2^52 + k) - (2^52 + 24) */
    __m256d sum = _mm256_add_pd(_mm256_mul_pd(j, _mm256_set1_pd(LN2_LO)), log_c);
    sum = _mm256_sub_pd(_mm256_add_pd(sum, log1p_t), _mm256_set1_pd(LOG1P_2M24));
    __m256d log_u = _mm256_add_pd(_mm256_mul_pd(j, _mm256_set1_pd(LN2_HI)), sum);
    return _mm256_sqrt_pd(_mm256_mul_pd(_mm256_set1_pd(-2.0), log_u));
}

/* fast_cos_turn of four words' x[1] >> 8, the sign flip as an xor of
 * bit 1 of q + 1 into the sign bit. */
__attribute__((target("avx2"))) static inline __m256d cos4(__m128i w1)
{
    __m128i b = _mm_srli_epi32(w1, 8);
    __m128i i = _mm_and_si128(_mm_srli_epi32(b, 10), _mm_set1_epi32(0x1FFF));
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
    __m256d f_cd, f_sd;
    rows4(turn_rows, _mm_cvtsi128_si32(i), _mm_extract_epi32(i, 1), _mm_extract_epi32(i, 2), _mm_extract_epi32(i, 3),
          &f_cd, &f_sd);
    __m256d v = _mm256_add_pd(_mm256_mul_pd(f_cd, cd), _mm256_mul_pd(f_sd, sd));
    __m256i flip = _mm256_slli_epi64(_mm256_and_si256(_mm256_add_epi64(q, _mm256_set1_epi64x(1)),
                                                      _mm256_set1_epi64x(2)), 62);
    return _mm256_xor_pd(v, _mm256_castsi256_pd(flip));
}

/* normals_scalar four lanes at a time (n <= BLOCK, a multiple of 4), the
 * guard's failures one by one on the exact path.  In two passes over the
 * block, so that more independent lanes are in flight in each loop than in
 * one long chain of divisions, square roots and gathers. */
__attribute__((target("avx2"))) static void normals_avx2(const uint32_t *x0, const uint32_t *x1, int n, float *out)
{
    double r[BLOCK];
    for (int k = 0; k < n; k += 4) _mm256_storeu_pd(r + k, radius4(_mm_loadu_si128((const __m128i *)(x0 + k))));
    const __m256d guard_r = _mm256_set1_pd(GUARD_R), guard_v = _mm256_set1_pd(GUARD_V);
    for (int k = 0; k < n; k += 4) {
        __m256d rk = _mm256_loadu_pd(r + k);
        __m256d v = _mm256_mul_pd(rk, cos4(_mm_loadu_si128((const __m128i *)(x1 + k))));
        __m256d abs_v = _mm256_andnot_pd(_mm256_set1_pd(-0.0), v);
        __m256d delta = _mm256_add_pd(_mm256_mul_pd(guard_r, rk), _mm256_mul_pd(guard_v, abs_v));
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
    pthread_once(&tables_once, tables_fill);
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
    pthread_once(&tables_once, tables_fill);
    return use_avx2;
}

uint64_t init_normal_fallback_count(void) { return atomic_load(&fallbacks); }

void init_normals(uint64_t seed, uint32_t salt, int64_t first, int64_t n, float *out)
{
    pthread_once(&tables_once, tables_fill);
    uint32_t x0[BLOCK], x1[BLOCK];
    for (int64_t b = 0; b < n; b += BLOCK) {
        int len = n - b < BLOCK ? (int)(n - b) : BLOCK;
        uint64_t start = (uint64_t)(first + b);
        int done = 0;
#if defined(HAVE_AVX2_PATH)
        if (use_avx2) {
            done = len & ~(AVX2_LANES - 1);
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

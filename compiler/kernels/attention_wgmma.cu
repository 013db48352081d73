// compiler/kernels/attention_wgmma.cu — the one-pass attention backward on
// Hopper's warpgroup MMA (attn_wg5_bwd_run, HPC_ATTN_KERNELS=v5): rows of
// at most 128 keys, head size 64, f16.  Builds on attention_mma2.cu's
// helpers (cp.async, exp2) and attention_mma.cu's am_pack.  Its code is
// sm_90a's only: the step never launches it from another module
// (StepPhase.target), where v4's attn_mma4_bwd takes the same rows.
//
// Why: attn_mma4_bwd (mma.sync, two blocks of 8 warps an SM) takes about
// 255 us a layer at BERT-base 256 x 128 (H100), twice what its bytes take,
// its MMAs at about a quarter of mma.sync's rate: each warp's chains of
// ldmatrix -> mma -> mma wait on each other.  Here one instruction of a
// warpgroup multiplies 64 x 64 x 16 while the warps go on, and the next
// (b, head)'s rows load while this one's are multiplied.  On an H100
// (2026-12-06): 220 against 255 us a layer at 256 x 128, 31 against 40 at
// 32 x 128 (then with a delta phase before it); slower at L 32 (one block
// an SM), where the step keeps v4's (AT_WG5_MIN_L).
//
// A persistent grid (EOP_LT_ROWS capped at one block an SM) of 256
// threads, two warpgroups, walks the (b, head) pairs; each pair's K, V, Q,
// dO (128 rows of 64 f16, the 128-byte swizzle), keep bits, key mask and
// lse come by cp.async into one of two buffers a pair ahead (O into
// registers), and delta = rowsum(dO O) is summed when the pair begins.
// Warpgroup w owns keys 64 w .. 64 w + 63 and takes the queries in two
// halves of 64 (one where L <= 64):
//   S^T = K_w Q^T and dP^T = V_w dO^T (m64n64, both operands in shared
//   memory; the second half's issued before the first half's elementwise
//   work, so they overlap), then in registers P = exp(scale S - lse) (0
//   where hidden), Z = P keep / (1 - p) and dS = P (dP keep / (1 - p) -
//   delta), rounded to f16; dV += Z^T dO and dK += dS^T Q with Z^T and
//   dS^T as register operands (an m64n64 accumulator's layout is the A
//   operand's); dS^T also goes to shared memory (box hq: every key x the
//   half's 64 queries; box 1 over V's rows).
// Then dQ^T = K^T dS^T (warpgroup w: the queries of box w; K^T and dS^T
// both MN-major), and dK, dV, dQ leave through the pair's Q, dO and K rows
// in 16-byte pieces.  The keep bits are the forward's
// (AT_KEEP_BYTES a query row); without them only p = 0 is taken (the step
// keeps v4 where dropout draws would be needed).  The products are v4's
// summed in another order; gpu_attention_step holds both to the cpu.

#if HPC_HEAD_DIM == 64 && HPC_DTYPE == 1

#define A5_ROWS 128                                  // the longest row it takes (keys and queries)
#define A5_TILE_BYTES (A5_ROWS * 128)                // 128 rows of 64 f16
#define A5_KEEP_OFF (4 * A5_TILE_BYTES)              // after K, V, Q, dO
#define A5_LSE_OFF (A5_KEEP_OFF + A5_ROWS * AT_KEEP_BYTES)
#define A5_DELTA_OFF (A5_LSE_OFF + A5_ROWS * 4)
#define A5_MASK_OFF (A5_DELTA_OFF + A5_ROWS * 4)
#define A5_BUF_BYTES (A5_MASK_OFF + A5_ROWS * 4 + 1536)   // padded to 1024: the next buffer's tiles stay aligned
#define A5_SMEM_BYTES (2 * A5_BUF_BYTES + A5_TILE_BYTES + 1024)
static_assert(A5_BUF_BYTES % 1024 == 0, "each buffer's tiles start at a 1024-byte boundary (the swizzle)");
static_assert(A5_ROWS == AT_KEEP_KEYS, "the saved keep bits cover every key");
#ifdef HPC_ATTN5_SMEM_BYTES
static_assert(A5_SMEM_BYTES == HPC_ATTN5_SMEM_BYTES, "the launch's dynamic shared memory is the kernel's layout "
                                                    "(kemit_attn5_smem_bytes, compiler/emit_attention.h)");
#endif
enum { A5_K = 0, A5_V = 1, A5_Q = 2, A5_DO = 3 };   // the tiles of a buffer, in order

// Byte offset of 16-byte chunk c (0..7) of row r in a tile of 128-byte
// rows in the 128-byte swizzle (the tile 1024-aligned).
__device__ __forceinline__ int a5_sw(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Shared-memory matrix descriptor in the 128-byte swizzle: start, LBO and
// SBO in 16-byte units.  K-major (rows of 64 k): SBO 1024 between 8-row
// groups along M or N.  MN-major (rows of 64 m or n, one row a k): SBO
// 1024 between 8-row groups along K; LBO (the next 64 along M or N) is not
// used at 64.
__device__ __forceinline__ unsigned long long a5_desc(const void *p, unsigned lbo)
{
    return (unsigned long long)((a2_smem(p) >> 4) & 0x3FFFu) | ((unsigned long long)(lbo >> 4) << 16) |
           ((1024ull >> 4) << 32) | (1ull << 62);
}
#define A5_D32(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),     \
                  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),          \
                  "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),        \
                  "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),        \
                  "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define A5_D32_TEXT "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                    \
                    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
// d (64 x 64 f32, 32 a thread) += A (64 x 16) B (16 x 64), both from shared
// memory (TA, TB: 0 K-major, 1 MN-major).
#define A5_MMA_SS(d, da, db, TA, TB)                                                                           \
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " A5_D32_TEXT                             \
                 "%32, %33, 1, 1, 1, " #TA ", " #TB ";\n"                                                     \
                 : A5_D32(d)                                                                                   \
                 : "l"(da), "l"(db))
// The same with A from registers (a[4]: the m64n64 accumulator layout's
// 16 columns, packed f16 pairs).
#define A5_MMA_RS(d, a, db, TB)                                                                                \
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " A5_D32_TEXT                             \
                 "{%32, %33, %34, %35}, %36, 1, 1, 1, " #TB ";\n"                                             \
                 : A5_D32(d)                                                                                   \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db))
#define A5_FENCE() asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory")
#define A5_COMMIT() asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory")
#define A5_WAIT(N) asm volatile("wgmma.wait_group.sync.aligned " #N ";\n" ::: "memory")
#define A5_COMMIT_WAIT() do { A5_COMMIT(); A5_WAIT(0); } while (0)
__device__ __forceinline__ void a5_fence_async(void) { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Pair (b, h)'s rows into buffer buf, one cp.async group (zeros past L):
// K, V, Q, dO (thread: 16-byte chunk tid % 8 of rows tid / 8 + 32 j), then
// the keep bits and the key mask (threads 0..127, where given) and lse
// (threads 128..255); and the thread's chunks of O (the forward's output)
// into o, by plain loads that land while the pair before is worked on.
__device__ __forceinline__ void a5_stage(unsigned char *buf, uint4 o[4], const st_t *q, const st_t *k,
                                         const st_t *v, int ld, const st_t *dctx, const st_t *ctx, const float *lse,
                                         const unsigned char *keep, const int *mask, int b, int h, int L)
{
    const i64 bh = (i64)b * HPC_HEADS + h;
    const int c = threadIdx.x & 7, r0 = threadIdx.x >> 3;
#pragma unroll
    for (int tile = 0; tile < 4; tile++) {
        const int stride = tile == A5_DO ? HPC_HIDDEN : ld;
        const st_t *base = (tile == A5_DO ? dctx : tile == A5_K ? k : tile == A5_V ? v : q) + (i64)b * L * stride +
                           h * AT_D + c * 8;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int r = r0 + 32 * j;
            const bool in = r < L;
            a2_cp16(buf + tile * A5_TILE_BYTES + a5_sw(r, c), base + (i64)(in ? r : 0) * stride, in);
        }
    }
    const st_t *obase = ctx + (i64)b * L * HPC_HIDDEN + h * AT_D + c * 8;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int r = r0 + 32 * j;
        o[j] = r < L ? *reinterpret_cast<const uint4 *>(obase + (i64)r * HPC_HIDDEN) : make_uint4(0u, 0u, 0u, 0u);
    }
    const int r = threadIdx.x & (A5_ROWS - 1);
    const bool in = r < L;
    if (threadIdx.x < A5_ROWS) {
        if (keep != nullptr) a2_cp16(buf + A5_KEEP_OFF + r * AT_KEEP_BYTES, keep + (bh * L + (in ? r : 0)) * AT_KEEP_BYTES, in);
        if (mask != nullptr) a2_cp4(buf + A5_MASK_OFF + r * 4, mask + (i64)b * L + (in ? r : 0), in);
    } else {
        a2_cp4(buf + A5_LSE_OFF + r * 4, lse + bh * L + (in ? r : 0), in);
    }
    a2_commit();
}

// delta = rowsum(dO O) of the pair's rows into the buffer, from its staged
// dO and the thread's chunks of O (a5_stage): the 8 threads of a row (8
// adjacent lanes) add theirs by shuffles.  Rows past L: 0.  The staged lse
// becomes lse log2 e, +inf past L, so a row past L gets P = 2^-inf = 0
// without a test of its own.
__device__ __forceinline__ void a5_delta(unsigned char *buf, const uint4 o[4], int L)
{
    const int c = threadIdx.x & 7, r0 = threadIdx.x >> 3;
    const unsigned char *gs = buf + A5_DO * A5_TILE_BYTES;
    float *delta = reinterpret_cast<float *>(buf + A5_DELTA_OFF);
    float *lse = reinterpret_cast<float *>(buf + A5_LSE_OFF);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int r = r0 + 32 * j;
        const uint4 g = *reinterpret_cast<const uint4 *>(gs + a5_sw(r, c));
        const st_t *ge = reinterpret_cast<const st_t *>(&g), *oe = reinterpret_cast<const st_t *>(&o[j]);
        float sum = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) sum += ld_f(ge[e]) * ld_f(oe[e]);
#pragma unroll
        for (int x = 1; x < 8; x <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, x);
        if (c == 0) {
            delta[r] = sum;
            lse[r] = r < L ? lse[r] * A2_LOG2E : __int_as_float(0x7f800000);
        }
    }
}

// S^T = K_w Q^T and dP^T = V_w dO^T for the queries 64 hq .. of half hq
// issued (one commit group), their accumulators cleared first.
__device__ __forceinline__ void a5_issue_sdp(float s[32], float dp[32], const unsigned char *buf, int hq, int w)
{
    const unsigned char *ks = buf + A5_K * A5_TILE_BYTES, *vs = buf + A5_V * A5_TILE_BYTES;
    const unsigned char *qs = buf + A5_Q * A5_TILE_BYTES, *gs = buf + A5_DO * A5_TILE_BYTES;
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = dp[i] = 0.0f;
    A5_FENCE();
    // k16 steps along the head's 64 columns: 32 bytes on, +2 in the
    // descriptor's start field (16-byte units; shared addresses stay below
    // 2^18, so the add never carries out of its 14 bits)
    const unsigned long long dka = a5_desc(ks + 64 * w * 128, 16), dqb = a5_desc(qs + 64 * hq * 128, 16);
    const unsigned long long dva = a5_desc(vs + 64 * w * 128, 16), dgb = a5_desc(gs + 64 * hq * 128, 16);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) A5_MMA_SS(s, dka + 2 * kk, dqb + 2 * kk, 0, 0);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) A5_MMA_SS(dp, dva + 2 * kk, dgb + 2 * kk, 0, 0);
    A5_COMMIT();
}

// Half hq's elementwise work once its S^T and dP^T have landed: P, Z and
// dS as the A operands za and sa (f16), dS^T also into box.
__device__ __forceinline__ void a5_probs(u32 za[4][4], u32 sa[4][4], const float s[32], const float dp[32],
                                         const unsigned char *buf, unsigned char *box, int hq, int w, int wt,
                                         const bool kvis[2], int L, float scale2, float dscale, bool drop)
{
    const float *lse = reinterpret_cast<const float *>(buf + A5_LSE_OFF);
    const float *delta = reinterpret_cast<const float *>(buf + A5_DELTA_OFF);
    const unsigned short *keep = reinterpret_cast<const unsigned short *>(buf + A5_KEEP_OFF);
    const int lane = wt & 31, g = lane >> 2, t = lane & 3;
    const int key0 = 64 * w + 16 * (wt >> 5) + g;   // the thread's keys: key0 and key0 + 8
    // the keys' bits in a row's 16-bit word of keep bits (the word of key0 >> 4)
    const u32 kbit[2] = {1u << (key0 & 15), 1u << ((key0 & 15) + 8)};
    // Element (j, c): key key0 + 8 (c >> 1), query 64 hq + 8 j + 2 t + (c & 1).
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int q0 = 64 * hq + 8 * j + 2 * t;   // the pair of queries q0, q0 + 1
        const float2 l2 = *reinterpret_cast<const float2 *>(lse + q0);   // lse log2 e, +inf past L
        const float2 d2 = *reinterpret_cast<const float2 *>(delta + q0);
        const float lq[2] = {l2.x, l2.y}, dq2[2] = {d2.x, d2.y};
        u32 kb[2] = {0xFFFFu, 0xFFFFu};   // the 16 keys' bits of the warp, rows q0 and q0 + 1
        if (drop) {
            kb[0] = keep[q0 * (AT_KEEP_BYTES / 2) + (key0 >> 4)];
            kb[1] = keep[(q0 + 1) * (AT_KEEP_BYTES / 2) + (key0 >> 4)];
        }
        float z[4], ds[4];
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int qi = q0 + (c & 1), key = key0 + 8 * (c >> 1);
            const bool on = kvis[c >> 1] && !(HPC_CAUSAL && key > qi);   // rows past L: their lse
            float pe = a2_exp2(s[4 * j + c] * scale2 - lq[c & 1]);
            pe = on ? pe : 0.0f;   // a select: a hidden element's exponential cannot leak
            const float kf = drop ? (kb[c & 1] & kbit[c >> 1] ? dscale : 0.0f) : 1.0f;
            z[c] = pe * kf;
            ds[c] = pe * (dp[4 * j + c] * kf - dq2[c & 1]);
        }
        // k16 step j / 2 of the A operands: registers 0, 1 (columns 2t..) at j even, 2, 3 (+8) at j odd
        za[j >> 1][2 * (j & 1)] = am_pack(z[0], z[1]);
        za[j >> 1][2 * (j & 1) + 1] = am_pack(z[2], z[3]);
        sa[j >> 1][2 * (j & 1)] = am_pack(ds[0], ds[1]);
        sa[j >> 1][2 * (j & 1) + 1] = am_pack(ds[2], ds[3]);
        // dS^T rows key0, key0 + 8 at the half's columns 8 j + 2 t: chunk j
        *reinterpret_cast<u32 *>(box + a5_sw(key0, j) + 4 * t) = sa[j >> 1][2 * (j & 1)];
        *reinterpret_cast<u32 *>(box + a5_sw(key0 + 8, j) + 4 * t) = sa[j >> 1][2 * (j & 1) + 1];
    }
}

// dV += Z^T dO and dK += dS^T Q over half hq's queries issued (one commit
// group): k16 steps of 16 rows of dO and Q.
__device__ __forceinline__ void a5_issue_dkv(float dk[32], float dv[32], const u32 za[4][4], const u32 sa[4][4],
                                             const unsigned char *buf, int hq)
{
    const unsigned char *qs = buf + A5_Q * A5_TILE_BYTES, *gs = buf + A5_DO * A5_TILE_BYTES;
    const unsigned long long dgb = a5_desc(gs + 64 * hq * 128, 8192), dqb = a5_desc(qs + 64 * hq * 128, 8192);
    A5_FENCE();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {   // 16 rows (2048 bytes) a step: +128
        A5_MMA_RS(dv, za[kk], dgb + 128 * kk, 1);
        A5_MMA_RS(dk, sa[kk], dqb + 128 * kk, 1);
    }
    A5_COMMIT();
}

// Warpgroup w's key work over one or two halves of queries: the second
// half's S^T and dP^T are multiplied while the first half's probabilities
// are computed.  Box 1 overwrites V: row r of it is written by the
// warpgroup that owns key r, after its own last read of V row r (half 1's
// dP^T, waited for).
template <bool TWO>
__device__ __forceinline__ void a5_keys(float dk[32], float dv[32], const unsigned char *buf, unsigned char *box0,
                                        unsigned char *box1, int w, int wt, const bool kvis[2], int L, float scale2,
                                        float dscale, bool drop)
{
    float s0[32], dp0[32], s1[32], dp1[32];
    u32 za[4][4], sa[4][4];
    a5_issue_sdp(s0, dp0, buf, 0, w);
    if (TWO) {
        a5_issue_sdp(s1, dp1, buf, 1, w);
        A5_WAIT(1);
    } else {
        A5_WAIT(0);
    }
    a5_probs(za, sa, s0, dp0, buf, box0, 0, w, wt, kvis, L, scale2, dscale, drop);
    a5_issue_dkv(dk, dv, za, sa, buf, 0);
    if (TWO) {
        A5_WAIT(1);   // half 1's S^T and dP^T (half 0's dV, dK may still run)
        u32 za1[4][4], sa1[4][4];
        a5_probs(za1, sa1, s1, dp1, buf, box1, 1, w, wt, kvis, L, scale2, dscale, drop);
        a5_issue_dkv(dk, dv, za1, sa1, buf, 1);
    }
    A5_WAIT(0);
}

// The warpgroup's 64 rows of an m64n64 accumulator (times scale) into
// rows 64 w .. of a tile, f16 pairs.
__device__ __forceinline__ void a5_put_acc(unsigned char *tile, const float acc[32], float scale, int w, int wt)
{
    const int lane = wt & 31, g = lane >> 2, t = lane & 3, r0 = 64 * w + 16 * (wt >> 5) + g;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        *reinterpret_cast<u32 *>(tile + a5_sw(r0, j) + 4 * t) = am_pack(acc[4 * j] * scale, acc[4 * j + 1] * scale);
        *reinterpret_cast<u32 *>(tile + a5_sw(r0 + 8, j) + 4 * t) =
            am_pack(acc[4 * j + 2] * scale, acc[4 * j + 3] * scale);
    }
}
#endif // sm_90a

AT_RUN void attn_wg5_bwd_run(int at_bx, st_t *dq, st_t *dk, st_t *dv, int ldg, const st_t *dctx, const st_t *ctx,
                             const st_t *q, const st_t *k, const st_t *v, int ld, const float *lse,
                             const float *delta, const int *mask, int B, int L, float p, u64 seed, u32 step,
                             u32 salt, const unsigned char *keep)
{
    const int pairs = B * HPC_HEADS;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    (void)delta; (void)seed; (void)step; (void)salt;
    extern __shared__ __align__(1024) unsigned char a5_smem_raw[];
    unsigned char *smem = a5_smem_raw + ((1024u - (a2_smem(a5_smem_raw) & 1023u)) & 1023u);
    unsigned char *box0 = smem + 2 * A5_BUF_BYTES;   // dS^T of queries 0..63; those of 64.. go over V
    const int w = threadIdx.x >> 7, wt = threadIdx.x & 127;
    const float scale = at_scale(), scale2 = scale * A2_LOG2E, dscale = dropout_scale(p);
    const bool drop = p != 0.0f;   // the step launches it with the keep bits wherever p != 0
    int pair = at_bx;
    uint4 o[4];   // the thread's chunks of O for the pair staged last
    if (pair < pairs) a5_stage(smem, o, q, k, v, ld, dctx, ctx, lse, keep, mask, pair / HPC_HEADS, pair % HPC_HEADS, L);
    for (int it = 0; pair < pairs; pair += gridDim.x, it++) {
        unsigned char *buf = smem + (it & 1) * A5_BUF_BYTES;
        const int b = pair / HPC_HEADS, h = pair % HPC_HEADS, next = pair + gridDim.x;
        a2_wait0();         // this pair's group (the only one in flight)
        __syncthreads();    // every thread's pieces have landed
        a5_delta(buf, o, L);   // before o takes the next pair's chunks
        if (next < pairs)
            a5_stage(smem + ((it + 1) & 1) * A5_BUF_BYTES, o, q, k, v, ld, dctx, ctx, lse, keep, mask,
                     next / HPC_HEADS, next % HPC_HEADS, L);
        a5_fence_async();   // the cp.async bytes are read by wgmma (the async proxy)
        __syncthreads();    // delta is whole

        const int key0 = 64 * w + 16 * (wt >> 5) + ((wt & 31) >> 2);
        bool kvis[2];
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int key = key0 + 8 * hh;
            kvis[hh] = key < L && (!mask || reinterpret_cast<const int *>(buf + A5_MASK_OFF)[key] != 0);
        }
        float dkacc[32], dvacc[32];
#pragma unroll
        for (int i = 0; i < 32; i++) dkacc[i] = dvacc[i] = 0.0f;
        unsigned char *vs = buf + A5_V * A5_TILE_BYTES;
        // At L <= 64 the second half of queries is skipped (its dS^T rows
        // are never read: dQ sums the keys below L rounded up to 16).  Two
        // straight paths: with the halves' wgmma under a branch inside one,
        // or under a condition ptxas cannot prove warp-uniform (say the
        // warpgroup's), it serializes every wgmma of the kernel (C7514,
        // C7520).
        if (L > 64)
            a5_keys<true>(dkacc, dvacc, buf, box0, vs, w, wt, kvis, L, scale2, dscale, drop);
        else
            a5_keys<false>(dkacc, dvacc, buf, box0, vs, w, wt, kvis, L, scale2, dscale, drop);
        a5_fence_async();   // dS^T, written by threads, is read by wgmma
        __syncthreads();    // both boxes are whole; every read of Q and dO is done

        unsigned char *ks = buf + A5_K * A5_TILE_BYTES, *qs = buf + A5_Q * A5_TILE_BYTES;
        unsigned char *gs = buf + A5_DO * A5_TILE_BYTES;
        a5_put_acc(qs, dkacc, scale, w, wt);   // dK through Q's rows, dV through dO's
        a5_put_acc(gs, dvacc, 1.0f, w, wt);
        // dQ^T (64 columns x the 64 queries of box w) = K^T dS^T over every key
        float dqt[32];
#pragma unroll
        for (int i = 0; i < 32; i++) dqt[i] = 0.0f;
        const unsigned char *box = w == 0 ? box0 : vs;
        const unsigned long long dkt = a5_desc(ks, 8192), dbx = a5_desc(box, 8192);
        A5_FENCE();
#pragma unroll
        for (int kk = 0; kk < 8; kk++)   // the keys below L, 16 rows (+128) a step (rows past L are zeros)
            if (16 * kk < L) A5_MMA_SS(dqt, dkt + 128 * kk, dbx + 128 * kk, 1, 1);
        A5_COMMIT_WAIT();
        __syncthreads();   // every read of K is done: dQ goes through its rows
        {
            const int lane = wt & 31, g = lane >> 2, t = lane & 3, c0 = 16 * (wt >> 5) + g;   // columns c0, c0 + 8
            unsigned short *kh = reinterpret_cast<unsigned short *>(ks);
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int col = c0 + 8 * (c >> 1), qi = 64 * w + 8 * j + 2 * t + (c & 1);
                    kh[(a5_sw(qi, col >> 3) >> 1) + (col & 7)] = (unsigned short)(am_pack(dqt[4 * j + c] * scale, 0.0f) & 0xFFFFu);
                }
        }
        __syncthreads();
        // dQ (K's rows), dK (Q's), dV (dO's) out in 16-byte pieces, rows below L
        {
            const int c = threadIdx.x & 7, r0 = threadIdx.x >> 3;   // chunk c of rows r0 + 32 j
#pragma unroll
            for (int out = 0; out < 3; out++) {
                const unsigned char *tile = out == 0 ? ks : out == 1 ? qs : gs;
                st_t *base = (out == 0 ? dq : out == 1 ? dk : dv) + (i64)b * L * ldg + h * AT_D + c * 8;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int r = r0 + 32 * j;
                    if (r < L)
                        *reinterpret_cast<uint4 *>(base + (i64)r * ldg) =
                            *reinterpret_cast<const uint4 *>(tile + a5_sw(r, c));
                }
            }
        }
        // (no barrier here: the next pair's first one orders these reads of
        // this buffer before the stage that refills it)
    }
#else
    // Not built for sm_90a: never launched (StepPhase.target; v4's phase
    // takes these rows there).  A launch that bypassed that stops here
    // rather than leave dQ, dK and dV unwritten.
    (void)at_bx; (void)pairs; (void)dq; (void)dk; (void)dv; (void)ldg; (void)dctx; (void)ctx; (void)q; (void)k;
    (void)v; (void)ld; (void)lse; (void)delta; (void)mask; (void)L; (void)p; (void)seed; (void)step; (void)salt;
    (void)keep;
    __trap();
#endif
}

#endif // head size 64, f16

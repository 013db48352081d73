// compiler/kernels/softmax.cu — attention probabilities in one pass:
//   probs = softmax_k(scale * scores) with masked keys removed (probability
//           exactly 0, as ck_attn_softmax_fwd): key k of batch b is masked
//           when mask[b * Lk + k] == 0, and with HPC_CAUSAL when
//           k > q + (Lk - Lq); a row with every key masked is all zeros;
//   out   = dropout(probs), index = the flat index in (B, NH, Lq, Lk).
// One warp per row (4 rows per 128-thread block), the row in registers, so
// Lk <= HPC_SOFTMAX_MAXLEN (max_positions rounded up to 128).  When Lk is a
// multiple of 4 each lane takes chunks of 4 adjacent keys (one 8- or 16-byte
// access): key 4 (lane + 32 i) + q; otherwise single keys: lane + 32 i.
//
// The dropout mask may be saved as bits so that the backward need not run
// Philox again: mask_bits (rows, W) u32 with W = 4 * ceil(Lk / 128); bit
// `lane` of word i * CH + q of a row is the key above (CH = 4 or 1).  The
// layout is private to this pair of kernels.  Pass NULL to both kernels to
// regenerate the mask instead.

#define SM_PER_LANE (HPC_SOFTMAX_MAXLEN / 32)

__device__ __forceinline__ bool sm_masked(const int *mask, int b, int q, int k, int Lq, int Lk)
{
    if (mask && mask[(i64)b * Lk + k] == 0) return true;
    return HPC_CAUSAL && k > q + (Lk - Lq);
}

__device__ __forceinline__ int sm_words(int Lk) { return 4 * ((Lk + 127) / 128); }

template <int CH>
__device__ __forceinline__ void sm_fwd_row(st_t *out, st_t *probs, const st_t *scores, const int *mask,
                                           u32 *mask_bits, float scale, int Lq, int Lk, float p, u64 seed,
                                           u32 step, u32 salt, i64 row)
{
    constexpr int NI = SM_PER_LANE / CH;
    int lane = threadIdx.x & 31;
    int b = (int)(row / ((i64)HPC_HEADS * Lq)), q = (int)(row % Lq);
    const st_t *src = scores + row * Lk;
    float v[NI][CH];
    float m = HPC_NEG_INF;
#pragma unroll
    for (int i = 0; i < NI; i++) {
        int k0 = CH * (lane + 32 * i);
#pragma unroll
        for (int c = 0; c < CH; c++) v[i][c] = HPC_NEG_INF;
        if (k0 >= Lk) continue;
        float x[CH];
        load_n<CH>(src + k0, x);
#pragma unroll
        for (int c = 0; c < CH; c++) {
            if (!sm_masked(mask, b, q, k0 + c, Lq, Lk)) v[i][c] = scale * x[c];
            m = fmaxf(m, v[i][c]);
        }
    }
    m = warp_max(m);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < NI; i++)
#pragma unroll
        for (int c = 0; c < CH; c++) {
            v[i][c] = v[i][c] == HPC_NEG_INF ? 0.0f : expf(v[i][c] - m);
            sum += v[i][c];
        }
    sum = warp_sum(sum);
    float inv = sum != 0.0f ? 1.0f / sum : 0.0f;   // NaN sum: NaN row, not a masked one
    float s = dropout_scale(p);
    int W = sm_words(Lk);
#pragma unroll
    for (int i = 0; i < NI; i++) {
        int k0 = CH * (lane + 32 * i);
        if (CH * 32 * i >= Lk) break;   // uniform across the warp
        float pr[CH], o[CH];
#pragma unroll
        for (int c = 0; c < CH; c++) {
            int k = k0 + c;
            bool keep = k < Lk && (p == 0.0f || philox_keep(seed, (u64)(row * Lk + k), step, salt, p));
            if (mask_bits) {
                u32 bits = __ballot_sync(0xffffffffu, keep);
                if (lane == 0) mask_bits[row * W + i * CH + c] = bits;
            }
            pr[c] = v[i][c] * inv;
            o[c] = keep ? pr[c] * s : 0.0f;
        }
        if (k0 >= Lk) continue;
        if (probs) store_n<CH>(probs + row * Lk + k0, pr);
        store_n<CH>(out + row * Lk + k0, o);
    }
}

extern "C" __global__ void __launch_bounds__(128)
KN(attn_softmax_fwd)(st_t *out,          // (B, NH, Lq, Lk) out: dropout(probs)
                     st_t *probs,        // (B, NH, Lq, Lk) out: probs before dropout, or NULL
                     const st_t *scores, // (B, NH, Lq, Lk)
                     const int *mask,    // (B, Lk) i32, or NULL
                     u32 *mask_bits,     // (B * NH * Lq, 4 * ceil(Lk / 128)) out, or NULL
                     float scale, int B, int Lq, int Lk, float p, u64 seed, u32 step, u32 salt)
{
    i64 rows = (i64)B * HPC_HEADS * Lq;
    i64 row = (i64)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (row >= rows) return;
    if (Lk % 4 == 0) sm_fwd_row<4>(out, probs, scores, mask, mask_bits, scale, Lq, Lk, p, seed, step, salt, row);
    else sm_fwd_row<1>(out, probs, scores, mask, mask_bits, scale, Lq, Lk, p, seed, step, salt, row);
}

template <int CH>
__device__ __forceinline__ void sm_bwd_row(st_t *dscores, const st_t *dout, const st_t *probs,
                                           const u32 *mask_bits, float scale, int Lk, float p, u64 seed,
                                           u32 step, u32 salt, i64 row)
{
    constexpr int NI = SM_PER_LANE / CH;
    int lane = threadIdx.x & 31;
    float s = dropout_scale(p);
    int W = sm_words(Lk);
    float pr[NI][CH], dp[NI][CH];
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < NI; i++) {
        int k0 = CH * (lane + 32 * i);
#pragma unroll
        for (int c = 0; c < CH; c++) pr[i][c] = dp[i][c] = 0.0f;
        if (k0 >= Lk) continue;
        float g[CH];
        load_n<CH>(probs + row * Lk + k0, pr[i]);
        load_n<CH>(dout + row * Lk + k0, g);
#pragma unroll
        for (int c = 0; c < CH; c++) {
            int k = k0 + c;
            bool keep = p == 0.0f ||
                        (mask_bits ? (mask_bits[row * W + i * CH + c] >> lane) & 1u
                                   : philox_keep(seed, (u64)(row * Lk + k), step, salt, p));
            dp[i][c] = keep ? g[c] * s : 0.0f;
            dot += dp[i][c] * pr[i][c];
        }
    }
    dot = warp_sum(dot);
#pragma unroll
    for (int i = 0; i < NI; i++) {
        int k0 = CH * (lane + 32 * i);
        if (k0 >= Lk) continue;
        float o[CH];
#pragma unroll
        for (int c = 0; c < CH; c++) o[c] = scale * pr[i][c] * (dp[i][c] - dot);
        store_n<CH>(dscores + row * Lk + k0, o);
    }
}

// dscores = scale * probs * (dp - sum_k dp * probs), dp = dropout_bwd(dout).
// probs: the forward's pre-dropout probabilities (its `out` when p == 0).
// dscores may alias dout.
extern "C" __global__ void __launch_bounds__(128)
KN(attn_softmax_bwd)(st_t *dscores,      // (B, NH, Lq, Lk) out
                     const st_t *dout,   // (B, NH, Lq, Lk) gradient of the forward's out
                     const st_t *probs,  // (B, NH, Lq, Lk)
                     const u32 *mask_bits, // from the forward, or NULL: regenerate
                     float scale, int B, int Lq, int Lk, float p, u64 seed, u32 step, u32 salt)
{
    i64 rows = (i64)B * HPC_HEADS * Lq;
    i64 row = (i64)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (row >= rows) return;
    if (Lk % 4 == 0) sm_bwd_row<4>(dscores, dout, probs, mask_bits, scale, Lk, p, seed, step, salt, row);
    else sm_bwd_row<1>(dscores, dout, probs, mask_bits, scale, Lk, p, seed, step, salt, row);
}

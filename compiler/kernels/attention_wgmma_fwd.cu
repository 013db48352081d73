// compiler/kernels/attention_wgmma_fwd.cu — the attention forward on
// Hopper's warpgroup MMA (attn_wg5_fwd_run, HPC_ATTN_KERNELS=v5): rows of
// 65 to 128 keys, head size 64, f16.  Builds on attention_wgmma.cu (the
// swizzle, descriptors and wgmma macros), attention_mma2.cu (cp.async,
// exp2) and attention_mma.cu (am_pack, am_bits8, the keep bits' layout).
// Its code is sm_90a's only: the step launches it only from a module built
// for sm_90a (StepPhase.target), where attn_mma2_fwd takes the same rows
// elsewhere.  Its contract is attn_mma2_fwd_run's: ctx, lse, the keep bits
// and the dropout draws are the same, so either backward reads them.
//
// Why: attn_mma2_fwd (mma.sync, four warps a block) takes about 145 us a
// layer at BERT-base 256 x 128 (H100) against about 60 by its bytes,
// bound by issue (ncu, twenty-second session): each warp walks the keys in
// two tiles of 64 with an online softmax, loading its B fragments by
// ldmatrix.  Here every key of a row fits one pass, so the softmax is
// exact (no rescaling), and one warpgroup instruction multiplies 64 x 64 x
// 16 from shared memory while the warps draw the dropout bits.  On an H100
// (2026-12-06): 103 against 147 us a layer at 256 x 128, still bound by
// issue (ncu: about 540 of a warp's 1,862 instructions are the Philox
// draws, which the keep bits' contract fixes, and 579 the softmax).
//
// A block of 128 threads (one warpgroup) takes the 64 queries of tile
// at_bx of (b = at_bz, head = at_by), the grid of attn_mma2_fwd:
//  1. Q (64 rows), K (128 rows) and the key mask land by cp.async in one
//     group, V in a second (the 128-byte swizzle, zeros past L);
//  2. meanwhile each thread draws its rows' dropout bits (am_bits8: the
//     same draws as attn_mma2_fwd, so the same keep bits) into shared
//     memory, a row's 16 bytes as the keep output stores them;
//  3. S = Q K^T as two m64n64 accumulators (keys 0..63 and 64..127, 4 k16
//     steps each, both operands K-major in shared memory);
//  4. in registers: hidden keys (past L, the padding mask, causal) to
//     -inf (skipped where the block sees every key), the row maximum m,
//     P = 2^(S scale log2 e - m'), l = sum P, the dropped elements to 0,
//     rounded to f16 as the A operand of
//  5. O = P V (8 k16 steps, V MN-major in shared memory);
//  6. ctx = O (1 / (1 - p)) / l and lse = m scale + ln l (+inf where l is
//     0: a row that sees no key) out; O through Q's tile in 16-byte pieces.

#if HPC_HEAD_DIM == 64 && HPC_DTYPE == 1

#define F5_QROWS 64                              // queries a block
#define F5_Q_OFF 0                               // Q: 64 rows of 128 bytes
#define F5_K_OFF (F5_QROWS * 128)                // K: A5_ROWS rows
#define F5_V_OFF (F5_K_OFF + A5_TILE_BYTES)      // V: A5_ROWS rows
#define F5_KEEP_OFF (F5_V_OFF + A5_TILE_BYTES)   // the block's keep bits: AT_KEEP_BYTES a query
#define F5_VIS_OFF (F5_KEEP_OFF + F5_QROWS * AT_KEEP_BYTES)   // 128 bits: key k visible
#define F5_MASK_OFF (F5_VIS_OFF + 16)            // the key mask as staged (A5_ROWS ints)
#define F5_SMEM_BYTES (F5_MASK_OFF + A5_ROWS * 4 + 1024)   // + the 1024-byte alignment
static_assert(F5_SMEM_BYTES <= 48 * 1024, "static shared memory: no opt-in for more");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The staged rows of one head (128-byte swizzle, zeros past L): rows r0 ..
// r0 + n - 1 of x (row stride ld) into tile, the thread's 16-byte chunk
// tid % 8 of rows tid / 8 + 16 j.
__device__ __forceinline__ void f5_stage_rows(unsigned char *tile, const st_t *x, int ld, int b, int h, int r0,
                                              int n, int L)
{
    const int c = threadIdx.x & 7, rt = threadIdx.x >> 3;
    const st_t *base = x + ((i64)b * L) * ld + h * AT_D + c * 8;
#pragma unroll
    for (int j = 0; j < A5_ROWS / 16; j++) {
        const int r = rt + 16 * j;
        if (j * 16 >= n) break;   // n is 64 or 128: a constant where inlined
        const bool in = r0 + r < L;
        a2_cp16(tile + a5_sw(r, c), base + (i64)(in ? r0 + r : 0) * ld, in);
    }
}

// Rows row and row + 8 of the block's queries (row < 64): the thread's
// dropout draws, keys 8 (t + 4 i) .. + 7 (i = 0..3), as the bytes of the
// keep output (rows at or past L: none).
__device__ __forceinline__ void f5_draw(unsigned char *keep_s, int row, int q0, i64 bh, int L, int t, float p,
                                        u64 seed, u32 step, u32 salt)
{
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int r = row + 8 * rr;
        if (q0 + r >= L) continue;
        const i64 flat = (bh * L + q0 + r) * L;
#pragma unroll
        for (int i = 0; i < 4; i++)
            keep_s[r * AT_KEEP_BYTES + t + 4 * i] = (unsigned char)am_bits8(flat + 8 * (t + 4 * i), p, seed, step, salt);
    }
}

// S += Q K^T for keys 64 hk .. 64 hk + 63 issued.
__device__ __forceinline__ void f5_issue_s(float s[32], const unsigned char *smem, int hk)
{
    const unsigned long long dq = a5_desc(smem + F5_Q_OFF, 16), dk = a5_desc(smem + F5_K_OFF + 64 * hk * 128, 16);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) A5_MMA_SS(s, dq + 2 * kk, dk + 2 * kk, 0, 0);   // 32 bytes of head a step
}

// Hidden elements of one key half to -inf (unless ALL: every key is
// visible to every row), and their row maxima into mx.  Element (j, c):
// query row 16 warp + g + 8 (c >> 1), key 64 hk + 8 j + 2 t + (c & 1);
// vis2: the half's two 32-bit words of visible keys, shifted right by 2 t.
template <bool ALL>
__device__ __forceinline__ void f5_hide(float s[32], float mx[2], const u32 vis2[2], int hk, int qrow, int t)
{
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            if (!ALL) {
                bool on = (vis2[j >> 2] >> (8 * (j & 3) + (c & 1))) & 1u;
#if HPC_CAUSAL
                on = on && 64 * hk + 8 * j + 2 * t + (c & 1) <= qrow + 8 * (c >> 1);
#else
                (void)hk; (void)qrow; (void)t;
#endif
                s[4 * j + c] = on ? s[4 * j + c] : HPC_NEG_INF;
            }
            mx[c >> 1] = fmaxf(mx[c >> 1], s[4 * j + c]);
        }
}

// P of one key half: l += 2^(s scale2 - mref), the dropped elements to 0
// (kw: the rows' keep words of the half, shifted right by 2 t), packed as
// the A operands of the half's four k16 steps of P V.
__device__ __forceinline__ void f5_probs(u32 pa[4][4], const float s[32], float l[2], const float mref[2],
                                         const u32 kw[2][2], float scale2)
{
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float pe[4];
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int rr = c >> 1;
            const float e = a2_exp2(fmaf(s[4 * j + c], scale2, -mref[rr]));
            l[rr] += e;
            pe[c] = (kw[rr][j >> 2] >> (8 * (j & 3) + (c & 1))) & 1u ? e : 0.0f;   // 1/(1-p) with 1/l at the end
        }
        pa[j >> 1][2 * (j & 1)] = am_pack(pe[0], pe[1]);
        pa[j >> 1][2 * (j & 1) + 1] = am_pack(pe[2], pe[3]);
    }
}
#endif // sm_90a

// keep (nullptr: none): the dropout's keep bits for the backward, as
// attn_mma2_fwd_run writes them (AT_KEEP_BYTES a query row).
AT_RUN void attn_wg5_fwd_run(int at_bx, int at_by, int at_bz, st_t *ctx, float *lse, const st_t *q, const st_t *k,
                             const st_t *v, int ld, const int *mask, int B, int L, float p, u64 seed, u32 step,
                             u32 salt, unsigned char *keep)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    (void)B;
    __shared__ __align__(1024) unsigned char f5_smem_raw[F5_SMEM_BYTES];
    unsigned char *smem = f5_smem_raw + ((1024u - (a2_smem(f5_smem_raw) & 1023u)) & 1023u);
    unsigned char *keep_s = smem + F5_KEEP_OFF;
    const int b = at_bz, h = at_by, q0 = at_bx * F5_QROWS;
    const i64 bh = (i64)b * HPC_HEADS + h;
    const int wt = threadIdx.x, warp = wt >> 5, lane = wt & 31, g = lane >> 2, t = lane & 3;
    const int row = 16 * warp + g;   // the thread's rows: row and row + 8 of the block's queries
    const float scale2 = at_scale() * A2_LOG2E, dscale = dropout_scale(p);
    const bool drop = p != 0.0f;

    f5_stage_rows(smem + F5_Q_OFF, q, ld, b, h, q0, F5_QROWS, L);
    f5_stage_rows(smem + F5_K_OFF, k, ld, b, h, 0, A5_ROWS, L);
    if (mask != nullptr) a2_cp4(smem + F5_MASK_OFF + 4 * wt, mask + (i64)b * L + (wt < L ? wt : 0), wt < L);
    a2_commit();
    f5_stage_rows(smem + F5_V_OFF, v, ld, b, h, 0, A5_ROWS, L);
    a2_commit();
    if (drop) f5_draw(keep_s, row, q0, bh, L, t, p, seed, step, salt);   // while the rows land

    a2_wait1();         // Q, K and the mask
    a5_fence_async();   // cp.async bytes are read by wgmma (the async proxy)
    __syncthreads();
    float s0[32], s1[32];
#pragma unroll
    for (int i = 0; i < 32; i++) s0[i] = s1[i] = 0.0f;
    A5_FENCE();
    f5_issue_s(s0, smem, 0);
    f5_issue_s(s1, smem, 1);
    A5_COMMIT();
    {   // key k visible: below L, not padding (bit k % 32 of word k / 32)
        const bool vis = wt < L && (mask == nullptr || reinterpret_cast<const int *>(smem + F5_MASK_OFF)[wt] != 0);
        const u32 bits = __ballot_sync(0xffffffffu, vis);
        if (lane == 0) reinterpret_cast<u32 *>(smem + F5_VIS_OFF)[warp] = bits;
    }
    __syncthreads();    // the visible bits and every row's keep bits
    const uint4 vw = *reinterpret_cast<const uint4 *>(smem + F5_VIS_OFF);
    u32 kw[2][2][2];   // [key half][row][word]: keep bits, shifted right by 2 t
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        uint4 w = make_uint4(~0u, ~0u, ~0u, ~0u);
        if (drop) w = *reinterpret_cast<const uint4 *>(keep_s + (row + 8 * rr) * AT_KEEP_BYTES);
        kw[0][rr][0] = w.x >> (2 * t);
        kw[0][rr][1] = w.y >> (2 * t);
        kw[1][rr][0] = w.z >> (2 * t);
        kw[1][rr][1] = w.w >> (2 * t);
    }
    if (keep != nullptr && drop && wt < F5_QROWS && q0 + wt < L)
        *reinterpret_cast<uint4 *>(keep + (bh * L + q0 + wt) * AT_KEEP_BYTES) =
            *reinterpret_cast<const uint4 *>(keep_s + wt * AT_KEEP_BYTES);

    A5_WAIT(0);
    float mx[2] = {HPC_NEG_INF, HPC_NEG_INF};
    {
        const u32 v0[2] = {vw.x >> (2 * t), vw.y >> (2 * t)}, v1[2] = {vw.z >> (2 * t), vw.w >> (2 * t)};
        // L 128 without padding (the same for the whole block): no element
        // to hide, 64 selects a thread fewer
        if (!HPC_CAUSAL && (vw.x & vw.y & vw.z & vw.w) == ~0u) {
            f5_hide<true>(s0, mx, v0, 0, q0 + row, t);
            f5_hide<true>(s1, mx, v1, 1, q0 + row, t);
        } else {
            f5_hide<false>(s0, mx, v0, 0, q0 + row, t);
            f5_hide<false>(s1, mx, v1, 1, q0 + row, t);
        }
    }
    float mref[2], l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 1));
        mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 2));
        // the exponent's reference: 0 where the row sees no key, so its
        // hidden scores (-inf) give exactly 0
        mref[rr] = mx[rr] == HPC_NEG_INF ? 0.0f : mx[rr] * scale2;
    }
    u32 pa[2][4][4];
    f5_probs(pa[0], s0, l, mref, kw[0], scale2);
    f5_probs(pa[1], s1, l, mref, kw[1], scale2);

    a2_wait0();         // V
    a5_fence_async();
    __syncthreads();    // also: every warp's S has landed, so Q's tile is free for O below
    float o[32];
#pragma unroll
    for (int i = 0; i < 32; i++) o[i] = 0.0f;
    {
        const unsigned long long dv = a5_desc(smem + F5_V_OFF, 8192);
        A5_FENCE();
#pragma unroll
        for (int kk = 0; kk < 8; kk++)   // 16 keys (2048 bytes of V) a step: +128
            A5_MMA_RS(o, pa[kk >> 2][kk & 3], dv + 128 * kk, 1);
        A5_COMMIT_WAIT();
    }

    float inv[2];
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
        l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
        inv[rr] = l[rr] == 0.0f ? 0.0f : dscale / l[rr];
        const int r = q0 + row + 8 * rr;
        if (t == 0 && r < L)
            lse[bh * L + r] = l[rr] == 0.0f ? HPC_INF : (mx[rr] * scale2 + log2f(l[rr])) * A2_LN2;
    }
    unsigned char *os = smem + F5_Q_OFF;   // O's rows through Q's tile
#pragma unroll
    for (int j = 0; j < 8; j++) {
        *reinterpret_cast<u32 *>(os + a5_sw(row, j) + 4 * t) = am_pack(o[4 * j] * inv[0], o[4 * j + 1] * inv[0]);
        *reinterpret_cast<u32 *>(os + a5_sw(row + 8, j) + 4 * t) =
            am_pack(o[4 * j + 2] * inv[1], o[4 * j + 3] * inv[1]);
    }
    __syncthreads();
    {
        const int c = wt & 7, rt = wt >> 3;
        st_t *base = ctx + ((i64)b * L + q0) * HPC_HIDDEN + h * AT_D + c * 8;
#pragma unroll
        for (int j = 0; j < F5_QROWS / 16; j++) {
            const int r = rt + 16 * j;
            if (q0 + r < L)
                *reinterpret_cast<uint4 *>(base + (i64)r * HPC_HIDDEN) = *reinterpret_cast<const uint4 *>(os + a5_sw(r, c));
        }
    }
#else
    // Not built for sm_90a: never launched (StepPhase.target; attn_mma2_fwd
    // takes these rows there).  A launch that bypassed that stops here
    // rather than leave ctx and lse unwritten.
    (void)at_bx; (void)at_by; (void)at_bz; (void)ctx; (void)lse; (void)q; (void)k; (void)v; (void)ld; (void)mask;
    (void)B; (void)L; (void)p; (void)seed; (void)step; (void)salt; (void)keep;
    __trap();
#endif
}

#endif // head size 64, f16

/* compiler/emit_ops_ln_site.c — the fused LayerNorm sites (LN_RESIDUAL,
 * LN_RESIDUAL_BWD: compiler/fuse_layernorm.c): the forward, the backward's
 * kernels (v2, the default, and v3: HPC_LN_BWD) and its sum phase; see
 * emit_ops_body_internal.h and docs/fuse.md. */
#include "emit_ops_body_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- fused LayerNorm sites (LN_RESIDUAL, LN_RESIDUAL_BWD) ------------- */

/* Rows of D % 8 == 0 (every BERT size): a block per row holds the row in
 * registers as the LayerNorm kernels (emit_ops_layernorm.c: ln_threads,
 * ln_nu), one Philox draw per 8 elements at the flat index row * D +
 * column, as the cpu reference and the unfused DROPOUT draw it.  The extra
 * outputs come in a.yk[k - 1] (0 when the graph has none). */
static HpcStatus ln_site_check(const EopGen *gen, long long D, HpcError *err)
{
    if (ln_vec_ok(D) && eopb_ln_vec_dtypes(gen)) return HPC_OK;
    return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: node %d (%s): the fused LayerNorm kernel needs a row size "
                    "that is a multiple of 8 (have %lld) and float values; compile with HPC_FUSE_LN=0 or run "
                    "on the cpu backend", gen->id, OUTN->name, D);
}

HpcStatus eopb_ln_residual(EopGen *gen, HpcError *err)
{
    const IrNode *n = OUTN;
    long long D = (long long)last_dim(n);
    HpcStatus st = ln_site_check(gen, D, err);
    if (st) return st;
    IrLnFusedAttr la = fuse_ln_attr_get(n);
    IrFusedAttr fa = {la.p, (int32_t)la.salt, 0, (uint8_t)la.mid, 0, 0};
    int nu = ln_nu(D);
    char vm[64], va[64];
    eopb_round_expr((DType)la.mid, "dropout_elem(m8, j, on, xv8[j], dscale)", vm, sizeof vm);
    eopb_round_expr((DType)la.aux, "v + rv8[j]", va, sizeof va);
    StrBuf *s = eopb_ln_row_phase(gen, n->n_in == 5 ? "ln_residual_bias_fwd" : "ln_residual_fwd", n, D);
    eopb_dropout_consts(gen, s, fa);
    /* la.xhat: output 3 is xhat = (s - mean) * rstd in f16, written with y; s stays in registers */
    DType saved = la.xhat ? DT_F16 : (DType)la.aux;
    const char *aux = ir_dtype_name(saved), *low = ir_dtype_name((DType)la.low);
    strbuf_printf(s, "    float *o_mean = (float *)a.yk[0], *o_rstd = (float *)a.yk[1];\n"
                   "    %s *o_sum = (%s *)a.yk[2];\n    %s *o_low = (%s *)a.yk[3];\n"
                   "    float xv[%d][8];\n#pragma unroll\n    for (int u = 0; u < %d; u++) {\n"
                   "        const int cu = threadIdx.x + %d * u;\n"
                   "        for (int j = 0; j < 8; j++) xv[u][j] = 0.0f;\n        if (cu >= %lld) continue;\n"
                   "        const i64 e0 = row * %lldLL + cu * 8;\n        float xv8[8], rv8[8];\n"
                   "        ld8_%s(x0 + e0, xv8);\n        ld8_%s(x1 + e0, rv8);\n",
                ctype(saved), ctype(saved), ctype((DType)la.low), ctype((DType)la.low),
                nu, nu, ln_threads(D), D / 8, D, ir_dtype_name(INN(0)->dtype), ir_dtype_name(INN(1)->dtype));
    if (n->n_in == 5)
        strbuf_printf(s, "        float bv8[8];\n        ld8_%s(x4 + cu * 8, bv8);\n"
                       "        for (int j = 0; j < 8; j++) xv8[j] += bv8[j];\n", ir_dtype_name(INN(4)->dtype));
    strbuf_printf(s, "        const u32 m8 = philox_mask8(ctl->seed, (u64)e0 >> 3, ctl->step, salt, p);\n"
                   "#pragma unroll\n        for (int j = 0; j < 8; j++) {\n            const float v = %s;\n"
                   "            xv[u][j] = %s;\n        }\n",
                vm, va);
    if (!la.xhat) strbuf_printf(s, "        if (o_sum) st8_%s(o_sum + e0, xv[u]);\n", aux);
    strbuf_add(s, "    }\n");
    eopb_ln_row_stats(s, D, (double)(float)la.eps);
    strbuf_printf(s, "    if (threadIdx.x == 0) {\n        if (o_mean) o_mean[row] = mean;\n        if (o_rstd) o_rstd[row] = rstd;\n    }\n"
                   "#pragma unroll\n    for (int u = 0; u < %d; u++) {\n        const int cu = threadIdx.x + %d * u;\n"
                   "        if (cu >= %lld) break;\n        float g[8], bt[8], r[8]%s;\n"
                   "        ld8_%s(x2 + cu * 8, g);\n        ld8_%s(x3 + cu * 8, bt);\n"
                   "%s"
                   "        st8_%s(y + row * %lldLL + cu * 8, r);\n"
                   "        if (o_low) st8_%s(o_low + row * %lldLL + cu * 8, r);\n",
                nu, ln_threads(D), D / 8, la.xhat ? ", h[8]" : "", ir_dtype_name(INN(2)->dtype),
                ir_dtype_name(INN(3)->dtype),
                la.xhat ? "        for (int j = 0; j < 8; j++) {\n            h[j] = (xv[u][j] - mean) * rstd;\n"
                          "            r[j] = h[j] * g[j] + bt[j];\n        }\n"
                        : "        for (int j = 0; j < 8; j++) r[j] = (xv[u][j] - mean) * rstd * g[j] + bt[j];\n",
                ir_dtype_name(n->dtype), D, low, D);
    /* xhat's rows are XS apart: D, or D + IR_XHAT_ONES_PAD with its ones column (la.ones) */
    int xo = la.xhat ? ir_output(gen->g, gen->id, 3) : -1;
    long long XS = xo >= 0 ? (long long)last_dim(&gen->g->nodes[xo]) : D;
    if (la.xhat) strbuf_printf(s, "        if (o_sum) st8_%s(o_sum + row * %lldLL + cu * 8, h);\n", aux, XS);
    strbuf_add(s, "    }\n");
    if (la.xhat && XS > D) {
        HPC_ASSERT(XS == D + 8);
        strbuf_printf(s, "    if (o_sum && threadIdx.x == 0) {\n"
                       "        const float one[8] = {1.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};\n"
                       "        st8_%s(o_sum + row * %lldLL + %lldLL, one);\n    }\n",
                    aux, XS, D);
    }
    return HPC_OK;
}

/* ---- LN_RESIDUAL_BWD (the default, "v2") -------------------------------
 *
 * Phase 1: P blocks of G row groups; a group of ln_threads(D) threads (T)
 * owns one row at a time, thread t holding the 8-column chunks t + T u as
 * the forward does.  Group g of block b takes rows b G + g, then + P G, ...
 * (every group of a block makes the same number of passes, so the barrier
 * of the row sums is uniform); the next row's dy, s, mean and rstd are
 * loaded before the current row's sums are reduced (up to 2 chunks per
 * thread), so a warp keeps its loads in flight through the barrier.  Per
 * row: ds, dx = dropout(ds), and per-thread column sums of dy * xhat, dy
 * and the stored dx; at the end the G groups add theirs in order in shared
 * memory and the block writes one partial, 3 x D f32, to
 * sf[b * 3 D + q D + column] (q: dgamma, dbeta, dbias).
 *
 * P = min(cap, ceil(R / (G M))) depends on the run's rows only, so the
 * sums (hence every bit of dgamma, dbeta, dbias) are the same run to run:
 * LNB_MIN_ROWS (M, 2) rows per group when the rows are few (B32 L32: 128
 * blocks, partials 1.2 MB), one wave of resident blocks when they are many
 * (cap = 132 SMs of an H100/H200 times the blocks per SM that
 * __launch_bounds__ asks for: 264 at D = 768, partials 2.4 MB).  Why two
 * rows and not one: each block writes a whole partial row however few rows
 * it reduced, and at B32 L32 one row a group made the partials 2.4 MB
 * beside 7.9 MB of rows; two made the step 0.011 ms faster (H100,
 * 2026-12-06: 3.694 against 3.705 ms, three rounds each, the ranges apart),
 * three 0.018 ms slower (86 blocks leave SMs idle).  The old design had 512
 * blocks of one row group (4 per SM, 12 warps) and 4.7 MB of partials at
 * every shape.
 *
 * Phase 2: one block of LNB_SUM_WARPS warps per 32 of the 3 D partial
 * columns (72 blocks at D = 768, not 24), lane = column so a warp's loads
 * are contiguous; warp w sums parts w, w + 16, ... in double, then warp 0
 * adds the warps' sums in order.
 *
 * HPC_LN_BWD (a hook for comparisons, read when the module is generated,
 * so part of the kernels' text and cache key): "v2,G,CAP[,M]" this design with G groups, at most CAP blocks and at
 * least M rows a group (P = min(CAP, ceil(R / (G M)))); "v3" and
 * "v3,G,CAP[,M[,AHEAD]]" the variant below.
 *
 * ---- LN_RESIDUAL_BWD v3 (opt-in: HPC_LN_BWD=v3) --------------------------
 *
 * Why: v2 runs at about 3.3 TB/s on the H200 (92 us a site at BERT-base
 * 256 x 128), the LayerNorm forward and GELU kernels at 4.0-4.2.  v2 has
 * one row's loads in flight while it reduces the current one (48 bytes a
 * thread: dy in f32, xhat in f16), so by Little's law an SM of 768 threads
 * has at most 36 KB in flight, and less on average: the loads issued at a
 * pass's start have arrived long before its end.
 *
 * What: the same blocks, groups, rows per group and order of every sum as
 * v2 (so the same bits of dgamma, dbeta, dbias run to run, and the same
 * dropout draws), but
 *  - AHEAD rows' loads in flight past the one reduced (2 by default),
 *    held raw as 16-byte vectors (eop_v16: 4 registers for 8 16-bit values,
 *    8 for f32 ones) in slots, and converted to f32 when their row is
 *    reduced; slot k is refilled with the row AHEAD passes on right after
 *    it is converted.  The row loop is unrolled AHEAD times so that each
 *    slot stays in the same registers: v2's copy of the next row into the
 *    current one at a pass's end would, with two rows, wait for the loads
 *    just issued and leave one row in flight.
 *  - the column sums ab (dbeta) and ac (dbias) in shared memory, thread i's
 *    8 at acc[.][i] as two float4 (4 LDS.128 and 4 STS.128 a row): the
 *    second slot of raw rows costs 12-13 registers that the column sums
 *    (24) give back.  ptxas, CUDA 13.0 for sm_90, BERT-base fp16 xhat:
 *    v3 with all three sums in registers wants 90 registers and under
 *    (384, 2)'s 80 spills 24 bytes; with ab and ac in shared memory 80, no
 *    spills (72 where dy is f16); with only ac there it spills 20 bytes.  A
 *    third block of 384 an SM (56 registers) spills 144-176 bytes (28 with
 *    one row ahead), so v3 asks for v2's 2 blocks: 768 threads, 72 KB in
 *    flight.
 *  - dx and a 16-bit y stored with one st.global.v4 a chunk: in v2's loop
 *    nvcc splits st8_f16's 16-byte store of dx into four 4-byte ones.
 * The default AHEAD is 2 where a row in flight takes at most 13 registers
 * (xhat in f16: dy f32 + xhat + rstd), else 1 (an f32 s and dy, or an f32 s
 * with a 16-bit dy and the mean: two rows of 14 spill 4-24 bytes); a
 * given AHEAD is taken as is.  Where the block's static 48 KB of shared
 * memory cannot hold acc with cs and red (at D = 768: GROUPS above 5) the
 * sums stay in registers.  v3 applies where a thread owns one chunk of a
 * row (D <= 2048); past that the module has v2's kernel.
 * Static SASS (scripts/sass-stats.sh, BERT-base fp16, the f32-dy kernel):
 * v2 355 instructions a row in its loop, v3 343 (686 for two rows). */

#define LNB_MIN_ROWS 2   /* rows a group takes at least (M): the comment above */

typedef struct {
    int groups;       /* row groups a block */
    int per;          /* rows a block's pass needs before a second block: G x M */
    int cap;          /* blocks at most */
    int min_blocks;   /* blocks an SM that __launch_bounds__ asks for */
    bool prefetch;    /* the next row's loads in flight (one chunk a thread) */
    int ahead;        /* v3: rows whose loads are in flight past the one being reduced; 0: v2 */
    int acc_shared;   /* v3: bit q: column sum q (lnb_sums) in shared memory, not registers */
} LnBwdShape;

/* v3 holds the rows in flight as raw 16-byte vectors (eop_v16), converted
 * to f32 when their row is reduced: a chunk of 8 is 1 vector of 16-bit
 * values, 2 of f32 ones. */
static int lnb_raw_vectors(DType dt) { return dt == DT_F32 ? 2 : 1; }

static HpcStatus ln_bwd_shape(const EopGen *gen, long long D, LnBwdShape *sh, HpcError *err)
{
    int T = ln_threads(D), nu = ln_nu(D);
    /* registers a thread needs: 3 x 8 column sums and 16 of the row per
     * chunk, 16 more for the next row, about 24 besides: 80 at nu = 1
     * (ptxas: 80, no spills, at D = 768 under (384, 2)) */
    sh->prefetch = nu == 1;
    int regs = 24 + (sh->prefetch ? 56 : 40) * nu;
    sh->groups = T >= 384 ? 1 : 384 / T;
    /* v3's rows ahead unless AHEAD says: two where a row in flight takes at
     * most 13 registers a thread (4 a 16-byte vector of dy and of s or
     * xhat, rstd, the mean in the s form): xhat in f16 with an f32 or
     * 16-bit dy; else one (ptxas at (384, 2), D = 384 and 768: two rows of
     * 14 registers, an f32 s with a 16-bit dy, spill 4 to 24 bytes) */
    bool xhat = fuse_ln_attr_get(OUTN).xhat;
    int row_regs = 4 * (lnb_raw_vectors(INN(0)->dtype) + lnb_raw_vectors(INN(1)->dtype)) + (xhat ? 1 : 2);
    int g = 0, cap = 0, m = LNB_MIN_ROWS, ahead = row_regs <= 13 ? 2 : 1, got = 0, used = 0, version = 2;
    const char *e = getenv("HPC_LN_BWD");
    if (e && *e && strcmp(e, "v2") != 0) {
        bool plain_v3 = strcmp(e, "v3") == 0;
        if (plain_v3) version = 3;
        else got = sscanf(e, "v%d,%d,%d%n,%d%n,%d%n", &version, &g, &cap, &used, &m, &used, &ahead, &used);
        bool ok = plain_v3 || (got >= 3 && !e[used] && g >= 1 && g * T <= 1024 && cap >= 1 && m >= 1 &&
                               (version == 2 ? got <= 4 : version == 3 && ahead >= 1 && ahead <= 2));
        if (!ok)
            return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: node %d (%s): HPC_LN_BWD=%s is not a variant; set it "
                            "to v2, v3, v2,GROUPS,MAXBLOCKS[,ROWS] or v3,GROUPS,MAXBLOCKS[,ROWS[,AHEAD]] (GROUPS "
                            "x %d threads at most 1024, AHEAD 1 or 2), or leave it unset", gen->id, OUTN->name, e, T);
        if (got >= 3) sh->groups = g;
    }
    sh->per = sh->groups * m;
    int threads = sh->groups * T;
    /* v3 where a thread has one chunk (D <= 2048; past that v2's kernel):
     * AHEAD raw rows in flight, ab and ac in shared memory where the
     * block's static 48 KB hold them with cs and red (the v3 comment) */
    if (version == 3 && nu == 1) {
        sh->prefetch = false;
        sh->ahead = ahead;
        long long smem = 64LL * threads + 4LL * (sh->groups - 1) * D + 16LL * sh->groups * (T / 32);
        sh->acc_shared = smem <= 48 * 1024 ? 1 << 1 | 1 << 2 : 0;   /* ab, ac (lnb_sums) */
    }
    /* v2's blocks an SM for v3 too: its registers fit them (the v3 comment) */
    sh->min_blocks = 65536 / regs / threads;
    if (sh->min_blocks < 1) sh->min_blocks = 1;
    sh->cap = cap ? cap : LNB_SMS * sh->min_blocks;
    return HPC_OK;
}

/* Loads row ROW's s (x1) and dy (x0) chunks into SV, DV and its mean, rstd
 * into MN, RS; zeros past the rows and past D.  IN: the indent. */
static void lnb_load_row(StrBuf *s, const EopGen *gen, long long D, const char *in, const char *row,
                         const char *sv, const char *dv, const char *mn, const char *rs)
{
    int nu = ln_nu(D), T = ln_threads(D);
    /* xhat: x1 is xhat (f16) and x2 rstd; the mean stays 0 (unused).  x1's
     * rows are XS apart: D, or D + IR_XHAT_ONES_PAD where the site saved
     * xhat with its ones column (compiler/fuse_ln_dw.c) */
    bool xhat = fuse_ln_attr_get(OUTN).xhat;
    long long XS = (long long)last_dim(INN(1));
    const char *mn_src = xhat ? "0.0f" : "x2[", *mn_end = xhat ? "" : "]", *rs_src = xhat ? "x2[" : "x3[";
    strbuf_printf(s, "%sfloat %s[%d][8], %s[%d][8], %s = 0.0f, %s = 0.0f;\n"
                   "#pragma unroll\n%sfor (int u = 0; u < %d; u++) {\n"
                   "%s    const int cu = t + %d * u;\n"
                   "%s    if (%s < R && cu < %lld) {\n"
                   "%s        ld8_%s(x1 + %s * %lldLL + cu * 8, %s[u]);\n"
                   "%s        ld8_%s(x0 + %s * %lldLL + cu * 8, %s[u]);\n"
                   "%s    } else for (int j = 0; j < 8; j++) %s[u][j] = %s[u][j] = 0.0f;\n%s}\n"
                   "%sif (%s < R) {\n%s    %s = %s%s%s;\n%s    %s = %s%s];\n%s}\n",
                in, sv, nu, dv, nu, mn, rs, in, nu, in, T, in, row, D / 8, in, ir_dtype_name(INN(1)->dtype), row, XS,
                sv, in, ir_dtype_name(INN(0)->dtype), row, D, dv, in, sv, dv, in, in, row, in, mn, mn_src,
                xhat ? "" : row, mn_end, in, rs, rs_src, row, in);
}

/* v3's store of the 8 values ARR at PTR, after GUARD ("" or "if (o_dx) "):
 * 16-bit ones packed into one 16-byte st.global.v4 (nvcc makes st8_f16's
 * store of dx in this kernel four 4-byte stores, a warp's 16 bytes a lane
 * then written a quarter at a time: CUDA 13.0 for sm_90, v2's loop), f32
 * ones through st8_f32 (two 16-byte stores). */
static void lnb_store_text(StrBuf *s, const char *in, const char *guard, DType dt, const char *ptr, const char *arr)
{
    if (dt == DT_F32) {
        strbuf_printf(s, "%s%sst8_f32(%s, %s);\n", in, guard, ptr, arr);
        return;
    }
    const char *cvt = stf(dt);
    strbuf_printf(s, "%s%s{\n%s    u32 pk[4];\n"
                   "%s    for (int k = 0; k < 4; k++) pk[k] = (u32)%s(%s[2 * k]) | ((u32)%s(%s[2 * k + 1]) << 16);\n"
                   "%s    asm volatile(\"st.global.v4.b32 [%%0], {%%1, %%2, %%3, %%4};\" :: \"l\"(%s), \"r\"(pk[0]), "
                   "\"r\"(pk[1]), \"r\"(pk[2]), \"r\"(pk[3]));\n%s}\n",
                in, guard, in, in, cvt, arr, cvt, arr, in, ptr, in);
}

/* One row's work at the row loop's indent (8 spaces), from its chunks sv
 * (s or xhat), dv (dy), its mean and rstd: the row sums a1 and b1 (through
 * red[] and a barrier when a group has several warps), the column sums, and
 * dx = rstd (dy gamma - a1 - xhat b1) with its dropout, stored at row < R. */
static const char *const lnb_sums[3] = {"ag", "ab", "ac"};   /* dgamma, dbeta, dbias */

/* v3 with column sum q (lnb_sums) in shared memory (bit q of
 * LnBwdShape.acc_shared): copied from acc[] into a register array of its
 * name, or (OUT) back.  Thread i's 8 sums are acc[2 k][i] and acc[2 k +
 * 1][i] (k: the sum's place among the shared ones), float4s 16 bytes a lane
 * apart, so a warp's accesses have no bank conflicts. */
static void lnb_acc_text(StrBuf *s, const char *in, int shared, int q, bool out)
{
    if (!(shared & 1 << q)) return;
    int k = __builtin_popcount((unsigned)shared & ((1u << q) - 1));
    const char *arr = lnb_sums[q];
    if (out)
        strbuf_printf(s, "%sacc[%d][threadIdx.x] = make_float4(%s[0][0], %s[0][1], %s[0][2], %s[0][3]);\n"
                       "%sacc[%d][threadIdx.x] = make_float4(%s[0][4], %s[0][5], %s[0][6], %s[0][7]);\n",
                    in, 2 * k, arr, arr, arr, arr, in, 2 * k + 1, arr, arr, arr, arr);
    else
        strbuf_printf(s, "%sfloat %s[1][8];\n%s{\n%s    const float4 lo = acc[%d][threadIdx.x], hi = acc[%d][threadIdx.x];\n"
                       "%s    %s[0][0] = lo.x; %s[0][1] = lo.y; %s[0][2] = lo.z; %s[0][3] = lo.w;\n"
                       "%s    %s[0][4] = hi.x; %s[0][5] = hi.y; %s[0][6] = hi.z; %s[0][7] = hi.w;\n%s}\n",
                    in, arr, in, in, 2 * k, 2 * k + 1, in, arr, arr, arr, arr, in, arr, arr, arr, arr, in);
}

static void lnb_row_text(StrBuf *s, const EopGen *gen, long long D, const LnBwdShape *sh)
{
    const IrNode *n = OUTN;
    int acc_shared = sh->acc_shared;
    IrLnFusedAttr la = fuse_ln_attr_get(n);
    int nu = ln_nu(D), T = ln_threads(D), WG = T / 32;
    char rd[96], rx[96];
    eopb_round_expr(n->dtype, "rstd * (dv[u][j] - a1 - sv[u][j] * b1)", rd, sizeof rd);
    eopb_round_expr((DType)la.mid, "dropout_elem(m8, j, on, d, dscale)", rx, sizeof rx);
    /* sv becomes xhat in place (zeros past D stay zeros); la.xhat: it is xhat, loaded */
    strbuf_add(s, "        float a1 = 0.0f, b1 = 0.0f;\n");
    lnb_acc_text(s, "        ", acc_shared, 0, false);
    lnb_acc_text(s, "        ", acc_shared, 1, false);
    strbuf_printf(s, "#pragma unroll\n        for (int u = 0; u < %d; u++) {\n            const int cu = t + %d * u;\n"
                   "            if (cu >= %lld) continue;\n"
                   "            float gm[8];\n            ld8_%s(%s + cu * 8, gm);\n"
                   "            for (int j = 0; j < 8; j++) {\n%s"
                   "                ag[u][j] += dv[u][j] * sv[u][j];\n                ab[u][j] += dv[u][j];\n"
                   "                dv[u][j] *= gm[j];\n                a1 += dv[u][j];\n                b1 += dv[u][j] * sv[u][j];\n"
                   "            }\n        }\n",
                nu, T, D / 8, ir_dtype_name(INN(la.xhat ? 3 : 4)->dtype), la.xhat ? "x3" : "x4",
                la.xhat ? "" : "                sv[u][j] = (sv[u][j] - mean) * rstd;\n");
    lnb_acc_text(s, "        ", acc_shared, 0, true);
    lnb_acc_text(s, "        ", acc_shared, 1, true);
    strbuf_add(s, "        a1 = warp_sum(a1);\n        b1 = warp_sum(b1);\n");
    if (WG > 1)
        strbuf_printf(s, "        if (lane == 0) {\n            red[par][g][wq][0] = a1;\n            red[par][g][wq][1] = b1;\n        }\n"
                       "        __syncthreads();   // red[par] is written again two passes on, after the next barrier\n"
                       "        a1 = b1 = 0.0f;\n"
                       "        for (int w = 0; w < %d; w++) {\n            a1 += red[par][g][w][0];\n            b1 += red[par][g][w][1];\n        }\n"
                       "        par ^= 1;\n",
                    WG);
    strbuf_printf(s, "        a1 *= 1.0f / %lld;\n        b1 *= 1.0f / %lld;\n        if (row < R) {\n", D, D);
    lnb_acc_text(s, "          ", acc_shared, 2, false);
    strbuf_printf(s, "#pragma unroll\n          for (int u = 0; u < %d; u++) {\n"
                   "            const int cu = t + %d * u;\n            if (cu >= %lld) break;\n"
                   "            const i64 e0 = row * %lldLL + cu * 8;\n"
                   "            const u32 m8 = philox_mask8(ctl->seed, (u64)e0 >> 3, ctl->step, salt, p);\n"
                   "            float r[8], q[8];\n"
                   "            for (int j = 0; j < 8; j++) {\n                const float d = %s;\n"
                   "                r[j] = d;\n                q[j] = %s;\n                ac[u][j] += q[j];\n            }\n",
                nu, T, D / 8, D, rd, rx);
    if (sh->ahead) {
        lnb_store_text(s, "            ", "", n->dtype, "y + e0", "r");
        lnb_store_text(s, "            ", "if (o_dx) ", (DType)la.mid, "o_dx + e0", "q");
        strbuf_add(s, "        }\n");
    } else {
        strbuf_printf(s, "            st8_%s(y + e0, r);\n            if (o_dx) st8_%s(o_dx + e0, q);\n        }\n",
                      ir_dtype_name(n->dtype), ir_dtype_name((DType)la.mid));
    }
    lnb_acc_text(s, "          ", acc_shared, 2, true);
    strbuf_add(s, "        }\n");
}

/* Element j of the raw chunk RAW (eop_v16 RAW[lnb_raw_vectors(dt)]) in f32,
 * as ld8_<dt> converts it. */
static void lnb_raw_elem(DType dt, const char *raw, char *buf, size_t size)
{
    if (dt == DT_F32) snprintf(buf, size, "__uint_as_float(%s[j >> 2].w[j & 3])", raw);
    else snprintf(buf, size, "%s((unsigned short)(%s[0].w[j >> 1] >> (16 * (j & 1))))", ldf(dt), raw);
}

/* v3: issues row ROW's loads into slot K: its raw chunks of x1 (s or xhat)
 * in xrK and of x0 (dy) in drK, its rstd in rsK and (s form) mean in mnK;
 * zeros past the rows and past D, as lnb_load_row. */
static void lnb_v3_load(StrBuf *s, const EopGen *gen, long long D, const char *in, const char *row, int k)
{
    int nu = ln_nu(D), T = ln_threads(D);
    int w1 = lnb_raw_vectors(INN(1)->dtype), w0 = lnb_raw_vectors(INN(0)->dtype);
    bool xhat = fuse_ln_attr_get(OUTN).xhat;
    long long XS = (long long)last_dim(INN(1));   /* D, or D + IR_XHAT_ONES_PAD (lnb_load_row) */
    strbuf_printf(s, "#pragma unroll\n%sfor (int u = 0; u < %d; u++) {\n%s    const int cu = t + %d * u;\n"
                   "%s    if (%s < R && cu < %lld) {\n"
                   "%s        for (int w = 0; w < %d; w++) xr%d[u][w] = ((const eop_v16 *)(x1 + %s * %lldLL + cu * 8))[w];\n"
                   "%s        for (int w = 0; w < %d; w++) dr%d[u][w] = ((const eop_v16 *)(x0 + %s * %lldLL + cu * 8))[w];\n"
                   "%s    } else {\n"
                   "%s        for (int w = 0; w < %d; w++) xr%d[u][w] = eop_v16{};\n"
                   "%s        for (int w = 0; w < %d; w++) dr%d[u][w] = eop_v16{};\n%s    }\n%s}\n",
                in, nu, in, T, in, row, D / 8, in, w1, k, row, XS, in, w0, k, row, D, in, in, w1, k, in, w0, k, in, in);
    if (xhat) strbuf_printf(s, "%srs%d = %s < R ? x2[%s] : 0.0f;\n", in, k, row, row);
    else strbuf_printf(s, "%smn%d = %s < R ? x2[%s] : 0.0f;\n%srs%d = %s < R ? x3[%s] : 0.0f;\n", in, k, row, row, in, k,
                       row, row);
}

/* TEXT added to s with IN before each of its lines. */
static void add_indented(StrBuf *s, const char *text, const char *in)
{
    while (*text) {
        const char *nl = strchr(text, '\n');
        size_t len = nl ? (size_t)(nl - text) + 1 : strlen(text);
        if (*text != '#' && *text != '\n') strbuf_add(s, in);   /* preprocessor lines stay at column 0 */
        strbuf_addn(s, text, len);
        text += len;
    }
}

/* v3's row loop (sh->ahead slots, the loop unrolled as many times so that
 * slot k is always the same registers: a copy from slot to slot at the end
 * of a pass would wait for the loads just issued into the one copied). */
static void lnb_v3_rows(StrBuf *s, const EopGen *gen, long long D, const LnBwdShape *sh)
{
    int nu = ln_nu(D), A = sh->ahead, G = sh->groups;
    DType d1 = INN(1)->dtype, d0 = INN(0)->dtype;
    bool xhat = fuse_ln_attr_get(OUTN).xhat;
    char e1[96], e0[96], row[64], raw[16];
    HPC_ASSERT(!sh->acc_shared || nu == 1);   /* lnb_acc_text's one chunk */
    strbuf_printf(s, "    // v3: the loads of %d row%s past the one reduced in flight, as raw 16-byte vectors; %s\n", A,
                  A > 1 ? "s" : "", sh->acc_shared ? "the column sums ab and ac in shared memory" : "the column sums in registers");
    int n_shared = __builtin_popcount((unsigned)sh->acc_shared);
    if (n_shared)
        strbuf_printf(s, "    __shared__ float4 acc[%d][%d];\n"
                       "    for (int k = 0; k < %d; k++) acc[k][threadIdx.x] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);\n",
                      2 * n_shared, G * ln_threads(D), 2 * n_shared);
    for (int q = 0; q < 3; q++)
        if (!(sh->acc_shared & 1 << q))
            strbuf_printf(s, "    float %s[%d][8];\n    for (int u = 0; u < %d; u++) for (int j = 0; j < 8; j++) %s[u][j] = 0.0f;\n",
                          lnb_sums[q], nu, nu, lnb_sums[q]);
    for (int k = 0; k < A; k++) {
        strbuf_printf(s, "    eop_v16 xr%d[%d][%d], dr%d[%d][%d];\n    float rs%d", k, nu, lnb_raw_vectors(d1), k, nu,
                      lnb_raw_vectors(d0), k);
        if (!xhat) strbuf_printf(s, ", mn%d", k);
        strbuf_add(s, ";\n");
    }
    strbuf_printf(s, "    const i64 row0 = (i64)blockIdx.x * %d + g;\n", G);
    for (int k = 0; k < A; k++) {
        snprintf(row, sizeof row, k ? "(row0 + %d * stride)" : "row0", k);   /* a parenthesised operand */
        lnb_v3_load(s, gen, D, "    ", row, k);
    }
    StrBuf math = {0};
    lnb_row_text(&math, gen, D, sh);
    strbuf_printf(s, "    for (i64 base = (i64)blockIdx.x * %d; base < R; base += %d * stride) {\n", G, A);
    for (int k = 0; k < A; k++) {
        if (k) strbuf_printf(s, "        if (base + %d * stride >= R) break;\n", k);
        snprintf(row, sizeof row, k ? "base + %d * stride + g" : "base + g", k);
        strbuf_printf(s, "        {   // slot %d: its row's loads were issued %d pass%s ago; then it takes the row %d pass%s on\n"
                       "            const i64 row = %s;\n"
                       "            float sv[%d][8], dv[%d][8];\n            const float rstd = rs%d;\n",
                    k, A, A > 1 ? "es" : "", A, A > 1 ? "es" : "", row, nu, nu, k);
        if (!xhat) strbuf_printf(s, "            const float mean = mn%d;\n", k);
        snprintf(raw, sizeof raw, "xr%d[u]", k);
        lnb_raw_elem(d1, raw, e1, sizeof e1);
        snprintf(raw, sizeof raw, "dr%d[u]", k);
        lnb_raw_elem(d0, raw, e0, sizeof e0);
        strbuf_printf(s, "#pragma unroll\n            for (int u = 0; u < %d; u++)\n"
                       "                for (int j = 0; j < 8; j++) {\n                    sv[u][j] = %s;\n"
                       "                    dv[u][j] = %s;\n                }\n"
                       "            const i64 rowa = row + %d * stride;\n",
                    nu, e1, e0, A);
        lnb_v3_load(s, gen, D, "            ", "rowa", k);
        add_indented(s, math.p, "    ");
        strbuf_add(s, "        }\n");
    }
    strbuf_add(s, "    }\n");
    strbuf_free(&math);
    for (int q = 0; q < 3; q++) lnb_acc_text(s, "    ", sh->acc_shared, q, false);   /* for lnb_block_partial */
}

/* The parts expression of phase 1's grid, in the kernels' C. */
static void lnb_parts_text(StrBuf *s, const LnBwdShape *sh)
{
    strbuf_printf(s, "    const i64 P = (R + %d) / %d < %dLL ? (R + %d) / %d : %dLL;\n", sh->per - 1, sh->per,
                  sh->cap, sh->per - 1, sh->per, sh->cap);
}

/* Phase 1's end: the groups' column sums added in order, one partial per block. */
static void lnb_block_partial(StrBuf *s, long long D, const LnBwdShape *sh)
{
    int nu = ln_nu(D), T = ln_threads(D), G = sh->groups;
    static const char *const acc[3] = {"ag", "ab", "ac"};
    strbuf_printf(s, "    float *part = sf + (i64)blockIdx.x * %lldLL;\n", 3 * D);
    for (int q = 0; q < 3; q++) {
        if (G > 1)
            strbuf_printf(s, "    __syncthreads();\n"
                           "    if (g > 0) {\n#pragma unroll\n        for (int u = 0; u < %d; u++) {\n"
                           "            const int cu = t + %d * u;\n            if (cu >= %lld) break;\n"
                           "            float4 *c4 = (float4 *)&cs[g - 1][cu * 8];\n"
                           "            c4[0] = make_float4(%s[u][0], %s[u][1], %s[u][2], %s[u][3]);\n"
                           "            c4[1] = make_float4(%s[u][4], %s[u][5], %s[u][6], %s[u][7]);\n        }\n    }\n"
                           "    __syncthreads();\n",
                        nu, T, D / 8, acc[q], acc[q], acc[q], acc[q], acc[q], acc[q], acc[q], acc[q]);
        strbuf_printf(s, "    if (g == 0) {\n#pragma unroll\n        for (int u = 0; u < %d; u++) {\n"
                       "            const int cu = t + %d * u;\n            if (cu >= %lld) break;\n",
                    nu, T, D / 8);
        if (G > 1)
            strbuf_printf(s, "            for (int h = 0; h < %d; h++) {\n"
                           "                const float4 *c4 = (const float4 *)&cs[h][cu * 8];\n"
                           "                const float4 lo = c4[0], hi = c4[1];\n"
                           "                %s[u][0] += lo.x; %s[u][1] += lo.y; %s[u][2] += lo.z; %s[u][3] += lo.w;\n"
                           "                %s[u][4] += hi.x; %s[u][5] += hi.y; %s[u][6] += hi.z; %s[u][7] += hi.w;\n"
                           "            }\n",
                        G - 1, acc[q], acc[q], acc[q], acc[q], acc[q], acc[q], acc[q], acc[q]);
        strbuf_printf(s, "            st8_f32(part + %lldLL + cu * 8, %s[u]);\n        }\n    }\n", q * D, acc[q]);
    }
}

static HpcStatus lnb_sum_phase(EopGen *gen, long long D, const LnBwdShape *shp);

HpcStatus eopb_ln_residual_bwd(EopGen *gen, HpcError *err)
{
    const IrNode *n = OUTN;
    long long D = (long long)last_dim(n);
    HpcStatus st = ln_site_check(gen, D, err);
    LnBwdShape sh = {0};
    if (!st) st = ln_bwd_shape(gen, D, &sh, err);
    if (st) return st;
    IrLnFusedAttr la = fuse_ln_attr_get(n);
    IrFusedAttr fa = {la.p, (int32_t)la.salt, 0, (uint8_t)la.mid, 0, 0};
    int nu = ln_nu(D), T = ln_threads(D), G = sh.groups, WG = T / 32;
    char rows[128], tag[32];
    rows_expr(n, rows, sizeof rows);
    snprintf(tag, sizeof tag, "h%lld", D);
    StepSize parts = eopb_sz_ceil_div(sz_rows(n), sh.per);
    parts.cap = sh.cap;
    StrBuf *s = eopb_phase(gen, "ln_residual_bwd", tag, EOP_LT_ROWS, parts, G * T);
    gen->ph[gen->n_phases - 1].min_blocks = sh.min_blocks;
    eopb_dropout_consts(gen, s, fa);
    strbuf_printf(s, "    // %d groups of %d threads, %d blocks an SM, at most %d blocks, %d rows a block's pass\n"
                   "    const i64 R = %s;\n    %s *o_dx = (%s *)a.yk[0];\n"
                   "    const int g = threadIdx.x / %d, t = threadIdx.x - g * %d;\n"
                   "    const int lane = threadIdx.x & 31, wq = t >> 5;\n    (void)lane; (void)wq;\n"
                   "    const i64 stride = (i64)gridDim.x * %d;\n",
                G, T, sh.min_blocks, sh.cap, sh.per, rows, ctype((DType)la.mid), ctype((DType)la.mid), T, T, G);
    if (WG > 1) strbuf_printf(s, "    __shared__ float red[2][%d][%d][2];\n    int par = 0;\n", G, WG);
    if (G > 1) strbuf_printf(s, "    __shared__ __align__(16) float cs[%d][%lld];\n", G - 1, D);
    if (!sh.ahead)
        strbuf_printf(s, "    float ag[%d][8], ab[%d][8], ac[%d][8];\n"
                       "    for (int u = 0; u < %d; u++) for (int j = 0; j < 8; j++) ag[u][j] = ab[u][j] = ac[u][j] = 0.0f;\n",
                    nu, nu, nu, nu);
    if (sh.ahead) {
        lnb_v3_rows(s, gen, D, &sh);
        lnb_block_partial(s, D, &sh);
        return lnb_sum_phase(gen, D, &sh);
    }
    if (sh.prefetch) {
        strbuf_printf(s, "    const i64 row0 = (i64)blockIdx.x * %d + g;\n", G);
        lnb_load_row(s, gen, D, "    ", "row0", "sv", "dv", "mean", "rstd");
    }
    strbuf_printf(s, "    for (i64 base = (i64)blockIdx.x * %d; base < R; base += stride) {\n"
                   "        const i64 row = base + g;\n", G);
    if (sh.prefetch) {
        strbuf_add(s, "        const i64 rown = row + stride;\n");
        lnb_load_row(s, gen, D, "        ", "rown", "sn", "dn", "mn", "rn");
    } else {
        lnb_load_row(s, gen, D, "        ", "row", "sv", "dv", "mean", "rstd");
    }
    lnb_row_text(s, gen, D, &sh);
    if (sh.prefetch)
        strbuf_printf(s, "#pragma unroll\n        for (int u = 0; u < %d; u++)\n"
                       "            for (int j = 0; j < 8; j++) {\n                sv[u][j] = sn[u][j];\n                dv[u][j] = dn[u][j];\n            }\n"
                       "        mean = mn;\n        rstd = rn;\n",
                    nu);
    strbuf_add(s, "    }\n");
    lnb_block_partial(s, D, &sh);
    return lnb_sum_phase(gen, D, &sh);
}

/* Phase 2: the blocks' partials added in order (double), and the scratch
 * phase 1's partials take. */
static HpcStatus lnb_sum_phase(EopGen *gen, long long D, const LnBwdShape *shp)
{
    const IrNode *n = OUTN;
    IrLnFusedAttr la = fuse_ln_attr_get(n);
    LnBwdShape sh = *shp;
    char rows[128], tag[32];
    rows_expr(n, rows, sizeof rows);
    snprintf(tag, sizeof tag, "h%lld", D);
    StrBuf *s = eopb_phase(gen, "ln_residual_bwd_sum", tag, EOP_LT_ROWS, sz_const((3 * D + 31) / 32), 32 * LNB_SUM_WARPS);
    const char *sa = stf((DType)la.aux), *ca = ctype((DType)la.aux);
    strbuf_printf(s, "    const i64 R = %s;\n", rows);
    lnb_parts_text(s, &sh);
    strbuf_printf(s, "    __shared__ double wsum[%d][32];\n"
                   "    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;\n"
                   "    const i64 f = (i64)blockIdx.x * 32 + lane;   // of the 3 x %lld partial columns\n"
                   "    double v = 0.0;\n"
                   "    if (f < %lldLL) {\n#pragma unroll 4\n"
                   "        for (i64 k = w; k < P; k += %d) v += (double)sf[k * %lldLL + f];\n    }\n"
                   "    wsum[w][lane] = v;\n    __syncthreads();\n"
                   "    if (w != 0 || f >= %lldLL) return;\n"
                   "    for (int k = 1; k < %d; k++) v += wsum[k][lane];\n"
                   "    const int q = (int)(f / %lldLL);\n    const i64 c = f - (i64)q * %lldLL;\n"
                   "    %s *o = (%s *)a.yk[1 + q];\n    if (o) o[c] = %s((float)v);\n",
                LNB_SUM_WARPS, D, 3 * D, LNB_SUM_WARPS, 3 * D, 3 * D, LNB_SUM_WARPS, D, D, ca, ca, sa);
    /* bytes: (R + per - 1) x 3 D x 4 / per bounds min(cap, ceil(R / per)) x 3 D x 4 */
    StepSize sc = sz_rows(n);
    int64_t row_bytes = 3 * (int64_t)D * 4;
    sc.c1 *= row_bytes;
    sc.c0 = (int64_t)(sh.per - 1) * row_bytes;
    sc.div = sh.per;
    sc.cap = (int64_t)sh.cap * row_bytes;
    gen->scratch = sc;
    return HPC_OK;
}


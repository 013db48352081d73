/* compiler/emit_ops_embed_ln.c — the fused embedding layer (EMBED_LN,
 * EMBED_LN_BWD: compiler/fuse_embed.c): the lookups, LayerNorm and dropout
 * in one kernel, and the backward into the tables; see
 * emit_ops_body_internal.h. */
#include "emit_ops_body_internal.h"

#include <stdio.h>

/* ---- EMBED_LN, EMBED_LN_BWD (compiler/fuse_embed.c) --------------------
 *
 * Forward: one block a row, as the LayerNorm kernels (ln_threads, ln_nu):
 * the lookups summed in registers in the fuse rule's order, the row's
 * statistics, y = dropout(LN(s)) with the unfused DROPOUT's draws (flat
 * index row * D + column), xhat in f16 and rstd for the backward, y in 16
 * bits for the first layer's GEMMs.  An id outside its table gives NaN, as
 * the unfused EMBEDDING kernel.
 *
 * Backward, three phases:
 *  1. zero the gradients that phase 2 adds into (16 bytes a thread);
 *  2. P blocks of EMB_GROUPS row groups of ln_threads(D) threads; group g of
 *     block b takes a contiguous run of rows in position-major order
 *     (rp = t B + b_row), so a position table's rows repeat within a run.
 *     Per row: d = dropout(dy), the LayerNorm backward at xhat and rstd,
 *     and ds into each table: a table of at most 2 rows (token types) sums
 *     in registers per id and leaves a per-block partial; a table whose ids
 *     come from POSITIONS / SPAN_POSITIONS sums a run of equal ids in
 *     registers and adds it once; others add every row (red8_f32).  dgamma
 *     and dbeta column sums leave per-block partials too;
 *  3. the partials added in a fixed order (double), so dgamma, dbeta and a
 *     small table's gradient are the same run to run; the scattered ones,
 *     float reductions, are not (as the unfused EMBEDDING_BWD's atomics). */
#define EMB_GROUPS 4
#define EMB_MIN_ROWS 4    /* rows a group at least, before the grid caps */
#define EMB_CAP (LNB_SMS * 2)

typedef enum { EMB_SMALL, EMB_RUN, EMB_EACH } EmbScatter;

static EmbScatter emb_scatter_kind(const IrGraph *g, int ids, int64_t rows)
{
    if (rows <= 2) return EMB_SMALL;
    IrOpKind op = g->nodes[ids].op;
    return op == IR_OP_POSITIONS || op == IR_OP_SPAN_POSITIONS ? EMB_RUN : EMB_EACH;
}

static HpcStatus emb_check(const EopGen *gen, long long D, HpcError *err)
{
    bool ok = ln_vec_ok(D);
    for (int k = 0; k < OUTN->n_in && ok; k++) ok = float_dtype(INN(k)->dtype) || INN(k)->dtype == DT_I32;
    if (ok) return HPC_OK;
    return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: node %d (%s): the fused embedding kernel needs a hidden size "
                    "that is a multiple of 8 (have %lld) and float tables; compile with HPC_FUSE_EMB=0 or run "
                    "on the cpu backend", gen->id, OUTN->name, D);
}

HpcStatus eopb_embed_ln(EopGen *gen, HpcError *err)
{
    const IrNode *n = OUTN;
    long long D = (long long)last_dim(n);
    HpcStatus st = emb_check(gen, D, err);
    if (st) return st;
    const IrEmbedLnAttr *ea = &n->attr.embed_ln;
    IrFusedAttr fa = {ea->p, (int32_t)ea->salt, 0, DT_F32, 0, 0};
    int nu = ln_nu(D), T = ln_threads(D);
    StrBuf *s = eopb_ln_row_phase(gen, "embed_ln_fwd", n, D);
    eopb_dropout_consts(gen, s, fa);
    strbuf_printf(s, "    unsigned short *o_xhat = (unsigned short *)a.yk[0];\n    float *o_rstd = (float *)a.yk[1];\n"
                   "    %s *o_low = (%s *)a.yk[2];\n", ctype((DType)ea->low), ctype((DType)ea->low));
    for (int k = 2; k < n->n_in; k += 2)
        strbuf_printf(s, "    const int id%d = x%d[row];\n    const bool ok%d = id%d >= 0 && id%d < %lld;\n", k / 2 - 1,
                      k + 1, k / 2 - 1, k / 2 - 1, k / 2 - 1, (long long)INN(k)->dims[0]);
    strbuf_printf(s, "    float xv[%d][8];\n#pragma unroll\n    for (int u = 0; u < %d; u++) {\n"
                   "        const int cu = threadIdx.x + %d * u;\n"
                   "        for (int j = 0; j < 8; j++) xv[u][j] = 0.0f;\n        if (cu >= %lld) continue;\n"
                   "        float t8[8];\n",
                nu, nu, T, D / 8);
    for (int k = 2; k < n->n_in; k += 2) {
        int t = k / 2 - 1;
        strbuf_printf(s, "        if (ok%d) ld8_%s(x%d + (i64)id%d * %lldLL + cu * 8, t8);\n"
                       "        else for (int j = 0; j < 8; j++) t8[j] = EOP_NAN;\n"
                       "        for (int j = 0; j < 8; j++) xv[u][j] %s t8[j];\n",
                    t, ir_dtype_name(INN(k)->dtype), k, t, D, k == 2 ? "=" : "+=");
    }
    strbuf_add(s, "    }\n");
    eopb_ln_row_stats(s, D, (double)(float)ea->eps);
    strbuf_printf(s, "    if (threadIdx.x == 0 && o_rstd) o_rstd[row] = rstd;\n"
                   "#pragma unroll\n    for (int u = 0; u < %d; u++) {\n        const int cu = threadIdx.x + %d * u;\n"
                   "        if (cu >= %lld) break;\n        float g[8], bt[8], h[8], r[8];\n"
                   "        ld8_%s(x0 + cu * 8, g);\n        ld8_%s(x1 + cu * 8, bt);\n"
                   "        const i64 e0 = row * %lldLL + cu * 8;\n"
                   "        const u32 m8 = philox_mask8(ctl->seed, (u64)e0 >> 3, ctl->step, salt, p);\n"
                   "        for (int j = 0; j < 8; j++) {\n            h[j] = (xv[u][j] - mean) * rstd;\n"
                   "            r[j] = dropout_elem(m8, j, on, h[j] * g[j] + bt[j], dscale);\n        }\n"
                   "        st8_%s(y + e0, r);\n        if (o_low) st8_%s(o_low + e0, r);\n"
                   "        if (o_xhat) st8_f16(o_xhat + e0, h);\n    }\n",
                nu, T, D / 8, ir_dtype_name(INN(0)->dtype), ir_dtype_name(INN(1)->dtype), D,
                ir_dtype_name(n->dtype), ir_dtype_name((DType)ea->low));
    return HPC_OK;
}

/* The output pointer of table k's gradient, in the kernels' C. */
static void emb_table_out(char *buf, size_t size, int k)
{
    if (k == 0) snprintf(buf, size, "y");
    else snprintf(buf, size, "((float *)a.yk[%d])", k - 1);
}

HpcStatus eopb_embed_ln_bwd(EopGen *gen, HpcError *err)
{
    const IrNode *n = OUTN, *dy = INN(0);
    long long D = (long long)last_dim(dy);
    HpcStatus st = emb_check(gen, D, err);
    if (st) return st;
    const IrEmbedLnBwdAttr *ea = &n->attr.embed_ln_bwd;
    IrFusedAttr fa = {ea->p, (int32_t)ea->salt, 0, DT_F32, 0, 0};
    int nu = ln_nu(D), T = ln_threads(D), G = EMB_GROUPS, WG = T / 32, tables = n->n_in - 4;
    int64_t rows[3] = {ea->rows0, ea->rows1, ea->rows2};
    EmbScatter kind[3];
    int nq = 2;   /* partial rows of D columns a block: dgamma, dbeta, then each small table's rows */
    int q0[3];
    for (int k = 0; k < tables; k++) {
        kind[k] = emb_scatter_kind(gen->g, n->in[4 + k], rows[k]);
        q0[k] = nq;
        if (kind[k] == EMB_SMALL) nq += (int)rows[k];
    }
    char rws[128], tag[32], out[40];
    rows_expr(dy, rws, sizeof rws);
    snprintf(tag, sizeof tag, "h%lld", D);

    /* 1: zero the scattered gradients (16 bytes a thread) */
    int64_t most = 0;
    for (int k = 0; k < tables; k++)
        if (kind[k] != EMB_SMALL && rows[k] * D > most) most = rows[k] * D;
    StrBuf *s = eopb_phase(gen, "embed_ln_bwd_zero", tag, EOP_LT_ELEMS, sz_const(most / 4 > 0 ? most / 4 : 1), 256);
    strbuf_add(s, "    const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);\n    EOP_FOR(i, ");
    strbuf_printf(s, "%lldLL) {\n", (long long)(most / 4));
    for (int k = 0; k < tables; k++) {
        if (kind[k] == EMB_SMALL) continue;
        emb_table_out(out, sizeof out, k);
        strbuf_printf(s, "        if (%s && i < %lldLL) ((float4 *)%s)[i] = z;\n", out, (long long)(rows[k] * D / 4), out);
    }
    strbuf_add(s, "    }\n");

    /* 2: the rows */
    StepSize parts = eopb_sz_ceil_div(sz_rows(dy), G * EMB_MIN_ROWS);
    parts.cap = EMB_CAP;
    s = eopb_phase(gen, "embed_ln_bwd", tag, EOP_LT_ROWS, parts, G * T);
    gen->ph[gen->n_phases - 1].min_blocks = 2;
    eopb_dropout_consts(gen, s, fa);
    strbuf_printf(s, "    const i64 R = %s, nb = a.B;\n"
                   "    const int g = threadIdx.x / %d, t = threadIdx.x - g * %d, lane = threadIdx.x & 31, wq = t >> 5;\n"
                   "    const i64 groups = (i64)gridDim.x * %d, per = (R + groups - 1) / groups;\n"
                   "    const i64 lo = ((i64)blockIdx.x * %d + g) * per;\n"
                   "    __shared__ float red[2][%d][%d][2];\n    int par = 0;\n"
                   "    float gm[%d][8], ag[%d][8], ab[%d][8];\n"
                   "#pragma unroll\n    for (int u = 0; u < %d; u++) {\n        const int cu = t + %d * u;\n"
                   "        for (int j = 0; j < 8; j++) gm[u][j] = ag[u][j] = ab[u][j] = 0.0f;\n"
                   "        if (cu < %lld) ld8_%s(x3 + cu * 8, gm[u]);\n    }\n",
                rws, T, T, G, G, G, WG, nu, nu, nu, nu, T, D / 8, ir_dtype_name(INN(3)->dtype));
    for (int k = 0; k < tables; k++) {
        emb_table_out(out, sizeof out, k);
        strbuf_printf(s, "    float *o%d = %s;\n", k, out);
        if (kind[k] == EMB_SMALL)
            strbuf_printf(s, "    float sm%d[%lld][%d][8];\n    for (int r = 0; r < %lld; r++) for (int u = 0; u < %d; u++) "
                           "for (int j = 0; j < 8; j++) sm%d[r][u][j] = 0.0f;\n",
                        k, (long long)rows[k], nu, (long long)rows[k], nu, k);
        if (kind[k] == EMB_RUN)
            strbuf_printf(s, "    float rn%d[%d][8];\n    int cur%d = -1;\n    for (int u = 0; u < %d; u++) "
                           "for (int j = 0; j < 8; j++) rn%d[u][j] = 0.0f;\n",
                        k, nu, k, nu, k);
    }
    strbuf_printf(s, "    for (i64 it = 0; it < per; it++) {\n        const i64 rp = lo + it;\n"
                   "        const bool valid = rp < R;\n        const i64 tt = valid ? rp / nb : 0;\n"
                   "        const i64 row = valid ? (rp - tt * nb) * a.L + tt : 0;\n"
                   "        float dv[%d][8], xh[%d][8];\n        float a1 = 0.0f, b1 = 0.0f;\n"
                   "        const float rs = valid ? x2[row] : 0.0f;\n"
                   "#pragma unroll\n        for (int u = 0; u < %d; u++) {\n            const int cu = t + %d * u;\n"
                   "            for (int j = 0; j < 8; j++) dv[u][j] = xh[u][j] = 0.0f;\n"
                   "            if (!valid || cu >= %lld) continue;\n"
                   "            const i64 e0 = row * %lldLL + cu * 8;\n"
                   "            ld8_%s(x0 + e0, dv[u]);\n            ld8_f16(x1 + e0, xh[u]);\n"
                   "            const u32 m8 = philox_mask8(ctl->seed, (u64)e0 >> 3, ctl->step, salt, p);\n"
                   "            for (int j = 0; j < 8; j++) {\n"
                   "                dv[u][j] = dropout_elem(m8, j, on, dv[u][j], dscale);\n"
                   "                ag[u][j] += dv[u][j] * xh[u][j];\n                ab[u][j] += dv[u][j];\n"
                   "                dv[u][j] *= gm[u][j];\n                a1 += dv[u][j];\n                b1 += dv[u][j] * xh[u][j];\n"
                   "            }\n        }\n        a1 = warp_sum(a1);\n        b1 = warp_sum(b1);\n",
                nu, nu, nu, T, D / 8, D, ir_dtype_name(dy->dtype));
    if (WG > 1)
        strbuf_printf(s, "        if (lane == 0) {\n            red[par][g][wq][0] = a1;\n            red[par][g][wq][1] = b1;\n        }\n"
                       "        __syncthreads();   // red[par] is written again two rows on, after the next barrier\n"
                       "        a1 = b1 = 0.0f;\n"
                       "        for (int w = 0; w < %d; w++) {\n            a1 += red[par][g][w][0];\n            b1 += red[par][g][w][1];\n        }\n"
                       "        par ^= 1;\n",
                    WG);
    else
        strbuf_add(s, "        (void)red; (void)par; (void)wq; (void)lane;\n");
    strbuf_printf(s, "        a1 *= 1.0f / %lld;\n        b1 *= 1.0f / %lld;\n"
                   "        if (!valid) continue;\n"
                   "#pragma unroll\n        for (int u = 0; u < %d; u++)\n"
                   "            for (int j = 0; j < 8; j++) dv[u][j] = rs * (dv[u][j] - a1 - xh[u][j] * b1);\n",
                D, D, nu);
    for (int k = 0; k < tables; k++) {
        strbuf_printf(s, "        {\n            const int id = x%d[row];\n", 4 + k);
        if (kind[k] == EMB_SMALL)
            strbuf_printf(s, "#pragma unroll\n            for (int r = 0; r < %lld; r++)\n"
                           "                for (int u = 0; u < %d; u++)\n"
                           "                    for (int j = 0; j < 8; j++) sm%d[r][u][j] += id == r ? dv[u][j] : 0.0f;\n",
                        (long long)rows[k], nu, k);
        else if (kind[k] == EMB_RUN)
            strbuf_printf(s, "            if (id != cur%d) {\n"
                           "                if (cur%d >= 0 && cur%d < %lld && o%d)\n"
                           "                    for (int u = 0; u < %d; u++)\n"
                           "                        if (t + %d * u < %lld) red8_f32(o%d + (i64)cur%d * %lldLL + (t + %d * u) * 8, rn%d[u]);\n"
                           "                for (int u = 0; u < %d; u++) for (int j = 0; j < 8; j++) rn%d[u][j] = 0.0f;\n"
                           "                cur%d = id;\n            }\n"
                           "            for (int u = 0; u < %d; u++) for (int j = 0; j < 8; j++) rn%d[u][j] += dv[u][j];\n",
                        k, k, k, (long long)rows[k], k, nu, T, D / 8, k, k, D, T, k, nu, k, k, nu, k);
        else
            strbuf_printf(s, "            if (id >= 0 && id < %lld && o%d)\n"
                           "                for (int u = 0; u < %d; u++)\n"
                           "                    if (t + %d * u < %lld) red8_f32(o%d + (i64)id * %lldLL + (t + %d * u) * 8, dv[u]);\n",
                        (long long)rows[k], k, nu, T, D / 8, k, D, T);
        strbuf_add(s, "        }\n");
    }
    strbuf_add(s, "    }\n");
    for (int k = 0; k < tables; k++)
        if (kind[k] == EMB_RUN)
            strbuf_printf(s, "    if (cur%d >= 0 && cur%d < %lld && o%d)\n        for (int u = 0; u < %d; u++)\n"
                           "            if (t + %d * u < %lld) red8_f32(o%d + (i64)cur%d * %lldLL + (t + %d * u) * 8, rn%d[u]);\n",
                        k, k, (long long)rows[k], k, nu, T, D / 8, k, k, D, T, k);
    /* the groups' column sums, added in order into one partial a block */
    strbuf_printf(s, "    __shared__ __align__(16) float cs[%d][%lld];\n"
                   "    float *part = sf + (i64)blockIdx.x * %lldLL;\n",
                G, D, (long long)nq * D);
    for (int q = 0; q < nq; q++) {
        char acc[48];
        if (q == 0) snprintf(acc, sizeof acc, "ag[u]");
        else if (q == 1) snprintf(acc, sizeof acc, "ab[u]");
        else
            for (int k = 0; k < tables; k++)
                if (kind[k] == EMB_SMALL && q >= q0[k] && q < q0[k] + rows[k])
                    snprintf(acc, sizeof acc, "sm%d[%d][u]", k, q - q0[k]);
        strbuf_printf(s, "    __syncthreads();\n"
                       "#pragma unroll\n    for (int u = 0; u < %d; u++) {\n        const int cu = t + %d * u;\n"
                       "        if (cu < %lld) for (int j = 0; j < 8; j++) cs[g][cu * 8 + j] = %s[j];\n    }\n"
                       "    __syncthreads();\n"
                       "    for (int c = threadIdx.x; c < %lld; c += blockDim.x) {\n        float v = 0.0f;\n"
                       "        for (int h = 0; h < %d; h++) v += cs[h][c];\n        part[%lldLL + c] = v;\n    }\n",
                    nu, T, D / 8, acc, D, G, (long long)q * D);
    }

    /* 3: the partials added in order */
    s = eopb_phase(gen, "embed_ln_bwd_sum", tag, EOP_LT_ROWS, sz_const(((int64_t)nq * D + 31) / 32), 32 * LNB_SUM_WARPS);
    strbuf_printf(s, "    const i64 R = %s;\n"
                   "    const i64 P = (R + %d) / %d < %dLL ? (R + %d) / %d : %dLL;\n"
                   "    __shared__ double wsum[%d][32];\n"
                   "    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;\n"
                   "    const i64 f = (i64)blockIdx.x * 32 + lane;\n    double v = 0.0;\n"
                   "    if (f < %lldLL) {\n#pragma unroll 4\n"
                   "        for (i64 k = w; k < P; k += %d) v += (double)sf[k * %lldLL + f];\n    }\n"
                   "    wsum[w][lane] = v;\n    __syncthreads();\n"
                   "    if (w != 0 || f >= %lldLL) return;\n"
                   "    for (int k = 1; k < %d; k++) v += wsum[k][lane];\n"
                   "    const int q = (int)(f / %lldLL);\n    const i64 c = f - (i64)q * %lldLL;\n"
                   "    float *o = 0;\n"
                   "    if (q == 0) o = (float *)a.yk[2];\n    else if (q == 1) o = (float *)a.yk[3];\n",
                rws, G * EMB_MIN_ROWS - 1, G * EMB_MIN_ROWS, EMB_CAP, G * EMB_MIN_ROWS - 1, G * EMB_MIN_ROWS, EMB_CAP,
                LNB_SUM_WARPS, (long long)nq * D, LNB_SUM_WARPS, (long long)nq * D, (long long)nq * D, LNB_SUM_WARPS,
                D, D);
    for (int k = 0; k < tables; k++)
        if (kind[k] == EMB_SMALL) {
            emb_table_out(out, sizeof out, k);
            strbuf_printf(s, "    else if (q >= %d && q < %lld && %s) o = %s + (i64)(q - %d) * %lldLL;\n", q0[k],
                          (long long)(q0[k] + rows[k]), out, out, q0[k], D);
        }
    strbuf_add(s, "    if (o) o[c] = (float)v;\n");
    /* scratch: P partials of nq x D f32, P = min(cap, ceil(R / (G x EMB_MIN_ROWS))) */
    StepSize sc = sz_rows(dy);
    int64_t row_bytes = (int64_t)nq * D * 4, per = G * EMB_MIN_ROWS;
    sc.c1 *= row_bytes;
    sc.c0 = (per - 1) * row_bytes;
    sc.div = per;
    sc.cap = (int64_t)EMB_CAP * row_bytes;
    gen->scratch = sc;
    return HPC_OK;
}


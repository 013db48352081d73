/* compiler/emit_ops_layernorm.c — the unfused LayerNorm kernels
 * (LAYERNORM, LAYERNORM_DX, LAYERNORM_DGAMMA) and the row-in-registers
 * pieces (eopb_ln_row_phase, eopb_ln_row_stats) that the fused LayerNorm
 * sites (emit_ops_ln_site.c) and the fused embedding layer
 * (emit_ops_embed_ln.c) build on; see emit_ops_body_internal.h. */
#include "emit_ops_body_internal.h"

#include <stdio.h>

/* ---- LAYERNORM --------------------------------------------------------- */

/* Mean and rstd of row `row` of xr (D elements, dtype LD) into mean, rstd. */
static void ln_stats_text(StrBuf *s, const char *ld, long long D, double eps)
{
    strbuf_printf(s, "    float s1 = 0.0f;\n    for (int c = threadIdx.x; c < %lld; c += blockDim.x) s1 += %s(xr[c]);\n"
                   "    const float mean = block_sum(s1, sh) * (1.0f / %lld);\n"
                   "    float q = 0.0f;\n    for (int c = threadIdx.x; c < %lld; c += blockDim.x) {\n"
                   "        float d = %s(xr[c]) - mean;\n        q += d * d;\n    }\n"
                   "    const float rstd = 1.0f / sqrtf(block_sum(q, sh) * (1.0f / %lld) + (float)%.9g);\n",
                D, ld, D, D, ld, D, eps);
}

/* A block-per-row phase over the rows of `rows_of`: declares sh, R, row. */
StrBuf *eopb_ln_row_phase(EopGen *gen, const char *base, const IrNode *rows_of, long long D)
{
    char rows[128], tag[32];
    rows_expr(rows_of, rows, sizeof rows);
    snprintf(tag, sizeof tag, "h%lld", D);
    StrBuf *s = eopb_phase(gen, base, tag, EOP_LT_ROWS, sz_rows(rows_of), ln_threads(D));
    strbuf_printf(s, "    __shared__ float sh[32];\n    const i64 R = %s;\n    const i64 row = blockIdx.x;\n"
                   "    if (row >= R) return;\n", rows);
    return s;
}

/* Loads row `row` of PTR (dtype dt, D columns) into NAME[NU][8] (zeros past D). */
static void ln_row_load(StrBuf *s, const char *name, const char *ptr, DType dt, long long D)
{
    int nu = ln_nu(D), T = ln_threads(D);
    strbuf_printf(s, "    float %s[%d][8];\n#pragma unroll\n    for (int u = 0; u < %d; u++) {\n"
                   "        const int cu = threadIdx.x + %d * u;\n"
                   "        if (cu < %lld) ld8_%s(%s + row * %lldLL + cu * 8, %s[u]);\n"
                   "        else for (int j = 0; j < 8; j++) %s[u][j] = 0.0f;\n    }\n",
                name, nu, nu, T, D / 8, ir_dtype_name(dt), ptr, D, name, name);
}

/* mean and rstd of the row in xv (two passes over the registers, f32). */
void eopb_ln_row_stats(StrBuf *s, long long D, double eps)
{
    int nu = ln_nu(D), T = ln_threads(D);
    strbuf_printf(s, "    float s1 = 0.0f;\n#pragma unroll\n    for (int u = 0; u < %d; u++)\n"
                   "        for (int j = 0; j < 8; j++) s1 += xv[u][j];\n"
                   "    const float mean = block_sum(s1, sh) * (1.0f / %lld);\n    float q = 0.0f;\n"
                   "#pragma unroll\n    for (int u = 0; u < %d; u++)\n"
                   "        if (threadIdx.x + %d * u < %lld)\n"
                   "            for (int j = 0; j < 8; j++) {\n                float d = xv[u][j] - mean;\n                q += d * d;\n            }\n"
                   "    const float rstd = 1.0f / sqrtf(block_sum(q, sh) * (1.0f / %lld) + (float)%.9g);\n",
                nu, D, nu, T, D / 8, D, eps);
}

bool eopb_ln_vec_dtypes(const EopGen *gen)
{
    if (!float_dtype(OUTN->dtype)) return false;
    for (int k = 0; k < OUTN->n_in; k++)
        if (!float_dtype(INN(k)->dtype)) return false;
    return true;
}

static void gen_layernorm_vec(EopGen *gen)
{
    const IrNode *n = OUTN;
    long long D = (long long)last_dim(n);
    int nu = ln_nu(D);
    StrBuf *s = eopb_ln_row_phase(gen, "ln_fwd", n, D);
    ln_row_load(s, "xv", "x0", INN(0)->dtype, D);
    eopb_ln_row_stats(s, D, (double)(float)n->attr.norm.eps);
    strbuf_printf(s, "#pragma unroll\n    for (int u = 0; u < %d; u++) {\n        const int cu = threadIdx.x + blockDim.x * u;\n"
                   "        if (cu >= %lld) break;\n        float g[8], bt[8], r[8];\n"
                   "        ld8_%s(x1 + cu * 8, g);\n        ld8_%s(x2 + cu * 8, bt);\n"
                   "        for (int j = 0; j < 8; j++) r[j] = (xv[u][j] - mean) * rstd * g[j] + bt[j];\n"
                   "        st8_%s(y + row * %lldLL + cu * 8, r);\n    }\n",
                nu, D / 8, ir_dtype_name(INN(1)->dtype), ir_dtype_name(INN(2)->dtype), ir_dtype_name(n->dtype), D);
}

void eopb_layernorm(EopGen *gen)
{
    const IrNode *n = OUTN;
    long long D = (long long)last_dim(n);
    if (ln_vec_ok(D) && eopb_ln_vec_dtypes(gen)) {
        gen_layernorm_vec(gen);
        return;
    }
    char rows[128], tag[32];
    rows_expr(n, rows, sizeof rows);
    snprintf(tag, sizeof tag, "h%lld", D);
    StrBuf *s = eopb_phase(gen, "ln_fwd", tag, EOP_LT_ROWS, sz_rows(n), row_threads(D));
    strbuf_printf(s, "    __shared__ float sh[32];\n    const i64 row = blockIdx.x;\n"
                   "    if (row >= %s) return;\n    const %s *xr = x0 + row * %lldLL;\n",
                rows, ctype(INN(0)->dtype), D);
    ln_stats_text(s, ldf(INN(0)->dtype), D, (double)(float)n->attr.norm.eps);
    strbuf_printf(s, "    for (int c = threadIdx.x; c < %lld; c += blockDim.x)\n"
                   "        y[row * %lldLL + c] = %s((%s(xr[c]) - mean) * rstd * %s(x1[c]) + %s(x2[c]));\n",
                D, D, stf(n->dtype), ldf(INN(0)->dtype), ldf(INN(1)->dtype), ldf(INN(2)->dtype));
}

/* ---- LAYERNORM_DX, LAYERNORM_DGAMMA ------------------------------------ */

/* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma, with
 * x and dy of the row in registers. */
static void gen_layernorm_dx_vec(EopGen *gen)
{
    const IrNode *n = OUTN;
    long long D = (long long)last_dim(n);
    int nu = ln_nu(D);
    StrBuf *s = eopb_ln_row_phase(gen, "ln_dx", n, D);
    ln_row_load(s, "xv", "x1", INN(1)->dtype, D);
    eopb_ln_row_stats(s, D, (double)(float)n->attr.norm.eps);
    ln_row_load(s, "dv", "x0", INN(0)->dtype, D);
    strbuf_printf(s, "    float a1 = 0.0f, b1 = 0.0f;\n#pragma unroll\n    for (int u = 0; u < %d; u++) {\n"
                   "        const int cu = threadIdx.x + blockDim.x * u;\n        if (cu >= %lld) break;\n        float gm[8];\n"
                   "        ld8_%s(x2 + cu * 8, gm);\n"
                   "        for (int j = 0; j < 8; j++) {\n            xv[u][j] = (xv[u][j] - mean) * rstd;\n"
                   "            dv[u][j] = dv[u][j] * gm[j];\n            a1 += dv[u][j];\n            b1 += dv[u][j] * xv[u][j];\n"
                   "        }\n    }\n"
                   "    a1 = block_sum(a1, sh) * (1.0f / %lld);\n    b1 = block_sum(b1, sh) * (1.0f / %lld);\n"
                   "#pragma unroll\n    for (int u = 0; u < %d; u++) {\n        const int cu = threadIdx.x + blockDim.x * u;\n"
                   "        if (cu >= %lld) break;\n        float r[8];\n"
                   "        for (int j = 0; j < 8; j++) r[j] = rstd * (dv[u][j] - a1 - xv[u][j] * b1);\n"
                   "        st8_%s(y + row * %lldLL + cu * 8, r);\n    }\n",
                nu, D / 8, ir_dtype_name(INN(2)->dtype), D, D, nu, D / 8, ir_dtype_name(n->dtype), D);
}

void eopb_layernorm_dx(EopGen *gen)
{
    const IrNode *n = OUTN, *x = INN(1);
    long long D = (long long)last_dim(n);
    if (ln_vec_ok(D) && eopb_ln_vec_dtypes(gen)) {
        gen_layernorm_dx_vec(gen);
        return;
    }
    char rows[128], tag[32];
    rows_expr(n, rows, sizeof rows);
    snprintf(tag, sizeof tag, "h%lld", D);
    StrBuf *s = eopb_phase(gen, "ln_dx", tag, EOP_LT_ROWS, sz_rows(n), row_threads(D));
    strbuf_printf(s, "    __shared__ float sh[32];\n    const i64 row = blockIdx.x;\n    if (row >= %s) return;\n"
                   "    const %s *xr = x1 + row * %lldLL;\n    const %s *dr = x0 + row * %lldLL;\n",
                rows, ctype(x->dtype), D, ctype(INN(0)->dtype), D);
    ln_stats_text(s, ldf(x->dtype), D, (double)(float)n->attr.norm.eps);
    const char *lx = ldf(x->dtype), *ldy = ldf(INN(0)->dtype), *lg = ldf(INN(2)->dtype);
    strbuf_printf(s, "    float a1 = 0.0f, b1 = 0.0f;\n"
                   "    for (int c = threadIdx.x; c < %lld; c += blockDim.x) {\n"
                   "        float xh = (%s(xr[c]) - mean) * rstd, g = %s(dr[c]) * %s(x2[c]);\n"
                   "        a1 += g;\n        b1 += g * xh;\n    }\n"
                   "    a1 = block_sum(a1, sh) * (1.0f / %lld);\n    b1 = block_sum(b1, sh) * (1.0f / %lld);\n"
                   "    for (int c = threadIdx.x; c < %lld; c += blockDim.x) {\n"
                   "        float xh = (%s(xr[c]) - mean) * rstd, g = %s(dr[c]) * %s(x2[c]);\n"
                   "        y[row * %lldLL + c] = %s(rstd * (g - a1 - xh * b1));\n    }\n",
                D, lx, ldy, lg, D, D, D, lx, ldy, lg, D, stf(n->dtype));
}

/* Row statistics into the scratch after the column partials, then the
 * column sums of dy * xhat. */
static void gen_layernorm_dgamma_vec(EopGen *gen)
{
    const IrNode *n = OUTN, *x = INN(1);
    long long D = (long long)last_dim(n);
    long long st_off = 2LL * EOP_COL_PARTS * D;   /* in floats, after the double partials */
    StepSize R = sz_rows(x);
    StrBuf *s = eopb_ln_row_phase(gen, "ln_stats", x, D);
    ln_row_load(s, "xv", "x1", x->dtype, D);
    eopb_ln_row_stats(s, D, (double)(float)n->attr.norm.eps);
    strbuf_printf(s, "    if (threadIdx.x == 0) {\n        sf[%lldLL + row] = mean;\n        sf[%lldLL + R + row] = rstd;\n    }\n",
                st_off, st_off);
    char load[256], term[160];
    snprintf(load, sizeof load, "            ld8_%s(x0 + r * %lldLL + c0, va);\n            ld8_%s(x1 + r * %lldLL + c0, vb);\n"
                                "            const float mu = sf[%lldLL + r], rs = sf[%lldLL + R + r];\n",
             ir_dtype_name(INN(0)->dtype), D, ir_dtype_name(x->dtype), D, st_off, st_off);
    snprintf(term, sizeof term, "(double)va[j] * (double)((vb[j] - mu) * rs)");
    eopb_colsum8_phases(gen, OUTN, "ln_dgamma", x, load, term);
    gen->scratch = eopb_sz_affine((int64_t)EOP_COL_PARTS * D * 8, 2 * 4, R);
}

void eopb_layernorm_dgamma(EopGen *gen)
{
    const IrNode *n = OUTN, *x = INN(1);
    long long D = (long long)last_dim(n);
    if (ln_vec_ok(D) && eopb_ln_vec_dtypes(gen)) {
        gen_layernorm_dgamma_vec(gen);
        return;
    }
    char rows[128], tag[32], term[256];
    rows_expr(x, rows, sizeof rows);
    snprintf(tag, sizeof tag, "h%lld", D);
    long long st_off = 2LL * EOP_COL_PARTS * D;   /* in floats, after the double partials */
    StepSize R = sz_rows(x);
    StrBuf *s = eopb_phase(gen, "ln_stats", tag, EOP_LT_ROWS, R, row_threads(D));
    strbuf_printf(s, "    __shared__ float sh[32];\n    const i64 row = blockIdx.x, R = %s;\n"
                   "    if (row >= R) return;\n    const %s *xr = x1 + row * %lldLL;\n",
                rows, ctype(x->dtype), D);
    ln_stats_text(s, ldf(x->dtype), D, (double)(float)n->attr.norm.eps);
    strbuf_printf(s, "    if (threadIdx.x == 0) {\n        sf[%lldLL + row] = mean;\n"
                   "        sf[%lldLL + R + row] = rstd;\n    }\n", st_off, st_off);
    snprintf(term, sizeof term,
             "(double)%s(x0[r * %lldLL + col]) * (double)((%s(x1[r * %lldLL + col]) - sf[%lldLL + r]) * sf[%lldLL + R + r])",
             ldf(INN(0)->dtype), D, ldf(x->dtype), D, st_off, st_off);
    eopb_colsum_phases(gen, OUTN, "ln_dgamma", x, term);
    gen->scratch = eopb_sz_affine((int64_t)EOP_COL_PARTS * D * 8, 2 * 4, R);
}


/* compiler/emit_ops_act.c — the activation kernels: ACT, ACT_BWD and
 * ACT_BWD_BGRAD (the backward with the bias gradient, compiler/fuse_act.c);
 * see emit_ops_body_internal.h. */
#include "emit_ops_body_internal.h"

#include <stdio.h>

#include "program/act_parts.h"

/* ---- activations: forward, backward, backward + bias gradient ----------
 * The FFN's activation moves B*L*ffn values per pass (BERT-base 256 x 128:
 * 201 MB each way in f16), so these kernels are written for bandwidth:
 * 16-byte loads and stores (8 values), four of them per input in flight
 * per thread before any math, f32 math (the exact GELU through gelu_cdf of
 * program/activations.h); the grid
 * strides, so any grid is correct.
 * ACT_BWD_BGRAD adds the bias gradient: each block sums the columns of
 * the stored dx over its rows into f32 partials, and a second kernel adds
 * the partials per column in a fixed order (double), so db has the same
 * bits every run. */


static const char *act_name(IrActKind k) { return ir_act_name(k); }

/* 16-byte chunks of one 8-value vector of dtype d (f32: two). */
static int act_chunks(DType d) { return d == DT_F32 ? 2 : 1; }

/* Raw loads of vector `vi` (a C expression) of input k into q{k}[u][..]. */
static void act_raw_load(StrBuf *s, int k, DType d, const char *vi, const char *indent)
{
    strbuf_printf(s, "%sfor (int w = 0; w < %d; w++) q%d[u][w] = ((const eop_v16 *)x%d)[(%s) * %d + w];\n",
                  indent, act_chunks(d), k, k, vi, act_chunks(d));
}

/* Stores the 8 f32 values NAME[8] to PTR (dtype d): 16-bit types two at a
 * time with one packed conversion (cvt.rn.{f16,bf16}x2.f32: the same
 * round-to-nearest-even as st_f16 / st_bf16 per value, half the
 * conversion instructions, which these kernels are short of).  With ACC,
 * ACC[j] += the stored value as f32 (what a reader of PTR sees). */
static void act_store8(StrBuf *s, DType d, const char *name, const char *ptr, const char *acc, const char *ind)
{
    if (d == DT_F32) {
        if (acc) strbuf_printf(s, "%s#pragma unroll\n%sfor (int j = 0; j < 8; j++) %s[j] += %s[j];\n", ind, ind, acc, name);
        strbuf_printf(s, "%sst8_f32(%s, %s);\n", ind, ptr, name);
        return;
    }
    const char *t = d == DT_F16 ? "f16" : "bf16";
    strbuf_printf(s, "%s{\n%s    eop_v16 pk;\n#pragma unroll\n%s    for (int k = 0; k < 4; k++) {\n"
                     "%s        asm(\"cvt.rn.%sx2.f32 %%0, %%1, %%2;\" : \"=r\"(pk.w[k]) : \"f\"(%s[2 * k + 1]), \"f\"(%s[2 * k]));\n",
                  ind, ind, ind, ind, t, name, name);
    if (acc)
        strbuf_printf(s, "%s        %s[2 * k] += ld_%s((unsigned short)(pk.w[k] & 0xffffu));\n"
                         "%s        %s[2 * k + 1] += ld_%s((unsigned short)(pk.w[k] >> 16));\n",
                      ind, acc, t, ind, acc, t);
    strbuf_printf(s, "%s    }\n%s    *(eop_v16 *)(%s) = pk;\n%s}\n", ind, ind, ptr, ind);
}

/* Vector phase over the node's values: out = EXPR of v0[j], v1[j] (the
 * inputs' element as f32), 4 vectors of 8 per thread per step. */
static void act_vec_phase(EopGen *gen, const char *base, const char *expr)
{
    const IrNode *n = OUTN;
    char tag[64], num[128];
    eopb_shape_tag(n, tag, sizeof tag);
    numel_expr(n, num, sizeof num);
    /* One thread per 4 vectors of 8: many short blocks (BERT-base 256 x 128:
     * 12288 of 256, ~19 waves on an H200), so the last wave's tail is small. */
    StepSize cnt = eopb_sz_ceil_div(sz_numel(n), 32);
    StrBuf *s = eopb_phase(gen, base, tag, EOP_LT_ELEMS, cnt, 256);
    strbuf_printf(s, "    const i64 n = %s, nv = n / 8, T = (i64)gridDim.x * blockDim.x;\n"
                   "    for (i64 v = (i64)blockIdx.x * blockDim.x + threadIdx.x; v < nv; v += 4 * T) {\n", num);
    for (int k = 0; k < n->n_in; k++)
        strbuf_printf(s, "        eop_v16 q%d[4][%d];\n", k, act_chunks(INN(k)->dtype));
    strbuf_add(s, "#pragma unroll\n        for (int u = 0; u < 4; u++) {\n            if (v + u * T >= nv) break;\n");
    for (int k = 0; k < n->n_in; k++) act_raw_load(s, k, INN(k)->dtype, "v + u * T", "            ");
    strbuf_add(s, "        }\n#pragma unroll\n        for (int u = 0; u < 4; u++) {\n"
                "            if (v + u * T >= nv) break;\n");
    for (int k = 0; k < n->n_in; k++)
        strbuf_printf(s, "            float v%d[8];\n            ld8_%s((const %s *)q%d[u], v%d);\n", k,
                      ir_dtype_name(INN(k)->dtype), ctype(INN(k)->dtype), k, k);
    strbuf_add(s, "            float r[8];\n#pragma unroll\n            for (int j = 0; j < 8; j++) r[j] = ");
    strbuf_add(s, expr);
    strbuf_add(s, ";\n");
    act_store8(s, n->dtype, "r", "y + (v + u * T) * 8", NULL, "            ");
    strbuf_add(s, "        }\n    }\n");
    /* the last n % 8 values */
    eopb_vec_tail(gen, s, "T", expr);
}

void eopb_act(EopGen *gen)
{
    char base[32], expr[64];
    const char *a = act_name(OUTN->attr.act.kind);
    snprintf(base, sizeof base, "%s_fwd", a);
    if (eopb_vec_ok(gen)) {
        snprintf(expr, sizeof expr, "act_%s(v0[j])", a);
        act_vec_phase(gen, base, expr);
        return;
    }
    StrBuf *s = eopb_elems_phase(gen, base, OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s(act_%s(%s(x0[i])));\n", stf(OUTN->dtype), a, ldf(INN(0)->dtype));
}

void eopb_act_bwd(EopGen *gen)
{
    char base[32], expr[64];
    const char *a = act_name(OUTN->attr.act.kind);
    snprintf(base, sizeof base, "%s_bwd", a);
    if (eopb_vec_ok(gen)) {
        snprintf(expr, sizeof expr, "v0[j] * actg_%s(v1[j])", a);
        act_vec_phase(gen, base, expr);
        return;
    }
    StrBuf *s = eopb_elems_phase(gen, base, OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s(%s(x0[i]) * actg_%s(%s(x1[i])));\n", stf(OUTN->dtype),
                ldf(INN(0)->dtype), a, ldf(INN(1)->dtype));
}

/* The blocks of ACT_BWD_BGRAD's first phase for R rows and `slices`
 * column slices: at least slices x min(ACT_PARTS, ceil(R / ACT_PART_ROWS))
 * launched (a StepSize), of which slices x P (P of program/act_parts.h,
 * kernel text) work. */
static StepSize act_parts_size(const IrNode *n, int slices)
{
    StepSize s = sz_rows(n);
    s.c1 *= slices;
    s.c0 = (int64_t)slices * (ACT_PART_ROWS - 1);
    s.div = ACT_PART_ROWS;
    s.cap = (int64_t)slices * ACT_PARTS;
    return s;
}

static void act_parts_text(StrBuf *s, const IrNode *n)
{
    char rows[128];
    rows_expr(n, rows, sizeof rows);
    strbuf_printf(s, "    const i64 R = %s;\n" ACT_PARTS_CUDA_TEXT, rows);
}

/* Phase 1, vector form (C % 8 == 0).  Blocks of ACT_LANES x T threads
 * (act_vec_threads): block (s, b), s the column slice, b < P, has thread
 * (y, t) on the 8 columns of chunk s T + t over rows b + y P, b + (y +
 * ACT_LANES) P, ... (four rows' loads in flight); the lanes' sums meet in
 * shared memory in lane order (the same bits every run) and lane 0 writes
 * partial b.  So each partial's rows are read by ACT_LANES threads at once,
 * and the C / 8 chunks of a row by several blocks: at BERT-base 32 x 32
 * (1024 rows, 16 a partial) 192 blocks of 512 threads, each thread's four
 * rows in flight at once, where one block a partial (64 blocks of 384)
 * had each thread walk its 16 rows four at a time.  dx is rounded to its
 * dtype and the stored value summed, as BIAS_GRAD reads it; y (output 2)
 * is act(x). */
#define ACT_LANES 4

/* Threads of a lane (T): one a chunk of 8 columns, 32 to 128. */
static int act_vec_threads(long long C)
{
    long long t = (C / 8 + 31) / 32 * 32;
    return t < 32 ? 32 : t > 128 ? 128 : (int)t;
}

static int act_vec_slices(long long C) { return (int)((C / 8 + act_vec_threads(C) - 1) / act_vec_threads(C)); }

static void act_bgrad_vec(EopGen *gen, StrBuf *s, const char *a, int y2)
{
    const IrNode *n = OUTN;
    long long C = (long long)last_dim(n);
    int T = act_vec_threads(C), S = act_vec_slices(C);
    DType dd = INN(0)->dtype, dx = INN(1)->dtype, dt = n->dtype;
    strbuf_printf(s, "    if (blockIdx.x >= %d * P) return;\n"
                   "    const i64 b = blockIdx.x %% P, Y = %d, step = Y * P;\n"
                   "    const int t = threadIdx.x %% %d, lane = threadIdx.x / %d, cu = (int)(blockIdx.x / P) * %d + t;\n"
                   "    __shared__ float4 handed[%d][%d][2];   // lanes 1.. to lane 0\n"
                   "    float acc[8];\n#pragma unroll\n    for (int j = 0; j < 8; j++) acc[j] = 0.0f;\n"
                   "    if (cu < %lld) {\n",
                  S, ACT_LANES, T, T, T, ACT_LANES - 1, T, C / 8);
    if (y2 >= 0)
        strbuf_printf(s, "        %s *y2 = (%s *)a.yk[1];\n", ctype(gen->g->nodes[y2].dtype), ctype(gen->g->nodes[y2].dtype));
    /* one row: q0 (dy) and q1 (x) chunks of row r at column block cu */
    strbuf_printf(s, "        auto row = [&](const eop_v16 *qd, const eop_v16 *qx, i64 r) {\n"
                   "            float d[8], x[8], o[8];\n"
                   "            ld8_%s((const %s *)qd, d);\n            ld8_%s((const %s *)qx, x);\n",
                  ir_dtype_name(dd), ctype(dd), ir_dtype_name(dx), ctype(dx));
    if (y2 >= 0 && OUTN->attr.act_bgrad.kind == IR_ACT_GELU)
        /* act_gelu and actg_gelu of program/activations.h in their order of
         * operations, with Phi(x) and phi(x) computed once for both */
        strbuf_add(s, "#pragma unroll\n            for (int j = 0; j < 8; j++) {\n"
                      "                float pdf;\n"
                      "                const float cdf = gelu_cdf(x[j], &pdf);\n"
                      "                o[j] = d[j] * (cdf + x[j] * pdf);\n"
                      "                x[j] = x[j] * cdf;\n            }\n");
    else if (y2 >= 0)
        strbuf_printf(s, "#pragma unroll\n            for (int j = 0; j < 8; j++) {\n"
                         "                o[j] = d[j] * actg_%s(x[j]);\n                x[j] = act_%s(x[j]);\n            }\n",
                      a, a);
    else
        strbuf_printf(s, "#pragma unroll\n            for (int j = 0; j < 8; j++) o[j] = d[j] * actg_%s(x[j]);\n", a);
    char ptr[64];
    snprintf(ptr, sizeof ptr, "y + r * %lldLL + cu * 8", C);
    act_store8(s, dt, "o", ptr, "acc", "            ");
    if (y2 >= 0) {
        snprintf(ptr, sizeof ptr, "y2 + r * %lldLL + cu * 8", C);
        act_store8(s, gen->g->nodes[y2].dtype, "x", ptr, NULL, "            ");
    }
    strbuf_printf(s, "        };\n        i64 r = b + lane * P;\n"
                   "        for (; r + 3 * step < R; r += 4 * step) {\n"
                   "            eop_v16 q0[4][%d], q1[4][%d];\n"
                   "#pragma unroll\n            for (int u = 0; u < 4; u++) {\n"
                   "                const i64 vi = (r + u * step) * %lldLL + cu;\n",
                  act_chunks(dd), act_chunks(dx), C / 8);
    act_raw_load(s, 0, dd, "vi", "                ");
    act_raw_load(s, 1, dx, "vi", "                ");
    strbuf_printf(s, "            }\n#pragma unroll\n            for (int u = 0; u < 4; u++) row(q0[u], q1[u], r + u * step);\n"
                   "        }\n"
                   "        for (; r < R; r += step) {\n            eop_v16 q0[1][%d], q1[1][%d];\n"
                   "            const int u = 0;\n            const i64 vi = r * %lldLL + cu;\n",
                  act_chunks(dd), act_chunks(dx), C / 8);
    act_raw_load(s, 0, dd, "vi", "            ");
    act_raw_load(s, 1, dx, "vi", "            ");
    strbuf_printf(s, "            row(q0[0], q1[0], r);\n        }\n    }\n"
                   "    if (lane > 0) {\n"
                   "        handed[lane - 1][t][0] = make_float4(acc[0], acc[1], acc[2], acc[3]);\n"
                   "        handed[lane - 1][t][1] = make_float4(acc[4], acc[5], acc[6], acc[7]);\n    }\n"
                   "    __syncthreads();\n"
                   "    if (lane > 0 || cu >= %lld) return;\n"
                   "    for (int k = 0; k < Y - 1; k++) {\n"
                   "        const float4 h0 = handed[k][t][0], h1 = handed[k][t][1];\n"
                   "        acc[0] += h0.x, acc[1] += h0.y, acc[2] += h0.z, acc[3] += h0.w;\n"
                   "        acc[4] += h1.x, acc[5] += h1.y, acc[6] += h1.z, acc[7] += h1.w;\n    }\n"
                   "    float4 *pp = (float4 *)(sf + b * %lldLL + cu * 8);\n"
                   "    pp[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);\n"
                   "    pp[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);\n",
                  C / 8, C);
}

/* Phase 1, any C: one column per thread per row. */
static void act_bgrad_scalar(EopGen *gen, StrBuf *s, const char *a, int y2)
{
    const IrNode *n = OUTN;
    long long C = (long long)last_dim(n);
    strbuf_printf(s, "    const i64 b = blockIdx.x;\n    if (b >= P) return;\n");
    if (y2 >= 0)
        strbuf_printf(s, "    %s *y2 = (%s *)a.yk[1];\n", ctype(gen->g->nodes[y2].dtype), ctype(gen->g->nodes[y2].dtype));
    strbuf_printf(s, "    for (int c = threadIdx.x; c < %lld; c += blockDim.x) {\n        float acc = 0.0f;\n"
                   "        for (i64 r = b; r < R; r += P) {\n            const i64 i = r * %lldLL + c;\n"
                   "            const float x = %s(x1[i]), o = %s(%s(%s(x0[i]) * actg_%s(x)));\n"
                   "            y[i] = %s(o);\n            acc += o;\n",
                  C, C, ldf(INN(1)->dtype), ldf(n->dtype), stf(n->dtype), ldf(INN(0)->dtype), a, stf(n->dtype));
    if (y2 >= 0) strbuf_printf(s, "            y2[i] = %s(act_%s(x));\n", stf(gen->g->nodes[y2].dtype), a);
    strbuf_printf(s, "        }\n        sf[b * %lldLL + c] = acc;\n    }\n", C);
}

/* ACT_BWD_BGRAD: phase 1 writes dx (and y) and the partials (P, C) f32 in
 * the scratch; phase 2, one block of 8 warps per 32 columns, adds them in
 * double in a fixed order into db (output 1). */
void eopb_act_bwd_bgrad(EopGen *gen)
{
    const IrNode *n = OUTN;
    const char *a = act_name(n->attr.act_bgrad.kind);
    long long C = (long long)last_dim(n);
    int db = ir_output(gen->g, gen->id, 1), y2 = ir_output(gen->g, gen->id, 2);
    bool vec = eopb_vec_ok(gen) && C % 8 == 0 && (y2 < 0 || float_dtype(gen->g->nodes[y2].dtype));
    char tag[64], base[48];
    eopb_shape_tag(n, tag, sizeof tag);
    snprintf(base, sizeof base, "%s_bwd_bgrad%s", a, vec ? "8" : "");
    int threads = C >= 512 ? 512 : C <= 64 ? 64 : (int)((C + 31) / 32 * 32);
    if (vec) threads = ACT_LANES * act_vec_threads(C);
    StrBuf *s = eopb_phase(gen, base, tag, EOP_LT_ROWS, act_parts_size(n, vec ? act_vec_slices(C) : 1), threads);
    act_parts_text(s, n);
    if (vec) act_bgrad_vec(gen, s, a, y2);
    else act_bgrad_scalar(gen, s, a, y2);
    snprintf(base, sizeof base, "%s_bgrad_sum", a);
    snprintf(tag, sizeof tag, "c%lld", C);
    s = eopb_phase(gen, base, tag, EOP_LT_ELEMS, sz_const((C + 31) / 32 * 256), 256);
    act_parts_text(s, n);
    DType dbt = db >= 0 ? gen->g->nodes[db].dtype : DT_F32;
    strbuf_printf(s, "    __shared__ double part[8][32];\n"
                   "    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;\n"
                   "    const i64 col = (i64)blockIdx.x * 32 + lane;\n    double t = 0.0;\n"
                   "    if (col < %lld)\n        for (i64 p = w; p < P; p += 8) t += (double)sf[p * %lldLL + col];\n"
                   "    part[w][lane] = t;\n    __syncthreads();\n"
                   "    %s *db = (%s *)a.yk[0];\n"
                   "    if (w != 0 || col >= %lld || !db) return;\n"
                   "    for (int k = 1; k < 8; k++) t += part[k][lane];\n"
                   "    db[col] = %s((float)t);\n",
                  C, C, ctype(dbt), ctype(dbt), C, stf(dbt));
    /* partials: (P, C) f32, P <= ceil(R / ACT_PART_ROWS) */
    StepSize sc = sz_rows(n);
    sc.c1 *= C * 4;
    sc.c0 = (int64_t)(ACT_PART_ROWS - 1) * C * 4;
    sc.div = ACT_PART_ROWS;
    sc.cap = (int64_t)ACT_PARTS * C * 4;
    gen->scratch = sc;
}


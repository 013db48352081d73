/* compiler/emit_ops_body.c — the CUDA text of each op kind; see
 * emit_ops_body.h.  Each case mirrors the op's CPU reference in
 * runtime/cpu/cpu_exec_ops.inc.  Here: the dispatch (op_cuda, the `cuda`
 * column of program/ops.def) and the simple ops (elementwise, copies,
 * casts, dropout, heads, stack, softmax, losses, GEMMs, bias gradients,
 * their backwards, the fused softmax/dropout/residual ops, packed batches);
 * the LayerNorm kernels are in emit_ops_layernorm.c, the activations in
 * emit_ops_act.c, the fused LayerNorm sites in emit_ops_ln_site.c, the
 * fused embedding layer in emit_ops_embed_ln.c, the fused attention in
 * emit_ops_attention.c, and the helpers they share in emit_ops_body_util.c
 * (emit_ops_body_internal.h). */
#include "emit_ops_body_internal.h"
#include "emit_ops_attention.h"

#include "fuse.h"
#include "program/plan.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---------------------------------------------------------- */

/* s / k, exact: k divides the constant factor. */
static StepSize sz_exact_div(StepSize s, int64_t k)
{
    HPC_ASSERT(s.c0 == 0 && s.div == 1 && s.c1 % k == 0);
    s.c1 /= k;
    return s;
}
/* numel / L: the rows of a value whose last dim is L (scores, probs). */
static StepSize rows_over_l(const IrNode *v)
{
    StepSize s = sz_numel(v);
    HPC_ASSERT(s.pL > 0);
    s.pL--;
    return s;
}

/* An elementwise phase over the output, 8 elements per thread through
 * 16-byte loads and stores (emit_ops.c's ld8_ / st8_), then a scalar tail.
 * `expr` is element i's f32 value from v0[j], v1[j], ... (input k's element
 * i as f32); `pre` declares constants.  The result is rounded once to the
 * output dtype, as in the scalar kernels. */
static void vec_elems(EopGen *gen, const char *base, const char *pre, const char *expr)
{
    const IrNode *n = OUTN;
    char tag[64], num[128];
    eopb_shape_tag(n, tag, sizeof tag);
    numel_expr(n, num, sizeof num);
    StrBuf *s = eopb_phase(gen, base, tag, EOP_LT_ELEMS, eopb_sz_ceil_div(sz_numel(n), 8), 256);
    strbuf_printf(s, "    const i64 n = %s, nv = n / 8;\n", num);
    strbuf_add(s, pre);
    strbuf_add(s, "    EOP_FOR(iv, nv) {\n        const i64 i0 = iv * 8;\n");
    for (int k = 0; k < n->n_in; k++)
        strbuf_printf(s, "        float v%d[8];\n        ld8_%s(x%d + i0, v%d);\n", k, ir_dtype_name(INN(k)->dtype), k, k);
    strbuf_add(s, "        float r[8];\n#pragma unroll\n        for (int j = 0; j < 8; j++) {\n"
                "            const i64 i = i0 + j;\n            (void)i;\n            r[j] = ");
    strbuf_add(s, expr);
    strbuf_printf(s, ";\n        }\n        st8_%s(y + i0, r);\n    }\n", ir_dtype_name(n->dtype));
    eopb_vec_tail(gen, s, "(i64)gridDim.x * blockDim.x", expr);
}

/* ---- forward ops ------------------------------------------------------ */

static void gen_loss_scale(EopGen *gen)
{
    StrBuf *s = eopb_elems_phase(gen, "loss_scale", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s(ctl->loss_scale);\n", stf(OUTN->dtype));
}

static void gen_positions(EopGen *gen)
{
    StrBuf *s = eopb_elems_phase(gen, "positions", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = (int)(i %% a.L) + %lld;\n", (long long)OUTN->attr.pos.offset);
}

static void gen_embedding(EopGen *gen)
{
    int64_t V = INN(0)->dims[0], D = INN(0)->dims[1];
    StrBuf *s = eopb_elems_phase(gen, "embedding", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) {\n        int id = x1[i / %lldLL];\n"
                   "        y[i] = %s(id >= 0 && id < %lld ? %s(x0[(i64)id * %lldLL + i %% %lldLL]) : EOP_NAN);\n    }\n",
                (long long)D, stf(OUTN->dtype), (long long)V, ldf(INN(0)->dtype), (long long)D,
                (long long)D);
}

static void gen_add(EopGen *gen)
{
    if (eopb_vec_ok(gen)) {
        vec_elems(gen, "add", "", "v0[j] + v1[j]");
        return;
    }
    StrBuf *s = eopb_elems_phase(gen, "add", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s(%s(x0[i]) + %s(x1[i]));\n", stf(OUTN->dtype),
                ldf(INN(0)->dtype), ldf(INN(1)->dtype));
}

static void gen_cast(EopGen *gen)
{
    if (eopb_vec_ok(gen)) {
        vec_elems(gen, "cast", "", "v0[j]");
        return;
    }
    StrBuf *s = eopb_elems_phase(gen, "cast", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s(%s(x0[i]));\n", stf(OUTN->dtype), ldf(INN(0)->dtype));
}

void eopb_use_salt(EopGen *gen, uint32_t salt)
{
    HPC_ASSERT(!gen->has_salt || gen->salt == salt);
    gen->salt = salt;
    gen->has_salt = true;
}

static void gen_dropout(EopGen *gen)
{
    const IrDropoutAttr *d = &OUTN->attr.dropout;
    if (eopb_vec_ok(gen)) {
        char pre[256], expr[160];
        snprintf(pre, sizeof pre, "    const float p = (float)%.9g;\n    const float sc = (float)(1.0 / (1.0 - (double)p));\n"
                                  "    const bool on = ctl->training && p != 0.0f;\n", (double)(float)d->p);
        eopb_use_salt(gen, (uint32_t)d->salt);
        snprintf(expr, sizeof expr, "dropout_elem(philox_mask8(ctl->seed, (u64)(i - j) >> 3, ctl->step, (u32)a.salt, p), i, on, v0[j], sc)");
        vec_elems(gen, "dropout", pre, expr);
        return;
    }
    StrBuf *s = eopb_elems_phase(gen, "dropout", OUTN);
    strbuf_printf(s, "    const float p = (float)%.9g;\n    const float sc = (float)(1.0 / (1.0 - (double)p));\n"
                   "    const bool on = ctl->training && p != 0.0f;\n"
                   "    EOP_FOR(i, n) {\n        float v = %s(x0[i]);\n"
                   "        if (on) v = philox_keep(ctl->seed, (u64)i, ctl->step, (u32)a.salt, p) ? v * sc : 0.0f;\n"
                   "        y[i] = %s(v);\n    }\n",
                (double)(float)d->p, ldf(INN(0)->dtype), stf(OUTN->dtype));
    eopb_use_salt(gen, (uint32_t)d->salt);
}

/* The permutation as a copy of 16-byte chunks: each head's D elements are
 * contiguous on both sides, so chunk i (elements i*W ..) moves as a whole. */
static void heads_copy(EopGen *gen, bool split, long long NH, long long D, long long W)
{
    char tag[64], num[128];
    eopb_shape_tag(OUTN, tag, sizeof tag);
    numel_expr(OUTN, num, sizeof num);
    StrBuf *s = eopb_phase(gen, split ? "split_heads_v" : "merge_heads_v", tag, EOP_LT_ELEMS,
                    sz_exact_div(sz_numel(OUTN), W), 256);
    strbuf_printf(s, "    const i64 n = %s / %lldLL;\n    EOP_FOR(c, n) {\n        const i64 i = c * %lldLL;\n"
                   "        i64 dd = i %% %lldLL, r = i / %lldLL;\n",
                num, W, W, D, D);
    if (split)
        strbuf_printf(s, "        i64 l = r %% a.L; r /= a.L;\n        i64 hh = r %% %lldLL, b = r / %lldLL;\n"
                       "        const i64 src = ((b * a.L + l) * %lldLL + hh) * %lldLL + dd;\n",
                    NH, NH, NH, D);
    else
        strbuf_printf(s, "        i64 hh = r %% %lldLL; r /= %lldLL;\n        i64 l = r %% a.L, b = r / a.L;\n"
                       "        const i64 src = ((b * %lldLL + hh) * a.L + l) * %lldLL + dd;\n",
                    NH, NH, NH, D);
    strbuf_add(s, "        *(eop_v16 *)(y + i) = *(const eop_v16 *)(x0 + src);\n    }\n");
}

/* out (B, NH, L, D) from in (B, L, NH*D), or the reverse when merging. */
static void gen_heads(EopGen *gen, bool split)
{
    const IrNode *h = split ? OUTN : INN(0);   /* the (B, NH, L, D) side */
    long long NH = (long long)h->dims[1], D = (long long)h->dims[3];
    size_t es = OUTN->dtype == DT_F32 ? 4 : 2;
    long long W = (long long)(16 / es);   /* elements per 16-byte chunk */
    if (INN(0)->dtype == OUTN->dtype && float_dtype(OUTN->dtype) && D > 0 && D % W == 0) {
        heads_copy(gen, split, NH, D, W);
        return;
    }
    StrBuf *s = eopb_elems_phase(gen, split ? "split_heads" : "merge_heads", OUTN);
    if (split)
        strbuf_printf(s, "    EOP_FOR(i, n) {\n        i64 dd = i %% %lldLL, r = i / %lldLL;\n"
                       "        i64 l = r %% a.L; r /= a.L;\n        i64 hh = r %% %lldLL, b = r / %lldLL;\n"
                       "        y[i] = %s(%s(x0[((b * a.L + l) * %lldLL + hh) * %lldLL + dd]));\n    }\n",
                    D, D, NH, NH, stf(OUTN->dtype), ldf(INN(0)->dtype), NH, D);
    else
        strbuf_printf(s, "    EOP_FOR(i, n) {\n        i64 dd = i %% %lldLL, r = i / %lldLL;\n"
                       "        i64 hh = r %% %lldLL; r /= %lldLL;\n        i64 l = r %% a.L, b = r / a.L;\n"
                       "        y[i] = %s(%s(x0[((b * %lldLL + hh) * a.L + l) * %lldLL + dd]));\n    }\n",
                    D, D, NH, NH, stf(OUTN->dtype), ldf(INN(0)->dtype), NH, D);
}

/* Whether the planner stores value id inside another value (program/
 * plan.h: a STACK of adjacent parameters, an UNSTACK's parts): then no
 * kernel runs for it. */
static bool planned_view(const EopGen *gen)
{
    int base;
    int64_t off;
    return plan_view_of(gen->g, gen->id, &base, &off);
}

/* STACK (compiler/fuse_qkv.c): rows of x0, x1, x2 one after another.  Of
 * parameters (adjacent in the cuda executor's buffers, program/
 * param_pack.h) a view, no kernel; else a copy. */
static void gen_stack(EopGen *gen)
{
    if (planned_view(gen)) return;
    StrBuf *s = eopb_elems_phase(gen, "stack", OUTN);
    strbuf_printf(s, "    const i64 part = n / 3;\n"
                   "    EOP_FOR(i, n) {\n        const i64 k = i / part, j = i - k * part;\n"
                   "        y[i] = %s(k == 0 ? %s(x0[j]) : k == 1 ? %s(x1[j]) : %s(x2[j]));\n    }\n",
                stf(OUTN->dtype), ldf(INN(0)->dtype), ldf(INN(1)->dtype), ldf(INN(2)->dtype));
}

/* UNSTACK: the three row blocks of x0 into outputs 0, 1, 2 (a.yk[0, 1];
 * absent ones are 0); where the parts are views of x0 (the stacked dW and
 * bias gradients), no kernel. */
static void gen_unstack(EopGen *gen)
{
    if (planned_view(gen)) return;
    StrBuf *s = eopb_elems_phase(gen, "unstack", OUTN);
    const char *t = ctype(OUTN->dtype);
    strbuf_printf(s, "    %s *y1 = (%s *)a.yk[0], *y2 = (%s *)a.yk[1];\n"
                   "    EOP_FOR(i, n) {\n        y[i] = %s(%s(x0[i]));\n"
                   "        if (y1) y1[i] = %s(%s(x0[n + i]));\n        if (y2) y2[i] = %s(%s(x0[2 * n + i]));\n    }\n",
                t, t, t, stf(OUTN->dtype), ldf(INN(0)->dtype), stf(OUTN->dtype), ldf(INN(0)->dtype),
                stf(OUTN->dtype), ldf(INN(0)->dtype));
}

/* LN_DW_FIX (compiler/fuse_ln_dw.c): y = raw * gamma[col] + db[row] * beta[col]
 * over the (out, in) weight gradient, as one fused multiply-add of raw *
 * gamma onto db * beta (the optimizer's opt_fix computes the same values
 * bit for bit, compiler/emit_optim.c); may write over raw (program/plan.c:
 * each thread reads and writes the same elements).  With in % 8 == 0 (every
 * hidden size hpc trains), 8 columns of one row a thread through 16-byte
 * loads and stores: the fix is a pass over the f32 gradient per LayerNorm
 * site, bound by its bytes.
 *
 * LN_DW_FIX_DB (HPC_LN_SAVE=xhat_ones, db_in_raw): raw is (out, in +
 * IR_XHAT_ONES_PAD) and its column `in` is db, which the thread of each
 * row's first columns also writes to output 1 (a.yk[0]).  Not in place:
 * raw's rows are longer than y's. */
static void gen_dw_fix(EopGen *gen, bool db_in_raw)
{
    long long in = (long long)OUTN->dims[1], ldr = (long long)last_dim(INN(0));
    const char *name = db_in_raw ? "ln_dw_fix_db" : "ln_dw_fix", *t = ctype(OUTN->dtype), *st = stf(OUTN->dtype);
    /* raw's element (o, c) for the scalar and the vector loop, db's source, and the db output */
    char elem[64], vec[64], db[96], decl[96] = "", put[96] = "";
    if (db_in_raw) {
        snprintf(elem, sizeof elem, "x0[o * %lldLL + c]", ldr);
        snprintf(vec, sizeof vec, "x0 + o * %lldLL + c", ldr);
        snprintf(db, sizeof db, "%s(x0[o * %lldLL + %lldLL])", ldf(INN(0)->dtype), ldr, in);
        snprintf(decl, sizeof decl, "    %s *o_db = (%s *)a.yk[0];\n", t, t);
        snprintf(put, sizeof put, "        if (c == 0 && o_db) o_db[o] = %s(db);\n", st);
    } else {
        snprintf(elem, sizeof elem, "x0[i]");
        snprintf(vec, sizeof vec, "x0 + i0");
        snprintf(db, sizeof db, "%s(x3[o])", ldf(INN(3)->dtype));
    }
    if (in % 8 != 0) {
        StrBuf *s = eopb_elems_phase(gen, name, OUTN);
        char dbl[128] = "";
        if (db_in_raw) snprintf(dbl, sizeof dbl, "        const float db = %s;\n", db);
        strbuf_printf(s, "%s    EOP_FOR(i, n) {\n        const i64 o = i / %lldLL, c = i - o * %lldLL;\n"
                       "%s        y[i] = %s(__fmaf_rn(%s(%s), %s(x1[c]), %s * %s(x2[c])));\n%s    }\n",
                    decl, in, in, dbl, st, ldf(INN(0)->dtype), elem, ldf(INN(1)->dtype), db_in_raw ? "db" : db,
                    ldf(INN(2)->dtype), put);
        return;
    }
    char tag[64], num[128];
    eopb_shape_tag(OUTN, tag, sizeof tag);
    numel_expr(OUTN, num, sizeof num);
    StrBuf *s = eopb_phase(gen, name, tag, EOP_LT_ELEMS, eopb_sz_ceil_div(sz_numel(OUTN), 8), 256);
    strbuf_printf(s, "    const i64 n = %s;\n%s"
                   "    EOP_FOR(iv, n / 8) {\n        const i64 i0 = iv * 8, o = i0 / %lldLL, c = i0 - o * %lldLL;\n"
                   "        float r[8], gm[8], bt[8];\n"
                   "        ld8_%s(%s, r);\n        ld8_%s(x1 + c, gm);\n        ld8_%s(x2 + c, bt);\n"
                   "        const float db = %s;\n"
                   "#pragma unroll\n        for (int j = 0; j < 8; j++) r[j] = __fmaf_rn(r[j], gm[j], db * bt[j]);\n"
                   "        st8_%s(y + i0, r);\n%s    }\n",
                num, decl, in, in, ir_dtype_name(INN(0)->dtype), vec, ir_dtype_name(INN(1)->dtype),
                ir_dtype_name(INN(2)->dtype), db, ir_dtype_name(OUTN->dtype), put);
}

static void gen_ln_dw_fix(EopGen *gen) { gen_dw_fix(gen, false); }
static void gen_ln_dw_fix_db(EopGen *gen) { gen_dw_fix(gen, true); }

static void gen_slice_first(EopGen *gen)
{
    long long H = (long long)last_dim(OUTN);
    StrBuf *s = eopb_elems_phase(gen, "slice_first", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s(%s(x0[(i / %lldLL) * a.L * %lldLL + i %% %lldLL]));\n",
                stf(OUTN->dtype), ldf(INN(0)->dtype), H, H, H);
}

/* Declares `tl`, the token SLICE_LAST reads in batch row `bexpr`: the last
 * t with mask x1[b, t] != 0, else 0 (cpu_exec_ops.inc's slice_last_pos). */
static void slice_last_pos_text(StrBuf *s, const char *bexpr)
{
    strbuf_printf(s, "        const int *mr = x1 + (%s) * a.L;\n        i64 tl = a.L - 1;\n"
                   "        while (tl > 0 && mr[tl] == 0) tl--;\n", bexpr);
}

static void gen_slice_last(EopGen *gen)
{
    long long H = (long long)last_dim(OUTN);
    StrBuf *s = eopb_elems_phase(gen, "slice_last", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) {\n        const i64 b = i / %lldLL, c = i %% %lldLL;\n", H, H);
    slice_last_pos_text(s, "b");
    strbuf_printf(s, "        y[i] = %s(%s(x0[(b * a.L + tl) * %lldLL + c]));\n    }\n", stf(OUTN->dtype),
                ldf(INN(0)->dtype), H);
}

static void gen_shift_labels(EopGen *gen)
{
    StrBuf *s = eopb_elems_phase(gen, "shift_labels", OUTN);
    strbuf_add(s, "    EOP_FOR(i, n) {\n        i64 t = i % a.L;\n"
                "        y[i] = t + 1 < a.L && x1[i + 1] ? x0[i + 1] : -100;\n    }\n");
}

/* One warp per row of L keys; rows = numel / L. */
static StrBuf *warp_rows_phase(EopGen *gen, const char *base)
{
    const IrNode *n = OUTN;
    char numel[128], tag[64];
    numel_expr(n, numel, sizeof numel);
    eopb_shape_tag(n, tag, sizeof tag);
    StrBuf *s = eopb_phase(gen, base, tag, EOP_LT_WARP_ROWS, rows_over_l(n), 128);
    strbuf_printf(s, "    const i64 rows = %s / a.L;\n"
                   "    const i64 row = (i64)blockIdx.x * 4 + (threadIdx.x >> 5);\n"
                   "    const int lane = threadIdx.x & 31;\n    if (row >= rows) return;\n", numel);
    return s;
}

static void gen_softmax(EopGen *gen)
{
    const IrNode *n = OUTN;
    StrBuf *s = warp_rows_phase(gen, n->attr.softmax.causal ? "softmax_causal_fwd" : "softmax_fwd");
    const char *ld = ldf(INN(0)->dtype);
    strbuf_printf(s, "    const i64 b = row / (%lldLL * a.L), q = row %% a.L;\n"
                   "    const int *mask = x1 + b * a.L;\n    const %s *sc = x0 + row * a.L;\n"
                   "#define VIS(k) (mask[k] != 0 && !(%d && (k) > q))\n"
                   "    float m = EOP_NEG_INF;\n"
                   "    for (i64 k = lane; k < a.L; k += 32) if (VIS(k)) m = fmaxf(m, %s(sc[k]));\n"
                   "    m = warp_max(m);\n    float sum = 0.0f;\n"
                   "    for (i64 k = lane; k < a.L; k += 32) if (VIS(k)) sum += expf(%s(sc[k]) - m);\n"
                   "    sum = warp_sum(sum);\n"
                   "    for (i64 k = lane; k < a.L; k += 32)\n"
                   "        y[row * a.L + k] = %s(VIS(k) && sum != 0.0f ? expf(%s(sc[k]) - m) / sum : 0.0f);\n"
                   "#undef VIS\n",
                (long long)n->dims[1], ctype(INN(0)->dtype), n->attr.softmax.causal ? 1 : 0, ld, ld,
                stf(n->dtype), ld);
}

/* Row losses into sf (N floats), then the mean over labelled rows. */
static void gen_cross_entropy(EopGen *gen)
{
    const IrNode *x = INN(0), *lab = INN(1);
    long long C = (long long)last_dim(x);
    char N[128], tag[32];
    numel_expr(lab, N, sizeof N);
    snprintf(tag, sizeof tag, "c%lld", C);
    StepSize rows = sz_numel(lab);
    const char *ld = ldf(x->dtype);
    StrBuf *s = eopb_phase(gen, "xent_rows", tag, EOP_LT_ROWS, rows, C >= 256 ? 256 : 128);
    strbuf_printf(s, "    __shared__ float sh[32];\n    const i64 row = blockIdx.x;\n    if (row >= %s) return;\n"
                   "    const %s *xr = x0 + row * %lldLL;\n    const int label = x1[row];\n"
                   "    float m = EOP_NEG_INF;\n"
                   "    for (int c = threadIdx.x; c < %lld; c += blockDim.x) m = fmaxf(m, %s(xr[c]));\n"
                   "    m = block_max(m, sh);\n    float e = 0.0f;\n"
                   "    for (int c = threadIdx.x; c < %lld; c += blockDim.x) e += expf(%s(xr[c]) - m);\n"
                   "    e = block_sum(e, sh);\n"
                   "    if (threadIdx.x == 0)\n        sf[row] = label == -100 ? 0.0f : label >= 0 && label < %lld"
                   " ? m + logf(e) - %s(xr[label]) : EOP_NAN;\n",
                N, ctype(x->dtype), C, C, ld, C, ld, C, ld);
    s = eopb_phase(gen, "xent_mean", tag, EOP_LT_ONE, sz_const(1), 1024);
    strbuf_printf(s, "    __shared__ double shd[32];\n    __shared__ float sh[32];\n"
                   "    double t = 0.0;\n    float cnt = 0.0f;\n"
                   "    for (i64 i = threadIdx.x; i < %s; i += blockDim.x) {\n"
                   "        t += sf[i];\n        cnt += x1[i] != -100 ? 1.0f : 0.0f;\n    }\n"
                   "    t = block_sum_d(t, shd);\n    cnt = block_sum(cnt, sh);\n"
                   "    if (threadIdx.x == 0) y[0] = %s(cnt > 0.0f ? (float)(t / cnt) : 0.0f);\n",
                N, stf(OUTN->dtype));
    gen->scratch = eopb_sz_affine(0, 4, rows);
}

static void gen_mse(EopGen *gen)
{
    char N[128];
    numel_expr(INN(1), N, sizeof N);
    StrBuf *s = eopb_phase(gen, "mse", "s", EOP_LT_ONE, sz_const(1), 1024);
    strbuf_printf(s, "    __shared__ double shd[32];\n    const i64 n = %s;\n    double t = 0.0;\n"
                   "    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {\n"
                   "        double d = (double)%s(x0[i]) - (double)%s(x1[i]);\n        t += d * d;\n    }\n"
                   "    t = block_sum_d(t, shd);\n"
                   "    if (threadIdx.x == 0) y[0] = %s(n ? (float)(t / (double)n) : 0.0f);\n",
                N, ldf(INN(0)->dtype), ldf(INN(1)->dtype), stf(OUTN->dtype));
}

/* ---- GEMMs ------------------------------------------------------------ */

static bool gemm_dtype(DType d) { return d == DT_F32 || d == DT_F16 || d == DT_BF16; }

static HpcStatus gen_gemm(EopGen *gen, HpcError *err)
{
    const IrNode *n = OUTN, *a = INN(0), *b = INN(1);
    gen->kind = EOP_GEMM;
    if (!gemm_dtype(a->dtype) || a->dtype != b->dtype || !gemm_dtype(n->dtype) ||
        (n->dtype != a->dtype && n->dtype != DT_F32))
        return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: %s node %d (%s) multiplies %s by %s into %s; "
                        "cuBLASLt needs equal operand dtypes and an output of that dtype or f32 (run "
                        "the precision pass, which inserts the casts)", ir_op_name(n->op), gen->id,
                        n->name, ir_dtype_name(a->dtype), ir_dtype_name(b->dtype), ir_dtype_name(n->dtype));
    if (n->op != IR_OP_LINEAR || n->n_in < 3) return HPC_OK;
    if (INN(2)->dtype == n->dtype) {
        gen->bias_epilogue = true;
        return HPC_OK;
    }
    long long C = (long long)last_dim(n);
    StrBuf *s = eopb_elems_phase(gen, "bias_add", n);
    gen->kind = EOP_GEMM;
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s(%s(y[i]) + %s(x2[i %% %lldLL]));\n", stf(n->dtype),
                ldf(n->dtype), ldf(INN(2)->dtype), C);
    return HPC_OK;
}

/* Tables of at most this many floats (token types: 2 x 768) accumulate in
 * shared memory first: every token hits the same few rows, and global
 * atomics on them serialise (0.33 ms at B=256 L=128, docs/perf.md). */
#define EOP_EMB_SMEM_FLOATS 4096
#define EOP_EMB_SMEM_BLOCKS 1024

static void embedding_scatter_smem(EopGen *gen, const char *acc, long long V, long long D)
{
    const IrNode *dy = INN(0);
    char tag[64], num[128];
    eopb_shape_tag(dy, tag, sizeof tag);
    numel_expr(dy, num, sizeof num);
    StepSize count = sz_numel(dy);
    count.cap = (int64_t)EOP_EMB_SMEM_BLOCKS * 256;
    StrBuf *s = eopb_phase(gen, "embedding_scatter_smem", tag, EOP_LT_ELEMS, count, 256);
    strbuf_printf(s, "    __shared__ float tab[%lld];\n"
                   "    for (int k = threadIdx.x; k < %lld; k += blockDim.x) tab[k] = 0.0f;\n    __syncthreads();\n"
                   "    const i64 n = %s;\n    EOP_FOR(i, n) {\n        int id = x1[i / %lldLL];\n"
                   "        if (id >= 0 && id < %lld) atomicAdd(&tab[id * %lldLL + i %% %lldLL], %s(x0[i]));\n    }\n"
                   "    __syncthreads();\n"
                   "    for (int k = threadIdx.x; k < %lld; k += blockDim.x) atomicAdd(%s + k, tab[k]);\n",
                V * D, V * D, num, D, V, D, D, ldf(dy->dtype), V * D, acc);
}

static void gen_embedding_bwd(EopGen *gen)
{
    const IrNode *n = OUTN, *dy = INN(0);
    long long V = (long long)n->dims[0], D = (long long)n->dims[1];
    bool direct = n->dtype == DT_F32;
    const char *acc = direct ? "y" : "sf";
    StrBuf *s = eopb_elems_phase(gen, "zero", n);
    strbuf_printf(s, "    EOP_FOR(i, n) %s[i] = 0.0f;\n", acc);
    if (V * D <= EOP_EMB_SMEM_FLOATS) {
        embedding_scatter_smem(gen, acc, V, D);
    } else {
        s = eopb_elems_phase(gen, "embedding_scatter", dy);
        strbuf_printf(s, "    EOP_FOR(i, n) {\n        int id = x1[i / %lldLL];\n"
                       "        if (id >= 0 && id < %lld) atomicAdd(%s + (i64)id * %lldLL + i %% %lldLL, %s(x0[i]));\n    }\n",
                    D, V, acc, D, D, ldf(dy->dtype));
    }
    if (direct) return;
    s = eopb_elems_phase(gen, "embedding_grad_cast", n);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s(sf[i]);\n", stf(n->dtype));
    gen->scratch = sz_const((int64_t)V * D * 4);
}

/* The column sums of input 0 (dy) into y, which holds value n. */
static void bias_grad_phases(EopGen *gen, const IrNode *n)
{
    if (last_dim(n) > 0 && last_dim(n) % 8 == 0 && float_dtype(INN(0)->dtype)) {
        char load[128];
        snprintf(load, sizeof load, "            ld8_%s(x0 + r * %lldLL + c0, va);\n", ir_dtype_name(INN(0)->dtype),
                 (long long)last_dim(n));
        eopb_colsum8_phases(gen, n, "bias_grad", INN(0), load, "(double)va[j]");
        return;
    }
    char term[128];
    snprintf(term, sizeof term, "(double)%s(x0[r * %lldLL + col])", ldf(INN(0)->dtype),
             (long long)last_dim(n));
    eopb_colsum_phases(gen, n, "bias_grad", INN(0), term);
}

static void gen_bias_grad(EopGen *gen) { bias_grad_phases(gen, OUTN); }

/* LINEAR_DW_BGRAD: the dW GEMM (its BGRADB epilogue writes db), and as
 * the node's phases the column sums of dy into db, which the executor
 * launches (with a.y = db) only where cuBLASLt has no epilogue algorithm
 * (runtime/cuda/gemm_cublas.h, gemm_run_optional). */
static HpcStatus gen_linear_dw_bgrad(EopGen *gen, HpcError *err)
{
    HpcStatus st = gen_gemm(gen, err);
    if (st) return st;
    int db = ir_output(gen->g, gen->id, 1);
    if (db < 0 || gen->g->nodes[db].dtype != OUTN->dtype)
        return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: linear_dw_bgrad node %d (%s) needs its db output stored "
                        "as dW (%s); a bug in the fuse pass", gen->id, OUTN->name, ir_dtype_name(OUTN->dtype));
    bias_grad_phases(gen, &gen->g->nodes[db]);
    gen->kind = EOP_GEMM;
    return HPC_OK;
}

/* LINEAR_DX_ACC (compiler/fuse_accum.c): the dX GEMM with beta = 1 reading
 * acc as C (runtime/cuda/cuda_exec.c); no kernel of its own. */
static HpcStatus gen_linear_dx_acc(EopGen *gen, HpcError *err)
{
    HpcStatus st = gen_gemm(gen, err);
    if (st) return st;
    if (INN(2)->dtype != OUTN->dtype || OUTN->dtype != DT_F32)
        return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: linear_dx_acc node %d (%s) adds into %s and stores %s; "
                        "the GEMM accumulates into f32 only (a bug in the fuse pass)", gen->id, OUTN->name,
                        ir_dtype_name(INN(2)->dtype), ir_dtype_name(OUTN->dtype));
    return HPC_OK;
}

/* ---- backward ops ----------------------------------------------------- */

static void gen_softmax_bwd(EopGen *gen)
{
    StrBuf *s = warp_rows_phase(gen, "softmax_bwd");
    const char *ldy = ldf(INN(0)->dtype), *lp = ldf(INN(1)->dtype);
    strbuf_printf(s, "    const %s *dr = x0 + row * a.L;\n    const %s *pr = x1 + row * a.L;\n"
                   "    float dot = 0.0f;\n"
                   "    for (i64 k = lane; k < a.L; k += 32) dot += %s(dr[k]) * %s(pr[k]);\n"
                   "    dot = warp_sum(dot);\n"
                   "    for (i64 k = lane; k < a.L; k += 32)\n"
                   "        y[row * a.L + k] = %s(%s(pr[k]) * (%s(dr[k]) - dot));\n",
                ctype(INN(0)->dtype), ctype(INN(1)->dtype), ldy, lp, stf(OUTN->dtype), lp, ldy);
}

static void gen_slice_first_bwd(EopGen *gen)
{
    long long H = (long long)last_dim(OUTN);
    if (H % 8 == 0 && float_dtype(OUTN->dtype) && float_dtype(INN(0)->dtype)) {
        /* 8 elements a thread, 16-byte stores: the scalar form's 64-bit
         * divisions per element held it to 0.6-1.1 TB/s (H200, 2026-12-02) */
        char num[128], tag[64];
        numel_expr(OUTN, num, sizeof num);
        eopb_shape_tag(OUTN, tag, sizeof tag);
        StrBuf *s = eopb_phase(gen, "slice_first_bwd8", tag, EOP_LT_ELEMS, eopb_sz_ceil_div(sz_numel(OUTN), 8), 256);
        strbuf_printf(s, "    const i64 nv = (%s) / 8;\n    EOP_FOR(iv, nv) {\n"
                       "        const i64 r = iv / %lldLL, c = iv * 8 - r * %lldLL;\n        float v[8];\n"
                       "        if (r %% a.L == 0) ld8_%s(x0 + (r / a.L) * %lldLL + c, v);\n"
                       "        else for (int j = 0; j < 8; j++) v[j] = 0.0f;\n"
                       "        st8_%s(y + iv * 8, v);\n    }\n",
                    num, H / 8, H, ir_dtype_name(INN(0)->dtype), H, ir_dtype_name(OUTN->dtype));
        return;
    }
    StrBuf *s = eopb_elems_phase(gen, "slice_first_bwd", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) {\n        i64 c = i %% %lldLL, r = i / %lldLL;\n"
                   "        y[i] = %s(r %% a.L == 0 ? %s(x0[(r / a.L) * %lldLL + c]) : 0.0f);\n    }\n",
                H, H, stf(OUTN->dtype), ldf(INN(0)->dtype), H);
}

static void gen_slice_last_bwd(EopGen *gen)
{
    long long H = (long long)last_dim(OUTN);
    StrBuf *s = eopb_elems_phase(gen, "slice_last_bwd", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) {\n        const i64 c = i %% %lldLL, r = i / %lldLL, b = r / a.L;\n", H, H);
    slice_last_pos_text(s, "b");
    strbuf_printf(s, "        y[i] = %s(r %% a.L == tl ? %s(x0[b * %lldLL + c]) : 0.0f);\n    }\n",
                stf(OUTN->dtype), ldf(INN(0)->dtype), H);
}

static void gen_cross_entropy_bwd(EopGen *gen)
{
    const IrNode *x = INN(1), *lab = INN(2);
    long long C = (long long)last_dim(x);
    char N[128], tag[32];
    numel_expr(lab, N, sizeof N);
    snprintf(tag, sizeof tag, "c%lld", C);
    StrBuf *s = eopb_phase(gen, "xent_count", tag, EOP_LT_ONE, sz_const(1), 1024);
    strbuf_printf(s, "    __shared__ float sh[32];\n    float cnt = 0.0f;\n"
                   "    for (i64 i = threadIdx.x; i < %s; i += blockDim.x) cnt += x2[i] != -100 ? 1.0f : 0.0f;\n"
                   "    cnt = block_sum(cnt, sh);\n    if (threadIdx.x == 0) sf[0] = cnt;\n", N);
    const char *ld = ldf(x->dtype);
    s = eopb_phase(gen, "xent_bwd", tag, EOP_LT_ROWS, sz_numel(lab), C >= 256 ? 256 : 128);
    strbuf_printf(s, "    __shared__ float sh[32];\n    const i64 row = blockIdx.x;\n    if (row >= %s) return;\n"
                   "    const %s *xr = x1 + row * %lldLL;\n    %s *dx = y + row * %lldLL;\n"
                   "    const int label = x2[row];\n    const float cnt = sf[0];\n"
                   "    if (label == -100 || cnt == 0.0f) {\n"
                   "        for (int c = threadIdx.x; c < %lld; c += blockDim.x) dx[c] = %s(0.0f);\n"
                   "        return;\n    }\n    float m = EOP_NEG_INF;\n"
                   "    for (int c = threadIdx.x; c < %lld; c += blockDim.x) m = fmaxf(m, %s(xr[c]));\n"
                   "    m = block_max(m, sh);\n    float e = 0.0f;\n"
                   "    for (int c = threadIdx.x; c < %lld; c += blockDim.x) e += expf(%s(xr[c]) - m);\n"
                   "    const float lse = m + logf(block_sum(e, sh));\n"
                   "    const float g = %s(x0[0]) / cnt;\n"
                   "    for (int c = threadIdx.x; c < %lld; c += blockDim.x)\n"
                   "        dx[c] = %s(g * (expf(%s(xr[c]) - lse) - (c == label ? 1.0f : 0.0f)));\n",
                N, ctype(x->dtype), C, ctype(OUTN->dtype), C, C, stf(OUTN->dtype), C, ld, C, ld,
                ldf(INN(0)->dtype), C, stf(OUTN->dtype), ld);
    gen->scratch = sz_const(256);
}

static void gen_mse_bwd(EopGen *gen)
{
    StrBuf *s = eopb_elems_phase(gen, "mse_bwd", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s((float)((double)%s(x0[0]) * 2.0 * ((double)%s(x1[i]) - "
                   "(double)%s(x2[i])) / (double)n));\n",
                stf(OUTN->dtype), ldf(INN(0)->dtype), ldf(INN(1)->dtype), ldf(INN(2)->dtype));
}

/* ---- fused ops (compiler/fuse.h) ------------------------------------- */

/* Row max and sum of exp over the visible keys of scores `sc` (warp per row). */
static void softmax_stats_text(StrBuf *s, const char *ld, bool causal)
{
    strbuf_printf(s, "    float m = EOP_NEG_INF;\n"
                   "    for (i64 k = lane; k < a.L; k += 32) if (VIS(k)) m = fmaxf(m, %s(sc[k]));\n"
                   "    m = warp_max(m);\n    float sum = 0.0f;\n"
                   "    for (i64 k = lane; k < a.L; k += 32) if (VIS(k)) sum += expf(%s(sc[k]) - m);\n"
                   "    sum = warp_sum(sum);\n",
                ld, ld);
}

/* Rows of at most SM_KPL * 32 keys keep their keys in registers: the same
 * statistics as softmax_stats_text (same per-lane order, so the same bits),
 * with e[t] = expf(score - m) of key lane + 32 t computed once. */
#define SM_KPL 4
static void softmax_regs_text(StrBuf *s, const char *ld)
{
    strbuf_printf(s, "        float e[%d];\n        bool vis[%d];\n        float m = EOP_NEG_INF;\n"
                   "#pragma unroll\n        for (int t = 0; t < %d; t++) {\n"
                   "            const i64 k = lane + 32 * t;\n            vis[t] = k < a.L && VIS(k);\n"
                   "            e[t] = vis[t] ? %s(sc[k]) : 0.0f;\n            if (vis[t]) m = fmaxf(m, e[t]);\n        }\n"
                   "        m = warp_max(m);\n        float sum = 0.0f;\n"
                   "#pragma unroll\n        for (int t = 0; t < %d; t++)\n"
                   "            if (vis[t]) {\n                e[t] = expf(e[t] - m);\n                sum += e[t];\n            }\n"
                   "        sum = warp_sum(sum);\n",
                SM_KPL, SM_KPL, SM_KPL, ld, SM_KPL);
}

static void vis_define(StrBuf *s, bool causal)
{
    strbuf_printf(s, "#define VIS(k) (mask[k] != 0 && !(%d && (k) > q))\n", causal ? 1 : 0);
}

static void gen_softmax_dropout(EopGen *gen)
{
    const IrNode *n = OUTN;
    IrFusedAttr fa = fuse_attr_get(n);
    StrBuf *s = warp_rows_phase(gen, fa.causal ? "softmax_dropout_causal_fwd" : "softmax_dropout_fwd");
    const char *ld = ldf(INN(0)->dtype);
    char pr[96];
    eopb_round_expr((DType)fa.mid, "VIS(k) && sum != 0.0f ? expf(v - m) / sum : 0.0f", pr, sizeof pr);
    eopb_dropout_consts(gen, s, fa);
    strbuf_printf(s, "    const i64 b = row / (%lldLL * a.L), q = row %% a.L;\n"
                   "    const int *mask = x1 + b * a.L;\n    const %s *sc = x0 + row * a.L;\n",
                (long long)n->dims[1], ctype(INN(0)->dtype));
    vis_define(s, fa.causal);
    char rp[96];
    eopb_round_expr((DType)fa.mid, "vis[t] && sum != 0.0f ? e[t] / sum : 0.0f", rp, sizeof rp);
    strbuf_printf(s, "    if (a.L <= %d) {\n", 32 * SM_KPL);
    softmax_regs_text(s, ld);
    strbuf_printf(s, "#pragma unroll\n        for (int t = 0; t < %d; t++) {\n            const i64 k = lane + 32 * t;\n"
                   "            if (k >= a.L) break;\n            float pk = %s;\n"
                   "            if (on) pk = philox_keep(ctl->seed, (u64)(row * a.L + k), ctl->step, salt, p) ? pk * dscale : 0.0f;\n"
                   "            y[row * a.L + k] = %s(pk);\n        }\n        return;\n    }\n",
                SM_KPL, rp, stf(n->dtype));
    softmax_stats_text(s, ld, fa.causal);
    strbuf_printf(s, "    for (i64 k = lane; k < a.L; k += 32) {\n"
                   "        const float v = %s(sc[k]);\n        float pk = %s;\n"
                   "        if (on) pk = philox_keep(ctl->seed, (u64)(row * a.L + k), ctl->step, salt, p) ? pk * dscale : 0.0f;\n"
                   "        y[row * a.L + k] = %s(pk);\n    }\n#undef VIS\n",
                ld, pr, stf(n->dtype));
}

/* dscores from dy (x0) and the scores (x1): the probabilities and the
 * dropped gradient are recomputed per key, rounded where the unfused chain
 * stores them, in two passes (the dot product, then the result). */
static void gen_softmax_dropout_bwd(EopGen *gen)
{
    const IrNode *n = OUTN;
    IrFusedAttr fa = fuse_attr_get(n);
    StrBuf *s = warp_rows_phase(gen, fa.causal ? "softmax_dropout_causal_bwd" : "softmax_dropout_bwd");
    const char *ls = ldf(INN(1)->dtype), *ld = ldf(INN(0)->dtype);
    char pr[96], gr[64];
    eopb_round_expr((DType)fa.mid, "VIS(k) && sum != 0.0f ? expf(v - m) / sum : 0.0f", pr, sizeof pr);
    eopb_round_expr((DType)fa.mid2, "g", gr, sizeof gr);
    eopb_dropout_consts(gen, s, fa);
    strbuf_printf(s, "    const i64 b = row / (%lldLL * a.L), q = row %% a.L;\n"
                   "    const int *mask = x2 + b * a.L;\n    const %s *sc = x1 + row * a.L;\n"
                   "    const %s *dr = x0 + row * a.L;\n",
                (long long)n->dims[1], ctype(INN(1)->dtype), ctype(INN(0)->dtype));
    vis_define(s, fa.causal);
    char rp[96], rg[64];
    eopb_round_expr((DType)fa.mid, "vis[t] && sum != 0.0f ? e[t] / sum : 0.0f", rp, sizeof rp);
    eopb_round_expr((DType)fa.mid2, "g", rg, sizeof rg);
    strbuf_printf(s, "    if (a.L <= %d) {\n", 32 * SM_KPL);
    softmax_regs_text(s, ls);
    strbuf_printf(s, "        float pk[%d], gk[%d], dot = 0.0f;\n"
                   "#pragma unroll\n        for (int t = 0; t < %d; t++) {\n            const i64 k = lane + 32 * t;\n"
                   "            pk[t] = gk[t] = 0.0f;\n            if (k >= a.L) continue;\n"
                   "            pk[t] = %s;\n            float g = %s(dr[k]);\n"
                   "            if (on) g = philox_keep(ctl->seed, (u64)(row * a.L + k), ctl->step, salt, p) ? g * dscale : 0.0f;\n"
                   "            gk[t] = %s;\n            dot += gk[t] * pk[t];\n        }\n"
                   "        dot = warp_sum(dot);\n"
                   "#pragma unroll\n        for (int t = 0; t < %d; t++) {\n            const i64 k = lane + 32 * t;\n"
                   "            if (k < a.L) y[row * a.L + k] = %s(pk[t] * (gk[t] - dot));\n        }\n"
                   "        return;\n    }\n",
                SM_KPL, SM_KPL, SM_KPL, rp, ld, rg, SM_KPL, stf(n->dtype));
    softmax_stats_text(s, ls, fa.causal);
    strbuf_printf(s, "#define PG(k) const float v = %s(sc[k]); const float pk = %s; float g = %s(dr[k]); \\\n"
                   "    if (on) g = philox_keep(ctl->seed, (u64)(row * a.L + k), ctl->step, salt, p) ? g * dscale : 0.0f; \\\n"
                   "    const float gk = %s;\n"
                   "    float dot = 0.0f;\n"
                   "    for (i64 k = lane; k < a.L; k += 32) { PG(k) dot += gk * pk; }\n"
                   "    dot = warp_sum(dot);\n"
                   "    for (i64 k = lane; k < a.L; k += 32) { PG(k) y[row * a.L + k] = %s(pk * (gk - dot)); }\n"
                   "#undef PG\n#undef VIS\n",
                ls, pr, ld, gr, stf(n->dtype));
}

static void gen_dropout_add(EopGen *gen)
{
    IrFusedAttr fa = fuse_attr_get(OUTN);
    char vr[48];
    eopb_round_expr((DType)fa.mid, "v", vr, sizeof vr);
    if (eopb_vec_ok(gen)) {
        StrBuf pre = {0};
        char keep[160], expr[320];
        eopb_dropout_consts(gen, &pre, fa);
        snprintf(keep, sizeof keep, "dropout_elem(philox_mask8(ctl->seed, (u64)(i - j) >> 3, ctl->step, salt, p), i, on, v0[j], dscale)");
        eopb_round_expr((DType)fa.mid, keep, expr, sizeof expr);
        size_t len = strlen(expr);
        snprintf(expr + len, sizeof expr - len, " + v1[j]");
        vec_elems(gen, "dropout_add", pre.p, expr);
        strbuf_free(&pre);
        return;
    }
    StrBuf *s = eopb_elems_phase(gen, "dropout_add", OUTN);
    eopb_dropout_consts(gen, s, fa);
    strbuf_printf(s, "    EOP_FOR(i, n) {\n        float v = %s(x0[i]);\n"
                   "        if (on) v = philox_keep(ctl->seed, (u64)i, ctl->step, salt, p) ? v * dscale : 0.0f;\n"
                   "        y[i] = %s(%s + %s(x1[i]));\n    }\n",
                ldf(INN(0)->dtype), stf(OUTN->dtype), vr, ldf(INN(1)->dtype));
}

/* ---- dispatch --------------------------------------------------------- */

static HpcStatus check_dtypes(const EopGen *gen, HpcError *err)
{
    const IrNode *n = OUTN;
    if (n->n_in > EOP_MAX_INPUTS)
        return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: node %d (%s, %s) has %d inputs; a CUDA kernel takes at "
                        "most %d (EopArgs.x); run it on the cpu backend", gen->id, n->name, ir_op_name(n->op),
                        n->n_in, EOP_MAX_INPUTS);
    bool bad = n->dtype == DT_F64;
    for (int k = 0; k < n->n_in; k++) bad |= INN(k)->dtype == DT_F64;
    if (!bad) return HPC_OK;
    return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: node %d (%s, %s) reads or writes f64, which the GPU "
                    "path does not support; use the f32/f16/bf16 graph", gen->id, n->name,
                    ir_op_name(n->op));
}

/* The generators named by the `cuda` column of program/ops.def, in one
 * signature; those that cannot fail are wrapped. */
typedef HpcStatus (*EopGenFn)(EopGen *gen, HpcError *err);

static void gen_param(EopGen *gen) { (void)gen; } /* storage bound by the executor */

static void gen_input(EopGen *gen)
{
    if (OUTN->attr.input.kind == IR_IN_LOSS_SCALE) gen_loss_scale(gen);
    else gen->kind = EOP_UPLOAD;
}

static void gen_split_heads(EopGen *gen) { gen_heads(gen, true); }
static void gen_merge_heads(EopGen *gen) { gen_heads(gen, false); }

#define EOP_PLAIN(name) \
    static HpcStatus cuda_##name(EopGen *gen, HpcError *err) { (void)err; gen_##name(gen); return HPC_OK; }
EOP_PLAIN(param) EOP_PLAIN(input) EOP_PLAIN(positions) EOP_PLAIN(embedding) EOP_PLAIN(add)
EOP_PLAIN(softmax) EOP_PLAIN(dropout) EOP_PLAIN(split_heads) EOP_PLAIN(merge_heads) EOP_PLAIN(slice_first)
EOP_PLAIN(slice_last) EOP_PLAIN(shift_labels) EOP_PLAIN(cross_entropy) EOP_PLAIN(mse) EOP_PLAIN(cast)
EOP_PLAIN(embedding_bwd) EOP_PLAIN(bias_grad) EOP_PLAIN(softmax_bwd) EOP_PLAIN(slice_first_bwd)
EOP_PLAIN(slice_last_bwd) EOP_PLAIN(cross_entropy_bwd) EOP_PLAIN(mse_bwd) EOP_PLAIN(softmax_dropout)
EOP_PLAIN(softmax_dropout_bwd) EOP_PLAIN(dropout_add) EOP_PLAIN(stack) EOP_PLAIN(unstack)
EOP_PLAIN(ln_dw_fix) EOP_PLAIN(ln_dw_fix_db)
#undef EOP_PLAIN
/* The same for the generators of emit_ops_layernorm.c and emit_ops_act.c. */
#define EOP_PLAIN_EOPB(name) \
    static HpcStatus cuda_##name(EopGen *gen, HpcError *err) { (void)err; eopb_##name(gen); return HPC_OK; }
EOP_PLAIN_EOPB(layernorm) EOP_PLAIN_EOPB(layernorm_dx) EOP_PLAIN_EOPB(layernorm_dgamma)
EOP_PLAIN_EOPB(act) EOP_PLAIN_EOPB(act_bwd) EOP_PLAIN_EOPB(act_bwd_bgrad)
#undef EOP_PLAIN_EOPB
static HpcStatus cuda_gemm(EopGen *gen, HpcError *err) { return gen_gemm(gen, err); }
static HpcStatus cuda_linear_dw_bgrad(EopGen *gen, HpcError *err) { return gen_linear_dw_bgrad(gen, err); }
static HpcStatus cuda_linear_dx_acc(EopGen *gen, HpcError *err) { return gen_linear_dx_acc(gen, err); }
/* Fused attention: compiler/emit_ops_attention.c. */
static HpcStatus cuda_attention(EopGen *gen, HpcError *err) { return eopa_gen_attention(gen, err); }
static HpcStatus cuda_attention_bwd(EopGen *gen, HpcError *err) { return eopa_gen_attention_bwd(gen, err); }
/* Fused LayerNorm sites: compiler/emit_ops_ln_site.c; the fused embedding
 * layer: compiler/emit_ops_embed_ln.c. */
static HpcStatus cuda_ln_residual(EopGen *gen, HpcError *err) { return eopb_ln_residual(gen, err); }
static HpcStatus cuda_ln_residual_bwd(EopGen *gen, HpcError *err) { return eopb_ln_residual_bwd(gen, err); }
static HpcStatus cuda_embed_ln(EopGen *gen, HpcError *err) { return eopb_embed_ln(gen, err); }
static HpcStatus cuda_embed_ln_bwd(EopGen *gen, HpcError *err) { return eopb_embed_ln_bwd(gen, err); }

/* An op the cpu backend runs but no kernel implements yet. */
static HpcStatus cuda_unsupported(EopGen *gen, HpcError *err)
{
    return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: node %d (%s): op %s has no CUDA kernel yet; run the "
                    "graph on the cpu backend", gen->id, OUTN->name, ir_op_name(OUTN->op));
}

/* ---- packed batches (docs/packing.md; cpu references in
 * runtime/cpu/cpu_exec_packed.inc).  The spans are in order and apart, so
 * the sequence holding flat slot s is the last b with start_b <= s (binary
 * search), when s < start_b + len_b. */
static void span_find_text(StrBuf *s, const char *spans, const char *slot)
{
    strbuf_printf(s, "        i64 lo = 0, hi = (i64)a.B - 1, f = -1;\n"
                     "        while (lo <= hi) {\n            const i64 m = (lo + hi) / 2;\n"
                     "            if (%s[2 * m] <= %s) { f = m; lo = m + 1; } else hi = m - 1;\n        }\n"
                     "        const bool in = f >= 0 && %s < (i64)%s[2 * f] + %s[2 * f + 1];\n",
                  spans, slot, slot, spans, spans);
}

static HpcStatus cuda_span_positions(EopGen *gen, HpcError *err)
{
    (void)err;
    StrBuf *s = eopb_elems_phase(gen, "span_positions", OUTN);
    strbuf_add(s, "    EOP_FOR(i, n) {\n");
    span_find_text(s, "x0", "i");
    strbuf_printf(s, "        y[i] = (in ? (int)(i - x0[2 * f]) : 0) + %lld;\n    }\n", (long long)OUTN->attr.pos.offset);
    return HPC_OK;
}

static HpcStatus cuda_span_token(EopGen *gen, HpcError *err)
{
    (void)err;
    long long H = (long long)last_dim(OUTN);
    StrBuf *s = eopb_elems_phase(gen, OUTN->attr.span.last ? "span_last" : "span_first", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) {\n        const i64 b = i / %lldLL, c = i %% %lldLL, len = x1[2 * b + 1];\n"
                     "        const i64 t = x1[2 * b] + %s;\n"
                     "        y[i] = %s(len < 1 ? 0.0f : %s(x0[t * %lldLL + c]));\n    }\n",
                  H, H, OUTN->attr.span.last ? "len - 1" : "0", stf(OUTN->dtype), ldf(INN(0)->dtype), H);
    return HPC_OK;
}

static HpcStatus cuda_span_token_bwd(EopGen *gen, HpcError *err)
{
    (void)err;
    long long H = (long long)last_dim(OUTN);
    StrBuf *s = eopb_elems_phase(gen, OUTN->attr.span.last ? "span_last_bwd" : "span_first_bwd", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) {\n        const i64 slot = i / %lldLL, c = i %% %lldLL;\n", H, H);
    span_find_text(s, "x1", "slot");
    strbuf_printf(s, "        const bool tok = in && slot == (i64)x1[2 * f] + %s;\n"
                     "        y[i] = %s(tok ? %s(x0[f * %lldLL + c]) : 0.0f);\n    }\n",
                  OUTN->attr.span.last ? "x1[2 * f + 1] - 1" : "0", stf(OUTN->dtype), ldf(INN(0)->dtype), H);
    return HPC_OK;
}

/* A projection is written by the multi-output node it reads. */
static HpcStatus cuda_output(EopGen *gen, HpcError *err)
{
    (void)err;
    gen->kind = EOP_NONE;
    return HPC_OK;
}

static const EopGenFn op_cuda[] = {
#define IR_OP(E, name, nmin, nmax, nout, prec, grad, cuda) cuda_##cuda,
#include "program/ops.def"
#undef IR_OP
};
_Static_assert(sizeof op_cuda / sizeof op_cuda[0] == IR_OP_COUNT, "ops.def and the CUDA table disagree");

HpcStatus eopb_node(EopGen *gen, HpcError *err)
{
    HpcStatus st = check_dtypes(gen, err);
    if (st) return st;
    HPC_ASSERT(OUTN->op >= 0 && OUTN->op < IR_OP_COUNT);
    gen->kind = EOP_NONE;
    return op_cuda[OUTN->op](gen, err);
}

void eopb_free(EopGen *gen)
{
    for (int i = 0; i < gen->n_phases; i++) strbuf_free(&gen->ph[i].body);
    gen->n_phases = 0;
}

/* compiler/emit_ops_attention.c — see emit_ops_attention.h. */
#include "emit_ops_attention.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emit_attention.h"
#include "kernel_sources.h"

#define AT_TILE 64   /* query (fwd, dq) or key (dkv) rows per block of the mma kernels */
#define AT_ONE_PASS_MAX_L 128   /* attn_mma3_bwd: one block per (b, head) owns every key */
#define AT_ONE_PASS_MAX_D 64    /* ... and its tiles fit 48 KiB of shared memory */

typedef struct {
    DType dtype;
    int64_t hidden, heads, head_dim;
    bool causal;
    bool packed;          /* q, k, v one (B, L, 3H) value (compiler/fuse_qkv.c) */
    long long ld;         /* their row stride: hidden, or 3 hidden when packed */
    bool varlen;          /* a packed batch's spans instead of the mask (docs/packing.md) */
    bool first_query;     /* query 0 alone: ctx, dctx (B, H) (program/ir.h) */
    int64_t span_max;     /* varlen: the longest span a batch may hold (IrInputAttr), 0: no bound */
} AttnCfg;

/* The kernel arguments of q, k, v (input `first` onwards) and of the
 * backward's dq, dk, dv: three values with row stride H, or, packed, the
 * column blocks of one value with row stride 3H (the kernels take both
 * strides; only the pointers differ). */
typedef struct { char q[48], k[48], v[48], dq[40], dk[40], dv[40]; } AttnPtrs;

static AttnPtrs attn_ptrs(const AttnCfg *c, int first)
{
    AttnPtrs p;
    long long H = (long long)c->hidden;
    if (c->packed) {
        snprintf(p.q, sizeof p.q, "(const T *)a.x[%d]", first);
        snprintf(p.k, sizeof p.k, "(const T *)a.x[%d] + %lld", first, H);
        snprintf(p.v, sizeof p.v, "(const T *)a.x[%d] + %lld", first, 2 * H);
        snprintf(p.dq, sizeof p.dq, "(T *)a.y");
        snprintf(p.dk, sizeof p.dk, "(T *)a.y + %lld", H);
        snprintf(p.dv, sizeof p.dv, "(T *)a.y + %lld", 2 * H);
    } else {
        snprintf(p.q, sizeof p.q, "(const T *)a.x[%d]", first);
        snprintf(p.k, sizeof p.k, "(const T *)a.x[%d]", first + 1);
        snprintf(p.v, sizeof p.v, "(const T *)a.x[%d]", first + 2);
        snprintf(p.dq, sizeof p.dq, "(T *)a.y");
        snprintf(p.dk, sizeof p.dk, "(T *)a.yk[0]");
        snprintf(p.dv, sizeof p.dv, "(T *)a.yk[1]");
    }
    return p;
}

/* HPC_ATTN_KERNELS: which tensor-core family the step calls (compiler/
 * kernels/attention_mma*.cu): "v1" (attn_mma_*), "v2" (attn_mma2_*: ldmatrix,
 * cp.async double buffering), "v3": v2's forward, and the one-pass
 * backward attn_mma3_bwd for rows up to AT_ONE_PASS_MAX_L (v2's dQ and dK/dV
 * kernels for longer rows; v2's backward only above head size
 * AT_ONE_PASS_MAX_D), "v4": v3 with attn_mma4_bwd as the one-pass backward
 * up to head size 64 (whole_ds), or "v5", the default: v4 with the
 * warpgroup-MMA backward where it applies (wg5_applies).  *fam is the forward's
 * family; *one_pass says whether
 * the backward has the one-pass phase.  Read when the step module is
 * generated, so the choice is part of the module's source and of its cache
 * key. */
static HpcStatus kernel_family(const char **fam, bool *one_pass, HpcError *err)
{
    const char *e = getenv("HPC_ATTN_KERNELS");
    *one_pass = false;
    if (!e || !*e || strcmp(e, "v3") == 0 || strcmp(e, "v4") == 0 || strcmp(e, "v5") == 0) {
        *fam = "mma2";
        *one_pass = true;
    } else if (strcmp(e, "v2") == 0) *fam = "mma2";
    else if (strcmp(e, "v1") == 0) *fam = "mma";
    else
        return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: HPC_ATTN_KERNELS=%s is not a kernel variant; set it to "
                        "v1, v2, v3, v4 or v5 (or leave it unset for v5)", e);
    return HPC_OK;
}

/* v4 (and v5, the default, below): v3 with the one-pass backward (padded and packed rows)
 * holding dS of every query in dynamic shared memory (attn_mma4_bwd,
 * compiler/kernels/attention_mma4.cu; H200, BERT-base 256 x 128: 256 -> 235
 * us a layer, bench/results/2026-12-05-session24.txt).  Its phase runs
 * only up to AT_ONE_PASS_MAX_L; delta for longer rows has a phase of its
 * own, which asks for no shared memory. */
static bool whole_ds(void)
{
    const char *e = getenv("HPC_ATTN_KERNELS");
    return !e || !*e || strcmp(e, "v4") == 0 || strcmp(e, "v5") == 0;
}

/* v5, the default (HPC_ATTN_KERNELS unset or v5): the backward of padded
 * rows of 65 to AT_ONE_PASS_MAX_L keys on Hopper's warpgroup MMA
 * (attn_wg5_bwd_run, compiler/kernels/attention_wgmma.cu) from a module
 * built for sm_90a, where its kernel is built: f16, head size 64, and the
 * forward's keep bits saved or no dropout (it draws none).  Elsewhere v5
 * is v4.  H100, 2026-12-06: -1.5 % at BERT-base 256 x 128, -2.1 % at
 * 32 x 128 (bench/results/2026-12-06-session30.txt). */
static bool wg5_chosen(void)
{
    const char *e = getenv("HPC_ATTN_KERNELS");
    return !e || !*e || strcmp(e, "v5") == 0;
}

static bool wg5_applies(const EopGen *gen, const AttnCfg *c)
{
    const IrNode *n = &gen->g->nodes[gen->id];
    return wg5_chosen() && c->dtype == DT_F16 && c->head_dim == 64 && !c->varlen && !c->first_query &&
           (n->n_in == 8 || n->attr.attn.p == 0.0f);
}

/* The wgmma forward (attn_wg5_fwd_run) takes padded f16 rows at head size
 * 64 under v5; it draws the dropout bits itself, so it needs no saved ones. */
static bool wg5_fwd_applies(const AttnCfg *c)
{
    return wg5_chosen() && c->dtype == DT_F16 && c->head_dim == 64 && !c->varlen && !c->first_query;
}

/* Blocks of the persistent attn_wg5_bwd: one an SM of an H100 or H200 (its
 * shared memory allows no second); a GPU with fewer SMs runs them in turn. */
#define AT_WG5_BLOCKS 132
/* Rows of at most this many keys take v4's backward under v5 (above). */
#define AT_WG5_MIN_L 64

static bool is_attention(IrOpKind op) { return op == IR_OP_ATTENTION || op == IR_OP_ATTENTION_BWD; }

/* The configuration of attention node id, checked against what the kernels
 * cover. */
static HpcStatus node_cfg(const IrGraph *g, int id, AttnCfg *c, HpcError *err)
{
    const IrNode *n = &g->nodes[id];
    const IrNode *q = &g->nodes[n->in[n->op == IR_OP_ATTENTION ? 0 : 1]];
    c->dtype = q->dtype;
    c->packed = n->attr.attn.packed;
    c->hidden = q->dims[2] / (c->packed ? 3 : 1);
    c->ld = (long long)q->dims[2];
    c->heads = n->attr.attn.heads;
    c->head_dim = c->hidden / c->heads;
    c->causal = n->attr.attn.causal;
    c->varlen = n->attr.attn.varlen;
    c->first_query = n->attr.attn.first_query;
    const IrNode *keys = &g->nodes[n->in[n->op == IR_OP_ATTENTION ? 3 : 4]];
    c->span_max = c->varlen && keys->op == IR_OP_INPUT ? keys->attr.input.span_max : 0;
    int n_float = n->op == IR_OP_ATTENTION ? 3 : 6;   /* ATTENTION_BWD: all but mask and lse */
    bool same = n->dtype == c->dtype;
    for (int k = 0; k < n->n_in && k < n_float + 1; k++) {
        const IrNode *x = &g->nodes[n->in[k]];
        if (x->dtype != DT_I32 && !(n->op == IR_OP_ATTENTION_BWD && k == 6)) same &= x->dtype == c->dtype;
    }
    if ((c->dtype != DT_F16 && c->dtype != DT_BF16) || c->head_dim % 16 != 0 || c->head_dim > 128 || !same)
        return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: node %d (%s): the step's fused attention kernels need "
                        "f16 or bf16 values of one dtype and a head size that is a multiple of 16 up to 128 "
                        "(here %s, head size %lld); compile with HPC_ATTENTION=unfused", id, n->name,
                        ir_dtype_name(c->dtype), (long long)c->head_dim);
    /* the packed backward writes dq, dk, dv as the column blocks of its one
     * output (compiler/ops.c gives it no dk, dv OUTPUT nodes) */
    bool packed_bwd = c->packed && n->op == IR_OP_ATTENTION_BWD;
    for (int k = 1; k < ir_op_info(n->op)->n_outputs; k++) {
        if (packed_bwd && ir_output(g, id, k) >= 0)
            return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: node %d (%s): a packed attention backward has "
                            "output %s, which no kernel writes; rebuild the graph (compiler/ops.c makes "
                            "none)", id, n->name, ir_output_name(n->op, k));
        bool optional = n->op == IR_OP_ATTENTION && k == 2;   /* the keep bits (compiler/fuse_attn_keep.c) */
        if (!packed_bwd && !optional && ir_output(g, id, k) < 0)
            return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: node %d (%s): output %s was removed, but the "
                            "kernel writes it; compile with HPC_ATTENTION=unfused", id, n->name,
                            ir_output_name(n->op, k));
    }
    return HPC_OK;
}

HpcStatus eopa_module_part(const IrGraph *g, StrBuf *src, HpcError *err)
{
    AttnCfg c = {0}, d;
    int first = -1;
    for (int id = 0; id < g->n; id++) {
        if (!is_attention(g->nodes[id].op)) continue;
        HpcStatus st = node_cfg(g, id, first < 0 ? &c : &d, err);
        if (st) return st;
        if (first < 0) {
            first = id;
            continue;
        }
        if (c.dtype != d.dtype || c.hidden != d.hidden || c.heads != d.heads || c.causal != d.causal)
            return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: attention nodes %d and %d differ in dtype, size "
                            "or masking; the step module holds one fused attention configuration; compile "
                            "with HPC_ATTENTION=unfused", first, id);
    }
    if (first < 0) return HPC_OK;
    const char *parts[1 + KEMIT_ATTN_PARTS];   /* common.cu, then the attention parts */
    for (int i = 0; i <= KEMIT_ATTN_PARTS; i++) {
        const char *name = i == 0 ? "common.cu" : kemit_attn_parts[i - 1];
        if (!(parts[i] = kernel_source_find(name)))
            return hpc_fail(err, HPC_ERR_INTERNAL, "emit_ops: the template compiler/kernels/%s is not in the "
                            "build; rebuild with `make` from a full checkout", name);
    }
    if (!src) return HPC_OK;
    strbuf_printf(src, "\n// ---- fused attention (%s, hidden %lld, %lld heads of %lld%s): compiler/kernels/"
                  "common.cu and attention*.cu, bodies only ----\n",
                  ir_dtype_name(c.dtype), (long long)c.hidden, (long long)c.heads, (long long)c.head_dim,
                  c.causal ? ", causal" : "");
    strbuf_printf(src, "#define HPC_DTYPE %d\n#define HPC_HIDDEN %lld\n#define HPC_HEADS %lld\n"
                  "#define HPC_HEAD_DIM %lld\n#define HPC_CAUSAL %d\n#define HPC_ATTN4_SMEM_BYTES %d\n"
                  "#define HPC_ATTN5_SMEM_BYTES %d\n",
                  c.dtype == DT_F16 ? 1 : 2, (long long)c.hidden, (long long)c.heads, (long long)c.head_dim,
                  c.causal ? 1 : 0, kemit_attn4_smem_bytes(c.head_dim), kemit_attn5_smem_bytes());
    /* v5's backward has sm_90a code (wgmma): the executor compiles for that target */
    if (wg5_chosen() && c.dtype == DT_F16 && c.head_dim == 64) strbuf_add(src, STEP_SOURCE_SM90A_MARK);
    /* common.cu's row-layout helpers want these; no attention kernel uses them */
    strbuf_add(src, "#define HPC_ROW_VEC 8\n#define HPC_ROW_THREADS 128\n#define HPC_ROW_NPT 1\n"
                    "#define HPC_ROW_RPB 1\n#define HPC_ATTN_NO_KERNELS 1\n"
                    "namespace hpc_attn {\n");
    strbuf_add(src, parts[0]);
    strbuf_add(src, "\n");
    for (int i = 1; i <= KEMIT_ATTN_PARTS; i++) strbuf_add(src, parts[i]);
    strbuf_add(src, "\n} // namespace hpc_attn\n"
                    "#undef HPC_ATTN_NO_KERNELS\n#undef AT_RUN\n#undef ROW_VEC\n#undef ROW_THREADS\n#undef ROW_NPT\n#undef ROW_RPB\n"
                    "#undef ST_VEC\n// ---- end of fused attention ----\n");
    return HPC_OK;
}

/* A phase calling hpc_attn::FN_run; returns its body to append the call to. */
static StrBuf *attn_phase(EopGen *gen, const char *base, const AttnCfg *c, EopLaunchType lt, StepSize count,
                          int threads)
{
    HPC_ASSERT(gen->n_phases < EOP_MAX_PHASES);
    EopGenPhase *ph = &gen->ph[gen->n_phases++];
    snprintf(ph->base, sizeof ph->base, "%s_%s_h%lldx%lld%s", base, ir_dtype_name(c->dtype),
             (long long)c->heads, (long long)c->head_dim, c->causal ? "c" : "");
    ph->lt = lt;
    ph->count = count;
    ph->threads = threads;
    gen->kind = EOP_KERNELS;
    StrBuf *s = &ph->body;
    const IrAttnAttr *a = &gen->g->nodes[gen->id].attr.attn;
    strbuf_printf(s, "    typedef hpc_attn::st_t T;\n    const EopCtl *ctl = (const EopCtl *)a.ctl;\n"
                     "    const float p = ctl->training ? (float)%.9g : 0.0f;\n    const u32 salt = (u32)a.salt;\n"
                     "    (void)p; (void)salt;\n",
                  (double)a->p);
    eopb_use_salt(gen, (uint32_t)a->salt);   /* a launch argument: the layers share one kernel */
    return s;
}

/* ceil(L / AT_TILE) blocks along L. */
static StepSize tiles_of_l(void) { return (StepSize){.c0 = AT_TILE - 1, .c1 = 1, .pB = 0, .pL = 1, .div = AT_TILE}; }

/* ---- varlen (a packed batch, docs/packing.md) ------------------------------
 * Sequence b is the padded kernels' contract at B = 1, L = len_b from
 * offset base pointers (runtime/cpu/cpu_exec_packed.inc states it): each
 * phase's block z is the sequence, its span read from the spans input;
 * tiles at or past len_b return; lse and delta hold the sequence's
 * (heads, len_b) block at start_b x heads; the dropout key is
 * seed ^ span_seed(start_b).  The grid has tiles for the longest span a
 * batch can hold (vl_tiles).  A last phase writes zeros to the tail rows (the
 * slots after the last span) of the outputs: they feed the next GEMMs. */

/* Declares st, nl (sequence blockIdx.z's span) and vseed; returns for an empty span. */
static void vl_span_text(StrBuf *s, int spans_input)
{
    strbuf_printf(s, "    const int *sp = (const int *)a.x[%d];\n"
                     "    const i64 st = sp[2 * blockIdx.z], nl = sp[2 * blockIdx.z + 1];\n"
                     "    const u64 vseed = ctl->seed ^ ((u64)(st + 1) * 0x9E3779B97F4A7C15ull);\n"
                     "    (void)vseed;\n    if (nl < 1) return;\n", spans_input);
}

/* ptr + st * stride, as a kernel argument. */
static const char *vl_at(char *buf, size_t cap, const char *ptr, long long stride)
{
    snprintf(buf, cap, "(%s) + st * %lldLL", ptr, stride);
    return buf;
}

/* Zeros in rows [end, B L) of out (row width w), end the last span's end:
 * grid-stride over the launch, or (one_block) by block (0, 0, 0) alone. */
static void vl_tail_text(StrBuf *s, int spans_input, const char *out, long long w, bool one_block)
{
    strbuf_printf(s, "    if (%s) {\n        const int *sp = (const int *)a.x[%d];\n"
                     "        const i64 end = (i64)sp[2 * (a.B - 1)] + sp[2 * (a.B - 1) + 1], n = (i64)a.B * a.L * %lldLL;\n"
                     "        T *o = %s;\n"
                     "        for (i64 i = end * %lldLL + %s; i < n; i += %s)\n"
                     "            o[i] = hpc_attn::st_from(0.0f);\n    }\n",
                  one_block ? "blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0" : "true", spans_input, w,
                  out, w, one_block ? "threadIdx.x" : "(i64)blockIdx.x * blockDim.x + threadIdx.x",
                  one_block ? "blockDim.x" : "(i64)gridDim.x * blockDim.x");
}

/* Tiles of AT_TILE rows for the longest sequence a batch can hold: B L
 * rows bound every span, and the program's span_max (checked by the
 * executors, runtime/data/batch.h) does better where it is smaller: CoLA's
 * batch of 32 packed in 384 slots launched 6 tiles a (sequence, head) where
 * its max_seq_len of 128 needs 2, and most spans 1. */
static StepSize vl_tiles(const AttnCfg *c)
{
    return (StepSize){.c0 = AT_TILE - 1, .c1 = 1, .pB = 1, .pL = 1, .div = AT_TILE,
                      .cap = c->span_max > 0 ? (c->span_max + AT_TILE - 1) / AT_TILE : 0};
}

/* Query start_b alone (first_query): attn_first_fwd_run at B = 1, L = len_b,
 * one block a (sequence, head), ctx and lse rows b of the (B, H) and
 * (B, heads, 1) outputs; an empty span writes zeros and +inf there. */
static HpcStatus gen_attention_first_varlen(EopGen *gen, const AttnCfg *c)
{
    AttnPtrs ap = attn_ptrs(c, 0);
    char q[96], k[96], v[96];
    long long H = (long long)c->hidden, NH = (long long)c->heads, D = (long long)c->head_dim;
    StrBuf *s = attn_phase(gen, "attn_first_fwd_vl", c, EOP_LT_HEAD_TILES, (StepSize){.c0 = 1}, (int)c->heads);
    strbuf_printf(s, "    T *y = (T *)a.y + (i64)blockIdx.z * %lldLL;\n"
                     "    float *lse = (float *)a.yk[0] + (i64)blockIdx.z * %lldLL;\n"
                     "    if (((const int *)a.x[3])[2 * blockIdx.z + 1] < 1) {   // an empty span\n"
                     "        for (int d = threadIdx.x; d < %lld; d += blockDim.x)\n"
                     "            y[blockIdx.y * %lldLL + d] = hpc_attn::st_from(0.0f);\n"
                     "        if (threadIdx.x == 0) lse[blockIdx.y] = __int_as_float(0x7f800000);\n"
                     "        return;\n    }\n",
                  H, NH, D, D);
    vl_span_text(s, 3);
    strbuf_printf(s, "    hpc_attn::attn_first_fwd_run(0, blockIdx.y, 0, y, lse,\n"
                     "        %s, %s, %s, %lld, (const int *)0,\n"
                     "        1, (int)nl, p, vseed, ctl->step, salt);\n",
                  vl_at(q, sizeof q, ap.q, c->ld), vl_at(k, sizeof k, ap.k, c->ld), vl_at(v, sizeof v, ap.v, c->ld),
                  c->ld);
    return HPC_OK;
}

static HpcStatus gen_attention_varlen(EopGen *gen, const AttnCfg *c, const char *fam)
{
    if (c->first_query) return gen_attention_first_varlen(gen, c);
    AttnPtrs ap = attn_ptrs(c, 0);
    char q[96], k[96], v[96], y[64], l[64];
    long long H = (long long)c->hidden, NH = (long long)c->heads;
    StrBuf *s = attn_phase(gen, fam[3] ? "attn2_fwd_vl" : "attn_fwd_vl", c, EOP_LT_HEAD_TILES, vl_tiles(c), (int)c->heads);
    vl_span_text(s, 3);
    strbuf_printf(s, "    if ((i64)blockIdx.x * %d >= nl) return;\n"
                     "    hpc_attn::attn_%s_fwd_run(blockIdx.x, blockIdx.y, 0, %s, %s,\n"
                     "        %s, %s, %s, %lld, (const int *)0,\n"
                     "        1, (int)nl, p, vseed, ctl->step, salt%s);\n",
                  AT_TILE, fam, vl_at(y, sizeof y, "(T *)a.y", H), vl_at(l, sizeof l, "(float *)a.yk[0]", NH),
                  vl_at(q, sizeof q, ap.q, c->ld), vl_at(k, sizeof k, ap.k, c->ld), vl_at(v, sizeof v, ap.v, c->ld),
                  c->ld, fam[3] ? ", nullptr" : "");
    s = attn_phase(gen, "attn_tail_vl", c, EOP_LT_ELEMS, (StepSize){.c0 = 0, .c1 = H, .pB = 1, .pL = 1, .div = 1}, 256);
    vl_tail_text(s, 3, "(T *)a.y", H, false);
    return HPC_OK;
}

/* The backward's q, k, v, dq, dk, dv arguments at sequence blockIdx.z's
 * base (vl_at of attn_ptrs). */
typedef struct { char q[96], k[96], v[96], dq[80], dk[80], dv[80]; } VlBwdPtrs;

static VlBwdPtrs vl_bwd_ptrs(const AttnCfg *c)
{
    AttnPtrs ap = attn_ptrs(c, 1);
    VlBwdPtrs o;
    vl_at(o.q, sizeof o.q, ap.q, c->ld);
    vl_at(o.k, sizeof o.k, ap.k, c->ld);
    vl_at(o.v, sizeof o.v, ap.v, c->ld);
    vl_at(o.dq, sizeof o.dq, ap.dq, c->ld);
    vl_at(o.dk, sizeof o.dk, ap.dk, c->ld);
    vl_at(o.dv, sizeof o.dv, ap.dv, c->ld);
    return o;
}

/* Block (0, 0, 0) zeroes the tail rows of dq, dk, dv (packed: of the one
 * (B, L, 3H) gradient): no span writes them. */
static void vl_bwd_tails(StrBuf *s, const AttnCfg *c)
{
    long long H = (long long)c->hidden;
    vl_tail_text(s, 4, "(T *)a.y", c->packed ? 3 * H : H, true);
    if (!c->packed) {
        vl_tail_text(s, 4, "(T *)a.yk[0]", H, true);
        vl_tail_text(s, 4, "(T *)a.yk[1]", H, true);
    }
}

/* The backward of gen_attention_first_varlen: attn_first_bwd_run at B = 1,
 * L = len_b (dK, dV of the span's keys, dQ at its first slot and zeros in
 * its others), dctx, ctx and lse rows b; block (0, 0, 0) first zeroes the
 * tails (rows no span writes). */
static HpcStatus gen_attention_bwd_first_varlen(EopGen *gen, const AttnCfg *c)
{
    long long H = (long long)c->hidden, NH = (long long)c->heads;
    VlBwdPtrs vp = vl_bwd_ptrs(c);
    StrBuf *s = attn_phase(gen, "attn_first_bwd_vl", c, EOP_LT_HEAD_TILES, (StepSize){.c0 = 1}, (int)c->heads);
    vl_bwd_tails(s, c);
    vl_span_text(s, 4);
    strbuf_printf(s, "    hpc_attn::attn_first_bwd_run(0, blockIdx.y, 0, %s, %s, %s, %lld,\n"
                     "        (const T *)a.x[0] + (i64)blockIdx.z * %lldLL, (const T *)a.x[5] + (i64)blockIdx.z * %lldLL,\n"
                     "        %s, %s, %s, %lld,\n"
                     "        (const float *)a.x[6] + (i64)blockIdx.z * %lldLL, (const int *)0,\n"
                     "        1, (int)nl, p, vseed, ctl->step, salt);\n",
                  vp.dq, vp.dk, vp.dv, c->ld, H, H, vp.q, vp.k, vp.v, c->ld, NH);
    return HPC_OK;
}

/* The backward: one block a (sequence, head) makes delta (or, one-pass and
 * len_b <= AT_ONE_PASS_MAX_L, the whole backward), and block (0, 0, 0)
 * first zeroes the tails (rows no span writes); with v4, delta of the longer
 * spans is a phase of its own (attn_bwd_delta_vl: no dynamic shared memory);
 * then the dQ and dK/dV tiles of the longer sequences.  A program whose
 * span_max is at most AT_ONE_PASS_MAX_L has only the first phase. */
static HpcStatus gen_attention_bwd_varlen(EopGen *gen, const AttnCfg *c, const char *fam, bool one_pass)
{
    if (c->first_query) return gen_attention_bwd_first_varlen(gen, c);
    long long H = (long long)c->hidden, NH = (long long)c->heads, ld = c->ld;
    VlBwdPtrs vp = vl_bwd_ptrs(c);
    const char *q = vp.q, *k = vp.k, *v = vp.v, *dq = vp.dq, *dk = vp.dk, *dv = vp.dv;
    char g[64], y[64], l[80], dl[80];
    vl_at(g, sizeof g, "(const T *)a.x[0]", H);
    vl_at(y, sizeof y, "(const T *)a.x[5]", H);
    vl_at(l, sizeof l, "(const float *)a.x[6]", NH);
    vl_at(dl, sizeof dl, "(float *)a.scratch", NH);
    bool v4 = one_pass && whole_ds() && c->head_dim <= 64;
    StrBuf *s = attn_phase(gen, v4 ? "attn4_bwd_vl" : one_pass ? "attn3_bwd_vl" : "attn_bwd_dot_vl", c,
                           EOP_LT_HEAD_BLOCKS, (StepSize){.c0 = 1}, (int)c->heads);
    if (v4) gen->ph[gen->n_phases - 1].shared_bytes = kemit_attn4_smem_bytes(c->head_dim);
    vl_bwd_tails(s, c);
    vl_span_text(s, 4);
    /* one-pass and no span can pass AT_ONE_PASS_MAX_L (the program's bound):
     * this phase is the whole backward, with no delta, dQ or dK/dV phases
     * after it (they would launch only to return); a longer span here means
     * the executor's check was bypassed: trap rather than leave stale rows */
    bool short_only = one_pass && c->span_max > 0 && c->span_max <= AT_ONE_PASS_MAX_L;
    if (one_pass)
        strbuf_printf(s, "    if (nl <= %d) {\n"
                         "        hpc_attn::attn_mma%d_bwd_run(blockIdx.x, blockIdx.y, 0, %s, %s, %s, %lld, %s, %s,\n"
                         "            %s, %s, %s, %lld, %s, (const int *)0, 1, (int)nl, p, vseed, ctl->step, salt,\n"
                         "            nullptr);\n"
                         "        return;\n    }\n",
                      AT_ONE_PASS_MAX_L, v4 ? 4 : 3, dq, dk, dv, ld, g, y, q, k, v, ld, l);
    if (short_only) {
        strbuf_add(s, "    __trap();   // a span above the program's span_max\n");
        return HPC_OK;
    }
    if (v4) {   /* longer spans' delta in a phase without v4's shared memory */
        strbuf_add(s, "    return;\n");
        s = attn_phase(gen, "attn_bwd_delta_vl", c, EOP_LT_HEAD_BLOCKS, (StepSize){.c0 = 1}, (int)c->heads);
        vl_span_text(s, 4);
        strbuf_printf(s, "    if (nl <= %d) return;\n", AT_ONE_PASS_MAX_L);
    }
    strbuf_printf(s, "    hpc_attn::attn_head_bwd_dot_run(blockIdx.x, blockIdx.y, 0, %s, %s, %s, 1, (int)nl, 256);\n",
                  dl, g, y);
    char skip[80] = "";
    if (one_pass) snprintf(skip, sizeof skip, "    if (nl <= %d) return;\n", AT_ONE_PASS_MAX_L);
    bool v2 = fam[3] != 0;
    s = attn_phase(gen, v2 ? "attn2_bwd_dq_vl" : "attn_bwd_dq_vl", c, EOP_LT_HEAD_TILES, vl_tiles(c), (int)c->heads);
    vl_span_text(s, 4);
    strbuf_printf(s, "%s    if ((i64)blockIdx.x * %d >= nl) return;\n"
                     "    hpc_attn::attn_%s_bwd_dq_run(blockIdx.x, blockIdx.y, 0, %s, %lld, %s, %s, %s, %s, %lld,\n"
                     "        %s, %s, (const int *)0, 1, (int)nl, p, vseed, ctl->step, salt);\n",
                  skip, AT_TILE, fam, dq, ld, g, q, k, v, ld, l, dl);
    s = attn_phase(gen, v2 ? "attn2_bwd_dkv_vl" : "attn_bwd_dkv_vl", c, EOP_LT_HEAD_TILES, vl_tiles(c), (int)c->heads);
    vl_span_text(s, 4);
    strbuf_printf(s, "%s    if ((i64)blockIdx.x * %d >= nl) return;\n"
                     "    hpc_attn::attn_%s_bwd_dkv_run(blockIdx.x, blockIdx.y, 0, %s, %s, %lld, %s, %s, %s, %s, %lld,\n"
                     "        %s, %s, (const int *)0, 1, (int)nl, p, vseed, ctl->step, salt);\n",
                  skip, AT_TILE, fam, dk, dv, ld, g, q, k, v, ld, l, dl);
    gen->scratch = (StepSize){.c0 = 0, .c1 = 4 * c->heads, .pB = 1, .pL = 1, .div = 1};
    return HPC_OK;
}

/* The forward's phase of ceil(L / AT_TILE) query tiles of 128 threads
 * (attn_mma2_fwd or v1's attn_mma_fwd); keep: the keep bits' argument. */
static EopGenPhase *fwd_tiles_phase(EopGen *gen, const AttnCfg *c, const char *fam, const AttnPtrs *ap,
                                    const char *keep)
{
    StrBuf *s = attn_phase(gen, fam[3] ? "attn2_fwd" : "attn_fwd", c, EOP_LT_HEAD_TILES, tiles_of_l(), (int)c->heads);
    EopGenPhase *ph = &gen->ph[gen->n_phases - 1];
    /* v2 up to head size 64: four blocks an SM (128 registers) instead of
     * the three that its 138 registers allow, since the forward is bound by
     * issue, not memory (H200, BERT-base 256 x 128: 184 -> 171 us a layer);
     * larger heads keep their registers */
    if (fam[3] && c->head_dim <= 64) ph->min_blocks = 4;
    strbuf_printf(s, "    hpc_attn::attn_%s_fwd_run(blockIdx.x, blockIdx.y, blockIdx.z, (T *)a.y, (float *)a.yk[0],\n"
                     "        %s, %s, %s, %lld, (const int *)a.x[3],\n"
                     "        (int)a.B, (int)a.L, p, ctl->seed, ctl->step, salt%s);\n",
                  fam, ap->q, ap->k, ap->v, c->ld, keep);
    return ph;
}

HpcStatus eopa_gen_attention(EopGen *gen, HpcError *err)
{
    AttnCfg c;
    HpcStatus st = node_cfg(gen->g, gen->id, &c, err);
    if (st) return st;
    const char *fam;
    bool one_pass;
    if ((st = kernel_family(&fam, &one_pass, err))) return st;
    if (c.varlen) return gen_attention_varlen(gen, &c, fam);
    AttnPtrs ap = attn_ptrs(&c, 0);
    StrBuf *s;
    if (c.first_query) {   /* one block a (b, head): query 0 alone */
        s = attn_phase(gen, "attn_first_fwd", &c, EOP_LT_HEAD_TILES, (StepSize){.c0 = 1}, (int)c.heads);
        strbuf_printf(s, "    hpc_attn::attn_first_fwd_run(0, blockIdx.y, blockIdx.z, (T *)a.y, (float *)a.yk[0],\n"
                         "        %s, %s, %s, %lld, (const int *)a.x[3],\n"
                         "        (int)a.B, (int)a.L, p, ctl->seed, ctl->step, salt);\n",
                      ap.q, ap.k, ap.v, c.ld);
        return HPC_OK;
    }
    /* v2: the keep bits (output 2) where the graph saves them, else nullptr */
    const char *keep = !fam[3] ? "" : ir_output(gen->g, gen->id, 2) >= 0 ? ", (unsigned char *)a.yk[1]" : ", nullptr";
    if (!wg5_fwd_applies(&c)) {
        fwd_tiles_phase(gen, &c, fam, &ap, keep);
        return HPC_OK;
    }
    /* v5: v2's kernel up to AT_WG5_MIN_L keys (any module), above
     * AT_ONE_PASS_MAX_L (sm_90a modules) and at every length from a module
     * not built for sm_90a; the wgmma forward between (sm_90a).  v2's
     * three records have one body, so one kernel. */
    fwd_tiles_phase(gen, &c, fam, &ap, keep)->at_most_l = AT_WG5_MIN_L;
    EopGenPhase *longer = fwd_tiles_phase(gen, &c, fam, &ap, keep);
    longer->above_l = AT_ONE_PASS_MAX_L;
    longer->target = STEP_TARGET_SM90A;
    EopGenPhase *other = fwd_tiles_phase(gen, &c, fam, &ap, keep);
    other->above_l = AT_WG5_MIN_L;
    other->target = STEP_TARGET_NOT_SM90A;
    s = attn_phase(gen, "attn5_fwd", &c, EOP_LT_HEAD_TILES, tiles_of_l(), (int)c.heads);
    EopGenPhase *ph = &gen->ph[gen->n_phases - 1];
    ph->min_blocks = 4;   /* 128 registers: four warpgroups an SM, one loading while others multiply */
    ph->above_l = AT_WG5_MIN_L;
    ph->at_most_l = AT_ONE_PASS_MAX_L;
    ph->target = STEP_TARGET_SM90A;
    strbuf_printf(s, "    if (a.L <= %d || a.L > %d) return;   // launched only there (above_l, at_most_l)\n"
                     "    hpc_attn::attn_wg5_fwd_run(blockIdx.x, blockIdx.y, blockIdx.z, (T *)a.y, (float *)a.yk[0],\n"
                     "        %s, %s, %s, %lld, (const int *)a.x[3],\n"
                     "        (int)a.B, (int)a.L, p, ctl->seed, ctl->step, salt%s);\n",
                  AT_WG5_MIN_L, AT_ONE_PASS_MAX_L, ap.q, ap.k, ap.v, c.ld, keep);
    return HPC_OK;
}

/* delta of rows longer than AT_ONE_PASS_MAX_L (v2's dQ and dK/dV phases
 * read it), a phase launched only there, with no dynamic shared memory:
 * the one-pass kernels of v4 and v5 sum delta themselves. */
static void delta_above_one_pass(EopGen *gen, const AttnCfg *c)
{
    StrBuf *s = attn_phase(gen, "attn_bwd_delta", c, EOP_LT_HEAD_BLOCKS, (StepSize){.c0 = 1}, (int)c->heads);
    gen->ph[gen->n_phases - 1].above_l = AT_ONE_PASS_MAX_L;
    strbuf_printf(s, "    if (a.L <= %d) return;\n"
                     "    hpc_attn::attn_head_bwd_dot_run(blockIdx.x, blockIdx.y, blockIdx.z, (float *)a.scratch,\n"
                     "        (const T *)a.x[0], (const T *)a.x[5], (int)a.B, (int)a.L, 256);\n",
                  AT_ONE_PASS_MAX_L);
}

/* (dctx, q, k, v, mask, ctx, lse) = a.x[0..6]; delta (B, heads, L) f32 in scratch.
 * With the one-pass kernel: phases attn3_bwd (rows up to AT_ONE_PASS_MAX_L:
 * the whole backward; longer rows: delta only) or, v4, attn4_bwd (launched
 * only up to that length) and attn_bwd_delta (only above it); then v2's dq
 * and dkv, launched only above it (L is the run's); otherwise dot, dq,
 * dkv. */
HpcStatus eopa_gen_attention_bwd(EopGen *gen, HpcError *err)
{
    AttnCfg c;
    HpcStatus st = node_cfg(gen->g, gen->id, &c, err);
    if (st) return st;
    const char *fam;
    bool one_pass;
    if ((st = kernel_family(&fam, &one_pass, err))) return st;
    one_pass &= c.head_dim <= AT_ONE_PASS_MAX_D;
    bool v2 = fam[3] != 0;
    if (!v2 && c.head_dim > 64)
        return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: node %d (%s): head size %lld: the v1 attention dQ kernel "
                        "needs more than 48 KiB of shared memory above head size 64; set HPC_ATTN_KERNELS=v2 or "
                        "compile with HPC_ATTENTION=unfused", gen->id, gen->g->nodes[gen->id].name,
                        (long long)c.head_dim);
    if (c.varlen) return gen_attention_bwd_varlen(gen, &c, fam, one_pass);
    AttnPtrs ap = attn_ptrs(&c, 1);
    StrBuf *s;
    if (c.first_query) {
        s = attn_phase(gen, "attn_first_bwd", &c, EOP_LT_HEAD_TILES, (StepSize){.c0 = 1}, (int)c.heads);
        strbuf_printf(s, "    hpc_attn::attn_first_bwd_run(0, blockIdx.y, blockIdx.z, %s, %s, %s, %lld,\n"
                         "        (const T *)a.x[0], (const T *)a.x[5], %s, %s, %s, %lld,\n"
                         "        (const float *)a.x[6], (const int *)a.x[4],\n"
                         "        (int)a.B, (int)a.L, p, ctl->seed, ctl->step, salt);\n",
                      ap.dq, ap.dk, ap.dv, c.ld, ap.q, ap.k, ap.v, c.ld);
        return HPC_OK;
    }
    char skip[64] = "";
    if (one_pass && wg5_applies(gen, &c)) {
        /* v4's one-pass phase up to AT_WG5_MIN_L (a block an SM of 128-row
         * wgmma tiles is mostly idle there: +1.1 % at BERT-base 32 x 32,
         * H100) and, from a module not built for sm_90a, up to
         * AT_ONE_PASS_MAX_L (the same kernel: one function, two records);
         * from an sm_90a module the wgmma backward (delta inside) above
         * AT_WG5_MIN_L, a persistent grid; delta of longer rows for v2's
         * dQ and dK/dV phases */
        bool keep = gen->g->nodes[gen->id].n_in == 8;
        for (int up = 0; up < 2; up++) {
            s = attn_phase(gen, "attn4_bwd", &c, EOP_LT_HEAD_BLOCKS, (StepSize){.c0 = 1}, (int)c.heads);
            EopGenPhase *ph = &gen->ph[gen->n_phases - 1];
            ph->shared_bytes = kemit_attn4_smem_bytes(c.head_dim);
            ph->at_most_l = up ? AT_ONE_PASS_MAX_L : AT_WG5_MIN_L;
            ph->above_l = up ? AT_WG5_MIN_L : 0;
            ph->target = up ? STEP_TARGET_NOT_SM90A : STEP_TARGET_ANY;
            if (keep)
                strbuf_add(s, "    const unsigned char *keep = (const unsigned char *)a.x[7];\n"
                              "    __builtin_assume(keep != nullptr);\n");
            strbuf_printf(s, "    if (a.L > %d) return;   // launched only up to that length (at_most_l)\n"
                             "    hpc_attn::attn_mma4_bwd_run(blockIdx.x, blockIdx.y, blockIdx.z, %s, %s,\n"
                             "        %s, %lld, (const T *)a.x[0], (const T *)a.x[5], %s,\n"
                             "        %s, %s, %lld, (const float *)a.x[6], (const int *)a.x[4],\n"
                             "        (int)a.B, (int)a.L, p, ctl->seed, ctl->step, salt, %s);\n",
                          AT_ONE_PASS_MAX_L, ap.dq, ap.dk, ap.dv, c.ld, ap.q, ap.k, ap.v, c.ld,
                          keep ? "keep" : "nullptr");
        }
        s = attn_phase(gen, "attn5_bwd", &c, EOP_LT_ROWS,
                       (StepSize){.c0 = 0, .c1 = c.heads, .pB = 1, .pL = 0, .div = 1, .cap = AT_WG5_BLOCKS}, 256);
        gen->ph[gen->n_phases - 1].shared_bytes = kemit_attn5_smem_bytes();
        gen->ph[gen->n_phases - 1].above_l = AT_WG5_MIN_L;
        gen->ph[gen->n_phases - 1].at_most_l = AT_ONE_PASS_MAX_L;
        gen->ph[gen->n_phases - 1].target = STEP_TARGET_SM90A;
        if (keep)
            strbuf_add(s, "    const unsigned char *keep = (const unsigned char *)a.x[7];\n"
                          "    __builtin_assume(keep != nullptr);\n");
        strbuf_printf(s, "    if (a.L <= %d || a.L > %d) return;   // launched only there (above_l, at_most_l)\n"
                         "    hpc_attn::attn_wg5_bwd_run(blockIdx.x, %s, %s, %s, %lld, (const T *)a.x[0],\n"
                         "        (const T *)a.x[5], %s, %s, %s, %lld, (const float *)a.x[6], (const float *)a.scratch,\n"
                         "        (const int *)a.x[4], (int)a.B, (int)a.L, p, ctl->seed, ctl->step, salt,\n"
                         "        %s);\n",
                      AT_WG5_MIN_L, AT_ONE_PASS_MAX_L, ap.dq, ap.dk, ap.dv, c.ld, ap.q, ap.k, ap.v, c.ld,
                      keep ? "keep" : "nullptr");
        delta_above_one_pass(gen, &c);
        snprintf(skip, sizeof skip, "    if (a.L <= %d) return;\n", AT_ONE_PASS_MAX_L);
    } else if (one_pass) {
        /* one block of 256 per (b, head): the whole backward up to
         * AT_ONE_PASS_MAX_L (delta inside), delta alone above it */
        bool v4 = whole_ds() && c.head_dim <= 64;
        s = attn_phase(gen, v4 ? "attn4_bwd" : "attn3_bwd", &c, EOP_LT_HEAD_BLOCKS, (StepSize){.c0 = 1},
                       (int)c.heads);
        if (v4) {   /* only up to AT_ONE_PASS_MAX_L: delta above it is the next phase */
            gen->ph[gen->n_phases - 1].shared_bytes = kemit_attn4_smem_bytes(c.head_dim);
            gen->ph[gen->n_phases - 1].at_most_l = AT_ONE_PASS_MAX_L;
        }
        /* the forward's keep bits (input 7) where the graph saves them: never
         * null then, which lets the compiler drop the Philox draws */
        bool keep = gen->g->nodes[gen->id].n_in == 8;
        if (keep)
            strbuf_add(s, "    const unsigned char *keep = (const unsigned char *)a.x[7];\n"
                          "    __builtin_assume(keep != nullptr);\n");
        strbuf_printf(s, "    if (a.L > %d) {\n", AT_ONE_PASS_MAX_L);
        if (v4) strbuf_add(s, "        return;   // launched only up to that length (at_most_l)\n    }\n");
        else
            strbuf_add(s, "        hpc_attn::attn_head_bwd_dot_run(blockIdx.x, blockIdx.y, blockIdx.z, (float *)a.scratch,\n"
                          "            (const T *)a.x[0], (const T *)a.x[5], (int)a.B, (int)a.L, 256);\n"
                          "        return;\n    }\n");
        strbuf_printf(s, "    hpc_attn::attn_mma%d_bwd_run(blockIdx.x, blockIdx.y, blockIdx.z, %s, %s,\n"
                         "        %s, %lld, (const T *)a.x[0], (const T *)a.x[5], %s,\n"
                         "        %s, %s, %lld, (const float *)a.x[6], (const int *)a.x[4],\n"
                         "        (int)a.B, (int)a.L, p, ctl->seed, ctl->step, salt, %s);\n",
                      v4 ? 4 : 3, ap.dq, ap.dk, ap.dv, c.ld, ap.q, ap.k, ap.v, c.ld, keep ? "keep" : "nullptr");
        if (v4) delta_above_one_pass(gen, &c);
        /* v2's dQ and dK/dV phases below return at once where it ran */
        snprintf(skip, sizeof skip, "    if (a.L <= %d) return;\n", AT_ONE_PASS_MAX_L);
    } else {
        StepSize rows = {.c0 = 0, .c1 = c.heads, .pB = 1, .pL = 1, .div = 1};
        s = attn_phase(gen, "attn_bwd_dot", &c, EOP_LT_WARP_ROWS, rows, 128);
        strbuf_add(s, "    hpc_attn::attn_simt_bwd_dot_run(blockIdx.x, 0, 0, (float *)a.scratch, (const T *)a.x[0],\n"
                      "        (const T *)a.x[5], (int)a.B, (int)a.L);\n");
    }
    /* one-pass: dQ and dK/dV only for rows longer than it takes; the
     * executor launches them only there (above_l), and they check too */
    int64_t above_l = one_pass ? AT_ONE_PASS_MAX_L : 0;
    s = attn_phase(gen, v2 ? "attn2_bwd_dq" : "attn_bwd_dq", &c, EOP_LT_HEAD_TILES, tiles_of_l(), (int)c.heads);
    gen->ph[gen->n_phases - 1].above_l = above_l;
    strbuf_add(s, skip);
    strbuf_printf(s, "    hpc_attn::attn_%s_bwd_dq_run(blockIdx.x, blockIdx.y, blockIdx.z, %s, %lld,\n"
                     "        (const T *)a.x[0], %s, %s, %s, %lld,\n"
                     "        (const float *)a.x[6], (const float *)a.scratch, (const int *)a.x[4],\n"
                     "        (int)a.B, (int)a.L, p, ctl->seed, ctl->step, salt);\n", fam, ap.dq, c.ld, ap.q, ap.k,
                  ap.v, c.ld);
    s = attn_phase(gen, v2 ? "attn2_bwd_dkv" : "attn_bwd_dkv", &c, EOP_LT_HEAD_TILES, tiles_of_l(), (int)c.heads);
    gen->ph[gen->n_phases - 1].above_l = above_l;
    strbuf_add(s, skip);
    strbuf_printf(s, "    hpc_attn::attn_%s_bwd_dkv_run(blockIdx.x, blockIdx.y, blockIdx.z, %s, %s,\n"
                     "        %lld, (const T *)a.x[0], %s, %s, %s, %lld,\n"
                     "        (const float *)a.x[6], (const float *)a.scratch, (const int *)a.x[4],\n"
                     "        (int)a.B, (int)a.L, p, ctl->seed, ctl->step, salt);\n", fam, ap.dk, ap.dv, c.ld, ap.q,
                  ap.k, ap.v, c.ld);
    gen->scratch = (StepSize){.c0 = 0, .c1 = 4 * c.heads, .pB = 1, .pL = 1, .div = 1};
    return HPC_OK;
}

/* compiler/emit_ops_attention.c — see emit_ops_attention.h. */
#include "emit_ops_attention.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
 * kernels/attention.cu): "v1" (attn_mma_*), "v2" (attn_mma2_*: ldmatrix,
 * cp.async double buffering) or "v3", the default: v2's forward, and the
 * one-pass backward attn_mma3_bwd for rows up to AT_ONE_PASS_MAX_L (v2's
 * dQ and dK/dV kernels for longer rows; v2's backward only above head size
 * AT_ONE_PASS_MAX_D).  *fam is the forward's family; *one_pass says whether
 * the backward has the one-pass phase.  Read when the step module is
 * generated, so the choice is part of the module's source and of its cache
 * key. */
static HpcStatus kernel_family(const char **fam, bool *one_pass, HpcError *err)
{
    const char *e = getenv("HPC_ATTN_KERNELS");
    *one_pass = false;
    if (!e || !*e || strcmp(e, "v3") == 0) {
        *fam = "mma2";
        *one_pass = true;
    } else if (strcmp(e, "v2") == 0) *fam = "mma2";
    else if (strcmp(e, "v1") == 0) *fam = "mma";
    else
        return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: HPC_ATTN_KERNELS=%s is not a kernel variant; set it to "
                        "v1, v2 or v3 (or leave it unset for v3)", e);
    return HPC_OK;
}

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
    if (n->attr.attn.varlen)
        return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: node %d (%s): varlen attention (a packed program, "
                        "docs/packing.md) has no CUDA kernel yet; run packed programs on the cpu backend or "
                        "train without pack", id, n->name);
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
        if (!packed_bwd && ir_output(g, id, k) < 0)
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
    const char *common = kernel_source_find("common.cu"), *attn = kernel_source_find("attention.cu");
    if (!common || !attn)
        return hpc_fail(err, HPC_ERR_INTERNAL, "emit_ops: the templates compiler/kernels/common.cu and "
                        "attention.cu are not in the build; rebuild with `make` from a full checkout");
    if (!src) return HPC_OK;
    strbuf_printf(src, "\n// ---- fused attention (%s, hidden %lld, %lld heads of %lld%s): compiler/kernels/"
                  "common.cu and attention.cu, bodies only ----\n",
                  ir_dtype_name(c.dtype), (long long)c.hidden, (long long)c.heads, (long long)c.head_dim,
                  c.causal ? ", causal" : "");
    strbuf_printf(src, "#define HPC_DTYPE %d\n#define HPC_HIDDEN %lld\n#define HPC_HEADS %lld\n"
                  "#define HPC_HEAD_DIM %lld\n#define HPC_CAUSAL %d\n",
                  c.dtype == DT_F16 ? 1 : 2, (long long)c.hidden, (long long)c.heads, (long long)c.head_dim,
                  c.causal ? 1 : 0);
    /* common.cu's row-layout helpers want these; no attention kernel uses them */
    strbuf_add(src, "#define HPC_ROW_VEC 8\n#define HPC_ROW_THREADS 128\n#define HPC_ROW_NPT 1\n"
                    "#define HPC_ROW_RPB 1\n#define HPC_ATTN_NO_KERNELS 1\n"
                    "#define AT_RUN __device__ __noinline__   // one compiled body for every layer's node\n"
                    "namespace hpc_attn {\n");
    strbuf_add(src, common);
    strbuf_add(src, "\n");
    strbuf_add(src, attn);
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

HpcStatus eopa_gen_attention(EopGen *gen, HpcError *err)
{
    AttnCfg c;
    HpcStatus st = node_cfg(gen->g, gen->id, &c, err);
    if (st) return st;
    const char *fam;
    bool one_pass;
    if ((st = kernel_family(&fam, &one_pass, err))) return st;
    StrBuf *s = attn_phase(gen, fam[3] ? "attn2_fwd" : "attn_fwd", &c, EOP_LT_HEAD_TILES, tiles_of_l(), (int)c.heads);
    AttnPtrs ap = attn_ptrs(&c, 0);
    strbuf_printf(s, "    hpc_attn::attn_%s_fwd_run(blockIdx.x, blockIdx.y, blockIdx.z, (T *)a.y, (float *)a.yk[0],\n"
                     "        %s, %s, %s, %lld, (const int *)a.x[3],\n"
                     "        (int)a.B, (int)a.L, p, ctl->seed, ctl->step, salt);\n",
                  fam, ap.q, ap.k, ap.v, c.ld);
    return HPC_OK;
}

/* (dctx, q, k, v, mask, ctx, lse) = a.x[0..6]; delta (B, heads, L) f32 in scratch.
 * With the one-pass kernel: phases attn3_bwd (rows up to AT_ONE_PASS_MAX_L:
 * the whole backward; longer rows: delta only), then v2's dq and dkv, which
 * return at once where attn3_bwd did the work (L is the run's, known on the
 * device only); otherwise dot, dq, dkv. */
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
    AttnPtrs ap = attn_ptrs(&c, 1);
    StrBuf *s;
    char skip[64] = "";
    if (one_pass) {
        /* one block of 256 per (b, head): the whole backward up to
         * AT_ONE_PASS_MAX_L (delta inside), delta alone above it */
        s = attn_phase(gen, "attn3_bwd", &c, EOP_LT_HEAD_BLOCKS, (StepSize){.c0 = 1}, (int)c.heads);
        strbuf_printf(s, "    if (a.L > %d) {\n"
                         "        hpc_attn::attn_head_bwd_dot_run(blockIdx.x, blockIdx.y, blockIdx.z, (float *)a.scratch,\n"
                         "            (const T *)a.x[0], (const T *)a.x[5], (int)a.B, (int)a.L, 256);\n"
                         "        return;\n    }\n"
                         "    hpc_attn::attn_mma3_bwd_run(blockIdx.x, blockIdx.y, blockIdx.z, %s, %s,\n"
                         "        %s, %lld, (const T *)a.x[0], (const T *)a.x[5], %s,\n"
                         "        %s, %s, %lld, (const float *)a.x[6], (const int *)a.x[4],\n"
                         "        (int)a.B, (int)a.L, p, ctl->seed, ctl->step, salt);\n",
                      AT_ONE_PASS_MAX_L, ap.dq, ap.dk, ap.dv, c.ld, ap.q, ap.k, ap.v, c.ld);
        /* v2's dQ and dK/dV phases below return at once where it ran */
        snprintf(skip, sizeof skip, "    if (a.L <= %d) return;\n", AT_ONE_PASS_MAX_L);
    } else {
        StepSize rows = {.c0 = 0, .c1 = c.heads, .pB = 1, .pL = 1, .div = 1};
        s = attn_phase(gen, "attn_bwd_dot", &c, EOP_LT_WARP_ROWS, rows, 128);
        strbuf_add(s, "    hpc_attn::attn_simt_bwd_dot_run(blockIdx.x, 0, 0, (float *)a.scratch, (const T *)a.x[0],\n"
                      "        (const T *)a.x[5], (int)a.B, (int)a.L);\n");
    }
    s = attn_phase(gen, v2 ? "attn2_bwd_dq" : "attn_bwd_dq", &c, EOP_LT_HEAD_TILES, tiles_of_l(), (int)c.heads);
    strbuf_add(s, skip);
    strbuf_printf(s, "    hpc_attn::attn_%s_bwd_dq_run(blockIdx.x, blockIdx.y, blockIdx.z, %s, %lld,\n"
                     "        (const T *)a.x[0], %s, %s, %s, %lld,\n"
                     "        (const float *)a.x[6], (const float *)a.scratch, (const int *)a.x[4],\n"
                     "        (int)a.B, (int)a.L, p, ctl->seed, ctl->step, salt);\n", fam, ap.dq, c.ld, ap.q, ap.k,
                  ap.v, c.ld);
    s = attn_phase(gen, v2 ? "attn2_bwd_dkv" : "attn_bwd_dkv", &c, EOP_LT_HEAD_TILES, tiles_of_l(), (int)c.heads);
    strbuf_add(s, skip);
    strbuf_printf(s, "    hpc_attn::attn_%s_bwd_dkv_run(blockIdx.x, blockIdx.y, blockIdx.z, %s, %s,\n"
                     "        %lld, (const T *)a.x[0], %s, %s, %s, %lld,\n"
                     "        (const float *)a.x[6], (const float *)a.scratch, (const int *)a.x[4],\n"
                     "        (int)a.B, (int)a.L, p, ctl->seed, ctl->step, salt);\n", fam, ap.dk, ap.dv, c.ld, ap.q,
                  ap.k, ap.v, c.ld);
    gen->scratch = (StepSize){.c0 = 0, .c1 = 4 * c.heads, .pB = 1, .pL = 1, .div = 1};
    return HPC_OK;
}

/* tests/test_precision.c — the precision planner on small BERT and GPT-2
 * graphs (lower + autodiff): casts exactly where classes meet, the class
 * contract on every op, the storage rules of the default plan (what PyTorch
 * autocast keeps in f32) and of the all-16-bit plan, pins, the fp32 policy
 * changing nothing, and on the cpu backend the default plan's gradients
 * nearer fp64 than the all-16-bit plan's. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "cpu/cpu_exec.h"
#include "fuse_qkv.h"
#include "lower.h"
#include "precision.h"
#include "train/init.h"

typedef struct {
    ModelSpec spec;
    IrGraph g, out;
    ParamList pl;
    PrecisionPlan plan;
} Fixture;

/* bert_tiny: 2 layers, hidden 32, 4 heads, sequence classification. */
static void spec_bert_tiny(ModelSpec *s)
{
    spec_defaults(s);
    s->stack.vocab_size = 100;
    s->stack.max_positions = 64;
    s->stack.hidden = 32;
    s->stack.layers = 2;
    s->stack.heads = 4;
    s->stack.ffn = 64;
}

static void spec_gpt_tiny(ModelSpec *s)
{
    spec_bert_tiny(s);
    s->stack.kind = STACK_DECODER;
    s->stack.norm = NORM_PRE;
    s->stack.attention = ATTN_CAUSAL;
    s->stack.embedding_ln = false;
    s->stack.final_ln = true;
    s->stack.type_vocab_size = 0;
    s->head.kind = HEAD_CAUSAL_LM;
    s->head.decoder_bias = false;
}

/* f->spec lowered and differentiated into f->g; f->out empty.  With
 * qkv_stacks, lowered as the pipeline lowers it under fp16: the fused
 * attention and the Q/K/V stacks (compiler/fuse_qkv.h), one a layer. */
static void fixture_lower_as(Fixture *f, bool qkv_stacks)
{
    HpcError err;
    ir_init(&f->g);
    ir_init(&f->out);
    params_init(&f->pl);
    cr_assert_eq(lower_model_attention(&f->spec, qkv_stacks, false, &f->g, &f->pl, &err), HPC_OK, "%s", err.msg);
    if (qkv_stacks) {
        int sites = 0;
        cr_assert_eq(fuse_qkv_graph(&f->g, &f->pl, &sites, &err), HPC_OK, "%s", err.msg);
        cr_assert_eq(sites, (int)f->spec.stack.layers);
    }
    cr_assert_eq(autodiff_build(&f->g, &f->pl, &err), HPC_OK);
}

static void fixture_lower(Fixture *f) { fixture_lower_as(f, false); }

/* f->plan and f->out dropped, so the same f->g is planned again. */
static void fixture_replan(Fixture *f)
{
    precision_plan_free(&f->plan);
    ir_free(&f->out);
    ir_init(&f->out);
}

static void fixture_plan_keep(Fixture *f, SpecPrecision policy, unsigned keep)
{
    HpcError err;
    fixture_lower(f);
    PrecisionOptions o = {.keep_f32 = keep};
    HpcStatus st = precision_plan_opts(&f->g, &f->spec, policy, &o, &f->out, &f->plan, &err);
    cr_assert_eq(st, HPC_OK, "%s", err.msg);
}

/* The default plan (precision_plan, HPC_KEEP_F32 unset). */
static void fixture_plan(Fixture *f, SpecPrecision policy)
{
    HpcError err;
    fixture_lower(f);
    unsetenv("HPC_KEEP_F32");
    HpcStatus st = precision_plan(&f->g, &f->spec, policy, &f->out, &f->plan, &err);
    cr_assert_eq(st, HPC_OK, "%s", err.msg);
}

static void fixture_free(Fixture *f)
{
    precision_plan_free(&f->plan);
    ir_free(&f->out);
    ir_free(&f->g);
    params_free(&f->pl);
}

static const IrNode *node(const IrGraph *g, int id) { return &g->nodes[id]; }

/* "source->dtype" for every CAST, sorted, joined by spaces. */
static void cast_list(const IrGraph *g, char *buf, size_t size)
{
    char *items[64];
    int n = 0;
    for (int i = 0; i < g->n && n < 64; i++) {
        const IrNode *c = node(g, i);
        if (c->op != IR_OP_CAST) continue;
        items[n] = malloc(128);
        snprintf(items[n++], 128, "%s->%s", node(g, c->in[0])->name, ir_dtype_name(c->dtype));
    }
    for (int i = 1; i < n; i++)      /* insertion sort: stable, tiny */
        for (int j = i; j > 0 && strcmp(items[j - 1], items[j]) > 0; j--) {
            char *t = items[j];
            items[j] = items[j - 1];
            items[j - 1] = t;
        }
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (i) strncat(buf, " ", size - strlen(buf) - 1);
        strncat(buf, items[i], size - strlen(buf) - 1);
        free(items[i]);
    }
}

static bool is_param_grad(const IrGraph *g, int id)
{
    for (int p = 0; p < g->n_params; p++)
        if (g->param_grad[p] == id) return true;
    /* a contribution summed into a parameter gradient by an f32 ADD */
    for (int i = id + 1; i < g->n; i++) {
        const IrNode *n = node(g, i);
        if (n->op == IR_OP_ADD && n->dtype == DT_F32 && n->backward && (n->in[0] == id || n->in[1] == id))
            return is_param_grad(g, i);
    }
    return false;
}

/* Whether node i of the plan is read by an op of class cls. */
static bool read_by_class(const Fixture *f, int i, PrecClass cls)
{
    for (int j = i + 1; j < f->out.n; j++)
        for (int k = 0; k < f->out.nodes[j].n_in; k++)
            if (f->out.nodes[j].in[k] == i && f->plan.info[j].cls == cls) return true;
    return false;
}

/* The class contract of precision.h, checked on every op of the plan:
 * GEMMs read low (weights as optimizer-written copies), f32-compute ops
 * read every activation as its producer stored it (never through a cast)
 * and parameters as f32 masters, f32 ops read f32; casts exist only for
 * GEMMs and f32 ops.  Stored formats: with keep_f32 = 0 every activation and
 * gradient but a parameter's is low; otherwise see check_storage. */
static void check_contract(const Fixture *f)
{
    const IrGraph *g = &f->out;
    const PrecisionPlan *pl = &f->plan;
    cr_assert_eq(pl->n, g->n);
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = node(g, i);
        const PrecNodeInfo *info = &pl->info[i];
        DType low = pl->region_dtype[info->region];
        if (n->n_in == 0 || !ir_dtype_is_float(n->dtype)) continue;
        bool grad = is_param_grad(g, i);
        for (int k = 0; k < n->n_in; k++) {
            const IrNode *u = node(g, n->in[k]);
            if (!ir_dtype_is_float(u->dtype)) continue;
            bool param = u->op == IR_OP_PARAM;
            switch (info->cls) {
            case PREC_CLASS_LOW:
                cr_assert_eq(u->dtype, low, "%d %s input %d is %s, want %s", i, n->name, k,
                             ir_dtype_name(u->dtype), ir_dtype_name(low));
                if (param && low != DT_F32)
                    cr_assert_eq(pl->param_low[u->attr.param.index], low, "%s reads a copy the optimizer does not write", n->name);
                break;
            case PREC_CLASS_F32_COMPUTE:
                if (param) cr_assert_eq(u->dtype, DT_F32, "%d %s reads a parameter copy", i, n->name);
                else cr_assert_neq(u->op, IR_OP_CAST, "%d %s input %d comes through a cast", i, n->name, k);
                break;
            case PREC_CLASS_F32:
                cr_assert_eq(u->dtype, DT_F32, "%d %s input %d is %s", i, n->name, k, ir_dtype_name(u->dtype));
                break;
            case PREC_CLASS_CAST:
                cr_assert_neq(u->dtype, n->dtype, "useless cast %s", n->name);
                break;
            case PREC_CLASS_NONE:
                break;
            }
        }
        if (info->cls == PREC_CLASS_CAST) {
            cr_assert(read_by_class(f, i, PREC_CLASS_LOW) || read_by_class(f, i, PREC_CLASS_F32),
                      "cast %s feeds neither a GEMM nor an f32 op", n->name);
            continue;
        }
        if (grad || info->cls == PREC_CLASS_F32)
            cr_assert_eq(n->dtype, DT_F32, "%d %s stores %s", i, n->name, ir_dtype_name(n->dtype));
        else if (pl->keep_f32 == 0)
            cr_assert_eq(n->dtype, low, "%d %s (%s) stores %s, want %s", i, n->name, ir_op_name(n->op),
                         ir_dtype_name(n->dtype), ir_dtype_name(low));
        else
            cr_assert(n->dtype == low || n->dtype == DT_F32, "%d %s stores %s", i, n->name, ir_dtype_name(n->dtype));
    }
    for (int p = 0; p < g->n_params; p++)
        if (g->param_grad[p] >= 0)
            cr_assert_eq(node(g, g->param_grad[p])->dtype, DT_F32, "gradient of parameter %d", p);
}

/* Forward values named with prefix `prefix` (and float) must all be `dt`. */
static void expect_forward_dtype(const Fixture *f, const char *prefix, DType dt)
{
    int seen = 0;
    for (int i = 0; i < f->out.n_forward; i++) {
        const IrNode *n = node(&f->out, i);
        if (n->op == IR_OP_CAST || n->op == IR_OP_PARAM || !ir_dtype_is_float(n->dtype)) continue;
        if (strncmp(n->name, prefix, strlen(prefix)) != 0) continue;
        cr_expect_eq(n->dtype, dt, "%s is %s, pinned %s", n->name, ir_dtype_name(n->dtype), ir_dtype_name(dt));
        seen++;
    }
    cr_expect(seen > 0, "no value named %s*", prefix);
}

/* The default plan's storage (keep_f32 = PREC_KEEP_DEFAULT), in each
 * region of a low dtype: forward LayerNorm outputs, residual sums and embedding values
 * f32; GEMM outputs, softmax and activation outputs low; and every
 * gradient that is not a parameter's stored as its value is.  The last rule
 * is checked against the names autodiff gives gradients ("d.X" is the
 * gradient of the value named X), independently of the structural rule the
 * planner uses; returns how many gradients it checked. */
static int check_storage(const Fixture *f)
{
    const IrGraph *g = &f->out;
    for (int i = 0; i < g->n_forward; i++) {
        const IrNode *n = node(g, i);
        if (!ir_dtype_is_float(n->dtype) || n->op == IR_OP_PARAM || n->op == IR_OP_CAST) continue;
        DType low = f->plan.region_dtype[f->plan.info[i].region], want = DT_F32;
        switch (n->op) {
        case IR_OP_LAYERNORM:
        case IR_OP_ADD:
        case IR_OP_EMBEDDING:
        case IR_OP_CROSS_ENTROPY:
            break;
        case IR_OP_LINEAR:
        case IR_OP_MATMUL:
        case IR_OP_SOFTMAX:
        case IR_OP_ACT:
            want = low;
            break;
        default:   /* dropout, layout ops: their input's format */
            want = low == DT_F32 ? DT_F32 : node(g, n->in[0])->dtype;
            break;
        }
        cr_expect_eq(n->dtype, want, "%d %s (%s) stores %s, want %s", i, n->name, ir_op_name(n->op),
                     ir_dtype_name(n->dtype), ir_dtype_name(want));
    }
    int checked = 0;
    for (int i = g->n_forward; i < g->n; i++) {
        const IrNode *n = node(g, i);
        PrecClass cls = f->plan.info[i].cls;
        if (!ir_dtype_is_float(n->dtype) || is_param_grad(g, i) || strncmp(n->name, "d.", 2) != 0) continue;
        if (cls == PREC_CLASS_LOW) {   /* the gradient of a GEMM's (low) input: low, as autograd's */
            cr_expect_eq(n->dtype, f->plan.region_dtype[f->plan.info[i].region], "%d %s", i, n->name);
            checked++;
            continue;
        }
        if (cls != PREC_CLASS_F32_COMPUTE) continue;
        int seen = 0;
        DType value = DT_F32;
        bool one_dtype = true;
        for (int j = 0; j < g->n_forward; j++) {
            const IrNode *v = node(g, j);
            if (v->op == IR_OP_CAST || v->op == IR_OP_PARAM || strcmp(v->name, n->name + 2) != 0) continue;
            if (seen++ && v->dtype != value) one_dtype = false;
            value = v->dtype;
        }
        if (!seen || !one_dtype) continue;
        cr_expect_eq(n->dtype, value, "%d %s (%s) stores %s, its value %s", i, n->name, ir_op_name(n->op),
                     ir_dtype_name(n->dtype), ir_dtype_name(value));
        checked++;
    }
    return checked;
}

/* Every node of the input survives, in order, with the same op and name;
 * its inputs are the planned inputs, a cast of them, or a parameter copy. */
static void check_structure(const Fixture *f)
{
    const IrGraph *in = &f->g, *out = &f->out;
    int prev = -1;
    for (int i = 0; i < in->n; i++) {
        int j = f->plan.map[i];
        cr_assert(j > prev, "order kept");
        prev = j;
        const IrNode *a = node(in, i), *b = node(out, j);
        cr_assert_eq(a->op, b->op);
        cr_assert_str_eq(a->name, b->name);
        cr_assert_eq(a->n_in, b->n_in);
        cr_assert_eq(a->backward, b->backward);
        for (int k = 0; k < a->n_in; k++) {
            int want = f->plan.map[a->in[k]], got = b->in[k];
            const IrNode *u = node(out, got);
            bool ok = got == want || (u->op == IR_OP_CAST && u->in[0] == want) ||
                      (u->op == IR_OP_PARAM && node(in, a->in[k])->op == IR_OP_PARAM &&
                       u->attr.param.index == node(in, a->in[k])->attr.param.index);
            cr_assert(ok, "input %d of %s", k, a->name);
        }
    }
    cr_assert_eq(out->loss, f->plan.map[in->loss]);
    cr_assert_eq(out->logits, f->plan.map[in->logits]);
    for (int i = 0; i < out->n; i++)
        if (out->nodes[i].op != IR_OP_INPUT)   /* the loss-scale input is a backward leaf */
            cr_assert_eq(out->nodes[i].backward, i >= out->n_forward, "node %d %s", i, out->nodes[i].name);
}

Test(precision, bert_tiny_fp16_default_keeps_what_autocast_keeps)
{
    Fixture f;
    spec_bert_tiny(&f.spec);
    fixture_plan(&f, PREC_FP16);
    cr_expect_eq(f.plan.keep_f32, PREC_KEEP_DEFAULT);
    char casts[1024];
    cast_list(&f.out, casts, sizeof casts);
    /* the f32 hidden states are cast once for the GEMMs that read them (the
     * embedding output and each LayerNorm output but the last, whose first
     * token is cast for the pooler); the f16 logits meet the f32 loss, the
     * f32 loss gradient the f16 classifier backward.  No gradient needs a
     * cast: f32-compute ops read the GEMMs' f16 input gradients as they are. */
    cr_expect_str_eq(casts, "d.logits->f16 emb.dropout->f16 head.first_token->f16 layer.0.attn.ln->f16 "
                            "layer.0.ffn.ln->f16 layer.1.attn.ln->f16 logits->f32");
    cr_expect_eq(f.plan.n_casts, 7);
    check_contract(&f);
    check_structure(&f);
    cr_expect_gt(check_storage(&f), 40, "the gradients checked by name");
    expect_forward_dtype(&f, "emb.", DT_F32);
    /* every linear weight and bias has an f16 copy; LayerNorm and embedding
     * tables are read as f32 masters */
    for (int p = 0; p < f.pl.n; p++) {
        const char *name = f.pl.p[p].name;
        bool linear = strstr(name, "LayerNorm") == NULL && strstr(name, "embeddings") == NULL;
        cr_expect_eq(f.plan.param_low[p], linear ? DT_F16 : DT_F32, "%s", name);
    }
    cr_expect_eq(f.out.nodes[f.out.loss].op, IR_OP_CROSS_ENTROPY);
    cr_expect_eq(f.out.nodes[f.out.loss].dtype, DT_F32);
    fixture_free(&f);
}

Test(precision, bert_tiny_fp16_all_16_bit)
{
    Fixture f;
    spec_bert_tiny(&f.spec);
    fixture_plan_keep(&f, PREC_FP16, 0);
    char casts[1024];
    cast_list(&f.out, casts, sizeof casts);
    /* only where classes meet: weights come as optimizer-written copies and
     * parameter gradients are written in f32 directly */
    cr_expect_str_eq(casts, "d.logits->f16 logits->f32");
    cr_expect_eq(f.plan.n_casts, 2);
    check_contract(&f);
    check_structure(&f);
    expect_forward_dtype(&f, "emb.", DT_F16);
    expect_forward_dtype(&f, "layer.", DT_F16);
    fixture_free(&f);
}

Test(precision, bert_tiny_bf16)
{
    Fixture f;
    spec_bert_tiny(&f.spec);
    fixture_plan(&f, PREC_BF16);
    char casts[1024];
    cast_list(&f.out, casts, sizeof casts);
    cr_expect_str_eq(casts, "d.logits->bf16 emb.dropout->bf16 head.first_token->bf16 layer.0.attn.ln->bf16 "
                            "layer.0.ffn.ln->bf16 layer.1.attn.ln->bf16 logits->f32");
    check_contract(&f);
    check_structure(&f);
    cr_expect_gt(check_storage(&f), 40);
    fixture_free(&f);
}

/* Each keep bit on its own changes what its name says, and only that. */
Test(precision, keep_bits_one_at_a_time)
{
    static const struct { unsigned bit; const char *value; IrOpKind op; } cases[] = {
        {PREC_KEEP_NORM_OUT, "layer.0.attn.ln", IR_OP_LAYERNORM},
        {PREC_KEEP_RESIDUAL, "layer.0.attn.residual", IR_OP_ADD},
        {PREC_KEEP_EMBEDDINGS, "emb.word", IR_OP_EMBEDDING},
        {PREC_KEEP_PROBS, "layer.0.attn.probs", IR_OP_SOFTMAX},
        {PREC_KEEP_ACT, "layer.0.ffn.act", IR_OP_ACT},
        {PREC_KEEP_SCORES, "layer.0.attn.scores", IR_OP_MATMUL},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        Fixture f;
        spec_bert_tiny(&f.spec);
        fixture_plan_keep(&f, PREC_FP16, cases[c].bit);
        check_contract(&f);
        check_structure(&f);
        int seen = 0;
        for (int i = 0; i < f.out.n_forward; i++) {
            const IrNode *n = node(&f.out, i);
            if (n->op != cases[c].op || strcmp(n->name, cases[c].value) != 0) continue;
            cr_expect_eq(n->dtype, DT_F32, "%s under keep bit %u", n->name, cases[c].bit);
            seen++;
        }
        cr_expect_eq(seen, 1, "%s", cases[c].value);
        /* q is a GEMM output: low whatever is kept */
        for (int i = 0; i < f.out.n_forward; i++)
            if (strcmp(node(&f.out, i)->name, "layer.0.attn.q") == 0)
                cr_expect_eq(node(&f.out, i)->dtype, DT_F16);
        fixture_free(&f);
    }
}

Test(precision, keep_names_round_trip)
{
    unsigned k = 0;
    char buf[128];
    cr_assert(precision_keep_parse("residual,norm", &k));
    cr_expect_eq(k, PREC_KEEP_RESIDUAL | PREC_KEEP_NORM_OUT);
    precision_keep_format(k, buf, sizeof buf);
    cr_expect_str_eq(buf, "residual,norm");
    cr_assert(precision_keep_parse("default", &k));
    cr_expect_eq(k, PREC_KEEP_DEFAULT);
    precision_keep_format(PREC_KEEP_DEFAULT, buf, sizeof buf);
    cr_expect_str_eq(buf, "embeddings,residual,norm,grads");
    cr_assert(precision_keep_parse("none", &k));
    cr_expect_eq(k, 0u);
    precision_keep_format(0, buf, sizeof buf);
    cr_expect_str_eq(buf, "none");
    cr_assert(precision_keep_parse("all", &k));
    cr_expect_eq(k, (unsigned)PREC_KEEP_ALL);
    k = 77;
    cr_expect(!precision_keep_parse("residual,bogus", &k));
    cr_expect(!precision_keep_parse("norms", &k));
    cr_expect_eq(k, 77u, "unchanged on failure");
}

/* HPC_KEEP_F32 replaces the default for precision_plan (the bench hook);
 * a bad list is a usage error naming the variable. */
Test(precision, environment_hook)
{
    Fixture f;
    spec_bert_tiny(&f.spec);
    HpcError err;
    fixture_lower(&f);
    setenv("HPC_KEEP_F32", "none", 1);
    cr_assert_eq(precision_plan(&f.g, &f.spec, PREC_FP16, &f.out, &f.plan, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(f.plan.keep_f32, 0u);
    cr_expect_eq(f.plan.n_casts, 2);
    fixture_replan(&f);
    setenv("HPC_KEEP_F32", "residual,wrong", 1);
    cr_expect_eq(precision_plan(&f.g, &f.spec, PREC_FP16, &f.out, &f.plan, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "HPC_KEEP_F32=residual,wrong") != NULL, "%s", err.msg);
    PrecisionOptions bad = {.keep_f32 = 1u << 20};
    cr_expect_eq(precision_plan_opts(&f.g, &f.spec, PREC_FP16, &bad, &f.out, &f.plan, &err), HPC_ERR_USAGE);
    unsetenv("HPC_KEEP_F32");
    ir_free(&f.out);
    ir_free(&f.g);
    params_free(&f.pl);
}

/* PrecisionOptions.low_weight_grads (HPC_WEIGHT_GRAD=low): every LINEAR's
 * weight gradient and the stacked Q/K/V bias gradients are stored low with
 * no cast after them (as AMP keeps them); the other bias gradients (summed
 * at their LayerNorm site), the LayerNorm and embedding gradients stay
 * f32; the variable refuses other values. */
Test(precision, low_weight_grads)
{
    Fixture f;
    spec_bert_tiny(&f.spec);
    HpcError err;
    /* with the Q/K/V stacks (made where a bias's bytes keep the packing's
     * alignment: hidden 128) */
    f.spec.stack.hidden = 128;
    f.spec.stack.ffn = 256;
    fixture_lower_as(&f, true);
    PrecisionOptions o = {.keep_f32 = PREC_KEEP_DEFAULT, .low_weight_grads = true};
    cr_assert_eq(precision_plan_opts(&f.g, &f.spec, PREC_FP16, &o, &f.out, &f.plan, &err), HPC_OK, "%s", err.msg);
    cr_expect(f.plan.low_weight_grads);
    int low = 0, wide = 0;
    for (int p = 0; p < f.pl.n; p++) {
        int v = f.out.param_grad[p];
        if (v < 0) continue;
        const char *name = f.pl.p[p].name;
        bool linear = !strstr(name, "LayerNorm") && !strstr(name, "embeddings");
        bool qkv = strstr(name, ".query.") || strstr(name, ".key.") || strstr(name, ".value.");
        bool low_grad = linear && (strstr(name, ".weight") || qkv);
        DType dt = node(&f.out, v)->dtype;
        cr_expect_eq(dt, low_grad ? DT_F16 : DT_F32, "%s: %s", name, ir_dtype_name(dt));
        cr_expect_neq(node(&f.out, v)->op, IR_OP_CAST, "%s comes through a cast", name);
        low += dt == DT_F16;
        wide += dt == DT_F32;
    }
    cr_expect_gt(low, 0);
    cr_expect_gt(wide, 0);
    fixture_replan(&f);
    setenv("HPC_WEIGHT_GRAD", "low", 1);   /* the hook: the same plan */
    cr_assert_eq(precision_plan(&f.g, &f.spec, PREC_FP16, &f.out, &f.plan, &err), HPC_OK, "%s", err.msg);
    cr_expect(f.plan.low_weight_grads);
    fixture_replan(&f);
    cr_assert_eq(precision_plan(&f.g, &f.spec, PREC_FP32, &f.out, &f.plan, &err), HPC_OK, "%s", err.msg);
    cr_expect(!f.plan.low_weight_grads, "fp32 keeps every gradient f32");
    fixture_replan(&f);
    setenv("HPC_WEIGHT_GRAD", "f16", 1);
    cr_expect_eq(precision_plan(&f.g, &f.spec, PREC_FP16, &f.out, &f.plan, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "HPC_WEIGHT_GRAD=f16") != NULL, "%s", err.msg);
    unsetenv("HPC_WEIGHT_GRAD");
    ir_free(&f.out);
    ir_free(&f.g);
    params_free(&f.pl);
}

Test(precision, fp32_policy_changes_nothing)
{
    Fixture f;
    spec_bert_tiny(&f.spec);
    f.spec.head.precision = PREC_FP16;     /* pins are ignored under fp32 */
    f.spec.stack.precision = PREC_BF16;
    fixture_plan(&f, PREC_FP32);
    cr_assert_eq(f.out.n, f.g.n, "no node inserted");
    cr_expect_eq(f.plan.n_casts, 0);
    for (int i = 0; i < f.g.n; i++) {
        const IrNode *a = node(&f.g, i), *b = node(&f.out, i);
        cr_assert_eq(a->op, b->op);
        cr_assert_eq(a->dtype, b->dtype, "%s", a->name);
        cr_assert_eq(memcmp(a->in, b->in, sizeof a->in), 0, "%s", a->name);
        cr_assert_eq(memcmp(a->dims, b->dims, sizeof a->dims), 0);
        cr_assert_str_eq(a->name, b->name);
        cr_assert_eq(f.plan.map[i], i);
    }
    for (int p = 0; p < f.pl.n; p++) cr_expect_eq(f.plan.param_low[p], DT_F32);
    cr_expect_eq(memcmp(f.g.param_grad, f.out.param_grad, (size_t)f.g.n_params * sizeof(int)), 0);
    cr_expect_eq(f.out.n_forward, f.g.n_forward);
    fixture_free(&f);
}

Test(precision, head_pinned_fp32)
{
    Fixture f;
    spec_bert_tiny(&f.spec);
    f.spec.head.precision = PREC_FP32;
    fixture_plan_keep(&f, PREC_FP16, 0);
    char casts[1024];
    cast_list(&f.out, casts, sizeof casts);
    /* all 16-bit: the f32 head's f32-compute ops read the f16 hidden state
     * as it is and the stack's LayerNorm backward reads the head's f32
     * gradient as it is, so no cast is left; the loss needs none either */
    cr_expect_str_eq(casts, "");
    expect_forward_dtype(&f, "head.", DT_F32);
    expect_forward_dtype(&f, "logits", DT_F32);
    expect_forward_dtype(&f, "layer.", DT_F16);
    expect_forward_dtype(&f, "emb.", DT_F16);
    cr_expect_eq(f.plan.param_low[params_find(&f.pl, "classifier.weight")], DT_F32);
    cr_expect_eq(f.plan.param_low[params_find(&f.pl, "bert.pooler.dense.weight")], DT_F32);
    check_contract(&f);
    check_structure(&f);
    fixture_free(&f);
    /* the default plan: the last hidden state is f32 already, so the f32
     * head reads it and its gradient comes back in f32, without a cast */
    spec_bert_tiny(&f.spec);
    f.spec.head.precision = PREC_FP32;
    fixture_plan(&f, PREC_FP16);
    cast_list(&f.out, casts, sizeof casts);
    cr_expect_str_eq(casts, "emb.dropout->f16 layer.0.attn.ln->f16 layer.0.ffn.ln->f16 layer.1.attn.ln->f16");
    expect_forward_dtype(&f, "head.", DT_F32);
    expect_forward_dtype(&f, "logits", DT_F32);
    check_contract(&f);
    check_structure(&f);
    cr_expect_gt(check_storage(&f), 40);
    fixture_free(&f);
}

Test(precision, stack_and_embedding_pins)
{
    Fixture f;
    spec_bert_tiny(&f.spec);
    f.spec.stack.precision = PREC_BF16;
    f.spec.stack.embedding_precision = PREC_FP32;
    fixture_plan_keep(&f, PREC_FP16, 0);
    char casts[1024];
    cast_list(&f.out, casts, sizeof casts);
    /* all 16-bit: forward: f32 embeddings -> bf16 stack -> f16 head -> f32
     * loss.  Only GEMMs need casts (the first layer's QKV reads the f32
     * embedding output; the classifier backward the f32 loss gradient):
     * f32-compute ops at the boundaries read the other format as it is */
    cr_expect_str_eq(casts, "d.logits->f16 emb.dropout->bf16 logits->f32");
    expect_forward_dtype(&f, "emb.", DT_F32);
    expect_forward_dtype(&f, "layer.", DT_BF16);
    expect_forward_dtype(&f, "head.", DT_F16);
    cr_expect_eq(f.plan.param_low[params_find(&f.pl, "bert.encoder.layer.0.attention.self.query.weight")], DT_BF16);
    cr_expect_eq(f.plan.param_low[params_find(&f.pl, "classifier.weight")], DT_F16);
    check_contract(&f);
    check_structure(&f);
    fixture_free(&f);
    /* the default plan: each GEMM's cast is in its own region's format;
     * gradients cross the boundaries in f32 without casts */
    spec_bert_tiny(&f.spec);
    f.spec.stack.precision = PREC_BF16;
    f.spec.stack.embedding_precision = PREC_FP32;
    fixture_plan(&f, PREC_FP16);
    cast_list(&f.out, casts, sizeof casts);
    cr_expect_str_eq(casts, "d.logits->f16 emb.dropout->bf16 head.first_token->f16 layer.0.attn.ln->bf16 "
                            "layer.0.ffn.ln->bf16 layer.1.attn.ln->bf16 logits->f32");
    expect_forward_dtype(&f, "emb.", DT_F32);
    check_contract(&f);
    check_structure(&f);
    cr_expect_gt(check_storage(&f), 40);
    fixture_free(&f);
}

Test(precision, gpt_tiny_tied_decoder_bf16)
{
    Fixture f;
    spec_gpt_tiny(&f.spec);
    fixture_plan(&f, PREC_BF16);
    check_contract(&f);
    check_structure(&f);
    int word = params_find(&f.pl, "transformer.embeddings.word_embeddings.weight");
    cr_assert(word >= 0);
    cr_expect_eq(f.plan.param_low[word], DT_BF16, "the tied decoder reads the bf16 copy");
    /* the word embedding's gradient sums the gather's and the decoder's
     * contributions in f32 */
    const IrNode *gw = node(&f.out, f.out.param_grad[word]);
    cr_expect_eq(gw->op, IR_OP_ADD);
    cr_expect_eq(gw->dtype, DT_F32);
    cr_expect_eq(f.plan.info[f.out.param_grad[word]].cls, PREC_CLASS_F32);
    char casts[1024];
    cast_list(&f.out, casts, sizeof casts);
    /* pre-LN: each LayerNorm output (f32) is cast once for the GEMMs after it */
    cr_expect_str_eq(casts, "d.logits->bf16 final_ln->bf16 layer.0.attn.ln->bf16 layer.0.ffn.ln->bf16 "
                            "layer.1.attn.ln->bf16 layer.1.ffn.ln->bf16 logits->f32");
    cr_expect_gt(check_storage(&f), 30);
    fixture_free(&f);
}

Test(precision, rejects_bad_policy_and_planned_input)
{
    Fixture f;
    spec_bert_tiny(&f.spec);
    fixture_plan(&f, PREC_FP16);
    IrGraph again;
    PrecisionPlan p2;
    HpcError err;
    ir_init(&again);
    cr_expect_eq(precision_plan(&f.out, &f.spec, PREC_FP16, &again, &p2, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "already f16") != NULL, "%s", err.msg);
    cr_expect_eq(precision_plan(&f.g, &f.spec, PREC_DEFAULT, &again, &p2, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "policy") != NULL, "%s", err.msg);
    ir_free(&again);
    fixture_free(&f);
}

Test(precision, report_lists_every_op)
{
    Fixture f;
    spec_bert_tiny(&f.spec);
    fixture_plan(&f, PREC_FP16);
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    precision_report(&f.out, &f.plan, mem);
    fclose(mem);
    cr_expect(strstr(buf, "policy fp16") != NULL);
    cr_expect(strstr(buf, "kept in f32: embeddings,residual,norm,grads") != NULL, "%s", buf);
    cr_expect(strstr(buf, "7 casts inserted") != NULL, "%s", buf);
    /* one line per op: find a few by their columns */
    cr_expect(strstr(buf, "cross_entropy      f32         head       f32,i32          f32     f32    loss") != NULL, "%s", buf);
    cr_expect(strstr(buf, "f16,f16,f16      f16     f16    layer.0.attn.q\n") != NULL);
    cr_expect(strstr(buf, "f32,f32,f32      f32     f32    layer.1.ffn.ln\n") != NULL);
    cr_expect(strstr(buf, "cast        stack      f32              f32     f16    layer.0.attn.ln.to_f16\n") != NULL);
    int lines = 0;
    for (char *p = buf; *p; p++) lines += *p == '\n';
    int ops = 0;
    for (int i = 0; i < f.out.n; i++) {
        IrOpKind op = f.out.nodes[i].op;
        ops += op != IR_OP_INPUT && op != IR_OP_POSITIONS && !(op == IR_OP_PARAM && f.out.nodes[i].dtype == DT_F32);
    }
    cr_expect_eq(lines, ops + 5, "4 header lines, a backward marker, one line per op");
    free(buf);
    fixture_free(&f);
}

/* ---- numerics on the cpu backend --------------------------------------- */

/* Relative L2 error of every parameter gradient of plan `keep` (fp16,
 * run in f32 with 16-bit rounding, loss scale 1024) against the fp64 run of
 * the fp32 graph, on one batch with dropout off. */
static double grad_error(const Fixture *ref, const double *const *g64, float *const *w, const Batch *b,
                         SpecPrecision policy, unsigned keep)
{
    Fixture f;
    f.spec = ref->spec;
    fixture_plan_keep(&f, policy, keep);
    CpuExec ex;
    cpu_exec_init(&ex, &f.out, CPU_EXEC_F32);
    for (int p = 0; p < f.pl.n; p++)
        if (f.pl.p[p].tied_to < 0) cpu_exec_bind_param(&ex, p, w[p]);
    double scale = policy == PREC_FP32 ? 1.0 : 1024.0;
    CpuRunOptions o = {.training = false, .backward = true, .loss_scale = scale};
    HpcError err;
    cr_assert_eq(cpu_exec_run(&ex, b, &o, &err), HPC_OK, "%s", err.msg);
    double num = 0, den = 0;
    for (int p = 0; p < f.pl.n; p++) {
        if (f.out.param_grad[p] < 0) continue;
        const float *gx = cpu_exec_value(&ex, f.out.param_grad[p]);
        for (int64_t i = 0; i < params_numel(&f.pl.p[p]); i++) {
            double d = gx[i] / scale - g64[p][i];
            num += d * d;
            den += g64[p][i] * g64[p][i];
        }
    }
    cpu_exec_free(&ex);
    fixture_free(&f);
    return sqrt(num / den);
}

/* The default plan's gradients are nearer fp64 than the all-16-bit plan's
 * (four layers of hidden 64, random weights and tokens, some padding), for
 * fp16 and bf16; the fp32 policy stays at f32 rounding error. */
Test(precision, default_plan_is_nearer_fp64)
{
    Fixture f;
    spec_bert_tiny(&f.spec);
    f.spec.stack.hidden = 64;
    f.spec.stack.layers = 4;
    f.spec.stack.ffn = 256;
    fixture_plan_keep(&f, PREC_FP32, 0);
    ParamStore ps;
    HpcError err;
    cr_assert_eq(init_store(&ps, &f.pl, 7, &err), HPC_OK);
    enum { B = 16, L = 24 };
    Batch *b = batch_new(B, L, 0);
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < B; i++) {
        int len = 6 + i % (L - 6);
        b->labels[i] = i % 2;
        for (int t = 0; t < L; t++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            b->input_ids[i * L + t] = t < len ? 1 + (int)(r % 99) : 0;
            b->attention_mask[i * L + t] = t < len;
        }
    }
    CpuExec ex;
    cpu_exec_init(&ex, &f.out, CPU_EXEC_F64);
    double **w64 = calloc((size_t)f.pl.n, sizeof *w64), **g64 = calloc((size_t)f.pl.n, sizeof *g64);
    for (int p = 0; p < f.pl.n; p++) {
        if (f.pl.p[p].tied_to >= 0) continue;
        int64_t n = params_numel(&f.pl.p[p]);
        w64[p] = malloc((size_t)n * sizeof(double));
        for (int64_t i = 0; i < n; i++) w64[p][i] = ps.w[p][i];
        cpu_exec_bind_param(&ex, p, w64[p]);
    }
    CpuRunOptions o = {.training = false, .backward = true, .loss_scale = 1.0};
    cr_assert_eq(cpu_exec_run(&ex, b, &o, &err), HPC_OK, "%s", err.msg);
    for (int p = 0; p < f.pl.n; p++) {
        if (f.out.param_grad[p] < 0) continue;
        int64_t n = params_numel(&f.pl.p[p]);
        g64[p] = malloc((size_t)n * sizeof(double));
        memcpy(g64[p], cpu_exec_value(&ex, f.out.param_grad[p]), (size_t)n * sizeof(double));
    }
    cpu_exec_free(&ex);
    double fp32 = grad_error(&f, (const double *const *)g64, ps.w, b, PREC_FP32, 0);
    double h_none = grad_error(&f, (const double *const *)g64, ps.w, b, PREC_FP16, 0);
    double h_def = grad_error(&f, (const double *const *)g64, ps.w, b, PREC_FP16, PREC_KEEP_DEFAULT);
    double b_none = grad_error(&f, (const double *const *)g64, ps.w, b, PREC_BF16, 0);
    double b_def = grad_error(&f, (const double *const *)g64, ps.w, b, PREC_BF16, PREC_KEEP_DEFAULT);
    cr_log_info("gradient error vs fp64: fp32 %.3e; fp16 all-16-bit %.3e, default %.3e; "
                "bf16 all-16-bit %.3e, default %.3e", fp32, h_none, h_def, b_none, b_def);
    cr_expect(fp32 < 1e-5, "fp32 %.3e", fp32);
    cr_expect(h_def < 0.9 * h_none, "fp16: default %.3e, all-16-bit %.3e", h_def, h_none);
    cr_expect(b_def < 0.9 * b_none, "bf16: default %.3e, all-16-bit %.3e", b_def, b_none);
    cr_expect(h_def < 2e-3 && b_def < 2e-2, "fp16 %.3e bf16 %.3e", h_def, b_def);
    for (int p = 0; p < f.pl.n; p++) {
        free(w64[p]);
        free(g64[p]);
    }
    free(w64);
    free(g64);
    batch_free(b);
    init_store_free(&ps);
    fixture_free(&f);
}

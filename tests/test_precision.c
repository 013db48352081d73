/* tests/test_precision.c — the precision planner on small BERT and GPT-2
 * graphs (lower + autodiff): casts exactly where classes meet, the class
 * contract on every op, pins, and the fp32 policy changing nothing. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "lower.h"
#include "precision.h"

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

static void fixture_plan(Fixture *f, SpecPrecision policy)
{
    HpcError err;
    ir_init(&f->g);
    ir_init(&f->out);
    params_init(&f->pl);
    cr_assert_eq(lower_model(&f->spec, &f->g, &f->pl, &err), HPC_OK);
    cr_assert_eq(autodiff_build(&f->g, &f->pl, &err), HPC_OK);
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

/* The class contract of precision.h, checked on every op of the plan. */
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
                cr_assert_eq(u->dtype, param ? DT_F32 : low, "%d %s input %d is %s", i, n->name, k,
                             ir_dtype_name(u->dtype));
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
        if (info->cls == PREC_CLASS_CAST) continue;
        DType want = grad || info->cls == PREC_CLASS_F32 ? DT_F32 : low;
        cr_assert_eq(n->dtype, want, "%d %s (%s) stores %s, want %s", i, n->name, ir_op_name(n->op),
                     ir_dtype_name(n->dtype), ir_dtype_name(want));
    }
    for (int p = 0; p < g->n_params; p++)
        if (g->param_grad[p] >= 0)
            cr_assert_eq(node(g, g->param_grad[p])->dtype, DT_F32, "gradient of parameter %d", p);
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

Test(precision, bert_tiny_fp16_casts_where_classes_meet)
{
    Fixture f;
    spec_bert_tiny(&f.spec);
    fixture_plan(&f, PREC_FP16);
    char casts[1024];
    cast_list(&f.out, casts, sizeof casts);
    /* the f16 logits meet the f32 loss; the f32 loss gradient meets the f16
     * classifier backward.  Nowhere else: weights come as optimizer-written
     * copies and parameter gradients are written in f32 directly. */
    cr_expect_str_eq(casts, "d.logits->f16 logits->f32");
    cr_expect_eq(f.plan.n_casts, 2);
    check_contract(&f);
    check_structure(&f);
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

Test(precision, bert_tiny_bf16)
{
    Fixture f;
    spec_bert_tiny(&f.spec);
    fixture_plan(&f, PREC_BF16);
    char casts[1024];
    cast_list(&f.out, casts, sizeof casts);
    cr_expect_str_eq(casts, "d.logits->bf16 logits->f32");
    check_contract(&f);
    check_structure(&f);
    fixture_free(&f);
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

Test(precision, head_pinned_fp32)
{
    Fixture f;
    spec_bert_tiny(&f.spec);
    f.spec.head.precision = PREC_FP32;
    fixture_plan(&f, PREC_FP16);
    char casts[1024];
    cast_list(&f.out, casts, sizeof casts);
    /* the casts move to the stack/head boundary; the loss needs none */
    cr_expect_str_eq(casts, "d.layer.1.ffn.ln->f16 layer.1.ffn.ln->f32");
    expect_forward_dtype(&f, "head.", DT_F32);
    expect_forward_dtype(&f, "logits", DT_F32);
    expect_forward_dtype(&f, "layer.", DT_F16);
    expect_forward_dtype(&f, "emb.", DT_F16);
    cr_expect_eq(f.plan.param_low[params_find(&f.pl, "classifier.weight")], DT_F32);
    cr_expect_eq(f.plan.param_low[params_find(&f.pl, "bert.pooler.dense.weight")], DT_F32);
    check_contract(&f);
    check_structure(&f);
    fixture_free(&f);
}

Test(precision, stack_and_embedding_pins)
{
    Fixture f;
    spec_bert_tiny(&f.spec);
    f.spec.stack.precision = PREC_BF16;
    f.spec.stack.embedding_precision = PREC_FP32;
    fixture_plan(&f, PREC_FP16);
    char casts[1024];
    cast_list(&f.out, casts, sizeof casts);
    /* forward: f32 embeddings -> bf16 stack -> f16 head -> f32 loss;
     * backward the same boundaries in reverse, the gradient of emb.dropout
     * summed in bf16 by the stack and cast once */
    cr_expect_str_eq(casts, "d.emb.dropout->f32 d.layer.1.ffn.ln->bf16 d.logits->f16 "
                            "emb.dropout->bf16 layer.1.ffn.ln->f16 logits->f32");
    expect_forward_dtype(&f, "emb.", DT_F32);
    expect_forward_dtype(&f, "layer.", DT_BF16);
    expect_forward_dtype(&f, "head.", DT_F16);
    cr_expect_eq(f.plan.param_low[params_find(&f.pl, "bert.encoder.layer.0.attention.self.query.weight")], DT_BF16);
    cr_expect_eq(f.plan.param_low[params_find(&f.pl, "classifier.weight")], DT_F16);
    check_contract(&f);
    check_structure(&f);
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
    cr_expect_str_eq(casts, "d.logits->bf16 logits->f32");
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
    cr_expect(strstr(buf, "2 casts inserted") != NULL, "%s", buf);
    /* one line per op: find a few by their columns */
    cr_expect(strstr(buf, "cross_entropy      f32         head       f32,i32          f32     f32    loss") != NULL, "%s", buf);
    cr_expect(strstr(buf, "f16,f16,f16      f16     f16    layer.0.attn.q\n") != NULL);
    cr_expect(strstr(buf, "f16,f32,f32      f32     f16    layer.1.ffn.ln\n") != NULL);
    int lines = 0;
    for (char *p = buf; *p; p++) lines += *p == '\n';
    int ops = 0;
    for (int i = 0; i < f.out.n; i++) {
        IrOpKind op = f.out.nodes[i].op;
        ops += op != IR_OP_INPUT && op != IR_OP_POSITIONS && !(op == IR_OP_PARAM && f.out.nodes[i].dtype == DT_F32);
    }
    cr_expect_eq(lines, ops + 4, "3 header lines, a backward marker, one line per op");
    free(buf);
    fixture_free(&f);
}

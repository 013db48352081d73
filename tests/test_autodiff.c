/* tests/test_autodiff.c — reverse-mode gradients against finite differences.
 *
 * Every check runs the graph in f64 on the cpu executor, takes the gradient
 * of each parameter from the backward graph (autodiff + backward rules +
 * kernels), and compares it with central differences of the loss,
 * (loss(w + h) - loss(w - h)) / 2h with h = 1e-6, element by element.
 * Pass: the relative error of each parameter's gradient,
 * ||g_ad - g_fd|| / ||g_fd||, is below 1e-6, every element agrees within
 * 1e-6 relative + 1e-9 absolute, and the gradient is not all zero.  Inputs,
 * weights, masks (with padding) and labels are random; dropout runs in
 * training mode with a fixed (seed, step), so its mask is the same in every
 * evaluation.
 *
 * Per-op graphs start from a random embedding table (so every op sees a
 * random (B, L, H) input that has a gradient) and end in a linear layer and
 * cross-entropy; the op under test sits in between.  The whole-model checks
 * lower a bert_tiny-shaped spec (hidden 16, 2 heads, 2 layers, vocab 50,
 * L 8, B 2) and check every parameter.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "data/batch.h"
#include "cpu/cpu_exec.h"
#include "compiler/ir_build.h"
#include "program/ir.h"
#include "lower.h"
#include "program/params.h"
#include "cpu/philox.h"
#include "program/spec.h"

enum { TB = 2, TL = 8, TV = 50, TH = 16, TC = 5, THEADS = 2 };

typedef struct {
    IrGraph g;
    ParamList pl;
    double **w;      /* (pl.n) f64 parameter tensors, tied ones shared */
    Batch *batch;
    int ids, mask;   /* input nodes */
    uint64_t rng;
} Fx;

static double frand(Fx *fx) /* uniform in [-1, 1) */
{
    return 2.0 * philox_uniform(1234, fx->rng++, 0, 99) - 1.0;
}

static void fx_init(Fx *fx, bool seq_labels, int n_classes)
{
    memset(fx, 0, sizeof *fx);
    ir_init(&fx->g);
    params_init(&fx->pl);
    fx->batch = batch_new(TB, TL, 1);
    int lens[TB] = {TL, 5}; /* row 1 is padded: masks matter */
    for (int b = 0; b < TB; b++) {
        for (int t = 0; t < TL; t++) {
            int i = b * TL + t;
            bool real = t < lens[b];
            fx->batch->input_ids[i] = real ? (int)(philox_uniform(7, (uint64_t)i, 0, 1) * TV) : 0;
            fx->batch->token_type_ids[i] = real && t >= 3;
            fx->batch->attention_mask[i] = real;
            fx->batch->labels[i] = real ? (int)(philox_uniform(7, (uint64_t)i, 0, 2) * n_classes) : -100;
        }
        fx->batch->targets[b] = (float)(b ? -0.7 : 1.3);
    }
    if (seq_labels)
        for (int b = 0; b < TB; b++) fx->batch->labels[b] = b % n_classes;
    fx->ids = ir_input(&fx->g, IR_IN_INPUT_IDS);
    fx->mask = ir_input(&fx->g, IR_IN_ATTN_MASK);
}

static void fx_free(Fx *fx)
{
    for (int i = 0; i < fx->pl.n; i++)
        if (fx->pl.p[i].tied_to < 0) free(fx->w[i]);
    free(fx->w);
    batch_free(fx->batch);
    ir_free(&fx->g);
    params_free(&fx->pl);
}

/* A parameter (d0, d1) (d1 = 0: a vector) and its node. */
static int fx_param(Fx *fx, const char *name, int64_t d0, int64_t d1)
{
    int64_t dims[2] = {d0, d1};
    int rank = d1 ? 2 : 1;
    int idx = params_add(&fx->pl, name, rank, dims, PARAM_INIT_NORMAL, true, false);
    return ir_param(&fx->g, idx, DT_F32, rank, dims, name);
}

/* Random values for every parameter: weights ~ U(-1, 1) * scale; vectors
 * named "*gamma*" around 1. */
static void fx_fill(Fx *fx, double scale)
{
    fx->w = calloc((size_t)fx->pl.n, sizeof *fx->w);
    for (int i = 0; i < fx->pl.n; i++) {
        const ParamInfo *p = &fx->pl.p[i];
        if (p->tied_to >= 0) continue;
        int64_t n = params_numel(p);
        fx->w[i] = malloc((size_t)n * sizeof(double));
        bool gamma = strstr(p->name, "gamma") || strstr(p->name, "LayerNorm.weight") ||
                     strstr(p->name, "ln_f.weight");
        for (int64_t k = 0; k < n; k++) fx->w[i][k] = (gamma ? 1.0 : 0.0) + scale * frand(fx);
    }
    for (int i = 0; i < fx->pl.n; i++)
        if (fx->pl.p[i].tied_to >= 0) fx->w[i] = fx->w[fx->pl.p[i].tied_to];
}

static double run_loss(CpuExec *ex, Fx *fx, bool backward)
{
    CpuRunOptions o = {.training = true, .backward = backward, .seed = 77, .step = 3, .loss_scale = 1.0};
    HpcError err = {0};
    HpcStatus st = cpu_exec_run(ex, fx->batch, &o, &err);
    cr_assert_eq(st, HPC_OK, "cpu_exec_run: %s", err.msg);
    return cpu_exec_loss(ex);
}

static bool is_key_bias(const char *name)
{
    return strcmp(name, "k.b") == 0 || strstr(name, "self.key.bias");
}

/* Autodiff the graph, then compare every trainable parameter's gradient
 * with central differences.  Returns the number of parameters checked. */
static int gradcheck(Fx *fx)
{
    HpcError err = {0};
    fx->g.n_params = fx->pl.n;
    cr_assert_eq(autodiff_build(&fx->g, &fx->pl, &err), HPC_OK, "%s", err.msg);
    CpuExec ex;
    cpu_exec_init(&ex, &fx->g, CPU_EXEC_F64);
    for (int p = 0; p < fx->pl.n; p++)
        if (fx->pl.p[p].tied_to < 0) cpu_exec_bind_param(&ex, p, fx->w[p]);
    double loss = run_loss(&ex, fx, true);
    cr_assert(isfinite(loss) && loss > 0, "loss %g", loss);
    int checked = 0;
    const double h = 1e-6;
    for (int p = 0; p < fx->pl.n; p++) {
        int gv = fx->g.param_grad[p];
        if (fx->pl.p[p].tied_to >= 0 || gv < 0) continue;
        int64_t n = params_numel(&fx->pl.p[p]);
        double *ad = malloc((size_t)n * sizeof *ad);
        run_loss(&ex, fx, true);
        memcpy(ad, cpu_exec_value(&ex, gv), (size_t)n * sizeof *ad);
        double num = 0, den = 0, worst = 0;
        int64_t worst_k = -1;
        for (int64_t k = 0; k < n; k++) {
            double keep = fx->w[p][k];
            fx->w[p][k] = keep + h;
            double lp = run_loss(&ex, fx, false);
            fx->w[p][k] = keep - h;
            double lm = run_loss(&ex, fx, false);
            fx->w[p][k] = keep;
            double fd = (lp - lm) / (2 * h);
            double e = fabs(fd - ad[k]);
            num += e * e;
            den += fd * fd;
            double tol = 1e-6 * fmax(fabs(fd), fabs(ad[k])) + 1e-9;
            if (!(e <= tol) && (worst_k < 0 || e > worst)) { worst = e; worst_k = k; }
        }
        const char *name = fx->pl.p[p].name;
        if (is_key_bias(name)) {
            /* softmax ignores a constant added to every score of a row, and
             * q . b_k is such a constant: the exact gradient is 0 */
            double ad_norm = 0;
            for (int64_t k = 0; k < n; k++) ad_norm += ad[k] * ad[k];
            cr_expect(sqrt(ad_norm) < 1e-12 && sqrt(den) < 1e-7, "%s: |ad| %.3g |fd| %.3g, want 0",
                      name, sqrt(ad_norm), sqrt(den));
        } else {
            double rel = sqrt(num) / sqrt(den);
            cr_expect(den > 0, "%s: gradient is all zero", name);
            cr_expect(rel < 1e-6, "%s: relative error %.3g", name, rel);
            cr_expect(worst_k < 0, "%s: element %lld differs by %.3g", name, (long long)worst_k, worst);
        }
        free(ad);
        checked++;
    }
    cpu_exec_free(&ex);
    return checked;
}

/* x (B, L, H) = a random embedding of the batch's ids. */
static int fx_embed(Fx *fx, const char *name)
{
    int t = fx_param(fx, name, TV, TH);
    return ir_add(&fx->g, IR_OP_EMBEDDING, (int[]){t, fx->ids}, 2, NULL, name);
}

/* loss = cross-entropy(x W^T + b) against token labels (B, L). */
static void fx_token_loss(Fx *fx, int x)
{
    int64_t in = fx->g.nodes[x].dims[fx->g.nodes[x].rank - 1];
    int w = fx_param(fx, "head.w", TC, in), b = fx_param(fx, "head.b", TC, 0);
    int logits = ir_add(&fx->g, IR_OP_LINEAR, (int[]){x, w, b}, 3, NULL, "logits");
    int labels = ir_input(&fx->g, IR_IN_TOKEN_LABELS);
    fx->g.loss = ir_add(&fx->g, IR_OP_CROSS_ENTROPY, (int[]){logits, labels}, 2, NULL, "loss");
}

Test(autodiff_ops, embedding_linear_cross_entropy)
{
    Fx fx;
    fx_init(&fx, false, TC);
    fx_token_loss(&fx, fx_embed(&fx, "emb"));
    fx_fill(&fx, 0.5);
    cr_expect_eq(gradcheck(&fx), 3);
    fx_free(&fx);
}

Test(autodiff_ops, add_and_reuse)
{
    Fx fx;
    fx_init(&fx, false, TC);
    int a = fx_embed(&fx, "a"), b = fx_embed(&fx, "b");
    int s = ir_add(&fx.g, IR_OP_ADD, (int[]){a, b}, 2, NULL, "s");
    s = ir_add(&fx.g, IR_OP_ADD, (int[]){s, s}, 2, NULL, "s2"); /* one value used twice */
    fx_token_loss(&fx, s);
    fx_fill(&fx, 0.5);
    cr_expect_eq(gradcheck(&fx), 4);
    fx_free(&fx);
}

Test(autodiff_ops, layernorm)
{
    Fx fx;
    fx_init(&fx, false, TC);
    int x = fx_embed(&fx, "x");
    int g = fx_param(&fx, "ln.gamma", TH, 0), b = fx_param(&fx, "ln.beta", TH, 0);
    IrAttr a = {.norm = {1e-5}};
    int y = ir_add(&fx.g, IR_OP_LAYERNORM, (int[]){x, g, b}, 3, &a, "ln");
    fx_token_loss(&fx, y);
    fx_fill(&fx, 0.5);
    cr_expect_eq(gradcheck(&fx), 5);
    fx_free(&fx);
}

/* The multi-output LayerNorm: the gradient flows through y (output 0); its
 * mean and rstd outputs exist but carry none. */
Test(autodiff_ops, layernorm_fwd_with_statistics)
{
    Fx fx;
    fx_init(&fx, false, TC);
    int x = fx_embed(&fx, "x");
    int g = fx_param(&fx, "ln.gamma", TH, 0), b = fx_param(&fx, "ln.beta", TH, 0);
    IrAttr a = {.norm = {1e-5}};
    int outs[3];
    ir_add_outputs(&fx.g, IR_OP_LAYERNORM_FWD, (int[]){x, g, b}, 3, &a, "ln", outs);
    fx_token_loss(&fx, outs[0]);
    fx_fill(&fx, 0.5);
    cr_expect_eq(gradcheck(&fx), 5);
    fx_free(&fx);
}

static void check_act(IrActKind kind)
{
    Fx fx;
    fx_init(&fx, false, TC);
    int x = fx_embed(&fx, "x");
    IrAttr a = {.act = {kind}};
    int y = ir_add(&fx.g, IR_OP_ACT, &x, 1, &a, "act");
    fx_token_loss(&fx, y);
    fx_fill(&fx, 1.0);
    cr_expect_eq(gradcheck(&fx), 3, "%s", ir_act_name(kind));
    fx_free(&fx);
}

Test(autodiff_ops, gelu) { check_act(IR_ACT_GELU); }
Test(autodiff_ops, gelu_tanh) { check_act(IR_ACT_GELU_TANH); }
Test(autodiff_ops, relu) { check_act(IR_ACT_RELU); }
Test(autodiff_ops, tanh) { check_act(IR_ACT_TANH); }
Test(autodiff_ops, silu) { check_act(IR_ACT_SILU); }

Test(autodiff_ops, dropout_fixed_mask)
{
    Fx fx;
    fx_init(&fx, false, TC);
    int x = fx_embed(&fx, "x");
    IrAttr a = {.dropout = {0.3, -1}};
    int y = ir_add(&fx.g, IR_OP_DROPOUT, &x, 1, &a, "drop");
    cr_expect_eq(fx.g.nodes[y].attr.dropout.salt, y, "salt is the op id");
    fx_token_loss(&fx, y);
    fx_fill(&fx, 0.5);
    cr_expect_eq(gradcheck(&fx), 3);
    fx_free(&fx);
}

/* Attention with padding (and optionally causal) masks, and every
 * transpose combination of the batched matmul:
 *   scores = Q K^T / sqrt(d)  [0,1];  c4 = P^T Vt^T  [1,1] with Vt = V^T P [1,0];
 *   c = P c4  [0,0]. */
static void check_attention(bool causal)
{
    Fx fx;
    fx_init(&fx, false, TC);
    IrGraph *g = &fx.g;
    int x = fx_embed(&fx, "x");
    int qkv[3];
    IrAttr heads = {.heads = {THEADS}};
    const char *nm[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; i++) {
        char wn[16], bn[16];
        snprintf(wn, sizeof wn, "%s.w", nm[i]);
        snprintf(bn, sizeof bn, "%s.b", nm[i]);
        int w = fx_param(&fx, wn, TH, TH), b = fx_param(&fx, bn, TH, 0);
        int t = ir_add(g, IR_OP_LINEAR, (int[]){x, w, b}, 3, NULL, nm[i]);
        qkv[i] = ir_add(g, IR_OP_SPLIT_HEADS, &t, 1, &heads, nm[i]);
    }
    IrAttr s01 = {.matmul = {false, true, 1.0 / sqrt(TH / THEADS)}};
    int sc = ir_add(g, IR_OP_MATMUL, (int[]){qkv[0], qkv[1]}, 2, &s01, "scores");
    IrAttr sm = {.softmax = {causal}};
    int p = ir_add(g, IR_OP_SOFTMAX, (int[]){sc, fx.mask}, 2, &sm, "probs");
    IrAttr m10 = {.matmul = {true, false, 1.0}}, m11 = {.matmul = {true, true, 0.5}},
           m00 = {.matmul = {false, false, 1.0}};
    int vt = ir_add(g, IR_OP_MATMUL, (int[]){qkv[2], p}, 2, &m10, "vt");   /* (d, L) */
    int c4 = ir_add(g, IR_OP_MATMUL, (int[]){p, vt}, 2, &m11, "c4");       /* (L, d) */
    int c = ir_add(g, IR_OP_MATMUL, (int[]){p, c4}, 2, &m00, "c");         /* (L, d) */
    c = ir_add(g, IR_OP_MERGE_HEADS, &c, 1, NULL, "ctx");
    fx_token_loss(&fx, c);
    fx_fill(&fx, 0.5);
    cr_expect_eq(gradcheck(&fx), 9);
    fx_free(&fx);
}

Test(autodiff_ops, attention_padding_mask) { check_attention(false); }
Test(autodiff_ops, attention_causal_mask) { check_attention(true); }

/* [CLS] pooling: slice the first token, dense + tanh, classifier, CE on (B). */
Test(autodiff_ops, slice_first_pooler_cross_entropy)
{
    Fx fx;
    fx_init(&fx, true, 3);
    int x = fx_embed(&fx, "x");
    int f = ir_add(&fx.g, IR_OP_SLICE_FIRST, &x, 1, NULL, "first");
    int w = fx_param(&fx, "pool.w", TH, TH), b = fx_param(&fx, "pool.b", TH, 0);
    int y = ir_add(&fx.g, IR_OP_LINEAR, (int[]){f, w, b}, 3, NULL, "pool");
    IrAttr a = {.act = {IR_ACT_TANH}};
    y = ir_add(&fx.g, IR_OP_ACT, &y, 1, &a, "tanh");
    int wc = fx_param(&fx, "cls.w", 3, TH);
    int logits = ir_add(&fx.g, IR_OP_LINEAR, (int[]){y, wc}, 2, NULL, "logits");
    int labels = ir_input(&fx.g, IR_IN_LABELS);
    fx.g.loss = ir_add(&fx.g, IR_OP_CROSS_ENTROPY, (int[]){logits, labels}, 2, NULL, "loss");
    fx_fill(&fx, 0.5);
    cr_expect_eq(gradcheck(&fx), 4);
    fx_free(&fx);
}

/* Last-token pooling (causal classifiers): SLICE_LAST reads row b's last
 * position with mask 1.  The forward value is checked against the
 * embedding row of that token (row 0: t = 7, row 1 padded: t = 4, then a
 * hole inside row 1 and an all-zero row 1: t = 0); the gradient check then
 * fails unless SLICE_LAST_BWD scatters to the same position. */
static void check_slice_last_forward(Fx *fx, int x, int f, const int want_t[TB])
{
    CpuExec ex;
    fx->g.n_params = fx->pl.n;
    cpu_exec_init(&ex, &fx->g, CPU_EXEC_F64);
    for (int p = 0; p < fx->pl.n; p++)
        if (fx->pl.p[p].tied_to < 0) cpu_exec_bind_param(&ex, p, fx->w[p]);
    run_loss(&ex, fx, false);
    const double *xv = cpu_exec_value(&ex, x), *fv = cpu_exec_value(&ex, f); /* (B, L, H), (B, H) */
    cr_assert_eq(cpu_exec_numel(&ex, f), TB * TH);
    for (int b = 0; b < TB; b++) {
        double energy = 0;
        for (int c = 0; c < TH; c++) {
            double want = xv[((int64_t)b * TL + want_t[b]) * TH + c];
            cr_expect(fv[b * TH + c] == want, "row %d col %d: %g, want token %d's %g", b, c,
                      fv[b * TH + c], want_t[b], want);
            energy += want * want;
        }
        cr_expect(energy > 0, "row %d: the picked embedding is all zero", b);
    }
    cpu_exec_free(&ex);
}

Test(autodiff_ops, slice_last_cross_entropy)
{
    Fx fx;
    fx_init(&fx, true, 3);
    int x = fx_embed(&fx, "x");
    int f = ir_add(&fx.g, IR_OP_SLICE_LAST, (int[]){x, fx.mask}, 2, NULL, "last");
    char buf[64];
    ir_shape_str(&fx.g.nodes[f], buf, sizeof buf);
    cr_expect_str_eq(buf, "(B, 16)");
    int w = fx_param(&fx, "cls.w", 3, TH), b = fx_param(&fx, "cls.b", 3, 0);
    int logits = ir_add(&fx.g, IR_OP_LINEAR, (int[]){f, w, b}, 3, NULL, "logits");
    int labels = ir_input(&fx.g, IR_IN_LABELS);
    fx.g.loss = ir_add(&fx.g, IR_OP_CROSS_ENTROPY, (int[]){logits, labels}, 2, NULL, "loss");
    fx_fill(&fx, 0.5);
    check_slice_last_forward(&fx, x, f, (int[TB]){TL - 1, 4});
    cr_expect_eq(gradcheck(&fx), 3);
    /* a zero inside the row does not move the last real token */
    fx.batch->attention_mask[TL + 2] = 0;
    check_slice_last_forward(&fx, x, f, (int[TB]){TL - 1, 4});
    /* a row with no real token reads token 0 */
    for (int t = 0; t < TL; t++) fx.batch->attention_mask[TL + t] = 0;
    check_slice_last_forward(&fx, x, f, (int[TB]){TL - 1, 0});
    fx_free(&fx);
}

Test(autodiff_ops, mse_regression)
{
    Fx fx;
    fx_init(&fx, true, 2);
    int x = fx_embed(&fx, "x");
    int f = ir_add(&fx.g, IR_OP_SLICE_FIRST, &x, 1, NULL, "first");
    int w = fx_param(&fx, "reg.w", 1, TH), b = fx_param(&fx, "reg.b", 1, 0);
    int y = ir_add(&fx.g, IR_OP_LINEAR, (int[]){f, w, b}, 3, NULL, "pred");
    int t = ir_input(&fx.g, IR_IN_TARGETS);
    fx.g.loss = ir_add(&fx.g, IR_OP_MSE, (int[]){y, t}, 2, NULL, "loss");
    fx_fill(&fx, 0.5);
    cr_expect_eq(gradcheck(&fx), 3);
    fx_free(&fx);
}

/* ---- whole models ------------------------------------------------------ */

static void tiny_spec(ModelSpec *s)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "tiny");
    s->stack.vocab_size = TV;
    s->stack.max_positions = 16;
    s->stack.hidden = TH;
    s->stack.heads = THEADS;
    s->stack.layers = 2;
    s->stack.ffn = 32;
    s->stack.ln_eps = 1e-5;
    s->head.num_labels = 3;
}

/* Lowers the spec and checks every parameter; returns how many. */
static int check_model(const ModelSpec *spec, bool seq_labels, int classes)
{
    Fx fx;
    fx_init(&fx, seq_labels, classes);
    ir_free(&fx.g); /* lower_model makes its own inputs */
    ir_init(&fx.g);
    HpcError err = {0};
    cr_assert_eq(lower_model(spec, &fx.g, &fx.pl, &err), HPC_OK, "%s", err.msg);
    fx_fill(&fx, 0.3);
    int n = gradcheck(&fx);
    fx_free(&fx);
    return n;
}

Test(autodiff_model, bert_tiny_seq_classification, .timeout = 120)
{
    ModelSpec s;
    tiny_spec(&s);
    /* 5 embedding tensors + 16 per layer + pooler 2 + classifier 2 */
    cr_expect_eq(check_model(&s, true, 3), 5 + 2 * 16 + 4);
}

Test(autodiff_model, gpt_tiny_causal_lm_tied, .timeout = 120)
{
    ModelSpec s;
    tiny_spec(&s);
    s.stack.kind = STACK_DECODER;
    s.stack.norm = NORM_PRE;
    s.stack.attention = ATTN_CAUSAL;
    s.stack.embedding_ln = false;
    s.stack.final_ln = true;
    s.stack.type_vocab_size = 0;
    s.stack.activation = ACT_GELU_TANH;
    s.head.kind = HEAD_CAUSAL_LM;
    s.head.tie_word_embeddings = true;
    s.head.decoder_bias = false;
    /* word, position + 16 per layer + ln_f 2; the tied lm_head has no grad of its own */
    cr_expect_eq(check_model(&s, false, TV), 2 + 2 * 16 + 2);
}

Test(autodiff_model, gpt_tiny_seq_classification_last_token, .timeout = 120)
{
    ModelSpec s;
    tiny_spec(&s);
    s.stack.kind = STACK_DECODER;
    s.stack.norm = NORM_PRE;
    s.stack.attention = ATTN_CAUSAL;
    s.stack.embedding_ln = false;
    s.stack.final_ln = true;
    s.stack.type_vocab_size = 0;
    s.stack.activation = ACT_GELU_TANH;
    s.head.kind = HEAD_SEQ_CLASSIFICATION;
    s.head.pooler = false;
    /* word, position + 16 per layer + ln_f 2 + classifier 2 */
    cr_expect_eq(check_model(&s, true, 3), 2 + 2 * 16 + 2 + 2);
}

Test(autodiff_model, bert_tiny_masked_lm_tied, .timeout = 120)
{
    ModelSpec s;
    tiny_spec(&s);
    s.head.kind = HEAD_MASKED_LM;
    s.stack.activation = ACT_RELU;
    /* 5 + 32 + transform dense 2 + LN 2 + decoder bias 1 */
    cr_expect_eq(check_model(&s, false, TV), 5 + 2 * 16 + 5);
}

Test(autodiff_model, frozen_layers_get_no_gradient)
{
    ModelSpec s;
    tiny_spec(&s);
    s.train.freeze_embeddings = true;
    s.train.freeze_layers = 1;
    IrGraph g;
    ParamList pl;
    ir_init(&g);
    params_init(&pl);
    HpcError err = {0};
    cr_assert_eq(lower_model(&s, &g, &pl, &err), HPC_OK);
    cr_assert_eq(autodiff_build(&g, &pl, &err), HPC_OK, "%s", err.msg);
    int with = 0;
    for (int p = 0; p < pl.n; p++) {
        bool frozen = strstr(pl.p[p].name, "embeddings") || strstr(pl.p[p].name, "layer.0.");
        cr_expect_eq(pl.p[p].frozen, frozen, "%s", pl.p[p].name);
        cr_expect_eq(g.param_grad[p] >= 0, !frozen, "%s", pl.p[p].name);
        with += g.param_grad[p] >= 0;
    }
    cr_expect_eq(with, 16 + 4);
    ir_free(&g);
    params_free(&pl);
}

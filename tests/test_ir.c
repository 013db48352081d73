/* tests/test_ir.c — the graph IR: builders and shape rules, the op table,
 * autodiff's structure, the cpu executor's CAST rounding, and the pinned
 * `--ir` listing of bert_tiny.
 *
 * The golden file tests/golden/bert_tiny.ir was made by
 *   bin/hpc compile models/bert_tiny.model --ir --no-fuse --no-artifact > tests/golden/bert_tiny.ir
 * and is reviewed by hand: regenerate it with that command only when a
 * change to the lowering or autodiff is intended, and read the diff.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "data/batch.h"
#include "cpu/cpu_exec.h"
#include "cpu/half.h"
#include "compiler/ir_build.h"
#include "program/ir.h"
#include "compiler/ir_print.h"
#include "lower.h"
#include "program/params.h"
#include "precision.h"
#include "program/spec.h"
#include "compiler/spec_load.h"

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = '\0';
    fclose(f);
    return s;
}

static void root_path(char *buf, size_t n, const char *rel)
{
    const char *root = getenv("HPC_ROOT");
    snprintf(buf, n, "%s/%s", root ? root : ".", rel);
}

Test(ir_golden, bert_tiny_listing_matches)
{
    char model[512], golden[512];
    root_path(model, sizeof model, "models/bert_tiny.model");
    root_path(golden, sizeof golden, "tests/golden/bert_tiny.ir");
    ModelSpec spec;
    cr_assert_eq(spec_load(model, &spec, stderr), 0, "cannot load %s", model);
    IrGraph g;
    ParamList pl;
    ir_init(&g);
    params_init(&pl);
    HpcError err = {0};
    cr_assert_eq(lower_model(&spec, &g, &pl, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(autodiff_build(&g, &pl, &err), HPC_OK, "%s", err.msg);
    char *got = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&got, &len);
    ir_print(&g, mem);
    fclose(mem);
    char *want = read_all(golden);
    cr_assert(want, "cannot read %s", golden);
    /* report the first differing line, not the whole file */
    const char *a = got, *b = want, *la = got, *lb = want;
    int line = 1;
    for (; *a && *a == *b; a++, b++)
        if (*a == '\n') line++, la = a + 1, lb = b + 1;
    int na = (int)strcspn(la, "\n"), nb = (int)strcspn(lb, "\n");
    cr_expect(*a == '\0' && *b == '\0', "listing differs from %s at line %d:\n got: %.*s\nwant: %.*s",
              golden, line, na, la, nb, lb);
    free(got);
    free(want);
    ir_free(&g);
    params_free(&pl);
}

Test(ir, op_table_is_consistent)
{
    for (int i = 0; i < IR_OP_COUNT; i++) {
        const IrOpInfo *info = ir_op_info((IrOpKind)i);
        cr_expect(info->name && ir_shape_rule((IrOpKind)i) && ir_grad_rule((IrOpKind)i) &&
                  info->min_inputs <= info->max_inputs);
        cr_expect(info->max_inputs <= IR_MAX_INPUTS);
        for (int j = 0; j < i; j++) cr_expect_str_neq(info->name, ir_op_name((IrOpKind)j));
    }
    cr_expect_str_eq(ir_op_name(IR_OP_LAYERNORM), "layernorm");
}

Test(ir, shapes_of_attention_ops)
{
    IrGraph g;
    ir_init(&g);
    int ids = ir_input(&g, IR_IN_INPUT_IDS);
    int mask = ir_input(&g, IR_IN_ATTN_MASK);
    int t = ir_param(&g, 0, DT_F32, 2, (int64_t[]){100, 12}, "table");
    int x = ir_add(&g, IR_OP_EMBEDDING, (int[]){t, ids}, 2, NULL, "x");
    IrAttr h = {.heads = {3}};
    int q = ir_add(&g, IR_OP_SPLIT_HEADS, &x, 1, &h, "q");
    IrAttr m = {.matmul = {false, true, 0.5}};
    int s = ir_add(&g, IR_OP_MATMUL, (int[]){q, q}, 2, &m, "s");
    int p = ir_add(&g, IR_OP_SOFTMAX, (int[]){s, mask}, 2, &(IrAttr){.softmax = {true}}, "p");
    int c = ir_add(&g, IR_OP_MERGE_HEADS, &q, 1, NULL, "c");
    char buf[64];
    ir_shape_str(&g.nodes[x], buf, sizeof buf);
    cr_expect_str_eq(buf, "(B, L, 12)");
    ir_shape_str(&g.nodes[q], buf, sizeof buf);
    cr_expect_str_eq(buf, "(B, 3, L, 4)");
    ir_shape_str(&g.nodes[p], buf, sizeof buf);
    cr_expect_str_eq(buf, "(B, 3, L, L)");
    ir_shape_str(&g.nodes[c], buf, sizeof buf);
    cr_expect_str_eq(buf, "(B, L, 12)");
    cr_expect_eq(ir_numel(&g.nodes[s], 2, 5), 2 * 3 * 5 * 5);
    cr_expect_eq(ir_rows(&g.nodes[s], 2, 5), 2 * 3 * 5);
    ir_free(&g);
}

/* A multi-output node (LAYERNORM_FWD: y, mean, rstd): its projections'
 * shapes, names and listing, copying, and the cpu reference writing all
 * three, checked against LAYERNORM's y and statistics computed in double. */
Test(ir, multi_output_layernorm)
{
    IrGraph g;
    ir_init(&g);
    int ids = ir_input(&g, IR_IN_INPUT_IDS);
    int t = ir_param(&g, 0, DT_F32, 2, (int64_t[]){7, 6}, "table");
    int gm = ir_param(&g, 1, DT_F32, 1, (int64_t[]){6}, "gamma");
    int bt = ir_param(&g, 2, DT_F32, 1, (int64_t[]){6}, "beta");
    int x = ir_add(&g, IR_OP_EMBEDDING, (int[]){t, ids}, 2, NULL, "x");
    IrAttr na = {.norm = {1e-5}};
    int outs[3];
    int ln = ir_add_outputs(&g, IR_OP_LAYERNORM_FWD, (int[]){x, gm, bt}, 3, &na, "ln", outs);
    int ref = ir_add(&g, IR_OP_LAYERNORM, (int[]){x, gm, bt}, 3, &na, "ref");
    g.n_params = 3;
    cr_expect_eq(ir_op_info(IR_OP_LAYERNORM_FWD)->n_outputs, 3);
    cr_expect_eq(outs[0], ln);
    cr_expect_eq(outs[1], ln + 1);
    cr_expect_eq(outs[2], ln + 2);
    cr_expect_eq(ir_output(&g, ln, 2), outs[2]);
    cr_expect_eq(ir_output(&g, ref, 1), -1);
    char buf[64];
    ir_shape_str(&g.nodes[outs[1]], buf, sizeof buf);
    cr_expect_str_eq(buf, "(B, L)");
    cr_expect_eq(g.nodes[outs[2]].dtype, DT_F32);
    cr_expect_str_eq(g.nodes[outs[1]].name, "ln.mean");
    cr_expect_str_eq(g.nodes[outs[2]].name, "ln.rstd");

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ir_print(&g, f);
    fclose(f);
    char want[64];
    snprintf(want, sizeof want, "output(%%%d)", ln);
    cr_expect(strstr(text, want) && strstr(text, "index=2"), "listing:\n%s", text);
    free(text);

    /* A pass that rebuilds the graph keeps the projections on the copy. */
    IrGraph c;
    ir_init(&c);
    int map[16];
    for (int i = 0; i < g.n; i++) map[i] = ir_copy_node(&c, &g.nodes[i], map);
    cr_expect_eq(ir_output(&c, map[ln], 1), map[outs[1]]);
    ir_free(&c);

    /* fp16: y is stored in f16, the statistics stay f32 and read the op itself. */
    ModelSpec spec;
    spec_defaults(&spec);
    IrGraph h;
    ir_init(&h);
    PrecisionPlan plan;
    HpcError perr = {0};
    g.n_forward = g.n;
    cr_assert_eq(precision_plan(&g, &spec, PREC_FP16, &h, &plan, &perr), HPC_OK, "%s", perr.msg);
    int hl = plan.map[ln], hm = plan.map[outs[1]];
    cr_expect_eq(h.nodes[hl].op, IR_OP_LAYERNORM_FWD);
    cr_expect_eq(h.nodes[hl].dtype, DT_F16);
    cr_expect_eq(h.nodes[hm].op, IR_OP_OUTPUT);
    cr_expect_eq(h.nodes[hm].in[0], hl);
    cr_expect_eq(h.nodes[hm].dtype, DT_F32);
    precision_plan_free(&plan);
    ir_free(&h);

    float table[42], gamma[6], beta[6];
    for (int i = 0; i < 42; i++) table[i] = sinf(0.7f * (float)i) * 2.0f + 0.3f;
    for (int i = 0; i < 6; i++) gamma[i] = 1.0f + 0.1f * (float)i, beta[i] = 0.05f * (float)i - 0.1f;
    Batch *b = batch_new(2, 3, 0);
    for (int i = 0; i < 6; i++) b->input_ids[i] = (i * 5 + 1) % 7;
    CpuExec ex;
    cpu_exec_init(&ex, &g, CPU_EXEC_F32);
    cpu_exec_bind_param(&ex, 0, table);
    cpu_exec_bind_param(&ex, 1, gamma);
    cpu_exec_bind_param(&ex, 2, beta);
    HpcError err = {0};
    CpuRunOptions o = {.loss_scale = 1};
    cr_assert_eq(cpu_exec_run(&ex, b, &o, &err), HPC_OK, "%s", err.msg);
    const float *y = cpu_exec_value(&ex, ln), *yr = cpu_exec_value(&ex, ref);
    const float *mean = cpu_exec_value(&ex, outs[1]), *rstd = cpu_exec_value(&ex, outs[2]);
    for (int r = 0; r < 6; r++) {
        const float *row = table + 6 * b->input_ids[r];
        double m = 0, v = 0;
        for (int k = 0; k < 6; k++) m += row[k];
        m /= 6;
        for (int k = 0; k < 6; k++) v += (row[k] - m) * (row[k] - m);
        double rs = 1.0 / sqrt(v / 6 + 1e-5);
        cr_expect(fabs(mean[r] - m) <= 1e-6 * (fabs(m) + 1), "row %d mean %g, want %g", r, mean[r], m);
        cr_expect(fabs(rstd[r] - rs) <= 1e-5 * rs, "row %d rstd %g, want %g", r, rstd[r], rs);
        for (int k = 0; k < 6; k++) cr_expect_eq(y[6 * r + k], yr[6 * r + k]);
    }
    cpu_exec_free(&ex);
    batch_free(b);
    ir_free(&g);
}

Test(ir, bad_shapes_panic, .signal = SIGABRT)
{
    IrGraph g;
    ir_init(&g);
    int ids = ir_input(&g, IR_IN_INPUT_IDS);
    int t = ir_param(&g, 0, DT_F32, 2, (int64_t[]){100, 12}, "table");
    int x = ir_add(&g, IR_OP_EMBEDDING, (int[]){t, ids}, 2, NULL, "x");
    int w = ir_param(&g, 1, DT_F32, 2, (int64_t[]){8, 13}, "w"); /* in 13 != 12 */
    ir_add(&g, IR_OP_LINEAR, (int[]){x, w}, 2, NULL, "y");
}

static void tiny(ModelSpec *s)
{
    spec_defaults(s);
    s->stack.vocab_size = 40;
    s->stack.max_positions = 16;
    s->stack.hidden = 8;
    s->stack.heads = 2;
    s->stack.layers = 1;
    s->stack.ffn = 16;
}

Test(ir, tied_decoder_accumulates_into_word_embeddings)
{
    ModelSpec s;
    tiny(&s);
    s.head.kind = HEAD_MASKED_LM;
    IrGraph g;
    ParamList pl;
    ir_init(&g);
    params_init(&pl);
    HpcError err = {0};
    cr_assert_eq(lower_model(&s, &g, &pl, &err), HPC_OK);
    cr_assert_eq(autodiff_build(&g, &pl, &err), HPC_OK);
    int dec = params_find(&pl, "cls.predictions.decoder.weight");
    int word = params_find(&pl, "bert.embeddings.word_embeddings.weight");
    cr_assert(dec >= 0 && word >= 0);
    cr_expect_eq(pl.p[dec].tied_to, word);
    cr_expect_eq(g.param_grad[dec], -1);
    /* the word embedding's gradient sums the decoder's and the gather's */
    const IrNode *gw = &g.nodes[g.param_grad[word]];
    cr_expect_eq(gw->op, IR_OP_ADD);
    cr_expect(gw->backward);
    bool seen_dw = false, seen_emb = false;
    for (int k = 0; k < 2; k++) {
        seen_dw |= g.nodes[gw->in[k]].op == IR_OP_LINEAR_DW;
        seen_emb |= g.nodes[gw->in[k]].op == IR_OP_EMBEDDING_BWD;
    }
    cr_expect(seen_dw && seen_emb);
    cr_expect_eq(params_total(&pl), 40 * 8 + 16 * 8 + 2 * 8 + 2 * 8 /* embeddings */
                 + 4 * (8 * 8 + 8) + 2 * 2 * 8 + (8 * 16 + 16) + (16 * 8 + 8) /* layer */
                 + (8 * 8 + 8) + 2 * 8 + 40 /* transform, LN, decoder bias */);
    for (int i = 0; i < g.n_forward; i++) cr_expect(!g.nodes[i].backward);
    for (int i = g.n_forward; i < g.n; i++) cr_expect(g.nodes[i].backward, "%%%d", i);
    ir_free(&g);
    params_free(&pl);
}

/* A causal stack with a sequence classifier pools the last real token
 * (slice_last, reading attention_mask) as HF GPT2ForSequenceClassification;
 * its gradient goes back through slice_last_bwd with the same mask. */
Test(ir, causal_classifier_pools_the_last_token)
{
    ModelSpec s;
    tiny(&s);
    s.stack.kind = STACK_DECODER;
    s.stack.norm = NORM_PRE;
    s.stack.attention = ATTN_CAUSAL;
    s.stack.embedding_ln = false;
    s.stack.final_ln = true;
    s.stack.type_vocab_size = 0;
    s.head.kind = HEAD_SEQ_CLASSIFICATION;
    s.head.pooler = false;
    s.head.num_labels = 3;
    IrGraph g;
    ParamList pl;
    ir_init(&g);
    params_init(&pl);
    HpcError err = {0};
    cr_assert_eq(lower_model(&s, &g, &pl, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(autodiff_build(&g, &pl, &err), HPC_OK, "%s", err.msg);
    int n_last = 0, n_last_bwd = 0, n_first = 0, pooled = -1;
    for (int i = 0; i < g.n; i++) {
        const IrNode *n = &g.nodes[i];
        n_first += n->op == IR_OP_SLICE_FIRST || n->op == IR_OP_SLICE_FIRST_BWD;
        if (n->op == IR_OP_SLICE_LAST) {
            n_last++;
            pooled = i;
            cr_expect_eq(g.nodes[n->in[1]].op, IR_OP_INPUT);
            cr_expect_eq(g.nodes[n->in[1]].attr.input.kind, IR_IN_ATTN_MASK);
        }
        if (n->op == IR_OP_SLICE_LAST_BWD) {
            n_last_bwd++;
            cr_expect(n->backward);
            cr_expect_eq(g.nodes[n->in[1]].attr.input.kind, IR_IN_ATTN_MASK);
        }
    }
    cr_expect_eq(n_last, 1);
    cr_expect_eq(n_last_bwd, 1);
    cr_expect_eq(n_first, 0);
    cr_assert(pooled >= 0);
    char buf[64];
    ir_shape_str(&g.nodes[pooled], buf, sizeof buf);
    cr_expect_str_eq(buf, "(B, 8)");
    ir_free(&g);
    params_free(&pl);

    /* the same head on a bidirectional stack keeps [CLS] pooling */
    tiny(&s);
    s.head.kind = HEAD_SEQ_CLASSIFICATION;
    ir_init(&g);
    params_init(&pl);
    cr_assert_eq(lower_model(&s, &g, &pl, &err), HPC_OK, "%s", err.msg);
    n_last = n_first = 0;
    for (int i = 0; i < g.n; i++) {
        n_first += g.nodes[i].op == IR_OP_SLICE_FIRST;
        n_last += g.nodes[i].op == IR_OP_SLICE_LAST;
    }
    cr_expect_eq(n_first, 1);
    cr_expect_eq(n_last, 0);
    ir_free(&g);
    params_free(&pl);
}

/* CAST to f16/bf16 in the f32 executor rounds exactly like runtime/cpu/half.h. */
Test(cpu_exec, cast_rounds_to_16_bits)
{
    IrGraph g;
    ir_init(&g);
    int ids = ir_input(&g, IR_IN_INPUT_IDS);
    int t = ir_param(&g, 0, DT_F32, 2, (int64_t[]){4, 3}, "table");
    int x = ir_add(&g, IR_OP_EMBEDDING, (int[]){t, ids}, 2, NULL, "x");
    int h = ir_add(&g, IR_OP_CAST, &x, 1, &(IrAttr){.cast = {DT_F16}}, "h");
    int b = ir_add(&g, IR_OP_CAST, &x, 1, &(IrAttr){.cast = {DT_BF16}}, "b");
    int low = ir_param(&g, 0, DT_F16, 2, (int64_t[]){4, 3}, "table.f16"); /* a low copy */
    g.n_params = 1;
    g.n_forward = g.n;
    float table[12];
    for (int i = 0; i < 12; i++) table[i] = 1.0f + (float)i * 0.123456789f + 1e-4f;
    Batch *bt = batch_new(1, 4, 0);
    for (int i = 0; i < 4; i++) bt->input_ids[i] = 3 - i;
    CpuExec ex;
    cpu_exec_init(&ex, &g, CPU_EXEC_F32);
    cpu_exec_bind_param(&ex, 0, table);
    HpcError err = {0};
    CpuRunOptions o = {.loss_scale = 1};
    cr_assert_eq(cpu_exec_run(&ex, bt, &o, &err), HPC_OK, "%s", err.msg);
    const float *xv = cpu_exec_value(&ex, x), *hv = cpu_exec_value(&ex, h), *bv = cpu_exec_value(&ex, b);
    for (int i = 0; i < 12; i++) {
        cr_expect_eq(xv[i], table[(3 - i / 3) * 3 + i % 3]);
        cr_expect_eq(hv[i], half_round(xv[i]));
        cr_expect_eq(bv[i], bf16_round(xv[i]));
        cr_expect_neq(hv[i], xv[i]); /* the values need more than 11 bits */
    }
    const float *lv = cpu_exec_value(&ex, low);
    cr_expect_neq(lv, table);
    for (int i = 0; i < 12; i++) {
        cr_expect_eq(lv[i], half_round(table[i]));
        cr_expect_eq(table[i], 1.0f + (float)i * 0.123456789f + 1e-4f, "the master is untouched");
    }
    cpu_exec_free(&ex);
    batch_free(bt);
    ir_free(&g);
}

/* The same model in f32 and f64 gives the same loss and gradients to f32
 * accuracy (the f32 path is what training uses). */
Test(cpu_exec, f32_matches_f64)
{
    ModelSpec s;
    tiny(&s);
    IrGraph g;
    ParamList pl;
    ir_init(&g);
    params_init(&pl);
    HpcError err = {0};
    cr_assert_eq(lower_model(&s, &g, &pl, &err), HPC_OK);
    cr_assert_eq(autodiff_build(&g, &pl, &err), HPC_OK);
    Batch *bt = batch_new(2, 8, 0);
    for (int i = 0; i < 16; i++) {
        bt->input_ids[i] = (i * 7 + 3) % 40;
        bt->attention_mask[i] = i < 13;
        bt->token_type_ids[i] = i % 8 > 4;
    }
    bt->labels[0] = 1;
    bt->labels[1] = 0;
    float **w32 = calloc((size_t)pl.n, sizeof *w32);
    double **w64 = calloc((size_t)pl.n, sizeof *w64);
    CpuExec e32, e64;
    cpu_exec_init(&e32, &g, CPU_EXEC_F32);
    cpu_exec_init(&e64, &g, CPU_EXEC_F64);
    for (int p = 0; p < pl.n; p++) {
        int64_t n = params_numel(&pl.p[p]);
        w32[p] = malloc((size_t)n * sizeof(float));
        w64[p] = malloc((size_t)n * sizeof(double));
        for (int64_t k = 0; k < n; k++) {
            w32[p][k] = (float)(0.3 * sin(1.7 * (double)(k + 31 * p)));
            w64[p][k] = w32[p][k];
        }
        cpu_exec_bind_param(&e32, p, w32[p]);
        cpu_exec_bind_param(&e64, p, w64[p]);
    }
    CpuRunOptions o = {.training = true, .backward = true, .seed = 5, .step = 1, .loss_scale = 1};
    cr_assert_eq(cpu_exec_run(&e32, bt, &o, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(cpu_exec_run(&e64, bt, &o, &err), HPC_OK, "%s", err.msg);
    double l32 = cpu_exec_loss(&e32), l64 = cpu_exec_loss(&e64);
    cr_expect(fabs(l32 - l64) <= 1e-5 * fabs(l64), "loss f32 %.9g f64 %.9g", l32, l64);
    for (int p = 0; p < pl.n; p++) {
        const float *a = cpu_exec_value(&e32, g.param_grad[p]);
        const double *b = cpu_exec_value(&e64, g.param_grad[p]);
        double num = 0, den = 0;
        for (int64_t k = 0; k < params_numel(&pl.p[p]); k++) {
            num += (a[k] - b[k]) * (a[k] - b[k]);
            den += b[k] * b[k];
        }
        if (strstr(pl.p[p].name, "key.bias")) continue; /* exactly 0 in theory */
        cr_expect(den > 0 && sqrt(num / den) < 1e-4, "%s: rel %.3g", pl.p[p].name, sqrt(num / den));
    }
    for (int p = 0; p < pl.n; p++) {
        free(w32[p]);
        free(w64[p]);
    }
    free(w32);
    free(w64);
    cpu_exec_free(&e32);
    cpu_exec_free(&e64);
    batch_free(bt);
    ir_free(&g);
    params_free(&pl);
}

/* Rebuilding a graph node by node (what precision and fuse passes do)
 * gives the same listing. */
Test(ir, copy_node_rebuilds_the_same_graph)
{
    ModelSpec s;
    tiny(&s);
    IrGraph g, h;
    ParamList pl;
    ir_init(&g);
    ir_init(&h);
    params_init(&pl);
    HpcError err = {0};
    cr_assert_eq(lower_model(&s, &g, &pl, &err), HPC_OK);
    cr_assert_eq(autodiff_build(&g, &pl, &err), HPC_OK);
    int *map = malloc((size_t)g.n * sizeof *map);
    for (int i = 0; i < g.n; i++) map[i] = ir_copy_node(&h, &g.nodes[i], map);
    ir_copy_roles(&h, &g, map);
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    FILE *fa = open_memstream(&a, &na), *fb = open_memstream(&b, &nb);
    ir_print(&g, fa);
    ir_print(&h, fb);
    fclose(fa);
    fclose(fb);
    cr_expect_str_eq(a, b);
    free(a);
    free(b);
    free(map);
    ir_free(&g);
    ir_free(&h);
    params_free(&pl);
}

/* A mixed-precision rebuild: every linear computes in f16 (inputs cast to
 * f16, output cast back to f32).  The f32 executor rounds those values, so
 * the loss moves by about fp16's precision but not further. */
Test(cpu_exec, f16_linears_change_the_loss_slightly)
{
    ModelSpec s;
    tiny(&s);
    IrGraph g, h;
    ParamList pl;
    ir_init(&g);
    ir_init(&h);
    params_init(&pl);
    HpcError err = {0};
    cr_assert_eq(lower_model(&s, &g, &pl, &err), HPC_OK);
    int *map = malloc((size_t)g.n * sizeof *map);
    int casts = 0;
    for (int i = 0; i < g.n; i++) {
        IrNode n = g.nodes[i];
        if (n.op != IR_OP_LINEAR) {
            map[i] = ir_copy_node(&h, &n, map);
            continue;
        }
        IrNode c = n;
        int in[IR_MAX_INPUTS];
        for (int k = 0; k < n.n_in; k++) in[k] = ir_cast(&h, map[n.in[k]], DT_F16);
        int y = ir_add(&h, IR_OP_LINEAR, in, n.n_in, NULL, c.name);
        cr_expect_eq(h.nodes[y].dtype, DT_F16);
        map[i] = ir_cast(&h, y, DT_F32);
        casts++;
    }
    ir_copy_roles(&h, &g, map);
    cr_expect_gt(casts, 5);
    Batch *bt = batch_new(2, 8, 0);
    for (int i = 0; i < 16; i++) {
        bt->input_ids[i] = (i * 5 + 1) % 40;
        bt->attention_mask[i] = 1;
    }
    bt->labels[0] = 0;
    bt->labels[1] = 1;
    float **w = calloc((size_t)pl.n, sizeof *w);
    CpuExec e32, e16;
    cpu_exec_init(&e32, &g, CPU_EXEC_F32);
    cpu_exec_init(&e16, &h, CPU_EXEC_F32);
    for (int p = 0; p < pl.n; p++) {
        int64_t n = params_numel(&pl.p[p]);
        w[p] = malloc((size_t)n * sizeof(float));
        for (int64_t k = 0; k < n; k++) w[p][k] = (float)(0.5 * cos(0.37 * (double)(k + 13 * p)));
        cpu_exec_bind_param(&e32, p, w[p]);
        cpu_exec_bind_param(&e16, p, w[p]);
    }
    CpuRunOptions o = {.loss_scale = 1};
    cr_assert_eq(cpu_exec_run(&e32, bt, &o, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(cpu_exec_run(&e16, bt, &o, &err), HPC_OK, "%s", err.msg);
    double a = cpu_exec_loss(&e32), b = cpu_exec_loss(&e16);
    cr_expect(fabs(a - b) > 0 && fabs(a - b) < 1e-2 * fabs(a), "f32 %.9g, f16 linears %.9g", a, b);
    for (int p = 0; p < pl.n; p++) free(w[p]);
    free(w);
    free(map);
    cpu_exec_free(&e32);
    cpu_exec_free(&e16);
    batch_free(bt);
    ir_free(&g);
    ir_free(&h);
    params_free(&pl);
}

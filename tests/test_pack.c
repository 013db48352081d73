/* tests/test_pack.c — packed batches (docs/packing.md) on the cpu backend.
 *
 * Equality: a packed step equals the padded step of the same rows.  A
 * tiny BERT (hidden 32, 2 heads of 16, 2 layers) with random weights runs
 * the padded program (pack off: the default unfused attention under fp32,
 * and the fused node) on a padded batch and the packed program on the
 * packed batch of the same six rows (lengths 16, 1, 7, 12, 3, 16: a
 * one-token row and two full-length rows; the loader makes both batches
 * from one Dataset, no shuffle).  Random token ids.  Dropout is off for the
 * equality (eval-mode forward, backward on): loss and every parameter
 * gradient, relative L2 error, under
 *   f64 executor  1e-10   f32 executor  1e-5  (brief: far under 1e-4)
 * for a sequence classifier (first token), a token classifier (labels per
 * slot, -100 on padding), a masked LM with a tied decoder, and a causal
 * decoder with a sequence classifier (last token of each span).
 * Dropout on: each packed sequence's attention (ctx rows, lse block) is the
 * padded fused node at B = 1, L = len_b with the Philox key seed ^
 * span_seed(start_b), bit for bit; a packed step gives finite gradients
 * that differ from the dropout-off step, and a packed bert_tiny-sized run trains a synthetic
 * task to > 90% dev accuracy through the trainer.
 * Loader: spans, tokens, types, masks and labels of a packed batch from a
 * small TSV file, L = ceil(tokens / B), and the in-graph position ids
 * (SPAN_POSITIONS) restart in every span; the slot count that sizes a
 * packed run is what its batches need.
 * Errors: a packed program with the unfused attention forced
 * (HPC_ATTENTION=unfused), a packed causal LM, a padded batch given to a
 * packed program, spans outside the slots; a packed program carries its
 * CUDA kernels under fp16/bf16 and none under fp32 (no varlen attention
 * kernel there: the cuda backend refuses it).  CUDA (no GPU needed): the span_positions / span_token /
 * span_token_bwd kernels (f32, f16) and whole packed step modules (fp16,
 * bf16; the default one-pass backward (v4) and HPC_ATTN_KERNELS=v3 / v2 / v1; Q, K
 * and V unstacked and as one QKV GEMM; head sizes 16 and 64, causal too)
 * compile with NVRTC for sm_80 and sm_90. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/attention_form.h"
#include "compiler/emit_lib.h"
#include "compiler/emit_ops.h"
#include "compiler/ir_build.h"
#include "cuda/nvrtc_compile.h"
#include "compiler/pipeline.h"
#include "compiler/step_program_build.h"
#include "cpu/cpu_exec.h"
#include "cpu/philox.h"
#include "data/batch.h"
#include "data/glue.h"
#include "data/loader.h"
#include "data/synthetic.h"
#include "data/tokenizer.h"
#include "program/ir.h"
#include "program/params.h"
#include "program/spec.h"
#include "train/trainer.h"
#include "cpu_step.h"

enum { PV = 60, PC = 3, PB = 6, PMAX = 16 };
static const int32_t ROW_LENS[PB] = {16, 1, 7, 12, 3, 16};

typedef enum { H_SEQ, H_TOKEN, H_MLM, H_CAUSAL_SEQ } HeadCase;

static void spec_for(ModelSpec *s, HeadCase h, bool pack)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "tiny_pack");
    s->stack.vocab_size = PV;
    s->stack.max_positions = 32;
    s->stack.hidden = 32;
    s->stack.heads = 2;
    s->stack.layers = 2;
    s->stack.ffn = 64;
    s->stack.ln_eps = 1e-5;
    s->stack.hidden_dropout = 0.1;
    s->stack.attention_dropout = 0.1;
    s->head.num_labels = PC;
    if (h == H_TOKEN) s->head.kind = HEAD_TOKEN_CLASSIFICATION;
    if (h == H_MLM) {
        s->head.kind = HEAD_MASKED_LM;
        s->head.tie_word_embeddings = true;
        s->head.decoder_bias = true;
    }
    if (h == H_CAUSAL_SEQ) {
        s->stack.kind = STACK_DECODER;
        s->stack.attention = ATTN_CAUSAL;
        s->stack.norm = NORM_PRE;
        s->stack.embedding_ln = false;
        s->stack.final_ln = true;
        s->stack.type_vocab_size = 0;
        s->head.pooler = false;
    }
    s->train.batch_size = PB;
    s->train.max_seq_len = PMAX;
    s->train.pack = pack;
}

/* The six rows: random ids in [3, PV), types 0 then 1, label b % PC. */
static void make_rows(Dataset *d)
{
    dataset_init(d, "pack_rows");
    HpcError err = {0};
    for (int b = 0; b < PB; b++) {
        int32_t ids[PMAX], types[PMAX];
        for (int t = 0; t < ROW_LENS[b]; t++) {
            ids[t] = 3 + (int32_t)(philox_uniform(11, (uint64_t)(b * 100 + t), 0, 5) * (PV - 3));
            types[t] = t >= ROW_LENS[b] / 2;
        }
        cr_assert_eq(dataset_add(d, ids, types, ROW_LENS[b], b % PC, 0, &err), HPC_OK, "%s", err.msg);
    }
}

static Batch *first_batch(const Dataset *d, bool pack)
{
    Loader ld;
    HpcError err = {0};
    cr_assert_eq(loader_init(&ld, d, PB, PMAX, 1, false, false, &err), HPC_OK, "%s", err.msg);
    loader_set_pack(&ld, pack);
    Batch *b = loader_next(&ld);
    cr_assert_not_null(b);
    loader_free(&ld);
    return b;
}

/* Token labels for the token-level heads, the same per real token in both
 * layouts (a function of the row and position), -100 elsewhere. */
static void token_labels(Batch *bt, HeadCase h)
{
    if (h != H_TOKEN && h != H_MLM) return;
    int64_t slots = bt->B * bt->L;
    for (int64_t i = 0; i < slots; i++) bt->labels[i] = -100;
    for (int64_t b = 0; b < bt->B; b++) {
        int64_t start = bt->seq_spans ? bt->seq_spans[2 * b] : b * bt->L;
        for (int t = 0; t < ROW_LENS[b]; t++) {
            double u = philox_uniform(13, (uint64_t)(b * 100 + t), 0, 7);
            int32_t lab = h == H_TOKEN ? (int32_t)(u * PC) : (u < 0.4 ? (int32_t)(u * 1000) % PV : -100);
            bt->labels[start + t] = lab;
        }
    }
}

/* A step of pipeline p on the cpu executor (tests/cpu_step.h), dropout on or off. */
static StepOut run_step(const Pipeline *p, double **w, CpuExecPrecision prec, const Batch *b, bool dropout)
{
    return cpu_step_run_dropout(&p->g, &p->pl, w, prec, CPU_EXEC_REFERENCE, 1.0, b, dropout);
}

static void build(const ModelSpec *s, SpecPrecision policy, AttnForm form, Pipeline *p)
{
    PipeOptions o = pipeline_defaults(policy);
    o.attention = form;
    HpcError err = {0};
    cr_assert_eq(pipeline_build(s, &o, p, &err), HPC_OK, "pipeline_build: %s", err.msg);
}

/* Relative L2 error of a against r; NaN anywhere fails (returns +inf). */
static double rel_l2(const double *a, const double *r, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t k = 0; k < n; k++) {
        if (!isfinite(a[k]) || !isfinite(r[k])) return INFINITY;
        num += (a[k] - r[k]) * (a[k] - r[k]);
        den += r[k] * r[k];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The packed step of head h against the padded one (form: the padded
 * program's attention), dropout off; returns the worst gradient error. */
static double check_equal(HeadCase h, SpecPrecision policy, AttnForm form, CpuExecPrecision prec, double tol,
                          const char *what)
{
    ModelSpec sp, sk;
    spec_for(&sp, h, false);
    spec_for(&sk, h, true);
    Pipeline pad, pk;
    build(&sp, policy, form, &pad);
    build(&sk, policy, ATTN_FORM_AUTO, &pk);
    cr_assert(ir_graph_packed(&pk.g) && !ir_graph_packed(&pad.g), "%s: only the pack program is packed", what);
    cr_assert_eq(ir_count_op(&pk.g, IR_OP_ATTENTION, 0), 2, "%s: a packed program has fused attention", what);
    cr_assert_eq(pad.pl.n, pk.pl.n, "%s: the same parameters", what);
    Dataset d;
    make_rows(&d);
    Batch *bp = first_batch(&d, false), *bk = first_batch(&d, true);
    cr_assert_eq(bp->L, PMAX, "padded to the longest row");
    cr_assert_lt(bk->B * bk->L, bp->B * bp->L, "%s: fewer slots packed (%lld) than padded (%lld)", what,
                 (long long)(bk->B * bk->L), (long long)(bp->B * bp->L));
    token_labels(bp, h);
    token_labels(bk, h);
    double **w = cpu_step_random_weights(&pad.pl, 4321, 0.5);
    StepOut a = run_step(&pad, w, prec, bp, false), b = run_step(&pk, w, prec, bk, false);
    double lerr = fabs(b.loss - a.loss) / fabs(a.loss);
    cr_expect(isfinite(b.loss) && a.loss > 0 && lerr <= tol, "%s: loss packed %.17g vs padded %.17g (rel %.3g)",
              what, b.loss, a.loss, lerr);
    double worst = 0;
    int compared = 0;
    for (int i = 0; i < pad.pl.n; i++) {
        cr_expect_eq(a.grad[i] == NULL, b.grad[i] == NULL, "%s: %s has a gradient on one side only", what,
                     pad.pl.p[i].name);
        if (!a.grad[i] || !b.grad[i]) continue;
        double e = rel_l2(b.grad[i], a.grad[i], params_numel(&pad.pl.p[i]));
        cr_expect(e <= tol, "%s: %s gradient rel L2 %.3g > %.1g", what, pad.pl.p[i].name, e, tol);
        if (e > worst) worst = e;
        compared++;
    }
    cr_expect_gt(compared, 10, "%s: gradients compared", what);
    fprintf(stderr, "[pack] %s: loss rel %.2e, worst gradient rel L2 %.2e over %d (slots %lld packed, %lld padded)\n",
            what, lerr, worst, compared, (long long)(bk->B * bk->L), (long long)(bp->B * bp->L));
    step_free(&a);
    step_free(&b);
    cpu_step_free_weights(&pad.pl, w);
    batch_free(bp);
    batch_free(bk);
    dataset_free(&d);
    pipeline_free(&pad);
    pipeline_free(&pk);
    return worst;
}

Test(pack_equal, seq_classifier_f64)
{
    check_equal(H_SEQ, PREC_FP32, ATTN_FORM_AUTO, CPU_EXEC_F64, 1e-10, "seq f64 vs unfused");
}

Test(pack_equal, seq_classifier_f32)
{
    check_equal(H_SEQ, PREC_FP32, ATTN_FORM_AUTO, CPU_EXEC_F32, 1e-5, "seq f32 vs unfused");
    check_equal(H_SEQ, PREC_FP32, ATTN_FORM_FUSED, CPU_EXEC_F32, 1e-5, "seq f32 vs fused");
}

Test(pack_equal, token_classifier)
{
    check_equal(H_TOKEN, PREC_FP32, ATTN_FORM_AUTO, CPU_EXEC_F64, 1e-10, "token f64");
    check_equal(H_TOKEN, PREC_FP32, ATTN_FORM_AUTO, CPU_EXEC_F32, 1e-5, "token f32");
}

Test(pack_equal, masked_lm_tied)
{
    check_equal(H_MLM, PREC_FP32, ATTN_FORM_AUTO, CPU_EXEC_F64, 1e-10, "mlm f64");
    check_equal(H_MLM, PREC_FP32, ATTN_FORM_AUTO, CPU_EXEC_F32, 1e-5, "mlm f32");
}

Test(pack_equal, causal_last_token)
{
    check_equal(H_CAUSAL_SEQ, PREC_FP32, ATTN_FORM_AUTO, CPU_EXEC_F64, 1e-10, "causal seq f64");
    check_equal(H_CAUSAL_SEQ, PREC_FP32, ATTN_FORM_AUTO, CPU_EXEC_F32, 1e-5, "causal seq f32");
}

/* A control: the same packed batch with the boundary of spans 2 and 3
 * moved by one token (the attention not kept apart) gives another loss, so the equality above
 * is not vacuous. */
Test(pack_equal, merged_spans_differ)
{
    ModelSpec s;
    spec_for(&s, H_SEQ, true);
    Pipeline p;
    build(&s, PREC_FP32, ATTN_FORM_AUTO, &p);
    Dataset d;
    make_rows(&d);
    Batch *b = first_batch(&d, true);
    double **w = cpu_step_random_weights(&p.pl, 4321, 0.5);
    StepOut a = run_step(&p, w, CPU_EXEC_F64, b, false);
    b->seq_spans[5] += 1;   /* span 2 takes span 3's first token */
    b->seq_spans[6] += 1;
    b->seq_spans[7] -= 1;
    StepOut m = run_step(&p, w, CPU_EXEC_F64, b, false);
    cr_expect_gt(fabs(m.loss - a.loss) / fabs(a.loss), 1e-4, "loss %.12g vs %.12g", m.loss, a.loss);
    step_free(&a);
    step_free(&m);
    cpu_step_free_weights(&p.pl, w);
    batch_free(b);
    dataset_free(&d);
    pipeline_free(&p);
}

/* fp16 policy, both fused: the same roundings per element, so close. */
Test(pack_equal, fp16_policy)
{
    check_equal(H_SEQ, PREC_FP16, ATTN_FORM_FUSED, CPU_EXEC_F32, 1e-3, "seq fp16 vs fused fp16");
}

/* Dropout on: finite, and not the dropout-off step (the masks apply). */
Test(pack_dropout, step_differs_and_is_finite)
{
    ModelSpec s;
    spec_for(&s, H_SEQ, true);
    Pipeline p;
    build(&s, PREC_FP32, ATTN_FORM_AUTO, &p);
    Dataset d;
    make_rows(&d);
    Batch *b = first_batch(&d, true);
    double **w = cpu_step_random_weights(&p.pl, 99, 0.5);
    StepOut on = run_step(&p, w, CPU_EXEC_F32, b, true), off = run_step(&p, w, CPU_EXEC_F32, b, false);
    cr_expect(isfinite(on.loss) && on.loss != off.loss, "loss %.9g on vs %.9g off", on.loss, off.loss);
    for (int i = 0; i < p.pl.n; i++) {
        if (!on.grad[i]) continue;
        double e = rel_l2(on.grad[i], off.grad[i], params_numel(&p.pl.p[i]));
        cr_expect(isfinite(e), "%s: non-finite gradient", p.pl.p[i].name);
    }
    int q = 5;   /* layer 0's query weight: the attention dropout changes it */
    cr_assert(strstr(p.pl.p[q].name, "query.weight"), "%s", p.pl.p[q].name);
    cr_expect_gt(rel_l2(on.grad[q], off.grad[q], params_numel(&p.pl.p[q])), 1e-3);
    step_free(&on);
    step_free(&off);
    cpu_step_free_weights(&p.pl, w);
    batch_free(b);
    dataset_free(&d);
    pipeline_free(&p);
}

/* The varlen contract with dropout on (cpu_exec_packed.inc): sequence b
 * of a packed batch is the padded fused node at B = 1, L = len_b run with
 * the Philox key seed ^ span_seed(start_b): its ctx rows and its lse block
 * (at start_b * heads) equal such a run's, bit for bit.  Hidden dropout is
 * off so layer 0's attention inputs are the same in both runs. */
static uint64_t span_seed(int64_t start) { return (uint64_t)(start + 1) * 0x9E3779B97F4A7C15ull; }

static int first_attention(const IrGraph *g)
{
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i].op == IR_OP_ATTENTION) return i;
    return -1;
}

Test(pack_dropout, sequence_is_the_padded_node_with_its_seed)
{
    ModelSpec sp, sk;
    spec_for(&sp, H_SEQ, false);
    spec_for(&sk, H_SEQ, true);
    sp.stack.hidden_dropout = sk.stack.hidden_dropout = 0;
    sp.head.classifier_dropout = sk.head.classifier_dropout = 0;
    Pipeline pad, pk;
    build(&sp, PREC_FP32, ATTN_FORM_FUSED, &pad);
    build(&sk, PREC_FP32, ATTN_FORM_AUTO, &pk);
    Dataset d;
    make_rows(&d);   /* rows 0 (16 tokens) and 2 (7) into a batch of two */
    Dataset two;
    dataset_init(&two, "two");
    HpcError err = {0};
    for (int r = 0; r < 3; r += 2)
        cr_assert_eq(dataset_add(&two, d.ex[r].ids, d.ex[r].type_ids, d.ex[r].len, 0, 0, &err), HPC_OK);
    Loader ld;
    cr_assert_eq(loader_init(&ld, &two, 2, PMAX, 1, false, false, &err), HPC_OK);
    loader_set_pack(&ld, true);
    Batch *bk = loader_next(&ld);
    loader_free(&ld);
    double **w = cpu_step_random_weights(&pad.pl, 7, 0.5);
    CpuRunOptions o = {.training = true, .backward = false, .seed = 77, .step = 3, .loss_scale = 1.0};
    CpuExec ek;
    cpu_exec_init(&ek, &pk.g, CPU_EXEC_F64);
    for (int i = 0; i < pk.pl.n; i++)
        if (pk.pl.p[i].tied_to < 0) cpu_exec_bind_param(&ek, i, w[i]);
    cr_assert_eq(cpu_exec_run(&ek, bk, &o, &err), HPC_OK, "%s", err.msg);
    int ak = first_attention(&pk.g), ap = first_attention(&pad.g);
    cr_assert(ak >= 0 && ap >= 0);
    int64_t H = pk.g.nodes[ak].dims[2], NH = pk.g.nodes[ak].attr.attn.heads;
    const double *ck = cpu_exec_value(&ek, ak), *lk = cpu_exec_value(&ek, ir_output(&pk.g, ak, 1));
    for (int b = 0; b < 2; b++) {
        int64_t start = bk->seq_spans[2 * b], n = bk->seq_spans[2 * b + 1];
        Batch *one = batch_new(1, n, 1);   /* L = len: no padding, the padded index at L = n */
        for (int64_t t = 0; t < n; t++) {
            one->input_ids[t] = bk->input_ids[start + t];
            one->token_type_ids[t] = bk->token_type_ids[start + t];
            one->attention_mask[t] = 1;
        }
        CpuExec ep;
        cpu_exec_init(&ep, &pad.g, CPU_EXEC_F64);
        for (int i = 0; i < pad.pl.n; i++)
            if (pad.pl.p[i].tied_to < 0) cpu_exec_bind_param(&ep, i, w[i]);
        CpuRunOptions op = o;
        op.seed = o.seed ^ span_seed(start);
        cr_assert_eq(cpu_exec_run(&ep, one, &op, &err), HPC_OK, "%s", err.msg);
        const double *cp = cpu_exec_value(&ep, ap), *lp = cpu_exec_value(&ep, ir_output(&pad.g, ap, 1));
        int diff = 0;
        for (int64_t e = 0; e < n * H; e++) diff += cp[e] != ck[start * H + e];
        for (int64_t e = 0; e < NH * n; e++) diff += lp[e] != lk[start * NH + e];
        cr_expect_eq(diff, 0, "sequence %d: %d of %lld ctx / lse values differ", b, diff, (long long)(n * (H + NH)));
        /* and dropout is on: the run at the plain seed differs */
        op.seed = o.seed;
        cr_assert_eq(cpu_exec_run(&ep, one, &op, &err), HPC_OK, "%s", err.msg);
        cp = cpu_exec_value(&ep, ap);
        diff = 0;
        for (int64_t e = 0; e < n * H; e++) diff += cp[e] != ck[start * H + e];
        cr_expect_gt(diff, 0, "sequence %d: the key offset matters", b);
        cpu_exec_free(&ep);
        batch_free(one);
    }
    cr_expect(isinf(lk[bk->B * bk->L * NH - 1]), "the tail's lse is +inf");
    cpu_exec_free(&ek);
    cpu_step_free_weights(&pad.pl, w);
    batch_free(bk);
    dataset_free(&two);
    dataset_free(&d);
    pipeline_free(&pad);
    pipeline_free(&pk);
}

/* Dropout on, through the trainer: a packed run learns synthetic-contains. */
Test(pack_dropout, trainer_learns_packed, .timeout = 300)
{
    ModelSpec s;
    spec_defaults(&s);
    snprintf(s.name, sizeof s.name, "pack_train");
    s.stack.hidden = 64;
    s.stack.layers = 2;
    s.stack.heads = 2;
    s.stack.ffn = 128;
    s.stack.vocab_size = 64;
    s.stack.max_positions = 64;
    s.train.batch_size = 16;
    s.train.max_seq_len = 32;
    s.train.lr = 1e-3;
    s.train.steps = 150;
    s.train.epochs = 0;
    s.train.pack = true;
    Dataset train, dev;
    HpcError err = {0};
    dataset_init(&train, "t");
    dataset_init(&dev, "d");
    cr_assert_eq(synthetic_make(SYN_CONTAINS, &train, 1200, 64, 32, 1, false, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(synthetic_make(SYN_CONTAINS, &dev, 300, 64, 32, 2, false, &err), HPC_OK, "%s", err.msg);
    TrainOptions o = {0};
    TrainResult r;
    cr_assert_eq(trainer_run(&s, &train, &dev, &o, &r, &err), HPC_OK, "%s", err.msg);
    fprintf(stderr, "[pack] trainer: dev accuracy %.4f after %lld packed steps, sized L %lld\n", r.eval_metric,
            (long long)r.steps, (long long)r.sized_len);
    cr_expect_gt(r.eval_metric, 0.9, "dev accuracy %.4f", r.eval_metric);
    cr_expect_lt(r.sized_len, 32, "a packed run is sized below the longest row (%lld)", (long long)r.sized_len);
    dataset_free(&train);
    dataset_free(&dev);
}

/* ---- the loader ---------------------------------------------------------- */

static const char *VOCAB[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on",
                              "mat", "a", "dog", "ran", "."};

Test(pack_loader, spans_tokens_labels_positions_from_tsv)
{
    char dir[] = "/tmp/hpc_pack_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char vpath[600], tpath[600];
    snprintf(vpath, sizeof vpath, "%s/vocab.txt", dir);
    snprintf(tpath, sizeof tpath, "%s/train.tsv", dir);
    FILE *f = fopen(vpath, "w");
    for (size_t i = 0; i < sizeof VOCAB / sizeof VOCAB[0]; i++) fprintf(f, "%s\n", VOCAB[i]);
    fclose(f);
    f = fopen(tpath, "w");   /* CoLA layout: source, label, mark, sentence */
    fputs("s\t1\t\tthe cat sat on the mat .\ns\t0\t\tdog\ns\t1\t\ta dog ran .\n", f);
    fclose(f);
    HpcError err = {0};
    Tokenizer *tok = NULL;
    cr_assert_eq(tokenizer_load(vpath, true, &tok, &err), HPC_OK, "%s", err.msg);
    GlueOptions go = glue_options(GLUE_COLA, 32);
    Dataset d;
    dataset_init(&d, "tsv");
    GlueReport rep;
    cr_assert_eq(glue_read(tpath, &go, tok, &d, &rep, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(d.n, 3);
    /* [CLS] the cat sat on the mat . [SEP] = 9; [CLS] dog [SEP] = 3; [CLS] a dog ran . [SEP] = 6 */
    cr_assert_eq(d.ex[0].len, 9);
    cr_assert_eq(d.ex[1].len, 3);
    cr_assert_eq(d.ex[2].len, 6);
    Loader ld;
    cr_assert_eq(loader_init(&ld, &d, 3, 32, 1, false, false, &err), HPC_OK, "%s", err.msg);
    loader_set_pack(&ld, true);
    Batch *b = loader_next(&ld);
    cr_assert_not_null(b);
    cr_assert_not_null(b->seq_spans);
    cr_expect_eq(b->B, 3);
    cr_expect_eq(b->L, 6, "L = ceil(18 / 3) = %lld", (long long)b->L);
    int32_t want_spans[6] = {0, 9, 9, 3, 12, 6};
    for (int i = 0; i < 6; i++) cr_expect_eq(b->seq_spans[i], want_spans[i], "span field %d", i);
    for (int r = 0, at = 0; r < 3; r++)
        for (int t = 0; t < d.ex[r].len; t++, at++) {
            cr_expect_eq(b->input_ids[at], d.ex[r].ids[t], "slot %d", at);
            cr_expect_eq(b->attention_mask[at], 1);
        }
    cr_expect_eq(b->input_ids[0], 2, "[CLS] at span 0's start");
    cr_expect_eq(b->input_ids[9], 2, "[CLS] at span 1's start");
    cr_expect_eq(b->input_ids[12], 2, "[CLS] at span 2's start");
    cr_expect_eq(b->labels[0], 1);
    cr_expect_eq(b->labels[1], 0);
    cr_expect_eq(b->labels[2], 1);
    for (int r = 0; r < 3; r++) cr_expect_eq(b->example_index[r], r);
    batch_free(b);
    cr_expect_null(loader_next(&ld), "one batch an epoch");

    /* two rows a batch: 9 + 3 = 12 -> L 6, no tail; then 6 -> B 1, L 6 */
    loader_free(&ld);
    cr_assert_eq(loader_init(&ld, &d, 2, 32, 1, false, false, &err), HPC_OK, "%s", err.msg);
    loader_set_pack(&ld, true);
    b = loader_next(&ld);
    cr_expect_eq(b->B * b->L, 12);
    batch_free(b);
    b = loader_next(&ld);
    cr_expect_eq(b->B, 1);
    cr_expect_eq(b->L, 6);
    batch_free(b);
    loader_free(&ld);

    /* positions in the graph restart in every span; tail slots get the offset (0) */
    ModelSpec s;
    spec_for(&s, H_SEQ, true);
    s.stack.vocab_size = (int64_t)(sizeof VOCAB / sizeof VOCAB[0]);
    s.train.batch_size = 3;
    Pipeline p;
    build(&s, PREC_FP32, ATTN_FORM_AUTO, &p);
    int pos = -1;
    for (int i = 0; i < p.g.n; i++)
        if (p.g.nodes[i].op == IR_OP_SPAN_POSITIONS) pos = i;
    cr_assert_geq(pos, 0, "a SPAN_POSITIONS node");
    cr_assert_eq(loader_init(&ld, &d, 4, 32, 1, false, false, &err), HPC_OK, "%s", err.msg);
    loader_set_pack(&ld, true);
    b = loader_next(&ld);   /* 3 rows, 18 tokens: L 6, no tail */
    cr_assert_eq(b->B * b->L, 18);
    double **w = cpu_step_random_weights(&p.pl, 5, 0.5);
    CpuExec ex;
    cpu_exec_init(&ex, &p.g, CPU_EXEC_F64);
    for (int i = 0; i < p.pl.n; i++)
        if (p.pl.p[i].tied_to < 0) cpu_exec_bind_param(&ex, i, w[i]);
    CpuRunOptions o = {.training = false, .backward = false, .loss_scale = 1.0};
    cr_assert_eq(cpu_exec_run(&ex, b, &o, &err), HPC_OK, "%s", err.msg);
    const int32_t *got = cpu_exec_value(&ex, pos);
    for (int r = 0, at = 0; r < 3; r++)
        for (int t = 0; t < d.ex[r].len; t++, at++) cr_expect_eq(got[at], t, "slot %d", at);
    cpu_exec_free(&ex);
    cpu_step_free_weights(&p.pl, w);
    pipeline_free(&p);
    batch_free(b);
    loader_free(&ld);
    dataset_free(&d);
    tokenizer_free(tok);
    unlink(vpath);
    unlink(tpath);
    rmdir(dir);
}

/* The run's slot count: exactly the most any batch of those epochs has. */
Test(pack_loader, max_slots_is_what_the_batches_need)
{
    Dataset d;
    dataset_init(&d, "slots");
    HpcError err = {0};
    cr_assert_eq(synthetic_make(SYN_CONTAINS, &d, 203, 64, 48, 3, false, &err), HPC_OK, "%s", err.msg);
    for (int bucket = 0; bucket < 2; bucket++) {
        Loader ld;
        cr_assert_eq(loader_init(&ld, &d, 16, 48, 9, true, bucket, &err), HPC_OK);
        loader_set_pack(&ld, true);
        int64_t want = loader_packed_max_slots(&ld, 4), seen = 0, padded = 0;
        for (int e = 0; e < 4; e++)
            for (Batch *b; (b = loader_next(&ld)); batch_free(b)) {
                int64_t tokens = 0, longest = 0;
                for (int64_t r = 0; r < b->B; r++) {
                    tokens += b->seq_spans[2 * r + 1];
                    if (b->seq_spans[2 * r + 1] > longest) longest = b->seq_spans[2 * r + 1];
                }
                cr_expect_eq(b->L, (tokens + b->B - 1) / b->B, "L = ceil(tokens / B)");
                if (b->B * b->L > seen) seen = b->B * b->L;
                if (b->B * ((longest + 7) / 8 * 8) > padded) padded = b->B * ((longest + 7) / 8 * 8);
            }
        cr_expect_eq(want, seen, "bucket %d: predicted %lld slots, the batches had at most %lld", bucket,
                     (long long)want, (long long)seen);
        cr_expect_lt(seen, padded, "packed %lld slots vs padded %lld", (long long)seen, (long long)padded);
        loader_free(&ld);
    }
    dataset_free(&d);
}

/* ---- bad input ------------------------------------------------------------ */

Test(pack_errors, unfused_attention_refused)
{
    ModelSpec s;
    spec_for(&s, H_SEQ, true);
    PipeOptions o = pipeline_defaults(PREC_FP32);
    o.attention = ATTN_FORM_UNFUSED;
    Pipeline p;
    HpcError err = {0};
    cr_expect_neq(pipeline_build(&s, &o, &p, &err), HPC_OK);
    cr_expect(strstr(err.msg, "pack = true needs the fused attention"), "message: %s", err.msg);
    pipeline_free(&p);
    setenv("HPC_ATTENTION", "unfused", 1);
    o.attention = ATTN_FORM_AUTO;
    err = (HpcError){0};
    cr_expect_neq(pipeline_build(&s, &o, &p, &err), HPC_OK);
    cr_expect(strstr(err.msg, "HPC_ATTENTION=unfused"), "message: %s", err.msg);
    pipeline_free(&p);
    unsetenv("HPC_ATTENTION");
}

Test(pack_errors, causal_lm_refused)
{
    ModelSpec s;
    spec_for(&s, H_CAUSAL_SEQ, true);
    s.head.kind = HEAD_CAUSAL_LM;
    s.head.tie_word_embeddings = true;
    PipeOptions o = pipeline_defaults(PREC_FP32);
    Pipeline p;
    HpcError err = {0};
    cr_expect_neq(pipeline_build(&s, &o, &p, &err), HPC_OK);
    cr_expect(strstr(err.msg, "causal LM"), "message: %s", err.msg);
    pipeline_free(&p);
}

Test(pack_errors, padded_batch_or_bad_spans_refused)
{
    ModelSpec s;
    spec_for(&s, H_SEQ, true);
    Pipeline p;
    build(&s, PREC_FP32, ATTN_FORM_AUTO, &p);
    Dataset d;
    make_rows(&d);
    Batch *padded = first_batch(&d, false), *packed = first_batch(&d, true);
    double **w = cpu_step_random_weights(&p.pl, 5, 0.5);
    CpuExec ex;
    cpu_exec_init(&ex, &p.g, CPU_EXEC_F32);
    float **wf = calloc((size_t)p.pl.n, sizeof *wf);
    for (int i = 0; i < p.pl.n; i++) {
        if (p.pl.p[i].tied_to >= 0) continue;
        int64_t n = params_numel(&p.pl.p[i]);
        wf[i] = malloc((size_t)n * sizeof(float));
        for (int64_t k = 0; k < n; k++) wf[i][k] = (float)w[i][k];
        cpu_exec_bind_param(&ex, i, wf[i]);
    }
    CpuRunOptions o = {.training = false, .backward = true, .loss_scale = 1.0};
    HpcError err = {0};
    cr_expect_neq(cpu_exec_run(&ex, padded, &o, &err), HPC_OK);
    cr_expect(strstr(err.msg, "seq_spans"), "message: %s", err.msg);
    packed->seq_spans[2 * 3 + 1] = (int32_t)(packed->B * packed->L);   /* row 3 runs past the slots */
    err = (HpcError){0};
    cr_expect_neq(cpu_exec_run(&ex, packed, &o, &err), HPC_OK);
    cr_expect(strstr(err.msg, "seq_spans row 3"), "message: %s", err.msg);
    for (int i = 0; i < p.pl.n; i++) free(wf[i]);
    free(wf);
    cpu_exec_free(&ex);
    cpu_step_free_weights(&p.pl, w);
    batch_free(padded);
    batch_free(packed);
    dataset_free(&d);
    pipeline_free(&p);
}

/* batch_spans_check, which both executors run on a packed batch: spans
 * back to back from slot 0, inside the slots, none longer than the bound;
 * the message names the caller and the row. */
Test(pack_errors, spans_check_rules)
{
    HpcError err = {0};
    const int32_t good[6] = {0, 5, 5, 0, 5, 7};   /* an empty span in the middle, 12 of 3 x 4 slots */
    cr_expect_eq(batch_spans_check(good, 3, 4, 0, "t", &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(batch_spans_check(good, 3, 4, 7, "t", &err), HPC_OK, "%s", err.msg);
    const struct { int32_t spans[6]; int64_t bound; const char *want; } bad[] = {
        {{1, 5, 6, 0, 6, 6}, 0, "t: seq_spans row 0 is [1, 6)"},    /* not from slot 0 */
        {{0, 5, 6, 0, 6, 6}, 0, "t: seq_spans row 1 is [6, 6)"},    /* a gap after row 0 */
        {{0, 5, 5, -1, 4, 8}, 0, "t: seq_spans row 1 is [5, 4)"},   /* a negative length */
        {{0, 5, 5, 2, 7, 6}, 0, "t: seq_spans row 2 is [7, 13)"},   /* past the 12 slots */
        {{0, 5, 5, 0, 5, 7}, 6, "t: seq_spans row 2 holds 7 tokens"}, /* past the bound */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err = (HpcError){0};
        cr_expect_eq(batch_spans_check(bad[i].spans, 3, 4, bad[i].bound, "t", &err), HPC_ERR_INPUT, "case %zu", i);
        cr_expect(strstr(err.msg, bad[i].want) != NULL, "case %zu: wanted '%s' in: %s", i, bad[i].want, err.msg);
    }
}

/* A span longer than the program's bound (its max_seq_len) is refused
 * by the cpu executor, and a run that keeps longer sequences than a
 * compiled packed program was lowered for is refused before it starts. */
Test(pack_errors, spans_past_the_program_bound_refused)
{
    ModelSpec s;
    spec_for(&s, H_SEQ, true);
    s.train.max_seq_len = 8;   /* the batch's rows run to 16 tokens */
    Pipeline p;
    build(&s, PREC_FP32, ATTN_FORM_AUTO, &p);
    cr_expect_eq(ir_span_max(&p.g), 8);
    Dataset d;
    make_rows(&d);
    Batch *packed = first_batch(&d, true);
    CpuExec ex;
    cpu_exec_init(&ex, &p.g, CPU_EXEC_F64);
    double **w = cpu_step_random_weights(&p.pl, 5, 0.5);
    for (int i = 0; i < p.pl.n; i++)
        if (p.pl.p[i].tied_to < 0) cpu_exec_bind_param(&ex, i, w[i]);
    CpuRunOptions o = {.training = false, .backward = false, .loss_scale = 1.0};
    HpcError err = {0};
    cr_expect_eq(cpu_exec_run(&ex, packed, &o, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "seq_spans row 0 holds 16 tokens") && strstr(err.msg, "at most 8"), "message: %s",
              err.msg);
    cpu_exec_free(&ex);
    cpu_step_free_weights(&p.pl, w);
    batch_free(packed);
    pipeline_free(&p);

    StepProgram prog;
    spec_for(&s, H_SEQ, true);   /* compiled for 16 */
    cr_assert_eq(step_program_compile(&s, PREC_FP32, true, &prog, &err), HPC_OK, "%s", err.msg);
    s.train.max_seq_len = 32;    /* the run keeps up to 32 */
    TrainOptions to = {.program = &prog, .no_memory_check = true};
    TrainResult r;
    err = (HpcError){0};
    cr_expect_eq(trainer_run(&s, &d, NULL, &to, &r, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "at most 16") && strstr(err.msg, "seq_len = 32") && strstr(err.msg, "--seq-len 16"),
              "message: %s", err.msg);
    step_program_free(&prog);
    dataset_free(&d);
}

/* A packed program carries CUDA kernels under fp16 and bf16; under fp32,
 * whose attention has no varlen kernel, it compiles with none (it runs on
 * the cpu backend, the cuda backend refuses it, and so does emitting its
 * CUDA). */
Test(pack_errors, cuda_kernels_in_16_bits_only)
{
    ModelSpec s;
    spec_for(&s, H_SEQ, true);
    StepProgram prog;
    HpcError err = {0};
    SpecPrecision low[2] = {PREC_FP16, PREC_BF16};
    for (int k = 0; k < 2; k++) {
        err = (HpcError){0};
        cr_assert_eq(step_program_compile(&s, low[k], true, &prog, &err), HPC_OK, "%s", err.msg);
        cr_expect(ir_graph_packed(&prog.g));
        cr_expect_gt(prog.kernels.n, 0, "a packed %s program carries its kernels", k ? "bf16" : "fp16");
        cr_expect(prog.kernels.cuda_source && strstr(prog.kernels.cuda_source, "attn2_fwd_vl"),
                  "the varlen attention is in the module");
        step_program_free(&prog);
    }
    err = (HpcError){0};
    cr_assert_eq(step_program_compile(&s, PREC_FP32, true, &prog, &err), HPC_OK, "%s", err.msg);
    cr_expect(ir_graph_packed(&prog.g));
    cr_expect_eq(prog.kernels.n, 0, "a packed fp32 program carries no kernels (%d)", prog.kernels.n);
    step_program_free(&prog);
    /* so emitting its CUDA is refused before anything is written */
    char dir[] = "/tmp/hpc_pack_emitXXXXXX";
    cr_assert(mkdtemp(dir));
    char sub[sizeof dir + 8];
    snprintf(sub, sizeof sub, "%s/out", dir);
    err = (HpcError){0};
    cr_expect_eq(emitlib_cuda(&s, PREC_FP32, sub, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "packed") && strstr(err.msg, "fp16 or bf16"), "message: %s", err.msg);
    cr_expect_neq(access(sub, F_OK), 0, "%s was created", sub);
    rmdir(dir);
    /* the padded program still has its kernels */
    s.train.pack = false;
    err = (HpcError){0};
    cr_assert_eq(step_program_compile(&s, PREC_FP16, true, &prog, &err), HPC_OK, "%s", err.msg);
    cr_expect_gt(prog.kernels.n, 0);
    step_program_free(&prog);
}

/* ---- CUDA: the span kernels compile ---------------------------------------- */

Test(pack_cuda, span_kernels_compile_with_nvrtc, .timeout = 300)
{
    for (int f16 = 0; f16 < 2; f16++) {
        IrGraph g;
        ir_init(&g);
        int ids = ir_input(&g, IR_IN_INPUT_IDS), spans = ir_input(&g, IR_IN_SEQ_SPANS);
        int table = ir_param(&g, 0, DT_F32, 2, (int64_t[]){PV, 32}, "table");
        int x = ir_add(&g, IR_OP_EMBEDDING, (int[]){table, ids}, 2, NULL, "x");
        if (f16) {
            IrAttr c = {.cast = {DT_F16}};
            x = ir_add(&g, IR_OP_CAST, &x, 1, &c, "x16");
        }
        IrAttr off = {.pos = {2}}, first = {.span = {0}}, last = {.span = {1}};
        ir_add(&g, IR_OP_SPAN_POSITIONS, &spans, 1, &off, "pos");
        int t0 = ir_add(&g, IR_OP_SPAN_TOKEN, (int[]){x, spans}, 2, &first, "first");
        int t1 = ir_add(&g, IR_OP_SPAN_TOKEN, (int[]){x, spans}, 2, &last, "last");
        ir_add(&g, IR_OP_SPAN_TOKEN_BWD, (int[]){t0, spans}, 2, &first, "d.first");
        ir_add(&g, IR_OP_SPAN_TOKEN_BWD, (int[]){t1, spans}, 2, &last, "d.last");
        g.n_forward = g.n;
        char *src = NULL;
        HpcError err = {0};
        cr_assert_eq(eop_module_source(&g, &src, &err), HPC_OK, "%s", err.msg);
        cr_expect(strstr(src, "span_positions") && strstr(src, "span_first_bwd") && strstr(src, "span_last"),
                  "the span kernels are in the module");
        for (int arch = 80; arch <= 90; arch += 10) {
            void *cubin = NULL;
            size_t size = 0;
            char *log = NULL;
            cr_expect_eq(nvrtc_compile(src, "hpc_step", arch, NULL, 0, &cubin, &size, &log, &err), HPC_OK,
                         "%s sm_%d: %s\n%s", f16 ? "f16" : "f32", arch, err.msg, log ? log : "");
            cr_expect_gt(size, 1000);
            free(cubin);
            free(log);
        }
        free(src);
        ir_free(&g);
    }
}

/* A packed step's whole module (varlen attention phases included). */
static void compile_packed_module(ModelSpec *s, SpecPrecision policy, const char *what)
{
    PipeOptions o = pipeline_defaults(policy);
    Pipeline p;
    HpcError err = {0};
    cr_assert_eq(pipeline_build(s, &o, &p, &err), HPC_OK, "%s: %s", what, err.msg);
    char *src = NULL;
    cr_assert_eq(eop_module_source(&p.g, &src, &err), HPC_OK, "%s: %s", what, err.msg);
    cr_expect(strstr(src, "_vl_"), "%s: varlen attention phases in the module", what);
    for (int arch = 80; arch <= 90; arch += 10) {
        void *cubin = NULL;
        size_t size = 0;
        char *log = NULL;
        cr_expect_eq(nvrtc_compile(src, "hpc_step", arch, NULL, 0, &cubin, &size, &log, &err), HPC_OK,
                     "%s sm_%d: %s\n%s", what, arch, err.msg, log ? log : "");
        cr_expect_gt(size, 1000);
        free(cubin);
        free(log);
    }
    free(src);
    pipeline_free(&p);
}

Test(pack_cuda, packed_step_modules_compile_with_nvrtc, .timeout = 900)
{
    ModelSpec s;
    spec_for(&s, H_SEQ, true);   /* hidden 32, 2 heads of 16 */
    compile_packed_module(&s, PREC_FP16, "tiny fp16 (v4)");
    compile_packed_module(&s, PREC_BF16, "tiny bf16 (v4)");
    setenv("HPC_FUSE_QKV", "1", 1);
    compile_packed_module(&s, PREC_FP16, "tiny fp16 QKV");
    unsetenv("HPC_FUSE_QKV");
    setenv("HPC_ATTN_KERNELS", "v3", 1);
    compile_packed_module(&s, PREC_FP16, "tiny fp16 v3");
    setenv("HPC_ATTN_KERNELS", "v2", 1);
    compile_packed_module(&s, PREC_FP16, "tiny fp16 v2");
    setenv("HPC_ATTN_KERNELS", "v1", 1);
    compile_packed_module(&s, PREC_FP16, "tiny fp16 v1");
    unsetenv("HPC_ATTN_KERNELS");
    spec_for(&s, H_CAUSAL_SEQ, true);
    compile_packed_module(&s, PREC_FP16, "causal fp16");
    spec_for(&s, H_SEQ, true);
    s.stack.hidden = 256;   /* 4 heads of 64, BERT-base's head size */
    s.stack.heads = 4;
    s.stack.ffn = 512;
    compile_packed_module(&s, PREC_FP16, "head 64 fp16");
    s.stack.max_positions = 512;   /* spans up to 256: the dQ and dK/dV phases for rows past 128 */
    s.train.max_seq_len = 256;
    compile_packed_module(&s, PREC_FP16, "head 64 fp16, spans to 256");
}

/* The packed attention's launches follow the program's span bound
 * (IrInputAttr.span_max, the max_seq_len lowered for): its forward tiles
 * stop at the bound's, and the one-pass backward alone runs where no span
 * can pass 128 keys (no delta, dQ or dK/dV phases); a bound above 128 keeps
 * them (v4, the default: delta a phase of its own, one block a (span,
 * head)), the dQ and dK/dV tiles capped too. */
static void expect_varlen_phases(int64_t max_seq_len, int bwd_phases, int64_t B, int64_t L, unsigned fwd_tiles)
{
    ModelSpec s;
    spec_for(&s, H_SEQ, true);
    s.stack.hidden = 128;   /* 2 heads of 64: the one-pass backward's head size */
    s.stack.ffn = 256;
    s.stack.max_positions = 512;
    s.train.max_seq_len = max_seq_len;
    PipeOptions o = pipeline_defaults(PREC_FP16);
    Pipeline p;
    HpcError err = {0};
    cr_assert_eq(pipeline_build(&s, &o, &p, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(ir_span_max(&p.g), max_seq_len, "the spans input carries the bound");
    int checked = 0;
    for (int id = 0; id < p.g.n; id++) {
        const IrNode *n = &p.g.nodes[id];
        if ((n->op != IR_OP_ATTENTION && n->op != IR_OP_ATTENTION_BWD) || n->attr.attn.first_query) continue;
        EopNodeCode c;
        cr_assert_eq(eop_node_code(&p.g, id, B, L, &c, &err), HPC_OK, "%s", err.msg);
        if (n->op == IR_OP_ATTENTION) {
            cr_expect_eq(c.phase[0].grid[0], fwd_tiles, "span bound %lld, %lld x %lld slots: %s has %u tiles",
                         (long long)max_seq_len, (long long)B, (long long)L, c.phase[0].name, c.phase[0].grid[0]);
        } else {
            cr_expect_eq(c.n_phases, bwd_phases, "span bound %lld: %d backward phases", (long long)max_seq_len,
                         c.n_phases);
            for (int k = 1; k < c.n_phases; k++) {
                bool delta = strstr(c.phase[k].name, "attn_bwd_delta_vl") != NULL;
                cr_expect_eq(delta, k == 1 && c.n_phases == 4, "%s: phase %d of %d", c.phase[k].name, k, c.n_phases);
                cr_expect_eq(c.phase[k].grid[0], delta ? 1u : fwd_tiles, "%s: %u tiles", c.phase[k].name,
                             c.phase[k].grid[0]);
            }
        }
        checked++;
    }
    cr_expect_eq(checked, 2, "layer 0's forward and backward (layer 1 is the first-slot one)");
    pipeline_free(&p);
}

Test(pack_cuda, varlen_launches_follow_the_span_bound)
{
    expect_varlen_phases(16, 1, 6, 100, 1);    /* 600 slots: 10 tiles by the slots, 1 by the bound */
    expect_varlen_phases(128, 1, 6, 100, 2);
    expect_varlen_phases(256, 4, 6, 100, 4);
    expect_varlen_phases(256, 4, 6, 20, 2);    /* 120 slots bound every span to 2 tiles */
}

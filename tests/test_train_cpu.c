/* tests/test_train_cpu.c — end-to-end training on the cpu backend.
 *
 * The task (runtime/data/synthetic.h, "contains"): does token 5 occur in the
 * sequence?  Rows are [CLS] t_1 .. t_n [SEP] with n random in [4, 14], so
 * batches are padded and the attention mask matters; labels are balanced.
 * The model is bert_tiny (hidden 128, 2 layers, 2 heads, FFN 512, BERT
 * post-LN, pooler + classifier) with a 64-token vocabulary and 64
 * positions instead of 30522/512, so a step takes milliseconds.  Trained
 * with AdamW (lr 1e-3, linear schedule with 10% warmup, dynamic loss
 * scaling as in the spec defaults) it must classify > 95% of a held-out
 * split correctly; chance is 50%.  The same holds with fp16 emulated, and
 * a regression head on the same 0/1 target gets its dev MSE under 0.05.
 *
 * Also: for every .model file in models/ the lowering's parameter total equals
 * summary_param_count (compiler/summary.h, written independently from HF's
 * formulas), and the lowering's parameter count of the full bert_tiny and
 * BERT-base shapes equals the published figures (HF BertForSequenceClassification
 * with 2 labels: 4,386,178 and 109,483,778).
 */
#include <criterion/criterion.h>
#include <glob.h>
#include <math.h>
#include <stdlib.h>

#include "data/dataset.h"
#include "program/ir.h"
#include "lower.h"
#include "program/params.h"
#include "program/spec.h"
#include "compiler/spec_load.h"
#include "summary.h"
#include "data/synthetic.h"
#include "train/trainer.h"

static void bert_tiny(ModelSpec *s)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "bert_tiny");
    s->stack.hidden = 128;
    s->stack.layers = 2;
    s->stack.heads = 2;
    s->stack.ffn = 512;
}

static int64_t lowered_params(const ModelSpec *s)
{
    IrGraph g;
    ParamList pl;
    ir_init(&g);
    params_init(&pl);
    HpcError err = {0};
    cr_assert_eq(lower_model(s, &g, &pl, &err), HPC_OK, "%s", err.msg);
    int64_t n = params_total(&pl);
    ir_free(&g);
    params_free(&pl);
    return n;
}

Test(train_cpu, parameter_counts_match_hf)
{
    ModelSpec s;
    bert_tiny(&s);
    cr_expect_eq(lowered_params(&s), 4386178);
    spec_defaults(&s);
    cr_expect_eq(lowered_params(&s), 109483778);
}

Test(train_cpu, every_model_matches_summary_param_count)
{
    const char *root = getenv("HPC_ROOT");
    char pattern[512];
    snprintf(pattern, sizeof pattern, "%s/models/*.model", root ? root : ".");
    glob_t gl;
    cr_assert_eq(glob(pattern, 0, NULL, &gl), 0, "no models match %s", pattern);
    for (size_t i = 0; i < gl.gl_pathc; i++) {
        ModelSpec s;
        cr_assert_eq(spec_load(gl.gl_pathv[i], &s, stderr), 0, "%s", gl.gl_pathv[i]);
        cr_expect_eq(lowered_params(&s), summary_param_count(&s), "%s: lowering %lld, summary %lld",
                     gl.gl_pathv[i], (long long)lowered_params(&s), (long long)summary_param_count(&s));
    }
    cr_expect_geq(gl.gl_pathc, 8);
    globfree(&gl);
}

/* bert_tiny with a 64-token vocabulary on the "contains" task. */
static void train_contains(SpecPrecision policy, bool regression, TrainResult *r)
{
    ModelSpec s;
    bert_tiny(&s);
    s.head.regression = regression;
    s.head.num_labels = regression ? 1 : 2;
    s.stack.vocab_size = 64;
    s.stack.max_positions = 64;
    s.train.lr = 1e-3;
    s.train.batch_size = 32;
    s.train.max_seq_len = 16;
    s.train.seed = 7;
    s.train.steps = 100;
    s.train.epochs = 0;
    HpcError err = {0};
    Dataset train, dev;
    dataset_init(&train, "contains/train");
    dataset_init(&dev, "contains/dev");
    cr_assert_eq(synthetic_make(SYN_CONTAINS, &train, 2000, 64, 16, 1, regression, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(synthetic_make(SYN_CONTAINS, &dev, 500, 64, 16, 2, regression, &err), HPC_OK, "%s", err.msg);
    TrainOptions o = {.log_every = 25, .out = stderr, .policy = policy};
    cr_assert_eq(trainer_run(&s, &train, &dev, &o, r, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(r->steps, 100);
    cr_expect(isfinite(r->last_loss) && r->last_loss < r->first_loss, "loss %g -> %g", r->first_loss,
              r->last_loss);
    dataset_free(&train);
    dataset_free(&dev);
}

Test(train_cpu, bert_tiny_learns_contains, .timeout = 300)
{
    TrainResult r;
    train_contains(PREC_FP32, false, &r);
    cr_expect_str_eq(r.metric, "accuracy");
    cr_expect(r.eval_metric > 0.95, "dev accuracy %.3f (want > 0.95)", r.eval_metric);
}

/* The same with fp16 emulated (precision pass + 16-bit rounding). */
Test(train_cpu, bert_tiny_learns_contains_fp16, .timeout = 300)
{
    TrainResult r;
    train_contains(PREC_FP16, false, &r);
    cr_expect(r.eval_metric > 0.95, "dev accuracy %.3f (want > 0.95)", r.eval_metric);
    cr_expect_eq(r.skipped, 0);
}

/* Regression head (MSE) on the 0/1 target: the dev MSE falls from about
 * 0.25 (predicting the mean) to under 0.05. */
Test(train_cpu, bert_tiny_regression_mse, .timeout = 300)
{
    TrainResult r;
    train_contains(PREC_FP32, true, &r);
    cr_expect_str_eq(r.metric, "mse");
    cr_expect(r.eval_metric < 0.05, "dev mse %.4f (want < 0.05)", r.eval_metric);
}

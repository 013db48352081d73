/* tests/test_api.c — the C API of include/hpc.h on the cpu backend:
 * misuse returns codes (never a crash), numbers agree with a hand-written
 * reference, save/load round trips, training learns, and two models in one
 * process give the results each gives alone. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hpc.h"
#include "train/train_backend.h"
#include "emit_kernels.h"
#include "emit_lib.h"
#include "cpu/philox.h"
#include "formats/safetensors.h"
#include "program/spec.h"
#include "compiler/spec_load.h"

#define TB 4   /* compiled maximum batch of the test handles */
#define TL 16  /* compiled maximum length */

/* A small pre-LN decoder with a tied LM head: a second, different model. */
static const char gpt_tiny_text[] =
    "model gpt_api_tiny {\n"
    "  decoder { vocab = 97  max_positions = 32  token_types = 0  hidden = 32  layers = 2  heads = 4\n"
    "            ffn = 64  activation = gelu_tanh  norm = pre  attention = causal\n"
    "            embedding_norm = false  final_norm = true }\n"
    "  head causal_lm { tie_embeddings = true  decoder_bias = false }\n"
    "  train { optimizer = adamw { lr = 1e-3 }  batch = 4  seq_len = 16  steps = 50 }\n"
    "}\n";

static const char *root_path(const char *rel, char *buf, size_t size)
{
    const char *root = getenv("HPC_ROOT");
    snprintf(buf, size, "%s/%s", root ? root : ".", rel);
    return buf;
}

static const char *gpt_tiny_path(void)
{
    static char path[64];
    if (!path[0]) {
        snprintf(path, sizeof path, "/tmp/hpc_test_api_%d.model", (int)getpid());
        FILE *f = fopen(path, "w");
        cr_assert(f);
        fputs(gpt_tiny_text, f);
        fclose(f);
    }
    return path;
}

static HpcModel *open_model(const char *path, HpcPrecision prec, uint64_t seed)
{
    HpcModelOptions o;
    hpc_model_options_init(&o);
    o.path = path;
    o.precision = prec;
    o.max_batch = TB;
    o.max_seq_len = TL;
    o.seed = seed;
    o.total_steps = 20;
    HpcModel *m = NULL;
    char msg[2048];
    HpcApiStatus st = hpc_model_open(&o, &m, msg, sizeof msg);
    cr_assert_eq(st, HPC_API_OK, "open %s: %s", path, msg);
    cr_assert_not_null(m);
    return m;
}

static HpcModel *open_tiny(void)
{
    char p[512];
    return open_model(root_path("models/bert_tiny.model", p, sizeof p), HPC_PRECISION_FP32, 7);
}

/* Random ids in [1, vocab), all-ones masks except padding at the end of
 * row 1, labels in [0, classes). */
typedef struct {
    int32_t ids[TB * TL], mask[TB * TL], types[TB * TL], labels[TB * TL];
    HpcBatch b;
} TestBatch;

static void make_batch(TestBatch *t, int64_t B, int64_t L, int64_t vocab, int64_t classes, uint64_t seed,
                       bool per_token_labels)
{
    for (int64_t i = 0; i < B * L; i++) {
        double u0 = philox_uniform(seed, (uint64_t)i, 0, 0), u1 = philox_uniform(seed, (uint64_t)i, 0, 1);
        double u2 = philox_uniform(seed, (uint64_t)i, 0, 2);
        t->ids[i] = 1 + (int32_t)(u0 * (double)(vocab - 1)) % (int32_t)(vocab - 1);
        t->mask[i] = 1;
        t->types[i] = u1 < 0.5 ? 0 : 1;
        t->labels[i] = (int32_t)(u2 * (double)classes) % (int32_t)classes;
    }
    if (B > 1)
        for (int64_t j = L / 2; j < L; j++) t->mask[L + j] = 0, t->ids[L + j] = 0;
    t->b = (HpcBatch){.batch = B, .seq_len = L, .input_ids = t->ids, .attention_mask = t->mask,
                      .token_type_ids = t->types, .labels = t->labels};
    (void)per_token_labels;
}

static void expect_close(const float *a, const float *b, size_t n, double rtol, const char *what)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert(isfinite(a[i]) && isfinite(b[i]), "%s[%zu] not finite", what, i);
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    cr_assert(den > 0, "%s: reference is all zeros", what);
    cr_assert(sqrt(num / den) <= rtol, "%s: relative error %g > %g", what, sqrt(num / den), rtol);
}

/* ---- misuse ------------------------------------------------------------ */

Test(api_misuse, version_mismatch)
{
    char p[512], msg[512];
    HpcModelOptions o;
    hpc_model_options_init(&o);
    cr_assert_eq(o.api_version, HPC_API_VERSION);
    cr_assert_eq(hpc_api_version(), HPC_API_VERSION);
    o.path = root_path("models/bert_tiny.model", p, sizeof p);
    HpcModel *m = (HpcModel *)&o;  /* must be overwritten with NULL */
    o.api_version = (uint32_t)(HPC_API_VERSION_MAJOR + 1) << 16;
    cr_assert_eq(hpc_model_open(&o, &m, msg, sizeof msg), HPC_API_ERR_USAGE);
    cr_assert_null(m);
    cr_assert(strstr(msg, "hpc API") && strstr(msg, "rebuild"), "%s", msg);
    o.api_version = HPC_API_VERSION + 1;  /* a newer minor: its options may be larger */
    cr_assert_eq(hpc_model_open(&o, &m, msg, sizeof msg), HPC_API_ERR_USAGE);
    o.api_version = 0;                    /* forgot hpc_model_options_init */
    cr_assert_eq(hpc_model_open(&o, &m, msg, sizeof msg), HPC_API_ERR_USAGE);
}

Test(api_misuse, open_arguments)
{
    char p[512], msg[2048];
    HpcModelOptions o;
    HpcModel *m;
    cr_assert_eq(hpc_model_open(NULL, &m, msg, sizeof msg), HPC_API_ERR_USAGE);
    cr_assert(strstr(msg, "options is NULL"), "%s", msg);
    hpc_model_options_init(&o);
    cr_assert_eq(hpc_model_open(&o, &m, msg, sizeof msg), HPC_API_ERR_USAGE);
    cr_assert(strstr(msg, "path is NULL"), "%s", msg);
    o.path = root_path("models/bert_tiny.model", p, sizeof p);
    cr_assert_eq(hpc_model_open(&o, NULL, msg, sizeof msg), HPC_API_ERR_USAGE);
    cr_assert_eq(hpc_model_open(&o, &m, NULL, 0), HPC_API_OK);  /* errbuf is optional */
    hpc_model_free(m);
    o.backend = (HpcBackend)9;
    cr_assert_eq(hpc_model_open(&o, &m, msg, sizeof msg), HPC_API_ERR_USAGE);
    o.backend = HPC_BACKEND_CPU;
    o.max_seq_len = 100000;  /* over max_positions */
    cr_assert_eq(hpc_model_open(&o, &m, msg, sizeof msg), HPC_API_ERR_USAGE);
    cr_assert(strstr(msg, "positions"), "%s", msg);
    o.max_seq_len = -1;
    cr_assert_eq(hpc_model_open(&o, &m, msg, sizeof msg), HPC_API_ERR_USAGE);
    o.max_seq_len = 0;
    o.path = "/nonexistent/dir/x.model";
    cr_assert_eq(hpc_model_open(&o, &m, msg, sizeof msg), HPC_API_ERR_IO);
    cr_assert(strstr(msg, "/nonexistent/dir/x.model"), "%s", msg);
    o.path = root_path("tests/data/bad/batch_zero.model", p, sizeof p);
    cr_assert_eq(hpc_model_open(&o, &m, msg, sizeof msg), HPC_API_ERR_INPUT);
    cr_assert(strstr(msg, "batch_zero.model:"), "located diagnostic expected: %s", msg);
    o.path = "/nonexistent/x.hpc";
    cr_assert_neq(hpc_model_open(&o, &m, msg, sizeof msg), HPC_API_OK);
    cr_assert_null(m);
}

Test(api_misuse, null_and_invalid_handles)
{
    /* A handle-sized block without the magic: what a freed or forged
     * handle looks like to the library. */
    static uint64_t fake[4096];
    HpcModel *bad = (HpcModel *)fake;
    HpcModel *handles[2] = {NULL, bad};
    TestBatch t;
    make_batch(&t, 2, 8, 100, 2, 1, false);
    float out[64];
    double loss;
    HpcModelInfo info;
    HpcStepReport rep;
    for (int i = 0; i < 2; i++) {
        HpcModel *m = handles[i];
        cr_assert_eq(hpc_model_forward(m, &t.b, out, 64), HPC_API_ERR_USAGE);
        cr_assert_eq(hpc_model_hidden(m, &t.b, out, 64), HPC_API_ERR_USAGE);
        cr_assert_eq(hpc_model_evaluate(m, &t.b, &loss, out, 64), HPC_API_ERR_USAGE);
        cr_assert_eq(hpc_model_train_step(m, &t.b, &rep), HPC_API_ERR_USAGE);
        cr_assert_eq(hpc_model_info(m, &info), HPC_API_ERR_USAGE);
        cr_assert_eq(hpc_model_load_weights(m, "x.safetensors"), HPC_API_ERR_USAGE);
        cr_assert_eq(hpc_model_save_weights(m, "/tmp/never.safetensors"), HPC_API_ERR_USAGE);
        cr_assert(strlen(hpc_model_error(m)) > 10);
        hpc_model_free(m);  /* a no-op */
    }
    cr_assert(strstr(hpc_model_error(bad), "invalid"));
    cr_assert_str_eq(hpc_api_status_name(HPC_API_ERR_USAGE), "usage");
    cr_assert_str_eq(hpc_api_status_name(HPC_API_OK), "ok");
}

/* Each bad batch fails with its code and leaves the model usable: the next
 * good call gives the same logits as before. */
Test(api_misuse, bad_batches, .timeout = 120)
{
    HpcModel *m = open_tiny();
    TestBatch t;
    make_batch(&t, 3, 12, 30522, 2, 5, false);
    float ref[TB * 2], out[TB * 2];
    cr_assert_eq(hpc_model_forward(m, &t.b, ref, TB * 2), HPC_API_OK, "%s", hpc_model_error(m));
    cr_assert_str_eq(hpc_model_error(m), "");

    HpcBatch b = t.b;
    b.batch = TB + 1;
    cr_assert_eq(hpc_model_forward(m, &b, out, TB * 2), HPC_API_ERR_USAGE);
    cr_assert(strstr(hpc_model_error(m), "compiled maximum"), "%s", hpc_model_error(m));
    b = t.b, b.seq_len = TL + 1;
    cr_assert_eq(hpc_model_forward(m, &b, out, TB * 2), HPC_API_ERR_USAGE);
    b = t.b, b.seq_len = 0;
    cr_assert_eq(hpc_model_forward(m, &b, out, TB * 2), HPC_API_ERR_USAGE);
    b = t.b, b.batch = -3;
    cr_assert_eq(hpc_model_forward(m, &b, out, TB * 2), HPC_API_ERR_USAGE);
    b = t.b, b.input_ids = NULL;
    cr_assert_eq(hpc_model_forward(m, &b, out, TB * 2), HPC_API_ERR_USAGE);
    b = t.b, b.attention_mask = NULL;
    cr_assert_eq(hpc_model_forward(m, &b, out, TB * 2), HPC_API_ERR_USAGE);
    cr_assert_eq(hpc_model_forward(m, NULL, out, TB * 2), HPC_API_ERR_USAGE);
    cr_assert_eq(hpc_model_forward(m, &t.b, NULL, TB * 2), HPC_API_ERR_USAGE);
    cr_assert_eq(hpc_model_forward(m, &t.b, out, 5), HPC_API_ERR_USAGE);  /* needs 6 */
    cr_assert(strstr(hpc_model_error(m), "needs 6 floats"), "%s", hpc_model_error(m));

    int32_t id7 = t.ids[7];
    t.ids[7] = 30522;
    cr_assert_eq(hpc_model_forward(m, &t.b, out, TB * 2), HPC_API_ERR_INPUT);
    cr_assert(strstr(hpc_model_error(m), "input_ids[7] = 30522"), "%s", hpc_model_error(m));
    t.ids[7] = -1;
    cr_assert_eq(hpc_model_forward(m, &t.b, out, TB * 2), HPC_API_ERR_INPUT);
    t.ids[7] = id7;
    int32_t keep = t.mask[3];
    t.mask[3] = 2;
    cr_assert_eq(hpc_model_forward(m, &t.b, out, TB * 2), HPC_API_ERR_INPUT);
    t.mask[3] = keep;
    t.types[4] = 2;
    cr_assert_eq(hpc_model_forward(m, &t.b, out, TB * 2), HPC_API_ERR_INPUT);
    t.types[4] = 0;
    int32_t row2[12];
    memcpy(row2, t.mask + 24, sizeof row2);
    memset(t.mask + 24, 0, sizeof row2);
    cr_assert_eq(hpc_model_forward(m, &t.b, out, TB * 2), HPC_API_ERR_INPUT);
    cr_assert(strstr(hpc_model_error(m), "row 2"), "%s", hpc_model_error(m));
    memcpy(t.mask + 24, row2, sizeof row2);

    HpcStepReport rep;
    t.labels[1] = 2;  /* 2 labels: 0 or 1 */
    cr_assert_eq(hpc_model_train_step(m, &t.b, &rep), HPC_API_ERR_INPUT);
    t.labels[1] = 1;
    b = t.b, b.labels = NULL;
    cr_assert_eq(hpc_model_train_step(m, &b, &rep), HPC_API_ERR_USAGE);
    double loss;
    cr_assert_eq(hpc_model_evaluate(m, &b, &loss, NULL, 0), HPC_API_ERR_USAGE);
    cr_assert_eq(hpc_model_evaluate(m, &t.b, NULL, NULL, 0), HPC_API_ERR_USAGE);

    cr_assert_eq(hpc_model_forward(m, &t.b, out, TB * 2), HPC_API_OK, "%s", hpc_model_error(m));
    for (int i = 0; i < 6; i++) cr_assert_eq(out[i], ref[i], "logit %d changed after failed calls", i);
    HpcModelInfo info;
    cr_assert_eq(hpc_model_info(m, &info), HPC_API_OK);
    cr_assert_eq(info.steps, 0, "a failed train step must not count");
    hpc_model_free(m);
}

Test(api_misuse, bad_weights, .timeout = 120)
{
    HpcModel *m = open_tiny();
    HpcModel *g = open_model(gpt_tiny_path(), HPC_PRECISION_FP32, 3);
    char path[64];
    snprintf(path, sizeof path, "/tmp/hpc_test_api_w_%d.safetensors", (int)getpid());
    cr_assert_eq(hpc_model_save_weights(g, path), HPC_API_OK, "%s", hpc_model_error(g));
    TestBatch t;
    make_batch(&t, 2, 8, 30522, 2, 9, false);
    float before[4], after[4];
    cr_assert_eq(hpc_model_forward(m, &t.b, before, 4), HPC_API_OK);
    cr_assert_neq(hpc_model_load_weights(m, path), HPC_API_OK);  /* another model's weights */
    cr_assert(strlen(hpc_model_error(m)) > 0);
    HpcApiStatus st = hpc_model_load_weights(m, "/nonexistent.safetensors");
    cr_assert(st == HPC_API_ERR_IO || st == HPC_API_ERR_INPUT, "%d %s", st, hpc_model_error(m));
    cr_assert(strstr(hpc_model_error(m), "hpc_model_load_weights: ") == hpc_model_error(m));
    cr_assert(strstr(hpc_model_error(m), "/nonexistent.safetensors"), "%s", hpc_model_error(m));
    cr_assert_eq(hpc_model_load_weights(m, NULL), HPC_API_ERR_USAGE);
    cr_assert_eq(hpc_model_save_weights(m, "/nonexistent/dir/w.safetensors"), HPC_API_ERR_IO);
    cr_assert_eq(hpc_model_forward(m, &t.b, after, 4), HPC_API_OK);
    for (int i = 0; i < 4; i++) cr_assert_eq(after[i], before[i]);
    remove(path);
    remove(gpt_tiny_path());
    hpc_model_free(g);
    hpc_model_free(m);
}

/* ---- numbers ----------------------------------------------------------- */

static const float *tensor_f32(StFile *f, const char *name, int64_t numel)
{
    const StTensor *t = st_find(f, name);
    cr_assert_not_null(t, "%s missing", name);
    cr_assert_eq(t->dtype, ST_F32);
    cr_assert_eq((int64_t)t->numel, numel);
    return t->data;
}

/* logits = classifier(tanh(pooler(hidden[:, 0]))), from the saved weights in
 * f64: ties the hidden states, the logits and the saved file together.
 * Under fp16 too (rtol 1e-2: the model rounds the pooler's and the
 * classifier's GEMM inputs to 16 bits): the C API compiles every layer over
 * every token, since the trainer's last layer for token 0 (compiler/lower.h)
 * would leave it no last hidden states. */
static void hidden_pooler_logits(HpcPrecision precision, double rtol)
{
    char mp[512];
    HpcModel *m = open_model(root_path("models/bert_tiny.model", mp, sizeof mp), precision, 7);
    enum { B = 3, L = 10, H = 128, C = 2 };
    TestBatch t;
    make_batch(&t, B, L, 30522, C, 11, false);
    static float hidden[B * L * H];
    float logits[B * C];
    cr_assert_eq(hpc_model_hidden(m, &t.b, hidden, B * L * H), HPC_API_OK, "%s", hpc_model_error(m));
    cr_assert_eq(hpc_model_hidden(m, &t.b, hidden, B * L * H - 1), HPC_API_ERR_USAGE);
    cr_assert_eq(hpc_model_forward(m, &t.b, logits, B * C), HPC_API_OK);
    char path[64];
    snprintf(path, sizeof path, "/tmp/hpc_test_api_p_%d.safetensors", (int)getpid());
    cr_assert_eq(hpc_model_save_weights(m, path), HPC_API_OK, "%s", hpc_model_error(m));
    StFile *f;
    HpcError err;
    cr_assert_eq(st_open(path, &f, &err), 0, "%s", err.msg);
    const float *wp = tensor_f32(f, "bert.pooler.dense.weight", H * H);
    const float *bp = tensor_f32(f, "bert.pooler.dense.bias", H);
    const float *wc = tensor_f32(f, "classifier.weight", C * H);
    const float *bc = tensor_f32(f, "classifier.bias", C);
    float ref[B * C];
    for (int b = 0; b < B; b++) {
        const float *h0 = hidden + (size_t)b * L * H;  /* the [CLS] position */
        double pooled[H];
        for (int o = 0; o < H; o++) {
            double s = bp[o];
            for (int i = 0; i < H; i++) s += (double)wp[o * H + i] * h0[i];
            pooled[o] = tanh(s);
        }
        for (int c = 0; c < C; c++) {
            double s = bc[c];
            for (int i = 0; i < H; i++) s += (double)wc[c * H + i] * pooled[i];
            ref[b * C + c] = (float)s;
        }
    }
    expect_close(logits, ref, B * C, rtol, "logits");
    st_close(f);
    remove(path);
    hpc_model_free(m);
}

Test(api_numbers, hidden_pooler_logits, .timeout = 120) { hidden_pooler_logits(HPC_PRECISION_FP32, 1e-5); }
Test(api_numbers, hidden_pooler_logits_fp16, .timeout = 120) { hidden_pooler_logits(HPC_PRECISION_FP16, 1e-2); }

/* Padding is invisible: a row padded to L gives the logits of the same row
 * run at its real length. */
Test(api_numbers, padding_invariance, .timeout = 120)
{
    HpcModel *m = open_tiny();
    TestBatch t;
    make_batch(&t, 2, 12, 30522, 2, 13, false);  /* row 1: 6 tokens + 6 padding */
    float both[4], alone[2];
    cr_assert_eq(hpc_model_forward(m, &t.b, both, 4), HPC_API_OK, "%s", hpc_model_error(m));
    HpcBatch one = {.batch = 1, .seq_len = 6, .input_ids = t.ids + 12, .attention_mask = t.mask + 12,
                    .token_type_ids = t.types + 12};
    cr_assert_eq(hpc_model_forward(m, &one, alone, 2), HPC_API_OK, "%s", hpc_model_error(m));
    expect_close(both + 2, alone, 2, 1e-5, "padded row");
    hpc_model_free(m);
}

/* Training on one batch drives its loss down; save + load in a fresh handle
 * reproduces the trained logits bit for bit. */
Test(api_numbers, train_save_load, .timeout = 300)
{
    HpcModel *m = open_tiny();
    TestBatch t;
    make_batch(&t, TB, TL, 30522, 2, 17, false);
    double loss0, loss1;
    cr_assert_eq(hpc_model_evaluate(m, &t.b, &loss0, NULL, 0), HPC_API_OK, "%s", hpc_model_error(m));
    HpcStepReport rep = {0};
    for (int s = 0; s < 12; s++) {
        cr_assert_eq(hpc_model_train_step(m, &t.b, &rep), HPC_API_OK, "%s", hpc_model_error(m));
        cr_assert(isfinite(rep.loss) && !rep.skipped);
    }
    cr_assert_eq(rep.step, 12);
    cr_assert(rep.lr > 0 && rep.grad_norm > 0 && isfinite(rep.grad_norm));
    float trained[TB * 2];
    cr_assert_eq(hpc_model_evaluate(m, &t.b, &loss1, trained, TB * 2), HPC_API_OK);
    cr_assert(loss1 < 0.5 * loss0, "loss %g -> %g: training did not learn the batch", loss0, loss1);

    char path[64];
    snprintf(path, sizeof path, "/tmp/hpc_test_api_t_%d.safetensors", (int)getpid());
    cr_assert_eq(hpc_model_save_weights(m, path), HPC_API_OK, "%s", hpc_model_error(m));
    HpcModel *fresh = open_tiny();
    float before[TB * 2], loaded[TB * 2];
    cr_assert_eq(hpc_model_forward(fresh, &t.b, before, TB * 2), HPC_API_OK);
    cr_assert_eq(hpc_model_load_weights(fresh, path), HPC_API_OK, "%s", hpc_model_error(fresh));
    cr_assert_eq(hpc_model_forward(fresh, &t.b, loaded, TB * 2), HPC_API_OK);
    bool moved = false;
    for (int i = 0; i < TB * 2; i++) {
        cr_assert_eq(loaded[i], trained[i], "logit %d: %g vs %g", i, loaded[i], trained[i]);
        moved |= before[i] != trained[i];
    }
    cr_assert(moved);
    remove(path);
    hpc_model_free(fresh);
    hpc_model_free(m);
}

/* Loading weights starts the optimizer over (zero moments, step 0, the
 * initial scale) while the dropout stream goes on: two handles at the same
 * micro-step whose optimizers saw different batches take the same next step
 * after loading the same weights. */
Test(api_numbers, load_weights_resets_the_optimizer, .timeout = 120)
{
    HpcModel *m = open_tiny(), *f = open_tiny();
    TestBatch t1, t2;
    make_batch(&t1, TB, TL, 30522, 2, 23, false);
    make_batch(&t2, TB, TL, 30522, 2, 29, false);
    HpcStepReport rm, rf;
    for (int s = 0; s < 3; s++) {
        cr_assert_eq(hpc_model_train_step(m, &t1.b, &rm), HPC_API_OK, "%s", hpc_model_error(m));
        cr_assert_eq(hpc_model_train_step(f, &t2.b, &rf), HPC_API_OK, "%s", hpc_model_error(f));
    }
    char path[64];
    snprintf(path, sizeof path, "/tmp/hpc_test_api_r_%d.safetensors", (int)getpid());
    cr_assert_eq(hpc_model_save_weights(m, path), HPC_API_OK, "%s", hpc_model_error(m));
    cr_assert_eq(hpc_model_load_weights(m, path), HPC_API_OK, "%s", hpc_model_error(m));
    cr_assert_eq(hpc_model_load_weights(f, path), HPC_API_OK, "%s", hpc_model_error(f));
    HpcModelInfo info;
    cr_assert_eq(hpc_model_info(m, &info), HPC_API_OK);
    cr_expect_eq(info.steps, 0);
    for (int s = 0; s < 2; s++) {   /* two: the first may have lr 0 (warm-up) */
        cr_assert_eq(hpc_model_train_step(m, &t1.b, &rm), HPC_API_OK, "%s", hpc_model_error(m));
        cr_assert_eq(hpc_model_train_step(f, &t1.b, &rf), HPC_API_OK, "%s", hpc_model_error(f));
    }
    cr_expect_eq(rm.step, 2);
    cr_expect_eq(rf.step, 2);
    cr_expect_gt(rm.lr, 0);
    cr_expect_eq(rm.loss, rf.loss, "loss %.9g vs %.9g", rm.loss, rf.loss);
    cr_expect_eq(rm.grad_norm, rf.grad_norm);
    cr_expect_eq(rm.lr, rf.lr);
    float lm[TB * 2], lf[TB * 2];
    cr_assert_eq(hpc_model_forward(m, &t1.b, lm, TB * 2), HPC_API_OK);
    cr_assert_eq(hpc_model_forward(f, &t1.b, lf, TB * 2), HPC_API_OK);
    for (int i = 0; i < TB * 2; i++) cr_expect_eq(lm[i], lf[i], "logit %d after the step: %g vs %g", i, lm[i], lf[i]);
    remove(path);
    hpc_model_free(f);
    hpc_model_free(m);
}

/* fp16 policy: the loss scaler runs (scale 65536 from the model file's
 * defaults), steps apply, logits are close to the fp32 model's. */
Test(api_numbers, fp16_policy, .timeout = 120)
{
    char p[512];
    HpcModel *h = open_model(root_path("models/bert_tiny.model", p, sizeof p), HPC_PRECISION_FP16, 7);
    HpcModel *f = open_tiny();
    HpcModelInfo info;
    cr_assert_eq(hpc_model_info(h, &info), HPC_API_OK);
    cr_assert_eq(info.precision, HPC_PRECISION_FP16);
    cr_assert_eq(info.loss_scale, 65536.0);
    TestBatch t;
    make_batch(&t, TB, TL, 30522, 2, 19, false);
    float lh[TB * 2], lf[TB * 2];
    cr_assert_eq(hpc_model_forward(h, &t.b, lh, TB * 2), HPC_API_OK);
    cr_assert_eq(hpc_model_forward(f, &t.b, lf, TB * 2), HPC_API_OK);
    expect_close(lh, lf, TB * 2, 2e-2, "fp16 vs fp32 logits");
    HpcStepReport rep;
    cr_assert_eq(hpc_model_train_step(h, &t.b, &rep), HPC_API_OK, "%s", hpc_model_error(h));
    cr_assert_eq(rep.step, rep.skipped ? 0 : 1);
    hpc_model_free(f);
    hpc_model_free(h);
}

/* ---- several handles ---------------------------------------------------- */

typedef struct { float logits[TB * TL * 97]; double loss[3]; } Trace;

/* Forward, three train steps, forward again; records everything. */
static void run_trace(HpcModel *m, const TestBatch *t, Trace *tr, size_t cap, int phase)
{
    HpcStepReport rep;
    if (phase == 0)
        cr_assert_eq(hpc_model_forward(m, &t->b, tr->logits, cap), HPC_API_OK, "%s", hpc_model_error(m));
    else if (phase <= 3) {
        cr_assert_eq(hpc_model_train_step(m, &t->b, &rep), HPC_API_OK, "%s", hpc_model_error(m));
        tr->loss[phase - 1] = rep.loss;
    } else {
        cr_assert_eq(hpc_model_forward(m, &t->b, tr->logits, cap), HPC_API_OK, "%s", hpc_model_error(m));
    }
}

static void expect_same(const Trace *a, const Trace *b, size_t n, const char *what)
{
    for (int i = 0; i < 3; i++) cr_assert_eq(a->loss[i], b->loss[i], "%s loss %d", what, i);
    for (size_t i = 0; i < n; i++) cr_assert_eq(a->logits[i], b->logits[i], "%s logit %zu", what, i);
}

Test(api_handles, two_models_match_each_alone, .timeout = 300)
{
    TestBatch tb, tg;
    make_batch(&tb, TB, TL, 30522, 2, 23, false);
    make_batch(&tg, TB, TL, 97, 97, 29, true);
    tg.b.token_type_ids = NULL;
    static Trace bert_alone, gpt_alone, bert_both, gpt_both;
    size_t nb = TB * 2, ng = TB * TL * 97;

    HpcModel *b = open_tiny();
    for (int ph = 0; ph <= 4; ph++) run_trace(b, &tb, &bert_alone, nb, ph);
    hpc_model_free(b);
    HpcModel *g = open_model(gpt_tiny_path(), HPC_PRECISION_FP32, 3);
    HpcModelInfo info;
    cr_assert_eq(hpc_model_info(g, &info), HPC_API_OK);
    cr_assert_eq(info.logits_per_token, 1);
    cr_assert_eq(info.logits_per_row, 97);
    for (int ph = 0; ph <= 4; ph++) run_trace(g, &tg, &gpt_alone, ng, ph);
    hpc_model_free(g);

    b = open_tiny();
    g = open_model(gpt_tiny_path(), HPC_PRECISION_FP32, 3);
    for (int ph = 0; ph <= 4; ph++) {  /* interleaved */
        run_trace(g, &tg, &gpt_both, ng, ph);
        run_trace(b, &tb, &bert_both, nb, ph);
    }
    expect_same(&bert_both, &bert_alone, nb, "bert_tiny");
    expect_same(&gpt_both, &gpt_alone, ng, "gpt_api_tiny");
    cr_assert(gpt_both.loss[2] < gpt_both.loss[0]);
    hpc_model_free(b);
    hpc_model_free(g);
    remove(gpt_tiny_path());
}

/* ---- in-memory model text ---------------------------------------------- */

Test(api_misuse, model_text)
{
    HpcModelOptions o;
    hpc_model_options_init(&o);
    o.model_text = gpt_tiny_text;
    HpcModel *m;
    char msg[2048];
    cr_assert_eq(hpc_model_open(&o, &m, msg, sizeof msg), HPC_API_OK, "%s", msg);
    HpcModelInfo info;
    cr_assert_eq(hpc_model_info(m, &info), HPC_API_OK);
    cr_assert_str_eq(info.name, "gpt_api_tiny");
    cr_assert_eq(info.max_batch, 4);
    cr_assert_eq(info.max_seq_len, 16);
    hpc_model_free(m);
    o.model_text = "model broken { encoder { hidden = 0 } }";
    cr_assert_eq(hpc_model_open(&o, &m, msg, sizeof msg), HPC_API_ERR_INPUT);
    cr_assert(strstr(msg, "<model_text>:1:"), "located diagnostic expected: %s", msg);
}

/* ---- --emit-cuda and --emit-lib ---------------------------------------- */

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s missing", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

static bool load_spec(const char *rel, ModelSpec *spec)
{
    char p[512];
    return spec_load(root_path(rel, p, sizeof p), spec, stderr) == 0;
}

Test(emit_lib, cuda_header)
{
    ModelSpec spec;
    cr_assert(load_spec("models/bert_tiny.model", &spec));
    char dir[64], path[128];
    snprintf(dir, sizeof dir, "/tmp/hpc_test_emit_%d", (int)getpid());
    HpcError err = {0};
    cr_assert_eq(emitlib_cuda(&spec, PREC_FP16, dir, &err), HPC_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/bert_tiny_kernels.cuh", dir);
    char *s = slurp(path);
    for (int k = 0; k < kemit_kernel_count; k++) {
        char alias[128];
        snprintf(alias, sizeof alias, "#define HPC_KERNEL_%s %s_f16_h128_", kemit_kernel_bases[k],
                 kemit_kernel_bases[k]);
        cr_assert(strstr(s, alias), "no alias for %s", kemit_kernel_bases[k]);
        snprintf(alias, sizeof alias, "(HPC_KERNEL_%s)\n", kemit_kernel_bases[k]);
        cr_assert(strstr(s, alias), "no documented signature for %s", kemit_kernel_bases[k]);
    }
    cr_assert(strstr(s, "#define HPC_HIDDEN 128"));
    cr_assert(strstr(s, "//         const st_t *gamma, const st_t *beta, // (H)"), "ln_fwd's parameters");
    free(s);
    remove(path);
    cr_assert_eq(emitlib_cuda(&spec, PREC_FP16, "/nonexistent/x/y", &err), HPC_ERR_IO);
    cr_assert(strstr(err.msg, "/nonexistent/x/y"), "%s", err.msg);
    rmdir(dir);
    int archs[8], n;
    cr_assert(emitlib_parse_archs("80,sm_90", archs, &n) && n == 2 && archs[0] == 80 && archs[1] == 90);
    cr_assert(emitlib_parse_archs("80,90,sm_80,80", archs, &n) && n == 2 && archs[0] == 80 && archs[1] == 90,
              "an arch given twice counts once (n %d)", n);
    cr_assert(!emitlib_parse_archs("80,", archs, &n) || n == 1);
    cr_assert(!emitlib_parse_archs("sm_x", archs, &n));
    cr_assert(!emitlib_parse_archs("", archs, &n));
}

/* The package builds with its own Makefile against this checkout's
 * libraries and its demo runs (cpu backend). */
Test(emit_lib, package_builds_and_runs, .timeout = 300)
{
    ModelSpec spec;
    cr_assert(load_spec("models/bert_tiny.model", &spec));
    char dir[64], root[4096], cmd[8192];
    snprintf(dir, sizeof dir, "/tmp/hpc_test_pkg_%d", (int)getpid());
    char rel[512];
    cr_assert_not_null(realpath(root_path(".", rel, sizeof rel), root));
    EmitLibOptions o = {.policy = PREC_FP32, .plan_text = "plan\n", .hpc_root = root};
    HpcError err = {0};
    cr_assert_eq(emitlib_package(&spec, &o, dir, &err), HPC_OK, "%s", err.msg);
    snprintf(cmd, sizeof cmd, "make -s -C %s run > %s/run.log 2>&1", dir, dir);
    int rc = system(cmd);
    snprintf(cmd, sizeof cmd, "%s/run.log", dir);
    char *log = slurp(cmd);
    cr_assert_eq(rc, 0, "package build or demo failed:\n%s", log);
    cr_assert(strstr(log, "bert_tiny: logits[0][0..1] = "), "%s", log);
    free(log);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* ---- backends ------------------------------------------------------------ */

/* Referencing the cuda backend links it in (api.c only refers to train_cuda_open weakly). */
__attribute__((used)) static TrainCudaOpenFn *const link_cuda = train_cuda_open;

/* Without a usable GPU (CI): cuda fails with NO_GPU and a reason, auto
 * falls back to the cpu and says why.  On a GPU machine both open. */
Test(api_backends, cuda_or_auto_without_gpu, .timeout = 300)
{
    cr_assert_not_null(link_cuda);
    char p[512], msg[2048];
    HpcModelOptions o;
    hpc_model_options_init(&o);
    o.path = root_path("models/bert_tiny.model", p, sizeof p);
    o.max_batch = 2;
    o.max_seq_len = 8;
    o.backend = HPC_BACKEND_CUDA;
    HpcModel *m;
    HpcApiStatus st = hpc_model_open(&o, &m, msg, sizeof msg);
    if (st == HPC_API_OK) {  /* a GPU machine */
        hpc_model_free(m);
        return;
    }
    cr_assert_eq(st, HPC_API_ERR_NO_GPU, "%d: %s", st, msg);
    cr_assert(strlen(msg) > 20, "%s", msg);
    cr_assert(!strstr(msg, "linked without"), "the cuda backend should be linked in: %s", msg);
    o.backend = HPC_BACKEND_AUTO;
    cr_assert_eq(hpc_model_open(&o, &m, msg, sizeof msg), HPC_API_OK, "%s", msg);
    HpcModelInfo info;
    cr_assert_eq(hpc_model_info(m, &info), HPC_API_OK);
    cr_assert(strncmp(info.backend, "cpu (no GPU: ", 13) == 0, "%s", info.backend);
    hpc_model_free(m);
}

/* ---- threads ------------------------------------------------------------- */

typedef struct {
    HpcModel *m;
    const TestBatch *t;
    Trace *tr;
    size_t cap;
    int status;         /* first failing HpcApiStatus, 0 if none */
} ThreadJob;

/* run_trace without Criterion asserts (they belong to the main thread). */
static void *thread_trace(void *arg)
{
    ThreadJob *j = arg;
    HpcStepReport rep;
    for (int ph = 0; ph <= 4 && !j->status; ph++) {
        if (ph == 0 || ph == 4) j->status = hpc_model_forward(j->m, &j->t->b, j->tr->logits, j->cap);
        else if (!(j->status = hpc_model_train_step(j->m, &j->t->b, &rep))) j->tr->loss[ph - 1] = rep.loss;
    }
    return NULL;
}

/* Two handles used by two threads at once give what each gives alone. */
Test(api_handles, two_threads, .timeout = 300)
{
    TestBatch tb, tg;
    make_batch(&tb, TB, TL, 30522, 2, 31, false);
    make_batch(&tg, TB, TL, 97, 97, 37, true);
    tg.b.token_type_ids = NULL;
    static Trace bert_alone, gpt_alone, bert_thr, gpt_thr;
    size_t nb = TB * 2, ng = TB * TL * 97;
    HpcModel *b = open_tiny(), *g = open_model(gpt_tiny_path(), HPC_PRECISION_FP32, 3);
    for (int ph = 0; ph <= 4; ph++) run_trace(b, &tb, &bert_alone, nb, ph);
    for (int ph = 0; ph <= 4; ph++) run_trace(g, &tg, &gpt_alone, ng, ph);
    hpc_model_free(b);
    hpc_model_free(g);

    b = open_tiny();
    g = open_model(gpt_tiny_path(), HPC_PRECISION_FP32, 3);
    ThreadJob jb = {b, &tb, &bert_thr, nb, 0}, jg = {g, &tg, &gpt_thr, ng, 0};
    pthread_t th[2];
    cr_assert_eq(pthread_create(&th[0], NULL, thread_trace, &jb), 0);
    cr_assert_eq(pthread_create(&th[1], NULL, thread_trace, &jg), 0);
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);
    cr_assert_eq(jb.status, 0, "%s", hpc_model_error(b));
    cr_assert_eq(jg.status, 0, "%s", hpc_model_error(g));
    expect_same(&bert_thr, &bert_alone, nb, "bert_tiny (thread)");
    expect_same(&gpt_thr, &gpt_alone, ng, "gpt_api_tiny (thread)");
    hpc_model_free(b);
    hpc_model_free(g);
    remove(gpt_tiny_path());
}

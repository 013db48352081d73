/* tests/test_hf_output.c — the pretrained path end to end, without the
 * network: a tiny Hugging Face folder made here (random weights, the real
 * BERT vocabulary from data/vocab, config.json, tokenizer_config.json) goes
 * through `hpc import`, `hpc run --init DIR` (cpu, a few steps on a slice
 * of CoLA, run outside the repository so the vocabulary must come from DIR)
 * and `--output DIR2`; then DIR2's files are checked (config fields, tensor
 * names and shapes, tokenizer files), and `--init DIR2` must give the dev
 * loss of the best evaluation of the first run. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "formats/hf_config.h"
#include "formats/hf_names.h"
#include "formats/safetensors.h"
#include "lower.h"
#include "report/runlog.h"
#include "hf_tiny.h"

#define VOCAB "data/vocab/bert-base-uncased-vocab.txt"
#define HIDDEN 32

static char root[PATH_MAX], work[PATH_MAX];

static void path_in(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", work, name); }

static void write_text(const char *name, const char *text)
{
    char p[PATH_MAX + 64];
    path_in(p, sizeof p, name);
    FILE *f = fopen(p, "w");
    cr_assert(f, "create %s", p);
    fputs(text, f);
    fclose(f);
}

/* The first n lines of the repository's file src into work/name. */
static void copy_lines(const char *src, const char *name, int n)
{
    char from[PATH_MAX + 64], to[PATH_MAX + 64], line[4096];
    snprintf(from, sizeof from, "%s/%s", root, src);
    path_in(to, sizeof to, name);
    FILE *in = fopen(from, "r"), *out = fopen(to, "w");
    cr_assert(in && out, "copy %s -> %s", from, to);
    for (int i = 0; (n < 0 || i < n) && fgets(line, sizeof line, in); i++) fputs(line, out);
    fclose(in);
    fclose(out);
}

/* Runs a shell command in work; output (stdout + stderr) into out; the exit code. */
static int sh(const char *cmd, char *out, size_t cap)
{
    char full[16384 + 64];
    snprintf(full, sizeof full, "cd %s && %s 2>&1", work, cmd);
    FILE *p = popen(full, "r");
    cr_assert(p, "popen");
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* tiny/: the shared tiny folder (tests/hf_tiny.h). */
static void make_hf_folder(void)
{
    char dir[PATH_MAX + 64];
    path_in(dir, sizeof dir, "tiny");
    hf_tiny_make(root, dir);
}

static void setup(void)
{
    cr_assert(getcwd(root, sizeof root));
    if (getenv("HPC_ROOT")) snprintf(root, sizeof root, "%s", getenv("HPC_ROOT"));
    snprintf(work, sizeof work, "/tmp/hpc_test_hf_output_%d", (int)getpid());
    cr_assert_eq(mkdir(work, 0755), 0, "mkdir %s", work);
    char d[PATH_MAX + 64];
    path_in(d, sizeof d, "cola");
    cr_assert_eq(mkdir(d, 0755), 0);
    copy_lines("data/cola/train.tsv", "cola/train.tsv", 96);
    copy_lines("data/cola/dev.tsv", "cola/dev.tsv", 48);
    make_hf_folder();
}

static void teardown(void)
{
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf %s", work);
    cr_expect_eq(system(cmd), 0);
}

/* The loss of the last eval event marked best in a JSONL log (NAN when
 * none); *final_loss = that of the last eval event when not NULL. */
static double best_eval_loss(const char *name, double *final_loss)
{
    char p[PATH_MAX + 64], line[4096];
    path_in(p, sizeof p, name);
    FILE *f = fopen(p, "r");
    cr_assert(f, "open %s", p);
    double loss = NAN;
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        bool eval = o && !strcmp(json_string_value(json_object_get(o, "event")), "eval");
        if (eval && json_is_true(json_object_get(o, "best"))) loss = json_real_value(json_object_get(o, "loss"));
        if (eval && final_loss) *final_loss = json_real_value(json_object_get(o, "loss"));
        json_decref(o);
    }
    fclose(f);
    return loss;
}

static json_t *load_json(const char *name)
{
    char p[PATH_MAX + 64];
    path_in(p, sizeof p, name);
    json_error_t je;
    json_t *o = json_load_file(p, 0, &je);
    cr_assert(o, "%s: %s", p, je.text);
    return o;
}

/* The summary of a cpu run agrees with its step events: steps, tokens,
 * training time = the sum of the step times (within the wall time),
 * tokens/s over that time, and the last rate = 1 / the smoothed step time
 * (first step left out; runlog.h). */
static void check_summary_arithmetic(const char *name, int64_t want_steps)
{
    char p[PATH_MAX + 64], line[4096];
    path_in(p, sizeof p, name);
    FILE *f = fopen(p, "r");
    cr_assert(f, "open %s", p);
    int64_t steps = 0, tokens = 0;
    double sum_s = 0, smooth = 0, last_rate = NAN;
    json_t *summary = NULL;
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        cr_assert(o, "JSON line in %s", p);
        const char *ev = json_string_value(json_object_get(o, "event"));
        if (!strcmp(ev, "step")) {
            double dt = json_real_value(json_object_get(o, "step_s"));
            cr_expect(dt > 0, "step %lld has a time", (long long)steps + 1);
            tokens += json_integer_value(json_object_get(o, "tokens"));
            sum_s += dt;
            if (steps++ > 0) smooth = smooth > 0 ? (1 - RUNLOG_RATE_ALPHA) * smooth + RUNLOG_RATE_ALPHA * dt : dt;
            last_rate = json_number_value(json_object_get(o, "it_per_s"));
        }
        if (!strcmp(ev, "summary")) summary = json_incref(o);
        json_decref(o);
    }
    fclose(f);
    cr_assert(summary, "a summary in %s", p);
    double train = json_real_value(json_object_get(summary, "train_s"));
    cr_expect_eq(steps, want_steps);
    cr_expect_eq(json_integer_value(json_object_get(summary, "steps")), steps);
    cr_expect_eq(json_integer_value(json_object_get(summary, "tokens")), tokens);
    cr_expect(fabs(train - sum_s) <= 1e-9 * sum_s, "train_s %.9g, sum of step_s %.9g", train, sum_s);
    cr_expect(train <= json_real_value(json_object_get(summary, "wall_s")), "training time within the wall time");
    cr_expect(fabs(json_real_value(json_object_get(summary, "tokens_per_s")) - (double)tokens / train) <=
              1e-9 * (double)tokens / train);
    cr_expect(fabs(last_rate - 1 / smooth) <= 1e-9 / smooth, "it/s %.9g, 1 / smoothed step time %.9g", last_rate,
              1 / smooth);
    json_decref(summary);
}

static void expect_tensor(const StFile *f, const char *name, int64_t d0, int64_t d1)
{
    const StTensor *t = st_find(f, name);
    cr_assert(t, "tensor %s in the output", name);
    cr_expect_eq(t->ndim, d1 ? 2 : 1, "%s rank", name);
    cr_expect_eq(t->shape[0], d0, "%s dim 0", name);
    if (d1) cr_expect_eq(t->shape[1], d1, "%s dim 1", name);
}

static void check_output_files(void)
{
    json_t *c = load_json("out/config.json");
    cr_expect_str_eq(json_string_value(json_array_get(json_object_get(c, "architectures"), 0)),
                     "BertForSequenceClassification");
    cr_expect_str_eq(json_string_value(json_object_get(c, "model_type")), "bert");
    cr_expect_eq(json_integer_value(json_object_get(c, "num_labels")), 2);
    cr_expect_eq(json_object_size(json_object_get(c, "id2label")), 2);
    cr_expect_eq(json_integer_value(json_object_get(c, "hidden_size")), HIDDEN);
    cr_expect_eq(json_integer_value(json_object_get(c, "vocab_size")), 30522);
    cr_expect_eq(json_integer_value(json_object_get(c, "num_hidden_layers")), 2);
    json_decref(c);
    json_t *t = load_json("out/tokenizer_config.json");
    cr_expect(json_is_true(json_object_get(t, "do_lower_case")));
    json_decref(t);
    json_t *s = load_json("out/special_tokens_map.json");
    cr_expect_str_eq(json_string_value(json_object_get(s, "cls_token")), "[CLS]");
    json_decref(s);
    char out[4096];
    cr_expect_eq(sh("cmp tiny/vocab.txt out/vocab.txt", out, sizeof out), 0, "vocab.txt copied: %s", out);
    char p[PATH_MAX + 64];
    path_in(p, sizeof p, "out/model.safetensors");
    StFile *f;
    HpcError err = {0};
    cr_assert_eq(st_open(p, &f, &err), HPC_OK, "%s", err.msg);
    /* embeddings 5, per layer 16, pooler 2, classifier 2 */
    cr_expect_eq(st_count(f), 5 + 2 * 16 + 2 + 2);
    expect_tensor(f, "bert.embeddings.word_embeddings.weight", 30522, HIDDEN);
    expect_tensor(f, "bert.embeddings.position_embeddings.weight", 64, HIDDEN);
    expect_tensor(f, "bert.encoder.layer.1.attention.self.query.weight", HIDDEN, HIDDEN);
    expect_tensor(f, "bert.encoder.layer.1.intermediate.dense.weight", 37, HIDDEN);
    expect_tensor(f, "bert.encoder.layer.0.output.LayerNorm.bias", HIDDEN, 0);
    expect_tensor(f, "bert.pooler.dense.weight", HIDDEN, HIDDEN);
    expect_tensor(f, "classifier.weight", 2, HIDDEN);
    expect_tensor(f, "classifier.bias", 2, 0);
    st_close(f);
}

Test(hf_output, import_init_fine_tune_output_reinit, .init = setup, .fini = teardown, .timeout = 300)
{
    char cmd[12288], out[65536];
    snprintf(cmd, sizeof cmd, "%s/bin/hpc import tiny -o tiny.model", root);
    cr_assert_eq(sh(cmd, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "all parameters found"), "%s", out);
    /* outside the repository: the default vocabulary path would not resolve */
    snprintf(cmd, sizeof cmd, "%s/bin/hpc run tiny.model --device cpu --task cola --data cola --init tiny "
             "--steps 6 --eval-every 2 --batch 16 --seq-len 32 --lr 1e-3 --output out --log run.jsonl", root);
    int rc = sh(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "tokenizer: vocabulary tiny/vocab.txt (from --init), lower-cased (tokenizer_config.json "
                          "do_lower_case true)"), "%s", out);
    cr_expect(strstr(out, "output: out (transformers folder), the best dev mcc"), "%s", out);
    check_output_files();
    check_summary_arithmetic("run.jsonl", 6);
    double final = NAN, best = best_eval_loss("run.jsonl", &final);
    cr_assert(isfinite(best), "a best eval in run.jsonl");
    /* the dev MCC of this random model stays 0, so the first eval is the
     * best one (ties keep the earlier) and the final weights differ from it */
    cr_expect(best != final, "best and final eval differ (dev loss %.9g), else this test cannot tell them apart",
              best);
    /* DIR2 back in: one step with lr 0 (the warmup's first step) leaves the
     * weights as they are, so the first eval is the best one's. */
    snprintf(cmd, sizeof cmd, "%s/bin/hpc run tiny.model --device cpu --task cola --data cola --init out "
             "--steps 1 --batch 16 --seq-len 32 --lr 1e-30 --log again.jsonl", root);
    rc = sh(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, out);
    double again = best_eval_loss("again.jsonl", NULL);
    cr_expect(fabs(again - best) <= 1e-6 * fabs(best), "dev loss with --init out %.9g, best of the run %.9g", again,
              best);
}

/* --output refuses a folder that is not a model folder, before training,
 * and leaves it as it was. */
Test(hf_output, output_refuses_a_foreign_folder, .init = setup, .fini = teardown, .timeout = 120)
{
    char cmd[12288], out[65536];
    write_text("notes.txt", "mine\n");
    snprintf(cmd, sizeof cmd, "%s/bin/hpc import tiny -o tiny.model >/dev/null && %s/bin/hpc run tiny.model "
             "--device cpu --task cola --data cola --steps 1 --output .", root, root);
    int rc = sh(cmd, out, sizeof out);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "--output .: the folder exists and is not a model folder"), "%s", out);
    cr_expect(!strstr(out, "step 1/1"), "refused before training: %s", out);
    cr_expect_eq(sh("cat notes.txt", out, sizeof out), 0);
    cr_expect_str_eq(out, "mine\n");
}

/* --init DIR's casing: do_lower_case false means cased unless told; a
 * tokenizer_config.json that is not JSON is named with line and column. */
Test(hf_output, init_casing_and_a_broken_tokenizer_config, .init = setup, .fini = teardown, .timeout = 120)
{
    char cmd[12288], out[65536];
    snprintf(cmd, sizeof cmd, "%s/bin/hpc import tiny -o tiny.model >/dev/null", root);
    cr_assert_eq(sh(cmd, out, sizeof out), 0, "%s", out);
    write_text("tiny/tokenizer_config.json", "{\"do_lower_case\": false}\n");
    snprintf(cmd, sizeof cmd, "%s/bin/hpc run tiny.model --device cpu --task cola --data cola --init tiny --steps 1 "
             "--batch 16 --seq-len 32", root);
    int rc = sh(cmd, out, sizeof out);
    cr_expect_eq(rc, 0, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "tokenizer: vocabulary tiny/vocab.txt (from --init), cased (tokenizer_config.json "
                          "do_lower_case false)"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s/bin/hpc run tiny.model --device cpu --task cola --data cola --init tiny --steps 1 "
             "--batch 16 --seq-len 32 --vocab tiny/vocab.txt --cased", root);
    rc = sh(cmd, out, sizeof out);
    cr_expect_eq(rc, 0, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "tokenizer: vocabulary tiny/vocab.txt (--vocab), cased (--cased)"), "%s", out);
    write_text("tiny/tokenizer_config.json", "{\"do_lower_case\": true,\n  oops}\n");
    snprintf(cmd, sizeof cmd, "%s/bin/hpc run tiny.model --device cpu --task cola --data cola --init tiny --steps 1",
             root);
    rc = sh(cmd, out, sizeof out);
    cr_expect_eq(rc, 1, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "tiny/tokenizer_config.json:2:"), "%s", out);
    cr_expect(!strstr(out, "step 1/"), "stopped before training: %s", out);
}

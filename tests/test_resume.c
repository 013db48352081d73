/* tests/test_resume.c — an interrupted and resumed run trains exactly as an
 * uninterrupted one (runtime/train/trainer.h checkpoint options, cpu backend).
 *
 * The model is a tiny BERT (vocab 64, hidden 32, 2 layers) with dropout
 * 0.1, fp16 emulated (so the dynamic loss scaler matters), grad_accum 2
 * over 100 rows in batches of 16 (7 batches an epoch, so epochs end inside
 * optimizer steps and the shuffle changes), and an injected inf gradient
 * at step 4 (a skipped step, the scaler halves).  Run A trains 12 steps;
 * run B stops after step 5 (saving), and run C resumes B's checkpoint to
 * step 12.  The per-step losses of C (JSONL log) and the final weights
 * must equal A's bit for bit.  A second test stops the run with a real
 * SIGTERM in a child process and resumes it.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data/dataset.h"
#include "lower.h"
#include "data/synthetic.h"
#include "train/trainer.h"

typedef struct {
    ModelSpec spec;
    Dataset train, dev;
    ParamList pl;
    IrGraph g;
} Setup;

static void setup(Setup *s, int64_t steps)
{
    ModelSpec *m = &s->spec;
    spec_defaults(m);
    snprintf(m->name, sizeof m->name, "resume_tiny");
    m->stack.vocab_size = 64;
    m->stack.max_positions = 64;
    m->stack.hidden = 32;
    m->stack.layers = 2;
    m->stack.heads = 2;
    m->stack.ffn = 64;
    m->train.batch_size = 16;
    m->train.grad_accum = 2;
    m->train.max_seq_len = 16;
    m->train.seed = 11;
    m->train.steps = steps;
    m->train.epochs = 0;
    m->train.lr = 1e-3;
    HpcError err = {0};
    dataset_init(&s->train, "resume/train");
    dataset_init(&s->dev, "resume/dev");
    cr_assert_eq(synthetic_make(SYN_CONTAINS, &s->train, 100, 64, 16, 1, false, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(synthetic_make(SYN_CONTAINS, &s->dev, 40, 64, 16, 2, false, &err), HPC_OK, "%s", err.msg);
    ir_init(&s->g);
    params_init(&s->pl);
    cr_assert_eq(lower_model(m, &s->g, &s->pl, &err), HPC_OK, "%s", err.msg);
}

static void teardown(Setup *s)
{
    dataset_free(&s->train);
    dataset_free(&s->dev);
    params_free(&s->pl);
    ir_free(&s->g);
}

static float **weights(const Setup *s)
{
    float **w = calloc((size_t)s->pl.n, sizeof *w);
    for (int i = 0; i < s->pl.n; i++)
        if (s->pl.p[i].tied_to < 0) w[i] = calloc((size_t)params_numel(&s->pl.p[i]), sizeof(float));
    return w;
}

static void weights_free(const Setup *s, float **w)
{
    for (int i = 0; i < s->pl.n; i++) free(w[i]);
    free(w);
}

static void expect_same_weights(const Setup *s, float **a, float **b)
{
    for (int i = 0; i < s->pl.n; i++)
        if (a[i])
            cr_expect(memcmp(a[i], b[i], (size_t)params_numel(&s->pl.p[i]) * sizeof(float)) == 0,
                      "%s differs after resume", s->pl.p[i].name);
}

/* The "loss" text of the step events with step > after, in order. */
static int step_losses(const char *jsonl, int64_t after, char out[][64], int cap)
{
    FILE *f = fopen(jsonl, "r");
    cr_assert(f, "%s", jsonl);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < cap) {
        long long step;
        char *p = strstr(line, "\"event\":\"step\"") ? strstr(line, "\"step\":") : NULL;
        if (!p || sscanf(p, "\"step\":%lld", &step) != 1 || step <= after) continue;
        char *l = strstr(line, "\"loss\":");
        cr_assert(l);
        snprintf(out[n], 64, "%lld %.*s", step, (int)strcspn(l + 7, ",}"), l + 7);
        n++;
    }
    fclose(f);
    return n;
}

static void run(Setup *s, TrainOptions *o, TrainResult *r)
{
    HpcError err = {0};
    o->policy = PREC_FP16;
    o->inject_inf_step = 4;
    cr_assert_eq(trainer_run(&s->spec, &s->train, &s->dev, o, r, &err), HPC_OK, "%s", err.msg);
}

static void tmp_path(char *out, size_t cap, const char *tag)
{
    snprintf(out, cap, "/tmp/hpc_test_resume_%s_%d", tag, (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
    cr_assert_eq(system(cmd), 0);
}

static void compare_logs(const char *a, const char *b, int64_t after, int64_t total)
{
    char la[64][64], lb[64][64];
    int na = step_losses(a, after, la, 64), nb = step_losses(b, after, lb, 64);
    cr_assert_eq(na, total - after, "run A logged %d steps after %lld", na, (long long)after);
    cr_assert_eq(nb, na, "the resumed run logged %d steps, the full run %d", nb, na);
    for (int i = 0; i < na; i++) cr_expect_str_eq(lb[i], la[i], "step loss differs: resumed '%s', full '%s'", lb[i], la[i]);
}

Test(resume, stop_and_resume_is_bitwise, .timeout = 120)
{
    Setup s;
    setup(&s, 12);
    char dir[512], log_a[512], log_c[512];
    tmp_path(dir, sizeof dir, "ckpt");
    tmp_path(log_a, sizeof log_a, "a.jsonl");
    tmp_path(log_c, sizeof log_c, "c.jsonl");
    float **wa = weights(&s), **wc = weights(&s);
    TrainResult ra, rb, rc;
    TrainOptions a = {.jsonl = log_a, .weights_out = wa};
    run(&s, &a, &ra);
    cr_assert_eq(ra.steps, 12);
    cr_assert_eq(ra.skipped, 1, "the injected inf step must be skipped");
    TrainOptions b = {.jsonl = log_c, .checkpoint_dir = dir, .checkpoint_every = 2, .stop_after = 5};
    run(&s, &b, &rb);
    cr_assert_eq(rb.steps, 5);
    cr_assert(strstr(rb.saved, "step-00000005") != NULL, "%s", rb.saved);
    /* the resumed run appends to B's log: steps 1-5 of B, then 6-12 of C */
    TrainOptions c = {.jsonl = log_c, .weights_out = wc, .resume_dir = dir, .checkpoint_dir = dir};
    run(&s, &c, &rc);
    cr_expect_eq(rc.resumed_from, 5);
    cr_expect_eq(rc.steps, 12);
    cr_expect_eq(rc.skipped, 1);
    cr_expect(memcmp(&ra.last_loss, &rc.last_loss, sizeof(double)) == 0, "last loss %.17g vs %.17g", ra.last_loss,
              rc.last_loss);
    cr_expect(memcmp(&ra.eval_metric, &rc.eval_metric, sizeof(double)) == 0);
    cr_expect(memcmp(&ra.final_scale, &rc.final_scale, sizeof(double)) == 0);
    compare_logs(log_a, log_c, 0, 12);
    expect_same_weights(&s, wa, wc);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s'", dir, log_a, log_c);
    cr_expect_eq(system(cmd), 0);
    weights_free(&s, wa);
    weights_free(&s, wc);
    teardown(&s);
}

/* The same with a real SIGTERM: a child trains with handle_signals and a
 * checkpoint after every step; the parent signals it once the first
 * checkpoint exists; the child must exit with HPC_ERR_INTERRUPTED (8). */
Test(resume, sigterm_saves_and_resume_matches, .timeout = 300)
{
    Setup s;
    setup(&s, 60);
    char dir[512], latest[600];
    tmp_path(dir, sizeof dir, "sig");
    snprintf(latest, sizeof latest, "%s/latest", dir);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        TrainOptions o = {.checkpoint_dir = dir, .checkpoint_every = 1, .handle_signals = true,
                          .policy = PREC_FP16, .inject_inf_step = 4};
        TrainResult r;
        HpcError err = {0};
        _exit(trainer_run(&s.spec, &s.train, &s.dev, &o, &r, &err));
    }
    struct stat st;
    for (int i = 0; i < 20000 && stat(latest, &st) != 0; i++) usleep(1000);
    kill(pid, SIGTERM);
    int status;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status), "the child did not exit (status %d)", status);
    cr_assert_eq(WEXITSTATUS(status), HPC_ERR_INTERRUPTED, "exit %d", WEXITSTATUS(status));
    float **wa = weights(&s), **wc = weights(&s);
    TrainResult ra, rc;
    TrainOptions a = {.weights_out = wa};
    run(&s, &a, &ra);
    TrainOptions c = {.weights_out = wc, .resume_dir = dir};
    run(&s, &c, &rc);
    cr_expect(rc.resumed_from > 0 && rc.resumed_from < 60, "resumed from %lld", (long long)rc.resumed_from);
    cr_expect(memcmp(&ra.last_loss, &rc.last_loss, sizeof(double)) == 0, "last loss %.17g vs %.17g", ra.last_loss,
              rc.last_loss);
    expect_same_weights(&s, wa, wc);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
    weights_free(&s, wa);
    weights_free(&s, wc);
    teardown(&s);
}

/* Resuming with other settings: refused naming them, or continued with
 * allow_changed_settings and the changes in the log; a step beyond the new
 * total is refused either way; a locked checkpoint directory stops a
 * second run before it trains. */
Test(resume, changed_settings_and_a_locked_directory, .timeout = 120)
{
    Setup s;
    setup(&s, 8);
    char dir[512], log[512];
    tmp_path(dir, sizeof dir, "settings");
    tmp_path(log, sizeof log, "settings.jsonl");
    TrainResult r;
    TrainOptions b = {.checkpoint_dir = dir, .stop_after = 5};
    run(&s, &b, &r);
    HpcError err = {0};
    s.spec.train.lr = 2e-3;
    s.spec.train.batch_size = 8;
    char *console = NULL;
    size_t console_len = 0;
    FILE *out = open_memstream(&console, &console_len);
    TrainOptions c = {.resume_dir = dir, .policy = PREC_FP16, .out = out};
    cr_expect_eq(trainer_run(&s.spec, &s.train, &s.dev, &c, &r, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "lr 0.001 -> 0.002") && strstr(err.msg, "batch 16 -> 8") &&
              strstr(err.msg, "--allow-changed-settings"), "%s", err.msg);
    fclose(out);
    /* the refusal comes after the log is open: no "done: 0 steps" before it */
    cr_expect_null(strstr(console, "done:"), "%s", console);
    free(console);
    c.out = NULL;
    c.allow_changed_settings = true;
    c.jsonl = log;
    cr_expect_eq(trainer_run(&s.spec, &s.train, &s.dev, &c, &r, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(r.resumed_from, 5);
    FILE *f = fopen(log, "r");
    char text[1 << 15] = "";
    cr_assert_not_null(f);
    text[fread(text, 1, sizeof text - 1, f)] = '\0';
    fclose(f);
    cr_expect(strstr(text, "resuming with changed settings (--allow-changed-settings): lr 0.001 -> 0.002") != NULL,
              "the log does not record the changes");
    TrainOptions shorter = {.resume_dir = dir, .policy = PREC_FP16, .steps = 4, .allow_changed_settings = true};
    cr_expect_eq(trainer_run(&s.spec, &s.train, &s.dev, &shorter, &r, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "at step 5, beyond this run's 4 steps") != NULL, "%s", err.msg);
    /* another run holds the directory */
    CheckpointLock lk;
    cr_assert_eq(checkpoint_lock(dir, &lk, &err), HPC_OK, "%s", err.msg);
    TrainOptions second = {.checkpoint_dir = dir, .policy = PREC_FP16};
    cr_expect_eq(trainer_run(&s.spec, &s.train, &s.dev, &second, &r, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "is in use by another hpc run") != NULL, "%s", err.msg);
    cr_expect_eq(r.steps, 0, "the second run trained");
    checkpoint_unlock(&lk);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, log);
    cr_expect_eq(system(cmd), 0);
    teardown(&s);
}

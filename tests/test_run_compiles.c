/* tests/test_run_compiles.c — `hpc run X.model` compiles its model once.
 *
 * cli/cmd_run.c compiles a .model file (or a checkpoint's model) into one
 * step program and hands it to the trainer, which sizes the memory check
 * and opens the backend on it: the artifact road.  Before, the memory check
 * (runtime/train/memcheck.c) and the backend (train_backend_model.c) each
 * compiled the spec.  The count is runtime/train/spec_compile.h's; the runs
 * are cmd_run in this process, on the cpu backend (a short synthetic run
 * of models/bert_tiny.model).  The same runs also check that the road
 * changes no number: a .model run and a run of its compiled NAME.hpc give
 * the same losses bit for bit (the cpu backend is deterministic), with
 * --seed taking effect on both. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "train/spec_compile.h"

/* Runs `hpc ARGS...` in-process; returns the exit code and sets *compiles
 * to the model compiles it made. */
static int run_counting(long *compiles, const char *const *args)
{
    char *argv[64];
    int argc = 0;
    for (; args[argc]; argc++) {
        cr_assert_lt(argc, 63);
        argv[argc] = strdup(args[argc]);   /* getopt_long permutes argv */
    }
    argv[argc] = NULL;
    long before = train_spec_compiles();
    int rc = strcmp(args[0], "compile") == 0 ? cmd_compile(argc, argv) : cmd_run(argc, argv);
    *compiles = train_spec_compiles() - before;
    for (int i = 0; i < argc; i++) free(argv[i]);
    return rc;
}

/* The "loss" fields of a run log's step lines, in order. */
static int step_losses(const char *path, double *loss, int cap)
{
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot open %s", path);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"event\":\"step\"")) continue;
        const char *p = strstr(line, "\"loss\":");
        cr_assert(p, "no loss in %s", line);
        cr_assert_lt(n, cap);
        loss[n++] = strtod(p + 7, NULL);
    }
    fclose(f);
    return n;
}

static char dir[] = "/tmp/hpc-test-run-compiles-XXXXXX";

static void setup(void) { cr_assert(mkdtemp(dir), "mkdtemp"); }
static void teardown(void)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

TestSuite(run_compiles, .init = setup, .fini = teardown);

#define SHORT_RUN "--device", "cpu", "--steps", "3", "--train-rows", "64", "--seq-len", "16"

Test(run_compiles, a_model_file_compiles_once)
{
    char log[512];
    snprintf(log, sizeof log, "%s/model.jsonl", dir);
    long n = -1;
    int rc = run_counting(&n, (const char *[]){"run", "models/bert_tiny.model", SHORT_RUN, "--log", log, NULL});
    cr_assert_eq(rc, 0, "hpc run failed (exit %d)", rc);
    cr_expect_eq(n, 1, "hpc run X.model compiled the model %ld times (the memory check and the backend should "
                 "share one program)", n);
    rc = run_counting(&n, (const char *[]){"run", "models/bert_tiny.model", SHORT_RUN, "--fp16", "--no-fuse",
                                           "--no-memory-check", NULL});
    cr_assert_eq(rc, 0, "hpc run --fp16 --no-fuse --no-memory-check failed (exit %d)", rc);
    cr_expect_eq(n, 1, "with --no-memory-check: %ld compiles", n);
}

Test(run_compiles, an_artifact_compiles_nothing_and_trains_the_same)
{
    char hpc_file[512], log_model[512], log_art[512], log_other[512];
    snprintf(hpc_file, sizeof hpc_file, "%s/bert_tiny.hpc", dir);
    snprintf(log_model, sizeof log_model, "%s/model.jsonl", dir);
    snprintf(log_art, sizeof log_art, "%s/artifact.jsonl", dir);
    snprintf(log_other, sizeof log_other, "%s/other-seed.jsonl", dir);
    long n = -1;
    int rc = run_counting(&n, (const char *[]){"compile", "models/bert_tiny.model", "-o", hpc_file, NULL});
    cr_assert_eq(rc, 0, "hpc compile failed (exit %d)", rc);
    rc = run_counting(&n, (const char *[]){"run", hpc_file, SHORT_RUN, "--seed", "5", "--log", log_art, NULL});
    cr_assert_eq(rc, 0, "hpc run NAME.hpc failed (exit %d)", rc);
    cr_expect_eq(n, 0, "hpc run NAME.hpc compiled %ld times (it carries its program)", n);
    rc = run_counting(&n, (const char *[]){"run", "models/bert_tiny.model", SHORT_RUN, "--seed", "5", "--log",
                                           log_model, NULL});
    cr_assert_eq(rc, 0, "hpc run X.model failed (exit %d)", rc);
    rc = run_counting(&n, (const char *[]){"run", "models/bert_tiny.model", SHORT_RUN, "--seed", "6", "--log",
                                           log_other, NULL});
    cr_assert_eq(rc, 0, "hpc run X.model --seed 6 failed (exit %d)", rc);
    double a[8], m[8], o[8];
    int na = step_losses(log_art, a, 8), nm = step_losses(log_model, m, 8), no = step_losses(log_other, o, 8);
    cr_assert_eq(na, 3, "%d steps logged for the artifact run", na);
    cr_assert_eq(nm, 3, "%d steps logged for the .model run", nm);
    cr_assert_eq(no, 3, "%d steps logged for the --seed 6 run", no);
    bool seed_matters = false;
    for (int i = 0; i < 3; i++) {
        cr_expect(a[i] == m[i] && isfinite(a[i]), "step %d: loss %.9g from the artifact, %.9g from the .model file",
                  i + 1, a[i], m[i]);
        seed_matters |= o[i] != m[i];
    }
    cr_expect(seed_matters, "--seed 6 trained exactly as --seed 5: the seed did not reach the run");
}

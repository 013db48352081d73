/* tests/test_cli_run.c — `hpc run` command-line settings over the model's
 * train block (cli/run_overrides.c), through the real binary. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* Runs `bin/hpc ARGS` from the repository root; output (stdout + stderr)
 * into out; returns the exit code. */
static int hpc(const char *args, char *out, size_t cap)
{
    const char *root = getenv("HPC_ROOT") ? getenv("HPC_ROOT") : ".";
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cd %s && bin/hpc %s 2>&1", root, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen");
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Test(cli_run, bad_backoff_is_a_usage_error)
{
    char out[65536];
    int rc = hpc("run models/bert_tiny.model --device cpu --steps 2 --scale-backoff 2", out, sizeof out);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "hpc: run: --scale-backoff 2: expected a number in (0, 1)"), "%s", out);
}

Test(cli_run, bad_loss_scale_names_the_choices)
{
    char out[65536];
    int rc = hpc("run models/bert_tiny.model --device cpu --loss-scale sometimes", out, sizeof out);
    cr_expect_eq(rc, 2);
    cr_expect(strstr(out, "--loss-scale sometimes: expected dynamic, none or a positive number"), "%s", out);
}

/* An injected overflow at step 3 backs the scale off by the command line's
 * factor from the command line's initial scale: 1024 * 0.25 = 256. */
Test(cli_run, scale_settings_reach_the_loss_scaler, .timeout = 120)
{
    char out[65536];
    setenv("HPC_INJECT_INF_STEP", "3", 1);
    int rc = hpc("run models/bert_tiny.model --device cpu --fp16 --steps 5 --seq-len 16 --train-rows 100 "
                 "--scale-init 1024 --scale-backoff 0.25", out, sizeof out);
    unsetenv("HPC_INJECT_INF_STEP");
    cr_expect_eq(rc, 0, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "step 3: inf/NaN in the gradients, update skipped; loss scale now 256"), "%s", out);
    cr_expect(strstr(out, "(1 skipped)"), "%s", out);
}

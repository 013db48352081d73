/* tests/test_cli_run.c — `hpc run` command-line settings over the model's
 * train block (cli/run_overrides.c), and `hpc compile` options refused by
 * what the model compiles to, through the real binary. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hpc.h"

/* The repository root, absolute. */
static void repo_root(char *root)
{
    cr_assert(realpath(getenv("HPC_ROOT") ? getenv("HPC_ROOT") : ".", root), "realpath");
}

/* Runs `bin/hpc ARGS` in dir (NULL: the repository root); output (stdout +
 * stderr) into out; returns the exit code. */
static int hpc_in(const char *dir, const char *args, char *out, size_t cap)
{
    char root[PATH_MAX], cmd[2 * PATH_MAX + 4096];
    repo_root(root);
    snprintf(cmd, sizeof cmd, "cd %s && %s/bin/hpc %s 2>&1", dir ? dir : root, root, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen");
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int hpc(const char *args, char *out, size_t cap)
{
    return hpc_in(NULL, args, out, cap);
}

/* rm -rf dir, a test's mkdtemp folder. */
static void remove_dir(const char *dir)
{
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

Test(cli_run, bad_backoff_is_a_usage_error)
{
    char out[65536];
    int rc = hpc("run models/bert_tiny.model --device cpu --steps 2 --scale-backoff 2", out, sizeof out);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "hpc: run: --scale-backoff 2: expected a number in (0, 1)"), "%s", out);
}

/* The binary's exit codes and one-line messages for numbers out of range
 * (tests/test_cli_options.c checks the parser itself). */
Test(cli_run, numbers_out_of_range_are_usage_errors)
{
    char out[65536];
    int rc = hpc("run models/bert_tiny.model --steps 99999999999999999999", out, sizeof out);
    cr_expect_eq(rc, 2);
    cr_expect_str_eq(out, "hpc: run: --steps 99999999999999999999: expected an integer in [1, 1000000000000]\n");
    rc = hpc("run models/bert_tiny.model --steps=-1", out, sizeof out);
    cr_expect_eq(rc, 2);
    cr_expect_str_eq(out, "hpc: run: --steps -1: expected an integer in [1, 1000000000000]\n");
    rc = hpc("run models/bert_tiny.model --lr 1e-400", out, sizeof out);
    cr_expect_eq(rc, 2);
    cr_expect_str_eq(out, "hpc: run: --lr 1e-400: too close to zero for a double (the smallest is 2.2e-308); "
                     "expected a number in (0, 10]\n");
    rc = hpc("run models/bert_tiny.model --bf16 --fp16", out, sizeof out);
    cr_expect_eq(rc, 2);
    cr_expect_str_eq(out, "hpc: run: --fp16 and --bf16 contradict each other; give one of them\n");
    rc = hpc("run --help", out, sizeof out);
    cr_expect_eq(rc, 0);
    cr_expect(strstr(out, "  --lr X                peak learning rate (0, 10]\n"), "%s", out);
    /* a GLUE task needs a classifier head: the causal LM head is for synthetic tasks only */
    cr_expect(strstr(out, "(or, with a synthetic task,\na causal LM head,"), "%s", out);
    rc = hpc("run models/gpt2_small.model --device cpu --steps 1 --task cola", out, sizeof out);
    cr_expect_eq(rc, 1);
    cr_expect(strstr(out, "task cola has 2 labels but model gpt2_small has a causal_lm head"), "%s", out);
}

Test(cli_run, bad_loss_scale_names_the_choices)
{
    char out[65536];
    int rc = hpc("run models/bert_tiny.model --device cpu --loss-scale sometimes", out, sizeof out);
    cr_expect_eq(rc, 2);
    cr_expect(strstr(out, "hpc: run: --loss-scale sometimes: expected dynamic, none or a static scale in (0, "
                          "1.84467e+19]"), "%s", out);
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

/* Mean loss of the step events numbered [from, to] in a JSONL run log. */
static double mean_loss(const char *path, int from, int to)
{
    FILE *f = fopen(path, "r");
    cr_assert(f, "open %s", path);
    char line[4096];
    double sum = 0;
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        int step;
        double loss;
        const char *s = strstr(line, "\"event\":\"step\",\"step\":");
        const char *l = strstr(line, "\"loss\":");
        if (!s || !l || sscanf(s + 22, "%d", &step) != 1 || sscanf(l + 7, "%lf", &loss) != 1) continue;
        if (step >= from && step <= to) sum += loss, n++;
    }
    fclose(f);
    cr_assert_eq(n, to - from + 1, "%d step events in [%d, %d] of %s", n, from, to, path);
    return sum / n;
}

/* The main job in small: bert_tiny on the bundled CoLA on the cpu backend.
 * From random weights the loss falls from ~0.69 (chance) towards the class
 * prior's entropy (~0.61: 70% of CoLA is acceptable); the run's JSONL log is
 * written and `hpc plot` draws it. */
Test(cli_run, cola_on_cpu_loss_falls_and_log_plots, .timeout = 300)
{
    char out[65536], jsonl[64], svg[64], cmd[256];
    /* Per-process names: concurrent test runs on one machine must not share them. */
    snprintf(jsonl, sizeof jsonl, "/tmp/hpc_test_cola_%d.jsonl", (int)getpid());
    snprintf(svg, sizeof svg, "/tmp/hpc_test_cola_%d.svg", (int)getpid());
    remove(jsonl);
    remove(svg);
    snprintf(cmd, sizeof cmd, "run models/bert_tiny.model --task cola --device cpu --steps 80 --log %s", jsonl);
    int rc = hpc(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "cola/dev: mcc"), "%s", out);
    double first = mean_loss(jsonl, 1, 3), last = mean_loss(jsonl, 71, 80);
    cr_expect(last < first - 0.03, "loss did not fall: first 3 steps %.4f, last 10 %.4f", first, last);
    snprintf(cmd, sizeof cmd, "plot %s -o %s", jsonl, svg);
    rc = hpc(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "plot exit %d: %s", rc, out);
    FILE *f = fopen(svg, "r");
    cr_assert(f, "no %s", svg);
    char head[256] = {0};
    cr_expect(fread(head, 1, sizeof head - 1, f) > 0);
    fclose(f);
    cr_expect(strstr(head, "<svg"), "%s", head);
}

/* A packed fp32 program has no CUDA kernels: --emit-cuda, --emit-lib and
 * --arch are refused by name, before the artifact or a directory is written
 * (they once crashed, or failed inside NVRTC). */
Test(cli_compile, packed_fp32_refuses_what_needs_cuda, .timeout = 120)
{
    char out[65536], dir[] = "/tmp/hpc_cli_packXXXXXX", args[512];
    cr_assert(mkdtemp(dir));
    const char *opts[3][2] = {{"--emit-cuda", "--emit-cuda %s/cuda"}, {"--emit-lib", "--emit-lib %s/lib"},
                              {"--arch", "--arch 90"}};
    for (int k = 0; k < 3; k++) {
        char opt[128];
        snprintf(opt, sizeof opt, opts[k][1], dir);
        snprintf(args, sizeof args, "compile models/bert_tiny.model --pack -o %s/m.hpc %s", dir, opt);
        int rc = hpc(args, out, sizeof out);
        cr_expect_eq(rc, 2, "%s: exit %d: %s", opts[k][0], rc, out);
        char want[160];
        snprintf(want, sizeof want, "hpc compile: %s: models/bert_tiny.model is packed", opts[k][0]);
        cr_expect(strstr(out, want) && strstr(out, "add --fp16 or --bf16"), "%s: %s", opts[k][0], out);
    }
    char path[256];
    const char *made[3] = {"m.hpc", "cuda", "lib"};
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, made[k]);
        cr_expect_neq(access(path, F_OK), 0, "%s was written", path);
    }
    /* under fp16 the same files are written, and both are named (a
     * trailing slash not doubled) */
    snprintf(args, sizeof args, "compile models/bert_tiny.model --pack --fp16 --no-artifact --emit-cuda %s/cuda/",
             dir);
    int rc = hpc(args, out, sizeof out);
    cr_expect_eq(rc, 0, "fp16: exit %d: %s", rc, out);
    char wrote[256];
    snprintf(wrote, sizeof wrote, "hpc: wrote %s/cuda/bert_tiny_kernels.cuh and %s/cuda/bert_tiny_step.cuh\n", dir,
             dir);
    cr_expect(strstr(out, wrote), "want '%s' in: %s", wrote, out);
    snprintf(path, sizeof path, "%s/cuda/bert_tiny_step.cuh", dir);
    cr_expect_eq(access(path, R_OK), 0, "fp16 wrote no %s", path);
    snprintf(args, sizeof args, "compile models/bert_tiny.model --pack --fp16 --no-artifact --emit-lib %s/lib/", dir);
    rc = hpc(args, out, sizeof out);
    cr_expect_eq(rc, 0, "fp16 --emit-lib: exit %d: %s", rc, out);
    snprintf(wrote, sizeof wrote, "hpc: wrote the package %s/lib/ (build it: make -C %s/lib/ run)\n", dir, dir);
    cr_expect(strstr(out, wrote), "want '%s' in: %s", wrote, out);
    remove_dir(dir);
}

/* --stop-after STAGE ends before the plan: even after the last stage, fuse,
 * no artifact is written (one was, in the current directory), and what
 * needs a later stage is refused (they printed nothing and exited 0). */
Test(cli_compile, stop_after_writes_nothing_and_refuses_later_stages, .timeout = 120)
{
    char out[65536], dir[] = "/tmp/hpc_cli_stopXXXXXX", root[PATH_MAX], args[PATH_MAX + 128], path[256];
    cr_assert(mkdtemp(dir));
    repo_root(root);
    snprintf(args, sizeof args, "compile %s/models/bert_tiny.model --stop-after fuse", root);
    int rc = hpc_in(dir, args, out, sizeof out);
    cr_expect_eq(rc, 0, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "stopped after fuse"), "%s", out);
    snprintf(path, sizeof path, "%s/bert_tiny.hpc", dir);
    cr_expect_neq(access(path, F_OK), 0, "--stop-after fuse wrote %s", path);
    const char *refused[][2] = {{"--stop-after fuse --plan", "--stop-after fuse and --plan contradict"},
                                {"--stop-after autodiff --precision-report",
                                 "--stop-after autodiff and --precision-report contradict"},
                                {"--stop-after lower --dump-fuse", "--stop-after lower and --dump-fuse contradict"}};
    for (int k = 0; k < 3; k++) {
        snprintf(args, sizeof args, "compile models/bert_tiny.model %s", refused[k][0]);
        rc = hpc(args, out, sizeof out);
        cr_expect_eq(rc, 2, "%s: exit %d: %s", refused[k][0], rc, out);
        cr_expect(strstr(out, refused[k][1]), "%s: %s", refused[k][0], out);
    }
    rc = hpc("compile models/bert_tiny.model --stop-after precision --precision-report", out, sizeof out);
    cr_expect_eq(rc, 0, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "precision plan: policy fp32"), "%s", out);
    remove_dir(dir);
}

/* An --emit-cuda or --emit-lib DIR that cannot be made is refused by option
 * before the artifact is written (the artifact was left behind, exit 3). */
Test(cli_compile, unwritable_emit_dir_writes_no_artifact, .timeout = 120)
{
    char out[65536], dir[] = "/tmp/hpc_cli_emitXXXXXX", args[512], path[256];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/file", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fclose(f);
    const char *bad[][2] = {{"--emit-cuda /proc/x", "hpc: --emit-cuda /proc/x: cannot create files in /proc"},
                            {"--emit-lib %s/no/lib", "the folder %s/no does not exist"},
                            {"--emit-lib %s/file", "hpc: --emit-lib %s/file: exists and is not a folder"}};
    for (int k = 0; k < 3; k++) {
        char opt[128], want[160];
        snprintf(opt, sizeof opt, bad[k][0], dir);
        snprintf(want, sizeof want, bad[k][1], dir);
        snprintf(args, sizeof args, "compile models/bert_tiny.model -o %s/m.hpc %s", dir, opt);
        int rc = hpc(args, out, sizeof out);
        cr_expect_eq(rc, 3, "%s: exit %d: %s", opt, rc, out);
        cr_expect(strstr(out, want), "%s: %s", opt, out);
        snprintf(path, sizeof path, "%s/m.hpc", dir);
        cr_expect_neq(access(path, F_OK), 0, "%s: %s was written", opt, path);
    }
    remove_dir(dir);
}

/* `hpc help COMMAND` prints what `hpc COMMAND --help` does; `hpc --version`
 * (it was "unknown command") prints the C API's version. */
Test(cli_top, help_command_and_version)
{
    static char out[65536], want[65536];
    int rc = hpc("help run", out, sizeof out);
    cr_expect_eq(rc, 0, "exit %d: %s", rc, out);
    cr_expect_eq(hpc("run --help", want, sizeof want), 0);
    cr_expect_str_eq(out, want);
    cr_expect(strstr(out, "usage: hpc run [OPTIONS] [MODEL]") == out, "%s", out);
    cr_expect_eq(hpc("help help", out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "usage: hpc COMMAND") == out, "%s", out);
    rc = hpc("help nope", out, sizeof out);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, out);
    cr_expect_str_eq(out, "hpc: unknown command 'nope' (see `hpc --help`)\n");
    rc = hpc("--version", out, sizeof out);
    cr_expect_eq(rc, 0, "exit %d: %s", rc, out);
    char version[64];
    snprintf(version, sizeof version, "hpc, C API %d.%d", HPC_API_VERSION_MAJOR, HPC_API_VERSION_MINOR);
    cr_expect(strstr(out, version) == out, "%s", out);
}

/* --resume and --init that are not folders are named by option before the
 * run starts (they were reported by the trainer after the run's summary, as
 * "checkpoint: DIR: no such directory", a file too). */
Test(cli_run, start_dirs_that_are_not_folders_are_named)
{
    char out[65536];
    int rc = hpc("run models/bert_tiny.model --device cpu --steps 1 --init /nonexistent/x", out, sizeof out);
    cr_expect_eq(rc, 3, "exit %d: %s", rc, out);   /* as for a missing model file */
    cr_expect_str_eq(out, "hpc: run: --init /nonexistent/x: No such file or directory; give a Hugging Face folder "
                     "(model.safetensors) or an hpc checkpoint\n");
    rc = hpc("run models/bert_tiny.model --device cpu --steps 1 --resume models/bert_tiny.model", out, sizeof out);
    cr_expect_eq(rc, 1, "exit %d: %s", rc, out);
    cr_expect_str_eq(out, "hpc: run: --resume models/bert_tiny.model: not a folder; give a --checkpoint-dir of an "
                     "earlier run or one of its step-N folders\n");
    rc = hpc("run --device cpu --steps 1 --resume /nonexistent/x", out, sizeof out);
    cr_expect_eq(rc, 3, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "hpc: run: --resume /nonexistent/x: No such file or directory"), "%s", out);
    rc = hpc("run /nonexistent/x.model --device cpu --steps 1", out, sizeof out);
    cr_expect_eq(rc, 3, "a missing model: exit %d: %s", rc, out);
}

/* Unwritable outputs of --dot, `hpc plot -o` and `hpc import -o` are named by
 * option, checked before the work (they were "write PATH: cannot create a
 * temporary file beside it"). */
Test(cli_outputs, unwritable_outputs_are_named_by_option, .timeout = 120)
{
    char out[65536];
    const char *cases[][2] = {
        {"compile models/bert_tiny.model --no-artifact --dot /proc/x",
         "hpc: --dot /proc/x: cannot create files in /proc"},
        {"plot tests/fuzz/seeds/runlog/run.jsonl -o /proc/x", "hpc: -o /proc/x: cannot create files in /proc"},
        {"import tests/data/hf/bert-base-uncased -o /proc/x", "hpc: -o /proc/x: cannot create files in /proc"},
    };
    for (int k = 0; k < 3; k++) {
        int rc = hpc(cases[k][0], out, sizeof out);
        cr_expect_eq(rc, 3, "%s: exit %d: %s", cases[k][0], rc, out);
        cr_expect(strstr(out, cases[k][1]), "%s: %s", cases[k][0], out);
    }
}

/* Every output of `hpc compile` is checked before the first is written: a
 * bad -o left the --dot file behind, a bad --dot no artifact. */
Test(cli_outputs, a_bad_output_leaves_no_other_behind, .timeout = 120)
{
    char out[65536], dir[] = "/tmp/hpc_cli_outsXXXXXX", args[1024], path[600];
    cr_assert(mkdtemp(dir));
    snprintf(args, sizeof args, "compile models/bert_tiny.model --dot %s/g.dot -o /proc/x", dir);
    int rc = hpc(args, out, sizeof out);
    cr_expect_eq(rc, 3, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "hpc: -o /proc/x: cannot create files in /proc"), "%s", out);
    snprintf(path, sizeof path, "%s/g.dot", dir);
    cr_expect_neq(access(path, F_OK), 0, "%s was written", path);
    snprintf(args, sizeof args, "compile models/bert_tiny.model --dot /proc/x -o %s/m.hpc", dir);
    rc = hpc(args, out, sizeof out);
    cr_expect_eq(rc, 3, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "hpc: --dot /proc/x: cannot create files in /proc"), "%s", out);
    snprintf(path, sizeof path, "%s/m.hpc", dir);
    cr_expect_neq(access(path, F_OK), 0, "%s was written", path);
    snprintf(args, sizeof args, "compile models/bert_tiny.model --dot %s/g.dot -o %s/m.hpc", dir, dir);
    rc = hpc(args, out, sizeof out);
    cr_expect_eq(rc, 0, "exit %d: %s", rc, out);
    cr_expect_eq(access(path, F_OK), 0, "%s", out);
    snprintf(path, sizeof path, "%s/g.dot", dir);
    cr_expect_eq(access(path, F_OK), 0, "%s", out);
    remove_dir(dir);
}

/* A folder given where a file is read says so (it was "reading DIR failed",
 * or, for the run log, "no step events (0 lines)"). */
Test(cli_inputs, a_folder_for_a_file_is_named, .timeout = 120)
{
    char out[65536], dir[] = "/tmp/hpc_cli_dirXXXXXX", args[512];
    cr_assert(mkdtemp(dir));
    int rc = hpc("tokenize --vocab models hello", out, sizeof out);
    cr_expect_eq(rc, 3, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "hpc: cannot read vocabulary models: Is a directory"), "%s", out);
    snprintf(args, sizeof args, "plot models -o %s/p.svg", dir);
    rc = hpc(args, out, sizeof out);
    cr_expect_eq(rc, 3, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "hpc: cannot read models: Is a directory"), "%s", out);
    snprintf(args, sizeof args, "mkdir %s/train.tsv && cp data/cola/dev.tsv %s/", dir, dir);
    cr_assert_eq(system(args), 0);
    snprintf(args, sizeof args, "run models/bert_tiny.model --device cpu --steps 1 --task cola --data %s", dir);
    rc = hpc(args, out, sizeof out);
    cr_expect_eq(rc, 3, "exit %d: %s", rc, out);
    char want[160];
    snprintf(want, sizeof want, "task cola: %s/train.tsv is a folder, not a file", dir);
    cr_expect(strstr(out, want), "%s", out);
    remove_dir(dir);
}

/* --arch with nowhere to put the step's cubins (--no-artifact without
 * --emit-lib, or --stop-after) is refused; it was dropped without a word. */
Test(cli_compile, arch_without_a_target_is_refused)
{
    char out[65536];
    int rc = hpc("compile models/bert_tiny.model --fp16 --arch 90 --no-artifact", out, sizeof out);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "hpc: compile: --arch and --no-artifact contradict each other"), "%s", out);
    rc = hpc("compile models/bert_tiny.model --fp16 --arch 90 --stop-after fuse", out, sizeof out);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "hpc: compile: --stop-after fuse and --arch contradict each other"), "%s", out);
}

/* A --seq-len too short for the task is named by option (it was "synthetic
 * contains: needs vocab >= 8 and max_len >= 6 (got 30522, 2)"). */
Test(cli_run, short_seq_len_is_named)
{
    char out[65536];
    int rc = hpc("run models/bert_tiny.model --device cpu --steps 1 --seq-len 2", out, sizeof out);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, out);
    cr_expect_str_eq(out, "hpc: run: --seq-len 2: task synthetic-contains needs rows of at least 6 tokens\n");
    rc = hpc("run models/bert_tiny.model --device cpu --steps 1 --task cola --seq-len 2", out, sizeof out);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, out);
    cr_expect_str_eq(out, "hpc: run: --seq-len 2: task cola needs rows of at least 3 tokens\n");
}

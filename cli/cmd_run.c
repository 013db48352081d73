/* cli/cmd_run.c — `hpc run [MODEL] [--device auto|cpu|cuda]`: train and
 * evaluate.
 *
 * MODEL is a .model file or a NAME.hpc artifact (compiler/artifact.h);
 * without one, the only *.hpc in the working directory.  The data is a
 * GLUE task (runtime/data/tasks.h, load_task) or a synthetic one
 * (runtime/data/synthetic.h, make_data); training settings on the command line
 * override the model's (cli/run_overrides.h); the backend is the GPU when
 * one is usable, else the cpu (runtime/train/trainer.h). */
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "artifact.h"
#include "cpu/cpu_exec.h"
#include "cpu/cpu_threads.h"
#include "train/checkpoint.h"
#include "cli.h"
#include "data/dataset.h"
#include "spec.h"
#include "data/synthetic.h"
#include "data/tasks.h"
#include "run_overrides.h"
#include "train/trainer.h"

static const char run_usage[] =
    "usage: hpc run [MODEL] [--device auto|cpu|cuda] [--task NAME] [--steps N]\n"
    "               [--fp32|--fp16|--bf16] [--seq-len N] [--train-rows N] [--eval-every N]\n"
    "               [--log FILE.jsonl] [--no-fuse] [--data DIR] [--vocab FILE] [--cased]\n"
    "               [--predict FILE] [--skip-bad-rows] [--checkpoint-dir DIR]\n"
    "               [--checkpoint-every N] [--keep K] [--resume DIR] [--init DIR]\n"
    "               [--cpu-reference] [--threads N]\n"
    "\n"
    "Trains MODEL (a .model file or a NAME.hpc artifact from `hpc compile`) and\n"
    "evaluates it on a held-out split.  Without MODEL, runs the one *.hpc file in\n"
    "the current directory.\n"
    "\n"
    "options:\n"
    "  --device D            auto (default): the GPU when one is usable, else the cpu;\n"
    "                        cpu: the cpu backend (fast mode, below); cuda: GPU 0 or\n"
    "                        an error\n"
    "  --cpu-reference       on the cpu, run the single-threaded reference kernels (the\n"
    "                        numbers tests hold every backend to) instead of the fast\n"
    "                        mode: every core, FMA gemms (results within ~1e-6\n"
    "                        relative of the reference, the same on any thread count),\n"
    "                        fp16/bf16 still emulated\n"
    "  --threads N           cpu threads (default HPC_CPU_THREADS, else every online core)\n"
    "  --task NAME           a GLUE task: cola, sst2, mrpc, rte, qnli, qqp, stsb, mnli,\n"
    "                        mnli-mm, wnli, or tsv:DIR (docs/tasks.md); or a synthetic\n"
    "                        task: synthetic-contains (default: does token 5 occur?),\n"
    "                        synthetic-sorted (is the sequence sorted?)\n"
    "  --data DIR            the task's files (default data/NAME: train.tsv, dev.tsv,\n"
    "                        test.tsv optional)\n"
    "  --vocab FILE          WordPiece vocabulary (default\n"
    "                        data/vocab/bert-base-uncased-vocab.txt)\n"
    "  --cased               keep case and accents (default vocab: the cased one)\n"
    "  --predict FILE        after training, write GLUE test predictions to FILE\n"
    "  --skip-bad-rows       skip and count malformed train/dev rows instead of stopping\n"
    "  --steps N             optimizer steps (default: the model's steps or epochs)\n"
    "  --fp32                full precision (default; an artifact's own policy when\n"
    "                        running a .hpc file)\n"
    "  --fp16, --bf16        mixed precision: on the GPU values stored in 16 bits;\n"
    "                        on the cpu emulated (every such value rounded)\n"
    "  --seq-len N           longest row: synthetic default min(max_seq_len, 32); GLUE\n"
    "                        rows are truncated to it (default the model's seq_len)\n"
    "  --train-rows N        synthetic training rows (default 2000; dev: a quarter)\n"
    "  --eval-every N        evaluate every N steps (default: at the end; with a GLUE\n"
    "                        task, at the end of every epoch)\n"
    "  --log FILE            also write a JSONL log\n"
    "  --no-fuse             train the unfused graph (compiler/fuse.h off)\n"
    "  --checkpoint-dir DIR  save the training state in DIR/step-N at the end of each\n"
    "                        epoch, at the end, and on SIGINT/SIGTERM (then exit 8)\n"
    "  --checkpoint-every N  also every N steps\n"
    "  --keep K              step directories kept in DIR (default 2)\n"
    "  --resume DIR          continue the run saved in DIR (a --checkpoint-dir or one\n"
    "                        step-N in it) exactly; MODEL defaults to the checkpoint's\n"
    "                        model; give the same --steps, --task and data options\n"
    "  --init DIR            start from the weights in DIR: a Hugging Face folder\n"
    "                        (model.safetensors) or an hpc checkpoint\n"
    "  -h, --help            this text\n"
    "\n"
    "The model needs a sequence classification head (or a causal LM head,\n"
    "which trains on the same rows as language modelling).\n"
    "Test hook: HPC_INJECT_INF_STEP=K writes +inf into one gradient before step K,\n"
    "which must then be skipped (the log names it).\n";

typedef struct {
    const char *model, *device, *task, *log, *ckpt_dir, *resume, *init;
    const char *data, *vocab, *predict;   /* GLUE tasks */
    int64_t steps, seq_len, rows, eval_every, ckpt_every, keep, threads;
    SpecPrecision policy;
    bool policy_given, no_fuse, cased, skip_bad_rows, cpu_reference;
    RunOverrides train;  /* --lr, --loss-scale, ... over the model's train block */
    char found[4096];   /* the *.hpc found when no MODEL was given */
} RunArgs;

static int parse_count(const char *opt, const char *s, int64_t *out)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < 1) {
        fprintf(stderr, "hpc run: %s wants a positive integer, got '%s'\n", opt, s);
        return HPC_ERR_USAGE;
    }
    *out = v;
    return 0;
}

/* No MODEL: the one *.hpc in the working directory. */
static int find_artifact(RunArgs *a)
{
    glob_t gl;
    int rc = glob("*" ARTIFACT_EXT, 0, NULL, &gl);
    size_t n = rc == 0 ? gl.gl_pathc : 0;
    if (n == 1) {
        snprintf(a->found, sizeof a->found, "%s", gl.gl_pathv[0]);
        a->model = a->found;
    } else if (n == 0) {
        fprintf(stderr, "hpc run: no MODEL given and no *.hpc file in this directory; give a .model "
                "file or run `hpc compile MODEL` first\n");
    } else {
        fprintf(stderr, "hpc run: no MODEL given and %zu *.hpc files here; name one:\n", n);
        for (size_t i = 0; i < n; i++) fprintf(stderr, "  %s\n", gl.gl_pathv[i]);
    }
    if (rc == 0) globfree(&gl);
    return a->model ? 0 : HPC_ERR_USAGE;
}

static int run_parse(int argc, char **argv, RunArgs *a)
{
    memset(a, 0, sizeof *a);
    a->device = "auto";
    a->task = "synthetic-contains";
    a->rows = 2000;
    a->policy = PREC_FP32;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (cli_is_help(o)) {
            fputs(run_usage, stdout);
            fputs(run_overrides_usage, stdout);
            return -1;
        }
        else if (strcmp(o, "--fp32") == 0) a->policy = PREC_FP32, a->policy_given = true;
        else if (strcmp(o, "--fp16") == 0) a->policy = PREC_FP16, a->policy_given = true;
        else if (strcmp(o, "--bf16") == 0) a->policy = PREC_BF16, a->policy_given = true;
        else if (strcmp(o, "--no-fuse") == 0) a->no_fuse = true;
        else if (strcmp(o, "--cased") == 0) a->cased = true;
        else if (strcmp(o, "--skip-bad-rows") == 0) a->skip_bad_rows = true;
        else if (strcmp(o, "--cpu-reference") == 0) a->cpu_reference = true;
        else if (!v && o[0] == '-') rc = HPC_ERR_USAGE;
        else if (strcmp(o, "--device") == 0) a->device = argv[++i];
        else if (strcmp(o, "--task") == 0) a->task = argv[++i];
        else if (strcmp(o, "--log") == 0) a->log = argv[++i];
        else if (strcmp(o, "--data") == 0) a->data = argv[++i];
        else if (strcmp(o, "--vocab") == 0) a->vocab = argv[++i];
        else if (strcmp(o, "--predict") == 0) a->predict = argv[++i];
        else if (strcmp(o, "--steps") == 0) rc = parse_count(o, argv[++i], &a->steps);
        else if (strcmp(o, "--seq-len") == 0) rc = parse_count(o, argv[++i], &a->seq_len);
        else if (strcmp(o, "--train-rows") == 0) rc = parse_count(o, argv[++i], &a->rows);
        else if (strcmp(o, "--eval-every") == 0) rc = parse_count(o, argv[++i], &a->eval_every);
        else if (strcmp(o, "--checkpoint-dir") == 0) a->ckpt_dir = argv[++i];
        else if (strcmp(o, "--checkpoint-every") == 0) rc = parse_count(o, argv[++i], &a->ckpt_every);
        else if (strcmp(o, "--keep") == 0) rc = parse_count(o, argv[++i], &a->keep);
        else if (strcmp(o, "--threads") == 0) rc = parse_count(o, argv[++i], &a->threads);
        else if (strcmp(o, "--resume") == 0) a->resume = argv[++i];
        else if (strcmp(o, "--init") == 0) a->init = argv[++i];
        else if (run_override_known(o)) rc = run_override_add(&a->train, o, argv[++i], NULL);
        else if (o[0] == '-' || a->model) rc = HPC_ERR_USAGE;
        else a->model = o;
        if (rc) {
            fprintf(stderr, "hpc run: bad argument '%s'\n%s", o, run_usage);
            return rc;
        }
    }
    return a->model || a->resume ? 0 : find_artifact(a);
}

static bool is_synthetic(const RunArgs *a) { return strncmp(a->task, "synthetic-", 10) == 0; }

static HpcStatus check_run(const ModelSpec *s, const RunArgs *a, HpcError *err)
{
    TrainDevice d;
    if (!train_device_parse(a->device, &d))
        return hpc_fail(err, HPC_ERR_USAGE, "run: unknown device '%s'; use auto, cpu or cuda", a->device);
    if (!is_synthetic(a)) return HPC_OK;  /* task_check_model checks a GLUE task */
    if (a->data || a->vocab || a->predict || a->cased || a->skip_bad_rows)
        return hpc_fail(err, HPC_ERR_USAGE, "run: --data, --vocab, --cased, --predict and --skip-bad-rows "
                        "need a GLUE task (--task cola, ...), not %s", a->task);
    bool seq = s->head.kind == HEAD_SEQ_CLASSIFICATION, lm = s->head.kind == HEAD_CAUSAL_LM;
    if (!seq && !lm)
        return hpc_fail(err, HPC_ERR_USAGE, "run: %s has a %s head; synthetic tasks train sequence "
                        "classification or causal LM heads", s->name, spec_head_kind_name(s->head.kind));
    if (seq && !s->head.regression && s->head.num_labels < 2)
        return hpc_fail(err, HPC_ERR_USAGE, "run: %s has %lld labels; synthetic tasks have 2",
                        s->name, (long long)s->head.num_labels);
    return HPC_OK;
}

static HpcStatus make_data(const ModelSpec *s, const RunArgs *a, Dataset *train, Dataset *dev,
                           HpcError *err)
{
    SynTask task;
    HpcStatus st = synthetic_parse(a->task, &task, err);
    if (st) return st;
    int64_t len = a->seq_len ? a->seq_len : (s->train.max_seq_len < 32 ? s->train.max_seq_len : 32);
    if (len > s->train.max_seq_len) len = s->train.max_seq_len;
    bool reg = s->head.kind == HEAD_SEQ_CLASSIFICATION && s->head.regression;
    dataset_init(train, "synthetic/train");
    dataset_init(dev, "synthetic/dev");
    st = synthetic_make(task, train, a->rows, s->stack.vocab_size, len, s->train.seed, reg, err);
    if (!st) st = synthetic_make(task, dev, a->rows / 4 + 1, s->stack.vocab_size, len,
                                 s->train.seed + 1, reg, err);
    return st;
}

/* A GLUE task: rows tokenized to the model's seq_len (or --seq-len if shorter). */
static HpcStatus load_task(const ModelSpec *s, const RunArgs *a, TaskData *task, HpcError *err)
{
    int64_t len = a->seq_len && a->seq_len < s->train.max_seq_len ? a->seq_len : s->train.max_seq_len;
    HpcStatus st = task_load(a->task, a->data, a->vocab, a->cased, len, a->skip_bad_rows, task, err);
    if (!st) st = task_check_model(task, s, err);
    if (!st && a->predict && !task->info[TASK_SPLIT_TEST].present)
        st = hpc_fail(err, HPC_ERR_USAGE, "run: --predict %s: task %s has no test split (%s not found)",
                      a->predict, task->name, task->info[TASK_SPLIT_TEST].path);
    return st;
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* A .hpc artifact (its policy unless a flag was given) or a .model file. */
static int load_spec(RunArgs *a, ModelSpec *spec)
{
    if (!a->model) {   /* --resume without MODEL: the checkpoint's own model */
        HpcError err = {0};
        SpecPrecision p;
        if (checkpoint_read_spec(a->resume, spec, &p, &err)) return cli_report(&err);
        if (!a->policy_given && p != PREC_DEFAULT) a->policy = p;
        return 0;
    }
    if (!has_suffix(a->model, ARTIFACT_EXT)) {
        int nerr = spec_load(a->model, spec, stderr);
        return nerr ? (nerr < 0 ? HPC_ERR_IO : HPC_ERR_INPUT) : 0;
    }
    HpcError err = {0};
    SpecPrecision p;
    if (artifact_load_spec(a->model, spec, &p, stderr, &err)) return cli_report(&err);
    if (!a->policy_given && p != PREC_DEFAULT) a->policy = p;
    return 0;
}

/* HPC_INJECT_INF_STEP=K (test hook, trainer.h); 0 when unset. */
static int64_t inject_step(void)
{
    const char *s = getenv("HPC_INJECT_INF_STEP");
    return s ? strtoll(s, NULL, 10) : 0;
}

int cmd_run(int argc, char **argv)
{
    RunArgs a;
    int rc = run_parse(argc, argv, &a);
    if (rc) return rc < 0 ? HPC_OK : rc;
    ModelSpec spec;
    rc = load_spec(&a, &spec);
    if (rc) return rc;
    HpcError err = {0};
    TrainDevice device = TRAIN_DEVICE_AUTO;
    train_device_parse(a.device, &device);
    Dataset train, dev;
    memset(&train, 0, sizeof train);
    memset(&dev, 0, sizeof dev);
    TaskData task;
    memset(&task, 0, sizeof task);
    HpcStatus st = run_overrides_apply(&a.train, &spec, &err);
    if (!st) st = check_run(&spec, &a, &err);
    bool glue = !is_synthetic(&a);
    if (!st) st = glue ? load_task(&spec, &a, &task, &err) : make_data(&spec, &a, &train, &dev, &err);
    TrainOptions o = {.steps = a.steps, .eval_every = a.eval_every, .log_every = 10, .jsonl = a.log,
                      .out = stderr, .progress_bar = isatty(2), .policy = a.policy,
                      .device = device, .inject_inf_step = inject_step(), .no_fuse = a.no_fuse,
                      .task = glue ? &task : NULL, .predict = a.predict,
                      .checkpoint_dir = a.ckpt_dir, .checkpoint_every = a.ckpt_every, .checkpoint_keep = (int)a.keep,
                      .resume_dir = a.resume, .init_dir = a.init, .handle_signals = true};
    if (!st && a.threads > CPU_THREADS_MAX)
        st = hpc_fail(&err, HPC_ERR_USAGE, "run: --threads %lld: at most %d", (long long)a.threads,
                      CPU_THREADS_MAX);
    cpu_exec_set_training_mode(a.cpu_reference ? CPU_EXEC_REFERENCE : CPU_EXEC_FAST);
    if (!st && a.threads) cpu_threads_set((int)a.threads);
    TrainResult r;
    if (!st) st = trainer_run(&spec, glue ? &task.train : &train, glue ? &task.dev : &dev, &o, &r, &err);
    dataset_free(&train);
    dataset_free(&dev);
    task_free(&task);
    if (st) return cli_report(&err);
    if (r.resumed_from > 0)
        printf("%s: %lld steps (%lld skipped; resumed after step %lld) on %s, loss -> %.4f, dev %s %.4f\n",
               spec.name, (long long)r.steps, (long long)r.skipped, (long long)r.resumed_from, r.backend, r.last_loss,
               r.metric, r.eval_metric);
    else
        printf("%s: %lld steps (%lld skipped) on %s, loss %.4f -> %.4f, dev %s %.4f (best %.4f at step %lld)\n",
               spec.name, (long long)r.steps, (long long)r.skipped, r.backend, r.first_loss, r.last_loss, r.metric,
               r.eval_metric, r.best_metric, (long long)r.best_step);
    if (r.saved[0]) printf("checkpoint: %s\n", r.saved);
    return HPC_OK;
}

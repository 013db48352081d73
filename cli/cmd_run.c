/* cli/cmd_run.c — `hpc run [MODEL] [--device auto|cpu|cuda]`: train and
 * evaluate.
 *
 * MODEL is a .model file or a NAME.hpc artifact (program/artifact.h);
 * without one, the only *.hpc in the working directory.  The data is a
 * GLUE task (runtime/data/tasks.h, load_task) or a synthetic one
 * (runtime/data/synthetic.h, make_data); training settings on the command line
 * override the model's (cli/run_overrides.h); the backend is the GPU when
 * one is usable, else the cpu (runtime/train/trainer.h).  --gpus N > 1
 * starts N copies of this command, one per GPU (runtime/dist/launch.h),
 * each of which finds its rank in the environment (RANK, WORLD_SIZE, as an
 * external launcher sets them too) and trains data parallel over NCCL
 * (docs/distributed.md). */
#include <errno.h>
#include <glob.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "program/artifact.h"
#include "step_program_build.h"
#include "cpu/cpu_exec.h"
#include "cpu/cpu_threads.h"
#include "train/checkpoint.h"
#include "cli.h"
#include "data/dataset.h"
#include "util/phase_clock.h"
#include "program/spec.h"
#include "compiler/spec_load.h"
#include "data/synthetic.h"
#include "data/tasks.h"
#include "formats/hf_folder.h"
#include "formats/hf_tokenizer.h"
#include "run_overrides.h"
#include "train/init.h"
#include "train/spec_compile.h"
#include "train/trainer.h"
#include "cuda/cuda_driver.h"
#include "dist/collectives.h"
#include "dist/launch.h"
#include "dist/rendezvous.h"

typedef struct {
    const char *model, *device, *task, *log, *ckpt_dir, *resume, *init, *output;
    const char *data, *vocab, *predict;   /* GLUE tasks */
    int64_t steps, seq_len, rows, eval_every, ckpt_every, keep, threads, gpus;
    SpecPrecision policy;                 /* PREC_DEFAULT: no flag (an artifact's own, else fp32) */
    bool no_fuse, cased, skip_bad_rows, allow_changed, no_memory_check, cpu_reference, bucket;
    bool pack;   /* --pack: train.pack = true (docs/packing.md) */
    bool rows_given;                      /* --train-rows */
    StepProgram program;       /* the run's program (have_program): a NAME.hpc's, or the model's compiled here */
    bool have_program;
    RunOverrides train;  /* --lr, --loss-scale, ... over the model's train block */
    CliParsed parsed;
    const bool *train_seen;   /* which of run_override_opts were given (in parsed) */
    char found[4096];   /* the *.hpc found when no MODEL was given */
    char init_vocab[4096]; /* --init DIR's vocab.txt, when it is used */
} RunArgs;

/* Rows sharing a bit contradict each other (RUN_EX_LENGTH: --steps or --epochs). */
enum { EX_PRECISION = 2, EX_START = 4 };

static const char *const DEVICES[] = {"auto", "cpu", "cuda", NULL};

#define A(f) offsetof(RunArgs, f)
static const CliOpt run_opts[] = {
    {.name = "device", .kind = CLI_STR, .off = A(device), .meta = "D", .choices = DEVICES,
     .help = "auto (default): the GPU when one is usable, else the cpu; "
             "cpu: the reference backend; cuda: GPU 0 or an error"},
    {.name = "cpu-reference", .kind = CLI_FLAG, .off = A(cpu_reference),
     .help = "on the cpu, run the single-threaded reference kernels (the numbers tests hold every "
             "backend to) instead of the fast mode: every core, FMA gemms (results within ~1e-6 "
             "relative of the reference, the same on any thread count), fp16/bf16 still emulated"},
    {.name = "threads", .kind = CLI_INT, .off = A(threads), .meta = "N", .min = 1, .max = CPU_THREADS_MAX,
     .help = "cpu threads (default HPC_CPU_THREADS, else every online core)"},
    {.name = "gpus", .kind = CLI_INT, .off = A(gpus), .meta = "N", .min = 1, .max = 64,
     .help = "train data parallel on N GPUs of this host, one process each, over NCCL (default 1); "
             "ranks started by another launcher read RANK, WORLD_SIZE, LOCAL_RANK and HPC_RENDEZVOUS "
             "or MASTER_ADDR/MASTER_PORT (docs/distributed.md)"},
    {.name = "task", .kind = CLI_STR, .off = A(task), .meta = "NAME",
     .help = "a GLUE task: cola, sst2, mrpc, rte, qnli, qqp, stsb, mnli, "
             "mnli-mm, wnli, or tsv:DIR (docs/tasks.md); or a synthetic "
             "task: synthetic-contains (default: does token 5 occur?), "
             "synthetic-sorted (is the sequence sorted?)"},
    {.name = "data", .kind = CLI_STR, .off = A(data), .meta = "DIR",
     .help = "the task's files (default data/NAME: train.tsv, dev.tsv, test.tsv optional)"},
    {.name = "vocab", .kind = CLI_STR, .off = A(vocab), .meta = "FILE",
     .help = "WordPiece vocabulary (default data/vocab/bert-base-uncased-vocab.txt)"},
    {.name = "cased", .kind = CLI_FLAG, .off = A(cased),
     .help = "keep case and accents (default vocab: the cased one)"},
    {.name = "predict", .kind = CLI_STR, .off = A(predict), .meta = "FILE",
     .help = "after training, write GLUE test predictions to FILE"},
    {.name = "skip-bad-rows", .kind = CLI_FLAG, .off = A(skip_bad_rows),
     .help = "skip and count malformed train/dev rows instead of stopping"},
    {.name = "steps", .kind = CLI_INT, .off = A(steps), .meta = "N", .min = 1, .max = 1000000000000,
     .excludes = RUN_EX_LENGTH, .help = "optimizer steps (default: the model's steps or epochs)"},
    {.name = "fp32", .kind = CLI_SET, .off = A(policy), .set = PREC_FP32, .excludes = EX_PRECISION,
     .help = "full precision (default; an artifact's own policy when running a .hpc file)"},
    {.name = "fp16", .kind = CLI_SET, .off = A(policy), .set = PREC_FP16, .excludes = EX_PRECISION,
     .help = "mixed precision: on the GPU values stored in 16 bits; on the cpu emulated (every such value rounded)"},
    {.name = "bf16", .kind = CLI_SET, .off = A(policy), .set = PREC_BF16, .excludes = EX_PRECISION,
     .help = "as --fp16, with bfloat16"},
    {.name = "seq-len", .kind = CLI_INT, .off = A(seq_len), .meta = "N", .min = 1, .max = 1 << 20,
     .help = "longest row: synthetic default min(max_seq_len, 32); GLUE "
             "rows are truncated to it (default the model's seq_len)"},
    {.name = "train-rows", .kind = CLI_INT, .off = A(rows), .meta = "N", .min = 1, .max = 1000000,
     .help = "synthetic training rows (default 2000; dev: a quarter)"},
    {.name = "eval-every", .kind = CLI_INT, .off = A(eval_every), .meta = "N", .min = 1, .max = 1000000000000,
     .help = "evaluate every N steps (default: at the end; with a GLUE task, at the end of every epoch)"},
    {.name = "log", .kind = CLI_STR, .off = A(log), .meta = "FILE", .help = "also write a JSONL log"},
    {.name = "no-fuse", .kind = CLI_FLAG, .off = A(no_fuse), .help = "train the unfused graph (compiler/fuse.h off)"},
    {.name = "checkpoint-dir", .kind = CLI_STR, .off = A(ckpt_dir), .meta = "DIR",
     .help = "save the training state in DIR/step-N at the end of each "
             "epoch, at the end, and on SIGINT/SIGTERM (then exit 8)"},
    {.name = "checkpoint-every", .kind = CLI_INT, .off = A(ckpt_every), .meta = "N", .min = 1,
     .max = 1000000000000, .needs = "checkpoint-dir", .help = "also every N steps"},
    {.name = "keep", .kind = CLI_INT, .off = A(keep), .meta = "K", .min = 1, .max = 1000000,
     .needs = "checkpoint-dir", .help = "step directories kept in DIR (default 2)"},
    {.name = "resume", .kind = CLI_STR, .off = A(resume), .meta = "DIR", .excludes = EX_START,
     .help = "continue the run saved in DIR (a --checkpoint-dir or one "
             "step-N in it) exactly; MODEL defaults to the checkpoint's "
             "model; give the same --steps, --task and data options"},
    {.name = "init", .kind = CLI_STR, .off = A(init), .meta = "DIR", .excludes = EX_START,
     .help = "start from the weights in DIR: a Hugging Face folder (model.safetensors) or an hpc "
             "checkpoint; with a GLUE task also DIR's vocab.txt and tokenizer_config.json's "
             "do_lower_case unless --vocab or --cased say otherwise"},
    {.name = "allow-changed-settings", .kind = CLI_FLAG, .off = A(allow_changed), .needs = "resume",
     .help = "with --resume: continue although training settings (lr, batch, steps, task, ...) "
             "differ from the checkpoint's; the log lists each change (default: refused, exit 1)"},
    {.name = "no-memory-check", .kind = CLI_FLAG, .off = A(no_memory_check),
     .help = "start even when the run needs more memory than is available (default: refused "
             "with exit 6 and the figures)"},
    {.name = "output", .kind = CLI_STR, .off = A(output), .meta = "DIR",
     .help = "write the best model by dev metric (the final one when there is no evaluation) "
             "as a Hugging Face folder: config.json, model.safetensors, vocab.txt, "
             "tokenizer_config.json, special_tokens_map.json"},
    {.name = "pack", .kind = CLI_FLAG, .off = A(pack),
     .help = "packed batches (the model's `pack = true`): each batch holds its rows' tokens back to back "
             "with no padding rows, so a step costs the real tokens, not batch x the longest row "
             "(docs/packing.md); on the GPU with --fp16 or --bf16 (fp32: --device cpu); off by default"},
    {.name = "bucket", .kind = CLI_FLAG, .off = A(bucket),
     .help = "train on batches of rows of similar length (windows of 50 batches sorted by length, "
             "then visited in a seeded order): less padding, so faster, but another batch "
             "composition than the default shuffled batches (the cpu demo uses it)"},
    CLI_END,
};
#undef A

_Static_assert(sizeof(SpecPrecision) == sizeof(int), "--fp16 and friends store an int");

const CliCommand cli_run_command = {
    .name = "run", .args = "[MODEL]", .arg_name = "MODEL", .min_args = 0, .max_args = 1,
    .about = "Trains MODEL (a .model file or a NAME.hpc artifact from `hpc compile`) and\n"
             "evaluates it on a held-out split.  Without MODEL, runs the one *.hpc file in\n"
             "the current directory.\n",
    .footer = "The model needs a sequence classification head (or, with a synthetic task,\n"
              "a causal LM head, which trains on the same rows as language modelling).\n"
              "Test hook: HPC_INJECT_INF_STEP=K writes +inf into one gradient before step K,\n"
              "which must then be skipped (the log names it).\n",
    .sections = {{"options", run_opts, 0},
                 {"training settings (override the model's train block)", run_override_opts,
                  offsetof(RunArgs, train)}},
};

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

static bool is_synthetic(const RunArgs *a) { return strncmp(a->task, "synthetic-", 10) == 0; }

/* Options that only one kind of task reads. */
static HpcStatus run_check_task_options(const RunArgs *a, HpcError *err)
{
    if (is_synthetic(a) && (a->data || a->vocab || a->predict || a->cased || a->skip_bad_rows))
        return hpc_fail(err, HPC_ERR_USAGE, "run: --data, --vocab, --cased, --predict and --skip-bad-rows "
                        "need a GLUE task (--task cola, ...), not %s", a->task);
    if (!is_synthetic(a) && a->rows_given)
        return hpc_fail(err, HPC_ERR_USAGE, "run: --train-rows sets the size of a synthetic task; task %s reads "
                        "its rows from its files", a->task);
    return HPC_OK;
}

/* --resume DIR and --init DIR are folders, checked before anything starts
 * (the trainer found a missing one after the run's summary, without the
 * option's name, and called a file "no such directory"). */
static HpcStatus check_start_dir(const char *opt, const char *dir, const char *want, HpcError *err)
{
    struct stat st;
    if (!dir) return HPC_OK;
    bool exists = stat(dir, &st) == 0;
    if (exists && S_ISDIR(st.st_mode)) return HPC_OK;
    /* a path that cannot be looked at is a file-system error (exit 3, as for
     * a missing model file); one that is there but no folder, a bad input */
    return hpc_fail(err, exists ? HPC_ERR_INPUT : HPC_ERR_IO, "run: %s %s: %s; give %s", opt, dir,
                    exists ? "not a folder" : strerror(errno), want);
}

/* The command line into *a; 0, CLI_HELP_SHOWN or an exit code (reported). */
static int run_parse(int argc, char **argv, RunArgs *a)
{
    memset(a, 0, sizeof *a);
    a->device = "auto";
    a->task = "synthetic-contains";
    a->rows = 2000;
    a->policy = PREC_DEFAULT;
    const CliCommand *c = &cli_run_command;
    HpcError err = {0};
    int rc = cli_parse(c, argc, argv, a, &a->parsed, &err);
    const bool *train_seen = a->parsed.seen + cli_section_rows(&c->sections[0]);
    if (!rc) rc = run_overrides_check(&a->train, train_seen, &err) ? HPC_ERR_USAGE : 0;
    if (rc) return rc == CLI_HELP_SHOWN ? rc : cli_report(&err);
    a->train_seen = train_seen;
    a->rows_given = cli_seen(c, &a->parsed, "train-rows");
    if (run_check_task_options(a, &err)) return cli_report(&err);
    if (check_start_dir("--resume", a->resume, "a --checkpoint-dir of an earlier run or one of its step-N folders",
                        &err) ||
        check_start_dir("--init", a->init, "a Hugging Face folder (model.safetensors) or an hpc checkpoint", &err))
        return cli_report(&err);
    if (a->parsed.n_args) a->model = a->parsed.args[0];
    return a->model || a->resume ? 0 : find_artifact(a);
}

static HpcStatus check_run(const ModelSpec *s, const RunArgs *a, HpcError *err)
{
    TrainDevice d;
    if (!train_device_parse(a->device, &d))
        return hpc_fail(err, HPC_ERR_USAGE, "run: unknown device '%s'; use auto, cpu or cuda", a->device);
    if (!is_synthetic(a)) return HPC_OK;  /* task_check_model checks a GLUE task */
    bool seq = s->head.kind == HEAD_SEQ_CLASSIFICATION, lm = s->head.kind == HEAD_CAUSAL_LM;
    if (!seq && !lm)
        return hpc_fail(err, HPC_ERR_USAGE, "run: %s has a %s head; synthetic tasks train sequence "
                        "classification or causal LM heads", s->name, spec_head_kind_name(s->head.kind));
    if (seq && !s->head.regression && s->head.num_labels < 2)
        return hpc_fail(err, HPC_ERR_USAGE, "run: %s has %lld labels; synthetic tasks have 2",
                        s->name, (long long)s->head.num_labels);
    return HPC_OK;
}

/* Rows shorter than a task needs (GLUE: [CLS] x [SEP], runtime/data/tasks.c;
 * synthetic: 6 tokens, runtime/data/synthetic.h) are refused by option (the
 * task's own message spoke of a "max length"). */
static HpcStatus check_seq_len(const RunArgs *a, int64_t len, int64_t least, HpcError *err)
{
    if (len >= least) return HPC_OK;
    return hpc_fail(err, HPC_ERR_USAGE, "run: %s %lld: task %s needs rows of at least %lld tokens",
                    a->seq_len ? "--seq-len" : "the model's max_seq_len", (long long)len, a->task,
                    (long long)least);
}

static HpcStatus make_data(const ModelSpec *s, const RunArgs *a, Dataset *train, Dataset *dev,
                           HpcError *err)
{
    SynTask task;
    HpcStatus st = synthetic_parse(a->task, &task, err);
    if (st) return st;
    int64_t len = a->seq_len ? a->seq_len : (s->train.max_seq_len < 32 ? s->train.max_seq_len : 32);
    if (len > s->train.max_seq_len) len = s->train.max_seq_len;
    if ((st = check_seq_len(a, len, 6, err))) return st;
    bool reg = s->head.kind == HEAD_SEQ_CLASSIFICATION && s->head.regression;
    dataset_init(train, "synthetic/train");
    dataset_init(dev, "synthetic/dev");
    st = synthetic_make(task, train, a->rows, s->stack.vocab_size, len, s->train.seed, reg, err);
    if (!st) st = synthetic_make(task, dev, a->rows / 4 + 1, s->stack.vocab_size, len,
                                 s->train.seed + 1, reg, err);
    return st;
}

/* --init DIR with a GLUE task: DIR's vocab.txt and casing unless --vocab or
 * --cased were given; one line says what the tokenizer uses and why. */
static HpcStatus init_tokenizer(RunArgs *a, HpcError *err)
{
    HfTokenizerInfo ti;
    HpcStatus st = hf_tokenizer_read(a->init, &ti, err);
    if (st) return st;
    const char *vocab_from = a->vocab ? "--vocab" : "default";
    if (!a->vocab && ti.vocab[0]) {
        snprintf(a->init_vocab, sizeof a->init_vocab, "%s", ti.vocab);
        a->vocab = a->init_vocab;
        vocab_from = "from --init";
    }
    const char *case_from = a->cased ? "--cased" : "default";
    if (!a->cased && ti.has_lower_case) {
        a->cased = !ti.do_lower_case;
        case_from = ti.do_lower_case ? "tokenizer_config.json do_lower_case true"
                                     : "tokenizer_config.json do_lower_case false";
    }
    fprintf(stderr, "hpc run: tokenizer: vocabulary %s (%s), %s (%s)\n",
            a->vocab ? a->vocab : a->cased ? "data/vocab/bert-base-cased-vocab.txt"
                                           : "data/vocab/bert-base-uncased-vocab.txt",
            vocab_from, a->cased ? "cased" : "lower-cased", case_from);
    return HPC_OK;
}

/* A GLUE task: rows tokenized to the model's seq_len (or --seq-len if shorter). */
static HpcStatus load_task(const ModelSpec *s, const RunArgs *a, TaskData *task, HpcError *err)
{
    int64_t len = a->seq_len && a->seq_len < s->train.max_seq_len ? a->seq_len : s->train.max_seq_len;
    HpcStatus st = check_seq_len(a, len, 3, err);
    if (!st) st = task_load(a->task, a->data, a->vocab, a->cased, len, a->skip_bad_rows, task, err);
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
        if (a->policy == PREC_DEFAULT) a->policy = p == PREC_DEFAULT ? PREC_FP32 : p;
        return 0;
    }
    if (!has_suffix(a->model, ARTIFACT_EXT)) {
        int nerr = spec_load(a->model, spec, stderr);
        if (a->policy == PREC_DEFAULT) a->policy = PREC_FP32;
        return nerr ? (nerr < 0 ? HPC_ERR_IO : HPC_ERR_INPUT) : 0;
    }
    HpcError err = {0};
    if (step_program_load(a->model, a->policy, !a->no_fuse, &a->program,
                          stderr, &err))
        return cli_report(&err);
    a->have_program = true;
    a->policy = a->program.policy;
    *spec = a->program.spec;
    return 0;
}

/* The artifact's program takes the run's training overrides; a change that
 * alters the graph (frozen parameters) compiles the model again. */
static HpcStatus program_for_run(RunArgs *a, const ModelSpec *spec, HpcError *err)
{
    const SpecTraining *was = &a->program.spec.train, *now = &spec->train;
    if (was->freeze_embeddings == now->freeze_embeddings && was->freeze_layers == now->freeze_layers &&
        was->pack == now->pack) {
        a->program.spec = *spec;
        return HPC_OK;
    }
    step_program_free(&a->program);
    return train_spec_compile(spec, a->policy, !a->no_fuse, &a->program, err);
}

/* A .model file (or a checkpoint's model, --resume without MODEL): compiled
 * once, here, with the run's settings, and then the artifact's road: the
 * trainer's memory check and its backend share this program instead of
 * compiling the spec once each (tests/test_run_compiles.c). */
static HpcStatus program_from_model(RunArgs *a, const ModelSpec *spec, HpcError *err)
{
    HpcStatus st = train_spec_compile(spec, a->policy, !a->no_fuse, &a->program, err);
    if (st) {
        step_program_free(&a->program);
        return st;
    }
    a->have_program = true;
    return HPC_OK;
}

/* What the data adds to the settings a checkpoint records (checkpoint.h). */
static void data_settings(const RunArgs *a, const ModelSpec *s, const Dataset *train, CheckpointSettings *cs)
{
    cs->n = 0;
    checkpoint_settings_add(cs, "task", "%s", a->task);
    checkpoint_settings_add(cs, "train_rows", "%lld", (long long)train->n);
    int64_t len = a->seq_len && a->seq_len < s->train.max_seq_len ? a->seq_len : s->train.max_seq_len;
    if (is_synthetic(a) && !a->seq_len && len > 32) len = 32;   /* make_data's default */
    checkpoint_settings_add(cs, "data_seq_len", "%lld", (long long)len);
    if (!is_synthetic(a)) checkpoint_settings_add(cs, "cased", "%s", a->cased ? "true" : "false");
    if (a->bucket) checkpoint_settings_add(cs, "bucket", "true");   /* the batches' composition */
}

/* HPC_INJECT_INF_STEP=K (test hook, trainer.h); 0 when unset. */
static HpcStatus inject_step(int64_t *step, HpcError *err)
{
    const char *s = getenv("HPC_INJECT_INF_STEP");
    char want[96];
    *step = 0;
    if (s && num_int(s, 1, INT64_MAX, step))
        return hpc_fail(err, HPC_ERR_USAGE, "run: HPC_INJECT_INF_STEP=%.40s: expected %s", s,
                        num_int_wanted(1, INT64_MAX, want, sizeof want));
    return HPC_OK;
}

/* --gpus N > 1 from a plain shell: what N processes need is checked here,
 * then they are started (this command again, as ranks) and waited for. */
static HpcStatus launch_ranks(const RunArgs *a, int argc, char **argv, int *exit_code, HpcError *err)
{
    int n = 0;
    HpcError why = {0};
    if (cuda_device_count(&n, &why))
        return hpc_fail(err, HPC_ERR_NO_GPU, "run: --gpus %lld needs %lld GPUs: %s", (long long)a->gpus,
                        (long long)a->gpus, why.msg);
    if (n < a->gpus)
        return hpc_fail(err, HPC_ERR_NO_GPU, "run: --gpus %lld, but this host has %d GPU%s; use --gpus %d or fewer",
                        (long long)a->gpus, n, n == 1 ? "" : "s", n);
    HpcStatus st = coll_nccl_load(err);
    if (st) return st;
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return hpc_fail(err, HPC_ERR_IO, "run: --gpus: cannot find this program (/proc/self/exe)");
    exe[len] = 0;
    char **args = xcalloc((size_t)argc + 2, sizeof *args);   /* exe run ARGS... NULL */
    args[0] = exe;
    for (int i = 0; i < argc; i++) args[i + 1] = argv[i];   /* argv[0] is "run" */
    char rdv[128];
    snprintf(rdv, sizeof rdv, "/tmp/hpc-rendezvous-%d", (int)getpid());
    st = dist_launch((int)a->gpus, args, rdv, 10.0, exit_code, err);
    free(args);
    return st;
}

/* Which process this is: *launch when --gpus N > 1 must start the ranks;
 * env->world > 1 when this process is one rank (of `hpc run --gpus` or of
 * an external launcher). */
static HpcStatus dist_setup(const RunArgs *a, DistEnv *env, bool *launch, HpcError *err)
{
    *launch = false;
    HpcStatus st = dist_env_from_process(env, err);
    if (st) return st;
    bool cpu = strcmp(a->device, "cpu") == 0;
    if (env->world > 1 && a->gpus > 1 && a->gpus != env->world)
        return hpc_fail(err, HPC_ERR_USAGE, "run: --gpus %lld, but WORLD_SIZE=%d says this run has %d ranks; "
                        "give one of them", (long long)a->gpus, env->world, env->world);
    if ((env->world > 1 || a->gpus > 1) && cpu)
        return hpc_fail(err, HPC_ERR_USAGE, "run: --device cpu trains in one process; several ranks (--gpus %lld, "
                        "WORLD_SIZE %d) need GPUs: drop --device cpu or --gpus", (long long)a->gpus, env->world);
    *launch = env->world == 1 && a->gpus > 1;
    return HPC_OK;
}

static int run_command(int argc, char **argv)
{
    RunArgs a;
    int rc = run_parse(argc, argv, &a);
    if (rc) return rc == CLI_HELP_SHOWN ? HPC_OK : rc;
    DistEnv denv;
    bool launch;
    HpcError derr = {0};
    if (dist_setup(&a, &denv, &launch, &derr)) return cli_report(&derr);
    if (launch) {
        int code = 0;
        if (launch_ranks(&a, argc, argv, &code, &derr)) {
            cli_report(&derr);
            return code ? code : (int)derr.code;
        }
        return HPC_OK;
    }
    /* The GPU opens on a thread of its own while the artifact is read and
     * the parameters drawn (runtime/cuda/cuda_driver.h). */
    phase_mark("process start to `hpc run` (the loader, options)");
    if (strcmp(a.device, "cpu") != 0) cuda_device_open_ahead(dist_gpu_ordinal());
    ModelSpec spec;
    rc = load_spec(&a, &spec);
    if (rc) return rc;
    phase_mark("model or artifact read and checked");
    HpcError err = {0};
    TrainDevice device = TRAIN_DEVICE_AUTO;
    train_device_parse(a.device, &device);
    if (denv.world > 1) device = TRAIN_DEVICE_CUDA;   /* one rank of several: its GPU or an error */
    Dataset train, dev;
    memset(&train, 0, sizeof train);
    memset(&dev, 0, sizeof dev);
    TaskData task;
    memset(&task, 0, sizeof task);
    int64_t inject = 0;
    run_overrides_apply(&a.train, a.train_seen, &spec);
    if (a.pack) spec.train.pack = true;
    HpcStatus st = inject_step(&inject, &err);
    if (!st) st = check_run(&spec, &a, &err);
    if (!st) st = a.have_program ? program_for_run(&a, &spec, &err) : program_from_model(&a, &spec, &err);
    bool glue = !is_synthetic(&a);
    if (!st && glue && a.init) st = init_tokenizer(&a, &err);
    if (!st && a.output) st = hf_folder_check(a.output, &spec, &err);
    if (!st) st = glue ? load_task(&spec, &a, &task, &err) : make_data(&spec, &a, &train, &dev, &err);
    phase_mark("training data (GLUE task read and tokenized, or synthetic)");
    CheckpointSettings data;
    data_settings(&a, &spec, glue ? &task.train : &train, &data);
    TrainOptions o = {.steps = a.steps, .eval_every = a.eval_every, .log_every = 10, .jsonl = a.log,
                      .out = stderr, .progress_bar = isatty(2), .policy = a.policy,
                      .device = device, .inject_inf_step = inject, .no_fuse = a.no_fuse,
                      .task = glue ? &task : NULL, .predict = a.predict,
                      .checkpoint_dir = a.ckpt_dir, .checkpoint_every = a.ckpt_every, .checkpoint_keep = (int)a.keep,
                      .resume_dir = a.resume, .init_dir = a.init, .handle_signals = true,
                      .output_dir = a.output, .output_vocab = glue && !st ? task.vocab_path : NULL,
                      .output_lower_case = !a.cased,
                      .data_settings = &data, .allow_changed_settings = a.allow_changed,
                      .no_memory_check = a.no_memory_check, .dist = denv.world > 1 ? &denv : NULL,
                      .program = a.have_program ? &a.program : NULL, .bucket = a.bucket};
    /* the range of --threads is the option table's */
    cpu_exec_set_training_mode(a.cpu_reference ? CPU_EXEC_REFERENCE : CPU_EXEC_FAST);
    if (!st && a.threads) cpu_threads_set((int)a.threads);
    /* The parameters drawn while the trainer checks memory and opens the GPU (train/init.h). */
    if (!st && a.have_program && device != TRAIN_DEVICE_CPU) init_store_ahead(&a.program.pl, a.program.spec.train.seed);
    TrainResult r;
    if (!st) st = trainer_run(&spec, glue ? &task.train : &train, glue ? &task.dev : &dev, &o, &r, &err);
    dataset_free(&train);
    dataset_free(&dev);
    task_free(&task);
    if (a.have_program) step_program_free(&a.program);
    if (st) return cli_report(&err);
    if (denv.rank > 0) return HPC_OK;   /* rank 0 alone reports */
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

/* The threads that open the GPU ahead end before the process does
 * (runtime/cuda/cuda_driver.h, cuda_ahead_join, says why). */
int cmd_run(int argc, char **argv)
{
    int rc = run_command(argc, argv);
    cuda_ahead_join();
    return rc;
}

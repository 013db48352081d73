/* cli/cmd_run.c — `hpc run MODEL --device cpu`: train and evaluate.
 *
 * For now the data is a synthetic task (runtime/synthetic.h) and the
 * backend the cpu executor in fp32 (runtime/trainer.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "dataset.h"
#include "spec.h"
#include "synthetic.h"
#include "trainer.h"

static const char run_usage[] =
    "usage: hpc run MODEL [--device cpu] [--task synthetic-NAME] [--steps N] [--fp32|--fp16|--bf16]\n"
    "                     [--seq-len N] [--train-rows N] [--eval-every N] [--log FILE.jsonl]\n"
    "\n"
    "Trains MODEL (a .model file) and evaluates it on a held-out split.\n"
    "\n"
    "options:\n"
    "  --device cpu          the reference backend (the only one so far)\n"
    "  --task synthetic-NAME synthetic-contains (default: does token 5 occur?) or\n"
    "                        synthetic-sorted (is the sequence sorted?)\n"
    "  --steps N             optimizer steps (default: the model's steps or epochs)\n"
    "  --fp32                full precision (default on the cpu backend)\n"
    "  --fp16, --bf16        mixed precision, emulated: the precision pass's graph\n"
    "                        with every low-precision value rounded to 16 bits\n"
    "  --seq-len N           longest synthetic row (default min(max_seq_len, 32))\n"
    "  --train-rows N        synthetic training rows (default 2000; dev: a quarter)\n"
    "  --eval-every N        evaluate every N steps (default: at the end)\n"
    "  --log FILE            also write a JSONL log\n"
    "  -h, --help            this text\n"
    "\n"
    "The model needs a sequence classification head (or a causal LM head,\n"
    "which trains on the same rows as language modelling).\n";

typedef struct {
    const char *model, *device, *task, *log;
    int64_t steps, seq_len, rows, eval_every;
    SpecPrecision policy;
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

static int run_parse(int argc, char **argv, RunArgs *a)
{
    memset(a, 0, sizeof *a);
    a->device = "cpu";
    a->task = "synthetic-contains";
    a->rows = 2000;
    a->policy = PREC_FP32;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (cli_is_help(o)) { fputs(run_usage, stdout); return -1; }
        else if (strcmp(o, "--fp32") == 0) a->policy = PREC_FP32;
        else if (strcmp(o, "--fp16") == 0) a->policy = PREC_FP16;
        else if (strcmp(o, "--bf16") == 0) a->policy = PREC_BF16;
        else if (!v && o[0] == '-') rc = HPC_ERR_USAGE;
        else if (strcmp(o, "--device") == 0) a->device = argv[++i];
        else if (strcmp(o, "--task") == 0) a->task = argv[++i];
        else if (strcmp(o, "--log") == 0) a->log = argv[++i];
        else if (strcmp(o, "--steps") == 0) rc = parse_count(o, argv[++i], &a->steps);
        else if (strcmp(o, "--seq-len") == 0) rc = parse_count(o, argv[++i], &a->seq_len);
        else if (strcmp(o, "--train-rows") == 0) rc = parse_count(o, argv[++i], &a->rows);
        else if (strcmp(o, "--eval-every") == 0) rc = parse_count(o, argv[++i], &a->eval_every);
        else if (o[0] == '-' || a->model) rc = HPC_ERR_USAGE;
        else a->model = o;
        if (rc) {
            fprintf(stderr, "hpc run: bad argument '%s'\n%s", o, run_usage);
            return rc;
        }
    }
    if (!a->model) {
        fprintf(stderr, "hpc run: no MODEL given\n%s", run_usage);
        return HPC_ERR_USAGE;
    }
    return 0;
}

static HpcStatus check_run(const ModelSpec *s, const RunArgs *a, HpcError *err)
{
    if (strcmp(a->device, "cpu") != 0)
        return hpc_fail(err, HPC_ERR_USAGE, "run: device '%s' is not implemented yet; use --device cpu",
                        a->device);
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

int cmd_run(int argc, char **argv)
{
    RunArgs a;
    int rc = run_parse(argc, argv, &a);
    if (rc) return rc < 0 ? HPC_OK : rc;
    ModelSpec spec;
    int nerr = spec_load(a.model, &spec, stderr);
    if (nerr) return nerr < 0 ? HPC_ERR_IO : HPC_ERR_INPUT;
    HpcError err = {0};
    Dataset train, dev;
    memset(&train, 0, sizeof train);
    memset(&dev, 0, sizeof dev);
    HpcStatus st = check_run(&spec, &a, &err);
    if (!st) st = make_data(&spec, &a, &train, &dev, &err);
    TrainOptions o = {.steps = a.steps, .eval_every = a.eval_every, .log_every = 10, .jsonl = a.log,
                      .out = stderr, .progress_bar = isatty(2), .policy = a.policy};
    TrainResult r;
    if (!st) st = trainer_run(&spec, &train, &dev, &o, &r, &err);
    dataset_free(&train);
    dataset_free(&dev);
    if (st) return cli_report(&err);
    printf("%s: %lld steps, loss %.4f -> %.4f, dev %s %.4f\n", spec.name, (long long)r.steps,
           r.first_loss, r.last_loss, r.metric, r.eval_metric);
    return HPC_OK;
}

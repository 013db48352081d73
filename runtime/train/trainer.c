/* runtime/train/trainer.c — the training loop shared by the backends; see
 * trainer.h.  The backend (train_backend.h) does the steps; this file
 * feeds batches, logs the step records it collects, and evaluates. */
#include "train/trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/loader.h"
#include "train/lossscale.h"
#include "train/predict.h"
#include "report/runlog.h"
#include "train/signals.h"
#include "train/trainer_ckpt.h"

typedef struct {
    const ModelSpec *spec;
    const TrainOptions *opts;
    TrainBackend be;
    RunLog *log;
    int64_t total;
    int64_t flush_every;                 /* collect interval (1 on the cpu) */
    int64_t tokens[TRAIN_STAT_RING];     /* per pending step */
    int epoch[TRAIN_STAT_RING];
    int n_pending;
    TrainStepStat stats[TRAIN_STAT_RING];
    TrainCkpt ck;                        /* checkpoints; ck.w == NULL when not used */
} Trainer;

/* The next batch, starting the next epoch when one ends. */
static Batch *next_batch(Loader *ld, HpcError *err)
{
    Batch *b = loader_next(ld);
    if (!b) b = loader_next(ld);
    if (!b) hpc_fail(err, HPC_ERR_OOM, "trainer: out of host memory for a batch");
    return b;
}

static int64_t real_tokens(const Batch *b)
{
    int64_t n = 0;
    for (int64_t i = 0; i < b->B * b->L; i++) n += b->attention_mask[i] != 0;
    return n;
}

/* Argmax class (or the value, for a 1-column regression head) of each row
 * of the (B, C) logits, stored by example index. */
static void take_predictions(const Trainer *t, const float *lg, const Batch *b, int32_t *labels, float *values)
{
    int64_t C = t->be.g.nodes[t->be.g.logits].dims[1];
    for (int64_t r = 0; r < b->B; r++) {
        const float *row = lg + r * C;
        int64_t best = 0;
        bool finite = true;
        for (int64_t c = 0; c < C; c++) {
            finite &= isfinite(row[c]) != 0;
            if (row[c] > row[best]) best = c;
        }
        int64_t i = b->example_index[r];
        /* NaN logits have no argmax: the row is marked, never scored as class 0. */
        if (labels) labels[i] = finite ? (int32_t)best : TASK_PRED_NONFINITE;
        if (values) values[i] = row[0];
    }
}

static const char *eval_metric_name(const ModelSpec *s, const TaskData *task)
{
    if (task) return metric_name(task->main_metric);
    if (s->head.kind != HEAD_SEQ_CLASSIFICATION) return "loss";
    return s->head.regression ? "mse" : "accuracy";
}

static bool higher_is_better(const char *metric)
{
    return strcmp(metric, "mse") != 0 && strcmp(metric, "loss") != 0;
}

/* One pass over d, dropout off: the mean loss, and predictions (by example
 * index) into labels (d->n) and/or values (d->n) when not NULL. */
static HpcStatus run_forward(Trainer *t, const Dataset *d, int32_t *labels, float *values, double *loss,
                             HpcError *err)
{
    Loader ld;
    HpcStatus st = loader_init(&ld, d, t->spec->train.batch_size, t->spec->train.max_seq_len,
                               t->spec->train.seed, false, false, err);
    if (st) return st;
    double loss_sum = 0;
    int64_t rows = 0;
    for (Batch *b; st == HPC_OK && (b = loader_next(&ld)); batch_free(b)) {
        for (int64_t r = 0; r < b->B; r++)
            if (b->labels[r] < 0) b->labels[r] = 0;  /* unlabelled test rows: their loss is not used */
        double l = 0;
        const float *logits = NULL;
        st = t->be.forward(&t->be, b, &l, labels || values ? &logits : NULL, err);
        if (st) continue;
        loss_sum += l * (double)b->B;
        rows += b->B;
        if (logits) take_predictions(t, logits, b, labels, values);
    }
    loader_free(&ld);
    *loss = rows ? loss_sum / (double)rows : 0;
    return st;
}

/* The task's scores on d (task_evaluate); logs all of them, returns the main one. */
static HpcStatus score_task(Trainer *t, const Dataset *d, const int32_t *labels, const float *values,
                            double *metric, HpcError *err)
{
    TaskScores sc;
    HpcStatus st = task_evaluate(t->opts->task, d, labels, values, &sc);
    if (st == HPC_ERR_INPUT) return hpc_fail(err, st, "trainer: %s has no labelled rows to score", d->name);
    if (st == HPC_ERR_OOM) return hpc_fail(err, st, "trainer: out of host memory scoring %s", d->name);
    if (st) return hpc_fail(err, HPC_ERR_INTERNAL, "trainer: predictions for %s out of range", d->name);
    runlog_message(t->log, "%s: %s", d->name, sc.text);
    *metric = sc.main_value;
    return HPC_OK;
}

/* Share of rows whose predicted class is the gold label (synthetic tasks). */
static double plain_accuracy(const Dataset *d, const int32_t *labels)
{
    int64_t ok = 0;
    for (int64_t i = 0; i < d->n; i++) ok += labels[i] == d->ex[i].label;
    return d->n ? (double)ok / (double)d->n : 0;
}

static HpcStatus evaluate(Trainer *t, const Dataset *d, double *metric, double *loss, HpcError *err)
{
    const TaskData *task = t->opts->task;
    bool accuracy = !task && strcmp(eval_metric_name(t->spec, NULL), "accuracy") == 0;
    bool reg = task && task->regression;
    size_t n = (size_t)(d->n ? d->n : 1);
    int32_t *labels = (task && !reg) || accuracy ? malloc(n * sizeof *labels) : NULL;
    float *values = reg ? malloc(n * sizeof *values) : NULL;
    if (((task && !reg) || accuracy) && !labels) return hpc_fail(err, HPC_ERR_OOM, "trainer: out of host memory");
    if (reg && !values) return hpc_fail(err, HPC_ERR_OOM, "trainer: out of host memory");
    HpcStatus st = run_forward(t, d, labels, values, loss, err);
    if (!st && task) st = score_task(t, d, labels, values, metric, err);
    else if (!st) *metric = accuracy ? plain_accuracy(d, labels) : *loss;
    free(labels);
    free(values);
    return st;
}

static int64_t total_steps(const ModelSpec *spec, const Dataset *train, const TrainOptions *opts)
{
    const SpecTraining *tr = &spec->train;
    if (opts->steps > 0) return opts->steps;
    if (tr->steps > 0) return tr->steps;
    int64_t per_epoch = (train->n + tr->batch_size - 1) / tr->batch_size;
    int64_t steps = tr->epochs * per_epoch / tr->grad_accum;
    return steps > 0 ? steps : 1;
}

/* Logs the records of the steps since the last flush; fails when the loss
 * scaler has given up. */
static HpcStatus flush_steps(Trainer *t, TrainResult *res, HpcError *err)
{
    int n = 0;
    HpcStatus st = t->be.collect(&t->be, t->stats, TRAIN_STAT_RING, &n, err);
    if (st) return st;
    for (int i = 0; i < n; i++) {
        const TrainStepStat *s = &t->stats[i];
        if (s->step == 1) res->first_loss = s->loss;
        res->last_loss = s->loss;
        res->skipped = s->total_skips;
        res->final_scale = s->loss_scale;
        if (s->skipped) {
            runlog_skip(t->log, s->step, s->loss_scale);
            res->last_skipped_step = s->step;
        }
        RunLogStep r = {.step = s->step, .total_steps = t->total, .epoch = t->epoch[i],
                        .loss = s->loss, .lr = s->lr, .loss_scale = s->loss_scale,
                        .skipped_total = s->total_skips, .tokens = t->tokens[i],
                        .device_mem_bytes = t->be.peak_bytes(&t->be)};
        runlog_step(t->log, &r);
        LossScaleConfig lc;
        ls_config_from_spec(&lc, &t->spec->train);
        LossScaler ls = {.cfg = lc, .scale = s->loss_scale, .consecutive_skips = s->consecutive_skips,
                         .total_skips = s->total_skips};
        if (s->skipped && ls_gave_up(&ls)) {
            char why[256];
            ls_describe_give_up(&ls, why, sizeof why);
            return hpc_fail(err, HPC_ERR_NUMERIC, "trainer: %s (step %lld)", why, (long long)s->step);
        }
    }
    t->n_pending = 0;
    return HPC_OK;
}

/* One optimizer step over grad_accum micro-batches (queued, not waited for). */
static HpcStatus train_step(Trainer *t, Loader *ld, int64_t step, HpcError *err)
{
    int64_t accum = t->spec->train.grad_accum > 1 ? t->spec->train.grad_accum : 1, tokens = 0;
    for (int64_t m = 0; m < accum; m++) {
        Batch *b = next_batch(ld, err);
        if (!b) return err->code;
        HpcStatus st = t->be.micro(&t->be, b, m, err);
        tokens += real_tokens(b);
        batch_free(b);
        if (st) return st;
    }
    t->tokens[t->n_pending] = tokens;
    t->epoch[t->n_pending++] = (int)ld->epoch;
    return t->be.step(&t->be, t->opts->inject_inf_step == step + 1, err);
}

static void note_best(TrainResult *res, int64_t step)
{
    double v = res->eval_metric;
    bool better = higher_is_better(res->metric) ? v > res->best_metric : v < res->best_metric;
    if (res->best_step == 0 || better) res->best_metric = v, res->best_step = step;
}

/* GLUE predictions for the task's test split into opts->predict. */
static HpcStatus write_predictions(Trainer *t, HpcError *err)
{
    const TaskData *task = t->opts->task;
    size_t n = (size_t)(task->test.n ? task->test.n : 1);
    int32_t *labels = task->regression ? NULL : malloc(n * sizeof *labels);
    float *values = task->regression ? malloc(n * sizeof *values) : NULL;
    if (!labels && !values) return hpc_fail(err, HPC_ERR_OOM, "trainer: out of host memory for predictions");
    double loss;
    HpcStatus st = run_forward(t, &task->test, labels, values, &loss, err);
    if (!st) st = predict_write_glue(task, labels, values, t->opts->predict, err);
    if (!st) runlog_message(t->log, "wrote %lld %s test predictions to %s", (long long)task->test.n, task->name,
                            t->opts->predict);
    free(labels);
    free(values);
    return st;
}

/* Epochs whose last batch has been used: the loader sits at (e, n) after the
 * last batch of epoch e, and at (e + 1, c) once the next epoch began. */
static int64_t epochs_done(const Loader *ld)
{
    return ld->epoch + (ld->cursor >= ld->data->n);
}

/* After step `done` (1-based): save when asked to.  A signal then stops
 * the run with HPC_ERR_INTERRUPTED. */
static HpcStatus step_boundary(Trainer *t, const Loader *ld, int64_t done, bool save, TrainResult *res,
                               HpcError *err)
{
    const TrainOptions *o = t->opts;
    int sig = o->handle_signals ? signals_pending() : 0;
    HpcStatus st = HPC_OK;
    if (o->checkpoint_dir && (save || sig)) {
        st = trainer_ckpt_save(&t->ck, o->checkpoint_dir, o->checkpoint_keep, ld, done, res->saved,
                               sizeof res->saved, err);
        if (!st) runlog_message(t->log, "checkpoint: %s", res->saved);
    }
    if (!st && sig)
        st = hpc_fail(err, HPC_ERR_INTERRUPTED, "interrupted by signal %d after step %lld; %s%s%s", sig,
                      (long long)done, res->saved[0] ? "state saved in " : "no --checkpoint-dir given, nothing saved",
                      res->saved, res->saved[0] ? " (continue with --resume)" : "");
    return st;
}

static HpcStatus train_loop(Trainer *t, const Dataset *train, const Dataset *eval, TrainResult *res,
                            HpcError *err)
{
    const SpecTraining *tr = &t->spec->train;
    const TrainOptions *opts = t->opts;
    Loader ld;
    HpcStatus st = loader_init(&ld, train, tr->batch_size, tr->max_seq_len, tr->seed, true, false, err);
    if (st) return st;
    int64_t start = 0;
    if (opts->resume_dir) st = trainer_ckpt_resume(&t->ck, opts->resume_dir, &ld, &start, err);
    res->resumed_from = res->steps = start;
    if (!st && start >= t->total && eval) {   /* a finished run: evaluate only */
        runlog_message(t->log, "the checkpoint is at the last step (%lld); nothing left to train", (long long)start);
        st = evaluate(t, eval, &res->eval_metric, &res->eval_loss, err);
    }
    int64_t epochs = epochs_done(&ld);
    for (int64_t step = start; step < t->total && st == HPC_OK; step++) {
        st = train_step(t, &ld, step, err);
        res->steps = step + 1;
        bool last = step + 1 == t->total, stop = opts->stop_after > 0 && step + 1 >= opts->stop_after;
        /* with a task and no --eval-every: at each epoch's end (all rows returned) */
        bool task_epoch_end = opts->task && opts->eval_every == 0 && ld.cursor == train->n;
        bool do_eval = eval && (last || task_epoch_end ||
                                (opts->eval_every > 0 && (step + 1) % opts->eval_every == 0));
        if (!st && (last || stop || do_eval || t->n_pending >= t->flush_every)) st = flush_steps(t, res, err);
        if (!st && do_eval) {
            st = evaluate(t, eval, &res->eval_metric, &res->eval_loss, err);
            if (!st) runlog_eval(t->log, step + 1, (int)ld.epoch, res->metric, res->eval_metric, res->eval_loss);
            if (!st) note_best(res, step + 1);
            if (!st && t->ck.w) trainer_ckpt_metric(&t->ck, res->eval_metric);
        }
        bool epoch_end = epochs_done(&ld) > epochs;
        epochs = epochs_done(&ld);
        bool every = opts->checkpoint_every > 0 && (step + 1) % opts->checkpoint_every == 0;
        if (!st) st = step_boundary(t, &ld, step + 1, last || stop || epoch_end || every, res, err);
        if (stop) break;
    }
    loader_free(&ld);
    return st;
}

/* Checkpoint buffers when the run saves, resumes or initialises, then --init. */
static HpcStatus ckpt_start(Trainer *t, TrainResult *res, HpcError *err)
{
    const TrainOptions *o = t->opts;
    if (!o->checkpoint_dir && !o->resume_dir && !o->init_dir) return HPC_OK;
    HpcStatus st = trainer_ckpt_init(&t->ck, &t->be, t->spec, t->log, t->total,
                                     higher_is_better(res->metric), err);
    if (!st && o->init_dir && !o->resume_dir) st = trainer_ckpt_init_weights(&t->ck, o->init_dir, err);
    return st;
}

static HpcStatus copy_weights(Trainer *t, float *const *out, HpcError *err)
{
    HpcStatus st = HPC_OK;
    for (int p = 0; p < t->be.pl.n && !st; p++)
        if (out[p]) st = t->be.read_param(&t->be, p, out[p], err);
    return st;
}

static void log_start(Trainer *t, TrainResult *res)
{
    runlog_set_interval(t->log, t->opts->log_every > 0 ? t->opts->log_every : 50);
    runlog_set_higher_is_better(t->log, higher_is_better(res->metric));
    runlog_message(t->log, "%s: %lld parameters, %d values in the graph, backend %s, %s",
                   t->spec->name, (long long)res->params, t->be.g.n, t->be.name,
                   spec_precision_name(t->be.policy));
    char line[1200];
    for (int s = 0; t->opts->task && s < TASK_SPLIT_COUNT; s++)
        if (task_split_line(t->opts->task, (TaskSplit)s, line, sizeof line)) runlog_message(t->log, "%s", line);
}

HpcStatus trainer_run(const ModelSpec *spec, const Dataset *train, const Dataset *eval,
                      const TrainOptions *opts, TrainResult *res, HpcError *err)
{
    Trainer *t = xcalloc(1, sizeof *t);
    memset(res, 0, sizeof *res);
    t->spec = spec;
    t->opts = opts;
    t->total = total_steps(spec, train, opts);
    res->metric = eval_metric_name(spec, opts->task);
    res->best_metric = NAN;
    int64_t L = (spec->train.max_seq_len + 7) / 8 * 8;
    HpcStatus st = train_backend_open(&t->be, opts->device, spec, opts->policy, !opts->no_fuse, t->total,
                                      spec->train.batch_size, L, err);
    if (!st) t->log = runlog_open(opts->jsonl, opts->out, opts->progress_bar, err);
    if (!st && !t->log) st = err->code;
    if (!st) {
        res->params = params_total(&t->be.pl);
        snprintf(res->backend, sizeof res->backend, "%s", t->be.name);
        int64_t every = opts->log_every > 0 ? opts->log_every : 50;
        t->flush_every = t->be.device == TRAIN_DEVICE_CPU ? 1 : every < TRAIN_STAT_RING ? every : TRAIN_STAT_RING;
        log_start(t, res);
        st = ckpt_start(t, res, err);
        if (!st && opts->handle_signals) st = signals_install(err);
        if (!st) st = train_loop(t, train, eval, res, err);
        if (opts->handle_signals) signals_restore();
        if (!st && opts->weights_out) st = copy_weights(t, opts->weights_out, err);
        if (!st && opts->task && opts->predict) st = write_predictions(t, err);
        res->peak_device_bytes = t->be.peak_bytes(&t->be);
    }
    if (t->ck.w) trainer_ckpt_free(&t->ck);
    if (t->log) runlog_close(t->log, res->peak_device_bytes);
    train_backend_close(&t->be);
    free(t);
    return st;
}

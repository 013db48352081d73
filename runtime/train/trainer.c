/* runtime/train/trainer.c — the training loop shared by the backends; see
 * trainer.h.  The backend (train_backend.h) does the steps; this file
 * feeds batches, logs the step records it collects, and evaluates. */
#include "train/trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/loader.h"
#include "dist/collectives.h"
#include "train/best_model.h"
#include "formats/output_check.h"
#include "train/memcheck.h"
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
    int64_t flush_every;                 /* waiting collect after this many unread steps */
    int64_t queued, logged;              /* steps queued / logged so far (1-based counts) */
    int64_t tokens[TRAIN_STAT_RING];     /* by (step - 1) % TRAIN_STAT_RING, until logged */
    int epoch[TRAIN_STAT_RING];
    double host_s[TRAIN_STAT_RING];      /* host time of the step's calls (the cpu's step time) */
    TrainStepStat stats[TRAIN_STAT_RING];
    TrainCkpt ck;                        /* checkpoints; ck.w == NULL when not used */
    BestModel best;                      /* --output; best.w == NULL when not used */
    CheckpointLock lock;                 /* on opts->checkpoint_dir; fd -1 when none */
    TrainOptions rank_opts;              /* opts as this rank uses them (trainer_run) */
    bool lead;                           /* rank 0 (or no coll): prints, logs, writes */
    Collectives nccl;                    /* opts->dist: the NCCL world joined here */
    bool nccl_open;
    bool packed;                         /* the program reads packed batches (docs/packing.md) */
    int64_t micro_batches, slots, padded_slots, real;   /* token slots trained, and what padding would hold */
} Trainer;

/* The next batch, starting the next epoch when one ends. */
static Batch *next_batch(Loader *ld, HpcError *err)
{
    Batch *b = loader_next(ld);
    if (!b) b = loader_next(ld);
    if (!b) hpc_fail(err, HPC_ERR_OOM, "trainer: out of host memory for a batch");
    return b;
}

/* The slots of b, had it been padded (loader.h: B x the longest row rounded up to 8). */
static int64_t padded_slots(const Batch *b, int64_t max_len)
{
    if (!b->seq_spans) return b->B * b->L;
    int64_t m = 1;
    for (int64_t r = 0; r < b->B; r++)
        if (b->seq_spans[2 * r + 1] > m) m = b->seq_spans[2 * r + 1];
    m = (m + 7) / 8 * 8;
    return b->B * (m < max_len ? m : max_len);
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
    loader_set_pack(&ld, t->packed);
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

/* Logs the records of the steps the backend has finished: all queued ones
 * (wait), or, where the backend can tell without waiting (poll), those
 * done so far.  Fails when the loss scaler has given up. */
static HpcStatus flush_steps(Trainer *t, TrainResult *res, bool wait, HpcError *err)
{
    int n = 0;
    if (!wait && !t->be.poll) return HPC_OK;
    HpcStatus st = wait ? t->be.collect(&t->be, t->stats, TRAIN_STAT_RING, &n, err)
                        : t->be.poll(&t->be, t->stats, TRAIN_STAT_RING, &n, err);
    if (st) return st;
    for (int i = 0; i < n; i++) {
        const TrainStepStat *s = &t->stats[i];
        int slot = (int)((s->step - 1) % TRAIN_STAT_RING);
        t->logged = s->step;
        if (s->step == 1) res->first_loss = s->loss;
        res->last_loss = s->loss;
        res->skipped = s->total_skips;
        res->final_scale = s->loss_scale;
        if (s->skipped) {
            runlog_skip(t->log, s->step, s->loss_scale);
            res->last_skipped_step = s->step;
        }
        RunLogStep r = {.step = s->step, .total_steps = t->total, .epoch = t->epoch[slot],
                        .loss = s->loss, .lr = s->lr, .loss_scale = s->loss_scale, .grad_norm = s->grad_norm,
                        .skipped_total = s->total_skips, .tokens = t->tokens[slot],
                        .device_mem_bytes = t->be.peak_bytes(&t->be),
                        .seconds = s->seconds > 0 ? s->seconds : t->host_s[slot]};
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
    return HPC_OK;
}

/* One optimizer step over grad_accum micro-batches (queued, not waited for). */
static HpcStatus train_step(Trainer *t, Loader *ld, int64_t step, HpcError *err)
{
    double t0 = runlog_clock();
    int64_t accum = t->spec->train.grad_accum > 1 ? t->spec->train.grad_accum : 1, tokens = 0;
    for (int64_t m = 0; m < accum; m++) {
        Batch *b = next_batch(ld, err);
        if (!b) return err->code;
        HpcStatus st = t->be.micro(&t->be, b, m, err);
        tokens += real_tokens(b);
        t->micro_batches++;
        t->slots += b->B * b->L;
        t->padded_slots += padded_slots(b, t->spec->train.max_seq_len);
        t->real += real_tokens(b);
        batch_free(b);
        if (st) return st;
    }
    int slot = (int)(step % TRAIN_STAT_RING);
    t->tokens[slot] = tokens;
    t->epoch[slot] = (int)ld->epoch;
    HpcStatus st = t->be.step(&t->be, t->opts->inject_inf_step == step + 1, err);
    t->host_s[slot] = runlog_clock() - t0;
    t->queued = step + 1;
    return st;
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
    HpcError log_err = {0};
    bool log_failed = runlog_status(t->log, &log_err) != HPC_OK;   /* the run log's disk is full */
    HpcStatus st = HPC_OK;
    /* a signal or a full disk on any rank stops every rank here (host
     * buffers: the local world; over NCCL a rank that stops makes the others'
     * next collective fail instead) */
    if (o->coll && strcmp(o->coll->kind, "local") == 0) {
        double stop[2] = {sig, log_failed};
        st = o->coll->allreduce_max_f64(o->coll, stop, 2, err);
        if (st) return st;
        sig = (int)stop[0];
        if (stop[1] && !log_failed)
            hpc_fail(&log_err, HPC_ERR_IO, "rank 0's run log could not be written");
        log_failed = stop[1] != 0;
    }
    if (o->checkpoint_dir && (save || sig || log_failed) && !t->lead) {
        /* the state is gathered by every rank (ZeRO-1 slices); rank 0 writes it */
        TrainState ts = {.spec = t->spec, .pl = &t->be.pl, .policy = t->be.policy, .w = t->ck.w, .m = t->ck.m,
                         .v = t->ck.v};
        st = t->be.state_out(&t->be, &ts, err);
    } else if (o->checkpoint_dir && (save || sig || log_failed)) {
        st = trainer_ckpt_save(&t->ck, o->checkpoint_dir, o->checkpoint_keep, ld, done, res->saved,
                               sizeof res->saved, err);
        if (!st) runlog_message(t->log, "checkpoint: %s", res->saved);
    }
    if (!st && sig)
        st = hpc_fail(err, HPC_ERR_INTERRUPTED, "interrupted by signal %d after step %lld; %s%s%s", sig,
                      (long long)done, res->saved[0] ? "state saved in " : "no --checkpoint-dir given, nothing saved",
                      res->saved, res->saved[0] ? " (continue with --resume)" : "");
    if (!st && log_failed)
        st = hpc_fail(err, HPC_ERR_IO, "%s; training stopped after step %lld%s%s", log_err.msg, (long long)done,
                      res->saved[0] ? ", state saved in " : "", res->saved);
    return st;
}

static HpcStatus train_loop(Trainer *t, const Dataset *train, const Dataset *eval, TrainResult *res,
                            HpcError *err)
{
    const SpecTraining *tr = &t->spec->train;
    const TrainOptions *opts = t->opts;
    Loader ld;
    HpcStatus st = loader_init(&ld, train, tr->batch_size, tr->max_seq_len, tr->seed, true, opts->bucket, err);
    loader_set_pack(&ld, t->packed);
    if (!st && opts->coll) st = loader_set_shard(&ld, opts->coll->rank, opts->coll->world, err);
    if (st) {
        loader_free(&ld);
        return st;
    }
    int64_t start = 0;
    if (opts->resume_dir) st = trainer_ckpt_resume(&t->ck, opts->resume_dir, &ld, &start, err);
    res->resumed_from = res->steps = start;
    t->queued = t->logged = start;
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
        bool wait = last || stop || do_eval || t->queued - t->logged >= t->flush_every;
        if (!st) st = flush_steps(t, res, wait, err);   /* without wait: what the device has finished */
        if (!st && do_eval) {
            st = evaluate(t, eval, &res->eval_metric, &res->eval_loss, err);
            if (!st) runlog_eval(t->log, step + 1, (int)ld.epoch, res->metric, res->eval_metric, res->eval_loss);
            if (!st) note_best(res, step + 1);
            if (!st && t->best.w) st = best_model_offer(&t->best, step + 1, res->eval_metric, NULL, err);
            if (!st && t->ck.w) trainer_ckpt_metric(&t->ck, res->eval_metric);
        }
        bool epoch_end = epochs_done(&ld) > epochs;
        epochs = epochs_done(&ld);
        bool every = opts->checkpoint_every > 0 && (step + 1) % opts->checkpoint_every == 0;
        if (!st) st = step_boundary(t, &ld, step + 1, last || stop || epoch_end || every, res, err);
        if (stop) break;
    }
    loader_free(&ld);
    if (t->micro_batches > 0)
        runlog_message(t->log, "token slots a micro-batch: %.1f for %.1f real tokens (%s; padded batches: %.1f)",
                       (double)t->slots / (double)t->micro_batches, (double)t->real / (double)t->micro_batches,
                       t->packed ? "packed" : "padded", (double)t->padded_slots / (double)t->micro_batches);
    return st;
}

/* Checkpoint buffers when the run saves, resumes or initialises, then --init. */
static HpcStatus ckpt_start(Trainer *t, TrainResult *res, HpcError *err)
{
    const TrainOptions *o = t->opts;
    if (!o->checkpoint_dir && !o->resume_dir && !o->init_dir) return HPC_OK;
    HpcStatus st = trainer_ckpt_init(&t->ck, &t->be, t->spec, t->log, t->total,
                                     higher_is_better(res->metric), err);
    checkpoint_settings_init(&t->ck.settings, t->spec, t->be.policy, t->total);
    for (int i = 0; o->data_settings && i < o->data_settings->n; i++)
        checkpoint_settings_add(&t->ck.settings, o->data_settings->s[i].key, "%s", o->data_settings->s[i].value);
    t->ck.allow_changed_settings = o->allow_changed_settings;
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

/* --output: the best weights (the final ones when nothing was evaluated). */
static HpcStatus write_output(Trainer *t, const TrainResult *res, HpcError *err)
{
    const TrainOptions *o = t->opts;
    HpcStatus st = best_model_take_final(&t->best, res->steps, err);
    if (!st) st = best_model_write(&t->best, o->output_dir, o->output_vocab, o->output_lower_case, err);
    if (st || !t->log) return st;
    if (isnan(t->best.metric))
        runlog_message(t->log, "output: %s (transformers folder), the weights after step %lld", o->output_dir,
                       (long long)t->best.step);
    else
        runlog_message(t->log, "output: %s (transformers folder), the best dev %s %.4f at step %lld", o->output_dir,
                       res->metric, t->best.metric, (long long)t->best.step);
    return HPC_OK;
}

static void log_start(Trainer *t, TrainResult *res)
{
    runlog_set_interval(t->log, t->opts->log_every > 0 ? t->opts->log_every : 50);
    runlog_set_higher_is_better(t->log, higher_is_better(res->metric));
    runlog_message(t->log, "%s: %lld parameters, %d values in the graph, backend %s, %s",
                   t->spec->name, (long long)res->params, t->be.g.n, t->be.name,
                   spec_precision_name(t->be.policy));
    runlog_message(t->log, "sized for batch %lld x sequence %lld%s: the data's longest row has %lld tokens "
                   "(seq_len %lld)", (long long)t->spec->train.batch_size, (long long)res->sized_len,
                   t->packed ? " (packed batches: the most token slots a batch can need)" : "",
                   (long long)res->longest_row, (long long)t->spec->train.max_seq_len);
    char line[1200];
    for (int s = 0; t->opts->task && s < TASK_SPLIT_COUNT; s++)
        if (task_split_line(t->opts->task, (TaskSplit)s, line, sizeof line)) runlog_message(t->log, "%s", line);
}

/* The files the run reads, which no output may be; paths go to names
 * (cap entries of 4200 bytes). */
enum { RUN_INPUTS_MAX = TASK_SPLIT_COUNT + 12 };

static int add_input(OutputInput *in, int n, char (*names)[4200], const char *what, const char *dir,
                     const char *file)
{
    snprintf(names[n], sizeof names[n], "%s/%s", dir, file);
    in[n] = (OutputInput){what, names[n]};
    return n + 1;
}

static int run_inputs(const ModelSpec *spec, const TrainOptions *o, OutputInput *in, char (*names)[4200])
{
    int n = 0;
    in[n++] = (OutputInput){"the model file", spec->source};
    for (int s = 0; o->task && s < TASK_SPLIT_COUNT; s++)
        if (o->task->info[s].present) in[n++] = (OutputInput){"a data file of the task", o->task->info[s].path};
    if (o->task) in[n++] = (OutputInput){"the vocabulary", o->task->vocab_path};
    const char *dirs[] = {o->resume_dir, o->init_dir};
    for (int d = 0; d < 2; d++) {
        char step[4096];
        HpcError ignore = {0};
        if (!dirs[d]) continue;
        const char *folder = d == 0 ? "a file of the --resume folder" : "a file of the --init folder";
        n = add_input(in, n, names, folder, dirs[d], "model.safetensors");
        n = add_input(in, n, names, folder, dirs[d], "config.json");
        if (checkpoint_resolve(dirs[d], step, sizeof step, &ignore)) continue;
        const char *what = d == 0 ? "a file of the checkpoint being resumed" : "a file of the --init checkpoint";
        n = add_input(in, n, names, what, step, "model.safetensors");
        n = add_input(in, n, names, what, step, "optimizer.safetensors");
        n = add_input(in, n, names, what, step, "state.json");
        n = add_input(in, n, names, what, step, CHECKPOINT_MANIFEST);
    }
    HPC_ASSERT(n <= RUN_INPUTS_MAX - 1);   /* one more: --predict adds the log */
    return n;
}

/* Setup checks (trainer.h): nothing is trained before these pass. */
static HpcStatus check_outputs(Trainer *t, HpcError *err)
{
    const TrainOptions *o = t->opts;
    OutputInput in[RUN_INPUTS_MAX];
    char (*names)[4200] = xmalloc(RUN_INPUTS_MAX * sizeof *names);
    int n = run_inputs(t->spec, o, in, names);
    HpcStatus st = output_check_not_input("--log", o->jsonl, in, n, err);
    if (!st && o->task && o->predict) {
        in[n++] = (OutputInput){"the --log file", o->jsonl};
        st = output_check_file("--predict", o->predict, in, n, err);
    }
    free(names);
    /* checkpoints stay out of the task's data folder, which later runs read
     * as it stands (--output refuses any folder that is not a model's) */
    if (!st && o->task && o->checkpoint_dir && output_same_file(o->checkpoint_dir, o->task->data_dir))
        st = hpc_fail(err, HPC_ERR_USAGE, "--checkpoint-dir %s: that is the task's data folder; give the "
                      "checkpoints a folder of their own", o->checkpoint_dir);
    if (!st && o->checkpoint_dir && t->lead) st = checkpoint_lock(o->checkpoint_dir, &t->lock, err);
    return st;
}

/* Batches an epoch of d has at batch size B. */
static int64_t loader_batches_for(const Dataset *d, int64_t B)
{
    return d->n > 0 ? (d->n + B - 1) / B : 1;
}

/* The L to size the backend for (trainer.h, "Sizing"): every dataset a
 * batch may come from, before the other ranks drop eval. */
static int64_t sized_len(const ModelSpec *spec, const Dataset *train, const Dataset *eval, const TrainOptions *o,
                         bool packed, TrainResult *res)
{
    const Dataset *test = o->task && o->predict ? &o->task->test : NULL;
    const Dataset *sets[] = {train, eval, test};
    int64_t longest = 0;
    for (int s = 0; s < 3; s++)
        if (sets[s] && dataset_max_len(sets[s]) > longest) longest = dataset_max_len(sets[s]);
    res->longest_row = longest;
    res->sized_len = (loader_longest_batch_len(sets, 3, spec->train.max_seq_len) + 7) / 8 * 8;
    if (packed) {   /* the most slots a packed batch of this run needs, as batch_size x L (loader.h) */
        const SpecTraining *tr = &spec->train;
        int64_t B = tr->batch_size, slots = 0;
        int64_t epochs = (total_steps(spec, train, o) * tr->grad_accum + loader_batches_for(train, B) - 1) /
                         loader_batches_for(train, B) + 1;
        for (int s = 0; s < 3; s++) {
            Loader ld;
            HpcError ignore = {0};
            if (!sets[s] || loader_init(&ld, sets[s], B, tr->max_seq_len, tr->seed, s == 0, s == 0 && o->bucket,
                                        &ignore))
                continue;
            int64_t m = loader_packed_max_slots(&ld, s == 0 ? epochs : 1);
            if (m > slots) slots = m;
            loader_free(&ld);
        }
        if (slots > 0) res->sized_len = (slots + B - 1) / B;
    }
    return res->sized_len;
}

HpcStatus trainer_run(const ModelSpec *spec, const Dataset *train, const Dataset *eval,
                      const TrainOptions *opts, TrainResult *res, HpcError *err)
{
    Trainer *t = xcalloc(1, sizeof *t);
    memset(res, 0, sizeof *res);
    t->spec = spec;
    t->lead = opts->coll ? opts->coll->rank == 0 : !opts->dist || opts->dist->rank == 0;
    t->rank_opts = *opts;
    t->packed = spec->train.pack || (opts->program && ir_graph_packed(&opts->program->g));
    int64_t L = sized_len(spec, train, eval, opts, t->packed, res);
    if (!t->lead) {   /* the other ranks print, log, evaluate and write nothing */
        t->rank_opts.jsonl = NULL;
        t->rank_opts.out = NULL;
        t->rank_opts.progress_bar = false;
        t->rank_opts.predict = NULL;
        t->rank_opts.output_dir = NULL;
        eval = NULL;
    }
    opts = t->opts = &t->rank_opts;
    t->total = total_steps(spec, train, opts);
    res->metric = eval_metric_name(spec, opts->task);
    res->best_metric = NAN;
    t->lock.fd = -1;
    bool ckpt_copy = opts->checkpoint_dir || opts->resume_dir || opts->init_dir;
    HpcStatus st = check_outputs(t, err);
    /* a packed program's kernels are sized for the sequences it was lowered
     * for (program/ir.h, IrInputAttr.span_max): refuse a longer max_seq_len
     * now rather than at the first long batch */
    int64_t span_max = opts->program ? ir_span_max(&opts->program->g) : 0;
    if (!st && span_max > 0 && spec->train.max_seq_len > span_max)
        st = hpc_fail(err, HPC_ERR_USAGE, "trainer: this packed program was compiled for sequences of at most %lld "
                      "tokens (the model's seq_len), and this run keeps up to %lld; compile it again from a model "
                      "with seq_len = %lld, or run it with --seq-len %lld or less", (long long)span_max,
                      (long long)spec->train.max_seq_len, (long long)spec->train.max_seq_len, (long long)span_max);
    if (!st && !opts->no_memory_check)
        st = memcheck_run(spec, opts->program, opts->policy, !opts->no_fuse, opts->device, spec->train.batch_size, L, ckpt_copy, err);
    /* the log before the backend: a log that cannot be written fails before any compiling */
    if (!st) t->log = opts->resume_dir ? runlog_open_append(opts->jsonl, opts->out, opts->progress_bar, err)
                                       : runlog_open(opts->jsonl, opts->out, opts->progress_bar, err);
    if (!st && !t->log) st = err->code;
    if (!st) st = opts->program
                      ? train_backend_open_program(&t->be, opts->device, opts->program, t->total,
                                                   spec->train.batch_size, L, err)
                      : train_backend_open(&t->be, opts->device, spec, opts->policy, !opts->no_fuse, t->total,
                                           spec->train.batch_size, L, err);
    if (!st && opts->dist && opts->dist->world > 1 && !opts->coll) {   /* hpc run --gpus N: NCCL */
        if (t->be.device != TRAIN_DEVICE_CUDA)
            st = hpc_fail(err, HPC_ERR_USAGE, "trainer: %d ranks (WORLD_SIZE) need the cuda backend; this "
                          "run has %s", opts->dist->world, t->be.name);
        if (!st) st = dist_join_nccl(opts->dist, t->be.cuda_stream, &t->nccl, err);
        t->nccl_open = !st;
        if (!st) t->rank_opts.coll = &t->nccl;
    }
    if (!st && opts->coll && !t->be.set_dist)
        st = hpc_fail(err, HPC_ERR_USAGE, "trainer: the %s backend cannot train data parallel", t->be.name);
    if (!st && opts->coll) st = t->be.set_dist(&t->be, opts->coll, opts->zero1, err);
    if (!st) {
        res->params = params_total(&t->be.pl);
        snprintf(res->backend, sizeof res->backend, "%s", t->be.name);
        /* cpu: every step is done when step() returns; cuda: poll reports
         * finished steps as they come, the waiting collect only keeps the ring
         * from filling up */
        t->flush_every = t->be.device == TRAIN_DEVICE_CPU ? 1 : TRAIN_STAT_RING / 2;
        log_start(t, res);
        st = ckpt_start(t, res, err);
        if (!st && opts->output_dir) st = best_model_init(&t->best, &t->be, higher_is_better(res->metric), err);
        if (!st && opts->handle_signals) st = signals_install(err);
        if (!st) st = train_loop(t, train, eval, res, err);
        if (opts->handle_signals) signals_restore();
        if (!st && opts->weights_out) st = copy_weights(t, opts->weights_out, err);
        if (!st && opts->task && opts->predict) st = write_predictions(t, err);
        if (!st && opts->output_dir) st = write_output(t, res, err);
        res->peak_device_bytes = t->be.peak_bytes(&t->be);
    }
    if (t->ck.w) trainer_ckpt_free(&t->ck);
    if (t->best.w) best_model_free(&t->best);
    HpcError log_err = {0};
    if (st) runlog_set_failed(t->log);
    if (t->log && runlog_close(t->log, res->peak_device_bytes, &log_err) && !st) {
        *err = log_err;   /* the run worked but its log is incomplete: not a success */
        st = log_err.code;
    }
    if (st && opts->coll) opts->coll->abort(opts->coll, err->msg);   /* the others stop, not hang */
    if (t->nccl_open) t->nccl.close(&t->nccl);
    checkpoint_unlock(&t->lock);
    train_backend_close(&t->be);
    free(t);
    return st;
}

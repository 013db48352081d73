/* runtime/train/trainer_ckpt.c — see trainer_ckpt.h. */
#include "train/trainer_ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train/checkpoint.h"
#include "formats/hf_init.h"
#include "train/optim.h"

HpcStatus trainer_ckpt_init(TrainCkpt *c, TrainBackend *be, const ModelSpec *spec, RunLog *log, int64_t total,
                            bool higher_is_better, HpcError *err)
{
    memset(c, 0, sizeof *c);
    c->be = be;
    c->spec = spec;
    c->log = log;
    c->total = total;
    c->higher_is_better = higher_is_better;
    if (!be->state_out || !be->state_in)
        return hpc_fail(err, HPC_ERR_USAGE, "trainer: the %s backend cannot save or restore training state yet; "
                        "use --device cpu for --checkpoint-dir, --resume and --init", be->name);
    OptimConfig oc;
    optim_config_from_spec(&oc, &spec->train);
    const ParamList *pl = &be->pl;
    c->w = xcalloc((size_t)pl->n + 1, sizeof *c->w);
    c->m = xcalloc((size_t)pl->n + 1, sizeof *c->m);
    c->v = xcalloc((size_t)pl->n + 1, sizeof *c->v);
    for (int p = 0; p < pl->n; p++) {
        if (pl->p[p].tied_to >= 0) continue;
        size_t n = (size_t)params_numel(&pl->p[p]);
        bool trains = be->g.param_grad[p] >= 0;   /* has optimizer state */
        c->w[p] = calloc(n, sizeof(float));
        if (trains && optim_needs_m(&oc)) c->m[p] = calloc(n, sizeof(float));
        if (trains && optim_needs_v(&oc)) c->v[p] = calloc(n, sizeof(float));
        if (!c->w[p] || (trains && optim_needs_m(&oc) && !c->m[p]) || (trains && optim_needs_v(&oc) && !c->v[p]))
            return hpc_fail(err, HPC_ERR_OOM, "trainer: out of host memory for the checkpoint copy of %s",
                            pl->p[p].name);
    }
    return HPC_OK;
}

void trainer_ckpt_free(TrainCkpt *c)
{
    for (int p = 0; c->w && p < c->be->pl.n; p++) {
        free(c->w[p]);
        free(c->m[p]);
        free(c->v[p]);
    }
    free(c->w);
    free(c->m);
    free(c->v);
    memset(c, 0, sizeof *c);
}

void trainer_ckpt_metric(TrainCkpt *c, double metric)
{
    if (!c->has_best || (c->higher_is_better ? metric > c->best : metric < c->best)) c->best = metric;
    c->has_best = true;
}

static TrainState state_of(TrainCkpt *c)
{
    return (TrainState){.spec = c->spec, .pl = &c->be->pl, .policy = c->be->policy, .w = c->w, .m = c->m,
                        .v = c->v, .total_steps = c->total, .seed = c->spec->train.seed,
                        .settings = c->settings.n ? &c->settings : NULL,
                        .allow_changed_settings = c->allow_changed_settings};
}

HpcStatus trainer_ckpt_save(TrainCkpt *c, const char *dir, int keep, const Loader *ld, int64_t step, char *saved,
                            size_t cap, HpcError *err)
{
    TrainState ts = state_of(c);
    HpcStatus st = c->be->state_out(c->be, &ts, err);
    if (st) return st;
    ts.step = step;
    ts.loader_epoch = ld->epoch;
    ts.loader_cursor = ld->cursor;
    ts.has_best = c->has_best;
    ts.best_metric = c->best;
    ts.keep = keep;
    st = checkpoint_save(dir, &ts, err);
    if (!st) snprintf(saved, cap, "%s/step-%08lld", dir, (long long)step);
    return st;
}

HpcStatus trainer_ckpt_resume(TrainCkpt *c, const char *dir, Loader *ld, int64_t *step, HpcError *err)
{
    TrainState ts = state_of(c);
    ls_config_from_spec(&ts.ls.cfg, &c->spec->train);
    HpcStatus st = checkpoint_load(dir, &ts, err);
    if (st) return st;
    if (ts.step > c->total)
        return hpc_fail(err, HPC_ERR_INPUT, "the checkpoint in %s is at step %lld, beyond this run's %lld steps; "
                        "resume with --steps %lld or more", dir, (long long)ts.step, (long long)c->total,
                        (long long)ts.step);
    if (ts.loader_cursor > ld->data->n)
        return hpc_fail(err, HPC_ERR_INPUT, "the checkpoint in %s stopped at row %lld of the training data, which "
                        "has %lld rows now; resume with the data it was trained on", dir,
                        (long long)ts.loader_cursor, (long long)ld->data->n);
    if (ts.changed[0])
        runlog_message(c->log, "resuming with changed settings (--allow-changed-settings): %s", ts.changed);
    st = c->be->state_in(c->be, &ts, err);
    if (!st) st = loader_seek(ld, ts.loader_epoch, ts.loader_cursor, err);
    if (st) return st;
    c->has_best = ts.has_best;
    c->best = ts.best_metric;
    *step = ts.step;
    runlog_message(c->log, "resumed from %s at step %lld of %lld (epoch %lld, row %lld, loss scale %g)", dir,
                   (long long)ts.step, (long long)c->total, (long long)ts.loader_epoch,
                   (long long)ts.loader_cursor, ts.ls.scale);
    return HPC_OK;
}

static bool is_file(const char *dir, const char *name)
{
    char path[4200];
    struct stat s;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &s) == 0 && S_ISREG(s.st_mode);
}

/* hf_init's findings, one log line each. */
static void log_report(TrainCkpt *c, const HfInitReport *rep)
{
    for (int i = 0; i < rep->n_lines; i++) runlog_message(c->log, "init: %s", rep->lines[i]);
    int listed = rep->n_new + rep->n_missing + rep->n_misshapen + rep->n_unused;
    if (listed > rep->n_lines) runlog_message(c->log, "init: ... %d more", listed - rep->n_lines);
    runlog_message(c->log, "init: %d parameters from %s (%s names), %d new, %d unused tensors", rep->n_loaded,
                   rep->path, rep->model_type, rep->n_new, rep->n_unused);
}

HpcStatus trainer_ckpt_init_weights(TrainCkpt *c, const char *dir, HpcError *err)
{
    TrainState ts = state_of(c);
    HpcStatus st = c->be->state_out(c->be, &ts, err);   /* the fresh state: initializers, zero moments */
    if (st) return st;
    if (is_file(dir, "model.safetensors")) {
        HfInitReport *rep = xcalloc(1, sizeof *rep);
        st = hf_init_load(dir, &c->be->pl, c->w, rep, err);
        log_report(c, rep);
        free(rep);
    } else {
        TrainState w = state_of(c);
        w.weights_only = true;
        st = checkpoint_load(dir, &w, err);
        if (!st) runlog_message(c->log, "init: weights from the hpc checkpoint %s (step %lld)", dir, (long long)w.step);
    }
    if (st) return st;
    ts.step = 0;
    return c->be->state_in(c->be, &ts, err);
}

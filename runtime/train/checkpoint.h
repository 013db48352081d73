/* runtime/train/checkpoint.h — training checkpoints: save, load, resume exactly.
 *
 * A checkpoint holds everything a run needs to continue as if it had never
 * stopped: the f32 master weights, the optimizer's moments m and v, the
 * optimizer's applied-step count (bias correction), the loss scaler, the
 * data loader's (epoch, cursor), the micro-step counter (the dropout step),
 * the optimizer-step count, the total steps, the seed and the best
 * evaluation metric so far.  The trainer owns every buffer; a TrainState
 * only points at them (checkpoint_save reads them, checkpoint_load writes
 * them).
 *
 * Layout of a checkpoint root DIR (docs/resume.md):
 *   DIR/step-00000120/model.safetensors      f32 masters, hpc's parameter names
 *   DIR/step-00000120/optimizer.safetensors  "exp_avg.NAME" (m), "exp_avg_sq.NAME" (v)
 *   DIR/step-00000120/state.json             everything else, the .model text and
 *                                            the run's training settings
 *   DIR/step-00000120/SHA256SUMS             the SHA-256 of the three files above
 *                                            (`sha256sum -c` format), written last
 *   DIR/latest                               "step-00000120\n", written last
 *   DIR/.lock                                held (flock) by the run writing DIR
 * checkpoint_save writes the four files into a fresh hidden directory
 * (DIR/.step-N.tmp-XXXXXX, each file fsynced through runtime/atomic_file),
 * renames that directory to step-N (swapping atomically with an existing
 * step-N), syncs DIR, and only then replaces `latest` atomically.  A
 * process killed at any point (SIGKILL, power loss) therefore leaves
 * `latest` naming a complete step directory, the previous one or the new
 * one.  Afterwards it keeps the `keep` newest step directories (the one
 * just written always among them) and removes the others, and removes
 * hidden leftovers of killed writers.  One writer per DIR at a time:
 * checkpoint_lock takes DIR/.lock for the whole run (flock, so a killed
 * holder's lock goes with its process; the file only tells the pid).
 *
 * checkpoint_load accepts DIR (follows `latest`) or one step directory.  It
 * first checks every file against SHA256SUMS (a changed byte is refused
 * naming the file), then every counter of state.json against its range
 * (step <= total steps, applied steps <= step, a finite positive loss
 * scale, ...), then that the checkpoint was written by the same model: the
 * architecture (checkpoint_fingerprint) must match, and every
 * storage-owning parameter must be there with the same shape; otherwise
 * HPC_ERR_INPUT naming both models or the tensor.  A checkpoint written
 * with another optimizer kind is refused too (its m/v mean something else).
 * Last, the training settings (CheckpointSettings: learning rate and
 * schedule, batch, sequence length, task, dropout, seed, precision policy,
 * optimizer and loss-scale numbers, total steps) are compared with the
 * run's: any difference is HPC_ERR_INPUT listing each "key old -> new",
 * unless allow_changed_settings, which accepts them and lists them in
 * ts->changed for the run log.
 *
 * The TrainState's scalar fields are values: fill them before
 * checkpoint_save, read them after checkpoint_load.  Tensor pointers:
 * w[i], m[i], v[i] for parameter i of pl, (numel) f32 each; NULL entries
 * are skipped (tied parameters, and m/v of parameters without optimizer
 * state).  With weights_only, checkpoint_load reads the weights and the
 * scalars and ignores m and v (export, --init from a checkpoint).  The
 * LossScaler's cfg is not stored (it comes from the spec): load keeps
 * ts->ls.cfg and fills scale, growth_tracker and the skip counts.
 *
 * Usage (in the trainer):
 *   TrainState ts = {.spec = spec, .pl = &pl, .w = masters, .m = m, .v = v};
 *   ts.step = step; ts.ls = scaler; ...
 *   if (checkpoint_save("runs/a", &ts, &err)) return err.code;
 *   ...
 *   if (checkpoint_load("runs/a", &ts, &err)) return err.code;   // then loader_seek etc.
 */
#ifndef HPC_RUNTIME_CHECKPOINT_H
#define HPC_RUNTIME_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"
#include "train/lossscale.h"
#include "train/optim.h"
#include "program/params.h"
#include "program/spec.h"

#define CHECKPOINT_FORMAT "hpc-checkpoint"
#define CHECKPOINT_VERSION 2       /* 2: SHA256SUMS and the settings */
#define CHECKPOINT_KEEP_DEFAULT 2   /* step directories kept when keep is 0 */
#define CHECKPOINT_MANIFEST "SHA256SUMS"
#define CHECKPOINT_SETTINGS_MAX 48

/* One training setting as text ("lr" = "0.0001"); numbers are written so
 * that equal values give equal text. */
typedef struct {
    char key[32];
    char value[128];
} CheckpointSetting;

typedef struct {
    int n;
    CheckpointSetting s[CHECKPOINT_SETTINGS_MAX];
} CheckpointSettings;

/* The settings in spec->train, the dropout rates, the policy and the
 * total steps; add the run's data settings (task, ...) with
 * checkpoint_settings_add. */
void checkpoint_settings_init(CheckpointSettings *cs, const ModelSpec *spec, SpecPrecision policy,
                              int64_t total_steps);
/* Adds (or replaces) key; value is printf-formatted. */
void checkpoint_settings_add(CheckpointSettings *cs, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The value of key, or NULL. */
const char *checkpoint_settings_get(const CheckpointSettings *cs, const char *key);

typedef struct TrainState {
    /* The model: identity on load, the .model text written into state.json. */
    const ModelSpec *spec;
    const ParamList *pl;
    SpecPrecision policy;   /* the run's precision policy (recorded, checked on load) */
    /* (pl->n) arrays of (numel) f32 buffers; see the contract above. */
    float *const *w;
    float *const *m;
    float *const *v;
    /* Scalars. */
    OptimState opt;         /* applied optimizer steps (Adam's t) */
    LossScaler ls;          /* scale, growth tracker, skip counts (config too) */
    int64_t loader_epoch;   /* Loader.epoch, Loader.cursor after the last batch used */
    int64_t loader_cursor;
    int64_t micro_step;     /* micro-batches run so far: the dropout step of the next one */
    int64_t step;           /* optimizer steps taken (applied + skipped) */
    int64_t total_steps;    /* the run's planned total */
    uint64_t seed;
    bool has_best;          /* best_metric is meaningful */
    double best_metric;
    int keep;               /* save: step directories to keep (0 = CHECKPOINT_KEEP_DEFAULT) */
    bool weights_only;      /* load: only the weights (m, v unused; policy,
                               optimizer and settings not checked; scalars still read) */
    /* save: recorded; load: compared.  NULL: checkpoint_settings_init of
     * spec, policy and total_steps. */
    const CheckpointSettings *settings;
    bool allow_changed_settings; /* load: accept other settings, listing them in changed */
    char changed[1024];     /* load: "lr 0.0001 -> 0.0002, ..." or "" */
} TrainState;

/* DIR/.lock, held from checkpoint_lock to checkpoint_unlock. */
typedef struct {
    int fd;                 /* -1 when not held */
} CheckpointLock;

/* Writes DIR/step-N (N = ts->step) and points DIR/latest at it; creates DIR
 * (and its parents) when missing. */
HpcStatus checkpoint_save(const char *dir, const TrainState *ts, HpcError *err);

/* Reads the checkpoint at dir (a root with `latest`, or a step directory)
 * into ts's buffers and scalars, after the identity checks above.  ts->spec,
 * ts->pl and the buffer arrays must be set.  Nothing but ts's buffers is
 * written, and on failure the buffers may be partly overwritten. */
HpcStatus checkpoint_load(const char *dir, TrainState *ts, HpcError *err);

/* The step directory dir stands for: dir itself when it holds state.json,
 * else dir/<contents of dir/latest>. */
HpcStatus checkpoint_resolve(const char *dir, char *out, size_t cap, HpcError *err);

/* Creates dir (with parents) when missing, checks that files can be
 * created in it and takes its lock: HPC_ERR_IO when it is not writable,
 * HPC_ERR_USAGE naming the pid when another run holds it. */
HpcStatus checkpoint_lock(const char *dir, CheckpointLock *lk, HpcError *err);
void checkpoint_unlock(CheckpointLock *lk);

/* The ModelSpec saved in the checkpoint (its .model text, re-read by the
 * front end: checkpoint_spec.c) and the precision policy of the run that
 * wrote it. */
HpcStatus checkpoint_read_spec(const char *dir, ModelSpec *spec, SpecPrecision *policy, HpcError *err);
/* What checkpoint_read_spec parses, after the files' checks: the .model
 * text (malloc'd; NULL when state.json has none), the policy name ("" when
 * none) and where the text is, for diagnostics. */
HpcStatus checkpoint_read_model_text(const char *dir, char **text, char *policy, size_t policy_cap, char *where,
                                     size_t where_cap, HpcError *err);

/* One line describing what shapes the model's parameters and function
 * ("encoder vocab 64 pos 64 types 2 hidden 32 ... head classifier 2"),
 * used as the model identity.  The training section is not part of it. */
void checkpoint_fingerprint(const ModelSpec *spec, char *out, size_t cap);

#endif

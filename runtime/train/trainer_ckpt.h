/* runtime/train/trainer_ckpt.h — the trainer's side of checkpoints: host copies
 * of the backend's state, save, resume, and --init.
 *
 * The trainer (runtime/train/trainer.c) calls these at step boundaries; the data
 * moves through TrainBackend.state_out/state_in (train_backend.h) into
 * host buffers that a TrainState points at (runtime/train/checkpoint.h):
 *   save    state_out -> TrainState (+ loader position, step, best metric)
 *           -> checkpoint_save
 *   resume  checkpoint_load -> TrainState -> state_in, loader_seek; the run
 *           must have the checkpoint's settings (c->settings: total steps,
 *           seed, lr, batch, ...; else HPC_ERR_INPUT naming each, unless
 *           allow_changed_settings, which logs them), its step must not be
 *           beyond the run's total and its loader row inside the data
 *   init    weights from a Hugging Face folder (runtime/formats/hf_init.h) or an
 *           hpc checkpoint, the rest of the state untouched
 *
 * Ownership: TrainCkpt owns its host buffers (one set of w, m, v, f32, the
 * model's size); trainer_ckpt_free releases them.  The backend, the spec
 * and the log are borrowed.
 */
#ifndef HPC_RUNTIME_TRAINER_CKPT_H
#define HPC_RUNTIME_TRAINER_CKPT_H

#include <stdbool.h>
#include <stdint.h>

#include "util/error.h"
#include "data/loader.h"
#include "report/runlog.h"
#include "train/checkpoint.h"
#include "train/train_backend.h"

typedef struct {
    TrainBackend *be;        /* borrowed */
    const ModelSpec *spec;   /* borrowed */
    RunLog *log;             /* borrowed; messages go here */
    int64_t total;           /* the run's total steps */
    float **w, **m, **v;     /* (pl.n) host (numel) f32 buffers or NULL */
    bool has_best;           /* best evaluation metric so far */
    double best;
    bool higher_is_better;
    CheckpointSettings settings; /* recorded on save, compared on resume (set by the trainer) */
    bool allow_changed_settings;
} TrainCkpt;

/* Allocates the host buffers; HPC_ERR_USAGE when the backend cannot
 * checkpoint, HPC_ERR_OOM. */
HpcStatus trainer_ckpt_init(TrainCkpt *c, TrainBackend *be, const ModelSpec *spec, RunLog *log, int64_t total,
                            bool higher_is_better, HpcError *err);
void trainer_ckpt_free(TrainCkpt *c);

/* Records an evaluation result for best_metric. */
void trainer_ckpt_metric(TrainCkpt *c, double metric);

/* Saves the state after `step` steps; the step directory goes to saved. */
HpcStatus trainer_ckpt_save(TrainCkpt *c, const char *dir, int keep, const Loader *ld, int64_t step, char *saved,
                            size_t cap, HpcError *err);

/* Restores the state saved in dir; *step = the steps already taken. */
HpcStatus trainer_ckpt_resume(TrainCkpt *c, const char *dir, Loader *ld, int64_t *step, HpcError *err);

/* Replaces the initial weights by those in dir (a HF folder with
 * model.safetensors, or an hpc checkpoint); lists what it found in the log. */
HpcStatus trainer_ckpt_init_weights(TrainCkpt *c, const char *dir, HpcError *err);

#endif

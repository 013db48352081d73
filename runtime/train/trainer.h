/* runtime/train/trainer.h — the training loop, shared by the cpu and cuda
 * backends (runtime/train/train_backend.h).
 *
 * trainer_run builds the model (compiler/pipeline.h: lower, autodiff,
 * precision, fuse), initialises the parameters like BERT (runtime/train/init.h, seeded
 * by spec->train.seed), opens the backend TrainOptions.device asks for
 * (auto: the GPU when one is usable, else the cpu; the first log line says
 * which and why) and trains on `train` for the requested number of
 * optimizer steps:
 *   per step, grad_accum micro-batches from the loader (runtime/data/loader.h,
 *   seeded shuffle, batches padded to a multiple of 8): forward, backward
 *   with d(loss) = loss scale, gradients averaged over the micro-batches;
 *   then the optimizer step (runtime/train/optim.h semantics) with the learning
 *   rate from the schedule at the applied-step count (runtime/train/schedule.h)
 *   and the loss scaler's update (runtime/train/lossscale.h; a skipped step
 *   changes nothing and does not advance the schedule).
 * On the cpu the precision pass's f32 executor rounds every low-precision
 * value, so a run shows what mixed precision does to training; on the GPU
 * the values are stored in 16 bits.  Dropout uses seed spec->train.seed
 * and the micro-step counter as step on both backends.
 * The GPU backend never waits for the device inside a step: after each
 * step the loop asks which steps the device has finished (TrainBackend.poll,
 * no waiting) and logs their records (loss, lr, scale, skips, the step's
 * device time), so progress, rate and ETA describe finished work; it waits
 * for all queued steps only at evaluations, checkpoints, the end, and when
 * TRAIN_STAT_RING / 2 steps are unread.  A give-up of the loss scaler
 * (HPC_ERR_NUMERIC) is seen when its step's record is read.
 * Evaluation (forward only, dropout off) runs on `eval` every eval_every
 * steps and at the end (with a GLUE task and no eval_every: at every
 * epoch's end): the task's metrics (runtime/data/tasks.h, e.g. MCC for CoLA),
 * else accuracy for classification heads, the mean loss (MSE) for
 * regression, the mean loss for LM heads; the best value is kept.  Progress goes through
 * runtime/report/runlog.h.
 *
 * Checkpoints (runtime/train/checkpoint.h, docs/resume.md): with checkpoint_dir
 * the trainer saves the whole training state every checkpoint_every steps,
 * at the end of every epoch, at the end of the run, and when a SIGINT or
 * SIGTERM arrived (handle_signals; runtime/train/signals.h: checked at step
 * boundaries, then HPC_ERR_INTERRUPTED).  resume_dir continues such a run:
 * weights, m, v, the optimizer's step count, the loss scaler, the micro-step
 * counter (the dropout step) and the loader's (epoch, cursor) are restored,
 * so the steps that follow are those of an uninterrupted run (bitwise on
 * the cpu backend).  init_dir starts the weights from a Hugging Face folder
 * (runtime/formats/hf_init.h: missing, mis-shaped and unused tensors are listed,
 * new head parameters keep their initializer) or from an hpc checkpoint.
 *
 * With output_dir the weights of the best evaluation so far are copied to
 * the host after each evaluation that improves on the others, and written
 * at the end as a folder transformers loads (runtime/train/best_model.h).
 * Before any work (setup checks): outputs that are inputs are refused
 * (runtime/formats/output_check.h: --predict and --log against the model
 * file, the task's files, the vocabulary and each other), the folders of
 * --predict must take files, --checkpoint-dir may not be the task's data
 * folder, the checkpoint directory is created, probed and
 * locked (checkpoint_lock; HPC_ERR_USAGE when another run holds it), and
 * the memory the run needs is compared with what is available
 * (runtime/train/memcheck.h; HPC_ERR_OOM, unless no_memory_check).  The
 * JSONL log is appended to on a resume.  A run log that cannot be written
 * (full disk) stops the run at the next step boundary, after a save when
 * checkpoint_dir is set, with HPC_ERR_IO.
 *
 * Data parallel (docs/distributed.md): with coll set, this call is one
 * rank of coll's world, and every rank calls trainer_run with the same spec,
 * data and options.  Each rank's loader returns its rows of every global
 * batch (loader_set_shard; spec batch_size is the global batch), the
 * backend averages gradients and agrees found_inf (set_dist; zero1 shards
 * the optimizer state), and rank 0 alone prints, writes the JSONL log, the
 * checkpoints (the whole state, gathered), --predict and --output, and
 * evaluates; the other ranks only take part in the collectives.  A signal
 * or a full log disk on any rank stops all at the same step boundary; a
 * rank that fails aborts the others' collectives with its message.
 * Instead of coll, dist (world > 1, from RANK/WORLD_SIZE: `hpc run --gpus`)
 * makes the trainer join an NCCL world itself once the cuda backend is open
 * on GPU LOCAL_RANK (dist_join_nccl on the backend's stream).
 *
 * Test hooks: inject_inf_step = k > 0 writes +inf into one gradient element
 * before the optimizer step k (1-based), which must then be skipped;
 * stop_after = k > 0 ends the run after step k as an interruption would
 * (saving when checkpoint_dir is set) but returns HPC_OK.
 *
 * Sizing: the backend (memory plan and arena on the GPU, value buffers on
 * the cpu) and the memory check are sized for the longest batch the data
 * can make, not for the model's seq_len (TrainResult.sized_len; the
 * start-up summary prints it): CoLA's rows stop at 47 tokens, so a run
 * with seq_len 128 reserves for 48.  A packed program (docs/packing.md) is
 * sized for batch x ceil(S / batch), S the most token slots any batch of
 * the run has (loader_packed_max_slots over the run's epochs and the eval
 * sets), and its loaders pack; the log reports the slots a micro-batch
 * trained against what padded batches would hold.
 *
 * Everything the trainer allocates is freed before it returns.
 */
#ifndef HPC_RUNTIME_TRAINER_H
#define HPC_RUNTIME_TRAINER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "data/dataset.h"
#include "train/checkpoint.h"
#include "util/error.h"
#include "program/spec.h"
#include "data/tasks.h"
#include "train/train_backend.h"
#include "dist/rendezvous.h"

typedef struct {
    int64_t steps;        /* optimizer steps; 0 = spec->train.steps, else epochs over train */
    int64_t eval_every;   /* evaluate every N steps (0 = only at the end) */
    int64_t log_every;    /* plain log line interval (runlog_set_interval) */
    const char *jsonl;    /* JSONL log path, NULL for none */
    FILE *out;            /* console, NULL for silent */
    bool progress_bar;
    SpecPrecision policy; /* PREC_FP16/PREC_BF16: emulate mixed precision (the
                             precision pass's graph, values rounded to 16 bits);
                             PREC_FP32 or PREC_DEFAULT: all f32 */
    TrainDevice device;   /* TRAIN_DEVICE_CPU (the zero value), _CUDA or _AUTO */
    int64_t inject_inf_step; /* test hook (above); 0 = none */
    bool no_fuse;         /* skip the fuse pass (the unfused graph) */
    const StepProgram *program; /* if set: train this compiled program (its spec must be
                                   the spec passed; policy and no_fuse are its own) */
    float *const *weights_out; /* if not NULL: (ParamList order) host buffers that
                             receive the final f32 weights; NULL entries skipped */
    const char *checkpoint_dir; /* save checkpoints here; NULL = none */
    int64_t checkpoint_every;   /* also every N steps (0: epoch ends, signals, the end) */
    int checkpoint_keep;        /* step directories kept (0 = CHECKPOINT_KEEP_DEFAULT) */
    const char *resume_dir;     /* continue the run saved here (root or step-N) */
    const char *init_dir;       /* initial weights: HF folder or hpc checkpoint */
    int64_t stop_after;         /* test hook (above); 0 = none */
    bool handle_signals;        /* SIGINT/SIGTERM: save and stop at the next step boundary */
    const TaskData *task; /* a GLUE task (runtime/data/tasks.h): eval scores the task's
                             main metric (task_evaluate), and with eval_every 0
                             runs at the end of every epoch; NULL: synthetic data */
    const char *predict;  /* with task: after training, GLUE predictions for
                             task->test go to this file (runtime/train/predict.h) */
    const char *output_dir;   /* the best model by dev metric (the final one without
                             evaluations) as a transformers folder
                             (runtime/train/best_model.h); NULL = none */
    const char *output_vocab; /* copied into output_dir as vocab.txt; NULL = none */
    bool output_lower_case;   /* tokenizer_config.json's do_lower_case there */
    const CheckpointSettings *data_settings; /* the data's settings (task, ...), recorded
                             in checkpoints with the model's; NULL for none */
    bool allow_changed_settings; /* resume: accept other settings (listed in the log) */
    bool no_memory_check; /* skip runtime/train/memcheck.h */
    struct Collectives *coll; /* data parallel: this rank's handle (borrowed); NULL = one process */
    bool zero1;           /* with coll: ZeRO-1 sharded optimizer state */
    const DistEnv *dist;  /* world > 1: join an NCCL world after opening the cuda backend; NULL = none */
    bool bucket;          /* training batches from length buckets (runtime/data/loader.h):
                             rows of similar length share a batch, less padding */
} TrainOptions;

typedef struct {
    int64_t steps;        /* optimizer steps taken (applied + skipped) */
    int64_t skipped;      /* steps skipped for non-finite gradients */
    int64_t params;       /* parameter elements (tied counted once) */
    double first_loss;    /* mean loss of the first step */
    double last_loss;     /* mean loss of the last step */
    const char *metric;   /* "accuracy", "mse" or "loss"; with a task its main
                             metric ("mcc", "f1", "pearson", ...) */
    double eval_metric;   /* final evaluation on `eval` */
    double eval_loss;
    double best_metric;   /* best dev metric over the evaluations (higher is better
                             except for mse/loss); NAN when none ran */
    int64_t best_step;    /* step of best_metric, 0 when none */
    double final_scale;   /* the loss scale after the last step */
    int64_t last_skipped_step; /* 1-based, 0 when none was skipped */
    double peak_device_bytes; /* GPU: peak of the executor's memory; 0 on the cpu */
    char backend[160];    /* TrainBackend.name */
    int64_t resumed_from; /* step the run continued after (resume_dir), else 0 */
    char saved[4200];     /* the last checkpoint written, "" if none */
    int64_t sized_len;    /* the L the backend and the memory check were sized for: the
                             longest batch the data can make (train, eval and, with
                             predict, the task's test rows; loader_longest_batch_len)
                             rounded up to 8, so at most the model's seq_len rounded up */
    int64_t longest_row;  /* the longest row of those datasets, in tokens */
} TrainResult;

/* eval may be NULL (no evaluation).  Fails with the status of the failing
 * stage (HPC_ERR_INPUT for a dataset that does not fit the model,
 * HPC_ERR_NUMERIC when the loss scaler gives up, HPC_ERR_OOM, ...). */
HpcStatus trainer_run(const ModelSpec *spec, const Dataset *train, const Dataset *eval,
                      const TrainOptions *opts, TrainResult *res, HpcError *err);

#endif

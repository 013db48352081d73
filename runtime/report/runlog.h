/* runtime/report/runlog.h — what a training run tells the user and writes down.
 *
 * Three outputs, all optional:
 *   - a progress bar on a terminal, redrawn in place with \r:
 *       step 120/2000 [=====>      ] 6%  14.2 it/s  ETA 2m12s  loss 0.5312
 *       lr 1.8e-05  scale 65536  skipped 0  mem 3.1 GiB
 *     (messages, evals and skips print on their own line above the bar);
 *   - plain log lines every `every` steps when `out` is not a terminal
 *     (progress_bar = false), so CI logs and `tee` stay readable;
 *   - a JSONL file: one JSON object per line and per event, with "event"
 *     = "start" | "step" | "skip" | "eval" | "message" | "summary"; the
 *     fields are listed in docs/data.md and read back by `hpc plot`.
 * Rate, ETA and the training time come from RunLogStep.seconds, each
 * step's own duration as the backend measured it (on the GPU: device
 * events, so finished work, never the rate at which steps were queued);
 * the rate shown is 1 / (an exponential average of the step times, weight
 * RUNLOG_RATE_ALPHA), leaving out the first step (start-up).  A step with
 * seconds = 0 is timed by the host clock since the previous runlog_step.
 * runlog_close prints the summary block:
 *     done: 804 steps (0 skipped) in 2.4s of training, 335.00 steps/s, 41230 tokens/s (whole run 9.8s)
 *     peak device memory 3.1 GiB
 *     best dev mcc 0.5523 at step 536
 * (training time = the sum of the step times; the whole run adds start-up,
 * evaluation and checkpoints).  After runlog_set_failed (the run ends in an
 * error its caller prints next) the first line says "stopped after N steps"
 * instead, the block is left out when no step was done, and the JSONL
 * summary gets "failed": true.
 *
 * Ownership: runlog_open returns a RunLog the caller closes with runlog_close
 * (which also frees it and closes the JSONL file); `out` is borrowed and may
 * be NULL for no console output.
 *
 * The JSONL file: runlog_open truncates it, runlog_open_append (a resumed
 * run) adds to it, first cutting off an incomplete last line a killed run
 * left.  Each line goes out in one write(); when the disk refuses part of
 * a line (full disk), the part is cut off again, nothing more is written,
 * and runlog_status / runlog_close return HPC_ERR_IO naming the file, so
 * the file always ends in a complete line and the run ends non-zero.  The
 * first line (the "start" event) is written by the open functions: a log
 * that cannot take even that fails there, before any work.
 *
 * Usage:
 *   RunLog *log = runlog_open("run.jsonl", stderr, isatty(2), &err);
 *   if (!log) return err.code;
 *   runlog_step(log, &(RunLogStep){.step = 1, .total_steps = 100, .loss = 0.7, ...});
 *   runlog_eval(log, 100, 0, "mcc", 0.52, 0.61);
 *   if (runlog_close(log, peak_bytes, &err)) return err.code;
 */
#ifndef HPC_RUNTIME_RUNLOG_H
#define HPC_RUNTIME_RUNLOG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "util/error.h"

typedef struct RunLog RunLog;

typedef struct {
    int64_t step, total_steps;   /* step = optimizer steps done so far (1-based) */
    int epoch;
    double loss, lr, loss_scale; /* loss_scale: 0 or 1 when no scaling is used */
    double grad_norm;            /* global L2 norm of the unscaled gradient before clipping; inf when skipped */
    int64_t skipped_total;       /* steps skipped for inf/NaN gradients so far */
    int64_t tokens;              /* real (unpadded) tokens in this step */
    double device_mem_bytes;     /* current device memory in use, 0 = unknown */
    double seconds;              /* how long this step took; 0 = time it here */
} RunLogStep;

/* Weight of the newest step in the smoothed step time. */
#define RUNLOG_RATE_ALPHA 0.1

/* Monotonic seconds (CLOCK_MONOTONIC), the clock the log's times use. */
double runlog_clock(void);

/* Opens jsonl_path for writing (truncating it) unless NULL.  Returns NULL
 * and fills err (HPC_ERR_IO, naming the path) if it cannot be opened or
 * written. */
RunLog *runlog_open(const char *jsonl_path, FILE *out, bool progress_bar, HpcError *err);
/* The same, appending to jsonl_path (created when missing). */
RunLog *runlog_open_append(const char *jsonl_path, FILE *out, bool progress_bar, HpcError *err);

/* HPC_ERR_IO (naming the file and the error) once a JSONL write failed. */
HpcStatus runlog_status(const RunLog *log, HpcError *err);

/* Plain-line interval when progress_bar is false (default 50 steps; the first
 * and last step are always printed).  every < 1 is taken as 1. */
void runlog_set_interval(RunLog *log, int64_t every);

/* Whether a higher dev metric is better (default true); false for a loss. */
void runlog_set_higher_is_better(RunLog *log, bool higher);

void runlog_step(RunLog *log, const RunLogStep *s);
void runlog_skip(RunLog *log, int64_t step, double new_scale);      /* named in the log, always */
void runlog_eval(RunLog *log, int64_t step, int epoch, const char *metric, double value, double loss);
void runlog_message(RunLog *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The run ends in an error: runlog_close's summary says so (above). */
void runlog_set_failed(RunLog *log);
/* Prints the summary, writes it to the JSONL file, closes and frees; the
 * JSONL file's status (runlog_status, or a failed fsync/close). */
HpcStatus runlog_close(RunLog *log, double peak_mem_bytes, HpcError *err);

#endif

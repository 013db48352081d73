/* runtime/train/signals.h — stop a training run cleanly on SIGINT or SIGTERM.
 *
 * signals_install makes the first SIGINT or SIGTERM only record the signal
 * (in a volatile sig_atomic_t); the trainer polls signals_pending() at step
 * boundaries, writes a checkpoint and returns HPC_ERR_INTERRUPTED (exit
 * code 8).  The handler is installed with SA_RESETHAND, so a second Ctrl-C
 * kills the process at once, as users expect when a save hangs.
 * signals_restore puts the previous handlers back.  Process-wide state:
 * one installation at a time (install twice = HPC_ERR_USAGE).
 *
 * Usage:
 *   if (signals_install(&err)) return err.code;
 *   for (...) { step(); if (signals_pending()) { save(); st = HPC_ERR_INTERRUPTED; break; } }
 *   signals_restore();
 */
#ifndef HPC_RUNTIME_SIGNALS_H
#define HPC_RUNTIME_SIGNALS_H

#include "util/error.h"

HpcStatus signals_install(HpcError *err);
/* The signal number received since signals_install, or 0. */
int signals_pending(void);
/* Forgets a received signal (tests). */
void signals_clear(void);
void signals_restore(void);

#endif

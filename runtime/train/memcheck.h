/* runtime/train/memcheck.h — will the run fit?  Checked before any large
 * allocation, so a run that cannot fit stops at once with exit 6 and the
 * figures instead of growing until the kernel kills it.
 *
 * What a run needs:
 *   cpu   host memory: every value of the step graph at the run's bounds
 *         (B = batch, L = padded sequence length: the cpu executor keeps
 *         each value in its own buffer), the f32 masters, their gradients,
 *         the optimizer state (m, v) and, with checkpoints, the trainer's
 *         host copy of w, m, v (runtime/train/trainer_ckpt.h);
 *   cuda  device memory: the step plan's figure (program/plan.h,
 *         plan_memory: arena, parameters, optimizer state) plus cuBLASLt's
 *         workspace.
 * What is available:
 *   cpu   MemAvailable from /proc/meminfo, and when an address-space limit
 *         is set (ulimit -v, RLIMIT_AS) what is left of it; the smaller one;
 *   cuda  the free memory of device 0 (cuMemGetInfo through the dlopen'd
 *         driver).
 * Test hook: HPC_MEMCHECK_AVAILABLE_MIB=N replaces the host figure (CI
 * checks the refusal without allocating anything).
 *
 * Usage (the trainer, before opening the backend):
 *   if (memcheck_run(spec, program, policy, fuse, device, B, L, with_ckpt, &err)) return err.code;   // HPC_ERR_OOM
 */
#ifndef HPC_RUNTIME_MEMCHECK_H
#define HPC_RUNTIME_MEMCHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"
#include "program/ir.h"
#include "program/params.h"
#include "program/spec.h"
#include "program/step_program.h"
#include "train/train_backend.h"

/* Host bytes a cpu run of g needs at bounds B, L (see above). */
int64_t memcheck_cpu_need(const IrGraph *g, const ParamList *pl, const SpecTraining *train, int64_t B, int64_t L,
                          bool checkpoint_copy);

/* Host bytes available to this process; source gets where the figure came
 * from ("MemAvailable in /proc/meminfo", ...).  HPC_ERR_IO when neither
 * /proc/meminfo nor a limit tells. */
HpcStatus memcheck_host_available(int64_t *bytes, char *source, size_t cap, HpcError *err);

/* HPC_ERR_OOM when need > available: "<what> needs N MiB, M MiB available (<source>)"
 * with the remedies and the override option. */
HpcStatus memcheck_compare(const char *what, int64_t need, int64_t available, const char *source, HpcError *err);

/* The whole check for a run: on program's graph when a compiled step
 * program is given (no lowering), else on the graph it builds from spec
 * with policy and fuse; frees everything it made. */
HpcStatus memcheck_run(const ModelSpec *spec, const StepProgram *program, SpecPrecision policy, bool fuse,
                       TrainDevice device, int64_t B, int64_t L, bool checkpoint_copy, HpcError *err);

#endif

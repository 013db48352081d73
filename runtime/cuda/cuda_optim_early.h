/* runtime/cuda/cuda_optim_early.h — the optimizer's norm pass beside the
 * backward (private to runtime/cuda/cuda_optim.c).
 *
 * The norm pass (opt_check_norm) reads every gradient once (4 bytes a
 * parameter of the step's 34) before opt_decide can clip.  Most of those
 * gradients are final long before the step ends: the backward writes the
 * last layer's first and the embeddings' last.  So its blocks are cut into
 * groups of consecutive blocks (CudaOptEarlyGroup), each with the schedule
 * position after which every gradient its blocks read is final
 * (cuda_exec_final_at: for a gradient the optimizer fixes, its raw and db);
 * the step tail's `after` hook (CudaExecTail) launches a group on a second
 * stream as soon as the step's launches pass that position, forked from
 * the step's stream by an event, so the pass runs while the backward's
 * GEMMs do; the tail launches the groups left (the embeddings', those
 * whose gradients are final only at the end, and all of them where no
 * hook ran: the profiler's launches) on the step's stream, joins the
 * second stream and goes on with opt_decide.  Inside a captured graph the
 * fork and the join are the graph's edges.
 *
 * Each block writes its own partial and opt_decide adds them in block
 * order, so the step's bits are the same as with the pass in one launch.
 * HPC_OPT_EARLY_NORM=1 turns it on (EARLY_DEFAULT in the .c: off until a
 * GPU run measures it); gradient accumulation (the pass reads the sums the
 * tail itself makes) keeps the pass in the tail. */
#ifndef HPC_RUNTIME_CUDA_OPTIM_EARLY_H
#define HPC_RUNTIME_CUDA_OPTIM_EARLY_H

#include <stdbool.h>

#include "cuda/cuda_optim.h"
#include "util/error.h"

/* The groups of o's norm pass from o->ready (o->plan built), and the
 * second stream and events, where HPC_OPT_EARLY_NORM allows and some group
 * can start before `last`, the position of the step's last launch before
 * its tail; else o->early stays empty (n 0) and nothing is created.  Fails
 * on a bad HPC_OPT_EARLY_NORM or a driver error. */
HpcStatus cuda_optim_early_init(CudaOptim *o, int last, HpcError *err);
void cuda_optim_early_free(CudaOptim *o);

/* The hook: after the step's launch at position pos on stream s, the
 * groups whose gradients are final from there on, on the second stream. */
HpcStatus cuda_optim_early_after(CudaOptim *o, int pos, bool fixed, CUstream s, HpcError *err);

/* In the tail: the groups not launched yet on s, then s waits for the
 * second stream; every block's partial is then queued before opt_decide. */
HpcStatus cuda_optim_early_finish(CudaOptim *o, bool fixed, CUstream s, HpcError *err);

#endif

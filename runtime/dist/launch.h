/* runtime/dist/launch.h — one process per GPU: `hpc run --gpus N` starts N
 * copies of a command, each with RANK, WORLD_SIZE, LOCAL_RANK and a
 * file rendezvous in the environment (runtime/dist/rendezvous.h), and waits.
 *
 * The first rank that fails stops the others (SIGTERM, then SIGKILL after a
 * grace period), and dist_launch reports that rank and its exit status, so a
 * failure on one GPU never leaves the others hanging in a collective.
 * Ranks other than 0 run with HPC_QUIET_RANK=1: only rank 0 prints progress
 * and writes logs.
 */
#ifndef HPC_RUNTIME_DIST_LAUNCH_H
#define HPC_RUNTIME_DIST_LAUNCH_H

#include "util/error.h"

/* Runs argv (argv[0] a path) as `world` ranks; rendezvous_file is handed to
 * them as HPC_RENDEZVOUS=file:PATH (removed afterwards).  *exit_code is 0 when
 * all ranks succeed, else the first failing rank's exit code (128 + signal
 * for a signal); err says which rank failed. */
HpcStatus dist_launch(int world, char *const argv[], const char *rendezvous_file, double grace_s,
                      int *exit_code, HpcError *err);

#endif

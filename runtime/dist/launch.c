/* runtime/dist/launch.c — start one process per rank, stop all when one fails. */
#include "dist/launch.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LAUNCH_MAX 64

static void child_exec(int rank, int world, char *const argv[], const char *rendezvous_file)
{
    char num[32], rdv[600];
    snprintf(num, sizeof num, "%d", rank);
    setenv("RANK", num, 1);
    setenv("LOCAL_RANK", num, 1);
    snprintf(num, sizeof num, "%d", world);
    setenv("WORLD_SIZE", num, 1);
    snprintf(rdv, sizeof rdv, "file:%s", rendezvous_file);
    setenv("HPC_RENDEZVOUS", rdv, 1);
    if (rank > 0) setenv("HPC_QUIET_RANK", "1", 1);
    execv(argv[0], argv);
    fprintf(stderr, "hpc: rank %d: cannot run %s: %s\n", rank, argv[0], strerror(errno));
    _exit(127);
}

static int status_code(int status)
{
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Sends sig to every rank still running. */
static void signal_all(const pid_t *pid, const int *done, int world, int sig)
{
    for (int r = 0; r < world; r++) if (!done[r]) kill(pid[r], sig);
}

HpcStatus dist_launch(int world, char *const argv[], const char *rendezvous_file, double grace_s,
                      int *exit_code, HpcError *err)
{
    if (world < 1 || world > LAUNCH_MAX)
        return hpc_fail(err, HPC_ERR_USAGE, "--gpus takes 1 to %d, not %d", LAUNCH_MAX, world);
    pid_t pid[LAUNCH_MAX];
    int done[LAUNCH_MAX] = { 0 }, left = 0;
    unlink(rendezvous_file);
    for (int r = 0; r < world; r++) {
        pid[r] = fork();
        if (pid[r] == 0) child_exec(r, world, argv, rendezvous_file);
        if (pid[r] < 0) {
            int e = errno;
            signal_all(pid, done, r, SIGTERM);
            for (int k = 0; k < r; k++) waitpid(pid[k], NULL, 0);
            return hpc_fail(err, HPC_ERR_IO, "cannot start rank %d: fork: %s", r, strerror(e));
        }
        left++;
    }
    *exit_code = 0;
    int failed_rank = -1;
    struct timespec stop_at = { 0, 0 };
    while (left > 0) {
        int status;
        pid_t p = waitpid(-1, &status, failed_rank >= 0 ? WNOHANG : 0);
        if (p < 0 && errno == EINTR) continue;
        if (p < 0) break;
        if (p == 0) {   /* stopping the others: escalate after the grace period */
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec > stop_at.tv_sec || (now.tv_sec == stop_at.tv_sec && now.tv_nsec >= stop_at.tv_nsec))
                signal_all(pid, done, world, SIGKILL);
            struct timespec nap = { 0, 20000000 };
            nanosleep(&nap, NULL);
            continue;
        }
        for (int r = 0; r < world; r++) {
            if (pid[r] != p) continue;
            done[r] = 1;
            left--;
            int code = status_code(status);
            if (code != 0 && failed_rank < 0) {
                failed_rank = r;
                *exit_code = code;
                signal_all(pid, done, world, SIGTERM);
                clock_gettime(CLOCK_MONOTONIC, &stop_at);
                stop_at.tv_sec += (time_t)(grace_s > 0 ? grace_s : 10);
            }
        }
    }
    unlink(rendezvous_file);
    if (failed_rank >= 0)
        return hpc_fail(err, HPC_ERR_IO, "rank %d of %d failed (exit %d); the other ranks were stopped",
                        failed_rank, world, *exit_code);
    return HPC_OK;
}

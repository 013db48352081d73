/* runtime/cpu/cpu_threads.h — a small pool of worker threads for the cpu
 * backend's fast mode (runtime/cpu/cpu_fast.h).
 *
 * Promise: cpu_parallel_for(n, fn, ctx) calls fn(ctx, begin, end) on
 * disjoint ranges that together cover [0, n) exactly once, and returns
 * when all calls have finished.  The ranges depend only on n and the
 * thread count, never on timing, so a kernel whose every output element is
 * computed inside one range gives the same bits on any schedule.
 *
 * Thread count: cpu_threads_count() is, in order of precedence, the last
 * cpu_threads_set(n > 0), the environment's HPC_CPU_THREADS, or the number
 * of online cores this process may use (sysconf(_SC_NPROCESSORS_ONLN),
 * fewer when its affinity mask or a cgroup CPU quota, /sys/fs/cgroup/cpu.max,
 * says so); at most CPU_THREADS_MAX.
 * The workers start at the first parallel call and wait on a condition
 * variable between calls (no spinning: the cores stay free for others).
 * Calls from several threads at once are serialised; a call from inside fn
 * runs serially in the caller.  With one thread everything runs in the
 * caller and no thread is created.
 */
#ifndef HPC_RUNTIME_CPU_THREADS_H
#define HPC_RUNTIME_CPU_THREADS_H

#include <stdint.h>

#define CPU_THREADS_MAX 256

typedef void (*CpuRangeFn)(void *ctx, int64_t begin, int64_t end);

/* Threads the next parallel calls use (>= 1). */
int cpu_threads_count(void);
/* Sets the thread count (n >= 1; 0 goes back to HPC_CPU_THREADS / the cores).
 * Waits for running work; later calls use the new count. */
void cpu_threads_set(int n);

/* fn over [0, n) split into at most cpu_threads_count() contiguous ranges
 * of at least `grain` items (grain >= 1); n <= grain runs in the caller. */
void cpu_parallel_for(int64_t n, int64_t grain, CpuRangeFn fn, void *ctx);

#endif

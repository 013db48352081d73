/* util/phase_clock.h — a process-wide record of where start-up time goes.
 *
 * A mark closes the phase that began at the previous mark (the first one
 * at process start, read from /proc: the time before main() and the
 * loader count too) and names it.  Marks cost a clock read and are kept
 * only while recording is on: HPC_STARTUP=1 (or HPC_PROFILE=1) in the
 * environment, or phase_clock_enable(true).  phase_clock_print writes one
 * line per phase and the total, e.g.
 *   hpc profile: start-up phase  0.412 s  CUDA context and stream
 * Work that runs beside the phases on another thread (the GPU opened
 * ahead, the parameters drawn in the background) is a span: it closes no
 * phase and prints as its own line with where it began and ended, e.g.
 *   hpc profile: start-up span   0.231 s  cuInit (beside the phases, 0.012 .. 0.243 s)
 * At most PHASE_CLOCK_MAX marks and spans are kept; later ones are dropped.
 * Thread-safe for marks from several threads (a mutex).
 *
 *   phase_mark("artifact read, graph");
 *   ...
 *   phase_clock_print(stderr);
 */
#ifndef HPC_UTIL_PHASE_CLOCK_H
#define HPC_UTIL_PHASE_CLOCK_H

#include <stdbool.h>
#include <stdio.h>

#define PHASE_CLOCK_MAX 64

/* Whether marks are being recorded (the environment decides the first time). */
bool phase_clock_on(void);
void phase_clock_enable(bool on);

/* Closes the current phase under `what` (a string that outlives the
 * record: a literal).  No-op while recording is off. */
void phase_mark(const char *what);

/* Like phase_mark with "what (detail)", detail copied (printf format). */
void phase_markf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The process age now on the marks' clock (call it while recording is on;
 * spans take two of these). */
double phase_clock_now(void);

/* Records work that ran from `began` to `ended` (phase_clock_now values)
 * beside the phases, under "what (detail)" (printf format).  No-op while
 * recording is off. */
void phase_spanf(double began, double ended, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Seconds since this process started (/proc/self/stat against
 * /proc/uptime), or -1 where /proc is missing. */
double phase_clock_process_age(void);

/* One line per recorded phase or span, in the order recorded, then the sum
 * of the phases; then forgets them. */
void phase_clock_print(FILE *f);

#endif

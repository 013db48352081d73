/* runtime/report/plot_svg.h — small line charts as SVG, written by hand, and the
 * four-panel picture of a run log that `hpc plot` draws.
 *
 * A chart is a grid of panels; each panel has its own axes (ticks at 1-2-5
 * steps, or powers of two on a log2 axis), a title, axis labels, one data
 * series drawn as a line (or as points) and optional vertical marks (e.g.
 * the steps that were skipped).  Non-finite values break the line.  Series
 * longer than PLOT_MAX_POINTS are thinned to the minimum and maximum of each
 * bucket, so spikes survive and files stay small.
 *
 * plot_runlog reads a JSONL run log (runlog.h, fields in docs/data.md) and
 * draws: training loss, learning rate, loss scale (log2 axis, skipped steps
 * marked) and the dev metric, each against the optimizer step, all four on
 * the same step range.
 *
 * Ownership: a PlotPanel owns its two series; plot_panel_free releases them.
 *
 * Usage:
 *   PlotPanel p[1] = {{.title = "loss", .ylabel = "loss"}};
 *   plot_series_push(&p[0].data, step, loss);
 *   if (plot_svg_write("loss.svg", "run", p, 1, 1, &err)) ...;
 *   plot_panel_free(&p[0]);
 */
#ifndef HPC_RUNTIME_PLOT_SVG_H
#define HPC_RUNTIME_PLOT_SVG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "util/error.h"

#define PLOT_MAX_POINTS 4000

typedef struct { double *x, *y; int64_t n, cap; } PlotSeries;

typedef enum { PLOT_LINE, PLOT_POINTS, PLOT_LINE_POINTS } PlotStyle;

typedef struct {
    char title[64];
    char xlabel[32], ylabel[32];
    bool log2_y;         /* y on a log2 axis (non-positive values are dropped) */
    PlotStyle style;
    PlotSeries data;
    PlotSeries marks;    /* x of vertical marker lines; y unused */
    bool fixed_x;        /* use [x_lo, x_hi] as the x data range (to align panels) */
    double x_lo, x_hi;
} PlotPanel;

/* Appends (x, y); false on OOM. */
bool plot_series_push(PlotSeries *s, double x, double y);
void plot_panel_free(PlotPanel *p);

/* Writes n panels in a grid `cols` wide to f / to path (replaced atomically;
 * HPC_ERR_IO naming it, the old file unchanged). */
void plot_svg_emit(FILE *f, const char *title, const PlotPanel *p, int n, int cols);
HpcStatus plot_svg_write(const char *path, const char *title, const PlotPanel *p, int n, int cols, HpcError *err);

/* The run-log picture: jsonl_path in, svg_path out (HPC_ERR_USAGE when they
 * are the same file).  HPC_ERR_IO for files,
 * HPC_ERR_INPUT for a line that is not JSON (FILE:LINE) or a log without
 * any step event. */
HpcStatus plot_runlog(const char *jsonl_path, const char *svg_path, HpcError *err);

#endif

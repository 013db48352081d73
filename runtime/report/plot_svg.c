/* runtime/report/plot_svg.c — see plot_svg.h. */
#include "report/plot_svg.h"

#include "formats/atomic_file.h"
#include "formats/output_check.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Panel geometry in SVG user units. */
enum { PANEL_W = 470, PANEL_H = 300, PAD_L = 78, PAD_R = 20, PAD_T = 34, PAD_B = 48, TITLE_H = 40 };

bool plot_series_push(PlotSeries *s, double x, double y)
{
    if (s->n == s->cap) {
        int64_t cap = s->cap ? s->cap * 2 : 256;
        double *nx = realloc(s->x, (size_t)cap * sizeof *nx);
        if (!nx) return false;
        s->x = nx;
        double *ny = realloc(s->y, (size_t)cap * sizeof *ny);
        if (!ny) return false;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
    return true;
}

static void series_free(PlotSeries *s)
{
    free(s->x);
    free(s->y);
    memset(s, 0, sizeof *s);
}

void plot_panel_free(PlotPanel *p)
{
    series_free(&p->data);
    series_free(&p->marks);
}

/* ---- axes ---- */

typedef struct {
    double lo, hi, step;  /* data range after rounding out to whole steps */
    bool log2;            /* values are log2 of the data; labels read 2^k */
} Axis;

static double nice_step(double span)
{
    double raw = span / 5, mag = pow(10, floor(log10(raw))), norm = raw / mag;
    return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
}

static Axis axis_make(double lo, double hi, bool log2)
{
    if (!isfinite(lo) || !isfinite(hi)) lo = 0, hi = 1;
    if (hi - lo < 1e-12 * fmax(1.0, fabs(hi))) {
        double d = log2 ? 1 : fmax(fabs(hi) * 0.1, 1e-12);
        lo -= d;
        hi += d;
    }
    Axis a = {.log2 = log2};
    a.step = log2 ? fmax(1.0, ceil((hi - lo) / 6)) : nice_step(hi - lo);
    a.lo = floor(lo / a.step) * a.step;
    a.hi = ceil(hi / a.step) * a.step;
    return a;
}

static void fmt_tick(char *buf, size_t n, const Axis *a, double v)
{
    if (a->log2) {
        snprintf(buf, n, "2^%d", (int)lround(v));
        return;
    }
    if (fabs(v) < a->step * 1e-6) v = 0;
    if (a->step < 1e-3 || fmax(fabs(a->lo), fabs(a->hi)) >= 1e5) snprintf(buf, n, "%.3g", v);
    else snprintf(buf, n, "%.*f", a->step >= 1 ? 0 : (int)ceil(-log10(a->step) - 1e-9), v);
}

/* ---- SVG pieces ---- */

static void svg_text(FILE *f, double x, double y, const char *anchor, const char *extra, const char *s)
{
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"%s>", x, y, anchor, extra);
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else fputc(*s, f);
    }
    fputs("</text>\n", f);
}

typedef struct { double x0, y0, w, h; Axis ax, ay; } Frame;

static double frame_x(const Frame *fr, double x) { return fr->x0 + (x - fr->ax.lo) / (fr->ax.hi - fr->ax.lo) * fr->w; }
static double frame_y(const Frame *fr, double y) { return fr->y0 + fr->h - (y - fr->ay.lo) / (fr->ay.hi - fr->ay.lo) * fr->h; }

static void draw_axes(FILE *f, const Frame *fr, const PlotPanel *p)
{
    char lab[32];
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"white\" stroke=\"#444\"/>\n",
            fr->x0, fr->y0, fr->w, fr->h);
    for (double v = fr->ax.lo; v <= fr->ax.hi + fr->ax.step * 1e-6; v += fr->ax.step) {
        double x = frame_x(fr, v);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x, fr->y0, x,
                fr->y0 + fr->h);
        fmt_tick(lab, sizeof lab, &fr->ax, v);
        svg_text(f, x, fr->y0 + fr->h + 16, "middle", "", lab);
    }
    for (double v = fr->ay.lo; v <= fr->ay.hi + fr->ay.step * 1e-6; v += fr->ay.step) {
        double y = frame_y(fr, v);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", fr->x0, y,
                fr->x0 + fr->w, y);
        fmt_tick(lab, sizeof lab, &fr->ay, v);
        svg_text(f, fr->x0 - 6, y + 4, "end", "", lab);
    }
    svg_text(f, fr->x0 + fr->w / 2, fr->y0 - 10, "middle", " font-weight=\"bold\"", p->title);
    svg_text(f, fr->x0 + fr->w / 2, fr->y0 + fr->h + 36, "middle", "", p->xlabel);
    char rot[96];
    snprintf(rot, sizeof rot, " transform=\"rotate(-90 %.1f %.1f)\"", fr->x0 - 62, fr->y0 + fr->h / 2);
    svg_text(f, fr->x0 - 62, fr->y0 + fr->h / 2, "middle", rot, p->ylabel);
}

/* y as plotted: log2 on a log axis (NaN for non-positive), else itself. */
static double plot_y(const PlotPanel *p, double y)
{
    return p->log2_y ? (y > 0 ? log2(y) : NAN) : y;
}

/* One point of a line (a non-finite one ends the current polyline) or one dot. */
static void emit_point(FILE *f, const Frame *fr, const PlotPanel *p, double x, double y, bool dots, bool *open)
{
    double py = plot_y(p, y);
    if (!isfinite(x) || !isfinite(py)) {
        if (*open) fputs("\"/>\n", f);
        *open = false;
        return;
    }
    if (dots) {
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#d62728\"/>\n", frame_x(fr, x), frame_y(fr, py));
        return;
    }
    if (!*open)
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"",
                p->style == PLOT_LINE ? "#1f77b4" : "#f4a6a6");
    fprintf(f, "%.1f,%.1f ", frame_x(fr, x), frame_y(fr, py));
    *open = true;
}

/* One pass over the series (a line or the dots), thinned to each bucket's
 * minimum and maximum. */
static void draw_pass(FILE *f, const Frame *fr, const PlotPanel *p, bool dots)
{
    const PlotSeries *s = &p->data;
    int64_t bucket = s->n > PLOT_MAX_POINTS ? (s->n + PLOT_MAX_POINTS / 2 - 1) / (PLOT_MAX_POINTS / 2) : 1;
    bool open = false;
    for (int64_t i = 0; i < s->n; i += bucket) {
        int64_t end = i + bucket < s->n ? i + bucket : s->n, lo = i, hi = i;
        bool gap = false;
        for (int64_t k = i; k < end; k++) {
            double y = plot_y(p, s->y[k]);
            if (!isfinite(y)) gap = true;
            else if (!isfinite(plot_y(p, s->y[lo])) || y < plot_y(p, s->y[lo])) lo = k;
            if (isfinite(y) && (!isfinite(plot_y(p, s->y[hi])) || y > plot_y(p, s->y[hi]))) hi = k;
        }
        int64_t a = lo < hi ? lo : hi, b = lo < hi ? hi : lo;
        emit_point(f, fr, p, s->x[a], s->y[a], dots, &open);
        if (b != a) emit_point(f, fr, p, s->x[b], s->y[b], dots, &open);
        if (gap) emit_point(f, fr, p, NAN, NAN, dots, &open);
    }
    if (open) fputs("\"/>\n", f);
}

/* The series (line, dots or both), then the vertical marks. */
static void draw_series(FILE *f, const Frame *fr, const PlotPanel *p)
{
    if (p->style != PLOT_POINTS) draw_pass(f, fr, p, false);
    if (p->style != PLOT_LINE) draw_pass(f, fr, p, true);
    for (int64_t i = 0; i < p->marks.n; i++) {
        double x = frame_x(fr, p->marks.x[i]);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" stroke-opacity=\"0.5\" "
                "stroke-dasharray=\"3,3\"/>\n", x, fr->y0, x, fr->y0 + fr->h);
    }
}

/* Data ranges over the finite points (and marks for x). */
static void panel_ranges(const PlotPanel *p, double *xlo, double *xhi, double *ylo, double *yhi)
{
    *xlo = *ylo = INFINITY;
    *xhi = *yhi = -INFINITY;
    for (int64_t i = 0; i < p->data.n; i++) {
        double y = plot_y(p, p->data.y[i]);
        if (!isfinite(y) || !isfinite(p->data.x[i])) continue;
        *xlo = fmin(*xlo, p->data.x[i]);
        *xhi = fmax(*xhi, p->data.x[i]);
        *ylo = fmin(*ylo, y);
        *yhi = fmax(*yhi, y);
    }
    for (int64_t i = 0; i < p->marks.n; i++) {
        *xlo = fmin(*xlo, p->marks.x[i]);
        *xhi = fmax(*xhi, p->marks.x[i]);
    }
    if (p->fixed_x) {
        *xlo = p->x_lo;
        *xhi = p->x_hi;
    }
}

static void draw_panel(FILE *f, const PlotPanel *p, double left, double top)
{
    double xlo, xhi, ylo, yhi;
    panel_ranges(p, &xlo, &xhi, &ylo, &yhi);
    Frame fr = {left + PAD_L, top + PAD_T, PANEL_W - PAD_L - PAD_R, PANEL_H - PAD_T - PAD_B,
                axis_make(xlo, xhi, false), axis_make(ylo, yhi, p->log2_y)};
    draw_axes(f, &fr, p);
    if (!isfinite(ylo)) {
        svg_text(f, fr.x0 + fr.w / 2, fr.y0 + fr.h / 2, "middle", " fill=\"#888\"", "no data");
        return;
    }
    draw_series(f, &fr, p);
}

void plot_svg_emit(FILE *f, const char *title, const PlotPanel *p, int n, int cols)
{
    if (cols < 1) cols = 1;
    int rows = (n + cols - 1) / cols;
    int w = cols * PANEL_W + 20, h = rows * PANEL_H + TITLE_H + 10;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"#fafafa\"/>\n", w, h, w, h);
    svg_text(f, w / 2.0, 26, "middle", " font-size=\"16\" font-weight=\"bold\"", title);
    for (int i = 0; i < n; i++) draw_panel(f, &p[i], 10 + (i % cols) * PANEL_W, TITLE_H + (i / cols) * PANEL_H);
    fputs("</svg>\n", f);
}

/* The picture is drawn in memory, then replaces path atomically
 * (runtime/formats/atomic_file.h): a full disk leaves the old picture. */
HpcStatus plot_svg_write(const char *path, const char *title, const PlotPanel *p, int n, int cols, HpcError *err)
{
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) return hpc_fail(err, HPC_ERR_OOM, "plot: out of host memory for %s", path);
    plot_svg_emit(mem, title, p, n, cols);
    bool bad = ferror(mem) != 0;
    fclose(mem);
    HpcStatus st = bad ? hpc_fail(err, HPC_ERR_OOM, "plot: out of host memory drawing %s", path)
                       : atomic_write_file(path, text, len, err);
    free(text);
    return st;
}

/* ---- the run-log picture ---- */

enum { PANEL_LOSS, PANEL_LR, PANEL_SCALE, PANEL_METRIC, PANEL_COUNT };

static double json_num_or_nan(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* Adds one event to the panels; false on OOM. */
static bool plot_event(PlotPanel *p, json_t *o, int64_t *steps)
{
    const char *ev = json_string_value(json_object_get(o, "event"));
    double step = json_num_or_nan(o, "step");
    if (!ev) return true;
    if (!strcmp(ev, "step")) {
        (*steps)++;
        return plot_series_push(&p[PANEL_LOSS].data, step, json_num_or_nan(o, "loss")) &&
               plot_series_push(&p[PANEL_LR].data, step, json_num_or_nan(o, "lr")) &&
               plot_series_push(&p[PANEL_SCALE].data, step, json_num_or_nan(o, "loss_scale"));
    }
    if (!strcmp(ev, "skip")) return plot_series_push(&p[PANEL_SCALE].marks, step, 0);
    if (!strcmp(ev, "eval")) {
        const char *m = json_string_value(json_object_get(o, "metric"));
        if (m && !p[PANEL_METRIC].data.n) {
            snprintf(p[PANEL_METRIC].title, sizeof p[PANEL_METRIC].title, "dev %s", m);
            snprintf(p[PANEL_METRIC].ylabel, sizeof p[PANEL_METRIC].ylabel, "%s", m);
        }
        return plot_series_push(&p[PANEL_METRIC].data, step, json_num_or_nan(o, "value"));
    }
    return true;
}

static void plot_panels_init(PlotPanel *p)
{
    memset(p, 0, PANEL_COUNT * sizeof *p);
    const char *titles[PANEL_COUNT] = {"training loss", "learning rate", "loss scale (dashed: skipped steps)",
                                       "dev metric"};
    const char *ylabels[PANEL_COUNT] = {"loss", "lr", "scale", "metric"};
    for (int i = 0; i < PANEL_COUNT; i++) {
        snprintf(p[i].title, sizeof p[i].title, "%s", titles[i]);
        snprintf(p[i].xlabel, sizeof p[i].xlabel, "step");
        snprintf(p[i].ylabel, sizeof p[i].ylabel, "%s", ylabels[i]);
    }
    p[PANEL_SCALE].log2_y = true;
    p[PANEL_METRIC].style = PLOT_LINE_POINTS;
}

static HpcStatus plot_read_log(const char *path, PlotPanel *p, HpcError *err)
{
    FILE *f = fopen(path, "r");
    if (!f) return hpc_fail(err, HPC_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    int64_t lineno = 0, steps = 0;
    HpcStatus st = HPC_OK;
    while (!st && getline(&line, &cap, f) >= 0) {
        lineno++;
        if (line[strspn(line, " \t\r\n")] == '\0') continue;
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (!o || !json_is_object(o))
            st = hpc_fail(err, HPC_ERR_INPUT, "%s:%lld: not a JSON object (%s); is this an hpc run log?", path,
                          (long long)lineno, o ? "another JSON value" : je.text);
        else if (!plot_event(p, o, &steps))
            st = hpc_fail(err, HPC_ERR_OOM, "reading %s: out of host memory", path);
        json_decref(o);
    }
    int bad = ferror(f), why = errno;   /* a folder reads as an error (EISDIR), not as 0 lines */
    free(line);
    fclose(f);
    if (!st && bad) st = hpc_fail(err, HPC_ERR_IO, "cannot read %s: %s", path, strerror(why));
    if (!st && steps == 0)
        st = hpc_fail(err, HPC_ERR_INPUT, "%s: no \"step\" events to plot (%lld lines)", path, (long long)lineno);
    return st;
}

/* Every panel gets the step range of all of them, so they line up. */
static void plot_align_x(PlotPanel *p)
{
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < PANEL_COUNT; i++) {
        double xlo, xhi, ylo, yhi;
        panel_ranges(&p[i], &xlo, &xhi, &ylo, &yhi);
        lo = fmin(lo, xlo);
        hi = fmax(hi, xhi);
    }
    for (int i = 0; i < PANEL_COUNT; i++) {
        p[i].fixed_x = isfinite(lo) && isfinite(hi);
        p[i].x_lo = lo;
        p[i].x_hi = hi;
    }
}

HpcStatus plot_runlog(const char *jsonl_path, const char *svg_path, HpcError *err)
{
    HpcStatus st = output_check_file("-o", svg_path, &(OutputInput){"the run log being drawn", jsonl_path}, 1, err);
    if (st) return st;
    PlotPanel p[PANEL_COUNT];
    plot_panels_init(p);
    st = plot_read_log(jsonl_path, p, err);
    if (!st) plot_align_x(p);
    const char *base = strrchr(jsonl_path, '/');
    if (!st) st = plot_svg_write(svg_path, base ? base + 1 : jsonl_path, p, PANEL_COUNT, 2, err);
    for (int i = 0; i < PANEL_COUNT; i++) plot_panel_free(&p[i]);
    return st;
}

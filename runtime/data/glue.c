/* runtime/data/glue.c — see glue.h. */
#include "data/glue.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "data/tsv.h"

#define GLUE_MAX_LABELS 64

/* How each task's files look (see glue.h). */
typedef struct {
    const char *name, *alias;
    bool header;              /* train/dev files have a header line */
    const char *text_a, *text_b, *label;  /* header column names */
    const char *label_names;  /* NULL: integer labels */
    int64_t num_labels;
    bool regression;
} GlueTaskInfo;

static const GlueTaskInfo glue_tasks[GLUE_TASK_COUNT] = {
    [GLUE_COLA] = {"cola", NULL, false, "sentence", NULL, "label", NULL, 2, false},
    [GLUE_SST2] = {"sst2", "sst-2", true, "sentence", NULL, "label", NULL, 2, false},
    [GLUE_MRPC] = {"mrpc", NULL, true, "#1 String", "#2 String", "Quality", NULL, 2, false},
    [GLUE_RTE] = {"rte", NULL, true, "sentence1", "sentence2", "label", "entailment,not_entailment", 2, false},
    [GLUE_QNLI] = {"qnli", NULL, true, "question", "sentence", "label", "entailment,not_entailment", 2, false},
    [GLUE_QQP] = {"qqp", NULL, true, "question1", "question2", "is_duplicate", NULL, 2, false},
    [GLUE_STSB] = {"stsb", "sts-b", true, "sentence1", "sentence2", "score", NULL, 1, true},
    [GLUE_MNLI] = {"mnli", NULL, true, "sentence1", "sentence2", "gold_label", "entailment,neutral,contradiction", 3,
                   false},
    [GLUE_WNLI] = {"wnli", NULL, true, "sentence1", "sentence2", "label", NULL, 2, false},
    [GLUE_GENERIC] = {"generic", NULL, true, NULL, NULL, NULL, NULL, 2, false},
};

/* CoLA train/dev: no header, 4 columns. */
#define COLA_COLUMNS 4
#define COLA_LABEL 1
#define COLA_SENTENCE 3

/* Where the columns of one file are, resolved from its header or the task. */
typedef struct {
    int ncols;                /* fields every row must have */
    int a, b, label;          /* column indices, -1 = absent */
    char names[GLUE_MAX_LABELS][64];
    int nnames;               /* label strings in id order; 0 = integers */
    int64_t num_labels;
    bool regression;
    bool header;              /* the first record is a header */
} GlueLayout;

GlueOptions glue_options(GlueTask task, int64_t max_len)
{
    return (GlueOptions){.task = task, .max_len = max_len, .delimiter = '\t', .header = true, .num_labels = 2};
}

GlueTask glue_task_from_name(const char *name)
{
    for (int t = 0; t < GLUE_TASK_COUNT; t++)
        if (!strcasecmp(name, glue_tasks[t].name) || (glue_tasks[t].alias && !strcasecmp(name, glue_tasks[t].alias)))
            return (GlueTask)t;
    return GLUE_TASK_COUNT;
}

const char *glue_task_name(GlueTask task) { return task < GLUE_TASK_COUNT ? glue_tasks[task].name : "unknown"; }
int64_t glue_num_labels(GlueTask task) { return task < GLUE_TASK_COUNT ? glue_tasks[task].num_labels : 0; }
bool glue_is_regression(GlueTask task) { return task < GLUE_TASK_COUNT && glue_tasks[task].regression; }
bool glue_is_pair(GlueTask task) { return task < GLUE_TASK_COUNT && glue_tasks[task].text_b; }

/* ---- the file ---- */

static HpcStatus glue_slurp(const char *path, char **data, size_t *len, HpcError *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return hpc_fail(err, HPC_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) free(buf);
            buf = b;
        }
    }
    int bad = ferror(f), why = errno;
    fclose(f);
    if (!buf) return hpc_fail(err, HPC_ERR_OOM, "reading %s: out of host memory", path);
    if (bad) {
        free(buf);
        return hpc_fail(err, HPC_ERR_IO, "cannot read %s: %s", path, strerror(why));
    }
    *data = buf;
    *len = n;
    return HPC_OK;
}

/* ---- the layout ---- */

static int layout_find(char **fields, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(fields[i], name)) return i;
    return -1;
}

/* Column by header name, or by 0-based index when the file has no header. */
static int layout_column(char **header, int ncols, const char *spec)
{
    if (!spec) return -1;
    if (header) return layout_find(header, ncols, spec);
    char *end;
    long i = strtol(spec, &end, 10);
    return *spec && !*end && i >= 0 && i < ncols ? (int)i : -1;
}

static HpcStatus layout_labels(GlueLayout *lay, const char *names, const char *path, HpcError *err)
{
    lay->nnames = 0;
    if (!names) return HPC_OK;
    const char *p = names;
    while (*p) {
        size_t n = strcspn(p, ",");
        if (lay->nnames == GLUE_MAX_LABELS || n == 0 || n >= sizeof lay->names[0])
            return hpc_fail(err, HPC_ERR_USAGE, "%s: bad label list '%s' (comma-separated names, at most %d)",
                            path, names, GLUE_MAX_LABELS);
        snprintf(lay->names[lay->nnames++], sizeof lay->names[0], "%.*s", (int)n, p);
        p += n + (p[n] == ',');
    }
    lay->num_labels = lay->nnames;
    return HPC_OK;
}

static void header_list(char **fields, int n, char *out, size_t len)
{
    out[0] = '\0';
    for (int i = 0; i < n && strlen(out) + 8 < len; i++)
        snprintf(out + strlen(out), len - strlen(out), "%s'%s'", i ? ", " : "", fields[i]);
}

/* Resolves the columns from the first record (fields/n). */
static HpcStatus layout_resolve(GlueLayout *lay, const GlueOptions *o, const char *path, char **fields, int n,
                                HpcError *err)
{
    const GlueTaskInfo *ti = &glue_tasks[o->task];
    bool generic = o->task == GLUE_GENERIC;
    const char *sa = generic ? o->text_a : ti->text_a, *sb = generic ? o->text_b : ti->text_b;
    const char *sl = generic ? o->label : ti->label;
    *lay = (GlueLayout){.ncols = n, .label = -1, .b = -1, .header = generic ? o->header : ti->header,
                        .num_labels = generic ? o->num_labels : ti->num_labels,
                        .regression = generic ? o->regression : ti->regression};
    bool cola_test = o->task == GLUE_COLA && n == 2 && !strcmp(fields[0], "index") && !strcmp(fields[1], "sentence");
    if (o->task == GLUE_COLA && !cola_test) {  /* train/dev: fixed columns, no header */
        lay->ncols = COLA_COLUMNS;
        lay->a = COLA_SENTENCE;
        lay->label = COLA_LABEL;
        return HPC_OK;
    }
    lay->header |= cola_test;
    if (generic && !sa) return hpc_fail(err, HPC_ERR_USAGE, "%s: the generic reader needs a text column name", path);
    char **names = lay->header ? fields : NULL;
    char found[512];
    header_list(fields, n, found, sizeof found);
    lay->a = layout_column(names, n, sa);
    if (lay->a < 0)
        return hpc_fail(err, HPC_ERR_INPUT, "%s:1: no text column '%s' (columns: %s); is this a %s file?", path, sa,
                        found, ti->name);
    lay->b = layout_column(names, n, sb);
    if (sb && lay->b < 0)
        return hpc_fail(err, HPC_ERR_INPUT, "%s:1: no second text column '%s' (columns: %s); is this a %s file?", path,
                        sb, found, ti->name);
    lay->label = layout_column(names, n, sl);  /* absent: an unlabelled test file */
    if (generic && sl && lay->label < 0)
        return hpc_fail(err, HPC_ERR_INPUT, "%s:1: no label column '%s' (columns: %s)", path, sl, found);
    return layout_labels(lay, generic ? o->label_names : ti->label_names, path, err);
}

/* ---- one row ---- */

/* Parses the label field into *label or *target; false with why on error. */
static bool row_label(const GlueLayout *lay, const char *s, int32_t *label, float *target, char *why, size_t n)
{
    *label = -1;
    *target = 0;
    char *end;
    if (lay->regression) {
        errno = 0;
        double v = strtod(s, &end);
        if (!*s || *end || errno || !isfinite(v)) {
            snprintf(why, n, "regression target '%.40s' is not a finite number", s);
            return false;
        }
        *target = (float)v;
        return true;
    }
    for (int i = 0; i < lay->nnames; i++)
        if (!strcmp(s, lay->names[i])) return (*label = i), true;
    if (lay->nnames) {
        size_t k = (size_t)snprintf(why, n, "label '%.40s' is not one of ", s);
        for (int i = 0; i < lay->nnames && k < n; i++)
            k += (size_t)snprintf(why + k, n - k, "%s'%s'", i ? ", " : "", lay->names[i]);
        return false;
    }
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < 0 || v >= lay->num_labels) {
        snprintf(why, n, "label '%.40s' is not an integer in 0..%lld", s, (long long)lay->num_labels - 1);
        return false;
    }
    *label = (int32_t)v;
    return true;
}

static bool blank(const char *s)
{
    return s[strspn(s, " \t\r\n")] == '\0';
}

/* Checks one record and adds it; HPC_ERR_INPUT with why for a bad row. */
static HpcStatus row_add(const GlueLayout *lay, const GlueOptions *o, const Tokenizer *tok, char **f, int n,
                         Dataset *d, TokEncoding *enc, GlueReport *rep, char *why, size_t wn, HpcError *err)
{
    if (n != lay->ncols) {
        snprintf(why, wn, "expected %d %s-separated columns, found %d", lay->ncols,
                 o->task == GLUE_GENERIC && o->delimiter == ',' ? "comma" : "TAB", n);
        return HPC_ERR_INPUT;
    }
    if (blank(f[lay->a]) || (lay->b >= 0 && blank(f[lay->b]))) {
        snprintf(why, wn, "empty text in column %d", blank(f[lay->a]) ? lay->a + 1 : lay->b + 1);
        return HPC_ERR_INPUT;
    }
    int32_t label = -1;
    float target = 0;
    if (lay->label >= 0 && !row_label(lay, f[lay->label], &label, &target, why, wn)) return HPC_ERR_INPUT;
    HpcStatus st = tokenizer_encode(tok, f[lay->a], lay->b >= 0 ? f[lay->b] : NULL, o->max_len, enc, err);
    if (st) return st == HPC_ERR_INPUT ? (snprintf(why, wn, "%.400s", err->msg), st) : st;
    rep->truncated += enc->truncated;
    st = dataset_add(d, enc->ids, enc->type_ids, enc->len, label, target, err);
    if (!st) rep->rows++;
    return st;
}

/* ---- the reader ---- */

typedef struct {
    const char *path;
    const GlueOptions *o;
    const Tokenizer *tok;
    Dataset *d;
    GlueReport *rep;
    GlueLayout lay;
    TsvReader r;
    TokEncoding enc;
} GlueRead;

/* A bad row: stop (the default) or count it and go on. */
static HpcStatus glue_bad_row(GlueRead *g, int64_t line, const char *why, HpcError *err)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%.200s:%lld: %.280s", g->path, (long long)line, why);
    if (!g->o->skip_bad_rows)
        return hpc_fail(err, HPC_ERR_INPUT, "%s (run with --skip-bad-rows to skip such rows)", msg);
    if (g->rep->skipped++ == 0) snprintf(g->rep->first_bad, sizeof g->rep->first_bad, "%s", msg);
    return HPC_OK;
}

static HpcStatus glue_rows(GlueRead *g, HpcError *err)
{
    char why[512];
    bool first = true;
    for (;;) {
        if (tsv_at_end(&g->r)) return HPC_OK;
        TsvResult rc = tsv_next(&g->r, why, sizeof why);
        if (rc == TSV_EOF) return HPC_OK;
        if (rc == TSV_OOM) return hpc_fail(err, HPC_ERR_OOM, "reading %s: out of host memory", g->path);
        if (rc == TSV_BAD && first)
            return hpc_fail(err, HPC_ERR_INPUT, "%s:%lld: %s", g->path, (long long)g->r.line, why);
        if (first) {
            HpcStatus st = layout_resolve(&g->lay, g->o, g->path, g->r.fields, g->r.nfields, err);
            if (st) return st;
            first = false;
            if (g->lay.header) continue;
        }
        g->rep->lines++;
        HpcStatus st = rc == TSV_BAD ? HPC_ERR_INPUT
                                     : row_add(&g->lay, g->o, g->tok, g->r.fields, g->r.nfields, g->d, &g->enc,
                                               g->rep, why, sizeof why, err);
        if (st == HPC_ERR_INPUT) st = glue_bad_row(g, g->r.line, why, err);
        if (st) return st;
    }
}

static HpcStatus glue_check_options(const char *path, const GlueOptions *o, HpcError *err)
{
    if (o->task >= GLUE_TASK_COUNT)
        return hpc_fail(err, HPC_ERR_USAGE, "glue_read(%s): unknown task %d", path, (int)o->task);
    if (o->max_len < 3)
        return hpc_fail(err, HPC_ERR_USAGE, "reading %s: a maximum sequence length of %lld tokens is too small "
                        "(at least 3: [CLS], text, [SEP]); raise max_seq_len in the model's training settings", path,
                        (long long)o->max_len);
    if (o->task == GLUE_GENERIC && o->delimiter != '\t' && o->delimiter != ',')
        return hpc_fail(err, HPC_ERR_USAGE, "glue_read(%s): the delimiter must be TAB or comma", path);
    return HPC_OK;
}

HpcStatus glue_read(const char *path, const GlueOptions *o, const Tokenizer *tok, Dataset *d, GlueReport *rep,
                    HpcError *err)
{
    GlueReport local;
    if (!rep) rep = &local;
    memset(rep, 0, sizeof *rep);
    HpcStatus st = glue_check_options(path, o, err);
    char *data = NULL;
    size_t len = 0;
    if (!st) st = glue_slurp(path, &data, &len, err);
    if (st) return st;
    GlueRead g = {.path = path, .o = o, .tok = tok, .d = d, .rep = rep};
    char delim = o->task == GLUE_GENERIC ? o->delimiter : '\t';
    tsv_init(&g.r, data, len, delim, delim == ',');
    if (tsv_at_end(&g.r)) st = hpc_fail(err, HPC_ERR_INPUT, "%s: empty file", path);
    int64_t before = d->n;
    if (!st) st = glue_rows(&g, err);
    if (!st && d->n == before)
        st = hpc_fail(err, HPC_ERR_INPUT, "%s: no usable rows (%lld lines, %lld skipped)%s%s", path,
                      (long long)rep->lines, (long long)rep->skipped, rep->skipped ? "; first: " : "", rep->first_bad);
    if (!st) {
        d->num_labels = g.lay.num_labels;
        d->regression = g.lay.regression;
    }
    tsv_free(&g.r);
    tok_encoding_free(&g.enc);
    free(data);
    return st;
}

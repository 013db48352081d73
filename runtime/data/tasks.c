/* runtime/data/tasks.c — see tasks.h. */
#include "data/tasks.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define TASK_DEFAULT_VOCAB "data/vocab/bert-base-uncased-vocab.txt"
#define TASK_DEFAULT_VOCAB_CASED "data/vocab/bert-base-cased-vocab.txt"
/* Integer classes a tsv:DIR task may have (the model's limit is larger;
 * more classes than this is almost surely the wrong column). */
#define TASK_TSV_MAX_LABELS 1024

/* Where a task's files are. */
typedef struct {
    const char *name;       /* command-line name */
    GlueTask glue;
    const char *glue_dir;   /* the folder's name in GLUE's download */
    const char *dir;        /* default data_dir */
    const char *dev, *test; /* file names in data_dir (train is train.tsv) */
} TaskInfo;

static const TaskInfo task_table[] = {
    {"cola", GLUE_COLA, "CoLA", "data/cola", "dev.tsv", "test.tsv"},
    {"sst2", GLUE_SST2, "SST-2", "data/sst2", "dev.tsv", "test.tsv"},
    {"mrpc", GLUE_MRPC, "MRPC", "data/mrpc", "dev.tsv", "test.tsv"},
    {"rte", GLUE_RTE, "RTE", "data/rte", "dev.tsv", "test.tsv"},
    {"qnli", GLUE_QNLI, "QNLI", "data/qnli", "dev.tsv", "test.tsv"},
    {"qqp", GLUE_QQP, "QQP", "data/qqp", "dev.tsv", "test.tsv"},
    {"stsb", GLUE_STSB, "STS-B", "data/stsb", "dev.tsv", "test.tsv"},
    {"mnli", GLUE_MNLI, "MNLI", "data/mnli", "dev_matched.tsv", "test_matched.tsv"},
    {"mnli-mm", GLUE_MNLI, "MNLI", "data/mnli", "dev_mismatched.tsv", "test_mismatched.tsv"},
    {"wnli", GLUE_WNLI, "WNLI", "data/wnli", "dev.tsv", "test.tsv"},
};
#define TASK_TABLE_N ((int)(sizeof task_table / sizeof task_table[0]))

static const TaskInfo task_tsv_info = {"tsv", GLUE_GENERIC, NULL, NULL, "dev.tsv", "test.tsv"};

/* The table row of a name ("sst-2" and "sts-b" too), NULL when unknown. */
static const TaskInfo *task_find(const char *name)
{
    for (int i = 0; i < TASK_TABLE_N; i++)
        if (!strcasecmp(name, task_table[i].name)) return &task_table[i];
    GlueTask g = glue_task_from_name(name);
    for (int i = 0; i < TASK_TABLE_N && g != GLUE_GENERIC; i++)
        if (task_table[i].glue == g) return &task_table[i];
    return NULL;
}

const char *task_split_name(TaskSplit s)
{
    static const char *const names[TASK_SPLIT_COUNT] = {"train", "dev", "test"};
    return s < TASK_SPLIT_COUNT ? names[s] : "unknown";
}

const Dataset *task_split(const TaskData *t, TaskSplit s)
{
    switch (s) {
    case TASK_SPLIT_TRAIN: return &t->train;
    case TASK_SPLIT_DEV: return &t->dev;
    case TASK_SPLIT_TEST: return &t->test;
    default: return NULL;
    }
}

static Dataset *task_split_mut(TaskData *t, TaskSplit s) { return (Dataset *)task_split(t, s); }

void task_free(TaskData *t)
{
    if (!t) return;
    tokenizer_free(t->tok);
    dataset_free(&t->train);
    dataset_free(&t->dev);
    dataset_free(&t->test);
    memset(t, 0, sizeof *t);
}

/* ---- where the data is, and what to say when it is not there ---- */

/* "copy GLUE's CoLA into data/cola/ (train.tsv, dev.tsv; test.tsv optional)..." */
static void task_remedy(const TaskInfo *ti, const char *dir, char *buf, size_t n)
{
    if (ti->glue == GLUE_GENERIC)
        snprintf(buf, n,
                 "a tsv:DIR task needs DIR/train.tsv and DIR/%s (test.tsv optional), each with a header line "
                 "naming the text and label columns (docs/tasks.md)",
                 ti->dev);
    else
        snprintf(buf, n,
                 "copy GLUE's %s (the glue_data/%s folder of the GLUE download, gluebenchmark.com/tasks) into "
                 "%.300s/ (train.tsv, %s; %s optional) or point --data at a folder that holds them",
                 ti->glue_dir, ti->glue_dir, dir, ti->dev, ti->test);
}

static HpcStatus task_check_dir(const TaskInfo *ti, const char *dir, HpcError *err)
{
    struct stat st;
    int rc = stat(dir, &st), e = errno;
    if (rc == 0 && S_ISDIR(st.st_mode)) return HPC_OK;
    const char *why = rc == 0 ? "not a directory" : e == ENOENT || e == ENOTDIR ? "no such directory" : strerror(e);
    char remedy[512];
    task_remedy(ti, dir, remedy, sizeof remedy);
    return hpc_fail(err, HPC_ERR_IO, "task %s: cannot use data directory %s: %s; %s", ti->name, dir, why, remedy);
}

/* Whether a split's file exists; a missing train or dev file is an error. */
static HpcStatus task_check_file(const TaskInfo *ti, const char *dir, const char *path, bool optional,
                                 bool *present, HpcError *err)
{
    struct stat st;
    *present = stat(path, &st) == 0;
    int e = errno;
    char remedy[512];
    if (*present && S_ISDIR(st.st_mode)) {   /* found, but not something to read lines from */
        task_remedy(ti, dir, remedy, sizeof remedy);
        return hpc_fail(err, HPC_ERR_IO, "task %s: %s is a folder, not a file; %s", ti->name, path, remedy);
    }
    if (*present || optional) return HPC_OK;
    task_remedy(ti, dir, remedy, sizeof remedy);
    return hpc_fail(err, HPC_ERR_IO, "task %s: cannot open %s: %s; %s", ti->name, path, strerror(e), remedy);
}

/* ---- tsv:DIR columns ---- */

/* The header names of path (first line; a BOM and CR are dropped); -1 with
 * errno set when the file cannot be read, 0 when it is empty. */
static int tsv_header(const char *path, char line[4096], char *names[64])
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    bool ok = fgets(line, 4096, f) != NULL;
    int e = ferror(f) ? errno : 0;
    fclose(f);
    if (e) {
        errno = e;
        return -1;
    }
    if (!ok) return 0;
    line[strcspn(line, "\r\n")] = '\0';
    char *p = line + (strncmp(line, "\xEF\xBB\xBF", 3) ? 0 : 3);
    int n = 0;
    for (char *tok; n < 64 && (tok = strsep(&p, "\t"));) names[n++] = tok;
    return n;
}

static bool tsv_has(char **names, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], name)) return true;
    return false;
}

/* Fills text_a/text_b/label/regression of o from train.tsv's header. */
static HpcStatus tsv_columns(const char *path, GlueOptions *o, HpcError *err)
{
    static const char *const pairs[][2] = {
        {"sentence1", "sentence2"}, {"text_a", "text_b"}, {"question1", "question2"}, {"premise", "hypothesis"}};
    static const char *const singles[] = {"sentence", "text", "text_a", "sentence1"};
    char line[4096], *names[64];
    int n = tsv_header(path, line, names);
    if (n < 0) return hpc_fail(err, HPC_ERR_IO, "%s: cannot read the header line: %s", path, strerror(errno));
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0] && !o->text_a; i++)
        if (tsv_has(names, n, pairs[i][0]) && tsv_has(names, n, pairs[i][1]))
            o->text_a = pairs[i][0], o->text_b = pairs[i][1];
    for (size_t i = 0; i < sizeof singles / sizeof singles[0] && !o->text_a; i++)
        if (tsv_has(names, n, singles[i])) o->text_a = singles[i];
    o->label = tsv_has(names, n, "label") ? "label" : tsv_has(names, n, "score") ? "score" : NULL;
    o->regression = o->label && !strcmp(o->label, "score");
    o->num_labels = o->regression ? 1 : TASK_TSV_MAX_LABELS;
    if (o->text_a && o->label) return HPC_OK;
    return hpc_fail(err, HPC_ERR_INPUT,
                    "%s:1: a tsv:DIR task needs a header with a text column (sentence, text, or sentence1 + "
                    "sentence2, text_a + text_b, question1 + question2, premise + hypothesis) and a 'label' or "
                    "'score' column; found %s",
                    path, n ? "other names" : "no header");
}

/* K = largest label + 1 (at least 2) over the labelled splits. */
static void tsv_count_labels(TaskData *t)
{
    int32_t top = 1;
    for (int s = TASK_SPLIT_TRAIN; s <= TASK_SPLIT_DEV; s++) {
        const Dataset *d = task_split(t, s);
        for (int64_t i = 0; i < d->n; i++)
            if (d->ex[i].label > top) top = d->ex[i].label;
    }
    t->num_labels = (int64_t)top + 1;
    for (int s = 0; s < TASK_SPLIT_COUNT; s++) task_split_mut(t, s)->num_labels = t->num_labels;
}

/* ---- loading ---- */

static void task_note(TaskSplitInfo *in, const Dataset *d, const GlueReport *rep)
{
    in->lines = rep->lines;
    in->rows = d->n;
    in->skipped = rep->skipped;
    in->truncated = rep->truncated;
    in->longest = dataset_max_len(d);
    in->mean_len = d->n ? (double)dataset_total_tokens(d) / (double)d->n : 0.0;
    snprintf(in->first_bad, sizeof in->first_bad, "%s", rep->first_bad);
}

static HpcStatus task_read_split(TaskData *t, TaskSplit s, const GlueOptions *base, HpcError *err)
{
    TaskSplitInfo *in = &t->info[s];
    Dataset *d = task_split_mut(t, s);
    GlueOptions o = *base;
    if (s == TASK_SPLIT_TEST && o.task == GLUE_GENERIC) o.label = NULL;  /* test files have no labels */
    GlueReport rep;
    HpcStatus st = glue_read(in->path, &o, t->tok, d, &rep, err);
    if (st) return st;
    if (s == TASK_SPLIT_TEST && rep.skipped)
        return hpc_fail(err, HPC_ERR_INPUT,
                        "%s: %lld bad rows (first: %s); test rows are never skipped, since every index needs a "
                        "prediction: fix the file",
                        in->path, (long long)rep.skipped, rep.first_bad);
    task_note(in, d, &rep);
    return HPC_OK;
}

/* Resolves the paths of the three splits and checks the required ones exist. */
static HpcStatus task_paths(TaskData *t, const TaskInfo *ti, HpcError *err)
{
    HpcStatus st = task_check_dir(ti, t->data_dir, err);
    const char *files[TASK_SPLIT_COUNT] = {"train.tsv", ti->dev, ti->test};
    for (int s = 0; s < TASK_SPLIT_COUNT && !st; s++) {
        TaskSplitInfo *in = &t->info[s];
        if ((size_t)snprintf(in->path, sizeof in->path, "%s/%s", t->data_dir, files[s]) >= sizeof in->path)
            return hpc_fail(err, HPC_ERR_USAGE, "task %s: data directory path too long: %s", ti->name, t->data_dir);
        st = task_check_file(ti, t->data_dir, in->path, s == TASK_SPLIT_TEST, &in->present, err);
    }
    return st;
}

static HpcStatus task_load_vocab(TaskData *t, const char *vocab_path, bool cased, HpcError *err)
{
    const char *path = vocab_path ? vocab_path : cased ? TASK_DEFAULT_VOCAB_CASED : TASK_DEFAULT_VOCAB;
    snprintf(t->vocab_path, sizeof t->vocab_path, "%s", path);
    HpcStatus st = tokenizer_load(path, !cased, &t->tok, err);
    if (st == HPC_ERR_IO && !vocab_path) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return hpc_fail(err, st, "%.800s (the default vocabulary, relative to the working directory: run from the "
                                 "repository root or pass --vocab FILE)", msg);
    }
    return st;
}

/* Splits "tsv:DIR"; returns the table row and sets *dir for tsv tasks. */
static HpcStatus task_resolve(const char *task, const char *data_dir, const TaskInfo **ti, const char **dir,
                              HpcError *err)
{
    if (!task) return hpc_fail(err, HPC_ERR_USAGE, "task_load: no task name");
    if (!strncasecmp(task, "tsv:", 4)) {
        *ti = &task_tsv_info;
        *dir = task + 4;
        if (!**dir) return hpc_fail(err, HPC_ERR_USAGE, "task '%s': tsv:DIR needs a directory", task);
        if (data_dir)
            return hpc_fail(err, HPC_ERR_USAGE, "task '%s' names its directory; drop --data %s", task, data_dir);
        return HPC_OK;
    }
    *ti = task_find(task);
    if (!*ti)
        return hpc_fail(err, HPC_ERR_USAGE,
                        "unknown task '%s'; tasks: cola, sst2, mrpc, rte, qnli, qqp, stsb, mnli, mnli-mm, wnli, "
                        "tsv:DIR",
                        task);
    *dir = data_dir ? data_dir : (*ti)->dir;
    return HPC_OK;
}

static HpcStatus task_load_splits(TaskData *t, const TaskInfo *ti, GlueOptions *o, HpcError *err)
{
    HpcStatus st = ti->glue == GLUE_GENERIC ? tsv_columns(t->info[TASK_SPLIT_TRAIN].path, o, err) : HPC_OK;
    for (int s = 0; s < TASK_SPLIT_COUNT && !st; s++) {
        char name[80];
        snprintf(name, sizeof name, "%.32s/%s", t->name, task_split_name(s));
        dataset_init(task_split_mut(t, s), name);
        if (t->info[s].present) st = task_read_split(t, s, o, err);
    }
    if (st) return st;
    t->regression = t->train.regression;
    t->num_labels = t->train.num_labels;
    t->pair = ti->glue == GLUE_GENERIC ? o->text_b != NULL : glue_is_pair(ti->glue);
    if (ti->glue == GLUE_GENERIC && !t->regression) tsv_count_labels(t);
    t->test.num_labels = t->num_labels;
    t->test.regression = t->regression;
    t->main_metric = metric_main(ti->glue, t->regression);
    return HPC_OK;
}

HpcStatus task_load(const char *task, const char *data_dir, const char *vocab_path, bool cased, int64_t max_len,
                    bool skip_bad_rows, TaskData *out, HpcError *err)
{
    memset(out, 0, sizeof *out);
    const TaskInfo *ti = NULL;
    const char *dir = NULL;
    HpcStatus st = task_resolve(task, data_dir, &ti, &dir, err);
    if (st) return st;
    if (max_len < 3)
        return hpc_fail(err, HPC_ERR_USAGE, "task %s: max length %lld is too small (at least 3)", ti->name,
                        (long long)max_len);
    snprintf(out->name, sizeof out->name, "%s", ti->name);
    snprintf(out->data_dir, sizeof out->data_dir, "%s", dir);
    out->glue = ti->glue;
    out->max_len = max_len;
    st = task_paths(out, ti, err);
    if (!st) st = task_load_vocab(out, vocab_path, cased, err);
    GlueOptions o = glue_options(ti->glue, max_len);
    o.skip_bad_rows = skip_bad_rows;
    if (!st) st = task_load_splits(out, ti, &o, err);
    if (st) task_free(out);
    return st;
}

bool task_split_line(const TaskData *t, TaskSplit s, char *buf, size_t n)
{
    const TaskSplitInfo *in = &t->info[s];
    if (n) buf[0] = '\0';
    if (s >= TASK_SPLIT_COUNT || !in->present) return false;
    snprintf(buf, n,
             "%s %s: %lld rows from %s, %lld skipped, %lld truncated to %lld tokens; tokens per row max %d, "
             "mean %.1f%s%s",
             t->name, task_split_name(s), (long long)in->rows, in->path, (long long)in->skipped,
             (long long)in->truncated, (long long)t->max_len, in->longest, in->mean_len,
             in->skipped ? "; first skipped: " : "", in->first_bad);
    return true;
}

/* ---- the model check ---- */

/* "a 2-label classifier head" / "a regression head" / "a masked_lm head". */
static void head_words(const ModelSpec *spec, char *buf, size_t n)
{
    const SpecHead *h = &spec->head;
    if (h->kind != HEAD_SEQ_CLASSIFICATION)
        snprintf(buf, n, "a %s head", spec_head_kind_name(h->kind));
    else if (h->regression)
        snprintf(buf, n, "a regression head");
    else
        snprintf(buf, n, "a %lld-label classifier head", (long long)h->num_labels);
}

static HpcStatus check_head(const TaskData *t, const ModelSpec *spec, HpcError *err)
{
    const SpecHead *h = &spec->head;
    char has[96];
    head_words(spec, has, sizeof has);
    bool fits = h->kind == HEAD_SEQ_CLASSIFICATION && h->regression == t->regression &&
                (t->regression || h->num_labels == t->num_labels);
    if (fits) return HPC_OK;
    if (t->regression)
        return hpc_fail(err, HPC_ERR_INPUT,
                        "task %s is a regression task (one score per row) but model %s has %s; use `head "
                        "regression` in the .model file",
                        t->name, spec->name, has);
    return hpc_fail(err, HPC_ERR_INPUT,
                    "task %s has %lld labels but model %s has %s; use `head classifier { labels = %lld }` in the "
                    ".model file",
                    t->name, (long long)t->num_labels, spec->name, has, (long long)t->num_labels);
}

HpcStatus task_check_model(const TaskData *t, const ModelSpec *spec, HpcError *err)
{
    HpcStatus st = check_head(t, spec, err);
    if (st) return st;
    const SpecStack *s = &spec->stack;
    int64_t vocab = tokenizer_vocab_size(t->tok);
    if (vocab > s->vocab_size)
        return hpc_fail(err, HPC_ERR_INPUT,
                        "vocabulary %s has %lld tokens but model %s has %lld word embeddings; use the model's "
                        "own vocabulary (--vocab FILE)",
                        t->vocab_path, (long long)vocab, spec->name, (long long)s->vocab_size);
    if (t->max_len > s->max_positions - s->position_offset)
        return hpc_fail(err, HPC_ERR_INPUT,
                        "task %s is tokenized to %lld tokens per row but model %s has %lld positions; lower the "
                        "sequence length to at most %lld",
                        t->name, (long long)t->max_len, spec->name, (long long)(s->max_positions - s->position_offset),
                        (long long)(s->max_positions - s->position_offset));
    if (t->pair && s->type_vocab_size == 1)
        return hpc_fail(err, HPC_ERR_INPUT,
                        "task %s has sentence pairs (token types 0 and 1) but model %s has 1 token type; use a "
                        "model with token_types = 2",
                        t->name, spec->name);
    return HPC_OK;
}

/* ---- evaluation ---- */

/* Whether the task reports metric m (tasks.h). */
static bool task_reports(const TaskData *t, MetricKind m)
{
    if (t->regression) return m == METRIC_PEARSON || m == METRIC_SPEARMAN;
    if (m == METRIC_ACCURACY || m == t->main_metric) return true;
    return false;
}

static void scores_text(TaskScores *sc)
{
    size_t k = (size_t)snprintf(sc->text, sizeof sc->text, "%s %.4f", metric_name(sc->main), sc->main_value);
    for (int m = 0; m < METRIC_COUNT && k < sizeof sc->text; m++)
        if (m != (int)sc->main && !isnan(sc->v[m]))
            k += (size_t)snprintf(sc->text + k, sizeof sc->text - k, ", %s %.4f", metric_name(m), sc->v[m]);
}

static void scores_clear(const TaskData *t, TaskScores *out)
{
    memset(out, 0, sizeof *out);
    out->main = t->main_metric;
    out->main_value = NAN;
    for (int m = 0; m < METRIC_COUNT; m++) out->v[m] = NAN;
}

static HpcStatus eval_classes(const TaskData *t, const Dataset *d, const int32_t *pred, MetricSet *ms,
                              int64_t *n)
{
    int32_t *gold = malloc((size_t)(d->n ? d->n : 1) * sizeof *gold);
    if (!gold) return HPC_ERR_OOM;
    HpcStatus st = HPC_OK;
    bool nonfinite = false;
    for (int64_t i = 0; i < d->n; i++) {
        gold[i] = d->ex[i].label;
        *n += gold[i] >= 0;
        if (gold[i] >= 0 && pred[i] == TASK_PRED_NONFINITE) nonfinite = true;
        else if (gold[i] >= 0 && (pred[i] < 0 || pred[i] >= t->num_labels)) st = HPC_ERR_USAGE;
    }
    if (!st && *n == 0) st = HPC_ERR_INPUT;
    if (!st && nonfinite)
        for (int m = 0; m < METRIC_COUNT; m++) ms->v[m] = NAN;   /* NaN logits score as NaN */
    else if (!st) metrics_classification(pred, gold, d->n, t->main_metric, ms);
    free(gold);
    return st;
}

static HpcStatus eval_values(const TaskData *t, const Dataset *d, const float *pred, MetricSet *ms, int64_t *n)
{
    size_t sz = (size_t)(d->n ? d->n : 1) * sizeof(double);
    double *p = malloc(sz), *g = malloc(sz);
    HpcStatus st = p && g ? HPC_OK : HPC_ERR_OOM;
    bool nonfinite = false;
    for (int64_t i = 0; !st && i < d->n; i++) {
        p[i] = pred[i];
        g[i] = d->ex[i].target;
        nonfinite |= !isfinite(p[i]);
    }
    *n = d->n;
    if (!st && d->n == 0) st = HPC_ERR_INPUT;
    if (!st && nonfinite) {
        for (int m = 0; m < METRIC_COUNT; m++) ms->v[m] = NAN;   /* ranks of NaN would look finite */
        free(p);
        free(g);
        return HPC_OK;
    }
    if (!st) metrics_regression(p, g, d->n, t->main_metric, ms);
    if (!st && isnan(ms->v[METRIC_SPEARMAN]) && !isnan(ms->v[METRIC_PEARSON])) st = HPC_ERR_OOM;
    free(p);
    free(g);
    return st;
}

HpcStatus task_evaluate(const TaskData *t, const Dataset *split, const int32_t *pred_labels,
                        const float *pred_values, TaskScores *out)
{
    scores_clear(t, out);
    if (t->regression ? !pred_values : !pred_labels) return HPC_ERR_USAGE;
    MetricSet ms;
    int64_t n = 0;
    HpcStatus st = t->regression ? eval_values(t, split, pred_values, &ms, &n)
                                 : eval_classes(t, split, pred_labels, &ms, &n);
    if (st) return st;
    for (int m = 0; m < METRIC_COUNT; m++) out->v[m] = task_reports(t, m) ? ms.v[m] : NAN;
    out->n = n;
    out->main_value = out->v[out->main];
    scores_text(out);
    return HPC_OK;
}

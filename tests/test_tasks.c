/* tests/test_tasks.c — GLUE tasks for `hpc run --task`: loading (real CoLA
 * from data/, pair tasks built from the excerpts in tests/data/glue), the
 * messages for missing data and a model that does not fit, the evaluation
 * metrics against hand-computed values and an independent confusion matrix,
 * and the exact content of prediction files. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/predict.h"
#include "data/tasks.h"

#define VOCAB "data/vocab/bert-base-uncased-vocab.txt"

static const char *path_of(const char *rel)
{
    static char buf[8][1024];
    static int k;
    const char *root = getenv("HPC_ROOT");
    char *b = buf[k++ % 8];
    snprintf(b, sizeof buf[0], "%s/%s", root ? root : ".", rel);
    return b;
}

/* ---- files ---- */

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    s[n] = '\0';
    if (len) *len = (size_t)n;
    return s;
}

static void spit(const char *dir, const char *name, const char *text)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    cr_assert(f, "create %s", p);
    fputs(text, f);
    fclose(f);
}

static void copy_in(const char *dir, const char *name, const char *rel)
{
    char *s = slurp(path_of(rel), NULL);
    spit(dir, name, s);
    free(s);
}

static char tmp_dir[256];

static const char *make_tmp(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/hpc-test-tasks-XXXXXX");
    cr_assert(mkdtemp(tmp_dir), "mkdtemp");
    return tmp_dir;
}

static void drop_tmp(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    cr_assert_eq(system(cmd), 0);
}

/* Rows of a GLUE file the way a person counts them: lines, minus the header,
 * the last line counted even without its newline. */
static int64_t file_rows(const char *path, bool header)
{
    size_t n;
    char *s = slurp(path, &n);
    int64_t lines = 0;
    for (size_t i = 0; i < n; i++) lines += s[i] == '\n';
    if (n && s[n - 1] != '\n') lines++;
    free(s);
    return lines - header;
}

/* The value of column col on line row of a file (both 0-based; line 0 is a header). */
static void file_cell(const char *path, int row, int col, char *out, size_t n)
{
    char *s = slurp(path, NULL), *line = s;
    for (int r = 0; r < row; r++) line = strchr(line, '\n') + 1;
    for (int c = 0; c < col; c++) line = strchr(line, '\t') + 1;
    size_t len = strcspn(line, "\t\r\n");
    snprintf(out, n, "%.*s", (int)len, line);
    free(s);
}

static bool has_type1(const Example *ex)
{
    for (int32_t i = 0; i < ex->len; i++)
        if (ex->type_ids[i] == 1) return true;
    return false;
}

/* ---- loading ---- */

/* The GLUE tasks shipped in data/ (data/README.md) load by their default
 * folder with every row and both classes (counts from the README). */
Test(tasks, shipped_sst2_mrpc_rte_load, .timeout = 120)
{
    static const struct { const char *name, *dir; int64_t train, dev, train_ones; } want[] = {
        {"sst2", "data/sst2", 67349, 872, 37569},
        {"mrpc", "data/mrpc", 3668, 408, 2474},
        {"rte", "data/rte", 2490, 277, 1241},   /* not_entailment = 1 */
    };
    for (int i = 0; i < 3; i++) {
        TaskData t;
        HpcError err;
        cr_assert_eq(task_load(want[i].name, path_of(want[i].dir), path_of(VOCAB), false, 128, false, &t, &err),
                     HPC_OK, "%s: %s", want[i].name, err.msg);
        cr_expect_eq(t.train.n, want[i].train, "%s train", want[i].name);
        cr_expect_eq(t.dev.n, want[i].dev, "%s dev", want[i].name);
        int64_t ones = 0;
        for (int64_t r = 0; r < t.train.n; r++) ones += t.train.ex[r].label == 1;
        cr_expect_eq(ones, want[i].train_ones, "%s train label 1", want[i].name);
        cr_expect(!t.info[TASK_SPLIT_TEST].present, "%s: no test split shipped", want[i].name);
        task_free(&t);
    }
}

Test(tasks, cola_counts_equal_the_files)
{
    TaskData t;
    HpcError err;
    cr_assert_eq(task_load("cola", path_of("data/cola"), path_of(VOCAB), false, 128, false, &t, &err), HPC_OK, "%s",
                 err.msg);
    int64_t train = file_rows(path_of("data/cola/train.tsv"), false);
    int64_t dev = file_rows(path_of("data/cola/dev.tsv"), false);
    int64_t test = file_rows(path_of("data/cola/test.tsv"), true);
    cr_expect_eq(train, 8551);
    cr_expect_eq(dev, 1043);
    cr_expect_eq(test, 1063);
    cr_expect_eq(t.train.n, train);
    cr_expect_eq(t.dev.n, dev);
    cr_expect_eq(t.test.n, test);
    cr_expect_eq(t.info[TASK_SPLIT_TRAIN].rows, train);
    cr_expect_eq(t.info[TASK_SPLIT_TRAIN].lines, train);
    cr_expect_eq(t.info[TASK_SPLIT_TRAIN].skipped, 0);
    cr_expect(t.info[TASK_SPLIT_TEST].present);
    cr_expect_eq(t.num_labels, 2);
    cr_expect(!t.regression && !t.pair);
    cr_expect_eq(t.main_metric, METRIC_MCC);
    int64_t ones = 0, tokens = 0;
    for (int64_t i = 0; i < t.train.n; i++) ones += t.train.ex[i].label == 1, tokens += t.train.ex[i].len;
    cr_expect_eq(ones, 6023, "acceptable rows in CoLA train (data/README.md)");
    for (int64_t i = 0; i < t.test.n; i++) cr_expect_eq(t.test.ex[i].label, -1);
    cr_expect_eq(t.info[TASK_SPLIT_TRAIN].longest, dataset_max_len(&t.train));
    cr_expect_float_eq(t.info[TASK_SPLIT_TRAIN].mean_len, (double)tokens / (double)train, 1e-12);
    char line[512], want[512];
    cr_expect(task_split_line(&t, TASK_SPLIT_DEV, line, sizeof line));
    snprintf(want, sizeof want, "cola dev: 1043 rows from %s, 0 skipped, 0 truncated to 128 tokens; tokens per row max %d, mean %.1f",
             path_of("data/cola/dev.tsv"), t.info[TASK_SPLIT_DEV].longest, t.info[TASK_SPLIT_DEV].mean_len);
    cr_expect_str_eq(line, want);
    task_free(&t);
    cr_expect_eq(t.train.n, 0);
}

Test(tasks, defaults_are_relative_to_the_working_directory)
{
    cr_assert_eq(chdir(path_of("")), 0);
    TaskData t;
    HpcError err;
    cr_assert_eq(task_load("CoLA", NULL, NULL, false, 16, false, &t, &err), HPC_OK, "%s", err.msg);
    cr_expect_str_eq(t.data_dir, "data/cola");
    cr_expect_str_eq(t.vocab_path, VOCAB);
    cr_expect_str_eq(t.info[TASK_SPLIT_TRAIN].path, "data/cola/train.tsv");
    cr_expect_gt(t.info[TASK_SPLIT_TRAIN].truncated, 0, "max_len 16 cuts some CoLA rows");
    cr_expect_eq(dataset_max_len(&t.train), 16);
    task_free(&t);
}

Test(tasks, rte_pairs_from_excerpts)
{
    const char *dir = make_tmp();
    copy_in(dir, "train.tsv", "tests/data/glue/rte_dev_head.tsv");
    copy_in(dir, "dev.tsv", "tests/data/glue/rte_dev_head.tsv");
    spit(dir, "test.tsv", "index\tsentence1\tsentence2\n0\tA man sleeps.\tA person rests.\n1\tIt rains.\tThe sun is out.\n");
    TaskData t;
    HpcError err;
    cr_assert_eq(task_load("rte", dir, path_of(VOCAB), false, 128, false, &t, &err), HPC_OK, "%s", err.msg);
    const char *src = path_of("tests/data/glue/rte_dev_head.tsv");
    cr_expect_eq(t.train.n, file_rows(src, true));
    cr_expect_eq(t.dev.n, 4);
    cr_expect_eq(t.test.n, 2);
    cr_expect(t.pair && !t.regression);
    cr_expect_eq(t.num_labels, 2);
    cr_expect_eq(t.main_metric, METRIC_ACCURACY);
    for (int i = 0; i < 4; i++) {
        char label[64];
        file_cell(src, i + 1, 3, label, sizeof label);
        cr_expect_eq(t.dev.ex[i].label, strcmp(label, "entailment") ? 1 : 0, "row %d (%s)", i, label);
        cr_expect(has_type1(&t.dev.ex[i]));
    }
    TokEncoding enc = {0};
    cr_assert_eq(tokenizer_encode(t.tok, "A man sleeps.", "A person rests.", 128, &enc, &err), HPC_OK);
    cr_expect_eq(t.test.ex[0].len, enc.len);
    cr_expect(!memcmp(t.test.ex[0].ids, enc.ids, (size_t)enc.len * 4));
    cr_expect(!memcmp(t.test.ex[0].type_ids, enc.type_ids, (size_t)enc.len * 4));
    tok_encoding_free(&enc);
    task_free(&t);
    drop_tmp();
}

Test(tasks, mrpc_without_test_file)
{
    const char *dir = make_tmp();
    copy_in(dir, "train.tsv", "tests/data/glue/mrpc_dev_head.tsv");
    copy_in(dir, "dev.tsv", "tests/data/glue/mrpc_dev_head.tsv");
    TaskData t;
    HpcError err;
    cr_assert_eq(task_load("mrpc", dir, path_of(VOCAB), false, 64, false, &t, &err), HPC_OK, "%s", err.msg);
    const char *src = path_of("tests/data/glue/mrpc_dev_head.tsv");
    cr_expect_eq(t.dev.n, file_rows(src, true));
    cr_expect(!t.info[TASK_SPLIT_TEST].present);
    cr_expect_eq(t.test.n, 0);
    char line[512];
    cr_expect(!task_split_line(&t, TASK_SPLIT_TEST, line, sizeof line));
    cr_expect_str_eq(line, "");
    for (int i = 0; i < t.dev.n; i++) {
        char q[8];
        file_cell(src, i + 1, 0, q, sizeof q);
        cr_expect_eq(t.dev.ex[i].label, atoi(q));
    }
    cr_expect_eq(t.main_metric, METRIC_F1);
    int32_t pred[4] = {0, 0, 0, 0};
    cr_expect_eq(predict_write_glue(&t, pred, NULL, "/tmp/never-written.tsv", &err), HPC_ERR_USAGE);
    char want[1024];
    snprintf(want, sizeof want, "task mrpc has no test split (%s/test.tsv not found); nothing to predict", dir);
    cr_expect_str_eq(err.msg, want);
    task_free(&t);
    drop_tmp();
}

Test(tasks, mnli_matched_and_mismatched)
{
    const char *dir = make_tmp();
    copy_in(dir, "train.tsv", "tests/data/glue/mnli_small.tsv");
    copy_in(dir, "dev_matched.tsv", "tests/data/glue/mnli_small.tsv");
    TaskData t;
    HpcError err;
    cr_assert_eq(task_load("mnli", dir, path_of(VOCAB), false, 64, false, &t, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(t.num_labels, 3);
    cr_expect_eq(t.dev.ex[2].label, 2, "contradiction");
    task_free(&t);
    cr_expect_eq(task_load("mnli-mm", dir, path_of(VOCAB), false, 64, false, &t, &err), HPC_ERR_IO);
    char want[1024];
    snprintf(want, sizeof want,
             "task mnli-mm: cannot open %s/dev_mismatched.tsv: No such file or directory; copy GLUE's MNLI "
             "(the glue_data/MNLI folder of the GLUE download, gluebenchmark.com/tasks) into "
             "%s/ (train.tsv, dev_mismatched.tsv; test_mismatched.tsv optional) or point --data at a folder that "
             "holds them",
             dir, dir);
    cr_expect_str_eq(err.msg, want);
    drop_tmp();
}

Test(tasks, missing_directory_message)
{
    TaskData t;
    HpcError err;
    cr_expect_eq(task_load("cola", "/nonexistent/glue/CoLA", path_of(VOCAB), false, 128, false, &t, &err),
                 HPC_ERR_IO);
    cr_expect_str_eq(err.msg,
                     "task cola: cannot use data directory /nonexistent/glue/CoLA: no such directory; copy GLUE's "
                     "CoLA (the glue_data/CoLA folder of the GLUE download, gluebenchmark.com/tasks) into "
                     "/nonexistent/glue/CoLA/ (train.tsv, dev.tsv; test.tsv optional) or point --data at "
                     "a folder that holds them");
    cr_assert_eq(chdir(make_tmp()), 0);
    cr_expect_eq(task_load("sst-2", NULL, NULL, false, 128, false, &t, &err), HPC_ERR_IO);
    cr_expect_str_eq(err.msg,
                     "task sst2: cannot use data directory data/sst2: no such directory; copy GLUE's SST-2 "
                     "(the glue_data/SST-2 folder of the GLUE download, gluebenchmark.com/tasks) into "
                     "data/sst2/ (train.tsv, dev.tsv; test.tsv optional) or point --data at a folder that holds them");
    cr_expect_eq(t.tok, NULL);
    drop_tmp();
}

Test(tasks, missing_vocab_and_unknown_task)
{
    const char *dir = make_tmp();
    copy_in(dir, "train.tsv", "tests/data/glue/rte_dev_head.tsv");
    copy_in(dir, "dev.tsv", "tests/data/glue/rte_dev_head.tsv");
    TaskData t;
    HpcError err;
    cr_assert_eq(chdir(dir), 0);
    cr_expect_eq(task_load("rte", ".", NULL, false, 128, false, &t, &err), HPC_ERR_IO);
    cr_expect(strstr(err.msg, "data/vocab/bert-base-uncased-vocab.txt"), "%s", err.msg);
    cr_expect(strstr(err.msg, "pass --vocab FILE"), "%s", err.msg);
    cr_expect_eq(task_load("squad", NULL, NULL, false, 128, false, &t, &err), HPC_ERR_USAGE);
    cr_expect_str_eq(err.msg, "unknown task 'squad'; tasks: cola, sst2, mrpc, rte, qnli, qqp, stsb, mnli, mnli-mm, "
                              "wnli, tsv:DIR");
    cr_expect_eq(task_load("rte", ".", path_of(VOCAB), false, 2, false, &t, &err), HPC_ERR_USAGE);
    cr_expect_str_eq(err.msg, "task rte: max length 2 is too small (at least 3)");
    drop_tmp();
}

Test(tasks, skip_bad_rows)
{
    const char *dir = make_tmp();
    copy_in(dir, "train.tsv", "tests/data/glue/cola_bad_label.tsv");
    copy_in(dir, "dev.tsv", "tests/data/glue/cola_bad_label.tsv");
    TaskData t;
    HpcError err;
    cr_expect_eq(task_load("cola", dir, path_of(VOCAB), false, 64, false, &t, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "train.tsv:3: label 'yes' is not an integer in 0..1"), "%s", err.msg);
    cr_assert_eq(task_load("cola", dir, path_of(VOCAB), false, 64, true, &t, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(t.train.n, 3);
    cr_expect_eq(t.info[TASK_SPLIT_TRAIN].lines, 5);
    cr_expect_eq(t.info[TASK_SPLIT_TRAIN].skipped, 2);
    char line[1024];
    task_split_line(&t, TASK_SPLIT_TRAIN, line, sizeof line);
    cr_expect(strstr(line, ": 3 rows from ") && strstr(line, ", 2 skipped, "), "%s", line);
    cr_expect(strstr(line, "; first skipped: ") && strstr(line, "train.tsv:3: label 'yes'"), "%s", line);
    task_free(&t);
    /* a bad test row is never skipped */
    spit(dir, "test.tsv", "index\tsentence\n0\tFine.\n1\t  \n");
    cr_expect_eq(task_load("cola", dir, path_of(VOCAB), false, 64, true, &t, &err), HPC_ERR_INPUT);
    char want[1024];
    snprintf(want, sizeof want,
             "%s/test.tsv: 1 bad rows (first: %s/test.tsv:3: empty text in column 2); test rows are never skipped, "
             "since every index needs a prediction: fix the file",
             dir, dir);
    cr_expect_str_eq(err.msg, want);
    drop_tmp();
}

Test(tasks, tsv_directory)
{
    const char *dir = make_tmp();
    spit(dir, "train.tsv", "id\ttext_a\ttext_b\tlabel\n1\tOne.\tTwo.\t0\n2\tThree.\tFour.\t2\n");
    spit(dir, "dev.tsv", "id\ttext_a\ttext_b\tlabel\n1\tFive.\tSix.\t1\n");
    spit(dir, "test.tsv", "id\ttext_a\ttext_b\n7\tSeven.\tEight.\n");
    char task[300];
    snprintf(task, sizeof task, "tsv:%s", dir);
    TaskData t;
    HpcError err;
    cr_assert_eq(task_load(task, NULL, path_of(VOCAB), false, 32, false, &t, &err), HPC_OK, "%s", err.msg);
    cr_expect_str_eq(t.name, "tsv");
    cr_expect_eq(t.num_labels, 3);
    cr_expect_eq(t.dev.num_labels, 3);
    cr_expect(t.pair && has_type1(&t.test.ex[0]));
    cr_expect_eq(t.test.n, 1);
    cr_expect_eq(t.main_metric, METRIC_ACCURACY);
    task_free(&t);
    cr_expect_eq(task_load(task, "data/x", path_of(VOCAB), false, 32, false, &t, &err), HPC_ERR_USAGE);
    spit(dir, "train.tsv", "sentence\tscore\nOne.\t0.5\nTwo.\t4.25\n");
    spit(dir, "dev.tsv", "sentence\tscore\nThree.\t1\n");
    spit(dir, "test.tsv", "sentence\nFour.\n");
    cr_assert_eq(task_load(task, NULL, path_of(VOCAB), false, 32, false, &t, &err), HPC_OK, "%s", err.msg);
    cr_expect(t.regression && !t.pair);
    cr_expect_eq(t.num_labels, 1);
    cr_expect_float_eq(t.train.ex[1].target, 4.25f, 0);
    cr_expect_eq(t.main_metric, METRIC_PEARSON);
    task_free(&t);
    spit(dir, "train.tsv", "words\tlabel\nOne.\t0\n");
    cr_expect_eq(task_load(task, NULL, path_of(VOCAB), false, 32, false, &t, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "train.tsv:1: a tsv:DIR task needs a header with a text column"), "%s", err.msg);
    cr_expect(strstr(err.msg, "found other names"), "%s", err.msg);
    spit(dir, "train.tsv", "");
    cr_expect_eq(task_load(task, NULL, path_of(VOCAB), false, 32, false, &t, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "found no header"), "%s", err.msg);
    /* a folder where a split's file belongs is named as one, not read as an
     * empty file ("found no header") */
    char path[600];
    snprintf(path, sizeof path, "%s/train.tsv", dir);
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(mkdir(path, 0700), 0);
    cr_expect_eq(task_load(task, NULL, path_of(VOCAB), false, 32, false, &t, &err), HPC_ERR_IO);
    char want[700];
    snprintf(want, sizeof want, "task tsv: %s is a folder, not a file; a tsv:DIR task needs", path);
    cr_expect(strstr(err.msg, want), "%s", err.msg);
    cr_assert_eq(rmdir(path), 0);
    spit(dir, "train.tsv", "sentence\tlabel\nOne.\t0\n");
    snprintf(path, sizeof path, "%s/test.tsv", dir);   /* the optional split too */
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(mkdir(path, 0700), 0);
    cr_expect_eq(task_load(task, NULL, path_of(VOCAB), false, 32, false, &t, &err), HPC_ERR_IO);
    cr_expect(strstr(err.msg, "test.tsv is a folder, not a file"), "%s", err.msg);
    drop_tmp();
}

/* ---- the model check ---- */

static ModelSpec tiny(int64_t labels, bool regression)
{
    ModelSpec s;
    spec_defaults(&s);
    snprintf(s.name, sizeof s.name, "bert_tiny");
    s.head.num_labels = labels;
    s.head.regression = regression;
    return s;
}

Test(tasks, model_must_fit_the_task)
{
    const char *dir = make_tmp();
    copy_in(dir, "train.tsv", "tests/data/glue/mnli_small.tsv");
    copy_in(dir, "dev_matched.tsv", "tests/data/glue/mnli_small.tsv");
    TaskData t;
    HpcError err;
    cr_assert_eq(task_load("mnli", dir, path_of(VOCAB), false, 128, false, &t, &err), HPC_OK, "%s", err.msg);
    ModelSpec s = tiny(2, false);
    cr_expect_eq(task_check_model(&t, &s, &err), HPC_ERR_INPUT);
    cr_expect_str_eq(err.msg, "task mnli has 3 labels but model bert_tiny has a 2-label classifier head; use `head "
                              "classifier { labels = 3 }` in the .model file");
    s = tiny(1, true);
    cr_expect_eq(task_check_model(&t, &s, &err), HPC_ERR_INPUT);
    cr_expect_str_eq(err.msg, "task mnli has 3 labels but model bert_tiny has a regression head; use `head "
                              "classifier { labels = 3 }` in the .model file");
    s = tiny(3, false);
    s.head.kind = HEAD_MASKED_LM;
    cr_expect_eq(task_check_model(&t, &s, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "model bert_tiny has a masked_lm head;"), "%s", err.msg);
    s = tiny(3, false);
    cr_expect_eq(task_check_model(&t, &s, &err), HPC_OK, "%s", err.msg);
    s.stack.max_positions = 64;
    cr_expect_eq(task_check_model(&t, &s, &err), HPC_ERR_INPUT);
    cr_expect_str_eq(err.msg, "task mnli is tokenized to 128 tokens per row but model bert_tiny has 64 positions; "
                              "lower the sequence length to at most 64");
    s = tiny(3, false);
    s.stack.vocab_size = 1000;
    cr_expect_eq(task_check_model(&t, &s, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "has 30522 tokens but model bert_tiny has 1000 word embeddings"), "%s", err.msg);
    s = tiny(3, false);
    s.stack.type_vocab_size = 1;
    cr_expect_eq(task_check_model(&t, &s, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "task mnli has sentence pairs"), "%s", err.msg);
    task_free(&t);

    copy_in(dir, "train.tsv", "tests/data/glue/stsb_small.tsv");
    copy_in(dir, "dev.tsv", "tests/data/glue/stsb_small.tsv");
    cr_assert_eq(task_load("stsb", dir, path_of(VOCAB), false, 128, false, &t, &err), HPC_OK, "%s", err.msg);
    s = tiny(2, false);
    cr_expect_eq(task_check_model(&t, &s, &err), HPC_ERR_INPUT);
    cr_expect_str_eq(err.msg, "task stsb is a regression task (one score per row) but model bert_tiny has a "
                              "2-label classifier head; use `head regression` in the .model file");
    s = tiny(1, true);
    cr_expect_eq(task_check_model(&t, &s, &err), HPC_OK, "%s", err.msg);
    task_free(&t);
    drop_tmp();
}

/* ---- evaluation ---- */

/* A TaskData with only what task_evaluate and predict read, and a split of
 * n rows with gold labels (or targets). */
static void fake_task(TaskData *t, GlueTask g, const char *name, const int32_t *gold, const float *target, int64_t n)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->glue = g;
    t->regression = glue_is_regression(g);
    t->num_labels = glue_num_labels(g);
    t->main_metric = metric_main(g, t->regression);
    dataset_init(&t->dev, "dev");
    dataset_init(&t->test, "test");
    int32_t ids[3] = {101, 2000, 102};
    HpcError err;
    for (int64_t i = 0; i < n; i++) {
        cr_assert_eq(dataset_add(&t->dev, ids, NULL, 3, gold ? gold[i] : -1, target ? target[i] : 0, &err), HPC_OK);
        cr_assert_eq(dataset_add(&t->test, ids, NULL, 3, -1, 0, &err), HPC_OK);
    }
    t->info[TASK_SPLIT_TEST].present = true;
}

Test(tasks, evaluate_cola_by_hand)
{
    /* TP 4 (rows 0 4 6 7), FN 1 (row 1), FP 1 (row 3), TN 2 (rows 2 5); row 8 unlabelled.
     * MCC = (4*2 - 1*1) / sqrt(5*5*3*3) = 7/15; accuracy 6/8; F1 = 8/10 (not reported for CoLA). */
    int32_t gold[9] = {1, 1, 0, 0, 1, 0, 1, 1, -1};
    int32_t pred[9] = {1, 0, 0, 1, 1, 0, 1, 1, 0};
    TaskData t;
    fake_task(&t, GLUE_COLA, "cola", gold, NULL, 9);
    TaskScores sc;
    cr_assert_eq(task_evaluate(&t, &t.dev, pred, NULL, &sc), HPC_OK);
    cr_expect_eq(sc.main, METRIC_MCC);
    cr_expect_float_eq(sc.main_value, 7.0 / 15.0, 1e-12);
    cr_expect_float_eq(sc.v[METRIC_ACCURACY], 0.75, 1e-12);
    cr_expect(isnan(sc.v[METRIC_F1]) && isnan(sc.v[METRIC_PEARSON]));
    cr_expect_eq(sc.n, 8);
    cr_expect_str_eq(sc.text, "mcc 0.4667, accuracy 0.7500");
    task_free(&t);

    fake_task(&t, GLUE_MRPC, "mrpc", gold, NULL, 9);
    cr_assert_eq(task_evaluate(&t, &t.dev, pred, NULL, &sc), HPC_OK);
    cr_expect_float_eq(sc.main_value, 0.8, 1e-12);
    cr_expect(isnan(sc.v[METRIC_MCC]));
    cr_expect_str_eq(sc.text, "f1 0.8000, accuracy 0.7500");
    task_free(&t);
}

Test(tasks, evaluate_errors)
{
    int32_t gold[3] = {-1, -1, -1}, pred[3] = {0, 1, 0}, bad[3] = {0, 3, 1};
    TaskData t;
    fake_task(&t, GLUE_RTE, "rte", gold, NULL, 3);
    TaskScores sc;
    cr_expect_eq(task_evaluate(&t, &t.dev, pred, NULL, &sc), HPC_ERR_INPUT, "no labelled rows");
    cr_expect(isnan(sc.main_value));
    cr_expect_eq(task_evaluate(&t, &t.dev, NULL, NULL, &sc), HPC_ERR_USAGE);
    t.dev.ex[1].label = 1;
    cr_expect_eq(task_evaluate(&t, &t.dev, bad, NULL, &sc), HPC_ERR_USAGE, "class 3 of 2");
    cr_expect_eq(task_evaluate(&t, &t.dev, pred, NULL, &sc), HPC_OK);
    cr_expect_str_eq(sc.text, "accuracy 1.0000");
    task_free(&t);
}

Test(tasks, evaluate_mnli_random_against_counts)
{
    enum { N = 997 };
    int32_t gold[N], pred[N];
    srand(1234);
    int64_t right = 0;
    for (int i = 0; i < N; i++) {
        gold[i] = rand() % 3;
        pred[i] = rand() % 4 == 0 ? (gold[i] + 1 + rand() % 2) % 3 : gold[i];
        right += pred[i] == gold[i];
    }
    TaskData t;
    fake_task(&t, GLUE_MNLI, "mnli", gold, NULL, N);
    TaskScores sc;
    cr_assert_eq(task_evaluate(&t, &t.dev, pred, NULL, &sc), HPC_OK);
    cr_expect(right > N / 2 && right < N, "the data has both right and wrong rows");
    cr_expect_float_eq(sc.main_value, (double)right / N, 1e-12);
    cr_expect(isnan(sc.v[METRIC_MCC]) && isnan(sc.v[METRIC_F1]));
    task_free(&t);
}

Test(tasks, evaluate_qqp_random_against_confusion_matrix)
{
    enum { N = 1500 };
    int32_t gold[N], pred[N];
    srand(99);
    double tp = 0, tn = 0, fp = 0, fn = 0;
    for (int i = 0; i < N; i++) {
        gold[i] = rand() % 3 == 0;
        pred[i] = rand() % 5 == 0 ? !gold[i] : gold[i];
        tp += pred[i] && gold[i];
        tn += !pred[i] && !gold[i];
        fp += pred[i] && !gold[i];
        fn += !pred[i] && gold[i];
    }
    TaskData t;
    fake_task(&t, GLUE_QQP, "qqp", gold, NULL, N);
    TaskScores sc;
    cr_assert_eq(task_evaluate(&t, &t.dev, pred, NULL, &sc), HPC_OK);
    double f1 = 2 * tp / (2 * tp + fp + fn), acc = (tp + tn) / N;
    cr_expect(tp > 0 && fp > 0 && fn > 0 && tn > 0);
    cr_expect(fabs(sc.main_value - f1) <= 1e-12 * f1, "f1 %.15f vs %.15f", sc.main_value, f1);
    cr_expect(fabs(sc.v[METRIC_ACCURACY] - acc) <= 1e-12 * acc);
    task_free(&t);
    t = (TaskData){0};
    fake_task(&t, GLUE_COLA, "cola", gold, NULL, N);
    cr_assert_eq(task_evaluate(&t, &t.dev, pred, NULL, &sc), HPC_OK);
    double mcc = (tp * tn - fp * fn) / sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn));
    cr_expect(fabs(sc.main_value - mcc) <= 1e-12 * fabs(mcc), "mcc %.15f vs %.15f", sc.main_value, mcc);
    task_free(&t);
}

Test(tasks, evaluate_stsb_by_hand)
{
    /* pred 1 2 3 4, gold 1 3 2 5: cov 5.5/4, var 5/4 and 8.75/4, pearson 5.5 / sqrt(43.75);
     * ranks of gold 1 3 2 4: spearman 1 - 6*2 / (4*15) = 0.8. */
    float gold[4] = {1, 3, 2, 5}, pred[4] = {1, 2, 3, 4};
    TaskData t;
    fake_task(&t, GLUE_STSB, "stsb", NULL, gold, 4);
    TaskScores sc;
    cr_expect_eq(task_evaluate(&t, &t.dev, NULL, NULL, &sc), HPC_ERR_USAGE);
    cr_assert_eq(task_evaluate(&t, &t.dev, NULL, pred, &sc), HPC_OK);
    cr_expect_eq(sc.main, METRIC_PEARSON);
    cr_expect_float_eq(sc.main_value, 5.5 / sqrt(43.75), 1e-7);
    cr_expect_float_eq(sc.v[METRIC_SPEARMAN], 0.8, 1e-12);
    cr_expect(isnan(sc.v[METRIC_ACCURACY]));
    cr_expect_str_eq(sc.text, "pearson 0.8315, spearman 0.8000");
    pred[2] = NAN;
    cr_assert_eq(task_evaluate(&t, &t.dev, NULL, pred, &sc), HPC_OK);
    cr_expect(isnan(sc.main_value), "NaN never passes");
    task_free(&t);
}

/* ---- predictions ---- */

static void expect_file(const char *path, const char *want)
{
    char *got = slurp(path, NULL);
    cr_expect_str_eq(got, want);
    free(got);
}

Test(tasks, predictions_per_task)
{
    const char *dir = make_tmp();
    char path[512];
    snprintf(path, sizeof path, "%s/out.tsv", dir);
    HpcError err;
    TaskData t;
    int32_t pred[4] = {1, 0, 0, 1}, pred3[4] = {2, 0, 1, 0};

    fake_task(&t, GLUE_COLA, "cola", NULL, NULL, 4);
    cr_assert_eq(predict_write_glue(&t, pred, NULL, path, &err), HPC_OK, "%s", err.msg);
    expect_file(path, "index\tprediction\n0\t1\n1\t0\n2\t0\n3\t1\n");
    cr_expect_str_eq(predict_glue_filename(&t), "CoLA.tsv");
    task_free(&t);

    fake_task(&t, GLUE_RTE, "rte", NULL, NULL, 4);
    cr_assert_eq(predict_write_glue(&t, pred, NULL, path, &err), HPC_OK, "%s", err.msg);
    expect_file(path, "index\tprediction\n0\tnot_entailment\n1\tentailment\n2\tentailment\n3\tnot_entailment\n");
    task_free(&t);

    fake_task(&t, GLUE_MNLI, "mnli-mm", NULL, NULL, 4);
    cr_assert_eq(predict_write_glue(&t, pred3, NULL, path, &err), HPC_OK, "%s", err.msg);
    expect_file(path, "index\tprediction\n0\tcontradiction\n1\tentailment\n2\tneutral\n3\tentailment\n");
    cr_expect_str_eq(predict_glue_filename(&t), "MNLI-mm.tsv");
    cr_expect_eq(predict_write_glue(&t, pred3, NULL, "/nonexistent/dir/MNLI.tsv", &err), HPC_ERR_IO);
    /* a class out of range writes nothing: the old file stays */
    pred3[1] = 3;
    cr_expect_eq(predict_write_glue(&t, pred3, NULL, path, &err), HPC_ERR_USAGE);
    cr_expect_str_eq(err.msg, "prediction for row 1 is class 3, outside 0..2");
    expect_file(path, "index\tprediction\n0\tcontradiction\n1\tentailment\n2\tneutral\n3\tentailment\n");
    task_free(&t);

    float v[4] = {-0.2f, 2.71828f, 5.4f, -0.0f};
    fake_task(&t, GLUE_STSB, "stsb", NULL, NULL, 4);
    cr_expect_eq(predict_write_glue(&t, NULL, NULL, path, &err), HPC_ERR_USAGE);
    cr_assert_eq(predict_write_glue(&t, NULL, v, path, &err), HPC_OK, "%s", err.msg);
    expect_file(path, "index\tprediction\n0\t0.000\n1\t2.718\n2\t5.000\n3\t0.000\n");
    cr_expect_str_eq(predict_glue_filename(&t), "STS-B.tsv");
    v[2] = NAN;
    cr_expect_eq(predict_write_glue(&t, NULL, v, path, &err), HPC_ERR_NUMERIC);
    cr_expect_str_eq(err.msg, "prediction for row 2 is not finite (nan); nothing written");
    expect_file(path, "index\tprediction\n0\t0.000\n1\t2.718\n2\t5.000\n3\t0.000\n");
    task_free(&t);
    drop_tmp();
}

Test(tasks, predictions_from_a_loaded_task)
{
    const char *dir = make_tmp();
    copy_in(dir, "train.tsv", "tests/data/glue/rte_dev_head.tsv");
    copy_in(dir, "dev.tsv", "tests/data/glue/rte_dev_head.tsv");
    spit(dir, "test.tsv", "index\tsentence1\tsentence2\n0\tA.\tB.\n1\tC.\tD.\n2\tE.\tF.\n");
    TaskData t;
    HpcError err;
    cr_assert_eq(task_load("rte", dir, path_of(VOCAB), false, 32, false, &t, &err), HPC_OK, "%s", err.msg);
    int32_t pred[3] = {0, 1, 1};
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, predict_glue_filename(&t));
    cr_assert_eq(predict_write_glue(&t, pred, NULL, path, &err), HPC_OK, "%s", err.msg);
    expect_file(path, "index\tprediction\n0\tentailment\n1\tnot_entailment\n2\tnot_entailment\n");
    task_free(&t);
    drop_tmp();
}

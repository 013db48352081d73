/* tests/test_glue.c — the task readers on real GLUE files (data/cola, and
 * short excerpts in tests/data/glue) and on broken files, one fault each. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/glue.h"

static Tokenizer *tok;

static const char *path_of(const char *rel)
{
    static char buf[8][1024];
    static int k;
    const char *root = getenv("HPC_ROOT");
    char *b = buf[k++ % 8];
    snprintf(b, sizeof buf[0], "%s/%s", root ? root : ".", rel);
    return b;
}

static void setup(void)
{
    HpcError err;
    cr_assert_eq(tokenizer_load(path_of("data/vocab/bert-base-uncased-vocab.txt"), true, &tok, &err), HPC_OK,
                 "%s", err.msg);
}

static void teardown(void) { tokenizer_free(tok); }

TestSuite(glue, .init = setup, .fini = teardown);

/* Reads rel with opt; returns the status and leaves the rows in *d. */
static HpcStatus read_with(const char *rel, const GlueOptions *o, Dataset *d, GlueReport *rep, HpcError *err)
{
    dataset_init(d, rel);
    return glue_read(path_of(rel), o, tok, d, rep, err);
}

static HpcStatus read_task(const char *rel, GlueTask task, Dataset *d, HpcError *err)
{
    GlueOptions o = glue_options(task, 128);
    return read_with(rel, &o, d, NULL, err);
}

/* The row's ids equal tokenizer_encode(a, b). */
static void expect_row(const Example *ex, const char *a, const char *b, int32_t label)
{
    TokEncoding enc = {0};
    HpcError err;
    cr_assert_eq(tokenizer_encode(tok, a, b, 128, &enc, &err), HPC_OK);
    cr_expect_eq(ex->len, enc.len, "length of '%s'", a);
    cr_expect(ex->len == enc.len && !memcmp(ex->ids, enc.ids, (size_t)enc.len * 4), "ids of '%s'", a);
    cr_expect(ex->len == enc.len && !memcmp(ex->type_ids, enc.type_ids, (size_t)enc.len * 4), "types of '%s'", a);
    cr_expect_eq(ex->label, label, "label of '%s'", a);
    tok_encoding_free(&enc);
}

Test(glue, cola_real_files)
{
    Dataset d;
    HpcError err;
    cr_assert_eq(read_task("data/cola/dev.tsv", GLUE_COLA, &d, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(d.n, 1043);  /* the last line has no newline and must still count */
    int ones = 0;
    for (int64_t i = 0; i < d.n; i++) ones += d.ex[i].label == 1;
    cr_expect_eq(ones, 721);
    expect_row(&d.ex[0], "The sailors rode the breeze clear of the rocks.", NULL, 1);
    cr_expect_eq(d.num_labels, 2);
    cr_expect(!d.regression);
    dataset_free(&d);
    cr_assert_eq(read_task("data/cola/train.tsv", GLUE_COLA, &d, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(d.n, 8551);
    ones = 0;
    for (int64_t i = 0; i < d.n; i++) ones += d.ex[i].label == 1;
    cr_expect_eq(ones, 6023);
    dataset_free(&d);
    cr_assert_eq(read_task("data/cola/test.tsv", GLUE_COLA, &d, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(d.n, 1063);
    for (int64_t i = 0; i < d.n; i++) cr_assert_eq(d.ex[i].label, -1, "test rows are unlabelled");
    dataset_free(&d);
}

Test(glue, sst2_mrpc_rte_excerpts)
{
    Dataset d;
    HpcError err;
    cr_assert_eq(read_task("tests/data/glue/sst2_dev_head.tsv", GLUE_SST2, &d, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(d.n, 5);
    expect_row(&d.ex[0], "it 's a charming and often affecting journey . ", NULL, 1);
    cr_expect_eq(d.ex[1].label, 0);
    dataset_free(&d);
    cr_assert_eq(read_task("tests/data/glue/mrpc_dev_head.tsv", GLUE_MRPC, &d, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(d.n, 4);  /* the BOM before "Quality" must not hide the label column */
    int32_t mrpc[] = {1, 0, 0, 1};
    for (int i = 0; i < 4; i++) cr_expect_eq(d.ex[i].label, mrpc[i]);
    cr_expect_eq(d.ex[0].type_ids[d.ex[0].len - 1], 1, "pairs have type 1 on the second text");
    dataset_free(&d);
    cr_assert_eq(read_task("tests/data/glue/rte_dev_head.tsv", GLUE_RTE, &d, &err), HPC_OK, "%s", err.msg);
    int32_t rte[] = {1, 0, 1, 1};  /* entailment = 0, not_entailment = 1 (HF's order) */
    cr_expect_eq(d.n, 4);
    for (int i = 0; i < 4; i++) cr_expect_eq(d.ex[i].label, rte[i]);
    expect_row(&d.ex[1], "Yet, we now are discovering that antibiotics are losing their effectiveness against "
               "illness. Disease-causing bacteria are mutating faster than we can come up with new antibiotics "
               "to fight the new variations.", "Bacteria is winning the war against antibiotics.", 0);
    dataset_free(&d);
}

Test(glue, qnli_qqp_stsb_and_test_files)
{
    Dataset d;
    HpcError err;
    cr_assert_eq(read_task("tests/data/glue/qnli_small.tsv", GLUE_QNLI, &d, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(d.n, 3);
    expect_row(&d.ex[1], "Who wrote the letter?", "The letter arrived on Monday.", 1);
    dataset_free(&d);
    cr_assert_eq(read_task("tests/data/glue/qqp_small.tsv", GLUE_QQP, &d, &err), HPC_OK, "%s", err.msg);
    expect_row(&d.ex[0], "How do I learn C?", "What is the best way to learn C?", 1);
    dataset_free(&d);
    cr_assert_eq(read_task("tests/data/glue/stsb_small.tsv", GLUE_STSB, &d, &err), HPC_OK, "%s", err.msg);
    cr_expect(d.regression);
    cr_expect_eq(d.num_labels, 1);
    cr_expect_float_eq(d.ex[0].target, 4.8f, 1e-6f);
    cr_expect_float_eq(d.ex[1].target, 0.25f, 1e-6f);
    cr_expect_float_eq(d.ex[2].target, 3.0f, 1e-6f);
    cr_expect_eq(d.ex[0].label, -1);
    dataset_free(&d);
    cr_assert_eq(read_task("tests/data/glue/sst2_test_head.tsv", GLUE_SST2, &d, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(d.n, 2);
    expect_row(&d.ex[0], "it 's a fine film .", NULL, -1);
    dataset_free(&d);
}

Test(glue, generic_csv_and_tsv)
{
    GlueOptions o = glue_options(GLUE_GENERIC, 64);
    o.delimiter = ',';
    o.text_a = "text";
    o.label = "label";
    o.label_names = "neg,pos";
    Dataset d;
    HpcError err;
    cr_assert_eq(read_with("tests/data/glue/generic.csv", &o, &d, NULL, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(d.n, 4);
    expect_row(&d.ex[0], "Hello, world", NULL, 1);
    expect_row(&d.ex[1], "She said \"no\".", NULL, 0);
    expect_row(&d.ex[2], "two\nlines", NULL, 1);
    expect_row(&d.ex[3], "plain text", NULL, 0);
    dataset_free(&d);
    o = glue_options(GLUE_GENERIC, 64);
    o.text_a = "premise";
    o.text_b = "hypothesis";
    o.label = "gold";
    cr_assert_eq(read_with("tests/data/glue/generic_pairs.tsv", &o, &d, NULL, &err), HPC_OK, "%s", err.msg);
    expect_row(&d.ex[1], "A dog barks.", "The cat sleeps.", 0);
    dataset_free(&d);
    o.header = false;  /* columns by index; the header line is then a row with a bad label */
    o.text_a = "0";
    o.text_b = "1";
    o.label = "2";
    o.skip_bad_rows = true;
    GlueReport rep;
    cr_assert_eq(read_with("tests/data/glue/generic_pairs.tsv", &o, &d, &rep, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(d.n, 2);
    cr_expect_eq(rep.skipped, 1);
    cr_expect(strstr(rep.first_bad, "generic_pairs.tsv:1: label 'gold'") != NULL, "%s", rep.first_bad);
    dataset_free(&d);
}

Test(glue, mnli_three_classes)
{
    Dataset d;
    HpcError err;
    cr_assert_eq(read_task("tests/data/glue/mnli_small.tsv", GLUE_MNLI, &d, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(d.n, 3);
    cr_expect_eq(d.num_labels, 3);
    expect_row(&d.ex[0], "The cat sat on the mat.", "A cat is sitting.", 0);
    cr_expect_eq(d.ex[1].label, 1);
    cr_expect_eq(d.ex[2].label, 2);
    dataset_free(&d);
}

Test(glue, truncation_is_counted)
{
    GlueOptions o = glue_options(GLUE_RTE, 16);
    Dataset d;
    HpcError err;
    GlueReport rep;
    cr_assert_eq(read_with("tests/data/glue/rte_dev_head.tsv", &o, &d, &rep, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(rep.truncated, 4);
    for (int i = 0; i < 4; i++) cr_expect_eq(d.ex[i].len, 16);
    dataset_free(&d);
}

/* The error message of a broken file holds every piece of want. */
static void expect_error(const char *rel, GlueTask task, HpcStatus code, const char *want)
{
    Dataset d;
    HpcError err = {0};
    cr_expect_eq(read_task(rel, task, &d, &err), code, "%s: status", rel);
    cr_expect(strstr(err.msg, want) != NULL, "%s: message '%s' lacks '%s'", rel, err.msg, want);
    dataset_free(&d);
}

Test(glue, broken_files)
{
    expect_error("tests/data/glue/no_such_file.tsv", GLUE_COLA, HPC_ERR_IO, "no_such_file.tsv: No such file");
    expect_error("tests/data/glue/empty.tsv", GLUE_COLA, HPC_ERR_INPUT, "empty.tsv: empty file");
    expect_error("tests/data/glue/only_newlines.tsv", GLUE_SST2, HPC_ERR_INPUT, "empty file");
    expect_error("tests/data/glue/sst2_header_only.tsv", GLUE_SST2, HPC_ERR_INPUT, "no usable rows");
    expect_error("tests/data/glue/sst2_wrong_header.tsv", GLUE_SST2, HPC_ERR_INPUT,
                 "sst2_wrong_header.tsv:1: no text column 'sentence'");
    expect_error("tests/data/glue/cola_bad_columns.tsv", GLUE_COLA, HPC_ERR_INPUT,
                 "cola_bad_columns.tsv:2: expected 4 TAB-separated columns, found 3");
    expect_error("tests/data/glue/cola_bad_label.tsv", GLUE_COLA, HPC_ERR_INPUT,
                 "cola_bad_label.tsv:3: label 'yes' is not an integer in 0..1");
    expect_error("tests/data/glue/cola_bad_utf8.tsv", GLUE_COLA, HPC_ERR_INPUT,
                 "cola_bad_utf8.tsv:2: malformed UTF-8 in column 4 at byte 4");
    expect_error("tests/data/glue/cola_empty_sentence.tsv", GLUE_COLA, HPC_ERR_INPUT,
                 "cola_empty_sentence.tsv:2: empty text in column 4");
    expect_error("tests/data/glue/rte_bad_label.tsv", GLUE_RTE, HPC_ERR_INPUT,
                 "rte_bad_label.tsv:2: label 'neutral' is not one of 'entailment', 'not_entailment'");
    expect_error("tests/data/glue/stsb_bad_score.tsv", GLUE_STSB, HPC_ERR_INPUT,
                 "stsb_bad_score.tsv:2: regression target 'nan' is not a finite number");
}

Test(glue, broken_csv)
{
    GlueOptions o = glue_options(GLUE_GENERIC, 64);
    o.delimiter = ',';
    o.text_a = "text";
    o.label = "label";
    Dataset d;
    HpcError err;
    cr_expect_eq(read_with("tests/data/glue/csv_unterminated.csv", &o, &d, NULL, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "csv_unterminated.csv:2: unterminated quoted field") != NULL, "%s", err.msg);
    dataset_free(&d);
    cr_expect_eq(read_with("tests/data/glue/csv_text_after_quote.csv", &o, &d, NULL, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "csv_text_after_quote.csv:2: text after a closing quote") != NULL, "%s", err.msg);
    dataset_free(&d);
    o.skip_bad_rows = true;
    GlueReport rep;
    cr_expect_eq(read_with("tests/data/glue/csv_text_after_quote.csv", &o, &d, &rep, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(d.n, 1);
    cr_expect_eq(rep.skipped, 1);
    dataset_free(&d);
}

Test(glue, skip_bad_rows_counts_and_keeps_the_first)
{
    GlueOptions o = glue_options(GLUE_COLA, 64);
    o.skip_bad_rows = true;
    Dataset d;
    HpcError err;
    GlueReport rep;
    cr_assert_eq(read_with("tests/data/glue/cola_bad_label.tsv", &o, &d, &rep, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(d.n, 3);
    cr_expect_eq(rep.lines, 5);
    cr_expect_eq(rep.rows, 3);
    cr_expect_eq(rep.skipped, 2);
    cr_expect(strstr(rep.first_bad, "cola_bad_label.tsv:3: label 'yes'") != NULL, "%s", rep.first_bad);
    cr_expect_eq(d.ex[2].label, 0, "row 5 is the third kept");
    dataset_free(&d);
    cr_assert_eq(read_with("tests/data/glue/cola_bad_utf8.tsv", &o, &d, &rep, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(d.n, 1);
    cr_expect_eq(rep.skipped, 1);
    dataset_free(&d);
}

Test(glue, task_names)
{
    cr_expect_eq(glue_task_from_name("CoLA"), GLUE_COLA);
    cr_expect_eq(glue_task_from_name("sst-2"), GLUE_SST2);
    cr_expect_eq(glue_task_from_name("STS-B"), GLUE_STSB);
    cr_expect_eq(glue_task_from_name("MNLI"), GLUE_MNLI);
    cr_expect_eq(glue_task_from_name("ax"), GLUE_TASK_COUNT);
    cr_expect_eq(glue_num_labels(GLUE_MNLI), 3);
    cr_expect_str_eq(glue_task_name(GLUE_QQP), "qqp");
    cr_expect(glue_is_pair(GLUE_MRPC));
    cr_expect(!glue_is_pair(GLUE_SST2));
    cr_expect(glue_is_regression(GLUE_STSB));
    cr_expect_eq(glue_num_labels(GLUE_STSB), 1);
}

/* tests/test_hostile_text.c — text a hostile user would feed the data path.
 *
 *   - A NUL byte inside a text is removed and the text after it kept, in a
 *     TSV field, a quoted CSV field, a GLUE row and the tokenizer, as
 *     transformers' clean-up drops U+0000 (before, the rest was lost).
 *   - CR-only line ends (old Mac files) split records and vocab lines, as
 *     Python's universal newlines do (before: one record "with 121 columns").
 * Expected ids always come from tokenizer_encode of the NUL-free text. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/glue.h"
#include "data/tokenizer.h"
#include "data/tsv.h"

static Tokenizer *tok;

static const char *path_of(const char *rel)
{
    static char buf[4][1024];
    static int k;
    const char *root = getenv("HPC_ROOT");
    char *b = buf[k++ % 4];
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

TestSuite(hostile_text, .init = setup, .fini = teardown);

/* Writes len bytes to a fresh temp file; returns its path. */
static const char *temp_file(const char *tag, const char *bytes, size_t len)
{
    static char path[4][256];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, sizeof path[0], "/tmp/hpc_test_hostile_%s_%d.tsv", tag, (int)getpid());
    FILE *f = fopen(p, "wb");
    cr_assert(f && fwrite(bytes, 1, len, f) == len);
    fclose(f);
    return p;
}

static void expect_ids(const Example *ex, const char *a, const char *b)
{
    TokEncoding enc = {0};
    HpcError err;
    cr_assert_eq(tokenizer_encode(tok, a, b, 128, &enc, &err), HPC_OK);
    cr_expect_eq(ex->len, enc.len, "'%s': %d tokens, want %d", a, ex->len, enc.len);
    for (int32_t i = 0; i < enc.len && i < ex->len; i++)
        cr_expect_eq(ex->ids[i], enc.ids[i], "'%s' token %d", a, i);
    tok_encoding_free(&enc);
}

Test(hostile_text, tsv_field_keeps_text_after_nul)
{
    static const char data[] = "a\tb\0c d\te\0\nx\ty\n";
    TsvReader r;
    tsv_init(&r, data, sizeof data - 1, '\t', false);
    char why[256];
    cr_assert_eq(tsv_next(&r, why, sizeof why), TSV_OK, "%s", why);
    cr_assert_eq(r.nfields, 3);
    cr_expect_str_eq(r.fields[1], "bc d");
    cr_expect_str_eq(r.fields[2], "e");
    cr_assert_eq(tsv_next(&r, why, sizeof why), TSV_OK);
    cr_expect_eq(r.line, 2);
    cr_expect_str_eq(r.fields[1], "y");
    cr_expect_eq(tsv_next(&r, why, sizeof why), TSV_EOF);
    tsv_free(&r);
}

Test(hostile_text, csv_quoted_field_keeps_text_after_nul)
{
    static const char data[] = "\"one\0, two\",3\r\n";
    TsvReader r;
    tsv_init(&r, data, sizeof data - 1, ',', true);
    char why[256];
    cr_assert_eq(tsv_next(&r, why, sizeof why), TSV_OK, "%s", why);
    cr_assert_eq(r.nfields, 2);
    cr_expect_str_eq(r.fields[0], "one, two");
    cr_expect_str_eq(r.fields[1], "3");
    tsv_free(&r);
}

Test(hostile_text, cr_only_line_ends_split_records)
{
    static const char data[] = "h1\th2\rone\t1\r\rtwo\t2\r\nthree\t3";
    TsvReader r;
    tsv_init(&r, data, sizeof data - 1, '\t', false);
    char why[256];
    const char *want[] = {"h1", "one", "", "two", "three"};
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(tsv_next(&r, why, sizeof why), TSV_OK, "%s", why);
        cr_expect_eq(r.line, i + 1);
        cr_expect_str_eq(r.fields[0], want[i]);
        cr_expect_eq(r.nfields, i == 2 ? 1 : 2);
    }
    cr_expect_eq(tsv_next(&r, why, sizeof why), TSV_EOF);
    tsv_free(&r);
}

Test(hostile_text, glue_row_with_nul_is_tokenized_without_it)
{
    static const char data[] = "sentence\tlabel\nit was a gr\0eat film\t1\nnot good \0 at all\t0\n";
    const char *p = temp_file("nul", data, sizeof data - 1);
    GlueOptions o = glue_options(GLUE_SST2, 128);
    Dataset d;
    dataset_init(&d, "nul");
    HpcError err = {0};
    cr_assert_eq(glue_read(p, &o, tok, &d, NULL, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(d.n, 2);
    expect_ids(&d.ex[0], "it was a great film", NULL);
    expect_ids(&d.ex[1], "not good  at all", NULL);
    cr_expect_eq(d.ex[0].label, 1);
    cr_expect_eq(d.ex[1].label, 0);
    dataset_free(&d);
    remove(p);
}

Test(hostile_text, glue_file_with_cr_only_line_ends)
{
    static const char data[] = "sentence\tlabel\ra fine movie\t1\ra dull one\t0\r";
    const char *p = temp_file("cr", data, sizeof data - 1);
    GlueOptions o = glue_options(GLUE_SST2, 128);
    Dataset d;
    dataset_init(&d, "cr");
    HpcError err = {0};
    cr_assert_eq(glue_read(p, &o, tok, &d, NULL, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(d.n, 2);
    expect_ids(&d.ex[0], "a fine movie", NULL);
    expect_ids(&d.ex[1], "a dull one", NULL);
    dataset_free(&d);
    remove(p);
}

Test(hostile_text, tokenizer_drops_nul_and_keeps_the_rest)
{
    static const char a[] = "hello\0 world";
    TokEncoding e = {0}, want = {0};
    HpcError err;
    cr_assert_eq(tokenizer_encode_n(tok, a, sizeof a - 1, NULL, 0, 32, &e, &err), HPC_OK);
    cr_assert_eq(tokenizer_encode(tok, "hello world", NULL, 32, &want, &err), HPC_OK);
    cr_assert_eq(e.len, want.len);
    cr_expect(e.len == 4, "[CLS] hello world [SEP]: %d tokens", e.len);
    for (int32_t i = 0; i < e.len; i++) cr_expect_eq(e.ids[i], want.ids[i]);
    tok_encoding_free(&e);
    tok_encoding_free(&want);
}

/* A vocab written with CR-only, CRLF and LF line ends gives the same ids. */
Test(hostile_text, vocab_line_ends)
{
    const char *ends[] = {"\n", "\r\n", "\r"};
    const char *words[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "##s"};
    for (int k = 0; k < 3; k++) {
        char data[256] = "";
        for (int w = 0; w < 7; w++) strcat(strcat(data, words[w]), ends[k]);
        const char *p = temp_file("vocab", data, strlen(data));
        Tokenizer *t;
        HpcError err = {0};
        cr_assert_eq(tokenizer_load(p, true, &t, &err), HPC_OK, "line end %d: %s", k, err.msg);
        cr_expect_eq(tokenizer_vocab_size(t), 7, "line end %d", k);
        cr_expect_eq(tokenizer_id(t, "worlds") , -1);
        cr_expect_eq(tokenizer_id(t, "##s"), 6, "line end %d", k);
        TokEncoding e = {0};
        cr_assert_eq(tokenizer_encode(t, "hello worlds", NULL, 16, &e, &err), HPC_OK, "%s", err.msg);
        int32_t want[] = {2, 4, 5, 6, 3};
        cr_assert_eq(e.len, 5, "line end %d: %d tokens", k, e.len);
        for (int i = 0; i < 5; i++) cr_expect_eq(e.ids[i], want[i], "line end %d token %d", k, i);
        tok_encoding_free(&e);
        tokenizer_free(t);
        remove(p);
    }
}

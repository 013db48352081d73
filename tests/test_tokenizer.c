/* tests/test_tokenizer.c — WordPiece ids against Hugging Face's BertTokenizer.
 *
 * tests/data/tokenizer/{uncased,cased}.jsonl were written once by
 * scripts/gen_tokenizer_expected.py (its first line names the command and the
 * library versions): every CoLA and SST-2 dev sentence, RTE dev pairs, CoLA
 * pairs with truncation and a set of tricky strings, for both vocabularies.
 * Every case must match id for id, type id for type id. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "data/tokenizer.h"

static char *root_path(const char *rel)
{
    const char *root = getenv("HPC_ROOT");
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", root ? root : ".", rel);
    return buf;
}

static Tokenizer *load(const char *vocab, bool lower)
{
    HpcError err = {0};
    Tokenizer *tok = NULL;
    HpcStatus st = tokenizer_load(root_path(vocab), lower, &tok, &err);
    cr_assert_eq(st, HPC_OK, "%s", err.msg);
    return tok;
}

static bool int_array_equal(json_t *arr, const int32_t *v, int32_t n)
{
    if ((int32_t)json_array_size(arr) != n) return false;
    for (int32_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(arr, (size_t)i)) != v[i]) return false;
    return true;
}

/* Runs every case of one expected file; returns the number checked. */
static int check_file(const char *expected, const char *vocab, bool lower)
{
    Tokenizer *tok = load(vocab, lower);
    FILE *f = fopen(root_path(expected), "r");
    cr_assert_not_null(f, "cannot open %s", expected);
    char *line = NULL;
    size_t cap = 0;
    int checked = 0, failed = 0, lineno = 0;
    TokEncoding enc = {0};
    while (getline(&line, &cap, f) >= 0) {
        if (++lineno == 1) continue;  /* the header: command and versions */
        json_error_t jerr;
        json_t *row = json_loads(line, JSON_ALLOW_NUL, &jerr);
        cr_assert_not_null(row, "%s:%d: %s", expected, lineno, jerr.text);
        json_t *a = json_object_get(row, "a"), *b = json_object_get(row, "b");
        HpcError err = {0};
        HpcStatus st = tokenizer_encode_n(tok, json_string_value(a), json_string_length(a),
                                          json_is_string(b) ? json_string_value(b) : NULL,
                                          json_is_string(b) ? json_string_length(b) : 0,
                                          json_integer_value(json_object_get(row, "max_len")), &enc, &err);
        cr_assert_eq(st, HPC_OK, "%s:%d: %s", expected, lineno, err.msg);
        bool ok = int_array_equal(json_object_get(row, "ids"), enc.ids, enc.len) &&
                  int_array_equal(json_object_get(row, "type_ids"), enc.type_ids, enc.len);
        if (!ok && failed++ < 10) {
            char got[2048] = "";
            for (int32_t i = 0; i < enc.len && strlen(got) < 2000; i++)
                snprintf(got + strlen(got), sizeof got - strlen(got), " %d", enc.ids[i]);
            char *want = json_dumps(json_object_get(row, "ids"), JSON_COMPACT);
            cr_log_error("%s:%d (%s): want %s got%s", expected, lineno,
                         json_string_value(json_object_get(row, "src")), want, got);
            free(want);
        }
        checked++;
        json_decref(row);
    }
    free(line);
    fclose(f);
    tok_encoding_free(&enc);
    tokenizer_free(tok);
    cr_expect_eq(failed, 0, "%s: %d of %d cases differ from Hugging Face", expected, failed, checked);
    return checked;
}

Test(tokenizer, matches_hf_uncased)
{
    int n = check_file("tests/data/tokenizer/uncased.jsonl", "data/vocab/bert-base-uncased-vocab.txt", true);
    cr_expect_gt(n, 1043 + 872, "expected file too short: %d cases", n);
}

Test(tokenizer, matches_hf_cased)
{
    int n = check_file("tests/data/tokenizer/cased.jsonl", "data/vocab/bert-base-cased-vocab.txt", false);
    cr_expect_gt(n, 1043 + 872, "expected file too short: %d cases", n);
}

Test(tokenizer, special_ids_and_lookup)
{
    Tokenizer *tok = load("data/vocab/bert-base-uncased-vocab.txt", true);
    cr_expect_eq(tokenizer_vocab_size(tok), 30522);
    cr_expect_eq(tokenizer_pad_id(tok), 0);
    cr_expect_eq(tokenizer_unk_id(tok), 100);
    cr_expect_eq(tokenizer_cls_id(tok), 101);
    cr_expect_eq(tokenizer_sep_id(tok), 102);
    cr_expect_eq(tokenizer_id(tok, "the"), 1996);
    cr_expect_eq(tokenizer_id(tok, "no-such-token"), -1);
    cr_expect_str_eq(tokenizer_token(tok, 1996), "the");
    cr_expect_null(tokenizer_token(tok, 30522));
    cr_expect_null(tokenizer_token(tok, -1));
    tokenizer_free(tok);
}

Test(tokenizer, bad_utf8_names_offset)
{
    Tokenizer *tok = load("data/vocab/bert-base-uncased-vocab.txt", true);
    const char *bad[] = {"ab\xff", "ok \xc3", "x\xed\xa0\x80y" /* surrogate */, "\xc0\xaf" /* overlong */};
    const int where[] = {2, 3, 1, 0};
    for (int i = 0; i < 4; i++) {
        TokEncoding enc = {0};
        HpcError err = {0};
        HpcStatus st = tokenizer_encode(tok, bad[i], NULL, 32, &enc, &err);
        cr_expect_eq(st, HPC_ERR_INPUT, "case %d accepted", i);
        char want[64];
        snprintf(want, sizeof want, "byte offset %d", where[i]);
        cr_expect(strstr(err.msg, want) != NULL, "case %d: '%s' lacks '%s'", i, err.msg, want);
        tok_encoding_free(&enc);
    }
    tokenizer_free(tok);
}

Test(tokenizer, max_len_too_small_is_usage_error)
{
    Tokenizer *tok = load("data/vocab/bert-base-uncased-vocab.txt", true);
    TokEncoding enc = {0};
    HpcError err = {0};
    cr_expect_eq(tokenizer_encode(tok, "a", "b", 2, &enc, &err), HPC_ERR_USAGE);
    cr_expect_eq(tokenizer_encode(tok, "a", NULL, 1, &enc, &err), HPC_ERR_USAGE);
    cr_expect_eq(tokenizer_encode(tok, "a b c", NULL, 3, &enc, &err), HPC_OK);
    cr_expect_eq(enc.len, 3);
    cr_expect(enc.truncated);
    tok_encoding_free(&enc);
    tokenizer_free(tok);
}

Test(tokenizer, vocab_errors)
{
    Tokenizer *tok = NULL;
    HpcError err = {0};
    cr_expect_eq(tokenizer_load("/nonexistent/vocab.txt", true, &tok, &err), HPC_ERR_IO);
    cr_expect(strstr(err.msg, "/nonexistent/vocab.txt") != NULL, "%s", err.msg);
    char path[] = "/tmp/hpc_vocab_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\nthe\n", f);
    fclose(f);
    cr_expect_eq(tokenizer_load(path, true, &tok, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, ":6:") != NULL && strstr(err.msg, "line 5") != NULL, "%s", err.msg);
    f = fopen(path, "w");
    fputs("[PAD]\nthe\n", f);
    fclose(f);
    cr_expect_eq(tokenizer_load(path, true, &tok, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "[UNK]") != NULL, "%s", err.msg);
    f = fopen(path, "w");
    fclose(f);
    cr_expect_eq(tokenizer_load(path, true, &tok, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "empty") != NULL, "%s", err.msg);
    remove(path);
}

/* runtime/data/tokenizer_unicode.inc lists where HF's Unicode data differs from
 * utf8proc's; a different utf8proc needs the table made again. */
Test(tokenizer, unicode_table_matches_utf8proc)
{
    cr_expect_str_eq(utf8proc_version(), tokenizer_unicode_version(),
                     "utf8proc %s but runtime/data/tokenizer_unicode.inc was made for %s: "
                     "rerun scripts/gen_tokenizer_unicode.py", utf8proc_version(), tokenizer_unicode_version());
}

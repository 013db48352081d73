/* tests/test_parser.c — the .model front end: every bad input beside its
 * exact message and line:col, and good inputs checked field by field.
 *
 * The expected messages were written by hand from docs/language.md; the
 * columns were counted from the input text (1-based, bytes). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "program/spec.h"
#include "compiler/spec_load.h"

/* Loads text (len bytes) as "t.model"; returns the status, the whole
 * diagnostic text in *diag (caller frees). */
static int load_bytes(const char *text, size_t len, const char *base_dir, ModelSpec *spec, char **diag)
{
    size_t size = 0;
    FILE *f = open_memstream(diag, &size);
    cr_assert_not_null(f);
    int rc = spec_load_string("t.model", text, len, base_dir, spec, f);
    fclose(f);
    return rc;
}

static int load(const char *text, ModelSpec *spec, char **diag)
{
    return load_bytes(text, strlen(text), NULL, spec, diag);
}

/* Asserts exactly one error and that the first line reads `want`. */
static void expect_bytes(const char *text, size_t len, const char *want)
{
    ModelSpec spec;
    char *diag = NULL;
    int rc = load_bytes(text, len, NULL, &spec, &diag);
    size_t n = strcspn(diag, "\n");
    cr_expect_eq(rc, 1, "expected 1 error, got %d; diagnostics:\n%s", rc, diag);
    cr_expect(strlen(want) == n && strncmp(diag, want, n) == 0, "want: %s\n got: %.*s", want, (int)n, diag);
    free(diag);
}

static void expect_at(const char *text, int line, int col, const char *msg)
{
    char want[1024];
    snprintf(want, sizeof want, "t.model:%d:%d: error: %s", line, col, msg);
    expect_bytes(text, strlen(text), want);
}

#define ENCODER "  encoder { vocab = 100 max_positions = 64 hidden = 8 layers = 2 heads = 2 ffn = 16 }\n"

/* The error is on line 3, after a valid encoder on line 2. */
#define BAD_LINE3(name, line3, col, msg) \
    Test(bad, name) { expect_at("model m {\n" ENCODER line3 "\n}\n", 3, col, msg); }
#define BAD_AT(name, text, line, col, msg) \
    Test(bad, name) { expect_at(text, line, col, msg); }
#define BAD_FILE(name, text, msg) \
    Test(bad, name) { expect_bytes(text, strlen(text), msg); }
#define BAD_BYTES(name, text, len, line, col, msg)                     \
    Test(bad, name) {                                                  \
        char want[256];                                                \
        snprintf(want, sizeof want, "t.model:%d:%d: error: %s", line, col, msg); \
        expect_bytes(text, len, want);                                 \
    }

BAD_LINE3(missing_equals, "  train { batch 32 }", 17,
          "unexpected '32', expected a name, '{' or '='")
BAD_LINE3(value_missing, "  train { batch = }", 19,
          "unexpected '}', expected a name, an integer, a number, '(' or '-'")
BAD_LINE3(bad_char, "  train { batch = 3 @ }", 21,
          "unexpected character '@'")
BAD_LINE3(utf8_byte, "  train { b\xc3""\xa9""tch = 3 }", 12,
          "unexpected byte 0xC3 (only ASCII is allowed outside comments)")
BAD_LINE3(int_too_large, "  train { batch = 9223372036854775808 }", 19,
          "integer 9223372036854775808 is too large (the largest is 9223372036854775807)")
BAD_LINE3(float_out_of_range, "  train { clip_grad_norm = 1e999 }", 28,
          "number 1e999 is out of range (nonzero magnitudes go from 2.2e-308 to 1.8e308)")
/* Below the smallest normal double: refused whether strtod gives a subnormal or 0. */
BAD_LINE3(float_subnormal, "  train { clip_grad_norm = 1e-320 }", 28,
          "number 1e-320 is out of range (nonzero magnitudes go from 2.2e-308 to 1.8e308)")
BAD_LINE3(float_underflow, "  train { optimizer = adamw { eps = 1e-400 } }", 37,
          "number 1e-400 is out of range (nonzero magnitudes go from 2.2e-308 to 1.8e308)")
BAD_LINE3(range_of_floats, "  train { freeze = layers 0..1.5 }", 30,
          "unexpected '1.5', expected an integer")
BAD_LINE3(tuple_unclosed, "  train { optimizer = adam { betas = (0.9, 0.99 } }", 49,
          "unexpected '}', expected ')' or ','")
BAD_LINE3(unknown_key_hint, "  train { bach = 3 }", 11,
          "unknown key 'bach' in train block; did you mean 'batch'?")
BAD_LINE3(unknown_key, "  train { colour = 3 }", 11,
          "unknown key 'colour' in train block")
BAD_LINE3(int_expected_float, "  train { batch = 7.5 }", 19,
          "'batch' expects an integer, got 7.5")
BAD_LINE3(int_expected_name, "  train { batch = many }", 19,
          "'batch' expects an integer, got 'many'")
BAD_LINE3(int_expected_tuple, "  train { batch = (1, 2) }", 19,
          "'batch' expects an integer, got a tuple")
BAD_LINE3(batch_zero, "  train { batch = 0 }", 19,
          "'batch' must be between 1 and 65536, got 0")
BAD_LINE3(seq_len_negative, "  train { seq_len = -4 }", 21,
          "'seq_len' must be between 1 and 1048576, got -4")
BAD_LINE3(seed_negative, "  train { seed = -1 }", 18,
          "'seed' must be between 0 and 9223372036854775807, got -1")
BAD_LINE3(seq_len_past_positions, "  train { seq_len = 65 }", 21,
          "'seq_len' (65) is longer than the position table allows (64 = max_positions - position_offset)")
BAD_LINE3(clip_negative, "  train { clip_grad_norm = -1 }", 28,
          "'clip_grad_norm' must be in [0, 1e+06], got -1")
BAD_LINE3(number_expected, "  train { clip_grad_norm = off }", 28,
          "'clip_grad_norm' expects a number, got 'off'")
BAD_LINE3(optimizer_hint, "  train { optimizer = adamx }", 23,
          "'optimizer' must be adamw, adam, sgd or lamb, got 'adamx'; did you mean 'adamw'?")
BAD_LINE3(optimizer_unknown, "  train { optimizer = rmsprop }", 23,
          "'optimizer' must be adamw, adam, sgd or lamb, got 'rmsprop'")
BAD_LINE3(optimizer_number, "  train { optimizer = 3 }", 23,
          "'optimizer' must be adamw, adam, sgd or lamb, got 3")
BAD_LINE3(optimizer_argument, "  train { optimizer = adamw 3 }", 29,
          "'adamw' takes no argument; write adamw { ... }")
BAD_LINE3(lr_zero, "  train { optimizer = adamw { lr = 0 } }", 36,
          "'lr' must be in (0, 10], got 0")
BAD_LINE3(lr_unknown_in_train, "  train { lr = 1e-3 }", 11,
          "unknown key 'lr' in train block")
BAD_LINE3(momentum_not_sgd, "  train { optimizer = adamw { momentum = 0.9 } }", 31,
          "'momentum' applies only to the sgd optimizer")
BAD_LINE3(betas_not_sgd, "  train { optimizer = sgd { betas = (0.9, 0.99) } }", 29,
          "'betas' does not apply to the sgd optimizer")
BAD_LINE3(betas_scalar, "  train { optimizer = adam { betas = 0.9 } }", 38,
          "'betas' expects two numbers like (0.9, 0.999), got 0.9")
BAD_LINE3(betas_three, "  train { optimizer = adam { betas = (0.9, 0.99, 0.5) } }", 38,
          "'betas' expects two numbers like (0.9, 0.999), got a tuple")
BAD_LINE3(beta2_one, "  train { optimizer = adam { betas = (0.9, 1.0) } }", 44,
          "'betas' must be in [0, 1), got 1")
BAD_LINE3(eps_zero, "  train { optimizer = adam { eps = 0 } }", 36,
          "'eps' must be in (0, 1), got 0")
BAD_LINE3(opt_dup, "  train { optimizer = adam { eps = 1e-6 eps = 1e-8 } }", 41,
          "duplicate key 'eps' (first set on line 3)")
BAD_LINE3(schedule_hint, "  train { schedule = cosin }", 22,
          "'schedule' must be constant, linear or cosine, got 'cosin'; did you mean 'cosine'?")
BAD_LINE3(warmup_ratio_one, "  train { schedule = linear { warmup = 1.5 } }", 40,
          "'warmup' must be in [0, 1), got 1.5")
BAD_LINE3(min_lr_linear, "  train { schedule = linear { min_lr_ratio = 0.1 } }", 31,
          "'min_lr_ratio' applies only to the cosine schedule")
BAD_LINE3(static_no_scale, "  train { loss_scale = static }", 24,
          "'static' needs the scale: write static 1024")
BAD_LINE3(static_zero, "  train { loss_scale = static 0 }", 31,
          "'static' must be in (0, 1.84467e+19], got 0")
BAD_LINE3(none_block, "  train { loss_scale = none { } }", 24,
          "'none' takes no block")
BAD_LINE3(dynamic_arg, "  train { loss_scale = dynamic 5 }", 32,
          "'dynamic' takes no argument")
BAD_LINE3(growth_one, "  train { loss_scale = dynamic { growth = 1 } }", 43,
          "'growth' must be in (1, 16], got 1")
BAD_LINE3(backoff_one, "  train { loss_scale = dynamic { backoff = 1 } }", 44,
          "'backoff' must be in (0, 1), got 1")
BAD_LINE3(scale_unknown_key, "  train { loss_scale = dynamic { intervall = 10 } }", 34,
          "unknown key 'intervall' in loss_scale block; did you mean 'interval'?")
BAD_LINE3(epochs_and_steps, "  train { epochs = 3 steps = 100 }", 22,
          "'epochs' and 'steps' are exclusive ('epochs' is set on line 3)")
BAD_LINE3(duplicate_key, "  train { batch = 8 seq_len = 16 batch = 16 }", 34,
          "duplicate key 'batch' (first set on line 3)")
BAD_LINE3(freeze_not_prefix, "  train { freeze = layers 1..2 }", 27,
          "only the first layers can be frozen: the range must start at 0, got 1..2")
BAD_LINE3(freeze_too_many, "  train { freeze = layers 0..5 }", 20,
          "'freeze' covers 6 layers but the model has 2")
BAD_LINE3(freeze_unknown, "  train { freeze = everything }", 20,
          "'freeze' must be embeddings, layers N, layers 0..N or none, got 'everything'")
BAD_LINE3(train_as_setting, "  train = fast", 3,
          "unknown setting 'train' at the model level; settings go in an encoder, decoder, head or train block")
BAD_LINE3(stack_key_at_model, "  hidden = 768", 3,
          "'hidden' belongs in the encoder or decoder block")
BAD_LINE3(lr_at_model, "  lr = 0.1", 3,
          "'lr' belongs in optimizer = NAME { ... } in the train block")
BAD_LINE3(setting_as_block, "  train { batch { } }", 11,
          "'batch' is a setting: write batch = ...")
BAD_LINE3(unknown_block_hint, "  trian { }", 3,
          "unknown block 'trian'; did you mean 'train'?")
BAD_LINE3(unknown_block, "  optimizer { }", 3,
          "unknown block 'optimizer' (a model holds encoder or decoder, head and train blocks)")
BAD_LINE3(second_stack, "  decoder { }", 3,
          "a model has one encoder or decoder block (the first is on line 2)")
BAD_LINE3(train_label, "  train fast { }", 9,
          "'train' takes no name after it (got 'fast')")
BAD_LINE3(head_no_kind, "  head { labels = 2 }", 3,
          "'head' needs a kind: classifier, regression, token_classifier, masked_lm or causal_lm")
BAD_LINE3(head_kind_hint, "  head clasifier { }", 8,
          "unknown head kind 'clasifier'; did you mean 'classifier'?")
BAD_LINE3(head_kind_unknown, "  head translator { }", 8,
          "unknown head kind 'translator' (known: classifier, regression, token_classifier, masked_lm, causal_lm)")
BAD_LINE3(labels_zero, "  head classifier { labels = 0 }", 30,
          "'labels' must be between 1 and 1048576, got 0")
BAD_LINE3(labels_mlm, "  head masked_lm { labels = 3 }", 29,
          "'labels' does not apply to a masked_lm head")
BAD_LINE3(regression_labels, "  head regression { labels = 3 }", 30,
          "a regression head has 1 label, got 3")
BAD_LINE3(pooler_token_cls, "  head token_classifier { pooler = tanh }", 36,
          "'pooler' applies only to classifier and regression heads")
BAD_LINE3(pooler_hint, "  head classifier { pooler = tahn }", 30,
          "'pooler' must be tanh, relu or none, got 'tahn'; did you mean 'tanh'?")
BAD_LINE3(tie_classifier, "  head classifier { tie_embeddings = true }", 38,
          "'tie_embeddings' applies only to masked_lm and causal_lm heads")
BAD_LINE3(tie_not_bool, "  head masked_lm { tie_embeddings = yes }", 37,
          "'tie_embeddings' expects true or false, got 'yes'")
BAD_LINE3(causal_lm_encoder, "  head causal_lm", 3,
          "a causal_lm head needs causal attention (use a decoder block or attention = causal)")
BAD_LINE3(head_dropout, "  head classifier { dropout = 1 }", 31,
          "'dropout' must be in [0, 1), got 1")
BAD_LINE3(second_head, "  head classifier { } head regression { }", 23,
          "a model has one head block (the first is on line 3)")
BAD_FILE(empty_file, "",
         "t.model: error: no model in this file (a model starts with `model NAME {`)")
BAD_FILE(only_comment, "# nothing here\n",
         "t.model: error: no model in this file (a model starts with `model NAME {`)")
BAD_AT(no_model_keyword, "bert { }\n", 1, 1,
       "unexpected 'bert', expected end of file or 'model'")
BAD_AT(truncated, "model m {\n  encoder {", 2, 12,
       "unexpected end of file, expected a name or '}'")
BAD_AT(extends_no_name, "model m extends { }\n", 1, 17,
       "unexpected '{', expected a name")
BAD_AT(model_equals, "model m = { }\n", 1, 9,
       "unexpected '=', expected 'extends' or '{'")
BAD_AT(model_no_stack, "model m {\n  train { batch = 8 }\n}\n", 1, 7,
       "model 'm' has no encoder or decoder block")
BAD_AT(missing_ffn, "model m {\n  encoder { vocab = 10 max_positions = 8 hidden = 8 layers = 1 heads = 1 }\n}\n", 2, 3,
       "missing required key 'ffn' in encoder block")
BAD_AT(hidden_not_divisible, "model m {\n  encoder { vocab = 10 max_positions = 8 hidden = 10\n            layers = 1 heads = 4 ffn = 8 }\n}\n", 3, 32,
       "'hidden' (10) is not divisible by 'heads' (4)")
BAD_AT(hidden_absurd, "model m {\n  encoder { vocab = 10 max_positions = 8 hidden = 100000 layers = 1 heads = 1 ffn = 8 }\n}\n", 2, 51,
       "'hidden' must be between 1 and 65536, got 100000")
BAD_AT(vocab_absurd, "model m {\n  encoder { vocab = 16777217 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8 }\n}\n", 2, 21,
       "'vocab' must be between 1 and 16777216, got 16777217")
BAD_AT(layers_absurd, "model m {\n  encoder { vocab = 10 max_positions = 8 hidden = 8 layers = 1025 heads = 1 ffn = 8 }\n}\n", 2, 62,
       "'layers' must be between 1 and 1024, got 1025")
BAD_AT(too_large, "model m {\n  encoder { vocab = 16777216 max_positions = 8 hidden = 65536 layers = 1 heads = 1 ffn = 1 }\n}\n", 2, 3,
       "the model is too large: about 1.12e+12 parameters (the limit is 2^36 = 68719476736)")
BAD_AT(dropout_one, "model m {\n  encoder { vocab = 10 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8\n    dropout = 1.0 }\n}\n", 3, 15,
       "'dropout' must be in [0, 1), got 1")
BAD_AT(attention_dropout_negative, "model m {\n  encoder { vocab = 10 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8\n    attention_dropout = -0.1 }\n}\n", 3, 25,
       "'attention_dropout' must be in [0, 1), got -0.1")
BAD_AT(ln_eps_zero, "model m {\n  encoder { vocab = 10 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8\n    layer_norm_eps = 0 }\n}\n", 3, 22,
       "'layer_norm_eps' must be in (0, 1), got 0")
BAD_AT(activation_hint, "model m {\n  encoder { vocab = 10 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8\n    activation = gelo }\n}\n", 3, 18,
       "'activation' must be gelu, gelu_tanh, relu or silu, got 'gelo'; did you mean 'gelu'?")
BAD_AT(norm_unknown, "model m {\n  encoder { vocab = 10 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8\n    norm = sandwich }\n}\n", 3, 12,
       "'norm' must be post or pre, got 'sandwich'")
BAD_AT(hidden_key_hint, "model m {\n  encoder { vocab = 10 max_positions = 8 hiden = 8 layers = 1 heads = 1 ffn = 8 }\n}\n", 2, 42,
       "unknown key 'hiden' in encoder block; did you mean 'hidden'?")
BAD_AT(position_offset_all, "model m {\n  encoder { vocab = 10 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8\n    position_offset = 8 }\n}\n", 3, 23,
       "'position_offset' (8) leaves no rows of the position table (max_positions = 8)")
BAD_AT(encoder_label, "model m {\n  encoder big { vocab = 10 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8 }\n}\n", 2, 11,
       "'encoder' takes no name after it (got 'big')")
BAD_AT(extends_missing, "model m extends nope { }\n", 1, 17,
       "cannot find base model 'nope': no model of that name in this file, and ./nope.model: No such file or directory")
BAD_AT(extends_self, "model m extends m { }\n", 1, 17,
       "'extends' makes a cycle: m -> m")
BAD_AT(extends_cycle, "model a extends c { }\nmodel b extends a { }\nmodel c extends b { }\n", 1, 17,
       "'extends' makes a cycle: c -> b -> a -> c")
BAD_AT(name_too_long, "model nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn {\n  encoder { vocab = 10 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8 }\n}\n", 1, 7,
       "model name is longer than 63 characters")
BAD_AT(nest_too_deep, "model m {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {a {", 1, 201,
       "'{' nests deeper than 64 levels")
BAD_BYTES(nul_byte, "model m {\x00""}", 11, 1, 10,
          "unexpected byte 0x00 (only ASCII is allowed outside comments)")

/* ---- the shape of a diagnostic ------------------------------------------- */

Test(diag, line_and_caret)
{
    ModelSpec spec;
    char *diag = NULL;
    int rc = load("model m {\n" ENCODER "  train { batch = 0 }\n}\n", &spec, &diag);
    cr_assert_eq(rc, 1);
    cr_expect_str_eq(diag,
                     "t.model:3:19: error: 'batch' must be between 1 and 65536, got 0\n"
                     "    3 |   train { batch = 0 }\n"
                     "      |                   ^\n");
    free(diag);
}

Test(diag, tabs_keep_the_caret_aligned)
{
    ModelSpec spec;
    char *diag = NULL;
    int rc = load("model m {\n" ENCODER "\ttrain {\tbatch = 0 }\n}\n", &spec, &diag);
    cr_assert_eq(rc, 1);
    cr_expect_str_eq(diag,
                     "t.model:3:18: error: 'batch' must be between 1 and 65536, got 0\n"
                     "    3 | \ttrain {\tbatch = 0 }\n"
                     "      | \t       \t        ^\n");
    free(diag);
}

Test(diag, several_errors_are_all_reported)
{
    ModelSpec spec;
    char *diag = NULL;
    int rc = load("model m {\n" ENCODER "  train { batch = 0 seq_len = 0 }\n  head classifier { labels = 0 }\n}\n",
                  &spec, &diag);
    cr_expect_eq(rc, 3);
    cr_expect_not_null(strstr(diag, "t.model:3:19: error: 'batch' must be between 1 and 65536, got 0\n"));
    cr_expect_not_null(strstr(diag, "t.model:3:31: error: 'seq_len' must be between 1 and 1048576, got 0\n"));
    cr_expect_not_null(strstr(diag, "t.model:4:30: error: 'labels' must be between 1 and 1048576, got 0\n"));
    free(diag);
}

Test(diag, stops_after_twenty_errors)
{
    char text[4096] = "model m {\n" ENCODER "  train {\n";
    for (int i = 0; i < 30; i++) strcat(text, "    nope = 1\n");
    strcat(text, "  }\n}\n");
    ModelSpec spec;
    char *diag = NULL;
    int rc = load(text, &spec, &diag);
    cr_expect_eq(rc, 21);
    int count = 0;
    for (const char *p = diag; (p = strstr(p, ": error: unknown key")); p++) count++;
    cr_expect_eq(count, 20);
    cr_expect_not_null(strstr(diag, "\nt.model: error: too many errors, stopping\n"));
    cr_expect_not_null(strstr(diag, "t.model:23:5: error: unknown key 'nope' in train block\n"));
    cr_expect_null(strstr(diag, "t.model:24:5:"));
    free(diag);
}

Test(diag, very_long_line_is_cut_in_the_echo)
{
    size_t n = 1 << 20;
    char *text = malloc(n + 64);
    strcpy(text, "model m { encoder { hidden = 1 ");
    size_t len = strlen(text);
    memset(text + len, ' ', n);
    strcpy(text + len + n, "@ } }");
    ModelSpec spec;
    char *diag = NULL;
    int rc = load(text, &spec, &diag);
    cr_expect_eq(rc, 1);
    char want[128];
    snprintf(want, sizeof want, "t.model:1:%zu: error: unexpected character '@'\n", len + n + 1);
    cr_expect(strncmp(diag, want, strlen(want)) == 0, "got %.200s", diag);
    cr_expect_lt(strlen(diag), 400u);
    free(diag);
    free(text);
}

Test(diag, deep_nesting_is_an_error_not_a_crash)
{
    size_t reps = (10 << 20) / 3; /* 10 MB of "a {" */
    char *text = malloc(reps * 3 + 16);
    memcpy(text, "model m {", 9);
    for (size_t i = 0; i < reps; i++) memcpy(text + 9 + 3 * i, "a {", 3);
    ModelSpec spec;
    char *diag = NULL;
    int rc = load_bytes(text, 9 + 3 * reps, NULL, &spec, &diag);
    cr_expect_eq(rc, 1);
    const char *want = "t.model:1:201: error: '{' nests deeper than 64 levels\n";
    cr_expect(strncmp(diag, want, strlen(want)) == 0, "got %.200s", diag);
    free(diag);
    free(text);
}

Test(diag, deep_tuples_are_an_error_not_a_crash)
{
    size_t n = 1 << 20;
    char *text = malloc(n + 64);
    strcpy(text, "model m { train { betas = ");
    size_t len = strlen(text);
    memset(text + len, '(', n);
    ModelSpec spec;
    char *diag = NULL;
    int rc = load_bytes(text, len + n, NULL, &spec, &diag);
    cr_expect_eq(rc, 1);
    cr_expect_not_null(strstr(diag, "error: '(' nests deeper than 64 levels"), "got %.200s", diag);
    free(diag);
    free(text);
}

Test(diag, binary_input_is_rejected)
{
    unsigned char text[4096];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof text; i++) {
        x = x * 1664525u + 1013904223u;
        text[i] = (unsigned char)(x >> 24);
    }
    ModelSpec spec;
    char *diag = NULL;
    int rc = load_bytes((const char *)text, sizeof text, NULL, &spec, &diag);
    cr_expect_gt(rc, 0);
    cr_expect_not_null(strstr(diag, "error: "));
    free(diag);
}

Test(diag, missing_file_returns_minus_one)
{
    ModelSpec spec;
    char *diag = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&diag, &size);
    int rc = spec_load("/nonexistent/x.model", &spec, f);
    fclose(f);
    cr_expect_eq(rc, -1);
    cr_expect_str_eq(diag, "/nonexistent/x.model: error: cannot read the model file: No such file or directory\n");
    free(diag);
}

/* ---- good input ---------------------------------------------------------- */

static void load_ok(const char *text, ModelSpec *spec)
{
    char *diag = NULL;
    int rc = load_bytes(text, strlen(text), NULL, spec, &diag);
    cr_assert_eq(rc, 0, "unexpected errors:\n%s", diag);
    cr_expect_str_eq(diag, "");
    free(diag);
}

Test(good, minimal_model_gets_the_defaults)
{
    ModelSpec spec, def;
    load_ok("model tiny { encoder { vocab = 10 max_positions = 512 hidden = 8 layers = 1 heads = 2 ffn = 32 } }", &spec);
    spec_defaults(&def);
    cr_expect_str_eq(spec.name, "tiny");
    cr_expect_str_eq(spec.source, "t.model");
    cr_expect_eq(spec.stack.vocab_size, 10);
    cr_expect_eq(spec.stack.max_positions, 512);
    cr_expect_eq(spec.stack.hidden, 8);
    cr_expect_eq(spec.stack.heads, 2);
    cr_expect_eq(spec.stack.ffn, 32);
    cr_expect_eq(spec.stack.type_vocab_size, 2);
    cr_expect_eq(spec.stack.kind, STACK_ENCODER);
    cr_expect_eq(spec.stack.norm, NORM_POST);
    cr_expect(spec.stack.embedding_ln && !spec.stack.final_ln);
    cr_expect_eq(spec.head.kind, HEAD_SEQ_CLASSIFICATION);
    cr_expect_eq(spec.head.num_labels, 2);
    cr_expect(spec.head.pooler);
    cr_expect(memcmp(&spec.train, &def.train, sizeof def.train) == 0, "train block differs from spec_defaults");
    cr_expect_eq(spec.train.optimizer, OPT_ADAMW);
    cr_expect_eq(spec.train.loss_scaling, LOSS_SCALE_DYNAMIC);
    cr_expect_eq(spec.train.scale_init, 65536.0);
    cr_expect_eq(spec.train.scale_interval, 2000);
}

Test(good, every_setting_is_stored)
{
    ModelSpec s;
    load_ok("# a comment line\n"
            "model full {   # trailing comment\n"
            "  encoder {\n"
            "    vocab = 1000 max_positions = 130 token_types = 3 position_offset = 2\n"
            "    hidden = 64 layers = 3 heads = 4 ffn = 256\n"
            "    activation = relu dropout = 0.2 attention_dropout = 0.05 layer_norm_eps = 1e-5\n"
            "    norm = pre attention = causal embedding_norm = false final_norm = true\n"
            "    precision = bf16 embedding_precision = fp32\n"
            "  }\n"
            "  head token_classifier { labels = 9 dropout = 0.3 precision = fp32 }\n"
            "  train {\n"
            "    optimizer = sgd { lr = 0.5 momentum = 0.9 nesterov = true weight_decay = 0.001 }\n"
            "    schedule = cosine { warmup = 100 min_lr_ratio = 0.1 }\n"
            "    loss_scale = dynamic { init = 1024 growth = 4 backoff = 0.25 interval = 50 max_skips = 7 }\n"
            "    clip_grad_norm = 0 batch = 12 grad_accum = 3 seq_len = 128 seed = 7 steps = 900\n"
            "    freeze = (embeddings, layers 0..1)\n"
            "  }\n"
            "}\n", &s);
    cr_expect_eq(s.stack.vocab_size, 1000);
    cr_expect_eq(s.stack.max_positions, 130);
    cr_expect_eq(s.stack.type_vocab_size, 3);
    cr_expect_eq(s.stack.position_offset, 2);
    cr_expect_eq(s.stack.layers, 3);
    cr_expect_eq(s.stack.activation, ACT_RELU);
    cr_expect_eq(s.stack.hidden_dropout, 0.2);
    cr_expect_eq(s.stack.attention_dropout, 0.05);
    cr_expect_eq(s.stack.ln_eps, 1e-5);
    cr_expect_eq(s.stack.norm, NORM_PRE);
    cr_expect_eq(s.stack.attention, ATTN_CAUSAL);
    cr_expect(!s.stack.embedding_ln && s.stack.final_ln);
    cr_expect_eq(s.stack.precision, PREC_BF16);
    cr_expect_eq(s.stack.embedding_precision, PREC_FP32);
    cr_expect_eq(s.head.kind, HEAD_TOKEN_CLASSIFICATION);
    cr_expect_eq(s.head.num_labels, 9);
    cr_expect(!s.head.pooler);
    cr_expect_eq(s.head.classifier_dropout, 0.3);
    cr_expect_eq(s.head.precision, PREC_FP32);
    cr_expect_eq(s.train.optimizer, OPT_SGD);
    cr_expect_eq(s.train.lr, 0.5);
    cr_expect_eq(s.train.momentum, 0.9);
    cr_expect(s.train.nesterov);
    cr_expect_eq(s.train.weight_decay, 0.001);
    cr_expect_eq(s.train.schedule, SCHED_COSINE);
    cr_expect_eq(s.train.warmup_steps, 100);
    cr_expect_eq(s.train.warmup_ratio, 0.0);
    cr_expect_eq(s.train.min_lr_ratio, 0.1);
    cr_expect_eq(s.train.scale_init, 1024.0);
    cr_expect_eq(s.train.scale_growth, 4.0);
    cr_expect_eq(s.train.scale_backoff, 0.25);
    cr_expect_eq(s.train.scale_interval, 50);
    cr_expect_eq(s.train.max_skipped_steps, 7);
    cr_expect_eq(s.train.max_grad_norm, 0.0);
    cr_expect_eq(s.train.batch_size, 12);
    cr_expect_eq(s.train.grad_accum, 3);
    cr_expect_eq(s.train.max_seq_len, 128);
    cr_expect_eq(s.train.seed, 7u);
    cr_expect_eq(s.train.steps, 900);
    cr_expect_eq(s.train.epochs, 0);
    cr_expect(s.train.freeze_embeddings);
    cr_expect_eq(s.train.freeze_layers, 2);
}

Test(good, decoder_block_sets_gpt_defaults)
{
    ModelSpec s;
    load_ok("model g { decoder { vocab = 50 max_positions = 32 hidden = 16 layers = 2 heads = 4 ffn = 64 }\n"
            "  head causal_lm\n"
            "  train { seq_len = 32 } }", &s);
    cr_expect_eq(s.stack.kind, STACK_DECODER);
    cr_expect_eq(s.stack.attention, ATTN_CAUSAL);
    cr_expect_eq(s.stack.norm, NORM_PRE);
    cr_expect(!s.stack.embedding_ln);
    cr_expect(s.stack.final_ln);
    cr_expect_eq(s.stack.type_vocab_size, 0);
    cr_expect_eq(s.head.kind, HEAD_CAUSAL_LM);
    cr_expect(s.head.tie_word_embeddings);
    cr_expect(!s.head.decoder_bias);
    cr_expect(!s.head.pooler);
}

Test(good, extends_in_the_same_file_overrides)
{
    ModelSpec s;
    load_ok("model base {\n"
            "  encoder { vocab = 100 max_positions = 64 hidden = 32 layers = 4 heads = 4 ffn = 128 dropout = 0.2 }\n"
            "  train { optimizer = adamw { lr = 3e-4 weight_decay = 0.05 } epochs = 4 }\n"
            "}\n"
            "model big extends base {\n"
            "  encoder { hidden = 64 layers = 8 }\n"
            "  train { optimizer = adamw { lr = 1e-4 } steps = 1000 }\n"
            "}\n", &s);
    cr_expect_str_eq(s.name, "big");
    cr_expect_eq(s.stack.hidden, 64);
    cr_expect_eq(s.stack.layers, 8);
    cr_expect_eq(s.stack.heads, 4);
    cr_expect_eq(s.stack.ffn, 128);
    cr_expect_eq(s.stack.hidden_dropout, 0.2);
    cr_expect_eq(s.train.lr, 1e-4);
    cr_expect_eq(s.train.weight_decay, 0.05);
    cr_expect_eq(s.train.steps, 1000);
    cr_expect_eq(s.train.epochs, 0, "steps in the derived model clears the base's epochs");
}

Test(good, extends_a_file_beside_it)
{
    ModelSpec s;
    char *diag = NULL;
    const char *root = getenv("HPC_ROOT");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models", root ? root : ".");
    const char *text = "model small_bert extends bert_base { encoder { layers = 2 } head regression }";
    int rc = load_bytes(text, strlen(text), dir, &s, &diag);
    cr_assert_eq(rc, 0, "%s", diag);
    cr_expect_eq(s.stack.layers, 2);
    cr_expect_eq(s.stack.hidden, 768);
    cr_expect_eq(s.stack.vocab_size, 30522);
    cr_expect_eq(s.train.lr, 2e-5);
    cr_expect(s.head.regression);
    cr_expect_eq(s.head.num_labels, 1);
    free(diag);
}

Test(good, switching_head_kind_resets_the_head)
{
    ModelSpec s;
    load_ok("model a { encoder { vocab = 10 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8 }\n"
            "  head classifier { labels = 5 pooler = relu } }\n"
            "model b extends a { head masked_lm }\n", &s);
    cr_expect_eq(s.head.kind, HEAD_MASKED_LM);
    cr_expect(!s.head.pooler);
    cr_expect(s.head.decoder_bias);
    cr_expect(s.head.tie_word_embeddings);
    cr_expect_eq(s.head.num_labels, 0);
}

Test(good, same_head_kind_keeps_base_settings)
{
    ModelSpec s;
    load_ok("model a { encoder { vocab = 10 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8 }\n"
            "  head classifier { labels = 5 pooler = relu } }\n"
            "model b extends a { head classifier { dropout = 0.3 } }\n", &s);
    cr_expect_eq(s.head.num_labels, 5);
    cr_expect_eq(s.head.pooler_activation, ACT_RELU);
    cr_expect_eq(s.head.classifier_dropout, 0.3);
}

Test(good, warmup_ratio_and_loss_scale_forms)
{
    ModelSpec s;
    load_ok("model a { encoder { vocab = 10 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8 }\n"
            "  train { schedule = constant { warmup = 0.25 } loss_scale = static 1024 seq_len = 8 } }", &s);
    cr_expect_eq(s.train.schedule, SCHED_CONSTANT);
    cr_expect_eq(s.train.warmup_ratio, 0.25);
    cr_expect_eq(s.train.warmup_steps, 0);
    cr_expect_eq(s.train.loss_scaling, LOSS_SCALE_STATIC);
    cr_expect_eq(s.train.scale_init, 1024.0);
    load_ok("model a { encoder { vocab = 10 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8 }\n"
            "  train { loss_scale = none freeze = layers 1 seq_len = 8 } }", &s);
    cr_expect_eq(s.train.loss_scaling, LOSS_SCALE_NONE);
    cr_expect_eq(s.train.freeze_layers, 1);
    cr_expect(!s.train.freeze_embeddings);
}

Test(good, crlf_and_one_line_forms)
{
    ModelSpec s;
    load_ok("model a {\r\n  encoder { vocab = 10 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8 }\r\n}\r\n", &s);
    cr_expect_eq(s.stack.vocab_size, 10);
    load_ok("model a{encoder{vocab=10 max_positions=8 hidden=8 layers=1 heads=1 ffn=8}train{seq_len=8 batch=2}}", &s);
    cr_expect_eq(s.train.batch_size, 2);
}

Test(good, largest_integer_is_accepted)
{
    ModelSpec s;
    load_ok("model a { encoder { vocab = 10 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8 }\n"
            "  train { seed = 9223372036854775807 seq_len = 8 } }", &s);
    cr_expect_eq(s.train.seed, 9223372036854775807ull);
}

Test(good, the_last_model_of_a_file_is_loaded)
{
    ModelSpec s;
    load_ok("model a { encoder { vocab = 10 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8 } }\n"
            "model b { encoder { vocab = 20 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8 }"
            " train { seq_len = 8 } }\n", &s);
    cr_expect_str_eq(s.name, "b");
    cr_expect_eq(s.stack.vocab_size, 20);
}

Test(good, activation_silu)
{
    ModelSpec s;
    load_ok("model m { encoder { vocab = 10 max_positions = 8 hidden = 8 layers = 1 heads = 1 ffn = 8\n"
            "  activation = silu } }\n", &s);
    cr_expect_eq(s.stack.activation, ACT_SILU);
    cr_expect_str_eq(spec_activation_name(s.stack.activation), "silu");
}

Test(names, round_trip)
{
    cr_expect_str_eq(spec_activation_name(ACT_GELU_TANH), "gelu_tanh");
    cr_expect_str_eq(spec_head_kind_name(HEAD_MASKED_LM), "masked_lm");
    cr_expect_str_eq(spec_optimizer_name(OPT_LAMB), "lamb");
    cr_expect_str_eq(spec_schedule_name(SCHED_COSINE), "cosine");
    cr_expect_str_eq(spec_precision_name(PREC_BF16), "bf16");
    cr_expect_str_eq(spec_loss_scaling_name(LOSS_SCALE_STATIC), "static");
}

Test(diag, errors_in_a_base_file_point_into_that_file)
{
    const char *root = getenv("HPC_ROOT");
    char path[512], want[1024];
    snprintf(path, sizeof path, "%s/tests/data/bad/extends_broken.model", root ? root : ".");
    snprintf(want, sizeof want,
             "%s/tests/data/bad/broken_base.model:2:51: error: 'hidden' must be between 1 and 65536, got 0\n",
             root ? root : ".");
    ModelSpec spec;
    char *diag = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&diag, &size);
    int rc = spec_load(path, &spec, f);
    fclose(f);
    cr_expect_eq(rc, 1);
    cr_expect(strncmp(diag, want, strlen(want)) == 0, "want %s got %s", want, diag);
    free(diag);
}

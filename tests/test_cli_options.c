/* tests/test_cli_options.c — the option tables of every `hpc` command
 * (cli/options.h): exact messages and exit codes for bad options and
 * numbers, `--help` listing exactly the rows that parse, and `hpc run`'s
 * training settings accepting exactly what the model language accepts. */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "run_overrides.h"
#include "program/spec.h"
#include "compiler/spec_load.h"

/* ---- a small command of every kind of row -------------------------------- */

typedef struct {
    bool flag;
    int mode;
    const char *file, *device;
    int64_t n, keep, seed;
    double x;
} DemoArgs;

static const char *const DEVICES[] = {"auto", "cpu", "cuda", NULL};

#define D(f) offsetof(DemoArgs, f)
static const CliOpt demo_opts[] = {
    {.name = "flag", .short_name = 'f', .kind = CLI_FLAG, .off = D(flag), .help = "a flag"},
    {.name = "fp16", .kind = CLI_SET, .off = D(mode), .set = 16, .excludes = 1, .help = "sixteen"},
    {.name = "bf16", .kind = CLI_SET, .off = D(mode), .set = 17, .excludes = 1, .help = "brain sixteen"},
    {.name = "file", .short_name = 'o', .kind = CLI_STR, .off = D(file), .meta = "FILE", .help = "where to write"},
    {.name = "steps", .kind = CLI_INT, .off = D(n), .meta = "N", .min = 1, .max = 1000, .help = "how many steps"},
    {.name = "lr", .kind = CLI_REAL, .off = D(x), .meta = "X", .range = {0, 10, true, false},
     .help = "a learning rate that needs a long help text to show that the help text is wrapped at 79 columns"},
    {.name = "device", .kind = CLI_STR, .off = D(device), .meta = "D", .choices = DEVICES, .help = "where"},
    {.name = "keep", .kind = CLI_INT, .off = D(keep), .meta = "K", .min = 1, .max = 9, .needs = "file",
     .help = "how many to keep"},
    {.name = "seed", .kind = CLI_INT, .off = D(seed), .meta = "N", .min = 0, .max = INT64_MAX, .help = "a seed"},
    CLI_END,
};
#undef D

static const CliCommand demo = {
    .name = "demo", .args = "[MODEL]", .arg_name = "MODEL", .min_args = 0, .max_args = 1,
    .about = "A command for the tests.\n", .footer = "The end.\n",
    .sections = {{"options", demo_opts, 0}},
};

/* argv from a NULL-terminated list, argv[0] the command's name. */
typedef struct {
    char *v[64];
    int n;
} Argv;

static void argv_vadd(Argv *a, va_list ap)
{
    for (const char *s; (s = va_arg(ap, const char *));) {
        cr_assert(a->n < 63);
        a->v[a->n++] = (char *)s;
    }
    a->v[a->n] = NULL;
}

static int demo_parse(DemoArgs *d, CliParsed *p, HpcError *err, ...)
{
    Argv a = {.v = {"demo"}, .n = 1};
    va_list ap;
    va_start(ap, err);
    argv_vadd(&a, ap);
    va_end(ap);
    memset(d, 0, sizeof *d);
    memset(err, 0, sizeof *err);
    return cli_parse(&demo, a.n, a.v, d, p, err);
}

/* Parses the arguments and expects a usage error with exactly msg. */
static void refused(const char *msg, ...)
{
    Argv a = {.v = {"demo"}, .n = 1};
    va_list ap;
    va_start(ap, msg);
    argv_vadd(&a, ap);
    va_end(ap);
    DemoArgs d = {0};
    CliParsed p;
    HpcError err = {0};
    int rc = cli_parse(&demo, a.n, a.v, &d, &p, &err);
    cr_expect_eq(rc, HPC_ERR_USAGE, "rc %d for '%s'", rc, a.v[1]);
    cr_expect_eq(err.code, HPC_ERR_USAGE);
    cr_expect_str_eq(err.msg, msg);
}

Test(cli_parse, equals_and_space_forms_are_the_same)
{
    DemoArgs d;
    CliParsed p;
    HpcError err;
    cr_assert_eq(demo_parse(&d, &p, &err, "--lr=3e-5", "--steps", "12", NULL), 0, "%s", err.msg);
    cr_expect(d.x == 3e-5 && d.n == 12);
    cr_assert_eq(demo_parse(&d, &p, &err, "--lr", "3e-5", "--steps=12", NULL), 0, "%s", err.msg);
    cr_expect(d.x == 3e-5 && d.n == 12);
    cr_assert_eq(demo_parse(&d, &p, &err, "-oout.txt", "-f", NULL), 0, "%s", err.msg);
    cr_expect_str_eq(d.file, "out.txt");
    cr_expect(d.flag && p.seen[0] && p.seen[3] && !p.seen[4]);
    cr_assert_eq(demo_parse(&d, &p, &err, "model.m", "--ste", "3", "--fp16", "--fp16", NULL), 0, "%s", err.msg);
    cr_expect(d.n == 3 && d.mode == 16, "a unique prefix and a repeated flag are fine");
    cr_expect(p.n_args == 1 && strcmp(p.args[0], "model.m") == 0);
    cr_assert_eq(demo_parse(&d, &p, &err, "--file=--flag", "--", "-x", NULL), 0, "%s", err.msg);
    cr_expect_str_eq(d.file, "--flag");
    cr_expect(p.n_args == 1 && strcmp(p.args[0], "-x") == 0, "after --, -x is an argument");
    cr_expect(!cli_seen(&demo, &p, "flag") && cli_seen(&demo, &p, "file"));
}

Test(cli_parse, numbers_out_of_range_name_the_option_and_range)
{
    refused("demo: --steps 99999999999999999999: expected an integer in [1, 1000]", "--steps", "99999999999999999999",
            NULL);
    refused("demo: --steps -1: expected an integer in [1, 1000]", "--steps", "-1", NULL);
    refused("demo: --steps 1001: expected an integer in [1, 1000]", "--steps=1001", NULL);
    refused("demo: --steps 2.5: expected an integer in [1, 1000]", "--steps=2.5", NULL);
    refused("demo: --steps '': expected an integer in [1, 1000]", "--steps=", NULL);
    refused("demo: --seed 9223372036854775808: expected an integer in [0, 9223372036854775807]", "--seed",
            "9223372036854775808", NULL);
    refused("demo: --lr 0: expected a number in (0, 10]", "--lr", "0", NULL);
    refused("demo: --lr 1e999: expected a number in (0, 10]", "--lr", "1e999", NULL);
    refused("demo: --lr nan: expected a number in (0, 10]", "--lr", "nan", NULL);
    refused("demo: --lr 1e-400: too close to zero for a double (the smallest is 2.2e-308); expected a number in "
            "(0, 10]", "--lr=1e-400", NULL);
    refused("demo: --lr 1e-320: too close to zero for a double (the smallest is 2.2e-308); expected a number in "
            "(0, 10]", "--lr=1e-320", NULL);
}

Test(cli_parse, unknown_options_get_did_you_mean)
{
    refused("demo: unknown option --stpes; did you mean --steps?", "--stpes", "3", NULL);
    refused("demo: unknown option --stpes; did you mean --steps?", "--stpes=3", NULL);
    refused("demo: unknown option --frobnicate (`hpc demo --help` lists the options)", "--frobnicate", NULL);
    refused("demo: option --s is ambiguous: --steps, --seed (write more of the name)", "--s", "3", NULL);
    refused("demo: unknown option -x (`hpc demo --help` lists the options)", "-x", NULL);
    refused("demo: unknown option -s (in -steps); did you mean --steps?", "-steps", "3", NULL);
}

Test(cli_parse, values_missing_or_misplaced)
{
    refused("demo: --steps needs a value (N)", "--steps", NULL);
    refused("demo: -o/--file needs a value (FILE)", "-o", NULL);
    refused("demo: --flag takes no value", "--flag=1", NULL);
    refused("demo: --help takes no value", "--help=1", NULL);
    refused("demo: -o/--file needs a value before --flag (to use that text as the value, write --file=--flag)",
            "--file", "--flag", NULL);
    refused("demo: -o/--file needs a non-empty FILE", "--file=", NULL);
    refused("demo: --device gpu: expected auto, cpu or cuda", "--device", "gpu", NULL);
    refused("demo: --device cpuu: expected auto, cpu or cuda; did you mean cpu?", "--device", "cpuu", NULL);
}

Test(cli_parse, contradictions_and_needs)
{
    refused("demo: --fp16 and --bf16 contradict each other; give one of them", "--fp16", "--bf16", NULL);
    refused("demo: --fp16 and --bf16 contradict each other; give one of them", "--bf16", "--fp16", NULL);
    refused("demo: --keep needs --file", "--keep", "2", NULL);
    refused("demo: more than one MODEL: 'a' and 'b'", "a", "b", NULL);
    DemoArgs d;
    CliParsed p;
    HpcError err;
    cr_expect_eq(demo_parse(&d, &p, &err, "--keep", "2", "-o", "f", NULL), 0, "%s", err.msg);
}

/* The help text comes from the rows: names, values, ranges, wrapping. */
Test(cli_parse, help_is_generated_from_the_rows)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cli_help(&demo, f);
    fclose(f);
    cr_expect_str_eq(text,
                     "usage: hpc demo [OPTIONS] [MODEL]\n"
                     "\n"
                     "A command for the tests.\n"
                     "\n"
                     "options:\n"
                     "  -f, --flag            a flag\n"
                     "  --fp16                sixteen\n"
                     "  --bf16                brain sixteen\n"
                     "  -o, --file FILE       where to write\n"
                     "  --steps N             how many steps [1, 1000]\n"
                     "  --lr X                a learning rate that needs a long help text to show\n"
                     "                        that the help text is wrapped at 79 columns (0, 10]\n"
                     "  --device D            where\n"
                     "  --keep K              how many to keep [1, 9]\n"
                     "  --seed N              a seed [0, 9223372036854775807]\n"
                     "  -h, --help            this text\n"
                     "\n"
                     "The end.\n");
    free(text);
}

/* ---- every real command -------------------------------------------------- */

static const CliCommand *const COMMANDS[] = {
#define HPC_COMMAND(name, summary) &cli_##name##_command,
#include "commands.def"
#undef HPC_COMMAND
};
#define N_COMMANDS (int)(sizeof COMMANDS / sizeof COMMANDS[0])

typedef struct {
    const CliOpt *opt;
    size_t base;
} Row;

static int rows_of(const CliCommand *c, Row *rows)
{
    int n = 0;
    for (int s = 0; s < CLI_MAX_SECTIONS && c->sections[s].opts; s++)
        for (int i = 0; c->sections[s].opts[i].name; i++) rows[n++] = (Row){&c->sections[s].opts[i], c->sections[s].base};
    return n;
}

static const Row *row_named(const Row *rows, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(rows[i].opt->name, name) == 0) return &rows[i];
    return NULL;
}

/* A value the row accepts. */
static const char *valid_value(const CliOpt *o, char *buf, size_t cap)
{
    switch (o->kind) {
    case CLI_FLAG:
    case CLI_SET: return NULL;
    case CLI_INT: snprintf(buf, cap, "%lld", (long long)o->min); return buf;
    case CLI_REAL:
        snprintf(buf, cap, "%.17g", !o->range.lo_open ? o->range.lo : !o->range.hi_open ? o->range.hi
                                                                    : (o->range.lo + o->range.hi) / 2);
        return buf;
    case CLI_STR: return o->choices ? o->choices[0] : "x";
    case CLI_FN:
        if (strcmp(o->name, "loss-scale") == 0) return "dynamic";
        if (strcmp(o->name, "arch") == 0) return "80";
        cr_assert_fail("no valid value known for --%s: add one to valid_value", o->name);
    }
    return NULL;
}

/* Every argument struct of a command fits here; cli_parse writes only fields. */
static _Alignas(16) unsigned char scratch[1 << 16];

/* argv: the command, its required options, extra..., the needed positionals. */
static int parse_real(const CliCommand *c, CliParsed *p, HpcError *err, const char *const *extra, int n_extra)
{
    Row rows[CLI_MAX_OPTS];
    int n = rows_of(c, rows);
    static char vals[CLI_MAX_OPTS][64], spelled[CLI_MAX_OPTS][64];
    Argv a = {.v = {(char *)c->name}, .n = 1};
    for (int i = 0; i < n; i++)
        if (rows[i].opt->required) {
            snprintf(spelled[i], sizeof spelled[i], "--%s", rows[i].opt->name);
            a.v[a.n++] = spelled[i];
            a.v[a.n++] = (char *)valid_value(rows[i].opt, vals[i], sizeof vals[i]);
        }
    for (int i = 0; i < n_extra; i++) a.v[a.n++] = (char *)extra[i];
    for (int i = 0; i < c->min_args; i++) a.v[a.n++] = "ARG";
    a.v[a.n] = NULL;
    memset(scratch, 0, sizeof scratch);
    memset(err, 0, sizeof *err);
    return cli_parse(c, a.n, a.v, scratch, p, err);
}

/* The long names on the help's option lines ("  -o, --output FILE  ..."). */
static int help_names(const CliCommand *c, char names[][64], int cap)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cli_help(c, f);
    fclose(f);
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "  -", 3) != 0) continue;
        char *dd = strstr(line, "--");
        cr_assert(dd && n < cap, "option line without a long name: %s", line);
        size_t k = strspn(dd + 2, "abcdefghijklmnopqrstuvwxyz0123456789-");
        snprintf(names[n++], 64, "%.*s", (int)k, dd + 2);
    }
    free(text);
    return n;
}

Test(cli_commands, help_lists_exactly_the_rows_that_parse)
{
    for (int k = 0; k < N_COMMANDS; k++) {
        const CliCommand *c = COMMANDS[k];
        Row rows[CLI_MAX_OPTS];
        int n = rows_of(c, rows);
        char names[CLI_MAX_OPTS + 1][64];
        int shown = help_names(c, names, CLI_MAX_OPTS + 1);
        cr_expect_eq(shown, n + 1, "hpc %s --help lists %d options, the table has %d (+ --help)", c->name, shown, n);
        for (int i = 0; i < shown; i++)
            cr_expect(strcmp(names[i], "help") == 0 || row_named(rows, n, names[i]),
                      "hpc %s --help lists --%s, which is not in the table", c->name, names[i]);
        for (int i = 0; i < n; i++) {
            bool listed = false;
            for (int j = 0; j < shown; j++) listed |= strcmp(names[j], rows[i].opt->name) == 0;
            cr_expect(listed, "hpc %s --help does not list --%s", c->name, rows[i].opt->name);
            /* ... and each row parses, with its value and what it needs */
            char buf[64], spelled[80], need_spelled[80], need_buf[64];
            const char *v = valid_value(rows[i].opt, buf, sizeof buf);
            const char *extra[4];
            int ne = 0;
            snprintf(spelled, sizeof spelled, "--%s", rows[i].opt->name);
            if (!rows[i].opt->required) {
                extra[ne++] = spelled;
                if (v) extra[ne++] = v;
            }
            if (rows[i].opt->needs) {
                const Row *need = row_named(rows, n, rows[i].opt->needs);
                cr_assert(need, "--%s needs --%s, which hpc %s lacks", rows[i].opt->name, rows[i].opt->needs, c->name);
                snprintf(need_spelled, sizeof need_spelled, "--%s", need->opt->name);
                extra[ne++] = need_spelled;
                const char *nv = valid_value(need->opt, need_buf, sizeof need_buf);
                if (nv) extra[ne++] = nv;
            }
            CliParsed p;
            HpcError err;
            int rc = parse_real(c, &p, &err, extra, ne);
            cr_expect_eq(rc, 0, "hpc %s %s %s: %s", c->name, spelled, v ? v : "", err.msg);
            cr_expect(rc || p.seen[i], "hpc %s %s not recorded as given", c->name, spelled);
        }
        const char *bogus[] = {"--no-such-option-here"};
        CliParsed p;
        HpcError err;
        cr_expect_eq(parse_real(c, &p, &err, bogus, 1), HPC_ERR_USAGE, "hpc %s accepts a bogus option", c->name);
    }
}

/* Every number row refuses one past each end, naming the option and range. */
Test(cli_commands, every_number_row_refuses_one_past_its_range)
{
    for (int k = 0; k < N_COMMANDS; k++) {
        const CliCommand *c = COMMANDS[k];
        Row rows[CLI_MAX_OPTS];
        int n = rows_of(c, rows);
        for (int i = 0; i < n; i++) {
            const CliOpt *o = rows[i].opt;
            char arg[128], want[300], range[96];
            const char *extra[1] = {arg};
            CliParsed p;
            HpcError err;
            if (o->kind == CLI_INT && o->max < INT64_MAX) {
                snprintf(arg, sizeof arg, "--%s=%lld", o->name, (long long)o->max + 1);
                snprintf(want, sizeof want, "%s: --%s %lld: expected %s", c->name, o->name, (long long)o->max + 1,
                         num_int_wanted(o->min, o->max, range, sizeof range));
            } else if (o->kind == CLI_REAL) {
                snprintf(arg, sizeof arg, "--%s=%.17g", o->name, o->range.hi * 2 + 1);
                snprintf(want, sizeof want, "%s: --%s %.17g: expected %s", c->name, o->name, o->range.hi * 2 + 1,
                         num_real_wanted(o->range, range, sizeof range));
            } else {
                continue;
            }
            cr_expect_eq(parse_real(c, &p, &err, extra, 1), HPC_ERR_USAGE, "hpc %s %s accepted", c->name, arg);
            cr_expect_str_eq(err.msg, want);
            if (o->kind == CLI_INT && o->min > INT64_MIN) {
                snprintf(arg, sizeof arg, "--%s=%lld", o->name, (long long)o->min - 1);
                cr_expect_eq(parse_real(c, &p, &err, extra, 1), HPC_ERR_USAGE, "hpc %s %s accepted", c->name, arg);
            }
        }
    }
}

static void run_refused(const char *msg, const char *const *args, int n)
{
    CliParsed p;
    HpcError err;
    cr_expect_eq(parse_real(&cli_run_command, &p, &err, args, n), HPC_ERR_USAGE, "accepted: %s", msg);
    cr_expect_str_eq(err.msg, msg);
}

Test(cli_commands, run_refuses_contradictions)
{
    run_refused("run: --fp32 and --fp16 contradict each other; give one of them",
                (const char *[]){"--fp16", "--fp32"}, 2);
    run_refused("run: --resume and --init contradict each other; give one of them",
                (const char *[]){"--init", "a", "--resume", "b"}, 4);
    run_refused("run: --steps and --epochs contradict each other; give one of them",
                (const char *[]){"--epochs", "2", "--steps", "9"}, 4);
    run_refused("run: --checkpoint-every needs --checkpoint-dir", (const char *[]){"--checkpoint-every", "5"}, 2);
    run_refused("run: --train-rows 1000001: expected an integer in [1, 1000000]",
                (const char *[]){"--train-rows=1000001"}, 1);
    run_refused("run: --steps 99999999999999999999: expected an integer in [1, 1000000000000]",
                (const char *[]){"--steps", "99999999999999999999"}, 2);
}

static void compile_refused(const char *msg, const char *const *args, int n)
{
    CliParsed p;
    HpcError err;
    cr_expect_eq(parse_real(&cli_compile_command, &p, &err, args, n), HPC_ERR_USAGE, "accepted: %s", msg);
    cr_expect_str_eq(err.msg, msg);
}

Test(cli_commands, compile_refuses_contradictions)
{
    compile_refused("compile: --fp16 and --bf16 contradict each other; give one of them",
                    (const char *[]){"--bf16", "--fp16"}, 2);
    compile_refused("compile: --no-fuse and --dump-fuse contradict each other; give one of them",
                    (const char *[]){"--dump-fuse", "--no-fuse"}, 2);
    compile_refused("compile: --stop-after and -o/--output contradict each other; give one of them",
                    (const char *[]){"--stop-after", "lower", "-o", "x.hpc"}, 4);
    compile_refused("compile: --stop-after and --emit-lib contradict each other; give one of them",
                    (const char *[]){"--stop-after=fuse", "--emit-lib", "d"}, 3);
    compile_refused("compile: -o/--output and --no-artifact contradict each other; give one of them",
                    (const char *[]){"--no-artifact", "-o", "x.hpc"}, 3);
    compile_refused("compile: --stop-after lowr: expected lower, autodiff, precision or fuse; did you mean lower?",
                    (const char *[]){"--stop-after", "lowr"}, 2);
    CliParsed p;
    HpcError err;
    cr_expect_eq(parse_real(&cli_compile_command, &p, &err, (const char *[]){"-o", "x.hpc", "--emit-cuda", "d"}, 4), 0,
                 "-o and --emit-cuda go together: %s", err.msg);
}

/* The loss scaler's settings: checked after the parse (run_overrides_check). */
static HpcStatus check_overrides(const char *const *args, int n, HpcError *err)
{
    CliParsed p;
    cr_assert_eq(parse_real(&cli_run_command, &p, err, args, n), 0, "%s", err->msg);
    const RunOverrides *o = (const RunOverrides *)(scratch + cli_run_command.sections[1].base);
    return run_overrides_check(o, p.seen + cli_section_rows(&cli_run_command.sections[0]), err);
}

Test(cli_commands, run_refuses_loss_scale_contradictions)
{
    HpcError err;
    cr_expect_eq(check_overrides((const char *[]){"--loss-scale", "none", "--scale-growth", "2"}, 4, &err),
                 HPC_ERR_USAGE);
    cr_expect_str_eq(err.msg, "run: --loss-scale none and --scale-growth contradict each other (without loss "
                     "scaling there is no scale to set); give one of them");
    cr_expect_eq(check_overrides((const char *[]){"--scale-init=4", "--loss-scale=128"}, 2, &err), HPC_ERR_USAGE);
    cr_expect_str_eq(err.msg, "run: --loss-scale 128 and --scale-init contradict each other (a static scale is its "
                     "own initial value); give one of them");
    cr_expect_eq(check_overrides((const char *[]){"--loss-scale=128", "--scale-interval=9"}, 2, &err),
                 HPC_ERR_USAGE);
    cr_expect_str_eq(err.msg, "run: --loss-scale 128 and --scale-interval contradict each other (a static scale "
                     "never changes); give one of them");
    cr_expect_eq(check_overrides((const char *[]){"--loss-scale=dynamic", "--scale-growth=4", "--scale-init=8"}, 3,
                                 &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(check_overrides((const char *[]){"--loss-scale=none", "--max-skipped-steps=3"}, 2, &err), HPC_OK,
                 "%s", err.msg);
}

/* ---- `hpc run`'s numbers accept exactly what the model language does ------ */

/* How each number row of `hpc run` is written in a .model file. */
static const struct {
    const char *option, *model;
} IN_MODEL[] = {
    {"scale-init", "loss_scale = dynamic { init = %s }"},
    {"scale-growth", "loss_scale = dynamic { growth = %s }"},
    {"scale-backoff", "loss_scale = dynamic { backoff = %s }"},
    {"scale-interval", "loss_scale = dynamic { interval = %s }"},
    {"max-skipped-steps", "loss_scale = dynamic { max_skips = %s }"},
    {"lr", "optimizer = adamw { lr = %s }"},
    {"batch", "batch = %s"},
    {"grad-accum", "grad_accum = %s"},
    {"seed", "seed = %s"},
    {"clip-grad-norm", "clip_grad_norm = %s"},
    {"epochs", "epochs = %s"},
    {"steps", "steps = %s"},
    {"seq-len", "seq_len = %s"},
    {"loss-scale", "loss_scale = static %s"},
};

static bool model_accepts(const char *fmt, const char *value)
{
    char item[256], text[1024];
    snprintf(item, sizeof item, fmt, value);
    snprintf(text, sizeof text, "model m {\n  encoder { vocab = 100 max_positions = 1048576 hidden = 8 layers = 2 "
             "heads = 2 ffn = 16 }\n  train { %s }\n}\n", item);
    FILE *quiet = fopen("/dev/null", "w");
    ModelSpec spec;
    int rc = spec_load_string("t.model", text, strlen(text), NULL, &spec, quiet);
    fclose(quiet);
    return rc == 0;
}

static bool cli_accepts(const char *option, const char *value)
{
    char arg[600];
    snprintf(arg, sizeof arg, "--%s=%s", option, value);
    const char *extra[1] = {arg};
    CliParsed p;
    HpcError err;
    return parse_real(&cli_run_command, &p, &err, extra, 1) == 0;
}

/* The values at and just past both ends of a row's range. */
static int probes(const CliOpt *o, char out[][48])
{
    int n = 0;
    if (o->kind == CLI_INT) {
        long long v[] = {o->min, o->max, o->min - 1, o->max == INT64_MAX ? o->max : o->max + 1};
        for (int i = 0; i < 4; i++) snprintf(out[n++], 48, "%lld", v[i]);
        snprintf(out[n++], 48, "%s", "99999999999999999999");
    } else {
        double lo = o->kind == CLI_FN ? 0 : o->range.lo, hi = o->kind == CLI_FN ? 1.8446744073709552e19 : o->range.hi;
        double v[] = {lo, hi, lo - 1, hi * 2, (lo + hi) / 2};
        for (int i = 0; i < 5; i++) snprintf(out[n++], 48, "%.17g", v[i]);
        snprintf(out[n++], 48, "%s", "1e-400");
        snprintf(out[n++], 48, "%s", "1e999");
    }
    return n;
}

Test(cli_commands, run_numbers_agree_with_the_model_language)
{
    Row rows[CLI_MAX_OPTS];
    int n = rows_of(&cli_run_command, rows);
    int checked = 0;
    for (size_t k = 0; k < sizeof IN_MODEL / sizeof IN_MODEL[0]; k++) {
        const Row *r = row_named(rows, n, IN_MODEL[k].option);
        cr_assert(r, "hpc run has no --%s", IN_MODEL[k].option);
        char values[8][48];
        int nv = probes(r->opt, values);
        for (int i = 0; i < nv; i++) {
            bool cli = cli_accepts(IN_MODEL[k].option, values[i]), model = model_accepts(IN_MODEL[k].model, values[i]);
            cr_expect_eq(cli, model, "--%s %s is %s on the command line but %s in a .model file", IN_MODEL[k].option,
                         values[i], cli ? "accepted" : "refused", model ? "accepted" : "refused");
            checked++;
        }
    }
    cr_expect_gt(checked, 60);
}

/* cli/options.h — one option table per `hpc` command: the parser and the
 * --help text both come from it, so help cannot drift from what is parsed.
 *
 * A command describes its options as CliOpt rows (what the option is called,
 * what kind of value it takes, where the value goes, its range, its help
 * line) gathered in a CliCommand.  cli_parse runs getopt_long over argv
 * (`--lr=3e-5` and `--lr 3e-5` both work; unique prefixes of long names are
 * accepted, as GNU tools do), stores each value in the command's argument
 * struct, and refuses with HPC_ERR_USAGE and a message naming the option:
 *   - an unknown option (with "did you mean --steps?"), an ambiguous prefix;
 *   - a missing value, a value given to a flag, an empty value;
 *   - a number that is not one, or outside the option's range (the message
 *     gives the range: "--steps -1: expected an integer in [1, ...]");
 *   - a value not among the option's choices;
 *   - two options that contradict each other (rows sharing an `excludes`
 *     bit), an option without the option it `needs`, a missing `required`
 *     option, too few or too many positional arguments.
 * cli_help prints the usage line, the command's text and every row; -h and
 * --help are added to every command.  cli/cli.h says how to add an option.
 */
#ifndef HPC_CLI_OPTIONS_H
#define HPC_CLI_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "error.h"
#include "num_parse.h"

typedef enum {
    CLI_FLAG,  /* no value: sets a bool field to true */
    CLI_SET,   /* no value: stores .set into an int (or enum) field, e.g. --fp16 -> PREC_FP16 */
    CLI_STR,   /* a non-empty string (const char *); .choices, when given, lists the allowed ones */
    CLI_INT,   /* an int64_t in [.min, .max] */
    CLI_REAL,  /* a double in .range */
    CLI_FN,    /* .fn parses the value itself */
} CliKind;

typedef struct CliOpt CliOpt;

/* Parses value into field; on failure writes what is wrong into why (the
 * parser adds the command's name), e.g. "--loss-scale x: expected ...". */
typedef bool (*CliOptFn)(const CliOpt *opt, const char *value, void *field, char *why, size_t cap);

struct CliOpt {
    const char *name;             /* long name without "--": "steps" */
    char short_name;              /* 'o' for -o; 0 for none */
    CliKind kind;
    size_t off;                   /* offsetof the field in the section's struct */
    const char *meta;             /* the value in the help text: "N", "FILE"; NULL for flags */
    const char *help;             /* one line or more ('\n' starts an indented line) */
    int64_t min, max;             /* CLI_INT: the allowed range (shown in the help) */
    NumRange range;               /* CLI_REAL: the allowed range (shown in the help) */
    int set;                      /* CLI_SET: the value stored */
    const char *const *choices;   /* CLI_STR: NULL-terminated allowed values, or NULL */
    unsigned excludes;            /* rows sharing a bit contradict each other */
    const char *needs;            /* the long name of an option this one needs */
    bool required;                /* must be given */
    CliOptFn fn;                  /* CLI_FN */
};

#define CLI_MAX_SECTIONS 4
#define CLI_MAX_OPTS 96           /* over all sections of one command */

/* Rows under one heading of the help text, ended by a row without a name
 * (CLI_END); their `off` count from `base` (offsetof the section's struct
 * in the command's argument struct). */
typedef struct {
    const char *title;
    const CliOpt *opts;
    size_t base;
} CliSection;

#define CLI_END {.name = NULL}

/* The number of rows of a section (before its CLI_END). */
int cli_section_rows(const CliSection *s);

typedef struct {
    const char *name;             /* "run" */
    const char *args;             /* the positional arguments in the usage line: "[MODEL]" */
    const char *arg_name;         /* one positional argument in messages: "MODEL" */
    int min_args, max_args;       /* how many; max_args -1: any number */
    bool stop_at_arg;             /* options end at the first argument (the rest may start with '-') */
    const char *about;            /* text between the usage line and the options */
    const char *footer;           /* text after the options, or NULL */
    CliSection sections[CLI_MAX_SECTIONS];
} CliCommand;

typedef struct {
    bool seen[CLI_MAX_OPTS];      /* row k (counted over all sections) was given */
    char **args;                  /* the positional arguments, in order */
    int n_args;
} CliParsed;

/* cli_parse's result when it printed the help (the command then exits 0). */
#define CLI_HELP_SHOWN (-1)

/* Parses argv (argv[0] is the command's name) into the struct at args.
 * Returns 0, CLI_HELP_SHOWN, or HPC_ERR_USAGE with *err saying what is
 * wrong ("run: --steps -1: expected an integer in [1, 1000000000000]").
 * Fields of options not given are left as the caller initialised them. */
int cli_parse(const CliCommand *c, int argc, char **argv, void *args, CliParsed *p, HpcError *err);

/* The help text: usage line, about, every row with its range, footer. */
void cli_help(const CliCommand *c, FILE *out);

/* Whether the row with this long name was given (it must exist). */
bool cli_seen(const CliCommand *c, const CliParsed *p, const char *name);

#endif

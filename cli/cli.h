/* cli/cli.h — what the `hpc` subcommands share.
 *
 * Each command lives in cli/cmd_NAME.c, is listed in cli/commands.def and
 * returns an exit code from util/error.h (0 ok, 1 bad input, 2 usage, ...).
 * Its options are one table, `const CliCommand cli_NAME_command`
 * (cli/options.h), from which both the parser and `hpc NAME --help` come.
 *
 * Adding an option is one row in the command's table, e.g. in cli/cmd_run.c
 * (A(f) is offsetof(RunArgs, f)):
 *
 *   {.name = "output", .kind = CLI_STR, .off = A(output), .meta = "DIR",
 *    .help = "write the best model as a transformers folder"},
 *   {.name = "max-mem", .kind = CLI_INT, .off = A(max_mem), .meta = "MIB", .min = 1, .max = 1 << 30,
 *    .help = "refuse a plan that needs more host memory"},
 *   {.name = "allow-changed-settings", .kind = CLI_FLAG, .off = A(allow_changed), .needs = "resume",
 *    .help = "resume even when the training settings differ (the log records it)"},
 *
 * plus the field in the argument struct.  Kinds: CLI_FLAG (bool), CLI_SET
 * (stores .set in an int field), CLI_STR (const char *, optionally one of
 * .choices), CLI_INT (int64_t in [.min, .max]), CLI_REAL (double in
 * .range = {lo, hi, lo_open, hi_open}), CLI_FN (.fn parses it).  Options that
 * contradict each other share a bit in .excludes; .needs names an option
 * that must also be given; .required makes the option compulsory.  Ranges
 * appear in the help and in the messages by themselves; nothing else needs
 * editing (tests/test_cli_options.c checks every table).
 */
#ifndef HPC_CLI_H
#define HPC_CLI_H

#include "error.h"
#include "options.h"

#define HPC_COMMAND(name, summary)          \
    int cmd_##name(int argc, char **argv);  \
    extern const CliCommand cli_##name##_command;
#include "commands.def"
#undef HPC_COMMAND

/* Prints "hpc: <msg>" for an HpcError to stderr and returns its code. */
int cli_report(const HpcError *err);

/* True if arg is -h or --help (for `hpc --help`; commands get theirs from cli_parse). */
int cli_is_help(const char *arg);

#endif

/* cli/cli.h — what the `hpc` subcommands share.
 *
 * Each command lives in cli/cmd_NAME.c, is listed in cli/commands.def and
 * returns an exit code from util/error.h (0 ok, 1 bad input, 2 usage, ...).
 */
#ifndef HPC_CLI_H
#define HPC_CLI_H

#include "error.h"

#define HPC_COMMAND(name, summary) int cmd_##name(int argc, char **argv);
#include "commands.def"
#undef HPC_COMMAND

/* Prints "hpc: <msg>" for an HpcError to stderr and returns its code. */
int cli_report(const HpcError *err);

/* True if argv[i] is -h or --help. */
int cli_is_help(const char *arg);

#endif

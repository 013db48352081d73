/* cli/cmd_check.c — `hpc check FILE`: parse and check a model, print its
 * summary (parameters, FLOPs, training settings). */
#include <stddef.h>
#include <stdio.h>

#include "cli.h"
#include "program/spec.h"
#include "compiler/spec_load.h"
#include "summary.h"

typedef struct {
    bool quiet;
} CheckArgs;

static const CliOpt check_opts[] = {
    {.name = "quiet", .short_name = 'q', .kind = CLI_FLAG, .off = offsetof(CheckArgs, quiet),
     .help = "print nothing on success (only the exit code)"},
    CLI_END,
};

const CliCommand cli_check_command = {
    .name = "check", .args = "FILE.model", .arg_name = "FILE.model", .min_args = 1, .max_args = 1,
    .about = "Parses and checks a model file and prints its summary: parameter\n"
             "counts per part and per layer, FLOPs per token, training settings.\n"
             "Errors are printed as FILE:LINE:COL: error: MESSAGE with the line.\n",
    .footer = "exit codes: 0 the model is valid, 1 the model has errors,\n"
              "            2 usage error, 3 the file cannot be read\n",
    .sections = {{"options", check_opts, 0}},
};

int cmd_check(int argc, char **argv)
{
    CheckArgs a = {0};
    CliParsed p;
    HpcError err = {0};
    int rc = cli_parse(&cli_check_command, argc, argv, &a, &p, &err);
    if (rc) return rc == CLI_HELP_SHOWN ? HPC_OK : cli_report(&err);
    ModelSpec spec;
    rc = spec_load(p.args[0], &spec, stderr);
    if (rc < 0) return HPC_ERR_IO;
    if (rc > 0) return HPC_ERR_INPUT;
    if (!a.quiet) summary_print(&spec, stdout);
    return HPC_OK;
}

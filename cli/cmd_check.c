/* cli/cmd_check.c — `hpc check FILE`: parse and check a model, print its
 * summary (parameters, FLOPs, training settings). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "spec.h"
#include "summary.h"

static void check_usage(FILE *out)
{
    fputs("usage: hpc check [--quiet] FILE.model\n"
          "\n"
          "Parses and checks a model file and prints its summary: parameter\n"
          "counts per part and per layer, FLOPs per token, training settings.\n"
          "Errors are printed as FILE:LINE:COL: error: MESSAGE with the line.\n"
          "\n"
          "options:\n"
          "  -q, --quiet   print nothing on success (only the exit code)\n"
          "  -h, --help    this help\n"
          "\n"
          "exit codes: 0 the model is valid, 1 the model has errors,\n"
          "            2 usage error, 3 the file cannot be read\n", out);
}

int cmd_check(int argc, char **argv)
{
    const char *path = NULL;
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            check_usage(stdout);
            return HPC_OK;
        }
        if (strcmp(argv[i], "-q") == 0 || strcmp(argv[i], "--quiet") == 0) {
            quiet = 1;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "hpc check: unknown option '%s' (see `hpc check --help`)\n", argv[i]);
            return HPC_ERR_USAGE;
        } else if (path) {
            fprintf(stderr, "hpc check: one model file at a time (got '%s' and '%s')\n", path, argv[i]);
            return HPC_ERR_USAGE;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        check_usage(stderr);
        return HPC_ERR_USAGE;
    }
    ModelSpec spec;
    int rc = spec_load(path, &spec, stderr);
    if (rc < 0) return HPC_ERR_IO;
    if (rc > 0) return HPC_ERR_INPUT;
    if (!quiet) summary_print(&spec, stdout);
    return HPC_OK;
}

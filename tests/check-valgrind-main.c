/* tests/check-valgrind-main.c — `hpc check` without the rest of hpc.
 *
 * tests/check-valgrind.sh links cli/cmd_check.c and cli/options.c with this main and
 * build/libhpcc.a, so valgrind runs the exact `hpc check` code path without
 * loading the CUDA libraries that bin/hpc links (which makes each run take
 * about a minute under valgrind).  Usage: check-valgrind-main check FILE. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cli_report(const HpcError *err)
{
    fprintf(stderr, "hpc: %s\n", err->msg);
    return err->code;
}

int cli_is_help(const char *arg)
{
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "check") != 0) return HPC_ERR_USAGE;
    return cmd_check(argc - 1, argv + 1);
}

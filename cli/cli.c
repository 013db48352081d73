/* cli/cli.c — the helpers every command shares (cli.h). */
#include "cli.h"

#include <stdio.h>
#include <string.h>

int cli_report(const HpcError *err)
{
    fprintf(stderr, "hpc: %s\n", err->msg);
    return err->code;
}

int cli_is_help(const char *arg)
{
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

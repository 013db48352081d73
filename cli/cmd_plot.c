/* cli/cmd_plot.c — `hpc plot`: draw a run's JSONL log as an SVG picture. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "report/plot_svg.h"

static const char plot_usage[] =
    "usage: hpc plot LOG.jsonl -o FILE.svg\n"
    "\n"
    "Draws the run log that `hpc run` writes (--log FILE.jsonl) as four panels\n"
    "against the optimizer step: training loss, learning rate, loss scale (log2\n"
    "axis; skipped steps as dashed lines) and the dev metric.  The SVG opens in\n"
    "any browser.\n"
    "\n"
    "options:\n"
    "  -o, --output FILE.svg   where to write the picture (required)\n";

int cmd_plot(int argc, char **argv)
{
    const char *in = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            fputs(plot_usage, stdout);
            return HPC_OK;
        } else if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) && i + 1 < argc) {
            out = argv[++i];
        } else if (argv[i][0] == '-' || in) {
            fprintf(stderr, "hpc plot: unexpected argument '%s'\n%s", argv[i], plot_usage);
            return HPC_ERR_USAGE;
        } else {
            in = argv[i];
        }
    }
    if (!in || !out) {
        fprintf(stderr, "hpc plot: %s\n%s", in ? "-o FILE.svg is required" : "no LOG.jsonl given", plot_usage);
        return HPC_ERR_USAGE;
    }
    HpcError err = {0};
    if (plot_runlog(in, out, &err)) return cli_report(&err);
    fprintf(stderr, "hpc plot: wrote %s\n", out);
    return HPC_OK;
}

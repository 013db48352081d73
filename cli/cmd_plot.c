/* cli/cmd_plot.c — `hpc plot`: draw a run's JSONL log as an SVG picture. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "report/plot_svg.h"

typedef struct {
    const char *out;
} PlotArgs;

static const CliOpt plot_opts[] = {
    {.name = "output", .short_name = 'o', .kind = CLI_STR, .off = offsetof(PlotArgs, out), .meta = "FILE.svg",
     .required = true, .help = "where to write the picture"},
    CLI_END,
};

const CliCommand cli_plot_command = {
    .name = "plot", .args = "LOG.jsonl", .arg_name = "LOG.jsonl", .min_args = 1, .max_args = 1,
    .about = "Draws the run log that `hpc run` writes (--log FILE.jsonl) as four panels\n"
             "against the optimizer step: training loss, learning rate, loss scale (log2\n"
             "axis; skipped steps as dashed lines) and the dev metric.  The SVG opens in\n"
             "any browser.\n",
    .sections = {{"options", plot_opts, 0}},
};

int cmd_plot(int argc, char **argv)
{
    PlotArgs a = {0};
    CliParsed p;
    HpcError err = {0};
    int rc = cli_parse(&cli_plot_command, argc, argv, &a, &p, &err);
    if (rc) return rc == CLI_HELP_SHOWN ? HPC_OK : cli_report(&err);
    if (plot_runlog(p.args[0], a.out, &err)) return cli_report(&err);
    fprintf(stderr, "hpc plot: wrote %s\n", a.out);
    return HPC_OK;
}

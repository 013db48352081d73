/* cli/cmd_compile.c — `hpc compile MODEL`: the compiler half of hpc.
 *
 * Runs the stages in order: check -> lower -> autodiff -> precision -> plan
 * (fuse and emit are not implemented yet and are named in the output).
 * Dump flags print after the last stage that ran: --ir and --dot show the
 * graph (after precision when a mixed policy is chosen), --precision-report
 * the precision choice per op, --plan the memory plan. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "autodiff.h"
#include "cli.h"
#include "ir.h"
#include "lower.h"
#include "params.h"
#include "plan.h"
#include "precision.h"
#include "spec.h"
#include "summary.h"

static const char compile_usage[] =
    "usage: hpc compile MODEL [--fp32|--fp16|--bf16] [--ir] [--dot FILE]\n"
    "                         [--precision-report] [--plan]\n"
    "\n"
    "Checks MODEL (a .model file), lowers it to the graph IR, builds the\n"
    "backward graph, plans the precision of every value and the memory of a\n"
    "training step, and prints a summary.  Fusion and CUDA emission are not\n"
    "implemented yet, so no artifact is written.\n"
    "\n"
    "options:\n"
    "  --fp32, --fp16, --bf16  precision policy (default fp32: the graph stays f32)\n"
    "  --ir                the graph, one value per line: op, inputs, attributes,\n"
    "                      shape and dtype\n"
    "  --dot FILE          the graph as Graphviz dot (render: dot -Tsvg FILE)\n"
    "  --precision-report  the precision class and dtypes of every op\n"
    "  --plan              the memory plan of a step at the model's batch x max_seq_len\n"
    "  -h, --help          this text\n";

typedef struct {
    const char *model, *dot;
    bool ir, report, plan;
    SpecPrecision policy;
} CompileArgs;

static int compile_parse(int argc, char **argv, CompileArgs *a)
{
    memset(a, 0, sizeof *a);
    a->policy = PREC_FP32;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (cli_is_help(o)) {
            fputs(compile_usage, stdout);
            return -1;
        }
        if (strcmp(o, "--ir") == 0) a->ir = true;
        else if (strcmp(o, "--precision-report") == 0) a->report = true;
        else if (strcmp(o, "--plan") == 0) a->plan = true;
        else if (strcmp(o, "--fp32") == 0) a->policy = PREC_FP32;
        else if (strcmp(o, "--fp16") == 0) a->policy = PREC_FP16;
        else if (strcmp(o, "--bf16") == 0) a->policy = PREC_BF16;
        else if (strcmp(o, "--dot") == 0 && i + 1 < argc) a->dot = argv[++i];
        else if (o[0] == '-' || a->model) {
            fprintf(stderr, "hpc compile: unexpected argument '%s'\n%s", o, compile_usage);
            return HPC_ERR_USAGE;
        } else a->model = o;
    }
    if (!a->model) {
        fprintf(stderr, "hpc compile: no MODEL given\n%s", compile_usage);
        return HPC_ERR_USAGE;
    }
    return 0;
}

static int write_dot(const IrGraph *g, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "hpc: open %s for writing: %s\n", path, strerror(errno));
        return HPC_ERR_IO;
    }
    ir_dot(g, f);
    if (fclose(f) != 0) {
        fprintf(stderr, "hpc: write %s: %s\n", path, strerror(errno));
        return HPC_ERR_IO;
    }
    fprintf(stderr, "hpc: wrote the graph to %s (render: dot -Tsvg %s -o graph.svg)\n", path, path);
    return HPC_OK;
}

/* Everything the stages produce. */
typedef struct {
    ModelSpec spec;
    IrGraph g;           /* after the last stage that ran */
    ParamList pl;
    PrecisionPlan prec;
    bool have_prec;
    StepPlan plan;
    bool have_plan;
} Compiled;

static HpcStatus compile_precision(Compiled *c, SpecPrecision policy, HpcError *err)
{
    IrGraph mixed;
    ir_init(&mixed);
    HpcStatus st = precision_plan(&c->g, &c->spec, policy, &mixed, &c->prec, err);
    if (st) {
        ir_free(&mixed);
        return st;
    }
    c->have_prec = true;
    ir_free(&c->g);
    c->g = mixed;
    return HPC_OK;
}

static HpcStatus compile_stages(Compiled *c, SpecPrecision policy, HpcError *err)
{
    HpcStatus st = lower_model(&c->spec, &c->g, &c->pl, err);
    if (!st) st = autodiff_build(&c->g, &c->pl, err);
    if (!st) st = compile_precision(c, policy, err);
    if (!st) st = plan_build(&c->g, c->spec.train.batch_size, c->spec.train.max_seq_len, &c->plan, err);
    if (!st) c->have_plan = true;
    return st;
}

static void print_summary(const Compiled *c, SpecPrecision policy)
{
    int trainable = 0;
    for (int p = 0; p < c->pl.n; p++) trainable += c->g.param_grad[p] >= 0;
    summary_print(&c->spec, stdout);
    printf("\nlowered    %lld parameters in %d tensors (%d with gradients)\n",
           (long long)params_total(&c->pl), c->pl.n, trainable);
    printf("graph      %d values: %d forward, %d backward; %d casts for %s\n", c->g.n,
           c->g.n_forward, c->g.n - c->g.n_forward, c->prec.n_casts, spec_precision_name(policy));
    PlanMemory m;
    plan_memory(&c->plan, &c->g, &c->pl, &c->spec.train, &m);
    printf("memory     %.1f MiB per training step at batch %lld x %lld (arena %.1f MiB)\n",
           (double)m.total / 1048576.0, (long long)c->plan.B, (long long)c->plan.L,
           (double)m.arena / 1048576.0);
    printf("stages     check, lower, autodiff, precision, plan done; fuse and emit not "
           "implemented yet (no artifact written)\n");
}

static void compiled_free(Compiled *c)
{
    if (c->have_prec) precision_plan_free(&c->prec);
    if (c->have_plan) plan_free(&c->plan);
    ir_free(&c->g);
    params_free(&c->pl);
}

int cmd_compile(int argc, char **argv)
{
    CompileArgs a;
    int rc = compile_parse(argc, argv, &a);
    if (rc) return rc < 0 ? HPC_OK : rc;
    Compiled c;
    memset(&c, 0, sizeof c);
    int nerr = spec_load(a.model, &c.spec, stderr);
    if (nerr) return nerr < 0 ? HPC_ERR_IO : HPC_ERR_INPUT;
    ir_init(&c.g);
    params_init(&c.pl);
    HpcError err = {0};
    if (compile_stages(&c, a.policy, &err)) {
        rc = cli_report(&err);
    } else {
        if (a.ir) ir_print(&c.g, stdout);
        if (a.report) precision_report(&c.g, &c.prec, stdout);
        if (a.plan) plan_print(&c.plan, &c.g, &c.pl, &c.spec.train, stdout);
        if (a.dot) rc = write_dot(&c.g, a.dot);
        if (!a.ir && !a.report && !a.plan && !rc) print_summary(&c, a.policy);
    }
    compiled_free(&c);
    return rc;
}

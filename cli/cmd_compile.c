/* cli/cmd_compile.c — `hpc compile MODEL`: the compiler half of hpc.
 *
 * Runs the stages in order: check -> pipeline_build (lower -> autodiff ->
 * precision -> fuse, compiler/pipeline.h) -> plan -> emit (the CUDA source
 * goes into the NAME.hpc artifact, compiler/artifact.h).  Dump flags print after the last stage
 * that ran: --ir and --dot show the graph (after fuse unless --no-fuse or
 * --stop-after), --precision-report the precision choice per op, --plan the
 * memory plan; --dump-STAGE prints the graph after any compiler stage. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "artifact.h"
#include "autodiff.h"
#include "cli.h"
#include "emit_lib.h"
#include "emit_ops.h"
#include "ir.h"
#include "lower.h"
#include "cuda/nvrtc_compile.h"
#include "params.h"
#include "pipeline.h"
#include "plan.h"
#include "precision.h"
#include "spec.h"
#include "step_program_build.h"
#include "summary.h"

static const char compile_usage[] =
    "usage: hpc compile MODEL [--fp32|--fp16|--bf16] [--ir] [--dot FILE]\n"
    "                         [--precision-report] [--plan] [--no-fuse]\n"
    "                         [--dump-STAGE]... [--stop-after STAGE]\n"
    "                         [-o FILE.hpc] [--no-artifact]\n"
    "                         [--arch LIST] [--emit-cuda DIR] [--emit-lib DIR]\n"
    "\n"
    "Checks MODEL (a .model file), lowers it to the graph IR, builds the\n"
    "backward graph, plans the precision of every value and the memory of a\n"
    "training step, fuses what it can, emits the CUDA source and writes the\n"
    "artifact NAME.hpc (the resolved model, the plan and the CUDA source) that\n"
    "`hpc run` takes.\n"
    "\n"
    "options:\n"
    "  --fp32, --fp16, --bf16  precision policy (default fp32: the graph stays f32)\n"
    "  --ir                the graph, one value per line: op, inputs, attributes,\n"
    "                      shape and dtype\n"
    "  --dot FILE          the graph as Graphviz dot (render: dot -Tsvg FILE)\n"
    "  --precision-report  the precision class and dtypes of every op\n"
    "  --plan              the memory plan of a step at the model's batch x max_seq_len\n"
    "  --no-fuse           skip the fuse pass (the unfused graph, as before fusion)\n"
    "  --dump-STAGE        print the graph after STAGE: lower, autodiff, precision,\n"
    "                      fuse (repeatable)\n"
    "  --stop-after STAGE  run the compiler stages up to STAGE only\n"
    "  -o FILE             write the artifact to FILE (default NAME.hpc in the\n"
    "                      current directory, NAME from the model)\n"
    "  --no-artifact       write no artifact\n"
    "  --emit-cuda DIR     write DIR/NAME_kernels.cuh: the fused kernels for nvcc\n"
    "  --emit-lib DIR      write a package to embed the model in a C program:\n"
    "                      NAME.h/.c, a Makefile, the .cuh, the plan (docs/embedding.md)\n"
    "  --arch LIST         also compile the step for these archs (e.g. 80,90) into\n"
    "                      NAME.hpc, so `hpc run` on such a GPU runs no NVRTC (and,\n"
    "                      with --emit-lib, cubins of the package's kernels)\n"
    "  -h, --help          this text\n";

typedef struct {
    const char *model, *dot;
    bool ir, report, plan;
    SpecPrecision policy;
    PipeOptions pipe;    /* --no-fuse, --dump-STAGE, --stop-after */
    const char *out;     /* -o: the artifact's path */
    bool no_artifact;
    const char *emit_cuda, *emit_lib; /* --emit-cuda DIR, --emit-lib DIR */
    int archs[EMITLIB_MAX_ARCHS], n_archs; /* --arch */
} CompileArgs;

/* The pipeline's flags; 1 if o was one (i advanced past its value), 0 if
 * not, -1 for a bad stage name. */
static int compile_pipe_flag(int argc, char **argv, int *i, PipeOptions *p)
{
    const char *o = argv[*i];
    if (strcmp(o, "--no-fuse") == 0) {
        p->fuse = false;
        return 1;
    }
    const char *name = NULL;
    bool dump = strncmp(o, "--dump-", 7) == 0;
    if (dump) name = o + 7;
    else if (strcmp(o, "--stop-after") == 0 && *i + 1 < argc) name = argv[++*i];
    else return 0;
    PipeStage s = pipeline_stage_parse(name);
    if (s == PIPE_NONE) {
        fprintf(stderr, "hpc compile: unknown stage '%s' (want lower, autodiff, precision or fuse)\n", name);
        return -1;
    }
    if (dump) p->dump |= PIPE_BIT(s);
    else p->stop_after = s;
    return 1;
}

static int compile_parse(int argc, char **argv, CompileArgs *a)
{
    memset(a, 0, sizeof *a);
    a->policy = PREC_FP32;
    a->pipe = pipeline_defaults(PREC_FP32);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (cli_is_help(o)) {
            fputs(compile_usage, stdout);
            return -1;
        }
        int pf = compile_pipe_flag(argc, argv, &i, &a->pipe);
        if (pf < 0) return HPC_ERR_USAGE;
        if (pf > 0) continue;
        if (strcmp(o, "--ir") == 0) a->ir = true;
        else if (strcmp(o, "--precision-report") == 0) a->report = true;
        else if (strcmp(o, "--plan") == 0) a->plan = true;
        else if (strcmp(o, "--fp32") == 0) a->policy = PREC_FP32;
        else if (strcmp(o, "--fp16") == 0) a->policy = PREC_FP16;
        else if (strcmp(o, "--bf16") == 0) a->policy = PREC_BF16;
        else if (strcmp(o, "--dot") == 0 && i + 1 < argc) a->dot = argv[++i];
        else if (strcmp(o, "-o") == 0 && i + 1 < argc) a->out = argv[++i];
        else if (strcmp(o, "--no-artifact") == 0) a->no_artifact = true;
        else if (strcmp(o, "--emit-cuda") == 0 && i + 1 < argc) a->emit_cuda = argv[++i];
        else if (strcmp(o, "--emit-lib") == 0 && i + 1 < argc) a->emit_lib = argv[++i];
        else if (strcmp(o, "--arch") == 0 && i + 1 < argc) {
            if (!emitlib_parse_archs(argv[++i], a->archs, &a->n_archs)) {
                fprintf(stderr, "hpc compile: --arch '%s': want a list such as 80,90 or sm_80,sm_90\n", argv[i]);
                return HPC_ERR_USAGE;
            }
        }
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
    bool stopped;        /* --stop-after ended the compiler stages early */
    bool fused;          /* the fuse pass ran */
    FuseStats fuse;
    StepPlan plan;
    bool have_plan;
} Compiled;

/* The compiler stages (compiler/pipeline.h); c takes over their results. */
static HpcStatus compile_pipeline(Compiled *c, PipeOptions opts, SpecPrecision policy, HpcError *err)
{
    Pipeline p;
    opts.policy = policy;
    HpcStatus st = pipeline_build(&c->spec, &opts, &p, err);
    ir_free(&c->g);
    params_free(&c->pl);
    c->g = p.g;
    c->pl = p.pl;
    c->have_prec = p.reached >= PIPE_PRECISION;
    if (c->have_prec) c->prec = p.prec;
    c->fused = p.fused;
    c->fuse = p.fuse;
    c->stopped = p.reached < PIPE_PRECISION || opts.stop_after < PIPE_FUSE;
    return st;
}

static HpcStatus compile_stages(Compiled *c, const PipeOptions *opts, SpecPrecision policy, HpcError *err)
{
    HpcStatus st = compile_pipeline(c, *opts, policy, err);
    if (!st && c->stopped) return HPC_OK;   /* --stop-after: no plan */
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
    if (c->fused)
        printf("fused      %d softmax+dropout, %d their backward, %d dropout+residual: %d -> %d values\n",
               c->fuse.softmax_dropout, c->fuse.softmax_dropout_bwd, c->fuse.dropout_add,
               c->fuse.nodes_before, c->fuse.nodes_after);
    printf("stages     check, lower, autodiff, precision, %splan, emit done\n", c->fused ? "fuse, " : "");
}

/* NAME.hpc (compiler/artifact.h): the step program (what `hpc run`
 * executes), the resolved model, the plan summary and the CUDA source. */
static int write_artifact(const Compiled *c, const CompileArgs *a)
{
    HpcError err = {0};
    char *plan = NULL, path[4096];
    size_t plan_len = 0;
    FILE *mem = open_memstream(&plan, &plan_len);
    if (mem) {
        plan_print(&c->plan, &c->g, &c->pl, &c->spec.train, mem);
        fclose(mem);
    }
    if (a->out) snprintf(path, sizeof path, "%s", a->out);
    else artifact_path_for(c->spec.name, path, sizeof path);
    StepProgram prog;
    HpcStatus st = step_program_from_graph(&c->spec, a->policy, c->fused, &c->g, &c->pl, &prog, &err);
    for (int i = 0; i < a->n_archs && !st; i++) {   /* --arch: the module compiled ahead */
        void *cubin = NULL;
        size_t n = 0;
        st = nvrtc_compile(prog.kernels.cuda_source, "hpc_ops", a->archs[i], NULL, 0, &cubin, &n, NULL, &err);
        if (!st) st = step_kernels_add_cubin(&prog.kernels, a->archs[i], cubin, n, &err);
        free(cubin);
    }
    if (!st) st = step_program_save(path, &prog, plan, &err);
    if (!st) fprintf(stderr, "hpc: wrote %s (run it: hpc run %s)\n", path, path);
    step_program_free(&prog);
    free(plan);
    return st ? cli_report(&err) : HPC_OK;
}

static HpcStatus emit_nvrtc(const char *src, const char *name, int arch, void **cubin, size_t *n, HpcError *err)
{
    return nvrtc_compile(src, name, arch, NULL, 0, cubin, n, NULL, err);
}

/* --emit-cuda and --emit-lib (compiler/emit_lib.h). */
static int write_emits(const Compiled *c, const CompileArgs *a)
{
    HpcError err = {0};
    HpcStatus st = HPC_OK;
    if (a->emit_cuda) st = emitlib_cuda(&c->spec, a->policy, a->emit_cuda, &err);
    if (!st && a->emit_cuda) fprintf(stderr, "hpc: wrote %s/%s_kernels.cuh\n", a->emit_cuda, c->spec.name);
    if (st || !a->emit_lib) return st ? cli_report(&err) : HPC_OK;
    EmitLibOptions o = {.policy = a->policy, .n_archs = a->n_archs, .compile = emit_nvrtc};
    memcpy(o.archs, a->archs, sizeof o.archs);
    char *plan = NULL, *cuda = NULL, root[4096];
    size_t plan_len = 0;
    FILE *mem = open_memstream(&plan, &plan_len);
    if (mem) {
        plan_print(&c->plan, &c->g, &c->pl, &c->spec.train, mem);
        fclose(mem);
    }
    if (realpath(".", root) && access("include/hpc.h", R_OK) == 0) o.hpc_root = root;
    o.plan_text = plan;
    st = eop_module_source(&c->g, &cuda, &err);
    o.cuda_source = cuda;
    if (!st) st = emitlib_package(&c->spec, &o, a->emit_lib, &err);
    if (!st) fprintf(stderr, "hpc: wrote the package %s/ (build it: make -C %s run)\n", a->emit_lib, a->emit_lib);
    free(plan);
    free(cuda);
    return st ? cli_report(&err) : HPC_OK;
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
    if (compile_stages(&c, &a.pipe, a.policy, &err)) {
        rc = cli_report(&err);
    } else {
        if (a.ir) ir_print(&c.g, stdout);
        if (a.report && c.have_prec) precision_report(&c.g, &c.prec, stdout);
        if (a.plan && c.have_plan) plan_print(&c.plan, &c.g, &c.pl, &c.spec.train, stdout);
        if (a.dot) rc = write_dot(&c.g, a.dot);
        bool quiet = a.ir || a.report || a.plan || a.pipe.dump || c.stopped;
        if (a.report && !c.have_prec) fprintf(stderr, "hpc compile: --precision-report needs the precision stage\n");
        if (!quiet && !rc) print_summary(&c, a.policy);
        if (!rc && c.have_plan && !c.stopped && !a.no_artifact) rc = write_artifact(&c, &a);
        if (!rc && c.have_plan && !c.stopped) rc = write_emits(&c, &a);
        if (c.stopped && !a.ir && !a.pipe.dump)
            printf("stopped after %s: %d values (--ir or --dump-STAGE prints the graph)\n",
                   pipeline_stage_name(a.pipe.stop_after), c.g.n);
    }
    compiled_free(&c);
    return rc;
}

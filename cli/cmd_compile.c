/* cli/cmd_compile.c — `hpc compile MODEL`: the compiler half of hpc.
 *
 * Runs the stages in order: check -> pipeline_build (lower -> autodiff ->
 * precision -> fuse, compiler/pipeline.h) -> plan -> emit (the CUDA source
 * goes into the NAME.hpc artifact, program/artifact.h).  Dump flags print after the last stage
 * that ran: --ir and --dot show the graph (after fuse unless --no-fuse or
 * --stop-after), --precision-report the precision choice per op, --plan the
 * memory plan; --dump-STAGE prints the graph after any compiler stage. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "program/artifact.h"
#include "autodiff.h"
#include "cli.h"
#include "emit_lib.h"
#include "formats/atomic_file.h"
#include "formats/output_check.h"
#include "emit_ops.h"
#include "program/ir.h"
#include "compiler/ir_print.h"
#include "lower.h"
#include "cuda/nvrtc_compile.h"
#include "program/params.h"
#include "pipeline.h"
#include "program/plan.h"
#include "compiler/plan_graph.h"
#include "precision.h"
#include "program/spec.h"
#include "compiler/spec_load.h"
#include "step_program_build.h"
#include "summary.h"

typedef struct {
    int v[EMITLIB_MAX_ARCHS], n;
} ArchList;

typedef struct {
    const char *model, *dot;
    bool ir, report, plan;
    SpecPrecision policy;
    PipeOptions pipe;    /* from --no-fuse, --dump-STAGE, --stop-after */
    bool no_fuse, dump[PIPE_STAGE_COUNT];
    const char *stop_after;
    const char *out;     /* -o: the artifact's path */
    bool no_artifact;
    bool pack;           /* --pack: train.pack = true (docs/packing.md) */
    const char *emit_cuda, *emit_lib; /* --emit-cuda DIR, --emit-lib DIR */
    ArchList arch;       /* --arch */
} CompileArgs;

/* --arch 80,90 into an ArchList. */
static bool parse_archs(const CliOpt *opt, const char *v, void *field, char *why, size_t cap)
{
    ArchList *l = field;
    if (emitlib_parse_archs(v, l->v, &l->n)) return true;
    snprintf(why, cap, "--arch %.60s: expected up to %d compute capabilities in [50, 200], such as 80,90 "
             "or sm_80,sm_90", v, EMITLIB_MAX_ARCHS);
    return false;
}

/* Rows sharing a bit contradict each other: one policy; -o or --no-artifact;
 * --no-fuse or --dump-fuse; --stop-after or an output of the whole pipeline. */
enum { EX_PRECISION = 1, EX_OUTPUT = 2, EX_FUSE = 4, EX_STOP_OUT = 8, EX_STOP_CUDA = 16, EX_STOP_LIB = 32 };

static const char *const STAGES[] = {"lower", "autodiff", "precision", "fuse", NULL};

#define A(f) offsetof(CompileArgs, f)
static const CliOpt compile_opts[] = {
    {.name = "fp32", .kind = CLI_SET, .off = A(policy), .set = PREC_FP32, .excludes = EX_PRECISION,
     .help = "precision policy fp32 (default: the graph stays f32)"},
    {.name = "fp16", .kind = CLI_SET, .off = A(policy), .set = PREC_FP16, .excludes = EX_PRECISION,
     .help = "precision policy fp16 (mixed: values stored in 16 bits)"},
    {.name = "bf16", .kind = CLI_SET, .off = A(policy), .set = PREC_BF16, .excludes = EX_PRECISION,
     .help = "precision policy bf16 (mixed: values stored in 16 bits)"},
    {.name = "ir", .kind = CLI_FLAG, .off = A(ir),
     .help = "the graph, one value per line: op, inputs, attributes, shape and dtype"},
    {.name = "dot", .kind = CLI_STR, .off = A(dot), .meta = "FILE",
     .help = "the graph as Graphviz dot (render: dot -Tsvg FILE)"},
    {.name = "precision-report", .kind = CLI_FLAG, .off = A(report),
     .help = "the precision class and dtypes of every op"},
    {.name = "plan", .kind = CLI_FLAG, .off = A(plan),
     .help = "the memory plan of a step at the model's batch x max_seq_len"},
    {.name = "no-fuse", .kind = CLI_FLAG, .off = A(no_fuse), .excludes = EX_FUSE,
     .help = "skip the fuse pass (the unfused graph, as before fusion)"},
    {.name = "pack", .kind = CLI_FLAG, .off = A(pack),
     .help = "a packed program (the model's `pack = true`): batches hold every sequence's tokens back to "
             "back with no padding rows, so a step costs the real tokens (docs/packing.md); sequences up to the "
             "model's seq_len; on the GPU with --fp16 or --bf16"},
    {.name = "dump-lower", .kind = CLI_FLAG, .off = A(dump[PIPE_LOWER]), .help = "print the graph after lowering"},
    {.name = "dump-autodiff", .kind = CLI_FLAG, .off = A(dump[PIPE_AUTODIFF]),
     .help = "print the graph after autodiff (forward and backward)"},
    {.name = "dump-precision", .kind = CLI_FLAG, .off = A(dump[PIPE_PRECISION]),
     .help = "print the graph after the precision pass"},
    {.name = "dump-fuse", .kind = CLI_FLAG, .off = A(dump[PIPE_FUSE]), .excludes = EX_FUSE,
     .help = "print the graph after fusion"},
    {.name = "stop-after", .kind = CLI_STR, .off = A(stop_after), .meta = "STAGE", .choices = STAGES,
     .excludes = EX_STOP_OUT | EX_STOP_CUDA | EX_STOP_LIB,
     .help = "run the compiler stages up to STAGE only: lower, autodiff, precision or fuse"},
    {.name = "output", .short_name = 'o', .kind = CLI_STR, .off = A(out), .meta = "FILE",
     .excludes = EX_OUTPUT | EX_STOP_OUT,
     .help = "write the artifact to FILE (default NAME.hpc in the current directory, NAME from the model)"},
    {.name = "no-artifact", .kind = CLI_FLAG, .off = A(no_artifact), .excludes = EX_OUTPUT,
     .help = "write no artifact"},
    {.name = "emit-cuda", .kind = CLI_STR, .off = A(emit_cuda), .meta = "DIR", .excludes = EX_STOP_CUDA,
     .help = "write DIR/NAME_step.cuh (the training step's own kernels, the ones hpc runs and tests) "
             "and DIR/NAME_kernels.cuh (the fused LayerNorm/optimizer templates) for nvcc"},
    {.name = "emit-lib", .kind = CLI_STR, .off = A(emit_lib), .meta = "DIR", .excludes = EX_STOP_LIB,
     .help = "write a package to embed the model in a C program: NAME.h/.c, a Makefile, the .cuh files, "
             "NAME.hpc with the step program (docs/embedding.md)"},
    {.name = "arch", .kind = CLI_FN, .off = A(arch), .meta = "LIST", .fn = parse_archs,
     .help = "also compile the step for these archs (e.g. 80,90) into NAME.hpc, so `hpc run` on "
             "such a GPU runs no NVRTC for the step (with --emit-lib, also cubins of the package's kernels)"},
    CLI_END,
};
#undef A

const CliCommand cli_compile_command = {
    .name = "compile", .args = "MODEL", .arg_name = "MODEL", .min_args = 1, .max_args = 1,
    .about = "Checks MODEL (a .model file), lowers it to the graph IR, builds the\n"
             "backward graph, plans the precision of every value and the memory of a\n"
             "training step, fuses what it can, emits the CUDA source and writes the\n"
             "artifact NAME.hpc (the resolved model, the plan and the CUDA source) that\n"
             "`hpc run` takes.\n",
    .sections = {{"options", compile_opts, 0}},
};

/* The pipeline's settings from the flags. */
static void compile_pipe_options(CompileArgs *a)
{
    a->pipe = pipeline_defaults(PREC_FP32);
    a->pipe.fuse = !a->no_fuse;
    for (int s = 0; s < PIPE_STAGE_COUNT; s++)
        if (a->dump[s]) a->pipe.dump |= PIPE_BIT(s);
    if (a->stop_after) a->pipe.stop_after = pipeline_stage_parse(a->stop_after);
}

/* An output file (-o, --dot) that is not the model and can be written;
 * checked before anything is written, so a bad one leaves nothing behind. */
static int check_out_path(const char *opt, const char *path, const char *model)
{
    HpcError err = {0};
    return output_check_file(opt, path, &(OutputInput){"the model file", model}, 1, &err) ? cli_report(&err)
                                                                                         : HPC_OK;
}

/* The graph in Graphviz form, replaced atomically (runtime/formats/atomic_file.h);
 * its path passed check_out_path. */
static int write_dot(const IrGraph *g, const char *path)
{
    HpcError err = {0};
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) return cli_report(&(HpcError){HPC_ERR_OOM, "out of host memory for the graph"});
    ir_dot(g, mem);
    fclose(mem);
    HpcStatus st = atomic_write_file(path, text, len, &err);
    free(text);
    if (st) return cli_report(&err);
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

static HpcStatus compile_stages(Compiled *c, const CompileArgs *a, HpcError *err)
{
    HpcStatus st = compile_pipeline(c, a->pipe, a->policy, err);
    c->stopped |= a->stop_after != NULL;    /* --stop-after fuse too: the last stage, but no plan nor artifact */
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
    bool first_token = false;
    for (int i = 0; i < c->g.n; i++)
        first_token |= c->g.nodes[i].op == IR_OP_ATTENTION && c->g.nodes[i].attr.attn.first_query;
    printf("\nlowered    %lld parameters in %d tensors (%d with gradients)%s\n",
           (long long)params_total(&c->pl), c->pl.n, trainable,
           first_token ? "; the last layer for token 0 only, which the head reads (HPC_LAST_LAYER=all: "
                         "every token)" : "");
    printf("graph      %d values: %d forward, %d backward; %d casts for %s\n", c->g.n,
           c->g.n_forward, c->g.n - c->g.n_forward, c->prec.n_casts, spec_precision_name(policy));
    PlanMemory m;
    plan_memory(&c->plan, &c->g, &c->pl, &c->spec.train, &m);
    printf("memory     %.1f MiB per training step at batch %lld x %lld (arena %.1f MiB)\n",
           (double)m.total / 1048576.0, (long long)c->plan.B, (long long)c->plan.L,
           (double)m.arena / 1048576.0);
    char ones[64] = "";
    if (c->fuse.ln_db_from_ones)
        snprintf(ones, sizeof ones, " (%d with the bias gradient from a ones column)", c->fuse.ln_db_from_ones);
    char keep[80] = "";
    if (c->fuse.attn_keep)
        snprintf(keep, sizeof keep, ", %d attention backward passes reading the saved keep bits", c->fuse.attn_keep);
    if (c->fused)
        printf("fused      %d softmax+dropout, %d their backward, %d dropout+residual, %d LayerNorm sites "
               "(%d backward, %d casts folded), %d dW+bias gradient, %d activation backward+bias gradient, "
               "%d activations recomputed, %d gradient sums in dX GEMMs, %d dW GEMMs from a saved xhat%s, "
               "%d embedding layer (HPC_FUSE_EMB=0: none)%s: %d -> %d values\n",
               c->fuse.softmax_dropout, c->fuse.softmax_dropout_bwd, c->fuse.dropout_add, c->fuse.ln_residual,
               c->fuse.ln_residual_bwd, c->fuse.ln_casts_folded, c->fuse.linear_dw_bgrad, c->fuse.act_bwd_bgrad,
               c->fuse.act_recompute, c->fuse.linear_dx_acc, c->fuse.ln_dw_from_xhat, ones, c->fuse.embed_ln,
               keep, c->fuse.nodes_before, c->fuse.nodes_after);
    printf("stages     check, lower, autodiff, precision, %splan, emit done\n", c->fused ? "fuse, " : "");
}

/* Where the artifact goes: -o, else NAME.hpc. */
static void artifact_out_path(const Compiled *c, const CompileArgs *a, char *path, size_t cap)
{
    if (a->out) snprintf(path, cap, "%s", a->out);
    else artifact_path_for(c->spec.name, path, cap);
}

/* NAME.hpc (program/artifact.h): the step program (what `hpc run`
 * executes), the resolved model, the plan summary and the CUDA source, at
 * a path that passed check_out_path. */
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
    artifact_out_path(c, a, path, sizeof path);
    StepProgram prog;
    HpcStatus st = step_program_from_graph(&c->spec, a->policy, c->fused, &c->g, &c->pl, &prog, &err);
    bool have_prog = !st;
    for (int i = 0; i < a->arch.n && !st; i++) {   /* --arch: the module compiled ahead */
        void *cubin = NULL;
        size_t n = 0;
        st = nvrtc_compile(prog.kernels.cuda_source, "hpc_ops", a->arch.v[i], NULL, 0, &cubin, &n, NULL, &err);
        if (!st) st = step_kernels_add_cubin(&prog.kernels, a->arch.v[i], cubin, n, &err);
        free(cubin);
    }
    if (!st) st = step_program_save(path, &prog, plan, &err);
    if (!st) fprintf(stderr, "hpc: wrote %s (run it: hpc run %s)\n", path, path);
    if (have_prog) step_program_free(&prog);
    free(plan);
    return st ? cli_report(&err) : HPC_OK;
}

static HpcStatus emit_nvrtc(const char *src, const char *name, int arch, void **cubin, size_t *n, HpcError *err)
{
    return nvrtc_compile(src, name, arch, NULL, 0, cubin, n, NULL, err);
}

/* The length of folder name dir without its trailing slashes ("/" stays). */
static int dir_len(const char *dir)
{
    int n = (int)strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    return n;
}

/* --emit-cuda and --emit-lib (compiler/emit_lib.h). */
static int write_emits(const Compiled *c, const CompileArgs *a)
{
    HpcError err = {0};
    HpcStatus st = HPC_OK;
    if (a->emit_cuda) st = emitlib_cuda(&c->spec, a->policy, a->emit_cuda, &err);
    if (!st && a->emit_cuda) {
        int n = dir_len(a->emit_cuda);
        fprintf(stderr, "hpc: wrote %.*s/%s_kernels.cuh and %.*s/%s_step.cuh\n", n, a->emit_cuda, c->spec.name, n,
                a->emit_cuda, c->spec.name);
    }
    if (st || !a->emit_lib) return st ? cli_report(&err) : HPC_OK;
    EmitLibOptions o = {.policy = a->policy, .n_archs = a->arch.n, .compile = emit_nvrtc};
    memcpy(o.archs, a->arch.v, sizeof o.archs);
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
    if (!st) fprintf(stderr, "hpc: wrote the package %.*s/ (build it: make -C %s run)\n", dir_len(a->emit_lib),
                     a->emit_lib, a->emit_lib);
    free(plan);
    free(cuda);
    return st ? cli_report(&err) : HPC_OK;
}

/* --stop-after STAGE refuses what needs a later stage (they printed
 * nothing and exited 0): --plan, --arch, --precision-report before precision,
 * --dump-STAGE of a stage after STAGE. */
static int check_stop_after(const CompileArgs *a)
{
    char dump[64] = "";
    if (!a->stop_after) return HPC_OK;
    for (int s = a->pipe.stop_after + 1; s < PIPE_STAGE_COUNT && !*dump; s++)
        if (a->dump[s]) snprintf(dump, sizeof dump, "--dump-%s", pipeline_stage_name((PipeStage)s));
    bool early_report = a->report && a->pipe.stop_after < PIPE_PRECISION;
    const char *opt = a->plan ? "--plan" : a->arch.n ? "--arch" : early_report ? "--precision-report"
                      : *dump ? dump : NULL;
    if (!opt) return HPC_OK;
    fprintf(stderr, "hpc: compile: --stop-after %s and %s contradict each other (%s needs a stage after %s); "
            "give one of them\n", a->stop_after, opt, opt, a->stop_after);
    return HPC_ERR_USAGE;
}

/* --arch compiles the step into NAME.hpc or the --emit-lib package; with
 * --no-artifact and no --emit-lib it was dropped without a word. */
static int check_arch_target(const CompileArgs *a)
{
    if (!a->arch.n || !a->no_artifact || a->emit_lib) return HPC_OK;
    fprintf(stderr, "hpc: compile: --arch and --no-artifact contradict each other (--arch compiles the step into "
            "the artifact or the --emit-lib package); give one of them, or add --emit-lib\n");
    return HPC_ERR_USAGE;
}

/* A packed program under fp32 has no CUDA kernels (compiler/
 * step_program_build.c: its varlen attention exists in 16 bits only, so it
 * runs on the cpu backend): an option that needs them is refused before
 * anything is written. */
static int check_cuda_wanted(const Compiled *c, const CompileArgs *a)
{
    const char *opt = a->arch.n ? "--arch" : a->emit_cuda ? "--emit-cuda" : a->emit_lib ? "--emit-lib" : NULL;
    SpecPrecision policy = a->policy == PREC_DEFAULT ? PREC_FP32 : a->policy;
    if (!opt || !ir_graph_packed(&c->g) || policy != PREC_FP32) return HPC_OK;
    fprintf(stderr, "hpc compile: %s: %s is packed (--pack or the model's `pack = true`, docs/packing.md) and "
            "compiled for fp32, and such a program has no CUDA kernels: packed batches need the fused "
            "attention, which runs in 16 bits only (fp32 packed programs run on the cpu backend); add --fp16 "
            "or --bf16, or leave out --pack\n", opt, a->model);
    return HPC_ERR_USAGE;
}

/* --emit-cuda DIR and --emit-lib DIR checked before the artifact is written
 * (it was left behind when DIR could not be made): DIR must be a folder that
 * takes new files (NAME_kernels.cuh), or a new name in such a folder. */
static int check_emit_dir(const char *opt, const char *dir, const char *name)
{
    HpcError err = {0};
    struct stat st;
    char path[4200];
    int n = dir_len(dir);
    bool exists = stat(dir, &st) == 0;
    if (exists && !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "hpc: %s %s: exists and is not a folder; pick another DIR\n", opt, dir);
        return HPC_ERR_IO;
    }
    if (exists) snprintf(path, sizeof path, "%.*s/%s_kernels.cuh", n, dir, name);   /* a file it will hold */
    else snprintf(path, sizeof path, "%.*s", n, dir);                               /* a new name in its folder */
    return output_check_writable(opt, path, &err) ? cli_report(&err) : HPC_OK;
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
    CompileArgs a = {.policy = PREC_FP32};
    CliParsed p;
    HpcError perr = {0};
    int rc = cli_parse(&cli_compile_command, argc, argv, &a, &p, &perr);
    if (rc) return rc == CLI_HELP_SHOWN ? HPC_OK : cli_report(&perr);
    a.model = p.args[0];
    compile_pipe_options(&a);
    if ((rc = check_stop_after(&a)) || (rc = check_arch_target(&a))) return rc;
    Compiled c;
    memset(&c, 0, sizeof c);
    int nerr = spec_load(a.model, &c.spec, stderr);
    if (nerr) return nerr < 0 ? HPC_ERR_IO : HPC_ERR_INPUT;
    if (a.pack) c.spec.train.pack = true;
    ir_init(&c.g);
    params_init(&c.pl);
    HpcError err = {0};
    if (compile_stages(&c, &a, &err)) {
        rc = cli_report(&err);
    } else {
        if (a.ir) ir_print(&c.g, stdout);
        if (a.report && c.have_prec) precision_report(&c.g, &c.prec, stdout);
        if (a.plan && c.have_plan) plan_print(&c.plan, &c.g, &c.pl, &c.spec.train, stdout);
        bool artifact = c.have_plan && !c.stopped && !a.no_artifact;
        char artifact_path[4096];
        artifact_out_path(&c, &a, artifact_path, sizeof artifact_path);
        /* every output checked before the first is written */
        if (a.dot) rc = check_out_path("--dot", a.dot, a.model);
        if (!rc && artifact) rc = check_out_path("-o", artifact_path, a.model);
        if (!rc && c.have_plan && !c.stopped) rc = check_cuda_wanted(&c, &a);
        if (!rc && a.emit_cuda) rc = check_emit_dir("--emit-cuda", a.emit_cuda, c.spec.name);
        if (!rc && a.emit_lib) rc = check_emit_dir("--emit-lib", a.emit_lib, c.spec.name);
        bool quiet = a.ir || a.report || a.plan || a.pipe.dump || c.stopped;
        if (!quiet && !rc) print_summary(&c, a.policy);
        if (!rc && a.dot) rc = write_dot(&c.g, a.dot);
        if (!rc && artifact) rc = write_artifact(&c, &a);
        if (!rc && c.have_plan && !c.stopped) rc = write_emits(&c, &a);
        if (c.stopped && !a.ir && !a.pipe.dump)
            printf("stopped after %s: %d values (--ir or --dump-STAGE prints the graph)\n",
                   pipeline_stage_name(a.pipe.stop_after), c.g.n);
    }
    compiled_free(&c);
    return rc;
}

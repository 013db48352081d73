/* runtime/train/memcheck.c — see memcheck.h. */
#include "train/memcheck.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "program/plan.h"
#include "cuda/cuda_driver.h"
#include "cuda/gemm_cublas.h"
#include "util/phase_clock.h"
#include "dist/rendezvous.h"
#include "train/init.h"
#include "train/optim.h"
#include "train/spec_compile.h"   /* a spec without its program: compiled here */

#define MIB (1024.0 * 1024.0)

int64_t memcheck_cpu_need(const IrGraph *g, const ParamList *pl, const SpecTraining *train, int64_t B, int64_t L,
                          bool checkpoint_copy)
{
    int64_t bytes = 0;
    for (int i = 0; i < g->n; i++) {
        const IrNode *v = &g->nodes[i];
        /* an f32 PARAM reads the master in place; a 16-bit one gets its own rounded copy */
        if (v->op == IR_OP_PARAM && v->dtype == DT_F32) continue;
        bytes += ir_numel(v, B, L) * 4;   // the cpu executor stores f16/bf16 values as rounded f32
    }
    OptimConfig oc;
    optim_config_from_spec(&oc, train);
    int64_t words = 1 + optim_needs_m(&oc) + optim_needs_v(&oc);   /* per trainable element: grad, m, v */
    for (int p = 0; p < pl->n; p++) {
        if (pl->p[p].tied_to >= 0) continue;
        int64_t n = params_numel(&pl->p[p]);
        bool trains = p < g->n_params && g->param_grad[p] >= 0;
        int64_t per = 1 + (trains ? words : 0);                            /* master (+ grad, m, v) */
        if (checkpoint_copy) per += 1 + (trains ? words - 1 : 0);          /* host copy of w (+ m, v) */
        bytes += n * per * 4;
    }
    return bytes;
}

/* "MemAvailable:   24123456 kB" -> bytes; -1 when absent. */
static int64_t meminfo_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb >= 0 ? kb * 1024 : -1;
}

/* The address space this process already uses (/proc/self/statm, pages). */
static int64_t vm_size(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long long pages = 0;
    if (f && fscanf(f, "%lld", &pages) != 1) pages = 0;
    if (f) fclose(f);
    return pages * (int64_t)sysconf(_SC_PAGESIZE);
}

HpcStatus memcheck_host_available(int64_t *bytes, char *source, size_t cap, HpcError *err)
{
    const char *fake = getenv("HPC_MEMCHECK_AVAILABLE_MIB");
    if (fake && *fake) {
        *bytes = (int64_t)(atof(fake) * MIB);
        snprintf(source, cap, "HPC_MEMCHECK_AVAILABLE_MIB");
        return HPC_OK;
    }
    int64_t avail = meminfo_available();
    snprintf(source, cap, "MemAvailable in /proc/meminfo");
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        int64_t left = (int64_t)rl.rlim_cur - vm_size();
        if (left < 0) left = 0;
        if (avail < 0 || left < avail) {
            avail = left;
            snprintf(source, cap, "what is left of the address-space limit, ulimit -v %lld kB",
                     (long long)(rl.rlim_cur / 1024));
        }
    }
    if (avail < 0)
        return hpc_fail(err, HPC_ERR_IO, "memory check: /proc/meminfo has no MemAvailable line and no address-space "
                        "limit is set; pass --no-memory-check");
    *bytes = avail;
    return HPC_OK;
}

HpcStatus memcheck_compare(const char *what, int64_t need, int64_t available, const char *source, HpcError *err)
{
    if (need <= available) return HPC_OK;
    return hpc_fail(err, HPC_ERR_OOM, "not enough memory: %s needs %.0f MiB, %.0f MiB available (%s); use a smaller "
                    "--batch or --seq-len, or pass --no-memory-check to start anyway", what, (double)need / MIB,
                    (double)available / MIB, source);
}

static HpcStatus check_cpu(const IrGraph *g, const ParamList *pl, const ModelSpec *spec, int64_t B, int64_t L,
                           bool ckpt, HpcError *err)
{
    int64_t need = memcheck_cpu_need(g, pl, &spec->train, B, L, ckpt), avail;
    char source[160], what[200];
    HpcStatus st = memcheck_host_available(&avail, source, sizeof source, err);
    /* Parameters drawn ahead (train/init.h) are counted in need and already
     * taken from what the system reports; a figure from the test hook is as given. */
    if (!st && strcmp(source, "HPC_MEMCHECK_AVAILABLE_MIB") != 0) avail += init_store_ahead_bytes();
    snprintf(what, sizeof what, "training %s on the cpu (batch %lld, sequence %lld)", spec->name, (long long)B,
             (long long)L);
    return st ? st : memcheck_compare(what, need, avail, source, err);
}

/* The step plan the cuda executor will make: the program's records give
 * each node's scratch (as cuda_exec_init_program does). */
static HpcStatus check_cuda(const StepProgram *prog, const ModelSpec *spec, int64_t B, int64_t L, HpcError *err)
{
    const IrGraph *g = &prog->g;
    const ParamList *pl = &prog->pl;
    if (prog->kernels.n != g->n)
        return hpc_fail(err, HPC_ERR_INPUT, "memcheck: %d launch records for a graph of %d nodes; recompile the "
                        "program with `hpc compile MODEL`", prog->kernels.n, g->n);
    int64_t *scratch = xcalloc((size_t)(g->n > 0 ? g->n : 1), sizeof *scratch);
    step_kernels_scratch(&prog->kernels, B, L, scratch);
    StepPlan plan;
    HpcStatus st = plan_build_scratch(g, B, L, scratch, &plan, err);
    free(scratch);
    if (st) return st;
    PlanMemory m;
    plan_memory(&plan, g, pl, &spec->train, &m);
    plan_free(&plan);
    size_t free_b = 0, total_b = 0;
    st = cuda_mem_info(&free_b, &total_b, err);
    if (st) return st;
    char what[200], source[64];
    snprintf(what, sizeof what, "training %s on the GPU (batch %lld, sequence %lld)", spec->name, (long long)B,
             (long long)L);
    snprintf(source, sizeof source, "free on GPU 0 of %.0f MiB", (double)total_b / MIB);
    return memcheck_compare(what, m.total + (int64_t)GEMM_DEFAULT_WORKSPACE, (int64_t)free_b, source, err);
}

HpcStatus memcheck_run(const ModelSpec *spec, const StepProgram *program, SpecPrecision policy, bool fuse,
                       TrainDevice device, int64_t B, int64_t L, bool checkpoint_copy, HpcError *err)
{
    CudaDevice dev = {0};
    bool gpu = false;
    if (device != TRAIN_DEVICE_CPU) {
        HpcError ignore = {0};
        gpu = cuda_device_open(&dev, dist_gpu_ordinal(), device == TRAIN_DEVICE_CUDA ? err : &ignore) == HPC_OK;
        phase_mark("memory check: the GPU open (the wait for the thread opening it ahead, cuda_driver.h)");
        if (!gpu && device == TRAIN_DEVICE_CUDA) return err->code;
    }
    /* A compiled program carries the graph the backend will run: size that
     * one rather than compiling the model a second time. */
    StepProgram own;
    bool built = false;
    HpcStatus st = HPC_OK;
    if (!program) {
        st = train_spec_compile(spec, policy, fuse, &own, err);
        built = true;   /* freed below, also after a failure */
        program = &own;
    }
    if (!st)
        st = gpu ? check_cuda(program, spec, B, L, err)
                 : check_cpu(&program->g, &program->pl, spec, B, L, checkpoint_copy, err);
    if (built) step_program_free(&own);
    if (gpu) cuda_device_close_keep_context(&dev);   /* the backend opens it next: no second context creation */
    phase_mark(gpu ? "memory check: a step plan, the GPU's free memory" : "memory check");
    return st;
}

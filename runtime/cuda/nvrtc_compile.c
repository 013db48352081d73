/* runtime/cuda/nvrtc_compile.c — see nvrtc_compile.h. */
#include "cuda/nvrtc_compile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cuda/cuda_driver.h"

#define NVRTC_MAX_OPTIONS 64
#define EMU_MODULE_TAG "//HPC-EMU-MODULE"   /* tools/cuemu/emu_module.c reads it */

/* The full option list of one compile: arch, toolkit headers, the caller's. */
typedef struct {
    const char *v[NVRTC_MAX_OPTIONS];
    int n;
    char arch_opt[48];
    char include_opt[KCACHE_PATH_MAX];
    char split_opt[48];
    char env_opts[512];   /* HPC_NVRTC_OPTIONS, split in place at the spaces */
} OptionList;

int nvrtc_version_number(void)
{
    int major = 0, minor = 0;
    if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return 0;
    return major * 1000 + minor * 10;
}

void nvrtc_supported_archs(char *buf, size_t size)
{
    int n = 0, archs[64];
    buf[0] = '\0';
    if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0 || n > 64 ||
        nvrtcGetSupportedArchs(archs) != NVRTC_SUCCESS)
        return;
    size_t used = 0;
    for (int i = 0; i < n && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%d", i ? "," : "", archs[i]);
}

static int arch_supported(int arch)
{
    int n = 0, archs[64];
    if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0 || n > 64 ||
        nvrtcGetSupportedArchs(archs) != NVRTC_SUCCESS)
        return 1;   /* cannot tell: let the compile itself decide */
    for (int i = 0; i < n; i++)
        if (archs[i] == arch) return 1;
    return 0;
}

/* NVRTC has no built-in search path for cuda_fp16.h / cuda_bf16.h. */
static int find_toolkit_include(char *buf, size_t size)
{
    const char *roots[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda", "/usr"};
    for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++) {
        char probe[KCACHE_PATH_MAX];
        if (!roots[i] || !*roots[i]) continue;
        snprintf(probe, sizeof probe, "%s/include/cuda_fp16.h", roots[i]);
        if (access(probe, R_OK) != 0) continue;
        snprintf(buf, size, "-I%s/include", roots[i]);
        return 1;
    }
    return 0;
}

static HpcStatus options_build(OptionList *o, int arch, const char *const *extra, int n_extra,
                               HpcError *err)
{
    if (arch < CUDA_MIN_ARCH)
        return hpc_fail(err, HPC_ERR_USAGE, "cannot compile for sm_%d: hpc generates code for "
                        "sm_%d and newer", arch, CUDA_MIN_ARCH);
    if (n_extra < 0 || n_extra > NVRTC_MAX_OPTIONS - 4)
        return hpc_fail(err, HPC_ERR_USAGE, "nvrtc_compile: %d options, at most %d", n_extra,
                        NVRTC_MAX_OPTIONS - 4);
    o->n = 0;
    snprintf(o->arch_opt, sizeof o->arch_opt, "--gpu-architecture=sm_%d", arch);
    o->v[o->n++] = o->arch_opt;
    if (find_toolkit_include(o->include_opt, sizeof o->include_opt))
        o->v[o->n++] = o->include_opt;
    /* NVVM and ptxas on every core unless HPC_NVRTC_SPLIT says how many
     * (1: one thread, NVRTC's own default): see nvrtc_compile.h. */
    const char *split = getenv("HPC_NVRTC_SPLIT");
    long threads = 0;
    if (split && *split) {
        char *end;
        threads = strtol(split, &end, 10);
        if (*end || threads < 0 || threads > 1024)
            return hpc_fail(err, HPC_ERR_USAGE, "HPC_NVRTC_SPLIT=%s: expected a thread count 0..1024 "
                            "(0 = every core, 1 = one thread) or nothing", split);
    }
    if (threads != 1) {
        snprintf(o->split_opt, sizeof o->split_opt, "--split-compile=%ld", threads);
        o->v[o->n++] = o->split_opt;
    }
    const char *more = getenv("HPC_NVRTC_OPTIONS");   /* experiments: see nvrtc_compile.h */
    if (more && *more) {
        if (strlen(more) >= sizeof o->env_opts)
            return hpc_fail(err, HPC_ERR_USAGE, "HPC_NVRTC_OPTIONS: %zu characters, at most %zu",
                            strlen(more), sizeof o->env_opts - 1);
        strcpy(o->env_opts, more);
        char *save = NULL;
        for (char *tok = strtok_r(o->env_opts, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
            if (o->n + n_extra + 1 >= NVRTC_MAX_OPTIONS)
                return hpc_fail(err, HPC_ERR_USAGE, "HPC_NVRTC_OPTIONS: too many options (at most %d in all)",
                                NVRTC_MAX_OPTIONS);
            o->v[o->n++] = tok;
        }
    }
    for (int i = 0; i < n_extra; i++) o->v[o->n++] = extra[i];
    /* under the CPU emulator the option keeps its images apart in the cache */
    if (nvrtc_emu_requested()) o->v[o->n++] = "-DHPC_EMU";
    return HPC_OK;
}

/* ---- the CPU emulator (tools/cuemu) -------------------------------------- */

int nvrtc_emu_requested(void)
{
    const char *v = getenv("HPC_CUDA_EMU");
    return v && strcmp(v, "1") == 0;
}

/* The image tools/cuemu's cuModuleLoadData builds with g++: a tag line
 * with the options, then the source, NUL-terminated. */
static HpcStatus emu_image(const char *source, const OptionList *o, void **image, size_t *size,
                           HpcError *err)
{
    size_t n = strlen(EMU_MODULE_TAG) + strlen(source) + 2;
    for (int i = 0; i < o->n; i++) n += strlen(o->v[i]) + 1;
    char *buf = malloc(n + 1);
    if (!buf) return hpc_fail(err, HPC_ERR_OOM, "out of host memory for an emulator image");
    size_t used = (size_t)sprintf(buf, "%s", EMU_MODULE_TAG);
    for (int i = 0; i < o->n; i++) used += (size_t)sprintf(buf + used, " %s", o->v[i]);
    used += (size_t)sprintf(buf + used, "\n%s", source);
    *image = buf;
    *size = used + 1;
    return HPC_OK;
}

/* ---- failures: keep the source and the log on disk ---------------------- */

static void safe_name(char *out, size_t size, const char *name)
{
    size_t i = 0;
    for (; name && name[i] && i + 1 < size && i < 80; i++) {
        char c = name[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '-';
        out[i] = ok ? c : '_';
    }
    out[i] = '\0';
    if (i == 0) snprintf(out, size, "kernel");
}

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) return 0;
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

/* Writes STEM.cu and STEM.log under the cache's failed/ or /tmp; stem gets the path prefix. */
static int save_failure(char *stem, size_t size, const char *name, const KcacheKey *key,
                        const char *source, const char *log)
{
    char dir[KCACHE_PATH_MAX], base[96], hex[65], path[KCACHE_PATH_MAX + 128];
    HpcError ignored;
    safe_name(base, sizeof base, name);
    kcache_key_hex(key, hex);
    hex[8] = '\0';
    if (kcache_dir(dir, sizeof dir, &ignored) == HPC_OK) {
        strncat(dir, "/failed", sizeof dir - strlen(dir) - 1);
        if (access(dir, W_OK) != 0 && mkdir(dir, 0755) != 0) snprintf(dir, sizeof dir, "/tmp");
    } else {
        snprintf(dir, sizeof dir, "/tmp");
    }
    snprintf(stem, size, "%s/%s-%s", dir, base, hex);
    snprintf(path, sizeof path, "%s.cu", stem);
    int ok = write_text(path, source);
    snprintf(path, sizeof path, "%s.log", stem);
    return write_text(path, log) && ok;
}

/* The first line of the log that says "error", or its first line. */
static void first_error(char *out, size_t size, const char *log)
{
    const char *p = strstr(log, "error");
    const char *start = p ? p : log;
    while (p && start > log && start[-1] != '\n') start--;
    size_t n = strcspn(start, "\n");
    if (n >= size) n = size - 1;
    memcpy(out, start, n);
    out[n] = '\0';
}

static HpcStatus compile_failed(const char *name, int arch, const OptionList *o,
                                const char *source, const char *log, HpcError *err)
{
    KcacheKey key;
    char stem[KCACHE_PATH_MAX + 100], line[320];
    kcache_key(&key, source, o->v, o->n, arch, nvrtc_version_number());
    first_error(line, sizeof line, log);
    if (!save_failure(stem, sizeof stem, name, &key, source, log))
        return hpc_fail(err, HPC_ERR_CUDA, "NVRTC could not compile %s for sm_%d: %s "
                        "(and saving the source and log failed); this is a bug in hpc's code "
                        "generator, please report it", name, arch, line);
    return hpc_fail(err, HPC_ERR_CUDA,
                    "NVRTC could not compile %s for sm_%d: %s; source saved to %s.cu, full "
                    "log to %s.log; this is a bug in hpc's code generator, please report it "
                    "with both files", name, arch, line, stem, stem);
}

/* ---- compiling ---------------------------------------------------------- */

static HpcStatus program_log(nvrtcProgram prog, char **log, HpcError *err)
{
    size_t n = 0;
    HpcStatus st = CUDA_CHECK(err, nvrtcGetProgramLogSize(prog, &n));
    if (st) return st;
    *log = malloc(n + 1);
    if (!*log) return hpc_fail(err, HPC_ERR_OOM, "out of host memory for an NVRTC log");
    (*log)[0] = '\0';
    if ((st = CUDA_CHECK(err, nvrtcGetProgramLog(prog, *log)))) {
        free(*log);
        *log = NULL;
    }
    return st;
}

static HpcStatus program_cubin(nvrtcProgram prog, void **cubin, size_t *size, HpcError *err)
{
    HpcStatus st = CUDA_CHECK(err, nvrtcGetCUBINSize(prog, size));
    if (st) return st;
    if (*size == 0)
        return hpc_fail(err, HPC_ERR_CUDA, "NVRTC produced no CUBIN (nvrtcGetCUBINSize = 0): "
                        "the architecture must be a real sm_XX, not compute_XX");
    *cubin = malloc(*size);
    if (!*cubin) return hpc_fail(err, HPC_ERR_OOM, "out of host memory for a %zu-byte cubin", *size);
    if ((st = CUDA_CHECK(err, nvrtcGetCUBIN(prog, *cubin)))) {
        free(*cubin);
        *cubin = NULL;
    }
    return st;
}

static HpcStatus compile_options(const char *source, const char *name, int arch,
                                 const OptionList *o, void **cubin, size_t *size, char **log_out,
                                 HpcError *err)
{
    nvrtcProgram prog;
    char *log = NULL;
    char file[128];
    snprintf(file, sizeof file, "%s.cu", name);
    HpcStatus st = CUDA_CHECK(err, nvrtcCreateProgram(&prog, source, file, 0, NULL, NULL));
    if (st) return st;
    nvrtcResult r = nvrtcCompileProgram(prog, o->n, o->v);
    st = program_log(prog, &log, err);
    if (!st && r == NVRTC_ERROR_COMPILATION)
        st = compile_failed(name, arch, o, source, log, err);
    else if (!st)
        st = CUDA_CHECK(err, r);
    if (!st) st = program_cubin(prog, cubin, size, err);
    nvrtcDestroyProgram(&prog);
    if (log_out && !st) *log_out = log;
    else free(log);
    return st;
}

/* Process-wide counts for nvrtc_compile_stats (atomic: tests compile from
 * several threads). */
static long stat_compiles, stat_hits, stat_micros;

void nvrtc_compile_stats(NvrtcStats *s)
{
    s->compiles = __atomic_load_n(&stat_compiles, __ATOMIC_RELAXED);
    s->cache_hits = __atomic_load_n(&stat_hits, __ATOMIC_RELAXED);
    s->compile_seconds = 1e-6 * (double)__atomic_load_n(&stat_micros, __ATOMIC_RELAXED);
}

static double mono_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static HpcStatus compile_counted(const char *source, const char *name, int arch, const OptionList *o,
                                 void **cubin, size_t *size, char **log, HpcError *err)
{
    double t0 = mono_seconds();
    HpcStatus st = compile_options(source, name, arch, o, cubin, size, log, err);
    __atomic_add_fetch(&stat_compiles, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&stat_micros, (long)(1e6 * (mono_seconds() - t0)), __ATOMIC_RELAXED);
    return st;
}

HpcStatus nvrtc_compile(const char *source, const char *name, int arch,
                        const char *const *options, int num_options,
                        void **cubin, size_t *size, char **log, HpcError *err)
{
    OptionList o;
    *cubin = NULL;
    *size = 0;
    if (log) *log = NULL;
    HpcStatus st = options_build(&o, arch, options, num_options, err);
    if (st) return st;
    if (nvrtc_emu_requested()) {   /* counted as a compile, as the module is one to its users */
        __atomic_add_fetch(&stat_compiles, 1, __ATOMIC_RELAXED);
        return emu_image(source, &o, cubin, size, err);
    }
    if (!arch_supported(arch)) {
        char list[256];
        nvrtc_supported_archs(list, sizeof list);
        int v = nvrtc_version_number();
        return hpc_fail(err, HPC_ERR_CUDA, "NVRTC %d.%d cannot generate code for sm_%d (it "
                        "supports %s); install a newer CUDA toolkit", v / 1000, v % 1000 / 10,
                        arch, list);
    }
    return compile_counted(source, name ? name : "kernel", arch, &o, cubin, size, log, err);
}

/* ---- through the cache -------------------------------------------------- */

static void cache_note(NvrtcCacheInfo *info, const HpcError *e)
{
    snprintf(info->note, sizeof info->note, "%s", e->msg);
}

HpcStatus nvrtc_compile_cached(const char *source, const char *name, int arch,
                               const char *const *options, int num_options,
                               void **cubin, size_t *size, NvrtcCacheInfo *info,
                               HpcError *err)
{
    OptionList o;
    KcacheKey key;
    HpcError cerr;
    char dir[KCACHE_PATH_MAX];
    memset(info, 0, sizeof *info);
    info->result = KCACHE_MISS;
    HpcStatus st = options_build(&o, arch, options, num_options, err);
    if (st) return st;
    kcache_key(&key, source, o.v, o.n, arch, nvrtc_version_number());
    int have_dir = kcache_dir(dir, sizeof dir, &cerr) == HPC_OK;
    if (!have_dir) cache_note(info, &cerr);
    if (have_dir) {
        kcache_entry_path(info->path, sizeof info->path, dir, &key);
        if (kcache_load(dir, &key, cubin, size, &info->result, &cerr) != HPC_OK) {
            cache_note(info, &cerr);
            info->result = KCACHE_MISS;
        }
        if (info->result == KCACHE_HIT) {
            __atomic_add_fetch(&stat_hits, 1, __ATOMIC_RELAXED);
            return HPC_OK;
        }
    }
    st = nvrtc_compile(source, name, arch, options, num_options, cubin, size, NULL, err);
    if (st || !have_dir) return st;
    if (kcache_store(dir, &key, *cubin, *size, &cerr) == HPC_OK) info->stored = true;
    else cache_note(info, &cerr);
    return HPC_OK;
}

/* tools/cuemu/emu_module.c — modules and launches (cuemu.h).
 *
 * Under HPC_CUDA_EMU=1 hpc's nvrtc_compile returns, instead of a cubin, an
 * image that is the module's source text behind the line
 * "//HPC-EMU-MODULE <nvrtc options>" (runtime/cuda/nvrtc_compile.c).
 * cuModuleLoadData builds it with g++ into a shared object, once per
 * source: the object is kept in HPC_EMU_CACHE (default
 * ~/.cache/hpc-emu) under a hash of the source, the prelude and this
 * library's file.  The
 * build preprocesses the source behind the prelude, rewrites its inline
 * PTX (emu_asm.c: after preprocessing, so templates built by macros are
 * whole), adds an entry emu_entry_NAME for each __global__ function and
 * compiles the result.
 *
 * cuLaunchKernel checks the launch as the driver would (a grid or block
 * of zero, more than 1024 threads, more dynamic shared memory than the
 * function allows; a grid that is no multiple of the kernel's
 * __cluster_dims__, or a cluster of more than 8 blocks, ends the run) and
 * enqueues the grid's run with a copy of the parameters, so a captured
 * launch replays with the values of its capture.  HPC_EMU_TRACE=1 prints
 * every launch. */
#define _GNU_SOURCE
#include "cuemu.h"
#include "emu_asm.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EMU_API __attribute__((visibility("default")))
#define MODULE_TAG "//HPC-EMU-MODULE"

#ifndef CUEMU_PRELUDE
#error "build with -DCUEMU_PRELUDE=\"/path/to/emu_kernel.h\""
#endif

typedef struct { unsigned grid[3], block[3], dynamic_smem; } Dims;   /* emu::Dims */
typedef void (*EntryFn)(int op, void **params, void *blob, size_t *size, const Dims *d);

struct CUmod_st {
    void *so;
};

struct CUfunc_st {
    EntryFn entry;
    char name[128];
    int max_dynamic_smem;
    unsigned cluster[3];   /* __cluster_dims__, else 1, 1, 1 */
};

static uint64_t fnv1a(uint64_t h, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    if (buf && len) *len = (size_t)n;
    return buf;
}

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fputs(text, f) >= 0;
    return (fclose(f) == 0) & ok;
}

static const char *prelude_path(void)
{
    const char *p = getenv("HPC_EMU_PRELUDE");
    return p && *p ? p : CUEMU_PRELUDE;
}

/* A hash of this library's own file (its rewriter shapes every module). */
static uint64_t g_library_hash;

static void hash_library(void)
{
    Dl_info info;
    size_t len = 0;
    char *bytes = dladdr((void *)hash_library, &info) && info.dli_fname ? read_file(info.dli_fname, &len) : NULL;
    g_library_hash = bytes ? fnv1a(0xcbf29ce484222325ull, bytes, len) : 0;
    free(bytes);
}

static uint64_t library_hash(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, hash_library);
    return g_library_hash;
}

/* tools/cuemu/include, beside the prelude. */
static const char *include_dir(void)
{
    static char dir[4096];
    snprintf(dir, sizeof dir, "%s", prelude_path());
    char *slash = strrchr(dir, '/');
    snprintf(slash ? slash + 1 : dir, sizeof dir - (size_t)(slash ? slash + 1 - dir : 0), "include");
    return dir;
}

static void cache_dir(char *buf, size_t size)
{
    const char *v = getenv("HPC_EMU_CACHE");
    if (v && *v) snprintf(buf, size, "%s", v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v) snprintf(buf, size, "%s/hpc-emu", v);
    else if ((v = getenv("HOME")) && *v) snprintf(buf, size, "%s/.cache/hpc-emu", v);
    else snprintf(buf, size, "/tmp/hpc-emu-%d", (int)getuid());
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", buf);
    for (char *p = parent + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(parent, 0755);
            *p = '/';
        }
    mkdir(buf, 0755);
}

/* The -D, -U and -I options of the module's NVRTC option line. */
static void macro_options(const char *line, char *out, size_t size)
{
    out[0] = '\0';
    size_t used = 0;
    while (*line && *line != '\n') {
        while (*line == ' ') line++;
        size_t n = strcspn(line, " \n");
        if (n > 2 && line[0] == '-' && (line[1] == 'D' || line[1] == 'U' || line[1] == 'I'))
            used += (size_t)snprintf(out + used, used < size ? size - used : 0, " '%.*s'", (int)n, line);
        /* NVRTC defines it for the architecture-specific target (wgmma) */
        if (n == strlen("--gpu-architecture=sm_90a") && !strncmp(line, "--gpu-architecture=sm_90a", n))
            used += (size_t)snprintf(out + used, used < size ? size - used : 0, " -D__CUDA_ARCH_FEAT_SM90_ALL");
        line += n;
    }
}

/* The prelude defines __global__ as this attribute, so the names of the
 * kernels can be read from the preprocessed source; __cluster_dims__(...)
 * as CLUSTER_MARK(...), read here and then blanked. */
#define KERNEL_MARK "__attribute__((used))"
#define CLUSTER_MARK "__emu_cluster_dims__"
#define SOURCE_MARK "struct emu_module_source_begins;"

/* At p, after spaces: CLUSTER_MARK(x[, y[, z]]) with literal integers
 * into dims (missing ones 1); returns the position after it, or p. */
static const char *cluster_mark(const char *p, unsigned dims[3], int *seen)
{
    const char *q = p;
    while (isspace((unsigned char)*q)) q++;
    if (strncmp(q, CLUSTER_MARK, strlen(CLUSTER_MARK)) != 0) return p;
    q += strlen(CLUSTER_MARK);
    while (isspace((unsigned char)*q)) q++;
    if (*q++ != '(') emu_die("__cluster_dims__ without its (x, y, z)");
    dims[0] = dims[1] = dims[2] = 1;
    for (int i = 0;; i++) {
        char *end;
        unsigned long v = strtoul(q, &end, 10);
        while (isspace((unsigned char)*end)) end++;
        if (i == 3 || end == q || v == 0 || v > 8 || (*end != ',' && *end != ')'))
            emu_die("__cluster_dims__(%.40s: the emulator takes one to three literal integers from 1 to 8", q);
        dims[i] = (unsigned)v;
        q = end + 1;
        if (*end == ')') break;
    }
    *seen = 1;
    return q;
}

/* Blanks every CLUSTER_MARK(...) (kernel_entries has read them). */
static void blank_cluster_marks(char *text)
{
    for (char *p = strstr(text, CLUSTER_MARK); p; p = strstr(p, CLUSTER_MARK)) {
        char *close = strchr(p, ')');
        if (!close) emu_die("__cluster_dims__ without its closing ')'");
        memset(p, ' ', (size_t)(close - p + 1));
    }
}

typedef struct {
    char name[256];
    unsigned cluster[3];
    int has_cluster;
} Kernel;

/* Appends to *out the entry of every kernel after `KERNEL_MARK [cluster]
 * void [cluster]` in text (each name once; its cluster dims from whichever
 * of its declarations has them). */
static void kernel_entries(const char *text, char **out, size_t *used, size_t *cap)
{
    const size_t mark = strlen(KERNEL_MARK);
    Kernel *ks = NULL;
    int nk = 0;
    for (const char *p = strstr(text, KERNEL_MARK); p; p = strstr(p + 1, KERNEL_MARK)) {
        unsigned dims[3] = {1, 1, 1};
        int seen = 0;
        const char *q = cluster_mark(p + mark, dims, &seen);
        while (isspace((unsigned char)*q)) q++;
        if (strncmp(q, "void", 4) != 0 || !isspace((unsigned char)q[4])) continue;
        q = cluster_mark(q + 4, dims, &seen);
        while (isspace((unsigned char)*q)) q++;
        size_t n = 0;
        while (isalnum((unsigned char)q[n]) || q[n] == '_') n++;
        const char *r = q + n;
        while (isspace((unsigned char)*r)) r++;
        if (!n || *r != '(' || n > 200) continue;
        int k = 0;
        while (k < nk && (strlen(ks[k].name) != n || strncmp(ks[k].name, q, n) != 0)) k++;
        if (k == nk) {   /* the first declaration of this kernel */
            ks = realloc(ks, (size_t)(nk + 1) * sizeof *ks);
            if (!ks) emu_die("out of host memory");
            memset(&ks[nk], 0, sizeof ks[nk]);
            snprintf(ks[nk].name, sizeof ks[nk].name, "%.*s", (int)n, q);
            nk++;
        }
        if (seen && ks[k].has_cluster && memcmp(ks[k].cluster, dims, sizeof dims) != 0)
            emu_die("kernel %s: two declarations with different __cluster_dims__", ks[k].name);
        if (seen) {
            memcpy(ks[k].cluster, dims, sizeof dims);
            ks[k].has_cluster = 1;
        }
    }
    for (int k = 0; k < nk; k++) {
        const char *name = ks[k].name;
        const unsigned *c = ks[k].has_cluster ? ks[k].cluster : (const unsigned[3]){1, 1, 1};
        char line[1200];
        int len = snprintf(line, sizeof line,
                           "extern \"C\" __attribute__((visibility(\"default\"))) void emu_entry_%s(int op, "
                           "void **params, void *blob, size_t *size, const emu::Dims *d) "
                           "{ emu::entry(&%s, \"%s\", op, params, blob, size, d, %uu, %uu, %uu); }\n",
                           name, name, name, c[0], c[1], c[2]);
        if (*used + (size_t)len + 1 > *cap) {
            *cap = 2 * (*cap + (size_t)len + 1);
            *out = realloc(*out, *cap);
            if (!*out) emu_die("out of host memory");
        }
        memcpy(*out + *used, line, (size_t)len + 1);
        *used += (size_t)len;
    }
    free(ks);
}

static int run(const char *cmd)
{
    int rc = system(cmd);
    return rc == 0;
}

/* Builds DIR/HASH.so: the source after the prelude, preprocessed; its
 * inline PTX rewritten (emu_asm.c) and an entry added for each kernel;
 * then compiled.  1 on success. */
static int build(const char *dir, const char *hash, const char *image, const char *source)
{
    char cu[4300], wrap[4300], pre[4300], so[4200], tmp[4300], log[4300], macros[2048];
    char cmd[16384];
    /* files of this build alone: processes (and threads) may build the same module at once */
    static long builds;
    char stem[4200];
    snprintf(stem, sizeof stem, "%s/%s.%d.%ld", dir, hash, (int)getpid(), __atomic_add_fetch(&builds, 1, __ATOMIC_RELAXED));
    snprintf(cu, sizeof cu, "%s.cu", stem);
    snprintf(wrap, sizeof wrap, "%s.wrap.cc", stem);
    snprintf(pre, sizeof pre, "%s.ii", stem);
    snprintf(so, sizeof so, "%s/%s.so", dir, hash);
    snprintf(tmp, sizeof tmp, "%s.so.tmp", stem);
    snprintf(log, sizeof log, "%s.log", stem);
    macro_options(image + strlen(MODULE_TAG), macros, sizeof macros);
    char head[8400];
    snprintf(head, sizeof head, "#include \"%s\"\n" SOURCE_MARK "\n#include \"%s\"\n", prelude_path(), cu);
    if (!write_file(cu, source) || !write_file(wrap, head)) {
        fprintf(stderr, "cuemu: cannot write %s\n", cu);
        return 0;
    }
    /* include/ first: its cuda_fp16.h and cuda_bf16.h, not the toolkit's */
    snprintf(cmd, sizeof cmd, "g++ -E -x c++ -std=c++17 -DHPC_EMU -I'%s'%s '%s' -o '%s' 2>'%s'", include_dir(), macros,
             wrap, pre, log);
    if (!run(cmd)) {
        fprintf(stderr, "cuemu: preprocessing %s failed; see %s\n", cu, log);
        return 0;
    }
    char *text = read_file(pre, NULL);
    char *body = text ? strstr(text, SOURCE_MARK) : NULL;
    if (!body) {
        fprintf(stderr, "cuemu: %s lacks the mark after the prelude\n", pre);
        free(text);
        return 0;
    }
    body += strlen(SOURCE_MARK);
    char *rewritten = emu_rewrite_asm(body);
    size_t cap = 4096, used = 0;
    char *entries = calloc(1, cap);
    kernel_entries(rewritten, &entries, &used, &cap);
    blank_cluster_marks(rewritten);
    *body = '\0';
    FILE *f = fopen(pre, "wb");
    int ok = f && fputs(text, f) >= 0 && fputs(rewritten, f) >= 0 && fputs(entries, f) >= 0;
    if (f) ok &= fclose(f) == 0;
    free(text);
    free(rewritten);
    free(entries);
    if (!ok) {
        fprintf(stderr, "cuemu: cannot write %s\n", pre);
        return 0;
    }
    const char *opt = getenv("HPC_EMU_CXXFLAGS");
    snprintf(cmd, sizeof cmd, "g++ -std=c++17 -O1 -g0 -fPIC -shared -w %s '%s' -o '%s' 2>'%s'", opt ? opt : "", pre,
             tmp, log);
    if (!run(cmd)) {
        fprintf(stderr, "cuemu: g++ could not build %s; see %s\n", pre, log);
        unlink(tmp);
        return 0;
    }
    if (rename(tmp, so) != 0) {
        fprintf(stderr, "cuemu: cannot rename %s: %s\n", tmp, strerror(errno));
        return 0;
    }
    unlink(log);
    unlink(wrap);
    unlink(cu);
    unlink(pre);
    return 1;
}

EMU_API CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    const char *text = image;
    if (strncmp(text, MODULE_TAG, strlen(MODULE_TAG)) != 0) {
        fprintf(stderr, "cuemu: cuModuleLoadData got a real cubin; run with HPC_CUDA_EMU=1 so "
                        "that hpc hands over the source (and clear a kernel cache filled without it)\n");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    const char *source = strchr(text, '\n');
    if (!source) return CUDA_ERROR_INVALID_IMAGE;
    source++;
    size_t plen = 0;
    char *prelude = read_file(prelude_path(), &plen);
    if (!prelude) {
        fprintf(stderr, "cuemu: cannot read the prelude %s (HPC_EMU_PRELUDE)\n", prelude_path());
        return CUDA_ERROR_INVALID_IMAGE;
    }
    uint64_t h = fnv1a(0xcbf29ce484222325ull, text, strlen(text));
    h = fnv1a(h, prelude, plen);
    h ^= library_hash();   /* a rebuilt rewriter (emu_asm.c) builds the modules again */
    free(prelude);
    static const char *const shims[] = {"cuda_fp16.h", "cuda_bf16.h"};   /* include/ */
    for (int i = 0; i < 2; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", include_dir(), shims[i]);
        char *shim = read_file(path, &plen);
        if (shim) h = fnv1a(h, shim, plen);
        free(shim);
    }
    char dir[4096], hash[17], so[4200];
    cache_dir(dir, sizeof dir);
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)h);
    snprintf(so, sizeof so, "%s/%s.so", dir, hash);
    static pthread_mutex_t building = PTHREAD_MUTEX_INITIALIZER;   /* one g++ at a time here */
    pthread_mutex_lock(&building);
    int ok = access(so, R_OK) == 0 || build(dir, hash, text, source);
    pthread_mutex_unlock(&building);
    if (!ok) return CUDA_ERROR_INVALID_IMAGE;
    void *lib = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "cuemu: dlopen %s: %s\n", so, dlerror());
        return CUDA_ERROR_INVALID_IMAGE;
    }
    *module = malloc(sizeof **module);
    if (!*module) return CUDA_ERROR_OUT_OF_MEMORY;
    (*module)->so = lib;
    return CUDA_SUCCESS;
}

EMU_API CUresult cuModuleUnload(CUmodule m)
{
    if (!m) return CUDA_ERROR_INVALID_HANDLE;
    /* the object stays mapped: a captured graph may still hold its entries */
    free(m);
    return CUDA_SUCCESS;
}

EMU_API CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    if (!m) return CUDA_ERROR_INVALID_HANDLE;
    char sym[300];
    snprintf(sym, sizeof sym, "emu_entry_%s", name);
    EntryFn e = (EntryFn)dlsym(m->so, sym);
    if (!e) return CUDA_ERROR_NOT_FOUND;
    *f = calloc(1, sizeof **f);
    if (!*f) return CUDA_ERROR_OUT_OF_MEMORY;
    (*f)->entry = e;
    e(2, NULL, (*f)->cluster, NULL, NULL);
    snprintf((*f)->name, sizeof (*f)->name, "%s", name);
    (*f)->max_dynamic_smem = 48 * 1024;
    return CUDA_SUCCESS;
}

EMU_API CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v)
{
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
        if (v < 0 || v > 232448) return CUDA_ERROR_INVALID_VALUE;
        f->max_dynamic_smem = v;
    }
    return CUDA_SUCCESS;
}

EMU_API CUresult cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f)
{
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    switch (a) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *v = f->max_dynamic_smem; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = 32; break;
    default: *v = 0; break;   /* local, const and static shared bytes: none measured */
    }
    return CUDA_SUCCESS;
}

typedef struct {
    EntryFn entry;
    Dims d;
    size_t bytes;
    unsigned char blob[] __attribute__((aligned(128)));   /* a tensor map parameter wants 64 */
} Launch;

static void run_launch(void *arg)
{
    Launch *l = arg;
    l->entry(1, NULL, l->blob, NULL, &l->d);
}

EMU_API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                unsigned by, unsigned bz, unsigned smem, CUstream s, void **params,
                                void **extra)
{
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (extra) emu_die("cuLaunchKernel: `extra` is not emulated (kernel %s)", f->name);
    if (!gx || !gy || !gz || !bx || !by || !bz) return CUDA_ERROR_INVALID_VALUE;
    if ((unsigned long long)bx * by * bz > 1024 || bz > 64 || gy > 65535 || gz > 65535)
        return CUDA_ERROR_INVALID_VALUE;
    if ((int)smem > f->max_dynamic_smem) return CUDA_ERROR_INVALID_VALUE;
    if (f->cluster[0] * f->cluster[1] * f->cluster[2] > 8)   /* the portable most; 16 needs an opt-in */
        emu_die("cuLaunchKernel: kernel %s has clusters of (%u,%u,%u) blocks, more than the 8 the emulator runs",
                f->name, f->cluster[0], f->cluster[1], f->cluster[2]);
    if (gx % f->cluster[0] || gy % f->cluster[1] || gz % f->cluster[2])
        emu_die("cuLaunchKernel: kernel %s has clusters of (%u,%u,%u) blocks; its grid (%u,%u,%u) is not a multiple",
                f->name, f->cluster[0], f->cluster[1], f->cluster[2], gx, gy, gz);
    static int trace = -1;   /* HPC_EMU_TRACE=1: every launch on stderr */
    if (trace < 0) trace = getenv("HPC_EMU_TRACE") && !strcmp(getenv("HPC_EMU_TRACE"), "1");
    if (trace && f->cluster[0] * f->cluster[1] * f->cluster[2] > 1)
        fprintf(stderr, "cuemu: launch %s grid (%u,%u,%u) block (%u,%u,%u) cluster (%u,%u,%u) dynamic shared %u\n",
                f->name, gx, gy, gz, bx, by, bz, f->cluster[0], f->cluster[1], f->cluster[2], smem);
    else if (trace)
        fprintf(stderr, "cuemu: launch %s grid (%u,%u,%u) block (%u,%u,%u) dynamic shared %u\n", f->name, gx, gy, gz,
                bx, by, bz, smem);
    size_t bytes = 0;
    f->entry(0, params, NULL, &bytes, NULL);
    Launch *l = aligned_alloc(128, (sizeof *l + bytes + 127) / 128 * 128);
    if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
    l->entry = f->entry;
    l->d = (Dims){{gx, gy, gz}, {bx, by, bz}, smem};
    l->bytes = bytes;
    f->entry(0, params, l->blob, &bytes, NULL);
    CUresult r = emu_stream_enqueue(s, run_launch, l, sizeof *l + bytes);
    free(l);
    return r;
}

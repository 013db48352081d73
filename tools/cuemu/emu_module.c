/* tools/cuemu/emu_module.c — modules and launches (cuemu.h).
 *
 * Under HPC_CUDA_EMU=1 hpc's nvrtc_compile returns, instead of a cubin, an
 * image that is the module's source text behind the line
 * "//HPC-EMU-MODULE <nvrtc options>" (runtime/cuda/nvrtc_compile.c).
 * cuModuleLoadData builds it with g++ into a shared object, once per
 * source: the object is kept in HPC_EMU_CACHE (default
 * ~/.cache/hpc-emu) under a hash of the source and the prelude.  The
 * build preprocesses the source once to find its __global__ functions
 * and adds an entry for each (EMU_KERNEL in emu_kernel.h).
 *
 * cuLaunchKernel checks the launch as the driver would (a grid or block
 * of zero, more than 1024 threads, more dynamic shared memory than the
 * function allows) and enqueues the grid's run with a copy of the
 * parameters, so a captured launch replays with the values of its
 * capture. */
#define _GNU_SOURCE
#include "cuemu.h"
#include "emu_asm.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
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

typedef struct { unsigned grid[3], block[3]; } Dims;   /* emu::Dims */
typedef void (*EntryFn)(int op, void **params, void *blob, size_t *size, const Dims *d);

struct CUmod_st {
    void *so;
};

struct CUfunc_st {
    EntryFn entry;
    char name[128];
    int max_dynamic_smem;
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
        line += n;
    }
}

/* The names after `__global__ void [__launch_bounds__(...)]` in the
 * preprocessed source, one a line. */
static char *kernel_names(const char *pre)
{
    size_t cap = 4096, used = 0;
    char *names = malloc(cap);
    names[0] = '\0';
    for (const char *p = strstr(pre, "__global__"); p; p = strstr(p + 1, "__global__")) {
        const char *q = p + strlen("__global__");
        while (isspace((unsigned char)*q)) q++;
        if (strncmp(q, "void", 4) != 0) continue;
        q += 4;
        while (isspace((unsigned char)*q)) q++;
        if (strncmp(q, "__launch_bounds__", 17) == 0) {
            q = strchr(q, ')');
            if (!q) continue;
            q++;
            while (isspace((unsigned char)*q)) q++;
        }
        size_t n = 0;
        while (isalnum((unsigned char)q[n]) || q[n] == '_') n++;
        const char *r = q + n;
        while (isspace((unsigned char)*r)) r++;
        if (!n || *r != '(') continue;
        if (used + n + 2 > cap) names = realloc(names, cap = 2 * cap + n);
        memcpy(names + used, q, n);
        used += n;
        names[used++] = '\n';
        names[used] = '\0';
    }
    return names;
}

static int run(const char *cmd)
{
    int rc = system(cmd);
    return rc == 0;
}

/* Builds DIR/HASH.so from the image; 1 on success. */
static int build(const char *dir, const char *hash, const char *image, const char *source)
{
    char cu[4200], pre[4200], cc[4200], so[4200], tmp[4300], log[4200], macros[2048];
    char cmd[16384];
    snprintf(cu, sizeof cu, "%s/%s.cu", dir, hash);
    snprintf(pre, sizeof pre, "%s/%s.i", dir, hash);
    snprintf(cc, sizeof cc, "%s/%s.emu.cc", dir, hash);
    snprintf(so, sizeof so, "%s/%s.so", dir, hash);
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", so, (int)getpid());
    snprintf(log, sizeof log, "%s/%s.log", dir, hash);
    macro_options(image + strlen(MODULE_TAG), macros, sizeof macros);
    char *rewritten = emu_rewrite_asm(source);
    int written = write_file(cu, rewritten);
    free(rewritten);
    if (!written) {
        fprintf(stderr, "cuemu: cannot write %s\n", cu);
        return 0;
    }
    snprintf(cmd, sizeof cmd, "g++ -E -P -x c++ -std=c++17 -DHPC_EMU -DHPC_EMU_SCAN%s -include '%s' '%s' -o '%s' 2>'%s'",
             macros, prelude_path(), cu, pre, log);
    if (!run(cmd)) {
        fprintf(stderr, "cuemu: preprocessing %s failed; see %s\n", cu, log);
        return 0;
    }
    char *text = read_file(pre, NULL);
    if (!text) return 0;
    char *names = kernel_names(text);
    free(text);
    unlink(pre);
    size_t need = strlen(names) * 2 + 8192;
    char *wrap = malloc(need);
    size_t used = (size_t)snprintf(wrap, need, "#include \"%s\"\n#include \"%s\"\n", prelude_path(), cu);
    for (char *line = names; *line;) {
        size_t n = strcspn(line, "\n");
        used += (size_t)snprintf(wrap + used, need - used, "EMU_KERNEL(%.*s)\n", (int)n, line);
        line += n + (line[n] == '\n');
    }
    free(names);
    int ok = write_file(cc, wrap);
    free(wrap);
    if (!ok) return 0;
    const char *opt = getenv("HPC_EMU_CXXFLAGS");
    snprintf(cmd, sizeof cmd, "g++ -std=c++17 -O1 -g0 -fPIC -shared -w -DHPC_EMU%s %s '%s' -o '%s' 2>'%s'", macros,
             opt ? opt : "", cc, tmp, log);
    if (!run(cmd)) {
        fprintf(stderr, "cuemu: g++ could not build %s; see %s\n", cc, log);
        unlink(tmp);
        return 0;
    }
    if (rename(tmp, so) != 0) {
        fprintf(stderr, "cuemu: cannot rename %s: %s\n", tmp, strerror(errno));
        return 0;
    }
    unlink(log);
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
    free(prelude);
    char dir[4096], hash[17], so[4200];
    cache_dir(dir, sizeof dir);
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)h);
    snprintf(so, sizeof so, "%s/%s.so", dir, hash);
    if (access(so, R_OK) != 0 && !build(dir, hash, text, source)) return CUDA_ERROR_INVALID_IMAGE;
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
    unsigned char blob[];
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
    size_t bytes = 0;
    f->entry(0, params, NULL, &bytes, NULL);
    Launch *l = malloc(sizeof *l + bytes);
    if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
    l->entry = f->entry;
    l->d = (Dims){{gx, gy, gz}, {bx, by, bz}};
    l->bytes = bytes;
    f->entry(0, params, l->blob, &bytes, NULL);
    CUresult r = emu_stream_enqueue(s, run_launch, l, sizeof *l + bytes);
    free(l);
    return r;
}

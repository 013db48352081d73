/* compiler/emit_lib.c — the --emit-cuda header (compiler/emit_lib.h); the
 * --emit-lib package is in emit_lib_package.c. */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "emit_kernels.h"
#include "emit_lib.h"
#include "emit_lib_internal.h"

HpcStatus emitlib_mkdir(const char *dir, HpcError *err)
{
    if (mkdir(dir, 0777) == 0 || errno == EEXIST) {
        struct stat st;
        if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return HPC_OK;
        return hpc_fail(err, HPC_ERR_IO, "emit: %s exists and is not a directory; pick another DIR", dir);
    }
    return hpc_fail(err, HPC_ERR_IO, "emit: mkdir %s: %s (does its parent exist?)", dir, strerror(errno));
}

/* Every file of a package is written as PATH.tmp and renamed over PATH only
 * when complete (emitlib_close), so a failed or interrupted export never
 * leaves a truncated file where a good one was. */
static void emitlib_tmp_path(const char *path, char *tmp, size_t cap)
{
    snprintf(tmp, cap, "%s.tmp", path);
}

HpcStatus emitlib_open(const char *dir, const char *name, const char *ext, char *path, size_t cap, FILE **f,
                       HpcError *err)
{
    snprintf(path, cap, "%s/%s%s", dir, name, ext);
    return emitlib_open_path(path, f, err);
}

HpcStatus emitlib_open_path(const char *path, FILE **f, HpcError *err)
{
    char tmp[4200];
    emitlib_tmp_path(path, tmp, sizeof tmp);
    *f = fopen(tmp, "wb");
    if (!*f) return hpc_fail(err, HPC_ERR_IO, "emit: cannot write %s: %s", tmp, strerror(errno));
    return HPC_OK;
}

HpcStatus emitlib_close(FILE *f, const char *path, HpcError *err)
{
    char tmp[4200];
    emitlib_tmp_path(path, tmp, sizeof tmp);
    bool bad = ferror(f) != 0 || fflush(f) != 0 || fsync(fileno(f)) != 0;
    if (fclose(f) != 0 || bad) {
        unlink(tmp);
        return hpc_fail(err, HPC_ERR_IO, "emit: writing %s failed (disk full?); the old file, if any, is kept",
                        path);
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return hpc_fail(err, HPC_ERR_IO, "emit: rename %s to %s: %s", tmp, path, strerror(e));
    }
    return HPC_OK;
}

KemitDtype emitlib_dtype(SpecPrecision policy)
{
    return policy == PREC_FP16 ? KEMIT_F16 : policy == PREC_BF16 ? KEMIT_BF16 : KEMIT_F32;
}

/* ---- signatures ------------------------------------------------------ */

/* Index just past the parenthesis that closes the one at s[i] ('//'
 * comments skipped), or 0 if unbalanced. */
static size_t skip_parens(const char *s, size_t i)
{
    int depth = 0;
    for (; s[i]; i++) {
        if (s[i] == '/' && s[i + 1] == '/') {
            while (s[i] && s[i] != '\n') i++;
            if (!s[i]) return 0;
        } else if (s[i] == '(') {
            depth++;
        } else if (s[i] == ')' && --depth == 0) {
            return i + 1;
        }
    }
    return 0;
}

/* Prints one line of a signature, without trailing blanks. */
static void print_line(FILE *f, const char *indent, const char *line, size_t n)
{
    while (n > 0 && (line[n - 1] == ' ' || line[n - 1] == '\t' || line[n - 1] == '\\')) n--;
    fprintf(f, "%s%.*s\n", indent, (int)n, line);
}

/* Prints params (the text of "(...)") as comment lines, each trimmed of
 * indentation and of macro line continuations. */
static void print_params(FILE *f, const char *p, size_t n)
{
    const char *indent = "//       ";
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && p[i] != '\n') continue;
        while (start < i && (p[start] == ' ' || p[start] == '\t')) start++;
        print_line(f, indent, p + start, i - start);
        indent = "//         ";
        start = i + 1;
    }
}

/* One kernel's name(s) and signature; "bias_##name##_fwd" stands for one
 * kernel per activation. */
static void print_kernel(FILE *f, const char *base, const char *suffix, const char *params, size_t n)
{
    static const char *const acts[] = {"gelu", "gelu_tanh", "relu", "tanh"};
    const char *hole = strstr(base, "##name##");
    int count = hole ? 4 : 1;
    for (int a = 0; a < count; a++) {
        char b[96];
        if (hole) snprintf(b, sizeof b, "%.*s%s%s", (int)(hole - base), base, acts[a], hole + 8);
        else snprintf(b, sizeof b, "%s", base);
        fprintf(f, "//   %s%s  (HPC_KERNEL_%s)\n", b, suffix, b);
    }
    print_params(f, params, n);
}

void emitlib_print_signatures(FILE *f, const char *src, const char *suffix)
{
    static const char key[] = "extern \"C\" __global__ void";
    for (const char *p = strstr(src, key); p; p = strstr(p + 1, key)) {
        size_t i = (size_t)(p - src) + sizeof key - 1;
        while (isspace((unsigned char)src[i])) i++;
        if (strncmp(src + i, "__launch_bounds__", 17) == 0) {
            i = skip_parens(src, i + 17);
            if (!i) return;
            while (isspace((unsigned char)src[i])) i++;
        }
        if (strncmp(src + i, "KN(", 3) != 0) continue;
        const char *name = src + i + 3, *close = strchr(name, ')');
        if (!close || close - name >= 80) continue;
        char base[96];
        snprintf(base, sizeof base, "%.*s", (int)(close - name), name);
        size_t open = (size_t)(close - src) + 1, end = skip_parens(src, open);
        if (src[open] != '(' || !end) continue;
        print_kernel(f, base, suffix, src + open, end - open);
    }
}

/* ---- the .cuh --------------------------------------------------------- */

static void print_cuh_intro(FILE *f, const ModelSpec *spec, SpecPrecision policy)
{
    fprintf(f,
            "// %s_kernels.cuh: the fused CUDA kernels of model %s (storage %s),\n"
            "// written by `hpc compile %s --emit-cuda DIR`.  Generated: edit the model, not this file.\n"
            "//\n"
            "// Use: #include this header in exactly ONE .cu file (it defines the kernels,\n"
            "// extern \"C\", so other files may declare and launch them) and compile for\n"
            "// sm_80 or newer, e.g. `nvcc -arch=sm_90 -c file.cu`.  It includes no header.\n"
            "//\n"
            "// Conventions (docs/cuda_kernels.md has the details and launch shapes):\n"
            "//  - st_t is the storage type of activations and weight copies: float for f32,\n"
            "//    the raw 16 bits (unsigned short) of an fp16 or bf16 value otherwise; every\n"
            "//    kernel computes in f32 and rounds once when it stores.\n"
            "//  - The model's sizes are compile-time constants (HPC_HIDDEN, HPC_HEADS, ...,\n"
            "//    below); the batch B, length L and row count R are kernel arguments.\n"
            "//  - Row kernels (ln_*, emb_*) run one block of HPC_ROW_THREADS threads per row\n"
            "//    (ln_bwd/emb_bwd: blocks of (HPC_ROW_THREADS, HPC_ROW_RPB)).  Pointers to\n"
            "//    rows and (H) vectors must be 16-byte aligned (cudaMalloc gives 256).\n"
            "//  - Dropout: p is the drop probability, 0 = off; masks come from Philox-4x32-10\n"
            "//    keyed by (seed, flat element index, step, salt), as hpc's cpu backend.\n"
            "//  - Parameter gradients (f32) are accumulated (+=); activation gradients are\n"
            "//    overwritten unless an `accumulate` argument says otherwise.\n"
            "//\n"
            "// Kernels: full name (alias), then the parameters with their shapes.\n",
            spec->name, spec->name, spec_precision_name(policy), spec->source[0] ? spec->source : "MODEL");
}

static void print_aliases(FILE *f, const char *suffix)
{
    fputs("\n// Aliases without the hash: HPC_KERNEL_<base>.\n", f);
    for (int k = 0; k < kemit_kernel_count; k++)
        fprintf(f, "#define HPC_KERNEL_%s %s%s\n", kemit_kernel_bases[k], kemit_kernel_bases[k], suffix);
}

HpcStatus emitlib_write_cuh(const ModelSpec *spec, SpecPrecision policy, const char *dir, char **source_out,
                            char *suffix_out, HpcError *err)
{
    /* The exported package calls its model's activation kernels, and
     * compiler/kernels/activation.cu has them for these four only (the
     * training step's own module, NAME_step.cuh, has every row of
     * program/activations.h, and the optimizer). */
    if (spec->stack.activation != ACT_GELU && spec->stack.activation != ACT_GELU_TANH &&
        spec->stack.activation != ACT_RELU && spec->stack.activation != ACT_TANH)
        return hpc_fail(err, HPC_ERR_INPUT, "--emit-cuda/--emit-lib: the exported templates have no %s "
                        "kernels (only gelu, gelu_tanh, relu, tanh); the training step itself supports it",
                        spec_activation_name(spec->stack.activation));
    KernelConfig kc;
    kemit_config_from_spec(&kc, spec, emitlib_dtype(policy));
    char *src = NULL, suffix[KEMIT_SUFFIX_MAX];
    HpcStatus st = kemit_source(&kc, &src, suffix, err);
    if (st) return st;
    char path[4096], name[128];
    snprintf(name, sizeof name, "%s_kernels", spec->name);
    FILE *f = NULL;
    st = emitlib_mkdir(dir, err);
    if (!st) st = emitlib_open(dir, name, ".cuh", path, sizeof path, &f, err);
    if (!st) {
        print_cuh_intro(f, spec, policy);
        emitlib_print_signatures(f, src, suffix);
        fprintf(f, "\n#ifndef HPC_KERNELS_%s_CUH\n#define HPC_KERNELS_%s_CUH\n\n", spec->name, spec->name);
        fputs(src, f);
        print_aliases(f, suffix);
        fputs("\n#endif\n", f);
        st = emitlib_close(f, path, err);
    }
    if (!st && source_out) *source_out = src;
    else free(src);
    if (!st && suffix_out) memcpy(suffix_out, suffix, KEMIT_SUFFIX_MAX);
    return st;
}

HpcStatus emitlib_cuda(const ModelSpec *spec, SpecPrecision policy, const char *dir, HpcError *err)
{
    HpcStatus st = emitlib_check_cuda(spec, policy, err);
    if (!st) st = emitlib_write_cuh(spec, policy, dir, NULL, NULL, err);
    return st ? st : emitlib_step(spec, policy, dir, err);
}

bool emitlib_parse_archs(const char *s, int *archs, int *n)
{
    *n = 0;
    while (*s) {
        if (strncmp(s, "sm_", 3) == 0) s += 3;
        char *end;
        long a = strtol(s, &end, 10);
        if (end == s || a < 50 || a > 200) return false;
        bool seen = false;   /* "80,80" is 80: one cubin, compiled once */
        for (int i = 0; i < *n; i++) seen |= archs[i] == a;
        if (!seen && *n == EMITLIB_MAX_ARCHS) return false;
        if (!seen) archs[(*n)++] = (int)a;
        s = end;
        if (*s == ',') s++;
        else if (*s) return false;
    }
    return *n > 0;
}

/* tests/test_nvrtc.c — NVRTC compiles to cubins for sm_80 and sm_90 without
 * a GPU; failures keep source and log; the disk cache hits, misses and
 * repairs itself. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cuda/nvrtc_compile.h"

/* A kernel in the style hpc emits: fp16/bf16 headers, extern "C". */
static const char *sample_src =
    "#include <cuda_fp16.h>\n"
    "#include <cuda_bf16.h>\n"
    "extern \"C\" __global__ void scale_add_f16(__half *y, const __half *x,\n"
    "                                          const __nv_bfloat16 *b, float s, int n)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[i] = __float2half(s * __half2float(x[i]) + __bfloat162float(b[i]));\n"
    "}\n";

static char g_dir[256];

static void make_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/hpc-nvrtc-test-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    setenv("HPC_CACHE_DIR", g_dir, 1);
}

static void remove_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    cr_expect_eq(system(cmd), 0);
}

/* ELF64, e_machine EM_CUDA (190), and the SM number in e_flags: bits 8..15
 * in the cubins of CUDA 12.8+ (as readelf -h shows), bits 0..7 before. */
static void expect_cubin_for(const uint8_t *c, size_t n, int arch)
{
    cr_assert_gt(n, 64u);
    cr_expect_eq(memcmp(c, "\x7f" "ELF", 4), 0, "not an ELF file");
    cr_expect_eq(c[4], 2, "not ELF64");
    cr_expect_eq(c[18] | c[19] << 8, 190, "e_machine is not EM_CUDA");
    uint32_t flags = (uint32_t)c[48] | (uint32_t)c[49] << 8 | (uint32_t)c[50] << 16 |
                     (uint32_t)c[51] << 24;
    int sm_new = (int)(flags >> 8 & 0xff), sm_old = (int)(flags & 0xff);
    cr_expect(sm_new == arch || sm_old == arch, "e_flags 0x%x do not name sm_%d", flags, arch);
}

static void compile_for(int arch)
{
    void *cubin;
    size_t n;
    char *log;
    HpcError err;
    HpcStatus st = nvrtc_compile(sample_src, "scale_add_f16", arch, NULL, 0, &cubin, &n, &log, &err);
    cr_assert_eq(st, HPC_OK, "%s", err.msg);
    cr_assert_not_null(log);
    expect_cubin_for(cubin, n, arch);
    free(cubin);
    free(log);
}

Test(nvrtc, compiles_sm80, .init = make_dir, .fini = remove_dir) { compile_for(80); }
Test(nvrtc, compiles_sm90, .init = make_dir, .fini = remove_dir) { compile_for(90); }

Test(nvrtc, version_and_archs)
{
    int v = nvrtc_version_number();
    cr_expect_geq(v, 12000, "NVRTC %d", v);
    char archs[256];
    nvrtc_supported_archs(archs, sizeof archs);
    cr_expect(strstr(archs, "80") && strstr(archs, "90"), "%s", archs);
}

Test(nvrtc, old_arch_refused)
{
    void *cubin;
    size_t n;
    HpcError err;
    cr_expect_eq(nvrtc_compile(sample_src, "k", 75, NULL, 0, &cubin, &n, NULL, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "sm_75") && strstr(err.msg, "sm_80"), "%s", err.msg);
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = calloc(1, (size_t)n + 1);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return s;
}

/* The error names the kernel, quotes the first error and the saved files,
 * and the files hold exactly the source and a non-empty log. */
Test(nvrtc, failure_saves_source_and_log, .init = make_dir, .fini = remove_dir)
{
    const char *bad = "extern \"C\" __global__ void broken(float *x)\n{\n    x[0] = undeclared_y;\n}\n";
    void *cubin;
    size_t n;
    HpcError err;
    cr_assert_eq(nvrtc_compile(bad, "broken_kernel", 90, NULL, 0, &cubin, &n, NULL, &err),
                 HPC_ERR_CUDA);
    cr_expect(strstr(err.msg, "broken_kernel") && strstr(err.msg, "sm_90"), "%s", err.msg);
    cr_expect(strstr(err.msg, "undeclared_y"), "first error not quoted: %s", err.msg);
    const char *cu = strstr(err.msg, "source saved to ");
    cr_assert_not_null(cu, "%s", err.msg);
    char stem[512];
    cr_assert_eq(sscanf(cu + strlen("source saved to "), "%511[^,]", stem), 1);
    cr_assert(strlen(stem) > 3 && !strcmp(stem + strlen(stem) - 3, ".cu"), "%s", stem);
    cr_expect_eq(strncmp(stem, g_dir, strlen(g_dir)), 0, "saved outside the cache dir: %s", stem);
    char *saved = read_all(stem);
    cr_assert_not_null(saved, "missing %s", stem);
    cr_expect_str_eq(saved, bad);
    strcpy(stem + strlen(stem) - 3, ".log");
    char *log = read_all(stem);
    cr_assert_not_null(log, "missing %s", stem);
    cr_expect(strstr(log, "undeclared_y") != NULL, "log: %s", log);
    free(saved);
    free(log);
}

static void *cached(int arch, const char *const *opts, int nopts, size_t *n, NvrtcCacheInfo *info)
{
    void *cubin;
    HpcError err;
    HpcStatus st = nvrtc_compile_cached(sample_src, "scale_add_f16", arch, opts, nopts, &cubin, n,
                                        info, &err);
    cr_assert_eq(st, HPC_OK, "%s", err.msg);
    return cubin;
}

Test(nvrtc, cache_miss_hit_and_repair, .init = make_dir, .fini = remove_dir)
{
    NvrtcCacheInfo info;
    size_t n1, n2, n3;
    uint8_t *first = cached(90, NULL, 0, &n1, &info);
    cr_expect_eq(info.result, KCACHE_MISS);
    cr_expect(info.stored, "not stored: %s", info.note);
    cr_expect_eq(strncmp(info.path, g_dir, strlen(g_dir)), 0, "%s", info.path);
    uint8_t *again = cached(90, NULL, 0, &n2, &info);
    cr_expect_eq(info.result, KCACHE_HIT);
    cr_assert_eq(n2, n1);
    cr_expect_eq(memcmp(first, again, n1), 0);
    free(again);

    /* flip a payload byte: detected, recompiled, stored again */
    FILE *f = fopen(info.path, "r+b");
    cr_assert_not_null(f);
    fseek(f, -100, SEEK_END);
    int c = fgetc(f);
    fseek(f, -100, SEEK_END);
    fputc(c ^ 1, f);
    fclose(f);
    uint8_t *repaired = cached(90, NULL, 0, &n3, &info);
    cr_expect_eq(info.result, KCACHE_CORRUPT);
    cr_expect(info.stored);
    expect_cubin_for(repaired, n3, 90);
    free(repaired);
    free(cached(90, NULL, 0, &n3, &info));
    cr_expect_eq(info.result, KCACHE_HIT);

    /* another option or arch is another entry */
    const char *opt[] = {"-DUNUSED_FLAG=1"};
    free(cached(90, opt, 1, &n3, &info));
    cr_expect_eq(info.result, KCACHE_MISS);
    free(cached(80, NULL, 0, &n3, &info));
    cr_expect_eq(info.result, KCACHE_MISS);
    free(first);
}

/* A cache that cannot be written still yields the cubin, with a note. */
Test(nvrtc, unwritable_cache_still_compiles)
{
    setenv("HPC_CACHE_DIR", "/dev/null/cache", 1);
    NvrtcCacheInfo info;
    size_t n;
    void *cubin = cached(80, NULL, 0, &n, &info);
    expect_cubin_for(cubin, n, 80);
    cr_expect(!info.stored);
    cr_expect(strstr(info.note, "/dev/null") != NULL, "note: %s", info.note);
    free(cubin);
}

/* HPC_NVRTC_SPLIT adds --split-compile: another cache entry, same kernel;
 * junk is refused by name. */
Test(nvrtc, split_compile_is_its_own_cache_entry, .init = make_dir, .fini = remove_dir)
{
    NvrtcCacheInfo info;
    size_t n;
    unsetenv("HPC_NVRTC_SPLIT");
    free(cached(90, NULL, 0, &n, &info));
    cr_expect_eq(info.result, KCACHE_MISS);
    setenv("HPC_NVRTC_SPLIT", "2", 1);
    void *split = cached(90, NULL, 0, &n, &info);
    cr_expect_eq(info.result, KCACHE_MISS, "split and plain cubins share a key");
    expect_cubin_for(split, n, 90);
    free(split);
    free(cached(90, NULL, 0, &n, &info));
    cr_expect_eq(info.result, KCACHE_HIT);
    setenv("HPC_NVRTC_SPLIT", "many", 1);
    void *cubin;
    HpcError err;
    cr_expect_eq(nvrtc_compile(sample_src, "k", 90, NULL, 0, &cubin, &n, NULL, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "HPC_NVRTC_SPLIT=many") != NULL, "%s", err.msg);
    unsetenv("HPC_NVRTC_SPLIT");
}

/* tests/test_gpu_ahead.c — the GPU opened ahead (cuda_device_open_ahead,
 * runtime/cuda/cuda_driver.h) against a stub libcuda built here with cc (an
 * sm_90 device whose primary-context retains and releases it counts):
 * the thread retains the context once and keeps it, the open that follows
 * waits for it and finds it, closing the backend's open leaves the kept
 * retain, and releasing that leaves none; a retain that fails ahead is
 * reported by the open that follows, with the call, the code's name and
 * the file:line; HPC_START_OVERLAP=0 starts nothing.
 *
 * Criterion runs each test in its own process: each loads the driver afresh. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_driver.h"

static char g_dir[256], g_lib[400];

static void remove_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    cr_expect_eq(system(cmd), 0);
}

#define STUB_STR_(x) #x
#define STUB_STR(x) STUB_STR_(x)
#define STUB_NAME(name) STUB_STR(name),
static const char *driver_symbols[] = {CUDA_DRIVER_FUNCTIONS(STUB_NAME)};

/* The functions an open needs; the rest return 999. */
static const char *stub_body =
    "#include <stdio.h>\n"
    "#include <stdlib.h>\n"
    "#include <stddef.h>\n"
    "static int retains;\n"
    "int stub_retains(void) { return retains; }\n"
    "int cuInit(unsigned f) { return 0; }\n"
    "int cuDriverGetVersion(int *v) { *v = 13000; return 0; }\n"
    "int cuDeviceGetCount(int *n) { *n = 1; return 0; }\n"
    "int cuDeviceGet(int *d, int o) { *d = o; return o == 0 ? 0 : 101; }\n"
    "int cuDeviceGetName(char *s, int n, int d) { snprintf(s, n, \"Stub H200\"); return 0; }\n"
    "int cuDeviceGetAttribute(int *v, int a, int d) {\n"
    "    *v = a == %d ? 9 : a == %d ? 0 : a == %d ? 132 : 0; return 0; }\n"
    "int %s(size_t *b, int d) { *b = (size_t)141 << 30; return 0; }\n"
    "int cuDevicePrimaryCtxRetain(void **c, int d) {\n"
    "    if (getenv(\"STUB_RETAIN_FAIL\")) return 2;\n"
    "    __atomic_add_fetch(&retains, 1, __ATOMIC_SEQ_CST); *c = (void *)0x1234; return 0; }\n"
    "int %s(int d) { __atomic_sub_fetch(&retains, 1, __ATOMIC_SEQ_CST); return 0; }\n"
    "int cuCtxSetCurrent(void *c) { return 0; }\n"
    "int cuStreamCreate(void **s, unsigned f) { *s = (void *)0x5678; return 0; }\n"
    "int %s(void *s) { return 0; }\n"
    "int cuGetErrorName(int r, const char **s) { *s = r == 2 ? \"CUDA_ERROR_OUT_OF_MEMORY\" : \"CUDA_ERROR_FROM_STUB\"; return 0; }\n"
    "int cuGetErrorString(int r, const char **s) { *s = \"stub says no\"; return 0; }\n";

static int stub_defines(const char *sym)
{
    const char *own[] = {"cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName",
                         "cuDeviceGetAttribute", STUB_STR(cuDeviceTotalMem), "cuDevicePrimaryCtxRetain",
                         STUB_STR(cuDevicePrimaryCtxRelease), "cuCtxSetCurrent", "cuStreamCreate",
                         STUB_STR(cuStreamDestroy), "cuGetErrorName", "cuGetErrorString"};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (!strcmp(sym, own[i])) return 1;
    return 0;
}

static void build_stub(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/hpc-ahead-test-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    char src[400], cmd[1200];
    snprintf(src, sizeof src, "%s/stub.c", g_dir);
    snprintf(g_lib, sizeof g_lib, "%s/libcuda_stub.so", g_dir);
    FILE *f = fopen(src, "w");
    cr_assert_not_null(f);
    fprintf(f, stub_body, (int)CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            (int)CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, (int)CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            STUB_STR(cuDeviceTotalMem), STUB_STR(cuDevicePrimaryCtxRelease), STUB_STR(cuStreamDestroy));
    for (size_t i = 0; i < sizeof driver_symbols / sizeof driver_symbols[0]; i++)
        if (!stub_defines(driver_symbols[i])) fprintf(f, "int %s(void) { return 999; }\n", driver_symbols[i]);
    fclose(f);
    snprintf(cmd, sizeof cmd, "cc -shared -fPIC -o '%s' '%s' 2>/dev/null", g_lib, src);
    if (system(cmd) != 0) cr_skip_test("no C compiler to build the stub driver");
    setenv("HPC_CUDA_DRIVER", g_lib, 1);
}

/* The stub's live retains (the driver loader opened the same library). */
static int retains(void)
{
    void *h = dlopen(g_lib, RTLD_NOW | RTLD_NOLOAD);
    cr_assert_not_null(h, "the stub is not loaded");
    int (*count)(void) = (int (*)(void))dlsym(h, "stub_retains");
    cr_assert_not_null(count);
    int n = count();
    dlclose(h);
    return n;
}

Test(gpu_ahead, the_open_finds_the_context_retained_ahead, .init = build_stub, .fini = remove_dir)
{
    cuda_device_open_ahead(0);
    cuda_device_open_ahead(0);   /* idempotent */
    CudaDevice d;
    HpcError err = {0};
    cr_assert_eq(cuda_device_open(&d, 0, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(d.arch, 90);
    cr_expect_eq(retains(), 2, "the thread's kept retain and the open's own");
    cuda_device_close(&d);
    cr_expect_eq(retains(), 1, "the kept context outlives the open");
    cuda_kept_context_release();
    cr_expect_eq(retains(), 0);
    cuda_ahead_join();   /* the cuBLASLt thread the stub's presence started */
}

Test(gpu_ahead, a_retain_that_fails_ahead_is_reported_by_the_open, .init = build_stub, .fini = remove_dir)
{
    setenv("STUB_RETAIN_FAIL", "1", 1);
    cuda_device_open_ahead(0);
    CudaDevice d;
    HpcError err = {0};
    cr_assert_eq(cuda_device_open(&d, 0, &err), HPC_ERR_OOM);
    cr_expect(strstr(err.msg, "cuDevicePrimaryCtxRetain") && strstr(err.msg, "CUDA_ERROR_OUT_OF_MEMORY") &&
                  strstr(err.msg, "cuda_driver.c:"),
              "%s", err.msg);
    unsetenv("STUB_RETAIN_FAIL");
    cr_expect_eq(retains(), 0, "nothing kept from the failed retain");
    cuda_ahead_join();
}

Test(gpu_ahead, overlap_off_starts_nothing, .init = build_stub, .fini = remove_dir)
{
    setenv("HPC_START_OVERLAP", "0", 1);
    cuda_device_open_ahead(0);
    HpcError err = {0};
    cr_assert_eq(cuda_driver_load(&err), HPC_OK, "%s", err.msg);
    cr_expect_eq(retains(), 0, "HPC_START_OVERLAP=0 still retained a context ahead");
}

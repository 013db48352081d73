/* tests/test_cuda_driver.c — the driver loader without a GPU: a missing
 * library, a library without the driver's functions, and a stub libcuda
 * (built here with cc) that reports no device or an sm_75 device; the
 * CUDA_CHECK messages; `hpc devices` exit codes.
 *
 * Criterion runs each test in its own process, so each one loads the driver
 * afresh (the loader caches its first result per process). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda/cuda_driver.h"

static void expect_in(const char *msg, const char *part)
{
    cr_expect(strstr(msg, part) != NULL, "expected \"%s\" in: %s", part, msg);
}

Test(cuda_driver, missing_library_is_no_gpu)
{
    setenv("HPC_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
    HpcError err;
    cr_assert_eq(cuda_driver_load(&err), HPC_ERR_NO_GPU);
    cr_expect_eq(err.code, HPC_ERR_NO_GPU);
    expect_in(err.msg, "no CUDA driver");
    expect_in(err.msg, "/nonexistent/libcuda.so.1");
    expect_in(err.msg, "install");
    expect_in(err.msg, "HPC_CUDA_DRIVER");
    expect_in(err.msg, "cpu backend");
    cr_expect_null(cuda_driver());
    /* every later entry point reports the same */
    CudaDevice d;
    HpcError err2;
    cr_expect_eq(cuda_device_open(&d, 0, &err2), HPC_ERR_NO_GPU);
    cr_expect_str_eq(err2.msg, err.msg);
    int n = -1;
    cr_expect_eq(cuda_device_count(&n, &err2), HPC_ERR_NO_GPU);
    cr_expect_eq(n, 0);
}

Test(cuda_driver, library_without_driver_functions)
{
    setenv("HPC_CUDA_DRIVER", "libm.so.6", 1);
    HpcError err;
    cr_assert_eq(cuda_driver_load(&err), HPC_ERR_NO_GPU);
    expect_in(err.msg, "libm.so.6");
    expect_in(err.msg, "lacks the function cuInit");
    expect_in(err.msg, "update the NVIDIA driver");
}

/* ---- a stub libcuda --------------------------------------------------------- */

static char g_dir[256];

static void make_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/hpc-driver-test-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
}

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

/* Functions the stub implements; every other symbol returns CUDA_ERROR_UNKNOWN. */
static const char *stub_body =
    "#include <stdio.h>\n"
    "#include <stddef.h>\n"
    "int cuInit(unsigned f) { return INIT_RESULT; }\n"
    "int cuDriverGetVersion(int *v) { *v = 12080; return 0; }\n"
    "int cuDeviceGetCount(int *n) { *n = 1; return 0; }\n"
    "int cuDeviceGet(int *d, int o) { *d = o; return o == 0 ? 0 : 101; }\n"
    "int cuDeviceGetName(char *s, int n, int d) { snprintf(s, n, \"Stub T4\"); return 0; }\n"
    "int cuDeviceGetAttribute(int *v, int a, int d) {\n"
    "    *v = a == %d ? 7 : a == %d ? 5 : a == %d ? 40 : 0; return 0; }\n"
    "int %s(size_t *b, int d) { *b = (size_t)16 << 30; return 0; }\n"
    "int cuGetErrorName(int r, const char **s) { *s = \"CUDA_ERROR_FROM_STUB\"; return 0; }\n"
    "int cuGetErrorString(int r, const char **s) { *s = \"stub says no\"; return 0; }\n";

static int stub_defines(const char *sym)
{
    const char *own[] = {"cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet",
                         "cuDeviceGetName", "cuDeviceGetAttribute", STUB_STR(cuDeviceTotalMem),
                         "cuGetErrorName", "cuGetErrorString"};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (!strcmp(sym, own[i])) return 1;
    return 0;
}

/* Builds g_dir/libcuda_stub.so whose cuInit returns init_result; skips the
 * test when no C compiler is at hand. */
static void build_stub(int init_result)
{
    char src[400], lib[400], cmd[1200];
    snprintf(src, sizeof src, "%s/stub.c", g_dir);
    snprintf(lib, sizeof lib, "%s/libcuda_stub.so", g_dir);
    FILE *f = fopen(src, "w");
    cr_assert_not_null(f);
    fprintf(f, "#define INIT_RESULT %d\n", init_result);
    fprintf(f, stub_body, (int)CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            (int)CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            (int)CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, STUB_STR(cuDeviceTotalMem));
    for (size_t i = 0; i < sizeof driver_symbols / sizeof driver_symbols[0]; i++)
        if (!stub_defines(driver_symbols[i])) fprintf(f, "int %s(void) { return 999; }\n", driver_symbols[i]);
    fclose(f);
    snprintf(cmd, sizeof cmd, "cc -shared -fPIC -o '%s' '%s' 2>/dev/null", lib, src);
    if (system(cmd) != 0) cr_skip_test("no C compiler to build the stub driver");
    setenv("HPC_CUDA_DRIVER", lib, 1);
}

Test(cuda_driver, stub_without_devices, .init = make_dir, .fini = remove_dir)
{
    build_stub(CUDA_ERROR_NO_DEVICE);
    HpcError err;
    cr_assert_eq(cuda_driver_load(&err), HPC_ERR_NO_GPU);
    expect_in(err.msg, "found no GPU");
    expect_in(err.msg, "CUDA_VISIBLE_DEVICES");
}

Test(cuda_driver, stub_with_old_device, .init = make_dir, .fini = remove_dir)
{
    build_stub(0);
    HpcError err;
    cr_assert_eq(cuda_driver_load(&err), HPC_OK, "%s", err.msg);
    const CudaDriver *cu = cuda_driver();
    cr_assert_not_null(cu);
    cr_expect_eq(cu->version, 12080);
    CudaDevice d;
    cr_assert_eq(cuda_device_query(&d, 0, &err), HPC_OK, "%s", err.msg);
    cr_expect_str_eq(d.name, "Stub T4");
    cr_expect_eq(d.arch, 75);
    cr_expect_eq(d.sm_count, 40);
    cr_expect_eq(d.total_mem, (size_t)16 << 30);
    cr_expect_eq(cuda_device_open(&d, 0, &err), HPC_ERR_NO_GPU);
    expect_in(err.msg, "compute capability 7.5");
    expect_in(err.msg, "Stub T4");
    cr_expect_eq(cuda_device_open(&d, 3, &err), HPC_ERR_NO_GPU);
    expect_in(err.msg, "device 3 does not exist");
    /* with the driver loaded, names come from cuGetErrorName */
    cr_expect_eq(CUDA_CHECK(&err, (CUresult)CUDA_ERROR_LAUNCH_FAILED), HPC_ERR_CUDA);
    expect_in(err.msg, "CUDA_ERROR_FROM_STUB");
    expect_in(err.msg, "stub says no");
}

/* ---- CUDA_CHECK without a driver ---------------------------------------------- */

Test(cuda_driver, check_success_leaves_error_alone)
{
    HpcError err = {HPC_ERR_INTERNAL, "untouched"};
    cr_expect_eq(CUDA_CHECK(&err, (CUresult)CUDA_SUCCESS), HPC_OK);
    cr_expect_eq(CUDA_CHECK(&err, (nvrtcResult)NVRTC_SUCCESS), HPC_OK);
    cr_expect_eq(CUDA_CHECK(&err, (cublasStatus_t)CUBLAS_STATUS_SUCCESS), HPC_OK);
    cr_expect_str_eq(err.msg, "untouched");
}

static CUresult fake_alloc(void) { return CUDA_ERROR_OUT_OF_MEMORY; }

Test(cuda_driver, check_messages)
{
    setenv("HPC_CUDA_DRIVER", "/nonexistent", 1);
    HpcError err;
    int line = __LINE__ + 1;
    HpcStatus st = CUDA_CHECK(&err, fake_alloc());
    cr_expect_eq(st, HPC_ERR_OOM);
    cr_expect_eq(err.code, HPC_ERR_OOM);
    expect_in(err.msg, "fake_alloc()");
    expect_in(err.msg, "CUDA_ERROR_OUT_OF_MEMORY");
    expect_in(err.msg, "(2:");
    expect_in(err.msg, "smaller batch");
    char where[128];
    snprintf(where, sizeof where, "test_cuda_driver.c:%d", line);
    expect_in(err.msg, where);

    cr_expect_eq(CUDA_CHECK(&err, (CUresult)CUDA_ERROR_NO_DEVICE), HPC_ERR_NO_GPU);
    cr_expect_eq(CUDA_CHECK(&err, (CUresult)CUDA_ERROR_ILLEGAL_ADDRESS), HPC_ERR_CUDA);
    expect_in(err.msg, "CUDA_ERROR_ILLEGAL_ADDRESS");
    expect_in(err.msg, "compute-sanitizer");

    cr_expect_eq(CUDA_CHECK(&err, (nvrtcResult)NVRTC_ERROR_INVALID_OPTION), HPC_ERR_CUDA);
    expect_in(err.msg, "NVRTC_ERROR_INVALID_OPTION");
    cr_expect_eq(CUDA_CHECK(&err, (cublasStatus_t)CUBLAS_STATUS_NOT_SUPPORTED), HPC_ERR_CUDA);
    expect_in(err.msg, "CUBLAS_STATUS_NOT_SUPPORTED");
    cr_expect_eq(CUDA_CHECK(&err, (cublasStatus_t)CUBLAS_STATUS_ALLOC_FAILED), HPC_ERR_OOM);
}

/* ---- hpc devices -------------------------------------------------------------- */

/* Runs `hpc devices` with HPC_CUDA_DRIVER=driver; returns its exit status and
 * its stdout+stderr in out. */
static int run_devices(const char *driver, char *out, size_t size)
{
    const char *root = getenv("HPC_ROOT");
    char hpc[512], cmd[1200];
    snprintf(hpc, sizeof hpc, "%s/bin/hpc", root ? root : ".");
    if (access(hpc, X_OK) != 0) cr_skip_test("%s not built", hpc);
    snprintf(cmd, sizeof cmd, "HPC_CACHE_DIR='%s/cache' HPC_CUDA_DRIVER='%s' '%s' devices 2>&1",
             g_dir, driver, hpc);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Test(cuda_driver, hpc_devices_without_driver, .init = make_dir, .fini = remove_dir)
{
    char out[4096];
    cr_expect_eq(run_devices("/nonexistent/libcuda.so.1", out, sizeof out), HPC_ERR_NO_GPU, "%s", out);
    expect_in(out, "hpc: no CUDA driver");
    expect_in(out, "NVRTC");
    expect_in(out, "kernel cache");
}

Test(cuda_driver, hpc_devices_with_old_gpu, .init = make_dir, .fini = remove_dir)
{
    build_stub(0);
    char out[4096];
    cr_expect_eq(run_devices(getenv("HPC_CUDA_DRIVER"), out, sizeof out), HPC_ERR_NO_GPU, "%s", out);
    expect_in(out, "Stub T4");
    expect_in(out, "sm_75");
    expect_in(out, "not usable");
    expect_in(out, "no usable GPU");
}

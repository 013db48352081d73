/* tests/test_cublaslt_load.c — cuBLASLt loaded at run time
 * (runtime/cuda/cublaslt_load.h): the toolkit's library is found through
 * the run path and every function resolves (no GPU needed for that); a
 * library that cannot be loaded is an HPC_ERR_NO_GPU naming it and the
 * remedy; bin/hpc itself does not link cuBLAS (its start would pay the
 * library's initialisers), and a cuBLAS status is named also before any load. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cublaslt_load.h"
#include "cuda/cuda_driver.h"

Test(cublaslt_load, resolves_every_function_from_the_toolkit)
{
    HpcError err = {0};
    cr_assert_eq(cublaslt_load(&err), HPC_OK, "%s", err.msg);
    const CublasLt *lt = cublaslt();
    cr_assert_not_null(lt);
    cr_expect_gt(lt->cublasLtGetVersion(), 0);
    cr_expect_str_eq(lt->cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
    cr_expect_eq(cublaslt_load(&err), HPC_OK, "a second load is the first one's result");
}

Test(cublaslt_load, a_missing_library_is_named_with_the_remedy)
{
    setenv("HPC_CUBLASLT", "/nonexistent/libcublasLt.so.99", 1);
    HpcError err = {0};
    cr_assert_eq(cublaslt_load(&err), HPC_ERR_NO_GPU);
    cr_expect(strstr(err.msg, "/nonexistent/libcublasLt.so.99") && strstr(err.msg, "HPC_CUBLASLT"), "%s", err.msg);
    cr_expect_null(cublaslt());
    /* a status is still named, from the built-in list */
    cr_expect_eq(CUDA_CHECK(&err, (cublasStatus_t)CUBLAS_STATUS_EXECUTION_FAILED), HPC_ERR_CUDA);
    cr_expect(strstr(err.msg, "CUBLAS_STATUS_EXECUTION_FAILED"), "%s", err.msg);
}

Test(cublaslt_load, bin_hpc_links_no_cublas)
{
    const char *root = getenv("HPC_ROOT");
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "ldd %s/bin/hpc", root ? root : ".");
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char line[1024];
    bool any = false, cublas = false;
    while (fgets(line, sizeof line, p)) {
        any = true;
        if (strstr(line, "libcublas")) cublas = true;
    }
    pclose(p);
    cr_assert(any, "ldd printed nothing for bin/hpc (run from the repository root or set HPC_ROOT)");
    cr_expect(!cublas, "bin/hpc links cuBLAS: its initialisers run before main() at every start");
}

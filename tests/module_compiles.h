/* tests/module_compiles.h — a graph's step module (emit_ops) through NVRTC
 * for sm_80 and sm_90, for the cpu tests that check a change's kernels
 * compile before any GPU runs them (tests/test_ln_xhat.c,
 * tests/test_ln_xhat_ones.c).  Header-only (a static function with
 * Criterion expectations): each test is its own program. */
#ifndef HPC_TESTS_MODULE_COMPILES_H
#define HPC_TESTS_MODULE_COMPILES_H

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/nvrtc_compile.h"
#include "emit_ops.h"
#include "program/ir.h"

/* g's module compiles for both architectures and holds `kernel` (a name
 * fragment of the kernel the test is about). */
static void expect_module_compiles(const IrGraph *g, const char *name, const char *kernel)
{
    char *src = NULL;
    HpcError err = {0};
    cr_assert_eq(eop_module_source(g, &src, &err), HPC_OK, "%s: %s", name, err.msg);
    cr_expect(strstr(src, kernel) != NULL, "%s: no %s kernel in the module", name, kernel);
    for (int arch = 80; arch <= 90; arch += 10) {
        void *cubin = NULL;
        size_t size = 0;
        char *log = NULL;
        cr_expect_eq(nvrtc_compile(src, name, arch, NULL, 0, &cubin, &size, &log, &err), HPC_OK, "%s sm_%d: %s\n%s",
                     name, arch, err.msg, log ? log : "");
        free(cubin);
        free(log);
    }
    free(src);
}

#endif

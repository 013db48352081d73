/* tests/test_grid_wait.c — every node kernel of a step module waits for the
 * kernel ahead of it before it touches memory (STEP_SOURCE_GRID_WAIT,
 * program/step_program.h), which lets the executor launch it early
 * (runtime/cuda/cuda_exec.c, cuda_launch_early): a kernel without the wait
 * launched that way would read what the kernel ahead has not yet written.
 *
 * bert_tiny's module under fp32 and fp16 (every op kind a classifier uses,
 * the fused attention and LayerNorm sites): each `(EopArgs a)` kernel's
 * first statement is the wait, and the wait is griddepcontrol.wait on
 * sm_90 and later, nothing before.  NVRTC compiles these modules for sm_80
 * and sm_90 in test_plan. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emit_ops.h"
#include "pipeline.h"
#include "program/step_program.h"

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what)) n++;
    return n;
}

static void check_policy(SpecPrecision policy)
{
    ModelSpec s;
    spec_defaults(&s);
    snprintf(s.name, sizeof s.name, "bert_tiny");
    s.stack.hidden = 128;
    s.stack.layers = 2;
    s.stack.heads = 2;
    s.stack.ffn = 512;
    PipeOptions po = pipeline_defaults(policy);
    Pipeline p;
    HpcError err = {0};
    cr_assert_eq(pipeline_build(&s, &po, &p, &err), HPC_OK, "%s", err.msg);
    char *src = NULL;
    cr_assert_eq(eop_module_source(&p.g, &src, &err), HPC_OK, "%s", err.msg);
    int kernels = count(src, "(EopArgs a)\n{\n");
    int waiting = count(src, "(EopArgs a)\n{\n    " STEP_SOURCE_GRID_WAIT "\n");
    cr_expect_gt(kernels, 20, "policy %d: %d node kernels", policy, kernels);
    cr_expect_eq(waiting, kernels, "policy %d: %d of %d node kernels wait first", policy, waiting, kernels);
    const char *def = strstr(src, "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n#define EOP_GRID_WAIT() asm "
                                  "volatile(\"griddepcontrol.wait;\" ::: \"memory\")\n#else\n"
                                  "#define EOP_GRID_WAIT() do { } while (0)\n#endif\n");
    cr_expect(def != NULL && def < strstr(src, "(EopArgs a)\n{\n"), "policy %d: the wait's definition", policy);
    free(src);
    pipeline_free(&p);
}

Test(grid_wait, every_node_kernel_waits_first_fp32) { check_policy(PREC_FP32); }
Test(grid_wait, every_node_kernel_waits_first_fp16) { check_policy(PREC_FP16); }

/* tests/test_profile_mode.c — how HPC_PROFILE chooses the executor's profile
 * (runtime/cuda/cuda_exec_internal.h): off, eager, or inside a CUDA graph
 * with a number of replays; a value it cannot use is refused with a message
 * that says what it takes.  The timing itself needs a GPU
 * (bench_hpc --profile-graph on the device). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_exec_internal.h"

static CudaProfileMode mode_of(const char *value, int *replays)
{
    if (value) setenv("HPC_PROFILE", value, 1);
    else unsetenv("HPC_PROFILE");
    CudaProfileMode mode = CUDA_PROFILE_EAGER;
    HpcError err = {0};
    cr_assert_eq(cuda_exec_profile_mode(&mode, replays, &err), HPC_OK, "HPC_PROFILE=%s: %s", value, err.msg);
    return mode;
}

Test(profile_mode, off_unless_set)
{
    int r = 0;
    cr_expect_eq(mode_of(NULL, &r), CUDA_PROFILE_OFF);
    cr_expect_eq(mode_of("", &r), CUDA_PROFILE_OFF);
    cr_expect_eq(mode_of("0", &r), CUDA_PROFILE_OFF);
}

Test(profile_mode, eager_for_any_other_value)
{
    int r = 0;
    cr_expect_eq(mode_of("1", &r), CUDA_PROFILE_EAGER);
    cr_expect_eq(mode_of("yes", &r), CUDA_PROFILE_EAGER);
}

Test(profile_mode, graph_with_replays)
{
    int r = 0;
    cr_expect_eq(mode_of("graph", &r), CUDA_PROFILE_GRAPH);
    cr_expect_eq(r, CUDA_EXEC_PROFILE_REPLAYS);
    cr_expect_eq(mode_of("graph:1", &r), CUDA_PROFILE_GRAPH);
    cr_expect_eq(r, 1);
    cr_expect_eq(mode_of("graph:12", &r), CUDA_PROFILE_GRAPH);
    cr_expect_eq(r, 12);
    char most[32];
    snprintf(most, sizeof most, "graph:%d", CUDA_EXEC_PROFILE_MAX_REPLAYS);
    cr_expect_eq(mode_of(most, &r), CUDA_PROFILE_GRAPH);
    cr_expect_eq(r, CUDA_EXEC_PROFILE_MAX_REPLAYS);
}

Test(profile_mode, bad_replays_refused)
{
    char too_many[32];
    snprintf(too_many, sizeof too_many, "graph:%d", CUDA_EXEC_PROFILE_MAX_REPLAYS + 1);
    const char *bad[] = {"graph:", "graph:0", "graph:-3", "graph:x", "graph:5x", too_many, "graphs", "graph5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("HPC_PROFILE", bad[i], 1);
        CudaProfileMode mode;
        int r;
        HpcError err = {0};
        cr_expect_eq(cuda_exec_profile_mode(&mode, &r, &err), HPC_ERR_USAGE, "HPC_PROFILE=%s accepted", bad[i]);
        cr_expect(strstr(err.msg, bad[i]) != NULL, "HPC_PROFILE=%s: the message names the value: %s", bad[i], err.msg);
        cr_expect(strstr(err.msg, "graph:N") != NULL, "HPC_PROFILE=%s: the message says what it takes: %s", bad[i],
                  err.msg);
    }
    unsetenv("HPC_PROFILE");
}

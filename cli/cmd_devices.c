/* cli/cmd_devices.c — `hpc devices`: can this machine run the cuda backend? */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cuda/cuda_driver.h"
#include "cuda/kernel_cache.h"
#include "cuda/nvrtc_compile.h"

const CliCommand cli_devices_command = {
    .name = "devices", .args = "", .arg_name = "argument", .min_args = 0, .max_args = 0,
    .about = "Says whether the CUDA driver loads and which GPUs hpc can use: name,\n"
             "compute capability, memory, and whether it is usable (sm_80 or newer).\n"
             "Also shows the NVRTC version, the architectures it targets, and the\n"
             "kernel cache directory.\n",
    .footer = "environment:\n"
              "  HPC_CUDA_DRIVER  path of libcuda.so.1 to load (default: the loader's search)\n"
              "  HPC_CACHE_DIR    kernel cache directory (default $XDG_CACHE_HOME/hpc or ~/.cache/hpc)\n"
              "\n"
              "exit status: 0 if at least one GPU is usable, 4 if none (or no driver).\n",
};

static double gib(size_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

static void print_toolchain(void)
{
    char archs[256], dir[KCACHE_PATH_MAX];
    HpcError err;
    int v = nvrtc_version_number();
    nvrtc_supported_archs(archs, sizeof archs);
    printf("NVRTC         %d.%d (targets sm %s)\n", v / 1000, v % 1000 / 10, archs);
    if (kcache_dir(dir, sizeof dir, &err) == HPC_OK) printf("kernel cache  %s\n", dir);
    else printf("kernel cache  unusable: %s\n", err.msg);
}

/* One line per device; returns 1 if it is usable. */
static int print_device(int ordinal)
{
    CudaDevice d;
    HpcError err;
    if (cuda_device_query(&d, ordinal, &err)) {
        printf("  %d  unreadable: %s\n", ordinal, err.msg);
        return 0;
    }
    printf("  %d  %-28s sm_%d  %3d SMs  %6.1f GiB", ordinal, d.name, d.arch, d.sm_count,
           gib(d.total_mem));
    if (d.arch < CUDA_MIN_ARCH) {
        printf("  not usable: hpc needs sm_%d or newer\n", CUDA_MIN_ARCH);
        return 0;
    }
    size_t free_b, total_b;
    int ok = cuda_device_open(&d, ordinal, &err) == HPC_OK &&
             cuda_mem_info(&free_b, &total_b, &err) == HPC_OK;
    cuda_device_close(&d);
    if (!ok) printf("  not usable: %s\n", err.msg);
    else printf(" (%.1f GiB free)  usable\n", gib(free_b));
    return ok;
}

int cmd_devices(int argc, char **argv)
{
    HpcError err = {0};
    CliParsed p;
    int rc = cli_parse(&cli_devices_command, argc, argv, NULL, &p, &err);
    if (rc) return rc == CLI_HELP_SHOWN ? HPC_OK : cli_report(&err);
    int count = 0, usable = 0;
    print_toolchain();
    if (cuda_device_count(&count, &err)) {
        printf("CUDA driver   not usable\n");
        fflush(stdout);
        return cli_report(&err);
    }
    const CudaDriver *cu = cuda_driver();
    printf("CUDA driver   %s, version %d.%d\n", cu->path, cu->version / 1000,
           cu->version % 1000 / 10);
    printf("devices       %d\n", count);
    for (int i = 0; i < count; i++) usable += print_device(i);
    if (usable) return HPC_OK;
    fflush(stdout);
    return cli_report(&(HpcError){HPC_ERR_NO_GPU,
                                  "no usable GPU: hpc needs a CUDA device of compute capability "
                                  "8.0 or newer; use the cpu backend on this machine"});
}

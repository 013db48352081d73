/* runtime/cuda/cuda_driver.h — the CUDA driver API, loaded at run time, and the
 * one checking macro for every CUDA-family call.
 *
 * hpc never links libcuda: cuda_driver_load() dlopens "libcuda.so.1" (or the
 * path in $HPC_CUDA_DRIVER) and resolves each function into a table of
 * pointers, so bin/hpc builds and runs on machines without a driver and says
 * clearly when no GPU is usable (HPC_ERR_NO_GPU, exit code 4).  Types come
 * from <cuda.h>; never call a cu* symbol directly, call it through the table:
 *
 *   const CudaDriver *cu = cuda_driver();          // after a successful load
 *   HpcStatus st = CUDA_CHECK(err, cu->cuMemsetD8(ptr, 0, n));
 *   if (st) return st;
 *
 * The table's members carry the names of the <cuda.h> API (cuMemAlloc,
 * cuMemcpyHtoD, ...); the header's own #defines map them to the versioned
 * symbols (cuMemAlloc_v2, ...) and the loader resolves exactly those.
 *
 * CUDA_CHECK(err, call) works for CUresult, nvrtcResult and cublasStatus_t
 * (chosen by the call's type).  It evaluates the call once and yields an
 * HpcStatus: HPC_OK, or a failure whose message holds the call's text, the
 * error's name and code, file:line and a remedy.  It never returns or jumps
 * for you (no hidden control flow): test the status it yields.
 *   out of memory          -> HPC_ERR_OOM
 *   no device / no driver  -> HPC_ERR_NO_GPU
 *   anything else          -> HPC_ERR_CUDA
 *
 * A CudaDevice is one opened GPU: its primary context (retained and made
 * current on the calling thread, which is what cuBLAS expects), its
 * properties and one non-blocking stream for the work of a run.
 *
 *   CudaDevice dev;
 *   if (cuda_device_open(&dev, 0, &err)) return cli_report(&err);
 *   printf("%s sm_%d\n", dev.name, dev.arch);
 *   cuda_device_close(&dev);
 *
 * Thread safety: cuda_driver_load is idempotent and may be called from any
 * thread; the table it fills is read-only afterwards.
 */
#ifndef HPC_RUNTIME_CUDA_DRIVER_H
#define HPC_RUNTIME_CUDA_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>
#include <cublas_v2.h>
#include <nvrtc.h>

#include "util/error.h"

/* Every driver function hpc uses, once.  X(name) is the <cuda.h> name. */
#define CUDA_DRIVER_FUNCTIONS(X)                                              \
    X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)     \
    X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName)                     \
    X(cuDeviceGetAttribute) X(cuDeviceTotalMem)                               \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)                  \
    X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxSynchronize) X(cuCtxGetDevice) \
    X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)              \
    X(cuFuncSetAttribute) X(cuFuncGetAttribute) X(cuLaunchKernel)             \
    X(cuMemAlloc) X(cuMemFree) X(cuMemGetInfo)                                \
    X(cuMemAllocHost) X(cuMemFreeHost)                                        \
    X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoD)                           \
    X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync)            \
    X(cuMemsetD8) X(cuMemsetD8Async) X(cuMemsetD32Async)                      \
    X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery) \
    X(cuStreamIsCapturing) X(cuStreamWaitEvent)                               \
    X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventRecordWithFlags) \
    X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventQuery)               \
    X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiate)       \
    X(cuGraphLaunch) X(cuGraphExecDestroy) X(cuGraphDestroy)                  \
    X(cuTensorMapEncodeTiled)

/* The function table.  __typeof__ takes each prototype from <cuda.h> without
 * referencing the symbol, so nothing here needs libcuda at link time. */
typedef struct {
#define CUDA_DRIVER_MEMBER(name) __typeof__(name) *name;
    CUDA_DRIVER_FUNCTIONS(CUDA_DRIVER_MEMBER)
#undef CUDA_DRIVER_MEMBER
    void *lib;            /* dlopen handle */
    char path[256];       /* what was opened */
    int version;          /* cuDriverGetVersion, e.g. 13000 for 13.0 */
} CudaDriver;

/* Loads the driver once (later calls return the first result).  Fails with
 * HPC_ERR_NO_GPU when the library or one of its functions is missing, or
 * cuInit fails; the message names what is missing and what to do. */
HpcStatus cuda_driver_load(HpcError *err);

/* The loaded table, or NULL before a successful cuda_driver_load. */
const CudaDriver *cuda_driver(void);

/* Number of CUDA devices (loads the driver). */
HpcStatus cuda_device_count(int *count, HpcError *err);

typedef struct {
    int ordinal;
    CUdevice dev;
    CUcontext ctx;           /* primary context, retained */
    CUstream stream;         /* non-blocking stream for this run's work */
    char name[256];
    int cc_major, cc_minor;
    int arch;                /* cc_major * 10 + cc_minor: 80, 86, 90, ... */
    int sm_count;
    size_t total_mem;        /* bytes */
    int driver_version;      /* 13000 = 13.0 */
    /* The caller's device allocator for executors on this device (the C API
     * sets it; runtime/cuda/device_arena.h), or NULL for cuMemAlloc.  Borrowed. */
    const struct ArenaAllocator *allocator;
} CudaDevice;

/* Oldest compute capability hpc generates code for (sm_80: bf16, cp.async). */
#define CUDA_MIN_ARCH 80

/* Opens device `ordinal` (0 unless the user picked one): loads the driver,
 * retains the primary context, makes it current on this thread, creates the
 * stream.  HPC_ERR_NO_GPU if the device does not exist or is older than
 * sm_80.  Close with cuda_device_close. */
HpcStatus cuda_device_open(CudaDevice *d, int ordinal, HpcError *err);
void cuda_device_close(CudaDevice *d);
/* As cuda_device_close, but d's primary context stays alive for the
 * process's next open of the GPU: the last release destroys the context,
 * and creating it again cost 0.12 s of every `hpc run --device cuda` (the
 * memory check opens the GPU before the backend does).  At most one
 * context is kept (a second is closed); cuda_kept_context_release drops it,
 * which the cuda backend does once it holds its own. */
void cuda_device_close_keep_context(CudaDevice *d);
void cuda_kept_context_release(void);

/* Starts opening GPU `ordinal` on a thread of its own, so that loading the
 * driver, cuInit and creating the primary context (a quarter of a second
 * on an H200 host) run while the caller reads its inputs and draws the
 * parameters.  The thread loads the driver, reads the device and retains
 * its primary context as the kept context above.  cuda_device_open (and so
 * every later open of the GPU) first waits for it; nothing else needs to.
 * Its failures are not reported: the open that waits does every step again
 * and reports its own error (the driver's load error is the same once-made
 * status), with the call, the code and the remedy.  Once libcuda is found
 * the thread also starts cuBLASLt's load on a thread of its own
 * (cuda/cublaslt_load.h).  Idempotent (the first call starts it);
 * HPC_START_OVERLAP=0 in the environment turns it off.
 *
 * The caller must call cuda_ahead_join() before the process exits (after
 * its last use of the GPU, or on its error path): an exit() while a thread
 * is still inside libcuda's or libcublasLt's loading would run the exit
 * handlers those libraries registered under the thread's feet (atexit
 * order is last-registered first, so no handler of ours can run before
 * theirs).  `hpc run` does (cli/cmd_run.c). */
void cuda_device_open_ahead(int ordinal);
void cuda_ahead_join(void);

/* Reads one device's properties without retaining a context (hpc devices). */
HpcStatus cuda_device_query(CudaDevice *d, int ordinal, HpcError *err);

/* Free and total device memory of the current context, bytes. */
HpcStatus cuda_mem_info(size_t *free_bytes, size_t *total_bytes, HpcError *err);

/* Kernels get 48 KiB of dynamic shared memory a block unless raised: this
 * raises f's limit to shmem bytes (nothing to do up to 48 KiB).  Call it
 * once per function, where it is looked up, not before every launch: it is
 * a driver call, and an eager step would pay it at every node. */
HpcStatus cuda_func_allow_shared(CUfunction f, unsigned shmem, HpcError *err);

/* Launches f on `stream` with the given grid/block (x, y, z) and dynamic
 * shared memory; args as for cuLaunchKernel.  Over 48 KiB of shmem needs
 * cuda_func_allow_shared(f) first (the driver refuses the launch otherwise). */
HpcStatus cuda_launch(CUfunction f, const unsigned grid[3], const unsigned block[3],
                      unsigned shmem, CUstream stream, void **args, HpcError *err);

/* Calls of cuda_launch so far and the host seconds spent in them, counted
 * only while start-up recording is on (util/phase_clock.h: HPC_STARTUP=1),
 * so the start-up report can tell our launches from cuBLASLt's work. */
void cuda_launch_stats(long *calls, double *seconds);

/* The checking functions behind CUDA_CHECK; call the macro, not these. */
HpcStatus cuda_check_cu(CUresult r, const char *call, const char *file, int line, HpcError *err);
HpcStatus cuda_check_nvrtc(nvrtcResult r, const char *call, const char *file, int line, HpcError *err);
HpcStatus cuda_check_cublas(cublasStatus_t r, const char *call, const char *file, int line, HpcError *err);

#define CUDA_CHECK(err, call)                                                \
    _Generic((call), CUresult: cuda_check_cu, nvrtcResult: cuda_check_nvrtc, \
             cublasStatus_t: cuda_check_cublas)((call), #call, __FILE__, __LINE__, (err))

/* Name of a CUresult ("CUDA_ERROR_OUT_OF_MEMORY"), from the driver when it
 * is loaded, else from a built-in table of the common codes. */
const char *cuda_result_name(CUresult r);

#endif

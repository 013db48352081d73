/* runtime/cuda/nvrtc_compile.h — CUDA C++ source to a cubin with NVRTC, cached.
 *
 * nvrtc_compile() compiles one translation unit for one real architecture
 * (--gpu-architecture=sm_XX, XX >= 80) and returns the CUBIN from
 * nvrtcGetCUBIN.  NVRTC needs no GPU, so CI compiles every emitted kernel.
 * The options always include the arch and -I for the toolkit's headers
 * (cuda_fp16.h, cuda_bf16.h) when found; pass extra ones in `options`.
 * Compiles run NVVM and ptxas on every core (--split-compile=0): on the
 * H200 host BERT-base fp16's step module took 1.8-2.3 s that way against
 * 4.8 s on one thread, with the same step times (BENCHMARKS.md, sixth
 * session).
 * HPC_NVRTC_SPLIT=N sets the thread count (1: one thread, no option).
 * HPC_NVRTC_OPTIONS="OPT OPT ..." adds any NVRTC options (space separated),
 * for experiments such as "--no-cache" (NVRTC 12.9+ keeps its own cache of
 * compiled programs on the machine: without it a second process's compile
 * of the same source says nothing about a fresh machine's).
 * Every option is part of the cache key, so such cubins never mix.
 *
 * When compilation fails, the source and NVRTC's log are saved to
 * DIR/failed/NAME-KEY8.cu and .log (DIR: the kernel cache directory, or
 * /tmp when that is unusable); the HPC_ERR_CUDA message quotes the first
 * error line and names both files.
 *
 * nvrtc_compile_cached() looks in the disk cache (kernel_cache.h) first and
 * stores what it compiles; a damaged entry is recompiled and replaced.  A
 * cache that cannot be written is not an error: the cubin is still returned
 * and info->note says why it was not stored.
 *
 * The caller frees *cubin with free().
 *
 *   void *cubin; size_t n; NvrtcCacheInfo info;
 *   if (nvrtc_compile_cached(src, "ln_fwd_f16_h768", 90, NULL, 0,
 *                            &cubin, &n, &info, &err)) return err.code;
 *   CUmodule m; CUDA_CHECK(&err, cu->cuModuleLoadData(&m, cubin)); free(cubin);
 */
#ifndef HPC_RUNTIME_NVRTC_COMPILE_H
#define HPC_RUNTIME_NVRTC_COMPILE_H

#include <stdbool.h>
#include <stddef.h>

#include "util/error.h"
#include "cuda/kernel_cache.h"

/* Whether HPC_CUDA_EMU=1: the CUDA emulator (tools/cuemu, docs/cuemu.md)
 * stands in for the driver, so nvrtc_compile returns the source, tagged,
 * for it to build on the CPU, in place of a cubin (and adds -DHPC_EMU to
 * the options, so the kernel cache keeps such images apart). */
int nvrtc_emu_requested(void);

/* NVRTC's version as major*1000 + minor*10 (13.0 -> 13000). */
int nvrtc_version_number(void);

/* Comma-separated list of the sm_XX NVRTC can target, e.g. "75,80,86,...". */
void nvrtc_supported_archs(char *buf, size_t size);

/* Compiles `source` (NUL-terminated) for sm_<arch>.  `name` names the
 * program in messages and saved files (letters, digits, '_' and '-').
 * On success *cubin (malloc'd) and *size hold the CUBIN.  If log is not
 * NULL it receives NVRTC's log (malloc'd, possibly empty) on success too. */
HpcStatus nvrtc_compile(const char *source, const char *name, int arch,
                        const char *const *options, int num_options,
                        void **cubin, size_t *size, char **log, HpcError *err);

typedef struct {
    KcacheResult result;   /* HIT, MISS (compiled) or CORRUPT (recompiled) */
    bool stored;           /* a fresh cubin was written to the cache */
    char note[1024];       /* why it was not stored, or "" */
    char path[KCACHE_PATH_MAX]; /* the entry's file, or "" with no cache */
} NvrtcCacheInfo;

/* As nvrtc_compile, through the disk cache in kcache_dir(). */
HpcStatus nvrtc_compile_cached(const char *source, const char *name, int arch,
                               const char *const *options, int num_options,
                               void **cubin, size_t *size, NvrtcCacheInfo *info,
                               HpcError *err);

/* What this process compiled so far: NVRTC runs (nvrtc_compile, also
 * through the cache on a miss), cache hits of nvrtc_compile_cached, and the
 * seconds spent in NVRTC.  `HPC_PROFILE=1 hpc run` prints them; tests use
 * them to count compiles per module. */
typedef struct {
    long compiles, cache_hits;
    double compile_seconds;
} NvrtcStats;

void nvrtc_compile_stats(NvrtcStats *s);

#endif

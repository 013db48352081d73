/* runtime/cuda/cublaslt_load.c — see cublaslt_load.h. */
#include "cuda/cublaslt_load.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/phase_clock.h"

static CublasLt g_lt;
static HpcError g_error;
static HpcStatus g_status = HPC_ERR_INTERNAL;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#define CUBLASLT_STR_(x) #x
#define CUBLASLT_STR(x) CUBLASLT_STR_(x)

static void load_once(void)
{
    double t0 = phase_clock_now();
    const char *path = getenv("HPC_CUBLASLT");
    if (!path || !*path) path = "libcublasLt.so." CUBLASLT_STR(CUBLAS_VER_MAJOR);
    snprintf(g_lt.path, sizeof g_lt.path, "%s", path);
    g_lt.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!g_lt.lib) {
        const char *why = dlerror();
        g_status = hpc_fail(&g_error, HPC_ERR_NO_GPU,
                            "no cuBLASLt: cannot load %s (%s). The cuda backend needs the CUDA %d toolkit's "
                            "libcublasLt: install it, or set HPC_CUBLASLT to the library's full path",
                            path, why ? why : "unknown reason", CUBLAS_VER_MAJOR);
        return;
    }
    g_status = HPC_OK;
#define CUBLASLT_RESOLVE(name)                                                                              \
    if (!g_status && !(*(void **)&g_lt.name = dlsym(g_lt.lib, #name)))                                    \
        g_status = hpc_fail(&g_error, HPC_ERR_NO_GPU, "the cuBLASLt library %s lacks the function %s: it is " \
                            "older than hpc needs (built against cuBLAS %d); install the CUDA %d toolkit's",  \
                            g_lt.path, #name, CUBLAS_VERSION, CUBLAS_VER_MAJOR);
    CUBLASLT_FUNCTIONS(CUBLASLT_RESOLVE)
#undef CUBLASLT_RESOLVE
    if (g_status) {
        dlclose(g_lt.lib);
        g_lt.lib = NULL;
        return;
    }
    phase_spanf(t0, phase_clock_now(), "cuBLASLt loaded (%s; its static initialisers)", g_lt.path);
}

HpcStatus cublaslt_load(HpcError *err)
{
    pthread_once(&g_once, load_once);
    if (g_status && err) *err = g_error;
    return g_status;
}

const CublasLt *cublaslt(void)
{
    return g_lt.lib && g_status == HPC_OK ? &g_lt : NULL;
}

static pthread_mutex_t ahead_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t ahead_thread;
static bool ahead_started, ahead_running;

static void *ahead_main(void *arg)
{
    (void)arg;
    cublaslt_load(NULL);
    return NULL;
}

void cublaslt_load_join(void)
{
    pthread_mutex_lock(&ahead_lock);
    if (ahead_running) pthread_join(ahead_thread, NULL);
    ahead_running = false;
    pthread_mutex_unlock(&ahead_lock);
}

/* A fallback at exit (see cuda_ahead_join in cuda/cuda_driver.h for why it
 * cannot be the only one). */
static void ahead_join(void) { cublaslt_load_join(); }

void cublaslt_load_ahead(void)
{
    const char *off = getenv("HPC_START_OVERLAP");
    if (off && strcmp(off, "0") == 0) return;
    pthread_mutex_lock(&ahead_lock);
    if (!ahead_started) {
        ahead_started = true;
        ahead_running = pthread_create(&ahead_thread, NULL, ahead_main, NULL) == 0;
        if (ahead_running) atexit(ahead_join);
    }
    pthread_mutex_unlock(&ahead_lock);
}

/* compiler/kernel_sources.h — the CUDA templates of the .cu files in compiler/kernels/,
 * embedded into the library at build time (scripts/embed-sources.sh), so
 * the emitter needs no files at run time. */
#ifndef HPC_COMPILER_KERNEL_SOURCES_H
#define HPC_COMPILER_KERNEL_SOURCES_H

typedef struct {
    const char *name; /* file name, e.g. "layernorm.cu" */
    const char *text; /* its whole text */
} KernelSource;

extern const KernelSource kernel_sources[];
extern const int kernel_source_count;

/* The template named `name`, or NULL. */
const char *kernel_source_find(const char *name);

#endif

/* compiler/emit_lib_internal.h — helpers shared by emit_lib.c (the .cuh)
 * and emit_lib_package.c (the --emit-lib package); not for other modules. */
#ifndef HPC_COMPILER_EMIT_LIB_INTERNAL_H
#define HPC_COMPILER_EMIT_LIB_INTERNAL_H

#include <stdio.h>

#include "emit_kernels.h"
#include "error.h"
#include "program/spec.h"

/* Creates dir if missing (not its parents). */
HpcStatus emitlib_mkdir(const char *dir, HpcError *err);
/* Opens DIR/NAME.EXT for writing; path gets the file's path. */
HpcStatus emitlib_open(const char *dir, const char *name, const char *ext, char *path, size_t cap, FILE **f,
                       HpcError *err);
/* Closes f, failing with HPC_ERR_IO naming path if any write failed. */
/* emitlib_open_path: the same for a whole path.  Both write PATH.tmp;
 * emitlib_close renames it over PATH only when everything was written. */
HpcStatus emitlib_open_path(const char *path, FILE **f, HpcError *err);
HpcStatus emitlib_close(FILE *f, const char *path, HpcError *err);
KemitDtype emitlib_dtype(SpecPrecision policy);
/* The signature of every extern "C" kernel of src, as comment lines. */
void emitlib_print_signatures(FILE *f, const char *src, const char *suffix);
/* Writes DIR/NAME_kernels.cuh; optionally hands back the kernel source
 * (malloc'd, caller frees) and the names' suffix. */
HpcStatus emitlib_write_cuh(const ModelSpec *spec, SpecPrecision policy, const char *dir, char **source_out,
                            char *suffix_out, HpcError *err);

#endif

/* runtime/formats/output_check.h — the checks every hpc output gets before any
 * work starts, so that a run never ends by destroying an input or by
 * finding, after hours of training, that it cannot write its result.
 *
 * The output discipline (docs/reliability.md):
 *   - every file is replaced atomically (runtime/formats/atomic_file.h), or,
 *     for the JSONL run log on a resume, appended to (runtime/report/runlog.h);
 *   - an output that is also an input (the same file: same device and inode,
 *     so symbolic and hard links count) is refused: output_check_not_input;
 *   - an output's folder must exist and take new files, checked by creating
 *     and removing a probe file (so a read-only mount is caught even for
 *     root, whom permission bits do not stop): output_check_writable;
 *   - checkpoint folders are locked (runtime/train/checkpoint.h).
 *
 * Messages name the option ("--log", "-o") and both paths.
 *
 * Usage:
 *   OutputInput in[] = {{"the model file", model_path}, {"the training data", train_tsv}};
 *   if (output_check_file("--predict", predict, in, 2, &err)) return err.code;
 */
#ifndef HPC_RUNTIME_OUTPUT_CHECK_H
#define HPC_RUNTIME_OUTPUT_CHECK_H

#include <stdbool.h>

#include "util/error.h"

typedef struct {
    const char *what;   /* "the model file", "the training data", ... */
    const char *path;   /* NULL or "" entries are skipped */
} OutputInput;

/* True when a and b are the same file (same device and inode), or, when
 * neither exists yet, the same name in the same folder (two outputs). */
bool output_same_file(const char *a, const char *b);

/* HPC_ERR_USAGE when out is the same file as one of in[0..n). */
HpcStatus output_check_not_input(const char *opt, const char *out, const OutputInput *in, int n, HpcError *err);

/* HPC_ERR_IO when path is a directory, its folder is missing or is not a
 * folder, or no file can be created in it.  Creates nothing that stays. */
HpcStatus output_check_writable(const char *opt, const char *path, HpcError *err);

/* Both, for an output file: not one of in[0..n), and writable. */
HpcStatus output_check_file(const char *opt, const char *path, const OutputInput *in, int n, HpcError *err);

#endif

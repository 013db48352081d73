/* program/artifact.h — the NAME.hpc file `hpc compile` writes and
 * `hpc run` loads.
 *
 * A text container, readable with `less`:
 *   line 1   "HPCART 1"                      magic and format version
 *   then     "name NAME", "policy fp16"      one key per line
 *   then sections, each "@@ KIND BYTES" on its own line followed by exactly
 *   BYTES bytes and a newline:
 *     model  the resolved model text (every key the checker resolved,
 *            `extends` already applied), so loading re-runs the front end
 *            on a self-contained file (spec_load_string) in microseconds;
 *     plan   the plan summary of a training step at the model's batch x
 *            seq_len (plan_print), for people;
 *     cuda   the CUDA source of the model's kernels (emit_ops, one
 *            translation unit), for people and --emit-lib;
 *     program  the step program (program/step_program.h): what `hpc run`
 *            and the C API execute, with no front end or lowering.
 * A reader rejects another magic, another version, an unknown policy, an
 * unknown or repeated section, a truncated section or a missing model
 * section (HPC_ERR_INPUT, naming the file and the byte offset).
 * artifact_load_spec (the model section through the front end) is the
 * compiler's: compiler/artifact_spec.h.
 *
 * Ownership: artifact_read fills an Artifact whose strings are malloc'd;
 * artifact_free releases them.  artifact_write borrows everything.
 *
 * Usage:
 *   Artifact a = {.policy = PREC_FP16, .model_text = text, ...};
 *   snprintf(a.name, sizeof a.name, "%s", spec.name);
 *   if (artifact_write("bert_base.hpc", &a, &err)) return err.code;
 */
#ifndef HPC_PROGRAM_ARTIFACT_H
#define HPC_PROGRAM_ARTIFACT_H

#include <stddef.h>
#include <stdio.h>

#include "error.h"
#include "program/spec.h"

#define ARTIFACT_MAGIC "HPCART"
#define ARTIFACT_VERSION 2   /* 2: the program section */
#define ARTIFACT_EXT ".hpc"

typedef struct {
    char name[128];
    SpecPrecision policy;   /* the policy it was compiled for */
    char *model_text;       /* NUL-terminated */
    char *plan_text;        /* NULL when absent */
    char *cuda_source;      /* NULL when absent */
    char *program_text;     /* step_program_write's text; NULL when absent */
} Artifact;

/* Writes atomically enough for a build product: a temporary file then
 * rename.  HPC_ERR_IO naming the path on failure. */
HpcStatus artifact_write(const char *path, const Artifact *a, HpcError *err);
HpcStatus artifact_read(const char *path, Artifact *a, HpcError *err);
void artifact_free(Artifact *a);

/* The resolved model text of a checked spec (malloc'd, caller frees): one
 * `model NAME { ... }` block with every key, which spec_load_string turns
 * back into the same spec. */
char *artifact_model_text(const ModelSpec *spec);

/* "NAME.hpc" for a model name (letters, digits, '_', '-' and '.' kept,
 * anything else becomes '_'). */
void artifact_path_for(const char *model_name, char *buf, size_t size);

#endif

/* runtime/formats/hf_init.h — start a run's weights from a Hugging Face folder
 * (`hpc run MODEL --init HF_DIR`).
 *
 * hf_init_load opens HF_DIR/model.safetensors (the family is detected from
 * the tensor names, runtime/formats/hf_names.h) and goes over every parameter of
 * the model that owns storage, so that all problems are reported at once:
 *   loaded       the tensor is there with the right shape (F32/F16/BF16/F64
 *                converted to f32);
 *   new          a head parameter (pooler, classifier, LM head) that the
 *                file lacks or holds in another shape: it keeps the value
 *                w already holds (its initializer), as transformers does
 *                for a new head;
 *   missing      a stack parameter the file lacks;
 *   mis-shaped   a stack parameter whose tensor has another shape;
 *   not finite   the tensor holds a NaN or inf (runtime/formats/tensor_finite.h).
 * Tensors of the file no parameter uses are listed as unused (not an
 * error).  Any missing, mis-shaped or non-finite parameter makes it fail with
 * HPC_ERR_INPUT after the whole list is built; w is then partly loaded.
 * The module prints nothing: rep->lines holds one line per finding (up to
 * HF_INIT_MAX_LINES; the counts are complete) for the caller to show.
 *
 * Usage (after init_store, before the backend takes the weights):
 *   HfInitReport rep;
 *   HpcStatus st = hf_init_load("bert-base-uncased", &pl, store.w, &rep, &err);
 *   for (int i = 0; i < rep.n_lines; i++) fprintf(stderr, "init: %s\n", rep.lines[i]);
 */
#ifndef HPC_RUNTIME_HF_INIT_H
#define HPC_RUNTIME_HF_INIT_H

#include "util/error.h"
#include "program/params.h"

#define HF_INIT_MAX_LINES 48

typedef struct {
    char model_type[16];     /* detected family */
    char path[4096];         /* the safetensors file read */
    int n_loaded, n_new, n_missing, n_misshapen, n_nonfinite, n_unused;
    int n_lines;
    char lines[HF_INIT_MAX_LINES][320];
} HfInitReport;

/* See above.  dir is a folder holding model.safetensors. */
HpcStatus hf_init_load(const char *dir, const ParamList *pl, float *const *w, HfInitReport *rep, HpcError *err);

#endif

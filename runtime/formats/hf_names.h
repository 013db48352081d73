/* runtime/formats/hf_names.h — hpc parameter <-> Hugging Face checkpoint tensor.
 *
 * hpc names every parameter after Hugging Face's BERT (program/params.h):
 * "bert.encoder.layer.3.attention.self.query.weight", with the prefix
 * "transformer" for decoder stacks.  This module finds the tensor that holds
 * such a parameter in a checkpoint of another family and loads it in hpc's
 * layout, (out, in) f32:
 *
 *   family      hpc                                   checkpoint
 *   bert        identical names; legacy LayerNorm.gamma/.beta accepted
 *   roberta     bert.X -> roberta.X; pooler.dense -> classifier.dense,
 *               classifier -> classifier.out_proj, cls.predictions.* -> lm_head.*
 *   distilbert  attention.self.query -> attention.q_lin, ... ffn.lin1/lin2,
 *               sa_layer_norm, output_layer_norm, pre_classifier, vocab_*
 *   gpt2        wte, wpe, h.N.ln_1/ln_2, ln_f; query/key/value are the three
 *               column blocks of the Conv1D h.N.attn.c_attn, and Conv1D
 *               weights (c_attn, c_proj, c_fc) are stored (in, out), so they
 *               are transposed; GPT2ForSequenceClassification's score has no
 *               bias, so classifier.bias starts at zero
 *
 * Every family also accepts files saved from the bare model class, whose
 * names lack the "bert."/"roberta."/"distilbert."/"transformer." prefix.
 * Tied parameters (tied_to >= 0: the LM decoder weight) own no storage and
 * are never loaded; tensors a tied checkpoint omits are therefore fine.
 * F32, F16, BF16 and F64 tensors are converted to f32.
 *
 * hf_names_save goes the other way, so that PyTorch can load what hpc trained.
 *
 * Usage (initialising a run from a checkpoint, after init_store):
 *   StFile *f;
 *   if (st_open(path, &f, &err)) return err.code;
 *   HpcStatus st = hf_names_load_all(hf_names_detect(f), f, &pl, store.w, &n_new, &err);
 *   st_close(f);
 */
#ifndef HPC_RUNTIME_HF_NAMES_H
#define HPC_RUNTIME_HF_NAMES_H

#include <stdbool.h>

#include "util/error.h"
#include "program/params.h"
#include "formats/safetensors.h"
#include "program/spec.h"

typedef struct {
    const StTensor *t;   /* the checkpoint tensor; NULL when `zeros` */
    bool transpose;      /* stored (in, out): GPT-2 Conv1D */
    int part, parts;     /* block `part` of `parts` along the output dim (c_attn: 3) */
    bool zeros;          /* no such tensor in this family (GPT-2 score bias): start at 0 */
} HfTensorRef;

/* True for the model_type strings this module maps (as hf_config reads). */
bool hf_names_known(const char *model_type);

/* Finds hpc parameter `param` (a full name, ".weight"/".bias" included) in
 * f.  HPC_ERR_INPUT, naming the names tried, when no candidate exists. */
HpcStatus hf_names_find(const char *model_type, const StFile *f, const char *param, HfTensorRef *ref,
                        HpcError *err);

/* Loads parameter p into dst: (dims[0], dims[1]) or (dims[0]) f32 in hpc
 * layout.  Checks the checkpoint tensor's shape and dtype, and that it is
 * finite (st_tensor_check_finite), first; p must own storage (tied_to < 0). */
HpcStatus hf_names_load(const char *model_type, const StFile *f, const ParamInfo *p, float *dst,
                        HpcError *err);

/* True for parameters of the task head (pooler, classifier, LM head), which
 * a checkpoint of another head or of the bare model does not have; a
 * trainer starts those from their initializer, as transformers does. */
bool hf_names_is_head(const char *param);

/* Checks, without loading, that every storage-owning parameter of pl is in
 * f with the right shape and a convertible dtype.  With new_head != NULL,
 * head parameters that f lacks are not errors: up to cap of their names go
 * to new_head and their number to *n_new. */
HpcStatus hf_names_check(const char *model_type, const StFile *f, const ParamList *pl, const char **new_head,
                         int cap, int *n_new, HpcError *err);

/* Loads every storage-owning parameter of pl into w[i] ((dims) f32, e.g.
 * ParamStore.w of runtime/train/init.h).  Head parameters the checkpoint lacks
 * keep the values w already holds (their initializer), as for
 * hf_names_check with new_head; any other missing or misshapen tensor is
 * an error and leaves w partly loaded. */
HpcStatus hf_names_load_all(const char *model_type, const StFile *f, const ParamList *pl, float *const *w,
                            int *n_new, HpcError *err);

/* The family whose names f uses: "roberta", "distilbert", "gpt2", or
 * "bert" (which also reads hpc's own checkpoints: their names are hpc's). */
const char *hf_names_detect(const StFile *f);

/* Checkpoint tensors that no parameter of pl uses (task heads hpc drops,
 * e.g. BERT's next-sentence classifier), not counting buffers transformers
 * itself ignores (attention masks, position_ids, tied duplicates).  Fills
 * names[0..cap) and returns the total count. */
int hf_names_unused(const char *model_type, const StFile *f, const ParamList *pl, const char **names, int cap);

/* The inverse: writes parameters as the checkpoint the transformers class
 * for (model_type, spec's head) loads with from_pretrained: its names,
 * Conv1D layouts, GPT-2's fused c_attn, F32, metadata {"format": "pt"},
 * atomically.  data[i] is parameter i's (dims) f32 storage (ignored for
 * tied parameters).  GPT-2's sequence classifier has no bias in
 * transformers, so classifier.bias is not written (it should be zero). */
HpcStatus hf_names_save(const char *model_type, const ModelSpec *spec, const ParamList *pl,
                        const float *const *data, const char *path, HpcError *err);

#endif

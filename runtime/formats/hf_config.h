/* runtime/formats/hf_config.h — a Hugging Face transformers config.json as a ModelSpec.
 *
 * Reads the config of a BERT, RoBERTa, DistilBERT or GPT-2 checkpoint
 * (model_type "bert", "roberta", "distilbert", "gpt2") into a ModelSpec that
 * starts from spec_defaults(): the architecture (sizes, activation, dropout,
 * LayerNorm epsilon and placement, position offset) and the head implied by
 * "architectures" (…ForSequenceClassification, …ForTokenClassification,
 * …ForMaskedLM, GPT2LMHeadModel; a bare …Model gets the family's default
 * head), with num_labels/id2label/problem_type.  The training section keeps
 * hpc's defaults, except max_seq_len, which is capped to the positions the
 * model has.
 *
 * Missing fields take the value the transformers config class gives them
 * (BertConfig(), GPT2Config(), ...), as transformers itself does.  A field
 * of the wrong JSON type, an out-of-range size, an unknown model_type or
 * activation, or a feature hpc cannot express (relative position
 * embeddings, cross-attention, ...) is an error naming the file and the
 * field.  Things hpc can express only approximately (e.g. GPT-2's
 * embd_pdrop differing from resid_pdrop) become notes in HfConfigInfo for
 * the caller to show; this module prints nothing.
 *
 * hf_model_write then prints a header comment (source, labels, notes) and
 * the ModelSpec as .model source (spec_write, program/spec.h), which
 * spec_load reads back into an equal spec.
 *
 * Usage:
 *   ModelSpec spec; HfConfigInfo info; HpcError err;
 *   if (hf_config_load("bert-base-uncased/config.json", NULL, &spec, &info, &err))
 *       return cli_report(&err);
 *   hf_model_write(&spec, &info, stdout);
 *
 * Neither struct owns heap memory.
 */
#ifndef HPC_RUNTIME_HF_CONFIG_H
#define HPC_RUNTIME_HF_CONFIG_H

#include <stdio.h>

#include "util/error.h"
#include "program/spec.h"

#define HF_MAX_NOTES 8
#define HF_MAX_LABELS 64

typedef struct {
    char model_type[32];        /* "bert", ... */
    char architecture[64];      /* first entry of "architectures", or "" */
    char torch_dtype[16];       /* "float32", "float16", ... or "" */
    int n_notes;
    char notes[HF_MAX_NOTES][256]; /* approximations the caller should show */
    int n_labels;               /* id2label names, by id; 0 if absent or > HF_MAX_LABELS */
    char labels[HF_MAX_LABELS][32];
} HfConfigInfo;

/* Overrides from the command line; NULL or zero fields mean "from config". */
typedef struct {
    const char *head;           /* "classifier", "token_classifier", "masked_lm", "causal_lm" */
    int64_t num_labels;         /* > 0 to override */
} HfImportOptions;

/* Parses the config.json at path.  spec->source is set to path and
 * spec->name to a name derived from the directory ("bert_base_uncased"). */
HpcStatus hf_config_load(const char *path, const HfImportOptions *opt, ModelSpec *spec,
                         HfConfigInfo *info, HpcError *err);

/* Same from memory; name is used in messages and as spec->source. */
HpcStatus hf_config_parse(const char *text, size_t len, const char *name, const HfImportOptions *opt,
                          ModelSpec *spec, HfConfigInfo *info, HpcError *err);

/* Writes spec as a .model file (spec_write); info (may be NULL) adds a
 * header comment with the source, labels and notes. */
void hf_model_write(const ModelSpec *spec, const HfConfigInfo *info, FILE *out);

/* The inverse (runtime/formats/hf_config_write.c), for `hpc export`; numbers are
 * printed with 15 significant digits (0.1, not 0.10000000000000001).
 * hf_config_family: the model_type ("bert", "roberta", "distilbert",
 * "gpt2") whose transformers classes hold spec's architecture and head,
 * chosen from the stack (decoder: gpt2; position offset: roberta; no token
 * types: distilbert; else bert); NULL when none does, with the reason in
 * why (cap bytes; why may be NULL).
 * hf_config_fits: whether model_type's classes hold spec (why: the reason
 * when not).
 * hf_config_write: writes path (atomically) as the config.json of
 * model_type's class for spec's head (BertForSequenceClassification, ...,
 * GPT2LMHeadModel) with every field hf_config_parse reads, labels named
 * LABEL_i; HPC_ERR_USAGE when model_type cannot hold spec. */
const char *hf_config_family(const ModelSpec *spec, char *why, size_t cap);
bool hf_config_fits(const ModelSpec *spec, const char *model_type, char *why, size_t cap);
HpcStatus hf_config_write(const ModelSpec *spec, const char *model_type, const char *path, HpcError *err);

/* Turns any text into a model name the language accepts: [A-Za-z_][A-Za-z0-9_]*,
 * at most cap - 1 bytes ("bert-base-uncased" -> "bert_base_uncased"). */
void hf_model_name(const char *text, char *out, size_t cap);

#endif

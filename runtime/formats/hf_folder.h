/* runtime/formats/hf_folder.h — a whole Hugging Face model folder, written
 * all at once or not at all (`hpc run --output DIR`).
 *
 * hf_folder_write puts into DIR what
 * transformers.AutoModelForSequenceClassification.from_pretrained(DIR)
 * (and AutoTokenizer) load:
 *   config.json              runtime/formats/hf_config_write.c (architectures,
 *                            num_labels, id2label, ...)
 *   model.safetensors        runtime/formats/hf_names.c, HF tensor names
 *   vocab.txt, tokenizer_config.json, special_tokens_map.json
 *                            runtime/formats/hf_tokenizer.h (when vocab_path)
 * Everything is written into a fresh sibling DIR.tmp-XXXXXX first; only
 * when all files are complete does it take DIR's place (rename, or an
 * atomic exchange when DIR exists, after which the old folder is removed).
 * A failure leaves DIR as it was and removes the temporary folder.
 * An existing DIR must be empty or hold only plain files with a config.json
 * (an earlier model folder); anything else is refused (HPC_ERR_USAGE) so
 * that a mistyped --output never deletes unrelated files.
 *
 * hf_folder_check does the cheap checks up front (model_type can hold the
 * model, DIR may be replaced, its parent is writable) so that a long run
 * does not fail at its end.
 */
#ifndef HPC_RUNTIME_HF_FOLDER_H
#define HPC_RUNTIME_HF_FOLDER_H

#include <stdbool.h>

#include "util/error.h"
#include "program/params.h"
#include "program/spec.h"

typedef struct {
    const ModelSpec *spec;
    const ParamList *pl;
    const float *const *w;   /* (pl->n) f32 buffers, ParamList order; tied entries may be NULL */
    const char *model_type;  /* "bert", ...; NULL: hf_config_family's choice */
    const char *vocab_path;  /* copied to vocab.txt; NULL: no tokenizer files */
    bool lower_case;         /* tokenizer_config.json's do_lower_case */
} HfFolder;

HpcStatus hf_folder_check(const char *dir, const ModelSpec *spec, HpcError *err);
HpcStatus hf_folder_write(const char *dir, const HfFolder *f, HpcError *err);

#endif

/* runtime/formats/hf_export.h — a training checkpoint as a Hugging Face model
 * folder: the library call behind `hpc export CHECKPOINT --hf OUT_DIR`
 * (cli/cmd_export.c only parses and prints).
 *
 * hf_export_checkpoint takes the model from the checkpoint's own .model
 * text (runtime/train/checkpoint.h, checkpoint_read_spec), so the original
 * file is not needed, and the weights from its f32 masters (the latest step,
 * or the step folder given).  OUT_DIR (created when missing) gets
 * config.json (hf_config_write) and model.safetensors (hf_names_save, the
 * family's tensor names), each replaced atomically, which transformers'
 * from_pretrained loads.  model_type NULL picks the family whose classes
 * hold the architecture (hf_config_family).  Refused, before anything is
 * written: a model with no transformers counterpart or a family that cannot
 * hold it (HPC_ERR_USAGE), and an OUT_DIR that is the checkpoint folder or
 * its step folder (whose model.safetensors would be replaced).
 *
 * It lowers the model (compiler/lower.h) to know its parameters, so it
 * links the compiler.
 *
 * Usage:
 *   HfExportReport r;
 *   if (hf_export_checkpoint("runs/cola", NULL, "cola-hf", &r, &err)) return err.code;
 *   printf("%s as %s, %lld parameters\n", r.model, r.model_type, (long long)r.n_params);
 */
#ifndef HPC_RUNTIME_HF_EXPORT_H
#define HPC_RUNTIME_HF_EXPORT_H

#include <stdint.h>

#include "util/error.h"

typedef struct {
    char model[64];          /* the model's name */
    char model_type[16];     /* the family written: "bert", "roberta", "distilbert", "gpt2" */
    int64_t n_params;        /* parameters written (tied ones once) */
} HfExportReport;

/* what_out names the output option in messages (e.g. "--hf"). */
HpcStatus hf_export_checkpoint(const char *ckpt, const char *model_type, const char *out_dir, const char *what_out,
                               HfExportReport *rep, HpcError *err);

#endif

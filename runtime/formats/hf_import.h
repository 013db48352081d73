/* runtime/formats/hf_import.h — a Hugging Face model folder as a .model file:
 * the library call behind `hpc import HF_DIR` (cli/cmd_import.c only parses
 * and prints).
 *
 * hf_import_folder reads DIR/config.json (runtime/formats/hf_config.h) into a
 * ModelSpec named `name`, checks the weights and renders the .model text:
 *   - DIR/model.safetensors: its header is validated and every parameter the
 *     model lowers to must be there with its shape (hf_names_check); head
 *     parameters the checkpoint lacks and tensors no parameter uses become
 *     notes, not errors;
 *   - DIR/model.safetensors.index.json: accepted, the shards are checked when
 *     a run loads them;
 *   - only pytorch_model.bin: refused (hpc never unpickles) with the one-line
 *     conversion command;
 *   - no weights: the .model describes the architecture only.
 * The text is loaded back through the front end before it is returned, so an
 * import never yields a file that `hpc check` would reject.  Nothing is
 * printed: imp->notes holds the lines for the caller to show (weights notes,
 * then config.json's approximations).
 *
 * hf_import_save writes the text to path atomically, refusing a path that is
 * one of the imported files (runtime/formats/output_check.h).
 *
 * This module lowers the model (compiler/lower.h) to know its parameters, so
 * it links the compiler; a program that only runs artifacts does not use it.
 *
 * Usage:
 *   HfImport imp;
 *   char name[128];
 *   hf_import_name("models/minilm/", NULL, name, sizeof name);   // "minilm"
 *   if (hf_import_folder("models/minilm", NULL, name, &imp, &err)) return err.code;
 *   for (int i = 0; i < imp.n_notes; i++) fprintf(stderr, "note: %s\n", imp.notes[i]);
 *   if (hf_import_save(&imp, "minilm.model", &err)) ...
 *   hf_import_free(&imp);
 */
#ifndef HPC_RUNTIME_HF_IMPORT_H
#define HPC_RUNTIME_HF_IMPORT_H

#include <stddef.h>

#include "formats/hf_config.h"
#include "util/error.h"
#include "program/spec.h"

#define HF_IMPORT_MAX_NOTES 24

typedef struct {
    ModelSpec spec;          /* the imported model */
    HfConfigInfo info;       /* model_type, architecture, labels, config notes */
    char dir[4096];          /* the folder, as given */
    char config_path[4200];  /* DIR/config.json */
    char weights[4400];      /* what was found: "DIR/model.safetensors (N tensors, all parameters found)", ... */
    char *text;              /* the .model text (malloc'd), which loads back into spec */
    size_t text_len;
    int n_notes;
    char notes[HF_IMPORT_MAX_NOTES][320];
} HfImport;

/* The model name for a folder: from out_path's file name without ".model"
 * when out_path is given ("-o bert_cola.model" -> "bert_cola"), else from
 * dir's last component ("bert-base-uncased/" -> "bert_base_uncased"); made
 * a name the language accepts (hf_model_name). */
void hf_import_name(const char *dir, const char *out_path, char *name, size_t cap);

/* See above.  opt (may be NULL) overrides the head and label count; name
 * becomes spec.name.  HPC_ERR_INPUT for a missing folder or config.json, a
 * bad config or weights that do not fit; *imp needs hf_import_free in every
 * case. */
HpcStatus hf_import_folder(const char *dir, const HfImportOptions *opt, const char *name, HfImport *imp,
                           HpcError *err);

/* Writes imp->text to path atomically; HPC_ERR_USAGE when path is an
 * imported file (what names the option, e.g. "-o"). */
HpcStatus hf_import_save(const HfImport *imp, const char *what, const char *path, HpcError *err);

void hf_import_free(HfImport *imp);

#endif

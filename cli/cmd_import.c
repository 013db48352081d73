/* cli/cmd_import.c — `hpc import`: a Hugging Face model directory -> .model.
 *
 * Parses the options and prints; the work is the library call
 * hf_import_folder (runtime/formats/hf_import.h): config.json read, weights
 * checked against the model, the .model text rendered and loaded back;
 * hf_import_save then replaces the output file atomically. */
#include <stddef.h>
#include <stdio.h>

#include "cli.h"
#include "formats/hf_import.h"

typedef struct {
    const char *dir;   /* HF_DIR, the positional argument */
    const char *out;
    HfImportOptions opt;
} ImportArgs;

#define A(f) offsetof(ImportArgs, f)
static const CliOpt import_opts[] = {
    {.name = "output", .short_name = 'o', .kind = CLI_STR, .off = A(out), .meta = "FILE",
     .help = "output file (default: NAME.model in the current directory, NAME from HF_DIR); replaced atomically"},
    {.name = "head", .kind = CLI_STR, .off = A(opt.head), .meta = "KIND",
     .help = "classifier, token_classifier, masked_lm or causal_lm, instead of the head in config.json"},
    {.name = "labels", .kind = CLI_INT, .off = A(opt.num_labels), .meta = "N", .min = 1, .max = 1 << 20,
     .help = "number of labels for a classifier head"},
    CLI_END,
};
#undef A

const CliCommand cli_import_command = {
    .name = "import", .args = "HF_DIR", .arg_name = "HF_DIR", .min_args = 1, .max_args = 1,
    .about = "Writes a .model file for the Hugging Face transformers model saved in\n"
             "HF_DIR (config.json and model.safetensors, as save_pretrained writes\n"
             "them).  Supported: BERT, RoBERTa, DistilBERT and GPT-2 (model_type bert,\n"
             "roberta, distilbert, gpt2).  The head follows config.json's\n"
             "\"architectures\"; the train block gets hpc's defaults to edit.\n",
    .footer = "Weights saved as pytorch_model.bin must be converted first, with the\n"
              "class named in config.json's \"architectures\" (AutoModel would drop the head):\n"
              "  python -c \"from transformers import BertForSequenceClassification as M; "
              "M.from_pretrained('D').save_pretrained('D', safe_serialization=True)\"\n",
    .sections = {{"options", import_opts, 0}},
};

int cmd_import(int argc, char **argv)
{
    ImportArgs a = {0};
    CliParsed p;
    HpcError err = {0};
    int rc = cli_parse(&cli_import_command, argc, argv, &a, &p, &err);
    if (rc) return rc == CLI_HELP_SHOWN ? HPC_OK : cli_report(&err);
    a.dir = p.args[0];
    char name[sizeof ((ModelSpec *)0)->name], out_path[300];
    hf_import_name(a.dir, a.out, name, sizeof name);
    HfImport imp;
    HpcStatus s = hf_import_folder(a.dir, &a.opt, name, &imp, &err);
    for (int i = 0; !s && i < imp.n_notes; i++) fprintf(stderr, "hpc import: note: %s\n", imp.notes[i]);
    if (!a.out) snprintf(out_path, sizeof out_path, "%s.model", name);
    const char *out = a.out ? a.out : out_path;
    if (!s) s = hf_import_save(&imp, "-o", out, &err);
    if (!s) {
        const ModelSpec *spec = &imp.spec;
        printf("wrote %s: model %s, %s %s, %lld layers, hidden %lld, head %s\nweights: %s\n", out, spec->name,
               imp.info.model_type, spec_stack_kind_name(spec->stack.kind), (long long)spec->stack.layers,
               (long long)spec->stack.hidden,
               spec->head.regression ? "regression" : spec_head_kind_name(spec->head.kind), imp.weights);
    }
    hf_import_free(&imp);
    return s ? cli_report(&err) : HPC_OK;
}

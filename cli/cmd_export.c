/* cli/cmd_export.c — `hpc export CHECKPOINT --hf OUT_DIR`: a training
 * checkpoint (runtime/train/checkpoint.h) as a Hugging Face model folder.
 *
 * Parses the options and prints; the work is the library call
 * hf_export_checkpoint (runtime/formats/hf_export.h): the model from the
 * checkpoint's own .model text, its f32 masters as OUT_DIR/config.json and
 * OUT_DIR/model.safetensors, each replaced atomically. */
#include <stddef.h>
#include <stdio.h>

#include "cli.h"
#include "formats/hf_export.h"

typedef struct {
    const char *ckpt, *out, *type;
} ExportArgs;

static const CliOpt export_opts[] = {
    {.name = "hf", .kind = CLI_STR, .off = offsetof(ExportArgs, out), .meta = "OUT_DIR", .required = true,
     .help = "output folder (created if missing; files replaced atomically)"},
    {.name = "model-type", .kind = CLI_STR, .off = offsetof(ExportArgs, type), .meta = "TYPE",
     .help = "bert, roberta, distilbert or gpt2 (default: the family whose architecture the model has)"},
    CLI_END,
};

const CliCommand cli_export_command = {
    .name = "export", .args = "CHECKPOINT", .arg_name = "CHECKPOINT", .min_args = 1, .max_args = 1,
    .about = "Writes the weights of a training checkpoint (a --checkpoint-dir of `hpc run`,\n"
             "or one of its step-N directories) as a Hugging Face transformers folder:\n"
             "OUT_DIR/config.json and OUT_DIR/model.safetensors, which\n"
             "AutoModelFor...from_pretrained(OUT_DIR) loads.\n",
    .sections = {{"options", export_opts, 0}},
};

static HpcStatus export_run(const ExportArgs *a, HpcError *err)
{
    HfExportReport r;
    HpcStatus st = hf_export_checkpoint(a->ckpt, a->type, a->out, "--hf", &r, err);
    if (!st)
        printf("wrote %s/config.json and %s/model.safetensors: model %s as %s (%lld parameters)\n", a->out,
               a->out, r.model, r.model_type, (long long)r.n_params);
    return st;
}

int cmd_export(int argc, char **argv)
{
    ExportArgs a = {0};
    CliParsed p;
    HpcError err = {0};
    int rc = cli_parse(&cli_export_command, argc, argv, &a, &p, &err);
    if (rc) return rc == CLI_HELP_SHOWN ? HPC_OK : cli_report(&err);
    a.ckpt = p.args[0];
    return export_run(&a, &err) ? cli_report(&err) : HPC_OK;
}

/* cli/cmd_export.c — `hpc export CHECKPOINT --hf OUT_DIR`: a training
 * checkpoint (runtime/train/checkpoint.h) as a Hugging Face model folder.
 *
 * The model comes from the checkpoint's own .model text, so the original
 * file is not needed; the weights are its f32 masters.  OUT_DIR gets
 * config.json (runtime/formats/hf_config.h, hf_config_write) and model.safetensors
 * (runtime/formats/hf_names.h, hf_names_save), each replaced atomically, which
 * transformers' from_pretrained loads. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train/checkpoint.h"
#include "formats/output_check.h"
#include "cli.h"
#include "formats/hf_config.h"
#include "formats/hf_names.h"
#include "lower.h"

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

/* The checkpoint's weights into w[i] for every storage-owning parameter. */
static HpcStatus load_weights(const char *dir, const ModelSpec *spec, const ParamList *pl, float **w, HpcError *err)
{
    for (int i = 0; i < pl->n; i++) {
        if (pl->p[i].tied_to >= 0) continue;
        w[i] = malloc((size_t)params_numel(&pl->p[i]) * sizeof(float));   // (dims) f32
        if (!w[i]) return hpc_fail(err, HPC_ERR_OOM, "export: out of memory for %s", pl->p[i].name);
    }
    TrainState ts = {.spec = spec, .pl = pl, .w = w, .weights_only = true};
    return checkpoint_load(dir, &ts, err);
}

static HpcStatus pick_type(const ModelSpec *spec, const char *asked, const char **type, HpcError *err)
{
    char why[160] = "";
    *type = asked ? asked : hf_config_family(spec, why, sizeof why);
    if (!*type)
        return hpc_fail(err, HPC_ERR_USAGE, "export: model %s has no transformers counterpart: %s", spec->name, why);
    if (!hf_names_known(*type))
        return hpc_fail(err, HPC_ERR_USAGE, "export: --model-type %s: use bert, roberta, distilbert or gpt2", *type);
    return HPC_OK;
}

static HpcStatus make_out_dir(const char *dir, HpcError *err)
{
    struct stat s;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return hpc_fail(err, HPC_ERR_IO, "export: mkdir %s: %s", dir, strerror(errno));
    if (stat(dir, &s) != 0 || !S_ISDIR(s.st_mode))
        return hpc_fail(err, HPC_ERR_IO, "export: %s is not a directory", dir);
    return HPC_OK;
}

static HpcStatus export_run(const ExportArgs *a, HpcError *err)
{
    ModelSpec spec;
    IrGraph g;
    ParamList pl;
    ir_init(&g);
    params_init(&pl);
    const char *type = NULL;
    char path[4200];
    HpcStatus st = checkpoint_read_spec(a->ckpt, &spec, NULL, err);
    if (!st) st = pick_type(&spec, a->type, &type, err);
    if (!st) st = lower_model(&spec, &g, &pl, err);
    float **w = xcalloc((size_t)pl.n + 1, sizeof *w);
    if (!st) st = load_weights(a->ckpt, &spec, &pl, w, err);
    char step[4096] = "";
    if (!st) st = checkpoint_resolve(a->ckpt, step, sizeof step, err);
    OutputInput inputs[] = {{"the checkpoint folder", a->ckpt}, {"the checkpoint's step folder", step}};
    if (!st) st = output_check_not_input("--hf", a->out, inputs, 2, err);   /* its model.safetensors would go */
    if (!st) st = make_out_dir(a->out, err);
    snprintf(path, sizeof path, "%s/config.json", a->out);
    if (!st) st = hf_config_write(&spec, type, path, err);
    snprintf(path, sizeof path, "%s/model.safetensors", a->out);
    if (!st) st = hf_names_save(type, &spec, &pl, (const float *const *)w, path, err);
    if (!st)
        printf("wrote %s/config.json and %s/model.safetensors: model %s as %s (%lld parameters)\n", a->out,
               a->out, spec.name, type, (long long)params_total(&pl));
    for (int i = 0; i < pl.n; i++) free(w[i]);
    free(w);
    params_free(&pl);
    ir_free(&g);
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

/* runtime/formats/hf_export.c — a checkpoint as a Hugging Face folder; see
 * hf_export.h. */
#include "formats/hf_export.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/hf_config.h"
#include "formats/hf_names.h"
#include "formats/output_check.h"
#include "train/checkpoint.h"
#include "compiler/step_program_build.h"   /* the compiler's door: step_program_params */

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
    if (asked && !hf_config_fits(spec, asked, why, sizeof why))   /* before OUT_DIR is made */
        return hpc_fail(err, HPC_ERR_USAGE, "export: --model-type %s: model %s cannot be written as a %s config: %s",
                        asked, spec->name, asked, why);
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

HpcStatus hf_export_checkpoint(const char *ckpt, const char *model_type, const char *out_dir, const char *what_out,
                               HfExportReport *rep, HpcError *err)
{
    memset(rep, 0, sizeof *rep);
    ModelSpec spec;
    ParamList pl;
    params_init(&pl);
    const char *type = NULL;
    char path[4200];
    HpcStatus st = checkpoint_read_spec(ckpt, &spec, NULL, err);
    if (!st) st = pick_type(&spec, model_type, &type, err);
    if (!st) st = step_program_params(&spec, &pl, err);
    float **w = xcalloc((size_t)pl.n + 1, sizeof *w);
    if (!st) st = load_weights(ckpt, &spec, &pl, w, err);
    char step[4096] = "";
    if (!st) st = checkpoint_resolve(ckpt, step, sizeof step, err);
    OutputInput inputs[] = {{"the checkpoint folder", ckpt}, {"the checkpoint's step folder", step}};
    if (!st) st = output_check_not_input(what_out, out_dir, inputs, 2, err);   /* its model.safetensors would go */
    if (!st) st = make_out_dir(out_dir, err);
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    if (!st) st = hf_config_write(&spec, type, path, err);
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    if (!st) st = hf_names_save(type, &spec, &pl, (const float *const *)w, path, err);
    if (!st) {
        snprintf(rep->model, sizeof rep->model, "%s", spec.name);
        snprintf(rep->model_type, sizeof rep->model_type, "%s", type);
        rep->n_params = params_total(&pl);
    }
    for (int i = 0; i < pl.n; i++) free(w[i]);
    free(w);
    params_free(&pl);
    return st;
}

/* runtime/formats/hf_import.c — a Hugging Face folder as a .model file; see
 * hf_import.h. */
#include "formats/hf_import.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/atomic_file.h"
#include "formats/hf_names.h"
#include "formats/output_check.h"
#include "formats/safetensors.h"
#include "compiler/step_program_build.h"   /* the compiler's door: step_program_params, spec_load_string */

static bool is_file(const char *dir, const char *name, char *path, size_t cap)
{
    struct stat st;
    snprintf(path, cap, "%s/%s", dir, name);
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static void add_note(HfImport *imp, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_note(HfImport *imp, const char *fmt, ...)
{
    if (imp->n_notes == HF_IMPORT_MAX_NOTES) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(imp->notes[imp->n_notes++], sizeof imp->notes[0], fmt, ap);
    va_end(ap);
}

void hf_import_name(const char *dir, const char *out_path, char *name, size_t cap)
{
    char tmp[256];
    if (!out_path) {
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/') n--;
        const char *base = dir + n;
        while (base > dir && base[-1] != '/') base--;
        snprintf(tmp, sizeof tmp, "%.*s", (int)(dir + n - base), base);
        hf_model_name(tmp, name, cap);
        return;
    }
    const char *slash = strrchr(out_path, '/');
    snprintf(tmp, sizeof tmp, "%s", slash ? slash + 1 : out_path);
    char *dot = strstr(tmp, ".model");
    if (dot && dot[6] == '\0') *dot = '\0';
    hf_model_name(*tmp ? tmp : "imported", name, cap);
}

/* Every parameter the spec lowers to must be in the checkpoint with the
 * right shape; tensors no parameter uses are noted, not fatal. */
static HpcStatus match_weights(HfImport *imp, const StFile *f, HpcError *err)
{
    const ModelSpec *spec = &imp->spec;
    ParamList pl;
    HpcStatus st = step_program_params(spec, &pl, err);
    const char *fresh[8];
    int n_new = 0;
    if (!st) st = hf_names_check(imp->info.model_type, f, &pl, fresh, 8, &n_new, err);
    if (!st && n_new > 0)
        add_note(imp, "the checkpoint has no %s head: %d new parameters (%s%s) start from their initializer",
                 spec->head.regression ? "regression" : spec_head_kind_name(spec->head.kind), n_new, fresh[0],
                 n_new > 1 ? ", ..." : "");
    if (!st) {
        const char *unused[8];
        int n = hf_names_unused(imp->info.model_type, f, &pl, unused, 8);
        for (int i = 0; i < n && i < 8; i++) add_note(imp, "checkpoint tensor %s is not used by this model", unused[i]);
        if (n > 8) add_note(imp, "... and %d more unused tensors", n - 8);
    }
    params_free(&pl);
    return st;
}

/* The weights beside config.json (see hf_import.h). */
static HpcStatus check_weights(HfImport *imp, HpcError *err)
{
    const char *dir = imp->dir;
    char path[4200];
    if (is_file(dir, "model.safetensors", path, sizeof path)) {
        StFile *f;
        HpcStatus st = st_open(path, &f, err);
        if (st) return st;
        snprintf(imp->weights, sizeof imp->weights, "%s (%lld tensors, all parameters found)", path,
                 (long long)st_count(f));
        st = match_weights(imp, f, err);
        st_close(f);
        return st;
    }
    if (is_file(dir, "model.safetensors.index.json", path, sizeof path)) {
        snprintf(imp->weights, sizeof imp->weights, "%s (sharded; not checked here)", path);
        return HPC_OK;
    }
    if (is_file(dir, "pytorch_model.bin", path, sizeof path) ||
        is_file(dir, "pytorch_model.bin.index.json", path, sizeof path))
        /* The checkpoint's own class keeps its task head; AutoModel would drop it. */
        return hpc_fail(err, HPC_ERR_INPUT,
                        "%s holds PyTorch pickle weights (%s) and no model.safetensors; hpc reads only "
                        "safetensors.  Convert once with:\n  python -c \"from transformers import %s as M; "
                        "M.from_pretrained('%s').save_pretrained('%s', safe_serialization=True)\"",
                        dir, path, *imp->info.architecture ? imp->info.architecture : "AutoModel", dir, dir);
    snprintf(imp->weights, sizeof imp->weights, "none (the .model describes the architecture only)");
    return HPC_OK;
}

/* The text, loaded back through the front end: the diagnostics of a text
 * that does not load (a bug) go into the message. */
static HpcStatus render(HfImport *imp, HpcError *err)
{
    FILE *mem = open_memstream(&imp->text, &imp->text_len);
    if (!mem) return hpc_fail(err, HPC_ERR_OOM, "open_memstream: %s", strerror(errno));
    hf_model_write(&imp->spec, &imp->info, mem);
    fclose(mem);
    char *diag = NULL;
    size_t diag_len = 0;
    FILE *d = open_memstream(&diag, &diag_len);
    if (!d) return hpc_fail(err, HPC_ERR_OOM, "open_memstream: %s", strerror(errno));
    ModelSpec back;
    int rc = spec_load_string(imp->spec.name, imp->text, imp->text_len, NULL, &back, d);
    fclose(d);
    HpcStatus st = rc == 0 ? HPC_OK
                           : hpc_fail(err, HPC_ERR_INTERNAL, "the .model text written for %s does not load (a "
                                      "bug in hpc import):\n%s", imp->spec.source, diag ? diag : "");
    free(diag);
    return st;
}

HpcStatus hf_import_folder(const char *dir, const HfImportOptions *opt, const char *name, HfImport *imp,
                           HpcError *err)
{
    memset(imp, 0, sizeof *imp);
    snprintf(imp->dir, sizeof imp->dir, "%s", dir);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return hpc_fail(err, HPC_ERR_INPUT, "import %s: not a directory; give the folder that holds config.json",
                        dir);
    if (!is_file(dir, "config.json", imp->config_path, sizeof imp->config_path))
        return hpc_fail(err, HPC_ERR_INPUT, "import %s: no config.json there; is it a transformers "
                        "save_pretrained folder?", dir);
    HfImportOptions none = {0};
    HpcStatus s = hf_config_load(imp->config_path, opt ? opt : &none, &imp->spec, &imp->info, err);
    if (!s) s = check_weights(imp, err);
    if (s) return s;
    snprintf(imp->spec.name, sizeof imp->spec.name, "%s", name);
    s = render(imp, err);
    for (int i = 0; !s && i < imp->info.n_notes; i++) add_note(imp, "%s", imp->info.notes[i]);
    return s;
}

HpcStatus hf_import_save(const HfImport *imp, const char *what, const char *path, HpcError *err)
{
    char st_path[4200], index_path[4200];
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", imp->dir);
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", imp->dir);
    OutputInput inputs[] = {{"the config.json being imported", imp->config_path},
                            {"the weights being imported", st_path},
                            {"the weight index being imported", index_path}};
    HpcStatus s = output_check_file(what, path, inputs, 3, err);
    return s ? s : atomic_write_file(path, imp->text, imp->text_len, err);
}

void hf_import_free(HfImport *imp)
{
    free(imp->text);
    imp->text = NULL;
    imp->text_len = 0;
}

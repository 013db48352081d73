/* runtime/formats/hf_init.c — see hf_init.h. */
#include "formats/hf_init.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "formats/hf_names.h"
#include "formats/safetensors.h"

static void line(HfInitReport *rep, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void line(HfInitReport *rep, const char *fmt, ...)
{
    if (rep->n_lines >= HF_INIT_MAX_LINES) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rep->lines[rep->n_lines++], sizeof rep->lines[0], fmt, ap);
    va_end(ap);
}

static void shape_text(const ParamInfo *p, char *out, size_t cap)
{
    if (p->rank > 1) snprintf(out, cap, "[%lld, %lld]", (long long)p->dims[0], (long long)p->dims[1]);
    else snprintf(out, cap, "[%lld]", (long long)p->dims[0]);
}

/* One parameter: loaded, new (head), missing, mis-shaped or not finite. */
static void load_param(const StFile *f, const ParamInfo *p, float *dst, HfInitReport *rep)
{
    char shape[64];
    shape_text(p, shape, sizeof shape);
    HfTensorRef r;
    HpcError e = {0};
    bool head = hf_names_is_head(p->name);
    if (hf_names_find(rep->model_type, f, p->name, &r, NULL) != HPC_OK) {
        if (head) rep->n_new++;
        else rep->n_missing++;
        line(rep, head ? "new: %s %s is not in the checkpoint; initialised (a new head)"
                       : "missing: %s %s is not in the checkpoint", p->name, shape);
        return;
    }
    if (r.t && st_tensor_check_finite(f, r.t, &e) != HPC_OK) {
        rep->n_nonfinite++;
        line(rep, "not finite: %s", e.msg);   /* names the file, tensor and element */
        return;
    }
    if (hf_names_load(rep->model_type, f, p, dst, &e) == HPC_OK) {
        rep->n_loaded++;
        return;
    }
    if (head) {
        rep->n_new++;
        line(rep, "new: %s %s: %s; initialised (a new head)", p->name, shape, e.msg);
    } else {
        rep->n_misshapen++;
        line(rep, "mis-shaped: %s", e.msg);   /* names the tensor, both shapes */
    }
}

HpcStatus hf_init_load(const char *dir, const ParamList *pl, float *const *w, HfInitReport *rep, HpcError *err)
{
    memset(rep, 0, sizeof *rep);
    snprintf(rep->path, sizeof rep->path, "%s/model.safetensors", dir);
    StFile *f;
    HpcStatus st = st_open(rep->path, &f, err);
    if (st) return st;
    snprintf(rep->model_type, sizeof rep->model_type, "%s", hf_names_detect(f));
    for (int i = 0; i < pl->n; i++)
        if (pl->p[i].tied_to < 0) load_param(f, &pl->p[i], w[i], rep);
    const char *unused[16];
    rep->n_unused = hf_names_unused(rep->model_type, f, pl, unused, 16);
    for (int i = 0; i < rep->n_unused && i < 16; i++) {
        const StTensor *t = st_find(f, unused[i]);
        char shape[128] = "[";
        for (int d = 0; t && d < t->ndim; d++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", d ? ", " : "",
                     (long long)t->shape[d]);
        line(rep, "unused: checkpoint tensor %s %s] is not used by this model", unused[i], shape);
    }
    st_close(f);
    if (rep->n_nonfinite)
        return hpc_fail(err, HPC_ERR_INPUT, "init: %s holds NaN or inf in %d tensor%s the model uses (listed above); "
                        "the weights are corrupt or come from a diverged run: use a checkpoint whose weights are "
                        "finite", rep->path, rep->n_nonfinite, rep->n_nonfinite == 1 ? "" : "s");
    if (rep->n_missing || rep->n_misshapen)
        return hpc_fail(err, HPC_ERR_INPUT, "init: %s does not fit this model: %d parameters missing, %d mis-shaped "
                        "(listed above); is it the checkpoint the .model was imported from (hpc import)?",
                        rep->path, rep->n_missing, rep->n_misshapen);
    return HPC_OK;
}

/* tests/data/hf/hf_forward.c — helper of verify_with_transformers.py (not
 * built by make): loads a transformers checkpoint into the parameters of
 * MODEL through runtime/hf_names, runs the forward pass on the cpu backend
 * (f32, no dropout) for one sequence of token ids, and prints the logits,
 * one number per line.  Build like hf_roundtrip.c (see its comment).
 * Usage: hf_forward MODEL_TYPE MODEL.model IN.safetensors ID,ID,... */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_exec.h"
#include "formats/hf_names.h"
#include "lower.h"
#include "compiler/spec_load.h"

static int fail(const HpcError *err)
{
    fprintf(stderr, "hf_forward: %s\n", err->msg);
    return err->code ? err->code : 1;
}

/* One row of ids, no padding, token types 0; labels 0 so the loss runs. */
static Batch *make_batch(const char *list)
{
    int64_t L = 1;
    for (const char *p = list; *p; p++) L += *p == ',';
    Batch *b = batch_new(1, L, 1);
    const char *p = list;
    for (int64_t t = 0; t < L; t++) {
        b->input_ids[t] = (int32_t)strtol(p, (char **)&p, 10);
        p += *p == ',';
        b->attention_mask[t] = 1;
    }
    return b;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: hf_forward MODEL_TYPE MODEL.model IN.safetensors ID,ID,...\n");
        return 2;
    }
    ModelSpec spec;
    HpcError err = {0};
    if (spec_load(argv[2], &spec, stderr) != 0) return 1;
    IrGraph g;
    ParamList pl;
    ir_init(&g);
    params_init(&pl);
    StFile *f = NULL;
    if (lower_model(&spec, &g, &pl, &err) || st_open(argv[3], &f, &err)) return fail(&err);
    float **w = calloc((size_t)pl.n, sizeof *w);
    CpuExec ex;
    cpu_exec_init(&ex, &g, CPU_EXEC_F32);
    for (int i = 0; i < pl.n; i++) {
        if (pl.p[i].tied_to >= 0) continue;
        w[i] = malloc((size_t)params_numel(&pl.p[i]) * sizeof **w);
        if (hf_names_load(argv[1], f, &pl.p[i], w[i], &err)) return fail(&err);
    }
    for (int i = 0; i < pl.n; i++) cpu_exec_bind_param(&ex, i, w[pl.p[i].tied_to >= 0 ? pl.p[i].tied_to : i]);
    Batch *b = make_batch(argv[4]);
    CpuRunOptions o = {.training = false, .backward = false, .seed = 1, .step = 0, .loss_scale = 1};
    if (cpu_exec_run(&ex, b, &o, &err)) return fail(&err);
    const float *logits = cpu_exec_value(&ex, g.logits);
    int64_t n = cpu_exec_numel(&ex, g.logits);
    for (int64_t k = 0; k < n; k++) printf("%.9g\n", logits[k]);
    batch_free(b);
    cpu_exec_free(&ex);
    for (int i = 0; i < pl.n; i++) free(w[i]);
    free(w);
    st_close(f);
    params_free(&pl);
    ir_free(&g);
    return 0;
}

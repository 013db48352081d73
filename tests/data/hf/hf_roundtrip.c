/* tests/data/hf/hf_roundtrip.c — helper of verify_with_transformers.py (not
 * built by make): loads every parameter of MODEL from a transformers
 * checkpoint through runtime/hf_names and writes them back with
 * hf_names_save.  Build from the repository root after `make`:
 *   cc -std=c11 -D_GNU_SOURCE -I. -Iutil -Icompiler -Iruntime -Igrammar \
 *      -Ibuild/gen -o build/hf_roundtrip tests/data/hf/hf_roundtrip.c build/libhpcrt.a build/libhpcc.a \
 *      -Wl,-Bstatic -ljansson -lutf8proc -Wl,-Bdynamic -L/usr/local/cuda/lib64 \
 *      -Wl,-rpath,/usr/local/cuda/lib64 -lnvrtc -lcublasLt -lcublas -ldl -lpthread -lm
 * Usage: hf_roundtrip MODEL_TYPE MODEL.model IN.safetensors OUT.safetensors */
#include <stdio.h>
#include <stdlib.h>

#include "formats/hf_names.h"
#include "lower.h"
#include "compiler/spec_load.h"

static int fail(const HpcError *err)
{
    fprintf(stderr, "hf_roundtrip: %s\n", err->msg);
    return err->code ? err->code : 1;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: hf_roundtrip MODEL_TYPE MODEL.model IN.safetensors OUT.safetensors\n");
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
    if (lower_model(&spec, &g, &pl, &err) || st_open(argv[3], &f, &err) ||
        hf_names_check(argv[1], f, &pl, NULL, 0, NULL, &err))
        return fail(&err);
    float **data = calloc((size_t)pl.n, sizeof *data);
    for (int i = 0; i < pl.n; i++) {
        if (pl.p[i].tied_to >= 0) continue;
        data[i] = malloc((size_t)params_numel(&pl.p[i]) * sizeof **data);
        if (!data[i] || hf_names_load(argv[1], f, &pl.p[i], data[i], &err)) return fail(&err);
    }
    if (hf_names_save(argv[1], &spec, &pl, (const float *const *)data, argv[4], &err)) return fail(&err);
    printf("%d parameters loaded and saved\n", pl.n);
    for (int i = 0; i < pl.n; i++) free(data[i]);
    free(data);
    st_close(f);
    params_free(&pl);
    ir_free(&g);
    return 0;
}

/* tests/link/api_artifact.c — a program that uses the C API (include/hpc.h)
 * on a compiled artifact and nothing else.  Opening a NAME.hpc needs no
 * parser, checker or passes, and the C API's `.model` road
 * (runtime/api/api_model.h) is referenced only weakly, so a static link
 * leaves the compiler's front end out; tests/link/check-no-frontend.sh
 * checks that with nm and runs it.  Built twice by the Makefile: with the
 * cpu backend only, and with the cuda backend linked in
 * (-Wl,--undefined=train_cuda_open), which without a GPU falls back to the
 * cpu under HPC_BACKEND_AUTO.
 *
 *   api_artifact NAME.hpc MODEL.model cpu|auto
 * trains NAME.hpc for three steps (the loss must fall), then checks that
 * opening MODEL.model is refused with a message naming the missing road;
 * prints "backend B: loss L0 -> L1" and exits 0. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "hpc.h"

enum { B = 4, L = 16 };

int main(int argc, char **argv)
{
    if (argc != 4 || (strcmp(argv[3], "cpu") != 0 && strcmp(argv[3], "auto") != 0)) {
        fprintf(stderr, "usage: api_artifact NAME.hpc MODEL.model cpu|auto\n");
        return 2;
    }
    HpcModelOptions o;
    hpc_model_options_init(&o);
    o.path = argv[1];
    o.backend = strcmp(argv[3], "cpu") == 0 ? HPC_BACKEND_CPU : HPC_BACKEND_AUTO;
    o.max_batch = B;
    o.max_seq_len = L;
    o.total_steps = 4;
    HpcModel *m;
    char msg[1024];
    if (hpc_model_open(&o, &m, msg, sizeof msg)) {
        fprintf(stderr, "api_artifact: %s\n", msg);
        return 1;
    }
    HpcModelInfo info;
    if (hpc_model_info(m, &info)) {
        fprintf(stderr, "api_artifact: %s\n", hpc_model_error(m));
        return 1;
    }
    int32_t ids[B * L], mask[B * L], labels[B];
    uint32_t x = 7;
    for (int i = 0; i < B * L; i++) {
        x = x * 1664525u + 1013904223u;
        ids[i] = (int32_t)(x % (uint32_t)info.vocab_size);
        mask[i] = 1;
    }
    for (int i = 0; i < B; i++) labels[i] = i % 2;
    HpcBatch b = {.batch = B, .seq_len = L, .input_ids = ids, .attention_mask = mask, .labels = labels};
    double first = NAN, last = NAN;
    for (int step = 0; step < 3; step++) {
        HpcStepReport r;
        if (hpc_model_train_step(m, &b, &r)) {
            fprintf(stderr, "api_artifact: %s\n", hpc_model_error(m));
            return 1;
        }
        if (step == 0) first = r.loss;
        last = r.loss;
    }
    char backend[200];
    snprintf(backend, sizeof backend, "%s", info.backend);
    hpc_model_free(m);
    if (!isfinite(first) || !(last < first)) {
        fprintf(stderr, "api_artifact: the loss did not fall (%g -> %g)\n", first, last);
        return 1;
    }
    /* The model file is refused: this program has no compiler in it. */
    o.path = argv[2];
    HpcApiStatus st = hpc_model_open(&o, &m, msg, sizeof msg);
    if (st != HPC_API_ERR_USAGE || !strstr(msg, "linked without")) {
        fprintf(stderr, "api_artifact: opening %s should fail for want of the compiler, got %d: %s\n", argv[2],
                (int)st, msg);
        if (!st) hpc_model_free(m);
        return 1;
    }
    printf("backend %s: loss %.6f -> %.6f\n", backend, first, last);
    return 0;
}

/* tests/gpu/gpu_program.c — a step program (program/step_program.h) on the
 * GPU, the road `hpc run NAME.hpc` takes:
 *   1. bert_tiny fp16 compiled, written as text and read back, opened on the
 *      cuda backend (train_backend_open_program) for bounds 8 x 64; forward
 *      losses at the bindings 8x64, 4x16, 8x40, 2x8 and 3x33 equal the cpu
 *      backend's on the same program within 1e-2 relative (fp16 storage, the
 *      GPU's GEMMs sum in another order than the cpu reference);
 *   2. changing the binding compiles nothing: NVRTC compiles and kernel
 *      cache lookups (runtime/cuda/nvrtc_compile.h) do not move during the
 *      five bindings, and opening took at most 3 modules (step, optimizer,
 *      gradient accumulation);
 *   3. three training steps at two different padded lengths run and the
 *      loss stays finite.
 * Exit 0 when every check passes, 1 on a failed check, 4 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_driver.h"
#include "cuda/nvrtc_compile.h"
#include "data/batch.h"
#include "step_program_build.h"
#include "train/train_backend.h"
#include "gpu_check.h"
#include "compiler/spec_load.h"


static Batch *make_batch(int64_t B, int64_t L, uint32_t seed)
{
    Batch *b = batch_new(B, L, 0);
    uint32_t x = seed;
    for (int64_t i = 0; i < B * L; i++) {
        x = x * 1664525u + 1013904223u;
        b->input_ids[i] = (int32_t)(1 + x % 30000);
        b->token_type_ids[i] = (int32_t)(x >> 31);
        b->attention_mask[i] = i % L < L - L / 4;
    }
    for (int64_t i = 0; i < B; i++) b->labels[i] = (int32_t)(i % 2);
    return b;
}

static bool read_back(StepProgram *q)
{
    ModelSpec s;
    HpcError err = {0};
    StepProgram p;
    if (spec_load("models/bert_tiny.model", &s, stderr)) return false;
    s.train.batch_size = 8;
    s.train.max_seq_len = 64;
    if (step_program_compile(&s, PREC_FP16, true, &p, &err)) {
        result(0, "compile bert_tiny: %s", err.msg);
        return false;
    }
    char *t = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&t, &len);
    step_program_write(&p, f);
    fclose(f);
    step_program_free(&p);
    HpcStatus st = step_program_read("gpu_program", t, len, q, &err);
    free(t);
    if (st) result(0, "read back: %s", err.msg);
    return st == HPC_OK;
}

int main(void)
{
    gpu_check_flush = 1;   /* long runs: each line reaches the log at once */
    int count = 0;
    HpcError err = {0};
    if (cuda_device_count(&count, &err) || count == 0) {
        printf("skip: no usable GPU (%s)\n", err.msg[0] ? err.msg : "0 devices");
        return 4;
    }
    StepProgram prog;
    if (!read_back(&prog)) return 1;
    NvrtcStats s0, s1, s2;
    nvrtc_compile_stats(&s0);
    TrainBackend gpu, cpu;
    if (train_backend_open_program(&gpu, TRAIN_DEVICE_CUDA, &prog, 10, 8, 64, &err)) {
        result(0, "open on cuda: %s", err.msg);
        return 1;
    }
    nvrtc_compile_stats(&s1);
    long opened = (s1.compiles - s0.compiles) + (s1.cache_hits - s0.cache_hits);
    result(opened >= 1 && opened <= 3, "opening took %ld modules (%ld compiled, %ld cached) <= 3", opened,
           s1.compiles - s0.compiles, s1.cache_hits - s0.cache_hits);
    if (train_backend_open_program(&cpu, TRAIN_DEVICE_CPU, &prog, 10, 8, 64, &err)) {
        result(0, "open on cpu: %s", err.msg);
        return 1;
    }
    nvrtc_compile_stats(&s1);
    static const int64_t shapes[][2] = {{8, 64}, {4, 16}, {8, 40}, {2, 8}, {3, 33}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        Batch *b = make_batch(shapes[k][0], shapes[k][1], (uint32_t)(17 + k));
        double lg = NAN, lc = NAN;
        HpcStatus st = gpu.forward(&gpu, b, &lg, NULL, &err);
        if (!st) st = cpu.forward(&cpu, b, &lc, NULL, &err);
        double rel = fabs(lg - lc) / fmax(fabs(lc), 1e-30);
        result(!st && isfinite(lg) && rel <= 1e-2, "forward at %lldx%lld: loss %.6f on cuda, %.6f on cpu (rel %.2e) %s",
               (long long)shapes[k][0], (long long)shapes[k][1], lg, lc, rel, st ? err.msg : "");
        batch_free(b);
    }
    nvrtc_compile_stats(&s2);
    result(s2.compiles == s1.compiles && s2.cache_hits == s1.cache_hits,
           "five bindings: %ld NVRTC compiles and %ld cache lookups (want 0 and 0)", s2.compiles - s1.compiles,
           s2.cache_hits - s1.cache_hits);
    for (int step = 0; step < 3; step++) {
        Batch *b = make_batch(8, step == 1 ? 24 : 64, (uint32_t)(99 + step));
        TrainStepStat rec[4];
        int n = 0;
        HpcStatus st = gpu.micro(&gpu, b, 0, &err);
        if (!st) st = gpu.step(&gpu, false, &err);
        if (!st) st = gpu.collect(&gpu, rec, 4, &n, &err);
        result(!st && n == 1 && isfinite(rec[0].loss), "train step %d at L=%d: loss %.5f %s", step + 1,
               step == 1 ? 24 : 64, n == 1 ? rec[0].loss : NAN, st ? err.msg : "");
        batch_free(b);
    }
    printf("backend: %s\n", gpu.name);
    train_backend_close(&gpu);
    train_backend_close(&cpu);
    step_program_free(&prog);
    return gpu_check_summary();
}

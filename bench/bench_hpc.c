/* bench/bench_hpc.c — hpc's BERT-base training step on the GPU, timed.
 *
 * The step is the trainer's own (runtime/train/train_backend.h, cuda backend):
 * forward + backward of the fused graph (compiler/pipeline.h) through
 * cuda_exec with CUDA-graph replay, then the device optimizer (AdamW,
 * clipping at 1.0) and the dynamic loss scaler (runtime/cuda/cuda_optim.h), with
 * the step's batch uploaded from the host as in training.  The model is
 * models/bert_base.model's shape (spec defaults: BERT-base, 2 labels,
 * dropout 0.1), the batch random token ids in [1000, vocab) (never zeros),
 * a full attention mask and random labels, like bench/pytorch_bert.py.
 *
 * For each shape B x L and policy: `warmup` steps, then `iters` steps each
 * timed with CUDA events on the backend's stream; the median in ms.  Peak
 * memory: the executor's peak (plan arena + parameters + optimizer state +
 * odd buffers, runtime/cuda/device_arena.h, + cuBLASLt's workspace) and the
 * device memory in use after the run minus before it (cuMemGetInfo; adds
 * cuBLASLt's own state, the module, the graph, 2 MiB page rounding).
 * One JSON object per line on stdout, as pytorch_bert.py prints.
 *
 * With --profile (or HPC_PROFILE=1 in the environment), one more step after
 * the timed ones runs with HPC_PROFILE=1: cuda_exec times every node with
 * CUDA events, eagerly, and prints its tables to stderr
 * (runtime/cuda/cuda_exec_profile.c, docs/perf.md).  --profile-graph (or
 * HPC_PROFILE=graph[:N]) times the nodes inside the step's CUDA graph
 * instead, the median of N replays (5), which the small shapes need: there
 * the eager rows carry the host's launch latency.  The optimizer and loss-scaler
 * step runs inside the step's graph (the executor's tail), so it is one
 * row of that table, "optimizer + loss scaler", with its own time and rate
 * (34 bytes per parameter for AdamW with an fp16 copy; issue #15's goal is
 * 0.9 ms for BERT-base).
 *
 * Usage: bench_hpc [--shapes 32x128,32x32,256x128] [--policies fp16,fp32]
 *                  [--warmup 10] [--iters 30] [--profile | --profile-graph]
 *                  [--attention-dropout P]   (default 0.1, BERT's: 0 times the
 *                                             step without the attention's
 *                                             dropout draws)
 * Exit 0 on success, 1 on an error, 4 without a GPU. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/batch.h"
#include "cuda/cuda_driver.h"
#include "program/spec.h"
#include "train/train_backend.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}

static Batch *random_batch(const ModelSpec *s, int64_t B, int64_t L)
{
    Batch *b = batch_new(B, L, false);
    for (int64_t i = 0; i < B * L; i++) {
        b->input_ids[i] = (int32_t)(1000 + rnd() % (uint32_t)(s->stack.vocab_size - 1000));
        b->token_type_ids[i] = 0;
        b->attention_mask[i] = 1;
    }
    for (int64_t r = 0; r < B; r++) b->labels[r] = (int32_t)(rnd() % 2);
    return b;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

typedef struct {
    double median_ms, peak_mib, device_mib;
    int64_t skipped;
} BenchResult;

/* Queues one training step (one micro-batch) of the trainer's path. */
static HpcStatus one_step(TrainBackend *be, const Batch *b, HpcError *err)
{
    HpcStatus st = be->micro(be, b, 0, err);
    return st ? st : be->step(be, false, err);
}

static HpcStatus time_steps(TrainBackend *be, const Batch *b, int warmup, int iters, BenchResult *r, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    CUstream s = be->cuda_stream;
    CUevent e0, e1;
    HpcStatus st = CUDA_CHECK(err, cu->cuEventCreate(&e0, CU_EVENT_DEFAULT));
    if (!st) st = CUDA_CHECK(err, cu->cuEventCreate(&e1, CU_EVENT_DEFAULT));
    TrainStepStat stats[TRAIN_STAT_RING];
    int n = 0;
    for (int i = 0; i < warmup && !st; i++) st = one_step(be, b, err);
    if (!st) st = be->collect(be, stats, TRAIN_STAT_RING, &n, err);
    float *ms = xcalloc((size_t)iters, sizeof *ms);
    for (int i = 0; i < iters && !st; i++) {
        st = CUDA_CHECK(err, cu->cuEventRecord(e0, s));
        if (!st) st = one_step(be, b, err);
        if (!st) st = CUDA_CHECK(err, cu->cuEventRecord(e1, s));
        if (!st) st = CUDA_CHECK(err, cu->cuEventSynchronize(e1));
        if (!st) st = CUDA_CHECK(err, cu->cuEventElapsedTime(&ms[i], e0, e1));
    }
    int64_t skipped0 = n ? stats[n - 1].total_skips : 0;
    if (!st) st = be->collect(be, stats, TRAIN_STAT_RING, &n, err);
    if (!st && n) r->skipped = stats[n - 1].total_skips - skipped0;
    qsort(ms, (size_t)iters, sizeof *ms, cmp_float);
    r->median_ms = iters % 2 ? ms[iters / 2] : 0.5 * (ms[iters / 2 - 1] + ms[iters / 2]);
    free(ms);
    cu->cuEventDestroy(e0);
    cu->cuEventDestroy(e1);
    return st;
}

/* One step with cuda_exec's profile mode (HPC_PROFILE's value `mode`) on:
 * its tables (the optimizer one row of them) go to stderr. */
static HpcStatus profile_step(TrainBackend *be, const Batch *b, const char *mode, HpcError *err)
{
    TrainStepStat stats[TRAIN_STAT_RING];
    int n = 0;
    const char *was = getenv("HPC_PROFILE");
    char *keep = was ? strdup(was) : NULL;
    setenv("HPC_PROFILE", mode, 1);
    HpcStatus st = one_step(be, b, err);
    if (!st) st = be->collect(be, stats, TRAIN_STAT_RING, &n, err);
    if (keep) setenv("HPC_PROFILE", keep, 1);
    else unsetenv("HPC_PROFILE");
    free(keep);
    return st;
}

static HpcStatus bench_one(const ModelSpec *spec, SpecPrecision policy, int64_t B, int64_t L, int warmup,
                           int iters, const char *profile, BenchResult *r, HpcError *err)
{
    size_t free0 = 0, free1 = 0, total = 0;
    HpcStatus st = cuda_mem_info(&free0, &total, err);
    TrainBackend be;
    if (!st) st = train_backend_open(&be, TRAIN_DEVICE_CUDA, spec, policy, true, 100000, B, L, err);
    if (st) return st;
    Batch *b = random_batch(spec, B, L);
    st = time_steps(&be, b, warmup, iters, r, err);
    if (!st && profile) st = profile_step(&be, b, profile, err);
    if (!st) st = cuda_mem_info(&free1, &total, err);
    r->peak_mib = be.peak_bytes(&be) / 1048576.0;
    r->device_mib = ((double)free0 - (double)free1) / 1048576.0;
    batch_free(b);
    train_backend_close(&be);
    return st;
}

int main(int argc, char **argv)
{
    const char *shapes = "32x128,32x32,256x128", *policies = "fp16,fp32";
    int warmup = 10, iters = 30;
    double attention_dropout = -1;   /* < 0: the spec's default */
    /* The timed steps run with graphs; only the extra step is profiled, in
     * the environment's mode or the option's. */
    const char *env_profile = getenv("HPC_PROFILE");
    char profile_mode[64] = "";
    if (env_profile && *env_profile && strcmp(env_profile, "0") != 0)
        snprintf(profile_mode, sizeof profile_mode, "%s", env_profile);
    unsetenv("HPC_PROFILE");
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--profile") == 0) snprintf(profile_mode, sizeof profile_mode, "1");
        else if (strcmp(argv[i], "--profile-graph") == 0) snprintf(profile_mode, sizeof profile_mode, "graph");
        else if (i + 1 == argc) break;
        else if (strcmp(argv[i], "--shapes") == 0) shapes = argv[++i];
        else if (strcmp(argv[i], "--policies") == 0) policies = argv[++i];
        else if (strcmp(argv[i], "--warmup") == 0) warmup = atoi(argv[++i]);
        else if (strcmp(argv[i], "--iters") == 0) iters = atoi(argv[++i]);
        else if (strcmp(argv[i], "--attention-dropout") == 0) {
            char *end;
            attention_dropout = strtod(argv[++i], &end);
            if (*end || !(attention_dropout >= 0 && attention_dropout < 1)) {
                fprintf(stderr, "bench_hpc: --attention-dropout %s: a probability in [0, 1)\n", argv[i]);
                return 1;
            }
        }
    }
    if (iters < 1) iters = 1;
    HpcError err = {0};
    CudaDevice dev;   /* holds the primary context, so memory figures exclude its creation */
    if (cuda_device_open(&dev, 0, &err)) {
        fprintf(stderr, "bench_hpc: %s\n", err.msg);
        return err.code == HPC_ERR_NO_GPU ? 4 : 1;
    }
    ModelSpec spec;
    spec_defaults(&spec);
    snprintf(spec.name, sizeof spec.name, "bert_base");
    if (attention_dropout >= 0) spec.stack.attention_dropout = attention_dropout;
    char sh[256];
    snprintf(sh, sizeof sh, "%s", shapes);
    int rc = 0;
    for (char *save = NULL, *tok = strtok_r(sh, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long long B = 0, L = 0;
        if (sscanf(tok, "%lldx%lld", &B, &L) != 2) continue;
        for (SpecPrecision p = PREC_FP32; p <= PREC_BF16; p++) {
            if (!strstr(policies, spec_precision_name(p))) continue;
            BenchResult r = {0};
            if (bench_one(&spec, p, B, L, warmup, iters, *profile_mode ? profile_mode : NULL, &r, &err)) {
                fprintf(stderr, "bench_hpc: B=%lld L=%lld %s: %s\n", B, L, spec_precision_name(p), err.msg);
                rc = 1;
                continue;
            }
            printf("{\"impl\": \"hpc-%s\", \"B\": %lld, \"L\": %lld, \"median_ms\": %.4f, \"peak_mib\": %.1f, "
                   "\"device_mib\": %.1f, \"skipped\": %lld, \"gpu\": \"%s\"}\n", spec_precision_name(p), B, L,
                   r.median_ms, r.peak_mib, r.device_mib, (long long)r.skipped, dev.name);
            fflush(stdout);
        }
    }
    cuda_device_close(&dev);
    return rc;
}

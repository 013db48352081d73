/* tests/gpu/gpu_api.c — the C API (include/hpc.h) on the cuda backend
 * against the cpu backend, same model file, seed and batch.
 *
 * Checks, bert_tiny at fp32 (B = 4, L = 16 with padding):
 *   - forward logits and evaluate loss: cuda vs cpu, rel L2 <= 1e-4;
 *   - three train steps: each step's loss (rel 1e-3: dropout masks agree,
 *     the optimizer differs only in f32 rounding) and the eval loss after;
 *   - save on cuda, load into a fresh cpu handle: logits agree (1e-4);
 *   - the caller's stream (cuStreamCreate through the driver) works;
 *   - a caller's device allocator serves the model's device memory (a train
 *     step and logits match the cpu) and gets every buffer back at free;
 *   - hpc_model_hidden on cuda fails with HPC_API_ERR_USAGE (documented);
 *   - misuse on a cuda handle: an over-long batch is refused.
 * Exit 0 when every check passes, 1 on a failed check, 4 without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hpc.h"
#include "train/train_backend.h"
#include "cuda/cuda_driver.h"
#include "gpu_check.h"

/* Links the cuda backend in (api.c refers to train_cuda_open weakly). */
__attribute__((used)) static TrainCudaOpenFn *const link_cuda = train_cuda_open;

enum { B = 4, L = 16, C = 2 };

/* NaN reads as inf here (the lines print inf, not nan). */
static double rel_l2(const float *a, const float *b, int n)
{
    double r = gpu_check_rel_l2(a, b, n);
    return isfinite(r) ? r : INFINITY;
}

/* A caller's device allocator that counts: every byte of the model's
 * device memory must come from it and go back to it. */
typedef struct {
    int live, calls;
    size_t bytes;
} CountingAllocator;

static void *count_alloc(void *user, size_t bytes, void *stream)
{
    CountingAllocator *a = user;
    CUdeviceptr p = 0;
    if (cuda_driver()->cuMemAlloc(&p, bytes) != CUDA_SUCCESS) return NULL;
    a->live++, a->calls++, a->bytes += bytes;
    return (void *)(uintptr_t)p;
}

static void count_free(void *user, void *ptr, void *stream)
{
    CountingAllocator *a = user;
    cuda_driver()->cuMemFree((CUdeviceptr)(uintptr_t)ptr);
    a->live--;
}

static const HpcDeviceAllocator *open_allocator; /* for the next open_on */

static HpcModel *open_on(HpcBackend be, void *stream, const char *root)
{
    char path[1024], msg[2048];
    snprintf(path, sizeof path, "%s/models/bert_tiny.model", root);
    HpcModelOptions o;
    hpc_model_options_init(&o);
    o.path = path;
    o.backend = be;
    o.max_batch = B;
    o.max_seq_len = L;
    o.total_steps = 10;
    o.seed = 5;
    o.cuda_stream = stream;
    o.allocator = be == HPC_BACKEND_CUDA ? open_allocator : NULL;
    HpcModel *m;
    HpcApiStatus st = hpc_model_open(&o, &m, msg, sizeof msg);
    if (st) {
        printf("open (%s): %s\n", be == HPC_BACKEND_CUDA ? "cuda" : "cpu", msg);
        if (st == HPC_API_ERR_NO_GPU) exit(4);
        exit(1);
    }
    return m;
}

static void make_batch(int32_t *ids, int32_t *mask, int32_t *labels)
{
    unsigned s = 12345;
    for (int i = 0; i < B * L; i++) {
        s = s * 1103515245u + 12345u;
        ids[i] = 1000 + (int32_t)((s >> 8) % 20000);
        mask[i] = !(i / L == 1 && i % L >= 10);  /* row 1: 10 tokens */
    }
    for (int b = 0; b < B; b++) labels[b] = b & 1;
}

static void compare_forward(HpcModel *g, HpcModel *c, const HpcBatch *b, const char *what)
{
    float lg[B * C], lc[B * C];
    double sg = 0, sc = 0;
    int ok = !hpc_model_evaluate(g, b, &sg, lg, B * C) && !hpc_model_evaluate(c, b, &sc, lc, B * C);
    if (!ok) printf("  %s | %s\n", hpc_model_error(g), hpc_model_error(c));
    double r = ok ? rel_l2(lg, lc, B * C) : INFINITY;
    result(ok && r <= 1e-4 && fabs(sg - sc) <= 1e-4 * fabs(sc), "%s: logits rel %.2e, loss %.6f vs %.6f", what,
           r, sg, sc);
}

int main(void)
{
    const char *root = getenv("HPC_ROOT") ? getenv("HPC_ROOT") : ".";
    if (!link_cuda) return 1;
    int32_t ids[B * L], mask[B * L], labels[B];
    make_batch(ids, mask, labels);
    HpcBatch b = {.batch = B, .seq_len = L, .input_ids = ids, .attention_mask = mask, .labels = labels};

    HpcModel *g = open_on(HPC_BACKEND_CUDA, NULL, root), *c = open_on(HPC_BACKEND_CPU, NULL, root);
    HpcModelInfo info;
    hpc_model_info(g, &info);
    printf("cuda handle: %s\n", info.backend);
    compare_forward(g, c, &b, "initial");
    for (int s = 0; s < 3; s++) {
        HpcStepReport rg = {0}, rc = {0};
        int ok = !hpc_model_train_step(g, &b, &rg) && !hpc_model_train_step(c, &b, &rc);
        if (!ok) printf("  %s | %s\n", hpc_model_error(g), hpc_model_error(c));
        result(ok && fabs(rg.loss - rc.loss) <= 1e-3 * fabs(rc.loss) && rg.step == rc.step &&
                   rg.skipped == rc.skipped,
               "train step %d: loss %.6f vs %.6f, step %lld vs %lld", s + 1, rg.loss, rc.loss,
               (long long)rg.step, (long long)rc.step);
    }
    compare_forward(g, c, &b, "after 3 steps");

    float hidden[B * L * 128];
    result(hpc_model_hidden(g, &b, hidden, B * L * 128) == HPC_API_ERR_USAGE, "hidden on cuda: usage error");
    HpcBatch big = b;
    big.seq_len = L + 1;
    result(hpc_model_train_step(g, &big, NULL) == HPC_API_ERR_USAGE, "over-long batch refused on cuda");

    char path[64];
    snprintf(path, sizeof path, "/tmp/hpc_gpu_api_%d.safetensors", (int)getpid());
    HpcModel *fresh = open_on(HPC_BACKEND_CPU, NULL, root);
    int ok = !hpc_model_save_weights(g, path) && !hpc_model_load_weights(fresh, path);
    if (!ok) printf("  %s | %s\n", hpc_model_error(g), hpc_model_error(fresh));
    result(ok, "save on cuda, load on cpu");
    if (ok) compare_forward(g, fresh, &b, "reloaded on cpu");
    remove(path);
    hpc_model_free(fresh);
    hpc_model_free(c);

    /* The caller's stream, created while g keeps the context current. */
    const CudaDriver *cu = cuda_driver();
    CUstream stream = NULL;
    if (cu && cu->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS) {
        HpcModel *gs = open_on(HPC_BACKEND_CUDA, stream, root), *cs = open_on(HPC_BACKEND_CPU, NULL, root);
        compare_forward(gs, cs, &b, "caller's stream");
        hpc_model_free(gs);
        hpc_model_free(cs);
        cu->cuStreamDestroy(stream);
    } else {
        result(0, "cuStreamCreate for the caller's-stream check");
    }
    /* The caller's allocator serves the model's device memory and gets it all back. */
    CountingAllocator counter = {0};
    HpcDeviceAllocator alloc = {.alloc = count_alloc, .free = count_free, .user = &counter};
    open_allocator = &alloc;
    HpcModel *ga = open_on(HPC_BACKEND_CUDA, NULL, root), *ca = open_on(HPC_BACKEND_CPU, NULL, root);
    open_allocator = NULL;
    HpcStepReport ra = {0}, rb = {0};
    int trained = !hpc_model_train_step(ga, &b, &ra) && !hpc_model_train_step(ca, &b, &rb);
    result(trained && fabs(ra.loss - rb.loss) <= 1e-3 * fabs(rb.loss), "caller's allocator: train step loss %.6f vs %.6f",
           ra.loss, rb.loss);
    compare_forward(ga, ca, &b, "caller's allocator");
    result(counter.calls > 0 && counter.bytes > 1000000, "caller's allocator served %d buffers, %.1f MiB",
           counter.calls, counter.bytes / 1048576.0);
    hpc_model_free(ga);
    hpc_model_free(ca);
    result(counter.live == 0, "caller's allocator: every buffer returned (%d left)", counter.live);

    hpc_model_free(g);
    printf("%d/%d checks passed\n", g_checks - g_failures, g_checks);
    return g_failures ? 1 : 0;
}

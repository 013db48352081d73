/* tests/gpu/gpu_nan.c — NaN travels through the CUDA step as through the cpu
 * reference: an attention row whose scores overflow must come out NaN on
 * both backends, never as zeros that look like a fully masked row (the bug
 * of issue 13: eval and --predict printed finite numbers).
 *
 * bert_tiny, B = 4, L = 16 with padding, fp32 / fp16 / bf16: the weights are
 * saved, layer 0's query weight is set to 3e38 everywhere (finite, so the
 * load check of runtime/formats/tensor_finite.h lets it through; the query
 * projection overflows to inf and the scores to inf/NaN), and loaded into a
 * cpu and a cuda handle.  Checks: every logit is NaN on both, and the loss
 * is not finite on both; then the clean weights give finite logits again
 * (the NaN was the weights', not a stuck state).
 * Exit 0 when every check passes, 1 on a failed check, 4 without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hpc.h"
#include "train/train_backend.h"
#include "formats/safetensors.h"
#include "gpu_check.h"

/* Links the cuda backend in (api.c refers to train_cuda_open weakly). */
__attribute__((used)) static TrainCudaOpenFn *const link_cuda = train_cuda_open;

enum { B = 4, L = 16, C = 2 };

static HpcModel *open_on(HpcBackend be, HpcPrecision prec, const char *root)
{
    char path[1024], msg[1024];
    snprintf(path, sizeof path, "%s/models/bert_tiny.model", root);
    HpcModelOptions o;
    hpc_model_options_init(&o);
    o.path = path;
    o.backend = be;
    o.precision = prec;
    o.max_batch = B;
    o.max_seq_len = L;
    o.seed = 5;
    HpcModel *m;
    HpcApiStatus st = hpc_model_open(&o, &m, msg, sizeof msg);
    if (st) {
        printf("open (%s): %s\n", be == HPC_BACKEND_CUDA ? "cuda" : "cpu", msg);
        exit(st == HPC_API_ERR_NO_GPU ? 4 : 1);
    }
    return m;
}

/* Reads path, sets every element of tensor `name` (F32) to v, writes it to out. */
static int patch_tensor(const char *path, const char *name, float v, const char *out)
{
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    rewind(f);
    unsigned char *buf = malloc((size_t)len);
    int ok = buf && fread(buf, 1, (size_t)len, f) == (size_t)len;
    fclose(f);
    StFile *sf = NULL;
    HpcError err;
    const StTensor *t = NULL;
    if (ok) ok = st_open_memory(buf, (size_t)len, path, &sf, &err) == HPC_OK;
    if (ok) t = st_find(sf, name);
    ok = ok && t && t->dtype == ST_F32;
    if (ok) {
        size_t off = (size_t)((const unsigned char *)t->data - buf);
        for (uint64_t i = 0; i < t->numel; i++) memcpy(buf + off + 4 * i, &v, 4);
    }
    if (sf) st_close(sf);
    if (ok) {
        f = fopen(out, "wb");
        ok = f && fwrite(buf, 1, (size_t)len, f) == (size_t)len;
        if (f) fclose(f);
    }
    free(buf);
    return ok;
}

static int all_nan(const float *x, int n)
{
    for (int i = 0; i < n; i++)
        if (!isnan(x[i])) return 0;
    return 1;
}

static int all_finite(const float *x, int n)
{
    for (int i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

int main(void)
{
    const char *root = getenv("HPC_ROOT") ? getenv("HPC_ROOT") : ".";
    if (!link_cuda) return 1;
    int32_t ids[B * L], mask[B * L], labels[B];
    unsigned s = 777;
    for (int i = 0; i < B * L; i++) {
        s = s * 1103515245u + 12345u;
        ids[i] = 1000 + (int32_t)((s >> 8) % 20000);
        mask[i] = !(i / L == 1 && i % L >= 10);
    }
    for (int b = 0; b < B; b++) labels[b] = b & 1;
    HpcBatch b = {.batch = B, .seq_len = L, .input_ids = ids, .attention_mask = mask, .labels = labels};

    char clean[96], huge[96];
    snprintf(clean, sizeof clean, "/tmp/hpc_gpu_nan_clean_%d.safetensors", (int)getpid());
    snprintf(huge, sizeof huge, "/tmp/hpc_gpu_nan_huge_%d.safetensors", (int)getpid());
    HpcModel *c0 = open_on(HPC_BACKEND_CPU, HPC_PRECISION_FP32, root);
    int ok = hpc_model_save_weights(c0, clean) == HPC_API_OK &&
             patch_tensor(clean, "bert.encoder.layer.0.attention.self.query.weight", 3e38f, huge);
    result(ok, "weights saved and the query weight set to 3e38");
    hpc_model_free(c0);
    if (!ok) return 1;

    const HpcPrecision precs[] = {HPC_PRECISION_FP32, HPC_PRECISION_FP16, HPC_PRECISION_BF16};
    const char *names[] = {"fp32", "fp16", "bf16"};
    for (int p = 0; p < 3; p++) {
        HpcModel *g = open_on(HPC_BACKEND_CUDA, precs[p], root), *c = open_on(HPC_BACKEND_CPU, precs[p], root);
        float lg[B * C], lc[B * C];
        double sg = 0, sc = 0;
        ok = !hpc_model_load_weights(g, huge) && !hpc_model_load_weights(c, huge) &&
             !hpc_model_evaluate(g, &b, &sg, lg, B * C) && !hpc_model_evaluate(c, &b, &sc, lc, B * C);
        if (!ok) printf("  %s | %s\n", hpc_model_error(g), hpc_model_error(c));
        result(ok && all_nan(lg, B * C), "%s cuda: overflowing query gives NaN logits (logit 0 = %g)", names[p],
               ok ? lg[0] : 0.0);
        result(ok && all_nan(lc, B * C), "%s cpu: overflowing query gives NaN logits (logit 0 = %g)", names[p],
               ok ? lc[0] : 0.0);
        result(ok && !isfinite(sg) && !isfinite(sc), "%s: loss not finite on both (%g, %g)", names[p], sg, sc);
        ok = !hpc_model_load_weights(g, clean) && !hpc_model_evaluate(g, &b, &sg, lg, B * C);
        result(ok && all_finite(lg, B * C) && isfinite(sg), "%s cuda: clean weights give finite logits again",
               names[p]);
        hpc_model_free(g);
        hpc_model_free(c);
    }
    remove(clean);
    remove(huge);
    printf("%d/%d checks passed\n", g_checks - g_failures, g_checks);
    return g_failures ? 1 : 0;
}

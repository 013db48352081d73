/* runtime/api/api_cuda_link.c — the link flag of earlier hpc releases:
 * before the C API shared the trainer's backend (runtime/train/
 * train_backend.h), a program linked the cuda backend with
 * -Wl,--undefined=api_cuda_open.  That flag pulls in this member, which
 * refers to train_cuda_open and so links the cuda backend as
 * -Wl,--undefined=train_cuda_open does (docs/embedding.md). */
#include "train/train_backend.h"

TrainCudaOpenFn api_cuda_open;

HpcStatus api_cuda_open(TrainBackend *b, int64_t total_steps, int64_t max_B, int64_t max_L,
                        const TrainBackendOptions *o, HpcError *err)
{
    return train_cuda_open(b, total_steps, max_B, max_L, o, err);
}

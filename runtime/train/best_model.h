/* runtime/train/best_model.h — the weights of the best evaluation so far,
 * kept on the host for `hpc run --output DIR`.
 *
 * After every evaluation the trainer calls best_model_offer with the dev
 * metric; when it beats every earlier one (higher or lower is better, as
 * the metric says) the backend's current f32 masters are copied into host
 * buffers (TrainBackend.read_param, which waits for the device).  At the
 * end best_model_write saves them as a transformers folder
 * (runtime/formats/hf_folder.h); a run without evaluations saves the final
 * weights (best_model_take_final).
 *
 * Ownership: BestModel owns one f32 copy of every storage-owning parameter
 * (about 4 bytes per parameter); best_model_free releases it.  The backend
 * is borrowed and must outlive it.
 */
#ifndef HPC_RUNTIME_BEST_MODEL_H
#define HPC_RUNTIME_BEST_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "formats/hf_folder.h"
#include "train/train_backend.h"
#include "util/error.h"

typedef struct {
    TrainBackend *be;       /* borrowed */
    float **w;              /* (pl.n) host (numel) f32 buffers; NULL for tied parameters */
    bool have;              /* w holds a copy */
    bool higher_is_better;
    double metric;          /* metric of the copy (NAN for final weights without an eval) */
    int64_t step;           /* the step after which it was taken */
} BestModel;

HpcStatus best_model_init(BestModel *bm, TrainBackend *be, bool higher_is_better, HpcError *err);
void best_model_free(BestModel *bm);

/* Copies the current weights when metric is the best so far (a NaN never is);
 * *taken (when not NULL) says whether it did. */
HpcStatus best_model_offer(BestModel *bm, int64_t step, double metric, bool *taken, HpcError *err);

/* Copies the current weights when no evaluation has been offered. */
HpcStatus best_model_take_final(BestModel *bm, int64_t step, HpcError *err);

/* The copy as a transformers folder DIR (hf_folder_write; vocab_path NULL:
 * no tokenizer files). */
HpcStatus best_model_write(const BestModel *bm, const char *dir, const char *vocab_path, bool lower_case,
                           HpcError *err);

#endif

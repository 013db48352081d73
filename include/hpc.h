/* include/hpc.h — the C API of hpc: embed a compiled transformer in another
 * program.  This is the only header such a program includes; it needs no
 * other hpc header and no CUDA header.  Link with libhpcrt.a and libhpcc.a
 * (docs/embedding.md has the link line).
 *
 * What it does.  An HpcModel is one model with its weights and, once it has
 * trained, its optimizer state and loss scaler.  It is opened from a NAME.hpc
 * artifact (`hpc compile`) or a .model file, on the cpu backend (the
 * reference executor, any machine) or the cuda backend.  With it a program
 *   - loads and saves weights (safetensors, hpc's parameter names, which are
 *     Hugging Face's BERT names; a Hugging Face checkpoint also loads),
 *   - runs the forward pass to logits (B, C) or to the last hidden states
 *     (B, L, H) for a batch of token ids and attention masks,
 *   - evaluates (loss and logits, dropout off),
 *   - runs a training step: forward, backward, the optimizer of the model
 *     file and the dynamic loss scaler (a step whose gradients overflow is
 *     skipped and the scale halves, as PyTorch's GradScaler).
 *
 * Errors.  Every function returns an HpcApiStatus (HPC_API_OK = 0).  A
 * failing call leaves the model as it was and stores a one-line message
 * (which call, the cause, a remedy) that hpc_model_error() returns until
 * the next call on that handle.  hpc_model_open, which has no handle yet,
 * writes its message into the caller's buffer.  Misuse — a NULL or freed
 * handle, a NULL array, a shape over the compiled maximum, a token id
 * outside the vocabulary, an options struct from another API version —
 * returns HPC_API_ERR_USAGE or HPC_API_ERR_INPUT; it never crashes.  A
 * handle carries a magic number that hpc_model_free clears, so a freed
 * handle is recognised as long as its memory was not reused.
 *
 * Threads.  No global state: any number of handles may live in one process,
 * each used by one thread at a time (handles are independent; two threads
 * may use two handles at once).
 *
 * Versions.  HPC_API_VERSION is the version this header describes; the
 * library checks it at hpc_model_open (options.api_version, filled by
 * hpc_model_options_init) and refuses another major version.  Artifacts
 * carry their own format version, checked when they are read.
 *
 * Memory.  Every array passed in is borrowed for the duration of the call;
 * every array filled is the caller's.  On the cpu backend all arrays are
 * host memory.  On the cuda backend they are host memory too (the library
 * copies on the caller's stream); the caller may pass the CUstream to queue
 * on and a device allocator for the model's device memory.
 *
 * Usage:
 *   HpcModelOptions o;
 *   hpc_model_options_init(&o);
 *   o.path = "models/bert_tiny.model";
 *   o.backend = HPC_BACKEND_CPU;
 *   HpcModel *m;
 *   char msg[512];
 *   if (hpc_model_open(&o, &m, msg, sizeof msg)) { fprintf(stderr, "%s\n", msg); return 1; }
 *   HpcBatch b = {.batch = 2, .seq_len = 8, .input_ids = ids, .attention_mask = mask};
 *   float logits[2 * 2];                        // (B, C) f32
 *   if (hpc_model_forward(m, &b, logits, 4)) fprintf(stderr, "%s\n", hpc_model_error(m));
 *   hpc_model_free(m);
 */
#ifndef HPC_H
#define HPC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* major << 16 | minor: a new minor version only adds. */
#define HPC_API_VERSION_MAJOR 1
#define HPC_API_VERSION_MINOR 0
#define HPC_API_VERSION ((HPC_API_VERSION_MAJOR << 16) | HPC_API_VERSION_MINOR)

/* The same numbers as the exit codes of `hpc`. */
typedef enum {
    HPC_API_OK = 0,
    HPC_API_ERR_INPUT = 1,       /* bad model file, artifact, weights or batch contents */
    HPC_API_ERR_USAGE = 2,       /* API misuse: NULL/freed handle, bad shape, wrong version */
    HPC_API_ERR_IO = 3,          /* file system */
    HPC_API_ERR_NO_GPU = 4,      /* cuda backend asked for, no usable GPU */
    HPC_API_ERR_CUDA = 5,        /* a CUDA, NVRTC or cuBLAS call failed */
    HPC_API_ERR_OOM = 6,         /* host or device memory exhausted */
    HPC_API_ERR_NUMERIC = 7,     /* training diverged: the loss scaler gave up */
    HPC_API_ERR_INTERNAL = 70,   /* a bug in hpc */
} HpcApiStatus;

typedef enum {
    HPC_BACKEND_CPU = 0,   /* the reference executor, f32 with fp16/bf16 rounding emulated */
    HPC_BACKEND_CUDA = 1,  /* GPU `device`; HPC_API_ERR_NO_GPU without one */
    HPC_BACKEND_AUTO = 2,  /* cuda when a GPU is usable, else cpu */
} HpcBackend;

typedef enum {
    HPC_PRECISION_DEFAULT = 0, /* the artifact's policy; fp32 for a .model file */
    HPC_PRECISION_FP32 = 1,
    HPC_PRECISION_FP16 = 2,
    HPC_PRECISION_BF16 = 3,
} HpcPrecision;

/* The caller's device memory, for the cuda backend.  alloc returns a device
 * pointer (a CUdeviceptr cast to void *) of at least `bytes` bytes, aligned
 * to 256, or NULL; free releases one.  Both are called with the model's
 * stream (a CUstream, NULL for the default stream) and `user`. */
typedef struct {
    void *(*alloc)(void *user, size_t bytes, void *stream);
    void (*free)(void *user, void *ptr, void *stream);
    void *user;
} HpcDeviceAllocator;

typedef struct {
    uint32_t api_version;      /* HPC_API_VERSION (hpc_model_options_init sets it) */
    const char *path;          /* NAME.hpc artifact or .model file, or NULL with model_text */
    const char *model_text;    /* the text of a .model file in memory (NUL-terminated),
                                  used when path is NULL (packages of --emit-lib embed it) */
    HpcBackend backend;        /* default HPC_BACKEND_CPU */
    HpcPrecision precision;    /* default HPC_PRECISION_DEFAULT */
    int64_t max_batch;         /* largest batch; 0 = the model file's batch */
    int64_t max_seq_len;       /* largest padded length; 0 = the model file's seq_len */
    uint64_t seed;             /* initial weights and dropout; 0 = the model file's seed */
    int64_t total_steps;       /* steps the LR schedule spans; 0 = the model file's steps,
                                  or 1000 when it counts epochs */
    int device;                /* cuda: device ordinal */
    void *cuda_stream;         /* cuda: the CUstream to queue on, NULL = a stream of its own */
    const HpcDeviceAllocator *allocator; /* cuda: NULL = cuMemAlloc */
} HpcModelOptions;

/* What the opened model is; strings are owned by the handle. */
typedef struct {
    const char *name;          /* the model's name */
    const char *backend;       /* "cpu" or "cuda (NVIDIA H200, sm_90)" */
    const char *head;          /* "classifier", "token_classifier", "masked_lm", "causal_lm" */
    HpcPrecision precision;
    int64_t vocab_size, hidden, layers, num_labels;
    int64_t max_batch, max_seq_len;
    int64_t logits_per_row;    /* C: num_labels, or vocab_size for LM heads */
    int64_t logits_per_token;  /* 1 if logits are (B, L, C), 0 if (B, C) */
    int64_t n_params;          /* trainable elements (tied weights counted once) */
    int64_t steps;             /* optimizer steps applied so far */
    double loss_scale;         /* the scaler's current scale */
} HpcModelInfo;

/* One batch, row-major: element (b, t) at b * seq_len + t. */
typedef struct {
    int64_t batch, seq_len;          /* B <= max_batch, L <= max_seq_len */
    const int32_t *input_ids;        /* (B, L) token ids < vocab_size */
    const int32_t *attention_mask;   /* (B, L) 1 = token, 0 = padding */
    const int32_t *token_type_ids;   /* (B, L) segment ids, or NULL for all 0 */
    const int32_t *labels;           /* classifier: (B); token/LM heads: (B, L), -100 = ignore;
                                        NULL for forward-only calls */
    const float *targets;            /* regression heads: (B); else NULL */
} HpcBatch;

/* One training step's record. */
typedef struct {
    double loss;        /* the unscaled loss of the batch */
    double lr;          /* learning rate the step used */
    double loss_scale;  /* the scale after the step */
    double grad_norm;   /* unscaled global norm before clipping; inf when skipped */
    int skipped;        /* 1 when the gradients overflowed and nothing changed */
    int64_t step;       /* optimizer steps applied so far */
} HpcStepReport;

typedef struct HpcModel HpcModel;

/* The version the library was built with (HPC_API_VERSION of its header). */
uint32_t hpc_api_version(void);
/* A short name of a status: "ok", "input", "usage", ... */
const char *hpc_api_status_name(HpcApiStatus s);

/* Fills *o with the defaults above and o->api_version = HPC_API_VERSION. */
void hpc_model_options_init(HpcModelOptions *o);

/* Opens a model: a NAME.hpc artifact's step program as it was compiled
 * (nothing is parsed or lowered; another precision than the artifact's
 * compiles its model again), or a model file or text compiled in-process;
 * then initialises the weights (BERT's normal (0, 0.02), seeded) and the
 * backend.  On success *out is a new handle.  On
 * failure *out is NULL and the message goes to errbuf (may be NULL). */
HpcApiStatus hpc_model_open(const HpcModelOptions *o, HpcModel **out, char *errbuf, size_t errcap);
/* Releases everything; NULL is a no-op.  The handle is invalid afterwards. */
void hpc_model_free(HpcModel *m);
/* The message of the last failing call on m ("" after a success); a fixed
 * text for a NULL or invalid handle. */
const char *hpc_model_error(const HpcModel *m);
HpcApiStatus hpc_model_info(HpcModel *m, HpcModelInfo *info);

/* Weights in safetensors.  load: every parameter by hpc's name (as save
 * writes them), or a Hugging Face checkpoint of the same architecture
 * (a missing task head keeps its initial values); shapes must match.
 * Optimizer state is reset.  save: every parameter, F32, atomically. */
HpcApiStatus hpc_model_load_weights(HpcModel *m, const char *path);
HpcApiStatus hpc_model_save_weights(HpcModel *m, const char *path);

/* Forward pass with dropout off.  logits: (B, C) f32, or (B, L, C) when
 * info.logits_per_token; cap is the element capacity of the array. */
HpcApiStatus hpc_model_forward(HpcModel *m, const HpcBatch *b, float *logits, size_t cap);
/* The last hidden states (B, L, H) f32: the input of the task head. */
HpcApiStatus hpc_model_hidden(HpcModel *m, const HpcBatch *b, float *hidden, size_t cap);
/* Loss and (optionally, logits may be NULL) logits with dropout off; the
 * batch needs labels (or targets). */
HpcApiStatus hpc_model_evaluate(HpcModel *m, const HpcBatch *b, double *loss, float *logits,
                                size_t cap);
/* One optimizer step on one batch (dropout on); report may be NULL.
 * HPC_API_ERR_NUMERIC when the loss scaler gave up (too many overflows). */
HpcApiStatus hpc_model_train_step(HpcModel *m, const HpcBatch *b, HpcStepReport *report);

#ifdef __cplusplus
}
#endif

#endif

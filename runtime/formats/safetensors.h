/* runtime/formats/safetensors.h — read and write .safetensors files (Hugging Face).
 *
 * The format: 8 bytes little-endian u64 N, then N bytes of UTF-8 JSON
 *   {"NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]},
 *    ..., "__metadata__": {"key": "value", ...}}
 * then the data section; offsets are relative to its start, END exclusive.
 *
 * Reading.  st_open maps the file read-only and validates the whole header
 * before handing anything out: N within the file and at most ST_MAX_HEADER
 * bytes, a JSON object (valid UTF-8, no duplicate names), known dtypes, at
 * most ST_MAX_DIMS non-negative integer dims whose byte size (checked for
 * 64-bit overflow) equals END - BEGIN, and offsets that tile the data section
 * exactly: no overlap, no gap, nothing after the last tensor.  Every error
 * names the file, the tensor and the broken rule.  Nothing is allocated in
 * proportion to sizes claimed by the file (only to the header's length), so
 * a hostile file cannot cause a huge allocation.
 *
 * StTensor.data points into the mapping and stays valid until st_close.  It
 * is aligned to the element size when the writer aligned it (ours and the
 * reference implementation do); use st_tensor_copy when unsure.
 *
 * Writing.  An StWriter collects (name, dtype, shape, data pointer) entries;
 * it borrows the data, which must stay valid until st_writer_save returns.
 * st_writer_save lays the tensors out largest element size first, then by
 * name (so every tensor is aligned), pads the header with spaces to a
 * multiple of 8, and writes through runtime/atomic_file: the target is
 * replaced completely or not at all.
 *
 * Usage:
 *   StFile *f;
 *   if (st_open("model.safetensors", &f, &err)) return err.code;
 *   const StTensor *t = st_find(f, "bert.embeddings.word_embeddings.weight");
 *   ...
 *   st_close(f);
 *
 *   StWriter w;
 *   st_writer_init(&w);
 *   int64_t shape[2] = {30522, 768};
 *   st_writer_add(&w, "emb.weight", ST_F32, 2, shape, emb, &err);   // (V, H) f32
 *   st_writer_meta(&w, "format", "pt", &err);
 *   HpcStatus s = st_writer_save(&w, "out.safetensors", &err);
 *   st_writer_free(&w);
 */
#ifndef HPC_RUNTIME_SAFETENSORS_H
#define HPC_RUNTIME_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000) /* as the reference reader */

/* X(enum, file name, bytes per element) */
#define ST_DTYPE_LIST(X) \
    X(ST_BOOL, "BOOL", 1) \
    X(ST_U8, "U8", 1)     \
    X(ST_I8, "I8", 1)     \
    X(ST_F8_E4M3, "F8_E4M3", 1) \
    X(ST_F8_E5M2, "F8_E5M2", 1) \
    X(ST_U16, "U16", 2)   \
    X(ST_I16, "I16", 2)   \
    X(ST_F16, "F16", 2)   \
    X(ST_BF16, "BF16", 2) \
    X(ST_U32, "U32", 4)   \
    X(ST_I32, "I32", 4)   \
    X(ST_F32, "F32", 4)   \
    X(ST_U64, "U64", 8)   \
    X(ST_I64, "I64", 8)   \
    X(ST_F64, "F64", 8)

typedef enum {
#define ST_ENUM(e, name, size) e,
    ST_DTYPE_LIST(ST_ENUM)
#undef ST_ENUM
    ST_DTYPE_COUNT
} StDtype;

const char *st_dtype_name(StDtype d);   /* "F32" */
size_t st_dtype_size(StDtype d);        /* bytes per element */
/* Looks a file dtype name up; false if unknown. */
bool st_dtype_parse(const char *name, StDtype *out);

typedef struct {
    const char *name;           /* owned by the StFile / StWriter */
    StDtype dtype;
    int ndim;                   /* 0 = scalar (one element) */
    int64_t shape[ST_MAX_DIMS];
    const void *data;           /* nbytes bytes; see alignment note above */
    uint64_t nbytes;
    uint64_t numel;
} StTensor;

typedef struct StFile StFile;

/* Maps and validates path.  On success *out owns the mapping. */
HpcStatus st_open(const char *path, StFile **out, HpcError *err);
/* Same for a buffer in memory (not copied: it must outlive the StFile);
 * name is used in messages.  For tests and for embedded data. */
HpcStatus st_open_memory(const void *buf, size_t len, const char *name, StFile **out, HpcError *err);
void st_close(StFile *f);

int64_t st_count(const StFile *f);
/* i-th tensor in data-offset order, 0 <= i < st_count. */
const StTensor *st_tensor(const StFile *f, int64_t i);
/* NULL when absent. */
const StTensor *st_find(const StFile *f, const char *name);
/* The i with st_tensor(f, i) == t, for a t that f handed out. */
int64_t st_tensor_index(const StFile *f, const StTensor *t);

int64_t st_metadata_count(const StFile *f);
/* i-th metadata pair; key and value are owned by f. */
void st_metadata_at(const StFile *f, int64_t i, const char **key, const char **value);
/* NULL when absent. */
const char *st_metadata_get(const StFile *f, const char *key);

/* HPC_OK when every element of t is finite; else HPC_ERR_INPUT naming the
 * file, the tensor and the first NaN or inf (runtime/formats/tensor_finite.h).
 * Every weight load calls it on each tensor it uses. */
HpcStatus st_tensor_check_finite(const StFile *f, const StTensor *t, HpcError *err);

/* Copies t's bytes to dst (capacity cap bytes); HPC_ERR_USAGE if too small. */
HpcStatus st_tensor_copy(const StTensor *t, void *dst, size_t cap, HpcError *err);

typedef struct {
    StTensor *tensors;  /* names are heap copies; data is borrowed */
    int64_t count, cap;
    char **meta;        /* 2 * meta_count heap strings: key, value, ... */
    int64_t meta_count;
} StWriter;

void st_writer_init(StWriter *w);
/* Records a tensor.  data (nbytes = numel * dtype size) is borrowed until
 * st_writer_save.  Rejects duplicate names, "__metadata__", empty or
 * non-UTF-8 names, negative dims, more than ST_MAX_DIMS dims and sizes
 * that overflow 64 bits (HPC_ERR_USAGE). */
HpcStatus st_writer_add(StWriter *w, const char *name, StDtype dtype, int ndim,
                        const int64_t *shape, const void *data, HpcError *err);
/* Adds or replaces one "__metadata__" string pair (copied). */
HpcStatus st_writer_meta(StWriter *w, const char *key, const char *value, HpcError *err);
/* Writes the file atomically (see above). */
HpcStatus st_writer_save(const StWriter *w, const char *path, HpcError *err);
void st_writer_free(StWriter *w);

#endif

/* runtime/cuda/cuda_optim_rows.h — the embedding rows a step left untouched.
 *
 * An embedding table's gradient is dense, (V, H) f32, yet only the rows of
 * the step's tokens can be other than 0: the embedding backward clears the
 * table and adds each token's row into it (compiler/emit_ops_embed_ln.c).
 * BERT-base's word table has 30522 rows of 768; a step of 32 x 32 tokens
 * touches at most 1024 of them.  The optimizer's norm pass and update each
 * read the whole gradient (94 MB).  With a byte a chunk (CUDA_OPTIM_CHUNK
 * elements) saying whether any token's row lies in the chunk, set before
 * the norm pass by opt_mark_rows from the step's ids, both passes take an
 * untouched chunk's gradient as 0 without loading it.  Every sum and every
 * update then comes out as with the loads (x + 0 = x), so the weights are
 * the same bit for bit; AdamW still updates every row's m, v and weights,
 * as a dense AdamW does.
 *
 * Which tables (cuda_optim_row_tables): a parameter whose gradient is
 * exactly one embedding backward's table output (EMBEDDING_BWD, or an
 * output of EMBED_LN_BWD; a table also read elsewhere, as a tied decoder,
 * has a summed gradient and is not one), whose ids are a batch input (the
 * plan keeps those to the step's end: program/plan.h), with at least
 * min_chunks chunks: a smaller table saves less than the marking launch
 * costs.  At most CUDA_OPTIM_MAX_ROW_TABLES tables, the largest first.
 *
 * When (runtime/cuda/cuda_optim.c): only in the step's tail, which runs
 * in the same graph right after the backward that read those ids, and only
 * with grad_accum 1 (a sum over micro-batches touches the union of their
 * rows).  cuda_optim_step on its own stays dense: data parallelism calls
 * it after averaging the gradients over ranks, whose tokens differ.
 * HPC_OPT_ROWS=0 turns it off; HPC_OPT_ROWS_MIN_CHUNKS sets min_chunks
 * (cuda_optim_rows_min_chunks; tests set 1 for small models).
 */
#ifndef HPC_RUNTIME_CUDA_OPTIM_ROWS_H
#define HPC_RUNTIME_CUDA_OPTIM_ROWS_H

#include <stdbool.h>
#include <stdint.h>

#include "program/ir.h"
#include "util/error.h"

#define CUDA_OPTIM_MAX_ROW_TABLES 4
/* The default min_chunks: 1 M elements (4 MB of f32 gradient a pass). */
#define CUDA_OPTIM_ROWS_MIN_CHUNKS 256

/* A qualifying table: tensor `tensor` of the optimizer's table (parameter
 * param[tensor]), rows x cols, its ids node `ids` (i32, a batch input). */
typedef struct {
    int tensor, ids;
    int64_t rows, cols;
} CudaOptRowTable;

/* The tables among the optimizer's tensors (parameter param[k] of g for k
 * < count) that qualify, largest first, into out[0..CUDA_OPTIM_MAX_ROW_TABLES);
 * returns how many. */
int cuda_optim_row_tables(const IrGraph *g, const int *param, int count, int64_t min_chunks,
                          CudaOptRowTable *out);

/* Whether HPC_OPT_ROWS allows the marking (unset or anything but "0"). */
bool cuda_optim_rows_wanted(void);

/* min_chunks from HPC_OPT_ROWS_MIN_CHUNKS (unset or empty:
 * CUDA_OPTIM_ROWS_MIN_CHUNKS); HPC_ERR_USAGE naming the variable for
 * anything but an integer from 1 to 10^9. */
HpcStatus cuda_optim_rows_min_chunks(int64_t *min_chunks, HpcError *err);

#endif

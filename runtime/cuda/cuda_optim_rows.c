/* runtime/cuda/cuda_optim_rows.c — which embedding tables the optimizer
 * reads by touched rows; see cuda_optim_rows.h. */
#include "cuda/cuda_optim_rows.h"

#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_optim.h"
#include "util/num_parse.h"

/* The ids node of embedding gradient v (EMBEDDING_BWD itself, or table j of
 * an EMBED_LN_BWD: the node for j = 0, its OUTPUT j for j = 1, 2), or -1. */
static int ids_of_gradient(const IrGraph *g, int v)
{
    const IrNode *n = &g->nodes[v];
    if (n->op == IR_OP_EMBEDDING_BWD) return n->in[1];
    if (n->op == IR_OP_EMBED_LN_BWD) return n->in[4];
    if (n->op != IR_OP_OUTPUT) return -1;
    const IrNode *m = &g->nodes[n->in[0]];
    int j = n->attr.output.index;
    if (m->op != IR_OP_EMBED_LN_BWD || j < 1 || j > 2 || 4 + j >= m->n_in) return -1;
    return m->in[4 + j];
}

int cuda_optim_row_tables(const IrGraph *g, const int *param, int count, int64_t min_chunks,
                          CudaOptRowTable *out)
{
    int n = 0;
    for (int k = 0; k < count; k++) {
        int v = g->param_grad[param[k]];
        int ids = v >= 0 ? ids_of_gradient(g, v) : -1;
        if (ids < 0) continue;
        const IrNode *id = &g->nodes[ids], *grad = &g->nodes[v];
        if (id->op != IR_OP_INPUT || id->dtype != DT_I32 || grad->rank != 2 || grad->dtype != DT_F32) continue;
        CudaOptRowTable t = {.tensor = k, .ids = ids, .rows = grad->dims[0], .cols = grad->dims[1]};
        int64_t chunks = (t.rows * t.cols + CUDA_OPTIM_CHUNK - 1) / CUDA_OPTIM_CHUNK;
        if (chunks < min_chunks) continue;
        /* insert by size, largest first; the smallest falls off a full list */
        int at = n;
        while (at > 0 && out[at - 1].rows * out[at - 1].cols < t.rows * t.cols) at--;
        if (at >= CUDA_OPTIM_MAX_ROW_TABLES) continue;
        int last = n < CUDA_OPTIM_MAX_ROW_TABLES ? n : CUDA_OPTIM_MAX_ROW_TABLES - 1;
        memmove(&out[at + 1], &out[at], (size_t)(last - at) * sizeof *out);
        out[at] = t;
        if (n < CUDA_OPTIM_MAX_ROW_TABLES) n++;
    }
    return n;
}

bool cuda_optim_rows_wanted(void)
{
    const char *e = getenv("HPC_OPT_ROWS");
    return !e || strcmp(e, "0") != 0;
}

HpcStatus cuda_optim_rows_min_chunks(int64_t *min_chunks, HpcError *err)
{
    _Static_assert(CUDA_OPTIM_CHUNK == 4096 && CUDA_OPTIM_ROWS_MIN_CHUNKS == 256, "the message's figures");
    return num_env_int("HPC_OPT_ROWS_MIN_CHUNKS", 1, 1000000000, CUDA_OPTIM_ROWS_MIN_CHUNKS,
                       "the chunks of 4096 elements an embedding table needs for the optimizer to skip its "
                       "untouched rows, or unset for 256", min_chunks, err);
}

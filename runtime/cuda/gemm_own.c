/* runtime/cuda/gemm_own.c — see gemm_own.h. */
#include "cuda/gemm_own.h"

#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_driver.h"
#include "program/step_program.h"
#include "util/num_parse.h"

bool gemm_own_in_source(const char *source) { return source && strstr(source, STEP_SOURCE_GEMM_OWN_MARK) != NULL; }

bool gemm_own_gelu_only(const char *source)
{
    return source && strstr(source, STEP_SOURCE_GEMM_OWN_GELU_ONLY_MARK) != NULL;
}

bool gemm_own_fits(const GemmDesc *d)
{
    return d->ab_type == GEMM_F16 && d->c_type == GEMM_F16 && d->epilogue == GEMM_EPI_BIAS && d->batch == 1 &&
           !d->trans_a && d->trans_b && d->alpha == 1.0f && d->beta == 0.0f && !d->D && d->N % 256 == 0 &&
           d->K % 64 == 0 && d->K > 0 && d->M > 0 && d->lda == d->K && d->ldb == d->K && d->ldc == d->N;
}

int64_t gemm_own_tiles(GemmOwnStore store, const GemmDesc *d)
{
    return (d->N / (store == GEMM_OWN_PINGPONG ? 128 : 256)) * ((d->M + 127) / 128);
}

bool gemm_own_fills(const GemmOwnKernel *k, const GemmDesc *d, int sm_count)
{
    if (k->min_tiles > 0) return gemm_own_tiles(k->store, d) >= k->min_tiles;
    /* ping-pong: a tile for each multiplying warpgroup */
    return gemm_own_tiles(k->store, d) >= (k->store == GEMM_OWN_PINGPONG ? 2 * sm_count : sm_count);
}

HpcStatus gemm_own_min_tiles(int64_t *min_tiles, HpcError *err)
{
    return num_env_int("HPC_GEMM_OWN_MIN_TILES", 1, 1000000, 0,
                       "the output tiles a product needs for hpc's own GEMM, or unset for one a multiplying "
                       "warpgroup", min_tiles, err);
}

HpcStatus gemm_own_tensor_map(CUtensorMap *map, CUdeviceptr p, int64_t rows, int64_t cols, unsigned box_rows,
                              HpcError *err)
{
    cuuint64_t dim[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, stride[1] = {(cuuint64_t)cols * 2};
    cuuint32_t box[2] = {64, box_rows}, estride[2] = {1, 1};
    return CUDA_CHECK(err, cuda_driver()->cuTensorMapEncodeTiled(
                               map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, (void *)(uintptr_t)p, dim, stride, box,
                               estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

/* The dynamic shared memory of the kernels that store so. */
static unsigned smem_bytes(GemmOwnStore store)
{
    return store == GEMM_OWN_PINGPONG    ? GEMM_OWN_PP_SMEM_BYTES
           : store == GEMM_OWN_TMA_STORE ? GEMM_OWN_TS_SMEM_BYTES
                                         : GEMM_OWN_SMEM_BYTES;
}

const char *gemm_own_kernel_name(GemmOwnStore store, bool gelu)
{
    switch (store) {
    case GEMM_OWN_PINGPONG: return gelu ? GEMM_OWN_PP_GELU_KERNEL : GEMM_OWN_PP_KERNEL;
    case GEMM_OWN_TMA_STORE: return gelu ? GEMM_OWN_TS_GELU_KERNEL : GEMM_OWN_TS_KERNEL;
    default: return gelu ? GEMM_OWN_GELU_KERNEL : GEMM_OWN_KERNEL;
    }
}

HpcStatus gemm_own_kernel(CUmodule mod, const char *name, GemmOwnStore store, GemmOwnKernel *k, HpcError *err)
{
    k->store = store;
    k->min_tiles = 0;
    HpcStatus st = CUDA_CHECK(err, cuda_driver()->cuModuleGetFunction(&k->fn, mod, name));
    if (!st) st = cuda_func_allow_shared(k->fn, smem_bytes(store), err);
    return st;
}

HpcStatus gemm_own_store(GemmOwnStore *store, HpcError *err)
{
    const char *v = getenv("HPC_GEMM_OWN_STORE");
    *store = GEMM_OWN_PINGPONG;
    if (!v || !*v || !strcmp(v, "pingpong")) return HPC_OK;
    if (!strcmp(v, "direct")) *store = GEMM_OWN_DIRECT;
    else if (!strcmp(v, "tma")) *store = GEMM_OWN_TMA_STORE;
    else
        return hpc_fail(err, HPC_ERR_USAGE, "HPC_GEMM_OWN_STORE=%s: expected pingpong (the default: 128 x 128 tiles, "
                        "each stored by the TMA while the other warpgroup multiplies), tma (128 x 256 tiles staged in "
                        "shared memory and stored by the TMA) or direct (stored from registers)", v);
    return HPC_OK;
}

int gemm_own_grid(GemmOwnStore store, const GemmDesc *d, int blocks)
{
    int64_t tiles = gemm_own_tiles(store, d);
    if (blocks < 1) blocks = 1;
    return (int)(tiles < blocks ? tiles : blocks);
}

HpcStatus gemm_own_run(const GemmOwnKernel *kern, const GemmDesc *d, CUdeviceptr gelu, int blocks, CUstream stream,
                       HpcError *err)
{
    CUtensorMap ta, tw, tc, tg;
    const bool staged = kern->store != GEMM_OWN_DIRECT;
    HpcStatus st = gemm_own_tensor_map(&ta, d->A, d->M, d->K, 128, err);
    if (!st) st = gemm_own_tensor_map(&tw, d->B, d->N, d->K, kern->store == GEMM_OWN_PINGPONG ? 128 : 256, err);
    if (!st && staged) st = gemm_own_tensor_map(&tc, d->C, d->M, d->N, 64, err);
    if (!st && staged && gelu) st = gemm_own_tensor_map(&tg, gelu, d->M, d->N, 64, err);
    if (st) return st;
    CUdeviceptr c = d->C, bias = d->bias;
    int m = (int)d->M, n = (int)d->N, k = (int)d->K;
    void *plain[] = {&ta, &tw, &c, &bias, &m, &n, &k}, *with_gelu[] = {&ta, &tw, &c, &gelu, &bias, &m, &n, &k};
    void *ts[] = {&ta, &tw, &tc, &bias, &m, &n, &k}, *ts_gelu[] = {&ta, &tw, &tc, &tg, &bias, &m, &n, &k};
    void **args = staged ? (gelu ? ts_gelu : ts) : (gelu ? with_gelu : plain);
    return cuda_launch(kern->fn, (unsigned[3]){(unsigned)gemm_own_grid(kern->store, d, blocks), 1, 1},
                       (unsigned[3]){384, 1, 1}, smem_bytes(kern->store), stream, args, err);
}

HpcStatus gemm_own_dx_dgelu_run(const GemmOwnKernel *k, const GemmOwnDxDgelu *g, int blocks, CUstream stream,
                                HpcError *err)
{
    const bool pp = k->store == GEMM_OWN_PINGPONG;
    int part_rows = g->part_rows ? g->part_rows : 16;
    if (part_rows != 16 && !(pp && (part_rows == 32 || part_rows == GEMM_OWN_PP_MAX_PART_ROWS)))
        return hpc_fail(err, HPC_ERR_INTERNAL, "gemm_own_dx_dgelu_run: column sums over %d rows (the ping-pong kernel "
                        "sums 16, 32 or 64, the other 16)", part_rows);
    CUtensorMap tdy, tw, tu, tdu, ty;
    HpcStatus st = gemm_own_tensor_map(&tdy, g->dy, g->M, g->K, 128, err);
    if (!st) st = gemm_own_tensor_map(&tw, g->w, g->K, g->N, 64, err);
    if (!st && pp) st = gemm_own_tensor_map(&tu, g->u, g->M, g->N, 64, err);
    if (!st && pp) st = gemm_own_tensor_map(&tdu, g->du, g->M, g->N, 64, err);
    if (!st && pp) st = gemm_own_tensor_map(&ty, g->y ? g->y : g->du, g->M, g->N, 64, err);
    if (st) return st;
    GemmDesc shape = {.M = g->M, .N = g->N, .K = g->K};
    CUdeviceptr du = g->du, u = g->u, y = g->y, part = g->part;
    int m = (int)g->M, n = (int)g->N, kk = (int)g->K, with_y = g->y != 0;
    void *direct[] = {&tdy, &tw, &du, &u, &y, &part, &m, &n, &kk};
    void *pingpong[] = {&tdy, &tw, &tu, &tdu, &ty, &with_y, &part, &part_rows, &m, &n, &kk};
    return cuda_launch(k->fn, (unsigned[3]){(unsigned)gemm_own_grid(k->store, &shape, blocks), 1, 1},
                       (unsigned[3]){384, 1, 1}, smem_bytes(k->store), stream, pp ? pingpong : direct, err);
}

/* runtime/data/loader.c — see loader.h. */
#include "data/loader.h"

#include <stdlib.h>
#include <string.h>

#include "cpu/philox.h"
#include "dist/shard.h"

/* Philox salts, so the shuffle and the bucket order draw independent streams. */
#define SALT_SHUFFLE 0x53485546u /* "SHUF" */
#define SALT_BUCKET 0x4255434bu  /* "BUCK" */

/* A uniform integer in [0, bound) from (seed, epoch, salt, i).  The modulo
 * bias is below 2^-40 for any dataset under 2^24 rows. */
static uint64_t loader_draw(uint64_t seed, int64_t epoch, uint32_t salt, uint64_t i, uint64_t bound)
{
    Philox4x32 c = {{(uint32_t)i, (uint32_t)(i >> 32), (uint32_t)epoch, salt}};
    PhiloxKey k = {{(uint32_t)seed, (uint32_t)(seed >> 32)}};
    Philox4x32 r = philox4x32_10(c, k);
    uint64_t v = ((uint64_t)r.x[1] << 32) | r.x[0];
    return v % bound;
}

/* Fisher–Yates over a[0..n). */
static void loader_permute(int64_t *a, int64_t n, uint64_t seed, int64_t epoch, uint32_t salt)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)loader_draw(seed, epoch, salt, (uint64_t)i, (uint64_t)i + 1);
        int64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* Sorting key for bucketing: (length, position in the window), so qsort is stable. */
typedef struct { int32_t len; int64_t pos, row; } BucketKey;

static int bucket_cmp(const void *pa, const void *pb)
{
    const BucketKey *a = pa, *b = pb;
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    return (a->pos > b->pos) - (a->pos < b->pos);
}

/* Sorts one window order[0..n) by length, then (with shuffle) permutes its
 * full batches; a partial batch stays last so every batch is contiguous. */
static bool loader_bucket_window(Loader *ld, int64_t *order, int64_t n, int64_t window_id)
{
    BucketKey *k = malloc((size_t)n * sizeof *k);
    int64_t nb = n / ld->batch_size;
    int64_t *perm = malloc((size_t)(nb ? nb : 1) * sizeof *perm);
    if (!k || !perm) {
        free(k);
        free(perm);
        return false;
    }
    for (int64_t i = 0; i < n; i++) k[i] = (BucketKey){ld->data->ex[order[i]].len, i, order[i]};
    qsort(k, (size_t)n, sizeof *k, bucket_cmp);
    for (int64_t b = 0; b < nb; b++) perm[b] = b;
    if (ld->shuffle)
        loader_permute(perm, nb, ld->seed, ld->epoch, SALT_BUCKET ^ (uint32_t)window_id);
    int64_t bs = ld->batch_size;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t r = 0; r < bs; r++) order[b * bs + r] = k[perm[b] * bs + r].row;
    for (int64_t i = nb * bs; i < n; i++) order[i] = k[i].row;
    free(k);
    free(perm);
    return true;
}

/* Builds ld->order for ld->epoch. */
static bool loader_build_order(Loader *ld)
{
    int64_t n = ld->data->n;
    for (int64_t i = 0; i < n; i++) ld->order[i] = i;
    if (ld->shuffle) loader_permute(ld->order, n, ld->seed, ld->epoch, SALT_SHUFFLE);
    if (ld->bucket) {
        int64_t w = LOADER_BUCKET_WINDOW * ld->batch_size;
        for (int64_t s = 0; s < n; s += w)
            if (!loader_bucket_window(ld, ld->order + s, n - s < w ? n - s : w, s / w)) return false;
    }
    ld->order_epoch = ld->epoch;
    return true;
}

HpcStatus loader_init(Loader *ld, const Dataset *d, int64_t batch_size, int64_t max_len,
                      uint64_t seed, bool shuffle, bool bucket, HpcError *err)
{
    memset(ld, 0, sizeof *ld);
    if (batch_size < 1 || max_len < 1)
        return hpc_fail(err, HPC_ERR_USAGE, "loader_init(%s): batch size (%lld) and max length (%lld) must be >= 1",
                        d->name, (long long)batch_size, (long long)max_len);
    if (d->n < 1)
        return hpc_fail(err, HPC_ERR_INPUT, "loader_init(%s): the dataset has no rows", d->name);
    for (int64_t i = 0; i < d->n; i++)
        if (d->ex[i].len > max_len)
            return hpc_fail(err, HPC_ERR_INPUT,
                            "loader_init(%s): row %lld has %d tokens, more than max length %lld; "
                            "tokenize with the same max length",
                            d->name, (long long)i, (int)d->ex[i].len, (long long)max_len);
    ld->order = malloc((size_t)d->n * sizeof *ld->order);
    if (!ld->order)
        return hpc_fail(err, HPC_ERR_OOM, "loader_init(%s): out of host memory for %lld rows",
                        d->name, (long long)d->n);
    ld->data = d;
    ld->batch_size = batch_size;
    ld->max_len = max_len;
    ld->seed = seed;
    ld->shuffle = shuffle;
    ld->bucket = bucket;
    ld->order_epoch = -1;
    ld->world = 1;
    return HPC_OK;
}

/* The padding rule: the longest row m (>= 1) rounded up to 8, capped at max_len. */
static int64_t padded_len(int64_t m, int64_t max_len)
{
    m = (m + 7) / 8 * 8;
    return m < max_len ? m : max_len;
}

/* L for rows order[from..from+B). */
static int64_t loader_padded_len(const Loader *ld, int64_t from, int64_t B)
{
    int64_t m = 1;
    for (int64_t b = 0; b < B; b++) {
        int64_t len = ld->data->ex[ld->order[from + b]].len;
        if (len > m) m = len;
    }
    return padded_len(m, ld->max_len);
}

int64_t loader_longest_batch_len(const Dataset *const *sets, int n, int64_t max_len)
{
    int64_t m = 1;
    for (int s = 0; s < n; s++)
        for (int64_t i = 0; sets[s] && i < sets[s]->n; i++)
            if (sets[s]->ex[i].len > m) m = sets[s]->ex[i].len;
    return padded_len(m, max_len);
}

static void loader_fill_row(const Loader *ld, Batch *bt, int64_t b, int64_t row)
{
    const Example *ex = &ld->data->ex[row];
    int32_t *ids = bt->input_ids + b * bt->L;
    int32_t *types = bt->token_type_ids + b * bt->L;
    int32_t *mask = bt->attention_mask + b * bt->L;
    for (int64_t t = 0; t < bt->L; t++) {
        bool real = t < ex->len;
        ids[t] = real ? ex->ids[t] : ld->pad_id;
        types[t] = real ? ex->type_ids[t] : 0;
        mask[t] = real;
    }
    bt->labels[b] = ex->label;
    if (bt->targets) bt->targets[b] = ex->target;
    bt->example_index[b] = row;
}

/* Round up to LOADER_PACK_ROUND; at least 1. */
static int64_t pack_len(int64_t total, int64_t B)
{
    int64_t L = (total + B - 1) / B;
    L = (L + LOADER_PACK_ROUND - 1) / LOADER_PACK_ROUND * LOADER_PACK_ROUND;
    return L > 0 ? L : 1;
}

void loader_set_pack(Loader *ld, bool pack)
{
    ld->pack = pack;
}

int64_t loader_packed_max_slots(const Loader *ld, int64_t epochs)
{
    Loader w = *ld;   /* its own order buffer, so ld is untouched */
    w.order = malloc((size_t)ld->data->n * sizeof *w.order);
    if (!w.order) return 0;
    int64_t best = 0, n = ld->data->n;
    for (int64_t e = 0; e < (epochs > 0 ? epochs : 1); e++) {
        w.epoch = e;
        if (!loader_build_order(&w)) {
            best = 0;
            break;
        }
        for (int64_t at = 0; at < n; at += w.batch_size) {
            int64_t B = n - at < w.batch_size ? n - at : w.batch_size, total = 0;
            for (int64_t b = 0; b < B; b++) total += w.data->ex[w.order[at + b]].len;
            if (B * pack_len(total, B) > best) best = B * pack_len(total, B);
        }
        if (!w.shuffle) break;   /* every epoch the same */
    }
    free(w.order);
    return best;
}

/* A packed batch of rows order[from..from+B): tokens back to back. */
static Batch *loader_pack_rows(const Loader *ld, int64_t from, int64_t B)
{
    int64_t total = 0;
    for (int64_t b = 0; b < B; b++) total += ld->data->ex[ld->order[from + b]].len;
    Batch *bt = batch_new_packed(B, pack_len(total, B), ld->data->regression);
    if (!bt) return NULL;
    int64_t slots = bt->B * bt->L, at = 0;
    for (int64_t i = 0; i < slots; i++) {
        bt->input_ids[i] = ld->pad_id;
        bt->labels[i] = -100;   /* token labels: tail slots are not scored */
    }
    for (int64_t b = 0; b < B; b++) {
        int64_t row = ld->order[from + b];
        const Example *ex = &ld->data->ex[row];
        bt->seq_spans[2 * b] = (int32_t)at;
        bt->seq_spans[2 * b + 1] = ex->len;
        for (int32_t t = 0; t < ex->len; t++, at++) {
            bt->input_ids[at] = ex->ids[t];
            bt->token_type_ids[at] = ex->type_ids[t];
            bt->attention_mask[at] = 1;
        }
        bt->example_index[b] = row;
        if (bt->targets) bt->targets[b] = ex->target;
    }
    /* sequence labels after the token slots' -100: labels[b] is row b's class */
    for (int64_t b = 0; b < B; b++) bt->labels[b] = ld->data->ex[ld->order[from + b]].label;
    return bt;
}

Batch *loader_next(Loader *ld)
{
    int64_t n = ld->data->n;
    if (ld->cursor >= n) {
        ld->epoch++;
        ld->cursor = 0;
        return NULL;
    }
    if (ld->order_epoch != ld->epoch && !loader_build_order(ld)) return NULL;
    int64_t B = n - ld->cursor < ld->batch_size ? n - ld->cursor : ld->batch_size;
    int64_t first = 0, mine = B;   /* this rank's rows of the global batch */
    HpcError ignore = {0};         /* cannot fail: loader_set_shard checked the sizes */
    if (ld->world > 1 && dist_rank_rows(B, ld->rank, ld->world, &first, &mine, &ignore)) return NULL;
    if (ld->pack) {
        Batch *pk = loader_pack_rows(ld, ld->cursor + first, mine);
        if (pk) ld->cursor += B;
        return pk;
    }
    Batch *bt = batch_new(mine, loader_padded_len(ld, ld->cursor, B), ld->data->regression);
    if (!bt) return NULL;
    for (int64_t b = 0; b < mine; b++) loader_fill_row(ld, bt, b, ld->order[ld->cursor + first + b]);
    ld->cursor += B;
    return bt;
}

HpcStatus loader_seek(Loader *ld, int64_t epoch, int64_t cursor, HpcError *err)
{
    if (epoch < 0 || cursor < 0 || cursor > ld->data->n)
        return hpc_fail(err, HPC_ERR_USAGE,
                        "the checkpoint's data position (epoch %lld, row %lld) is past the end of %s, which has "
                        "%lld rows; resume with the same --task and --data files the checkpoint was trained on",
                        (long long)epoch, (long long)cursor, ld->data->name, (long long)ld->data->n);
    ld->epoch = epoch;
    ld->cursor = cursor;
    return HPC_OK;
}

HpcStatus loader_set_shard(Loader *ld, int rank, int world, HpcError *err)
{
    int64_t tail = ld->data->n % ld->batch_size;
    if (world < 1 || rank < 0 || rank >= world)
        return hpc_fail(err, HPC_ERR_USAGE, "loader_set_shard(%s): rank %d of a world of %d", ld->data->name, rank,
                        world);
    if (ld->batch_size % world || tail % world)
        return hpc_fail(err, HPC_ERR_USAGE,
                        "%s: the global batch (%lld rows) and the epoch's last batch (%lld of %lld rows) must "
                        "divide by the %d ranks; choose a batch size and data size that do",
                        ld->data->name, (long long)ld->batch_size, (long long)tail, (long long)ld->data->n, world);
    ld->rank = rank;
    ld->world = world;
    return HPC_OK;
}

int64_t loader_batches_per_epoch(const Loader *ld)
{
    return (ld->data->n + ld->batch_size - 1) / ld->batch_size;
}

void loader_free(Loader *ld)
{
    free(ld->order);
    ld->order = NULL;
}

/* runtime/data/loader.h — batches from a Dataset: seeded shuffle, dynamic padding,
 * optional length bucketing, attention masks, and a resumable position.
 *
 * Epoch order: with shuffle, the row order of epoch e is a Fisher–Yates
 * permutation drawn from Philox keyed by (seed, e), so it depends only on the
 * seed and the epoch number, never on what happened before; a restarted run
 * that calls loader_seek(ld, e, c) sees exactly the batches it would have
 * seen.  Without shuffle the order is the file order.
 *
 * Bucketing (bucket = true): the epoch's permutation is cut into windows of
 * LOADER_BUCKET_WINDOW batches; each window is sorted by length (stable) and
 * its batches are then visited in a seeded random order.  Batches hold rows of
 * similar length (less padding) while every row is still seen once per epoch.
 *
 * Padding: a batch's L is its longest row rounded up to a multiple of 8 and
 * capped at max_len.  Positions past a row's length hold pad_id (0, [PAD] in
 * BERT vocabularies), type id 0 and attention mask 0.  loader_init rejects a
 * dataset with a row longer than max_len (tokenize with the same max_len).
 *
 * The last batch of an epoch may be smaller than batch_size (B = rows left).
 * labels[b] holds the class id of row b (labels is allocated (B, L) by
 * batch_new; only the first B entries are used for sequence tasks); for a
 * regression dataset targets[b] holds the target and labels[b] = -1.
 *
 * Packing (loader_set_pack; docs/packing.md): a batch of B rows is one
 * packed Batch (batch.h): the rows' tokens back to back in file/visit order,
 * row b at flat slots [start_b, start_b + len_b), seq_spans filled, and L =
 * ceil(total tokens / B) rounded up to LOADER_PACK_ROUND, so a step's slots
 * follow the real tokens instead of B x the longest row.  The tail slots
 * after the last row are padding.  Order, bucketing, resume and shards are
 * as without packing.
 *
 * Data-parallel shards (loader_set_shard): every rank walks the same
 * permutation and the same global batches (batch_size rows, the position
 * ld->cursor counts global rows), and loader_next returns rank r's equal,
 * consecutive part of each (runtime/dist/shard.h), padded to the global
 * batch's L, so the ranks together compute what one process would.  The
 * epoch's last, short batch must also divide by the world.
 *
 * Ownership: the Loader borrows the Dataset (which must outlive it) and owns
 * `order`.  Each Batch returned by loader_next is the caller's: batch_free it.
 *
 * Usage:
 *   Loader ld;
 *   if (loader_init(&ld, &train, 32, 128, seed, true, false, &err)) return err.code;
 *   for (int e = 0; e < epochs; e++)
 *       for (Batch *b; (b = loader_next(&ld)); batch_free(b)) train_step(b);
 *   loader_free(&ld);
 */
#ifndef HPC_RUNTIME_LOADER_H
#define HPC_RUNTIME_LOADER_H

#include <stdbool.h>
#include <stdint.h>

#include "data/batch.h"
#include "data/dataset.h"
#include "util/error.h"

/* Batches per bucketing window (see above). */
#define LOADER_BUCKET_WINDOW 50

/* A packed batch's L is a multiple of this.  The slots past the tokens
 * cost as much as real ones, and at 1 the tail is under B slots; the
 * kernels need no alignment of L (a GEMM sees B x L rows). */
#define LOADER_PACK_ROUND 1

typedef struct {
    const Dataset *data;  /* borrowed */
    int64_t batch_size, max_len;
    uint64_t seed;
    bool shuffle, bucket;
    int32_t pad_id;       /* 0 unless set after loader_init */
    int64_t epoch;        /* epoch being read, from 0 */
    int64_t cursor;       /* rows of this epoch already returned (position in order) */
    int64_t *order;       /* (n) row indices of this epoch, in visiting order */
    int64_t order_epoch;  /* epoch `order` was built for; -1 = not built */
    int rank, world;      /* shard of each global batch this loader returns (0, 1: all) */
    bool pack;            /* packed batches (loader_set_pack) */
} Loader;

/* Checks arguments (batch_size >= 1, max_len >= 1, no row longer than max_len,
 * a non-empty dataset) and positions the loader at epoch 0, cursor 0. */
HpcStatus loader_init(Loader *ld, const Dataset *d, int64_t batch_size, int64_t max_len,
                      uint64_t seed, bool shuffle, bool bucket, HpcError *err);

/* The next batch, or NULL at the end of an epoch; the call after a NULL
 * starts epoch + 1 with a fresh seeded order.  Also NULL on OOM (then
 * ld->cursor is unchanged; the caller reports out of memory). */
Batch *loader_next(Loader *ld);

/* Moves to (epoch, cursor), e.g. from a checkpoint.  cursor must be in
 * [0, n] and should be a value ld->cursor held after a loader_next call.
 * Returns HPC_ERR_USAGE for a cursor out of range or a negative epoch. */
HpcStatus loader_seek(Loader *ld, int64_t epoch, int64_t cursor, HpcError *err);

/* Returns rank's part of every global batch from now on (see above).
 * HPC_ERR_USAGE when batch_size or the epoch's last batch does not divide
 * by world. */
HpcStatus loader_set_shard(Loader *ld, int rank, int world, HpcError *err);

/* Packed batches from now on (see above) when pack is true. */
void loader_set_pack(Loader *ld, bool pack);

/* Packed batches: the most token slots (B x L) of any batch this loader's
 * settings (data, batch size, seed, shuffle, bucket; no shard) make in
 * epochs 0 .. epochs - 1: the orders are functions of (seed, epoch), so
 * this is exactly what a run of that many epochs will see, however it is
 * resumed.  The trainer sizes a packed run for batch_size x
 * ceil(that / batch_size) (and the eval sets' one epoch): every value of a
 * packed graph grows with the slots, none with L alone (the fused
 * attention keeps no L x L value).  0 on OOM. */
int64_t loader_packed_max_slots(const Loader *ld, int64_t epochs);

/* The longest L any batch of these datasets can have, by the padding rule
 * above: the longest row over sets[0..n) (NULL entries skipped) rounded up
 * to a multiple of 8 and capped at max_len (without rows: as a one-token row).
 * The trainer sizes the backend (memory plan, arena, memory check) by it
 * rather than by max_len. */
int64_t loader_longest_batch_len(const Dataset *const *sets, int n, int64_t max_len);

/* Batches in one epoch: ceil(n / batch_size). */
int64_t loader_batches_per_epoch(const Loader *ld);

void loader_free(Loader *ld);

#endif

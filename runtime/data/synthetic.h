/* runtime/data/synthetic.h — synthetic sequence-classification tasks.
 *
 * Small tasks with a known answer, for training tests and `hpc run` before
 * real data is at hand.  Each row is [CLS] t_1 .. t_n [SEP] with ids
 * [CLS] = 1, [SEP] = 2, pad = 0 and content tokens drawn from
 * [SYN_FIRST_TOKEN, min(vocab, SYN_MAX_VOCAB)); n is uniform in
 * [max(2, max_len / 4), max_len - 2], so batches are padded and the
 * attention mask matters.  Labels are balanced (half the rows of each class,
 * in random order):
 *   SYN_CONTAINS  label 1 iff token SYN_NEEDLE (5) occurs in the sequence;
 *   SYN_SORTED    label 1 iff t_1 <= t_2 <= ... <= t_n.
 * Rows are a pure function of (task, seed, row index): the same seed gives
 * the same dataset.  With regression = true the dataset is marked as a
 * regression set and target = the label as a float.
 */
#ifndef HPC_RUNTIME_SYNTHETIC_H
#define HPC_RUNTIME_SYNTHETIC_H

#include <stdbool.h>
#include <stdint.h>

#include "data/dataset.h"
#include "util/error.h"

#define SYN_CLS 1
#define SYN_SEP 2
#define SYN_FIRST_TOKEN 4
#define SYN_NEEDLE 5
#define SYN_MAX_VOCAB 64

typedef enum { SYN_CONTAINS, SYN_SORTED } SynTask;

/* "contains" or "sorted" (also accepted with the "synthetic-" prefix);
 * HPC_ERR_USAGE listing the names for anything else. */
HpcStatus synthetic_parse(const char *name, SynTask *task, HpcError *err);
const char *synthetic_name(SynTask task);

/* Fills an initialised, empty Dataset with n rows (see above).  vocab must
 * be >= SYN_FIRST_TOKEN + 4 and max_len >= 6 (HPC_ERR_USAGE otherwise). */
HpcStatus synthetic_make(SynTask task, Dataset *d, int64_t n, int64_t vocab, int64_t max_len,
                         uint64_t seed, bool regression, HpcError *err);

#endif

/* runtime/data/synthetic.c — see synthetic.h. */
#include "data/synthetic.h"

#include <stdbool.h>
#include <string.h>

#include "cpu/philox.h"

/* Philox salts: one stream per use, so rows do not correlate. */
enum { SALT_LEN = 0x5e1, SALT_TOK, SALT_LABEL, SALT_POS };

typedef struct {
    uint64_t seed, row;
    uint32_t draws;
} SynRng;

static int64_t syn_int(SynRng *r, uint32_t salt, int64_t lo, int64_t hi) /* [lo, hi) */
{
    float u = philox_uniform(r->seed, r->row * 4096 + r->draws++, 0, salt);
    int64_t v = lo + (int64_t)(u * (float)(hi - lo));
    return v < hi ? v : hi - 1;
}

HpcStatus synthetic_parse(const char *name, SynTask *task, HpcError *err)
{
    if (strncmp(name, "synthetic-", 10) == 0) name += 10;
    if (strcmp(name, "contains") == 0) *task = SYN_CONTAINS;
    else if (strcmp(name, "sorted") == 0) *task = SYN_SORTED;
    else
        return hpc_fail(err, HPC_ERR_USAGE, "unknown synthetic task '%s' (choose synthetic-contains "
                        "or synthetic-sorted)", name);
    return HPC_OK;
}

const char *synthetic_name(SynTask task) { return task == SYN_SORTED ? "sorted" : "contains"; }

/* Content tokens for a row of class `label`. */
static void fill_contains(SynRng *r, int32_t *t, int64_t n, int64_t top, int label)
{
    for (int64_t i = 0; i < n; i++) {
        t[i] = (int32_t)syn_int(r, SALT_TOK, SYN_FIRST_TOKEN, top - 1);
        if (t[i] >= SYN_NEEDLE) t[i]++; /* skip the needle */
    }
    if (label) t[syn_int(r, SALT_POS, 0, n)] = SYN_NEEDLE;
}

static void sort_ids(int32_t *t, int64_t n)
{
    for (int64_t i = 1; i < n; i++)
        for (int64_t j = i; j > 0 && t[j - 1] > t[j]; j--) {
            int32_t s = t[j];
            t[j] = t[j - 1];
            t[j - 1] = s;
        }
}

static bool is_sorted(const int32_t *t, int64_t n)
{
    for (int64_t i = 1; i < n; i++)
        if (t[i - 1] > t[i]) return false;
    return true;
}

/* Sorted rows are sorted random draws; unsorted rows are random draws with
 * at least one descent (a sorted draw is reversed, a constant one bumped). */
static void fill_sorted(SynRng *r, int32_t *t, int64_t n, int64_t top, int label)
{
    for (int64_t i = 0; i < n; i++) t[i] = (int32_t)syn_int(r, SALT_TOK, SYN_FIRST_TOKEN, top);
    if (label) {
        sort_ids(t, n);
        return;
    }
    if (!is_sorted(t, n)) return;
    if (t[0] == t[n - 1]) {
        if (t[0] + 1 < top) t[0]++;
        else t[n - 1]--;
        return;
    }
    for (int64_t i = 0; i < n / 2; i++) {
        int32_t s = t[i];
        t[i] = t[n - 1 - i];
        t[n - 1 - i] = s;
    }
}

HpcStatus synthetic_make(SynTask task, Dataset *d, int64_t n, int64_t vocab, int64_t max_len,
                         uint64_t seed, bool regression, HpcError *err)
{
    if (vocab < SYN_FIRST_TOKEN + 4 || max_len < 6)
        return hpc_fail(err, HPC_ERR_USAGE, "synthetic %s: needs vocab >= %d and max_len >= 6 "
                        "(got %lld, %lld)", synthetic_name(task), SYN_FIRST_TOKEN + 4,
                        (long long)vocab, (long long)max_len);
    int64_t top = vocab < SYN_MAX_VOCAB ? vocab : SYN_MAX_VOCAB;
    int64_t lo = max_len / 4 > 2 ? max_len / 4 : 2;
    int32_t ids[4096];
    if (max_len > 4096) max_len = 4096;
    d->num_labels = regression ? 1 : 2;
    d->regression = regression;
    for (int64_t row = 0; row < n; row++) {
        SynRng r = {seed, (uint64_t)row, 0};
        int label = (int)syn_int(&r, SALT_LABEL, 0, 2);
        int64_t len = syn_int(&r, SALT_LEN, lo, max_len - 1);
        ids[0] = SYN_CLS;
        if (task == SYN_CONTAINS) fill_contains(&r, ids + 1, len, top, label);
        else fill_sorted(&r, ids + 1, len, top, label);
        ids[len + 1] = SYN_SEP;
        HpcStatus st = dataset_add(d, ids, NULL, (int32_t)(len + 2), regression ? -1 : label,
                                   (float)label, err);
        if (st) return st;
    }
    return HPC_OK;
}

/* runtime/data/dataset.c — see dataset.h. */
#include "data/dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dataset_init(Dataset *d, const char *name)
{
    memset(d, 0, sizeof *d);
    d->num_labels = 2;
    snprintf(d->name, sizeof d->name, "%s", name ? name : "");
}

static bool dataset_grow(Dataset *d)
{
    if (d->n < d->cap) return true;
    int64_t cap = d->cap ? d->cap * 2 : 256;
    Example *ex = realloc(d->ex, (size_t)cap * sizeof *ex);
    if (!ex) return false;
    d->ex = ex;
    d->cap = cap;
    return true;
}

HpcStatus dataset_add(Dataset *d, const int32_t *ids, const int32_t *type_ids, int32_t len,
                      int32_t label, float target, HpcError *err)
{
    if (len < 1 || !ids)
        return hpc_fail(err, HPC_ERR_USAGE, "dataset_add(%s): a row needs at least one token (got %d)",
                        d->name, (int)len);
    int32_t *a = malloc((size_t)len * sizeof *a);
    int32_t *t = calloc((size_t)len, sizeof *t);
    if (!a || !t || !dataset_grow(d)) {
        free(a);
        free(t);
        return hpc_fail(err, HPC_ERR_OOM, "dataset_add(%s): out of host memory at row %lld",
                        d->name, (long long)d->n);
    }
    memcpy(a, ids, (size_t)len * sizeof *a);
    if (type_ids) memcpy(t, type_ids, (size_t)len * sizeof *t);
    d->ex[d->n++] = (Example){.ids = a, .type_ids = t, .len = len, .label = label, .target = target};
    return HPC_OK;
}

int32_t dataset_max_len(const Dataset *d)
{
    int32_t m = 0;
    for (int64_t i = 0; i < d->n; i++)
        if (d->ex[i].len > m) m = d->ex[i].len;
    return m;
}

int64_t dataset_total_tokens(const Dataset *d)
{
    int64_t s = 0;
    for (int64_t i = 0; i < d->n; i++) s += d->ex[i].len;
    return s;
}

void dataset_free(Dataset *d)
{
    for (int64_t i = 0; i < d->n; i++) {
        free(d->ex[i].ids);
        free(d->ex[i].type_ids);
    }
    free(d->ex);
    d->ex = NULL;
    d->n = d->cap = 0;
}

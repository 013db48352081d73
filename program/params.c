/* program/params.c — see params.h. */
#include "program/params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

void params_init(ParamList *pl) { memset(pl, 0, sizeof *pl); }

void params_free(ParamList *pl)
{
    free(pl->p);
    params_init(pl);
}

static ParamInfo *params_push(ParamList *pl, const char *name)
{
    if (pl->n == pl->cap) {
        pl->cap = pl->cap ? 2 * pl->cap : 64;
        pl->p = xrealloc(pl->p, (size_t)pl->cap * sizeof *pl->p);
    }
    ParamInfo *p = &pl->p[pl->n++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->tied_to = -1;
    return p;
}

int params_add(ParamList *pl, const char *name, int rank, const int64_t *dims, ParamInit init,
               bool decay, bool frozen)
{
    HPC_ASSERT(rank == 1 || rank == 2);
    ParamInfo *p = params_push(pl, name);
    p->rank = rank;
    memcpy(p->dims, dims, (size_t)rank * sizeof *dims);
    p->init = init;
    p->decay = decay;
    p->frozen = frozen;
    return pl->n - 1;
}

int params_add_tied(ParamList *pl, const char *name, int to)
{
    HPC_ASSERT(to >= 0 && to < pl->n && pl->p[to].tied_to < 0);
    ParamInfo src = pl->p[to];
    ParamInfo *p = params_push(pl, name);
    p->rank = src.rank;
    memcpy(p->dims, src.dims, sizeof p->dims);
    p->init = src.init;
    p->decay = src.decay;
    p->frozen = src.frozen;
    p->tied_to = to;
    return pl->n - 1;
}

int params_find(const ParamList *pl, const char *name)
{
    for (int i = 0; i < pl->n; i++)
        if (strcmp(pl->p[i].name, name) == 0) return i;
    return -1;
}

int64_t params_numel(const ParamInfo *p)
{
    int64_t n = 1;
    for (int i = 0; i < p->rank; i++) n *= p->dims[i];
    return n;
}

int64_t params_total(const ParamList *pl)
{
    int64_t n = 0;
    for (int i = 0; i < pl->n; i++)
        if (pl->p[i].tied_to < 0) n += params_numel(&pl->p[i]);
    return n;
}

/* program/param_pack.c — see param_pack.h. */
#include "program/param_pack.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static const char *const qkv_role[3] = {"query", "key", "value"};

/* Splits NAME = PREFIX ".attention.self." ROLE "." LEAF; returns the role
 * (0..2) and sets *prefix_len and *leaf, or -1. */
static int qkv_role_of(const char *name, size_t *prefix_len, const char **leaf)
{
    const char *mid = strstr(name, ".attention.self.");
    if (!mid) return -1;
    const char *r = mid + strlen(".attention.self.");
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(qkv_role[i]);
        if (strncmp(r, qkv_role[i], n) == 0 && r[n] == '.' && strchr(r + n + 1, '.') == NULL) {
            *prefix_len = (size_t)(mid - name);
            *leaf = r + n + 1;
            return i;
        }
    }
    return -1;
}

bool param_pack_qkv_group(const ParamList *pl, int q, int members[3])
{
    HPC_ASSERT(q >= 0 && q < pl->n);
    size_t plen;
    const char *leaf;
    if (qkv_role_of(pl->p[q].name, &plen, &leaf) < 0) return false;
    if (strcmp(leaf, "weight") != 0 && strcmp(leaf, "bias") != 0) return false;
    const ParamInfo *ref = &pl->p[q];
    for (int i = 0; i < 3; i++) {
        char name[PARAM_NAME_MAX];
        int w = snprintf(name, sizeof name, "%.*s.attention.self.%s.%s", (int)plen, ref->name, qkv_role[i], leaf);
        if (w < 0 || (size_t)w >= sizeof name) return false;
        int m = params_find(pl, name);
        if (m < 0) return false;
        const ParamInfo *p = &pl->p[m];
        if (p->tied_to >= 0 || p->rank != ref->rank || p->frozen != ref->frozen) return false;
        for (int d = 0; d < p->rank; d++)
            if (p->dims[d] != ref->dims[d]) return false;
        members[i] = m;
    }
    return ref->tied_to < 0;
}

bool param_pack_adjacent_everywhere(int64_t numel)
{
    return numel > 0 && (numel * 2) % PARAM_PACK_ALIGN == 0;   /* then 4-byte sizes are multiples too */
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }

/* The item holding parameter q with tag `tag` and room, or -1. */
static int item_of(int n, const int *item_param, const int *item_tag, const size_t *bytes, int q, int tag)
{
    for (int j = 0; j < n; j++)
        if (item_param[j] == q && bytes[j] > 0 && (!item_tag || item_tag[j] == tag)) return j;
    return -1;
}

size_t param_pack_offsets(const ParamList *pl, int n, const int *item_param, const int *item_tag,
                          const size_t *bytes, size_t align, size_t *offset)
{
    HPC_ASSERT(align > 0 && (align & (align - 1)) == 0);
    bool *placed = xcalloc((size_t)(n > 0 ? n : 1), sizeof *placed);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (bytes[i] == 0) offset[i] = 0;
        if (placed[i] || bytes[i] == 0) continue;
        int members[3], item[3] = {-1, -1, -1};
        bool group = item_param[i] >= 0 && param_pack_qkv_group(pl, item_param[i], members);
        for (int k = 0; k < 3 && group; k++) {
            item[k] = item_of(n, item_param, item_tag, bytes, members[k], item_tag ? item_tag[i] : 0);
            /* exact adjacency only: no padding between members, none placed before */
            group = item[k] >= 0 && !placed[item[k]] && bytes[item[k]] % align == 0;
        }
        if (!group) {
            offset[i] = off;
            off += align_up(bytes[i], align);
            placed[i] = true;
            continue;
        }
        for (int k = 0; k < 3; k++) {   /* query, key, value back to back */
            offset[item[k]] = off;
            off += bytes[item[k]];
            placed[item[k]] = true;
        }
    }
    free(placed);
    return off;
}

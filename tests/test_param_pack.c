/* tests/test_param_pack.c — the packed parameter layout (program/param_pack.h).
 *
 * BERT-base fp16, laid out as runtime/cuda/cuda_exec.c alloc_params does
 * (masters: one item per parameter; 16-bit copies: one item per PARAM node
 * that owns a copy): every layer's query, key and value weights back to
 * back, and its three biases; no two tensors overlap; every offset a
 * multiple of 256; the buffer no larger than packing one by one; every
 * other tensor in parameter-table order.  The parameter table itself keeps
 * Hugging Face's order (query.weight, query.bias, key.weight, ...), so names,
 * checkpoints and import/export do not see the layout.  Values written at
 * their offsets into a host buffer read back unchanged, and the three
 * weights read as one (3H, H) matrix.  At H = 16 the biases are not a
 * multiple of 256 bytes and form no group (the weights still do); items
 * that are no parameter pack one by one in listed order (the old layout). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/spec_load.h"
#include "cpu/philox.h"
#include "pipeline.h"
#include "program/ir.h"
#include "program/param_pack.h"
#include "program/params.h"
#include "program/spec.h"

enum { ALIGN = 256 };

static size_t up(size_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

typedef struct {
    int n;
    int *param, *tag;
    size_t *bytes, *off, total;
} Layout;

static void layout_free(Layout *l)
{
    free(l->param);
    free(l->tag);
    free(l->bytes);
    free(l->off);
}

static void layout_alloc(Layout *l, int n)
{
    l->n = n;
    l->param = calloc((size_t)n, sizeof *l->param);
    l->tag = calloc((size_t)n, sizeof *l->tag);
    l->bytes = calloc((size_t)n, sizeof *l->bytes);
    l->off = calloc((size_t)n, sizeof *l->off);
}

/* The masters: parameter-table order, 4 bytes an element. */
static void masters(const ParamList *pl, Layout *l)
{
    layout_alloc(l, pl->n);
    for (int q = 0; q < pl->n; q++) {
        l->param[q] = q;
        l->bytes[q] = pl->p[q].tied_to >= 0 ? 0 : (size_t)params_numel(&pl->p[q]) * 4;
    }
    l->total = param_pack_offsets(pl, l->n, l->param, NULL, l->bytes, ALIGN, l->off);
}

/* The 16-bit copies: PARAM node order, one copy per (parameter, dtype). */
static void low_copies(const IrGraph *g, const ParamList *pl, Layout *l)
{
    layout_alloc(l, g->n);
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = &g->nodes[i];
        l->param[i] = n->op == IR_OP_PARAM ? n->attr.param.index : -1;
        l->tag[i] = (int)n->dtype;
        if (n->op != IR_OP_PARAM || n->dtype == DT_F32) continue;
        bool first = true;
        for (int j = 0; j < i && first; j++)
            first = !(l->param[j] == l->param[i] && l->tag[j] == l->tag[i]);
        if (first) l->bytes[i] = (size_t)params_numel(&pl->p[n->attr.param.index]) * 2;
    }
    l->total = param_pack_offsets(pl, l->n, l->param, l->tag, l->bytes, ALIGN, l->off);
}

/* The item of parameter NAME in l (-1 if none has room). */
static int item(const ParamList *pl, const Layout *l, const char *name)
{
    int q = params_find(pl, name);
    cr_assert_geq(q, 0, "%s not in the table", name);
    for (int i = 0; i < l->n; i++)
        if (l->param[i] == q && l->bytes[i] > 0) return i;
    return -1;
}

/* Disjoint, aligned, no larger than one-by-one packing; returns how many
 * items have room. */
static int check_sound(const Layout *l)
{
    size_t one_by_one = 0;
    int used = 0;
    for (int i = 0; i < l->n; i++) {
        if (!l->bytes[i]) continue;
        used++;
        one_by_one += up(l->bytes[i]);
        cr_assert_eq(l->off[i] % ALIGN, 0, "item %d at %zu", i, l->off[i]);
        cr_assert_leq(l->off[i] + l->bytes[i], l->total);
        for (int j = i + 1; j < l->n; j++)
            if (l->bytes[j])
                cr_assert(l->off[i] + l->bytes[i] <= l->off[j] || l->off[j] + l->bytes[j] <= l->off[i],
                          "items %d and %d overlap", i, j);
    }
    cr_assert_eq(l->total, one_by_one, "buffer %zu bytes, one by one %zu", l->total, one_by_one);
    return used;
}

/* Layer i's three projections' LEAF (weight or bias) back to back in l;
 * returns the query's item. */
static int check_adjacent(const ParamList *pl, const Layout *l, int layer, const char *leaf)
{
    static const char *role[3] = {"query", "key", "value"};
    int it[3];
    for (int k = 0; k < 3; k++) {
        char name[PARAM_NAME_MAX];
        snprintf(name, sizeof name, "bert.encoder.layer.%d.attention.self.%s.%s", layer, role[k], leaf);
        it[k] = item(pl, l, name);
        cr_assert_geq(it[k], 0, "%s has no storage", name);
    }
    cr_assert_eq(l->off[it[1]], l->off[it[0]] + l->bytes[it[0]], "layer %d %s: key not right after query", layer, leaf);
    cr_assert_eq(l->off[it[2]], l->off[it[1]] + l->bytes[it[1]], "layer %d %s: value not right after key", layer, leaf);
    return it[0];
}

/* Items outside the groups lie in the order they are listed. */
static void check_others_in_order(const ParamList *pl, const Layout *l)
{
    size_t last = 0;
    bool any = false;
    for (int i = 0; i < l->n; i++) {
        int members[3];
        if (!l->bytes[i] || (l->param[i] >= 0 && param_pack_qkv_group(pl, l->param[i], members))) continue;
        if (any) cr_assert_gt(l->off[i], last, "item %d (%s) out of order", i, pl->p[l->param[i]].name);
        last = l->off[i];
        any = true;
    }
    cr_assert(any);
}

static void load_bert_base(ModelSpec *s)
{
    const char *root = getenv("HPC_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/models/bert_base.model", root ? root : ".");
    cr_assert_eq(spec_load(path, s, stderr), 0, "cannot load %s", path);
}

static void build(const ModelSpec *s, SpecPrecision policy, Pipeline *p)
{
    PipeOptions o = pipeline_defaults(policy);
    HpcError err = {0};
    cr_assert_eq(pipeline_build(s, &o, p, &err), HPC_OK, "pipeline_build: %s", err.msg);
}

Test(param_pack, bert_base_qkv_adjacent, .timeout = 120)
{
    ModelSpec s;
    load_bert_base(&s);
    Pipeline p;
    build(&s, PREC_FP16, &p);
    const ParamList *pl = &p.pl;
    /* The table keeps Hugging Face's order: the layout is the only change. */
    int q = params_find(pl, "bert.encoder.layer.3.attention.self.query.weight");
    cr_assert_geq(q, 0);
    cr_assert_str_eq(pl->p[q + 1].name, "bert.encoder.layer.3.attention.self.query.bias");
    cr_assert_str_eq(pl->p[q + 2].name, "bert.encoder.layer.3.attention.self.key.weight");
    Layout m, lo;
    masters(pl, &m);
    low_copies(&p.g, pl, &lo);
    int nm = check_sound(&m), nl = check_sound(&lo);
    for (int layer = 0; layer < s.stack.layers; layer++) {
        check_adjacent(pl, &m, layer, "weight");
        check_adjacent(pl, &m, layer, "bias");
        check_adjacent(pl, &lo, layer, "weight");
        check_adjacent(pl, &lo, layer, "bias");
    }
    check_others_in_order(pl, &m);
    check_others_in_order(pl, &lo);
    printf("bert_base fp16: %d masters in %.1f MiB, %d 16-bit copies in %.1f MiB, %lld layers' Q/K/V adjacent\n", nm,
           (double)m.total / (1 << 20), nl, (double)lo.total / (1 << 20), (long long)s.stack.layers);
    layout_free(&m);
    layout_free(&lo);
    pipeline_free(&p);
}

Test(param_pack, values_round_trip_and_stacked_read, .timeout = 120)
{
    ModelSpec s;
    load_bert_base(&s);
    Pipeline p;
    build(&s, PREC_FP32, &p);
    const ParamList *pl = &p.pl;
    Layout m;
    masters(pl, &m);
    /* Each master, random values, written at its offset as cuda_exec_set_params uploads it. */
    unsigned char *buf = malloc(m.total);
    cr_assert(buf);
    memset(buf, 0xff, m.total);   /* NaN everywhere nothing is written */
    float **w = calloc((size_t)pl->n, sizeof *w);
    for (int i = 0; i < pl->n; i++) {
        if (!m.bytes[i]) continue;
        int64_t n = params_numel(&pl->p[i]);
        w[i] = malloc((size_t)n * sizeof **w);
        for (int64_t k = 0; k < n; k++) w[i][k] = (float)philox_uniform(11, (uint64_t)k, (uint32_t)i, 0) - 0.5f;
        memcpy(buf + m.off[i], w[i], m.bytes[i]);
    }
    for (int i = 0; i < pl->n; i++)
        if (m.bytes[i]) cr_assert_eq(memcmp(buf + m.off[i], w[i], m.bytes[i]), 0, "%s changed", pl->p[i].name);
    /* Layer 5's three weights read as one (3H, H) matrix, rows query, key, value. */
    int64_t H = s.stack.hidden;
    int qi = check_adjacent(pl, &m, 5, "weight");
    const float *stacked = (const float *)(buf + m.off[qi]);
    static const char *role[3] = {"query", "key", "value"};
    for (int k = 0; k < 3; k++) {
        char name[PARAM_NAME_MAX];
        snprintf(name, sizeof name, "bert.encoder.layer.5.attention.self.%s.weight", role[k]);
        const float *src = w[params_find(pl, name)];
        for (int64_t r = 0; r < H; r += 97)
            for (int64_t c = 0; c < H; c += 13)
                cr_assert_eq(stacked[(k * H + r) * H + c], src[r * H + c], "%s[%lld][%lld]", name, (long long)r,
                             (long long)c);
    }
    for (int i = 0; i < pl->n; i++) free(w[i]);
    free(w);
    free(buf);
    layout_free(&m);
    pipeline_free(&p);
}

/* H = 16: the weights (1024 and 512 bytes) group, the biases (64 and 32
 * bytes) do not, since padding would fall between them: each bias keeps
 * its own 256-byte slot, in listed order. */
Test(param_pack, no_group_where_padding_would_fall_between)
{
    ModelSpec s;
    spec_defaults(&s);
    snprintf(s.name, sizeof s.name, "tiny");
    s.stack.vocab_size = 50;
    s.stack.max_positions = 16;
    s.stack.hidden = 16;
    s.stack.heads = 2;
    s.stack.layers = 2;
    s.stack.ffn = 32;
    s.head.num_labels = 3;
    Pipeline p;
    build(&s, PREC_FP16, &p);
    const ParamList *pl = &p.pl;
    Layout m, lo;
    masters(pl, &m);
    low_copies(&p.g, pl, &lo);
    const Layout *ls[2] = {&m, &lo};
    for (int k = 0; k < 2; k++) {
        check_sound(ls[k]);
        for (int layer = 0; layer < 2; layer++) {
            check_adjacent(pl, ls[k], layer, "weight");
            char name[PARAM_NAME_MAX];
            snprintf(name, sizeof name, "bert.encoder.layer.%d.attention.self.query.bias", layer);
            int qb = item(pl, ls[k], name);
            snprintf(name, sizeof name, "bert.encoder.layer.%d.attention.self.key.bias", layer);
            int kb = item(pl, ls[k], name);
            cr_assert(qb >= 0 && kb >= 0);
            cr_assert_eq(ls[k]->off[kb], ls[k]->off[qb] + up(ls[k]->bytes[qb]), "layer %d: biases grouped", layer);
            cr_assert_neq(ls[k]->off[kb], ls[k]->off[qb] + ls[k]->bytes[qb]);
        }
    }
    /* Items that are no parameter never group: the one-by-one packing. */
    for (int i = 0; i < m.n; i++) m.param[i] = -1;
    m.total = param_pack_offsets(pl, m.n, m.param, NULL, m.bytes, ALIGN, m.off);
    size_t off = 0;
    for (int i = 0; i < m.n; i++) {
        if (!m.bytes[i]) continue;
        cr_assert_eq(m.off[i], off, "item %d moved", i);
        off += up(m.bytes[i]);
    }
    cr_assert_eq(m.total, off);
    layout_free(&m);
    layout_free(&lo);
    pipeline_free(&p);
}

Test(param_pack, group_rules)
{
    ParamList pl;
    params_init(&pl);
    int64_t w[2] = {256, 256}, b[1] = {256}, other[2] = {256, 128};
    const char *pre = "bert.encoder.layer.0.attention.self.";
    char n[PARAM_NAME_MAX];
    static const char *role[3] = {"query", "key", "value"};
    int iw[3], ib[3];
    for (int k = 0; k < 3; k++) {
        snprintf(n, sizeof n, "%s%s.weight", pre, role[k]);
        iw[k] = params_add(&pl, n, 2, w, PARAM_INIT_NORMAL, true, false);
        snprintf(n, sizeof n, "%s%s.bias", pre, role[k]);
        ib[k] = params_add(&pl, n, 1, b, PARAM_INIT_ZEROS, false, false);
    }
    int members[3];
    cr_assert(param_pack_qkv_group(&pl, iw[1], members));   /* any member finds the group */
    cr_assert(members[0] == iw[0] && members[1] == iw[1] && members[2] == iw[2]);
    cr_assert(param_pack_qkv_group(&pl, ib[2], members));
    cr_assert(members[0] == ib[0] && members[1] == ib[1] && members[2] == ib[2]);
    int od = params_add(&pl, "bert.encoder.layer.0.attention.output.dense.weight", 2, w, PARAM_INIT_NORMAL, true, false);
    cr_assert_not(param_pack_qkv_group(&pl, od, members));
    /* A layer whose value weight has another shape, or is frozen apart: no group. */
    params_add(&pl, "bert.encoder.layer.1.attention.self.query.weight", 2, w, PARAM_INIT_NORMAL, true, false);
    params_add(&pl, "bert.encoder.layer.1.attention.self.key.weight", 2, w, PARAM_INIT_NORMAL, true, false);
    int v1 = params_add(&pl, "bert.encoder.layer.1.attention.self.value.weight", 2, other, PARAM_INIT_NORMAL, true, false);
    cr_assert_not(param_pack_qkv_group(&pl, v1, members));
    params_add(&pl, "bert.encoder.layer.2.attention.self.query.weight", 2, w, PARAM_INIT_NORMAL, true, false);
    params_add(&pl, "bert.encoder.layer.2.attention.self.key.weight", 2, w, PARAM_INIT_NORMAL, true, true);
    int v2 = params_add(&pl, "bert.encoder.layer.2.attention.self.value.weight", 2, w, PARAM_INIT_NORMAL, true, false);
    cr_assert_not(param_pack_qkv_group(&pl, v2, members));
    /* Missing member (layer 3 has no key): no group. */
    params_add(&pl, "bert.encoder.layer.3.attention.self.query.weight", 2, w, PARAM_INIT_NORMAL, true, false);
    int v3 = params_add(&pl, "bert.encoder.layer.3.attention.self.value.weight", 2, w, PARAM_INIT_NORMAL, true, false);
    cr_assert_not(param_pack_qkv_group(&pl, v3, members));
    /* Layout: layer 0's items listed q.w q.b k.w k.b v.w v.b pack as w w w b b b. */
    int n_items = 6;
    int item_param[6];
    size_t bytes[6], off[6];
    for (int i = 0; i < n_items; i++) {
        item_param[i] = i;
        bytes[i] = (size_t)params_numel(&pl.p[i]) * 4;
    }
    size_t total = param_pack_offsets(&pl, n_items, item_param, NULL, bytes, ALIGN, off);
    size_t W = 256 * 256 * 4, B = 256 * 4;
    cr_assert_eq(total, 3 * W + 3 * B);
    cr_assert(off[iw[0]] == 0 && off[iw[1]] == W && off[iw[2]] == 2 * W);
    cr_assert(off[ib[0]] == 3 * W && off[ib[1]] == 3 * W + B && off[ib[2]] == 3 * W + 2 * B);
    /* Different tags (dtypes) never group with each other. */
    int tag[6] = {1, 1, 2, 1, 1, 1};
    param_pack_offsets(&pl, n_items, item_param, tag, bytes, ALIGN, off);
    cr_assert_neq(off[iw[1]], off[iw[0]] + W);
    params_free(&pl);
}

/* program/plan.c — schedule, liveness and best-fit arena offsets; see plan.h. */
#include "program/plan.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>



static int64_t align_up(int64_t n) { return (n + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN; }

size_t plan_dtype_size(DType dt)
{
    switch (dt) {
    case DT_F16:
    case DT_BF16: return 2;
    case DT_F64: return 8;
    case DT_F32:
    case DT_I32: return 4;
    }
    return 4;
}

/* ---- liveness --------------------------------------------------------- */

int plan_inplace_input(const IrGraph *g, int v)
{
    const IrNode *n = &g->nodes[v];
    if (n->op == IR_OP_LINEAR_DX_ACC) return n->in[2];
    /* ACT_BWD_BGRAD reads dy and x and writes dx and the recomputed act(x)
     * (output 2) element by element: each output may take one dying input.
     * In the FFN's backward that is two (B, L, ffn) values fewer live at
     * the activation-memory peak (BERT-base 32 x 128: 48 MiB). */
    if (n->op == IR_OP_ACT_BWD_BGRAD) return n->in[0];
    if (n->op == IR_OP_OUTPUT && n->attr.output.index == 2 && g->nodes[n->in[0]].op == IR_OP_ACT_BWD_BGRAD)
        return g->nodes[n->in[0]].in[1];
    /* LN_DW_FIX rewrites the raw weight gradient element by element */
    if (n->op == IR_OP_LN_DW_FIX) return n->in[0];
    return -1;
}

/* ---- views (see plan.h) ----------------------------------------------- */

static bool fixed_shape(const IrNode *n)
{
    for (int i = 0; i < n->rank; i++)
        if (n->dims[i] < 0) return false;
    return true;
}

/* The rule without the base's own check (a view is never a base). */
static bool view_rule(const IrGraph *g, int v, int *base, int64_t *byte_off)
{
    const IrNode *n = &g->nodes[v];
    if (n->op == IR_OP_STACK) {
        for (int k = 0; k < 3; k++) {
            const IrNode *x = &g->nodes[n->in[k]];
            if (x->op != IR_OP_PARAM || x->dtype != n->dtype) return false;
        }
        *base = n->in[0];
        *byte_off = 0;
        return true;
    }
    int u = v, k = 0;
    if (n->op == IR_OP_OUTPUT) {
        u = n->in[0];
        k = n->attr.output.index;
    }
    const IrNode *un = &g->nodes[u];
    if (un->op != IR_OP_UNSTACK) return false;
    const IrNode *x = &g->nodes[un->in[0]];
    int64_t part = ir_numel(un, 1, 1) * (int64_t)plan_dtype_size(un->dtype);
    if (x->dtype != un->dtype || !fixed_shape(x) || part % PLAN_ALIGN != 0) return false;
    *base = un->in[0];
    *byte_off = k * part;
    return true;
}

bool plan_view_of(const IrGraph *g, int v, int *base, int64_t *byte_off)
{
    int b, b2;
    int64_t off, off2;
    if (!view_rule(g, v, &b, &off) || view_rule(g, b, &b2, &off2)) return false;
    *base = b;
    *byte_off = off;
    return true;
}

/* Views get kind PLAN_VIEW and their base; an arena base lives as long as
 * its views (so nothing overwrites it, in place or by sharing, while a
 * view is read).  Before plan_inplace, which reads those lifetimes. */
static void plan_views(StepPlan *p, const IrGraph *g)
{
    for (int i = 0; i < g->n; i++) {
        int b;
        int64_t off;
        p->v[i].view_off = 0;
        if (!plan_view_of(g, i, &b, &off)) continue;
        p->v[i].kind = PLAN_VIEW;
        p->v[i].view_off = off;
        if (p->v[b].last < p->v[i].last) p->v[b].last = p->v[i].last;
    }
}

/* After plan_offsets: each view's storage is its base, and an arena
 * view's offset the base's plus view_off. */
static void plan_view_offsets(StepPlan *p, const IrGraph *g)
{
    for (int i = 0; i < g->n; i++) {
        int b;
        int64_t off;
        if (p->v[i].kind != PLAN_VIEW || !plan_view_of(g, i, &b, &off)) continue;
        p->v[i].storage = b;
        p->v[i].offset = p->v[b].kind == PLAN_ARENA ? p->v[b].offset + off : -1;
    }
}

static bool is_batch_input(const IrNode *n)
{
    return n->op == IR_OP_INPUT && n->attr.input.kind != IR_IN_LOSS_SCALE;
}

static void plan_lifetimes(StepPlan *p, const IrGraph *g, bool keep_all, const bool *write_early)
{
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = &g->nodes[i];
        PlanValue *v = &p->v[i];
        v->kind = n->op == IR_OP_PARAM ? PLAN_PARAM : PLAN_ARENA;
        v->offset = -1;
        int at = p->position[i];
        /* A projection is written when its multi-output op runs. */
        v->def = is_batch_input(n) ? -1 : n->op == IR_OP_OUTPUT ? p->v[n->in[0]].def : at;
        /* PlanOptions.write_early: from the node before it in the graph, which the schedule keeps right
         * before it (plan_order.c moves only dW GEMMs) */
        if (write_early && write_early[i] && i > 0 && v->def > 0 && p->position[i - 1] < v->def)
            v->def = p->position[i - 1];
        v->last = v->def < 0 ? 0 : v->def;
        int64_t bytes = ir_numel(n, p->B, p->L) * (int64_t)plan_dtype_size(n->dtype);
        v->bytes = align_up(bytes > 0 ? bytes : 1);
    }
    /* a span of dW GEMMs one batched call may run (plan_dw_spans) is one node: its outputs are written
     * at its first position */
    for (int t = 0; t < p->n_order; t++) {
        int end = p->dw_span_end[t];
        for (int k = t; end >= 0 && k <= end; k++) p->v[p->order[k]].def = p->v[p->order[k]].last = t;
        if (end >= 0) t = end;
    }
    /* after every def: a node the schedule moved may read a value defined later in the array; a span's
     * members read their inputs up to its last position */
    for (int i = 0; i < g->n; i++) {
        int at = p->dw_span_end[p->position[i]] >= 0 ? p->dw_span_end[p->position[i]] : p->position[i];
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (p->v[g->nodes[i].in[k]].last < at) p->v[g->nodes[i].in[k]].last = at;
    }
    int end = p->n_order;
    if (g->loss >= 0) p->v[g->loss].last = end;
    if (g->logits >= 0) p->v[g->logits].last = end;
    for (int q = 0; q < g->n_params && g->param_grad; q++)
        if (g->param_grad[q] >= 0) p->v[g->param_grad[q]].last = end;
    /* The optimizer reads the token ids after the step to know which rows
     * of an embedding table the step touched (runtime/cuda/cuda_optim.h,
     * "Untouched rows"); batch inputs are small (under 1 MB at 256 x 128). */
    for (int i = 0; i < g->n; i++)
        if (is_batch_input(&g->nodes[i])) p->v[i].last = end;
    /* PlanOptions.keep_all: nothing shares memory, so a test can read any
     * value after the step (tests/gpu/gpu_attention_step.c); a debugging
     * aid, never for training (the arena grows to the sum of all values). */
    if (keep_all)
        for (int i = 0; i < g->n; i++) p->v[i].last = end;
}

/* Value i may be written over its in-place input a: the node that writes
 * i (i's own, or for a projection its multi-output node) is a's last
 * reader (so no role pins a and nothing reads it later), and both are
 * arena values of one dtype and size. */
static bool inplace_allowed(const StepPlan *p, const IrGraph *g, int i, int a)
{
    const PlanValue *va = &p->v[a], *vi = &p->v[i];
    return va->kind == PLAN_ARENA && vi->kind == PLAN_ARENA && va->bytes == vi->bytes && va->last == vi->def &&
           g->nodes[a].dtype == g->nodes[i].dtype;
}

/* storage: each value its own range, but for the in-place writes allowed;
 * a chain's first value then lives to the chain's last reader. */
static void plan_inplace(StepPlan *p, const IrGraph *g)
{
    for (int i = 0; i < g->n; i++) p->v[i].storage = i;
    for (int i = 0; i < g->n; i++) {
        int a = plan_inplace_input(g, i);
        if (a >= 0 && inplace_allowed(p, g, i, a)) p->v[i].storage = p->v[a].storage;
    }
    for (int i = 0; i < g->n; i++) {
        PlanValue *root = &p->v[p->v[i].storage];
        if (root->last < p->v[i].last) root->last = p->v[i].last;
    }
}

/* One arena range: a value (id >= 0) or node -id-1's scratch. */
typedef struct {
    int id, def, last;
    int64_t bytes;
    double key;   /* a perturbed size (perturbed_order) */
} Range;

static int range_by_def(const void *a, const void *b)
{
    const Range *x = a, *y = b;
    if (x->def != y->def) return x->def < y->def ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int collect_ranges(const StepPlan *p, Range *r)
{
    int n = 0;
    for (int i = 0; i < p->n; i++) {
        if (p->v[i].kind == PLAN_ARENA && p->v[i].storage == i)
            r[n++] = (Range){i, p->v[i].def, p->v[i].last, p->v[i].bytes, 0};
        if (p->scratch_bytes[i] > 0) r[n++] = (Range){-i - 1, p->position[i], p->position[i], p->scratch_bytes[i], 0};
    }
    return n;
}

static void set_offset(StepPlan *p, const Range *r, int64_t off)
{
    if (r->id >= 0) p->v[r->id].offset = off;
    else p->scratch_off[-r->id - 1] = off;
}

/* Largest first, then earliest born: the order in which plan_offsets
 * places the ranges. */
static int range_by_size(const void *a, const void *b)
{
    const Range *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
    return range_by_def(a, b);
}

/* Live at one position together. */
static bool ranges_overlap(const Range *a, const Range *b) { return !(a->last < b->def || b->last < a->def); }

/* Is r live at schedule position pos? */
static bool range_live_at(const Range *r, int pos) { return r->def <= pos && pos <= r->last; }

/* First fit in the given order: each range at the lowest offset where it
 * overlaps no range placed before it whose lifetime meets its own.  Fills
 * off (one per range) and returns the arena's size.  by_off holds the
 * placed ranges' indices in offset order, so a range's scan stops at the
 * first placed range beyond the gap it needs, with no sort per range
 * (with one, the tries took 35 ms of BERT-base's 49 ms `hpc compile`). */
static int64_t first_fit(const Range *r, int n, int64_t *off, int *by_off)
{
    int64_t arena = 0;
    for (int i = 0; i < n; i++) {
        int64_t at = 0;
        for (int k = 0; k < i && off[by_off[k]] < at + r[i].bytes; k++) {
            int j = by_off[k];
            if (off[j] + r[j].bytes > at && ranges_overlap(&r[i], &r[j])) at = off[j] + r[j].bytes;
        }
        off[i] = at;
        if (at + r[i].bytes > arena) arena = at + r[i].bytes;
        int lo = 0, hi = i;   /* insert after every placed range at an offset <= at */
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (off[by_off[mid]] <= at) lo = mid + 1;
            else hi = mid;
        }
        memmove(by_off + lo + 1, by_off + lo, (size_t)(i - lo) * sizeof *by_off);
        by_off[lo] = i;
    }
    return arena;
}

typedef struct { int pos; int64_t live; } PosLive;

static int pos_by_live(const void *a, const void *b)
{
    const PosLive *x = a, *y = b;
    if (x->live != y->live) return x->live > y->live ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* The breadth order: the schedule positions from the most bytes live to the
 * least, and at each the ranges live there not yet taken, largest first.
 * The ranges that make the peak are packed together before anything else
 * can split their space.  r comes in largest first and leaves reordered. */
static void order_by_breadth(Range *r, int n, int n_order)
{
    int npos = n_order + 1;   /* positions -1 .. n_order-1 */
    PosLive *pl = xcalloc((size_t)npos, sizeof *pl);
    for (int k = 0; k < npos; k++) pl[k].pos = k - 1;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < npos; k++)
            if (range_live_at(&r[i], k - 1)) pl[k].live += r[i].bytes;
    qsort(pl, (size_t)npos, sizeof *pl, pos_by_live);
    Range *out = xmalloc((size_t)(n + 1) * sizeof *out);
    bool *taken = xcalloc((size_t)n + 1, sizeof *taken);
    int m = 0;
    for (int k = 0; k < npos && m < n; k++)
        for (int i = 0; i < n; i++)   /* r is largest first, so each position's take is too */
            if (!taken[i] && range_live_at(&r[i], pl[k].pos)) {
                taken[i] = true;
                out[m++] = r[i];
            }
    for (int i = 0; i < n; i++)
        if (!taken[i]) out[m++] = r[i];
    memcpy(r, out, (size_t)n * sizeof *r);
    free(taken);
    free(out);
    free(pl);
}

static int range_by_key(const void *a, const void *b)
{
    const Range *x = a, *y = b;
    if (x->key != y->key) return x->key > y->key ? -1 : 1;
    return range_by_def(a, b);
}

/* Largest first with each size scaled by a factor in [1, 1 + spread), drawn
 * from *state (a 64-bit LCG, so every plan of a graph is the same): ranges
 * of close sizes trade places, and so do the holes they leave. */
static void perturbed_order(Range *r, int n, double spread, uint64_t *state)
{
    for (int i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
        double u = (double)(*state >> 11) / 9007199254740992.0;   /* [0, 1) */
        r[i].key = (double)r[i].bytes * (1.0 + spread * u);
    }
    qsort(r, (size_t)n, sizeof *r, range_by_key);
}

/* How many first fits plan_offsets tries: largest first, the breadth
 * order, then perturbed largest-first orders. */
enum { PLAN_PACK_TRIES = 16 };

/* Offsets for every range, knowing all lifetimes at once: first fit in
 * several orders, and the smallest arena kept.  Packing ranges of known
 * lifetimes into the least memory is NP-hard; first fit largest first is
 * the usual answer, but it can let ranges of one size and other lifetimes
 * split the space at the peak.  The breadth order (order_by_breadth) packs
 * the peak first; perturbing the sizes by up to 5-100 % tries the close
 * sizes in other orders.  Measured by `hpc compile --plan` (2026-12-05),
 * fp16 at the models' batch and length, arena before -> after: BERT-base
 * 772.7 -> 766.7 MiB (758 live at the peak; 757.8 -> 752.1 with
 * HPC_LN_SAVE=xhat_dw HPC_ATTN_KEEP=0, the defaults before that day), with
 * every token in the last layer 785.0 -> 782.0 (the live peak, from the
 * breadth order; under the old defaults), BERT-large
 * 1297.1 -> 1292.5, DistilBERT 396.5 -> 390.5; 64 tries found at most
 * 0.3 MiB more for these, 3.6 for RoBERTa-base, at 4 times the cost.  The
 * 16 first fits of BERT-base's ~500 ranges take about 3 ms (this 2-core
 * machine, 2026-12-05; 33 ms when each range sorted its neighbours).  Placing by
 * definition order with a free list (what this did until 2026-12-02)
 * cannot see that a small value born early will block a hole that a large
 * one needs later. */
static void plan_offsets(StepPlan *p)
{
    Range *by_size = xmalloc((size_t)(2 * p->n + 1) * sizeof *by_size);
    int n = collect_ranges(p, by_size);
    qsort(by_size, (size_t)n, sizeof *by_size, range_by_size);
    Range *order = xmalloc((size_t)(n + 1) * sizeof *order), *best_order = xmalloc((size_t)(n + 1) * sizeof *order);
    int64_t *off = xmalloc((size_t)(n + 1) * sizeof *off), *best_off = xmalloc((size_t)(n + 1) * sizeof *off);
    int *by_off = xmalloc((size_t)(n + 1) * sizeof *by_off);
    static const double spread[] = {0.05, 0.2, 0.5, 1.0};
    uint64_t state = 12345;
    int64_t best = -1;
    for (int t = 0; t < PLAN_PACK_TRIES; t++) {
        memcpy(order, by_size, (size_t)n * sizeof *order);
        if (t == 1) order_by_breadth(order, n, p->n_order);
        if (t >= 2) perturbed_order(order, n, spread[t % 4], &state);
        int64_t arena = first_fit(order, n, off, by_off);
        if (best < 0 || arena < best) {
            best = arena;
            Range *r = best_order;
            best_order = order;
            order = r;
            int64_t *o = best_off;
            best_off = off;
            off = o;
        }
    }
    for (int i = 0; i < n; i++) set_offset(p, &best_order[i], best_off[i]);
    p->arena_bytes = best < 0 ? 0 : best;
    for (int i = 0; i < p->n; i++)
        if (p->v[i].storage != i) p->v[i].offset = p->v[p->v[i].storage].offset;
    free(by_off);
    free(best_off);
    free(off);
    free(best_order);
    free(order);
    free(by_size);
}

int64_t plan_peak_live_bytes(const StepPlan *p)
{
    int64_t peak = 0;
    for (int pos = -1; pos < p->n_order; pos++) {
        int64_t live = pos >= 0 ? p->scratch_bytes[p->order[pos]] : 0;
        for (int i = 0; i < p->n; i++)
            if (p->v[i].kind == PLAN_ARENA && p->v[i].storage == i && p->v[i].def <= pos && pos <= p->v[i].last)
                live += p->v[i].bytes;
        if (live > peak) peak = live;
    }
    return peak;
}

HpcStatus plan_build_scratch(const IrGraph *g, int64_t B, int64_t L, const int64_t *scratch, StepPlan *p,
                             HpcError *err)
{
    return plan_build_scratch_with(g, B, L, scratch, NULL, p, err);
}

/* The plan of g in schedule `order` (NULL: the graph's order). */
static void plan_in_order(const IrGraph *g, int64_t B, int64_t L, const int64_t *scratch, const PlanOptions *opt,
                          const int *order, StepPlan *p)
{
    memset(p, 0, sizeof *p);
    p->B = B;
    p->L = L;
    p->n = g->n;
    p->n_order = g->n;
    p->n_forward = g->n_forward;
    p->order = xmalloc((size_t)g->n * sizeof *p->order);
    p->position = xmalloc((size_t)g->n * sizeof *p->position);
    for (int t = 0; t < g->n; t++) p->order[t] = order ? order[t] : t;
    for (int t = 0; t < g->n; t++) p->position[p->order[t]] = t;
    p->dw_span_end = xmalloc((size_t)g->n * sizeof *p->dw_span_end);
    for (int t = 0; t < g->n; t++) p->dw_span_end[t] = -1;   /* the graph's order: no batched spans */
    if (order) plan_dw_spans(g, p->order, g->n, p->dw_span_end);
    p->v = xcalloc((size_t)g->n, sizeof *p->v);
    p->scratch_off = xmalloc((size_t)g->n * sizeof *p->scratch_off);
    p->scratch_bytes = xmalloc((size_t)g->n * sizeof *p->scratch_bytes);
    for (int i = 0; i < g->n; i++) {
        int64_t s = scratch ? scratch[i] : 0;
        p->scratch_bytes[i] = s > 0 ? align_up(s) : 0;
        p->scratch_off[i] = -1;
    }
    plan_lifetimes(p, g, opt && opt->keep_all, opt ? opt->write_early : NULL);
    plan_views(p, g);
    plan_inplace(p, g);
    plan_offsets(p);
    plan_view_offsets(p, g);
}

/* PlanOptions.dw_group, or in its place HPC_DW_GROUP: 1 always, 0 never;
 * unset, empty or auto: AUTO (see plan.h); HPC_ERR_USAGE for anything
 * else, so a misspelt setting is not measured as the default. */
static HpcStatus dw_group_mode(const PlanOptions *opt, PlanDwGroup *mode, HpcError *err)
{
    *mode = PLAN_DW_GROUP_AUTO;
    if (opt && opt->dw_group != PLAN_DW_GROUP_DEFAULT) {
        *mode = opt->dw_group;
        return HPC_OK;
    }
    const char *env = getenv("HPC_DW_GROUP");
    if (!env || !*env || strcmp(env, "auto") == 0) return HPC_OK;
    if (strcmp(env, "1") == 0) *mode = PLAN_DW_GROUP_ALWAYS;
    else if (strcmp(env, "0") == 0) *mode = PLAN_DW_GROUP_NEVER;
    else return hpc_fail(err, HPC_ERR_USAGE, "HPC_DW_GROUP=%s: expected 0 (the graph's order), 1 (the dW GEMMs "
                         "of one shape side by side) or auto (side by side where the arena grows by at most "
                         "%d %%)", env, 100 / PLAN_DW_GROUP_GROWTH);
    return HPC_OK;
}

HpcStatus plan_build_scratch_with(const IrGraph *g, int64_t B, int64_t L, const int64_t *scratch,
                                  const PlanOptions *opt, StepPlan *p, HpcError *err)
{
    memset(p, 0, sizeof *p);
    if (B < 1 || L < 1 || g->n < 1)
        return hpc_fail(err, HPC_ERR_USAGE, "plan_build: batch %lld and length %lld must be >= 1 "
                        "and the graph non-empty", (long long)B, (long long)L);
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i].dtype == DT_F64)
            return hpc_fail(err, HPC_ERR_INPUT, "plan_build: value %d (%s) is f64, which the GPU "
                            "step does not store; plan the f32/f16/bf16 graph", i, g->nodes[i].name);
    PlanDwGroup mode;
    HpcStatus st = dw_group_mode(opt, &mode, err);
    if (st) return st;
    plan_in_order(g, B, L, scratch, opt, NULL, p);
    int *order = xmalloc((size_t)g->n * sizeof *order);
    int moved = plan_order_dw_groups(g, order);
    int64_t other = 0;
    if (mode != PLAN_DW_GROUP_NEVER && moved > 0) {
        /* the dW GEMMs side by side (plan_order.c), under AUTO where that costs little memory */
        StepPlan grouped;
        plan_in_order(g, B, L, scratch, opt, order, &grouped);
        bool keep = mode == PLAN_DW_GROUP_ALWAYS ||
                    grouped.arena_bytes <= p->arena_bytes + p->arena_bytes / PLAN_DW_GROUP_GROWTH;
        other = keep ? p->arena_bytes : grouped.arena_bytes;
        plan_free(keep ? p : &grouped);
        if (keep) *p = grouped;
        p->dw_grouped = keep;
    }
    p->dw_mode = mode;
    p->dw_moved = moved;
    p->dw_other_arena = other;
    free(order);
    return HPC_OK;
}

void plan_free(StepPlan *p)
{
    free(p->order);
    free(p->position);
    free(p->dw_span_end);
    free(p->v);
    free(p->scratch_off);
    free(p->scratch_bytes);
    memset(p, 0, sizeof *p);
}

/* ---- the memory figure ------------------------------------------------ */

static int optimizer_words(const SpecTraining *t)
{
    switch (t->optimizer) {
    case OPT_ADAMW:
    case OPT_ADAM:
    case OPT_LAMB: return 2;
    case OPT_SGD: return t->momentum != 0 ? 1 : 0;
    }
    return 2;
}

void plan_memory(const StepPlan *p, const IrGraph *g, const ParamList *pl,
                 const SpecTraining *train, PlanMemory *m)
{
    memset(m, 0, sizeof *m);
    m->arena = p->arena_bytes;
    for (int i = 0; i < p->n; i++) {
        if (p->v[i].kind == PLAN_ARENA && p->v[i].storage == i) m->unshared += p->v[i].bytes;
        m->unshared += p->scratch_bytes[i];
    }
    for (int q = 0; q < pl->n; q++)
        if (pl->p[q].tied_to < 0) m->params_master += params_numel(&pl->p[q]) * 4;
    bool *low_seen = xcalloc((size_t)(pl->n > 0 ? pl->n : 1) * 3, sizeof *low_seen);
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = &g->nodes[i];
        if (n->op != IR_OP_PARAM || n->dtype == DT_F32) continue;
        int slot = n->attr.param.index * 3 + (n->dtype == DT_F16 ? 1 : 2);
        if (n->attr.param.index < pl->n && !low_seen[slot]) {
            low_seen[slot] = true;
            m->params_low += ir_numel(n, 1, 1) * (int64_t)plan_dtype_size(n->dtype);
        }
    }
    free(low_seen);
    int words = optimizer_words(train);
    for (int q = 0; q < g->n_params && g->param_grad; q++) {
        int v = g->param_grad[q];
        if (v < 0 || q >= pl->n) continue;
        m->gradients += p->v[v].bytes;
        m->optimizer += params_numel(&pl->p[q]) * 4 * words;
    }
    m->total = m->arena + m->params_master + m->params_low + m->optimizer;
}

/* ---- invariants ------------------------------------------------------- */

static bool check_fail(char *why, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool check_fail(char *why, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, size, fmt, ap);
    va_end(ap);
    return false;
}

static int64_t range_offset(const StepPlan *p, const Range *r)
{
    return r->id >= 0 ? p->v[r->id].offset : p->scratch_off[-r->id - 1];
}

/* Value i, stored in another's range: an in-place write of its node into
 * input a, the range of a's storage, live over i's lifetime, and no node
 * after i reads a. */
static bool check_inplace(const StepPlan *p, const IrGraph *g, int i, char *why, size_t why_size)
{
    const PlanValue *v = &p->v[i], *root = &p->v[v->storage];
    int a = plan_inplace_input(g, i);
    if (a < 0 || p->v[a].storage != v->storage || v->offset != root->offset || v->bytes != root->bytes ||
        root->def > v->def || root->last < v->last)
        return check_fail(why, why_size, "value %d (%s) shares the range of value %d but is no in-place write "
                          "of it", i, g->nodes[i].name, v->storage);
    bool role = a == g->loss || a == g->logits;
    for (int q = 0; q < g->n_params && g->param_grad; q++) role |= g->param_grad[q] == a;
    if (role)
        return check_fail(why, why_size, "node %d writes over value %d in place, which the step must keep "
                          "(loss, logits or a gradient)", i, a);
    for (int j = 0; j < g->n; j++)
        for (int q = 0; q < g->nodes[j].n_in && p->position[j] > p->position[i]; q++)
            if (g->nodes[j].in[q] == a)
                return check_fail(why, why_size, "node %d writes over value %d in place, which node %d reads "
                                  "later", i, a, j);
    return true;
}

/* View i (PLAN_VIEW): the rule's base and offset, inside the base's
 * bytes, and the base (an arena range or a parameter) live over i's
 * lifetime. */
static bool check_view(const StepPlan *p, const IrGraph *g, int i, char *why, size_t why_size)
{
    const PlanValue *v = &p->v[i];
    int b;
    int64_t off;
    if (!plan_view_of(g, i, &b, &off) || v->storage != b || v->view_off != off)
        return check_fail(why, why_size, "value %d (%s) is planned as a view of value %d at %lld, which the "
                          "view rule does not make", i, g->nodes[i].name, v->storage, (long long)v->view_off);
    const PlanValue *base = &p->v[b];
    int64_t need = ir_numel(&g->nodes[i], p->B, p->L) * (int64_t)plan_dtype_size(g->nodes[i].dtype);
    int64_t have = ir_numel(&g->nodes[b], p->B, p->L) * (int64_t)plan_dtype_size(g->nodes[b].dtype);
    /* a stack of parameters covers its base and the two after it (the
     * executor checks at bind time that they follow it in memory) */
    if (base->kind == PLAN_PARAM) have *= 3;
    if (off < 0 || off + need > have)
        return check_fail(why, why_size, "view %d (%s): bytes [%lld, +%lld) outside value %d's %lld", i,
                          g->nodes[i].name, (long long)off, (long long)need, b, (long long)have);
    if (base->kind == PLAN_PARAM) return true;
    if (base->kind != PLAN_ARENA || base->def > v->def || base->last < v->last || v->offset != base->offset + off)
        return check_fail(why, why_size, "view %d (%s) [%d, %d] at %lld: its base %d [%d, %d] at %lld is not "
                          "an arena value live over it, or the offsets disagree", i, g->nodes[i].name, v->def,
                          v->last, (long long)v->offset, b, base->def, base->last, (long long)base->offset);
    return true;
}

bool plan_check(const StepPlan *p, const IrGraph *g, char *why, size_t why_size)
{
    for (int i = 0; i < g->n; i++) {
        const PlanValue *v = &p->v[i];
        int end = p->dw_span_end[p->position[i]];   /* a span of dW GEMMs: one node from its start to end */
        if (end >= 0) {
            int start = p->position[i];
            while (start > 0 && p->dw_span_end[start - 1] == end) start--;
            if (v->def != start)
                return check_fail(why, why_size, "dW GEMM %d (%s) of the span [%d, %d]: its output is written "
                                  "from %d, not the span's start", i, g->nodes[i].name, start, end, v->def);
            for (int k = 0; k < g->nodes[i].n_in; k++)
                if (p->v[g->nodes[i].in[k]].last < end)
                    return check_fail(why, why_size, "dW GEMM %d (%s) of the span [%d, %d]: input %d dies at %d",
                                      i, g->nodes[i].name, start, end, g->nodes[i].in[k],
                                      p->v[g->nodes[i].in[k]].last);
        }
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (p->v[g->nodes[i].in[k]].last < p->position[i] || p->v[g->nodes[i].in[k]].def > p->position[i])
                return check_fail(why, why_size, "value %d is not live when node %d reads it",
                                  g->nodes[i].in[k], i);
        int b;
        int64_t off;
        if (plan_view_of(g, i, &b, &off) != (v->kind == PLAN_VIEW))
            return check_fail(why, why_size, "value %d (%s) %s a view by the rule but is planned as %s", i,
                              g->nodes[i].name, v->kind == PLAN_VIEW ? "is not" : "is",
                              v->kind == PLAN_VIEW ? "one" : "its own storage");
        if (v->kind == PLAN_VIEW && !check_view(p, g, i, why, why_size)) return false;
        if (v->kind != PLAN_ARENA) continue;
        if (v->storage != i && !check_inplace(p, g, i, why, why_size)) return false;
        if (v->def > v->last || v->offset < 0 || v->offset % PLAN_ALIGN ||
            v->offset + v->bytes > p->arena_bytes)
            return check_fail(why, why_size, "value %d (%s): lifetime [%d, %d], range [%lld, +%lld) "
                              "outside the arena of %lld or unaligned", i, g->nodes[i].name, v->def,
                              v->last, (long long)v->offset, (long long)v->bytes,
                              (long long)p->arena_bytes);
        int64_t need = ir_numel(&g->nodes[i], p->B, p->L) * (int64_t)plan_dtype_size(g->nodes[i].dtype);
        if (v->bytes < need)
            return check_fail(why, why_size, "value %d holds %lld bytes, needs %lld", i,
                              (long long)v->bytes, (long long)need);
    }
    Range *r = xmalloc((size_t)(2 * p->n + 1) * sizeof *r);
    int n = collect_ranges(p, r);
    bool ok = true;
    for (int a = 0; a < n && ok; a++) {
        int64_t oa = range_offset(p, &r[a]);
        if (oa < 0 || oa % PLAN_ALIGN || oa + r[a].bytes > p->arena_bytes)
            ok = check_fail(why, why_size, "range %d outside the arena", r[a].id);
        for (int b = a + 1; b < n && ok; b++) {
            bool live = ranges_overlap(&r[a], &r[b]);
            int64_t ob = range_offset(p, &r[b]);
            bool mem = oa < ob + r[b].bytes && ob < oa + r[a].bytes;
            if (live && mem)
                ok = check_fail(why, why_size, "ranges %d [%d, %d] and %d [%d, %d] are live together "
                                "and overlap in memory ([%lld, +%lld) and [%lld, +%lld))",
                                r[a].id, r[a].def, r[a].last, r[b].id, r[b].def, r[b].last,
                                (long long)oa, (long long)r[a].bytes, (long long)ob,
                                (long long)r[b].bytes);
        }
    }
    free(r);
    return ok;
}

/* ---- printing --------------------------------------------------------- */

static void print_mib(FILE *out, const char *what, int64_t bytes)
{
    fprintf(out, "  %-22s %10.1f MiB\n", what, (double)bytes / (1024.0 * 1024.0));
}

/* Which schedule the plan took for the dW GEMM groups, and the arena of the
 * other one, so the memory figure above can be read against HPC_DW_GROUP. */
static void print_dw_schedule(const StepPlan *p, FILE *out)
{
    if (p->dw_moved == 0) return;   /* no groups: the graph's order is the only schedule */
    static const char *const setting[] = {"", "0", "auto", "1"};
    double other = (double)p->dw_other_arena / (1024.0 * 1024.0);
    if (p->dw_grouped)
        fprintf(out, "  schedule: the dW GEMMs of one shape side by side (HPC_DW_GROUP=%s; the graph's order "
                "would plan %.1f MiB)\n", setting[p->dw_mode], other);
    else if (p->dw_other_arena > 0)
        fprintf(out, "  schedule: the graph's order (HPC_DW_GROUP=%s; the dW GEMMs side by side would plan "
                "%.1f MiB, more than %d %% over)\n", setting[p->dw_mode], other, 100 / PLAN_DW_GROUP_GROWTH);
    else
        fprintf(out, "  schedule: the graph's order (HPC_DW_GROUP=%s)\n", setting[p->dw_mode]);
}

void plan_print(const StepPlan *p, const IrGraph *g, const ParamList *pl,
                const SpecTraining *train, FILE *out)
{
    PlanMemory m;
    plan_memory(p, g, pl, train, &m);
    fprintf(out, "step plan for B=%lld L=%lld: %d nodes (%d forward)\n", (long long)p->B,
            (long long)p->L, p->n_order, p->n_forward);
    print_mib(out, "arena (planned)", m.arena);
    print_mib(out, "arena without sharing", m.unshared);
    print_mib(out, "  of which gradients", m.gradients);
    print_mib(out, "parameters (f32)", m.params_master);
    print_mib(out, "parameters (low copy)", m.params_low);
    print_mib(out, "optimizer state", m.optimizer);
    print_mib(out, "total", m.total);
    print_dw_schedule(p, out);
    fprintf(out, "%5s %5s  %-40s %6s %12s %12s  %s\n", "pos", "id", "value", "dtype", "bytes",
            "offset", "live");
    for (int t = 0; t < p->n_order; t++) {
        int i = p->order[t];
        const PlanValue *v = &p->v[i];
        if (v->kind != PLAN_ARENA && v->kind != PLAN_VIEW) continue;
        fprintf(out, "%5d %5d  %-40.40s %6s %12lld %12lld  [%d, %d]", t, i, g->nodes[i].name,
                ir_dtype_name(g->nodes[i].dtype), (long long)v->bytes, (long long)v->offset,
                v->def, v->last);
        if (p->scratch_bytes[i] > 0)
            fprintf(out, "  scratch %lld @ %lld", (long long)p->scratch_bytes[i],
                    (long long)p->scratch_off[i]);
        if (v->kind == PLAN_VIEW) fprintf(out, "  view of %d + %lld", v->storage, (long long)v->view_off);
        else if (v->storage != i) fprintf(out, "  in place of %d", v->storage);
        fputc('\n', out);
    }
}

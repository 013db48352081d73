/* runtime/train/checkpoint.c — see checkpoint.h.  The tensors go to safetensors
 * files (runtime/safetensors), the rest to state.json (jansson; doubles are
 * printed with 17 significant digits, which reads back to the same bits),
 * the directory protocol is runtime/checkpoint_fs. */
#include "train/checkpoint.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/atomic_file.h"
#include "train/checkpoint_fs.h"
#include "formats/hf_config.h"
#include "formats/safetensors.h"

#define M_PREFIX "exp_avg."
#define V_PREFIX "exp_avg_sq."

void checkpoint_fingerprint(const ModelSpec *s, char *out, size_t cap)
{
    const SpecStack *k = &s->stack;
    const SpecHead *h = &s->head;
    snprintf(out, cap,
             "%s vocab %lld positions %lld offset %lld types %lld hidden %lld layers %lld heads %lld ffn %lld "
             "%s %s-norm %s%s%s; head %s labels %lld%s%s%s%s%s",
             spec_stack_kind_name(k->kind), (long long)k->vocab_size, (long long)k->max_positions,
             (long long)k->position_offset, (long long)k->type_vocab_size, (long long)k->hidden,
             (long long)k->layers, (long long)k->heads, (long long)k->ffn, spec_activation_name(k->activation),
             spec_norm_name(k->norm), spec_attention_name(k->attention), k->embedding_ln ? " embedding-ln" : "",
             k->final_ln ? " final-ln" : "", h->regression ? "regression" : spec_head_kind_name(h->kind),
             (long long)h->num_labels, h->pooler ? " pooler " : "",
             h->pooler ? spec_activation_name(h->pooler_activation) : "",
             h->tie_word_embeddings ? " tied" : "", h->decoder_bias ? " decoder-bias" : "",
             s->train.freeze_embeddings || s->train.freeze_layers ? " (frozen parts)" : "");
}

/* ------------------------------------------------------------------ */
/* Saving                                                               */

static bool owns_storage(const ParamInfo *p) { return p->tied_to < 0; }

static void shape_of(const ParamInfo *p, int64_t shape[2])
{
    shape[0] = p->dims[0];
    shape[1] = p->rank > 1 ? p->dims[1] : 0;
}

/* The spec as .model text (spec_write), heap string. */
static char *model_text(const ModelSpec *spec)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    spec_write(spec, f);
    fclose(f);
    return text;
}

static json_t *u64_str(uint64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    return json_string(buf);
}

static json_t *state_json(const TrainState *ts, const char *source)
{
    char fp[1024];
    checkpoint_fingerprint(ts->spec, fp, sizeof fp);
    const LossScaler *ls = &ts->ls;
    return json_pack(
        "{s:s, s:i, s:{s:s, s:s, s:s}, s:s, s:s, s:I, s:I, s:I, s:I, s:o, s:{s:I, s:I},"
        " s:{s:f, s:I, s:I, s:I}, s:o}",
        "format", CHECKPOINT_FORMAT, "version", CHECKPOINT_VERSION,
        "model", "name", ts->spec->name, "fingerprint", fp, "source", source ? source : "",
        "policy", spec_precision_name(ts->policy), "optimizer", spec_optimizer_name(ts->spec->train.optimizer),
        "step", (json_int_t)ts->step, "total_steps", (json_int_t)ts->total_steps,
        "applied_steps", (json_int_t)ts->opt.step, "micro_step", (json_int_t)ts->micro_step,
        "seed", u64_str(ts->seed),
        "loader", "epoch", (json_int_t)ts->loader_epoch, "cursor", (json_int_t)ts->loader_cursor,
        "loss_scaler", "scale", ls->scale, "growth_tracker", (json_int_t)ls->growth_tracker,
        "consecutive_skips", (json_int_t)ls->consecutive_skips, "total_skips", (json_int_t)ls->total_skips,
        "best_metric", ts->has_best ? json_real(ts->best_metric) : json_null());
}

static HpcStatus write_state(const char *path, const TrainState *ts, HpcError *err)
{
    char *source = model_text(ts->spec);
    json_t *root = state_json(ts, source);
    free(source);
    if (!root) return hpc_fail(err, HPC_ERR_INTERNAL, "checkpoint: could not build state.json");
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) return hpc_fail(err, HPC_ERR_OOM, "checkpoint: out of memory for state.json");
    AtomicFile af;
    HpcStatus st = atomic_open(&af, path, err);
    if (!st) {
        st = atomic_write(&af, text, strlen(text), err);
        if (!st) st = atomic_write(&af, "\n", 1, err);
        if (st) atomic_abort(&af);
        else st = atomic_commit(&af, err);
    }
    free(text);
    return st;
}

static HpcStatus add_tensors(StWriter *w, const TrainState *ts, float *const *bufs, const char *prefix,
                             HpcError *err)
{
    HpcStatus st = HPC_OK;
    for (int i = 0; bufs && i < ts->pl->n && !st; i++) {
        const ParamInfo *p = &ts->pl->p[i];
        if (!owns_storage(p) || !bufs[i]) continue;
        char name[PARAM_NAME_MAX + 32];
        int64_t shape[2];
        shape_of(p, shape);
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        st = st_writer_add(w, name, ST_F32, p->rank, shape, bufs[i], err);   // (dims) f32
    }
    return st;
}

/* The tensors of bufs_a (and bufs_b) under their prefixes, into one file. */
static HpcStatus write_tensors(const char *path, const TrainState *ts, float *const *bufs_a, const char *pre_a,
                               float *const *bufs_b, const char *pre_b, HpcError *err)
{
    StWriter w;
    st_writer_init(&w);
    HpcStatus st = add_tensors(&w, ts, bufs_a, pre_a, err);
    if (!st) st = add_tensors(&w, ts, bufs_b, pre_b, err);
    if (!st) st = st_writer_meta(&w, "format", "pt", err);
    if (!st) st = st_writer_meta(&w, "producer", "hpc checkpoint", err);
    if (!st) st = st_writer_save(&w, path, err);
    st_writer_free(&w);
    return st;
}

HpcStatus checkpoint_save(const char *dir, const TrainState *ts, HpcError *err)
{
    HPC_ASSERT(ts->spec && ts->pl && ts->w);
    char tmp[4096], path[4200];
    HpcStatus st = ckfs_begin(dir, ts->step, tmp, sizeof tmp, err);
    if (st) return st;
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    st = write_tensors(path, ts, ts->w, "", NULL, "", err);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
    if (!st) st = write_tensors(path, ts, ts->m, M_PREFIX, ts->v, V_PREFIX, err);
    snprintf(path, sizeof path, "%s/state.json", tmp);
    if (!st) st = write_state(path, ts, err);
    if (!st) st = ckfs_commit(dir, tmp, ts->step, err);
    if (st) {
        ckfs_discard(tmp);
        return st;
    }
    ckfs_prune(dir, ts->step, ts->keep > 0 ? ts->keep : CHECKPOINT_KEEP_DEFAULT);
    return HPC_OK;
}

/* ------------------------------------------------------------------ */
/* Loading                                                              */

static HpcStatus read_state(const char *stepdir, json_t **out, HpcError *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/state.json", stepdir);
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s:%d: %s", path, je.line, je.text);
    const char *format = NULL;
    json_int_t version = 0;
    if (json_unpack(root, "{s:s, s:I}", "format", &format, "version", &version) != 0 ||
        strcmp(format, CHECKPOINT_FORMAT) != 0 || version != CHECKPOINT_VERSION) {
        json_decref(root);
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s is not an %s version %d state file", path,
                        CHECKPOINT_FORMAT, CHECKPOINT_VERSION);
    }
    *out = root;
    return HPC_OK;
}

static HpcStatus check_identity(const char *stepdir, json_t *root, const TrainState *ts, HpcError *err)
{
    const char *name = "?", *fp = "?", *policy = "?", *optimizer = "?";
    json_unpack(root, "{s:{s:s, s:s}, s:s, s:s}", "model", "name", &name, "fingerprint", &fp, "policy", &policy,
                "optimizer", &optimizer);
    char mine[1024];
    checkpoint_fingerprint(ts->spec, mine, sizeof mine);
    if (strcmp(fp, mine) != 0)
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s was written by model '%s' (%s), not by this "
                        "model '%s' (%s); use the .model file that wrote it, or another checkpoint directory",
                        stepdir, name, fp, ts->spec->name, mine);
    if (ts->weights_only) return HPC_OK;
    if (strcmp(policy, spec_precision_name(ts->policy)) != 0)
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s was written by a %s run, this run is %s; resume "
                        "with the same precision flag (--%s)", stepdir, policy, spec_precision_name(ts->policy),
                        policy);
    if (strcmp(optimizer, spec_optimizer_name(ts->spec->train.optimizer)) != 0)
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s holds %s optimizer state, this model trains with %s; "
                        "its moments cannot be reused", stepdir, optimizer,
                        spec_optimizer_name(ts->spec->train.optimizer));
    return HPC_OK;
}

static void shape_text(const ParamInfo *p, char *out, size_t cap)
{
    if (p->rank > 1) snprintf(out, cap, "(%lld, %lld)", (long long)p->dims[0], (long long)p->dims[1]);
    else snprintf(out, cap, "(%lld)", (long long)p->dims[0]);
}

static HpcStatus read_one(const char *path, const StFile *f, const ParamInfo *p, const char *prefix, float *dst,
                          HpcError *err)
{
    char name[PARAM_NAME_MAX + 32], want[64];
    snprintf(name, sizeof name, "%s%s", prefix, p->name);
    shape_text(p, want, sizeof want);
    const StTensor *t = st_find(f, name);
    if (!t)
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s has no tensor %s %s; it was written by another "
                        "model or optimizer", path, name, want);
    bool same = t->dtype == ST_F32 && t->ndim == p->rank && t->shape[0] == p->dims[0] &&
                (p->rank < 2 || t->shape[1] == p->dims[1]);
    if (!same)
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s: tensor %s is %s with %d dims [%lld%s], this model "
                        "wants F32 %s", path, name, st_dtype_name(t->dtype), t->ndim, (long long)t->shape[0],
                        t->ndim > 1 ? ", ..." : "", want);
    HpcStatus st = st_tensor_check_finite(f, t, err);
    return st ? st : st_tensor_copy(t, dst, (size_t)params_numel(p) * sizeof(float), err);
}

/* The parameter a file tensor stands for, with its buffer array, or -1. */
static int tensor_param(const TrainState *ts, const char *name, bool optimizer)
{
    const char *base = name;
    float *const *bufs = ts->w;
    if (optimizer) {
        bool m = strncmp(name, M_PREFIX, strlen(M_PREFIX)) == 0, v = strncmp(name, V_PREFIX, strlen(V_PREFIX)) == 0;
        if (!m && !v) return -1;
        base = name + strlen(m ? M_PREFIX : V_PREFIX);
        bufs = m ? ts->m : ts->v;
    }
    int i = params_find(ts->pl, base);
    return i >= 0 && owns_storage(&ts->pl->p[i]) && bufs && bufs[i] ? i : -1;
}

static HpcStatus read_file(const char *stepdir, const char *file, TrainState *ts, bool optimizer, HpcError *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", stepdir, file);
    StFile *f;
    HpcStatus st = st_open(path, &f, err);
    if (st) return st;
    for (int64_t k = 0; k < st_count(f) && !st; k++)
        if (tensor_param(ts, st_tensor(f, k)->name, optimizer) < 0)
            st = hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s holds %s, which this model and optimizer do not "
                          "have; it was written by another model", path, st_tensor(f, k)->name);
    for (int i = 0; i < ts->pl->n && !st; i++) {
        const ParamInfo *p = &ts->pl->p[i];
        if (!owns_storage(p)) continue;
        if (!optimizer && ts->w[i]) st = read_one(path, f, p, "", ts->w[i], err);
        if (optimizer && ts->m && ts->m[i]) st = read_one(path, f, p, M_PREFIX, ts->m[i], err);
        if (!st && optimizer && ts->v && ts->v[i]) st = read_one(path, f, p, V_PREFIX, ts->v[i], err);
    }
    st_close(f);
    return st;
}

static HpcStatus read_scalars(const char *stepdir, json_t *root, TrainState *ts, HpcError *err)
{
    json_int_t step, total, applied, micro, epoch, cursor, growth, consec, skips;
    const char *seed;
    double scale;
    json_t *best;
    json_error_t je;
    if (json_unpack_ex(root, &je, 0, "{s:I, s:I, s:I, s:I, s:s, s:{s:I, s:I}, s:{s:F, s:I, s:I, s:I}, s:o}",
                       "step", &step, "total_steps", &total, "applied_steps", &applied, "micro_step", &micro,
                       "seed", &seed, "loader", "epoch", &epoch, "cursor", &cursor, "loss_scaler", "scale", &scale,
                       "growth_tracker", &growth, "consecutive_skips", &consec, "total_skips", &skips,
                       "best_metric", &best) != 0)
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s/state.json: %s", stepdir, je.text);
    if (step < 0 || applied < 0 || applied > step || micro < 0 || epoch < 0 || cursor < 0 || !(scale > 0))
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s/state.json holds impossible counters (step %lld, "
                        "applied %lld, cursor %lld, scale %g)", stepdir, (long long)step, (long long)applied,
                        (long long)cursor, scale);
    ts->step = step;
    ts->total_steps = total;
    ts->opt.step = applied;
    ts->micro_step = micro;
    ts->seed = strtoull(seed, NULL, 10);
    ts->loader_epoch = epoch;
    ts->loader_cursor = cursor;
    ts->ls.scale = scale;
    ts->ls.growth_tracker = growth;
    ts->ls.consecutive_skips = consec;
    ts->ls.total_skips = skips;
    ts->has_best = json_is_number(best);
    ts->best_metric = ts->has_best ? json_number_value(best) : 0;
    return HPC_OK;
}

HpcStatus checkpoint_resolve(const char *dir, char *out, size_t cap, HpcError *err)
{
    return ckfs_resolve(dir, out, cap, err);
}

HpcStatus checkpoint_load(const char *dir, TrainState *ts, HpcError *err)
{
    HPC_ASSERT(ts->spec && ts->pl && ts->w);
    char stepdir[4096];
    json_t *root = NULL;
    HpcStatus st = ckfs_resolve(dir, stepdir, sizeof stepdir, err);
    if (!st) st = read_state(stepdir, &root, err);
    if (!st) st = check_identity(stepdir, root, ts, err);
    if (!st) st = read_file(stepdir, "model.safetensors", ts, false, err);
    if (!st && !ts->weights_only) st = read_file(stepdir, "optimizer.safetensors", ts, true, err);
    if (!st) st = read_scalars(stepdir, root, ts, err);
    json_decref(root);
    return st;
}

/* ------------------------------------------------------------------ */
/* The saved model                                                      */

static bool parse_policy(const char *name, SpecPrecision *out)
{
    for (SpecPrecision p = PREC_DEFAULT; p <= PREC_BF16; p++)
        if (strcmp(name, spec_precision_name(p)) == 0) {
            *out = p;
            return true;
        }
    return false;
}

HpcStatus checkpoint_read_spec(const char *dir, ModelSpec *spec, SpecPrecision *policy, HpcError *err)
{
    char stepdir[4096], name[4200];
    json_t *root = NULL;
    HpcStatus st = ckfs_resolve(dir, stepdir, sizeof stepdir, err);
    if (!st) st = read_state(stepdir, &root, err);
    if (st) return st;
    const char *source = NULL, *pol = "";
    json_unpack(root, "{s:{s:s}, s?s}", "model", "source", &source, "policy", &pol);
    snprintf(name, sizeof name, "%s/state.json (model.source)", stepdir);
    char *diag = NULL;
    size_t dlen = 0;
    FILE *df = open_memstream(&diag, &dlen);
    int nerr = source && df ? spec_load_string(name, source, strlen(source), NULL, spec, df) : -1;
    if (df) fclose(df);
    if (nerr != 0)
        st = hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s holds no loadable model text: %.600s", name,
                      diag && *diag ? diag : "(missing)");
    if (!st && policy && !parse_policy(pol, policy)) *policy = PREC_DEFAULT;
    free(diag);
    json_decref(root);
    return st;
}

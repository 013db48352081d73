/* runtime/train/checkpoint.c — see checkpoint.h.  The tensors go to safetensors
 * files (runtime/safetensors), the rest to state.json (jansson; doubles are
 * printed with 17 significant digits, which reads back to the same bits),
 * the checksums to SHA256SUMS (checkpoint_hash.h), the directory protocol
 * is runtime/checkpoint_fs. */
#include "train/checkpoint.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/atomic_file.h"
#include "train/checkpoint_fs.h"
#include "train/checkpoint_hash.h"
#include "formats/hf_config.h"
#include "formats/safetensors.h"
#include "num_parse.h"

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

/* The settings a TrainState records or is compared with. */
static void settings_of(const TrainState *ts, CheckpointSettings *cs)
{
    if (ts->settings) *cs = *ts->settings;
    else checkpoint_settings_init(cs, ts->spec, ts->policy, ts->total_steps);
}

static json_t *settings_json(const TrainState *ts)
{
    CheckpointSettings *cs = xmalloc(sizeof *cs);
    settings_of(ts, cs);
    json_t *o = json_object();
    for (int i = 0; o && i < cs->n; i++) json_object_set_new(o, cs->s[i].key, json_string(cs->s[i].value));
    free(cs);
    return o;
}

static json_t *state_json(const TrainState *ts, const char *source)
{
    char fp[1024];
    checkpoint_fingerprint(ts->spec, fp, sizeof fp);
    const LossScaler *ls = &ts->ls;
    return json_pack(
        "{s:s, s:i, s:{s:s, s:s, s:s}, s:s, s:s, s:I, s:I, s:I, s:I, s:o, s:{s:I, s:I},"
        " s:{s:f, s:I, s:I, s:I}, s:o, s:o}",
        "format", CHECKPOINT_FORMAT, "version", CHECKPOINT_VERSION,
        "model", "name", ts->spec->name, "fingerprint", fp, "source", source ? source : "",
        "policy", spec_precision_name(ts->policy), "optimizer", spec_optimizer_name(ts->spec->train.optimizer),
        "step", (json_int_t)ts->step, "total_steps", (json_int_t)ts->total_steps,
        "applied_steps", (json_int_t)ts->opt.step, "micro_step", (json_int_t)ts->micro_step,
        "seed", u64_str(ts->seed),
        "loader", "epoch", (json_int_t)ts->loader_epoch, "cursor", (json_int_t)ts->loader_cursor,
        "loss_scaler", "scale", ls->scale, "growth_tracker", (json_int_t)ls->growth_tracker,
        "consecutive_skips", (json_int_t)ls->consecutive_skips, "total_skips", (json_int_t)ls->total_skips,
        "best_metric", ts->has_best ? json_real(ts->best_metric) : json_null(), "settings", settings_json(ts));
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

/* The files a step directory holds besides the manifest, in manifest order. */
static const char *const ckpt_files[] = {"model.safetensors", "optimizer.safetensors", "state.json"};
enum { CKPT_FILES = sizeof ckpt_files / sizeof ckpt_files[0] };

/* SHA256SUMS: the digest of each file as written (read back from the
 * temporary directory), in `sha256sum` format. */
static HpcStatus write_manifest(const char *tmp, HpcError *err)
{
    char text[CKPT_FILES * 160] = "", path[4200], hex[SHA256_HEX_LEN + 1];
    size_t len = 0;
    for (int i = 0; i < CKPT_FILES; i++) {
        snprintf(path, sizeof path, "%s/%s", tmp, ckpt_files[i]);
        HpcStatus st = sha256_file(path, hex, err);
        if (st) return st;
        len += (size_t)snprintf(text + len, sizeof text - len, "%s  %s\n", hex, ckpt_files[i]);
    }
    snprintf(path, sizeof path, "%s/%s", tmp, CHECKPOINT_MANIFEST);
    return atomic_write_file(path, text, len, err);
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
    if (!st) st = write_manifest(tmp, err);
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

/* The digest SHA256SUMS lists for file, into hex; false when not listed. */
static bool manifest_digest(const char *manifest, const char *file, char hex[SHA256_HEX_LEN + 1])
{
    for (const char *line = manifest; *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        if (n == SHA256_HEX_LEN + 2 + strlen(file) && line[SHA256_HEX_LEN] == ' ' &&
            line[SHA256_HEX_LEN + 1] == ' ' && strncmp(line + SHA256_HEX_LEN + 2, file, strlen(file)) == 0) {
            memcpy(hex, line, SHA256_HEX_LEN);
            hex[SHA256_HEX_LEN] = '\0';
            return true;
        }
        line += n + (end != NULL);
    }
    return false;
}

/* Every file of the step directory (the optimizer's only when it is read)
 * against SHA256SUMS. */
static HpcStatus verify_files(const char *stepdir, bool optimizer, HpcError *err)
{
    char path[4200], manifest[CKPT_FILES * 160 + 1], want[SHA256_HEX_LEN + 1], got[SHA256_HEX_LEN + 1];
    snprintf(path, sizeof path, "%s/%s", stepdir, CHECKPOINT_MANIFEST);
    FILE *f = fopen(path, "r");
    if (!f)
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s is missing; the step directory is incomplete or "
                        "was written by an hpc without checksums; resume from another step directory", path);
    size_t n = fread(manifest, 1, sizeof manifest - 1, f);
    fclose(f);
    manifest[n] = '\0';
    for (int i = 0; i < CKPT_FILES; i++) {
        if (!optimizer && strcmp(ckpt_files[i], "optimizer.safetensors") == 0) continue;
        if (!manifest_digest(manifest, ckpt_files[i], want))
            return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s lists no checksum for %s; the manifest is "
                            "damaged; resume from another step directory", path, ckpt_files[i]);
        char file[4200];
        snprintf(file, sizeof file, "%s/%s", stepdir, ckpt_files[i]);
        HpcStatus st = sha256_file(file, got, err);
        if (st) return hpc_fail(err, HPC_ERR_INPUT, "%s; the step directory is incomplete", err->msg);
        if (strcmp(want, got) != 0)
            return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s is damaged: its SHA-256 is %.12s..., %s says "
                            "%.12s...; resume from another step directory (the previous one is kept with --keep "
                            "2 or more)", file, got, CHECKPOINT_MANIFEST, want);
    }
    return HPC_OK;
}

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
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s is not an %s version %d state file%s", path,
                        CHECKPOINT_FORMAT, CHECKPOINT_VERSION, version > 0 && version < CHECKPOINT_VERSION
                            ? " (it is an older version, without checksums and settings: retrain, or use "
                              "the hpc that wrote it)" : "");
    }
    *out = root;
    return HPC_OK;
}

static HpcStatus check_identity(const char *stepdir, json_t *root, const TrainState *ts, HpcError *err)
{
    const char *name = "?", *fp = "?", *optimizer = "?";
    json_unpack(root, "{s:{s:s, s:s}, s:s}", "model", "name", &name, "fingerprint", &fp, "optimizer", &optimizer);
    char mine[1024];
    checkpoint_fingerprint(ts->spec, mine, sizeof mine);
    if (strcmp(fp, mine) != 0)
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s was written by model '%s' (%s), not by this "
                        "model '%s' (%s); use the .model file that wrote it, or another checkpoint directory",
                        stepdir, name, fp, ts->spec->name, mine);
    if (ts->weights_only) return HPC_OK;
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

typedef struct {
    json_int_t step, total, applied, micro, epoch, cursor, growth, consec, skips;
    double scale;
} Counters;

/* Every counter against the range a run can produce, naming the key. */
static HpcStatus check_counters(const char *stepdir, const Counters *c, const LossScaleConfig *cfg, bool allow_changed,
                                HpcError *err)
{
    /* The growth tracker restarts at the interval; with another interval allowed it may be beyond it. */
    json_int_t interval = cfg->interval > 0 && !allow_changed ? cfg->interval : INT64_MAX / 2;
    struct { const char *key; json_int_t v, lo, hi; const char *hi_name; } r[] = {
        {"total_steps", c->total, 1, INT64_MAX / 2, "2^62"},
        {"step", c->step, 0, c->total, "total_steps"},
        {"applied_steps", c->applied, 0, c->step, "step"},
        {"micro_step", c->micro, c->step, INT64_MAX / 2, "2^62"},
        {"loader.epoch", c->epoch, 0, c->micro, "micro_step"},
        {"loader.cursor", c->cursor, 0, INT64_MAX / 2, "2^62"},
        {"loss_scaler.total_skips", c->skips, 0, c->step, "step"},
        {"loss_scaler.consecutive_skips", c->consec, 0, c->skips, "total_skips"},
        {"loss_scaler.growth_tracker", c->growth, 0, interval, "the growth interval"},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (r[i].v < r[i].lo || r[i].v > r[i].hi)
            return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s/state.json: %s is %lld, outside [%lld, %s = %lld]; "
                            "the file was changed by hand or by another program; resume from another step directory",
                            stepdir, r[i].key, (long long)r[i].v, (long long)r[i].lo, r[i].hi_name, (long long)r[i].hi);
    if (!(c->scale > 0 && c->scale <= FLT_MAX))
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s/state.json: loss_scaler.scale is %g, outside (0, %g]; "
                        "resume from another step directory", stepdir, c->scale, (double)FLT_MAX);
    return HPC_OK;
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
    HpcStatus st = check_counters(stepdir, &(Counters){step, total, applied, micro, epoch, cursor, growth, consec,
                                                     skips, scale}, &ts->ls.cfg, ts->allow_changed_settings, err);
    if (!st && !json_is_null(best) && !(json_is_number(best) && isfinite(json_number_value(best))))
        st = hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s/state.json: best_metric must be a finite number or "
                      "null; the file was changed by hand", stepdir);
    if (st) return st;
    ts->step = step;
    ts->total_steps = total;
    ts->opt.step = applied;
    ts->micro_step = micro;
    if (num_uint(seed, UINT64_MAX, &ts->seed) != NUM_OK)
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s/state.json: seed \"%.40s\" is not an integer in [0, "
                        "18446744073709551615]", stepdir, seed);
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

/* The saved settings against the run's: each difference "key old -> new". */
static HpcStatus compare_settings(const char *stepdir, json_t *root, TrainState *ts, HpcError *err)
{
    CheckpointSettings *now = xmalloc(sizeof *now);
    settings_of(ts, now);
    json_t *saved = json_object_get(root, "settings");
    char list[sizeof ts->changed] = "";
    size_t len = 0;
    int changes = 0;
    for (int i = 0; i < now->n; i++) {
        const char *old = json_string_value(json_object_get(saved, now->s[i].key));
        if (old && strcmp(old, now->s[i].value) == 0) continue;
        if (len < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s %s -> %s", changes ? ", " : "",
                                    now->s[i].key, old ? old : "(not recorded)", now->s[i].value);
        changes++;
    }
    const char *key;
    json_t *val;
    json_object_foreach(saved, key, val)
        if (!checkpoint_settings_get(now, key) && len < sizeof list) {
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s %s -> (not set)", changes ? ", " : "",
                                    key, json_is_string(val) ? json_string_value(val) : "?");
            changes++;
        }
    free(now);
    snprintf(ts->changed, sizeof ts->changed, "%s", list);
    if (!changes || ts->allow_changed_settings) return HPC_OK;
    return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s was written with other training settings: %.700s; resume "
                    "with the settings it was written with, or pass --allow-changed-settings to continue with the "
                    "new ones", stepdir, list);
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
    ts->changed[0] = '\0';
    HpcStatus st = ckfs_resolve(dir, stepdir, sizeof stepdir, err);
    if (!st) st = verify_files(stepdir, !ts->weights_only, err);
    if (!st) st = read_state(stepdir, &root, err);
    if (!st) st = check_identity(stepdir, root, ts, err);
    if (!st && !ts->weights_only) st = compare_settings(stepdir, root, ts, err);
    if (!st) st = read_file(stepdir, "model.safetensors", ts, false, err);
    if (!st && !ts->weights_only) st = read_file(stepdir, "optimizer.safetensors", ts, true, err);
    if (!st) st = read_scalars(stepdir, root, ts, err);
    json_decref(root);
    return st;
}

/* ------------------------------------------------------------------ */
/* The saved model (parsed by checkpoint_spec.c: the front end is not needed
 * to save or resume a run)                                             */

HpcStatus checkpoint_read_model_text(const char *dir, char **text, char *policy, size_t policy_cap, char *where,
                                     size_t where_cap, HpcError *err)
{
    char stepdir[4096];
    json_t *root = NULL;
    *text = NULL;
    if (policy_cap) policy[0] = 0;
    HpcStatus st = ckfs_resolve(dir, stepdir, sizeof stepdir, err);
    if (!st) st = verify_files(stepdir, false, err);
    if (!st) st = read_state(stepdir, &root, err);
    if (st) return st;
    const char *source = NULL, *pol = "";
    json_unpack(root, "{s:{s:s}, s?s}", "model", "source", &source, "policy", &pol);
    snprintf(where, where_cap, "%s/state.json (model.source)", stepdir);
    if (source) *text = xstrdup(source);
    if (policy_cap) snprintf(policy, policy_cap, "%s", pol);
    json_decref(root);
    return HPC_OK;
}

HpcStatus checkpoint_lock(const char *dir, CheckpointLock *lk, HpcError *err)
{
    return ckfs_lock(dir, &lk->fd, err);
}

void checkpoint_unlock(CheckpointLock *lk)
{
    ckfs_unlock(lk->fd);
    lk->fd = -1;
}

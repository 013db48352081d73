/* bench/grad_error.c — how far one training step's numbers are from fp64.
 *
 * On one fixed batch (the first N rows of a GLUE task's train split, padded
 * as the trainer pads them), with dropout off (or, with --dropout-seed S,
 * on, with the same masks in every run: the masks are a function of the
 * seed S, the batch's index as the step and each node's salt, identical on
 * the cpu and the GPU, fused or not), this program computes the
 * logits, the loss and every parameter gradient three ways:
 *   - the reference: the fp32 graph run by the cpu backend in double
 *     precision (CPU_EXEC_F64, no rounding anywhere);
 *   - hpc under a policy (fp16, bf16 or fp32) with one or more precision
 *     options (--keep: which values the policy keeps in f32, see
 *     compiler/precision.h), on the graph the trainer builds (the attention
 *     fused or not as compiler/attention_form.h chooses, or as --attention
 *     forces), on the cpu backend (which rounds every 16-bit value exactly
 *     as the GPU stores it) or on the GPU (--device cuda);
 * and prints the relative error of each against the reference:
 * ||x - ref||_2 / ||ref||_2 for the logits, the whole gradient (all
 * parameters as one vector) and groups of parameters (embeddings,
 * attention, FFN, LayerNorm, pooler, classifier); |x - ref| / |ref| for the
 * loss.  Gradients are unscaled (divided by --loss-scale) before comparing.
 *
 * The weights come from --init DIR (a Hugging Face folder: model.safetensors,
 * with or without the classifier; a missing head starts from hpc's
 * initializer with the model's seed), so PyTorch can start from the same
 * file (bench/finetune_quality.py measures AMP's error the same way on the
 * batch that --dump-batch writes).
 *
 * Usage:
 *   grad_error --model M.model --init DIR [--task cola] [--data DIR] [--vocab FILE]
 *              [--rows 32] [--batches 1] [--policy fp16] [--keep LIST]...
 *              [--device cpu|cuda] [--loss-scale 1024] [--dump-batch FILE.jsonl]
 *              [--json FILE.jsonl] [--dropout-seed S]
 * With --batches K the first K batches are measured and the errors
 * averaged over them; --dump-batch writes them, one JSON object a line.
 * --keep takes "none", "default", "all" or a comma list of embeddings,
 * residual, norm, grads, probs, act; repeat it to compare several plans
 * against one reference (default: "default").  Exit 0 on success, 1 on an
 * error, 2 on a usage error, 4 without a GPU for --device cuda. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compiler/attention_form.h"
#include "compiler/autodiff.h"
#include "compiler/fuse.h"
#include "compiler/fuse_qkv.h"
#include "compiler/lower.h"
#include "compiler/precision.h"
#include "cpu/cpu_exec.h"
#include "cuda/cuda_driver.h"
#include "cuda/cuda_exec.h"
#include "data/loader.h"
#include "data/tasks.h"
#include "formats/hf_init.h"
#include "train/init.h"
#include "compiler/spec_load.h"

#define MAX_VARIANTS 16

typedef struct {
    const char *model, *init, *task, *data, *vocab, *dump_batch, *json;
    const char *device;
    SpecPrecision policy;
    int64_t rows, batches;
    double loss_scale;
    long long dropout_seed;   /* < 0: dropout off */
    AttnForm attention;       /* the measured graphs' attention (the reference is exact either way) */
    int n_keep;
    unsigned keep[MAX_VARIANTS];
} Args;

/* Parameter groups of a BERT-family model, by Hugging Face name. */
enum { G_EMB, G_QKV, G_ATTN_OUT, G_FFN_IN, G_FFN_OUT, G_NORM, G_POOLER, G_CLASSIFIER, G_OTHER, N_GROUPS };
static const char *const group_names[N_GROUPS] = {"embeddings", "attn_qkv", "attn_out", "ffn_in", "ffn_out",
                                                  "layernorm", "pooler", "classifier", "other"};

static int group_of(const char *name)
{
    if (strstr(name, "LayerNorm") || strstr(name, "layer_norm") || strstr(name, "ln_")) return G_NORM;
    if (strstr(name, "embeddings")) return G_EMB;
    if (strstr(name, "attention.self")) return G_QKV;
    if (strstr(name, "attention.output")) return G_ATTN_OUT;
    if (strstr(name, "intermediate")) return G_FFN_IN;
    if (strstr(name, "output.dense")) return G_FFN_OUT;
    if (strstr(name, "pooler")) return G_POOLER;
    if (strstr(name, "classifier")) return G_CLASSIFIER;
    return G_OTHER;
}

typedef struct {
    double loss;
    double *logits;        /* (n_logits) */
    int64_t n_logits;
    double **grad;         /* (pl.n) unscaled gradients, NULL where none */
} StepNumbers;

static void numbers_free(StepNumbers *s, int n_params)
{
    free(s->logits);
    for (int p = 0; p < n_params && s->grad; p++) free(s->grad[p]);
    free(s->grad);
    memset(s, 0, sizeof *s);
}

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- the model -------------------------------------------------------- */

typedef struct {
    IrGraph g;
    ParamList pl;
    PrecisionPlan prec;
    bool fused_attention;    /* one ATTENTION node per layer (else the unfused chain) */
} Built;

/* lower -> autodiff -> precision (policy, keep) -> fuse: the trainer's graph,
 * with the attention in the form `form` gives under `policy` (AUTO: the
 * trainer's choice, fused under fp16/bf16; compiler/attention_form.h) and
 * Q/K/V stacked as compiler/pipeline.c stacks them (HPC_FUSE_QKV). */
static HpcStatus build(const ModelSpec *spec, SpecPrecision policy, unsigned keep, AttnForm form, Built *b,
                       HpcError *err)
{
    IrGraph raw, mixed;
    ir_init(&raw);
    ir_init(&mixed);
    ir_init(&b->g);
    params_init(&b->pl);
    bool fused_attention = false;
    HpcStatus st = attention_form_choose(spec, policy, form, &fused_attention, err);
    if (!st) st = lower_model_attention(spec, fused_attention, last_layer_first_requested(), &raw, &b->pl, err);
    if (!st && fused_attention && fuse_qkv_requested()) st = fuse_qkv_graph(&raw, &b->pl, NULL, err);
    b->fused_attention = fused_attention;
    if (!st) st = autodiff_build(&raw, &b->pl, err);
    /* HPC_WEIGHT_GRAD=low: the LINEARs' weight gradients (and the Q/K/V bias's) low, as AMP keeps them */
    const char *wg = getenv("HPC_WEIGHT_GRAD");
    PrecisionOptions o = {.keep_f32 = keep, .low_weight_grads = wg && strcmp(wg, "low") == 0};
    PrecisionPlan pp;
    memset(&pp, 0, sizeof pp);
    if (!st) st = precision_plan_opts(&raw, spec, policy, &o, &mixed, &pp, err);
    if (!st) st = fuse_graph(&mixed, &pp, &b->g, &b->prec, NULL, err);
    precision_plan_free(&pp);
    ir_free(&mixed);
    ir_free(&raw);
    return st;
}

static void built_free(Built *b)
{
    precision_plan_free(&b->prec);
    ir_free(&b->g);
    params_free(&b->pl);
}

/* ---- runs ------------------------------------------------------------- */

/* Dropout of one measured batch: off, or on with masks from (seed, step). */
typedef struct { bool on; uint64_t seed; uint32_t step; } DropoutDraw;

static HpcStatus reference_run(const Built *b, const ParamStore *ps, const Batch *batch, DropoutDraw dd,
                               StepNumbers *out, HpcError *err)
{
    CpuExec ex;
    cpu_exec_init(&ex, &b->g, CPU_EXEC_F64);
    double **w64 = xcalloc((size_t)b->pl.n, sizeof *w64);
    for (int p = 0; p < b->pl.n; p++) {
        if (b->pl.p[p].tied_to >= 0) continue;
        int64_t n = params_numel(&b->pl.p[p]);
        w64[p] = xmalloc((size_t)n * sizeof(double));
        for (int64_t i = 0; i < n; i++) w64[p][i] = ps->w[p][i];
        cpu_exec_bind_param(&ex, p, w64[p]);
    }
    CpuRunOptions o = {.training = dd.on, .backward = true, .seed = dd.seed, .step = dd.step, .loss_scale = 1.0};
    HpcStatus st = cpu_exec_run(&ex, batch, &o, err);
    if (!st) {
        out->loss = cpu_exec_loss(&ex);
        out->n_logits = cpu_exec_numel(&ex, b->g.logits);
        out->logits = xmalloc((size_t)out->n_logits * sizeof(double));
        memcpy(out->logits, cpu_exec_value(&ex, b->g.logits), (size_t)out->n_logits * sizeof(double));
        out->grad = xcalloc((size_t)b->pl.n, sizeof *out->grad);
        for (int p = 0; p < b->pl.n; p++) {
            int v = b->g.param_grad[p];
            if (v < 0) continue;
            int64_t n = params_numel(&b->pl.p[p]);
            out->grad[p] = xmalloc((size_t)n * sizeof(double));
            memcpy(out->grad[p], cpu_exec_value(&ex, v), (size_t)n * sizeof(double));
        }
    }
    for (int p = 0; p < b->pl.n; p++) free(w64[p]);
    free(w64);
    cpu_exec_free(&ex);
    return st;
}

/* Copies f32 value `src` (n elements), divided by `div`, into a new double array. */
static double *widen(const float *src, int64_t n, double div)
{
    double *d = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) d[i] = (double)src[i] / div;
    return d;
}

static HpcStatus cpu_run(const Built *b, const ParamStore *ps, const Batch *batch, DropoutDraw dd, double scale,
                         StepNumbers *out, HpcError *err)
{
    CpuExec ex;
    cpu_exec_init(&ex, &b->g, CPU_EXEC_F32);
    for (int p = 0; p < b->pl.n; p++)
        if (b->pl.p[p].tied_to < 0) cpu_exec_bind_param(&ex, p, ps->w[p]);
    CpuRunOptions o = {.training = dd.on, .backward = true, .seed = dd.seed, .step = dd.step, .loss_scale = scale};
    HpcStatus st = cpu_exec_run(&ex, batch, &o, err);
    if (!st) {
        out->loss = cpu_exec_loss(&ex);
        out->n_logits = cpu_exec_numel(&ex, b->g.logits);
        out->logits = widen(cpu_exec_value(&ex, b->g.logits), out->n_logits, 1.0);
        out->grad = xcalloc((size_t)b->pl.n, sizeof *out->grad);
        for (int p = 0; p < b->pl.n; p++)
            if (b->g.param_grad[p] >= 0)
                out->grad[p] = widen(cpu_exec_value(&ex, b->g.param_grad[p]), params_numel(&b->pl.p[p]), scale);
    }
    cpu_exec_free(&ex);
    return st;
}

static HpcStatus cuda_run(const Built *b, const ParamStore *ps, const Batch *batch, DropoutDraw dd, double scale,
                          StepNumbers *out, HpcError *err)
{
    static CudaDevice dev;
    static bool open;
    HpcStatus st = HPC_OK;
    if (!open && (st = cuda_device_open(&dev, 0, err))) return st;
    open = true;
    CudaExec ex;
    memset(&ex, 0, sizeof ex);
    st = cuda_exec_init(&ex, &dev, &b->g, &b->pl, batch->B, batch->L, err);
    if (!st) st = cuda_exec_set_params(&ex, ps->w, err);
    CudaRunOptions o = {.training = dd.on, .backward = true, .seed = dd.seed, .step = dd.step, .loss_scale = scale};
    if (!st) st = cuda_exec_run(&ex, batch, &o, err);
    if (!st) st = cuda_exec_loss(&ex, &out->loss, err);
    if (!st) {
        int64_t nl = ir_numel(&b->g.nodes[b->g.logits], batch->B, batch->L);
        float *tmp = xmalloc((size_t)nl * sizeof(float));
        st = cuda_exec_read(&ex, b->g.logits, tmp, err);
        out->n_logits = nl;
        out->logits = widen(tmp, nl, 1.0);
        free(tmp);
        out->grad = xcalloc((size_t)b->pl.n, sizeof *out->grad);
        for (int p = 0; p < b->pl.n && !st; p++) {
            if (b->g.param_grad[p] < 0) continue;
            int64_t n = params_numel(&b->pl.p[p]);
            float *g = xmalloc((size_t)n * sizeof(float));
            st = cuda_exec_read(&ex, b->g.param_grad[p], g, err);
            out->grad[p] = widen(g, n, scale);
            free(g);
        }
    }
    cuda_exec_free(&ex);
    return st;
}

/* ---- comparison ------------------------------------------------------- */

typedef struct {
    double logits, loss, grad, group[N_GROUPS];
    bool finite;
} Errors;

static void accumulate(const double *x, const double *r, int64_t n, double *num, double *den, bool *finite)
{
    for (int64_t i = 0; i < n; i++) {
        double d = x[i] - r[i];
        if (!isfinite(x[i])) *finite = false;
        *num += d * d;
        *den += r[i] * r[i];
    }
}

static Errors compare(const Built *b, const StepNumbers *x, const StepNumbers *ref)
{
    Errors e = {.finite = isfinite(x->loss)};
    double num = 0, den = 0, gnum[N_GROUPS] = {0}, gden[N_GROUPS] = {0};
    accumulate(x->logits, ref->logits, ref->n_logits, &num, &den, &e.finite);
    e.logits = sqrt(num) / sqrt(den);
    e.loss = fabs(x->loss - ref->loss) / fabs(ref->loss);
    num = den = 0;
    for (int p = 0; p < b->pl.n; p++) {
        if (!ref->grad[p] || !x->grad[p]) continue;
        int g = group_of(b->pl.p[p].name);
        accumulate(x->grad[p], ref->grad[p], params_numel(&b->pl.p[p]), &gnum[g], &gden[g], &e.finite);
    }
    for (int g = 0; g < N_GROUPS; g++) {
        num += gnum[g];
        den += gden[g];
        e.group[g] = gden[g] > 0 ? sqrt(gnum[g]) / sqrt(gden[g]) : NAN;
    }
    e.grad = sqrt(num) / sqrt(den);
    if (!e.finite) e.logits = e.loss = e.grad = NAN;
    return e;
}

/* ---- input ------------------------------------------------------------ */

static void usage(void)
{
    fputs("usage: grad_error --model M.model --init DIR [--task cola] [--data DIR] [--vocab FILE]\n"
          "                  [--rows 32] [--batches 1] [--policy fp16|bf16|fp32] [--keep LIST]...\n"
          "                  [--device cpu|cuda] [--loss-scale 1024] [--dump-batch FILE.jsonl]\n"
          "                  [--json FILE.jsonl] [--dropout-seed S] [--attention auto|fused|unfused]\n"
          "--keep: none, default, all, or a comma list of embeddings, residual, norm, grads, probs, act\n"
          "--dropout-seed: dropout on, the same masks in every run (seed S, the batch index as the step)\n"
          "--attention: the form of the measured graphs' attention (default auto: the trainer's, fused\n"
          "             under fp16/bf16; HPC_ATTENTION in the environment overrides auto)\n"
          "HPC_WEIGHT_GRAD=low in the environment: every plan keeps the LINEARs' weight gradients\n"
          "(and the Q/K/V bias's) in 16 bits, as PyTorch AMP does (compiler/precision.h)\n",
          stderr);
}

static int parse_args(int argc, char **argv, Args *a)
{
    *a = (Args){.task = "cola", .device = "cpu", .policy = PREC_FP16, .rows = 32, .batches = 1, .loss_scale = 1024,
                .dropout_seed = -1};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(o, "-h") == 0 || strcmp(o, "--help") == 0) {
            usage();
            exit(0);
        }
        if (!v) {
            fprintf(stderr, "grad_error: %s needs a value\n", o);
            return 2;
        }
        i++;
        char *end = NULL;
        if (strcmp(o, "--model") == 0) a->model = v;
        else if (strcmp(o, "--init") == 0) a->init = v;
        else if (strcmp(o, "--task") == 0) a->task = v;
        else if (strcmp(o, "--data") == 0) a->data = v;
        else if (strcmp(o, "--vocab") == 0) a->vocab = v;
        else if (strcmp(o, "--dump-batch") == 0) a->dump_batch = v;
        else if (strcmp(o, "--json") == 0) a->json = v;
        else if (strcmp(o, "--device") == 0 && (strcmp(v, "cpu") == 0 || strcmp(v, "cuda") == 0)) a->device = v;
        else if (strcmp(o, "--policy") == 0 && strcmp(v, "fp16") == 0) a->policy = PREC_FP16;
        else if (strcmp(o, "--policy") == 0 && strcmp(v, "bf16") == 0) a->policy = PREC_BF16;
        else if (strcmp(o, "--policy") == 0 && strcmp(v, "fp32") == 0) a->policy = PREC_FP32;
        else if (strcmp(o, "--rows") == 0 && (a->rows = strtoll(v, &end, 10)) >= 1 && a->rows <= 4096 && !*end) {
        } else if (strcmp(o, "--batches") == 0 && (a->batches = strtoll(v, &end, 10)) >= 1 && a->batches <= 64 &&
                   !*end) {
        } else if (strcmp(o, "--loss-scale") == 0 && (a->loss_scale = strtod(v, &end)) > 0 && !*end &&
                   isfinite(a->loss_scale)) {
        } else if (strcmp(o, "--dropout-seed") == 0 && (a->dropout_seed = strtoll(v, &end, 10)) >= 0 &&
                   a->dropout_seed <= 0xffffffffll && !*end) {
        } else if (strcmp(o, "--attention") == 0 && (strcmp(v, "auto") == 0 || strcmp(v, "fused") == 0 ||
                                                      strcmp(v, "unfused") == 0)) {
            a->attention = v[0] == 'a' ? ATTN_FORM_AUTO : v[0] == 'f' ? ATTN_FORM_FUSED : ATTN_FORM_UNFUSED;
        } else if (strcmp(o, "--keep") == 0 && a->n_keep < MAX_VARIANTS &&
                   precision_keep_parse(v, &a->keep[a->n_keep])) {
            a->n_keep++;
        } else {
            fprintf(stderr, "grad_error: bad option or value: %s %s\n", o, v);
            usage();
            return 2;
        }
    }
    if (!a->model || !a->init) {
        fprintf(stderr, "grad_error: --model and --init are required\n");
        usage();
        return 2;
    }
    if (a->n_keep == 0) a->keep[a->n_keep++] = PREC_KEEP_DEFAULT;
    return 0;
}

/* One batch as a JSON line, for PyTorch to run the same numbers. */
static void dump_batch(FILE *f, const Batch *b)
{
    const char *keys[3] = {"input_ids", "token_type_ids", "attention_mask"};
    const int32_t *arr[3] = {b->input_ids, b->token_type_ids, b->attention_mask};
    fputc('{', f);
    for (int k = 0; k < 3; k++) {
        fprintf(f, "%s\"%s\": [", k ? ", " : "", keys[k]);
        for (int64_t r = 0; r < b->B; r++) {
            fprintf(f, "%s[", r ? ", " : "");
            for (int64_t t = 0; t < b->L; t++) fprintf(f, "%s%d", t ? ", " : "", (int)arr[k][r * b->L + t]);
            fputc(']', f);
        }
        fputc(']', f);
    }
    fputs(", \"labels\": [", f);
    for (int64_t r = 0; r < b->B; r++) fprintf(f, "%s%d", r ? ", " : "", (int)b->labels[r]);
    fputs("]}\n", f);
}

static void print_errors(FILE *out, const char *label, const Errors *e)
{
    fprintf(out, "%-44s logits %.3e  loss %.3e  grad %.3e |", label, e->logits, e->loss, e->grad);
    for (int g = 0; g < N_GROUPS; g++)
        if (!isnan(e->group[g])) fprintf(out, " %s %.2e", group_names[g], e->group[g]);
    fputc('\n', out);
}

static void json_errors(FILE *f, const Args *a, const char *keep, bool fused_attention, int batches, const Errors *e,
                        double secs, double ref_loss)
{
    fprintf(f, "{\"kind\": \"grad\", \"impl\": \"hpc\", \"ref_loss\": %.12f, \"attention\": \"%s\",", ref_loss,
            fused_attention ? "fused" : "unfused");
    if (a->dropout_seed >= 0) fprintf(f, " \"dropout_seed\": %lld,", a->dropout_seed);
    fprintf(f, " \"device\": \"%s\", \"policy\": \"%s\", \"keep\": \"%s\", \"rows\": %lld, "
               "\"batches\": %d, \"loss_scale\": %g, \"logits\": %.6e, \"loss\": %.6e, \"grad\": %.6e, "
               "\"seconds\": %.2f, \"groups\": {",
            a->device, spec_precision_name(a->policy), keep, (long long)a->rows, batches, a->loss_scale,
            e->logits, e->loss, e->grad, secs);
    bool first = true;
    for (int g = 0; g < N_GROUPS; g++)
        if (!isnan(e->group[g])) {
            fprintf(f, "%s\"%s\": %.6e", first ? "" : ", ", group_names[g], e->group[g]);
            first = false;
        }
    fputs("}}\n", f);
}

/* ---- main ------------------------------------------------------------- */

/* The first a->batches batches of a->rows rows of the task's train split,
 * in file order, padded as the trainer pads them. */
static int load_batches(const Args *a, const ModelSpec *spec, TaskData *task, Batch **out, HpcError *err)
{
    char vocab[4096];
    const char *vp = a->vocab;
    if (!vp) {   /* the init folder's vocabulary, as `hpc run --init` */
        snprintf(vocab, sizeof vocab, "%s/vocab.txt", a->init);
        FILE *f = fopen(vocab, "r");
        if (f) fclose(f), vp = vocab;
    }
    if (task_load(a->task, a->data, vp, false, spec->train.max_seq_len, false, task, err)) return 0;
    Loader ld;
    if (loader_init(&ld, &task->train, a->rows, spec->train.max_seq_len, 0, false, false, err)) return 0;
    int n = 0;
    while (n < a->batches && (out[n] = loader_next(&ld)) && out[n]->B == a->rows) n++;
    loader_free(&ld);
    if (n < a->batches) hpc_fail(err, HPC_ERR_INPUT, "%s train has fewer than %lld full batches of %lld rows",
                                 a->task, (long long)a->batches, (long long)a->rows);
    return n;
}

typedef struct {
    Built b;
    Errors sum;            /* summed over batches */
    double seconds;
} Variant;

static void add_errors(Errors *sum, const Errors *e)
{
    sum->logits += e->logits;
    sum->loss += e->loss;
    sum->grad += e->grad;
    for (int g = 0; g < N_GROUPS; g++) sum->group[g] += e->group[g];
}

static void scale_errors(Errors *e, double k)
{
    e->logits *= k;
    e->loss *= k;
    e->grad *= k;
    for (int g = 0; g < N_GROUPS; g++) e->group[g] *= k;
}

int main(int argc, char **argv)
{
    Args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc;
    ModelSpec spec;
    if (spec_load(a.model, &spec, stderr) != 0) return 1;
    HpcError err = {0};
    TaskData task;
    memset(&task, 0, sizeof task);
    Batch *batches[64] = {0};
    int nb = load_batches(&a, &spec, &task, batches, &err);
    if (nb < a.batches) {
        fprintf(stderr, "grad_error: %s\n", err.msg);
        return 1;
    }
    if (a.dump_batch) {
        FILE *f = fopen(a.dump_batch, "w");
        if (!f) return perror(a.dump_batch), 1;
        for (int i = 0; i < nb; i++) dump_batch(f, batches[i]);
        if (fclose(f)) return perror(a.dump_batch), 1;
    }
    Built ref;
    ParamStore ps = {0};
    /* The reference takes the measured graphs' attention form: the dropout
     * salts are node ids of lowering, so the fused and unfused graphs draw
     * different masks (with dropout off they compute the same function). */
    bool fused_attention = false;
    HpcStatus st = attention_form_choose(&spec, a.policy, a.attention, &fused_attention, &err);
    if (!st) st = build(&spec, PREC_FP32, 0, fused_attention ? ATTN_FORM_FUSED : ATTN_FORM_UNFUSED, &ref, &err);
    if (!st) st = init_store(&ps, &ref.pl, spec.train.seed, &err);
    HfInitReport rep;
    if (!st) st = hf_init_load(a.init, &ref.pl, ps.w, &rep, &err);
    if (st) {
        fprintf(stderr, "grad_error: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "grad_error: %s, %d batch(es) of %lld rows from %s train; weights %s (%d loaded, %d new)\n",
            spec.name, nb, (long long)a.rows, a.task, rep.path, rep.n_loaded, rep.n_new);
    Variant *var = xcalloc((size_t)a.n_keep, sizeof *var);
    for (int v = 0; v < a.n_keep && !st; v++) st = build(&spec, a.policy, a.keep[v], a.attention, &var[v].b, &err);
    bool cuda = strcmp(a.device, "cuda") == 0;
    double ref_loss = NAN;   /* the first batch's: the same number PyTorch's fp64 run must give */
    double scale = a.policy == PREC_FP32 ? 1.0 : a.loss_scale;
    for (int i = 0; i < nb && !st; i++) {
        StepNumbers r = {0};
        DropoutDraw dd = {a.dropout_seed >= 0, (uint64_t)(a.dropout_seed >= 0 ? a.dropout_seed : 0), (uint32_t)i};
        double t0 = seconds();
        if ((st = reference_run(&ref, &ps, batches[i], dd, &r, &err))) break;
        if (i == 0) ref_loss = r.loss;
        fprintf(stderr, "grad_error: batch %d (%lld x %lld): fp64 reference in %.1f s, loss %.9f\n", i,
                (long long)batches[i]->B, (long long)batches[i]->L, seconds() - t0, r.loss);
        for (int v = 0; v < a.n_keep && !st; v++) {
            StepNumbers x = {0};
            t0 = seconds();
            st = cuda ? cuda_run(&var[v].b, &ps, batches[i], dd, scale, &x, &err)
                      : cpu_run(&var[v].b, &ps, batches[i], dd, scale, &x, &err);
            var[v].seconds += seconds() - t0;
            if (!st) {
                Errors e = compare(&var[v].b, &x, &r);
                add_errors(&var[v].sum, &e);
            }
            numbers_free(&x, var[v].b.pl.n);
        }
        numbers_free(&r, ref.pl.n);
    }
    FILE *json = a.json && !st ? fopen(a.json, "a") : NULL;
    if (a.json && !st && !json) {
        perror(a.json);
        st = HPC_ERR_IO;
    }
    for (int v = 0; v < a.n_keep && !st; v++) {   /* the mean over batches */
        char keep[128], label[200];
        precision_keep_format(var[v].b.prec.keep_f32, keep, sizeof keep);
        snprintf(label, sizeof label, "hpc %s %s keep=%s %s%s", a.device, spec_precision_name(a.policy), keep,
                 var[v].b.fused_attention ? "fused" : "unfused", a.dropout_seed >= 0 ? " dropout" : "");
        scale_errors(&var[v].sum, 1.0 / nb);
        print_errors(stdout, label, &var[v].sum);
        if (json) json_errors(json, &a, keep, var[v].b.fused_attention, nb, &var[v].sum, var[v].seconds, ref_loss);
    }
    if (st && st != HPC_ERR_IO) fprintf(stderr, "grad_error: %s\n", err.msg);
    if (json) fclose(json);
    for (int v = 0; v < a.n_keep; v++) built_free(&var[v].b);
    free(var);
    init_store_free(&ps);
    built_free(&ref);
    for (int i = 0; i < nb; i++) batch_free(batches[i]);
    task_free(&task);
    return st == HPC_ERR_NO_GPU ? 4 : st ? 1 : 0;
}

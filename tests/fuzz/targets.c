/* tests/fuzz/targets.c — see targets.h. */
#include "tests/fuzz/targets.h"

#include <ftw.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "program/artifact.h"
#include "compiler/artifact_spec.h"
#include "compiler/lower.h"
#include "data/glue.h"
#include "data/tokenizer.h"
#include "formats/hf_names.h"
#include "formats/safetensors.h"
#include "report/plot_svg.h"
#include "train/checkpoint.h"

/* ---- shared helpers ----------------------------------------------------- */

static char fuzz_dir_path[256];

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void fuzz_dir_remove(void)
{
    nftw(fuzz_dir_path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* The private temp folder, removed when the process exits. */
static const char *fuzz_dir(void)
{
    if (!fuzz_dir_path[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/hpc_fuzz_%d", base, (int)getpid());
        mkdir(fuzz_dir_path, 0700);
        atexit(fuzz_dir_remove);
    }
    return fuzz_dir_path;
}

/* dir/name, in a static buffer of its own per call site's slot. */
static const char *fuzz_tmp_path(const char *name)
{
    static char paths[8][400];
    static int k;
    char *p = paths[k++ % 8];
    snprintf(p, sizeof paths[0], "%s/%s", fuzz_dir(), name);
    return p;
}

static void write_file(const char *path, const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f) abort();   /* the harness's own temp folder: not the input's fault */
    if (size && fwrite(data, 1, size, f) != size) abort();
    if (fclose(f) != 0) abort();
}

static const char *root_file(const char *rel)
{
    static char buf[4][1024];
    static int k;
    const char *root = getenv("HPC_ROOT");
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", root && root[0] ? root : ".", rel);
    return b;
}

/* ---- safetensors -------------------------------------------------------- */

/* Accepted files: every tensor is found by name, copied, scanned for NaN;
 * the family detection reads the names. */
int fuzz_target_safetensors(const uint8_t *data, size_t size)
{
    StFile *f;
    HpcError err;
    if (st_open_memory(data, size, "fuzz.safetensors", &f, &err) != HPC_OK) return 0;
    static unsigned char copy[1 << 16];
    for (int64_t i = 0; i < st_count(f); i++) {
        const StTensor *t = st_tensor(f, i);
        if (st_find(f, t->name) != t || st_tensor_index(f, t) != i) __builtin_trap();
        if (t->nbytes != t->numel * st_dtype_size(t->dtype)) __builtin_trap();
        if (t->nbytes <= sizeof copy) (void)st_tensor_copy(t, copy, sizeof copy, &err);
        (void)st_tensor_check_finite(f, t, &err);
    }
    for (int64_t i = 0; i < st_metadata_count(f); i++) {
        const char *k, *v;
        st_metadata_at(f, i, &k, &v);
        if (st_metadata_get(f, k) == NULL) __builtin_trap();
    }
    (void)hf_names_detect(f);
    st_close(f);
    return 0;
}

/* ---- artifacts (program/artifact.c) ------------------------------------ */

int fuzz_target_artifact(const uint8_t *data, size_t size)
{
    static FILE *sink;
    if (!sink) sink = fopen("/dev/null", "w");
    const char *path = fuzz_tmp_path("fuzz.hpc");
    write_file(path, data, size);
    Artifact a;
    HpcError err;
    if (artifact_read(path, &a, &err) == HPC_OK) {
        if (!a.model_text) __builtin_trap();
        artifact_free(&a);
    }
    ModelSpec spec;
    SpecPrecision policy;
    (void)artifact_load_spec(path, &spec, &policy, sink, &err);
    return 0;
}

/* ---- checkpoint state (state.json of a step directory) ------------------ */

typedef struct {
    ModelSpec spec;
    IrGraph g;
    ParamList pl;
    float **w, **m, **v;
    TrainState ts;
    char stepdir[512];
} CkptFixture;

/* A tiny model, saved once as a real checkpoint; each input replaces its
 * state.json.  The tensors are valid, so the state file is what is fuzzed. */
static CkptFixture *ckpt_fixture(void)
{
    static CkptFixture fx;
    static bool ready;
    if (ready) return &fx;
    spec_defaults(&fx.spec);
    snprintf(fx.spec.name, sizeof fx.spec.name, "fuzz_tiny");
    fx.spec.stack.vocab_size = 16;
    fx.spec.stack.max_positions = 8;
    fx.spec.stack.hidden = 4;
    fx.spec.stack.layers = 1;
    fx.spec.stack.heads = 1;
    fx.spec.stack.ffn = 8;
    ir_init(&fx.g);
    params_init(&fx.pl);
    HpcError err;
    if (lower_model(&fx.spec, &fx.g, &fx.pl, &err) != HPC_OK) abort();
    fx.w = calloc((size_t)fx.pl.n, sizeof *fx.w);
    fx.m = calloc((size_t)fx.pl.n, sizeof *fx.m);
    fx.v = calloc((size_t)fx.pl.n, sizeof *fx.v);
    for (int i = 0; i < fx.pl.n; i++) {
        if (fx.pl.p[i].tied_to >= 0) continue;
        size_t n = (size_t)params_numel(&fx.pl.p[i]);
        fx.w[i] = calloc(n, sizeof(float));
        fx.m[i] = calloc(n, sizeof(float));
        fx.v[i] = calloc(n, sizeof(float));
    }
    fx.ts = (TrainState){.spec = &fx.spec, .pl = &fx.pl, .policy = PREC_FP32, .w = fx.w, .m = fx.m, .v = fx.v,
                         .step = 1, .opt.step = 1, .total_steps = 4, .seed = 7};
    ls_config_from_spec(&fx.ts.ls.cfg, &fx.spec.train);
    fx.ts.ls.scale = 1024;
    const char *root = fuzz_tmp_path("ckpt");
    if (checkpoint_save(root, &fx.ts, &err) != HPC_OK) abort();
    if (checkpoint_resolve(root, fx.stepdir, sizeof fx.stepdir, &err) != HPC_OK) abort();
    ready = true;
    return &fx;
}

int fuzz_target_checkpoint_state(const uint8_t *data, size_t size)
{
    CkptFixture *fx = ckpt_fixture();
    char path[600];
    snprintf(path, sizeof path, "%s/state.json", fx->stepdir);
    write_file(path, data, size);
    TrainState ts = fx->ts;
    HpcError err;
    (void)checkpoint_load(fx->stepdir, &ts, &err);
    ModelSpec spec;
    SpecPrecision policy;
    (void)checkpoint_read_spec(fx->stepdir, &spec, &policy, &err);
    return 0;
}

/* ---- JSONL run logs (hpc plot) ------------------------------------------ */

int fuzz_target_runlog(const uint8_t *data, size_t size)
{
    const char *log = fuzz_tmp_path("run.jsonl"), *svg = fuzz_tmp_path("run.svg");
    write_file(log, data, size);
    HpcError err;
    (void)plot_runlog(log, svg, &err);
    return 0;
}

/* ---- TSV / CSV rows (GLUE and generic readers) -------------------------- */

static const Tokenizer *fuzz_tokenizer(void)
{
    static Tokenizer *tok;
    if (!tok) {
        HpcError err;
        if (tokenizer_load(root_file("data/vocab/bert-base-uncased-vocab.txt"), true, &tok, &err) != HPC_OK) {
            fprintf(stderr, "fuzz: %s (run from the repository root or set HPC_ROOT)\n", err.msg);
            abort();
        }
    }
    return tok;
}

/* The first byte picks the task and options, the rest is the file. */
int fuzz_target_tsv(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint8_t sel = data[0];
    const char *path = fuzz_tmp_path("rows.tsv");
    write_file(path, data + 1, size - 1);
    GlueOptions o = glue_options((GlueTask)(sel % GLUE_TASK_COUNT), 1 + (sel >> 4) * 8);
    o.skip_bad_rows = (sel >> 6) & 1;
    if (o.task == GLUE_GENERIC) {
        o.delimiter = sel & 0x20 ? ',' : '\t';
        o.header = !(sel & 0x10);
        o.text_a = o.header ? "text" : "0";
        o.text_b = sel & 0x80 ? (o.header ? "text2" : "2") : NULL;
        o.label = o.header ? "label" : "1";
        o.label_names = sel & 0x40 ? "neg,pos" : NULL;
        o.regression = (sel & 0xc0) == 0x80;
    }
    Dataset d;
    dataset_init(&d, "fuzz");
    GlueReport rep;
    HpcError err;
    if (glue_read(path, &o, fuzz_tokenizer(), &d, &rep, &err) == HPC_OK) {
        for (int64_t i = 0; i < d.n; i++)
            if (d.ex[i].len < 1 || d.ex[i].len > o.max_len) __builtin_trap();
        if (rep.rows != d.n) __builtin_trap();
    }
    dataset_free(&d);
    return 0;
}

/* ---- vocab files -------------------------------------------------------- */

/* Accepted vocabularies tokenize a fixed text and the input's own bytes. */
int fuzz_target_vocab(const uint8_t *data, size_t size)
{
    const char *path = fuzz_tmp_path("vocab.txt");
    write_file(path, data, size);
    Tokenizer *tok;
    HpcError err;
    if (tokenizer_load(path, size & 1, &tok, &err) != HPC_OK) return 0;
    TokEncoding e = {0};
    (void)tokenizer_encode(tok, "Hello, wörld! unaffable 東京 [SEP] x", NULL, 64, &e, &err);
    size_t half = size / 2;
    (void)tokenizer_encode_n(tok, (const char *)data, half, (const char *)data + half, size - half, 128, &e, &err);
    for (int64_t id = 0; id < tokenizer_vocab_size(tok); id++)
        if (!tokenizer_token(tok, (int32_t)id)) __builtin_trap();
    tok_encoding_free(&e);
    tokenizer_free(tok);
    return 0;
}

const FuzzTarget fuzz_targets[] = {
    {"safetensors", fuzz_target_safetensors},
    {"artifact", fuzz_target_artifact},
    {"checkpoint_state", fuzz_target_checkpoint_state},
    {"runlog", fuzz_target_runlog},
    {"tsv", fuzz_target_tsv},
    {"vocab", fuzz_target_vocab},
    {NULL, NULL},
};

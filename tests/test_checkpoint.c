/* tests/test_checkpoint.c — training checkpoints (runtime/train/checkpoint.h),
 * the stop signals (runtime/train/signals.h) and the export to a transformers
 * folder (runtime/formats/hf_config.h hf_config_write + hf_names_save).
 *
 * Every tensor holds Philox normals keyed by (step / 1000, parameter, buffer), so
 * a loaded state can be checked against the state of the step it claims
 * without keeping copies, and no two buffers are alike.  Scalars are odd
 * values (a scale with a long mantissa, a 64-bit seed) so that a lossy
 * round trip through JSON would show.
 *
 * The kill test forks a child that saves a ~14 MB state in a loop, kills it
 * with SIGKILL at random moments, and requires after every kill that the
 * checkpoint loads and equals the saved state of the step it names.
 *
 * The bitwise resume test of a whole run (train N steps vs. train k, stop,
 * resume, train to N) needs the trainer hooks of docs/resume.md; it is
 * there, to be added to tests/test_train_cpu.c with the patch.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "train/checkpoint.h"
#include "train/checkpoint_hash.h"
#include "formats/hf_config.h"
#include "formats/hf_init.h"
#include "formats/hf_names.h"
#include "lower.h"
#include "cpu/philox.h"
#include "train/signals.h"

typedef struct {
    ModelSpec spec;
    IrGraph g;
    ParamList pl;
    float **w, **m, **v;   /* (pl.n) (numel) f32; NULL for tied parameters */
    TrainState ts;
} Fixture;

static void tiny_spec(ModelSpec *s, int64_t vocab, int64_t hidden)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "ckpt_tiny");
    s->stack.vocab_size = vocab;
    s->stack.max_positions = 64;
    s->stack.hidden = hidden;
    s->stack.layers = 2;
    s->stack.heads = 2;
    s->stack.ffn = 2 * hidden;
    s->train.max_seq_len = 32;
    s->train.seed = 0x7edcba9876543210ull;
}

/* Lowers spec and allocates zeroed buffers; freeze the first layer's
 * parameters' optimizer state (m = v = NULL) for one parameter, as frozen
 * parameters have none. */
static void fixture_init(Fixture *f, const ModelSpec *spec)
{
    memset(f, 0, sizeof *f);
    f->spec = *spec;
    ir_init(&f->g);
    params_init(&f->pl);
    HpcError err = {0};
    cr_assert_eq(lower_model(&f->spec, &f->g, &f->pl, &err), HPC_OK, "%s", err.msg);
    f->w = calloc((size_t)f->pl.n, sizeof *f->w);
    f->m = calloc((size_t)f->pl.n, sizeof *f->m);
    f->v = calloc((size_t)f->pl.n, sizeof *f->v);
    for (int i = 0; i < f->pl.n; i++) {
        if (f->pl.p[i].tied_to >= 0) continue;
        size_t n = (size_t)params_numel(&f->pl.p[i]);
        f->w[i] = calloc(n, sizeof(float));
        if (i != 1) {   /* parameter 1 has no optimizer state */
            f->m[i] = calloc(n, sizeof(float));
            f->v[i] = calloc(n, sizeof(float));
        }
    }
    f->ts = (TrainState){.spec = &f->spec, .pl = &f->pl, .policy = PREC_FP16, .w = f->w, .m = f->m, .v = f->v};
    ls_config_from_spec(&f->ts.ls.cfg, &f->spec.train);
}

static void fixture_free(Fixture *f)
{
    for (int i = 0; i < f->pl.n; i++) {
        free(f->w[i]);
        free(f->m[i]);
        free(f->v[i]);
    }
    free(f->w);
    free(f->m);
    free(f->v);
    params_free(&f->pl);
    ir_free(&f->g);
}

/* The tensors of every step in [1000 c, 1000 c + 999] (c = k / 1000): the
 * kill test's child fills them once and then only changes the scalars, so
 * that its time goes to saving. */
static void fill_tensors(Fixture *f, int64_t k)
{
    uint64_t key = (uint64_t)(k / 1000) + 1;
    for (int i = 0; i < f->pl.n; i++) {
        int64_t n = f->w[i] ? params_numel(&f->pl.p[i]) : 0;
        for (int64_t j = 0; j < n; j++) {
            f->w[i][j] = philox_normal(key, (uint64_t)j, (uint32_t)(3 * i));
            if (f->m[i]) f->m[i][j] = 1e-3f * philox_normal(key, (uint64_t)j, (uint32_t)(3 * i + 1));
            if (f->v[i]) f->v[i][j] = 1e-6f * fabsf(philox_normal(key, (uint64_t)j, (uint32_t)(3 * i + 2)));
        }
    }
}

/* The scalars of step k. */
static void fill_scalars(Fixture *f, int64_t k)
{
    TrainState *t = &f->ts;
    t->step = k;
    t->opt.step = k - k / 7;
    t->ls.scale = ldexp(1.0 + philox_uniform((uint64_t)k, 0, 0, 9), 10 + (int)(k % 7));
    t->ls.growth_tracker = k % 2000;
    t->ls.total_skips = k / 7;
    t->ls.consecutive_skips = k % 3 < k / 7 ? k % 3 : k / 7;   /* never more than the total */
    t->loader_epoch = k / 13;
    t->loader_cursor = 32 * (k % 13);
    t->micro_step = 4 * k + 1;
    t->total_steps = 100000;
    t->seed = 0x7edcba9876543210ull;
    t->has_best = k % 2 == 1;
    t->best_metric = t->has_best ? 1.0 / 3.0 + (double)k * 1e-9 : 0;
}

/* The state of step k: tensors and scalars. */
static void fill_state(Fixture *f, int64_t k)
{
    fill_tensors(f, k);
    fill_scalars(f, k);
}

static void zero_state(Fixture *f)
{
    for (int i = 0; i < f->pl.n; i++) {
        size_t n = f->w[i] ? (size_t)params_numel(&f->pl.p[i]) : 0;
        if (f->w[i]) memset(f->w[i], 0, n * sizeof(float));
        if (f->m[i]) memset(f->m[i], 0, n * sizeof(float));
        if (f->v[i]) memset(f->v[i], 0, n * sizeof(float));
    }
    LossScaleConfig cfg = f->ts.ls.cfg;
    memset(&f->ts.ls, 0, sizeof f->ts.ls);
    f->ts.ls.cfg = cfg;
    f->ts.opt.step = f->ts.step = f->ts.micro_step = f->ts.loader_epoch = f->ts.loader_cursor = -1;
    f->ts.seed = 0;
    f->ts.has_best = false;
    f->ts.best_metric = -1;
}

/* Requires f to hold exactly the state fill_state(k) makes (bitwise). */
static void expect_state(Fixture *f, int64_t k)
{
    Fixture ref;
    fixture_init(&ref, &f->spec);
    fill_state(&ref, k);
    for (int i = 0; i < f->pl.n; i++) {
        size_t bytes = f->w[i] ? (size_t)params_numel(&f->pl.p[i]) * sizeof(float) : 0;
        if (!bytes) continue;
        cr_assert(memcmp(f->w[i], ref.w[i], bytes) == 0, "step %lld: weights of %s differ", (long long)k,
                  f->pl.p[i].name);
        if (f->m[i]) cr_assert(memcmp(f->m[i], ref.m[i], bytes) == 0, "m of %s differs", f->pl.p[i].name);
        if (f->v[i]) cr_assert(memcmp(f->v[i], ref.v[i], bytes) == 0, "v of %s differs", f->pl.p[i].name);
    }
    const TrainState *a = &f->ts, *b = &ref.ts;
    cr_assert_eq(a->step, b->step);
    cr_assert_eq(a->opt.step, b->opt.step);
    cr_assert(memcmp(&a->ls.scale, &b->ls.scale, sizeof(double)) == 0, "scale %.17g != %.17g", a->ls.scale,
              b->ls.scale);
    cr_assert_eq(a->ls.growth_tracker, b->ls.growth_tracker);
    cr_assert_eq(a->ls.consecutive_skips, b->ls.consecutive_skips);
    cr_assert_eq(a->ls.total_skips, b->ls.total_skips);
    cr_assert_eq(a->loader_epoch, b->loader_epoch);
    cr_assert_eq(a->loader_cursor, b->loader_cursor);
    cr_assert_eq(a->micro_step, b->micro_step);
    cr_assert_eq(a->total_steps, b->total_steps);
    cr_assert_eq(a->seed, b->seed);
    cr_assert_eq(a->has_best, b->has_best);
    cr_assert(memcmp(&a->best_metric, &b->best_metric, sizeof(double)) == 0, "best %.17g != %.17g",
              a->best_metric, b->best_metric);
    fixture_free(&ref);
}

static void temp_dir(char *out, size_t cap, const char *tag)
{
    snprintf(out, cap, "/tmp/hpc_test_ckpt_%s_%d", tag, (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
    cr_assert_eq(system(cmd), 0);
}

static void remove_dir(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

static bool exists(const char *dir, const char *name)
{
    char p[700];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

Test(checkpoint, round_trip_is_bitwise)
{
    ModelSpec s;
    tiny_spec(&s, 64, 16);
    Fixture f;
    fixture_init(&f, &s);
    char dir[512];
    temp_dir(dir, sizeof dir, "rt");
    HpcError err = {0};
    for (int64_t k = 1; k <= 2; k++) {   /* an odd and an even step: best metric present and absent */
        fill_state(&f, k);
        cr_assert_eq(checkpoint_save(dir, &f.ts, &err), HPC_OK, "%s", err.msg);
        zero_state(&f);
        cr_assert_eq(checkpoint_load(dir, &f.ts, &err), HPC_OK, "%s", err.msg);
        expect_state(&f, k);
    }
    cr_expect(exists(dir, "latest") && exists(dir, "step-00000002/model.safetensors") &&
              exists(dir, "step-00000002/optimizer.safetensors") && exists(dir, "step-00000002/state.json"));
    /* A step directory loads directly too. */
    char step1[600];
    snprintf(step1, sizeof step1, "%s/step-00000001", dir);
    cr_assert_eq(checkpoint_load(step1, &f.ts, &err), HPC_OK, "%s", err.msg);
    expect_state(&f, 1);
    /* The model text reads back into the same architecture. */
    ModelSpec back;
    SpecPrecision pol;
    cr_assert_eq(checkpoint_read_spec(dir, &back, &pol, &err), HPC_OK, "%s", err.msg);
    char a[1024], b[1024];
    checkpoint_fingerprint(&s, a, sizeof a);
    checkpoint_fingerprint(&back, b, sizeof b);
    cr_expect_str_eq(a, b);
    cr_expect_eq(pol, PREC_FP16);
    cr_expect_eq(back.train.seed, s.train.seed);
    remove_dir(dir);
    fixture_free(&f);
}

Test(checkpoint, keeps_the_newest_and_replaces_a_step)
{
    ModelSpec s;
    tiny_spec(&s, 64, 16);
    Fixture f;
    fixture_init(&f, &s);
    char dir[512];
    temp_dir(dir, sizeof dir, "keep");
    HpcError err = {0};
    for (int64_t k = 1; k <= 5; k++) {
        fill_state(&f, k);
        f.ts.keep = 2;
        cr_assert_eq(checkpoint_save(dir, &f.ts, &err), HPC_OK, "%s", err.msg);
    }
    cr_expect(!exists(dir, "step-00000001") && !exists(dir, "step-00000003"));
    cr_expect(exists(dir, "step-00000004") && exists(dir, "step-00000005"));
    /* Saving step 5 again with other content swaps the directory. */
    fill_state(&f, 5);
    f.ts.micro_step = 777;
    cr_assert_eq(checkpoint_save(dir, &f.ts, &err), HPC_OK, "%s", err.msg);
    zero_state(&f);
    cr_assert_eq(checkpoint_load(dir, &f.ts, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(f.ts.micro_step, 777);
    remove_dir(dir);
    fixture_free(&f);
}

Test(checkpoint, another_model_is_refused)
{
    ModelSpec s, other;
    tiny_spec(&s, 64, 16);
    tiny_spec(&other, 64, 32);
    snprintf(other.name, sizeof other.name, "wider");
    Fixture f, g;
    fixture_init(&f, &s);
    fixture_init(&g, &other);
    char dir[512];
    temp_dir(dir, sizeof dir, "other");
    HpcError err = {0};
    fill_state(&f, 3);
    cr_assert_eq(checkpoint_save(dir, &f.ts, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(checkpoint_load(dir, &g.ts, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "was written by model 'ckpt_tiny'") && strstr(err.msg, "not by this model 'wider'"),
              "%s", err.msg);
    cr_expect(strstr(err.msg, "hidden 16") && strstr(err.msg, "hidden 32"), "%s", err.msg);
    /* Same architecture, another optimizer or precision: refused for a resume. */
    f.spec.train.optimizer = OPT_SGD;
    cr_expect_eq(checkpoint_load(dir, &f.ts, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "adamw optimizer state") != NULL, "%s", err.msg);
    f.spec.train.optimizer = OPT_ADAMW;
    f.ts.policy = PREC_FP32;
    cr_expect_eq(checkpoint_load(dir, &f.ts, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "policy fp16 -> fp32") != NULL, "%s", err.msg);
    f.ts.weights_only = true;   /* weights only: precision does not matter */
    cr_expect_eq(checkpoint_load(dir, &f.ts, &err), HPC_OK, "%s", err.msg);
    remove_dir(dir);
    fixture_free(&f);
    fixture_free(&g);
}

Test(checkpoint, broken_directories_are_named)
{
    ModelSpec s;
    tiny_spec(&s, 64, 16);
    Fixture f;
    fixture_init(&f, &s);
    char dir[512], p[700];
    temp_dir(dir, sizeof dir, "broken");
    HpcError err = {0};
    cr_expect_eq(checkpoint_load(dir, &f.ts, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "no such directory") != NULL, "%s", err.msg);
    cr_assert_eq(mkdir(dir, 0755), 0);
    cr_expect_eq(checkpoint_load(dir, &f.ts, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "is not a checkpoint") != NULL, "%s", err.msg);
    snprintf(p, sizeof p, "%s/latest", dir);
    FILE *fp = fopen(p, "w");
    fputs("step-00000009\n", fp);
    fclose(fp);
    cr_expect_eq(checkpoint_load(dir, &f.ts, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "has no state.json") != NULL, "%s", err.msg);
    /* A truncated weights file is caught by the safetensors reader. */
    fill_state(&f, 4);
    cr_assert_eq(checkpoint_save(dir, &f.ts, &err), HPC_OK, "%s", err.msg);
    snprintf(p, sizeof p, "%s/step-00000004/model.safetensors", dir);
    cr_assert_eq(truncate(p, 1000), 0);
    cr_expect_neq(checkpoint_load(dir, &f.ts, &err), HPC_OK);
    cr_expect(strstr(err.msg, "model.safetensors") != NULL, "%s", err.msg);
    remove_dir(dir);
    fixture_free(&f);
}

/* A killed writer's hidden step directory is there. */
static bool has_leftover(const char *dir)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -q '^\\.step-.*\\.tmp-'", dir);
    return system(cmd) == 0;
}

/* The child: saves steps from..from+n forever-ish; never returns. */
static void save_loop(Fixture *f, const char *dir, int64_t from)
{
    HpcError err = {0};
    fill_tensors(f, from);
    for (int64_t k = from; k < from + 1000; k++) {
        fill_scalars(f, k);
        if (checkpoint_save(dir, &f->ts, &err)) _exit(3);
    }
    _exit(0);
}

Test(sha256, known_digests)
{
    struct { const char *msg; const char *hex; } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    char hex[SHA256_HEX_LEN + 1];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        Sha256 h;
        sha256_init(&h);
        for (const char *c = v[i].msg; *c; c++) sha256_update(&h, c, 1);   /* byte by byte: the block carry */
        sha256_final_hex(&h, hex);
        cr_expect_str_eq(hex, v[i].hex, "message %zu", i);
    }
    /* a million 'a' in uneven pieces */
    Sha256 h;
    sha256_init(&h);
    char a[997];
    memset(a, 'a', sizeof a);
    size_t left = 1000000;
    for (size_t k = 1; left; k = k % 997 + 1) {
        size_t n = k < left ? k : left;
        sha256_update(&h, a, n);
        left -= n;
    }
    sha256_final_hex(&h, hex);
    cr_expect_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* Rewrites SHA256SUMS of stepdir after a test changed a file on purpose, so
 * that what follows tests the check after the checksums. */
static void reseal(const char *stepdir)
{
    const char *files[] = {"model.safetensors", "optimizer.safetensors", "state.json"};
    char path[700], hex[SHA256_HEX_LEN + 1];
    snprintf(path, sizeof path, "%s/SHA256SUMS", stepdir);
    FILE *out = fopen(path, "w");
    cr_assert_not_null(out);
    for (int i = 0; i < 3; i++) {
        char f[700];
        snprintf(f, sizeof f, "%s/%s", stepdir, files[i]);
        HpcError err = {0};
        cr_assert_eq(sha256_file(f, hex, &err), HPC_OK, "%s", err.msg);
        fprintf(out, "%s  %s\n", hex, files[i]);
    }
    fclose(out);
}

/* Flips one bit of the byte at offset (from the end when negative). */
static void flip_byte(const char *path, long offset)
{
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f, "%s", path);
    fseek(f, offset, offset < 0 ? SEEK_END : SEEK_SET);
    long at = ftell(f);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

/* Replaces the first "key": <number> in state.json by "key": value. */
static void set_state_number(const char *stepdir, const char *key, const char *value)
{
    char path[700], pat[80];
    snprintf(path, sizeof path, "%s/state.json", stepdir);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    static char text[1 << 16], out[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    char *at = strstr(text, pat);
    cr_assert_not_null(at, "no %s in state.json", key);
    char *num = at + strlen(pat), *end = num + strspn(num, "-0123456789.e+");
    snprintf(out, sizeof out, "%.*s%s%s", (int)(num - text), text, value, end);
    f = fopen(path, "wb");
    fputs(out, f);
    fclose(f);
}

Test(checkpoint, a_flipped_byte_is_refused_naming_the_file)
{
    ModelSpec s;
    tiny_spec(&s, 64, 16);
    Fixture f;
    fixture_init(&f, &s);
    char dir[512], step[600], p[700];
    temp_dir(dir, sizeof dir, "flip");
    HpcError err = {0};
    fill_state(&f, 6);
    cr_assert_eq(checkpoint_save(dir, &f.ts, &err), HPC_OK, "%s", err.msg);
    snprintf(step, sizeof step, "%s/step-00000006", dir);
    cr_assert(exists(step, "SHA256SUMS"));
    /* the manifest is what sha256sum -c reads */
    char cmd[800];
    snprintf(cmd, sizeof cmd, "cd '%s' && sha256sum --quiet -c SHA256SUMS", step);
    cr_expect_eq(system(cmd), 0, "sha256sum -c disagrees with SHA256SUMS");
    const char *files[] = {"model.safetensors", "optimizer.safetensors", "state.json"};
    long offsets[] = {-5, -1000, 40};   /* a weight, a moment, a character of the JSON */
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", step, files[i]);
        flip_byte(p, offsets[i]);
        cr_expect_eq(checkpoint_load(dir, &f.ts, &err), HPC_ERR_INPUT, "%s", files[i]);
        cr_expect(strstr(err.msg, p) && strstr(err.msg, "is damaged"), "%s", err.msg);
        flip_byte(p, offsets[i]);   /* back */
        cr_expect_eq(checkpoint_load(dir, &f.ts, &err), HPC_OK, "%s", err.msg);
    }
    /* weights only (export, --init) does not need the optimizer file */
    snprintf(p, sizeof p, "%s/optimizer.safetensors", step);
    flip_byte(p, -1000);
    f.ts.weights_only = true;
    cr_expect_eq(checkpoint_load(dir, &f.ts, &err), HPC_OK, "%s", err.msg);
    f.ts.weights_only = false;
    snprintf(p, sizeof p, "%s/SHA256SUMS", step);
    cr_assert_eq(unlink(p), 0);
    cr_expect_eq(checkpoint_load(dir, &f.ts, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "SHA256SUMS is missing") != NULL, "%s", err.msg);
    remove_dir(dir);
    fixture_free(&f);
}

Test(checkpoint, counters_out_of_range_are_refused_naming_the_key)
{
    ModelSpec s;
    tiny_spec(&s, 64, 16);
    Fixture f;
    fixture_init(&f, &s);
    char dir[512], step[600];
    temp_dir(dir, sizeof dir, "range");
    snprintf(step, sizeof step, "%s/step-00000020", dir);
    HpcError err = {0};
    struct { const char *key, *value, *text; } bad[] = {
        {"step", "100001", "step is 100001, outside [0, total_steps = 100000]"},
        {"step", "-1", "step is -1"},
        {"applied_steps", "21", "applied_steps is 21, outside [0, step = 20]"},
        {"micro_step", "19", "micro_step is 19"},
        {"cursor", "-3", "loader.cursor is -3"},
        {"total_skips", "21", "loss_scaler.total_skips is 21"},
        {"growth_tracker", "2001", "loss_scaler.growth_tracker is 2001, outside [0, the growth interval = 2000]"},
        {"scale", "0", "loss_scaler.scale is 0"},
        {"scale", "1e300", "loss_scaler.scale is 1e+300"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fill_state(&f, 20);
        cr_assert_eq(checkpoint_save(dir, &f.ts, &err), HPC_OK, "%s", err.msg);
        set_state_number(step, bad[i].key, bad[i].value);
        cr_expect_eq(checkpoint_load(dir, &f.ts, &err), HPC_ERR_INPUT, "%s", bad[i].key);
        cr_expect(strstr(err.msg, "is damaged") != NULL, "unsealed change not caught: %s", err.msg);
        reseal(step);
        cr_expect_eq(checkpoint_load(dir, &f.ts, &err), HPC_ERR_INPUT, "%s = %s", bad[i].key, bad[i].value);
        cr_expect(strstr(err.msg, bad[i].text) != NULL, "%s", err.msg);
    }
    remove_dir(dir);
    fixture_free(&f);
}

Test(checkpoint, changed_settings_are_listed_and_refused_unless_allowed)
{
    ModelSpec s;
    tiny_spec(&s, 64, 16);
    Fixture f;
    fixture_init(&f, &s);
    char dir[512];
    temp_dir(dir, sizeof dir, "settings");
    HpcError err = {0};
    fill_state(&f, 8);
    CheckpointSettings cs;
    checkpoint_settings_init(&cs, &f.spec, f.ts.policy, f.ts.total_steps);
    checkpoint_settings_add(&cs, "task", "cola");
    f.ts.settings = &cs;
    cr_assert_eq(checkpoint_save(dir, &f.ts, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(checkpoint_load(dir, &f.ts, &err), HPC_OK, "%s", err.msg);
    cr_expect_str_eq(f.ts.changed, "");
    /* another learning rate, batch, dropout and task */
    ModelSpec other = f.spec;
    other.train.lr = 2e-4;
    other.train.batch_size = 16;
    other.stack.hidden_dropout = 0.2;
    CheckpointSettings now;
    checkpoint_settings_init(&now, &other, f.ts.policy, f.ts.total_steps);
    checkpoint_settings_add(&now, "task", "sst2");
    f.ts.settings = &now;
    cr_expect_eq(checkpoint_load(dir, &f.ts, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "lr 2e-05 -> 0.0002") && strstr(err.msg, "batch 32 -> 16") &&
              strstr(err.msg, "dropout 0.1 -> 0.2") && strstr(err.msg, "task cola -> sst2") &&
              strstr(err.msg, "--allow-changed-settings"), "%s", err.msg);
    cr_expect(!strstr(err.msg, "seed"), "an unchanged setting is listed: %s", err.msg);
    f.ts.allow_changed_settings = true;
    cr_expect_eq(checkpoint_load(dir, &f.ts, &err), HPC_OK, "%s", err.msg);
    cr_expect(strstr(f.ts.changed, "lr 2e-05 -> 0.0002") && strstr(f.ts.changed, "task cola -> sst2"), "%s",
              f.ts.changed);
    expect_state(&f, 8);
    /* the optimizer kind stays a hard refusal: its moments mean something else */
    f.spec.train.optimizer = OPT_SGD;
    cr_expect_eq(checkpoint_load(dir, &f.ts, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "adamw optimizer state") != NULL, "%s", err.msg);
    remove_dir(dir);
    fixture_free(&f);
}

Test(checkpoint, one_run_per_directory_and_a_killed_holder_frees_it)
{
    char dir[512];
    temp_dir(dir, sizeof dir, "lock");
    int ready[2];
    cr_assert_eq(pipe(ready), 0);
    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) {
        CheckpointLock lk;
        HpcError e = {0};
        if (checkpoint_lock(dir, &lk, &e)) _exit(3);
        (void)!write(ready[1], "x", 1);
        pause();   /* holds the lock until killed */
        _exit(0);
    }
    char c;
    cr_assert_eq(read(ready[0], &c, 1), 1, "the child could not take the lock");
    CheckpointLock lk;
    HpcError err = {0};
    cr_expect_eq(checkpoint_lock(dir, &lk, &err), HPC_ERR_USAGE);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %d", (int)child);
    cr_expect(strstr(err.msg, "in use by another hpc run") && strstr(err.msg, pid), "%s", err.msg);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    cr_expect_eq(checkpoint_lock(dir, &lk, &err), HPC_OK, "a killed holder's lock stayed: %s", err.msg);
    checkpoint_unlock(&lk);
    /* a directory that cannot be created: a path under a file (what stops root, too) */
    char under[600];
    snprintf(under, sizeof under, "%s/.lock/ckpt", dir);
    cr_expect_eq(checkpoint_lock(under, &lk, &err), HPC_ERR_IO);
    cr_expect(strstr(err.msg, "is not a directory") != NULL, "%s", err.msg);
    close(ready[0]);
    close(ready[1]);
    remove_dir(dir);
}

Test(checkpoint, sigkill_during_save_keeps_a_loadable_checkpoint, .timeout = 240)
{
    ModelSpec s;
    tiny_spec(&s, 8192, 128);   /* ~1.2 M parameters: w, m, v ~ 14 MB a save */
    Fixture f;
    fixture_init(&f, &s);
    char dir[512];
    temp_dir(dir, sizeof dir, "kill");
    HpcError err = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fill_state(&f, 1);
    cr_assert_eq(checkpoint_save(dir, &f.ts, &err), HPC_OK, "%s", err.msg);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    /* Kill within about three saves, so that kills land before, inside and
     * between saves. */
    long save_us = (t1.tv_sec - t0.tv_sec) * 1000000L + (t1.tv_nsec - t0.tv_nsec) / 1000;
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    int64_t next = 2, last = 1, advanced = 0, mid_save = 0;
    for (int round = 0; round < 8; round++) {
        fflush(NULL);
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid == 0) save_loop(&f, dir, next);
        usleep((useconds_t)(rand() % (3 * save_us + 1)));
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child ended on its own (status %d)", status);
        mid_save += has_leftover(dir);
        zero_state(&f);
        cr_assert_eq(checkpoint_load(dir, &f.ts, &err), HPC_OK, "round %d: %s", round, err.msg);
        cr_assert(f.ts.step == last || (f.ts.step >= next && f.ts.step < next + 1000), "step %lld",
                  (long long)f.ts.step);
        expect_state(&f, f.ts.step);
        advanced += f.ts.step != last;
        last = f.ts.step;
        next = last + 1000;
    }
    cr_expect_gt(advanced, 0, "no child ever finished a save; the test did not test a kill between saves");
    if (getenv("HPC_TEST_VERBOSE"))
        fprintf(stderr, "kill test: %lld of 8 kills inside a save, %lld saves completed\n", (long long)mid_save,
                (long long)advanced);
    remove_dir(dir);
    fixture_free(&f);
}

Test(signals, first_signal_is_recorded_not_fatal)
{
    HpcError err = {0};
    cr_assert_eq(signals_install(&err), HPC_OK, "%s", err.msg);
    cr_expect_eq(signals_install(&err), HPC_ERR_USAGE);
    cr_expect_eq(signals_pending(), 0);
    raise(SIGTERM);
    cr_expect_eq(signals_pending(), SIGTERM);
    signals_clear();
    cr_expect_eq(signals_pending(), 0);
    signals_restore();
    /* After restore a new install works again. */
    cr_assert_eq(signals_install(&err), HPC_OK, "%s", err.msg);
    raise(SIGINT);
    cr_expect_eq(signals_pending(), SIGINT);
    signals_restore();
}

/* ------------------------------------------------------------------ */
/* Export                                                               */

static void export_family(ModelSpec *s, const char *want_type)
{
    Fixture f;
    fixture_init(&f, s);
    char dir[512], out[600], path[700];
    temp_dir(dir, sizeof dir, want_type);
    HpcError err = {0};
    fill_state(&f, 5);
    cr_assert_eq(checkpoint_save(dir, &f.ts, &err), HPC_OK, "%s", err.msg);
    /* What `hpc export` does (cli/cmd_export.c). */
    ModelSpec spec;
    cr_assert_eq(checkpoint_read_spec(dir, &spec, NULL, &err), HPC_OK, "%s", err.msg);
    char why[160] = "";
    const char *type = hf_config_family(&spec, why, sizeof why);
    cr_assert(type && strcmp(type, want_type) == 0, "family %s (%s), want %s", type ? type : "none", why, want_type);
    snprintf(out, sizeof out, "%s/hf", dir);
    cr_assert_eq(mkdir(out, 0755), 0);
    snprintf(path, sizeof path, "%s/config.json", out);
    cr_assert_eq(hf_config_write(&spec, type, path, &err), HPC_OK, "%s", err.msg);
    /* config.json parses back into the same architecture. */
    ModelSpec back;
    HfConfigInfo info;
    cr_assert_eq(hf_config_load(path, NULL, &back, &info, &err), HPC_OK, "%s", err.msg);
    char a[1024], b[1024];
    checkpoint_fingerprint(s, a, sizeof a);
    checkpoint_fingerprint(&back, b, sizeof b);
    cr_expect_str_eq(a, b);
    cr_expect_str_eq(info.model_type, want_type);
    /* The weights load back through hf_names into the same bits. */
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    cr_assert_eq(hf_names_save(type, &spec, &f.pl, (const float *const *)f.w, path, &err), HPC_OK, "%s", err.msg);
    Fixture g;
    fixture_init(&g, &back);
    StFile *st;
    cr_assert_eq(st_open(path, &st, &err), HPC_OK, "%s", err.msg);
    cr_expect_str_eq(hf_names_detect(st), want_type);
    int n_new = -1;
    cr_assert_eq(hf_names_load_all(want_type, st, &g.pl, g.w, &n_new, &err), HPC_OK, "%s", err.msg);
    st_close(st);
    cr_expect_eq(n_new, 0);
    cr_assert_eq(g.pl.n, f.pl.n);
    for (int i = 0; i < f.pl.n; i++) {
        if (!f.w[i]) continue;
        size_t bytes = (size_t)params_numel(&f.pl.p[i]) * sizeof(float);
        bool gpt2_bias = !strcmp(want_type, "gpt2") && !strcmp(f.pl.p[i].name, "classifier.bias");
        if (!gpt2_bias) cr_expect(memcmp(f.w[i], g.w[i], bytes) == 0, "%s differs after export", f.pl.p[i].name);
    }
    fixture_free(&g);
    remove_dir(dir);
    fixture_free(&f);
}

Test(export, bert_classifier) { ModelSpec s; tiny_spec(&s, 64, 16); export_family(&s, "bert"); }

Test(export, roberta_masked_lm)
{
    ModelSpec s;
    tiny_spec(&s, 64, 16);
    s.stack.position_offset = 2;
    s.stack.type_vocab_size = 1;
    s.head = (SpecHead){.kind = HEAD_MASKED_LM, .tie_word_embeddings = true, .decoder_bias = true,
                        .classifier_dropout = 0.1, .pooler_activation = ACT_TANH};
    export_family(&s, "roberta");
}

Test(export, distilbert_classifier)
{
    ModelSpec s;
    tiny_spec(&s, 64, 16);
    s.stack.type_vocab_size = 0;
    s.head.pooler_activation = ACT_RELU;
    s.head.classifier_dropout = 0.2;
    export_family(&s, "distilbert");
}

Test(export, gpt2_causal_lm)
{
    ModelSpec s;
    tiny_spec(&s, 64, 16);
    s.stack.kind = STACK_DECODER;
    s.stack.norm = NORM_PRE;
    s.stack.attention = ATTN_CAUSAL;
    s.stack.embedding_ln = false;
    s.stack.final_ln = true;
    s.stack.type_vocab_size = 0;
    s.stack.activation = ACT_GELU_TANH;
    s.stack.ln_eps = 1e-5;
    s.head = (SpecHead){.kind = HEAD_CAUSAL_LM, .tie_word_embeddings = true, .classifier_dropout = 0.1,
                        .pooler_activation = ACT_TANH};
    export_family(&s, "gpt2");
}

Test(export, refuses_what_transformers_cannot_hold)
{
    ModelSpec s;
    tiny_spec(&s, 64, 16);
    s.stack.norm = NORM_PRE;   /* a pre-LN encoder: no transformers family here */
    char why[160] = "";
    cr_expect_null(hf_config_family(&s, why, sizeof why));
    cr_expect(strstr(why, "post-LN") != NULL, "%s", why);
    HpcError err = {0};
    cr_expect_eq(hf_config_write(&s, "bert", "/tmp/never_written.json", &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "cannot be written as a bert config") != NULL, "%s", err.msg);
}

/* ------------------------------------------------------------------ */
/* --init HF_DIR (runtime/formats/hf_init.h)                                    */

/* Writes the weights of a fixture of `from` as a transformers folder and
 * initialises a fixture of `to` from it. */
static HpcStatus init_between(ModelSpec *from, ModelSpec *to, Fixture *src, Fixture *dst, HfInitReport *rep,
                              HpcError *err)
{
    fixture_init(src, from);
    fixture_init(dst, to);
    fill_state(src, 1);
    fill_state(dst, 2001);   /* "initializer" values, different from src */
    char dir[512], path[700];
    temp_dir(dir, sizeof dir, "init");
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    cr_assert_eq(hf_names_save("bert", from, &src->pl, (const float *const *)src->w, path, err), HPC_OK, "%s",
                 err->msg);
    HpcStatus st = hf_init_load(dir, &dst->pl, dst->w, rep, err);
    remove_dir(dir);
    return st;
}

static bool any_line(const HfInitReport *rep, const char *needle)
{
    for (int i = 0; i < rep->n_lines; i++)
        if (strstr(rep->lines[i], needle)) return true;
    return false;
}

Test(hf_init, new_classifier_head_is_initialised)
{
    ModelSpec a, b;
    tiny_spec(&a, 64, 16);
    tiny_spec(&b, 64, 16);
    a.head.num_labels = 3;   /* the checkpoint's classifier has 3 labels, the model 2 */
    Fixture src, dst;
    HfInitReport rep;
    HpcError err = {0};
    cr_assert_eq(init_between(&a, &b, &src, &dst, &rep, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(rep.n_new, 2);
    cr_expect(any_line(&rep, "new: classifier.weight [2, 16]") && any_line(&rep, "a new head"), "%s", rep.lines[0]);
    cr_expect_eq(rep.n_missing + rep.n_misshapen, 0);
    Fixture init;
    fixture_init(&init, &b);
    fill_state(&init, 2001);
    for (int i = 0; i < dst.pl.n; i++) {
        if (!dst.w[i]) continue;
        bool head = strncmp(dst.pl.p[i].name, "classifier.", 11) == 0;
        size_t bytes = (size_t)params_numel(&dst.pl.p[i]) * sizeof(float);
        cr_expect(memcmp(dst.w[i], head ? init.w[i] : src.w[i], bytes) == 0, "%s: %s", dst.pl.p[i].name,
                  head ? "not its initializer" : "not the checkpoint's value");
    }
    fixture_free(&init);
    fixture_free(&src);
    fixture_free(&dst);
}

Test(hf_init, missing_and_misshapen_are_all_listed)
{
    ModelSpec a, b;
    tiny_spec(&a, 64, 16);
    tiny_spec(&b, 64, 16);
    b.stack.layers = 3;    /* layer 2 is not in the checkpoint */
    b.stack.ffn = 48;      /* every FFN tensor has another shape */
    Fixture src, dst;
    HfInitReport rep;
    HpcError err = {0};
    cr_assert_eq(init_between(&a, &b, &src, &dst, &rep, &err), HPC_ERR_INPUT);
    cr_expect_eq(rep.n_missing, 16, "%d", rep.n_missing);      /* 16 tensors per BERT layer */
    cr_expect_eq(rep.n_misshapen, 2 * 3, "%d", rep.n_misshapen); /* intermediate weight, bias, output weight, per layer 0-1 */
    cr_expect(any_line(&rep, "missing: bert.encoder.layer.2.attention.self.query.weight [16, 16]"), "%s", rep.lines[0]);
    cr_expect(any_line(&rep, "mis-shaped: checkpoint tensor bert.encoder.layer.0.intermediate.dense.weight has "
                             "shape [32, 16] but parameter bert.encoder.layer.0.intermediate.dense.weight "
                             "needs [48, 16]"), "%s", rep.lines[0]);
    cr_expect(strstr(err.msg, "16 parameters missing, 6 mis-shaped") != NULL, "%s", err.msg);
    fixture_free(&src);
    fixture_free(&dst);
}

Test(hf_init, unused_tensors_are_listed)
{
    ModelSpec a, b;
    tiny_spec(&a, 64, 16);
    tiny_spec(&b, 64, 16);
    a.stack.layers = 3;    /* layer 2 of the checkpoint has no parameter */
    Fixture src, dst;
    HfInitReport rep;
    HpcError err = {0};
    cr_assert_eq(init_between(&a, &b, &src, &dst, &rep, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(rep.n_unused, 16, "%d", rep.n_unused);
    cr_expect(any_line(&rep, "unused: checkpoint tensor bert.encoder.layer.2.output.dense.weight [16, 32]"), "%s",
              rep.lines[0]);
    fixture_free(&src);
    fixture_free(&dst);
}

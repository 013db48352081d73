/* tests/test_weights_finite.c — weights with NaN or inf are refused at every
 * load (runtime/formats/tensor_finite.h): the scan itself for each float
 * dtype, then the three load paths: `--init` (hf_init_load), `--resume`
 * (checkpoint_load, weights and optimizer moments) and the C API
 * (hpc_model_load_weights, which must also leave the model unchanged).
 * Each refusal names the file, the tensor and the element. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpu/half.h"
#include "cpu/philox.h"
#include "formats/hf_init.h"
#include "formats/hf_names.h"
#include "formats/safetensors.h"
#include "formats/tensor_finite.h"
#include "hpc.h"
#include "lower.h"
#include "train/checkpoint.h"

static double urand(uint64_t seed, uint64_t i) { return 4.0 * philox_uniform(seed, i, 0, 5) - 2.0; }

/* n random finite elements of dtype at buf + 1 (unaligned on purpose),
 * including the largest finite value and a subnormal. */
static unsigned char *finite_data(StDtype dt, int64_t n, uint64_t seed)
{
    size_t es = st_dtype_size(dt);
    unsigned char *buf = malloc((size_t)n * es + 1), *p = buf + 1;
    for (int64_t i = 0; i < n; i++) {
        double v = urand(seed, (uint64_t)i);
        if (i == 3) v = dt == ST_F16 ? 65504.0 : dt == ST_BF16 ? 3.3895313892515355e38 : dt == ST_F32 ? 3.4028234663852886e38 : 1.7976931348623157e308;
        if (i == 5) v = dt == ST_F16 ? 5.960464477539063e-08 : 1e-40;
        float f = (float)v;
        uint16_t h = dt == ST_F16 ? half_from_f32(f) : bf16_from_f32(f);
        if (dt == ST_F64) memcpy(p + (size_t)i * es, &v, 8);
        else if (dt == ST_F32) memcpy(p + (size_t)i * es, &f, 4);
        else memcpy(p + (size_t)i * es, &h, 2);
    }
    return buf;
}

static void plant(StDtype dt, unsigned char *p, int64_t i, double v)
{
    size_t es = st_dtype_size(dt);
    float f = (float)v;
    uint16_t h = dt == ST_F16 ? half_from_f32(f) : bf16_from_f32(f);
    if (dt == ST_F64) memcpy(p + (size_t)i * es, &v, 8);
    else if (dt == ST_F32) memcpy(p + (size_t)i * es, &f, 4);
    else memcpy(p + (size_t)i * es, &h, 2);
}

Test(tensor_finite, every_float_dtype)
{
    StDtype dts[] = {ST_F64, ST_F32, ST_F16, ST_BF16};
    double bad[] = {NAN, INFINITY, -INFINITY};
    const char *word[] = {"holds NaN", "holds inf", "holds -inf"};
    for (int d = 0; d < 4; d++)
        for (int b = 0; b < 3; b++) {
            enum { N = 1000 };
            unsigned char *buf = finite_data(dts[d], N, (uint64_t)(10 * d + b));
            cr_expect_eq(tensor_first_nonfinite(dts[d], buf + 1, N), -1, "%s: finite data", st_dtype_name(dts[d]));
            int64_t at = 7 + (int64_t)(philox_uniform(9, (uint64_t)d, (uint32_t)b, 1) * 900);
            plant(dts[d], buf + 1, at, bad[b]);
            plant(dts[d], buf + 1, N - 1, NAN);   /* a later one is not the first */
            cr_expect_eq(tensor_first_nonfinite(dts[d], buf + 1, N), at, "%s", st_dtype_name(dts[d]));
            HpcError err = {0};
            cr_expect_eq(tensor_check_finite("f.safetensors", "w", dts[d], buf + 1, N, &err), HPC_ERR_INPUT);
            char want[64];
            snprintf(want, sizeof want, "%s at element %lld (of 1000)", word[b], (long long)at);
            cr_expect(strstr(err.msg, want) && strstr(err.msg, "f.safetensors: tensor 'w'"), "%s", err.msg);
            free(buf);
        }
}

Test(tensor_finite, integers_and_f8)
{
    int32_t ids[4] = {-1, 0x7f800000, 0x7fc00000, 3};   /* float NaN bits, but integers */
    cr_expect_eq(tensor_first_nonfinite(ST_I32, ids, 4), -1);
    unsigned char e5[3] = {0x3c, 0x7c, 0x00};           /* 1.0, +inf */
    cr_expect_eq(tensor_first_nonfinite(ST_F8_E5M2, e5, 3), 1);
    unsigned char e4[3] = {0x7e, 0xff, 0x7f};           /* 448, NaN, NaN */
    cr_expect_eq(tensor_first_nonfinite(ST_F8_E4M3, e4, 3), 1);
    cr_expect_eq(tensor_first_nonfinite(ST_F32, NULL, 0), -1);
}

/* ---- the load paths ----------------------------------------------------- */

static void tiny_spec(ModelSpec *s)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "finite_tiny");
    s->stack.vocab_size = 40;
    s->stack.max_positions = 16;
    s->stack.hidden = 16;
    s->stack.layers = 1;
    s->stack.heads = 2;
    s->stack.ffn = 32;
}

typedef struct {
    ModelSpec spec;
    IrGraph g;
    ParamList pl;
    float **w, **m, **v;
} Model;

static void model_init(Model *md)
{
    memset(md, 0, sizeof *md);
    tiny_spec(&md->spec);
    ir_init(&md->g);
    params_init(&md->pl);
    HpcError err = {0};
    cr_assert_eq(lower_model(&md->spec, &md->g, &md->pl, &err), HPC_OK, "%s", err.msg);
    md->w = calloc((size_t)md->pl.n, sizeof *md->w);
    md->m = calloc((size_t)md->pl.n, sizeof *md->m);
    md->v = calloc((size_t)md->pl.n, sizeof *md->v);
    for (int i = 0; i < md->pl.n; i++) {
        if (md->pl.p[i].tied_to >= 0) continue;
        int64_t n = params_numel(&md->pl.p[i]);
        md->w[i] = malloc((size_t)n * sizeof(float));
        md->m[i] = malloc((size_t)n * sizeof(float));
        md->v[i] = malloc((size_t)n * sizeof(float));
        for (int64_t k = 0; k < n; k++) {
            md->w[i][k] = (float)urand((uint64_t)i, (uint64_t)k);
            md->m[i][k] = 1e-3f * (float)urand((uint64_t)i + 500, (uint64_t)k);
            md->v[i][k] = 1e-6f * fabsf((float)urand((uint64_t)i + 900, (uint64_t)k));
        }
    }
}

static void model_free(Model *md)
{
    for (int i = 0; i < md->pl.n; i++) free(md->w[i]), free(md->m[i]), free(md->v[i]);
    free(md->w), free(md->m), free(md->v);
    params_free(&md->pl);
    ir_free(&md->g);
}

static int param_index(const Model *md, const char *name)
{
    int i = params_find(&md->pl, name);
    cr_assert(i >= 0, "no parameter %s", name);
    return i;
}

static void temp_dir(char *out, size_t cap, const char *tag)
{
    snprintf(out, cap, "/tmp/hpc_test_finite_%s_%d", tag, (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", out, out);
    cr_assert_eq(system(cmd), 0);
}

static void remove_dir(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

#define QUERY "bert.encoder.layer.0.attention.self.query.weight"

Test(weights_finite, init_refuses_a_nan_tensor_and_names_it)
{
    Model src, dst;
    model_init(&src);
    model_init(&dst);
    src.w[param_index(&src, QUERY)][37] = NAN;
    char dir[256], path[400];
    temp_dir(dir, sizeof dir, "init");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    HpcError err = {0};
    cr_assert_eq(hf_names_save("bert", &src.spec, &src.pl, (const float *const *)src.w, path, &err), HPC_OK, "%s",
                 err.msg);
    HfInitReport rep;
    cr_expect_eq(hf_init_load(dir, &dst.pl, dst.w, &rep, &err), HPC_ERR_INPUT);
    cr_expect_eq(rep.n_nonfinite, 1);
    cr_expect(strstr(err.msg, "holds NaN or inf in 1 tensor the model uses"), "%s", err.msg);
    bool named = false;
    for (int i = 0; i < rep.n_lines; i++)
        named |= strstr(rep.lines[i], "not finite: ") && strstr(rep.lines[i], "'" QUERY "' holds NaN at element 37");
    cr_expect(named, "%s", rep.n_lines ? rep.lines[0] : "no lines");
    /* The same folder with the NaN mended loads. */
    src.w[param_index(&src, QUERY)][37] = 0.5f;
    cr_assert_eq(hf_names_save("bert", &src.spec, &src.pl, (const float *const *)src.w, path, &err), HPC_OK);
    cr_expect_eq(hf_init_load(dir, &dst.pl, dst.w, &rep, &err), HPC_OK, "%s", err.msg);
    remove_dir(dir);
    model_free(&src);
    model_free(&dst);
}

static void resume_case(bool in_moments)
{
    Model md;
    model_init(&md);
    int q = param_index(&md, QUERY);
    (in_moments ? md.v : md.w)[q][5] = INFINITY;
    TrainState ts = {.spec = &md.spec, .pl = &md.pl, .policy = PREC_FP32, .w = md.w, .m = md.m, .v = md.v,
                     .step = 3, .opt.step = 3, .total_steps = 10, .seed = 1};
    ls_config_from_spec(&ts.ls.cfg, &md.spec.train);
    ts.ls.scale = 1024;
    char dir[256];
    temp_dir(dir, sizeof dir, in_moments ? "moments" : "resume");
    HpcError err = {0};
    cr_assert_eq(checkpoint_save(dir, &ts, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(checkpoint_load(dir, &ts, &err), HPC_ERR_INPUT);
    const char *file = in_moments ? "optimizer.safetensors" : "model.safetensors";
    cr_expect(strstr(err.msg, file) && strstr(err.msg, QUERY "' holds inf at element 5"), "%s", err.msg);
    remove_dir(dir);
    model_free(&md);
}

Test(weights_finite, resume_refuses_inf_weights) { resume_case(false); }
Test(weights_finite, resume_refuses_inf_moments) { resume_case(true); }

/* The C API: a NaN patched into a saved weights file is refused with
 * HPC_API_ERR_INPUT and the model keeps its weights. */
Test(weights_finite, api_load_refuses_nan_and_keeps_the_model, .timeout = 120)
{
    char model[512], path[128];
    const char *root = getenv("HPC_ROOT");
    snprintf(model, sizeof model, "%s/models/bert_tiny.model", root ? root : ".");
    snprintf(path, sizeof path, "/tmp/hpc_test_finite_api_%d.safetensors", (int)getpid());
    HpcModelOptions o;
    hpc_model_options_init(&o);
    o.path = model;
    o.max_batch = 2;
    o.max_seq_len = 8;
    HpcModel *m = NULL;
    char msg[1024];
    cr_assert_eq(hpc_model_open(&o, &m, msg, sizeof msg), HPC_API_OK, "%s", msg);
    cr_assert_eq(hpc_model_save_weights(m, path), HPC_API_OK, "%s", hpc_model_error(m));
    /* Patch one element of the query weight to NaN, in place. */
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    rewind(f);
    unsigned char *buf = malloc((size_t)len);
    cr_assert_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    StFile *sf;
    HpcError err = {0};
    cr_assert_eq(st_open_memory(buf, (size_t)len, path, &sf, &err), HPC_OK, "%s", err.msg);
    const StTensor *t = st_find(sf, QUERY);
    cr_assert(t && t->dtype == ST_F32);
    size_t off = (size_t)((const unsigned char *)t->data - buf) + 4 * 11;
    st_close(sf);
    float nan = NAN;
    memcpy(buf + off, &nan, 4);
    f = fopen(path, "wb");
    cr_assert(f && fwrite(buf, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    free(buf);

    int32_t ids[16], mask[16], types[16] = {0}, labels[2] = {0, 1};
    for (int i = 0; i < 16; i++) ids[i] = 1 + i * 7, mask[i] = 1;
    HpcBatch b = {.batch = 2, .seq_len = 8, .input_ids = ids, .attention_mask = mask, .token_type_ids = types,
                  .labels = labels};
    float before[4], after[4];
    cr_assert_eq(hpc_model_forward(m, &b, before, 4), HPC_API_OK, "%s", hpc_model_error(m));
    cr_expect_eq(hpc_model_load_weights(m, path), HPC_API_ERR_INPUT);
    cr_expect(strstr(hpc_model_error(m), "'" QUERY "' holds NaN at element 11"), "%s", hpc_model_error(m));
    cr_assert_eq(hpc_model_forward(m, &b, after, 4), HPC_API_OK);
    for (int i = 0; i < 4; i++) cr_expect(isfinite(after[i]) && after[i] == before[i], "logit %d changed", i);
    remove(path);
    hpc_model_free(m);
}

/* tests/test_step_program.c — the step program (program/step_program.h):
 *   - one CUDA source for every (B, L): bert_tiny compiled with two different
 *     batch x length bounds carries byte-identical CUDA and launch records,
 *     and through the kernel cache the second is a hit (one NVRTC compile
 *     per module, counted by nvrtc_compile_stats);
 *   - every kernel a launch record names is defined in the module;
 *   - the text form round-trips (write, read, write gives the same bytes) and
 *     the read-back program computes the same loss on the cpu backend as a
 *     program compiled in-process, bit for bit;
 *   - the C API opens a NAME.hpc's program and computes the same logits as
 *     from the .model file;
 *   - --emit-cuda exports the step's own module (NAME_step.cuh) verbatim,
 *     with a launch line per kernel;
 *   - bad programs are refused with the reason: truncated, another version,
 *     an unknown field, an unknown policy, a node input that is not earlier.
 * The link-level check (a program that runs an artifact has no front end)
 * is tests/link/check-no-frontend.sh. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hpc.h"
#include "emit_lib.h"
#include "cuda/nvrtc_compile.h"
#include "data/batch.h"
#include "step_program_build.h"
#include "train/train_backend.h"
#include "compiler/spec_load.h"

static void load_tiny(ModelSpec *s, int64_t B, int64_t L)
{
    cr_assert_eq(spec_load("models/bert_tiny.model", s, stderr), 0);
    s->train.batch_size = B;
    s->train.max_seq_len = L;
}

static void compile_tiny(StepProgram *p, int64_t B, int64_t L, SpecPrecision policy)
{
    ModelSpec s;
    HpcError err = {0};
    load_tiny(&s, B, L);
    cr_assert_eq(step_program_compile(&s, policy, true, p, &err), HPC_OK, "%s", err.msg);
}

static char *program_text(const StepProgram *p, size_t *len)
{
    char *t = NULL;
    FILE *f = open_memstream(&t, len);
    cr_assert(f);
    step_program_write(p, f);
    fclose(f);
    return t;
}

Test(step_program, one_source_for_every_batch_and_length)
{
    StepProgram a, b;
    compile_tiny(&a, 8, 32, PREC_FP16);
    compile_tiny(&b, 24, 112, PREC_FP16);   /* a length no dimension of the model has */
    cr_assert(a.kernels.cuda_source && b.kernels.cuda_source);
    cr_expect_str_eq(a.kernels.cuda_source, b.kernels.cuda_source, "the CUDA depends on the bounds");
    cr_assert_eq(a.kernels.n, b.kernels.n);
    cr_expect_eq(memcmp(a.kernels.node, b.kernels.node, (size_t)a.kernels.n * sizeof *a.kernels.node), 0,
                 "the launch records depend on the bounds");
    /* The source holds no batch or length: nothing but a.B / a.L names them. */
    cr_expect_null(strstr(b.kernels.cuda_source, "112LL"));
    cr_expect_null(strstr(b.kernels.cuda_source, "24LL * "));
    step_program_free(&a);
    step_program_free(&b);
}

Test(step_program, records_name_kernels_of_the_module_and_scale_with_b_and_l)
{
    StepProgram p;
    compile_tiny(&p, 8, 32, PREC_FP16);
    int kernels = 0;
    for (int i = 0; i < p.kernels.n; i++) {
        const StepNodeCode *c = &p.kernels.node[i];
        for (int k = 0; k < c->n_phases; k++) {
            char decl[EOP_NAME_MAX + 8];
            snprintf(decl, sizeof decl, " %s(EopArgs a)", c->phase[k].name);
            cr_expect_not_null(strstr(p.kernels.cuda_source, decl), "node %d: %s is not in the module", i,
                               c->phase[k].name);
            kernels++;
        }
        /* An elementwise phase counts the output's elements (or 8-vectors). */
        const IrNode *n = &p.g.nodes[i];
        if (c->kind == EOP_KERNELS && n->op == IR_OP_DROPOUT && c->phase[0].lt == EOP_LT_ELEMS) {
            int64_t at = step_size_eval(&c->phase[0].count, 3, 17), numel = ir_numel(n, 3, 17);
            cr_expect(at == numel || at == (numel + 7) / 8, "node %d: count %lld at 3x17 for %lld elements", i,
                      (long long)at, (long long)numel);
        }
    }
    cr_expect_gt(kernels, 20);
    step_program_free(&p);
}

Test(step_program, one_nvrtc_compile_per_module)
{
    char dir[] = "/tmp/hpc_sp_cacheXXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    setenv("HPC_CACHE_DIR", dir, 1);
    StepProgram a, b;
    compile_tiny(&a, 8, 32, PREC_BF16);
    compile_tiny(&b, 16, 64, PREC_BF16);
    NvrtcStats s0, s1;
    nvrtc_compile_stats(&s0);
    void *cubin;
    size_t n;
    NvrtcCacheInfo info;
    HpcError err = {0};
    for (int run = 0; run < 3; run++) {   /* three padded lengths of one fine-tune */
        const StepProgram *p = run == 1 ? &b : &a;
        cr_assert_eq(nvrtc_compile_cached(p->kernels.cuda_source, "hpc_ops", 80, NULL, 0, &cubin, &n, &info, &err),
                     HPC_OK, "%s", err.msg);
        if (run == 0)   /* `hpc compile --arch 80`: the cubin travels in the program */
            cr_assert_eq(step_kernels_add_cubin(&a.kernels, 80, cubin, n, &err), HPC_OK, "%s", err.msg);
        free(cubin);
        cr_expect_eq(info.result, run == 0 ? KCACHE_MISS : KCACHE_HIT, "run %d", run);
    }
    nvrtc_compile_stats(&s1);
    cr_expect_eq(s1.compiles - s0.compiles, 1, "NVRTC ran %ld times", s1.compiles - s0.compiles);
    cr_expect_eq(s1.cache_hits - s0.cache_hits, 2);
    /* The cubin survives the text form byte for byte. */
    size_t len = 0;
    char *t = program_text(&a, &len);
    StepProgram q;
    cr_assert_eq(step_program_read("mem", t, len, &q, &err), HPC_OK, "%s", err.msg);
    const StepCubin *c = step_kernels_cubin(&q.kernels, 80), *want = step_kernels_cubin(&a.kernels, 80);
    cr_assert(c && want);
    cr_expect_eq(c->size, want->size);
    cr_expect_eq(memcmp(c->data, want->data, c->size), 0);
    cr_expect_null(step_kernels_cubin(&q.kernels, 90));
    step_program_free(&q);
    /* A cut inside the cubin's hex is refused. */
    char *cub = strstr(t, "\ncubin 80 ");
    cr_assert_not_null(cub);
    cr_expect_eq(step_program_read("x.hpc", t, (size_t)(cub - t) + 5000, &q, &err), HPC_ERR_INPUT);
    cr_expect_not_null(strstr(err.msg, "truncated"), "%s", err.msg);
    free(t);
    step_program_free(&a);
    step_program_free(&b);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* Loss of one forward pass on the cpu backend, for a fixed random batch. */
static double cpu_loss(TrainBackend *be)
{
    Batch *b = batch_new(4, 16, 0);
    uint32_t x = 12345;
    for (int64_t i = 0; i < 4 * 16; i++) {
        x = x * 1664525u + 1013904223u;
        b->input_ids[i] = (int32_t)(x % 30000);
        b->token_type_ids[i] = 0;
        b->attention_mask[i] = i % 16 < 12;
    }
    for (int i = 0; i < 4; i++) b->labels[i] = i % 2;
    double loss = NAN;
    HpcError err = {0};
    cr_assert_eq(be->forward(be, b, &loss, NULL, &err), HPC_OK, "%s", err.msg);
    batch_free(b);
    return loss;
}

Test(step_program, text_round_trip_runs_the_same_step)
{
    StepProgram p, q;
    compile_tiny(&p, 4, 16, PREC_FP16);
    size_t len = 0, len2 = 0;
    char *t = program_text(&p, &len);
    HpcError err = {0};
    cr_assert_eq(step_program_read("mem", t, len, &q, &err), HPC_OK, "%s", err.msg);
    char *t2 = program_text(&q, &len2);
    cr_expect_eq(len, len2);
    cr_expect_eq(memcmp(t, t2, len), 0, "write(read(write(p))) differs from write(p)");
    cr_expect_eq(q.policy, PREC_FP16);
    /* the one-pass attention backward (v5, the default) runs v4's kernel up
     * to 64 keys and, from a module not built for sm_90a, up to 128; the
     * wgmma kernel from 65 to 128 keys from one that is (StepPhase.above_l,
     * at_most_l, target); its delta, dQ and dK/dV phases only above 128.
     * The forward: v2's kernel up to 64 keys, above 128 (sm_90a) and at
     * every length (not sm_90a), the wgmma forward from 65 to 128 (sm_90a).
     * The fields survive the text. */
    int above = 0, at_most = 0, sm90a = 0, not_sm90a = 0, full_bwd = 0, full_fwd = 0;
    for (int i = 0; i < p.kernels.n && i < q.kernels.n; i++) {
        full_bwd += p.g.nodes[i].op == IR_OP_ATTENTION_BWD && !p.g.nodes[i].attr.attn.first_query;
        full_fwd += p.g.nodes[i].op == IR_OP_ATTENTION && !p.g.nodes[i].attr.attn.first_query;
        for (int k = 0; k < p.kernels.node[i].n_phases; k++) {
            const StepPhase *a = &p.kernels.node[i].phase[k], *b = &q.kernels.node[i].phase[k];
            cr_expect(b->above_l == a->above_l && b->at_most_l == a->at_most_l && b->target == a->target,
                      "node %d phase %d", i, k);
            above += a->above_l == 128;
            at_most += a->at_most_l == 128;
            sm90a += a->target == STEP_TARGET_SM90A;
            not_sm90a += a->target == STEP_TARGET_NOT_SM90A;
        }
    }
    cr_expect(full_bwd > 0 && full_fwd == full_bwd && above == 3 * full_bwd + full_fwd &&
                  at_most == 2 * full_bwd + full_fwd && sm90a == full_bwd + 2 * full_fwd &&
                  not_sm90a == full_bwd + full_fwd,
              "%d phases above 128 keys, %d up to it, %d and %d for sm_90a modules and others, for %d full "
              "attention backward and %d forward nodes", above, at_most, sm90a, not_sm90a, full_bwd, full_fwd);
    cr_expect_eq(q.g.n, p.g.n);
    cr_expect_eq(q.pl.n, p.pl.n);
    cr_expect_str_eq(q.pl.p[0].name, p.pl.p[0].name);
    TrainBackend ba, bb;
    cr_assert_eq(train_backend_open_program(&ba, TRAIN_DEVICE_CPU, &p, 10, 4, 16, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(train_backend_open_program(&bb, TRAIN_DEVICE_CPU, &q, 10, 4, 16, &err), HPC_OK, "%s", err.msg);
    double la = cpu_loss(&ba), lb = cpu_loss(&bb);
    cr_expect(isfinite(la) && la > 0.1, "loss %g", la);
    cr_expect_eq(la, lb, "loss %.17g in-process, %.17g read back", la, lb);
    train_backend_close(&ba);
    train_backend_close(&bb);
    free(t);
    free(t2);
    step_program_free(&p);
    step_program_free(&q);
}

/* Reads text with `from` replaced by `to` (first occurrence); expects the
 * failure message to contain `want`. */
static void expect_refused(const char *text, size_t len, const char *from, const char *to, size_t cut,
                           const char *want)
{
    char *bad = xmalloc(len + (to ? strlen(to) : 0) + 1);
    size_t n;
    if (from) {
        const char *at = strstr(text, from);
        cr_assert_not_null(at, "%s", from);
        size_t pre = (size_t)(at - text);
        memcpy(bad, text, pre);
        memcpy(bad + pre, to, strlen(to));
        memcpy(bad + pre + strlen(to), at + strlen(from), len - pre - strlen(from));
        n = len - strlen(from) + strlen(to);
    } else {
        memcpy(bad, text, cut);
        n = cut;
    }
    StepProgram p;
    HpcError err = {0};
    cr_expect_eq(step_program_read("x.hpc", bad, n, &p, &err), HPC_ERR_INPUT, "accepted (%s)", want);
    cr_expect_not_null(strstr(err.msg, want), "wanted '%s' in: %s", want, err.msg);
    cr_expect_not_null(strstr(err.msg, "x.hpc: step program line"), "%s", err.msg);
    free(bad);
}

/* A phase's dynamic shared memory (StepPhase.shared_bytes: the whole-dS
 * attention backward of HPC_ATTN_KERNELS=v4) survives the
 * text, and a phase line asking for more than a block can have is
 * refused. */
Test(step_program, a_phase_keeps_its_dynamic_shared_memory)
{
    StepProgram p, q;
    setenv("HPC_ATTN_KERNELS", "v4", 1);
    compile_tiny(&p, 4, 16, PREC_FP16);
    unsetenv("HPC_ATTN_KERNELS");
    size_t len = 0;
    char *t = program_text(&p, &len);
    HpcError err = {0};
    cr_assert_eq(step_program_read("mem", t, len, &q, &err), HPC_OK, "%s", err.msg);
    int asking = 0;
    for (int i = 0; i < p.kernels.n && i < q.kernels.n; i++)
        for (int k = 0; k < p.kernels.node[i].n_phases; k++) {
            cr_expect_eq(q.kernels.node[i].phase[k].shared_bytes, p.kernels.node[i].phase[k].shared_bytes);
            asking += p.kernels.node[i].phase[k].shared_bytes > 48 * 1024;
        }
    cr_expect_gt(asking, 0, "no phase asks for dynamic shared memory under HPC_ATTN_KERNELS=v4");
    /* the first phase line that asks for it, asking for 1 byte past the limit */
    int lt = 0, threads = 0, shared = 0, target = 0;
    long long above = 0, at_most = 0;
    for (const char *line = strstr(t, "\nphase "); line; line = strstr(line + 1, "\nphase "))
        if (sscanf(line + 1, "phase %d %d %lld %lld %d %d", &lt, &threads, &above, &at_most, &shared, &target) == 6 &&
            shared > 0)
            break;
    cr_assert_gt(shared, 0);
    char old[96], bad[96];
    snprintf(old, sizeof old, "phase %d %d %lld %lld %d %d ", lt, threads, above, at_most, shared, target);
    snprintf(bad, sizeof bad, "phase %d %d %lld %lld %d %d ", lt, threads, above, at_most, STEP_PHASE_MAX_SHARED + 1,
             target);
    expect_refused(t, len, old, bad, 0, "a phase line out of range");
    /* and a target that is none of StepTarget's */
    snprintf(bad, sizeof bad, "phase %d %d %lld %lld %d %d ", lt, threads, above, at_most, shared, 3);
    expect_refused(t, len, old, bad, 0, "a phase line out of range");
    free(t);
    step_program_free(&p);
    step_program_free(&q);
}

Test(step_program, bad_programs_are_refused_with_the_reason)
{
    StepProgram p;
    compile_tiny(&p, 4, 16, PREC_FP32);
    size_t len = 0;
    char *t = program_text(&p, &len);
    expect_refused(t, len, NULL, NULL, len / 2, "truncated");
    expect_refused(t, len, NULL, NULL, len - 4, "truncated: no 'end' line");
    expect_refused(t, len, "step_program 11\n", "step_program 12\n", 0, "format version 12, this hpc reads version 11");
    expect_refused(t, len, "step_program 11\n", "step_program 10\n", 0, "format version 10, this hpc reads version 11");
    expect_refused(t, len, "policy fp32\n", "policy fp12\n", 0, "unknown policy 'fp12'");
    expect_refused(t, len, "fused 1\n", "fused 1\nwidgets 3\n", 0, "unknown field 'widgets'");
    expect_refused(t, len, "spec stack.hidden ", "spec stack.width ", 0, "unknown spec field 'stack.width'");
    expect_refused(t, len, "node linear ", "node lineal ", 0, "unknown op 'lineal'");
    expect_refused(t, len, "node embedding f32 3 -1 -2 128 0 2 2 0 -1 ", "node embedding f32 3 -1 -2 128 0 2 2 700 -1 ",
                   0, "an input is not an earlier node");
    expect_refused(t, len, "node input i32 2 -1 -2 ", "node input i32 2 -1 -7 ", 0, "a dim is neither");
    expect_refused(t, len, "node input i32 2 -1 -2 0 0 0 -1 ", "node input i32 2 -1 -2 0 0 1 0 ", 0,
                   "wrong number of inputs");
    expect_refused(t, len, "end\n", "", 0, "truncated: no 'end' line");
    free(t);
    step_program_free(&p);
}

Test(step_program, artifact_carries_the_program)
{
    StepProgram p, q;
    compile_tiny(&p, 4, 16, PREC_BF16);
    char path[] = "/tmp/hpc_sp_artXXXXXX.hpc";
    int fd = mkstemps(path, 4);
    cr_assert_geq(fd, 0);
    close(fd);
    HpcError err = {0};
    cr_assert_eq(step_program_save(path, &p, NULL, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(step_program_read_file(path, &q, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(q.policy, PREC_BF16);
    cr_expect_str_eq(q.kernels.cuda_source, p.kernels.cuda_source);
    step_program_free(&q);
    /* Asking for another policy compiles the artifact's own model again. */
    cr_assert_eq(step_program_load(path, PREC_FP32, true, &q, stderr, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(q.policy, PREC_FP32);
    step_program_free(&q);
    remove(path);
    step_program_free(&p);
}

static HpcModel *api_open(const char *path)
{
    HpcModelOptions o;
    hpc_model_options_init(&o);
    o.path = path;
    o.max_batch = 2;
    o.max_seq_len = 8;
    HpcModel *m = NULL;
    char msg[2048];
    cr_assert_eq(hpc_model_open(&o, &m, msg, sizeof msg), HPC_API_OK, "%s: %s", path, msg);
    return m;
}

Test(step_program, c_api_runs_the_artifact_program)
{
    StepProgram p;
    compile_tiny(&p, 2, 8, PREC_FP16);
    char path[] = "/tmp/hpc_sp_apiXXXXXX.hpc";
    int fd = mkstemps(path, 4);
    cr_assert_geq(fd, 0);
    close(fd);
    HpcError err = {0};
    cr_assert_eq(step_program_save(path, &p, NULL, &err), HPC_OK, "%s", err.msg);
    step_program_free(&p);
    int32_t ids[16], mask[16];
    for (int i = 0; i < 16; i++) ids[i] = 100 + 37 * i, mask[i] = i % 8 < 6;
    HpcBatch b = {.batch = 2, .seq_len = 8, .input_ids = ids, .attention_mask = mask};
    float la[4] = {0}, lb[4] = {0};
    HpcModel *a = api_open(path);
    HpcModelInfo info;
    cr_assert_eq(hpc_model_info(a, &info), HPC_API_OK);
    cr_expect_eq(info.precision, HPC_PRECISION_FP16, "the artifact's own policy");
    cr_expect_eq(hpc_model_forward(a, &b, la, 4), HPC_API_OK, "%s", hpc_model_error(a));
    hpc_model_free(a);
    HpcModelOptions o;
    hpc_model_options_init(&o);
    o.path = "models/bert_tiny.model";
    o.precision = HPC_PRECISION_FP16;
    o.max_batch = 2;
    o.max_seq_len = 8;
    HpcModel *m = NULL;
    char msg[2048];
    cr_assert_eq(hpc_model_open(&o, &m, msg, sizeof msg), HPC_API_OK, "%s", msg);
    cr_expect_eq(hpc_model_forward(m, &b, lb, 4), HPC_API_OK, "%s", hpc_model_error(m));
    hpc_model_free(m);
    for (int i = 0; i < 4; i++) {
        cr_expect(isfinite(la[i]), "logit %d", i);
        cr_expect_eq(la[i], lb[i], "logit %d: %.9g from the artifact, %.9g from the model", i, la[i], lb[i]);
    }
    remove(path);
}

Test(step_program, emit_cuda_exports_the_step_module)
{
    char dir[] = "/tmp/hpc_sp_emitXXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    ModelSpec s;
    HpcError err = {0};
    load_tiny(&s, 4, 16);
    cr_assert_eq(emitlib_cuda(&s, PREC_BF16, dir, &err), HPC_OK, "%s", err.msg);
    StepProgram p;
    compile_tiny(&p, 4, 16, PREC_BF16);
    char path[512];
    snprintf(path, sizeof path, "%s/bert_tiny_step.cuh", dir);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    char *text = NULL;
    size_t cap = 0;
    ssize_t n = getdelim(&text, &cap, '\0', f);
    fclose(f);
    cr_assert_gt(n, 0);
    cr_expect_not_null(strstr(text, p.kernels.cuda_source), "the exported module is not the step's");
    /* A launch line names each kernel of the first kernel node with its count. */
    for (int i = 0; i < p.kernels.n; i++)
        if (p.kernels.node[i].kind == EOP_KERNELS) {
            char line[256];
            snprintf(line, sizeof line, " %s  count ", p.kernels.node[i].phase[0].name);
            cr_expect_not_null(strstr(text, line), "no launch line for %s", line);
            break;
        }
    /* a count in B and L: the row kernels' one block a (B, L) row (the embedding layer, the LayerNorm sites) */
    cr_expect_not_null(strstr(text, "count 1*B*L;"), "a (B, L) row count in B and L");
    free(text);
    step_program_free(&p);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* compiler/emit_lib_package.c — the --emit-lib package (compiler/emit_lib.h):
 * NAME.h, NAME.c, NAME_demo.c, Makefile, NAME.hpc, NAME.plan.txt, the .cuh
 * and cubins on request. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hpc.h"
#include "program/artifact.h"
#include "step_program_build.h"
#include "emit_lib.h"
#include "emit_lib_internal.h"

/* NAME in upper case for macros. */
static void upper_name(const char *name, char *out, size_t cap)
{
    size_t i = 0;
    for (; name[i] && i + 1 < cap; i++) out[i] = isalnum((unsigned char)name[i]) ? (char)toupper((unsigned char)name[i]) : '_';
    out[i] = '\0';
}

static const char *api_precision_macro(SpecPrecision p)
{
    return p == PREC_FP16 ? "HPC_PRECISION_FP16" : p == PREC_BF16 ? "HPC_PRECISION_BF16" : "HPC_PRECISION_FP32";
}

/* Logits per row (C) and whether logits are per token. */
static void logits_shape(const ModelSpec *s, int64_t *c, int *per_token)
{
    bool lm = s->head.kind == HEAD_MASKED_LM || s->head.kind == HEAD_CAUSAL_LM;
    *c = lm ? s->stack.vocab_size : s->head.num_labels;
    *per_token = s->head.kind != HEAD_SEQ_CLASSIFICATION;
}

static void write_header(FILE *f, const ModelSpec *s, SpecPrecision policy)
{
    const char *n = s->name;
    char U[128];
    upper_name(n, U, sizeof U);
    int64_t c;
    int per_token;
    logits_shape(s, &c, &per_token);
    fprintf(f,
            "/* %s.h: model %s, packaged by `hpc compile --emit-lib` for embedding.\n"
            " * Generated: edit the model, not this file.\n"
            " *\n"
            " * Typed entry points over include/hpc.h (the C API, which documents errors,\n"
            " * threads and memory).  The model is embedded in %s.c, so a program ships\n"
            " * no file besides its binary.  Build: see Makefile (libhpcrt.a, libhpcc.a;\n"
            " * the embedded model text is compiled in-process, so link with\n"
            " * -Wl,--undefined=api_program_from_model).\n"
            " *\n"
            " *   HpcModel *m;\n"
            " *   char msg[512];\n"
            " *   if (%s_open(NULL, &m, msg, sizeof msg)) { fprintf(stderr, \"%%s\\n\", msg); exit(1); }\n"
            " *   float logits[B * %s_LOGITS];\n"
            " *   %s_forward(m, B, L, ids, mask, logits);   // ids, mask: (B, L) int32\n"
            " *   hpc_model_free(m);\n"
            " */\n"
            "#ifndef HPC_PACKAGE_%s_H\n#define HPC_PACKAGE_%s_H\n\n#include \"hpc.h\"\n\n",
            n, n, n, n, U, n, U, U);
    fprintf(f, "/* The hpc.h this package was written for; %s_open refuses another major. */\n", n);
    fprintf(f, "#define %s_HPC_API_VERSION 0x%08xu\n\n", U, (unsigned)HPC_API_VERSION);
    fprintf(f, "#define %s_VOCAB %lld\n#define %s_HIDDEN %lld\n#define %s_LAYERS %lld\n#define %s_HEADS %lld\n",
            U, (long long)s->stack.vocab_size, U, (long long)s->stack.hidden, U, (long long)s->stack.layers, U,
            (long long)s->stack.heads);
    fprintf(f, "#define %s_LABELS %lld\n", U, (long long)s->head.num_labels);
    fprintf(f, "/* logits: (B, %s_LOGITS)%s */\n#define %s_LOGITS %lld\n#define %s_LOGITS_PER_TOKEN %d\n", U,
            per_token ? " per token, i.e. (B, L, C)" : "", U, (long long)c, U, per_token);
    fprintf(f, "#define %s_MAX_BATCH %lld\n#define %s_MAX_SEQ_LEN %lld\n#define %s_PRECISION %s\n\n", U,
            (long long)s->train.batch_size, U, (long long)s->train.max_seq_len, U, api_precision_macro(policy));
    fprintf(f,
            "/* Opens the embedded model.  o may be NULL: cpu backend, %s_PRECISION, the\n"
            " * model's batch and length; otherwise o->path/model_text are ignored. */\n"
            "HpcApiStatus %s_open(const HpcModelOptions *o, HpcModel **m, char *errbuf, size_t errcap);\n"
            "/* logits: (B, %s_LOGITS) f32 (times L when %s_LOGITS_PER_TOKEN). */\n"
            "HpcApiStatus %s_forward(HpcModel *m, int64_t B, int64_t L, const int32_t *input_ids,\n"
            "                        const int32_t *attention_mask, float *logits);\n"
            "/* One optimizer step; labels as HpcBatch.labels. */\n"
            "HpcApiStatus %s_train_step(HpcModel *m, int64_t B, int64_t L, const int32_t *input_ids,\n"
            "                           const int32_t *attention_mask, const int32_t *labels,\n"
            "                           HpcStepReport *report);\n\n#endif\n",
            U, n, U, U, n, n);
}

static void write_text_array(FILE *f, const char *name, const char *text)
{
    fprintf(f, "static const char %s[] = {", name);
    size_t n = strlen(text);
    for (size_t i = 0; i <= n; i++) fprintf(f, "%s%d,", i % 16 ? " " : "\n    ", (unsigned char)text[i]);
    fputs("\n};\n\n", f);
}

static void write_source(FILE *f, const ModelSpec *s, const char *model_text)
{
    const char *n = s->name;
    char U[128];
    upper_name(n, U, sizeof U);
    fprintf(f, "/* %s.c: the entry points of %s.h with the model embedded.  Generated. */\n"
               "#include <stdio.h>\n\n#include \"%s.h\"\n\n/* The resolved model text (`hpc compile`). */\n",
            n, n, n);
    write_text_array(f, "model_text", model_text);
    fprintf(f,
            "HpcApiStatus %s_open(const HpcModelOptions *o, HpcModel **m, char *errbuf, size_t errcap)\n{\n"
            "    if (hpc_api_version() >> 16 != %s_HPC_API_VERSION >> 16) {\n"
            "        if (errbuf && errcap)\n"
            "            snprintf(errbuf, errcap, \"%s_open: package written for hpc API %%u.x, library is \"\n"
            "                     \"%%u.x; re-run hpc compile --emit-lib with this library's hpc\",\n"
            "                     (unsigned)(%s_HPC_API_VERSION >> 16), (unsigned)(hpc_api_version() >> 16));\n"
            "        if (m) *m = NULL;\n"
            "        return HPC_API_ERR_USAGE;\n    }\n"
            "    HpcModelOptions opts;\n"
            "    if (o) opts = *o;\n"
            "    else {\n        hpc_model_options_init(&opts);\n        opts.precision = %s_PRECISION;\n    }\n"
            "    opts.path = NULL;\n    opts.model_text = model_text;\n"
            "    return hpc_model_open(&opts, m, errbuf, errcap);\n}\n\n",
            n, U, n, U, U);
    fprintf(f,
            "HpcApiStatus %s_forward(HpcModel *m, int64_t B, int64_t L, const int32_t *input_ids,\n"
            "                        const int32_t *attention_mask, float *logits)\n{\n"
            "    HpcBatch b = {.batch = B, .seq_len = L, .input_ids = input_ids, .attention_mask = attention_mask};\n"
            "    size_t rows = (size_t)(B > 0 ? B : 0) * (%s_LOGITS_PER_TOKEN ? (size_t)(L > 0 ? L : 0) : 1);\n"
            "    return hpc_model_forward(m, &b, logits, rows * %s_LOGITS);\n}\n\n",
            n, U, U);
    fprintf(f,
            "HpcApiStatus %s_train_step(HpcModel *m, int64_t B, int64_t L, const int32_t *input_ids,\n"
            "                           const int32_t *attention_mask, const int32_t *labels,\n"
            "                           HpcStepReport *report)\n{\n"
            "    HpcBatch b = {.batch = B, .seq_len = L, .input_ids = input_ids, .attention_mask = attention_mask,\n"
            "                  .labels = labels};\n"
            "    return hpc_model_train_step(m, &b, report);\n}\n",
            n);
}

/* A program that opens the package and runs one forward pass: the smoke
 * test of a fresh package (`make run`). */
static void write_demo(FILE *f, const ModelSpec *s)
{
    const char *n = s->name;
    char U[128];
    upper_name(n, U, sizeof U);
    fprintf(f,
            "/* %s_demo.c: opens the packaged model and prints the logits of two rows. */\n"
            "#include <stdio.h>\n\n#include \"%s.h\"\n\n"
            "int main(void)\n{\n"
            "    HpcModelOptions o;\n    hpc_model_options_init(&o);\n    o.precision = %s_PRECISION;\n"
            "    o.max_batch = 2;\n    o.max_seq_len = 8;\n"
            "    HpcModel *m;\n    char msg[1024];\n"
            "    if (%s_open(&o, &m, msg, sizeof msg)) {\n        fprintf(stderr, \"%%s\\n\", msg);\n        return 1;\n    }\n"
            "    int32_t ids[2 * 8], mask[2 * 8];                  /* (2, 8) */\n"
            "    for (int i = 0; i < 16; i++) {\n"
            "        ids[i] = (int32_t)((i * 7919 + 101) %% %s_VOCAB);\n        mask[i] = i %% 8 < 6;\n    }\n"
            "    static float logits[2 * 8 * %s_LOGITS];\n"
            "    HpcApiStatus st = %s_forward(m, 2, 8, ids, mask, logits);\n"
            "    if (st) fprintf(stderr, \"%%s\\n\", hpc_model_error(m));\n"
            "    else printf(\"%s: logits[0][0..1] = %%g %%g\\n\", logits[0], logits[1]);\n"
            "    hpc_model_free(m);\n    return (int)st;\n}\n",
            n, n, U, n, U, U, n, n);
}

static void write_makefile(FILE *f, const ModelSpec *s, const char *hpc_root)
{
    const char *n = s->name;
    fprintf(f,
            "# Makefile of the %s package (hpc compile --emit-lib).  Generated.\n"
            "#   make            lib%s.a and %s_demo\n"
            "#   make run        runs the demo (cpu backend)\n"
            "# HPC_ROOT is the hpc checkout with include/hpc.h and build/lib*.a (after `make`).\n"
            "HPC_ROOT ?= %s\n"
            "CC       ?= gcc\nCFLAGS   ?= -O2 -g\nCFLAGS   += -std=c11 -Wall -I$(HPC_ROOT)/include\n"
            "HPC_LIBS := $(HPC_ROOT)/build/libhpcrt.a $(HPC_ROOT)/build/libhpcc.a\n"
            "LDLIBS   := -Wl,-Bstatic -ljansson -lutf8proc -Wl,-Bdynamic -ldl -lpthread -lm\n\n"
            ".PHONY: all run clean\nall: lib%s.a %s_demo\n\n"
            "lib%s.a: %s.o\n\tar rcs $@ $^\n"
            "%s.o: %s.c %s.h\n\t$(CC) $(CFLAGS) -c -o $@ $<\n"
            "%s_demo: %s_demo.c lib%s.a\n\t$(CC) $(CFLAGS) -o $@ $< -Wl,--undefined=api_program_from_model lib%s.a "
            "$(HPC_LIBS) $(LDLIBS)\n\n"
            "run: %s_demo\n\t./%s_demo\n\n"
            "clean:\n\trm -f %s.o lib%s.a %s_demo\n",
            n, n, n, hpc_root, n, n, n, n, n, n, n, n, n, n, n, n, n, n, n, n);
}

static HpcStatus write_file(const char *dir, const char *name, const char *ext, const ModelSpec *s,
                            void (*fn)(FILE *, const ModelSpec *, const void *), const void *arg, HpcError *err)
{
    char path[4096];
    FILE *f;
    HpcStatus st = emitlib_open(dir, name, ext, path, sizeof path, &f, err);
    if (st) return st;
    fn(f, s, arg);
    return emitlib_close(f, path, err);
}

static void w_header(FILE *f, const ModelSpec *s, const void *a) { write_header(f, s, *(const SpecPrecision *)a); }
static void w_source(FILE *f, const ModelSpec *s, const void *a) { write_source(f, s, a); }
static void w_demo(FILE *f, const ModelSpec *s, const void *a) { write_demo(f, s); }
static void w_makefile(FILE *f, const ModelSpec *s, const void *a) { write_makefile(f, s, a); }
static void w_text(FILE *f, const ModelSpec *s, const void *a) { fputs(a, f); }

static HpcStatus write_blob(const char *path, const void *data, size_t n, HpcError *err)
{
    FILE *f;
    HpcStatus st = emitlib_open_path(path, &f, err);
    if (st) return st;
    fwrite(data, 1, n, f);
    return emitlib_close(f, path, err);
}

/* NAME_kernels.sm_XX.cubin for each arch. */
static HpcStatus write_cubins(const ModelSpec *s, const EmitLibOptions *o, const char *src, const char *dir,
                              HpcError *err)
{
    if (o->n_archs > 0 && !o->compile)
        return hpc_fail(err, HPC_ERR_INTERNAL, "emit: cubins asked for without a compiler");
    for (int i = 0; i < o->n_archs; i++) {
        void *cubin = NULL;
        size_t n = 0;
        char name[128], path[4096];
        snprintf(name, sizeof name, "%s_kernels", s->name);
        HpcStatus st = o->compile(src, name, o->archs[i], &cubin, &n, err);
        if (st) return st;
        snprintf(path, sizeof path, "%s/%s_kernels.sm_%d.cubin", dir, s->name, o->archs[i]);
        st = write_blob(path, cubin, n, err);
        free(cubin);
        if (st) return st;
    }
    return HPC_OK;
}

/* The step module (every node's kernel, then the optimizer) for each arch:
 * into the artifact, so NAME.hpc starts without NVRTC on such a GPU, and
 * beside it as NAME_step.sm_XX.cubin, the compiled NAME_step.cuh. */
static HpcStatus add_step_cubins(StepProgram *prog, const EmitLibOptions *o, const char *dir, HpcError *err)
{
    if (o->n_archs > 0 && !o->compile)
        return hpc_fail(err, HPC_ERR_INTERNAL, "emit: cubins asked for without a compiler");
    for (int i = 0; i < o->n_archs; i++) {
        void *cubin = NULL;
        size_t n = 0;
        char name[sizeof prog->name + 8], path[4096];
        snprintf(name, sizeof name, "%s_step", prog->name);
        HpcStatus st = o->compile(prog->kernels.cuda_source, name, o->archs[i], &cubin, &n, err);
        if (st) return st;
        st = step_kernels_add_cubin(&prog->kernels, o->archs[i], cubin, n, err);
        snprintf(path, sizeof path, "%s/%s_step.sm_%d.cubin", dir, prog->name, o->archs[i]);
        if (!st) st = write_blob(path, cubin, n, err);
        free(cubin);
        if (st) return st;
    }
    return HPC_OK;
}

HpcStatus emitlib_package(const ModelSpec *spec, const EmitLibOptions *o, const char *dir, HpcError *err)
{
    char *src = NULL, *text = artifact_model_text(spec), root[4096];
    const char *hpc_root = o->hpc_root ? o->hpc_root : "/path/to/hpc";
    snprintf(root, sizeof root, "%s", hpc_root);
    HpcStatus st = emitlib_check_cuda(spec, o->policy, err);
    if (!st) st = emitlib_write_cuh(spec, o->policy, dir, &src, NULL, err);
    if (!st) st = emitlib_step(spec, o->policy, dir, err);
    char demo[160];
    snprintf(demo, sizeof demo, "%s_demo", spec->name);
    if (!st) st = write_file(dir, spec->name, ".h", spec, w_header, &o->policy, err);
    if (!st) st = write_file(dir, spec->name, ".c", spec, w_source, text, err);
    if (!st) st = write_file(dir, demo, ".c", spec, w_demo, NULL, err);
    if (!st) st = write_file(dir, "Makefile", "", spec, w_makefile, root, err);
    if (!st && o->plan_text) st = write_file(dir, spec->name, ".plan.txt", spec, w_text, o->plan_text, err);
    if (!st) {
        /* The artifact carries the step program, so `hpc run` and the C
         * API run it without compiling (program/step_program.h). */
        StepProgram prog;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s%s", dir, spec->name, ARTIFACT_EXT);
        st = step_program_compile(spec, o->policy, true, &prog, err);
        if (!st) st = add_step_cubins(&prog, o, dir, err);
        if (!st) st = step_program_save(path, &prog, o->plan_text, err);
        step_program_free(&prog);
    }
    if (!st) st = write_cubins(spec, o, src, dir, err);
    free(src);
    free(text);
    return st;
}

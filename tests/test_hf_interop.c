/* tests/test_hf_interop.c — the library calls behind `hpc import` and
 * `hpc export` (runtime/formats/hf_import.h, hf_export.h), called directly
 * on the tiny Hugging Face folder of tests/hf_tiny.h:
 *   - import: the spec, the model text (loads back into the same spec),
 *     what was found, the new-head note, the atomic save and its refusals;
 *   - export: the folder's weights loaded into a checkpoint, exported again:
 *     every tensor of the export has the bits of the original folder's, and
 *     the exported folder imports into the same architecture;
 *   - bad folders (missing, no config.json, pickles only) and outputs onto
 *     an input are refused with messages that name the file. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/hf_export.h"
#include "formats/hf_import.h"
#include "formats/hf_init.h"
#include "formats/safetensors.h"
#include "train/checkpoint.h"
#include "train/init.h"
#include "train/lossscale.h"
#include "hf_tiny.h"
#include "compiler/spec_load.h"

static char root[PATH_MAX], work[PATH_MAX], tiny[PATH_MAX + 16];

static void setup(void)
{
    cr_assert(getcwd(root, sizeof root));
    if (getenv("HPC_ROOT")) snprintf(root, sizeof root, "%s", getenv("HPC_ROOT"));
    snprintf(work, sizeof work, "/tmp/hpc_test_hf_interop_%d", (int)getpid());
    cr_assert_eq(mkdir(work, 0755), 0, "mkdir %s", work);
    snprintf(tiny, sizeof tiny, "%s/tiny", work);
    hf_tiny_make(root, tiny);
}

static void teardown(void)
{
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
    cr_assert_eq(system(cmd), 0);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

Test(hf_import, names)
{
    char name[64];
    hf_import_name("models/bert-base-uncased/", NULL, name, sizeof name);
    cr_expect_str_eq(name, "bert_base_uncased");
    hf_import_name("models/bert-base-uncased", "out/cola-1.model", name, sizeof name);
    cr_expect_str_eq(name, "cola_1");
    hf_import_name("x", ".model", name, sizeof name);
    cr_expect_str_eq(name, "imported");
}

Test(hf_import, tiny_folder, .init = setup, .fini = teardown)
{
    HfImport imp;
    HpcError err = {0};
    HfImportOptions opt = {.head = "masked_lm"};   /* a head the checkpoint lacks: new parameters */
    cr_assert_eq(hf_import_folder(tiny, &opt, "tiny_cola", &imp, &err), HPC_OK, "%s", err.msg);
    cr_expect_str_eq(imp.spec.name, "tiny_cola");
    cr_expect_str_eq(imp.info.model_type, "bert");
    cr_expect_eq(imp.spec.stack.hidden, 32);
    cr_expect_eq(imp.spec.stack.layers, 2);
    cr_expect_eq(imp.spec.stack.heads, 4);
    cr_expect_eq(imp.spec.stack.ffn, 37);
    cr_expect_eq(imp.spec.stack.vocab_size, 30522);
    cr_expect_eq(imp.spec.head.kind, HEAD_MASKED_LM);
    cr_expect(strstr(imp.weights, "model.safetensors (") && strstr(imp.weights, "all parameters found"), "%s",
              imp.weights);
    bool new_head = false, unused = false;
    for (int i = 0; i < imp.n_notes; i++) {
        new_head |= strstr(imp.notes[i], "the checkpoint has no masked_lm head") != NULL;
        unused |= strstr(imp.notes[i], "checkpoint tensor classifier.weight is not used") != NULL;
    }
    cr_expect(new_head && unused, "notes should name the new head and the unused classifier (%d notes: %s)",
              imp.n_notes, imp.n_notes ? imp.notes[0] : "");
    /* The text is a model the front end accepts, equal to the spec. */
    ModelSpec back;
    cr_assert_eq(spec_load_string("tiny_cola", imp.text, imp.text_len, NULL, &back, stderr), 0);
    cr_expect_eq(back.stack.hidden, 32);
    cr_expect_eq(back.stack.ffn, 37);
    cr_expect_eq(back.head.kind, HEAD_MASKED_LM);
    cr_expect_str_eq(back.name, "tiny_cola");
    /* Saved atomically; the same bytes on disk. */
    char out[PATH_MAX + 32];
    snprintf(out, sizeof out, "%s/tiny_cola.model", work);
    cr_assert_eq(hf_import_save(&imp, "-o", out, &err), HPC_OK, "%s", err.msg);
    char *disk = slurp(out);
    cr_expect_eq(strlen(disk), imp.text_len);
    cr_expect(memcmp(disk, imp.text, imp.text_len) == 0);
    free(disk);
    /* Never onto the files it imports. */
    char cfg[PATH_MAX + 64];
    snprintf(cfg, sizeof cfg, "%s/config.json", tiny);
    cr_expect_eq(hf_import_save(&imp, "-o", cfg, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "the config.json being imported"), "%s", err.msg);
    snprintf(cfg, sizeof cfg, "%s/model.safetensors", tiny);
    cr_expect_eq(hf_import_save(&imp, "-o", cfg, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "the weights being imported"), "%s", err.msg);
    hf_import_free(&imp);
}

Test(hf_import, bad_folders, .init = setup, .fini = teardown)
{
    HfImport imp;
    HpcError err = {0};
    cr_expect_eq(hf_import_folder("/nonexistent/hf", NULL, "x", &imp, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "/nonexistent/hf: not a directory"), "%s", err.msg);
    hf_import_free(&imp);
    cr_expect_eq(hf_import_folder(work, NULL, "x", &imp, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "no config.json there"), "%s", err.msg);
    hf_import_free(&imp);
    /* Pickles only: refused with the conversion command. */
    char path[PATH_MAX + 64], cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "mv '%s/model.safetensors' '%s/pytorch_model.bin'", tiny, tiny);
    cr_assert_eq(system(cmd), 0);
    cr_expect_eq(hf_import_folder(tiny, NULL, "x", &imp, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "pytorch_model.bin") && strstr(err.msg, "BertForSequenceClassification") &&
              strstr(err.msg, "safe_serialization=True"), "%s", err.msg);
    hf_import_free(&imp);
    /* No weights at all: the architecture only. */
    snprintf(path, sizeof path, "%s/pytorch_model.bin", tiny);
    cr_assert_eq(remove(path), 0);
    cr_assert_eq(hf_import_folder(tiny, NULL, "x", &imp, &err), HPC_OK, "%s", err.msg);
    cr_expect(strstr(imp.weights, "none"), "%s", imp.weights);
    hf_import_free(&imp);
}

/* The folder's weights through a checkpoint and back out: the same bits. */
Test(hf_export, tiny_round_trip, .init = setup, .fini = teardown)
{
    HfImport imp;
    HpcError err = {0};
    cr_assert_eq(hf_import_folder(tiny, NULL, "tiny", &imp, &err), HPC_OK, "%s", err.msg);
    ModelSpec spec = imp.spec;
    hf_import_free(&imp);
    IrGraph g;
    ParamList pl;
    ir_init(&g);
    params_init(&pl);
    cr_assert_eq(lower_model(&spec, &g, &pl, &err), HPC_OK, "%s", err.msg);
    ParamStore ps;
    cr_assert_eq(init_store(&ps, &pl, 1, &err), HPC_OK, "%s", err.msg);
    HfInitReport rep;
    cr_assert_eq(hf_init_load(tiny, &pl, ps.w, &rep, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(rep.n_new, 0);
    char ckpt[PATH_MAX + 32], out[PATH_MAX + 32], path[PATH_MAX + 64];
    snprintf(ckpt, sizeof ckpt, "%s/ck", work);
    TrainState ts = {.spec = &spec, .pl = &pl, .policy = PREC_FP32, .w = ps.w, .step = 3, .micro_step = 3,
                     .total_steps = 10};
    LossScaleConfig lc;
    ls_config_from_spec(&lc, &spec.train);
    ls_init(&ts.ls, &lc);
    cr_assert_eq(checkpoint_save(ckpt, &ts, &err), HPC_OK, "%s", err.msg);

    snprintf(out, sizeof out, "%s/exported", work);
    HfExportReport er;
    cr_assert_eq(hf_export_checkpoint(ckpt, NULL, out, "--hf", &er, &err), HPC_OK, "%s", err.msg);
    cr_expect_str_eq(er.model, "tiny");
    cr_expect_str_eq(er.model_type, "bert");
    cr_expect_eq(er.n_params, params_total(&pl));
    StFile *a, *b;
    snprintf(path, sizeof path, "%s/model.safetensors", tiny);
    cr_assert_eq(st_open(path, &a, &err), HPC_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    cr_assert_eq(st_open(path, &b, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(st_count(a), st_count(b));
    for (int64_t i = 0; i < st_count(b); i++) {
        const StTensor *tb = st_tensor(b, i), *ta = st_find(a, tb->name);
        cr_assert(ta, "%s is not in the original folder", tb->name);
        cr_expect_eq(ta->nbytes, tb->nbytes, "%s", tb->name);
        cr_expect(ta->nbytes == tb->nbytes && memcmp(ta->data, tb->data, tb->nbytes) == 0, "%s differs",
                  tb->name);
    }
    st_close(a);
    st_close(b);
    /* The exported folder imports into the same architecture. */
    cr_assert_eq(hf_import_folder(out, NULL, "tiny", &imp, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(imp.spec.stack.hidden, spec.stack.hidden);
    cr_expect_eq(imp.spec.stack.ffn, spec.stack.ffn);
    cr_expect_eq(imp.spec.head.num_labels, spec.head.num_labels);
    hf_import_free(&imp);
    /* Never into the checkpoint itself; an unknown family is named. */
    cr_expect_eq(hf_export_checkpoint(ckpt, NULL, ckpt, "--hf", &er, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "that is the checkpoint folder"), "%s", err.msg);
    cr_expect_eq(hf_export_checkpoint(ckpt, "t5", out, "--hf", &er, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "--model-type t5"), "%s", err.msg);
    /* A family that cannot hold the model is named before OUT_DIR is made (it was left behind, empty). */
    snprintf(path, sizeof path, "%s/as_gpt2", work);
    cr_expect_eq(hf_export_checkpoint(ckpt, "gpt2", path, "--hf", &er, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "export: --model-type gpt2: model tiny cannot be written as a gpt2 config"), "%s",
              err.msg);
    cr_expect_neq(access(path, F_OK), 0, "%s was made", path);
    init_store_free(&ps);
    params_free(&pl);
    ir_free(&g);
}

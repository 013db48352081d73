/* cli/cmd_import.c — `hpc import`: a Hugging Face model directory -> .model.
 *
 * Reads HF_DIR/config.json (runtime/hf_config), checks that the weights are
 * in safetensors form (runtime/safetensors validates every header), writes
 * the .model text, loads it back with spec_load_string as a last check, and
 * only then replaces the output file atomically (runtime/atomic_file). */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/atomic_file.h"
#include "formats/output_check.h"
#include "cli.h"
#include "formats/hf_config.h"
#include "formats/hf_names.h"
#include "lower.h"
#include "formats/safetensors.h"

typedef struct {
    const char *dir;   /* HF_DIR, the positional argument */
    const char *out;
    HfImportOptions opt;
} ImportArgs;

#define A(f) offsetof(ImportArgs, f)
static const CliOpt import_opts[] = {
    {.name = "output", .short_name = 'o', .kind = CLI_STR, .off = A(out), .meta = "FILE",
     .help = "output file (default: NAME.model in the current directory, NAME from HF_DIR); replaced atomically"},
    {.name = "head", .kind = CLI_STR, .off = A(opt.head), .meta = "KIND",
     .help = "classifier, token_classifier, masked_lm or causal_lm, instead of the head in config.json"},
    {.name = "labels", .kind = CLI_INT, .off = A(opt.num_labels), .meta = "N", .min = 1, .max = 1 << 20,
     .help = "number of labels for a classifier head"},
    CLI_END,
};
#undef A

const CliCommand cli_import_command = {
    .name = "import", .args = "HF_DIR", .arg_name = "HF_DIR", .min_args = 1, .max_args = 1,
    .about = "Writes a .model file for the Hugging Face transformers model saved in\n"
             "HF_DIR (config.json and model.safetensors, as save_pretrained writes\n"
             "them).  Supported: BERT, RoBERTa, DistilBERT and GPT-2 (model_type bert,\n"
             "roberta, distilbert, gpt2).  The head follows config.json's\n"
             "\"architectures\"; the train block gets hpc's defaults to edit.\n",
    .footer = "Weights saved as pytorch_model.bin must be converted first, with the\n"
              "class named in config.json's \"architectures\" (AutoModel would drop the head):\n"
              "  python -c \"from transformers import BertForSequenceClassification as M; "
              "M.from_pretrained('D').save_pretrained('D', safe_serialization=True)\"\n",
    .sections = {{"options", import_opts, 0}},
};

static bool exists(const char *dir, const char *name, char *path, size_t cap)
{
    struct stat st;
    snprintf(path, cap, "%s/%s", dir, name);
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Every parameter the spec lowers to must be in the checkpoint with the
 * right shape; tensors no parameter uses are reported, not fatal. */
static HpcStatus match_weights(const ModelSpec *spec, const HfConfigInfo *info, const StFile *f, HpcError *err)
{
    IrGraph g;
    ParamList pl;
    ir_init(&g);
    params_init(&pl);
    HpcStatus st = lower_model(spec, &g, &pl, err);
    const char *fresh[8];
    int n_new = 0;
    if (!st) st = hf_names_check(info->model_type, f, &pl, fresh, 8, &n_new, err);
    if (!st && n_new > 0)
        fprintf(stderr, "hpc import: note: the checkpoint has no %s head: %d new parameters (%s%s) start from "
                "their initializer\n", spec->head.regression ? "regression" : spec_head_kind_name(spec->head.kind),
                n_new, fresh[0], n_new > 1 ? ", ..." : "");
    if (!st) {
        const char *unused[8];
        int n = hf_names_unused(info->model_type, f, &pl, unused, 8);
        for (int i = 0; i < n && i < 8; i++)
            fprintf(stderr, "hpc import: note: checkpoint tensor %s is not used by this model\n", unused[i]);
        if (n > 8) fprintf(stderr, "hpc import: note: ... and %d more unused tensors\n", n - 8);
    }
    params_free(&pl);
    ir_free(&g);
    return st;
}

/* Validates the weights: one model.safetensors (header and names against
 * the model), or the shards an index names (checked when training loads
 * them).  A directory with only PyTorch pickles is refused: hpc never
 * unpickles. */
static HpcStatus check_weights(const char *dir, const ModelSpec *spec, const HfConfigInfo *info, char *found,
                               size_t cap, HpcError *err)
{
    char path[4096];
    if (exists(dir, "model.safetensors", path, sizeof path)) {
        StFile *f;
        HpcStatus st = st_open(path, &f, err);
        if (st) return st;
        snprintf(found, cap, "%s (%lld tensors, all parameters found)", path, (long long)st_count(f));
        st = match_weights(spec, info, f, err);
        st_close(f);
        return st;
    }
    if (exists(dir, "model.safetensors.index.json", path, sizeof path)) {
        snprintf(found, cap, "%s (sharded; not checked here)", path);
        return HPC_OK;
    }
    if (exists(dir, "pytorch_model.bin", path, sizeof path) ||
        exists(dir, "pytorch_model.bin.index.json", path, sizeof path))
        /* The checkpoint's own class keeps its task head; AutoModel would
         * drop it. */
        return hpc_fail(err, HPC_ERR_INPUT,
                        "%s holds PyTorch pickle weights (%s) and no model.safetensors; hpc reads only "
                        "safetensors.  Convert once with:\n  python -c \"from transformers import %s as M; "
                        "M.from_pretrained('%s').save_pretrained('%s', safe_serialization=True)\"",
                        dir, path, *info->architecture ? info->architecture : "AutoModel", dir, dir);
    snprintf(found, cap, "none (the .model describes the architecture only)");
    return HPC_OK;
}

/* NAME for `model NAME`: from -o's file name, else from HF_DIR. */
static void pick_name(const ImportArgs *a, ModelSpec *spec)
{
    const char *src = a->out;
    if (!src) {
        size_t n = strlen(a->dir);
        while (n > 1 && a->dir[n - 1] == '/') n--;
        const char *base = a->dir + n;
        while (base > a->dir && base[-1] != '/') base--;
        char tmp[256];
        snprintf(tmp, sizeof tmp, "%.*s", (int)(a->dir + n - base), base);
        hf_model_name(tmp, spec->name, sizeof spec->name);
        return;
    }
    const char *slash = strrchr(src, '/');
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s", slash ? slash + 1 : src);
    char *dot = strstr(tmp, ".model");
    if (dot && dot[6] == '\0') *dot = '\0';
    hf_model_name(*tmp ? tmp : "imported", spec->name, sizeof spec->name);
}

/* The text, loaded back through the real front end before it is written:
 * an import never leaves a file that `hpc check` would reject. */
static HpcStatus render(const ModelSpec *spec, const HfConfigInfo *info, char **text, size_t *len,
                        HpcError *err)
{
    FILE *mem = open_memstream(text, len);
    if (!mem) return hpc_fail(err, HPC_ERR_OOM, "open_memstream: %s", strerror(errno));
    hf_model_write(spec, info, mem);
    fclose(mem);
    ModelSpec back;
    int rc = spec_load_string(spec->name, *text, *len, NULL, &back, stderr);
    if (rc != 0)
        return hpc_fail(err, HPC_ERR_INTERNAL, "the .model text written for %s does not load (a bug in "
                        "hpc import; the diagnostics are above)", spec->source);
    return HPC_OK;
}

int cmd_import(int argc, char **argv)
{
    ImportArgs a = {0};
    CliParsed p;
    HpcError err = {0};
    int rc = cli_parse(&cli_import_command, argc, argv, &a, &p, &err);
    if (rc) return rc == CLI_HELP_SHOWN ? HPC_OK : cli_report(&err);
    a.dir = p.args[0];
    char config[4096], weights[4200], out_path[300];
    struct stat st;
    bool is_dir = stat(a.dir, &st) == 0 && S_ISDIR(st.st_mode);
    if (!is_dir) {
        hpc_fail(&err, HPC_ERR_INPUT, "import %s: not a directory; give the folder that holds config.json", a.dir);
        return cli_report(&err);
    }
    if (!exists(a.dir, "config.json", config, sizeof config)) {
        hpc_fail(&err, HPC_ERR_INPUT, "import %s: no config.json there; is it a transformers save_pretrained "
                 "folder?", a.dir);
        return cli_report(&err);
    }
    ModelSpec spec;
    HfConfigInfo info;
    HpcStatus s = hf_config_load(config, &a.opt, &spec, &info, &err);
    if (!s) s = check_weights(a.dir, &spec, &info, weights, sizeof weights, &err);
    if (s) return cli_report(&err);
    pick_name(&a, &spec);
    if (!a.out) snprintf(out_path, sizeof out_path, "%s.model", spec.name);
    const char *out = a.out ? a.out : out_path;
    char *text = NULL;
    size_t len = 0;
    char st_path[4200], index_path[4200];
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", a.dir);
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", a.dir);
    OutputInput inputs[] = {{"the config.json being imported", config}, {"the weights being imported", st_path},
                            {"the weight index being imported", index_path}};
    s = output_check_not_input("-o", out, inputs, 3, &err);
    if (!s) s = render(&spec, &info, &text, &len, &err);
    if (!s) s = atomic_write_file(out, text, len, &err);
    free(text);
    if (s) return cli_report(&err);
    for (int i = 0; i < info.n_notes; i++) fprintf(stderr, "hpc import: note: %s\n", info.notes[i]);
    printf("wrote %s: model %s, %s %s, %lld layers, hidden %lld, head %s\nweights: %s\n", out, spec.name,
           info.model_type, spec_stack_kind_name(spec.stack.kind), (long long)spec.stack.layers,
           (long long)spec.stack.hidden, spec.head.regression ? "regression" : spec_head_kind_name(spec.head.kind),
           weights);
    return HPC_OK;
}

/* runtime/formats/hf_tokenizer.c — see hf_tokenizer.h. */
#include "formats/hf_tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/atomic_file.h"

static bool is_file(const char *path)
{
    struct stat s;
    return stat(path, &s) == 0 && S_ISREG(s.st_mode);
}

HpcStatus hf_tokenizer_read(const char *dir, HfTokenizerInfo *info, HpcError *err)
{
    memset(info, 0, sizeof *info);
    char path[4096];
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    if (is_file(path)) snprintf(info->vocab, sizeof info->vocab, "%s", path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (!is_file(path)) return HPC_OK;
    snprintf(info->config, sizeof info->config, "%s", path);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return hpc_fail(err, HPC_ERR_INPUT, "%s:%d:%d: %s; fix or remove the file (it sets the tokenizer's casing)",
                        path, je.line, je.column, je.text);
    json_t *lower = json_is_object(root) ? json_object_get(root, "do_lower_case") : NULL;
    HpcStatus st = HPC_OK;
    if (lower && !json_is_boolean(lower))
        st = hpc_fail(err, HPC_ERR_INPUT, "%s: \"do_lower_case\" is not true or false", path);
    else if (lower) {
        info->has_lower_case = true;
        info->do_lower_case = json_is_true(lower);
    }
    json_decref(root);
    return st;
}

/* The whole of path into a new heap buffer. */
static HpcStatus read_all(const char *path, char **data, size_t *n, HpcError *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return hpc_fail(err, HPC_ERR_IO, "cannot open vocabulary %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = xmalloc(cap);
    for (size_t got; (got = fread(buf + len, 1, cap - len, f)) > 0;) {
        len += got;
        if (len == cap) buf = xrealloc(buf, cap *= 2);
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return hpc_fail(err, HPC_ERR_IO, "cannot read vocabulary %s", path);
    }
    *data = buf;
    *n = len;
    return HPC_OK;
}

static HpcStatus write_json(const char *dir, const char *name, json_t *o, HpcError *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!text) return hpc_fail(err, HPC_ERR_OOM, "%s: out of memory", path);
    size_t n = strlen(text);
    text = xrealloc(text, n + 2);
    text[n] = '\n';
    HpcStatus st = atomic_write_file(path, text, n + 1, err);
    free(text);
    return st;
}

/* BERT's special tokens, the same in every WordPiece vocabulary here. */
static json_t *special_tokens(void)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:s}", "unk_token", "[UNK]", "sep_token", "[SEP]", "pad_token", "[PAD]",
                     "cls_token", "[CLS]", "mask_token", "[MASK]");
}

HpcStatus hf_tokenizer_write(const char *dir, const char *vocab_path, bool lower_case, int64_t max_len,
                             HpcError *err)
{
    char *vocab = NULL;
    size_t n = 0;
    HpcStatus st = read_all(vocab_path, &vocab, &n, err);
    if (st) return st;
    char path[4200];
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    st = atomic_write_file(path, vocab, n, err);
    free(vocab);
    json_t *cfg = special_tokens();
    /* strip_accents null: BertTokenizer then follows do_lower_case, as hpc's tokenizer does. */
    json_object_set_new(cfg, "do_lower_case", json_boolean(lower_case));
    json_object_set_new(cfg, "strip_accents", json_null());
    json_object_set_new(cfg, "tokenize_chinese_chars", json_true());
    json_object_set_new(cfg, "model_max_length", json_integer((json_int_t)max_len));
    json_object_set_new(cfg, "tokenizer_class", json_string("BertTokenizer"));
    if (!st) st = write_json(dir, "tokenizer_config.json", cfg, err);
    else json_decref(cfg);
    if (!st) st = write_json(dir, "special_tokens_map.json", special_tokens(), err);
    return st;
}

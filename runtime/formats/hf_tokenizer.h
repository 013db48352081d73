/* runtime/formats/hf_tokenizer.h — the tokenizer files of a Hugging Face
 * model folder: vocab.txt, tokenizer_config.json, special_tokens_map.json.
 *
 * hf_tokenizer_read looks in DIR for the settings `hpc run --init DIR`
 * takes over: DIR/vocab.txt (the WordPiece vocabulary the model was trained
 * with) and tokenizer_config.json's "do_lower_case".  Absent files are not
 * an error (info says what was found); a tokenizer_config.json that is not
 * JSON fails with HPC_ERR_INPUT naming file:line:col, and a do_lower_case
 * that is not true or false names the field.
 *
 * hf_tokenizer_write puts a BertTokenizer's three files into DIR (each
 * replaced atomically, runtime/formats/atomic_file.h): vocab.txt copied
 * byte for byte from vocab_path, tokenizer_config.json with do_lower_case
 * and model_max_length, special_tokens_map.json with BERT's [UNK] [SEP]
 * [PAD] [CLS] [MASK].  transformers' AutoTokenizer loads the result.
 *
 * Usage:
 *   HfTokenizerInfo ti;
 *   if (hf_tokenizer_read("minilm", &ti, &err)) return err.code;
 *   const char *vocab = ti.vocab[0] ? ti.vocab : default_vocab;
 */
#ifndef HPC_RUNTIME_HF_TOKENIZER_H
#define HPC_RUNTIME_HF_TOKENIZER_H

#include <stdbool.h>
#include <stdint.h>

#include "util/error.h"

typedef struct {
    char vocab[4096];        /* DIR/vocab.txt when it exists, else "" */
    bool has_lower_case;     /* tokenizer_config.json sets do_lower_case */
    bool do_lower_case;      /* its value (meaningful when has_lower_case) */
    char config[4096];       /* DIR/tokenizer_config.json when it exists, else "" */
} HfTokenizerInfo;

HpcStatus hf_tokenizer_read(const char *dir, HfTokenizerInfo *info, HpcError *err);

HpcStatus hf_tokenizer_write(const char *dir, const char *vocab_path, bool lower_case, int64_t max_len,
                             HpcError *err);

#endif

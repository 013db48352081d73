/* runtime/data/tokenizer.h — BERT WordPiece tokenization, id-for-id identical to
 * Hugging Face's BertTokenizer / BertTokenizerFast for the same vocab.txt.
 *
 * Pipeline for one text (docs/data.md has the details and the references):
 *   1. validate UTF-8: malformed input is an error naming the byte offset
 *      (HF receives Python str and never sees bad bytes, so nothing to match);
 *   2. clean: drop U+0000, U+FFFD and control characters (Unicode Cc, Cf,
 *      Co, Cs, except \t \n \r); every whitespace (\t \n \r and Zs, Zl,
 *      Zp) becomes a space;
 *   3. put spaces around CJK ideographs (the CJK Unified Ideographs blocks);
 *   4. split on whitespace; uncased: lower-case, then NFD and drop
 *      non-spacing marks (Mn), i.e. strip accents;
 *   5. split off each punctuation character (ASCII !-/ :-@ [-` {-~ and
 *      Unicode P*) as its own word;
 *   6. WordPiece: greedy longest match from the left, continuation pieces
 *      looked up with a "##" prefix; a word with no full cover, or longer
 *      than 100 characters (code points), becomes one [UNK].
 * Unicode tables come from utf8proc (categories, case mapping, NFD), except
 * for the code points listed in tokenizer_unicode.inc, where HF's tables
 * (an older Unicode version) say otherwise and HF's answer is used.
 *
 * The strings [PAD] [UNK] [CLS] [SEP] [MASK] in the raw text (exact case)
 * become their own ids, as HF's added-token matching does.
 *
 * Special tokens: [CLS] a [SEP] (b [SEP]); type ids 0 for [CLS] a [SEP],
 * 1 for b [SEP].  Truncation is HF's "longest_first": while too long, drop
 * the last token of the longer text (of b when both are equally long).
 *
 * Ownership: tokenizer_load returns a Tokenizer the caller frees with
 * tokenizer_free; it is read-only afterwards and safe to share between
 * threads.  A TokEncoding owns its arrays: tok_encoding_free releases them
 * (the struct itself may live on the stack; zero-initialise it first).
 *
 * Usage:
 *   Tokenizer *tok;
 *   if (tokenizer_load("data/vocab/bert-base-uncased-vocab.txt", true, &tok, &err)) ...;
 *   TokEncoding enc = {0};
 *   if (tokenizer_encode(tok, "Hello world!", NULL, 128, &enc, &err)) ...;
 *   // enc.ids = {101, 7592, 2088, 999, 102}, enc.type_ids = {0,0,0,0,0}
 *   tok_encoding_free(&enc);
 *   tokenizer_free(tok);
 */
#ifndef HPC_RUNTIME_TOKENIZER_H
#define HPC_RUNTIME_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

typedef struct Tokenizer Tokenizer;

/* Token ids plus, when they come from text, where each token starts in it. */
typedef struct {
    int32_t *ids;       /* (len) */
    int32_t *type_ids;  /* (len) 0/1 segment ids; all 0 from tokenizer_tokenize */
    int32_t len, cap;
    bool truncated;     /* tokenizer_encode dropped tokens to fit max_len */
} TokEncoding;

/* Words longer than this (in code points) become a single [UNK], as in HF. */
#define TOKENIZER_MAX_WORD_CHARS 100

/* Reads a vocab.txt (one token per line, id = line number from 0).  lowercase
 * = true for uncased vocabularies (lower-case + strip accents).  Errors:
 * HPC_ERR_IO (cannot open/read), HPC_ERR_INPUT (empty file, bad UTF-8,
 * duplicate token, or [UNK]/[CLS]/[SEP] missing; names file:line). */
HpcStatus tokenizer_load(const char *vocab_path, bool lowercase, Tokenizer **out, HpcError *err);
void tokenizer_free(Tokenizer *tok);

/* The WordPiece ids of text (len bytes; no special tokens), appended to
 * enc->ids (type ids 0).  HPC_ERR_INPUT on malformed UTF-8 ("byte offset N"). */
HpcStatus tokenizer_tokenize(const Tokenizer *tok, const char *text, size_t len,
                             TokEncoding *enc, HpcError *err);

/* [CLS] a [SEP] (b [SEP]) truncated to max_len (>= 3 with b, >= 2 without);
 * b may be NULL, and an empty b ("") counts as no pair, as in HF (a b of
 * spaces only still gives the second [SEP]).  enc is reset first.  Texts are
 * NUL-terminated. */
HpcStatus tokenizer_encode(const Tokenizer *tok, const char *a, const char *b, int64_t max_len,
                           TokEncoding *enc, HpcError *err);
/* The same with explicit byte lengths (texts may hold NUL bytes); b may be NULL. */
HpcStatus tokenizer_encode_n(const Tokenizer *tok, const char *a, size_t alen, const char *b, size_t blen,
                             int64_t max_len, TokEncoding *enc, HpcError *err);

int64_t tokenizer_vocab_size(const Tokenizer *tok);
bool tokenizer_lowercase(const Tokenizer *tok);
/* The token string of id (NULL when out of range). */
const char *tokenizer_token(const Tokenizer *tok, int32_t id);
/* The id of a token string, or -1 when the vocab lacks it. */
int32_t tokenizer_id(const Tokenizer *tok, const char *token);
int32_t tokenizer_pad_id(const Tokenizer *tok);  /* [PAD], 0 if absent */
int32_t tokenizer_unk_id(const Tokenizer *tok);
int32_t tokenizer_cls_id(const Tokenizer *tok);
int32_t tokenizer_sep_id(const Tokenizer *tok);

/* The utf8proc version runtime/data/tokenizer_unicode.inc was generated against
 * (the table of code points where HF's older Unicode data differs). */
const char *tokenizer_unicode_version(void);

void tok_encoding_reset(TokEncoding *enc);  /* len = 0, keeps the arrays */
void tok_encoding_free(TokEncoding *enc);

#endif

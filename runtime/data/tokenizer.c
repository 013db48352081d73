/* runtime/data/tokenizer.c — see tokenizer.h.
 *
 * The order of the steps follows Hugging Face tokenizers' BertNormalizer,
 * BertPreTokenizer and WordPiece model, which is what BertTokenizer uses
 * since transformers 5 (and BertTokenizerFast before).  Where that order
 * matters: special-token strings are split off the raw text first; accents
 * are stripped before lower-casing; punctuation is tested after NFD.
 */
#include "data/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* The special tokens HF matches verbatim in the input text (case-sensitive,
 * before any normalisation). */
static const char *const special_names[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
#define SPECIAL_COUNT 5

struct Tokenizer {
    char *arena;        /* every token, NUL-terminated, back to back */
    int64_t *offs;      /* (n) token i starts at arena + offs[i] */
    int32_t *lens;      /* (n) byte length of token i */
    int64_t n;
    int32_t *slots;     /* (mask + 1) open-addressing table of ids, -1 = empty */
    uint64_t mask;
    bool lowercase;
    int32_t special_id[SPECIAL_COUNT]; /* -1 where the vocab lacks it */
};

/* ---- growable buffers ---- */

typedef struct { int32_t *v; int64_t n, cap; } CpBuf;  /* code points */
typedef struct { char *v; int64_t n, cap; } ByteBuf;

static bool cp_push(CpBuf *b, int32_t c)
{
    if (b->n == b->cap) {
        int64_t cap = b->cap ? b->cap * 2 : 256;
        int32_t *v = realloc(b->v, (size_t)cap * sizeof *v);
        if (!v) return false;
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = c;
    return true;
}

static bool bytes_reserve(ByteBuf *b, int64_t extra)
{
    if (b->n + extra <= b->cap) return true;
    int64_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    char *v = realloc(b->v, (size_t)cap);
    if (!v) return false;
    b->v = v;
    b->cap = cap;
    return true;
}

static bool enc_push(TokEncoding *e, int32_t id, int32_t type)
{
    if (e->len == e->cap) {
        int32_t cap = e->cap ? e->cap * 2 : 64;
        int32_t *ids = realloc(e->ids, (size_t)cap * sizeof *ids);
        if (!ids) return false;
        e->ids = ids;
        int32_t *types = realloc(e->type_ids, (size_t)cap * sizeof *types);
        if (!types) return false;
        e->type_ids = types;
        e->cap = cap;
    }
    e->ids[e->len] = id;
    e->type_ids[e->len] = type;
    e->len++;
    return true;
}

void tok_encoding_reset(TokEncoding *enc)
{
    enc->len = 0;
    enc->truncated = false;
}

void tok_encoding_free(TokEncoding *enc)
{
    free(enc->ids);
    free(enc->type_ids);
    memset(enc, 0, sizeof *enc);
}

/* ---- the vocabulary: a string arena and a hash table ---- */

/* FNV-1a over prefix then s, so "##" + piece hashes without a copy. */
static uint64_t vocab_hash(const char *prefix, const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = prefix; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static bool vocab_equal(const Tokenizer *t, int32_t id, const char *prefix, const char *s, size_t len)
{
    size_t pl = strlen(prefix);
    if ((size_t)t->lens[id] != pl + len) return false;
    const char *tok = t->arena + t->offs[id];
    return memcmp(tok, prefix, pl) == 0 && memcmp(tok + pl, s, len) == 0;
}

/* The id of prefix + s[0..len), or -1. */
static int32_t vocab_find(const Tokenizer *t, const char *prefix, const char *s, size_t len)
{
    for (uint64_t i = vocab_hash(prefix, s, len) & t->mask;; i = (i + 1) & t->mask) {
        int32_t id = t->slots[i];
        if (id < 0) return -1;
        if (vocab_equal(t, id, prefix, s, len)) return id;
    }
}

static void vocab_insert(Tokenizer *t, int32_t id)
{
    const char *tok = t->arena + t->offs[id];
    uint64_t i = vocab_hash("", tok, (size_t)t->lens[id]) & t->mask;
    while (t->slots[i] >= 0) i = (i + 1) & t->mask;
    t->slots[i] = id;
}

static HpcStatus read_file(const char *path, char **data, size_t *len, HpcError *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return hpc_fail(err, HPC_ERR_IO, "cannot open vocabulary %s: %s; pass --vocab with a BERT vocab.txt", path, strerror(errno));
    ByteBuf b = {0};
    size_t got;
    do {
        if (!bytes_reserve(&b, 65536)) {
            fclose(f);
            free(b.v);
            return hpc_fail(err, HPC_ERR_OOM, "reading %s: out of host memory", path);
        }
        got = fread(b.v + b.n, 1, 65536, f);
        b.n += (int64_t)got;
    } while (got > 0);
    int bad = ferror(f), why = errno;
    fclose(f);
    if (bad) {
        free(b.v);
        return hpc_fail(err, HPC_ERR_IO, "cannot read vocabulary %s: %s; pass --vocab with a BERT vocab.txt", path,
                        strerror(why));
    }
    if (!bytes_reserve(&b, 1)) {
        free(b.v);
        return hpc_fail(err, HPC_ERR_OOM, "reading %s: out of host memory", path);
    }
    b.v[b.n] = '\0';
    *data = b.v;
    *len = (size_t)b.n;
    return HPC_OK;
}

/* Byte offset of the first malformed UTF-8 sequence in s, or -1. */
static int64_t utf8_bad_offset(const char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &c);
        if (k < 1) return (int64_t)i;
        i += (size_t)k;
    }
    return -1;
}

/* Whether a line ends at data[i]: LF, or a CR not followed by LF (a CRLF
 * ends at its LF).  Python's universal newlines, as transformers reads
 * vocab.txt with, split at all three. */
static bool vocab_eol(const char *data, size_t len, size_t i)
{
    return data[i] == '\n' || (data[i] == '\r' && (i + 1 == len || data[i + 1] != '\n'));
}

/* Splits data into lines in place (LF, CRLF or CR), recording each token in
 * t; the arena is data itself. */
static HpcStatus vocab_index(Tokenizer *t, const char *path, char *data, size_t len, HpcError *err)
{
    int64_t lines = 0;
    for (size_t i = 0; i < len; i++) lines += vocab_eol(data, len, i);
    if (len > 0 && !vocab_eol(data, len, len - 1)) lines++;
    if (lines == 0) return hpc_fail(err, HPC_ERR_INPUT, "%s: empty vocabulary file", path);
    t->offs = malloc((size_t)lines * sizeof *t->offs);
    t->lens = malloc((size_t)lines * sizeof *t->lens);
    if (!t->offs || !t->lens) return hpc_fail(err, HPC_ERR_OOM, "loading %s: out of host memory", path);
    size_t start = 0;
    for (int64_t id = 0; id < lines; id++) {
        size_t end = start;
        while (end < len && !vocab_eol(data, len, end)) end++;
        bool crlf = end < len && end > start && data[end] == '\n' && data[end - 1] == '\r';
        size_t e = crlf ? end - 1 : end;
        int64_t bad = utf8_bad_offset(data + start, e - start);
        if (bad >= 0)
            return hpc_fail(err, HPC_ERR_INPUT, "%s:%lld: malformed UTF-8 at byte %lld of the line",
                            path, (long long)id + 1, (long long)bad);
        data[e] = '\0';
        t->offs[id] = (int64_t)start;
        t->lens[id] = (int32_t)(e - start);
        start = end + 1;
    }
    t->n = lines;
    return HPC_OK;
}

static HpcStatus vocab_build_table(Tokenizer *t, const char *path, HpcError *err)
{
    uint64_t size = 1;
    while (size < (uint64_t)t->n * 2) size <<= 1;
    t->slots = malloc(size * sizeof *t->slots);
    if (!t->slots) return hpc_fail(err, HPC_ERR_OOM, "loading %s: out of host memory", path);
    memset(t->slots, 0xff, size * sizeof *t->slots);
    t->mask = size - 1;
    for (int64_t id = 0; id < t->n; id++) {
        int32_t prev = vocab_find(t, "", t->arena + t->offs[id], (size_t)t->lens[id]);
        if (prev >= 0)
            return hpc_fail(err, HPC_ERR_INPUT, "%s:%lld: token '%s' already on line %d; a vocab lists each token once",
                            path, (long long)id + 1, t->arena + t->offs[id], prev + 1);
        vocab_insert(t, (int32_t)id);
    }
    return HPC_OK;
}

static HpcStatus vocab_find_specials(Tokenizer *t, const char *path, HpcError *err)
{
    for (int i = 0; i < SPECIAL_COUNT; i++)
        t->special_id[i] = vocab_find(t, "", special_names[i], strlen(special_names[i]));
    for (int i = 1; i <= 3; i++)  /* [UNK], [CLS], [SEP] are required */
        if (t->special_id[i] < 0)
            return hpc_fail(err, HPC_ERR_INPUT, "%s: the vocabulary has no %s token; is this a BERT vocab.txt?",
                            path, special_names[i]);
    return HPC_OK;
}

HpcStatus tokenizer_load(const char *vocab_path, bool lowercase, Tokenizer **out, HpcError *err)
{
    *out = NULL;
    Tokenizer *t = calloc(1, sizeof *t);
    if (!t) return hpc_fail(err, HPC_ERR_OOM, "loading %s: out of host memory", vocab_path);
    t->lowercase = lowercase;
    size_t len = 0;
    HpcStatus st = read_file(vocab_path, &t->arena, &len, err);
    if (!st) st = vocab_index(t, vocab_path, t->arena, len, err);
    if (!st) st = vocab_build_table(t, vocab_path, err);
    if (!st) st = vocab_find_specials(t, vocab_path, err);
    if (st) {
        tokenizer_free(t);
        return st;
    }
    *out = t;
    return HPC_OK;
}

void tokenizer_free(Tokenizer *t)
{
    if (!t) return;
    free(t->arena);
    free(t->offs);
    free(t->lens);
    free(t->slots);
    free(t);
}

int64_t tokenizer_vocab_size(const Tokenizer *t) { return t->n; }
bool tokenizer_lowercase(const Tokenizer *t) { return t->lowercase; }
int32_t tokenizer_pad_id(const Tokenizer *t) { return t->special_id[0] < 0 ? 0 : t->special_id[0]; }
int32_t tokenizer_unk_id(const Tokenizer *t) { return t->special_id[1]; }
int32_t tokenizer_cls_id(const Tokenizer *t) { return t->special_id[2]; }
int32_t tokenizer_sep_id(const Tokenizer *t) { return t->special_id[3]; }

const char *tokenizer_token(const Tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n ? t->arena + t->offs[id] : NULL;
}

int32_t tokenizer_id(const Tokenizer *t, const char *token)
{
    return vocab_find(t, "", token, strlen(token));
}

/* ---- character classes (HF BertNormalizer / BertPreTokenizer) ---- */

/* What the normaliser and pre-tokenizer do with a character. */
typedef enum {
    TOKCLASS_OTHER,    /* part of a word */
    TOKCLASS_CONTROL,  /* dropped */
    TOKCLASS_SPACE,    /* becomes a space, separates words */
    TOKCLASS_SPLIT,    /* a word of its own (punctuation, CJK) */
    TOKCLASS_MARK,     /* non-spacing mark: dropped by the uncased normaliser */
} TokClass;

typedef struct { int32_t lo, hi; TokClass cls; } TokClassRange;

/* tokenizer_hf_overrides[]: code points where HF's (older) Unicode tables
 * disagree with utf8proc, measured by scripts/gen_tokenizer_unicode.py. */
#include "data/tokenizer_unicode.inc"

/* The CJK blocks BERT isolates (the ideograph blocks, not Hangul or kana;
 * HF leaves out 2B820-2B91F). */
static bool is_cjk(int32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* The class from utf8proc's category: whitespace is tab, LF, CR and Z*;
 * control is Cc, Cf, Cs, Co (unassigned code points are kept, as HF does);
 * punctuation is ASCII punctuation or P*. */
static TokClass utf8proc_class(int32_t c)
{
    utf8proc_category_t k = utf8proc_category(c);
    if (c == '\t' || c == '\n' || c == '\r' || c == ' ' || k == UTF8PROC_CATEGORY_ZS ||
        k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP)
        return TOKCLASS_SPACE;
    if (c == 0 || c == 0xFFFD || k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF ||
        k == UTF8PROC_CATEGORY_CS || k == UTF8PROC_CATEGORY_CO)
        return TOKCLASS_CONTROL;
    if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126) ||
        (k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO) || is_cjk(c))
        return TOKCLASS_SPLIT;
    return k == UTF8PROC_CATEGORY_MN ? TOKCLASS_MARK : TOKCLASS_OTHER;
}

static TokClass char_class(int32_t c)
{
    size_t lo = 0, hi = sizeof tokenizer_hf_overrides / sizeof tokenizer_hf_overrides[0];
    while (lo < hi) {  /* binary search of the override ranges */
        size_t mid = (lo + hi) / 2;
        if (c < tokenizer_hf_overrides[mid].lo) hi = mid;
        else if (c > tokenizer_hf_overrides[mid].hi) lo = mid + 1;
        else return tokenizer_hf_overrides[mid].cls;
    }
    return utf8proc_class(c);
}

const char *tokenizer_unicode_version(void)
{
    return TOKENIZER_UNICODE_UTF8PROC;
}

/* ---- normalisation ---- */

/* Clean-up and CJK spacing of text[0..len) (valid UTF-8) into out. */
static bool normalize_clean(const char *text, size_t len, CpBuf *out)
{
    size_t i = 0;
    while (i < len) {
        utf8proc_int32_t c;
        i += (size_t)utf8proc_iterate((const utf8proc_uint8_t *)text + i, (utf8proc_ssize_t)(len - i), &c);
        TokClass k = char_class(c);
        if (k == TOKCLASS_CONTROL) continue;
        bool ok;
        if (k == TOKCLASS_SPACE) ok = cp_push(out, ' ');
        else if (is_cjk(c)) ok = cp_push(out, ' ') && cp_push(out, c) && cp_push(out, ' ');
        else ok = cp_push(out, c);
        if (!ok) return false;
    }
    return true;
}

/* Uncased only: NFD, drop non-spacing marks (Mn), lower-case; in place. */
static bool normalize_uncase(CpBuf *cps, ByteBuf *scratch)
{
    scratch->n = 0;
    if (!bytes_reserve(scratch, cps->n * 4 + 1)) return false;
    for (int64_t i = 0; i < cps->n; i++)
        scratch->n += utf8proc_encode_char(cps->v[i], (utf8proc_uint8_t *)scratch->v + scratch->n);
    int options = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    utf8proc_ssize_t need = utf8proc_decompose((const utf8proc_uint8_t *)scratch->v, scratch->n,
                                               cps->v, cps->cap, options);
    if (need < 0) return false; /* cannot happen: the input was validated */
    if (need > cps->cap) {
        int32_t *v = realloc(cps->v, (size_t)need * sizeof *v);
        if (!v) return false;
        cps->v = v;
        cps->cap = need;
        need = utf8proc_decompose((const utf8proc_uint8_t *)scratch->v, scratch->n, cps->v, cps->cap, options);
    }
    int64_t k = 0;
    for (int64_t i = 0; i < need; i++)
        if (char_class(cps->v[i]) != TOKCLASS_MARK) cps->v[k++] = utf8proc_tolower(cps->v[i]);
    cps->n = k;
    return true;
}

/* ---- WordPiece ---- */

/* Greedy longest-match-first of one word (UTF-8 w[0..len), nchars code points). */
static bool wordpiece(const Tokenizer *t, const char *w, size_t len, int64_t nchars, TokEncoding *enc)
{
    if (nchars > TOKENIZER_MAX_WORD_CHARS) return enc_push(enc, tokenizer_unk_id(t), 0);
    int32_t first = enc->len;
    size_t start = 0;
    while (start < len) {
        size_t end = len;
        int32_t id = -1;
        while (end > start) {
            id = vocab_find(t, start > 0 ? "##" : "", w + start, end - start);
            if (id >= 0) break;
            do end--; while (end > start && ((unsigned char)w[end] & 0xC0) == 0x80);
        }
        if (id < 0) {
            enc->len = first;  /* no full cover: the whole word is one [UNK] */
            return enc_push(enc, tokenizer_unk_id(t), 0);
        }
        if (!enc_push(enc, id, 0)) return false;
        start = end;
    }
    return true;
}

/* Encodes cps[from..to) as UTF-8 and runs WordPiece on it. */
static bool emit_word(const Tokenizer *t, const CpBuf *cps, int64_t from, int64_t to, ByteBuf *w, TokEncoding *enc)
{
    w->n = 0;
    if (!bytes_reserve(w, (to - from) * 4)) return false;
    for (int64_t i = from; i < to; i++)
        w->n += utf8proc_encode_char(cps->v[i], (utf8proc_uint8_t *)w->v + w->n);
    return wordpiece(t, w->v, (size_t)w->n, to - from, enc);
}

/* Whitespace split, then every punctuation character on its own. */
static bool pretokenize(const Tokenizer *t, const CpBuf *cps, ByteBuf *w, TokEncoding *enc)
{
    int64_t start = 0;
    for (int64_t i = 0; i <= cps->n; i++) {
        TokClass k = i == cps->n ? TOKCLASS_SPACE : char_class(cps->v[i]);
        bool end = k == TOKCLASS_SPACE;
        bool punct = k == TOKCLASS_SPLIT;
        if (!end && !punct) continue;
        if (i > start && !emit_word(t, cps, start, i, w, enc)) return false;
        if (punct && !emit_word(t, cps, i, i + 1, w, enc)) return false;
        start = i + 1;
    }
    return true;
}

/* One stretch of text that holds no special-token string. */
static bool tokenize_segment(const Tokenizer *t, const char *text, size_t len, CpBuf *cps, ByteBuf *scratch,
                             TokEncoding *enc)
{
    cps->n = 0;
    if (!normalize_clean(text, len, cps)) return false;
    if (t->lowercase && !normalize_uncase(cps, scratch)) return false;
    return pretokenize(t, cps, scratch, enc);
}

/* The next special-token string in text[0..len): its offset, or len. */
static size_t find_special(const Tokenizer *t, const char *text, size_t len, int *which)
{
    for (size_t i = 0; i < len; i++) {
        if (text[i] != '[') continue;
        for (int s = 0; s < SPECIAL_COUNT; s++) {
            size_t sl = strlen(special_names[s]);
            if (t->special_id[s] >= 0 && sl <= len - i && memcmp(text + i, special_names[s], sl) == 0) {
                *which = s;
                return i;
            }
        }
    }
    return len;
}

HpcStatus tokenizer_tokenize(const Tokenizer *t, const char *text, size_t len, TokEncoding *enc, HpcError *err)
{
    int64_t bad = utf8_bad_offset(text, len);
    if (bad >= 0)
        return hpc_fail(err, HPC_ERR_INPUT, "malformed UTF-8 at byte offset %lld (byte 0x%02x); "
                        "convert the text to UTF-8", (long long)bad, (unsigned char)text[bad]);
    CpBuf cps = {0};
    ByteBuf scratch = {0};
    bool ok = true;
    size_t pos = 0;
    while (ok && pos < len) {
        int which = -1;
        size_t at = find_special(t, text + pos, len - pos, &which);
        ok = tokenize_segment(t, text + pos, at, &cps, &scratch, enc);
        if (ok && which >= 0) {
            ok = enc_push(enc, t->special_id[which], 0);
            at += strlen(special_names[which]);
        }
        pos += at;
    }
    free(cps.v);
    free(scratch.v);
    return ok ? HPC_OK : hpc_fail(err, HPC_ERR_OOM, "tokenizer: out of host memory on a %zu-byte text", len);
}

/* HF tokenizers' "longest_first" for a pair: the shorter side keeps at most
 * half the room (rounded down), the longer side takes what is left. */
static void truncate_pair(int32_t *na, int32_t *nb, int64_t room)
{
    if ((int64_t)*na + *nb <= room) return;
    bool swap = *na > *nb;
    int64_t shorter = swap ? *nb : *na, longer = swap ? *na : *nb;
    if (shorter > room / 2) shorter = room / 2;
    if (longer > room - shorter) longer = room - shorter;
    *na = (int32_t)(swap ? longer : shorter);
    *nb = (int32_t)(swap ? shorter : longer);
}

static bool encode_assemble(const Tokenizer *t, const TokEncoding *a, int32_t na, const TokEncoding *b,
                            int32_t nb, TokEncoding *enc)
{
    bool ok = enc_push(enc, tokenizer_cls_id(t), 0);
    for (int32_t i = 0; ok && i < na; i++) ok = enc_push(enc, a->ids[i], 0);
    ok = ok && enc_push(enc, tokenizer_sep_id(t), 0);
    if (!b) return ok;
    for (int32_t i = 0; ok && i < nb; i++) ok = enc_push(enc, b->ids[i], 1);
    return ok && enc_push(enc, tokenizer_sep_id(t), 1);
}

HpcStatus tokenizer_encode(const Tokenizer *t, const char *a, const char *b, int64_t max_len, TokEncoding *enc,
                           HpcError *err)
{
    return tokenizer_encode_n(t, a, strlen(a), b, b ? strlen(b) : 0, max_len, enc, err);
}

HpcStatus tokenizer_encode_n(const Tokenizer *t, const char *a, size_t alen, const char *b, size_t blen,
                             int64_t max_len, TokEncoding *enc, HpcError *err)
{
    tok_encoding_reset(enc);
    if (b && blen == 0) b = NULL; /* HF treats an empty second text as no pair */
    int64_t room = max_len - (b ? 3 : 2);
    if (room < 0)
        return hpc_fail(err, HPC_ERR_USAGE, "tokenizer_encode: max length %lld leaves no room for the special tokens",
                        (long long)max_len);
    TokEncoding ea = {0}, eb = {0};
    HpcStatus st = tokenizer_tokenize(t, a, alen, &ea, err);
    if (!st && b) st = tokenizer_tokenize(t, b, blen, &eb, err);
    if (!st) {
        int32_t na = ea.len, nb = eb.len;
        if (b) truncate_pair(&na, &nb, room);
        else if (na > room) na = (int32_t)room;
        if (!encode_assemble(t, &ea, na, b ? &eb : NULL, nb, enc))
            st = hpc_fail(err, HPC_ERR_OOM, "tokenizer_encode: out of host memory");
        enc->truncated = na < ea.len || nb < eb.len;
    }
    tok_encoding_free(&ea);
    tok_encoding_free(&eb);
    return st;
}

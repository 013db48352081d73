/* cli/cmd_tokenize.c — `hpc tokenize`: show how BERT WordPiece splits text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "data/tokenizer.h"

static const char tokenize_usage[] =
    "usage: hpc tokenize --vocab FILE [--cased] [--pair TEXT_B] [--max-len N] [--ids] TEXT...\n"
    "\n"
    "Tokenizes each TEXT (one argument = one input; '-' reads one input per\n"
    "line from stdin) with BERT WordPiece, exactly as Hugging Face's\n"
    "BertTokenizer does for the same vocab.txt, and prints the tokens, their\n"
    "ids and the token type ids.\n"
    "\n"
    "options:\n"
    "  --vocab FILE   vocab.txt, one token per line (e.g. data/vocab/bert-base-uncased-vocab.txt)\n"
    "  --cased        keep case and accents (for cased vocabularies); default lower-cases\n"
    "  --pair TEXT_B  encode each TEXT as the pair (TEXT, TEXT_B)\n"
    "  --max-len N    truncate to N tokens including [CLS]/[SEP] (default 512)\n"
    "  --ids          print only the ids, one input per line\n";

typedef struct {
    const char *vocab, *pair;
    bool cased, ids_only;
    int64_t max_len;
    int first_text;
} TokenizeArgs;

static int tokenize_parse(int argc, char **argv, TokenizeArgs *a)
{
    *a = (TokenizeArgs){.max_len = 512};
    int i = 1;
    for (; i < argc && argv[i][0] == '-' && argv[i][1] != '\0'; i++) {
        const char *o = argv[i];
        bool has_val = i + 1 < argc;
        if (cli_is_help(o)) { fputs(tokenize_usage, stdout); return -1; }
        else if (!strcmp(o, "--")) { i++; break; }
        else if (!strcmp(o, "--cased")) a->cased = true;
        else if (!strcmp(o, "--ids")) a->ids_only = true;
        else if (!strcmp(o, "--vocab") && has_val) a->vocab = argv[++i];
        else if (!strcmp(o, "--pair") && has_val) a->pair = argv[++i];
        else if (!strcmp(o, "--max-len") && has_val) {
            char *end;
            a->max_len = strtoll(argv[++i], &end, 10);
            if (*end || a->max_len < 2) {
                fprintf(stderr, "hpc tokenize: --max-len wants an integer >= 2, got '%s'\n", argv[i]);
                return HPC_ERR_USAGE;
            }
        } else {
            fprintf(stderr, "hpc tokenize: unknown option or missing value '%s'\n%s", o, tokenize_usage);
            return HPC_ERR_USAGE;
        }
    }
    a->first_text = i;
    if (!a->vocab || i >= argc) {
        fprintf(stderr, "hpc tokenize: %s\n%s", a->vocab ? "no TEXT given" : "--vocab FILE is required",
                tokenize_usage);
        return HPC_ERR_USAGE;
    }
    return HPC_OK;
}

static void tokenize_print(const Tokenizer *tok, const TokEncoding *e, bool ids_only)
{
    if (!ids_only) {
        fputs("tokens:", stdout);
        for (int32_t i = 0; i < e->len; i++) printf(" %s", tokenizer_token(tok, e->ids[i]));
        fputs("\nids:   ", stdout);
    }
    for (int32_t i = 0; i < e->len; i++) printf(i || !ids_only ? " %d" : "%d", (int)e->ids[i]);
    putchar('\n');
    if (ids_only) return;
    fputs("types: ", stdout);
    for (int32_t i = 0; i < e->len; i++) printf(" %d", (int)e->type_ids[i]);
    printf("\n%d tokens%s\n", (int)e->len, e->truncated ? " (truncated)" : "");
}

/* text[0..len) may hold NUL bytes (from stdin): the tokenizer removes them
 * and keeps the rest, as transformers does. */
static HpcStatus tokenize_one(const Tokenizer *tok, const TokenizeArgs *a, const char *text, size_t len,
                              TokEncoding *e, HpcError *err)
{
    HpcStatus st = tokenizer_encode_n(tok, text, len, a->pair, a->pair ? strlen(a->pair) : 0, a->max_len, e, err);
    if (st) return st;
    tokenize_print(tok, e, a->ids_only);
    return HPC_OK;
}

static HpcStatus tokenize_stdin(const Tokenizer *tok, const TokenizeArgs *a, TokEncoding *e, HpcError *err)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    HpcStatus st = HPC_OK;
    for (long lineno = 1; !st && (n = getline(&line, &cap, stdin)) >= 0; lineno++) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        st = tokenize_one(tok, a, line, (size_t)n, e, err);
        if (st) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "<stdin>:%ld: %.900s", lineno, err->msg);
            hpc_fail(err, st, "%s", msg);
        }
    }
    free(line);
    return st;
}

int cmd_tokenize(int argc, char **argv)
{
    TokenizeArgs a;
    int rc = tokenize_parse(argc, argv, &a);
    if (rc) return rc < 0 ? HPC_OK : rc;
    HpcError err = {0};
    Tokenizer *tok;
    if (tokenizer_load(a.vocab, !a.cased, &tok, &err)) return cli_report(&err);
    TokEncoding e = {0};
    HpcStatus st = HPC_OK;
    for (int i = a.first_text; !st && i < argc; i++)
        st = strcmp(argv[i], "-") ? tokenize_one(tok, &a, argv[i], strlen(argv[i]), &e, &err) : tokenize_stdin(tok, &a, &e, &err);
    tok_encoding_free(&e);
    tokenizer_free(tok);
    return st ? cli_report(&err) : HPC_OK;
}

/* cli/cmd_tokenize.c — `hpc tokenize`: show how BERT WordPiece splits text. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "data/tokenizer.h"

typedef struct {
    const char *vocab, *pair;
    bool cased, ids_only;
    int64_t max_len;
} TokenizeArgs;

#define A(f) offsetof(TokenizeArgs, f)
static const CliOpt tokenize_opts[] = {
    {.name = "vocab", .kind = CLI_STR, .off = A(vocab), .meta = "FILE", .required = true,
     .help = "vocab.txt, one token per line (e.g. data/vocab/bert-base-uncased-vocab.txt)"},
    {.name = "cased", .kind = CLI_FLAG, .off = A(cased),
     .help = "keep case and accents (for cased vocabularies); default lower-cases"},
    {.name = "pair", .kind = CLI_STR, .off = A(pair), .meta = "TEXT_B",
     .help = "encode each TEXT as the pair (TEXT, TEXT_B)"},
    {.name = "max-len", .kind = CLI_INT, .off = A(max_len), .meta = "N", .min = 2, .max = 1 << 20,
     .help = "truncate to N tokens including [CLS]/[SEP] (default 512)"},
    {.name = "ids", .kind = CLI_FLAG, .off = A(ids_only), .help = "print only the ids, one input per line"},
    CLI_END,
};
#undef A

const CliCommand cli_tokenize_command = {
    .name = "tokenize", .args = "TEXT...", .arg_name = "TEXT", .min_args = 1, .max_args = -1,
    .stop_at_arg = true,
    .about = "Tokenizes each TEXT (one argument = one input; '-' reads one input per\n"
             "line from stdin) with BERT WordPiece, exactly as Hugging Face's\n"
             "BertTokenizer does for the same vocab.txt, and prints the tokens, their\n"
             "ids and the token type ids.  Options come before the first TEXT; after\n"
             "it (or after --) every argument is a TEXT, even one that starts with '-'.\n",
    .sections = {{"options", tokenize_opts, 0}},
};

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
    TokenizeArgs a = {.max_len = 512};
    CliParsed p;
    HpcError err = {0};
    int rc = cli_parse(&cli_tokenize_command, argc, argv, &a, &p, &err);
    if (rc) return rc == CLI_HELP_SHOWN ? HPC_OK : cli_report(&err);
    Tokenizer *tok;
    if (tokenizer_load(a.vocab, !a.cased, &tok, &err)) return cli_report(&err);
    TokEncoding e = {0};
    HpcStatus st = HPC_OK;
    for (int i = 0; !st && i < p.n_args; i++)
        st = strcmp(p.args[i], "-") ? tokenize_one(tok, &a, p.args[i], strlen(p.args[i]), &e, &err)
                                    : tokenize_stdin(tok, &a, &e, &err);
    tok_encoding_free(&e);
    tokenizer_free(tok);
    return st ? cli_report(&err) : HPC_OK;
}

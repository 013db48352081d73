/* grammar/parser.y — the .model grammar (pure, located).  See ast.h for the
 * tree it builds and docs/language.md for the language.  Actions only call
 * ast_* builders; every check of meaning is in compiler/check.c. */
%define api.pure full
%define parse.error custom
%define parse.lac full
%locations
%expect 0
%param {yyscan_t scanner}
%parse-param {ParseCtx *ctx}

%code requires {
#include "ast.h"
typedef void *yyscan_t;
/* What the scanner and the parser share for one parse. */
typedef struct {
    const DiagSource *src;
    Diag *diag;
    int line, col;       /* position of the next byte */
    int depth;           /* open '{' and '(' */
    char tok[48];        /* spelling of the last token, for messages */
    AstFile *result;
} ParseCtx;
}

%code {
#include <stdlib.h>

#include "error.h"

int yylex(YYSTYPE *lval, YYLTYPE *lloc, yyscan_t scanner);
static void yyerror(YYLTYPE *lloc, yyscan_t scanner, ParseCtx *ctx, const char *msg);
#define LOC(l) ast_loc(ctx->src, (l).first_line, (l).first_column)
}

%union {
    char *str;
    AstValue *val;
    AstItem *item;
    AstModel *model;
}

%token <str> IDENT "name"
%token <val> INT "integer" FLOAT "number"
%token MODEL "'model'" EXTENDS "'extends'" DOTDOT "'..'"

%type <str> base
%type <model> models model
%type <item> items item
%type <val> value arg number signed range values

%destructor { free($$); } <str>
%destructor { ast_value_free($$); } <val>
%destructor { ast_items_free($$); } <item>
%destructor { ast_models_free($$); } <model>

%%

file:
    models                          { ctx->result = ast_file($1); }
    ;
models:
    %empty                          { $$ = NULL; }
  | models model                    { $$ = ast_model_prepend($1, $2); }
    ;
model:
    MODEL IDENT base '{' items '}'  { $$ = ast_model($2, $3, $5, LOC(@2), LOC(@3)); }
    ;
base:
    %empty                          { $$ = NULL; }
  | EXTENDS IDENT                   { $$ = $2; @$ = @2; }
    ;
items:
    %empty                          { $$ = NULL; }
  | items item                      { $$ = ast_item_prepend($1, $2); }
    ;
item:
    IDENT '=' value                 { $$ = ast_setting($1, $3, LOC(@1)); }
  | IDENT '{' items '}'             { $$ = ast_block($1, NULL, $3, LOC(@1), LOC(@1), LOC(@4)); }
  | IDENT IDENT '{' items '}'       { $$ = ast_block($1, $2, $4, LOC(@1), LOC(@2), LOC(@5)); }
  | IDENT IDENT                     { $$ = ast_block($1, $2, NULL, LOC(@1), LOC(@2), LOC(@2)); }
    ;
value:
    arg                             { $$ = $1; }
  | IDENT                           { $$ = ast_ident($1, LOC(@1)); }
  | IDENT arg                       { $$ = ast_call($1, $2, LOC(@1)); }
  | IDENT '{' items '}'             { $$ = ast_call_block($1, $3, LOC(@1)); }
    ;
arg:
    signed                          { $$ = $1; }
  | range                           { $$ = $1; }
  | '(' values ')'                  { $$ = ast_tuple($2, LOC(@1)); }
    ;
values:
    value                           { $$ = $1; }
  | values ',' value                { $$ = ast_value_prepend($1, $3); }
    ;
signed:
    number                          { $$ = $1; }
  | '-' number                      { $$ = ast_negate($2, LOC(@1)); }
    ;
number:
    INT                             { $$ = $1; }
  | FLOAT                           { $$ = $1; }
    ;
range:
    INT DOTDOT INT                  { $$ = ast_range($1, $3, LOC(@1)); }
    ;

%%

#include <string.h>

#include "scanner.yy.h"

/* Token names as a person would say them. */
static const char *symbol_words(yysymbol_kind_t sym)
{
    switch (sym) {
    case YYSYMBOL_YYEOF: return "end of file";
    case YYSYMBOL_IDENT: return "a name";
    case YYSYMBOL_INT: return "an integer";
    case YYSYMBOL_FLOAT: return "a number";
    default: return yysymbol_name(sym);
    }
}

/* "unexpected '}', expected '=' or '{'" */
static int yyreport_syntax_error(const yypcontext_t *pctx, yyscan_t scanner, ParseCtx *ctx)
{
    (void)scanner;
    yysymbol_kind_t expected[8];
    int n = yypcontext_expected_tokens(pctx, expected, 8);
    yysymbol_kind_t got = yypcontext_token(pctx);
    char msg[512];
    size_t len = 0;
    if (got == YYSYMBOL_YYEOF)
        len += (size_t)snprintf(msg, sizeof msg, "unexpected end of file");
    else
        len += (size_t)snprintf(msg, sizeof msg, "unexpected '%s'", ctx->tok);
    for (int i = 0; i < n && len < sizeof msg; i++)
        len += (size_t)snprintf(msg + len, sizeof msg - len, "%s%s",
                                i == 0 ? ", expected " : i == n - 1 ? " or " : ", ",
                                symbol_words(expected[i]));
    const YYLTYPE *l = yypcontext_location(pctx);
    diag_error(ctx->diag, LOC(*l), "%s", msg);
    return 0;
}

/* Only "memory exhausted" reaches here (syntax errors go to the function
 * above); the scanner's depth limit normally fires long before. */
static void yyerror(YYLTYPE *lloc, yyscan_t scanner, ParseCtx *ctx, const char *msg)
{
    (void)scanner;
    diag_error(ctx->diag, LOC(*lloc), "the model is nested too deeply (%s)", msg);
}

AstFile *ast_parse(const DiagSource *src, Diag *d)
{
    ParseCtx ctx = {.src = src, .diag = d, .line = 1, .col = 1};
    yyscan_t scanner;
    if (yylex_init_extra(&ctx, &scanner) != 0) {
        diag_error_file(d, src->name, "cannot start the scanner (out of memory)");
        return NULL;
    }
    YY_BUFFER_STATE buf = yy_scan_bytes(src->text, (int)src->len, scanner);
    int rc = yyparse(scanner, &ctx);
    yy_delete_buffer(buf, scanner);
    yylex_destroy(scanner);
    if (rc != 0) {
        ast_file_free(ctx.result);
        return NULL;
    }
    return ctx.result;
}

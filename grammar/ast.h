/* grammar/ast.h — the syntax tree of a .model file, and the parser entry.
 *
 * The grammar is generic: a model is a list of items; an item is a setting
 * (`key = value`) or a block (`name [label] { items }`).  What keys and
 * blocks mean is the checker's business (compiler/check.c), so the grammar
 * never changes when a key is added.
 *
 *   model bert_base extends base {        AstModel  name, base
 *     encoder { hidden = 768 }            AstItem   AST_BLOCK "encoder"
 *     head classifier { labels = 2 }      AstItem   AST_BLOCK "head" label "classifier"
 *     train { optimizer = adamw { lr = 2e-5 } }   AST_SETTING, value AST_VAL_CALL
 *   }
 *
 * Every node keeps the SrcLoc of its first token.  Lists are singly linked
 * through `next` in source order.  A tree owns its strings and children;
 * free it with ast_file_free (or the per-kind *_free).
 */
#ifndef HPC_GRAMMAR_AST_H
#define HPC_GRAMMAR_AST_H

#include <stdbool.h>
#include <stdint.h>

#include "diag.h"

typedef enum {
    AST_VAL_INT,    /* 12, -3 */
    AST_VAL_FLOAT,  /* 0.1, 2e-5 */
    AST_VAL_IDENT,  /* gelu, true */
    AST_VAL_TUPLE,  /* (0.9, 0.999) */
    AST_VAL_RANGE,  /* 0..5 */
    AST_VAL_CALL,   /* static 1024, layers 0..5, adamw { lr = 1e-3 } */
} AstValueKind;

typedef struct AstItem AstItem;

typedef struct AstValue {
    AstValueKind kind;
    SrcLoc loc;
    char *text;              /* INT/FLOAT: spelling; IDENT/CALL: the name */
    int64_t i;               /* INT (and RANGE lo; RANGE hi in i2) */
    int64_t i2;
    double f;                /* FLOAT; also INT converted */
    struct AstValue *arg;    /* CALL: the argument, or NULL */
    AstItem *body;           /* CALL: the block's items, or NULL */
    bool has_body;           /* CALL written with braces (maybe empty) */
    bool bad;                /* a literal out of range, already reported */
    struct AstValue *next;   /* next element of a TUPLE */
    struct AstValue *elems;  /* TUPLE elements */
} AstValue;

typedef enum { AST_SETTING, AST_BLOCK } AstItemKind;

struct AstItem {
    AstItemKind kind;
    SrcLoc loc;              /* of the key or block name */
    char *key;               /* setting key or block name */
    char *label;             /* block label ("classifier") or NULL */
    SrcLoc label_loc;
    AstValue *value;         /* SETTING */
    AstItem *items;          /* BLOCK body */
    SrcLoc end_loc;          /* BLOCK: the closing brace */
    AstItem *next;
};

typedef struct AstModel {
    SrcLoc loc;              /* of the name */
    char *name;
    char *base;              /* `extends NAME`, or NULL */
    SrcLoc base_loc;
    AstItem *items;
    struct AstModel *next;
} AstModel;

typedef struct {
    AstModel *models;        /* in source order */
} AstFile;

/* Builders used by the parser's actions.  They take ownership of the
 * strings and subtrees passed in.  List builders prepend; the block rules
 * reverse once the list is complete, so long lists stay O(n). */
SrcLoc ast_loc(const DiagSource *src, int line, int col);
AstValue *ast_int(char *text, int64_t v, SrcLoc loc);
AstValue *ast_float(char *text, double v, SrcLoc loc);
AstValue *ast_negate(AstValue *v, SrcLoc loc);
AstValue *ast_ident(char *name, SrcLoc loc);
AstValue *ast_call(char *name, AstValue *arg, SrcLoc loc);
AstValue *ast_call_block(char *name, AstItem *items, SrcLoc loc);
AstValue *ast_range(AstValue *lo, AstValue *hi, SrcLoc loc);
AstValue *ast_tuple(AstValue *reversed_elems, SrcLoc loc);
AstValue *ast_value_prepend(AstValue *list, AstValue *v);
AstItem *ast_setting(char *key, AstValue *value, SrcLoc loc);
AstItem *ast_block(char *name, char *label, AstItem *reversed_items, SrcLoc loc,
                   SrcLoc label_loc, SrcLoc end_loc);
AstItem *ast_item_prepend(AstItem *list, AstItem *item);
AstItem *ast_items_reverse(AstItem *list);
AstModel *ast_model(char *name, char *base, AstItem *reversed_items, SrcLoc loc, SrcLoc base_loc);
AstModel *ast_model_prepend(AstModel *list, AstModel *m);
AstModel *ast_models_reverse(AstModel *list);
AstFile *ast_file(AstModel *reversed_models);

void ast_value_free(AstValue *v);
void ast_items_free(AstItem *list);
void ast_models_free(AstModel *list);
void ast_file_free(AstFile *f);

/* Parses src.  On success returns a tree (possibly with no models).
 * On a syntax error or a bad character reports through d and returns NULL.
 * A number literal out of range is reported, marked `bad` and kept, so the
 * rest of the file is still checked: callers must look at d->errors.
 * Never aborts on bad input; nesting deeper than AST_MAX_DEPTH is an error. */
#define AST_MAX_DEPTH 64
AstFile *ast_parse(const DiagSource *src, Diag *d);

/* "an integer", "a number", "a name", ... for messages. */
const char *ast_value_kind_name(AstValueKind k);

#endif

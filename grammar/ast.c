/* grammar/ast.c — AST builders and destructors; see ast.h. */
#include "ast.h"

#include <stdlib.h>

#include "error.h"

SrcLoc ast_loc(const DiagSource *src, int line, int col)
{
    SrcLoc l = {src, line, col};
    return l;
}

static AstValue *value_new(AstValueKind kind, char *text, SrcLoc loc)
{
    AstValue *v = xcalloc(1, sizeof *v);
    v->kind = kind;
    v->text = text;
    v->loc = loc;
    return v;
}

AstValue *ast_int(char *text, int64_t i, SrcLoc loc)
{
    AstValue *v = value_new(AST_VAL_INT, text, loc);
    v->i = i;
    v->f = (double)i;
    return v;
}

AstValue *ast_float(char *text, double f, SrcLoc loc)
{
    AstValue *v = value_new(AST_VAL_FLOAT, text, loc);
    v->f = f;
    return v;
}

/* The scanner caps integer literals at INT64_MAX, so -i cannot overflow. */
AstValue *ast_negate(AstValue *v, SrcLoc loc)
{
    v->i = -v->i;
    v->f = -v->f;
    v->loc = loc;
    return v;
}

AstValue *ast_ident(char *name, SrcLoc loc)
{
    return value_new(AST_VAL_IDENT, name, loc);
}

AstValue *ast_call(char *name, AstValue *arg, SrcLoc loc)
{
    AstValue *v = value_new(AST_VAL_CALL, name, loc);
    v->arg = arg;
    return v;
}

AstValue *ast_call_block(char *name, AstItem *items, SrcLoc loc)
{
    AstValue *v = value_new(AST_VAL_CALL, name, loc);
    v->body = ast_items_reverse(items);
    v->has_body = true;
    return v;
}

AstValue *ast_range(AstValue *lo, AstValue *hi, SrcLoc loc)
{
    AstValue *v = value_new(AST_VAL_RANGE, NULL, loc);
    v->i = lo->i;
    v->i2 = hi->i;
    v->bad = lo->bad || hi->bad;
    ast_value_free(lo);
    ast_value_free(hi);
    return v;
}

AstValue *ast_tuple(AstValue *reversed, SrcLoc loc)
{
    AstValue *v = value_new(AST_VAL_TUPLE, NULL, loc), *out = NULL;
    while (reversed) {
        AstValue *next = reversed->next;
        reversed->next = out;
        out = reversed;
        reversed = next;
    }
    v->elems = out;
    return v;
}

AstValue *ast_value_prepend(AstValue *list, AstValue *v)
{
    v->next = list;
    return v;
}

AstItem *ast_setting(char *key, AstValue *value, SrcLoc loc)
{
    AstItem *it = xcalloc(1, sizeof *it);
    it->kind = AST_SETTING;
    it->key = key;
    it->value = value;
    it->loc = loc;
    return it;
}

AstItem *ast_block(char *name, char *label, AstItem *reversed_items, SrcLoc loc,
                   SrcLoc label_loc, SrcLoc end_loc)
{
    AstItem *it = xcalloc(1, sizeof *it);
    it->kind = AST_BLOCK;
    it->key = name;
    it->label = label;
    it->items = ast_items_reverse(reversed_items);
    it->loc = loc;
    it->label_loc = label_loc;
    it->end_loc = end_loc;
    return it;
}

AstItem *ast_item_prepend(AstItem *list, AstItem *item)
{
    item->next = list;
    return item;
}

AstItem *ast_items_reverse(AstItem *list)
{
    AstItem *out = NULL;
    while (list) {
        AstItem *next = list->next;
        list->next = out;
        out = list;
        list = next;
    }
    return out;
}

AstModel *ast_model(char *name, char *base, AstItem *reversed_items, SrcLoc loc, SrcLoc base_loc)
{
    AstModel *m = xcalloc(1, sizeof *m);
    m->name = name;
    m->base = base;
    m->items = ast_items_reverse(reversed_items);
    m->loc = loc;
    m->base_loc = base_loc;
    return m;
}

AstModel *ast_model_prepend(AstModel *list, AstModel *m)
{
    m->next = list;
    return m;
}

AstModel *ast_models_reverse(AstModel *list)
{
    AstModel *out = NULL;
    while (list) {
        AstModel *next = list->next;
        list->next = out;
        out = list;
        list = next;
    }
    return out;
}

AstFile *ast_file(AstModel *reversed_models)
{
    AstFile *f = xcalloc(1, sizeof *f);
    f->models = ast_models_reverse(reversed_models);
    return f;
}

/* Recursion depth is bounded by AST_MAX_DEPTH (the scanner enforces it). */
void ast_value_free(AstValue *v)
{
    while (v) {
        AstValue *next = v->next;
        free(v->text);
        ast_value_free(v->arg);
        ast_value_free(v->elems);
        ast_items_free(v->body);
        free(v);
        v = next;
    }
}

void ast_items_free(AstItem *list)
{
    while (list) {
        AstItem *next = list->next;
        free(list->key);
        free(list->label);
        ast_value_free(list->value);
        ast_items_free(list->items);
        free(list);
        list = next;
    }
}

void ast_models_free(AstModel *list)
{
    while (list) {
        AstModel *next = list->next;
        free(list->name);
        free(list->base);
        ast_items_free(list->items);
        free(list);
        list = next;
    }
}

void ast_file_free(AstFile *f)
{
    if (!f) return;
    ast_models_free(f->models);
    free(f);
}

const char *ast_value_kind_name(AstValueKind k)
{
    switch (k) {
    case AST_VAL_INT: return "an integer";
    case AST_VAL_FLOAT: return "a number";
    case AST_VAL_IDENT: return "a name";
    case AST_VAL_TUPLE: return "a tuple";
    case AST_VAL_RANGE: return "a range";
    case AST_VAL_CALL: return "a setting with arguments";
    }
    return "?";
}

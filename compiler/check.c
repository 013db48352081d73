/* compiler/check.c — loading a .model file, resolving `extends`, and the
 * model level (which blocks a model holds).  See check.h.  Keys are in
 * check_keys.c, cross-key rules in check_rules.c. */
#include "check.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check_internal.h"
#include "error.h"

/* Files larger than this are refused before parsing. */
#define CHECK_MAX_FILE_BYTES ((size_t)64 << 20)
/* The longest `extends` chain, counting the model itself. */
#define CHECK_MAX_CHAIN 16

typedef struct Loaded {
    char *path;
    AstFile *ast;          /* NULL if it failed to parse */
    struct Loaded *next;
} Loaded;

typedef struct {
    const AstModel *model;
    const AstFile *file;   /* to find sibling models */
    char *dir;             /* where its bases are looked up */
} Link;

typedef struct {
    Checker ck;
    Diag diag;
    Loaded *files;
    Link chain[CHECK_MAX_CHAIN];
    int n;
} Load;

/* Reads a whole file; on failure returns NULL and sets errno. */
static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = xmalloc(cap);
    errno = 0;
    for (;;) {
        if (n == cap) {
            if (cap >= CHECK_MAX_FILE_BYTES) {
                free(buf);
                fclose(f);
                errno = EFBIG;
                return NULL;
            }
            cap *= 2;
            buf = xrealloc(buf, cap);
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f), why = errno;
    fclose(f);
    if (bad) {
        free(buf);
        errno = why ? why : EIO;
        return NULL;
    }
    *len = n;
    return buf;
}

static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return xstrdup(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *d = xmalloc(n + 1);
    memcpy(d, path, n);
    d[n] = '\0';
    return d;
}

/* Parses a base file once per load; NULL (already reported) on failure. */
static AstFile *load_base_file(Load *L, const char *path, SrcLoc from, const char *base)
{
    for (Loaded *f = L->files; f; f = f->next)
        if (strcmp(f->path, path) == 0) return f->ast;
    size_t len = 0;
    char *text = read_all(path, &len);
    if (!text) {
        diag_error(&L->diag, from, "cannot find base model '%s': no model of that name in this file, and %s: %s",
                   base, path, strerror(errno));
        return NULL;
    }
    Loaded *f = xcalloc(1, sizeof *f);
    f->path = xstrdup(path);
    f->ast = ast_parse(diag_source_new(&L->diag, path, text, len), &L->diag);
    f->next = L->files;
    L->files = f;
    free(text);
    return f->ast;
}

static const AstModel *find_model(const AstFile *f, const char *name)
{
    for (const AstModel *m = f ? f->models : NULL; m; m = m->next)
        if (strcmp(m->name, name) == 0) return m;
    return NULL;
}

/* Appends the base of the last link; false when the chain ends (or fails). */
static bool extend_chain(Load *L)
{
    const Link *last = &L->chain[L->n - 1];
    const AstModel *m = last->model;
    if (!m->base) return false;
    for (int i = 0; i < L->n; i++)
        if (strcmp(L->chain[i].model->name, m->base) == 0) {
            char path[512];
            size_t len = 0;
            for (int j = i; j < L->n && len < sizeof path; j++)
                len += (size_t)snprintf(path + len, sizeof path - len, "%.40s -> ", L->chain[j].model->name);
            if (len < sizeof path) snprintf(path + len, sizeof path - len, "%.40s", m->base);
            diag_error(&L->diag, m->base_loc, "'extends' makes a cycle: %s", path);
            return false;
        }
    if (L->n == CHECK_MAX_CHAIN) {
        diag_error(&L->diag, m->base_loc, "'extends' chain is longer than %d models", CHECK_MAX_CHAIN);
        return false;
    }
    Link next = {find_model(last->file, m->base), last->file, NULL};
    if (next.model == m) next.model = NULL;
    if (!next.model) {
        size_t n = strlen(last->dir) + strlen(m->base) + 16;
        char *path = xmalloc(n);
        snprintf(path, n, "%s/%s.model", last->dir, m->base);
        next.file = load_base_file(L, path, m->base_loc, m->base);
        next.model = find_model(next.file, m->base);
        if (next.file && !next.model)
            diag_error(&L->diag, m->base_loc, "%s has no model named '%s'", path, m->base);
        next.dir = dir_of(path);
        free(path);
    } else {
        next.dir = xstrdup(last->dir);
    }
    if (!next.model) {
        free(next.dir);
        return false;
    }
    L->chain[L->n++] = next;
    return true;
}

static const char *const BLOCKS[] = {"encoder", "decoder", "head", "train"};

static void misplaced_setting(Checker *c, const AstItem *it)
{
    static const char *const where[] = {
        [BLK_STACK] = "the encoder or decoder block", [BLK_HEAD] = "the head block",
        [BLK_TRAIN] = "the train block", [BLK_OPTIMIZER] = "optimizer = NAME { ... } in the train block",
        [BLK_SCHEDULE] = "schedule = NAME { ... } in the train block",
        [BLK_SCALE] = "loss_scale = dynamic { ... } in the train block"};
    CheckBlock blk;
    if (check_key_block(it->key, &blk))
        diag_error(c->diag, it->loc, "'%s' belongs in %s", it->key, where[blk]);
    else
        diag_error(c->diag, it->loc, "unknown setting '%.40s' at the model level; settings go in an encoder, decoder, head or train block",
                   it->key);
}

static void unknown_block(Checker *c, const AstItem *it)
{
    const char *near = check_closest(it->key, BLOCKS, 4);
    if (near)
        diag_error(c->diag, it->loc, "unknown block '%.40s'; did you mean '%s'?", it->key, near);
    else
        diag_error(c->diag, it->loc, "unknown block '%.40s' (a model holds encoder or decoder, head and train blocks)",
                   it->key);
}

/* Returns false for a second block of the same kind (reported). */
static bool first_block(Checker *c, const AstItem *it, int *line, const char *what)
{
    if (*line) {
        diag_error(c->diag, it->loc, "a model has one %s block (the first is on line %d)", what, *line);
        return false;
    }
    *line = it->loc.line;
    return true;
}

static void apply_block(Checker *c, const AstItem *it, ModelSpec *spec, int lines[3])
{
    bool is_stack = strcmp(it->key, "encoder") == 0 || strcmp(it->key, "decoder") == 0;
    if (is_stack || strcmp(it->key, "train") == 0) {
        if (it->label)
            diag_error(c->diag, it->label_loc, "'%s' takes no name after it (got '%.40s')", it->key, it->label);
        if (!first_block(c, it, &lines[is_stack ? 0 : 2], is_stack ? "encoder or decoder" : "train")) return;
    }
    if (is_stack) {
        check_enter_stack(spec, it->key[0] == 'd' ? STACK_DECODER : STACK_ENCODER);
        c->has_stack = true;
        c->stack_loc = it->loc;
        check_apply_block(c, BLK_STACK, it->items, spec);
    } else if (strcmp(it->key, "train") == 0) {
        check_apply_block(c, BLK_TRAIN, it->items, spec);
    } else if (strcmp(it->key, "head") == 0) {
        if (!first_block(c, it, &lines[1], "head")) return;
        if (!check_enter_head(c, it, spec)) return;
        c->head_loc = it->loc;
        check_apply_block(c, BLK_HEAD, it->items, spec);
    } else {
        unknown_block(c, it);
    }
}

static void apply_model(Checker *c, const AstModel *m, ModelSpec *spec)
{
    int lines[3] = {0, 0, 0}; /* first stack, head, train block */
    for (const AstItem *it = m->items; it && !diag_full(c->diag); it = it->next) {
        if (it->kind == AST_SETTING) misplaced_setting(c, it);
        else apply_block(c, it, spec, lines);
    }
}

static void check_model(Load *L, const AstFile *f, const char *dir, ModelSpec *out)
{
    const AstModel *target = f->models;
    while (target->next) target = target->next;
    L->chain[0] = (Link){target, f, xstrdup(dir)};
    L->n = 1;
    int before = L->diag.errors;
    while (extend_chain(L)) {}
    if (L->diag.errors != before) return;
    Checker *c = &L->ck;
    c->stack_loc = c->head_loc = target->loc;
    if (strlen(target->name) >= sizeof out->name)
        diag_error(c->diag, target->loc, "model name is longer than %zu characters", sizeof out->name - 1);
    snprintf(out->name, sizeof out->name, "%s", target->name);
    /* The root base first, so each derived model overrides its base. */
    for (int i = L->n - 1; i >= 0 && !diag_full(c->diag); i--) apply_model(c, L->chain[i].model, out);
    c->model_loc = target->loc;
    if (!diag_full(c->diag)) check_rules(c, out);
}

static void load_free(Load *L)
{
    for (int i = 0; i < L->n; i++) free(L->chain[i].dir);
    Loaded *f = L->files;
    while (f) {
        Loaded *next = f->next;
        ast_file_free(f->ast);
        free(f->path);
        free(f);
        f = next;
    }
    diag_free(&L->diag);
}

int check_load_string(const char *name, const char *text, size_t len,
                      const char *base_dir, ModelSpec *out, FILE *diag)
{
    HPC_ASSERT(check_table_ok());
    if (!name) name = "<string>";
    if (!text) text = "", len = 0;
    Load *L = xcalloc(1, sizeof *L);
    diag_init(&L->diag, diag);
    L->ck.diag = &L->diag;
    spec_defaults(out);
    snprintf(out->source, sizeof out->source, "%s", name);
    AstFile *f = NULL;
    if (len > CHECK_MAX_FILE_BYTES)
        diag_error_file(&L->diag, name, "the model is %zu bytes; the limit is %zu", len, CHECK_MAX_FILE_BYTES);
    else
        f = ast_parse(diag_source_new(&L->diag, name, text, len), &L->diag);
    if (f && !f->models)
        diag_error_file(&L->diag, name, "no model in this file (a model starts with `model NAME {`)");
    else if (f)
        check_model(L, f, base_dir ? base_dir : ".", out);
    int errors = L->diag.errors;
    ast_file_free(f);
    load_free(L);
    free(L);
    if (errors) spec_defaults(out);
    return errors;
}

int check_load_file(const char *path, ModelSpec *out, FILE *diag)
{
    size_t len = 0;
    char *text = read_all(path, &len);
    if (!text) {
        spec_defaults(out);
        if (diag && errno == EFBIG)
            fprintf(diag, "%s: error: the model file is larger than the limit of %zu MiB\n", path,
                    CHECK_MAX_FILE_BYTES >> 20);
        else if (diag)
            fprintf(diag, "%s: error: cannot read the model file: %s\n", path, strerror(errno));
        return -1;
    }
    char *dir = dir_of(path);
    int rc = check_load_string(path, text, len, dir, out, diag);
    free(dir);
    free(text);
    return rc;
}

/* tools/cuemu/emu_asm.c — inline PTX to calls the host can run (cuemu.h).
 *
 * hpc's kernels hold a few inline PTX statements (conversions, mma.sync,
 * ldmatrix, cp.async, wide stores).  Before g++ sees a module,
 * emu_rewrite_asm replaces each statement
 *     asm [volatile] ("template" : outputs : inputs [: clobbers]);
 * by a call emu_asm_NAME(outputs..., inputs...) of emu_kernel.h, NAME found
 * from the template (whitespace, "\n" and the final ';' ignored).  An
 * operand's expression is copied as written: outputs bind to references,
 * inputs pass by value.  A template the table does not know becomes
 * emu_asm_unknown("template"), which ends the run if it is ever reached,
 * so a statement in a branch the emulator never takes (red8_f32's sm_90
 * one: __CUDA_ARCH__ is undefined there) costs nothing.
 *
 * It also turns `extern __shared__ T name[];` (by then `extern static T
 * name[];`) into a pointer to the launch's dynamic shared memory. */
#include "emu_asm.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *ptx;    /* the template, whitespace collapsed, no ';' */
    const char *call;   /* emu_asm_... in emu_kernel.h */
} Known;

static const Known g_known[] = {
    {"cvt.f32.f16 %0, %1", "emu_asm_cvt_f32_f16"},
    {"cvt.rn.f16.f32 %0, %1", "emu_asm_cvt_rn_f16_f32"},
    {"cvt.rn.bf16.f32 %0, %1", "emu_asm_cvt_rn_bf16_f32"},
    {"cvt.rn.f16x2.f32 %0, %1, %2", "emu_asm_cvt_rn_f16x2_f32"},
    {"cvt.rn.bf16x2.f32 %0, %1, %2", "emu_asm_cvt_rn_bf16x2_f32"},
    {"ex2.approx.ftz.f32 %0, %1", "emu_asm_ex2_approx_ftz_f32"},
    {"rcp.approx.ftz.f32 %0, %1", "emu_asm_rcp_approx_ftz_f32"},
    {"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}",
     "emu_asm_mma_16816_f16"},
    {"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}",
     "emu_asm_mma_16816_bf16"},
    {"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4]", "emu_asm_ldmatrix_x4"},
    {"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4]", "emu_asm_ldmatrix_x4_trans"},
    {"cp.async.cg.shared.global [%0], [%1], 16, %2", "emu_asm_cp_async16"},
    {"cp.async.ca.shared.global [%0], [%1], 4, %2", "emu_asm_cp_async4"},
    {"cp.async.commit_group", "emu_asm_nothing"},
    {"cp.async.wait_group 0", "emu_asm_nothing"},
    {"cp.async.wait_group 1", "emu_asm_nothing"},
    {"st.global.v4.b32 [%0], {%1, %2, %3, %4}", "emu_asm_st_global_v4_b32"},
};

typedef struct {
    char *s;
    size_t n, cap;
} Buf;

static void put(Buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = 2 * (b->n + n + 1);
        b->s = realloc(b->s, b->cap);
        if (!b->s) abort();
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void puts_(Buf *b, const char *s) { put(b, s, strlen(s)); }

static const char *skip_space(const char *p)
{
    while (isspace((unsigned char)*p)) p++;
    return p;
}

/* Reads adjacent string literals into tpl (escapes "\n" and "\t" become
 * spaces, others kept); returns the position after them, or NULL. */
static const char *read_template(const char *p, Buf *tpl)
{
    int any = 0;
    for (p = skip_space(p); *p == '"'; p = skip_space(p)) {
        any = 1;
        for (p++; *p && *p != '"'; p++) {
            if (*p == '\\' && p[1]) {
                p++;
                put(tpl, *p == 'n' || *p == 't' ? " " : p, 1);
            } else {
                put(tpl, p, 1);
            }
        }
        if (*p != '"') return NULL;
        p++;
    }
    return any ? p : NULL;
}

/* Collapses whitespace and drops a trailing ';'. */
static void normalise(char *s)
{
    char *w = s;
    int space = 1;
    for (char *r = s; *r; r++) {
        if (isspace((unsigned char)*r)) {
            if (!space) *w++ = ' ';
            space = 1;
        } else {
            *w++ = *r;
            space = 0;
        }
    }
    while (w > s && (w[-1] == ' ' || w[-1] == ';')) w--;
    *w = '\0';
}

/* Operands `"c"(expr), ...` up to a ':' or ')' at depth 0; appends each
 * expr to args (comma separated).  Returns the position of the stop. */
static const char *read_operands(const char *p, Buf *args, int *count)
{
    for (;;) {
        p = skip_space(p);
        if (*p == ':' || *p == ')') return p;
        if (*p != '"') return NULL;
        const char *q = strchr(p + 1, '"');
        if (!q) return NULL;
        p = skip_space(q + 1);
        if (*p != '(') return NULL;
        int depth = 0;
        const char *start = p;
        for (; *p; p++) {
            if (*p == '(') depth++;
            else if (*p == ')' && --depth == 0) break;
        }
        if (!*p) return NULL;
        if ((*count)++) puts_(args, ", ");
        put(args, start, (size_t)(p - start + 1));
        p = skip_space(p + 1);
        if (*p == ',') p++;
    }
}

/* One statement from `asm` at p: its replacement into out; returns the
 * position after its closing ')', or NULL if it does not parse. */
static const char *rewrite_one(const char *p, Buf *out)
{
    Buf tpl = {0}, args = {0};
    int count = 0;
    const char *q = skip_space(p + 3);
    if (!strncmp(q, "volatile", 8)) q = skip_space(q + 8);
    else if (!strncmp(q, "__volatile__", 12)) q = skip_space(q + 12);
    if (*q != '(') return NULL;
    q = read_template(q + 1, &tpl);
    for (int section = 0; q && section < 3; section++) {
        q = skip_space(q);
        if (*q == ')') break;
        if (*q != ':') { q = NULL; break; }
        q++;
        if (section == 2) {   /* clobbers: string literals, skipped */
            while (q && *(q = skip_space(q)) == '"') {
                const char *e = strchr(q + 1, '"');
                q = e ? skip_space(e + 1) : NULL;
                if (q && *q == ',') q++;
            }
            break;
        }
        q = read_operands(q, &args, &count);
    }
    if (q) q = skip_space(q);
    if (!q || *q != ')' || !tpl.s) {
        free(tpl.s);
        free(args.s);
        return NULL;
    }
    normalise(tpl.s);
    const char *call = NULL;
    for (size_t i = 0; i < sizeof g_known / sizeof g_known[0]; i++)
        if (!strcmp(g_known[i].ptx, tpl.s)) call = g_known[i].call;
    if (call) {
        puts_(out, call);
        puts_(out, "(");
        if (args.s) puts_(out, args.s);
        puts_(out, ")");
    } else {
        puts_(out, "emu_asm_unknown(\"");
        for (const char *c = tpl.s; *c; c++) put(out, *c == '"' || *c == '\\' ? "?" : c, 1);
        puts_(out, "\")");
    }
    free(tpl.s);
    free(args.s);
    return q + 1;
}

/* `extern static T name[];` (what `extern __shared__ T name[];` is once
 * __shared__ means static) into a pointer to the launch's dynamic shared
 * memory; returns the position after the ';', or NULL. */
static const char *rewrite_dynamic_shared(const char *p, Buf *out)
{
    const char *end = strchr(p, ';');
    if (!end) return NULL;
    const char *close = end;
    while (close > p && isspace((unsigned char)close[-1])) close--;
    if (close - p < 2 || close[-1] != ']' || close[-2] != '[') return NULL;
    const char *name_end = close - 2;
    while (name_end > p && isspace((unsigned char)name_end[-1])) name_end--;
    const char *name = name_end;
    while (name > p && (isalnum((unsigned char)name[-1]) || name[-1] == '_')) name--;
    const char *type = p + strlen("extern static");
    if (name == name_end || name <= type) return NULL;
    puts_(out, "");
    put(out, type, (size_t)(name - type));
    puts_(out, "*const ");
    put(out, name, (size_t)(name_end - name));
    puts_(out, " = (");
    put(out, type, (size_t)(name - type));
    puts_(out, "*)emu_dynamic_shared();");
    return end + 1;
}

/* Pass 1: the dynamic shared-memory declarations. */
static char *rewrite_shared(const char *src)
{
    Buf out = {0};
    puts_(&out, "");
    const char *copied = src;
    for (const char *d = strstr(src, "extern static"); d; d = strstr(d + 1, "extern static")) {
        Buf decl = {0};
        const char *end = d >= copied ? rewrite_dynamic_shared(d, &decl) : NULL;
        if (end) {
            put(&out, copied, (size_t)(d - copied));
            puts_(&out, decl.s);
            copied = end;
        }
        free(decl.s);
    }
    puts_(&out, copied);
    return out.s;
}

/* Pass 2: the asm statements. */
static char *rewrite_asm(const char *src)
{
    Buf out = {0};
    puts_(&out, "");
    const char *p = src, *copied = src;
    while ((p = strstr(p, "asm"))) {
        int word = (p == src || !(isalnum((unsigned char)p[-1]) || p[-1] == '_')) &&
                   !(isalnum((unsigned char)p[3]) || p[3] == '_');
        Buf call = {0};
        const char *end = word ? rewrite_one(p, &call) : NULL;
        if (!end) {
            free(call.s);
            p += 3;
            continue;
        }
        put(&out, copied, (size_t)(p - copied));
        puts_(&out, call.s);
        free(call.s);
        p = copied = end;
    }
    puts_(&out, copied);
    return out.s;
}

char *emu_rewrite_asm(const char *src)
{
    char *shared = rewrite_shared(src);
    char *done = rewrite_asm(shared);
    free(shared);
    return done;
}

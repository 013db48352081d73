/* tools/cuemu/emu_asm.c — inline PTX to calls the host can run (cuemu.h).
 *
 * hpc's kernels hold a few inline PTX statements (conversions, mma.sync,
 * ldmatrix, stmatrix, cp.async, wide stores; wgmma, mbarrier, TMA loads and stores
 * in the GEMMs of its own, and thread block clusters: %cluster_ctarank, mapa,
 * remote mbarrier arrivals, multicast TMA loads, barrier.cluster).
 * Before g++ sees a (preprocessed) module, emu_rewrite_asm replaces each
 * statement
 *     asm [volatile] ("template" : outputs : inputs [: clobbers]);
 * by a call emu_asm_NAME(outputs..., inputs...) of emu_kernel.h, NAME found
 * from the template (whitespace, "\n" and the final ';' ignored) in
 * g_known; a wgmma.mma_async of any n by rewrite_wgmma; a template of
 * fences and waits alone (wgmma's, cp.async's, the TMA stores' commits,
 * mbarrier init's) by emu_asm_nothing; setmaxnreg by
 * emu_asm_setmaxnreg(inc, count), which keeps the block's register pool.  An
 * operand's expression is copied as written: outputs bind to references,
 * inputs pass by value.  A template the table does not know becomes
 * emu_asm_unknown("template"), which ends the run if it is ever reached,
 * so a statement in a branch the emulator never takes (red8_f32's sm_90
 * one: __CUDA_ARCH__ is undefined there) costs nothing.
 *
 * It also turns every __shared__ declaration (by then `__emu_shared__`)
 * into references to the block's shared-memory window (emu_kernel.h), and
 * `extern __shared__ T name[];` into a pointer to its dynamic part. */
#include "emu_asm.h"

#include <ctype.h>
#include <stdio.h>
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
    {"stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4}", "emu_asm_stmatrix_x4"},
    {"cp.async.cg.shared.global [%0], [%1], 16, %2", "emu_asm_cp_async16"},
    {"cp.async.ca.shared.global [%0], [%1], 4, %2", "emu_asm_cp_async4"},
    {"st.global.v4.b32 [%0], {%1, %2, %3, %4}", "emu_asm_st_global_v4_b32"},
    {"mbarrier.init.shared::cta.b64 [%0], %1", "emu_asm_mbar_init"},
    {"mbarrier.arrive.shared::cta.b64 _, [%0]", "emu_asm_mbar_arrive"},
    {"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1", "emu_asm_mbar_arrive_expect_tx"},
    {"{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }",
     "emu_asm_mbar_try_wait"},
    {"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4]",
     "emu_asm_tma_load_2d"},
    {"cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3]", "emu_asm_tma_store_2d"},
    {"cp.async.bulk.wait_group.read 0", "emu_asm_bulk_wait"},
    {"cp.async.bulk.wait_group 0", "emu_asm_bulk_wait"},
    {"cp.async.bulk.wait_group.read 1", "emu_asm_bulk_wait_but_last"},
    {"cp.async.bulk.commit_group", "emu_asm_bulk_commit"},
    /* thread block clusters: a literal % is %% in a template with operands */
    {"mov.u32 %0, %%cluster_ctarank", "emu_asm_cluster_ctarank"},
    {"mov.u32 %0, %cluster_ctarank", "emu_asm_cluster_ctarank"},
    {"mov.u32 %0, %%cluster_nctarank", "emu_asm_cluster_nctarank"},
    {"mov.u32 %0, %cluster_nctarank", "emu_asm_cluster_nctarank"},
    {"{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }",
     "emu_asm_mbar_try_wait"},
    {"mapa.shared::cluster.u32 %0, %1, %2", "emu_asm_mapa"},
    {"mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0]", "emu_asm_mbar_arrive_cluster"},
    {"mbarrier.arrive.shared::cluster.b64 _, [%0]", "emu_asm_mbar_arrive_cluster"},
    {"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, "
     "%3}], [%4], %5",
     "emu_asm_tma_load_2d_multicast"},
    {"barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned", "emu_asm_cluster_sync"},
    {"barrier.cluster.arrive.aligned; barrier.cluster.wait.aligned", "emu_asm_cluster_sync"},
    {"barrier.cluster.arrive; barrier.cluster.wait", "emu_asm_cluster_sync"},
    {"barrier.cluster.arrive.release.aligned", "emu_asm_cluster_arrive"},
    {"barrier.cluster.arrive.relaxed.aligned", "emu_asm_cluster_arrive"},
    {"barrier.cluster.arrive.aligned", "emu_asm_cluster_arrive"},
    {"barrier.cluster.arrive", "emu_asm_cluster_arrive"},
    {"barrier.cluster.wait.acquire.aligned", "emu_asm_cluster_wait"},
    {"barrier.cluster.wait.aligned", "emu_asm_cluster_wait"},
    {"barrier.cluster.wait", "emu_asm_cluster_wait"},
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

enum { MAX_OPERANDS = 192 };

/* The operands' expressions, %0 first. */
typedef struct {
    char *v[MAX_OPERANDS];
    int n;
} Operands;

/* Operands `"c"(expr), ...` up to a ':' or ')' at depth 0; appends each
 * expr to args (comma separated) and to ops.  Returns the position of the
 * stop. */
static const char *read_operands(const char *p, Buf *args, int *count, Operands *ops)
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
        if (ops->n == MAX_OPERANDS) return NULL;
        ops->v[ops->n++] = strndup(start, (size_t)(p - start + 1));
        p = skip_space(p + 1);
        if (*p == ',') p++;
    }
}

/* setmaxnreg.{inc,dec}.sync.aligned.u32 N as emu_asm_setmaxnreg(inc, N);
 * 0 for any other template. */
static int rewrite_setmaxnreg(const char *tpl, Buf *out)
{
    int inc = !strncmp(tpl, "setmaxnreg.inc.sync.aligned.u32 ", 32);
    if (!inc && strncmp(tpl, "setmaxnreg.dec.sync.aligned.u32 ", 32)) return 0;
    char *end;
    long n = strtol(tpl + 32, &end, 10);
    if (end == tpl + 32 || *end) return 0;
    char call[64];
    snprintf(call, sizeof call, "emu_asm_setmaxnreg(%d, %ld)", inc, n);
    puts_(out, call);
    return 1;
}

/* ---- warpgroup MMA ------------------------------------------------------ */

/* Whether every instruction of the template only orders memory or waits
 * for wgmma or cp.async groups, which the emulator's synchronous wgmma and
 * copies make moot. */
static int only_fences(const char *tpl)
{
    static const char *const noop[] = {"fence.proxy.async", "wgmma.fence", "wgmma.commit_group", "wgmma.wait_group",
                                       "cp.async.commit_group", "cp.async.wait_group",   /* cp.async copies at once */
                                       "fence.mbarrier_init",                           /* no caches */
                                       "prefetch.global.L2"};
    int any = 0;
    for (const char *p = tpl; *p;) {
        while (*p == ' ' || *p == '{' || *p == '}' || *p == ';') p++;
        if (!*p) break;
        size_t n = strcspn(p, ";");
        int known = 0;
        for (size_t i = 0; i < sizeof noop / sizeof noop[0]; i++)
            if (!strncmp(p, noop[i], strlen(noop[i]))) known = 1;
        if (!known) return 0;
        any = 1;
        p += n;
    }
    return any;
}

/* "%12" -> 12, advancing *p; -1 if *p is not an operand. */
static int operand_at(const char **p)
{
    while (**p == ' ' || **p == ',') (*p)++;
    if (**p != '%') return -1;
    char *end;
    long v = strtol(*p + 1, &end, 10);
    *p = end;
    return (int)v;
}

/* An immediate (0, 1, -1) or an operand at *p, as C++ text into out. */
static int value_at(const char **p, const Operands *ops, Buf *out)
{
    while (**p == ' ' || **p == ',') (*p)++;
    if (**p == '%') {
        int i = operand_at(p);
        if (i < 0 || i >= ops->n) return 0;
        puts_(out, ops->v[i]);
        return 1;
    }
    char *end;
    long v = strtol(*p, &end, 10);
    if (end == *p) return 0;
    *p = end;
    char num[32];
    snprintf(num, sizeof num, "%ld", v);
    puts_(out, num);
    return 1;
}

/* A template `[{ .reg .pred p; setp.ne.b32 p, %Z, 0;] wgmma.mma_async.sync
 * .aligned.m64nNk16.f32.T.T {d...}, a, b, scale-d, imm-scale-a,
 * imm-scale-b[, imm-trans-a], imm-trans-b; [}]` into one emu_wgmma call;
 * a is a descriptor or {four registers}.  0 when tpl is not one. */
static int rewrite_wgmma(const char *tpl, const Operands *ops, Buf *out)
{
    const char *w = strstr(tpl, "wgmma.mma_async.sync.aligned.m64n");
    if (!w) return 0;
    const char *p = w + strlen("wgmma.mma_async.sync.aligned.m64n");
    char *end;
    long n = strtol(p, &end, 10);
    p = end;
    int bf16;
    if (!strncmp(p, "k16.f32.f16.f16 ", 16)) bf16 = 0, p += 16;
    else if (!strncmp(p, "k16.f32.bf16.bf16 ", 18)) bf16 = 1, p += 18;
    else return 0;
    if (n < 8 || n > 256 || n % 8) return 0;
    if (*p++ != '{') return 0;
    Buf call = {0};
    puts_(&call, "{ float *const emu_d_[] = {");
    for (long i = 0; i < n / 2; i++) {
        int k = operand_at(&p);
        if (k < 0 || k >= ops->n) goto bad;
        puts_(&call, i ? ", &" : "&");
        puts_(&call, ops->v[k]);
    }
    while (*p == ' ') p++;
    if (*p++ != '}') goto bad;
    while (*p == ' ' || *p == ',') p++;
    int a_regs = *p == '{';
    puts_(&call, "}; const unsigned emu_a_[4] = {");
    if (a_regs) {
        p++;
        for (int i = 0; i < 4; i++) {
            int k = operand_at(&p);
            if (k < 0 || k >= ops->n) goto bad;
            puts_(&call, i ? ", (unsigned)" : "(unsigned)");
            puts_(&call, ops->v[k]);
        }
        while (*p == ' ') p++;
        if (*p++ != '}') goto bad;
        puts_(&call, "}; emu_wgmma(emu_d_, ");
    } else {
        puts_(&call, "0, 0, 0, 0}; emu_wgmma(emu_d_, ");
    }
    char head[64];
    snprintf(head, sizeof head, "%ld, %d, %d, ", n, bf16, a_regs);
    puts_(&call, head);
    if (a_regs) puts_(&call, "0ull");
    else if (!value_at(&p, ops, &call)) goto bad;
    puts_(&call, ", emu_a_, ");
    if (!value_at(&p, ops, &call)) goto bad;   /* descriptor of B */
    puts_(&call, ", ");
    while (*p == ' ' || *p == ',') p++;
    if (*p == 'p') {   /* scale-d from the predicate the template set */
        const char *set = strstr(tpl, "setp.ne.b32 p, ");
        if (!set) goto bad;
        set += strlen("setp.ne.b32 p, ");
        puts_(&call, "(");
        if (!value_at(&set, ops, &call)) goto bad;
        puts_(&call, ") != 0");
        p++;
    } else if (!value_at(&p, ops, &call)) {
        goto bad;
    }
    int imms = a_regs ? 3 : 4;   /* scale-a, scale-b, [trans-a,] trans-b */
    for (int i = 0; i < imms; i++) {
        puts_(&call, ", ");
        if (a_regs && i == 2) puts_(&call, "0, ");
        if (!value_at(&p, ops, &call)) goto bad;
    }
    puts_(&call, "); }");
    puts_(out, call.s);
    free(call.s);
    return 1;
bad:
    free(call.s);
    return 0;
}

/* One statement from `asm` at p: its replacement into out; returns the
 * position after its closing ')', or NULL if it does not parse. */
static const char *rewrite_one(const char *p, Buf *out)
{
    Buf tpl = {0}, args = {0};
    Operands ops = {{0}, 0};
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
        q = read_operands(q, &args, &count, &ops);
    }
    if (q) q = skip_space(q);
    if (!q || *q != ')' || !tpl.s) {
        free(tpl.s);
        free(args.s);
        for (int i = 0; i < ops.n; i++) free(ops.v[i]);
        return NULL;
    }
    normalise(tpl.s);
    int special = only_fences(tpl.s)       ? (puts_(out, "emu_asm_nothing()"), 1)
                  : rewrite_setmaxnreg(tpl.s, out) ? 1
                                                 : rewrite_wgmma(tpl.s, &ops, out);
    for (int i = 0; i < ops.n; i++) free(ops.v[i]);
    if (special) {
        free(tpl.s);
        free(args.s);
        return q + 1;
    }
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

#define SHARED_MARK "__emu_shared__"   /* what emu_kernel.h makes of __shared__ */

static int is_ident(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* `extern __shared__ T name[];` into a pointer to the launch's dynamic
 * shared memory.  decl: the text between the mark and the ';'. */
static int rewrite_dynamic(const char *decl, size_t n, Buf *out)
{
    const char *close = decl + n;
    while (close > decl && isspace((unsigned char)close[-1])) close--;
    if (close - decl < 2 || close[-1] != ']' || close[-2] != '[') return 0;
    const char *name_end = close - 2;
    while (name_end > decl && isspace((unsigned char)name_end[-1])) name_end--;
    const char *name = name_end;
    while (name > decl && is_ident(name[-1])) name--;
    if (name == name_end) return 0;
    Buf type = {0};
    put(&type, decl, (size_t)(name - decl));
    puts_(out, type.s);
    puts_(out, "*const ");
    put(out, name, (size_t)(name_end - name));
    puts_(out, " = (");
    puts_(out, type.s);
    puts_(out, "*)emu_dynamic_shared();");
    free(type.s);
    return 1;
}

/* `__shared__ [attributes] T a[..][..], b[..];` into references to the
 * block's window: T (&a)[..][..] = *reinterpret_cast<T (*)[..][..]>(
 * emu_shared_var(SITE, sizeof(T[..][..]), ALIGN)); one site number per
 * declarator of the module. */
static int rewrite_window(const char *decl, size_t n, Buf *out, int *site)
{
    Buf text = {0};
    put(&text, decl, n);
    unsigned align = 16;
    char *attr;
    while ((attr = strstr(text.s, "__attribute__"))) {   /* aligned(N) kept as the alignment */
        char *open = strchr(attr, '(');
        int depth = 0;
        char *q = open;
        for (; q && *q; q++) {
            if (*q == '(') depth++;
            else if (*q == ')' && --depth == 0) break;
        }
        if (!q || !*q) break;
        char *al = strstr(attr, "aligned(");
        if (al && al < q) {
            unsigned a = (unsigned)strtoul(al + 8, NULL, 10);
            if (a > align) align = a;
        }
        memset(attr, ' ', (size_t)(q - attr + 1));
    }
    /* the declarators, split at the commas outside brackets */
    char *parts[32];
    int np = 0, depth = 0;
    parts[np++] = text.s;
    for (char *q = text.s; *q; q++) {
        if (*q == '[' || *q == '(') depth++;
        else if (*q == ']' || *q == ')') depth--;
        else if (*q == ',' && depth == 0 && np < 32) {
            *q = '\0';
            parts[np++] = q + 1;
        }
    }
    /* the first declarator's name ends the type */
    char *first = parts[0], *bracket = strchr(first, '[');
    char *name_end = bracket ? bracket : first + strlen(first);
    while (name_end > first && isspace((unsigned char)name_end[-1])) name_end--;
    char *name = name_end;
    while (name > first && is_ident(name[-1])) name--;
    if (name == name_end || name == first) {
        free(text.s);
        return 0;
    }
    Buf type = {0};
    put(&type, first, (size_t)(name - first));
    parts[0] = name;
    for (int i = 0; i < np; i++) {
        char *d = parts[i];
        while (isspace((unsigned char)*d)) d++;
        char *dims = d;
        while (is_ident(*dims)) dims++;
        char nm[256], buf[1024];
        snprintf(nm, sizeof nm, "%.*s", (int)(dims - d), d);
        char *tail = dims + strlen(dims);
        while (tail > dims && isspace((unsigned char)tail[-1])) tail--;
        *tail = '\0';
        if (!*nm) {
            free(text.s);
            free(type.s);
            return 0;
        }
        snprintf(buf, sizeof buf,
                 "%s(&%s)%s = *reinterpret_cast<%s(*)%s>(emu_shared_var(%d, sizeof(%s%s), "
                 "alignof(%s%s) > %u ? alignof(%s%s) : %u));",
                 type.s, nm, dims, type.s, dims, (*site)++, type.s, dims, type.s, dims, align, type.s, dims,
                 align);
        puts_(out, buf);
    }
    free(text.s);
    free(type.s);
    return 1;
}

/* Pass 1: the __shared__ declarations. */
static char *rewrite_shared(const char *src)
{
    Buf out = {0};
    puts_(&out, "");
    int site = 0;
    const char *copied = src;
    for (const char *m = strstr(src, SHARED_MARK); m; m = strstr(m + 1, SHARED_MARK)) {
        if (m < copied) continue;
        const char *decl = m + strlen(SHARED_MARK), *semi = strchr(decl, ';');
        if (!semi) break;
        const char *start = m;
        int dynamic = 0;
        const char *before = m;   /* `extern` just before the mark */
        while (before > copied && isspace((unsigned char)before[-1])) before--;
        if (before - copied >= 6 && !strncmp(before - 6, "extern", 6) && (before - 6 == src || !is_ident(before[-7]))) {
            dynamic = 1;
            start = before - 6;
        }
        Buf repl = {0};
        int ok = dynamic ? rewrite_dynamic(decl, (size_t)(semi - decl), &repl)
                         : rewrite_window(decl, (size_t)(semi - decl), &repl, &site);
        if (ok) {
            put(&out, copied, (size_t)(start - copied));
            puts_(&out, repl.s);
            copied = semi + 1;
        }
        free(repl.s);
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

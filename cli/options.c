/* cli/options.c — see options.h.  The rows of all sections are numbered in
 * order (0 .. n-1); getopt_long reports row k as 256 + k, or as its short
 * letter. */
#include "options.h"

#include <getopt.h>
#include <stdarg.h>
#include <string.h>

#include "nearest.h"

#define HELP_COL 24   /* where the help text of a row starts */
#define WIDTH 79      /* the help text stays within 79 columns */
#define LONG_VAL 256  /* getopt_long's value for row k is LONG_VAL + k */

typedef struct {
    const CliOpt *opt[CLI_MAX_OPTS];
    size_t base[CLI_MAX_OPTS];   /* the row's section, from the argument struct */
    int n;
} Rows;

int cli_section_rows(const CliSection *s)
{
    int n = 0;
    while (s->opts && s->opts[n].name) n++;
    return n;
}

static void rows_collect(const CliCommand *c, Rows *r)
{
    r->n = 0;
    for (int s = 0; s < CLI_MAX_SECTIONS && c->sections[s].opts; s++)
        for (int i = 0; c->sections[s].opts[i].name; i++) {
            HPC_ASSERT(r->n < CLI_MAX_OPTS);
            r->opt[r->n] = &c->sections[s].opts[i];
            r->base[r->n++] = c->sections[s].base;
        }
}

static bool takes_value(const CliOpt *o) { return o->kind != CLI_FLAG && o->kind != CLI_SET; }

static int row_named(const Rows *r, const char *name, size_t len)
{
    for (int i = 0; i < r->n; i++)
        if (strlen(r->opt[i]->name) == len && strncmp(r->opt[i]->name, name, len) == 0) return i;
    return -1;
}

static int row_of_val(const Rows *r, int val)
{
    if (val >= LONG_VAL) return val - LONG_VAL < r->n ? val - LONG_VAL : -1;
    for (int i = 0; i < r->n; i++)
        if (val && r->opt[i]->short_name == val) return i;
    return -1;
}

/* "--steps", or "-o/--output" for a row with a short name. */
static const char *spelled(const CliOpt *o, char *buf, size_t cap)
{
    if (o->short_name) snprintf(buf, cap, "-%c/--%s", o->short_name, o->name);
    else snprintf(buf, cap, "--%s", o->name);
    return buf;
}

static int fail(HpcError *err, const CliCommand *c, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(HpcError *err, const CliCommand *c, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    hpc_fail(err, HPC_ERR_USAGE, "%s: %s", c->name, msg);
    return HPC_ERR_USAGE;
}

/* ---- one value ----------------------------------------------------------- */

/* The value as the user typed it, for messages ('' when empty). */
static const char *shown(const char *v, char *buf, size_t cap)
{
    if (!*v) return "''";
    snprintf(buf, cap, "%.60s%s", v, strlen(v) > 60 ? "..." : "");
    return buf;
}

/* "a, b or c" */
static void choice_list(const char *const *choices, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; choices[i] && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", i == 0 ? "" : choices[i + 1] ? ", " : " or ",
                                choices[i]);
}

static bool pick_choice(const CliOpt *o, const char *v, char *why, size_t cap)
{
    int n = 0;
    for (; o->choices[n]; n++)
        if (strcmp(o->choices[n], v) == 0) return true;
    char list[200], sv[80];
    choice_list(o->choices, list, sizeof list);
    const char *near = strlen(v) > 3 ? nearest_name(v, o->choices, n) : NULL;   /* "gpu" is not "cpu" */
    snprintf(why, cap, "--%s %s: expected %s%s%s%s", o->name, shown(v, sv, sizeof sv), list,
             near ? "; did you mean " : "", near ? near : "", near ? "?" : "");
    return false;
}

static bool number_failed(const CliOpt *o, const char *v, NumStatus st, const char *wanted, char *why, size_t cap)
{
    char sv[80];
    const char *reason = num_reason(st);
    snprintf(why, cap, "--%s %s: %s%sexpected %s", o->name, shown(v, sv, sizeof sv), reason, *reason ? "; " : "",
             wanted);
    return false;
}

static bool apply(const CliOpt *o, void *field, const char *v, char *why, size_t cap)
{
    char wanted[128], sp[80];
    switch (o->kind) {
    case CLI_FLAG: *(bool *)field = true; return true;
    case CLI_SET: memcpy(field, &o->set, sizeof o->set); return true;
    case CLI_STR:
        if (!*v) return snprintf(why, cap, "%s needs a non-empty %s", spelled(o, sp, sizeof sp), o->meta), false;
        if (o->choices && !pick_choice(o, v, why, cap)) return false;
        *(const char **)field = v;
        return true;
    case CLI_INT: {
        int64_t x;
        NumStatus st = num_int(v, o->min, o->max, &x);
        if (st) return number_failed(o, v, st, num_int_wanted(o->min, o->max, wanted, sizeof wanted), why, cap);
        memcpy(field, &x, sizeof x);
        return true;
    }
    case CLI_REAL: {
        double x;
        NumStatus st = num_real(v, o->range, &x);
        if (st) return number_failed(o, v, st, num_real_wanted(o->range, wanted, sizeof wanted), why, cap);
        memcpy(field, &x, sizeof x);
        return true;
    }
    case CLI_FN: return o->fn(o, v, field, why, cap);
    }
    return false;
}

/* ---- what getopt_long refused -------------------------------------------- */

/* An unknown or ambiguous --word: name the candidates. */
static int unknown_long(const CliCommand *c, const Rows *r, const char *text, HpcError *err)
{
    const char *word = text + 2;
    size_t len = strcspn(word, "=");
    char name[64], list[400] = "";
    snprintf(name, sizeof name, "%.*s", (int)(len < 60 ? len : 60), word);
    const char *names[CLI_MAX_OPTS + 1];
    int n_prefix = 0;
    size_t used = 0;
    for (int i = 0; i < r->n; i++) {
        names[i] = r->opt[i]->name;
        if (strncmp(names[i], word, len) == 0 && used < sizeof list)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s--%s", n_prefix++ ? ", " : "", names[i]);
    }
    names[r->n] = "help";
    if (n_prefix > 1) return fail(err, c, "option --%s is ambiguous: %s (write more of the name)", name, list);
    const char *near = nearest_name(name, names, r->n + 1);
    if (near) return fail(err, c, "unknown option --%s; did you mean --%s?", name, near);
    return fail(err, c, "unknown option --%s (`hpc %s --help` lists the options)", name, c->name);
}

/* An unknown -x; "-steps" (one dash) was probably meant as --steps. */
static int unknown_short(const CliCommand *c, const Rows *r, int argc, char **argv, int letter, HpcError *err)
{
    const char *names[CLI_MAX_OPTS];
    for (int i = 0; i < r->n; i++) names[i] = r->opt[i]->name;
    for (int k = optind - 1; k <= optind; k++) {
        if (k < 1 || k >= argc || argv[k][0] != '-' || argv[k][1] == '-' || argv[k][1] != letter) continue;
        const char *near = strlen(argv[k]) > 2 ? nearest_name(argv[k] + 1, names, r->n) : NULL;
        if (near) return fail(err, c, "unknown option -%c (in %.40s); did you mean --%s?", letter, argv[k], near);
    }
    return fail(err, c, "unknown option -%c (`hpc %s --help` lists the options)", letter, c->name);
}

/* `--log --fp16`: the value looks like one of this command's options. */
static bool is_option_text(const Rows *r, const char *v)
{
    if (v[0] != '-' || v[1] != '-' || !v[2]) return false;
    size_t len = strcspn(v + 2, "=");
    return row_named(r, v + 2, len) >= 0 || (len == 4 && strncmp(v + 2, "help", 4) == 0);
}

/* ---- after the options --------------------------------------------------- */

static int check_args(const CliCommand *c, const CliParsed *p, HpcError *err)
{
    if (p->n_args < c->min_args)
        return fail(err, c, "no %s given (`hpc %s --help` shows the usage)", c->arg_name, c->name);
    if (c->max_args >= 0 && p->n_args > c->max_args) {
        if (c->max_args == 0) return fail(err, c, "unexpected argument '%.200s'", p->args[0]);
        return fail(err, c, "more than %s %s: '%.200s' and '%.200s'", c->max_args == 1 ? "one" : "the allowed",
                    c->arg_name, p->args[c->max_args - 1], p->args[c->max_args]);
    }
    return 0;
}

static int check_rows(const CliCommand *c, const Rows *r, const CliParsed *p, HpcError *err)
{
    char a[80], b[80];
    for (int i = 0; i < r->n; i++) {
        const CliOpt *o = r->opt[i];
        if (o->required && !p->seen[i])
            return fail(err, c, "%s %s is required", spelled(o, a, sizeof a), o->meta ? o->meta : "");
        if (!p->seen[i]) continue;
        if (o->needs && !p->seen[row_named(r, o->needs, strlen(o->needs))])
            return fail(err, c, "%s needs --%s", spelled(o, a, sizeof a), o->needs);
        for (int j = i + 1; j < r->n; j++)
            if (p->seen[j] && (o->excludes & r->opt[j]->excludes))
                return fail(err, c, "%s and %s contradict each other; give one of them", spelled(o, a, sizeof a),
                            spelled(r->opt[j], b, sizeof b));
    }
    return 0;
}

/* ---- the parser ---------------------------------------------------------- */

typedef struct {
    struct option longs[CLI_MAX_OPTS + 2];
    char shorts[3 * CLI_MAX_OPTS + 8];
} GetoptTables;

static void getopt_tables(const CliCommand *c, const Rows *r, GetoptTables *t)
{
    size_t k = 0;
    if (c->stop_at_arg) t->shorts[k++] = '+';
    t->shorts[k++] = ':';   /* a missing value is ':', not '?' */
    for (int i = 0; i < r->n; i++) {
        const CliOpt *o = r->opt[i];
        HPC_ASSERT(o->name && o->short_name != 'h' && row_named(r, o->name, strlen(o->name)) == i);
        HPC_ASSERT(!o->needs || row_named(r, o->needs, strlen(o->needs)) >= 0);
        t->longs[i] = (struct option){o->name, takes_value(o) ? required_argument : no_argument, NULL,
                                      o->short_name ? o->short_name : LONG_VAL + i};
        if (o->short_name) {
            t->shorts[k++] = o->short_name;
            if (takes_value(o)) t->shorts[k++] = ':';
        }
    }
    t->longs[r->n] = (struct option){"help", no_argument, NULL, 'h'};
    t->longs[r->n + 1] = (struct option){NULL, 0, NULL, 0};
    t->shorts[k++] = 'h';
    t->shorts[k] = '\0';
}

/* One option getopt_long accepted: row i with value v (NULL for flags). */
static int take(const CliCommand *c, const Rows *r, int i, const char *v, char **argv, void *args, HpcError *err)
{
    const CliOpt *o = r->opt[i];
    char why[700], sp[80];
    bool detached = v && optind >= 1 && v == argv[optind - 1];
    if (detached && is_option_text(r, v))
        return fail(err, c, "%s needs a value before %s (to use that text as the value, write --%s=%s)",
                    spelled(o, sp, sizeof sp), v, o->name, v);
    if (!apply(o, (char *)args + r->base[i] + o->off, v, why, sizeof why)) return fail(err, c, "%s", why);
    return 0;
}

int cli_parse(const CliCommand *c, int argc, char **argv, void *args, CliParsed *p, HpcError *err)
{
    Rows r;
    GetoptTables t;
    char sp[80];
    rows_collect(c, &r);
    getopt_tables(c, &r, &t);
    memset(p, 0, sizeof *p);
    optind = 0;   /* glibc: start over (this may not be the first parse) */
    opterr = 0;   /* the messages are ours */
    for (;;) {
        int ch = getopt_long(argc, argv, t.shorts, t.longs, NULL);
        if (ch == -1) break;
        if (ch == 'h') {
            cli_help(c, stdout);
            return CLI_HELP_SHOWN;
        }
        int i = row_of_val(&r, optopt);
        if (ch == ':' && i >= 0)
            return fail(err, c, "%s needs a value (%s)", spelled(r.opt[i], sp, sizeof sp), r.opt[i]->meta);
        if (ch == '?' && (i >= 0 || optopt == 'h'))   /* --fp16=x */
            return fail(err, c, "--%s takes no value", i >= 0 ? r.opt[i]->name : "help");
        if (ch == '?' && optopt) return unknown_short(c, &r, argc, argv, optopt, err);
        if (ch == '?') return unknown_long(c, &r, argv[optind - 1], err);
        i = row_of_val(&r, ch);
        HPC_ASSERT(i >= 0);
        int rc = take(c, &r, i, optarg, argv, args, err);
        if (rc) return rc;
        p->seen[i] = true;
    }
    p->args = argv + optind;
    p->n_args = argc - optind;
    int rc = check_args(c, p, err);
    return rc ? rc : check_rows(c, &r, p, err);
}

bool cli_seen(const CliCommand *c, const CliParsed *p, const char *name)
{
    Rows r;
    rows_collect(c, &r);
    int i = row_named(&r, name, strlen(name));
    HPC_ASSERT(i >= 0);
    return p->seen[i];
}

/* ---- the help text ------------------------------------------------------- */

/* The allowed range of a number row: " [1, 65536]", else "". */
static void range_text(const CliOpt *o, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (o->kind == CLI_INT) snprintf(buf, cap, " [%lld, %lld]", (long long)o->min, (long long)o->max);
    if (o->kind == CLI_REAL)
        snprintf(buf, cap, " %c%g, %g%c", o->range.lo_open ? '(' : '[', o->range.lo, o->range.hi,
                 o->range.hi_open ? ')' : ']');
}

/* Writes text from column HELP_COL (the cursor is there), word-wrapped at
 * WIDTH; a '\n' in text starts a new line. */
static void print_wrapped(const char *text, FILE *out)
{
    int col = HELP_COL;
    bool first = true;
    for (const char *p = text; *p;) {
        if (*p == '\n' || *p == ' ') {
            if (*p == '\n') fprintf(out, "\n%*s", HELP_COL, ""), col = HELP_COL, first = true;
            p++;
            continue;
        }
        size_t len = strcspn(p, " \n");
        if (!first && col + 1 + (int)len > WIDTH) fprintf(out, "\n%*s", HELP_COL, ""), col = HELP_COL, first = true;
        if (!first) fputc(' ', out), col++;
        fwrite(p, 1, len, out);
        col += (int)len;
        first = false;
        p += len;
    }
    fputc('\n', out);
}

static void print_row(const CliOpt *o, FILE *out)
{
    char left[128], text[1200], range[96];
    const char *sp = o->meta ? " " : "", *meta = o->meta ? o->meta : "";
    int n = o->short_name ? snprintf(left, sizeof left, "  -%c, --%s%s%s", o->short_name, o->name, sp, meta)
                          : snprintf(left, sizeof left, "  --%s%s%s", o->name, sp, meta);
    fputs(left, out);
    if (n + 1 > HELP_COL) fprintf(out, "\n%*s", HELP_COL, "");
    else fprintf(out, "%*s", HELP_COL - n, "");
    range_text(o, range, sizeof range);
    snprintf(text, sizeof text, "%s%s", o->help, range);
    print_wrapped(text, out);
}

void cli_help(const CliCommand *c, FILE *out)
{
    Rows r;
    rows_collect(c, &r);
    fprintf(out, "usage: hpc %s", c->name);
    for (int i = 0; i < r.n; i++)
        if (r.opt[i]->required && r.opt[i]->short_name) fprintf(out, " -%c %s", r.opt[i]->short_name, r.opt[i]->meta);
        else if (r.opt[i]->required) fprintf(out, " --%s %s", r.opt[i]->name, r.opt[i]->meta);
    fprintf(out, " [OPTIONS]%s%s\n\n%s", *c->args ? " " : "", c->args, c->about);
    for (int s = 0; s < CLI_MAX_SECTIONS && c->sections[s].opts; s++) {
        fprintf(out, "\n%s:\n", c->sections[s].title);
        for (int i = 0; c->sections[s].opts[i].name; i++) print_row(&c->sections[s].opts[i], out);
        if (s == 0) fprintf(out, "  -h, --help%*sthis text\n", HELP_COL - 12, "");
    }
    if (!c->sections[0].opts) fprintf(out, "\noptions:\n  -h, --help%*sthis text\n", HELP_COL - 12, "");
    if (c->footer) fprintf(out, "\n%s", c->footer);
}

/* program/step_program.c — the step program: sizes of B and L, launch
 * shapes, copies, and the text form in NAME.hpc; see step_program.h.
 *
 * The text form, one record per line (a name is always the rest of its
 * line, so it may hold any character but a newline):
 *   step_program VERSION
 *   name NAME | policy fp16 | fused 0|1
 *   spec KEY VALUE                      one per ModelSpec field (spec_fields)
 *   param RANK D0 D1 INIT DECAY FROZEN TIED NAME
 *   graph N N_FORWARD LOSS LOGITS N_PARAMS
 *   node OP DTYPE RANK D0..D3 N_IN I0..I2 REQUIRES_GRAD BACKWARD ATTRHEX NAME
 *   grad P VALUE                        param_grad[P], for each P
 *   code KIND N_PHASES BIAS_EPILOGUE SCRATCH   one per node, in order
 *   phase LT THREADS ABOVE_L COUNT NAME N_PHASES after each code line
 *   cuda BYTES                          then exactly BYTES of source and "\n"
 *   cubin ARCH BYTES HEX                the module compiled for sm_ARCH (optional)
 *   end
 * A size (SCRATCH, COUNT) is six integers "c0 c1 pB pL div cap".  ATTRHEX
 * is the attribute union's bytes (IrAttr, with the fused ops' IrFusedAttr
 * stored in them as compiler/fuse.h does), so doubles survive exactly.
 * Enums are written by name. */
#include "program/step_program.h"

#include "program/artifact.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- sizes and launch shapes ------------------------------------------- */

int64_t step_size_eval(const StepSize *s, int64_t B, int64_t L)
{
    int64_t v = s->c1;
    for (int i = 0; i < s->pB; i++) v *= B;
    for (int i = 0; i < s->pL; i++) v *= L;
    v += s->c0;
    if (s->div > 1) v /= s->div;
    if (s->cap > 0 && v > s->cap) v = s->cap;
    return v;
}

/* Grid-stride kernels need no more than 2^20 blocks; one-block-per-row
 * kernels need every row (grid.x may go to 2^31 - 1). */
static unsigned clamp_blocks(int64_t n, int64_t max)
{
    if (n < 1) return 1;
    return n > max ? (unsigned)max : (unsigned)n;
}

static void launch_shape(const StepPhase *ph, int64_t B, int64_t L, EopPhase *out)
{
    unsigned *gr = out->grid, *bl = out->block;
    int64_t count = step_size_eval(&ph->count, B, L);
    gr[0] = gr[1] = gr[2] = bl[0] = bl[1] = bl[2] = 1;
    switch (ph->lt) {
    case EOP_LT_ELEMS: gr[0] = clamp_blocks((count + 255) / 256, 1 << 20); bl[0] = 256; break;
    case EOP_LT_ROWS: gr[0] = clamp_blocks(count, 0x7fffffff); bl[0] = (unsigned)ph->threads; break;
    case EOP_LT_WARP_ROWS: gr[0] = clamp_blocks((count + 3) / 4, 0x7fffffff); bl[0] = 128; break;
    case EOP_LT_ONE: bl[0] = 1024; break;
    case EOP_LT_COLPART:
        gr[0] = clamp_blocks((count + 31) / 32, 0x7fffffff);
        gr[1] = EOP_COL_PARTS;
        bl[0] = 32;
        bl[1] = 8;
        break;
    case EOP_LT_COLFIN: gr[0] = clamp_blocks((count + 255) / 256, 0x7fffffff); bl[0] = 256; break;
    case EOP_LT_HEAD_TILES:
        gr[0] = clamp_blocks(count, 0x7fffffff);
        gr[1] = (unsigned)ph->threads;
        gr[2] = clamp_blocks(B, 65535);
        bl[0] = 128;
        break;
    case EOP_LT_HEAD_BLOCKS:
        gr[0] = clamp_blocks(count, 0x7fffffff);
        gr[1] = (unsigned)ph->threads;
        gr[2] = clamp_blocks(B, 65535);
        bl[0] = 256;
        break;
    case EOP_LT_COUNT: HPC_ASSERT(0);
    }
}

void step_node_launch(const StepNodeCode *c, int64_t B, int64_t L, bool sm90a, EopNodeCode *out)
{
    memset(out, 0, sizeof *out);
    out->kind = c->kind;
    out->n_phases = c->n_phases;
    out->bias_epilogue = c->bias_epilogue;
    for (int p = 0; p < c->n_phases; p++) {
        snprintf(out->phase[p].name, sizeof out->phase[p].name, "%s", c->phase[p].name);
        out->phase[p].shared_bytes = (unsigned)c->phase[p].shared_bytes;
        if (c->phase[p].above_l > 0 && L <= c->phase[p].above_l) continue;   /* not launched: grid 0 */
        if (c->phase[p].at_most_l > 0 && L > c->phase[p].at_most_l) continue;
        if (c->phase[p].target == STEP_TARGET_SM90A && !sm90a) continue;
        if (c->phase[p].target == STEP_TARGET_NOT_SM90A && sm90a) continue;
        launch_shape(&c->phase[p], B, L, &out->phase[p]);
    }
}

void step_kernels_scratch(const StepKernels *k, int64_t B, int64_t L, int64_t *out)
{
    for (int i = 0; i < k->n; i++) out[i] = step_size_eval(&k->node[i].scratch, B, L);
}

/* ---- ownership ------------------------------------------------------------- */

void step_kernels_free(StepKernels *k)
{
    free(k->node);
    free(k->cuda_source);
    for (int i = 0; i < k->n_cubins; i++) free(k->cubin[i].data);
    memset(k, 0, sizeof *k);
}

HpcStatus step_kernels_add_cubin(StepKernels *k, int arch, const void *data, size_t size, HpcError *err)
{
    if (size < 4 || memcmp(data, "\x7f" "ELF", 4) != 0)
        return hpc_fail(err, HPC_ERR_USAGE, "step program: the module for sm_%d is not a CUBIN (no ELF header)",
                        arch);
    StepCubin *c = (StepCubin *)step_kernels_cubin(k, arch);
    if (!c && k->n_cubins == STEP_MAX_CUBINS)
        return hpc_fail(err, HPC_ERR_USAGE, "step program: at most %d cubins", STEP_MAX_CUBINS);
    if (!c) c = &k->cubin[k->n_cubins++];
    free(c->data);
    c->arch = arch;
    c->data = xmalloc(size);
    memcpy(c->data, data, size);
    c->size = size;
    return HPC_OK;
}

const StepCubin *step_kernels_cubin(const StepKernels *k, int arch)
{
    for (int i = 0; i < k->n_cubins; i++)
        if (k->cubin[i].arch == arch) return &k->cubin[i];
    return NULL;
}

void step_program_init(StepProgram *p)
{
    memset(p, 0, sizeof *p);
    ir_init(&p->g);
    params_init(&p->pl);
}

void step_program_free(StepProgram *p)
{
    ir_free(&p->g);
    params_free(&p->pl);
    step_kernels_free(&p->kernels);
    memset(p, 0, sizeof *p);
}

void step_program_copy_graph(const StepProgram *p, IrGraph *g, ParamList *pl)
{
    ir_init(g);
    *g = p->g;
    g->cap = p->g.n > 0 ? p->g.n : 1;
    g->nodes = xmalloc((size_t)g->cap * sizeof *g->nodes);
    memcpy(g->nodes, p->g.nodes, (size_t)p->g.n * sizeof *g->nodes);
    g->param_grad = NULL;
    if (p->g.param_grad) {
        g->param_grad = xmalloc((size_t)(p->g.n_params > 0 ? p->g.n_params : 1) * sizeof *g->param_grad);
        memcpy(g->param_grad, p->g.param_grad, (size_t)p->g.n_params * sizeof *g->param_grad);
    }
    params_init(pl);
    *pl = p->pl;
    pl->cap = p->pl.n > 0 ? p->pl.n : 1;
    pl->p = xmalloc((size_t)pl->cap * sizeof *pl->p);
    memcpy(pl->p, p->pl.p, (size_t)p->pl.n * sizeof *pl->p);
}

/* ---- the ModelSpec fields --------------------------------------------------- */

typedef enum { F_I64, F_U64, F_F64, F_BOOL, F_ENUM, F_STR } FieldType;

typedef struct {
    const char *key;
    FieldType type;
    size_t off, size;          /* size: of a string field's buffer */
    int max_enum;              /* F_ENUM: largest value */
} SpecField;

#define FLD(key, type, member, max) {key, type, offsetof(ModelSpec, member), sizeof(((ModelSpec *)0)->member), max}
static const SpecField spec_fields[] = {
    FLD("name", F_STR, name, 0),
    FLD("source", F_STR, source, 0),
    FLD("stack.kind", F_ENUM, stack.kind, STACK_DECODER),
    FLD("stack.vocab_size", F_I64, stack.vocab_size, 0),
    FLD("stack.max_positions", F_I64, stack.max_positions, 0),
    FLD("stack.type_vocab_size", F_I64, stack.type_vocab_size, 0),
    FLD("stack.position_offset", F_I64, stack.position_offset, 0),
    FLD("stack.hidden", F_I64, stack.hidden, 0),
    FLD("stack.layers", F_I64, stack.layers, 0),
    FLD("stack.heads", F_I64, stack.heads, 0),
    FLD("stack.ffn", F_I64, stack.ffn, 0),
    FLD("stack.activation", F_ENUM, stack.activation, ACT_TANH),
    FLD("stack.hidden_dropout", F_F64, stack.hidden_dropout, 0),
    FLD("stack.attention_dropout", F_F64, stack.attention_dropout, 0),
    FLD("stack.ln_eps", F_F64, stack.ln_eps, 0),
    FLD("stack.norm", F_ENUM, stack.norm, NORM_PRE),
    FLD("stack.attention", F_ENUM, stack.attention, ATTN_CAUSAL),
    FLD("stack.embedding_ln", F_BOOL, stack.embedding_ln, 0),
    FLD("stack.final_ln", F_BOOL, stack.final_ln, 0),
    FLD("stack.precision", F_ENUM, stack.precision, PREC_BF16),
    FLD("stack.embedding_precision", F_ENUM, stack.embedding_precision, PREC_BF16),
    FLD("head.kind", F_ENUM, head.kind, HEAD_CAUSAL_LM),
    FLD("head.num_labels", F_I64, head.num_labels, 0),
    FLD("head.regression", F_BOOL, head.regression, 0),
    FLD("head.pooler", F_BOOL, head.pooler, 0),
    FLD("head.pooler_activation", F_ENUM, head.pooler_activation, ACT_TANH),
    FLD("head.classifier_dropout", F_F64, head.classifier_dropout, 0),
    FLD("head.tie_word_embeddings", F_BOOL, head.tie_word_embeddings, 0),
    FLD("head.decoder_bias", F_BOOL, head.decoder_bias, 0),
    FLD("head.precision", F_ENUM, head.precision, PREC_BF16),
    FLD("train.optimizer", F_ENUM, train.optimizer, OPT_LAMB),
    FLD("train.lr", F_F64, train.lr, 0),
    FLD("train.beta1", F_F64, train.beta1, 0),
    FLD("train.beta2", F_F64, train.beta2, 0),
    FLD("train.eps", F_F64, train.eps, 0),
    FLD("train.weight_decay", F_F64, train.weight_decay, 0),
    FLD("train.momentum", F_F64, train.momentum, 0),
    FLD("train.nesterov", F_BOOL, train.nesterov, 0),
    FLD("train.schedule", F_ENUM, train.schedule, SCHED_COSINE),
    FLD("train.warmup_steps", F_I64, train.warmup_steps, 0),
    FLD("train.warmup_ratio", F_F64, train.warmup_ratio, 0),
    FLD("train.min_lr_ratio", F_F64, train.min_lr_ratio, 0),
    FLD("train.loss_scaling", F_ENUM, train.loss_scaling, LOSS_SCALE_NONE),
    FLD("train.scale_init", F_F64, train.scale_init, 0),
    FLD("train.scale_growth", F_F64, train.scale_growth, 0),
    FLD("train.scale_backoff", F_F64, train.scale_backoff, 0),
    FLD("train.scale_interval", F_I64, train.scale_interval, 0),
    FLD("train.max_skipped_steps", F_I64, train.max_skipped_steps, 0),
    FLD("train.max_grad_norm", F_F64, train.max_grad_norm, 0),
    FLD("train.batch_size", F_I64, train.batch_size, 0),
    FLD("train.grad_accum", F_I64, train.grad_accum, 0),
    FLD("train.max_seq_len", F_I64, train.max_seq_len, 0),
    FLD("train.seed", F_U64, train.seed, 0),
    FLD("train.epochs", F_I64, train.epochs, 0),
    FLD("train.steps", F_I64, train.steps, 0),
    FLD("train.freeze_embeddings", F_BOOL, train.freeze_embeddings, 0),
    FLD("train.freeze_layers", F_I64, train.freeze_layers, 0),
    FLD("train.pack", F_BOOL, train.pack, 0),
};
#undef FLD
#define N_SPEC_FIELDS ((int)(sizeof spec_fields / sizeof spec_fields[0]))

_Static_assert(sizeof(SpecActivation) == sizeof(int) && sizeof(SpecPrecision) == sizeof(int),
               "enum fields are read and written as int");

static void write_field(const SpecField *f, const ModelSpec *s, FILE *out)
{
    const char *at = (const char *)s + f->off;
    fprintf(out, "spec %s ", f->key);
    switch (f->type) {
    case F_I64: fprintf(out, "%" PRId64 "\n", *(const int64_t *)at); break;
    case F_U64: fprintf(out, "%" PRIu64 "\n", *(const uint64_t *)at); break;
    case F_F64: fprintf(out, "%a\n", *(const double *)at); break;   /* hex float: exact */
    case F_BOOL: fprintf(out, "%d\n", *(const bool *)at ? 1 : 0); break;
    case F_ENUM: fprintf(out, "%d\n", *(const int *)at); break;
    case F_STR: fprintf(out, "%s\n", at); break;
    }
}

/* ---- writing ------------------------------------------------------------------ */

static void write_size(const StepSize *s, FILE *out)
{
    fprintf(out, "%" PRId64 " %" PRId64 " %d %d %" PRId64 " %" PRId64, s->c0, s->c1, s->pB, s->pL,
            s->div, s->cap);
}

/* The node's attribute with every byte that no field of its op's member
 * covers set to zero: struct padding and the union's bytes past a small
 * member hold whatever the creating code's stack held, which made two
 * compiles of one model differ (tests/test_artifact_repro.c).  Stored
 * field by field into a zeroed union, so no padding is copied; ops not
 * listed keep their bytes as they are (the fused ops' attribute is
 * zeroed by fuse_attr_set; ops without an attribute by ir_append). */
static void attr_canonical(const IrNode *n, IrAttr *c)
{
    const IrAttr *a = &n->attr;
    memset(c, 0, sizeof *c);
    switch (n->op) {
    case IR_OP_INPUT: c->input = (IrInputAttr){a->input.kind, a->input.span_max}; break;
    case IR_OP_PARAM: c->param.index = a->param.index; break;
    case IR_OP_POSITIONS: c->pos.offset = a->pos.offset; break;
    case IR_OP_MATMUL:
        c->matmul.trans_a = a->matmul.trans_a;
        c->matmul.trans_b = a->matmul.trans_b;
        c->matmul.alpha = a->matmul.alpha;
        break;
    case IR_OP_LAYERNORM: case IR_OP_LAYERNORM_DX: case IR_OP_LAYERNORM_DGAMMA: case IR_OP_LAYERNORM_FWD:
        c->norm.eps = a->norm.eps;
        break;
    case IR_OP_ACT: case IR_OP_ACT_BWD: c->act.kind = a->act.kind; break;
    case IR_OP_SOFTMAX: c->softmax.causal = a->softmax.causal; break;
    case IR_OP_DROPOUT:
        c->dropout.p = a->dropout.p;
        c->dropout.salt = a->dropout.salt;
        break;
    case IR_OP_SPLIT_HEADS: c->heads.heads = a->heads.heads; break;
    case IR_OP_CAST: c->cast.to = a->cast.to; break;
    case IR_OP_EMBEDDING_BWD: c->embed_bwd.rows = a->embed_bwd.rows; break;
    case IR_OP_OUTPUT: c->output.index = a->output.index; break;
    case IR_OP_ATTENTION: case IR_OP_ATTENTION_BWD:
        c->attn.p = a->attn.p;
        c->attn.salt = a->attn.salt;
        c->attn.heads = a->attn.heads;
        c->attn.causal = a->attn.causal;
        c->attn.packed = a->attn.packed;
        c->attn.varlen = a->attn.varlen;
        c->attn.first_query = a->attn.first_query;
        break;
    case IR_OP_SPAN_POSITIONS: c->pos.offset = a->pos.offset; break;
    case IR_OP_SPAN_TOKEN: case IR_OP_SPAN_TOKEN_BWD: c->span.last = a->span.last; break;
    default: memcpy(c, a, sizeof *c); break;
    }
}

static void write_node(const IrNode *n, FILE *out)
{
    fprintf(out, "node %s %s %d", ir_op_name(n->op), ir_dtype_name(n->dtype), n->rank);
    for (int d = 0; d < IR_MAX_RANK; d++) fprintf(out, " %" PRId64, d < n->rank ? n->dims[d] : 0);
    fprintf(out, " %d", n->n_in);
    /* The inputs, padded with -1 to STEP_NODE_MIN_INPUTS (version 1's fixed layout). */
    for (int k = 0; k < n->n_in || k < STEP_NODE_MIN_INPUTS; k++) fprintf(out, " %d", k < n->n_in ? n->in[k] : -1);
    fprintf(out, " %d %d ", n->requires_grad ? 1 : 0, n->backward ? 1 : 0);
    IrAttr attr;
    attr_canonical(n, &attr);
    const unsigned char *a = (const unsigned char *)&attr;
    for (size_t i = 0; i < sizeof attr; i++) fprintf(out, "%02x", a[i]);
    fprintf(out, " %s\n", n->name);
}

static void write_code(const StepNodeCode *c, FILE *out)
{
    fprintf(out, "code %d %d %d %u ", (int)c->kind, c->n_phases, c->bias_epilogue ? 1 : 0, (unsigned)c->salt);
    write_size(&c->scratch, out);
    fputc('\n', out);
    for (int p = 0; p < c->n_phases; p++) {
        fprintf(out, "phase %d %d %" PRId64 " %" PRId64 " %d %d ", (int)c->phase[p].lt, c->phase[p].threads,
                c->phase[p].above_l, c->phase[p].at_most_l, (int)c->phase[p].shared_bytes, (int)c->phase[p].target);
        write_size(&c->phase[p].count, out);
        fprintf(out, " %s\n", c->phase[p].name);
    }
}

void step_program_write(const StepProgram *p, FILE *out)
{
    fprintf(out, "step_program %d\nname %s\npolicy %s\nfused %d\n", STEP_PROGRAM_VERSION, p->name,
            spec_precision_name(p->policy), p->fused ? 1 : 0);
    for (int i = 0; i < N_SPEC_FIELDS; i++) write_field(&spec_fields[i], &p->spec, out);
    for (int q = 0; q < p->pl.n; q++) {
        const ParamInfo *pi = &p->pl.p[q];
        fprintf(out, "param %d %" PRId64 " %" PRId64 " %d %d %d %d %s\n", pi->rank, pi->dims[0],
                pi->rank > 1 ? pi->dims[1] : 0, (int)pi->init, pi->decay ? 1 : 0, pi->frozen ? 1 : 0,
                pi->tied_to, pi->name);
    }
    const IrGraph *g = &p->g;
    fprintf(out, "graph %d %d %d %d %d\n", g->n, g->n_forward, g->loss, g->logits, g->n_params);
    for (int i = 0; i < g->n; i++) write_node(&g->nodes[i], out);
    for (int q = 0; q < g->n_params && g->param_grad; q++) fprintf(out, "grad %d %d\n", q, g->param_grad[q]);
    for (int i = 0; i < p->kernels.n; i++) write_code(&p->kernels.node[i], out);
    if (p->kernels.cuda_source) {
        size_t len = strlen(p->kernels.cuda_source);
        fprintf(out, "cuda %zu\n", len);
        fwrite(p->kernels.cuda_source, 1, len, out);
        fputc('\n', out);
    }
    for (int i = 0; i < p->kernels.n_cubins; i++) {
        const StepCubin *c = &p->kernels.cubin[i];
        fprintf(out, "cubin %d %zu ", c->arch, c->size);
        for (size_t j = 0; j < c->size; j++) fprintf(out, "%02x", c->data[j]);
        fputc('\n', out);
    }
    fprintf(out, "end\n");
}

/* ---- reading --------------------------------------------------------------------- */

typedef struct {
    const char *where, *s;
    size_t len, pos;
    int line;
    char buf[4096];        /* the current line */
    HpcError *err;
} Reader;

static HpcStatus bad(Reader *r, const char *fmt, const char *detail)
{
    char why[600];
    snprintf(why, sizeof why, fmt, detail ? detail : "");
    return hpc_fail(r->err, HPC_ERR_INPUT, "%s: step program line %d: %s; recompile it with `hpc compile "
                    "MODEL`", r->where, r->line, why);
}

/* The next line into r->buf (without its newline); false at the end. */
static bool next_line(Reader *r)
{
    if (r->pos >= r->len) return false;
    const char *start = r->s + r->pos, *nl = memchr(start, '\n', r->len - r->pos);
    size_t n = nl ? (size_t)(nl - start) : r->len - r->pos;
    r->pos += n + (nl ? 1 : 0);
    r->line++;
    if (n >= sizeof r->buf) n = sizeof r->buf - 1;   /* too long for any field: fails to parse */
    memcpy(r->buf, start, n);
    r->buf[n] = '\0';
    return true;
}

/* The text after `n` space-separated words of r->buf, or NULL. */
static const char *rest_after(const char *line, int n)
{
    const char *p = line;
    for (int i = 0; i < n; i++) {
        p = strchr(p, ' ');
        if (!p) return NULL;
        p++;
    }
    return p;
}

static bool copy_name(char *dst, size_t size, const char *src)
{
    if (!src || strlen(src) >= size) return false;
    memcpy(dst, src, strlen(src) + 1);
    return true;
}

static HpcStatus read_field(Reader *r, ModelSpec *s, bool *seen)
{
    char key[64];
    int used = 0;
    if (sscanf(r->buf, "spec %63s %n", key, &used) < 1 || used == 0) return bad(r, "a spec line without a key%s", "");
    const char *val = r->buf + used;
    for (int i = 0; i < N_SPEC_FIELDS; i++) {
        const SpecField *f = &spec_fields[i];
        if (strcmp(f->key, key) != 0) continue;
        char *at = (char *)s + f->off, *end = NULL;
        errno = 0;
        switch (f->type) {
        case F_I64: *(int64_t *)at = strtoll(val, &end, 10); break;
        case F_U64: *(uint64_t *)at = strtoull(val, &end, 10); break;
        case F_F64: *(double *)at = strtod(val, &end); break;
        case F_BOOL: {
            long v = strtol(val, &end, 10);
            if (v != 0 && v != 1) return bad(r, "spec %s must be 0 or 1", key);
            *(bool *)at = v == 1;
            break;
        }
        case F_ENUM: {
            long v = strtol(val, &end, 10);
            if (v < 0 || v > f->max_enum) return bad(r, "spec %s is not a value this hpc knows", key);
            *(int *)at = (int)v;
            break;
        }
        case F_STR:
            if (!copy_name(at, f->size, val)) return bad(r, "spec %s is too long", key);
            end = (char *)val + strlen(val);
            break;
        }
        if (errno || end == val || *end != '\0') return bad(r, "spec %s has a bad value", key);
        seen[i] = true;
        return HPC_OK;
    }
    return bad(r, "unknown spec field '%s'", key);
}

static HpcStatus read_param(Reader *r, ParamList *pl)
{
    ParamInfo pi = {0};
    int init = 0, decay = 0, frozen = 0;
    int64_t d1 = 0;
    if (sscanf(r->buf, "param %d %" SCNd64 " %" SCNd64 " %d %d %d %d", &pi.rank, &pi.dims[0], &d1, &init,
               &decay, &frozen, &pi.tied_to) != 7)
        return bad(r, "a param line needs rank, two dims, init, decay, frozen, tied_to and a name%s", "");
    if (pi.rank < 1 || pi.rank > 2 || pi.dims[0] < 1 || (pi.rank == 2 && d1 < 1) || init < 0 ||
        init > PARAM_INIT_ONES || pi.tied_to < -1 || pi.tied_to >= pl->n)
        return bad(r, "a param line out of range%s", "");
    if (!copy_name(pi.name, sizeof pi.name, rest_after(r->buf, 8)) || !pi.name[0])
        return bad(r, "a param name is missing or too long%s", "");
    pi.dims[1] = pi.rank == 2 ? d1 : 0;
    pi.init = (ParamInit)init;
    pi.decay = decay != 0;
    pi.frozen = frozen != 0;
    if (pi.tied_to >= 0) {
        params_add_tied(pl, pi.name, pi.tied_to);
        pl->p[pl->n - 1] = pi;
    } else {
        params_add(pl, pi.name, pi.rank, pi.dims, pi.init, pi.decay, pi.frozen);
    }
    return HPC_OK;
}

static bool parse_op(const char *s, IrOpKind *op)
{
    for (int k = 0; k < IR_OP_COUNT; k++)
        if (strcmp(s, ir_op_name((IrOpKind)k)) == 0) {
            *op = (IrOpKind)k;
            return true;
        }
    return false;
}

static bool parse_dtype(const char *s, DType *dt)
{
    for (DType d = DT_F32; d <= DT_I32; d++)
        if (strcmp(s, ir_dtype_name(d)) == 0) {
            *dt = d;
            return true;
        }
    return false;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static HpcStatus read_node(Reader *r, IrGraph *g, int npar)
{
    if (g->n >= g->cap) return bad(r, "more nodes than the graph line says%s", "");
    IrNode *n = &g->nodes[g->n];
    memset(n, 0, sizeof *n);
    char op[40], dt[16], hex[2 * sizeof(IrAttr) + 2];
    int rg = 0, bw = 0, used = 0;
    const char *need = "a node line needs op, dtype, rank, 4 dims, n_in, the inputs (at least 3), 2 flags, attr";
    if (sscanf(r->buf, "node %39s %15s %d %" SCNd64 " %" SCNd64 " %" SCNd64 " %" SCNd64 " %d%n", op, dt,
               &n->rank, &n->dims[0], &n->dims[1], &n->dims[2], &n->dims[3], &n->n_in, &used) != 8)
        return bad(r, "%s", need);
    if (n->n_in < 0 || n->n_in > IR_MAX_INPUTS) return bad(r, "n_in out of range%s", "");
    int n_ids = n->n_in > STEP_NODE_MIN_INPUTS ? n->n_in : STEP_NODE_MIN_INPUTS;
    const char *p = r->buf + used;
    for (int k = 0; k < n_ids; k++) {
        int v = 0, u = 0;
        if (sscanf(p, " %d%n", &v, &u) != 1) return bad(r, "%s", need);
        if (k < IR_MAX_INPUTS) n->in[k] = v;
        p += u;
    }
    if (sscanf(p, " %d %d %49s", &rg, &bw, hex) != 3) return bad(r, "%s", need);
    if (!parse_op(op, &n->op)) return bad(r, "unknown op '%s'", op);
    if (!parse_dtype(dt, &n->dtype)) return bad(r, "unknown dtype '%s'", dt);
    const IrOpInfo *info = ir_op_info(n->op);
    if (n->rank < 0 || n->rank > IR_MAX_RANK) return bad(r, "rank out of range%s", "");
    for (int d = 0; d < n->rank; d++)
        if (n->dims[d] < 1 && n->dims[d] != IR_DIM_B && n->dims[d] != IR_DIM_L)
            return bad(r, "a dim is neither >= 1 nor B or L%s", "");
    if (n->n_in < info->min_inputs || n->n_in > info->max_inputs)
        return bad(r, "op %s with the wrong number of inputs", op);
    for (int k = 0; k < IR_MAX_INPUTS; k++) {
        if (k < n->n_in && (n->in[k] < 0 || n->in[k] >= g->n)) return bad(r, "an input is not an earlier node%s", "");
        if (k >= n->n_in) n->in[k] = -1;
    }
    if (strlen(hex) != 2 * sizeof(IrAttr)) return bad(r, "the attribute is not %s hex digits", "2 x sizeof(IrAttr)");
    unsigned char *a = (unsigned char *)&n->attr;
    for (size_t i = 0; i < sizeof(IrAttr); i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return bad(r, "the attribute is not hex%s", "");
        a[i] = (unsigned char)(hi << 4 | lo);
    }
    if (n->op == IR_OP_PARAM && (n->attr.param.index < 0 || n->attr.param.index >= npar))
        return bad(r, "a param node names no parameter%s", "");
    if (n->op == IR_OP_OUTPUT && (n->attr.output.index < 1 ||
                                  n->attr.output.index >= ir_op_info(g->nodes[n->in[0]].op)->n_outputs))
        return bad(r, "an output node names no output of its op%s", "");
    if (n->op == IR_OP_INPUT && ((int)n->attr.input.kind < 0 || n->attr.input.kind >= IR_IN_COUNT))
        return bad(r, "an input node names no batch field%s", "");
    if (!copy_name(n->name, sizeof n->name, rest_after(r->buf, 12 + n_ids)))
        return bad(r, "a node name is missing or too long%s", "");
    n->requires_grad = rg != 0;
    n->backward = bw != 0;
    g->n++;
    return HPC_OK;
}

static bool read_size(const char **p, StepSize *s)
{
    int used = 0;
    if (sscanf(*p, "%" SCNd64 " %" SCNd64 " %d %d %" SCNd64 " %" SCNd64 "%n", &s->c0, &s->c1, &s->pB, &s->pL,
               &s->div, &s->cap, &used) != 6)
        return false;
    *p += used;
    return s->pB >= 0 && s->pB <= IR_MAX_RANK && s->pL >= 0 && s->pL <= IR_MAX_RANK && s->div >= 0 && s->cap >= 0;
}

static HpcStatus read_code(Reader *r, StepKernels *k, int n_nodes)
{
    if (k->n >= n_nodes) return bad(r, "more code lines than nodes%s", "");
    StepNodeCode *c = &k->node[k->n];
    memset(c, 0, sizeof *c);
    int kind = 0, bias = 0, used = 0;
    unsigned salt = 0;
    if (sscanf(r->buf, "code %d %d %d %u %n", &kind, &c->n_phases, &bias, &salt, &used) < 4 || used == 0)
        return bad(r, "a code line needs kind, phases, bias_epilogue, salt and a scratch size%s", "");
    c->salt = salt;
    const char *p = r->buf + used;
    if (kind < EOP_NONE || kind > EOP_KERNELS || c->n_phases < 0 || c->n_phases > EOP_MAX_PHASES ||
        !read_size(&p, &c->scratch) || *p)
        return bad(r, "a code line out of range%s", "");
    c->kind = (EopKind)kind;
    c->bias_epilogue = bias != 0;
    for (int ph = 0; ph < c->n_phases; ph++) {
        if (!next_line(r)) return bad(r, "truncated: a code record ends early%s", "");
        StepPhase *s = &c->phase[ph];
        int lt = 0, shared = 0, target = 0;
        used = 0;
        if (sscanf(r->buf, "phase %d %d %" SCNd64 " %" SCNd64 " %d %d %n", &lt, &s->threads, &s->above_l,
                   &s->at_most_l, &shared, &target, &used) < 6 ||
            used == 0)
            return bad(r, "expected a phase line%s", "");
        p = r->buf + used;
        s->shared_bytes = shared;
        s->target = (StepTarget)target;
        if (lt < 0 || lt >= EOP_LT_COUNT || s->threads < 1 || s->threads > 1024 || s->above_l < 0 ||
            s->at_most_l < 0 || shared < 0 || shared > STEP_PHASE_MAX_SHARED || target < STEP_TARGET_ANY ||
            target > STEP_TARGET_NOT_SM90A ||
            !read_size(&p, &s->count) ||
            *p != ' ' || !copy_name(s->name, sizeof s->name, p + 1) || !s->name[0])
            return bad(r, "a phase line out of range%s", "");
        s->lt = (EopLaunchType)lt;
    }
    k->n++;
    return HPC_OK;
}

static HpcStatus read_cuda(Reader *r, StepKernels *k)
{
    size_t bytes = 0;
    char extra;
    if (sscanf(r->buf, "cuda %zu%c", &bytes, &extra) != 1) return bad(r, "a cuda line needs a byte count%s", "");
    if (k->cuda_source) return bad(r, "a second cuda section%s", "");
    if (bytes > r->len - r->pos) return bad(r, "truncated: the cuda source ends early%s", "");
    k->cuda_source = xmalloc(bytes + 1);
    memcpy(k->cuda_source, r->s + r->pos, bytes);
    k->cuda_source[bytes] = '\0';
    if (strlen(k->cuda_source) != bytes) return bad(r, "the cuda source holds a NUL byte%s", "");
    r->pos += bytes;
    if (r->pos >= r->len || r->s[r->pos] != '\n') return bad(r, "truncated: no newline after the cuda source%s", "");
    r->pos++;
    return HPC_OK;
}

/* "cubin ARCH BYTES HEX": read from the text itself (a line may be
 * megabytes, longer than r->buf). */
static HpcStatus read_cubin(Reader *r, StepKernels *k)
{
    int arch = 0, used = 0;
    size_t bytes = 0;
    if (sscanf(r->buf, "cubin %d %zu %n", &arch, &bytes, &used) < 2 || used == 0 || arch < 50 || arch > 1000)
        return bad(r, "a cubin line needs an arch and a byte count%s", "");
    /* r->pos is past the line; find its start again in the text. */
    const char *line_end = r->s + r->pos - 1, *hex = line_end;
    while (hex > r->s && hex[-1] != '\n') hex--;
    hex += used;
    if (r->s[r->pos - 1] != '\n' || (size_t)(line_end - hex) != 2 * bytes)
        return bad(r, "truncated: a cubin's hex ends early%s", "");
    unsigned char *data = xmalloc(bytes ? bytes : 1);
    for (size_t i = 0; i < bytes; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            free(data);
            return bad(r, "a cubin is not hex%s", "");
        }
        data[i] = (unsigned char)(hi << 4 | lo);
    }
    HpcError e = {0};
    HpcStatus st = step_kernels_add_cubin(k, arch, data, bytes, &e);
    free(data);
    char what[32];
    snprintf(what, sizeof what, "sm_%d", arch);
    return st ? bad(r, "the cubin for %s is not an ELF image (or one too many)", what) : HPC_OK;
}

static HpcStatus read_graph_line(Reader *r, StepProgram *p)
{
    IrGraph *g = &p->g;
    int n = 0;
    if (g->nodes) return bad(r, "a second graph line%s", "");
    if (sscanf(r->buf, "graph %d %d %d %d %d", &n, &g->n_forward, &g->loss, &g->logits, &g->n_params) != 5)
        return bad(r, "a graph line needs n, n_forward, loss, logits, n_params%s", "");
    if (n < 1 || n > (1 << 24) || g->n_forward < 0 || g->n_forward > n || g->loss < -1 || g->loss >= n ||
        g->logits < -1 || g->logits >= n || g->n_params < 0 || g->n_params > p->pl.n)
        return bad(r, "a graph line out of range%s", "");
    g->cap = n;
    g->nodes = xcalloc((size_t)n, sizeof *g->nodes);
    if (g->n_params > 0) {
        g->param_grad = xmalloc((size_t)g->n_params * sizeof *g->param_grad);
        for (int q = 0; q < g->n_params; q++) g->param_grad[q] = -1;
    }
    p->kernels.node = xcalloc((size_t)n, sizeof *p->kernels.node);
    return HPC_OK;
}

static HpcStatus read_grad(Reader *r, IrGraph *g)
{
    int q = 0, v = 0;
    if (sscanf(r->buf, "grad %d %d", &q, &v) != 2 || q < 0 || q >= g->n_params || v < -1 || v >= g->cap)
        return bad(r, "a grad line out of range%s", "");
    g->param_grad[q] = v;
    return HPC_OK;
}

static HpcStatus read_header(Reader *r)
{
    int version = 0;
    char extra;
    if (!next_line(r) || sscanf(r->buf, "step_program %d%c", &version, &extra) != 1)
        return bad(r, "not a step program (no 'step_program VERSION' line)%s", "");
    if (version != STEP_PROGRAM_VERSION) {
        char v[64];
        snprintf(v, sizeof v, "%d, this hpc reads version %d", version, STEP_PROGRAM_VERSION);
        return bad(r, "format version %s", v);
    }
    return HPC_OK;
}

static HpcStatus read_policy(Reader *r, StepProgram *p)
{
    const char *name = r->buf + 7;
    for (SpecPrecision q = PREC_FP32; q <= PREC_BF16; q++)
        if (strcmp(name, spec_precision_name(q)) == 0) {
            p->policy = q;
            return HPC_OK;
        }
    return bad(r, "unknown policy '%s' (fp32, fp16 or bf16)", name);
}

/* One record line (after the header). */
static HpcStatus read_record(Reader *r, StepProgram *p, bool *spec_seen, bool *done)
{
    const char *b = r->buf;
    if (strncmp(b, "spec ", 5) == 0) return read_field(r, &p->spec, spec_seen);
    if (strncmp(b, "param ", 6) == 0) {
        if (p->g.nodes) return bad(r, "a param line after the graph%s", "");
        return read_param(r, &p->pl);
    }
    if (strncmp(b, "node ", 5) == 0) {
        if (!p->g.nodes) return bad(r, "a node line before the graph line%s", "");
        return read_node(r, &p->g, p->pl.n);
    }
    if (strncmp(b, "graph ", 6) == 0) return read_graph_line(r, p);
    if (strncmp(b, "grad ", 5) == 0) {
        if (!p->g.nodes) return bad(r, "a grad line before the graph line%s", "");
        return read_grad(r, &p->g);
    }
    if (strncmp(b, "code ", 5) == 0) {
        if (!p->g.nodes) return bad(r, "a code line before the graph line%s", "");
        return read_code(r, &p->kernels, p->g.cap);
    }
    if (strncmp(b, "cuda ", 5) == 0) return read_cuda(r, &p->kernels);
    if (strncmp(b, "cubin ", 6) == 0) return read_cubin(r, &p->kernels);
    if (strncmp(b, "name ", 5) == 0)
        return copy_name(p->name, sizeof p->name, b + 5) ? HPC_OK : bad(r, "the name is too long%s", "");
    if (strncmp(b, "policy ", 7) == 0) return read_policy(r, p);
    if (strncmp(b, "fused ", 6) == 0) {
        p->fused = strcmp(b + 6, "1") == 0;
        return p->fused || strcmp(b + 6, "0") == 0 ? HPC_OK : bad(r, "fused must be 0 or 1%s", "");
    }
    if (strcmp(b, "end") == 0) {
        *done = true;
        return HPC_OK;
    }
    char word[32];
    snprintf(word, sizeof word, "%.31s", b);
    char *sp = strchr(word, ' ');
    if (sp) *sp = '\0';
    return bad(r, "unknown field '%s'", word);
}

/* After "end": everything the runtime relies on is there. */
static HpcStatus check_complete(Reader *r, const StepProgram *p, const bool *spec_seen)
{
    for (int i = 0; i < N_SPEC_FIELDS; i++)
        if (!spec_seen[i]) return bad(r, "spec field %s is missing", spec_fields[i].key);
    if (!p->g.nodes) return bad(r, "no graph%s", "");
    if (p->g.n != p->g.cap) return bad(r, "truncated: fewer nodes than the graph line says%s", "");
    if (p->kernels.n != 0 && p->kernels.n != p->g.n) return bad(r, "a code record per node is missing%s", "");
    if (p->kernels.n && !p->kernels.cuda_source) return bad(r, "code records without the cuda source%s", "");
    if (p->policy == PREC_DEFAULT) return bad(r, "no policy line%s", "");
    if (r->pos != r->len) return bad(r, "bytes after 'end'%s", "");
    return HPC_OK;
}

HpcStatus step_program_read(const char *where, const char *text, size_t len, StepProgram *p, HpcError *err)
{
    step_program_init(p);
    Reader r = {.where = where, .s = text, .len = len, .err = err};
    bool spec_seen[N_SPEC_FIELDS] = {0}, done = false;
    HpcStatus st = read_header(&r);
    while (!st && !done) {
        if (!next_line(&r)) {
            st = bad(&r, "truncated: no 'end' line%s", "");
            break;
        }
        st = read_record(&r, p, spec_seen, &done);
    }
    if (!st) st = check_complete(&r, p, spec_seen);
    if (st) step_program_free(p);
    return st;
}

HpcStatus step_program_read_file(const char *path, StepProgram *p, HpcError *err)
{
    step_program_init(p);
    Artifact a;
    HpcStatus st = artifact_read(path, &a, err);
    if (st) return st;
    if (!a.program_text)
        st = hpc_fail(err, HPC_ERR_INPUT, "%s: no step program in this artifact (written by an older hpc); "
                      "recompile it with `hpc compile MODEL`", path);
    else
        st = step_program_read(path, a.program_text, strlen(a.program_text), p, err);
    if (!st && p->policy != a.policy)
        st = hpc_fail(err, HPC_ERR_INPUT, "%s: the header says policy %s but the program %s; recompile it "
                      "with `hpc compile MODEL`", path, spec_precision_name(a.policy),
                      spec_precision_name(p->policy));
    if (st) step_program_free(p);
    artifact_free(&a);
    return st;
}

/* compiler/lower.c — ModelSpec -> forward graph; see lower.h.
 *
 * One function per block (embeddings, attention, FFN, layer, head); each
 * takes the value id of its input and returns the id of its output. */
#include "lower.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/ir_build.h"

typedef struct {
    const ModelSpec *spec;
    IrGraph *g;
    ParamList *pl;
    const char *prefix;  /* "bert" (encoder) or "transformer" (decoder) */
    bool frozen;         /* parameters created now are frozen */
    int mask;            /* attention_mask input (-1 in a packed graph) */
    int spans;           /* seq_spans input of a packed graph (docs/packing.md), else -1 */
    int ids;             /* input_ids input */
    bool fused_attention; /* ATTENTION nodes instead of the unfused chain */
    bool first_only;     /* the layer being lowered computes token 0 of each row only */
} Lower;

IrActKind lower_act(SpecActivation a)
{
    /* Both enums are the rows of program/activations.h, in order. */
    _Static_assert((int)ACT_COUNT == (int)IR_ACT_COUNT, "activation enums differ");
    HPC_ASSERT(a >= 0 && a < ACT_COUNT);
    return (IrActKind)a;
}

/* A parameter named `name` and its PARAM node. */
static int lw_param(Lower *lw, const char *name, int64_t d0, int64_t d1, ParamInit init, bool decay)
{
    int64_t dims[2] = {d0, d1};
    int rank = d1 > 0 ? 2 : 1;
    int idx = params_add(lw->pl, name, rank, dims, init, decay, lw->frozen);
    return ir_param(lw->g, idx, DT_F32, rank, dims, name);
}

/* y = x W^T + b with W (out, in) named NAME.weight and b NAME.bias. */
static int lw_linear(Lower *lw, int x, const char *name, int64_t in, int64_t out, const char *vname)
{
    char pw[PARAM_NAME_MAX], pb[PARAM_NAME_MAX];
    snprintf(pw, sizeof pw, "%s.weight", name);
    snprintf(pb, sizeof pb, "%s.bias", name);
    int w = lw_param(lw, pw, out, in, PARAM_INIT_NORMAL, true);
    int b = lw_param(lw, pb, out, 0, PARAM_INIT_ZEROS, false);
    return ir_add(lw->g, IR_OP_LINEAR, (int[]){x, w, b}, 3, NULL, vname);
}

static int lw_layernorm(Lower *lw, int x, const char *name, const char *vname)
{
    char pw[PARAM_NAME_MAX], pb[PARAM_NAME_MAX];
    int64_t h = lw->spec->stack.hidden;
    snprintf(pw, sizeof pw, "%s.weight", name);
    snprintf(pb, sizeof pb, "%s.bias", name);
    int gam = lw_param(lw, pw, h, 0, PARAM_INIT_ONES, false);
    int bet = lw_param(lw, pb, h, 0, PARAM_INIT_ZEROS, false);
    IrAttr a = {.norm = {lw->spec->stack.ln_eps}};
    return ir_add(lw->g, IR_OP_LAYERNORM, (int[]){x, gam, bet}, 3, &a, vname);
}

static int lw_dropout(Lower *lw, int x, double p, const char *vname)
{
    if (p <= 0) return x;
    IrAttr a = {.dropout = {p, -1}}; /* salt -1: the op's own id */
    return ir_add(lw->g, IR_OP_DROPOUT, &x, 1, &a, vname);
}

static int lw_act(Lower *lw, int x, SpecActivation act, const char *vname)
{
    IrAttr a = {.act = {lower_act(act)}};
    return ir_add(lw->g, IR_OP_ACT, &x, 1, &a, vname);
}

static int lw_add(Lower *lw, int a, int b, const char *vname)
{
    return ir_add(lw->g, IR_OP_ADD, (int[]){a, b}, 2, NULL, vname);
}

/* word + position (+ token type) embeddings, LayerNorm (BERT), dropout. */
static int lower_embeddings(Lower *lw, int *word_table)
{
    const SpecStack *s = &lw->spec->stack;
    IrGraph *g = lw->g;
    char n[PARAM_NAME_MAX];
    lw->frozen = lw->spec->train.freeze_embeddings;
    snprintf(n, sizeof n, "%s.embeddings.word_embeddings.weight", lw->prefix);
    *word_table = lw_param(lw, n, s->vocab_size, s->hidden, PARAM_INIT_NORMAL, true);
    int x = ir_add(g, IR_OP_EMBEDDING, (int[]){*word_table, lw->ids}, 2, NULL, "emb.word");
    snprintf(n, sizeof n, "%s.embeddings.position_embeddings.weight", lw->prefix);
    int pt = lw_param(lw, n, s->max_positions, s->hidden, PARAM_INIT_NORMAL, true);
    IrAttr pa = {.pos = {s->position_offset}};
    /* packed: the ids restart at 0 in every sequence's span */
    int pos = lw->spans >= 0 ? ir_add(g, IR_OP_SPAN_POSITIONS, &lw->spans, 1, &pa, "position_ids")
                             : ir_add(g, IR_OP_POSITIONS, NULL, 0, &pa, "position_ids");
    int pe = ir_add(g, IR_OP_EMBEDDING, (int[]){pt, pos}, 2, NULL, "emb.position");
    x = lw_add(lw, x, pe, "emb.sum");
    if (s->type_vocab_size > 0) {
        snprintf(n, sizeof n, "%s.embeddings.token_type_embeddings.weight", lw->prefix);
        int tt = lw_param(lw, n, s->type_vocab_size, s->hidden, PARAM_INIT_NORMAL, true);
        int types = ir_input(g, IR_IN_TOKEN_TYPES);
        int te = ir_add(g, IR_OP_EMBEDDING, (int[]){tt, types}, 2, NULL, "emb.token_type");
        x = lw_add(lw, x, te, "emb.sum");
    }
    if (s->embedding_ln) {
        snprintf(n, sizeof n, "%s.embeddings.LayerNorm", lw->prefix);
        x = lw_layernorm(lw, x, n, "emb.ln");
    }
    lw->frozen = false;
    return lw_dropout(lw, x, s->hidden_dropout, "emb.dropout");
}

/* The context of the fused path: q, k, v (B, L, H) straight from their
 * projections into one ATTENTION node (softmax, dropout and both products;
 * no (B, heads, L, L) value, no head split/merge), ctx in (B, L, H). */
static int lower_attention_fused(Lower *lw, int x, const char *pre, const char *v)
{
    const SpecStack *s = &lw->spec->stack;
    char n[PARAM_NAME_MAX], vn[IR_NAME_MAX];
    static const char *which[3] = {"query", "key", "value"};
    int proj[3];
    for (int i = 0; i < 3; i++) {
        snprintf(n, sizeof n, "%s.attention.self.%s", pre, which[i]);
        snprintf(vn, sizeof vn, "%s.attn.%c", v, which[i][0]);
        proj[i] = lw_linear(lw, x, n, s->hidden, s->hidden, vn);
    }
    bool varlen = lw->spans >= 0;   /* packed: attend within each span, input 3 the spans */
    IrAttr a = {.attn = {(float)s->attention_dropout, -1, (int32_t)s->heads, s->attention == ATTN_CAUSAL, 0, varlen,
                         lw->first_only}};
    snprintf(vn, sizeof vn, "%s.attn.context", v);
    int keys = varlen ? lw->spans : lw->mask;
    int id = ir_add(lw->g, IR_OP_ATTENTION, (int[]){proj[0], proj[1], proj[2], keys}, 4, &a, vn);
    /* the lse output; the keep bits (output 2) only where the fuse pass
     * saves them for the backward (compiler/fuse_attn_keep.c) */
    IrAttr o = {.output = {1}};
    char lse[IR_NAME_MAX];
    snprintf(lse, sizeof lse, "%.*s.%s", IR_NAME_MAX - 16, lw->g->nodes[id].name, ir_output_name(IR_OP_ATTENTION, 1));
    ir_add(lw->g, IR_OP_OUTPUT, &id, 1, &o, lse);
    return id;
}

/* The context of the unfused path: each projection's heads split right
 * after it (this node order fixes the dropout salts, which are node ids),
 * scores, softmax, dropout, the probabilities times V, heads merged back. */
static int lower_attention_unfused(Lower *lw, int x, const char *pre, const char *v)
{
    const SpecStack *s = &lw->spec->stack;
    IrGraph *g = lw->g;
    char n[PARAM_NAME_MAX], vn[IR_NAME_MAX];
    int64_t h = s->hidden, dh = s->hidden / s->heads;
    IrAttr heads = {.heads = {s->heads}};
    static const char *which[3] = {"query", "key", "value"};
    int qkv[3];
    for (int i = 0; i < 3; i++) {
        snprintf(n, sizeof n, "%s.attention.self.%s", pre, which[i]);
        snprintf(vn, sizeof vn, "%s.attn.%c", v, which[i][0]);
        int t = lw_linear(lw, x, n, h, h, vn);
        snprintf(vn, sizeof vn, "%s.attn.%c_heads", v, which[i][0]);
        qkv[i] = ir_add(g, IR_OP_SPLIT_HEADS, &t, 1, &heads, vn);
    }
    IrAttr mm = {.matmul = {false, true, 1.0 / sqrt((double)dh)}};
    snprintf(vn, sizeof vn, "%s.attn.scores", v);
    int sc = ir_add(g, IR_OP_MATMUL, (int[]){qkv[0], qkv[1]}, 2, &mm, vn);
    IrAttr sm = {.softmax = {s->attention == ATTN_CAUSAL}};
    snprintf(vn, sizeof vn, "%s.attn.probs", v);
    int p = ir_add(g, IR_OP_SOFTMAX, (int[]){sc, lw->mask}, 2, &sm, vn);
    snprintf(vn, sizeof vn, "%s.attn.probs_dropout", v);
    p = lw_dropout(lw, p, s->attention_dropout, vn);
    IrAttr pv = {.matmul = {false, false, 1.0}};
    snprintf(vn, sizeof vn, "%s.attn.context_heads", v);
    int c = ir_add(g, IR_OP_MATMUL, (int[]){p, qkv[2]}, 2, &pv, vn);
    snprintf(vn, sizeof vn, "%s.attn.context", v);
    return ir_add(g, IR_OP_MERGE_HEADS, &c, 1, NULL, vn);
}

/* Multi-head self-attention of layer `pre` (e.g. "bert.encoder.layer.0"),
 * up to and including the output projection and its dropout. */
static int lower_attention(Lower *lw, int x, const char *pre, const char *v)
{
    const SpecStack *s = &lw->spec->stack;
    char n[PARAM_NAME_MAX], vn[IR_NAME_MAX];
    int c = lw->fused_attention ? lower_attention_fused(lw, x, pre, v) : lower_attention_unfused(lw, x, pre, v);
    snprintf(n, sizeof n, "%s.attention.output.dense", pre);
    snprintf(vn, sizeof vn, "%s.attn.out", v);
    int o = lw_linear(lw, c, n, s->hidden, s->hidden, vn);
    snprintf(vn, sizeof vn, "%s.attn.out_dropout", v);
    return lw_dropout(lw, o, s->hidden_dropout, vn);
}

/* dense H -> ffn, activation, dense ffn -> H, dropout. */
static int lower_ffn(Lower *lw, int x, const char *pre, const char *v)
{
    const SpecStack *s = &lw->spec->stack;
    char n[PARAM_NAME_MAX], vn[IR_NAME_MAX];
    snprintf(n, sizeof n, "%s.intermediate.dense", pre);
    snprintf(vn, sizeof vn, "%s.ffn.in", v);
    int t = lw_linear(lw, x, n, s->hidden, s->ffn, vn);
    snprintf(vn, sizeof vn, "%s.ffn.act", v);
    t = lw_act(lw, t, s->activation, vn);
    snprintf(n, sizeof n, "%s.output.dense", pre);
    snprintf(vn, sizeof vn, "%s.ffn.out", v);
    t = lw_linear(lw, t, n, s->ffn, s->hidden, vn);
    snprintf(vn, sizeof vn, "%s.ffn.out_dropout", v);
    return lw_dropout(lw, t, s->hidden_dropout, vn);
}

/* Post-LN (BERT): x = LN(x + attn(x)); x = LN(x + ffn(x)).
 * Pre-LN (GPT-2): x = x + attn(LN(x)); x = x + ffn(LN(x)).
 * The two LayerNorms keep BERT's names in both placements. */
static int lower_layer(Lower *lw, int x, int64_t i)
{
    char pre[56], v[32], n[PARAM_NAME_MAX], vn[IR_NAME_MAX];
    snprintf(pre, sizeof pre, "%s.encoder.layer.%lld", lw->prefix, (long long)i);
    snprintf(v, sizeof v, "layer.%lld", (long long)i);
    lw->frozen = i < lw->spec->train.freeze_layers;
    bool post = lw->spec->stack.norm == NORM_POST;
    snprintf(n, sizeof n, "%s.attention.output.LayerNorm", pre);
    snprintf(vn, sizeof vn, "%s.attn.ln", v);
    int a = post ? lower_attention(lw, x, pre, v)
                 : lower_attention(lw, lw_layernorm(lw, x, n, vn), pre, v);
    char rn[IR_NAME_MAX];
    if (lw->first_only) {   /* the residual of token 0 only (packed: each span's first slot), as the context */
        snprintf(rn, sizeof rn, "%s.first_token", v);
        x = lw->spans >= 0 ? ir_add(lw->g, IR_OP_SPAN_TOKEN, (int[]){x, lw->spans}, 2, &(IrAttr){.span = {false}}, rn)
                           : ir_add(lw->g, IR_OP_SLICE_FIRST, &x, 1, NULL, rn);
    }
    snprintf(rn, sizeof rn, "%s.attn.residual", v);
    x = lw_add(lw, a, x, rn);
    if (post) x = lw_layernorm(lw, x, n, vn);
    snprintf(n, sizeof n, "%s.output.LayerNorm", pre);
    snprintf(vn, sizeof vn, "%s.ffn.ln", v);
    int f = post ? lower_ffn(lw, x, pre, v) : lower_ffn(lw, lw_layernorm(lw, x, n, vn), pre, v);
    snprintf(rn, sizeof rn, "%s.ffn.residual", v);
    x = lw_add(lw, f, x, rn);
    if (post) x = lw_layernorm(lw, x, n, vn);
    lw->frozen = false;
    return x;
}

/* The LM decoder: logits = x E^T (+ bias), E tied to the word embeddings
 * unless the spec unties it. */
static int lower_decoder(Lower *lw, int x, int word_table, const char *wname, const char *bname)
{
    const SpecStack *s = &lw->spec->stack;
    const SpecHead *h = &lw->spec->head;
    int w;
    if (h->tie_word_embeddings) {
        params_add_tied(lw->pl, wname, lw->g->nodes[word_table].attr.param.index);
        w = word_table;
    } else {
        w = lw_param(lw, wname, s->vocab_size, s->hidden, PARAM_INIT_NORMAL, true);
    }
    int in[3] = {x, w, -1}, n_in = 2;
    if (h->decoder_bias) in[n_in++] = lw_param(lw, bname, s->vocab_size, 0, PARAM_INIT_ZEROS, false);
    return ir_add(lw->g, IR_OP_LINEAR, in, n_in, NULL, "logits");
}

static int lower_seq_head(Lower *lw, int x)
{
    const SpecHead *h = &lw->spec->head;
    int64_t hid = lw->spec->stack.hidden;
    char n[PARAM_NAME_MAX];
    /* Under causal attention only the last real token has seen the whole
     * row (HF GPT2ForSequenceClassification pools it); a bidirectional
     * stack pools the first ([CLS]) token as BERT does. */
    if (lw->first_only) {
        /* the last layer made token 0 of each row only: x is (B, H) */
    } else if (lw->spans >= 0) {   /* packed: the span's first (or, causal, last) slot */
        IrAttr sa = {.span = {lw->spec->stack.attention == ATTN_CAUSAL}};
        x = ir_add(lw->g, IR_OP_SPAN_TOKEN, (int[]){x, lw->spans}, 2, &sa,
                   sa.span.last ? "head.last_token" : "head.first_token");
    } else if (lw->spec->stack.attention == ATTN_CAUSAL)
        x = ir_add(lw->g, IR_OP_SLICE_LAST, (int[]){x, lw->mask}, 2, NULL, "head.last_token");
    else
        x = ir_add(lw->g, IR_OP_SLICE_FIRST, &x, 1, NULL, "head.first_token");
    if (h->pooler) {
        snprintf(n, sizeof n, "%s.pooler.dense", lw->prefix);
        x = lw_linear(lw, x, n, hid, hid, "head.pooler");
        x = lw_act(lw, x, h->pooler_activation, "head.pooler_act");
    }
    x = lw_dropout(lw, x, h->classifier_dropout, "head.dropout");
    int64_t out = h->regression ? 1 : h->num_labels;
    int logits = lw_linear(lw, x, "classifier", hid, out, "logits");
    lw->g->logits = logits;
    if (h->regression)
        return ir_add(lw->g, IR_OP_MSE, (int[]){logits, ir_input(lw->g, IR_IN_TARGETS)}, 2, NULL, "loss");
    return ir_add(lw->g, IR_OP_CROSS_ENTROPY, (int[]){logits, ir_input(lw->g, IR_IN_LABELS)}, 2, NULL,
                  "loss");
}

static int lower_head(Lower *lw, int x, int word_table)
{
    const SpecHead *h = &lw->spec->head;
    IrGraph *g = lw->g;
    int labels, logits;
    switch (h->kind) {
    case HEAD_SEQ_CLASSIFICATION:
        return lower_seq_head(lw, x);
    case HEAD_TOKEN_CLASSIFICATION:
        x = lw_dropout(lw, x, h->classifier_dropout, "head.dropout");
        logits = lw_linear(lw, x, "classifier", lw->spec->stack.hidden, h->num_labels, "logits");
        labels = ir_input(g, IR_IN_TOKEN_LABELS);
        break;
    case HEAD_MASKED_LM:
        x = lw_linear(lw, x, "cls.predictions.transform.dense", lw->spec->stack.hidden,
                      lw->spec->stack.hidden, "head.transform");
        x = lw_act(lw, x, lw->spec->stack.activation, "head.transform_act");
        x = lw_layernorm(lw, x, "cls.predictions.transform.LayerNorm", "head.transform_ln");
        logits = lower_decoder(lw, x, word_table, "cls.predictions.decoder.weight", "cls.predictions.bias");
        labels = ir_input(g, IR_IN_TOKEN_LABELS);
        break;
    case HEAD_CAUSAL_LM:
    default:
        logits = lower_decoder(lw, x, word_table, "lm_head.weight", "lm_head.bias");
        labels = ir_add(g, IR_OP_SHIFT_LABELS, (int[]){lw->ids, lw->mask}, 2, NULL, "next_token_labels");
        break;
    }
    g->logits = logits;
    return ir_add(g, IR_OP_CROSS_ENTROPY, (int[]){logits, labels}, 2, NULL, "loss");
}

bool last_layer_first_requested(void)
{
    const char *e = getenv("HPC_LAST_LAYER");
    return !(e && strcmp(e, "all") == 0);
}

bool last_layer_first_only(const ModelSpec *spec, bool fused_attention)
{
    const SpecStack *s = &spec->stack;
    return fused_attention && spec->head.kind == HEAD_SEQ_CLASSIFICATION &&
           s->attention != ATTN_CAUSAL && s->norm == NORM_POST && s->kind != STACK_DECODER && s->layers >= 1;
}

HpcStatus lower_model(const ModelSpec *spec, IrGraph *g, ParamList *params, HpcError *err)
{
    return lower_model_attention(spec, false, false, g, params, err);
}

HpcStatus lower_model_attention(const ModelSpec *spec, bool fused_attention, bool first_token, IrGraph *g,
                                ParamList *params, HpcError *err)
{
    const SpecStack *s = &spec->stack;
    if (s->heads < 1 || s->hidden % s->heads != 0)
        return hpc_fail(err, HPC_ERR_INPUT, "lower %s: hidden %lld is not a multiple of heads %lld",
                        spec->name, (long long)s->hidden, (long long)s->heads);
    bool pack = spec->train.pack;
    if (pack && !fused_attention)
        return hpc_fail(err, HPC_ERR_USAGE, "lower %s: a packed program (pack = true) needs the fused attention "
                        "op, which attends within each sequence; leave HPC_ATTENTION unset (or auto/fused)",
                        spec->name);
    if (pack && spec->head.kind == HEAD_CAUSAL_LM)
        return hpc_fail(err, HPC_ERR_USAGE, "lower %s: pack = true does not support a causal LM head yet (its "
                        "next-token labels would cross from one packed sequence into the next); train it "
                        "without pack", spec->name);
    HPC_ASSERT(g->n == 0 && params->n == 0);
    Lower lw = {.spec = spec, .g = g, .pl = params, .fused_attention = fused_attention, .mask = -1, .spans = -1};
    lw.prefix = s->kind == STACK_DECODER ? "transformer" : "bert";
    g->region = IR_REGION_EMBEDDINGS;
    lw.ids = ir_input(g, IR_IN_INPUT_IDS);
    if (pack) {   /* no batch holds a sequence longer than the max_seq_len lowered for */
        lw.spans = ir_input(g, IR_IN_SEQ_SPANS);
        g->nodes[lw.spans].attr.input.span_max = (int32_t)(spec->train.max_seq_len > 0 ? spec->train.max_seq_len : 0);
    }
    else lw.mask = ir_input(g, IR_IN_ATTN_MASK);
    int word_table;
    int x = lower_embeddings(&lw, &word_table);
    g->region = IR_REGION_STACK;
    for (int64_t i = 0; i < s->layers; i++) {
        lw.first_only = first_token && i == s->layers - 1 && last_layer_first_only(spec, fused_attention);
        x = lower_layer(&lw, x, i);
    }
    if (s->final_ln) {
        char n[PARAM_NAME_MAX];
        snprintf(n, sizeof n, "%s.ln_f", lw.prefix);
        x = lw_layernorm(&lw, x, n, "final_ln");
    }
    g->region = IR_REGION_HEAD;
    g->loss = lower_head(&lw, x, word_table);
    g->n_forward = g->n;
    g->n_params = params->n;
    return HPC_OK;
}

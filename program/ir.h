/* program/ir.h — the graph IR: one node per value, in topological order.
 *
 * A graph is an array of nodes; node i produces value i, and inputs always
 * have smaller ids, so the array order is a valid schedule.  An op with
 * several outputs (ops.def's `outputs` column: LAYERNORM_FWD's y, mean and
 * rstd) produces its first as its own value and each further one as an
 * OUTPUT node ("projection": input = the op, attr = the output's index)
 * appended right after it; the op's CPU reference and kernel write them all,
 * and the OUTPUT node itself computes nothing.  So every value still has
 * one node, passes copy and remap projections like any node, and a node
 * reads output k of a multi-output op by reading its projection.  Each value has a dtype and a shape of up to
 * IR_MAX_RANK dims; a dim is a constant >= 1 or one of the two symbols
 * IR_DIM_B (batch) and IR_DIM_L (sequence length), which are bound when the
 * graph runs.  Every other size (hidden, heads, vocab) is a constant.
 *
 * The op kinds, their arity and their rules come from one table,
 * program/ops.def.  Attributes are typed per op kind (IrAttr is a union of
 * small structs; ops.def says which member an op uses).
 *
 * This header holds the data and the queries both halves need.  Building
 * a graph (ir_add and the other builders, which run the op's shape rule,
 * and the backward rules) is the compiler's: compiler/ir_build.h.
 *
 * Graph roles: `loss` is the scalar the backward pass starts from, `logits`
 * the head's output (for evaluation); after autodiff, `param_grad[p]` is the
 * value holding the gradient of parameter p (-1 if frozen or unused) and
 * `n_forward` is the number of nodes of the forward part (forward nodes come
 * first, so evaluation runs nodes [0, n_forward)).
 *
 * Ownership: IrGraph owns its node array; ir_free releases it.  Passes that
 * rewrite the graph (precision, fuse) build a new graph or append nodes.
 *
 * Usage (building: compiler/ir_build.h):
 *   IrGraph g; ir_init(&g);
 *   int x = ir_input(&g, IR_IN_INPUT_IDS);
 *   int w = ir_param(&g, 0, DT_F32, 2, (int64_t[]){64, 16}, "emb");
 *   int h = ir_add(&g, IR_OP_EMBEDDING, (int[]){w, x}, 2, NULL, "h");
 *   ...
 *   ir_free(&g);
 */
#ifndef HPC_PROGRAM_IR_H
#define HPC_PROGRAM_IR_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>

#include "program/activations.h"

#define IR_MAX_RANK 4
#define IR_MAX_INPUTS 8   /* e.g. a fused LayerNorm(x + bias + residual): 5 */
#define IR_DIM_B (-1)   /* the batch size, bound at run time */
#define IR_DIM_L (-2)   /* the padded sequence length, bound at run time */
#define IR_NAME_MAX 64
#define IR_IGNORE_INDEX (-100) /* label value that is not scored (as PyTorch) */

typedef enum { DT_F32, DT_F16, DT_BF16, DT_F64, DT_I32 } DType;

typedef enum {
#define IR_OP(E, ...) IR_OP_##E,
#include "program/ops.def"
#undef IR_OP
    IR_OP_COUNT
} IrOpKind;

/* Batch fields an INPUT node can bind (runtime/data/batch.h). */
typedef enum {
    IR_IN_INPUT_IDS,      /* (B, L) i32 */
    IR_IN_TOKEN_TYPES,    /* (B, L) i32 */
    IR_IN_ATTN_MASK,      /* (B, L) i32, 1 = real token */
    IR_IN_LABELS,         /* (B) i32 sequence labels */
    IR_IN_TOKEN_LABELS,   /* (B, L) i32, -100 = ignore (token classification, masked LM) */
    IR_IN_TARGETS,        /* (B) f32 regression targets */
    IR_IN_LOSS_SCALE,     /* () f32: the gradient of the loss (the loss scale) */
    IR_IN_SEQ_SPANS,      /* (B, 2) i32 [start_b, len_b] in flat token slots: a packed batch
                             (docs/packing.md); its presence makes the graph packed */
    IR_IN_COUNT
} IrInputKind;

/* The activations, one per row of program/activations.h. */
typedef enum {
#define IR_ACT_ENUM_(E, ...) IR_ACT_##E,
    HPC_ACTIVATIONS(IR_ACT_ENUM_)
#undef IR_ACT_ENUM_
    IR_ACT_COUNT
} IrActKind;

/* The part of the model a node belongs to, set by lowering (the precision
 * policy may pin a dtype per region: compiler/precision.h).  Nodes appended
 * later take the region of what they derive from: a gradient that of the
 * forward value it is the gradient of, a cast that of the value cast. */
typedef enum { IR_REGION_EMBEDDINGS, IR_REGION_STACK, IR_REGION_HEAD, IR_REGION_COUNT } IrRegion;

/* span_max (IR_IN_SEQ_SPANS only): the longest sequence a batch of the
 * program may hold, the max_seq_len it was lowered for (compiler/lower.c);
 * the executors refuse a longer span and the CUDA emitter sizes the varlen
 * attention's launches by it; 0: no bound. */
typedef struct { IrInputKind kind; int32_t span_max; } IrInputAttr;
typedef struct { int index; } IrParamAttr;                 /* index into the ParamList */
typedef struct { int64_t offset; } IrPosAttr;              /* first position id */
typedef struct { bool trans_a, trans_b; double alpha; } IrMatmulAttr; /* C = alpha * op(A) op(B) */
typedef struct { double eps; } IrNormAttr;
typedef struct { IrActKind kind; } IrActAttr;
typedef struct { bool causal; } IrSoftmaxAttr;             /* padding mask always applies */
typedef struct { double p; int salt; } IrDropoutAttr;      /* salt = id of the forward dropout op */
typedef struct { int64_t heads; } IrHeadsAttr;
typedef struct { DType to; } IrCastAttr;
typedef struct { int64_t rows; } IrEmbedBwdAttr;           /* V: rows of the table */
typedef struct { int index; } IrOutputAttr;                /* which output (>= 1) of the input node */
/* ATTENTION and ATTENTION_BWD: heads, the attention-probability dropout
 * (p, salt = id of the forward ATTENTION op, its own Philox stream) and
 * causal masking on top of the padding mask.  packed (compiler/fuse_qkv.c):
 * q, k and v are one (B, L, 3H) value, columns [0, H), [H, 2H), [2H, 3H),
 * given as all three inputs; ATTENTION_BWD's output 0 is then the one
 * (B, L, 3H) gradient dqkv and the node has no outputs 1, 2 (dk, dv).
 * 16 bytes, as the union. */
/* varlen (a packed graph, docs/packing.md): input 3 (ATTENTION) / 4
 * (ATTENTION_BWD) is the (B, 2) i32 spans instead of the (B, L) mask, the
 * B x L slots are one flat sequence of tokens and sequence b attends
 * within slots [start_b, start_b + len_b) only. */
/* first_query (compiler/lower.c, the last layer under a first-token head):
 * only query 0 of each row attends, over all L keys: ctx (B, H), lse
 * (B, heads, 1), and the backward's dq is zero past row 0.  Its dropout
 * bits are those of query 0 in the full attention.  With varlen, the query
 * is each span's first slot start_b, over the span's keys (dq zero in the
 * span's other slots and in the tail); an empty span gives a zero context
 * and lse +inf. */
typedef struct { float p; int32_t salt; int32_t heads; uint8_t causal, packed, varlen, first_query; } IrAttnAttr;

/* SOFTMAX_DROPOUT, SOFTMAX_DROPOUT_BWD and DROPOUT_ADD (made by the fuse
 * pass, compiler/fuse.c); p is a float because the dropout kernels take p
 * as a float anyway. */
typedef struct {
    float p;          /* dropout probability */
    int32_t salt;     /* the forward DROPOUT's salt: the same Philox mask */
    uint8_t causal;   /* SOFTMAX_DROPOUT*: causal mask on top of padding */
    uint8_t mid;      /* storage dtype (DType) of the first removed value */
    uint8_t mid2;     /* SOFTMAX_DROPOUT_BWD: storage dtype of the removed DROPOUT(dy) */
    uint8_t pad_;
} IrFusedAttr;


/* LN_RESIDUAL and LN_RESIDUAL_BWD (compiler/fuse_layernorm.c; 16 bytes: eps stays a double, so the fused cpu reference is the unfused
 * one to the last bit; the salt, a node id, gets 19 bits and the fuse rule
 * leaves a site alone whose salt does not fit). */
#define FUSE_LN_SALT_MAX ((1 << 19) - 1)
typedef struct {
    double eps;           /* LayerNorm epsilon */
    float p;              /* dropout probability of the branch x */
    uint32_t salt : 19;   /* the forward DROPOUT's salt: the same Philox mask */
    uint32_t xhat : 1;    /* HPC_LN_SAVE=xhat: output 3 of LN_RESIDUAL is
                           * xhat = (s - mean) rstd in f16, not s, and no mean;
                           * LN_RESIDUAL_BWD reads (dy, xhat, rstd, gamma) */
    uint32_t mid : 4;     /* DType of dropout(x) in the unfused chain;
                           * LN_RESIDUAL_BWD: of the gradient into x (output 1) */
    uint32_t low : 4;     /* LN_RESIDUAL: DType of output 4, y in 16 bits */
    uint32_t aux : 3;     /* LN_RESIDUAL: DType of output 3, s; LN_RESIDUAL_BWD:
                           * of dgamma, dbeta and the bias gradient (outputs 2-4) */
    uint32_t ones : 1;    /* LN_RESIDUAL with xhat (HPC_LN_SAVE=xhat_ones): the
                           * saved xhat has IR_XHAT_ONES_PAD more columns, the
                           * first of them 1 and the rest 0, so a dW GEMM that
                           * reads it also sums its dy's columns (fuse_ln_dw.c).
                           * The last bit, so that a program written before it
                           * (aux < 8) reads as 0. */
} IrLnFusedAttr;
_Static_assert(DT_I32 < 8, "IrLnFusedAttr.aux holds a DType in 3 bits");

/* The columns a saved xhat with IrLnFusedAttr.ones has past H: a 1, then
 * zeros, so its rows stay 16-byte aligned in f16. */
#define IR_XHAT_ONES_PAD 8
/* ATTENTION's optional output 2 (compiler/fuse_attn_keep.c): the dropout's
 * keep bits of keys 0 .. IR_ATTN_KEEP_KEYS - 1 of every query, bit k % 32 of
 * word k / 32 of the query's row, (B, heads, L, IR_ATTN_KEEP_KEYS / 32) i32;
 * the forward writes them and the backward reads them when L is at most
 * IR_ATTN_KEEP_KEYS (the one-pass backward's rows), and both draw
 * otherwise. */
#define IR_ATTN_KEEP_KEYS 128

/* EMBED_LN and EMBED_LN_BWD (compiler/fuse_embed.c; 16 bytes each).  The
 * dropout after the LayerNorm is p and salt (p = 0: none).  eps stays a
 * double, as IrNormAttr's, so the fused cpu reference is the unfused one;
 * the backward needs no eps (it reads xhat and rstd) but the row counts of
 * the tables, the shapes of its outputs 0-2 (the fuse rule leaves a
 * third table of more than EMBED_LN_ROWS2_MAX rows unfused). */
#define EMBED_LN_ROWS2_MAX ((1 << 13) - 1)
typedef struct {
    double eps;
    float p;
    uint32_t salt : 19;   /* the DROPOUT's salt: the same Philox mask */
    uint32_t low : 4;     /* DType of output 3, y in 16 bits */
    uint32_t pad_ : 9;
} IrEmbedLnAttr;
typedef struct {
    int32_t rows0, rows1; /* V0, V1 */
    float p;
    uint32_t salt : 19;
    uint32_t rows2 : 13;  /* V2, 0 with two tables */
} IrEmbedLnBwdAttr;

/* ACT_BWD_BGRAD (compiler/fuse_act.c): the activation, and the storage
 * dtypes (DType) of output 1, the bias gradient, and output 2, the
 * recomputed forward value act(x) when the node has one.  `kind` first, as
 * in IrActAttr, so attr.act.kind names the activation for every act op. */
typedef struct { IrActKind kind; uint8_t db, y, pad_[2]; } IrActBgradAttr;

/* SPAN_TOKEN, SPAN_TOKEN_BWD (packed graphs): which slot of each span the
 * head reads: its first (start_b, [CLS]) or, last = 1, its last
 * (start_b + len_b - 1, causal stacks). */
typedef struct { uint8_t last; } IrSpanAttr;

typedef union {
    IrInputAttr input;
    IrParamAttr param;
    IrPosAttr pos;
    IrMatmulAttr matmul;
    IrNormAttr norm;
    IrActAttr act;
    IrSoftmaxAttr softmax;
    IrDropoutAttr dropout;
    IrHeadsAttr heads;
    IrCastAttr cast;
    IrEmbedBwdAttr embed_bwd;
    IrOutputAttr output;
    IrAttnAttr attn;
    IrFusedAttr fused;
    IrLnFusedAttr ln_fused;
    IrActBgradAttr act_bgrad;
    IrSpanAttr span;
    IrEmbedLnAttr embed_ln;
    IrEmbedLnBwdAttr embed_ln_bwd;
} IrAttr;

typedef struct {
    IrOpKind op;
    int in[IR_MAX_INPUTS];    /* input value ids, -1 past n_in */
    int n_in;
    IrAttr attr;
    DType dtype;
    int rank;
    int64_t dims[IR_MAX_RANK]; /* constants or IR_DIM_B / IR_DIM_L */
    bool requires_grad;       /* depends on a trainable parameter (set by autodiff) */
    bool backward;            /* produced by autodiff */
    IrRegion region;          /* embeddings, stack or head (see IrRegion) */
    char name[IR_NAME_MAX];   /* for listings: "layer.0.attn.scores" */
} IrNode;

/* The fused ops' attributes.  A set clears the whole union first, so the
 * bytes an artifact stores (program/step_program.c) do not depend on what
 * the node held before. */
static inline IrFusedAttr fuse_attr_get(const IrNode *n) { return n->attr.fused; }
static inline void fuse_attr_set(IrAttr *a, IrFusedAttr f)
{
    memset(a, 0, sizeof *a);
    a->fused = f;
}
static inline IrLnFusedAttr fuse_ln_attr_get(const IrNode *n) { return n->attr.ln_fused; }
static inline void fuse_ln_attr_set(IrAttr *a, IrLnFusedAttr f)
{
    memset(a, 0, sizeof *a);
    a->ln_fused = f;
}
static inline void fuse_embed_attr_set(IrAttr *a, IrEmbedLnAttr f)
{
    memset(a, 0, sizeof *a);
    a->embed_ln = f;
}
static inline void fuse_embed_bwd_attr_set(IrAttr *a, IrEmbedLnBwdAttr f)
{
    memset(a, 0, sizeof *a);
    a->embed_ln_bwd = f;
}

typedef struct {
    IrNode *nodes;
    int n, cap;
    int n_forward;            /* nodes of the forward part (== n before autodiff) */
    int loss;                 /* scalar loss value, -1 until set */
    int logits;               /* head output, -1 until set */
    int *param_grad;          /* (n_params) gradient value per parameter, -1 = none */
    int n_params;
    IrRegion region;          /* given to the nodes appended next (lowering moves it) */
} IrGraph;

/* What the op table (program/op_info.c, from ops.def) says of an op kind: the
 * facts a reader of a step program checks a node against.  The shape and
 * backward rules that build graphs are the compiler's (compiler/ir_build.h). */
typedef struct {
    const char *name;
    int min_inputs, max_inputs;
    int n_outputs;            /* 1, or an op whose outputs 1.. are OUTPUT nodes */
} IrOpInfo;

void ir_init(IrGraph *g);
void ir_free(IrGraph *g);

/* The value of output k of node id: id itself for k == 0, else its OUTPUT
 * node, or -1 when the graph has none (a pass dropped an unused one). */
int ir_output(const IrGraph *g, int id, int k);

/* How many inputs of g's nodes are value v (a node reading it twice counts twice). */
int ir_readers(const IrGraph *g, int v);
/* Copies loss, logits, n_forward and param_grad of src through map. */
void ir_copy_roles(IrGraph *g, const IrGraph *src, const int *map);

const IrOpInfo *ir_op_info(IrOpKind op);
const char *ir_op_name(IrOpKind op);
const char *ir_dtype_name(DType dt);          /* "f32", "f16", "bf16", "f64", "i32" */
const char *ir_input_name(IrInputKind kind);  /* "input_ids", ... */
const char *ir_act_name(IrActKind kind);
const char *ir_output_name(IrOpKind op, int k); /* output k's name: "mean", "rstd"; "out" for output 0 */
bool ir_dtype_is_float(DType dt);

/* Number of elements of value v for a binding of B and L. */
int64_t ir_numel(const IrNode *v, int64_t B, int64_t L);
/* Product of all dims but the last (the "rows" of a row-wise op). */
int64_t ir_rows(const IrNode *v, int64_t B, int64_t L);
int64_t ir_dim(int64_t d, int64_t B, int64_t L);  /* binds one dim */
bool ir_same_shape(const IrNode *a, const IrNode *b);
/* How many nodes of g from node `from` on are of kind op (0: the whole graph). */
int ir_count_op(const IrGraph *g, IrOpKind op, int from);

/* The graph reads a packed batch (an IR_IN_SEQ_SPANS input; docs/packing.md). */
bool ir_graph_packed(const IrGraph *g);
/* That input's span_max (IrInputAttr): the longest span a batch may hold, 0
 * for no bound or no packed input. */
int64_t ir_span_max(const IrGraph *g);

/* Writes "(B, L, 768)" into buf. */
void ir_shape_str(const IrNode *v, char *buf, size_t size);

#endif

/* tests/test_optim_rows.c — which embedding tables the device optimizer
 * reads by touched rows (runtime/cuda/cuda_optim_rows.h), on graphs built
 * by the compiler (no GPU needed).
 *
 * bert_tiny classifier (fp16): the word table (30522 x 128: 954 chunks)
 * qualifies, with its ids the input_ids batch input, both fused
 * (EMBED_LN_BWD) and unfused (EMBEDDING_BWD); with min_chunks 1 the small
 * tables that have batch ids join, largest first; above 954 none does.  A
 * masked-LM head tied to the word table sums the decoder's gradient into
 * the table's, so that table must not qualify.  HPC_OPT_ROWS and
 * HPC_OPT_ROWS_MIN_CHUNKS are read as cuda_optim_rows.h says. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_optim.h"
#include "cuda/cuda_optim_rows.h"
#include "compiler/spec_load.h"
#include "pipeline.h"
#include "program/ir.h"
#include "program/params.h"
#include "program/spec.h"

static void bert_tiny(ModelSpec *s)
{
    char path[512];
    const char *root = getenv("HPC_ROOT");
    snprintf(path, sizeof path, "%s/models/bert_tiny.model", root ? root : ".");
    cr_assert_eq(spec_load(path, s, stderr), 0, "cannot load %s", path);
}

/* The tables of the graph of s, the optimizer's tensors being every
 * parameter with a gradient in order (runtime/cuda/cuda_optim.c). */
static int tables_of(const ModelSpec *s, bool fuse, int64_t min_chunks, CudaOptRowTable *out, Pipeline *p,
                     int *param)
{
    PipeOptions po = pipeline_defaults(PREC_FP16);
    po.fuse = fuse;
    HpcError err = {0};
    cr_assert_eq(pipeline_build(s, &po, p, &err), HPC_OK, "%s", err.msg);
    int count = 0;
    for (int q = 0; q < p->pl.n; q++)
        if (p->g.param_grad[q] >= 0) param[count++] = q;
    return cuda_optim_row_tables(&p->g, param, count, min_chunks, out);
}

static const char *table_name(const Pipeline *p, const int *param, const CudaOptRowTable *t)
{
    return p->pl.p[param[t->tensor]].name;
}

static void expect_word_table(bool fuse)
{
    ModelSpec s;
    bert_tiny(&s);
    Pipeline p;
    int param[256];
    CudaOptRowTable t[CUDA_OPTIM_MAX_ROW_TABLES];
    int n = tables_of(&s, fuse, CUDA_OPTIM_ROWS_MIN_CHUNKS, t, &p, param);
    cr_assert_eq(n, 1, "fuse %d: %d tables", fuse, n);
    cr_expect(strstr(table_name(&p, param, &t[0]), "word_embeddings"), "%s", table_name(&p, param, &t[0]));
    cr_expect_eq(t[0].rows, 30522);
    cr_expect_eq(t[0].cols, 128);
    const IrNode *ids = &p.g.nodes[t[0].ids];
    cr_expect(ids->op == IR_OP_INPUT && ids->attr.input.kind == IR_IN_INPUT_IDS, "ids node %s", ids->name);
    /* the grad it reads is the embedding backward's own output */
    int v = p.g.param_grad[param[t[0].tensor]];
    IrOpKind op = p.g.nodes[v].op;
    cr_expect(fuse ? op == IR_OP_EMBED_LN_BWD : op == IR_OP_EMBEDDING_BWD, "fuse %d: gradient op %d", fuse, op);
    pipeline_free(&p);
}

Test(optim_rows, bert_tiny_word_table_fused) { expect_word_table(true); }
Test(optim_rows, bert_tiny_word_table_unfused) { expect_word_table(false); }

Test(optim_rows, min_chunks_admits_the_small_tables_largest_first)
{
    ModelSpec s;
    bert_tiny(&s);
    Pipeline p;
    int param[256];
    CudaOptRowTable t[CUDA_OPTIM_MAX_ROW_TABLES];
    int n = tables_of(&s, true, 1, t, &p, param);
    cr_assert_geq(n, 2, "%d tables", n);
    cr_expect(strstr(table_name(&p, param, &t[0]), "word_embeddings"));
    for (int i = 0; i < n; i++) {
        cr_expect(p.g.nodes[t[i].ids].op == IR_OP_INPUT, "table %s", table_name(&p, param, &t[i]));
        if (i) cr_expect_geq(t[i - 1].rows * t[i - 1].cols, t[i].rows * t[i].cols, "largest first");
    }
    pipeline_free(&p);
    n = tables_of(&s, true, 955, t, &p, param);
    cr_expect_eq(n, 0, "954 chunks: below a minimum of 955");
    pipeline_free(&p);
}

Test(optim_rows, a_tied_decoder_keeps_the_word_table_dense)
{
    ModelSpec s;
    bert_tiny(&s);
    s.head.kind = HEAD_MASKED_LM;
    s.head.tie_word_embeddings = true;
    s.head.decoder_bias = true;
    Pipeline p;
    int param[256];
    CudaOptRowTable t[CUDA_OPTIM_MAX_ROW_TABLES];
    int n = tables_of(&s, true, 1, t, &p, param);
    for (int i = 0; i < n; i++)
        cr_expect(!strstr(table_name(&p, param, &t[i]), "word_embeddings"), "the tied word table qualified");
    int word = -1;
    for (int q = 0; q < p.pl.n; q++)
        if (strstr(p.pl.p[q].name, "word_embeddings")) word = q;
    cr_assert_geq(word, 0);
    cr_expect_geq(p.g.param_grad[word], 0, "the tied table is trained");
    pipeline_free(&p);
}

Test(optim_rows, the_settings)
{
    HpcError err = {0};
    int64_t m = 0;
    unsetenv("HPC_OPT_ROWS");
    unsetenv("HPC_OPT_ROWS_MIN_CHUNKS");
    cr_expect(cuda_optim_rows_wanted());
    cr_expect_eq(cuda_optim_rows_min_chunks(&m, &err), HPC_OK);
    cr_expect_eq(m, CUDA_OPTIM_ROWS_MIN_CHUNKS);
    setenv("HPC_OPT_ROWS", "0", 1);
    cr_expect(!cuda_optim_rows_wanted());
    setenv("HPC_OPT_ROWS", "1", 1);
    cr_expect(cuda_optim_rows_wanted());
    setenv("HPC_OPT_ROWS_MIN_CHUNKS", "64", 1);
    cr_expect_eq(cuda_optim_rows_min_chunks(&m, &err), HPC_OK);
    cr_expect_eq(m, 64);
    const char *bad[] = {"0", "-3", "12abc", "x", "2000000000"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("HPC_OPT_ROWS_MIN_CHUNKS", bad[i], 1);
        err = (HpcError){0};
        cr_expect_eq(cuda_optim_rows_min_chunks(&m, &err), HPC_ERR_USAGE, "%s accepted", bad[i]);
        cr_expect(strstr(err.msg, "HPC_OPT_ROWS_MIN_CHUNKS"), "%s", err.msg);
    }
    unsetenv("HPC_OPT_ROWS");
    unsetenv("HPC_OPT_ROWS_MIN_CHUNKS");
}

/* compiler/emit_ops_body.h — private to emit_ops: the per-op kernel text.
 *
 * eopb_node fills an EopGen for one node: its kind, and for each phase the
 * kernel's base name (what it does, output dtype, row size), its body (the
 * statements inside `{ }`, reading the EopArgs `a`) and how it is launched
 * (a launch type and a count for the run's B, L).  emit_ops.c turns that
 * into named kernels and launch shapes.
 */
#ifndef HPC_COMPILER_EMIT_OPS_BODY_H
#define HPC_COMPILER_EMIT_OPS_BODY_H

#include "emit_ops.h"
#include "strbuf.h"


typedef enum {
    EOP_LT_ELEMS,      /* grid-stride over count elements, 256 threads */
    EOP_LT_ROWS,       /* one block of `threads` per row, count rows */
    EOP_LT_WARP_ROWS,  /* one warp per row, 4 rows per block of 128 */
    EOP_LT_ONE,        /* a single block of 1024 */
    EOP_LT_COLPART,    /* (ceil(count/32), EOP_COL_PARTS) x (32, 8): column partial sums */
    EOP_LT_COLFIN,     /* ceil(count/256) x 256: one thread per column */
} EopLaunchType;

typedef struct {
    char base[64];
    StrBuf body;
    EopLaunchType lt;
    int64_t count;
    int threads;
} EopGenPhase;

typedef struct {
    const IrGraph *g;
    int id;
    int64_t B, L;
    EopKind kind;
    int n_phases;
    EopGenPhase ph[EOP_MAX_PHASES];
    bool bias_epilogue;
    int64_t scratch;       /* bytes for B, L */
} EopGen;

/* Fills gen (already holding g, id, B, L; the rest zero). */
HpcStatus eopb_node(EopGen *gen, HpcError *err);
void eopb_free(EopGen *gen);

#endif

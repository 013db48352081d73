/* compiler/emit_ops_body.h — private to emit_ops: the per-op kernel text.
 *
 * eopb_node fills an EopGen for one node: its kind, and for each phase the
 * kernel's base name (what it does, output dtype, row size), its body (the
 * statements inside `{ }`, reading the EopArgs `a`) and how it is launched
 * (a launch type and a count as a function of B, L).  emit_ops.c turns that
 * into named kernels and launch shapes.
 */
#ifndef HPC_COMPILER_EMIT_OPS_BODY_H
#define HPC_COMPILER_EMIT_OPS_BODY_H

#include "emit_ops.h"
#include "strbuf.h"


typedef struct {
    char base[64];
    StrBuf body;
    EopLaunchType lt;
    StepSize count;            /* of B, L */
    int threads;
    int min_blocks;            /* __launch_bounds__'s blocks per SM; 0: none */
    int64_t above_l;           /* StepPhase.above_l: launched only for rows longer than this; 0: always */
    int64_t at_most_l;         /* StepPhase.at_most_l: launched only for rows up to this long; 0: always */
    int shared_bytes;          /* StepPhase.shared_bytes: dynamic shared memory a block; 0: none */
    StepTarget target;         /* StepPhase.target: the modules it is launched from */
} EopGenPhase;

typedef struct {
    const IrGraph *g;
    int id;
    EopKind kind;
    int n_phases;
    EopGenPhase ph[EOP_MAX_PHASES];
    bool bias_epilogue;
    uint32_t salt;         /* the dropout salt its bodies read as a.salt (StepNodeCode.salt) */
    bool has_salt;         /* salt set (eopb_use_salt) */
    StepSize scratch;      /* bytes, of B, L */
} EopGen;

/* Records the dropout salt a node's bodies read as a.salt.  One salt a
 * node: it is a single launch argument, so a second, different one is a
 * bug in the generator (asserted). */
void eopb_use_salt(EopGen *gen, uint32_t salt);

/* Fills gen (already holding g and id; the rest zero). */
HpcStatus eopb_node(EopGen *gen, HpcError *err);
void eopb_free(EopGen *gen);

#endif

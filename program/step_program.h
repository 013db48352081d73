/* program/step_program.h — the step program: the compiler's one product and
 * the runtime's one input.
 *
 * A StepProgram is everything needed to train or run one model under one
 * precision policy, with the batch B and the padded length L left open:
 *   - spec       the checked model (sizes, head, training settings);
 *   - g          the value table and the nodes in order (program/ir.h):
 *                every value's dtype and shape, dims constants or B, L;
 *   - pl         the parameter table, Hugging Face names (program/params.h);
 *   - kernels    one launch record per node (StepNodeCode: the kernels'
 *                names, launch type, and their element / row counts and
 *                scratch bytes as functions of B and L) and the CUDA
 *                source of every kernel, one translation unit.
 * The kernels are specialised on the model's sizes and take B and L as
 * arguments (EopArgs.B, .L), so one NVRTC compile per (program, arch)
 * serves every (B, L) of a run.  GEMM descriptors are functions of B, L
 * read from the value table (runtime/cuda/cuda_exec.c); arena offsets come
 * from plan_build_scratch (program/plan.h) for the run's bounds, with each
 * node's scratch from its record.
 *
 * `hpc compile` writes a program into NAME.hpc (program/artifact.h: the
 * `program` section, written and read by step_program_write / _read below);
 * `hpc run NAME.hpc` and the C API read it back and never run the parser,
 * the checker, lowering or autodiff.  A .model path is compiled in-process
 * by step_program_compile (compiler/step_program_build.h), which takes the
 * same road afterwards.
 *
 * program/ is the contract between the two halves: the runtime includes
 * these headers and no compiler/ header (scripts/check-includes.sh), and
 * the reader (step_program.c) links with the rest of program/, util/ and
 * compiler/ops.c, the op table, only (tests/link/check-no-frontend.sh reads
 * the link map; tests/test_step_program.c checks with nm that a program
 * running an artifact has no yyparse, yylex, lower_model, autodiff_build).
 *
 * Ownership: a StepProgram owns its graph, parameter list, records and
 * source; step_program_free releases them.
 *
 * Usage:
 *   StepProgram p;
 *   if (step_program_read_file("bert_tiny.hpc", &p, &err)) return err.code;
 *   ... cuda_exec_init_program(&ex, &dev, &p, B, L, &err) or the trainer ...
 *   step_program_free(&p);
 */
#ifndef HPC_PROGRAM_STEP_PROGRAM_H
#define HPC_PROGRAM_STEP_PROGRAM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "error.h"
#include "program/ir.h"
#include "program/params.h"
#include "program/spec.h"

#define EOP_MAX_PHASES 6   /* the v5 attention backward: v4 up to L 64 and (not sm_90a) to 128, wgmma one-pass, delta, dQ, dK/dV */
#define EOP_NAME_MAX 96
/* Row blocks of the column-sum reductions (bias and gamma gradients):
 * enough blocks to fill an H100/H200 at C = 768 (docs/perf.md). */
#define EOP_COL_PARTS 128

/* The version of the program section; a reader refuses any other.
 * 2: EopArgs with 8 inputs and extra outputs (fused attention);
 * 3: 4 extra outputs (the fused LayerNorm site's mean, rstd, s, y in 16
 *    bits), so a version-2 program's CUDA would read the wrong slots;
 * 4: the dropout salt is a launch argument (EopArgs.salt, from the code
 *    line), not a constant in the kernel's text, so the layers' kernels
 *    that differ only by salt are one kernel: a version-3 program's CUDA
 *    would draw every mask with salt 0;
 * 5: ATTENTION's first_query flag (IrAttnAttr): a version-4 reader would
 *    take a last layer lowered for the first token as a full one;
 * 6: the fused embedding layer (EMBED_LN, EMBED_LN_BWD), op kinds that a
 *    version-5 reader does not know;
 * 7: a phase's ABOVE_L (StepPhase.above_l): a phase launched only for
 *    longer rows, which a version-6 reader would launch at every length;
 * 8: a phase's SHARED (StepPhase.shared_bytes): dynamic shared memory a
 *    block, which a version-7 reader would launch without;
 * 9: a phase's AT_MOST_L (StepPhase.at_most_l): a phase launched only for
 *    rows up to a length, which a version-8 reader would launch at every
 *    length;
 * 10: a phase's TARGET (StepPhase.target): a phase launched only where the
 *    module is, or is not, built for sm_90a, which a version-9 reader
 *    would launch everywhere (both of a pair of alternatives);
 * 11: the optimizer kernels read a byte a chunk saying which chunks of an
 *    embedding table's gradient the step touched, set by a new kernel,
 *    opt_mark_rows (runtime/cuda/cuda_optim_rows.h); a version-10 module's
 *    optimizer kernels take fewer arguments. */
#define STEP_PROGRAM_VERSION 11
/* A node line lists n_in inputs padded with -1 to at least this many. */
#define STEP_NODE_MIN_INPUTS 3
/* Inputs a CUDA kernel takes (EopArgs.x); the emitter refuses a node with more. */
#define EOP_MAX_INPUTS 8
/* Outputs past the first a kernel writes (EopArgs.yk: a multi-output node's
 * OUTPUT values 1, 2, ...; LN_RESIDUAL's four, LN_RESIDUAL_BWD's dx,
 * dgamma, dbeta, dbias, ATTENTION_BWD's dk and dv). */
#define EOP_MAX_EXTRA_OUTPUTS 4

/* How a node runs on the cuda backend:
 *   EOP_NONE     PARAM: storage bound by the executor, nothing to run;
 *   EOP_UPLOAD   a batch INPUT: the executor copies the field from the host;
 *   EOP_GEMM     LINEAR, MATMUL, LINEAR_DX, LINEAR_DX_ACC, LINEAR_DW, LINEAR_DW_BGRAD: one
 *                cuBLASLt GEMM, then the node's phases if any (a bias add
 *                the epilogue cannot do; LINEAR_DW_BGRAD's column sums into
 *                its output 1, db, launched only where cuBLASLt has no
 *                BGRADB algorithm: runtime/cuda/cuda_exec.c);
 *   EOP_KERNELS  everything else: 1..EOP_MAX_PHASES kernels in order. */
typedef enum { EOP_NONE, EOP_UPLOAD, EOP_GEMM, EOP_KERNELS } EopKind;

/* Launch types; the grid follows from a count (StepSize) of the run. */
typedef enum {
    EOP_LT_ELEMS,      /* grid-stride over count elements, 256 threads */
    EOP_LT_ROWS,       /* one block of `threads` per row, count rows */
    EOP_LT_WARP_ROWS,  /* one warp per row, 4 rows per block of 128 */
    EOP_LT_ONE,        /* a single block of 1024 */
    EOP_LT_COLPART,    /* (ceil(count/32), EOP_COL_PARTS) x (32, 8): column partial sums */
    EOP_LT_COLFIN,     /* ceil(count/256) x 256: one thread per column */
    EOP_LT_HEAD_TILES, /* (count, threads, B) x 128: count tiles of L, one grid row per head
                          (the phase's `threads` field holds the head count: fused attention) */
    EOP_LT_HEAD_BLOCKS,/* (count, threads, B) x 256: as EOP_LT_HEAD_TILES, blocks of 8 warps */
    EOP_LT_COUNT
} EopLaunchType;

/* A size as a function of the run's B and L:
 *   min(cap, (c0 + c1 * B^pB * L^pL) / div)      (cap 0: no cap)
 * which covers element counts ("B*L*768"), rows, vector counts
 * ("(B*L*768 + 7) / 8") and scratch bytes ("128*768*8 + 2*B*L*4"). */
typedef struct {
    int64_t c0, c1;
    int pB, pL;
    int64_t div, cap;
} StepSize;

int64_t step_size_eval(const StepSize *s, int64_t B, int64_t L);

/* Which modules a phase is launched from: any; only one built for the
 * architecture-specific sm_90a target (its kernel has wgmma code; the
 * executor compiles the module so on an sm_90 device when its source has
 * STEP_SOURCE_SM90A_MARK or STEP_SOURCE_GEMM_OWN_MARK); or only one that
 * is not (the alternative kernel for the same rows elsewhere: another GPU,
 * a program's own cubin). */
typedef enum { STEP_TARGET_ANY = 0, STEP_TARGET_SM90A = 1, STEP_TARGET_NOT_SM90A = 2 } StepTarget;

typedef struct {
    char name[EOP_NAME_MAX];     /* function in the module */
    EopLaunchType lt;
    StepSize count;
    int threads;                 /* EOP_LT_ROWS: block size */
    int64_t above_l;             /* > 0: launched only where the run's L is above it (a phase whose
                                    blocks would all return at once below; its kernel checks too) */
    int64_t at_most_l;           /* > 0: launched only where the run's L is at most it (the same
                                    from the other side) */
    int32_t shared_bytes;        /* dynamic shared memory a block (bytes, up to STEP_PHASE_MAX_SHARED);
                                    0: the kernel's static arrays only */
    StepTarget target;           /* launched only where the module is (or is not) built for sm_90a */
} StepPhase;

/* The most dynamic shared memory a phase may ask for: an sm_90 block's
 * 227 KiB (sm_80's is 163 KiB: a phase asking for more than the device
 * has fails at its launch). */
#define STEP_PHASE_MAX_SHARED (227 * 1024)

/* The launch record of one node. */
typedef struct {
    EopKind kind;
    int n_phases;
    StepPhase phase[EOP_MAX_PHASES];
    bool bias_epilogue;          /* EOP_GEMM of a LINEAR with bias: cuBLASLt adds it */
    uint32_t salt;               /* its dropout masks' salt (EopArgs.salt), 0 without dropout */
    StepSize scratch;            /* bytes of scratch its kernels need */
} StepNodeCode;

/* A phase's launch shape for one (B, L); grid all 0: not launched at this
 * shape (StepPhase.above_l, StepPhase.at_most_l). */
typedef struct {
    char name[EOP_NAME_MAX];
    unsigned grid[3], block[3];
    unsigned shared_bytes;       /* dynamic shared memory a block (StepPhase.shared_bytes) */
} EopPhase;

typedef struct {
    EopKind kind;
    int n_phases;
    EopPhase phase[EOP_MAX_PHASES];
    bool bias_epilogue;
} EopNodeCode;

/* The kernels' argument, passed by value (layout fixed: 144 bytes). */
typedef struct {
    uint64_t y;                  /* output value */
    uint64_t x[EOP_MAX_INPUTS];  /* inputs, 0 past n_in */
    uint64_t yk[EOP_MAX_EXTRA_OUTPUTS]; /* yk[k - 1]: output k of a multi-output node, 0 if the graph has none */
    uint64_t scratch;            /* the node's scratch, or 0 */
    uint64_t ctl;                /* const EopCtl * */
    int64_t B, L;
    uint64_t salt;               /* the node's dropout salt (StepNodeCode.salt) */
} EopArgs;

/* Per-step control block in device memory (layout fixed: 24 bytes). */
typedef struct {
    uint64_t seed;               /* dropout seed */
    uint32_t step;               /* dropout micro-step counter */
    uint32_t training;           /* 0: dropout is the identity */
    float loss_scale;            /* IR_IN_LOSS_SCALE: the backward seed */
    uint32_t pad_;
} EopCtl;

#define STEP_MAX_CUBINS 8

/* The module compiled ahead for one arch (`hpc compile --arch 90`): a run
 * on that arch loads it and runs no NVRTC at all. */
typedef struct {
    int arch;                    /* 90 for sm_90 */
    unsigned char *data;         /* the CUBIN (an ELF image) */
    size_t size;
} StepCubin;

/* A line of cuda_source saying the module ends with hpc's own GEMM
 * (compiler/kernels/gemm_wgmma_tma.cu and gemm_wgmma_pp.cu, HPC_GEMM_OWN):
 * the executor then compiles it for sm_90a on an sm_90 device and runs
 * f16 linears on it (runtime/cuda/gemm_own.h). */
#define STEP_SOURCE_GEMM_OWN_MARK "#define HPC_MODULE_GEMM_OWN 1\n"
/* A line of cuda_source saying the module has other kernels for the
 * architecture-specific sm_90a target (the warpgroup-MMA attention
 * forward and backward, v5, the default): the executor compiles it for
 * sm_90a on an sm_90 device too.  Their phases are launched only from such a module
 * (StepPhase.target); elsewhere their bodies are a trap, never run. */
#define STEP_SOURCE_SM90A_MARK "#define HPC_MODULE_SM90A 1\n"
/* Beside it under HPC_GEMM_OWN=gelu (the default): only the linears whose
 * GELU the own GEMM computes too run on it; the others stay cuBLASLt's. */
#define STEP_SOURCE_GEMM_OWN_GELU_ONLY_MARK "#define HPC_MODULE_GEMM_OWN_GELU_ONLY 1\n"

/* The records of a graph's nodes and the module they name. */
typedef struct {
    StepNodeCode *node;          /* (n) one per graph node */
    int n;
    char *cuda_source;           /* NUL-terminated; NULL for a cpu-only program */
    StepCubin cubin[STEP_MAX_CUBINS];
    int n_cubins;
} StepKernels;

typedef struct {
    char name[128];
    SpecPrecision policy;        /* PREC_FP32, PREC_FP16 or PREC_BF16 */
    bool fused;                  /* the fuse pass ran */
    ModelSpec spec;
    IrGraph g;
    ParamList pl;
    StepKernels kernels;
} StepProgram;

/* Grid and block of node code `c` for a run of B, L from a module built
 * for sm_90a or not (StepPhase.target). */
void step_node_launch(const StepNodeCode *c, int64_t B, int64_t L, bool sm90a, EopNodeCode *out);

/* Scratch bytes of every node for B, L into out[0 .. k->n). */
void step_kernels_scratch(const StepKernels *k, int64_t B, int64_t L, int64_t *out);

void step_kernels_free(StepKernels *k);

/* Adds (a copy of) the module's cubin for sm_<arch>, replacing one of the
 * same arch.  HPC_ERR_USAGE past STEP_MAX_CUBINS or for an image that is
 * not ELF. */
HpcStatus step_kernels_add_cubin(StepKernels *k, int arch, const void *data, size_t size, HpcError *err);

/* The cubin for sm_<arch>, or NULL. */
const StepCubin *step_kernels_cubin(const StepKernels *k, int arch);
void step_program_init(StepProgram *p);
void step_program_free(StepProgram *p);

/* Deep copies of the graph and parameter list (for a backend that owns its
 * own; the program stays valid). */
void step_program_copy_graph(const StepProgram *p, IrGraph *g, ParamList *pl);

/* The program as text (every field keyed, one record per line), for the
 * `program` section of NAME.hpc. */
void step_program_write(const StepProgram *p, FILE *out);

/* Reads what step_program_write wrote, `len` bytes at `text`; `where`
 * names the file in messages.  Refuses (HPC_ERR_INPUT, naming the line and
 * the reason) another version, a truncated program, an unknown field, an
 * unknown policy, op, dtype or launch type, and values out of range (an
 * input id not before its node, a dim < 1 that is not B or L, a name too
 * long).  On failure *p is left empty. */
HpcStatus step_program_read(const char *where, const char *text, size_t len, StepProgram *p,
                            HpcError *err);

/* Reads the program section of NAME.hpc (program/artifact.h). */
HpcStatus step_program_read_file(const char *path, StepProgram *p, HpcError *err);

#endif

/* program/params.h — the parameter list of a lowered model.
 *
 * One ParamInfo per named tensor, in the order the lowering creates them.
 * Names follow Hugging Face's BERT checkpoints (docs/ir.md lists the scheme),
 * so checkpoint import can map them one to one; linear weights are stored
 * (out, in) as in PyTorch.  A tied parameter (the MLM/LM decoder weight that
 * is the word embedding) is listed for its name but has tied_to >= 0: it owns
 * no storage, the graph uses the tensor it is tied to, and its gradient
 * accumulates into that tensor.
 *
 * Ownership: the ParamList owns its array; params_free releases it.
 */
#ifndef HPC_PROGRAM_PARAMS_H
#define HPC_PROGRAM_PARAMS_H

#include <stdbool.h>
#include <stdint.h>

#define PARAM_NAME_MAX 96

typedef enum {
    PARAM_INIT_NORMAL, /* normal(0, 0.02), as BERT's initializer_range */
    PARAM_INIT_ZEROS,  /* biases, LayerNorm beta */
    PARAM_INIT_ONES,   /* LayerNorm gamma */
} ParamInit;

typedef struct {
    char name[PARAM_NAME_MAX];
    int rank;            /* 1 or 2 */
    int64_t dims[2];
    ParamInit init;
    bool decay;          /* weight decay applies (not for biases and LayerNorm, as HF) */
    bool frozen;         /* no gradient, no update (freeze_embeddings / freeze_layers) */
    int tied_to;         /* -1, or the index whose storage this parameter shares */
} ParamInfo;

typedef struct {
    ParamInfo *p;
    int n, cap;
} ParamList;

void params_init(ParamList *pl);
void params_free(ParamList *pl);
/* Appends a parameter and returns its index. */
int params_add(ParamList *pl, const char *name, int rank, const int64_t *dims, ParamInit init,
               bool decay, bool frozen);
/* Appends a name that shares the storage of parameter `to`; returns its index. */
int params_add_tied(ParamList *pl, const char *name, int to);
int params_find(const ParamList *pl, const char *name);  /* -1 if absent */
int64_t params_numel(const ParamInfo *p);
/* Elements over all parameters that own storage (tied names not counted),
 * the figure summary_param_count reports. */
int64_t params_total(const ParamList *pl);

#endif

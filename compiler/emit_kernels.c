/* compiler/emit_kernels.c — specialises the CUDA templates to one model.
 * See emit_kernels.h for the naming and the kernels' contracts. */
#include "emit_kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_sources.h"
#include "program/activations.h"
#include "strbuf.h"

/* The default rows per block of ln_bwd/emb_bwd. */
#define KEMIT_DEFAULT_RPB 1

/* Templates in the order they are concatenated: later files use the helpers
 * of earlier ones (embedding.cu uses layernorm.cu's normalisation). */
static const char *const kemit_templates[] = {
    "common.cu", "philox.cu", "dropout.cu", "layernorm.cu", "embedding.cu",
    "activation.cu", "softmax.cu", "loss.cu",
};
#define KEMIT_TEMPLATE_COUNT ((int)(sizeof kemit_templates / sizeof kemit_templates[0]))

const char *const kemit_kernel_bases[] = {
    "philox_test", "dropout_fwd", "dropout_bwd",
    "ln_fwd", "ln_bwd", "ln_grad_reduce", "emb_fwd", "emb_bwd",
    "bias_gelu_fwd", "bias_gelu_bwd", "bias_gelu_tanh_fwd", "bias_gelu_tanh_bwd",
    "bias_relu_fwd", "bias_relu_bwd", "bias_tanh_fwd", "bias_tanh_bwd",
    "colsum_partial", "colsum_finish",
    "attn_softmax_fwd", "attn_softmax_bwd",
    "xent_count", "xent_fwd_bwd", "xent_fwd_bwd_f32", "xent_loss_reduce",
    "mse_fwd_bwd", "mse_fwd_bwd_f32",
};
const int kemit_kernel_count = (int)(sizeof kemit_kernel_bases / sizeof kemit_kernel_bases[0]);

const char *kemit_dtype_name(KemitDtype dt)
{
    switch (dt) {
    case KEMIT_F32: return "f32";
    case KEMIT_F16: return "f16";
    case KEMIT_BF16: return "bf16";
    }
    return "?";
}

void kemit_config_from_spec(KernelConfig *cfg, const ModelSpec *spec, KemitDtype dtype)
{
    const SpecStack *s = &spec->stack;
    *cfg = (KernelConfig){
        .hidden = s->hidden, .heads = s->heads, .head_dim = s->hidden / s->heads,
        .ffn = s->ffn, .vocab = s->vocab_size,
        .labels = spec->head.regression ? 1 : spec->head.num_labels,
        .max_positions = s->max_positions, .type_vocab = s->type_vocab_size,
        .position_offset = s->position_offset, .ln_eps = s->ln_eps,
        .hidden_dropout = s->hidden_dropout, .attention_dropout = s->attention_dropout,
        .dtype = dtype, .activation = s->activation,
        .causal = s->attention == ATTN_CAUSAL, .embedding_ln = s->embedding_ln,
    };
}

KemitRowLayout kemit_row_layout(const KernelConfig *cfg)
{
    int elem = cfg->dtype == KEMIT_F32 ? 4 : 2;
    int vec = 16 / elem;
    while (vec > 1 && cfg->hidden % vec != 0) vec /= 2;
    int64_t chunks = cfg->hidden / vec;
    int64_t threads = (chunks + 31) / 32 * 32;
    if (threads > 1024) threads = 1024;
    /* Backward kernels: rows per block as asked, within 1024 threads; by
     * default one (timed on an H200: see docs/cuda_kernels.md). */
    int rpb = cfg->row_rpb > 0 ? cfg->row_rpb : KEMIT_DEFAULT_RPB;
    while (rpb > 1 && threads * rpb > 1024) rpb--;
    KemitRowLayout r = { vec, (int)threads, (int)((chunks + threads - 1) / threads), rpb };
    return r;
}

/* A growing string; allocation failure panics (sources are small). */
static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static HpcStatus kemit_check(const KernelConfig *c, HpcError *err)
{
    if (c->hidden <= 0 || c->heads <= 0 || c->hidden % c->heads != 0)
        return hpc_fail(err, HPC_ERR_INPUT, "kernel emitter: hidden %lld is not a positive multiple of "
                        "heads %lld; fix the model's hidden or heads", (long long)c->hidden, (long long)c->heads);
    if (c->head_dim != c->hidden / c->heads)
        return hpc_fail(err, HPC_ERR_INPUT, "kernel emitter: head_dim %lld != hidden/heads %lld",
                        (long long)c->head_dim, (long long)(c->hidden / c->heads));
    if (c->max_positions <= 0 || c->max_positions > KEMIT_MAX_POSITIONS)
        return hpc_fail(err, HPC_ERR_INPUT, "kernel emitter: max_positions %lld outside 1..%d, the "
                        "longest row the attention softmax keeps in registers; use a shorter max_positions",
                        (long long)c->max_positions, KEMIT_MAX_POSITIONS);
    if (c->hidden > 65536 || c->ln_eps <= 0)
        return hpc_fail(err, HPC_ERR_INPUT, "kernel emitter: hidden %lld > 65536 or ln_eps %g <= 0 "
                        "is not supported", (long long)c->hidden, c->ln_eps);
    if (c->row_rpb < 0 || c->row_rpb > 4)
        return hpc_fail(err, HPC_ERR_INPUT, "kernel emitter: row_rpb %d outside 0..4", c->row_rpb);
    if (c->position_offset < 0 || c->position_offset >= c->max_positions)
        return hpc_fail(err, HPC_ERR_INPUT, "kernel emitter: position_offset %lld outside 0..%lld",
                        (long long)c->position_offset, (long long)c->max_positions - 1);
    return HPC_OK;
}

/* The constants every template reads. */
static void kemit_constants(StrBuf *b, const KernelConfig *c)
{
    KemitRowLayout r = kemit_row_layout(c);
    strbuf_printf(b, "#define HPC_DTYPE %d /* 0 f32, 1 f16, 2 bf16 */\n", (int)c->dtype);
    strbuf_printf(b, "#define HPC_HIDDEN %lld\n", (long long)c->hidden);
    strbuf_printf(b, "#define HPC_HEADS %lld\n", (long long)c->heads);
    strbuf_printf(b, "#define HPC_HEAD_DIM %lld\n", (long long)c->head_dim);
    strbuf_printf(b, "#define HPC_FFN %lld\n", (long long)c->ffn);
    strbuf_printf(b, "#define HPC_VOCAB %lld\n", (long long)c->vocab);
    strbuf_printf(b, "#define HPC_LABELS %lld\n", (long long)c->labels);
    strbuf_printf(b, "#define HPC_MAX_POSITIONS %lld\n", (long long)c->max_positions);
    strbuf_printf(b, "#define HPC_TYPE_VOCAB %lld\n", (long long)c->type_vocab);
    strbuf_printf(b, "#define HPC_POS_OFFSET %lld\n", (long long)c->position_offset);
    strbuf_printf(b, "#define HPC_LN_EPS %.8ef\n", (double)(float)c->ln_eps);
    strbuf_printf(b, "#define HPC_HIDDEN_DROPOUT %.8ef\n", (double)(float)c->hidden_dropout);
    strbuf_printf(b, "#define HPC_ATTN_DROPOUT %.8ef\n", (double)(float)c->attention_dropout);
    strbuf_printf(b, "#define HPC_ACTIVATION %d /* gelu, gelu_tanh, relu, tanh */\n", (int)c->activation);
    strbuf_printf(b, "#define HPC_CAUSAL %d\n", c->causal ? 1 : 0);
    strbuf_printf(b, "#define HPC_EMB_LN %d\n", c->embedding_ln ? 1 : 0);
    strbuf_printf(b, "#define HPC_ROW_VEC %d\n#define HPC_ROW_THREADS %d\n#define HPC_ROW_NPT %d\n"
                  "#define HPC_ROW_RPB %d\n", r.vec, r.threads, r.npt, r.rpb);
    strbuf_printf(b, "#define HPC_SOFTMAX_MAXLEN %lld\n", (long long)((c->max_positions + 127) / 128 * 128));
    strbuf_printf(b, "#define HPC_CAT2(a, b) a##b\n#define HPC_CAT(a, b) HPC_CAT2(a, b)\n"
                  "#define KN(base) HPC_CAT(base, HPC_SUFFIX)\n");
}

HpcStatus kemit_source(const KernelConfig *cfg, char **source, char suffix[KEMIT_SUFFIX_MAX],
                       HpcError *err)
{
    *source = NULL;
    HpcStatus st = kemit_check(cfg, err);
    if (st) return st;
    StrBuf body = {0};
    kemit_constants(&body, cfg);
    for (int i = 0; i < KEMIT_TEMPLATE_COUNT; i++) {
        const char *text = kernel_source_find(kemit_templates[i]);
        if (!text) {
            free(body.p);
            return hpc_fail(err, HPC_ERR_INTERNAL, "kernel emitter: template compiler/kernels/%s is "
                            "not in the build; rebuild with `make` from a full checkout", kemit_templates[i]);
        }
        if (strcmp(kemit_templates[i], "activation.cu") == 0)   /* the exact GELU's Phi, as the step module's */
            strbuf_add(&body, "\n// ---- gelu_cdf (program/activations.h) ----\n" ACT_GELU_CDF_CUDA("KN(gelu_cdf)"));
        strbuf_printf(&body, "\n// ---- %s ----\n", kemit_templates[i]);
        strbuf_add(&body, text);
    }
    uint64_t h = fnv1a(body.p, body.len);
    snprintf(suffix, KEMIT_SUFFIX_MAX, "_%s_h%lld_%06llx", kemit_dtype_name(cfg->dtype),
             (long long)cfg->hidden, (unsigned long long)(h & 0xffffff));
    StrBuf out = {0};
    strbuf_printf(&out, "// hpc kernels, generated by compiler/emit_kernels.c from compiler/kernels/*.cu\n"
                     "#define HPC_SUFFIX %s\n", suffix);
    strbuf_addn(&out, body.p, body.len);
    free(body.p);
    *source = out.p;
    return HPC_OK;
}

void kemit_name(const char *suffix, const char *base, char *buf, size_t size)
{
    snprintf(buf, size, "%s%s", base, suffix);
}

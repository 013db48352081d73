/* program/activations.h — the activation set, defined once for C and CUDA.
 *
 * Each row of HPC_ACTIVATIONS names one activation:
 *
 *   X(ENUM, name, ffn, hf_name, ref, grad, cuda)
 *
 *   ENUM     the enumerator suffix: IR_ACT_ENUM (ir.h), ACT_ENUM (spec.h);
 *   name     the model-language and listing name ("gelu_tanh");
 *   ffn      1: `activation = name` is accepted in a stack block;
 *            0: internal only (the pooler's tanh);
 *   hf_name  the Hugging Face config name written on export ("gelu_new");
 *   ref      act_ref_NAME(x): the C reference, in double (the cpu backend
 *            evaluates in double and rounds once to the element type);
 *   grad     act_grad_ref_NAME(x): its derivative, of the forward INPUT x;
 *   cuda     the CUDA text of act_NAME(float) and actg_NAME(float), the f32
 *            device functions the step's kernels call (compiler/emit_ops.c
 *            puts every row's text in the module preamble).
 *
 * From the rows come both enums, their names, the model-language keyword
 * table (compiler/check_keys.c), the cpu reference dispatch
 * (runtime/cpu/cpu_exec_ops.inc) and the CUDA device functions, so adding
 * an activation is one row here plus its two reference functions.  The
 * GPU tests hold the CUDA text to the C reference within the dtype's
 * tolerance (tests/gpu/gpu_kernels.c). */
#ifndef HPC_PROGRAM_ACTIVATIONS_H
#define HPC_PROGRAM_ACTIVATIONS_H

#include <math.h>

#define ACT_SQRT1_2 0.70710678118654752440     /* 1 / sqrt(2) */
#define ACT_SQRT2_PI 0.79788456080286535588    /* sqrt(2 / pi) */
#define ACT_INV_SQRT_2PI 0.39894228040143267794 /* 1 / sqrt(2 pi) */
#define ACT_GELU_C 0.044715

/* ---- C references (double) ---------------------------------------------- */

static inline double act_ref_gelu(double x) { return 0.5 * x * (1.0 + erf(x * ACT_SQRT1_2)); }

/* d/dx [x Phi(x)] = Phi(x) + x phi(x). */
static inline double act_grad_ref_gelu(double x)
{
    double cdf = 0.5 * (1.0 + erf(x * ACT_SQRT1_2));
    return cdf + x * ACT_INV_SQRT_2PI * exp(-0.5 * x * x);
}

static inline double act_ref_gelu_tanh(double x)
{
    double u = ACT_SQRT2_PI * (x + ACT_GELU_C * x * x * x);
    return 0.5 * x * (1.0 + tanh(u));
}

static inline double act_grad_ref_gelu_tanh(double x)
{
    double u = ACT_SQRT2_PI * (x + ACT_GELU_C * x * x * x);
    double t = tanh(u);
    double du = ACT_SQRT2_PI * (1.0 + 3.0 * ACT_GELU_C * x * x);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
}

/* Derivative 0 at 0, as PyTorch. */
static inline double act_ref_relu(double x) { return x > 0 || x != x ? x : 0; }   /* NaN stays NaN */
static inline double act_grad_ref_relu(double x) { return x <= 0 ? 0 : 1; }   /* NaN x passes dy, as torch */

static inline double act_ref_tanh(double x) { return tanh(x); }
static inline double act_grad_ref_tanh(double x)
{
    double t = tanh(x);
    return 1 - t * t;
}

/* silu(x) = x sigmoid(x) (HF "silu", "swish"); silu' = s (1 + x (1 - s)). */
static inline double act_ref_silu(double x) { return x / (1.0 + exp(-x)); }
static inline double act_grad_ref_silu(double x)
{
    double s = 1.0 / (1.0 + exp(-x));
    return s * (1.0 + x * (1.0 - s));
}

/* ---- the exact GELU on the GPU ------------------------------------------ */

/* gelu_cdf(x, &pdf) returns Phi(x), the standard normal's distribution
 * function, and sets pdf = phi(x), its density; act_gelu and actg_gelu and
 * the fused GELU backward (compiler/emit_ops_act.c) build on it.  Why not
 * erff: CUDA's erff costs about 25 instructions (two polynomials and a
 * select), which made the GELU kernels issue-bound rather than bound by
 * their bytes.  Here, with z = |x| / sqrt 2 and t = 1 / (1 + p z),
 *   Phi(-|x|) = erfc(z) / 2 = t Q(t) exp(-z^2),   exp(-z^2) = exp(-x^2 / 2),
 * Q a degree-5 polynomial fitted (minimax, absolute error of erfc under
 * 1e-8 over z >= 0, p = 0.3905), and the exponential is phi's too: about
 * 13 instructions for both.  In f32 arithmetic Phi is within 2.5e-7 of the
 * exact value and x Phi(x) within 4e-7 absolute, as the erff form's 4.5e-7
 * (scripts/fit_gelu_cdf.py makes the fit and this f32 check).
 *
 * The constants are written once, below, for the CUDA text and for
 * act_gelu_cdf_f32, its twin in C (exact division and exp2f where the GPU
 * has rcp.approx and ex2.approx), which tests/test_cpu_kernels.c holds to
 * the exact erf so that a wrong digit here fails without a GPU. */
#define ACT_GELU_CDF_PX 0.2761251926              /* p / sqrt 2, p = 0.3905 */
#define ACT_GELU_CDF_EXP2 -0.72134752044448170    /* -log2(e) / 2: exp(-x^2 / 2) as 2^(x^2 c) */
#define ACT_GELU_CDF_PDF 0.39894228040143268      /* 1 / sqrt(2 pi) */
#define ACT_GELU_CDF_Q0 1.175812036e-01           /* Q(t) = Q0 + Q1 t + ... + Q5 t^5, 1/2 folded in */
#define ACT_GELU_CDF_Q1 4.742334783e-02
#define ACT_GELU_CDF_Q2 3.203678131e-01
#define ACT_GELU_CDF_Q3 -3.113307953e-01
#define ACT_GELU_CDF_Q4 4.391722083e-01
#define ACT_GELU_CDF_Q5 -1.132137850e-01
#define ACT_STR_(x) #x
#define ACT_F32(x) ACT_STR_(x) "f"   /* a constant above as a CUDA float literal */

static inline float act_gelu_cdf_f32(float x, float *pdf)
{
    const float t = 1.0f / fmaf((float)ACT_GELU_CDF_PX, fabsf(x), 1.0f);
    const float e = exp2f(x * x * (float)ACT_GELU_CDF_EXP2);
    float q = (float)ACT_GELU_CDF_Q5;
    q = fmaf(q, t, (float)ACT_GELU_CDF_Q4);
    q = fmaf(q, t, (float)ACT_GELU_CDF_Q3);
    q = fmaf(q, t, (float)ACT_GELU_CDF_Q2);
    q = fmaf(q, t, (float)ACT_GELU_CDF_Q1);
    q = fmaf(q, t, (float)ACT_GELU_CDF_Q0);
    const float tail = t * q * e;
    *pdf = (float)ACT_GELU_CDF_PDF * e;
    return x >= 0.0f ? 1.0f - tail : tail;
}

/* gelu_cdf's CUDA text under the name NAME (a string: the exported kernels,
 * compiler/emit_kernels.c, give it their suffix so that their header and a
 * step module can share a translation unit). */
#define ACT_GELU_CDF_CUDA(NAME)                                                                     \
    "__device__ __forceinline__ float " NAME "(float x, float *pdf)\n"                              \
    "{\n"                                                                                           \
    "    float t, e;\n"                                                                             \
    "    asm(\"rcp.approx.ftz.f32 %0, %1;\" : \"=f\"(t) : \"f\"(fmaf(" ACT_F32(ACT_GELU_CDF_PX) ", fabsf(x), 1.0f)));\n" \
    "    asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(e) : \"f\"(x * x * " ACT_F32(ACT_GELU_CDF_EXP2) "));\n" \
    "    float q = " ACT_F32(ACT_GELU_CDF_Q5) ";\n"                                                 \
    "    q = fmaf(q, t, " ACT_F32(ACT_GELU_CDF_Q4) ");\n"                                           \
    "    q = fmaf(q, t, " ACT_F32(ACT_GELU_CDF_Q3) ");\n"                                           \
    "    q = fmaf(q, t, " ACT_F32(ACT_GELU_CDF_Q2) ");\n"                                           \
    "    q = fmaf(q, t, " ACT_F32(ACT_GELU_CDF_Q1) ");\n"                                           \
    "    q = fmaf(q, t, " ACT_F32(ACT_GELU_CDF_Q0) ");\n"                                           \
    "    const float tail = t * q * e;   /* Phi(-|x|); NaN for a NaN x */\n"                        \
    "    *pdf = " ACT_F32(ACT_GELU_CDF_PDF) " * e;\n"                                               \
    "    return x >= 0.0f ? 1.0f - tail : tail;\n"                                                  \
    "}\n"
#define ACT_GELU_CUDA                                                                               \
    ACT_GELU_CDF_CUDA("gelu_cdf")                                                                   \
    "__device__ __forceinline__ float act_gelu(float x) { float pdf; return x * gelu_cdf(x, &pdf); }\n" \
    "__device__ __forceinline__ float actg_gelu(float x) { float pdf; float cdf = gelu_cdf(x, &pdf); return cdf + x * pdf; }\n"

/* ---- the table ----------------------------------------------------------- */

#define HPC_ACTIVATIONS(X)                                                                          \
    X(GELU, gelu, 1, "gelu", act_ref_gelu, act_grad_ref_gelu, ACT_GELU_CUDA)                        \
    X(GELU_TANH, gelu_tanh, 1, "gelu_new", act_ref_gelu_tanh, act_grad_ref_gelu_tanh,               \
      "__device__ __forceinline__ float act_gelu_tanh(float x)\n"                                   \
      "{ return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x))); }\n" \
      "__device__ __forceinline__ float actg_gelu_tanh(float x)\n"                                  \
      "{\n    float t = tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x));\n"              \
      "    float du = 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * x * x);\n"                 \
      "    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;\n}\n")                      \
    X(RELU, relu, 1, "relu", act_ref_relu, act_grad_ref_relu,                                       \
      "__device__ __forceinline__ float act_relu(float x) { return x > 0.0f || x != x ? x : 0.0f; }\n" \
      "__device__ __forceinline__ float actg_relu(float x) { return x <= 0.0f ? 0.0f : 1.0f; }\n")  \
    X(TANH, tanh, 0, "tanh", act_ref_tanh, act_grad_ref_tanh,                                       \
      "__device__ __forceinline__ float act_tanh(float x) { return tanhf(x); }\n"                   \
      "__device__ __forceinline__ float actg_tanh(float x) { float t = tanhf(x); return 1.0f - t * t; }\n") \
    X(SILU, silu, 1, "silu", act_ref_silu, act_grad_ref_silu,                                       \
      "__device__ __forceinline__ float act_silu(float x) { return x / (1.0f + expf(-x)); }\n"      \
      "__device__ __forceinline__ float actg_silu(float x)\n"                                       \
      "{ float s = 1.0f / (1.0f + expf(-x)); return s * (1.0f + x * (1.0f - s)); }\n")

/* The CUDA text of every row, one string literal (for the module preamble). */
#define HPC_ACT_CUDA_TEXT_(E, name, ffn, hf, ref, grad, cuda) cuda
#define HPC_ACTIVATIONS_CUDA HPC_ACTIVATIONS(HPC_ACT_CUDA_TEXT_)

#endif

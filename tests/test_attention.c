/* tests/test_attention.c — the fused-attention reference (runtime/cpu/
 * cpu_attention.h) against direct loops and finite differences, the fully
 * masked row, and the CUDA kernels (compiler/kernels/attention*.cu) compiled
 * by NVRTC for sm_80 and sm_90 in fp16 and bf16 at head sizes 64, 32 and 128
 * (the tensor-core variants attn_mma_*, attn_mma2_* and the one-pass
 * backward attn_mma3_bwd).
 * The GPU comparison is tests/gpu/gpu_attention.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_attention.h"
#include "cpu/philox.h"
#include "cuda/nvrtc_compile.h"
#include "emit_attention.h"

static uint64_t rng = 12345;
static double rnd_sym(double a)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return ((double)(rng >> 11) / 9007199254740992.0 * 2 - 1) * a;
}

static double *rand_arr(int64_t n, double a)
{
    double *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = rnd_sym(a);
    return x;
}

/* Direct loops, written from the definition, for one (b, h, q) row at a time. */
static void direct_fwd(double *ctx, double *lse, const double *qkv, const int32_t *mask, const CkAttnShape *s)
{
    int64_t L = s->L, D = s->D, H = s->NH * D, ld = 3 * H;
    double scale = 1.0 / sqrt((double)D);
    double *sc = malloc((size_t)L * sizeof *sc);
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->NH; h++)
            for (int64_t q = 0; q < L; q++) {
                double m = -INFINITY, sum = 0;
                for (int64_t k = 0; k < L; k++) {
                    bool vis = (!mask || mask[b * L + k]) && (!s->causal || k <= q);
                    double d = 0;
                    for (int64_t e = 0; e < D; e++)
                        d += qkv[(b * L + q) * ld + h * D + e] * qkv[(b * L + k) * ld + H + h * D + e];
                    sc[k] = vis ? d * scale : -INFINITY;
                    if (sc[k] > m) m = sc[k];
                }
                for (int64_t k = 0; k < L; k++) sum += sc[k] == -INFINITY ? 0 : exp(sc[k] - m);
                lse[(b * s->NH + h) * L + q] = sum > 0 ? m + log(sum) : INFINITY;
                for (int64_t e = 0; e < D; e++) {
                    double o = 0;
                    for (int64_t k = 0; k < L; k++) {
                        if (sc[k] == -INFINITY) continue;
                        uint64_t idx = (uint64_t)(((b * s->NH + h) * L + q) * L + k);
                        bool keep = s->p == 0 || philox_dropout_keep(s->seed, idx, s->step, s->salt, s->p);
                        double z = keep ? exp(sc[k] - m) / sum / (1.0 - (double)s->p) : 0;
                        o += z * qkv[(b * L + k) * ld + 2 * H + h * D + e];
                    }
                    ctx[(b * L + q) * H + h * D + e] = o;
                }
            }
    free(sc);
}

static double rel_err(const double *a, const double *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static const int32_t mask_2x7[14] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0};

static void fwd_matches_direct(bool causal, float p)
{
    CkAttnShape s = {.B = 2, .L = 7, .NH = 3, .D = 5, .causal = causal, .p = p, .seed = 99, .step = 3, .salt = 17};
    int64_t H = s.NH * s.D, n = s.B * s.L * H;
    double *qkv = rand_arr(3 * n, 2.0), *ctx = calloc((size_t)n, 8), *ref = calloc((size_t)n, 8);
    double lse[2 * 3 * 7], lref[2 * 3 * 7];
    ck_attention_fwd_f64(ctx, lse, qkv, qkv + H, qkv + 2 * H, 3 * H, mask_2x7, &s);
    direct_fwd(ref, lref, qkv, mask_2x7, &s);
    cr_expect_lt(rel_err(ctx, ref, n), 1e-13, "ctx %g", rel_err(ctx, ref, n));
    cr_expect_lt(rel_err(lse, lref, 42), 1e-13, "lse %g", rel_err(lse, lref, 42));
    free(qkv);
    free(ctx);
    free(ref);
}

Test(attention_ref, forward_matches_direct_loops) { fwd_matches_direct(false, 0.0f); }
Test(attention_ref, forward_matches_direct_loops_dropout) { fwd_matches_direct(false, 0.25f); }
Test(attention_ref, forward_matches_direct_loops_causal_dropout) { fwd_matches_direct(true, 0.1f); }

/* loss = sum(ctx * w): its gradient w.r.t. every QKV element by central
 * differences (the dropout mask is fixed by the seed, so the function is smooth). */
Test(attention_ref, backward_matches_finite_differences)
{
    CkAttnShape s = {.B = 2, .L = 7, .NH = 2, .D = 3, .p = 0.2f, .seed = 7, .step = 1, .salt = 5};
    int64_t H = s.NH * s.D, n = s.B * s.L * H, nq = 3 * n;
    double *qkv = rand_arr(nq, 1.5), *w = rand_arr(n, 1.0), *ctx = malloc((size_t)n * 8);
    double *g = calloc((size_t)nq, 8), *fd = malloc((size_t)nq * 8);
    ck_attention_bwd_f64(g, g + H, g + 2 * H, 3 * H, w, qkv, qkv + H, qkv + 2 * H, 3 * H, mask_2x7, &s);
    for (int64_t i = 0; i < nq; i++) {
        double x = qkv[i], h = 1e-5, lp = 0, lm = 0;
        qkv[i] = x + h;
        ck_attention_fwd_f64(ctx, NULL, qkv, qkv + H, qkv + 2 * H, 3 * H, mask_2x7, &s);
        for (int64_t j = 0; j < n; j++) lp += ctx[j] * w[j];
        qkv[i] = x - h;
        ck_attention_fwd_f64(ctx, NULL, qkv, qkv + H, qkv + 2 * H, 3 * H, mask_2x7, &s);
        for (int64_t j = 0; j < n; j++) lm += ctx[j] * w[j];
        qkv[i] = x;
        fd[i] = (lp - lm) / (2 * h);
    }
    double e = rel_err(g, fd, nq);
    cr_expect_lt(e, 1e-7, "gradient vs finite differences: %g", e);
    /* Padding keys (batch row 1, positions 4..6) get no K or V gradient. */
    for (int64_t t = 4; t < 7; t++)
        for (int64_t c = H; c < 3 * H; c++) cr_expect_eq(g[(7 + t) * 3 * H + c], 0.0);
    free(qkv);
    free(w);
    free(ctx);
    free(g);
    free(fd);
}

Test(attention_ref, fully_masked_row_gives_zeros_and_infinite_lse)
{
    CkAttnShape s = {.B = 2, .L = 4, .NH = 2, .D = 4, .p = 0.1f, .seed = 1, .step = 2, .salt = 3};
    int32_t mask[8] = {1, 1, 0, 1, 0, 0, 0, 0};
    int64_t H = 8, n = 2 * 4 * H;
    double *qkv = rand_arr(3 * n, 1.0), *ctx = malloc((size_t)n * 8), *dy = rand_arr(n, 1.0);
    double *g = calloc((size_t)(3 * n), 8), lse[16];
    ck_attention_fwd_f64(ctx, lse, qkv, qkv + H, qkv + 2 * H, 3 * H, mask, &s);
    ck_attention_bwd_f64(g, g + H, g + 2 * H, 3 * H, dy, qkv, qkv + H, qkv + 2 * H, 3 * H, mask, &s);
    for (int64_t i = 0; i < n / 2; i++) cr_expect(isfinite(ctx[i]));
    for (int64_t i = n / 2; i < n; i++) cr_expect_eq(ctx[i], 0.0, "ctx[%lld] = %g", (long long)i, ctx[i]);
    for (int i = 0; i < 8; i++) cr_expect(isfinite(lse[i]));
    for (int i = 8; i < 16; i++) cr_expect(isinf(lse[i]) && lse[i] > 0, "lse[%d] = %g", i, lse[i]);
    for (int64_t i = 3 * n / 2; i < 3 * n; i++) cr_expect_eq(g[i], 0.0);
    free(qkv);
    free(ctx);
    free(dy);
    free(g);
}

/* ---- the CUDA kernels compile ---- */

static void compile_attention(int hidden, int heads, KemitDtype dt, int arch)
{
    ModelSpec spec;
    spec_defaults(&spec);
    spec.stack.hidden = hidden;
    spec.stack.heads = heads;
    KernelConfig kc;
    kemit_config_from_spec(&kc, &spec, dt);
    char *src, suffix[KEMIT_SUFFIX_MAX];
    HpcError err = {0};
    cr_assert_eq(kemit_attention_source(&kc, &src, suffix, &err), HPC_OK, "%s", err.msg);
    cr_expect(strstr(src, "#define HPC_HEAD_DIM ") != NULL);
    cr_expect(strstr(src, "// ---- layernorm.cu ----") == NULL, "only the attention templates");
    void *cubin;
    size_t size;
    cr_assert_eq(nvrtc_compile(src, "attention", arch, NULL, 0, &cubin, &size, NULL, &err), HPC_OK, "%s", err.msg);
    static const char *const bases[] = {"attn_simt_fwd", "attn_simt_bwd_dot", "attn_simt_bwd_dq", "attn_simt_bwd_dkv",
                                        "attn_mma_fwd", "attn_mma_bwd_dq", "attn_mma_bwd_dkv",
                                        "attn_mma2_fwd", "attn_mma2_bwd_dq", "attn_mma2_bwd_dkv",
                                        "attn_head_bwd_dot", "attn_mma3_bwd", "attn_mma3_bwd_r128",
                                        "attn_mma2_fwd_keep", "attn_mma3_bwd_keep"};
    for (int i = 0; i < (int)(sizeof bases / sizeof bases[0]); i++) {
        char name[128];
        kemit_name(suffix, bases[i], name, sizeof name);
        /* v1's dQ kernels and the one-pass backward do not fit 48 KiB of
         * shared memory at D = 128 */
        bool absent = hidden / heads > 64 &&
                      ((strstr(bases[i], "_bwd_dq") && !strstr(bases[i], "mma2")) || strstr(bases[i], "mma3"));
        cr_expect((memmem(cubin, size, name, strlen(name)) != NULL) != absent, "sm_%d cubin: %s %s", arch, name,
                  absent ? "present" : "missing");
    }
    free(cubin);
    free(src);
}

Test(attention_nvrtc, bert_base_f16_sm80) { compile_attention(768, 12, KEMIT_F16, 80); }
Test(attention_nvrtc, bert_base_bf16_sm90) { compile_attention(768, 12, KEMIT_BF16, 90); }
Test(attention_nvrtc, minilm_bf16_sm80) { compile_attention(384, 12, KEMIT_BF16, 80); }
Test(attention_nvrtc, minilm_f16_sm90) { compile_attention(384, 12, KEMIT_F16, 90); }
/* Head size 128: the v2 forward and dQ kernels fall back to one K/V buffer. */
Test(attention_nvrtc, head128_f16_sm80) { compile_attention(768, 6, KEMIT_F16, 80); }
Test(attention_nvrtc, head128_bf16_sm90) { compile_attention(768, 6, KEMIT_BF16, 90); }

Test(attention_nvrtc, head_size_above_the_maximum_is_refused)
{
    ModelSpec spec;
    spec_defaults(&spec);
    spec.stack.hidden = 512;
    spec.stack.heads = 2;
    KernelConfig kc;
    kemit_config_from_spec(&kc, &spec, KEMIT_F16);
    char *src, suffix[KEMIT_SUFFIX_MAX];
    HpcError err = {0};
    cr_expect_eq(kemit_attention_source(&kc, &src, suffix, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "head size 256") != NULL, "%s", err.msg);
}

/* ---- v2's ldmatrix addressing, emulated on the host ----------------------
 * attn_mma2_* take every B fragment of mma.m16n8k16 from ldmatrix.x4, with
 * lane addresses from a2_nk() (stored n x k, no .trans) and a2_kn() (stored
 * k x n, .trans).  Their index math is repeated here (keep in step with
 * compiler/kernels/attention_mma2.cu) and run through a model of ldmatrix (PTX
 * ISA: lanes 8i .. 8i + 7 address rows 0..7 of matrix i; register i of lane
 * l holds row l / 4, columns 2 (l % 4), +1, or with .trans rows 2 (l % 4),
 * +1 of column l / 4).  Each lane must receive exactly the B fragment the
 * mma wants (k 2t..2t+1 and 2t+8.., n g, with g = l / 4, t = l % 4), and
 * every 8-address phase must hit 8 different 16-byte bank groups. */
#define EMU_KT 64

static int emu_nk(int stride, int r0, int c0, int lane)
{
    int i = lane >> 3;
    return (r0 + 8 * (i >> 1) + (lane & 7)) * stride + c0 + 8 * (i & 1);
}

static int emu_kn(int stride, int r0, int c0, int lane)
{
    int i = lane >> 3;
    return (r0 + 8 * (i & 1) + (lane & 7)) * stride + c0 + 8 * (i >> 1);
}

/* reg[lane][i][half]: the elements (as indices into the tile) lane gets. */
static void emu_ldmatrix_x4(const int addr[32], bool trans, int reg[32][4][2])
{
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < 4; i++)
            for (int e = 0; e < 2; e++) {
                int row = trans ? 2 * (l % 4) + e : l / 4, col = trans ? l / 4 : 2 * (l % 4) + e;
                reg[l][i][e] = addr[8 * i + row] + col;
            }
}

static void emu_no_bank_conflict(const int addr[32], int stride, const char *what)
{
    for (int ph = 0; ph < 4; ph++) {
        int seen = 0;
        for (int r = 0; r < 8; r++) {
            cr_assert_eq(addr[8 * ph + r] % 8, 0, "%s: row address not 16-byte aligned", what);
            int group = (addr[8 * ph + r] * 2 / 16) % 8;   /* 128 bytes of banks = 8 groups of 16 */
            seen |= 1 << group;
        }
        cr_expect_eq(seen, 0xFF, "%s stride %d: phase %d shares a bank group", what, stride, ph);
    }
}

static void emu_check_head(int D)
{
    int stride = D + 8;   /* AM_KS */
    int addr[32], reg[32][4][2];
    /* n x k, no .trans: K in Q K^T (n = key, k = d), rows 0..63, columns 0..D-1. */
    for (int np = 0; np < EMU_KT / 16; np++)
        for (int kk = 0; kk < D / 16; kk++) {
            for (int l = 0; l < 32; l++) addr[l] = emu_nk(stride, 16 * np, 16 * kk, l);
            emu_no_bank_conflict(addr, stride, "nk");
            emu_ldmatrix_x4(addr, false, reg);
            for (int l = 0; l < 32; l++) {
                int g = l / 4, t = l % 4;
                for (int i = 0; i < 4; i++)
                    for (int e = 0; e < 2; e++) {
                        int n = 16 * np + 8 * (i >> 1) + g, k = 16 * kk + 2 * t + e + 8 * (i & 1);
                        cr_assert_eq(reg[l][i][e], n * stride + k, "D%d nk np%d kk%d lane %d reg %d.%d", D, np, kk,
                                     l, i, e);
                    }
            }
        }
    /* k x n with .trans: V in P V (k = key, n = d). */
    for (int kc = 0; kc < EMU_KT / 16; kc++)
        for (int np = 0; np < D / 16; np++) {
            for (int l = 0; l < 32; l++) addr[l] = emu_kn(stride, 16 * kc, 16 * np, l);
            emu_no_bank_conflict(addr, stride, "kn");
            emu_ldmatrix_x4(addr, true, reg);
            for (int l = 0; l < 32; l++) {
                int g = l / 4, t = l % 4;
                for (int i = 0; i < 4; i++)
                    for (int e = 0; e < 2; e++) {
                        int n = 16 * np + 8 * (i >> 1) + g, k = 16 * kc + 2 * t + e + 8 * (i & 1);
                        cr_assert_eq(reg[l][i][e], k * stride + n, "D%d kn kc%d np%d lane %d reg %d.%d", D, kc, np,
                                     l, i, e);
                    }
            }
        }
}

/* attn_mma3_bwd's two A fragments (m16n8k16: lane l, g = l / 4, t = l % 4,
 * register i holds row g + 8 (i & 1), columns 2t + 8 (i >> 1), +1):
 *  - K rows of the warp, stored (key x d) with stride D + 8, by a2_kn
 *    without .trans;
 *  - dS (query x key) for dQ = dS K, from dS^T stored (key x query) with
 *    stride 32 + 8, by a2_nk (its stride argument) with .trans. */
static void emu_check_one_pass(int D)
{
    int addr[32], reg[32][4][2];
    for (int k0 = 0; k0 < 128; k0 += 16)
        for (int kk = 0; kk < D / 16; kk++) {
            for (int l = 0; l < 32; l++) addr[l] = emu_kn(D + 8, k0, 16 * kk, l);
            emu_no_bank_conflict(addr, D + 8, "K as A");
            emu_ldmatrix_x4(addr, false, reg);
            for (int l = 0; l < 32; l++)
                for (int i = 0; i < 4; i++)
                    for (int e = 0; e < 2; e++) {
                        int m = l / 4 + 8 * (i & 1), k = 2 * (l % 4) + e + 8 * (i >> 1);
                        cr_assert_eq(reg[l][i][e], (k0 + m) * (D + 8) + 16 * kk + k, "D%d K as A k0 %d lane %d", D,
                                     k0, l);
                    }
        }
    const int dss = 32 + 8;
    for (int kc = 0; kc < 8; kc++)
        for (int mq = 0; mq < 32; mq += 16) {
            for (int l = 0; l < 32; l++) addr[l] = emu_nk(dss, 16 * kc, mq, l);
            emu_no_bank_conflict(addr, dss, "dS^T as A");
            emu_ldmatrix_x4(addr, true, reg);
            for (int l = 0; l < 32; l++)
                for (int i = 0; i < 4; i++)
                    for (int e = 0; e < 2; e++) {
                        int m = l / 4 + 8 * (i & 1), k = 2 * (l % 4) + e + 8 * (i >> 1);
                        cr_assert_eq(reg[l][i][e], (16 * kc + k) * dss + mq + m, "dS as A kc %d mq %d lane %d", kc,
                                     mq, l);
                    }
        }
}

Test(attention_v3_layout, one_pass_a_fragments_d32) { emu_check_one_pass(32); }
Test(attention_v3_layout, one_pass_a_fragments_d64) { emu_check_one_pass(64); }

Test(attention_v2_layout, ldmatrix_fragments_and_banks_d32) { emu_check_head(32); }
Test(attention_v2_layout, ldmatrix_fragments_and_banks_d64) { emu_check_head(64); }
Test(attention_v2_layout, ldmatrix_fragments_and_banks_d128) { emu_check_head(128); }

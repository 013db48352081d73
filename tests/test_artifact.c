/* tests/test_artifact.c — program/artifact.h: the resolved model text
 * round-trips every shipped model, the container round-trips its sections,
 * and damaged files fail with their messages. */
#include <criterion/criterion.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "program/artifact.h"
#include "compiler/artifact_spec.h"
#include "program/spec.h"
#include "compiler/spec_load.h"
#include "summary.h"

/* The text after its first (comment) line, which names the source. */
static const char *body(const char *text) { return strchr(text, '\n') + 1; }

Test(artifact, model_text_round_trips_every_model)
{
    const char *root = getenv("HPC_ROOT");
    char pattern[512];
    snprintf(pattern, sizeof pattern, "%s/models/*.model", root ? root : ".");
    glob_t gl;
    cr_assert_eq(glob(pattern, 0, NULL, &gl), 0);
    for (size_t i = 0; i < gl.gl_pathc; i++) {
        ModelSpec a, b;
        cr_assert_eq(spec_load(gl.gl_pathv[i], &a, stderr), 0);
        char *t1 = artifact_model_text(&a);
        cr_assert_eq(spec_load_string("resolved", t1, strlen(t1), NULL, &b, stderr), 0, "%s:\n%s",
                     gl.gl_pathv[i], t1);
        char *t2 = artifact_model_text(&b);
        cr_expect_str_eq(body(t1), body(t2), "%s", gl.gl_pathv[i]);
        cr_expect_str_eq(a.name, b.name);
        cr_expect_eq(summary_param_count(&a), summary_param_count(&b));
        cr_expect_eq(a.train.lr, b.train.lr);
        cr_expect_eq(a.stack.ln_eps, b.stack.ln_eps);
        cr_expect_eq(a.train.warmup_ratio, b.train.warmup_ratio);
        cr_expect_eq(a.train.warmup_steps, b.train.warmup_steps);
        cr_expect_eq(a.head.kind, b.head.kind);
        cr_expect_eq(a.stack.attention, b.stack.attention);
        free(t1);
        free(t2);
    }
    globfree(&gl);
}

Test(artifact, container_round_trips)
{
    char path[] = "/tmp/hpc_artifact_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    Artifact a = {.policy = PREC_BF16, .model_text = "model m { encoder { vocab = 100 max_positions = 64 "
                  "hidden = 32 layers = 1 heads = 2 ffn = 64 } }\n",
                  .plan_text = "plan\n@@ not a section\n", .cuda_source = "extern \"C\" __global__ void k() {}"};
    snprintf(a.name, sizeof a.name, "m");
    HpcError err = {0};
    cr_assert_eq(artifact_write(path, &a, &err), HPC_OK, "%s", err.msg);
    Artifact b;
    cr_assert_eq(artifact_read(path, &b, &err), HPC_OK, "%s", err.msg);
    cr_expect_str_eq(b.name, "m");
    cr_expect_eq(b.policy, PREC_BF16);
    cr_expect_str_eq(b.model_text, a.model_text);
    cr_expect_str_eq(b.plan_text, a.plan_text);
    cr_expect_str_eq(b.cuda_source, a.cuda_source);
    artifact_free(&b);
    ModelSpec s;
    SpecPrecision p;
    cr_expect_eq(artifact_load_spec(path, &s, &p, stderr, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(s.stack.hidden, 32);
    cr_expect_eq(p, PREC_BF16);
    /* Truncate inside the cuda section. */
    FILE *f = fopen(path, "r+");
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fclose(f);
    cr_assert_eq(truncate(path, len - 10), 0);
    cr_expect_eq(artifact_read(path, &b, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "truncated section") != NULL, "%s", err.msg);
    f = fopen(path, "w");
    fputs("HPCART 99\nname m\npolicy fp16\n", f);
    fclose(f);
    cr_expect_eq(artifact_read(path, &b, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "format version 99, this hpc reads version 2") != NULL, "%s", err.msg);
    f = fopen(path, "w");
    fputs("HPCART 2\nname m\npolicy fp12\n", f);
    fclose(f);
    cr_expect_eq(artifact_read(path, &b, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "unknown precision policy 'fp12'") != NULL, "%s", err.msg);
    f = fopen(path, "w");
    fputs("HPCART 2\nname m\npolicy fp16\n@@ model 3\nabc\n@@ extra 1\nx\n", f);
    fclose(f);
    cr_expect_eq(artifact_read(path, &b, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "unknown section 'extra'") != NULL, "%s", err.msg);
    f = fopen(path, "w");
    fputs("model m {}\n", f);
    fclose(f);
    cr_expect_eq(artifact_read(path, &b, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "not an hpc artifact") != NULL, "%s", err.msg);
    remove(path);
}

Test(artifact, path_for_names)
{
    char buf[64];
    artifact_path_for("bert_base", buf, sizeof buf);
    cr_expect_str_eq(buf, "bert_base.hpc");
    artifact_path_for("a b/c", buf, sizeof buf);
    cr_expect_str_eq(buf, "a_b_c.hpc");
}

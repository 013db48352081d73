/* tests/test_artifact_repro.c — `hpc compile` is byte-reproducible: two
 * compiles of one model give identical NAME.hpc files.  The attribute
 * bytes of the graph's nodes used to carry struct padding from the
 * compiler's stack and heap (program/step_program.c, attr_canonical), so
 * the backward MATMUL lines differed from run to run.  Separate processes,
 * so address-space randomisation puts different bytes in any padding. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int hpc(const char *args)
{
    const char *root = getenv("HPC_ROOT") ? getenv("HPC_ROOT") : ".";
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cd %s && bin/hpc %s >/dev/null 2>&1", root, args);
    int status = system(cmd);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    cr_assert_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return buf;
}

static void compile_twice_same(const char *model, const char *flags)
{
    char dir[] = "/tmp/hpc_repro_XXXXXX", args[1024], p1[256], p2[256];
    cr_assert(mkdtemp(dir));
    snprintf(p1, sizeof p1, "%s/a.hpc", dir);
    snprintf(p2, sizeof p2, "%s/b.hpc", dir);
    snprintf(args, sizeof args, "compile models/%s.model %s -o %s", model, flags, p1);
    cr_assert_eq(hpc(args), 0, "hpc %s failed", args);
    snprintf(args, sizeof args, "compile models/%s.model %s -o %s", model, flags, p2);
    cr_assert_eq(hpc(args), 0, "hpc %s failed", args);
    size_t n1, n2;
    char *a = slurp(p1, &n1), *b = slurp(p2, &n2);
    cr_expect_gt(n1, 1000, "%s: artifact of %zu bytes", model, n1);
    size_t at = 0;
    while (at < n1 && at < n2 && a[at] == b[at]) at++;
    cr_expect(n1 == n2 && at == n1, "%s %s: the two artifacts differ at byte %zu (sizes %zu, %zu)",
              model, flags, at, n1, n2);
    free(a);
    free(b);
    unlink(p1);
    unlink(p2);
    rmdir(dir);
}

Test(artifact_repro, bert_tiny_fp32_and_fp16)
{
    compile_twice_same("bert_tiny", "");
    compile_twice_same("bert_tiny", "--fp16");
}

Test(artifact_repro, gpt2_small_fp16)   /* causal attention, another graph */
{
    compile_twice_same("gpt2_small", "--fp16");
}

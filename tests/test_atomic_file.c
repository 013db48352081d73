/* tests/test_atomic_file.c — atomic replacement: the target holds either
 * the old or the new content, never a mix, even when the writer is killed
 * with SIGKILL in the middle; failures leave no temporary file behind. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "formats/atomic_file.h"
#include "cpu/philox.h"
#include "formats/safetensors.h"

static char *make_dir(void)
{
    char *dir = malloc(128);
    snprintf(dir, 128, "/tmp/hpc_test_atomic_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    return dir;
}

static char *join(const char *dir, const char *name)
{
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

static char *read_all(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    *n = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc(*n + 1);
    cr_assert_eq(fread(buf, 1, *n, fp), *n);
    buf[*n] = '\0';
    fclose(fp);
    return buf;
}

/* Number of leftover temporary files (".NAME.tmp-*") in dir; the size of
 * the last one found goes to *size. */
static int count_temps(const char *dir, off_t *size)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp-")) {
            n++;
            if (size) {
                char *p = join(dir, e->d_name);
                struct stat st;
                if (stat(p, &st) == 0) *size = st.st_size;
                free(p);
            }
        }
    closedir(d);
    return n;
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            char *p = join(dir, e->d_name);
            unlink(p);
            free(p);
        }
    closedir(d);
    rmdir(dir);
}

Test(atomic_file, writes_and_replaces)
{
    char *dir = make_dir(), *path = join(dir, "f.bin");
    HpcError err = {0};
    cr_assert_eq(atomic_write_file(path, "first version", 13, &err), HPC_OK, "%s", err.msg);
    chmod(path, 0640);
    cr_assert_eq(atomic_write_file(path, "second", 6, &err), HPC_OK, "%s", err.msg);
    size_t n;
    char *got = read_all(path, &n);
    cr_expect_eq(n, 6u);
    cr_expect_str_eq(got, "second");
    struct stat st;
    stat(path, &st);
    cr_expect_eq(st.st_mode & 0777, 0640, "permissions of the replaced file are kept");
    cr_expect_eq(count_temps(dir, NULL), 0);
    free(got);
    remove_dir(dir);
    free(path);
    free(dir);
}

Test(atomic_file, abort_keeps_old_and_cleans_up)
{
    char *dir = make_dir(), *path = join(dir, "f.bin");
    HpcError err = {0};
    cr_assert_eq(atomic_write_file(path, "old", 3, &err), HPC_OK);
    AtomicFile af;
    cr_assert_eq(atomic_open(&af, path, &err), HPC_OK);
    cr_assert_eq(atomic_write(&af, "new content", 11, &err), HPC_OK);
    cr_expect_eq(count_temps(dir, NULL), 1, "the temporary file lives beside the target");
    atomic_abort(&af);
    size_t n;
    char *got = read_all(path, &n);
    cr_expect_str_eq(got, "old");
    cr_expect_eq(count_temps(dir, NULL), 0);
    free(got);
    remove_dir(dir);
    free(path);
    free(dir);
}

Test(atomic_file, bad_targets_fail_cleanly)
{
    HpcError err = {0};
    cr_expect_eq(atomic_write_file("/nonexistent-hpc-dir/x", "x", 1, &err), HPC_ERR_IO);
    cr_expect(strstr(err.msg, "/nonexistent-hpc-dir/x") && strstr(err.msg, "No such file"), "%s", err.msg);
    char *dir = make_dir();
    cr_expect_eq(atomic_write_file(dir, "x", 1, &err), HPC_ERR_IO);
    cr_expect(strstr(err.msg, "is a directory"), "%s", err.msg);
    char *sub = join(dir, "sub/");
    cr_expect_eq(atomic_write_file(sub, "x", 1, &err), HPC_ERR_IO);
    cr_expect_eq(count_temps(dir, NULL), 0);
    free(sub);
    remove_dir(dir);
    free(dir);
}

Test(atomic_file, relative_path_without_directory)
{
    char *dir = make_dir();
    char cwd[4096];
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    cr_assert_eq(chdir(dir), 0);
    HpcError err = {0};
    cr_expect_eq(atomic_write_file("plain.bin", "abc", 3, &err), HPC_OK, "%s", err.msg);
    size_t n;
    char *got = read_all("plain.bin", &n);
    cr_expect_str_eq(got, "abc");
    free(got);
    cr_assert_eq(chdir(cwd), 0);
    remove_dir(dir);
    free(dir);
}

/* The old checkpoint: a valid safetensors file with random weights. */
static float *write_old_checkpoint(const char *path, int64_t n)
{
    float *w = malloc((size_t)n * sizeof *w);   // (n) f32
    for (int64_t i = 0; i < n; i++) w[i] = philox_normal(3, (uint64_t)i, 1);
    StWriter sw;
    st_writer_init(&sw);
    HpcError err = {0};
    cr_assert_eq(st_writer_add(&sw, "w", ST_F32, 1, &n, w, &err), HPC_OK);
    cr_assert_eq(st_writer_save(&sw, path, &err), HPC_OK, "%s", err.msg);
    st_writer_free(&sw);
    return w;
}

static void expect_old_checkpoint(const char *path, const float *w, int64_t n)
{
    StFile *f;
    HpcError err = {0};
    cr_assert_eq(st_open(path, &f, &err), HPC_OK, "old checkpoint no longer loads: %s", err.msg);
    const StTensor *t = st_find(f, "w");
    cr_assert(t && t->numel == (uint64_t)n, "old checkpoint changed shape");
    cr_expect_eq(memcmp(t->data, w, (size_t)n * sizeof *w), 0, "old checkpoint's data changed");
    st_close(f);
}

/* Deterministic: the child writes half of a large file, tells the parent,
 * and waits; the parent kills it with SIGKILL mid-write. */
Test(atomic_file, sigkill_mid_write_keeps_old_file)
{
    char *dir = make_dir(), *path = join(dir, "ckpt.safetensors");
    int64_t n = 1000;
    float *w = write_old_checkpoint(path, n);
    int ready[2];
    cr_assert_eq(pipe(ready), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        AtomicFile af;
        HpcError err;
        static char chunk[1 << 20];
        memset(chunk, 0x5a, sizeof chunk);
        if (atomic_open(&af, path, &err)) _exit(2);
        for (int i = 0; i < 32; i++)
            if (atomic_write(&af, chunk, sizeof chunk, &err)) _exit(3);
        if (write(ready[1], "h", 1) != 1) _exit(4);
        pause();   /* killed here, half way through a 64 MiB file */
        for (int i = 0; i < 32; i++) atomic_write(&af, chunk, sizeof chunk, &err);
        atomic_commit(&af, &err);
        _exit(0);
    }
    char c;
    cr_assert_eq(read(ready[0], &c, 1), 1, "child failed before the handshake");
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    off_t tmp_size = 0;
    cr_expect_eq(count_temps(dir, &tmp_size), 1, "the killed writer's temporary file remains beside it");
    cr_expect_eq(tmp_size, (off_t)32 << 20, "the child was killed after 32 MiB");
    expect_old_checkpoint(path, w, n);
    close(ready[0]);
    close(ready[1]);
    free(w);
    remove_dir(dir);
    free(path);
    free(dir);
}

/* Realistic: the child saves a 256 MiB checkpoint with st_writer_save; the
 * parent kills it as soon as the temporary file has started to grow. */
Test(atomic_file, sigkill_during_st_writer_save_keeps_old_file, .timeout = 60)
{
    char *dir = make_dir(), *path = join(dir, "ckpt.safetensors");
    int64_t n = 1000;
    float *w = write_old_checkpoint(path, n);
    int64_t big = (int64_t)64 << 20;  /* 64 Mi floats = 256 MiB */
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        float *x = malloc((size_t)big * sizeof *x);
        if (!x) _exit(2);
        memset(x, 0x3f, (size_t)big * sizeof *x);
        StWriter sw;
        HpcError err;
        st_writer_init(&sw);
        st_writer_add(&sw, "w", ST_F32, 1, &big, x, &err);
        _exit(st_writer_save(&sw, path, &err) ? 3 : 0);
    }
    off_t tmp_size = 0;
    struct timespec pause_1ms = {0, 1000000};
    for (int i = 0; i < 20000 && tmp_size < ((off_t)1 << 20); i++) {
        if (count_temps(dir, &tmp_size) == 0) tmp_size = 0;
        if (waitpid(pid, NULL, WNOHANG) == pid) cr_assert_fail("child finished before it could be killed");
        nanosleep(&pause_1ms, NULL);
    }
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    cr_assert(WIFSIGNALED(status), "child was not killed (exit %d)", WEXITSTATUS(status));
    count_temps(dir, &tmp_size);
    cr_expect(tmp_size < big * 4, "temporary file was complete (%lld bytes)", (long long)tmp_size);
    expect_old_checkpoint(path, w, n);
    free(w);
    remove_dir(dir);
    free(path);
    free(dir);
}

/* ---- the rest of the output discipline (runtime/formats/output_check.h) ---- */

#include "formats/output_check.h"

Test(output_check, the_same_file_by_any_name_is_refused)
{
    char *dir = make_dir(), *in = join(dir, "model.model"), *hard = join(dir, "hard"), *sym = join(dir, "sym"),
         *other = join(dir, "other"), *dotted = join(dir, "./model.model");
    FILE *f = fopen(in, "w");
    fputs("model m { }\n", f);
    fclose(f);
    cr_assert_eq(link(in, hard), 0);
    cr_assert_eq(symlink(in, sym), 0);
    OutputInput inputs[] = {{"the training data", NULL}, {"the model file", in}};
    HpcError err = {0};
    const char *same[] = {in, hard, sym, dotted};
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(output_check_not_input("-o", same[i], inputs, 2, &err), HPC_ERR_USAGE, "%s", same[i]);
        cr_expect(strstr(err.msg, "-o ") && strstr(err.msg, "that is the model file") && strstr(err.msg, in), "%s",
                  err.msg);
    }
    cr_expect_eq(output_check_not_input("-o", other, inputs, 2, &err), HPC_OK, "a new file is no input");
    f = fopen(other, "w");
    fclose(f);
    cr_expect_eq(output_check_not_input("-o", other, inputs, 2, &err), HPC_OK, "another file is no input");
    cr_expect(!output_same_file(in, NULL) && output_same_file(sym, hard));
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
    free(in), free(hard), free(sym), free(other), free(dotted), free(dir);
}

Test(output_check, unwritable_places_are_found_before_any_work)
{
    char *dir = make_dir(), *file = join(dir, "file"), *under = join(dir, "file/out.tsv"),
         *missing = join(dir, "no/such/out.tsv"), *ok = join(dir, "out.tsv");
    FILE *f = fopen(file, "w");
    fclose(f);
    HpcError err = {0};
    cr_expect_eq(output_check_writable("--predict", ok, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(output_check_writable("--predict", dir, &err), HPC_ERR_IO);
    cr_expect(strstr(err.msg, "that is a folder; give a file name") != NULL, "%s", err.msg);
    cr_expect_eq(output_check_writable("--predict", under, &err), HPC_ERR_IO);
    cr_expect(strstr(err.msg, "is a file, not a folder") != NULL, "%s", err.msg);
    cr_expect_eq(output_check_writable("--predict", missing, &err), HPC_ERR_IO);
    cr_expect(strstr(err.msg, "does not exist") != NULL, "%s", err.msg);
    /* a read-only folder; root ignores the mode bits, so this part needs another user */
    if (geteuid() != 0) {
        cr_assert_eq(chmod(dir, 0555), 0);
        cr_expect_eq(output_check_writable("--predict", ok, &err), HPC_ERR_IO);
        cr_expect(strstr(err.msg, "cannot create files in") != NULL, "%s", err.msg);
        chmod(dir, 0755);
    }
    /* the probe leaves nothing behind */
    DIR *d = opendir(dir);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d));) entries += e->d_name[0] != '.';
    closedir(d);
    cr_expect_eq(entries, 1, "only 'file' should be there");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
    free(file), free(under), free(missing), free(ok), free(dir);
}

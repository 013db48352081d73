/* runtime/train/checkpoint_fs.c — see checkpoint_fs.h. */
#include "train/checkpoint_fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/atomic_file.h"
#include "num_parse.h"

#define STEP_PREFIX "step-"

void ckfs_step_name(int64_t step, char *out, size_t cap)
{
    snprintf(out, cap, STEP_PREFIX "%08lld", (long long)step);
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* mkdir -p */
static HpcStatus make_dirs(const char *path, HpcError *err)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return hpc_fail(err, HPC_ERR_USAGE, "checkpoint: path too long: %.200s", path);
    for (char *p = buf + 1;; p++) {
        bool end = *p == '\0';
        if (*p == '/' || end) {
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return hpc_fail(err, HPC_ERR_IO, "checkpoint: mkdir %s: %s; check that the parent is "
                                "writable", buf, strerror(errno));
            if (!is_dir(buf))
                return hpc_fail(err, HPC_ERR_IO, "checkpoint: %s exists and is not a directory", buf);
            if (end) break;
            *p = '/';
        }
    }
    return HPC_OK;
}

static HpcStatus sync_dir(const char *path, HpcError *err)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return hpc_fail(err, HPC_ERR_IO, "checkpoint: open directory %s: %s", path, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL)   /* some file systems cannot sync directories */
        return hpc_fail(err, HPC_ERR_IO, "checkpoint: fsync %s: %s", path, strerror(e));
    return HPC_OK;
}

HpcStatus ckfs_begin(const char *root, int64_t step, char *tmp, size_t cap, HpcError *err)
{
    HpcStatus st = make_dirs(root, err);
    if (st) return st;
    char name[64];
    ckfs_step_name(step, name, sizeof name);
    if (snprintf(tmp, cap, "%s/.%s.tmp-XXXXXX", root, name) >= (int)cap)
        return hpc_fail(err, HPC_ERR_USAGE, "checkpoint: path too long: %.200s", root);
    if (!mkdtemp(tmp))
        return hpc_fail(err, HPC_ERR_IO, "checkpoint: cannot create a step directory in %s: %s; check that it is writable", root,
                        strerror(errno));
    return HPC_OK;
}

#define LOCK_NAME ".lock"

/* The pid a lock file names, for the message; 0 when unreadable. */
static long lock_holder(int fd)
{
    char buf[32] = "";
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    return n > 0 ? strtol(buf, NULL, 10) : 0;
}

/* Creating and removing a directory proves that a save can create files,
 * whatever the permission bits say (root ignores them, a read-only mount
 * does not). */
static HpcStatus probe_writable(const char *root, HpcError *err)
{
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.probe.tmp-XXXXXX", root);
    if (!mkdtemp(probe))
        return hpc_fail(err, HPC_ERR_IO, "checkpoint directory %s is not writable: %s; give a --checkpoint-dir "
                        "you can write to", root, strerror(errno));
    rmdir(probe);
    return HPC_OK;
}

HpcStatus ckfs_lock(const char *root, int *fd, HpcError *err)
{
    *fd = -1;
    HpcStatus st = make_dirs(root, err);
    if (!st) st = probe_writable(root, err);
    if (st) return st;
    char path[4200];
    snprintf(path, sizeof path, "%s/" LOCK_NAME, root);
    int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (f < 0)
        return hpc_fail(err, HPC_ERR_IO, "checkpoint directory %s: cannot create the lock %s: %s", root, path,
                        strerror(errno));
    if (flock(f, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        long pid = lock_holder(f);
        close(f);
        if (e == EWOULDBLOCK)
            return hpc_fail(err, HPC_ERR_USAGE, "checkpoint directory %s is in use by another hpc run (pid %ld, "
                            "lock %s); wait for it to end or give another --checkpoint-dir", root, pid, path);
        return hpc_fail(err, HPC_ERR_IO, "checkpoint directory %s: cannot lock %s: %s", root, path, strerror(e));
    }
    char line[32];
    int n = snprintf(line, sizeof line, "%ld\n", (long)getpid());
    if (ftruncate(f, 0) != 0 || pwrite(f, line, (size_t)n, 0) != n) {
        int e = errno;
        close(f);
        return hpc_fail(err, HPC_ERR_IO, "checkpoint directory %s: cannot write the lock %s: %s; check the disk "
                        "space", root, path, strerror(e));
    }
    *fd = f;
    return HPC_OK;
}

void ckfs_unlock(int fd)
{
    if (fd >= 0) close(fd);   /* closing drops the flock */
}

/* Removes the regular files directly inside path, then path itself. */
static void remove_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        char f[4096];
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
        snprintf(f, sizeof f, "%s/%s", path, e->d_name);
        if (is_file(f)) unlink(f);
    }
    closedir(d);
    rmdir(path);
}

void ckfs_discard(const char *tmp) { remove_dir(tmp); }

/* tmp -> final; when final exists, swap the two atomically so that final
 * is at every moment a complete step directory, then drop the old one. */
static HpcStatus move_into_place(const char *tmp, const char *final, HpcError *err)
{
    if (rename(tmp, final) == 0) return HPC_OK;
    if (errno != ENOTEMPTY && errno != EEXIST)
        return hpc_fail(err, HPC_ERR_IO, "checkpoint: rename %s -> %s: %s", tmp, final, strerror(errno));
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) != 0)
        return hpc_fail(err, HPC_ERR_IO, "checkpoint: exchange %s <-> %s: %s; the file system must support "
                        "renameat2 RENAME_EXCHANGE to replace a step directory (or remove %s)", tmp, final,
                        strerror(errno), final);
    remove_dir(tmp);   /* now the previous content of final */
    return HPC_OK;
}

HpcStatus ckfs_commit(const char *root, const char *tmp, int64_t step, HpcError *err)
{
    char name[64], final[4096], latest[4096], line[80];
    ckfs_step_name(step, name, sizeof name);
    snprintf(final, sizeof final, "%s/%s", root, name);
    snprintf(latest, sizeof latest, "%s/latest", root);
    HpcStatus st = sync_dir(tmp, err);
    if (!st) st = move_into_place(tmp, final, err);
    if (!st) st = sync_dir(root, err);
    int n = snprintf(line, sizeof line, "%s\n", name);
    if (!st) st = atomic_write_file(latest, line, (size_t)n, err);
    return st;
}

/* step number of a "step-N" name, or -1. */
static int64_t step_of(const char *name)
{
    if (strncmp(name, STEP_PREFIX, strlen(STEP_PREFIX)) != 0) return -1;
    const char *s = name + strlen(STEP_PREFIX);
    uint64_t v;
    return num_uint(s, INT64_MAX, &v) == NUM_OK ? (int64_t)v : -1;
}

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Hidden leftovers of killed writers: ".step-N.tmp-*" directories and
 * atomic_file's ".latest.tmp-*". */
static void remove_leftover(const char *root, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, name);
    if (strncmp(name, "." STEP_PREFIX, strlen(STEP_PREFIX) + 1) == 0 && strstr(name, ".tmp-") && is_dir(path))
        remove_dir(path);
    else if (strncmp(name, ".latest.tmp-", 12) == 0 && is_file(path))
        unlink(path);
}

void ckfs_prune(const char *root, int64_t current, int keep)
{
    DIR *d = opendir(root);
    if (!d) return;
    int64_t *steps = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        remove_leftover(root, e->d_name);
        int64_t s = step_of(e->d_name);
        if (s < 0 || s == current) continue;
        if (n == cap) steps = xrealloc(steps, (cap = cap ? 2 * cap : 16) * sizeof *steps);
        steps[n++] = s;
    }
    closedir(d);
    if (n) qsort(steps, n, sizeof *steps, cmp_desc);   /* steps is NULL when n == 0 */
    for (size_t i = keep > 1 ? (size_t)keep - 1 : 0; i < n; i++) {
        char name[64], path[4096];
        ckfs_step_name(steps[i], name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", root, name);
        remove_dir(path);
    }
    free(steps);
}

/* The first line of root/latest, checked to be a step directory name. */
static HpcStatus read_latest(const char *root, char *name, size_t cap, HpcError *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/latest", root);
    FILE *f = fopen(path, "r");
    if (!f)
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s is not a checkpoint (no state.json and no latest "
                        "file: %s); give a directory that --checkpoint-dir wrote", root, strerror(errno));
    char line[128] = "";
    bool ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    line[strcspn(line, "\r\n")] = '\0';
    if (!ok || step_of(line) < 0 || strlen(line) >= cap)
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s holds \"%.60s\", not a step-N directory name",
                        path, line);
    snprintf(name, cap, "%s", line);
    return HPC_OK;
}

HpcStatus ckfs_resolve(const char *dir, char *out, size_t cap, HpcError *err)
{
    char path[4096], name[128];
    snprintf(path, sizeof path, "%s/state.json", dir);
    if (is_file(path)) {
        if (snprintf(out, cap, "%s", dir) >= (int)cap)
            return hpc_fail(err, HPC_ERR_USAGE, "checkpoint: path too long: %.200s", dir);
        return HPC_OK;
    }
    if (!is_dir(dir))
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s: no such directory", dir);
    HpcStatus st = read_latest(dir, name, sizeof name, err);
    if (st) return st;
    if (snprintf(out, cap, "%s/%s", dir, name) >= (int)cap)
        return hpc_fail(err, HPC_ERR_USAGE, "checkpoint: path too long: %.200s", dir);
    snprintf(path, sizeof path, "%s/state.json", out);
    if (!is_file(path))
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s/latest names %s, which has no state.json; the "
                        "directory was changed by hand (point --resume at a complete step-N directory)",
                        dir, name);
    return HPC_OK;
}

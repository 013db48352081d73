/* runtime/formats/atomic_file.c — see atomic_file.h. */
#include "formats/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Splits path into a directory ("." when none) and a base name. */
static void split_path(const char *path, char **dir, const char **base)
{
    const char *slash = strrchr(path, '/');
    if (!slash) {
        *dir = xstrdup(".");
        *base = path;
        return;
    }
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    *dir = xmalloc(n + 1);
    memcpy(*dir, path, n);
    (*dir)[n] = '\0';
    *base = slash + 1;
}

static void release(AtomicFile *af)
{
    if (af->fd >= 0) close(af->fd);
    af->fd = -1;
    free(af->path);
    free(af->tmp_path);
    af->path = af->tmp_path = NULL;
}

HpcStatus atomic_open(AtomicFile *af, const char *path, HpcError *err)
{
    memset(af, 0, sizeof *af);
    af->fd = -1;
    char *dir;
    const char *base;
    split_path(path, &dir, &base);
    struct stat st;
    mode_t mode = 0644;
    int exists = stat(path, &st) == 0;
    if (*base == '\0' || (exists && S_ISDIR(st.st_mode))) {
        free(dir);
        return hpc_fail(err, HPC_ERR_IO, "write %s: is a directory; give a file name", path);
    }
    if (exists) mode = st.st_mode & 07777;
    size_t n = strlen(dir) + strlen(base) + 16;
    af->tmp_path = xmalloc(n);
    snprintf(af->tmp_path, n, "%s/.%s.tmp-XXXXXX", dir, base);
    free(dir);
    af->fd = mkstemp(af->tmp_path);
    if (af->fd < 0) {
        int e = errno;
        hpc_fail(err, HPC_ERR_IO, "write %s: cannot create a temporary file beside it (%s): %s; "
                 "check that the directory exists and is writable", path, af->tmp_path, strerror(e));
        release(af);
        return HPC_ERR_IO;
    }
    /* Failure is not fatal: the file is still written, with mkstemp's 0600. */
    (void)fchmod(af->fd, mode);
    af->path = xstrdup(path);
    return HPC_OK;
}

HpcStatus atomic_write(AtomicFile *af, const void *data, size_t n, HpcError *err)
{
    HPC_ASSERT(af->fd >= 0);
    const char *p = data;
    while (n > 0) {
        size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        ssize_t w = write(af->fd, p, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            return hpc_fail(err, HPC_ERR_IO, "write %s (temporary %s) after %llu bytes: %s; "
                            "the previous %s is unchanged", af->path, af->tmp_path,
                            (unsigned long long)af->written, strerror(e), af->path);
        }
        p += w;
        n -= (size_t)w;
        af->written += (uint64_t)w;
    }
    return HPC_OK;
}

void atomic_abort(AtomicFile *af)
{
    if (af->tmp_path) unlink(af->tmp_path);
    release(af);
}

/* fsync on the directory makes the rename itself durable.  File systems that
 * cannot sync a directory answer EINVAL; the rename has happened, so that is
 * not an error. */
static HpcStatus sync_dir(const char *path, HpcError *err)
{
    char *dir;
    const char *base;
    split_path(path, &dir, &base);
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    HpcStatus st = HPC_OK;
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL && errno != EROFS))
        st = hpc_fail(err, HPC_ERR_IO, "fsync directory %s after writing %s: %s", dir, path,
                      strerror(errno));
    if (fd >= 0) close(fd);
    free(dir);
    return st;
}

HpcStatus atomic_commit(AtomicFile *af, HpcError *err)
{
    HPC_ASSERT(af->fd >= 0);
    if (fsync(af->fd) != 0) {
        int e = errno;
        hpc_fail(err, HPC_ERR_IO, "fsync %s (temporary for %s): %s; the previous file is unchanged",
                 af->tmp_path, af->path, strerror(e));
        atomic_abort(af);
        return HPC_ERR_IO;
    }
    int rc = close(af->fd);
    af->fd = -1;
    if (rc != 0 || rename(af->tmp_path, af->path) != 0) {
        int e = errno;
        hpc_fail(err, HPC_ERR_IO, "%s %s -> %s: %s; the previous file is unchanged",
                 rc != 0 ? "close" : "rename", af->tmp_path, af->path, strerror(e));
        atomic_abort(af);
        return HPC_ERR_IO;
    }
    free(af->tmp_path);
    af->tmp_path = NULL;   /* renamed: nothing left to remove */
    HpcStatus st = sync_dir(af->path, err);
    release(af);
    return st;
}

HpcStatus atomic_write_file(const char *path, const void *data, size_t n, HpcError *err)
{
    AtomicFile af;
    HpcStatus st = atomic_open(&af, path, err);
    if (st) return st;
    st = atomic_write(&af, data, n, err);
    if (st) {
        atomic_abort(&af);
        return st;
    }
    return atomic_commit(&af, err);
}

/* runtime/formats/output_check.c — see output_check.h. */
#include "formats/output_check.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The folder part of path ("." when none). */
static void folder_of(const char *path, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, cap, ".");
    else if (slash == path) snprintf(out, cap, "/");
    else snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

static bool same_inode(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

bool output_same_file(const char *a, const char *b)
{
    if (!a || !b) return false;
    if (same_inode(a, b)) return true;
    /* not there yet (two outputs): the same name in the same folder */
    const char *ba = strrchr(a, '/'), *bb = strrchr(b, '/');
    ba = ba ? ba + 1 : a;
    bb = bb ? bb + 1 : b;
    char da[4096], db[4096];
    folder_of(a, da, sizeof da);
    folder_of(b, db, sizeof db);
    return *ba && strcmp(ba, bb) == 0 && same_inode(da, db) && access(a, F_OK) != 0 && access(b, F_OK) != 0;
}

HpcStatus output_check_not_input(const char *opt, const char *out, const OutputInput *in, int n, HpcError *err)
{
    for (int i = 0; out && i < n; i++)
        if (in[i].path && in[i].path[0] && output_same_file(out, in[i].path))
            return hpc_fail(err, HPC_ERR_USAGE, "%s %s: that is %s (%s); writing it would destroy an input; "
                            "choose another output path", opt, out, in[i].what, in[i].path);
    return HPC_OK;
}

HpcStatus output_check_writable(const char *opt, const char *path, HpcError *err)
{
    struct stat st;
    size_t len = strlen(path);
    if (len == 0 || path[len - 1] == '/' || (stat(path, &st) == 0 && S_ISDIR(st.st_mode)))
        return hpc_fail(err, HPC_ERR_IO, "%s %s: that is a folder; give a file name", opt, path);
    char dir[4096], probe[4200];
    folder_of(path, dir, sizeof dir);
    if (stat(dir, &st) != 0)
        return hpc_fail(err, HPC_ERR_IO, "%s %s: the folder %s does not exist (%s); create it first", opt, path,
                        dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return hpc_fail(err, HPC_ERR_IO, "%s %s: %s is a file, not a folder", opt, path, dir);
    snprintf(probe, sizeof probe, "%s/.hpc-probe.tmp-XXXXXX", dir);
    int fd = mkstemp(probe);
    if (fd < 0)
        return hpc_fail(err, HPC_ERR_IO, "%s %s: cannot create files in %s (%s); give a path in a folder you can "
                        "write to", opt, path, dir, strerror(errno));
    close(fd);
    unlink(probe);
    return HPC_OK;
}

HpcStatus output_check_file(const char *opt, const char *path, const OutputInput *in, int n, HpcError *err)
{
    HpcStatus st = output_check_not_input(opt, path, in, n, err);
    return st ? st : output_check_writable(opt, path, err);
}

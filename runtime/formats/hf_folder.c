/* runtime/formats/hf_folder.c — see hf_folder.h. */
#include "formats/hf_folder.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/hf_config.h"
#include "formats/hf_names.h"
#include "formats/hf_tokenizer.h"

/* Whether dir may be replaced: absent, empty, or plain files with a config.json. */
static HpcStatus replaceable(const char *dir, bool *exists, HpcError *err)
{
    struct stat s;
    *exists = stat(dir, &s) == 0;
    if (!*exists) return HPC_OK;
    if (!S_ISDIR(s.st_mode))
        return hpc_fail(err, HPC_ERR_USAGE, "--output %s: exists and is not a directory; give a new folder name", dir);
    DIR *d = opendir(dir);
    if (!d) return hpc_fail(err, HPC_ERR_IO, "--output %s: %s", dir, strerror(errno));
    int files = 0;
    bool config = false, other = false;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (lstat(path, &s) != 0 || !S_ISREG(s.st_mode)) other = true;
        config |= !strcmp(e->d_name, "config.json");
        files++;
    }
    closedir(d);
    if (files > 0 && (other || !config))
        return hpc_fail(err, HPC_ERR_USAGE, "--output %s: the folder exists and is not a model folder (it %s); it "
                        "would be replaced as a whole, so give a new or empty folder", dir,
                        other ? "holds subfolders or links" : "has no config.json");
    return HPC_OK;
}

/* dir's parent, for fsync and the temporary name. */
static void parent_of(const char *dir, char *out, size_t cap)
{
    snprintf(out, cap, "%s", dir);
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') out[--n] = '\0';
    char *slash = strrchr(out, '/');
    if (!slash) snprintf(out, cap, ".");
    else if (slash == out) out[1] = '\0';
    else *slash = '\0';
}

static void sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* Removes the plain files of dir, then dir (a folder replaceable() accepted,
 * or one this module made). */
static void remove_folder(const char *dir)
{
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(dir);
}

static HpcStatus make_tmp(const char *dir, char *tmp, size_t cap, HpcError *err)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    snprintf(tmp, cap, "%.*s.tmp-XXXXXX", (int)n, dir);
    if (!mkdtemp(tmp))
        return hpc_fail(err, HPC_ERR_IO, "--output %s: cannot create %s: %s; is the parent folder writable?", dir,
                        tmp, strerror(errno));
    return HPC_OK;
}

HpcStatus hf_folder_check(const char *dir, const ModelSpec *spec, HpcError *err)
{
    char why[160] = "", tmp[4200];
    if (!hf_config_family(spec, why, sizeof why))
        return hpc_fail(err, HPC_ERR_USAGE, "--output %s: model %s has no transformers counterpart: %s", dir,
                        spec->name, why);
    bool exists;
    HpcStatus st = replaceable(dir, &exists, err);
    if (!st) st = make_tmp(dir, tmp, sizeof tmp, err);
    if (!st) rmdir(tmp);
    return st;
}

static HpcStatus fill(const char *tmp, const HfFolder *f, HpcError *err)
{
    char why[160] = "", path[4400];
    const char *type = f->model_type ? f->model_type : hf_config_family(f->spec, why, sizeof why);
    if (!type) return hpc_fail(err, HPC_ERR_USAGE, "model %s has no transformers counterpart: %s", f->spec->name, why);
    snprintf(path, sizeof path, "%s/config.json", tmp);
    HpcStatus st = hf_config_write(f->spec, type, path, err);
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    if (!st) st = hf_names_save(type, f->spec, f->pl, f->w, path, err);
    if (!st && f->vocab_path)
        st = hf_tokenizer_write(tmp, f->vocab_path, f->lower_case, f->spec->stack.max_positions, err);
    return st;
}

/* tmp takes dir's place: a plain rename when dir is absent, else an atomic
 * exchange (the old folder then sits at tmp and is removed). */
static HpcStatus swap_in(const char *tmp, const char *dir, bool exists, HpcError *err)
{
    if (!exists || rmdir(dir) == 0) {   /* an empty dir is simply replaced */
        if (rename(tmp, dir) != 0) return hpc_fail(err, HPC_ERR_IO, "rename %s -> %s: %s", tmp, dir, strerror(errno));
        return HPC_OK;
    }
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) != 0)
        return hpc_fail(err, HPC_ERR_IO, "cannot replace %s by %s: %s", dir, tmp, strerror(errno));
    remove_folder(tmp);
    return HPC_OK;
}

HpcStatus hf_folder_write(const char *dir, const HfFolder *f, HpcError *err)
{
    char tmp[4200], parent[4200];
    bool exists;
    HpcStatus st = replaceable(dir, &exists, err);
    if (!st) st = make_tmp(dir, tmp, sizeof tmp, err);
    if (st) return st;
    chmod(tmp, 0755);   /* mkdtemp makes it 0700; a model folder is for sharing */
    st = fill(tmp, f, err);
    if (!st) st = swap_in(tmp, dir, exists, err);
    if (st) remove_folder(tmp);
    parent_of(dir, parent, sizeof parent);
    if (!st) sync_dir(parent);
    return st;
}

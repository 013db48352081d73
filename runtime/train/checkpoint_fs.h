/* runtime/train/checkpoint_fs.h — the directory side of runtime/train/checkpoint.h:
 * making a fresh hidden step directory, committing it under its final name,
 * the `latest` pointer, pruning old steps, resolving a checkpoint path.
 *
 * Commit protocol (why a kill can never leave `latest` on a partial step):
 *   ckfs_begin     mkdir -p ROOT, mkdtemp ROOT/.step-N.tmp-XXXXXX
 *   (the caller writes its files into it through atomic_file: each fsynced)
 *   ckfs_commit    rename the temporary directory to ROOT/step-N (swapped
 *                  atomically with an existing step-N by renameat2
 *                  RENAME_EXCHANGE, the old one then removed), fsync ROOT,
 *                  then ROOT/latest = "step-N\n" atomically
 *   ckfs_prune     keep the newest `keep` step-N directories (the one just
 *                  committed always), remove the rest and the hidden
 *                  leftovers of killed writers
 * Only regular files directly inside a step directory are removed; a step
 * directory holding anything else is left alone.
 *
 * The lock (ckfs_lock): ROOT/.lock, flock()ed exclusively by the one run
 * that writes ROOT, holding that run's pid as text for the message another
 * run gets.  The kernel drops a flock when its process dies, so a lock left
 * by a killed run is never stale; the file itself stays (removing it would
 * let two runs lock two different files).
 */
#ifndef HPC_RUNTIME_CHECKPOINT_FS_H
#define HPC_RUNTIME_CHECKPOINT_FS_H

#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

/* "step-00000120" for step 120. */
void ckfs_step_name(int64_t step, char *out, size_t cap);

/* Creates root (with parents) and a fresh hidden directory for step; its
 * path goes to tmp (cap bytes). */
HpcStatus ckfs_begin(const char *root, int64_t step, char *tmp, size_t cap, HpcError *err);

/* Moves tmp to root/step-N and points root/latest at it (see above). */
HpcStatus ckfs_commit(const char *root, const char *tmp, int64_t step, HpcError *err);

/* Removes a temporary directory that will not be committed. */
void ckfs_discard(const char *tmp);

/* Keeps the newest keep step directories, current among them. */
void ckfs_prune(const char *root, int64_t current, int keep);

/* mkdir -p root, a probe that files can be created in it, then the lock
 * (see above); *fd is its descriptor, -1 on failure. */
HpcStatus ckfs_lock(const char *root, int *fd, HpcError *err);
void ckfs_unlock(int fd);

/* See checkpoint_resolve. */
HpcStatus ckfs_resolve(const char *dir, char *out, size_t cap, HpcError *err);

#endif

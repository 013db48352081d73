/* runtime/formats/atomic_file.h — replace a file all at once or not at all.
 *
 * Checkpoints and imported models must never be left half written: a crash,
 * a full disk or a SIGKILL in the middle of a save has to leave the previous
 * file as it was.  An AtomicFile writes to a temporary file in the same
 * directory as the target (".NAME.tmp-XXXXXX", so rename() stays within one
 * file system), and atomic_commit() then does
 *     fsync(temp) -> close -> rename(temp, target) -> fsync(directory)
 * so that after it returns HPC_OK the new content survives a power cut, and
 * before it returns the target still holds the old content.  On any failure
 * (and on atomic_abort) the temporary file is removed and the target is
 * untouched.  A process killed outright (SIGKILL, power loss) can leave a
 * ".NAME.tmp-*" file behind; it is never read and is safe to delete.
 *
 * The new file gets the old file's permission bits when the target exists,
 * otherwise 0644.
 *
 * Usage:
 *   AtomicFile af;
 *   if (atomic_open(&af, "run/ckpt.safetensors", err)) return err->code;
 *   if (atomic_write(&af, buf, n, err)) { atomic_abort(&af); return err->code; }
 *   return atomic_commit(&af, err);     // frees af in every case
 *
 * An AtomicFile owns two heap strings and a descriptor until atomic_commit
 * or atomic_abort, exactly one of which must be called after atomic_open
 * succeeded.  Not thread-safe per object; distinct objects are independent.
 */
#ifndef HPC_RUNTIME_ATOMIC_FILE_H
#define HPC_RUNTIME_ATOMIC_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

typedef struct {
    char *path;      /* target path, as given */
    char *tmp_path;  /* temporary file beside it */
    int fd;          /* open on tmp_path; -1 once closed */
    uint64_t written;/* bytes written so far */
} AtomicFile;

/* Creates the temporary file beside path.  Fails (HPC_ERR_IO) if the
 * directory does not exist or is not writable, or if path is a directory. */
HpcStatus atomic_open(AtomicFile *af, const char *path, HpcError *err);

/* Appends n bytes (any size; short writes and EINTR are retried). */
HpcStatus atomic_write(AtomicFile *af, const void *data, size_t n, HpcError *err);

/* Flushes, renames over the target and syncs the directory; on failure
 * removes the temporary file.  Frees af's resources in every case. */
HpcStatus atomic_commit(AtomicFile *af, HpcError *err);

/* Removes the temporary file and frees af; the target is untouched. */
void atomic_abort(AtomicFile *af);

/* One-shot helper: path gets exactly the n bytes at data, atomically. */
HpcStatus atomic_write_file(const char *path, const void *data, size_t n, HpcError *err);

#endif

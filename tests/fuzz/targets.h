/* tests/fuzz/targets.h — the fuzz targets: one function per reader of
 * untrusted input, shared by the libFuzzer harnesses (tests/fuzz/fuzz_*.c,
 * `make fuzz`) and by the regression test that replays every crash they
 * found (tests/test_fuzz_regress.c over tests/data/fuzz-regress/NAME/).
 *
 * Each target feeds one input to its reader exactly as hpc would read that
 * file, then uses what the reader accepted (every tensor, every row), and
 * frees everything.  The contract under test: every input is accepted or
 * refused with a status and a message; no crash, no hang, no leak, no
 * sanitizer report.  A target returns 0 (libFuzzer's convention), or traps
 * when an accepted input breaks a promise of the reader's header.
 *
 * Readers that take a path get the input through a file in a private temp
 * folder (fuzz_tmp_path); the folder is made on first use.  Targets that
 * need fixed context (a tokenizer, a model's parameter list) build it once;
 * they find the repository's files under $HPC_ROOT (default ".").
 */
#ifndef HPC_TESTS_FUZZ_TARGETS_H
#define HPC_TESTS_FUZZ_TARGETS_H

#include <stddef.h>
#include <stdint.h>

int fuzz_target_safetensors(const uint8_t *data, size_t size);
int fuzz_target_artifact(const uint8_t *data, size_t size);
int fuzz_target_checkpoint_state(const uint8_t *data, size_t size);
int fuzz_target_runlog(const uint8_t *data, size_t size);
int fuzz_target_tsv(const uint8_t *data, size_t size);
int fuzz_target_vocab(const uint8_t *data, size_t size);

typedef struct {
    const char *name;   /* the harness: tests/fuzz/fuzz_NAME.c, tests/data/fuzz-regress/NAME/ */
    int (*run)(const uint8_t *data, size_t size);
} FuzzTarget;

/* Every target above, NULL-terminated. */
extern const FuzzTarget fuzz_targets[];

#endif

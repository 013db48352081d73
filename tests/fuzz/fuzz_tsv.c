/* tests/fuzz/fuzz_tsv.c — libFuzzer harness: TSV/CSV rows through the GLUE and generic readers (glue_read).
 * The target is shared with the regression test (tests/fuzz/targets.h);
 * built and run by `make fuzz`. */
#include "tests/fuzz/targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_target_tsv(data, size); }

/* tests/fuzz/fuzz_artifact.c — libFuzzer harness: NAME.hpc artifacts (artifact_read, artifact_load_spec).
 * The target is shared with the regression test (tests/fuzz/targets.h);
 * built and run by `make fuzz`. */
#include "tests/fuzz/targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_target_artifact(data, size); }

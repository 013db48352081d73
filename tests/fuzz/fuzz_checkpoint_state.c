/* tests/fuzz/fuzz_checkpoint_state.c — libFuzzer harness: a checkpoint's state.json (checkpoint_load).
 * The target is shared with the regression test (tests/fuzz/targets.h);
 * built and run by `make fuzz`. */
#include "tests/fuzz/targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_target_checkpoint_state(data, size); }

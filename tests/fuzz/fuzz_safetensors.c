/* tests/fuzz/fuzz_safetensors.c — libFuzzer harness: safetensors files (st_open_memory).
 * The target is shared with the regression test (tests/fuzz/targets.h);
 * built and run by `make fuzz`. */
#include "tests/fuzz/targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_target_safetensors(data, size); }

/* tests/fuzz/fuzz_vocab.c — libFuzzer harness: vocab.txt files (tokenizer_load, then encoding).
 * The target is shared with the regression test (tests/fuzz/targets.h);
 * built and run by `make fuzz`. */
#include "tests/fuzz/targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_target_vocab(data, size); }

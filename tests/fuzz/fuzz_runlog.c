/* tests/fuzz/fuzz_runlog.c — libFuzzer harness: JSONL run logs as hpc plot reads them (plot_runlog).
 * The target is shared with the regression test (tests/fuzz/targets.h);
 * built and run by `make fuzz`. */
#include "tests/fuzz/targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_target_runlog(data, size); }

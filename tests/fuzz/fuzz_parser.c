/* tests/fuzz/fuzz_parser.c — libFuzzer harness for the model front end.
 * Every input must load or be rejected with diagnostics: no crash, no hang,
 * no leak, no sanitizer report.  Built and run by `make fuzz`. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "program/spec.h"
#include "compiler/spec_load.h"
#include "summary.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *sink;
    if (!sink) sink = fopen("/dev/null", "w");
    ModelSpec spec;
    /* base_dir "models": `extends bert_base` resolves against the shipped models. */
    int rc = spec_load_string("fuzz.model", (const char *)data, size, "models", &spec, sink);
    if (rc == 0) {
        /* A checked spec must be safe to summarise. */
        if (summary_param_count(&spec) <= 0) __builtin_trap();
        summary_print(&spec, sink);
    }
    return 0;
}

# hpc — build, test, fuzz.  `make` builds bin/hpc and the two libraries;
# `make test` runs the CPU test suite (no GPU needed); `make test-gpu` runs
# the checks that need a CUDA device.  Sources are found by wildcard, so a new
# module is a new file, not a Makefile edit.

CC        ?= gcc
CUDA_HOME ?= $(if $(wildcard /usr/local/cuda),/usr/local/cuda,/usr/lib/cuda)
BUILD     := build
OPT       ?= -O2 -g
WARN      := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
             -Wno-unused-parameter -Werror=implicit-function-declaration
CFLAGS    += -std=c11 -D_GNU_SOURCE $(OPT) $(WARN) -MMD -MP \
             -I. -Iinclude -Iutil -Igrammar -Icompiler -Iruntime -I$(BUILD)/gen \
             -isystem $(CUDA_HOME)/include
# Third-party libraries from Debian are linked statically so that bin/hpc
# runs on machines that have only the CUDA toolkit (the GPU machine).
LDLIBS    += -Wl,-Bstatic -ljansson -lutf8proc -Wl,-Bdynamic \
             -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 \
             -lnvrtc -ldl -lpthread -lm
# cuBLASLt is dlopen'd (runtime/cuda/cublaslt_load.h): linking it ran its
# static initialisers before main(), 0.14 s of every start.

# libhpcc.a: util/, grammar/, program/ (the step program both halves read
# and write) and compiler/; libhpcrt.a: runtime/.  A program that only runs
# NAME.hpc pulls from libhpcc.a nothing but program/ and util/ members
# (tests/link/check-no-frontend.sh reads its link map);
# runtime/ includes no compiler/ header but one door (scripts/check-includes.sh).
COMPILER_SRC := $(wildcard util/*.c grammar/*.c program/*.c compiler/*.c)
RUNTIME_SRC  := $(wildcard runtime/*/*.c)
CLI_SRC      := $(wildcard cli/*.c)
TEST_SRC     := $(wildcard tests/test_*.c)
GPU_TEST_SRC := $(wildcard tests/gpu/gpu_*.c)

GEN_C   := $(BUILD)/gen/parser.tab.c $(BUILD)/gen/scanner.yy.c
GEN_H   := $(BUILD)/gen/parser.tab.h $(BUILD)/gen/scanner.yy.h
obj      = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

KERNEL_CU    := $(wildcard compiler/kernels/*.cu)
COMPILER_OBJ := $(call obj,$(COMPILER_SRC)) $(patsubst $(BUILD)/gen/%.c,$(BUILD)/obj/gen/%.o,$(if $(wildcard grammar/parser.y),$(GEN_C)) $(BUILD)/gen/kernel_sources_data.c)
RUNTIME_OBJ  := $(call obj,$(RUNTIME_SRC))
CLI_OBJ      := $(call obj,$(CLI_SRC))
LIBS         := $(BUILD)/libhpcrt.a $(BUILD)/libhpcc.a
# The commands without main(), so that tests can read their option tables.
CLI_LIB      := $(BUILD)/libhpccli.a
TEST_BIN     := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
GPU_TEST_BIN := $(patsubst tests/gpu/%.c,$(BUILD)/tests/gpu/%,$(GPU_TEST_SRC))

.PHONY: all deps demo test test-gpu fuzz check-valgrind check-includes bench examples verify-hf clean
all: deps bin/hpc

# The README's first command: fetch all-MiniLM-L6-v2 and fine-tune it on CoLA (scripts/demo.sh).
demo: all
	sh scripts/demo.sh

deps: $(BUILD)/.deps-ok
$(BUILD)/.deps-ok: scripts/install-deps.sh
	@mkdir -p $(BUILD) && sh scripts/install-deps.sh && touch $@

# Generated sources must exist before anything that includes their headers.
$(COMPILER_OBJ) $(RUNTIME_OBJ) $(CLI_OBJ): | $(BUILD)/.deps-ok $(if $(wildcard grammar/parser.y),$(GEN_H))

$(BUILD)/gen/parser.tab.c $(BUILD)/gen/parser.tab.h: grammar/parser.y | $(BUILD)/.deps-ok
	@mkdir -p $(@D)
	bison -Wall -Werror --defines=$(BUILD)/gen/parser.tab.h -o $(BUILD)/gen/parser.tab.c $<
$(BUILD)/gen/scanner.yy.c $(BUILD)/gen/scanner.yy.h: grammar/scanner.l $(BUILD)/gen/parser.tab.h | $(BUILD)/.deps-ok
	@mkdir -p $(@D)
	flex --header-file=$(BUILD)/gen/scanner.yy.h -o $(BUILD)/gen/scanner.yy.c $<

# CUDA templates are embedded as C strings (compiler/kernel_sources.h).
# The list of templates is a prerequisite too (rewritten only when it
# changes), so deleting a template re-embeds the rest.
KERNEL_LIST := $(BUILD)/gen/kernel_sources.list
$(shell mkdir -p $(BUILD)/gen && { echo '$(KERNEL_CU)' | cmp -s - $(KERNEL_LIST) || echo '$(KERNEL_CU)' > $(KERNEL_LIST); })
$(BUILD)/gen/kernel_sources_data.c: $(KERNEL_CU) $(KERNEL_LIST) scripts/embed-sources.sh
	@mkdir -p $(@D)
	sh scripts/embed-sources.sh $@ $(KERNEL_CU)

$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Wno-unused-function -Wno-missing-prototypes -Wno-sign-compare -c $< -o $@
$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libhpcc.a: $(COMPILER_OBJ)
	@rm -f $@ && ar rcs $@ $^
$(BUILD)/libhpcrt.a: $(RUNTIME_OBJ)
	@rm -f $@ && ar rcs $@ $^

$(CLI_LIB): $(filter-out %/main.o,$(CLI_OBJ))
	@rm -f $@ && ar rcs $@ $^

bin/hpc: $(CLI_OBJ) $(LIBS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(LIBS) $(LDLIBS)

# The C API's `.model` road is a weak reference (runtime/api/api_model.h):
# test programs that open model files through hpc.h link it in like a user's would.
API_MODEL_ROAD := -Wl,--undefined=api_program_from_model

# Each tests/test_*.c is its own Criterion binary, so one module's tests
# build and run on their own: `make build/tests/test_lossscale && build/tests/test_lossscale`.
$(BUILD)/tests/%: tests/%.c $(CLI_LIB) $(LIBS) | $(BUILD)/.deps-ok
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Icli -Wno-missing-prototypes -o $@ $< $(API_MODEL_ROAD) $(CLI_LIB) $(LIBS) -lcriterion $(LDLIBS)

# A program that only runs artifacts: no front end in it (tests/link/check-no-frontend.sh,
# which also reads the link map, $@.map, for the library members it pulled).
# It also links the checkpoint writer and reader (a run that saves and
# resumes): they must not bring the parser either.
$(BUILD)/tests/link/run_artifact: tests/link/run_artifact.c $(LIBS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< -Wl,-Map=$@.map -Wl,--undefined=checkpoint_save -Wl,--undefined=checkpoint_load \
	    $(LIBS) $(LDLIBS)
# The same through the C API: cpu backend only, and with the cuda backend linked in.
$(BUILD)/tests/link/api_artifact: tests/link/api_artifact.c $(LIBS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< -Wl,-Map=$@.map $(LIBS) $(LDLIBS)
$(BUILD)/tests/link/api_artifact_cuda: tests/link/api_artifact.c $(LIBS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< -Wl,-Map=$@.map -Wl,--undefined=train_cuda_open $(LIBS) $(LDLIBS)
LINK_CHECKS := $(addprefix $(BUILD)/tests/link/,run_artifact api_artifact api_artifact_cuda)

# The C embedding example (examples/) runs on the cpu backend, also under valgrind.
examples: all
	$(MAKE) -C examples

# The compile/run boundary in the include graph: runtime/ and program/
# include no compiler/ header but the listed door (file:line of offenders).
check-includes:
	@sh scripts/check-includes.sh

# The CUDA emulator (tools/cuemu, docs/cuemu.md): one library standing in
# for libcuda and libcublasLt, so the GPU checks run on a CPU.  `make
# test-emu` runs the ones in EMU_TESTS that way (slowly: seconds to minutes
# each); EMU_TESTS="gpu_x gpu_y" picks others.
CUEMU_SRC := $(wildcard tools/cuemu/*.c) runtime/cpu/half.c util/error.c   # hpc's own f16/bf16 rounding
CUEMU_LIB := $(BUILD)/cuemu/libcuemu.so
$(CUEMU_LIB): $(CUEMU_SRC) $(wildcard tools/cuemu/*.h)
	@mkdir -p $(@D)
	$(CC) -std=gnu11 $(OPT) -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden \
	    -isystem $(CUDA_HOME)/include -Itools/cuemu -I. -Iruntime -Iutil \
	    -DCUEMU_PRELUDE='"$(CURDIR)/tools/cuemu/emu_kernel.h"' -Wl,-z,defs -o $@.tmp $(CUEMU_SRC) -ldl -lpthread -lm
	@mv $@.tmp $@   # a running check keeps the old file
# `make test` runs the jobs of tests/emu/ci.jobs (which says why each) in
# parallel lanes, tests/emu/run-ci.sh; these are their programs.
EMU_CI_TESTS := $(sort $(shell sed -e 's/\#.*//' tests/emu/ci.jobs | awk 'NF { print $$NF }'))
EMU_TESTS    ?= $(EMU_CI_TESTS)
.PHONY: test-emu
test-emu: all $(CUEMU_LIB) $(patsubst %,$(BUILD)/tests/gpu/%,$(EMU_TESTS))
	@HPC_ROOT=$(CURDIR) sh tools/cuemu/run.sh $(patsubst %,$(BUILD)/tests/gpu/%,$(EMU_TESTS))

# The emulator's own checks of what no GPU check reaches (tests/emu/*.c,
# linked to the emulator directly).
EMU_SELF_TESTS := $(patsubst tests/emu/%.c,$(BUILD)/tests/emu/%,$(wildcard tests/emu/*.c))
$(BUILD)/tests/emu/%: tests/emu/%.c $(CUEMU_LIB)
	@mkdir -p $(@D)
	$(CC) -std=gnu11 $(OPT) -Wall -Wextra -Werror -isystem $(CUDA_HOME)/include -o $@ $< $(CUEMU_LIB) \
	    -Wl,-rpath,$(CURDIR)/$(BUILD)/cuemu

test: all $(TEST_BIN) examples $(LINK_CHECKS) $(CUEMU_LIB) $(patsubst %,$(BUILD)/tests/gpu/%,$(EMU_CI_TESTS)) $(EMU_SELF_TESTS)
	@sh scripts/check-includes.sh
	@HPC_ROOT=$(CURDIR) sh tests/run-all.sh $(TEST_BIN)
	@HPC_ROOT=$(CURDIR) sh tests/run-all.sh $(EMU_SELF_TESTS)
	@HPC_ROOT=$(CURDIR) sh tests/emu/run-ci.sh
	@sh tests/link/check-no-frontend.sh bin/hpc $(LINK_CHECKS)
	@$(MAKE) -s -C examples run >$(BUILD)/examples-run.log 2>&1 && echo "PASS  examples/embed_bert_tiny" || { cat $(BUILD)/examples-run.log; exit 1; }
	@$(MAKE) -s -C examples valgrind >$(BUILD)/examples-vg.log 2>&1 && echo "PASS  examples/embed_bert_tiny under valgrind" || { cat $(BUILD)/examples-vg.log; exit 1; }
	@sh tests/check-valgrind.sh
	@sh tests/reliability/run.sh
	@sh tests/bench_ab_summary.sh

# GPU checks are plain C programs (no Criterion on the GPU machine).
$(BUILD)/tests/gpu/%: tests/gpu/%.c $(LIBS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Wno-missing-prototypes -o $@ $< $(API_MODEL_ROAD) $(LIBS) $(LDLIBS)
# The GPU machine has no flex, bison or static Debian libraries: build here,
# carry build/ and bin/, and there run `make test-gpu PREBUILT=1`, which runs
# the carried binaries without looking at timestamps.
ifeq ($(PREBUILT),1)
test-gpu:
	@HPC_ROOT=$(CURDIR) sh tests/run-all.sh $(filter-out %.d %.log,$(wildcard $(BUILD)/tests/gpu/gpu_*))
else
test-gpu: all $(GPU_TEST_BIN)
	@HPC_ROOT=$(CURDIR) sh tests/run-all.sh $(GPU_TEST_BIN)
endif

FUZZ_SECONDS ?= 60
# Fuzzing: libFuzzer with ASan and UBSan, one harness per reader of untrusted
# input (tests/fuzz/fuzz_NAME.c; the targets are in tests/fuzz/targets.c).
# `make fuzz` builds every harness and runs them one after another, each for
# FUZZ_SECONDS, or for FUZZ_RUNS executions when that is set
# (`make fuzz FUZZ_RUNS=1000000`); FUZZ=NAME runs one.  tests/fuzz/run.sh says
# where corpora, seeds and crash files go.  The parser harness needs only the
# front end, so it builds from those sources alone.
FUZZ_SRC := util/error.c util/num_parse.c util/nearest.c grammar/ast.c compiler/diag.c program/spec.c compiler/spec_load.c compiler/summary.c \
            $(wildcard compiler/check*.c)
FUZZ_CC     := clang
FUZZ_CFLAGS := -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined -std=c11 -D_GNU_SOURCE \
               -I. -Iinclude -Iutil -Igrammar -Icompiler -Iruntime -I$(BUILD)/gen -isystem $(CUDA_HOME)/include
FUZZ_ALL    := $(sort $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c)))
FUZZ        ?= $(FUZZ_ALL)
FUZZ_LIB_OBJ := $(patsubst %.c,$(BUILD)/fuzz/obj/%.o,$(COMPILER_SRC) $(RUNTIME_SRC) tests/fuzz/targets.c) \
                $(patsubst $(BUILD)/gen/%.c,$(BUILD)/fuzz/obj/gen/%.o,$(GEN_C) $(BUILD)/gen/kernel_sources_data.c)

$(BUILD)/fuzz/obj/gen/%.o: $(BUILD)/gen/%.c
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -w -c $< -o $@
$(BUILD)/fuzz/obj/%.o: %.c | $(GEN_H)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@
$(BUILD)/fuzz/libhpcfuzz.a: $(FUZZ_LIB_OBJ)
	@rm -f $@ && ar rcs $@ $^
$(BUILD)/fuzz/fuzz_parser: tests/fuzz/fuzz_parser.c $(FUZZ_SRC) $(GEN_C)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $^ -lm
$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(BUILD)/fuzz/libhpcfuzz.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(BUILD)/fuzz/libhpcfuzz.a $(LDLIBS)

fuzz: $(addprefix $(BUILD)/fuzz/fuzz_,$(FUZZ))
	@for h in $(FUZZ); do \
	  BUILD=$(BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_RUNS=$(FUZZ_RUNS) sh tests/fuzz/run.sh $$h || exit 1; \
	done

# `hpc check` under valgrind on every shipped model and every bad input.
check-valgrind: all
	sh tests/check-valgrind.sh
	$(MAKE) -C examples valgrind

BENCH_BIN := $(BUILD)/bench/bench_hpc
$(BENCH_BIN): bench/bench_hpc.c $(LIBS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(LIBS) $(LDLIBS)
# bench/mem_probe.c: where the device memory of a step goes (issue #15), an H200 tool.
$(BUILD)/bench/mem_probe: bench/mem_probe.c $(LIBS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(LIBS) $(LDLIBS)
# bench/graph_branch.c: what a second-stream branch costs a step-shaped CUDA graph (issue #15), a GPU tool.
$(BUILD)/bench/graph_branch: bench/graph_branch.c $(LIBS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(LIBS) $(LDLIBS)
# bench/gemm_candidates.c: every cuBLASLt candidate for BERT-base's GEMMs (issue #15), an H200
# tool; it links cuBLASLt and the CUDA runtime directly (hpc opens the driver and cuBLASLt with dlopen).
$(BUILD)/bench/gemm_candidates: bench/gemm_candidates.c bench/cuda_tool.h
	@mkdir -p $(@D)
	$(CC) -std=c11 -O2 -Wall -Wextra -isystem $(CUDA_HOME)/include -o $@ $< -L$(CUDA_HOME)/lib64 \
		-Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudart
# bench/dw_batched.c: the 12 layers' dW GEMMs one call each against one batched call (issue #15), a GPU
# tool linking cuBLASLt and the CUDA runtime as gemm_candidates does.
# bench/dw_ptr_check.c: the pointer-array batch of those GEMMs against one call a layer, per algorithm.
$(BUILD)/bench/dw_batched $(BUILD)/bench/dw_ptr_check: $(BUILD)/bench/%: bench/%.c bench/cuda_tool.h
	@mkdir -p $(@D)
	$(CC) -std=c11 -O2 -Wall -Wextra -isystem $(CUDA_HOME)/include -o $@ $< -L$(CUDA_HOME)/lib64 \
		-Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudart -lm
# bench/finetune_quality.sh: fp16 fine-tune quality against PyTorch AMP.
QUALITY_BIN := $(BUILD)/bench/grad_error
$(QUALITY_BIN): bench/grad_error.c $(LIBS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(LIBS) $(LDLIBS)
bench-quality-bins: all $(QUALITY_BIN)
.PHONY: bench-quality-bins
# bench/recipe_check.py: hpc's fine-tune recipe step by step against PyTorch's
# (cpu, f32, dropout off, the same batches; needs torch and transformers).
recipe-check: bin/hpc
	python3 bench/recipe_check.py
.PHONY: recipe-check
ifeq ($(PREBUILT),1)
bench:
	sh bench/run.sh
else
bench: all $(BENCH_BIN)
	sh bench/run.sh
endif

# hpc against the real transformers classes (needs torch and transformers):
# import, load, save back bit-identically, and the same logits on the cpu backend.
HF_HELPERS := $(BUILD)/hf/hf_roundtrip $(BUILD)/hf/hf_forward
$(BUILD)/hf/%: tests/data/hf/%.c $(LIBS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Wno-missing-prototypes -o $@ $< $(LIBS) $(LDLIBS)
ifeq ($(PREBUILT),1)
verify-hf:
	python3 tests/data/hf/verify_with_transformers.py bin/hpc $(BUILD)/hf/hf_roundtrip $(BUILD)/hf-check $(BUILD)/hf/hf_forward
else
verify-hf: all $(HF_HELPERS)
	python3 tests/data/hf/verify_with_transformers.py bin/hpc $(BUILD)/hf/hf_roundtrip $(BUILD)/hf-check $(BUILD)/hf/hf_forward
endif

clean:
	rm -rf $(BUILD) bin
	$(MAKE) -C examples clean

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# tandem — one Makefile. C11, warnings are errors.
# Targets: all (libtandem.a + tandem), test, asan, deps, clean.
# All cores by default; an explicit -jN on the command line wins, and a
# recursive $(MAKE) (asan) shares the top-level jobserver instead.
ifeq ($(MAKELEVEL),0)
ifeq ($(filter -j% j% --jobs%,$(MAKEFLAGS)),)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
endif
endif

CC      ?= gcc
BUILD   ?= build
OPT     ?= -O2
CFLAGS  ?= -g
SAN     ?=
ALL_CFLAGS = $(OPT) $(CFLAGS) $(SAN) -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -pthread -Iinclude -Isrc -MMD -MP
LDLIBS  = -ljansson -lpcre2-8 -lutf8proc -lxxhash -lmicrohttpd -lm -pthread $(SAN)

# CUDA backend (src/backend/cuda, .cu files): CUDA=1 builds it with nvcc and
# links the static CUDA runtime (binaries start without a driver and say so);
# CUDA=0 leaves it out ("cuda" then names a backend this build does not have).
# Default: CUDA=1 when nvcc is on PATH. CUDA_ARCHS: real SASS for sm_90
# (H100/H200), sm_100 when this nvcc has it, sm_120, plus compute_120 PTX for
# newer GPUs; e.g. CUDA_ARCHS=90 while iterating.
NVCC ?= nvcc
ifeq ($(origin CUDA),undefined)
CUDA := $(if $(shell command -v $(NVCC) 2>/dev/null),1,0)
endif
ifeq ($(CUDA),1)
CUDA_HOME  ?= $(abspath $(dir $(shell command -v $(NVCC)))..)
ifeq ($(origin CUDA_ARCHS),undefined)
CUDA_ARCHS := 90 $(if $(shell $(NVCC) --list-gpu-arch 2>/dev/null | grep -x compute_100),100) 120
endif
CU_SRC     := $(sort $(wildcard src/backend/cuda/*.cu))
CU_OBJ     := $(CU_SRC:%.cu=$(BUILD)/%.o)
# -fmad=false: no implicit multiply-add fusion (the kernels fuse where they say so:
# the reductions' orders are fixed, cuda_internal.cuh).
NVCC_FLAGS = -std=c++20 -O3 -g -fmad=false $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
             -gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS)) \
             -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror -Iinclude -Isrc
LDLIBS    += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
else ifeq ($(CUDA),emu)
# CUDA=emu (`make cuemu`): the same .cu files compiled as C++ by g++ against
# tests/cuemu, which runs their kernels on the CPU (threads as fibers): the
# kernels' logic is tested without a GPU. Never a production build.
CXX        ?= g++
CU_SRC     := $(sort $(wildcard src/backend/cuda/*.cu))
CU_OBJ     := $(CU_SRC:%.cu=$(BUILD)/%.o) $(BUILD)/tests/cuemu/cuemu.o
CUEMU_FLAGS = -std=c++20 $(OPT) -g -ffp-contract=off -DTD_CUEMU -Wall -Wextra -Werror -Wno-unknown-pragmas -Iinclude -Isrc -Itests/cuemu -MMD -MP
LDLIBS    += -lstdc++
else
CU_OBJ     :=
endif
# backend.c registers "cuda" only when built with it: $(BUILD)/cuda.cfg changes
# (and rebuilds backend.o) when CUDA does, $(BUILD)/nvcc.cfg (and the .cu
# objects) when the nvcc flags (CUDA_ARCHS) do. Not for goals that build
# elsewhere (asan, fuzz) or nothing.
cfg_file = $(shell mkdir -p $(BUILD) && { [ "$$(cat $(BUILD)/$(1) 2>/dev/null)" = '$(2)' ] || echo '$(2)' > $(BUILD)/$(1); })
ifneq ($(if $(MAKECMDGOALS),$(filter-out clean deps asan fuzz fuzz-build cuemu,$(MAKECMDGOALS)),all),)
$(call cfg_file,cuda.cfg,$(CUDA))
ifeq ($(CUDA),1)
$(call cfg_file,nvcc.cfg,$(NVCC_FLAGS))
endif
endif
.DEFAULT_GOAL := all
$(BUILD)/src/backend/backend.o: ALL_CFLAGS += -DTD_HAVE_CUDA=$(if $(filter 0,$(CUDA)),0,1)
$(BUILD)/src/backend/backend.o: $(BUILD)/cuda.cfg

LIB_SRC  := $(shell find src -name '*.c' ! -path 'src/cli/*' | sort)
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/c/test_*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
# Kernels: O3 so the fixed 16-lane loops vectorize.
$(BUILD)/src/backend/cpu/%.o: OPT = -O3
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_BIN := $(TEST_SRC:tests/c/%.c=$(BUILD)/tests/%)

all: $(BUILD)/libtandem.a $(BUILD)/tandem

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

ifeq ($(CUDA),emu)
$(BUILD)/%.o: %.cu $(wildcard src/backend/cuda/*.cuh) tests/cuemu/cuemu.h
	@mkdir -p $(dir $@)
	$(CXX) $(CUEMU_FLAGS) -x c++ -c $< -o $@
$(BUILD)/tests/cuemu/cuemu.o: tests/cuemu/cuemu.cpp tests/cuemu/cuemu.h
	@mkdir -p $(dir $@)
	$(CXX) $(CUEMU_FLAGS) -c $< -o $@
else
$(BUILD)/%.o: %.cu $(wildcard src/backend/cuda/*.cuh) $(BUILD)/nvcc.cfg
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@
endif

$(BUILD)/libtandem.a: $(LIB_OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/tandem: $(CLI_OBJ) $(BUILD)/libtandem.a
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/c/%.c $(BUILD)/libtandem.a $(wildcard tests/c/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/c -o $@ $< $(BUILD)/libtandem.a $(LDLIBS)

# Test-only mutant: the sampler with a deliberately wrong rejection-sampling
# residual; test_spec_mutant passes only if the chi-square test catches it.
$(BUILD)/tests/mutant/sampler.o: src/sample/sampler.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -DTD_MUTATE_RESIDUAL -c $< -o $@

$(BUILD)/tests/test_spec_mutant: tests/c/test_spec.c $(BUILD)/tests/mutant/sampler.o $(BUILD)/libtandem.a tests/c/check.h
	$(CC) $(ALL_CFLAGS) -DSPEC_MUTANT -Itests/c -o $@ $< $(BUILD)/tests/mutant/sampler.o $(BUILD)/libtandem.a $(LDLIBS)

# The speculative-decoding checks again with --precision bf16 (BF16 matmul activations).
$(BUILD)/tests/test_spec_bf16: tests/c/test_spec.c $(BUILD)/libtandem.a tests/c/check.h
	$(CC) $(ALL_CFLAGS) -DSPEC_BF16 -Itests/c -o $@ $< $(BUILD)/libtandem.a $(LDLIBS)

# And with --quantize q8 --precision int8 (int8 activations against the q8 weights).
$(BUILD)/tests/test_spec_int8: tests/c/test_spec.c $(BUILD)/libtandem.a tests/c/check.h
	$(CC) $(ALL_CFLAGS) -DSPEC_INT8 -Itests/c -o $@ $< $(BUILD)/libtandem.a $(LDLIBS)

$(BUILD)/tests/test_golden_bf16: tests/c/test_golden.c $(BUILD)/libtandem.a tests/c/check.h
	$(CC) $(ALL_CFLAGS) -DGOLDEN_BF16 -Itests/c -o $@ $< $(BUILD)/libtandem.a $(LDLIBS)

tests: $(TEST_BIN) $(BUILD)/tests/test_spec_mutant $(BUILD)/tests/test_spec_bf16 $(BUILD)/tests/test_spec_int8 $(BUILD)/tests/test_golden_bf16

# Runs every test (C unit + golden, then the Python end-to-end tests when present)
# and ends with one "N passed, N failed" line.
test: all tests
	@BUILD=$(BUILD) sh tests/run_all.sh

# The same tests on the guard backend (src/backend/README.md: all backend memory
# PROT_NONE outside the backend's own ops, so host code touching activations, KV
# or state crashes). GUARD_TESTS: the C tests to run (default all); the Python
# tests run too (the server reads $$TANDEM_BACKEND) unless TANDEM_SKIP_PY=1.
GUARD_TESTS ?=
test-guard: all tests
	@BUILD=$(BUILD) TANDEM_BACKEND=guard TANDEM_TESTS="$(GUARD_TESTS)" sh tests/run_all.sh

# The CUDA backend's kernels run on the CPU (tests/cuemu/README.md): the op-by-op
# tests against the CPU backend (the exact kernels, then the fast mode's cuBLAS,
# cuBLASLt and split attention), with the block's threads swept in both orders.
# Then CUDA graphs (test_cuda_graphs: the capture cache, and the engine's decode,
# draft and verify forwards replayed from graphs against enforce_eager, ~2-3 min),
# and the fast mode's cuBLAS prefill against the CPU and the batch-invariant mode
# (test_cuda_fast, on the emulator's cuBLAS).
cuemu:
	$(MAKE) BUILD=build-cuemu CUDA=emu build-cuemu/tests/test_backend_cuda build-cuemu/tests/test_cuda_fast_ops build-cuemu/tests/test_cuda_graphs build-cuemu/tests/test_cuda_fast
	build-cuemu/tests/test_backend_cuda
	TD_CUEMU_ORDER=reverse build-cuemu/tests/test_backend_cuda
	build-cuemu/tests/test_cuda_fast_ops
	TD_CUEMU_ORDER=reverse build-cuemu/tests/test_cuda_fast_ops
	build-cuemu/tests/test_cuda_graphs
	build-cuemu/tests/test_cuda_fast

asan:
	$(MAKE) BUILD=build-asan CUDA=0 OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" test

# ThreadSanitizer on the tests whose threads meet: the scheduler (submits, cancels
# and callbacks from other threads, preemption), the server's request paths and
# the thread pool. halt_on_error: any report fails its test. Also builds
# build-tsan/tandem (bench/soak.py --bin build-tsan/tandem). The ifunc clones
# (kernels.c) are off in sanitizer builds.
TSAN_TESTS ?= test_sched test_sched_stress test_preempt test_server_gen test_server_stream test_demo
tsan:
	$(MAKE) BUILD=build-tsan CUDA=0 OPT=-O1 SAN="-fsanitize=thread -fno-omit-frame-pointer" build-tsan/tandem $(TSAN_TESTS:%=build-tsan/tests/%)
	@BUILD=build-tsan TSAN_OPTIONS="halt_on_error=1 $$TSAN_OPTIONS" TANDEM_SKIP_PY=1 TANDEM_TESTS="$(TSAN_TESTS)" sh tests/run_all.sh

# Debian packages needed to build and test (run as root on a fresh machine).
deps:
	sh scripts/install-deps.sh

clean:
	rm -rf build build-asan build-tsan build-cuemu

.PHONY: all test test-guard tests asan tsan cuemu deps clean
-include $(LIB_OBJ:.o=.d) $(CU_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(BUILD)/tests/mutant/sampler.d $(TEST_BIN:=.d)

# ---- fuzzing: libFuzzer harnesses in tests/fuzz (see tests/fuzz/README.md) ----
# `make fuzz [FUZZ_SECONDS=N] [FUZZ=name ...]` builds the library and the
# harnesses with clang (-fsanitize=fuzzer,address,undefined) into build-fuzz/
# and runs each harness for N seconds; non-zero exit on any crash or leak.
# Warnings are errors there too (clang sees some gcc does not); FUZZ_CFLAGS adds
# flags, e.g. FUZZ_CFLAGS=-Wno-error=sometimes-uninitialized.
FUZZ_CC      ?= clang
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 30
FUZZ_CFLAGS  ?=
FUZZ_SAN     := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
FUZZ_NAMES   := $(patsubst tests/fuzz/fuzz_%.c,%,$(sort $(wildcard tests/fuzz/fuzz_*.c)))
FUZZ         ?= $(FUZZ_NAMES)

# Only reached through fuzz-build's recursive make (BUILD=$(FUZZ_BUILD), CC=clang).
$(BUILD)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_util.h tests/fuzz/fuzz_srv.h $(BUILD)/libtandem.a
	$(CC) $(ALL_CFLAGS) -fsanitize=fuzzer -DFUZZ_ROOT='"$(CURDIR)"' -o $@ $< $(BUILD)/libtandem.a $(LDLIBS)

fuzz-bins: $(FUZZ_NAMES:%=$(BUILD)/fuzz_%)

# The matcher's mask loops compare internal parser states, not input bytes:
# libFuzzer's compare tracing there gives no guidance (same coverage and
# features in an A/B run) and took 70% of fuzz_grammar's time (tests/fuzz/README.md).
$(FUZZ_BUILD)/src/grammar/match.o: ALL_CFLAGS += -fno-sanitize-coverage=trace-cmp
# The CPU backend's numeric loops (matmul, attention, DeltaNet) likewise
# compare loop counters and dimensions, never input bytes; their compare
# tracing was 64% of fuzz_http's time (the server generates with tiny-a), and
# they are built at -O2 there (ASan and UBSan stay): 4,000 runs 7.4-8.3 s -> 5.7-6.2 s.
$(FUZZ_BUILD)/src/backend/cpu/%.o: ALL_CFLAGS += -fno-sanitize-coverage=trace-cmp -O2

# TPL_FUZZ_LIMITS: smaller template memory/output/item/step limits (the same
# checks; a hostile template fails in ~10 ms instead of ~1 s; src/template/jinja.h).
fuzz-build:
	$(MAKE) BUILD=$(FUZZ_BUILD) CUDA=0 CC=$(FUZZ_CC) OPT=-O1 CFLAGS="-g -DTPL_FUZZ_LIMITS $(FUZZ_CFLAGS)" SAN="-fsanitize=fuzzer-no-link $(FUZZ_SAN)" fuzz-bins

fuzz: fuzz-build
	FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) sh tests/fuzz/run.sh $(FUZZ)

.PHONY: fuzz fuzz-build fuzz-bins
-include $(wildcard $(BUILD)/fuzz_*.d)

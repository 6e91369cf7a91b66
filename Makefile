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

$(BUILD)/libtandem.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/tandem: $(CLI_OBJ) $(BUILD)/libtandem.a
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/c/%.c $(BUILD)/libtandem.a tests/c/check.h
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

$(BUILD)/tests/test_golden_bf16: tests/c/test_golden.c $(BUILD)/libtandem.a tests/c/check.h
	$(CC) $(ALL_CFLAGS) -DGOLDEN_BF16 -Itests/c -o $@ $< $(BUILD)/libtandem.a $(LDLIBS)

tests: $(TEST_BIN) $(BUILD)/tests/test_spec_mutant $(BUILD)/tests/test_spec_bf16 $(BUILD)/tests/test_golden_bf16

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

asan:
	$(MAKE) BUILD=build-asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" test

# Debian packages needed to build and test (run as root on a fresh machine).
deps:
	sh scripts/install-deps.sh

clean:
	rm -rf build build-asan

.PHONY: all test test-guard tests asan deps clean
-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(BUILD)/tests/mutant/sampler.d $(TEST_BIN:=.d)

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

fuzz-build:
	$(MAKE) BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) OPT=-O1 CFLAGS="-g $(FUZZ_CFLAGS)" SAN="-fsanitize=fuzzer-no-link $(FUZZ_SAN)" fuzz-bins

fuzz: fuzz-build
	FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) sh tests/fuzz/run.sh $(FUZZ)

.PHONY: fuzz fuzz-build fuzz-bins
-include $(wildcard $(BUILD)/fuzz_*.d)

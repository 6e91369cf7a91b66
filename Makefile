# tandem — one Makefile. C11, warnings are errors.
# Targets: all (libtandem.a + tandem), test, asan, deps, clean.
CC      ?= gcc
BUILD   ?= build
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -pthread -Iinclude -Isrc -MMD -MP
LDLIBS  += -ljansson -lpcre2-8 -lutf8proc -lxxhash -lmicrohttpd -lm -pthread

LIB_SRC  := $(shell find src -name '*.c' ! -path 'src/cli/*' | sort)
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/c/test_*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_BIN := $(TEST_SRC:tests/c/%.c=$(BUILD)/tests/%)

all: $(BUILD)/libtandem.a $(BUILD)/tandem

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libtandem.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/tandem: $(CLI_OBJ) $(BUILD)/libtandem.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/c/%.c $(BUILD)/libtandem.a tests/c/check.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/c -o $@ $< $(BUILD)/libtandem.a $(LDLIBS)

tests: $(TEST_BIN)

# Runs every test (C unit + golden, then the Python end-to-end tests when present)
# and ends with one "N passed, N failed" line.
test: all tests
	@BUILD=$(BUILD) sh tests/run_all.sh

asan:
	$(MAKE) BUILD=build-asan OPT=-O1 CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" LDLIBS="$(LDLIBS) -fsanitize=address,undefined" test

# Debian packages needed to build and test (run as root on a fresh machine).
deps:
	sh scripts/install-deps.sh

clean:
	rm -rf build build-asan

.PHONY: all test tests asan deps clean
-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d)

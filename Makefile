# cpgen: one binary, build/cpgen. `make run` trains the default spec (or prints its plan without a GPU);
# `make test` runs every CPU test; `make test-gpu` and `make bench` need an NVIDIA GPU.

CUDA    ?= /usr/local/cuda
LUA_INC ?= /usr/include/lua5.4
LUA_LIB ?= /usr/lib/x86_64-linux-gnu/liblua5.4.a
CC      ?= gcc
SAN     ?=

CFLAGS  := -std=c11 -O2 -g -Wall -Wextra -Werror -D_GNU_SOURCE -pthread -MMD -MP \
           -I. -Icli -Igen -Iruntime -Ibuild -I$(LUA_INC) -I$(CUDA)/include $(SAN)
LDFLAGS := -pthread -L$(CUDA)/lib64 -Wl,-rpath,$(CUDA)/lib64 $(SAN)
# NVRTC is not linked: gen/jit.c loads it with dlopen when a kernel must be compiled (a bundle run needs none).
LDLIBS  := $(LUA_LIB) -lcublasLt -lcudart_static -ldl -lrt -lm

EMBED_FILES := $(sort $(wildcard templates/*.cu templates/*.cuh)) $(sort $(wildcard specs/*.lua))
LIB_SRC     := $(sort $(filter-out cli/main.c,$(wildcard cli/*.c gen/*.c runtime/*.c)))
LIB_OBJ     := $(LIB_SRC:%.c=build/%.o) build/embedded.o
REF_OBJ     := $(patsubst %.c,build/%.o,$(sort $(wildcard tests/ref/*.c)))
TESTS       := $(patsubst tests/%.c,build/tests/%,$(sort $(wildcard tests/test_*.c)))
FUZZ_TEST   := build/tests/test_fuzz_spec
GPU_TESTS   := $(patsubst tests/gpu/%.c,build/tests/gpu/%,$(sort $(wildcard tests/gpu/test_*.c)))
BENCHES     := $(patsubst tests/gpu/%.c,build/tests/gpu/%,$(sort $(wildcard tests/gpu/bench_*.c)))
GPU_UTIL_OBJ:= $(patsubst %.c,build/%.o,$(sort $(filter-out tests/gpu/test_% tests/gpu/bench_%,$(wildcard tests/gpu/*.c))))

.PHONY: all run test test-gpu bench clean
.SECONDARY:
all: build/cpgen

# Installs missing system packages (Lua 5.4, cmocka) with apt when run as root; see tools/install-deps.sh.
# A stamp, so a build tree carried to a machine without them (the GPU machine) runs as it is.
deps: build/.deps
build/.deps: tools/install-deps.sh
	@mkdir -p build
	@tools/install-deps.sh --check-only >/dev/null 2>&1 || tools/install-deps.sh
	@touch $@

build/cpgen: build/cli/main.o $(LIB_OBJ)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

build/%.o: %.c | build/.deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

build/tools/embed: tools/embed.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -o $@ $<

# How fast a training checkpoint is written here, without a GPU (tools/ckpt_bench.c; docs/CHECKPOINTS.md).
build/tools/ckpt_bench: tools/ckpt_bench.c $(LIB_OBJ) | build/.deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(LIB_OBJ) $(LDFLAGS) $(LDLIBS)

build/embedded.c: build/tools/embed $(EMBED_FILES)
	build/tools/embed $@ $(EMBED_FILES)

build/embedded.o: build/embedded.c
	$(CC) $(CFLAGS) -c -o $@ $<

$(filter-out $(FUZZ_TEST),$(TESTS)): build/tests/%: tests/%.c $(LIB_OBJ) $(REF_OBJ) | build/.deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(LIB_OBJ) $(REF_OBJ) $(LDFLAGS) $(LDLIBS) -lcmocka

# The spec fuzzer runs on a copy of the library built with AddressSanitizer and UBSan, so a bad read in spec
# loading or planning fails the test instead of passing unseen.
ASAN      := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
build/asan/%.o: %.c | build/.deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ASAN) -c -o $@ $<

$(FUZZ_TEST): tests/test_fuzz_spec.c $(LIB_SRC:%.c=build/asan/%.o) build/embedded.o | build/.deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ASAN) -Itests -o $@ $(filter %.c %.o,$^) $(LDFLAGS) $(ASAN) $(LDLIBS)

# GPU tests run on a machine without cmocka installed: they carry the library in build/lib.
build/lib/libcmocka.so.0: | build/.deps
	@mkdir -p $(dir $@)
	cp -L /usr/lib/x86_64-linux-gnu/libcmocka.so.0 $@

# Static pattern rules: with implicit ones, make picks the CPU rule for a GPU test whenever the helper
# objects are not built yet.
$(GPU_TESTS) $(BENCHES): build/tests/gpu/%: tests/gpu/%.c $(LIB_OBJ) $(REF_OBJ) $(GPU_UTIL_OBJ) build/lib/libcmocka.so.0 | build/.deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -Itests/gpu -o $@ $< $(LIB_OBJ) $(REF_OBJ) $(GPU_UTIL_OBJ) $(LDFLAGS) $(LDLIBS) \
	    build/lib/libcmocka.so.0 -Wl,-rpath,'$$ORIGIN/../../lib'

run: all
	build/cpgen run specs/tiny.lua

# the GPU tests and benchmarks are built too (not run: they need the GPU), so that a change that breaks their
# compile fails here and not on the GPU machine
test: all $(TESTS) $(GPU_TESTS) $(BENCHES)
	@tools/run-tests.sh $(TESTS)

test-gpu: all $(GPU_TESTS)
	@tools/run-tests.sh $(GPU_TESTS)

bench: all $(BENCHES)
	@tools/run-bench.sh $(BENCHES)

clean:
	rm -rf build

-include $(shell find build -name '*.d' 2>/dev/null)

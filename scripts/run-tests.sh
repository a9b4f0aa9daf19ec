#!/usr/bin/env bash
# Runs every test: each build/tests/test_* C binary, then pytest over tests/python.
# Prints each suite's result and ends with one line "N passed, N failed, N skipped".
# A suite that did not run counts as failed: a C binary that exits non-zero or prints no
# summary line, a pytest run that collects nothing or errors, and a test module in which
# every test was skipped (tests/python/conftest.py). Skips stay visible in the last line.
# Environment: BUILD (default build), PYTEST_FILES (default tests/python), PYTEST_ARGS
# (extra pytest arguments), TESSERA_TESTDATA (the reference data of scripts/get-testdata.py,
# default build/testdata).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export TESSERA_ROOT=$PWD
export TESSERA_TESTDATA=${TESSERA_TESTDATA:-$PWD/build/testdata}
export TESSERA_BIN=$PWD/$BUILD/tessera
export TESSERA_BUILD=$PWD/$BUILD
passed=0
failed=0
skipped=0

# "N passed, N failed[, N skipped]" -> the count before WORD ("" when absent)
count() { printf '%s\n' "$1" | grep -oE "[0-9]+ $2" | grep -oE '[0-9]+' | head -n 1; }

# One C test binary: run_c BINARY LABEL [ENV=VALUE...]
run_c() {
    local t=$1 name=$2
    shift 2
    local t0=$SECONDS
    out=$(env "$@" "$t" 2>&1)
    rc=$?
    local took="$((SECONDS - t0)) s"
    last=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    p=$(count "$last" passed) f=$(count "$last" failed) s=$(count "$last" skipped)
    p=${p:-0} f=${f:-0} s=${s:-0}
    # a crash, a non-zero exit or a missing summary without a counted failure is one failure
    if { [ $rc -ne 0 ] || [ -z "$last" ]; } && [ "$f" -eq 0 ]; then f=1; fi
    passed=$((passed + p))
    failed=$((failed + f))
    skipped=$((skipped + s))
    if [ "$f" -ne 0 ]; then
        # the failed checks first (stderr, so they may sit anywhere in the output), then the tail
        printf '%s\n' "$out" | grep -E '^ *FAIL' | head -n 20
        printf '%s\n' "$out" | grep -v '^ok ' | tail -n 40
        echo "[c] $name: $p passed, $f failed, $s skipped (exit $rc; $took)"
    elif [ "$s" -ne 0 ]; then
        printf '%s\n' "$out" | grep -E '^(skip |  skip: )'
        echo "[c] $name: $p passed, $s skipped ($took)"
    else
        echo "[c] $name: $p passed ($took)"
    fi
}

for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    run_c "$t" "$(basename "$t")"
done

# The scheduler's invariance tests again on the CUDA backend, compiled against the
# CUDA-on-CPU emulator (make builds it in every build), with the tiny BF16 llama3 whose
# GPU and CPU arithmetic agree to rounding (test_scheduler.c says what is exact there).
# Then the engine's and the constrained-decoding tests the same way.
# (A partial build without test_scheduler, such as make tsan's, has no such pass.)
emu_lib=$PWD/$BUILD/libtessera-cuda-emu.so
if [ ! -x "$BUILD/tests/test_scheduler" ]; then
    :
elif [ -e "$emu_lib" ]; then
    run_c "$BUILD/tests/test_scheduler" "test_scheduler (cuda, emulated)" TESSERA_TEST_DEVICE=cuda \
        TESSERA_CUDA_LIB="$emu_lib" TESSERA_EMU_MEM_MB=1024 TESSERA_TEST_MODEL="$BUILD/testmodels/llama3-tiny-hd64"
    # the same split over 2 emulated GPUs (tensor parallel: NCCL all-reduces, rank 0
    # sampling and broadcasting the tokens): the overlapped loop, F16 KV
    run_c "$BUILD/tests/test_scheduler" "test_scheduler (cuda, emulated, 2 GPUs)" TESSERA_TEST_DEVICE=cuda \
        TESSERA_TEST_TP=2 TESSERA_EMU_DEVICES=2 TESSERA_CUDA_LIB="$emu_lib" TESSERA_EMU_MEM_MB=1024 \
        TESSERA_TEST_MODEL="$BUILD/testmodels/llama3-tiny-hd64"
    # the request API (threads, preemption, prefix cache, abort storm, text deltas, stop
    # strings): greedy ids equal the solo runs' up to near ties (test_engine.c says which)
    run_c "$BUILD/tests/test_engine" "test_engine (cuda, emulated)" TESSERA_TEST_DEVICE=cuda \
        TESSERA_CUDA_LIB="$emu_lib" TESSERA_EMU_MEM_MB=1024 TESSERA_TEST_MODEL="$BUILD/testmodels/llama3-tiny-hd64"
    # speculative decoding: several sampling rows of one sequence in a step, each drawing
    # with its own step's random bits
    run_c "$BUILD/tests/test_sched_spec" "test_sched_spec (cuda, emulated)" TESSERA_TEST_DEVICE=cuda \
        TESSERA_CUDA_LIB="$emu_lib" TESSERA_EMU_MEM_MB=1024 TESSERA_TEST_MODEL="$BUILD/testmodels/llama3-tiny-hd64"
    # constrained decoding: the token masks applied by the CUDA sampling kernel
    run_c "$BUILD/tests/test_sched_grammar" "test_sched_grammar (cuda, emulated)" TESSERA_TEST_DEVICE=cuda \
        TESSERA_CUDA_LIB="$emu_lib" TESSERA_EMU_MEM_MB=1024 TESSERA_TEST_MODEL="$BUILD/testmodels/llama3-tiny-hd64"
else
    echo "[c] test_scheduler (cuda, emulated): $emu_lib missing"
    failed=$((failed + 1))
fi

PYTEST_FILES=${PYTEST_FILES:-tests/python}
if [ -n "$PYTEST_FILES" ]; then
    # -rs lists each skip with its reason; an empty parametrisation is a collection error;
    # --durations lists the slowest tests (make test must stay inside the CI budget)
    t0=$SECONDS
    # shellcheck disable=SC2086
    out=$(.venv/bin/python -m pytest -q -rs --durations=12 -p no:cacheprovider \
          -o empty_parameter_set_mark=fail_at_collect ${PYTEST_ARGS:-} $PYTEST_FILES 2>&1)
    rc=$?
    printf '%s\n' "$out" | tail -n 80
    summary=$(printf '%s\n' "$out" | grep -E '[0-9]+ (passed|failed|skipped|errors?)' | tail -n 1)
    p=$(count "$summary" passed) f=$(count "$summary" failed) s=$(count "$summary" skipped)
    e=$(count "$summary" 'errors?')
    p=${p:-0} s=${s:-0} f=$(( ${f:-0} + ${e:-0} ))
    # exit 5 (nothing collected) or any other failure without a counted one is one failure
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    passed=$((passed + p))
    failed=$((failed + f))
    skipped=$((skipped + s))
    echo "[python] pytest: $p passed, $f failed, $s skipped (exit $rc; $((SECONDS - t0)) s)"
fi

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]

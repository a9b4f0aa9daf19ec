#!/usr/bin/env bash
# Runs every test: each build/tests/test_* C binary, the scheduler and engine tests again on
# the emulated CUDA backend, then pytest over tests/python. Prints each suite's result as it
# ends and finishes with one line "N passed, N failed, N skipped".
# A suite that did not run counts as failed: a C binary that exits non-zero or prints no
# summary line, a pytest run that collects nothing or errors, and a test module in which
# every test was skipped (tests/python/conftest.py). Skips stay visible in the last line.
# Environment: BUILD (default build), JOBS (suites run at once, default 1: each suite is one
# process, the longest start first), EMU_PASSES (all, or none: the scheduler's and engine's
# tests on the CPU backend only, as the sanitizer build runs them), PYTEST_FILES
# (default tests/python), PYTEST_ARGS (extra pytest arguments), TESSERA_TESTDATA (the
# reference data of scripts/get-testdata.py, default build/testdata).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
JOBS=${JOBS:-1}
EMU_PASSES=${EMU_PASSES:-all}
export TESSERA_ROOT=$PWD
export TESSERA_TESTDATA=${TESSERA_TESTDATA:-$PWD/build/testdata}
export TESSERA_BIN=$PWD/$BUILD/tessera
export TESSERA_BUILD=$PWD/$BUILD
case $JOBS in '' | *[!0-9]* | 0) echo "run-tests.sh: JOBS must be a positive number, not '$JOBS'" >&2; exit 2 ;; esac
case $EMU_PASSES in all | none) ;; *) echo "run-tests.sh: EMU_PASSES must be all or none" >&2; exit 2 ;; esac
passed=0
failed=0
skipped=0

# "N passed, N failed[, N skipped]" -> the count before WORD ("" when absent)
count() { printf '%s\n' "$1" | grep -oE "[0-9]+ $2" | grep -oE '[0-9]+' | head -n 1; }

# Every suite prints what it has to show, then one last line "counts P F S" that the pool
# (below) adds up and does not print.

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
    echo "counts $p $f $s"
}

# pytest over PYTEST_FILES
run_pytest() {
    # -rs lists each skip with its reason; an empty parametrisation is a collection error;
    # --durations lists the slowest tests (make test must stay inside the CI budget)
    local t0=$SECONDS
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
    echo "[python] pytest: $p passed, $f failed, $s skipped (exit $rc; $((SECONDS - t0)) s)"
    echo "counts $p $f $s"
}

# The pool: up to JOBS suites at once, each writing into its own file; a suite's lines are
# printed when it ends (so a log cut short still shows every suite that finished).
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
declare -A job_file
running=0
njobs=0

# reap: waits for one suite to end, prints its lines and adds up its counts
reap() {
    local pid=
    wait -n -p pid
    running=$((running - 1))
    local file=${job_file[$pid]}
    local c
    c=$(tail -n 1 "$file")
    if [[ $c =~ ^counts\ ([0-9]+)\ ([0-9]+)\ ([0-9]+)$ ]]; then
        sed '$d' "$file"
        passed=$((passed + BASH_REMATCH[1]))
        failed=$((failed + BASH_REMATCH[2]))
        skipped=$((skipped + BASH_REMATCH[3]))
    else # the suite's shell itself died
        cat "$file"
        echo "[suite] ended without its counts: one failure"
        failed=$((failed + 1))
    fi
}

# start FUNCTION ARGS...: runs the suite in the background once fewer than JOBS run
start() {
    while [ "$running" -ge "$JOBS" ]; do reap; done
    njobs=$((njobs + 1))
    local file=$tmp/$njobs.out
    "$@" > "$file" 2>&1 &
    job_file[$!]=$file
    running=$((running + 1))
}

# The longest C suites start first (they decide how long a run with JOBS > 1 takes): the
# CUDA backend's, then the scheduler's and engine's again on the CUDA backend compiled
# against the CUDA-on-CPU emulator (make builds it in every build), with the tiny BF16
# llama3 whose GPU and CPU arithmetic agree to rounding (test_scheduler.c says what is
# exact there). (A partial build without test_scheduler, such as make tsan's, has none.)
emu_lib=$PWD/$BUILD/libtessera-cuda-emu.so
emu=(TESSERA_TEST_DEVICE=cuda TESSERA_CUDA_LIB="$emu_lib" TESSERA_EMU_MEM_MB=1024
     TESSERA_TEST_MODEL="$BUILD/testmodels/llama3-tiny-hd64")
[ -x "$BUILD/tests/test_cuda_backend" ] && start run_c "$BUILD/tests/test_cuda_backend" test_cuda_backend
if [ -x "$BUILD/tests/test_scheduler" ] && [ "$EMU_PASSES" = all ]; then
    if [ ! -e "$emu_lib" ]; then
        echo "[c] test_scheduler (cuda, emulated): $emu_lib missing"
        failed=$((failed + 1))
    else
        start run_c "$BUILD/tests/test_scheduler" "test_scheduler (cuda, emulated)" "${emu[@]}"
        # the same split over 2 emulated GPUs (tensor parallel: NCCL all-reduces, rank 0
        # sampling and broadcasting the tokens): the overlapped loop, F16 KV
        start run_c "$BUILD/tests/test_scheduler" "test_scheduler (cuda, emulated, 2 GPUs)" TESSERA_TEST_TP=2 \
            TESSERA_EMU_DEVICES=2 "${emu[@]}"
        # the request API (threads, preemption, prefix cache, abort storm, text deltas, stop
        # strings): greedy ids equal the solo runs' up to near ties (test_engine.c says which)
        start run_c "$BUILD/tests/test_engine" "test_engine (cuda, emulated)" "${emu[@]}"
        # speculative decoding: several sampling rows of one sequence in a step, each drawing
        # with its own step's random bits
        start run_c "$BUILD/tests/test_sched_spec" "test_sched_spec (cuda, emulated)" "${emu[@]}"
        # constrained decoding: the token masks applied by the CUDA sampling kernel
        start run_c "$BUILD/tests/test_sched_grammar" "test_sched_grammar (cuda, emulated)" "${emu[@]}"
    fi
fi
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] && [ "${t##*/}" != test_cuda_backend ] || continue
    start run_c "$t" "$(basename "$t")"
done
while [ "$running" -gt 0 ]; do reap; done

# pytest alone, after the C suites: some of its tests bound a server's latency under load
PYTEST_FILES=${PYTEST_FILES:-tests/python}
[ -n "$PYTEST_FILES" ] && start run_pytest && reap

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]

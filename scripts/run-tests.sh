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

for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    out=$("$t" 2>&1)
    rc=$?
    last=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    p=$(count "$last" passed) f=$(count "$last" failed) s=$(count "$last" skipped)
    p=${p:-0} f=${f:-0} s=${s:-0}
    # a crash, a non-zero exit or a missing summary without a counted failure is one failure
    if { [ $rc -ne 0 ] || [ -z "$last" ]; } && [ "$f" -eq 0 ]; then f=1; fi
    passed=$((passed + p))
    failed=$((failed + f))
    skipped=$((skipped + s))
    if [ "$f" -ne 0 ]; then
        printf '%s\n' "$out" | grep -v '^ok ' | tail -n 40
        echo "[c] $name: $p passed, $f failed, $s skipped (exit $rc)"
    elif [ "$s" -ne 0 ]; then
        printf '%s\n' "$out" | grep -E '^(skip |  skip: )'
        echo "[c] $name: $p passed, $s skipped"
    else
        echo "[c] $name: $p passed"
    fi
done

PYTEST_FILES=${PYTEST_FILES:-tests/python}
if [ -n "$PYTEST_FILES" ]; then
    # -rs lists each skip with its reason; an empty parametrisation is a collection error
    # shellcheck disable=SC2086
    out=$(.venv/bin/python -m pytest -q -rs -p no:cacheprovider -o empty_parameter_set_mark=fail_at_collect \
          ${PYTEST_ARGS:-} $PYTEST_FILES 2>&1)
    rc=$?
    printf '%s\n' "$out" | tail -n 60
    summary=$(printf '%s\n' "$out" | grep -E '[0-9]+ (passed|failed|skipped|errors?)' | tail -n 1)
    p=$(count "$summary" passed) f=$(count "$summary" failed) s=$(count "$summary" skipped)
    e=$(count "$summary" 'errors?')
    p=${p:-0} s=${s:-0} f=$(( ${f:-0} + ${e:-0} ))
    # exit 5 (nothing collected) or any other failure without a counted one is one failure
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    passed=$((passed + p))
    failed=$((failed + f))
    skipped=$((skipped + s))
    echo "[python] pytest: $p passed, $f failed, $s skipped (exit $rc)"
fi

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]

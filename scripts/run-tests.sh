#!/usr/bin/env bash
# Runs every test: each build/tests/test_* C binary, then pytest over tests/python.
# Prints each suite's result and ends with one line "N passed, N failed".
# Environment: BUILD (default build), PYTEST_FILES (default tests/python), PYTEST_ARGS
# (extra pytest arguments).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export TESSERA_ROOT=$PWD
export TESSERA_SHARED=${TESSERA_SHARED:-$(cd .. && pwd)/shared}
export TESSERA_BIN=$PWD/$BUILD/tessera
export TESSERA_BUILD=$PWD/$BUILD
passed=0
failed=0

for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    out=$("$t" 2>&1)
    rc=$?
    last=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    if [ -n "$last" ]; then
        p=${last%% passed*}
        f=$(echo "$last" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    else
        p=0 f=0
    fi
    # a crash or non-zero exit without a counted failure is one failure
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    passed=$((passed + p))
    failed=$((failed + f))
    if [ "$f" -ne 0 ]; then
        printf '%s\n' "$out" | grep -v '^ok ' | tail -n 40
        echo "[c] $name: $p passed, $f failed (exit $rc)"
    else
        echo "[c] $name: $p passed"
    fi
done

PYTEST_FILES=${PYTEST_FILES:-tests/python}
if [ -n "$PYTEST_FILES" ] && ls tests/python/test_*.py >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    out=$(.venv/bin/python -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} $PYTEST_FILES 2>&1)
    rc=$?
    printf '%s\n' "$out" | tail -n 60
    summary=$(printf '%s\n' "$out" | grep -E '[0-9]+ (passed|failed)' | tail -n 1)
    p=$(echo "$summary" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || true)
    f=$(echo "$summary" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+' || true)
    e=$(echo "$summary" | grep -oE '[0-9]+ errors?' | grep -oE '[0-9]+' || true)
    p=${p:-0} f=$(( ${f:-0} + ${e:-0} ))
    if [ $rc -ne 0 ] && [ $rc -ne 5 ] && [ "$f" -eq 0 ]; then f=1; fi
    passed=$((passed + p))
    failed=$((failed + f))
    echo "[python] pytest: $p passed, $f failed"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

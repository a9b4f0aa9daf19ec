#!/usr/bin/env bash
# The one command for a machine with an NVIDIA GPU (no network needed): builds the CUDA
# kernels, the backend library and the kernel tests/benchmarks there with nvcc, runs every
# kernel test on the real GPU (the same tests `make test` runs on the CPU emulator),
# compute-sanitizer memcheck and racecheck over them where the machine supports it, the
# kernel benchmarks against the copy-bandwidth and cuBLAS ceilings measured in the same
# run, and `tessera devices`; prints one short results table. Designed to finish well
# inside 8 minutes on one H200.
#
#   scripts/gpu-check.sh [OUTDIR]        (logs go to OUTDIR, default build/gpu-check)
#
# Environment: ARCHS (nvcc -gencode flags; default Hopper sm_90a only, for build time),
# JOBS (make -j, default nproc), SKIP_SANITIZER=1, SANITIZER_TIMEOUT (s per test, 120),
# DEBS (a folder of .deb files for libmicrohttpd, cJSON, libyaml, pcre2, utf8proc and
# their -dev packages; unpacked into a private prefix when the machine lacks them, so the
# server binary can be built too — see docs/kernels.md "Running the GPU check").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build/gpu-check}
mkdir -p "$OUT"
ARCHS=${ARCHS:--gencode=arch=compute_90a,code=sm_90a}
JOBS=${JOBS:-$(nproc)}
SANITIZER_TIMEOUT=${SANITIZER_TIMEOUT:-120}
DEBS=${DEBS:-.debs}
START=$(date +%s)
declare -a ROWS=()
row() { ROWS+=("$(printf '%-44s %-8s %s' "$1" "$2" "$3")"); echo "== $1: $2 $3"; }
elapsed() { echo "$(( $(date +%s) - START ))s"; }

command -v nvcc >/dev/null || { echo "gpu-check: nvcc not found" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
nvcc --version | tail -n 2 | tee -a "$OUT/gpu.txt"

# The Makefile runs scripts/install-deps.sh (apt) before the first compile; a GPU machine
# without network cannot, and the kernel tests need none of those packages.
mkdir -p build && touch build/.deps-ok

# Server dependencies from carried .deb files, if any (optional: only build/tessera needs them).
if [ -d "$DEBS" ] && ls "$DEBS"/*.deb >/dev/null 2>&1; then
    PREFIX=/tmp/tessera-debs
    mkdir -p "$PREFIX"
    for f in "$DEBS"/*.deb; do dpkg -x "$f" "$PREFIX"; done
    export CPATH="$PREFIX/usr/include${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# ---- build -------------------------------------------------------------------------------
if make -j"$JOBS" CUDA=1 CUDA_ARCHS="$ARCHS" build/libtessera-cuda.so build/cuda/ptxas.log \
        build/tessera-kernel-bench cuda-tests >"$OUT/build.log" 2>&1; then
    row "build kernels + tests (nvcc)" PASS "$(elapsed)"
else
    tail -n 30 "$OUT/build.log"
    row "build kernels + tests (nvcc)" FAIL "see $OUT/build.log"
fi
if scripts/ptxas-report.py build/cuda/ptxas.log >"$OUT/ptxas.txt" 2>&1; then
    row "ptxas: no register spills" PASS "$(tail -n 1 "$OUT/ptxas.txt")"
else
    row "ptxas: no register spills" FAIL "$(tail -n 1 "$OUT/ptxas.txt")"
fi
if make -j"$JOBS" CUDA=1 CUDA_ARCHS="$ARCHS" build/tessera >"$OUT/build-server.log" 2>&1; then
    row "build tessera (server binary)" PASS ""
    build/tessera devices >"$OUT/devices.txt" 2>&1
    row "tessera devices" "$(grep -q '^cuda:0:' "$OUT/devices.txt" && echo PASS || echo FAIL)" \
        "$(grep '^cuda:0:' "$OUT/devices.txt" | head -n 1 | cut -c1-60)"
else
    row "build tessera (server binary)" SKIP "no server deps here (carry .debs; $OUT/build-server.log)"
fi

# ---- kernel tests on the GPU ---------------------------------------------------------------
for t in build/cuda/tests/test_kernel_*; do
    [ -x "$t" ] || continue
    n=$(basename "$t")
    s=$(date +%s)
    if "$t" >"$OUT/$n.log" 2>&1; then st=PASS; else st=FAIL; fi
    row "$n" "$st" "$(tail -n 1 "$OUT/$n.log") ($(( $(date +%s) - s ))s)"
done

# ---- compute-sanitizer ------------------------------------------------------------------------
if [ "${SKIP_SANITIZER:-0}" != 1 ] && command -v compute-sanitizer >/dev/null; then
    for tool in memcheck racecheck; do
        for t in build/cuda/tests/test_kernel_*; do
            [ -x "$t" ] || continue
            n=$(basename "$t")
            log="$OUT/$n.$tool.log"
            timeout "$SANITIZER_TIMEOUT" compute-sanitizer --tool "$tool" --error-exitcode 99 \
                --print-limit 20 "$t" >"$log" 2>&1
            rc=$?
            case $rc in
                0) row "$tool $n" PASS "" ;;
                124) row "$tool $n" TIMEOUT "${SANITIZER_TIMEOUT}s" ;;
                *) row "$tool $n" FAIL "rc $rc: $(grep -m1 -E 'ERROR|Invalid|hazard' "$log" | cut -c1-60)" ;;
            esac
        done
    done
else
    row "compute-sanitizer" SKIP "not installed or SKIP_SANITIZER=1"
fi

# ---- benchmarks --------------------------------------------------------------------------------
if build/tessera-kernel-bench >"$OUT/kernel-bench.txt" 2>&1; then
    row "kernel bench" PASS "$(grep -c '%' "$OUT/kernel-bench.txt") rows"
else
    row "kernel bench" FAIL "see $OUT/kernel-bench.txt"
fi

echo
echo "---- kernel bench ----"
cat "$OUT/kernel-bench.txt"
echo
echo "---- ptxas (sm_90a) ----"
grep -E '^sm_90a|with spills' "$OUT/ptxas.txt" | sort -u | head -n 60
echo
echo "---- results ($(elapsed) total) ----"
printf '%s\n' "${ROWS[@]}"
! printf '%s\n' "${ROWS[@]}" | grep -qE ' (FAIL|TIMEOUT) '

#!/usr/bin/env bash
# The one command for a machine with an NVIDIA GPU (no network needed): builds the CUDA
# kernels, the backend library and the kernel tests/benchmarks there with nvcc, runs every
# kernel test on the real GPU (the same tests `make test` runs on the CPU emulator),
# compute-sanitizer memcheck and racecheck over them where the machine supports it, the
# kernel benchmarks against the copy-bandwidth and cuBLAS ceilings measured in the same
# run, Nsight Compute's counters for the decode attention and the GEMVs (where ncu can read
# them), and `tessera devices`; then the CUDA backend: its end-to-end test against the CPU
# forward on the GPU, `tessera serve --device cuda` with SmolLM2 (greedy text the CPU's,
# parting only at near-ties; a scored prompt's logprobs the CPU's), speculative decoding's
# scheduler test on the GPU, and Qwen2.5-7B with
# --load-format dummy: decode step times at batch 1 / 8 / 64 / 256, the TTFT of one
# 1,024-token prompt, GPU idle between steps, the batch-1, 8, 64 and 256 forwards kernel by
# kernel (tool_bench_cuda --profile; again with FP8 KV, the serving target's weak spot), the dense linears' start-up kernel choice against
# cuBLAS only (TESSERA_CUDA_LINEAR=cublas), without programmatic dependent launches
# (TESSERA_CUDA_PDL=off; also with Q8_0 weights), with Q8_0 weights and no fused kernels
# (TESSERA_CUDA_FUSE=off: a quantizer launch per linear), with the decode attention's earlier fixed split
# (TESSERA_CUDA_DECODE_SPLIT=fixed), with its 16-head blocks instead of the layout measured at
# start-up (TESSERA_CUDA_DECODE_ROWS=16),
# without the L2 prefetch of the next weights (TESSERA_CUDA_L2_PREFETCH=off) and with a mixed
# step's decode rows in the prefill attention (TESSERA_CUDA_MIXED_SPLIT=off), and
# scripts/bench_serving.py at 256 concurrent requests with BF16 and FP8 KV; on a machine
# with 2 or more GPUs, the same model with --tensor-parallel-size 2 (greedy text = one
# GPU's, serving throughput). Prints one
# short results table. Designed to finish inside 8 minutes on one H200 (SKIP_SANITIZER=1
# leaves the most time to the backend rows).
#
#   scripts/gpu-check.sh [OUTDIR]        (logs go to OUTDIR, default build/gpu-check)
#
# Environment: ARCHS (nvcc -gencode flags; default Hopper sm_90a only, for build time),
# JOBS (make -j, default nproc), SKIP_NCU=1, NCU_TIMEOUT (s per profile, 90), SKIP_SANITIZER=1, SANITIZER_TIMEOUT (s per test, 120),
# SANITIZER_TOOLS (default "memcheck racecheck"),
# SKIP_BACKEND=1 (kernel rows only), SKIP_SERVING=1 (no bench_serving runs), SERVING_PROMPTS (bench_serving requests per KV dtype,
# default 256), PORT (default 8765),
# DEBS (a folder of .deb files for libmicrohttpd, cJSON, libyaml, pcre2, utf8proc, libsystemd
# and their -dev packages: scripts/get-server-debs.sh; unpacked into a private prefix when the machine lacks them, so the
# server binary can be built too — see docs/kernels.md "Running the GPU check").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build/gpu-check}
mkdir -p "$OUT"
ARCHS=${ARCHS:--gencode=arch=compute_90a,code=sm_90a}
JOBS=${JOBS:-$(nproc)}
SANITIZER_TIMEOUT=${SANITIZER_TIMEOUT:-120}
BUNDLE=${BUNDLE:-.gpu-bundle}
DEBS=${DEBS:-$([ -d "$BUNDLE/debs" ] && echo "$BUNDLE/debs" || echo .debs)}
SMOL=models/SmolLM2-135M-Instruct.Q4_1.gguf
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

# What this machine lacks, from a bundle made elsewhere (scripts/gpu-bundle.sh), if any:
# the default model (perhaps only its first layers: the rows say so), the Qwen tokenizer,
# and the test models, derived here from the model with the bundle's gguf wheel while the
# build runs.
SMOL_NOTE=
MODELS_PID=
if [ -d "$BUNDLE" ]; then
    if [ ! -f "$SMOL" ] && [ -f "$BUNDLE/model.gguf" ]; then
        mkdir -p models && cp "$BUNDLE/model.gguf" "$SMOL"
        SMOL_NOTE=" [bundle: $(cat "$BUNDLE/model.txt" 2>/dev/null)]"
    fi
    tok=build/testdata/tokenizers/qwen3/tokenizer.json
    if [ ! -f "$tok" ] && [ -f "$BUNDLE/qwen-tokenizer.json.xz" ]; then
        mkdir -p "$(dirname "$tok")"
        python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
            "$BUNDLE/qwen-tokenizer.json.xz" "$tok"
    fi
    if [ ! -d build/testmodels/llama3-tiny-hd64 ] && [ -f "$SMOL" ] && ls "$BUNDLE"/wheels/*.whl >/dev/null 2>&1; then
        site=/tmp/tessera-wheels
        ( python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$BUNDLE"/wheels/*.whl &&
          PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" python3 scripts/make-test-models.py --model "$SMOL" \
              --out build/testmodels --only llama3-tiny llama3-tiny-hd64 qwen2-tiny-hd64 qwen3-tiny-hd64 \
              tiny-q4_0.gguf tiny-q5_0.gguf tiny-q5_1.gguf tiny-q4_k.gguf tiny-mixed.gguf ) >"$OUT/testmodels.log" 2>&1 &
        MODELS_PID=$!
    fi
fi

# ---- build -------------------------------------------------------------------------------
# make -k, so that one object failing leaves the rest built; a build that fails only because
# this machine's newer host compiler warns where ours does not is redone with WERROR= (the
# warnings kept, as warnings) and reported FAIL, so the GPU rows below still run.
KTARGETS="build/libtessera-cuda.so build/cuda/ptxas.log build/tessera-kernel-bench cuda-tests"
STARGETS="build/tessera build/tests/test_cuda_backend build/tests/tool_bench_cuda build/tests/test_sched_grammar
          build/tests/test_sched_spec"
build_all() { # $1 log, then make variables
    local log=$1; shift
    make -k -j"$JOBS" CUDA=1 CUDA_ARCHS="$ARCHS" "$@" $KTARGETS >"$log" 2>&1; local k=$?
    make -k -j"$JOBS" CUDA=1 CUDA_ARCHS="$ARCHS" "$@" $STARGETS >"${log%.log}-server.log" 2>&1; local s=$?
    return $(( k || s ))
}
if build_all "$OUT/build.log"; then
    row "build kernels, tests, server (-Werror)" PASS "$(elapsed)"
else
    row "build kernels, tests, server (-Werror)" FAIL "$(grep -m1 -E 'error|undefined' "$OUT/build.log" "$OUT/build-server.log" | cut -c1-90)"
    grep -h -E -A3 'error' "$OUT/build.log" "$OUT/build-server.log" | head -n 30
    if build_all "$OUT/build-nowerror.log" WERROR=; then
        row "build again with WERROR= (warnings kept)" PASS "$(grep -c 'warning:' "$OUT/build-nowerror.log" "$OUT/build-nowerror-server.log" | paste -sd' ')"
    else
        row "build again with WERROR= (warnings kept)" FAIL "see $OUT/build-nowerror*.log"
    fi
fi
if scripts/ptxas-report.py build/cuda/ptxas.log >"$OUT/ptxas.txt" 2>&1; then
    row "ptxas: no register spills" PASS "$(tail -n 1 "$OUT/ptxas.txt")"
else
    row "ptxas: no register spills" FAIL "$(tail -n 1 "$OUT/ptxas.txt")"
fi
HAVE_SERVER=0
if [ -x build/tessera ] && [ -f build/libtessera-cuda.so ]; then
    HAVE_SERVER=1
    build/tessera devices >"$OUT/devices.txt" 2>&1
    row "tessera devices" "$(grep -q '^cuda:0:' "$OUT/devices.txt" && echo PASS || echo FAIL)" \
        "$(grep '^cuda:0:' "$OUT/devices.txt" | head -n 1 | cut -c1-60)"
else
    row "tessera + libtessera-cuda.so built" SKIP "no server deps here (carry .debs) or the library failed: $OUT/build*.log"
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
    for tool in ${SANITIZER_TOOLS:-memcheck racecheck}; do
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
# the side-by-side ratios (the lines after the decode attention's and the quantized GEMV's
# rows) in the table
while IFS= read -r line; do
    row "kernel bench: ${line%%:*}" INFO "${line#*: }"
done < <(grep -E '^(attention_decode|qmm_gemv) .* time' "$OUT/kernel-bench.txt")

# ---- Nsight Compute: where the key kernels' time goes -------------------------------------------
# The bench again with --once (one launch per row, in the table's order), under ncu with the
# hardware counters: each kernel's DRAM and SM throughput, occupancy, issue-slot use and its
# largest warp stall reasons (scripts/ncu-table.py), for the decode attention (every row:
# BF16 and FP8 at S=64 ctx=2048 first), the dense GEMV at one token (gate/up, down, QKV and
# the LM head; each plainly, then with pdl), the skinny GEMM at 8 tokens (rows 25-32 of its
# launches) and the quantized GEMVs at one token (Q8_0, then Q4_K with direct and with
# staged weight loads, for both shapes). ncu replays each launch with cold caches
# (its default cache control), so the rows read their weights from HBM. SKIP_NCU=1 skips it;
# where ncu cannot read the counters (some virtual machines), the first profile says so (a
# SKIP row) and the rest is skipped. NCU_TIMEOUT: seconds per profile (90).
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)}
NCU_STALLS=$(for s in long_scoreboard short_scoreboard mio_throttle barrier math_pipe_throttle wait lg_throttle \
                      not_selected; do printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' "$s"; done)
NCU_METRICS="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,${NCU_STALLS%,}"
# ncu_profile NAME KERNEL_REGEX SKIP COUNT BENCH_FILTER: $OUT/ncu-NAME.{ncu-rep,csv,txt,log};
# the metrics above, or ncu's standard sections if this ncu refuses one of them.
ncu_profile() {
    local rep="$OUT/ncu-$1" how
    for how in metrics sections; do
        local what=(--metrics "$NCU_METRICS")
        [ "$how" = sections ] && what=(--section SpeedOfLight --section LaunchStats --section Occupancy)
        timeout "${NCU_TIMEOUT:-90}" "$NCU" --clock-control none "${what[@]}" -k "regex:$2" --launch-skip "$3" \
            --launch-count "$4" -f -o "$rep" build/tessera-kernel-bench --once --filter "$5" >"$rep.log" 2>&1 &&
            "$NCU" --import "$rep.ncu-rep" --csv --page raw >"$rep.csv" 2>>"$rep.log" &&
            python3 scripts/ncu-table.py "$rep.csv" >"$rep.txt" 2>>"$rep.log" && return 0
        grep -qiE 'LibraryNotLoaded|ERR_NVGPUCTRPERM|not supported|permission' "$rep.log" && return 2
    done
    return 1
}
if [ "${SKIP_NCU:-0}" = 1 ] || [ -z "$NCU" ] || [ ! -x build/tessera-kernel-bench ]; then
    row "ncu kernel profiles" SKIP "SKIP_NCU=1, no ncu, or no kernel bench"
else
    for spec in "attention_decode attention_decode_kernel 0 21 attention_decode" \
                "dense_gemv_t1 dense_gemv_kernel 0 8 dense_gemv" \
                "skinny_gemm_t8 skinny_gemm_kernel 24 8 skinny_gemm" \
                "quant_gemv_t1 quant_gemv_kernel 0 6 qmm_gemv"; do
        read -r name regex skip count filter <<<"$spec"
        ncu_profile "$name" "$regex" "$skip" "$count" "$filter"
        case $? in
            0) row "ncu $name" PASS "$(python3 scripts/ncu-table.py "$OUT/ncu-$name.csv" --summary 90)" ;;
            2) row "ncu kernel profiles" SKIP "ncu cannot read the counters here: $(grep -m1 -iE 'error' "$OUT/ncu-$name.log" | cut -c1-60)"
               break ;;
            *) row "ncu $name" FAIL "$(grep -m1 -iE 'error|fail' "$OUT/ncu-$name.log" | cut -c1-80)" ;;
        esac
    done
fi

# ---- the CUDA backend --------------------------------------------------------------------------
PORT=${PORT:-8765}
SERVING_PROMPTS=${SERVING_PROMPTS:-256}
QWEN_DIR=/tmp/tessera-qwen2.5-7b-dummy

# Starts `tessera serve ARGS...` on $PORT in the background (pid in SERVER_PID, log in $1)
# and waits for /health; returns non-zero if it exits or is not healthy within 300 s.
start_server() {
    local log=$1; shift
    build/tessera serve --host 127.0.0.1 --port "$PORT" "$@" >"$log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 600); do
        kill -0 "$SERVER_PID" 2>/dev/null || return 1
        python3 -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2).status == 200 else 1)" \
            2>/dev/null && return 0
        sleep 0.5
    done
    return 1
}
stop_server() { [ -n "${SERVER_PID:-}" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null; SERVER_PID=; }

# Greedy completions of 8 prompts (32 tokens each, top-2 logprobs) from the server on $PORT,
# one JSON line each.
greedy_texts() {
    python3 - "$PORT" <<'PY'
import json, sys, urllib.request
port = sys.argv[1]
prompts = ["The capital of France is", "Write a haiku about the sea.", "def fibonacci(n):",
           "Once upon a time, in a small village,", "2 + 2 =", "Translate to German: good morning",
           "The three laws of thermodynamics are", "List the planets of the solar system:"]
for p in prompts:
    body = json.dumps({"prompt": p, "max_tokens": 32, "temperature": 0, "logprobs": 2}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    print(json.dumps(json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]))
PY
}

# A scored text (echo + logprobs, max_tokens 0: each prompt token's logprob) from the
# server on $PORT, one JSON line.
score_text() {
    python3 - "$PORT" <<'PY'
import json, sys, urllib.request
text = ("The quick brown fox jumps over the lazy dog. Then it ran into the forest, where the old "
        "clockmaker lived. Every morning he opened the shutters of his workshop and wound the clock.")
body = json.dumps({"prompt": text, "max_tokens": 0, "echo": True, "logprobs": 1}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", body, {"Content-Type": "application/json"})
print(json.dumps(json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["logprobs"]))
PY
}

# The prompt logprobs of two servers: the same tokens, logprobs within 0.5 nats each and
# 0.1 on average (the backends' float arithmetic differs: int8 activations on the CPU).
# Prints "PASS|FAIL detail".
compare_scores() {
    python3 - "$1" "$2" <<'PY'
import json, sys
a, b = (json.loads(open(f).read()) for f in sys.argv[1:3])
ok = a["tokens"] == b["tokens"] and a["token_logprobs"][0] is None and b["token_logprobs"][0] is None
d = [abs(x - y) for x, y in zip(a["token_logprobs"][1:], b["token_logprobs"][1:])] if ok else [99.0]
ok = ok and max(d) <= 0.5 and sum(d) / len(d) <= 0.1
print("PASS" if ok else "FAIL", f"{len(a['tokens'])} tokens, |dlogprob| max {max(d):.3f} mean {sum(d) / len(d):.3f}")
PY
}

# The rule of tests/python/test_server_cuda.py: identical, or parting where the two
# backends' top log-probabilities agree within 0.3 nats (a near-tie), for at most 3 of 8.
# Prints "PASS|FAIL detail".
compare_greedy() {
    python3 - "$1" "$2" <<'PY'
import json, sys
cpu = [json.loads(l) for l in open(sys.argv[1])]
gpu = [json.loads(l) for l in open(sys.argv[2])]
same, parted, bad = 0, [], []
for i, (w, g) in enumerate(zip(cpu, gpu)):
    a, b = w["logprobs"]["tokens"], g["logprobs"]["tokens"]
    k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if k is None and len(a) == len(b):
        same += 1
        continue
    k = min(len(a), len(b)) if k is None else k
    lw, lg = w["logprobs"]["top_logprobs"][k], g["logprobs"]["top_logprobs"][k]
    common = set(lw) & set(lg)
    worst = max((abs(lw[t] - lg[t]) for t in common), default=99.0)
    (parted if worst < 0.3 else bad).append(f"{i}@{k}:{worst:.3f}")
ok = len(cpu) == 8 and len(gpu) == 8 and not bad and len(parted) <= 3
print("PASS" if ok else "FAIL", f"{same}/8 identical; parted at near-ties {parted or '-'}; disagreeing {bad or '-'}")
PY
}

if [ -n "$MODELS_PID" ]; then
    if wait "$MODELS_PID"; then row "test models (derived here)" PASS "$(grep -c '^make-test-models: made' "$OUT/testmodels.log") made"
    else row "test models (derived here)" FAIL "$(tail -n 1 "$OUT/testmodels.log" | cut -c1-80)"; fi
fi
if [ "${SKIP_BACKEND:-0}" = 1 ]; then
    row "CUDA backend" SKIP "SKIP_BACKEND=1"
elif [ "$HAVE_SERVER" != 1 ]; then
    row "CUDA backend" SKIP "needs the server build (carry .debs)"
else
    # 1. the backend's end-to-end test (make test runs it on the emulator) on the GPU
    s=$(date +%s)
    if TESSERA_CUDA_TEST_LIB=build/libtessera-cuda.so timeout 600 build/tests/test_cuda_backend \
            >"$OUT/test_cuda_backend.log" 2>&1; then st=PASS; else st=FAIL; fi
    row "test_cuda_backend (on the GPU)" "$st" "$(tail -n 1 "$OUT/test_cuda_backend.log") ($(( $(date +%s) - s ))s)$SMOL_NOTE"
    # programmatic dependent launches are on by default (sm_90+): if the test fails with
    # them and passes without, say so and run the rest of the check without them, so one
    # fault does not cost every figure of the run
    if [ "$st" = FAIL ] && [ "${TESSERA_CUDA_PDL:-on}" != off ]; then
        if TESSERA_CUDA_PDL=off TESSERA_CUDA_TEST_LIB=build/libtessera-cuda.so timeout 600 \
                build/tests/test_cuda_backend >"$OUT/test_cuda_backend-nopdl.log" 2>&1; then
            row "pdl launches (TESSERA_CUDA_PDL=on)" FAIL \
                "test_cuda_backend passes only with TESSERA_CUDA_PDL=off; the rest runs without pdl"
            export TESSERA_CUDA_PDL=off
        fi
    fi

    # the engine tests below compare runs of separate backends, so the start-up
    # measurements' choices are fixed for them (timing may pick differently in each);
    # test_cuda_backend does the same by itself
    FIXED_CHOICES="TESSERA_CUDA_LINEAR=fixed TESSERA_CUDA_DECODE_ROWS=16 TESSERA_CUDA_QUANT_LOADS=direct"
    # 1b. constrained decoding on the GPU: the sampling kernel applies the grammar masks
    # (SmolLM2: choices, a schema, a regex, json_object next to free sequences)
    s=$(date +%s)
    # shellcheck disable=SC2086
    if [ -f "$SMOL" ] && env $FIXED_CHOICES TESSERA_TEST_DEVICE=cuda TESSERA_CUDA_LIB=build/libtessera-cuda.so \
            TESSERA_TEST_MODEL="$SMOL" timeout 300 build/tests/test_sched_grammar \
            >"$OUT/test_sched_grammar.log" 2>&1; then st=PASS; else st=FAIL; fi
    row "test_sched_grammar (on the GPU)" "$st" "$(tail -n 1 "$OUT/test_sched_grammar.log") ($(( $(date +%s) - s ))s)$SMOL_NOTE"

    # 1c. speculative decoding on the GPU: several sampling rows of a sequence per step,
    # outputs those of one token per step (the tiny BF16 llama3, as make test's emulated pass)
    s=$(date +%s)
    if [ ! -d build/testmodels/llama3-tiny-hd64 ]; then
        row "test_sched_spec (on the GPU)" SKIP "build/testmodels missing (carry it)"
    else
        # shellcheck disable=SC2086
        if env $FIXED_CHOICES TESSERA_TEST_DEVICE=cuda TESSERA_CUDA_LIB=build/libtessera-cuda.so \
                TESSERA_TEST_MODEL=build/testmodels/llama3-tiny-hd64 timeout 300 build/tests/test_sched_spec \
                >"$OUT/test_sched_spec.log" 2>&1; then st=PASS; else st=FAIL; fi
        row "test_sched_spec (on the GPU)" "$st" "$(tail -n 1 "$OUT/test_sched_spec.log") ($(( $(date +%s) - s ))s)"
    fi

    # 2. the server on the GPU gives the CPU's greedy text
    if [ -f "$SMOL" ]; then
        ok=1
        for dev in cpu cuda; do
            if start_server "$OUT/serve-smollm2-$dev.log" --model "$SMOL" --device "$dev" --max-model-len 2048 \
                    --kv-cache-dtype fp16; then
                greedy_texts >"$OUT/greedy-$dev.txt" 2>>"$OUT/serve-smollm2-$dev.log" || ok=0
                score_text >"$OUT/score-$dev.txt" 2>>"$OUT/serve-smollm2-$dev.log" || ok=0
            else
                ok=0
            fi
            stop_server
        done
        if [ $ok = 1 ]; then
            res=$(compare_greedy "$OUT/greedy-cpu.txt" "$OUT/greedy-cuda.txt" 2>&1)
            row "serve SmolLM2: cuda greedy = cpu" "${res%% *}" "8 prompts x 32 tokens: ${res#* }$SMOL_NOTE"
            res=$(compare_scores "$OUT/score-cpu.txt" "$OUT/score-cuda.txt" 2>&1)
            row "serve SmolLM2: cuda prompt logprobs = cpu" "${res%% *}" "${res#* }$SMOL_NOTE"
        else
            row "serve SmolLM2: cuda greedy = cpu" FAIL "see $OUT/greedy-*.txt, serve-smollm2-*.log"
        fi
    else
        row "serve SmolLM2: cuda greedy = cpu" SKIP "$SMOL missing"
    fi

    # 3. Qwen2.5-7B with random weights: step times, TTFT, idle, serving throughput
    rm -rf "$QWEN_DIR" && mkdir -p "$QWEN_DIR"
    cp config/models/Qwen2.5-7B-Instruct/*.json "$QWEN_DIR"/
    [ -f build/testdata/tokenizers/qwen3/tokenizer.json ] && cp build/testdata/tokenizers/qwen3/tokenizer.json "$QWEN_DIR"/
    s=$(date +%s)
    if TESSERA_CUDA_LIB=build/libtessera-cuda.so timeout 400 build/tests/tool_bench_cuda "$QWEN_DIR" --dummy \
            --kv-cache-dtype bf16 --profile >"$OUT/bench-cuda-qwen7b.txt" 2>"$OUT/bench-cuda-qwen7b.log"; then st=PASS; else st=MISS; fi
    row "Qwen2.5-7B dummy: backend step bench" "$st" "$(( $(date +%s) - s ))s (table below)"
    # the same weights quantized to Q8_0 at load (--quantization q8_0): ~53% of the bytes;
    # batches 1 and 8 and the prefill only (--max-num-seqs 8), to keep the script short
    s=$(date +%s)
    if TESSERA_CUDA_LIB=build/libtessera-cuda.so timeout 240 build/tests/tool_bench_cuda "$QWEN_DIR" --dummy \
            --kv-cache-dtype bf16 --quantization q8_0 --max-num-seqs 8 --steps 32 \
            >"$OUT/bench-cuda-qwen7b-q8_0.txt" \
            2>"$OUT/bench-cuda-qwen7b-q8_0.log"; then st=PASS; else st=INFO; fi
    # stepn TABLE N: the tool's decode step time at batch N (ms)
    stepn() { awk -v n="$2" '$1 == "decode" && $3 == "batch" && $4 == n && $5 != "/" { print $5 }' "$1" 2>/dev/null; }
    step1() { stepn "$1" 1; }
    row "Qwen2.5-7B dummy -q q8_0: batch-1 step" "$st" \
        "$(step1 "$OUT/bench-cuda-qwen7b-q8_0.txt") ms vs BF16 $(step1 "$OUT/bench-cuda-qwen7b.txt") ms, $(( $(date +%s) - s ))s"
    step8() { stepn "$1" 8; }
    # baseline NAME "LABEL" VAR=VALUE [REF TOOL-ARGS...]: the batch-1 and batch-8 steps again
    # with one setting changed, side by side with those of REF (default: the main run's
    # table; TOOL-ARGS go to the tool, e.g. --quantization q8_0 beside the q8_0 run). The
    # tool exits 1 on a missed target; the row needs only its step times.
    baseline() {
        local f="$OUT/bench-cuda-qwen7b-$1.txt" label=$2 setting=$3 ref="$OUT/bench-cuda-qwen7b.txt"
        shift 3
        if [ $# -gt 0 ]; then ref=$1; shift; fi
        env "$setting" TESSERA_CUDA_LIB=build/libtessera-cuda.so timeout 240 build/tests/tool_bench_cuda \
            "$QWEN_DIR" --dummy --kv-cache-dtype bf16 --max-num-seqs 8 --steps 32 "$@" >"$f" 2>"${f%.txt}.log"
        if [ -n "$(step1 "$f")" ]; then st=INFO; else st=FAIL; fi
        local mixed=""
        [ -n "$(mixed1 "$f")" ] && mixed=", mixed step $(mixed1 "$ref") vs $(mixed1 "$f") ms"
        row "Qwen2.5-7B dummy: $label" "$st" \
            "batch 1 $(step1 "$ref") vs $(step1 "$f") ms, batch 8 $(step8 "$ref") vs $(step8 "$f") ms$mixed"
    }
    # the mixed step's time (64 decode rows beside a 1,024-token prompt), where the tool ran it
    mixed1() { awk '$1 == "mixed" && $2 == "step," && $3 == "64" { print $8 }' "$1" 2>/dev/null; }
    # the issue's serving targets before the baselines below, so that a run cut short by
    # its time limit still has them
    if [ "${SKIP_SERVING:-0}" = 1 ]; then
        row "bench_serving (Qwen2.5-7B dummy)" SKIP "SKIP_SERVING=1"
    elif [ -f "$QWEN_DIR/tokenizer.json" ]; then
        for kv in bf16 fp8; do
            if start_server "$OUT/serve-qwen7b-$kv.log" --model "$QWEN_DIR" --load-format dummy --device cuda \
                    --max-model-len 4096 --max-num-seqs 256 --kv-cache-dtype "$kv" --gpu-memory-utilization 0.9; then
                python3 scripts/bench_serving.py --base-url "http://127.0.0.1:$PORT" --num-prompts "$SERVING_PROMPTS" \
                    --max-concurrency 256 --random-input-len 1024 --random-output-len 1024 --ignore-eos \
                    --result-json "$OUT/serving-$kv.json" --quiet >"$OUT/serving-$kv.txt" 2>&1
                tps=$(python3 -c "import json;d=json.load(open('$OUT/serving-$kv.json'));print(round(d.get('output_throughput',0)))" 2>/dev/null || echo 0)
                want=$([ $kv = bf16 ] && echo 11000 || echo 13000)
                row "bench_serving 256 x 1024/1024, $kv KV" "$([ "${tps:-0}" -ge $want ] && echo PASS || echo MISS)" \
                    "$tps output tok/s (target >= $want)"
            else
                row "bench_serving 256 x 1024/1024, $kv KV" FAIL "server did not start: $OUT/serve-qwen7b-$kv.log"
            fi
            stop_server
        done
    else
        row "bench_serving (Qwen2.5-7B dummy)" SKIP "no Qwen tokenizer.json (make test provisions build/testdata)"
    fi
    # the same steps with FP8 KV (the same step count and contexts as the BF16 run), kernel
    # by kernel at every batch: where the FP8 serving target's step time goes (the decode
    # attention's share against the BF16 run's)
    s=$(date +%s)
    if TESSERA_CUDA_LIB=build/libtessera-cuda.so timeout 240 build/tests/tool_bench_cuda "$QWEN_DIR" --dummy \
            --kv-cache-dtype fp8 --profile >"$OUT/bench-cuda-qwen7b-fp8.txt" \
            2>"$OUT/bench-cuda-qwen7b-fp8.log"; then st=PASS; else st=INFO; fi
    if [ -n "$(stepn "$OUT/bench-cuda-qwen7b-fp8.txt" 256)" ]; then
        row "Qwen2.5-7B dummy: fp8 vs bf16 KV steps" "$st" "batch 64 $(stepn "$OUT/bench-cuda-qwen7b-fp8.txt" 64) vs \
$(stepn "$OUT/bench-cuda-qwen7b.txt" 64) ms, batch 256 $(stepn "$OUT/bench-cuda-qwen7b-fp8.txt" 256) vs \
$(stepn "$OUT/bench-cuda-qwen7b.txt" 256) ms, $(( $(date +%s) - s ))s"
    else
        row "Qwen2.5-7B dummy: fp8 vs bf16 KV steps" FAIL "see $OUT/bench-cuda-qwen7b-fp8.log"
    fi
    # the baselines: one setting changed at a time, side by side with the default,
    # those that decide a default first
    # the decode attention's layout per batch bucket as measured at start-up (the default:
    # 8 or 16 query heads per block, src/backend/cuda/attention_plan.cu) against 16 heads
    # (16x16x16 fragments, the only layout before) for Qwen's group of 7
    baseline rows16 "decode attention layout measured (default) vs 16-head" TESSERA_CUDA_DECODE_ROWS=16
    # a mixed step's decode rows through the decode attention (the default: split as a
    # decode step of those rows) against every row through the prefill attention; 65
    # sequences, so that the tool runs its mixed step of 64 decode rows (and batch 64)
    baseline mixed "mixed step: decode rows split off vs not" TESSERA_CUDA_MIXED_SPLIT=off \
        "$OUT/bench-cuda-qwen7b.txt" --max-num-seqs 65
    # the norms and RoPE of small decode steps prefetching the next linear's weights into
    # the L2 (kernels/l2_hint.h; the default on sm_90+) against no prefetch
    baseline nol2 "L2 prefetch of the next weights vs none" TESSERA_CUDA_L2_PREFETCH=off
    # without programmatic dependent launches (every kernel launched plainly, no pdl
    # candidates for the linears)
    baseline nopdl "pdl launches vs none" TESSERA_CUDA_PDL=off
    # the dense linears' start-up choice (src/backend/cuda/linear.cu) against cuBLAS alone
    baseline cublas "linear kernels chosen vs cuBLAS only" TESSERA_CUDA_LINEAR=cublas
    # the decode attention's split (src/backend/cuda/forward.cu, cu_decode_split): partitions
    # of 64 positions, at most one wave of blocks, against the fixed 512-position rule before
    baseline fixedsplit "decode split by wave vs fixed" TESSERA_CUDA_DECODE_SPLIT=fixed
    # the quantized GEMVs and their activation quantization as pdl launches (the default)
    # against plain launches, on the Q8_0 weights
    baseline q8nopdl "-q q8_0: pdl launches vs none" TESSERA_CUDA_PDL=off "$OUT/bench-cuda-qwen7b-q8_0.txt" \
        --quantization q8_0
    # the norms, SiLU·mul and the decode attention writing the quantized GEMVs' input
    # themselves (the other fused kernels are for dense weights) against a quantizer launch
    # per linear
    baseline q8nofuse "-q q8_0: fused kernels vs none" TESSERA_CUDA_FUSE=off "$OUT/bench-cuda-qwen7b-q8_0.txt" \
        --quantization q8_0

    # 4. tensor parallel over 2 GPUs (a machine with one GPU skips it): the same dummy
    # Qwen2.5-7B served with -tp 2 gives -tp 1's greedy text, and its serving throughput
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    if [ "${ngpu:-0}" -ge 2 ] && [ -f "$QWEN_DIR/tokenizer.json" ]; then
        ok=1
        for tp in 1 2; do
            if start_server "$OUT/serve-qwen7b-tp$tp.log" --model "$QWEN_DIR" --load-format dummy --device cuda \
                    --max-model-len 4096 --max-num-seqs 256 --tensor-parallel-size "$tp"; then
                greedy_texts >"$OUT/greedy-tp$tp.txt" 2>>"$OUT/serve-qwen7b-tp$tp.log" || ok=0
                if [ "$tp" = 2 ]; then
                    python3 scripts/bench_serving.py --base-url "http://127.0.0.1:$PORT" --num-prompts "$SERVING_PROMPTS" \
                        --max-concurrency 256 --random-input-len 1024 --random-output-len 1024 --ignore-eos \
                        --result-json "$OUT/serving-tp2.json" --quiet >"$OUT/serving-tp2.txt" 2>&1
                    tps=$(python3 -c "import json;d=json.load(open('$OUT/serving-tp2.json'));print(round(d.get('output_throughput',0)))" 2>/dev/null || echo 0)
                    row "bench_serving 256 x 1024/1024, -tp 2" INFO "$tps output tok/s (bf16 KV)"
                fi
            else
                ok=0
            fi
            stop_server
        done
        if [ $ok = 1 ]; then
            res=$(compare_greedy "$OUT/greedy-tp1.txt" "$OUT/greedy-tp2.txt" 2>&1)
            row "serve Qwen2.5-7B dummy: -tp 2 greedy = -tp 1" "${res%% *}" "${res#* }"
        else
            row "serve Qwen2.5-7B dummy: -tp 2 greedy = -tp 1" FAIL "see $OUT/serve-qwen7b-tp*.log"
        fi
    else
        row "tensor parallel (-tp 2)" SKIP "${ngpu:-0} GPU(s) here"
    fi
fi

echo
echo "---- CUDA backend: Qwen2.5-7B, --load-format dummy ----"
cat "$OUT/bench-cuda-qwen7b.txt" 2>/dev/null
echo "-- linear kernels chosen at start-up (src/backend/cuda/linear.cu) --"
grep -E 'BF16 [0-9]+ x [0-9]+ \(|linear kernels chosen' "$OUT/bench-cuda-qwen7b.log" 2>/dev/null | sed 's/^.*cuda: //'
echo "-- decode attention layouts chosen at start-up (src/backend/cuda/attention_plan.cu) --"
grep -h 'decode attention heads per block' "$OUT/bench-cuda-qwen7b.log" "$OUT/bench-cuda-qwen7b-fp8.log" \
    "$OUT"/serve-qwen7b-*.log 2>/dev/null |
    sed 's/^.*cuda: //'
[ -f "$OUT/bench-cuda-qwen7b-q8_0.txt" ] && { echo "-- --quantization q8_0 --"; cat "$OUT/bench-cuda-qwen7b-q8_0.txt"; }
[ -f "$OUT/bench-cuda-qwen7b-fp8.txt" ] && { echo "-- --kv-cache-dtype fp8 --"; cat "$OUT/bench-cuda-qwen7b-fp8.txt"; }
for kv in bf16 fp8 tp2; do
    [ -f "$OUT/serving-$kv.txt" ] && { echo "-- bench_serving, $kv --"; cat "$OUT/serving-$kv.txt"; }
done

echo
echo "---- kernel bench ----"
cat "$OUT/kernel-bench.txt"
for f in "$OUT"/ncu-*.txt; do
    [ -f "$f" ] && { echo; echo "---- $(basename "$f" .txt) (Nsight Compute; warps stalled per issued instruction) ----"; cat "$f"; }
done
echo
echo "---- ptxas (sm_90a) ----"
grep -E '^sm_90a|with spills' "$OUT/ptxas.txt" | sort -u | head -n 60
echo
echo "---- results ($(elapsed) total) ----"
printf '%s\n' "${ROWS[@]}"
! printf '%s\n' "${ROWS[@]}" | grep -qE ' (FAIL|TIMEOUT) '

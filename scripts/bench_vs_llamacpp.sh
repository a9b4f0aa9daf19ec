#!/usr/bin/env bash
# tessera against llama.cpp on the same GGUF and threads, measured side by side on this
# machine (issue 12's CPU targets). Not part of `make test`.
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin scripts/bench_vs_llamacpp.sh [MODEL]
#
# LLAMA_BIN holds llama-bench and llama-server, built once from source, e.g. from the
# PyPI source package of llama-cpp-python (its vendor/llama.cpp):
#   pip download --no-deps --no-binary=:all: llama-cpp-python==0.3.36
#   tar xzf llama_cpp_python-0.3.36.tar.gz && cd llama_cpp_python-0.3.36/vendor/llama.cpp
#   cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON
#   cmake --build build -j --target llama-bench llama-server
#
# Three parts, each alternating the two programs ROUNDS times (other processes on a shared
# machine then hit both alike):
#  1. prefill: `llama-bench -p P -n 0` against `tessera bench --prompt-tokens P`, per
#     thread count (THREADS, default "1 2"), P = PROMPT (512);
#  2. decode: `llama-bench -p 0 -n 64` against tessera bench's decode rate;
#  3. serving: each server in turn with THREADS_SERVE (2) threads, then
#     scripts/bench_serving.py with CONC (8) concurrent fresh random prompts of IN (128)
#     tokens, OUT (64) tokens out with ignore_eos, 4 prompts per client; plus one run at
#     concurrency 1 (time to first token of a lone fresh prompt). A new seed per round
#     keeps every prompt fresh (no prefix-cache hits on either side).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
LLAMA_BIN=${LLAMA_BIN:?set LLAMA_BIN to the directory holding llama-bench and llama-server}
BIN=${BIN:-build/tessera}
PY=${PY:-.venv/bin/python}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-"1 2"}
PROMPT=${PROMPT:-512}
THREADS_SERVE=${THREADS_SERVE:-2}
CONC=${CONC:-8}
IN=${IN:-128}
OUT=${OUT:-64}
TMP=$(mktemp -d)
SRV=
trap '[ -n "$SRV" ] && kill $SRV 2>/dev/null; rm -rf "$TMP"' EXIT

echo "model: $MODEL ($(sha256sum "$MODEL" | cut -c1-12)); cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(nproc) cores"
echo "llama.cpp: $("$LLAMA_BIN/llama-bench" --version 2>&1 | head -1 || true)"
echo "tessera: $($BIN --version 2>&1 | head -1)"

llama_tps() { # llama-bench JSON -> tok/s of the one test
    "$PY" -c 'import json,sys; r=json.load(sys.stdin); print("%.1f" % r[0]["avg_ts"])'
}
tessera_row() { # tessera bench output, row name -> tok/s
    awk -v k="$1" -F'|' '$2 ~ "^ *"k" *$" { gsub(/ tok\/s| /, "", $3); print $3; exit }'
}

echo
echo "== prefill ($PROMPT tokens) and decode (tok/s; round by round)"
printf '%-8s %-5s %-10s %-10s %-10s %-10s\n' round thr "llama pf" "tessera pf" "llama dec" "tessera dec"
for r in $(seq 1 "$ROUNDS"); do
    for t in $THREADS; do
        lp=$("$LLAMA_BIN/llama-bench" -m "$MODEL" -t "$t" -p "$PROMPT" -n 0 -r 3 -o json 2>/dev/null | llama_tps)
        out=$($BIN bench --model "$MODEL" --threads "$t" --prompt-tokens "$PROMPT" --gen-tokens 64 --reps 3 \
              --max-model-len $((PROMPT + 128)) 2>/dev/null)
        tp=$(printf '%s\n' "$out" | tessera_row "$PROMPT")
        td=$(printf '%s\n' "$out" | tessera_row decode)
        ld=$("$LLAMA_BIN/llama-bench" -m "$MODEL" -t "$t" -p 0 -n 64 -r 3 -o json 2>/dev/null | llama_tps)
        printf '%-8s %-5s %-10s %-10s %-10s %-10s\n' "$r" "$t" "$lp" "$tp" "$ld" "$td"
    done
done

PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
start_server() { # tessera|llama
    if [ "$1" = tessera ]; then
        $BIN serve --model "$MODEL" --port "$PORT" --threads "$THREADS_SERVE" --max-num-seqs 64 \
            --log-level warn 2>"$TMP/server.log" &
    else
        "$LLAMA_BIN/llama-server" -m "$MODEL" --port "$PORT" -t "$THREADS_SERVE" -tb "$THREADS_SERVE" \
            -np "$CONC" -c $((CONC * (IN + OUT + 64))) --log-disable >"$TMP/server.log" 2>&1 &
    fi
    SRV=$!
    for _ in $(seq 1 300); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    cat "$TMP/server.log"
    echo "$1 did not come up" >&2
    exit 1
}
stop_server() { kill "$SRV"; wait "$SRV" 2>/dev/null || true; SRV=; }
serve_run() { # server conc seed -> one summary line
    local n=$(($2 * 4))
    [ "$n" -ge 4 ] || n=4
    $PY scripts/bench_serving.py --base-url "http://127.0.0.1:$PORT" --num-prompts "$n" \
        --tokenizer "$MODEL" --tessera-bin "$BIN" --max-concurrency "$2" --random-input-len "$IN" \
        --random-output-len "$OUT" --ignore-eos --temperature 0 --seed "$3" --quiet \
        --result-json "$TMP/r.json" >/dev/null 2>"$TMP/b.log" || { cat "$TMP/b.log"; exit 1; }
    $PY - "$TMP/r.json" "$1" "$2" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
if m["failed"]:
    sys.exit("%d requests failed: %s" % (m["failed"], [e for e in m["errors"] if e][:3]))
print("%-8s %4s %4d %9.1f %9.0f %9.0f %9.0f %8.1f" % (sys.argv[2], sys.argv[3], m["completed"],
      m["output_throughput"], m["mean_ttft_ms"], m["median_ttft_ms"], m["p99_ttft_ms"], m["median_tpot_ms"]))
PYEOF
}

echo
echo "== serving: $THREADS_SERVE threads, fresh random prompts of $IN tokens, $OUT out (ignore_eos)"
printf '%-8s %4s %4s %9s %9s %9s %9s %8s\n' server conc reqs "out tok/s" "TTFT mean" "TTFT med" "TTFT p99" "TPOT med"
for r in $(seq 1 "$ROUNDS"); do
    for s in llama tessera; do
        start_server "$s"
        serve_run "$s" 1 $((1000 + r))
        serve_run "$s" "$CONC" $((2000 + r))
        stop_server
    done
done

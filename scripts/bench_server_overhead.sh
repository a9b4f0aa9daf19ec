#!/usr/bin/env bash
# Server overhead: output tokens/s through HTTP + SSE (tessera serve, driven by
# scripts/bench_serving.py) versus the engine alone (tessera generate --prompts-file) on
# the same prompts, the same output length, the same concurrency and the same engine
# knobs, side by side in one run. Runs alternate (http, engine, http, engine, ...) so
# machine noise hits both; the table prints each run and the ratio of the medians.
#
#   scripts/bench_server_overhead.sh [MODEL]
#   env: CONC (concurrent requests, default 16), IN (prompt tokens, 128), OUT (output
#        tokens, 64), REPS (3), THREADS (forward threads, default all)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
CONC=${CONC:-16}
IN=${IN:-128}
OUT=${OUT:-64}
REPS=${REPS:-3}
THREADS=${THREADS:-0}
BIN=${BIN:-build/tessera}
PY=${PY:-.venv/bin/python}
TMP=$(mktemp -d)
trap 'kill $SRV 2>/dev/null || true; rm -rf "$TMP"' EXIT

PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
ENGINE_ARGS=(--max-num-seqs "$CONC" --kv-cache-memory 512)
THREAD_ARGS=()
[ "$THREADS" -gt 0 ] && THREAD_ARGS=(--threads "$THREADS")

$BIN serve --model "$MODEL" --port "$PORT" "${ENGINE_ARGS[@]}" "${THREAD_ARGS[@]}" \
    --log-level warn 2>"$TMP/server.log" &
SRV=$!
for _ in $(seq 1 200); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    sleep 0.1
done

http_run() { # $1 = seed (fresh prompts: no prefix-cache hits across runs); prints tok/s
    $PY scripts/bench_serving.py --base-url "http://127.0.0.1:$PORT" --num-prompts "$CONC" \
        --max-concurrency "$CONC" --random-input-len "$IN" --random-output-len "$OUT" \
        --ignore-eos --temperature 0 --seed "$1" --quiet --skip-test-run \
        --save-prompts "$TMP/prompts.txt" --result-json "$TMP/http.json" >/dev/null 2>"$TMP/bench.log"
    $PY -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))["output_throughput"])' "$TMP/http.json"
}
engine_run() { # prints output tokens/s of the engine alone on the saved prompts
    $BIN generate --model "$MODEL" --prompts-file "$TMP/prompts.txt" --max-tokens "$OUT" \
        --ignore-eos --temperature 0 "${ENGINE_ARGS[@]}" "${THREAD_ARGS[@]}" \
        2>"$TMP/engine.log" >/dev/null
    sed -nE 's/.* ([0-9.]+) tok\/s.*/\1/p' "$TMP/engine.log" | tail -n 1
}

# warm-up (page cache, prompt building), not counted
http_run 99 >/dev/null
echo "model: $MODEL  concurrency: $CONC  prompt: ~$IN tokens  output: $OUT tokens (ignore_eos, greedy)"
printf '%-5s %16s %16s\n' rep "http+sse tok/s" "engine tok/s"
H=() E=()
for r in $(seq 1 "$REPS"); do
    h=$(http_run "$((100 + r))")
    e=$(engine_run)
    H+=("$h") E+=("$e")
    printf '%-5s %16s %16s\n' "$r" "$h" "$e"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
mh=$(median "${H[@]}")
me=$(median "${E[@]}")
printf '%-5s %16s %16s\n' median "$mh" "$me"
awk -v h="$mh" -v e="$me" 'BEGIN { printf "ratio http/engine: %.3f\n", h / e }'

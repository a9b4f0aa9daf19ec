#!/usr/bin/env bash
# Starts `tessera serve` on MODEL and runs scripts/bench_serving.py once per concurrency
# level (random 128-token prompts, 64 output tokens with ignore_eos, greedy; 4 prompts per
# concurrent client, at least 8), printing one summary row per level.
#   scripts/bench_serving_sweep.sh [MODEL] [CONCURRENCY...]     (default 1 8 32)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
shift || true
LEVELS=("$@")
[ ${#LEVELS[@]} -gt 0 ] || LEVELS=(1 8 32)
BIN=${BIN:-build/tessera}
PY=${PY:-.venv/bin/python}
IN=${IN:-128}
OUT=${OUT:-64}
TMP=$(mktemp -d)
trap 'kill $SRV 2>/dev/null || true; rm -rf "$TMP"' EXIT
PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
$BIN serve --model "$MODEL" --port "$PORT" --max-num-seqs 64 --log-level warn 2>"$TMP/server.log" &
SRV=$!
for _ in $(seq 1 200); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    sleep 0.1
done
printf '%-5s %5s %9s %9s %9s %9s %9s %9s %9s %9s\n' conc reqs "out tok/s" "tot tok/s" \
    "TTFT med" "TTFT p99" "TPOT med" "ITL med" "ITL p99" "E2E med"
for c in "${LEVELS[@]}"; do
    n=$((c * 4)); [ "$n" -ge 8 ] || n=8
    $PY scripts/bench_serving.py --base-url "http://127.0.0.1:$PORT" --num-prompts "$n" \
        --tokenizer "$MODEL" --tessera-bin "$BIN" \
        --max-concurrency "$c" --random-input-len "$IN" --random-output-len "$OUT" --ignore-eos \
        --temperature 0 --seed "$c" --quiet --result-json "$TMP/r.json" >/dev/null 2>"$TMP/b.log" \
        || { cat "$TMP/b.log"; exit 1; }
    $PY - "$TMP/r.json" "$c" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
print("%-5s %5d %9.1f %9.1f %7.0fms %7.0fms %7.1fms %7.1fms %7.1fms %7.0fms" % (
    sys.argv[2], m["completed"], m["output_throughput"], m["total_token_throughput"],
    m["median_ttft_ms"], m["p99_ttft_ms"], m["median_tpot_ms"], m["median_itl_ms"],
    m["p99_itl_ms"], m["median_e2el_ms"]))
if m["failed"]:
    sys.exit("%d requests failed: %s" % (m["failed"], [e for e in m["errors"] if e][:3]))
PYEOF
done
echo "(prompt ~$IN tokens, output $OUT tokens; medians unless noted; model $MODEL)"

#!/usr/bin/env bash
# make bench: decode/prefill speed vs the memory-bandwidth roofline (default model Q4_1
# and its F16 derivative, 1 and 2 threads), CPU matmul kernels vs bandwidth, tokenizer
# encode throughput, engine TTFT cold vs prefix-cache hit and KV capacity per dtype. Every figure is a ratio measured side by side in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/tessera
Q4=models/SmolLM2-135M-Instruct.Q4_1.gguf
F16=$BUILD/testmodels/smollm2-f16.gguf
[ -f "$F16" ] || .venv/bin/python scripts/make-test-models.py --out "$BUILD/testmodels" >/dev/null
echo "## machine"
lscpu | grep -E 'Model name|^CPU\(s\)|L3' | sed 's/  */ /g'
for model in "$Q4" "$F16"; do
    for t in 1 2; do
        echo
        echo "## $(basename "$model"), $t thread(s)"
        "$BIN" bench --model "$model" --threads "$t" --prompt-tokens 128,512,2048 --gen-tokens 64
    done
done
if [ -x "$BUILD/tests/tool_bench_matmul" ]; then
    echo
    echo "## matmul kernels"
    "$BUILD/tests/tool_bench_matmul"
fi
if [ -x "$BUILD/tests/tool_bench_ttft" ]; then
    echo
    echo "## engine TTFT: shared 1,000-token system prompt, cold vs prefix-cache hit"
    "$BUILD/tests/tool_bench_ttft" --model "$Q4" --threads 2 --reps 7
fi
echo
echo "## tokenizer (encode, one core, tessera vs Hugging Face tokenizers)"
BUILD=$BUILD scripts/bench_tokenizer.sh
echo
echo "## server overhead: HTTP+SSE vs the engine alone (same prompts, concurrency 16)"
BIN=$BIN CONC=16 IN=128 OUT=64 REPS=3 scripts/bench_server_overhead.sh "$Q4"
echo
echo "## serving load generator (scripts/bench_serving.py) at concurrency 1, 8, 32"
BIN=$BIN scripts/bench_serving_sweep.sh "$Q4" 1 8 32

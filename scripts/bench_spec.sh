#!/usr/bin/env bash
# Speculative decoding (n-gram) against plain decoding, side by side in one run: four
# workloads through the batching engine (`tessera generate --prompts-file`, greedy), each
# run without --speculative-config ("off"), with it ("spec") and with it plus
# disable_by_batch_size LIMIT ("spec<=LIMIT"), alternated, ROUNDS times. Prints one line per
# run (generated tokens/s, engine steps, proposed tokens kept) and checks that the two
# runs of a workload print the same JSON lines (speculation must not change outputs).
#
#   scripts/bench_spec.sh [MODEL]     (default models/SmolLM2-135M-Instruct.Q4_1.gguf)
#
# Environment: ROUNDS (default 2), THREADS (default 2), DEVICE (default cpu), TOKENS
# (max tokens per prompt, default 256), LIMIT (default 2), SPEC (the JSON without its
# closing brace; default 5 tokens, n-gram 1..4), WORKLOADS (default "code prose batch json"),
# SAMPLING (more generate flags for every run, e.g. "--frequency-penalty 0.3").
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-2}
DEVICE=${DEVICE:-cpu}
TOKENS=${TOKENS:-256}
LIMIT=${LIMIT:-2}
SPEC=${SPEC:-'{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 1'}
WORKLOADS=${WORKLOADS:-code prose batch json}
read -r -a SAMPLING_ARGS <<<"${SAMPLING:-}"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# code: a function quoted back with a small change (the output copies the prompt)
printf '%s\n' 'Here is a Python function:\n\ndef area(width, height):\n    """Return the area of a rectangle."""\n    if width < 0 or height < 0:\n        raise ValueError("negative size")\n    return width * height\n\nRewrite it with the parameter names w and h instead, keeping everything else the same:\n\ndef area(' >"$TMP/code.txt"
# prose: free generation from short prompts (little to copy)
printf '%s\n' 'Once upon a time, in a small village by the sea,' 'The history of the printing press' \
    'Explain why the sky is blue.' 'Write a letter to a friend about your holiday.' >"$TMP/prose.txt"
# json: two sequences of structured output (scripts/bench_schema.json: eight records with the
# same keys), every row masked by the grammar
printf '%s\n' 'List eight people as JSON.' 'Give me a JSON list of 8 people.' >"$TMP/json.txt"
# batch: eight sequences at once, half copying, half free
cat "$TMP/code.txt" "$TMP/code.txt" "$TMP/code.txt" "$TMP/code.txt" "$TMP/prose.txt" >"$TMP/batch.txt"

run() { # workload, label, extra args...
    local w=$1 label=$2
    shift 2
    local schema=()
    [ "$w" = json ] && schema=(--json-schema scripts/bench_schema.json)
    build/tessera generate --model "$MODEL" --prompts-file "$TMP/$w.txt" --temperature 0 --max-tokens "$TOKENS" \
        --threads "$THREADS" --device "$DEVICE" "${schema[@]}" "${SAMPLING_ARGS[@]}" "$@" >"$TMP/$w-$label.out" \
        2>"$TMP/$w-$label.err"
    local stats
    stats=$(grep -E '^\[[0-9]+ prompts' "$TMP/$w-$label.err")
    printf '%-6s %-8s %s\n' "$w" "$label" "$(sed -E 's/^\[([0-9]+) prompts \| ([0-9]+) steps \| ([0-9]+) generated tokens in ([0-9.]+) s, ([0-9.]+) tok\/s.*speculative: ([0-9]+) of ([0-9]+) proposed.*/\5 tok\/s, \2 steps, \3 tokens, kept \6 of \7/' <<<"$stats")"
}

echo "model $MODEL, device $DEVICE, $THREADS threads, $TOKENS tokens per prompt, greedy ${SAMPLING:-}"
for _ in $(seq "$ROUNDS"); do
    for w in $WORKLOADS; do
        run "$w" off
        run "$w" spec --speculative-config "$SPEC}"
        run "$w" "spec<=$LIMIT" --speculative-config "$SPEC, \"disable_by_batch_size\": $LIMIT}"
        for l in spec "spec<=$LIMIT"; do
            cmp -s "$TMP/$w-off.out" "$TMP/$w-$l.out" || { echo "$w: outputs differ with $l"; exit 1; }
        done
    done
done
echo "outputs identical with and without speculation"

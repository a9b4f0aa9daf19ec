#!/usr/bin/env bash
# smoke.sh HOST:PORT [KEY] — the check to run after deploying tessera (or anything
# OpenAI-compatible in front of it: a proxy, a load balancer), with curl only:
#
#   1. GET /health is 200;
#   2. GET /v1/models lists a model (its id is used below);
#   3. a chat completion answers 200 with a message;
#   4. a streamed chat completion (curl -N) arrives incrementally — its events spread over
#      time, not in one burst as a buffering proxy would deliver them — and ends with
#      `data: [DONE]`.
#
# Prints one line per check and a last line "PASS" or "FAIL: <first failed check>"; exits
# 0 or 1. KEY (or $TESSERA_API_KEY) is sent as "Authorization: Bearer KEY". Options by
# environment: SMOKE_TIMEOUT (seconds per request, default 60), SMOKE_SCHEME (http or
# https, default http), SMOKE_MAX_TOKENS (default 32).
set -uo pipefail
export LC_ALL=C

if [ $# -lt 1 ] || [ $# -gt 2 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
target=$1
key=${2:-${TESSERA_API_KEY:-}}
timeout=${SMOKE_TIMEOUT:-60}
scheme=${SMOKE_SCHEME:-http}
max_tokens=${SMOKE_MAX_TOKENS:-32}
base="$scheme://$target"
command -v curl >/dev/null || { echo "FAIL: curl is not installed"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
auth=()
[ -n "$key" ] && auth=(-H "Authorization: Bearer $key")

fail() {
    echo "FAIL: $1"
    exit 1
}
ok() { echo "ok   $1"; }

# 1. health
code=$(curl -sS -o "$tmp/health" -w '%{http_code}' -m "$timeout" "$base/health" 2>"$tmp/err") ||
    fail "GET /health: $(head -c 200 "$tmp/err")"
[ "$code" = 200 ] || fail "GET /health: status $code: $(head -c 200 "$tmp/health")"
ok "GET /health 200"

# 2. models
code=$(curl -sS -o "$tmp/models" -w '%{http_code}' -m "$timeout" "${auth[@]}" "$base/v1/models" 2>"$tmp/err") ||
    fail "GET /v1/models: $(head -c 200 "$tmp/err")"
[ "$code" = 200 ] || fail "GET /v1/models: status $code: $(head -c 200 "$tmp/models")"
model=$(grep -o '"id" *: *"[^"]*"' "$tmp/models" | head -n 1 | sed 's/.*: *"\(.*\)"/\1/')
[ -n "$model" ] || fail "GET /v1/models: no model id in $(head -c 200 "$tmp/models")"
ok "GET /v1/models: $model"

# 3. a chat completion
body=$(printf '{"model":"%s","messages":[{"role":"user","content":"Say hello."}],"max_tokens":%d,"temperature":0}' \
    "$model" "$max_tokens")
code=$(curl -sS -o "$tmp/chat" -w '%{http_code}' -m "$timeout" "${auth[@]}" \
    -H 'Content-Type: application/json' -d "$body" "$base/v1/chat/completions" 2>"$tmp/err") ||
    fail "POST /v1/chat/completions: $(head -c 200 "$tmp/err")"
[ "$code" = 200 ] || fail "POST /v1/chat/completions: status $code: $(head -c 300 "$tmp/chat")"
grep -q '"message"' "$tmp/chat" && grep -q '"finish_reason" *: *"' "$tmp/chat" ||
    fail "POST /v1/chat/completions: no message in $(head -c 300 "$tmp/chat")"
ok "POST /v1/chat/completions 200"

# 4. a stream, each line stamped on arrival ($EPOCHREALTIME: no fork per line)
body=$(printf '{"model":"%s","messages":[{"role":"user","content":"Count from one to twenty in words."}],"max_tokens":%d,"temperature":0,"stream":true,"ignore_eos":true}' \
    "$model" "$max_tokens")
curl -sS -N -m "$timeout" "${auth[@]}" -H 'Content-Type: application/json' -d "$body" \
    -w '\n%{http_code}\n' "$base/v1/chat/completions" 2>"$tmp/err" |
    while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done >"$tmp/stream"
code=$(tail -n 1 "$tmp/stream" | cut -d' ' -f2)
[ "$code" = 200 ] || fail "stream: status ${code:-none}: $(head -c 300 "$tmp/err") $(cut -d' ' -f2- "$tmp/stream" | head -c 300)"
grep -q ' data: {"error"' "$tmp/stream" && fail "stream: error event: $(grep -m 1 ' data: {"error"' "$tmp/stream" | cut -d' ' -f2- | head -c 300)"
n_data=$(grep -c ' data: {' "$tmp/stream")
[ "$n_data" -ge 2 ] || fail "stream: $n_data data events"
last=$(grep ' data: ' "$tmp/stream" | tail -n 1 | cut -d' ' -f2-)
[ "$last" = "data: [DONE]" ] || fail "stream: does not end with 'data: [DONE]' (last event: ${last:0:120})"
# incremental: the data events must not all arrive at once
first_t=$(grep -m 1 ' data: {' "$tmp/stream" | cut -d' ' -f1)
done_t=$(grep ' data: \[DONE\]' "$tmp/stream" | cut -d' ' -f1)
spread_ms=$(awk -v a="$first_t" -v b="$done_t" 'BEGIN { printf "%d", (b - a) * 1000 }')
[ "$spread_ms" -ge 20 ] ||
    fail "stream: all $n_data events arrived within ${spread_ms} ms (buffered by a proxy? disable buffering for text/event-stream)"
ok "stream: $n_data events over ${spread_ms} ms, ends with data: [DONE]"
echo "PASS"

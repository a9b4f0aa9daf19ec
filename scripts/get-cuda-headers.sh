#!/usr/bin/env bash
# Places the CUDA runtime headers the emulator build needs (cuda_runtime_api.h,
# cuda_fp16.h, cuda_bf16.h, cuda_fp8.h, vector_types.h, ...) in DEST/include, for machines
# without the CUDA toolkit. They come from NVIDIA's PyPI wheel nvidia-cuda-runtime-cu12
# (headers only are used; the x86_64 wheel is taken on every machine, since headers do not
# depend on the architecture), sha256-checked. With a toolkit installed the Makefile uses
# its headers instead and never calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-build/cuda-headers}
ver=12.9.79
whl=nvidia_cuda_runtime_cu12-$ver-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
sha=25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3
[ -f "$dest/include/cuda_fp16.h" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
"$PY" -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
    --platform manylinux2014_x86_64 --python-version 3.11 "nvidia-cuda-runtime-cu12==$ver" -d "$tmp"
echo "$sha  $tmp/$whl" | sha256sum -c --status || { echo "get-cuda-headers: sha256 mismatch" >&2; exit 1; }
"$PY" - "$tmp/$whl" "$tmp/out" <<'PYEOF'
import sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
prefix = "nvidia/cuda_runtime/include/"
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.startswith(prefix) and not n.endswith("/"):
            z.extract(n, out)
PYEOF
mkdir -p "$dest"
rm -rf "$dest/include"
mv "$tmp/out/nvidia/cuda_runtime/include" "$dest/include"
echo "get-cuda-headers: $dest/include (nvidia-cuda-runtime-cu12 $ver)"

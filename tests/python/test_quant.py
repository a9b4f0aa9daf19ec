"""quant_dequant_row (via build/tests/tool_dequant) against gguf-py's independent numpy
dequantizer, on random blocks of every supported type and on the real Q4_1 / Q8_0
tensors of the default model.

Comparison is bitwise (float32 bit patterns equal, -0.0 vs 0.0 included): both sides
compute each value as the same sequence of IEEE float32 operations (fp16 -> f32 exactly,
then d*q, or (d*sc)*q, then a separate + m / - dmin*m; no FMA — the C build is ISO C so
GCC does not contract), so any difference is a layout or arithmetic bug, not rounding.
"""
import os
import pathlib
import subprocess
import zlib

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize

ROOT = pathlib.Path(os.environ.get("TESSERA_ROOT", pathlib.Path(__file__).resolve().parents[2]))
BUILD = pathlib.Path(os.environ.get("TESSERA_BUILD", ROOT / "build"))
TOOL = BUILD / "tests" / "tool_dequant"
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

# name -> (gguf type, block elems, block bytes, byte offsets of fp16 scale fields)
TYPES = {
    "F32": (QT.F32, 1, 4, ()),
    "F16": (QT.F16, 1, 2, ()),
    "BF16": (QT.BF16, 1, 2, ()),
    "Q8_0": (QT.Q8_0, 32, 34, (0,)),
    "Q4_0": (QT.Q4_0, 32, 18, (0,)),
    "Q4_1": (QT.Q4_1, 32, 20, (0, 2)),
    "Q5_0": (QT.Q5_0, 32, 22, (0,)),
    "Q5_1": (QT.Q5_1, 32, 24, (0, 2)),
    "Q4_K": (QT.Q4_K, 256, 144, (0, 2)),
    "Q6_K": (QT.Q6_K, 256, 210, (208,)),
}


def run_tool(tmp_path, name, n, raw):
    assert TOOL.exists(), f"{TOOL} not built"
    src, dst = tmp_path / f"{name}.bin", tmp_path / f"{name}.f32"
    src.write_bytes(raw.tobytes())
    subprocess.run([str(TOOL), name, str(n), str(src), str(dst)], check=True)
    return np.fromfile(dst, dtype=np.float32)


def random_blocks(name, nblocks, rng):
    """Random bytes; scale fields replaced by finite fp16 values (random sign, wide
    exponent range incl. subnormals), float types by random finite values."""
    qt, be, bb, scales = TYPES[name]
    if name == "F32":
        return (rng.standard_normal(nblocks) * 10.0 ** rng.integers(-5, 5, nblocks)).astype(np.float32).view(np.uint8)
    if name == "F16":
        v = rng.integers(0, 0x10000, nblocks, dtype=np.uint16)
        v[(v & 0x7C00) == 0x7C00] &= 0xBFFF  # no inf/nan
        return v.view(np.uint8)
    if name == "BF16":
        v = rng.integers(0, 0x10000, nblocks, dtype=np.uint16)
        v[(v & 0x7F80) == 0x7F80] &= 0xBFFF
        return v.view(np.uint8)
    raw = rng.integers(0, 256, (nblocks, bb), dtype=np.uint8)
    for off in scales:
        h = rng.integers(0, 0x10000, nblocks, dtype=np.uint16)
        h[(h & 0x7C00) == 0x7C00] &= 0xBFFF
        raw[:, off:off + 2] = h.view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(-1)


def assert_bitwise(got, want, what):
    want = np.asarray(want, dtype=np.float32).reshape(-1)
    assert got.shape == want.shape, what
    diff = np.nonzero(got.view(np.uint32) != want.view(np.uint32))[0]
    if diff.size:
        i = diff[:5]
        pytest.fail(f"{what}: {diff.size} of {got.size} differ; first at {i}: got {got[i]} want {want[i]}")


@pytest.mark.parametrize("name", list(TYPES))
def test_random_blocks_match_gguf(tmp_path, name):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    qt, be, bb, _ = TYPES[name]
    nblocks = 4096 // be * 3 if be > 1 else 4099
    raw = random_blocks(name, nblocks, rng)
    n = nblocks * be
    got = run_tool(tmp_path, name, n, raw)
    want = dequantize(raw, qt)
    assert_bitwise(got, want, name)


def test_tool_rejects_bad_input(tmp_path):
    assert TOOL.exists(), f"{TOOL} not built"
    (tmp_path / "x.bin").write_bytes(b"\0" * 64)
    r = subprocess.run([str(TOOL), "Q4_1", "33", str(tmp_path / "x.bin"), str(tmp_path / "o")])
    assert r.returncode == 2
    r = subprocess.run([str(TOOL), "Q9_9", "32", str(tmp_path / "x.bin"), str(tmp_path / "o")])
    assert r.returncode == 2
    r = subprocess.run([str(TOOL), "Q8_0", "64", str(tmp_path / "x.bin"), str(tmp_path / "o")])
    assert r.returncode == 1  # 68 bytes needed, 64 present


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_model_tensors_match_gguf(tmp_path, qtype):
    assert MODEL.exists(), f"{MODEL} missing: run make model"
    reader = gguf.GGUFReader(str(MODEL))
    tensors = [t for t in reader.tensors if t.tensor_type.name == qtype]
    assert tensors, f"no {qtype} tensors in the model"
    # every distinct shape once (the Q8_0 one is the 576 x 49152 embedding/output head)
    seen = set()
    for t in tensors:
        shape = tuple(int(x) for x in t.shape)
        if shape in seen:
            continue
        seen.add(shape)
        raw = np.asarray(t.data, dtype=np.uint8).reshape(-1)
        n = int(t.n_elements)
        got = run_tool(tmp_path, qtype, n, raw)
        want = dequantize(raw, t.tensor_type)
        assert_bitwise(got, want, f"{t.name} {shape}")

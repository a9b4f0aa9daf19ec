"""--quantization q8_0 and --dtype (src/model/weights_convert.h): a model's F32 / F16 / BF16
matrices quantized to GGUF's Q8_0, or converted to F16 / BF16, at load, then served by
the kernels of that type.

  * the quantizer (build/tests/tool_quantize, quant_row_q8_0) against gguf-py's independent
    numpy Q8_0 quantizer, byte for byte: random rows over many scales, exact .5 ties, zero
    blocks, subnormals, scales that round to fp16 subnormals; non-finite values refused;
  * the whole model: qwen2-tiny/ (F32 safetensors) loaded with -q q8_0 gives bitwise the
    logits of qwen2-tiny-q8_0.gguf, the same tensors quantized by gguf-py
    (scripts/make-test-models.py) — every matrix, the embedding and the LM head were
    converted, none was missed or laid out differently;
  * SmolLM2's BF16 checkpoint stays close to its unquantized self (top-1 and logit bounds);
  * a quantized GGUF is left as it is; an F16 GGUF is quantized;
  * --dtype float16 on qwen2-tiny/ (F32) gives bitwise the logits of qwen2-tiny.gguf (F16
    matrices of the same values); --dtype bfloat16 on a BF16 checkpoint changes nothing;
  * bad input: a NaN in a weight names the tensor and row, so does a value beyond float16's
    range with --dtype float16; an unknown scheme or dtype is a usage error before anything
    loads;
  * `tessera serve -q q8_0` answers with the text `tessera generate -q q8_0` gives.
"""
import json
import re
import shutil
import struct
import subprocess

import gguf
import numpy as np
import pytest

from conftest import BIN, BUILD, DEFAULT_MODEL, TEST_MODELS
from server_util import run_server
from test_forward import ids_of

TOOL = BUILD / "tests" / "tool_quantize"
Q8 = gguf.GGMLQuantizationType.Q8_0


def tessera_quantize(tmp_path, x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    src, dst = tmp_path / "in.f32", tmp_path / "out.bin"
    src.write_bytes(x.tobytes())
    p = subprocess.run([str(TOOL), str(x.size), str(src), str(dst)], capture_output=True, text=True)
    return p.returncode, (dst.read_bytes() if p.returncode == 0 else p.stderr)


def test_quantizer_matches_gguf_py(tmp_path):
    assert TOOL.exists(), f"{TOOL} not built"
    rng = np.random.default_rng(7)
    rows = [rng.standard_normal(32 * 64) * 10.0 ** e for e in range(-8, 6)]
    # exact ties: block max 127 (d = 1, id = 1) and halves everywhere -> round half away
    ties = np.arange(-63.5, 64.5, 1.0)[:128].astype(np.float32)
    ties[0] = 127.0
    rows.append(ties)
    rows.append(-ties)
    rows.append(np.zeros(64))                                      # d = 0: all codes 0
    rows.append(np.r_[np.zeros(32), rng.standard_normal(32)])      # one zero block
    rows.append(np.full(32, 1e-45))                                # subnormal inputs
    rows.append(rng.standard_normal(64) * 1e-6)                    # d an fp16 subnormal
    rows.append(rng.standard_normal(64) * 3e6)                     # d overflows fp16 (inf)
    rows.append(np.r_[rng.standard_normal(32) * 1e-3, rng.standard_normal(32) * 1e3])
    for i, r in enumerate(rows):
        r = np.asarray(r, np.float32)
        rc, got = tessera_quantize(tmp_path, r)
        assert rc == 0, got
        want = gguf.quants.quantize(r.reshape(1, -1), Q8).tobytes()
        assert got == want, f"row {i}: first differing byte {next(k for k in range(len(want)) if got[k] != want[k])}"


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_quantizer_refuses_non_finite(tmp_path, bad):
    x = np.ones(64, np.float32)
    x[40] = bad
    rc, msg = tessera_quantize(tmp_path, x)
    assert rc == 3 and "not finite" in msg, (rc, msg)


def logits(model, prompt, *extra, tmp_path):
    ids = ids_of(prompt)
    out = tmp_path / "logits.f32"
    p = subprocess.run([str(BIN), "logits", "--model", str(model), "--tokens", ",".join(map(str, ids)),
                        "--out", str(out), "--threads", "1", *extra], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return np.fromfile(out, "<f4").reshape(len(ids), -1), p.stderr


@pytest.mark.parametrize("prompt", ["english", "code"])
def test_hf_checkpoint_equals_gguf_quantized_by_gguf_py(tmp_path, prompt):
    ours, log = logits(TEST_MODELS / "qwen2-tiny", prompt, "--quantization", "q8_0", tmp_path=tmp_path)
    assert "(Q8_0, 16 matrices quantized at load" in log, log  # 2 x 7 + embedding + head
    ref, _ = logits(TEST_MODELS / "qwen2-tiny-q8_0.gguf", prompt, tmp_path=tmp_path)
    assert np.array_equal(ours, ref), f"max |d| {np.abs(ours - ref).max()}"
    plain, _ = logits(TEST_MODELS / "qwen2-tiny", prompt, tmp_path=tmp_path)
    assert not np.array_equal(ours, plain)  # the option did something


# SmolLM2-135M's BF16 checkpoint with Q8_0 weights vs without. The Q8_0 path also rounds
# activations to 8 bits (the CPU's integer kernels), and this model is sensitive to any
# rounding (docs/correctness.md), so the yardstick is that rounding's own effect on the same
# model: the Q4_1 file vs its exact F16 dequantization (smollm2-f16.gguf), where only the
# activations are rounded. Measured, 4 prompts of 18-39 tokens (q8_0 vs BF16 | Q4_1 vs F16):
# max |dlogit| 1.62 | 1.61, 1.61 | 2.14, 2.71 | 1.63, 1.91 | 1.77; mean 0.29 | 0.24,
# 0.25 | 0.26, 0.28 | 0.18, 0.31 | 0.17 (logit ranges 59-74): within 1.8x. Bound: 2.5x.
# A wrong scale or rounding rule is far outside (qwen2-tiny above is the exact check).
# make test runs the two prompts with the largest ratios (test time).
@pytest.mark.parametrize("prompt", ["chinese", "chat"])
def test_bf16_checkpoint_stays_close(tmp_path, prompt):
    q, _ = logits(TEST_MODELS / "smollm2-hf", prompt, "-q", "q8_0", tmp_path=tmp_path)
    f, _ = logits(TEST_MODELS / "smollm2-hf", prompt, tmp_path=tmp_path)
    a, _ = logits(DEFAULT_MODEL, prompt, tmp_path=tmp_path)
    b, _ = logits(TEST_MODELS / "smollm2-f16.gguf", prompt, tmp_path=tmp_path)
    d, base = np.abs(q - f), np.abs(a - b)
    print(f"{prompt}: q8_0 vs BF16 max {d.max():.3f} mean {d.mean():.4f}; "
          f"activation rounding alone max {base.max():.3f} mean {base.mean():.4f}")
    assert d.max() <= 2.5 * base.max() and d.mean() <= 2.5 * base.mean(), (d.max(), d.mean(), base.max(), base.mean())


def test_quantized_gguf_is_kept_and_f16_gguf_converted(tmp_path):
    a, log = logits(DEFAULT_MODEL, "english", "-q", "q8_0", tmp_path=tmp_path)
    assert "quantized at load" not in log, log  # a Q4_1 file: nothing to convert
    b, _ = logits(DEFAULT_MODEL, "english", tmp_path=tmp_path)
    assert np.array_equal(a, b)
    _, log = logits(TEST_MODELS / "smollm2-f16.gguf", "english", "-q", "q8_0", tmp_path=tmp_path)
    assert "(Q8_0, 211 matrices quantized at load" in log, log


def poisoned_copy(tmp_path, value):
    """qwen2-tiny/ with `value` at row 5, column 3 of layer 1's down projection."""
    dst = tmp_path / "qwen2-poisoned"
    shutil.copytree(TEST_MODELS / "qwen2-tiny", dst)
    st = dst / "model.safetensors"
    raw = bytearray(st.read_bytes())
    (hlen,) = struct.unpack("<Q", raw[:8])
    t = json.loads(raw[8:8 + hlen])[POISONED]
    assert t["dtype"] == "F32"
    off = 8 + hlen + t["data_offsets"][0] + 4 * (5 * t["shape"][1] + 3)
    raw[off:off + 4] = struct.pack("<f", value)
    st.write_bytes(bytes(raw))
    return dst


POISONED = "model.layers.1.mlp.down_proj.weight"


@pytest.mark.parametrize("value,flags,why", [
    (float("nan"), ("-q", "q8_0"), "not finite"),
    (float("inf"), ("--dtype", "bfloat16"), "not finite"),
    (1e6, ("--dtype", "float16"), "beyond float16's range"),
])
def test_unconvertible_weight_is_refused(tmp_path, value, flags, why):
    """The load fails naming the option, tensor and row."""
    model = poisoned_copy(tmp_path, value)
    p = subprocess.run([str(BIN), "logits", "--model", str(model), "--tokens", "1,2,3", "--out",
                        str(tmp_path / "x.f32"), *flags], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert f"{' '.join(flags).replace('-q', '--quantization')}: tensor '{POISONED}' row 5" in p.stderr, p.stderr
    assert why in p.stderr, p.stderr


@pytest.mark.parametrize("prompt,spelling", [("english", "float16"), ("code", "half")])
def test_dtype_float16_equals_f16_gguf(tmp_path, prompt, spelling):
    ours, log = logits(TEST_MODELS / "qwen2-tiny", prompt, "--dtype", spelling, tmp_path=tmp_path)
    assert "(F16, 16 matrices converted at load" in log, log
    ref, _ = logits(TEST_MODELS / "qwen2-tiny.gguf", prompt, tmp_path=tmp_path)
    assert np.array_equal(ours, ref), f"max |d| {np.abs(ours - ref).max()}"


def test_dtype_of_the_checkpoint_changes_nothing(tmp_path):
    a, log = logits(TEST_MODELS / "llama3-tiny", "english", "--dtype", "bfloat16", tmp_path=tmp_path)
    assert "converted at load" not in log, log
    b, _ = logits(TEST_MODELS / "llama3-tiny", "english", tmp_path=tmp_path)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("flag,value,choice", [("--quantization", "fp8", "q8_0"), ("--dtype", "float32", "bfloat16")])
def test_unknown_scheme_is_a_usage_error(tmp_path, flag, value, choice):
    for cmd in (["serve", "--model", str(tmp_path / "missing.gguf")], ["generate", "--model", "x", "--prompt", "x"],
                ["bench", "--model", "x"], ["logits", "--model", "x", "--tokens", "1", "--out", "x"]):
        p = subprocess.run([str(BIN), *cmd, flag, value], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, (cmd, p.returncode, p.stderr)
        assert flag in p.stderr and choice in p.stderr and "missing" not in p.stderr, (cmd, p.stderr)


def test_serve_quantized(tessera_bin):
    """The server loads the BF16 checkpoint quantized (the log says so) and answers greedily
    with what the CLI generates from the same quantized weights."""
    model = TEST_MODELS / "smollm2-hf"
    prompt = "The three primary colors are"
    p = subprocess.run([str(BIN), "generate", "--model", str(model), "-q", "q8_0", "--prompt", prompt,
                        "--max-tokens", "16", "--temperature", "0", "--ignore-eos", "--quiet", "--threads", "2"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    with run_server(tessera_bin, model, "--quantization", "q8_0", "--max-model-len", 256,
                    "--kv-cache-memory", 64) as srv:
        assert "(Q8_0, 211 matrices quantized at load" in srv.stderr(), srv.stderr_tail()
        r = srv.post_json("/v1/completions", {"model": srv.get_json("/v1/models")["data"][0]["id"],
                                              "prompt": prompt, "max_tokens": 16, "temperature": 0,
                                              "ignore_eos": True})
        assert r.status == 200, r.text()
        text = r.json()["choices"][0]["text"]
        assert text == p.stdout.removesuffix("\n"), (text, p.stdout)  # generate ends its output with a newline
        # the CPU backend reads its packed copy: the converted bytes of every matrix but the
        # (tied) embedding went back to the kernel (whole pages of each), and the answer above
        # read none of them (they fault; under ASan, which allocates them on the heap, they
        # are poisoned and nothing is handed back)
        log = srv.stderr()
        weights = float(re.search(r"weights ([0-9.]+) MiB \(Q8_0", log).group(1))
        embd = 49152 * 576 // 32 * 34 / 2**20
        released = re.search(r"released ([0-9.]+) MiB of the weights converted at load", log)
        if b"__asan_init" in BIN.read_bytes():
            assert released is None, log[-2000:]
        else:
            assert released and 0.98 * (weights - embd) <= float(released.group(1)) <= weights - embd, log[-2000:]

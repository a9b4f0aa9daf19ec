"""`tessera bench`: the prefill lines against the compute peak (issue 12).

Runs on the tiny random test models (a Q4_0 llama: int8 kernels; an F16 qwen2: f32 FMA
kernels) with short prompts, so each run takes about a second. Checks that the decode
lines are still there, that every prefill row parses and agrees with itself (GFLOP/s =
FLOPs x tok/s / T, share = GFLOP/s / peak), that the peak is positive and names the
instruction of the weight type, that the FLOP count equals the formula of docs/cli.md
computed here from the GGUF's own metadata and tensor shapes, that prompt lengths are
clamped to --max-model-len, and that bad flags are usage errors (exit 2).
"""
import functools
import re
import subprocess

import gguf
import pytest

from conftest import TEST_MODELS
from test_forward import test_models  # noqa: F401  (fixture)

Q4 = TEST_MODELS / "tiny-q4_0.gguf"
F16 = TEST_MODELS / "qwen2-tiny.gguf"

ROW = re.compile(r"^\| (\d+) \| ([\d.]+) tok/s \| (\d+) \| ([\d.]+) \| ([\d.]+)% of peak "
                 r"\(([\d.]+) GFLOP/s, ([^,]+), (\d+) threads?\) \|$")
PEAK = re.compile(r"^prefill vs compute peak: (\S+) weights, matmul kernels (\S+) -> peak = register-only "
                  r"(.+) loop, (\d+) threads?, ([\d.]+) GFLOP/s")


def bench(bin_, model, *args, check=True):
    cmd = [str(bin_), "bench", "--model", str(model), *[str(a) for a in args]]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode >= 0, f"killed by signal {-r.returncode}: {r.stderr}"
    if check:
        assert r.returncode == 0, f"{cmd} exited {r.returncode}: {r.stderr}"
    return r


def parse(out):
    """(peak header groups, [row groups]) of the prefill table."""
    lines = out.splitlines()
    heads = [PEAK.match(ln) for ln in lines if ln.startswith("prefill vs compute peak")]
    assert len(heads) == 1 and heads[0], out
    rows = [ROW.match(ln) for ln in lines if re.match(r"\| \d", ln) and "of peak" in ln]
    assert rows and all(rows), out
    return heads[0], rows


def scalar(r, key):
    f = r.fields[key]
    return int(f.parts[f.data[0]][0])


@functools.lru_cache(maxsize=None)
def model_dims(path):
    """(layer matrix parameters, output head parameters, n_layers, n_heads, head_dim) read
    from the file itself (parsing a GGUF's vocabulary takes seconds: once per file)."""
    r = gguf.GGUFReader(str(path))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    n_layers = scalar(r, f"{arch}.block_count")
    n_heads = scalar(r, f"{arch}.attention.head_count")
    if f"{arch}.attention.key_length" in r.fields:
        head_dim = scalar(r, f"{arch}.attention.key_length")
    else:
        head_dim = scalar(r, f"{arch}.embedding_length") // n_heads
    shapes = {t_.name: [int(x) for x in t_.shape] for t_ in r.tensors}
    mats = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    params = 0
    for layer in range(n_layers):
        for m in mats:
            a, b = shapes[f"blk.{layer}.{m}.weight"][:2]
            params += a * b
    out = shapes.get("output.weight", shapes["token_embd.weight"])
    return params, out[0] * out[1], n_layers, n_heads, head_dim


def formula_flops(path, t):
    """FLOPs of a prefill of t tokens: 2 x (layer matrix parameters) x t + 2 x (output
    head parameters: the last row's logits) + causal attention
    4 x n_layers x n_heads x head_dim x t(t+1)/2."""
    params, out, n_layers, n_heads, head_dim = model_dims(path)
    return 2 * params * t + 2 * out + 4 * n_layers * n_heads * head_dim * (t * (t + 1) // 2)


def check_rows(rows, model, lengths, threads, kind):
    assert [int(m.group(1)) for m in rows] == lengths
    for m in rows:
        t, tps, flops, gfs, pct, peak, instr, thr = m.groups()
        t, tps, flops, gfs, pct, peak = int(t), float(tps), int(flops), float(gfs), float(pct), float(peak)
        assert flops == formula_flops(model, t), (t, flops)
        assert tps > 0 and gfs > 0 and peak > 0
        assert gfs == pytest.approx(flops * tps / t / 1e9, rel=0.01, abs=0.1)
        assert pct == pytest.approx(100 * gfs / peak, rel=0.01, abs=0.1)
        assert kind in instr and int(thr) == threads


def test_int8_model_prefill_rows(tessera_bin, test_models):
    r = bench(tessera_bin, Q4, "--threads", 1, "--prompt-tokens", "16,64", "--gen-tokens", 4, "--reps", 1)
    for line in ("| prefill | ", "| decode | ", "| decode roofline | ", "| decode / roofline | "):
        assert line in r.stdout, r.stdout
    head, rows = parse(r.stdout)
    assert head.group(1) == "Q4_0" and "(int8)" in head.group(3) and head.group(4) == "1"
    assert float(head.group(5)) > 0
    check_rows(rows, Q4, [16, 64], 1, "(int8)")


def test_float_model_uses_the_fma_peak(tessera_bin, test_models):
    r = bench(tessera_bin, F16, "--threads", 2, "--prompt-tokens", "32", "--gen-tokens", 4, "--reps", 1)
    head, rows = parse(r.stdout)
    assert head.group(1) == "F16" and "(f32)" in head.group(3) and head.group(4) == "2"
    check_rows(rows, F16, [32], 2, "(f32)")


def test_default_lengths_and_clamp_to_max_model_len(tessera_bin, test_models):
    r = bench(tessera_bin, Q4, "--threads", 1, "--gen-tokens", 2, "--reps", 1)
    _, rows = parse(r.stdout)
    check_rows(rows, Q4, [128, 512, 2048], 1, "(int8)")
    # 64 and 100 both become 40 (listed once); the decode run keeps the first length
    r = bench(tessera_bin, Q4, "--threads", 1, "--prompt-tokens", "16,64,100", "--max-model-len", 40,
              "--gen-tokens", 4, "--reps", 1)
    _, rows = parse(r.stdout)
    check_rows(rows, Q4, [16, 40], 1, "(int8)")
    assert "prompt: 16  gen: 4" in r.stdout


@pytest.mark.parametrize("args", [
    ["--prompt-tokens", "0"], ["--prompt-tokens", "12,,3"], ["--prompt-tokens", "abc"],
    ["--prompt-tokens", "70000"], ["--prompt-tokens", "16,"], ["--prompt-tokens", ",".join(["8"] * 17)],
    ["--max-model-len", "1"], ["--prompt-tokens"], ["--no-such-flag"],
])
def test_bad_flags_are_usage_errors(tessera_bin, test_models, args):
    r = bench(tessera_bin, Q4, *args, check=False)
    assert r.returncode == 2, (args, r.returncode, r.stderr)
    assert r.stdout == "" and r.stderr.strip(), (args, r.stderr)

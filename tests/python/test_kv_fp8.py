"""FP8 (e4m3, scale 1) and BF16 KV cache quality, end to end on the F16 SmolLM2-135M: the logits of
`tessera logits --kv-dtype fp8` against `--kv-dtype f32`, and greedy generation with each.

Run as a script (python tests/python/test_kv_fp8.py) to print the measurement table that
docs/BENCHMARKS.md quotes. The tolerances below are that measurement with headroom (see
the constants); f16 KV is measured alongside as the yardstick.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from conftest import BIN, ROOT, TEST_MODELS

F16 = TEST_MODELS / "smollm2-f16.gguf"

# SmolLM2 token ids of four prompts (fact recall, code, a story, chat markup).
PROMPTS = {
    "capitals": [504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 4521, 314, 11452, 28, 284, 260,
                 3575, 282, 7158, 314],
    "code": [1604, 3987, 46477, 24, 94, 727, 76, 94, 333, 585, 304, 2067, 216, 34, 19199, 94, 415,
             1003, 304, 76, 94, 333, 1003],
    "story": [6403, 1980, 253, 655, 28, 281, 253, 1165, 6560, 32047, 826, 827, 8718, 28, 665, 4161,
              354, 1573, 9191, 16201, 617],
    "chat": [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
}
N_GEN = 32

# Tolerances. Measured fp8 vs f32 on this model (python tests/python/test_kv_fp8.py, over
# all 4 * (prompt + 32) = 208 positions): mean |dlogit| 0.31, max 3.4, mean KL 8.0e-3
# nats, max KL 0.18, top-1 agreement 0.966 (7 of 208 positions flip, all near-ties),
# greedy: 2 of 4 prompts identical for all 32 tokens, the others first differ at tokens
# 8 and 13 (then the contexts differ, so position-wise agreement is 0.66). f16 KV, for
# scale: mean KL 4e-7, top-1 1.000. The bounds leave ~2.5x headroom on the KL figures
# and about twice the measured number of top-1 flips; a broken dequantization (wrong
# scale, codes misread) gives KL of order 1 and fails loudly. Greedy tolerances are
# loose because one near-tie flip changes every later token.
MAX_MEAN_KL = 2e-2
MAX_KL = 0.5
MIN_TOP1 = 0.93
MIN_GREEDY = 0.50  # fraction of the 4 * 32 greedy tokens equal to f32's, position by position
MIN_PREFIX = 4     # every prompt's first greedy tokens agree exactly (measured: >= 8)


def run_logits(model, tokens, kv):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.bin")
        cmd = [str(BIN), "logits", "--model", str(model), "--tokens", ",".join(map(str, tokens)),
               "--out", out, "--kv-dtype", kv, "--threads", "2"]
        r = subprocess.run(cmd, capture_output=True, timeout=300)
        assert r.returncode == 0, f"{cmd}: {r.stderr.decode(errors='replace')}"
        return np.fromfile(out, dtype="<f4").reshape(len(tokens), -1).astype(np.float64)


def run_greedy(model, tokens, kv):
    cmd = [str(BIN), "generate", "--model", str(model), "--tokens", ",".join(map(str, tokens)),
           "--max-tokens", str(N_GEN), "--temperature", "0", "--print-ids", "--ignore-eos",
           "--kv-dtype", kv, "--threads", "2"]
    r = subprocess.run(cmd, capture_output=True, timeout=300)
    assert r.returncode == 0, f"{cmd}: {r.stderr.decode(errors='replace')}"
    return [int(x) for x in r.stdout.split()]


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def divergence(ref, got):
    """Per-position metrics of got against ref ([n][vocab] logits)."""
    d = np.abs(got - ref)
    lp, lq = log_softmax(ref), log_softmax(got)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)  # KL(ref || got), nats
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()), "mean_kl": float(kl.mean()),
            "max_kl": float(kl.max()), "top1": float((ref.argmax(-1) == got.argmax(-1)).mean())}


def measure(kv):
    """Logit divergence (over prompt + the f32 greedy continuation, so decode positions
    with longer contexts are covered) and greedy agreement of kv against f32."""
    refs, gots, agree, n, prefix = [], [], 0, 0, {}
    for name, toks in PROMPTS.items():
        g32 = run_greedy(F16, toks, "f32")
        seq = toks + g32
        refs.append(run_logits(F16, seq, "f32"))
        gots.append(run_logits(F16, seq, kv))
        gk = run_greedy(F16, toks, kv)
        agree += sum(a == b for a, b in zip(g32, gk))
        n += len(g32)
        prefix[name] = next((i for i, (a, b) in enumerate(zip(g32, gk)) if a != b), len(g32))
    m = divergence(np.concatenate(refs), np.concatenate(gots))
    m["greedy"] = agree / n
    m["prefix"] = prefix  # greedy tokens identical to f32's before the first difference
    return m


@pytest.fixture(scope="module")
def fp8_metrics():
    if not F16.exists():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make-test-models.py"),
                        "--out", str(TEST_MODELS)], check=True, timeout=300)
    assert BIN.exists(), f"{BIN} not built"
    return measure("fp8")


def test_fp8_logits_close_to_f32(fp8_metrics):
    m = fp8_metrics
    print(m)
    assert m["mean_kl"] < MAX_MEAN_KL, m
    assert m["max_kl"] < MAX_KL, m
    assert m["top1"] >= MIN_TOP1, m


def test_fp8_greedy_agrees_with_f32(fp8_metrics):
    assert fp8_metrics["greedy"] >= MIN_GREEDY, fp8_metrics
    assert min(fp8_metrics["prefix"].values()) >= MIN_PREFIX, fp8_metrics


# BF16 KV (8 significant bits, f32's range): measured against f32 on the same prompts:
# mean |dlogit| 0.018, max 0.18-0.24, mean KL 2.9e-5, max KL 4.5e-4, top-1 0.995-1.000.
# Greedy: with the packed-weight matmul kernels one prompt ("capitals") meets a near-tie
# at token 19 and differs from there (position-wise agreement 0.91; before, all 4 prompts
# were identical for 32 tokens). Bounds: ~3x headroom on KL, top-1 >= 0.99 over the f32
# continuation, and every prompt's first 16 greedy tokens identical (a bf16 cache misread
# as f16, or a wrong byte order, gives KL ~ 1).
BF16_MAX_MEAN_KL = 1e-4
BF16_MAX_KL = 2e-3


def test_bf16_close_to_f32():
    if not F16.exists():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make-test-models.py"),
                        "--out", str(TEST_MODELS)], check=True, timeout=300)
    m = measure("bf16")
    print(m)
    assert m["mean_kl"] < BF16_MAX_MEAN_KL, m
    assert m["max_kl"] < BF16_MAX_KL, m
    assert m["top1"] >= 0.99 and min(m["prefix"].values()) >= 16, m


def test_fp8_alias_and_garbage_rejected():
    toks = PROMPTS["capitals"][:4]
    a = run_logits(F16, toks, "fp8") if F16.exists() else None
    b = run_logits(F16, toks, "fp8_e4m3") if F16.exists() else None
    if a is not None:
        assert np.array_equal(a, b), "fp8_e4m3 is an alias of fp8"
    r = subprocess.run([str(BIN), "logits", "--model", str(F16), "--tokens", "1", "--out", "/dev/null",
                        "--kv-dtype", "fp4"], capture_output=True, timeout=60)
    assert r.returncode != 0


if __name__ == "__main__":
    print(f"{'kv':5} {'max|dlogit|':>11} {'mean|dlogit|':>12} {'mean KL':>9} {'max KL':>9} "
          f"{'top-1':>6} {'greedy':>6}")
    for kv in ("f16", "bf16", "fp8"):
        m = measure(kv)
        print(f"{kv:5} {m['max_abs']:11.4f} {m['mean_abs']:12.5f} {m['mean_kl']:9.2e} {m['max_kl']:9.2e} "
              f"{m['top1']:6.3f} {m['greedy']:6.3f}  identical prefix {m['prefix']}")

"""Forward-pass correctness: build/tessera's logits and greedy continuations against the
independent numpy reference (tests/python/reference.py), on the default Q4_1 GGUF and on
the models scripts/make-test-models.py derives from it (F16 and Q8_0 GGUFs, BF16 HF
directories — one sharded — and tiny random qwen2 / qwen3 / llama3-rope-scaled models).

What is compared, every tolerance and why, and the measured numbers: docs/correctness.md.
Each comparison appends a row (case, prompt, tokens, max |dlogit|, mean |dlogit|, top-1
agreement, tolerance) to build/forward-report.md when the module finishes.

Tests that need build/tessera go through the conftest fixture tessera_bin, so they fail
(not skip) when the binary is missing.
"""
import functools
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from conftest import BIN, BUILD, DEFAULT_MODEL, ROOT, TEST_MODELS

import reference as R

# ---- prompts ------------------------------------------------------------------------------

PROMPTS = {
    "english": "The quick brown fox jumps over the lazy dog. Then it ran into the forest, where",
    "code": ("def fibonacci(n):\n    if n < 2:\n        return n\n"
             "    return fibonacci(n - 1) + fibonacci(n - 2)\n\nprint("),
    "chinese": "北京是中国的首都，也是一座历史悠久的城市。",
    "chat": ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
             "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"),
    # A continuation the model is sure of at every step (reference top-2 margin >= 1.9 for
    # 64 greedy steps with the Q4_1 weights): used where greedy ids must be identical
    # across implementations whose logits differ by the activation-quantization noise.
    "count": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
    # > 100 tokens, so llama3-tiny runs past original_max_position_embeddings = 64.
    "long": ("Once upon a time, in a small village at the edge of a great forest, there lived an "
             "old clockmaker named Elias. Every morning he opened the shutters of his workshop, "
             "wound the tall clock by the door, and sat down at his bench. Children from the "
             "village often came to watch him work, because he would tell them stories about the "
             "stars, the rivers and the mountains far away. One winter, a stranger arrived with a "
             "broken pocket watch and a strange request: he asked Elias to make it run backwards."),
}
LOGIT_PROMPTS = ["english", "code", "chinese", "chat"]

# ---- tolerances (derivations in docs/correctness.md) ---------------------------------------

# Float weights (F16 / BF16 / F32): both sides compute in float32 and differ only in
# summation order. The float32 reference is within EPS_REF of a float64 one (measured:
# 5e-5 for SmolLM2-135M, 8e-6 for the 2-layer tiny models); a second float32 evaluation is
# expected within ~2 EPS_REF; the tolerance leaves a further 10x.
TOL_FLOAT_SMOLLM = 1e-3
TOL_FLOAT_TINY = 1e-4
# Quantized weights (Q4_1 / Q8_0): the C matmul rounds activations to 8 bits per block.
# Rounding is discontinuous: a 1-ulp difference in a value near a rounding boundary
# changes q by 1, and the change cascades into more flips downstream, so two correct
# float32 implementations differ by the same order as the quantization noise itself.
# The bound is calibrated per prompt by the reference's own ensemble (act_quant with
# 1-ulp jitter, seeds JITTER_SEEDS): tessera must be within QUANT_MAX_FACTOR x the largest
# pairwise ensemble max|d| and QUANT_MEAN_FACTOR x the largest pairwise mean|d|.
JITTER_SEEDS = (11, 12)
QUANT_MAX_FACTOR = 2.0
QUANT_MEAN_FACTOR = 1.5
# Greedy near-tie threshold for the quantized default model (a margin below this is
# within the logit noise of a correct act-quant implementation).
TOL_GREEDY_Q4_1 = 1.5
GREEDY_TOKENS = 64
# tessera runs with one thread: on a shared 2-core machine its pool is ~20x slower under
# contention, and results do not depend on the thread count (test_threads_identical).
THREADS = ("--threads", "1")

# ---- report -------------------------------------------------------------------------------

ROWS = []


def _row(case, prompt, n_tok, got, ref, tol, note=""):
    d = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    top1 = float(np.mean(got.argmax(-1) == ref.argmax(-1)))
    r = dict(case=case, prompt=prompt, n=n_tok, max=float(d.max()), mean=float(d.mean()),
             top1=top1, tol=tol, note=note)
    ROWS.append(r)
    return r


@pytest.fixture(scope="module", autouse=True)
def _write_report():
    yield
    if not ROWS:
        return
    lines = ["| case | prompt | tokens | max abs dlogit | mean abs dlogit | top-1 agree | tolerance | note |",
             "|---|---|---|---|---|---|---|---|"]
    for r in ROWS:
        tol = "" if r["tol"] is None else f"{r['tol']:.3g}"
        lines.append(f"| {r['case']} | {r['prompt']} | {r['n']} | {r['max']:.3g} | "
                     f"{r['mean']:.3g} | {r['top1'] * 100:.1f}% | {tol} | {r['note']} |")
    BUILD.mkdir(parents=True, exist_ok=True)
    (BUILD / "forward-report.md").write_text("\n".join(lines) + "\n")


def _fmt(r):
    return (f"{r['case']} [{r['prompt']}, {r['n']} tokens]: max|dlogit| {r['max']:.4g}, "
            f"mean {r['mean']:.4g}, top-1 agreement {r['top1'] * 100:.1f}%")


# ---- fixtures and helpers -----------------------------------------------------------------

@pytest.fixture(scope="session")
def test_models(default_model):
    """Runs scripts/make-test-models.py once (it skips what is up to date)."""
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "make-test-models.py"),
                        "--out", str(TEST_MODELS), "--model", str(default_model)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"make-test-models.py failed:\n{p.stdout}\n{p.stderr}"
    return TEST_MODELS


@functools.lru_cache(maxsize=None)
def tokenizer():
    from gguf_tokenizer import hf_tokenizer_from_gguf
    return hf_tokenizer_from_gguf(DEFAULT_MODEL)


@functools.lru_cache(maxsize=None)
def ids_of(prompt):
    ids = tokenizer().encode(PROMPTS[prompt]).ids
    assert len(ids) >= 5, (prompt, ids)
    return tuple(ids)


def model_path(name):
    return DEFAULT_MODEL if name == "default" else TEST_MODELS / name


_REFS = {}


def ref_model(name, **kw):
    key = (name, tuple(sorted(kw.items())))
    if key not in _REFS:
        _REFS[key] = R.load_model(model_path(name), **kw)
    return _REFS[key]


@pytest.fixture(scope="module", autouse=True)
def _free_refs():
    yield
    _REFS.clear()
    _ref_logits.cache_clear()
    _ref_greedy.cache_clear()
    _tessera_logits.cache_clear()
    _tessera_generate.cache_clear()


@functools.lru_cache(maxsize=None)
def _ref_logits(name, prompt, **kw):
    return ref_model(name).forward(list(ids_of(prompt)), **kw)


def ref_logits(name, prompt, **kw):
    return _ref_logits(name, prompt, **kw)


@functools.lru_cache(maxsize=None)
def _ref_greedy(name, prompt, n, **kw):
    return ref_model(name).greedy(list(ids_of(prompt)), n, **kw)


def run_tessera(args, timeout=600):
    p = subprocess.run([str(BIN), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, (f"tessera {' '.join(map(str, args))} exited {p.returncode}:\n"
                               f"{p.stderr[-3000:]}")
    return p


_OUT_DIR = BUILD / "forward-test-out"


@functools.lru_cache(maxsize=None)
def _tessera_logits(name, prompt, extra=()):
    ids = ids_of(prompt)
    _OUT_DIR.mkdir(parents=True, exist_ok=True)
    out = _OUT_DIR / f"{name.replace('/', '_')}-{prompt}{''.join(extra).replace('-', '_')}.bin"
    out.unlink(missing_ok=True)
    threads = () if "--threads" in extra else THREADS
    run_tessera(["logits", "--model", model_path(name), "--tokens", ",".join(map(str, ids)),
                 "--out", out, *threads, *extra])
    a = np.fromfile(out, dtype="<f4")
    out.unlink()
    assert a.size % len(ids) == 0 and a.size > 0, f"{a.size} floats for {len(ids)} tokens"
    return a.reshape(len(ids), -1)


def tessera_logits(tessera_bin, name, prompt, *extra):
    return _tessera_logits(name, prompt, tuple(extra))


@functools.lru_cache(maxsize=None)
def _tessera_generate(name, prompt, n, threads=THREADS):
    p = run_tessera(["generate", "--model", model_path(name), "--tokens",
                     ",".join(map(str, ids_of(prompt))), "--max-tokens", n,
                     "--temperature", 0, "--print-ids", "--ignore-eos", *threads])
    line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    return [int(t) for t in line.split()]


def tessera_generate(tessera_bin, name, prompt, n=GREEDY_TOKENS):
    return _tessera_generate(name, prompt, n)


def check_float_case(case, got, ref, tol, prompt):
    assert got.shape == ref.shape, f"{case}: logits shape {got.shape} != reference {ref.shape}"
    assert np.isfinite(got).all(), f"{case}: non-finite logits"
    r = _row(case, prompt, len(ref), got, ref, tol)
    assert r["max"] <= tol, f"{_fmt(r)} exceeds tolerance {tol}"
    # top-1 must agree wherever the reference is not within 2 tol of a tie
    s = np.sort(ref, axis=-1)
    decided = (s[:, -1] - s[:, -2]) > 2 * tol
    bad = np.nonzero(decided & (got.argmax(-1) != ref.argmax(-1)))[0]
    assert bad.size == 0, f"{_fmt(r)}: top-1 differs at decided positions {bad.tolist()}"
    return r


def quant_ensemble(name, prompt):
    """(aq reference, [jittered aq references]) and the ensemble's pairwise max/mean."""
    m = ref_model(name)
    ids = list(ids_of(prompt))
    base = ref_logits(name, prompt, act_quant=True)
    members = [base] + [m.forward(ids, act_quant=True, jitter_seed=s) for s in JITTER_SEEDS]
    dmax = dmean = 0.0
    for i in range(len(members)):
        for j in range(i + 1, len(members)):
            d = np.abs(members[i].astype(np.float64) - members[j])
            dmax, dmean = max(dmax, float(d.max())), max(dmean, float(d.mean()))
    return base, dmax, dmean


def check_quant_case(tessera_bin, case, name, prompt):
    got = tessera_logits(tessera_bin, name, prompt)
    base, dmax, dmean = quant_ensemble(name, prompt)
    assert got.shape == base.shape and np.isfinite(got).all()
    fl = ref_logits(name, prompt)
    _row(case + " vs float ref", prompt, len(base), got, fl, None, "report only")
    tol_max, tol_mean = QUANT_MAX_FACTOR * dmax, QUANT_MEAN_FACTOR * dmean
    r = _row(case + " vs act-quant ref", prompt, len(base), got, base, tol_max,
             f"ensemble max {dmax:.3g} mean {dmean:.3g}; mean tol {tol_mean:.3g}")
    assert r["max"] <= tol_max, (f"{_fmt(r)}: max exceeds {QUANT_MAX_FACTOR} x the act-quant "
                                 f"ensemble spread {dmax:.4g}")
    assert r["mean"] <= tol_mean, (f"{_fmt(r)}: mean exceeds {QUANT_MEAN_FACTOR} x the "
                                   f"ensemble's mean spread {dmean:.4g}")
    s = np.sort(base, axis=-1)
    decided = (s[:, -1] - s[:, -2]) > tol_max
    bad = np.nonzero(decided & (got.argmax(-1) != base.argmax(-1)))[0]
    assert bad.size == 0, f"{_fmt(r)}: top-1 differs at decided positions {bad.tolist()}"


def assert_same_greedy(case, prompt, got, want, margins, tol):
    tok = tokenizer()
    n_same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                  min(len(got), len(want)))
    ROWS.append(dict(case=case + " greedy", prompt=prompt, n=len(want), max=0.0, mean=0.0,
                     top1=n_same / max(1, len(want)), tol=tol,
                     note=f"{n_same}/{len(want)} ids identical; min ref margin {min(margins):.3g}"))
    if got == want:
        return
    if n_same >= min(len(got), len(want)):
        pytest.fail(f"{case} [{prompt}]: tessera produced {len(got)} ids, reference {len(want)}")
    m = margins[n_same]
    if m < tol:
        why = (f"this is a NEAR-TIE: the reference's top-2 margin at that step is {m:.4g}, "
               f"below the logit tolerance {tol:.3g}, so either token is consistent with "
               f"correct arithmetic (not loosening the tolerance; pick another prompt or "
               f"investigate)")
    else:
        why = (f"NOT a near-tie: the reference's top-2 margin there is {m:.4g} >= tolerance "
               f"{tol:.3g}, a real discrepancy")
    pytest.fail(f"{case} [{prompt}]: greedy ids diverge at step {n_same}: tessera "
                f"{got[n_same]} {tok.decode([got[n_same]])!r}, reference {want[n_same]} "
                f"{tok.decode([want[n_same]])!r}; {why}.\n"
                f"common prefix: {tok.decode(want[:n_same])!r}\n"
                f"tessera:   {got}\nreference: {want}")


# ---- the reference checks itself (no binary needed) ----------------------------------------

def test_reference_qk_permutation_roundtrip():
    rng = np.random.default_rng(0)
    for n_head, rows in ((9, 576), (3, 192), (4, 64)):
        w = rng.standard_normal((rows, 7)).astype(np.float32)
        assert np.array_equal(R.permute_qk(R.unpermute_qk(w, n_head), n_head), w)
        assert np.array_equal(R.unpermute_qk(R.permute_qk(w, n_head), n_head), w)
    # llama.cpp's permute moves HF row (h, half j, i) to (h, 2i + j): check one head
    w = np.arange(8, dtype=np.float32).reshape(8, 1)          # one head, head_dim 8
    assert R.permute_qk(w, 1)[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


def test_reference_gguf_equals_hf_dir(test_models):
    """The Q4_1 GGUF loaded through gguf + un-permutation, rounded to bf16, is bit-for-bit
    the reference loaded from the derived HF directory (and from its sharded twin): proves
    the un-permutation, the safetensors reader and the BF16 path of the reference."""
    ids = list(ids_of("chat"))
    g = R.load_gguf(DEFAULT_MODEL, round_to_bf16=True)
    g.cfg.eps = 1e-5  # the GGUF stores eps as float32(1e-5); config.json says 1e-5
    a = g.forward(ids)
    del g
    b = ref_logits("smollm2-hf", "chat")
    c = R.load_model(TEST_MODELS / "smollm2-hf-sharded").forward(ids)
    assert np.array_equal(a, b), np.abs(a - b).max()
    assert np.array_equal(b, c), np.abs(b - c).max()


def test_reference_qwen2_tiny_gguf_equals_hf(test_models):
    a = ref_logits("qwen2-tiny", "english")
    b = ref_logits("qwen2-tiny.gguf", "english")
    # same f16-representable values; the GGUF stores eps as float32(1e-6)
    assert np.abs(a - b).max() < 1e-5


def test_reference_incremental_decode_matches_one_shot(test_models):
    """KV-cache decode (prefill 7, then chunks, then single tokens) == one forward."""
    for name in ("qwen3-tiny", "default"):
        m = ref_model(name)
        ids = list(ids_of("code"))
        full = m.forward(ids)
        cache = m.new_cache()
        parts = [m.forward(ids[:7], cache), m.forward(ids[7:20], cache)]
        parts += [m.forward([t], cache) for t in ids[20:]]
        inc = np.concatenate(parts)
        # float32 BLAS sums in a shape-dependent order: agreement to float32 noise
        assert np.abs(inc - full).max() < 3e-4, name


def test_reference_float32_error_is_small(test_models):
    """The float32 reference vs a float64 one (the EPS_REF behind TOL_FLOAT_*)."""
    for name in ("qwen2-tiny", "qwen3-tiny", "llama3-tiny"):
        ids = list(ids_of("long"))
        a = ref_model(name).forward(ids)
        b = R.load_model(model_path(name), dtype=np.float64).forward(ids)
        eps = float(np.abs(a - b).max())
        ROWS.append(dict(case=f"reference f32 vs f64: {name}", prompt="long", n=len(ids),
                         max=eps, mean=float(np.abs(a - b).mean()), top1=1.0, tol=None,
                         note="reference self-check"))
        assert eps < TOL_FLOAT_TINY / 5, (name, eps)


def test_reference_llama3_rope_scaling_regimes():
    """transformers' _compute_llama3_parameters: wavelengths shorter than
    orig/high_freq_factor keep their frequency, longer than orig/low_freq_factor are
    divided by factor, in between they are interpolated (smooth, monotone)."""
    rs = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    base = R.rope_inv_freq(16, 500000.0)
    scaled = R.rope_inv_freq(16, 500000.0, rs)
    wl = 2 * np.pi / base
    hi, lo = wl < 64 / 4, wl > 64 / 1
    mid = ~hi & ~lo
    assert hi.any() and lo.any() and mid.any()  # llama3-tiny exercises all three regimes
    assert np.array_equal(scaled[hi], base[hi])
    assert np.allclose(scaled[lo], base[lo] / 8, rtol=1e-15)
    assert np.all((scaled[mid] < base[mid]) & (scaled[mid] > base[mid] / 8))
    # the smooth factor at wavelength w is (64/w - 1)/(4 - 1)
    s = (64 / wl[mid] - 1) / 3
    assert np.allclose(scaled[mid], (1 - s) * base[mid] / 8 + s * base[mid], rtol=1e-15)


def test_reference_greedy_is_sensible():
    ids = tokenizer().encode("The capital of France is").ids
    out, _ = ref_model("default").greedy(ids, 4)
    assert "Paris" in tokenizer().decode(out)


# ---- tessera logits vs the reference ------------------------------------------------------

@pytest.mark.parametrize("prompt", LOGIT_PROMPTS)
def test_logits_default_q4_1(tessera_bin, prompt):
    check_quant_case(tessera_bin, "Q4_1 gguf", "default", prompt)


def test_logits_q8_0_gguf(tessera_bin, test_models):
    check_quant_case(tessera_bin, "Q8_0 gguf", "smollm2-q8_0.gguf", "english")


@pytest.mark.parametrize("prompt", LOGIT_PROMPTS)
def test_logits_f16_gguf(tessera_bin, test_models, prompt):
    got = tessera_logits(tessera_bin, "smollm2-f16.gguf", prompt)
    check_float_case("F16 gguf", got, ref_logits("smollm2-f16.gguf", prompt),
                     TOL_FLOAT_SMOLLM, prompt)


@pytest.mark.parametrize("prompt", ["english", "chat"])
def test_logits_hf_dir(tessera_bin, test_models, prompt):
    got = tessera_logits(tessera_bin, "smollm2-hf", prompt)
    check_float_case("BF16 HF dir", got, ref_logits("smollm2-hf", prompt), TOL_FLOAT_SMOLLM,
                     prompt)


def test_logits_hf_sharded_identical(tessera_bin, test_models):
    a = tessera_logits(tessera_bin, "smollm2-hf", "chat")
    b = tessera_logits(tessera_bin, "smollm2-hf-sharded", "chat")
    _row("BF16 HF sharded vs unsharded (tessera)", "chat", len(a), b, a, 0.0)
    assert np.array_equal(a, b), np.abs(a - b).max()


@pytest.mark.parametrize("name", ["qwen2-tiny", "qwen2-tiny.gguf", "qwen3-tiny", "llama3-tiny"])
def test_logits_tiny(tessera_bin, test_models, name):
    got = tessera_logits(tessera_bin, name, "long")
    check_float_case(name, got, ref_logits(name, "long"), TOL_FLOAT_TINY, "long")


def test_logits_llama3_scaling_matters(tessera_bin, test_models):
    """The llama3-tiny comparison would catch a missing rope_scaling: the reference without
    it is far outside the tolerance from tessera."""
    m = ref_model("llama3-tiny")
    saved = m.inv_freq
    try:
        m.inv_freq = R.rope_inv_freq(m.cfg.head_dim, m.cfg.rope_theta)
        unscaled = m.forward(list(ids_of("long")))
    finally:
        m.inv_freq = saved
    got = tessera_logits(tessera_bin, "llama3-tiny", "long")
    r = _row("llama3-tiny vs ref WITHOUT scaling", "long", len(got), got, unscaled, None,
             "negative control")
    assert r["max"] > 100 * TOL_FLOAT_TINY


def test_logits_qwen2_tiny_gguf_equals_hf(tessera_bin, test_models):
    a = tessera_logits(tessera_bin, "qwen2-tiny", "long")
    b = tessera_logits(tessera_bin, "qwen2-tiny.gguf", "long")
    r = _row("qwen2-tiny gguf (F16) vs HF (F32), tessera", "long", len(a), b, a, TOL_FLOAT_TINY)
    assert r["max"] <= TOL_FLOAT_TINY, _fmt(r)


@pytest.mark.parametrize("name", ["default", "smollm2-f16.gguf"])
def test_chunked_prefill_identical(tessera_bin, test_models, name):
    """Each matmul row and attention row is computed independently of the batch shape, so
    prefill in chunks of 7 is bit-identical to one shot (batch invariance)."""
    a = tessera_logits(tessera_bin, name, "code")
    b = tessera_logits(tessera_bin, name, "code", "--chunk", "7")
    _row(f"{name} --chunk 7 vs one-shot", "code", len(a), b, a, 0.0)
    assert np.array_equal(a, b), f"max |d| {np.abs(a - b).max()}"


def test_threads_identical(tessera_bin, test_models):
    """Work is split by output rows / (token, head) pairs, so the thread count changes no
    result bit; that is what lets every other test run tessera with --threads 1."""
    for name in ("default", "smollm2-f16.gguf"):
        a = tessera_logits(tessera_bin, name, "code")
        b = tessera_logits(tessera_bin, name, "code", "--threads", "2")
        _row(f"{name} --threads 2 vs 1", "code", len(a), b, a, 0.0)
        assert np.array_equal(a, b), f"{name}: max |d| {np.abs(a - b).max()}"
    g1 = _tessera_generate("default", "chat", 16)
    g2 = _tessera_generate("default", "chat", 16, ("--threads", "2"))
    assert g1 == g2


def test_kv_f16(tessera_bin, test_models):
    """--kv-dtype f16 on the F16 model. E = max|ref(kv f16) - ref(kv f32)| is the size of
    the fp16 rounding of K and V. fp16 rounding is discontinuous like the activation
    quantization: float32-noise differences in K/V move some values across an fp16
    rounding boundary (one fp16 ulp, 2^-11 relative), layer by layer the flips spread, and
    over a few dozen positions tessera(f16) and ref(f16) are two different realizations of
    the rounding noise. So: both within 2E + float tol of each other and of the f32-KV
    logits. Position 0 attends to itself only (output = its fp16-rounded V): there the
    rounding is the same and tessera must match the emulation to the float tolerance."""
    name, prompt = "smollm2-f16.gguf", "code"
    got16 = tessera_logits(tessera_bin, name, prompt, "--kv-dtype", "f16")
    got32 = tessera_logits(tessera_bin, name, prompt)
    ref16 = ref_logits(name, prompt, kv_dtype="f16")
    ref32 = ref_logits(name, prompt)
    eff = _row("F16 gguf: ref kv f16 vs ref kv f32", prompt, len(ref16), ref16, ref32, None,
               "E: size of the fp16 KV rounding effect")
    tol = 2 * eff["max"] + TOL_FLOAT_SMOLLM
    r = _row("F16 gguf --kv-dtype f16 vs ref kv f16", prompt, len(got16), got16, ref16, tol)
    assert r["max"] <= tol, _fmt(r)
    r = _row("F16 gguf --kv-dtype f16 vs --kv-dtype f32", prompt, len(got16), got16, got32, tol)
    assert r["max"] <= tol, _fmt(r)
    p0 = _row("F16 gguf --kv-dtype f16 vs ref kv f16, position 0", prompt, 1, got16[:1],
              ref16[:1], TOL_FLOAT_SMOLLM)
    assert p0["max"] <= TOL_FLOAT_SMOLLM, _fmt(p0)
    d0 = float(np.abs(got16[0] - got32[0]).max())
    assert d0 > TOL_FLOAT_SMOLLM, f"--kv-dtype f16 did not change position 0 (max |d| {d0})"


def test_kv_f16_q4_1_report(tessera_bin):
    """Report only: on the quantized model the fp16 KV rounding is lost in the
    activation-quantization noise (see test_logits_default_q4_1 for the bound)."""
    got16 = tessera_logits(tessera_bin, "default", "code", "--kv-dtype", "f16")
    got32 = tessera_logits(tessera_bin, "default", "code")
    _, dmax, _ = quant_ensemble("default", "code")
    r = _row("Q4_1 --kv-dtype f16 vs f32", "code", len(got16), got16, got32,
             QUANT_MAX_FACTOR * dmax, "bounded by the act-quant ensemble")
    assert r["max"] <= QUANT_MAX_FACTOR * dmax, _fmt(r)


# ---- greedy continuations -----------------------------------------------------------------

def test_greedy_default_q4_1(tessera_bin):
    got = tessera_generate(tessera_bin, "default", "count")
    want, margins = _ref_greedy("default", "count", GREEDY_TOKENS, act_quant=True)
    assert_same_greedy("Q4_1 gguf (act-quant ref)", "count", got, want, margins,
                       TOL_GREEDY_Q4_1)


@pytest.mark.parametrize("name", ["smollm2-f16.gguf", "smollm2-hf"])
@pytest.mark.parametrize("prompt", ["count", "chat"])
def test_greedy_float_models(tessera_bin, test_models, name, prompt):
    got = tessera_generate(tessera_bin, name, prompt)
    want, margins = _ref_greedy(name, prompt, GREEDY_TOKENS)
    assert_same_greedy(name, prompt, got, want, margins, TOL_FLOAT_SMOLLM)


def test_greedy_q4_1_chat_tokens_are_reference_argmax(tessera_bin):
    """Teacher-forced: on a prompt with near-ties, each of tessera's 64 greedy tokens must
    be the reference's argmax (act-quant mode) on tessera's own prefix, up to the
    quantization noise TOL_GREEDY_Q4_1; reports where the reference would have differed."""
    got = tessera_generate(tessera_bin, "default", "chat")
    prompt = list(ids_of("chat"))
    ref = ref_model("default").forward(prompt + got[:-1], act_quant=True)[len(prompt) - 1:]
    best = ref.max(axis=-1)
    chosen = ref[np.arange(len(got)), got]
    gap = best - chosen
    agree = float(np.mean(gap == 0))
    ROWS.append(dict(case="Q4_1 greedy, teacher-forced", prompt="chat", n=len(got),
                     max=float(gap.max()), mean=float(gap.mean()), top1=agree,
                     tol=TOL_GREEDY_Q4_1, note="max/mean = ref logit gap of tessera's token"))
    bad = np.nonzero(gap > TOL_GREEDY_Q4_1)[0]
    assert bad.size == 0, (f"tessera's greedy token at steps {bad.tolist()} is "
                           f"{gap[bad].round(3).tolist()} below the reference's best logit")
    assert len(got) == GREEDY_TOKENS


def test_greedy_q4_1_equals_hf_dir(tessera_bin, test_models):
    """The Q4_1 GGUF (llama pair-interleaved RoPE on permuted rows) and the HF directory
    derived from it (rotate-half RoPE on HF rows, bf16 weights) give the same greedy ids."""
    a = tessera_generate(tessera_bin, "default", "count")
    b = tessera_generate(tessera_bin, "smollm2-hf", "count")
    _, margins = _ref_greedy("smollm2-hf", "count", GREEDY_TOKENS)
    assert_same_greedy("tessera Q4_1 gguf vs tessera HF dir", "count", a, b, margins,
                       TOL_GREEDY_Q4_1)
    text = tokenizer().decode(a)
    assert "11, 12, 13" in text, text

"""Whole-forward correctness for every GGUF weight type tessera supports: build/tessera's
logits on the tiny quantized GGUFs of scripts/make-test-models.py (tiny-q4_0, -q5_0,
-q5_1, -q4_k, -q6_k and the Q4_K_M-like tiny-mixed; llama with permuted Q/K and qwen2
with q/k/v bias; hidden 256, ffn 512, 2 layers, 4/2 heads x 64, SmolLM2 vocab) against
the numpy reference (tests/python/reference.py).

Per model and prompt (18-39 tokens):
  * act-quant reference (the C matmul's 8-bit activation rounding emulated): tessera within
    TOL = 2 x the noise floor N of the model, N = the largest pairwise max |dlogit| in the
    reference's own act-quant ensemble (float32, float64, 8 runs with 1-ulp jitter) over
    the model's prompts, at least TOL_FLOOR; mean |dlogit| within 2 x the ensemble's mean
    spread (at least MEAN_FLOOR); top-1 identical wherever the reference's top-2 margin
    exceeds TOL.
  * float reference (dequantized weights, exact activations): tessera within
    2 x A + TOL, A = the reference's own act-quant effect max |aq - float|; top-1 identical
    where the float margin exceeds that bound. A bug shared by the C matmul and the
    reference's act-quant emulation could not hide behind the first check.
  * negative controls: a reference whose Q4_K sub-block scales 4..7 lose their high 2 bits
    and one whose Q6_K scales are read unsigned are each far outside TOL from tessera.

Why these bounds, and the measured numbers: docs/correctness.md ("Every weight type").
Rows go to build/forward-quant-report.md.
"""
import functools
import itertools

import gguf
import numpy as np
import pytest

from conftest import BUILD, TEST_MODELS
from test_forward import ids_of, run_tessera, test_models  # noqa: F401  (fixture)

import reference as R

MODELS = ["tiny-q4_0.gguf", "tiny-q5_0.gguf", "tiny-q5_1.gguf", "tiny-q4_k.gguf",
          "tiny-q6_k.gguf", "tiny-mixed.gguf"]
PROMPTS = ["english", "code", "chat"]          # 18, 39, 27 tokens
JITTER_SEEDS = tuple(range(11, 19))
NOISE_FACTOR = 2.0
TOL_FLOOR = 1e-4       # float32 summation-order noise of the tiny models (test_forward.py)
MEAN_FLOOR = 1e-5
THREADS = ("--threads", "1")

ROWS = []


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    if not ROWS:
        return
    lines = ["| model | prompt | tokens | vs | max abs dlogit | mean abs dlogit | top-1 agree | "
             "bound (max) | note |", "|---|---|---|---|---|---|---|---|---|"]
    for r in ROWS:
        lines.append(f"| {r['model']} | {r['prompt']} | {r['n']} | {r['vs']} | {r['max']:.3g} | "
                     f"{r['mean']:.3g} | {r['top1'] * 100:.1f}% | {r['tol']:.3g} | {r['note']} |")
    BUILD.mkdir(parents=True, exist_ok=True)
    (BUILD / "forward-quant-report.md").write_text("\n".join(lines) + "\n")
    _model.cache_clear()
    _ref.cache_clear()
    _noise.cache_clear()
    _tessera.cache_clear()


def _row(model, prompt, vs, got, ref, tol, note=""):
    d = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    r = dict(model=model, prompt=prompt, n=len(ref), vs=vs, max=float(d.max()),
             mean=float(d.mean()), top1=float(np.mean(got.argmax(-1) == ref.argmax(-1))),
             tol=tol, note=note)
    ROWS.append(r)
    return r


def _fmt(r):
    return (f"{r['model']} [{r['prompt']}, {r['n']} tokens] vs {r['vs']}: max|dlogit| "
            f"{r['max']:.4g}, mean {r['mean']:.4g}, top-1 {r['top1'] * 100:.1f}%, bound {r['tol']:.4g}")


# ---- reference and tessera, cached -----------------------------------------------------

@functools.lru_cache(maxsize=None)
def _model(name):
    return R.load_model(TEST_MODELS / name)


@functools.lru_cache(maxsize=None)
def _ref(name, prompt, act_quant=True, jitter_seed=None):
    out = _model(name).forward(list(ids_of(prompt)), act_quant=act_quant,
                               jitter_seed=jitter_seed)
    return out.astype(np.float32)


@functools.lru_cache(maxsize=None)
def _noise(name):
    """(N, M, A) for a model over PROMPTS: N, M = largest pairwise max / mean |dlogit| in
    the act-quant ensemble; A = largest max |aq - float| of the reference."""
    n = m = a = 0.0
    base = _model(name)  # float64 twin: same dequantized weights, float64 arithmetic
    m64 = R.Model(base.cfg, base.w, dict(base.wtypes), None, np.float64, source=base.source)
    for p in PROMPTS:
        members = [_ref(name, p),
                   m64.forward(list(ids_of(p)), act_quant=True).astype(np.float32)]
        members += [_ref(name, p, jitter_seed=s) for s in JITTER_SEEDS]
        for x, y in itertools.combinations(members, 2):
            d = np.abs(x.astype(np.float64) - y)
            n, m = max(n, float(d.max())), max(m, float(d.mean()))
        a = max(a, float(np.abs(_ref(name, p).astype(np.float64) - _ref(name, p, False)).max()))
    return n, m, a


def bounds(name):
    n, m, a = _noise(name)
    tol = max(NOISE_FACTOR * n, TOL_FLOOR)
    return tol, max(NOISE_FACTOR * m, MEAN_FLOOR), 2 * a + tol, (n, m, a)


@functools.lru_cache(maxsize=None)
def _tessera(name, prompt):
    ids = ids_of(prompt)
    out_dir = BUILD / "forward-test-out"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"quant-{name}-{prompt}.bin"
    out.unlink(missing_ok=True)
    run_tessera(["logits", "--model", TEST_MODELS / name, "--tokens", ",".join(map(str, ids)),
                 "--out", out, *THREADS])
    a = np.fromfile(out, dtype="<f4")
    out.unlink()
    assert a.size % len(ids) == 0 and a.size > 0, f"{a.size} floats for {len(ids)} tokens"
    return a.reshape(len(ids), -1)


def _decided_mismatch(got, ref, margin):
    s = np.sort(ref, axis=-1)
    decided = (s[:, -1] - s[:, -2]) > margin
    return np.nonzero(decided & (got.argmax(-1) != ref.argmax(-1)))[0]


# ---- the models are what they claim to be (no binary needed) ---------------------------

EXPECTED_TYPES = {
    "tiny-q4_0.gguf": ("llama", "Q4_0", "Q4_0", None),
    "tiny-q5_0.gguf": ("qwen2", "Q5_0", "Q5_0", None),
    "tiny-q5_1.gguf": ("llama", "Q5_1", "Q5_1", None),
    "tiny-q4_k.gguf": ("qwen2", "Q4_K", "Q4_K", None),
    "tiny-q6_k.gguf": ("llama", "Q6_K", "Q6_K", None),
    "tiny-mixed.gguf": ("llama", None, "Q4_K", "Q8_0"),
}


@pytest.mark.parametrize("name", MODELS)
def test_quant_model_types(test_models, name):  # noqa: F811
    m = _model(name)
    arch, mat, embd, out = EXPECTED_TYPES[name]
    assert m.cfg.arch == arch and m.cfg.hidden == 256 and m.cfg.ffn == 512
    assert (m.cfg.n_layer, m.cfg.n_head, m.cfg.n_kv_head, m.cfg.head_dim) == (2, 4, 2, 64)
    assert m.wtypes["embed_tokens"] == embd
    assert m.wtypes["lm_head"] == (out or embd)
    mats = {k: v for k, v in m.wtypes.items() if k.startswith("layers.") and
            k.endswith("_proj")}
    if mat is not None:
        assert set(mats.values()) == {mat}, mats
    else:  # Q4_K_M-like: Q4_K attention / gate / up, Q6_K ffn_down, other act formats mixed in
        assert set(mats.values()) == {"Q4_K", "Q6_K", "Q8_0", "Q4_0"}, mats
        assert all(mats[f"layers.{i}.mlp.down_proj"] == "Q6_K" for i in range(2))
    norms = [v for k, v in m.wtypes.items() if k.endswith("layernorm") or k == "norm"]
    assert set(norms) == {"F32"}


# ---- tessera vs the reference -------------------------------------------------------------

@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("name", MODELS)
def test_logits_quant(tessera_bin, test_models, name, prompt):  # noqa: F811
    got = _tessera(name, prompt)
    aq = _ref(name, prompt)
    fl = _ref(name, prompt, act_quant=False)
    assert got.shape == aq.shape, f"logits shape {got.shape} != reference {aq.shape}"
    assert np.isfinite(got).all()
    tol, tol_mean, tol_float, (n, m, a) = bounds(name)
    short = name[len("tiny-"):-len(".gguf")]
    r = _row(short, prompt, "act-quant ref", got, aq, tol,
             f"noise N {n:.3g} (mean {m:.3g}); mean bound {tol_mean:.3g}")
    assert r["max"] <= tol, f"{_fmt(r)}: max exceeds {NOISE_FACTOR} x the act-quant noise {n:.4g}"
    assert r["mean"] <= tol_mean, f"{_fmt(r)}: mean exceeds {tol_mean:.4g}"
    bad = _decided_mismatch(got, aq, tol)
    assert bad.size == 0, f"{_fmt(r)}: top-1 differs at decided positions {bad.tolist()}"
    rf = _row(short, prompt, "float ref", got, fl, tol_float,
              f"act-quant effect A {a:.3g}; bound 2A + tol")
    assert rf["max"] <= tol_float, _fmt(rf)
    bad = _decided_mismatch(got, fl, tol_float)
    assert bad.size == 0, f"{_fmt(rf)}: top-1 differs at decided positions {bad.tolist()}"


# ---- negative controls: wrong dequantization is far outside the bounds -----------------------

def _q4_k_bad(raw):
    """Q4_K dequantization with scales/mins 4..7 missing their high 2 bits (a plausible
    unpacking bug: only the low nibble in bytes 8..11 read)."""
    blocks = raw.reshape(-1, 144)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    s = blocks[:, 4:16].reshape(-1, 3, 4)
    sc = np.concatenate([s[:, 0] & 0x3F, s[:, 2] & 0x0F], axis=-1).astype(np.float32)
    mn = np.concatenate([s[:, 1] & 0x3F, s[:, 2] >> 4], axis=-1).astype(np.float32)
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 0x0F).reshape(-1, 8, 32).astype(np.float32)
    return (d * sc)[..., None] * q - (dmin * mn)[..., None]


def _q6_k_bad(raw):
    """Q6_K dequantization reading the int8 sub-block scales as uint8."""
    blocks = raw.reshape(-1, 210).copy()
    good = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q6_K).reshape(-1, 16, 16)
    sc = blocks[:, 192:208].view(np.int8).astype(np.float32)
    return good * np.where(sc < 0, (sc + 256) / sc, 1.0)[..., None]


def _bugged_model(name, qtype, bad):
    """The f32 reference of `name` with every `qtype` tensor dequantized by `bad`."""
    m = _model(name)
    r = gguf.GGUFReader(str(TEST_MODELS / name))
    w = dict(m.w)
    n_changed = 0
    tied = not any(t.name == "output.weight" for t in r.tensors)
    if tied:
        del w["lm_head"]
    for t in r.tensors:
        if t.tensor_type.name != qtype:
            continue
        arr = bad(np.asarray(t.data)).reshape(tuple(int(s) for s in reversed(t.shape)))
        if t.name in R.GGUF_GLOBAL_NAMES:
            hf = R.GGUF_GLOBAL_NAMES[t.name]
        else:
            _, i, rest = t.name.split(".", 2)
            hf = f"layers.{i}.{R.GGUF_LAYER_NAMES[rest]}"
            if m.cfg.arch == "llama" and rest.startswith(("attn_q.", "attn_k.")):
                arr = R.unpermute_qk(arr, m.cfg.n_head if rest.startswith("attn_q")
                                     else m.cfg.n_kv_head)
        w[hf] = arr.astype(np.float32)
        n_changed += 1
    assert n_changed > 0
    return R.Model(m.cfg, w, {k: v for k, v in m.wtypes.items() if k in w or k == "lm_head"},
                   None, np.float32)


@pytest.mark.parametrize("name,qtype,bad", [("tiny-q4_k.gguf", "Q4_K", _q4_k_bad),
                                            ("tiny-q6_k.gguf", "Q6_K", _q6_k_bad)])
def test_wrong_dequant_is_caught(tessera_bin, test_models, name, qtype, bad):  # noqa: F811
    prompt = "english"
    got = _tessera(name, prompt)
    tol, tol_mean, _, _ = bounds(name)
    bugged = _bugged_model(name, qtype, bad).forward(list(ids_of(prompt)), act_quant=True)
    r = _row(name[len("tiny-"):-len(".gguf")], prompt, f"ref with WRONG {qtype} dequant",
             got, bugged, tol, "negative control")
    assert r["max"] > 10 * tol and r["mean"] > 10 * tol_mean, _fmt(r)


# ---- generate: the files load with their tokenizer, greedy tokens are the reference's --------

GEN_TOKENS = 16


@pytest.mark.parametrize("name", MODELS)
def test_generate_teacher_forced(tessera_bin, test_models, name):  # noqa: F811
    """16 greedy tokens (KV-cache decode) from a text prompt (the files carry the SmolLM2
    tokenizer); each must be within the act-quant bound TOL of the reference's best logit
    on tessera's own prefix (teacher forcing: free-running identity is not a fair demand
    where the random model's top-2 margins fall below the noise)."""
    from test_forward import PROMPTS as TEXT, tokenizer
    p = run_tessera(["generate", "--model", TEST_MODELS / name, "--prompt", TEXT["english"],
                     "--max-tokens", GEN_TOKENS, "--temperature", 0, "--print-ids",
                     "--ignore-eos", *THREADS])
    got = [int(t) for t in p.stdout.strip().splitlines()[-1].split()]
    assert len(got) == GEN_TOKENS
    prompt = list(tokenizer().encode(TEXT["english"]).ids)
    assert prompt == list(ids_of("english"))
    ref = _model(name).forward(prompt + got[:-1], act_quant=True)[len(prompt) - 1:]
    gap = ref.max(axis=-1) - ref[np.arange(len(got)), got]
    tol = bounds(name)[0]
    ROWS.append(dict(model=name[len("tiny-"):-len(".gguf")], prompt="english", n=len(got),
                     vs="greedy, teacher-forced", max=float(gap.max()), mean=float(gap.mean()),
                     top1=float(np.mean(gap == 0)), tol=tol,
                     note="max/mean = ref logit gap of tessera's token"))
    bad = np.nonzero(gap > tol)[0]
    assert bad.size == 0, f"{name}: tokens at steps {bad.tolist()} are {gap[bad]} below the best"

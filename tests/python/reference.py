"""An independent numpy forward pass for the llama / qwen2 / qwen3 decoder families, the
oracle the C forward (build/tessera logits / generate) is compared against.

Written from the math, with Hugging Face transformers' modeling code as the semantic
reference (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM):

    x = embed[tokens]
    per layer:
        h = rmsnorm(x) * w_attn_norm
        q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)          # qwen2: biases
        q, k = rmsnorm_per_head(q) * q_norm, ... * k_norm             # qwen3, before RoPE
        q, k = rope(q), rope(k)        # HF "rotate_half" (halves), HF-layout weights
        a = softmax(q k^T / sqrt(head_dim) + causal) v               # GQA: kv head h // group
        x = x + a Wo^T
        h = rmsnorm(x) * w_ffn_norm
        x = x + (silu(h Wg^T) * (h Wu^T)) Wd^T
    logits = (rmsnorm(x) * w_out_norm) W_lm^T                        # tied: W_lm = embed

RoPE: inv_freq[i] = theta^(-2i/head_dim), optionally rescaled exactly as transformers'
`_compute_llama3_parameters` (rope_scaling.rope_type == "llama3") or linearly; GGUF files
may instead carry `rope_freqs.weight` (llama.cpp's per-frequency divisors), applied too.
Angles are computed in float64 and cos/sin rounded to the compute dtype.

Weights are loaded from
  * a GGUF file (gguf.GGUFReader + gguf.quants.dequantize). llama.cpp's converter
    permutes the rows of Q and K for arch `llama` (LlamaModel.permute:
    w.reshape(n_head, 2, d // n_head // 2, *rest).swapaxes(1, 2)) so that its "normal"
    RoPE rotates adjacent pairs; `unpermute_qk` inverts that, so the reference holds HF
    layout for every source and always rotates halves. qwen2/qwen3 GGUFs are not permuted.
  * a Hugging Face directory (config.json + model.safetensors or a sharded
    model.safetensors.index.json). Safetensors are parsed here directly (header JSON +
    raw little-endian data; BF16 -> float32 by a 16-bit shift), since numpy has no bf16.

Precision. Weights are held as the exact float32 values of the dequantized / bf16 / f16
weights (cast to `dtype` when dtype=np.float64). With the default dtype=np.float32 every
op runs in float32 and the matmuls go through numpy's BLAS sgemm (float32 accumulation,
blocked order, different from the C kernels' order); reductions inside RMSNorm are done
in float64. dtype=np.float64 gives a float64 reference (used to measure the float32
reference's own rounding error; see docs/correctness.md).

Two modes for quantized weights:
  * act_quant=False ("float" mode): y = x W^T with W dequantized and x exact — the
    mathematical model the quantized file stands for.
  * act_quant=True: emulates the C matmul, which quantizes the activation row before each
    quantized-weight matmul (src/backend/cpu/quant_kernels.h):
        weight Q4_0/Q5_0/Q8_0 -> Q8_0: blocks of 32, d = amax/127, q = round(x * (1/d))
        weight Q4_1/Q5_1      -> Q8_1: the same values (plus block sums, which don't
                                          change the product)
        weight Q4_K/Q6_K/...  -> Q8_K: blocks of 256, d = amax/127
    d is kept in float32 (tessera's choice; ggml rounds d of Q8_0/Q8_1 to fp16:
    act_scale_f16=True emulates that). The product then uses x' = d*q instead of x.
    Float weights (F32/F16/BF16) use x unchanged in both modes.
Optional kv_dtype="f16" rounds K and V to fp16 when they enter the cache (the C
--kv-dtype f16), before attention reads them, including the current tokens'.

Usage:
    m = load_model(path)                        # .gguf file or HF directory
    logits = m.forward(tokens)                  # [n_tokens, vocab] float32
    ids, margins = m.greedy(prompt_ids, 64)     # incremental decode with a KV cache
"""
import ctypes
import json
import math
import os
import pathlib
import struct

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # effective only if numpy isn't loaded yet
import numpy as np  # noqa: E402


def limit_blas_threads(n=1):
    """One BLAS thread: on a shared 2-core machine OpenBLAS's spinning worker threads make
    the matrix-vector products of incremental decode 10-20x slower under contention.
    Works after numpy is loaded (calls the bundled OpenBLAS's setter); best effort."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return
    for lib in libs:
        try:
            h = ctypes.CDLL(lib)
        except OSError:
            continue
        for sym in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                    "openblas_set_num_threads"):
            fn = getattr(h, sym, None)
            if fn is not None:
                fn(ctypes.c_int(n))
                break


limit_blas_threads(1)

# GGML weight type name -> activation format of the C matmul (None: x used as is).
ACT_FORMAT = {
    "Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q8_0": "Q8_0",
    "Q4_1": "Q8_1", "Q5_1": "Q8_1",
    "Q2_K": "Q8_K", "Q3_K": "Q8_K", "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K",
}
ACT_BLOCK = {"Q8_0": 32, "Q8_1": 32, "Q8_K": 256}


# ---- small numeric helpers -------------------------------------------------------------

def roundf(x):
    """C roundf: round half away from zero (numpy's round is half-to-even)."""
    return np.copysign(np.floor(np.abs(x) + 0.5), x)


def bf16_to_f32(u16):
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """Round-to-nearest-even float32 -> bf16 bits (uint16), NaN kept quiet."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    return r


def round_bf16(x):
    return bf16_to_f32(f32_to_bf16(x))


def quantize_activation(x, fmt, scale_f16=False):
    """Returns the float32 values d*q the C matmul multiplies instead of x[..., n]."""
    block = ACT_BLOCK[fmt]
    x = np.asarray(x, dtype=np.float32)
    shape = x.shape
    xb = x.reshape(-1, shape[-1] // block, block)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    d = amax / np.float32(127.0)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1.0) / d).astype(np.float32)
    q = np.clip(roundf(xb * inv), -127, 127)
    if scale_f16:
        d = d.astype(np.float16).astype(np.float32)
    return (q * d).astype(np.float32).reshape(shape)


def jitter_ulp(x, rng, fraction=0.2):
    """x with a random `fraction` of its elements moved one float32 ulp up or down."""
    x = np.asarray(x, np.float32)
    u = rng.random(x.shape)
    step = np.where(u < fraction / 2, -1, np.where(u < fraction, 1, 0)).astype(np.float32)
    return (x + step * np.spacing(np.abs(x)).astype(np.float32)).astype(np.float32)


def unpermute_qk(w, n_head):
    """Inverse of llama.cpp convert_hf_to_gguf.py LlamaModel.permute for one of Q (n_head)
    or K (n_head_kv): rows go back from pair-interleaved to HF's halves layout."""
    shape = w.shape
    return (w.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:])
            .swapaxes(1, 2).reshape(shape))


def permute_qk(w, n_head):
    """llama.cpp's LlamaModel.permute (HF layout -> GGUF llama layout), for tests."""
    shape = w.shape
    return (w.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:])
            .swapaxes(1, 2).reshape(shape))


def rope_inv_freq(head_dim, theta, rope_scaling=None, freq_factors=None):
    """float64 inv_freq[head_dim/2]; rope_scaling as in an HF config.json."""
    inv = 1.0 / (float(theta) ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    rs = rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "llama3":
        # transformers.modeling_rope_utils._compute_llama3_parameters
        factor = float(rs["factor"])
        low_ff = float(rs["low_freq_factor"])
        high_ff = float(rs["high_freq_factor"])
        old_ctx = float(rs["original_max_position_embeddings"])
        low_wavelen = old_ctx / low_ff
        high_wavelen = old_ctx / high_ff
        wavelen = 2 * math.pi / inv
        inv_l = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low_ff) / (high_ff - low_ff)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = np.where(medium, smoothed, inv_l)
    elif kind == "linear":
        inv = inv / float(rs["factor"])
    elif kind not in (None, "default"):
        raise ValueError(f"unsupported rope_scaling {rope_scaling!r}")
    if freq_factors is not None:
        inv = inv / np.asarray(freq_factors, dtype=np.float64)
    return inv


# ---- model -------------------------------------------------------------------------------

class Config:
    def __init__(self, **kw):
        self.arch = kw["arch"]                    # "llama" | "qwen2" | "qwen3"
        self.n_layer = int(kw["n_layer"])
        self.hidden = int(kw["hidden"])
        self.n_head = int(kw["n_head"])
        self.n_kv_head = int(kw["n_kv_head"])
        self.head_dim = int(kw.get("head_dim") or self.hidden // self.n_head)
        self.ffn = int(kw["ffn"])
        self.eps = float(kw["eps"])
        self.rope_theta = float(kw["rope_theta"])
        self.rope_scaling = kw.get("rope_scaling")
        self.vocab = int(kw["vocab"])

    def __repr__(self):
        return f"Config({self.__dict__})"


class KVCache:
    def __init__(self, n_layer):
        self.k = [None] * n_layer   # [n_kv_head, T, head_dim]
        self.v = [None] * n_layer
        self.length = 0


class Model:
    """weights: dict name -> float array (HF names without the "model." prefix:
    embed_tokens, norm, lm_head, layers.{i}.self_attn.{q,k,v,o}_proj[.bias],
    layers.{i}.self_attn.{q,k}_norm, layers.{i}.mlp.{gate,up,down}_proj,
    layers.{i}.{input,post_attention}_layernorm). wtypes: name -> storage type name
    ("Q4_1", "F16", ...), used by act_quant."""

    def __init__(self, cfg, weights, wtypes, freq_factors=None, dtype=np.float32,
                 source=""):
        self.cfg = cfg
        self.dtype = np.dtype(dtype)
        self.w = {k: np.ascontiguousarray(v, dtype=self.dtype) for k, v in weights.items()}
        self.wtypes = wtypes
        self.source = source
        self.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling,
                                      freq_factors)
        if "lm_head" not in self.w:
            self.w["lm_head"] = self.w["embed_tokens"]
            self.wtypes["lm_head"] = self.wtypes["embed_tokens"]
        assert self.w["embed_tokens"].shape == (cfg.vocab, cfg.hidden), self.w["embed_tokens"].shape

    # -- ops --
    def _rmsnorm(self, x, w):
        x64 = x.astype(np.float64)
        r = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + self.cfg.eps)
        return ((x64 * r).astype(self.dtype) * w).astype(self.dtype)

    def _mm(self, x, name, act_quant, act_scale_f16, jitter=None):
        w = self.w[name]
        if act_quant:
            fmt = ACT_FORMAT.get(self.wtypes[name])
            if fmt is not None:
                x = np.asarray(x, np.float32)
                if jitter is not None:
                    x = jitter_ulp(x, jitter)
                x = quantize_activation(x, fmt, act_scale_f16).astype(self.dtype)
        y = x @ w.T
        b = self.w.get(name + ".bias")
        if b is not None:
            y = y + b
        return y

    def _rope(self, x, pos):
        """x [T, H, hd]; rotate halves (HF rotate_half)."""
        ang = pos.astype(np.float64)[:, None] * self.inv_freq[None, :]
        c = np.cos(ang).astype(self.dtype)[:, None, :]
        s = np.sin(ang).astype(self.dtype)[:, None, :]
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)

    def forward(self, tokens, cache=None, act_quant=False, act_scale_f16=False,
                kv_dtype="f32", jitter_seed=None):
        """Logits [len(tokens), vocab] (float32) for tokens appended after `cache`.
        jitter_seed (act_quant only): before each activation quantization, move a random
        20% of the elements by one float32 ulp up or down — what a different (equally
        correct) float32 summation order does to the values entering the rounding. The
        spread of such runs is the noise floor of any correct act-quant implementation
        (see docs/correctness.md)."""
        jitter = np.random.default_rng(jitter_seed) if jitter_seed is not None else None
        cfg = self.cfg
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        start = cache.length if cache is not None else 0
        pos = np.arange(start, start + T)
        hd, nh, nkv = cfg.head_dim, cfg.n_head, cfg.n_kv_head
        group = nh // nkv
        scale = self.dtype.type(1.0 / math.sqrt(hd))
        mm = lambda x, n: self._mm(x, n, act_quant, act_scale_f16, jitter)  # noqa: E731
        x = self.w["embed_tokens"][tokens]
        for li in range(cfg.n_layer):
            p = f"layers.{li}."
            h = self._rmsnorm(x, self.w[p + "input_layernorm"])
            q = mm(h, p + "self_attn.q_proj").reshape(T, nh, hd)
            k = mm(h, p + "self_attn.k_proj").reshape(T, nkv, hd)
            v = mm(h, p + "self_attn.v_proj").reshape(T, nkv, hd)
            if p + "self_attn.q_norm" in self.w:
                q = self._rmsnorm(q, self.w[p + "self_attn.q_norm"])
                k = self._rmsnorm(k, self.w[p + "self_attn.k_norm"])
            q = self._rope(q, pos)
            k = self._rope(k, pos)
            if kv_dtype == "f16":
                k = k.astype(np.float16).astype(self.dtype)
                v = v.astype(np.float16).astype(self.dtype)
            k = k.transpose(1, 0, 2)  # [nkv, T, hd]
            v = v.transpose(1, 0, 2)
            if cache is not None and cache.k[li] is not None:
                k = np.concatenate([cache.k[li], k], axis=1)
                v = np.concatenate([cache.v[li], v], axis=1)
            if cache is not None:
                cache.k[li], cache.v[li] = k, v
            S = k.shape[1]
            qh = q.transpose(1, 0, 2).reshape(nkv, group * T, hd)       # head h -> kv h//group
            sc = (qh @ k.transpose(0, 2, 1)).reshape(nkv, group, T, S) * scale
            mask = np.arange(S)[None, :] > (start + np.arange(T))[:, None]
            sc = np.where(mask, -np.inf, sc)
            sc = sc - sc.max(axis=-1, keepdims=True)
            e = np.exp(sc)
            pr = (e / e.sum(axis=-1, keepdims=True)).astype(self.dtype)
            a = (pr.reshape(nkv, group * T, S) @ v).reshape(nh, T, hd)
            a = a.transpose(1, 0, 2).reshape(T, nh * hd)
            x = x + mm(a, p + "self_attn.o_proj")
            h = self._rmsnorm(x, self.w[p + "post_attention_layernorm"])
            g = mm(h, p + "mlp.gate_proj")
            u = mm(h, p + "mlp.up_proj")
            with np.errstate(over="ignore"):
                act = (g / (1 + np.exp(-g))) * u
            x = x + mm(act.astype(self.dtype), p + "mlp.down_proj")
        if cache is not None:
            cache.length += T
        x = self._rmsnorm(x, self.w["norm"])
        return mm(x, "lm_head").astype(np.float32)

    def new_cache(self):
        return KVCache(self.cfg.n_layer)

    def greedy(self, prompt, n_new, **kw):
        """Greedy decode with a KV cache (prefill once, then one token per step).
        Returns (ids, margins): margins[i] = top1 - top2 logit at step i."""
        cache = self.new_cache()
        logits = self.forward(prompt, cache, **kw)[-1]
        ids, margins = [], []
        for i in range(n_new):
            top2 = np.argpartition(-logits, 2)[:2]
            t = int(np.argmax(logits))
            other = int(top2[0] if top2[0] != t else top2[1])
            ids.append(t)
            margins.append(float(logits[t] - logits[other]))
            if i + 1 < n_new:
                logits = self.forward([t], cache, **kw)[-1]
        return ids, margins


# ---- loaders -----------------------------------------------------------------------------

GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm",
    "ffn_norm.weight": "post_attention_layernorm",
    "attn_q.weight": "self_attn.q_proj", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj",
    "attn_q_norm.weight": "self_attn.q_norm", "attn_k_norm.weight": "self_attn.k_norm",
    "ffn_gate.weight": "mlp.gate_proj", "ffn_up.weight": "mlp.up_proj",
    "ffn_down.weight": "mlp.down_proj",
}
GGUF_GLOBAL_NAMES = {"token_embd.weight": "embed_tokens", "output_norm.weight": "norm",
                     "output.weight": "lm_head"}


def load_gguf(path, dtype=np.float32, round_to_bf16=False):
    """round_to_bf16: round every weight to bf16 after dequantizing (and un-permuting), to
    reproduce the HF directory scripts/make-test-models.py derives from a GGUF."""
    import gguf
    r = gguf.GGUFReader(str(path))

    def field(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    if arch not in ("llama", "qwen2", "qwen3"):
        raise ValueError(f"{path}: unsupported architecture {arch!r}")
    n_head = int(field(f"{arch}.attention.head_count"))
    n_kv = int(field(f"{arch}.attention.head_count_kv", n_head))
    hidden = int(field(f"{arch}.embedding_length"))
    tensors = {t.name: t for t in r.tensors}
    vocab = int(tensors["token_embd.weight"].shape[1])
    cfg = Config(arch=arch, n_layer=field(f"{arch}.block_count"), hidden=hidden,
                 n_head=n_head, n_kv_head=n_kv,
                 head_dim=field(f"{arch}.attention.key_length", hidden // n_head),
                 ffn=field(f"{arch}.feed_forward_length"),
                 eps=field(f"{arch}.attention.layer_norm_rms_epsilon"),
                 rope_theta=field(f"{arch}.rope.freq_base", 10000.0), vocab=vocab)
    weights, wtypes = {}, {}
    freq_factors = None
    for name, t in tensors.items():
        arr = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = tuple(int(s) for s in reversed(t.shape))  # numpy order (outermost first)
        arr = arr.reshape(shape)
        if name == "rope_freqs.weight":
            freq_factors = arr
            continue
        if name in GGUF_GLOBAL_NAMES:
            hf = GGUF_GLOBAL_NAMES[name]
        else:
            parts = name.split(".", 2)
            if parts[0] != "blk" or parts[2] not in GGUF_LAYER_NAMES:
                raise ValueError(f"{path}: unexpected tensor {name}")
            hf = f"layers.{parts[1]}.{GGUF_LAYER_NAMES[parts[2]]}"
            if arch == "llama" and parts[2].startswith(("attn_q.", "attn_k.")):
                arr = unpermute_qk(arr, n_head if parts[2].startswith("attn_q") else n_kv)
        if round_to_bf16:
            arr = round_bf16(arr)
        weights[hf] = arr
        wtypes[hf] = t.tensor_type.name
    return Model(cfg, weights, wtypes, freq_factors, dtype, source=str(path))


ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


def read_safetensors(path):
    """{name: (float32 array, dtype name)} from one .safetensors file."""
    path = pathlib.Path(path)
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        s, e = info["data_offsets"]
        a = np.frombuffer(raw[s:e], dtype=np.dtype(ST_DTYPES[info["dtype"]]).newbyteorder("<"))
        a = bf16_to_f32(a) if info["dtype"] == "BF16" else a.astype(np.float32)
        out[name] = (a.reshape(info["shape"]), info["dtype"])
    return out


def load_hf(path, dtype=np.float32):
    path = pathlib.Path(path)
    c = json.loads((path / "config.json").read_text())
    mt = c["model_type"]
    if mt not in ("llama", "qwen2", "qwen3"):
        raise ValueError(f"{path}: unsupported model_type {mt!r}")
    cfg = Config(arch=mt, n_layer=c["num_hidden_layers"], hidden=c["hidden_size"],
                 n_head=c["num_attention_heads"],
                 n_kv_head=c.get("num_key_value_heads", c["num_attention_heads"]),
                 head_dim=c.get("head_dim"), ffn=c["intermediate_size"],
                 eps=c["rms_norm_eps"], rope_theta=c.get("rope_theta", 10000.0),
                 rope_scaling=c.get("rope_scaling"), vocab=c["vocab_size"])
    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    weights, wtypes = {}, {}
    for fn in files:
        for name, (arr, dt) in read_safetensors(path / fn).items():
            key = name[len("model."):] if name.startswith("model.") else name
            if key.endswith(".weight"):
                key = key[: -len(".weight")]
            weights[key] = arr
            wtypes[key] = dt
    tied = c.get("tie_word_embeddings", False)
    if tied:
        weights.pop("lm_head", None)
    elif "lm_head" not in weights:
        raise ValueError(f"{path}: untied model without lm_head.weight")
    return Model(cfg, weights, wtypes, None, dtype, source=str(path))


def load_model(path, **kw):
    path = pathlib.Path(path)
    return load_hf(path, **kw) if path.is_dir() else load_gguf(path, **kw)


if __name__ == "__main__":
    # Self-check: python tests/python/reference.py MODEL "prompt" [n]
    import sys
    import time
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from gguf_tokenizer import hf_tokenizer_from_gguf
    model_path = sys.argv[1]
    prompt = sys.argv[2] if len(sys.argv) > 2 else "The capital of France is"
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 24
    tok_src = model_path if model_path.endswith(".gguf") else None
    if tok_src:
        tok = hf_tokenizer_from_gguf(tok_src)
    else:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(pathlib.Path(model_path) / "tokenizer.json"))
    t0 = time.time()
    m = load_model(model_path)
    t1 = time.time()
    ids = tok.encode(prompt).ids
    out, margins = m.greedy(ids, n, act_quant="--aq" in sys.argv)
    t2 = time.time()
    print(f"load {t1 - t0:.1f}s, greedy {t2 - t1:.1f}s; prompt ids {ids}")
    print(repr(tok.decode(out)))
    print("min margin", min(margins))

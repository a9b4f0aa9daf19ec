#!/usr/bin/env python3
"""Derives the test models the forward-pass comparisons (tests/python/test_forward.py)
run on, from the default GGUF (models/SmolLM2-135M-Instruct.Q4_1.gguf). Nothing is
downloaded.

    scripts/make-test-models.py [--out build/testmodels] [--model M.gguf] [--verify]

Writes into --out:
  smollm2-f16.gguf        every weight dequantized to F16 (1-D norms F32); same metadata,
                          tokenizer and chat template; Q/K rows keep the GGUF llama layout
  smollm2-q8_0.gguf       2-D weights requantized to Q8_0 (gguf.quants.quantize), the
                          Q8_0 token embedding copied as is
  smollm2-hf/             Hugging Face directory: config.json (LlamaForCausalLM, the real
                          SmolLM2-135M values), model.safetensors in BF16 with Q/K
                          un-permuted to HF layout, tokenizer.json (gguf_tokenizer),
                          tokenizer_config.json, generation_config.json
  smollm2-hf-sharded/     the same tensors in 2 shards + model.safetensors.index.json
  qwen2-tiny/             random Qwen2ForCausalLM (q/k/v bias, untied lm_head), F32
                          safetensors holding f16-representable values
  qwen2-tiny.gguf         the same weights as a GGUF (arch qwen2, F16 matrices, F32
                          norms and biases): identical values to qwen2-tiny/
  qwen2-tiny-q8_0.gguf    the same with every matrix quantized to Q8_0 by
                          gguf.quants.quantize: what --quantization q8_0 makes of qwen2-tiny/
  qwen3-tiny/             random Qwen3ForCausalLM (q_norm/k_norm, head_dim 32 with
                          hidden 64 and 4 heads, tied), BF16
  llama3-tiny/            random LlamaForCausalLM with llama3 rope_scaling (factor 8,
                          low 1, high 4, original_max_position_embeddings 64), rope_theta
                          500000, untied, BF16
  qwen2-tiny-hd64/, qwen3-tiny-hd64/, llama3-tiny-hd64/
                          the same three with head_dim 64 (4 x 64 over hidden 64), other
                          seeds: the head dims the CUDA attention kernels take
  tiny-q4_0.gguf, tiny-q5_0.gguf, tiny-q5_1.gguf, tiny-q4_k.gguf, tiny-q6_k.gguf
                          random GGUFs (hidden 256, ffn 512, 2 layers, 4/2 heads x 64)
                          with every matrix and the tied token_embd in that type, norms
                          F32; llama ones have Q/K rows permuted as llama.cpp's converter
                          does, qwen2 ones q/k/v bias (F32). Q4_K/Q6_K blocks come from
                          the small numpy quantizers here (gguf 0.19 can't write them),
                          checked bit for bit against gguf.quants.dequantize
  tiny-mixed.gguf         the same dims, llama, Q4_K_M-like: Q4_K token_embd and attention
                          / gate / up, Q6_K ffn_down and layer-0 attn_v, a Q8_0 attn_v and
                          a Q4_0 ffn_up in layer 1, untied Q8_0 output
The tiny models reuse the SmolLM2 tokenizer (vocab 49152). Random weights use fixed seeds
and are scaled so activations stay O(1) (projections N(0, 1/fan_in), norms 1 + N(0, 0.1^2))
and logits have a spread of a few units (lm_head N(0, 0.4^2)).

Idempotent: each product records a stamp (recipe version, source file size and mtime,
and the size and sha256 of every file written) in <out>/.stamps/; a product whose stamp
matches and whose files exist with the recorded sizes is skipped (--verify also rehashes
them). Runs in well under a minute when everything has to be made.
"""
import argparse
import hashlib
import json
import os
import pathlib
import shutil
import struct
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))

import gguf  # noqa: E402

import reference as ref  # noqa: E402  (bf16 rounding, the Q/K (un)permutation)

RECIPE_VERSION = 3  # bump when the output of a product changes

SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536,
    "is_llama_config": True,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "pad_token_id": 2,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_interleaved": False,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3",
    "use_cache": True,
    "vocab_size": 49152,
}

GGUF_TO_HF_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}
HF_TO_GGUF_LAYER = {v: k for k, v in GGUF_TO_HF_LAYER.items()}


def log(msg):
    print(f"make-test-models: {msg}", flush=True)


# ---- stamps ----------------------------------------------------------------------------

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


class Product:
    """One output (a file or a directory) with its stamp."""

    def __init__(self, out, name, key):
        self.out = out
        self.name = name
        self.path = out / name
        self.key = dict(key, product=name, recipe=RECIPE_VERSION)
        self.stamp = out / ".stamps" / (name + ".json")

    def files(self):
        if self.path.is_dir():
            return sorted(p for p in self.path.rglob("*") if p.is_file())
        return [self.path] if self.path.exists() else []

    def up_to_date(self, verify):
        try:
            st = json.loads(self.stamp.read_text())
        except (OSError, ValueError):
            return False
        if st.get("key") != self.key:
            return False
        for rel, (size, digest) in st["files"].items():
            p = self.out / rel
            if not p.is_file() or p.stat().st_size != size:
                return False
            if verify and sha256(p) != digest:
                return False
        listed = {self.out / rel for rel in st["files"]}
        return set(self.files()) == listed

    def begin(self):
        if self.path.is_dir():
            shutil.rmtree(self.path)
        elif self.path.exists():
            self.path.unlink()
        self.stamp.unlink(missing_ok=True)

    def finish(self):
        files = {str(p.relative_to(self.out)): (p.stat().st_size, sha256(p)) for p in self.files()}
        self.stamp.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.stamp.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": self.key, "files": files}, indent=1))
        os.replace(tmp, self.stamp)


# ---- safetensors writer (numpy has no bf16, so the format is written directly) ----------

def _st_bytes(arr, dtype):
    if dtype == "BF16":
        return ref.f32_to_bf16(np.asarray(arr, np.float32)).astype("<u2").tobytes()
    if dtype == "F16":
        return np.asarray(arr, np.float32).astype("<f2").tobytes()
    if dtype == "F32":
        return np.asarray(arr, np.float32).astype("<f4").tobytes()
    raise ValueError(dtype)


def write_safetensors(path, tensors, dtype):
    """tensors: {name: float array}; every tensor stored as dtype (F32, F16 or BF16)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        b = _st_bytes(tensors[name], dtype)
        header[name] = {"dtype": dtype, "shape": list(tensors[name].shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = pathlib.Path(str(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
    return off


def write_json(path, obj):
    pathlib.Path(path).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


# ---- GGUF helpers ------------------------------------------------------------------------

def copy_fields(reader, writer, skip=(), override=None):
    override = override or {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in skip:
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        val = override.get(key, f.contents())
        writer.add_key_value(key, val, vtype, sub)


def dequant(t):
    arr = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    return arr.reshape(tuple(int(s) for s in reversed(t.shape)))


def write_gguf(path, arch, reader_for_fields, tensors, field_override=None, extra_kv=None):
    """tensors: list of (name, array, raw_dtype or None)."""
    tmp = pathlib.Path(str(path) + ".tmp")
    w = gguf.GGUFWriter(str(tmp), arch)
    if extra_kv:
        for key, (val, vtype) in extra_kv.items():
            w.add_key_value(key, val, vtype)
    if reader_for_fields is not None:
        copy_fields(reader_for_fields, w, skip=tuple(extra_kv or ()), override=field_override)
    for name, arr, raw in tensors:
        if raw is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)


# ---- products ----------------------------------------------------------------------------

def make_f16_gguf(src, reader, prod):
    tensors = []
    for t in reader.tensors:
        a = dequant(t)
        tensors.append((t.name, a if a.ndim == 1 else a.astype(np.float16), None))
    write_gguf(prod.path, "llama", reader, tensors,
               field_override={"general.file_type": int(gguf.LlamaFileType.MOSTLY_F16)})


def make_q8_0_gguf(src, reader, prod):
    tensors = []
    for t in reader.tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.Q8_0:
            tensors.append((t.name, np.asarray(t.data), gguf.GGMLQuantizationType.Q8_0))
            continue
        a = dequant(t)
        if a.ndim == 1:
            tensors.append((t.name, a, None))
        else:
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            tensors.append((t.name, q, gguf.GGMLQuantizationType.Q8_0))
    write_gguf(prod.path, "llama", reader, tensors,
               field_override={"general.file_type": int(gguf.LlamaFileType.MOSTLY_Q8_0)})


def smollm2_hf_tensors(reader):
    """HF-named float32 tensors from the GGUF, Q/K rows back in HF layout."""
    n_head = SMOLLM2_CONFIG["num_attention_heads"]
    n_kv = SMOLLM2_CONFIG["num_key_value_heads"]
    out = {}
    for t in reader.tensors:
        a = dequant(t)
        if t.name == "token_embd.weight":
            out["model.embed_tokens.weight"] = a
        elif t.name == "output_norm.weight":
            out["model.norm.weight"] = a
        elif t.name == "output.weight":
            out["lm_head.weight"] = a
        else:
            _, i, rest = t.name.split(".", 2)
            if rest == "attn_q.weight":
                a = ref.unpermute_qk(a, n_head)
            elif rest == "attn_k.weight":
                a = ref.unpermute_qk(a, n_kv)
            out[f"model.layers.{i}.{GGUF_TO_HF_LAYER[rest]}"] = a
    return out


def smollm2_tokenizer_config(reader):
    tmpl = reader.fields["tokenizer.chat_template"].contents()
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": "<|im_start|>",
        "chat_template": tmpl,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": 8192,
        "pad_token": "<|im_end|>",
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": "<|endoftext|>",
        "vocab_size": 49152,
    }


GENERATION_CONFIG = {"_from_model_config": True, "bos_token_id": 1, "eos_token_id": 2,
                     "pad_token_id": 2, "transformers_version": "4.42.3"}


def write_hf_side_files(d, config, tok_json, tok_config, gen_config):
    write_json(d / "config.json", config)
    shutil.copyfile(tok_json, d / "tokenizer.json")
    write_json(d / "tokenizer_config.json", tok_config)
    write_json(d / "generation_config.json", gen_config)


def make_smollm2_hf(reader, prod, tok_json, tensors):
    d = prod.path
    d.mkdir(parents=True)
    write_safetensors(d / "model.safetensors", tensors, "BF16")
    write_hf_side_files(d, SMOLLM2_CONFIG, tok_json, smollm2_tokenizer_config(reader),
                        GENERATION_CONFIG)


def make_smollm2_hf_sharded(reader, prod, tok_json, tensors):
    d = prod.path
    d.mkdir(parents=True)
    n_layer = SMOLLM2_CONFIG["num_hidden_layers"]
    first = {k: v for k, v in tensors.items()
             if k == "model.embed_tokens.weight"
             or (k.startswith("model.layers.") and int(k.split(".")[2]) < n_layer // 2)}
    second = {k: v for k, v in tensors.items() if k not in first}
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    total = 0
    weight_map = {}
    for fn, part in zip(names, (first, second)):
        total += write_safetensors(d / fn, part, "BF16")
        weight_map.update({k: fn for k in part})
    write_json(d / "model.safetensors.index.json",
               {"metadata": {"total_size": total},
                "weight_map": dict(sorted(weight_map.items()))})
    write_hf_side_files(d, SMOLLM2_CONFIG, tok_json, smollm2_tokenizer_config(reader),
                        GENERATION_CONFIG)


# -- tiny random models --

TINY = dict(hidden=64, n_layer=2, n_head=4, n_kv=2, ffn=128, vocab=49152)


def tiny_weights(seed, head_dim, qkv_bias, qk_norm, tied, rounding):
    """HF-named float32 tensors; `rounding` maps values onto the storage grid."""
    rng = np.random.default_rng(seed)
    h, nh, nkv, ffn, V = TINY["hidden"], TINY["n_head"], TINY["n_kv"], TINY["ffn"], TINY["vocab"]

    def lin(n_out, n_in):
        return rounding(rng.standard_normal((n_out, n_in), dtype=np.float32) / np.sqrt(n_in))

    def norm(n):
        return rounding(1 + 0.1 * rng.standard_normal(n, dtype=np.float32))

    t = {"model.embed_tokens.weight": rounding(rng.standard_normal((V, h), dtype=np.float32))}
    for i in range(TINY["n_layer"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(h)
        t[p + "post_attention_layernorm.weight"] = norm(h)
        t[p + "self_attn.q_proj.weight"] = lin(nh * head_dim, h)
        t[p + "self_attn.k_proj.weight"] = lin(nkv * head_dim, h)
        t[p + "self_attn.v_proj.weight"] = lin(nkv * head_dim, h)
        t[p + "self_attn.o_proj.weight"] = lin(h, nh * head_dim)
        if qkv_bias:
            for n, rows in (("q", nh * head_dim), ("k", nkv * head_dim), ("v", nkv * head_dim)):
                t[p + f"self_attn.{n}_proj.bias"] = rounding(
                    0.1 * rng.standard_normal(rows, dtype=np.float32))
        if qk_norm:
            t[p + "self_attn.q_norm.weight"] = norm(head_dim)
            t[p + "self_attn.k_norm.weight"] = norm(head_dim)
        t[p + "mlp.gate_proj.weight"] = lin(ffn, h)
        t[p + "mlp.up_proj.weight"] = lin(ffn, h)
        t[p + "mlp.down_proj.weight"] = lin(h, ffn)
    t["model.norm.weight"] = norm(h)
    if tied:
        # tied: the embedding doubles as lm_head; keep it at the lm_head scale
        t["model.embed_tokens.weight"] = rounding(t["model.embed_tokens.weight"] * 0.4)
    else:
        t["lm_head.weight"] = rounding(0.4 * rng.standard_normal((V, h), dtype=np.float32))
    return t


def f16_grid(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


def tiny_config(arch, head_dim, tied, dtype, extra):
    archs = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}
    c = {
        "architectures": [archs[arch]],
        "model_type": arch,
        "hidden_size": TINY["hidden"],
        "intermediate_size": TINY["ffn"],
        "num_hidden_layers": TINY["n_layer"],
        "num_attention_heads": TINY["n_head"],
        "num_key_value_heads": TINY["n_kv"],
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": tied,
        "vocab_size": TINY["vocab"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": {"F32": "float32", "BF16": "bfloat16"}[dtype],
        "attention_dropout": 0.0,
        "use_cache": True,
        "transformers_version": "4.51.0",
    }
    if arch == "qwen3" or head_dim != TINY["hidden"] // TINY["n_head"]:
        c["head_dim"] = head_dim
    c.update(extra)
    return c


TINY_SPECS = {
    "qwen2-tiny": dict(arch="qwen2", seed=1002, head_dim=16, qkv_bias=True, qk_norm=False,
                       tied=False, dtype="F32", rounding=f16_grid,
                       extra={"use_sliding_window": False, "sliding_window": 4096,
                              "max_window_layers": 2}),
    "qwen3-tiny": dict(arch="qwen3", seed=1003, head_dim=32, qkv_bias=False, qk_norm=True,
                       tied=True, dtype="BF16", rounding=ref.round_bf16,
                       extra={"attention_bias": False, "use_sliding_window": False}),
    "llama3-tiny": dict(arch="llama", seed=1004, head_dim=16, qkv_bias=False, qk_norm=False,
                        tied=False, dtype="BF16", rounding=ref.round_bf16,
                        extra={"rope_theta": 500000.0, "attention_bias": False,
                               "mlp_bias": False, "max_position_embeddings": 512,
                               "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0,
                                                "original_max_position_embeddings": 64}}),
}
# The same three with head_dim 64 (4 heads x 64 over hidden 64): the CUDA attention
# kernels take head_dim 64, 96 and 128 only (tests/c/test_cuda_backend.c).
for _name in ("qwen2-tiny", "qwen3-tiny", "llama3-tiny"):
    TINY_SPECS[_name + "-hd64"] = dict(TINY_SPECS[_name], seed=TINY_SPECS[_name]["seed"] + 10,
                                       head_dim=64)


def tiny_tensors(name):
    s = TINY_SPECS[name]
    return tiny_weights(s["seed"], s["head_dim"], s["qkv_bias"], s["qk_norm"], s["tied"],
                        s["rounding"])


def make_tiny_hf(name, prod, tok_json, reader):
    s = TINY_SPECS[name]
    d = prod.path
    d.mkdir(parents=True)
    write_safetensors(d / "model.safetensors", tiny_tensors(name), s["dtype"])
    tok_cfg = smollm2_tokenizer_config(reader)
    write_hf_side_files(d, tiny_config(s["arch"], s["head_dim"], s["tied"], s["dtype"],
                                       s["extra"]),
                        tok_json, tok_cfg, {"bos_token_id": 1, "eos_token_id": 2})


def make_qwen2_tiny_gguf(prod, reader, q8_0=False):
    """qwen2-tiny/'s tensors as a GGUF: matrices F16 (exact: the values are on the fp16
    grid), or with q8_0 quantized to Q8_0 by gguf.quants.quantize (what tessera's
    --quantization q8_0 must reproduce byte for byte from qwen2-tiny/)."""
    s = TINY_SPECS["qwen2-tiny"]
    cfg = tiny_config(s["arch"], s["head_dim"], s["tied"], s["dtype"], s["extra"])
    hf = tiny_tensors("qwen2-tiny")

    def matrix(name, a):
        if not q8_0:
            return (name, a.astype(np.float16), None)
        q = gguf.quants.quantize(a.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
        return (name, q, gguf.GGMLQuantizationType.Q8_0)

    tensors = [matrix("token_embd.weight", hf["model.embed_tokens.weight"])]
    for i in range(TINY["n_layer"]):
        p = f"model.layers.{i}."
        for k, g in HF_TO_GGUF_LAYER.items():
            if p + k in hf:
                a = hf[p + k]
                tensors.append((f"blk.{i}.{g}", a, None) if a.ndim == 1 else matrix(f"blk.{i}.{g}", a))
    tensors.append(("output_norm.weight", hf["model.norm.weight"], None))
    tensors.append(matrix("output.weight", hf["lm_head.weight"]))
    ftype = gguf.LlamaFileType.MOSTLY_Q8_0 if q8_0 else gguf.LlamaFileType.MOSTLY_F16
    U32, F32, STR = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.STRING
    kv = {
        "general.type": ("model", STR),
        "general.name": ("qwen2-tiny (random weights, tessera test model)", STR),
        "general.file_type": (int(ftype), U32),
        "qwen2.block_count": (cfg["num_hidden_layers"], U32),
        "qwen2.context_length": (cfg["max_position_embeddings"], U32),
        "qwen2.embedding_length": (cfg["hidden_size"], U32),
        "qwen2.feed_forward_length": (cfg["intermediate_size"], U32),
        "qwen2.attention.head_count": (cfg["num_attention_heads"], U32),
        "qwen2.attention.head_count_kv": (cfg["num_key_value_heads"], U32),
        "qwen2.rope.freq_base": (cfg["rope_theta"], F32),
        "qwen2.attention.layer_norm_rms_epsilon": (cfg["rms_norm_eps"], F32),
    }

    class TokFields:  # the tokenizer.* fields of the source GGUF only
        fields = {k: f for k, f in reader.fields.items() if k.startswith("tokenizer.")}

    write_gguf(prod.path, "qwen2", TokFields, tensors, extra_kv=kv)


# -- tiny quantized GGUF models (every weight type tessera supports, whole forward) --

QTINY = dict(hidden=256, n_layer=2, n_head=4, n_kv=2, head_dim=64, ffn=512, vocab=49152)
QUANT_RECIPE = 1  # bump when the output of a tiny-q* product changes (its own key field)
GT = gguf.GGMLQuantizationType
QK_K = 256


def _f16(a):
    """float32 values of a rounded to fp16, and the fp16 bytes [..., 2]."""
    h = np.asarray(a, np.float32).astype(np.float16)
    return h.astype(np.float32), h.reshape(*h.shape, 1).view(np.uint8)


def _safe_div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b == 0, np.float32(0), a / np.where(b == 0, np.float32(1), b))


def quantize_q4_k(x):
    """[rows, n] float32 -> [rows, n/256*144] uint8 Q4_K blocks (ggml block_q4_K layout:
    d f16, dmin f16, 12 bytes of packed 6-bit scales/mins, 128 bytes of nibbles). Plain
    min/max per 32-element sub-block (not ggml's search): only valid blocks are needed,
    since the reference dequantizes the bytes written. Sub-block scales and mins use the
    whole 0..63 range, so the high 2 bits of scales 4..7 are exercised. Asserts the
    packing against gguf's dequantizer."""
    rows, n = x.shape
    xb = x.reshape(-1, 8, 32).astype(np.float32)
    lo = np.minimum(xb.min(-1), 0)
    scale = (xb.max(-1) - lo) / np.float32(15)
    mneg = -lo
    d, d_b = _f16(scale.max(-1) / 63)
    dmin, dmin_b = _f16(mneg.max(-1) / 63)
    sc = np.clip(np.round(_safe_div(scale, d[:, None])), 0, 63).astype(np.uint8)
    mq = np.clip(np.round(_safe_div(mneg, dmin[:, None])), 0, 63).astype(np.uint8)
    eff_s = d[:, None] * sc.astype(np.float32)
    eff_m = dmin[:, None] * mq.astype(np.float32)
    q = np.clip(np.round(_safe_div(xb + eff_m[..., None], eff_s[..., None])), 0, 15).astype(np.uint8)
    s = np.empty((q.shape[0], 12), np.uint8)
    s[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = mq[:, 0:4] | ((mq[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mq[:, 4:8] & 0x0F) << 4)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)
    blocks = np.concatenate([d_b, dmin_b, s, qs], axis=-1)
    want = (eff_s[..., None] * q.astype(np.float32) - eff_m[..., None]).reshape(rows, n)
    got = gguf.quants.dequantize(blocks, GT.Q4_K).reshape(rows, n)
    assert np.array_equal(got, want), "Q4_K packing disagrees with gguf.quants.dequantize"
    return blocks.reshape(rows, -1)


def quantize_q6_k(x):
    """[rows, n] float32 -> [rows, n/256*210] uint8 Q6_K blocks (ggml block_q6_K layout:
    ql 128 bytes of low nibbles, qh 64 bytes of 2-bit highs, 16 int8 scales, d f16). As in
    ggml, each 16-element sub-block's largest-magnitude value maps to q = -32, so scales
    are negative as often as positive and q spans -32..31. Asserts the packing against
    gguf's dequantizer."""
    rows, n = x.shape
    xb = x.reshape(-1, 16, 16).astype(np.float32)
    imax = np.abs(xb).argmax(-1)
    vmax = np.take_along_axis(xb, imax[..., None], -1)[..., 0]
    scale = -vmax / np.float32(32)
    d, d_b = _f16(np.abs(scale).max(-1) / 127)
    sc = np.clip(np.round(_safe_div(scale, d[:, None])), -128, 127).astype(np.int8)
    eff = d[:, None] * sc.astype(np.float32)
    q = np.clip(np.round(_safe_div(xb, eff[..., None])), -32, 31).astype(np.int16)
    u = (q + 32).astype(np.uint8).reshape(-1, 2, 128)      # two halves of 128
    low, high = u & 0x0F, u >> 4
    ql = (low[:, :, :64] | (low[:, :, 64:] << 4)).reshape(-1, 128)
    hr = high.reshape(-1, 2, 4, 32)
    qh = (hr[:, :, 0] | (hr[:, :, 1] << 2) | (hr[:, :, 2] << 4) | (hr[:, :, 3] << 6)).reshape(-1, 64)
    blocks = np.concatenate([ql, qh, sc.view(np.uint8), d_b], axis=-1)
    want = (eff[..., None] * q.astype(np.float32)).reshape(rows, n)
    got = gguf.quants.dequantize(blocks, GT.Q6_K).reshape(rows, n)
    assert np.array_equal(got, want), "Q6_K packing disagrees with gguf.quants.dequantize"
    assert (q == -32).any() and (sc < 0).any() and (sc > 0).any()
    return blocks.reshape(rows, -1)


def quantize_as(a, qtype):
    """(array, raw_dtype or None) for GGUFWriter.add_tensor."""
    a = np.ascontiguousarray(a, np.float32)
    if qtype == GT.F32:
        return a, None
    if qtype == GT.F16:
        return a.astype(np.float16), None
    if qtype == GT.Q4_K:
        return quantize_q4_k(a), qtype
    if qtype == GT.Q6_K:
        return quantize_q6_k(a), qtype
    return gguf.quants.quantize(a, qtype), qtype


def qtiny_weights(seed, qkv_bias, tied):
    """HF-named float32 tensors for a QTINY model (scales as tiny_weights; the embedding /
    lm_head is N(0, 0.25^2) so logits spread over a few units with hidden 256)."""
    rng = np.random.default_rng(seed)
    h, nh, nkv, hd, ffn, V = (QTINY[k] for k in ("hidden", "n_head", "n_kv", "head_dim",
                                                  "ffn", "vocab"))

    def lin(n_out, n_in):
        return rng.standard_normal((n_out, n_in), dtype=np.float32) / np.float32(np.sqrt(n_in))

    def norm(n):
        return 1 + np.float32(0.1) * rng.standard_normal(n, dtype=np.float32)

    t = {"model.embed_tokens.weight": np.float32(0.25) * rng.standard_normal((V, h), dtype=np.float32)}
    for i in range(QTINY["n_layer"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(h)
        t[p + "post_attention_layernorm.weight"] = norm(h)
        t[p + "self_attn.q_proj.weight"] = lin(nh * hd, h)
        t[p + "self_attn.k_proj.weight"] = lin(nkv * hd, h)
        t[p + "self_attn.v_proj.weight"] = lin(nkv * hd, h)
        t[p + "self_attn.o_proj.weight"] = lin(h, nh * hd)
        if qkv_bias:
            for n, r in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
                t[p + f"self_attn.{n}_proj.bias"] = np.float32(0.1) * rng.standard_normal(r, dtype=np.float32)
        t[p + "mlp.gate_proj.weight"] = lin(ffn, h)
        t[p + "mlp.up_proj.weight"] = lin(ffn, h)
        t[p + "mlp.down_proj.weight"] = lin(h, ffn)
    t["model.norm.weight"] = norm(h)
    if not tied:
        t["lm_head.weight"] = np.float32(0.25) * rng.standard_normal((V, h), dtype=np.float32)
    return t


# Per model: arch (llama: Q/K rows permuted as llama.cpp's converter does; qwen2: q/k/v
# bias, no permutation), the default matrix type, the token_embd type (tied models use it
# as lm_head too), an untied output type, per-tensor overrides (GGUF name -> type).
_Q4KM_LAYERS = {
    # like llama.cpp's Q4_K_M: Q4_K attention/gate/up, Q6_K ffn_down and (layer 0) attn_v.
    # Layer 1 mixes activation formats inside the fused q/k/v and gate/up matmuls (Q8_0
    # attn_v next to Q4_K q/k; Q4_0 ffn_up next to a Q4_K gate).
    "blk.0.attn_v.weight": GT.Q6_K, "blk.0.ffn_down.weight": GT.Q6_K,
    "blk.1.attn_v.weight": GT.Q8_0, "blk.1.ffn_up.weight": GT.Q4_0,
    "blk.1.ffn_down.weight": GT.Q6_K,
}
QTINY_SPECS = {
    "tiny-q4_0.gguf": dict(arch="llama", seed=2001, mat=GT.Q4_0, embd=GT.Q4_0, out=None,
                           ftype=gguf.LlamaFileType.MOSTLY_Q4_0),
    "tiny-q5_0.gguf": dict(arch="qwen2", seed=2002, mat=GT.Q5_0, embd=GT.Q5_0, out=None,
                           ftype=gguf.LlamaFileType.MOSTLY_Q5_0),
    "tiny-q5_1.gguf": dict(arch="llama", seed=2003, mat=GT.Q5_1, embd=GT.Q5_1, out=None,
                           ftype=gguf.LlamaFileType.MOSTLY_Q5_1),
    "tiny-q4_k.gguf": dict(arch="qwen2", seed=2004, mat=GT.Q4_K, embd=GT.Q4_K, out=None,
                           ftype=gguf.LlamaFileType.MOSTLY_Q4_K_M),
    "tiny-q6_k.gguf": dict(arch="llama", seed=2005, mat=GT.Q6_K, embd=GT.Q6_K, out=None,
                           ftype=gguf.LlamaFileType.MOSTLY_Q6_K),
    "tiny-mixed.gguf": dict(arch="llama", seed=2006, mat=GT.Q4_K, embd=GT.Q4_K, out=GT.Q8_0,
                            over=_Q4KM_LAYERS, ftype=gguf.LlamaFileType.MOSTLY_Q4_K_M),
}


def make_qtiny_gguf(name, prod, reader):
    s = QTINY_SPECS[name]
    arch, over = s["arch"], s.get("over", {})
    nh, nkv = QTINY["n_head"], QTINY["n_kv"]
    hf = qtiny_weights(s["seed"], qkv_bias=arch == "qwen2", tied=s["out"] is None)
    tensors = [("token_embd.weight", *quantize_as(hf["model.embed_tokens.weight"], s["embd"]))]
    for i in range(QTINY["n_layer"]):
        p = f"model.layers.{i}."
        for k, g in HF_TO_GGUF_LAYER.items():
            if p + k not in hf:
                continue
            a = hf[p + k]
            gname = f"blk.{i}.{g}"
            if a.ndim == 1:
                tensors.append((gname, a, None))
                continue
            if arch == "llama" and g == "attn_q.weight":
                a = ref.permute_qk(a, nh)
            elif arch == "llama" and g == "attn_k.weight":
                a = ref.permute_qk(a, nkv)
            tensors.append((gname, *quantize_as(a, over.get(gname, s["mat"]))))
    tensors.append(("output_norm.weight", hf["model.norm.weight"], None))
    if s["out"] is not None:
        tensors.append(("output.weight", *quantize_as(hf["lm_head.weight"], s["out"])))
    U32, F32, STR = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.STRING
    kv = {
        "general.type": ("model", STR),
        "general.name": (f"{name[:-5]} (random weights, tessera test model)", STR),
        "general.file_type": (int(s["ftype"]), U32),
        f"{arch}.block_count": (QTINY["n_layer"], U32),
        f"{arch}.context_length": (4096, U32),
        f"{arch}.embedding_length": (QTINY["hidden"], U32),
        f"{arch}.feed_forward_length": (QTINY["ffn"], U32),
        f"{arch}.attention.head_count": (nh, U32),
        f"{arch}.attention.head_count_kv": (nkv, U32),
        f"{arch}.rope.dimension_count": (QTINY["head_dim"], U32),
        f"{arch}.rope.freq_base": (10000.0 if arch == "llama" else 1000000.0, F32),
        f"{arch}.attention.layer_norm_rms_epsilon": (1e-5 if arch == "llama" else 1e-6, F32),
    }

    class TokFields:  # the tokenizer.* fields of the source GGUF only
        fields = {k: f for k, f in reader.fields.items() if k.startswith("tokenizer.")}

    write_gguf(prod.path, arch, TokFields, tensors, extra_kv=kv)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "build" / "testmodels"))
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--verify", action="store_true", help="rehash existing outputs")
    ap.add_argument("--only", nargs="*", help="product names to (re)make")
    args = ap.parse_args()
    src = pathlib.Path(args.model)
    if not src.exists():
        sys.exit(f"make-test-models: {src} missing (run make model)")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    st = src.stat()
    key = {"source": src.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}

    names = ["smollm2-f16.gguf", "smollm2-q8_0.gguf", "smollm2-hf", "smollm2-hf-sharded",
             "qwen2-tiny", "qwen2-tiny.gguf", "qwen2-tiny-q8_0.gguf", "qwen3-tiny", "llama3-tiny",
             "qwen2-tiny-hd64", "qwen3-tiny-hd64", "llama3-tiny-hd64", *QTINY_SPECS]
    if args.only:
        names = [n for n in names if n in args.only]
    prods = {n: Product(out, n, dict(key, quant_recipe=QUANT_RECIPE) if n in QTINY_SPECS else key)
             for n in names}
    todo = [n for n in names if not prods[n].up_to_date(args.verify)]
    if not todo:
        log(f"all {len(names)} test models up to date in {out}")
        return 0

    reader = gguf.GGUFReader(str(src))
    tok_json = out / ".stamps" / "smollm2-tokenizer.json"
    tok_json.parent.mkdir(parents=True, exist_ok=True)
    if not tok_json.exists() or tok_json.stat().st_mtime_ns < st.st_mtime_ns:
        from gguf_tokenizer import write_tokenizer_json
        write_tokenizer_json(src, tok_json)
    hf_tensors = None
    for n in todo:
        t0 = time.time()
        p = prods[n]
        p.begin()
        if n == "smollm2-f16.gguf":
            make_f16_gguf(src, reader, p)
        elif n == "smollm2-q8_0.gguf":
            make_q8_0_gguf(src, reader, p)
        elif n in ("smollm2-hf", "smollm2-hf-sharded"):
            if hf_tensors is None:
                hf_tensors = smollm2_hf_tensors(reader)
            (make_smollm2_hf if n == "smollm2-hf" else make_smollm2_hf_sharded)(
                reader, p, tok_json, hf_tensors)
        elif n in ("qwen2-tiny.gguf", "qwen2-tiny-q8_0.gguf"):
            make_qwen2_tiny_gguf(p, reader, q8_0=n.endswith("q8_0.gguf"))
        elif n in QTINY_SPECS:
            make_qtiny_gguf(n, p, reader)
        else:
            make_tiny_hf(n, p, tok_json, reader)
        p.finish()
        log(f"made {n} in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Malformed model inputs through `tessera generate` and `tessera logits`: each must exit
1 with one message naming the file and the offending key or tensor, and never crash.

The damaged models are built in tmp_path from the tiny test models (qwen2-tiny.gguf,
14 MB; qwen3-tiny/, 6 MB) by patching bytes at offsets found with gguf.GGUFReader, or by
rewriting one file of an HF directory whose other files are symlinked. A subset also
runs under the ASan/UBSan binary (build-asan/tessera) when it exists; build it with
  make BUILD=build-asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer" build-asan/tessera
"""
import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys

import gguf
import pytest

from conftest import BUILD, ROOT, TEST_MODELS

TINY_GGUF = TEST_MODELS / "qwen2-tiny.gguf"
TINY_HF = TEST_MODELS / "qwen3-tiny"
ASAN_BIN = ROOT / "build-asan" / "tessera"


@pytest.fixture(scope="module")
def bases():
    if not (TINY_GGUF.exists() and TINY_HF.is_dir()):
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make-test-models.py"),
                        "--out", str(TEST_MODELS)], check=True, timeout=300)
    assert TINY_GGUF.exists() and (TINY_HF / "model.safetensors").exists()
    return TINY_GGUF, TINY_HF


def run(bin_, cmd, model, tmp):
    if cmd == "generate":
        args = [str(bin_), "generate", "--model", str(model), "--prompt", "hi", "--max-tokens", "2",
                "--threads", "2"]
    else:
        args = [str(bin_), "logits", "--model", str(model), "--tokens", "1,2", "--threads", "2",
                "--out", str(tmp / "logits.bin")]
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    return subprocess.run(args, capture_output=True, timeout=60, env=env)


def assert_clean_failure(r, *words):
    """Exit 1 (not a signal, not a sanitizer report), nothing on stdout, one message line
    holding every word."""
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 1, f"exit {r.returncode}: {err[-3000:]}"
    assert "Sanitizer" not in err and "runtime error" not in err, err[-3000:]
    assert r.stdout == b""
    lines = [ln for ln in err.splitlines() if ln and not ln.startswith("model:")]
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], (w, lines[0])


# --- GGUF --------------------------------------------------------------------------------

def _gguf_cases(src):
    """name -> (bytes, words the message must hold besides the file name)."""
    data = src.read_bytes()
    r = gguf.GGUFReader(src)
    tensors = r.tensors
    q = tensors[3]  # blk.0.attn_q.weight (2-D)

    def tinfo(t):  # offset of n_dims in t's tensor info
        return t.field.offset + 8 + len(t.name.encode())

    def value_at(key):  # offset of a scalar kv's value
        return r.fields[key].offset + 8 + len(key) + 4

    def patched(fmt, off, val):
        b = bytearray(data)
        struct.pack_into(fmt, b, off, val)
        return bytes(b)

    type_off = tinfo(q) + 4 + 8 * len(q.shape)
    last = tensors[-1]
    return {
        "cut_in_magic": (data[:3], ["GGUF"]),
        "cut_in_header": (data[:10], ["truncated", "header"]),
        "cut_in_kv_key": (data[:r.fields["tokenizer.ggml.bos_token_id"].offset + 20], ["key"]),
        "cut_in_kv_array": (data[:r.fields["tokenizer.ggml.merges"].offset + 5000],
                            ["tokenizer.ggml.merges"]),
        "cut_in_tensor_infos": (data[:tensors[5].field.offset + 10], ["tensor"]),
        "cut_in_first_tensor": (data[:r.data_offset + 1000], [tensors[0].name, "past the end"]),
        "cut_in_last_tensor": (data[:len(data) - 100], [last.name, "past the end"]),
        "unsupported_type": (patched("<I", type_off, 99), [q.name, "type 99", "not supported"]),
        "type_out_of_enum": (patched("<I", type_off, 0xFFFFFFFF), [q.name, "not supported"]),
        "embedding_length": (patched("<I", value_at("qwen2.embedding_length"), 128),
                             [tensors[0].name, "[64, 49152]", "[128, 49152]"]),
        "head_count_0": (patched("<I", value_at("qwen2.attention.head_count"), 0),
                         ["qwen2.attention.head_count"]),
        "block_count_more": (patched("<I", value_at("qwen2.block_count"), 5),
                             ["missing tensor", "blk.2."]),
        "n_dims_200": (patched("<I", tinfo(q), 200), [q.name, "n_dims"]),
        "dim_overflow": (patched("<Q", tinfo(q) + 4, 1 << 62), [q.name, "overflow"]),
        "dim_zero": (patched("<Q", tinfo(q) + 4, 0), [q.name]),
        "offset_misaligned": (patched("<Q", type_off + 4, q.data_offset - r.data_offset + 3),
                              [q.name, "alignment"]),
        "offset_wraps": (patched("<Q", type_off + 4, (1 << 64) - 64), [q.name, "past the end"]),
        "version_99": (patched("<I", 4, 99), ["version 99"]),
        "tensor_count_huge": (patched("<Q", 8, 1 << 40), ["tensor_count"]),
        "kv_count_huge": (patched("<Q", 16, 1 << 40), ["kv_count"]),
        "key_length_huge": (patched("<Q", r.fields["general.name"].offset, 1 << 62), ["key"]),
        "array_count_huge": (patched("<Q", r.fields["tokenizer.ggml.tokens"].offset + 8 +
                                     len("tokenizer.ggml.tokens") + 8, 1 << 60),
                             ["tokenizer.ggml.tokens"]),
    }


@pytest.fixture(scope="module")
def gguf_cases(bases, tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    out = {}
    for name, (blob, words) in _gguf_cases(bases[0]).items():
        p = d / f"{name}.gguf"
        p.write_bytes(blob)
        out[name] = (p, words)
    return out


GGUF_NAMES = ["cut_in_magic", "cut_in_header", "cut_in_kv_key", "cut_in_kv_array",
              "cut_in_tensor_infos", "cut_in_first_tensor", "cut_in_last_tensor",
              "unsupported_type", "type_out_of_enum", "embedding_length", "head_count_0",
              "block_count_more", "n_dims_200", "dim_overflow", "dim_zero", "offset_misaligned",
              "offset_wraps", "version_99", "tensor_count_huge", "kv_count_huge",
              "key_length_huge", "array_count_huge"]


@pytest.mark.parametrize("cmd", ["generate", "logits"])
@pytest.mark.parametrize("name", GGUF_NAMES)
def test_malformed_gguf(tessera_bin, gguf_cases, tmp_path, name, cmd):
    path, words = gguf_cases[name]
    r = run(tessera_bin, cmd, path, tmp_path)
    assert_clean_failure(r, str(path), *words)


def test_the_base_gguf_loads(tessera_bin, bases, tmp_path):
    # the cases above fail because of the damage, not because the base is broken
    for cmd in ("generate", "logits"):
        r = run(tessera_bin, cmd, bases[0], tmp_path)
        assert r.returncode == 0, r.stderr


def test_missing_file(tessera_bin, tmp_path):
    for cmd in ("generate", "logits"):
        p = tmp_path / "no-such-model.gguf"
        r = run(tessera_bin, cmd, p, tmp_path)
        assert_clean_failure(r, str(p))


def test_gguf_bos_id_outside_vocab_names_the_file(tessera_bin, bases, tmp_path):
    src = bases[0]
    r_ = gguf.GGUFReader(src)
    key = "tokenizer.ggml.bos_token_id"
    b = bytearray(src.read_bytes())
    struct.pack_into("<I", b, r_.fields[key].offset + 8 + len(key) + 4, 10 ** 9)
    p = tmp_path / "bos.gguf"
    p.write_bytes(b)
    r = run(tessera_bin, "generate", p, tmp_path)
    assert_clean_failure(r, key, "1000000000", str(p))


# --- Hugging Face directories ------------------------------------------------------------

def _hf_copy(src, dst, replace):
    """dst: src's files symlinked, except those in replace (name -> bytes, or None to drop)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name not in replace:
            os.symlink(f.resolve(), dst / f.name)
    for name, blob in replace.items():
        if blob is not None:
            (dst / name).write_bytes(blob)
    return dst


def _safetensors_with(src, edit):
    raw = (src / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    edit(hdr)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + raw[8 + n:]


UP = "model.layers.0.mlp.up_proj.weight"
DOWN1 = "model.layers.1.mlp.down_proj.weight"


def _hf_cases(src):
    """name -> (files to replace, file the message names relative to the dir or '', words)."""
    cfg = json.loads((src / "config.json").read_text())
    raw = (src / "model.safetensors").read_bytes()

    def config(**kw):
        c = dict(cfg)
        c.update(kw)
        return json.dumps(c).encode()

    def set_(k, field, v):
        def f(h):
            h[k][field] = v
        return f

    return {
        "no_config": ({"config.json": None}, "config.json", ["not found"]),
        "config_not_json": ({"config.json": b'{"hidden_size": 64,'}, "config.json", ["JSON"]),
        "hidden_size_128": ({"config.json": config(hidden_size=128)}, "",
                            ["model.embed_tokens.weight", "[64, 49152]", "[128, 49152]"]),
        "heads_0": ({"config.json": config(num_attention_heads=0)}, "", ["num_attention_heads"]),
        "hidden_size_string": ({"config.json": config(hidden_size="64")}, "", ["hidden_size"]),
        "unknown_arch": ({"config.json": config(architectures=["FooForCausalLM"], model_type="foo")},
                         "", ["FooForCausalLM"]),
        "missing_tensor": ({"model.safetensors": _safetensors_with(src, lambda h: h.pop(DOWN1))},
                           "", ["missing tensor", DOWN1]),
        "header_past_eof": ({"model.safetensors": struct.pack("<Q", len(raw) + 1000) + raw[8:]},
                            "model.safetensors", ["header length", "past the end"]),
        "header_not_json": ({"model.safetensors": struct.pack("<Q", 16) + b'{"a": [1,2,3    ' + raw[8:]},
                            "model.safetensors", ["JSON"]),
        "empty_safetensors": ({"model.safetensors": b""}, "model.safetensors", []),
        "data_offsets_past_end": ({"model.safetensors": _safetensors_with(
                                   src, lambda h: h[UP]["data_offsets"].__setitem__(1, 10 ** 9))},
                                  "model.safetensors", [UP, "data_offsets"]),
        "data_offsets_reversed": ({"model.safetensors": _safetensors_with(
                                   src, lambda h: h[UP].__setitem__("data_offsets", h[UP]["data_offsets"][::-1]))},
                                  "model.safetensors", [UP]),
        "unknown_dtype": ({"model.safetensors": _safetensors_with(src, set_(UP, "dtype", "F8_E9M9"))},
                          "model.safetensors", [UP, "F8_E9M9"]),
        "shape_vs_bytes": ({"model.safetensors": _safetensors_with(
                            src, lambda h: h[UP].__setitem__("shape", [h[UP]["shape"][0], 2 * h[UP]["shape"][1]]))},
                           "model.safetensors", [UP]),
        "tokenizer_not_json": ({"tokenizer.json": b'{"version": "1.0", "model": [oops'},
                               "tokenizer.json", ["JSON"]),
        "tokenizer_config_not_json": ({"tokenizer_config.json": b"nope"}, "tokenizer_config.json", ["JSON"]),
    }


@pytest.fixture(scope="module")
def hf_cases(bases, tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for name, (replace, file, words) in _hf_cases(bases[1]).items():
        d = _hf_copy(bases[1], root / name, replace)
        out[name] = (d, str(d / file) if file else str(d), words)
    return out


HF_NAMES = ["no_config", "config_not_json", "hidden_size_128", "heads_0", "hidden_size_string",
            "unknown_arch", "missing_tensor", "header_past_eof", "header_not_json",
            "empty_safetensors", "data_offsets_past_end", "data_offsets_reversed", "unknown_dtype",
            "shape_vs_bytes", "tokenizer_not_json", "tokenizer_config_not_json"]
# tokenizer.json is not read by `logits` (MODEL_LOAD_NO_TOKENIZER); tokenizer_config.json is
TOKENIZER_ONLY = {"tokenizer_not_json"}


@pytest.mark.parametrize("cmd", ["generate", "logits"])
@pytest.mark.parametrize("name", HF_NAMES)
def test_malformed_hf_dir(tessera_bin, hf_cases, tmp_path, name, cmd):
    d, named, words = hf_cases[name]
    r = run(tessera_bin, cmd, d, tmp_path)
    if cmd == "logits" and name in TOKENIZER_ONLY:
        assert r.returncode == 0, r.stderr
        return
    assert_clean_failure(r, named, *words)


def test_empty_directory(tessera_bin, tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    r = run(tessera_bin, "generate", d, tmp_path)
    assert_clean_failure(r, str(d / "config.json"))


# --- under the sanitizers -------------------------------------------------------------------

ASAN_GGUF = ["cut_in_header", "cut_in_tensor_infos", "cut_in_first_tensor", "cut_in_last_tensor",
             "unsupported_type", "embedding_length", "dim_overflow", "offset_wraps",
             "array_count_huge", "key_length_huge"]
ASAN_HF = ["hidden_size_128", "missing_tensor", "header_past_eof", "header_not_json",
           "data_offsets_past_end", "tokenizer_not_json"]


@pytest.fixture(scope="module")
def asan_bin():
    if not ASAN_BIN.exists():
        pytest.skip(f"{ASAN_BIN} not built (see this file's docstring)")
    return ASAN_BIN


@pytest.mark.parametrize("name", ASAN_GGUF)
def test_malformed_gguf_under_asan(asan_bin, gguf_cases, tmp_path, name):
    path, words = gguf_cases[name]
    assert_clean_failure(run(asan_bin, "generate", path, tmp_path), str(path), *words)


@pytest.mark.parametrize("name", ASAN_HF)
def test_malformed_hf_dir_under_asan(asan_bin, hf_cases, tmp_path, name):
    d, named, words = hf_cases[name]
    assert_clean_failure(run(asan_bin, "generate", d, tmp_path), named, *words)

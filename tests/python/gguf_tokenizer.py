"""Builds the Hugging Face `tokenizers.Tokenizer` equivalent to the tokenizer stored in a
GGUF file's metadata (tokenizer.ggml.*), independently of tessera's C loader, so tests
can compare build/tessera against the reference implementation and other scripts can
write a tokenizer.json next to a model converted from GGUF; and the reverse, a GGUF
written from a tokenizer.json as llama.cpp's converter writes it.

    hf_tokenizer_from_gguf(path) -> tokenizers.Tokenizer
    write_tokenizer_json(gguf_path, out_path)
    write_gguf_from_json(json_path, out_path, pre)   (byte-level BPE only)
    write_gguf_from_spm_model(model_path, out_path)  (a SentencePiece .model)

Token types (llama.cpp): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
6 byte. Unknown, control and user-defined tokens become added tokens (never split,
matched before pre-tokenization); unknown and control ones are flagged special.

Model "gpt2" (byte-level BPE): tokenizer.ggml.pre selects the normalizer, pre-tokenizer
and ignore_merges of that model family's tokenizer.json (PRE_TOKENIZERS; the same table
is in src/tokenizer/load_gguf.c). Each entry is checked against llama.cpp's test vectors
(the ids Hugging Face gives with the model's real tokenizer.json) by
tests/python/test_tokenizer_vocabs.py.

Model "llama" (SentencePiece BPE: Llama 2, Mistral, Phi-3, Gemma): what transformers'
LlamaConverter writes for these models: BPE with merges derived from the scores
(SentencePieceExtractor), byte_fallback, fuse_unk, normalizer Prepend("▁") (unless
tokenizer.ggml.add_space_prefix is false) + Replace(" ", "▁"), no pre-tokenizer, decoder
Replace("▁", " ") + ByteFallback + Fuse + Strip(" ", 1, 0).
"""
import json
import pathlib
import struct

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors

# The GPT-2 pattern ByteLevel(use_regex=True) applies.
GPT2_REGEX = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
                r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_CODER_REGEXES = ["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+"]
DEEPSEEK_LLM_REGEXES = [
    "[\r\n]",
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-"
    "\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-"
    "\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5"
    "\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00"
    "-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-"
    "\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-"
    "\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-"
    "\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149"
    "\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13"
    "-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
]
DEEPSEEK_V3_REGEXES = [
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]


def _splits_then_bytelevel(regexes, digits=False):
    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in regexes]
    if digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)


def _bytelevel(digits=False):
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    return pre_tokenizers.Sequence(steps) if digits else steps[0]


def _falcon():
    # tiiuae/falcon-7b's tokenizer.json
    return pre_tokenizers.Sequence([
        pre_tokenizers.Punctuation(behavior="contiguous"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.Split(Regex("[0-9][0-9][0-9]"), behavior="isolated", invert=False),
    ])


# tokenizer.ggml.pre -> (pre_tokenizer factory, NFC normalizer?, ignore_merges)
PRE_TOKENIZERS = {
    **{n: (lambda: _bytelevel(), False, False) for n in ("gpt-2", "gpt2", "default", "phi-2")},
    "mpt": (lambda: _bytelevel(), True, False),  # GPT-NeoX's tokenizer: NFC
    **{n: (lambda: _bytelevel(digits=True), False, False) for n in ("smollm", "starcoder", "refact")},
    "command-r": (lambda: _bytelevel(digits=True), True, False),
    # Llama 3's tokenizer.json has ignore_merges: true (llama.cpp sets it by pre as well)
    **{n: (lambda: _splits_then_bytelevel([LLAMA3_REGEX]), False, True) for n in ("llama-bpe", "llama3", "llama-v3")},
    # Qwen2/2.5/3 tokenizer.json files carry an NFC normalizer; Qwen3.5's has none
    **{n: (lambda: _splits_then_bytelevel([QWEN2_REGEX]), True, False) for n in ("qwen2", "deepseek-r1-qwen")},
    "qwen35": (lambda: _splits_then_bytelevel([QWEN35_REGEX]), False, False),
    "deepseek-llm": (lambda: _splits_then_bytelevel(DEEPSEEK_LLM_REGEXES), False, False),
    "deepseek-coder": (lambda: _splits_then_bytelevel(DEEPSEEK_CODER_REGEXES, digits=True), False, False),
    "deepseek-v3": (lambda: _splits_then_bytelevel(DEEPSEEK_V3_REGEXES), False, False),
    "falcon": (_falcon, False, False),
}


def _pre_tokenizer(pre):
    """tokenizer.ggml.pre -> (pre_tokenizer, normalizer or None, ignore_merges)."""
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"unsupported tokenizer.ggml.pre {pre!r}")
    make, nfc, ignore_merges = PRE_TOKENIZERS[pre]
    return make(), (normalizers.NFC() if nfc else None), ignore_merges


def spm_merges(tokens, scores):
    """Merges from SentencePiece scores, as transformers' SentencePieceExtractor derives
    them: every split of a piece into two pieces, ordered by the piece's score (higher
    first), then its id, then the left and right ids."""
    vocab = {t: i for i, t in enumerate(tokens)}
    cand = []
    for i, piece in enumerate(tokens):
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                cand.append((-float(scores[i]), i, vocab[left], vocab[right], left, right))
    cand.sort(key=lambda c: c[:4])
    return [(c[4], c[5]) for c in cand]


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_kv(path):
    """The metadata key/value pairs of a GGUF file (v2/v3, little-endian) as Python values.
    Written here because gguf.GGUFReader takes ~30 s on a 280k-entry merges array."""
    data = pathlib.Path(path).read_bytes()
    if data[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    pos = 24  # magic, version u32, n_tensors u64, then n_kv u64

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("<Q")
        pos += n
        return data[pos - n:pos].decode("utf-8")

    def value(ty):
        if ty == 8:
            return string()
        if ty == 9:
            ety, n = take("<I"), take("<Q")
            return [value(ety) for _ in range(n)]
        return take(_SCALARS[ty])

    n_kv = struct.unpack_from("<Q", data, 16)[0]
    kv = {}
    for _ in range(n_kv):
        key = string()
        kv[key] = value(take("<I"))
    return kv


def _field(reader, key, default=None):
    return reader.get(key, default)


def hf_tokenizer_from_gguf(path):
    """Returns a tokenizers.Tokenizer equivalent to the GGUF file's tokenizer.ggml.*."""
    r = read_gguf_kv(path)
    model = _field(r, "tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise ValueError(f"{path}: tokenizer.ggml.model {model!r} is neither 'gpt2' nor 'llama'")
    tokens = list(_field(r, "tokenizer.ggml.tokens"))
    types = list(_field(r, "tokenizer.ggml.token_type", [1] * len(tokens)))
    bos = _field(r, "tokenizer.ggml.bos_token_id")
    vocab = {t: i for i, t in enumerate(tokens)}
    if model == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in _field(r, "tokenizer.ggml.merges", [])]
        pre = _field(r, "tokenizer.ggml.pre", "default")
        pre_tok, norm, ignore_merges = _pre_tokenizer(pre)
        # llama.cpp's default when the key is absent: BOS for the Llama 3 family
        add_bos = bool(_field(r, "tokenizer.ggml.add_bos_token", pre in ("llama-bpe", "llama3", "llama-v3")))
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
                                   ignore_merges=ignore_merges))
        if norm is not None:
            tok.normalizer = norm
        tok.pre_tokenizer = pre_tok
        tok.decoder = decoders.ByteLevel()
        post = [processors.ByteLevel(trim_offsets=False)]
    else:
        scores = list(_field(r, "tokenizer.ggml.scores"))
        unk = _field(r, "tokenizer.ggml.unknown_token_id")
        if unk is None:
            unk = next((i for i, ty in enumerate(types) if int(ty) == 2), None)
        prefix = bool(_field(r, "tokenizer.ggml.add_space_prefix", True))
        add_bos = bool(_field(r, "tokenizer.ggml.add_bos_token", True))
        tok = Tokenizer(models.BPE(vocab=vocab, merges=spm_merges(tokens, scores), fuse_unk=True,
                                   byte_fallback=True, unk_token=None if unk is None else tokens[int(unk)]))
        steps = [normalizers.Prepend("▁")] if prefix else []
        tok.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "▁")])
        dec = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        tok.decoder = decoders.Sequence(dec + ([decoders.Strip(" ", 1, 0)] if prefix else []))
        post = []
    if add_bos and bos is not None and 0 <= int(bos) < len(tokens):
        b = tokens[int(bos)]
        post.append(processors.TemplateProcessing(single=f"{b} $A", pair=f"{b} $A {b} $B",
                                                  special_tokens=[(b, int(bos))]))
    tok.post_processor = processors.Sequence(post) if len(post) > 1 else (post[0] if post else None)
    # unknown, control -> special; user-defined -> added but not special (matched even
    # when special tokens are not parsed), as convert_hf_to_gguf.py assigns the types
    # (add_special_tokens would make every token it gets special)
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, ty in enumerate(types) if int(ty) in (2, 3)])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                    for i, ty in enumerate(types) if int(ty) == 4])
    return tok


def write_gguf_from_json(json_path, out, pre, add_bos=False):
    """A metadata-only GGUF holding a byte-level tokenizer.json's vocab/merges with the
    given tokenizer.ggml.pre, typed as convert_hf_to_gguf.py types them (added special ->
    control, other added -> user-defined, holes -> unused [PADn])."""
    d = json.loads(pathlib.Path(json_path).read_text(encoding="utf-8"))
    vocab = d["model"]["vocab"]
    n = max(max(vocab.values()), max(a["id"] for a in d["added_tokens"])) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [5] * n
    for s, i in vocab.items():
        tokens[i] = s
        types[i] = 1
    for a in d["added_tokens"]:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = 3 if a["special"] else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in d["model"]["merges"]]
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def write_tokenizer_json(gguf_path, out_path):
    """Writes the Hugging Face tokenizer.json equivalent to the GGUF tokenizer."""
    tok = hf_tokenizer_from_gguf(gguf_path)
    out_path = pathlib.Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_path), pretty=False)
    # Sanity: the written file loads and round-trips.
    json.loads(out_path.read_text(encoding="utf-8"))
    return out_path


if __name__ == "__main__":
    import sys
    if len(sys.argv) != 3:
        sys.exit("usage: gguf_tokenizer.py MODEL.gguf OUT/tokenizer.json")
    write_tokenizer_json(sys.argv[1], sys.argv[2])


def _proto_fields(b):
    """(field number, wire type, value) of one protobuf message."""
    i = 0

    def varint():
        nonlocal i
        r = shift = 0
        while True:
            c = b[i]
            i += 1
            r |= (c & 0x7F) << shift
            shift += 7
            if c < 0x80:
                return r
    while i < len(b):
        key = varint()
        wt = key & 7
        if wt == 0:
            v = varint()
        elif wt in (1, 5):
            n = 8 if wt == 1 else 4
            v, i = b[i:i + n], i + n
        elif wt == 2:
            n = varint()
            v, i = b[i:i + n], i + n
        else:
            raise ValueError(f"protobuf wire type {wt}")
        yield key >> 3, wt, v


def read_spm_model(path):
    """A SentencePiece ModelProto without the protobuf package: ([(piece, score, type)],
    add_dummy_prefix). Types are SentencePiece's, which GGUF's token_type reuses (1 normal,
    2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)."""
    pieces, add_dummy_prefix = [], True
    for f, _, v in _proto_fields(pathlib.Path(path).read_bytes()):
        if f == 1:  # SentencePiece {1: piece, 2: score, 3: type}
            p = {1: b"", 2: 0.0, 3: 1}
            for g, _, w in _proto_fields(v):
                p[g] = struct.unpack("<f", w)[0] if g == 2 else w
            pieces.append((p[1].decode("utf-8"), p[2], p[3]))
        elif f == 3:  # NormalizerSpec {3: add_dummy_prefix}
            add_dummy_prefix = bool(dict((g, w) for g, _, w in _proto_fields(v)).get(3, 1))
    return pieces, add_dummy_prefix


def write_gguf_from_spm_model(model_path, out):
    """A metadata-only GGUF of a SentencePiece model as llama.cpp's converter writes one
    (tokenizer.ggml.model "llama": pieces, scores, types; <unk> 0, <s> 1, </s> 2), except
    that user-defined pieces keep their type (llama.cpp's converter types them normal),
    so that they are matched whole as SentencePiece matches them."""
    pieces, add_dummy_prefix = read_spm_model(model_path)
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list([p[0] for p in pieces])
    w.add_token_scores([p[1] for p in pieces])
    w.add_token_types([p[2] for p in pieces])
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(add_dummy_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out

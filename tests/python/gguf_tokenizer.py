"""Builds the Hugging Face `tokenizers.Tokenizer` equivalent to the tokenizer stored in a
GGUF file's metadata (tokenizer.ggml.*, model "gpt2"), independently of tessera's C
loader, so tests can compare build/tessera against the reference implementation and
other scripts can write a tokenizer.json next to a model converted from GGUF.

    hf_tokenizer_from_gguf(path) -> tokenizers.Tokenizer
    write_tokenizer_json(gguf_path, out_path)

Token types (llama.cpp): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
6 byte. Control and user-defined tokens become added tokens (never split, matched before
pre-tokenization); control ones are flagged special. (SmolLM2 has only control tokens.) tokenizer.ggml.pre selects the pre-tokenizer with the
regexes Hugging Face uses for that model family (see PRE_TOKENIZERS); the same table is
in src/tokenizer/load_gguf.c.
"""
import json
import pathlib

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors

# The GPT-2 pattern ByteLevel(use_regex=True) applies.
GPT2_REGEX = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
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


def _splits_then_bytelevel(regexes):
    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in regexes]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)


def _pre_tokenizer(pre):
    """tokenizer.ggml.pre -> (pre_tokenizer, normalizer or None)."""
    if pre in ("gpt-2", "gpt2", "default"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), None
    if pre in ("smollm", "starcoder"):
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]), None
    if pre in ("llama-bpe", "llama3"):
        return _splits_then_bytelevel([LLAMA3_REGEX]), None
    if pre == "qwen2":
        # Qwen2/2.5/3 tokenizer.json files carry an NFC normalizer.
        return _splits_then_bytelevel([QWEN2_REGEX]), normalizers.NFC()
    if pre == "deepseek-llm":
        return _splits_then_bytelevel(DEEPSEEK_LLM_REGEXES), None
    if pre == "deepseek-v3":
        return _splits_then_bytelevel(DEEPSEEK_V3_REGEXES), None
    raise ValueError(f"unsupported tokenizer.ggml.pre {pre!r}")


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def hf_tokenizer_from_gguf(path):
    """Returns a tokenizers.Tokenizer equivalent to the GGUF file's tokenizer.ggml.*."""
    r = gguf.GGUFReader(str(path))
    model = _field(r, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"{path}: tokenizer.ggml.model {model!r} is not 'gpt2' (byte-level BPE)")
    tokens = list(_field(r, "tokenizer.ggml.tokens"))
    types = list(_field(r, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in _field(r, "tokenizer.ggml.merges", [])]
    pre = _field(r, "tokenizer.ggml.pre", "default")
    bos = _field(r, "tokenizer.ggml.bos_token_id")
    add_bos = bool(_field(r, "tokenizer.ggml.add_bos_token", False))

    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    pre_tok, norm = _pre_tokenizer(pre)
    if norm is not None:
        tok.normalizer = norm
    tok.pre_tokenizer = pre_tok
    tok.decoder = decoders.ByteLevel()
    if add_bos and bos is not None and 0 <= int(bos) < len(tokens):
        b = tokens[int(bos)]
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{b} $A", pair=f"{b} $A {b} $B",
                                          special_tokens=[(b, int(bos))]),
        ])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # control -> special; user-defined -> added but not special (matched even when
    # special tokens are not parsed), as convert_hf_to_gguf.py assigns the two types
    added = [AddedToken(tokens[i], special=int(ty) == 3, normalized=False)
             for i, ty in enumerate(types) if int(ty) in (3, 4)]
    tok.add_special_tokens(added)
    return tok


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

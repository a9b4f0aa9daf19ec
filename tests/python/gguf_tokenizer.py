"""Builds the Hugging Face `tokenizers.Tokenizer` equivalent to the tokenizer stored in a
GGUF file's metadata (tokenizer.ggml.*, model "gpt2"), independently of tessera's C
loader, so tests can compare build/tessera against the reference implementation and
other scripts can write a tokenizer.json next to a model converted from GGUF.

    hf_tokenizer_from_gguf(path) -> tokenizers.Tokenizer
    write_tokenizer_json(gguf_path, out_path)

Token types (llama.cpp): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
6 byte. Control and user-defined tokens become added tokens flagged special (never split,
matched before pre-tokenization). tokenizer.ggml.pre selects the pre-tokenizer with the
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
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
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
    added = [AddedToken(tokens[i], special=True, normalized=False)
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

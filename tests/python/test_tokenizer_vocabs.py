"""Every vocabulary tessera reads from GGUF, against Hugging Face, and the GGUF path
against the tokenizer.json path.

References (provisioned by scripts/get-testdata.py, tests/testdata/SOURCES.md):
  * llama.cpp's vocabulary-only GGUFs (build/testdata/vocab/ggml-vocab-<name>.gguf), each
    with test vectors: .inp texts and .out ids that Hugging Face `tokenizers` gave for
    them with the model's real tokenizer.json (llama.cpp's convert_hf_to_gguf_update.py);
  * the real tokenizer.json files of build/testdata/tokenizers;
  * Mistral's own SentencePiece models (build/testdata/spm: Mistral 7B v0.1 and v0.3),
    with the `sentencepiece` package as the reference.

Checks:
  1. tessera on each GGUF gives the .out ids (byte-level pre-tokenizers of 11 families,
     SentencePiece Llama 2 and Phi-3);
  2. gguf_tokenizer.hf_tokenizer_from_gguf (the Python reference built from the GGUF,
     independent of the C loader) gives the .out ids too, which validates it, and then
     tessera equals it on a large mixed corpus (prose, Chinese, Japanese, Korean,
     Vietnamese, NFD text, emoji, code, whitespace runs, digits, special-token strings)
     plus the text of every vocabulary entry;
  3. for every vocabulary available in both forms, tessera's GGUF path equals its
     tokenizer.json path equals HF on that corpus: Llama 3 (llama.cpp's GGUF and one
     written from the tokenizer.json), Qwen3, DeepSeek-R1, and Llama 2 / Phi-3 / Falcon /
     DeepSeek-Coder (the tokenizer.json written from the GGUF, for Llama 2 and Phi-3 as
     transformers' converter writes it);
  4. SentencePiece-style tokenizer.json variants (Metaspace with each prepend scheme and
     split, Gemma's normalizer without Prepend, no byte fallback, ignore_merges, the
     Metaspace decoder) against HF, ids and decode;
  5. Mistral 7B v0.1 and v0.3: a GGUF written from the .model (as llama.cpp's converter
     does) gives SentencePiece's own ids, and equals the tokenizer.json path and HF.
"""
import json
import pathlib
import random
import subprocess
import sys

import pytest
from tokenizers import Tokenizer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gguf_tokenizer import (hf_tokenizer_from_gguf, read_spm_model, write_gguf_from_json,  # noqa: E402
                            write_gguf_from_spm_model)
from test_tokenizer import CORPUS, run_cli as run_cli_120  # noqa: E402


def run_cli(binary, src_args, lines, *flags):
    """test_tokenizer.run_cli with room for whole vocabularies (tens of thousands of lines)."""
    return run_cli_120(binary, src_args, lines, *flags, timeout=600)

VOCABS = ["llama-bpe", "qwen2", "qwen35", "gpt-2", "starcoder", "refact", "command-r", "deepseek-llm",
          "deepseek-coder", "falcon", "mpt", "llama-spm", "phi-3"]

SEPARATORS = ["", " ", "  ", "\n", "\n\n", "\t", "\r\n", " \u00a0", "\u3000", "   \n  "]
FRAGMENTS = [
    "Cửa Việt", "Tiếng Việt là ngôn ngữ chính thức của Việt Nam.", "Người dân ở Hà Nội thường uống cà phê sữa đá.",
    "Việt Nam, Đà Nẵng, Huế, Sài Gòn", "Nguyễn Thị Minh Khai", "ứng dụng điện thoại",
    "Vie\u0302\u0323t", "Cu\u031b\u0309a", "e\u0301te\u0301", "A\u030angstro\u0308m", "Ä Ö Ü ß", "ﬁ ﬂ ① ²",
    "你好，世界！", "机器学习是人工智能的一个分支。", "北京天安门", "人工智能技术正在快速发展，改变着我们的生活。",
    "こんにちは世界", "東京タワーはとても高いです。", "ｶﾀｶﾅ", "안녕하세요", "대한민국의 수도는 서울입니다.",
    "Привет, мир!", "Ελληνικά", "مرحبا بالعالم", "नमस्ते दुनिया", "สวัสดีชาวโลก", "ქართული", "Հայերեն",
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇺🇸🇩🇪", "❤️", "🦙", "🚀🚀🚀", "🫨", "😶‍🌫️",
    "def main():\n    return 0\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}", "x = {'a': [1, 2, 3]}",
    "#include <stdio.h>", "SELECT * FROM users WHERE id = 42;", "fn main() -> Result<(), Box<dyn Error>>",
    "    ", "\t\t\t", "\n\n\n\n", " \r\n \r\n", "                ", "\u2028", "\u0085",
    "0", "12", "123", "1234", "12345678901234567890", "3.14159", "-0.5e10", "1,000,000", "٣٤٥", "½ ¾ ⅷ",
    "I'm", "you're", "WE'LL", "it's", "'s", "don't", "'ve'", "I've got 'quotes'",
    "!!!", "???", "...", "---", "***", "(...)", "C++", "a&b|c", "$$$", "<=>", "~^`|",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<s>", "</s>", "<unk>",
    "<|assistant|>", "<|end|>", "<｜User｜>", "[INST]", "<think>", "<0x0A>", "▁", "▁▁hello",
    "https://example.com/a?b=1&c=2#d", "user@example.org", "The quick brown fox", "jumps over the lazy dog",
    "Hello", " world", "HELLO", "hello", "ied 4 ½ months", "discards", "Lorem ipsum dolor sit amet",
]


def mixed_corpus(n=600, seed=20):
    """CORPUS, then n texts of 1..12 random fragments joined by random separators."""
    rng = random.Random(seed)
    out = list(CORPUS)
    for _ in range(n):
        k = rng.randint(1, 12)
        parts = [rng.choice(FRAGMENTS) for _ in range(k)]
        out.append("".join(p + rng.choice(SEPARATORS) for p in parts))
    out.append("".join(FRAGMENTS) * 3)  # one long text
    return [t for t in out if "\x00" not in t]  # --jsonl cannot carry NUL


def vocab_corpus(tok, seed=7, per_text=8):
    """The decoded text of every entry of tok's vocabulary, per_text entries per text,
    joined with a random separator (often none, so neighbours form new words)."""
    rng = random.Random(seed)
    n = tok.get_vocab_size(with_added_tokens=True)
    # --jsonl cannot carry NUL (cJSON strings)
    texts = [tok.decode([i], skip_special_tokens=False).replace("\x00", "") for i in range(n)]
    rng.shuffle(texts)
    return ["".join(t + rng.choice(["", "", " ", "\n"]) for t in texts[i:i + per_text])
            for i in range(0, len(texts), per_text)]




def hf_ids(tok, texts, add_special=False, parse_special=True):
    tok.encode_special_tokens = not parse_special
    try:
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=add_special)]
    finally:
        tok.encode_special_tokens = False


def flags_of(add_special, parse_special):
    return (["--add-special"] if add_special else []) + ([] if parse_special else ["--no-parse-special"])


def assert_same(texts, got, want, what):
    bad = [(t[:60], g[:12], w[:12]) for t, g, w in zip(texts, got, want) if g != w]
    assert not bad, f"{what}: {len(bad)} of {len(texts)} texts differ, first: {bad[:3]}"


def vectors(vocab_dir, name):
    inp = (vocab_dir / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    inp = inp[:-1]
    out = (vocab_dir / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")[:len(inp)]
    assert len(inp) >= 40 and len(out) == len(inp), f"{name}: test vectors incomplete"
    return inp, [[int(x) for x in line.split()] for line in out]


@pytest.fixture(scope="session")
def vocab_dir(testdata):
    d = testdata / "vocab"
    for name in VOCABS:
        assert (d / f"ggml-vocab-{name}.gguf").is_file(), f"{d}/ggml-vocab-{name}.gguf missing"
    return d


@pytest.fixture(scope="session")
def reference(vocab_dir):
    """name -> hf_tokenizer_from_gguf of that vocabulary (built once)."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = hf_tokenizer_from_gguf(vocab_dir / f"ggml-vocab-{name}.gguf")
        return cache[name]
    return get


@pytest.fixture(scope="session")
def corpus():
    return mixed_corpus()


@pytest.mark.parametrize("name", VOCABS)
def test_gguf_matches_hf_vectors(tessera_bin, vocab_dir, name):
    texts, want = vectors(vocab_dir, name)
    got = run_cli(tessera_bin, ["--model", str(vocab_dir / f"ggml-vocab-{name}.gguf")], texts)
    assert_same(texts, got, want, f"tessera on ggml-vocab-{name}.gguf vs Hugging Face's ids")


@pytest.mark.parametrize("name", VOCABS)
def test_reference_matches_hf_vectors(vocab_dir, reference, name):
    texts, want = vectors(vocab_dir, name)
    assert_same(texts, hf_ids(reference(name), texts), want, f"hf_tokenizer_from_gguf({name}) vs Hugging Face's ids")


@pytest.mark.parametrize("name", VOCABS)
def test_gguf_matches_reference_on_corpus(tessera_bin, vocab_dir, reference, corpus, name):
    tok = reference(name)
    src = ["--model", str(vocab_dir / f"ggml-vocab-{name}.gguf")]
    for add_special, parse_special in ((False, True), (True, True), (False, False)):
        got = run_cli(tessera_bin, src, corpus, *flags_of(add_special, parse_special))
        assert_same(corpus, got, hf_ids(tok, corpus, add_special, parse_special),
                    f"{name} add_special={add_special} parse_special={parse_special}")
    words = vocab_corpus(tok)
    assert_same(words, run_cli(tessera_bin, src, words), hf_ids(tok, words), f"{name} vocabulary texts")
    # decoding: the same text as HF, whose from_utf8_lossy turns invalid bytes (DeepSeek's
    # added tokens "ö", "ú" decode to the single bytes 0xF6, 0xFA) into U+FFFD, where
    # tok_decode keeps the bytes
    ids = hf_ids(tok, corpus[:200])
    got = [d.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for d in run_cli(tessera_bin, src, ids)]
    assert_same(corpus[:200], got, tok.decode_batch(ids, skip_special_tokens=False), f"{name} decode")


def test_cua_viet_llama3_gguf(tessera_bin, vocab_dir, tokenizer_json_path):
    """The reported case: Llama 3's ignore_merges makes " Việt" one token."""
    for src in (["--model", str(vocab_dir / "ggml-vocab-llama-bpe.gguf")],
                ["--tokenizer", str(tokenizer_json_path("llama3"))]):
        assert run_cli(tessera_bin, src, ["Cửa Việt"]) == [[34, 91163, 101798]], src


@pytest.fixture(scope="session")
def tokenizer_json_path(testdata):
    def path(name):
        p = testdata / "tokenizers" / name / "tokenizer.json"
        assert p.is_file(), f"{p} missing"
        return p
    return path


@pytest.fixture(scope="session")
def vocab_json(vocab_dir, reference, tmp_path_factory):
    """name -> tokenizer.json written from llama.cpp's GGUF by hf_tokenizer_from_gguf
    (validated by the vectors above): for llama-spm (Llama 2) and phi-3 as transformers'
    LlamaConverter writes it; for falcon and deepseek-coder with their pre-tokenizers
    (Punctuation, steps after ByteLevel, Digits)."""
    d = tmp_path_factory.mktemp("vocab_json")

    def get(name):
        p = d / name / "tokenizer.json"
        if not p.exists():
            p.parent.mkdir(parents=True)
            reference(name).save(str(p))
        return p
    return get


# (tokenizer.json, GGUF) pairs of the same vocabulary: "vocab:NAME" is llama.cpp's GGUF,
# "pre:PRE" a GGUF written from the tokenizer.json with that tokenizer.ggml.pre;
# "from:NAME" the tokenizer.json written from llama.cpp's GGUF (vocab_json)
PAIRS = [("llama3", "vocab:llama-bpe"), ("llama3", "pre:llama-bpe"), ("qwen3", "pre:qwen2"),
         ("deepseek_r1", "pre:deepseek-v3"), ("from:llama-spm", "vocab:llama-spm"), ("from:phi-3", "vocab:phi-3"),
         ("from:falcon", "vocab:falcon"), ("from:deepseek-coder", "vocab:deepseek-coder")]


@pytest.mark.parametrize("json_name,gguf_src", PAIRS)
def test_gguf_path_equals_tokenizer_json_path(tessera_bin, vocab_dir, tokenizer_json_path, vocab_json, corpus,
                                              tmp_path, json_name, gguf_src):
    jpath = vocab_json(json_name[5:]) if json_name.startswith("from:") else tokenizer_json_path(json_name)
    kind, arg = gguf_src.split(":")
    gpath = vocab_dir / f"ggml-vocab-{arg}.gguf" if kind == "vocab" else write_gguf_from_json(
        jpath, tmp_path / "v.gguf", arg)
    tok = Tokenizer.from_file(str(jpath))
    for parse_special, texts in ((True, corpus + vocab_corpus(tok)), (False, corpus)):
        flags = flags_of(False, parse_special)
        from_json = run_cli(tessera_bin, ["--tokenizer", str(jpath)], texts, *flags)
        from_gguf = run_cli(tessera_bin, ["--model", str(gpath)], texts, *flags)
        assert_same(texts, from_gguf, from_json, f"GGUF path vs tokenizer.json path (parse_special={parse_special})")
        assert_same(texts, from_json, hf_ids(tok, texts, False, parse_special), "tokenizer.json path vs HF")


# ---------------------------------------------------------------- SentencePiece variants

META = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
SEQ_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
    {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}


def _set(**kv):
    def m(d):
        for k, v in kv.items():
            if k.startswith("model_"):
                d["model"][k[6:]] = v
            else:
                d[k] = v
    return m


def _cross_meta(d):
    """A first-rank merge "s" + "▁" that only a split at every "▁" keeps from firing."""
    ids = list(d["model"]["vocab"].values()) + [a["id"] for a in d["added_tokens"]]
    d["model"]["vocab"]["s\u2581"] = max(ids) + 1
    m = d["model"]["merges"]
    m.insert(0, ["s", "\u2581"] if m and isinstance(m[0], list) else "s \u2581")


SPM_VARIANTS = {
    "legacy": _set(),
    # transformers' non-legacy conversion (Llama 3.x-era LlamaTokenizerFast, Mistral v0.3)
    "metaspace_first": _set(normalizer=None, pre_tokenizer=META),
    "metaspace_first_decoder": _set(normalizer=None, pre_tokenizer=META,
                                    decoder={**META, "type": "Metaspace"}),
    "metaspace_always_split": _set(normalizer=None, pre_tokenizer={**META, "prepend_scheme": "always", "split": True},
                                   decoder={**META, "type": "Metaspace", "prepend_scheme": "always"}),
    "metaspace_never": _set(normalizer=None, pre_tokenizer={**META, "prepend_scheme": "never"},
                            decoder={**META, "type": "Metaspace", "prepend_scheme": "never"}),
    "metaspace_never_split": lambda d: (_set(normalizer=None, pre_tokenizer={**META, "prepend_scheme": "never",
                                                                             "split": True})(d), _cross_meta(d)),
    "metaspace_old_add_prefix_space": _set(normalizer=None, pre_tokenizer={
        "type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True}),
    # Gemma: spaces replaced, no dummy prefix, no Strip
    "gemma_style": _set(normalizer={"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
                        decoder={"type": "Sequence", "decoders": SEQ_DECODER["decoders"][:3]}),
    "no_byte_fallback_unk": _set(model_byte_fallback=False, model_fuse_unk=False),
    "no_byte_fallback_fused_unk": _set(model_byte_fallback=False, model_fuse_unk=True),
    "ignore_merges": _set(model_ignore_merges=True, decoder=SEQ_DECODER),
}


@pytest.mark.parametrize("variant", sorted(SPM_VARIANTS))
def test_spm_json_variants(tessera_bin, vocab_json, corpus, tmp_path, variant):
    d = json.loads(vocab_json("llama-spm").read_text(encoding="utf-8"))
    SPM_VARIANTS[variant](d)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(d), encoding="utf-8")
    tok = Tokenizer.from_file(str(path))
    texts = corpus + [" x", "  x", "<s>x", "<s> x", "x<s>x", "x </s>", "\u2581x", "a\u2581\u2581b "]
    for add_special, parse_special in ((False, True), (True, True), (False, False)):
        got = run_cli(tessera_bin, ["--tokenizer", str(path)], texts, *flags_of(add_special, parse_special))
        assert_same(texts, got, hf_ids(tok, texts, add_special, parse_special),
                    f"{variant} add_special={add_special} parse_special={parse_special}")
    ids = hf_ids(tok, texts, True)
    assert_same(texts, run_cli(tessera_bin, ["--tokenizer", str(path)], ids),
                tok.decode_batch(ids, skip_special_tokens=False), f"{variant} decode")


# ---------------------------------------------------------------- Mistral's own models

@pytest.mark.parametrize("name", ["mistral-v0.1", "mistral-v0.3"])
def test_mistral_sentencepiece(tessera_bin, testdata, corpus, tmp_path, name):
    import sentencepiece
    model = testdata / "spm" / f"{name}.model"
    assert model.is_file(), f"{model} missing"
    gpath = write_gguf_from_spm_model(model, tmp_path / f"{name}.gguf")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model))
    words = ["".join(sp.id_to_piece(i).replace("\u2581", " ") for i in range(k, min(k + 8, sp.get_piece_size())))
             for k in range(0, sp.get_piece_size(), 8)]
    texts = corpus + words
    # SentencePiece never matches control tokens in text: compare without parsing them.
    # Its user-defined pieces (v0.3's [REFERENCE_DOC_n]) are matched after the dummy
    # prefix is added, HF's added tokens before (so HF prefixes the text after one): those
    # texts are left to the HF comparison below.
    user = [piece for piece, _, ty in read_spm_model(model)[0] if ty == 4]
    plain = [t for t in texts if not any(u in t for u in user)]
    assert len(plain) > 4000
    got = run_cli(tessera_bin, ["--model", str(gpath)], plain, "--no-parse-special")
    assert_same(plain, got, [sp.encode(t) for t in plain], f"{name}: tessera vs sentencepiece")
    # and the tokenizer.json path (as transformers converts it) equals the GGUF path and HF
    tok = hf_tokenizer_from_gguf(gpath)
    jpath = tmp_path / "tokenizer.json"
    tok.save(str(jpath))
    for add_special, parse_special in ((False, True), (True, True), (False, False)):
        flags = flags_of(add_special, parse_special)
        from_json = run_cli(tessera_bin, ["--tokenizer", str(jpath)], texts, *flags)
        assert_same(texts, run_cli(tessera_bin, ["--model", str(gpath)], texts, *flags), from_json,
                    f"{name} GGUF vs tokenizer.json, add_special={add_special} parse_special={parse_special}")
        assert_same(texts, from_json, hf_ids(tok, texts, add_special, parse_special), f"{name} tokenizer.json vs HF")

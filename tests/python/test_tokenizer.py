"""Compares `tessera tokenize` with the Hugging Face `tokenizers` package, id for id:
the real tokenizer.json files scripts/get-testdata.py provisions in
build/testdata/tokenizers (Qwen3, Llama 3, Llama 3.2, DeepSeek-R1), the SmolLM2 GGUF (against
gguf_tokenizer.hf_tokenizer_from_gguf), GGUF files written from those tokenizer.json
files with their tokenizer.ggml.pre, and byte-level tokenizer.json variants that exercise
the loader's other components (Split behaviours, invert, Digits, add_prefix_space, NFKC,
lstrip/rstrip/single_word added tokens, Template/Roberta post-processors). Each
comparison runs the whole corpus through one `--jsonl` process per flag combination.
llama.cpp's GGUF vocabularies, the SentencePiece-style tokenizers and the GGUF path
against the tokenizer.json path on a larger corpus are in test_tokenizer_vocabs.py.
"""
import json
import pathlib
import subprocess
import sys

import pytest
from tokenizers import Tokenizer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gguf_tokenizer import hf_tokenizer_from_gguf, write_gguf_from_json  # noqa: E402

# build/testdata/tokenizers/<name>/tokenizer.json; where each comes from: tests/testdata/SOURCES.md
TOKENIZERS = ["llama3", "llama3_2_vision", "qwen3", "deepseek_r1"]

CORPUS = [
    "",
    "Hello world",
    "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times.",
    "I'm sure it's John's. They'll go; we'd've HE'LL SHE'S YOU'RE I'M WE'VE 'd 's",
    "don't ' s 'ſ 'ſs 'K",
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "こんにちは、世界。カタカナとひらがなと漢字。ｶﾀｶﾅ",
    "안녕하세요 세계. 한국어 텍스트입니다.",
    "😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇺🇸🇩🇪🇯🇵 ❤️ 🫨 🙂‍↔️",
    "def f(x):\n    if x > 0:\n\treturn x * 2  # tab\n    return -x\n\n\nclass A:\n        pass\n",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "1234567890123456789 3.14159 -0.5e10 1,000,000 0x1F 007 ٣٤٥ ½ ² ⅷ 𝟙𝟚",
    "a    b\t\tc\n\n\nd\r\ne\r\n\r\nf   ",
    "   leading spaces and trailing   ",
    " \n \n  \t \u00a0 \u3000 \u2028 \u180e \u0085 x",
    "Привет мир! Ελληνικά. مرحبا بالعالم. नमस्ते दुनिया. สวัสดีชาวโลก",
    "mixed English和中文and日本語テキスト123abc",
    "e\u0301 \u212b \u2126 A\u030a \ufb01 \u1100\u1161\u11a8 \u0958",
    "\u0301\u0302 lone combining marks \u0301",
    "replacement \ufffd char, zero width \u200b\u200d, bom \ufeff, nul \x00 and \x01\x1f\x7f",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|>Hello<|eot_id|><|start_header_id|>user<|end_header_id|>",
    "<|endoftext|> <|im_start|><|im_start|> <|im_start <|im_end|x",
    "<｜begin▁of▁sentence｜>hi<｜User｜>question<｜Assistant｜>answer<｜end▁of▁sentence｜>",
    "<tool_call>{\"name\": \"f\"}</tool_call> <think>hmm</think> <|fim_prefix|>a<|fim_suffix|>",
    "<repo_name>tessera<file_sep>main.c",
    "a" * 3000,
    " " * 300 + "x" + "\n" * 50,
    "9" * 200,
    "Unicode 16: \U000105c0\U000105c1 \u1c89 \U0001e4d0 \U00016d40 \U0001fae8",
    "https://example.com/path?query=1&x=y#frag user@mail.org",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "¿Qué tal? Ça va. Größe. Ñandú. İstanbul ıi",
    "tab\tseparated\tvalues\n1\t2\t3",
    "!!!??? ... --- *** ### $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}} ||| \\\\\\",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 20,
]


def run_cli(binary, src_args, lines, *flags, timeout=120):
    """Encodes (or, for lists of ids, decodes) lines with one `tessera tokenize --jsonl`;
    returns the parsed output lines."""
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for x in lines:
            f.write(json.dumps(x, ensure_ascii=True) + "\n")
        path = f.name
    try:
        r = subprocess.run([str(binary), "tokenize", *src_args, "--jsonl", path, *flags],
                           capture_output=True, timeout=timeout)
    finally:
        pathlib.Path(path).unlink()
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    # split on "\n" only: str.splitlines() would also break at U+2028 and U+0085
    out = [json.loads(x) for x in r.stdout.decode("utf-8", errors="surrogateescape").split("\n") if x]
    assert len(out) == len([x for x in lines]), "one output line per input"
    return out


def hf_encode(tok, text, add_special, parse_special):
    tok.encode_special_tokens = not parse_special
    try:
        return tok.encode(text, add_special_tokens=add_special).ids
    finally:
        tok.encode_special_tokens = False


def compare(binary, src_args, tok, corpus=CORPUS, combos=((False, True), (True, True), (False, False)),
            roundtrip=True):
    # --jsonl cannot carry NUL (cJSON strings); those texts are checked through --file
    texts = [t for t in corpus if "\x00" not in t]
    failures = []
    for add_special, parse_special in combos:
        flags = (["--add-special"] if add_special else []) + ([] if parse_special else ["--no-parse-special"])
        got = run_cli(binary, src_args, texts, *flags)
        for text, ids in zip(texts, got):
            want = hf_encode(tok, text, add_special, parse_special)
            if ids != want:
                failures.append((add_special, parse_special, text[:80], ids[:30], want[:30]))
    assert not failures, f"{len(failures)} mismatches, first: {failures[:3]}"
    # decode(encode(x)) == x (as HF decodes, with special tokens kept)
    ids = run_cli(binary, src_args, texts)
    decoded = run_cli(binary, src_args, ids)
    for text, i, d in zip(texts, ids, decoded):
        want = tok.normalizer.normalize_str(text) if tok.normalizer else text
        if roundtrip:
            assert d == want, f"round trip of {text[:60]!r}: {d[:60]!r}"
        assert d == tok.decode(i, skip_special_tokens=False)


@pytest.fixture(scope="session")
def tokenizer_json(testdata):
    """name -> path of that reference tokenizer.json (a missing one fails the test)."""
    def path(name):
        p = testdata / "tokenizers" / name / "tokenizer.json"
        assert p.is_file(), f"{p} missing"
        return p
    return path


@pytest.fixture(scope="session")
def smol_hf(default_model):
    return hf_tokenizer_from_gguf(default_model)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_hf_json_matches_tokenizers(tessera_bin, tokenizer_json, name):
    path = tokenizer_json(name)
    compare(tessera_bin, ["--tokenizer", str(path)], Tokenizer.from_file(str(path)))


def test_gguf_matches_hf_from_gguf(tessera_bin, default_model, smol_hf):
    compare(tessera_bin, ["--model", str(default_model)], smol_hf)


def test_gguf_counts_and_bos(tessera_bin, default_model):
    r = subprocess.run([str(tessera_bin), "tokenize", "--model", str(default_model), "--text", "hi",
                        "--add-special", "--add-bos", "1"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0] == 1  # bos_token_id of SmolLM2
    r = subprocess.run([str(tessera_bin), "tokenize", "--model", str(default_model), "--text", "hi",
                        "--add-special"], capture_output=True, text=True)
    assert json.loads(r.stdout)[0] != 1  # add_bos_token false in the metadata


def test_nul_and_file_input(tessera_bin, tokenizer_json, tmp_path):
    path = tokenizer_json("qwen3")
    tok = Tokenizer.from_file(str(path))
    text = "nul \x00 inside\x00\x00 and <|im_start|>x"
    f = tmp_path / "in.txt"
    f.write_bytes(text.encode())
    r = subprocess.run([str(tessera_bin), "tokenize", "--tokenizer", str(path), "--file", str(f)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ids = json.loads(r.stdout)
    assert ids == tok.encode(text, add_special_tokens=False).ids
    r = subprocess.run([str(tessera_bin), "tokenize", "--tokenizer", str(path), "--decode",
                        ",".join(map(str, ids))], capture_output=True)
    assert r.stdout == text.encode()


def test_invalid_utf8_round_trips(tessera_bin, tokenizer_json, tmp_path):
    path = tokenizer_json("llama3")
    raw = b"ok \xff\xfe bad \xc3 trunc \xe2\x82 over \xc0\xaf surr \xed\xa0\x80 end \xf0\x9f\x98"
    f = tmp_path / "bad.bin"
    f.write_bytes(raw)
    r = subprocess.run([str(tessera_bin), "tokenize", "--tokenizer", str(path), "--file", str(f)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ids = json.loads(r.stdout)
    r = subprocess.run([str(tessera_bin), "tokenize", "--tokenizer", str(path), "--decode",
                        ",".join(map(str, ids))], capture_output=True)
    assert r.stdout == raw


# ---------------------------------------------------------------- GGUF pre types

@pytest.mark.parametrize("name,pre", [("llama3", "llama-bpe"), ("qwen3", "qwen2"), ("deepseek_r1", "deepseek-v3")])
def test_gguf_pre_types_match_tokenizer_json(tessera_bin, tokenizer_json, tmp_path, name, pre):
    src = tokenizer_json(name)
    g = write_gguf_from_json(src, tmp_path / f"{name}.gguf", pre)
    tok = Tokenizer.from_file(str(src))
    # user-defined (non-special) added tokens are matched in both; GGUF has no
    # post-processor BOS here, so compare without add_special
    compare(tessera_bin, ["--model", str(g)], tok, combos=((False, True), (False, False)))


def test_gguf_deepseek_llm_matches_python_table(tessera_bin, tokenizer_json, tmp_path):
    src = tokenizer_json("deepseek_r1")
    g = write_gguf_from_json(src, tmp_path / "dsllm.gguf", "deepseek-llm")
    tok = hf_tokenizer_from_gguf(g)
    compare(tessera_bin, ["--model", str(g)], tok, combos=((False, True),))


def test_gguf_unsupported_is_refused(tessera_bin, tmp_path):
    import gguf
    for key, value, needle in [("pre", "no-such-pre", "tokenizer.ggml.pre"),
                               ("model", "bert", "tokenizer.ggml.model")]:
        out = tmp_path / f"bad_{key}.gguf"
        w = gguf.GGUFWriter(str(out), "llama")
        w.add_tokenizer_model(value if key == "model" else "gpt2")
        w.add_tokenizer_pre(value if key == "pre" else "default")
        w.add_token_list(["a", "b", "ab"])
        w.add_token_merges(["a b"])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        r = subprocess.run([str(tessera_bin), "tokenize", "--model", str(out), "--text", "ab"],
                           capture_output=True, text=True)
        assert r.returncode == 1
        assert needle in r.stderr and value in r.stderr, r.stderr


# ---------------------------------------------------------------- tokenizer.json variants

VARIANT_CORPUS = CORPUS[:26] + ["  x  y ", "x", " 12 345 6789 ", "a,b;;c", "<|im_start|> <|im_end|>x<|im_end|> y"]


def _variant(base, mutate):
    d = json.loads(base.to_str())
    mutate(d)
    return d


def _set_pre(steps):
    def m(d):
        d["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": steps}
    return m


BL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def _split(pattern, behavior, invert=False, regex=True):
    return {"type": "Split", "pattern": {"Regex" if regex else "String": pattern}, "behavior": behavior,
            "invert": invert}


VARIANTS = {
    "prefix_space": _set_pre([{**BL, "add_prefix_space": True}]),
    "digits_runs": _set_pre([{"type": "Digits", "individual_digits": False}, BL]),
    "split_removed": _set_pre([_split("\\s+", "Removed"), BL]),
    "split_merged_prev": _set_pre([_split(" ", "MergedWithPrevious", regex=False), BL]),
    "split_merged_next": _set_pre([_split("\\p{P}", "MergedWithNext"), BL]),
    "split_contiguous": _set_pre([_split("\\p{N}", "Contiguous"), BL]),
    "split_invert": _set_pre([_split("\\p{L}+", "Isolated", invert=True), {**BL, "use_regex": False}]),
    "split_invert_removed": _set_pre([_split("[a-z]+", "Removed", invert=True), BL]),
    "nfkc": lambda d: d.__setitem__("normalizer", {"type": "Sequence", "normalizers": [{"type": "NFKC"}]}),
    "nfd": lambda d: d.__setitem__("normalizer", {"type": "NFD"}),
}


def _added_flags(d):
    for a in d["added_tokens"]:
        if a["content"] == "<|im_start|>":
            a.update(lstrip=True, rstrip=True)
        if a["content"] == "<|im_end|>":
            a.update(single_word=True, special=False)
        if a["content"] == "<|endoftext|>":
            a.update(normalized=True)
    d["normalizer"] = {"type": "NFC"}


def _template(d):
    d["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "</s>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<|im_start|>"]},
                           "</s>": {"id": "</s>", "ids": [2], "tokens": ["<|im_end|>"]}}}


def _roberta(d):
    d["post_processor"] = {"type": "RobertaProcessing", "sep": ["<|im_end|>", 2], "cls": ["<|im_start|>", 1],
                           "trim_offsets": True, "add_prefix_space": False}


VARIANTS.update(added_flags=_added_flags, template=_template, roberta=_roberta)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_json_variants(tessera_bin, tmp_path, smol_hf, variant):
    d = _variant(smol_hf, VARIANTS[variant])
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(d), encoding="utf-8")
    tok = Tokenizer.from_file(str(path))
    # these variants drop or add text, so decode(encode(x)) is not x
    lossy = variant in ("prefix_space", "split_removed", "split_invert_removed", "added_flags")
    compare(tessera_bin, ["--tokenizer", str(path)], tok, corpus=VARIANT_CORPUS, roundtrip=not lossy)


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d["model"].__setitem__("type", "WordPiece"), "model WordPiece"),
    (lambda d: d.__setitem__("normalizer", {"type": "Lowercase"}), "normalizer Lowercase"),
    (lambda d: d.__setitem__("pre_tokenizer", {"type": "Whitespace"}), "pre_tokenizer Whitespace"),
    (lambda d: d.__setitem__("pre_tokenizer", {"type": "Metaspace", "replacement": "_"}), "Metaspace replacement"),
    (lambda d: d.__setitem__("normalizer", {"type": "Replace", "pattern": {"Regex": " "}, "content": "_"}),
     "Replace with a Regex"),
    (lambda d: d.__setitem__("decoder", {"type": "WordPiece"}), "decoder WordPiece"),
    (lambda d: d.__setitem__("post_processor", {"type": "Foo"}), "post_processor Foo"),
    (lambda d: d.__setitem__("decoder", {"type": "Metaspace", "replacement": "\u2581"}),
     "ByteLevel pre_tokenizer without a ByteLevel decoder"),
    (lambda d: d["model"]["merges"].append("zzzq yyyq"), "not in the vocabulary"),
])
def test_unsupported_json_is_refused(tessera_bin, tmp_path, smol_hf, mutate, needle):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(_variant(smol_hf, mutate)), encoding="utf-8")
    r = subprocess.run([str(tessera_bin), "tokenize", "--tokenizer", str(path), "--text", "x"],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert needle in r.stderr, r.stderr


def test_usage_errors(tessera_bin):
    for args in ([], ["--text", "x"], ["--tokenizer", "a", "--model", "b", "--text", "x"],
                 ["--tokenizer", "a"], ["--tokenizer", "a", "--text", "x", "--bogus"],
                 ["--tokenizer", "a", "--decode", "1,x"], ["--tokenizer", "a", "--text", "x", "--add-bos", "2"]):
        r = subprocess.run([str(tessera_bin), "tokenize", *args], capture_output=True, text=True)
        assert r.returncode == 2, (args, r.stderr)
    r = subprocess.run([str(tessera_bin), "tokenize", "--tokenizer", "/nonexistent.json", "--text", "x"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "nonexistent" in r.stderr

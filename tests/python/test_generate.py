"""End-to-end tests of `tessera generate`: prompt sources, chat templates, sampling
determinism, stop strings, --print-ids, context limits, usage errors and UTF-8 output.

Text-quality assertions run on the F16 derivative of the default model
(build/testmodels/smollm2-f16.gguf); mechanics run on the tiny random qwen2 model
(hidden 64, 2 layers: a 32-token generation takes well under a second) and, once, on the
default Q4_1 model. Every run uses --threads 2 and at most 32 new tokens.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, TEST_MODELS

F16 = TEST_MODELS / "smollm2-f16.gguf"
TINY = TEST_MODELS / "qwen2-tiny"          # HF directory, random weights, has a chat template
TINY_GGUF = TEST_MODELS / "qwen2-tiny.gguf"
VOCAB = 49152                              # SmolLM2's tokenizer, shared by the tiny models
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture(scope="session")
def test_models():
    """The derived models; made by scripts/make-test-models.py (idempotent) if missing."""
    if not (F16.exists() and TINY.is_dir() and TINY_GGUF.exists()):
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make-test-models.py"),
                        "--out", str(TEST_MODELS)], check=True, timeout=300)
    for p in (F16, TINY, TINY_GGUF):
        assert p.exists(), f"{p} missing after scripts/make-test-models.py"
    return TEST_MODELS


def gen(bin_, model, *args, check=True, threads=True):
    """Runs `tessera generate`; returns the CompletedProcess (stdout/stderr as bytes)."""
    cmd = [str(bin_), "generate", "--model", str(model)]
    if threads:
        cmd += ["--threads", "2"]
    cmd += [str(a) for a in args]
    r = subprocess.run(cmd, capture_output=True, timeout=120)
    assert r.returncode >= 0, f"killed by signal {-r.returncode}: {r.stderr.decode(errors='replace')}"
    if check:
        assert r.returncode == 0, f"{cmd} exited {r.returncode}: {r.stderr.decode(errors='replace')}"
    return r


def text_of(r):
    """stdout without the one trailing newline generate always prints."""
    out = r.stdout.decode("utf-8")
    assert out.endswith("\n"), repr(out)
    return out[:-1]


def ids_of(r):
    line = r.stdout.decode()
    assert line.endswith("\n") and line.count("\n") == 1, repr(line)
    return [int(x) for x in line.split()]


def stats(r):
    """The stderr statistics line, parsed: {'generated': N, 'finish': 'stop'|'length'}."""
    line = [ln for ln in r.stderr.decode().splitlines() if ln.startswith("[load")]
    assert len(line) == 1, r.stderr
    line = line[0]
    gen_part = line.split("generated ")[1]
    return {"generated": int(gen_part.split()[0]),
            "finish": line.split("finish: ")[1].rstrip("]")}


def usage_error(r, *words):
    err = r.stderr.decode()
    assert r.returncode == 2, (r.returncode, err)
    assert r.stdout == b""
    for w in words:
        assert w in err, (w, err)


# --- text quality (F16) -------------------------------------------------------------------

def test_chat_greedy_answers_paris(tessera_bin, test_models):
    r = gen(tessera_bin, F16, "--chat", "--temperature", "0", "--max-tokens", "32",
            "--prompt", "What is the capital of France?")
    assert "Paris" in text_of(r)
    s = stats(r)
    assert s["finish"] == "stop", r.stderr  # the model ends its turn with <|im_end|>
    assert 0 < s["generated"] < 32


def test_chat_system_message_changes_prompt(tessera_bin, test_models):
    # the system message goes through the template: a longer one, a longer prompt (without
    # one, SmolLM2's template inserts its own default system message)
    def n_prompt(system):
        r = gen(tessera_bin, TINY, "--chat", "--system", system, "--temperature", "0",
                "--max-tokens", "1", "--prompt", "hi")
        return int(r.stderr.decode().split("prompt ")[1].split()[0])
    assert n_prompt("You are terse and precise, and you answer in French.") == n_prompt("A.") + 11


# --- determinism ---------------------------------------------------------------------------

def test_greedy_is_deterministic(tessera_bin, test_models):
    args = ("--temperature", "0", "--max-tokens", "24", "--prompt", "The quick brown fox")
    a, b = gen(tessera_bin, TINY, *args), gen(tessera_bin, TINY, *args)
    assert a.stdout == b.stdout and len(text_of(a)) > 0


def test_seeded_sampling_repeats_and_seeds_differ(tessera_bin, test_models):
    base = ("--temperature", "0.8", "--max-tokens", "32", "--ignore-eos", "--print-ids",
            "--prompt", "Once upon a time")
    a = ids_of(gen(tessera_bin, TINY, *base, "--seed", "1234"))
    b = ids_of(gen(tessera_bin, TINY, *base, "--seed", "1234"))
    c = ids_of(gen(tessera_bin, TINY, *base, "--seed", "98765"))
    assert len(a) == 32 and a == b
    assert a != c  # 32 draws from a spread-out distribution: a collision is ~impossible


def test_hf_dir_and_gguf_give_the_same_greedy_tokens(tessera_bin, test_models):
    # qwen2-tiny/ and qwen2-tiny.gguf hold identical values (F32 safetensors of
    # f16-representable numbers vs F16 GGUF): the greedy continuation must agree
    args = ("--temperature", "0", "--max-tokens", "8", "--ignore-eos", "--print-ids",
            "--kv-dtype", "f32", "--prompt", "Hello there")
    assert ids_of(gen(tessera_bin, TINY, *args)) == ids_of(gen(tessera_bin, TINY_GGUF, *args))


# --- --print-ids, --max-tokens, --tokens -----------------------------------------------------

def test_print_ids_decode_to_the_text_output(tessera_bin, default_model):
    # the default Q4_1 model: mechanics only (ids ↔ text), not quality
    args = ("--temperature", "0", "--max-tokens", "10", "--prompt", "The three primary colors are")
    ids = ids_of(gen(tessera_bin, default_model, *args, "--print-ids"))
    text = text_of(gen(tessera_bin, default_model, *args))
    assert 0 < len(ids) <= 10
    dec = subprocess.run([str(tessera_bin), "tokenize", "--model", str(default_model), "--skip-special",
                          "--decode", ",".join(map(str, ids))], capture_output=True, timeout=60)
    assert dec.returncode == 0, dec.stderr
    assert dec.stdout.decode("utf-8") == text


@pytest.mark.parametrize("n", [1, 17])
def test_max_tokens_with_ignore_eos_is_exact(tessera_bin, test_models, n):
    r = gen(tessera_bin, TINY, "--temperature", "0", "--ignore-eos", "--print-ids", "--max-tokens", n,
            "--prompt", "Count:")
    assert len(ids_of(r)) == n
    assert stats(r) == {"generated": n, "finish": "length"}


def test_tokens_prompt_matches_text_prompt(tessera_bin, test_models):
    prompt = "The quick brown fox"
    enc = subprocess.run([str(tessera_bin), "tokenize", "--model", str(TINY), "--add-special",
                          "--text", prompt], capture_output=True, timeout=60)
    assert enc.returncode == 0, enc.stderr
    toks = json.loads(enc.stdout)
    args = ("--temperature", "0", "--max-tokens", "12", "--ignore-eos", "--print-ids")
    a = ids_of(gen(tessera_bin, TINY, *args, "--tokens", ",".join(map(str, toks))))
    b = ids_of(gen(tessera_bin, TINY, *args, "--prompt", prompt))
    assert a == b and len(a) == 12


def test_tokens_out_of_vocab_is_a_runtime_error(tessera_bin, test_models):
    r = gen(tessera_bin, TINY, "--tokens", f"1,{VOCAB + 7},3", "--max-tokens", "2", check=False)
    assert r.returncode == 1 and r.stdout == b""
    assert f"id {VOCAB + 7}" in r.stderr.decode() and "vocabulary" in r.stderr.decode()


@pytest.mark.parametrize("bad", ["1,2,abc", "1,,2", "-5", ","])
def test_tokens_malformed_is_a_usage_error(tessera_bin, test_models, bad):
    r = gen(tessera_bin, TINY, "--tokens", bad, check=False)
    usage_error(r, "--tokens")
    # one clean message, no garbage from an unset error buffer
    err = r.stderr.decode("utf-8")
    assert "generate: \n" not in err and all(c.isprintable() or c == "\n" for c in err), repr(err)


def test_prompt_longer_than_ctx_is_rejected(tessera_bin, test_models):
    r = gen(tessera_bin, TINY, "--tokens", ",".join(["100"] * 20), "--ctx", "16", check=False)
    assert r.returncode == 1 and r.stdout == b""
    err = r.stderr.decode()
    assert "20 tokens" in err and "16" in err and "--ctx" in err, err


def test_max_tokens_clamped_to_context(tessera_bin, test_models):
    r = gen(tessera_bin, TINY, "--tokens", "100,200,300,400,500", "--ctx", "12", "--max-tokens", "100",
            "--ignore-eos", "--temperature", "0", "--print-ids")
    assert len(ids_of(r)) == 12 - 5
    assert stats(r) == {"generated": 7, "finish": "length"}


def test_prompt_file(tessera_bin, test_models, tmp_path):
    p = tmp_path / "prompt.txt"
    p.write_text("The quick brown fox")
    args = ("--temperature", "0", "--max-tokens", "8", "--ignore-eos", "--print-ids")
    assert ids_of(gen(tessera_bin, TINY, *args, "--prompt-file", p)) == \
        ids_of(gen(tessera_bin, TINY, *args, "--prompt", "The quick brown fox"))
    r = gen(tessera_bin, TINY, "--prompt-file", tmp_path / "nope.txt", check=False)
    assert r.returncode == 1 and "nope.txt" in r.stderr.decode()


# --- stop strings --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def greedy_text(tessera_bin, test_models):
    """32 greedy tokens of the tiny model, no stops: (args, text)."""
    args = ("--temperature", "0", "--max-tokens", "32", "--ignore-eos", "--prompt", "Once upon a time")
    text = text_of(gen(tessera_bin, TINY, *args))
    assert len(text) > 60, text
    return args, text


def test_stop_ends_output_before_the_stop_string(tessera_bin, greedy_text):
    args, text = greedy_text
    cut = len(text) // 2
    stop = text[cut:cut + 5]
    expect = text[:text.index(stop)]
    r = gen(tessera_bin, TINY, *args, "--stop", stop)
    out = text_of(r)
    assert out == expect and stop not in out
    assert stats(r)["finish"] == "stop"


def test_multiple_stops_first_occurrence_wins(tessera_bin, greedy_text):
    args, text = greedy_text
    early, late = text[20:24], text[-6:]
    expect = text[:min(text.index(early), text.index(late))]
    r = gen(tessera_bin, TINY, *args, "--stop", late, "--stop", "\x01never", "--stop", early)
    assert text_of(r) == expect
    assert stats(r)["finish"] == "stop"


def test_stop_that_never_occurs_changes_nothing(tessera_bin, greedy_text):
    args, text = greedy_text
    r = gen(tessera_bin, TINY, *args, "--stop", "\x02not in any output\x03", "--stop", "zzqzzqzz")
    assert text_of(r) == text
    assert stats(r) == {"generated": 32, "finish": "length"}


def test_stop_also_ends_print_ids(tessera_bin, greedy_text):
    # --print-ids stops at the token that completed the stop string, as the text mode does
    args, text = greedy_text
    stop = text[len(text) // 2:len(text) // 2 + 5]
    r_text = gen(tessera_bin, TINY, *args, "--stop", stop)
    r_ids = gen(tessera_bin, TINY, *args, "--stop", stop, "--print-ids")
    n = len(ids_of(r_ids))
    assert 0 < n < 32
    assert stats(r_ids) == stats(r_text) == {"generated": n, "finish": "stop"}


# --- usage errors ----------------------------------------------------------------------------

@pytest.mark.parametrize("args,words", [
    (["--prompt", "hi"], ["--model"]),                                     # no model
    (["@M", "--prompt", "hi", "--tokens", "1,2"], ["exactly one"]),       # two prompt sources
    (["@M", "--prompt", "hi", "--prompt-file", "x"], ["exactly one"]),
    (["@M", "--prompt", "hi", "--frobnicate"], ["unknown option", "--frobnicate"]),
    (["@M", "--prompt", "hi", "--system", "s"], ["--system", "--chat"]),
    (["@M", "--tokens", "1,2", "--chat"], ["--tokens", "--chat"]),
    (["@M", "--prompt", "hi", "--temperature", "-1"], ["--temperature", "-1"]),
    (["@M", "--prompt", "hi", "--temperature", "nan"], ["--temperature"]),
    (["@M", "--prompt", "hi", "--top-p", "2"], ["--top-p", "2"]),
    (["@M", "--prompt", "hi", "--max-tokens", "0"], ["--max-tokens", "0"]),
    (["@M", "--prompt", "hi", "--threads", "abc"], ["--threads", "abc"]),
    (["@M", "--prompt", "hi", "--seed", "-3"], ["--seed"]),
    (["@M", "--prompt", "hi", "--kv-dtype", "q4"], ["--kv-dtype"]),
    (["@M", "--prompt", "hi"] + ["--stop", "a", "--stop", "b", "--stop", "c", "--stop", "d",
                                 "--stop", "e"], ["--stop", "4"]),
    (["@M", "--prompt", "hi", "--stop", "x" * 257], ["--stop"]),
    (["@M", "--prompt", "hi", "--stop", ""], ["--stop"]),
    (["@M", "--prompt"], ["--prompt", "needs a value"]),
])
def test_usage_errors(tessera_bin, test_models, args, words):
    args = [str(TINY) if a == "@M" else a for a in args]
    model_given = "--model" if str(TINY) in args else None
    cmd = [str(tessera_bin), "generate"] + ([model_given] if model_given else []) + args
    r = subprocess.run(cmd, capture_output=True, timeout=30)
    usage_error(r, *words)


def test_stop_of_exactly_256_bytes_is_accepted(tessera_bin, test_models):
    r = gen(tessera_bin, TINY, "--prompt", "hi", "--max-tokens", "2", "--stop", "é" * 128)
    assert stats(r)["generated"] <= 2


def test_missing_model_is_a_runtime_error(tessera_bin, tmp_path):
    r = gen(tessera_bin, tmp_path / "absent.gguf", "--prompt", "hi", check=False)
    assert r.returncode == 1 and "absent.gguf" in r.stderr.decode()


# --- chat templates ----------------------------------------------------------------------

@pytest.fixture
def tiny_without_template(tmp_path, test_models):
    """A copy of qwen2-tiny/ whose tokenizer_config.json has no chat_template (the big
    files are symlinked)."""
    d = tmp_path / "notemplate"
    d.mkdir()
    for f in TINY.iterdir():
        if f.name == "tokenizer_config.json":
            cfg = json.loads(f.read_text())
            del cfg["chat_template"]
            (d / f.name).write_text(json.dumps(cfg))
        else:
            os.symlink(f, d / f.name)
    return d


def test_chat_without_a_template_fails(tessera_bin, tiny_without_template):
    r = gen(tessera_bin, tiny_without_template, "--chat", "--prompt", "hi", "--max-tokens", "2", check=False)
    assert r.returncode == 1 and r.stdout == b""
    err = r.stderr.decode()
    assert "no chat template" in err and "--chat-template" in err and "notemplate" in err, err
    # without --chat the same model generates
    gen(tessera_bin, tiny_without_template, "--prompt", "hi", "--max-tokens", "2")


def test_chat_template_file(tessera_bin, tiny_without_template, tmp_path):
    t = tmp_path / "chatml.jinja"
    t.write_text(CHATML)
    args = ("--chat", "--temperature", "0", "--max-tokens", "6", "--ignore-eos", "--print-ids",
            "--system", "Be brief.", "--prompt", "hi")
    a = gen(tessera_bin, tiny_without_template, *args, "--chat-template", t)
    # the same conversation given as raw tokens: the template was really applied
    rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    enc = subprocess.run([str(tessera_bin), "tokenize", "--model", str(TINY), "--text", rendered],
                         capture_output=True, timeout=60)
    toks = ",".join(map(str, json.loads(enc.stdout)))
    b = gen(tessera_bin, TINY, "--tokens", toks, "--temperature", "0", "--max-tokens", "6",
            "--ignore-eos", "--print-ids")
    assert ids_of(a) == ids_of(b)


def test_chat_template_file_errors(tessera_bin, tiny_without_template, tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content ")
    r = gen(tessera_bin, tiny_without_template, "--chat", "--prompt", "hi", "--chat-template", bad, check=False)
    assert r.returncode == 1 and r.stdout == b"" and r.stderr.startswith(b"generate: ")
    r = gen(tessera_bin, tiny_without_template, "--chat", "--prompt", "hi",
            "--chat-template", tmp_path / "missing.jinja", check=False)
    assert r.returncode == 1 and "missing.jinja" in r.stderr.decode()
    raising = tmp_path / "raise.jinja"
    raising.write_text("{{ raise_exception('only assistant turns here') }}")
    r = gen(tessera_bin, tiny_without_template, "--chat", "--prompt", "hi", "--chat-template", raising,
            check=False)
    assert r.returncode == 1 and "only assistant turns here" in r.stderr.decode()


# --- UTF-8 -----------------------------------------------------------------------------------

def test_output_is_valid_utf8_at_temperature_1(tessera_bin, test_models):
    # the random tiny model samples byte tokens freely, so split multi-byte characters are
    # common: every run must still print strict UTF-8
    non_ascii = 0
    for seed in range(5):
        r = gen(tessera_bin, TINY, "--temperature", "1", "--seed", seed, "--max-tokens", "32",
                "--ignore-eos", "--prompt", "写一首关于猫的诗 🐱")
        text = r.stdout.decode("utf-8")  # strict: raises on invalid UTF-8
        non_ascii += sum(ord(c) > 127 for c in text)
    assert non_ascii > 0  # the check above did see multi-byte characters


def test_f16_chinese_prompt_is_valid_utf8(tessera_bin, test_models):
    r = gen(tessera_bin, F16, "--chat", "--temperature", "1", "--seed", "7", "--max-tokens", "16",
            "--prompt", "用中文回答：猫喜欢吃什么？")
    text_of(r)  # strict UTF-8 decode

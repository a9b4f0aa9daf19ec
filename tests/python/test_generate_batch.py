"""`tessera generate --prompts-file`: many prompts through the continuous-batching
scheduler. Greedy results must equal one-at-a-time `generate` runs (the engine's batching
must not change any sequence's tokens), including under a small KV budget (preemption)
and a small per-step token budget (chunked prefill)."""
import json
import subprocess

import pytest

from conftest import TEST_MODELS

PROMPTS = [
    "Once upon a time",
    "The three primary colors are",
    "def fibonacci(n):",
    "In 1492, Columbus",
    "The quick brown fox jumps over the lazy dog. " * 6,
    "Once upon a time",  # a duplicate: same result, and the prefix cache may serve it
]


@pytest.fixture(scope="module")
def model():
    path = TEST_MODELS / "qwen2-tiny"
    if not path.exists():
        subprocess.run([".venv/bin/python", "scripts/make-test-models.py"], check=True)
    return path


def run(tessera_bin, *args, check=True):
    p = subprocess.run([str(tessera_bin), "generate", *map(str, args)], capture_output=True, timeout=300)
    if check:
        assert p.returncode == 0, p.stderr.decode()
    return p


def single_ids(tessera_bin, model, prompt, n):
    out = run(tessera_bin, "--model", model, "--prompt", prompt, "--max-tokens", n, "--temperature", 0,
              "--ignore-eos", "--print-ids", "--threads", 1, "--quiet").stdout.decode().split()
    return [int(x) for x in out]


def batch(tessera_bin, model, tmp_path, prompts, *extra):
    f = tmp_path / "prompts.txt"
    f.write_text("\n".join(prompts) + "\n")
    p = run(tessera_bin, "--model", model, "--prompts-file", f, "--threads", 1, *extra)
    return [json.loads(line) for line in p.stdout.decode().splitlines()], p.stderr.decode()


@pytest.mark.parametrize("knobs", [
    (),
    ("--kv-blocks", 8),                        # one 128-token sequence: forces preemption
    ("--max-num-batched-tokens", 8),           # chunked prefill in 8-token steps
    ("--max-num-seqs", 2),                     # at most two sequences per step
], ids=["default", "tiny-kv", "chunked", "two-seqs"])
def test_batch_equals_single(tessera_bin, model, tmp_path, knobs):
    n = 24
    want = [single_ids(tessera_bin, model, p, n) for p in PROMPTS]
    got, stderr = batch(tessera_bin, model, tmp_path, PROMPTS, "--max-tokens", n, "--temperature", 0,
                        "--ignore-eos", "--print-ids", "--ctx", 128, *knobs)
    assert [g["index"] for g in got] == list(range(len(PROMPTS)))
    for i, g in enumerate(got):
        assert g["token_ids"] == want[i], f"prompt {i} differs in batch mode ({knobs}): {stderr}"
        assert g["completion_tokens"] == n and g["finish_reason"] == "length"
    if knobs and knobs[0] == "--kv-blocks":
        assert "preemptions 0 " not in stderr, stderr


def test_batch_text_and_stop(tessera_bin, model, tmp_path):
    single = run(tessera_bin, "--model", model, "--prompt", PROMPTS[0], "--max-tokens", 24, "--temperature", 0,
                 "--ignore-eos", "--threads", 1, "--quiet").stdout.decode()
    got, _ = batch(tessera_bin, model, tmp_path, PROMPTS[:2], "--max-tokens", 24, "--temperature", 0, "--ignore-eos")
    assert got[0]["text"] == single.rstrip("\n")
    # a stop string taken from the middle of the text ends that sequence right before it
    text = got[0]["text"]
    stop = text[len(text) // 2: len(text) // 2 + 3]
    if not stop.strip():
        pytest.skip("no usable stop string in the generated text")
    got2, _ = batch(tessera_bin, model, tmp_path, PROMPTS[:2], "--max-tokens", 24, "--temperature", 0,
                    "--ignore-eos", "--stop", stop)
    assert got2[0]["finish_reason"] == "stop"
    assert got2[0]["text"] == text[: text.index(stop)]
    assert stop not in got2[0]["text"]


def test_batch_errors(tessera_bin, model, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    p = run(tessera_bin, "--model", model, "--prompts-file", empty, check=False)
    assert p.returncode == 1 and b"no prompts" in p.stderr
    p = run(tessera_bin, "--model", model, "--prompts-file", tmp_path / "missing.txt", check=False)
    assert p.returncode == 1 and b"missing.txt" in p.stderr
    f = tmp_path / "p.txt"
    f.write_text("hi\n")
    p = run(tessera_bin, "--model", model, "--prompts-file", f, "--prompt", "x", check=False)
    assert p.returncode == 2
    long = tmp_path / "long.txt"
    long.write_text("ok\n" + "word " * 400 + "\n")
    p = run(tessera_bin, "--model", model, "--prompts-file", long, "--ctx", 64, check=False)
    assert p.returncode == 1 and b"line 2" in p.stderr, p.stderr


SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["color", "n"], "additionalProperties": False}


def test_batch_json_schema(tessera_bin, default_model, tmp_path):
    """--json-schema FILE: every output is a JSON document matching the schema, ended by the
    model once the grammar completes; speculative decoding gives the same lines. Errors:
    a schema the compiler refuses (exit 1, naming the flag), no --prompts-file (exit 2)."""
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    prompts = ["Pick a colour and a digit, as JSON.", "Give me a JSON object with a colour and a number."]
    args = ("--max-tokens", 48, "--temperature", 0, "--json-schema", schema)
    got, _ = batch(tessera_bin, default_model, tmp_path, prompts, *args)
    spec, _ = batch(tessera_bin, default_model, tmp_path, prompts, *args, "--speculative-config",
                    '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}')
    assert spec == got
    for g in got:
        assert g["finish_reason"] == "stop", g
        doc = json.loads(g["text"])
        assert set(doc) == {"color", "n"} and doc["color"] in ("red", "green", "blue") and 0 <= doc["n"] <= 9, doc
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "bogus"}')
    f = tmp_path / "p.txt"
    f.write_text("hi\n")
    p = run(tessera_bin, "--model", default_model, "--prompts-file", f, "--json-schema", bad, check=False)
    assert p.returncode == 1 and b"--json-schema" in p.stderr and b"bogus" in p.stderr, p.stderr
    p = run(tessera_bin, "--model", default_model, "--prompt", "hi", "--json-schema", schema, check=False)
    assert p.returncode == 2 and b"--prompts-file" in p.stderr, p.stderr

"""Speculative decoding end to end (`--speculative-config`, vLLM's JSON, method "ngram"):
the server with it answers exactly what the server without it answers — greedy and seeded
completions, logprobs, a stop string, n = 2, penalties, bad words, min_tokens, a JSON schema, a streamed chat ending with [DONE] — while /metrics shows
the proposals were made and kept (vLLM's spec_decode counters), and the start-up log says
so. Bad configurations are usage errors (exit 2) before the model loads, in serve and in
generate; the YAML key works as the flag.

The engine-level proofs (every sampling mode, preemption, chunked prefill, prefix caching,
the emulated GPU) are tests/c/test_sched_spec.c's; this file checks the wiring."""
import json
import subprocess

from server_util import free_port, parse_sse, run_server, stream_request, wait_idle

SPEC = '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 1}'
CODE = ("def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
        "# the same function again, unchanged:\n")
ARGS = ("--device", "cpu", "--max-model-len", 512, "--threads", 2)


def requests(name):
    """(path, body, streamed) of the requests both servers answer."""
    chat = [{"role": "user", "content": "Repeat exactly: red, green, blue, red, green, blue, red, green, blue."}]
    return [
        ("/v1/completions", {"model": name, "prompt": CODE, "max_tokens": 64, "temperature": 0}, False),
        ("/v1/completions", {"model": name, "prompt": CODE, "max_tokens": 48, "temperature": 0.8, "seed": 11,
                             "logprobs": 2}, False),
        # a stop string met in the middle of a step's kept tokens: the rest is not reported
        ("/v1/completions", {"model": name, "prompt": CODE, "max_tokens": 64, "temperature": 0,
                             "stop": ["return"]}, False),
        ("/v1/completions", {"model": name, "prompt": CODE, "max_tokens": 32, "temperature": 0.7, "top_p": 0.9,
                             "seed": 5, "n": 2}, False),
        # penalties: each checked row counts the proposed tokens before it
        ("/v1/completions", {"model": name, "prompt": CODE, "max_tokens": 48, "temperature": 0,
                             "frequency_penalty": 0.5, "presence_penalty": 0.3, "repetition_penalty": 1.05}, False),
        ("/v1/completions", {"model": name, "prompt": CODE, "max_tokens": 48, "temperature": 0.8, "seed": 3,
                             "frequency_penalty": 0.4, "logprobs": 1}, False),
        # bad words the copied code holds, and min_tokens past an end the model would choose
        ("/v1/completions", {"model": name, "prompt": CODE, "max_tokens": 48, "temperature": 0,
                             "bad_words": [" fib(n - 2)", "return n"]}, False),
        ("/v1/completions", {"model": name, "prompt": "Say OK.", "max_tokens": 24, "temperature": 0,
                             "min_tokens": 12}, False),
        ("/v1/chat/completions", {"model": name, "messages": chat, "max_tokens": 48, "temperature": 0,
                                  "logprobs": True, "top_logprobs": 2}, False),
        # structured output: every checked row masked by the grammar's state after the tokens before it
        ("/v1/chat/completions", {"model": name, "messages": chat, "max_tokens": 64, "temperature": 0,
                                  "response_format": {"type": "json_schema", "json_schema": {"name": "colours", "schema": {
                                      "type": "array", "minItems": 6, "maxItems": 6,
                                      "items": {"enum": ["red", "green", "blue"]}}}}}, False),
        ("/v1/chat/completions", {"model": name, "messages": chat, "max_tokens": 48, "temperature": 0,
                                  "stream": True}, True),
    ]


def answers(srv):
    name = srv.get_json("/v1/models")["data"][0]["id"]
    out = []
    for path, body, streamed in requests(name):
        if streamed:
            res = stream_request(srv.host, srv.port, path, body)
            assert res.status == 200, res.body[:300]
            events = parse_sse(res.body).json_events()  # parse_sse requires the final data: [DONE]
            out.append("".join(e["choices"][0]["delta"].get("content") or ""
                               for e in events if e.get("choices")))
            continue
        r = srv.post_json(path, body)
        assert r.status == 200, r.body[:300]
        j = r.json()
        for c in j["choices"]:
            c.pop("index", None)
        out.append((j["choices"], j["usage"]))
    return out


def test_same_answers_with_speculation(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, *ARGS) as srv:
        plain = answers(srv)
        m = wait_idle(srv)
        assert m.get("vllm:spec_decode_num_drafts_total") == 0, m.text
    with run_server(tessera_bin, default_model, *ARGS, "--speculative-config", SPEC) as srv:
        assert "speculative decoding ngram, 5 tokens, n-gram 1..4" in srv.stderr(), srv.stderr_tail()
        assert "overlapped scheduling off" in srv.stderr()
        spec = answers(srv)
        m = wait_idle(srv)
        drafts = m.get("vllm:spec_decode_num_drafts_total")
        proposed = m.get("vllm:spec_decode_num_draft_tokens_total")
        kept = m.get("vllm:spec_decode_num_accepted_tokens_total")
    assert plain[2][0][0]["finish_reason"] == "stop", plain[2]  # the stop string was met
    for i, (a, b) in enumerate(zip(plain, spec)):
        assert a == b, (i, json.dumps(a)[:600], json.dumps(b)[:600])
    assert drafts > 0 and 0 < kept <= proposed, (drafts, proposed, kept)
    # the code repeats itself: most proposed tokens are right
    assert kept >= 0.3 * proposed, (kept, proposed)


def test_bad_configurations_are_usage_errors(tessera_bin, tmp_path):
    missing = tmp_path / "no-such-model.gguf"
    for value, says in (('{"method": "eagle", "num_speculative_tokens": 3}', 'must be "ngram"'),
                        ('{"method": "ngram"}', '"num_speculative_tokens" is required'),
                        ('{"method": "ngram", "num_speculative_tokens": 99}', "[1, 16]"),
                        ("ngram", "not a JSON object")):
        p = subprocess.run([str(tessera_bin), "serve", "--model", str(missing), "--port", str(free_port()),
                            "--speculative-config", value], capture_output=True, text=True, timeout=30)
        assert p.returncode == 2, (value, p.returncode, p.stderr)
        assert "--speculative-config" in p.stderr and says in p.stderr, p.stderr
        assert "no-such-model" not in p.stderr, p.stderr
    p = subprocess.run([str(tessera_bin), "generate", "--model", str(missing), "--prompt", "x",
                        "--speculative-config", SPEC], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "--prompts-file" in p.stderr, p.stderr
    p = subprocess.run([str(tessera_bin), "generate", "--model", str(missing), "--prompts-file", "x",
                        "--speculative-config", "{}"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "--speculative-config" in p.stderr, p.stderr
    # the YAML key, as a JSON string
    cfg = tmp_path / "tessera.yaml"
    cfg.write_text(f"model: {missing}\nspeculative_config: '{SPEC}'\n")
    p = subprocess.run([str(tessera_bin), "serve", "--config", str(cfg), "--print-config"], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert "speculative-config:" in p.stdout and "num_speculative_tokens" in p.stdout, p.stdout


def test_generate_prompts_file_same_output(tessera_bin, default_model, tmp_path):
    """`generate --prompts-file` through the scheduler: the same JSON lines with and without."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(CODE.replace("\n", "\\n") + "\nThe quick brown fox. The quick brown fox. The quick\n")
    outs = []
    for extra in ([], ["--speculative-config", SPEC]):
        p = subprocess.run([str(tessera_bin), "generate", "--model", str(default_model), "--prompts-file",
                            str(prompts), "--temperature", "0", "--max-tokens", "40", "--threads", "2", *extra],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        outs.append((p.stdout, p.stderr))
    assert outs[0][0] == outs[1][0]
    assert "speculative: 0 of 0 proposed tokens kept" in outs[0][1], outs[0][1]
    assert "speculative: 0 of" not in outs[1][1], outs[1][1]

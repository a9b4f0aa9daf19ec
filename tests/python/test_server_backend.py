"""`tessera serve` on the backend interface (issue 9 §1, issue 10 items 4-6): the backend's
choice in the log as vLLM writes it, --device selection and its errors, option values
checked before the model loads, one request whose sampling fails (a 500 for it alone,
the server stays healthy), an engine failure (every stream ends with an error event and
[DONE], /health 503, exit status 1 — the supervisor restarts the process), and metrics
and usage that add up, with exact values, n > 1 included.

Faults are injected with TESSERA_TEST_FAULT, the CPU backend's test hook (docs/engine.md):
"nan-row=K" gives the K-th sampled logits row NaN logits, "fail-step=K" fails the K-th
step; the warm-up step before /health turns 200 is step 1 and row 1."""
import os
import subprocess

from server_util import (check_error, expect_engine_failure, free_port, parse_sse, run_server, stream_request,
                         wait_idle)

MAX_MODEL_LEN = 256
# SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64; f16 KV, 16-token blocks
BLOCK_BYTES = 2 * 30 * 3 * 64 * 16 * 2


def model_id(srv):
    return srv.get_json("/v1/models")["data"][0]["id"]


def serve_fails(tessera_bin, *args, env=None, timeout=120):
    cmd = [str(tessera_bin), "serve", "--host", "127.0.0.1", "--port", str(free_port()), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_backend_choice_logged(tessera_bin, default_model):
    """device auto without a CUDA backend: the CPU, the reason, and vLLM's capacity lines."""
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN, "--kv-cache-memory", 64,
                    env={"TESSERA_CUDA_LIB": "none"}) as srv:
        log = srv.stderr()
        blocks = (64 << 20) // BLOCK_BYTES
        assert f"# CPU blocks: {blocks}, maximum concurrency for {MAX_MODEL_LEN} tokens per request: " \
               f"{blocks * 16 / MAX_MODEL_LEN:.2f}x" in log, log
        assert "device auto" in log and "disabled" in log, log
        assert "backend cpu" in log, log
        m = srv.metrics()
        assert m.get("vllm:kv_cache_usage_perc") == 0


def test_device_cuda_unavailable_exits(tessera_bin, default_model):
    p = serve_fails(tessera_bin, "--model", default_model, "--device", "cuda", env={"TESSERA_CUDA_LIB": "none"})
    assert p.returncode == 1, p.stderr
    assert "--device cuda" in p.stderr and "disabled" in p.stderr, p.stderr


def test_backend_options_checked_before_loading(tessera_bin, tmp_path):
    """Bad values fail at configuration time (exit 2), not after a model load."""
    missing = tmp_path / "no-such-model.gguf"
    for flag, value in (("--kv-cache-dtype", "int4"), ("--device", "tpu"), ("--gpu-memory-utilization", "0")):
        p = serve_fails(tessera_bin, "--model", missing, flag, value)
        assert p.returncode == 2, (flag, p.returncode, p.stderr)
        assert flag in p.stderr and "no-such-model" not in p.stderr, p.stderr
    p = subprocess.run([str(tessera_bin), "serve", "--kv-cache-dtype", "fp16", "--device", "cpu",
                        "--enforce-eager", "--print-config"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert "kv-cache-dtype: fp16" in p.stdout and "device: cpu" in p.stdout and "enforce-eager: true" in p.stdout


def test_kv_cache_too_small_says_what_to_change(tessera_bin, default_model):
    p = serve_fails(tessera_bin, "--model", default_model, "--device", "cpu", "--max-model-len", 2048,
                    "--kv-cache-memory", 16)  # 128 blocks of 0.35 MiB needed
    assert p.returncode == 1, p.stderr
    assert "--kv-cache-memory" in p.stderr and "--max-model-len" in p.stderr, p.stderr


def test_sampling_failure_fails_one_request(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN, "--device", "cpu",
                    env={"TESSERA_TEST_FAULT": "nan-row=2"}) as srv:
        name = model_id(srv)
        r = srv.post_json("/v1/completions", {"model": name, "prompt": "Hello there", "max_tokens": 4})
        err = check_error(r, 500, "server_error")
        assert "sampling failed" in err["message"], err
        # the next requests (rows 3..) and the health check are unaffected
        res = stream_request(srv.host, srv.port, "/v1/chat/completions",
                             {"model": name, "messages": [{"role": "user", "content": "Hi"}],
                              "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}})
        events = parse_sse(res.body).json_events()
        assert res.status == 200 and not any("error" in e for e in events), events
        assert any(c["finish_reason"] in ("stop", "length") for e in events for c in e["choices"]), events
        assert srv.request("GET", "/health").status == 200
        m = wait_idle(srv)
        assert m.get("vllm:request_success_total", finished_reason="error") == 1
        assert m.get("vllm:request_success_total", finished_reason="abort") == 0
        # the failed request produced no token: its prompt is not counted
        assert m.get("vllm:prompt_tokens_total") == events[-1]["usage"]["prompt_tokens"]


def test_engine_failure_ends_streams_and_exits(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN, "--device", "cpu",
                    env={"TESSERA_TEST_FAULT": "fail-step=3"}, check_exit=False) as srv:
        name = model_id(srv)
        res = stream_request(srv.host, srv.port, "/v1/chat/completions",
                             {"model": name, "messages": [{"role": "user", "content": "Count to ten."}],
                              "max_tokens": 32, "stream": True})
        expect_engine_failure(srv, res, "injected")  # /health 503 from the failure until the exit


def test_usage_and_metrics_add_up(tessera_bin, default_model):
    """Exact counters (vLLM's definitions: per engine request — one per choice — the whole
    prompt, cached tokens included; the cached part separately; every generated token),
    and usage.prompt_tokens_details.cached_tokens with n = 2."""
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN, "--device", "cpu",
                    "--max-num-seqs", 1) as srv:
        name = model_id(srv)
        ids = list(range(1000, 1040))    # 2 full blocks + 8 tokens
        fresh = list(range(3000, 3040))
        base = wait_idle(srv)

        def delta(m, name_, **labels):
            return m.get(name_, **labels) - base.get(name_, **labels)

        def complete(prompt, n):
            r = srv.post_json("/v1/completions", {"model": name, "prompt": prompt, "max_tokens": 3,
                                                  "ignore_eos": True, "n": n, "temperature": 0.7, "seed": 5})
            assert r.status == 200, r.body[:300]
            return r.json()["usage"]

        u1 = complete(ids, 1)            # computes the prompt: 2 full blocks enter the cache
        assert u1["prompt_tokens"] == 40 and u1["prompt_tokens_details"]["cached_tokens"] == 0, u1
        u2 = complete(ids, 2)            # both choices find the 32 cached tokens
        assert u2["prompt_tokens"] == 40 and u2["completion_tokens"] == 6, u2
        assert u2["prompt_tokens_details"]["cached_tokens"] == 32, u2
        u3 = complete(fresh, 2)          # one seat: choice 0 computes, choice 1 hits its blocks
        assert u3["prompt_tokens"] == 40 and u3["prompt_tokens_details"]["cached_tokens"] == 0, u3
        m = wait_idle(srv)
        assert delta(m, "vllm:prompt_tokens_total") == 40 * 5, m.text
        assert delta(m, "vllm:prompt_tokens_cached_total") == 32 * 3, m.text
        assert delta(m, "vllm:generation_tokens_total") == 3 * 5
        assert delta(m, "vllm:prefix_cache_queries_total") == 40 * 5
        assert delta(m, "vllm:prefix_cache_hits_total") == 32 * 3
        assert delta(m, "vllm:request_success_total", finished_reason="length") == 5
        for reason in ("stop", "abort", "error"):
            assert delta(m, "vllm:request_success_total", finished_reason=reason) == 0, reason
        assert delta(m, "vllm:time_to_first_token_seconds_count") == 5
        assert delta(m, "vllm:e2e_request_latency_seconds_count") == 5


def test_vllm_logging_and_trust_flags_and_max_logprobs(tessera_bin, default_model):
    """vLLM's --trust-remote-code, --disable-log-requests and --disable-log-stats are
    accepted (nothing to do: no model code runs, no request contents or periodic stats are
    logged); --max-logprobs caps every kind of logprobs request: above it, a 400 naming the
    field and the flag; at it, the alternatives come back."""
    with run_server(tessera_bin, default_model, "--trust-remote-code", "--disable-log-requests",
                    "--disable-log-stats", "--max-logprobs", 2, "--max-model-len", MAX_MODEL_LEN) as srv:
        name = model_id(srv)
        chat = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "logprobs": True}
        comp = {"model": name, "prompt": "Hello", "max_tokens": 2}
        for path, body, field in (("/v1/chat/completions", {**chat, "top_logprobs": 3}, "top_logprobs"),
                                  ("/v1/completions", {**comp, "logprobs": 3}, "logprobs"),
                                  ("/v1/completions", {**comp, "prompt_logprobs": 3}, "prompt_logprobs")):
            err = check_error(srv.post_json(path, body), 400, "invalid_request_error", param=field)
            assert "--max-logprobs" in err["message"] and "at most 2" in err["message"], err
        r = srv.post_json("/v1/chat/completions", {**chat, "top_logprobs": 2})
        assert r.status == 200, r.text()
        assert len(r.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2
        r = srv.post_json("/v1/completions", {**comp, "prompt_logprobs": 2})
        assert r.status == 200, r.text()

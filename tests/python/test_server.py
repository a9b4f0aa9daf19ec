"""`tessera serve` end to end on the default model: the official `openai` client against
/v1/chat/completions and /v1/completions (streaming and not), the exact SSE wire format
read with a raw socket and with `curl -N`, the small endpoints (/v1/models, /health,
/version, /tokenize, /detokenize, /metrics), served-model-name aliases and API keys.
Generations are kept short (max_tokens 8..64) so the module runs in well under a minute."""
import json
import os
import shutil
import subprocess
import time
import uuid

import openai
import pytest

from server_util import (check_chat_stream, check_completion_stream, check_error, parse_sse,
                         run_server, stream_request)

MAX_MODEL_LEN = 512
CHAT = [{"role": "user", "content": "Write one sentence about the sea."}]
PROMPT = "The three primary colors are"
API_KEYS = ("sk-tessera-test-1", "sk-tessera-test-2")


@pytest.fixture(scope="module")
def server(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN) as srv:
        yield srv


@pytest.fixture(scope="module")
def model_name(server):
    return server.get_json("/v1/models")["data"][0]["id"]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=120)


def chat(client, model, **kw):
    kw.setdefault("messages", CHAT)
    kw.setdefault("max_tokens", 16)
    return client.chat.completions.create(model=model, **kw)


def complete(client, model, **kw):
    kw.setdefault("prompt", PROMPT)
    kw.setdefault("max_tokens", 16)
    return client.completions.create(model=model, **kw)


# --------------------------------------------------------------------------- small endpoints

def test_health(server):
    r = server.request("GET", "/health")
    assert r.status == 200, r


def test_models(server, client, default_model):
    obj = server.get_json("/v1/models")
    assert obj["object"] == "list"
    assert len(obj["data"]) >= 1
    for m in obj["data"]:
        assert isinstance(m["id"], str) and m["id"]
        assert m["object"] == "model"
        assert isinstance(m["created"], int)
        assert m["owned_by"] == "tessera"
        assert m["max_model_len"] == MAX_MODEL_LEN
    ids = [m.id for m in client.models.list()]
    assert ids == [m["id"] for m in obj["data"]]


def test_retrieve_model(client, model_name):
    # GET /v1/models/{id}: the official client's models.retrieve
    m = client.models.retrieve(model_name)
    assert m.id == model_name and m.object == "model" and m.owned_by == "tessera"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found"


def test_version(server, tessera_bin):
    obj = server.get_json("/version")
    assert isinstance(obj["version"], str) and obj["version"]
    out = subprocess.run([str(tessera_bin), "version"], capture_output=True, text=True, timeout=30)
    assert obj["version"] in out.stdout, (obj, out.stdout)


def test_tokenize_detokenize_round_trip(server):
    text = "Hello world, tessera! Ünïcödé and emoji 🌊 too."
    r = server.post_json("/tokenize", {"prompt": text})
    assert r.status == 200, r
    tok = r.json()
    assert tok["max_model_len"] == MAX_MODEL_LEN
    assert tok["count"] == len(tok["tokens"]) > 0
    assert all(isinstance(t, int) and t >= 0 for t in tok["tokens"])
    r = server.post_json("/detokenize", {"tokens": tok["tokens"]})
    assert r.status == 200, r
    assert text in r.json()["prompt"]
    # messages render the chat template: more tokens than the bare text
    r = server.post_json("/tokenize", {"messages": [{"role": "user", "content": text}]})
    assert r.status == 200, r
    msg = r.json()
    assert msg["count"] == len(msg["tokens"]) > tok["count"]


def test_metrics_names(server):
    m = server.metrics()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count"):
        assert name in m.names(), f"{name} missing from /metrics:\n{m.text[:2000]}"
        for labels in m.labels_of(name):
            assert labels.get("model_name"), (name, labels)
    r = server.request("GET", "/metrics")
    assert r.header("Content-Type", "").startswith("text/plain"), r.headers
    # histogram buckets are cumulative and end with +Inf == _count
    buckets = [(lab["le"], v) for n, lab, v in m.samples if n == "vllm:time_to_first_token_seconds_bucket"]
    assert buckets and buckets[-1][0] == "+Inf"
    vals = [v for _, v in buckets]
    assert vals == sorted(vals)
    assert vals[-1] == m.get("vllm:time_to_first_token_seconds_count")


def test_metrics_counters_increase(server, client, model_name):
    before = server.metrics()
    nonce = uuid.uuid4().hex[:8]
    r = chat(client, model_name, messages=[{"role": "user", "content": f"Say {nonce}."}],
             max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    after = server.metrics()
    assert r.usage.completion_tokens == 8
    d_prompt = after.get("vllm:prompt_tokens_total") - before.get("vllm:prompt_tokens_total")
    d_gen = after.get("vllm:generation_tokens_total") - before.get("vllm:generation_tokens_total")
    d_ttft = (after.get("vllm:time_to_first_token_seconds_count")
              - before.get("vllm:time_to_first_token_seconds_count"))
    assert 1 <= d_prompt <= r.usage.prompt_tokens, (d_prompt, r.usage)
    assert d_gen >= r.usage.completion_tokens, (d_gen, r.usage)
    assert d_ttft >= 1
    assert after.get("vllm:num_requests_running") == 0


# --------------------------------------------------------------------------- chat / completions

def test_chat_non_stream(client, model_name):
    r = chat(client, model_name, temperature=0)
    assert r.object == "chat.completion"
    assert r.id and isinstance(r.created, int)
    assert r.model == model_name
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant"
    assert isinstance(c.message.content, str) and c.message.content
    assert c.finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 16
    assert u.prompt_tokens + u.completion_tokens == u.total_tokens


def test_chat_prompt_tokens_match_tokenize(server, client, model_name):
    r = chat(client, model_name, max_tokens=1, temperature=0)
    tok = server.post_json("/tokenize", {"messages": CHAT, "add_generation_prompt": True}).json()
    assert r.usage.prompt_tokens == tok["count"]


def test_completion_non_stream(server, client, model_name):
    r = complete(client, model_name, temperature=0)
    assert r.object == "text_completion"
    assert r.id and isinstance(r.created, int) and r.model == model_name
    assert len(r.choices) == 1 and r.choices[0].index == 0
    assert isinstance(r.choices[0].text, str) and r.choices[0].text
    assert r.choices[0].finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens + u.completion_tokens == u.total_tokens
    assert u.prompt_tokens == server.post_json("/tokenize", {"prompt": PROMPT}).json()["count"]


def test_completion_prompt_forms(server, client, model_name):
    ids = server.post_json("/tokenize", {"prompt": PROMPT}).json()["tokens"]
    a = complete(client, model_name, prompt=PROMPT, max_tokens=8, temperature=0)
    b = complete(client, model_name, prompt=ids, max_tokens=8, temperature=0)
    assert b.choices[0].text == a.choices[0].text
    assert b.usage.prompt_tokens == len(ids)
    c = complete(client, model_name, prompt=[PROMPT], max_tokens=8, temperature=0)
    assert c.choices[0].text == a.choices[0].text


def test_completion_batch(server, client, model_name):
    # a batch of prompts (strings and token ids): choice i is prompt i // n's choice i % n,
    # exactly what that prompt gets alone with the same seed; usage sums the prompts
    ids = server.post_json("/tokenize", {"prompt": "Once upon a time"}).json()["tokens"]
    prompts = [PROMPT, "The capital of France is", ids]
    kw = dict(max_tokens=6, temperature=0.9, seed=1234, n=2)
    r = server.post_json("/v1/completions", dict(model=model_name, prompt=prompts, **kw))
    assert r.status == 200, r
    batch = r.json()
    assert [c["index"] for c in batch["choices"]] == list(range(6))
    prompt_tokens = completion_tokens = 0
    for k, p in enumerate(prompts):
        alone = server.post_json("/v1/completions", dict(model=model_name, prompt=p, **kw)).json()
        assert [c["text"] for c in batch["choices"][2 * k:2 * k + 2]] == [c["text"] for c in alone["choices"]], k
        prompt_tokens += alone["usage"]["prompt_tokens"]
        completion_tokens += alone["usage"]["completion_tokens"]
    assert batch["usage"]["prompt_tokens"] == prompt_tokens
    assert batch["usage"]["completion_tokens"] == completion_tokens
    # the official client, streamed: the pieces of each index add up to the same texts
    stream = client.completions.create(model=model_name, prompt=prompts[:2], stream=True, **kw)
    texts = {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert [texts[i] for i in range(4)] == [c["text"] for c in batch["choices"][:4]]
    # without a seed, equal prompts of a batch sample independently
    r = server.post_json("/v1/completions", {"model": model_name, "prompt": ["Write a random word:"] * 2,
                                             "max_tokens": 24, "temperature": 1.5, "ignore_eos": True})
    texts = [c["text"] for c in r.json()["choices"]]
    assert texts[0] != texts[1], texts
    # limits
    r = server.post_json("/v1/completions", {"model": model_name, "prompt": ["a"] * 33, "max_tokens": 1})
    assert r.status == 400 and "more than 32" in r.json()["error"]["message"], r
    r = server.post_json("/v1/completions", {"model": model_name, "prompt": ["a"] * 5, "n": 13, "max_tokens": 1})
    assert r.status == 400 and "more than 64" in r.json()["error"]["message"], r


def test_model_omitted_uses_default(server):
    r = server.post_json("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4})
    assert r.status == 200, r
    assert r.json()["choices"][0]["message"]["role"] == "assistant"


def test_unknown_model_404(server, client):
    with pytest.raises(openai.NotFoundError) as ei:
        chat(client, "no-such-model")
    assert ei.value.status_code == 404
    assert ei.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        complete(client, "no-such-model")
    r = server.post_json("/v1/completions", {"model": "no-such-model", "prompt": "x"})
    check_error(r, 404, code="model_not_found")


def test_max_tokens_length(client, model_name):
    r = complete(client, model_name, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12
    r = chat(client, model_name, max_tokens=None, max_completion_tokens=10, temperature=0,
             extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 10


def test_n_choices(client, model_name):
    r = chat(client, model_name, n=2, max_tokens=6, temperature=0.8, seed=7,
             extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1]
    for c in r.choices:
        assert c.finish_reason == "length" and c.message.content
    assert r.usage.completion_tokens == 12  # summed over the choices
    r = complete(client, model_name, n=2, max_tokens=6, temperature=0.8,
                 extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert r.usage.completion_tokens == 12


def _stop_from(text):
    """A stop string from the middle of text that occurs there for the first time."""
    for start in range(len(text) // 3, len(text) - 3):
        s = text[start:start + 3]
        if s.strip() and text.index(s) == start:
            return s
    return None


def test_stop_string(client, model_name):
    base = complete(client, model_name, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    text = base.choices[0].text
    stop = _stop_from(text)
    assert stop, f"no usable stop string in {text!r}"
    want = text[: text.index(stop)]
    r = complete(client, model_name, max_tokens=24, temperature=0, stop=stop,
                 extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == want
    assert stop not in r.choices[0].text
    # as a list, and streamed: the stop string never leaks into a delta
    s = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=24, temperature=0,
                                  stop=["\u2603never", stop], stream=True,
                                  extra_body={"ignore_eos": True})
    chunks = list(s)
    got = "".join(c.choices[0].text for c in chunks if c.choices)
    assert got == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_stop_string_chat(client, model_name):
    base = chat(client, model_name, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    text = base.choices[0].message.content
    stop = _stop_from(text)
    assert stop, f"no usable stop string in {text!r}"
    r = chat(client, model_name, max_tokens=24, temperature=0, stop=[stop],
             extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text[: text.index(stop)]


def test_seed_reproducible(client, model_name):
    kw = dict(max_tokens=16, temperature=0.8, extra_body={"ignore_eos": True})
    a = chat(client, model_name, seed=1234, **kw).choices[0].message.content
    b = chat(client, model_name, seed=1234, **kw).choices[0].message.content
    assert a == b
    others = {chat(client, model_name, seed=s, **kw).choices[0].message.content for s in (1, 2, 3, 4)}
    others.add(a)
    assert len(others) >= 2, others
    c = complete(client, model_name, seed=99, **kw).choices[0].text
    d = complete(client, model_name, seed=99, **kw).choices[0].text
    assert c == d


def test_chat_logprobs(client, model_name):
    r = chat(client, model_name, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3,
             extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    for t in content:
        assert isinstance(t.token, str)
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 3
        lps = [x.logprob for x in t.top_logprobs]
        assert lps == sorted(lps, reverse=True), lps
        assert all(lp <= 0 for lp in lps)
        # greedy: the chosen token is the most likely one
        assert abs(t.logprob - lps[0]) < 1e-3, (t.logprob, lps)
    # without logprobs there are none
    r = chat(client, model_name, max_tokens=2, temperature=0)
    assert r.choices[0].logprobs is None


def test_completion_logprobs(client, model_name):
    r = complete(client, model_name, max_tokens=5, temperature=0, logprobs=2,
                 extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(x <= 0 for x in lp.token_logprobs)
    for top, chosen in zip(lp.top_logprobs, lp.token_logprobs):
        assert 2 <= len(top) <= 3  # may also hold the sampled token
        assert all(v <= 0 for v in top.values())
        assert abs(max(top.values()) - chosen) < 1e-3


def test_chat_stream_equals_non_stream(client, model_name):
    want = chat(client, model_name, max_tokens=24, temperature=0).choices[0].message.content
    s = chat(client, model_name, max_tokens=24, temperature=0, stream=True,
             stream_options={"include_usage": True})
    chunks = list(s)
    assert len({c.id for c in chunks}) == 1
    assert len({c.created for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    u = chunks[-1].usage
    assert u.prompt_tokens + u.completion_tokens == u.total_tokens
    fins = [c.choices[0].finish_reason for c in chunks[:-1]]
    assert fins[-1] in ("stop", "length") and all(f is None for f in fins[:-1])
    got = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert got == want


def test_completion_stream_equals_non_stream(client, model_name):
    want = complete(client, model_name, max_tokens=24, temperature=0).choices[0].text
    s = complete(client, model_name, max_tokens=24, temperature=0, stream=True,
                 stream_options={"include_usage": True})
    chunks = list(s)
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    got = "".join(c.choices[0].text for c in chunks if c.choices)
    assert got == want


def test_stream_without_usage_has_no_usage_chunk(client, model_name):
    chunks = list(chat(client, model_name, max_tokens=4, temperature=0, stream=True))
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


# --------------------------------------------------------------------------- wire format

SSE_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


def _check_sse_headers(res):
    assert res.status == 200, res.body[:500]
    assert res.header("Content-Type", "").split(";")[0].strip() == "text/event-stream", res.headers
    assert res.header("Cache-Control") == "no-cache", res.headers
    assert res.header("X-Accel-Buffering") == "no", res.headers


def test_raw_chat_stream_framing(server, model_name):
    body = {"model": model_name, "messages": CHAT, "max_tokens": 12, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    res = stream_request(server.host, server.port, "/v1/chat/completions", body, headers=SSE_HEADERS)
    _check_sse_headers(res)
    text = res.body.decode("utf-8")
    assert "event:" not in text
    sse = parse_sse(res.body)
    events = sse.json_events()
    texts, finish, usage = check_chat_stream(events, n=1, include_usage=True)
    assert finish == {0: "length"}
    assert usage["completion_tokens"] == 12
    assert usage["prompt_tokens"] + usage["completion_tokens"] == usage["total_tokens"]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    # every event is exactly "data: <json>\n\n" (comments aside)
    for ev in text.split("\n\n")[:-1]:
        assert ev.startswith("data: ") or ev.startswith(":"), ev


def test_raw_completion_stream_framing(server, model_name):
    body = {"model": model_name, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    res = stream_request(server.host, server.port, "/v1/completions", body)
    _check_sse_headers(res)
    events = parse_sse(res.body).json_events()
    texts, finish, usage = check_completion_stream(events, n=1, include_usage=True)
    assert finish == {0: "length"} and usage["completion_tokens"] == 8


def test_raw_stream_n2(server, model_name):
    body = {"model": model_name, "messages": CHAT, "max_tokens": 6, "n": 2, "temperature": 0.7,
            "seed": 3, "stream": True, "ignore_eos": True}
    res = stream_request(server.host, server.port, "/v1/chat/completions", body)
    _check_sse_headers(res)
    texts, finish, _ = check_chat_stream(parse_sse(res.body).json_events(), n=2)
    assert finish == {0: "length", 1: "length"}
    assert texts[0] and texts[1]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_continuous_usage_stats(server, model_name, path):
    """vLLM's stream_options.continuous_usage_stats: every chunk carries its choice's usage
    so far; the counts grow to the final usage chunk's; only with include_usage."""
    body = {"model": model_name, "max_tokens": 10, "n": 2, "temperature": 0.7, "seed": 5, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    body.update({"messages": CHAT} if "chat" in path else {"prompt": PROMPT})
    events = parse_sse(stream_request(server.host, server.port, path, body).body).json_events()
    final = events[-1]["usage"]
    assert events[-1]["choices"] == [] and final["completion_tokens"] == 20
    seen = {0: [], 1: []}
    for ev in events[:-1]:
        u, (ch,) = ev["usage"], ev["choices"]
        assert u["prompt_tokens"] == final["prompt_tokens"]  # one prompt, counted once per choice
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        seen[ch["index"]].append(u["completion_tokens"])
    for counts in seen.values():
        assert counts == sorted(counts) and counts[-1] == 10 and counts[0] < 10, counts
    if "chat" in path:
        assert seen[0][0] == 0  # the role chunk, before any token
    # without include_usage it asks for nothing
    body["stream_options"] = {"continuous_usage_stats": True}
    events = parse_sse(stream_request(server.host, server.port, path, body).body).json_events()
    assert all("usage" not in ev or ev["usage"] is None for ev in events)
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": "yes"}
    check_error(server.post_json(path, body), 400, param="stream_options.continuous_usage_stats")


def test_stream_arrives_incrementally(server, model_name):
    body = {"model": model_name, "prompt": "Once upon a time", "max_tokens": 64, "temperature": 0,
            "stream": True, "ignore_eos": True}
    res = stream_request(server.host, server.port, "/v1/completions", body)
    _check_sse_headers(res)
    parse_sse(res.body)
    timed = [(t, ev) for t, ev in res.event_times() if ev.startswith("data: ")]
    content_times = [t for t, ev in timed if ev != "data: [DONE]\n\n" and json.loads(ev[6:])["choices"]
                     and json.loads(ev[6:])["choices"][0]["text"]]
    t_done = timed[-1][0]
    assert len(content_times) >= 10
    # the text did not arrive in one piece at the end: many distinct arrival moments (one
    # per recv() that brought data), and the first content event came in the first half
    # of the request's lifetime (64 decode steps follow it)
    distinct = len(set(content_times))
    assert distinct >= 8, f"only {distinct} distinct arrival times: {content_times}"
    assert content_times[0] < t_done
    assert content_times[0] < 0.5 * t_done, (content_times[0], t_done)


def test_curl_streams_incrementally(server, model_name):
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl not installed")
    body = json.dumps({"model": model_name, "messages": CHAT, "max_tokens": 48, "temperature": 0,
                       "stream": True, "ignore_eos": True})
    p = subprocess.Popen([curl, "-sS", "-N", "--max-time", "120", "-H", "Content-Type: application/json",
                          "-d", body, f"{server.base_url}/v1/chat/completions"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pieces = []
    start = time.monotonic()
    fd = p.stdout.fileno()
    while True:
        d = os.read(fd, 65536)
        if not d:
            break
        pieces.append((time.monotonic() - start, d))
    err = p.stderr.read()
    assert p.wait(timeout=30) == 0, err
    out = b"".join(d for _, d in pieces)
    sse = parse_sse(out)
    texts, finish, _ = check_chat_stream(sse.json_events())
    assert finish == {0: "length"} and texts[0]
    assert len({round(t, 4) for t, _ in pieces}) >= 5, [t for t, _ in pieces]


def test_curl_non_stream(server, model_name):
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl not installed")
    body = json.dumps({"model": model_name, "prompt": PROMPT, "max_tokens": 4})
    out = subprocess.run([curl, "-sS", "-i", "-H", "Content-Type: application/json", "-d", body,
                          f"{server.base_url}/v1/completions"], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    head, _, payload = out.stdout.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"application/json" in head.lower()
    assert json.loads(payload)["object"] == "text_completion"


def test_keepalive_connection_reuse(server, model_name):
    """Two requests on one HTTP/1.1 keep-alive connection (the openai client does this)."""
    from server_util import HttpConn
    c = HttpConn(server.host, server.port)
    try:
        for _ in range(2):
            body = json.dumps({"model": model_name, "prompt": PROMPT, "max_tokens": 2}).encode()
            c.send_request("POST", "/v1/completions", body=body, headers={"Connection": "keep-alive"})
            status, _, hdrs, _ = c.read_head()
            data = b"".join(d for _, d in c.iter_body(hdrs, method="POST", status=status))
            assert status == 200, data
            assert json.loads(data)["object"] == "text_completion"
    finally:
        c.close()


# --------------------------------------------------------------------------- aliases

ALIASES = ("smol", "smol-chat")


@pytest.fixture(scope="module")
def alias_server(tessera_bin, default_model):
    # the model as a positional argument, two served names
    with run_server(tessera_bin, default_model, "--served-model-name", ALIASES[0],
                    "--served-model-name", ALIASES[1], "--max-model-len", 256,
                    positional_model=True) as srv:
        yield srv


def test_served_model_name_aliases(alias_server):
    ids = [m["id"] for m in alias_server.get_json("/v1/models")["data"]]
    assert ids[0] == ALIASES[0]
    assert set(ids) <= set(ALIASES)
    client = openai.OpenAI(base_url=f"{alias_server.base_url}/v1", api_key="x", max_retries=0)
    for name in ALIASES:
        r = client.chat.completions.create(model=name, messages=CHAT, max_tokens=4, temperature=0)
        assert r.model in ALIASES
        assert r.choices[0].message.content is not None
    with pytest.raises(openai.NotFoundError) as ei:
        client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1.gguf-nope", messages=CHAT,
                                       max_tokens=4)
    assert ei.value.code == "model_not_found"
    m = alias_server.metrics()
    assert {lab.get("model_name") for lab in m.labels_of("vllm:num_requests_running")} <= set(ALIASES)


# --------------------------------------------------------------------------- API keys

@pytest.fixture(scope="module")
def auth_server(tessera_bin, default_model):
    args = []
    for k in API_KEYS:
        args += ["--api-key", k]
    with run_server(tessera_bin, default_model, "--max-model-len", 256, *args) as srv:
        yield srv


def test_auth_rejects(auth_server):
    for hdrs in ({}, {"Authorization": "Bearer wrong"}, {"X-Api-Key": "wrong"},
                 {"Authorization": API_KEYS[0]}, {"Authorization": "Basic " + API_KEYS[0]},
                 {"Authorization": "Bearer " + API_KEYS[0] + "x"},
                 {"Authorization": "Bearer " + API_KEYS[0][:-1]}):
        r = auth_server.request("GET", "/v1/models", headers=hdrs)
        check_error(r, 401, type_="authentication_error", code="invalid_api_key")
        r = auth_server.post_json("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1},
                                  headers=hdrs)
        check_error(r, 401, type_="authentication_error", code="invalid_api_key")


def test_auth_accepts(auth_server):
    for k in API_KEYS:
        for hdrs in ({"Authorization": f"Bearer {k}"}, {"X-Api-Key": k}):
            r = auth_server.request("GET", "/v1/models", headers=hdrs)
            assert r.status == 200, r
            r = auth_server.post_json("/tokenize", {"prompt": "hi"}, headers=hdrs)
            assert r.status == 200, r


def test_auth_public_endpoints(auth_server):
    assert auth_server.request("GET", "/health").status == 200
    assert auth_server.request("GET", "/metrics").status == 200


def test_auth_openai_client(auth_server):
    good = openai.OpenAI(base_url=f"{auth_server.base_url}/v1", api_key=API_KEYS[1], max_retries=0)
    name = good.models.list().data[0].id
    r = good.chat.completions.create(model=name, messages=CHAT, max_tokens=4, temperature=0)
    assert r.choices[0].message.content is not None
    chunks = list(good.chat.completions.create(model=name, messages=CHAT, max_tokens=4, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    bad = openai.OpenAI(base_url=f"{auth_server.base_url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as ei:
        bad.chat.completions.create(model=name, messages=CHAT, max_tokens=4)
    assert ei.value.status_code == 401 and ei.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=name, messages=CHAT, max_tokens=4, stream=True)


def test_cors_browser_client(tessera_bin, default_model):
    # --allowed-origins in vLLM's JSON form: the preflight needs no key, a streamed answer
    # and a 401 both name the origin; another origin gets neither
    origin = "http://localhost:3000"
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN,
                    "--allowed-origins", json.dumps([origin]), "--api-key", "sk-cors") as srv:
        pre = {"Origin": origin, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization, content-type"}
        r = srv.request("OPTIONS", "/v1/chat/completions", headers=pre)
        assert r.status == 204, r
        assert r.header("Access-Control-Allow-Origin") == origin
        assert r.header("Access-Control-Allow-Methods") == "POST"
        assert r.header("Access-Control-Allow-Headers") == "authorization, content-type"
        r = srv.request("OPTIONS", "/v1/chat/completions", headers=dict(pre, Origin="http://evil.example"))
        assert r.status == 403 and r.json()["error"]["code"] == "cors_not_allowed", r
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
        r = srv.post_json("/v1/chat/completions", body, headers={"Origin": origin})
        assert r.status == 401 and r.header("Access-Control-Allow-Origin") == origin, r
        r = srv.post_json("/v1/chat/completions", body,
                          headers={"Origin": origin, "Authorization": "Bearer sk-cors"})
        assert r.status == 200 and r.header("Access-Control-Allow-Origin") == origin, r
        assert r.header("Vary") == "Origin" and b"data: [DONE]" in r.body
        r = srv.post_json("/v1/chat/completions", body,
                          headers={"Origin": "http://evil.example", "Authorization": "Bearer sk-cors"})
        assert r.status == 200 and r.header("Access-Control-Allow-Origin") is None
        # a browser sends the preflight and then its request on one keep-alive connection
        from server_util import HttpConn
        c = HttpConn(srv.host, srv.port)
        try:
            c.send_request("OPTIONS", "/v1/chat/completions", headers={**pre, "Connection": "keep-alive"})
            status, _, hdrs, _ = c.read_head()
            assert status == 204 and not any(k.lower() == "connection" and v.lower() == "close"
                                             for k, v in hdrs), hdrs
            list(c.iter_body(hdrs, method="OPTIONS", status=status))
            c.send_request("POST", "/v1/chat/completions", body=json.dumps(dict(body, stream=False)).encode(),
                           headers={"Origin": origin, "Authorization": "Bearer sk-cors", "Connection": "keep-alive"})
            status, _, hdrs, _ = c.read_head()
            data = b"".join(d for _, d in c.iter_body(hdrs, method="POST", status=status))
            assert status == 200 and json.loads(data)["object"] == "chat.completion", data
        finally:
            c.close()


def test_continue_final_message(server, client, model_name, default_model):
    # the prompt ends right after the final assistant message, as Hugging Face cuts it
    # (jinja2 rendering of the GGUF's template as the reference), and the model continues
    # that message: the same greedy text as /v1/completions on the same token ids
    import gguf
    from hf_templates import render
    reader = gguf.GGUFReader(str(default_model))
    field = reader.fields["tokenizer.chat_template"]
    template = bytes(field.parts[field.data[0]]).decode("utf-8")
    messages = [{"role": "user", "content": "Tell me about the sea."},
                {"role": "assistant", "content": "The sea is"}]
    ok, ref = render(template, dict(messages=messages, add_generation_prompt=False, tools=None, documents=None,
                                    bos_token="<|im_start|>", eos_token="<|im_end|>"))
    assert ok
    want = ref[:ref.rindex("The sea is") + len("The sea is")]
    ids = server.post_json("/tokenize", {"messages": messages, "continue_final_message": True}).json()["tokens"]
    assert server.post_json("/detokenize", {"tokens": ids}).json()["prompt"] == want
    chat = client.chat.completions.create(model=model_name, messages=messages, max_tokens=8, temperature=0,
                                          extra_body={"continue_final_message": True})
    plain = complete(client, model_name, prompt=ids, max_tokens=8, temperature=0)
    assert chat.choices[0].message.content == plain.choices[0].text
    r = server.post_json("/v1/chat/completions", {"messages": messages, "continue_final_message": True,
                                                  "add_generation_prompt": True})
    check_error(r, 400, "invalid_request_error", param="continue_final_message")


def test_stop_token_ids_and_include_stop_str(server, client, model_name):
    # vLLM's stop_token_ids (the token's text is not output) and include_stop_str_in_output,
    # against the same greedy text without them
    prompt, kw = "One, two, three, four,", dict(max_tokens=12, temperature=0)
    base = complete(client, model_name, prompt=prompt, **kw).choices[0].text
    assert "," in base and " six" in base, base
    comma = server.post_json("/tokenize", {"prompt": ",", "add_special_tokens": False}).json()["tokens"]
    assert len(comma) == 1
    out = complete(client, model_name, prompt=prompt, extra_body={"stop_token_ids": comma}, **kw).choices[0]
    assert out.finish_reason == "stop" and out.text == base[:base.index(",")], (out.text, base)
    out = complete(client, model_name, prompt=prompt, stop=[" six"],
                   extra_body={"include_stop_str_in_output": True}, **kw).choices[0]
    assert out.finish_reason == "stop" and out.text == base[:base.index(" six") + 4], (out.text, base)
    r = server.post_json("/v1/completions", {"prompt": prompt, "stop_token_ids": [1] * 17})
    check_error(r, 400, "invalid_request_error", param="stop_token_ids")


def test_min_tokens(client, model_name):
    # vLLM's min_tokens: no end of generation before it; the text up to the natural end is
    # the same greedy text
    base = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=64, temperature=0)
    n = base.usage.completion_tokens
    assert base.choices[0].finish_reason == "stop" and n + 8 <= 64, base
    held = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=64, temperature=0,
                                          extra_body={"min_tokens": n + 8})
    assert held.usage.completion_tokens >= n + 8, held.usage
    assert held.choices[0].message.content.startswith(base.choices[0].message.content)


def test_completion_echo(server, client, model_name):
    # echo: the prompt text, then the same completion as without echo; streamed the prompt
    # is each choice's first chunk
    kw = dict(prompt=PROMPT, max_tokens=6, temperature=0)
    plain = complete(client, model_name, **kw).choices[0].text
    echoed = complete(client, model_name, echo=True, **kw)
    assert echoed.choices[0].text == PROMPT + plain
    assert echoed.usage.completion_tokens == 6
    chunks = [c.choices[0].text for c in complete(client, model_name, echo=True, stream=True, **kw)]
    assert chunks[0] == PROMPT and "".join(chunks) == PROMPT + plain
    ids = server.post_json("/tokenize", {"prompt": PROMPT, "add_special_tokens": False}).json()["tokens"]
    r = server.post_json("/v1/completions", {"model": model_name, "prompt": ids, "max_tokens": 6, "temperature": 0,
                                             "echo": True})
    assert r.json()["choices"][0]["text"] == PROMPT + plain
    # max_tokens 0 is the prompt alone, and only with echo
    r = server.post_json("/v1/completions", {"prompt": PROMPT, "echo": True, "max_tokens": 0})
    c = r.json()["choices"][0]
    assert (c["text"], c["finish_reason"], r.json()["usage"]["completion_tokens"]) == (PROMPT, "length", 0)
    r = server.post_json("/v1/completions", {"prompt": PROMPT, "max_tokens": 0})
    check_error(r, 400, "invalid_request_error", param="max_tokens")


def _log_softmax(x):
    import numpy as np
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


SCORED_TEXT = "The quick brown fox jumps over the lazy dog because it wanted to see the river."


def _reference_logprobs(server, tessera_bin, default_model, tmp_path, text):
    """text's ids (the server's tokenizer, no specials) and the log-softmax of `tessera
    logits` over them: row i is the distribution of the token after ids[:i + 1] (one
    forward of the whole prompt on the CLI, f16 KV as the server's)."""
    import numpy as np
    ids = server.post_json("/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"]
    out = tmp_path / "logits.bin"
    subprocess.run([str(tessera_bin), "logits", "--model", str(default_model), "--tokens", ",".join(map(str, ids)),
                    "--out", str(out), "--threads", "2", "--kv-dtype", "f16"], check=True, capture_output=True)
    return ids, _log_softmax(np.fromfile(out, dtype="<f4").reshape(len(ids), -1))


def test_completion_echo_logprobs(server, client, model_name, tessera_bin, default_model, tmp_path):
    # echo with logprobs scores the prompt (lm-evaluation-harness's loglikelihood requests):
    # the prompt's tokens first, the first with null logprobs, each other one with its
    # logprob given the tokens before it — the log-softmax of `tessera logits` over the same
    # ids (an independent path: one forward of the whole prompt, on the CLI; f16 KV as the
    # server's)
    import numpy as np
    text = SCORED_TEXT
    ids, ref = _reference_logprobs(server, tessera_bin, default_model, tmp_path, text)
    r = complete(client, model_name, prompt=text, max_tokens=0, echo=True, logprobs=3, temperature=0)
    c = r.choices[0]
    assert c.text == text and c.finish_reason == "length" and r.usage.completion_tokens == 0
    lp = c.logprobs
    assert len(lp.tokens) == len(ids) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    toks = [server.post_json("/detokenize", {"tokens": [t]}).json()["prompt"] for t in ids]
    assert lp.tokens == toks
    assert lp.text_offset == [sum(len(t) for t in toks[:i]) for i in range(len(toks))]
    for i in range(1, len(ids)):
        want = ref[i - 1, ids[i]]
        assert abs(lp.token_logprobs[i] - want) < 2e-3, (i, lp.token_logprobs[i], want)
        top = lp.top_logprobs[i]
        best = np.argsort(-ref[i - 1])[:3]
        assert abs(max(top.values()) - ref[i - 1, best[0]]) < 2e-3, (i, top)
        assert toks[i] in top and len(top) in (3, 4), (i, top)
    # streamed: the prompt's chunk carries the same logprobs, then the generated tokens
    # follow with theirs; the whole equals the non-streamed answer
    whole = complete(client, model_name, prompt=text, max_tokens=4, echo=True, logprobs=1, temperature=0)
    chunks = list(complete(client, model_name, prompt=text, max_tokens=4, echo=True, logprobs=1, temperature=0,
                           stream=True))
    assert chunks[0].choices[0].text == text and chunks[0].choices[0].logprobs.token_logprobs[0] is None
    got = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for ch in chunks:
        if ch.choices and ch.choices[0].logprobs:
            for k in got:
                got[k] += getattr(ch.choices[0].logprobs, k)
    wl = whole.choices[0].logprobs
    assert got == {"tokens": wl.tokens, "token_logprobs": wl.token_logprobs, "text_offset": wl.text_offset}
    assert len(wl.tokens) == len(ids) + 4 and wl.token_logprobs[1:len(ids)] == lp.token_logprobs[1:]
    # lm-evaluation-harness's request: token-id prompts in a batch, max_tokens 1, logprobs 1
    ctx, cont = ids[:8], ids[8:]
    r = server.post_json("/v1/completions", {"model": model_name, "prompt": [ids, ctx], "max_tokens": 1,
                                             "echo": True, "logprobs": 1, "temperature": 0, "seed": 1234})
    chs = sorted(r.json()["choices"], key=lambda x: x["index"])
    assert [len(x["logprobs"]["tokens"]) for x in chs] == [len(ids) + 1, len(ctx) + 1]
    loglik = sum(chs[0]["logprobs"]["token_logprobs"][len(ctx):-1])
    assert abs(loglik - sum(ref[i - 1, ids[i]] for i in range(len(ctx), len(ids)))) < 1e-2
    assert chs[1]["logprobs"]["token_logprobs"][1:-1] == chs[0]["logprobs"]["token_logprobs"][1:len(ctx)]
    assert len(cont) > 0


def test_vllm_prompt_logprobs(server, model_name, tessera_bin, default_model, tmp_path):
    """vLLM's prompt_logprobs field: null for the first prompt token, then per token
    {"id": {logprob, rank, decoded_token}} for the token and its top k alternatives
    (ranks 1..k). The logprobs and ranks against the log-softmax of `tessera logits` over
    the same ids (f16 KV as the server's; a rank within the ids whose reference logprob is
    within 2e-3 of the token's); the same numbers as the echo + logprobs route; chat puts
    the list at the response's top level; stream and k > 20 are refused."""
    import numpy as np
    text = SCORED_TEXT
    ids, ref = _reference_logprobs(server, tessera_bin, default_model, tmp_path, text)
    k = 3
    r = server.post_json("/v1/completions", {"model": model_name, "prompt": ids, "max_tokens": 1,
                                             "temperature": 0, "prompt_logprobs": k})
    assert r.status == 200, r.body[:300]
    c = r.json()["choices"][0]
    plp = c["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None and c["logprobs"] is None
    for i in range(1, len(ids)):
        entry, tok, row = plp[i], ids[i], ref[i - 1]
        assert str(tok) == next(iter(entry)), (i, entry)  # the prompt token first
        me = entry[str(tok)]
        assert abs(me["logprob"] - row[tok]) < 2e-3, (i, me, row[tok])
        lo, hi = int((row >= row[tok] + 2e-3).sum()) + 1, int((row >= row[tok] - 2e-3).sum())
        assert lo <= me["rank"] <= hi, (i, me["rank"], lo, hi)
        assert me["decoded_token"] == server.post_json("/detokenize", {"tokens": [tok]}).json()["prompt"]
        # the top k: the alternatives, and the token itself when it is one of them
        alts = {int(t): v for t, v in entry.items() if int(t) != tok}
        in_top = len(entry) == k
        assert len(entry) in (k, k + 1), (i, entry)
        ranks = sorted([v["rank"] for v in alts.values()] + ([me["rank"]] if in_top else []))
        assert ranks == list(range(1, k + 1)), (i, entry)
        top1 = [v["logprob"] for v in entry.values() if v["rank"] == 1][0]
        assert abs(top1 - row.max()) < 2e-3, (i, top1, row.max())
        lps = [v["logprob"] for v in sorted(entry.values(), key=lambda v: v["rank"])]
        assert lps == sorted(lps, reverse=True), (i, entry)
    # the same numbers as the echo route
    e = server.post_json("/v1/completions", {"model": model_name, "prompt": ids, "max_tokens": 0, "echo": True,
                                             "logprobs": 1}).json()["choices"][0]["logprobs"]
    assert e["token_logprobs"][1:] == [plp[i][str(ids[i])]["logprob"] for i in range(1, len(ids))]
    # chat: at the top level, over the rendered prompt
    r = server.post_json("/v1/chat/completions", {"model": model_name, "max_tokens": 1, "prompt_logprobs": 0,
                                                  "messages": [{"role": "user", "content": "hi"}]}).json()
    assert len(r["prompt_logprobs"]) == r["usage"]["prompt_tokens"] and r["prompt_logprobs"][0] is None
    assert all(len(x) == 1 and next(iter(x.values()))["rank"] >= 1 for x in r["prompt_logprobs"][1:])
    check_error(server.post_json("/v1/completions", {"model": model_name, "prompt": text, "prompt_logprobs": 1,
                                                     "stream": True}), 400, "invalid_request_error",
                param="prompt_logprobs")
    check_error(server.post_json("/v1/completions", {"model": model_name, "prompt": text, "prompt_logprobs": 21}),
                400, "invalid_request_error", param="prompt_logprobs")


def test_bad_words(server, client, model_name):
    # vLLM's bad_words: a word of the greedy answer never appears in the answer with it
    # banned (its tokens as a word of its own, after a space); on chat too
    kw = dict(prompt="The capital of France is", max_tokens=12, temperature=0)
    plain = complete(client, model_name, **kw).choices[0].text
    assert " Paris" in plain, plain
    banned = complete(client, model_name, extra_body={"bad_words": ["Paris"]}, **kw).choices[0].text
    assert "Paris" not in banned and banned != plain, banned
    streamed = "".join(c.choices[0].text for c in complete(client, model_name, stream=True,
                                                            extra_body={"bad_words": ["Paris"]}, **kw))
    assert streamed == banned
    msgs = [{"role": "user", "content": "What is the capital of France? One word."}]
    answer = chat(client, model_name, messages=msgs, temperature=0).choices[0].message.content
    word = answer.strip().split()[0].strip(".,!")
    other = chat(client, model_name, messages=msgs, temperature=0,
                 extra_body={"bad_words": [word]}).choices[0].message.content
    assert word not in other.split() and other != answer, (word, other)
    r = server.post_json("/v1/completions", {"prompt": "x", "bad_words": [""]})
    check_error(r, 400, "invalid_request_error", param="bad_words")


def test_truncate_prompt_tokens(server, client, model_name):
    # vLLM's truncate_prompt_tokens: the prompt's last k tokens, exactly as if sent alone
    text = "The quick brown fox jumps over the lazy dog and runs into the old forest near the river"
    ids = server.post_json("/tokenize", {"prompt": text}).json()["tokens"]
    k = 6
    kw = dict(max_tokens=8, temperature=0)
    cut = complete(client, model_name, prompt=text, extra_body={"truncate_prompt_tokens": k}, **kw)
    alone = complete(client, model_name, prompt=ids[-k:], **kw)
    assert cut.choices[0].text == alone.choices[0].text and cut.usage.prompt_tokens == k
    msgs = [{"role": "user", "content": text}]
    r = chat(client, model_name, messages=msgs, extra_body={"truncate_prompt_tokens": 5}, **kw)
    assert r.usage.prompt_tokens == 5
    r = server.post_json("/v1/completions", {"prompt": text, "truncate_prompt_tokens": 0})
    check_error(r, 400, "invalid_request_error", param="truncate_prompt_tokens")


def test_allowed_token_ids(server, client, model_name):
    # vLLM's allowed_token_ids: every generated token is one of them
    allowed = server.post_json("/tokenize", {"prompt": " yes no", "add_special_tokens": False}).json()["tokens"]
    out = complete(client, model_name, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=7, logprobs=0,
                   extra_body={"allowed_token_ids": allowed})
    toks = out.choices[0].logprobs.tokens
    assert len(toks) == 8 and set(toks) <= {" yes", " no"}, toks


def test_constraints_that_leave_no_token_are_400(server, model_name):
    """Constraints that together allow no token are the request's error, not the server's:
    400 invalid_request_error naming them (a 500 before), streamed as an error event and
    [DONE]. min_tokens masks the end token that allowed_token_ids alone allows; a JSON
    grammar's first token cannot be " yes"."""
    eos = [2]  # SmolLM2's <|im_end|>, its end-of-sequence token
    assert server.post_json("/detokenize", {"tokens": eos}).json()["prompt"] == "<|im_end|>"
    yes = server.post_json("/tokenize", {"prompt": " yes", "add_special_tokens": False}).json()["tokens"]
    cases = [("/v1/completions", {"prompt": PROMPT, "max_tokens": 5, "allowed_token_ids": eos, "min_tokens": 3}),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                                       "allowed_token_ids": yes, "response_format": {"type": "json_object"}})]
    for path, body in cases:
        e = check_error(server.post_json(path, {"model": model_name, **body}), 400, "invalid_request_error")
        assert "no token satisfies the request's constraints" in e["message"], e
        res = stream_request(server.host, server.port, path, {"model": model_name, **body, "stream": True})
        events = parse_sse(res.body).json_events()
        assert res.status == 200 and events[-1]["error"]["type"] == "invalid_request_error", events
    # the server is fine afterwards
    assert server.post_json("/v1/completions", {"model": model_name, "prompt": PROMPT, "max_tokens": 2}).status == 200

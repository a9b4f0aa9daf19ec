"""`tessera serve` against bad input, over raw HTTP: every case gets its status and an
OpenAI error body {"error":{"message","type","param","code"}} (except the few answered
before a request exists, such as an oversized header), and after the whole matrix the
same server still answers a normal chat request correctly."""
import json

import pytest

from server_util import check_error, run_server

MAX_BODY = 65536
MAX_MODEL_LEN = 256
API_KEY = "sk-bad-input-test"
INVALID = "invalid_request_error"
CHAT = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def server(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN,
                    "--max-body-bytes", MAX_BODY) as srv:
        yield srv


@pytest.fixture(scope="module")
def auth_server(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN,
                    "--api-key", API_KEY) as srv:
        yield srv


def chat_body(**kw):
    b = {"messages": CHAT, "max_tokens": 4}
    b.update(kw)
    return json.dumps(b).encode()


def comp_body(**kw):
    b = {"prompt": "Hello", "max_tokens": 4}
    b.update(kw)
    return json.dumps(b).encode()


C = "/v1/chat/completions"
P = "/v1/completions"

# (id, path, body bytes, expected status, expected type, expected code, param or
#  param prefix ending in "*")
CASES = [
    # malformed / non-object JSON
    ("malformed-json", C, b'{"messages": [', 400, INVALID, None, None),
    ("truncated-string", C, b'{"messages": "abc', 400, INVALID, None, None),
    ("empty-body", C, b"", 400, INVALID, None, None),
    ("trailing-comma", C, b'{"messages": [{"role": "user", "content": "x"}],}', 400, INVALID, None, None),
    ("array-body", C, b"[]", 400, INVALID, None, None),
    ("string-body", C, b'"x"', 400, INVALID, None, None),
    ("number-body", C, b"1", 400, INVALID, None, None),
    ("null-body", C, b"null", 400, INVALID, None, None),
    ("array-body-completions", P, b"[]", 400, INVALID, None, None),
    ("deep-nesting", C, b"[" * 20000 + b"]" * 20000, 400, INVALID, None, None),
    ("deep-nesting-object", C, b'{"user":' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b',"messages":[]}',
     400, INVALID, None, None),
    # wrong types
    ("temperature-string", C, chat_body(temperature="hot"), 400, INVALID, None, "temperature"),
    ("n-string", C, chat_body(n="2"), 400, INVALID, None, "n"),
    ("messages-object", C, chat_body(messages={}), 400, INVALID, None, "messages*"),
    ("messages-string", C, chat_body(messages="hi"), 400, INVALID, None, "messages*"),
    ("stream-string", C, chat_body(stream="yes"), 400, INVALID, None, "stream"),
    ("max-tokens-string", C, chat_body(max_tokens="10"), 400, INVALID, None, "max_tokens"),
    ("max-tokens-float", C, chat_body(max_tokens=1.5), 400, INVALID, None, "max_tokens"),
    ("top-p-string", C, chat_body(top_p="x"), 400, INVALID, None, "top_p"),
    ("seed-string", C, chat_body(seed="x"), 400, INVALID, None, "seed"),
    ("stop-number", C, chat_body(stop=5), 400, INVALID, None, "stop*"),
    ("model-number", C, chat_body(model=5), 400, INVALID, None, "model"),
    ("prompt-object", P, comp_body(prompt={"a": 1}), 400, INVALID, None, "prompt*"),
    ("prompt-missing", P, json.dumps({"max_tokens": 4}).encode(), 400, INVALID, None, "prompt*"),
    ("logit-bias-list", C, chat_body(logit_bias=[1, 2]), 400, INVALID, None, "logit_bias*"),
    ("logit-bias-bad-key", C, chat_body(logit_bias={"abc": 1}), 400, INVALID, None, "logit_bias*"),
    # messages
    ("messages-missing", C, json.dumps({"max_tokens": 4}).encode(), 400, INVALID, None, "messages*"),
    ("messages-empty", C, chat_body(messages=[]), 400, INVALID, None, "messages*"),
    ("message-no-content", C, chat_body(messages=[{"role": "user"}]), 400, INVALID, None, "messages*"),
    ("message-no-role", C, chat_body(messages=[{"content": "x"}]), 400, INVALID, None, "messages*"),
    ("message-unknown-role", C, chat_body(messages=[{"role": "wizard", "content": "x"}]), 400, INVALID,
     None, "messages*"),
    ("message-not-object", C, chat_body(messages=["hi"]), 400, INVALID, None, "messages*"),
    ("message-content-number", C, chat_body(messages=[{"role": "user", "content": 5}]), 400, INVALID,
     None, "messages*"),
    ("message-image-part", C, chat_body(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]), 400, INVALID, None, "messages*"),
    ("invalid-utf8", C, b'{"messages": [{"role": "user", "content": "\xff\xfe bad"}], "max_tokens": 4}',
     400, INVALID, None, None),
    ("invalid-utf8-overlong", C, b'{"messages": [{"role": "user", "content": "\xc0\xaf"}], "max_tokens": 4}',
     400, INVALID, None, None),
    ("invalid-utf8-prompt", P, b'{"prompt": "ab\xed\xa0\x80cd", "max_tokens": 4}', 400, INVALID, None, None),
    # ranges
    ("max-tokens-negative", C, chat_body(max_tokens=-1), 400, INVALID, None, "max_tokens"),
    ("max-tokens-zero", C, chat_body(max_tokens=0), 400, INVALID, None, "max_tokens"),
    ("max-completion-tokens-zero", C, json.dumps({"messages": CHAT, "max_completion_tokens": 0}).encode(),
     400, INVALID, None, "max_completion_tokens"),
    ("max-tokens-zero-completions", P, comp_body(max_tokens=0), 400, INVALID, None, "max_tokens"),
    ("n-zero", C, chat_body(n=0), 400, INVALID, None, "n"),
    ("n-17", C, chat_body(n=17), 400, INVALID, None, "n"),
    ("n-17-completions", P, comp_body(n=17), 400, INVALID, None, "n"),
    ("temperature-negative", C, chat_body(temperature=-1), 400, INVALID, None, "temperature"),
    ("top-logprobs-21", C, chat_body(logprobs=True, top_logprobs=21), 400, INVALID, None, "top_logprobs"),
    ("top-logprobs-negative", C, chat_body(logprobs=True, top_logprobs=-1), 400, INVALID, None,
     "top_logprobs"),
    ("completion-logprobs-6", P, comp_body(logprobs=6), 400, INVALID, None, "logprobs"),
    ("stop-five-strings", C, chat_body(stop=["a", "b", "c", "d", "e"]), 400, INVALID, None, "stop*"),
    ("token-id-out-of-vocab", P, comp_body(prompt=[1, 2, 99999999]), 400, INVALID, None, "prompt*"),
    ("token-id-negative", P, comp_body(prompt=[1, -5]), 400, INVALID, None, "prompt*"),
    ("prompt-too-long", P, comp_body(prompt="word " * 600), 400, INVALID, "context_length_exceeded", None),
    ("prompt-ids-too-long", P, comp_body(prompt=[100] * (MAX_MODEL_LEN + 10)), 400, INVALID,
     "context_length_exceeded", None),
    ("chat-too-long", C, chat_body(messages=[{"role": "user", "content": "word " * 600}]), 400, INVALID,
     "context_length_exceeded", None),
    ("chat-too-long-stream", C, chat_body(messages=[{"role": "user", "content": "word " * 600}], stream=True),
     400, INVALID, "context_length_exceeded", None),
    # invalid values on a streaming request are still a real status, not an SSE error
    ("stream-n-zero", C, chat_body(n=0, stream=True), 400, INVALID, None, "n"),
    # unknown model
    ("unknown-model", C, chat_body(model="no-such-model"), 404, None, "model_not_found", None),
    ("unknown-model-stream", C, chat_body(model="no-such-model", stream=True), 404, None,
     "model_not_found", None),
    ("unknown-model-completions", P, comp_body(model="no-such-model"), 404, None, "model_not_found", None),
    # the small POST endpoints
    ("tokenize-bad-json", "/tokenize", b"{", 400, INVALID, None, None),
    ("tokenize-no-prompt", "/tokenize", b"{}", 400, INVALID, None, None),
    ("detokenize-out-of-vocab", "/detokenize", json.dumps({"tokens": [99999999]}).encode(), 400, INVALID,
     None, None),
    ("detokenize-not-list", "/detokenize", json.dumps({"tokens": "abc"}).encode(), 400, INVALID, None, None),
]


@pytest.mark.parametrize("path,body,status,type_,code,param", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_body(server, path, body, status, type_, code, param):
    r = server.request("POST", path, body=body)
    kw = {}
    if param is not None:
        if param.endswith("*"):
            kw["param_prefix"] = param[:-1]
        else:
            kw["param"] = param
    check_error(r, status, type_=type_, code=code, **kw)


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", None])
def test_wrong_content_type(server, ctype):
    body = chat_body()
    hdrs = {"Content-Type": ctype} if ctype else {"Content-Type": ""}
    if ctype is None:
        # no Content-Type header at all
        raw = (f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
               f"Connection: close\r\n\r\n").encode() + body
        r = server.request("POST", C, raw=raw)
    else:
        r = server.request("POST", C, body=body, headers=hdrs)
    check_error(r, 415)


def test_content_type_with_charset_ok(server):
    r = server.request("POST", C, body=chat_body(max_tokens=1),
                       headers={"Content-Type": "application/json; charset=utf-8"})
    assert r.status == 200, r


@pytest.mark.parametrize("method,path,allow", [
    ("GET", C, "POST"), ("PUT", C, "POST"), ("DELETE", "/v1/models", "GET"), ("POST", "/v1/models", "GET"),
    ("GET", "/tokenize", "POST"), ("POST", "/health", "GET"), ("GET", P, "POST"),
])
def test_wrong_method(server, method, path, allow):
    body = chat_body() if method in ("POST", "PUT") else None
    r = server.request(method, path, body=body)
    check_error(r, 405)
    got = {m.strip() for m in r.header("Allow", "").split(",")}
    assert allow in got, r.headers


@pytest.mark.parametrize("path", ["//v1/models", "/v1/models/", "/v1//models", "/v1/models?x=1"])
def test_path_variants_ok(server, path):
    r = server.request("GET", path)
    assert r.status == 200, r
    assert r.json()["object"] == "list"


def test_path_variant_post(server):
    r = server.request("POST", "//v1/chat/completions/", body=chat_body(max_tokens=1))
    assert r.status == 200, r


@pytest.mark.parametrize("path", ["/v1/nope", "/", "/v2/models", "/v1/model/x", "/v1/chat/completion",
                                  "/V1/MODELS"])
def test_unknown_path(server, path):
    check_error(server.request("GET", path), 404)
    check_error(server.request("POST", path, body=chat_body()), 404)


def test_unknown_model_id(server):
    # /v1/models/{id} exists for GET: another id is 404 model_not_found, another method 405
    check_error(server.request("GET", "/v1/models/x"), 404, code="model_not_found", param="model")
    check_error(server.request("POST", "/v1/models/x", body=chat_body()), 405, code="method_not_allowed")


def test_body_at_limit_ok(server):
    base = json.loads(chat_body(max_tokens=1))
    base["user"] = ""
    pad = MAX_BODY - len(json.dumps(base).encode())
    base["user"] = "u" * pad
    body = json.dumps(base).encode()
    assert len(body) == MAX_BODY
    r = server.request("POST", C, body=body)
    assert r.status == 200, r


@pytest.mark.parametrize("size", [MAX_BODY + 1, 4 * MAX_BODY])
def test_body_too_large(server, size):
    base = json.loads(chat_body(max_tokens=1))
    base["user"] = ""
    base["user"] = "u" * (size - len(json.dumps(base).encode()))
    body = json.dumps(base).encode()
    assert len(body) == size
    r = server.request("POST", C, body=body)
    check_error(r, 413, code="request_too_large")


def test_body_too_large_chunked(server):
    """No Content-Length: the limit applies while the body arrives."""
    chunk = b"u" * 8192
    parts = [b'{"messages": [{"role": "user", "content": "x"}], "user": "']
    parts += [chunk] * (2 * MAX_BODY // len(chunk))
    parts.append(b'"}')
    enc = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    raw = (f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           f"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode() + enc
    r = server.request("POST", C, raw=raw)
    check_error(r, 413, code="request_too_large")


def test_chunked_body_ok(server):
    body = chat_body(max_tokens=1)
    half = len(body) // 2
    enc = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, body[:half], len(body) - half, body[half:])
    raw = (f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           f"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode() + enc
    r = server.request("POST", C, raw=raw)
    assert r.status == 200, r


@pytest.mark.parametrize("kind", ["one-big-header", "many-headers", "long-url"])
def test_huge_header(server, kind):
    if kind == "one-big-header":
        r = server.request("GET", "/v1/models", headers={"X-Big": "a" * 200_000})
    elif kind == "many-headers":
        r = server.request("GET", "/v1/models", headers=[(f"X-H{i}", "b" * 100) for i in range(2000)])
    else:
        r = server.request("GET", "/v1/models?q=" + "c" * 200_000)
    assert r.status in (400, 413, 414, 431), r
    assert server.request("GET", "/health").status == 200


def test_garbage_request_line(server):
    for raw in (b"HELLO\r\n\r\n", b"GET\r\n\r\n", b"\x00\x01\x02\x03\r\n\r\n",
                b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n"):
        try:
            r = server.request("GET", "/", raw=raw, timeout=3)
            assert 400 <= r.status < 600, r
        except AssertionError as e:  # closing without an answer is acceptable here
            assert "closed" in str(e), e
        except OSError:  # so is a reset, or holding the connection until its idle timeout
            pass
    assert server.request("GET", "/health").status == 200


# --------------------------------------------------------------------------- authentication

@pytest.mark.parametrize("hdrs", [
    {}, {"Authorization": "Bearer wrong"}, {"X-Api-Key": "wrong"}, {"Authorization": "Bearer "},
    {"Authorization": API_KEY}, {"X-Api-Key": ""},
], ids=["missing", "wrong-bearer", "wrong-x-api-key", "empty-bearer", "no-scheme", "empty-x-api-key"])
@pytest.mark.parametrize("path", [C, P, "/tokenize"])
def test_auth_bad_key(auth_server, hdrs, path):
    r = auth_server.request("POST", path, body=chat_body() if path == C else comp_body(), headers=hdrs)
    check_error(r, 401, type_="authentication_error", code="invalid_api_key")


def test_auth_before_validation(auth_server):
    # authentication comes first: a bad body without a key is 401, not 400 / 413
    r = auth_server.request("POST", C, body=b"{not json")
    check_error(r, 401, type_="authentication_error", code="invalid_api_key")
    r = auth_server.request("GET", "/v1/models")
    check_error(r, 401, type_="authentication_error", code="invalid_api_key")


def test_auth_good_key_bad_body(auth_server):
    r = auth_server.request("POST", C, body=b"{not json", headers={"Authorization": f"Bearer {API_KEY}"})
    check_error(r, 400, type_=INVALID)
    r = auth_server.request("POST", C, body=chat_body(max_tokens=1), headers={"X-Api-Key": API_KEY})
    assert r.status == 200, r


def test_auth_health_public(auth_server):
    assert auth_server.request("GET", "/health").status == 200


# --------------------------------------------------------------------------- still alive

def test_server_still_works(server):
    """After everything above, the same process answers normally."""
    assert server.proc.poll() is None, server.stderr_tail()
    assert server.request("GET", "/health").status == 200
    name = server.get_json("/v1/models")["data"][0]["id"]
    r = server.request("POST", C, body=chat_body(model=name, max_tokens=8, temperature=0))
    assert r.status == 200, r
    obj = r.json()
    assert obj["object"] == "chat.completion"
    c = obj["choices"][0]
    assert c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str)
    assert c["finish_reason"] in ("stop", "length")
    u = obj["usage"]
    assert u["prompt_tokens"] + u["completion_tokens"] == u["total_tokens"]
    m = server.metrics()
    assert m.get("vllm:num_requests_running") == 0

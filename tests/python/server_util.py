"""Helpers for the `tessera serve` tests: start the server on a free port, talk raw HTTP/1.1
over a socket (exact bytes, headers, chunked framing, arrival times), parse SSE strictly,
and parse the Prometheus text of /metrics. Standard library only."""
import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time

START_TIMEOUT = 60.0   # seconds until /health must answer 200
STOP_TIMEOUT = 60.0    # seconds for a graceful drain after SIGTERM


def free_port(host="127.0.0.1"):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Server:
    """A running `tessera serve`: base_url ("http://127.0.0.1:PORT"), host, port, proc."""

    def __init__(self, proc, host, port, stderr_file, cmd):
        self.proc = proc
        self.host = host
        self.port = port
        self.base_url = f"http://{host}:{port}"
        self._stderr_file = stderr_file
        self.cmd = cmd
        self.returncode = None

    def stderr(self):
        try:
            with open(self._stderr_file.name, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return "(server log gone)"

    def stderr_tail(self, n=4000):
        return self.stderr()[-n:]

    def request(self, method, path, body=None, headers=None, **kw):
        return raw_request(self.host, self.port, method, path, body=body, headers=headers, **kw)

    def get_json(self, path, headers=None):
        r = self.request("GET", path, headers=headers)
        assert r.status == 200, (path, r.status, r.body[:500], self.stderr_tail())
        return r.json()

    def post_json(self, path, obj, headers=None, **kw):
        return self.request("POST", path, body=json.dumps(obj).encode(), headers=headers, **kw)

    def metrics(self, headers=None):
        r = self.request("GET", "/metrics", headers=headers)
        assert r.status == 200, (r.status, r.body[:500])
        return Metrics(r.text())

    def stop(self, timeout=STOP_TIMEOUT):
        """SIGTERM, wait for the drain; returns the exit status (kills after timeout)."""
        if self.returncode is not None:
            return self.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.returncode = "timeout"
        return self.returncode


def _health_status(host, port):
    try:
        return raw_request(host, port, "GET", "/health", timeout=5).status
    except OSError:
        return None


@contextlib.contextmanager
def run_server(tessera_bin, model=None, *extra, positional_model=False, env=None,
               start_timeout=START_TIMEOUT, check_exit=True):
    """Starts `tessera serve --model MODEL --host 127.0.0.1 --port P *extra` on a free port,
    waits for GET /health == 200, yields a Server; on exit sends SIGTERM, waits and asserts
    exit status 0 (when check_exit). With positional_model the model is passed as
    `tessera serve MODEL`. TESSERA_API_KEY is removed from the environment unless env sets
    it, so a key in the caller's environment cannot turn authentication on."""
    full_env = {k: v for k, v in os.environ.items() if k != "TESSERA_API_KEY"}
    full_env.update(env or {})
    last_err = None
    for _attempt in range(3):  # the port may be taken between bind(0) and the server's bind
        host, port = "127.0.0.1", free_port()
        cmd = [str(tessera_bin), "serve"]
        if model is not None:
            cmd += [str(model)] if positional_model else ["--model", str(model)]
        cmd += ["--host", host, "--port", str(port), *map(str, extra)]
        errf = tempfile.NamedTemporaryFile(prefix="tessera-serve-", suffix=".log", delete=False)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=errf, env=full_env)
        srv = Server(proc, host, port, errf, cmd)
        deadline = time.monotonic() + start_timeout
        ready = False
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if _health_status(host, port) == 200:
                ready = True
                break
            time.sleep(0.1)
        if ready:
            break
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            raise AssertionError(f"server not healthy after {start_timeout}s: {' '.join(cmd)}\n"
                                 f"{srv.stderr_tail()}")
        last_err = srv.stderr_tail()
        if "in use" not in last_err.lower():
            raise AssertionError(f"server exited with {proc.returncode} during start-up: "
                                 f"{' '.join(cmd)}\n{last_err}")
    else:
        raise AssertionError(f"could not bind a free port: {last_err}")
    try:
        yield srv
    finally:
        rc = srv.stop()
        log = srv.stderr_tail()
        errf.close()
        os.unlink(errf.name)
        if check_exit:
            assert rc == 0, f"tessera serve exited with {rc} after SIGTERM:\n{log}"


# ---------------------------------------------------------------------------------------
# Raw HTTP/1.1 over a socket


class RawResponse:
    def __init__(self, status, reason, headers, body, raw_head, chunks=None, events=None):
        self.status = status
        self.reason = reason
        self.headers = headers          # [(name, value)] in order, names as sent
        self.body = body                # de-chunked body bytes
        self.raw_head = raw_head        # the status line + headers as received
        self.chunks = chunks            # chunk payloads when Transfer-Encoding: chunked
        self.events = events or []      # [(monotonic time, bytes)] as they arrived

    def header(self, name, default=None):
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return default

    def header_all(self, name):
        return [v for k, v in self.headers if k.lower() == name.lower()]

    def text(self):
        return self.body.decode("utf-8")

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"<RawResponse {self.status} {self.headers} {self.body[:300]!r}>"


class HttpConn:
    """One client connection with buffered reads; parses one response at a time."""

    def __init__(self, host, port, timeout=60.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.eof = False
        self.last_recv = time.monotonic()  # when the latest recv() returned data

    def close(self, reset=False):
        """Close; reset=True sends an RST (SO_LINGER 0) instead of a FIN."""
        if reset:
            import struct
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def send(self, data):
        self.sock.sendall(data)

    def send_request(self, method, path, body=None, headers=None, host_header=None):
        """Writes a request. headers: dict or list of pairs; Host, Content-Length and
        Connection: close are added unless given. body: bytes or None."""
        hdrs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        names = {k.lower() for k, _ in hdrs}
        if "host" not in names:
            hdrs.insert(0, ("Host", host_header or "localhost"))
        if body is not None:
            if "content-type" not in names:
                hdrs.append(("Content-Type", "application/json"))
            if "content-length" not in names and "transfer-encoding" not in names:
                hdrs.append(("Content-Length", str(len(body))))
        if "connection" not in names:
            hdrs.append(("Connection", "close"))
        head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs) + "\r\n"
        data = head.encode("latin-1") + (body or b"")
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer (413, 431) and close before reading everything

    def _fill(self):
        if self.eof:
            return False
        try:
            d = self.sock.recv(65536)
        except ConnectionResetError:
            d = b""
        if not d:
            self.eof = True
            return False
        self.buf += d
        self.last_recv = time.monotonic()
        return True

    def read_until(self, sep, limit=1 << 20):
        while sep not in self.buf:
            if len(self.buf) > limit:
                raise AssertionError(f"no {sep!r} within {limit} bytes")
            if not self._fill():
                raise AssertionError(f"connection closed before {sep!r}; got {self.buf[:300]!r}")
        i = self.buf.index(sep) + len(sep)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def read_exact(self, n):
        while len(self.buf) < n:
            if not self._fill():
                raise AssertionError(f"connection closed: wanted {n} bytes, have {len(self.buf)}")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_head(self):
        """Status line + headers. Returns (status, reason, headers, raw_head). Header lines
        must end with CRLF."""
        raw = self.read_until(b"\r\n\r\n")
        lines = raw[:-4].split(b"\r\n")
        status_line = lines[0].decode("latin-1")
        parts = status_line.split(" ", 2)
        assert parts[0] in ("HTTP/1.1", "HTTP/1.0") and len(parts) >= 2, status_line
        status = int(parts[1])
        reason = parts[2] if len(parts) > 2 else ""
        headers = []
        for ln in lines[1:]:
            s = ln.decode("latin-1")
            assert ":" in s and not s[0].isspace(), f"malformed header line {s!r}"
            k, v = s.split(":", 1)
            assert k == k.strip() and k, f"malformed header name {s!r}"
            headers.append((k, v.strip()))
        return status, reason, headers, raw

    def iter_body(self, headers, method="GET", status=200):
        """Yields (arrival time, bytes) for each piece of the body: one per chunk with
        chunked framing (checked strictly), otherwise as received. The time is when the
        recv() that delivered the piece's last byte returned, so pieces that came in one
        recv() share a time."""
        hd = {k.lower(): v for k, v in headers}
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return
        te = hd.get("transfer-encoding", "").lower()
        if te:
            assert te == "chunked", f"unexpected Transfer-Encoding {te!r}"
            assert "content-length" not in hd, "both Content-Length and chunked"
            while True:
                line = self.read_until(b"\r\n", limit=1024)
                size_s = line[:-2].split(b";", 1)[0]
                assert size_s and all(c in b"0123456789abcdefABCDEF" for c in size_s), \
                    f"bad chunk size line {line!r}"
                size = int(size_s, 16)
                if size == 0:
                    # no trailers expected: the final CRLF
                    trailer = self.read_until(b"\r\n", limit=8192)
                    while trailer != b"\r\n":
                        trailer = self.read_until(b"\r\n", limit=8192)
                    return
                data = self.read_exact(size)
                t = self.last_recv
                assert self.read_exact(2) == b"\r\n", "chunk not followed by CRLF"
                yield t, data
        elif "content-length" in hd:
            n = int(hd["content-length"])
            got = 0
            while got < n:
                if not self.buf and not self._fill():
                    raise AssertionError(f"body short: {got} of {n} bytes")
                take = self.buf[: n - got]
                self.buf = self.buf[len(take):]
                got += len(take)
                yield self.last_recv, take
        else:
            while True:
                if self.buf:
                    d, self.buf = self.buf, b""
                    yield self.last_recv, d
                if not self._fill():
                    return


def raw_request(host, port, method, path, body=None, headers=None, timeout=60.0, raw=None,
                host_header=None):
    """One request on a fresh connection (Connection: close unless given). raw: exact bytes
    to send instead of building a request. Returns a RawResponse with the whole body."""
    c = HttpConn(host, port, timeout=timeout)
    try:
        if raw is not None:
            try:
                c.send(raw)
            except (BrokenPipeError, ConnectionResetError):
                pass
        else:
            c.send_request(method, path, body=body, headers=headers, host_header=host_header)
        status, reason, hdrs, raw_head = c.read_head()
        chunked = any(k.lower() == "transfer-encoding" for k, _ in hdrs)
        events = list(c.iter_body(hdrs, method=method, status=status))
        body_bytes = b"".join(d for _, d in events)
        return RawResponse(status, reason, hdrs, body_bytes, raw_head,
                           chunks=[d for _, d in events] if chunked else None, events=events)
    finally:
        c.close()


class StreamResult:
    """A streamed SSE response read to the end with arrival times."""

    def __init__(self, status, headers, body, arrivals, start):
        self.status = status
        self.headers = headers
        self.body = body            # all body bytes
        self.arrivals = arrivals    # [(time since start, bytes)] per piece
        self.start = start

    def header(self, name, default=None):
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return default

    def event_times(self):
        """[(time since request sent, event text)] for each complete SSE event (data and
        comment blocks), in order: the time is when the piece that completed it arrived."""
        out, pending = [], b""
        for t, d in self.arrivals:
            pending += d
            while b"\n\n" in pending:
                i = pending.index(b"\n\n") + 2
                out.append((t, pending[:i].decode("utf-8")))
                pending = pending[i:]
        return out


def stream_request(host, port, path, obj, headers=None, timeout=120.0):
    """POSTs obj as JSON and reads the (SSE) response to the end, timing each piece."""
    c = HttpConn(host, port, timeout=timeout)
    try:
        start = time.monotonic()
        c.send_request("POST", path, body=json.dumps(obj).encode(), headers=headers)
        status, _, hdrs, _ = c.read_head()
        arrivals = [(t - start, d) for t, d in c.iter_body(hdrs, method="POST", status=status)]
        body = b"".join(d for _, d in arrivals)
        return StreamResult(status, hdrs, body, arrivals, start)
    finally:
        c.close()


# ---------------------------------------------------------------------------------------
# Server-sent events


class SSE:
    def __init__(self, payloads, comments):
        self.payloads = payloads   # data payload strings in order ("[DONE]" included)
        self.comments = comments   # comment lines (without the leading ':')

    def json_events(self):
        """The JSON objects of every data event before [DONE]."""
        return [json.loads(p) for p in self.payloads if p != "[DONE]"]


def parse_sse(body, require_done=True):
    """Parses an OpenAI-style SSE body strictly: UTF-8; events separated by exactly one
    blank line ("\\n\\n", no CR); each event holds exactly one "data: <payload>" line,
    optionally with ":" comment lines, or only comment lines; no "event:", "id:" or
    "retry:" fields; every payload but [DONE] is a JSON object; [DONE] is the last event
    and appears once; the body ends right after it."""
    text = body.decode("utf-8") if isinstance(body, (bytes, bytearray)) else body
    assert "\r" not in text, "SSE body contains CR"
    assert text.endswith("\n\n"), f"SSE body does not end with a blank line: {text[-80:]!r}"
    blocks = text[:-2].split("\n\n")
    payloads, comments = [], []
    for blk in blocks:
        assert blk != "", f"empty SSE event (three newlines in a row) in {text[:400]!r}"
        data_lines = []
        for line in blk.split("\n"):
            if line.startswith(":"):
                comments.append(line[1:].strip())
                continue
            assert line.startswith("data: "), f"SSE line is not 'data: ...': {line!r}"
            data_lines.append(line[len("data: "):])
        assert len(data_lines) <= 1, f"SSE event with several data lines: {blk!r}"
        if data_lines:
            p = data_lines[0]
            if p != "[DONE]":
                obj = json.loads(p)
                assert isinstance(obj, dict), p
            payloads.append(p)
    if require_done:
        assert payloads and payloads[-1] == "[DONE]", f"stream does not end with [DONE]: {payloads[-3:]}"
    assert payloads.count("[DONE]") <= 1, "[DONE] sent more than once"
    if payloads and "[DONE]" in payloads:
        assert payloads.index("[DONE]") == len(payloads) - 1, "[DONE] is not the last data event"
        assert text.rstrip("\n").endswith("data: [DONE]"), "bytes after [DONE]"
    return SSE(payloads, comments)


def check_chat_stream(events, n=1, include_usage=False):
    """Checks the OpenAI chat stream shape of parse_sse(...).json_events(); returns
    ({index: text}, {index: finish_reason}, usage or None)."""
    assert events, "no events"
    for ev in events:
        assert "error" not in ev, f"error event in stream: {ev}"
    ids = {ev["id"] for ev in events}
    created = {ev["created"] for ev in events}
    assert len(ids) == 1, f"id changes within a stream: {ids}"
    assert len(created) == 1, f"created changes within a stream: {created}"
    usage = None
    body = events
    if include_usage:
        last = events[-1]
        assert last["choices"] == [] and last.get("usage"), f"no usage chunk last: {last}"
        usage = last["usage"]
        body = events[:-1]
        for ev in body:
            assert ev.get("usage") is None, f"usage before the last chunk: {ev}"
    texts, finish, seen_role = {}, {}, set()
    for ev in body:
        assert ev["object"] == "chat.completion.chunk", ev
        assert len(ev["choices"]) >= 1, ev
        for ch in ev["choices"]:
            i = ch["index"]
            assert 0 <= i < n, ev
            assert i not in finish, f"chunk for choice {i} after its finish_reason: {ev}"
            d = ch["delta"]
            if i not in seen_role:
                assert d.get("role") == "assistant" and d.get("content") == "", \
                    f"first chunk of choice {i} is not the role chunk: {ev}"
                seen_role.add(i)
                assert ch.get("finish_reason") is None
                continue
            assert "role" not in d or d["role"] is None, f"role repeated: {ev}"
            if ch.get("finish_reason") is not None:
                assert ch["finish_reason"] in ("stop", "length"), ev
                assert not d.get("content"), f"finish chunk should have an empty delta: {ev}"
                finish[i] = ch["finish_reason"]
            else:
                c = d.get("content")
                assert isinstance(c, str) and c != "", f"empty content delta: {ev}"
                texts[i] = texts.get(i, "") + c
    assert seen_role == set(range(n)), f"role chunks for {seen_role}, want {n}"
    assert set(finish) == set(range(n)), f"finish_reason for {set(finish)}, want {n}"
    return {i: texts.get(i, "") for i in range(n)}, finish, usage


def check_completion_stream(events, n=1, include_usage=False):
    """Same for /v1/completions streams (object text_completion, choices[].text)."""
    assert events, "no events"
    for ev in events:
        assert "error" not in ev, f"error event in stream: {ev}"
    assert len({ev["id"] for ev in events}) == 1
    assert len({ev["created"] for ev in events}) == 1
    usage = None
    body = events
    if include_usage:
        last = events[-1]
        assert last["choices"] == [] and last.get("usage"), f"no usage chunk last: {last}"
        usage, body = last["usage"], events[:-1]
    texts, finish = {}, {}
    for ev in body:
        assert ev["object"] == "text_completion", ev
        for ch in ev["choices"]:
            i = ch["index"]
            assert 0 <= i < n and i not in finish, ev
            assert isinstance(ch["text"], str)
            texts[i] = texts.get(i, "") + ch["text"]
            if ch.get("finish_reason") is not None:
                assert ch["finish_reason"] in ("stop", "length"), ev
                finish[i] = ch["finish_reason"]
    assert set(finish) == set(range(n)), f"finish_reason for {set(finish)}, want {n}"
    return {i: texts.get(i, "") for i in range(n)}, finish, usage


# ---------------------------------------------------------------------------------------
# OpenAI error bodies


def check_error(resp, status, type_=None, code=None, param=None, param_prefix=None):
    """resp: RawResponse. Checks the status and the OpenAI error shape
    {"error":{"message": non-empty str, "type": str, "param": str|null, "code": str|null}};
    returns the error object."""
    assert resp.status == status, f"want {status}, got {resp.status}: {resp.body[:500]!r}"
    ct = resp.header("Content-Type", "")
    assert ct.split(";")[0].strip() == "application/json", f"error Content-Type {ct!r}"
    obj = resp.json()
    check_error_obj(obj, type_=type_, code=code, param=param, param_prefix=param_prefix)
    return obj["error"]


def check_error_obj(obj, type_=None, code=None, param=None, param_prefix=None):
    assert isinstance(obj, dict) and set(obj) == {"error"}, obj
    e = obj["error"]
    assert isinstance(e, dict), obj
    for k in ("message", "type", "param", "code"):
        assert k in e, f"error lacks {k!r}: {obj}"
    assert isinstance(e["message"], str) and e["message"], obj
    assert isinstance(e["type"], str) and e["type"], obj
    assert e["param"] is None or isinstance(e["param"], str), obj
    assert e["code"] is None or isinstance(e["code"], str), obj
    if type_ is not None:
        assert e["type"] == type_, obj
    if code is not None:
        assert e["code"] == code, obj
    if param is not None:
        assert e["param"] == param, obj
    if param_prefix is not None:
        assert isinstance(e["param"], str) and e["param"].startswith(param_prefix), obj
    return e


# ---------------------------------------------------------------------------------------
# Prometheus text format


class Metrics:
    """Parsed /metrics: samples [(name, {label: value}, float)] and types {family: type}."""

    def __init__(self, text):
        self.text = text
        self.samples = []
        self.types = {}
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 4 and parts[1] == "TYPE":
                    self.types[parts[2]] = parts[3].strip()
                continue
            name, labels, rest = _parse_sample(line)
            self.samples.append((name, labels, rest))

    def names(self):
        return {n for n, _, _ in self.samples}

    def get(self, name, **labels):
        """Sum of the samples named name whose labels include labels (None if none)."""
        vals = [v for n, lab, v in self.samples
                if n == name and all(lab.get(k) == str(x) for k, x in labels.items())]
        return sum(vals) if vals else None

    def labels_of(self, name):
        return [lab for n, lab, _ in self.samples if n == name]


def _parse_sample(line):
    i = 0
    while i < len(line) and line[i] not in "{ ":
        i += 1
    name = line[:i]
    assert name, f"metric line without a name: {line!r}"
    labels = {}
    if i < len(line) and line[i] == "{":
        i += 1
        while True:
            while line[i] in " ,":
                i += 1
            if line[i] == "}":
                i += 1
                break
            j = line.index("=", i)
            key = line[i:j].strip()
            assert line[j + 1] == '"', f"label value not quoted: {line!r}"
            k = j + 2
            val = []
            while line[k] != '"':
                if line[k] == "\\":
                    k += 1
                    val.append({"n": "\n", "\\": "\\", '"': '"'}.get(line[k], line[k]))
                else:
                    val.append(line[k])
                k += 1
            labels[key] = "".join(val)
            i = k + 1
    rest = line[i:].split()
    assert 1 <= len(rest) <= 2, f"bad sample line {line!r}"
    v = rest[0]
    value = {"+Inf": float("inf"), "-Inf": float("-inf"), "NaN": float("nan")}.get(v)
    if value is None:
        value = float(v)
    return name, labels, value


def expect_engine_failure(srv, res, message, timeout=60):
    """After an engine failure: the stream res ended with an error event naming message and
    data: [DONE], /health is 503 (or the process is already gone), and the process exits
    with status 1 (a supervisor restarts it) within timeout seconds, saying so in its log."""
    assert res.status == 200
    events = parse_sse(res.body).json_events()  # ends with [DONE]
    assert "error" in events[-1], events[-3:]
    assert events[-1]["error"]["type"] == "server_error" and message in events[-1]["error"]["message"], \
        events[-1]
    try:
        status = raw_request(srv.host, srv.port, "GET", "/health", timeout=5).status
    except (OSError, AssertionError):  # refused, or closed unanswered: the process is going
        status = None
    assert status in (503, None), status
    try:
        rc = srv.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError("tessera serve did not exit after the engine failed")
    srv.returncode = rc
    assert rc == 1, (rc, srv.stderr_tail())
    assert "engine failed" in srv.stderr(), srv.stderr_tail()


def wait_idle(srv, timeout=30.0, headers=None):
    """Polls /metrics until no request runs or waits and the KV cache is empty; returns
    the last Metrics. Fails after timeout with the last values."""
    deadline = time.monotonic() + timeout
    while True:
        m = srv.metrics(headers=headers)
        running = m.get("vllm:num_requests_running")
        waiting = m.get("vllm:num_requests_waiting")
        kv = m.get("vllm:kv_cache_usage_perc")
        if running == 0 and waiting == 0 and kv == 0:
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"server not idle after {timeout}s: running={running} "
                                 f"waiting={waiting} kv_cache_usage_perc={kv}")
        time.sleep(0.2)

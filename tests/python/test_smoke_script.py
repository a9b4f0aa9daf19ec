"""scripts/smoke.sh — the post-deployment check — against the real server (PASS, with and
without a key) and against fake servers that each break one promise: a stream cut off
before `data: [DONE]`, a stream delivered in one burst (a buffering proxy), /health 503,
a chat that errors, a stream that ends with an error event. Each must print FAIL naming
the broken check and exit 1."""
import http.server
import json
import pathlib
import subprocess
import threading
import time

import pytest

from server_util import run_server

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMOKE = ROOT / "scripts" / "smoke.sh"


def smoke(target, key=None, timeout=60):
    cmd = ["bash", str(SMOKE), target] + ([key] if key else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env={"PATH": "/usr/bin:/bin", "SMOKE_TIMEOUT": "20"})
    return p.returncode, p.stdout + p.stderr


def test_real_server_passes(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--api-key", "sk-smoke") as srv:
        rc, out = smoke(f"{srv.host}:{srv.port}", "sk-smoke")
        assert rc == 0 and out.strip().splitlines()[-1] == "PASS", out
        assert "ends with data: [DONE]" in out, out
        rc, out = smoke(f"{srv.host}:{srv.port}", "sk-wrong")
        assert rc == 1 and "FAIL: GET /v1/models: status 401" in out, out


def test_usage(tmp_path):
    p = subprocess.run(["bash", str(SMOKE)], capture_output=True, text=True)
    assert p.returncode == 2 and "HOST:PORT" in p.stdout


# ---------------------------------------------------------------------------------------
# fake servers


EVENT = 'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"w"},"finish_reason":null}]}\n\n'


class Fake(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "good"

    def log_message(self, *a):
        pass

    def _json(self, status, obj):
        b = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self):
        if self.path == "/health":
            self._json(503 if self.mode == "unhealthy" else 200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "no"}})

    def _chunk(self, data):
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not body.get("stream"):
            if self.mode == "chat_error":
                self._json(500, {"error": {"message": "boom", "type": "server_error"}})
                return
            self._json(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                          "finish_reason": "stop"}]})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        n = 10
        if self.mode == "buffered":  # everything at once, as a buffering proxy delivers it
            self._chunk((EVENT * n + "data: [DONE]\n\n").encode())
            self.wfile.write(b"0\r\n\r\n")
            return
        for i in range(n):
            self._chunk(EVENT.encode())
            time.sleep(0.02)
            if self.mode == "truncated" and i == n // 2:
                # the connection is cut mid-stream, without the terminating chunk
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
        if self.mode == "error_event":
            self._chunk(b'data: {"error":{"message":"engine failure","type":"server_error"}}\n\n')
        self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture
def fake():
    servers = []

    def start(mode):
        cls = type(f"Fake_{mode}", (Fake,), {"mode": mode})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), cls)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"127.0.0.1:{srv.server_address[1]}"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def test_fake_good_server_passes(fake):
    rc, out = smoke(fake("good"))
    assert rc == 0 and out.strip().endswith("PASS"), out


@pytest.mark.parametrize("mode,why", [
    ("truncated", "does not end with 'data: [DONE]'"),
    ("buffered", "arrived within"),
    ("unhealthy", "GET /health: status 503"),
    ("chat_error", "POST /v1/chat/completions: status 500"),
    ("error_event", "stream: error event"),
])
def test_fake_broken_server_fails(fake, mode, why):
    rc, out = smoke(fake(mode))
    last = out.strip().splitlines()[-1]
    assert rc == 1 and last.startswith("FAIL: ") and why in last, out


def test_nothing_listening_fails(fake):
    rc, out = smoke("127.0.0.1:9", timeout=60)
    assert rc == 1 and out.strip().splitlines()[-1].startswith("FAIL: GET /health"), out

"""scripts/bench_serving.py against a server that is not tessera or vLLM.

The stand-in server below answers the way llama.cpp's llama-server does where it differs
from vLLM: its /tokenize reads "content" (a body with "prompt" gets an empty token list),
it has no /detokenize of vLLM's shape and no /version, its models are owned_by
"llamacpp" and it names itself in the Server header. It streams completions as any
OpenAI server does. The benchmark must build its prompts with --tokenizer (and each
prompt must have exactly the asked token count), say which server answered, and, without
--tokenizer, stop with an error that says to pass it instead of looping.
"""
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "bench_serving.py"


class LlamaServerLike(BaseHTTPRequestHandler):
    server_version = "llama.cpp"
    sys_version = ""
    prompts = []

    def log_message(self, *args):
        pass

    def _json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "m.gguf", "object": "model",
                                                         "owned_by": "llamacpp"}]})
        else:
            self._json(404, {"error": {"code": 404, "message": "File Not Found",
                                       "type": "not_found_error"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            # llama-server tokenizes "content"; anything else is an empty prompt
            self._json(200, {"tokens": [1] * len(body.get("content", "").split())})
        elif self.path == "/detokenize":
            self._json(200, {"content": ""})
        elif self.path == "/v1/completions":
            LlamaServerLike.prompts.append(body["prompt"])
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(body["max_tokens"]):
                ev = {"choices": [{"index": 0, "text": f" w{i}", "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(ev)}\n\n".encode())
            usage = {"choices": [], "usage": {"prompt_tokens": 7,
                                              "completion_tokens": body["max_tokens"]}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            self.close_connection = True
        else:
            self._json(404, {"error": {"code": 404, "message": "File Not Found"}})


def serve():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), LlamaServerLike)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def run_bench(srv, extra, timeout=120):
    cmd = [sys.executable, str(SCRIPT), "--base-url", f"http://127.0.0.1:{srv.server_address[1]}",
           "--num-prompts", "6", "--max-concurrency", "3", "--random-input-len", "40",
           "--random-output-len", "5", "--quiet", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_local_tokenizer_against_llama_server_like(tessera_bin, default_model):
    LlamaServerLike.prompts = []
    srv = serve()
    try:
        p = run_bench(srv, ["--tokenizer", str(default_model), "--tessera-bin", str(tessera_bin)])
    finally:
        srv.shutdown()
    assert p.returncode == 0, p.stderr
    assert "server: server header 'llama.cpp" in p.stderr and "owned_by llamacpp" in p.stderr, p.stderr
    assert "Successful requests:                     6" in p.stdout, p.stdout
    assert "Output token throughput" in p.stdout
    # 6 measured prompts plus the initial test request, each 40 tokens by the model's tokenizer
    assert len(LlamaServerLike.prompts) == 7
    enc = subprocess.run([str(tessera_bin), "tokenize", "--model", str(default_model), "--jsonl",
                          "/dev/stdin"], input="".join(json.dumps(t) + "\n" for t in LlamaServerLike.prompts),
                         capture_output=True, text=True, check=True)
    assert [len(json.loads(x)) for x in enc.stdout.splitlines()] == [40] * 7


def test_incompatible_tokenize_is_an_error_not_a_loop():
    srv = serve()
    try:
        p = run_bench(srv, [], timeout=60)
    finally:
        srv.shutdown()
    assert p.returncode != 0
    assert "building prompts" in p.stderr and "--tokenizer" in p.stderr, p.stderr


def test_missing_tokenizer_path_is_a_usage_error(tmp_path):
    p = subprocess.run([sys.executable, str(SCRIPT), "--tokenizer", str(tmp_path / "nope.gguf")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no such file" in p.stderr

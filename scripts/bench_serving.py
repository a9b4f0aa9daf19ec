#!/usr/bin/env python3
"""Serving benchmark for an OpenAI-compatible server (tessera serve, vLLM, ...), in the
manner of `vllm bench serve`: random prompts of a given token length, a given number of
output tokens (ignore_eos), sent at a Poisson rate or all at once, at most
--max-concurrency in flight; every request streams (SSE, stream_options.include_usage) and
is timed on the client: TTFT (first content chunk), TPOT ((e2e - ttft) / (output - 1)),
ITL (gap between content chunks), E2E. Prints vLLM's result table; --result-json writes
the numbers and the per-request data.

Prompts are built with a local tokenizer when --tokenizer names one (a GGUF file, a
Hugging Face model directory or a tokenizer.json, read by `tessera tokenize`), so the
benchmark works against any OpenAI-compatible server (vLLM, SGLang, llama.cpp's
llama-server, Ollama, tessera) and every server gets the same prompts; without it they
are built through the server's own /tokenize and /detokenize (vLLM's and tessera's shape).
The server that answered is printed before the run (HTTP Server header, /v1/models
owned_by, /version).

Standard library only (asyncio streams, HTTP/1.1 with chunked decoding); http:// and
https:// base URLs.

    python3 scripts/bench_serving.py --base-url http://127.0.0.1:8000 \\
        --tokenizer models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --num-prompts 200 --max-concurrency 16 --random-input-len 256 --random-output-len 64
"""
import argparse
import asyncio
import json
import math
import os
import random
import ssl
import subprocess
import statistics
import sys
import time
import urllib.parse

WORDS = (
    "time person year way day thing man world life hand part child eye woman place work week "
    "case point government company number group problem fact be have do say get make go know "
    "take see come think look want give use find tell ask seem feel try leave call good new "
    "first last long great little own other old right big high different small large next early "
    "young important few public bad same able to of in for on with at by from up about into over "
    "after river mountain ocean forest city garden window letter music story question answer "
    "history science language engine server token model memory paper light water fire stone "
    "morning evening winter summer yellow green blue silver quiet bright rapid gentle ancient"
).split()


# ----------------------------------------------------------------------------- HTTP client

class HTTPError(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body[:300]!r}")
        self.status = status
        self.body = body


class Endpoint:
    def __init__(self, base_url, api_key=None, timeout=600.0):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https"):
            raise SystemExit(f"--base-url: unsupported scheme {u.scheme!r}")
        self.scheme = u.scheme
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.ssl = ssl.create_default_context() if u.scheme == "https" else None

    def _head(self, method, path, body):
        hdrs = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.host}:{self.port}",
                "User-Agent: tessera-bench-serving", "Accept: */*", "Connection: close"]
        if self.api_key:
            hdrs.append(f"Authorization: Bearer {self.api_key}")
        if body is not None:
            hdrs += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        return ("\r\n".join(hdrs) + "\r\n\r\n").encode("latin-1")

    async def _open(self, method, path, obj):
        body = None if obj is None else json.dumps(obj).encode()
        reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.ssl,
                                                       limit=1 << 22)
        writer.write(self._head(method, path, body) + (body or b""))
        await writer.drain()
        line = await reader.readline()
        parts = line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            writer.close()
            raise HTTPError(0, line)
        status = int(parts[1])
        headers = {}
        while True:
            h = await reader.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            k, _, v = h.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        return reader, writer, status, headers

    @staticmethod
    async def _body_pieces(reader, headers):
        """Yields body bytes as they arrive (de-chunked)."""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await reader.readline()
                if not size_line:
                    return
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    return
                data = await reader.readexactly(size)
                await reader.readexactly(2)
                yield data
        elif "content-length" in headers:
            n = int(headers["content-length"])
            while n > 0:
                data = await reader.read(min(n, 65536))
                if not data:
                    return
                n -= len(data)
                yield data
        else:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                yield data

    async def request(self, method, path, obj=None):
        """One request; returns (status, headers, body bytes)."""
        reader, writer, status, headers = await asyncio.wait_for(self._open(method, path, obj),
                                                                 self.timeout)
        try:
            body = b""
            async for d in self._body_pieces(reader, headers):
                body += d
        finally:
            writer.close()
        return status, headers, body

    async def request_json(self, method, path, obj=None):
        status, _, body = await self.request(method, path, obj)
        if status != 200:
            raise HTTPError(status, body)
        return json.loads(body)

    async def stream_events(self, path, obj):
        """POSTs obj and yields (arrival time, parsed JSON) per SSE data event until [DONE].
        Raises HTTPError for a non-200 answer or an error event."""
        reader, writer, status, headers = await asyncio.wait_for(self._open("POST", path, obj),
                                                                 self.timeout)
        try:
            if status != 200:
                body = b""
                async for d in self._body_pieces(reader, headers):
                    body += d
                raise HTTPError(status, body)
            buf = b""
            async for d in self._body_pieces(reader, headers):
                t = time.perf_counter()
                buf += d
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    for line in ev.split(b"\n"):
                        line = line.rstrip(b"\r")
                        if not line.startswith(b"data:"):
                            continue  # comments (": keep-alive") and other fields
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            return
                        obj_ = json.loads(payload)
                        if "error" in obj_:
                            raise HTTPError(200, payload)
                        yield t, obj_
        finally:
            writer.close()


# ----------------------------------------------------------------------------- dataset

class PromptError(Exception):
    pass


def random_words(rng, n_tokens):
    return " ".join(rng.choice(WORDS) for _ in range(max(8, n_tokens)))


# Words take at least one token each, so the first text is long enough unless a tokenizer
# merges words; a few doublings cover that, and a tokenizer that never returns enough
# tokens (an incompatible /tokenize) is an error, not a loop.
MAX_GROW = 4


async def server_tokenize(ep, text, add_special_tokens=True):
    obj = {"prompt": text}
    if not add_special_tokens:
        obj["add_special_tokens"] = False
    r = await ep.request_json("POST", "/tokenize", obj)
    if not isinstance(r, dict) or not isinstance(r.get("tokens"), list):
        raise PromptError(f"/tokenize answered {json.dumps(r)[:200]}; this server's /tokenize "
                          "is not vLLM's shape: pass --tokenizer MODEL_OR_FILE")
    return r["tokens"]


async def make_prompt_server(ep, rng, n_tokens, sem):
    """Random words, cut to n_tokens tokens through the server's /tokenize (without special
    tokens) and /detokenize; returns (prompt text, its token count as /tokenize reports it,
    which is what the server counts for /v1/completions)."""
    async with sem:
        text = random_words(rng, n_tokens)
        ids = await server_tokenize(ep, text, add_special_tokens=False)
        for _ in range(MAX_GROW):
            if len(ids) >= n_tokens:
                break
            text += " " + random_words(rng, n_tokens)
            ids = await server_tokenize(ep, text, add_special_tokens=False)
        if len(ids) < n_tokens:
            raise PromptError(f"/tokenize gave {len(ids)} tokens for {len(text)} characters of "
                              f"text (wanted {n_tokens}); pass --tokenizer MODEL_OR_FILE")
        r = await ep.request_json("POST", "/detokenize", {"tokens": ids[:n_tokens]})
        prompt = r.get("prompt") if isinstance(r, dict) else None
        if not isinstance(prompt, str):
            raise PromptError("/detokenize did not answer {\"prompt\": ...}; pass --tokenizer")
        count = len(await server_tokenize(ep, prompt))
        return prompt, count


class LocalTokenizer:
    """`tessera tokenize --jsonl` over a GGUF file, a Hugging Face directory or a
    tokenizer.json: one process per batch of texts."""

    def __init__(self, path, binary):
        self.binary = binary
        self.src = (["--tokenizer", path] if os.path.isfile(path) and path.endswith(".json")
                    else ["--model", path])

    def _run(self, lines, extra):
        inp = "".join(json.dumps(x) + "\n" for x in lines)
        p = subprocess.run([self.binary, "tokenize", *self.src, "--jsonl", "/dev/stdin", *extra],
                           input=inp.encode(), capture_output=True, timeout=600)
        if p.returncode != 0:
            raise PromptError(f"{self.binary} tokenize failed: {p.stderr.decode(errors='replace')[:300]}")
        out = p.stdout.decode().splitlines()
        if len(out) != len(lines):
            raise PromptError(f"{self.binary} tokenize gave {len(out)} lines for {len(lines)}")
        return [json.loads(x) for x in out]

    def encode(self, texts, add_special):
        return self._run(texts, ["--add-special"] if add_special else [])

    def decode(self, id_lists):
        return self._run(id_lists, [])


def make_prompts_local(tok, rngs, lens):
    """The same construction as make_prompt_server, with the local tokenizer; the count is
    with special tokens (a BOS), as a server counts a completions prompt."""
    texts = [random_words(rng, n) for rng, n in zip(rngs, lens)]
    ids = tok.encode(texts, False)
    for _ in range(MAX_GROW):
        short = [i for i, n in enumerate(lens) if len(ids[i]) < n]
        if not short:
            break
        for i in short:
            texts[i] += " " + random_words(rngs[i], lens[i])
        for i, r in zip(short, tok.encode([texts[i] for i in short], False)):
            ids[i] = r
    for i, n in enumerate(lens):
        if len(ids[i]) < n:
            raise PromptError(f"the tokenizer gave {len(ids[i])} tokens for {len(texts[i])} "
                              f"characters (wanted {n})")
    prompts = tok.decode([x[:n] for x, n in zip(ids, lens)])
    counts = [len(x) for x in tok.encode(prompts, True)]
    return list(zip(prompts, counts))


async def identify_server(ep):
    """A line saying which server answered: its Server header, the owned_by of its models
    and its /version (vLLM, tessera), whichever it has."""
    parts = []
    try:
        status, headers, body = await ep.request("GET", "/v1/models")
        if headers.get("server"):
            parts.append(f"server header {headers['server']!r}")
        if status == 200:
            owners = sorted({str(d.get("owned_by")) for d in json.loads(body).get("data", [])})
            parts.append(f"owned_by {','.join(owners)}")
    except (OSError, ValueError, HTTPError, asyncio.TimeoutError):
        pass
    try:
        status, _, body = await ep.request("GET", "/version")
        if status == 200:
            v = json.loads(body)
            if isinstance(v, dict) and "version" in v:
                parts.append(f"version {v['version']}")
    except (OSError, ValueError, HTTPError, asyncio.TimeoutError):
        pass
    return "; ".join(parts) if parts else "unidentified"


def sample_lens(rng, mean, ratio, n):
    lo = max(1, int(mean * (1 - ratio)))
    hi = max(lo, int(mean * (1 + ratio)))
    return [rng.randint(lo, hi) for _ in range(n)]


# ----------------------------------------------------------------------------- requests

class Result:
    __slots__ = ("ok", "error", "prompt_len", "output_len", "ttft", "itl", "e2e", "start")

    def __init__(self):
        self.ok = False
        self.error = ""
        self.prompt_len = 0
        self.output_len = 0
        self.ttft = 0.0
        self.itl = []
        self.e2e = 0.0
        self.start = 0.0


def build_body(args, model, prompt, out_len):
    body = {"model": model, "max_tokens": out_len, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": args.temperature}
    if args.endpoint.endswith("/chat/completions"):
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.top_p is not None:
        body["top_p"] = args.top_p
    if args.top_k is not None:
        body["top_k"] = args.top_k
    return body


def content_of(ev):
    """The text a chunk carries (chat delta content or completion text), '' if none."""
    out = ""
    for ch in ev.get("choices") or []:
        if "delta" in ch:
            out += (ch["delta"] or {}).get("content") or ""
        else:
            out += ch.get("text") or ""
    return out


async def run_one(ep, args, model, prompt, prompt_len, out_len):
    r = Result()
    r.prompt_len = prompt_len
    body = build_body(args, model, prompt, out_len)
    st = time.perf_counter()
    r.start = st
    last = None
    chunks = 0
    usage = None
    try:
        async for t, ev in ep.stream_events(args.endpoint, body):
            if ev.get("usage"):
                usage = ev["usage"]
            if content_of(ev):
                chunks += 1
                if last is None:
                    r.ttft = t - st
                else:
                    r.itl.append(t - last)
                last = t
        r.e2e = time.perf_counter() - st
        if usage:
            r.output_len = int(usage.get("completion_tokens", 0))
            r.prompt_len = int(usage.get("prompt_tokens", prompt_len))
        else:
            r.output_len = chunks
        r.ok = last is not None
        if not r.ok:
            r.error = "no content received"
    except Exception as e:  # noqa: BLE001 - reported per request
        r.error = f"{type(e).__name__}: {e}"
        r.e2e = time.perf_counter() - st
    return r


async def arrivals(n, rate, burstiness, rng):
    """Yields request indexes at Poisson (gamma, with burstiness != 1) times."""
    for i in range(n):
        yield i
        if rate == float("inf") or i == n - 1:
            continue
        theta = 1.0 / (rate * burstiness)
        await asyncio.sleep(rng.gammavariate(burstiness, theta))


# ----------------------------------------------------------------------------- stats

def pct(xs, p):
    """Percentile with linear interpolation (numpy's default)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    f = math.floor(k)
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


def summarize(results, duration, args):
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft for r in ok]
    tpots = [(r.e2e - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1]
    itls = [x for r in ok for x in r.itl]
    e2es = [r.e2e for r in ok]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_len for r in ok)
    m = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_throughput": total_out / duration if duration else 0.0,
        "total_token_throughput": (total_in + total_out) / duration if duration else 0.0,
        "max_concurrency": args.max_concurrency,
        "request_rate": args.request_rate,
    }
    ps = [float(p) for p in args.metric_percentiles.split(",") if p.strip()]
    for key, xs in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2es)):
        ms = [x * 1000.0 for x in xs]
        m[f"mean_{key}_ms"] = statistics.fmean(ms) if ms else 0.0
        m[f"median_{key}_ms"] = statistics.median(ms) if ms else 0.0
        m[f"std_{key}_ms"] = statistics.pstdev(ms) if len(ms) > 1 else 0.0
        for p in ps:
            m[f"p{p:g}_{key}_ms"] = pct(ms, p)
    return m, ps


def print_table(m, ps, args):
    w = 50
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=w, c="="))
    rows = [
        ("Successful requests:", m["completed"], "d"),
        ("Failed requests:", m["failed"], "d"),
    ]
    if args.max_concurrency:
        rows.append(("Maximum request concurrency:", args.max_concurrency, "d"))
    if args.request_rate != float("inf"):
        rows.append(("Request rate configured (RPS):", args.request_rate, ".2f"))
    rows += [
        ("Benchmark duration (s):", m["duration"], ".2f"),
        ("Total input tokens:", m["total_input_tokens"], "d"),
        ("Total generated tokens:", m["total_output_tokens"], "d"),
        ("Request throughput (req/s):", m["request_throughput"], ".2f"),
        ("Output token throughput (tok/s):", m["output_throughput"], ".2f"),
        ("Total Token throughput (tok/s):", m["total_token_throughput"], ".2f"),
    ]
    for label, v, f in rows:
        print("{:<40} {:<10{}}".format(label, v, f))
    sections = (("ttft", "Time to First Token", "TTFT"),
                ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
                ("itl", "Inter-token Latency", "ITL"),
                ("e2el", "End-to-end Latency", "E2EL"))
    for key, title, short in sections:
        print("{s:{c}^{n}}".format(s=title, n=w, c="-"))
        print("{:<40} {:<10.2f}".format(f"Mean {short} (ms):", m[f"mean_{key}_ms"]))
        print("{:<40} {:<10.2f}".format(f"Median {short} (ms):", m[f"median_{key}_ms"]))
        for p in ps:
            print("{:<40} {:<10.2f}".format(f"P{p:g} {short} (ms):", m[f"p{p:g}_{key}_ms"]))
    print("=" * w)


# ----------------------------------------------------------------------------- main

async def main_async(args):
    ep = Endpoint(args.base_url, api_key=args.api_key, timeout=args.timeout)
    model = args.model
    if model is None:
        models = await ep.request_json("GET", "/v1/models")
        model = models["data"][0]["id"]
    print(f"model: {model}  endpoint: {args.endpoint}  base-url: {args.base_url}", file=sys.stderr)
    print(f"server: {await identify_server(ep)}", file=sys.stderr)

    rng = random.Random(args.seed)
    in_lens = sample_lens(rng, args.random_input_len, args.random_range_ratio, args.num_prompts)
    out_lens = sample_lens(rng, args.random_output_len, args.random_range_ratio, args.num_prompts)
    prng = [random.Random(rng.random()) for _ in range(args.num_prompts)]
    t0 = time.perf_counter()
    try:
        if args.tokenizer:
            prompts = make_prompts_local(LocalTokenizer(args.tokenizer, args.tessera_bin), prng, in_lens)
        else:
            sem = asyncio.Semaphore(32)
            prompts = await asyncio.gather(*(make_prompt_server(ep, prng[i], in_lens[i], sem)
                                             for i in range(args.num_prompts)))
    except (PromptError, HTTPError) as e:
        raise SystemExit(f"building prompts: {e}")
    got = [c for _, c in prompts]
    print(f"built {len(prompts)} prompts in {time.perf_counter() - t0:.1f} s; input tokens "
          f"mean {statistics.fmean(got):.1f} (asked {statistics.fmean(in_lens):.1f}), "
          f"min {min(got)}, max {max(got)}", file=sys.stderr)
    if args.save_prompts:
        # one prompt per line, so the engine alone can run the same work
        # (`tessera generate --prompts-file`; see scripts/bench_server_overhead.sh)
        with open(args.save_prompts, "w", encoding="utf-8") as f:
            for text, _ in prompts:
                f.write(" ".join(text.split()) + "\n")

    if not args.skip_test_run:
        r = await run_one(ep, args, model, prompts[0][0], prompts[0][1], min(out_lens[0], 8))
        if not r.ok:
            raise SystemExit(f"initial test request failed: {r.error}")
        print("initial test run completed; starting the benchmark", file=sys.stderr)

    limit = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    arrival_rng = random.Random(args.seed + 1)

    async def limited(i):
        if limit is None:
            return await run_one(ep, args, model, prompts[i][0], prompts[i][1], out_lens[i])
        async with limit:
            return await run_one(ep, args, model, prompts[i][0], prompts[i][1], out_lens[i])

    tasks = []
    done = 0
    start = time.perf_counter()

    def progress(_):
        nonlocal done
        done += 1
        if not args.quiet and (done % max(1, args.num_prompts // 10) == 0 or done == args.num_prompts):
            print(f"  {done}/{args.num_prompts} done", file=sys.stderr)

    async for i in arrivals(args.num_prompts, args.request_rate, args.burstiness, arrival_rng):
        t = asyncio.create_task(limited(i))
        t.add_done_callback(progress)
        tasks.append(t)
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start

    m, ps = summarize(results, duration, args)
    print_table(m, ps, args)
    errors = [r.error for r in results if not r.ok]
    if errors:
        print(f"first errors: {errors[:3]}", file=sys.stderr)
    if args.result_json:
        out = dict(m)
        out.update({
            "model_id": model,
            "endpoint": args.endpoint,
            "base_url": args.base_url,
            "num_prompts": args.num_prompts,
            "random_input_len": args.random_input_len,
            "random_output_len": args.random_output_len,
            "random_range_ratio": args.random_range_ratio,
            "seed": args.seed,
            "ignore_eos": args.ignore_eos,
            "request_rate": "inf" if args.request_rate == float("inf") else args.request_rate,
            "date": time.strftime("%Y%m%d-%H%M%S"),
            "input_lens": [r.prompt_len for r in results],
            "output_lens": [r.output_len for r in results],
            "ttfts": [r.ttft for r in results],
            "itls": [r.itl for r in results],
            "e2els": [r.e2e for r in results],
            "errors": [r.error for r in results],
        })
        with open(args.result_json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.result_json}", file=sys.stderr)
    return 0 if not errors else 1


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Benchmark an OpenAI-compatible server with streamed requests (like `vllm bench serve`).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server URL (no /v1)")
    p.add_argument("--endpoint", default="/v1/completions",
                   choices=["/v1/completions", "/v1/chat/completions"])
    p.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None, help="sent as Authorization: Bearer KEY")
    p.add_argument("--dataset-name", default="random", choices=["random"],
                   help="prompts of random words cut to the wanted token count")
    p.add_argument("--tokenizer", default=None,
                   help="build prompts with this tokenizer (GGUF file, HF directory or tokenizer.json) "
                        "instead of the server's /tokenize; needed for servers without vLLM's /tokenize")
    p.add_argument("--tessera-bin", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                         "..", "build", "tessera"),
                   help="the tessera binary that reads --tokenizer")
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="most requests in flight at once (default: unlimited)")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second, Poisson arrivals; inf sends all at once")
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the inter-arrival times (1 = Poisson)")
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="lengths drawn uniformly from [len*(1-r), len*(1+r)]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--ignore-eos", dest="ignore_eos", action="store_true", default=True,
                   help="generate exactly the asked output length (default for the random dataset)")
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    p.add_argument("--metric-percentiles", default="99", help="comma-separated percentiles")
    p.add_argument("--result-json", default=None, help="write metrics and per-request data here")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for response headers")
    p.add_argument("--skip-test-run", action="store_true", help="no initial single request")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--save-prompts", default=None,
                   help="also write the prompts, one per line (whitespace collapsed), to this file")
    args = p.parse_args(argv)
    if args.num_prompts < 1:
        p.error("--num-prompts must be >= 1")
    if args.random_input_len < 1 or args.random_output_len < 1:
        p.error("--random-input-len and --random-output-len must be >= 1")
    if not 0.0 <= args.random_range_ratio < 1.0:
        p.error("--random-range-ratio must be in [0, 1)")
    if args.request_rate <= 0:
        p.error("--request-rate must be > 0 (inf for all at once)")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        p.error("--max-concurrency must be >= 1")
    if args.tokenizer and not os.path.exists(args.tokenizer):
        p.error(f"--tokenizer {args.tokenizer}: no such file or directory")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        return asyncio.run(main_async(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""Background responses (POST /v1/responses with "background": true) end to end on the
default model.

- answered at once ("queued": no output, no usage), polled through "in_progress" to the
  same object the foreground request gives (text, status, usage, echoed fields), which
  then continues a conversation as any stored response does;
- cancel answers with the "cancelled" object once its work has stopped (what it made so
  far, the last item incomplete; no request left running, KV freed), the same object on
  GET and on a second cancel; cancel of a synchronous or finished response is 400 with
  OpenAI's messages, of an unknown one 404;
- a running one deleted is gone at once and stays gone after its work ends;
- the official client's create(background=True) / retrieve / cancel, strictly validated;
- its usage is charged to the request's API key (tpm and the per-key counters) when it
  ends, though its HTTP answer went long before;
- streamed (`stream: true`): the same events as a foreground stream (strict SSE,
  consecutive sequence numbers, OpenAI's order) and the stored object equal to the last
  event's; a client that drops the stream does not stop it, and
  GET ?stream=true&starting_after=N resumes with event N+1 — the two parts make the whole
  stream; a cancel ends the followers' streams without a last event; bad resumptions are
  400 (not running, not streamed, a bad or too large starting_after), unknown ids 404; the
  official client's create(stream=True) / retrieve(stream=True, starting_after=N).
Run by `make test`, `make asan` and `make tsan` (the registry's threads: cancel and
delete on HTTP threads, the job's end on the scheduler thread)."""
import json
import time

import pytest

from server_util import HttpConn, check_error, run_server
from test_responses import (MAX_MODEL_LEN, chat, check_lifecycle, client_of, model_of, output_text, respond,
                            stream_events)


@pytest.fixture(scope="module")
def plain(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN) as srv:
        yield srv



def poll(srv, rid, until, timeout=120):
    """GETs response rid until until(obj) holds; returns the statuses seen and the object."""
    seen, deadline = [], time.monotonic() + timeout
    while True:
        obj = srv.get_json(f"/v1/responses/{rid}")
        if not seen or seen[-1] != obj["status"]:
            seen.append(obj["status"])
        if until(obj):
            return seen, obj
        assert time.monotonic() < deadline, (seen, srv.stderr_tail())
        time.sleep(0.02)


def running(srv):
    m = srv.metrics()
    return m.get("tessera:responses_background_running"), m.get("vllm:num_requests_running")


def start_long(srv, **kw):
    """A background response that runs for seconds (ignore_eos), seen in progress."""
    r = respond(srv, input="Count from one to one thousand.", background=True, max_output_tokens=900,
                ignore_eos=True, **kw)
    assert r["status"] in ("queued", "in_progress")
    poll(srv, r["id"], lambda o: o["status"] == "in_progress")
    return r


def test_background_runs_detached(plain):
    inp = "Write one sentence about the sea."
    r = respond(plain, input=inp, background=True, max_output_tokens=40)
    # answered at submission: queued, nothing yet
    assert r["status"] == "queued" and r["background"] is True and r["store"] is True
    assert r["output"] == [] and r["usage"] is None and r["id"].startswith("resp_")
    seen, final = poll(plain, r["id"], lambda o: o["status"] not in ("queued", "in_progress"))
    assert seen[-1] == "incomplete" or seen[-1] == "completed", seen
    assert set(seen[:-1]) <= {"queued", "in_progress"}, seen
    # the same answer as the same request in the foreground
    ref = respond(plain, input=inp, max_output_tokens=40, store=False)
    assert output_text(final) == output_text(ref) and final["background"] is True
    # the rest of the object too, but the prefix cache's share of the input
    diff = ("id", "created_at", "output", "background", "store", "usage")
    assert {k: v for k, v in final.items() if k not in diff} == {k: v for k, v in ref.items() if k not in diff}
    diff = ("input_tokens_details",)
    assert {k: v for k, v in final["usage"].items() if k not in diff} == \
        {k: v for k, v in ref["usage"].items() if k not in diff}
    # it continues a conversation as any stored response does
    r2 = respond(plain, input="Now one about the sky.", previous_response_id=r["id"])
    ref = chat(plain, [{"role": "user", "content": inp}, {"role": "assistant", "content": output_text(final)},
                       {"role": "user", "content": "Now one about the sky."}])
    assert output_text(r2) == ref["choices"][0]["message"]["content"]
    assert running(plain)[0] == 0


def test_background_cancel(plain):
    r = start_long(plain)
    assert running(plain) == (1, 1)
    c = plain.request("POST", f"/v1/responses/{r['id']}/cancel")
    assert c.status == 200, (c.status, c.body[:300])
    obj = c.json()
    # answered once it has stopped: its final object, what it made so far
    assert obj["id"] == r["id"] and obj["status"] == "cancelled" and obj["error"] is None
    assert 0 < obj["usage"]["output_tokens"] < 900 and obj["output"][-1]["status"] == "incomplete"
    assert output_text(obj)
    assert plain.get_json(f"/v1/responses/{r['id']}") == obj
    assert running(plain) == (0, 0)
    # cancelling again gives the same object
    again = plain.request("POST", f"/v1/responses/{r['id']}/cancel")
    assert again.status == 200 and again.json() == obj


def test_cancel_what_is_not_running(plain):
    r = respond(plain, input="Hi!", max_output_tokens=4)
    e = check_error(plain.request("POST", f"/v1/responses/{r['id']}/cancel"), 400, type_="invalid_request_error")
    assert e["message"] == "Cannot cancel a synchronous response."
    b = respond(plain, input="Hi!", max_output_tokens=4, background=True)
    poll(plain, b["id"], lambda o: o["status"] == "incomplete")
    e = check_error(plain.request("POST", f"/v1/responses/{b['id']}/cancel"), 400)
    assert e["message"] == "Cannot cancel a response that is already incomplete."
    check_error(plain.request("POST", "/v1/responses/resp_nosuchthing/cancel"), 404, code="response_not_found")
    check_error(plain.request("POST", f"/v1/responses/{b['id']}/stop"), 404)
    check_error(plain.request("POST", f"/v1/responses/{b['id']}"), 404)


def test_delete_running_background(plain):
    r = start_long(plain)
    d = plain.request("DELETE", f"/v1/responses/{r['id']}")
    assert d.status == 200 and d.json()["deleted"] is True
    check_error(plain.request("GET", f"/v1/responses/{r['id']}"), 404, code="response_not_found")
    # its work stops, and its end does not bring it back
    deadline = time.monotonic() + 30
    while running(plain) != (0, 0):
        assert time.monotonic() < deadline, plain.stderr_tail()
        time.sleep(0.05)
    check_error(plain.request("GET", f"/v1/responses/{r['id']}"), 404, code="response_not_found")
    check_error(plain.request("POST", f"/v1/responses/{r['id']}/cancel"), 404, code="response_not_found")


def test_background_official_client(plain):
    c, model = client_of(plain), model_of(plain)
    r = c.responses.create(model=model, input="Say hello.", max_output_tokens=8, temperature=0, background=True)
    assert r.status == "queued" and r.background is True
    deadline = time.monotonic() + 60
    while r.status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
        r = c.responses.retrieve(r.id)
    assert r.status in ("completed", "incomplete") and r.output_text
    long = c.responses.create(model=model, input="Count to one thousand.", max_output_tokens=900, temperature=0,
                              background=True, extra_body={"ignore_eos": True})
    cancelled = c.responses.cancel(long.id)
    assert cancelled.id == long.id and cancelled.status == "cancelled"
    assert c.responses.retrieve(long.id).status == "cancelled"


def test_background_usage_charged_to_its_key(tessera_bin, default_model, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("team-bg sk-bg-5d1a\n")
    auth = {"Authorization": "Bearer sk-bg-5d1a"}
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN, "--api-key-file", keys) as srv:
        r = srv.post_json("/v1/responses", {"input": "Hi!", "max_output_tokens": 12, "background": True},
                          headers=auth)
        assert r.status == 200, r.body[:300]
        rid = r.json()["id"]
        deadline = time.monotonic() + 60
        while (obj := srv.get_json(f"/v1/responses/{rid}", headers=auth))["status"] in ("queued", "in_progress"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        m = srv.metrics(headers=auth)
        assert m.get("tessera:api_key_prompt_tokens_total", key_name="team-bg") == obj["usage"]["input_tokens"]
        assert m.get("tessera:api_key_generation_tokens_total", key_name="team-bg") == obj["usage"]["output_tokens"]
        assert srv.request("GET", f"/v1/responses/{rid}").status == 401


# ------------------------------------------------------------------------ streamed


class EventStream:
    """A response's SSE events read as they come (keep-alive comments skipped), checked
    strictly: "event: T" then "data: {json of type T}"."""

    def __init__(self, srv, method, path, body=None):
        self.conn = HttpConn(srv.host, srv.port, timeout=120)
        self.conn.send_request(method, path, body=json.dumps(body).encode() if body is not None else None)
        self.status, _, self.headers, _ = self.conn.read_head()
        self.pieces = self.conn.iter_body(self.headers, status=self.status)
        self.buf = b""

    def body_json(self):
        return json.loads(b"".join(p for _, p in self.pieces))

    def events(self):
        assert self.status == 200, (self.status, self.body_json())
        for _, piece in self.pieces:
            self.buf += piece
            while b"\n\n" in self.buf:
                blk, self.buf = self.buf.split(b"\n\n", 1)
                text = blk.decode("utf-8")
                if text.startswith(":"):
                    continue
                lines = text.split("\n")
                assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), text
                ev = json.loads(lines[1][len("data: "):])
                assert ev["type"] == lines[0][len("event: "):], text
                yield ev
        assert self.buf == b"", self.buf

    def close(self):
        self.conn.close()


def start_stream(srv, **kw):
    kw.setdefault("temperature", 0)
    return EventStream(srv, "POST", "/v1/responses", dict(kw, background=True, stream=True))


def numbered(events, first=0):
    assert [e["sequence_number"] for e in events] == list(range(first, first + len(events))), \
        [e["sequence_number"] for e in events]
    return events


def test_background_stream(plain):
    inp = "Tell me about the moon."
    events = numbered(list(start_stream(plain, input=inp, max_output_tokens=40).events()))
    final, deltas = check_lifecycle(events)
    assert final["background"] is True and "".join(deltas.values()) == output_text(final)
    # what the foreground stream gives, and stored before its last event
    ref, _ = check_lifecycle(stream_events(plain, input=inp, max_output_tokens=40, store=False))
    assert output_text(final) == output_text(ref) and final["status"] == ref["status"]
    assert plain.get_json(f"/v1/responses/{final['id']}") == final
    assert running(plain)[0] == 0


def test_background_stream_outlives_its_client_and_resumes(plain):
    s = start_stream(plain, input="Count from one to one thousand.", max_output_tokens=300, ignore_eos=True)
    first = []
    for ev in s.events():
        first.append(ev)
        if len(first) == 12:
            break
    s.close()  # the client goes; the response does not
    rid = first[0]["response"]["id"]
    assert plain.get_json(f"/v1/responses/{rid}")["status"] in ("queued", "in_progress")
    r = EventStream(plain, "GET", f"/v1/responses/{rid}?stream=true&starting_after=11")
    rest = list(r.events())
    numbered(rest, first=12)
    final, deltas = check_lifecycle(numbered(first + rest))
    assert final["status"] == "incomplete" and final["usage"]["output_tokens"] == 300
    assert "".join(deltas.values()) == output_text(final)
    assert plain.get_json(f"/v1/responses/{rid}") == final
    assert running(plain)[0] == 0


def test_background_stream_followers_and_cancel(plain):
    s = start_stream(plain, input="Count from one to one thousand.", max_output_tokens=900, ignore_eos=True)
    it = s.events()
    head = [next(it) for _ in range(6)]
    rid = head[0]["response"]["id"]
    # another client follows from the start: the same events
    other = EventStream(plain, "GET", f"/v1/responses/{rid}?stream=true")
    oit = other.events()
    assert [next(oit) for _ in range(6)] == head
    bad = plain.request("GET", f"/v1/responses/{rid}?stream=true&starting_after=1000000")
    check_error(bad, 400)
    c = plain.request("POST", f"/v1/responses/{rid}/cancel")
    assert c.status == 200 and c.json()["status"] == "cancelled"
    # both streams end, with the same events and without a last response event
    rest, orest = list(it), list(oit)
    assert rest == orest
    numbered(head + rest)
    assert not {e["type"] for e in rest} & {"response.completed", "response.incomplete", "response.failed"}
    assert plain.get_json(f"/v1/responses/{rid}")["status"] == "cancelled"
    assert running(plain) == (0, 0)


def test_background_stream_errors(plain):
    done = respond(plain, input="Hi!", max_output_tokens=4)
    e = check_error(plain.request("GET", f"/v1/responses/{done['id']}?stream=true"), 400)
    assert "not running" in e["message"]
    check_error(plain.request("GET", "/v1/responses/resp_nosuchthing?stream=true"), 404, code="response_not_found")
    for q in ("starting_after=-1", "starting_after=x", "starting_after="):
        check_error(plain.request("GET", f"/v1/responses/{done['id']}?stream=true&{q}"), 400,
                    param="starting_after")
    r = start_long(plain)  # background, not streamed
    e = check_error(plain.request("GET", f"/v1/responses/{r['id']}?stream=true"), 400)
    assert "'stream': true" in e["message"]
    assert plain.request("POST", f"/v1/responses/{r['id']}/cancel").status == 200
    # without stream=true a GET is the object, whatever else the query holds
    assert plain.get_json(f"/v1/responses/{done['id']}?stream=false&starting_after=3") == done


def test_background_stream_official_client(plain):
    c, model = client_of(plain), model_of(plain)
    seen = []
    with c.responses.create(model=model, input="Count to one thousand.", max_output_tokens=200, temperature=0,
                            background=True, stream=True, extra_body={"ignore_eos": True}) as stream:
        for ev in stream:
            seen.append(ev)
            if len(seen) == 8:
                break
    rid = seen[0].response.id
    rest = list(c.responses.retrieve(rid, stream=True, starting_after=seen[-1].sequence_number))
    assert [e.sequence_number for e in seen + rest] == list(range(len(seen) + len(rest)))
    assert rest[-1].type == "response.incomplete" and rest[-1].response.background is True
    text = "".join(e.delta for e in seen + rest if e.type == "response.output_text.delta")
    assert text == rest[-1].response.output_text == c.responses.retrieve(rid).output_text

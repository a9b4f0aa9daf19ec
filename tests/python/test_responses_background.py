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
  ends, though its HTTP answer went long before.
Run by `make test`, `make asan` and `make tsan` (the registry's threads: cancel and
delete on HTTP threads, the job's end on the scheduler thread)."""
import time

import pytest

from server_util import check_error, run_server
from test_responses import MAX_MODEL_LEN, chat, client_of, model_of, output_text, respond


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

"""vLLM's priority scheduling end to end (`--scheduling-policy priority`, the request field
`priority`: lower is served sooner).

- With one seat busy, a request of priority 5 queued first and one of priority 0 queued
  after it: the second is admitted first, and finishes before the first starts; under
  the default fcfs policy the same two finish in arrival order.
- The answer does not depend on the priority (greedy text equal at 0 and at -3).
- Under fcfs a non-zero priority is 400 naming `priority` (as vLLM), 0 is accepted;
  a priority that is not an integer is 400 under either policy; the Responses API
  passes it through."""
import threading
import time

import pytest

from server_util import check_error, run_server

MAX_MODEL_LEN = 512


@pytest.fixture(scope="module")
def prio(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN, "--max-num-seqs", 1,
                    "--scheduling-policy", "priority") as srv:
        yield srv


@pytest.fixture(scope="module")
def fcfs(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN, "--max-num-seqs", 1) as srv:
        yield srv


def waiting(srv):
    return srv.metrics().get("vllm:num_requests_waiting")


def finish_order(srv, priorities):
    """Occupies the only seat with a long request, queues one short request per priority
    (in list order, each after the previous is seen waiting), and returns the indices of
    the short ones in the order they finished."""
    done, lock = [], threading.Lock()

    def post(i, body):
        r = srv.post_json("/v1/completions", body)
        assert r.status == 200, r.body[:300]
        with lock:
            done.append(i)

    long_body = {"prompt": "Once upon a time", "max_tokens": 160, "ignore_eos": True, "temperature": 0}
    threads = [threading.Thread(target=post, args=(-1, long_body))]
    threads[0].start()
    deadline = time.monotonic() + 30
    while srv.metrics().get("vllm:num_requests_running") != 1:
        assert time.monotonic() < deadline, "the long request never ran"
        time.sleep(0.02)
    for i, p in enumerate(priorities):
        body = {"prompt": f"Request {i}:", "max_tokens": 4, "ignore_eos": True, "temperature": 0}
        if p:
            body["priority"] = p
        t = threading.Thread(target=post, args=(i, body))
        t.start()
        threads.append(t)
        while waiting(srv) != i + 1:  # queued behind the long one, in this order
            assert time.monotonic() < deadline, f"request {i} never queued"
            time.sleep(0.01)
    for t in threads:
        t.join(60)
    assert done[0] == -1, done  # nobody overtakes a running request
    return done[1:]


def test_lower_priority_value_goes_first(prio):
    assert finish_order(prio, [5, 0, 5, -1]) == [3, 1, 0, 2]


def test_fcfs_keeps_arrival_order(fcfs):
    assert finish_order(fcfs, [0, 0, 0]) == [0, 1, 2]


def test_text_does_not_depend_on_priority(prio):
    def text(p):
        r = prio.post_json("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name a fruit."}],
                                                     "max_tokens": 16, "temperature": 0, "priority": p})
        assert r.status == 200, r.body[:300]
        return r.json()["choices"][0]["message"]["content"]

    assert text(0) == text(-3)
    r = prio.post_json("/v1/responses", {"input": "Name a fruit.", "max_output_tokens": 8, "priority": 2})
    assert r.status == 200, r.body[:300]


def test_errors(prio, fcfs):
    body = {"prompt": "hi", "max_tokens": 2}
    e = check_error(fcfs.post_json("/v1/completions", dict(body, priority=1)), 400, param="priority")
    assert "--scheduling-policy priority" in e["message"]
    check_error(fcfs.post_json("/v1/responses", {"input": "hi", "priority": -2}), 400, param="priority")
    assert fcfs.post_json("/v1/completions", dict(body, priority=0)).status == 200
    for srv in (prio, fcfs):
        for bad in ("high", 1.5, True):
            check_error(srv.post_json("/v1/completions", dict(body, priority=bad)), 400, param="priority")

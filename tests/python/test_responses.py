"""POST /v1/responses (OpenAI's Responses API) end to end on the default model.

The endpoint rewrites a Responses request into the chat request it means, so the chat
endpoint on the same server is the reference: the same greedy text, the same token counts.
- text: a string input, message items (content parts, instructions, developer role) and
  a tool round trip (function_call / function_call_output items) answer what the
  equivalent chat messages answer; non-streamed, streamed raw (strict SSE: "event:" and
  "data:" lines, consecutive sequence numbers, no [DONE]) and through the official
  client (strict validation, its stream helper's consistency checks);
- max_output_tokens: status "incomplete" with reason max_output_tokens;
- logprobs (include / top_logprobs): the same list chat gives, whole and split over the
  streamed deltas (the end token's on an empty delta);
- text.format json_schema: a document valid under the schema;
- tools (`--enable-auto-tool-choice --tool-call-parser hermes`): a call forced by
  guided_regex comes back as a message item then a function_call item, streamed as the
  function_call_arguments events; tool_choice naming a function forces it;
- reasoning (`--reasoning-parser deepseek_r1`, where SmolLM2 never closes <think>): one
  reasoning item holding the plain server's text, counted as reasoning tokens;
- stored responses (`store`, on by default; `--response-store-mb`): previous_response_id
  continues a conversation exactly as sending its items would (instructions not carried
  over; a function_call answered by a function_call_output item), also right after a
  stream's last event; GET /v1/responses/{id} returns the response as it was sent, DELETE
  forgets it; GET /v1/responses/{id}/input_items lists the conversation's items (ids kept,
  typed as the API types them, newest first or oldest first, paged by limit and after;
  the official client's paginator); store false and a server keeping none store nothing;
- background responses: test_responses_background.py;
- errors: 400 naming the Responses field (input, max_output_tokens, text.format, tools,
  store, ...), 404 for an unknown model or response."""
import json

import jsonschema
import openai
import pytest

from server_util import check_error, run_server

MAX_MODEL_LEN = 1024
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False}, "strict": True}
NOW = dict(WEATHER, name="get_time", description="Local time in a city")


def regex_of(text):
    """A regex matching exactly text (for guided_regex)."""
    return "".join("\\" + ch if ch in ".^$*+?()[]{}|\\" else ("\\n" if ch == "\n" else ch) for ch in text)


@pytest.fixture(scope="module")
def plain(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN) as srv:
        yield srv


@pytest.fixture(scope="module")
def tools(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN,
                    "--enable-auto-tool-choice", "--tool-call-parser", "hermes") as srv:
        yield srv


@pytest.fixture(scope="module")
def r1(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN,
                    "--reasoning-parser", "deepseek_r1") as srv:
        yield srv


def client_of(srv):
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=120, _strict_response_validation=True)


def model_of(srv):
    return srv.get_json("/v1/models")["data"][0]["id"]


def respond(srv, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_output_tokens", 24)
    r = srv.post_json("/v1/responses", kw)
    assert r.status == 200, (r.status, r.body[:500], srv.stderr_tail())
    return r.json()


def chat(srv, messages, max_tokens=24, **kw):
    r = srv.post_json("/v1/chat/completions", dict(messages=messages, max_tokens=max_tokens, temperature=0, **kw))
    assert r.status == 200, (r.status, r.body[:500])
    return r.json()


def output_text(resp):
    return "".join(p["text"] for it in resp["output"] if it["type"] == "message"
                   for p in it["content"] if p["type"] == "output_text")


def stream_events(srv, **kw):
    """A streamed response's events, checked strictly: blocks of exactly "event: T" and
    "data: {json with type T}", sequence numbers 0, 1, 2, ..., no [DONE]."""
    kw.setdefault("temperature", 0)
    kw.setdefault("max_output_tokens", 24)
    r = srv.post_json("/v1/responses", dict(kw, stream=True))
    assert r.status == 200, (r.status, r.body[:500])
    assert r.header("Content-Type", "").startswith("text/event-stream")
    text = r.body.decode("utf-8")
    assert text.endswith("\n\n") and "\r" not in text and "[DONE]" not in text
    events = []
    for blk in text[:-2].split("\n\n"):
        lines = blk.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), blk
        ev = json.loads(lines[1][len("data: "):])
        assert ev["type"] == lines[0][len("event: "):], blk
        assert ev["sequence_number"] == len(events), blk
        events.append(ev)
    return events


def check_lifecycle(events):
    """The order OpenAI streams in: created, in_progress, then each item added → (part
    added) → deltas → done events, and one final response event; returns the final
    response and the text of every delta per output index."""
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    rid = events[0]["response"]["id"]
    assert rid.startswith("resp_") and events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["output"] == []
    open_item, deltas, done = None, {}, {}
    for ev in events[2:-1]:
        t = ev["type"]
        if t == "response.output_item.added":
            assert open_item is None, ev
            open_item = ev["item"]
            assert ev["output_index"] == len(done), ev
            deltas[ev["output_index"]] = ""
        elif t == "response.output_item.done":
            assert ev["item"]["id"] == open_item["id"] and ev["output_index"] == len(done), ev
            done[ev["output_index"]] = ev["item"]
            open_item = None
        else:
            assert open_item is not None and ev["item_id"] == open_item["id"], ev
            if t.endswith(".delta"):
                deltas[ev["output_index"]] += ev["delta"]
    assert open_item is None
    last = events[-1]
    assert last["type"] in ("response.completed", "response.incomplete"), last
    final = last["response"]
    assert final["id"] == rid and final["output"] == [done[i] for i in range(len(done))]
    return final, deltas


# ------------------------------------------------------------------------ text


INPUTS = [
    ("What is the capital of France?", [{"role": "user", "content": "What is the capital of France?"}]),
    ([{"role": "user", "content": [{"type": "input_text", "text": "Name three colors."}]}],
     [{"role": "user", "content": "Name three colors."}]),
    ([{"type": "message", "role": "developer", "content": "Answer in French."},
      {"role": "user", "content": "Good morning!"},
      {"role": "assistant", "content": [{"type": "output_text", "text": "Bonjour !"}]},
      {"role": "user", "content": [{"type": "input_text", "text": "How are "}, {"type": "input_text", "text": "you?"}]}],
     [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Good morning!"},
      {"role": "assistant", "content": "Bonjour !"},
      {"role": "user", "content": [{"type": "text", "text": "How are "}, {"type": "text", "text": "you?"}]}]),
]


@pytest.mark.parametrize("inp,messages", INPUTS)
def test_text_matches_chat(plain, inp, messages):
    ref = chat(plain, messages)
    resp = respond(plain, input=inp)
    assert resp["object"] == "response" and resp["id"].startswith("resp_")
    assert output_text(resp) == ref["choices"][0]["message"]["content"]
    assert resp["usage"]["input_tokens"] == ref["usage"]["prompt_tokens"]
    assert resp["usage"]["output_tokens"] == ref["usage"]["completion_tokens"]
    assert resp["usage"]["total_tokens"] == ref["usage"]["total_tokens"]
    (item,) = resp["output"]
    assert item["type"] == "message" and item["role"] == "assistant" and item["id"].startswith("msg_")
    finish = ref["choices"][0]["finish_reason"]
    assert resp["status"] == ("incomplete" if finish == "length" else "completed")


def test_instructions_are_a_system_message(plain):
    q = "Tell me about the sea."
    ref = chat(plain, [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": q}])
    resp = respond(plain, input=q, instructions="You are a pirate.")
    assert output_text(resp) == ref["choices"][0]["message"]["content"]
    assert resp["instructions"] == "You are a pirate." and resp["max_output_tokens"] == 24


def test_stream_matches_whole(plain):
    whole = respond(plain, input="Write a haiku about rain.", max_output_tokens=40)
    events = stream_events(plain, input="Write a haiku about rain.", max_output_tokens=40)
    final, deltas = check_lifecycle(events)
    assert deltas[0] == output_text(whole) == output_text(final)
    for key in ("input_tokens", "output_tokens", "total_tokens", "output_tokens_details"):
        assert final["usage"][key] == whole["usage"][key], key
    assert final["usage"]["input_tokens_details"]["cached_tokens"] > 0  # the same prompt again
    assert final["status"] == whole["status"]
    types = [e["type"] for e in events]
    assert types[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert types.count("response.output_text.delta") >= 2


def test_official_client(plain):
    c, model = client_of(plain), model_of(plain)
    whole = c.responses.create(model=model, input="What is 2+2?", max_output_tokens=30, temperature=0)
    assert whole.output_text and whole.usage.output_tokens > 0
    with c.responses.stream(model=model, input="What is 2+2?", max_output_tokens=30, temperature=0) as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert text == final.output_text == whole.output_text


def test_max_output_tokens_is_incomplete(plain):
    resp = respond(plain, input="Tell me a long story.", max_output_tokens=4)
    assert resp["status"] == "incomplete" and resp["incomplete_details"] == {"reason": "max_output_tokens"}
    assert resp["usage"]["output_tokens"] == 4 and resp["output"][0]["status"] == "incomplete"
    events = stream_events(plain, input="Tell me a long story.", max_output_tokens=4)
    final, _ = check_lifecycle(events)
    assert events[-1]["type"] == "response.incomplete" and final["incomplete_details"]["reason"] == "max_output_tokens"


def test_json_schema_format(plain):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    resp = respond(plain, input="Invent a person.", max_output_tokens=64,
                   text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
    assert resp["status"] == "completed", resp
    jsonschema.validate(json.loads(output_text(resp)), schema)
    assert resp["text"]["format"]["name"] == "person"


def test_tool_round_trip_items_match_chat(plain):
    args = json.dumps({"city": "Paris"})
    ref = chat(plain, [{"role": "user", "content": "Weather in Paris?"},
                       {"role": "assistant", "content": None, "tool_calls": [
                           {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
                       {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'}],
               tools=[{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}],
               tool_choice="none")
    resp = respond(plain, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": args},
        {"type": "function_call_output", "call_id": "call_1", "output": '{"sky": "clear"}'}],
        tools=[WEATHER], tool_choice="none")
    assert output_text(resp) == ref["choices"][0]["message"]["content"]
    assert resp["usage"]["input_tokens"] == ref["usage"]["prompt_tokens"]


def test_text_and_calls_make_one_assistant_message(plain):
    # an assistant message item, then two calls: one chat message with content and tool_calls
    args = [json.dumps({"city": c}) for c in ("Paris", "Oslo")]
    calls = [{"id": f"call_{k}", "type": "function", "function": {"name": "get_weather", "arguments": a}}
             for k, a in enumerate(args)]

    def tokens(messages):
        r = plain.post_json("/tokenize", {"messages": messages})
        assert r.status == 200, r.body[:300]
        return r.json()["tokens"]

    ref = chat(plain, [{"role": "user", "content": "Weather?"},
                       {"role": "assistant", "content": "Let me check.", "tool_calls": calls},
                       {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
                       {"role": "tool", "tool_call_id": "call_1", "content": "rain"}], max_tokens=8)
    resp = respond(plain, max_output_tokens=8, input=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Let me check."}]},
        {"type": "function_call", "call_id": "call_0", "name": "get_weather", "arguments": args[0]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": args[1]},
        {"type": "function_call_output", "call_id": "call_0", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_1", "output": "rain"}])
    assert resp["usage"]["input_tokens"] == ref["usage"]["prompt_tokens"]
    assert output_text(resp) == ref["choices"][0]["message"]["content"]
    # two assistant messages instead of one render differently, so the check above can tell
    split = tokens([{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "Let me check."},
                    {"role": "assistant", "content": None, "tool_calls": calls}])
    joined = tokens([{"role": "user", "content": "Weather?"},
                     {"role": "assistant", "content": "Let me check.", "tool_calls": calls}])
    assert len(split) != len(joined)


@pytest.mark.parametrize("question,limit", [("Count to five.", 12), ("What is 2+2?", 40)], ids=["length", "stop"])
def test_logprobs_match_chat(plain, question, limit):
    messages = [{"role": "user", "content": question}]
    body = chat(plain, messages, max_tokens=limit, logprobs=True, top_logprobs=3)
    ref = body["choices"][0]["logprobs"]["content"]
    assert len(ref) == body["usage"]["completion_tokens"] and all(len(t["top_logprobs"]) == 3 for t in ref)
    assert body["choices"][0]["finish_reason"] == ("length" if limit == 12 else "stop")
    resp = respond(plain, input=messages, max_output_tokens=limit, top_logprobs=3,
                   include=["message.output_text.logprobs"])
    assert resp["output"][0]["content"][0]["logprobs"] == ref
    assert resp["top_logprobs"] == 3
    # streamed: each delta carries its tokens' logprobs; together they are the whole list
    events = stream_events(plain, input=messages, max_output_tokens=limit, top_logprobs=3)
    final, _ = check_lifecycle(events)
    streamed = [lp for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]
    (done,) = [e for e in events if e["type"] == "response.output_text.done"]
    assert streamed == done["logprobs"] == ref == final["output"][0]["content"][0]["logprobs"]
    # include alone: the chosen tokens without alternatives; neither: none
    resp = respond(plain, input=messages, max_output_tokens=limit, include=["message.output_text.logprobs"])
    assert [(t["token"], t["top_logprobs"]) for t in resp["output"][0]["content"][0]["logprobs"]] == \
        [(t["token"], []) for t in ref]
    assert respond(plain, input=messages, max_output_tokens=limit)["output"][0]["content"][0]["logprobs"] == []


# ------------------------------------------------------------------------ tool calls


def test_function_call_item(tools):
    resp = respond(tools, input="Weather in Paris?", tools=[WEATHER, NOW], max_output_tokens=64,
                   guided_regex=regex_of("Sure. " + CALL_TEXT))
    msg, call = resp["output"]
    assert msg["type"] == "message" and output_text(resp) == "Sure. "
    assert call["type"] == "function_call" and call["name"] == "get_weather" and call["status"] == "completed"
    assert call["id"].startswith("fc_") and call["call_id"].startswith("call_")
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert [t["name"] for t in resp["tools"]] == ["get_weather", "get_time"]


def test_function_call_streamed(tools):
    events = stream_events(tools, input="Weather in Paris?", tools=[WEATHER], max_output_tokens=64,
                           guided_regex=regex_of("Sure. " + CALL_TEXT))
    final, deltas = check_lifecycle(events)
    assert deltas == {0: "Sure. ", 1: final["output"][1]["arguments"]}
    assert json.loads(deltas[1]) == {"city": "Paris"}
    added = [e for e in events if e["type"] == "response.output_item.added"][1]
    assert added["item"]["type"] == "function_call" and added["item"]["arguments"] == ""
    (args_done,) = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert args_done["arguments"] == deltas[1] and args_done["name"] == "get_weather"
    c = client_of(tools)
    with c.responses.stream(model=model_of(tools), input="Weather in Paris?", tools=[WEATHER],
                            max_output_tokens=64, temperature=0,
                            extra_body={"guided_regex": regex_of(CALL_TEXT)}) as s:
        out = s.get_final_response().output
    (call,) = out
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}


def test_named_tool_choice(tools):
    # the greedy call spreads its JSON over ~80 tokens on some CPUs (the argument a
    # timestamp, a newline between tokens): 128 leave room for the first call to close
    resp = respond(tools, input="What time is it in Oslo?", tools=[WEATHER, NOW], max_output_tokens=128,
                   tool_choice={"type": "function", "name": "get_time"})
    calls = [it for it in resp["output"] if it["type"] == "function_call"]
    assert calls and all(c["name"] == "get_time" for c in calls), resp["output"]
    assert isinstance(json.loads(calls[0]["arguments"]), dict)
    assert resp["tool_choice"] == {"type": "function", "name": "get_time"}


# ------------------------------------------------------------------------ reasoning


def test_reasoning_item(r1, plain):
    base = chat(plain, [{"role": "user", "content": "Why is the sky blue?"}])["choices"][0]["message"]["content"]
    resp = respond(r1, input="Why is the sky blue?")
    (item,) = resp["output"]
    assert item["type"] == "reasoning" and item["id"].startswith("rs_") and item["summary"] == []
    assert item["content"] == [{"type": "reasoning_text", "text": base}]
    u = resp["usage"]
    assert u["output_tokens_details"]["reasoning_tokens"] == u["output_tokens"] > 0
    events = stream_events(r1, input="Why is the sky blue?")
    final, deltas = check_lifecycle(events)
    assert deltas == {0: base} and final["output"][0]["content"] == item["content"]
    assert {e["type"] for e in events} >= {"response.reasoning_text.delta", "response.reasoning_text.done"}
    assert "response.output_text.delta" not in {e["type"] for e in events}


# ------------------------------------------------------------------------ stored responses


def test_previous_response_continues_the_conversation(plain):
    r1 = respond(plain, input="My name is Ada. Say hello.", instructions="Be brief.")
    assert r1["store"] is True and r1["previous_response_id"] is None
    r2 = respond(plain, input="What is my name?", previous_response_id=r1["id"])
    assert r2["previous_response_id"] == r1["id"] and r2["instructions"] is None
    # the reference: the whole conversation sent to chat; instructions do not carry over
    history = [{"role": "user", "content": "My name is Ada. Say hello."},
               {"role": "assistant", "content": output_text(r1)},
               {"role": "user", "content": "What is my name?"}]
    ref = chat(plain, history)
    assert output_text(r2) == ref["choices"][0]["message"]["content"]
    assert r2["usage"]["input_tokens"] == ref["usage"]["prompt_tokens"]
    # a third turn, with new instructions: they apply to it alone
    r3 = respond(plain, input=[{"role": "user", "content": "And yours?"}], previous_response_id=r2["id"],
                 instructions="Answer in French.")
    ref = chat(plain, [{"role": "system", "content": "Answer in French."}] + history +
               [{"role": "assistant", "content": output_text(r2)}, {"role": "user", "content": "And yours?"}])
    assert output_text(r3) == ref["choices"][0]["message"]["content"]
    assert r3["usage"]["input_tokens"] == ref["usage"]["prompt_tokens"]


def test_stream_is_stored_before_its_last_event(plain):
    events = stream_events(plain, input="Name a colour.")
    final, _ = check_lifecycle(events)
    assert final["store"] is True
    # asked right after the last event: already there, exactly as streamed
    assert plain.get_json(f"/v1/responses/{final['id']}") == final
    r2 = respond(plain, input="Another one?", previous_response_id=final["id"])
    ref = chat(plain, [{"role": "user", "content": "Name a colour."},
                       {"role": "assistant", "content": output_text(final)},
                       {"role": "user", "content": "Another one?"}])
    assert output_text(r2) == ref["choices"][0]["message"]["content"]


def test_get_and_delete(plain):
    r = respond(plain, input="What is 2+2?")
    assert plain.get_json(f"/v1/responses/{r['id']}") == r
    m = plain.metrics()
    kept, size = m.get("tessera:responses_stored"), m.get("tessera:responses_stored_bytes")
    assert kept >= 1 and size > len(json.dumps(r)) * 0.9 and m.types["tessera:responses_stored"] == "gauge"
    d = plain.request("DELETE", f"/v1/responses/{r['id']}")
    assert d.status == 200 and d.json() == {"id": r["id"], "object": "response", "deleted": True}
    m = plain.metrics()
    assert m.get("tessera:responses_stored") == kept - 1 and m.get("tessera:responses_stored_bytes") < size
    check_error(plain.request("GET", f"/v1/responses/{r['id']}"), 404, code="response_not_found")
    check_error(plain.request("DELETE", f"/v1/responses/{r['id']}"), 404, code="response_not_found")
    e = check_error(plain.post_json("/v1/responses", {"input": "hi", "previous_response_id": r["id"]}), 404,
                    code="previous_response_not_found", param="previous_response_id")
    assert r["id"] in e["message"]
    check_error(plain.request("GET", "/v1/responses/resp_nosuchthing"), 404, code="response_not_found")
    # store false: answered, not kept
    r = respond(plain, input="What is 2+2?", store=False)
    assert r["store"] is False
    check_error(plain.request("GET", f"/v1/responses/{r['id']}"), 404, code="response_not_found")


def test_function_call_output_continues(tools):
    r1 = respond(tools, input="Weather in Paris?", tools=[WEATHER], max_output_tokens=64,
                 guided_regex=regex_of("Sure. " + CALL_TEXT))
    call = r1["output"][1]
    assert call["type"] == "function_call"
    answer = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"sky": "clear"}'}
    r2 = respond(tools, input=[answer], previous_response_id=r1["id"], tools=[WEATHER], tool_choice="none")
    ref = respond(tools, input=[{"role": "user", "content": "Weather in Paris?"},
                                {"role": "assistant", "content": [{"type": "output_text", "text": "Sure. "}]},
                                {"type": "function_call", "call_id": call["call_id"], "name": "get_weather",
                                 "arguments": call["arguments"]}, answer],
                  tools=[WEATHER], tool_choice="none", store=False)
    assert output_text(r2) == output_text(ref) and r2["usage"]["input_tokens"] == ref["usage"]["input_tokens"]


def test_official_client_chains(plain):
    c, model = client_of(plain), model_of(plain)
    first = c.responses.create(model=model, input="My name is Ada.", max_output_tokens=16, temperature=0)
    second = c.responses.create(model=model, input="What is my name?", previous_response_id=first.id,
                                max_output_tokens=16, temperature=0)
    assert second.previous_response_id == first.id and second.output_text
    assert c.responses.retrieve(first.id).output_text == first.output_text
    c.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(first.id)


def test_input_items(plain):
    r1 = respond(plain, input="My name is Ada.", instructions="Be brief.", max_output_tokens=8)
    r2 = respond(plain, input=[{"role": "user", "content": [{"type": "input_text", "text": "And yours?"}]},
                               {"type": "message", "role": "developer", "content": "Answer in one word."}],
                 previous_response_id=r1["id"], max_output_tokens=8)
    got = plain.get_json(f"/v1/responses/{r2['id']}/input_items")
    assert got["object"] == "list" and got["has_more"] is False
    items = got["data"]
    # newest first: r2's own input, then r1's output, then r1's input (instructions are not items)
    assert [it["type"] for it in items] == ["message"] * 4
    assert [it["role"] for it in items] == ["developer", "user", "assistant", "user"]
    assert items[2]["id"] == r1["output"][0]["id"]
    assert items[2]["content"][0]["text"] == output_text(r1) and items[2]["content"][0]["type"] == "output_text"
    assert items[3]["content"] == [{"type": "input_text", "text": "My name is Ada."}]
    assert items[0]["content"] == [{"type": "input_text", "text": "Answer in one word."}]
    assert all(it["status"] == "completed" for it in items if it["role"] != "assistant")
    assert items[2]["status"] == r1["output"][0]["status"]  # an output item as it was
    ids = [it["id"] for it in items]
    assert len(set(ids)) == 4 and ids[0].startswith("msg_")
    assert got["first_id"] == ids[0] and got["last_id"] == ids[-1]
    # the ids are kept: the same list again, and r1's input items are the same items
    assert plain.get_json(f"/v1/responses/{r2['id']}/input_items") == got
    assert [it["id"] for it in plain.get_json(f"/v1/responses/{r1['id']}/input_items")["data"]] == ids[3:]
    # oldest first; pages by limit and after
    asc = plain.get_json(f"/v1/responses/{r2['id']}/input_items?order=asc")["data"]
    assert [it["id"] for it in asc] == ids[::-1]
    page = plain.get_json(f"/v1/responses/{r2['id']}/input_items?limit=3")
    assert [it["id"] for it in page["data"]] == ids[:3] and page["has_more"] is True
    page = plain.get_json(f"/v1/responses/{r2['id']}/input_items?limit=3&after={page['last_id']}")
    assert [it["id"] for it in page["data"]] == ids[3:] and page["has_more"] is False
    page = plain.get_json(f"/v1/responses/{r2['id']}/input_items?order=asc&after={ids[1]}&limit=1")
    assert [it["id"] for it in page["data"]] == [ids[0]] and page["has_more"] is False
    # the items still continue the conversation exactly (their ids change nothing)
    r3 = respond(plain, input="Thanks.", previous_response_id=r2["id"], max_output_tokens=8)
    ref = respond(plain, input=[{k: v for k, v in it.items() if k not in ("id", "status")} for it in asc] +
                  [{"role": "assistant", "content": output_text(r2)}, {"role": "user", "content": "Thanks."}],
                  max_output_tokens=8, store=False)
    assert output_text(r3) == output_text(ref) and r3["usage"]["input_tokens"] == ref["usage"]["input_tokens"]
    # errors
    for q, param in (("limit=0", "limit"), ("limit=101", "limit"), ("limit=x", "limit"), ("order=up", "order"),
                     ("after=msg_nosuchthing", "after")):
        check_error(plain.request("GET", f"/v1/responses/{r2['id']}/input_items?{q}"), 400, param=param)
    check_error(plain.request("GET", "/v1/responses/resp_nosuchthing/input_items"), 404, code="response_not_found")
    check_error(plain.request("GET", f"/v1/responses/{r2['id']}/output_items"), 404, code="response_not_found")


def test_input_items_of_calls_and_the_official_client(tools):
    r1 = respond(tools, input="Weather in Paris?", tools=[WEATHER], max_output_tokens=64,
                 guided_regex=regex_of("Sure. " + CALL_TEXT))
    call = r1["output"][1]
    answer = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"sky": "clear"}'}
    r2 = respond(tools, input=[answer], previous_response_id=r1["id"], tools=[WEATHER], tool_choice="none")
    c = client_of(tools)
    items = list(c.responses.input_items.list(r2["id"], limit=1))  # pages of one, followed by the client
    assert [it.type for it in items] == ["function_call_output", "function_call", "message", "message"]
    assert items[0].call_id == call["call_id"] and items[0].output == answer["output"] and items[0].id
    assert items[1].id == call["id"] and items[1].arguments == call["arguments"]
    assert items[2].role == "assistant" and items[3].role == "user"
    asc = list(c.responses.input_items.list(r2["id"], order="asc"))
    assert [it.id for it in asc] == [it.id for it in items][::-1]


def test_server_keeping_none(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN, "--response-store-mb", 0) as srv:
        r = respond(srv, input="Hi!", max_output_tokens=4)
        assert r["store"] is False
        check_error(srv.request("GET", f"/v1/responses/{r['id']}"), 404, code="response_not_found")
        e = check_error(srv.post_json("/v1/responses", {"input": "hi", "previous_response_id": r["id"]}), 400,
                        param="previous_response_id")
        assert "--response-store-mb" in e["message"]
        e = check_error(srv.post_json("/v1/responses", {"input": "hi", "background": True}), 400, param="background")
        assert "--response-store-mb" in e["message"]
        check_error(srv.request("POST", f"/v1/responses/{r['id']}/cancel"), 404, code="response_not_found")
        assert srv.metrics().get("tessera:responses_stored") is None


# ------------------------------------------------------------------------ errors


@pytest.mark.parametrize("body,param", [
    ({}, "input"),
    ({"input": []}, "input"),
    ({"input": 7}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content"),
    ({"input": [{"role": "wizard", "content": "hi"}]}, "input[0]"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0]"),
    ({"input": "hi", "previous_response_id": 123}, "previous_response_id"),
    ({"input": "hi", "store": "yes"}, "store"),
    ({"input": "hi", "conversation": "conv_1"}, "conversation"),
    ({"input": "hi", "background": "yes"}, "background"),
    ({"input": "hi", "background": True, "store": False}, "store"),
    ({"input": "hi", "truncation": "auto"}, "truncation"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "max_output_tokens": 2.5}, "max_output_tokens"),
    ({"input": "hi", "include": "message.output_text.logprobs"}, "include"),
    ({"input": "hi", "top_logprobs": 21}, "top_logprobs"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": "hi", "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"input": "hi", "instructions": 3}, "instructions"),
    ({"input": "hi", "temperature": -1}, "temperature"),
])
def test_bad_request_names_the_field(plain, body, param):
    r = plain.post_json("/v1/responses", body)
    check_error(r, 400, type_="invalid_request_error", param=param)


def test_errors_renamed_from_chat(plain):
    r = plain.post_json("/v1/responses", {"input": "hi", "text": {"format": {"type": "xml"}}})
    check_error(r, 400, param_prefix="text.format")
    r = plain.post_json("/v1/responses", {"input": "hi", "max_output_tokens": 5000})
    e = check_error(r, 400, code="context_length_exceeded", param="input")
    assert "'max_output_tokens'" in e["message"] and "max_tokens'" not in e["message"].replace("output_tokens'", "")
    r = plain.post_json("/v1/responses", {"input": "word " * 3000})
    check_error(r, 400, code="context_length_exceeded", param="input")
    r = plain.post_json("/v1/responses", {"input": "hi", "model": "no-such-model"})
    check_error(r, 404, code="model_not_found")
    r = plain.post_json("/v1/responses", {"input": "hi", "tools": [WEATHER], "tool_choice": "auto"})
    check_error(r, 400, param="tool_choice")  # no tool-call parser on this server

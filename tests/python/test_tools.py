"""Tool calls and reasoning output end to end on the default model (SmolLM2, whose template
renders no tools and which never writes tool markup on its own):

- `--tool-call-parser hermes --reasoning-parser deepseek_r1`: everything the model writes
  is reasoning (no </think> ever comes), so content is null and every generated token is a
  reasoning token; the split must match the plain server's text for the same greedy
  request, streamed (official `openai` client, strict validation) and not.
- `--enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3`: the model
  never opens <think>, so the answer is plain content identical to the plain server's.
- the plain server (no flags; the template shows no tool format): tool_choice "auto" with
  tools is a 400 naming --tool-call-parser; "none" renders the tools and answers text.
- validation: a named function not in tools, "required" without tools, malformed tools.
- round trip: assistant tool_calls (string arguments) and tool results are accepted.
- `--tool-call-parser llama3_json`: asked to "output only this JSON", the model writes a
  Llama-style call `{"name": …, "parameters": …}` with greedy decoding; the plain server's
  text for the same request is the reference, and the parsing server must turn exactly
  that text into the call (non-streamed, streamed raw, and through the openai client's
  stream helper). With hermes, a reply that opens <tool_call> but never closes it comes
  back whole as content.
- calls of any shape need the model's output forced: `guided_regex` writes the hermes
  markup for tool_choice "auto", and tool_choice "required" / named use constrained
  decoding.
- a constrained answer (response_format) on a server with a reasoning parser: SmolLM2's
  vocabulary has no "</think>" token, so nothing says where thinking would end; the split
  is off and the JSON is content."""
import json

import openai
import pytest

from server_util import check_error, parse_sse, run_server

MAX_MODEL_LEN = 1024
CHAT = [{"role": "user", "content": "What is the weather like in Paris today?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False},
    "strict": True}}
NOW = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False},
    "strict": True}}
TOOLS = [WEATHER, NOW]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def regex_of(text):
    """A regex matching exactly text (for guided_regex)."""
    out = []
    for ch in text:
        out.append("\\" + ch if ch in ".^$*+?()[]{}|\\" else ("\\n" if ch == "\n" else ch))
    return "".join(out)


@pytest.fixture(scope="module")
def plain(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN) as srv:
        yield srv


@pytest.fixture(scope="module")
def r1(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN,
                    "--tool-call-parser", "hermes", "--reasoning-parser", "deepseek_r1") as srv:
        yield srv


@pytest.fixture(scope="module")
def llama3(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN,
                    "--tool-call-parser", "llama3_json") as srv:
        yield srv


@pytest.fixture(scope="module")
def qwen3(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN,
                    "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                    "--reasoning-parser", "qwen3") as srv:
        yield srv


def client_of(srv):
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=120, _strict_response_validation=True)


def post_chat(srv, **kw):
    kw.setdefault("messages", CHAT)
    kw.setdefault("max_tokens", 16)
    kw.setdefault("temperature", 0)
    return srv.post_json("/v1/chat/completions", kw)


def chat_ok(srv, **kw):
    r = post_chat(srv, **kw)
    assert r.status == 200, (r.status, r.body[:500], srv.stderr_tail())
    return r.json()


def stream_events(srv, **kw):
    r = post_chat(srv, stream=True, **kw)
    assert r.status == 200, (r.status, r.body[:500])
    return parse_sse(r.body).json_events()


def plain_text(plain, **kw):
    return chat_ok(plain, **kw)["choices"][0]["message"]["content"]


def guided(srv, **kw):
    """POSTs a chat request (with guided_regex or a forcing tool_choice); must be 200."""
    r = post_chat(srv, **kw)
    assert r.status == 200, (r.status, r.body[:500], srv.stderr_tail())
    return r


forced = guided


# ------------------------------------------------------------------------ validation


def test_auto_without_parser_is_400(plain):
    for extra in ({}, {"tool_choice": "auto"}):
        r = post_chat(plain, tools=TOOLS, **extra)
        e = check_error(r, 400, type_="invalid_request_error", param="tool_choice")
        assert "--tool-call-parser" in e["message"], e


def test_unknown_named_function_is_400(r1, plain):
    for srv in (r1, plain):
        r = post_chat(srv, tools=TOOLS,
                      tool_choice={"type": "function", "function": {"name": "get_stock_price"}})
        e = check_error(r, 400, type_="invalid_request_error", param="tool_choice")
        assert "get_stock_price" in e["message"], e
    with pytest.raises(openai.BadRequestError) as ei:
        client_of(r1).chat.completions.create(
            model=r1.get_json("/v1/models")["data"][0]["id"], messages=CHAT,
            max_tokens=4, tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_stock_price"}})
    assert ei.value.status_code == 400


@pytest.mark.parametrize("body,param", [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]}, "tools[0].function"),
    ({"tools": TOOLS, "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"messages": [{"role": "user", "content": "x"},
                   {"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]}]},
     "messages[1].tool_calls"),
])
def test_bad_tool_parameters_are_400(r1, body, param):
    check_error(post_chat(r1, **body), 400, type_="invalid_request_error", param=param)


def test_tool_choice_none_renders_and_answers_text(plain, r1):
    base = plain_text(plain)
    body = chat_ok(plain, tools=TOOLS, tool_choice="none")
    msg = body["choices"][0]["message"]
    assert msg["content"] == base and "tool_calls" not in msg
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    # a parser configured: "none" still means no parsing (reasoning is split regardless)
    msg = chat_ok(r1, tools=TOOLS, tool_choice="none")["choices"][0]["message"]
    assert "tool_calls" not in msg and msg["reasoning_content"] == base


def test_round_trip_messages_accepted(r1, plain):
    # SmolLM2's template concatenates content, so it gets "" (templates that render tool
    # calls, e.g. Qwen's, take null)
    history = CHAT + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_abc123", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "call_abc123", "content": '{"sky": "clear", "celsius": 21}'},
    ]
    for srv, choice in ((r1, "auto"), (plain, "none")):
        body = chat_ok(srv, messages=history, tools=TOOLS, tool_choice=choice, max_tokens=8)
        assert body["usage"]["prompt_tokens"] > 0
        assert body["choices"][0]["finish_reason"] in ("stop", "length")


def test_null_content_renders_as_empty(plain):
    # content null, what the OpenAI SDK sends beside tool_calls, reaches SmolLM2's template
    # (which concatenates content and never reads tool_calls) as "", as vLLM renders it;
    # so does a tool_calls of [] with a null content. Same prompt tokens as the "" forms.
    def tokens(messages):
        r = plain.post_json("/tokenize", {"messages": messages})
        assert r.status == 200, (r.status, r.body[:500])
        return r.json()["tokens"]

    call = {"id": "call_abc123", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    result = {"role": "tool", "tool_call_id": "call_abc123", "content": "sunny"}
    with_null = CHAT + [{"role": "assistant", "content": None, "tool_calls": [call]}, result]
    assert tokens(with_null) == tokens(CHAT + [{"role": "assistant", "content": "", "tool_calls": [call]}, result])
    again = [{"role": "user", "content": "And tomorrow?"}]
    assert (tokens(CHAT + [{"role": "assistant", "content": None, "tool_calls": []}] + again)
            == tokens(CHAT + [{"role": "assistant", "content": ""}] + again))
    # the real client, tool-call history with null content
    out = client_of(plain).chat.completions.create(model=plain.get_json("/v1/models")["data"][0]["id"],
                                                   messages=with_null, max_tokens=4, temperature=0)
    assert out.choices[0].finish_reason in ("stop", "length")


# ------------------------------------------------------------------------ reasoning


def test_r1_everything_is_reasoning(r1, plain):
    base = plain_text(plain, max_tokens=24)
    body = chat_ok(r1, max_tokens=24)
    msg = body["choices"][0]["message"]
    assert msg["content"] is None, msg
    assert msg["reasoning_content"] == base
    u = body["usage"]
    assert u["completion_tokens_details"]["reasoning_tokens"] == u["completion_tokens"] > 0


def test_r1_streamed_with_strict_client(r1, plain):
    base = plain_text(plain, max_tokens=24)
    c = client_of(r1)
    model = r1.get_json("/v1/models")["data"][0]["id"]
    stream = c.chat.completions.create(model=model, messages=CHAT, max_tokens=24, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    reasoning, content, finish, usage = "", "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            d = ch.delta
            content += d.content or ""
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            finish = ch.finish_reason or finish
    assert content == "" and reasoning == base
    assert finish in ("stop", "length")
    assert usage.completion_tokens_details.reasoning_tokens == usage.completion_tokens


def test_r1_stream_shape(r1):
    events = stream_events(r1, max_tokens=12)
    first = events[0]["choices"][0]["delta"]
    assert first == {"role": "assistant", "content": ""}, events[0]
    for ev in events[1:]:
        d = ev["choices"][0]["delta"]
        assert "content" not in d, f"content delta from a reasoning-only answer: {ev}"
        assert set(d) <= {"reasoning_content"}, ev


def test_enable_thinking_false_turns_the_split_off(r1, plain):
    base = plain_text(plain, max_tokens=12)
    body = chat_ok(r1, max_tokens=12, chat_template_kwargs={"enable_thinking": False})
    msg = body["choices"][0]["message"]
    assert msg["content"] == base and "reasoning_content" not in msg
    assert "completion_tokens_details" not in body["usage"]


def test_r1_structured_output_is_content(r1):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "age"]}
    body = chat_ok(r1, max_tokens=64, response_format={
        "type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    ch = body["choices"][0]
    assert ch["finish_reason"] == "stop", body
    assert "reasoning_content" not in ch["message"], body
    v = json.loads(ch["message"]["content"])
    assert set(v) == {"name", "age"} and 0 <= v["age"] <= 99


def test_r1_several_choices(r1, plain):
    """n = 2: each choice has its own parser (greedy: both give the same split)."""
    base = plain_text(plain, max_tokens=12)
    body = chat_ok(r1, max_tokens=12, n=2)
    assert [c["message"]["reasoning_content"] for c in body["choices"]] == [base, base]
    u = body["usage"]
    assert u["completion_tokens_details"]["reasoning_tokens"] == u["completion_tokens"]
    got = {0: "", 1: ""}
    for ev in stream_events(r1, max_tokens=12, n=2):
        for ch in ev["choices"]:
            got[ch["index"]] += ch["delta"].get("reasoning_content") or ""
    assert got == {0: base, 1: base}


def test_qwen3_without_think_is_content(qwen3, plain):
    base = plain_text(plain, max_tokens=24)
    assert "<think>" not in base and "<tool_call>" not in base
    body = chat_ok(qwen3, max_tokens=24, tools=TOOLS)  # tool_choice auto: no calls made
    msg = body["choices"][0]["message"]
    assert msg["content"] == base and "reasoning_content" not in msg and "tool_calls" not in msg
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    events = stream_events(qwen3, max_tokens=24, tools=TOOLS)
    text = "".join(ev["choices"][0]["delta"].get("content") or "" for ev in events if ev["choices"])
    assert text == base


# ------------------------------------------------------------------------ tool calls (forced)


def test_auto_call_forced_by_regex(qwen3):
    r = guided(qwen3, tools=TOOLS, guided_regex=regex_of(CALL_TEXT), max_tokens=64)
    ch = r.json()["choices"][0]
    msg = ch["message"]
    assert ch["finish_reason"] == "tool_calls", ch
    assert msg["content"] is None, msg
    (call,) = msg["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_auto_calls_text_around_and_parallel_off(qwen3):
    text = "Let me check. " + CALL_TEXT + "\n" + CALL_TEXT.replace("get_weather", "get_time")
    r = guided(qwen3, tools=TOOLS, guided_regex=regex_of(text), max_tokens=256)
    msg = r.json()["choices"][0]["message"]
    assert msg["content"] == "Let me check. \n", msg
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["get_weather", "get_time"]
    assert len({c["id"] for c in msg["tool_calls"]}) == 2
    r = guided(qwen3, tools=TOOLS, guided_regex=regex_of(text), max_tokens=96,
               parallel_tool_calls=False)
    assert [c["function"]["name"] for c in r.json()["choices"][0]["message"]["tool_calls"]] == ["get_weather"]


def test_auto_call_streamed(qwen3):
    r = guided(qwen3, tools=TOOLS, guided_regex=regex_of("Sure. " + CALL_TEXT), max_tokens=64,
               stream=True)
    events = parse_sse(r.body).json_events()
    content, calls, finish = "", {}, None
    for ev in events:
        for ch in ev["choices"]:
            d = ch["delta"]
            content += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                i = tc["index"]
                if i not in calls:  # the first delta of a call carries id, type and name
                    assert tc["id"].startswith("call_") and tc["type"] == "function", tc
                    assert tc["function"]["name"] and tc["function"]["arguments"] == "", tc
                    calls[i] = {"name": tc["function"]["name"], "args": ""}
                else:
                    assert "id" not in tc and "name" not in tc["function"], tc
                    calls[i]["args"] += tc["function"]["arguments"]
            finish = ch.get("finish_reason") or finish
    assert content == "Sure. ", content  # no markup leaked
    assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["args"]) == {"city": "Paris"}
    assert finish == "tool_calls"


def test_stream_helper_accumulates_calls(qwen3):
    c = client_of(qwen3)
    model = qwen3.get_json("/v1/models")["data"][0]["id"]
    with c.chat.completions.stream(model=model, messages=CHAT, tools=TOOLS, max_tokens=64,
                                   temperature=0,
                                   extra_body={"guided_regex": regex_of(CALL_TEXT)}) as s:
        final = s.get_final_completion()
    msg = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    (call,) = msg.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.function.parsed_arguments == {"city": "Paris"}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_tool_choice(qwen3, choice):
    r = forced(qwen3, tools=TOOLS, tool_choice=choice, max_tokens=64)
    ch = r.json()["choices"][0]
    calls = ch["message"]["tool_calls"]
    assert len(calls) >= 1
    names = {"get_weather", "get_time"} if choice == "required" else {"get_time"}
    for call in calls:
        assert call["function"]["name"] in names
        assert isinstance(json.loads(call["function"]["arguments"]), dict)


# ------------------------------------------------------------------------ tool calls (prompted)

def echo_call(city):
    return [{"role": "user", "content": "Output only this JSON and nothing else: "
             + json.dumps({"name": "get_weather", "parameters": {"city": city}}, ensure_ascii=False)}]


def reference_call(plain, messages):
    """The plain server's greedy answer, when it is exactly one Llama-style call that
    stopped by itself: (name, arguments dict); else skips (the model wrote something else
    on this backend)."""
    body = chat_ok(plain, messages=messages, max_tokens=48)
    ch = body["choices"][0]
    text = ch["message"]["content"]
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if ch["finish_reason"] != "stop" or not isinstance(obj, dict) or set(obj) != {"name", "parameters"}:
        pytest.skip(f"the model did not answer with a call: {text!r}")
    return obj["name"], obj["parameters"]


@pytest.mark.parametrize("city", ["Paris", "東京"])
def test_llama3_call_parsed(llama3, plain, city):
    name, args = reference_call(plain, echo_call(city))
    body = chat_ok(llama3, messages=echo_call(city), max_tokens=48, tools=TOOLS)
    ch = body["choices"][0]
    assert ch["finish_reason"] == "tool_calls", ch
    msg = ch["message"]
    assert msg["content"] is None, msg
    (call,) = msg["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_") and len(call["id"]) == 29
    assert call["function"]["name"] == name
    assert json.loads(call["function"]["arguments"]) == args
    # parallel_tool_calls false: still the one call; tool_choice none: the text itself
    body = chat_ok(llama3, messages=echo_call(city), max_tokens=48, tools=TOOLS, parallel_tool_calls=False)
    assert len(body["choices"][0]["message"]["tool_calls"]) == 1
    msg = chat_ok(llama3, messages=echo_call(city), max_tokens=48, tools=TOOLS, tool_choice="none")["choices"][0]["message"]
    assert "tool_calls" not in msg and json.loads(msg["content"]) == {"name": name, "parameters": args}


def test_llama3_call_streamed(llama3, plain):
    name, args = reference_call(plain, echo_call("Paris"))
    events = stream_events(llama3, messages=echo_call("Paris"), max_tokens=48, tools=TOOLS,
                           stream_options={"include_usage": True}, logprobs=True)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    calls, finish, n_lp = {}, None, 0
    for ev in events[1:]:
        if not ev["choices"]:
            usage = ev["usage"]
            continue
        ch = ev["choices"][0]
        d = ch["delta"]
        assert "content" not in d, f"markup leaked into content: {ev}"
        if ch["logprobs"]:
            n_lp += len(ch["logprobs"]["content"])
        for tc in d.get("tool_calls") or []:
            if tc["index"] not in calls:
                assert tc["id"].startswith("call_") and tc["type"] == "function", tc
                assert tc["function"]["arguments"] == "", tc
                calls[tc["index"]] = [tc["function"]["name"], ""]
            else:
                assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}, tc
                calls[tc["index"]][1] += tc["function"]["arguments"]
        finish = ch.get("finish_reason") or finish
    assert finish == "tool_calls"
    assert list(calls) == [0] and calls[0][0] == name and json.loads(calls[0][1]) == args
    # every generated token's logprob went out, held-back text or not (the end token has one too)
    assert n_lp == usage["completion_tokens"], (n_lp, usage)


def test_llama3_stream_helper(llama3, plain):
    name, args = reference_call(plain, echo_call("Paris"))
    c = client_of(llama3)
    model = llama3.get_json("/v1/models")["data"][0]["id"]
    with c.chat.completions.stream(model=model, messages=echo_call("Paris"), tools=TOOLS,
                                   max_tokens=48, temperature=0) as s:
        final = s.get_final_completion()
    ch = final.choices[0]
    assert ch.finish_reason == "tool_calls" and not ch.message.content  # "" from the role chunk
    (call,) = ch.message.tool_calls
    assert call.function.name == name and call.function.parsed_arguments == args


def test_hermes_unterminated_call_is_content(qwen3, plain):
    msgs = [{"role": "user", "content": 'Output only this and nothing else: <tool_call>{"name": '
             '"get_weather", "arguments": {"city": "Paris"}}</tool_call>'}]
    ref = chat_ok(plain, messages=msgs, max_tokens=60)["choices"][0]
    text = ref["message"]["content"]
    if "<tool_call>" not in text or "</tool_call>" in text:
        pytest.skip(f"the model's answer has no unterminated call on this backend: {text!r}")
    ch = chat_ok(qwen3, messages=msgs, max_tokens=60, tools=TOOLS)["choices"][0]
    assert ch["message"]["content"] == text and "tool_calls" not in ch["message"]
    assert ch["finish_reason"] == ref["finish_reason"]
    streamed = "".join(ev["choices"][0]["delta"].get("content") or ""
                       for ev in stream_events(qwen3, messages=msgs, max_tokens=60, tools=TOOLS))
    assert streamed == text

"""Structured output end to end against `tessera serve` on the default model: every answer
that finishes with "stop" must parse and validate against what the request asked for,
checked here with an independent validator (the `jsonschema` package, formats included).

Covered: 32 JSON schemas (flat, nested, arrays with min/max items, enums, const, anyOf,
$ref/$defs, integer and number bounds, string lengths and formats, optional properties,
...), each greedy and seeded-sampled (temperature 0.8) through response_format
json_schema; response_format json_object; vLLM's guided_json / guided_regex /
guided_choice / guided_grammar and structured_outputs on both endpoints; GBNF grammars
(vLLM's guided_grammar, llama.cpp's grammar), checked against an equivalent Python regular
expression; streaming; n = 2; the official `openai` client; and the 400 errors (bad
schema, unsupported keyword, malformed or left-recursive grammar, two constraints) in
OpenAI's shape with the parameter named.

Bound: with max_tokens MAX_TOKENS, at least STOP_FRACTION of the schema answers finish
with "stop" (a small model may still ramble inside a long string until the limit). The
requests are sent concurrently so the server batches them; the module runs in about a
minute."""
import concurrent.futures as cf
import json
import re

import jsonschema
import openai
import pytest

from server_util import check_chat_stream, check_error, parse_sse, run_server, stream_request

MAX_MODEL_LEN = 2048
MAX_TOKENS = 384
STOP_FRACTION = 0.9
CONCURRENCY = 24

SCHEMAS = {
    "flat": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
             "required": ["name", "age"]},
    "flat_strict": {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
                    "required": ["city", "population"], "additionalProperties": False},
    "booleans": {"type": "object", "properties": {"is_open": {"type": "boolean"}, "has_wifi": {"type": "boolean"}},
                 "required": ["is_open", "has_wifi"], "additionalProperties": False},
    "nullable": {"type": "object", "properties": {"nickname": {"type": ["string", "null"]}},
                 "required": ["nickname"], "additionalProperties": False},
    "number": {"type": "object", "properties": {"price": {"type": "number"}, "currency": {"type": "string"}},
               "required": ["price", "currency"], "additionalProperties": False},
    "int_bounds": {"type": "object", "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 10}},
                   "required": ["score"], "additionalProperties": False},
    "int_exclusive": {"type": "object",
                      "properties": {"level": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100}},
                      "required": ["level"], "additionalProperties": False},
    "negative_ints": {"type": "object", "properties": {"temp": {"type": "integer", "minimum": -50, "maximum": -1}},
                      "required": ["temp"], "additionalProperties": False},
    "string_len": {"type": "object", "properties": {"code": {"type": "string", "minLength": 3, "maxLength": 6}},
                   "required": ["code"], "additionalProperties": False},
    "enum": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
             "required": ["color"], "additionalProperties": False},
    "enum_mixed": {"type": "object", "properties": {"answer": {"enum": ["yes", "no", 1, None, True]}},
                   "required": ["answer"], "additionalProperties": False},
    "const": {"type": "object", "properties": {"version": {"const": "v2"}, "kind": {"type": "string"}},
              "required": ["version", "kind"], "additionalProperties": False},
    "array_of_strings": {"type": "object",
                         "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 20}}},
                         "required": ["tags"], "additionalProperties": False},
    "array_bounds": {"type": "object", "properties": {"fruits": {"type": "array", "items": {"type": "string"},
                                                                 "minItems": 2, "maxItems": 4}},
                     "required": ["fruits"], "additionalProperties": False},
    "array_exact": {"type": "object", "properties": {"rgb": {"type": "array", "items": {"type": "integer",
                                                     "minimum": 0, "maximum": 255}, "minItems": 3, "maxItems": 3}},
                    "required": ["rgb"], "additionalProperties": False},
    "top_level_array": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 5},
    "array_of_objects": {"type": "object", "properties": {"people": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"], "additionalProperties": False}}},
        "required": ["people"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer"}, "email": {"type": "string"}},
                 "required": ["id", "email"], "additionalProperties": False},
        "active": {"type": "boolean"}}, "required": ["user", "active"], "additionalProperties": False},
    "deep_nested": {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {
        "type": "object", "properties": {"c": {"type": "integer"}}, "required": ["c"], "additionalProperties": False}},
        "required": ["b"], "additionalProperties": False}}, "required": ["a"], "additionalProperties": False},
    "optional_props": {"type": "object", "properties": {"title": {"type": "string"}, "year": {"type": "integer"},
                                                        "rating": {"type": "number"}},
                       "required": ["title"], "additionalProperties": False},
    "all_optional": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                     "additionalProperties": False},
    "any_of": {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer"}, {"type": "string",
                                                                                           "maxLength": 10}]}},
               "required": ["value"], "additionalProperties": False},
    "any_of_objects": {"anyOf": [
        {"type": "object", "properties": {"cat": {"type": "string"}}, "required": ["cat"], "additionalProperties": False},
        {"type": "object", "properties": {"dog": {"type": "string"}}, "required": ["dog"], "additionalProperties": False}]},
    "refs": {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                                 "required": ["x", "y"], "additionalProperties": False}},
             "type": "object", "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
             "required": ["start", "end"], "additionalProperties": False},
    "refs_definitions": {"definitions": {"color": {"enum": ["red", "blue"]}}, "type": "object",
                         "properties": {"primary": {"$ref": "#/definitions/color"}},
                         "required": ["primary"], "additionalProperties": False},
    "format_date": {"type": "object", "properties": {"birthday": {"type": "string", "format": "date"}},
                    "required": ["birthday"], "additionalProperties": False},
    "format_datetime": {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}},
                        "required": ["when"], "additionalProperties": False},
    "format_uuid": {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}},
                    "required": ["id"], "additionalProperties": False},
    "format_email": {"type": "object", "properties": {"contact": {"type": "string", "format": "email"}},
                     "required": ["contact"], "additionalProperties": False},
    "pattern": {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["zip"], "additionalProperties": False},
    "mixed_record": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40}, "pages": {"type": "integer", "minimum": 1},
        "genres": {"type": "array", "items": {"enum": ["fiction", "history", "science"]}, "maxItems": 3},
        "author": {"type": "object", "properties": {"name": {"type": "string"}, "born": {"type": ["integer", "null"]}},
                   "required": ["name"], "additionalProperties": False}},
        "required": ["title", "pages", "genres", "author"], "additionalProperties": False},
    "number_bounds": {"type": "object", "properties": {"ratio": {"type": "number", "minimum": 0, "maximum": 1}},
                      "required": ["ratio"], "additionalProperties": False},
}


def validate(schema, value):
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER).validate(
        value)


@pytest.fixture(scope="module")
def server(tessera_bin, default_model):
    with run_server(tessera_bin, default_model, "--max-model-len", MAX_MODEL_LEN) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def post(server, path, body):
    r = server.post_json(path, body, timeout=300)
    return r


def ask(server, body):
    r = post(server, "/v1/chat/completions", body)
    assert r.status == 200, (r.status, r.body[:500])
    return r.json()


def schema_request(name, schema, sampled):
    body = {
        "messages": [{"role": "system", "content": "You answer with JSON only."},
                     {"role": "user", "content": f"Give an example JSON value for this JSON schema:\n"
                                                 f"{json.dumps(schema)}"}],
        "max_tokens": MAX_TOKENS,
        "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}},
    }
    if sampled:
        body.update(temperature=0.8, seed=1234)
    else:
        body.update(temperature=0)
    return body


@pytest.fixture(scope="module")
def schema_answers(server):
    """Every schema, greedy and sampled, sent at once: {(name, sampled): response}."""
    jobs = {(n, s): schema_request(n, SCHEMAS[n], s) for n in SCHEMAS for s in (False, True)}
    with cf.ThreadPoolExecutor(CONCURRENCY) as ex:
        futs = {k: ex.submit(post, server, "/v1/chat/completions", b) for k, b in jobs.items()}
        return {k: f.result() for k, f in futs.items()}


def test_schema_count():
    assert len(SCHEMAS) >= 30


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema(schema_answers, name):
    for sampled in (False, True):
        r = schema_answers[(name, sampled)]
        assert r.status == 200, (name, r.status, r.body[:500])
        ch = r.json()["choices"][0]
        text = ch["message"]["content"]
        if ch["finish_reason"] == "stop":
            validate(SCHEMAS[name], json.loads(text))
        else:
            assert ch["finish_reason"] == "length", ch
            assert r.json()["usage"]["completion_tokens"] == MAX_TOKENS


def test_schema_stop_rate(schema_answers):
    reasons = [r.json()["choices"][0]["finish_reason"] for r in schema_answers.values()]
    stopped = sum(x == "stop" for x in reasons)
    assert stopped >= STOP_FRACTION * len(reasons), f"{stopped} of {len(reasons)} stopped"


def check_json_object_answers(server, constraint):
    """An unbounded object. Whether greedy SmolLM2 closes it depends on the prompt and on
    the last bits of the kernels (it can nest objects or repeat an array item up to
    max_tokens), so: every answer must open an object, an answer that stops must parse as
    one, and at least one of three prompts that name their fields must stop."""
    prompts = ["Describe a cat as a JSON object with a name and a colour.",
               'Return a JSON object with the key "answer" set to 42.',
               "Give a JSON object with the fields city and country for Paris."]
    stopped = 0
    for prompt in prompts:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS,
                "temperature": 0, **constraint}
        ch = ask(server, body)["choices"][0]
        text = ch["message"]["content"]
        assert text.lstrip().startswith("{"), ch
        assert ch["finish_reason"] in ("stop", "length"), ch
        if ch["finish_reason"] == "stop":
            assert isinstance(json.loads(text), dict), ch
            stopped += 1
    assert stopped >= 1


def test_json_object(server):
    check_json_object_answers(server, {"response_format": {"type": "json_object"}})


def test_response_format_text_is_unconstrained(server):
    body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}
    plain = ask(server, body)["choices"][0]["message"]["content"]
    body["response_format"] = {"type": "text"}
    assert ask(server, body)["choices"][0]["message"]["content"] == plain


def test_guided_regex_and_choice(server):
    regex = r"[0-9]{3}-[0-9]{3}-[0-9]{4}"
    bodies = [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Give a phone number."}],
                                  "guided_regex": regex}, regex),
        ("/v1/completions", {"prompt": "My phone number is", "guided_regex": regex}, regex),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Is the sky blue?"}],
                                  "guided_choice": ["yes", "no", "maybe"]}, "yes|no|maybe"),
        ("/v1/completions", {"prompt": "The best pet is", "guided_choice": ["cat", "dog"]}, "cat|dog"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Pick a number."}],
                                  "structured_outputs": {"choice": ["one", "two", "three"]}}, "one|two|three"),
        ("/v1/completions", {"prompt": "A date:", "structured_outputs": {"regex": r"20[0-9]{2}-[01][0-9]"}},
         r"20[0-9]{2}-[01][0-9]"),
    ]
    for sampled in (False, True):
        for path, body, want in bodies:
            body = dict(body, max_tokens=64, temperature=0.8 if sampled else 0, seed=7)
            r = post(server, path, body)
            assert r.status == 200, (path, body, r.body[:400])
            ch = r.json()["choices"][0]
            text = ch["message"]["content"] if "message" in ch else ch["text"]
            assert ch["finish_reason"] == "stop", (body, ch)
            assert re.fullmatch(want, text), (body, text)


# GBNF grammars with an equivalent Python regular expression for the whole output
GRAMMARS = {
    "list": (r"""
# three lower-case words, comma separated
root ::= word ("," word){2}
word ::= [a-z]{1,8}
""", r"[a-z]{1,8}(,[a-z]{1,8}){2}"),
    "json_answer": (r'root ::= "{" ws "\"answer\":" ws ("true" | "false") ws "}"' "\n" r"ws ::= [ \t\n]{0,2}",
                    r'\{[ \t\n]{0,2}"answer":[ \t\n]{0,2}(true|false)[ \t\n]{0,2}\}'),
    "non_ascii": (r"root ::= [^\x00-\x7F]{2,4}", r"[^\x00-\x7f]{2,4}"),
    "date": (r"""root ::= year "-" month
year ::= "20" digit digit
month ::= "0" [1-9] | "1" [0-2]
digit ::= [0-9]""", r"20[0-9]{2}-(0[1-9]|1[0-2])"),
}


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_gbnf_grammar(server, name):
    """Every spelling (vLLM's guided_grammar and structured_outputs.grammar, llama.cpp's
    grammar) on both endpoints, greedy and sampled: a complete match; the spellings give
    the same greedy text."""
    grammar, want = GRAMMARS[name]
    for path in ("/v1/chat/completions", "/v1/completions"):
        for sampled in (False, True):
            texts = []
            for extra in ({"guided_grammar": grammar}, {"structured_outputs": {"grammar": grammar}},
                          {"grammar": grammar}):
                body = {"max_tokens": 64, "temperature": 0.8 if sampled else 0, "seed": 11, **extra}
                if path == "/v1/completions":
                    body["prompt"] = "Answer:"
                else:
                    body["messages"] = [{"role": "user", "content": "Answer briefly."}]
                r = post(server, path, body)
                assert r.status == 200, (name, extra, r.body[:400])
                ch = r.json()["choices"][0]
                text = ch["message"]["content"] if "message" in ch else ch["text"]
                assert ch["finish_reason"] == "stop", (name, extra, ch)
                assert re.fullmatch(want, text), (name, extra, text)
                texts.append(text)
            assert len(set(texts)) == 1, (name, path, sampled, texts)


def test_gbnf_streaming_and_responses(server):
    grammar, want = GRAMMARS["date"]
    body = {"messages": [{"role": "user", "content": "A month:"}], "max_tokens": 32, "temperature": 0,
            "guided_grammar": grammar}
    whole = ask(server, body)["choices"][0]["message"]["content"]
    assert re.fullmatch(want, whole), whole
    res = stream_request(server.host, server.port, "/v1/chat/completions", dict(body, stream=True), timeout=300)
    assert res.status == 200
    texts, reasons, _ = check_chat_stream(parse_sse(res.body).json_events())
    assert (texts[0], reasons[0]) == (whole, "stop")
    # /v1/responses passes the grammar to the same chat path
    r = post(server, "/v1/responses", {"input": "A month:", "max_output_tokens": 32, "temperature": 0,
                                       "guided_grammar": grammar})
    assert r.status == 200, r.body[:400]
    out = r.json()["output"]
    assert out[-1]["content"][0]["text"] == whole, out


def test_guided_json_forms(server):
    schema = SCHEMAS["flat_strict"]
    for extra in ({"guided_json": schema}, {"guided_json": json.dumps(schema)},
                  {"structured_outputs": {"json": schema}}):
        for path in ("/v1/chat/completions", "/v1/completions"):
            body = {"max_tokens": MAX_TOKENS, "temperature": 0, **extra}
            if path == "/v1/completions":
                body["prompt"] = "A city as JSON:"
            else:
                body["messages"] = [{"role": "user", "content": "Describe Paris as JSON."}]
            r = post(server, path, body)
            assert r.status == 200, (extra, r.body[:400])
            ch = r.json()["choices"][0]
            text = ch["message"]["content"] if "message" in ch else ch["text"]
            assert ch["finish_reason"] == "stop", ch
            validate(schema, json.loads(text))


def test_structured_outputs_json_object(server):
    check_json_object_answers(server, {"structured_outputs": {"json_object": True}})


def test_streaming(server):
    schema = SCHEMAS["mixed_record"]
    body = schema_request("book", schema, sampled=False)
    body["stream"] = True
    res = stream_request(server.host, server.port, "/v1/chat/completions", body, timeout=300)
    assert res.status == 200
    texts, reasons, _ = check_chat_stream(parse_sse(res.body).json_events())
    assert reasons[0] == "stop", reasons
    validate(schema, json.loads(texts[0]))
    # the same text as without streaming (greedy)
    body.pop("stream")
    assert ask(server, body)["choices"][0]["message"]["content"] == texts[0]


def test_n_choices(server):
    schema = SCHEMAS["array_of_objects"]
    body = schema_request("people", schema, sampled=True)
    body["n"] = 2
    resp = ask(server, body)
    assert len(resp["choices"]) == 2
    for ch in resp["choices"]:
        assert ch["finish_reason"] == "stop", ch
        validate(schema, json.loads(ch["message"]["content"]))


def test_openai_client(client, server):
    model = server.get_json("/v1/models")["data"][0]["id"]
    schema = SCHEMAS["nested"]
    r = client.chat.completions.create(
        model=model, messages=schema_request("user", schema, False)["messages"], max_tokens=MAX_TOKENS,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "user", "schema": schema}})
    assert r.choices[0].finish_reason == "stop"
    validate(schema, json.loads(r.choices[0].message.content))
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Sentiment of 'I love it'?"}], max_tokens=16,
        extra_body={"guided_choice": ["positive", "negative"]})
    assert r.choices[0].message.content in ("positive", "negative")
    r = client.completions.create(model=model, prompt="Order number:", max_tokens=16,
                                  extra_body={"guided_regex": "[A-Z]{2}[0-9]{4}"})
    assert re.fullmatch("[A-Z]{2}[0-9]{4}", r.choices[0].text), r.choices[0].text
    r = client.completions.create(model=model, prompt="Point:", max_tokens=MAX_TOKENS, temperature=0,
                                  extra_body={"guided_json": SCHEMAS["refs"]})
    validate(SCHEMAS["refs"], json.loads(r.choices[0].text))
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Yes or no?"}],
                                       max_tokens=8, extra_body={"guided_grammar": 'root ::= "yes" | "no"'})
    assert r.choices[0].message.content in ("yes", "no"), r.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}],
                                       extra_body={"guided_grammar": "root ::= missing"})
    assert ei.value.status_code == 400


MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("extra,param", [
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_json": 5}, "guided_json"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
                                                                                        "not": {"type": "null"}}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": "json"}, "response_format"),
    ({"guided_regex": "[a-"}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": ["a", 3]}, "guided_choice"),
    ({"guided_grammar": "root ::= undefined-rule"}, "guided_grammar"),
    ({"guided_grammar": "item ::= \"a\""}, "guided_grammar"),
    ({"guided_grammar": "root ::= \"a"}, "guided_grammar"),
    ({"guided_grammar": 5}, "guided_grammar"),
    ({"grammar": ""}, "grammar"),
    ({"structured_outputs": {"grammar": "root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\""}},
     "structured_outputs.grammar"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ({"guided_regex": "a", "guided_grammar": "root ::= \"a\""}, "guided_grammar"),
    ({"structured_outputs": {"whatever": 1}}, "structured_outputs.whatever"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice"),
    ({"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice"),
    ({"response_format": {"type": "json_object"}, "guided_json": {"type": "object"}}, "guided_json"),
])
def test_errors(server, extra, param):
    for path, base in (("/v1/chat/completions", {"messages": MSG}), ("/v1/completions", {"prompt": "hi"})):
        r = post(server, path, {**base, "max_tokens": 4, **extra})
        err = check_error(r, 400, type_="invalid_request_error", param=param)
        assert param.split(".")[0] in err["message"] or "response_format" in err["message"], err


def test_unsupported_keyword_message(server):
    body = {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "not": {"type": "null"}}}}}
    err = check_error(post(server, "/v1/chat/completions", body), 400, param="response_format")
    assert "not" in err["message"], err

"""The chat-template reference: Python jinja2 with Hugging Face's settings, and the fixed
cases rendered through every reference template.

`render` is what transformers' apply_chat_template(tokenize=False) does with a template
string: jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
with the loopcontrols extension, transformers' `tojson` (ensure_ascii=False, and the
indent/separators/sort_keys arguments), `raise_exception` and `strftime_now` (pinned here to
FIXED_DATE so renders are reproducible; `tessera template --fixed-date` does the same).

TEMPLATES names each reference template (build/testdata/templates/<name>.jinja, provisioned
by scripts/get-testdata.py), its model's bos/eos strings and the cases rendered through it.
scripts/get-testdata.py writes each render to templates/expected/<name>.<case>.txt (or
<name>.<case>.error.txt holding the raise_exception message); test_templates.py compares
`tessera template` with those files byte for byte.
"""
import json

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_DATE = "26 Jul 2024"


class TemplateError(Exception):
    """raise_exception(message) inside a template."""


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' override of jinja2's tojson (which would HTML-escape and sort keys)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message):
    raise TemplateError(message)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: FIXED_DATE
    return env


def render(template, ctx):
    """(True, text) as jinja2 renders it; (False, message) when the template calls
    raise_exception; (False, None) for any other jinja2 error (tessera must fail too)."""
    try:
        return True, environment().from_string(template).render(**ctx)
    except TemplateError as e:
        return False, str(e)
    except Exception:
        return False, None


TOOLS = [{"type": "function", "function": {
    "name": "lookup_time", "description": "Current local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                                                    "format": {"type": "string", "enum": ["12h", "24h"]}},
                   "required": ["city"]}}}]

# transformers passes tools=None when the request has none, and documents=None always
CASES = {
    "a": dict(messages=[{"role": "user", "content": "Good morning!"}], tools=None, add_generation_prompt=True),
    "b": dict(messages=[{"role": "system", "content": "Answer in one word."},
                        {"role": "user", "content": "Capital of Italy?"},
                        {"role": "assistant", "content": "Rome"},
                        {"role": "user", "content": "And of Spain?"}], tools=None, add_generation_prompt=True),
    "c": dict(messages=[{"role": "user", "content": "What time is it in Lima?"}], tools=TOOLS,
              add_generation_prompt=True),
    # Qwen3's switch: an empty <think></think> block opens the answer
    "nothink": dict(messages=[{"role": "user", "content": "Good morning!"}], tools=None, add_generation_prompt=True,
                    enable_thinking=False),
}

# name: bos and eos as the model's tokenizer_config gives them ("" where bos_token is
# null), and the cases rendered. Case c runs only through templates that read `tools`.
# gemma-2's template refuses a system message (raise_exception): its case b is an error.
TEMPLATES = {
    "qwen2.5-7b-instruct": dict(bos="", eos="<|im_end|>", cases=["a", "b", "c"]),
    "qwen3": dict(bos="", eos="<|im_end|>", cases=["a", "b", "c", "nothink"]),
    "llama-3.1-8b-instruct": dict(bos="<|begin_of_text|>", eos="<|eot_id|>", cases=["a", "b", "c"]),
    "deepseek-r1-distill-qwen-7b": dict(bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>", cases=["a", "b"]),
    "deepseek-r1-distill-qwen-7b-initial": dict(bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>",
                                                cases=["a", "b"]),
    "smollm2-135m-instruct": dict(bos="<|im_start|>", eos="<|im_end|>", cases=["a", "b"]),
    "mistral-7b-instruct-v0.3": dict(bos="<s>", eos="</s>", cases=["a", "b", "c"]),
    "gemma-2-2b-it": dict(bos="<bos>", eos="<eos>", cases=["a", "b"]),
    "phi-3.5-mini-instruct": dict(bos="<s>", eos="<|endoftext|>", cases=["a", "b"]),
}

CASE_IDS = [f"{name}.{case}" for name, t in TEMPLATES.items() for case in t["cases"]]


def context(name, case):
    """The render context of one case: the messages and flags, plus what transformers adds."""
    t = TEMPLATES[name]
    return dict(CASES[case], documents=None, bos_token=t["bos"], eos_token=t["eos"])

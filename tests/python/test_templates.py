"""Chat templates: `tessera template` against Python jinja2 3.1 with Hugging Face's settings.

1. Every template x case of hf_templates.TEMPLATES: the real chat templates that
   scripts/get-testdata.py provisions in build/testdata/templates, compared byte for byte
   with the jinja2 renders it wrote to expected/<name>.<case>.txt (or, for error cases,
   exit 1 and the raise_exception message of expected/<name>.<case>.error.txt on stderr).
2. The template embedded in the default GGUF model (--model), cases a and b, against
   jinja2 rendering the same string (read with the gguf package).
3. Stress contexts (tool calls, '{{' in content, Unicode, empty message lists, thinking
   content) through every reference template, rendered by both jinja2 and tessera.
4. Small feature snippets (whitespace control, filters, tests, loops, macros, Python
   value printing) rendered by both.
"""
import json
import subprocess

import gguf
import pytest

import hf_templates
from hf_templates import FIXED_DATE, render as reference

# the reference set is fixed: a missing file fails its tests, it cannot shrink the list
assert len(hf_templates.TEMPLATES) == 9 and len(hf_templates.CASE_IDS) == 23


def tessera(tessera_bin, tmp_path, ctx, template=None, model=None):
    ctx_path = tmp_path / "ctx.json"
    ctx_path.write_text(json.dumps(ctx, ensure_ascii=False), encoding="utf-8")
    args = [str(tessera_bin), "template", "--context", str(ctx_path), "--fixed-date", FIXED_DATE]
    if model is not None:
        args += ["--model", str(model)]
    else:
        tpath = tmp_path / "t.jinja"
        tpath.write_bytes(template.encode("utf-8"))
        args += ["--template", str(tpath)]
    return subprocess.run(args, capture_output=True, timeout=60)


def check_same(tessera_bin, tmp_path, template, ctx):
    ok, ref = reference(template, ctx)
    r = tessera(tessera_bin, tmp_path, ctx, template=template)
    if ok:
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        assert r.stdout.decode("utf-8") == ref
    else:
        assert r.returncode == 1, f"jinja2 failed but tessera rendered {r.stdout!r}"
        if ref is not None:
            assert r.stderr.decode("utf-8").rstrip("\n") == ref


# ---- 1. the reference templates against their expected renders -----------------------------

@pytest.mark.parametrize("case_id", hf_templates.CASE_IDS)
def test_expected(case_id, tessera_bin, testdata, tmp_path):
    name, case = case_id.rsplit(".", 1)
    ctx = hf_templates.context(name, case)
    exp = testdata / "templates" / "expected"
    template = (testdata / "templates" / f"{name}.jinja").read_text(encoding="utf-8")
    r = tessera(tessera_bin, tmp_path, ctx, template=template)
    if (exp / f"{case_id}.error.txt").exists():
        assert r.returncode == 1
        want = (exp / f"{case_id}.error.txt").read_text(encoding="utf-8").rstrip("\n")
        assert r.stderr.decode("utf-8").rstrip("\n") == want
    else:
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        assert r.stdout == (exp / f"{case_id}.txt").read_bytes()


def test_template_file_is_used_verbatim(tessera_bin, testdata, tmp_path):
    # the .jinja file itself (not a re-encoded copy) renders identically
    name, case = hf_templates.CASE_IDS[0].rsplit(".", 1)
    ctx_path = tmp_path / "c.json"
    ctx_path.write_text(json.dumps(hf_templates.context(name, case)))
    r = subprocess.run([str(tessera_bin), "template", "--template", str(testdata / "templates" / f"{name}.jinja"),
                        "--context", str(ctx_path)], capture_output=True)
    assert r.returncode == 0
    assert r.stdout == (testdata / "templates" / "expected" / f"{name}.{case}.txt").read_bytes()


# ---- 2. the GGUF-embedded template ---------------------------------------------------------

@pytest.mark.parametrize("case", ["a", "b"])
def test_gguf_embedded_template(case, tessera_bin, default_model, tmp_path):
    reader = gguf.GGUFReader(str(default_model))
    field = reader.fields["tokenizer.chat_template"]
    template = bytes(field.parts[field.data[0]]).decode("utf-8")
    ctx = dict(hf_templates.CASES[case], documents=None, bos_token="<|im_start|>", eos_token="<|im_end|>")
    ok, ref = reference(template, ctx)
    assert ok
    r = tessera(tessera_bin, tmp_path, ctx, model=default_model)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert r.stdout.decode("utf-8") == ref


# ---- 3. stress contexts through every reference template ----------------------------------------

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get weather \u00e9t\u00e9 \"quoted\"",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                         "required": ["city"]}}}]

STRESS = {
    "tool_calls_dict_args": dict(messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call12345", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}]},
        {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp\": 21.5}"},
        {"role": "assistant", "content": "It is 21.5 \u00b0C."},
        {"role": "user", "content": "Thanks"}], tools=TOOLS, add_generation_prompt=True),
    "tool_calls_string_args": dict(messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "abcdefghi", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
            {"id": "bcdefghij", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
        {"role": "tool", "tool_call_id": "abcdefghi", "content": "cold"},
        {"role": "tool", "tool_call_id": "bcdefghij", "content": "warm"}], tools=None, add_generation_prompt=True),
    "braces_in_content": dict(messages=[
        {"role": "user", "content": "Show {{ x }} and {% if %} and {# c #} literally"},
        {"role": "assistant", "content": "Sure: {{ x }}"},
        {"role": "user", "content": "  padded  \n"}], tools=None, add_generation_prompt=False),
    "unicode": dict(messages=[
        {"role": "system", "content": "\u4f60\u597d \U0001F600 caf\u00e9 \u00a0nbsp \u200b zw"},
        {"role": "user", "content": "\u00c9t\u00e9 \u2014 \u201cquotes\u201d \\ backslash \t tab"}],
        tools=None, add_generation_prompt=True),
    "empty_messages": dict(messages=[], tools=None, add_generation_prompt=True),
    "thinking": dict(messages=[
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"}], tools=None, add_generation_prompt=True, enable_thinking=True),
    "no_generation_prompt": dict(messages=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
        tools=None, add_generation_prompt=False),
}


@pytest.mark.parametrize("stress", sorted(STRESS))
@pytest.mark.parametrize("tname", sorted(hf_templates.TEMPLATES))
def test_stress_against_jinja2(tname, stress, tessera_bin, testdata, tmp_path):
    template = (testdata / "templates" / f"{tname}.jinja").read_text(encoding="utf-8")
    ctx = dict(STRESS[stress], documents=None, bos_token="<s>", eos_token="</s>")
    check_same(tessera_bin, tmp_path, template, ctx)


# ---- 4. feature snippets ----------------------------------------------------------------------

SNIPPETS = [
    # whitespace control: lstrip/trim, '-', '+', comments, raw
    "a  \n  {% if true %}\n  x\n  {% endif %}\n  b\n",
    "{{ 'a' }}  \n  {# c #}\n  x {%+ if true %}y{% endif %}",
    "  {%- if true -%}  \n  t  {%- endif %}\n\nend",
    "line\n    {% for i in [1,2] %}\n    {{ i }}\n    {% endfor %}\ndone",
    "x {{- ' y ' -}} z",
    "{% raw %}  {{ not parsed }} {% endraw %}\n",
    "a\r\nb\r\n{% if 1 %}\r\nc{% endif %}\n\n",
    "  {#- comment -#}  text",
    # expressions and Python printing
    "{{ 1.0 }} {{ 1e16 }} {{ 0.1+0.2 }} {{ 1e-5 }} {{ 7//-2 }} {{ -7 % 3 }} {{ 3/2 }} {{ (1,) }} {{ 2**10 }}",
    "{{ [1,'a',None,True,{'k':\"it's\"}] }} {{ {'a': [1.5, none]} }} {{ 'q\"uote' ~ 5 }}",
    "{{ 'a\\nb\\t\\x41\\u00e9' }}|{{ ['a\\nb', 'x\\'y'] }}|{{ '\\\\' }}",
    "{{ 3 > 2 > 1 }} {{ 1 in [1,2] }} {{ 'b' not in 'abc' }} {{ not none }} {{ 2 if false }}{{ 1 and 0 }}{{ 0 or 'x' }}",
    "{{ 'abc'[::-1] }} {{ 'h\u00e9llo'[1:3] }} {{ [1,2,3][-1] }} {{ [1,2,3][1:] }} {{ 'abc'[5] }}",
    "{{ -3|abs }} {{ 2.5|round }} {{ 3.14159|round(2) }} {{ 2.7|round(method='floor') }} {{ '42'|int + 1 }} {{ 'x'|float }}",
    # filters
    "{{ '  hi  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'hello world'|title }}|{{ 'hELLO'|capitalize }}|{{ 'a-b c'|upper }}",
    "{{ [3,1,2]|sort }} {{ ['b','A','a']|sort }} {{ [3,1,2]|sort(reverse=true)|join(',') }} {{ ['A','a','b']|unique|list }}",
    "{{ {'b':1,'a':2}|dictsort }} {{ {'b':1,'a':2}|items|list }} {{ [1,2,3]|first }}{{ [1,2,3]|last }}{{ 'abc'|list }}",
    "{{ [{'r':'u','n':1},{'r':'a','n':2}]|selectattr('r','equalto','u')|map(attribute='n')|list }}",
    "{{ [1,2,3,4]|select('odd')|list }} {{ [1,2,3,4]|reject('even')|list }} {{ [0,1,'',None,'x']|select|list }}",
    "{{ ['a','b']|map('upper')|join('-') }} {{ [1,2]|sum }} {{ [3,9,2]|max }} {{ [3,9,2]|min }} {{ 'a b  c'|wordcount }}",
    "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'x\\ny'|indent(first=true) }}|{{ 'hi'|center(7) }}|{{ 'a.b'|replace('.', '::') }}",
    "{{ {'x': [1, 2, {'y': 'z\u00e9'}], 'n': none, 'f': 1.5, 't': true}|tojson }}",
    "{{ {'x': [1, {'y': []}], 'e': {}}|tojson(indent=4) }}",
    "{{ {'b': 1, 'a': 2}|tojson(sort_keys=true, separators=(',', ':')) }}{{ 'caf\u00e9'|tojson(ensure_ascii=true) }}",
    "{{ x|default('dflt') }} {{ none|default('n') }} {{ ''|default('e', true) }} {{ x|d('d') }} {{ [1,2]|length }} {{ x|length }}",
    "{{ '<a href=\"x\">&</a>'|e }} {{ 'safe'|safe }} {{ 123|string ~ 'x' }} {{ [1,2]|reverse|list }} {{ 'abc'|reverse }}",
    # tests
    "{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 'a' is string }}{{ 1 is number }}{{ 1.0 is float }}"
    "{{ true is boolean }}{{ {} is mapping }}{{ [] is sequence }}{{ 'a' is iterable }}{{ 3 is odd }}{{ 4 is even }}"
    "{{ 9 is divisibleby 3 }}{{ 1 is equalto 1 }}{{ 1 is eq(2) }}{{ false is false }}{{ 0 is false }}{{ 1 is in [1] }}",
    # loops
    "{% for a in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
    "{% for a in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}",
    "{% for a in [] %}x{% else %}empty{% endfor %}{% for a in [1,2,3,4] if a is even %}{{ a }}{{ loop.length }}{% endfor %}",
    "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}{% for k in {'z': 1} %}{{ k }}{% endfor %}",
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for i in range(2, 10, 3) %}{{ i }}{% endfor %}{% for a in 'xy' %}{{ a }}{{ loop.cycle('o', 'e') }}{% endfor %}",
    "{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}",
    # set, namespace, macros, call blocks, filter blocks, with
    "{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}",
    "{% set a, b = 1, 'two' %}{{ a }}{{ b }}{% set t %}  block {{ a }} {% endset %}[{{ t }}]{% set u | upper %}up{% endset %}{{ u }}",
    "{% macro m(a, b=2, c='x') %}<{{ a }}|{{ b }}|{{ c }}>{% endmacro %}{{ m(1) }}{{ m(1, 3) }}{{ m(1, c='y') }}",
    "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inner{% endcall %}",
    "{% filter upper %}shout {{ 'this' }}{% endfilter %}{% with q = 5 %}{{ q * 2 }}{% endwith %}{{ q }}",
    "{% if a %}A{% elif b %}B{% elif c %}C{% else %}D{% endif %}",
    # string and dict methods
    "{{ ' a b '.strip() }}|{{ 'xxayy'.lstrip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}",
    "{{ 'abc'.startswith('a') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}{{ 'hello world'.title() }}",
    "{{ 'a-b-c'.replace('-', '+', 1) }} {{ 'h\u00e9llo'.find('l') }} {{ 'banana'.count('a') }} {{ '-'.join(['x', 'y']) }}",
    "{{ '{}+{}={x}'.format(1, 2, x=3) }} {{ {'a': 1}.get('a') }}{{ {'a': 1}.get('b') }}{{ {'a': 1}.get('b', 9) }}",
    "{{ {'a': 1, 'b': 2}.keys()|list }} {{ {'a': 1, 'b': 2}.values()|list }} {{ 'AbC'.isupper() }} {{ '12'.isdigit() }}",
    # undefined behaviour
    "{{ missing }}|{{ missing is defined }}|{% for x in missing %}no{% endfor %}|{{ missing|length }}|{{ none.attr }}|{{ 'a'.nope }}",
    "{{ missing.attr }}",
    "{{ missing + 1 }}",
    "{{ 'a' + 1 }}",
    "{{ 1 / 0 }}",
    "{{ raise_exception('custom message \u00e9') }}",
    "{{ strftime_now('%d %b %Y') }}",
    "{{ range(3)|list }} {{ dict(a=1, b=[2]) }} {{ namespace(a=1).a }}",
]


@pytest.mark.parametrize("idx", range(len(SNIPPETS)))
def test_snippet_against_jinja2(idx, tessera_bin, tmp_path):
    ctx = {"a": False, "b": 0, "c": "yes"}
    check_same(tessera_bin, tmp_path, SNIPPETS[idx], ctx)


# ---- CLI behaviour ----------------------------------------------------------------------------

def test_usage_errors(tessera_bin, tmp_path):
    r = subprocess.run([str(tessera_bin), "template"], capture_output=True)
    assert r.returncode == 2
    r = subprocess.run([str(tessera_bin), "template", "--template", "x", "--bogus"], capture_output=True)
    assert r.returncode == 2


@pytest.mark.parametrize("template,needle", [
    ("{{ x|nosuchfilter }}", "no filter named 'nosuchfilter'"),
    ("{% if x is nosuchtest %}{% endif %}", "no test named 'nosuchtest'"),
    ("{{ lipsum(3) }}", "unknown function 'lipsum'"),
    ("{% include 'x.html' %}", "unsupported tag 'include'"),
    ("line1\n{% if x %}", "line 2"),
    ("{{ 'unterminated }}", "unterminated string"),
    ("{% for x in y recursive %}{% endfor %}", "recursive"),
    ("{{ x.append(1) }}", "unsupported method"),
])
def test_parse_errors(template, needle, tessera_bin, tmp_path):
    r = tessera(tessera_bin, tmp_path, {}, template=template)
    assert r.returncode == 1
    assert needle in r.stderr.decode()
    assert r.stdout == b""

"""Writes tests/golden/templates/*.jsonl with jinja2 through transformers'
render_jinja_template (the code behind apply_chat_template).

Run: /work/venv-ref/bin/python tools/reference/tok_templates.py

chats.jsonl:    {"template": "qwen3"|"qwen3.5"|"qwen3-coder", "messages", "tools",
                 "kwargs", "add_generation_prompt", "expected"} or "error": true
features.jsonl: {"source": template text, "ctx": variables, "expected"} or
                 "error": true, covering the Jinja subset one feature at a time.
"""
import json, os
from transformers.utils.chat_template_utils import render_jinja_template, _compile_jinja_template

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TPL = os.path.join(ROOT, "tests", "data", "chat-templates")
OUT = os.path.join(ROOT, "tests", "golden", "templates")
SPECIAL = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city.",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string", "description": "City name"},
         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
         "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "run_shell", "description": "  Run a command.\n  Returns stdout. ",
     "parameters": {"type": "object", "properties": {
         "cmd": {"type": "string"}, "env": {"type": "object", "additionalProperties": {"type": "string"}},
         "args": {"type": "array", "items": {"type": "string"}}, "timeout": {"type": "number"}}}}},
]
U = lambda c: {"role": "user", "content": c}
A = lambda c, **kw: dict({"role": "assistant", "content": c}, **kw)
S = lambda c: {"role": "system", "content": c}
T = lambda c, **kw: dict({"role": "tool", "content": c}, **kw)
call = lambda name, args: {"type": "function", "function": {"name": name, "arguments": args}}

CHATS = [
    ([U("Hello")], None, {}),
    ([S("You are a helpful assistant."), U("Hi there!")], None, {}),
    ([U("What is 2+2?"), A("4"), U("And 3+3?")], None, {}),
    ([S("Be terse."), U("Q1"), A("A1"), U("Q2"), A("A2"), U("Q3")], None, {}),
    ([U("Weather in Paris?")], TOOLS, {}),
    ([S("You can call tools."), U("Weather in Paris?")], TOOLS, {}),
    ([U("Weather in Paris?"), A("", tool_calls=[call("get_weather", {"city": "Paris", "days": 3})]),
      T("{\"temp\": 21}"), ], TOOLS, {}),
    ([U("Weather in Paris?"), A("Let me check.", tool_calls=[call("get_weather", {"city": "Paris"})]),
      T("sunny"), A("It is sunny."), U("Thanks")], TOOLS, {}),
    ([U("Two cities"), A(None, tool_calls=[call("get_weather", {"city": "Paris"}), call("get_weather", {"city": "Oslo", "unit": "celsius"})]),
      T("20C"), T("5C")], TOOLS, {}),
    ([U("ls please"), A("", tool_calls=[call("run_shell", {"cmd": "ls -la", "args": ["-a", "b c"], "env": {"A": "1"}, "timeout": 2.5})]),
      T("total 0")], TOOLS, {}),
    ([U("string args"), A("", tool_calls=[call("run_shell", "{\"cmd\": \"echo hi\"}")]), T("hi")], TOOLS, {}),
    ([U("Think first"), A("The answer is 42.", reasoning_content="Let me think step by step.")], None, {}),
    ([U("Q"), A("<think>\nhidden reasoning\n</think>\n\nvisible answer"), U("Q2")], None, {}),
    ([U("Q"), A("<think>\nr1\n</think>\n\na1"), U("Q2"), A("a2", reasoning_content="r2")], None, {}),
    ([U("multi-turn thinking"), A("", reasoning_content="need tool", tool_calls=[call("get_weather", {"city": "Rome"})]),
      T("hot"), A("It is hot in Rome.", reasoning_content="tool said hot")], TOOLS, {}),
    ([U("no thinking please")], None, {"enable_thinking": False}),
    ([U("thinking on")], None, {"enable_thinking": True}),
    ([U("tools and no thinking")], TOOLS, {"enable_thinking": False}),
    ([U("Unicode: \u4f60\u597d \U0001f600 caf\u00e9 \u0645\u0631\u062d\u0628\u0627"), A("\u00bfQu\u00e9? \u2014 \u201cquotes\u201d")], None, {}),
    ([U("  spaces around  \n\n"), A("\n\nleading newlines")], None, {}),
    ([U("<tool_response>\nfake\n</tool_response>")], None, {}) ,
    ([S("sys"), U("Hi"), A("Hello"), U("<tool_response>\nx\n</tool_response>")], None, {}),
    ([U("Calc"), A("", tool_calls=[call("calc", {"x": 1.0, "y": -0.5, "z": 1e-7, "big": 12345678901234, "flag": True, "none": None, "nested": {"k": [1, "two", 3.25]}})]),
      T("ok")], None, {}),
    ([U("image please"), ], None, {"add_vision_id": True}),
    ([{"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "image", "image": "x.png"}, {"type": "text", "text": " and "}, {"type": "video", "video": "y.mp4"}]}],
     None, {"add_vision_id": True}),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}, {"type": "text", "text": "What?"}]}], None, {}),
    ([S("sys"), U("a"), S("late system")], None, {}),
    ([U("x"), {"role": "critic", "content": "bad role"}], None, {}),
    ([], None, {}),
    ([U("tool with tool_call_id"), A("", tool_calls=[{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "A"}}}]),
      T("r", tool_call_id="call_1", name="get_weather")], TOOLS, {}),
    ([U("reasoning alias"), A("ans", thinking="old-style thinking field")], None, {}),
    ([U("preserve"), A("a1", reasoning_content="r1"), U("q2"), A("a2", reasoning_content="r2")], None, {"preserve_thinking": True}),
]


def render(name, msgs, tools, kwargs, gen):
    src = open(os.path.join(TPL, name + ".jinja"), encoding="utf-8").read()
    try:
        r = render_jinja_template([msgs], tools=tools, chat_template=src, add_generation_prompt=gen, **SPECIAL, **kwargs)
        r = r[0] if isinstance(r, tuple) else r
        return {"expected": r[0] if isinstance(r, list) else r}
    except Exception as e:
        return {"error": True, "error_msg": str(e)}


FEATURES = [
    ("{{ 'a' ~ 1 ~ none ~ true }}", {}),
    ("{{ 1 + 2 * 3 - 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }}", {}),
    ("{{ 1.5 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-7 }} {{ 3.0 }} {{ 10 / 4 }} {{ 1/3 }}", {}),
    ("{{ [1, 'a', none, true, 2.5] }} {{ {'k': 'v', 'n': [1]} }} {{ (1, 2) }}", {}),
    ("{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }} {% endfor %}", {"xs": ["a", "b", "c"]}),
    ("{% for x in xs %}{{ loop.previtem }}>{{ x }}<{{ loop.nextitem }}|{% endfor %}", {"xs": [1, 2, 3]}),
    ("{% for x in xs if x % 2 %}{{ x }}{{ loop.index }},{% else %}empty{% endfor %}", {"xs": [1, 2, 3, 4, 5]}),
    ("{% for x in [] %}{{ x }}{% else %}empty{% endfor %}", {}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}", {"d": {"z": [1], "y": {"q": 1}}}),
    ("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", {"xs": [1, 2, 3, 4, 5]}),
    ("{% for x in xs %}{{ loop.cycle('odd', 'even') }} {% endfor %}", {"xs": [1, 2, 3]}),
    ("{% set ns = namespace(n=0, s='') %}{% for x in xs %}{% set ns.n = ns.n + x %}{% set ns.s = ns.s ~ x %}{% endfor %}{{ ns.n }} {{ ns.s }}", {"xs": [1, 2, 3]}),
    ("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% set a, b = 1, 2 %}{{ a }}{{ b }}", {}),
    ("{% set s %}block {{ 1 + 1 }}{% endset %}[{{ s }}]", {}),
    ("{% macro m(a, b='B', c=none) %}<{{ a }}|{{ b }}|{{ c }}>{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(1, c=3) }}", {}),
    ("{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }}", {}),
    ("{% if a %}A{% elif b %}B{% else %}C{% endif %}", {"a": 0, "b": "x"}),
    ("{{ 'yes' if x else 'no' }} {{ 'y' if none }}|", {"x": [1]}),
    ("{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ none is none }} {{ x is string }} {{ x is mapping }} {{ d is mapping }} {{ x is iterable }} {{ 1 is iterable }} {{ l is sequence }} {{ d is sequence }}", {"x": "s", "d": {}, "l": []}),
    ("{{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is boolean }} {{ true is integer }} {{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }}", {}),
    ("{{ x is not none }} {{ x is not string }} {{ y is not defined }} {{ false is false }} {{ 0 is false }} {{ 1 is sameas 1 }}", {"x": None}),
    ("{{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 3 not in [1] }}", {}),
    ("{{ s[0] }}{{ s[-1] }}{{ s[1:3] }}{{ s[::-1] }}{{ s[::2] }}{{ l[1:] }}{{ l[:-1] }}{{ l[::-1] }}", {"s": "h\u00e9llo\U0001f600", "l": [1, 2, 3]}),
    ("{{ d.a }} {{ d['a'] }} {{ d.missing }}|{{ l.0 }} {{ d.get('a') }} {{ d.get('zz', 'dflt') }} {{ d.get('zz') }}", {"d": {"a": 1}, "l": [9]}),
    ("{{ x|tojson }}", {"x": {"s": "q\"uote\\ \n\t\u00e9\U0001f600<>&'", "n": [1, 2.5, -0.0, 1e100], "b": True, "z": None, "e": {}, "l": []}}),
    ("{{ x|tojson(indent=2) }}", {"x": {"a": [1, {"b": 2}], "c": {}}}),
    ("{{ x|tojson(indent=2, sort_keys=true) }} {{ x|tojson(separators=(',', ':')) }}", {"x": {"b": 1, "a": [1, 2]}}),
    ("{{ s|length }} {{ l|length }} {{ d|length }} {{ u|length }} {{ l|count }}", {"s": "h\u00e9llo", "l": [1, 2], "d": {"a": 1}}),
    ("[{{ '  x  '|trim }}] [{{ 'xxhixx'|trim('x') }}] [{{ s.strip() }}] [{{ s.lstrip() }}] [{{ s.rstrip() }}] [{{ 'aab'.lstrip('a') }}] [{{ '\\n\\nx\\n'.strip('\\n') }}]", {"s": " \u00a0 hi \t\n"}),
    ("{{ u|default('d') }} {{ n|default('d') }} {{ ''|default('d', true) }} {{ x|d('no') }}", {"n": None, "x": 0}),
    ("{{ l|join(', ') }} {{ l|join }} {{ ['a', 'b']|join('-') }}", {"l": [1, "b", None]}),
    ("{{ 5|string }}{{ none|string }}{{ [1]|string }}{{ 'Hi'|lower }}{{ 'Hi'|upper }}{{ 'hello world'|title }}{{ 'hELLO'|capitalize }}", {}),
    ("{{ 'a-b-c'|replace('-', '+') }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'x'.upper() }} {{ 'X'.lower() }}", {}),
    ("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ 'x'.split('</think>')[0] }}", {}),
    ("{{ ' a  b c '.split(None, 1) }} {{ ' a b '.rsplit(None, 1) }} {{ ' x '.rsplit(None, 0) }} {{ ' x '.split(None, 0) }} "
     "{{ '   '.rsplit(None, 0) }} {{ ' a b c '.rsplit(None, 5) }} {{ ' x '.rsplit(None, 1) }} {{ 'a b'.rsplit(none, 0) }}", {}),
    ("{{ 'a,b'.rsplit([','], 0) }}", {}),
    ("{{ 'a  b'.rsplit(','|unique, 0) }}", {}),
    ("{{ s.startswith('<tool') }} {{ s.endswith('>') }} {{ s.startswith(('a', '<')) }} {{ s.find('resp') }} {{ s.count('o') }}", {"s": "<tool_response>"}),
    ("{{ l|first }} {{ l|last }} {{ l|reverse|list }} {{ l|sort }} {{ l|unique|list }} {{ l|min }} {{ l|max }} {{ l|sum }}", {"l": [3, 1, 2, 3]}),
    ("{{ l|map(attribute='n')|list }} {{ l|selectattr('n', 'gt', 1)|list }} {{ l|rejectattr('n', 'equalto', 1)|map(attribute='n')|join(',') }} {{ [1, 0, 2]|select|list }} {{ ['A', 'b']|map('lower')|list }}", {"l": [{"n": 1}, {"n": 2}]}),
    ("{{ '%d'|length }} {{ 3.7|int }} {{ '42'|int }} {{ 'x'|int }} {{ 2|float }} {{ -3|abs }} {{ 2.567|round(2) }} {{ 2.5|round }}", {}),
    ("{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}", {}),
    ("{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ dict(a=1, b=2) }} {{ '<&>'|e }} {{ 'x'|safe }}", {}),
    ("{% raw %}{{ not rendered }} {% if %}{% endraw %}", {}),
    ("  {% if true %}\n    yes\n  {% endif %}\n  {{ 'v' }}\n{# comment #}\n  {%- if true -%}  trimmed  {%- endif -%}  \nend\n", {}),
    ("{%+ if true %}keep{% endif %}\n{{- ' ws ' -}}\n\n{% if true %}\nx{% endif %}", {}),
    ("line1\r\nline2\r\n{% if true %}\r\nz{% endif %}", {}),
    ("{{ \"dq\\\"s\" }} {{ 'sq\\'s' }} {{ '\\u00e9\\x41' }} {{ 'a' 'b' }}", {}),
    ("{% if not a and b or c %}1{% endif %}{% if not (a or b) %}2{% endif %}{{ a or 'x' }}{{ b and 'y' }}", {"a": False, "b": True, "c": False}),
    ("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1, 2] == [1, 2] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ none == none }}", {}),
    ("{{ x.y }}", {}),
    ("{{ raise_exception('custom failure') }}", {}),
    ("{{ 1 + 'a' }}", {}),
    ("{% for x in 5 %}{% endfor %}", {}),
    ("{{ m.content.startswith('a') }}", {"m": {"role": "user"}}),
    ("{% set ns = namespace(found=false) %}{% for m in ms %}{% if m.role == 'tool' %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}", {"ms": [{"role": "user"}, {"role": "tool"}]}),
    ("{{ messages[0]['content'] }}{{ messages[-1].role }}{{ messages|length }}", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}),
    ("{{ x|items|list }} {{ x.keys()|list }} {{ x.values()|list }}", {"x": {"a": 1, "b": [2]}}),
    ("{{ '{:>5}' }} {{ 'caf\u00e9'|upper }} {{ 'STRASSE'|lower }}", {}),
    ("{{ 'abc'[5] }}|{{ [1][3] }}|{{ {}['x'] }}|", {}),
    ("{% if x is string and x|length > 2 %}long{% endif %}{{ -x|length if false else 'e' }}", {"x": "abcd"}),
    ("{% macro f() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ f(1, 2, k=3) }}", {}),
    ("{{ 'x' * 3 }} {{ [0] * 2 }} {{ [1] + [2] }} {{ 'a' + 'b' }}", {}),
    ("{{ a }}{% set a = 'late' %}{{ a }}", {"a": "early"}),
    ("{% generation %}gen{{ 1 }}{% endgeneration %}", {}),
]

BAD_SYNTAX = [
    "{% if x %}no end",
    "{{ x | }}",
    "{% foo %}",
    "{{ x ! y }}",
    "{% for x in %}{% endfor %}",
    "{{ 'unterminated }}",
    "{% include 'other.jinja' %}",
    "{{ x|nosuchfilter }}",
    "{{ x is nosuchtest }}",
]


def main():
    os.makedirs(OUT, exist_ok=True)
    n = 0
    with open(os.path.join(OUT, "chats.jsonl"), "w", encoding="utf-8") as f:
        for name in ("qwen3", "qwen3.5", "qwen3-coder"):
            for msgs, tools, kwargs in CHATS:
                for gen in (True, False):
                    if not gen and (len(msgs) < 2 or tools):
                        continue  # keep the file small: one no-prompt variant per multi-turn chat
                    rec = {"template": name, "messages": msgs, "tools": tools, "kwargs": kwargs, "add_generation_prompt": gen}
                    rec.update(render(name, msgs, tools, kwargs, gen))
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    n += 1
    print("chats:", n)
    env_tpl = lambda src: _compile_jinja_template(src)
    n = 0
    with open(os.path.join(OUT, "features.jsonl"), "w", encoding="utf-8") as f:
        for src, ctx in FEATURES:
            rec = {"source": src, "ctx": ctx}
            try:
                rec["expected"] = env_tpl(src).render(**ctx)
            except Exception as e:
                rec["error"] = True
                rec["error_msg"] = str(e)
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
        for src in BAD_SYNTAX:
            try:
                env_tpl(src).render()
                raise SystemExit("expected a failure: " + src)
            except SystemExit:
                raise
            except Exception as e:
                f.write(json.dumps({"source": src, "ctx": {}, "error": True, "syntax": True, "error_msg": str(e)}) + "\n")
                n += 1
    print("features:", n)


if __name__ == "__main__":
    main()

"""Structured outputs by constrained decoding (issue 17 part 3): response_format json_object /
json_schema (strict), vLLM's structured_outputs (json, regex, choice) and guided_*, tool_choice
required / named, with unchanged real clients (openai's chat.completions.parse with a pydantic
model, LangChain with_structured_output, smolagents ToolCallingAgent). On the demo model the
answers are weak: the tests assert the constraint (valid JSON that validates against the schema,
a call of the named tool), not the answer; and that constrained greedy output is identical at
MTP depths 0..4 (the mask is applied at every drafted position)."""
import json
import os
import re

import jsonschema
import pytest
import requests

from conftest import ROOT, Server

DEMO = os.path.join(ROOT, "models", "demo")


@pytest.fixture(scope="module")
def demo():
    s = Server("-m", DEMO, "--served-model-name", "demo", "--quiet", "--spec-depth", "4")
    yield s
    s.stop()
    s.check_clean_exit()


@pytest.fixture(scope="module")
def oai(demo):
    from openai import OpenAI
    return OpenAI(base_url=demo.url("/v1"), api_key="unused", max_retries=0, timeout=120)


MSG = [{"role": "user", "content": "Describe a person as JSON."}]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "role": {"enum": ["admin", "user", "guest"]},
        "active": {"type": "boolean"},
        "nick": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
    },
    "required": ["name", "age", "tags", "role", "active", "nick"],
    "additionalProperties": False,
}


def chat(server, **kw):
    body = {"model": "demo", "messages": MSG, "max_tokens": 200, "temperature": 0}
    body.update(kw)
    return requests.post(server.url("/v1/chat/completions"), json=body, timeout=120)


def schema_format(schema, strict=True):
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": strict}}


def test_json_schema_valid(demo):
    r = chat(demo, response_format=schema_format(PERSON))
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "stop", ch
    jsonschema.validate(json.loads(ch["message"]["content"]), PERSON)


def test_json_schema_unconstrained_differs(demo):
    """The mask matters: the same request without response_format is not this JSON."""
    free = chat(demo).json()["choices"][0]["message"]["content"]
    con = chat(demo, response_format=schema_format(PERSON)).json()["choices"][0]["message"]["content"]
    assert free != con


def test_json_object(demo):
    r = chat(demo, response_format={"type": "json_object"}, max_tokens=300)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "stop", ch
    assert isinstance(json.loads(ch["message"]["content"]), dict)


def test_constrained_greedy_identical_at_every_depth(demo):
    """Drafts are proposed under the mask and verified under each position's mask: the
    constrained output at depths 1..4 is byte-identical to depth 0, streamed and not."""
    outs = {}
    for d in range(5):
        r = chat(demo, response_format=schema_format(PERSON), num_speculative_tokens=d)
        assert r.status_code == 200, r.text
        outs[d] = r.json()["choices"][0]["message"]["content"]
    assert len(set(outs.values())) == 1, outs
    body = {"model": "demo", "messages": MSG, "max_tokens": 200, "temperature": 0, "stream": True,
            "response_format": schema_format(PERSON), "num_speculative_tokens": 3}
    text = ""
    with requests.post(demo.url("/v1/chat/completions"), json=body, stream=True, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    text += c["delta"].get("content") or ""
    assert text == outs[0]


def test_drafting_is_accepted_under_the_mask(demo):
    """Acceptance does not collapse: drafts proposed under the mask are accepted."""
    def counts():
        m = demo.metrics()
        return m.get("vllm:spec_decode_num_draft_tokens_total", 0), m.get("vllm:spec_decode_num_accepted_tokens_total", 0)
    d0, a0 = counts()
    r = chat(demo, response_format=schema_format(PERSON), num_speculative_tokens=4)
    assert r.status_code == 200
    d1, a1 = counts()
    assert d1 > d0 and (a1 - a0) / (d1 - d0) > 0.3, (d1 - d0, a1 - a0)


def test_sampled_constrained_valid(demo):
    for seed in range(4):
        r = chat(demo, response_format=schema_format(PERSON), temperature=1.0, seed=seed, num_speculative_tokens=3)
        ch = r.json()["choices"][0]
        if ch["finish_reason"] == "stop":
            jsonschema.validate(json.loads(ch["message"]["content"]), PERSON)
        else:
            assert ch["finish_reason"] == "length"


def test_structured_outputs_regex_choice(demo):
    r = chat(demo, structured_outputs={"regex": "[a-z]{3,6}-[0-9]{2}"})
    assert r.status_code == 200, r.text
    assert re.fullmatch("[a-z]{3,6}-[0-9]{2}", r.json()["choices"][0]["message"]["content"])
    r = chat(demo, structured_outputs={"choice": ["yes", "no", "maybe so"]})
    assert r.json()["choices"][0]["message"]["content"] in ("yes", "no", "maybe so")
    r = chat(demo, guided_choice=["red", "green"])
    assert r.json()["choices"][0]["message"]["content"] in ("red", "green")
    r = chat(demo, structured_outputs={"json": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                                                "additionalProperties": False}})
    assert json.loads(r.json()["choices"][0]["message"]["content"]) in ({"ok": True}, {"ok": False})


def test_ignore_eos_under_a_constraint(demo):
    """ignore_eos: the end token is masked while the grammar can go on; a complete document still ends."""
    r = chat(demo, structured_outputs={"regex": "[a-z ]*"}, ignore_eos=True, max_tokens=40)
    u = r.json()["usage"]
    assert r.json()["choices"][0]["finish_reason"] == "length" and u["completion_tokens"] == 40, r.text
    assert re.fullmatch("[a-z ]*", r.json()["choices"][0]["message"]["content"])
    r = chat(demo, structured_outputs={"choice": ["yes", "no"]}, ignore_eos=True, max_tokens=40)
    assert r.json()["choices"][0]["finish_reason"] == "stop" and r.json()["choices"][0]["message"]["content"] in ("yes", "no")


def test_completions_structured(demo):
    r = requests.post(demo.url("/v1/completions"), json={"model": "demo", "prompt": "The answer is", "max_tokens": 20, "temperature": 0,
                                                         "structured_outputs": {"choice": ["alpha", "beta"]}}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] in ("alpha", "beta")


@pytest.mark.parametrize("body,words", [
    ({"response_format": {"type": "bogus"}}, ["response_format"]),
    ({"response_format": {"type": "json_schema"}}, ["schema"]),
    ({"response_format": schema_format({"type": "object", "not": {"type": "string"}})}, ["not"]),
    ({"response_format": schema_format({"type": "string", "format": "email"})}, ["format"]),
    ({"structured_outputs": {"grammar": "root ::= 'a'"}}, ["grammar"]),
    ({"structured_outputs": {"regex": "(a)\\1"}}, ["regex"]),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, ["one"]),
    ({"tool_choice": "required"}, ["tools"]),
])
def test_constraint_errors_name_the_problem(demo, body, words):
    r = chat(demo, **body)
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    for w in words:
        assert w in msg, msg


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                                                      "unit": {"enum": ["c", "f"]}},
                                                     "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers",
                                      "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                                     "required": ["a", "b"], "additionalProperties": False}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def check_calls(calls, names):
    assert calls, "no tool call"
    for c in calls:
        assert c["function"]["name"] in names
        jsonschema.validate(json.loads(c["function"]["arguments"]), PARAMS[c["function"]["name"]])
        assert c["id"] and c["type"] == "function"


def test_tool_choice_required_and_named(demo):
    r = chat(demo, tools=TOOLS, tool_choice="required")
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "tool_calls", ch
    check_calls(ch["message"]["tool_calls"], PARAMS)
    r = chat(demo, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}})
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "tool_calls", ch
    assert len(ch["message"]["tool_calls"]) == 1
    check_calls(ch["message"]["tool_calls"], ["add"])
    r = chat(demo, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert r.status_code == 400 and "nope" in r.json()["error"]["message"]
    r = chat(demo, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert len(r.json()["choices"][0]["message"]["tool_calls"]) == 1


def test_tool_choice_required_stream(oai):
    calls = {}
    finish = None
    for chunk in oai.chat.completions.create(model="demo", messages=MSG, tools=TOOLS, tool_choice="required", max_tokens=200,
                                             temperature=0, stream=True):
        for c in chunk.choices:
            assert not c.delta.content
            for tc in c.delta.tool_calls or []:
                d = calls.setdefault(tc.index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                if tc.id:
                    d["id"] = tc.id
                if tc.function and tc.function.name:
                    d["function"]["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    d["function"]["arguments"] += tc.function.arguments
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    check_calls(list(calls.values()), PARAMS)


def test_openai_parse_pydantic(oai):
    from typing import Literal, Optional

    from pydantic import BaseModel, Field

    class Person(BaseModel):
        name: str = Field(max_length=16)
        age: int
        role: Literal["admin", "user"]
        email: Optional[str] = Field(max_length=20)

    r = oai.chat.completions.parse(model="demo", messages=MSG, response_format=Person, max_tokens=200, temperature=0)
    p = r.choices[0].message.parsed
    assert isinstance(p, Person), r.choices[0].message.content


def test_langchain_with_structured_output(demo):
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Answer(BaseModel):
        """An answer."""
        answer: str = Field(max_length=20)
        confidence: int

    # the demo model loops inside unbounded strings; a frequency penalty (applied under the
    # mask: still constrained) lets it close them within max_tokens
    llm = ChatOpenAI(model="demo", base_url=demo.url("/v1"), api_key="unused", temperature=0, max_tokens=200, max_retries=0,
                     frequency_penalty=1.0)
    for method in ("json_schema", "function_calling"):
        out = llm.with_structured_output(Answer, method=method).invoke("What is two plus two?")
        assert isinstance(out, Answer), (method, out)


def test_smolagents_tool_calling_agent(demo):
    """ToolCallingAgent always sends tool_choice "required": one step yields a tool call."""
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    @tool
    def square(x: int) -> int:
        """Square of an integer.

        Args:
            x: the integer
        """
        return x * x

    model = OpenAIServerModel(model_id="demo", api_base=demo.url("/v1"), api_key="unused", max_tokens=200, temperature=0,
                              frequency_penalty=1.0)  # see test_langchain_with_structured_output
    agent = ToolCallingAgent(tools=[square], model=model, max_steps=1, verbosity_level=0)
    agent.run("What is the square of 12?")
    steps = [s for s in agent.memory.steps if getattr(s, "tool_calls", None)]
    assert steps, [type(s).__name__ for s in agent.memory.steps]
    assert steps[0].tool_calls[0].name in ("square", "final_answer")

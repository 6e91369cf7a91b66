"""The OpenAI Responses API (/v1/responses) through the unchanged openai SDK
and openai-agents, against `tandem serve` on the demo model.

The demo model writes weak text: the tests check the protocol (event order,
sequence numbers, items, usage, the store), not the answers. Every streamed
sequence goes through the SDK's own typed parser (and, for
client.responses.stream, its accumulator), plus explicit order checks."""
import asyncio
import json
import os

import openai
import pytest
import requests
from openai.types.responses import (ResponseCompletedEvent, ResponseCreatedEvent, ResponseFunctionCallArgumentsDeltaEvent,
                                    ResponseFunctionCallArgumentsDoneEvent, ResponseInProgressEvent, ResponseOutputItemAddedEvent,
                                    ResponseOutputItemDoneEvent, ResponseTextDeltaEvent, ResponseTextDoneEvent)

from conftest import ROOT, Server

DEMO = os.path.join(ROOT, "models", "demo")
ASK = "Write a Python function that adds two numbers."
TOOLS = [{"type": "function", "name": "get_weather", "description": "Get the current weather for a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
# the demo model rarely stops on its own: a stop string (a tandem / vLLM
# extension, passed through) ends it with status "completed"
STOP = {"stop": ["\n"]}


@pytest.fixture(scope="module")
def demo():
    s = Server("-m", DEMO, "--quiet")
    yield s
    s.stop()
    s.check_clean_exit()


@pytest.fixture(scope="module")
def client(demo):
    return openai.OpenAI(base_url=demo.url("/v1"), api_key="unused", max_retries=0, timeout=120)


def sse(resp):
    """(event, data) pairs of a raw SSE response."""
    out = []
    for block in resp.content.decode("utf-8").split("\n\n"):
        if not block.strip() or block.startswith(":"):
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines.get("event"), json.loads(lines["data"])))
    return out


def check_sequence(events):
    """Order every Responses stream must keep; returns the types."""
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[1] == "response.in_progress", types[:3]
    assert types[-1] in ("response.completed", "response.incomplete"), types[-3:]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    rid = events[0].response.id
    assert rid.startswith("resp_") and events[-1].response.id == rid
    # each item: added, (parts and deltas), done, in order and not interleaved
    open_item = None
    for e in events[2:-1]:
        if e.type == "response.output_item.added":
            assert open_item is None
            open_item = e.output_index
        elif e.type == "response.output_item.done":
            assert open_item == e.output_index
            open_item = None
        else:
            assert open_item is not None and e.output_index == open_item, e.type
    assert open_item is None
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    assert added == list(range(len(added)))
    return types


# ---- non-streamed ------------------------------------------------------------

def test_create(client):
    r = client.responses.create(model="demo", input=ASK, max_output_tokens=16, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.model == "demo" and r.max_output_tokens == 16
    msg = [o for o in r.output if o.type == "message"]
    assert len(msg) == 1 and msg[0].role == "assistant" and msg[0].content[0].type == "output_text"
    assert isinstance(r.output_text, str) and r.output_text == msg[0].content[0].text
    u = r.usage
    assert u.input_tokens > 0 and u.output_tokens == 16 and u.total_tokens == u.input_tokens + u.output_tokens
    assert isinstance(u.input_tokens_details.cached_tokens, int) and u.output_tokens_details.reasoning_tokens == 0


def test_create_completed_with_instructions_and_items(client):
    r = client.responses.create(model="demo", instructions="You are terse.", temperature=0, max_output_tokens=64, extra_body=STOP,
                                input=[{"role": "user", "content": [{"type": "input_text", "text": ASK}]},
                                       {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sure."}]},
                                       {"role": "developer", "content": "Answer in one line."},
                                       {"role": "user", "content": "Go on."}])
    assert r.status == "completed" and r.incomplete_details is None and r.instructions == "You are terse."
    assert r.output[-1].status == "completed"
    assert r.usage.output_tokens <= 64


def test_stream_events(client):
    kw = dict(model="demo", input=ASK, max_output_tokens=24, temperature=0)
    events = list(client.responses.create(stream=True, **kw))
    types = check_sequence(events)
    assert isinstance(events[0], ResponseCreatedEvent) and isinstance(events[1], ResponseInProgressEvent)
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    deltas = [e for e in events if isinstance(e, ResponseTextDeltaEvent)]
    done = [e for e in events if isinstance(e, ResponseTextDoneEvent)]
    assert deltas and len(done) == 1
    text = "".join(d.delta for d in deltas)
    assert done[0].text == text
    assert types.index("response.content_part.added") < types.index("response.output_text.delta")
    assert types.index("response.output_text.done") < types.index("response.content_part.done") < types.index("response.output_item.done")
    final = events[-1].response
    assert final.status == "incomplete" and final.output_text == text and final.usage.output_tokens == 24
    items = [e for e in events if isinstance(e, (ResponseOutputItemAddedEvent, ResponseOutputItemDoneEvent))]
    assert items[0].item.status == "in_progress" and items[-1].item.id == items[0].item.id
    assert client.responses.create(**kw).output_text == text  # greedy: streamed = not streamed


def test_stream_helper_final_response(client):
    with client.responses.stream(model="demo", input=ASK, max_output_tokens=64, temperature=0, extra_body=STOP) as stream:
        events = list(stream)
        final = stream.get_final_response()
    check_sequence(events)
    assert isinstance(events[-1], ResponseCompletedEvent)
    snap = [e.snapshot for e in events if e.type == "response.output_text.delta"]
    assert final.status == "completed" and final.output_text == (snap[-1] if snap else "")
    assert final.usage.input_tokens > 0


def test_raw_sse_framing(demo):
    r = requests.post(demo.url("/v1/responses"), json={"model": "demo", "input": "Hi", "max_output_tokens": 4, "stream": True},
                      timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    evs = sse(r)
    assert all(name == data["type"] for name, data in evs)  # the event: line names the data's type
    assert [d["sequence_number"] for _, d in evs] == list(range(len(evs)))
    assert "[DONE]" not in r.text


# ---- previous_response_id and the store ------------------------------------------

def test_previous_response_id_hits_prefix_cache(client):
    r1 = client.responses.create(model="demo", input=ASK, max_output_tokens=12, temperature=0)
    r2 = client.responses.create(model="demo", input="Now one that subtracts.", previous_response_id=r1.id, max_output_tokens=8,
                                 temperature=0)
    assert r2.previous_response_id == r1.id
    # the whole first turn is the second's prefix; the cache holds prompts
    # (recurrent-state checkpoints at their end), less the last token, which is recomputed
    assert r2.usage.input_tokens > r1.usage.input_tokens + r1.usage.output_tokens
    assert r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens - 1 > 0
    # streamed follow-up too
    ev = list(client.responses.create(model="demo", input="And one more.", previous_response_id=r2.id, max_output_tokens=4,
                                      temperature=0, stream=True))
    assert ev[-1].response.usage.input_tokens_details.cached_tokens > 0


def test_retrieve_delete_and_store_false(client):
    r = client.responses.create(model="demo", input="Hello", max_output_tokens=6, temperature=0)
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.usage.output_tokens == r.usage.output_tokens
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="demo", input="x", previous_response_id=r.id, max_output_tokens=2)
    r = client.responses.create(model="demo", input="Hello", max_output_tokens=2, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_store_is_bounded(make_server):
    s = make_server("-m", DEMO, "--quiet", "--responses-store", "2")
    c = openai.OpenAI(base_url=s.url("/v1"), api_key="x", max_retries=0, timeout=60)
    ids = [c.responses.create(model="demo", input=f"Say {i}", max_output_tokens=2).id for i in range(3)]
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(ids[0])  # least recently used, dropped
    assert c.responses.retrieve(ids[2]).id == ids[2]
    s2 = make_server("-m", DEMO, "--quiet", "--responses-store", "0")
    c2 = openai.OpenAI(base_url=s2.url("/v1"), api_key="x", max_retries=0, timeout=60)
    with pytest.raises(openai.NotFoundError):
        c2.responses.retrieve(c2.responses.create(model="demo", input="x", max_output_tokens=2).id)


# ---- function tools ----------------------------------------------------------------

def test_function_call_round_trip(client):
    r = client.responses.create(model="demo", input="What is the weather in Paris?", tools=TOOLS, max_output_tokens=64,
                                temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls, r.output
    c = calls[0]
    assert c.name == "get_weather" and c.call_id and c.id.startswith("fc_") and c.status == "completed"
    assert isinstance(json.loads(c.arguments), dict)
    assert r.tools[0].name == "get_weather"
    # the call and its output back as items
    follow = [{"role": "user", "content": "What is the weather in Paris?"}] + [o.model_dump(exclude_none=True) for o in r.output] + \
             [{"type": "function_call_output", "call_id": c.call_id, "output": "Sunny, 22 C."}]
    r2 = client.responses.create(model="demo", input=follow, tools=TOOLS, max_output_tokens=16, temperature=0)
    assert r2.status in ("completed", "incomplete") and r2.usage.input_tokens > r.usage.input_tokens
    # a call cut by a stop string has invalid arguments: a message instead, as the chat path falls back
    cut = client.responses.create(model="demo", input="What is the weather in Paris?", tools=TOOLS, max_output_tokens=64,
                                  temperature=0, extra_body={"stop": ["Paris"]})
    assert [o.type for o in cut.output] == ["message"] and "get_weather" in cut.output_text
    # tool_choice none: no call
    r3 = client.responses.create(model="demo", input="What is the weather in Paris?", tools=TOOLS, tool_choice="none",
                                 max_output_tokens=16, temperature=0)
    assert not [o for o in r3.output if o.type == "function_call"]


def test_function_call_stream(client):
    events = list(client.responses.create(model="demo", input="What is the weather in Paris?", tools=TOOLS, max_output_tokens=64,
                                          temperature=0, stream=True))
    check_sequence(events)
    args = [e for e in events if isinstance(e, ResponseFunctionCallArgumentsDeltaEvent)]
    done = [e for e in events if isinstance(e, ResponseFunctionCallArgumentsDoneEvent)]
    assert done and "".join(a.delta for a in args if a.item_id == done[0].item_id) == done[0].arguments
    call = [o for o in events[-1].response.output if o.type == "function_call"][0]
    assert call.arguments == done[0].arguments and call.name == "get_weather"
    added = [e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"][0]
    assert added.item.arguments == "" and added.item.call_id == call.call_id
    # the helper's accumulator agrees
    with client.responses.stream(model="demo", input="What is the weather in Paris?", tools=TOOLS, max_output_tokens=64,
                                 temperature=0) as st:
        snaps = [e.snapshot for e in st if e.type == "response.function_call_arguments.delta"]
        final = st.get_final_response()
    assert snaps[-1] == call.arguments
    assert [o.arguments for o in final.output if o.type == "function_call"] == [call.arguments]


def test_tool_choice_required(client):
    """tool_choice passes through to the chat path's constrained decoding."""
    r = client.responses.create(model="demo", input="What is the weather in Paris?", tools=TOOLS, tool_choice="required",
                                max_output_tokens=96, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and isinstance(json.loads(calls[0].arguments), dict)


def test_text_format_json_schema(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"],
              "additionalProperties": False}
    r = client.responses.create(model="demo", input="Give me a person as JSON.", max_output_tokens=80, temperature=0,
                                text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
    assert r.text.format.type == "json_schema"
    import jsonschema
    jsonschema.validate(json.loads(r.output_text), schema)
    r = client.responses.create(model="demo", input="JSON please.", max_output_tokens=60, temperature=0,
                                text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(r.output_text), dict)


# ---- errors ----------------------------------------------------------------------

def test_errors(client, demo):
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="demo", input=[{"type": "input_image", "image_url": "x"}])
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="demo", input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="demo", input="x", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="demo", input="x", text={"format": {"type": "bogus"}})
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="demo", input="x", max_output_tokens=0)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nope", input="x")
    r = requests.post(demo.url("/v1/responses"), data="{", timeout=10)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert requests.put(demo.url("/v1/responses/abc"), timeout=10).status_code == 405


def test_routes_without_v1(demo):
    body = {"model": "demo", "input": "Hi", "max_output_tokens": 2}
    r = requests.post(demo.url("/responses"), json=body, timeout=60)
    assert r.status_code == 200 and r.json()["object"] == "response"
    rid = r.json()["id"]
    assert requests.get(demo.url(f"/responses/{rid}"), timeout=10).json()["id"] == rid
    r = requests.post(demo.url("/messages"), json={"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]},
                      timeout=60)
    assert r.status_code == 200 and r.json()["type"] == "message"
    r = requests.post(demo.url("/chat/completions"), json={"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]},
                      timeout=60)
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    r = requests.post(demo.url("/completions"), json={"model": "demo", "max_tokens": 2, "prompt": "Hi"}, timeout=60)
    assert r.status_code == 200 and r.json()["object"] == "text_completion"
    assert requests.get(demo.url("/models"), timeout=10).json()["data"][0]["id"] == "demo"
    assert requests.get(demo.url("/nope"), timeout=10).status_code == 404


# ---- openai-agents -----------------------------------------------------------------

def test_openai_agents_function_tool(demo):
    from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_api, set_default_openai_client, set_tracing_disabled
    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        calls.append(city)
        return f"Sunny in {city}."

    set_tracing_disabled(True)
    set_default_openai_api("responses")
    set_default_openai_client(openai.AsyncOpenAI(base_url=demo.url("/v1"), api_key="unused", max_retries=0), use_for_tracing=False)
    agent = Agent(name="weather", instructions="Answer weather questions with the tool.", model="demo", tools=[get_weather],
                  model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=64),
                  tool_use_behavior="stop_on_first_tool")
    plain = Agent(name="plain", instructions="Be brief.", model="demo", model_settings=ModelSettings(temperature=0, max_tokens=64, extra_body=STOP))

    async def main():  # one event loop: the client's connections belong to it
        result = await Runner.run(agent, "What is the weather in Paris?", max_turns=3)
        run = Runner.run_streamed(plain, "Say hello.")  # a plain turn, streamed through the Responses model
        async for _ in run.stream_events():
            pass
        return result, run

    result, run = asyncio.run(main())
    assert calls, result.new_items
    assert result.final_output == f"Sunny in {calls[0]}."
    types = [i.type for i in result.new_items]
    assert "tool_call_item" in types and "tool_call_output_item" in types
    assert isinstance(run.final_output, str)
    assert run.raw_responses and run.raw_responses[-1].usage.input_tokens > 0


# ---- reasoning items --------------------------------------------------------------

def test_reasoning_items(server_think):
    """tiny-b with a template that opens <think>: its output is reasoning."""
    c = openai.OpenAI(base_url=server_think.url("/v1"), api_key="x", max_retries=0, timeout=60)
    r = c.responses.create(model="think", input="Hi", max_output_tokens=8, temperature=0)
    rs = r.output[0]
    assert rs.type == "reasoning" and rs.id.startswith("rs_") and rs.content[0].type == "reasoning_text" and rs.content[0].text
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    assert r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens
    events = list(c.responses.create(model="think", input="Hi", max_output_tokens=8, temperature=0, stream=True))
    check_sequence(events)
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    done = [e for e in events if e.type == "response.reasoning_text.done"]
    assert deltas and len(done) == 1 and "".join(deltas) == done[0].text == rs.content[0].text
    parts = [e.part.type for e in events if e.type == "response.content_part.added"]
    assert parts[0] == "reasoning_text"
    assert events[-1].response.output[0].content[0].text == rs.content[0].text
    # the item goes back as input (the next turn's reasoning_content)
    r2 = c.responses.create(model="think", input=[{"role": "user", "content": "Hi"}, rs.model_dump(exclude_none=True),
                                                  {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
                                                  {"role": "user", "content": "Again"}], max_output_tokens=2)
    assert r2.status == "incomplete"
    # reasoning effort none: the template's thinking switch off
    r3 = c.responses.create(model="think", input="Hi", max_output_tokens=8, temperature=0, reasoning={"effort": "none"})
    assert all(o.type != "reasoning" for o in r3.output) and r3.usage.output_tokens_details.reasoning_tokens == 0


def test_hostile_bodies(demo):
    """Malformed Responses and Messages bodies: a 4xx in the route's shape, never a crash."""
    bad_responses = [
        {"input": 5}, {"input": [5]}, {"input": [{}]}, {"input": [{"type": "message", "role": "tool", "content": "x"}]},
        {"input": [{"role": "user", "content": 5}]}, {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
        {"input": [{"type": "function_call", "name": 1, "call_id": "c"}]},
        {"input": [{"type": "function_call", "name": "f", "call_id": "c", "arguments": {}}]},
        {"input": [{"type": "function_call_output", "output": "x"}]},
        {"input": [{"type": "reasoning", "content": "x"}]}, {"input": [{"type": "reasoning", "summary": [{"text": 1}]}]},
        {"input": [{"type": "item_reference", "id": "x"}]}, {"input": "x", "instructions": 5}, {"input": "x", "tools": {}},
        {"input": "x", "tools": [{"type": "function"}]}, {"input": "x", "tool_choice": {"type": "file_search"}},
        {"input": "x", "tool_choice": 3}, {"input": "x", "text": "json"}, {"input": "x", "text": {"format": {}}},
        {"input": "x", "store": "yes"}, {"input": "x", "previous_response_id": 7}, {"input": "x", "reasoning": "high"},
        {"input": "x", "max_output_tokens": "9"}, {"input": "x", "temperature": "hot"}, {}, {"input": []},
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}] * 10001}]},
    ]
    for b in bad_responses:
        r = requests.post(demo.url("/v1/responses"), json=dict(b, model="demo", max_output_tokens=b.get("max_output_tokens", 2)), timeout=30)
        assert 400 <= r.status_code < 500 and r.json()["error"]["message"], (b, r.text)
    bad_messages = [
        {"messages": 5}, {"messages": [5]}, {"messages": [{"role": "user"}]}, {"messages": [{"role": "user", "content": [5]}]},
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}]}]},
        {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": []}]}]},
        {"messages": [{"role": "assistant", "content": [{"type": "thinking"}]}]},
        {"system": 5}, {"system": [{"type": "image"}]}, {"tools": [{}]}, {"tools": [{"name": "f", "input_schema": 3}]},
        {"tool_choice": "auto"}, {"tool_choice": {"type": "tool"}}, {"tool_choice": {"type": "x"}}, {"thinking": {"type": "x"}},
        {"stop_sequences": "x"}, {"max_tokens": 0}, {"max_tokens": "2"}, {"messages": []},
    ]
    for b in bad_messages:
        body = {"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
        body.update(b)
        r = requests.post(demo.url("/v1/messages"), json=body, timeout=30)
        j = r.json()
        assert r.status_code == 400 and j["type"] == "error" and j["error"]["type"] == "invalid_request_error", (b, r.text)
        if "max_tokens" not in b:
            r = requests.post(demo.url("/v1/messages/count_tokens"), json=body, timeout=30)
            assert r.status_code == 400 and r.json()["type"] == "error", (b, r.text)
    assert requests.get(demo.url("/health"), timeout=10).status_code == 200

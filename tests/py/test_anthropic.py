"""The Anthropic Messages API (/v1/messages, /v1/messages/count_tokens)
through the unchanged anthropic SDK, against `tandem serve` on the demo
model (and tiny-b with a thinking template for thinking blocks).

The tests check the protocol, not the demo model's weak answers; every
stream goes through the SDK's own event parser and accumulator
(messages.stream), plus explicit order checks."""
import json
import os

import anthropic
import pytest
import requests

from conftest import ROOT, Server

DEMO = os.path.join(ROOT, "models", "demo")
ASK = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{"name": "get_weather", "description": "Get the current weather for a city.",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
# this SDK has no sampling parameters; the API's temperature / top_p / top_k go in the body
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def demo():
    s = Server("-m", DEMO, "--quiet")
    yield s
    s.stop()
    s.check_clean_exit()


@pytest.fixture(scope="module")
def client(demo):
    return anthropic.Anthropic(base_url=demo.base, api_key="unused", max_retries=0, timeout=120)


def prompt_tokens(usage):
    """Anthropic's split: input_tokens is the part not read from the cache."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def check_order(events):
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"], types
    open_block = None
    for e in events[1:-2]:
        if e.type == "content_block_start":
            assert open_block is None
            open_block = e.index
        elif e.type == "content_block_stop":
            assert open_block == e.index
            open_block = None
        else:
            assert e.type == "content_block_delta" and e.index == open_block, e.type
    starts = [e.index for e in events if e.type == "content_block_start"]
    assert starts == list(range(len(starts)))
    return types


def test_create(client):
    r = client.messages.create(model="demo", max_tokens=16, messages=ASK, extra_body=GREEDY)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_") and r.model == "demo"
    assert r.stop_reason == "max_tokens" and r.stop_sequence is None
    assert len(r.content) == 1 and r.content[0].type == "text" and isinstance(r.content[0].text, str)
    assert r.usage.output_tokens == 16 and prompt_tokens(r.usage) > 0
    assert r.usage.cache_read_input_tokens is not None


def test_system_blocks_stop_sequences_and_cache(client):
    kw = dict(model="demo", max_tokens=64, extra_body=GREEDY, stop_sequences=["\n"],
              system=[{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Use Python."}],
              messages=[{"role": "user", "content": [{"type": "text", "text": "Write a Python function that adds two numbers."}]},
                        {"role": "assistant", "content": "Sure."},
                        {"role": "user", "content": "Go on."}], metadata={"user_id": "u1"})
    r1 = client.messages.create(**kw)
    assert r1.stop_reason == "stop_sequence" and r1.stop_sequence == "\n" and "\n" not in r1.content[0].text
    r2 = client.messages.create(**kw)
    assert r2.content == r1.content
    assert r2.usage.cache_read_input_tokens > 0 and prompt_tokens(r2.usage) == prompt_tokens(r1.usage)
    # a system string works the same
    r3 = client.messages.create(model="demo", max_tokens=4, system="You are terse.", messages=ASK,
                                extra_body={"top_k": 1, "top_p": 0.9, "temperature": 0.5})
    assert r3.stop_reason == "max_tokens"


def test_stream(client):
    kw = dict(model="demo", max_tokens=24, messages=ASK, extra_body=GREEDY)
    with client.messages.stream(**kw) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 24 and prompt_tokens(final.usage) > 0
    assert client.messages.create(**kw).content[0].text == text  # greedy: streamed = not streamed
    events = list(client.messages.create(stream=True, **kw))
    check_order(events)
    assert events[0].message.usage.output_tokens == 0 and events[0].message.content == []
    assert events[-2].delta.stop_reason == "max_tokens" and events[-2].usage.output_tokens == 24
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == text


def test_raw_stream_has_pings_and_named_events(demo):
    r = requests.post(demo.url("/v1/messages"), json={"model": "demo", "max_tokens": 3, "stream": True, "messages": ASK}, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    evs = []
    for block in r.text.split("\n\n"):
        if block.strip():
            lines = dict(line.split(": ", 1) for line in block.split("\n"))
            evs.append((lines["event"], json.loads(lines["data"])))
    assert all(name == data["type"] for name, data in evs)
    assert [n for n, _ in evs][:2] == ["message_start", "ping"]


def test_count_tokens(client):
    for kw in (dict(messages=ASK), dict(messages=WEATHER, tools=TOOLS, system="Be helpful.")):
        n = client.messages.count_tokens(model="demo", **kw).input_tokens
        r = client.messages.create(model="demo", max_tokens=2, **kw)
        assert n > 0 and prompt_tokens(r.usage) == n
    bare = client.messages.count_tokens(model="demo", messages=WEATHER).input_tokens
    assert client.messages.count_tokens(model="demo", messages=WEATHER, tools=TOOLS).input_tokens > bare


def test_tool_use_round_trip(client):
    r = client.messages.create(model="demo", max_tokens=64, messages=WEATHER, tools=TOOLS, extra_body=GREEDY)
    assert r.stop_reason == "tool_use", r.content
    tu = [b for b in r.content if b.type == "tool_use"]
    assert len(tu) == 1 and tu[0].name == "get_weather" and tu[0].id.startswith("toolu_") and isinstance(tu[0].input, dict)
    follow = WEATHER + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu[0].id, "content": "Sunny, 22 C."},
                                                     {"type": "text", "text": "Summarize."}]}]
    r2 = client.messages.create(model="demo", max_tokens=16, messages=follow, tools=TOOLS, extra_body=GREEDY)
    assert r2.type == "message" and prompt_tokens(r2.usage) > prompt_tokens(r.usage)
    # tool_result content as text blocks, and an error result
    follow[-1]["content"] = [{"type": "tool_result", "tool_use_id": tu[0].id, "is_error": True,
                              "content": [{"type": "text", "text": "no network"}]}]
    assert client.messages.create(model="demo", max_tokens=4, messages=follow, tools=TOOLS).type == "message"
    # streamed: the SDK's accumulator rebuilds the same input from input_json deltas
    with client.messages.stream(model="demo", max_tokens=64, messages=WEATHER, tools=TOOLS, extra_body=GREEDY) as s:
        events = list(s)
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and [b.input for b in final.content if b.type == "tool_use"] == [tu[0].input]
    assert any(e.type == "input_json" for e in events)
    # a call cut by a stop sequence has invalid arguments: the output is text, as the chat path falls back
    cut = client.messages.create(model="demo", max_tokens=64, messages=WEATHER, tools=TOOLS, stop_sequences=["Paris"], extra_body=GREEDY)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == "Paris"
    assert [b.type for b in cut.content] == ["text"] and "get_weather" in cut.content[0].text
    # tool_choice: none never calls; any forces a call
    r3 = client.messages.create(model="demo", max_tokens=16, messages=WEATHER, tools=TOOLS, tool_choice={"type": "none"})
    assert all(b.type != "tool_use" for b in r3.content) and r3.stop_reason != "tool_use"
    r4 = client.messages.create(model="demo", max_tokens=96, messages=WEATHER, tools=TOOLS, tool_choice={"type": "any"}, extra_body=GREEDY)
    assert r4.stop_reason == "tool_use" and r4.content[-1].name == "get_weather"


def test_thinking_blocks(server_think):
    """tiny-b with a template that opens <think>: its output is reasoning."""
    c = anthropic.Anthropic(base_url=server_think.base, api_key="x", max_retries=0, timeout=60)
    r = c.messages.create(model="think", max_tokens=8, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1024},
                          extra_body=GREEDY)
    assert r.content[0].type == "thinking" and r.content[0].thinking
    with c.messages.stream(model="think", max_tokens=8, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1024},
                           extra_body=GREEDY) as s:
        events = list(s)
        final = s.get_final_message()
    assert [e.type for e in events if e.type == "thinking"] and final.content[0].thinking == r.content[0].thinking
    r = c.messages.create(model="think", max_tokens=8, messages=ASK, thinking={"type": "disabled"}, extra_body=GREEDY)
    assert all(b.type != "thinking" for b in r.content)
    # thinking blocks (and redacted ones) in the history are accepted
    hist = ASK + [{"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": ""},
                                                    {"type": "redacted_thinking", "data": "xx"}, {"type": "text", "text": "ok"}]},
                  {"role": "user", "content": "more"}]
    assert c.messages.create(model="think", max_tokens=2, messages=hist).type == "message"


def test_errors(client, demo):
    with pytest.raises(anthropic.BadRequestError) as e:  # max_tokens is required, as Anthropic's API
        client.post("/v1/messages", body={"model": "demo", "messages": ASK}, cast_to=anthropic.types.Message)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="claude-nope", max_tokens=4, messages=ASK)
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="demo", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="demo", max_tokens=4, messages=[{"role": "system", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="demo", max_tokens=4, messages=ASK, tools=[{"type": "bash_20250124", "name": "bash"}])
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model="demo", messages=[])
    r = requests.post(demo.url("/v1/messages"), data="{", timeout=10)
    assert r.status_code == 400 and r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    r = requests.get(demo.url("/v1/messages"), timeout=10)
    assert r.status_code == 405 and r.json()["type"] == "error"


def test_api_key(make_server):
    s = make_server("-m", DEMO, "--quiet", "--api-key", "sekret")
    ok = anthropic.Anthropic(base_url=s.base, api_key="sekret", max_retries=0, timeout=60)  # sends x-api-key
    assert ok.messages.create(model="demo", max_tokens=2, messages=ASK).type == "message"
    assert ok.messages.count_tokens(model="demo", messages=ASK).input_tokens > 0
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=s.base, api_key="wrong", max_retries=0).messages.create(model="demo", max_tokens=2, messages=ASK)
    assert e.value.body["error"]["type"] == "authentication_error"
    bearer = anthropic.Anthropic(base_url=s.base, auth_token="sekret", max_retries=0)  # Authorization: Bearer
    assert bearer.messages.create(model="demo", max_tokens=2, messages=ASK).type == "message"
    # x-api-key on every route; the OpenAI error shape elsewhere
    chat = {"model": "demo", "max_tokens": 2, "messages": ASK}
    assert requests.post(s.url("/v1/chat/completions"), json=chat, headers={"x-api-key": "sekret"}, timeout=60).status_code == 200
    r = requests.post(s.url("/v1/chat/completions"), json=chat, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    import openai
    oc = openai.OpenAI(base_url=s.url("/v1"), api_key="sekret", max_retries=0)
    assert oc.responses.create(model="demo", input="Hi", max_output_tokens=2).status == "incomplete"

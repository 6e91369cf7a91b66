"""End-to-end tests of `tandem serve` through the openai SDK and raw HTTP."""
import json
import socket
import threading
import time

import openai
import pytest
import requests

from conftest import MODEL_NAME

MSG = [{"role": "user", "content": "Write a function that adds two numbers."}]


def chat(server, **kw):
    body = {"model": MODEL_NAME, "messages": MSG, "temperature": 0, "max_tokens": 16}
    body.update(kw)
    return requests.post(server.url("/v1/chat/completions"), json=body, timeout=60)


def sse_events(resp):
    """data: payloads of an SSE response, checking the framing."""
    raw = resp.content.decode("utf-8")
    assert raw.endswith("data: [DONE]\n\n"), raw[-200:]
    events = raw.split("\n\n")
    assert events[-1] == ""
    out = []
    for ev in events[:-1]:
        assert ev.startswith("data: "), ev[:80]
        out.append(ev[len("data: "):])
    assert out[-1] == "[DONE]"
    return [json.loads(e) for e in out[:-1]]


# ---- basics ------------------------------------------------------------------

def test_health_and_models(server, client):
    assert requests.get(server.url("/health")).status_code == 200
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    raw = requests.get(server.url("/v1/models")).json()
    assert raw["object"] == "list"
    assert raw["data"][0]["max_model_len"] == 4096
    assert raw["data"][0]["object"] == "model"


def test_chat_nonstream(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=MSG, temperature=0, max_tokens=16)
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant"
    assert isinstance(c.message.content, str)
    assert c.finish_reason in ("length", "stop")
    u = r.usage
    assert u.prompt_tokens > 0 and u.total_tokens == u.prompt_tokens + u.completion_tokens
    if c.finish_reason == "length":
        assert u.completion_tokens == 16
    assert isinstance(u.prompt_tokens_details.cached_tokens, int)


def test_chat_stream_sdk(client):
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=MSG, temperature=0, max_tokens=12, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason in ("length", "stop")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    nonstream = client.chat.completions.create(model=MODEL_NAME, messages=MSG, temperature=0, max_tokens=12)
    assert text == nonstream.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == nonstream.usage.completion_tokens


def test_chat_stream_raw(server):
    r = chat(server, stream=True, max_tokens=6)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    evs = sse_events(r)
    assert evs[0]["choices"][0]["delta"]["role"] == "assistant"
    assert evs[-1]["choices"][0]["finish_reason"] is not None
    # without include_usage: no usage chunk
    assert all(e["choices"] for e in evs)


def test_completions(server, client):
    r = client.completions.create(model=MODEL_NAME, prompt="def add(a, b):", temperature=0, max_tokens=10, logprobs=2)
    assert r.object == "text_completion"
    c = r.choices[0]
    assert isinstance(c.text, str) and c.finish_reason in ("length", "stop")
    assert len(c.logprobs.tokens) == r.usage.completion_tokens == len(c.logprobs.token_logprobs)
    assert all(lp <= 0 for lp in c.logprobs.token_logprobs)
    s = list(client.completions.create(model=MODEL_NAME, prompt="def add(a, b):", temperature=0, max_tokens=10, stream=True))
    assert "".join(x.choices[0].text for x in s) == c.text
    assert s[-1].choices[0].finish_reason == c.finish_reason
    # token-id prompt gives the same as the text
    ids = requests.post(server.url("/tokenize"), json={"prompt": "def add(a, b):"}).json()["tokens"]
    r2 = client.completions.create(model=MODEL_NAME, prompt=ids, temperature=0, max_tokens=10)
    assert r2.choices[0].text == c.text


def test_chat_logprobs(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=MSG, temperature=0, max_tokens=6, logprobs=True, top_logprobs=2)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    for e in lp:
        assert e.logprob <= 0 and len(e.top_logprobs) == 2
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert e.top_logprobs[0].token == e.token  # greedy: the chosen one is the most likely
        assert isinstance(e.bytes, list)


def test_unknown_fields_ignored(server):
    r = chat(server, foo={"bar": 1}, logit_bias={}, user="me", parallel_tool_calls=True, metadata={"a": "b"})
    assert r.status_code == 200, r.text


# ---- stop strings, lengths -------------------------------------------------

def greedy_tokens(server, prompt, n):
    r = requests.post(server.url("/v1/completions"),
                      json={"prompt": prompt, "temperature": 0, "max_tokens": n, "logprobs": 0}, timeout=60).json()
    return r["choices"][0]["text"], r["choices"][0]["logprobs"]["tokens"]


def pick_stop(text, toks):
    """A stop string across a token boundary, from plain printable text."""
    pos = 0
    for i in range(len(toks) - 1):
        pos += len(toks[i])
        a, b = toks[i], toks[i + 1]
        if pos >= 2 and a and b and "\ufffd" not in a + b and (a[-1] + b[0]).isprintable():
            stop = a[-1] + b[0]
            first = text.find(stop)
            if first >= 1:
                return stop, text[:first]
    for k in range(1, len(text) - 2):  # fall back: any printable pair
        stop = text[k:k + 2]
        if "\ufffd" not in stop and stop.isprintable() and text.find(stop) == k:
            return stop, text[:k]
    pytest.skip("no usable stop string in the greedy output")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string(server, stream):
    prompt = "def add(a, b):"
    text, toks = greedy_tokens(server, prompt, 40)
    stop, want = pick_stop(text, toks)
    body = {"prompt": prompt, "temperature": 0, "max_tokens": 40, "stop": [stop], "stream": stream}
    r = requests.post(server.url("/v1/completions"), json=body, timeout=60)
    assert r.status_code == 200
    if stream:
        evs = sse_events(r)
        got = "".join(e["choices"][0]["text"] for e in evs)
        fin = evs[-1]["choices"][0]["finish_reason"]
    else:
        got = r.json()["choices"][0]["text"]
        fin = r.json()["choices"][0]["finish_reason"]
    assert got == want and stop not in got
    assert fin == "stop"


def test_chat_stop_string(server, client):
    full = client.chat.completions.create(model=MODEL_NAME, messages=MSG, temperature=0, max_tokens=40).choices[0].message.content
    cand = [full[k:k + 2] for k in range(1, len(full) - 2)]
    cand = [c for c in cand if "\ufffd" not in c and c.isprintable() and full.find(c) >= 1]
    if not cand:
        pytest.skip("no usable stop string")
    stop = cand[len(cand) // 2]
    want = full[:full.find(stop)]
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=MSG, temperature=0, max_tokens=40, stop=stop, stream=True))
    got = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert got == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_max_tokens(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=MSG, temperature=0, max_tokens=5, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    r = client.chat.completions.create(model=MODEL_NAME, messages=MSG, temperature=0, max_completion_tokens=3,
                                       extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3


def test_seed_reproducible(server):
    a = chat(server, temperature=1.0, seed=1234, max_tokens=20).json()["choices"][0]["message"]["content"]
    b = chat(server, temperature=1.0, seed=1234, max_tokens=20).json()["choices"][0]["message"]["content"]
    assert a == b


def test_cached_tokens_rise(server):
    """A prompt that extends an earlier request (prompt + output) reuses its state."""
    ids = requests.post(server.url("/tokenize"), json={"prompt": "You are a careful assistant. " * 20}).json()["tokens"]
    body = {"prompt": ids, "temperature": 0, "max_tokens": 4, "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True}
    r1 = requests.post(server.url("/v1/completions"), json=body, timeout=60).json()
    assert r1["usage"]["prompt_tokens"] == len(ids)
    toks = r1["choices"][0]["logprobs"]["tokens"]
    assert all(t.startswith("token_id:") for t in toks)
    gen = [int(t.split(":")[1]) for t in toks]
    body2 = dict(body, prompt=ids + gen + ids[:8])
    r2 = requests.post(server.url("/v1/completions"), json=body2, timeout=60).json()
    cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert len(ids) <= cached < r2["usage"]["prompt_tokens"]


# ---- errors --------------------------------------------------------------------

def check_error(r, status):
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert isinstance(e["message"], str) and e["message"]
    assert "type" in e and "code" in e
    return e


def test_errors(server):
    u = server.url("/v1/chat/completions")
    check_error(requests.post(u, data=b"{bad json", timeout=10), 400)
    check_error(requests.post(u, json=[1, 2], timeout=10), 400)
    check_error(chat(server, temperature="hot"), 400)
    check_error(chat(server, max_tokens=0), 400)
    check_error(chat(server, messages=[]), 400)
    check_error(chat(server, messages=[{"role": "wizard", "content": "x"}]), 400)
    check_error(chat(server, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400)
    check_error(chat(server, n=17), 400)
    check_error(chat(server, stop=5), 400)
    check_error(chat(server, tools=[{"type": "function"}]), 400)
    check_error(chat(server, model="no-such-model"), 404)
    check_error(requests.get(server.url("/v1/nothing"), timeout=10), 404)
    check_error(requests.get(server.url("/v1/chat/completions"), timeout=10), 405)
    check_error(requests.post(server.url("/v1/completions"), json={"prompt": [10**9]}, timeout=10), 400)
    check_error(requests.post(server.url("/detokenize"), json={"tokens": ["a"]}, timeout=10), 400)


def test_sdk_raises_on_error(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_NAME, messages=MSG, n=99)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=MSG)


@pytest.mark.parametrize("stream", [False, True])
def test_context_overflow(server, stream):
    msgs = [{"role": "user", "content": "hello " * 5000}]
    r = chat(server, messages=msgs, stream=stream)
    e = check_error(r, 400)
    assert "exceeds the available context size (4096 tokens)" in e["message"]
    assert e["n_ctx"] == 4096 and e["n_prompt_tokens"] > 4096
    assert r.headers["content-type"].startswith("application/json")


def test_body_too_large(make_server):
    s = make_server("--max-body", "64k", "--quiet")
    r = requests.post(s.url("/v1/chat/completions"), data=b"x" * (100 * 1024), headers={"Content-Type": "application/json"}, timeout=10)
    check_error(r, 413)


def test_api_key(make_server):
    s = make_server("--api-key", "sekrit", "--quiet")
    u = s.url("/v1/chat/completions")
    body = {"messages": MSG, "max_tokens": 2, "temperature": 0}
    e = check_error(requests.post(u, json=body, timeout=10), 401)
    assert e["type"] == "authentication_error"
    check_error(requests.post(u, json=body, headers={"Authorization": "Bearer wrong"}, timeout=10), 401)
    check_error(requests.get(s.url("/v1/models"), timeout=10), 401)
    check_error(requests.get(s.url("/metrics"), timeout=10), 401)
    check_error(requests.post(s.url("/tokenize"), json={"prompt": "x"}, timeout=10), 401)
    assert requests.get(s.url("/health"), timeout=10).status_code == 200
    assert requests.post(u, json=body, headers={"Authorization": "Bearer sekrit"}, timeout=30).status_code == 200
    from openai import OpenAI
    ok = OpenAI(base_url=s.url("/v1"), api_key="sekrit", max_retries=0)
    assert ok.models.list().data[0].id == MODEL_NAME
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=s.url("/v1"), api_key="bad", max_retries=0).models.list()


# ---- tokenize ----------------------------------------------------------------------

def test_tokenize_roundtrip(server):
    text = "Hello, world! def f(x): return x ** 2  # ünïcödé ✓"
    t = requests.post(server.url("/tokenize"), json={"prompt": text, "return_token_strs": True}, timeout=10).json()
    assert t["count"] == len(t["tokens"]) > 0 and t["max_model_len"] == 4096
    assert len(t["token_strs"]) == t["count"]
    d = requests.post(server.url("/detokenize"), json={"tokens": t["tokens"]}, timeout=10).json()
    assert d["prompt"] == text
    m = requests.post(server.url("/tokenize"), json={"messages": MSG}, timeout=10).json()
    r = requests.post(server.url("/v1/chat/completions"), json={"messages": MSG, "max_tokens": 1, "temperature": 0}, timeout=30).json()
    assert m["count"] == r["usage"]["prompt_tokens"]
    txt = requests.post(server.url("/detokenize"), json={"tokens": m["tokens"]}, timeout=10).json()["prompt"]
    assert txt.startswith("<|im_start|>user\n") and txt.endswith("<|im_start|>assistant\n")


# ---- metrics, speculative decoding ----------------------------------------------

VLLM_COUNTERS = ["vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total"]
VLLM_GAUGES = ["vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"]
VLLM_HISTS = ["vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds"]


def test_metrics_names(server_spec):
    r = requests.post(server_spec.url("/v1/chat/completions"), json={"messages": MSG, "max_tokens": 24, "temperature": 0}, timeout=60)
    assert r.status_code == 200
    resp = requests.get(server_spec.url("/metrics"), timeout=10)
    assert resp.headers["content-type"].startswith("text/plain")
    txt = resp.text
    for n in VLLM_COUNTERS:
        assert f"# TYPE {n} counter" in txt, n
    for n in VLLM_GAUGES:
        assert f"# TYPE {n} gauge" in txt, n
    for n in VLLM_HISTS:
        assert f"# TYPE {n} histogram" in txt and f'{n}_bucket{{model_name="{MODEL_NAME}",le="+Inf"}}' in txt, n
    m = server_spec.metrics()
    for i in range(3):
        assert f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}' in m
    assert m["vllm:generation_tokens_total"] >= 1 and m["vllm:prompt_tokens_total"] >= 1
    assert m["vllm:e2e_request_latency_seconds_count"] >= 1
    assert m["tandem_model_loaded"] == 1 and m["tandem_spec_decode_depth"] == 3


def test_spec_counters_consistent(server_spec):
    requests.post(server_spec.url("/v1/completions"), json={"prompt": "abc", "max_tokens": 30, "temperature": 0, "ignore_eos": True},
                  timeout=60)
    m = server_spec.metrics()
    drafts = m["vllm:spec_decode_num_drafts_total"]
    per = [m[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}'] for i in range(3)]
    assert drafts > 0
    assert drafts <= m["vllm:spec_decode_num_draft_tokens_total"] <= 3 * drafts  # fewer near max_tokens
    assert m["vllm:spec_decode_num_accepted_tokens_total"] == sum(per)
    assert per[0] <= drafts and per[0] >= per[1] >= per[2]


def test_lossless_spec(server, server_spec):
    prompts = [MSG, [{"role": "user", "content": "Explain recursion."}], [{"role": "user", "content": "x" * 50}]]
    for msgs in prompts:
        a = requests.post(server.url("/v1/chat/completions"), json={"messages": msgs, "max_tokens": 40, "temperature": 0}, timeout=60).json()
        b = requests.post(server_spec.url("/v1/chat/completions"), json={"messages": msgs, "max_tokens": 40, "temperature": 0},
                          timeout=60).json()
        assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
        assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"]


# ---- cancellation, overload, shutdown ------------------------------------------------

def wait_metric(server, name, pred, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = server.metrics().get(name)
        if v is not None and pred(v):
            return v
        time.sleep(0.05)
    return server.metrics().get(name)


@pytest.mark.parametrize("stream", [True, False])
def test_cancel_on_disconnect(server, stream):
    before = server.metrics()
    body = {"messages": MSG, "max_tokens": 3500, "temperature": 0, "ignore_eos": True, "stream": stream}
    if stream:
        r = requests.post(server.url("/v1/chat/completions"), json=body, stream=True, timeout=60)
        it = r.iter_lines()
        for _ in range(4):
            next(it)
        r.close()  # drops the connection mid-generation
    else:  # no headers before the end: raw socket
        data = json.dumps(body).encode()
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(data) + data)
        assert wait_metric(server, "vllm:num_requests_running", lambda v: v >= 1, 10) >= 1
        sock.close()
    assert wait_metric(server, "vllm:num_requests_running", lambda v: v == 0, 10) == 0
    after = server.metrics()
    assert after["tandem_requests_cancelled_total"] == before["tandem_requests_cancelled_total"] + 1
    assert after['vllm:request_success_total{finished_reason="abort"}'] == before['vllm:request_success_total{finished_reason="abort"}'] + 1
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 3500


def test_queue_full(make_server):
    s = make_server("--max-num-seqs", "1", "--max-queue", "1", "--quiet")
    body = {"messages": MSG, "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    results = []

    def one():
        r = requests.post(s.url("/v1/chat/completions"), json=body, timeout=120)
        results.append((r.status_code, r.headers.get("Retry-After"), r.text))

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join(150)
    codes = sorted(c for c, _, _ in results)
    assert len(results) == 6
    assert 200 in codes and 503 in codes, codes
    for code, retry, text in results:
        if code == 503:
            assert retry is not None and int(retry) >= 1
            assert json.loads(text)["error"]["message"]
    m = s.metrics()
    assert m["tandem_requests_rejected_total"] == codes.count(503)


def test_sigterm_exits_cleanly(make_server):
    s = make_server("--quiet")
    r = requests.post(s.url("/v1/completions"), json={"prompt": "abc", "max_tokens": 3, "temperature": 0}, timeout=30)
    assert r.status_code == 200
    assert s.stop() == 0


def test_concurrent_greedy_identical(server):
    """Greedy output does not depend on how many requests share the batch."""
    prompts = [f"Item {i}: " + "abc def " * (i + 1) for i in range(8)]

    def run(p):
        r = requests.post(server.url("/v1/completions"), json={"prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True},
                          timeout=120)
        return r.json()["choices"][0]["text"]

    alone = [run(p) for p in prompts]
    together = [None] * len(prompts)

    def worker(i):
        together[i] = run(prompts[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    assert together == alone


def test_keepalive_while_queued(make_server):
    """A stream waiting behind other requests gets empty deltas (every 2 s).
    Three 3500-token streams go ahead of it (one running, two waiting), so it
    waits for about 10,000 tokens: several seconds even where the demo model
    decodes thousands of tokens a second (one long stream alone finished in
    under 2 s on a fast build, and the test could not see a keep-alive)."""
    s = make_server("--max-num-seqs", "1", "--quiet")
    long_body = {"messages": MSG, "max_tokens": 3500, "temperature": 0, "ignore_eos": True, "stream": True}
    ahead = []
    for _ in range(3):
        r = requests.post(s.url("/v1/chat/completions"), json=long_body, stream=True, timeout=60)
        it = r.iter_lines()  # keep a reference: a collected iterator closes the connection
        ahead.append((r, it))
    next(ahead[0][1])
    t0 = time.time()
    second = requests.post(s.url("/v1/chat/completions"), json=dict(long_body, max_tokens=4), stream=True, timeout=60)
    got_keepalive = False
    for line in second.iter_lines():
        if line.startswith(b"data: {"):
            d = json.loads(line[6:])["choices"][0]
            if d["delta"] == {} and d["finish_reason"] is None:
                got_keepalive = True
                break
        if time.time() - t0 > 8:
            break
    waited = time.time() - t0
    for r, _ in ahead:
        r.close()
    second.close()
    assert got_keepalive, f"no keep-alive delta after {waited:.1f} s in the queue"


# ---- reasoning split end to end (template opens <think>) -----------------------------

TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]


@pytest.mark.parametrize("thinking", [True, False])
def test_reasoning_split(server_think, thinking):
    from openai import OpenAI
    c = OpenAI(base_url=server_think.url("/v1"), api_key="x", max_retries=0)
    kw = dict(model="think", messages=MSG, temperature=0, max_tokens=20, tools=TOOLS,
              extra_body={"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": thinking}})
    r = c.chat.completions.create(**kw)
    msg = r.model_dump()["choices"][0]["message"]
    chunks = [ch.model_dump() for ch in c.chat.completions.create(stream=True, **kw)]
    deltas = [ch["choices"][0]["delta"] for ch in chunks if ch["choices"]]
    s_reason = "".join(d.get("reasoning_content") or "" for d in deltas)
    s_content = "".join(d.get("content") or "" for d in deltas)
    if thinking:
        # The random model never closes </think>: everything is reasoning.
        assert msg.get("reasoning_content") and not msg["content"]
        assert s_reason == msg["reasoning_content"] and s_content == ""
    else:
        assert not msg.get("reasoning_content") and msg["content"]
        assert s_content == msg["content"] and s_reason == ""
    assert r.choices[0].finish_reason == "length"
    # the template saw the tools and the kwarg
    t = requests.post(server_think.url("/tokenize"), json={"messages": MSG, "tools": TOOLS,
                                                            "chat_template_kwargs": {"enable_thinking": thinking}}).json()
    text = requests.post(server_think.url("/detokenize"), json={"tokens": t["tokens"]}).json()["prompt"]
    assert "Tools: run" in text
    assert text.endswith("<think>\n") == thinking
    assert r.usage.prompt_tokens == t["count"]

"""OpenAI / vLLM compatibility details (issue 17, part 4), end to end with the openai SDK
and raw HTTP: n > 1, list prompts, logit_bias, parallel_tool_calls, continue_final_message,
CORS, the reasoning field's name, the invalid tool-arguments fallback, vLLM's request
histograms, streamed chat logprobs."""
import json

import pytest
import requests

from conftest import MODEL_NAME

MSG = [{"role": "user", "content": "Write a function that adds two numbers."}]


def post(server, path, **body):
    body.setdefault("model", MODEL_NAME)
    return requests.post(server.url(path), json=body, timeout=120)


def sse(resp):
    raw = resp.content.decode("utf-8")
    assert raw.endswith("data: [DONE]\n\n"), raw[-300:]
    evs = [e[len("data: "):] for e in raw.split("\n\n")[:-1]]
    assert all(evs) and evs[-1] == "[DONE]"
    return [json.loads(e) for e in evs[:-1]]


def metric(server, name):
    return server.metrics().get(name, 0.0)


# ---- n > 1 ---------------------------------------------------------------------

def test_n_greedy_identical_chat(server, client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=MSG, temperature=0, max_tokens=12, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    one = client.chat.completions.create(model=MODEL_NAME, messages=MSG, temperature=0, max_tokens=12)
    assert all(c.message.content == one.choices[0].message.content for c in r.choices)
    # the prompt counts once, the completions add up
    assert r.usage.prompt_tokens == one.usage.prompt_tokens
    assert r.usage.completion_tokens == 3 * one.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_n_sampled_seeds(server):
    # depth fixed at 0: under --spec-depth auto the depth of each step (and so the draws a seed
    # yields) depends on the machine's timing
    body = dict(prompt="one two three four", max_tokens=16, temperature=1.5, seed=7, n=4, ignore_eos=True, num_speculative_tokens=0)
    a = post(server, "/v1/completions", **body)
    assert a.status_code == 200, a.text
    texts = [c["text"] for c in sorted(a.json()["choices"], key=lambda c: c["index"])]
    assert [c["index"] for c in a.json()["choices"]] == [0, 1, 2, 3]
    assert len(set(texts)) > 1, texts  # each sample its own seed
    b = post(server, "/v1/completions", **body)
    assert [c["text"] for c in b.json()["choices"]] == texts  # seed + index: reproducible
    # sample j is the single request with seed + j
    for j in (0, 2):
        single = post(server, "/v1/completions", **dict(body, n=1, seed=7 + j))
        assert single.json()["choices"][0]["text"] == texts[j]


def test_n_shares_the_prompt_prefix(make_server):
    # a long fresh prompt: samples 1..n-1 start after sample 0's prefill and find it cached. Depth 0
    # fixed: under --spec-depth auto a request that tracks MTP needs a checkpoint with MTP state,
    # which a depth-0 sample 0 does not leave
    server = make_server("--spec-depth", "0")
    prompt = " ".join(f"w{i}" for i in range(300)) + " unique-n-prefix"
    hits0 = metric(server, "vllm:prefix_cache_hits_total")
    r = post(server, "/v1/completions", prompt=prompt, max_tokens=4, temperature=0, n=4, ignore_eos=True)
    assert r.status_code == 200, r.text
    n_prompt = r.json()["usage"]["prompt_tokens"]
    assert n_prompt > 200
    hits = metric(server, "vllm:prefix_cache_hits_total") - hits0
    assert hits >= 3 * (n_prompt - 1 - 16), (hits, n_prompt)
    assert r.json()["usage"]["completion_tokens"] == 16


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_n_stream(server, kind):
    if kind == "chat":
        body = dict(messages=MSG, max_tokens=10, temperature=0, n=3, stream=True, stream_options={"include_usage": True})
        r = post(server, "/v1/chat/completions", **body)
        ref = post(server, "/v1/chat/completions", **dict(body, stream=False)).json()
    else:
        body = dict(prompt="one two three", max_tokens=10, temperature=0, n=3, stream=True, stream_options={"include_usage": True})
        r = post(server, "/v1/completions", **body)
        ref = post(server, "/v1/completions", **dict(body, stream=False)).json()
    assert r.status_code == 200, r.text
    chunks = sse(r)
    assert len({c["id"] for c in chunks}) == 1
    text, finishes, roles = {}, {}, {}
    for c in chunks[:-1]:
        assert len(c["choices"]) == 1
        ch = c["choices"][0]
        i = ch["index"]
        if kind == "chat":
            if ch["delta"].get("role"):
                roles[i] = True
            text[i] = text.get(i, "") + (ch["delta"].get("content") or "")
        else:
            text[i] = text.get(i, "") + ch["text"]
        if ch["finish_reason"]:
            assert i not in finishes
            finishes[i] = ch["finish_reason"]
    assert sorted(finishes) == [0, 1, 2]
    if kind == "chat":
        assert sorted(roles) == [0, 1, 2]
    usage = chunks[-1]
    assert usage["choices"] == []
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):  # cached_tokens differ: the second run hits the cache
        assert usage["usage"][k] == ref["usage"][k]
    for ch in ref["choices"]:
        want = ch["message"]["content"] if kind == "chat" else ch["text"]
        assert text[ch["index"]] == want


def test_n_sdk_stream(client):
    chunks = list(client.completions.create(model=MODEL_NAME, prompt="one two", max_tokens=6, temperature=0, n=2, stream=True))
    assert {c.choices[0].index for c in chunks} == {0, 1}


def test_n_bounds(server):
    for n in (0, 17, "2"):
        r = post(server, "/v1/chat/completions", messages=MSG, n=n, max_tokens=2)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "n"
    # more choices than the scheduler's slots and queue could ever hold
    r = post(server, "/v1/completions", prompt=["a b"] * 10, n=16, max_tokens=2)
    assert r.status_code == 400 and "limit" in r.json()["error"]["message"], r.text


# ---- list prompts ------------------------------------------------------------------

def test_list_prompts(server, client):
    prompts = ["one two three", "hello world", "the cat sat"]
    singles = [post(server, "/v1/completions", prompt=p, max_tokens=8, temperature=0).json() for p in prompts]
    r = client.completions.create(model=MODEL_NAME, prompt=prompts, max_tokens=8, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [s["choices"][0]["text"] for s in singles]
    assert r.usage.prompt_tokens == sum(s["usage"]["prompt_tokens"] for s in singles)
    assert r.usage.completion_tokens == sum(s["usage"]["completion_tokens"] for s in singles)
    # with n: prompt i, sample j -> index i * n + j
    r2 = post(server, "/v1/completions", prompt=prompts[:2], max_tokens=8, temperature=0, n=2).json()
    by = {c["index"]: c["text"] for c in r2["choices"]}
    assert by == {0: singles[0]["choices"][0]["text"], 1: singles[0]["choices"][0]["text"],
                  2: singles[1]["choices"][0]["text"], 3: singles[1]["choices"][0]["text"]}
    assert r2["usage"]["prompt_tokens"] == singles[0]["usage"]["prompt_tokens"] + singles[1]["usage"]["prompt_tokens"]


def test_list_token_prompts(server):
    tok = [requests.post(server.url("/tokenize"), json={"prompt": p}, timeout=10).json()["tokens"] for p in ("one two", "red green blue")]
    r = post(server, "/v1/completions", prompt=tok, max_tokens=6, temperature=0, echo=False)
    assert r.status_code == 200, r.text
    single = [post(server, "/v1/completions", prompt=t, max_tokens=6, temperature=0).json()["choices"][0]["text"] for t in tok]
    assert [c["text"] for c in r.json()["choices"]] == single
    # a single token list is one prompt, as before
    assert len(post(server, "/v1/completions", prompt=tok[0], max_tokens=2).json()["choices"]) == 1
    # streamed, with echo of string prompts
    s = post(server, "/v1/completions", prompt=["one two", "three"], max_tokens=3, temperature=0, echo=True, stream=True)
    chunks = sse(s)
    text = {}
    for c in chunks:
        for ch in c["choices"]:
            text[ch["index"]] = text.get(ch["index"], "") + ch["text"]
    assert text[0].startswith("one two") and text[1].startswith("three")


def test_list_prompt_errors(server):
    for bad in (["a", [1, 2]], [[1], []], [[1, 10**9]], [], ["a", ""], [["x"]]):
        r = post(server, "/v1/completions", prompt=bad, max_tokens=2)
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["param"] == "prompt"
    long = "word " * 5000
    r = post(server, "/v1/completions", prompt=["short", long], max_tokens=2)
    assert r.status_code == 400 and r.json()["error"]["type"] == "exceed_context_size_error", r.text


# ---- logit_bias -------------------------------------------------------------------

def tokens_of(server, text):
    return requests.post(server.url("/tokenize"), json={"prompt": text, "add_special_tokens": False}, timeout=10).json()["tokens"]


def test_logit_bias_changes_greedy(server):
    base = post(server, "/v1/completions", prompt="one two three", max_tokens=8, temperature=0, ignore_eos=True, logprobs=0).json()
    first = tokens_of(server, base["choices"][0]["text"])
    # ban the first greedy token: the first token changes
    r = post(server, "/v1/completions", prompt="one two three", max_tokens=8, temperature=0, ignore_eos=True,
             logit_bias={str(first[0]): -100}, return_tokens_as_token_ids=True, logprobs=0).json()
    got = [int(t.split(":")[1]) for t in r["choices"][0]["logprobs"]["tokens"]]
    assert first[0] not in got
    # force one token: every position picks it
    r = post(server, "/v1/completions", prompt="one two three", max_tokens=5, temperature=0, ignore_eos=True,
             logit_bias={"42": 100}, return_tokens_as_token_ids=True, logprobs=0).json()
    assert [t for t in r["choices"][0]["logprobs"]["tokens"]] == ["token_id:42"] * 5
    # sampled: a +100 bias dominates any temperature
    r = post(server, "/v1/chat/completions", messages=MSG, max_tokens=4, temperature=1.0, seed=3, logit_bias={"42": 100},
             logprobs=True, return_tokens_as_token_ids=True).json()
    assert [e["token"] for e in r["choices"][0]["logprobs"]["content"]] == ["token_id:42"] * 4


def test_logit_bias_lossless_with_mtp(server_spec):
    """Greedy output under a bias that changes it is the same at depth 0 and 2."""
    body = dict(prompt="one two three four", max_tokens=24, temperature=0, ignore_eos=True)
    plain = post(server_spec, "/v1/completions", **body, num_speculative_tokens=0).json()["choices"][0]["text"]
    toks = tokens_of(server_spec, plain)
    bias = {str(t): -100 for t in toks[:3]}
    bias[str(toks[5] if len(toks) > 5 else 7)] = 5.0
    outs = {}
    for d in (0, 2, 3):
        r = post(server_spec, "/v1/completions", **body, num_speculative_tokens=d, logit_bias=bias)
        assert r.status_code == 200, r.text
        outs[d] = r.json()["choices"][0]["text"]
    assert outs[0] != plain
    assert outs[2] == outs[0] and outs[3] == outs[0]


def test_logit_bias_drafts_proposed_under_it(server_spec):
    """MTP drafts are chosen with the bias too: a forced token is drafted and accepted."""
    def counters():
        m = server_spec.metrics()
        return m["vllm:spec_decode_num_draft_tokens_total"], m["vllm:spec_decode_num_accepted_tokens_total"]
    d0, a0 = counters()
    r = post(server_spec, "/v1/completions", prompt="one two three", max_tokens=24, temperature=0, ignore_eos=True,
             logit_bias={"42": 100}, num_speculative_tokens=3, return_tokens_as_token_ids=True, logprobs=0)
    assert r.json()["choices"][0]["logprobs"]["tokens"] == ["token_id:42"] * 24
    d1, a1 = counters()
    assert d1 > d0 and (a1 - a0) / (d1 - d0) > 0.9, (d1 - d0, a1 - a0)


def test_logit_bias_errors(server):
    for bad in ([1], {"x": 1}, {"1": 101}, {"-1": 1}, {"99999999": 1}, {"1": "a"}):
        r = post(server, "/v1/chat/completions", messages=MSG, max_tokens=2, logit_bias=bad)
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["param"] == "logit_bias"


# ---- vLLM's request histograms -----------------------------------------------------

LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
                   960.0, 1920.0, 7680.0]
ITERATION_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]


def parse_hist(text, name):
    """buckets [(le, cumulative)], sum, count of one histogram; every sample carries model_name."""
    buckets, total, count = [], None, None
    for line in text.splitlines():
        if not line.startswith(name + "_"):
            continue
        key, val = line.rsplit(" ", 1)
        assert f'model_name="{MODEL_NAME}"' in key, line
        if key.startswith(name + "_bucket{"):
            le = key.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(val)))
        elif key.startswith(name + "_sum{"):
            total = float(val)
        elif key.startswith(name + "_count{"):
            count = float(val)
    assert buckets and total is not None and count is not None, name
    cums = [c for _, c in buckets]
    assert cums == sorted(cums) and buckets[-1][0] == float("inf") and buckets[-1][1] == count
    assert "# TYPE " + name + " histogram" in text
    return buckets, total, count


def test_vllm_request_histograms(make_server):
    s = make_server()
    usages = []
    for i, n in enumerate((5, 7, 9)):
        r = post(s, "/v1/completions", prompt=f"metrics prompt number {i} " * (i + 1), max_tokens=n, temperature=0, ignore_eos=True)
        assert r.status_code == 200, r.text
        usages.append(r.json()["usage"])
    text = requests.get(s.url("/metrics"), timeout=10).text
    for name in ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                 "vllm:request_inference_time_seconds"):
        b, total, count = parse_hist(text, name)
        assert [le for le, _ in b[:-1]] == LATENCY_BUCKETS, name
        assert count == 3 and total >= 0
    _, inf_sum, _ = parse_hist(text, "vllm:request_inference_time_seconds")
    _, pre_sum, _ = parse_hist(text, "vllm:request_prefill_time_seconds")
    _, dec_sum, _ = parse_hist(text, "vllm:request_decode_time_seconds")
    assert abs(inf_sum - pre_sum - dec_sum) < 1e-6
    _, e2e_sum, _ = parse_hist(text, "vllm:e2e_request_latency_seconds")
    _, q_sum, _ = parse_hist(text, "vllm:request_queue_time_seconds")
    assert q_sum + inf_sum <= e2e_sum + 1e-6
    b, total, count = parse_hist(text, "vllm:request_prompt_tokens")
    assert count == 3 and total == sum(u["prompt_tokens"] for u in usages)
    les = [le for le, _ in b[:-1]]
    assert les[:7] == [1, 2, 5, 10, 20, 50, 100] and les[-1] <= 4096 < les[-1] * 2.5  # 1-2-5 up to max_model_len
    b, total, count = parse_hist(text, "vllm:request_generation_tokens")
    assert count == 3 and total == 5 + 7 + 9
    assert dict(b)[5.0] == 1 and dict(b)[10.0] == 3
    b, total, count = parse_hist(text, "vllm:iteration_tokens_total")
    assert [le for le, _ in b[:-1]] == ITERATION_BUCKETS
    prefilled = sum(u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert total == prefilled + 21, (total, prefilled)
    assert count >= 21  # at least one step per generated token (no drafts)
    m = s.metrics()
    assert m["vllm:prompt_tokens_cached_total"] == sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert "# TYPE vllm:prompt_tokens_cached_total counter" in text


# ---- CORS --------------------------------------------------------------------------

def test_cors_off_by_default(server):
    r = requests.options(server.url("/v1/chat/completions"), headers={"Origin": "http://a.example", "Access-Control-Request-Method": "POST"},
                         timeout=10)
    assert r.status_code == 405 and not any(k.lower().startswith("access-control") for k in r.headers)
    r = requests.get(server.url("/v1/models"), headers={"Origin": "http://a.example"}, timeout=10)
    assert "access-control-allow-origin" not in {k.lower() for k in r.headers}


def test_cors_allowed_origins(make_server):
    s = make_server("--allowed-origins", '["http://a.example", "http://b.example"]', "--allowed-methods", "GET,POST,OPTIONS",
                    "--allowed-headers", "content-type, authorization", "--allow-credentials", "--api-key", "k")
    pre = {"Origin": "http://a.example", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Content-Type, Authorization"}
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/nowhere"):
        r = requests.options(s.url(path), headers=pre, timeout=10)  # no API key: preflights carry none
        assert r.status_code in (200, 204), (path, r.status_code, r.text)
        h = r.headers
        assert h["Access-Control-Allow-Origin"] == "http://a.example" and h["Access-Control-Allow-Credentials"] == "true"
        assert "POST" in h["Access-Control-Allow-Methods"] and "authorization" in h["Access-Control-Allow-Headers"].lower()
        assert "Origin" in h.get("Vary", "")
    bad = requests.options(s.url("/v1/models"), headers=dict(pre, Origin="http://evil.example"), timeout=10)
    assert bad.status_code == 400 and "access-control-allow-origin" not in {k.lower() for k in bad.headers}
    assert requests.options(s.url("/v1/models"), headers=dict(pre, **{"Access-Control-Request-Method": "DELETE"}), timeout=10).status_code == 400
    assert requests.options(s.url("/v1/models"), headers=dict(pre, **{"Access-Control-Request-Headers": "x-other"}), timeout=10).status_code == 400
    auth = {"Authorization": "Bearer k", "Origin": "http://b.example"}
    # every response for an allowed Origin: JSON, errors, streams
    r = requests.get(s.url("/v1/models"), headers=auth, timeout=10)
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "http://b.example"
    r = requests.get(s.url("/v1/models"), headers={"Origin": "http://b.example"}, timeout=10)
    assert r.status_code == 401 and r.headers["Access-Control-Allow-Origin"] == "http://b.example"
    r = requests.post(s.url("/v1/chat/completions"), headers=auth, json={"messages": MSG, "max_tokens": 3, "stream": True}, timeout=60)
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "http://b.example"
    sse(r)
    r = requests.get(s.url("/v1/models"), headers={"Authorization": "Bearer k", "Origin": "http://c.example"}, timeout=10)
    assert "access-control-allow-origin" not in {k.lower() for k in r.headers}


def test_cors_any_origin(make_server):
    s = make_server("--allowed-origins", "*")
    r = requests.options(s.url("/v1/chat/completions"), headers={"Origin": "http://x.example", "Access-Control-Request-Method": "POST",
                                                                 "Access-Control-Request-Headers": "content-type"}, timeout=10)
    assert r.status_code in (200, 204)
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    assert r.headers["Access-Control-Allow-Headers"].lower() == "content-type"  # "*" echoes what was asked
    assert "Access-Control-Allow-Credentials" not in r.headers
    r = post(s, "/v1/completions", prompt="a", max_tokens=2)
    assert "Access-Control-Allow-Origin" not in r.headers  # no Origin, no CORS headers
    r = requests.post(s.url("/v1/completions"), json={"prompt": "a", "max_tokens": 2}, headers={"Origin": "http://y.example"}, timeout=60)
    assert r.headers["Access-Control-Allow-Origin"] == "*"


def test_cors_flag_errors():
    import subprocess
    from conftest import BIN
    for args in (["--allowed-origins", "[1]"], ["--allowed-origins", "[\"a\""], ["--reasoning-field", "thoughts"]):
        p = subprocess.run([BIN, "serve", "--port", "0"] + args, capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and args[0] in p.stderr, (args, p.stderr)
    h = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True, timeout=30).stdout
    for flag in ("--allowed-origins", "--allowed-methods", "--allowed-headers", "--allow-credentials", "--reasoning-field"):
        assert flag in h


# ---- reasoning field names ---------------------------------------------------------

@pytest.mark.parametrize("field", ["both", "reasoning", "reasoning_content"])
def test_reasoning_field(make_server, field):
    from conftest import THINK_TEMPLATE  # the generation prompt opens <think>: output starts as reasoning
    import os, tempfile
    from conftest import MODEL
    d = tempfile.mkdtemp()
    for f in os.listdir(MODEL):
        if f != "tokenizer_config.json":
            os.symlink(os.path.join(MODEL, f), os.path.join(d, f))
    cfg = json.load(open(os.path.join(MODEL, "tokenizer_config.json")))
    cfg["chat_template"] = THINK_TEMPLATE
    json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w"))
    s = make_server("-m", d, "--served-model-name", MODEL_NAME, "--reasoning-field", field)
    body = dict(messages=MSG, max_tokens=8, temperature=0, ignore_eos=True)
    m = post(s, "/v1/chat/completions", **body).json()["choices"][0]["message"]
    want = {"both": {"reasoning", "reasoning_content"}, "reasoning": {"reasoning"}, "reasoning_content": {"reasoning_content"}}[field]
    assert {k for k in ("reasoning", "reasoning_content") if m.get(k)} == want, m
    text = m.get("reasoning") or m.get("reasoning_content")
    chunks = sse(post(s, "/v1/chat/completions", **body, stream=True))
    for k in ("reasoning", "reasoning_content"):
        got = "".join(c["choices"][0]["delta"].get(k) or "" for c in chunks if c["choices"])
        assert got == (text if k in want else ""), (k, got)


def test_reasoning_accepted_on_input(server):
    """An assistant message's reasoning (vLLM's name) reaches the template as reasoning_content."""
    tpl_msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok", "reasoning": "R1"}, {"role": "user", "content": "more"}]
    a = requests.post(server.url("/tokenize"), json={"messages": tpl_msgs}, timeout=10).json()
    alt = [dict(m) for m in tpl_msgs]
    alt[1] = {"role": "assistant", "content": "ok", "reasoning_content": "R1"}
    b = requests.post(server.url("/tokenize"), json={"messages": alt}, timeout=10).json()
    assert a["tokens"] == b["tokens"]
    r = post(server, "/v1/chat/completions", messages=tpl_msgs, max_tokens=2)
    assert r.status_code == 200, r.text
    bad = post(server, "/v1/chat/completions", messages=[tpl_msgs[0], dict(tpl_msgs[1], reasoning=5)], max_tokens=2)
    assert bad.status_code == 400


# ---- continue_final_message ------------------------------------------------------------

def test_continue_final_message(server):
    msgs = MSG + [{"role": "assistant", "content": "def add(a, b):"}]
    body = dict(messages=msgs, continue_final_message=True, add_generation_prompt=False)
    t = requests.post(server.url("/tokenize"), json=body, timeout=10).json()
    text = requests.post(server.url("/detokenize"), json={"tokens": t["tokens"]}, timeout=10).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\ndef add(a, b):"), text[-80:]  # not closed with <|im_end|>
    closed = requests.post(server.url("/tokenize"), json=dict(messages=msgs, add_generation_prompt=False), timeout=10).json()
    assert closed["count"] > t["count"]
    r = post(server, "/v1/chat/completions", **body, max_tokens=6, temperature=0, ignore_eos=True)
    assert r.status_code == 200, r.text
    u = r.json()["usage"]
    assert u["prompt_tokens"] == t["count"]
    # the same as a completion of that exact prompt
    c = post(server, "/v1/completions", prompt=t["tokens"], max_tokens=6, temperature=0, ignore_eos=True).json()
    assert r.json()["choices"][0]["message"]["content"] == c["choices"][0]["text"]
    for bad in (dict(messages=msgs, continue_final_message=True),  # add_generation_prompt defaults to true
                dict(messages=msgs, continue_final_message=True, add_generation_prompt=True),
                dict(messages=MSG, continue_final_message=True, add_generation_prompt=False)):
        r = post(server, "/v1/chat/completions", **bad, max_tokens=2)
        assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message", r.text


# ---- invalid tool-call arguments: plain content, as vLLM's parsers fall back --------------

WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                            "required": ["city"]}}}]


@pytest.fixture(scope="module")
def demo(request):
    """models/demo: trained on hermes tool calls (it answers the weather question with one)."""
    from conftest import Server
    s = Server("-m", "models/demo", "--served-model-name", MODEL_NAME, "--quiet")
    yield s
    s.stop()
    s.check_clean_exit()


def weather(server, **kw):
    body = dict(messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=WEATHER, temperature=0, max_tokens=64)
    body.update(kw)
    return post(server, "/v1/chat/completions", **body)


def test_tool_call_valid_streamed_held(demo):
    from openai import OpenAI
    ref = weather(demo).json()["choices"][0]
    assert ref["finish_reason"] == "tool_calls", ref
    call = ref["message"]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    client = OpenAI(base_url=demo.url("/v1"), api_key="x", max_retries=0)
    stream = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                                            tools=WEATHER, temperature=0, max_tokens=64, stream=True)
    name, args, finish = None, "", None
    for c in stream:
        for tc in c.choices[0].delta.tool_calls or []:
            name = tc.function.name or name
            args += tc.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    assert (name, args, finish) == ("get_weather", call["function"]["arguments"], "tool_calls")


def test_tool_call_invalid_arguments_become_content(demo):
    # a stop string cuts the call inside its arguments: {"city": " is no JSON
    r = weather(demo, stop=["Paris"]).json()["choices"][0]
    assert r["finish_reason"] == "stop" and not r["message"].get("tool_calls"), r
    content = r["message"]["content"]
    assert content.startswith("<tool_call>") and '"arguments": {"city": "' in content, content
    chunks = sse(weather(demo, stop=["Paris"], stream=True))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert not any(c["choices"][0]["delta"].get("tool_calls") for c in chunks if c["choices"])
    assert text == content
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]] == ["stop"]
    # cut by max_tokens: the same fallback, finish "length"
    r = weather(demo, max_tokens=16).json()["choices"][0]
    assert r["finish_reason"] == "length" and not r["message"].get("tool_calls") and r["message"]["content"].startswith("<tool_call>")


def test_parallel_tool_calls_false_accepted(demo):
    r = weather(demo, parallel_tool_calls=False).json()["choices"][0]
    assert r["finish_reason"] == "tool_calls" and len(r["message"]["tool_calls"]) == 1
    assert weather(demo, parallel_tool_calls="no").status_code == 400


# ---- streamed chat logprobs ------------------------------------------------------------

def test_stream_chat_logprobs_equal_nonstream(server, client):
    kw = dict(model=MODEL_NAME, messages=MSG, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    ref = client.chat.completions.create(**kw).choices[0].logprobs.content
    got = []
    for c in client.chat.completions.create(**kw, stream=True):
        if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content:
            got += c.choices[0].logprobs.content
    assert len(got) == len(ref) == 6
    for a, b in zip(got, ref):
        assert (a.token, a.bytes) == (b.token, b.bytes) and a.logprob == pytest.approx(b.logprob, abs=1e-6)
        assert [(t.token, round(t.logprob, 5)) for t in a.top_logprobs] == [(t.token, round(t.logprob, 5)) for t in b.top_logprobs]
    # n > 1: each choice its own entries
    chunks = sse(post(server, "/v1/chat/completions", messages=MSG, max_tokens=4, temperature=0, logprobs=True, n=2, stream=True))
    per = {}
    for c in chunks:
        for ch in c["choices"]:
            if ch.get("logprobs"):
                per.setdefault(ch["index"], []).extend(e["token"] for e in ch["logprobs"]["content"])
    assert per[0] == per[1] == [e.token for e in ref[:4]]


# ---- n > 1 under cancellation ---------------------------------------------------------

@pytest.mark.parametrize("stream", [True, False])
def test_n_cancel_on_disconnect(make_server, stream):
    import socket
    import time
    s = make_server()
    before = s.metrics()
    body = json.dumps({"model": MODEL_NAME, "prompt": "one two three", "max_tokens": 3000, "ignore_eos": True, "n": 4,
                       "stream": stream}).encode()
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    deadline = time.time() + 30
    while time.time() < deadline and s.metrics()["vllm:num_requests_running"] < 4:
        time.sleep(0.05)
    assert s.metrics()["vllm:num_requests_running"] == 4  # every choice runs
    sock.close()
    abort = 'vllm:request_success_total{finished_reason="abort"}'
    while time.time() < deadline and (s.metrics()["vllm:num_requests_running"] > 0 or s.metrics()[abort] - before.get(abort, 0) < 4):
        time.sleep(0.05)  # the running gauge drops before each on_done has counted its finish
    after = s.metrics()
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 4 * 3000
    assert after[abort] - before.get(abort, 0) == 4
    r = post(s, "/v1/completions", prompt="a", max_tokens=2, n=2)  # still serving
    assert r.status_code == 200 and len(r.json()["choices"]) == 2


def test_n_follower_refused_when_full(make_server):
    """Samples 1..n-1 join the queue at sample 0's first token; a queue full by then is a 503
    for the request (non-streamed) or that choice's error event (streamed)."""
    import threading
    s = make_server("--max-num-seqs", "2", "--max-queue", "0", "--spec-depth", "0")
    hog = threading.Thread(target=lambda: post(s, "/v1/completions", prompt="hog", max_tokens=3000, ignore_eos=True))
    hog.start()
    import time
    deadline = time.time() + 20
    while time.time() < deadline and s.metrics()["vllm:num_requests_running"] < 1:
        time.sleep(0.02)
    try:
        r = post(s, "/v1/completions", prompt="one two", max_tokens=4, n=2, ignore_eos=True)
        assert r.status_code == 503 and "busy" in r.json()["error"]["message"], r.text
        chunks = sse(post(s, "/v1/completions", prompt="one two", max_tokens=4, n=2, ignore_eos=True, stream=True))
        assert any("error" in c for c in chunks)
        assert any(c.get("choices") and c["choices"][0]["index"] == 0 and c["choices"][0]["finish_reason"] for c in chunks)
        assert post(s, "/v1/completions", prompt="one two", max_tokens=4, n=3).status_code == 400  # over 2 + 0: never fits
    finally:
        hog.join()
    r = post(s, "/v1/completions", prompt="one two", max_tokens=4, n=2, ignore_eos=True)
    assert r.status_code == 200 and len(r.json()["choices"]) == 2

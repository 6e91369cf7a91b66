"""Per-request MTP depth (tandem extension `num_speculative_tokens`, at most the server's
--spec-depth): greedy output is the same at every depth (lossless), a depth above the
server's is a 400, and the drafts counted follow the request's depth."""
import requests


def complete(server, **kw):
    body = {"model": "f32", "prompt": "one two three", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    body.update(kw)
    return requests.post(server.url("/v1/completions"), json=body, timeout=60)


def drafts(server):
    for line in requests.get(server.url("/metrics"), timeout=10).text.splitlines():
        if line.startswith("vllm:spec_decode_num_draft_tokens_total"):
            return float(line.split()[-1])
    return 0.0


def test_request_depth_is_lossless(server_spec):
    base = complete(server_spec)
    assert base.status_code == 200, base.text
    for d in (0, 1, 2, 3):
        before = drafts(server_spec)
        r = complete(server_spec, num_speculative_tokens=d)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == base.json()["choices"][0]["text"], d
        proposed = drafts(server_spec) - before
        if d == 0:
            assert proposed == 0
        else:
            assert 0 < proposed <= d * 24
    bad = complete(server_spec, num_speculative_tokens=4)
    assert bad.status_code == 400 and "num_speculative_tokens" in bad.text


def test_auto_depth_metrics(make_server):
    """--spec-depth auto (issue 18): greedy output equals depth 0, /metrics has the chosen-depth
    histogram (buckets 0..max) counting every decode step, the auto gauge, and the steps that
    kept MTP tracking."""
    s = make_server("--spec-depth", "auto", "--spec-depth-max", "3")
    m0 = s.metrics()
    assert m0["tandem_spec_decode_auto"] == 1 and m0["tandem_spec_decode_depth"] == 3
    base = complete(s, num_speculative_tokens=0)
    auto = complete(s)
    assert auto.status_code == 200 and auto.json()["choices"][0]["text"] == base.json()["choices"][0]["text"]
    m = s.metrics()
    buckets = [m[f'tandem_spec_chosen_depth_bucket{{le="{k}"}}'] for k in range(4)]
    assert buckets == sorted(buckets) and m['tandem_spec_chosen_depth_bucket{le="+Inf"}'] == buckets[-1]
    assert m["tandem_spec_chosen_depth_count"] == buckets[-1] >= 23  # 24 tokens: at least one step per draft round
    assert buckets[0] >= 23  # the depth-0 request's steps
    # exploration bursts are part of the histogram's steps, never more than them
    assert 0 <= m["tandem_spec_explored_steps_total"] <= m["tandem_spec_chosen_depth_count"]
    # tracked steps: none for the depth-0 request, at most every step; a fixed depth-2 request
    # tracks at every one of its decode steps
    assert 0 <= m["tandem_spec_tracked_steps_total"] <= m["tandem_spec_chosen_depth_count"] - 23
    fixed = complete(s, num_speculative_tokens=2)
    assert fixed.status_code == 200 and fixed.json()["choices"][0]["text"] == base.json()["choices"][0]["text"]
    m2 = s.metrics()
    steps = m2["tandem_spec_chosen_depth_count"] - m["tandem_spec_chosen_depth_count"]
    assert steps >= 8 and m2["tandem_spec_tracked_steps_total"] - m["tandem_spec_tracked_steps_total"] == steps

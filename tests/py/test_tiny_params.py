"""Sampling parameters at the edge of the float range (issue 16): a temperature below vLLM's
1e-5 is greedy (before: 1e-39 overflowed 1/T and always returned the last token id), and a
top_p that rounds to 0 as a float keeps the top token instead of failing with a 500 that
carried a source path (inside a 200 stream when streaming)."""
import json

import requests


def complete(server, **kw):
    body = {"model": "f32", "prompt": "hello there", "max_tokens": 12, "ignore_eos": True}
    body.update(kw)
    return requests.post(server.url("/v1/completions"), json=body, timeout=60)


def test_tiny_temperature_is_greedy(server):
    greedy = complete(server, temperature=0)
    assert greedy.status_code == 200, greedy.text
    for t in (1e-39, 1e-20, 9e-6):
        r = complete(server, temperature=t, seed=3)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"], t


def test_tiny_top_p(server):
    greedy = complete(server, temperature=0)
    r = complete(server, temperature=1.0, top_p=1e-300, seed=5)
    assert r.status_code == 200, r.text
    # keeping the smallest prefix that reaches top_p keeps only the top token: greedy
    assert r.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
    s = requests.post(server.url("/v1/completions"), json={"model": "f32", "prompt": "hello there", "max_tokens": 6,
                                                            "temperature": 1.0, "top_p": 1e-300, "stream": True},
                      timeout=60, stream=True)
    assert s.status_code == 200
    events = [l[6:] for l in s.iter_lines(decode_unicode=True) if l.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert not any("error" in json.loads(e) for e in events[:-1]), events


def test_empty_api_key_refused():
    # `--api-key "$KEY"` with KEY unset must not start an open server that says "API key required"
    import subprocess
    from conftest import BIN, MODEL, ROOT
    p = subprocess.run([BIN, "serve", "-m", MODEL, "--port", "0", "--api-key", ""], capture_output=True, text=True,
                       timeout=30, cwd=ROOT)
    assert p.returncode == 2, p.stderr
    assert "--api-key is empty" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr

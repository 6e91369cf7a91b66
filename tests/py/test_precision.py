"""--precision bf16 (issue 18 item 4: BF16 matmul activations, AVX-512 BF16) through the real
server: the ready line says so; greedy output is the same at every per-request draft depth
(the BF16 kernels are batch-invariant, so drafting stays lossless); a seeded sampled request
gives the same text twice. On a CPU without AVX-512 BF16 the server refuses to start with
one plain line instead. The same for --quantize q8 --precision int8 (int8 activations, every
CPU), which without --quantize q8 is refused in one plain line."""
import subprocess

import requests

from conftest import BIN, MODEL, ROOT


def has_bf16():
    with open("/proc/cpuinfo") as f:
        return " avx512_bf16" in f.read()


def complete(server, **kw):
    body = {"model": "f32", "prompt": "one two three four", "max_tokens": 32, "temperature": 0, "ignore_eos": True}
    body.update(kw)
    r = requests.post(server.url("/v1/completions"), json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_bf16_server(make_server):
    if not has_bf16():
        p = subprocess.run([BIN, "serve", "-m", MODEL, "--port", "0", "--precision", "bf16"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode != 0
        assert "AVX-512 BF16" in p.stderr and len(p.stderr.strip().splitlines()) <= 3, p.stderr
        return
    s = make_server("--precision", "bf16", "--spec-depth", "3")
    assert any("bf16 activations" in line for line in s.log), "".join(s.log)
    base = complete(s, num_speculative_tokens=0)
    for d in (1, 2, 3):
        assert complete(s, num_speculative_tokens=d) == base, d
    a = complete(s, temperature=0.8, seed=11)
    assert complete(s, temperature=0.8, seed=11) == a


def test_int8_server(make_server):
    s = make_server("--quantize", "q8", "--precision", "int8", "--spec-depth", "3")
    assert any("int8 activations" in line for line in s.log), "".join(s.log)
    base = complete(s, num_speculative_tokens=0)
    for d in (1, 2, 3):
        assert complete(s, num_speculative_tokens=d) == base, d
    a = complete(s, temperature=0.8, seed=11)
    assert complete(s, temperature=0.8, seed=11) == a


def test_int8_needs_q8():
    p = subprocess.run([BIN, "serve", "-m", MODEL, "--port", "0", "--precision", "int8"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "--quantize q8" in p.stderr and len(p.stderr.strip().splitlines()) <= 3, p.stderr


def test_precision_flag_is_checked():
    p = subprocess.run([BIN, "serve", "-m", MODEL, "--port", "0", "--precision", "fp4"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--precision" in p.stderr and "f32, bf16 or int8" in p.stderr, p.stderr

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


def refused(*flags):
    """The server's stderr when it refuses to start with these flags."""
    p = subprocess.run([BIN, "serve", "-m", MODEL, "--port", "0", *flags], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert len(p.stderr.strip().splitlines()) <= 3, p.stderr
    return p.stderr


def lossless_server(make_server, tag, *flags):
    """Its ready line names the precision; greedy text is the same at depths 0-3; a seeded sampled
    request gives the same text twice."""
    s = make_server(*flags, "--spec-depth", "3")
    assert any(f"{tag} activations" in line for line in s.log), "".join(s.log)
    base = complete(s, num_speculative_tokens=0)
    for d in (1, 2, 3):
        assert complete(s, num_speculative_tokens=d) == base, d
    a = complete(s, temperature=0.8, seed=11)
    assert complete(s, temperature=0.8, seed=11) == a


def test_bf16_server(make_server):
    if not has_bf16():
        assert "AVX-512 BF16" in refused("--precision", "bf16")
        return
    lossless_server(make_server, "bf16", "--precision", "bf16")


def test_int8_server(make_server):
    lossless_server(make_server, "int8", "--quantize", "q8", "--precision", "int8")


def test_int8_needs_q8():
    assert "--quantize q8" in refused("--precision", "int8")


def test_precision_flag_is_checked():
    err = refused("--precision", "fp4")
    assert "--precision" in err and "f32, bf16 or int8" in err, err

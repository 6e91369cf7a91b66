"""generation_config.json sets the sampling defaults of both `tandem run` and `tandem serve`,
printed at start-up; `--generation-config none` turns them off (vLLM's neutral defaults:
temperature 1); a real multimodal checkpoint
(tests/golden/mm-a: Qwen3_5ForConditionalGeneration saved by transformers) serves."""
import os
import subprocess

import requests

from conftest import BIN, ROOT, Server

DEMO = os.path.join(ROOT, "models", "demo")
MM = os.path.join(ROOT, "tests", "golden", "mm-a", "bf16")


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def sampling_line(stderr):
    lines = [l for l in stderr.splitlines() if "sampling defaults:" in l]
    assert len(lines) == 1, stderr
    return lines[0]


def test_run_prints_generation_config_defaults():
    p = run("run", "-m", DEMO, "-p", "def f():", "-n", "4", "-t", "1")
    assert p.returncode == 0, p.stderr
    line = sampling_line(p.stderr)
    assert "temperature 0.6, top_k 20, top_p 0.95" in line, line
    assert "models/demo/generation_config.json" in line, line


def test_run_generation_config_none_and_flags():
    p = run("run", "-m", DEMO, "-p", "def f():", "-n", "4", "-t", "1", "--generation-config", "none")
    assert p.returncode == 0, p.stderr
    assert "sampling defaults: temperature 1 (--generation-config none)" in sampling_line(p.stderr)
    p = run("run", "-m", DEMO, "-p", "def f():", "-n", "4", "-t", "1", "--temperature", "0")
    assert "sampling defaults: greedy" in sampling_line(p.stderr)
    p = run("run", "-m", DEMO, "-p", "x", "-n", "4", "--generation-config", os.path.join(ROOT, "tests"))
    assert p.returncode == 1 and "no generation_config.json" in p.stderr, p.stderr


def test_bad_generation_config_is_one_line(tmp_path):
    d = tmp_path / "m"
    subprocess.run(["cp", "-r", MM, str(d)], check=True)
    (d / "generation_config.json").write_text('{"temperature": 0.6,')
    p = run("run", "-m", str(d), "-p", "x", "-n", "2")
    assert p.returncode == 1, p.stderr
    err = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(err) == 1 and "generation_config.json" in err[0] and ".c:" not in err[0], p.stderr


def wait_log(s, text, timeout=10):
    """The server's stderr is read by a thread: /health can answer before it has read a line."""
    import time
    deadline = time.time() + timeout
    while time.time() < deadline and text not in "".join(s.log):
        time.sleep(0.02)
    return "".join(s.log)


def test_serve_prints_and_uses_defaults():
    s = Server("--generation-config", "none")
    try:
        assert "sampling defaults: temperature 1 (--generation-config none)" in wait_log(s, "sampling defaults")
    finally:
        s.stop()


def test_serve_multimodal_checkpoint():
    s = Server("-m", MM)  # the later -m wins
    try:
        log = wait_log(s, "sampling defaults")
        assert "sampling defaults: temperature 0.7, top_k 20, top_p 0.9" in log, log
        r = requests.post(s.url("/v1/completions"), json={"model": "bf16", "prompt": "a b", "max_tokens": 8,
                                                            "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
    finally:
        s.stop()


def test_inspect_multimodal_checkpoint():
    p = run("inspect", "-m", MM)
    assert p.returncode == 0, p.stderr
    assert "files: 7 safetensors, 89 tensors; not used (model.visual.* and others): 21 tensors" in p.stdout, p.stdout
    assert "MTP layers 1" in p.stdout

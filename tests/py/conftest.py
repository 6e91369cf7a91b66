"""Starts the real `tandem serve` on a free loopback port for the tests.

The model is tests/golden/tiny-b/f32: a tokenizer with a ChatML template and
random weights, so the text is gibberish: the tests check structure and
greedy consistency, not content. All traffic is to 127.0.0.1, bounded in
count and time."""
import os
import re
import signal
import subprocess
import threading
import time

import pytest
import requests

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("TANDEM_BIN", os.path.join(ROOT, "build", "tandem"))
MODEL = os.path.join(ROOT, "tests", "golden", "tiny-b", "f32")
MODEL_NAME = "f32"


class Server:
    def __init__(self, *args):
        self.args = [BIN, "serve", "-m", MODEL, "--host", "127.0.0.1", "--port", "0", "-t", "1"] + list(args)
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        self.log = []
        self.port = None
        self._ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()
        if not self._ready.wait(30) or self.port is None:
            self.stop()
            raise RuntimeError("server did not print its address:\n" + "".join(self.log))
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if requests.get(self.base + "/health", timeout=2).status_code == 200:
                    # the server prints its "ready on" line just after /health turns 200
                    # (src/cli/serve.c); tests read that line from the log
                    t_end = time.time() + 10
                    while time.time() < t_end and not any("ready on" in l for l in self.log) and self.proc.poll() is None:
                        time.sleep(0.01)
                    return
            except requests.RequestException:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("server did not become healthy:\n" + "".join(self.log))

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                self._ready.set()
        self._ready.set()

    def url(self, path):
        return self.base + path

    def metrics(self, headers=None):
        """name{labels} -> value, labels without model_name."""
        txt = requests.get(self.url("/metrics"), headers=headers, timeout=10).text
        out = {}
        for line in txt.splitlines():
            if not line or line.startswith("#"):
                continue
            key, val = line.rsplit(" ", 1)
            key = re.sub(r'model_name="[^"]*",?', "", key).replace("{}", "")
            out[key] = float(val)
        return out

    def stop(self, timeout=20):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def check_clean_exit(self):
        """After stop(): exit 0 and no sanitizer report (ASan builds)."""
        time.sleep(0.1)  # let the drain thread read the last lines
        log = "".join(self.log)
        assert "Sanitizer" not in log, log[-3000:]
        assert self.proc.returncode == 0, log[-3000:]


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    s.stop()
    s.check_clean_exit()


@pytest.fixture(scope="session")
def server_spec():
    s = Server("--spec-depth", "3")
    yield s
    s.stop()
    s.check_clean_exit()


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI
    return OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def make_server():
    started = []

    def make(*args):
        s = Server(*args)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()
    for s in started:
        s.check_clean_exit()


THINK_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if tools %}{{- '<|im_start|>system\\nTools:' }}{%- for t in tools %}{{- ' ' + t.function.name }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)


@pytest.fixture(scope="session")
def server_think(tmp_path_factory):
    """tiny-b with a Qwen3.5-style template: the generation prompt opens <think>."""
    import json
    d = tmp_path_factory.mktemp("think-model")
    for f in os.listdir(MODEL):
        if f != "tokenizer_config.json":
            os.symlink(os.path.join(MODEL, f), d / f)
    with open(os.path.join(MODEL, "tokenizer_config.json")) as fh:
        cfg = json.load(fh)
    cfg["chat_template"] = THINK_TEMPLATE
    with open(d / "tokenizer_config.json", "w") as fh:
        json.dump(cfg, fh)
    s = Server("-m", str(d), "--served-model-name", "think", "--quiet")
    yield s
    s.stop()
    s.check_clean_exit()

"""The command line a new user meets (issue 13): every command's --help, unknown
options, one-line errors without source paths (kept under -v), numeric options
with their range, a port in use, the context window running full, `plan --device
cpu` on this machine's memory, and the demo model as the default everywhere."""
import json
import os
import re
import socket
import subprocess

import pytest
import requests

from conftest import BIN, ROOT

TINY_A = os.path.join(ROOT, "tests", "golden", "tiny-a", "f32")
TINY_B = os.path.join(ROOT, "tests", "golden", "tiny-b", "f32")
DEMO = os.path.join(ROOT, "models", "demo")
CFG27 = os.path.join(ROOT, "tests", "data", "configs", "qwen3.6-27b.config.json")
CLI = os.path.join(ROOT, "src", "cli")

COMMANDS = ["run", "serve", "bench", "plan", "kernels", "inspect", "tokenize", "detokenize", "template"]
# The sources whose string literals are the flags each command parses.
SOURCES = {
    "run": ["run.c", "opts.c"],
    "serve": ["serve.c", "opts.c"],
    "bench": ["bench_cmd.c", "opts.c"],
    "plan": ["plan_cmd.c"],
    "kernels": ["kernels_cmd.c"],
    "inspect": ["inspect.c"],
}
# tok_cmds.c holds three commands: their flags by name.
TOK_FLAGS = {
    "tokenize": ["-m", "--model", "-v", "--verbose", "-h", "--help"],
    "detokenize": ["-m", "--model", "-v", "--verbose", "-h", "--help"],
    "template": ["-m", "--model", "--messages", "--tools", "--no-generation-prompt", "--kwargs", "-v", "--verbose", "-h", "--help"],
}


def run(*args, stdin=None, timeout=120):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          input=stdin if stdin is not None else "")


def lines(s):
    return [l for l in s.splitlines() if l.strip()]


def parsed_flags(cmd):
    if cmd in TOK_FLAGS:
        return set(TOK_FLAGS[cmd])
    flags = set()
    for f in SOURCES[cmd]:
        with open(os.path.join(CLI, f)) as fh:
            flags |= set(re.findall(r'"(--?[a-zA-Z][a-zA-Z0-9-]*)"', fh.read()))
    return flags


def mentions(text, flag):
    return re.search(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])", text) is not None


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_on_stdout_exit_0_every_flag(cmd):
    outs = []
    for h in ("--help", "-h"):
        p = run(cmd, h)
        assert p.returncode == 0, (h, p.returncode, p.stderr)
        assert p.stdout.startswith("usage: tandem " + cmd), p.stdout[:200]
        assert p.stderr == "", p.stderr
        outs.append(p.stdout)
    assert outs[0] == outs[1]
    missing = sorted(f for f in parsed_flags(cmd) if not mentions(outs[0], f))
    assert not missing, f"tandem {cmd} --help does not mention {missing}"
    assert "default" in outs[0]


def test_top_level_help():
    p = run("--help")
    assert p.returncode == 0 and p.stderr == ""
    for c in COMMANDS:
        assert mentions(p.stdout, c), c
    p = run("no-such-command")
    assert p.returncode == 2 and len(lines(p.stderr)) == 1, p.stderr


@pytest.mark.parametrize("cmd", COMMANDS)
def test_unknown_option_one_line_exit_2(cmd):
    p = run(cmd, "--no-such-option")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert len(lines(p.stderr)) == 1, p.stderr
    assert "--no-such-option" in p.stderr
    assert p.stdout == ""


MISSING = os.path.join("models", "demoo")


@pytest.mark.parametrize("cmd,extra", [
    ("run", ["-p", "hi"]), ("serve", ["--port", "0"]), ("bench", []), ("plan", []), ("kernels", []), ("inspect", []),
    ("tokenize", []), ("detokenize", []), ("template", ["--messages", "-"]),
])
def test_missing_model_directory(cmd, extra):
    p = run(cmd, "-m", MISSING, *extra, stdin="[]")
    assert p.returncode != 0
    err = lines(p.stderr)
    assert len(err) == 1, p.stderr
    assert f"{MISSING}: no such model directory" in err[0]
    assert ".c:" not in err[0]
    assert not re.search(r"src/\w+/", err[0])
    v = run(cmd, "-m", MISSING, *extra, "-v", stdin="[]")
    assert v.returncode == p.returncode
    assert len(lines(v.stderr)) == 1, v.stderr
    assert re.search(r"\.c:\d+: ", v.stderr) and "no such model directory" in v.stderr, v.stderr


def test_library_error_without_source_location(tmp_path):
    """An existing directory without a tokenizer: the library's error, stripped; whole under -v."""
    p = run("tokenize", "-m", str(tmp_path), stdin="x")
    assert p.returncode == 1
    assert len(lines(p.stderr)) == 1 and ".c:" not in p.stderr, p.stderr
    assert "tokenizer.json" in p.stderr
    v = run("tokenize", "-m", str(tmp_path), "-v", stdin="x")
    assert re.search(r"src/[\w/]+\.c:\d+: ", v.stderr), v.stderr
    assert v.stderr.endswith(p.stderr.split(": ", 1)[1])


@pytest.mark.parametrize("cmd", ["run", "serve", "bench", "plan"])
def test_bad_spec_depth_once_with_range(cmd):
    args = [cmd, "--spec-depth", "x"] + (["-p", "hi"] if cmd == "run" else []) + (["-m", DEMO] if cmd == "plan" else [])
    p = run(*args)
    assert p.returncode == 2
    err = lines(p.stderr)
    assert len(err) == 1, p.stderr
    assert err[0].count("--spec-depth") == 1
    assert "[0, 16]" in err[0] and '"x"' in err[0], err[0]


@pytest.mark.parametrize("opt,val", [
    ("--threads", "-1"), ("--temperature", "hot"), ("--top-k", "1.5"), ("--top-p", "2"), ("--min-p", "-1"),
    ("--repetition-penalty", "0"), ("--presence-penalty", "3"), ("--frequency-penalty", "x"), ("--seed", "-5"),
    ("--gpu-memory-utilization", "2"), ("--deltanet-chunk", "999"), ("--max-model-len", "0"), ("-n", "0"),
])
def test_numeric_options_say_their_range(opt, val):
    p = run("run", "-p", "hi", opt, val)
    assert p.returncode == 2
    err = lines(p.stderr)
    assert len(err) == 1, p.stderr
    assert opt in err[0] and f'"{val}"' in err[0]
    assert re.search(r"[\[(][^\]]*, [^\]]*[\])]", err[0]), err[0]


def test_port_in_use_one_clear_line():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        p = run("serve", "-m", TINY_B, "--host", "127.0.0.1", "--port", str(port), "-t", "1", timeout=60)
    assert p.returncode != 0
    err = lines(p.stderr)
    assert len(err) == 1, p.stderr
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in err[0], err[0]
    assert ".c:" not in err[0] and "Failed to bind" not in err[0]


def tiny_a_window():
    with open(os.path.join(TINY_A, "config.json")) as f:
        cfg = json.load(f)
    return cfg.get("text_config", cfg)["max_position_embeddings"]


def test_run_says_when_the_context_window_is_full():
    assert tiny_a_window() > 64  # -c 40 is what fills up, not the model's limit
    p = run("run", "-m", TINY_A, "-p", "hello world", "-n", "500", "--ignore-eos", "-c", "40", "-t", "1", "--temperature", "0")
    assert p.returncode == 0, p.stderr
    assert "stopped: the context window (40 tokens) is full" in p.stderr, p.stderr
    m = re.search(r"prompt: (\d+) tokens.*generation: (\d+) tokens", p.stderr)
    assert m and int(m.group(1)) + int(m.group(2)) == 40, p.stderr
    short = run("run", "-m", TINY_A, "-p", "hello world", "-n", "5", "--ignore-eos", "-c", "40", "-t", "1", "--temperature", "0")
    assert short.returncode == 0 and "context window" not in short.stderr, short.stderr


def test_isa_option_same_tokens():
    """--isa picks the CPU kernels of run / serve / bench: every one this CPU has gives the demo model's
    greedy text (AVX2 and AVX-512 the same bits), with --quantize q8 --precision int8 too; a bad name is
    one line with exit 2."""
    flags = open("/proc/cpuinfo").read()
    isas = ["c"] + (["avx2"] if " avx2" in flags and " fma" in flags else []) + (["avx512"] if " avx512bw" in flags else [])
    for extra in ([], ["--quantize", "q8", "--precision", "int8"]):
        outs = {}
        for isa in ["auto"] + isas:
            p = run("run", "-m", DEMO, "-p", "The quick brown fox", "-n", "24", "--ignore-eos", "--temperature", "0", "-t", "1",
                    "--isa", isa, *extra)
            assert p.returncode == 0, (isa, p.stderr)
            outs[isa] = p.stdout
        assert len(set(outs.values())) == 1, (extra, outs)
    bad = run("run", "-m", DEMO, "--isa", "sse9", "-p", "hi")
    assert bad.returncode == 2 and "--isa" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_run_at_the_models_own_window():
    """No -c: tiny-a's max_position_embeddings is the window that fills up."""
    n = tiny_a_window()
    if n > 8192:
        pytest.skip("window too long for a quick test")
    p = run("run", "-m", TINY_A, "-p", "hello world", "-n", str(n + 10), "--ignore-eos", "-t", "1", "--temperature", "0",
            timeout=300)
    assert p.returncode == 0, p.stderr
    assert f"stopped: the context window ({n} tokens) is full" in p.stderr, p.stderr[-500:]


def test_server_logs_when_the_context_window_is_full(make_server):
    s = make_server("-c", "40")
    r = requests.post(s.url("/v1/completions"), json={"prompt": "hello world", "max_tokens": 100, "ignore_eos": True,
                                                      "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["total_tokens"] == 40
    r2 = requests.post(s.url("/v1/completions"), json={"prompt": "hello world", "max_tokens": 3, "ignore_eos": True,
                                                       "temperature": 0}, timeout=60)
    assert r2.json()["choices"][0]["finish_reason"] == "length"
    s.stop()
    s.check_clean_exit()
    log = "".join(s.log)
    assert log.count("stopped: the context window (40 tokens) is full") == 1, log
    assert body["id"] in [l.split()[2] for l in s.log if "context window" in l][0]


def mem_total():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    pytest.skip("no MemTotal")


def test_plan_cpu_uses_this_machines_memory():
    total = mem_total()
    p = run("plan", "-m", DEMO, "--device", "cpu", "--json")
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["device_bytes"] == total
    assert j["gpu_memory_utilization"] == pytest.approx(0.9)
    assert abs(j["budget_bytes"] - total * 0.9) <= 1
    t = run("plan", "-m", DEMO, "--device", "cpu")
    assert t.returncode == 0, t.stderr
    assert f"budget {total * 0.9 / 2**30:.2f} GiB ({total / 2**30:.2f} GiB x 0.90)" in t.stdout, t.stdout[:300]
    # --memory-budget still wins
    b = run("plan", "-m", DEMO, "--device", "cpu", "--memory-budget", "3GiB", "--json")
    assert json.loads(b.stdout)["budget_bytes"] == 3 * 2**30


def test_plan_reference_reproduces_its_table():
    if not os.path.exists(CFG27):
        pytest.skip("no 27B config")
    with open(os.path.join(ROOT, "src", "plan", "README.md")) as f:
        readme = f.read()
    m = re.search(r"```\n(reference measurement.*?)```", readme, re.S)
    assert m, "src/plan/README.md quotes no reference table"
    p = run("plan", "--config", CFG27, "--reference")
    assert p.returncode == 0, p.stderr
    assert p.stdout.endswith(m.group(1)), p.stdout[-2000:]
    assert "0 of 13 verdicts differ" in p.stdout
    other = run("plan", "-m", DEMO, "--reference")
    assert other.returncode == 2 and len(lines(other.stderr)) == 1, other.stderr


def test_tok_commands_and_inspect_default_to_the_demo_model(tmp_path):
    a = run("tokenize", stdin="hello world")
    b = run("tokenize", "-m", DEMO, stdin="hello world")
    assert a.returncode == 0 and a.stdout == b.stdout and a.stdout.startswith("["), a.stderr
    ids = a.stdout
    a = run("detokenize", stdin=ids)
    assert a.returncode == 0 and a.stdout == "hello world", a.stderr
    msgs = tmp_path / "m.json"
    msgs.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    a = run("template", "--messages", str(msgs))
    b = run("template", "-m", DEMO, "--messages", str(msgs))
    assert a.returncode == 0 and a.stdout == b.stdout and "hi" in a.stdout, a.stderr
    a = run("inspect")
    assert a.returncode == 0 and a.stdout.startswith("model: models/demo "), a.stderr


def test_run_all_needs_no_bc():
    with open(os.path.join(ROOT, "tests", "run_all.sh")) as f:
        src = f.read()
    assert not re.search(r"\|\s*bc\b", src)

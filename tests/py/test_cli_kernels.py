"""`tandem bench --kernels` (= `tandem kernels`) on a tiny golden model: the report has
every part issue 9 asks for (probe, decode, verify cost per k, prefill rows), and bad
options fail with a message. Timings are not checked (benchmarks, not tests)."""
import os
import re
import subprocess

from conftest import BIN, ROOT

TINY = os.path.join(ROOT, "tests", "golden", "tiny-a", "f32")


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_bench_kernels_report():
    p = run("bench", "--kernels", "-m", TINY, "-t", "1", "--reps", "1", "--probe-mb", "16", "--mm-mb", "1",
            "--mm-k", "256", "--max-k", "3", "--prefill", "16,40")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert re.search(r"bandwidth probe .*: [0-9.]+ GB/s", out)
    assert re.search(r"^decode \(depth 0\): [0-9.]+ tokens/s", out, re.M)
    ks = [int(m.group(1)) for m in re.finditer(r"^\| (\d+) \| (\d+) \| [0-9.]+ \| [0-9.]+ \|$", out, re.M)]
    assert ks == [1, 2, 3], out
    pre = [int(m.group(1)) for m in re.finditer(r"^\| (\d+) \| [0-9.]+ \| [0-9.]+ \|$", out, re.M)]
    assert pre == [16, 40], out
    # the matmul table covers M = 1..16 for each ISA the CPU has
    assert re.search(r"^\| c \| 16 \|", out, re.M)


def test_bench_kernels_same_as_kernels_command():
    a = run("bench", "--kernels", "--bogus")
    b = run("kernels", "--bogus")
    assert a.returncode != 0 and b.returncode == a.returncode
    assert "usage: tandem kernels" in a.stderr + a.stdout


BF16 = os.path.join(ROOT, "tests", "golden", "tiny-b", "bf16")


def test_run_quantize_q8_lossless_and_bad_value():
    outs = []
    for depth in ("0", "3"):
        p = run("run", "-m", BF16, "-p", "hello world", "-n", "24", "--temperature", "0", "--ignore-eos",
                "--quantize", "q8", "--spec-depth", depth, "-t", "1")
        assert p.returncode == 0, p.stderr
        outs.append(p.stdout)
    assert outs[0] == outs[1] and len(outs[0]) > 0
    plain = run("run", "-m", BF16, "-p", "hello world", "-n", "24", "--temperature", "0", "--ignore-eos", "-t", "1")
    assert plain.returncode == 0, plain.stderr
    bad = run("run", "-m", BF16, "-p", "x", "--quantize", "q4")
    assert bad.returncode != 0 and "--quantize" in bad.stderr


def test_kernels_quantize_q8_reports_fewer_bytes():
    def read_mb(*extra):
        p = run("kernels", "-m", BF16, "-t", "1", "--reps", "1", "--probe-mb", "16", "--mm-mb", "0", "--max-k", "1",
                "--prefill", "16", *extra)
        assert p.returncode == 0, p.stderr
        return int(re.search(r"(\d+) MB read per decode step", p.stdout).group(1))
    assert read_mb("--quantize", "q8") < read_mb()


def test_kernels_rows_at_a_position():
    """--decode-at N and --prefill-at N: the decode / verify rows and the prefill rows come
    after an N-token prompt (long-context attention, a prompt tail after a prefix-cache hit),
    and the report says so; a bad value fails with one line."""
    p = run("kernels", "-m", TINY, "-t", "1", "--reps", "1", "--probe-mb", "16", "--mm-mb", "0", "--max-k", "2",
            "--prefill", "16,24", "--decode-at", "40", "--prefill-at", "48")
    assert p.returncode == 0, p.stderr
    assert "decode and verify rows at position 40" in p.stdout
    assert "prefill rows after a prompt of 48 tokens" in p.stdout
    pre = [int(m.group(1)) for m in re.finditer(r"^\| (\d+) \| [0-9.]+ \| [0-9.]+ \|$", p.stdout, re.M)]
    assert pre == [16, 24], p.stdout
    bad = run("kernels", "--prefill-at", "-3")
    assert bad.returncode == 2 and "--prefill-at must be an integer in [0, 1048576]" in bad.stderr

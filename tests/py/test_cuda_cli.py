"""`--device cuda` (src/backend/cuda). Where there is no GPU (this CI machine:
a CUDA build with no driver, or a build with CUDA=0), `tandem run --device
cuda` says so in one plain line and exits non-zero, without a crash. Where
there is one, the demo model's greedy text on the GPU equals the CPU's."""
import os
import subprocess

from conftest import BIN, ROOT

DEMO = os.path.join(ROOT, "models", "demo")
NO_CUDA = ("no CUDA device: ", "this build has no CUDA backend: rebuild with make CUDA=1")


def run(*args):
    return subprocess.run([BIN, "run", "-m", DEMO, "-p", "hi", "-n", "8", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, stdin=subprocess.DEVNULL)


def test_run_device_cuda():
    for flag in (["--device", "cuda"], ["--backend", "cuda"]):
        r = run(*flag)
        if r.returncode == 0:  # a GPU: the same greedy text as the reference backend
            ref = run("--device", "cpu")
            assert ref.returncode == 0, ref.stderr
            assert r.stdout == ref.stdout
            continue
        assert r.returncode > 0, f"killed by signal {-r.returncode}: {r.stderr}"
        err = [l for l in r.stderr.splitlines() if l.strip()]
        assert len(err) == 1, r.stderr
        assert any(m in err[0] for m in NO_CUDA), err[0]
        assert ".cu:" not in err[0] and ".c:" not in err[0], err[0]  # no source location without -v
        assert r.stdout == ""


def test_device_names_cpu_or_cuda():
    r = run("--device", "tpu")
    assert r.returncode == 2
    assert "cpu or cuda" in r.stderr

#!/usr/bin/env python3
"""CPU speed of two tandem builds side by side: is a refactor "not slower than before"?

    bench/compare_builds.py [--base REV] [--model DIR|none] [--rounds N] [--threads T]
                            [--reps auto|R] [--max-k K] [--prefill LEN] [--prefill-reps P]
                            [--mm-mb MB] [--new BIN] [--base-bin BIN] [--out FILE]

base: git revision REV (default HEAD, i.e. the last commit, so the comparison is
"uncommitted work vs. the commit under it"), built once into a throwaway detached
worktree /tmp/tandem-base-<sha12> with `make -jJOBS BUILD=build all` and reused on
later runs (remove it with `git worktree remove --force /tmp/tandem-base-<sha12>`).
new: this tree's build/tandem (built by you with `make`; the script only warns when
files under src/, include/ or the Makefile are newer than it).

Both run `tandem kernels -m DIR -t T --reps R --mm-mb 0 --probe-mb 16 --max-k K
--prefill LEN,LEN,...` alternately (base, new, base, new, ...: drift in a shared
machine's load hits both alike), after WARMUP untimed runs of each (--reps auto,
the default: R = as many repetitions as fit in --target-s seconds, 5..64, from the
warm-up; 64 on models/demo). Measured (all times, lower is better; each round's value
is the median that `tandem kernels` prints over its R repetitions):
  decode ms/token      1 / (decode tokens/s), one token after a 16-token prompt
  verify k=K ms        one forward of K+1 tokens (the verify of K drafts), K = 1..max-k
  prefill LEN ms       one LEN-token forward; `tandem kernels` times each prefill length
                       once, so LEN is passed P times (--prefill-reps) and the round's value
                       is the median of those P
  matmul ISA M=m ms    (only with --mm-mb MB > 0) the synthetic-weight matmul table
The table gives, per build, the median and the min over rounds, new/base of each,
the median and min-max of the per-round paired ratios (new_i / base_i: the noise),
and the geometric mean of the ratios; rows whose rounds spread over 1.5x are named
under it. On a machine others share, with --threads = its cores, decode/verify are
bimodal (a worker thread descheduled at every barrier): trust min, add rounds, or
use fewer threads. Exit status 0; 3 with --max-ratio X when the
geometric mean ratio exceeds X; 1 on errors.
"""
import argparse
import datetime
import math
import os
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def die(msg):
    print(f"compare_builds: {msg}", file=sys.stderr)
    sys.exit(1)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def git(*args, check=True):
    r = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True)
    if check and r.returncode:
        die(f"git {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout.strip()


# ---- builds ----

def build_base(rev, jobs, rebuild):
    sha = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    if not sha:
        die(f"--base {rev}: not a git revision of {REPO}")
    wt = f"/tmp/tandem-base-{sha[:12]}"
    binary = os.path.join(wt, "build", "tandem")
    if os.path.isdir(wt):
        head = subprocess.run(["git", "-C", wt, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        if head != sha:
            die(f"{wt} exists but is not a checkout of {sha[:12]} (HEAD {head or 'none'}); remove it")
    else:
        git("worktree", "prune")  # forgets worktrees whose directory is gone (only those)
        log(f"compare_builds: git worktree add --detach {wt} {sha[:12]}")
        git("worktree", "add", "--detach", wt, sha)
    if rebuild or not os.access(binary, os.X_OK):
        logf = os.path.join(wt, "compare_builds-make.log")
        log(f"compare_builds: building base {sha[:12]} in {wt} (make -j{jobs} BUILD=build all; log {logf})")
        t0 = time.time()
        with open(logf, "w") as f:
            r = subprocess.run(["make", f"-j{jobs}", "BUILD=build", "all"], cwd=wt, stdout=f, stderr=subprocess.STDOUT)
        if r.returncode:
            with open(logf) as f:
                tail = "".join(f.readlines()[-20:])
            die(f"building base {sha[:12]} failed (make rc {r.returncode}), last lines of {logf}:\n{tail}")
        log(f"compare_builds: base built in {time.time() - t0:.0f} s")
    return sha, binary


def stale_sources(binary):
    """Files under src/, include/ or the Makefile newer than binary (tracked or untracked)."""
    t = os.path.getmtime(binary)
    out = git("ls-files", "--cached", "--others", "--exclude-standard", "--", "src", "include", "Makefile")
    newer = []
    for p in out.splitlines():
        full = os.path.join(REPO, p)
        try:
            if os.path.getmtime(full) > t:
                newer.append(p)
        except OSError:
            pass
    return newer


def describe_new(binary):
    sha = git("rev-parse", "HEAD")
    desc = sha[:12]
    if os.path.realpath(binary) == os.path.realpath(os.path.join(REPO, "build", "tandem")):
        dirty = git("status", "--porcelain", "--", "src", "include", "Makefile").splitlines()
        if dirty:
            desc += f" + uncommitted changes ({len(dirty)} files under src/ include/ Makefile)"
        stale = stale_sources(binary)
        if stale:
            desc += f"; binary built {time.strftime('%Y-%m-%d %H:%M', time.localtime(os.path.getmtime(binary)))}, older than {len(stale)} source files"
            log(f"compare_builds: warning: {binary} is older than {len(stale)} files (e.g. {', '.join(stale[:3])}); "
                "it may not be the code you mean to measure: rebuild with make")
    else:
        desc = f"{binary} (tree HEAD {sha[:12]})"
    return sha, desc


# ---- one run of tandem kernels, parsed ----

RE_HEAD = re.compile(r"^# tandem kernels: (best isa \S+), (\d+) threads, load average (-?[\d.]+)")
RE_PROBE = re.compile(r"^bandwidth probe .*: ([\d.]+) GB/s")
RE_MODEL = re.compile(r"^## model (.*): (\d+) MB read per decode step.*, (\d+) threads, isa (\S+)")
RE_DECODE = re.compile(r"^decode \(depth 0\): ([\d.]+) tokens/s, ([\d.]+) ms/token")
RE_VERIFY = re.compile(r"^\| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \|$")
RE_PREFILL = re.compile(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \|$")
RE_MATMUL = re.compile(r"^\| (c|avx2|avx512) \| (\d+) \| ([\d.]+) \|")


def parse(text):
    """-> (measurements {name: ms}, info {...}). Values come from the most precise printed field."""
    m, info, prefill = {}, {}, {}
    section, t1 = None, None
    for line in text.splitlines():
        line = line.rstrip()
        if (g := RE_HEAD.match(line)):
            info["isa_line"] = f"# tandem kernels: {g[1]}, {g[2]} threads"
            info["load"] = float(g[3])
        elif (g := RE_PROBE.match(line)):
            info["probe"] = float(g[1])
        elif line.startswith("## matmul"):
            section = "matmul"
            info["matmul"] = line[3:]
        elif (g := RE_MODEL.match(line)):
            section = "model"
            info["model_line"] = f"{g[2]} MB read per decode step, {g[3]} threads, isa {g[4]}"
            info["model_isa"] = g[4]
        elif (g := RE_DECODE.match(line)):
            t1 = 1e3 / float(g[1])  # tokens/s has 4+ significant digits; ms/token only 0.1 ms
            m["decode ms/token"] = t1
        elif line.startswith("| k | tokens in verify"):
            section = "verify"
        elif line.startswith("| prefill tokens"):
            section = "prefill"
        elif section == "verify" and (g := RE_VERIFY.match(line)):
            ms, ratio = float(g[3]), float(g[4])
            # ms is rounded to 0.05 ms, ratio to 0.005: take whichever is relatively finer
            if t1 and ratio > 0 and 0.005 / ratio < 0.05 / max(ms, 1e-9):
                ms = ratio * t1
            m[f"verify k={int(g[1])} ms"] = ms
        elif section == "prefill" and (g := RE_PREFILL.match(line)):
            n, tps = int(g[1]), float(g[3])
            prefill.setdefault(n, []).append(1e3 * n / tps if tps > 0 else 1e3 * float(g[2]))
        elif section == "matmul" and (g := RE_MATMUL.match(line)):
            m[f"matmul {g[1]} M={g[2]} ms"] = float(g[3])
    for n, v in prefill.items():
        m[f"prefill {n} ms"] = statistics.median(v)
    return m, info


def run_kernels(binary, args, timeout, logdir, tag):
    t0 = time.time()
    try:
        r = subprocess.run([binary, "kernels", *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        die(f"{tag}: `{binary} kernels {' '.join(args)}` ran past {timeout} s")
    dt = time.time() - t0
    if logdir:
        with open(os.path.join(logdir, f"{tag}.txt"), "w") as f:
            f.write(r.stdout + ("\n--- stderr ---\n" + r.stderr if r.stderr else ""))
    if r.returncode:
        die(f"{tag}: `{binary} kernels {' '.join(args)}` failed (rc {r.returncode}):\n{r.stderr.strip()}")
    m, info = parse(r.stdout)
    if not m:
        die(f"{tag}: no measurements in the output of `{binary} kernels {' '.join(args)}`:\n{r.stdout}")
    return m, info, dt


# ---- report ----

def order_key(name):
    kinds = ["decode", "verify", "prefill", "matmul"]
    kind = name.split()[0]
    nums = [int(x) for x in re.findall(r"\d+", name)]
    isa = next((i for i, a in enumerate(["c", "avx2", "avx512"]) if f" {a} " in name), 0)
    return (kinds.index(kind) if kind in kinds else 9, isa, nums)


def fmt(v):
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 10 else f"{v:.2f}" if v < 1000 else f"{v:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--base", default="HEAD", help="git revision for the base build (default HEAD), built in /tmp/tandem-base-SHA12")
    ap.add_argument("--base-bin", help="use this binary as the base instead of building --base")
    ap.add_argument("--new", default=os.path.join(REPO, "build", "tandem"), help="the new binary (default build/tandem)")
    ap.add_argument("--model", default=os.path.join(REPO, "models", "demo"),
                    help="model dir for decode/verify/prefill (default models/demo; 'none': matmul only, needs --mm-mb)")
    ap.add_argument("--rounds", type=int, default=5, help="base/new pairs (default 5)")
    ap.add_argument("--order", choices=["abab", "abba"], default="abab",
                    help="abab: base first every round; abba: alternate which goes first (cancels linear drift)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs of each build first (default 1)")
    ap.add_argument("--threads", type=int, default=2, help="threads for both (default 2)")
    ap.add_argument("--reps", default="auto",
                    help="tandem kernels --reps, 1..64, or auto (default): from the warm-up's decode/verify times, "
                         "as many as fit in about --target-s seconds per run, 5..64")
    ap.add_argument("--target-s", type=float, default=2.0, help="seconds of decode/verify timing per run for --reps auto (default 2)")
    ap.add_argument("--max-k", type=int, default=4, help="verify k = 1..K (default 4)")
    ap.add_argument("--prefill", default="512", help="prefill length(s), comma-separated; 0 = none (default 512)")
    ap.add_argument("--prefill-reps", type=int, default=3,
                    help="times each prefill length is run per round (lengths x reps <= 4; default 3)")
    ap.add_argument("--mm-mb", type=int, default=0, help="synthetic matmul weight MB, 0 = skip the matmul table (default 0)")
    ap.add_argument("--extra", default="", help="more `tandem kernels` options for both, e.g. '--quantize q8'")
    ap.add_argument("--jobs", type=int, default=2, help="make -j for the base build (default 2)")
    ap.add_argument("--rebuild", action="store_true", help="run make in the base worktree even if its binary exists")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per tandem kernels run (default 900)")
    ap.add_argument("--log-dir", help="keep every run's raw output here")
    ap.add_argument("--out", help="also write the markdown report to this file")
    ap.add_argument("--max-ratio", type=float, help="exit 3 when the geometric mean new/base exceeds this (e.g. 1.03)")
    a = ap.parse_args()

    auto_reps = a.reps == "auto"
    if not auto_reps and not (a.reps.isdigit() and 1 <= int(a.reps) <= 64):
        die(f"--reps must be auto or 1..64, got {a.reps}")
    if a.rounds < 1 or a.warmup < 0 or a.threads < 1 or not 1 <= a.max_k <= 16:
        die("need --rounds >= 1, --warmup >= 0, --threads >= 1, --max-k 1..16")
    if auto_reps and a.warmup < 1:
        a.warmup = 1  # the warm-up run is the calibration
    reps = 3 if auto_reps else int(a.reps)
    lens = [int(x) for x in a.prefill.split(",") if x.strip() and int(x) > 0]
    if len(lens) * a.prefill_reps > 4:
        die(f"tandem kernels takes at most 4 prefill lengths: {len(lens)} lengths x --prefill-reps {a.prefill_reps} > 4")
    if a.threads > (os.cpu_count() or 1):
        log(f"compare_builds: warning: --threads {a.threads} > {os.cpu_count()} cores")
    model = None if a.model == "none" else os.path.abspath(a.model)
    if model and not os.path.isfile(os.path.join(model, "config.json")):
        die(f"--model {a.model}: no config.json there")
    if not model and a.mm_mb <= 0:
        die("--model none measures nothing without --mm-mb MB")

    new_bin = os.path.abspath(a.new)
    if not os.access(new_bin, os.X_OK):
        die(f"new binary {new_bin} is missing: build it first (make -j2 all)")
    new_sha, new_desc = describe_new(new_bin)
    if a.base_bin:
        base_bin = os.path.abspath(a.base_bin)
        if not os.access(base_bin, os.X_OK):
            die(f"--base-bin {base_bin}: not an executable")
        base_sha, base_desc = "", base_bin
    else:
        base_sha, base_bin = build_base(a.base, a.jobs, a.rebuild)
        base_desc = f"{base_sha[:12]} ({a.base})" if a.base not in (base_sha, base_sha[:len(a.base)]) else base_sha[:12]
        subj = git("log", "-1", "--format=%s", base_sha)
        base_desc += f" \"{subj[:70]}{'...' if len(subj) > 70 else ''}\""

    def kargs(reps):
        args = ["-t", str(a.threads), "--reps", str(reps), "--mm-mb", str(a.mm_mb), "--probe-mb", "16"]
        if model:
            args += ["-m", model, "--max-k", str(a.max_k),
                     "--prefill", ",".join(str(n) for n in lens for _ in range(a.prefill_reps)) or "0"]
        return args + a.extra.split()
    if a.log_dir:
        os.makedirs(a.log_dir, exist_ok=True)

    builds = {"base": base_bin, "new": new_bin}
    res = {"base": [], "new": []}
    infos = {"base": [], "new": []}
    t_start = time.time()
    cal = []
    for w in range(a.warmup):
        for b in ("base", "new"):
            m, _, _ = run_kernels(builds[b], kargs(reps), a.timeout, a.log_dir, f"warmup{w + 1}-{b}")
            cal.append(sum(v for k, v in m.items() if k.startswith(("decode", "verify", "matmul"))) / 1e3)
    if auto_reps:
        per_rep = max(cal[-2:]) if cal else 0  # seconds of one repetition of every timed row, the last warm-up
        reps = max(5, min(64, int(a.target_s / per_rep))) if per_rep > 0 else 5
        log(f"compare_builds: --reps auto: {reps} (one repetition of the decode/verify rows took {per_rep * 1e3:.0f} ms)")
    args = kargs(reps)
    for r in range(a.rounds):
        order = ("new", "base") if a.order == "abba" and r % 2 else ("base", "new")
        took = []
        for b in order:
            m, info, dt = run_kernels(builds[b], args, a.timeout, a.log_dir, f"round{r + 1}-{b}")
            res[b].append(m)
            infos[b].append(info)
            took.append(f"{b} {dt:.1f} s")
        d = {b: res[b][-1].get("decode ms/token") for b in builds}
        extra = f", decode ms base {fmt(d['base'])} new {fmt(d['new'])}" if d["base"] and d["new"] else ""
        log(f"compare_builds: round {r + 1}/{a.rounds}: {', '.join(took)}{extra}")

    names = sorted({k for b in res for m in res[b] for k in m}, key=order_key)
    rows, logs, logs_min, noisy = [], [], [], []
    for n in names:
        bv = [m[n] for m in res["base"] if n in m]
        nv = [m[n] for m in res["new"] if n in m]
        bm, nm = (statistics.median(bv) if bv else None), (statistics.median(nv) if nv else None)
        bl, nl = (min(bv) if bv else None), (min(nv) if nv else None)
        pr = [mn[n] / mb[n] for mb, mn in zip(res["base"], res["new"]) if n in mb and n in mn and mb[n] > 0]
        ratio = nm / bm if bm and nm else None
        rmin = nl / bl if bl and nl else None
        if ratio:
            logs.append(math.log(ratio))
        if rmin:
            logs_min.append(math.log(rmin))
        if any(v and min(v) > 0 and max(v) / min(v) > 1.5 for v in (bv, nv)):
            noisy.append(f"{n} (base {fmt(min(bv))}-{fmt(max(bv))}, new {fmt(min(nv))}-{fmt(max(nv))})")
        rng = f"{statistics.median(pr):.3f} ({min(pr):.3f}-{max(pr):.3f})" if pr else "-"
        r3 = (lambda x: f"{x:.3f}" if x else "-")
        rows.append(f"| {n} | {fmt(bm)} | {fmt(nm)} | {r3(ratio)} | {fmt(bl)} | {fmt(nl)} | {r3(rmin)} | {rng} |")
    gm = math.exp(sum(logs) / len(logs)) if logs else None
    gm_min = math.exp(sum(logs_min) / len(logs_min)) if logs_min else None

    def first(b, k):
        return next((i[k] for i in infos[b] if k in i), None)

    def span(b, k, f="{:.1f}"):
        v = [i[k] for i in infos[b] if k in i]
        return f"{f.format(min(v))}-{f.format(max(v))}" if v else "-"

    out = []
    out.append(f"## tandem compare_builds: base vs new, {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    out.append("")
    out.append(f"- base: {base_desc}  \n  `{base_bin}`")
    out.append(f"- new:  {new_desc}  \n  `{new_bin}`")
    out.append(f"- model: {model or 'none'}" + (f" ({first('new', 'model_line')})" if first("new", "model_line") else ""))
    isa_b, isa_n = first("base", "isa_line"), first("new", "isa_line")
    out.append(f"- isa: `{isa_n}`" + (f" (base: `{isa_b}`)" if isa_b != isa_n else "")
               + (f"; model rows isa {first('new', 'model_isa')}" if first("new", "model_isa") else ""))
    if first("new", "matmul"):
        out.append(f"- matmul: {first('new', 'matmul')}")
    out.append(f"- rounds {a.rounds} ({a.order.upper()}, {a.warmup} warm-up run(s) of each first), threads {a.threads}, "
               f"`tandem kernels {' '.join(args)}`")
    out.append(f"- machine: {os.cpu_count()} cores; load average at start of runs {span('base', 'load', '{:.2f}')} (base), "
               f"{span('new', 'load', '{:.2f}')} (new); 16 MB read probe GB/s {span('base', 'probe')} (base), "
               f"{span('new', 'probe')} (new); {time.time() - t_start:.0f} s of runs")
    out.append("")
    out.append("Times in ms (lower is better); new/base < 1 = new is faster. Median and min over the rounds "
               "(each round's value is itself the median of `tandem kernels`' repetitions); min is the least disturbed "
               "by a loaded machine. \"per-round new/base\": median (min-max) of the paired ratios new_i/base_i of each round (the noise).")
    out.append("")
    out.append("| measurement | base median | new median | new/base | base min | new min | new/base (min) | per-round new/base median (min-max) |")
    out.append("|---|---|---|---|---|---|---|---|")
    out += rows
    if gm:
        out.append(f"| **geometric mean** | | | **{gm:.3f}** | | | **{gm_min:.3f}** | |")
    if noisy:
        out.append("")
        out.append(f"Noisy, a spread over 1.5x across rounds: {'; '.join(noisy)}. "
                   + ("With as many threads as cores on a shared machine, decode/verify are bimodal (several times "
                      "slower while another process holds a core: the thread pool waits for a descheduled worker); "
                      "trust min, add --rounds, or use fewer --threads." if a.threads >= (os.cpu_count() or 1) else
                      "The machine is loaded: trust min, or add --rounds."))
    report = "\n".join(out) + "\n"
    print(report, end="")
    if a.out:
        with open(a.out, "w") as f:
            f.write(report)
    if a.max_ratio and gm and gm > a.max_ratio:
        log(f"compare_builds: geometric mean new/base {gm:.3f} > --max-ratio {a.max_ratio}")
        sys.exit(3)


if __name__ == "__main__":
    main()

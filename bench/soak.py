#!/usr/bin/env python3
"""Soak test of `tandem serve` under memory pressure (issue 16). All traffic goes to
127.0.0.1; the loop is bounded by --seconds; the servers are started and stopped here.

    python3 bench/soak.py --seconds 600            # the 10-minute soak
    python3 bench/soak.py --seconds 60             # what CI runs

1. A reference server (one request at a time, MTP off, a large KV pool) gives each
   prompt's greedy answer alone.
2. The soak server (--spec-depth, a KV pool far smaller than --clients full windows, so
   requests are preempted) takes --clients concurrent streaming clients for --seconds:
   prompts of 10 tokens up to nearly the window, and per request at random one of: read
   the whole stream; disconnect after a few events; half-close the socket after sending
   (shutdown(SHUT_WR)) and read the whole answer; each request at its own MTP depth 0..--spec-depth.
3. Asserts: 0 errors (every status 200, no error event, every complete answer equal to
   its solo answer: greedy decoding is lossless at any depth and under preemption), the
   KV pool back to empty (tandem_kv_blocks_free + _checkpoint == tandem_kv_blocks,
   vllm:kv_cache_usage_perc 0), server RSS drift under 5% between the end of the warm-up
   and the end (from 40% of the run on), net of the growth of the prefix-cache checkpoints
   (a cache bounded at 8 per sequence slot, which may still be filling then; both figures printed). Prints one summary line and exits non-zero on any failure.
"""
import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


class Server:
    def __init__(self, binary, args):
        self.proc = subprocess.Popen([binary, "serve", "--host", "127.0.0.1", "--port", "0", "--quiet"] + args,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        self.log = []
        self.port = None
        got = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    got.set()
            got.set()

        threading.Thread(target=drain, daemon=True).start()
        if not got.wait(60) or not self.port:
            raise SystemExit("server did not start:\n" + "".join(self.log))
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if http("127.0.0.1", self.port, "GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise SystemExit("server not healthy:\n" + "".join(self.log))

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def metrics(self):
        _, body = http("127.0.0.1", self.port, "GET", "/metrics")
        out = {}
        for line in body.decode().splitlines():
            m = re.match(r'^([a-zA-Z_:]+)(\{[^}]*\})? ([0-9.eE+-]+)$', line)
            if m:
                out[m.group(1)] = float(m.group(3))
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def http(host, port, method, path, body=None, timeout=120):
    """One request, whole answer: (status, body bytes)."""
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else b""
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        buf = b""
        while True:
            c = s.recv(65536)
            if not c:
                break
            buf += c
    finally:
        s.close()
    head, _, rest = buf.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    if b"transfer-encoding: chunked" in head.lower():
        rest = dechunk(rest)
    return status, rest


def dechunk(b):
    out, i = b"", 0
    while i < len(b):
        j = b.find(b"\r\n", i)
        if j < 0:
            break
        n = int(b[i:j].split(b";")[0], 16)
        if n == 0:
            break
        out += b[j + 2:j + 2 + n]
        i = j + 2 + n + 2
    return out


def stream(port, body, mode, rng, timeout=120):
    """A streamed completion over a raw socket. mode: full | disconnect | halfclose.
    Returns (status, text, error_event, complete)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    data = json.dumps(dict(body, stream=True)).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(data) + data)
    if mode == "halfclose":
        s.shutdown(socket.SHUT_WR)
    cut = rng.randint(1, 6) if mode == "disconnect" else None
    buf, text, err, done, events = b"", "", None, False, 0
    status = None
    try:
        while not done:
            c = s.recv(65536)
            if not c:
                break
            buf += c
            if status is None and b"\r\n\r\n" in buf:
                head, _, buf = buf.partition(b"\r\n\r\n")
                status = int(head.split()[1])
                chunked = b"transfer-encoding: chunked" in head.lower()
            if status is None:
                continue
            payload = dechunk(buf) if chunked else buf
            lines = payload.decode("utf-8", "replace").split("\n")
            text, events = "", 0
            for line in lines:
                if not line.startswith("data: "):
                    continue
                d = line[6:].strip()
                if d == "[DONE]":
                    done = True
                    break
                try:
                    ev = json.loads(d)
                except ValueError:
                    continue  # a partial line: read on
                events += 1
                if "error" in ev:
                    err = ev["error"]
                for ch in ev.get("choices", []):
                    text += ch.get("text", "")
            if cut is not None and events >= cut:
                break
    finally:
        s.close()
    return status, text, err, done


def build_prompts(n, window, max_tokens, port, rng):
    words = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().split()
    out = []
    for i in range(n):
        target = 10 if i == 0 else rng.randint(10, window - max_tokens - 8)
        start = rng.randrange(len(words) - 1)
        text, ntok = "", 0
        k = 8
        while True:  # grow, then check the token count with /tokenize
            cand = " ".join((words[start:] + words)[: k])
            st, b = http("127.0.0.1", port, "POST", "/tokenize", {"prompt": cand})
            ntok2 = json.loads(b)["count"] if st == 200 else 0
            if ntok2 > target or k > 20000:
                break
            text, ntok = cand, ntok2
            k = int(k * 1.4) + 1
        out.append((text or "hello", ntok))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "demo"))
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--spec-depth", type=int, default=3)
    ap.add_argument("--kv-tokens", type=int, default=3072, help="KV pool in tokens (16 clients x 1024 would be 16384)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds of load before the RSS reference is taken (default 40%% of --seconds): sessions, "
                         "scratch and the prefix-cache checkpoints (bounded) reach their size first")
    ap.add_argument("--halfclose-weight", type=int, default=1,
                    help="share of half-closing clients (weights full 7 : disconnect 2 : half-close N)")
    ap.add_argument("--threads", default="2")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    servers = []

    def hung():  # a hard bound: the soak never outlives its time by more than 10 minutes
        print("soak: FAIL: still running 10 minutes after its time; stopping", flush=True)
        for sv in servers:
            if sv.proc.poll() is None:
                sv.proc.kill()
        os._exit(2)

    watchdog = threading.Timer(a.seconds + 600, hung)
    watchdog.daemon = True
    watchdog.start()
    common = ["-m", a.model, "--served-model-name", "demo", "-t", a.threads, "--max-model-len", str(a.window), "--generation-config", "none"]

    ref = Server(a.bin, common + ["--spec-depth", "0", "--max-num-seqs", "1"])
    servers.append(ref)
    try:
        prompts = build_prompts(a.prompts, a.window, a.max_tokens, ref.port, rng)
        solo = []
        for text, _ in prompts:
            st, b = http("127.0.0.1", ref.port, "POST", "/v1/completions",
                         {"model": "demo", "prompt": text, "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True})
            if st != 200:
                raise SystemExit(f"reference request failed: {st} {b[:200]}")
            solo.append(json.loads(b)["choices"][0]["text"])
    finally:
        ref.stop()

    srv = Server(a.bin, common + ["--spec-depth", str(a.spec_depth), "--max-num-seqs", str(min(a.clients, 16)),
                                  "--kv-cache-memory", str(kv_bytes(a, common))])
    servers.append(srv)
    lock = threading.Lock()
    stats = {"requests": 0, "complete": 0, "disconnects": 0, "halfcloses": 0, "errors": 0, "mismatch": 0,
             "tokens": 0, "first_errors": []}
    deadline = time.time() + a.seconds
    warm = {"rss": None}
    t_warm = time.time() + min(20.0, a.seconds / 4)  # fallback reference

    def client(ci):
        r = random.Random(a.seed * 1000 + ci)
        while time.time() < deadline:
            i = r.randrange(len(prompts))
            mode = r.choices(["full", "disconnect", "halfclose"], weights=[7, 2, a.halfclose_weight])[0]
            body = {"model": "demo", "prompt": prompts[i][0], "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True,
                    "num_speculative_tokens": r.randint(0, a.spec_depth)}  # mixed depths (tandem extension)
            try:
                st, text, err, done = stream(srv.port, body, mode, r)
            except OSError as e:
                st, text, err, done = None, "", str(e), False
            with lock:
                stats["requests"] += 1
                if mode == "disconnect" and not done:
                    stats["disconnects"] += 1
                    ok = st == 200 and err is None
                else:
                    if mode == "halfclose":
                        stats["halfcloses"] += 1
                    ok = st == 200 and err is None and done and text == solo[i]
                    if ok:
                        stats["complete"] += 1
                    elif st == 200 and err is None and done:
                        stats["mismatch"] += 1
                if not ok:
                    stats["errors"] += 1
                    if len(stats["first_errors"]) < 5:
                        stats["first_errors"].append(f"{mode} prompt {i} ({prompts[i][1]} tokens): status {st} "
                                                     f"error {err!r} done {done} text {text[:60]!r} want {solo[i][:60]!r}")
                if warm["rss"] is None and time.time() >= t_warm:
                    warm["rss"] = srv.rss_kib()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    t0 = time.time()
    for t in threads:
        t.start()
    # RSS every tenth of the run: the drift is measured from 40% of the run (sessions,
    # scratch and the prefix-cache checkpoints have reached their size by then) to the end
    samples, ckb = [], []
    t_ref = t0 + (a.warmup if a.warmup is not None else 0.4 * a.seconds)
    while any(t.is_alive() for t in threads):
        time.sleep(max(1.0, a.seconds / 10))
        samples.append(srv.rss_kib())
        try:
            ckb.append(srv.metrics().get("tandem_prefix_checkpoint_bytes", 0) / 1048576)
        except OSError:
            ckb.append(float("nan"))
        if time.time() >= t_ref and warm.get("ref") is None:
            warm["ref"], warm["ck_ref"] = samples[-1], ckb[-1]
    for t in threads:
        t.join()
    warm["rss"] = warm.get("ref") or warm["rss"]
    elapsed = time.time() - t0
    time.sleep(1.0)  # let the scheduler retire the last (disconnected) requests
    m = srv.metrics()
    rss_end = srv.rss_kib()
    rc = srv.stop()
    rss_warm = warm["rss"] or rss_end
    drift_raw = (rss_end - rss_warm) / rss_warm * 100 if rss_warm else 0.0
    # the prefix-cache checkpoints are a bounded cache (8 per sequence slot) that may still be
    # filling after the warm-up: their growth is counted out of the drift, which is meant to
    # catch what is not bounded (leaks)
    ck_ref = warm.get("ck_ref", float("nan"))
    ck_end = m.get("tandem_prefix_checkpoint_bytes", 0) / 1048576
    ck_growth_kib = (ck_end - ck_ref) * 1024 if ck_ref == ck_ref else 0.0
    drift = (rss_end - rss_warm - ck_growth_kib) / rss_warm * 100 if rss_warm else 0.0
    blocks, free, ck = m.get("tandem_kv_blocks", -1), m.get("tandem_kv_blocks_free", -2), m.get("tandem_kv_blocks_checkpoint", 0)
    checks = {
        "0 errors": stats["errors"] == 0,
        "KV pool back to empty": blocks > 0 and free + ck == blocks and m.get("vllm:kv_cache_usage_perc", 1) == 0,
        "RSS drift < 5% (net of the bounded checkpoint cache)": drift < 5.0,
        "clean exit": rc == 0,
    }
    lens = sorted(n for _, n in prompts)
    print(f"soak: {elapsed:.0f} s, {a.clients} clients, depth {a.spec_depth}, window {a.window}, prompts {lens[0]}-{lens[-1]} tokens, "
          f"KV pool {int(blocks)} blocks; "
          f"requests {stats['requests']} (complete and equal to solo {stats['complete']}, disconnects {stats['disconnects']}, "
          f"half-closes {stats['halfcloses']}), generated tokens {int(m.get('vllm:generation_tokens_total', 0))}, "
          f"preemptions {int(m.get('vllm:num_preemptions_total', 0))}, errors {stats['errors']} (mismatches {stats['mismatch']}); "
          f"KV free {int(free)} + checkpoint {int(ck)} of {int(blocks)}; RSS {rss_warm / 1024:.1f} -> {rss_end / 1024:.1f} MiB "
          f"({drift_raw:+.2f}%; {drift:+.2f}% net of the checkpoints' growth of {ck_growth_kib / 1024:.1f} MiB); RSS samples MiB {' '.join(f'{x / 1024:.1f}' for x in samples)}; "
          f"prefix-checkpoint MiB {' '.join(f'{x:.1f}' for x in ckb)}")
    for e in stats["first_errors"]:
        print("  error:", e)
    failed = [k for k, v in checks.items() if not v]
    print("soak: " + ("PASS" if not failed else "FAIL: " + ", ".join(failed)))
    return 1 if failed else 0


def kv_bytes(a, common):
    """--kv-tokens of KV for this model at this depth, from `tandem plan --device cpu`."""
    p = subprocess.run([a.bin, "plan", "--device", "cpu", "-m", a.model, "--spec-depth", str(a.spec_depth)],
                       capture_output=True, text=True, cwd=ROOT)
    m = re.search(r"KV pool \((\d+) blocks\)\s*\|[^|]*\|\s*(\d+)", p.stdout)
    if not m:
        raise SystemExit("cannot read the KV pool size from tandem plan:\n" + p.stdout + p.stderr)
    per_token = int(m.group(2)) / (int(m.group(1)) * 16)
    return int(per_token * a.kv_tokens)


if __name__ == "__main__":
    sys.exit(main())

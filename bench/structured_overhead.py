#!/usr/bin/env python3
"""Mask overhead of structured outputs (issue 17): decode tokens/s of the same server with and
without an output constraint, side by side, alternating, medians.

  python3 bench/structured_overhead.py [--bin build/tandem] [--model models/demo] [--rounds 5]
      [--tokens 256] [--depths 0,3]

Starts `tandem serve` on 127.0.0.1 (a free port), streams each request and times decode from the
first token to the last (so prefill and grammar compilation are out of it). Constraints:
  none     no constraint
  regex    structured_outputs regex "[^<>]*" (one grammar state: the cached-mask path)
  schema   a JSON schema {"text": string} with a long string (the JSON in-string state, cached)
  enumish  a JSON schema of 40 fields of bounded strings (many distinct states: the cold path)
All requests are greedy with ignore_eos; a constraint that completes ends its request earlier,
so tokens/s is measured per request over the tokens it produced."""
import argparse, json, os, re, socket, statistics, subprocess, sys, threading, time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default="build/tandem")
ap.add_argument("--model", default="models/demo")
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--tokens", type=int, default=256)
ap.add_argument("--depths", default="0,3")
ap.add_argument("--threads", type=int, default=1)
a = ap.parse_args()

proc = subprocess.Popen([a.bin, "serve", "-m", a.model, "--host", "127.0.0.1", "--port", "0", "-t", str(a.threads), "--quiet",
                         "--spec-depth", "4"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
port = None
for line in proc.stderr:
    m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    if m:
        port = int(m.group(1))
        break
threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
base = f"http://127.0.0.1:{port}"
for _ in range(100):
    try:
        urllib.request.urlopen(base + "/health", timeout=2)
        break
    except Exception:
        time.sleep(0.2)

fields = {f"f{i}": {"type": "string", "maxLength": 6} for i in range(40)}
CONS = {
    "none": {},
    "regex": {"structured_outputs": {"regex": "[^<>]*"}},
    "schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}},
    "enumish": {"response_format": {"type": "json_schema", "json_schema": {"name": "e", "schema": {
        "type": "object", "properties": fields, "required": list(fields)}}}},
}


def run(cons, depth):
    body = {"messages": [{"role": "user", "content": "Write a long story about a robot."}], "max_tokens": a.tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "num_speculative_tokens": depth,
            "stream_options": {"include_usage": True}}
    body.update(CONS[cons])
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t_first = t_last = None
    n = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                n = d["usage"]["completion_tokens"]
            if any((c.get("delta") or {}).get("content") for c in d.get("choices", [])):
                t_last = time.time()
                t_first = t_first or t_last
    return (n - 1) / (t_last - t_first) if n > 1 and t_last > t_first else float("nan"), n


depths = [int(x) for x in a.depths.split(",")]
res = {(c, d): [] for c in CONS for d in depths}
toks = {}
for c in CONS:  # warm-up: compiles each grammar once
    run(c, 0)
for r in range(a.rounds):
    for d in depths:
        for c in CONS:
            tps, n = run(c, d)
            res[(c, d)].append(tps)
            toks[(c, d)] = n
proc.terminate()
proc.wait(10)
isa = subprocess.run([a.bin, "kernels", "--mm-mb", "0", "--probe-mb", "16", "--prefill", "0", "--reps", "1"],
                     capture_output=True, text=True).stdout
isa = next((l for l in isa.splitlines() if "isa" in l.lower()), "").strip()
print(f"structured-output mask overhead, {a.model}, {a.rounds} rounds alternating, greedy, {a.threads} thread(s); {isa}")
print("| depth | constraint | tokens | decode tok/s (median) | vs none |")
print("|---|---|---|---|---|")
for d in depths:
    ref = statistics.median(res[("none", d)])
    for c in CONS:
        m = statistics.median(res[(c, d)])
        print(f"| {d} | {c} | {toks[(c, d)]} | {m:.0f} | {m / ref:.3f} |")

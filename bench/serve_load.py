#!/usr/bin/env python3
"""Concurrent-client load on a running OpenAI-compatible server (tandem
serve, vLLM, llama.cpp): requests/s and generated tokens/s with C clients.

    python bench/serve_load.py --url http://127.0.0.1:8000/v1 --clients 1,4,16 --requests 32 --max-tokens 64

Each client sends chat requests back to back (one at a time), prompts drawn
from bench/prompts/. Only loopback servers are meant; the loop is bounded by
--requests per setting. Prints a markdown table.

--num-speculative-tokens N sends tandem's per-request depth (at most the
server's --spec-depth; 0: no drafting), so one warm server can run depth 0
and `auto` side by side. --salt S starts every prompt with "[S-i] " (i the
request's number), so a later round does not reuse an earlier one's prefix
cache entries.
"""
import argparse, glob, os, statistics, threading, time
from openai import OpenAI

def prompts():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts")
    out = []
    for p in sorted(glob.glob(os.path.join(root, "*", "*"))):
        with open(p, encoding="utf-8") as f:
            out.append(f.read())
    return out or ["Write a Python function that reverses a string."]

def run(client, model, n_clients, n_requests, max_tokens, texts, depth=None, salt=None):
    lock = threading.Lock()
    state = {"next": 0, "tokens": 0, "done": 0, "lat": []}
    def worker():
        while True:
            with lock:
                i = state["next"]
                if i >= n_requests:
                    return
                state["next"] += 1
            t0 = time.perf_counter()
            text = texts[i % len(texts)] if salt is None else f"[{salt}-{i}] " + texts[i % len(texts)]
            extra = {"chat_template_kwargs": {"enable_thinking": False}}
            if depth is not None:
                extra["num_speculative_tokens"] = depth
            r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                               max_tokens=max_tokens, temperature=0, extra_body=extra)
            dt = time.perf_counter() - t0
            with lock:
                state["tokens"] += r.usage.completion_tokens
                state["done"] += 1
                state["lat"].append(dt)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(n_clients)]
    for t in threads: t.start()
    for t in threads: t.join()
    wall = time.perf_counter() - t0
    return state["done"] / wall, state["tokens"] / wall, statistics.median(state["lat"])

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--num-speculative-tokens", type=int, default=None, help="per-request draft depth (tandem)")
    ap.add_argument("--salt", default=None, help="prefix every prompt with [SALT-i]")
    a = ap.parse_args()
    client = OpenAI(base_url=a.url, api_key=a.api_key, timeout=600)
    model = client.models.list().data[0].id
    texts = prompts()
    print(f"| clients | requests/s | generated tokens/s | median latency (s) |\n|---|---|---|---|")
    for c in [int(x) for x in a.clients.split(",")]:
        rps, tps, lat = run(client, model, c, max(a.requests, c), a.max_tokens, texts, a.num_speculative_tokens, a.salt)
        print(f"| {c} | {rps:.2f} | {tps:.1f} | {lat:.2f} |", flush=True)

if __name__ == "__main__":
    main()

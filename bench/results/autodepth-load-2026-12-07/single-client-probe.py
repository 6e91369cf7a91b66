import sys, time, glob, os, json, statistics, requests
url, depth = sys.argv[1], sys.argv[2]
texts = [open(p).read() for p in sorted(glob.glob('bench/prompts/*/*'))]
ttft, dec = [], []
for i, t in enumerate(texts):
    body = {"model": "rand27b-mtp", "messages": [{"role": "user", "content": f"[{sys.argv[3]}-{i}] " + t}], "max_tokens": 64, "temperature": 0,
            "stream": True, "chat_template_kwargs": {"enable_thinking": False}}
    if depth != "-": body["num_speculative_tokens"] = int(depth)
    t0 = time.perf_counter(); t1 = None; n = 0
    with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]": continue
            d = json.loads(line[6:])
            if d.get("choices") and (d["choices"][0]["delta"].get("content") or d["choices"][0]["delta"].get("reasoning_content")):
                n += 1
                if t1 is None: t1 = time.perf_counter()
    t2 = time.perf_counter()
    ttft.append(t1 - t0); dec.append((t2 - t1))
print(f"ttft sum {sum(ttft):.2f} s, decode sum {sum(dec):.2f} s, total {sum(ttft)+sum(dec):.2f}")

"""Measures MTP acceptance of models/demo with the C engine (build/tandem run --stats).

Prompts: the first user message of held-out chat transcripts (valid.jsonl of the corpus,
never trained on) of each task: edit (paste a file, ask for a small edit -> the model
copies), code (function from a one-line spec), explain (prose). Greedy
(--temperature 0), --chat (enable_thinking=false), -n tokens, spec depth 1 and 4.
Sums drafts / accepted over the prompts and prints a markdown table; writes JSON.

Run: /work/venv-ref/bin/python tools/train/measure.py [--n-prompts 6] [--tokens 96]
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))


def user_of(text):
    m = re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", text, re.S)
    return m.group(1) if m else None


def run(model, prompt, depth, n, threads):
    p = subprocess.run([os.path.join(REPO, "build", "tandem"), "run", "-m", model, "-p", prompt,
                        "--chat", "-n", str(n), "--temperature", "0", "--spec-depth", str(depth),
                        "--stats", "-t", str(threads)], capture_output=True, text=True, timeout=600)
    if p.returncode:
        raise RuntimeError(p.stderr[-2000:])
    err = p.stderr
    m = re.search(r"drafts (\d+), draft tokens (\d+), accepted (\d+)", err)
    per = [int(a) for a in re.findall(r"^\| \d+ \| (\d+) \|", err, re.M)]
    return {"drafts": int(m.group(1)), "draft_tokens": int(m.group(2)), "accepted": int(m.group(3)),
            "per_pos": per, "text": p.stdout}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(REPO, "models", "demo"))
    ap.add_argument("--corpus", default="/work/train7/corpus")
    ap.add_argument("--n-prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="/work/train7/acceptance.json")
    args = ap.parse_args()
    docs = [json.loads(l) for l in open(os.path.join(args.corpus, "valid.jsonl"))]
    res = {}
    for task in ("edit", "code", "explain"):
        prompts = [user_of(d["text"]) for d in docs if d["kind"] == task]
        prompts = [p for p in prompts if p][:args.n_prompts]
        for depth in (1, 4):
            agg = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0] * depth}
            for i, p in enumerate(prompts):
                r = run(args.model, p, depth, args.tokens, args.threads)
                for k in ("drafts", "draft_tokens", "accepted"):
                    agg[k] += r[k]
                for j, a in enumerate(r["per_pos"][:depth]):
                    agg["per_pos"][j] += a
                if depth == 1 and i == 0:
                    agg["sample_prompt"] = p
                    agg["sample_output"] = r["text"]
            agg["rate"] = agg["accepted"] / max(1, agg["draft_tokens"])
            agg["per_pos_rate"] = [a / max(1, agg["drafts"]) for a in agg["per_pos"]]
            agg["mean_accept_len"] = 1 + agg["accepted"] / max(1, agg["drafts"])
            agg["prompts"] = len(prompts)
            res[f"{task}/d{depth}"] = agg
            print(task, depth, f"{100 * agg['rate']:.1f}%",
                  [f"{100 * x:.1f}%" for x in agg["per_pos_rate"]], flush=True)
    json.dump(res, open(args.out, "w"), indent=1)
    print("\n| task | depth-1 acceptance | depth 4: pos 1 | pos 2 | pos 3 | pos 4 | mean accepted length (d4) |")
    print("|---|---|---|---|---|---|---|")
    for task in ("edit", "code", "explain"):
        a, b = res[f"{task}/d1"], res[f"{task}/d4"]
        print(f"| {task} | {100 * a['rate']:.1f}% | " +
              " | ".join(f"{100 * x:.1f}%" for x in b["per_pos_rate"]) +
              f" | {b['mean_accept_len']:.2f} |")


if __name__ == "__main__":
    sys.exit(main())

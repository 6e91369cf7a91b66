"""Measures MTP acceptance of models/demo with the C engine (build/tandem run --stats).

Prompts: the first user message of held-out chat transcripts (valid.jsonl of the corpus,
never trained on) of each task: edit (paste a file, ask for a small edit -> the model
copies), code (function from a one-line spec), explain (prose). Greedy
(--temperature 0), --chat (enable_thinking=false), -n tokens, spec depth 1 and 4.
Sums drafts / accepted over the prompts and prints a markdown table; writes JSON.
Two checks that the acceptance is not bought with degenerate text: how much of the output
equals the start of the held-out reference answer (for edit: did it copy the file?), and
the share of the output's word 6-grams that repeat earlier ones (loops are easy to draft).

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


def assistant_of(text):
    m = re.search(r"<\|im_start\|>assistant\n(?:<think>\n\n</think>\n\n)?(.*?)<\|im_end\|>", text, re.S)
    return m.group(1) if m else ""


def prefix_match(out, ref):
    """Share of the generated text (up to the reference's length) that equals the reference's start."""
    n = min(len(out), len(ref))
    i = 0
    while i < n and out[i] == ref[i]:
        i += 1
    return i / max(1, n)


def repeat_share(out, k=6):
    """Share of the output's word k-grams that already occurred earlier in it (loops)."""
    w = out.split()
    grams = [tuple(w[i:i + k]) for i in range(len(w) - k + 1)]
    seen, rep = set(), 0
    for g in grams:
        rep += g in seen
        seen.add(g)
    return rep / max(1, len(grams))


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
    ap.add_argument("--corpus", default="build/train7/corpus")
    ap.add_argument("--n-prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="build/train7/acceptance.json")
    args = ap.parse_args()
    docs = [json.loads(l) for l in open(os.path.join(args.corpus, "valid.jsonl"))]
    res = {}
    for task in ("edit", "code", "explain"):
        pairs = [(user_of(d["text"]), assistant_of(d["text"])) for d in docs if d["kind"] == task]
        pairs = [pr for pr in pairs if pr[0]][:args.n_prompts]
        prompts = [pr[0] for pr in pairs]
        for depth in (1, 4):
            agg = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0] * depth, "prefix_match": [],
                   "repeat_share": []}
            for i, p in enumerate(prompts):
                r = run(args.model, p, depth, args.tokens, args.threads)
                for k in ("drafts", "draft_tokens", "accepted"):
                    agg[k] += r[k]
                for j, a in enumerate(r["per_pos"][:depth]):
                    agg["per_pos"][j] += a
                agg["prefix_match"].append(prefix_match(r["text"].strip(), pairs[i][1].strip()))
                agg["repeat_share"].append(repeat_share(r["text"]))
                if depth == 1 and i == 0:
                    agg["sample_prompt"] = p
                    agg["sample_output"] = r["text"]
            agg["rate"] = agg["accepted"] / max(1, agg["draft_tokens"])
            agg["per_pos_rate"] = [a / max(1, agg["drafts"]) for a in agg["per_pos"]]
            agg["mean_accept_len"] = 1 + agg["accepted"] / max(1, agg["drafts"])
            agg["prompts"] = len(prompts)
            agg["prefix_match_mean"] = sum(agg["prefix_match"]) / max(1, len(prompts))
            agg["repeat_share_mean"] = sum(agg["repeat_share"]) / max(1, len(prompts))
            res[f"{task}/d{depth}"] = agg
            print(task, depth, f"{100 * agg['rate']:.1f}%",
                  [f"{100 * x:.1f}%" for x in agg["per_pos_rate"]], flush=True)
    json.dump(res, open(args.out, "w"), indent=1)
    print("\n| task | depth-1 acceptance | depth 4: pos 1 | pos 2 | pos 3 | pos 4 | mean accepted length (d4) "
          "| output = reference start (share) | repeated 6-grams in the output |")
    print("|---|---|---|---|---|---|---|---|---|")
    for task in ("edit", "code", "explain"):
        a, b = res[f"{task}/d1"], res[f"{task}/d4"]
        print(f"| {task} | {100 * a['rate']:.1f}% | " +
              " | ".join(f"{100 * x:.1f}%" for x in b["per_pos_rate"]) +
              f" | {b['mean_accept_len']:.2f} | {100 * a['prefix_match_mean']:.0f}% | {100 * a['repeat_share_mean']:.0f}% |")


if __name__ == "__main__":
    sys.exit(main())

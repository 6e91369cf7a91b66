"""Checks that build/tandem and transformers agree on models/demo: greedy continuation of
a chat prompt (48 tokens, no speculation and with --spec-depth 3) must give the same text.

Run: /work/venv-ref/bin/python tools/train/agree.py
"""
import os, subprocess, sys
import torch
from transformers import Qwen3_5ForCausalLM
from transformers.utils.chat_template_utils import render_jinja_template
from tokenizers import Tokenizer

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
D = os.path.join(REPO, "models", "demo")
torch.set_num_threads(1)
user = "Write a Python function `add(a, b)` that returns the sum of a and b."
import json
tpl = json.load(open(os.path.join(D, "tokenizer_config.json")))["chat_template"]
r = render_jinja_template([[{"role": "user", "content": user}]], chat_template=tpl,
                          add_generation_prompt=True, enable_thinking=False)
prompt = (r[0] if isinstance(r, tuple) else r)[0]
tok = Tokenizer.from_file(os.path.join(D, "tokenizer.json"))
m = Qwen3_5ForCausalLM.from_pretrained(D, dtype=torch.float32).eval()
ids = torch.tensor([tok.encode(prompt, add_special_tokens=False).ids])
with torch.no_grad():
    out = m.generate(ids, max_new_tokens=48, do_sample=False, eos_token_id=[8187, 8185])
hf = tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
ok = True
for depth in ("0", "3"):
    p = subprocess.run([os.path.join(REPO, "build", "tandem"), "run", "-m", D, "-p", user, "--chat",
                        "-n", "48", "--temperature", "0", "--spec-depth", depth, "-t", "1"],
                       capture_output=True, text=True)
    same = p.stdout.rstrip("\n") == hf.rstrip("\n")
    ok &= same
    print(f"spec-depth {depth}: tandem {'==' if same else '!='} transformers")
    if not same:
        print("tandem:      ", repr(p.stdout[:300])); print("transformers:", repr(hf[:300]))
print("OK" if ok else "MISMATCH")
sys.exit(0 if ok else 1)

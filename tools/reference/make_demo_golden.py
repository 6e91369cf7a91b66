#!/usr/bin/env python3
"""Reference logits of the shipped demo model (models/demo) from transformers,
computed in float32 from its bf16 weights, for tests/c/test_demo.c.

Writes tests/golden/demo-reference.safetensors:
  prompt        I32 [T]      a rendered chat prompt, tokenized with tokenizers
  logits_tail   F32 [8, V]   prefill logits of the last 8 prompt positions
  greedy        I32 [32]     greedy continuation (cached decoding)
Run: /work/venv-ref/bin/python tools/reference/make_demo_golden.py
"""
import json, os
import numpy as np
import torch
from safetensors.numpy import save_file
from tokenizers import Tokenizer
from transformers import Qwen3_5ForCausalLM
from transformers.utils.chat_template_utils import render_jinja_template

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
D = os.path.join(REPO, "models", "demo")
torch.manual_seed(0)
tpl = json.load(open(os.path.join(D, "tokenizer_config.json")))["chat_template"]
msgs = [{"role": "user", "content": "Write a Python function `add(a, b)` that returns the sum of a and b."}]
r = render_jinja_template([msgs], chat_template=tpl, add_generation_prompt=True, enable_thinking=False)
text = (r[0] if isinstance(r, tuple) else r)[0]
ids = Tokenizer.from_file(os.path.join(D, "tokenizer.json")).encode(text, add_special_tokens=False).ids
m = Qwen3_5ForCausalLM.from_pretrained(D, dtype=torch.float32, attn_implementation="eager").eval()
x = torch.tensor([ids])
with torch.no_grad():
    logits = m(input_ids=x).logits[0]
    out = m.generate(x, max_new_tokens=32, do_sample=False, eos_token_id=None, min_new_tokens=32)
greedy = out[0, len(ids):].numpy().astype(np.int32)
save_file({"prompt": np.array(ids, np.int32), "logits_tail": logits[-8:].numpy().astype(np.float32), "greedy": greedy},
          os.path.join(REPO, "tests", "golden", "demo-reference.safetensors"), metadata={"format": "pt"})
print(len(ids), "prompt tokens; greedy", greedy.tolist()[:12], "...")

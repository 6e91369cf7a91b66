#!/usr/bin/env python3
"""Random-weight qwen3_5 model at a real config's proportions, for kernel and
llama.cpp side-by-side benchmarks (issue 9). Pure Python (no numpy/torch).

  python3 tools/bench/make_random_model.py OUT_DIR [--config C] [--hidden 2048] [--layers 12] [--vocab 16384]

Scales the config's widths by hidden/hidden_size (intermediate, heads, linear
heads, keeping head dims, GQA and value/key head ratios), keeps the layer-type
pattern, and writes BF16 weights (~1.6 GB with the defaults from the 27B
config). Values: a 1M-entry pool of uniform(-0.03, 0.03) bf16 values, each
tensor a rotation of it (content does not matter for speed). No MTP weights.
Write it outside git (e.g. build/ or /tmp)."""
import argparse, json, os, random, struct

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--config", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "configs", "qwen3.6-27b.config.json"))
ap.add_argument("--hidden", type=int, default=2048)
ap.add_argument("--layers", type=int, default=12)
ap.add_argument("--vocab", type=int, default=16384)
a = ap.parse_args()

full = json.load(open(a.config))
t = dict(full.get("text_config", full))
r = a.hidden / t["hidden_size"]
def mult(x, m): return max(m, int(round(x / m)) * m)
H = a.hidden
I = mult(t["intermediate_size"] * r, 128)
nh = max(1, round(t["num_attention_heads"] * r)); nkv = max(1, round(t["num_key_value_heads"] * r))
while nh % nkv: nh += 1
nk = max(1, round(t["linear_num_key_heads"] * r)); ratio = t["linear_num_value_heads"] // t["linear_num_key_heads"]; nv = nk * ratio
pat = t["layer_types"]
types = [pat[i % len(pat)] for i in range(a.layers)]
t.update(hidden_size=H, intermediate_size=I, num_attention_heads=nh, num_key_value_heads=nkv, linear_num_key_heads=nk,
         linear_num_value_heads=nv, num_hidden_layers=a.layers, layer_types=types, vocab_size=a.vocab,
         bos_token_id=1, eos_token_id=2, pad_token_id=None, dtype="bfloat16")
cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "tie_word_embeddings": False, "text_config": t}
hd, dk, dv, K = t["head_dim"], t["linear_key_head_dim"], t["linear_value_head_dim"], t["linear_conv_kernel_dim"]
gate = 2 if t.get("attn_output_gate") else 1
conv = 2 * nk * dk + nv * dv

P = "model.language_model."
ts = [(P + "embed_tokens.weight", [a.vocab, H], "w"), ("lm_head.weight", [a.vocab, H], "w"), (P + "norm.weight", [H], "z")]
for i, ty in enumerate(types):
    b = f"{P}layers.{i}."
    ts += [(b + "input_layernorm.weight", [H], "z"), (b + "post_attention_layernorm.weight", [H], "z")]
    if ty == "full_attention":
        ts += [(b + "self_attn.q_proj.weight", [nh * hd * gate, H], "w"), (b + "self_attn.k_proj.weight", [nkv * hd, H], "w"),
               (b + "self_attn.v_proj.weight", [nkv * hd, H], "w"), (b + "self_attn.o_proj.weight", [H, nh * hd], "w"),
               (b + "self_attn.q_norm.weight", [hd], "z"), (b + "self_attn.k_norm.weight", [hd], "z")]
    else:
        ts += [(b + "linear_attn.in_proj_qkv.weight", [conv, H], "w"), (b + "linear_attn.in_proj_z.weight", [nv * dv, H], "w"),
               (b + "linear_attn.in_proj_b.weight", [nv, H], "w"), (b + "linear_attn.in_proj_a.weight", [nv, H], "w"),
               (b + "linear_attn.out_proj.weight", [H, nv * dv], "w"), (b + "linear_attn.conv1d.weight", [conv, 1, K], "w"),
               (b + "linear_attn.dt_bias", [nv], "z"), (b + "linear_attn.A_log", [nv], "z"), (b + "linear_attn.norm.weight", [dv], "z")]
    ts += [(b + "mlp.gate_proj.weight", [I, H], "w"), (b + "mlp.up_proj.weight", [I, H], "w"), (b + "mlp.down_proj.weight", [H, I], "w")]

def numel(s):
    n = 1
    for d in s: n *= d
    return n
hdr, off = {}, 0
for name, shape, _ in ts:
    nb = numel(shape) * 2
    hdr[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + nb]}
    off += nb
hj = json.dumps(hdr, separators=(",", ":")).encode()
hj += b" " * ((-(8 + len(hj))) % 64)
rng = random.Random(0)
POOL = 1 << 20
pool = bytearray()
for _ in range(POOL):
    pool += struct.pack("<f", rng.uniform(-0.03, 0.03))[2:4]
pool2 = bytes(pool) * 2
os.makedirs(a.out, exist_ok=True)
with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(hj))); f.write(hj)
    for name, shape, kind in ts:
        nb = numel(shape) * 2
        if kind == "z":
            f.write(bytes(nb)); continue
        rot = rng.randrange(POOL) * 2
        while nb > 0:
            n = min(nb, 2 * POOL)
            f.write(pool2[rot:rot + n]); nb -= n
json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=1)
json.dump({"bos_token_id": 1, "eos_token_id": 2}, open(os.path.join(a.out, "generation_config.json"), "w"))
print(f"{a.out}: hidden {H}, intermediate {I}, heads {nh}/{nkv}, linear heads {nk}/{nv}, {a.layers} layers, vocab {a.vocab}, {off/1e9:.2f} GB BF16")

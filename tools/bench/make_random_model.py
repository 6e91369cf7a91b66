#!/usr/bin/env python3
"""Random-weight qwen3_5 model at a real config's proportions, for kernel and
llama.cpp side-by-side benchmarks (issue 9). Pure Python (no numpy/torch).

  python3 tools/bench/make_random_model.py OUT_DIR [--config C] [--hidden 2048] [--layers 12] [--vocab 16384]
                                           [--mtp MIX [--tokenizer DIR]]

Scales the config's widths by hidden/hidden_size (intermediate, heads, linear
heads, keeping head dims, GQA and value/key head ratios), keeps the layer-type
pattern, and writes BF16 weights (~1.6 GB with the defaults from the 27B
config). Values: a 1M-entry pool of uniform(-0.03, 0.03) bf16 values, each
tensor a rotation of it (content does not matter for speed). No MTP weights.
Write it outside git (e.g. build/ or /tmp).

--mtp MIX (issue 18): adds a full-size MTP head (fc, one full-attention
decoder layer, norms) that partly agrees with the trunk, the construction of
tests/models/spec-partial (tools/reference/make_spec_models.py) at this size:
the trunk's layers write into the residual stream through o_proj / out_proj /
down_proj scaled by MIX, the embedding has rms 1 and the final norm weight is
0 (1 + 0), so with MIX = 0 the next token is a function of the current one,
argmax lm_head(rms(embed(x))); the MTP head gets fc = [I | 0] and a decoder
layer whose output projections are 0, so it drafts exactly that function of
the token it is given. MIX > 0 makes the trunk depend on context, so drafts
are partly right (MIX 0.05: greedy depth-1 acceptance 81-87% on the bench
prompts). Every layer, the MTP layer and the full lm_head still run at full
size, so the costs are real; the acceptance is synthetic (see the written
README.md). --tokenizer DIR copies tokenizer.json / tokenizer_config.json
from DIR and sets the vocabulary to its size (default: models/demo), so
`tandem bench` can render its prompts."""
import argparse, json, os, random, struct

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--config", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "configs", "qwen3.6-27b.config.json"))
ap.add_argument("--hidden", type=int, default=2048)
ap.add_argument("--layers", type=int, default=12)
ap.add_argument("--vocab", type=int, default=16384)
ap.add_argument("--mtp", type=float, default=None, metavar="MIX")
ap.add_argument("--tokenizer", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "demo"))
a = ap.parse_args()
if a.mtp is not None:
    tk = json.load(open(os.path.join(a.tokenizer, "tokenizer.json")))
    a.vocab = max(max(tk["model"]["vocab"].values()), max([t["id"] for t in tk.get("added_tokens", [])] or [0])) + 1
    dcfg = json.load(open(os.path.join(a.tokenizer, "config.json")))
    dcfg = dcfg.get("text_config", dcfg)
    a.vocab = max(a.vocab, dcfg.get("vocab_size", a.vocab))

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
if a.mtp is not None:
    t.update(mtp_num_hidden_layers=1, bos_token_id=dcfg.get("bos_token_id"), eos_token_id=dcfg.get("eos_token_id"))
else:
    t.pop("mtp_num_hidden_layers", None)
cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "tie_word_embeddings": False, "text_config": t}
hd, dk, dv, K = t["head_dim"], t["linear_key_head_dim"], t["linear_value_head_dim"], t["linear_conv_kernel_dim"]
gate = 2 if t.get("attn_output_gate") else 1
conv = 2 * nk * dk + nv * dv

P = "model.language_model."
M = a.mtp is not None
O = "o" if M else "w"  # the trunk's writes into the residual stream: scaled by MIX
ts = [(P + "embed_tokens.weight", [a.vocab, H], "e" if M else "w"), ("lm_head.weight", [a.vocab, H], "w"), (P + "norm.weight", [H], "z")]
def layer_tensors(b, ty, O):
    global ts
    ts += [(b + "input_layernorm.weight", [H], "z"), (b + "post_attention_layernorm.weight", [H], "z")]
    if ty == "full_attention":
        ts += [(b + "self_attn.q_proj.weight", [nh * hd * gate, H], "w"), (b + "self_attn.k_proj.weight", [nkv * hd, H], "w"),
               (b + "self_attn.v_proj.weight", [nkv * hd, H], "w"), (b + "self_attn.o_proj.weight", [H, nh * hd], O),
               (b + "self_attn.q_norm.weight", [hd], "z"), (b + "self_attn.k_norm.weight", [hd], "z")]
    else:
        ts += [(b + "linear_attn.in_proj_qkv.weight", [conv, H], "w"), (b + "linear_attn.in_proj_z.weight", [nv * dv, H], "w"),
               (b + "linear_attn.in_proj_b.weight", [nv, H], "w"), (b + "linear_attn.in_proj_a.weight", [nv, H], "w"),
               (b + "linear_attn.out_proj.weight", [H, nv * dv], O), (b + "linear_attn.conv1d.weight", [conv, 1, K], "w"),
               (b + "linear_attn.dt_bias", [nv], "z"), (b + "linear_attn.A_log", [nv], "z"), (b + "linear_attn.norm.weight", [dv], "z")]
    ts += [(b + "mlp.gate_proj.weight", [I, H], "w"), (b + "mlp.up_proj.weight", [I, H], "w"), (b + "mlp.down_proj.weight", [H, I], O)]
for i, ty in enumerate(types):
    layer_tensors(f"{P}layers.{i}.", ty, O)
if M:  # the MTP head: fc = [I | 0], a full-attention layer writing nothing, norms 1 + 0
    ts += [("mtp.fc.weight", [H, 2 * H], "i"), ("mtp.pre_fc_norm_embedding.weight", [H], "z"), ("mtp.pre_fc_norm_hidden.weight", [H], "z"),
           ("mtp.norm.weight", [H], "z")]
    layer_tensors("mtp.layers.0.", "full_attention", "z")

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
pools = {"w": pool2}
if M:
    def make_pool(lo, hi):
        p = bytearray()
        for _ in range(POOL):
            p += struct.pack("<f", rng.uniform(lo, hi))[2:4]
        return bytes(p) * 2
    pools["e"] = make_pool(-3 ** 0.5, 3 ** 0.5)       # rms 1
    pools["o"] = make_pool(-0.03 * a.mtp, 0.03 * a.mtp)
os.makedirs(a.out, exist_ok=True)
with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(hj))); f.write(hj)
    for name, shape, kind in ts:
        nb = numel(shape) * 2
        if kind == "z" or (kind == "o" and a.mtp == 0):
            f.write(bytes(nb)); continue
        if kind == "i":  # [I | 0]: row r has bf16 1.0 at column r
            rows, cols = shape
            for r_ in range(rows):
                row = bytearray(cols * 2)
                row[2 * r_:2 * r_ + 2] = b"\x80\x3f"
                f.write(row)
            continue
        pl = pools[kind]
        rot = rng.randrange(POOL) * 2
        while nb > 0:
            n = min(nb, 2 * POOL)
            f.write(pl[rot:rot + n]); nb -= n
json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=1)
if M:
    import shutil
    for fn in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(a.tokenizer, fn)): shutil.copy(os.path.join(a.tokenizer, fn), os.path.join(a.out, fn))
    open(os.path.join(a.out, "README.md"), "w").write(f"""# Random-weight qwen3_5 model with a synthetic MTP head

Written by `tools/bench/make_random_model.py --mtp {a.mtp}` (issue 18): the layer
pattern and proportions of `{os.path.basename(a.config)}` scaled to hidden {H}
({a.layers} layers, vocab {a.vocab}, {off/1e9:.2f} GB BF16), random weights, and a
full-size MTP head that partly agrees with the trunk by construction (the trunk's
residual writes scaled by {a.mtp}; the head drafts argmax lm_head(rms(embed(x)))).

**The acceptance rates it gives are synthetic**: they come from that
construction, not from a trained draft head, and say nothing about a real
model. Its step costs are real (every layer, the MTP layer and the lm_head run
at full size), which is what it is for: a memory-bound test vehicle for
speculative decoding on a CPU. Its text is meaningless (tokenizer copied from
`{a.tokenizer}`). Do not commit it.
""")
else:
    json.dump({"bos_token_id": 1, "eos_token_id": 2}, open(os.path.join(a.out, "generation_config.json"), "w"))
print(f"{a.out}: hidden {H}, intermediate {I}, heads {nh}/{nkv}, linear heads {nk}/{nv}, {a.layers} layers, vocab {a.vocab}, {off/1e9:.2f} GB BF16")

#!/usr/bin/env python3
"""Sanity-check tests/golden/ (dev-time tool).

For every model directory (tiny-*/f32, tiny-*/bf16):
  1. structure: config.json parses, index.json (if sharded) matches the shards and
     total_size, every tensor is little-endian F32/BF16, mtp.* present;
  2. transformers: reload with Qwen3_5ForCausalLM (fp32, eager), recompute prefill
     logits/hidden, the cached greedy decode and the MTP head (make_golden's wiring)
     and compare with reference-<dtype>.safetensors;
  3. from scratch: an independent token-by-token implementation written from
     tests/golden/NAMES.md (plain torch, fp32, recurrent DeltaNet, explicit RoPE,
     explicit GQA, explicit MTP) must reproduce the same logits. This is the
     executable version of the formulas the C engine follows.

Usage: /path/to/venv/bin/python tools/reference/check_golden.py [--golden tests/golden] [--skip-scratch]
Exit status 0 when everything agrees.
"""

import argparse
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_golden as mg  # noqa: E402

TOL_TF = 1e-4       # transformers vs stored reference (same code path, ~bitwise)
TOL_SCRATCH = 2e-3  # from-scratch recurrent fp32 vs transformers (chunked prefill)

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("  FAIL:", msg, flush=True)


def maxdiff(a, b):
    return float((a.float() - b.float()).abs().max())


# ----------------------------------------------------------------------------------
# 1. structure
# ----------------------------------------------------------------------------------

def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def check_structure(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    tc = cfg.get("text_config", cfg)
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    idx_path = os.path.join(d, "model.safetensors.index.json")
    names = {}
    for fn in files:
        h = read_header(os.path.join(d, fn))
        check(h.get("__metadata__", {}).get("format") == "pt", f"{d}/{fn}: metadata format")
        for k, v in h.items():
            if k == "__metadata__":
                continue
            check(v["dtype"] in ("F32", "BF16"), f"{k}: dtype {v['dtype']}")
            names[k] = (fn, v)
    if os.path.exists(idx_path):
        idx = json.load(open(idx_path))
        check(set(idx["weight_map"]) == set(names), f"{d}: index weight_map != shard contents")
        for k, fn in idx["weight_map"].items():
            check(names.get(k, (None,))[0] == fn, f"{d}: {k} not in {fn}")
        total = sum(v["data_offsets"][1] - v["data_offsets"][0] for _, v in names.values())
        check(idx["metadata"]["total_size"] == total, f"{d}: total_size {idx['metadata']['total_size']} != {total}")
    else:
        check(files == ["model.safetensors"], f"{d}: files {files}")
    want_dt = "BF16" if tc["dtype"] == "bfloat16" else "F32"
    check(all(v["dtype"] == want_dt for _, v in names.values()), f"{d}: mixed dtypes")
    for k in ("mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight",
              "mtp.pre_fc_norm_hidden.weight", "mtp.layers.0.self_attn.q_proj.weight"):
        check(k in names, f"{d}: missing {k}")
    H = tc["hidden_size"]
    check(names["mtp.fc.weight"][1]["shape"] == [H, 2 * H], "mtp.fc shape")
    return cfg, tc


# ----------------------------------------------------------------------------------
# 2. transformers
# ----------------------------------------------------------------------------------

@torch.no_grad()
def check_transformers(d, ref):
    model, _ = mg.load_model(d)
    tensors = mg.read_all_tensors(d)
    prompt = ref["prompt"].long()
    T = prompt.numel()
    out = model.model(input_ids=prompt[None], use_cache=False)
    hid = out.last_hidden_state[0]
    lg = model.lm_head(hid)
    check(maxdiff(lg, ref["prefill_logits"]) < TOL_TF, f"prefill_logits {maxdiff(lg, ref['prefill_logits'])}")
    check(maxdiff(hid, ref["prefill_hidden"]) < TOL_TF, "prefill_hidden")
    # cached decode, feeding the stored tokens
    from transformers.cache_utils import DynamicCache
    cache = DynamicCache(config=model.config)
    model(input_ids=prompt[None], past_key_values=cache, use_cache=True)
    dl = []
    for t in ref["decode_tokens"].tolist():
        dl.append(model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True).logits[0, -1])
    dl = torch.stack(dl)
    check(maxdiff(dl, ref["decode_logits"]) < TOL_TF, f"decode_logits {maxdiff(dl, ref['decode_logits'])}")
    g = ref["greedy"]
    check(torch.equal(g[:ref["decode_tokens"].numel()], ref["decode_tokens"]), "decode_tokens prefix of greedy")
    check(int(torch.argmax(ref["prefill_logits"][-1])) == int(g[0]), "greedy[0]")
    check(torch.equal(torch.argmax(ref["decode_logits"], -1)[:-1].int(), g[1:ref["decode_logits"].shape[0]]),
          "decode_tokens[i+1] == argmax(decode_logits[i])")
    # MTP
    mtp = mg.MTP(model, tensors)
    ml, _ = mtp.step(prompt[1:], ref["prefill_hidden"][:T - 1], torch.arange(T - 1))
    check(maxdiff(ml, ref["mtp_logits"]) < TOL_TF, f"mtp_logits {maxdiff(ml, ref['mtp_logits'])}")
    print(f"  transformers: prefill {maxdiff(lg, ref['prefill_logits']):.2e} "
          f"decode {maxdiff(dl, ref['decode_logits']):.2e} mtp {maxdiff(ml, ref['mtp_logits']):.2e}")


# ----------------------------------------------------------------------------------
# 3. from scratch (follows tests/golden/NAMES.md)
# ----------------------------------------------------------------------------------

def rms0(x, w, eps):            # zero-centred RMSNorm: (1 + w)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


def l2n(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


class Scratch:
    def __init__(self, d):
        cfg = json.load(open(os.path.join(d, "config.json")))
        c = cfg.get("text_config", cfg)
        self.c = c
        W = {}
        for k, v in mg.read_all_tensors(d).items():
            if k.startswith("model.visual."):
                continue                                  # a loader must skip these
            for p in ("model.language_model.", "model."):
                if k.startswith(p):
                    k = k[len(p):]
                    break
            W[k] = v.to(torch.float32)
        if "lm_head.weight" not in W:                     # tie_word_embeddings
            W["lm_head.weight"] = W["embed_tokens.weight"]
        self.W = W
        self.eps = c["rms_norm_eps"]
        self.H = c["hidden_size"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.nk, self.nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        self.dk, self.dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        rp = c["rope_parameters"]
        self.rot = int(self.hd * rp.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)))
        theta = rp["rope_theta"]
        i = torch.arange(self.rot // 2, dtype=torch.float32)
        self.inv_freq = 1.0 / theta ** (2 * i / self.rot)
        self.types = c["layer_types"]
        self.reset()

    def reset(self):
        K = 4
        C = 2 * self.nk * self.dk + self.nv * self.dv
        self.conv = [torch.zeros(C, K - 1) for _ in self.types]
        self.S = [torch.zeros(self.nv, self.dk, self.dv) for _ in self.types]
        self.kv = [([], []) for _ in self.types]
        self.mtp_kv = ([], [])
        self.pos = 0

    def rope(self, x, pos):     # x [heads, hd]; NeoX pairs (i, i + rot/2) on the first rot dims
        r2 = self.rot // 2
        ang = pos * self.inv_freq
        c, s = torch.cos(ang), torch.sin(ang)
        x1, x2 = x[:, :r2], x[:, r2:self.rot]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[:, self.rot:]], dim=-1)

    def attn(self, p, n, pos, kvstore):
        W, hd = self.W, self.hd
        qg = (W[p + "q_proj.weight"] @ n).view(self.nh, 2 * hd)
        q, gate = qg[:, :hd], qg[:, hd:]                 # per head [q | gate]
        k = (W[p + "k_proj.weight"] @ n).view(self.nkv, hd)
        v = (W[p + "v_proj.weight"] @ n).view(self.nkv, hd)
        q = self.rope(rms0(q, W[p + "q_norm.weight"], self.eps), pos)
        k = self.rope(rms0(k, W[p + "k_norm.weight"], self.eps), pos)
        kvstore[0].append(k)
        kvstore[1].append(v)
        Ks, Vs = torch.stack(kvstore[0]), torch.stack(kvstore[1])   # [L, nkv, hd]
        rep = self.nh // self.nkv
        out = torch.empty(self.nh, hd)
        for h in range(self.nh):
            kh = h // rep
            sc = (Ks[:, kh] @ q[h]) * hd ** -0.5
            pr = torch.softmax(sc, 0)
            out[h] = pr @ Vs[:, kh]
        o = out.reshape(-1) * torch.sigmoid(gate.reshape(-1))
        return W[p + "o_proj.weight"] @ o

    def deltanet(self, li, p, n):
        W = self.W
        nk, nv, dk, dv = self.nk, self.nv, self.dk, self.dv
        qkv = W[p + "in_proj_qkv.weight"] @ n              # [q | k | v]
        z = (W[p + "in_proj_z.weight"] @ n).view(nv, dv)
        b = W[p + "in_proj_b.weight"] @ n
        a = W[p + "in_proj_a.weight"] @ n
        win = torch.cat([self.conv[li], qkv[:, None]], dim=1)   # [C, 4], oldest first
        self.conv[li] = win[:, 1:]
        cw = W[p + "conv1d.weight"][:, 0, :]                     # [C, 4]
        x = F.silu((win * cw).sum(1))
        q = x[:nk * dk].view(nk, dk)
        k = x[nk * dk:2 * nk * dk].view(nk, dk)
        v = x[2 * nk * dk:].view(nv, dv)
        beta = torch.sigmoid(b)
        g = -torch.exp(W[p + "A_log"]) * F.softplus(a + W[p + "dt_bias"])
        q = l2n(q) * dk ** -0.5
        k = l2n(k)
        r = nv // nk
        o = torch.empty(nv, dv)
        S = self.S[li]
        for j in range(nv):
            kj, qj = k[j // r], q[j // r]
            S[j] = torch.exp(g[j]) * S[j]
            d = beta[j] * (v[j] - S[j].T @ kj)
            S[j] = S[j] + torch.outer(kj, d)
            o[j] = S[j].T @ qj
        on = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps) * W[p + "norm.weight"]
        on = on * F.silu(z)
        return W[p + "out_proj.weight"] @ on.reshape(-1)

    def layer(self, p, x, mixer):
        W = self.W
        x = x + mixer(rms0(x, W[p + "input_layernorm.weight"], self.eps))
        n = rms0(x, W[p + "post_attention_layernorm.weight"], self.eps)
        m = W[p + "mlp.down_proj.weight"] @ (F.silu(W[p + "mlp.gate_proj.weight"] @ n)
                                             * (W[p + "mlp.up_proj.weight"] @ n))
        return x + m

    @torch.no_grad()
    def token(self, t):
        """Feed one token at self.pos; returns (logits, hidden after final norm)."""
        x = self.W["embed_tokens.weight"][t]
        pos = self.pos
        for li, ty in enumerate(self.types):
            p = f"layers.{li}."
            if ty == "linear_attention":
                x = self.layer(p, x, lambda n: self.deltanet(li, p + "linear_attn.", n))
            else:
                x = self.layer(p, x, lambda n: self.attn(p + "self_attn.", n, pos, self.kv[li]))
        self.pos += 1
        h = rms0(x, self.W["norm.weight"], self.eps)
        return self.W["lm_head.weight"] @ h, h

    @torch.no_grad()
    def mtp(self, tok, h, pos):
        """One MTP entry: token tok (the one after h's position), target hidden h, position pos."""
        W = self.W
        e = rms0(W["embed_tokens.weight"][tok], W["mtp.pre_fc_norm_embedding.weight"], self.eps)
        hh = rms0(h, W["mtp.pre_fc_norm_hidden.weight"], self.eps)
        u = W["mtp.fc.weight"] @ torch.cat([e, hh])        # embedding first
        u = self.layer("mtp.layers.0.", u, lambda n: self.attn("mtp.layers.0.self_attn.", n, pos, self.mtp_kv))
        hn = rms0(u, W["mtp.norm.weight"], self.eps)
        return W["lm_head.weight"] @ hn, hn


def check_scratch(d, ref):
    s = Scratch(d)
    prompt = ref["prompt"].tolist()
    T = len(prompt)
    pl, ph = [], []
    for t in prompt:
        lg, h = s.token(t)
        pl.append(lg)
        ph.append(h)
    pl, ph = torch.stack(pl), torch.stack(ph)
    dl = torch.stack([s.token(t)[0] for t in ref["decode_tokens"].tolist()])
    ml = torch.stack([s.mtp(prompt[t + 1], ph[t], t)[0] for t in range(T - 1)])
    cl, ct = [], []
    tok, h, pos = int(ref["greedy"][0]), ph[T - 1], T - 1
    for _ in range(ref["mtp_chain_tokens"].numel()):
        lg, hn = s.mtp(tok, h, pos)
        cl.append(lg)
        tok, h, pos = int(torch.argmax(lg)), hn, pos + 1
        ct.append(tok)
    cl = torch.stack(cl)
    r = {"prefill_logits": maxdiff(pl, ref["prefill_logits"]),
         "prefill_hidden": maxdiff(ph, ref["prefill_hidden"]),
         "decode_logits": maxdiff(dl, ref["decode_logits"]),
         "mtp_logits": maxdiff(ml, ref["mtp_logits"]),
         "mtp_chain_logits": maxdiff(cl, ref["mtp_chain_logits"])}
    for k, v in r.items():
        check(v < TOL_SCRATCH, f"scratch {k} {v}")
    check(ct == ref["mtp_chain_tokens"].tolist(), f"scratch chain tokens {ct} vs {ref['mtp_chain_tokens'].tolist()}")
    print("  scratch: " + " ".join(f"{k} {v:.2e}" for k, v in r.items()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--golden", default=os.path.join(mg.REPO, "tests", "golden"))
    ap.add_argument("--skip-scratch", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name in sorted(os.listdir(args.golden)):
        root = os.path.join(args.golden, name)
        if not os.path.isdir(root):
            continue
        for dt in ("f32", "bf16"):
            d = os.path.join(root, dt)
            print(f"{name}/{dt}", flush=True)
            ref = load_file(os.path.join(root, f"reference-{dt}.safetensors"))
            with safe_open(os.path.join(root, f"reference-{dt}.safetensors"), "pt") as f:
                check(sorted(f.keys()) == sorted(["prompt", "prefill_logits", "prefill_hidden",
                                                  "decode_tokens", "decode_logits", "greedy",
                                                  "greedy_margin", "mtp_logits", "mtp_chain_tokens",
                                                  "mtp_chain_logits"]), "reference tensor names")
            check_structure(d)
            check_transformers(d, ref)
            if not args.skip_scratch:
                check_scratch(d, ref)
    print("OK" if not failures else f"{len(failures)} FAILURES")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Trains the demo qwen3_5 model (trunk + MTP head) on the corpus of build_corpus.py.

The trunk is transformers' own Qwen3_5ForCausalLM (Qwen3_5TextConfig): Gated DeltaNet
and gated full-attention layers, partial RoPE, tied embeddings.

The MTP head follows vLLM's qwen3_5_mtp.py / docs/reference-notes.md §3 exactly:
    e  = RMS(embed(x_{t+1}); pre_fc_norm_embedding)     (zero-centred (1+w) norms)
    h  = RMS(h_t; pre_fc_norm_hidden)                   h_t = trunk output AFTER final norm
    u  = fc(concat(e, h))                               embedding first
    u  = Qwen3_5DecoderLayer(full_attention)(u)         causal over MTP positions, RoPE pos t
    h' = RMS(u; mtp.norm); logits = lm_head(h')         shared (tied) lm_head
The MTP entry at position t predicts token t+2.

Training (one run, --phase joint, then optionally --phase mtp):
  joint: trunk loss = CE(next token); MTP loss = KL(trunk's distribution at t+1 || MTP at t)
         (self-distillation: what the trunk will verify is what the draft should predict),
         with stop-gradient on everything the MTP reads from the trunk (h_t, embedding,
         lm_head), so the trunk trains exactly as without an MTP head and the head keeps
         up with it at ~15% extra cost.
  mtp:   trunk frozen, only the MTP head trains (same loss) - a short polish against the
         final trunk.
The learning rate follows a cosine over the *wall-clock* budget (--minutes), so a run
that is stopped and resumed (--resume) still ends its schedule on time.

Run: /work/venv-ref/bin/python tools/train/train.py --minutes 45 [--resume] [--device cuda]
"""
import argparse
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

WORK = "build/train7"

# Sized for a 2-core CPU shared with other jobs: we got ~0.5 core, ~120 tokens/s for
# fwd+bwd of a H=256 model, so the shipped run uses H=192.
ARCH = dict(
    hidden_size=192, num_hidden_layers=6, full_attention_interval=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, partial_rotary_factor=0.25,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
    linear_value_head_dim=32, intermediate_size=512, vocab_size=8192,
)
ROPE_THETA = 10000.0


def layer_types(n, k):
    return ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(n)]


def make_config(ids, arch=ARCH):
    a = dict(arch)
    return Qwen3_5TextConfig(
        **{k: v for k, v in a.items() if k not in ("full_attention_interval", "partial_rotary_factor")},
        layer_types=layer_types(a["num_hidden_layers"], a["full_attention_interval"]),
        linear_conv_kernel_dim=4, hidden_act="silu", rms_norm_eps=1e-6,
        max_position_embeddings=4096, tie_word_embeddings=True, attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA,
                         "partial_rotary_factor": a["partial_rotary_factor"]},
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=None,
    )


class MTPHead(nn.Module):
    """vLLM qwen3_5_mtp semantics (one layer), built from transformers' modules."""

    def __init__(self, cfg):
        super().__init__()
        import copy
        c = copy.deepcopy(cfg)
        c.num_hidden_layers = 1
        c.layer_types = ["full_attention"]
        c._attn_implementation = "sdpa"   # causal when attention_mask is None
        H = cfg.hidden_size
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps)
        self.norm = Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(c, 0)])
        nn.init.normal_(self.fc.weight, std=0.02)
        for m in self.layers[0].modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, trunk, next_ids, hidden, position_ids, attention_mask=None):
        """next_ids [B,T] (token t+1), hidden [B,T,H] (trunk hidden at t, after final
        norm), position_ids [B,T] (= t). Returns (logits, h')."""
        emb = trunk.model.embed_tokens.weight.detach()
        e = self.pre_fc_norm_embedding(F.embedding(next_ids, emb))
        h = self.pre_fc_norm_hidden(hidden)
        u = self.fc(torch.cat([e, h], dim=-1))
        pe = trunk.model.rotary_emb(u, position_ids)
        u = self.layers[0](u, position_embeddings=pe, attention_mask=attention_mask,
                           position_ids=position_ids, past_key_values=None, use_cache=False)
        if isinstance(u, tuple):
            u = u[0]
        hn = self.norm(u)
        return F.linear(hn, emb), hn


# ------------------------------------------------------------------------------ data

CHAT_KINDS = {"edit": 0.5, "code": 0.15, "explain": 0.15, "tool": 0.2}
RAW_KINDS = ["py", "c", "man", "doc"]


def tokenize_corpus(corpus, tokdir, out):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(tokdir, "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    for split in ("train", "valid"):
        docs = [json.loads(l) for l in open(os.path.join(corpus, split + ".jsonl"))]
        by = {}
        for i in range(0, len(docs), 512):
            batch = docs[i:i + 512]
            enc = tok.encode_batch([d["text"] for d in batch], add_special_tokens=False)
            for d, e in zip(batch, enc):
                by.setdefault(d["kind"], []).append(np.array(e.ids + [eot], dtype=np.uint16))
        arrays = {}
        for k, lst in by.items():
            arrays[k + "__data"] = np.concatenate(lst)
            arrays[k + "__off"] = np.cumsum([0] + [len(a) for a in lst]).astype(np.int64)
        np.savez(os.path.join(out, split + ".npz"), **arrays)
        print(split, {k: (len(v) - 1) for k, v in arrays.items() if k.endswith("__off")},
              "tokens", sum(len(v) for k, v in arrays.items() if k.endswith("__data")), flush=True)


class Data:
    def __init__(self, path, L, seed, mix=None, p_chat=0.75):
        z = np.load(path)
        self.L = L
        self.mix = mix or CHAT_KINDS     # weights of the chat kinds
        self.p_chat = p_chat             # share of sequences made of chat transcripts
        self.docs = {}
        for k in CHAT_KINDS:
            if k + "__data" in z:
                d, o = z[k + "__data"], z[k + "__off"]
                self.docs[k] = [d[o[i]:o[i + 1]] for i in range(len(o) - 1)]
        self.raw = np.concatenate([z[k + "__data"] for k in RAW_KINDS if k + "__data" in z])
        self.rng = random.Random(seed)

    def raw_chunk(self, n):
        s = self.rng.randrange(0, len(self.raw) - n - 1)
        return self.raw[s:s + n]

    def sequence(self):
        L = self.L + 1
        if self.rng.random() >= self.p_chat:
            return self.raw_chunk(L)
        parts, n = [], 0
        kinds, w = zip(*[(k, v) for k, v in self.mix.items() if k in self.docs])
        while True:
            k = self.rng.choices(kinds, w)[0]
            d = self.rng.choice(self.docs[k])
            if n + len(d) > L:
                if n == 0:
                    parts.append(d[:L]); n = L
                break
            parts.append(d); n += len(d)
        if n < L:
            parts.append(self.raw_chunk(L - n))
        return np.concatenate(parts)

    def batch(self, B):
        return torch.from_numpy(np.stack([self.sequence() for _ in range(B)]).astype(np.int64))


def valid_batches(path, L, per_kind=4, seed=123):
    """Fixed held-out sequences per kind group: raw text, and each chat kind (whole docs)."""
    z = np.load(path)
    rng = random.Random(seed)
    out = {}
    raw = np.concatenate([z[k + "__data"] for k in RAW_KINDS if k + "__data" in z])
    out["raw"] = torch.from_numpy(np.stack(
        [raw[s:s + L + 1] for s in (rng.randrange(0, len(raw) - L - 2) for _ in range(per_kind * 2))]
    ).astype(np.int64))
    for k in CHAT_KINDS:
        d, o = z[k + "__data"], z[k + "__off"]
        seqs = []
        stream = np.concatenate([d[o[i]:o[i + 1]] for i in rng.sample(range(len(o) - 1), min(len(o) - 1, 40))])
        for i in range(per_kind):
            if (i + 1) * (L + 1) <= len(stream):
                seqs.append(stream[i * (L + 1):(i + 1) * (L + 1)])
        out[k] = torch.from_numpy(np.stack(seqs).astype(np.int64))
    return out


# ------------------------------------------------------------------------------ losses

def forward_losses(model, mtp, x, phase, mtp_rows=None):
    """x [B, L+1]. Returns (trunk CE, MTP KL, MTP CE vs data, MTP top-1 agreement).
    mtp_rows: train the MTP on the first mtp_rows sequences only (saves time)."""
    inp, tgt = x[:, :-1], x[:, 1:]
    B, L = inp.shape
    ctx = torch.no_grad() if phase == "mtp" else torch.enable_grad()
    with ctx:
        hs = model.model(input_ids=inp, use_cache=False).last_hidden_state   # after final norm
        logits = model.lm_head(hs)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tgt.reshape(-1))
    # MTP entry t (t = 0..L-2): token inp[t+1], hidden hs[t], position t -> predicts inp[t+2]
    if mtp_rows:
        inp, tgt, hs, logits = inp[:mtp_rows], tgt[:mtp_rows], hs[:mtp_rows], logits[:mtp_rows]
        B = inp.shape[0]
    pos = torch.arange(L - 1, device=x.device)[None].expand(B, -1)
    mlog, _ = mtp(model, inp[:, 1:], hs[:, :-1].detach(), pos)
    mlog = mlog.float()
    teacher = logits[:, 1:].detach().float()               # trunk at t+1 predicts t+2
    logp = F.log_softmax(mlog, -1)
    kl = F.kl_div(logp, F.log_softmax(teacher, -1), log_target=True, reduction="none").sum(-1).mean()
    mce = F.nll_loss(logp.reshape(-1, logp.shape[-1]), tgt[:, 1:].reshape(-1))
    agree = (mlog.argmax(-1) == teacher.argmax(-1)).float().mean()
    return ce, kl, mce, agree


@torch.no_grad()
def evaluate(model, mtp, vb, device):
    model.eval(); mtp.eval()
    res = {}
    for k, x in vb.items():
        tot = [0.0, 0.0, 0.0, 0.0]
        for i in range(0, len(x), 4):
            r = forward_losses(model, mtp, x[i:i + 4].to(device), "mtp")
            for j in range(4):
                tot[j] += float(r[j]) * len(x[i:i + 4])
        res[k] = {n: round(v / len(x), 4) for n, v in zip(("ce", "mtp_kl", "mtp_ce", "mtp_agree"), tot)}
    model.train(); mtp.train()
    return res


# ------------------------------------------------------------------------------ main

def lr_at(frac, base, warm_frac=0.03, floor=0.1):
    if frac < warm_frac:
        return base * max(frac / warm_frac, 0.02)
    p = min(1.0, (frac - warm_frac) / (1 - warm_frac))
    return base * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))


def save_ckpt(path, model, mtp, opt, state):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "mtp": mtp.state_dict(), "opt": opt.state_dict(),
                "state": state}, tmp)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=WORK)
    ap.add_argument("--phase", choices=["joint", "mtp"], default="joint")
    ap.add_argument("--minutes", type=float, default=45, help="wall-clock budget of this phase")
    ap.add_argument("--batch", type=int, default=6)
    ap.add_argument("--seq", type=int, default=384)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--mtp-weight", type=float, default=1.0)
    ap.add_argument("--mtp-frac", type=float, default=0.5, help="share of each batch the MTP trains on (joint)")
    ap.add_argument("--ckpt-every", type=float, default=180, help="seconds")
    ap.add_argument("--eval-every", type=float, default=600, help="seconds")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--init", help="checkpoint whose weights start this run (mtp phase: default joint.pt; "
                    "joint phase: a fresh optimizer and schedule on trained weights)")
    ap.add_argument("--tag", help="checkpoint name under ckpt/ (default: the phase)")
    ap.add_argument("--mix", help="chat kind weights, e.g. edit=0.8,code=0.1,explain=0.05,tool=0.05")
    ap.add_argument("--p-chat", type=float, default=0.75, help="share of sequences that are chat transcripts")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fp32", action="store_true", help="no bf16 autocast (default: autocast matmuls to bf16, CPU AMX / GPU)")
    ap.add_argument("--max-steps", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = torch.device(args.device)

    ids = json.load(open(os.path.join(args.work, "tok", "special_ids.json")))
    data_dir = os.path.join(args.work, "data")
    if not os.path.exists(os.path.join(data_dir, "valid.npz")):
        os.makedirs(data_dir, exist_ok=True)
        tokenize_corpus(os.path.join(args.work, "corpus"), os.path.join(args.work, "tok"), data_dir)

    cfg = make_config(ids)
    cfg._attn_implementation = "sdpa"
    model = Qwen3_5ForCausalLM(cfg).to(dev)
    mtp = MTPHead(model.config).to(dev)
    n_trunk = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    print(f"params: trunk {n_trunk / 1e6:.2f}M (tied), mtp {n_mtp / 1e6:.2f}M", flush=True)

    ckdir = os.path.join(args.work, "ckpt")
    os.makedirs(ckdir, exist_ok=True)
    ck_path = os.path.join(ckdir, f"{args.tag or args.phase}.pt")
    if args.phase == "mtp":
        for p in model.parameters():
            p.requires_grad_(False)
        params = list(mtp.parameters())
    else:
        params = list(model.parameters()) + list(mtp.parameters())
    decay = [p for p in params if p.ndim >= 2]
    nodecay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": nodecay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    state = {"step": 0, "elapsed": 0.0, "tokens": 0, "log": [], "evals": [], "args": vars(args)}
    if args.resume and os.path.exists(ck_path):
        ck = torch.load(ck_path, map_location=dev, weights_only=False)
        model.load_state_dict(ck["model"]); mtp.load_state_dict(ck["mtp"])
        opt.load_state_dict(ck["opt"]); state = ck["state"]
        print(f"resumed {ck_path} at step {state['step']}, {state['elapsed']:.0f}s", flush=True)
    elif args.phase == "mtp" or args.init:
        init = args.init or os.path.join(ckdir, "joint.pt")
        ck = torch.load(init, map_location=dev, weights_only=False)
        model.load_state_dict(ck["model"]); mtp.load_state_dict(ck["mtp"])
        state["init"] = {"path": init, "step": ck["state"]["step"], "tokens": ck["state"]["tokens"]}
        print(args.phase, "phase from", init, "step", ck["state"]["step"], flush=True)
    if args.phase == "mtp":
        model.eval()

    mix = None
    if args.mix:
        mix = {k: float(v) for k, v in (kv.split("=") for kv in args.mix.split(","))}
        bad = set(mix) - set(CHAT_KINDS)
        if bad:
            sys.exit(f"--mix: unknown kinds {sorted(bad)}; known: {sorted(CHAT_KINDS)}")
    data = Data(os.path.join(data_dir, "train.npz"), args.seq, seed=1000 + state["step"],
                mix=mix, p_chat=args.p_chat)
    vb = valid_batches(os.path.join(data_dir, "valid.npz"), args.seq)
    budget = args.minutes * 60
    t_last = time.time()
    last_ck = last_ev = state["elapsed"]
    ema = None
    amp = torch.autocast(dev.type, dtype=torch.bfloat16) if not args.fp32 else torch.autocast(dev.type, enabled=False)
    while state["elapsed"] < budget and (not args.max_steps or state["step"] < args.max_steps):
        lr = lr_at(state["elapsed"] / budget, args.lr)
        for g in opt.param_groups:
            g["lr"] = lr
        x = data.batch(args.batch).to(dev)
        with amp:
            ce, kl, mce, agree = forward_losses(model, mtp, x, args.phase,
                                                mtp_rows=max(1, int(args.batch * args.mtp_frac))
                                                if args.phase == "joint" else None)
        loss = (ce if args.phase == "joint" else 0) + args.mtp_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        now = time.time()
        state["elapsed"] += now - t_last
        t_last = now
        state["step"] += 1
        state["tokens"] += x.numel()
        cur = np.array([float(ce), float(kl), float(mce), float(agree)])
        ema = cur if ema is None else 0.95 * ema + 0.05 * cur
        if state["step"] % 10 == 0 or state["step"] <= 3:
            rec = {"step": state["step"], "t": round(state["elapsed"]), "lr": round(lr, 6),
                   "ce": round(ema[0], 4), "mtp_kl": round(ema[1], 4), "mtp_ce": round(ema[2], 4),
                   "mtp_agree": round(ema[3], 4), "tok": state["tokens"]}
            state["log"].append(rec)
            print(json.dumps(rec), flush=True)
        if state["elapsed"] - last_ev >= args.eval_every:
            ev = evaluate(model, mtp, vb, dev)
            state["evals"].append({"step": state["step"], "t": round(state["elapsed"]), "valid": ev})
            print("EVAL", json.dumps(state["evals"][-1]), flush=True)
            last_ev = state["elapsed"]
            t_last = time.time()   # don't count eval time in the schedule
        if state["elapsed"] - last_ck >= args.ckpt_every:
            save_ckpt(ck_path, model, mtp, opt, state)
            last_ck = state["elapsed"]
            print("saved", ck_path, flush=True)
            t_last = time.time()
    ev = evaluate(model, mtp, vb, dev)
    state["evals"].append({"step": state["step"], "t": round(state["elapsed"]), "valid": ev})
    print("EVAL", json.dumps(state["evals"][-1]), flush=True)
    save_ckpt(ck_path, model, mtp, opt, state)
    print("done", ck_path, flush=True)


if __name__ == "__main__":
    sys.exit(main())

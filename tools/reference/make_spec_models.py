#!/usr/bin/env python3
"""Builds tiny qwen3_5 models whose MTP head agrees, disagrees or partly
agrees with the target, for the speculative-decoding tests (issue 4 d, b).

Construction: the target's layers write into the residual stream through
o_proj / out_proj / down_proj scaled by MIX. With MIX = 0 the final hidden
state is rms(embed(x_t)) (final norm weight 1 + 0), so the next token
depends only on the current one. The MTP head gets fc = [S*I | 0] on the
normalised embedding of x_{t+1} and a decoder layer whose outputs are
zero, so its logits are lm_head(rms(S*rms(embed(x_{t+1})))):
  S = +1: exactly the target's next-token logits (agree, ~100% accepted);
  S = -1: the negated logits, argmax = the target's argmin (0% accepted).
MIX > 0 makes the target depend on context, so drafts are partly right.
Only numpy and safetensors are needed. Output: tests/models/<name>/.
"""
import json, os, sys
import numpy as np
from safetensors.numpy import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "models")

def build(name, V, H, mix, sign, seed):
    rng = np.random.default_rng(seed)
    L, heads, kvh, hd, nk, nv, dk, dv, I, K = 4, 2, 1, 16, 1, 2, 8, 8, 32, 4
    cfg = {
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
        "hidden_size": H, "num_hidden_layers": L, "vocab_size": V, "intermediate_size": I,
        "num_attention_heads": heads, "num_key_value_heads": kvh, "head_dim": hd,
        "linear_num_key_heads": nk, "linear_num_value_heads": nv, "linear_key_head_dim": dk,
        "linear_value_head_dim": dv, "linear_conv_kernel_dim": K, "full_attention_interval": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "attn_output_gate": True, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        "mtp_num_hidden_layers": 1, "max_position_embeddings": 8192,
        "eos_token_id": V + 100 if False else None, "bos_token_id": None, "dtype": "float32",
    }
    cfg.pop("eos_token_id"); cfg.pop("bos_token_id")
    t = {}
    def r(*shape, s=None):
        s = s if s is not None else 1.0 / np.sqrt(shape[-1])
        return (rng.standard_normal(shape) * s).astype(np.float32)
    def layer(p, full, out_scale):
        t[p + "input_layernorm.weight"] = r(H, s=0.1)
        t[p + "post_attention_layernorm.weight"] = r(H, s=0.1)
        if full:
            t[p + "self_attn.q_proj.weight"] = r(heads * hd * 2, H)
            t[p + "self_attn.k_proj.weight"] = r(kvh * hd, H)
            t[p + "self_attn.v_proj.weight"] = r(kvh * hd, H)
            t[p + "self_attn.o_proj.weight"] = r(H, heads * hd) * out_scale
            t[p + "self_attn.q_norm.weight"] = r(hd, s=0.1)
            t[p + "self_attn.k_norm.weight"] = r(hd, s=0.1)
        else:
            conv = 2 * nk * dk + nv * dv
            t[p + "linear_attn.in_proj_qkv.weight"] = r(conv, H)
            t[p + "linear_attn.in_proj_z.weight"] = r(nv * dv, H)
            t[p + "linear_attn.in_proj_b.weight"] = r(nv, H)
            t[p + "linear_attn.in_proj_a.weight"] = r(nv, H)
            t[p + "linear_attn.out_proj.weight"] = r(H, nv * dv) * out_scale
            t[p + "linear_attn.conv1d.weight"] = r(conv, 1, K, s=0.5)
            t[p + "linear_attn.dt_bias"] = r(nv, s=0.5)
            t[p + "linear_attn.A_log"] = np.log(rng.uniform(1, 8, nv)).astype(np.float32)
            t[p + "linear_attn.norm.weight"] = (1 + r(dv, s=0.1)).astype(np.float32)
        t[p + "mlp.gate_proj.weight"] = r(I, H)
        t[p + "mlp.up_proj.weight"] = r(I, H)
        t[p + "mlp.down_proj.weight"] = r(H, I) * out_scale
    t["model.embed_tokens.weight"] = r(V, H, s=1.0)
    t["lm_head.weight"] = r(V, H, s=3.0 / np.sqrt(H))
    t["model.norm.weight"] = np.zeros(H, np.float32)
    for i in range(L):
        layer(f"model.layers.{i}.", cfg["layer_types"][i] == "full_attention", mix)
    fc = np.zeros((H, 2 * H), np.float32)
    fc[:, :H] = sign * np.eye(H, dtype=np.float32)
    t["mtp.fc.weight"] = fc
    t["mtp.pre_fc_norm_embedding.weight"] = np.zeros(H, np.float32)
    t["mtp.pre_fc_norm_hidden.weight"] = r(H, s=0.1)
    t["mtp.norm.weight"] = np.zeros(H, np.float32)
    layer("mtp.layers.0.", True, 0.0)
    d = os.path.join(ROOT, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_file({k: np.ascontiguousarray(v) for k, v in sorted(t.items())}, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    print(name, sum(v.size for v in t.values()), "params")

if __name__ == "__main__":
    build("spec-agree", V=12, H=32, mix=0.0, sign=1.0, seed=1)
    build("spec-disagree", V=12, H=32, mix=0.0, sign=-1.0, seed=1)
    build("spec-partial", V=64, H=32, mix=0.35, sign=1.0, seed=2)

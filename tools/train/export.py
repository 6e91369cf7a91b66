"""Exports a train.py checkpoint as a Hugging Face model directory (models/demo).

Writes config.json (nested: model_type qwen3_5 + text_config, like the real Qwen3.5
checkpoints), model.safetensors in bf16 (trunk under model.language_model.*, tied
embeddings so no lm_head.weight, MTP head under mtp.* with vLLM names),
tokenizer.json, tokenizer_config.json (Qwen3 ChatML chat template with tools and
enable_thinking), generation_config.json. Then reloads the directory with transformers
and checks that the bf16 trunk's logits match the checkpoint's (upcast) within bf16 noise.

Run: /work/venv-ref/bin/python tools/train/export.py --ckpt build/train7/ckpt/mtp.pt --out models/demo
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file

import transformers
from transformers import Qwen3_5ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default="build/train7/ckpt/joint.pt")
    ap.add_argument("--work", default=train.WORK)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "models", "demo"))
    args = ap.parse_args()
    ck = torch.load(args.ckpt, map_location="cpu", weights_only=False)
    ids = json.load(open(os.path.join(args.work, "tok", "special_ids.json")))
    cfg = train.make_config(ids)
    os.makedirs(args.out, exist_ok=True)

    sd = {}
    for k, v in ck["model"].items():
        if k == "lm_head.weight":
            continue  # tied
        assert k.startswith("model."), k
        sd["model.language_model." + k[len("model."):]] = v
    for k, v in ck["mtp"].items():
        sd["mtp." + k] = v
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in sorted(sd.items())}
    save_file(sd, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})

    a = train.ARCH
    tc = {
        "attention_bias": False, "attention_dropout": 0.0, "attn_output_gate": True,
        "bos_token_id": ids["<|endoftext|>"], "dtype": "bfloat16", "eos_token_id": ids["<|im_end|>"],
        "full_attention_interval": a["full_attention_interval"], "head_dim": a["head_dim"],
        "hidden_act": "silu", "hidden_size": a["hidden_size"], "initializer_range": 0.02,
        "intermediate_size": a["intermediate_size"], "layer_types": cfg.layer_types,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": a["linear_key_head_dim"],
        "linear_num_key_heads": a["linear_num_key_heads"],
        "linear_num_value_heads": a["linear_num_value_heads"],
        "linear_value_head_dim": a["linear_value_head_dim"], "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 4096, "model_type": "qwen3_5_text", "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False, "num_attention_heads": a["num_attention_heads"],
        "num_hidden_layers": a["num_hidden_layers"], "num_key_value_heads": a["num_key_value_heads"],
        "output_gate_type": "swish", "pad_token_id": None,
        "partial_rotary_factor": a["partial_rotary_factor"], "rms_norm_eps": 1e-6,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [2, 3, 3],
                            "partial_rotary_factor": a["partial_rotary_factor"],
                            "rope_theta": train.ROPE_THETA, "rope_type": "default"},
        "tie_word_embeddings": True, "use_cache": True, "vocab_size": a["vocab_size"],
    }
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "image_token_id": None, "video_token_id": None,
        "vision_start_token_id": None, "vision_end_token_id": None,
        "language_model_only": True,
        "model_type": "qwen3_5", "text_config": tc, "tie_word_embeddings": True,
        "transformers_version": transformers.__version__,
    }
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2); f.write("\n")
    gen = {"bos_token_id": ids["<|endoftext|>"], "do_sample": True,
           "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
           "pad_token_id": ids["<|endoftext|>"], "temperature": 0.6, "top_k": 20, "top_p": 0.95,
           "transformers_version": transformers.__version__}
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2); f.write("\n")

    import shutil
    shutil.copy(os.path.join(args.work, "tok", "tokenizer.json"), os.path.join(args.out, "tokenizer.json"))
    tpl = open(os.path.join(HERE, "chat_template.jinja"), encoding="utf-8").read()
    added = {}
    for s, i in ids.items():
        added[str(i)] = {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                         "single_word": False, "special": s.startswith("<|")}
    tcfg = {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
            "bos_token": None, "chat_template": tpl, "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 4096,
            "pad_token": "<|endoftext|>", "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump(tcfg, f, indent=2, ensure_ascii=False); f.write("\n")

    # reload through transformers and compare with the checkpoint (bf16 weights, fp32 compute)
    m, info = Qwen3_5ForCausalLM.from_pretrained(args.out, dtype=torch.float32,
                                                 output_loading_info=True)
    assert not info["missing_keys"], info["missing_keys"]
    ref = Qwen3_5ForCausalLM(cfg)
    ref.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in ck["model"].items()})
    x = torch.randint(0, 8000, (1, 40))
    with torch.no_grad():
        d = (m(x).logits - ref(x).logits).abs().max().item()
    print("reload: unexpected (mtp, skipped by transformers):", len(info["unexpected_keys"]),
          "max |dlogits|", d)
    assert d < 1e-3, d
    n = sum(v.numel() for v in sd.values())
    print(f"wrote {args.out}: {n / 1e6:.2f}M parameters, "
          f"{os.path.getsize(os.path.join(args.out, 'model.safetensors')) / 1e6:.1f} MB")


if __name__ == "__main__":
    sys.exit(main())

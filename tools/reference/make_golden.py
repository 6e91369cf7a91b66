#!/usr/bin/env python3
"""Generate the golden test data under tests/golden/ (dev-time tool, not shipped).

Creates three tiny RANDOM qwen3_5 models with transformers' own Qwen3_5 text
classes, saves each as a real Hugging Face directory in float32 and bfloat16
(config.json, safetensors, tokenizer, generation_config), adds random MTP weights
under vLLM's `mtp.*` names, and writes reference outputs computed by transformers
on CPU in float32 (eager attention).

Everything is deterministic: fixed seeds, per-tensor seeds derived from the
tensor name, deterministic torch algorithms, single thread.

Usage (see tools/reference/README.md):
    /path/to/venv/bin/python tools/reference/make_golden.py [--out tests/golden] [--only tiny-a]
"""

import argparse
import copy
import json
import os
import shutil
import sys
import zlib

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

import transformers
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.cache_utils import DynamicCache
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))

T_PROMPT = 72       # > 64 so transformers' chunked DeltaNet prefill spans 2 chunks
N_DECODE = 40
N_GREEDY = 64
N_MTP_CHAIN = 4
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# The regex in the task brief / Qwen2 tokenizer.json ...
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# ... and the one transformers' Qwen3_5Tokenizer uses (adds \p{M}, combining marks).
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
                r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

# NOTE on sizes: the brief asked for tiny-b intermediate 256 and tiny-c
# 12 layers / intermediate 320. With those, tests/golden would be ~35 MB (f32 + bf16),
# far over the ~15 MB budget; intermediate sizes and tiny-c's depth were reduced
# (all head/dim/ratio/interval choices kept). See README.md.
MODELS = {
    "tiny-a": dict(
        seed=1001, layout="flat", shards=1, regex="qwen2",
        hidden_size=64, num_hidden_layers=8, full_attention_interval=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16,
        intermediate_size=128, vocab_size=272, partial_rotary_factor=0.25,
        tie_word_embeddings=True, mrope_section=[2, 1, 1],
    ),
    "tiny-b": dict(
        seed=2002, layout="nested", shards=2, regex="qwen3_5",
        hidden_size=128, num_hidden_layers=8, full_attention_interval=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=48,
        linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=32, linear_value_head_dim=24,
        intermediate_size=128, vocab_size=320, partial_rotary_factor=0.25,
        tie_word_embeddings=False, mrope_section=[2, 2, 2],
    ),
    "tiny-c": dict(
        seed=3003, layout="nested", shards=1, regex="qwen3_5",
        hidden_size=160, num_hidden_layers=6, full_attention_interval=3,
        num_attention_heads=6, num_key_value_heads=2, head_dim=40,
        linear_num_key_heads=2, linear_num_value_heads=6,
        linear_key_head_dim=24, linear_value_head_dim=32,
        intermediate_size=96, vocab_size=384, partial_rotary_factor=0.5,
        tie_word_embeddings=False, mrope_section=[4, 3, 3],
    ),
}
ROPE_THETA = 10000.0
EPS = 1e-6


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------------------------
# tokenizer
# ----------------------------------------------------------------------------------

def training_text():
    """Deterministic training text: source files of the pinned transformers package."""
    base = os.path.dirname(transformers.__file__)
    files = ["models/qwen3_5/modeling_qwen3_5.py", "models/qwen3_5/configuration_qwen3_5.py",
             "models/llama/modeling_llama.py", "generation/utils.py"]
    out = []
    for f in files:
        with open(os.path.join(base, f), encoding="utf-8") as fh:
            out.append(fh.read())
    return out


def build_tokenizer(n_total, regex):
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    n_base = n_total - len(SPECIALS)
    tok = Tokenizer(BPE(dropout=None, unk_token=None, continuing_subword_prefix="",
                        end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX if regex == "qwen2" else QWEN35_REGEX),
                             behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(vocab_size=n_base, min_frequency=2, show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(training_text(), trainer=trainer)
    assert tok.get_vocab_size() == n_base, (tok.get_vocab_size(), n_base)
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    assert tok.get_vocab_size() == n_total
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    assert [ids[s] for s in SPECIALS] == list(range(n_base, n_total)), ids
    return tok, ids


def write_tokenizer(d, tok, ids, n_total):
    tok.save(os.path.join(d, "tokenizer.json"))
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(ids[s]): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "special": True} for s in SPECIALS},
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "TokenizersBackend",
        "unk_token": None,
    }
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


# ----------------------------------------------------------------------------------
# config
# ----------------------------------------------------------------------------------

def layer_types(spec):
    k = spec["full_attention_interval"]
    return ["full_attention" if (i + 1) % k == 0 else "linear_attention"
            for i in range(spec["num_hidden_layers"])]


def text_config_dict(spec, ids, dtype_name):
    d = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "bos_token_id": ids["<|endoftext|>"],
        "dtype": dtype_name,
        "eos_token_id": ids["<|im_end|>"],
        "full_attention_interval": spec["full_attention_interval"],
        "head_dim": spec["head_dim"],
        "hidden_act": "silu",
        "hidden_size": spec["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": spec["intermediate_size"],
        "layer_types": layer_types(spec),
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": spec["linear_key_head_dim"],
        "linear_num_key_heads": spec["linear_num_key_heads"],
        "linear_num_value_heads": spec["linear_num_value_heads"],
        "linear_value_head_dim": spec["linear_value_head_dim"],
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 4096,
        "model_type": "qwen3_5_text",
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": spec["num_attention_heads"],
        "num_hidden_layers": spec["num_hidden_layers"],
        "num_key_value_heads": spec["num_key_value_heads"],
        "output_gate_type": "swish",
        "pad_token_id": None,
        "partial_rotary_factor": spec["partial_rotary_factor"],
        "rms_norm_eps": EPS,
        "rope_parameters": {
            "partial_rotary_factor": spec["partial_rotary_factor"],
            "rope_theta": ROPE_THETA,
            "rope_type": "default",
        },
        "tie_word_embeddings": spec["tie_word_embeddings"],
        "use_cache": True,
        "vocab_size": spec["vocab_size"],
    }
    if spec["layout"] == "nested":
        d["rope_parameters"] = {
            "mrope_interleaved": True,
            "mrope_section": spec["mrope_section"],
            "partial_rotary_factor": spec["partial_rotary_factor"],
            "rope_theta": ROPE_THETA,
            "rope_type": "default",
        }
    return d


def config_json(spec, ids, dtype_name):
    tc = text_config_dict(spec, ids, dtype_name)
    if spec["layout"] == "flat":
        tc = dict(tc)
        tc["architectures"] = ["Qwen3_5ForCausalLM"]
        tc["transformers_version"] = transformers.__version__
        return dict(sorted(tc.items()))
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "image_token_id": ids["<|endoftext|>"] + 100000,  # no image tokens in this vocab
        "language_model_only": False,
        "model_type": "qwen3_5",
        "text_config": tc,
        "tie_word_embeddings": spec["tie_word_embeddings"],
        "transformers_version": transformers.__version__,
        "video_token_id": ids["<|endoftext|>"] + 100001,
        "vision_end_token_id": ids["<|endoftext|>"] + 100002,
        "vision_start_token_id": ids["<|endoftext|>"] + 100003,
    }


def generation_config_json(ids):
    return {
        "bos_token_id": ids["<|endoftext|>"],
        "do_sample": False,
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "transformers_version": transformers.__version__,
    }


def make_text_config(spec, ids):
    """The Qwen3_5TextConfig used to build the module tree for initialisation."""
    return Qwen3_5TextConfig(
        vocab_size=spec["vocab_size"], hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"], num_hidden_layers=spec["num_hidden_layers"],
        num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"], head_dim=spec["head_dim"],
        linear_num_key_heads=spec["linear_num_key_heads"],
        linear_num_value_heads=spec["linear_num_value_heads"],
        linear_key_head_dim=spec["linear_key_head_dim"],
        linear_value_head_dim=spec["linear_value_head_dim"],
        linear_conv_kernel_dim=4, layer_types=layer_types(spec), rms_norm_eps=EPS,
        tie_word_embeddings=spec["tie_word_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA,
                         "partial_rotary_factor": spec["partial_rotary_factor"]},
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
    )


# ----------------------------------------------------------------------------------
# weights
# ----------------------------------------------------------------------------------

def init_tensor(name, shape, spec):
    """Random init with a per-tensor seed (model seed + crc32 of the name)."""
    g = torch.Generator().manual_seed(spec["seed"] * 1000003 + zlib.crc32(name.encode()))
    H = spec["hidden_size"]

    def normal(std, mean=0.0):
        return torch.randn(shape, generator=g, dtype=torch.float64) * std + mean

    leaf = name.split(".")[-2] + "." + name.split(".")[-1] if "." in name else name
    if name.endswith("embed_tokens.weight"):
        # tied: this is also the lm_head -> logits std ~ 3
        return normal(3.0 / H ** 0.5 if spec["tie_word_embeddings"] else 1.0)
    if name == "lm_head.weight":
        return normal(3.0 / H ** 0.5)
    if name.endswith("linear_attn.norm.weight"):
        return normal(0.1, 1.0)                       # gated norm: plain w
    if name.endswith("norm.weight") or name.startswith("mtp.pre_fc_norm_"):
        return normal(0.1)                            # zero-centred (1 + w) norms
    if name.endswith("A_log"):
        u = torch.rand(shape, generator=g, dtype=torch.float64)
        return torch.log(0.1 + 1.9 * u)               # A in [0.1, 2]
    if name.endswith("dt_bias"):
        return normal(0.5)
    if name.endswith("conv1d.weight"):
        return normal(0.5)                            # [C, 1, 4]
    if leaf == "in_proj_a.weight":
        return normal(0.7 / shape[1] ** 0.5)
    if len(shape) == 2:                               # every other Linear: [out, in]
        return normal(1.0 / shape[1] ** 0.5)
    raise ValueError(f"no init rule for {name} {shape}")


def mtp_shapes(model):
    """Names/shapes of the MTP head, vLLM naming; layer 0 = a full-attention layer."""
    H = model.config.hidden_size
    full_idx = model.config.layer_types.index("full_attention")
    out = {"mtp.fc.weight": (H, 2 * H),
           "mtp.pre_fc_norm_embedding.weight": (H,),
           "mtp.pre_fc_norm_hidden.weight": (H,),
           "mtp.norm.weight": (H,)}
    for k, v in model.model.layers[full_idx].state_dict().items():
        out["mtp.layers.0." + k] = tuple(v.shape)
    return out


def make_weights(spec, ids):
    torch.manual_seed(spec["seed"])
    cfg = make_text_config(spec, ids)
    model = Qwen3_5ForCausalLM(cfg)
    sd = {}
    for name, p in model.state_dict().items():
        if spec["tie_word_embeddings"] and name == "lm_head.weight":
            continue  # tied: not saved (what save_pretrained does)
        sd[name] = init_tensor(name, tuple(p.shape), spec).to(torch.float32).contiguous()
    for name, shape in mtp_shapes(model).items():
        sd[name] = init_tensor(name, shape, spec).to(torch.float32).contiguous()
    return sd


def hf_names(sd, spec):
    """Rename to the on-disk layout of the model kind."""
    if spec["layout"] == "flat":
        return dict(sd)
    out = {}
    for k, v in sd.items():
        if k.startswith("model."):
            out["model.language_model." + k[len("model."):]] = v
        else:
            out[k] = v   # lm_head.weight, mtp.*
    return out


def save_weights(d, sd, spec, dtype):
    sd = {k: v.to(dtype).contiguous() for k, v in sd.items()}
    if spec["layout"] == "nested":
        g = torch.Generator().manual_seed(spec["seed"] + 7)
        sd["model.visual.blocks.0.fake.weight"] = torch.randn(4, 8, generator=g).to(dtype)
        if spec["shards"] > 1:
            sd["model.visual.merger.fake.weight"] = torch.randn(8, generator=g).to(dtype)
    visual = sorted(k for k in sd if k.startswith("model.visual."))
    names = sorted(k for k in sd if not k.startswith("model.visual."))
    # one dummy vision tensor at each end, so with 2 shards each shard has one
    names = visual[:1] + names + visual[1:]
    meta = {"format": "pt"}
    if spec["shards"] == 1:
        save_file(sd, os.path.join(d, "model.safetensors"), metadata=meta)
        return
    n = spec["shards"]
    # split the name list in n contiguous parts (layers may straddle shards, like
    # real HF exports)
    per = (len(names) + n - 1) // n
    weight_map = {}
    total = 0
    for i in range(n):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        part = names[i * per:(i + 1) * per]
        save_file({k: sd[k] for k in part}, os.path.join(d, fname), metadata=meta)
        for k in part:
            weight_map[k] = fname
            total += sd[k].numel() * sd[k].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")


def read_all_tensors(d):
    out = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(d, fn), "pt") as f:
                for k in f.keys():
                    out[k] = f.get_tensor(k)
    return out


# ----------------------------------------------------------------------------------
# reference computation
# ----------------------------------------------------------------------------------

def load_model(d):
    model, info = Qwen3_5ForCausalLM.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    model.eval()
    assert not info["missing_keys"], info["missing_keys"]
    assert not info["mismatched_keys"], info["mismatched_keys"]
    assert model.config._attn_implementation == "eager"
    return model, info


def check_loaded(model, d, spec):
    """Every main-model tensor in the files must be what the model holds."""
    files = read_all_tensors(d)
    msd = model.state_dict()
    n = 0
    for k, v in files.items():
        if k.startswith("mtp.") or k.startswith("model.visual."):
            continue
        mk = k.replace("model.language_model.", "model.")
        assert mk in msd, k
        assert torch.equal(msd[mk], v.to(torch.float32)), k
        n += 1
    if spec["tie_word_embeddings"]:
        assert torch.equal(msd["lm_head.weight"], msd["model.embed_tokens.weight"])
    cfg = model.config
    assert cfg.layer_types == layer_types(spec)
    assert cfg.hidden_size == spec["hidden_size"] and cfg.head_dim == spec["head_dim"]
    rot = int(spec["head_dim"] * spec["partial_rotary_factor"])
    assert model.model.rotary_emb.inv_freq.numel() == rot // 2, model.model.rotary_emb.inv_freq.shape
    return n


class MTP:
    """vLLM qwen3_5_mtp semantics, built from transformers' modules."""

    def __init__(self, model, tensors):
        cfg = copy.deepcopy(model.config)
        cfg.num_hidden_layers = 1
        cfg.layer_types = ["full_attention"]
        cfg._attn_implementation = "eager"
        H = cfg.hidden_size
        self.model = model
        self.layer = Qwen3_5DecoderLayer(cfg, 0).eval()
        lsd = {k[len("mtp.layers.0."):]: v.to(torch.float32)
               for k, v in tensors.items() if k.startswith("mtp.layers.0.")}
        self.layer.load_state_dict(lsd, strict=True)
        self.fc = torch.nn.Linear(2 * H, H, bias=False)
        self.fc.weight.data = tensors["mtp.fc.weight"].to(torch.float32)
        self.norm_e, self.norm_h, self.norm = (Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps) for _ in range(3))
        self.norm_e.weight.data = tensors["mtp.pre_fc_norm_embedding.weight"].to(torch.float32)
        self.norm_h.weight.data = tensors["mtp.pre_fc_norm_hidden.weight"].to(torch.float32)
        self.norm.weight.data = tensors["mtp.norm.weight"].to(torch.float32)
        self.cache = DynamicCache()
        self.n = 0  # entries in the MTP KV cache

    @torch.no_grad()
    def step(self, tokens, hidden, positions):
        """tokens [L], hidden [L, H] (target hidden after final norm), positions [L]."""
        L = tokens.shape[0]
        e = self.norm_e(self.model.model.embed_tokens(tokens[None]))
        h = self.norm_h(hidden[None])
        x = self.fc(torch.cat([e, h], dim=-1))
        pos = positions[None]
        pe = self.model.model.rotary_emb(x, pos)
        # causal over all MTP entries so far (the cache holds self.n earlier entries)
        mask = torch.zeros(1, 1, L, self.n + L)
        mask[0, 0, :, self.n:] = torch.triu(torch.full((L, L), float("-inf")), diagonal=1)
        u = self.layer(x, position_embeddings=pe, attention_mask=mask, position_ids=pos,
                       past_key_values=self.cache, use_cache=True)
        self.n += L
        hn = self.norm(u)
        return self.model.lm_head(hn)[0], hn[0]


def top2_margin(logits):
    t = torch.topk(logits, 2, dim=-1).values
    return (t[..., 0] - t[..., 1])


@torch.no_grad()
def compute_reference(model, tensors, prompt):
    T = prompt.numel()
    ids = prompt[None].long()
    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    prefill_logits = out.logits[0].clone()
    # base model output after the final norm (same single forward, via a hook-free call)
    base = model.model(input_ids=ids, use_cache=False)
    prefill_hidden = base.last_hidden_state[0].clone()
    assert torch.allclose(model.lm_head(prefill_hidden), prefill_logits, atol=1e-5, rtol=0)

    greedy, margins, step_logits = [], [], []
    last = prefill_logits[-1]
    for i in range(N_GREEDY):
        tok = int(torch.argmax(last))
        greedy.append(tok)
        margins.append(float(top2_margin(last)))
        if i == N_GREEDY - 1:
            break
        o = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
        last = o.logits[0, -1].clone()
        step_logits.append(last)
    decode_logits = torch.stack(step_logits[:N_DECODE])

    # consistency: one uncached forward over prompt + greedy[:-1] (chunked DeltaNet
    # everywhere) must agree with the cached recurrent decode.
    full = torch.cat([prompt.long(), torch.tensor(greedy[:-1])])[None]
    lf = model(input_ids=full, use_cache=False).logits[0]
    dec_vs_full = float((lf[T:T + N_DECODE] - decode_logits).abs().max())
    pre_vs_full = float((lf[:T] - prefill_logits).abs().max())

    # MTP over the prompt, then a 4-step recursive chain
    mtp = MTP(model, tensors)
    mtp_logits, _ = mtp.step(prompt[1:].long(), prefill_hidden[:T - 1], torch.arange(T - 1))
    chain_tok, chain_logits, chain_margin = [], [], []
    tok, h, pos = greedy[0], prefill_hidden[T - 1:T], T - 1
    for j in range(N_MTP_CHAIN):
        lg, hn = mtp.step(torch.tensor([tok]), h, torch.tensor([pos]))
        d = int(torch.argmax(lg[0]))
        chain_tok.append(d)
        chain_logits.append(lg[0])
        chain_margin.append(float(top2_margin(lg[0])))
        tok, h, pos = d, hn, pos + 1

    ref = {
        "prompt": prompt.to(torch.int32),
        "prefill_logits": prefill_logits,
        "prefill_hidden": prefill_hidden,
        "decode_tokens": torch.tensor(greedy[:N_DECODE], dtype=torch.int32),
        "decode_logits": decode_logits,
        "greedy": torch.tensor(greedy, dtype=torch.int32),
        "greedy_margin": torch.tensor(margins, dtype=torch.float32),
        "mtp_logits": mtp_logits,
        "mtp_chain_tokens": torch.tensor(chain_tok, dtype=torch.int32),
        "mtp_chain_logits": torch.stack(chain_logits),
    }
    stats = {
        "min_greedy_margin": min(margins),
        "min_chain_margin": min(chain_margin),
        "min_mtp_prompt_margin": float(top2_margin(mtp_logits).min()),
        "logits_std": float(prefill_logits.std()),
        "mtp_logits_std": float(mtp_logits.std()),
        "decode_vs_uncached": dec_vs_full,
        "prefill_vs_uncached": pre_vs_full,
        "greedy_distinct": len(set(greedy)),
    }
    return {k: v.contiguous() for k, v in ref.items()}, stats


def prompt_for(spec, attempt, n_regular):
    rng = np.random.default_rng(spec["seed"] * 100 + attempt)
    return torch.tensor(rng.integers(0, n_regular, size=T_PROMPT), dtype=torch.int32)


# ----------------------------------------------------------------------------------

def build_one(name, spec, out_root):
    log(f"== {name}")
    V = spec["vocab_size"]
    tok, ids = build_tokenizer(V, spec["regex"])
    sd = hf_names(make_weights(spec, ids), spec)
    root = os.path.join(out_root, name)
    if os.path.isdir(root):
        shutil.rmtree(root)
    dirs = {}
    for dname, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        d = os.path.join(root, dname)
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config_json(spec, ids, "float32" if dname == "f32" else "bfloat16"), f, indent=2)
            f.write("\n")
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump(generation_config_json(ids), f, indent=2)
            f.write("\n")
        write_tokenizer(d, tok, ids, V)
        save_weights(d, sd, spec, dtype)
        dirs[dname] = d

    n_regular = V - len(SPECIALS)
    special_ids = set(ids.values())
    models = {k: load_model(d) for k, d in dirs.items()}
    for k, (m, info) in models.items():
        n = check_loaded(m, dirs[k], spec)
        log(f"  {k}: loaded {n} tensors, unexpected (skipped by transformers): "
            f"{len(info['unexpected_keys'])}")
    tensors = {k: read_all_tensors(d) for k, d in dirs.items()}

    # pick the first prompt for which both dtypes give clean greedy runs
    best = None
    for attempt in range(50):
        prompt = prompt_for(spec, attempt, n_regular)
        res = {k: compute_reference(models[k][0], tensors[k], prompt) for k in dirs}
        ok = all(s["min_greedy_margin"] > 1e-3 and s["min_chain_margin"] > 1e-3
                 and not (set(r["greedy"].tolist()) & special_ids)
                 for r, s in res.values())
        score = min(s["min_greedy_margin"] for _, s in res.values())
        if best is None or score > best[0]:
            best = (score, attempt, res)
        if ok:
            best = (score, attempt, res)
            break
        log(f"  prompt attempt {attempt} rejected (min margin {score:.2e})")
    _, attempt, res = best
    summary = {}
    for k, (ref, stats) in res.items():
        path = os.path.join(root, f"reference-{k}.safetensors")
        # only {"format": "pt"}: safetensors writes metadata in hash order, so more
        # keys would make the files differ byte-wise between runs
        save_file(ref, path, metadata={"format": "pt"})
        stats["prompt_attempt"] = attempt
        summary[k] = stats
        log(f"  {k}: " + ", ".join(f"{a}={b:.4g}" if isinstance(b, float) else f"{a}={b}"
                                   for a, b in stats.items()))
    return summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "golden"))
    ap.add_argument("--only", action="append")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    all_stats = {}
    for name, spec in MODELS.items():
        if args.only and name not in args.only:
            continue
        all_stats[name] = build_one(name, spec, args.out)
    all_stats["_versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                              "generator": "tools/reference/make_golden.py"}
    with open(os.path.join(args.out, "stats.json") if not args.only else os.devnull, "w") as f:
        json.dump(all_stats, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())

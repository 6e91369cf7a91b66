#!/usr/bin/env python3
"""FP8 e4m3 copy of a BF16 qwen3_5 model for the 8-bit side of the llama.cpp
comparison (issue 9): every big linear weight that tandem loads through
get_linear (q/k/v/o, in_proj_*, out_proj, gate/up/down) becomes F8_E4M3 with a
per-tensor F32 `weight_scale` (= amax / 448, W = fp8 * scale); embeddings,
lm_head, norms, conv1d and the rest stay as they are. Config and tokenizer
files are copied.

With --block B (as the published FP8 checkpoints, B = 128): one scale per
B x B block instead, F32 `weight_scale_inv` [ceil(N/B), ceil(K/B)] (W = fp8 *
scale of its block), and the config gets their quantization_config
(quant_method fp8, weight_block_size [B, B]).

  python3 tools/bench/make_fp8_copy.py SRC_DIR OUT_DIR [--block B]

Needs numpy and ml_dtypes (pip install numpy ml_dtypes). Single-file or
sharded safetensors in SRC_DIR; writes one model.safetensors."""
import json, os, shutil, struct, sys

import numpy as np
import ml_dtypes

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj",
          "gate_proj", "up_proj", "down_proj")


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def main():
    args = sys.argv[1:]
    block = 0
    if "--block" in args:
        i = args.index("--block")
        block = int(args[i + 1])
        del args[i: i + 2]
        if block < 16 or block % 16:
            sys.exit("--block must be a multiple of 16")
    if len(args) != 2:
        sys.exit("usage: make_fp8_copy.py SRC_DIR OUT_DIR [--block B]")
    src, out = args
    os.makedirs(out, exist_ok=True)
    files = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    plan = []  # (name, dtype, shape, producer)
    for fn in files:
        path = os.path.join(src, fn)
        hdr, base = read_header(path)
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        for name, e in hdr.items():
            if name == "__metadata__":
                continue
            a, b = e["data_offsets"]
            raw = mm[base + a: base + b]
            leaf = name.rsplit(".", 2)
            quant = (e["dtype"] == "BF16" and len(e["shape"]) == 2 and name.endswith(".weight") and len(leaf) == 3
                     and leaf[1] in LINEAR)
            if not quant:
                plan.append((name, e["dtype"], e["shape"], lambda raw=raw: raw.tobytes()))
                continue

            def fp8(raw=raw, shape=e["shape"]):
                w = raw.view(np.uint16).astype(np.uint32) << 16
                w = w.view(np.float32).reshape(shape)
                amax = float(np.abs(w).max()) or 1.0
                s = np.float32(amax / 448.0)
                return (w / s).astype(ml_dtypes.float8_e4m3fn).view(np.uint8).tobytes(), s

            def fp8_blocks(raw=raw, shape=e["shape"]):
                n, k = shape
                w = raw.view(np.uint16).astype(np.uint32) << 16
                w = w.view(np.float32).reshape(shape)
                nb, kb = -(-n // block), -(-k // block)
                pad = np.zeros((nb * block, kb * block), np.float32)
                pad[:n, :k] = np.abs(w)
                amax = pad.reshape(nb, block, kb, block).max(axis=(1, 3))
                s = np.where(amax > 0, amax / 448.0, 1.0).astype(np.float32)
                full = np.repeat(np.repeat(s, block, axis=0), block, axis=1)[:n, :k]
                return (w / full).astype(ml_dtypes.float8_e4m3fn).view(np.uint8).tobytes(), s.tobytes()

            cache = {}

            def weight(f=fp8_blocks if block else fp8, c=cache):
                c["q"], c["s"] = f()
                return c["q"]

            plan.append((name, "F8_E4M3", e["shape"], weight))
            if block:
                grid = [-(-e["shape"][0] // block), -(-e["shape"][1] // block)]
                plan.append((name[: -len("weight")] + "weight_scale_inv", "F32", grid, lambda c=cache: c["s"]))
            else:
                plan.append((name[: -len("weight")] + "weight_scale", "F32", [], lambda c=cache: struct.pack("<f", float(c["s"]))))
    # sizes are known up front: fp8 = 1 byte per element, scale = 4 bytes
    size = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "U8": 1, "I64": 8, "I32": 4}
    hdr, off = {}, 0
    for name, dt, shape, _ in plan:
        n = 1
        for d in shape:
            n *= d
        nb = n * size[dt]
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}
        off += nb
    hb = json.dumps(hdr, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for name, dt, shape, produce in plan:
            data = produce()
            a, b = hdr[name]["data_offsets"]
            assert len(data) == b - a, name
            f.write(data)
    for fn in os.listdir(src):
        if fn.endswith(".json") and fn != "model.safetensors.index.json":
            shutil.copy(os.path.join(src, fn), os.path.join(out, fn))
    if block:
        cp = os.path.join(out, "config.json")
        cfg = json.load(open(cp))
        qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [block, block]}
        (cfg["text_config"] if "text_config" in cfg else cfg)["quantization_config"] = qc
        json.dump(cfg, open(cp, "w"), indent=2)
    nq = sum(1 for p in plan if p[1] == "F8_E4M3")
    how = f"{block} x {block} block scales" if block else "per-tensor scale"
    print(f"{out}: {nq} linear weights in F8_E4M3 ({how}), {off / 1e9:.2f} GB of tensors")


if __name__ == "__main__":
    main()

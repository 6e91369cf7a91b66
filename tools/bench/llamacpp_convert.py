#!/usr/bin/env python3
"""Run llama.cpp's own convert_hf_to_gguf.py on a random-weight model whose
tokenizer is a stand-in (tests/golden/tiny-b's 320-token BPE, padded by the
converter to the model's vocab with [PADn] tokens). The only change: when the
converter does not recognise the stand-in's pre-tokenizer hash it uses
"qwen2" instead of stopping. Token content does not matter for the speed
comparison (llama-bench feeds random tokens).

  python tools/bench/llamacpp_convert.py LLAMA_CPP_DIR HF_DIR [converter args...]
"""
import sys

llama_dir = sys.argv.pop(1)
sys.path.insert(0, llama_dir)
sys.path.insert(0, llama_dir + "/gguf-py")
import convert_hf_to_gguf as conv  # noqa: E402
from conversion import base  # noqa: E402

_orig = base.TextModel.get_vocab_base_pre


def _pre(self, tokenizer):
    try:
        return _orig(self, tokenizer)
    except NotImplementedError:
        return "qwen2"


base.TextModel.get_vocab_base_pre = _pre
sys.argv[0] = llama_dir + "/convert_hf_to_gguf.py"
conv.main()

"""Trains the demo model's byte-level BPE tokenizer (HF `tokenizers`), Qwen format.

Same pipeline as Qwen2/Qwen3's tokenizer.json: NFC normalizer; pre-tokenizer
Sequence[Split(Qwen2 regex, Isolated), ByteLevel(add_prefix_space=false, use_regex=false)];
BPE without unk / byte fallback; ByteLevel decoder. The 7 added tokens come after the
learned vocabulary (ids V-7 .. V-1):
  <|endoftext|> <|im_start|> <|im_end|>       special=True  (like Qwen)
  <think> </think> <tool_call> </tool_call>   special=False (like Qwen: kept on decode)

Run: /work/venv-ref/bin/python tools/train/train_tokenizer.py \
        --corpus build/train7/corpus --out build/train7/tok --vocab 8192
"""
import argparse
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>"]


def texts(corpus, max_chars, seed=7):
    docs = [json.loads(l) for l in open(os.path.join(corpus, "train.jsonl"))]
    random.Random(seed).shuffle(docs)
    n = 0
    for d in docs:
        t = d["text"]
        # the chat markers become added tokens: don't let BPE learn pieces of them
        for s in SPECIAL + ADDED:
            t = t.replace(s, " ")
        yield t
        n += len(t)
        if n >= max_chars:
            break


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default="build/train7/corpus")
    ap.add_argument("--out", default="build/train7/tok")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--max-chars", type=float, default=25e6)
    args = ap.parse_args()
    n_base = args.vocab - len(SPECIAL) - len(ADDED)
    tok = Tokenizer(BPE(dropout=None, unk_token=None, continuing_subword_prefix="",
                        end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(vocab_size=n_base, min_frequency=2, show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts(args.corpus, args.max_chars), trainer=trainer)
    assert tok.get_vocab_size() == n_base, tok.get_vocab_size()
    tok.add_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL] +
                   [AddedToken(s, special=False, normalized=False) for s in ADDED])
    # add_tokens marks them non-special; re-add the specials as special
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL])
    assert tok.get_vocab_size() == args.vocab, tok.get_vocab_size()
    ids = {s: tok.token_to_id(s) for s in SPECIAL + ADDED}
    assert list(ids.values()) == list(range(n_base, args.vocab)), ids
    os.makedirs(args.out, exist_ok=True)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    json.dump(ids, open(os.path.join(args.out, "special_ids.json"), "w"), indent=1)
    sample = "def f(x):\n    return x + 1  # ok\n<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>"
    enc = tok.encode(sample)
    assert tok.decode(enc.ids, skip_special_tokens=False) == sample
    print("vocab", tok.get_vocab_size(), "ids", ids, "sample tokens", len(enc.ids))


if __name__ == "__main__":
    sys.exit(main())

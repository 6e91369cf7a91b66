"""Writes tests/golden/tokenizer/*.jsonl with Hugging Face `tokenizers`.

Run: /work/venv-ref/bin/python tools/reference/tok_golden.py  (tokenizers==0.23.3)

Files (one JSON object per line):
  qwen3.jsonl    - the Qwen3 tokenizer in tests/data/qwen3-tokenizer
  qwen35re.jsonl - the same vocabulary with the Qwen3.5 pre-tokenizer regex
                   (\\p{M} variant); the C test builds the same tokenizer.json
Each line: {"text": s} or {"hex": bytes} (invalid UTF-8, fed to HF as
bytes.decode('utf-8', 'replace')), "ids", "decoded" (HF decode of ids), or
{"gen": kind, "n_ids", "fnv": FNV-1a 64 of the ids as uint32 LE} for the
generated 1 MB strings.
"""
import json, os, sys, unicodedata
sys.path.insert(0, os.path.dirname(__file__))
from tok_strings import all_strings, gen_long
from tokenizers import Tokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHARED = os.path.join(ROOT, "tests", "data")
OUT = os.path.join(ROOT, "tests", "golden", "tokenizer")
QWEN35_RE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def fnv(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def write(tok, path, added):
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for s in all_strings(added):
            rec = {}
            if isinstance(s, bytes):
                rec["hex"] = s.hex()
                text = s.decode("utf-8", "replace")
            else:
                rec["text"] = text = s
            ids = tok.encode(text).ids
            rec["ids"] = ids
            rec["decoded"] = tok.decode(ids, skip_special_tokens=False)
            assert rec["decoded"] == unicodedata.normalize("NFC", text), repr(text)
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
        for kind in ("mixed", "letters", "spaces"):
            ids = tok.encode(gen_long(kind)).ids
            f.write(json.dumps({"gen": kind, "n_ids": len(ids), "fnv": fnv(ids)}) + "\n")
            n += 1
    print(path, n, "vectors")


def main():
    os.makedirs(OUT, exist_ok=True)
    tj = os.path.join(SHARED, "qwen3-tokenizer", "tokenizer.json")
    tok = Tokenizer.from_file(tj)
    added = [t.content for t in tok.get_added_tokens_decoder().values()]
    write(tok, os.path.join(OUT, "qwen3.jsonl"), added)
    j = json.load(open(tj, encoding="utf-8"))
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN35_RE
    tok35 = Tokenizer.from_str(json.dumps(j))
    write(tok35, os.path.join(OUT, "qwen35re.jsonl"), added)


if __name__ == "__main__":
    main()

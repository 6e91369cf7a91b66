"""Single-thread encode throughput of HF tokenizers on the corpus."""
import os, sys, time
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer

tok = Tokenizer.from_file(os.path.join(sys.argv[1], "tokenizer.json"))
data = open(sys.argv[2], "rb").read()
lens = [int(x) for x in open(sys.argv[2] + ".idx")]
docs, off = [], 0
for n in lens:
    docs.append(data[off:off + n].decode("utf-8"))
    off += n
best = None
for rep in range(int(sys.argv[3]) if len(sys.argv) > 3 else 3):
    t0 = time.perf_counter()
    n_ids = 0
    h = 0
    for d in docs:
        ids = tok.encode(d).ids
        n_ids += len(ids)
        h = (h * 31 + sum(ids)) & 0xFFFFFFFFFFFFFFFF
    dt = time.perf_counter() - t0
    best = dt if best is None else min(best, dt)
print("hf_tokenizers: %.2f MB in %.3f s = %.2f MB/s, %d ids, check %016x" % (len(data) / 1e6, best, len(data) / 1e6 / best, n_ids, h))

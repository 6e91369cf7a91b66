"""Builds ~10 MB of mixed source code and prose from this machine:
C headers (/usr/include), docs (/usr/share/doc, plain text only) and the
Python standard library, in a fixed (sorted, interleaved) order.
Writes CORPUS (UTF-8 text, documents concatenated) and CORPUS.idx (byte
length of each document, one per line)."""
import os, sys, sysconfig

TARGET = int(float(sys.argv[2]) * 1e6) if len(sys.argv) > 2 else 10_000_000
out = sys.argv[1]


def files(root, exts, limit_each=400_000):
    got = []
    for d, _, fs in sorted(os.walk(root)):
        for f in sorted(fs):
            p = os.path.join(d, f)
            if os.path.splitext(f)[1] in exts and os.path.isfile(p) and not os.path.islink(p):
                if 200 < os.path.getsize(p) < limit_each:
                    got.append(p)
    return got


sources = [
    files("/usr/include", {".h", ".hpp"}),
    files("/usr/share/doc", {"", ".txt", ".md", ".rst", ".html"}),
    files(sysconfig.get_paths()["stdlib"], {".py"}),
]
docs, total = [], 0
idx = [0, 0, 0]
while total < TARGET and any(idx[i] < len(sources[i]) for i in range(3)):
    for i in range(3):  # a third of each kind
        if idx[i] >= len(sources[i]) or total >= TARGET:
            continue
        p = sources[i][idx[i]]
        idx[i] += 1
        try:
            raw = open(p, "rb").read()
        except OSError:
            continue
        if b"\0" in raw:
            continue
        text = raw.decode("utf-8", "replace").encode("utf-8")
        docs.append(text)
        total += len(text)
with open(out, "wb") as f:
    for d in docs:
        f.write(d)
with open(out + ".idx", "w") as f:
    for d in docs:
        f.write("%d\n" % len(d))
print("corpus: %d documents, %.2f MB" % (len(docs), total / 1e6))

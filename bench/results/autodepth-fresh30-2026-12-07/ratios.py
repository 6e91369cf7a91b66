import re, sys, statistics as st
def load(p):
    d = {}
    for line in open(p):
        m = re.match(r"round (\d+) (\S+) :: \| 4 \| [\d.]+ \| ([\d.]+) \|", line)
        if m: d.setdefault(int(m.group(1)), {})[m.group(2)] = float(m.group(3))
    return d
allr = []
for p in sys.argv[1:]:
    d = load(p)
    r = [v["auto"] / v["0"] for k, v in sorted(d.items()) if "auto" in v and "0" in v]
    z = [v["0"] for v in d.values() if "0" in v]; a = [v["auto"] for v in d.values() if "auto" in v]
    print(p, len(r), "rounds; medians 0 %.1f auto %.1f; ratios" % (st.median(z), st.median(a)), " ".join("%.3f" % x for x in r), "median %.3f mean %.3f" % (st.median(r), st.mean(r)))
    allr += r
print("pooled", len(allr), "median %.3f mean %.3f" % (st.median(allr), st.mean(allr)))
import random
random.seed(1)
bs = sorted(st.median(random.choices(allr, k=len(allr))) for _ in range(4000))
print("bootstrap 90%% interval of the median: %.3f-%.3f" % (bs[200], bs[3800]))

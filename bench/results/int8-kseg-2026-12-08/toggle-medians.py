# Per-rep times of `tandem kernels` from a debug build that printed "REP r k seconds" and switched one
# variant on for even reps and off for odd ones, in one process: medians by parity.
# usage: python3 toggle-medians.py "K segments" "whole K" seg-toggle-*.txt
#        python3 toggle-medians.py "NT stores" "memcpy" nt-toggle-*.txt
import collections, statistics, sys
on, off = sys.argv[1], sys.argv[2]
for f in sys.argv[3:]:
    d = collections.defaultdict(list)
    for l in open(f):
        if l.startswith('REP'):
            _, r, k, t = l.split()
            d[(int(r) % 2, int(k))].append(float(t) * 1e3)
    for p, name in ((0, on), (1, off)):
        print(f, name.ljust(12), ' '.join('t(%d) %.1f' % (k + 1, statistics.median(d[(p, k)])) for k in range(5)),
              ' t(5)/t(1) %.3f' % (statistics.median(d[(p, 4)]) / statistics.median(d[(p, 0)])))

# Per-rep times of `tandem kernels` (a debug build that printed "REP r k seconds" and switched the
# non-temporal slot stores on for even reps and off for odd ones, in one process): medians by parity.
import collections, statistics, sys
for f in sys.argv[1:]:
    d = collections.defaultdict(list)
    for l in open(f):
        if l.startswith('REP'):
            _, r, k, t = l.split()
            d[(int(r) % 2, int(k))].append(float(t) * 1e3)
    for p, name in ((0, 'NT stores'), (1, 'memcpy   ')):
        print(f, name, ' '.join('t(%d) %.1f' % (k + 1, statistics.median(d[(p, k)])) for k in range(5)),
              ' t(5)/t(1) %.3f' % (statistics.median(d[(p, 4)]) / statistics.median(d[(p, 0)])))

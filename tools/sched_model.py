"""Schedule model of the sm80 backward's launch orders (causal): one time unit per query-block
step of a CTA, one CTA per SM, in-order dispatch; deterministic modes wait for their turn at
each query block (the dQ adds), releasing half a step later. Prints each order's makespan
against the ideal (total work / SMs). Usage: python tools/sched_model.py M N heads [SMS]
(M query blocks, N key blocks per head; d128 at 4k: 64 32 64)."""
import heapq
import sys


def run(M, N, heads, sms, mode, c_sync=0.75, defer=0.5, red=0.25):
    r = M // N  # key block n sees query blocks [n * r, M)
    def visits(n, reverse=False):
        ms = list(range(n * r, M))
        return ms[::-1] if reverse else ms
    ctas = []  # (head, [(key block, query blocks in visiting order)])
    if mode in ("default_per_head", "det_descending"):
        for h in range(heads):
            order = range(N - 1, -1, -1) if mode == "det_descending" else range(N)
            ctas += [(h, [(n, visits(n))]) for n in order]
    elif mode == "default_heavy_first":
        ctas = [(h, [(n, visits(n))]) for n in range(N) for h in range(heads)]
    elif mode == "det_pairs":
        for h in range(heads):
            for p in range((N + 1) // 2):
                a = N - 1 - p
                ctas.append((h, [(a, visits(a))] + ([(p, visits(p, True))] if a != p else [])))
    det = mode.startswith("det")
    pred = {}  # (h, m, n) -> the key block that adds into m just before n
    if det:
        arrivals = {}
        for h, blocks in ctas:
            t = 0
            for n, ms in blocks:
                for m in ms:
                    key = (t, n) if mode == "det_pairs" else (-n, 0)
                    arrivals.setdefault((h, m), []).append((key, n))
                    t += 1
        for (h, m), lst in arrivals.items():
            lst.sort()
            for i in range(1, len(lst)):
                pred[(h, m, lst[i][1])] = lst[i - 1][1]
    release = {}
    while True:  # fixed point over the release times
        free = [0.0] * sms
        new, end = {}, 0.0
        for h, blocks in ctas:
            s = heapq.heappop(free)
            for n, ms in blocks:
                for m in ms:
                    sync = s + c_sync
                    if (h, m, n) in pred:
                        sync = max(sync, release.get((h, m, pred[(h, m, n)]), 0.0))
                    e = max(s + 1.0, sync + red)
                    new[(h, m, n)] = e + (defer if det else 0.0)
                    s = e
            heapq.heappush(free, s)
            end = max(end, s)
        if new == release:
            break
        release = new
    work = sum(len(ms) for _, blocks in ctas for _, ms in blocks)
    return end, work / sms


if __name__ == "__main__":
    M, N, heads = (int(x) for x in sys.argv[1:4])
    sms = int(sys.argv[4]) if len(sys.argv) > 4 else 132
    for mode in ("default_per_head", "default_heavy_first", "det_descending", "det_pairs"):
        end, ideal = run(M, N, heads, sms, mode)
        print(f"{mode:20s} makespan {end:8.1f}  ideal {ideal:8.1f}  efficiency {ideal / end:.3f}")

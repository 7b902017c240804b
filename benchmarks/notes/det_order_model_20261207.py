"""Discrete-event model of the sm90 d 256 deterministic backward's dQ adds (2026-12-07): CTAs
(key blocks of (head, sequence) pairs) launched in order onto S slots; per step the consumers
compute (tc us), then wait for the dQ stage, which the dQ warp frees once its add completes
(ta; the default backward: once read, tr); in deterministic mode the warp first waits for the
query block's semaphore to reach its turn; a release is seen tl later. Run it for the table in
benchmarks/NOTES.md."""
import heapq, itertools

def dispatch_order(nb, pairs, sect):
    order = []
    if sect <= 0:
        for p in range(pairs):
            for n in range(nb): order.append((p, n))
    else:
        for s0 in range(0, pairs, sect):
            here = min(sect, pairs - s0)
            for w in range(here * nb):
                order.append((s0 + w % here, w // here))
    return order

def simulate(nb, pairs, S, visit, rank, det, tc=3.4, ta=1.5, tr=0.5, tl=0.7, sect=1,
             order=None, tail=2.0, early_free=False, warps=1):
    if order is None: order = dispatch_order(nb, pairs, sect)
    sem, waiters, ev = {}, {}, []
    seq = itertools.count()
    def at(t, fn): heapq.heappush(ev, (t, next(seq), fn))
    state = {'free': S, 'nxt': 0, 'done': 0.0}
    def dispatch(t):
        while state['free'] > 0 and state['nxt'] < len(order):
            state['free'] -= 1
            p, n = order[state['nxt']]; state['nxt'] += 1
            V = visit(n)
            st = {'V': V, 'p': p, 'n': n, 'busy': False, 'waiter': None}
            if not V: at(t + tail, finish)
            else: at(t + tc, lambda tt, st=st: computed(tt, st, 0))
    def computed(t, st, i):
        if st['busy']:
            st['waiter'] = lambda tt, st=st, i=i: computed(tt, st, i)
            return
        st['busy'] = True
        if i + 1 < len(st['V']):
            at(t + tc, lambda tt, st=st, i=i: computed(tt, st, i + 1))
        warp(t, st, i)
    def free_stage(t, st):
        st['busy'] = False
        w = st['waiter']; st['waiter'] = None
        if w: at(t, w)
    def warp(t, st, i):
        wk = 'wbusy%d' % (i % warps)
        if st.get(wk, 0) > t:
            at(st[wk], lambda tt, st=st, i=i: warp(tt, st, i)); return
        key = (st['p'], st['V'][i])
        last = i + 1 == len(st['V'])
        if not det:
            at(t + tr, lambda tt, st=st: free_stage(tt, st))
            if last: at(t + ta + tail, finish)
            return
        r = rank(st['n'], st['V'][i])
        go = lambda tt, st=st, key=key, last=last, i=i: add(tt, st, key, last, i)
        if sem.get(key, 0) == r: go(t)
        else: waiters.setdefault(key, []).append((r, go))
    def add(t, st, key, last, i):
        t2 = t + ta
        st['wbusy%d' % (i % warps)] = t2
        at(t + tr if early_free else t2, lambda tt, st=st: free_stage(tt, st))
        def release(tt, key=key):
            sem[key] = sem.get(key, 0) + 1
            ws = waiters.get(key, [])
            for w in list(ws):
                if w[0] == sem[key]:
                    ws.remove(w); at(tt, w[1])
        at(t2 + tl, release)
        if last: at(t2 + tail, finish)
    def finish(t):
        state['free'] += 1
        state['done'] = max(state['done'], t)
        dispatch(t)
    dispatch(0.0)
    while ev:
        t, _, fn = heapq.heappop(ev)
        fn(t)
    stuck = sum(len(v) for v in waiters.values())
    return state['done'], stuck, state['nxt'] == len(order)

# ---- orders ----
def causal_desc(M):
    visit = lambda n: list(range(M - 1, n - 1, -1))
    rank = lambda n, m: n
    return visit, rank
def nc_desc(M, nb):
    visit = lambda n: list(range(M - 1, -1, -1))
    rank = lambda n, m: n
    return visit, rank
def causal_default(M):  # non-det ascending from diagonal (order irrelevant w/o det)
    return (lambda n: list(range(n, M))), (lambda n, m: 0)
def nc_rot(M, nb, chunk):
    # sm80: chunks of <= chunk key blocks; n visits (m) from (n - start) rotated
    chunks = (nb + chunk - 1) // chunk
    c = (nb + chunks - 1) // chunks
    def ch(n):
        s = n // c * c
        return s, min(c, nb - s)
    def visit(n):
        s, size = ch(n)
        r = (n - s) % M
        return [(r + k) % M for k in range(M)]
    def rank(n, m):
        s, size = ch(n)
        nn = n - s
        t = ((m - nn) % M + M) % M
        q, r0 = size // M, size % M
        low = 0
        if t > 0:
            start = ((m - t + 1) % M + M) % M; end = start + t
            low = max(0, min(end, r0) - start) + max(0, min(end, M + r0) - max(start, M))
        return s + t * q + low + nn // M
    return visit, rank


# ---- the runs quoted in benchmarks/NOTES.md (2026-12-07, fifth session) ----
def spt_order(nb, pairs, sect):
    """The diagonal order's launch: each section's key blocks from the last down."""
    return [(p, nb - 1 - n) for (p, n) in dispatch_order(nb, pairs, sect)]


if __name__ == "__main__":
    S = 132  # H100 SMs, one CTA each (the d 256 backward's shared memory)
    for N, B, H in [(2048, 8, 8), (4096, 4, 8), (16384, 1, 8)]:
        M = nb = N // 64  # d 256: 64 x 64 tiles
        pairs = B * H
        per_pair = N * (512 * 2 + 1024)
        sect = 1  # bwd_section_pairs: pairs whose Q, dO, dQ fit 80% of a 50 MB L2
        while sect * 2 * per_pair <= 40e6 and sect * 2 <= pairs:
            sect *= 2
        for ta in (2.0, 3.0, 4.0):
            v, r = causal_default(M)
            t0, _, _ = simulate(nb, pairs, S, v, r, False, ta=ta, sect=sect)
            v, r = causal_desc(M)
            t1, _, _ = simulate(nb, pairs, S, v, r, True, ta=ta, sect=sect)
            t2, stuck, ok = simulate(nb, pairs, S, lambda n: list(range(n, M)),
                                     lambda n, m: m - n, True, ta=ta,
                                     order=spt_order(nb, pairs, sect))
            print(f"N={N} sect={sect} ta={ta}: det/default index order {t0 / t1:.3f}, "
                  f"diagonal order {t0 / t2:.3f} (stuck {stuck}, all launched {ok})")

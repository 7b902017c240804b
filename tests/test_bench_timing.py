"""flashattn.bench's interleaved timing on the CPU: each round in its own order (no entry
behind the same one in every round) and every timed batch led by untimed calls of its own."""
import itertools

from flashattn import bench


def test_round_orders_vary_the_predecessors():
    for n in range(2, 11):
        orders = bench.round_orders(n, 5)
        assert orders == bench.round_orders(n, 5), "seeded: the same orders run to run"
        assert all(sorted(order) == list(range(n)) for order in orders)
        before = {}
        for order in orders:
            for a, b in zip(order, order[1:]):
                before.setdefault(b, set()).add(a)
        if n >= 4:  # rotating one order gave every entry a single predecessor
            assert all(len(p) >= 2 for p in before.values()), (n, orders)


def test_time_interleaved_leads_each_batch(monkeypatch):
    log = []
    names = "abc"
    entries = [(bench.contextlib.nullcontext, [lambda name=name: log.append(name)])
               for name in names]
    clock = itertools.count()  # every call "takes" 1/1024 s of the CPU path's wall clock
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock) / 1024)
    # exact in binary: 3 warm-up calls, 5 leading each batch (4.6), 10 timed (10.24)
    timing = bench.Timing(warmup_ms=3.0, rep_ms=10.0, min_reps=1, max_reps=100, rounds=5,
                          lead_ms=4.5)
    times = bench.time_interleaved(entries, bench.torch.device("cpu"), timing)
    assert [len(t) for t in times] == [10, 10, 10]
    warm = [name for name in names for _ in range(3 + 3)]  # the estimate's 3, then warmup_ms
    batches = [names[i] for order in bench.round_orders(3, 5) for i in order
               for _ in range(5 + 2)]  # lead_ms of untimed calls, then rep_ms / rounds timed
    assert log == warm + batches

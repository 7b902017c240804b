"""What the in-process A/B tools share (decode_env_ab.py, fwd_env_ab.py, decode_splits.py):
environment switches set around calls, CUDA-graph capture of a list of calls, and the
interleaved timing rounds."""
import contextlib
import os
import statistics

import torch


def parse_switch(pairs):
    """["NAME=VALUE", ...] -> {NAME: VALUE}."""
    return dict(p.partition("=")[::2] for p in pairs)


@contextlib.contextmanager
def switched(switch, on):
    """The variables of `switch` set (on) or unset (off) inside the block, unset after."""
    for name, value in switch.items():
        if on:
            os.environ[name] = value
        else:
            os.environ.pop(name, None)
    try:
        yield
    finally:
        for name in switch:
            os.environ.pop(name, None)


def captured(fns):
    """A CUDA graph of fns called in turn (warmed up on a side stream first)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    return g


def time_ab(runs, rounds, calls):
    """runs: {form: (setup context manager factory, callable doing `per` calls, per)}; the
    forms in turn each round, one untimed call first, then `calls` timed ones (CUDA events);
    ms per call, the median of the rounds."""
    times = {v: [] for v in runs}
    for _ in range(rounds):
        for v, (ctx, fn, per) in runs.items():
            with ctx():
                fn()
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                for _ in range(calls):
                    fn()
                end.record()
                end.synchronize()
            times[v].append(start.elapsed_time(end) / (calls * per))
    return {v: statistics.median(t) for v, t in times.items()}

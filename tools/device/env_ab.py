"""In-process A/B of a per-call environment switch: `run(value)` sets the variable to value (or
unsets it for None) and makes one call; the values alternate in rounds of `calls` timed calls
(CUDA events), each round after one untimed call of its own. Returns the per-call time (ms)
of each value, the median of its rounds. Used by decode_env_ab.py."""
import os
import statistics

import torch


def setenv(name, value):
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def time_env_ab(name, values, call, rounds=7, calls=5):
    times = {v: [] for v in values}
    for _ in range(rounds):
        for v in values:
            setenv(name, v)
            call()
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            for _ in range(calls):
                call()
            end.record()
            end.synchronize()
            times[v].append(start.elapsed_time(end) / calls)
    setenv(name, None)
    return {v: statistics.median(t) for v, t in times.items()}

"""The split count of the decode kernel against its time: flash_attn_with_kvcache at
num_splits 0 (the plan's choice) and fixed counts, per cell, timed as the benchmark times a
decode call (bench.time_calls over enough caches to exceed the L2); microseconds per call.
Usage: python3 tools/device/decode_splits.py [--cells 1x4096 1x16384] [--splits 0 8 16 ...]."""
import argparse
import math
import statistics

import torch

import flashattn
from flashattn import bench
from flashattn.bench_decode import DecodeCell, _cache


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", nargs="+", default=["1x4096", "1x16384", "8x4096"])
    ap.add_argument("--splits", nargs="+", type=int, default=[0, 4, 8, 16, 24, 48, 66])
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'cell':34s} " + " ".join(f"{'s=' + str(s):>8s}" for s in args.splits))
    for spec in args.cells:
        b, n = (int(x) for x in spec.split("x"))
        cell = DecodeCell(b, n)
        n_sets = min(max(math.ceil(2 * bench.l2_bytes(dev) / cell.kv_bytes()), 1), 16)
        sets = [_cache(cell, dev, heads_first=False) for _ in range(n_sets)]
        seqlens = torch.full((b,), n, dtype=torch.int32, device=dev)
        row = []
        for s in args.splits:
            calls = [lambda q=q, k=k, v=v: flashattn.flash_attn_with_kvcache(
                q, k, v, cache_seqlens=seqlens, num_splits=s) for q, k, v in sets]
            times = bench.time_calls(calls, dev, bench.Timing())
            row.append(statistics.median(times) * 1e3)
        print(f"{str(cell):34s} " + " ".join(f"{t:8.1f}" for t in row), flush=True)


if __name__ == "__main__":
    main()

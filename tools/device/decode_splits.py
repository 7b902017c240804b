"""The split count of the decode kernel against its time: flash_attn_with_kvcache at
num_splits 0 (the plan's choice) and fixed counts, per cell, timed as the benchmark times a
decode call (bench.time_calls over enough caches to exceed the L2), or with --graph the same
calls captured in CUDA graphs (the kernels' chain alone, host time out; SDPA cuDNN captured
too, as the last column); microseconds per call.
Usage: python3 tools/device/decode_splits.py [--graph] [--cells 1x4096 1x16384]
[--splits 0 8 ...]"""
import argparse
import contextlib
import math
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn
from ab_timing import captured, time_ab  # tools/device/
from flashattn import bench
from flashattn.bench_decode import DecodeCell, _cache


def graph_us(fns, rounds=7, calls=20):
    """Median over rounds of the per-call time (us) of fns captured in one CUDA graph."""
    g = captured(fns)
    return time_ab({0: (contextlib.nullcontext, g.replay, len(fns))}, rounds, calls)[0] * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", nargs="+", default=["1x4096", "1x16384", "8x4096"])
    ap.add_argument("--splits", nargs="+", type=int, default=[0, 4, 8, 16, 24, 48, 66])
    ap.add_argument("--graph", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(), "torch", torch.__version__,
          "(CUDA graphs)" if args.graph else "(the benchmark's timing)")
    print(f"{'cell':34s} " + " ".join(f"{'s=' + str(s):>8s}" for s in args.splits) +
          (f" {'cudnn':>8s}" if args.graph else ""))
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
            if args.graph:
                row.append(graph_us(calls))
            else:
                times = bench.time_calls(calls, dev, bench.Timing())
                row.append(statistics.median(times) * 1e3)
        if args.graph:  # SDPA cuDNN on the same numbers, heads first
            sdpa = [(q.transpose(1, 2), k.transpose(1, 2).contiguous(),
                     v.transpose(1, 2).contiguous()) for q, k, v in sets]
            try:
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    row.append(graph_us([lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
                        q, k, v, enable_gqa=cell.H != cell.Hk) for q, k, v in sdpa]))
            except RuntimeError as e:  # not capturable here: say so, keep ours
                print(f"  cudnn in a graph failed: {str(e).splitlines()[0][:100]}")
                row.append(float("nan"))
        print(f"{str(cell):34s} " + " ".join(f"{t:8.1f}" for t in row), flush=True)


if __name__ == "__main__":
    main()

"""A/B of the split-KV decode combine's parallel loop (the default) against the serial one
(FLASHATTN_DECODE_COMBINE=serial, read per call), in one process: issue 13's small-batch cells (GQA 32/8,
d128, bf16, one token), the two forms alternating in rounds of timed calls over enough caches
to exceed the L2; TB/s of K and V read at the median of the rounds, and the largest output
difference between the forms (the same partials merged in another order: a few ulps at most).
Usage: python3 tools/device/decode_combine_ab.py [--cells 1x4096 1x16384 ...] [--rounds 9]."""
import argparse
import math
import os
import statistics

import torch

from flashattn import bench
from flashattn.bench_decode import DecodeCell, _ours_call


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", nargs="+",
                    default=["1x4096", "1x16384", "1x65536", "8x4096", "8x16384", "1x16384p256"])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'cell':34s} {'par TB/s':>9s} {'serial':>9s} {'ratio':>7s} {'par us':>8s} "
          f"{'serial us':>9s} {'max|dout|':>10s}")
    for spec in args.cells:
        b, rest = spec.split("x")
        n, _, page = rest.partition("p")
        cell = DecodeCell(int(b), int(n), page=int(page or 0))
        n_sets = min(max(math.ceil(2 * bench.l2_bytes(dev) / cell.kv_bytes()), 1), 8)
        calls = [_ours_call(cell, dev) for _ in range(n_sets)]

        def run(form, i=0):
            if form == "serial":
                os.environ["FLASHATTN_DECODE_COMBINE"] = "serial"
            else:
                os.environ.pop("FLASHATTN_DECODE_COMBINE", None)
            return calls[i % n_sets]()
        diff = (run("par").float() - run("serial").float()).abs().max().item()
        times = {"par": [], "serial": []}
        for _ in range(args.rounds):
            for form in ("par", "serial"):
                for i in range(n_sets):
                    run(form, i)
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                for i in range(args.calls):
                    run(form, i)
                end.record()
                end.synchronize()
                times[form].append(start.elapsed_time(end) / args.calls)
        med = {f: statistics.median(t) for f, t in times.items()}
        tbs = {f: cell.kv_bytes() / (m * 1e-3) / 1e12 for f, m in med.items()}
        print(f"{str(cell):34s} {tbs['par']:9.3f} {tbs['serial']:9.3f} "
              f"{med['serial'] / med['par']:7.3f} {med['par'] * 1e3:8.1f} "
              f"{med['serial'] * 1e3:9.1f} {diff:10.3g}", flush=True)
        os.environ.pop("FLASHATTN_DECODE_COMBINE", None)
        del calls


if __name__ == "__main__":
    main()

"""In-process A/B of per-call decode switches, set together (default: the serial combine in a
plain launch, `FLASHATTN_DECODE_COMBINE=serial FLASHATTN_DECODE_PDL=0`; `--env NAME=VALUE` for
one) against the default path: issue 13's small-batch cells (GQA
32/8, d128, bf16, one token), the two alternating in rounds of timed calls (CUDA events) over
enough caches to exceed the L2; TB/s of K and V read at the median of the rounds, and the
largest output difference between them (the same partials merged: a few ulps at most).
Eager calls of the small cells are host-bound (the switches change GPU time only), so
`--graph` times the same calls captured in CUDA graphs (one graph a form, the switches read
at capture), the kernels' chain alone.
Usage: python3 tools/device/decode_env_ab.py [--env NAME=VALUE ...] [--graph]
[--cells 1x4096 ...]"""
import argparse
import contextlib
import math

import torch

from ab_timing import captured, parse_switch, switched, time_ab  # tools/device/
from flashattn import bench
from flashattn.bench_decode import DecodeCell, _ours_call


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", nargs="+",
                    default=["FLASHATTN_DECODE_COMBINE=serial", "FLASHATTN_DECODE_PDL=0"])
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--cells", nargs="+",
                    default=["1x4096", "1x16384", "1x65536", "8x4096", "8x16384", "1x16384p256"])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    switch = parse_switch(args.env)
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "switch", " ".join(args.env),
          "(CUDA graphs)" if args.graph else "(eager calls)")
    print(f"{'cell':34s} {'switch TB/s':>11s} {'default':>9s} {'ratio':>7s} {'switch us':>9s} "
          f"{'default us':>10s} {'max|dout|':>10s}")
    for spec in args.cells:
        b, rest = spec.split("x")
        n, _, page = rest.partition("p")
        cell = DecodeCell(int(b), int(n), page=int(page or 0))
        n_sets = min(max(math.ceil(2 * bench.l2_bytes(dev) / cell.kv_bytes()), 1), 8)
        calls = [_ours_call(cell, dev) for _ in range(n_sets)]
        outs = {}
        for on in (True, False):
            with switched(switch, on):
                outs[on] = calls[0]().float()
        diff = (outs[True] - outs[False]).abs().max().item()
        runs = {}
        for on in (True, False):
            ctx = lambda on=on: switched(switch, on)  # noqa: E731
            if args.graph:
                with ctx():
                    g = captured(calls)
                runs[on] = (contextlib.nullcontext, g.replay, n_sets)
            else:
                turn = [0]

                def call(turn=turn):
                    turn[0] += 1
                    return calls[turn[0] % n_sets]()
                runs[on] = (ctx, call, 1)
        med = time_ab(runs, args.rounds, args.calls)
        tbs = {v: cell.kv_bytes() / (m * 1e-3) / 1e12 for v, m in med.items()}
        print(f"{str(cell):34s} {tbs[True]:11.3f} {tbs[False]:9.3f} "
              f"{med[False] / med[True]:7.3f} {med[True] * 1e3:9.1f} "
              f"{med[False] * 1e3:10.1f} {diff:10.3g}", flush=True)
        del calls, runs


if __name__ == "__main__":
    main()

"""In-process A/B of a per-call decode switch (default: the programmatic dependent launch of
the combine, FLASHATTN_DECODE_PDL=1; `--env FLASHATTN_DECODE_COMBINE=serial` for the serial
combine) against the default path: issue 13's small-batch cells (GQA 32/8, d128, bf16, one
token), the two alternating in rounds of timed calls over enough caches to exceed the L2
(env_ab.time_env_ab); TB/s of K and V read at the median of the rounds, and the largest output
difference between them (the same partials merged: a few ulps at most).
Usage: python3 tools/device/decode_env_ab.py [--env NAME=VALUE] [--cells 1x4096 1x16384p256 ...]"""
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from env_ab import setenv, time_env_ab  # noqa: E402

from flashattn import bench  # noqa: E402
from flashattn.bench_decode import DecodeCell, _ours_call  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", default="FLASHATTN_DECODE_PDL=1")
    ap.add_argument("--cells", nargs="+",
                    default=["1x4096", "1x16384", "1x65536", "8x4096", "8x16384", "1x16384p256"])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    name, _, value = args.env.partition("=")
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "switch", args.env)
    print(f"{'cell':34s} {'switch TB/s':>11s} {'default':>9s} {'ratio':>7s} {'switch us':>9s} "
          f"{'default us':>10s} {'max|dout|':>10s}")
    for spec in args.cells:
        b, rest = spec.split("x")
        n, _, page = rest.partition("p")
        cell = DecodeCell(int(b), int(n), page=int(page or 0))
        n_sets = min(max(math.ceil(2 * bench.l2_bytes(dev) / cell.kv_bytes()), 1), 8)
        calls = [_ours_call(cell, dev) for _ in range(n_sets)]
        turn = [0]

        def call():
            turn[0] += 1
            return calls[turn[0] % n_sets]()
        outs = {}
        for v in (value, None):
            setenv(name, v)
            outs[v] = calls[0]().float()
        setenv(name, None)
        diff = (outs[value] - outs[None]).abs().max().item()
        med = time_env_ab(name, [value, None], call, rounds=args.rounds, calls=args.calls)
        tbs = {v: cell.kv_bytes() / (m * 1e-3) / 1e12 for v, m in med.items()}
        print(f"{str(cell):34s} {tbs[value]:11.3f} {tbs[None]:9.3f} "
              f"{med[None] / med[value]:7.3f} {med[value] * 1e3:9.1f} "
              f"{med[None] * 1e3:10.1f} {diff:10.3g}", flush=True)
        del calls


if __name__ == "__main__":
    main()

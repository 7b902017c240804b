"""A/B of a per-call switch of the sm90 block-sparse backward's launch order, in one process:
by default the heavy-first order (sm90/bwd_order_sm90.cuh) against the section order
(FLASHATTN_SM90_SPARSE_ORDER=1 / 0); --flag FLASHATTN_SM90_SPARSE_PAIRS the pair-major order
(launch_bwd_sm90.cuh) against the sections. Issue 16's masks (flashattn/bench_sparse.py),
backward only, the two settings alternating in rounds of timed calls; effective TFLOP/s over
the kept blocks (bench_sparse.kept_flops), the median of the rounds, and the largest gradient
difference between the settings (dQ's adds are unordered, so a few ulps). Usage: python3
tools/device/sparse_order_ab.py [--flag NAME] [--N 8192 32768] [--d 64 128] [--masks
local_global random50] [--rounds 7]."""
import argparse
import math
import os

import torch

import flashattn
from flashattn import bench_sparse as bs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--N", nargs="+", type=int, default=[2048, 8192, 32768])
    ap.add_argument("--d", nargs="+", type=int, default=[64, 128])
    ap.add_argument("--masks", nargs="+", default=["local_global", "random50", "random25"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--flag", default="FLASHATTN_SM90_SPARSE_ORDER",
                    help="the environment switch timed at 1 (on) against 0 (off)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{args.flag}=1 (on) against =0 (off), TFLOP/s")
    print(f"{'cell':40s} {'on':>9s} {'off':>9s} {'ratio':>7s} {'max|dgrad|':>11s}")
    for mask_kind in args.masks:
        for d in args.d:
            for n in args.N:
                cell = bs.SparseCell("bwd", mask_kind, d, n, max(1, 16384 // n), 2048 // d)
                mask = bs.block_mask(mask_kind, cell.H, math.ceil(n / cell.block), dev)
                prepared = flashattn.block_sparse_mask(mask, (cell.block, cell.block))
                q, k, v = bs._inputs(cell, dev, False)
                out = flashattn.block_sparse_attn_func(q, k, v, prepared)
                dout = torch.randn_like(out)

                def run(flag):
                    os.environ[args.flag] = flag
                    return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                g1, g0 = run("1"), run("0")
                diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(g1, g0))
                times = {"1": [], "0": []}
                for _ in range(args.rounds):
                    for flag in ("1", "0"):
                        run(flag)
                        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                        start.record()
                        for _ in range(args.calls):
                            run(flag)
                        end.record()
                        end.synchronize()
                        times[flag].append(start.elapsed_time(end) / args.calls)
                flops = bs.kept_flops(cell, mask)
                tf = {f: flops / (sorted(t)[len(t) // 2] * 1e-3) / 1e12 for f, t in times.items()}
                print(f"{str(cell):40s} {tf['1']:9.1f} {tf['0']:9.1f} {tf['1'] / tf['0']:7.3f} "
                      f"{diff:11.3g}", flush=True)
                os.environ.pop(args.flag, None)
                del q, k, v, out, dout, g0, g1
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

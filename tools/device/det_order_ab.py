"""A/B of the sm90 deterministic backward's dQ orders, in one process: causal calls (the
benchmark's grid: hidden 2048, B N = 16k tokens), the default backward against
deterministic=True with its index order (FLASHATTN_SM90_DET_DIAG unset) and with the diagonal
order (=1, csrc/sm90/bwd_layout_sm90.h), the three alternating in rounds of timed calls;
TFLOP/s (2.5x the forward's 4 B H N^2 d, halved for causal) of the median round, det /
default for both orders, and the largest gradient difference between the orders (their fp32
sums go in different orders: an ulp or two of bf16). Usage: python3
tools/device/det_order_ab.py [--d 64 128 256] [--N 1024 ... 16384] [--causal 1] [--rounds 7]."""
import argparse
import os
import statistics

import torch

import flashattn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", nargs="+", type=int, default=[64, 128, 256])
    ap.add_argument("--N", nargs="+", type=int, default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--causal", nargs="+", type=int, default=[1])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    os.environ["FLASHATTN_SM90_DET_BWD"] = "1"
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'cell':28s} {'default':>8s} {'det':>8s} {'diag':>8s} {'det/def':>8s} "
          f"{'diag/def':>9s} {'diag/det':>9s} {'max|dgrad|':>11s}")
    for causal in args.causal:
        for d in args.d:
            for n in args.N:
                b, h = max(1, 16384 // n), 2048 // d
                q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16,
                                       requires_grad=True) for _ in range(3))
                outs = {det: flashattn.flash_attn_func(q, k, v, causal=bool(causal),
                                                       deterministic=det)
                        for det in (False, True)}
                dout = torch.randn_like(outs[False])

                def run(mode):
                    if mode == "diag":
                        os.environ["FLASHATTN_SM90_DET_DIAG"] = "1"
                    else:
                        os.environ.pop("FLASHATTN_SM90_DET_DIAG", None)
                    out = outs[mode != "default"]
                    return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                g_det, g_diag = run("det"), run("diag")
                diff = max((a.float() - c.float()).abs().max().item()
                           for a, c in zip(g_det, g_diag))
                times = {m: [] for m in ("default", "det", "diag")}
                for _ in range(args.rounds):
                    for mode in times:
                        run(mode)
                        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                        start.record()
                        for _ in range(args.calls):
                            run(mode)
                        end.record()
                        end.synchronize()
                        times[mode].append(start.elapsed_time(end) / args.calls)
                flops = 2.5 * 4 * b * h * n * n * d / (2 if causal else 1)
                tf = {m: flops / (statistics.median(t) * 1e-3) / 1e12 for m, t in times.items()}
                cell = f"d{d} N{n} B{b} H{h} {'causal' if causal else 'full'}"
                print(f"{cell:28s} {tf['default']:8.1f} {tf['det']:8.1f} {tf['diag']:8.1f} "
                      f"{tf['det'] / tf['default']:8.3f} {tf['diag'] / tf['default']:9.3f} "
                      f"{tf['diag'] / tf['det']:9.3f} {diff:11.3g}", flush=True)
                del q, k, v, outs, dout


if __name__ == "__main__":
    main()

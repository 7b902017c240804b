"""A/B of the sm90 deterministic backward's switches, in one process: the benchmark's grid
cells (hidden 2048, B N = 16k tokens), the default backward against deterministic=True in the
index order with one dQ warp (FLASHATTN_SM90_DET_DIAG=0, _DQ2=0), with the diagonal dQ order
(causal calls; csrc/sm90/bwd_layout_sm90.h), with two dQ warps and with both (the default since
2026-12-07); the modes alternate in rounds of timed calls (ab_timing.time_ab). TFLOP/s (2.5x
the forward's 4 B H N^2 d, halved for causal) of the median round, each deterministic mode over
the default, and the largest gradient difference from the first deterministic mode (other
orders sum in fp32 in another order: an ulp or two of bf16; the same order must give 0).
Usage: python3 tools/device/det_order_ab.py [--d 64 128 256] [--N 1024 ... 16384] [--causal
0 1] [--rounds 7] [--modes diag dq2 diag+dq2] (default and det always run). Its first run
(H100, 2026-12-07) hung in its first cell (d 64 causal 1k) with every mode, before the two dQ
warps' hand-over was mended; its run of 2026-12-07's eighth session passed
(benchmarks/NOTES.md)."""
import argparse
import os

import torch

import flashattn
from ab_timing import switched, time_ab  # tools/device/

MODES = {  # name: (deterministic, switches; both on by default since 2026-12-07)
    "default": (False, {}),
    "det": (True, {"FLASHATTN_SM90_DET_DIAG": "0", "FLASHATTN_SM90_DET_DQ2": "0"}),
    "diag": (True, {"FLASHATTN_SM90_DET_DIAG": "1", "FLASHATTN_SM90_DET_DQ2": "0"}),
    "dq2": (True, {"FLASHATTN_SM90_DET_DIAG": "0", "FLASHATTN_SM90_DET_DQ2": "1"}),
    "diag+dq2": (True, {"FLASHATTN_SM90_DET_DIAG": "1", "FLASHATTN_SM90_DET_DQ2": "1"}),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", nargs="+", type=int, default=[64, 128, 256])
    ap.add_argument("--N", nargs="+", type=int, default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--causal", nargs="+", type=int, default=[1, 0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--modes", nargs="+", default=["diag", "dq2", "diag+dq2"],
                    choices=["diag", "dq2", "diag+dq2"])
    args = ap.parse_args()
    modes = {m: MODES[m] for m in ["default", "det"] + args.modes}
    dets = [m for m in modes if m != "default"]
    os.environ["FLASHATTN_SM90_DET_BWD"] = "1"
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'cell':26s} {'default':>8s} " + " ".join(f"{m:>9s}" for m in dets) +
          "   (TFLOP/s; then each over the default; max|dgrad - det's|)")
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

                def grads(det):
                    return torch.autograd.grad(outs[det], (q, k, v), dout, retain_graph=True)

                def in_mode(m):
                    return switched(modes[m][1], True)
                diffs = {}
                with in_mode("det"):
                    ref = grads(True)
                for m in dets:
                    with in_mode(m):
                        diffs[m] = max((a.float() - c.float()).abs().max().item()
                                       for a, c in zip(grads(True), ref))
                ms = time_ab({m: (lambda m=m: in_mode(m), lambda m=m: grads(modes[m][0]), 1)
                              for m in modes}, args.rounds, args.calls)
                flops = 2.5 * 4 * b * h * n * n * d / (2 if causal else 1)
                tf = {m: flops / (t * 1e-3) / 1e12 for m, t in ms.items()}
                cell = f"d{d} N{n} B{b} H{h} {'causal' if causal else 'full'}"
                print(f"{cell:26s} {tf['default']:8.1f} " +
                      " ".join(f"{tf[m]:9.1f}" for m in dets), flush=True)
                print(f"{'':26s} {'':8s} " +
                      " ".join(f"{tf[m] / tf['default']:9.3f}" for m in dets) + "  " +
                      " ".join(f"{diffs[m]:.2g}" for m in dets), flush=True)
                del q, k, v, outs, dout


if __name__ == "__main__":
    main()

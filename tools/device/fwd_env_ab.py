"""In-process A/B of per-call forward switches (read per call, e.g. `FLASHATTN_SM90_TMA_O=0`;
several set together) against the default path and SDPA cuDNN, on the benchmark's shapes
(bf16, B x N = 16384, H x d = 2048): the three in turn each round (CUDA events, one untimed
call first), TFLOP/s at the median of the rounds, and the largest output difference between
our two forms. (Written for the 64-row tiles of 2026-12-07, since dropped:
benchmarks/results/h100_fwd_small_32b3356.txt.)
Usage: python3 tools/device/fwd_env_ab.py --env NAME=VALUE ... [--d 64 128] [--N 512 1024]"""
import argparse
import os
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", nargs="+", required=True)
    ap.add_argument("--d", nargs="+", type=int, default=[64, 128])
    ap.add_argument("--N", nargs="+", type=int, default=[512, 1024, 2048, 4096])
    ap.add_argument("--causal", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=10)
    args = ap.parse_args()
    switch = dict(e.partition("=")[::2] for e in args.env)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "switch", " ".join(args.env))
    print(f"{'cell':30s} {'switch':>8s} {'default':>8s} {'cudnn':>8s} {'sw/def':>7s} "
          f"{'sw/cudnn':>8s} {'def/cudnn':>9s} {'max|dout|':>10s}")

    def setenv(on):
        for name, value in switch.items():
            if on:
                os.environ[name] = value
            else:
                os.environ.pop(name, None)

    for d in args.d:
        for causal in args.causal:
            for n in args.N:
                b, h = 16384 // n, 2048 // d
                q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                forms = {
                    "switch": (lambda: setenv(True), lambda: flashattn.flash_attn_func(
                        q, k, v, causal=bool(causal))),
                    "default": (lambda: setenv(False), lambda: flashattn.flash_attn_func(
                        q, k, v, causal=bool(causal))),
                    "cudnn": (lambda: setenv(False), lambda: F.scaled_dot_product_attention(
                        qt, kt, vt, is_causal=bool(causal))),
                }
                outs = {}
                for name in ("switch", "default"):
                    forms[name][0]()
                    outs[name] = forms[name][1]().float()
                diff = (outs["switch"] - outs["default"]).abs().max().item()
                times = {name: [] for name in forms}
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    for _ in range(args.rounds):
                        for name, (prep, fn) in forms.items():
                            prep()
                            fn()
                            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                            start.record()
                            for _ in range(args.calls):
                                fn()
                            end.record()
                            end.synchronize()
                            times[name].append(start.elapsed_time(end) / args.calls)
                setenv(False)
                flops = 4 * b * h * n * n * d / (2 if causal else 1)
                tf = {name: flops / (statistics.median(t) * 1e-3) / 1e12
                      for name, t in times.items()}
                cell = f"fwd d={d} N={n} B={b} H={h} c={causal}"
                print(f"{cell:30s} {tf['switch']:8.1f} {tf['default']:8.1f} {tf['cudnn']:8.1f} "
                      f"{tf['switch'] / tf['default']:7.3f} {tf['switch'] / tf['cudnn']:8.3f} "
                      f"{tf['default'] / tf['cudnn']:9.3f} {diff:10.3g}", flush=True)
                del q, k, v, qt, kt, vt, outs


if __name__ == "__main__":
    main()

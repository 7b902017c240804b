"""A/B of the persistent sm90 backward (FLASHATTN_SM90_BWD_PERSIST=1, read per call) against
the default grid of one CTA per key block, in one process: the benchmark's cells (hidden
2048, B * N = 16k, bf16), backward only, the two alternating in rounds (env_ab.py); TFLOP/s
(2.5x the forward's flops, halved when causal) and the largest gradient difference (dQ's
adds are unordered: a few ulps). Usage: python3 tools/device/bwd_persist_ab.py [--d 64 128]
[--N 1024 2048 4096 16384] [--causal 0 1] [--rounds 7]."""
import argparse

import torch

import flashattn
from env_ab import setenv, time_env_ab

VAR = "FLASHATTN_SM90_BWD_PERSIST"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", nargs="+", type=int, default=[64, 128])
    ap.add_argument("--N", nargs="+", type=int, default=[1024, 2048, 4096, 16384])
    ap.add_argument("--causal", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'cell':34s} {'persist':>9s} {'default':>9s} {'ratio':>7s} {'max|dgrad|':>11s}")
    for d in args.d:
        for n in args.N:
            for causal in args.causal:
                b, h = max(1, 16384 // n), 2048 // d
                q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16,
                                       requires_grad=True) for _ in range(3))
                out = flashattn.flash_attn_func(q, k, v, causal=bool(causal))
                dout = torch.randn_like(out)

                def call():
                    return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                setenv(VAR, "1")
                g1 = call()
                setenv(VAR, None)
                g0 = call()
                diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(g1, g0))
                ms = time_env_ab(VAR, ("1", None), call, args.rounds, args.calls)
                flops = 2.5 * 4 * b * h * n * n * d / (2 if causal else 1)
                tf = {key: flops / (t * 1e-3) / 1e12 for key, t in ms.items()}
                cell = f"bwd d={d} N={n} B={b} H={h} causal={causal}"
                print(f"{cell:34s} {tf['1']:9.1f} {tf[None]:9.1f} {tf['1'] / tf[None]:7.3f} "
                      f"{diff:11.3g}", flush=True)
                del q, k, v, out, dout, g0, g1
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

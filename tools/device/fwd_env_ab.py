"""In-process A/B of per-call forward switches (read per call, e.g. `FLASHATTN_SM90_TMA_O=0`;
several set together) against the default path and SDPA cuDNN, on the benchmark's shapes
(bf16, B x N = 16384, H x d = 2048): the three in turn each round (CUDA events, one untimed
call first), TFLOP/s at the median of the rounds, and the largest output difference between
our two forms. (Written for the 64-row tiles of 2026-12-07, since dropped:
benchmarks/results/h100_fwd_small_32b3356.txt.) --dtype fp8: e4m3 inputs (no descales), the
peer column our bf16 forward on the same values (SDPA has no FP8), e.g. the on-chip V^T:
`--dtype fp8 --env FLASHATTN_SM90_FP8_VCHIP=1 --d 64 128 256 --N 1024 2048 4096 16384`.
Usage: python3 tools/device/fwd_env_ab.py --env NAME=VALUE ... [--d 64 128] [--N 512 1024]"""
import argparse
import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn
from ab_timing import parse_switch, switched, time_ab  # tools/device/


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", nargs="+", required=True)
    ap.add_argument("--d", nargs="+", type=int, default=[64, 128])
    ap.add_argument("--N", nargs="+", type=int, default=[512, 1024, 2048, 4096])
    ap.add_argument("--causal", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--dtype", choices=["bf16", "fp8"], default="bf16")
    args = ap.parse_args()
    fp8 = args.dtype == "fp8"
    peer = "bf16" if fp8 else "cudnn"
    switch = parse_switch(args.env)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "switch", " ".join(args.env))
    print(f"{'cell':30s} {'switch':>8s} {'default':>8s} {peer:>8s} {'sw/def':>7s} "
          f"{'sw/' + peer:>8s} {'def/' + peer:>9s} {'max|dout|':>10s}")
    for d in args.d:
        for causal in args.causal:
            for n in args.N:
                b, h = 16384 // n, 2048 // d
                q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                if fp8:
                    q, k, v = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
                    qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
                else:
                    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                def ours():
                    return flashattn.flash_attn_func(q, k, v, causal=bool(causal))
                def peer_fn():
                    if fp8:
                        return flashattn.flash_attn_func(qb, kb, vb, causal=bool(causal))
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
                runs = {
                    "switch": (lambda: switched(switch, True), ours, 1),
                    "default": (lambda: switched(switch, False), ours, 1),
                    peer: (contextlib.nullcontext, peer_fn, 1),
                }
                outs = {}
                for name in ("switch", "default"):
                    with runs[name][0]():
                        outs[name] = ours().float()
                diff = (outs["switch"] - outs["default"]).abs().max().item()
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    med = time_ab(runs, args.rounds, args.calls)
                flops = 4 * b * h * n * n * d / (2 if causal else 1)
                tf = {name: flops / (t * 1e-3) / 1e12 for name, t in med.items()}
                cell = f"fwd d={d} N={n} B={b} H={h} c={causal}"
                print(f"{cell:30s} {tf['switch']:8.1f} {tf['default']:8.1f} {tf[peer]:8.1f} "
                      f"{tf['switch'] / tf['default']:7.3f} {tf['switch'] / tf[peer]:8.3f} "
                      f"{tf['default'] / tf[peer]:9.3f} {diff:10.3g}", flush=True)
                del q, k, v, outs


if __name__ == "__main__":
    main()

"""The backward of softcap / ALiBi calls on the H200: the sm90 backward's score-transform
kernels (the default) against the sm80 backward (FLASHATTN_FORCE_BACKEND=sm80 while the
backward runs), and the plain call's sm90 backward beside them, in one process, interleaved
in shuffled rounds (flashattn.bench.time_interleaved). bf16, hidden 2048, B * N = 16k, GQA
off; TFLOP/s of the backward alone (2.5x the forward's count; the forward runs once).

Usage: python3 tools/device/score_mod_bwd_ab.py [--d 64 128 256] [--N 2048 8192]
(--device cpu --tokens 256 --N 128 --d 64: a smoke run of the script on the CPU backend)
"""
import argparse
import contextlib
import os
import statistics

import torch

import flashattn
from flashattn import bench


@contextlib.contextmanager
def forced(value):
    old = os.environ.get("FLASHATTN_FORCE_BACKEND")
    if value is None:
        os.environ.pop("FLASHATTN_FORCE_BACKEND", None)
    else:
        os.environ["FLASHATTN_FORCE_BACKEND"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("FLASHATTN_FORCE_BACKEND", None)
        else:
            os.environ["FLASHATTN_FORCE_BACKEND"] = old


def backward_calls(d, N, causal, kw, dev, tokens, n_sets=4):
    B, H = tokens // N, 2048 // d
    calls = []
    for _ in range(n_sets):
        q, k, v = (torch.randn(B, N, H, d, device=dev, dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        extra = dict(kw)
        if extra.pop("alibi", False):
            extra["alibi_slopes"] = torch.rand(B, H, device=dev)
        out = flashattn.flash_attn_func(q, k, v, causal=causal, **extra)
        g = torch.randn_like(out)
        calls.append(lambda out=out, q=q, k=k, v=v, g=g:
                     torch.autograd.grad(out, (q, k, v), g, retain_graph=True))
    return calls, B, H


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", nargs="+", type=int, default=[64, 128, 256])
    ap.add_argument("--N", nargs="+", type=int, default=[2048, 8192])
    ap.add_argument("--tokens", type=int, default=16384, help="B * N")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script")
    args = ap.parse_args()
    dev = torch.device(args.device)
    timing = bench.Timing() if dev.type == "cuda" else bench.Timing(warmup_ms=0, rep_ms=0,
                                                                    min_reps=1, rounds=1)
    mods = {"softcap": dict(softcap=30.0), "alibi": dict(alibi=True),
            "both": dict(softcap=30.0, alibi=True)}
    print("mode d causal N | plain sm90 | mod: sm90 / sm80 TFLOP/s (x) ...")
    for d in args.d:
        for causal in (False, True):
            for N in args.N:
                entries, names = [], []
                calls, B, H = backward_calls(d, N, causal, {}, dev, args.tokens)
                entries.append((lambda: forced(None), calls))
                names.append(("plain", "sm90"))
                for name, kw in mods.items():
                    calls, _, _ = backward_calls(d, N, causal, kw, dev, args.tokens)
                    for force in (None, "sm80"):
                        entries.append((lambda force=force: forced(force), calls))
                        names.append((name, "sm80" if force else "default"))
                for _, calls in entries:
                    calls[0]()
                times = bench.time_interleaved(entries, dev, timing)
                flops = bench.attn_flops("bwd", B, H, N, d, causal)
                tf = [flops / (statistics.median(t) * 1e-3) / 1e12 for t in times]
                q = torch.empty(B, N, H, d, device=dev, dtype=torch.bfloat16)
                path = flashattn.kernel_path(q, q, q, direction="bwd", causal=causal,
                                             softcap=30.0)
                parts = [f"bwd d{d} causal={int(causal)} N={N} | plain {tf[0]:.1f}"]
                for i in range(1, len(entries), 2):
                    parts.append(f"{names[i][0]} ({path}) {tf[i]:.1f} / sm80 {tf[i + 1]:.1f} "
                                 f"({tf[i] / tf[i + 1]:.2f}x)")
                print(" | ".join(parts), flush=True)


if __name__ == "__main__":
    main()

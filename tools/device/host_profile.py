"""Host time per call of our forward (requires_grad on / off) and decode, and where it goes:
cProfile of back-to-back calls (GPU kernels overlap; the host is the limit when wall > kernels).
Usage: python3 tools/device/host_profile.py"""
import cProfile
import pstats
import time

import torch

import flashattn
from flashattn.bench_decode import DecodeCell, _ours_call


def wall(call, reps=200):
    for _ in range(10):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    host = (time.perf_counter() - t0) / reps * 1e6
    torch.cuda.synchronize()
    return host, (time.perf_counter() - t0) / reps * 1e6


def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    b, n, h, d = 16, 1024, 16, 128
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    small = [torch.randn(1, 128, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    calls = {
        "fwd d128 1k, no grad": lambda: flashattn.flash_attn_func(q, k, v),
        "fwd d128 1k, requires_grad": lambda: flashattn.flash_attn_func(qg, kg, vg),
        "fwd tiny (1x128x2x64)": lambda: flashattn.flash_attn_func(*small),
        "decode 1x4k": _ours_call(DecodeCell(1, 4096), torch.device("cuda")),
    }
    for name, call in calls.items():
        host, total = wall(call)
        print(f"{name:32s} host issue {host:8.1f} us/call, wall {total:8.1f} us/call")
    for name in ("fwd tiny (1x128x2x64)", "fwd d128 1k, requires_grad", "decode 1x4k"):
        call = calls[name]
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            call()
        prof.disable()
        torch.cuda.synchronize()
        print(f"== cProfile {name} (200 calls)")
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()

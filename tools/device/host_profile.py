"""Host time per call of our forward (requires_grad on / off) and decode, and where it goes:
cProfile of back-to-back calls (GPU kernels overlap; the host is the limit when wall > kernels),
then torch.profiler's CPU table of the decode call (the ATen calls our C++ makes through the
stable ABI, the CUDA runtime calls, each with its host time) beside SDPA cuDNN's host time for
the same decode cell.
Usage: python3 tools/device/host_profile.py"""
import cProfile
import pstats
import time

import torch

import flashattn
from flashattn.bench_decode import DecodeCell, _ours_call, _sdpa_call


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
    cell = DecodeCell(1, 4096)
    sdpa = _sdpa_call(cell, torch.device("cuda"))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        host, total = wall(sdpa)
    print(f"{'decode 1x4k, SDPA cuDNN':32s} host issue {host:8.1f} us/call, wall {total:8.1f} us/call")
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    for name, call in (("ours", calls["decode 1x4k"]), ("sdpa cudnn", sdpa)):
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            wall(call, 20)
            with torch.profiler.profile(activities=acts) as prof:
                for _ in range(100):
                    call()
                torch.cuda.synchronize()
        print(f"== torch.profiler decode 1x4k {name} (100 calls; CPU times are per 100)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=16,
                                        max_name_column_width=60))


if __name__ == "__main__":
    main()

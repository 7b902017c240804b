"""Where a call's GPU time goes: per-kernel CUDA time (torch.profiler) of our forward, backward
and decode calls on the cells where fixed costs weigh most (issues 11 / 12 / 13: N 1k, batch-1
decode), beside SDPA cuDNN's kernels for the same call, and the host-side time per call
(wall clock over back-to-back calls, against the kernels' sum). Usage:
python3 tools/device/kernel_times.py [--cells fwd:128:0:1024 bwd:128:0:1024 dec:1:4096 ...]."""
import argparse
import collections

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import flashattn
from flashattn.bench_decode import DecodeCell, _ours_call

import host_profile  # noqa: E402  (tools/device/, the script's own folder: its wall())


def attn_calls(mode, d, causal, n):
    b, h = 16384 // n, 2048 // d
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    out = flashattn.flash_attn_func(q, k, v, causal=causal)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out_c = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    do, do_c = torch.randn_like(out), torch.randn_like(out_c)

    def ours():
        if mode == "fwd":
            return flashattn.flash_attn_func(q, k, v, causal=causal)
        return torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            if mode == "fwd":
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            return torch.autograd.grad(out_c, (qt, kt, vt), do_c, retain_graph=True)
    return {"ours": ours, "cudnn": cudnn}


def report(name, call, reps):
    host, wall = host_profile.wall(call, reps)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    per = collections.defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name] += ev.device_time / reps
    total = sum(per.values())
    print(f"  {name}: host issue {host:8.1f} us/call, wall {wall:8.1f} us/call, kernels "
          f"{total:8.1f} us/call")
    for kname, us in sorted(per.items(), key=lambda kv: -kv[1])[:8]:
        print(f"    {us:8.1f} us  {kname[:110]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", nargs="+", default=[
        "fwd:64:1:1024", "fwd:64:0:1024", "fwd:128:0:1024", "fwd:256:1:1024",
        "bwd:128:0:1024", "bwd:128:1:1024", "dec:1:4096", "dec:1:16384", "dec:8:4096"])
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for spec in args.cells:
        parts = spec.split(":")
        print(spec)
        if parts[0] == "dec":
            cell = DecodeCell(int(parts[1]), int(parts[2]))
            report("ours", _ours_call(cell, torch.device("cuda")), args.reps)
            continue
        mode, d, causal, n = parts[0], int(parts[1]), bool(int(parts[2])), int(parts[3])
        for name, call in attn_calls(mode, d, causal, n).items():
            report(name, call, args.reps)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

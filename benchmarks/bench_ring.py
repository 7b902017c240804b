"""Ring attention's scaling over the GPUs of one host (issue 19): launched by torchrun, one
process per GPU, NCCL (gloo on CPU ranks for a dry run).

Cells: d 128, H 16, bf16, batch 1, causal (zigzag layout) and not; weak scaling with a fixed
number of tokens per rank (default 64k: 128k in all at W = 2 ... 512k at W = 8) and strong
scaling with a fixed total (default 128k at every W). Per cell, forward and forward+backward
(a training step: out.backward(dout)) of flashattn.distributed.ring_flash_attn_func on every
rank, timed with CUDA events between barriers (the slowest rank's time, the median over the
repetitions), and on rank 0 the same work on one GPU: flash_attn_func over the full sequence
(our own kernel). Efficiency = (one-GPU time / W) / W-rank time.

Rows go to --json (with the GPU count, NCCL's version and `nvidia-smi topo -m`, the link) and a
table to stdout. Examples:
  torchrun --nproc-per-node=2 benchmarks/bench_ring.py --json benchmarks/results/ring_h200x2.json
  torchrun --nproc-per-node=8 benchmarks/bench_ring.py --modes weak strong --reps 3
  torchrun --nproc-per-node=2 benchmarks/bench_ring.py --device cpu --tokens-per-rank 256 \\
      --total 512 --heads 2 --dim 32 --dtype fp32 --reps 2   # a gloo dry run on CPU ranks
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

import flashattn
from flashattn.bench import DTYPES
from flashattn.distributed import zigzag_shard


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", default=["weak", "strong"], choices=["weak", "strong"])
    ap.add_argument("--causal", nargs="+", type=int, default=[1, 0], choices=[0, 1])
    ap.add_argument("--tokens-per-rank", type=int, default=65536, help="weak scaling")
    ap.add_argument("--total", type=int, default=131072, help="strong scaling")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--json", help="write the rows here (rank 0)")
    ap.add_argument("--commit", help="the commit to record (a copy without .git)")
    return ap.parse_args()


class Timer:
    """Per-call times (ms) of fn on this rank: CUDA events on a GPU, the wall clock on the
    CPU; across_ranks: each call between barriers, the slowest rank's time per repetition
    (all-reduce max)."""

    def __init__(self, device, across_ranks=True):
        self.device, self.across_ranks = device, across_ranks

    def __call__(self, fn, reps, warmup):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            if self.across_ranks:
                dist.barrier()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                fn()
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end)
            else:
                t0 = time.perf_counter()
                fn()
                ms = (time.perf_counter() - t0) * 1e3
            times.append(ms)
        if self.across_ranks:
            t = torch.tensor(times, dtype=torch.float64,
                             device=self.device if self.device.type == "cuda" else "cpu")
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times = t.tolist()
        return statistics.median(times)


def step_calls(q, k, v, dout, attn):
    """(forward, forward+backward) calls of attn on leaf copies of q, k, v."""
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))

    def fwd():
        with torch.no_grad():
            return attn(q, k, v)

    def fwd_bwd():
        out = attn(qg, kg, vg)
        out.backward(dout)
        qg.grad = kg.grad = vg.grad = None
    return fwd, fwd_bwd


def link_info():
    try:
        return subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                              timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def main():
    args = parse_args()
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dtype = DTYPES[args.dtype]
    ring_timer, one_timer = Timer(device), Timer(device, across_ranks=False)
    rows = []
    for mode in args.modes:
        total = args.tokens_per_rank * world if mode == "weak" else args.total
        for causal in args.causal:
            if total % (2 * world):
                raise SystemExit(f"{total} tokens do not split into {2 * world} zigzag chunks")
            gen = torch.Generator().manual_seed(1234)  # the same full tensors on every rank
            shape = (1, total, args.heads, args.dim)
            full = [torch.randn(shape, generator=gen).to(dtype) for _ in range(4)]
            local = [zigzag_shard(x, rank, world).to(device) for x in full]

            def ring(q, k, v):
                return flashattn.distributed.ring_flash_attn_func(q, k, v, causal=bool(causal),
                                                                  layout="zigzag")
            fwd, fwd_bwd = step_calls(*local, ring)
            row = {"mode": mode, "world_size": world, "causal": bool(causal), "tokens": total,
                   "tokens_per_rank": total // world, "heads": args.heads, "d": args.dim,
                   "dtype": args.dtype,
                   "ring_fwd_ms": ring_timer(fwd, args.reps, args.warmup),
                   "ring_fwd_bwd_ms": ring_timer(fwd_bwd, args.reps, args.warmup)}
            del fwd, fwd_bwd, local
            if rank == 0:  # the same work on one GPU (our own kernel, the full sequence)
                dev_full = [x.to(device) for x in full]

                def one(q, k, v):
                    return flashattn.flash_attn_func(q, k, v, causal=bool(causal))
                fwd, fwd_bwd = step_calls(*dev_full, one)
                row["one_fwd_ms"] = one_timer(fwd, args.reps, args.warmup)
                row["one_fwd_bwd_ms"] = one_timer(fwd_bwd, args.reps, args.warmup)
                del fwd, fwd_bwd, dev_full
                for what in ("fwd", "fwd_bwd"):
                    row[f"eff_{what}"] = (row[f"one_{what}_ms"] / world) / row[f"ring_{what}_ms"]
                rows.append(row)
                print(f"{mode:6s} W={world} {'causal' if causal else 'full  '} "
                      f"tokens={total:7d}  ring fwd {row['ring_fwd_ms']:9.2f} ms "
                      f"fwd+bwd {row['ring_fwd_bwd_ms']:9.2f} ms  one GPU fwd "
                      f"{row['one_fwd_ms']:9.2f} fwd+bwd {row['one_fwd_bwd_ms']:9.2f}  "
                      f"efficiency fwd {row['eff_fwd']:.3f} fwd+bwd {row['eff_fwd_bwd']:.3f}",
                      flush=True)
            del full
            if device.type == "cuda":
                torch.cuda.empty_cache()
            dist.barrier()
    if rank == 0 and args.json:
        header = {
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "gpu_count": world,
            "nccl": ".".join(map(str, torch.cuda.nccl.version()))
            if device.type == "cuda" else None,
            "backend": backend, "torch": torch.__version__, "cuda": torch.version.cuda,
            "link": link_info() if device.type == "cuda" else None,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": args.commit, "argv": sys.argv[1:],
            "timing": "median over --reps of the slowest rank's per-call time (CUDA events "
                      "between barriers); efficiency = (one-GPU time / W) / W-rank time",
        }
        with open(args.json, "w") as f:
            json.dump({"header": header, "rows": rows}, f, indent=1)
        print(f"wrote {args.json}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

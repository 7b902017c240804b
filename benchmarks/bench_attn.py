"""The benchmark grid: flashattn against SDPA's flash, cuDNN and efficient backends and
FlashAttention-4 (`fa4`, whenever `import flash_attn.cute` succeeds).

Grid (conventions.md): hidden 2048 (H = 2048/d), B = 16384/N, N in 512..16384,
d in {64, 128, 256}, causal and not, fwd and bwd; TFLOP/s of the median CUDA-event time
and our speed-up over each peer and the best one. A peer that cannot be set up is left out
(a rejected cell is null); --require-peer makes either an error. Examples:
  python benchmarks/bench_attn.py --json benchmarks/results/h200.json --plot /tmp/plots
  python benchmarks/bench_attn.py --require-peer fa4 --json /tmp/h200.json   # FA4 or fail
  python benchmarks/bench_attn.py --d 128 --N 2048 8192 --modes fwd   # a quick subset
  python benchmarks/bench_attn.py --memory --modes                    # peak memory only
  python benchmarks/bench_attn.py --device cpu --N 512 --tokens 512 --hidden 256  # dry run
  python benchmarks/bench_attn.py --dtype fp8 --json /tmp/h200_fp8.json  # FP8 vs our bf16
--dtype fp8 (issue 14) times our FP8 forward (random descales) against our bf16 forward of the
same cell in the same run (column flashattn_bf16, ratio fp8/bf16); rows carry dtype "e4m3";
no SDPA peer (SDPA has no FP8); forward only. Where our FP8 forward cannot run (no sm90 FP8
kernel yet, another GPU, a build without FP8) it stops at once with the reason.
"""

import argparse
import hashlib
import datetime
import importlib.metadata
import json
import os
import subprocess
import sys
from typing import Optional

import torch

from flashattn import bench

MEMORY_N = (4096, 16384, 65536)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="*", default=None, choices=["fwd", "bwd"],
                        help="directions to time (default fwd bwd; fwd with --dtype fp8); none "
                             "at all skips the timing grid")
    parser.add_argument("--d", nargs="+", type=int, default=[64, 128, 256])
    parser.add_argument("--N", nargs="+", type=int, default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--causal", nargs="+", type=int, default=[0, 1], choices=[0, 1])
    parser.add_argument("--dtype", default="bf16", choices=sorted(bench.DTYPES))
    parser.add_argument("--impls", nargs="+",
                        help="keep only these implementations (the variants --deterministic, "
                             "--dropout and --sink ask for, and --dtype fp8's bf16 base, stay)")
    parser.add_argument("--require-peer", action="extend", nargs="+", default=[],
                        choices=bench.PEER_NAMES, metavar="NAME",
                        help="fail (no JSON) if this peer cannot be set up or gives no number "
                             f"in any cell; repeatable ({', '.join(bench.PEER_NAMES)})")
    parser.add_argument("--deterministic", action="store_true",
                        help="also time our backward with deterministic=True (flashattn_det)")
    parser.add_argument("--dropout", action="store_true",
                        help="also time ours with dropout_p = 0.1 (flashattn_drop; issue 15)")
    parser.add_argument("--sink", action="store_true",
                        help="also time ours with a learnable_sink (flashattn_sink; issue 15)")
    parser.add_argument("--tokens", type=int, default=16384, help="B * N of every cell")
    parser.add_argument("--hidden", type=int, default=2048, help="H * d of every cell")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup-ms", type=float, default=bench.Timing.warmup_ms)
    parser.add_argument("--rep-ms", type=float, default=bench.Timing.rep_ms)
    parser.add_argument("--json", metavar="PATH", help="write the header and rows as JSON")
    parser.add_argument("--plot", metavar="DIR", help="write PNG charts (needs matplotlib)")
    parser.add_argument("--commit", help="the project's commit, where git cannot tell "
                        "(a copy of the tree without .git)")
    parser.add_argument("--decode", action="store_true",
                        help="also the decode grid (flashattn/bench_decode.py, issue 13): TB/s "
                             "of the KV cache read, contiguous and paged")
    parser.add_argument("--sparse", action="store_true",
                        help="also the block-sparse grid (flashattn/bench_sparse.py, issue 16): "
                             "ours against FlexAttention with the same block mask, and dense")
    parser.add_argument("--memory", action="store_true",
                        help="peak extra memory of fwd+bwd, B=1 H=16 d=128, N in 4k/16k/64k")
    return parser.parse_args()


def git_commit() -> dict:
    """The project's commit, and whether the working tree differs from it."""
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty": None}


GENERATED = ("_build_config.py", "build_targets.h")  # written by setup.py per build


def source_sha256() -> str:
    """sha256 over the files the library is built from (csrc/, flashattn/*.py, setup.py),
    by relative path and content: recomputable from any checkout, so a run from a copy
    without .git (the device machine's) can still be matched to a commit."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [os.path.join(root, "setup.py")]
    for sub, exts in (("csrc", (".h", ".cuh", ".cu", ".cpp")), ("flashattn", (".py",))):
        for dirpath, _, files in os.walk(os.path.join(root, sub)):
            paths += [os.path.join(dirpath, f) for f in files
                      if f.endswith(exts) and f not in GENERATED]
    digest = hashlib.sha256()
    for path in sorted(paths, key=lambda q: os.path.relpath(q, root)):
        digest.update(os.path.relpath(path, root).encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read() + b"\0")
    return digest.hexdigest()


def package_version(dist: str) -> Optional[str]:
    """The installed version of a distribution (as pip names it), None when absent."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def header(device: torch.device, args: argparse.Namespace) -> dict:
    cuda = device.type == "cuda"
    props = torch.cuda.get_device_properties(device) if cuda else None
    return {
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "fa4": package_version("flash-attn-4"),
        "cutlass_dsl": package_version("nvidia-cutlass-dsl"),
        "fa4_off": bench.unavailable_peers(device).get(bench.FA4),  # why no fa4 column
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **({"commit": args.commit, "dirty": None} if args.commit else git_commit()),
        "source_sha256": source_sha256(),
        "device": str(device),
        "sm_count": props.multi_processor_count if cuda else None,
        "l2_bytes": bench.l2_bytes(device) if cuda else None,
        "cpu_threads": torch.get_num_threads(),
        "timing": {"warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms,
                   "rounds": bench.Timing.rounds,
                   "stat": "median of per-call times (CUDA events; wall clock on the CPU), "
                           "spread = (p90 - p10) / median; a cell's implementations timed in "
                           "interleaved rounds, each in its own shuffled order "
                           "(bench.round_orders), each timed batch after lead_ms of its own "
                           "untimed calls"},
        "flops": "fwd 4*B*H*N*N*d (halved when causal), bwd 2.5x fwd",
        "argv": sys.argv[1:],
    }


def peak_extra_memory(impl: bench.Impl, N: int, dtype: torch.dtype,
                      device: torch.device) -> Optional[float]:
    """MiB that fwd + bwd allocate at peak beyond their inputs q, k, v, dout (B=1, H=16,
    d=128, not causal); None if the implementation rejects the cell."""
    cell = bench.Cell("bwd", dtype, 128, False, N, B=1, H=16)

    def run():
        q, k, v = (torch.randn(cell.shape(impl.heads_first), device=device, dtype=dtype,
                               requires_grad=True) for _ in range(3))
        dout = torch.randn_like(q)
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        torch.autograd.grad(impl.fn(q, k, v, False), (q, k, v), dout)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20

    return bench.attempt(impl, cell, run)


def memory_rows(impls: list, dtype: torch.dtype, device: torch.device) -> list:
    print(f"\npeak extra memory of fwd+bwd (MiB), B=1 H=16 d=128, {bench.dtype_name(dtype)}")
    print("  ".join(["N".rjust(6)] + [impl.name.rjust(10) for impl in impls]))
    rows = []
    for N in MEMORY_N:
        rows.append({"N": N, "B": 1, "H": 16, "d": 128, "causal": False,
                     **{impl.name: peak_extra_memory(impl, N, dtype, device) for impl in impls}})
        print("  ".join([str(N).rjust(6)] + [
            "null".rjust(10) if rows[-1][impl.name] is None else f"{rows[-1][impl.name]:10.0f}"
            for impl in impls]), flush=True)
    return rows


def missing_peers(required: list, impls: list, device: torch.device,
                  kept: Optional[list]) -> list:
    """Why each required peer is not among the implementations (empty: all are)."""
    names = [impl.name for impl in impls]
    unavailable = bench.unavailable_peers(device)
    return [f"{name}: " + (unavailable.get(name) or
                           (f"left out by --impls {' '.join(kept)}" if kept else "not set up"))
            for name in dict.fromkeys(required) if name not in names]


def silent_peers(required: list, result: dict) -> list:
    """The required peers without a number in any row (timing or memory) of the result."""
    rows = result["rows"] + result.get("memory", []) + result.get("sparse", [])
    return [name for name in dict.fromkeys(required)
            if not any(row.get(name) is not None for row in rows)]


def fp8_setup(args: argparse.Namespace, device: torch.device) -> list:
    """--dtype fp8: the implementations (ours FP8 and ours bf16), or an exit naming why not."""
    if "bwd" in args.modes:
        sys.exit("bench_attn.py: --dtype fp8: FP8 attention is forward only (issue 14); "
                 "use --modes fwd")
    if args.memory:
        sys.exit("bench_attn.py: --dtype fp8: --memory measures fwd+bwd, which FP8 has not")
    why = bench.fp8_unavailable(device)
    if why:
        sys.exit(f"bench_attn.py: --dtype fp8: our FP8 forward cannot run on {device}: {why}")
    return bench.fp8_implementations(args.impls)


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    dtype = bench.DTYPES[args.dtype]
    fp8 = dtype == bench.FP8
    if args.modes is None:
        args.modes = ["fwd"] if fp8 else ["fwd", "bwd"]
    impls = (fp8_setup(args, device) if fp8 else
             bench.implementations(device, args.impls, args.deterministic, args.dropout,
                                   args.sink))
    missing = missing_peers(args.require_peer, impls, device, args.impls)
    if missing:
        sys.exit("bench_attn.py: --require-peer: cannot set up " + "; ".join(missing))
    result = {"header": header(device, args), "rows": []}
    peers = [impl.name for impl in impls if impl.name not in bench.OURS_ALL]
    if fp8:
        peers = [f"{bench.OURS_BF16} (our bf16 forward; random descales)"]
    print(f"flashattn vs {', '.join(peers) or 'no peer'} on "
          f"{result['header']['gpu'] or 'cpu'}, {args.dtype}, "
          f"torch {torch.__version__}, commit {result['header']['commit'][:12]}")
    if device.type == "cuda" and not fp8 and result["header"]["fa4_off"] and \
            (args.impls is None or bench.FA4 in args.impls):
        print(f"fa4 left out: {result['header']['fa4_off']}", file=sys.stderr)
    if args.modes:
        cells = [bench.grid_cell(mode, dtype, d, bool(causal), N, args.tokens, args.hidden)
                 for mode in args.modes for d in args.d for causal in args.causal
                 for N in args.N]
        timing = bench.Timing(warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
        result["rows"] = bench.run_cells(cells, impls, device, timing)
        if fp8:
            print("\n".join(bench.fp8_summary_lines(result["rows"])), flush=True)
    if args.decode:
        if device.type == "cuda":
            from flashattn import bench_decode
            timing = bench.Timing(warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
            result["decode"] = bench_decode.run_grid(device, timing, args.impls)
            result["decode_step"] = bench_decode.graph_step_rows(device, timing)
        else:
            print("--decode needs a CUDA device; skipped", file=sys.stderr)
    if args.sparse:
        from flashattn import bench_sparse
        timing = bench.Timing(warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
        cells = (bench_sparse.grid(dtype, args.tokens, args.hidden) if device.type == "cuda"
                 else bench_sparse.grid(dtype, args.tokens, args.hidden, ns=(1024, 2048),
                                        ds=(64,)))  # the CPU: a small grid
        result["sparse"] = bench_sparse.run_grid(device, timing, cells=cells)
    if args.memory:
        if device.type == "cuda":
            result["memory"] = memory_rows(impls, dtype, device)
        else:
            print("--memory needs a CUDA device; skipped", file=sys.stderr)
    silent = silent_peers(args.require_peer, result)
    if silent:
        memory = len(result.get("memory", []))
        sys.exit(f"bench_attn.py: --require-peer: {', '.join(silent)} gave no number in any "
                 f"of the {len(result['rows'])} cells" + (f" or {memory} memory rows"
                                                          if memory else "")
                 + " (rejections noted above); no JSON written")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json}")
    if args.plot and result["rows"]:
        bench.plot_rows(result["rows"], [impl.name for impl in impls], args.plot)


if __name__ == "__main__":
    main()

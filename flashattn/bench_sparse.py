"""Block-sparse benchmark (issue 16): ours (`block_sparse_attn_func`) against PyTorch's
FlexAttention compiled for the same block mask, and against our own dense kernel, forward and
backward, the three timed in interleaved rounds (bench.time_interleaved).

Rows keep the benchmark's schema (`flashattn`, then a column per peer) with `kind: "sparse"`
(conventions). Effective TFLOP/s count 4 * bm * bn * d per kept block (x 2.5 for the backward),
the same blocks for Flex, whose mask holds the kept blocks as whole ("full") blocks, so neither
evaluates a mask inside them. `dense` is our dense `flash_attn_func` on the same shape, in
TFLOP/s of the whole N x N (the rate a sparse call should keep). Before timing, each cell runs
ours and Flex once on the same inputs and records their largest difference (`flex_max_diff`):
the two compute the same attention or the row says they do not. Ours and Flex take the mask
compressed once (block_sparse_mask, Flex's BlockMask); `flashattn_mask_per_call` is ours given
the raw bool mask, which every call compresses (the cost of not preparing it). Masks (issue 16):
"random50" (a fixed random half of the blocks of each head, plus the diagonal), "random25", and
"local_global" (a band of BAND blocks either side of the diagonal plus the first GLOBAL key
blocks). benchmarks/bench_attn.py --sparse runs the grid.
"""

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

import flashattn

from . import bench

MASKS = ("random50", "random25", "local_global")
BAND, GLOBAL = 2, 2
FLEX = "flex"
DENSE = "dense"
PER_CALL = "flashattn_mask_per_call"  # ours with the raw mask, compressed at every call


@dataclass
class SparseCell:
    """B sequences of N tokens, H heads of dim d, a block mask of kind `mask` over blocks of
    `block` x `block`."""
    mode: str
    mask: str
    d: int
    N: int
    B: int
    H: int
    block: int = 128
    dtype: torch.dtype = torch.bfloat16
    causal: bool = False  # the schema's column; the masks here are not causal

    def __str__(self) -> str:
        return f"sparse {self.mode} {self.mask} d={self.d} N={self.N} B={self.B} H={self.H}"


def block_mask(kind: str, nheads: int, n_blocks: int, device: torch.device,
               seed: int = 0) -> torch.Tensor:
    """(1, nheads, n_blocks, n_blocks) bool: the kept blocks (the same for every batch entry;
    random masks fixed by `seed`, drawn on the CPU so every device gets the same one)."""
    i = torch.arange(n_blocks)[:, None]
    j = torch.arange(n_blocks)[None, :]
    if kind in ("random50", "random25"):
        frac = 0.5 if kind == "random50" else 0.25
        gen = torch.Generator().manual_seed(seed)
        keep = (torch.rand(nheads, n_blocks, n_blocks, generator=gen) < frac) | (i == j)
    elif kind == "local_global":
        keep = (((i - j).abs() <= BAND) | (j < GLOBAL)).expand(nheads, n_blocks, n_blocks)
    else:
        raise ValueError(f"bench_sparse: unknown mask {kind!r}; expected one of {MASKS}")
    return keep[None].contiguous().to(device)


def flex_block_mask(mask: torch.Tensor, block: int, seqlen: int):
    """A FlexAttention BlockMask holding the kept blocks of `mask` as full blocks (compiled
    Flex skips the others and evaluates no mask inside these), with the element mask_mod
    that says the same (eager Flex, on the CPU, applies only the mask_mod)."""
    from torch.nn.attention.flex_attention import BlockMask
    counts = mask.sum(-1, dtype=torch.int32)
    # Kept blocks first, in ascending order (a stable sort of "dropped").
    indices = torch.sort((~mask).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
    none = torch.zeros_like(counts)
    kept = mask[0]

    def mask_mod(b, h, q_idx, kv_idx):
        return kept[h, q_idx // block, kv_idx // block]
    return BlockMask.from_kv_blocks(none, torch.zeros_like(indices), counts, indices,
                                    BLOCK_SIZE=block, mask_mod=mask_mod,
                                    seq_lengths=(seqlen, seqlen))


_flex_compiled = None


def flex_func(device: torch.device) -> Callable:
    """flex_attention, compiled on a GPU (its fast path), eager elsewhere."""
    global _flex_compiled
    from torch.nn.attention.flex_attention import flex_attention
    if device.type != "cuda":
        return flex_attention
    if _flex_compiled is None:
        # One compiled graph per cell shape: past dynamo's recompile limit (8) it would fall
        # back to eager Flex, which materialises the scores, and time that instead.
        import torch._dynamo.config as dynamo_config
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(dynamo_config, name):
                setattr(dynamo_config, name, max(getattr(dynamo_config, name), 256))
        _flex_compiled = torch.compile(flex_attention, dynamic=False)
    return _flex_compiled


def flex_unavailable() -> Optional[str]:
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
    except ImportError as err:
        return f"torch.nn.attention.flex_attention does not import: {err}"
    return None


def kept_flops(cell: SparseCell, mask: torch.Tensor) -> float:
    """4 * bm * bn * d per kept block over the batch (the mask is shared by its entries)."""
    kept = int(mask.sum().item()) * cell.B
    return 4.0 * cell.block * cell.block * cell.d * kept * (2.5 if cell.mode == "bwd" else 1.0)


def _inputs(cell: SparseCell, device: torch.device, heads_first: bool):
    shape = (cell.B, cell.H, cell.N, cell.d) if heads_first else (cell.B, cell.N, cell.H, cell.d)
    return tuple(torch.randn(shape, device=device, dtype=cell.dtype,
                             requires_grad=cell.mode == "bwd") for _ in range(3))


def _call(cell: SparseCell, fn: Callable, q, k, v) -> Callable:
    """A timed call: the forward, or (bwd) torch.autograd.grad on a kept forward graph."""
    if cell.mode == "fwd":
        return lambda: fn(q, k, v)
    out = fn(q, k, v)
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def implementations(cell: SparseCell, mask: torch.Tensor, device: torch.device,
                    names: Optional[list] = None) -> list:
    """(name, heads_first, fn(q, k, v)) of ours (sparse), Flex and our dense kernel. Both
    sparse ones take their mask compressed once, outside the timed calls (ours
    block_sparse_mask, Flex's BlockMask)."""
    prepared = flashattn.block_sparse_mask(mask, (cell.block, cell.block))
    impls = [(bench.OURS, False, lambda q, k, v: flashattn.block_sparse_attn_func(
        q, k, v, prepared)),
             (PER_CALL, False, lambda q, k, v: flashattn.block_sparse_attn_func(
                 q, k, v, mask, (cell.block, cell.block)))]
    if flex_unavailable() is None:
        flex = flex_func(device)
        fmask = flex_block_mask(mask, cell.block, cell.N)
        impls.append((FLEX, True, lambda q, k, v: flex(q, k, v, block_mask=fmask)))
    impls.append((DENSE, False, lambda q, k, v: flashattn.flash_attn_func(q, k, v)))
    return [impl for impl in impls if names is None or impl[0] in names]


def flex_max_diff(cell: SparseCell, mask: torch.Tensor, device: torch.device) -> Optional[float]:
    """max |ours - Flex| of one forward on the same inputs (None without Flex)."""
    if flex_unavailable() is not None:
        return None
    q, k, v = (torch.randn(cell.B, cell.N, cell.H, cell.d, device=device, dtype=cell.dtype)
               for _ in range(3))
    ours = flashattn.block_sparse_attn_func(q, k, v, mask, (cell.block, cell.block))
    with torch.no_grad():
        flex = flex_func(device)(*(t.transpose(1, 2) for t in (q, k, v)),
                                 block_mask=flex_block_mask(mask, cell.block, cell.N))
    return (ours.float() - flex.transpose(1, 2).float()).abs().max().item()


def sparse_path(cell: SparseCell, mask: torch.Tensor, device: torch.device) -> str:
    """flashattn.kernel_path of the cell's call ("fwd", or "fwd+bwd" on bwd cells)."""
    q = torch.empty(cell.B, cell.N, cell.H, cell.d, device=device, dtype=cell.dtype)
    kw = dict(block_mask=mask, block_size=(cell.block, cell.block))
    path = flashattn.kernel_path(q, q, q, **kw)
    if cell.mode == "bwd":
        path += "+" + flashattn.kernel_path(q, q, q, direction="bwd", **kw)
    return path


def bench_cell(cell: SparseCell, device: torch.device, timing: bench.Timing,
               names: Optional[list] = None, seed: int = 0) -> dict:
    """One row: effective TFLOP/s per implementation (None where it rejects the cell)."""
    n_blocks = math.ceil(cell.N / cell.block)
    mask = block_mask(cell.mask, cell.H, n_blocks, device, seed)
    flops = kept_flops(cell, mask)
    dense_flops = bench.attn_flops(cell.mode, cell.B, cell.H, cell.N, cell.d, False)
    kept_per_row = mask.sum(-1).float().mean().item()
    row = {"kind": "sparse", "mode": cell.mode, "dtype": bench.dtype_name(cell.dtype),
           "d": cell.d, "causal": False, "N": cell.N, "B": cell.B, "H": cell.H,
           "mask": cell.mask, "block": cell.block, "density": mask.float().mean().item(),
           "kept_per_row": kept_per_row, "kept_flops": flops,
           "path": sparse_path(cell, mask, device),
           "flex_max_diff": flex_max_diff(cell, mask, device)}
    nbytes = 3 * cell.B * cell.N * cell.H * cell.d * torch.finfo(cell.dtype).bits // 8
    n_sets = min(max(math.ceil(2 * bench.l2_bytes(device) / nbytes), 1), 16)
    impls = implementations(cell, mask, device, names)
    entries = []
    for name, heads_first, fn in impls:
        impl = bench.Impl(name, None, heads_first,
                          rejects=(Exception,) if name == FLEX else (RuntimeError,))

        def build(fn=fn, heads_first=heads_first):
            calls = [_call(cell, fn, *_inputs(cell, device, heads_first)) for _ in range(n_sets)]
            calls[0]()  # the first call (Flex's compile) is never timed
            return calls
        entries.append((impl.context, bench.attempt(impl, cell, build)))
    for (name, _, _), times in zip(impls, bench.time_interleaved(entries, device, timing)):
        median, spread = bench.median_spread(times) if times else (None, None)
        rate = dense_flops if name == DENSE else flops  # PER_CALL: the kept blocks too
        row[name] = rate / (median * 1e-3) / 1e12 if times else None
        row[f"{name}_ms_median"] = median
        row[f"{name}_ms_spread"] = spread
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def grid(dtype: torch.dtype = torch.bfloat16, tokens: int = 16384, hidden: int = 2048,
         ns: tuple = (2048, 8192, 32768), ds: tuple = (64, 128)) -> list:
    """Issue 16's cells: the three masks, d 64 / 128, N 2k / 8k / 32k, forward and backward;
    B * N = tokens (at least one sequence), H * d = hidden."""
    return [SparseCell(mode, mask, d, N, max(1, tokens // N), hidden // d, dtype=dtype)
            for mode in ("fwd", "bwd") for mask in MASKS for d in ds for N in ns]


def run_grid(device: torch.device, timing: bench.Timing, names: Optional[list] = None,
             cells: Optional[list] = None) -> list:
    rows = []
    print("sparse cells: effective TFLOP/s (kept blocks; dense: the whole N x N), "
          "x_flex / x_dense = ours over each", flush=True)
    for cell in cells if cells is not None else grid():
        row = bench_cell(cell, device, timing, names)
        rows.append(row)

        def fmt(key):
            return "null" if row.get(key) is None else f"{row[key]:.4g}"

        def ratio(peer):
            a, b = row.get(bench.OURS), row.get(peer)
            return f"{a / b:.3f}" if a and b else "null"
        print(f"{cell}: density {row['density']:.3f} ({row['kept_per_row']:.1f} blocks per row)"
              f"  ours {fmt(bench.OURS)}  flex {fmt(FLEX)}  dense {fmt(DENSE)}  "
              f"x_flex {ratio(FLEX)}  x_dense {ratio(DENSE)}  |ours-flex| "
              f"{fmt('flex_max_diff')}", flush=True)
    return rows

"""Decoding benchmark: attention of a few query tokens over a KV cache, in TB/s of K and V read.

Rows keep the benchmark's schema (`flashattn`, then a column per peer) with `kind: "decode"`
(conventions): per cell TB/s = bytes of the cache's K and V that the call must read / median
time. Ours is `flash_attn_with_kvcache` on a contiguous cache or, with `page` > 0, a paged one
(a shuffled block table); the peers (SDPA's flash / cuDNN / efficient backends with
`enable_gqa=True`, FlashAttention-4) read the contiguous cache. On a paged row the peers are
timed on that contiguous cache in the same run (the paged layout is ours alone).
benchmarks/bench_attn.py --decode runs the grid of issue 13.
"""

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

import flashattn

from . import bench


@dataclass
class DecodeCell:
    """B sequences, each Sq new query tokens over a cache of N keys; H query heads over Hk KV
    heads of dim d; page 0 = contiguous cache, else paged with that page size, its pages in a
    random order over the pool or (page_order "sequential") in the contiguous cache's order:
    the pair tells the kernel's paged addressing from the scattered pages' memory-system cost."""
    B: int
    N: int
    Sq: int = 1
    H: int = 32
    Hk: int = 8
    d: int = 128
    page: int = 0
    dtype: torch.dtype = torch.bfloat16
    page_order: str = "random"

    def __str__(self) -> str:
        order = "" if self.page_order == "random" else f" {self.page_order}"
        return (f"decode B={self.B} N={self.N} Sq={self.Sq} H={self.H}/{self.Hk} d={self.d}"
                f"{f' page={self.page}{order}' if self.page else ''}")

    def kv_bytes(self) -> int:
        return 2 * self.B * self.N * self.Hk * self.d * torch.finfo(self.dtype).bits // 8


def _cache(cell: DecodeCell, device: torch.device, heads_first: bool):
    """q and a full contiguous cache: (B, Sq, H, d) / (B, N, Hk, d), or SDPA's (B, H, Sq, d) /
    (B, Hk, N, d)."""
    def randn(*shape):
        return torch.empty(shape, device=device, dtype=cell.dtype).normal_()
    if heads_first:
        return (randn(cell.B, cell.H, cell.Sq, cell.d), randn(cell.B, cell.Hk, cell.N, cell.d),
                randn(cell.B, cell.Hk, cell.N, cell.d))
    return (randn(cell.B, cell.Sq, cell.H, cell.d), randn(cell.B, cell.N, cell.Hk, cell.d),
            randn(cell.B, cell.N, cell.Hk, cell.d))


def _ours_call(cell: DecodeCell, device: torch.device) -> Callable:
    q, k, v = _cache(cell, device, heads_first=False)
    seqlens = torch.full((cell.B,), cell.N, dtype=torch.int32, device=device)
    if not cell.page:
        return lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)
    per_seq = cell.N // cell.page
    pages = cell.B * per_seq
    # The same numbers as the contiguous cache, scattered over the pool in a random order (or
    # kept in order: page i of the pool is the cache's i-th).
    order = (torch.arange(pages, device=device) if cell.page_order == "sequential"
             else torch.randperm(pages, device=device, dtype=torch.int64))
    table = order.view(cell.B, per_seq)
    k_pool = torch.empty((pages, cell.page, cell.Hk, cell.d), device=device, dtype=cell.dtype)
    v_pool = torch.empty_like(k_pool)
    k_pool[table.flatten()] = k.view(pages, cell.page, cell.Hk, cell.d)
    v_pool[table.flatten()] = v.view(pages, cell.page, cell.Hk, cell.d)
    del k, v
    block_table = table.to(torch.int32)
    return lambda: flashattn.flash_attn_with_kvcache(q, k_pool, v_pool, cache_seqlens=seqlens,
                                                     block_table=block_table)


def _sdpa_call(cell: DecodeCell, device: torch.device) -> Callable:
    q, k, v = _cache(cell, device, heads_first=True)
    return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=cell.H != cell.Hk)


def _fa4_call(func: Callable) -> Callable:
    def make(cell: DecodeCell, device: torch.device) -> Callable:
        q, k, v = _cache(cell, device, heads_first=False)
        return lambda: func(q, k, v)
    return make


def implementations(device: torch.device, names: Optional[list] = None) -> list:
    """(name, make_call, context) of ours and the GPU peers, as bench.implementations."""
    impls = [(bench.OURS, _ours_call, None)]
    impls += [(name, _sdpa_call, backend) for name, backend in bench.SDPA_PEERS]
    func, _ = bench.fa4_func()
    if func is not None:
        impls.append((bench.FA4, _fa4_call(func), None))
    return [impl for impl in impls if names is None or impl[0] in names]


def measure(name: str, make_call: Callable, backend, cell: DecodeCell, device: torch.device,
            timing: bench.Timing) -> Optional[list]:
    """Per-call times (ms) rotating over enough caches to hold twice the L2; None if the
    implementation rejects the cell."""
    context = (lambda: sdpa_kernel(backend)) if backend is not None else None
    impl = bench.Impl(name, None, heads_first=False,
                      rejects=(Exception,) if name == bench.FA4 else (RuntimeError,),
                      **({"context": context} if context else {}))

    def run():
        n_sets = min(max(math.ceil(2 * bench.l2_bytes(device) / cell.kv_bytes()), 1), 16)
        calls = [make_call(cell, device) for _ in range(n_sets)]
        return bench.time_calls(calls, device, timing)
    return bench.attempt(impl, cell, run)


def bench_cell(impls: list, cell: DecodeCell, device: torch.device, timing: bench.Timing,
               peer_rows: Optional[dict] = None) -> dict:
    """One row: TB/s per implementation (None where it rejects). peer_rows: the contiguous
    row of the same shape, whose peer timings a paged row repeats (marked peers_from)."""
    row = {"kind": "decode", "mode": "fwd", "dtype": bench.dtype_name(cell.dtype), "d": cell.d,
           "causal": False, "N": cell.N, "B": cell.B, "H": cell.H, "Hk": cell.Hk,
           "Sq": cell.Sq, "page": cell.page, "kv_bytes": cell.kv_bytes(), "path": "sm80-decode"}
    if cell.page:
        row["page_order"] = cell.page_order
    for name, make_call, backend in impls:
        if cell.page and name != bench.OURS and peer_rows is not None:
            for key in (name, f"{name}_ms_median", f"{name}_ms_spread"):
                row[key] = peer_rows.get(key)
            row["peers_from"] = "contiguous"
            continue
        times = measure(name, make_call, backend, cell, device, timing)
        median, spread = bench.median_spread(times) if times else (None, None)
        row[name] = cell.kv_bytes() / (median * 1e-3) / 1e12 if times else None
        row[f"{name}_ms_median"] = median
        row[f"{name}_ms_spread"] = spread
        torch.cuda.empty_cache()
    return row


def grid(dtype: torch.dtype = torch.bfloat16) -> list:
    """Issue 13's cells: GQA 32/8, d128; batch x cache length, contiguous and pages of 16 and
    256, one query token; pages of 16 and 256 in the cache's own order at batch 32 x 16k; then
    4 and 8 tokens at batch 32 x 16k."""
    cells = []
    for B in (1, 8, 32, 64, 128):
        for N in (4096, 16384, 65536):
            for page in (0, 16, 256):
                cells.append(DecodeCell(B, N, page=page, dtype=dtype))
    cells += [DecodeCell(32, 16384, page=page, dtype=dtype, page_order="sequential")
              for page in (16, 256)]
    cells += [DecodeCell(32, 16384, Sq=sq, dtype=dtype) for sq in (4, 8)]
    return cells


def run_grid(device: torch.device, timing: bench.Timing, names: Optional[list] = None,
             cells: Optional[list] = None) -> list:
    impls = implementations(device, names)
    table = bench.TablePrinter([name for name, _, _ in impls], "TB/s")
    print(table.header(), flush=True)
    rows, contiguous = [], {}
    for cell in cells if cells is not None else grid():
        key = (cell.B, cell.N, cell.Sq)
        row = bench_cell(impls, cell, device, timing, contiguous.get(key))
        if not cell.page:
            contiguous[key] = row
        rows.append(row)
        order = f" {cell.page_order}" if cell.page and cell.page_order != "random" else ""
        print(table.row(row) + f"  B={cell.B} N={cell.N} Sq={cell.Sq} page={cell.page}{order}",
              flush=True)
    return rows


def graph_step_rows(device: torch.device, timing: bench.Timing,
                    cells: Optional[list] = None) -> list:
    """A decode step (append one token to the cache, then attend) timed eagerly and replayed
    from a CUDA graph: rows of kind "decode_step" with the median ms of each and TB/s of the
    cache read. The gap between the two is the host's share (argument checks, launches)."""
    rows = []
    for cell in cells or [DecodeCell(1, 16384), DecodeCell(32, 16384)]:
        q, k, v = _cache(cell, device, heads_first=False)
        knew = torch.randn(cell.B, 1, cell.Hk, cell.d, device=device, dtype=cell.dtype)
        vnew = torch.randn_like(knew)
        seqlens = torch.full((cell.B,), cell.N - 1, dtype=torch.int32, device=device)

        def step():
            return flashattn.flash_attn_with_kvcache(q, k, v, knew, vnew, cache_seqlens=seqlens)
        step()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        eager = bench.median_spread(bench.time_calls([step], device, timing))[0]
        replay = bench.median_spread(bench.time_calls([graph.replay], device, timing))[0]
        row = {"kind": "decode_step", "mode": "fwd", "dtype": bench.dtype_name(cell.dtype),
               "d": cell.d, "N": cell.N, "B": cell.B, "H": cell.H, "Hk": cell.Hk, "Sq": cell.Sq,
               "eager_ms": eager, "graph_ms": replay,
               "eager_tbs": cell.kv_bytes() / (eager * 1e-3) / 1e12,
               "graph_tbs": cell.kv_bytes() / (replay * 1e-3) / 1e12}
        print(f"decode step {cell}: eager {eager * 1e3:.1f} us ({row['eager_tbs']:.2f} TB/s), "
              f"CUDA graph {replay * 1e3:.1f} us ({row['graph_tbs']:.2f} TB/s)", flush=True)
        rows.append(row)
        del graph, q, k, v
        torch.cuda.empty_cache()
    return rows

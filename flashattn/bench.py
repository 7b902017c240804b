"""Side-by-side timing of flashattn against torch's SDPA backends and FlashAttention-4.

`python -m flashattn.bench` runs a small grid: on a GPU a few cells of the benchmark grid
(bf16, fwd and bwd) against SDPA's flash, cuDNN and efficient backends, and against
FlashAttention-4 (`fa4`, package flash-attn-4) when `flash_attn.cute` imports; without a GPU
the CPU backend against torch's CPU SDPA. benchmarks/bench_attn.py runs the full grid with
the timing and FLOP code of this module (the package cannot import benchmarks/).
"""

import argparse
import contextlib
import functools
import math
import os
import random
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable, ContextManager, Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn

OURS = "flashattn"
OURS_DET = "flashattn_det"  # ours with deterministic=True (backward cells only)
OURS_DROP = "flashattn_drop"  # ours with dropout_p = DROPOUT_P (issue 15's cost target)
OURS_SINK = "flashattn_sink"  # ours with a learnable_sink (issue 15's cost target)
OURS_BF16 = "flashattn_bf16"  # our bf16 forward on the FP8 cells (--dtype fp8): the ratio's base
OURS_ALL = (OURS, OURS_DET, OURS_DROP, OURS_SINK, OURS_BF16)  # ours: never peers
# Ours with an option, each against ours without: the ratio column's name.
VARIANTS = {OURS_DET: "det/def", OURS_DROP: "drop/def", OURS_SINK: "sink/def"}
DROPOUT_P = 0.1
# The SDPA peers, each forced to one backend: (name, backend).
SDPA_PEERS = (
    ("sdpa_flash", SDPBackend.FLASH_ATTENTION),
    ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
    ("sdpa_eff", SDPBackend.EFFICIENT_ATTENTION),
)
SDPA_CPU = "sdpa"  # torch's CPU SDPA, the peer on the CPU
FA4 = "fa4"  # FlashAttention-4's flash_attn.cute.flash_attn_func (CUDA only)
PEER_NAMES = tuple(name for name, _ in SDPA_PEERS) + (SDPA_CPU, FA4)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "fp8": torch.float8_e4m3fn}
FP8 = torch.float8_e4m3fn
DEFAULT_L2_BYTES = 60 * 2**20  # H100/H200; used when the device does not report it


def dtype_name(dtype: torch.dtype) -> str:
    """The rows' name of a dtype: "e4m3" for FP8 (conventions), else the --dtype name."""
    if dtype == FP8:
        return "e4m3"
    return next(name for name, value in DTYPES.items() if value == dtype)


def attn_flops(mode: str, batch: int, heads: int, seqlen: int, head_dim: int,
               causal: bool) -> float:
    """FLOPs as the FlashAttention papers count them: fwd 4*B*H*N*N*d, halved when causal;
    bwd 2.5x fwd."""
    flops = 4.0 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    return flops * (2.5 if mode == "bwd" else 1.0)


def median_spread(times_ms: list) -> tuple:
    """Median and relative spread (p90 - p10) / median of per-call times."""
    median = statistics.median(times_ms)
    if len(times_ms) < 2:
        return median, 0.0
    deciles = statistics.quantiles(times_ms, n=10, method="inclusive")
    return median, (deciles[-1] - deciles[0]) / median


def _timed_calls(calls: list, n: int, device: torch.device) -> list:
    """Per-call times in ms of n calls, rotating through `calls`: CUDA events on a GPU,
    the wall clock on the CPU."""
    if device.type != "cuda":
        times = []
        for i in range(n):
            start = time.perf_counter()
            calls[i % len(calls)]()
            times.append((time.perf_counter() - start) * 1e3)
        return times
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]
    for i, (start, end) in enumerate(events):
        start.record()
        calls[i % len(calls)]()
        end.record()
    torch.cuda.synchronize(device)
    return [start.elapsed_time(end) for start, end in events]


@dataclass
class Timing:
    """How long to warm up and measure: the call counts follow from a first timed call.
    rounds: bench_cell times a cell's implementations in that many interleaved rounds, each
    round in its own order (each implementation rep_ms / rounds a round). lead_ms: untimed
    calls of an implementation before each of its timed batches (at least one), so that a
    batch is timed in that implementation's own steady state, not in its predecessor's."""
    warmup_ms: float = 50.0
    rep_ms: float = 200.0
    min_reps: int = 10
    max_reps: int = 200
    rounds: int = 5
    lead_ms: float = 10.0


def _warm_up(calls: list, device: torch.device, timing: Timing) -> tuple:
    """Warms `calls` up (after their untimed first call): (how many to time, rep_ms over a
    first estimate within [min_reps, max_reps]; how many lead each timed batch, lead_ms over
    it, at least one; 0 without warm-up or repetitions asked for)."""
    if timing.warmup_ms > 0 or timing.rep_ms > 0:
        estimate = max(statistics.median(_timed_calls(calls, 3, device)), 1e-3)
        _timed_calls(calls, int(timing.warmup_ms / estimate), device)
        n = int(timing.rep_ms / estimate)
        lead = max(1, math.ceil(timing.lead_ms / estimate)) if timing.lead_ms > 0 else 0
    else:
        n = lead = 0
    return min(max(n, timing.min_reps), timing.max_reps), lead


def time_calls(calls: list, device: torch.device, timing: Timing) -> list:
    """Per-call times in ms after warm-up; the first call (handle creation, plan building,
    allocations) is never timed."""
    calls[0]()
    return _timed_calls(calls, _warm_up(calls, device, timing)[0], device)


def round_orders(n: int, rounds: int, seed: int = 0) -> list:
    """The order of n entries in each of `rounds` rounds: each round a fresh permutation
    (seeded: the same run to run), so that no entry keeps one predecessor. Rotating one
    order kept each entry behind the same one in every round: on the H200 (2026-12-04) our
    sm90 forward timed behind FA4 ran 5-10% slower than the same kernel timed behind our
    dropout forward (the sink column, 1.05-1.10x "faster" than the plain one): clocks after
    a kernel of more or less power."""
    rng = random.Random(seed)
    return [rng.sample(range(n), n) for _ in range(rounds)]


def time_interleaved(entries: list, device: torch.device, timing: Timing) -> list:
    """Per-call times (ms) of each (context, calls) entry (calls None: not timed, None back),
    in timing.rounds interleaved rounds, each in its own order (round_orders), each entry after
    its warm-up (its first call already made) and each timed batch after timing.lead_ms of
    untimed calls of its own. Timed one after the other, an implementation's number depended
    on what ran before it (on the H200 the same kernel measured 4-18% apart by its position in
    the sequence, clocks recovering after a slower kernel: NOTES.md 2026-12-02); rounds
    spread every implementation over the same stretch of time."""
    rounds = max(1, timing.rounds)
    per_round, lead = [0] * len(entries), [0] * len(entries)
    for i, (context, calls) in enumerate(entries):
        if calls is not None:
            with context():
                n, lead[i] = _warm_up(calls, device, timing)
                per_round[i] = max(1, math.ceil(n / rounds))
    times = [[] if calls is not None else None for _, calls in entries]
    order = [i for i, (_, calls) in enumerate(entries) if calls is not None]
    for perm in round_orders(len(order), rounds):
        for j in perm:
            i = order[j]
            context, calls = entries[i]
            with context():
                if lead[i]:
                    _timed_calls(calls, lead[i], device)
                times[i] += _timed_calls(calls, per_round[i], device)
    return times


@dataclass
class Impl:
    """One attention implementation: fn(q, k, v, causal) -> out on its own layout, run
    inside context() (forward and backward alike)."""
    name: str
    fn: Callable
    heads_first: bool  # SDPA wants contiguous (B, H, N, d); ours takes (B, N, H, d)
    context: Callable[[], ContextManager] = contextlib.nullcontext
    modes: tuple = ("fwd", "bwd")  # the cell modes it is timed on
    rejects: tuple = (RuntimeError,)  # the exceptions by which it rejects a cell (attempt)
    # inputs(cell, device, grad) -> the tensors fn takes before `causal`; None: q, k, v of the
    # cell's shape and dtype (randn)
    inputs: Optional[Callable] = None


def _sdpa(q, k, v, causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _ours(q, k, v, causal):
    return flashattn.flash_attn_func(q, k, v, causal=causal)


def _ours_det(q, k, v, causal):
    return flashattn.flash_attn_func(q, k, v, causal=causal, deterministic=True)


def _ours_drop(q, k, v, causal):
    return flashattn.flash_attn_func(q, k, v, dropout_p=DROPOUT_P, causal=causal)


_SINKS: dict = {}


def _ours_sink(q, k, v, causal):
    """A sink per head (fp32), made once per (heads, device, grad): the timed call is the
    attention alone. It requires grad exactly when q does (the backward cells), so that the
    backward computes its gradient there and a forward cell records no autograd graph -- a
    grad-requiring sink on a forward cell timed the host's autograd bookkeeping (H200,
    2026-12-02: sink/def 0.48-0.84 at N <= 2k on the sm90 forward, whose launches are short)."""
    key = (q.shape[2], q.device, q.requires_grad)
    if key not in _SINKS:
        _SINKS[key] = torch.randn(q.shape[2], device=q.device).requires_grad_(q.requires_grad)
    return flashattn.flash_attn_func(q, k, v, causal=causal, learnable_sink=_SINKS[key])


@functools.lru_cache(maxsize=None)
def fa4_func() -> tuple:
    """(FlashAttention-4's flash_attn_func, None), or (None, why it does not import)."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as err:  # ImportError, or the CuTe DSL failing to load its libraries
        return None, f"import flash_attn.cute failed: {type(err).__name__}: {err}"
    return flash_attn_func, None


def _fa4(func: Callable) -> Callable:
    """FA4's call on (B, N, H, d), like ours; this version returns (out, lse): keep out."""
    def fn(q, k, v, causal):
        out = func(q, k, v, causal=causal)
        return out[0] if isinstance(out, tuple) else out
    return fn


def _fp8_inputs(cell, device, grad):
    """FP8 q, k, v (randn cast to e4m3) and random fp32 descales in [0.5, 2) per (batch, head)."""
    shape = cell.shape(heads_first=False)
    qkv = [torch.randn(shape, device=device, dtype=torch.bfloat16).to(FP8) for _ in range(3)]
    return (*qkv, *(torch.rand(cell.B, cell.H, device=device) * 1.5 + 0.5 for _ in range(3)))


def _bf16_inputs(cell, device, grad):
    return tuple(torch.randn(cell.shape(heads_first=False), device=device, dtype=torch.bfloat16,
                             requires_grad=grad) for _ in range(3))


def _ours_fp8(q, k, v, q_descale, k_descale, v_descale, causal):
    return flashattn.flash_attn_func(q, k, v, causal=causal, q_descale=q_descale,
                                     k_descale=k_descale, v_descale=v_descale)


def fp8_implementations(names: Optional[list] = None) -> list:
    """--dtype fp8: our FP8 forward ("flashattn", random descales) and our bf16 forward of the
    same cell ("flashattn_bf16", the ratio's base: kept whatever `names` says), forward only; no
    peer (SDPA has no FP8)."""
    impls = [Impl(OURS, _ours_fp8, heads_first=False, modes=("fwd",), inputs=_fp8_inputs),
             Impl(OURS_BF16, _ours, heads_first=False, modes=("fwd",), inputs=_bf16_inputs)]
    return [impl for impl in impls if names is None or impl.name in names or impl.name == OURS_BF16]


def fp8_unavailable(device: torch.device) -> Optional[str]:
    """Why our FP8 forward cannot run on `device` (flashattn.kernel_path's error: no sm90 FP8
    kernel yet, a GPU other than sm90, a build without FP8), or None."""
    q = torch.empty(1, 128, 1, 128, device=device, dtype=FP8)
    try:
        flashattn.kernel_path(q, q, q)
    except RuntimeError as err:
        return (str(err).strip().splitlines() or [""])[0]
    return None


def unavailable_peers(device: torch.device) -> dict:
    """The peers (PEER_NAMES) that implementations() cannot set up here, each with why."""
    cuda = device.type == "cuda"
    reasons = {SDPA_CPU: "torch's CPU SDPA is the peer on the CPU only"} if cuda else \
        {name: "a forced SDPA backend needs a CUDA device" for name, _ in SDPA_PEERS}
    func, why = fa4_func()
    if func is None or not cuda:
        reasons[FA4] = why or "FlashAttention-4 runs on CUDA devices only"
    return reasons


def implementations(device: torch.device, names: Optional[list] = None,
                    deterministic: bool = False, dropout: bool = False,
                    sink: bool = False) -> list:
    """Ours and the peers: on a GPU each SDPA backend forced and FlashAttention-4 ("fa4")
    when flash_attn.cute imports (unavailable_peers says why not), on the CPU torch's
    default CPU SDPA ("sdpa"). deterministic: also ours with deterministic=True on the
    backward cells; dropout: ours with dropout_p = DROPOUT_P; sink: ours with a
    learnable_sink (VARIANTS). `names` keeps only those named, and the variants the flags ask
    for (naming the peers alone must not drop them: a 2026-12-06 run lost its det column so)."""
    impls = [Impl(OURS, _ours, heads_first=False)]
    if deterministic:
        impls.append(Impl(OURS_DET, _ours_det, heads_first=False, modes=("bwd",)))
    if dropout:
        impls.append(Impl(OURS_DROP, _ours_drop, heads_first=False))
    if sink:
        impls.append(Impl(OURS_SINK, _ours_sink, heads_first=False))
    if device.type == "cuda":
        impls += [Impl(name, _sdpa, True, lambda b=backend: sdpa_kernel(b))
                  for name, backend in SDPA_PEERS]
        func, _ = fa4_func()
        if func is not None:
            # FA4 rejects a cell with assertions, ValueError, NotImplementedError or a CuTe
            # DSL error (an Exception, not a RuntimeError): any of them makes the cell null.
            impls.append(Impl(FA4, _fa4(func), heads_first=False, rejects=(Exception,)))
    else:
        impls.append(Impl(SDPA_CPU, _sdpa, heads_first=True))
    return [impl for impl in impls if names is None or impl.name in names or impl.name in VARIANTS]


@dataclass
class Cell:
    """One benchmark cell: self-attention of B sequences of N tokens, H heads of dim d."""
    mode: str  # "fwd" or "bwd"
    dtype: torch.dtype
    d: int
    causal: bool
    N: int
    B: int
    H: int

    def shape(self, heads_first: bool) -> tuple:
        if heads_first:
            return (self.B, self.H, self.N, self.d)
        return (self.B, self.N, self.H, self.d)

    def __str__(self) -> str:
        return f"{self.mode} d={self.d} causal={int(self.causal)} N={self.N} B={self.B} H={self.H}"

    def flops(self) -> float:
        return attn_flops(self.mode, self.B, self.H, self.N, self.d, self.causal)


def _make_call(impl: Impl, cell: Cell, device: torch.device) -> tuple:
    """A call timing `impl` on one fresh random input set, and the bytes each call reads.
    bwd: the forward graph is built once and kept; each call is torch.autograd.grad."""
    grad = cell.mode == "bwd"
    if impl.inputs is not None:
        tensors = impl.inputs(cell, device, grad)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        if not grad:
            return (lambda: impl.fn(*tensors, cell.causal)), nbytes
        raise ValueError(f"{impl.name}: custom inputs are forward only")
    q, k, v = (torch.randn(cell.shape(impl.heads_first), device=device, dtype=cell.dtype,
                           requires_grad=grad) for _ in range(3))
    nbytes = q.numel() * q.element_size()
    if not grad:
        return (lambda: impl.fn(q, k, v, cell.causal)), 3 * nbytes
    out = impl.fn(q, k, v, cell.causal)
    dout = torch.randn_like(out)
    return (lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)), 5 * nbytes


def l2_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", DEFAULT_L2_BYTES)


_reported = set()  # (implementation, reason) pairs already noted on stderr


def attempt(impl: Impl, cell: Cell, fn: Callable):
    """fn() inside impl's context; None if the implementation rejects the cell, by one of
    impl.rejects (the first cell it rejects for a given reason is noted on stderr). Ours
    only rejects with its own named errors ("flashattn ..."); anything else of ours (a CUDA
    error, out of memory) ends the run instead of becoming a silent gap in the table."""
    try:
        with impl.context(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SDPA warns at length before it rejects
            return fn()
    except impl.rejects as err:
        if impl.name in OURS_ALL and (isinstance(err, torch.cuda.OutOfMemoryError)
                                  or not str(err).lstrip().startswith("flashattn")):
            raise
        reason = (str(err).strip().splitlines() or [""])[0][:160]
        if not isinstance(err, RuntimeError) or not reason:  # an assert's bare message
            reason = f"{type(err).__name__}: {reason}" if reason else type(err).__name__
        if (impl.name, reason) not in _reported:
            _reported.add((impl.name, reason))
            print(f"  {impl.name} rejects {cell}: {reason} (not repeated for later cells)",
                  file=sys.stderr)
        return None


def kernel_path(cell: Cell, device: torch.device) -> Optional[str]:
    """flashattn.kernel_path for the cell's inputs: the forward's backend, on bwd cells
    "<fwd>+<bwd>" (the timed backward runs both); None while the API lacks it or when no
    kernel takes the cell (measuring ours then says why)."""
    path_fn = getattr(flashattn, "kernel_path", None)
    if path_fn is None:
        return None
    q = torch.empty(cell.shape(heads_first=False), device=device, dtype=cell.dtype)
    directions = ("fwd", "bwd") if cell.mode == "bwd" else ("fwd",)
    try:
        return "+".join(path_fn(q, q, q, causal=cell.causal, direction=direction)
                        for direction in directions)
    except RuntimeError:
        return None


def measure_interleaved(impls: list, cell: Cell, device: torch.device,
                        timing: Timing) -> list:
    """Per-call times (ms) of each implementation on `cell` (None where it rejects the cell or
    skips its mode): enough input sets each to hold more than twice the L2, the first call
    made, then all timed together (time_interleaved)."""
    entries = []
    for impl in impls:
        def build(impl=impl):
            call, nbytes = _make_call(impl, cell, device)
            n_sets = min(max(math.ceil(2 * l2_bytes(device) / nbytes), 1), 16)
            calls = [call] + [_make_call(impl, cell, device)[0] for _ in range(n_sets - 1)]
            calls[0]()  # the first call (handle creation, plan building) is never timed
            return calls
        entries.append((impl.context,
                        attempt(impl, cell, build) if cell.mode in impl.modes else None))
    return time_interleaved(entries, device, timing)


def bench_cell(impls: list, cell: Cell, device: torch.device, timing: Timing) -> dict:
    """One JSON row: the cell, ours' kernel path, and per implementation TFLOP/s plus the
    median and spread of its times (None where it rejects the cell), all timed in
    interleaved rounds (measure_interleaved)."""
    row = {"mode": cell.mode, "dtype": dtype_name(cell.dtype), "d": cell.d,
           "causal": cell.causal, "N": cell.N, "B": cell.B, "H": cell.H,
           "path": kernel_path(cell, device)}
    all_times = measure_interleaved(impls, cell, device, timing)
    for impl, times in zip(impls, all_times):
        median, spread = median_spread(times) if times else (None, None)
        row[impl.name] = cell.flops() / (median * 1e-3) / 1e12 if times else None
        row[f"{impl.name}_ms_median"] = median
        row[f"{impl.name}_ms_spread"] = spread
    return row


def speedup(row: dict, peer: str) -> Optional[float]:
    """Our TFLOP/s over the peer's (> 1: ours is faster); None if either is missing."""
    ours, theirs = row.get(OURS), row.get(peer)
    return ours / theirs if ours and theirs else None


def variant_ratio(row: dict, name: str) -> Optional[float]:
    """Our speed with an option (VARIANTS) over our default speed; None where either is
    missing."""
    with_option, default = row.get(name), row.get(OURS)
    return with_option / default if with_option and default else None


def det_ratio(row: dict) -> Optional[float]:
    """Our deterministic speed over our default speed; None where either is missing."""
    return variant_ratio(row, OURS_DET)


def fp8_ratio(row: dict) -> Optional[float]:
    """Our FP8 forward's speed over our bf16 forward's on the cell (--dtype fp8)."""
    fp8, bf16 = row.get(OURS), row.get(OURS_BF16)
    return fp8 / bf16 if fp8 and bf16 else None


def best_peer(row: dict, peers: list) -> Optional[str]:
    """The fastest peer that ran the cell."""
    ran = [peer for peer in peers if row.get(peer)]
    return max(ran, key=lambda peer: row[peer]) if ran else None


class TablePrinter:
    """A fixed-width text table printed row by row, as the cells finish. Shows per
    implementation TFLOP/s (TB/s for decode rows, or median ms, unit="ms") and our speed-up
    over each peer."""

    def __init__(self, names: list, unit: str = "TFLOP/s"):
        self.names, self.unit = names, unit
        self.peers = [name for name in names if name not in OURS_ALL]
        self.variants = [name for name in VARIANTS if name in names]
        self.fp8 = OURS_BF16 in names
        ratios = [f"x_{peer.removeprefix('sdpa_')}" for peer in self.peers]
        if len(self.peers) > 1:
            ratios.append("x_best")
        ratios += [VARIANTS[name] for name in self.variants]
        if self.fp8:
            ratios.append("fp8/bf16")
        self.columns = ["mode", "d", "causal", "N", "B", "H", "path"] + names + ratios
        self.widths = [4, 3, 6, 5, 3, 3, 17] + [max(len(n), 10) for n in names] + [8] * len(ratios)

    def _line(self, cells: list) -> str:
        return "  ".join(str(c).rjust(w) for c, w in zip(cells, self.widths))

    def header(self) -> str:
        return f"{self.unit} per implementation; x<peer> = our speed over the peer's\n" + \
            self._line(self.columns)

    def row(self, row: dict) -> str:
        def num(value, fmt=".4g"):
            return "null" if value is None else format(value, fmt)
        key = "{}_ms_median" if self.unit == "ms" else "{}"
        values = [num(row[key.format(name)]) for name in self.names]
        ratios = [speedup(row, peer) for peer in self.peers]
        if len(self.peers) > 1:
            best = best_peer(row, self.peers)
            ratios.append(speedup(row, best) if best else None)
        ratios += [variant_ratio(row, name) for name in self.variants]
        if self.fp8:
            ratios.append(fp8_ratio(row))
        cells = [row["mode"], row["d"], int(row["causal"]), row["N"], row["B"], row["H"],
                 (row["path"] or "-")[:17]]
        return self._line(cells + values + [num(r, ".3f") for r in ratios])


def run_cells(cells: list, impls: list, device: torch.device, timing: Timing,
              unit: str = "TFLOP/s") -> list:
    """Benchmarks each cell, printing the table as it goes; returns the rows."""
    table = TablePrinter([impl.name for impl in impls], unit)
    print(table.header(), flush=True)
    rows = []
    for cell in cells:
        rows.append(bench_cell(impls, cell, device, timing))
        print(table.row(rows[-1]), flush=True)
    return rows


def plot_rows(rows: list, names: list, out_dir: str) -> list:
    """One PNG per mode in out_dir: TFLOP/s against N, a panel per (d, causal), a line per
    implementation. Returns the paths written (none, with a message, without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot: matplotlib is not installed (pip install matplotlib); no charts written",
              file=sys.stderr)
        return []
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for mode in sorted({row["mode"] for row in rows}):
        mode_rows = [row for row in rows if row["mode"] == mode]
        ds = sorted({row["d"] for row in mode_rows})
        causals = sorted({row["causal"] for row in mode_rows})
        fig, axes = plt.subplots(len(ds), len(causals), squeeze=False, sharex=True,
                                 figsize=(5 * len(causals), 3.5 * len(ds)))
        for (d, causal), ax in zip([(d, c) for d in ds for c in causals], axes.flat):
            cells = sorted((r for r in mode_rows if r["d"] == d and r["causal"] == causal),
                           key=lambda r: r["N"])
            for name in names:
                points = [(r["N"], r[name]) for r in cells if r[name] is not None]
                if points:
                    ax.plot(*zip(*points), marker="o", label=name)
            ax.set_xscale("log", base=2)
            ax.set_xticks([r["N"] for r in cells], [str(r["N"]) for r in cells])
            ax.set_ylim(bottom=0)
            ax.set_title(f"{mode} d={d} {'causal' if causal else 'non-causal'}")
            ax.set_xlabel("N")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
        axes.flat[0].legend()
        fig.tight_layout()
        path = os.path.join(out_dir, f"{mode}_{mode_rows[0]['dtype']}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        print(f"wrote {path}")
        written.append(path)
    return written


def summary_lines(rows: list, names: list) -> list:
    """Per mode, our speed over each peer's: median and min (the cell) over the rows that
    both ran, as lines for the end of the table."""
    peers = [name for name in names if name not in OURS_ALL]
    lines = ["summary: our speed over each peer's (median, min over the cells both ran)"]
    for mode in dict.fromkeys(row["mode"] for row in rows):
        mode_rows = [row for row in rows if row["mode"] == mode]
        parts = []
        for peer in peers:
            ratios = [(speedup(row, peer), row) for row in mode_rows]
            ratios = [(r, row) for r, row in ratios if r is not None]
            if not ratios:
                parts.append(f"x{peer} -")
                continue
            low, at = min(ratios, key=lambda x: x[0])
            parts.append(f"x{peer} {statistics.median(r for r, _ in ratios):.2f} "
                         f"(min {low:.2f} at d={at['d']} N={at['N']}"
                         f"{' causal' if at['causal'] else ''})")
        lines.append(f"  {mode}: " + "; ".join(parts))
    return lines


def fp8_summary_lines(rows: list) -> list:
    """--dtype fp8: our FP8 forward over our bf16 forward (issue 14's targets: median >= 1.4
    over N >= 4096, no cell with N >= 1024 below 1.15) and the fastest FP8 cell per head dim."""
    def where(row):
        return f"d={row['d']} N={row['N']}{' causal' if row['causal'] else ''}"
    lines = ["fp8 summary: our FP8 forward over our bf16 forward (TFLOP/s ratio)"]
    rated = [(fp8_ratio(row), row) for row in rows]
    rated = [(r, row) for r, row in rated if r is not None]
    big = [r for r, row in rated if row["N"] >= 4096]
    lines.append("  median over N >= 4096: " +
                 (f"{statistics.median(big):.2f}" if big else "-") + " (target >= 1.4)")
    mid = [(r, row) for r, row in rated if row["N"] >= 1024]
    if mid:
        low, at = min(mid, key=lambda x: x[0])
        lines.append(f"  min over N >= 1024: {low:.2f} at {where(at)} (target >= 1.15)")
    else:
        lines.append("  min over N >= 1024: -")
    for d in sorted({row["d"] for row in rows}):
        ran = [row for row in rows if row["d"] == d and row.get(OURS)]
        if ran:
            best = max(ran, key=lambda row: row[OURS])
            lines.append(f"  d={d}: best {best[OURS]:.4g} TFLOP/s at {where(best)}")
    return lines


def grid_cell(mode: str, dtype: torch.dtype, d: int, causal: bool, N: int,
              tokens: int = 16384, hidden: int = 2048) -> Cell:
    """A cell of the benchmark grid: B = tokens / N sequences, H = hidden / d heads."""
    return Cell(mode, dtype, d, causal, N, B=max(tokens // N, 1), H=max(hidden // d, 1))


def main(argv: Optional[list] = None) -> list:
    parser = argparse.ArgumentParser(prog="python -m flashattn.bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--plot", metavar="DIR", help="also write PNG charts of TFLOP/s "
                        "against N per implementation into DIR (needs matplotlib)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32",
                        help="the CPU grid's dtype (default fp32; the GPU grid is bf16)")
    args = parser.parse_args(argv)
    if torch.cuda.is_available():
        device = torch.device("cuda")
        impls = implementations(device)
        fa4_off = unavailable_peers(device).get(FA4)
        print(f"flashattn vs SDPA{'' if fa4_off else ' and FA4'} on "
              f"{torch.cuda.get_device_name(device)}, bf16, hidden 2048, 16k tokens per batch"
              + (f" (fa4 off: {fa4_off})" if fa4_off else ""))
        cells = [grid_cell(mode, torch.bfloat16, d, causal, N) for mode in ("fwd", "bwd")
                 for d in (64, 128) for causal in (False, True) for N in (2048, 8192)]
        rows = run_cells(cells, impls, device, Timing(warmup_ms=25, rep_ms=100))
    else:
        device = torch.device("cpu")
        impls = implementations(device)
        print(f"flashattn CPU backend vs torch CPU SDPA, {args.dtype}, "
              f"{torch.get_num_threads()} threads, median wall time (ms) of 3 calls (one per "
              "round, the implementations interleaved) after one warm-up")
        cells = [Cell(mode, DTYPES[args.dtype], 64, False, N, B=1, H=8)
                 for mode in ("fwd", "bwd") for N in (1024, 2048, 4096)]
        timing = Timing(warmup_ms=0, rep_ms=0, min_reps=3, rounds=3)
        rows = run_cells(cells, impls, device, timing, unit="ms")
    names = [impl.name for impl in impls]
    print("\n".join(summary_lines(rows, names)), flush=True)
    if args.plot:
        plot_rows(rows, names, args.plot)
    return rows


if __name__ == "__main__":
    main()

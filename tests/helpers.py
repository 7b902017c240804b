"""Shared helpers for the test files: input builders, the tolerance rule, covering sets."""
import itertools
import os
import random
import re
import shutil
import subprocess
import sys

import pytest
import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# Head-dim pairs (d_qk, d_v) of the issue; the last one has d_v != d_qk.
HDIMS = [(d, d) for d in (32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256)] + [(192, 128)]
# Head dims of the sink covering set (test_sinks.py).
HD_SINK = [(32, 32), (40, 40), (64, 64), (96, 96), (160, 160), (256, 256)]
SEQLENS = [(1, 1), (113, 203), (239, 1), (1, 239), (799, 3), (128, 128)]
# (nheads, nheads_k): GQA groups of 3, 2 and 4 over two KV heads (a wrong query-head ->
# KV-head map shows); the group of 8 over one KV head, to keep the covering sets' run time
# (test_attention's hard corners have 8 over two). The first three are the ones the mask
# sweep (test_attention.test_masks) and test_cuda use by name.
HEADS = {"mha": (4, 4), "gqa": (6, 2), "mqa": (3, 1), "gqa2": (4, 2), "gqa4": (8, 2),
         "gqa8": (8, 1)}
# flash-attn 2.x's public functions (the drop-in surface the tests hold us to).
PUBLIC = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
]


def dtypes_for(device):
    """fp32 is a CPU-only dtype (the CUDA kernels are fp16/bf16)."""
    return ["fp16", "bf16", "fp32"] if device == "cpu" else ["fp16", "bf16"]


# --------------------------------------------------------------------------------------
# Kernel availability (CUDA cases skip cleanly when the build has no kernel for them).


def kernel_skip_reason(device, dtype, d, dv=None, backward=True):
    """None if flashattn has a kernel for this case on `device`, else the reason
    (flashattn.kernel_path raises RuntimeError naming it)."""
    import flashattn

    if device == "cpu":
        return None
    if dtype == torch.float32:
        return "float32 has no CUDA kernel (CPU only)"
    dv = d if dv is None else dv
    q = torch.empty(1, 1, 1, d, device=device, dtype=dtype)
    v = torch.empty(1, 1, 1, dv, device=device, dtype=dtype)
    try:
        flashattn.kernel_path(q, q, v)
    except RuntimeError as e:
        return str(e)
    if backward and flashattn.BUILD_CONFIG.get("FLASHATTN_DISABLE_BACKWARD"):
        return "this build has no CUDA backward (FLASHATTN_DISABLE_BACKWARD)"
    return None


def skip_if_no_kernel(device, dtype, d, dv=None, backward=True):
    reason = kernel_skip_reason(device, dtype, d, dv, backward)
    if reason:
        pytest.skip(reason)


def sm90_kernels_here():
    """Whether the sm90 kernels can run: a compute capability 9.0 GPU and an sm_90a build."""
    import flashattn

    return (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
            and "sm_90a" in flashattn.BUILD_CONFIG.get("cuda_archs", []))


def skip_unless_sm90():
    if not sm90_kernels_here():
        pytest.skip("the sm90 kernels need a compute capability 9.0 GPU and an sm_90a build")


# --------------------------------------------------------------------------------------
# Wrong-metadata cases, run in a subprocess so that a crash fails the test instead of killing
# pytest (CUDA_LAUNCH_BLOCKING surfaces an illegal access at its kernel).


def run_cases_in_subprocess(script, device, dtype, cases, seed):
    """Runs `script` with argv (device, dtype name, repr(cases), seed); it prints "BEGIN name"
    / "END name" around each case and "DONE" at the end. Fails naming the case it died in."""
    env = dict(os.environ)
    env.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    res = subprocess.run(
        [sys.executable, "-c", script, device, str(dtype).split(".")[-1], repr(cases),
         str(seed)],
        capture_output=True, text=True, timeout=300, env=env)
    begun = [l.split()[1] for l in res.stdout.splitlines() if l.startswith("BEGIN")]
    ended = [l.split()[1] for l in res.stdout.splitlines() if l.startswith("END")]
    where = ""
    if begun and (not ended or ended[-1] != begun[-1]):
        where = f" in case {begun[-1]!r} {cases[begun[-1]]}"
    assert res.returncode == 0 and "DONE" in res.stdout, (
        f"subprocess failed (rc={res.returncode}){where}\nstdout:\n{res.stdout[-3000:]}"
        f"\nstderr:\n{res.stderr[-3000:]}")


# --------------------------------------------------------------------------------------
# Inputs: random normal (never zeros); optionally non-contiguous with a contiguous last dim.


def rand(shape, dtype, device, noncontig=False, scale=1.0):
    """randn of `shape`; if noncontig, a strided view (padded last dim, permuted middle dims)."""
    if not noncontig:
        return (torch.randn(*shape, dtype=torch.float32, device=device) * scale).to(dtype)
    # Pad the last dim and allocate the two middle dims swapped, then view back: every
    # stride differs from the contiguous one but stride(-1) == 1.
    *lead, last = shape
    if len(lead) >= 2:
        perm_shape = lead[:-2] + [lead[-1], lead[-2]] + [last + 7]
        big = torch.randn(*perm_shape, dtype=torch.float32, device=device) * scale
        t = big.to(dtype).transpose(-2, -3)[..., :last]
    else:
        big = torch.randn(*lead, last + 7, dtype=torch.float32, device=device) * scale
        t = big.to(dtype)[..., :last]
    assert t.shape == tuple(shape) and t.stride(-1) == 1
    return t


def alibi_slopes(kind, batch, nheads, device):
    """None, (H,) or (B, H) fp32 slopes (positive, ALiBi-like magnitudes)."""
    if kind in (None, "none"):
        return None
    base = torch.rand(nheads, device=device) * 0.3 + 0.02
    if kind == "h":
        return base
    return (base[None, :] * (torch.rand(batch, 1, device=device) + 0.5)).contiguous()


# --------------------------------------------------------------------------------------
# Tolerance rule (conventions): |ours - ref64| <= factor * |lowp - ref64| + tiny, max norm,
# where lowp is PyTorch's own computation of the same thing in the inputs' dtype.

_TINY = {torch.float16: 1.0, torch.bfloat16: 1.0, torch.float32: 16.0}
_EPS32 = torch.finfo(torch.float32).eps


def tiny_term(ref, dtype, scale=1.0):
    """A unit of rounding at the output's magnitude (eps(dtype) * max|ref|), plus the
    fp32-accumulation noise every kernel has: 64 fp32 ulps of `scale`, the magnitude of the
    quantity's family (max over dq/dk/dv for a gradient). The second term matters only where
    the exact answer is 0 and PyTorch happens to get it exactly (dk with one visible key)."""
    mag = ref.abs().max().item() if ref.numel() else 0.0
    return _TINY[dtype] * torch.finfo(dtype).eps * mag + 64 * _EPS32 * max(mag, scale, 1.0)


def assert_close(name, ours, ref, lowp, dtype, factor=2.0, scale=1.0):
    """Assert the tolerance rule; -inf entries (empty rows' lse) must match exactly."""
    assert ours is not None, f"{name}: missing"
    assert tuple(ours.shape) == tuple(ref.shape), f"{name}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    o = ours.detach().to(device="cpu", dtype=torch.float64)
    r = ref.detach().to(device="cpu", dtype=torch.float64)
    lo = lowp.detach().to(device="cpu", dtype=torch.float64)
    nan = torch.isnan(o)
    assert not nan.any(), (
        f"{name}: {int(nan.sum())} NaN of {o.numel()} (unwritten or poisoned output?), "
        f"first at {tuple(nan.nonzero()[0].tolist())}")
    rinf = torch.isinf(r)
    oinf = torch.isinf(o)
    if rinf.any() or oinf.any():
        bad = (rinf != oinf) | (rinf & (o != r))
        assert not bad.any(), (
            f"{name}: infinities differ at {int(bad.sum())} positions, first at "
            f"{tuple(bad.nonzero()[0].tolist())}: ours={o[bad][0].item()} ref={r[bad][0].item()}")
        o = o.masked_fill(rinf, 0.0)
        r = r.masked_fill(rinf, 0.0)
        lo = lo.masked_fill(rinf, 0.0)
    lo = torch.nan_to_num(lo, nan=0.0, posinf=0.0, neginf=0.0)
    if o.numel() == 0:
        return
    diff = (o - r).abs()
    err = diff.max().item()
    low_err = (lo - r).abs().max().item()
    tiny = tiny_term(r, dtype, scale)
    bound = factor * low_err + tiny
    if not err <= bound:
        idx = tuple(torch.nonzero(diff == diff.max())[0].tolist())
        raise AssertionError(
            f"{name}: max err {err:.3e} > bound {bound:.3e} (= {factor} x lowp err "
            f"{low_err:.3e} + tiny {tiny:.3e}); worst at {idx}: ours={o[idx].item():.6g} "
            f"ref={r[idx].item():.6g}; {int((diff > bound).sum())} of {diff.numel()} over")


def check_results(ours, ref, lowp, dtype, grads=True):
    """ours/ref/lowp: dicts with out, lse and (if grads) dq, dk, dv."""
    assert_close("out", ours["out"], ref["out"], lowp["out"], dtype, 2.0)
    if ours.get("lse") is not None:
        assert_close("lse", ours["lse"], ref["lse"], lowp["lse"], dtype, 2.0)
    if grads:
        scale = max(ref[g].abs().max().item() if ref[g].numel() else 0.0
                    for g in ("dq", "dk", "dv"))
        for g in ("dq", "dk", "dv"):
            assert_close(g, ours[g], ref[g], lowp[g], dtype, 3.0, scale)


# --------------------------------------------------------------------------------------
# Covering sets: every pair of factor values appears in some case (greedy, deterministic).


def _key(i, vi, j, vj):
    return (i, vi, j, vj) if i < j else (j, vj, i, vi)


def covering_set(factors, seed=0, candidates=40, valid=None):
    """factors: {name: [values]} -> list of {name: value} covering all value pairs.

    `valid(case)` may reject combinations (then pairs only coverable by invalid cases are
    dropped). Deterministic for a given seed, so test ids are stable across runs.
    """
    rng = random.Random(seed)
    names = list(factors)
    sizes = [len(factors[n]) for n in names]
    uncovered = set()
    for a, b in itertools.combinations(range(len(names)), 2):
        for ia in range(sizes[a]):
            for ib in range(sizes[b]):
                uncovered.add((a, ia, b, ib))

    def pairs_of(row):
        return {(a, row[a], b, row[b]) for a, b in itertools.combinations(range(len(names)), 2)}

    def ok(row):
        return valid is None or valid({n: factors[n][row[i]] for i, n in enumerate(names)})

    rows = []
    stale = 0
    while uncovered and stale < 200:
        best, best_gain = None, 0
        pool = sorted(uncovered)
        for _ in range(candidates):
            a, ia, b, ib = rng.choice(pool)
            row = [None] * len(names)
            row[a], row[b] = ia, ib
            order = [i for i in range(len(names)) if row[i] is None]
            rng.shuffle(order)
            for i in order:
                choices = list(range(sizes[i]))
                rng.shuffle(choices)
                gain_best, pick = -1, choices[0]
                for c in choices:
                    g = sum(1 for j in range(len(names))
                            if row[j] is not None and _key(i, c, j, row[j]) in uncovered)
                    if g > gain_best:
                        gain_best, pick = g, c
                row[i] = pick
            if not ok(row):
                continue
            gain = len(pairs_of(row) & uncovered)
            if gain > best_gain:
                best, best_gain = row, gain
        if best is None:
            stale += 1
            continue
        stale = 0
        uncovered -= pairs_of(best)
        rows.append(best)
    return [{n: factors[n][r[i]] for i, n in enumerate(names)} for r in rows]


def case_id(case):
    parts = []
    for k, v in case.items():
        if isinstance(v, bool):
            if v:
                parts.append(k)
        elif isinstance(v, tuple):
            parts.append(f"{k}{'x'.join(str(x) for x in v)}")
        elif v not in (None, "none", 0, 0.0):
            parts.append(f"{k}{v}" if not isinstance(v, str) else f"{k}_{v}")
    return "-".join(parts)


def cuda_case_params(factors, seed):
    """pytest params (device "cuda", case) of a covering set of factors("cuda"), for a test of
    CUDA kernels only; one skipped param where there is no CUDA device."""
    if "cuda" not in DEVICES:
        return [pytest.param("cuda", None, marks=pytest.mark.skip(reason="no CUDA device"))]
    return [pytest.param("cuda", c, id=f"cuda-{case_id(c)}")
            for c in covering_set(factors("cuda"), seed=seed)]


# --------------------------------------------------------------------------------------
# Host checks: C++ programs under tools/ that include csrc headers and test their index math
# on the CPU (tests/test_bwd_order.py, tests/test_fwd_tile_order.py).

HOST_CXX = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++") or shutil.which("c++")
needs_host_cxx = pytest.mark.skipif(HOST_CXX is None,
                                    reason="no C++ compiler (g++ / c++ / $CXX) found")


def run_host_check(tmp_path, source, cases):
    """Builds tools/<source> (-O2, -std=c++17, -I csrc), runs it with `cases` and a fresh
    random seed, and asserts it exited 0 and that every "N failures" it printed has N = 0 (at
    least one; a substring test would take "10 failures" too; the seed in the message)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = tmp_path / os.path.splitext(source)[0]
    subprocess.run([HOST_CXX, "-O2", "-std=c++17", "-I", os.path.join(root, "csrc"),
                    os.path.join(root, "tools", source), "-o", str(exe)], check=True)
    seed = random.randrange(1 << 30)
    res = subprocess.run([str(exe), str(cases), str(seed)], capture_output=True, text=True)
    assert res.returncode == 0, f"seed {seed}\n" + res.stdout + res.stderr
    counts = re.findall(r"(\d+) failures", res.stdout)
    assert counts and all(int(c) == 0 for c in counts), f"seed {seed}\n" + res.stdout
    return res

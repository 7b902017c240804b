"""Wrong varlen metadata (cu_seqlens past the tensors, decreasing, negative, a sequence
longer than max_seqlen) must not crash: any numbers (or a clean Python error) are fine, an
out-of-bounds access is not. Runs in a subprocess so a segfault fails the test instead of
killing pytest; on CUDA the subprocess synchronises to surface illegal memory accesses.
Inputs sit inside NaN-filled buffers, so out-of-bounds reads show up as NaN where the
metadata is wrong only in ways the clamping fully handles ("strict" cases)."""
import textwrap

import pytest
import torch

from helpers import DEVICES, kernel_skip_reason, run_cases_in_subprocess

# name: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, strict); total_q = total_k
# = 64. strict: max_seqlen covers every clamped sequence, so a kernel that clamps its rows to
# the tensors reads only finite data and must give finite out / gradients; q, k, v and dout
# sit inside NaN-filled buffers, so a read past the tensors shows up as NaN.
CASES = {
    "beyond_q": ([0, 30, 500], [0, 32, 64], 470, 32, True),
    "beyond_k": ([0, 32, 64], [0, 40, 100000], 32, 99960, True),
    "beyond_both_huge": ([0, 1 << 30, (1 << 31) - 1], [0, 1 << 30, (1 << 31) - 1], 64, 64, True),
    "decreasing": ([0, 50, 20, 64], [0, 60, 10, 64], 64, 64, True),
    "negative": ([-100, 10, 64], [-5, -1, 64], 64, 70, True),
    "longer_than_max": ([0, 60, 64], [0, 3, 64], 8, 8, False),
    "max_seqlen_zero": ([0, 30, 64], [0, 30, 64], 0, 0, False),
}

SCRIPT = textwrap.dedent("""
    import sys, torch, flashattn
    device, dtype = sys.argv[1], getattr(torch, sys.argv[2])
    cases = eval(sys.argv[3])
    torch.manual_seed(int(sys.argv[4]))  # the test's seed (conftest): fresh each run

    def guarded(*shape):
        # A (64, ...) tensor in the middle of a NaN buffer: out-of-bounds reads give NaN.
        buf = torch.full((64 + 2 * 512,) + shape[1:], float("nan"), device=device, dtype=dtype)
        buf[512:576] = torch.randn(shape, device=device, dtype=dtype)
        return buf[512:576]

    bad = []
    for name, (cq, ck, mq, mk, strict) in cases.items():
        print("BEGIN", name, flush=True)
        q = guarded(64, 4, 64).requires_grad_()
        k = guarded(64, 2, 64).requires_grad_()
        v = guarded(64, 2, 64).requires_grad_()
        cu_q = torch.tensor(cq, dtype=torch.int32, device=device)
        cu_k = torch.tensor(ck, dtype=torch.int32, device=device)
        for causal in (False, True):
            try:
                out = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk,
                                                       causal=causal)
                dq, dk, dv = torch.autograd.grad(out, (q, k, v), guarded(64, 4, 64))
                if device == "cuda":
                    torch.cuda.synchronize()
                fin = [bool(torch.isfinite(t).all()) for t in (out, dq, dk, dv)]
                print("  ran; finite out/dq/dk/dv:", fin, flush=True)
                if strict and not all(fin):
                    bad.append(f"{name} causal={causal}: non-finite {fin}")
            except (RuntimeError, ValueError) as e:
                if "illegal" in str(e) or "CUDA error" in str(e):
                    raise
                print("  raised:", str(e).splitlines()[0][:200], flush=True)
        print("END", name, flush=True)
    if device == "cuda":
        torch.cuda.synchronize()
    if bad:
        print("NONFINITE (read outside the tensors?):", bad, flush=True)
        sys.exit(3)
    print("DONE", flush=True)
""")


@pytest.mark.parametrize("device", DEVICES)
def test_bad_cu_seqlens_do_not_crash(device, seed):
    dtype = torch.float32 if device == "cpu" else torch.float16
    reason = kernel_skip_reason(device, dtype, 64)
    if reason:
        pytest.skip(reason)
    run_cases_in_subprocess(SCRIPT, device, dtype, CASES, seed)

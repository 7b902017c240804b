"""Varlen edge cases the API layer settles for every backend: no sequences at all, query and
key rows outside every sequence, max_seqlen hints larger than the tensors, non-finite
softcap."""
import pytest
import torch

import flashattn
from helpers import DEVICES, DTYPES, check_results, dtypes_for, rand, skip_if_no_kernel
from reference import ref_and_lowp_varlen


def _dtype(device):
    return torch.bfloat16 if device == "cuda" else torch.float32


def _inputs(device, tq, tk, h=2, d=32):
    dt = _dtype(device)
    q = torch.randn(tq, h, d, device=device, dtype=dt, requires_grad=True)
    k = torch.randn(tk, h, d, device=device, dtype=dt, requires_grad=True)
    v = torch.randn(tk, h, d, device=device, dtype=dt, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("device", DEVICES)
def test_no_sequences(device):
    q, k, v = _inputs(device, 7, 9)
    cu = torch.zeros(1, device=device, dtype=torch.int32)
    out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 0, 0, return_attn_probs=True)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.all(lse == float("-inf"))
    out.backward(torch.randn_like(out))
    for g in (q.grad, k.grad, v.grad):
        assert torch.equal(g, torch.zeros_like(g))


@pytest.mark.parametrize("device", DEVICES)
def test_key_rows_outside_sequences_get_zero_grad(device):
    q, k, v = _inputs(device, 30, 40)
    cu_q = torch.tensor([0, 10, 30], device=device, dtype=torch.int32)
    cu_k = torch.tensor([0, 15, 28], device=device, dtype=torch.int32)  # rows 28..39 unused
    out = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 20, 15)
    out.backward(torch.randn_like(out))
    assert torch.equal(k.grad[28:], torch.zeros_like(k.grad[28:]))
    assert torch.equal(v.grad[28:], torch.zeros_like(v.grad[28:]))
    assert torch.isfinite(k.grad[:28]).all() and k.grad[:28].abs().sum() > 0


@pytest.mark.parametrize("device", DEVICES)
def test_oversized_max_seqlen_hint(device):
    q, k, v = _inputs(device, 30, 40)
    cu_q = torch.tensor([0, 10, 30], device=device, dtype=torch.int32)
    cu_k = torch.tensor([0, 15, 40], device=device, dtype=torch.int32)
    exact = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 20, 25, causal=True)
    huge = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2**31 - 2, 2**31 - 2,
                                            causal=True)
    assert torch.equal(exact, huge)


@pytest.mark.parametrize("device", DEVICES)
def test_softcap_must_be_finite(device):
    q, k, v = _inputs(device, 4, 4)
    with pytest.raises(RuntimeError, match="softcap"):
        flashattn.flash_attn_func(q[None], k[None], v[None], softcap=float("inf"))


@pytest.mark.parametrize("device,dtype",
                         [(dev, dt) for dev in DEVICES for dt in dtypes_for(dev)])
def test_rows_outside_sequences(device, dtype):
    """cu_seqlens that start past row 0 and end before the last row (an empty sequence in
    between): q rows outside every sequence are left unwritten in out and softmax_lse (they
    stay NaN: fresh allocations are NaN-poisoned) and get dq = 0; key rows outside get
    dk = dv = 0; the covered rows match the reference on the covered slices."""
    dt = DTYPES[dtype]
    skip_if_no_kernel(device, dt, 40)
    H, Hk, d = 4, 2, 40
    # q rows [0, 6) and [51, 60) outside every sequence; k rows [0, 3) and [77, 83).
    cq, ck = [6, 30, 30, 51], [3, 40, 47, 77]
    tq, tk = 60, 83
    q, dout = rand([tq, H, d], dt, device), rand([tq, H, d], dt, device)
    k, v = rand([tk, Hk, d], dt, device), rand([tk, Hk, d], dt, device)
    cu_q = torch.tensor(cq, dtype=torch.int32, device=device)
    cu_k = torch.tensor(ck, dtype=torch.int32, device=device)
    kw = dict(causal=True, window_size=(17, -1), softcap=2.0)
    # The unwritten-row checks rely on conftest's NaN poisoning of fresh allocations.
    assert torch.utils.deterministic.fill_uninitialized_memory
    assert torch.are_deterministic_algorithms_enabled()
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse, _ = flashattn.flash_attn_varlen_func(qg, kg, vg, cu_q, cu_k, 24, 37,
                                                   return_attn_probs=True, **kw)
    dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), dout)
    qin = torch.zeros(tq, dtype=torch.bool, device=device)
    qin[cq[0]:cq[-1]] = True
    kin = torch.zeros(tk, dtype=torch.bool, device=device)
    kin[ck[0]:ck[-1]] = True
    assert torch.isnan(out[~qin]).all(), "out: rows outside every sequence were written"
    assert torch.isnan(lse[:, ~qin]).all(), (
        "softmax_lse: rows outside every sequence were written")
    for name, g, inside in (("dq", dq, qin), ("dk", dk, kin), ("dv", dv, kin)):
        assert torch.equal(g[~inside], torch.zeros_like(g[~inside])), (
            f"{name}: rows outside every sequence are not zero")
    qs, ks = slice(cq[0], cq[-1]), slice(ck[0], ck[-1])
    cq0 = torch.tensor([x - cq[0] for x in cq], dtype=torch.int32)  # the covered slices
    ck0 = torch.tensor([x - ck[0] for x in ck], dtype=torch.int32)
    ref, low = ref_and_lowp_varlen(q[qs], k[ks], v[ks], cq0, ck0, dout[qs], **kw)
    ours = dict(out=out[qs], lse=lse[:, qs], dq=dq[qs], dk=dk[ks], dv=dv[ks])
    check_results(ours, ref, low, dt)

"""Varlen edge cases the API layer settles for every backend: no sequences at all, key rows
outside every sequence, max_seqlen hints larger than the tensors, non-finite softcap."""
import pytest
import torch

import flashattn
from helpers import DEVICES


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

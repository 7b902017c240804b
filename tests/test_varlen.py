"""Varlen attention (flash_attn_varlen_func): out, softmax_lse, dq/dk/dv against the per-
sequence float64 reference, over a covering set; batches include zero-length sequences
(no queries, no keys, both)."""
import pytest
import torch

import flashattn
from helpers import (DEVICES, DTYPES, HDIMS, HEADS, alibi_slopes, assert_close, case_id,
                     check_results, covering_set, dtypes_for, rand, skip_if_no_kernel)
from reference import ref_and_lowp, ref_and_lowp_varlen

# (seqlens_q, seqlens_k) per batch; zero-length sequences on either side and both.
BATCHES = {
    "mixed": ([113, 0, 1, 57], [203, 5, 239, 57]),
    "nokeys": ([239, 1, 0, 3], [1, 0, 0, 799]),
    "long": ([799, 3], [3, 128]),
    "single": ([128], [128]),
    "empty_ends": ([0, 64, 0], [0, 80, 17]),
}


def _factors(device):
    return dict(
        dtype=dtypes_for(device),
        hd=[HDIMS[i] for i in (0, 2, 3, 6, 7, 9, 11, 12)],  # 32 59 64 111 128 192 256 192/128
        batch=list(BATCHES),
        causal=[False, True],
        window=["none", "sym", "left", "right"],
        softcap=[0.0, 2.0],
        alibi=["none", "h", "bh"],
        heads=list(HEADS),
        noncontig=[False, True],
    )


def _window(kind, lens_k):
    m = max(1, min(x for x in lens_k if x > 0))  # keep window_right below every seqlen_k > 0
    return {"none": (-1, -1), "sym": (m // 2 + 3, m // 3), "left": (m // 2 + 1, -1),
            "right": (-1, m // 3)}[kind]


def _cu(lens, device):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,
                        device=device)


def run_varlen_case(device, c, api="varlen", deterministic=False):
    dtype = DTYPES[c["dtype"]]
    d, dv = c["hd"]
    H, Hk = HEADS[c["heads"]]
    lens_q, lens_k = BATCHES[c["batch"]]
    skip_if_no_kernel(device, dtype, d, dv)
    B = len(lens_q)
    nc = c["noncontig"]
    tq, tk = sum(lens_q), sum(lens_k)
    q = rand([tq, H, d], dtype, device, nc)
    k = rand([tk, Hk, d], dtype, device, nc)
    v = rand([tk, Hk, dv], dtype, device, nc)
    dout = rand([tq, H, dv], dtype, device, nc)
    cu_q, cu_k = _cu(lens_q, device), _cu(lens_k, device)
    slopes = alibi_slopes(c["alibi"], B, H, device)
    kw = dict(causal=c["causal"], window_size=_window(c["window"], lens_k),
              softcap=c["softcap"], alibi_slopes=slopes)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse, _ = flashattn.flash_attn_varlen_func(
        qg, kg, vg, cu_q, cu_k, max(lens_q), max(lens_k), deterministic=deterministic,
        return_attn_probs=True, **kw)
    dq, dk, dv_ = torch.autograd.grad(out, (qg, kg, vg), dout)
    ours = dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv_)
    ref, low = ref_and_lowp_varlen(q, k, v, cu_q.cpu(), cu_k.cpu(), dout, **kw)
    check_results(ours, ref, low, dtype)
    return ours


def _params():
    out = []
    for device in DEVICES:
        # seed: of those tried (1-8), the covering set that runs fastest on the CPU
        for c in covering_set(_factors(device), seed=4):
            out.append(pytest.param(device, c, id=f"{device}-{case_id(c)}"))
    return out


@pytest.mark.parametrize("device,c", _params())
def test_varlen(device, c):
    run_varlen_case(device, c)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_max_seqlen_larger_than_needed(device):
    """max_seqlen is an upper bound (grid sizing): a generous one gives the same answer."""
    dtype = torch.bfloat16
    skip_if_no_kernel(device, dtype, 64, backward=False)
    lens_q, lens_k = [5, 17, 0], [9, 3, 4]
    q = rand([sum(lens_q), 4, 64], dtype, device)
    k = rand([sum(lens_k), 2, 64], dtype, device)
    v = rand([sum(lens_k), 2, 64], dtype, device)
    cu_q, cu_k = _cu(lens_q, device), _cu(lens_k, device)
    ref, low = ref_and_lowp_varlen(q, k, v, cu_q.cpu(), cu_k.cpu(), causal=True)
    for mq, mk in ((17, 9), (300, 211)):
        o = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True)
        assert_close(f"out (max_seqlen {mq}, {mk})", o, ref["out"], low["out"], dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_equals_padded(device):
    """An equal-length varlen batch and the padded call on the same data both meet the rule."""
    dtype = torch.float16
    skip_if_no_kernel(device, dtype, 96, backward=False)
    B, S, H, d = 3, 77, 4, 96
    q = rand([B, S, H, d], dtype, device)
    k = rand([B, S, 2, d], dtype, device)
    v = rand([B, S, 2, d], dtype, device)
    cu = _cu([S] * B, device)
    op = flashattn.flash_attn_func(q, k, v, causal=True)
    ov = flashattn.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1),
                                          cu, cu, S, S, causal=True)
    ref, low = ref_and_lowp(q, k, v, causal=True)
    assert_close("padded out", op, ref["out"], low["out"], dtype)
    assert_close("varlen out", ov.view(B, S, H, d), ref["out"], low["out"], dtype)

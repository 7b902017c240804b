"""Attention sinks (learnable_sink, issue 15, params.h): out, softmax_lse and the gradients of
q, k, v and the sink against the float64 reference (the sink as an extra key column of value
0), over a covering set with causal / window / GQA / varlen / softcap / ALiBi / dropout; rows
that see no key; argument checks. opcheck and torch.compile with sinks: test_dropout.py.

On CUDA the kernels are not built yet: conftest turns the named "not built yet (issue 15)"
error into a skip giving it, and into a failure under FLASHATTN_REQUIRE_CUDA=1.
"""
import pytest
import torch

import flashattn
from helpers import DEVICES, HD_SINK, rand
from test_dropout import dropout_factors, feature_params, run_case


def _factors(device):
    return dict(dropout_factors(device), hd=HD_SINK, heads=["mha", "gqa", "mqa", "gqa4"],
                p=[0.0, 0.3], sink=[True])


@pytest.mark.parametrize("device,c", feature_params(_factors, seed=2))
def test_sinks(device, c, seed):
    run_case(device, c, seed)


@pytest.mark.parametrize("device", DEVICES)
def test_rows_without_keys(device):
    """A row that sees no key: out 0 and lse = sink (exactly), gradients 0 for its q and
    dsink's share 0; seqlen_k = 0 too."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    H = 3
    sink = torch.randn(H, device=device)
    # seqlen_q > seqlen_k with causal: the first 7 rows see nothing.
    q, k, v = rand([2, 12, H, 16], dtype, device), rand([2, 5, H, 16], dtype, device), \
        rand([2, 5, H, 16], dtype, device)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, learnable_sink=sink,
                                            return_attn_probs=True)
    assert (out[:, :7] == 0).all()
    assert torch.equal(lse[:, :, :7], sink.view(1, H, 1).expand(2, H, 7))
    qe, ke, ve = rand([2, 4, H, 16], dtype, device), rand([2, 0, H, 16], dtype, device), \
        rand([2, 0, H, 16], dtype, device)
    qe, sg = qe.requires_grad_(), sink.clone().requires_grad_()
    out, lse, _ = flashattn.flash_attn_func(qe, ke, ve, learnable_sink=sg, return_attn_probs=True)
    assert (out == 0).all() and torch.equal(lse, sg.detach().view(1, H, 1).expand(2, H, 4))
    dq, ds = torch.autograd.grad(out.sum(), (qe, sg))
    assert (dq == 0).all() and (ds == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_sink_limits(device):
    """A very negative sink is no sink; a very large one takes all the weight (out -> 0)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    H = 4
    q, k, v = (rand([1, 33, H, 32], dtype, device) for _ in range(3))
    plain = flashattn.flash_attn_func(q, k, v, causal=True)
    low = flashattn.flash_attn_func(q, k, v, causal=True,
                                    learnable_sink=torch.full((H,), -1e4, device=device))
    assert torch.equal(plain, low)
    high = flashattn.flash_attn_func(q, k, v, learnable_sink=torch.full((H,), 200.0, device=device))
    assert high.abs().max() < 1e-30


@pytest.mark.parametrize("device", DEVICES)
def test_sink_arguments(device):
    q = rand([1, 5, 2, 16], torch.bfloat16, device)
    for bad, msg in ((torch.zeros(2, dtype=torch.float16, device=device), "float32"),
                     (torch.zeros(3, device=device), r"shape \(nheads,\) = \(2,\)"),
                     (torch.zeros(1, 2, device=device), r"shape \(nheads,\)")):
        with pytest.raises(RuntimeError, match=f"learnable_sink must .*{msg}"):
            flashattn.flash_attn_func(q, q, q, learnable_sink=bad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["kvpacked", "qkvpacked", "varlen_kvpacked", "varlen_qkvpacked"])
def test_packed_functions(device, name):
    """The packed functions pass learnable_sink and dropout_p through (same numbers as
    flash_attn_func / flash_attn_varlen_func for the same seed)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    B, S, H, d = 2, 29, 2, 16
    qkv = rand([B, S, 3, H, d], dtype, device)
    sink = torch.randn(H, device=device)
    q, k, v = qkv.unbind(2)
    cu = torch.tensor([0, S, 2 * S], dtype=torch.int32, device=device)
    kw = dict(dropout_p=0.2, causal=True, learnable_sink=sink)
    torch.manual_seed(5)
    if name.startswith("varlen"):
        want = flashattn.flash_attn_varlen_func(*(t.flatten(0, 1) for t in (q, k, v)), cu, cu, S,
                                                S, **kw)
        torch.manual_seed(5)
        if name == "varlen_kvpacked":
            got = flashattn.flash_attn_varlen_kvpacked_func(
                q.flatten(0, 1), qkv[:, :, 1:].flatten(0, 1), cu, cu, S, S, **kw)
        else:
            got = flashattn.flash_attn_varlen_qkvpacked_func(qkv.flatten(0, 1), cu, S, **kw)
    else:
        want = flashattn.flash_attn_func(q, k, v, **kw)
        torch.manual_seed(5)
        if name == "kvpacked":
            got = flashattn.flash_attn_kvpacked_func(q, qkv[:, :, 1:], **kw)
        else:
            got = flashattn.flash_attn_qkvpacked_func(qkv, **kw)
    assert torch.equal(got, want)

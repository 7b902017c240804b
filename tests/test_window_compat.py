"""flash-attn compatibility of wide windows: a window side >= seqlen_k is unbounded.

With seqlen_q > seqlen_k the bottom-right diagonal sits left of the keys, so a right window
of 5 over 4 keys would hide keys from early rows under the literal rule; flash-attn (and we)
treat any side >= seqlen_k as -1."""
import pytest
import torch

import flashattn
from helpers import DEVICES


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("varlen", [False, True])
def test_wide_window_is_unbounded(device, varlen):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    sq, sk, h, d = 10, 4, 2, 32
    q = torch.randn(1, sq, h, d, device=device, dtype=dtype)
    k = torch.randn(1, sk, h, d, device=device, dtype=dtype)
    v = torch.randn(1, sk, h, d, device=device, dtype=dtype)
    if varlen:
        cu_q = torch.tensor([0, sq], device=device, dtype=torch.int32)
        cu_k = torch.tensor([0, sk], device=device, dtype=torch.int32)
        def run(w):
            return flashattn.flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, sq, sk,
                                                    window_size=w)
    else:
        def run(w):
            return flashattn.flash_attn_func(q, k, v, window_size=w)
    full = run((-1, -1))
    assert torch.equal(run((-1, sk)), full)
    assert torch.equal(run((sk + 3, sk + 1)), full)
    # A narrower right window must differ (row 0 then sees no key under the shifted diagonal).
    assert not torch.equal(run((-1, sk - 1)), full)

"""The reference itself, checked against independent float64 computations: SDPA (with
torch's own bottom-right causal bias), an explicit per-element loop for softcap/ALiBi/window,
and gradcheck. Needs no flashattn build."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from reference import attention_ref, attention_varlen_ref


def _sdpa(q, k, v, **kw):
    # SDPA layout (B, H, S, d)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kw)
    return o.transpose(1, 2)


@pytest.mark.parametrize("sq,sk", [(1, 1), (113, 203), (128, 128), (1, 239), (37, 37)])
@pytest.mark.parametrize("hk", [4, 2, 1])
def test_ref_vs_sdpa(sq, sk, hk):
    B, H, d, dv = 2, 4, 40, 24
    q = torch.randn(B, sq, H, d, dtype=torch.float64)
    k = torch.randn(B, sk, hk, d, dtype=torch.float64)
    v = torch.randn(B, sk, hk, dv, dtype=torch.float64)
    out, lse = attention_ref(q, k, v)
    exp = _sdpa(q, k, v, enable_gqa=hk != H)
    torch.testing.assert_close(out, exp, rtol=1e-10, atol=1e-10)
    kk = k.repeat_interleave(H // hk, 2)
    s = torch.einsum("bihd,bjhd->bhij", q, kk) / math.sqrt(d)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), rtol=1e-10, atol=1e-10)
    # causal, bottom-right, with torch's own implementation of the alignment (sq <= sk: no
    # empty rows, SDPA would give NaN there); GQA / MQA through SDPA's enable_gqa.
    out_c, _ = attention_ref(q, k, v, causal=True, softmax_scale=0.3)
    bias = causal_lower_right(sq, sk)
    exp_c = _sdpa(q, k, v, attn_mask=bias, scale=0.3, enable_gqa=hk != H)
    torch.testing.assert_close(out_c, exp_c, rtol=1e-10, atol=1e-10)


def _naive(q, k, v, scale, causal, window, softcap, slopes):
    """One query row at a time, one element at a time: the params.h formula verbatim."""
    B, sq, H, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    left, right = window
    if causal:
        right = 0
    out = torch.zeros(B, sq, H, v.shape[-1], dtype=torch.float64)
    lse = torch.full((B, H, sq), float("-inf"), dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            kh = h // (H // hk)
            for i in range(sq):
                scores, vals = [], []
                for j in range(sk):
                    if left >= 0 and j < i + sk - sq - left:
                        continue
                    if right >= 0 and j > i + sk - sq + right:
                        continue
                    s = float(q[b, i, h] @ k[b, j, kh]) * scale
                    if softcap > 0:
                        s = softcap * math.tanh(s / softcap)
                    if slopes is not None:
                        sl = slopes[b, h] if slopes.dim() == 2 else slopes[h]
                        s -= float(sl) * abs(i + sk - sq - j)
                    scores.append(s)
                    vals.append(v[b, j, kh])
                if scores:
                    m = max(scores)
                    w = [math.exp(s - m) for s in scores]
                    tot = sum(w)
                    out[b, i, h] = sum(wi * vi for wi, vi in zip(w, vals)) / tot
                    lse[b, h, i] = m + math.log(tot)
    return out, lse


@pytest.mark.parametrize(
    "sq,sk,causal,window,softcap,alibi",
    [
        (7, 11, True, (-1, -1), 0.0, None),
        (11, 7, True, (-1, -1), 2.0, "h"),  # empty rows
        (9, 9, False, (2, 1), 0.0, "bh"),
        (5, 12, False, (0, 0), 1.5, None),
        (12, 5, False, (3, -1), 0.0, "h"),
        (12, 5, False, (-1, 0), 0.0, "bh"),  # causal-equivalent via window
        (6, 6, True, (1, 3), 2.0, "bh"),
        (1, 9, False, (2, 2), 0.0, None),
    ],
)
def test_ref_vs_naive(sq, sk, causal, window, softcap, alibi):
    B, H, hk, d, dv = 2, 4, 2, 8, 5
    q = torch.randn(B, sq, H, d, dtype=torch.float64) * 1.5
    k = torch.randn(B, sk, hk, d, dtype=torch.float64)
    v = torch.randn(B, sk, hk, dv, dtype=torch.float64)
    slopes = None
    if alibi == "h":
        slopes = torch.rand(H) * 0.5
    elif alibi == "bh":
        slopes = torch.rand(B, H) * 0.5
    kw = dict(softmax_scale=0.37, causal=causal, window_size=window, softcap=softcap,
              alibi_slopes=slopes)
    out, lse = attention_ref(q, k, v, **kw)
    exp_o, exp_l = _naive(q, k, v, 0.37, causal, window, softcap, slopes)
    torch.testing.assert_close(out, exp_o, rtol=1e-10, atol=1e-12)
    assert torch.equal(torch.isinf(lse), torch.isinf(exp_l))
    fin = ~torch.isinf(exp_l)
    torch.testing.assert_close(lse[fin], exp_l[fin], rtol=1e-10, atol=1e-12)


def test_ref_gradcheck_with_empty_rows():
    """float64 autograd through the reference is exact and NaN-free with empty rows."""
    B, sq, sk, H, hk, d, dv = 1, 6, 3, 2, 1, 4, 3
    q = torch.randn(B, sq, H, d, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, sk, hk, d, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, sk, hk, dv, dtype=torch.float64, requires_grad=True)
    slopes = torch.rand(H, dtype=torch.float64)

    def f(q, k, v):
        return attention_ref(q, k, v, causal=True, softcap=1.5, alibi_slopes=slopes,
                             window_size=(1, -1))[0]

    assert torch.autograd.gradcheck(f, (q, k, v))
    o = f(q, k, v)
    g = torch.autograd.grad(o.sum(), (q, k, v))
    assert all(torch.isfinite(x).all() for x in g)
    assert (o[:, : sq - sk] == 0).all()  # rows before the diagonal see nothing


def test_varlen_ref_matches_padded():
    lens_q, lens_k = [5, 0, 9, 1], [7, 3, 0, 4]
    H, hk, d = 4, 2, 16
    q = torch.randn(sum(lens_q), H, d, dtype=torch.float64)
    k = torch.randn(sum(lens_k), hk, d, dtype=torch.float64)
    v = torch.randn(sum(lens_k), hk, d, dtype=torch.float64)
    cq = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    ck = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    slopes = torch.rand(4, H)
    out, lse = attention_varlen_ref(q, k, v, cq, ck, causal=True, alibi_slopes=slopes)
    assert out.shape == (sum(lens_q), H, d) and lse.shape == (H, sum(lens_q))
    for b in range(4):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        o, l = attention_ref(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=True,
                             alibi_slopes=slopes[b])
        torch.testing.assert_close(out[q0:q1], o[0])
        torch.testing.assert_close(lse[:, q0:q1], l[0])
    # sequence 2 has no keys: every row empty
    assert (out[cq[2]:cq[3]] == 0).all() and torch.isneginf(lse[:, cq[2]:cq[3]]).all()


def test_covering_set_covers_all_pairs():
    """The case generator used by test_attention / test_varlen covers every value pair."""
    import itertools

    from helpers import HDIMS, HEADS, SEQLENS, covering_set

    factors = dict(dtype=["fp16", "bf16", "fp32"], hd=HDIMS, sl=SEQLENS, causal=[False, True],
                   window=["none", "sym", "left", "right"], softcap=[0.0, 2.0],
                   alibi=["none", "h", "bh"], heads=list(HEADS), noncontig=[False, True])
    cases = covering_set(factors, seed=9)  # test_attention's seed
    assert cases == covering_set(factors, seed=9)  # deterministic: stable test ids
    for a, b in itertools.combinations(factors, 2):
        seen = {(c[a], c[b]) for c in cases}
        for va, vb in itertools.product(factors[a], factors[b]):
            assert (va, vb) in seen, (a, va, b, vb)
    assert len(cases) < 2 * len(HDIMS) * len(SEQLENS)

"""Padded attention (flash_attn_func): out, softmax_lse and dq/dk/dv against the float64
reference, over a pairwise covering set of the features plus hand-picked hard corners."""
import pytest
import torch

import flashattn
from helpers import (DEVICES, HDIMS, HEADS, SEQLENS, DTYPES, alibi_slopes, case_id,
                     check_results, covering_set, dtypes_for, rand, skip_if_no_kernel)
from reference import ref_and_lowp

BATCH = 2


def window_for(kind, sq, sk):
    """Windows derived from the lengths; window_right < seqlen_k always, so flash-attn's
    `window >= seqlen_k -> -1` normalisation cannot change the meaning."""
    return {
        "none": (-1, -1),
        "sym": (sk // 3, sk // 5),
        "left": (sk // 4 + 1, -1),
        "right": (-1, sk // 5),
    }[kind]


def _factors(device):
    return dict(
        dtype=dtypes_for(device),
        hd=HDIMS,
        sl=SEQLENS,
        causal=[False, True],
        window=["none", "sym", "left", "right"],
        softcap=[0.0, 2.0],
        alibi=["none", "h", "bh"],
        heads=list(HEADS),
        noncontig=[False, True],
    )


# Cases beyond the pairwise set: the corners where kernels break.
HARD_CORNERS = [
    # empty rows (causal, seqlen_q > seqlen_k) with every other feature on
    dict(dtype="bf16", hd=(64, 64), sl=(799, 3), causal=True, window="none", softcap=2.0,
         alibi="bh", heads="gqa", noncontig=True),
    # window that empties rows in the middle of a non-causal problem
    dict(dtype="fp16", hd=(96, 96), sl=(239, 1), causal=False, window="diag", softcap=0.0,
         alibi="none", heads="mha", noncontig=False),
    # diagonal-only window on a square problem, max head dim, MQA
    dict(dtype="fp16", hd=(256, 256), sl=(128, 128), causal=False, window="diag", softcap=0.0,
         alibi="h", heads="mqa", noncontig=False),
    # everything at once, d_v != d_qk
    dict(dtype="bf16", hd=(192, 128), sl=(113, 203), causal=True, window="sym", softcap=2.0,
         alibi="bh", heads="gqa", noncontig=True),
    # single key seen by many queries, odd small head dim
    dict(dtype="fp16", hd=(59, 59), sl=(239, 1), causal=False, window="none", softcap=0.0,
         alibi="none", heads="mqa", noncontig=True),
    # one query over many keys, causal (row sees all), large head dim
    dict(dtype="bf16", hd=(224, 224), sl=(1, 239), causal=True, window="none", softcap=0.0,
         alibi="bh", heads="gqa", noncontig=False),
    # large score range: exercises the running-max rescale
    dict(dtype="fp16", hd=(128, 128), sl=(113, 203), causal=False, window="none", softcap=0.0,
         alibi="none", heads="mha", noncontig=False, qscale=8.0),
    dict(dtype="bf16", hd=(40, 40), sl=(128, 128), causal=True, window="none", softcap=0.0,
         alibi="none", heads="mha", noncontig=False, qscale=8.0),
    # GQA group of 8 over two KV heads (the covering set's group of 8 has one)
    dict(dtype="bf16", hd=(128, 128), sl=(113, 203), causal=True, window="sym", softcap=0.0,
         alibi="h", heads=(16, 2), noncontig=True),
    # fp32 (CPU only) on awkward shapes
    dict(dtype="fp32", hd=(111, 111), sl=(799, 3), causal=False, window="sym", softcap=2.0,
         alibi="h", heads="gqa", noncontig=True),
    dict(dtype="fp32", hd=(160, 160), sl=(113, 203), causal=True, window="left", softcap=0.0,
         alibi="none", heads="mqa", noncontig=False),
]


def _params():
    out = []
    for device in DEVICES:
        # seed: of those tried (1-10), the covering set that runs fastest on the CPU
        for c in covering_set(_factors(device), seed=9):
            out.append(pytest.param(device, c, id=f"{device}-{case_id(c)}"))
        for c in HARD_CORNERS:
            if c["dtype"] in dtypes_for(device):
                out.append(pytest.param(device, c, id=f"{device}-corner-{case_id(c)}"))
    return out


def run_case(device, c, softmax_scale=None, deterministic=False):
    dtype = DTYPES[c["dtype"]]
    d, dv = c["hd"]
    sq, sk = c["sl"]
    H, Hk = c["heads"] if isinstance(c["heads"], tuple) else HEADS[c["heads"]]
    skip_if_no_kernel(device, dtype, d, dv)
    if isinstance(c["window"], tuple):  # explicit (left, right)
        window = c["window"]
    else:
        window = (0, 0) if c["window"] == "diag" else window_for(c["window"], sq, sk)
    nc = c["noncontig"]
    q = rand([BATCH, sq, H, d], dtype, device, nc, scale=c.get("qscale", 1.0))
    k = rand([BATCH, sk, Hk, d], dtype, device, nc)
    v = rand([BATCH, sk, Hk, dv], dtype, device, nc)
    dout = rand([BATCH, sq, H, dv], dtype, device, nc)
    slopes = alibi_slopes(c["alibi"], BATCH, H, device)
    kw = dict(softmax_scale=softmax_scale, causal=c["causal"], window_size=window,
              softcap=c["softcap"], alibi_slopes=slopes)

    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse, _ = flashattn.flash_attn_func(qg, kg, vg, deterministic=deterministic,
                                            return_attn_probs=True, **kw)
    dq, dk, dv_ = torch.autograd.grad(out, (qg, kg, vg), dout)
    ours = dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv_)
    ref, low = ref_and_lowp(q, k, v, dout, **kw)
    check_results(ours, ref, low, dtype)
    return ours


@pytest.mark.parametrize("device,c", _params())
def test_attention(device, c):
    run_case(device, c)


@pytest.mark.parametrize("device,dtype", [(dev, dt) for dev in DEVICES
                                          for dt in ("bf16", "fp32") if dt in dtypes_for(dev)])
@pytest.mark.parametrize("scale", [0.5, 0.013])
def test_explicit_softmax_scale(device, dtype, scale):
    """softmax_scale other than 1/sqrt(d). In fp32 (CPU) the tolerance is tight enough that
    a 1% error in the scale fails (bf16's is not)."""
    c = dict(dtype=dtype, hd=(80, 80), sl=(113, 203), causal=True, window="none",
             softcap=0.0, alibi="h", heads="gqa", noncontig=False)
    run_case(device, c, softmax_scale=scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("c", [
    dict(dtype="fp32", hd=(32, 64), sl=(113, 203), causal=True, window="none", softcap=2.0,
         alibi="h", heads="gqa4", noncontig=False),
    dict(dtype="bf16", hd=(32, 64), sl=(239, 1), causal=False, window="sym", softcap=0.0,
         alibi="none", heads="mqa", noncontig=True),
    dict(dtype="fp16", hd=(40, 96), sl=(128, 128), causal=False, window="left", softcap=0.0,
         alibi="bh", heads="gqa2", noncontig=False),
], ids=case_id)
def test_value_headdim_larger(device, c):
    """d_v > d_qk (the covering set has only d_v < d_qk): forward and backward."""
    if c["dtype"] not in dtypes_for(device):
        pytest.skip(f"{c['dtype']} is CPU only")
    run_case(device, c)


@pytest.mark.parametrize("device", DEVICES)
def test_seqlen_k_zero(device):
    """No keys at all: every row is empty (out 0, lse -inf, zero gradients)."""
    dtype = torch.float16
    skip_if_no_kernel(device, dtype, 64)
    q = rand([2, 5, 2, 64], dtype, device).requires_grad_()
    k = rand([2, 0, 2, 64], dtype, device).requires_grad_()
    v = rand([2, 0, 2, 64], dtype, device).requires_grad_()
    out, lse, _ = flashattn.flash_attn_func(q, k, v, return_attn_probs=True)
    assert (out == 0).all() and torch.isneginf(lse).all()
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert (dq == 0).all() and dk.numel() == 0 and dv.numel() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_seqlen_q_zero(device):
    dtype = torch.bfloat16
    skip_if_no_kernel(device, dtype, 32)
    q = rand([2, 0, 2, 32], dtype, device).requires_grad_()
    k = rand([2, 7, 1, 32], dtype, device).requires_grad_()
    v = rand([2, 7, 1, 32], dtype, device).requires_grad_()
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == (2, 0, 2, 32) and lse.shape == (2, 2, 0)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert (dk == 0).all() and (dv == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [1, 3, 8, 17])
def test_tiny_head_dims(device, d):
    """Head dims 1..256 are all legal; the smallest ones run in the smallest bucket."""
    c = dict(dtype="fp16", hd=(d, d), sl=(113, 203), causal=d % 2 == 1, window="none",
             softcap=0.0, alibi="none", heads="gqa", noncontig=False)
    run_case(device, c)


def _mask_params():
    """Every (seqlens, causal, window) combination: the masking logic (bottom-right shift,
    window edges, empty rows, block skipping) is where off-by-one bugs live. The other
    factors rotate through their values."""
    out = []
    windows = ["none", "sym", "left", "right", "diag"]
    for device in DEVICES:
        dts = dtypes_for(device)
        n = 0
        for sl in SEQLENS:
            for causal in (False, True):
                for w in windows:
                    c = dict(dtype=dts[n % len(dts)], hd=HDIMS[(5 * n) % len(HDIMS)], sl=sl,
                             causal=causal, window=w, softcap=0.0, alibi="none",
                             heads=list(HEADS)[n % 3], noncontig=False)
                    out.append(pytest.param(device, c, id=f"{device}-{case_id(c)}"))
                    n += 1
    return out


@pytest.mark.parametrize("device,c", _mask_params())
def test_masks(device, c):
    run_case(device, c)


# Windows much shorter than the sequences: the later query blocks of the CUDA kernels start
# past the leading key blocks (skipped) and stop before the trailing ones. Too slow for the
# CPU suite at these lengths; the CPU backend's block skipping is covered by test_masks.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("c", [
    dict(dtype="fp16", hd=(64, 64), sl=(1024, 1024), causal=False, window=(100, 0),
         softcap=0.0, alibi="none", heads="gqa"),
    dict(dtype="bf16", hd=(128, 128), sl=(1100, 1500), causal=False, window=(64, 64),
         softcap=0.0, alibi="none", heads="mha"),
    dict(dtype="bf16", hd=(64, 64), sl=(1500, 1100), causal=False, window=(64, 64),
         softcap=2.0, alibi="h", heads="gqa4"),
    dict(dtype="fp16", hd=(128, 128), sl=(1000, 1000), causal=True, window=(100, -1),
         softcap=0.0, alibi="none", heads="mqa"),
    dict(dtype="bf16", hd=(96, 96), sl=(1300, 1300), causal=False, window=(0, 200),
         softcap=0.0, alibi="bh", heads=(16, 2)),
], ids=lambda c: f"cuda-{case_id(c)}")
def test_long_sequence_short_window(c):
    run_case("cuda", dict(c, noncontig=False))


# More tiles than an H200 has SMs (132): the sm90 forward's persistent grid, causal / window
# tiles dealt in pairs of a head's longest and shortest query blocks (csrc/sm90/
# tile_order_sm90.h), with odd query-block counts (a lone middle block per head) and, causal
# with seqlen_q > seqlen_k, tiles whose rows see no key. Tiles: sm90's block_m is 128 (d64:
# 192). On other GPUs these are long-sequence cases of the sm80 kernels.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("c", [
    dict(dtype="bf16", hd=(128, 128), sl=(1100, 1100), causal=True, window="none",
         softcap=0.0, alibi="none", heads=(16, 4)),   # 9 query blocks x 32 = 288 tiles
    dict(dtype="fp16", hd=(64, 64), sl=(1300, 1000), causal=True, window="none",
         softcap=0.0, alibi="none", heads=(12, 4)),   # 7 x 24 = 168
    dict(dtype="bf16", hd=(256, 256), sl=(700, 900), causal=False, window="none",
         softcap=0.0, alibi="none", heads=(16, 16)),  # 6 x 32 = 192, the snake deal
    dict(dtype="bf16", hd=(128, 128), sl=(1500, 1500), causal=False, window=(200, 0),
         softcap=0.0, alibi="none", heads=(8, 8)),    # 12 x 16 = 192
    # >= 8192 keys, plain, non-causal or causal: sm90's long-key tile at d128 (128 x 176, a
    # partial last key block; causal with the diagonal crossing key blocks of 176), and a case
    # with a score transform that stays on 128 x 128
    dict(dtype="bf16", hd=(128, 128), sl=(300, 8300), causal=False, window="none",
         softcap=0.0, alibi="none", heads=(4, 2)),
    dict(dtype="bf16", hd=(128, 128), sl=(700, 8250), causal=True, window="none",
         softcap=0.0, alibi="none", heads=(4, 2)),
    dict(dtype="fp16", hd=(128, 128), sl=(8200, 8200), causal=True, window="none",
         softcap=0.0, alibi="none", heads=(1, 1)),
    dict(dtype="fp16", hd=(96, 96), sl=(130, 8192), causal=False, window="none",
         softcap=0.0, alibi="none", heads=(2, 1)),
    dict(dtype="bf16", hd=(128, 128), sl=(200, 8200), causal=False, window="none",
         softcap=3.0, alibi="h", heads=(2, 2)),
], ids=lambda c: f"cuda-{case_id(c)}")
def test_persistent_grid(c):
    run_case("cuda", dict(c, noncontig=False))


# d64 causal / window over <= 1024 query rows: the short local tile (128 x 128, tile_fwd_sm90.h;
# the default, FLASHATTN_SM90_SHORT_LOCAL=0 turns it off), over more tiles than an H200 has
# SMs; on other GPUs sm80 runs them.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("c", [
    dict(dtype="bf16", hd=(64, 64), sl=(1000, 1000), causal=True, window="none",
         softcap=0.0, alibi="none", heads=(16, 4)),   # 8 x 32 = 256 tiles
    dict(dtype="fp16", hd=(48, 48), sl=(1024, 1300), causal=False, window=(150, 40),
         softcap=0.0, alibi="none", heads=(12, 12)),  # 8 x 24 = 192
    dict(dtype="bf16", hd=(64, 64), sl=(513, 700), causal=True, window="none",
         softcap=0.0, alibi="none", heads=(4, 1)),    # a partial last query block
], ids=lambda c: f"cuda-{case_id(c)}")
def test_short_local_tile(c, monkeypatch):
    monkeypatch.delenv("FLASHATTN_SM90_SHORT_LOCAL", raising=False)  # the default: on
    run_case("cuda", dict(c, noncontig=False))

"""FP8 (float8_e4m3fn) forward (issue 14, params.h): out and softmax_lse against the float64
reference on the dequantized inputs, within the issue's rule: our error at most 2x that of
tests/reference.py's emulation of the quantised computation (P rounded to e4m3 after the 2^8
scaling) plus the tiny term; on the CPU, which keeps P in fp32, also within 2x of the same
computation in fp32 (a tight check). Covering set: random descales (per tensor, per KV head,
per (batch, KV head), none), odd shapes, varlen with empty sequences, causal / window / GQA /
MQA / softcap, out_dtype bf16 and fp16, NaN-poisoned outputs (conftest). Also: every e4m3
code, the descale forms, the packed functions, argument errors (the same on every backend),
the forward-only error, opcheck, torch.compile.

On CUDA the sm90 FP8 kernel runs it (kernel_fwd_sm90.cuh's kFp8, after the staging pass of
stage_fp8_sm90.cuh); other GPUs raise "FP8 attention needs an sm90 (Hopper) GPU", a skip here
for good. The staged layouts' index maps are checked on the host (test_sm90_fp8_stage_layout).
"""
import pytest
import torch

import flashattn
from helpers import (DEVICES, HEADS, assert_close, case_id, covering_set, needs_host_cxx,
                     run_host_check, skip_unless_sm90)
from reference import FP8_P_SCALE, attention_ref, dequantize_fp8, ref_and_emul_fp8, round_e4m3
from test_dropout import SHAPES, _cu, _window

FP8 = torch.float8_e4m3fn
OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HD = [(32, 32), (59, 59), (64, 64), (111, 111), (128, 128), (192, 128), (256, 256)]
SM90_MARK = "FP8 attention needs an sm90 (Hopper) GPU"


def fp8_skip(device):
    """Skip where this build or device has no FP8 forward (the reason says which)."""
    if flashattn.BUILD_CONFIG.get("FLASHATTN_DISABLE_FP8"):
        pytest.skip("this build has no FP8 kernels (FLASHATTN_DISABLE_FP8)")
    if device == "cpu":
        return
    # A head dim this build has (a build narrowed by FLASHATTN_HEADDIMS may lack 64): the
    # cases of the others skip on their own ("left out of this build").
    built = flashattn.BUILD_CONFIG.get("FLASHATTN_HEADDIMS") or [64]
    q = torch.empty(1, 1, 1, 64 if 64 in built else min(built), device=device, dtype=FP8)
    try:
        flashattn.kernel_path(q, q, q)
    except RuntimeError as e:
        pytest.skip(str(e).splitlines()[0])


def quantize(shape, device, noncontig=False):
    """randn values cast to e4m3 (the codes a caller's quantizer would hand us); noncontig: a
    view with every stride but the last one's changed (helpers.rand's layout)."""
    x = torch.randn(*shape, device=device).to(FP8)
    if not noncontig:
        return x
    *lead, last = shape
    big = torch.empty(*lead[:-2], lead[-1], lead[-2], last + 7, dtype=FP8, device=device)
    view = big.transpose(-2, -3)[..., :last]
    view.view(torch.uint8).copy_(x.view(torch.uint8))
    assert view.shape == x.shape and not view.is_contiguous()
    return view


def descale(kind, B, Hk, device):
    """None, or a random fp32 descale in [0.5, 2) of the given form (before broadcasting)."""
    shape = {"none": None, "tensor": (), "h": (Hk,), "b1": (B, 1), "bh": (B, Hk)}[kind]
    return None if shape is None else torch.rand(shape, device=device) * 1.5 + 0.5


def _full(d, B, Hk):
    return None if d is None else d.expand(B, Hk).contiguous().cpu()


def check_fp8(ours, ref, emul, f32, out_dtype, device):
    assert ours["out"].dtype == out_dtype and ours["lse"].dtype == torch.float32
    assert_close("out vs emulation", ours["out"], ref["out"], emul["out"], out_dtype, 2.0)
    assert_close("lse vs emulation", ours["lse"], ref["lse"], emul["lse"], out_dtype, 2.0)
    if device == "cpu":  # P stays fp32 there: as close as PyTorch's fp32 computation
        assert_close("out vs fp32", ours["out"], ref["out"], f32["out"], out_dtype, 2.0)
        assert_close("lse vs fp32", ours["lse"], ref["lse"], f32["lse"], torch.float32, 2.0)


def run_case(device, c):
    fp8_skip(device)
    out_dtype = OUT_DTYPES[c["out"]]
    d, dv = c["hd"]
    H, Hk = HEADS[c["heads"]]
    varlen = c["shape"].startswith("vl_")
    if varlen:
        lens_q, lens_k = SHAPES[c["shape"]]
        B, sq, sk = len(lens_q), max(lens_q), max(lens_k)
        qs, ks = [sum(lens_q), H, d], [sum(lens_k), Hk]
        cu = (_cu(lens_q, device), _cu(lens_k, device))
        sk_min = min(x for x in lens_k if x > 0)
    else:
        sq, sk = SHAPES[c["shape"]]
        B = 2
        qs, ks = [B, sq, H, d], [B, sk, Hk]
        cu, sk_min = None, sk
    q = quantize(qs, device, noncontig=c["noncontig"])
    k, v = quantize(ks + [d], device), quantize(ks + [dv], device, noncontig=c["noncontig"])
    qd, kd, vd = (descale(c[n], B, Hk, device) for n in ("qd", "kd", "vd"))
    kw = dict(causal=c["causal"], window_size=_window(c["window"], sk_min), softcap=c["softcap"])
    fp8 = dict(q_descale=qd, k_descale=kd, v_descale=vd,
               out_dtype=None if c["out"] == "bf16" else out_dtype)
    if varlen:
        out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, *cu, sq, sk, **kw, **fp8,
                                                       return_attn_probs=True)
    else:
        out, lse, _ = flashattn.flash_attn_func(q, k, v, **kw, **fp8, return_attn_probs=True)
    ref, emul, f32 = ref_and_emul_fp8(
        q.cpu(), k.cpu(), v.cpu(), _full(qd, B, Hk), _full(kd, B, Hk), _full(vd, B, Hk),
        None if cu is None else tuple(x.cpu() for x in cu), out_dtype, **kw)
    check_fp8({"out": out, "lse": lse}, ref, emul, f32, out_dtype, device)


def _factors(device):
    return dict(
        out=list(OUT_DTYPES), hd=HD, shape=list(SHAPES), causal=[False, True],
        window=["none", "sym", "left", "right"], softcap=[0.0, 2.0],
        heads=["mha", "gqa", "mqa", "gqa4"], qd=["bh", "tensor", "none"],
        kd=["bh", "h", "b1"], vd=["bh", "tensor", "h"], noncontig=[False, True])


def _params():
    return [pytest.param(device, c, id=f"{device}-{case_id(c)}")
            for device in DEVICES for c in covering_set(_factors(device), seed=14)]


@pytest.mark.parametrize("device,c", _params())
def test_fp8_forward(device, c):
    run_case(device, c)


def _vchip_params():
    cases = covering_set(_factors("cuda"), seed=41)
    # "cuda-" in the ids: the GPU job's `-k cuda` selects them (2026-12-06: it did not before)
    return [pytest.param(c, id=f"cuda-{case_id(c)}") for c in cases[: max(12, len(cases) // 3)]]


@pytest.mark.cuda
@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device")
@pytest.mark.parametrize("c", _vchip_params())
def test_fp8_forward_vchip(c, monkeypatch):
    """The sm90 FP8 forward with V transposed on chip (FLASHATTN_SM90_FP8_VCHIP=1: off by
    default until these pass on a GPU) instead of by the staging pass: the checks of
    test_fp8_forward on a share of its covering set (skipped off Hopper)."""
    skip_unless_sm90()
    monkeypatch.setenv("FLASHATTN_SM90_FP8_VCHIP", "1")
    run_case("cuda", c)


def _long_params():
    f = _factors("cuda")
    f.update(hd=[(64, 64), (111, 111), (128, 128), (240, 240), (256, 256)], window=["none"],
             softcap=[0.0])
    return [pytest.param(c, id=f"cuda-{case_id(c)}") for c in covering_set(f, seed=43)]


@pytest.mark.cuda
@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device")
@pytest.mark.parametrize("c", _long_params())
def test_fp8_forward_long_tile(c, monkeypatch):
    """The sm90 FP8 forward's long-key tiles (tile_fwd_sm90.h's fwd_tile_fp8_long: d128 128 x
    192 from 8k keys up by default, d256 128 x 128 from 2k) at every length
    (FLASHATTN_SM90_FP8_LONG=1): partial and single key blocks, causal, varlen with empty
    sequences (its V^T regions hold 192-key blocks), GQA, the descales; the calls they take
    (d 72-128 and 193-256, no softcap, no window but causal)."""
    skip_unless_sm90()
    monkeypatch.setenv("FLASHATTN_SM90_FP8_LONG", "1")
    run_case("cuda", c)


def _short_params():
    f = _factors("cuda")
    f.update(hd=[(32, 32), (59, 59), (64, 64)], softcap=[0.0])
    cases = covering_set(f, seed=47)
    for c in cases:  # causal or windowed calls: the ones the tile takes
        if c["window"] == "none":
            c["causal"] = True
    return [pytest.param(c, id=f"cuda-{case_id(c)}") for c in cases]


@pytest.mark.cuda
@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device")
@pytest.mark.parametrize("c", _short_params())
def test_fp8_forward_short_local_tile(c, monkeypatch):
    """The sm90 FP8 forward's d64 short local tile (tile_fwd_sm90.h's fwd_tile_fp8_short_local:
    128 x 128 for causal / windowed calls of at most 1024 query rows, opt-in under
    FLASHATTN_SM90_FP8_SHORT=1): head dims 32-64, causal and the windows, varlen with empty
    sequences, GQA / MQA, the descales, noncontiguous inputs (skipped off Hopper)."""
    skip_unless_sm90()
    monkeypatch.setenv("FLASHATTN_SM90_FP8_SHORT", "1")
    run_case("cuda", c)


@pytest.mark.cuda
@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device")
@pytest.mark.parametrize("causal", [False, True], ids=["nc", "causal"])
@pytest.mark.parametrize("d,keys", [(128, 8300), (256, 2100)], ids=["cuda-d128", "cuda-d256"])
def test_fp8_forward_long_tile_default(d, keys, causal, monkeypatch):
    """The long-key tile as a user's call meets it (FLASHATTN_SM90_FP8_LONG unset: d 128 from
    8192 keys, d 256 from 2048): 8300 / 2100 keys (a partial last 192- / 128-key block), 77
    queries, GQA 4 / 2."""
    skip_unless_sm90()
    fp8_skip("cuda")
    monkeypatch.delenv("FLASHATTN_SM90_FP8_LONG", raising=False)
    q = quantize([1, 77, 4, d], "cuda")
    k, v = quantize([1, keys, 2, d], "cuda"), quantize([1, keys, 2, d], "cuda")
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    ref, emul, _ = ref_and_emul_fp8(q.cpu(), k.cpu(), v.cpu(), causal=causal)
    check_fp8({"out": out, "lse": lse}, ref, emul, None, torch.bfloat16, "cuda")


@pytest.mark.cuda
@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device")
@pytest.mark.parametrize("vchip,long_tile,lens_q,lens_k", [
    ("0", "0", [150, 0], [200, 300]),
    ("1", "0", [150, 0], [200, 300]),
    ("0", "1", [150, 0], [200, 300]),
    # The long tile's tightest region edge: a sequence from key row 1 (mod 128) whose length
    # is 255 (mod 384): its last 192-key block ends where the next sequence's region starts.
    ("0", "1", [0, 100, 0], [1, 255, 300]),
], ids=["cuda-staged", "cuda-vchip", "cuda-long", "cuda-long-edge"])
def test_varlen_nan_neighbour(vchip, long_tile, lens_q, lens_k, monkeypatch):
    """Varlen, both V^T paths and the long-key tile: a sequence whose last key block is partial
    next to one whose V starts with NaN codes (and which has no queries): the sequence's output
    stays finite and right (P is 0 past its keys, but 0 x NaN is NaN, so those rows must read
    as zeros). Checked: the last sequence with queries."""
    skip_unless_sm90()
    monkeypatch.setenv("FLASHATTN_SM90_FP8_VCHIP", vchip)
    monkeypatch.setenv("FLASHATTN_SM90_FP8_LONG", long_tile)
    q = quantize([sum(lens_q), 2, 128], "cuda")
    k, v = quantize([sum(lens_k), 2, 128], "cuda"), quantize([sum(lens_k), 2, 128], "cuda")
    nan0 = sum(lens_k[:-1])  # e4m3fn NaN, the last sequence's first 60 keys
    v.view(torch.uint8)[nan0:nan0 + 60] = 0x7F
    cu = (_cu(lens_q, "cuda"), _cu(lens_k, "cuda"))
    out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, *cu, max(lens_q), max(lens_k),
                                                   return_attn_probs=True)
    b = max(i for i, n in enumerate(lens_q) if n > 0)
    q0, k0 = sum(lens_q[:b]), sum(lens_k[:b])
    qs, ks = slice(q0, q0 + lens_q[b]), slice(k0, k0 + lens_k[b])
    ref, emul, _ = ref_and_emul_fp8(q[qs].cpu(), k[ks].cpu(), v[ks].cpu(),
                                    cu_seqlens=(_cu([lens_q[b]], "cpu"), _cu([lens_k[b]], "cpu")))
    check_fp8({"out": out[qs], "lse": lse[:, qs]}, ref, emul, None, torch.bfloat16, "cuda")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out", list(OUT_DTYPES))
def test_every_code(device, out):
    """One visible key: out is v's row dequantized, rounded once to out_dtype, bit for bit, for
    each of the 254 finite e4m3 codes (subnormals and +-0 included); a NaN code gives NaN."""
    fp8_skip(device)
    out_dtype = OUT_DTYPES[out]
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    v = codes.view(FP8).view(1, 1, 1, -1).to(device)
    q, k = quantize([1, 1, 1, 16], device), quantize([1, 1, 1, 16], device)
    vd = torch.rand(1, 1, device=device) + 0.5
    got = flashattn.flash_attn_func(q, k, v, v_descale=vd, out_dtype=out_dtype)
    want = (v.float() * vd.view(1, 1, 1, 1)).to(out_dtype)
    assert torch.equal(got, want)
    v_nan = v.clone()
    v_nan.view(torch.uint8)[..., 3] = 0x7F
    got = flashattn.flash_attn_func(q, k, v_nan, out_dtype=out_dtype)
    assert got[..., 3].isnan().all() and not got[..., :3].isnan().any()


@pytest.mark.parametrize("device", DEVICES)
def test_descale_forms(device):
    """Every form that broadcasts to (batch, nheads_k), views and non-contiguous ones included,
    gives the numbers of the explicit contiguous (batch, nheads_k) tensor; None is 1."""
    fp8_skip(device)
    B, H, Hk, d = 3, 6, 2, 32
    q, k, v = quantize([B, 17, H, d], device), quantize([B, 23, Hk, d], device), \
        quantize([B, 23, Hk, d], device)
    full = torch.rand(B, Hk, device=device) + 0.5
    call = lambda **kw: flashattn.flash_attn_func(q, k, v, causal=True, **kw)  # noqa: E731
    base = call(q_descale=full, k_descale=full, v_descale=full)
    assert torch.equal(call(q_descale=full.t().contiguous().t(), k_descale=full,
                            v_descale=full), base)
    s = torch.rand((), device=device) + 0.5
    per_tensor = call(q_descale=s.expand(B, Hk), k_descale=s.expand(B, Hk), v_descale=s.expand(B, Hk))
    for form in (s, s.view(1), s.view(1, 1), s.expand(Hk), s.expand(B, 1)):
        assert torch.equal(call(q_descale=form, k_descale=form, v_descale=form), per_tensor)
    ones = torch.ones(B, Hk, device=device)
    assert torch.equal(call(), call(q_descale=ones, k_descale=ones, v_descale=ones))
    assert not torch.equal(call(), base)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qd_value", [-0.75, 0.0])
@pytest.mark.parametrize("causal", [False, True])
def test_nonpositive_descale(device, qd_value, causal):
    """A q descale <= 0 (scores of the other sign, or all zero: uniform attention) takes the
    kernels' scale-before-max path; against the reference and the emulation as any call."""
    fp8_skip(device)
    B, H, Hk, d, sq, sk = 2, 4, 2, 128, 130, 300
    q, k, v = quantize([B, sq, H, d], device), quantize([B, sk, Hk, d], device), \
        quantize([B, sk, Hk, d], device)
    qd = torch.full((B, Hk), qd_value, device=device)
    qd[1, 0] = 1.25  # one positive pair beside them
    kd, vd = descale("bh", B, Hk, device), descale("h", B, Hk, device)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, q_descale=qd, k_descale=kd,
                                            v_descale=vd, return_attn_probs=True)
    ref, emul, f32 = ref_and_emul_fp8(q.cpu(), k.cpu(), v.cpu(), _full(qd, B, Hk),
                                      _full(kd, B, Hk), _full(vd, B, Hk), None, torch.bfloat16,
                                      causal=causal, window_size=(-1, -1), softcap=0.0)
    check_fp8({"out": out, "lse": lse}, ref, emul, f32, torch.bfloat16, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["kvpacked", "qkvpacked", "varlen_kvpacked", "varlen_qkvpacked"])
def test_packed_functions(device, name):
    """The packed functions pass the descales and out_dtype through."""
    fp8_skip(device)
    B, S, H, d = 2, 29, 2, 32
    qkv = quantize([B, S, 3, H, d], device)
    q, k, v = qkv.unbind(2)
    cu = torch.tensor([0, S, 2 * S], dtype=torch.int32, device=device)
    kw = dict(causal=True, q_descale=torch.rand(B, H, device=device) + 0.5,
              k_descale=torch.rand(H, device=device) + 0.5,
              v_descale=torch.rand((), device=device) + 0.5, out_dtype=torch.float16)
    if name.startswith("varlen"):
        want = flashattn.flash_attn_varlen_func(*(t.flatten(0, 1) for t in (q, k, v)), cu, cu, S,
                                                S, **kw)
        if name == "varlen_kvpacked":
            got = flashattn.flash_attn_varlen_kvpacked_func(
                q.flatten(0, 1), qkv[:, :, 1:].flatten(0, 1), cu, cu, S, S, **kw)
        else:
            got = flashattn.flash_attn_varlen_qkvpacked_func(qkv.flatten(0, 1), cu, S, **kw)
    else:
        want = flashattn.flash_attn_func(q, k, v, **kw)
        if name == "kvpacked":
            got = flashattn.flash_attn_kvpacked_func(q, qkv[:, :, 1:], **kw)
        else:
            got = flashattn.flash_attn_qkvpacked_func(qkv, **kw)
    assert got.dtype == torch.float16 and torch.equal(got, want)


def test_emulation_scaling():
    """The reference's choice (reference.py): P * 2^8 stays within e4m3's range, and where most
    of a row's mass is in probabilities far below its maximum (a sink-like key 6.5 above 2047
    others: their P is about 2^-10 of the max and holds 60% of the mass) its emulation is
    much closer to float64 (15-20x here) than rounding P in [0, 1], where those P are e4m3
    subnormals."""
    torch.manual_seed(0)
    q = torch.randn(1, 16, 1, 64)
    k, v = torch.randn(1, 2048, 1, 64) * 0.3, torch.randn(1, 2048, 1, 64)
    k[:, 0] = q.mean(1) * 52 / q.mean(1).square().sum()
    s = torch.einsum("bihd,bjhd->bhij", q, k) / 8
    p = torch.exp(s - s.amax(-1, keepdim=True))
    assert (p * FP8_P_SCALE).max() <= 256 <= torch.finfo(FP8).max
    ref, _ = attention_ref(q.double(), k.double(), v.double())
    scaled, _ = attention_ref(q, k, v, compute_dtype=torch.float32, fp8_p=True)
    unscaled = torch.einsum("bhij,bjhd->bihd", round_e4m3(p) / p.sum(-1, keepdim=True), v)
    err_scaled = (scaled.double() - ref).abs().max()
    err_unscaled = (unscaled.double() - ref).abs().max()
    assert 0 < 5 * err_scaled < err_unscaled, (err_scaled, err_unscaled)


def _online_fp8(q, k, v, causal, block=128):
    """The sm90 FP8 kernel's order of the computation, in fp32 (one head): key blocks of
    `block` from the last down, the running max, P~ = 2^8 exp(s - m) rounded to e4m3 for P V,
    the row sum from the unrounded P~, O rescaled by alpha as the max grows."""
    sq, sk = q.shape[0], k.shape[0]
    s = (q @ k.T) / q.shape[1] ** 0.5
    if causal:  # bottom-right
        s = s.masked_fill(torch.arange(sk)[None] > torch.arange(sq)[:, None] + (sk - sq),
                          float("-inf"))
    ninf = float("-inf")
    m = torch.full((sq, 1), ninf)
    lsum, o = torch.zeros(sq, 1), torch.zeros(sq, v.shape[1])
    for b in reversed(range(-(-sk // block))):
        blk = s[:, b * block:(b + 1) * block]
        mn = torch.maximum(m, blk.amax(1, keepdim=True))
        base = torch.where(mn == ninf, torch.zeros_like(mn), mn)
        alpha = torch.where(m == ninf, torch.zeros_like(m), torch.exp(m - base))
        p = torch.exp(blk - base) * FP8_P_SCALE
        lsum = lsum * alpha + p.sum(1, keepdim=True)
        o = o * alpha + round_e4m3(p) @ v[b * block:(b + 1) * block]
        m = mn
    return o / lsum


@pytest.mark.parametrize("sq,sk,d,causal", [(133, 520, 128, False), (300, 1100, 64, True),
                                            (64, 2000, 256, False)])
def test_online_order_within_rule(sq, sk, d, causal):
    """The kernel's order (running max per 128-key block, from the last block down) keeps the
    error within the rule's 2x of the emulation (which takes the row's final max): the
    reasoning in reference.py's docstring, checked (1.0-1.13x measured when written)."""
    torch.manual_seed(sq + sk)
    q, k, v = (torch.randn(1, n, 1, d).to(FP8) for n in (sq, sk, sk))
    ref, emul, _ = ref_and_emul_fp8(q, k, v, causal=causal, out_dtype=torch.bfloat16)
    ours = _online_fp8(q[0, :, 0].float(), k[0, :, 0].float(), v[0, :, 0].float(), causal)
    assert_close("online order vs emulation", ours.to(torch.bfloat16)[None, :, None],
                 ref["out"], emul["out"], torch.bfloat16, 2.0)


def test_dequantize_reference():
    """dequantize_fp8 indexes the descale by (sequence, kv head of the row's head)."""
    B, H, Hk = 2, 4, 2
    x = torch.ones(B, 3, H, 1).to(FP8)
    ds = torch.tensor([[2.0, 3.0], [5.0, 7.0]])
    got = dequantize_fp8(x, ds, H)[:, 0, :, 0]
    assert torch.equal(got, torch.tensor([[2.0, 2, 3, 3], [5, 5, 7, 7]], dtype=torch.float64))
    cu = torch.tensor([0, 1, 3], dtype=torch.int32)
    got = dequantize_fp8(torch.ones(4, H, 1).to(FP8), ds, H, cu)[:, :, 0]
    assert got[0].tolist() == [2, 2, 3, 3] and got[2].tolist() == [5, 5, 7, 7]
    assert got[3].tolist() == [1, 1, 1, 1]  # a row of no sequence


# ---- argument errors: the same on every backend (raised before any backend is chosen) ----

def _qkv8(device, B=2, S=9, H=4, Hk=2, d=32):
    return quantize([B, S, H, d], device), quantize([B, S, Hk, d], device), \
        quantize([B, S, Hk, d], device)


@pytest.mark.parametrize("device", DEVICES)
def test_descale_errors(device):
    if flashattn.BUILD_CONFIG.get("FLASHATTN_DISABLE_FP8"):
        pytest.skip("this build has no FP8 kernels (FLASHATTN_DISABLE_FP8)")
    q, k, v = _qkv8(device)
    f = flashattn.flash_attn_func
    for bad, msg in ((torch.ones(3, 2, device=device), r"q_descale must have shape \(batch, "
                      r"nheads_k\) = \(2, 2\).*got \(3, 2\)"),
                     (torch.ones(4, device=device), r"q_descale must have shape .* got \(4\)"),
                     (torch.ones(1, 2, 2, device=device), r"q_descale must have shape"),
                     (torch.ones(2, 2, device=device, dtype=torch.float16),
                      "q_descale must have dtype float32, got float16"),
                     (torch.ones(2, 2, device=device, dtype=torch.float64),
                      "q_descale must have dtype float32, got float64")):
        with pytest.raises(RuntimeError, match=msg):
            f(q, k, v, q_descale=bad)
    with pytest.raises(RuntimeError, match="v_descale must have shape"):
        f(q, k, v, v_descale=torch.ones(2, 4, device=device))  # nheads, not nheads_k
    with pytest.raises(TypeError, match="k_descale must be None or a float32 tensor"):
        f(q, k, v, k_descale=0.5)
    other = "cpu" if device != "cpu" else None
    if other:
        with pytest.raises(RuntimeError, match="k_descale must be on the same device as q"):
            f(q, k, v, k_descale=torch.ones(2, 2, device=other))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32, device=device)
    with pytest.raises(RuntimeError, match=r"q_descale must have shape \(batch, nheads_k\) = "
                       r"\(2, 2\)"):
        flashattn.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 5, 5,
                                         q_descale=torch.ones(3, 2, device=device))
    # The op itself takes only the exact (batch, nheads_k) shape, last dimension contiguous.
    opts = (32 ** -0.5, False, -1, -1, 0.0, None)
    with pytest.raises(RuntimeError, match="q_descale must have shape"):
        torch.ops.flashattn.fwd(q, k, v, *opts, q_descale=torch.ones(2, device=device))
    with pytest.raises(RuntimeError, match="q_descale must have a contiguous last dimension"):
        torch.ops.flashattn.fwd(q, k, v, *opts,
                                q_descale=torch.ones(2, 1, device=device).expand(2, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_dtype_errors(device):
    """float8 q with 16-bit k / v; descales or another out_dtype with 16-bit inputs (refused,
    not ignored as FA3 does); out_dtype outside bf16 / fp16."""
    if flashattn.BUILD_CONFIG.get("FLASHATTN_DISABLE_FP8"):
        pytest.skip("this build has no FP8 kernels (FLASHATTN_DISABLE_FP8)")
    q, k, v = _qkv8(device)
    f = flashattn.flash_attn_func
    with pytest.raises(RuntimeError, match=r"k must have the same dtype as q \(float8_e4m3fn\), "
                       "got bfloat16"):
        f(q, k.bfloat16(), v)
    with pytest.raises(RuntimeError, match=r"v must have the same dtype as q \(float8_e4m3fn\)"):
        f(q, k, v.to(torch.float8_e5m2))
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    for name in ("q_descale", "k_descale", "v_descale"):
        with pytest.raises(RuntimeError, match=f"{name} is for float8_e4m3fn inputs only, but q "
                           "has dtype bfloat16"):
            f(qb, kb, vb, **{name: torch.ones(2, 2, device=device)})
    with pytest.raises(RuntimeError, match=r"out_dtype is for float8_e4m3fn inputs only.*"
                       r"got out_dtype=float16"):
        f(qb, kb, vb, out_dtype=torch.float16)
    assert torch.equal(f(qb, kb, vb, out_dtype=torch.bfloat16), f(qb, kb, vb))
    for bad in (torch.float32, torch.float8_e4m3fn):
        with pytest.raises(RuntimeError, match="out_dtype of an FP8 .* must be bfloat16 .* or "
                           f"float16, got {str(bad).removeprefix('torch.')}"):
            f(q, k, v, out_dtype=bad)


@pytest.mark.parametrize("device", DEVICES)
def test_refused_options(device):
    """ALiBi, dropout, sinks, block masks, paged KV, the KV cache: a named error on every
    backend alike (the message lists what FP8 takes)."""
    if flashattn.BUILD_CONFIG.get("FLASHATTN_DISABLE_FP8"):
        pytest.skip("this build has no FP8 kernels (FLASHATTN_DISABLE_FP8)")
    q, k, v = _qkv8(device)
    f = flashattn.flash_attn_func
    msg = r"FP8 \(float8_e4m3fn\) attention does not take {} \(issue 14: it takes causal"
    cases = [
        ("alibi_slopes", lambda: f(q, k, v, alibi_slopes=torch.ones(4, device=device))),
        ("dropout_p > 0", lambda: f(q, k, v, dropout_p=0.1)),
        ("learnable_sink", lambda: f(q, k, v, learnable_sink=torch.zeros(4, device=device))),
        (r"a block mask \(block-sparse attention\)", lambda: flashattn.block_sparse_attn_func(
            q, k, v, torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device))),
    ]
    pages = quantize([2, 16, 2, 32], device)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32, device=device)
    bt = torch.tensor([[0], [1]], dtype=torch.int32, device=device)
    cases.append((r"block_table \(paged KV\)", lambda: flashattn.flash_attn_varlen_func(
        q[0], pages, pages, cu, cu, 5, 5, block_table=bt)))
    for what, call in cases:
        with pytest.raises(RuntimeError, match=msg.format(what)):
            call()
    with pytest.raises(RuntimeError, match="flash_attn_with_kvcache does not take float8_e4m3fn"):
        flashattn.flash_attn_with_kvcache(q, k, v)
    with pytest.raises(NotImplementedError, match="FP8 .* not supported by ring attention"):
        flashattn.distributed.ring_flash_attn_func(q, k, v)
    with pytest.raises(RuntimeError, match="attn_probs .* does not take float8_e4m3fn"):
        torch.ops.flashattn.attn_probs(q, k, v, torch.zeros(2, 4, 9, device=device), None, None,
                                       9, 9, 0.2, False, -1, -1, 0.0, None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.filterwarnings("ignore:Error detected in GeneratedBackward")
def test_forward_only(device):
    """Backpropagating through FP8 inputs (or only through a descale) raises the forward-only
    error from the autograd glue; the backward ops and kernel_path refuse FP8 too."""
    if flashattn.BUILD_CONFIG.get("FLASHATTN_DISABLE_FP8"):
        pytest.skip("this build has no FP8 kernels (FLASHATTN_DISABLE_FP8)")
    msg = r"FP8 attention is forward only \(issue 14\)"
    q, k, v = _qkv8(device)
    with pytest.raises(RuntimeError, match=msg):
        flashattn.kernel_path(q, k, v, direction="bwd")
    opts = (32 ** -0.5, False, -1, -1, 0.0, None, False)
    dout = torch.zeros(2, 9, 4, 32, device=device, dtype=torch.bfloat16)
    lse = torch.zeros(2, 4, 9, device=device)
    with pytest.raises(RuntimeError, match=msg):
        torch.ops.flashattn.bwd(dout, q, k, v, dout, lse, *opts)
    fp8_skip(device)
    qg = q.clone().requires_grad_()
    out = flashattn.flash_attn_func(qg, k, v, causal=True)
    with pytest.raises(NotImplementedError, match=msg):
        out.float().sum().backward()
    ds = (torch.rand(2, 2, device=device) + 0.5).requires_grad_()
    out = flashattn.flash_attn_func(q, k, v, v_descale=ds)
    with pytest.raises(NotImplementedError, match=msg):
        torch.autograd.grad(out.float().sum(), ds)
    with torch.no_grad():  # the forward alone is fine with grad-requiring inputs
        assert not flashattn.flash_attn_func(qg, k, v, v_descale=ds).requires_grad
    # Compiled, the backward is traced with the forward: the same error, at compile time
    # (torch may wrap it in its BackendCompilerFailed).
    import torch._dynamo as dynamo
    dynamo.reset()
    cf = torch.compile(lambda q: flashattn.flash_attn_func(q, k, v), backend="aot_eager",
                       fullgraph=True)
    with pytest.raises((NotImplementedError, dynamo.exc.BackendCompilerFailed), match=msg):
        cf(qg)


@pytest.mark.parametrize("device", DEVICES)
def test_kernel_path(device):
    """CPU runs FP8; an sm90 GPU its sm90 kernel; other GPUs name the need for an sm90 GPU."""
    if flashattn.BUILD_CONFIG.get("FLASHATTN_DISABLE_FP8"):
        pytest.skip("this build has no FP8 kernels (FLASHATTN_DISABLE_FP8)")
    q, k, v = _qkv8(device)
    if device == "cpu":
        assert flashattn.kernel_path(q, k, v) == "cpu"
        return
    if torch.cuda.get_device_capability(device) != (9, 0):
        with pytest.raises(RuntimeError, match=SM90_MARK):
            flashattn.kernel_path(q, k, v)
        return
    assert flashattn.kernel_path(q, k, v).startswith("sm90")


# ---- opcheck and torch.compile ----

def _op_args(device, varlen):
    H, Hk, d = 4, 2, 24
    opts = (d ** -0.5, True, -1, 0, 1.5, None)
    if not varlen:
        q, k, v = quantize([2, 37, H, d], device), quantize([2, 45, Hk, d], device), \
            quantize([2, 45, Hk, d], device)
        meta, B = (), 2
    else:
        lq, lk = [5, 0, 33], [9, 3, 40]
        q, k, v = quantize([sum(lq), H, d], device), quantize([sum(lk), Hk, d], device), \
            quantize([sum(lk), Hk, d], device)
        meta, B = (_cu(lq, device), _cu(lk, device), max(lq), max(lk)), 3
    fp8 = dict(q_descale=torch.rand(B, Hk, device=device) + 0.5,
               k_descale=torch.rand(B, Hk, device=device) + 0.5,
               v_descale=torch.rand(B, Hk, device=device) + 0.5, out_dtype=torch.float16)
    return (q, k, v, *meta, *opts), fp8


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("varlen", [False, True], ids=["padded", "varlen"])
def test_opcheck(device, varlen):
    fp8_skip(device)
    args, fp8 = _op_args(device, varlen)
    op = torch.ops.flashattn.varlen_fwd if varlen else torch.ops.flashattn.fwd
    # Not test_schema: it multiplies the inputs, which torch does not implement for float8.
    torch.library.opcheck(op.default, args, fp8, test_utils=(
        "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    out, lse = op(*args, **fp8)
    assert out.dtype == torch.float16
    out, lse = op(*args, **dict(fp8, out_dtype=None))
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile(device, backend):
    """flash_attn_func / flash_attn_varlen_func on FP8 inputs under torch.compile(fullgraph=True,
    dynamic=True): no graph break, no recompilation for a second shape, eager's numbers."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounterWithBackend

    fp8_skip(device)
    torch._dynamo.reset()
    H, Hk, d = 4, 2, 32

    def f(q, k, v, qd, kd, cu, m):
        o = flashattn.flash_attn_func(q, k, v, causal=True, softcap=3.0, q_descale=qd,
                                      k_descale=kd, v_descale=kd[0, 0])
        ov = flashattn.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, m, m, q_descale=qd[:1],
                                              out_dtype=torch.float16, window_size=(5, 2))
        return o, ov

    counter = CompileCounterWithBackend(backend)
    cf = torch.compile(f, backend=counter, fullgraph=True, dynamic=True)
    frames = []
    for S, lens in ((37, [20, 17]), (50, [31, 19])):
        q, k, v = quantize([2, S, H, d], device), quantize([2, S, Hk, d], device), \
            quantize([2, S, Hk, d], device)
        qd, kd = torch.rand(2, Hk, device=device) + 0.5, torch.rand(2, Hk, device=device) + 0.5
        cu = _cu(lens, device)
        args = (q, k, v, qd, kd, cu, max(lens))
        got, want = cf(*args), f(*args)
        assert got[0].dtype == torch.bfloat16 and got[1].dtype == torch.float16
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        frames.append(counter.frame_count)
    assert frames[0] >= 1 and frames[1] == frames[0], f"recompiled for a new shape: {frames}"


@needs_host_cxx
def test_sm90_fp8_stage_layout(tmp_path):
    """The sm90 FP8 forward's V^T column order against the e4m3 P registers' layout, and the
    varlen regions of V^T (csrc/sm90/fp8_layout_sm90.h; tools/check_fp8_stage.cpp)."""
    run_host_check(tmp_path, "check_fp8_stage.cpp", 400)


@needs_host_cxx
def test_sm90_fp8_vchip_transpose(tmp_path):
    """The on-chip V^T of the sm90 FP8 forward (FLASHATTN_SM90_FP8_VCHIP=1;
    transpose_v_fp8_sm90.cuh), played on the host as the PTX ISA defines ldmatrix.x4.trans,
    the byte permutes and stmatrix.x4, for every kVChip tile and random partial key blocks:
    each V^T byte is the right key's at the right row (zeros past the sequence), written once,
    without bank conflicts (tools/check_fp8_vchip.cpp)."""
    run_host_check(tmp_path, "check_fp8_vchip.cpp", 20)

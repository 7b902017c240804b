"""The public API surface: the packed variants, return_attn_probs, the deterministic flag,
non-contiguous and expanded gradients, flash-attn 2.8 signature compatibility, and (CUDA)
memory linear in the sequence length."""
import inspect

import pytest
import torch

import flashattn
from helpers import DEVICES, PUBLIC, assert_close, check_results, rand, skip_if_no_kernel
from reference import ref_and_lowp, ref_and_lowp_varlen

_OPTS = ["dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
         "deterministic", "return_attn_probs"]
# flash-attn 2.8: argument names, order, defaults.
SIGNATURES = {
    "flash_attn_func": ["q", "k", "v"] + _OPTS,
    "flash_attn_kvpacked_func": ["q", "kv"] + _OPTS,
    "flash_attn_qkvpacked_func": ["qkv"] + _OPTS,
    "flash_attn_varlen_func": ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                               "max_seqlen_k"] + _OPTS + ["block_table"],
    "flash_attn_varlen_kvpacked_func": ["q", "kv", "cu_seqlens_q", "cu_seqlens_k",
                                        "max_seqlen_q", "max_seqlen_k"] + _OPTS,
    "flash_attn_varlen_qkvpacked_func": ["qkv", "cu_seqlens", "max_seqlen"] + _OPTS,
}
# Keyword-only, ours: FA4's learnable_sink, then FA3's FP8 descales and our out_dtype (issue 14).
KW_ONLY = ["learnable_sink", "q_descale", "k_descale", "v_descale", "out_dtype"]
DEFAULTS = dict(dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                block_table=None, **{name: None for name in KW_ONLY})


@pytest.mark.parametrize("name", PUBLIC)
def test_signature(name):
    """flash-attn 2.8's positional surface, then FA4's learnable_sink and the FP8 keywords,
    keyword-only (ours)."""
    sig = inspect.signature(getattr(flashattn, name))
    assert list(sig.parameters) == SIGNATURES[name] + KW_ONLY
    for kw in KW_ONLY:
        assert sig.parameters[kw].kind is inspect.Parameter.KEYWORD_ONLY, kw
    for p in sig.parameters.values():
        if p.name in DEFAULTS:
            assert p.default == DEFAULTS[p.name], p.name
        else:
            assert p.default is inspect.Parameter.empty, p.name


def _cu(lens, device):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,
                        device=device)


def _grad(out, inputs, dout):
    return torch.autograd.grad(out, inputs, dout)


@pytest.mark.parametrize("device", DEVICES)
def test_kvpacked(device):
    dtype = torch.bfloat16
    skip_if_no_kernel(device, dtype, 64)
    B, sq, sk, H, Hk, d = 2, 113, 203, 6, 2, 64
    q = rand([B, sq, H, d], dtype, device).requires_grad_()
    kv = rand([B, sk, 2, Hk, d], dtype, device).requires_grad_()
    dout = rand([B, sq, H, d], dtype, device)
    slopes = torch.rand(B, H, device=device) * 0.2
    kw = dict(causal=True, window_size=(50, -1), softcap=2.0, alibi_slopes=slopes)
    out, lse, _ = flashattn.flash_attn_kvpacked_func(q, kv, return_attn_probs=True, **kw)
    dq, dkv = _grad(out, (q, kv), dout)
    k, v = kv.detach().unbind(2)
    ref, low = ref_and_lowp(q.detach(), k, v, dout, **kw)
    ours = dict(out=out, lse=lse, dq=dq, dk=dkv[:, :, 0], dv=dkv[:, :, 1])
    check_results(ours, ref, low, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_qkvpacked(device):
    dtype = torch.float16
    skip_if_no_kernel(device, dtype, 80)
    B, S, H, d = 2, 128, 4, 80
    qkv = rand([B, S, 3, H, d], dtype, device).requires_grad_()
    dout = rand([B, S, H, d], dtype, device)
    kw = dict(causal=True, alibi_slopes=torch.rand(H, device=device) * 0.2)
    out, lse, _ = flashattn.flash_attn_qkvpacked_func(qkv, return_attn_probs=True, **kw)
    (dqkv,) = _grad(out, (qkv,), dout)
    q, k, v = qkv.detach().unbind(2)
    ref, low = ref_and_lowp(q, k, v, dout, **kw)
    ours = dict(out=out, lse=lse, dq=dqkv[:, :, 0], dk=dqkv[:, :, 1], dv=dqkv[:, :, 2])
    check_results(ours, ref, low, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_kvpacked(device):
    dtype = torch.float16
    skip_if_no_kernel(device, dtype, 128)
    lens_q, lens_k = [113, 0, 1, 40], [203, 9, 239, 0]
    H, Hk, d = 4, 1, 128
    q = rand([sum(lens_q), H, d], dtype, device).requires_grad_()
    kv = rand([sum(lens_k), 2, Hk, d], dtype, device).requires_grad_()
    dout = rand([sum(lens_q), H, d], dtype, device)
    cu_q, cu_k = _cu(lens_q, device), _cu(lens_k, device)
    kw = dict(window_size=(-1, 7), softcap=2.0)
    out, lse, _ = flashattn.flash_attn_varlen_kvpacked_func(
        q, kv, cu_q, cu_k, max(lens_q), max(lens_k), return_attn_probs=True, **kw)
    dq, dkv = _grad(out, (q, kv), dout)
    k, v = kv.detach().unbind(1)
    ref, low = ref_and_lowp_varlen(q.detach(), k, v, cu_q.cpu(), cu_k.cpu(), dout, **kw)
    ours = dict(out=out, lse=lse, dq=dq, dk=dkv[:, 0], dv=dkv[:, 1])
    check_results(ours, ref, low, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_qkvpacked(device):
    dtype = torch.bfloat16
    skip_if_no_kernel(device, dtype, 59)
    lens = [128, 0, 1, 113]
    H, d = 3, 59
    qkv = rand([sum(lens), 3, H, d], dtype, device).requires_grad_()
    dout = rand([sum(lens), H, d], dtype, device)
    cu = _cu(lens, device)
    slopes = torch.rand(len(lens), H, device=device) * 0.2
    kw = dict(causal=True, window_size=(31, -1), alibi_slopes=slopes)
    out, lse, _ = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens),
                                                             return_attn_probs=True, **kw)
    (dqkv,) = _grad(out, (qkv,), dout)
    q, k, v = qkv.detach().unbind(1)
    ref, low = ref_and_lowp_varlen(q, k, v, cu.cpu(), cu.cpu(), dout, **kw)
    ours = dict(out=out, lse=lse, dq=dqkv[:, 0], dk=dqkv[:, 1], dv=dqkv[:, 2])
    check_results(ours, ref, low, dtype)


def _call(name, device, dtype):
    """Fresh inputs for public function `name` on a small GQA-free case (packed APIs need
    H == Hk): returns (call, (q, k, v)), where call(**kw) runs the function on them."""
    B, S, H, d = 2, 33, 2, 32
    f = getattr(flashattn, name)
    lens = [20, 13]
    cu = _cu(lens, device)
    if name == "flash_attn_func":
        q, k, v = (rand([B, S, H, d], dtype, device) for _ in range(3))
        return (lambda **kw: f(q, k, v, **kw)), (q, k, v)
    if name == "flash_attn_kvpacked_func":
        q, kv = rand([B, S, H, d], dtype, device), rand([B, S, 2, H, d], dtype, device)
        return (lambda **kw: f(q, kv, **kw)), (q,) + tuple(kv.unbind(2))
    if name == "flash_attn_qkvpacked_func":
        qkv = rand([B, S, 3, H, d], dtype, device)
        return (lambda **kw: f(qkv, **kw)), tuple(qkv.unbind(2))
    if name == "flash_attn_varlen_func":
        q, k, v = (rand([S, H, d], dtype, device) for _ in range(3))
        return (lambda **kw: f(q, k, v, cu, cu, 20, 20, **kw)), (q, k, v)
    if name == "flash_attn_varlen_kvpacked_func":
        q, kv = rand([S, H, d], dtype, device), rand([S, 2, H, d], dtype, device)
        return (lambda **kw: f(q, kv, cu, cu, 20, 20, **kw)), (q,) + tuple(kv.unbind(1))
    qkv = rand([S, 3, H, d], dtype, device)
    return (lambda **kw: f(qkv, cu, 20, **kw)), tuple(qkv.unbind(1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", PUBLIC)
def test_return_attn_probs(device, name):
    """False: a tensor. True: (out, softmax_lse, S_dmask); S_dmask is None without dropout
    (flash-attn 2.x); out is the same either way; softmax_lse matches the reference."""
    dtype = torch.float16
    skip_if_no_kernel(device, dtype, 32, backward=False)
    call, (q, k, v) = _call(name, device, dtype)
    plain = call(causal=True)
    assert isinstance(plain, torch.Tensor)
    res = call(causal=True, return_attn_probs=True)
    assert isinstance(res, tuple) and len(res) == 3
    out, lse, s_dmask = res
    assert s_dmask is None
    assert torch.equal(out, plain)
    assert lse.dtype == torch.float32
    if "varlen" in name:
        ref, low = ref_and_lowp_varlen(q, k, v, _cu([20, 13], "cpu"), _cu([20, 13], "cpu"),
                                       causal=True)
    else:
        ref, low = ref_and_lowp(q, k, v, causal=True)
    assert_close("lse", lse, ref["lse"], low["lse"], dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("varlen", [False, True])
def test_deterministic_bitwise(device, varlen):
    """deterministic=True: two backward passes give the same gradients bit for bit (GQA, so
    dk/dv sum over query heads)."""
    dtype = torch.bfloat16
    skip_if_no_kernel(device, dtype, 64)
    H, Hk, d = 8, 2, 64
    if varlen:
        lens_q, lens_k = [300, 0, 129], [257, 64, 400]
        q = rand([sum(lens_q), H, d], dtype, device)
        k = rand([sum(lens_k), Hk, d], dtype, device)
        v = rand([sum(lens_k), Hk, d], dtype, device)
        cq, ck = _cu(lens_q, device), _cu(lens_k, device)

        def f(q, k, v):
            return flashattn.flash_attn_varlen_func(q, k, v, cq, ck, 300, 400, causal=True,
                                                    deterministic=True)
    else:
        q = rand([2, 300, H, d], dtype, device)
        k = rand([2, 400, Hk, d], dtype, device)
        v = rand([2, 400, Hk, d], dtype, device)

        def f(q, k, v):
            return flashattn.flash_attn_func(q, k, v, deterministic=True, softcap=2.0)
    dout = torch.randn(q.shape, dtype=dtype, device=device)
    grads = []
    for _ in range(2):
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        out = f(qg, kg, vg)
        grads.append((out,) + torch.autograd.grad(out, (qg, kg, vg), dout))
    for name, a, b in zip(("out", "dq", "dk", "dv"), grads[0], grads[1]):
        assert torch.equal(a, b), f"{name} differs between two deterministic runs"


@pytest.mark.parametrize("device", DEVICES)
def test_expanded_and_noncontiguous_grad(device):
    """out.sum().backward() hands the backward an expanded (stride 0) dout; a transposed
    dout has a non-unit last stride. Both must give the reference gradients."""
    dtype = torch.float16
    skip_if_no_kernel(device, dtype, 40)
    q = rand([2, 37, 4, 40], dtype, device).requires_grad_()
    k = rand([2, 51, 4, 40], dtype, device).requires_grad_()
    v = rand([2, 51, 4, 40], dtype, device).requires_grad_()
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    out.float().sum().backward()
    ref, low = ref_and_lowp(q.detach(), k.detach(), v.detach(), torch.ones_like(out),
                            causal=True)
    for name, t in (("dq", q), ("dk", k), ("dv", v)):
        assert_close(name, t.grad, ref[name], low[name], dtype, 3.0)
    dout = torch.randn(2, 37, 40, 4, dtype=dtype, device=device).transpose(-1, -2)
    assert dout.stride(-1) != 1
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    g = torch.autograd.grad(out, (q, k, v), dout)
    ref, low = ref_and_lowp(q.detach(), k.detach(), v.detach(), dout, causal=True)
    for name, t in zip(("dq", "dk", "dv"), g):
        assert_close(name, t, ref[name], low[name], dtype, 3.0)


@pytest.mark.parametrize("device", DEVICES)
def test_no_grad_and_partial_grad(device):
    """Forward under no_grad; gradient for only some inputs (k, v frozen)."""
    dtype = torch.bfloat16
    skip_if_no_kernel(device, dtype, 96)
    q = rand([1, 64, 2, 96], dtype, device)
    k = rand([1, 80, 2, 96], dtype, device)
    v = rand([1, 80, 2, 96], dtype, device)
    with torch.no_grad():
        o1 = flashattn.flash_attn_func(q, k, v)
    qg = q.detach().requires_grad_()
    o2 = flashattn.flash_attn_func(qg, k, v)
    assert torch.equal(o1, o2)
    dout = torch.randn_like(o2)
    (dq,) = torch.autograd.grad(o2, (qg,), dout)
    ref, low = ref_and_lowp(q, k, v, dout)
    assert_close("dq", dq, ref["dq"], low["dq"], dtype, 3.0)


@pytest.mark.parametrize("device", DEVICES)
def test_kernel_path(device):
    dtype = torch.float32 if device == "cpu" else torch.float16
    skip_if_no_kernel(device, dtype, 64, backward=False)
    q = rand([1, 4, 2, 64], dtype, device)
    path = flashattn.kernel_path(q, q, q)
    if device == "cpu":
        assert path == "cpu"
    else:
        assert path.startswith("sm"), path


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kw", [dict(causal=False, deterministic=False),
                                dict(causal=True, deterministic=True)],
                         ids=["cuda-default", "cuda-causal-deterministic"])
def test_memory_linear_in_seqlen(kw):
    """README: fwd + bwd need memory linear in the sequence length (no seqlen x seqlen
    scores). Peak memory above the inputs at N = 8192 over N = 4096 (B=1, H=4, d=64): about
    2 for outputs, gradients and workspaces; a quadratic term would push it towards 4."""
    dtype = torch.bfloat16
    skip_if_no_kernel("cuda", dtype, 64)
    peaks = {}
    for n in (4096, 8192):
        q, k, v = (torch.randn(1, n, 4, 64, device="cuda", dtype=dtype).requires_grad_()
                   for _ in range(3))
        dout = torch.randn(1, n, 4, 64, device="cuda", dtype=dtype)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = flashattn.flash_attn_func(q, k, v, **kw)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        torch.cuda.synchronize()
        peaks[n] = torch.cuda.max_memory_allocated() - base
        del q, k, v, dout, out, grads
    mib = {n: round(p / 2**20, 2) for n, p in peaks.items()}
    assert peaks[4096] > 0, f"nothing allocated? peaks (MiB) {mib}"
    ratio = peaks[8192] / peaks[4096]
    assert ratio < 2.5, f"peak extra memory grows {ratio:.2f}x from N 4096 to 8192: {mib} MiB"

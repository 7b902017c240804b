"""torch.compile(fullgraph=True, dynamic=True) over every public function, forward and
backward: no graph break, one compilation for two shapes, same numbers as eager.

The default backend is aot_eager (Dynamo + fake kernels + AOT autograd: everything that
touches our ops, fast); the same checks then run with inductor (the default backend).
"""
import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend

import flashattn
from helpers import DEVICES, PUBLIC, kernel_skip_reason, rand


def _dtype(device):
    return torch.float32 if device == "cpu" else torch.bfloat16


def _inputs(name, device, S, lens):
    """Leaf tensors and a call closure for public function `name` (GQA where packing allows)."""
    dtype = _dtype(device)
    B, H, Hk, d = 2, 4, 2, 32
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,
                      device=device)
    T, m = sum(lens), max(lens)
    # deterministic: compiled and eager gradients are compared bit for bit.
    kw = dict(causal=True, softcap=2.0, alibi_slopes=torch.rand(H, device=device) * 0.2,
              deterministic=True)
    if name == "flash_attn_func":
        leaves = [rand([B, S, H, d], dtype, device), rand([B, S + 3, Hk, d], dtype, device),
                  rand([B, S + 3, Hk, d], dtype, device)]
        return leaves, lambda f, q, k, v: f(q, k, v, **kw)
    if name == "flash_attn_kvpacked_func":
        leaves = [rand([B, S, H, d], dtype, device), rand([B, S + 3, 2, Hk, d], dtype, device)]
        return leaves, lambda f, q, kv: f(q, kv, **kw)
    if name == "flash_attn_qkvpacked_func":
        leaves = [rand([B, S, 3, H, d], dtype, device)]
        return leaves, lambda f, qkv: f(qkv, **kw)
    if name == "flash_attn_varlen_func":
        leaves = [rand([T, H, d], dtype, device), rand([T, Hk, d], dtype, device),
                  rand([T, Hk, d], dtype, device)]
        return leaves, lambda f, q, k, v: f(q, k, v, cu, cu, m, m, **kw)
    if name == "flash_attn_varlen_kvpacked_func":
        leaves = [rand([T, H, d], dtype, device), rand([T, 2, Hk, d], dtype, device)]
        return leaves, lambda f, q, kv: f(q, kv, cu, cu, m, m, **kw)
    leaves = [rand([T, 3, H, d], dtype, device)]
    return leaves, lambda f, qkv: f(qkv, cu, m, **kw)


def _run(fn, call, leaves):
    leaves = [t.detach().requires_grad_() for t in leaves]
    out = call(fn, *leaves)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    return out, grads, dout


def _check(name, device, backend):
    reason = kernel_skip_reason(device, _dtype(device), 32)
    if reason:
        pytest.skip(reason)
    torch._dynamo.reset()
    f = getattr(flashattn, name)
    counter = CompileCounterWithBackend(backend)
    cf = torch.compile(f, backend=counter, fullgraph=True, dynamic=True)
    frames = []
    for S, lens in ((37, [20, 0, 17]), (50, [31, 7, 12])):
        leaves, call = _inputs(name, device, S, lens)
        out_c, grads_c, dout = _run(cf, call, leaves)
        lv = [t.detach().requires_grad_() for t in leaves]
        out_e = call(f, *lv)
        grads_e = torch.autograd.grad(out_e, lv, dout)
        assert torch.equal(out_c, out_e), "compiled forward differs from eager"
        for gc, ge in zip(grads_c, grads_e):
            assert torch.equal(gc, ge), "compiled backward differs from eager"
        frames.append(counter.frame_count)
    assert frames[0] >= 1 and frames[1] == frames[0], f"recompiled for a new shape: {frames}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", PUBLIC)
def test_compile_fullgraph_dynamic(device, name):
    _check(name, device, "aot_eager")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", PUBLIC)
def test_compile_inductor(device, name):
    _check(name, device, "inductor")

"""torch.library.opcheck on every op (schema, fake kernel, autograd registration, AOT
dispatch with dynamic shapes) on a few small cases."""
import pytest
import torch

import flashattn  # noqa: F401  (registers the ops)
from helpers import DEVICES, kernel_skip_reason, rand

ops = torch.ops.flashattn


def _dtype(device):
    return torch.float32 if device == "cpu" else torch.float16


# (sq, sk, H, Hk, d, dv, causal, window, softcap, alibi)
PADDED = [
    (5, 9, 4, 2, 16, 16, True, (-1, -1), 0.0, None),
    (9, 3, 2, 1, 24, 8, False, (2, 1), 1.5, "bh"),
]


def _skip(device, dtype, d, dv):
    reason = kernel_skip_reason(device, dtype, d, dv)
    if reason:
        pytest.skip(reason)


def _skip_unless_taken(q, k, v, cu_q, cu_k, max_q, max_k, *options):
    """Forced onto a backend (FLASHATTN_FORCE_BACKEND) that does not take the call, opcheck would
    report the op's error as a failed check: skip with the reason instead."""
    try:
        ops.kernel_path("fwd", q, k, v, cu_q, cu_k, max_q, max_k, *options)
    except RuntimeError as e:
        if "FLASHATTN_FORCE_BACKEND" in str(e):
            pytest.skip(str(e).splitlines()[0])
        raise


def _padded_args(device, case, requires_grad):
    sq, sk, H, Hk, d, dv, causal, window, softcap, alibi = case
    dtype = _dtype(device)
    _skip(device, dtype, d, dv)
    B = 2
    q = rand([B, sq, H, d], dtype, device).requires_grad_(requires_grad)
    k = rand([B, sk, Hk, d], dtype, device).requires_grad_(requires_grad)
    v = rand([B, sk, Hk, dv], dtype, device).requires_grad_(requires_grad)
    slopes = None if alibi is None else torch.rand(B, H, device=device)
    wl, wr = window[0], 0 if causal else window[1]
    _skip_unless_taken(q, k, v, None, None, -1, -1, d ** -0.5, causal, wl, wr, softcap, slopes)
    return (q, k, v, d ** -0.5, causal, wl, wr, softcap, slopes)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", PADDED)
def test_opcheck_fwd(device, case):
    args = _padded_args(device, case, requires_grad=True)
    torch.library.opcheck(ops.fwd.default, args, {"deterministic": False})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", PADDED)
def test_opcheck_bwd(device, case):
    q, k, v, *opts = _padded_args(device, case, requires_grad=False)
    out, lse = ops.fwd(q, k, v, *opts)
    dout = torch.randn_like(out)
    torch.library.opcheck(ops.bwd.default, (dout, q, k, v, out, lse, *opts, False))


# (lens_q, lens_k, H, Hk, d, dv, causal, window, softcap, alibi)
VARLEN = [
    ([5, 0, 7], [9, 3, 4], 4, 2, 16, 16, True, (-1, -1), 0.0, None),
    ([3, 6], [6, 0], 2, 1, 24, 8, False, (2, 1), 1.5, "bh"),
]


def _varlen_args(device, case, requires_grad):
    lens_q, lens_k, H, Hk, d, dv, causal, window, softcap, alibi = case
    dtype = _dtype(device)
    _skip(device, dtype, d, dv)
    q = rand([sum(lens_q), H, d], dtype, device).requires_grad_(requires_grad)
    k = rand([sum(lens_k), Hk, d], dtype, device).requires_grad_(requires_grad)
    v = rand([sum(lens_k), Hk, dv], dtype, device).requires_grad_(requires_grad)
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32,
                        device=device)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32,
                        device=device)
    slopes = None if alibi is None else torch.rand(len(lens_q), H, device=device)
    wl, wr = window[0], 0 if causal else window[1]
    _skip_unless_taken(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), d ** -0.5, causal, wl, wr,
                       softcap, slopes)
    return (q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), d ** -0.5, causal, wl, wr, softcap,
            slopes)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", VARLEN)
def test_opcheck_varlen_fwd(device, case):
    args = _varlen_args(device, case, requires_grad=True)
    torch.library.opcheck(ops.varlen_fwd.default, args, {"deterministic": True})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", VARLEN)
def test_opcheck_varlen_bwd(device, case):
    q, k, v, cu_q, cu_k, mq, mk, *opts = _varlen_args(device, case, requires_grad=False)
    out, lse = ops.varlen_fwd(q, k, v, cu_q, cu_k, mq, mk, *opts)
    dout = torch.randn_like(out)
    torch.library.opcheck(ops.varlen_bwd.default,
                          (dout, q, k, v, out, lse, cu_q, cu_k, mq, mk, *opts, False))


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_kernel_fills_defaults_cheaply(device, monkeypatch):
    """The forward ops' Autograd kernel (ops.py) fills the arguments the dispatcher leaves out
    from defaults read once, never through torch._library.utils.fill_defaults (225 us a call on
    the 25-argument schema); gradients agree whether trailing defaults are passed or not."""
    import torch._library.utils as library_utils

    def refuse(*args, **kwargs):
        raise AssertionError("fill_defaults called on a forward")
    monkeypatch.setattr(library_utils, "fill_defaults", refuse)
    args = _padded_args(device, PADDED[0], requires_grad=True)
    q, k, v = args[:3]
    grads = []
    for extra in ((), (False, 0.0, None, None)):  # deterministic, dropout_p, rng, sink
        out, lse = ops.fwd(*args, *extra)
        assert out.requires_grad and not lse.requires_grad
        grads.append(torch.autograd.grad(out.float().square().sum(), (q, k, v)))
    for a, b in zip(*grads):
        assert a is not None and torch.equal(a, b)
    with torch.no_grad():
        out, _ = ops.fwd(*args)
    assert not out.requires_grad


@pytest.mark.parametrize("device", DEVICES)
def test_call_forward_skips_autograd_only_without_grad(device, monkeypatch):
    """flashattn.ops.call_forward (the public functions' forward call) goes straight below
    autograd only when no gradient can flow: the result is the Autograd kernel's (the same
    numbers; requires_grad where an input requires it, alibi_slopes included)."""
    from flashattn.ops import call_forward
    args = _padded_args(device, PADDED[0], requires_grad=False)
    q, k, v = args[:3]
    taken = []
    real = torch._C._AutoDispatchBelowAutograd

    def spy():
        taken.append(True)
        return real()
    monkeypatch.setattr("flashattn.ops._below_autograd", spy)
    out, lse = call_forward(ops.fwd, *args)
    assert taken and not out.requires_grad
    ref, _ = ops.fwd(*args)
    assert torch.equal(out, ref)
    taken.clear()
    qg = q.detach().clone().requires_grad_()
    out, _ = call_forward(ops.fwd, qg, *args[1:])
    assert not taken and out.requires_grad and torch.equal(out.detach(), ref)
    assert torch.autograd.grad(out.float().sum(), qg)[0].isfinite().all()
    slopes = torch.rand(q.shape[2], device=device, requires_grad=True)
    out, _ = call_forward(ops.fwd, *args[:8], slopes)
    assert not taken and out.requires_grad
    with torch.no_grad():
        out, _ = call_forward(ops.fwd, qg, *args[1:])
    assert taken and not out.requires_grad

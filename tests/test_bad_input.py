"""Bad input raises (RuntimeError / ValueError / TypeError, or NotImplementedError for the
unsupported features) with a message that names the offending argument."""
import re

import pytest
import torch

import flashattn
from helpers import DEVICES, kernel_skip_reason

ERR = (RuntimeError, ValueError, TypeError)
ops = torch.ops.flashattn


def _dt(device):
    return torch.float16


def _skip(device):
    r = kernel_skip_reason(device, torch.float16, 64, backward=False)
    if r:
        pytest.skip(r)


def _qkv(device, B=2, sq=7, sk=9, H=4, Hk=2, d=64, dv=None, dtype=torch.float16):
    dv = d if dv is None else dv
    return (torch.randn(B, sq, H, d, device=device).to(dtype),
            torch.randn(B, sk, Hk, d, device=device).to(dtype),
            torch.randn(B, sk, Hk, dv, device=device).to(dtype))


def _varlen(device, lens=(3, 4), H=4, Hk=2, d=64):
    T = sum(lens)
    q = torch.randn(T, H, d, device=device, dtype=torch.float16)
    k = torch.randn(T, Hk, d, device=device, dtype=torch.float16)
    v = torch.randn(T, Hk, d, device=device, dtype=torch.float16)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,
                      device=device)
    return q, k, v, cu, max(lens)


# ---- dtypes ----

# Unsupported dtypes of q (k and v the same): the message names the argument and the dtype as
# torch prints it, without "torch." (float8_e5m2, float64, ...). float8_e4m3fn is the FP8
# forward's (issue 14, tests/test_fp8.py).
UNSUPPORTED_DTYPES = [torch.float64, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.int32]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", UNSUPPORTED_DTYPES, ids=lambda t: str(t).split(".")[-1])
def test_q_dtype(device, dtype):
    _skip(device)
    q, k, v = (t.to(dtype) for t in _qkv(device))
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(RuntimeError, match=r"\bq\b.*dtype") as info:
        flashattn.flash_attn_func(q, k, v, softmax_scale=0.1)
    assert re.search(rf"\bq\b.*\b{name}\b", str(info.value)), (
        f"the message does not name the dtype {name!r}: {info.value}")


@pytest.mark.parametrize("device", DEVICES)
def test_fp32_on_cuda_or_mixed_dtype(device):
    _skip(device)
    q, k, v = _qkv(device)
    with pytest.raises(ERR, match=r"\bk\b.*dtype"):
        flashattn.flash_attn_func(q, k.bfloat16(), v)
    with pytest.raises(ERR, match=r"\bv\b.*dtype"):
        flashattn.flash_attn_func(q, k, v.float())
    if device == "cuda":
        with pytest.raises(ERR, match=r"\bq\b.*(dtype|float32)"):
            flashattn.flash_attn_func(q.float(), k.float(), v.float())


# ---- shapes ----

@pytest.mark.parametrize("device", DEVICES)
def test_mismatched_batch(device):
    _skip(device)
    q, k, v = _qkv(device)
    with pytest.raises(ERR, match=r"\bk\b.*batch"):
        flashattn.flash_attn_func(q, k[:1], v[:1])
    with pytest.raises(ERR, match=r"\bv\b.*batch"):
        flashattn.flash_attn_func(q, k, v[:1])


@pytest.mark.parametrize("device", DEVICES)
def test_mismatched_seqlen_k_v(device):
    _skip(device)
    q, k, v = _qkv(device)
    with pytest.raises(ERR, match=r"\bv\b.*seqlen"):
        flashattn.flash_attn_func(q, k, v[:, :5])


@pytest.mark.parametrize("device", DEVICES)
def test_mismatched_heads(device):
    _skip(device)
    q, k, v = _qkv(device)
    with pytest.raises(ERR, match=r"\bv\b.*nheads"):
        flashattn.flash_attn_func(q, k, v[:, :, :1])


@pytest.mark.parametrize("device", DEVICES)
def test_nheads_not_divisible(device):
    _skip(device)
    q, k, v = _qkv(device, H=6, Hk=4)
    with pytest.raises(ERR, match=r"(?s)nheads.*\bq\b.*\bk\b"):
        flashattn.flash_attn_func(q, k, v)


@pytest.mark.parametrize("device", DEVICES)
def test_mismatched_headdim(device):
    _skip(device)
    q, k, v = _qkv(device)
    with pytest.raises(ERR, match=r"\bk\b.*headdim"):
        flashattn.flash_attn_func(q, k[..., :32], v)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which,d", [("q", 0), ("q", 257), ("q", 512), ("v", 0), ("v", 300)])
def test_headdim_out_of_range(device, which, d):
    _skip(device)
    if which == "q":
        q, k, v = _qkv(device, d=d, dv=64)
    else:
        q, k, v = _qkv(device, d=64, dv=d)
    with pytest.raises(ERR, match=rf"\b{which}\b.*headdim|headdim.*\b{which}\b"):
        flashattn.flash_attn_func(q, k, v)


@pytest.mark.parametrize("device", DEVICES)
def test_headdim_zero_explicit_scale(device):
    """d = 0 with an explicit softmax_scale reaches the C++ check."""
    _skip(device)
    q, k, v = _qkv(device, d=0)
    with pytest.raises(ERR, match=r"\bq\b.*headdim"):
        flashattn.flash_attn_func(q, k, v, softmax_scale=1.0)


@pytest.mark.parametrize("device", DEVICES)
def test_wrong_ndim(device):
    _skip(device)
    q, k, v = _qkv(device)
    with pytest.raises(ERR, match=r"\bq\b.*dim"):
        flashattn.flash_attn_func(q[0], k, v)
    qv, kv_, vv, cu, m = _varlen(device)
    with pytest.raises(ERR, match=r"\bk\b.*dim"):
        flashattn.flash_attn_varlen_func(qv, kv_[None], vv, cu, cu, m, m)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_noncontiguous_last_dim(device, which):
    _skip(device)
    t = dict(zip("qkv", _qkv(device)))
    t[which] = t[which].transpose(-1, -2).contiguous().transpose(-1, -2)
    assert t[which].stride(-1) != 1
    with pytest.raises(ERR, match=rf"\b{which}\b.*contiguous"):
        flashattn.flash_attn_func(t["q"], t["k"], t["v"])


# ---- devices ----

# One argument on the CPU, the rest on the GPU. The ids say "cuda" (cuda-k, ...) so that the
# GPU job's `-k cuda` selects them.
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("which", ["k", "v", "alibi_slopes", "cu_seqlens_q", "cu_seqlens_k"],
                         ids=lambda w: f"cuda-{w}")
def test_different_devices(which):
    _skip("cuda")
    if which in ("k", "v"):
        t = dict(zip("qkv", _qkv("cuda")))
        t[which] = t[which].cpu()
        with pytest.raises(ERR, match=rf"\b{which}\b.*device"):
            flashattn.flash_attn_func(t["q"], t["k"], t["v"])
    elif which == "alibi_slopes":
        q, k, v = _qkv("cuda")
        with pytest.raises(ERR, match=r"alibi_slopes.*device"):
            flashattn.flash_attn_func(q, k, v, alibi_slopes=torch.rand(4))
    else:
        q, k, v, cu, m = _varlen("cuda")
        cq = cu.cpu() if which == "cu_seqlens_q" else cu
        ck = cu.cpu() if which == "cu_seqlens_k" else cu
        with pytest.raises(ERR, match=rf"{which}.*device"):
            flashattn.flash_attn_varlen_func(q, k, v, cq, ck, m, m)


# ---- varlen metadata ----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["cu_seqlens_q", "cu_seqlens_k"])
def test_cu_seqlens_dtype(device, which):
    _skip(device)
    q, k, v, cu, m = _varlen(device)
    cq = cu.long() if which == "cu_seqlens_q" else cu
    ck = cu.long() if which == "cu_seqlens_k" else cu
    with pytest.raises(ERR, match=rf"{which}.*(dtype|int32)"):
        flashattn.flash_attn_varlen_func(q, k, v, cq, ck, m, m)


@pytest.mark.parametrize("device", DEVICES)
def test_cu_seqlens_length(device):
    _skip(device)
    q, k, v, cu, m = _varlen(device)
    with pytest.raises(ERR, match=r"cu_seqlens_k"):
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu[:-1], m, m)
    with pytest.raises(ERR, match=r"cu_seqlens_q"):
        flashattn.flash_attn_varlen_func(q, k, v, cu[:0], cu[:0], m, m)
    with pytest.raises(ERR, match=r"cu_seqlens_q"):
        flashattn.flash_attn_varlen_func(q, k, v, cu.view(1, -1), cu, m, m)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["cu_seqlens_q", "cu_seqlens_k"])
def test_cu_seqlens_noncontiguous(device, which):
    """Valid values [0, 3, 7] read through a stride-2 view."""
    _skip(device)
    q, k, v, cu, m = _varlen(device)
    strided = torch.stack([cu, torch.full_like(cu, 99)], 1).flatten()[::2]
    assert torch.equal(strided, cu) and not strided.is_contiguous()
    cq = strided if which == "cu_seqlens_q" else cu
    ck = strided if which == "cu_seqlens_k" else cu
    with pytest.raises(RuntimeError, match=rf"{which}.*contiguous"):
        flashattn.flash_attn_varlen_func(q, k, v, cq, ck, m, m)


@pytest.mark.parametrize("device", DEVICES)
def test_max_seqlen_negative(device):
    _skip(device)
    q, k, v, cu, m = _varlen(device)
    with pytest.raises(ERR, match=r"max_seqlen_q"):
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu, -1, m)


# ---- options ----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window", [(-2, -1), (-1, -5), (3, -2)])
def test_window_below_minus_one(device, window):
    _skip(device)
    q, k, v = _qkv(device)
    with pytest.raises(ERR, match=r"window"):
        flashattn.flash_attn_func(q, k, v, window_size=window)


@pytest.mark.parametrize("device", DEVICES)
def test_window_not_a_pair(device):
    _skip(device)
    q, k, v = _qkv(device)
    with pytest.raises(ERR, match=r"window_size"):
        flashattn.flash_attn_func(q, k, v, window_size=(3,))


@pytest.mark.parametrize("device", DEVICES)
def test_softcap_negative(device):
    _skip(device)
    q, k, v = _qkv(device)
    with pytest.raises(ERR, match=r"softcap"):
        flashattn.flash_attn_func(q, k, v, softcap=-1.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [float("inf"), float("-inf"), float("nan")])
def test_softmax_scale_not_finite(device, scale):
    _skip(device)
    q, k, v = _qkv(device)
    with pytest.raises(RuntimeError, match=r"softmax_scale.*finite"):
        flashattn.flash_attn_func(q, k, v, softmax_scale=scale)
    qv, kv_, vv, cu, m = _varlen(device)
    with pytest.raises(RuntimeError, match=r"softmax_scale.*finite"):
        flashattn.flash_attn_varlen_func(qv, kv_, vv, cu, cu, m, m, softmax_scale=scale)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_kv_heads(device):
    _skip(device)
    q, k, v = _qkv(device, Hk=0)
    assert k.shape[2] == 0 and v.shape[2] == 0
    with pytest.raises(RuntimeError, match=r"\bk\b.*at least one head"):
        flashattn.flash_attn_func(q, k, v)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", ["dtype", "shape", "batch"])
def test_alibi_slopes(device, bad):
    _skip(device)
    q, k, v = _qkv(device)
    slopes = {"dtype": torch.rand(4, device=device).half(),
              "shape": torch.rand(3, device=device),
              "batch": torch.rand(5, 4, device=device)}[bad]
    with pytest.raises(ERR, match=r"alibi_slopes"):
        flashattn.flash_attn_func(q, k, v, alibi_slopes=slopes)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", ["h", "bh"])
def test_alibi_slopes_noncontiguous(device, shape):
    """Right shape, dtype and device, but a last-dimension stride of 2 (h) or batch (bh)."""
    _skip(device)
    q, k, v = _qkv(device)
    if shape == "h":
        slopes = torch.rand(8, device=device)[::2]
    else:
        slopes = torch.rand(4, 2, device=device).t()
    assert slopes.shape[-1] == 4 and slopes.stride(-1) != 1
    with pytest.raises(RuntimeError, match=r"alibi_slopes.*contiguous"):
        flashattn.flash_attn_func(q, k, v, alibi_slopes=slopes)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["flash_attn_func", "flash_attn_varlen_func",
                                  "flash_attn_qkvpacked_func"])
def test_dropout_runs_everywhere(device, name):
    """Dropout runs on CPU and CUDA (tests/test_dropout.py checks its numbers)."""
    _skip(device)
    q, k, v = _qkv(device, sk=7, Hk=4)
    qv, kv_, vv, cu, m = _varlen(device)

    def call():
        if name == "flash_attn_func":
            return flashattn.flash_attn_func(q, k, v, dropout_p=0.1)
        if name == "flash_attn_varlen_func":
            return flashattn.flash_attn_varlen_func(qv, kv_, vv, cu, cu, m, m, dropout_p=0.1)
        return flashattn.flash_attn_qkvpacked_func(torch.stack([q, k, v], 2), dropout_p=0.5)

    assert not call().isnan().any()


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_with_block_table(device):
    """Paged KV (block_table) with dropout: the CPU runs it; on CUDA the split-KV kernels take
    no dropout, a named error (csrc/api/backend_choice.h), never a run without it."""
    _skip(device)
    q, _, _, cu, m = _varlen(device)
    k = torch.randn(2, 16, 2, 64, device=device, dtype=torch.float16)
    v = torch.randn(2, 16, 2, 64, device=device, dtype=torch.float16)
    bt = torch.tensor([[1], [0]], dtype=torch.int32, device=device)

    def call():
        return flashattn.flash_attn_varlen_func(q, k, v, cu, cu, m, m, dropout_p=0.2,
                                                block_table=bt)

    if device == "cpu":
        assert not call().isnan().any()
    else:
        with pytest.raises(RuntimeError, match=r"dropout with a KV cache or paged keys"):
            call()


@pytest.mark.parametrize("device", DEVICES)
def test_block_table_backward_not_implemented(device):
    """Paged KV in the varlen forward works (tests/test_kvcache.py); its backward raises."""
    _skip(device)
    q, _, _, cu, m = _varlen(device)
    k = torch.randn(2, 16, 2, 64, device=device, dtype=torch.float16, requires_grad=True)
    v = torch.randn(2, 16, 2, 64, device=device, dtype=torch.float16, requires_grad=True)
    bt = torch.tensor([[1], [0]], dtype=torch.int32, device=device)
    out = flashattn.flash_attn_varlen_func(q.requires_grad_(), k, v, cu, cu, m, m, block_table=bt)
    with pytest.raises(NotImplementedError, match="block_table"):
        out.sum().backward()


# ---- the backward op's own arguments (reachable by calling the op directly) ----

@pytest.mark.parametrize("device", DEVICES)
def test_bwd_op_checks(device):
    _skip(device)
    q, k, v = _qkv(device)
    out, lse = ops.fwd(q, k, v, 0.125, False, -1, -1, 0.0, None)
    opts = (0.125, False, -1, -1, 0.0, None, False)
    dout = torch.randn_like(out)
    with pytest.raises(ERR, match=r"\bdout\b"):
        ops.bwd(dout[:, :3], q, k, v, out, lse, *opts)
    with pytest.raises(ERR, match=r"\bdout\b.*dtype"):
        ops.bwd(dout.bfloat16(), q, k, v, out, lse, *opts)
    with pytest.raises(ERR, match=r"softmax_lse"):
        ops.bwd(dout, q, k, v, out, lse[:, :1], *opts)
    with pytest.raises(ERR, match=r"softmax_lse"):
        ops.bwd(dout, q, k, v, out, lse.half(), *opts)
    with pytest.raises(ERR, match=r"\bout\b"):
        ops.bwd(dout, q, k, v, out[..., :8], lse, *opts)

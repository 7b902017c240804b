"""flash_attn_with_kvcache beyond the numbers: flash-attn 2.8's signature, wrong metadata
(clamped, never out of bounds), argument errors naming the argument, no autograd,
torch.compile(fullgraph=True) of a decode step (caches mutated in place, not copied) and
torch.library.opcheck of fwd_kvcache and of varlen_fwd with a block table."""
import inspect
import textwrap

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend

import flashattn
from helpers import DEVICES, kernel_skip_reason, rand, run_cases_in_subprocess

ops = torch.ops.flashattn
ERR = (RuntimeError, ValueError, TypeError)


def _skip(device, dtype=torch.float16, d=64):
    reason = kernel_skip_reason(device, dtype, d, backward=False)
    if reason:
        pytest.skip(reason)


def test_signature():
    """flash-attn 2.8's argument names, order and defaults."""
    sig = inspect.signature(flashattn.flash_attn_with_kvcache)
    expected = dict(q=None, k_cache=None, v_cache=None, k=None, v=None, rotary_cos=None,
                    rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                    cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                    alibi_slopes=None, num_splits=0, return_softmax_lse=False)
    assert list(sig.parameters) == list(expected)
    for name, p in sig.parameters.items():
        want = inspect.Parameter.empty if name in ("q", "k_cache", "v_cache") else expected[name]
        assert p.default == want, name


@pytest.mark.parametrize("device", DEVICES)
def test_no_autograd(device):
    """As flash-attn: no backward, the output does not require grad."""
    _skip(device)
    q = torch.randn(2, 1, 4, 64, device=device, dtype=torch.float16, requires_grad=True)
    kc = torch.randn(2, 32, 2, 64, device=device, dtype=torch.float16, requires_grad=True)
    out = flashattn.flash_attn_with_kvcache(q, kc, kc.detach(), cache_seqlens=7)
    assert not out.requires_grad


# ---- wrong metadata: clamped, never an out-of-bounds access ----

# name: (call keywords as source text, over B = 3 sequences, cache capacity 64 (paged: 4 pages
# of 16 per sequence, a pool of 10 pages), 3 rows appended when "k" is in the text.
METADATA = {
    "seqlens_beyond": "cache_seqlens=t([70, 64, 1 << 30])",
    "seqlens_negative": "cache_seqlens=t([-5, -(1 << 30), 3])",
    "seqlens_beyond_append": "cache_seqlens=t([62, 64, 1 << 30]), k=kn, v=vn",
    "seqlens_negative_append": "cache_seqlens=t([-2, -(1 << 30), 0]), k=kn, v=vn",
    "batch_idx_out_of_range": "cache_seqlens=t([5, 9, 60]), cache_batch_idx=t([3, -1, 1 << 30]), "
                              "k=kn, v=vn",
    "leftpad_beyond": "cache_seqlens=t([5, 9, 60]), cache_leftpad=t([9, 1 << 30, 100])",
    "leftpad_negative": "cache_seqlens=t([5, 9, 60]), cache_leftpad=t([-1, -(1 << 30), 0]), "
                        "k=kn, v=vn",
    "rotary_beyond": "cache_seqlens=t([63, 1 << 30, -7]), k=kn, v=vn, rotary_cos=cos, "
                     "rotary_sin=sin, causal=True",
    "pages_outside_pool": "cache_seqlens=t([40, 60, 10]), block_table=bt([[10, 11, 1 << 30, 3], "
                          "[-1, 0, 1, 2], [9, 9, 9, 9]]), k=kn, v=vn, paged=True",
    "pages_negative_beyond": "cache_seqlens=t([64, -3, 1 << 30]), block_table=bt([[-(1 << 30), "
                             "5, 6, 7], [1, 2, 3, 4], [0, 8, 9, 12]]), k=kn, v=vn, paged=True",
    "paged_varlen_bad": "varlen=True, cu_k=t([0, 70, 1 << 30, -4]), block_table=bt([[10, -1, 3, "
                        "1 << 30], [0, 1, 2, 3], [4, 5, 6, 7]])",
}

METADATA_SCRIPT = textwrap.dedent("""
    import os, sys, torch, flashattn
    device, dtype = sys.argv[1], getattr(torch, sys.argv[2])
    D = int(os.environ.get("FLASHATTN_TEST_HEADDIM", "64"))  # the head dim of every tensor
    cases = eval(sys.argv[3])
    torch.manual_seed(int(sys.argv[4]))
    G = 256  # guard rows of NaN on each side of every tensor: a read outside shows as NaN

    def guarded(*shape):
        buf = torch.full((shape[0] + 2 * G,) + shape[1:], float("nan"), device=device,
                         dtype=dtype)
        buf[G:G + shape[0]] = torch.randn(shape, device=device).to(dtype)
        return buf, buf[G:G + shape[0]]

    t = lambda x: torch.tensor(x, dtype=torch.int32, device=device)
    bt = t
    _, kn = guarded(3, 3, 2, D)  # the rows to append
    _, vn = guarded(3, 3, 2, D)
    _, cos = guarded(64, 16)  # any finite values: only finiteness is checked
    _, sin = guarded(64, 16)
    bad = []
    for name, text in cases.items():
        print("BEGIN", name, flush=True)
        kw = eval("dict(" + text + ")")
        paged, varlen = kw.pop("paged", False), kw.pop("varlen", False)
        shape = (10, 16, 2, D) if paged or varlen else (3, 64, 2, D)
        kbuf, kc = guarded(*shape)
        vbuf, vc = guarded(*shape)
        _, q = guarded(3, 4, 4, D)
        if varlen:
            cu_q = t([0, 4, 8, 12])
            out = flashattn.flash_attn_varlen_func(q.reshape(12, 4, D), kc, vc, cu_q,
                                                   kw["cu_k"], 4, 64, causal=True,
                                                   block_table=kw["block_table"])
        else:
            out = flashattn.flash_attn_with_kvcache(q, kc, vc, **kw)
        if device == "cuda":
            torch.cuda.synchronize()
        guards = [b[:G] for b in (kbuf, vbuf)] + [b[G + shape[0]:] for b in (kbuf, vbuf)]
        intact = all(bool(torch.isnan(g).all()) for g in guards)
        finite = bool(torch.isfinite(out).all())
        print("  finite out:", finite, "guards intact:", intact, flush=True)
        if not (finite and intact):
            bad.append(f"{name}: finite={finite} guards intact={intact}")
        print("END", name, flush=True)

    if bad:
        print("OUT OF BOUNDS (read or written outside the tensors?):", bad, flush=True)
        sys.exit(3)
    print("DONE", flush=True)
""")


# Head dims: 64 everywhere; on CUDA also 128 and 256, whose decode tiles copy rows differently
# (the straight-line copy form up to 128, the general one at 256).
_METADATA_PARAMS = [(d, 64) for d in DEVICES] + [("cuda", hd) for hd in (128, 256)
                                                 if "cuda" in DEVICES]


@pytest.mark.parametrize("device,headdim", _METADATA_PARAMS,
                         ids=[f"{d}-d{hd}" for d, hd in _METADATA_PARAMS])
def test_wrong_metadata_is_clamped(device, headdim, seed, monkeypatch):
    """cache_seqlens beyond the capacity or negative, block_table entries outside the pool or
    negative, cache_batch_idx and cache_leftpad out of range, varlen cu_seqlens_k past the
    block table: no crash, every output finite (every read inside the caches, which sit
    between NaN guard rows), the guard rows still NaN (no write outside)."""
    dtype = torch.float32 if device == "cpu" else torch.float16
    _skip(device, dtype)
    monkeypatch.setenv("FLASHATTN_TEST_HEADDIM", str(headdim))
    run_cases_in_subprocess(METADATA_SCRIPT, device, dtype, METADATA, seed)


# ---- argument errors: each names the argument ----

def _base(device, paged=False):
    """Valid arguments: B 2, Sq 3, H 4, Hk 2, d 64, capacity 32 (paged: 2 pages of 16)."""
    dt = torch.float16
    a = dict(q=torch.randn(2, 3, 4, 64, device=device).to(dt),
             k=torch.randn(2, 3, 2, 64, device=device).to(dt),
             v=torch.randn(2, 3, 2, 64, device=device).to(dt),
             cache_seqlens=torch.tensor([4, 9], dtype=torch.int32, device=device))
    if paged:
        a.update(k_cache=torch.randn(5, 16, 2, 64, device=device).to(dt),
                 v_cache=torch.randn(5, 16, 2, 64, device=device).to(dt),
                 block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=device))
    else:
        a.update(k_cache=torch.randn(2, 32, 2, 64, device=device).to(dt),
                 v_cache=torch.randn(2, 32, 2, 64, device=device).to(dt))
    return a


def _i32(x, device):
    return torch.tensor(x, dtype=torch.int32, device=device)


# (name, change to the valid arguments (a, device) -> None, paged, message pattern)
BAD_ARGS = [
    ("q_dims", lambda a, d: a.update(q=a["q"][0]), False, r"\bq\b.*4 dimensions"),
    ("k_cache_dims", lambda a, d: a.update(k_cache=a["k_cache"][0]), False,
     r"k_cache.*4 dimensions"),
    ("k_cache_dtype", lambda a, d: a.update(k_cache=a["k_cache"].bfloat16()), False,
     r"k_cache.*dtype"),
    ("v_cache_seqlen", lambda a, d: a.update(v_cache=a["v_cache"][:, :20]), False,
     r"v_cache.*seqlen"),
    ("v_cache_heads", lambda a, d: a.update(v_cache=a["v_cache"][:, :, :1]), False,
     r"v_cache.*nheads"),
    ("k_cache_headdim", lambda a, d: a.update(k_cache=a["k_cache"][..., :32]), False,
     r"k_cache.*headdim"),
    ("k_cache_batch", lambda a, d: a.update(k_cache=a["k_cache"][:1], v_cache=a["v_cache"][:1]),
     False, r"k_cache.*batch.*cache_batch_idx"),
    ("k_cache_contiguous", lambda a, d: a.update(k_cache=a["k_cache"].transpose(2, 3)), False,
     r"k_cache.*contiguous"),
    ("nheads", lambda a, d: a.update(q=torch.randn(2, 3, 5, 64, device=d).half()), False,
     r"nheads of q.*k_cache"),
    ("k_without_v", lambda a, d: a.pop("v"), False, r"k and v.*together.*only k"),
    ("k_without_seqlens", lambda a, d: a.pop("cache_seqlens"), False, r"k and v.*cache_seqlens"),
    ("k_batch", lambda a, d: a.update(k=a["k"][:1], v=a["v"][:1]), False, r"\bk\b.*batch"),
    ("k_heads", lambda a, d: a.update(k=a["k"][:, :, :1]), False, r"\bk\b.*nheads"),
    ("v_headdim", lambda a, d: a.update(v=a["v"][..., :16]), False, r"\bv\b.*headdim"),
    ("v_seqlen", lambda a, d: a.update(v=a["v"][:, :2]), False, r"\bv\b.*seqlen_new"),
    ("k_dtype", lambda a, d: a.update(k=a["k"].float()), False, r"\bk\b.*dtype"),
    ("k_too_long", lambda a, d: a.update(k=a["k"].repeat(1, 11, 1, 1),
                                         v=a["v"].repeat(1, 11, 1, 1)), False,
     r"\bk\b.*seqlen_new.*more than the cache"),
    ("seqlens_dtype", lambda a, d: a.update(cache_seqlens=a["cache_seqlens"].long()), False,
     r"cache_seqlens.*int32"),
    ("seqlens_shape", lambda a, d: a.update(cache_seqlens=_i32([1, 2, 3], d)), False,
     r"cache_seqlens.*shape \(batch,\)"),
    ("seqlens_contiguous", lambda a, d: a.update(cache_seqlens=_i32([1, 0, 2, 0], d)[::2]),
     False, r"cache_seqlens.*contiguous"),
    ("batch_idx_dtype", lambda a, d: a.update(cache_batch_idx=torch.zeros(2, device=d)), False,
     r"cache_batch_idx.*int32"),
    ("leftpad_shape", lambda a, d: a.update(cache_leftpad=_i32([[0, 1]], d)), False,
     r"cache_leftpad.*shape"),
    ("rotary_cos_only", lambda a, d: a.update(rotary_cos=torch.ones(32, 8, device=d).half()),
     False, r"rotary_cos and rotary_sin.*together"),
    ("rotary_dtype", lambda a, d: a.update(rotary_cos=torch.ones(32, 8, device=d),
                                           rotary_sin=torch.ones(32, 8, device=d)), False,
     r"rotary_cos.*dtype"),
    ("rotary_dim", lambda a, d: a.update(rotary_cos=torch.ones(32, 40, device=d).half(),
                                         rotary_sin=torch.ones(32, 40, device=d).half()), False,
     r"rotary_cos.*rotary_dim.*headdim"),
    ("rotary_short", lambda a, d: a.update(rotary_cos=torch.ones(31, 8, device=d).half(),
                                           rotary_sin=torch.ones(31, 8, device=d).half()), False,
     r"rotary_cos.*seqlen_ro.*capacity"),
    ("rotary_sin_shape", lambda a, d: a.update(rotary_cos=torch.ones(32, 8, device=d).half(),
                                               rotary_sin=torch.ones(32, 4, device=d).half()),
     False, r"rotary_sin.*rotary_dim"),
    ("num_splits", lambda a, d: a.update(num_splits=-1), False, r"num_splits"),
    ("window", lambda a, d: a.update(window_size=(-2, 0)), False, r"window"),
    ("softcap", lambda a, d: a.update(softcap=-1.0), False, r"softcap"),
    ("alibi", lambda a, d: a.update(alibi_slopes=torch.ones(3, device=d)), False,
     r"alibi_slopes"),
    ("block_table_dtype", lambda a, d: a.update(block_table=a["block_table"].long()), True,
     r"block_table.*int32"),
    ("block_table_shape", lambda a, d: a.update(block_table=a["block_table"][:1]), True,
     r"block_table.*shape"),
    ("page_size", lambda a, d: a.update(k_cache=a["k_cache"][:, :8], v_cache=a["v_cache"][:, :8]),
     True, r"page size.*multiple of 16"),
    ("pages_mismatch", lambda a, d: a.update(v_cache=a["v_cache"][:4]), True,
     r"v_cache.*num_blocks"),
    ("paged_batch_idx", lambda a, d: a.update(cache_batch_idx=_i32([0, 1], d)), True,
     r"cache_batch_idx.*block_table"),
    ("paged_leftpad", lambda a, d: a.update(cache_leftpad=_i32([0, 1], d)), True,
     r"cache_leftpad.*block_table"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,change,paged,pattern", BAD_ARGS, ids=[b[0] for b in BAD_ARGS])
def test_bad_arguments(device, name, change, paged, pattern):
    _skip(device)
    a = _base(device, paged)
    flashattn.flash_attn_with_kvcache(**dict(a, k_cache=a["k_cache"].clone(),
                                             v_cache=a["v_cache"].clone()))  # valid as given
    change(a, device)
    with pytest.raises(ERR, match=pattern):
        flashattn.flash_attn_with_kvcache(**a)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments_devices(device):
    if device != "cuda":
        pytest.skip("needs a CUDA device")
    _skip(device)
    for name in ("k_cache", "k", "cache_seqlens", "block_table", "rotary_cos"):
        a = _base(device, paged=name == "block_table")
        if name == "rotary_cos":
            a.update(rotary_cos=torch.ones(32, 8, device=device).half(),
                     rotary_sin=torch.ones(32, 8, device=device).half())
        a[name] = a[name].cpu()
        with pytest.raises(ERR, match=rf"{name}.*device"):
            flashattn.flash_attn_with_kvcache(**a)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_paged_varlen_arguments(device):
    _skip(device)
    q = torch.randn(7, 4, 64, device=device).half()
    kp = torch.randn(4, 16, 2, 64, device=device).half()
    cu = _i32([0, 3, 7], device)
    bt = _i32([[0, 1], [2, 3]], device)
    with pytest.raises(ERR, match=r"\bk\b.*4 dimensions.*block_table"):
        flashattn.flash_attn_varlen_func(q, kp[0], kp[0], cu, cu, 4, 4, block_table=bt)
    with pytest.raises(ERR, match=r"block_table.*shape"):
        flashattn.flash_attn_varlen_func(q, kp, kp, cu, cu, 4, 4, block_table=bt[:1])
    with pytest.raises(ERR, match=r"page size.*multiple of 16"):
        flashattn.flash_attn_varlen_func(q, kp[:, :4], kp[:, :4], cu, cu, 4, 4, block_table=bt)


# ---- torch.compile and opcheck ----

def _decode_inputs(device, B=3, cap=112, paged=False, rotary=True):
    # No size of the first call (B 3, 7 pages) equals another: dynamic=True's duck sizing then
    # adds no equality guard that the second batch size would break.
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    H, Hk, d = 4, 2, 32
    a = dict(q=rand([B, 1, H, d], dtype, device), k=rand([B, 1, Hk, d], dtype, device),
             v=rand([B, 1, Hk, d], dtype, device),
             cache_seqlens=torch.randint(0, cap - 1, (B,), dtype=torch.int32, device=device))
    if paged:
        a.update(k_cache=rand([2 * B * cap // 16, 16, Hk, d], dtype, device),
                 v_cache=rand([2 * B * cap // 16, 16, Hk, d], dtype, device),
                 block_table=torch.randperm(2 * B * cap // 16, device=device)[: B * cap // 16]
                 .view(B, cap // 16).to(torch.int32))
    else:
        a.update(k_cache=rand([B, cap, Hk, d], dtype, device),
                 v_cache=rand([B, cap, Hk, d], dtype, device))
    if rotary:
        angle = torch.rand(cap, 8, device=device) * 6.3
        a.update(rotary_cos=angle.cos().to(dtype), rotary_sin=angle.sin().to(dtype))
    return a


def decode_step(q, k_cache, v_cache, k, v, cache_seqlens, rotary_cos=None, rotary_sin=None,
                block_table=None):
    """One decoding step: append this token's k / v, attend, advance the lengths."""
    out, lse = flashattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
        block_table=block_table, causal=True, softcap=3.0, rotary_interleaved=False,
        return_softmax_lse=True)
    return out * 2, lse, cache_seqlens + 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("paged", [False, True])
def test_compile_decode_step(device, backend, paged):
    """fullgraph (dynamic) compile of a decode step: the same numbers as eager, the caches
    mutated in place (same storage), one compilation for two batch sizes, and with inductor
    no copy of either cache in the generated code."""
    from torch._inductor.utils import run_and_get_code

    _skip(device, torch.float32 if device == "cpu" else torch.bfloat16, 32)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(decode_step, backend=counter, fullgraph=True, dynamic=True)
    for B in (3, 5):
        a = _decode_inputs(device, B=B, paged=paged)
        eager = dict(a, k_cache=a["k_cache"].clone(), v_cache=a["v_cache"].clone())
        out_e, lse_e, len_e = decode_step(**eager)
        ptrs = (a["k_cache"].data_ptr(), a["v_cache"].data_ptr())
        if backend == "inductor" and B == 3:  # (run_and_get_code resets dynamo first)
            (out_c, lse_c, len_c), code = run_and_get_code(compiled, **a)
            code = "\n".join(code)
            assert "fwd_kvcache" in code
            assert ".copy_(" not in code and "clone" not in code, code
        else:
            out_c, lse_c, len_c = compiled(**a)
        assert (a["k_cache"].data_ptr(), a["v_cache"].data_ptr()) == ptrs
        assert torch.equal(a["k_cache"], eager["k_cache"]), "k_cache differs from eager"
        assert torch.equal(a["v_cache"], eager["v_cache"]), "v_cache differs from eager"
        assert torch.equal(out_c, out_e) and torch.equal(lse_c, lse_e) and torch.equal(len_c,
                                                                                      len_e)
    assert counter.frame_count == 1, f"{counter.frame_count} compilations"


def _opcheck_args(device, paged):
    a = _decode_inputs(device, B=2, paged=paged)
    a["q"] = rand([2, 3, 4, 32], a["q"].dtype, device)
    return (a["q"], a["k_cache"], a["v_cache"], a["k"], a["v"], a["rotary_cos"],
            a["rotary_sin"], a["cache_seqlens"], None, None, a.get("block_table"),
            32 ** -0.5, True, -1, 0, 0.0, True, None, 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True])
def test_opcheck_fwd_kvcache(device, paged):
    _skip(device, torch.float32 if device == "cpu" else torch.bfloat16, 32)
    torch.library.opcheck(ops.fwd_kvcache.default, _opcheck_args(device, paged))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_varlen_paged(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    _skip(device, dtype, 32)
    q = rand([9, 4, 32], dtype, device)
    kp, vp = rand([6, 16, 2, 32], dtype, device), rand([6, 16, 2, 32], dtype, device)
    cu_q, cu_k = _i32([0, 4, 9], device), _i32([0, 20, 27], device)
    bt = _i32([[5, 1], [0, 3]], device)
    torch.library.opcheck(ops.varlen_fwd.default,
                          (q, kp, vp, cu_q, cu_k, 5, 20, 32 ** -0.5, True, -1, 0, 0.0, None),
                          {"deterministic": False, "block_table": bt})

"""CUDA-only extras (skipped without a GPU): larger shapes against a float64
reference, deterministic mode bitwise over two runs, CUDA-graph capture + replay of
forward + backward equal to eager, the tiles of GPUs with 99 KB of shared memory."""
import os

import pytest
import torch

import flashattn
from helpers import HEADS, assert_close, kernel_skip_reason, skip_unless_sm90

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _skip(dtype, d, dv=None, backward=True):
    r = kernel_skip_reason("cuda", dtype, d, dv, backward)
    if r:
        pytest.skip(r)


def _assert_bitwise_twice(f, q, k, v, dout):
    """f(q, k, v) -> out, run twice with its gradients: out, dq, dk, dv bitwise equal."""
    runs = []
    for _ in range(2):
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        out = f(qg, kg, vg)
        runs.append((out,) + torch.autograd.grad(out, (qg, kg, vg), dout))
    for name, a, b in zip(("out", "dq", "dk", "dv"), *runs):
        assert torch.equal(a, b), f"{name} differs between two deterministic runs"


def _assert_bitwise_case(hd, sl, heads, **kw):
    """_assert_bitwise_twice on fresh bf16 inputs (batch 2, seqlens sl = (sq, sk), head dims
    hd = (d, dv)) through flash_attn_func(..., deterministic=True, **kw)."""
    H, Hk = HEADS[heads]
    q = torch.randn(2, sl[0], H, hd[0], device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, sl[1], Hk, hd[0], device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, sl[1], Hk, hd[1], device="cuda", dtype=torch.bfloat16)
    dout = torch.randn(2, sl[0], H, hd[1], device="cuda", dtype=torch.bfloat16)
    _assert_bitwise_twice(
        lambda q, k, v: flashattn.flash_attn_func(q, k, v, deterministic=True, **kw),
        q, k, v, dout)


def _ref_chunked(q, k, v, dout, causal, compute_dtype):
    """Reference per (batch, head) with autograd, to keep the materialised scores small:
    out and dq/dk/dv in compute_dtype (float64 for the reference, q.dtype for the
    low-precision baseline). GQA handled by mapping heads."""
    from reference import attention_ref

    B, sq, H, d = q.shape
    hk = k.shape[2]
    outs = torch.empty(B, sq, H, v.shape[-1], dtype=compute_dtype, device=q.device)
    lse = torch.empty(B, H, sq, dtype=compute_dtype, device=q.device)
    dq = torch.empty(q.shape, dtype=compute_dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=compute_dtype, device=q.device)
    dv = torch.zeros(v.shape, dtype=compute_dtype, device=q.device)
    for b in range(B):
        for h in range(H):
            kh = h // (H // hk)
            qs = q[b:b + 1, :, h:h + 1].to(compute_dtype).requires_grad_()
            ks = k[b:b + 1, :, kh:kh + 1].to(compute_dtype).requires_grad_()
            vs = v[b:b + 1, :, kh:kh + 1].to(compute_dtype).requires_grad_()
            o, l = attention_ref(qs, ks, vs, causal=causal, softmax_scale=d ** -0.5,
                                 compute_dtype=compute_dtype)
            g = torch.autograd.grad(o, (qs, ks, vs), dout[b:b + 1, :, h:h + 1].to(compute_dtype))
            outs[b, :, h], lse[b, h] = o[0, :, 0].detach(), l[0, 0].detach()
            dq[b, :, h] = g[0][0, :, 0]
            dk[b, :, kh] += g[1][0, :, 0]
            dv[b, :, kh] += g[2][0, :, 0]
    return dict(out=outs, lse=lse, dq=dq, dk=dk, dv=dv)


@pytest.mark.parametrize("N,B,H,Hk,d,causal,dtype", [
    (8192, 1, 2, 1, 128, True, torch.bfloat16),
    (4096, 4, 2, 2, 64, False, torch.float16),
    (2048, 4, 4, 2, 256, True, torch.bfloat16),  # forward: 64 x 64 tile (<= 2k keys)
    (2304, 2, 4, 2, 256, True, torch.bfloat16),  # forward: 128 x 64 tile
    (8192, 1, 1, 1, 96, False, torch.float16),
    (1500, 2, 16, 4, 64, True, torch.float16),  # forward: causal heavy-first over 384 CTAs
])
def test_large_shapes(N, B, H, Hk, d, causal, dtype):
    _skip(dtype, d)
    q = torch.randn(B, N, H, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(B, N, Hk, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(B, N, Hk, d, device="cuda", dtype=dtype, requires_grad=True)
    dout = torch.randn(B, N, H, d, device="cuda", dtype=dtype)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    ours = dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv)
    ref = _ref_chunked(q.detach(), k.detach(), v.detach(), dout, causal, torch.float64)
    low = _ref_chunked(q.detach(), k.detach(), v.detach(), dout, causal, dtype)
    for name in ("out", "lse", "dq", "dk", "dv"):
        assert_close(name, ours[name], ref[name], low[name], dtype,
                     3.0 if name.startswith("d") else 2.0)


def _large_gqa_call(varlen, d, padded_causal):
    """A large GQA call for the deterministic tests: f(q, k, v) -> out with deterministic=True
    (16 / 2 heads of d, bf16) and fresh inputs and dout. varlen: sequences of 4096, 0, 1000
    and 3000 tokens, causal; else 2 x 4096, causal when padded_causal."""
    dtype = torch.bfloat16
    H, Hk = 16, 2
    if varlen:
        lens = [4096, 0, 1000, 3000]
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,
                          device="cuda")
        shape_q, shape_k = (sum(lens), H, d), (sum(lens), Hk, d)

        def f(q, k, v):
            return flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 4096, 4096, causal=True,
                                                    deterministic=True)
    else:
        shape_q, shape_k = (2, 4096, H, d), (2, 4096, Hk, d)

        def f(q, k, v):
            return flashattn.flash_attn_func(q, k, v, causal=padded_causal, deterministic=True)
    q = torch.randn(shape_q, device="cuda", dtype=dtype)
    k = torch.randn(shape_k, device="cuda", dtype=dtype)
    v = torch.randn(shape_k, device="cuda", dtype=dtype)
    dout = torch.randn(shape_q, device="cuda", dtype=dtype)
    return f, q, k, v, dout


@pytest.mark.parametrize("sm90det", [False, True], ids=["default", "sm90det"])
@pytest.mark.parametrize("d", [128, 256])  # 256: the tile chosen by shared memory (sm90: 64 x 64)
@pytest.mark.parametrize("varlen", [False, True])
def test_deterministic_bitwise_large(varlen, d, sm90det, monkeypatch):
    """Bitwise over two runs on large GQA calls; sm90det: the sm90 backward's deterministic
    variant (FLASHATTN_SM90_DET_BWD=1; on other GPUs the same sm80 path twice)."""
    _skip(torch.bfloat16, d)
    if sm90det:
        monkeypatch.setenv("FLASHATTN_SM90_DET_BWD", "1")
    _assert_bitwise_twice(*_large_gqa_call(varlen, d, False))


@pytest.mark.parametrize("hd,sl,causal,window,heads", [
    ((128, 128), (1000, 1000), True, "none", "gqa"),
    ((128, 128), (777, 1100), True, "none", "mha"),
    ((128, 128), (1100, 777), True, "none", "mqa"),
    ((128, 128), (500, 450), False, "right", "mha"),
    ((64, 64), (700, 900), True, "none", "gqa"),
    ((256, 256), (600, 600), True, "none", "gqa"),
])
def test_deterministic_ordered_matches_reference(hd, sl, causal, window, heads):
    """deterministic=True where the key blocks add into dQ in a fixed order that depends on
    the mask (causal / right-bounded windows, sq != sk both ways): against the reference,
    then bitwise over two runs."""
    from test_attention import run_case, window_for

    c = dict(dtype="bf16", hd=hd, sl=sl, causal=causal, window=window, softcap=0.0,
             alibi="none", heads=heads, noncontig=False)
    run_case("cuda", c, deterministic=True)
    _assert_bitwise_case(hd, sl, heads, causal=causal, window_size=window_for(window, *sl))


@pytest.mark.parametrize("hd,sl,heads,chunk", [
    ((128, 128), (1000, 900), "gqa", 3),
    ((64, 64), (700, 1300), "mha", 2),
    ((256, 256), (300, 500), "mqa", 1),
])
def test_deterministic_rotation_chunks_match_reference(hd, sl, heads, chunk, monkeypatch):
    """deterministic=True without a window, with more key blocks per head than the rotation
    chunk (the SM count; here FLASHATTN_BWD_DET_CHUNK): chunk after chunk, each rotated.
    Against the reference, then bitwise over two runs."""
    from test_attention import run_case

    monkeypatch.setenv("FLASHATTN_BWD_DET_CHUNK", str(chunk))
    c = dict(dtype="bf16", hd=hd, sl=sl, causal=False, window="none", softcap=0.0,
             alibi="none", heads=heads, noncontig=False)
    run_case("cuda", c, deterministic=True)
    _assert_bitwise_case(hd, sl, heads)


def _sm90_det_case(hd, sl, causal, window, heads, diag, dq2, monkeypatch):
    """A deterministic call on the sm90 backward (FLASHATTN_SM90_DET_BWD=1; diag / dq2 its
    switches FLASHATTN_SM90_DET_DIAG / _DQ2, set either way: both on by default since
    2026-12-07): the op's choice asserted to be sm90, then against the reference and bitwise
    over two runs (skipped off Hopper)."""
    from test_attention import run_case, window_for

    skip_unless_sm90()
    monkeypatch.setenv("FLASHATTN_SM90_DET_BWD", "1")
    monkeypatch.setenv("FLASHATTN_SM90_DET_DIAG", "1" if diag else "0")
    monkeypatch.setenv("FLASHATTN_SM90_DET_DQ2", "1" if dq2 else "0")
    H, Hk = HEADS[heads]
    q = torch.empty(2, sl[0], H, hd[0], device="cuda", dtype=torch.bfloat16)
    k = torch.empty(2, sl[1], Hk, hd[0], device="cuda", dtype=torch.bfloat16)
    kw = dict(causal=causal, window_size=window_for(window, *sl))
    assert flashattn.kernel_path(q, k, k, direction="bwd", deterministic=True, **kw) == "sm90"
    c = dict(dtype="bf16", hd=hd, sl=sl, causal=causal, window=window, softcap=0.0,
             alibi="none", heads=heads, noncontig=False)
    run_case("cuda", c, deterministic=True)
    _assert_bitwise_case(hd, sl, heads, **kw)


@pytest.mark.parametrize("hd,sl,causal,window,heads", [
    ((128, 128), (1000, 1000), True, "none", "gqa"),
    ((128, 128), (777, 1100), False, "none", "mha"),
    ((128, 128), (1100, 777), True, "none", "mqa"),
    ((128, 128), (900, 700), False, "sym", "gqa"),
    ((64, 64), (700, 900), True, "none", "gqa"),
    ((64, 64), (1300, 1300), False, "none", "mqa"),
    ((256, 256), (600, 600), True, "none", "gqa"),
    ((256, 256), (333, 517), False, "left", "mha"),
])
@pytest.mark.parametrize("dq2", [False, True], ids=["", "dq2"])
def test_deterministic_sm90(hd, sl, causal, window, heads, dq2, monkeypatch):
    """The sm90 backward's deterministic variant (the default on Hopper since these passed
    on an H100, 2026-12-06; FLASHATTN_SM90_DET_BWD=1 set here all the same): its dQ adds in
    key-block order over query blocks visited from the last down, GQA's dK / dV adds in head
    order. The op's choice asserted to be sm90, then against the reference and bitwise over
    two runs (skipped off Hopper). Here in the index order (FLASHATTN_SM90_DET_DIAG=0; the
    diagonal order, the default for causal masks, below). dq2: two dQ warps taking the blocks in
    turn (the default; FLASHATTN_SM90_DET_DQ2=0: one)."""
    _sm90_det_case(hd, sl, causal, window, heads, False, dq2, monkeypatch)


@pytest.mark.parametrize("hd,sl,causal,window,heads", [
    ((128, 128), (1000, 1000), True, "none", "gqa"),
    ((128, 128), (777, 1100), True, "none", "mha"),
    ((128, 128), (1100, 777), True, "none", "mqa"),
    ((128, 128), (500, 450), False, "right", "mha"),
    ((64, 64), (700, 900), True, "none", "gqa"),
    ((256, 256), (600, 600), True, "none", "gqa"),
    ((256, 256), (333, 517), True, "none", "mha"),
])
@pytest.mark.parametrize("dq2", [False, True], ids=["", "dq2"])
def test_deterministic_sm90_diag(hd, sl, causal, window, heads, dq2, monkeypatch):
    """The sm90 deterministic backward's diagonal dQ order (the default; masks
    bounded on the right only: csrc/sm90/bwd_layout_sm90.h): key blocks launched from the last
    down, each visiting its query blocks from its diagonal up, the higher key blocks adding
    first (sq != sk both ways: with sk > sq several key blocks start at query block 0). The
    op's choice asserted to be sm90, then against the reference and bitwise over two runs
    (skipped off Hopper). dq2: with two dQ warps (the default), else one."""
    _sm90_det_case(hd, sl, causal, window, heads, True, dq2, monkeypatch)


@pytest.mark.parametrize("dq2", [False, True], ids=["", "dq2"])
@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("varlen", [False, True])
def test_deterministic_sm90_diag_large(varlen, d, dq2, monkeypatch):
    """The diagonal order on causal calls of more CTAs than an H100 holds at once (2 x 16 heads
    x 32 or 64 key blocks; varlen with an empty sequence): the waits end (a key block waits only
    on key blocks launched before it), bitwise over two runs, and the same gradients within
    rounding as the other deterministic order (the fp32 sums in another order, then bf16)
    (skipped off Hopper). dq2: both with two dQ warps (the default), else one."""
    skip_unless_sm90()
    monkeypatch.setenv("FLASHATTN_SM90_DET_BWD", "1")
    monkeypatch.setenv("FLASHATTN_SM90_DET_DQ2", "1" if dq2 else "0")
    f, q, k, v, dout = _large_gqa_call(varlen, d, True)

    def grads():
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        return torch.autograd.grad(f(qg, kg, vg), (qg, kg, vg), dout)

    monkeypatch.setenv("FLASHATTN_SM90_DET_DIAG", "0")
    other = grads()  # the index order
    monkeypatch.setenv("FLASHATTN_SM90_DET_DIAG", "1")
    _assert_bitwise_twice(f, q, k, v, dout)
    for name, a, b in zip(("dq", "dk", "dv"), grads(), other):
        err = (a.float() - b.float()).abs().max().item()
        # Two roundings to bf16 of fp32 sums that agree to ~1e-6: at most an ulp or two.
        assert err <= 2.0 ** -6 * b.float().abs().max().item(), f"{name}: {err}"


@pytest.mark.parametrize("d", [72, 96, 136, 192])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", ["mha", "gqa"])
def test_sm90_backward_padded_buckets(d, causal, heads, monkeypatch):
    """The head-dim buckets 96 and 192 on the next sm90 backward kernel up (128, 256), by
    default (FLASHATTN_SM90_BWD_PAD=0 sends them to sm80): the op's choice asserted to be sm90,
    then the gradients against the reference (skipped off Hopper)."""
    from test_attention import run_case

    skip_unless_sm90()
    H, Hk = HEADS[heads]
    q = torch.empty(2, 333, H, d, device="cuda", dtype=torch.bfloat16)
    k = torch.empty(2, 517, Hk, d, device="cuda", dtype=torch.bfloat16)
    monkeypatch.setenv("FLASHATTN_SM90_BWD_PAD", "0")
    assert flashattn.kernel_path(q, k, k, direction="bwd", causal=causal) == "sm80"
    monkeypatch.delenv("FLASHATTN_SM90_BWD_PAD")
    assert flashattn.kernel_path(q, k, k, direction="bwd", causal=causal) == "sm90"
    c = dict(dtype="bf16", hd=(d, d), sl=(333, 517), causal=causal, window="none",
             softcap=0.0, alibi="none", heads=heads, noncontig=False)
    run_case("cuda", c)


def test_deterministic_chunk_env_rejects_garbage(monkeypatch):
    monkeypatch.setenv("FLASHATTN_BWD_DET_CHUNK", "0")
    q = torch.randn(1, 300, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flashattn.flash_attn_func(q, q, q, deterministic=True)
    with pytest.raises(RuntimeError, match="FLASHATTN_BWD_DET_CHUNK must be a positive"):
        out.sum().backward()


def _capture(step):
    """step() warmed up twice on a side stream, then captured in a CUDA graph: (graph, what
    the captured step returned)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    return g, out


@pytest.mark.parametrize("varlen", [False, True])
def test_cuda_graph_capture_replay(varlen):
    """Capture fwd + bwd in a CUDA graph, replay on new data, compare with eager."""
    dtype = torch.float16
    _skip(dtype, 64)
    H, Hk, d = 8, 2, 64
    if varlen:
        lens = [300, 0, 129]
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,
                          device="cuda")
        shape_q, shape_k = (sum(lens), H, d), (sum(lens), Hk, d)

        def f(q, k, v):
            return flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 300, 300, causal=True,
                                                    deterministic=True)
    else:
        shape_q, shape_k = (2, 333, H, d), (2, 401, Hk, d)

        def f(q, k, v):
            return flashattn.flash_attn_func(q, k, v, causal=True, deterministic=True)

    static = [torch.randn(s, device="cuda", dtype=dtype) for s in (shape_q, shape_k, shape_k,
                                                                   shape_q)]
    q, k, v = (t.requires_grad_() for t in static[:3])
    dout = static[3]

    def step():
        out = f(q, k, v)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    g, graph_out = _capture(step)
    with torch.no_grad():
        for t in static:
            t.copy_(torch.randn_like(t))
    g.replay()
    torch.cuda.synchronize()
    eager = step()
    for name, a, b in zip(("out", "dq", "dk", "dv"), graph_out, eager):
        assert torch.equal(a, b), f"{name}: graph replay differs from eager"


# sm_86 / sm_89 allow 99 KB of shared memory per block: FLASHATTN_SMEM_LIMIT caps what the
# kernels may use, so that the tiles chosen for those GPUs run (and are checked) here too.
SMALL_SMEM = 99 * 1024


@pytest.mark.parametrize("pdl", ["1", "0"])
def test_cuda_graph_decode_step(pdl, monkeypatch):
    """A decode step (append one token, then the split-KV attention and its combine, launched
    as a programmatic dependent on Hopper unless FLASHATTN_DECODE_PDL=0) captured in a CUDA
    graph and replayed on new data: the same output and cache as the eager step, and the
    split path taken (batch 1 over 4k keys: many splits)."""
    monkeypatch.setenv("FLASHATTN_DECODE_PDL", pdl)
    dtype = torch.bfloat16
    _skip(dtype, 128, backward=False)
    B, N, H, Hk, d = 1, 4096, 8, 2, 128
    q = torch.randn(B, 1, H, d, device="cuda", dtype=dtype)
    k_cache = torch.randn(B, N, Hk, d, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    k_new = torch.randn(B, 1, Hk, d, device="cuda", dtype=dtype)
    v_new = torch.randn_like(k_new)
    seqlens = torch.full((B,), N - 2, dtype=torch.int32, device="cuda")
    assert flashattn.kernel_path(q, k_cache, v_cache) == "sm80-decode"

    def step():
        return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                                 cache_seqlens=seqlens, return_softmax_lse=True)
    g, (graph_out, graph_lse) = _capture(step)
    for t in (q, k_new, v_new):
        t.copy_(torch.randn_like(t))
    g.replay()
    torch.cuda.synchronize()
    graph_k = k_cache.clone()
    out, lse = step()
    assert torch.equal(graph_out, out) and torch.equal(graph_lse, lse)
    assert torch.equal(graph_k, k_cache) and torch.equal(k_cache[:, N - 2], k_new[:, 0])
    one = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens + 1,
                                            num_splits=1)  # no split, no combine
    assert (one.float() - out.float()).abs().max().item() < 2e-2


@pytest.mark.parametrize("hd,heads,causal,det", [
    ((32, 32), "gqa", True, False),
    ((64, 64), "mha", False, True),
    ((80, 96), "mqa", True, False),
    ((128, 128), "gqa", False, True),
    ((128, 128), "mha", True, False),
    ((176, 192), "gqa", True, True),
])
def test_small_smem_tiles(monkeypatch, hd, heads, causal, det):
    """The default backward tiles need 112-166 KB and raise a named error under the cap, so a
    pass means the <= 99 KB tiles ran; deterministic ones also bitwise over two runs."""
    from test_attention import run_case

    monkeypatch.setenv("FLASHATTN_SMEM_LIMIT", str(SMALL_SMEM))
    c = dict(dtype="bf16", hd=hd, sl=(333, 290), causal=causal, window="none", softcap=0.0,
             alibi="none", heads=heads, noncontig=False)
    run_case("cuda", c, deterministic=det)
    if det:
        _assert_bitwise_case(hd, (333, 290), heads, causal=causal)


def test_small_smem_d256(monkeypatch):
    """d 256 under 99 KB: the forward runs its smaller tile; the backward has none yet and
    says so (shared memory needed and allowed)."""
    from reference import ref_and_lowp

    dtype = torch.bfloat16
    _skip(dtype, 256)
    monkeypatch.setenv("FLASHATTN_SMEM_LIMIT", str(SMALL_SMEM))
    q, k, v, dout = (torch.randn(2, n, 2, 256, device="cuda", dtype=dtype)
                     for n in (200, 300, 300, 200))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse, _ = flashattn.flash_attn_func(qg, kg, vg, causal=True, return_attn_probs=True)
    ref, low = ref_and_lowp(q, k, v, dout, causal=True)
    assert_close("out", out, ref["out"], low["out"], dtype)
    assert_close("lse", lse, ref["lse"], low["lse"], dtype)
    with pytest.raises(RuntimeError, match="shared memory per block"):
        torch.autograd.grad(out, (qg, kg, vg), dout)


def test_smem_limit_checked(monkeypatch):
    _skip(torch.float16, 64)
    q = torch.randn(1, 64, 1, 64, device="cuda", dtype=torch.float16)
    monkeypatch.setenv("FLASHATTN_SMEM_LIMIT", "99K")
    with pytest.raises(RuntimeError, match="FLASHATTN_SMEM_LIMIT must be a positive"):
        flashattn.flash_attn_func(q, q, q)
    monkeypatch.setenv("FLASHATTN_SMEM_LIMIT", "1000")  # below every tile
    # Forced onto sm90, its own check names the limit (and the suite would count it a skip).
    forced = os.environ.get("FLASHATTN_FORCE_BACKEND") == "sm90"
    with pytest.raises(RuntimeError, match="shared memory per block \\(FLASHATTN_SMEM_LIMIT" if forced
                       else "bytes of shared memory per block, this GPU allows") as e:
        flashattn.flash_attn_func(q, q, q)
    assert not forced or "FLASHATTN_FORCE_BACKEND=sm90" in str(e.value)


@pytest.mark.parametrize("d,sq,sk,causal,B,H,Hk,dtype,extra", [
    (128, 1000, 1100, False, 2, 8, 2, torch.bfloat16, {}),  # 8 query tiles, the last 104 rows
    (96, 333, 700, True, 3, 4, 4, torch.float16, {}),  # dv 96: the second 64-column box clipped
    (64, 1500, 1500, True, 2, 16, 4, torch.bfloat16, {}),  # 192-row tiles, persistent pair deal
    (40, 70, 300, False, 1, 2, 1, torch.float16, {}),  # one partial tile, dv 40
    (64, 500, 200, True, 2, 4, 2, torch.bfloat16, {}),  # rows seeing no key: O 0, lse -inf
    (128, 700, 900, False, 2, 4, 4, torch.bfloat16, dict(dropout_p=0.2)),  # the dropout kernel
    (128, 300, 500, True, 2, 4, 2, torch.float16, dict(softcap=5.0, sink=True)),  # score mod
])
def test_sm90_tma_epilogue(d, sq, sk, causal, B, H, Hk, dtype, extra, monkeypatch):
    """The sm90 forward's epilogue through shared memory and TMA stores (kernel_fwd_sm90.cuh
    kTmaO: the d64 / d128 tiles, padded calls; on by default) writes out and lse bit for bit
    as the register stores do (FLASHATTN_SM90_TMA_O=0), which the accuracy tests check
    against the float64 reference: partial tiles, clipped columns, several batches (a box past
    a sequence's rows would land in the next one's), rows without keys, dropout, sinks."""
    skip_unless_sm90()
    extra = dict(extra)
    q = torch.randn(B, sq, H, d, device="cuda", dtype=dtype)
    k = torch.randn(B, sk, Hk, d, device="cuda", dtype=dtype)
    v = torch.randn(B, sk, Hk, d, device="cuda", dtype=dtype)
    if extra.pop("sink", False):
        extra["learnable_sink"] = torch.randn(H, device="cuda")
    assert flashattn.kernel_path(q, k, v, causal=causal, dropout_p=extra.get("dropout_p", 0.0),
                                 softcap=extra.get("softcap", 0.0)) == "sm90"
    res = []
    for tma in ("1", "0"):
        monkeypatch.setenv("FLASHATTN_SM90_TMA_O", tma)
        torch.manual_seed(5)
        out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True,
                                                **extra)
        res.append((out, lse))
    assert torch.equal(res[0][0], res[1][0]), "out differs between TMA and register stores"
    assert torch.equal(res[0][1], res[1][1]), "lse differs between TMA and register stores"
    if causal and sq > sk:
        blind = sq - sk  # rows that see no key
        assert (res[0][0][:, :blind] == 0).all() and torch.isinf(res[0][1][:, :, :blind]).all()

"""The backend choice (csrc/api/backend_choice.h) as flashattn.kernel_path reports it, the
FLASHATTN_FORCE_BACKEND switch, the sm90 forward against the reference on the calls it
takes, and the suite's own rules (conftest.py: FLASHATTN_REQUIRE_CUDA, forced-sm90 skips)."""
import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

import flashattn
from helpers import DEVICES, HEADS, check_results, rand
from reference import ref_and_lowp

TESTS = pathlib.Path(__file__).resolve().parent


def _no_sm90_reason():
    """Why the sm90 forward cannot run here (None: it can): a cc 9.0 GPU and sm_90a code."""
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        return "needs a GPU with compute capability 9.0"
    if flashattn.BUILD_CONFIG["FLASHATTN_DISABLE_SM90"]:  # a missing kernel: REQUIRE_CUDA fails
        return "this build has no sm90 kernels (TORCH_CUDA_ARCH_LIST without 9.0 / 9.0a?)"
    return None


needs_sm90 = pytest.mark.skipif(_no_sm90_reason() is not None, reason=str(_no_sm90_reason()))
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("device", DEVICES)
def test_kernel_path_cpu_and_errors(device, monkeypatch):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q = rand([1, 4, 2, 64], dtype, device)
    if device == "cpu":
        monkeypatch.setenv("FLASHATTN_FORCE_BACKEND", "sm90")  # CUDA calls only
        assert flashattn.kernel_path(q, q, q) == "cpu"
        assert flashattn.kernel_path(q, q, q, direction="bwd", causal=True) == "cpu"
        cu = torch.tensor([0, 1, 4], dtype=torch.int32)
        assert flashattn.kernel_path(q[0], q[0], q[0], cu, cu) == "cpu"
    with pytest.raises(RuntimeError, match="direction must be 'fwd' or 'bwd', got 'up'"):
        flashattn.kernel_path(q, q, q, direction="up")
    with pytest.raises(RuntimeError, match="cu_seqlens_q and cu_seqlens_k must be given"):
        flashattn.kernel_path(q[0], q[0], q[0], torch.tensor([0, 4], dtype=torch.int32,
                                                             device=device))
    # The op's own input checks, with the op's messages.
    with pytest.raises(RuntimeError, match="k must have the same dtype as q"):
        flashattn.kernel_path(q, q.to(torch.float16), q)
    with pytest.raises(RuntimeError, match="softcap must be finite and >= 0"):
        flashattn.kernel_path(q, q, q, softcap=-1.0)


@needs_cuda
def test_cuda_force_backend_bad_value(monkeypatch):
    q = torch.randn(1, 4, 2, 64, device="cuda", dtype=torch.float16)
    monkeypatch.setenv("FLASHATTN_FORCE_BACKEND", "sm70")
    with pytest.raises(RuntimeError, match="FLASHATTN_FORCE_BACKEND must be sm80, sm90 or auto"):
        flashattn.kernel_path(q, q, q)
    with pytest.raises(RuntimeError, match="FLASHATTN_FORCE_BACKEND must be sm80, sm90 or auto"):
        flashattn.flash_attn_func(q, q, q)


@needs_cuda
def test_cuda_force_backend_sm80(monkeypatch):
    q = torch.randn(1, 4, 2, 128, device="cuda", dtype=torch.bfloat16)
    monkeypatch.setenv("FLASHATTN_FORCE_BACKEND", "sm80")
    assert flashattn.kernel_path(q, q, q) in ("sm80", "sm80-ptx")
    assert flashattn.kernel_path(q, q, q, direction="bwd") in ("sm80", "sm80-ptx")


@needs_sm90
@pytest.mark.parametrize("what, kw, why", [
    ("d36", dict(d=36), "head dim"),
    ("dv36", dict(dv=36), "head dim"),
    ("misaligned", dict(offset=4), "16-byte aligned"),
    ("strides", dict(noncontig=True), "strides"),
])
def test_cuda_sm90_declines(what, kw, why, monkeypatch):
    """What the sm90 forward does not take runs sm80 by default; forced to sm90 it raises,
    naming the reason."""
    monkeypatch.delenv("FLASHATTN_FORCE_BACKEND", raising=False)  # the default choice first
    d, dv = kw.get("d", 128), kw.get("dv", kw.get("d", 128))
    q = rand([2, 300, 4, d], torch.bfloat16, "cuda", kw.get("noncontig", False))
    if kw.get("offset"):  # the same values at a base 8 bytes past a 16-byte boundary
        q = torch.empty(q.numel() + kw["offset"], dtype=q.dtype, device="cuda")[
            kw["offset"]:].view(q.shape).copy_(q)
    k = rand([2, 300, 4, d], torch.bfloat16, "cuda", kw.get("noncontig", False))
    v = rand([2, 300, 4, dv], torch.bfloat16, "cuda", kw.get("noncontig", False))
    opts = dict(softcap=kw.get("softcap", 0.0),
                alibi_slopes=torch.rand(4, device="cuda") if kw.get("alibi") else None)
    args = (q, k, v)
    if kw.get("varlen"):
        cu = torch.tensor([0, 250, 600], dtype=torch.int32, device="cuda")
        args = (q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu)
    assert flashattn.kernel_path(*args, **opts) == "sm80"
    monkeypatch.setenv("FLASHATTN_FORCE_BACKEND", "sm90")
    with pytest.raises(RuntimeError, match=f"FLASHATTN_FORCE_BACKEND=sm90, but the sm90 "
                                           f"forward does not take this call: .*{why}"):
        flashattn.kernel_path(*args, **opts)
    with pytest.raises(RuntimeError, match="FLASHATTN_FORCE_BACKEND=sm90, but"):
        if kw.get("varlen"):
            flashattn.flash_attn_varlen_func(*args, 600, 600, **opts)
        else:
            flashattn.flash_attn_func(*args, **opts)


# (batch, sq, sk, heads, causal, window): >= 3 key blocks, partial tiles, causal both ways,
# windows, GQA / MQA, one row block, no key block for some rows.
SM90_CASES = [
    (2, 128, 128, "mha", False, (-1, -1)),
    (2, 333, 517, "gqa", True, (-1, -1)),
    (1, 517, 333, "mha", True, (-1, -1)),
    (1, 1000, 1000, "mqa", False, (100, 20)),
    (2, 1, 700, "gqa", False, (-1, -1)),
    (1, 700, 700, "mha", False, (50, -1)),
    (1, 257, 1, "mha", False, (-1, -1)),
    (3, 1100, 900, "gqa", True, (-1, -1)),
]


# (qk, v) head dims: every sm90 variant, and head dims that run in a larger one (zeros loaded
# past them, columns past dv not stored).
SM90_HDIMS = [(128, 128), (64, 64), (256, 256), (192, 128), (192, 192), (40, 40), (96, 96),
              (136, 64), (64, 128), (200, 256)]


def _sm90_params():
    out = []
    for hd in SM90_HDIMS:
        cases = SM90_CASES if hd == (128, 128) else [SM90_CASES[i] for i in (1, 3, 4, 7)]
        forces = ("auto", "sm90") if hd == (128, 128) else ("sm90",)
        for c in cases:
            for force in forces:
                cid = (f"d{hd[0]}x{hd[1]}-b{c[0]}-{c[1]}x{c[2]}-{c[3]}-"
                       f"{'causal' if c[4] else 'w%dx%d' % c[5]}-{force}")
                out.append(pytest.param(hd, c, force, id=cid))
    return out


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("hd, case, force", _sm90_params())
def test_cuda_sm90_forward(hd, case, force, dtype, monkeypatch):
    """The sm90 forward (chosen by default, or forced) against the float64 reference; its
    LSE feeds the backward (sm90's for the 64 / 128 / 256 buckets, else sm80's), checked too."""
    B, sq, sk, heads, causal, window = case
    d, dv = hd
    H, Hk = HEADS[heads]
    monkeypatch.setenv("FLASHATTN_FORCE_BACKEND", force)
    q, k, v = (rand([B, n, h, e], dtype, "cuda") for n, h, e in ((sq, H, d), (sk, Hk, d),
                                                                   (sk, Hk, dv)))
    kw = dict(causal=causal, window_size=window)
    # By default a decoding-shaped call (<= 64 query rows per KV head, >= 512 keys) runs the
    # split-KV decode kernels (backend_choice.h: decode_shaped).
    decode = force == "auto" and sq * (H // Hk) <= 64 and sk >= 512
    assert flashattn.kernel_path(q, k, v, **kw) == ("sm80-decode" if decode else "sm90")
    # The sm90 backward takes the head-dim buckets 64 (33..64), 128 (97..128) and 256 (193..256:
    # kernel_bwd_d256_sm90.cuh), and with d == dv 96 and 192 on the next kernel up.
    m = max(d, dv)
    bwd90 = 32 < m <= 256 and (d == dv or m <= 64 or 96 < m <= 128 or 192 < m)
    assert flashattn.kernel_path(q, k, v, direction="bwd", **kw) == ("sm90" if bwd90 else "sm80")
    dout = rand([B, sq, H, dv], dtype, "cuda")
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse, _ = flashattn.flash_attn_func(qg, kg, vg, return_attn_probs=True, **kw)
    dq, dk, dv_ = torch.autograd.grad(out, (qg, kg, vg), dout)
    ref, low = ref_and_lowp(q, k, v, dout, **kw)
    check_results(dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv_), ref, low, dtype)


@needs_sm90
@pytest.mark.parametrize("hd", [(128, 128), (64, 64), (256, 256), (192, 128)],
                         ids=lambda h: f"d{h[0]}x{h[1]}")
@pytest.mark.parametrize("mod", ["softcap", "alibi", "both", "negative-scale"])
def test_cuda_sm90_score_mod(hd, mod, monkeypatch):
    """softcap, ALiBi (per (batch, head) slopes), both, and a negative scale on the sm90 forward
    (its transformed-score kernels), causal with GQA, against float64; the grads on the sm90
    backward's score-transform kernels (buckets 64 / 128 / 256; a negative scale and 192 x 128
    on sm80)."""
    monkeypatch.setenv("FLASHATTN_FORCE_BACKEND", "sm90")
    (d, dv), dtype, B, sq, sk = hd, torch.bfloat16, 2, 333, 517
    q, k, v = (rand([B, n, h, e], dtype, "cuda") for n, h, e in ((sq, 6, d), (sk, 2, d),
                                                                   (sk, 2, dv)))
    kw = dict(causal=mod != "negative-scale",
              softcap=3.0 if mod in ("softcap", "both") else 0.0,
              alibi_slopes=torch.rand(B, 6, device="cuda") if mod in ("alibi", "both") else None,
              softmax_scale=-0.5 * d ** -0.5 if mod == "negative-scale" else None)
    assert flashattn.kernel_path(q, k, v, **kw) == "sm90"
    bwd90 = max(d, dv) in (64, 128, 256) and mod != "negative-scale"
    assert flashattn.kernel_path(q, k, v, direction="bwd", **kw) == ("sm90" if bwd90 else "sm80")
    dout = rand([B, sq, 6, dv], dtype, "cuda")
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse, _ = flashattn.flash_attn_func(qg, kg, vg, return_attn_probs=True, **kw)
    dq, dk, dv_ = torch.autograd.grad(out, (qg, kg, vg), dout)
    ref, low = ref_and_lowp(q, k, v, dout, **kw)
    check_results(dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv_), ref, low, dtype)


# (seqlens_q, seqlens_k) per sequence: empty ones on either side, rows of a block crossing
# into the next sequence, >= 3 key blocks.
SM90_VARLEN = [([113, 0, 1, 57, 700], [203, 5, 239, 0, 650]), ([300, 64], [1000, 7])]


@needs_sm90
@pytest.mark.parametrize("hd", [(128, 128), (64, 64), (256, 256)], ids=lambda h: f"d{h[0]}")
@pytest.mark.parametrize("lens", SM90_VARLEN, ids=["mixed", "long"])
@pytest.mark.parametrize("mask", ["none", "causal", "window"])
def test_cuda_sm90_varlen(hd, lens, mask, monkeypatch):
    """Varlen on the sm90 forward (per-sequence bounds on packed rows) against float64."""
    from reference import ref_and_lowp_varlen

    monkeypatch.setenv("FLASHATTN_FORCE_BACKEND", "sm90")
    dtype, (d, dv), (lq, lk) = torch.bfloat16, hd, lens
    q = rand([sum(lq), 6, d], dtype, "cuda")
    k, v = rand([sum(lk), 2, d], dtype, "cuda"), rand([sum(lk), 2, dv], dtype, "cuda")
    cu_q, cu_k = (torch.tensor([0] + torch.tensor(x).cumsum(0).tolist(), dtype=torch.int32,
                               device="cuda") for x in (lq, lk))
    kw = dict(causal=mask == "causal", window_size=(90, 30) if mask == "window" else (-1, -1))
    assert flashattn.kernel_path(q, k, v, cu_q, cu_k, max(lq), max(lk), **kw) == "sm90"
    out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk),
                                                   return_attn_probs=True, **kw)
    ref, low = ref_and_lowp_varlen(q, k, v, cu_q.cpu(), cu_k.cpu(), **kw)
    check_results(dict(out=out, lse=lse), ref, low, dtype, grads=False)


@needs_sm90
def test_cuda_sm90_and_sm80_agree_with_reference(monkeypatch):
    """Both backends on the same inputs, each within the rule of the reference."""
    q, k, v = (rand([2, 640, 4, 128], torch.bfloat16, "cuda") for _ in range(3))
    ref, low = ref_and_lowp(q, k, v, causal=True)
    for force in ("sm90", "sm80"):
        monkeypatch.setenv("FLASHATTN_FORCE_BACKEND", force)
        out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        check_results(dict(out=out, lse=lse), ref, low, torch.bfloat16, grads=False)


# ---- the suite's rules, run on a generated test file in a subprocess ----

_RULES_CONFTEST = """
import importlib.util
spec = importlib.util.spec_from_file_location("flashattn_conftest", {path!r})
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
pytest_runtest_makereport = mod.pytest_runtest_makereport
FORCED = mod.FORCED_SM90_MARK
"""

_RULES_TESTS = """
import pytest
from conftest import FORCED

def test_cuda_no_kernel():
    pytest.skip("flashattn: the forward on CUDA tensors needs the CUDA kernels, but this build has none")

def test_cuda_other_reason():
    pytest.skip("a reason that is not a missing kernel")

def test_cuda_forced_sm90():
    raise RuntimeError("flashattn: " + FORCED + ": head dim (it takes multiples of 8)")

def test_cpu_no_kernel():
    pytest.skip("this build has no CUDA backward")
"""


@pytest.mark.parametrize("require", [False, True])
def test_suite_rules(tmp_path, require):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(
        _RULES_CONFTEST.format(path=str(TESTS / "conftest.py"))))
    (tmp_path / "test_rules.py").write_text(textwrap.dedent(_RULES_TESTS))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get(
        "PYTHONPATH", "")]))
    env.pop("FLASHATTN_REQUIRE_CUDA", None)
    if require:
        env["FLASHATTN_REQUIRE_CUDA"] = "1"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                        str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True)
    out = r.stdout + r.stderr
    want = "1 failed, 3 skipped" if require else "4 skipped"
    assert want in out, out
    assert "FLASHATTN_FORCE_BACKEND=sm90, but the sm90 forward does not take" in out, out
    if require:
        assert "FAILED test_rules.py::test_cuda_no_kernel" in out, out


# Decoding-shaped calls (<= 64 query rows per KV head over >= 512 keys) run the split-KV
# decode kernels by default: (batch, sq, sk, (H, Hk), d, options). Several splits (the default
# count fills a wave), a KV group's rows packed into one tile (16, 32 and 64-row tiles), head
# dims masked past d, masks, score mods.
DECODE_CASES = [
    (2, 1, 700, (8, 2), 128, {}),
    (1, 3, 3000, (12, 1), 64, dict(causal=True)),
    (3, 2, 1000, (4, 4), 59, dict(window_size=(300, 0))),
    (1, 8, 2048, (16, 2), 256, dict(softcap=5.0)),
    (2, 4, 900, (8, 1), 96, dict(causal=True, alibi=True)),
    (1, 1, 512, (2, 1), 32, {}),
]


@needs_cuda
@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: f"b{c[0]}-{c[1]}x{c[2]}-h{c[3][0]}"
                         f"x{c[3][1]}-d{c[4]}-{'-'.join(c[5]) or 'plain'}")
def test_cuda_decode_shaped(case, monkeypatch):
    """The split-KV decode kernels behind flash_attn_func, against float64 (out, lse, and the
    backward on the saved lse)."""
    monkeypatch.delenv("FLASHATTN_FORCE_BACKEND", raising=False)
    B, sq, sk, (H, Hk), d, opts = case
    kw = dict(opts)
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.rand(B, H, device="cuda")
    dtype = torch.bfloat16
    q, k, v = (rand([B, n, h, d], dtype, "cuda") for n, h in ((sq, H), (sk, Hk), (sk, Hk)))
    assert flashattn.kernel_path(q, k, v, **kw) == "sm80-decode"
    dout = rand([B, sq, H, d], dtype, "cuda")
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse, _ = flashattn.flash_attn_func(qg, kg, vg, return_attn_probs=True, **kw)
    dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), dout)
    ref, low = ref_and_lowp(q, k, v, dout, **kw)
    check_results(dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv), ref, low, dtype)
    # Forced onto sm80, the same call runs the main kernels (not the decode ones).
    monkeypatch.setenv("FLASHATTN_FORCE_BACKEND", "sm80")
    assert flashattn.kernel_path(q, k, v, **kw) in ("sm80", "sm80-ptx")


@needs_cuda
# 96: the default tiles are 64 bytes over; pages of 16 (a key block over several pages) and
# 32 (one page a block of the small tiles) at d 64 / 128.
@pytest.mark.parametrize("d,page", [(64, 64), (96, 64), (128, 64), (256, 64), (64, 16),
                                    (128, 16), (64, 32), (128, 32)])
def test_cuda_decode_small_smem(d, page, monkeypatch):
    """The decode kernels' variant for GPUs with 99 KB of shared memory per block (sm_86 /
    sm_89), picked under FLASHATTN_SMEM_LIMIT, against float64 (kvcache, paged), GQA of 8 at
    2 tokens (16 rows a KV head)."""
    monkeypatch.delenv("FLASHATTN_FORCE_BACKEND", raising=False)
    monkeypatch.setenv("FLASHATTN_SMEM_LIMIT", "101376")
    B, sq, sk, H, Hk = 2, 2, 1024, 16, 2
    dtype = torch.bfloat16
    q = rand([B, sq, H, d], dtype, "cuda")
    k, v = (rand([B, sk, Hk, d], dtype, "cuda") for _ in range(2))
    assert flashattn.kernel_path(q, k, v, causal=True) == "sm80-decode"
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    ref, low = ref_and_lowp(q, k, v, causal=True)
    check_results(dict(out=out, lse=lse), ref, low, dtype, grads=False)
    # The same keys in a paged cache (a shuffled block table), through flash_attn_with_kvcache.
    per = sk // page
    table = torch.randperm(B * per, device="cuda").view(B, per)
    k_pool = torch.empty(B * per, page, Hk, d, device="cuda", dtype=dtype)
    v_pool = torch.empty_like(k_pool)
    k_pool[table.flatten()] = k.view(B * per, page, Hk, d)
    v_pool[table.flatten()] = v.view(B * per, page, Hk, d)
    seqlens = torch.full((B,), sk, dtype=torch.int32, device="cuda")
    out2, lse2 = flashattn.flash_attn_with_kvcache(
        q, k_pool, v_pool, cache_seqlens=seqlens, block_table=table.to(torch.int32),
        causal=True, return_softmax_lse=True)
    check_results(dict(out=out2, lse=lse2), ref, low, dtype, grads=False)

"""Dropout (issue 15, params.h, csrc/common/philox.h): out, softmax_lse, the returned S and the
gradients against the float64 reference under the mask of an independent Philox
(reference.py, checked against Random123's known-answer vectors), over a covering set (padded
and varlen, masks, GQA, softcap, ALiBi, sinks); the kept fraction against 1 - p_q; seeds;
opcheck; torch.compile.

On CUDA the kernels are not built yet: the calls raise flashattn's "not built yet (issue 15)"
error, which conftest turns into a skip giving that reason, and into a failure under
FLASHATTN_REQUIRE_CUDA=1 (the GPU job), as for any missing kernel.
"""
import math
import os

import numpy as np
import pytest
import torch

import flashattn
from helpers import (DEVICES, DTYPES, HEADS, alibi_slopes, assert_close, case_id, check_results,
                     covering_set, cuda_case_params, dtypes_for, rand, skip_if_no_kernel,
                     skip_unless_sm90)
from reference import (PHILOX_ROUNDS, attn_probs_ref, dropout_keep_ref, dropout_scale_ref,
                       dropout_threshold_ref, philox4x32_ref, ref_and_lowp_ext, visible_mask)

# Layouts: padded (seqlen_q, seqlen_k), or varlen (lens_q, lens_k) with zero-length sequences.
SHAPES = {
    "113x203": (113, 203), "239x1": (239, 1), "1x239": (1, 239), "799x3": (799, 3),
    "128x128": (128, 128), "vl_mixed": ([113, 0, 1, 57], [203, 5, 239, 57]),
    "vl_nokeys": ([239, 1, 0, 3], [1, 0, 0, 799]),
}
HD = [(32, 32), (59, 59), (64, 64), (111, 111), (128, 128), (192, 128)]


def _window(kind, sk_min):
    m = max(1, sk_min)
    return {"none": (-1, -1), "sym": (m // 2 + 3, m // 3), "left": (m // 2 + 1, -1),
            "right": (-1, m // 3)}[kind]


def _cu(lens, device):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,
                        device=device)


def _round128(x):
    return (x + 127) // 128 * 128


def run_case(device, c, seed, bwd_path=None):
    """One case of the covering sets of this file and test_sinks.py: c has dtype, hd, shape,
    causal, window, softcap, alibi, heads, p (dropout) and sink. Checks out, lse, dq, dk, dv
    (and dsink) against the reference under the Philox mask, and S (with dropout). bwd_path:
    the backend the op must choose for the backward (kernel_path), else it fails."""
    dtype = DTYPES[c["dtype"]]
    d, dv = c["hd"]
    H, Hk = HEADS[c["heads"]]
    p = c["p"]
    skip_if_no_kernel(device, dtype, d, dv)
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
        lens_q, lens_k = [sq] * B, [sk] * B
        qs, ks = [B, sq, H, d], [B, sk, Hk]
        cu, sk_min = None, sk
    q, dout = rand(qs, dtype, device), rand(qs[:-1] + [dv], dtype, device)
    k, v = rand(ks + [d], dtype, device), rand(ks + [dv], dtype, device)
    sink = None
    if c["sink"]:
        sink = (torch.randn(H, device=device) * 2).requires_grad_()
    kw = dict(causal=c["causal"], window_size=_window(c["window"], sk_min), softcap=c["softcap"],
              alibi_slopes=alibi_slopes(c["alibi"], B, H, device))
    if bwd_path is not None:
        args = (q, k, v, *cu, sq, sk) if varlen else (q, k, v)
        path = flashattn.kernel_path(*args, direction="bwd", dropout_p=p, learnable_sink=sink,
                                     **kw)
        assert path == bwd_path, f"the backward runs {path}, not {bwd_path}"
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    torch.manual_seed(seed + 1)
    if varlen:
        out, lse, s_dmask = flashattn.flash_attn_varlen_func(
            qg, kg, vg, *cu, sq, sk, dropout_p=p, return_attn_probs=True, learnable_sink=sink,
            **kw)
    else:
        out, lse, s_dmask = flashattn.flash_attn_func(
            qg, kg, vg, dropout_p=p, return_attn_probs=True, learnable_sink=sink, **kw)
    leaves = (qg, kg, vg) + ((sink,) if sink is not None else ())
    grads = torch.autograd.grad(out, leaves, dout)
    ours = dict(zip(("dq", "dk", "dv", "dsink"), grads), out=out, lse=lse)

    extra = {}
    if p > 0:
        torch.manual_seed(seed + 1)  # the draw flash_attn_*func made
        rng = flashattn.interface._rng_state(q, p).cpu()
        keep = dropout_keep_ref(rng, B, H, sq, sk, p)
        assert s_dmask.shape == (B, H, _round128(sq), _round128(sk)), s_dmask.shape
        dropped_s = torch.signbit(s_dmask[:, :, :sq, :sk]).cpu()
        # The mask S encodes is the reference Philox's wherever a key is visible.
        for b in range(B):
            vis = visible_mask(lens_q[b], lens_k[b], *_eff(kw))
            got = dropped_s[b, :, :lens_q[b], :lens_k[b]]
            want = ~keep[b, :, :lens_q[b], :lens_k[b]]
            bad = vis & (got != want)
            assert not bad.any(), f"S's mask differs from Philox at {int(bad.sum())} places"
            assert (s_dmask[b, :, lens_q[b]:].cpu() == 0).all()
            assert (s_dmask[b, :, :, lens_k[b]:].cpu() == 0).all()
        extra = dict(dropout_keep=~dropped_s, dropout_scale=dropout_scale_ref(p))
    else:
        assert s_dmask is None
    qr, kr, vr = (t.detach().cpu() for t in (q, k, v))
    kw_ref = dict(kw, alibi_slopes=None if kw["alibi_slopes"] is None else kw["alibi_slopes"].cpu())
    ref, low = ref_and_lowp_ext(qr, kr, vr, dout.cpu(), None if sink is None else sink.cpu(),
                                None if cu is None else tuple(x.cpu() for x in cu),
                                out_used=out.detach().cpu(), **kw_ref, **extra)
    check_results(ours, ref, low, dtype)
    if sink is not None:
        assert_close("dsink", ours["dsink"], ref["dsink"], low["dsink"], torch.float32, 3.0,
                     ref["dsink"].abs().max().item())
    if p > 0:  # |S| = exp(s - m) (params.h), against the reference's; fp32 stored in dtype
        check_s_values(s_dmask, q, k, kw, None if cu is None else cu, sq, sk, dtype)
    return ours


def _eff(kw):
    left, right = kw["window_size"]
    return (left, 0 if kw["causal"] else right)


def check_s_values(s_dmask, q, k, kw, cu, sq, sk, dtype):
    """|S| (params.h: exp(s - m), m the row's max visible score, flash-attn's S for a single
    key block, see interface._get_block_size_n) against the float64 reference, with the
    float32 one rounded to dtype (S's storage) as the low-precision reference. Varlen: over
    the sequences' own (len_q, len_k) blocks, flattened and joined (run_case has checked the
    padding around them to be exactly 0, which is the reference there and adds nothing to
    either max error, so the verdict is that of the whole padded tensor; vl_nokeys' S is
    99.7% padding)."""
    kw_ref = dict(kw, alibi_slopes=None if kw["alibi_slopes"] is None else kw["alibi_slopes"].cpu())
    cu_cpu = None if cu is None else tuple(x.cpu() for x in cu)
    qc, kc = q.detach().cpu(), k.detach().cpu()
    ref = attn_probs_ref(qc, kc, cu_seqlens=cu_cpu, **kw_ref)
    low = attn_probs_ref(qc, kc, cu_seqlens=cu_cpu, compute_dtype=torch.float32,
                         **kw_ref).to(dtype)
    ours = s_dmask[:, :, :sq, :sk].abs()
    assert tuple(ours.shape) == tuple(ref.shape), (tuple(ours.shape), tuple(ref.shape))
    if cu_cpu is not None:
        lens = [(c[1:] - c[:-1]).tolist() for c in cu_cpu]
        ours = ours.cpu()

        def blocks(t):
            return torch.cat([t[b, :, :lq, :lk].flatten() for b, (lq, lk) in enumerate(zip(*lens))])

        ours, ref, low = blocks(ours), blocks(ref), blocks(low)
    assert_close("S", ours, ref, low, dtype, 2.0, scale=1.0)


def dropout_factors(device):
    return dict(
        dtype=dtypes_for(device),
        hd=HD,
        shape=list(SHAPES),
        causal=[False, True],
        window=["none", "sym", "left", "right"],
        softcap=[0.0, 2.0],
        alibi=["none", "h", "bh"],
        heads=["mha", "gqa", "mqa"],
        p=[0.17, 0.5, 0.9, 0.001],
        sink=[False, True],
    )


def feature_params(factors, seed):
    """pytest params of run_case: a covering set of factors(device) on every device."""
    out = []
    for device in DEVICES:
        for c in covering_set(factors(device), seed=seed):
            out.append(pytest.param(device, c, id=f"{device}-{case_id(c)}"))
    return out


@pytest.mark.parametrize("device,c", feature_params(dropout_factors, seed=1))
def test_dropout(device, c, seed):
    run_case(device, c, seed)


@pytest.mark.parametrize("device,c", cuda_case_params(dropout_factors, seed=2))
def test_dropout_sm90_forward(device, c, seed, monkeypatch):
    """The sm90 dropout forward (on by default; FLASHATTN_SM90_DROPOUT=0 turns it off),
    forced: the same checks as test_dropout (its S, out, lse, and the backward's gradients
    under the mask the forward drew). A call sm90 declines (head dims it has no kernel for,
    unaligned inputs) skips with the forced-sm90 reason."""
    monkeypatch.setenv("FLASHATTN_SM90_DROPOUT", "1")
    monkeypatch.setenv("FLASHATTN_FORCE_BACKEND", "sm90")
    run_case(device, c, seed)


def sm90_bwd_dropout_factors(device):
    """The calls the sm90 backward takes: head dims of its 64 / 128 buckets (multiples of 8),
    no softcap or ALiBi; with dropout always."""
    return dict(dropout_factors(device), hd=[(64, 64), (128, 128), (120, 120), (40, 40)],
                softcap=[0.0], alibi=["none"], p=[0.17, 0.5, 0.9])


def sm90_bwd_d256_dropout_factors(device):
    """The d 256 sm90 backward's dropout variant (kernel_bwd_d256_sm90.cuh, Has_dropout): the
    256 bucket's head dims, no softcap or ALiBi; with dropout always."""
    return dict(sm90_bwd_dropout_factors(device), hd=[(256, 256), (200, 200)])


@pytest.mark.parametrize("device,c", cuda_case_params(sm90_bwd_d256_dropout_factors, seed=5))
def test_dropout_sm90_backward_d256(device, c, seed, monkeypatch):
    """The d 256 sm90 dropout backward (the default since these passed on an H100, 2026-12-06;
    FLASHATTN_SM90_DROPOUT_BWD_D256=1 set here all the same), on the sm90 forward: the checks of
    test_dropout, with the op's own choice asserted to be the sm90 backward (skipped off
    Hopper)."""
    skip_unless_sm90()
    monkeypatch.setenv("FLASHATTN_SM90_DROPOUT_BWD_D256", "1")
    monkeypatch.setenv("FLASHATTN_FORCE_BACKEND", "sm90")
    run_case(device, c, seed, bwd_path="sm90")


@pytest.mark.parametrize("device,c", cuda_case_params(sm90_bwd_dropout_factors, seed=3))
def test_dropout_sm90_backward(device, c, seed, monkeypatch):
    """The sm90 dropout backward (the default on Hopper; FLASHATTN_SM90_DROPOUT_BWD=0 turns it
    off, =1 is set here), on the sm90 forward: the checks of test_dropout, with the
    op's own choice asserted to be the sm90 backward (skipped off Hopper)."""
    skip_unless_sm90()
    monkeypatch.setenv("FLASHATTN_SM90_DROPOUT_BWD", "1")
    monkeypatch.setenv("FLASHATTN_FORCE_BACKEND", "sm90")
    run_case(device, c, seed, bwd_path="sm90")


def test_philox_known_answers():
    """The reference Philox4x32 against Random123's kat_vectors: philox4x32 7 (the rounds the
    mask takes, PHILOX_ROUNDS) and philox4x32 10 (the same round function at Random123's
    default count)."""
    f = 0xFFFFFFFF
    pi = (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, 0xA4093822, 0x299F31D0)
    cases = {
        7: [((0, 0, 0, 0, 0, 0), (0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48)),
            ((f, f, f, f, f, f), (0x5207DDC2, 0x45165E59, 0x4D8EE751, 0x8C52F662)),
            (pi, (0x4DFCCABA, 0x190A87F0, 0xC47362BA, 0xB6B5242A))],
        10: [((0, 0, 0, 0, 0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
             ((f, f, f, f, f, f), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
             (pi, (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))],
    }
    assert PHILOX_ROUNDS == 7
    for rounds, vectors in cases.items():
        for args, want in vectors:
            assert tuple(int(x) for x in philox4x32_ref(*args, rounds=rounds)) == want


def _keep_per_cell(rng_state, batch, nheads, sq, sk, dropout_p, row0, col0):
    """dropout_keep_ref's mask computed cell by cell from philox.h's layout (one Philox call
    per cell), the literal statement that the reference's one call per 16-cell unit follows."""
    seed, offset = (int(x) & ((1 << 64) - 1) for x in rng_state.tolist())
    b, h, i, j = np.meshgrid(np.arange(batch), np.arange(nheads), np.arange(row0, row0 + sq),
                             np.arange(col0, col0 + sk), indexing="ij")
    r, c = i & 15, j & 15
    unit = 4 * ((r >> 1) & 3) + ((c >> 1) & 3)
    m32 = 0xFFFFFFFF
    words = philox4x32_ref(j >> 4, (i >> 4) * 16 + unit, ((offset & m32) + h) & m32,
                           ((offset >> 32) + b) & m32, seed & m32, seed >> 32)
    word = np.choose(((r & 1) << 1) | (r >> 3), words)
    byte = (word >> (np.uint64(8) * (((c >> 3) << 1) | (c & 1)).astype(np.uint64))) & np.uint64(255)
    return torch.from_numpy(byte >= dropout_threshold_ref(dropout_p))


@pytest.mark.parametrize("shape", [(2, 3, 37, 53, 0, 0), (1, 2, 16, 16, 0, 0),
                                   (2, 2, 19, 41, 7, 23), (1, 1, 1, 1, 1000, 517),
                                   (3, 1, 0, 5, 0, 0), (1, 2, 5, 0, 3, 0)])
def test_keep_ref_layout(shape):
    """dropout_keep_ref (one Philox call per 16-cell unit, scattered) equals the mask computed
    cell by cell from philox.h's layout, bit for bit, with position offsets too."""
    rng = torch.randint(-(2 ** 63), 2 ** 63 - 1, (2,), dtype=torch.int64)
    for p in (0.001, 0.3, 0.9):
        got = dropout_keep_ref(rng, *shape[:4], p, *shape[4:])
        want = _keep_per_cell(rng, *shape[:4], p, *shape[4:])
        assert got.dtype == torch.bool and got.shape == want.shape == shape[:4]
        assert torch.equal(got, want)


def test_threshold_rule():
    """params.h's quantisation of p (the reference's copy of it is what the other tests use)."""
    assert dropout_threshold_ref(0.0) == 0
    assert dropout_threshold_ref(1e-6) == 1
    assert dropout_threshold_ref(0.1) == 26
    assert dropout_threshold_ref(0.5) == 128
    assert dropout_threshold_ref(0.999) == 255


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 0.001])
def test_kept_fraction(device, p):
    """The kept fraction over ~2M visible entries is 1 - p_q within 6 binomial standard
    deviations (p_q = round(p * 256) / 256, at least 1/256: 0.1 -> 0.1016, detectable here),
    overall and per column position within the 16-column Philox groups and per head."""
    B, S, H, d = 2, 512, 4, 32
    q = rand([B, S, H, d], torch.bfloat16, device)
    k, v = rand([B, S, H, d], torch.bfloat16, device), rand([B, S, H, d], torch.bfloat16, device)
    _, _, s_dmask = flashattn.flash_attn_func(q, k, v, dropout_p=p, return_attn_probs=True)
    kept = ~torch.signbit(s_dmask).cpu()
    pq = dropout_threshold_ref(p) / 256

    def check(frac, n, what):
        bound = 6 * math.sqrt(pq * (1 - pq) / n)
        assert abs(frac - (1 - pq)) <= bound, f"{what}: kept {frac:.5f}, want {1 - pq:.5f} ± {bound:.5f}"

    check(kept.double().mean().item(), kept.numel(), "all")
    cols = kept.view(B, H, S, S // 16, 16).double()
    for c in range(16):
        check(cols[..., c].mean().item(), cols[..., c].numel(), f"column {c} of 16")
    for h in range(H):
        check(kept[:, h].double().mean().item(), kept[:, h].numel(), f"head {h}")


@pytest.mark.parametrize("device", DEVICES)
def test_seeds(device):
    """torch.manual_seed reproduces a call bit for bit (out and gradients); another seed gives
    another mask; successive calls draw fresh masks; heads and batches differ."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    B, S, H, d = 2, 67, 3, 40
    q, k, v = (rand([B, S, H, d], dtype, device).requires_grad_() for _ in range(3))

    def call(seed):
        if seed is not None:
            torch.manual_seed(seed)
        out, _, s_dmask = flashattn.flash_attn_func(q, k, v, dropout_p=0.3, causal=True,
                                                    return_attn_probs=True)
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        return out, torch.signbit(s_dmask), grads

    o1, m1, g1 = call(1234)
    o2, m2, g2 = call(1234)
    assert torch.equal(o1, o2) and torch.equal(m1, m2)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))
    _, m3, _ = call(1235)
    _, m4, _ = call(None)
    vis = visible_mask(S, S, -1, 0, device=m1.device)
    pad = torch.zeros_like(m1[0, 0])
    pad[:S, :S] = vis
    for other in (m3, m4):
        assert (m1 != other)[..., pad].any()
    assert (m1[0, 0] != m1[0, 1])[pad].any() and (m1[0, 0] != m1[1, 0])[pad].any()


@pytest.mark.parametrize("device", DEVICES)
def test_mask_is_independent_of_layout(device):
    """The mask is a function of (seed, offset, batch, head, row, column): the same rng_state
    gives a padded batch and its varlen copy the same outputs (the ops called directly)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    B, S, H, d = 3, 71, 2, 24
    q, k, v = (rand([B, S, H, d], dtype, device) for _ in range(3))
    rng = torch.tensor([123456789, -987654321], dtype=torch.int64, device=device)
    opts = dict(softmax_scale=d ** -0.5, causal=True, window_left=-1, window_right=0,
                softcap=0.0, alibi_slopes=None, dropout_p=0.25, rng_state=rng)
    out_p, _ = torch.ops.flashattn.fwd(q, k, v, **opts)
    cu = _cu([S] * B, device)
    out_v, _ = torch.ops.flashattn.varlen_fwd(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1),
                                              cu, cu, S, S, **opts)
    assert torch.equal(out_p.flatten(0, 1), out_v)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_arguments(device):
    q = rand([1, 5, 2, 16], torch.bfloat16, device)
    for p in (1.0, -0.1, float("nan")):
        with pytest.raises(RuntimeError, match=r"dropout_p must be in \[0, 1\)"):
            flashattn.flash_attn_func(q, q, q, dropout_p=p)
    opts = (0.25, False, -1, -1, 0.0, None)
    with pytest.raises(RuntimeError, match="dropout_p > 0 needs rng_state"):
        torch.ops.flashattn.fwd(q, q, q, *opts, dropout_p=0.5)
    for bad, msg in ((torch.zeros(2, dtype=torch.int32, device=device), "int64"),
                     (torch.zeros(3, dtype=torch.int64, device=device), r"shape \(2,\)")):
        with pytest.raises(RuntimeError, match=f"rng_state must .*{msg}"):
            torch.ops.flashattn.fwd(q, q, q, *opts, dropout_p=0.5, rng_state=bad)
    # flash_attn_with_kvcache has no dropout (as in flash-attn): no such argument.
    with pytest.raises(TypeError):
        flashattn.flash_attn_with_kvcache(q, q, q, dropout_p=0.1)


def _sm90_dropout_on(direction):
    """launch_fwd_sm90.cuh / launch_bwd_sm90.cuh's switches, read per call: the sm90 dropout
    forward and backward are on unless FLASHATTN_SM90_DROPOUT=0 / FLASHATTN_SM90_DROPOUT_BWD=0."""
    name = "FLASHATTN_SM90_DROPOUT" if direction == "fwd" else "FLASHATTN_SM90_DROPOUT_BWD"
    return os.environ.get(name) != "0"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("switch", [None, "0", "1"])
def test_kernel_path(device, switch, monkeypatch):
    """CPU runs dropout and sinks; on CUDA a dropout call runs where the call without it would
    when that is sm90 and its sm90 dropout kernel is switched on, else on the sm80 kernels
    (the decode kernels have none); a sink wherever the call would run without it."""
    for name in ("FLASHATTN_SM90_DROPOUT", "FLASHATTN_SM90_DROPOUT_BWD"):
        if switch is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, switch)
    q = rand([1, 8, 2, 64], torch.bfloat16, device)
    sink = torch.zeros(2, device=device)
    for direction in ("fwd", "bwd"):
        plain = flashattn.kernel_path(q, q, q, direction=direction)
        for kw in (dict(dropout_p=0.1), dict(learnable_sink=sink)):
            path = flashattn.kernel_path(q, q, q, direction=direction, **kw)
            if device == "cpu":
                assert path == "cpu"
            elif "dropout_p" in kw:
                sm90 = plain == "sm90" and _sm90_dropout_on(direction)
                assert path == "sm90" if sm90 else path in ("sm80", "sm80-ptx"), \
                    (direction, switch, path, plain)
            else:
                assert path == plain, (path, plain)


# opcheck and torch.compile ---------------------------------------------------------------

def _op_args(device, varlen, sink):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    H, Hk, d = 4, 2, 24
    rng = torch.tensor([42, 7], dtype=torch.int64, device=device)
    s = torch.randn(H, device=device) if sink else None
    feats = dict(dropout_p=0.3, rng_state=rng, learnable_sink=s)
    opts = (d ** -0.5, True, -1, 0, 0.0, None)
    if not varlen:
        q, k, v = rand([2, 37, H, d], dtype, device), rand([2, 45, Hk, d], dtype, device), \
            rand([2, 45, Hk, d], dtype, device)
        return (q, k, v), (), opts, feats
    lq, lk = [5, 0, 33], [9, 3, 40]
    q, k, v = rand([sum(lq), H, d], dtype, device), rand([sum(lk), Hk, d], dtype, device), \
        rand([sum(lk), Hk, d], dtype, device)
    return (q, k, v), (_cu(lq, device), _cu(lk, device), max(lq), max(lk)), opts, feats


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("varlen", [False, True], ids=["padded", "varlen"])
@pytest.mark.parametrize("sink", [False, True], ids=["nosink", "sink"])
def test_opcheck(device, varlen, sink):
    ops = torch.ops.flashattn
    (q, k, v), meta, opts, feats = _op_args(device, varlen, sink)
    fwd, bwd = (ops.varlen_fwd, ops.varlen_bwd) if varlen else (ops.fwd, ops.bwd)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    if sink:
        feats["learnable_sink"].requires_grad_()
    torch.library.opcheck(fwd.default, (q, k, v, *meta, *opts), feats)
    q, k, v = (t.detach() for t in (q, k, v))
    if sink:
        feats["learnable_sink"] = feats["learnable_sink"].detach()
    out, lse = fwd(q, k, v, *meta, *opts, **feats)
    dout = torch.randn_like(out)
    torch.library.opcheck(bwd.default, (dout, q, k, v, out, lse, *meta, *opts, False), feats)
    cu = meta[:2] if varlen else (None, None)
    mx = meta[2:] if varlen else (q.shape[1], k.shape[1])
    torch.library.opcheck(ops.attn_probs.default, (q, k, v, lse, *cu, *mx, *opts), feats)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile(device, backend):
    """flash_attn_func / flash_attn_varlen_func with dropout and a sink under
    torch.compile(fullgraph=True, dynamic=True): no graph break; with the eager RNG
    (inductor's fallback_random) the same numbers as eager for the same torch.manual_seed."""
    import torch._inductor.config as inductor_config

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    H, d = 4, 32
    sink = torch.randn(H, device=device).requires_grad_()
    q, k, v = (rand([2, 53, H, d], dtype, device).requires_grad_() for _ in range(3))
    cu = _cu([20, 0, 33], device)

    def f(q, k, v, sink):
        o = flashattn.flash_attn_func(q, k, v, dropout_p=0.2, causal=True, learnable_sink=sink)
        ov = flashattn.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 33, 33, dropout_p=0.4,
                                              learnable_sink=sink)
        # In fp32: a bf16 scalar sum rounds differently when inductor fuses it (1 ulp).
        return o.float().sum() + ov.float().square().sum()

    def run(fn):
        torch.manual_seed(99)
        loss = fn(q, k, v, sink)
        return (loss,) + torch.autograd.grad(loss, (q, k, v, sink))

    with inductor_config.patch(fallback_random=True):
        compiled = torch.compile(f, fullgraph=True, dynamic=True, backend=backend)
        got = run(compiled)
    want = run(f)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)

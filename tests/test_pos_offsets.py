"""The ops' position offsets (issue 17, params.h): q_pos_offset / k_pos_offset int32 (batch,)
put sequence b's query row i and key j at positions i + q_pos_offset[b], j + k_pos_offset[b]
for the causal / window mask, ALiBi and the dropout mask (the diagonal shift stays the call's
sk - sq). Ring attention calls chunk pairs of a long sequence so.

Checked: out, lse and the gradients of q, k, v (and the sink) against the float64 reference
with the same positions (reference.py's pos_offset, dropout_keep_ref's row0 / col0), padded with
a different offset per batch and varlen with one per sequence (a zero-length one among them),
odd and unequal lengths, GQA, causal / window / ALiBi / dropout / softcap / sink; a block of a
longer self-attention computed with offsets equals that block's rows of the full call; zero
offsets equal none bit for bit; argument errors; opcheck. On CUDA the main kernels take the
offsets in their mask and ALiBi; dropout's keep mask takes them in the sm90 kernels only:
offsets that are multiples of 16 shift whole 16 x 16 mask blocks, others take the kernels'
cell-by-cell path (dropout_lanes.cuh); the dropout cases mix both in one call (one sequence
aligned, one not) and reach the sm90 kernels at d 64 / 128 / 256 (fwd and bwd). A dropout call
whose forward or backward would run an sm80 kernel (other GPUs, head dims sm90 leaves to sm80,
dropout with softcap / ALiBi or deterministic=True in the backward) must raise "dropout with
position offsets ... runs on the sm90 (Hopper) kernels only" there: checked, as is that nothing
else raises it (kernel_path tells which backend a call takes). The padded cases' "det" variants
run deterministic=True: on Hopper through the sm90 backward's deterministic variant for its
plain calls (the default there; FLASHATTN_SM90_DET_BWD=1 is set all the same), through the
sm80 deterministic backward for the rest.
"""
import pytest
import torch

import flashattn
from helpers import DEVICES, alibi_slopes, assert_close, check_results, rand
from reference import dropout_keep_ref, dropout_scale_ref, ref_and_lowp_ext

ops = torch.ops.flashattn
I32 = torch.int32

# (sq, sk, heads, d, causal, window, alibi, dropout, softcap, sink, offsets per batch (q, k))
PADDED = [
    (13, 13, (4, 2), 32, True, (-1, -1), "h", 0.2, 0.0, False, [(20, 3), (7, 7)]),
    (17, 9, (2, 1), 40, False, (5, 3), "bh", 0.0, 2.0, True, [(0, 30), (45, 2)]),
    (9, 23, (3, 3), 16, True, (6, -1), None, 0.3, 0.0, False, [(33, 1), (16, 48)]),
    (31, 31, (4, 1), 24, False, (-1, -1), "bh", 0.25, 0.0, True, [(31, 0), (0, 62)]),
    # Without dropout: the mask and ALiBi at the positions
    (13, 13, (4, 2), 32, True, (-1, -1), "h", 0.0, 0.0, False, [(20, 3), (7, 7)]),
    (150, 200, (2, 2), 64, False, (40, 25), "bh", 0.0, 0.0, True, [(300, 10), (0, 170)]),
    (70, 70, (4, 1), 128, True, (30, -1), None, 0.0, 0.0, False, [(140, 0), (64, 200)]),
    # Dropout on the sm90 buckets: one batch's offsets multiples of 16 (whole mask blocks), the
    # other's not (the cell-by-cell path), in one call (d 96 with softcap / ALiBi: the sm80
    # backward's named error on CUDA)
    (150, 200, (2, 2), 64, False, (40, 25), None, 0.15, 0.0, True, [(304, 16), (3, 170)]),
    (70, 70, (4, 1), 128, True, (30, -1), None, 0.2, 0.0, False, [(140, 0), (64, 208)]),
    (65, 130, (2, 1), 256, True, (-1, -1), None, 0.1, 0.0, False, [(16, 32), (5, 0)]),
    (100, 100, (2, 2), 96, False, (-1, -1), "h", 0.25, 3.0, False, [(0, 48), (77, 9)]),
]
# (lens, heads, d, causal, window, alibi, dropout, sink, offsets per sequence (q, k))
VARLEN = [
    ([7, 0, 12], (4, 2), 32, True, (-1, -1), "bh", 0.2, False, [(14, 0), (5, 5), (0, 36)]),
    ([5, 9], (2, 1), 24, False, (4, 2), "h", 0.0, True, [(10, 15), (27, 9)]),
    ([11, 3, 6], (3, 3), 16, True, (7, -1), None, 0.3, False, [(22, 11), (0, 0), (6, 18)]),
    ([7, 0, 140], (4, 2), 64, True, (-1, -1), "bh", 0.0, False, [(14, 0), (5, 5), (0, 36)]),
    ([90, 33], (2, 2), 128, False, (20, 10), None, 0.0, True, [(60, 0), (0, 90)]),
    ([7, 0, 140], (4, 2), 64, True, (-1, -1), None, 0.1, False, [(16, 0), (5, 5), (32, 48)]),
    ([90, 33], (2, 2), 128, False, (20, 10), None, 0.25, True, [(64, 0), (3, 90)]),
]


def _rng():
    return torch.randint(-(2 ** 62), 2 ** 62, (2,), dtype=torch.int64)


# The error of a CUDA dropout call with offsets that an sm80 kernel would run (backend_choice.h).
SM80_DROPOUT_OFFSETS = r"dropout with position offsets .* runs on the sm90 \(Hopper\) kernels only"


def _sm80_dropout(device, p, q, k, v, det=False, **kw):
    """(fwd, bwd): whether a CUDA dropout call with these arguments would run an sm80 kernel
    in that direction, where the op must raise SM80_DROPOUT_OFFSETS (kernel_path's answer; its
    "bwd" assumes deterministic=False, and deterministic dropout backwards run sm80)."""
    if device != "cuda" or not p:
        return False, False
    fwd = flashattn.kernel_path(q, k, v, dropout_p=p, **kw)
    bwd = flashattn.kernel_path(q, k, v, direction="bwd", dropout_p=p, **kw)
    return fwd.startswith("sm80"), bwd.startswith("sm80") or det


def _dt(device):
    return torch.float32 if device == "cpu" else torch.bfloat16


def _det_env(device, det, monkeypatch):
    """det: deterministic=True (the CPU always is). On CUDA the sm90 backward's deterministic
    variant (Hopper, its plain calls; the default there, FLASHATTN_SM90_DET_BWD=1 set all the
    same) or the sm80 deterministic backward (every other call) runs it."""
    if det and device == "cuda":
        monkeypatch.setenv("FLASHATTN_SM90_DET_BWD", "1")


@pytest.mark.parametrize("det", [False, True], ids=["", "det"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", PADDED, ids=lambda c: f"{c[0]}x{c[1]}")
def test_padded_matches_reference(device, case, det, monkeypatch):
    sq, sk, (H, Hk), d, causal, window, alibi, p, softcap, sink, offsets = case
    _det_env(device, det, monkeypatch)
    B = len(offsets)
    q, k, v = (rand([B, n, h, d], _dt(device), device) for n, h in ((sq, H), (sk, Hk), (sk, Hk)))
    dout = rand([B, sq, H, d], _dt(device), device)
    slopes = alibi_slopes(alibi, B, H, device)
    s = torch.randn(H, device=device) if sink else None
    rng = _rng().to(device)
    qo = torch.tensor([o[0] for o in offsets], dtype=I32, device=device)
    ko = torch.tensor([o[1] for o in offsets], dtype=I32, device=device)
    wl, wr = window[0], 0 if causal else window[1]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)] + (
        [s.clone().requires_grad_()] if sink else [])

    def call():
        return ops.fwd(*leaves[:3], d ** -0.5, causal, wl, wr, softcap, slopes, deterministic=det,
                       dropout_p=p, rng_state=rng if p else None,
                       learnable_sink=leaves[3] if sink else None, q_pos_offset=qo,
                       k_pos_offset=ko)
    fwd80, bwd80 = _sm80_dropout(device, p, q, k, v, det, softmax_scale=d ** -0.5, causal=causal,
                                 window_size=window, softcap=softcap, alibi_slopes=slopes,
                                 learnable_sink=s)
    if fwd80:
        with pytest.raises(RuntimeError, match=SM80_DROPOUT_OFFSETS):
            call()
        return
    out, lse = call()
    if bwd80:
        with pytest.raises(RuntimeError, match=SM80_DROPOUT_OFFSETS):
            torch.autograd.grad(out, leaves, dout)
        return
    grads = torch.autograd.grad(out, leaves, dout)
    ours = dict(out=out, lse=lse, dq=grads[0], dk=grads[1], dv=grads[2])
    scale = dropout_scale_ref(p)
    refs, lows = [], []
    for b, (a, c) in enumerate(offsets):  # the reference takes one offset pair per call
        kw = dict(causal=causal, window_size=window, softcap=softcap, pos_offset=(a, c),
                  alibi_slopes=None if slopes is None else (slopes if slopes.dim() == 1
                                                            else slopes[b:b + 1]))
        if p:  # batch b draws with batch index b (params.h)
            kw.update(dropout_keep=dropout_keep_ref(rng.cpu(), b + 1, H, sq, sk, p, a, c)[b:b + 1],
                      dropout_scale=scale, out_used=out[b:b + 1].detach())
        r, lo = ref_and_lowp_ext(q[b:b + 1], k[b:b + 1], v[b:b + 1], dout[b:b + 1],
                                 s, **kw)
        refs.append(r)
        lows.append(lo)
    cat = {n: (1 if n == "dsink" else 0) for n in ("out", "lse", "dq", "dk", "dv")}
    ref = {n: torch.cat([r[n] for r in refs], dim) for n, dim in cat.items()}
    low = {n: torch.cat([r[n] for r in lows], dim) for n, dim in cat.items()}
    check_results(ours, ref, low, _dt(device))
    if sink:
        dsink_ref = sum(r["dsink"] for r in refs)
        dsink_low = sum(r["dsink"] for r in lows)
        assert_close("dsink", grads[3], dsink_ref, dsink_low, _dt(device), 3.0,
                     dsink_ref.abs().max().item())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", VARLEN, ids=lambda c: "_".join(map(str, c[0])))
def test_varlen_matches_reference(device, case):
    lens, (H, Hk), d, causal, window, alibi, p, sink, offsets = case
    T = sum(lens)
    q, k, v, dout = (rand([T, h, d], _dt(device), device) for h in (H, Hk, Hk, H))
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=I32, device=device)
    slopes = alibi_slopes(alibi, len(lens), H, device)
    s = torch.randn(H, device=device) if sink else None
    rng = _rng().to(device)
    qo = torch.tensor([o[0] for o in offsets], dtype=I32, device=device)
    ko = torch.tensor([o[1] for o in offsets], dtype=I32, device=device)
    wl, wr = window[0], 0 if causal else window[1]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)] + (
        [s.clone().requires_grad_()] if sink else [])

    def call():
        return ops.varlen_fwd(*leaves[:3], cu, cu, max(lens), max(lens), d ** -0.5, causal, wl,
                              wr, 0.0, slopes, dropout_p=p, rng_state=rng if p else None,
                              learnable_sink=leaves[3] if sink else None, q_pos_offset=qo,
                              k_pos_offset=ko)
    fwd80, bwd80 = _sm80_dropout(device, p, q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                 max_seqlen_q=max(lens), max_seqlen_k=max(lens),
                                 softmax_scale=d ** -0.5, causal=causal, window_size=window,
                                 alibi_slopes=slopes, learnable_sink=s)
    if fwd80:
        with pytest.raises(RuntimeError, match=SM80_DROPOUT_OFFSETS):
            call()
        return
    out, lse = call()
    if bwd80:
        with pytest.raises(RuntimeError, match=SM80_DROPOUT_OFFSETS):
            torch.autograd.grad(out, leaves, dout)
        return
    grads = torch.autograd.grad(out, leaves, dout)
    ours = dict(out=out, lse=lse, dq=grads[0], dk=grads[1], dv=grads[2])
    scale = dropout_scale_ref(p)
    bounds = list(zip(cu.tolist(), cu.tolist()[1:]))
    refs, lows = [], []
    for b, ((x0, x1), (a, c)) in enumerate(zip(bounds, offsets)):
        n = x1 - x0
        kw = dict(causal=causal, window_size=window, pos_offset=(a, c),
                  alibi_slopes=None if slopes is None else (slopes if slopes.dim() == 1
                                                            else slopes[b:b + 1]))
        if p:  # sequence b draws with batch index b (params.h)
            kw.update(dropout_keep=dropout_keep_ref(rng.cpu(), b + 1, H, n, n, p, a, c)[b:b + 1],
                      dropout_scale=scale, out_used=out[None, x0:x1].detach())
        r, lo = ref_and_lowp_ext(q[None, x0:x1], k[None, x0:x1], v[None, x0:x1],
                                 dout[None, x0:x1], s, **kw)
        refs.append(r)
        lows.append(lo)

    def cat(rs, n):
        return torch.cat([r[n][0] for r in rs], 1 if n == "lse" else 0)

    names = ("out", "lse", "dq", "dk", "dv")
    check_results(ours, {n: cat(refs, n) for n in names}, {n: cat(lows, n) for n in names},
                  _dt(device))
    if sink:
        dsink_ref = sum(r["dsink"] for r in refs)
        assert_close("dsink", grads[3], dsink_ref, sum(r["dsink"] for r in lows), _dt(device),
                     3.0, dsink_ref.abs().max().item())


@pytest.mark.parametrize("n,d", [(19, 32), (32, 64), (40, 128)], ids=["19", "32", "40"])
@pytest.mark.parametrize("p", [0.3, 0.0])
@pytest.mark.parametrize("device", DEVICES)
def test_block_of_a_longer_sequence(device, p, n, d):
    # Square blocks (the diagonal shift sk - sq stays the call's, params.h): rows [a, a + n) of
    # a causal self-attention over S = 3 n against each key block [c, c + n), merged over the
    # blocks, are the full call's rows: ALiBi, dropout and the causal mask all at the global
    # positions. n = 19 and 40 are not multiples of the dropout mask's 16 x 16 blocks (offsets
    # n, 2 n: the cell-by-cell path on CUDA), 32 is (whole blocks); d 64 / 128 reach sm90.
    H = 2
    S = 3 * n
    q, k, v = (rand([1, S, H, d], _dt(device), device) for _ in range(3))
    slopes = torch.rand(H, device=device) * 0.3 + 0.05
    rng = _rng().to(device) if p else None
    if _sm80_dropout(device, p, q[:, :n], k[:, :n], v[:, :n], softmax_scale=0.2, causal=True,
                     alibi_slopes=slopes)[0]:
        with pytest.raises(RuntimeError, match=SM80_DROPOUT_OFFSETS):
            one = torch.tensor([n], dtype=I32, device=device)
            ops.fwd(q[:, :n], k[:, :n], v[:, :n], 0.2, True, -1, 0, 0.0, slopes, dropout_p=p,
                    rng_state=rng, q_pos_offset=one, k_pos_offset=one)
        return
    full, full_lse = ops.fwd(q, k, v, 0.2, True, -1, 0, 0.0, slopes, dropout_p=p, rng_state=rng)
    for a in (n, 2 * n):
        outs, lses = [], []
        for c in (0, n, 2 * n):
            o, lse = ops.fwd(q[:, a:a + n], k[:, c:c + n], v[:, c:c + n], 0.2, True, -1, 0, 0.0,
                             slopes, dropout_p=p, rng_state=rng,
                             q_pos_offset=torch.tensor([a], dtype=I32, device=device),
                             k_pos_offset=torch.tensor([c], dtype=I32, device=device))
            if c > a:  # a key block after the rows: hidden
                assert torch.equal(lse, torch.full_like(lse, float("-inf")))
                assert torch.equal(o, torch.zeros_like(o))
            outs.append(o)
            lses.append(lse)
        merged, merged_lse = flashattn.distributed.merge_attn_partials(outs, lses)
        # fp32 on CPU; bf16 on CUDA, where the blocks' outputs are rounded before the merge
        tol = 1e-5 if device == "cpu" else 2e-2
        torch.testing.assert_close(merged_lse, full_lse[:, :, a:a + n], rtol=0,
                                   atol=1e-5 if device == "cpu" else 2e-3)
        torch.testing.assert_close(merged, full[:, a:a + n].float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("p", [0.2, 0.0])
@pytest.mark.parametrize("device", DEVICES)
def test_zero_offsets_equal_none(device, p):
    q, k, v = (rand([2, 21, 2, 32], _dt(device), device) for _ in range(3))
    slopes = torch.rand(2, device=device)
    rng = _rng().to(device)
    z = torch.zeros(2, dtype=I32, device=device)
    args = (q, k, v, 0.3, True, 5, 0, 0.0, slopes)
    if _sm80_dropout(device, p, q, k, v, softmax_scale=0.3, causal=True, window_size=(5, 0),
                     alibi_slopes=slopes)[0]:
        with pytest.raises(RuntimeError, match=SM80_DROPOUT_OFFSETS):
            ops.fwd(*args, dropout_p=p, rng_state=rng, q_pos_offset=z, k_pos_offset=z)
        return
    a = ops.fwd(*args, dropout_p=p, rng_state=rng if p else None)
    b = ops.fwd(*args, dropout_p=p, rng_state=rng if p else None, q_pos_offset=z,
                k_pos_offset=z)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_argument_errors():
    q = torch.randn(2, 8, 2, 16)
    args = (q, q, q, 0.25, False, -1, -1, 0.0, None)
    good = torch.zeros(2, dtype=I32)
    with pytest.raises(RuntimeError, match=r"q_pos_offset must have shape \(batch,\) = \(2,\)"):
        ops.fwd(*args, q_pos_offset=torch.zeros(3, dtype=I32))
    with pytest.raises(RuntimeError, match="k_pos_offset must have dtype int32"):
        ops.fwd(*args, q_pos_offset=good, k_pos_offset=good.long())
    with pytest.raises(RuntimeError, match="k_pos_offset must be contiguous"):
        ops.fwd(*args, k_pos_offset=torch.zeros(4, dtype=I32)[::2])
    with pytest.raises(RuntimeError, match="window_size with q_pos_offset"):
        ops.fwd(q, q, q, 0.25, False, 2 ** 31 - 1, -1, 0.0, None, q_pos_offset=good)
    t = torch.randn(8, 2, 16)
    cu = torch.tensor([0, 3, 8], dtype=I32)
    with pytest.raises(RuntimeError, match=r"q_pos_offset must have shape \(batch,\) = \(2,\) "
                                           r"\(varlen: one offset per sequence\)"):
        ops.varlen_fwd(t, t, t, cu, cu, 5, 5, 0.25, False, -1, -1, 0.0, None,
                       q_pos_offset=torch.zeros(1, dtype=I32))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    q, k, v = (rand([2, 9, 2, 16], _dt(device), device).requires_grad_() for _ in range(3))
    qo = torch.tensor([4, 30], dtype=I32, device=device)
    ko = torch.tensor([9, 0], dtype=I32, device=device)
    opts = (0.25, True, 3, 0, 0.0, torch.rand(2, device=device))
    kw = dict(q_pos_offset=qo, k_pos_offset=ko)
    torch.library.opcheck(ops.fwd.default, (q, k, v, *opts), kw)
    out, lse = ops.fwd(q.detach(), k.detach(), v.detach(), *opts, **kw)
    torch.library.opcheck(ops.bwd.default, (torch.randn_like(out), q.detach(), k.detach(),
                                            v.detach(), out, lse, *opts, False), kw)
    t = rand([10, 2, 16], _dt(device), device)
    cu = torch.tensor([0, 4, 10], dtype=I32, device=device)
    vargs = (t, t, t, cu, cu, 6, 6, *opts)
    torch.library.opcheck(ops.varlen_fwd.default, vargs, kw)
    out, lse = ops.varlen_fwd(*vargs, **kw)
    torch.library.opcheck(ops.varlen_bwd.default, (torch.randn_like(out), t, t, t, out, lse, cu,
                                                   cu, 6, 6, *opts, False), kw)

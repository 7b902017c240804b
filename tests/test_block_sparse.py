"""Block-sparse attention (issue 16, params.h): block_sparse_attn_func's out, softmax_lse and
the gradients of q, k, v (and the sink) against the float64 reference with the block mask
expanded to elements, over a covering set (mask densities from none to all kept, both mask
forms and broadcasts, block sizes 128x128 / 64x64 / non-square, odd lengths ending inside a
block, causal / window / GQA / softcap / ALiBi / dropout / sinks); rows with every tile
dropped; dropped tiles never read; bad masks; clamped metadata; opcheck; torch.compile.

On CUDA the sm80 block-sparse kernels run, and on Hopper the sm90 ones for padded calls whose
blocks are whole 128 x 128 tiles (test_block_sparse_sm90_forward forces them); the sm80 tiles
must nest in the mask's blocks or take the unit path (test_block_sparse_cuda_kernels).
"""
import pytest
import torch

import flashattn
from helpers import (DEVICES, DTYPES, HEADS, alibi_slopes, assert_close, case_id, check_results,
                     covering_set, cuda_case_params, dtypes_for, rand, skip_if_no_kernel)
from reference import (attn_probs_ref, block_mask_elements, dropout_keep_ref,
                       dropout_scale_ref, ref_and_lowp_ext)

SHAPES = {"113x203": (113, 203), "300x257": (300, 257), "1x239": (1, 239), "239x1": (239, 1),
          "128x128": (128, 128), "200x77": (200, 77)}
# Shapes of the dedicated cases only (not in the covering sets' factors).
EXTRA_SHAPES = {"1100x1100": (1100, 1100)}
BLOCKS = {"128x128": (128, 128), "64x64": (64, 64), "64x128": (64, 128), "128x32": (128, 32)}
HD = [(32, 32), (59, 59), (64, 64), (128, 128), (96, 64)]
# Blocks of whole sm90 block-sparse tiles (128 x 128): test_block_sparse_sm90_forward.
SM90_BLOCKS = {"128x128": (128, 128), "256x128": (256, 128), "128x256": (128, 256)}


def _nblocks(sq, sk, bs):
    return (sq + bs[0] - 1) // bs[0], (sk + bs[1] - 1) // bs[1]


def make_mask(density, shape, device):
    """Dense bool block mask of `shape` (B', H', nq, nk)."""
    if density == "all":
        return torch.ones(shape, dtype=torch.bool, device=device)
    if density == "none":
        return torch.zeros(shape, dtype=torch.bool, device=device)
    if density == "localglobal":  # a band of 3 blocks plus key block 0 kept by every row
        nq, nk = shape[-2:]
        qi = torch.arange(nq, device=device)[:, None] * nk // max(nq, 1)
        kj = torch.arange(nk, device=device)[None, :]
        return (((kj - qi).abs() <= 1) | (kj == 0)).expand(shape).contiguous()
    frac = {"half": 0.5, "sparse": 0.2, "emptyrows": 0.6}[density]
    m = torch.rand(shape, device=device) < frac
    if density == "emptyrows":  # the first and last query-block rows keep nothing
        m[..., 0, :] = False
        m[..., -1, :] = False
    return m


def compress(dense, garbage=True):
    """The compressed pair of a dense mask, written independently of flashattn's: kept indices
    in a random order, then (garbage) out-of-range junk in the unused tail."""
    num = dense.sum(-1, dtype=torch.int32)
    nk = dense.shape[-1]
    keys = torch.rand(dense.shape, device=dense.device) + (~dense).float() * 2  # kept first
    idx = keys.argsort(-1).to(torch.int32)
    if garbage and nk > 0:
        junk = torch.randint(-5, nk + 5, dense.shape, dtype=torch.int32, device=dense.device)
        tail = torch.arange(nk, device=dense.device) >= num[..., None]
        idx = torch.where(tail, junk, idx)
    return num.contiguous(), idx.contiguous()


def _window(kind, sk):
    m = max(1, sk)
    return {"none": (-1, -1), "sym": (m // 2 + 3, m // 3), "left": (m // 3 + 1, -1)}[kind]


def run_case(device, c, seed):
    dtype = DTYPES[c["dtype"]]
    d, dv = c["hd"]
    H, Hk = HEADS[c["heads"]]
    p = c["p"]
    skip_if_no_kernel(device, dtype, d, dv)
    sq, sk = {**SHAPES, **EXTRA_SHAPES}[c["shape"]]
    bs = {**BLOCKS, **SM90_BLOCKS}[c["block"]]
    B = 2
    nq, nk = _nblocks(sq, sk, bs)
    mb, mh = {"bh": (B, H), "b1": (B, 1), "11": (1, 1)}[c["bcast"]]
    dense = make_mask(c["density"], (mb, mh, nq, nk), device)
    block_mask = dense if c["form"] == "dense" else compress(dense)
    q, dout = rand([B, sq, H, d], dtype, device), rand([B, sq, H, dv], dtype, device)
    k, v = rand([B, sk, Hk, d], dtype, device), rand([B, sk, Hk, dv], dtype, device)
    sink = (torch.randn(H, device=device) * 2).requires_grad_() if c["sink"] else None
    kw = dict(causal=c["causal"], window_size=_window(c["window"], sk), softcap=c["softcap"],
              alibi_slopes=alibi_slopes(c["alibi"], B, H, device))
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    torch.manual_seed(seed + 1)
    out, lse, s_dmask = flashattn.block_sparse_attn_func(
        qg, kg, vg, block_mask, bs, dropout_p=p, return_attn_probs=True, learnable_sink=sink,
        **kw)
    leaves = (qg, kg, vg) + ((sink,) if sink is not None else ())
    grads = torch.autograd.grad(out, leaves, dout)
    ours = dict(zip(("dq", "dk", "dv", "dsink"), grads), out=out, lse=lse)
    extra = {}
    if p > 0:
        torch.manual_seed(seed + 1)  # the draw block_sparse_attn_func made
        rng = flashattn.interface._rng_state(q, p).cpu()
        extra = dict(dropout_keep=dropout_keep_ref(rng, B, H, sq, sk, p),
                     dropout_scale=dropout_scale_ref(p))
        kept = block_mask_elements(dense, bs, sq, sk).expand(B, H, sq, sk)
        assert (s_dmask[:, :, :sq, :sk][~kept] == 0).all(), "S is nonzero on a dropped tile"
        # |S| = exp(s - m) on the kept tiles, m the max over every causally visible key (the
        # block mask does not reach attn_probs; params.h), 0 on the dropped ones.
        kw_s = dict(kw, alibi_slopes=None if kw["alibi_slopes"] is None else kw["alibi_slopes"].cpu())
        qc, kc, kept_c = q.detach().cpu(), k.detach().cpu(), kept.cpu()
        ref_s = attn_probs_ref(qc, kc, **kw_s) * kept_c
        low_s = (attn_probs_ref(qc, kc, compute_dtype=torch.float32, **kw_s) * kept_c).to(dtype)
        assert_close("S", s_dmask[:, :, :sq, :sk].abs(), ref_s, low_s, dtype)
    else:
        assert s_dmask is None
    kw_ref = dict(kw, alibi_slopes=None if kw["alibi_slopes"] is None else kw["alibi_slopes"].cpu())
    ref, low = ref_and_lowp_ext(
        *(t.detach().cpu() for t in (q, k, v)), dout.cpu(),
        None if sink is None else sink.cpu(), None, out_used=out.detach().cpu(),
        block_mask=dense.cpu(), block_size=bs, **kw_ref, **extra)
    check_results(ours, ref, low, dtype)
    if sink is not None:
        assert_close("dsink", ours["dsink"], ref["dsink"], low["dsink"], torch.float32, 3.0,
                     ref["dsink"].abs().max().item())


def _factors(device):
    return dict(
        dtype=dtypes_for(device),
        hd=HD,
        shape=list(SHAPES),
        block=list(BLOCKS),
        density=["all", "half", "sparse", "emptyrows", "none"],
        form=["dense", "compressed"],
        bcast=["bh", "b1", "11"],
        causal=[False, True],
        window=["none", "sym", "left"],
        softcap=[0.0, 2.0],
        alibi=["none", "h"],
        heads=["mha", "gqa", "mqa"],
        p=[0.0, 0.3],
        sink=[False, True],
    )


def _params():
    return [pytest.param(device, c, id=f"{device}-{case_id(c)}")
            for device in DEVICES for c in covering_set(_factors(device), seed=16)]


@pytest.mark.parametrize("device,c", _params())
def test_block_sparse(device, c, seed):
    run_case(device, c, seed)


@pytest.mark.parametrize("device,c", cuda_case_params(_factors, seed=17))
def test_block_sparse_cuda_kernels(device, c, seed):
    """The CUDA block-sparse kernels the call picks (sm80; sm90 on Hopper where it takes the
    call), forward and backward, on the covering set. The sm80 tiles must nest in the mask's
    blocks (the kernels raise naming both sizes otherwise): such a case skips with that
    message."""
    try:
        run_case(device, c, seed)
    except RuntimeError as err:
        if "must be multiples of the" in str(err):
            pytest.skip(str(err).splitlines()[0])
        raise


def _inputs(device, B=2, sq=150, sk=170, H=4, Hk=2, d=32, dtype=None):
    dtype = dtype or (torch.float32 if device == "cpu" else torch.bfloat16)
    return (rand([B, sq, H, d], dtype, device), rand([B, sk, Hk, d], dtype, device),
            rand([B, sk, Hk, d], dtype, device))


@pytest.mark.parametrize("device", DEVICES)
def test_forms_agree(device):
    """The dense mask and its compressed pair (any order, junk after the counts) give the same
    out, lse and gradients, bit for bit; so do a broadcast mask and its expansion."""
    q, k, v = (t.requires_grad_() for t in _inputs(device))
    bs = (64, 64)
    dense = make_mask("half", (2, 4, 3, 3), device)
    res = []
    for m in (dense, compress(dense), compress(dense, garbage=False)):
        out, lse, _ = flashattn.block_sparse_attn_func(q, k, v, m, bs, causal=True,
                                                       return_attn_probs=True)
        res.append((out, lse) + torch.autograd.grad(out.square().sum(), (q, k, v)))
    for other in res[1:]:
        for a, b in zip(res[0], other):
            assert torch.equal(a, b)
    one = make_mask("half", (1, 1, 3, 3), device)
    a = flashattn.block_sparse_attn_func(q, k, v, one, bs)
    b = flashattn.block_sparse_attn_func(q, k, v, one.expand(2, 4, 3, 3).contiguous(), bs)
    assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_prepared_mask(device):
    """A BlockSparseMask (block_sparse_mask, compressed once) of either form gives the raw
    mask's out, lse, S and gradients bit for bit (dropout on, seeded alike), padded and varlen,
    as does a forward without autograd (which compresses no transposed view); a block_size
    other than its own raises."""
    q, k, v = (t.requires_grad_() for t in _inputs(device))
    bs = (64, 64)
    dense = make_mask("half", (2, 1, 3, 3), device)
    res = []
    for m, b in ((dense, bs), (flashattn.block_sparse_mask(dense, bs), None),
                 (flashattn.block_sparse_mask(compress(dense), bs), bs)):
        torch.manual_seed(5)  # the same dropout mask in each
        out, lse, s = flashattn.block_sparse_attn_func(q, k, v, m, b, dropout_p=0.17,
                                                       causal=True, return_attn_probs=True)
        assert s is not None
        res.append((out, lse, s) + torch.autograd.grad(out.square().sum(), (q, k, v)))
    for other in res[1:]:
        for a, b in zip(res[0], other):
            assert torch.equal(a, b)
    prepared = flashattn.block_sparse_mask(dense, bs)
    assert isinstance(prepared, flashattn.BlockSparseMask) and prepared.block_size == bs
    with torch.no_grad():
        torch.manual_seed(5)
        out = flashattn.block_sparse_attn_func(q, k, v, dense, bs, dropout_p=0.17, causal=True)
    assert torch.equal(out, res[0][0])
    with pytest.raises(ValueError, match="block_size"):
        flashattn.block_sparse_attn_func(q, k, v, prepared, (128, 128))
    with pytest.raises(TypeError, match="BlockSparseMask already"):
        flashattn.block_sparse_mask(prepared)
    with pytest.raises(ValueError, match="4 dimensions"):
        flashattn.block_sparse_mask(dense[0], bs)
    cu = _cu([37, 0, 70], device)
    dtype = q.dtype
    qv, kv, vv = (rand([107, h, 32], dtype, device).requires_grad_() for h in (4, 2, 2))
    vmask = make_mask("half", (3, 4, 2, 3), device)
    got = []
    for m, b in ((vmask, (64, 32)), (flashattn.block_sparse_mask(vmask, (64, 32)), None)):
        out = flashattn.block_sparse_attn_varlen_func(qv, kv, vv, cu, cu, 70, 70, m, b,
                                                      causal=True)
        got.append((out,) + torch.autograd.grad(out.square().sum(), (qv, kv, vv)))
    for a, b in zip(*got):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_kernel_path_block_mask(device):
    """flashattn.kernel_path with a block mask names the backend the block-sparse call runs:
    on Hopper sm90 for padded 128 x 128 blocks (both directions at d128), sm80 for blocks the
    sm90 tiles do not divide; a bad mask raises the call's own error."""
    q, k, v = _inputs(device, sq=256, sk=384, d=128)
    dense = make_mask("half", (2, 4, 2, 3), device)
    hopper = device != "cpu" and torch.cuda.get_device_capability() == (9, 0)
    for direction in ("fwd", "bwd"):
        path = flashattn.kernel_path(q, k, v, direction=direction, block_mask=dense,
                                     block_size=(128, 128))
        assert path == flashattn.kernel_path(q, k, v, direction=direction,
                                             block_mask=flashattn.block_sparse_mask(dense))
        if device == "cpu":
            assert path == "cpu"
        elif hopper:
            assert path == "sm90", (direction, path)
    small = make_mask("half", (2, 4, 4, 6), device)
    if device != "cpu":
        assert flashattn.kernel_path(q, k, v, block_mask=small, block_size=(64, 64)) in (
            "sm80", "sm80-ptx")
    with pytest.raises(ValueError, match="block_mask must have shape"):
        flashattn.kernel_path(q, k, v, block_mask=small, block_size=(128, 128))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sink", [False, True], ids=["nosink", "sink"])
def test_dropped_rows(device, sink):
    """Query blocks whose tiles are all dropped: out exactly 0, lse -inf (the sink with one),
    their dq 0; the other rows as without them."""
    q, k, v = (t.requires_grad_() for t in _inputs(device))
    H = q.shape[2]
    s = torch.randn(H, device=device) if sink else None
    mask = make_mask("all", (2, H, 3, 3), device)
    mask[0, 1, 1] = False  # rows 64..127 of batch 0, head 1
    mask[1, :, 2] = False  # rows 128..149 of batch 1
    out, lse, _ = flashattn.block_sparse_attn_func(q, k, v, mask, (64, 64), learnable_sink=s,
                                                   return_attn_probs=True)
    want = -torch.inf if s is None else s[1].item()
    assert (out[0, 64:128, 1] == 0).all() and (out[1, 128:] == 0).all()
    assert (lse[0, 1, 64:128] == want).all()
    dq, = torch.autograd.grad(out.sum(), (q,))
    assert (dq[0, 64:128, 1] == 0).all() and (dq[1, 128:] == 0).all()
    assert torch.isfinite(dq).all()


@pytest.mark.parametrize("device", DEVICES)
def test_dropped_tiles_are_not_read(device):
    """NaN keys and values in a key block no query block keeps change nothing: the kernels
    skip dropped blocks (masking them would still multiply the NaN); their dk / dv are 0.
    Guaranteed where the blocks cover whole kernel tiles (README): the CPU at any block size;
    CUDA (d 32) at multiples of its sm80 tiles, forward 128 x 128, backward 128 x 128 or
    64 x 128 (tile_fwd_sm80.h, tile_bwd_sm80.h). Smaller ones are masked inside the tile."""
    bs = (64, 64) if device == "cpu" else (128, 128)
    nq = (150 + bs[0] - 1) // bs[0]
    q, k, v = _inputs(device, sk=3 * bs[1])
    mask = make_mask("half", (2, 4, nq, 3), device)
    mask[..., 1] = False
    mask[..., 0] = True
    dropped = slice(bs[1], 2 * bs[1])
    kn, vn = k.clone(), v.clone()
    kn[:, dropped], vn[:, dropped] = float("nan"), float("nan")
    q, k, v, kn, vn = (t.requires_grad_() for t in (q, k, v, kn, vn))
    want = flashattn.block_sparse_attn_func(q, k, v, mask, bs)
    got = flashattn.block_sparse_attn_func(q, kn, vn, mask, bs)
    assert torch.equal(got, want)
    dq, dk, dv = torch.autograd.grad(got.sum(), (q, kn, vn))
    assert torch.isfinite(dq).all() and (dk[:, dropped] == 0).all() and (dv[:, dropped] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_bad_masks(device):
    q, k, v = _inputs(device)  # nq = nk = 2 (128 x 128), 3 (64 x 64)
    good = torch.ones(2, 4, 2, 2, dtype=torch.bool, device=device)
    f = flashattn.block_sparse_attn_func
    bad = [
        (good.float(), "block_mask must have dtype torch.bool"),
        (good[..., :1], r"block_mask must have shape \(2 or 1, 4 or 1, 2, 2\)"),
        (good[0], r"block_mask must have shape"),
        (good.expand(2, 4, 2, 2)[:, :3], r"block_mask must have shape"),
        (good.to("meta"), "block_mask must be on q's device"),
        ((torch.ones(2, 4, 2, dtype=torch.int64, device=device),
          torch.zeros(2, 4, 2, 2, dtype=torch.int32, device=device)),
         r"block_mask\[0\] \(kv_num_blocks\) must have dtype torch.int32"),
        ((torch.ones(2, 4, 2, dtype=torch.int32, device=device),
          torch.zeros(2, 4, 2, 3, dtype=torch.int32, device=device)),
         r"block_mask\[1\] \(kv_indices\) must have shape"),
        ((torch.ones(2, 4, 2, dtype=torch.int32, device=device),
          torch.zeros(1, 4, 2, 2, dtype=torch.int32, device=device)),
         r"block_mask\[1\] \(kv_indices\) must have the batch and head sizes"),
        ((good,), "the pair"),
    ]
    for m, msg in bad:
        with pytest.raises(ValueError, match=msg):
            f(q, k, v, m)
    with pytest.raises(TypeError, match="kv_num_blocks"):
        f(q, k, v, ([1, 2], good))
    with pytest.raises(ValueError, match="block_size must be a pair"):
        f(q, k, v, good, (128, 128, 1))
    for bs, name in (((8, 128), "block_size_m"), ((128, 300), "block_size_n"),
                     ((100, 128), "block_size_m")):
        nq, nk = _nblocks(150, 170, bs)
        with pytest.raises(RuntimeError, match=f"{name} must be a multiple of 16 in"):
            f(q, k, v, torch.ones(1, 1, nq, nk, dtype=torch.bool, device=device), bs)


@pytest.mark.parametrize("device", DEVICES)
def test_op_argument_errors(device):
    """The ops' own checks (direct callers): names, shapes, pairs, the backward's view."""
    ops = torch.ops.flashattn
    q, k, v = _inputs(device)
    opts = (32 ** -0.5, False, -1, -1, 0.0, None)
    num = torch.full((2, 4, 2), 2, dtype=torch.int32, device=device)
    idx = torch.arange(2, dtype=torch.int32, device=device).expand(2, 4, 2, 2).contiguous()
    with pytest.raises(RuntimeError, match="kv_num_blocks and kv_indices must be given together"):
        ops.fwd(q, k, v, *opts, kv_num_blocks=num)
    with pytest.raises(RuntimeError, match=r"kv_num_blocks must have shape \(batch or 1"):
        ops.fwd(q, k, v, *opts, kv_num_blocks=num[..., :1].contiguous(), kv_indices=idx)
    with pytest.raises(RuntimeError, match=r"kv_indices must have shape \(2, 4, ceil"):
        ops.fwd(q, k, v, *opts, kv_num_blocks=num, kv_indices=idx[..., :1].contiguous())
    with pytest.raises(RuntimeError, match="kv_indices must have dtype int32"):
        ops.fwd(q, k, v, *opts, kv_num_blocks=num, kv_indices=idx.long())
    with pytest.raises(RuntimeError, match="kv_indices must be contiguous"):
        ops.fwd(q, k, v, *opts, kv_num_blocks=num, kv_indices=idx.transpose(-1, -2))
    out, lse = ops.fwd(q, k, v, *opts, kv_num_blocks=num, kv_indices=idx)
    with pytest.raises(RuntimeError, match="the block-sparse backward needs"):
        ops.bwd(torch.ones_like(out), q, k, v, out, lse, *opts, False, kv_num_blocks=num,
                kv_indices=idx)


@pytest.mark.parametrize("device", DEVICES)
def test_clamped_metadata(device):
    """Counts above n_kblocks or negative, indices outside [0, n_kblocks): clamped in the ops
    (finite output, no out-of-bounds access), both directions; through block_sparse_attn_func
    the clamped mask's numbers (repeats count once)."""
    ops = torch.ops.flashattn
    q, k, v = _inputs(device, sq=200, sk=300)
    nq, nk = _nblocks(200, 300, (64, 64))
    opts = (32 ** -0.5, False, -1, -1, 0.0, None)
    gen = dict(dtype=torch.int32, device=device)
    num = torch.randint(-3, 3 * nk, (2, 4, nq), **gen)
    idx = torch.randint(-100, 100, (2, 4, nq, nk), **gen)
    qnum = torch.randint(-3, 3 * nq, (2, 4, nk), **gen)
    qidx = torch.randint(-100, 100, (2, 4, nk, nq), **gen)
    sparse = dict(kv_num_blocks=num, kv_indices=idx, q_num_blocks=qnum, q_indices=qidx,
                  block_size_m=64, block_size_n=64)
    out, lse = ops.fwd(q, k, v, *opts, **sparse)
    assert torch.isfinite(out).all() and not torch.isnan(lse).any()
    dq, dk, dv, _ = ops.bwd(torch.randn_like(out), q, k, v, out, lse, *opts, False, **sparse)
    assert all(torch.isfinite(t).all() for t in (dq, dk, dv))
    # The public function: the reference of the clamped mask (repeats once).
    dense = torch.zeros(2, 4, nq, nk, dtype=torch.bool, device=device)
    for r in range(nq):
        for b in range(2):
            for h in range(4):
                n = int(num[b, h, r].clamp(0, nk))
                dense[b, h, r, idx[b, h, r, :n].long().clamp(0, nk - 1)] = True
    got = flashattn.block_sparse_attn_func(q, k, v, (num, idx), (64, 64))
    want = flashattn.block_sparse_attn_func(q, k, v, dense, (64, 64))
    assert torch.equal(got, want)


def skip_if_forced_refusal(*args, **kw):
    """Skips a test whose call the forced backend (FLASHATTN_FORCE_BACKEND=sm90) refuses, as
    flashattn.kernel_path reports it; any other error fails."""
    try:
        flashattn.kernel_path(*args, **kw)
    except RuntimeError as err:
        if "FLASHATTN_FORCE_BACKEND=sm90, but" not in str(err):
            raise
        pytest.skip(str(err))


def _op_args(device):
    q, k, v = _inputs(device, sq=100, sk=90)
    dense = make_mask("half", (2, 1, 2, 3), device)
    args = flashattn.block_sparse._block_sparse_args(dense, 64, 32)
    opts = (32 ** -0.5, True, -1, 0, 0.0, None)
    return (q, k, v), opts, args


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("features", [False, True], ids=["plain", "dropout_sink"])
def test_opcheck(device, features):
    ops = torch.ops.flashattn
    (q, k, v), opts, sparse = _op_args(device)
    skip_if_forced_refusal(q, k, v, causal=True, window_size=(-1, 0),
                           block_mask=make_mask("half", (2, 1, 2, 3), device), block_size=(64, 32))
    feats = {}
    if features:
        feats = dict(dropout_p=0.3, rng_state=torch.tensor([42, 7], dtype=torch.int64,
                                                           device=device),
                     learnable_sink=torch.randn(q.shape[2], device=device))
    torch.library.opcheck(ops.fwd.default, (q, k, v, *opts), dict(feats, **sparse))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.library.opcheck(ops.fwd.default, (q, k, v, *opts), dict(feats, **sparse))
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse = ops.fwd(q, k, v, *opts, **feats, **sparse)
    torch.library.opcheck(ops.bwd.default, (torch.randn_like(out), q, k, v, out, lse, *opts,
                                            False), dict(feats, **sparse))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("form", ["dense", "compressed"])
def test_compile(device, dynamic, form):
    """block_sparse_attn_func under torch.compile(fullgraph=True): no graph break, the eager
    numbers and gradients (the mask views are built inside the graph)."""
    q, k, v = (t.requires_grad_() for t in _inputs(device))
    dense = make_mask("half", (2, 1, 3, 3), device)
    mask = dense if form == "dense" else compress(dense)

    def f(q, k, v, mask):
        out = flashattn.block_sparse_attn_func(q, k, v, mask, (64, 64), causal=True,
                                               softcap=3.0)
        return out.square().sum()

    def run(fn):
        loss = fn(q, k, v, mask)
        return (loss,) + torch.autograd.grad(loss, (q, k, v))

    got = run(torch.compile(f, fullgraph=True, dynamic=dynamic, backend="aot_eager"))
    want = run(f)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_all_kept_is_dense():
    """A CUDA call with every block kept runs the block-sparse kernels (no error, by default)
    and gives the dense kernel's numbers up to rounding: out within a few bf16 ulps, the lse
    within float32 accumulation."""
    q, k, v = _inputs("cuda", dtype=torch.bfloat16)
    mask = torch.ones(1, 1, 2, 2, dtype=torch.bool, device="cuda")
    out, lse, _ = flashattn.block_sparse_attn_func(q, k, v, mask, return_attn_probs=True)
    ref, ref_lse, _ = flashattn.flash_attn_func(q, k, v, return_attn_probs=True)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-4)


def test_flex_block_mask():
    """block_mask_from_flex: a BlockMask without a mask_mod gives the same numbers as its
    dense form."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    q, k, v = _inputs("cpu", sq=256, sk=256)
    dense = make_mask("half", (2, 4, 2, 2), "cpu")
    num, idx = compress(dense, garbage=False)
    bm = flex.BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=128)
    mask, bs = flashattn.block_mask_from_flex(bm)
    assert bs == (128, 128)
    got = flashattn.block_sparse_attn_func(q, k, v, mask, bs)
    assert torch.equal(got, flashattn.block_sparse_attn_func(q, k, v, dense, bs))


VARLEN = {"mixed": ([113, 0, 1, 57], [203, 5, 239, 57]), "long": ([300, 130], [257, 64])}


def _cu(lens, device):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,
                        device=device)


def _sm90_factors(device):
    """The calls the sm90 forward's block-sparse kernels take: padded batches, the head dims
    with a 128 x 128 block-sparse tile (tile_fwd_sm90.h: d <= 64, d <= 128, 192 x 128; 32 and
    96 in the buckets above), blocks of whole tiles."""
    return dict(_factors(device), hd=[(128, 128), (96, 64), (192, 128), (64, 64), (32, 32)],
                block=list(SM90_BLOCKS))


@pytest.mark.parametrize("device,c", cuda_case_params(_sm90_factors, seed=19))
def test_block_sparse_sm90_forward(device, c, seed, monkeypatch):
    """The covering set's checks with the forward forced onto sm90 (its tile lists in shared
    memory, kernel_fwd_sm90.cuh), on calls it takes: a refusal fails here (it would be a skip
    elsewhere). The backward runs sm90 where it takes the call (the 64 / 128 buckets with qk =
    v, no dropout / softcap / ALiBi: kernel_bwd_sm90.cuh's list), else sm80. Other GPUs skip
    every case."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 forward runs on compute capability 9.0 only")
    monkeypatch.setenv("FLASHATTN_FORCE_BACKEND", "sm90")
    try:
        run_case(device, c, seed)
    except RuntimeError as err:
        if "FLASHATTN_FORCE_BACKEND=sm90, but the sm90 forward does not take" in str(err):
            raise AssertionError(f"the sm90 forward refused a block-sparse call: {err}") from None
        raise


@pytest.mark.cuda
@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device")
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["nc", "causal"])
@pytest.mark.parametrize("heads", ["mha", "gqa"])
@pytest.mark.parametrize("density,pairs", [("localglobal", "0"), ("localglobal", "1"),
                                           ("half", "1")],
                         ids=["localglobal-sections", "localglobal-pairs", "half-pairs"])
def test_block_sparse_sm90_heavy_first(d, causal, heads, density, pairs, seed, monkeypatch):
    """A local + global mask over 9 x 9 blocks of 128 (key block 0 kept by every query block, a
    band of 3 elsewhere): the sm90 backward launches its CTAs heavy first through the order its
    pre-kernel writes (sm90/bwd_order_sm90.cuh: the heaviest list is over twice the mean), so a
    CTA it lost or ran twice shows in dK / dV against the float64 reference (NaN-poisoned
    outputs, GQA's accumulated dK / dV). Both launch orders: FLASHATTN_SM90_SPARSE_PAIRS=1
    (one (head, sequence) pair's key blocks after another, launch_bwd_sm90.cuh: the default)
    and =0 (L2 sections of pairs taking turns), and a random half mask (no reorder: the launch
    order itself)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 kernels run on compute capability 9.0 only")
    monkeypatch.setenv("FLASHATTN_FORCE_BACKEND", "sm90")
    monkeypatch.setenv("FLASHATTN_SM90_SPARSE_PAIRS", pairs)
    c = dict(dtype="bf16", hd=(d, d), heads=heads, p=0.0, shape="1100x1100", block="128x128",
             bcast="bh", density=density, form="compressed", sink=False, causal=causal,
             window="none", softcap=0.0, alibi="none")
    run_case("cuda", c, seed)


def _varlen_factors(device):
    return dict(dtype=dtypes_for(device), lens=list(VARLEN), block=["64x64", "64x128", "128x32"],
                density=["half", "emptyrows", "all"], form=["dense", "compressed"],
                bcast=["bh", "11"], causal=[False, True], window=["none", "sym"],
                heads=["mha", "gqa"], p=[0.0, 0.3], sink=[False, True])


def _varlen_params():
    return [pytest.param(device, c, id=f"{device}-{case_id(c)}")
            for device in DEVICES for c in covering_set(_varlen_factors(device), seed=17)]


@pytest.mark.parametrize("device,c", _varlen_params())
def test_block_sparse_varlen(device, c, seed):
    """block_sparse_attn_varlen_func against the float64 reference of each sequence with its
    mask slice (blocks start at each sequence's first row and key)."""
    dtype = DTYPES[c["dtype"]]
    H, Hk = HEADS[c["heads"]]
    d = 48
    skip_if_no_kernel(device, dtype, d, d)
    lens_q, lens_k = VARLEN[c["lens"]]
    B, sq, sk, p = len(lens_q), max(lens_q), max(lens_k), c["p"]
    bs = BLOCKS[c["block"]]
    nq, nk = _nblocks(sq, sk, bs)
    mb, mh = {"bh": (B, H), "11": (1, 1)}[c["bcast"]]
    dense = make_mask(c["density"], (mb, mh, nq, nk), device)
    block_mask = dense if c["form"] == "dense" else compress(dense)
    cu_q, cu_k = _cu(lens_q, device), _cu(lens_k, device)
    q, dout = rand([sum(lens_q), H, d], dtype, device), rand([sum(lens_q), H, d], dtype, device)
    k, v = rand([sum(lens_k), Hk, d], dtype, device), rand([sum(lens_k), Hk, d], dtype, device)
    sink = (torch.randn(H, device=device) * 2).requires_grad_() if c["sink"] else None
    kw = dict(causal=c["causal"], window_size=_window(c["window"], min(lens_k)))
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    torch.manual_seed(seed + 1)
    out, lse, _ = flashattn.block_sparse_attn_varlen_func(
        qg, kg, vg, cu_q, cu_k, sq, sk, block_mask, bs, dropout_p=p, return_attn_probs=True,
        learnable_sink=sink, **kw)
    leaves = (qg, kg, vg) + ((sink,) if sink is not None else ())
    grads = torch.autograd.grad(out, leaves, dout)
    ours = dict(zip(("dq", "dk", "dv", "dsink"), grads), out=out, lse=lse)
    keep = None
    if p > 0:
        torch.manual_seed(seed + 1)
        keep = dropout_keep_ref(flashattn.interface._rng_state(q, p).cpu(), B, H, sq, sk, p)
    parts = []
    for b in range(B):
        q0, q1, k0, k1 = cu_q[b].item(), cu_q[b + 1].item(), cu_k[b].item(), cu_k[b + 1].item()
        extra = {} if keep is None else dict(
            dropout_keep=keep[b:b + 1], dropout_scale=dropout_scale_ref(p))
        sl = lambda t, a, e: t.detach().cpu()[a:e].unsqueeze(0)  # noqa: E731
        parts.append(ref_and_lowp_ext(
            sl(q, q0, q1), sl(k, k0, k1), sl(v, k0, k1), sl(dout, q0, q1),
            None if sink is None else sink.cpu(), None, out_used=sl(out, q0, q1),
            block_mask=dense[b if mb > 1 else 0].unsqueeze(0).cpu(), block_size=bs, **kw,
            **extra))
    ref, low = ({}, {})
    for i, dst in enumerate((ref, low)):
        for name in ("out", "dq", "dk", "dv"):
            dst[name] = torch.cat([pt[i][name][0] for pt in parts])
        dst["lse"] = torch.cat([pt[i]["lse"][0] for pt in parts], dim=1)
        if sink is not None:
            dst["dsink"] = sum(pt[i]["dsink"] for pt in parts)
    check_results(ours, ref, low, dtype)
    if sink is not None:
        assert_close("dsink", ours["dsink"], ref["dsink"], low["dsink"], torch.float32, 3.0,
                     ref["dsink"].abs().max().item())


@pytest.mark.parametrize("bs", [(64, 64), (96, 80), (256, 256)], ids=lambda b: "%dx%d" % b)
@pytest.mark.parametrize("device", DEVICES)
def test_varlen_wrong_max_seqlen(device, bs):
    """max_seqlen_q / k (64) below the real lengths (wrong metadata): the mask's blocks cover
    rows [0, eq) and keys [0, ek) of each sequence (eq, ek >= 64; 256: past a kernel tile) and
    the rest keeps nothing (out 0, dq / dk / dv 0); no out-of-bounds access, finite results."""
    lens_q, lens_k = [130, 70], [150, 20]
    cu_q, cu_k = _cu(lens_q, device), _cu(lens_k, device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q = rand([200, 2, 32], dtype, device).requires_grad_()
    k, v = (rand([170, 2, 32], dtype, device).requires_grad_() for _ in range(2))
    mask = torch.ones(2, 2, 1, 1, dtype=torch.bool, device=device)
    out = flashattn.block_sparse_attn_varlen_func(q, k, v, cu_q, cu_k, 64, 64, mask, bs)
    eq, ek = bs  # one block each: ceil(64 / b) = 1

    def rows(lens, lo, hi):  # rows [lo, hi) of each sequence (clamped to its length)
        starts = [sum(lens[:i]) for i in range(len(lens))]
        return torch.tensor([c + i for c, n in zip(starts, lens) for i in range(lo, min(hi, n))],
                            dtype=torch.long)

    past_q, within_q = rows(lens_q, eq, 1 << 30), rows(lens_q, 0, eq)
    past_k, within_k = rows(lens_k, ek, 1 << 30), rows(lens_k, 0, ek)
    assert torch.isfinite(out).all() and (out[past_q] == 0).all()
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
    assert (dq[past_q] == 0).all() and (dk[past_k] == 0).all() and (dv[past_k] == 0).all()
    # The rows and keys inside the mask are computed, not left out (nonzero on random data).
    assert all((t.abs().sum(-1) > 0).all() for t in (out[within_q], dq[within_q],
                                                    dk[within_k], dv[within_k]))


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_opcheck_and_compile(device):
    ops = torch.ops.flashattn
    lens = [37, 0, 70]
    cu = _cu(lens, device)
    q, k, v = (rand([107, 2, 16], torch.float32 if device == "cpu" else torch.bfloat16, device)
               for _ in range(3))
    sparse = flashattn.block_sparse._block_sparse_args(
        make_mask("half", (3, 1, 2, 3), device), 64, 32)
    opts = (0.25, True, -1, 0, 0.0, None)
    meta = (cu, cu, 70, 70)
    skip_if_forced_refusal(q, k, v, *meta, causal=True, block_mask=make_mask(
        "half", (3, 1, 2, 3), device), block_size=(64, 32))
    torch.library.opcheck(ops.varlen_fwd.default, (q, k, v, *meta, *opts), sparse)
    out, lse = ops.varlen_fwd(q, k, v, *meta, *opts, **sparse)
    torch.library.opcheck(ops.varlen_bwd.default,
                          (torch.randn_like(out), q, k, v, out, lse, *meta, *opts, False), sparse)
    mask = make_mask("half", (3, 2, 2, 3), device)
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def f(q, k, v):
        return flashattn.block_sparse_attn_varlen_func(q, k, v, cu, cu, 70, 70, mask, (64, 32),
                                                       causal=True).square().sum()

    got = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    want = f(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(torch.autograd.grad(got, (q, k, v)), torch.autograd.grad(want, (q, k, v))):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)

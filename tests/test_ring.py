"""Ring (context-parallel) attention, flashattn.distributed, on CPU over gloo.

In-process: the exact log-sum-exp merge (with -inf rows), the layout helpers, the ring's
per-step schedule against the global causal mask, argument errors. Multi-process: 1 to 4
spawned ranks (one spawn per world size runs all of its cases) compute forward and backward on
their shards (padded and varlen); the results, gathered back to the full sequence with the
layout's gather helper, must match the float64 reference of the full sequence under the
tolerance rule (helpers.py).
A worker's exception fails the cases of its spawn; gloo's 60 s timeout and a join deadline
keep a stuck ring from hanging the suite.
"""
import datetime
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flashattn  # noqa: F401  (registers the ops)
from flashattn.distributed import (
    merge_attn_partials,
    plain_gather,
    plain_shard,
    ring_flash_attn_func,
    ring_flash_attn_varlen_func,
    zigzag_gather,
    zigzag_shard,
)
from flashattn.distributed.layout import _unshard
from flashattn.distributed.ring import _position_calls, _step_calls, _step_pair, _VarlenRows
from flashattn.interface import _rng_state
from helpers import assert_close, check_results, rand
from reference import (attention_ref, dropout_keep_ref, dropout_scale_ref, ref_and_lowp,
                       ref_and_lowp_ext, ref_and_lowp_varlen, visible_mask)

HAVE_GLOO = dist.is_available() and dist.is_gloo_available()
needs_gloo = pytest.mark.skipif(
    not HAVE_GLOO, reason="this torch build has no torch.distributed gloo backend")
# NCCL (issue 19): the same cases on CUDA ranks (rank r on cuda:r) where this machine has a GPU
# per rank, fp32 cases in bf16 (the CUDA kernels take 16-bit inputs only).
HAVE_NCCL = dist.is_available() and dist.is_nccl_available() and torch.cuda.is_available()


def _nccl_skip(world_size):
    if not HAVE_NCCL:
        return "no NCCL or no CUDA device"
    if torch.cuda.device_count() < world_size:
        return f"{world_size} ranks need {world_size} GPUs, this machine has " \
               f"{torch.cuda.device_count()}"
    return None


GLOO_TIMEOUT = datetime.timedelta(seconds=60)
JOIN_DEADLINE_S = 150  # a whole spawn (start-up included); gloo's timeout fires well before

SHARD = {"zigzag": zigzag_shard, "plain": plain_shard}
GATHER = {"zigzag": zigzag_gather, "plain": plain_gather}


# ---------------------------------------------------------------------------------------------
# In-process: the merge.


def test_merge_matches_full_attention():
    # Attention over three disjoint key ranges, merged, is attention over all keys.
    B, sq, sk, H, d = 2, 11, 23, 3, 16
    q, k, v = (rand([B, n, H, d], torch.float32, "cpu") for n in (sq, sk, sk))
    cuts = [0, 5, 6, sk]
    parts = [attention_ref(q, k[:, a:b], v[:, a:b], compute_dtype=torch.float64)
             for a, b in zip(cuts, cuts[1:])]
    out, lse = merge_attn_partials([p[0] for p in parts], [p[1] for p in parts])
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    ref = attention_ref(q, k, v, compute_dtype=torch.float64)
    low = attention_ref(q, k, v, compute_dtype=torch.float32)
    assert_close("out", out, ref[0], low[0], torch.float32)
    assert_close("lse", lse, ref[1], low[1], torch.float32)


def test_merge_inf_rows_and_large_lse():
    B, S, H, dv = 1, 5, 2, 4
    inf = float("inf")
    out_a = torch.randn(B, S, H, dv)
    out_b = torch.randn(B, S, H, dv)
    lse_a = torch.randn(B, H, S) + 1e4  # exp(1e4) overflows: the merge must shift by the max
    lse_b = torch.randn(B, H, S) + 1e4
    lse_a[:, :, 1] = -inf  # partial a sees no key for row 1 ...
    out_a[:, 1] = float("nan")  # ... and its out there must not leak in, whatever it holds
    lse_b[:, :, 2] = -inf
    out_b[:, 2] = inf
    lse_a[:, :, 4] = lse_b[:, :, 4] = -inf  # no partial sees row 4
    out, lse = merge_attn_partials([out_a, out_b], [lse_a, lse_b])
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert torch.equal(out[:, 1], out_b[:, 1]) and torch.equal(lse[:, :, 1], lse_b[:, :, 1])
    assert torch.equal(out[:, 2], out_a[:, 2]) and torch.equal(lse[:, :, 2], lse_a[:, :, 2])
    assert torch.equal(out[:, 4], torch.zeros_like(out[:, 4]))
    assert torch.equal(lse[:, :, 4], torch.full_like(lse[:, :, 4], -inf))
    rows = [0, 3]
    want_lse = torch.logaddexp(lse_a.double(), lse_b.double())[:, :, rows]
    wa = torch.exp(lse_a.double() - torch.logaddexp(lse_a.double(), lse_b.double()))
    wb = torch.exp(lse_b.double() - torch.logaddexp(lse_a.double(), lse_b.double()))
    want_out = (wa.transpose(1, 2)[..., None] * out_a.double()
                + wb.transpose(1, 2)[..., None] * out_b.double())[:, rows]
    torch.testing.assert_close(lse[:, :, rows].double(), want_lse, rtol=0, atol=1e-2)
    torch.testing.assert_close(out[:, rows].double(), want_out, rtol=1e-5, atol=1e-5)
    # A single partial merges to itself.
    one, one_lse = merge_attn_partials([out_b], [lse_b])
    keep = lse_b != -inf
    assert torch.equal(one_lse, lse_b)
    assert torch.equal(one[keep.transpose(1, 2)], out_b[keep.transpose(1, 2)])


# ---------------------------------------------------------------------------------------------
# In-process: layouts and the schedule.


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shard_layouts(world_size):
    c = 3
    S = 2 * world_size * c
    pos = torch.arange(S)
    for r in range(world_size):
        want = list(range(r * c, (r + 1) * c)) + list(
            range((2 * world_size - 1 - r) * c, (2 * world_size - r) * c))
        assert zigzag_shard(pos, r, world_size, dim=0).tolist() == want
        L = S // world_size
        assert plain_shard(pos, r, world_size, dim=0).tolist() == list(range(r * L, (r + 1) * L))
    x = torch.randn(2, S, 3, 5)
    lse = torch.randn(2, 3, S)
    for t, dim in ((x, 1), (lse, 2)):
        zig = [zigzag_shard(t, r, world_size, dim) for r in range(world_size)]
        assert all(p.is_contiguous() for p in zig)
        assert torch.equal(_unshard(zig, True, dim), t)
        plain = [plain_shard(t, r, world_size, dim) for r in range(world_size)]
        assert torch.equal(torch.cat(plain, dim), t)
        assert torch.equal(_unshard(plain, False, dim), t)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_shard_layouts_varlen(world_size):
    chunks = [3, 0, 1, 2]  # per sequence: its chunk length (a zero-length sequence too)
    for zigzag in (True, False):
        per_rank = 2 if zigzag else 1
        lens = [world_size * per_rank * c for c in chunks]
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
        T = int(cu[-1])
        pos = torch.arange(T)
        shard = zigzag_shard if zigzag else plain_shard
        pieces = [shard(pos, r, world_size, dim=0, cu_seqlens=cu) for r in range(world_size)]
        for r, piece in enumerate(pieces):
            want = torch.cat([shard(pos[a:b], r, world_size, dim=0)
                              for a, b in zip(cu.tolist(), cu.tolist()[1:])])
            assert torch.equal(piece, want)
        cu_local = cu // world_size
        assert torch.equal(_unshard(pieces, zigzag, 0, cu_local), pos)
        x = torch.randn(3, T)  # along another dim, as softmax_lse (nheads, total)
        parts = [shard(x, r, world_size, dim=1, cu_seqlens=cu) for r in range(world_size)]
        assert torch.equal(_unshard(parts, zigzag, 1, cu_local), x)
        if zigzag:  # the ring's half-sequence rows: every local sequence's first / second half
            rows = _VarlenRows(cu_local, int((cu_local[1:] - cu_local[:-1]).max()),
                               T // world_size, zigzag=True)
            bounds = list(zip(cu_local.tolist(), cu_local.tolist()[1:]))
            first = [i for a, b in bounds for i in range(a, (a + b) // 2)]
            second = [i for a, b in bounds for i in range((a + b) // 2, b)]
            assert rows.sel["first"][0].tolist() == first
            assert rows.sel["second"][0].tolist() == second
            assert rows.sel["first"][1].tolist() == (cu_local // 2).tolist()


def test_shard_errors():
    x = torch.randn(2, 10, 3, 4)
    with pytest.raises(ValueError, match=r"x.shape\[1\] = 10 must be divisible by 6"):
        zigzag_shard(x, 0, 3)
    with pytest.raises(ValueError, match=r"x.shape\[1\] = 10 must be divisible by 4"):
        plain_shard(x, 0, 4)
    with pytest.raises(ValueError, match="rank must be in"):
        zigzag_shard(x, 5, 5)
    with pytest.raises(ValueError, match="must be even"):
        zigzag_gather(torch.randn(2, 5, 3, 4))
    cu = torch.tensor([0, 8, 13], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"the length of sequence 1 \(cu_seqlens\) = 5 must be "
                                         r"divisible by 4"):
        zigzag_shard(torch.randn(13, 2), 0, 2, dim=0, cu_seqlens=cu)
    with pytest.raises(ValueError, match="local length of sequence 1"):
        zigzag_gather(torch.randn(13, 2), dim=0, cu_seqlens=cu)


@pytest.mark.parametrize("layout", ["zigzag", "plain"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_schedule_covers_the_mask_once(layout, causal, world_size):
    # Every (query, key) pair of the global mask is computed by exactly one ring step, with
    # the step's own (bottom-right aligned) mask; nothing hidden is computed.
    c = 3
    S = 2 * world_size * c
    L = S // world_size
    parts = {"all": slice(0, L), "first": slice(0, L // 2), "second": slice(L // 2, L)}
    pos = torch.arange(S)
    local = [SHARD[layout](pos, r, world_size, dim=0) for r in range(world_size)]
    count = torch.zeros(S, S, dtype=torch.int64)
    for rank in range(world_size):
        for src in range(world_size):
            pair = _step_pair(layout, causal, rank, src)
            if pair is None:
                continue
            rows, cols, is_causal = pair
            qpos, kpos = local[rank][parts[rows]], local[src][parts[cols]]
            vis = visible_mask(len(qpos), len(kpos), -1, 0 if is_causal else -1)
            count[qpos[:, None], kpos[None, :]] += vis.long()
    want = visible_mask(S, S, -1, 0 if causal else -1).long()
    assert torch.equal(count, want)


@pytest.mark.parametrize("window", [(0, 0), (1, 0), (4, 2), (5, -1), (-1, 3), (11, 7), (40, 40)],
                         ids=lambda w: f"w{w[0]}x{w[1]}")
@pytest.mark.parametrize("layout", ["zigzag", "plain"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_window_schedule_covers_the_mask_once(window, layout, causal, world_size):
    # Sliding windows: every visible (query, key) pair of the global windowed mask is computed
    # by exactly one call of one ring step, under the call's own bottom-right aligned window on
    # its row slices; nothing hidden is computed. Chunks of 3 rows: windows shorter, as long
    # as and longer than a chunk, one-sided, and wider than the sequence.
    c = 3
    S = 2 * world_size * c
    L = S // world_size
    pos = torch.arange(S)
    local = [SHARD[layout](pos, r, world_size, dim=0) for r in range(world_size)]
    count = torch.zeros(S, S, dtype=torch.int64)
    for rank in range(world_size):
        for src in range(world_size):
            for rows, cols, wl, wr in _step_calls(layout, causal, window, rank, src,
                                                  world_size, L):
                qpos, kpos = local[rank][rows], local[src][cols]
                assert len(qpos) > 0 and len(kpos) > 0 and wl >= -1 and wr >= -1
                vis = visible_mask(len(qpos), len(kpos), wl, wr)
                count[qpos[:, None], kpos[None, :]] += vis.long()
    want = visible_mask(S, S, window[0], 0 if causal else window[1]).long()
    assert torch.equal(count, want)


@pytest.mark.parametrize("window", [None, (0, 0), (4, 2), (5, -1), (-1, 3), (40, 40)],
                         ids=lambda w: "nowindow" if w is None else f"w{w[0]}x{w[1]}")
@pytest.mark.parametrize("layout", ["zigzag", "plain"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("known_len", [True, False], ids=["padded", "varlen"])
def test_position_schedule_covers_the_mask_once(window, layout, causal, world_size, known_len):
    # With position offsets (ALiBi, dropout, varlen windows) each call is a square chunk pair
    # under the op's mask at its global positions (params.h: rows + q_pos_offset, keys +
    # k_pos_offset, shift 0): every visible pair of the global mask is computed exactly once,
    # and a pair left out hides everything. Varlen (known_len False): no host-side window skip.
    c = 3
    S = 2 * world_size * c
    n = c if layout == "zigzag" else 2 * c
    parts = {"all": slice(0, 2 * c), "first": slice(0, c), "second": slice(c, 2 * c)}
    pos = torch.arange(S)
    local = [SHARD[layout](pos, r, world_size, dim=0) for r in range(world_size)]
    wl, wr = window if window is not None else (-1, -1)
    wr = 0 if causal else wr
    count = torch.zeros(S, S, dtype=torch.int64)
    for rank in range(world_size):
        for src in range(world_size):
            for rows, cols, cq, ck in _position_calls(layout, causal, window, rank, src,
                                                      world_size, n if known_len else None):
                qpos, kpos = local[rank][parts[rows]], local[src][parts[cols]]
                assert torch.equal(qpos, torch.arange(cq * n, cq * n + n))
                assert torch.equal(kpos, torch.arange(ck * n, ck * n + n))
                vis = visible_mask(n, n, wl, wr, pos_offset=(cq * n, ck * n))
                count[qpos[:, None], kpos[None, :]] += vis.long()
    assert torch.equal(count, visible_mask(S, S, wl, wr).long())


def test_argument_errors():
    # Checked before any process group is needed (none exists in this process).
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        ring_flash_attn_func(q, q, q, dropout_p=1.0)
    with pytest.raises(ValueError, match="window_size must be a pair"):
        ring_flash_attn_func(q, q, q, window_size=3)
    with pytest.raises(ValueError, match=r"learnable_sink must be a float32 tensor of shape "
                                         r"\(nheads,\) = \(2,\)"):
        ring_flash_attn_func(q, q, q, learnable_sink=torch.zeros(3))
    with pytest.raises(ValueError, match="learnable_sink must be a float32"):
        ring_flash_attn_func(q, q, q, learnable_sink=torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="layout must be one of"):
        ring_flash_attn_func(q, q, q, layout="striped")
    odd = torch.randn(1, 7, 2, 16)
    with pytest.raises(ValueError, match=r"layout='zigzag' needs an even.*q.shape\[1\] = 7"):
        ring_flash_attn_func(odd, odd, odd, causal=True)
    with pytest.raises(ValueError, match="same local chunk"):
        ring_flash_attn_func(q, q[:, :4], q[:, :4])
    with pytest.raises(ValueError, match="k and v must have the same dtype"):
        ring_flash_attn_func(q, q, q.double())
    with pytest.raises(ValueError, match="q must be a 4-D tensor"):
        ring_flash_attn_func(q[0], q, q)
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="init_process_group"):
            ring_flash_attn_func(odd, odd, odd, layout="plain")
    t = torch.randn(8, 2, 16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="q must be a 3-D tensor"):
        ring_flash_attn_varlen_func(q, q, q, cu, 8)
    with pytest.raises(ValueError, match="cu_seqlens must be a 1-D int32 tensor"):
        ring_flash_attn_varlen_func(t, t, t, cu.long(), 8)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        ring_flash_attn_varlen_func(t, t, t, cu, 8, dropout_p=-0.1)
    with pytest.raises(ValueError, match=r"needs an even.*q.shape\[0\] = 7"):
        ring_flash_attn_varlen_func(t[:7], t[:7], t[:7], cu, 8)


# ---------------------------------------------------------------------------------------------
# Multi-process: each world size's cases, run in one spawn.
#   chunk: the length of one of the layout's chunks (zigzag: S = 2 W chunk, plain: S = W chunk)
#   chunks: varlen, one chunk length per sequence (a zero-length sequence among them)
#   heads: (nheads, nheads_k); group: the global ranks of a subgroup (None: the default group)

#   alibi: None, "h" (nheads,) or "bh" (batch or sequences, nheads) slopes; dropout: dropout_p
#   (rank r seeds torch with seed + r before the call: group rank 0's draw must be broadcast)
_BASE = dict(dtype="fp32", heads=(4, 2), d=32, dv=32, softcap=0.0, deterministic=False,
             group=None, probs=True, window=(-1, -1), sink=False, alibi=None, dropout=0.0)
CASES = {
    1: [dict(layout="zigzag", causal=True, chunk=5)],  # a ring of one: no transfers
    2: [
        dict(layout="zigzag", causal=True, chunk=7),
        dict(layout="plain", causal=True, chunk=9, heads=(4, 4), probs=False),
        dict(layout="zigzag", causal=False, chunk=9, softcap=3.0),
        dict(layout="plain", causal=False, chunk=7, dv=16),
        dict(layout="zigzag", causal=True, chunk=12, dtype="bf16"),
        dict(layout="zigzag", causal=True, chunks=(7, 0, 4)),
        dict(layout="plain", causal=False, chunks=(5, 9), softcap=3.0),
        dict(layout="zigzag", causal=True, chunk=7, window=(5, -1)),
        dict(layout="plain", causal=False, chunk=9, window=(4, 11)),
        dict(layout="zigzag", causal=True, chunk=7, sink=True),
        dict(layout="plain", causal=False, chunks=(5, 0, 3), sink=True),
        dict(layout="zigzag", causal=True, chunk=7, alibi="h", dropout=0.2),
        dict(layout="plain", causal=False, chunk=9, alibi="bh", heads=(4, 1)),
        dict(layout="zigzag", causal=False, chunks=(5, 0, 3), dropout=0.25, sink=True),
        dict(layout="zigzag", causal=True, chunks=(7, 4), window=(5, -1)),
        dict(layout="plain", causal=True, chunks=(6, 3), window=(4, -1), alibi="bh",
             dtype="bf16"),
    ],
    3: [
        dict(layout="zigzag", causal=True, chunk=9, softcap=2.5),
        dict(layout="plain", causal=True, chunk=7, heads=(4, 1)),
        dict(layout="zigzag", causal=False, chunk=7, heads=(4, 4), probs=False),
        dict(layout="plain", causal=False, chunk=9, softcap=3.0),
        dict(layout="zigzag", causal=True, chunk=7, group=(1, 2), deterministic=True),
        dict(layout="zigzag", causal=True, chunks=(3, 5), heads=(4, 1), softcap=2.0),
        dict(layout="plain", causal=True, chunks=(7, 2, 0), group=(0, 2)),
        dict(layout="zigzag", causal=False, chunk=7, window=(9, 2), heads=(4, 1)),
        dict(layout="plain", causal=True, chunk=8, window=(13, -1), softcap=2.0),
        dict(layout="zigzag", causal=True, chunk=5, sink=True, window=(6, -1), heads=(4, 1)),
        dict(layout="zigzag", causal=True, chunk=7, dropout=0.3, heads=(4, 1)),
        dict(layout="plain", causal=False, chunk=5, alibi="h", window=(6, 2), softcap=2.0),
        dict(layout="zigzag", causal=False, chunks=(3, 5), window=(4, 7), dropout=0.2),
        dict(layout="zigzag", causal=True, chunks=(5, 2), alibi="bh", sink=True,
             dropout=0.1, group=(1, 2)),
    ],
    4: [
        dict(layout="zigzag", causal=True, chunk=7),
        dict(layout="plain", causal=True, chunk=9, softcap=2.0, dv=16),
        dict(layout="zigzag", causal=False, chunk=9, heads=(4, 1)),
        dict(layout="plain", causal=False, chunk=12, dtype="bf16", heads=(4, 4)),
        dict(layout="zigzag", causal=True, chunk=6, dtype="bf16", softcap=2.0,
             deterministic=True),
        dict(layout="zigzag", causal=True, chunks=(3, 1, 6), dtype="bf16", deterministic=True),
        dict(layout="zigzag", causal=False, chunks=(2, 5), dv=16, probs=False),
        dict(layout="zigzag", causal=True, chunk=6, window=(7, -1), dtype="bf16"),
        dict(layout="zigzag", causal=False, chunk=5, window=(-1, 3), deterministic=True),
        dict(layout="zigzag", causal=True, chunks=(2, 3), sink=True, softcap=2.0),
        dict(layout="zigzag", causal=True, chunk=5, alibi="h", dropout=0.15, dtype="bf16",
             deterministic=True),
        dict(layout="plain", causal=True, chunks=(3, 4), window=(6, -1), dropout=0.2),
        dict(layout="zigzag", causal=False, chunk=3, alibi="bh", window=(5, 5), heads=(4, 4)),
    ],
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _case(world_size, i, backend="gloo"):
    case = dict(_BASE, **CASES[world_size][i])
    if backend == "nccl" and case["dtype"] == "fp32":
        case["dtype"] = "bf16"
    group_size = len(case["group"]) if case["group"] else world_size
    per_rank = 2 if case["layout"] == "zigzag" else 1
    case["varlen"] = "chunks" in case
    case["seqlens"] = [group_size * per_rank * c for c in case.get("chunks", [case.get("chunk")])]
    return case


def _case_id(world_size, i, backend="gloo"):
    c = _case(world_size, i, backend)
    parts = [f"w{world_size}", c["layout"], "causal" if c["causal"] else "full",
             ("varlen" if c["varlen"] else "S") + "_".join(map(str, c["seqlens"])), c["dtype"],
             "h{}-{}".format(*c["heads"])]
    if c["dv"] != c["d"]:
        parts.append(f"dv{c['dv']}")
    if c["softcap"]:
        parts.append("softcap")
    if c["deterministic"]:
        parts.append("det")
    if c["group"]:
        parts.append("group" + "".join(map(str, c["group"])))
    if c["window"] != (-1, -1):
        parts.append("window{}x{}".format(*c["window"]))
    if c["sink"]:
        parts.append("sink")
    if c["alibi"]:
        parts.append("alibi_" + c["alibi"])
    if c["dropout"]:
        parts.append(f"dropout{c['dropout']}")
    return "-".join(parts)


def _inputs(case, generator):
    H, Hk = case["heads"]
    dtype = DTYPES[case["dtype"]]
    # Padded: batch 2 of one length; varlen: the sequences concatenated (no batch dim).
    lead = [sum(case["seqlens"])] if case["varlen"] else [2, case["seqlens"][0]]

    def randn(*shape):
        return torch.randn(*lead, *shape, generator=generator).to(dtype)

    data = dict(q=randn(H, case["d"]), k=randn(Hk, case["d"]), v=randn(Hk, case["dv"]),
                dout=randn(H, case["dv"]))
    if case["sink"]:
        data["sink"] = torch.randn(H, generator=generator)
    if case["alibi"]:
        batch = len(case["seqlens"]) if case["varlen"] else 2
        slopes = torch.rand(H, generator=generator) * 0.3 + 0.02
        if case["alibi"] == "bh":
            slopes = slopes * (torch.rand(batch, 1, generator=generator) + 0.5)
        data["alibi"] = slopes.contiguous()
    if case["varlen"]:
        data["cu"] = torch.tensor([0] + torch.tensor(case["seqlens"]).cumsum(0).tolist(),
                                  dtype=torch.int32)
    return data


def _run_case(case, data, group):
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    seq_dim = 0 if case["varlen"] else 1
    lse_dim = seq_dim + 1
    if case["varlen"]:
        cu_local = data["cu"] // world_size
        max_local = max(n // world_size for n in case["seqlens"])

        def attn(*qkv, **kw):
            return ring_flash_attn_varlen_func(*qkv, cu_local, max_local, **kw)

        shard_kw, gather_kw = dict(cu_seqlens=data["cu"]), dict(cu_seqlens=cu_local)
    else:
        attn, shard_kw, gather_kw = ring_flash_attn_func, {}, {}

    def shard(x):
        return SHARD[case["layout"]](x, rank, world_size, dim=seq_dim, **shard_kw)

    def gather(x, dim):
        return GATHER[case["layout"]](x, group=group, dim=dim, **gather_kw)

    q, k, v = (shard(data[n]).requires_grad_() for n in ("q", "k", "v"))
    dout = shard(data["dout"])
    kw = dict(group=group, causal=case["causal"], softcap=case["softcap"],
              deterministic=case["deterministic"], layout=case["layout"])
    if case["window"] != (-1, -1):
        kw["window_size"] = case["window"]
    sink = data["sink"].clone().requires_grad_() if case["sink"] else None
    if sink is not None:
        kw["learnable_sink"] = sink
    if case["alibi"]:
        kw["alibi_slopes"] = data["alibi"]
    if case["dropout"]:
        kw["dropout_p"] = case["dropout"]
    # Every rank its own torch seed: only group rank 0's dropout draw counts (broadcast).
    torch.manual_seed(data["rng_seed"] + dist.get_rank())
    if case["probs"]:
        out, lse, probs = attn(q, k, v, return_attn_probs=True, **kw)
        assert probs is None
        want = (q.shape[1], q.shape[0]) if case["varlen"] else (q.shape[0], q.shape[2],
                                                                 q.shape[1])
        assert lse.dtype == torch.float32 and lse.shape == want
    else:
        out, lse = attn(q, k, v, **kw), None
    assert out.dtype == q.dtype and out.shape == q.shape[:-1] + v.shape[-1:]
    out.backward(dout)
    local = dict(out=out.detach(), dq=q.grad, dk=k.grad, dv=v.grad)
    if lse is not None:
        local["lse"] = lse
    full = {n: gather(t, lse_dim if n == "lse" else seq_dim) for n, t in local.items()}
    if sink is not None:  # the all-reduced gradient: the same on every rank
        full["dsink"] = sink.grad
        others = [torch.empty_like(sink.grad) for _ in range(world_size)]
        dist.all_gather(others, sink.grad, group=group)
        assert all(torch.equal(o, sink.grad) for o in others), "dsink differs across ranks"
    if case["deterministic"]:  # a second run is the same bit for bit
        q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
        torch.manual_seed(data["rng_seed"] + dist.get_rank())  # the same dropout mask
        out2 = attn(q2, k2, v2, **kw)
        out2.backward(dout)
        for name, a, b in (("out", out, out2), ("dq", q.grad, q2.grad), ("dk", k.grad, k2.grad),
                           ("dv", v.grad, v2.grad)):
            assert torch.equal(a, b), f"deterministic rerun differs in {name}"
    # The layout helpers round-trip on this group too.
    assert torch.equal(gather(shard(data["q"]), seq_dim), data["q"])
    return full


def _worker(rank, world_size, port, tmpdir, seed, backend="gloo"):
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    # As conftest.py does in the test process: fresh allocations are NaN, so an element the
    # ring never writes fails the NaN check.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=GLOO_TIMEOUT)
    try:
        cases = [_case(world_size, i, backend) for i in range(len(CASES[world_size]))]
        # new_group is collective over the default group: every rank creates every group.
        groups = [dist.new_group(list(c["group"]), timeout=GLOO_TIMEOUT) if c["group"] else None
                  for c in cases]
        results = {}
        for i, (case, group) in enumerate(zip(cases, groups)):
            if case["group"] and rank not in case["group"]:
                continue
            generator = torch.Generator().manual_seed(seed + i)  # the same data on every rank
            data = {n: x.to(device) for n, x in _inputs(case, generator).items()}
            data["rng_seed"] = _rng_seed(seed, i)
            try:
                full = {n: x.cpu() for n, x in _run_case(case, data, group).items()}
            except Exception as e:
                raise RuntimeError(f"case {_case_id(world_size, i)} failed on rank {rank} "
                                   f"(seed {seed})") from e
            if dist.get_rank(group) == 0:
                results[i] = full
        torch.save(results, os.path.join(tmpdir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _rng_seed(seed, i):
    """The torch seed of global rank 0 for case i (rank r seeds this + r)."""
    return seed + 1000 + 17 * i


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world_size, tmpdir, seed, backend="gloo"):
    ctx = mp.start_processes(_worker,
                             args=(world_size, _free_port(), str(tmpdir), seed, backend),
                             nprocs=world_size, join=False, start_method="spawn")
    deadline = time.monotonic() + JOIN_DEADLINE_S
    while not ctx.join(timeout=5):  # raises ProcessRaisedException with the worker's traceback
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"ring workers (world size {world_size}) still running after "
                               f"{JOIN_DEADLINE_S} s")
    results = {}
    for r in range(world_size):
        results.update(torch.load(os.path.join(tmpdir, f"rank{r}.pt")))
    return results


_RUNS = {}  # (backend, world size) -> (seed, results or the exception of its spawn)


def _results(backend, world_size, tmp_path_factory, seed):
    if (backend, world_size) not in _RUNS:
        tmpdir = tmp_path_factory.mktemp(f"ring_{backend}{world_size}")
        try:
            _RUNS[backend, world_size] = (seed, _spawn(world_size, tmpdir, seed, backend))
        except Exception as e:  # every case of this spawn fails with it
            _RUNS[backend, world_size] = (seed, e)
    return _RUNS[backend, world_size]


MP_CASES = [(w, i) for w in sorted(CASES) for i in range(len(CASES[w]))]
MP_PARAMS = [pytest.param("gloo", w, i, id=_case_id(w, i), marks=needs_gloo)
             for w, i in MP_CASES] + \
    [pytest.param("nccl", w, i, id="nccl-" + _case_id(w, i, "nccl"),
                  marks=pytest.mark.skipif(_nccl_skip(w) is not None,
                                           reason=_nccl_skip(w) or ""))
     for w, i in MP_CASES]


@pytest.mark.parametrize("backend,world_size,index", MP_PARAMS)
def test_ring_matches_reference(backend, world_size, index, tmp_path_factory, seed):
    """The ring's forward and gradients, gathered to the full sequence, against the float64
    reference of the full sequence: on gloo with CPU ranks, and on NCCL with a GPU per rank
    where the machine has them (issue 19: bf16 for the fp32 cases there)."""
    run_seed, results = _results(backend, world_size, tmp_path_factory, seed)
    where = f"ring run seed {run_seed} (replay: FLASHATTN_TEST_SEED={run_seed})"
    if isinstance(results, Exception):
        raise AssertionError(f"ring workers failed; {where}") from results
    case = _case(world_size, index, backend)
    data = _inputs(case, torch.Generator().manual_seed(run_seed + index))
    opts = dict(causal=case["causal"], softcap=case["softcap"], window_size=case["window"])
    ours = results[index]
    if case["alibi"] or case["dropout"]:
        if case["alibi"]:
            opts["alibi_slopes"] = data["alibi"]
        if case["dropout"]:
            # flash_attn_func's draw after the seed of the group's rank 0 (its global rank).
            torch.manual_seed(_rng_seed(run_seed, index) + min(case["group"] or [0]))
            # (NCCL: drawn on the GPU, as the worker of cuda:0 .. did from the same seed)
            rng = _rng_state(data["q"].cuda() if backend == "nccl" else data["q"],
                             case["dropout"]).cpu()
            batch = len(case["seqlens"]) if case["varlen"] else 2
            S = max(case["seqlens"])
            opts["dropout_keep"] = dropout_keep_ref(rng, batch, case["heads"][0], S, S,
                                                    case["dropout"])
            opts["dropout_scale"] = dropout_scale_ref(case["dropout"])
            opts["out_used"] = ours["out"]  # the backward's D is from the stored out
        cu = (data["cu"], data["cu"]) if case["varlen"] else None
        ref, low = ref_and_lowp_ext(data["q"], data["k"], data["v"], data["dout"],
                                    data.get("sink"), cu_seqlens=cu, **opts)
    elif case["sink"]:
        cu = (data["cu"], data["cu"]) if case["varlen"] else None
        ref, low = ref_and_lowp_ext(data["q"], data["k"], data["v"], data["dout"], data["sink"],
                                    cu_seqlens=cu, **opts)
    elif case["varlen"]:
        ref, low = ref_and_lowp_varlen(data["q"], data["k"], data["v"], data["cu"], data["cu"],
                                       data["dout"], **opts)
    else:
        ref, low = ref_and_lowp(data["q"], data["k"], data["v"], data["dout"], **opts)
    assert ("lse" in ours) == case["probs"]
    try:
        check_results(ours, ref, low, DTYPES[case["dtype"]])
        if case["sink"]:
            assert_close("dsink", ours["dsink"], ref["dsink"], low["dsink"],
                         DTYPES[case["dtype"]], 3.0, ref["dsink"].abs().max().item())
    except AssertionError as e:
        raise AssertionError(f"{e}; {where}") from None

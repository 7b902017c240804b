"""Context-parallel (ring) attention over torch.distributed.

One long sequence is cut along its length across the ranks of a process group; every rank holds
its own chunk of Q, K and V in flash_attn_func's layout, (batch, seqlen_local, nheads, headdim).
The K/V chunks travel round the ring (rank r sends to r + 1 and receives from r - 1, point to
point), each rank attends its queries to every chunk as it passes, and the partial results merge
exactly through their log-sum-exp. The next chunk's transfer is issued before the current chunk
is computed on, so communication overlaps computation. The backward sends K/V round again, with
fp32 dK/dV accumulators that collect every rank's contribution and arrive home after W steps.

Layouts (W = the group's size, S = the full sequence length):

    "plain"   the sequence cut into W equal chunks; rank r holds chunk r.
    "zigzag"  the sequence cut into 2W equal chunks; rank r holds chunks r and 2W - 1 - r,
              concatenated in that order (so S_local = S / W, and S_local is even).

Under causal masking the plain layout gives rank W - 1 all the work (its queries see every key)
and rank 0 almost none; zigzag pairs an early chunk with a late one, so every rank computes the
same number of visible (query, key) pairs. Use zigzag_shard / plain_shard to lay out full
tensors and zigzag_gather / plain_gather to collect local results back to the full sequence.
"""
import torch
import torch.distributed as dist

from ..interface import _options, _result

__all__ = [
    "ring_flash_attn_func",
    "zigzag_shard",
    "zigzag_gather",
    "plain_shard",
    "plain_gather",
    "merge_attn_partials",
]

LAYOUTS = ("zigzag", "plain")
_OFFSETS_MISSING = "needs the global query/key offsets the ops do not take yet"
# Tags keep the K/V stream and the backward's dK/dV stream apart (gloo matches by tag; NCCL
# ignores tags and matches by issue order, which is the same on every rank).
_TAG_KV, _TAG_DKV = 0, 1


# ---------------------------------------------------------------------------------------------
# Layout helpers.
# ---------------------------------------------------------------------------------------------

def _check_shard_args(fn, x, rank, world_size, dim, parts):
    if world_size < 1:
        raise ValueError(f"flashattn: {fn}: world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"flashattn: {fn}: rank must be in [0, {world_size}), got {rank}")
    n = x.shape[dim]
    if n % parts:
        raise ValueError(
            f"flashattn: {fn}: x.shape[{dim}] = {n} must be divisible by {parts} "
            f"({'2 * ' if fn.startswith('zigzag') else ''}world_size)")
    return n // parts


def zigzag_shard(x, rank, world_size, dim=1):
    """Rank `rank`'s part of the full tensor `x` in the zigzag layout.

    x.shape[dim] (the full sequence length S) is cut into 2 * world_size equal chunks; the
    result is chunks rank and 2 * world_size - 1 - rank concatenated along `dim` (a new
    contiguous tensor of length S / world_size). Raises ValueError if S is not divisible by
    2 * world_size.
    """
    c = _check_shard_args("zigzag_shard", x, rank, world_size, dim, 2 * world_size)
    first = x.narrow(dim, rank * c, c)
    second = x.narrow(dim, (2 * world_size - 1 - rank) * c, c)
    return torch.cat((first, second), dim)


def plain_shard(x, rank, world_size, dim=1):
    """Rank `rank`'s part of the full tensor `x` in the plain (contiguous) layout: chunk `rank`
    of world_size equal chunks along `dim` (a contiguous tensor). Raises ValueError if
    x.shape[dim] is not divisible by world_size."""
    c = _check_shard_args("plain_shard", x, rank, world_size, dim, world_size)
    return x.narrow(dim, rank * c, c).contiguous()


def _zigzag_unshard(pieces, dim):
    """The full tensor from every rank's zigzag part, in rank order."""
    halves = [p.chunk(2, dim) for p in pieces]
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim)


def _all_gather(x, group):
    x = x.contiguous()
    pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, x, group=group)
    return pieces


def zigzag_gather(x_local, group=None, dim=1):
    """The full tensor on every rank of `group` (None: the default group) from each rank's
    zigzag part `x_local` (the inverse of zigzag_shard). A collective: every rank calls it with
    a tensor of the same shape. Not differentiable."""
    if x_local.shape[dim] % 2:
        raise ValueError(f"flashattn: zigzag_gather: x_local.shape[{dim}] = "
                         f"{x_local.shape[dim]} must be even (two chunks per rank)")
    return _zigzag_unshard(_all_gather(x_local, group), dim)


def plain_gather(x_local, group=None, dim=1):
    """The full tensor on every rank of `group` (None: the default group) from each rank's
    plain-layout part `x_local` (the inverse of plain_shard). A collective: every rank calls it
    with a tensor of the same shape. Not differentiable."""
    return torch.cat(_all_gather(x_local, group), dim)


# ---------------------------------------------------------------------------------------------
# Exact merge of partial attention results.
# ---------------------------------------------------------------------------------------------

def merge_attn_partials(outs, lses):
    """Merge attention results over disjoint key sets into the result over their union.

    outs: sequence of (batch, seqlen, nheads, headdim_v) tensors; lses: their softmax_lse,
    (batch, nheads, seqlen). Returns (out, lse) in fp32:
        lse = logsumexp_i lse_i,   out = sum_i exp(lse_i - lse) * out_i.
    Computed against the row maximum, so no exponent overflows; a row whose lse_i is -inf (no
    visible key in that set) contributes nothing, even if its out_i holds garbage, and a row
    that is -inf in every partial gives out 0 and lse -inf (never NaN).
    """
    if len(outs) != len(lses) or not outs:
        raise ValueError(f"flashattn: merge_attn_partials: need as many outs as lses (at least "
                         f"one), got {len(outs)} and {len(lses)}")
    lses = [lse.float() for lse in lses]
    m = lses[0]
    for lse in lses[1:]:
        m = torch.maximum(m, lse)
    # All -inf: shift by 0 instead (exp(-inf - 0) = 0), not by -inf (-inf - -inf = NaN).
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    weights = [torch.exp(lse - m) for lse in lses]
    total = weights[0]
    for w in weights[1:]:
        total = total + w
    lse = m + torch.log(total)  # log(0) = -inf for a row no partial sees
    inv = torch.where(total > 0, 1.0 / total, torch.zeros_like(total))
    out = None
    for o, w in zip(outs, weights):
        w = (w * inv).transpose(1, 2).unsqueeze(-1)  # (B, H, S) -> (B, S, H, 1)
        term = torch.where(w > 0, w * o.float(), torch.zeros((), device=o.device))
        out = term if out is None else out + term
    return out, lse


# ---------------------------------------------------------------------------------------------
# The ring: one packed message per transfer, issued asynchronously.
# ---------------------------------------------------------------------------------------------

class _Ring:
    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.next = (self.rank + 1) % self.world_size
        self.prev = (self.rank - 1) % self.world_size

    def exchange(self, buf, tag):
        """Send `buf` to the next rank and receive the previous rank's into a new buffer.
        Returns (received buffer, works); it is valid, and `buf` reusable, after _wait(works)."""
        if self.world_size == 1:
            return buf, []
        recv = torch.empty_like(buf)
        ops = [dist.P2POp(dist.isend, buf, group=self.group, tag=tag, group_peer=self.next),
               dist.P2POp(dist.irecv, recv, group=self.group, tag=tag, group_peer=self.prev)]
        return recv, dist.batch_isend_irecv(ops)


def _wait(works):
    for w in works:
        w.wait()


def _pack(tensors, dtype=None):
    """One contiguous flat buffer holding `tensors` (so one message carries K and V)."""
    return torch.cat([t.reshape(-1).to(dtype or t.dtype) for t in tensors])


def _unpack(buf, shapes):
    views, start = [], 0
    for shape in shapes:
        n = shape.numel()
        views.append(buf[start:start + n].view(shape))
        start += n
    return views


def _step_pair(layout, causal, rank, src, seqlen):
    """What rank `rank`'s queries compute against the K/V chunk of rank `src`: None (hidden) or
    (query rows, key rows, causal) with rows as slices of the local sequence.

    Chunk-level causality: query chunk i sees key chunk j fully if j < i, on the diagonal if
    j == i (a causal call on equal lengths: bottom-right alignment is then the global mask),
    not at all if j > i. Zigzag, rank r holds chunks (r, 2W-1-r): src == r is the diagonal of
    both halves plus (second half, first half) full, one causal call over the local sequence;
    src < r: both query halves see the first key half only; src > r: the second query half
    sees both key halves, the first none.
    """
    every = slice(0, seqlen)
    if not causal:
        return every, every, False
    if src == rank:
        return every, every, True
    if layout == "plain":
        return (every, every, False) if src < rank else None
    half = seqlen // 2
    if src < rank:
        return every, slice(0, half), False
    return slice(half, seqlen), every, False


# ---------------------------------------------------------------------------------------------
# Forward and backward.
# ---------------------------------------------------------------------------------------------

class _RingFlashAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, softmax_scale, causal, softcap, deterministic, layout):
        ring = _Ring(group)
        batch, seqlen, nheads, _ = q.shape
        opts = dict(softmax_scale=softmax_scale, window_left=-1, softcap=softcap,
                    alibi_slopes=None, deterministic=deterministic)
        out_acc = q.new_zeros((batch, seqlen, nheads, v.shape[-1]), dtype=torch.float32)
        lse_acc = q.new_full((batch, nheads, seqlen), float("-inf"), dtype=torch.float32)
        shapes = (k.shape, v.shape)
        kv = _pack((k, v))
        for step in range(ring.world_size):
            last = step == ring.world_size - 1
            if not last:  # the next chunk is in flight while this one is computed on
                kv_next, works = ring.exchange(kv, _TAG_KV)
            src = (ring.rank - step) % ring.world_size
            pair = _step_pair(layout, causal, ring.rank, src, seqlen)
            if pair is not None:
                rows, cols, is_causal = pair
                kc, vc = _unpack(kv, shapes)
                o, lse = torch.ops.flashattn.fwd(
                    q[:, rows], kc[:, cols], vc[:, cols], causal=is_causal,
                    window_right=0 if is_causal else -1, **opts)
                o, lse = merge_attn_partials((out_acc[:, rows], o),
                                             (lse_acc[:, :, rows], lse))
                out_acc[:, rows] = o
                lse_acc[:, :, rows] = lse
            if not last:
                _wait(works)
                kv = kv_next
        out = out_acc.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse_acc)
        ctx.mark_non_differentiable(lse_acc)
        ctx.ring = ring
        ctx.opts = opts
        ctx.causal = causal
        ctx.layout = layout
        return out, lse_acc

    @staticmethod
    def backward(ctx, dout, _dlse):
        # softmax_lse is marked non-differentiable: its incoming gradient is ignored.
        q, k, v, out, lse = ctx.saved_tensors
        ring = ctx.ring
        seqlen = q.shape[1]
        shapes = (k.shape, v.shape)
        dq_acc = torch.zeros_like(q, dtype=torch.float32)
        kv = _pack((k, v))
        dkv_works = []
        for step in range(ring.world_size):
            last = step == ring.world_size - 1
            if not last:
                kv_next, kv_works = ring.exchange(kv, _TAG_KV)
            src = (ring.rank - step) % ring.world_size
            pair = _step_pair(ctx.layout, ctx.causal, ring.rank, src, seqlen)
            if pair is not None:
                rows, cols, is_causal = pair
                kc, vc = _unpack(kv, shapes)
                # With the merged out and lse, a pair's backward gives its exact share
                # (the op's D = rowsum(dout * out) is then the global one).
                dq, dk, dv = torch.ops.flashattn.bwd(
                    dout[:, rows], q[:, rows], kc[:, cols], vc[:, cols], out[:, rows],
                    lse[:, :, rows], causal=is_causal, window_right=0 if is_causal else -1,
                    **ctx.opts)
                dq_acc[:, rows] += dq
            # The fp32 dK/dV accumulator of src's chunk: fresh at step 0, else what the
            # previous rank sent after its own step (that transfer overlapped this compute).
            if step == 0:
                dkv = q.new_zeros(k.numel() + v.numel(), dtype=torch.float32)
            else:
                _wait(dkv_works)
                dkv = dkv_next
            if pair is not None:
                dk_acc, dv_acc = _unpack(dkv, shapes)
                dk_acc[:, cols] += dk
                dv_acc[:, cols] += dv
            dkv_next, dkv_works = ring.exchange(dkv, _TAG_DKV)
            if not last:
                _wait(kv_works)
                kv = kv_next
        _wait(dkv_works)  # after W steps each chunk's accumulator is back on its own rank
        dk, dv = _unpack(dkv_next, shapes)
        return (dq_acc.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype),
                None, None, None, None, None, None)


def _check_inputs(q, k, v, layout):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"flashattn: ring_flash_attn_func: {name} must be a 4-D tensor "
                             f"(batch, seqlen_local, nheads, headdim), got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t)}")
    if k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
        raise ValueError(
            f"flashattn: ring_flash_attn_func: q, k and v must hold the same local chunk of one "
            f"sequence; got seqlen_local {q.shape[1]} (q), {k.shape[1]} (k), {v.shape[1]} (v)")
    if k.dtype != v.dtype:
        raise ValueError(f"flashattn: ring_flash_attn_func: k and v must have the same dtype, "
                         f"got {k.dtype} and {v.dtype}")
    if layout not in LAYOUTS:
        raise ValueError(f"flashattn: ring_flash_attn_func: layout must be one of {LAYOUTS}, "
                         f"got {layout!r}")
    if layout == "zigzag" and q.shape[1] % 2:
        raise ValueError(
            f"flashattn: ring_flash_attn_func: layout='zigzag' needs an even local sequence "
            f"length (two chunks per rank), got q.shape[1] = {q.shape[1]}")


def ring_flash_attn_func(
    q,
    k,
    v,
    group=None,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    layout="zigzag",
):
    """Exact attention over one sequence split across the ranks of `group` (ring attention).

    Every rank of the group calls it with its local chunk (a collective: same shapes, options
    and layout on every rank); the result equals flash_attn_func on the full sequence,
    restricted to the local rows, forward and backward (through autograd).

    Arguments:
        q: (batch, seqlen_local, nheads, headdim), this rank's query rows.
        k: (batch, seqlen_local, nheads_k, headdim), this rank's key rows (nheads a multiple of
            nheads_k: MQA/GQA).
        v: (batch, seqlen_local, nheads_k, headdim_v).
        group: the torch.distributed process group of the ring (None: the default group);
            every transfer runs on it.
        dropout_p: must be 0.0 (NotImplementedError): dropout masks would have to be drawn
            at global positions, which needs the global query/key offsets the ops do not
            take yet.
        softmax_scale: scale of q.k before the softmax; None means 1 / sqrt(headdim).
        causal: causal mask over the full sequence (query at global position i sees keys
            j <= i). Use layout="zigzag" for an even load across the ranks.
        window_size: must be (-1, -1) (NotImplementedError): a sliding window needs the
            global query/key offsets the ops do not take yet.
        softcap: if > 0, scores become softcap * tanh(score / softcap).
        alibi_slopes: must be None (NotImplementedError): the ALiBi bias depends on global
            positions, which needs the global query/key offsets the ops do not take yet.
        deterministic: passed to every backward call (the ring's own sums run in a fixed
            order, so the result is then the same bit for bit on reruns).
        return_attn_probs: if True return (out, softmax_lse, None), like flash_attn_func.
        layout: how the full sequence (length S, world size W) is laid out over the ranks:
            "zigzag": S cut into 2W chunks, rank r holds chunks r and 2W-1-r concatenated
            (seqlen_local = S / W, even); "plain": S cut into W chunks, rank r holds chunk r.
            zigzag_shard / plain_shard produce these from full tensors.

    Returns:
        out: (batch, seqlen_local, nheads, headdim_v) in q's dtype, or (out, softmax_lse, None)
        with return_attn_probs; softmax_lse fp32 (batch, nheads, seqlen_local), the log-sum-exp
        of each local query row over the whole sequence's keys.
    """
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"flashattn: ring_flash_attn_func: dropout_p = {dropout_p} is not supported: "
            f"dropout {_OFFSETS_MISSING}")
    if alibi_slopes is not None:
        raise NotImplementedError(
            f"flashattn: ring_flash_attn_func: alibi_slopes is not supported: the ALiBi bias "
            f"{_OFFSETS_MISSING}")
    _check_inputs(q, k, v, layout)
    # The user's window as given (causal=False here: causal's window_right = 0 is ours).
    opts = _options(q, 0.0, softmax_scale, False, window_size, softcap, None, deterministic)
    if opts["window_left"] >= 0 or opts["window_right"] >= 0:
        raise NotImplementedError(
            f"flashattn: ring_flash_attn_func: window_size = {tuple(window_size)} is not "
            f"supported (only (-1, -1)): a sliding window {_OFFSETS_MISSING}")
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("flashattn: ring_flash_attn_func needs an initialised "
                           "torch.distributed process group (torch.distributed."
                           "init_process_group)")
    if dist.get_rank(group) < 0:
        raise ValueError("flashattn: ring_flash_attn_func: this rank is not a member of group")
    out, softmax_lse = _RingFlashAttn.apply(
        q, k, v, group, opts["softmax_scale"], bool(causal), opts["softcap"],
        bool(deterministic), layout)
    return _result(out, softmax_lse, return_attn_probs)

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

Under causal masking, plain leaves rank r with r full chunk pairs and a diagonal, so the last
rank computes about 2W - 1 times as much as rank 0 and the ring waits for it at every step.
Zigzag pairs an early chunk with a late one: at every step after the first, each rank computes
exactly half of a (local query x local key) block, at the first its causal diagonal, so the
ranks stay in step. Without a mask both layouts do the same work. zigzag_shard / plain_shard
lay out full tensors, zigzag_gather / plain_gather collect local results back (layout.py). The
varlen twin, ring_flash_attn_varlen_func, lays out every sequence of a packed batch so. The
partial results of the steps merge through merge.py.
"""
import torch
import torch.distributed as dist

from ..interface import _options, _result, _rng_state
from .merge import merge_attn_partials

__all__ = ["ring_flash_attn_func", "ring_flash_attn_varlen_func"]

LAYOUTS = ("zigzag", "plain")
# Tags keep the K/V stream and the backward's dK/dV stream apart (gloo matches by tag; NCCL
# ignores tags and matches by issue order, which is the same on every rank).
_TAG_KV, _TAG_DKV = 0, 1



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


def _step_pair(layout, causal, rank, src):
    """What rank `rank`'s queries compute against the K/V chunk of rank `src`: None (hidden) or
    (query rows, key rows, causal), rows "all", "first" or "second" (half of each sequence).

    Chunk-level causality: query chunk i sees key chunk j fully if j < i, on the diagonal if
    j == i (a causal call on equal lengths: bottom-right alignment is then the global mask),
    not at all if j > i. Zigzag, rank r holds chunks (r, 2W-1-r): src == r is the diagonal of
    both halves plus (second half, first half) full, one causal call over the local sequence;
    src < r: both query halves see the first key half only; src > r: the second query half
    sees both key halves, the first none.
    """
    if not causal:
        return "all", "all", False
    if src == rank:
        return "all", "all", True
    if layout == "plain":
        return ("all", "all", False) if src < rank else None
    return ("all", "first", False) if src < rank else ("second", "all", False)


def _pieces(layout, rank, world_size, seqlen_local):
    """(global start, local start, length) of each chunk a rank holds (one plain, two zigzag)."""
    if layout == "plain":
        return [(rank * seqlen_local, 0, seqlen_local)]
    half = seqlen_local // 2
    return [(rank * half, 0, half), ((2 * world_size - 1 - rank) * half, half, half)]


def _window_pairs(layout, rank, src, world_size, seqlen_local, window_left, window_right):
    """The calls of rank `rank`'s queries against the K/V chunk of rank `src` under a sliding
    window over the full sequence (window_right 0 when causal; -1 = unbounded side): a list of
    (query rows, key rows, window_left, window_right), rows as local slices, for calls whose
    own window (bottom-right aligned on their lengths) is the global one.

    A query chunk at global offset gq against a key chunk at gk (equal lengths n): with d =
    gq - gk, local query i sees local key j iff i + d - wl <= j <= i + d + wr, a band [i + lo,
    i + hi]. A band round the diagonal (lo <= 0 <= hi) is the window (-lo, hi) on the chunks;
    one right of it (lo > 0) leaves the last lo queries without keys: the first n - lo queries
    against all keys give the shift lo and the window (0, hi - lo); one left of it (hi < 0)
    leaves the last -hi keys unseen: all queries against the first n + hi keys give the shift
    hi and the window (hi - lo, 0). A band outside the chunks is no call.
    """
    pairs = []
    for gq, lq, n in _pieces(layout, rank, world_size, seqlen_local):
        for gk, lk, _ in _pieces(layout, src, world_size, seqlen_local):
            d = gq - gk
            lo = None if window_left < 0 else d - window_left
            hi = None if window_right < 0 else d + window_right
            if (lo is not None and lo >= n) or (hi is not None and hi <= -n) or n == 0:
                continue
            if lo is not None and lo > 0:
                pairs.append((slice(lq, lq + n - lo), slice(lk, lk + n), 0,
                              -1 if hi is None else hi - lo))
            elif hi is not None and hi < 0:
                pairs.append((slice(lq, lq + n), slice(lk, lk + n + hi),
                              -1 if lo is None else hi - lo, 0))
            else:
                pairs.append((slice(lq, lq + n), slice(lk, lk + n),
                              -1 if lo is None else -lo, -1 if hi is None else hi))
    return pairs


def _step_calls(layout, causal, window, rank, src, world_size, seqlen_local):
    """Every call of one ring step: (query rows, key rows, window_left, window_right), rows
    "all" / "first" / "second" or local slices (window: padded layout only)."""
    if window is not None:
        wl, wr = window
        return _window_pairs(layout, rank, src, world_size, seqlen_local, wl,
                             0 if causal else wr)
    pair = _step_pair(layout, causal, rank, src)
    if pair is None:
        return []
    qp, kp, is_causal = pair
    return [(qp, kp, -1, 0 if is_causal else -1)]


def _chunk_parts(layout, rank, world_size):
    """(rows, chunk index) of each chunk a rank holds: plain ("all", r); zigzag ("first", r)
    and ("second", 2W - 1 - r)."""
    if layout == "plain":
        return [("all", rank)]
    return [("first", rank), ("second", 2 * world_size - 1 - rank)]


def _position_calls(layout, causal, window, rank, src, world_size, chunk_len):
    """The calls of one ring step with position offsets (ALiBi, dropout, varlen windows): every
    (query chunk, key chunk) pair, as (query rows, key rows, query chunk, key chunk). Chunks
    of one sequence have equal lengths n, so each call is square and, given the offsets
    chunk * n, the op's own mask, ALiBi and dropout (params.h: positions i + q_pos_offset,
    j + k_pos_offset, diagonal shift sk - sq = 0) are the full sequence's. Pairs no row sees
    are left out: key chunk after query chunk when causal; with a window and a known chunk
    length n (padded), a band outside the pair (varlen: the kernel skips what it hides)."""
    calls = []
    for qp, cq in _chunk_parts(layout, rank, world_size):
        for kp, ck in _chunk_parts(layout, src, world_size):
            if causal and ck > cq:
                continue
            if window is not None and chunk_len is not None:
                d, n = (cq - ck) * chunk_len, chunk_len
                wl, wr = window[0], 0 if causal else window[1]
                if n == 0 or (wl >= 0 and d - wl >= n) or (wr >= 0 and d + wr <= -n):
                    continue
            calls.append((qp, kp, cq, ck))
    return calls


class _PaddedRows:
    """The local rows of the padded layout: slices along dim 1 (softmax_lse: dim 2)."""

    def __init__(self, seqlen, zigzag=True):
        half = seqlen // 2
        self.seqlen = seqlen
        self.chunk_len = half if zigzag else seqlen  # the length of one chunk of the layout
        self.sel = {"all": slice(0, seqlen), "first": slice(0, half),
                    "second": slice(half, seqlen)}

    def pos_offset(self, q, chunk):
        """The op's q_pos_offset / k_pos_offset of chunk `chunk`: int32 (batch,)."""
        return torch.full((q.shape[0],), chunk * self.chunk_len, dtype=torch.int32,
                          device=q.device)

    @staticmethod
    def lse_shape(q):
        return q.shape[0], q.shape[2], q.shape[1]

    def take(self, x, part, lse=False):
        rows = part if isinstance(part, slice) else self.sel[part]
        return x[:, :, rows] if lse else x[:, rows]

    def put(self, acc, part, value, lse=False):
        self.take(acc, part, lse).copy_(value)

    # The learnable sink in the lse layout (batch, nheads, seqlen); a per-row factor of the lse
    # layout onto out's (batch, seqlen, nheads, dv); a rowsum of out's layout onto the lse's;
    # the sum over everything but the heads.
    @staticmethod
    def sink_like(sink):
        return sink.float().view(1, -1, 1)

    @staticmethod
    def lse_to_out(x):
        return x.transpose(1, 2).unsqueeze(-1)

    @staticmethod
    def rows_to_lse(x):
        return x.transpose(1, 2)

    @staticmethod
    def head_sum(x):
        return x.sum(dim=(0, 2))

    def add(self, acc, part, value):
        self.take(acc, part).add_(value)

    def fwd(self, q, k, v, qpart, kpart, **opts):
        return torch.ops.flashattn.fwd(q, k, v, **opts)

    def bwd(self, dout, q, k, v, out, lse, qpart, kpart, **opts):
        return torch.ops.flashattn.bwd(dout, q, k, v, out, lse, **opts)[:3]


class _VarlenRows:
    """The local rows of the varlen layout (dim 0; softmax_lse: dim 1) of sequences delimited
    by the local cu_seqlens; a half is each sequence's first (second) half, picked by an index
    built on the device (no host sync), clamped so that wrong metadata cannot index out of
    bounds."""

    def __init__(self, cu_seqlens, max_seqlen, total, zigzag):
        self.sel = {"all": (None, cu_seqlens, max_seqlen)}
        # Each sequence's chunk length (int32 (batch,), on the device): the position offsets of
        # its chunk c are c times it. Unknown on the host (no sync): the windows' pair skipping
        # is the kernel's (chunk_len None).
        lens = (cu_seqlens[1:] - cu_seqlens[:-1]).clamp(min=0)
        self.seq_chunk_len = (lens // 2 if zigzag else lens).to(torch.int32)
        self.chunk_len = None
        if not zigzag:
            return
        # Every local sequence has even length, so the halves' boundaries are cu_seqlens // 2;
        # first-half row i of sequence b is local row cu[b] + (i - cu[b] / 2).
        cu = cu_seqlens.long()
        cu_half = cu // 2
        i = torch.arange(total // 2, device=cu.device)
        seq = (torch.searchsorted(cu_half, i, right=True) - 1).clamp(0, max(cu.numel() - 2, 0))
        first = cu[seq] + (i - cu_half[seq])
        second = first + (cu[seq + 1] - cu[seq]) // 2
        half_max = (max_seqlen + 1) // 2
        self.sel["first"] = (first.clamp(0, max(total - 1, 0)), cu_half.int(), half_max)
        self.sel["second"] = (second.clamp(0, max(total - 1, 0)), cu_half.int(), half_max)

    def pos_offset(self, q, chunk):
        """The op's q_pos_offset / k_pos_offset of chunk `chunk`: int32 (batch,)."""
        return self.seq_chunk_len * chunk

    @staticmethod
    def lse_shape(q):
        return q.shape[1], q.shape[0]

    # As _PaddedRows's, for lse (nheads, total) and out (total, nheads, dv).
    @staticmethod
    def sink_like(sink):
        return sink.float().view(-1, 1)

    @staticmethod
    def lse_to_out(x):
        return x.transpose(0, 1).unsqueeze(-1)

    @staticmethod
    def rows_to_lse(x):
        return x.transpose(0, 1)

    @staticmethod
    def head_sum(x):
        return x.sum(dim=1)

    def take(self, x, part, lse=False):
        index = self.sel[part][0]
        return x if index is None else x.index_select(1 if lse else 0, index)

    def put(self, acc, part, value, lse=False):
        index = self.sel[part][0]
        if index is None:
            acc.copy_(value)
        else:
            acc.index_copy_(1 if lse else 0, index, value)

    def add(self, acc, part, value):
        # index_copy_ of a sum rather than index_add_: deterministic on every device.
        self.put(acc, part, self.take(acc, part) + value)

    def fwd(self, q, k, v, qpart, kpart, **opts):
        _, cu_q, max_q = self.sel[qpart]
        _, cu_k, max_k = self.sel[kpart]
        return torch.ops.flashattn.varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, **opts)

    def bwd(self, dout, q, k, v, out, lse, qpart, kpart, **opts):
        _, cu_q, max_q = self.sel[qpart]
        _, cu_k, max_k = self.sel[kpart]
        return torch.ops.flashattn.varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q,
                                              max_k, **opts)[:3]


# ---------------------------------------------------------------------------------------------
# Forward and backward (padded and varlen alike, through the rows object).
# ---------------------------------------------------------------------------------------------

def _window_opts(window_left, window_right):
    return dict(causal=False, window_left=window_left, window_right=window_right)


def _calls(ctx, q, rank, src):
    """Every call of one ring step: (query rows, key rows, the op's mask and position keywords).
    ctx holds layout, causal, window, positions, rows, world_size and seqlen_local."""
    if ctx.positions:
        wl, wr = ctx.window if ctx.window is not None else (-1, -1)
        return [(qp, kp, dict(causal=ctx.causal, window_left=wl,
                              window_right=0 if ctx.causal else wr,
                              q_pos_offset=ctx.rows.pos_offset(q, cq),
                              k_pos_offset=ctx.rows.pos_offset(q, ck)))
                for qp, kp, cq, ck in _position_calls(ctx.layout, ctx.causal, ctx.window, rank,
                                                      src, ctx.world_size, ctx.rows.chunk_len)]
    return [(qp, kp, _window_opts(wl, wr))
            for qp, kp, wl, wr in _step_calls(ctx.layout, ctx.causal, ctx.window, rank, src,
                                              ctx.world_size, ctx.seqlen_local)]


class _RingFlashAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, alibi_slopes, rng_state, rows, group, softmax_scale, causal,
                softcap, deterministic, layout, window, dropout_p):
        ring = _Ring(group)
        opts = dict(softmax_scale=softmax_scale, softcap=softcap, alibi_slopes=alibi_slopes,
                    deterministic=deterministic, dropout_p=dropout_p, rng_state=rng_state)
        seqlen_local = getattr(rows, "seqlen", None)
        # Position offsets where a term depends on global positions: ALiBi, dropout (every rank
        # draws the mask of the global (i, j) with one rng_state), the varlen window (whose
        # per-sequence chunk lengths the host does not know, so it cannot translate it).
        ctx.positions = (alibi_slopes is not None or dropout_p > 0.0 or (
            window is not None and not isinstance(rows, _PaddedRows)))
        ctx.layout, ctx.causal, ctx.window, ctx.rows = layout, causal, window, rows
        ctx.world_size, ctx.seqlen_local = ring.world_size, seqlen_local
        out_acc = q.new_zeros(q.shape[:-1] + v.shape[-1:], dtype=torch.float32)
        lse_acc = q.new_full(rows.lse_shape(q), float("-inf"), dtype=torch.float32)
        shapes = (k.shape, v.shape)
        kv = _pack((k, v))
        for step in range(ring.world_size):
            last = step == ring.world_size - 1
            if not last:  # the next chunk is in flight while this one is computed on
                kv_next, works = ring.exchange(kv, _TAG_KV)
            src = (ring.rank - step) % ring.world_size
            kc, vc = _unpack(kv, shapes)
            for qp, kp, call_opts in _calls(ctx, q, ring.rank, src):
                o, lse = rows.fwd(rows.take(q, qp), rows.take(kc, kp), rows.take(vc, kp), qp, kp,
                                  **call_opts, **opts)
                o, lse = merge_attn_partials((rows.take(out_acc, qp), o),
                                             (rows.take(lse_acc, qp, lse=True), lse))
                rows.put(out_acc, qp, o)
                rows.put(lse_acc, qp, lse, lse=True)
            if not last:
                _wait(works)
                kv = kv_next
        if sink is not None:
            # The sink enters once, here: a key every row sees, with value 0 (flash_attn_func's
            # learnable_sink): lse' = logaddexp(lse, sink), out' = out * exp(lse - lse').
            lse_sink = torch.logaddexp(lse_acc, rows.sink_like(sink).expand_as(lse_acc))
            out_acc = out_acc * rows.lse_to_out(torch.exp(lse_acc - lse_sink))
            lse_acc = lse_sink
        out = out_acc.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse_acc, sink, alibi_slopes, rng_state)
        ctx.mark_non_differentiable(lse_acc)
        ctx.ring = ring
        ctx.opts = {n: x for n, x in opts.items() if n not in ("alibi_slopes", "rng_state")}
        return out, lse_acc

    @staticmethod
    def backward(ctx, dout, _dlse):
        # softmax_lse is marked non-differentiable: its incoming gradient is ignored.
        q, k, v, out, lse, sink, alibi_slopes, rng_state = ctx.saved_tensors
        ring, rows = ctx.ring, ctx.rows
        # The forward's rng_state regenerates its dropout mask (params.h).
        opts = dict(ctx.opts, alibi_slopes=alibi_slopes, rng_state=rng_state)
        # The chunk calls run without the sink: their P = exp(s - lse) with the merged lse
        # (sink included) and D = rowsum(dout * out) are already the global ones. The sink's
        # gradient, -sum_rows exp(sink - lse) D, sums over every rank's rows.
        dsink = None
        if sink is not None and ctx.needs_input_grad[3]:
            d = rows.rows_to_lse((dout.float() * out.float()).sum(-1))
            dsink = -rows.head_sum(torch.exp(rows.sink_like(sink) - lse) * d)
            if ring.world_size > 1:
                dist.all_reduce(dsink, group=ring.group)
        shapes = (k.shape, v.shape)
        dq_acc = torch.zeros_like(q, dtype=torch.float32)
        kv = _pack((k, v))
        dkv_works = []
        for step in range(ring.world_size):
            last = step == ring.world_size - 1
            if not last:
                kv_next, kv_works = ring.exchange(kv, _TAG_KV)
            src = (ring.rank - step) % ring.world_size
            kc, vc = _unpack(kv, shapes)
            grads = []
            for qp, kp, call_opts in _calls(ctx, q, ring.rank, src):
                # With the merged out and lse, a call's backward gives its exact share
                # (the op's D = rowsum(dout * out) is then the global one).
                dq, dk, dv = rows.bwd(
                    rows.take(dout, qp), rows.take(q, qp), rows.take(kc, kp),
                    rows.take(vc, kp), rows.take(out, qp), rows.take(lse, qp, lse=True), qp, kp,
                    **call_opts, **opts)
                rows.add(dq_acc, qp, dq)
                grads.append((kp, dk, dv))
            # The fp32 dK/dV accumulator of src's chunk: fresh at step 0, else what the
            # previous rank sent after its own step (that transfer overlapped this compute).
            if step == 0:
                dkv = q.new_zeros(k.numel() + v.numel(), dtype=torch.float32)
            else:
                _wait(dkv_works)
                dkv = dkv_next
            dk_acc, dv_acc = _unpack(dkv, shapes)
            for kp, dk, dv in grads:
                rows.add(dk_acc, kp, dk)
                rows.add(dv_acc, kp, dv)
            dkv_next, dkv_works = ring.exchange(dkv, _TAG_DKV)
            if not last:
                _wait(kv_works)
                kv = kv_next
        _wait(dkv_works)  # after W steps each chunk's accumulator is back on its own rank
        dk, dv = _unpack(dkv_next, shapes)
        return (dq_acc.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsink) + (None,) * 11


def _check_inputs(fn, q, k, v, layout, varlen):
    dims, names = (3, "(total_local, nheads, headdim)") if varlen else (
        4, "(batch, seqlen_local, nheads, headdim)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != dims:
            raise ValueError(f"flashattn: {fn}: {name} must be a {dims}-D tensor {names}, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t)}")
    seq_dim = 0 if varlen else 1
    if k.shape[seq_dim] != q.shape[seq_dim] or v.shape[seq_dim] != q.shape[seq_dim]:
        raise ValueError(
            f"flashattn: {fn}: q, k and v must hold the same local chunk of one sequence; got "
            f"q.shape[{seq_dim}] = {q.shape[seq_dim]}, k.shape[{seq_dim}] = "
            f"{k.shape[seq_dim]}, v.shape[{seq_dim}] = {v.shape[seq_dim]}")
    if k.dtype != v.dtype:
        raise ValueError(f"flashattn: {fn}: k and v must have the same dtype, got {k.dtype} and "
                         f"{v.dtype}")
    if torch.float8_e4m3fn in (q.dtype, k.dtype):
        raise NotImplementedError(
            f"flashattn: {fn}: FP8 (float8_e4m3fn) inputs are not supported by ring attention "
            "(the FP8 forward of issue 14 is flash_attn_func / flash_attn_varlen_func's)")
    if layout not in LAYOUTS:
        raise ValueError(f"flashattn: {fn}: layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "zigzag" and q.shape[seq_dim] % 2:
        raise ValueError(
            f"flashattn: {fn}: layout='zigzag' needs an even local sequence length (two chunks "
            f"per rank), got q.shape[{seq_dim}] = {q.shape[seq_dim]}")


def _ring_options(fn, q, dropout_p, softmax_scale, window_size, softcap, alibi_slopes,
                  deterministic):
    """The options shared by the ring calls, checked, with "window": the user's (window_left,
    window_right), or None without one. alibi_slopes and dropout_p go to every call as given
    (the ops check them, naming them); the ring's rng_state is _ring_rng_state's."""
    if not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"flashattn: {fn}: dropout_p must be in [0, 1) (0 disables it), got "
                         f"{dropout_p!r}")
    # The user's window as given (causal=False here: causal's window_right = 0 is ours).
    opts = _options(q, 0.0, softmax_scale, False, window_size, softcap, alibi_slopes,
                    deterministic, draw_rng=False)
    opts["window"] = None
    if opts["window_left"] >= 0 or opts["window_right"] >= 0:
        opts["window"] = (opts["window_left"], opts["window_right"])
    return opts


def _ring_rng_state(q, dropout_p, group):
    """The dropout seed and offset of one ring call, the same on every rank: each rank draws
    as flash_attn_func does (so generators stay in step), then group rank 0's draw is
    broadcast. None without dropout. The backward reuses it (the forward's mask)."""
    if dropout_p == 0.0:
        return None
    rng_state = _rng_state(q, dropout_p)
    if dist.get_world_size(group) > 1:
        dist.broadcast(rng_state, group_src=0, group=group)
    return rng_state


def _check_sink(fn, sink, q):
    if sink is None:
        return None
    heads = q.shape[-2]
    if not isinstance(sink, torch.Tensor) or sink.dtype != torch.float32 or (
            tuple(sink.shape) != (heads,)):
        got = (sink.dtype, tuple(sink.shape)) if isinstance(sink, torch.Tensor) else type(sink)
        raise ValueError(f"flashattn: {fn}: learnable_sink must be a float32 tensor of shape "
                         f"(nheads,) = ({heads},), got {got}")
    if sink.device != q.device:
        raise ValueError(f"flashattn: {fn}: learnable_sink must be on q's device {q.device}, got "
                         f"{sink.device}")
    return sink


def _check_group(fn, group):
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"flashattn: {fn} needs an initialised torch.distributed process "
                           f"group (torch.distributed.init_process_group)")
    if dist.get_rank(group) < 0:
        raise ValueError(f"flashattn: {fn}: this rank is not a member of group")


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
    *,
    learnable_sink=None,
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
        dropout_p: dropout probability in [0, 1), as flash_attn_func: the mask is that of
            the full sequence's (row, column) positions (the ops' position offsets), drawn
            from one rng_state: every rank draws it as flash_attn_func does (torch.randint,
            so seed the ranks alike for reproducible runs) and group rank 0's is broadcast
            (one small collective per forward). So with torch.manual_seed(s) on the ranks
            and before flash_attn_func on the gathered sequence, both give the same mask.
            The backward regenerates it.
        softmax_scale: scale of q.k before the softmax; None means 1 / sqrt(headdim).
        causal: causal mask over the full sequence (query at global position i sees keys
            j <= i). Use layout="zigzag" for an even load across the ranks.
        window_size: (left, right) sliding window over the full sequence (-1: unbounded),
            as flash_attn_func (causal: right = 0). Each ring step runs only the chunk pairs
            the window reaches, with the window translated to the pair's offset (with ALiBi
            or dropout: the window as given, on the pair's global positions).
        softcap: if > 0, scores become softcap * tanh(score / softcap).
        alibi_slopes: None, or fp32 (nheads,) or (batch, nheads), the same on every rank:
            flash_attn_func's ALiBi bias -slope * |i - j| over the full sequence's positions.
            With ALiBi or dropout every (query chunk, key chunk) pair is its own call with the
            ops' position offsets (zigzag: up to 4 calls a step instead of 1, the same work).
            On CUDA the kernels take the offsets in the mask, ALiBi and the deterministic
            backwards' orders; dropout's mask on the sm90 (Hopper) kernels only (fastest
            with chunk lengths that are multiples of 16): a dropout call that would run an
            sm80 kernel raises "dropout with position offsets ... runs on the sm90 (Hopper)
            kernels only".
        deterministic: passed to every backward call (the ring's own sums run in a fixed
            order, so the result is then the same bit for bit on reruns).
        return_attn_probs: if True return (out, softmax_lse, None), like flash_attn_func
            (no S, also with dropout).
        layout: how the full sequence (length S, world size W) is laid out over the ranks:
            "zigzag": S cut into 2W chunks, rank r holds chunks r and 2W-1-r concatenated
            (seqlen_local = S / W, even); "plain": S cut into W chunks, rank r holds chunk r.
            zigzag_shard / plain_shard produce these from full tensors.
        learnable_sink: None, or fp32 (nheads,) the same on every rank: flash_attn_func's
            attention sink (a logit per head joining every row's softmax denominator), applied
            once in the merge; its gradient is summed over the ranks (an all-reduce in the
            backward).

    Returns:
        out: (batch, seqlen_local, nheads, headdim_v) in q's dtype, or (out, softmax_lse, None)
        with return_attn_probs; softmax_lse fp32 (batch, nheads, seqlen_local), the log-sum-exp
        of each local query row over the whole sequence's keys.
    """
    fn = "ring_flash_attn_func"
    _check_inputs(fn, q, k, v, layout, varlen=False)
    opts = _ring_options(fn, q, dropout_p, softmax_scale, window_size, softcap, alibi_slopes,
                         deterministic)
    sink = _check_sink(fn, learnable_sink, q)
    _check_group(fn, group)
    rng_state = _ring_rng_state(q, dropout_p, group)
    out, softmax_lse = _RingFlashAttn.apply(
        q, k, v, sink, alibi_slopes, rng_state, _PaddedRows(q.shape[1], layout == "zigzag"),
        group, opts["softmax_scale"], bool(causal), opts["softcap"], bool(deterministic), layout,
        opts["window"], float(dropout_p))
    return _result(out, softmax_lse, return_attn_probs)


def ring_flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens,
    max_seqlen,
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
    *,
    learnable_sink=None,
):
    """Ring attention over a batch of variable-length sequences, each split across the ranks
    of `group` (the varlen twin of ring_flash_attn_func; self-attention, so q and k share
    cu_seqlens).

    Every sequence b of full length S_b is laid out over the W ranks as in
    ring_flash_attn_func ("zigzag": 2W chunks, rank r holds chunks r and 2W-1-r; "plain": W
    chunks, rank r holds chunk r), and each rank's parts of all sequences are concatenated in
    sequence order (zigzag_shard / plain_shard with cu_seqlens produce this layout).

    Arguments:
        q: (total_local, nheads, headdim), k: (total_local, nheads_k, headdim),
        v: (total_local, nheads_k, headdim_v), this rank's rows of every sequence.
        cu_seqlens: int32 (batch + 1,), the LOCAL boundaries (the full sequences' divided by
            W), the same on every rank, ending at total_local. Zigzag: every local length
            must be even. Not checked (that would need a host sync): wrong metadata gives
            wrong numbers, never an out-of-bounds access.
        max_seqlen: int, at least the longest local length.
        other arguments: as ring_flash_attn_func; alibi_slopes (batch, nheads) is per
            sequence. ALiBi, dropout and window_size run every chunk pair as its own call
            with per-sequence position offsets (chunk index x the sequence's chunk length,
            built on the device); a window's pairs are all called (the host does not know
            the lengths), the kernel skips the tiles the window hides. On CUDA, dropout
            runs on the sm90 (Hopper) kernels only (as ring_flash_attn_func).

    Returns:
        out: (total_local, nheads, headdim_v), or (out, softmax_lse, None) with
        return_attn_probs, softmax_lse fp32 (nheads, total_local).
    """
    fn = "ring_flash_attn_varlen_func"
    _check_inputs(fn, q, k, v, layout, varlen=True)
    opts = _ring_options(fn, q, dropout_p, softmax_scale, window_size, softcap, alibi_slopes,
                         deterministic)
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or (
            cu_seqlens.numel() < 1 or cu_seqlens.dtype != torch.int32):
        raise ValueError(f"flashattn: {fn}: cu_seqlens must be a 1-D int32 tensor of batch + 1 "
                         f"local boundaries, got {cu_seqlens!r:.80}")
    if cu_seqlens.device != q.device:
        raise ValueError(f"flashattn: {fn}: cu_seqlens must be on q's device {q.device}, got "
                         f"{cu_seqlens.device}")
    sink = _check_sink(fn, learnable_sink, q)
    _check_group(fn, group)
    rows = _VarlenRows(cu_seqlens, int(max_seqlen), q.shape[0], layout == "zigzag")
    rng_state = _ring_rng_state(q, dropout_p, group)
    out, softmax_lse = _RingFlashAttn.apply(
        q, k, v, sink, alibi_slopes, rng_state, rows, group, opts["softmax_scale"], bool(causal),
        opts["softcap"], bool(deterministic), layout, opts["window"], float(dropout_p))
    return _result(out, softmax_lse, return_attn_probs)

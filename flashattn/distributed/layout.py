"""Laying a full sequence out across the ranks of a ring and collecting it back (ring.py's
layouts): zigzag_shard / plain_shard cut a full tensor into this rank's chunk, zigzag_gather /
plain_gather all-gather the local chunks into the full sequence. The varlen forms (cu_seqlens)
lay out every sequence of a packed batch the same way and read cu_seqlens on the host (data
preparation, not the training step)."""
import torch
import torch.distributed as dist


def _chunk_len(fn, n, what, rank, world_size, parts):
    if world_size < 1:
        raise ValueError(f"flashattn: {fn}: world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"flashattn: {fn}: rank must be in [0, {world_size}), got {rank}")
    if n % parts:
        raise ValueError(
            f"flashattn: {fn}: {what} = {n} must be divisible by {parts} "
            f"({'2 * ' if fn.startswith('zigzag') else ''}world_size)")
    return n // parts


def _seq_bounds(cu_seqlens):
    cu = [int(x) for x in cu_seqlens.tolist()]
    return list(zip(cu, cu[1:]))


def _shard(fn, zigzag, x, rank, world_size, dim, cu_seqlens):
    parts = 2 * world_size if zigzag else world_size
    if cu_seqlens is None:
        bounds, what = [(0, x.shape[dim])], f"x.shape[{dim}]"
    else:
        bounds, what = _seq_bounds(cu_seqlens), "the length of sequence {} (cu_seqlens)"
    pieces = []
    for b, (start, end) in enumerate(bounds):
        c = _chunk_len(fn, end - start, what.format(b), rank, world_size, parts)
        chunks = [rank, 2 * world_size - 1 - rank] if zigzag else [rank]
        pieces += [x.narrow(dim, start + i * c, c) for i in chunks]
    return torch.cat(pieces, dim) if pieces else x.narrow(dim, 0, 0).contiguous()


def zigzag_shard(x, rank, world_size, dim=1, cu_seqlens=None):
    """Rank `rank`'s part of the full tensor `x` in the zigzag layout (a new contiguous tensor).

    x.shape[dim] (the full sequence length S) is cut into 2 * world_size equal chunks; the
    result is chunks rank and 2 * world_size - 1 - rank concatenated along `dim` (length
    S / world_size). Varlen: with `cu_seqlens` (int32, the full sequences' boundaries along
    `dim`, usually 0), every sequence is cut so and the parts concatenated in sequence order;
    the local boundaries are then cu_seqlens // world_size. Raises ValueError if a length is
    not divisible by 2 * world_size.
    """
    return _shard("zigzag_shard", True, x, rank, world_size, dim, cu_seqlens)


def plain_shard(x, rank, world_size, dim=1, cu_seqlens=None):
    """Rank `rank`'s part of the full tensor `x` in the plain (contiguous) layout: chunk `rank`
    of world_size equal chunks along `dim` (a new contiguous tensor). Varlen: with `cu_seqlens`
    every sequence is cut so (local boundaries cu_seqlens // world_size). Raises ValueError if
    a length is not divisible by world_size."""
    return _shard("plain_shard", False, x, rank, world_size, dim, cu_seqlens)


def _unshard(pieces, zigzag, dim, cu_seqlens=None):
    """The full tensor from every rank's part (in rank order); cu_seqlens: the local ones."""
    if cu_seqlens is not None:
        seqs = [_unshard([p.narrow(dim, a, b - a) for p in pieces], zigzag, dim)
                for a, b in _seq_bounds(cu_seqlens)]
        return torch.cat(seqs, dim) if seqs else pieces[0].narrow(dim, 0, 0).contiguous()
    if not zigzag:
        return torch.cat(pieces, dim)
    halves = [p.chunk(2, dim) for p in pieces]
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim)


def _all_gather(x, group):
    x = x.contiguous()
    pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, x, group=group)
    return pieces


def zigzag_gather(x_local, group=None, dim=1, cu_seqlens=None):
    """The full tensor on every rank of `group` (None: the default group) from each rank's
    zigzag part `x_local`: the inverse of zigzag_shard (varlen: `cu_seqlens` are the LOCAL
    boundaries, the same on every rank). A collective: every rank calls it with a tensor of
    the same shape. Not differentiable."""
    if cu_seqlens is None and x_local.shape[dim] % 2:
        raise ValueError(f"flashattn: zigzag_gather: x_local.shape[{dim}] = "
                         f"{x_local.shape[dim]} must be even (two chunks per rank)")
    for b, (start, end) in enumerate(_seq_bounds(cu_seqlens) if cu_seqlens is not None else []):
        if (end - start) % 2:
            raise ValueError(f"flashattn: zigzag_gather: the local length of sequence {b} "
                             f"(cu_seqlens) = {end - start} must be even (two chunks per rank)")
    return _unshard(_all_gather(x_local, group), True, dim, cu_seqlens)


def plain_gather(x_local, group=None, dim=1, cu_seqlens=None):
    """The full tensor on every rank of `group` (None: the default group) from each rank's
    plain-layout part `x_local`: the inverse of plain_shard (varlen: `cu_seqlens` are the LOCAL
    boundaries). A collective: every rank calls it with a tensor of the same shape. Not
    differentiable."""
    return _unshard(_all_gather(x_local, group), False, dim, cu_seqlens)

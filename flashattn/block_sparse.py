"""Block-sparse attention (issue 16): flash_attn_func / flash_attn_varlen_func over the kept
tiles of a block mask (a dense bool mask or FlexAttention's compressed pair), and
block_mask_from_flex. The mask is checked and compressed here, on the device and without a
host sync, at each call or once for many (block_sparse_mask); the ops (torch.ops.flashattn.fwd
/ varlen_fwd and their backwards) walk the kept tiles (contract: csrc/common/params.h)."""
from typing import NamedTuple, Tuple

import torch

from .interface import _options, _result
from .ops import call_forward

__all__ = ["block_sparse_attn_func", "block_sparse_attn_varlen_func", "block_mask_from_flex",
           "block_sparse_mask", "BlockSparseMask"]


class BlockSparseMask(NamedTuple):
    """A block mask compressed once, for any number of calls (block_sparse_mask builds it; the
    calls then run no mask kernel of their own, as FlexAttention's create_block_mask):
    kv_num_blocks int32 (B or 1, H or 1, nq) and kv_indices (.., nq, nk), the kept key blocks
    of each query block first, ascending; q_num_blocks / q_indices the transposed view that
    the backward walks; block_size (block_m, block_n)."""
    kv_num_blocks: torch.Tensor
    kv_indices: torch.Tensor
    q_num_blocks: torch.Tensor
    q_indices: torch.Tensor
    block_size: Tuple[int, int]


def _block_size(block_size):
    if block_size is None:
        return 128, 128
    try:
        bm, bn = block_size
    except (TypeError, ValueError):
        raise ValueError(
            f"flashattn: block_size must be a pair (block_m, block_n), got {block_size!r}"
        ) from None
    return int(bm), int(bn)


def _check_mask_tensor(t, name, dtype, q, shape):
    """A block-mask tensor: dtype, device (q's, or q a device) and shape (its first two
    entries: batch or 1 / nheads or 1)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"flashattn: {name} must be a tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ValueError(f"flashattn: {name} must have dtype {dtype}, got {t.dtype}")
    device = q if isinstance(q, torch.device) else q.device
    if t.device != device:
        raise ValueError(f"flashattn: {name} must be on q's device ({device}), got {t.device}")
    ok = t.dim() == len(shape) and all(
        s == w or (i < 2 and s == 1) for i, (s, w) in enumerate(zip(t.shape, shape)))
    if not ok:
        want = ", ".join(f"{w} or 1" if i < 2 else str(w) for i, w in enumerate(shape))
        raise ValueError(f"flashattn: {name} must have shape ({want}), got {tuple(t.shape)}")


def _dense_block_mask(block_mask, q, batch, nheads, sq, sk, bm, bn):
    """block_mask (dense bool, or the pair (kv_num_blocks, kv_indices)) of a (sq, sk) score
    matrix as a dense bool (B or 1, H or 1, nq, nk) tensor; out-of-range counts and indices
    clamped (conventions, rule 7), on the device, without a host sync."""
    nq, nk = (sq + bm - 1) // bm, (sk + bn - 1) // bn
    if isinstance(block_mask, (tuple, list)):
        if len(block_mask) != 2:
            raise ValueError("flashattn: block_mask as a sequence must be the pair "
                             f"(kv_num_blocks, kv_indices), got {len(block_mask)} items")
        num, idx = block_mask
        _check_mask_tensor(num, "block_mask[0] (kv_num_blocks)", torch.int32, q,
                           (batch, nheads, nq))
        _check_mask_tensor(idx, "block_mask[1] (kv_indices)", torch.int32, q,
                           (batch, nheads, nq, nk))
        if idx.shape[:2] != num.shape[:2]:
            raise ValueError("flashattn: block_mask[1] (kv_indices) must have the batch and "
                             f"head sizes of kv_num_blocks {tuple(num.shape[:2])}, got "
                             f"{tuple(idx.shape)}")
        return _kept_dense(dict(kv_num_blocks=num, kv_indices=idx))
    _check_mask_tensor(block_mask, "block_mask", torch.bool, q, (batch, nheads, nq, nk))
    return block_mask


def _compressed(dense):
    """Counts int32 (..., R) and indices int32 (..., R, C) of a dense bool (..., R, C): the
    kept columns of each row first, ascending (stable sort), the rest after."""
    num = dense.sum(-1, dtype=torch.int32)
    idx = torch.sort((~dense).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
    return num.contiguous(), idx.contiguous()


def _block_sparse_args(dense, bm, bn, backward=True):
    """The op's block-mask arguments: the kept key blocks of each query block and (backward)
    the transposed view (kept query blocks of each key block) that the backward walks."""
    kv_num_blocks, kv_indices = _compressed(dense)
    q_num_blocks, q_indices = _compressed(dense.transpose(-1, -2)) if backward else (None, None)
    return dict(kv_num_blocks=kv_num_blocks, kv_indices=kv_indices, q_num_blocks=q_num_blocks,
                q_indices=q_indices, block_size_m=bm, block_size_n=bn)


def block_sparse_mask(block_mask, block_size=(128, 128)):
    """A BlockSparseMask of block_mask for block_sparse_attn_func / _varlen_func (and
    flashattn.kernel_path), compressed here once instead of at every call (its sort kernels
    then leave the calls, which matters where the attention itself is short).

    block_mask: a dense bool tensor (batch or 1, nheads or 1, n_qblocks, n_kblocks), or
    FlexAttention's compressed pair (kv_num_blocks int32 (.., n_qblocks), kv_indices int32
    (.., n_qblocks, n_kblocks)), as block_sparse_attn_func takes it; block_size (block_m,
    block_n). The calls check the blocks against their own sequence lengths."""
    bm, bn = _block_size(block_size)
    if isinstance(block_mask, BlockSparseMask):
        raise TypeError("flashattn: block_mask is a BlockSparseMask already")
    if isinstance(block_mask, (tuple, list)):
        if len(block_mask) != 2 or not all(isinstance(t, torch.Tensor) for t in block_mask):
            raise ValueError("flashattn: block_mask as a sequence must be the pair "
                             "(kv_num_blocks, kv_indices) of tensors")
        idx = block_mask[1]
        if idx.dim() != 4:
            raise ValueError("flashattn: block_mask[1] (kv_indices) must have 4 dimensions "
                             f"(batch or 1, nheads or 1, n_qblocks, n_kblocks), got {idx.dim()}")
        shape, device = idx.shape, idx.device
    elif isinstance(block_mask, torch.Tensor):
        if block_mask.dim() != 4:
            raise ValueError("flashattn: block_mask must have 4 dimensions (batch or 1, nheads "
                             f"or 1, n_qblocks, n_kblocks), got {block_mask.dim()}")
        shape, device = block_mask.shape, block_mask.device
    else:
        raise TypeError("flashattn: block_mask must be a bool tensor or the pair (kv_num_blocks, "
                        f"kv_indices), got {type(block_mask).__name__}")
    nq, nk = shape[2], shape[3]
    dense = _dense_block_mask(block_mask, device, shape[0], shape[1], nq * bm, nk * bn, bm, bn)
    a = _block_sparse_args(dense, bm, bn)
    return BlockSparseMask(a["kv_num_blocks"], a["kv_indices"], a["q_num_blocks"],
                           a["q_indices"], (bm, bn))


def _needs_backward(*tensors):
    return torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in tensors)


def _mask_args(block_mask, block_size, q, batch, nheads, sq, sk, backward):
    """(the op's block-mask arguments, the dense bool mask or None) of a call's block_mask:
    a BlockSparseMask passes through (its block size the call's), the other forms are checked
    and compressed (the transposed view only where a backward may follow)."""
    if isinstance(block_mask, BlockSparseMask):
        bm, bn = block_mask.block_size
        if block_size is not None and _block_size(block_size) != (bm, bn):
            raise ValueError(f"flashattn: block_size {tuple(block_size)} differs from the "
                             f"BlockSparseMask's {(bm, bn)}")
        return dict(kv_num_blocks=block_mask.kv_num_blocks, kv_indices=block_mask.kv_indices,
                    q_num_blocks=block_mask.q_num_blocks, q_indices=block_mask.q_indices,
                    block_size_m=bm, block_size_n=bn), None
    bm, bn = _block_size(block_size)
    dense = _dense_block_mask(block_mask, q, batch, nheads, sq, sk, bm, bn)
    return _block_sparse_args(dense, bm, bn, backward), dense


def _kept_dense(args):
    """The dense bool mask of compressed block-mask arguments (return_attn_probs' S)."""
    num, idx = args["kv_num_blocks"], args["kv_indices"]
    nk = idx.shape[-1]
    kept = torch.arange(nk, device=idx.device) < num.clamp(0, nk)[..., None]
    dense = torch.zeros(idx.shape, dtype=torch.int32, device=idx.device)
    return dense.scatter_add_(-1, idx.long().clamp(0, max(nk - 1, 0)), kept.to(torch.int32)) > 0


def block_sparse_attn_func(
    q,
    k,
    v,
    block_mask,
    block_size=None,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    learnable_sink=None,
):
    """flash_attn_func over the kept tiles of a block mask; every dropped tile is skipped.

    The score matrix is tiled block_size = (block_m, block_n): query block qb holds rows
    [qb * block_m, + block_m), key block kb keys [kb * block_n, + block_n) (the last ones end
    at seqlen_q / seqlen_k). Query i sees key j iff their tile is kept and causal / window
    let it (a kept tile is still masked inside by them). A row whose tiles are all dropped
    gets out = 0 and softmax_lse = -inf (the sink with learnable_sink). Varlen twin:
    block_sparse_attn_varlen_func. CPU and CUDA tensors (sm80+ GPUs; on Hopper the sm90
    kernels take padded calls whose blocks are whole 128 x 128 tiles, the sm80 ones the rest).

    A dropped block is never read (its K / V may be anything, NaN included) when its block
    size is a multiple of the kernel tile on both axes: on CUDA block_m a multiple of 128 and
    block_n of 128 (64 for head dims above 128), so (128, 128) always nests. Smaller blocks are
    masked inside the kernel tile that holds them: the K / V of a dropped block sharing a tile
    with a kept one are loaded, so they must be finite (P = 0 times NaN is NaN). The CPU reads
    only kept blocks, at any block size.

    Arguments: those of flash_attn_func, plus
        block_mask: a dense bool tensor (batch or 1, nheads or 1, ceil(seqlen_q / block_m),
            ceil(seqlen_k / block_n)), True = kept; or FlexAttention's compressed pair
            (kv_num_blocks int32 (batch or 1, nheads or 1, n_qblocks), kv_indices int32 (...,
            n_qblocks, n_kblocks)): query block qb keeps key blocks kv_indices[..., qb, :n] with
            n = kv_num_blocks[..., qb]. Counts and indices outside [0, n_kblocks] are clamped
            (wrong numbers, never an out-of-bounds access); repeats count once. Or a
            BlockSparseMask (block_sparse_mask) of either, compressed once for many calls;
            the other forms are compressed at each call (a few small kernels).
        block_size: (block_m, block_n), multiples of 16 in [16, 256]; None: a BlockSparseMask's
            own, else (128, 128).

    Returns: as flash_attn_func; with return_attn_probs and dropout, S is 0 on dropped tiles.
    """
    args, dense = _mask_args(block_mask, block_size, q, q.shape[0], q.shape[2], q.shape[1],
                             k.shape[1], _needs_backward(q, k, v, learnable_sink))
    opts = _options(q, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                    deterministic, learnable_sink)
    out, softmax_lse = call_forward(torch.ops.flashattn.fwd, q, k, v, **opts, **args)
    return _sparse_result(_result(out, softmax_lse, return_attn_probs, (q, k, v), opts),
                          return_attn_probs, dense, args)


def _sparse_result(result, return_attn_probs, dense, args):
    """_result's S with the dropped tiles zeroed. attn_probs takes no block mask, so the row max
    m of S = exp(s - m) is over every causally visible key, kept tile or not (params.h)."""
    if not return_attn_probs or result[2] is None:
        return result
    if dense is None:
        dense = _kept_dense(args)
    bm, bn = args["block_size_m"], args["block_size_n"]
    out, softmax_lse, s_dmask = result
    rows, cols = s_dmask.shape[-2:]
    kept = dense.repeat_interleave(bm, -2).repeat_interleave(bn, -1)[..., :rows, :cols]
    kept = torch.nn.functional.pad(kept, (0, cols - kept.shape[-1], 0, rows - kept.shape[-2]))
    return out, softmax_lse, torch.where(kept, s_dmask, 0)


def block_sparse_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    block_mask,
    block_size=None,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    learnable_sink=None,
):
    """block_sparse_attn_func for flash_attn_varlen_func's layout: the tiles of each sequence
    (its query row 0 and key 0 start its blocks), block_mask (batch or 1, nheads or 1,
    ceil(max_seqlen_q / block_m), ceil(max_seqlen_k / block_n)) in either form; no
    block_table. CPU and CUDA tensors (the sm80 kernels on CUDA). A sequence longer than
    max_seqlen_q / k (wrong metadata) keeps nothing past the mask's blocks: those rows get out 0, lse -inf (the sink) and dq 0,
    those keys dk = dv = 0."""
    # The op clamps the hints to the row counts. Built-in min: dynamo makes it sym_min on
    # SymInts and folds it on ints (torch.sym_min of two ints breaks torch 2.11's fullgraph).
    sq = min(max_seqlen_q, q.shape[0])
    sk = min(max_seqlen_k, k.shape[0])
    args, dense = _mask_args(block_mask, block_size, q, cu_seqlens_q.shape[0] - 1, q.shape[1],
                             sq, sk, _needs_backward(q, k, v, learnable_sink))
    opts = _options(q, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                    deterministic, learnable_sink)
    out, softmax_lse = call_forward(
        torch.ops.flashattn.varlen_fwd, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
        max_seqlen_k, **opts, **args)
    result = _result(out, softmax_lse, return_attn_probs,
                     (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), opts)
    return _sparse_result(result, return_attn_probs, dense, args)


def block_mask_from_flex(block_mask):
    """(block_mask, block_size) for block_sparse_attn_func from a FlexAttention BlockMask whose
    kept blocks are whole: one without a mask_mod (its kv_num_blocks / kv_indices), or its
    full blocks (full_kv_num_blocks / full_kv_indices; the partial blocks, which a mask_mod
    masks inside, are not taken). Its sequence lengths must be the call's."""
    mask_mod = getattr(block_mask, "mask_mod", None)
    no_mod = mask_mod is None or getattr(mask_mod, "__name__", "") == "noop_mask"
    if no_mod:
        num, idx = block_mask.kv_num_blocks, block_mask.kv_indices
    elif block_mask.full_kv_num_blocks is not None:
        num, idx = block_mask.full_kv_num_blocks, block_mask.full_kv_indices
    else:
        raise ValueError("flashattn: block_mask_from_flex takes a BlockMask without a mask_mod "
                         "or with full blocks (full_kv_num_blocks); this one has neither")
    bs = block_mask.BLOCK_SIZE
    bs = (bs, bs) if isinstance(bs, int) else tuple(bs)
    return (num.to(torch.int32), idx.to(torch.int32)), bs

"""The public API: flash-attn 2.8's six attention functions and flash_attn_with_kvcache, same
names, arguments, defaults and return values, each a call of torch.ops.flashattn.fwd /
varlen_fwd (autograd in ops.py) or fwd_kvcache.

Layouts: padded q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k, nheads_k, headdim /
headdim_v); varlen q (total_q, nheads, headdim), k/v (total_k, nheads_k, ...), sequences
delimited by int32 cu_seqlens. nheads must be a multiple of nheads_k (MQA/GQA).

Masking is bottom-right aligned: query i of a sequence with lengths (seqlen_q, seqlen_k) sees key
j iff i + seqlen_k - seqlen_q - window_size[0] <= j <= i + seqlen_k - seqlen_q + window_size[1]
(-1 = unbounded side); causal=True sets window_size[1] = 0. A row that sees no key gives out = 0
and softmax_lse = -inf.

Dropout (dropout_p > 0, applied whenever it is given, as in flash-attn: pass 0.0 at evaluation)
drops each attention probability with probability p quantised to round(p * 256) / 256 (at least
1/256) and scales the kept ones by 1 / (1 - p), flash-attn's scale; the mask is a Philox
function of a seed and offset drawn here from torch's generator (torch.randint on q's device,
so torch.manual_seed reproduces a call and CUDA-graph replays draw fresh masks) and of (batch,
head, row, column); the backward regenerates it. learnable_sink (FA4's name): fp32 (nheads,), a logit per head in the
units of the scaled scores whose exp joins every row's softmax denominator (a key of value 0);
softmax_lse includes it, a row that sees no key gets out = 0 and softmax_lse = sink, and the
sink gets a gradient. Both run on every backend: CPU, and on CUDA the sm80 kernels and, on a
Hopper GPU, the sm90 ones (their dropout forward and backward on by default; what they do not
take runs sm80); dropout with paged KV (block_table) on CUDA raises.

FP8 (issue 14; FA3's extension of the interface): flash_attn_func, flash_attn_varlen_func and
the packed variants take q, k, v of dtype torch.float8_e4m3fn with the keywords q_descale,
k_descale, v_descale (fp32, shape (batch, nheads_k) or anything that broadcasts to it, e.g. a
0-dim per-tensor scale; None = 1.0; broadcast here to a contiguous (batch, nheads_k) tensor) and
out_dtype (torch.bfloat16, the default, or torch.float16). The result is that of the
dequantized inputs, q_deq = q.float() * q_descale[b, h // (nheads // nheads_k)] (k, v alike with
their own head), in out_dtype, softmax_lse fp32. Forward only: backpropagating through an FP8
call raises NotImplementedError ("FP8 attention is forward only (issue 14)") when the backward
runs (under torch.compile already when the graph is compiled); alibi_slopes, dropout_p > 0,
learnable_sink, block masks and block_table raise with FP8 inputs on every backend; descales or
an out_dtype other than q's with 16/32-bit inputs raise (FA3 ignores descales there; a scale is
never silently dropped here). The CPU backend runs it, and on a Hopper GPU the sm90 FP8
kernel; other GPUs raise a named error (the kernel is sm_90a code).

Checks on tensors (shapes, dtypes, devices, head dims) are the C++ op's; this layer checks only
what the op cannot see.
"""
import torch

from .ops import call_forward

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "kernel_path",
]


def _rng_state(q, dropout_p):
    """int64 (2,) = (seed, offset) of the dropout mask, drawn on q's device from torch's
    generator (CUDA-graph safe); None without dropout."""
    if dropout_p == 0.0:
        return None
    return torch.randint(-(2 ** 63), 2 ** 63 - 1, (2,), dtype=torch.int64, device=q.device)


def _options(q, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
             deterministic, learnable_sink=None, draw_rng=True):
    """The op's keyword arguments for the public-API options (draw_rng: draw the dropout
    seed and offset, which advances torch's generator)."""
    try:
        window_left, window_right = window_size
    except (TypeError, ValueError):
        raise ValueError(
            f"flashattn: window_size must be a pair (left, right), got {window_size!r}"
        ) from None
    if causal:
        window_right = 0
    if softmax_scale is None:
        headdim = q.shape[-1]
        softmax_scale = headdim ** (-0.5) if headdim > 0 else 1.0  # the op rejects headdim 0
    return dict(
        softmax_scale=softmax_scale,
        causal=causal,
        window_left=window_left,
        window_right=window_right,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        deterministic=deterministic,
        dropout_p=dropout_p,
        rng_state=_rng_state(q, dropout_p) if draw_rng else None,
        learnable_sink=learnable_sink,
    )


def _fp8_args(k, batch, q_descale, k_descale, v_descale, out_dtype):
    """The op's FP8 keywords: each descale broadcast to a contiguous (batch, nheads_k) tensor
    where its shape broadcasts (dtype and device kept: the op checks them, naming it), else
    passed as given for the op to reject by name; out_dtype as given."""
    shape = (batch, k.shape[-2])

    def norm(t, name):
        if t is None:
            return None
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flashattn: {name} must be None or a float32 tensor broadcasting to "
                            f"(batch, nheads_k), got {type(t).__name__}")
        if t.dim() <= 2 and all(s == 1 or s == w for s, w in zip(reversed(t.shape),
                                                                 reversed(shape))):
            return t.expand(shape).contiguous()
        return t

    return dict(q_descale=norm(q_descale, "q_descale"), k_descale=norm(k_descale, "k_descale"),
                v_descale=norm(v_descale, "v_descale"), out_dtype=out_dtype)


def _result(out, softmax_lse, return_attn_probs, probs_args=None, opts=None):
    """out, or (out, softmax_lse, S) with return_attn_probs: S (flash-attn's S_dmask) only with
    dropout, from torch.ops.flashattn.attn_probs (no autograd), else None."""
    if not return_attn_probs:
        return out
    if opts is None or opts["dropout_p"] == 0.0:
        return out, softmax_lse, None
    q, k, v, *varlen = (x.detach() if isinstance(x, torch.Tensor) else x for x in probs_args)
    probs_opts = {n: x for n, x in opts.items() if n != "deterministic"}
    if probs_opts["learnable_sink"] is not None:
        probs_opts["learnable_sink"] = probs_opts["learnable_sink"].detach()
    varlen = varlen or [None, None, q.shape[1], k.shape[1]]
    s_dmask = torch.ops.flashattn.attn_probs(q, k, v, softmax_lse, *varlen, **probs_opts)
    return out, softmax_lse, s_dmask


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    learnable_sink=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    out_dtype=None,
):
    """Exact attention on padded batches.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim).
        k: (batch, seqlen_k, nheads_k, headdim).
        v: (batch, seqlen_k, nheads_k, headdim_v).
        dropout_p: dropout probability in [0, 1), applied whenever > 0 (module docstring).
        softmax_scale: scale of q.k before the softmax; None means 1 / sqrt(headdim).
        causal: causal mask, aligned to the bottom-right corner of the score matrix.
        window_size: (left, right) sliding window, -1 = unbounded on that side.
        softcap: if > 0, scores become softcap * tanh(score / softcap).
        alibi_slopes: None, or fp32 (nheads,) or (batch, nheads); adds
            -slope * |i + seqlen_k - seqlen_q - j| to the score of query i and key j.
        deterministic: use the deterministic backward (same gradients bit for bit on reruns).
        return_attn_probs: if True return (out, softmax_lse, S): with dropout_p > 0, S is
            (batch, nheads, seqlen_q rounded up to 128, seqlen_k rounded up to 128) in q's
            dtype, the probabilities (the undropped softmax), negated where dropped, 0 where
            masked (flash-attn's S_dmask; no gradient); None without dropout, as in flash-attn.
        learnable_sink: None, or fp32 (nheads,): the attention sink (module docstring); every
            backend.
        q_descale, k_descale, v_descale: FP8 only (float8_e4m3fn q, k, v): None (1.0) or
            fp32 scales of shape (batch, nheads_k) or broadcasting to it; the inputs mean
            q.float() * q_descale[b, kv head] (module docstring).
        out_dtype: FP8 only: torch.bfloat16 (None) or torch.float16, the output's dtype.

    Returns:
        out: (batch, seqlen_q, nheads, headdim_v), or (out, softmax_lse, S) with
        return_attn_probs, softmax_lse fp32 (batch, nheads, seqlen_q).
    """
    opts = _options(q, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                    deterministic, learnable_sink)
    fp8 = _fp8_args(k, q.shape[0], q_descale, k_descale, v_descale, out_dtype)
    out, softmax_lse = call_forward(torch.ops.flashattn.fwd, q, k, v, **opts, **fp8)
    return _result(out, softmax_lse, return_attn_probs, (q, k, v), opts)


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    learnable_sink=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    out_dtype=None,
):
    """Exact attention on padded batches, k and v packed.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim).
        kv: (batch, seqlen_k, 2, nheads_k, headdim).
        dropout_p: dropout probability in [0, 1), applied whenever > 0 (module docstring).
        softmax_scale: scale of q.k before the softmax; None means 1 / sqrt(headdim).
        causal: causal mask, aligned to the bottom-right corner of the score matrix.
        window_size: (left, right) sliding window, -1 = unbounded on that side.
        softcap: if > 0, scores become softcap * tanh(score / softcap).
        alibi_slopes: None, or fp32 (nheads,) or (batch, nheads); adds
            -slope * |i + seqlen_k - seqlen_q - j| to the score of query i and key j.
        deterministic: use the deterministic backward (same gradients bit for bit on reruns).
        return_attn_probs: if True return (out, softmax_lse, S): with dropout_p > 0, S is
            (batch, nheads, seqlen_q rounded up to 128, seqlen_k rounded up to 128) in q's
            dtype, the probabilities (the undropped softmax), negated where dropped, 0 where
            masked (flash-attn's S_dmask; no gradient); None without dropout, as in flash-attn.
        learnable_sink: None, or fp32 (nheads,): the attention sink (module docstring); every
            backend.
        q_descale, k_descale, v_descale: FP8 only (float8_e4m3fn q, k, v): None (1.0) or
            fp32 scales of shape (batch, nheads_k) or broadcasting to it; the inputs mean
            q.float() * q_descale[b, kv head] (module docstring).
        out_dtype: FP8 only: torch.bfloat16 (None) or torch.float16, the output's dtype.

    Returns:
        out: (batch, seqlen_q, nheads, headdim), or (out, softmax_lse, S) with
        return_attn_probs, softmax_lse fp32 (batch, nheads, seqlen_q).
    """
    k, v = kv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs,
                           learnable_sink=learnable_sink,
                           q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                           out_dtype=out_dtype)


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # <=0.0 means deactivate
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    learnable_sink=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    out_dtype=None,
):
    """Exact self-attention on padded batches, q, k, v packed.

    Arguments:
        qkv: (batch, seqlen, 3, nheads, headdim).
        dropout_p: dropout probability in [0, 1), applied whenever > 0 (module docstring).
        softmax_scale: scale of q.k before the softmax; None means 1 / sqrt(headdim).
        causal: causal mask, aligned to the bottom-right corner of the score matrix.
        window_size: (left, right) sliding window, -1 = unbounded on that side.
        softcap: if > 0, scores become softcap * tanh(score / softcap).
        alibi_slopes: None, or fp32 (nheads,) or (batch, nheads); adds
            -slope * |i + seqlen_k - seqlen_q - j| to the score of query i and key j.
        deterministic: use the deterministic backward (same gradients bit for bit on reruns).
        return_attn_probs: if True return (out, softmax_lse, S): with dropout_p > 0, S is
            (batch, nheads, seqlen_q rounded up to 128, seqlen_k rounded up to 128) in q's
            dtype, the probabilities (the undropped softmax), negated where dropped, 0 where
            masked (flash-attn's S_dmask; no gradient); None without dropout, as in flash-attn.
        learnable_sink: None, or fp32 (nheads,): the attention sink (module docstring); every
            backend.
        q_descale, k_descale, v_descale: FP8 only (float8_e4m3fn q, k, v): None (1.0) or
            fp32 scales of shape (batch, nheads_k) or broadcasting to it; the inputs mean
            q.float() * q_descale[b, kv head] (module docstring).
        out_dtype: FP8 only: torch.bfloat16 (None) or torch.float16, the output's dtype.

    Returns:
        out: (batch, seqlen, nheads, headdim), or (out, softmax_lse, S) with
        return_attn_probs, softmax_lse fp32 (batch, nheads, seqlen).
    """
    q, k, v = qkv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs,
                           learnable_sink=learnable_sink,
                           q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                           out_dtype=out_dtype)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    *,
    learnable_sink=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    out_dtype=None,
):
    """Exact attention on a batch of variable-length sequences.

    Arguments:
        q: (total_q, nheads, headdim), the batch's query rows concatenated.
        k: (total_k, nheads_k, headdim).
        v: (total_k, nheads_k, headdim_v).
        cu_seqlens_q: int32 (batch + 1,), sequence b's queries are rows
            cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q.
        cu_seqlens_k: int32 (batch + 1,), the same for k and v.
        max_seqlen_q: int, at least the longest query length.
        max_seqlen_k: int, at least the longest key length.
        dropout_p: dropout probability in [0, 1), applied whenever > 0 (module docstring).
        softmax_scale: scale of q.k before the softmax; None means 1 / sqrt(headdim).
        causal: causal mask, aligned to the bottom-right corner of the score matrix.
        window_size: (left, right) sliding window, -1 = unbounded on that side.
        softcap: if > 0, scores become softcap * tanh(score / softcap).
        alibi_slopes: None, or fp32 (nheads,) or (batch, nheads); adds
            -slope * |i + seqlen_k - seqlen_q - j| to the score of query i and key j.
        deterministic: use the deterministic backward (same gradients bit for bit on reruns).
        return_attn_probs: if True return (out, softmax_lse, S): with dropout_p > 0, S is
            (batch, nheads, seqlen_q rounded up to 128, seqlen_k rounded up to 128) in q's
            dtype, the probabilities (the undropped softmax), negated where dropped, 0 where
            masked (flash-attn's S_dmask; no gradient); None without dropout, as in flash-attn.
        learnable_sink: None, or fp32 (nheads,): the attention sink (module docstring); every
            backend.
        block_table: None, or int32 (batch, max_num_blocks_per_seq) for paged KV (prefill
            from a paged cache): k and v are then (num_blocks, page_block_size, nheads_k,
            headdim / headdim_v), page_block_size a multiple of 16, and sequence b's
            cu_seqlens_k[b + 1] - cu_seqlens_k[b] keys are its logical rows 0, 1, ..., row r in
            row r % page_block_size of block block_table[b, r // page_block_size]. Forward
            only: the backward raises NotImplementedError.
        q_descale, k_descale, v_descale: FP8 only (float8_e4m3fn q, k, v): None (1.0) or
            fp32 scales of shape (batch, nheads_k) or broadcasting to it; the inputs mean
            q.float() * q_descale[b, kv head] (module docstring).
        out_dtype: FP8 only: torch.bfloat16 (None) or torch.float16, the output's dtype.

    Returns:
        out: (total_q, nheads, headdim_v), or (out, softmax_lse, S) with
        return_attn_probs, softmax_lse fp32 (nheads, total_q).
    """
    opts = _options(q, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                    deterministic, learnable_sink)
    fp8 = _fp8_args(k, cu_seqlens_q.shape[0] - 1, q_descale, k_descale, v_descale, out_dtype)
    out, softmax_lse = call_forward(
        torch.ops.flashattn.varlen_fwd, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
        max_seqlen_k, **opts, block_table=block_table, **fp8,
    )
    if return_attn_probs and dropout_p != 0.0 and block_table is not None:
        raise NotImplementedError(
            "flashattn: return_attn_probs with dropout and block_table (paged KV) is not "
            "supported")
    return _result(out, softmax_lse, return_attn_probs,
                   (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), opts)


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    learnable_sink=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    out_dtype=None,
):
    """Exact attention on variable-length sequences, k and v packed.

    Arguments:
        q: (total_q, nheads, headdim).
        kv: (total_k, 2, nheads_k, headdim).
        cu_seqlens_q: int32 (batch + 1,), cumulative query lengths (row offsets into q).
        cu_seqlens_k: int32 (batch + 1,), cumulative key lengths (row offsets into kv).
        max_seqlen_q: int, at least the longest query length.
        max_seqlen_k: int, at least the longest key length.
        dropout_p: dropout probability in [0, 1), applied whenever > 0 (module docstring).
        softmax_scale: scale of q.k before the softmax; None means 1 / sqrt(headdim).
        causal: causal mask, aligned to the bottom-right corner of the score matrix.
        window_size: (left, right) sliding window, -1 = unbounded on that side.
        softcap: if > 0, scores become softcap * tanh(score / softcap).
        alibi_slopes: None, or fp32 (nheads,) or (batch, nheads); adds
            -slope * |i + seqlen_k - seqlen_q - j| to the score of query i and key j.
        deterministic: use the deterministic backward (same gradients bit for bit on reruns).
        return_attn_probs: if True return (out, softmax_lse, S): with dropout_p > 0, S is
            (batch, nheads, seqlen_q rounded up to 128, seqlen_k rounded up to 128) in q's
            dtype, the probabilities (the undropped softmax), negated where dropped, 0 where
            masked (flash-attn's S_dmask; no gradient); None without dropout, as in flash-attn.
        learnable_sink: None, or fp32 (nheads,): the attention sink (module docstring); every
            backend.
        q_descale, k_descale, v_descale: FP8 only (float8_e4m3fn q, k, v): None (1.0) or
            fp32 scales of shape (batch, nheads_k) or broadcasting to it; the inputs mean
            q.float() * q_descale[b, kv head] (module docstring).
        out_dtype: FP8 only: torch.bfloat16 (None) or torch.float16, the output's dtype.

    Returns:
        out: (total_q, nheads, headdim), or (out, softmax_lse, S) with
        return_attn_probs, softmax_lse fp32 (nheads, total_q).
    """
    k, v = kv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs,
                                  learnable_sink=learnable_sink,
                                  q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                                  out_dtype=out_dtype)


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    learnable_sink=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    out_dtype=None,
):
    """Exact self-attention on variable-length sequences, q, k, v packed.

    Arguments:
        qkv: (total, 3, nheads, headdim).
        cu_seqlens: int32 (batch + 1,), cumulative sequence lengths (row offsets into qkv).
        max_seqlen: int, at least the longest sequence length.
        dropout_p: dropout probability in [0, 1), applied whenever > 0 (module docstring).
        softmax_scale: scale of q.k before the softmax; None means 1 / sqrt(headdim).
        causal: causal mask, aligned to the bottom-right corner of the score matrix.
        window_size: (left, right) sliding window, -1 = unbounded on that side.
        softcap: if > 0, scores become softcap * tanh(score / softcap).
        alibi_slopes: None, or fp32 (nheads,) or (batch, nheads); adds
            -slope * |i + seqlen_k - seqlen_q - j| to the score of query i and key j.
        deterministic: use the deterministic backward (same gradients bit for bit on reruns).
        return_attn_probs: if True return (out, softmax_lse, S): with dropout_p > 0, S is
            (batch, nheads, seqlen_q rounded up to 128, seqlen_k rounded up to 128) in q's
            dtype, the probabilities (the undropped softmax), negated where dropped, 0 where
            masked (flash-attn's S_dmask; no gradient); None without dropout, as in flash-attn.
        learnable_sink: None, or fp32 (nheads,): the attention sink (module docstring); every
            backend.
        q_descale, k_descale, v_descale: FP8 only (float8_e4m3fn q, k, v): None (1.0) or
            fp32 scales of shape (batch, nheads_k) or broadcasting to it; the inputs mean
            q.float() * q_descale[b, kv head] (module docstring).
        out_dtype: FP8 only: torch.bfloat16 (None) or torch.float16, the output's dtype.

    Returns:
        out: (total, nheads, headdim), or (out, softmax_lse, S) with
        return_attn_probs, softmax_lse fp32 (nheads, total).
    """
    q, k, v = qkv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs,
                                  learnable_sink=learnable_sink,
                                  q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                                  out_dtype=out_dtype)


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
):
    """Attention of q over a KV cache, after appending k / v to it in place (decoding).

    If k and v are given, they are written into k_cache and v_cache *in place* at rows
    cache_seqlens[b], cache_seqlens[b] + 1, ... of sequence b (rows past the cache are
    dropped); then q attends to the cache rows [cache_leftpad[b], cache_seqlens[b] +
    seqlen_new) of each sequence. With rotary_cos / rotary_sin, the new keys are rotated at
    their positions cache_seqlens[b] + i before they are stored, and q is rotated at
    cache_seqlens[b] + i (causal or local) or at cache_seqlens[b] for every row (otherwise).
    Masks, ALiBi and softcap are those of flash_attn_func with seqlen_k the sequence's number
    of keys, key 0 its row cache_leftpad[b]. No backward, as in flash-attn.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim).
        k_cache: (batch_cache, seqlen_cache, nheads_k, headdim), or with block_table
            (num_blocks, page_block_size, nheads_k, headdim) (a paged cache: any
            page_block_size that is a multiple of 16).
        v_cache: like k_cache, with headdim_v.
        k: None, or (batch, seqlen_new, nheads_k, headdim): the keys to append (with v and
            cache_seqlens).
        v: None, or (batch, seqlen_new, nheads_k, headdim_v).
        rotary_cos: None, or (seqlen_ro, rotary_dim / 2) in q's dtype, seqlen_ro at least the
            cache capacity (seqlen_cache, or max_num_blocks_per_seq * page_block_size),
            rotary_dim even and at most headdim; rotary embedding of q and the new keys.
        rotary_sin: like rotary_cos.
        cache_seqlens: None (every sequence uses the whole cache), an int, or int32 (batch,):
            the cache's length before this call's append.
        cache_batch_idx: None, or int32 (batch,): sequence b uses cache batch
            cache_batch_idx[b] (default b); not with block_table. Sequences sharing a cache
            batch and appending get the rows of one of them.
        cache_leftpad: None, or int32 (batch,): sequence b's keys start at cache row
            cache_leftpad[b] (default 0); not with block_table.
        block_table: None, or int32 (batch, max_num_blocks_per_seq): logical cache row r of
            sequence b is row r % page_block_size of block block_table[b, r // page_block_size].
        softmax_scale: scale of q.k before the softmax; None means 1 / sqrt(headdim).
        causal: causal mask, aligned to the bottom-right corner of the score matrix.
        window_size: (left, right) sliding window, -1 = unbounded on that side.
        softcap: if > 0, scores become softcap * tanh(score / softcap).
        rotary_interleaved: rotate dims (0, 1), (2, 3), ... if True (GPT-J), else (0,
            rotary_dim / 2), (1, rotary_dim / 2 + 1), ... (GPT-NeoX).
        alibi_slopes: None, or fp32 (nheads,) or (batch, nheads); adds
            -slope * |i + seqlen_k - seqlen_q - j| to the score of query i and key j.
        num_splits: key splits of the CUDA split-KV kernel (1 = none); 0 lets the backend
            choose. The result is the same within rounding; the CPU backend ignores it.
        return_softmax_lse: if True return (out, softmax_lse).

    Metadata (cache_seqlens, cache_leftpad, cache_batch_idx, block_table) is not checked
    against the caches (that would need a device sync): values outside them are clamped,
    which gives wrong numbers, never an out-of-bounds access.

    Returns:
        out: (batch, seqlen_q, nheads, headdim_v), or (out, softmax_lse) with
        return_softmax_lse, softmax_lse fp32 (batch, nheads, seqlen_q).
    """
    o = _options(q, 0.0, softmax_scale, causal, window_size, softcap, alibi_slopes, False,
                 draw_rng=False)
    if isinstance(cache_seqlens, (int, torch.SymInt)):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32,
                                   device=q.device)
    # The overload, positionally: ~2 us less host time a call than the packet with keywords
    # (decode calls at batch 1 are bound by host time).
    out, softmax_lse = torch.ops.flashattn.fwd_kvcache.default(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, o["softmax_scale"], o["causal"], o["window_left"],
        o["window_right"], o["softcap"], rotary_interleaved, o["alibi_slopes"], num_splits,
    )
    return (out, softmax_lse) if return_softmax_lse else out


def _get_block_size_n(device=None, head_dim=None, is_dropout=None, is_causal=None):
    """flash-attn's helper of the same name, for its tests: the key block size by which its S
    (return_attn_probs) is normalised. Ours is one block, whatever the call: S = exp(s - m)
    with m the row's max visible score (params.h), so 2^31 - 1 (arguments ignored)."""
    return 2 ** 31 - 1


def kernel_path(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                max_seqlen_k=None, *, direction="fwd", dropout_p=0.0, softmax_scale=None,
                causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                deterministic=False, learnable_sink=None, block_mask=None, block_size=None):
    """Which backend the forward (or, with direction="bwd", the backward) of a call with these
    arguments runs: "cpu", "sm80" (the portable CUDA kernels), "sm80-ptx" (the same, compiled
    by the driver from their PTX, on GPUs newer than the build's machine code), "sm80-decode"
    (the portable split-KV decode kernels, for calls of at most 64 query rows per KV head over
    at least 512 keys) or "sm90" (the Hopper kernels).

    The op's own choice (csrc/api/backend_choice.h), with the op's input checks; nothing runs.
    FLASHATTN_FORCE_BACKEND=sm80|sm90 forces CUDA calls onto one backend; forced to sm90, a
    call the sm90 forward does not take raises RuntimeError saying why. The backward runs
    sm90 where its kernels take the call (head-dim buckets 64, 128 and 256, and 96 / 192 with
    equal qk and v head dims; softcap / ALiBi not with dropout or a block mask; deterministic
    plain calls), else sm80, also under FLASHATTN_FORCE_BACKEND=sm90 (=sm80 forces
    both); the "bwd" answer assumes deterministic=False.

    Arguments: those of flash_attn_func (padded) or flash_attn_varlen_func (with cu_seqlens_q/k;
    max_seqlen_q/k default to the row counts); block_mask / block_size as in
    block_sparse_attn_func (a BlockSparseMask, or a form it compresses here: a call of
    block_sparse_attn_func or its varlen twin). Raises RuntimeError saying why when no kernel of
    this build can run the call, or when the call uses a feature the CUDA kernels do not have
    yet (float8_e4m3fn inputs: issue 14, whose direction="bwd" raises on every device: FP8
    is forward only).
    """
    opts = _options(q, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                    deterministic, learnable_sink, draw_rng=False)
    del opts["deterministic"], opts["rng_state"]
    if cu_seqlens_q is not None:
        max_seqlen_q = q.shape[0] if max_seqlen_q is None else max_seqlen_q
        max_seqlen_k = k.shape[0] if max_seqlen_k is None else max_seqlen_k
    if block_mask is not None:
        from .block_sparse import _mask_args
        if cu_seqlens_q is None:
            shape = q.shape[0], q.shape[2], q.shape[1], k.shape[1]
        else:
            shape = (cu_seqlens_q.shape[0] - 1, q.shape[1], min(max_seqlen_q, q.shape[0]),
                     min(max_seqlen_k, k.shape[0]))
        opts.update(_mask_args(block_mask, block_size, q, *shape, direction == "bwd")[0])
    return torch.ops.flashattn.kernel_path(
        direction, q, k, v, cu_seqlens_q, cu_seqlens_k,
        -1 if max_seqlen_q is None else max_seqlen_q,
        -1 if max_seqlen_k is None else max_seqlen_k, **opts)


# ---------------------------------------------------------------------------------------------
# Block-sparse attention (issue 16).
# ---------------------------------------------------------------------------------------------

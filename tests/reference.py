"""Reference attention, written the obvious way (materialised scores), with the exact
semantics of csrc/common/params.h:

    s = q.k * softmax_scale
    if softcap > 0:   s = softcap * tanh(s / softcap)
    if alibi_slopes:  s += -slope * |i + sk - sq - j|
    visible(i, j) iff (window_left  < 0 or j >= i + sk - sq - window_left) and
                      (window_right < 0 or j <= i + sk - sq + window_right)
    causal == window_right = 0 (bottom-right aligned)
    a row with no visible key: out = 0, lse = -inf
    learnable_sink: an extra key column of score sink_h (never masked) and value 0, so
        lse includes it and an empty row has out = 0, lse = sink_h
    block_mask (issue 16): bool (B or 1, H or 1, ceil(sq / bm), ceil(sk / bn)), expanded to
        elements (block_mask_elements) and and-ed into visible: a dropped tile is not visible
    dropout: out = (P * keep * dropout_scale) @ v, P and lse undropped; keep from
        dropout_keep_ref, a Philox4x32 (7 rounds, as philox.h) written here from the paper
        (numpy), checked against Random123's known-answer vectors and the per-cell layout
        (tests/test_dropout.py)

`attention_ref` computes in `compute_dtype`: float64 for the reference, the inputs' own
dtype for "PyTorch's low-precision computation of the same thing" (the tolerance baseline).
Gradients come from autograd through this function.

FP8 (issue 14, params.h): the semantics are those of the dequantized inputs, q_deq =
q.float() * q_descale[b, kv head of the query head] (k, v alike), so the reference is
attention_ref in float64 on dequantize_fp8's output. The tolerance baseline is an emulation
of the quantised computation a kernel does (fp8_p=True): Q, K, V dequantized (exact: an e4m3
code times an fp32 descale), fp32 scores and softmax, and P rounded to e4m3 for the P V
product after scaling it by 2^8:

    P~ = exp(s - m) * 2^8 in [0, 256]   (m the row max; 256 <= 448, e4m3's largest value)
    out = (round_e4m3(P~) @ V) / l,     l = sum_j P~_j of the UNROUNDED fp32 P~

Why 2^8 and not P in [0, 1]: e4m3 has 3 mantissa bits and its smallest normal is 2^-6, its
smallest subnormal 2^-9. Kept in [0, 1], every probability below 2^-6 of the row's largest
loses precision and those below 2^-10 round to 0, which on long rows (many small
probabilities) biases out. Scaled by 2^8 the normal range reaches down to 2^-14 relative to
the maximum (subnormals to 2^-17), and 256 is the largest power of two below 448, so the
scaling is exact, cancels exactly in the division by l (which carries it too), and folds into
the exponent for free: FA3 does the same (its softmax's Max_offset = 8). The row sum from the
unrounded P~ is what a kernel has without extra work (it sums the fp32 exp2 results before
converting them), and it keeps the lse exact: lse = m + log(l) - 8 log 2.
So the sm90 kernel has to compute P~ = exp2(s * scale_log2 - (m * scale_log2 - 8)) (the
offset 8 subtracted from the max it already subtracts), convert P~ to e4m3 for the P V
WGMMA, accumulate l from the fp32 P~, divide O by l in the epilogue (times v_descale), and
take 8 * ln 2 off its lse (or scale l by 2^-8 first). The kernel's running max (per key block)
rather than the row's final max changes which P~ round where, not their precision: the
tolerance's factor 2 absorbs it.
"""
import math

import numpy as np
import torch

__all__ = [
    "attention_ref",
    "attention_varlen_ref",
    "visible_mask",
    "ref_and_lowp",
    "ref_and_lowp_varlen",
    "effective_window",
    "rotary_ref",
    "kvcache_ref",
    "ref_and_lowp_kvcache",
    "paged_varlen_ref",
    "PHILOX_ROUNDS",
    "philox4x32_ref",
    "dropout_threshold_ref",
    "dropout_scale_ref",
    "dropout_keep_ref",
    "ref_and_lowp_ext",
    "block_mask_elements",
    "round_e4m3",
    "dequantize_fp8",
    "ref_and_emul_fp8",
    "FP8_P_SCALE",
]

# The scaling of P before its rounding to e4m3 (module docstring).
FP8_P_SCALE = 2.0 ** 8


def round_e4m3(x):
    """x rounded to the nearest float8_e4m3fn value (ties to even, as torch's cast), in x's
    dtype. |x| must stay within e4m3's range (448): the cast has no saturation."""
    return x.to(torch.float8_e4m3fn).to(x.dtype)


def effective_window(causal, window_size):
    """(window_left, window_right) as the kernels see them: causal forces window_right = 0."""
    left, right = window_size
    if causal:
        right = 0
    return int(left), int(right)


def visible_mask(sq, sk, window_left, window_right, device=None, pos_offset=(0, 0)):
    """Bool (sq, sk): True where query i may attend key j (bottom-right aligned). pos_offset:
    the position offsets (q, k) of params.h: row i and key j stand at i + q, j + k."""
    i = torch.arange(sq, device=device).view(sq, 1) + pos_offset[0]
    j = torch.arange(sk, device=device).view(1, sk) + pos_offset[1]
    c = i + (sk - sq)
    vis = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if window_left >= 0:
        vis &= j >= c - window_left
    if window_right >= 0:
        vis &= j <= c + window_right
    return vis


def block_mask_elements(block_mask, block_size, sq, sk):
    """Bool (B or 1, H or 1, sq, sk): the dense block mask expanded to its tiles' elements."""
    bm, bn = block_size
    return block_mask.repeat_interleave(bm, -2).repeat_interleave(bn, -1)[..., :sq, :sk]


def alibi_bias(slopes, batch, nheads, sq, sk, device, dtype, pos_offset=(0, 0)):
    """-slope * |i + sk - sq - j| as (B, H, sq, sk) (i, j shifted by pos_offset, params.h).
    slopes: (H,) or (B, H) fp32."""
    slopes = slopes.to(device=device, dtype=dtype)
    if slopes.dim() == 1:
        slopes = slopes.view(1, nheads).expand(batch, nheads)
    i = torch.arange(sq, device=device).view(sq, 1) + pos_offset[0]
    j = torch.arange(sk, device=device).view(1, sk) + pos_offset[1]
    dist = (i + (sk - sq) - j).abs().to(dtype)
    return -slopes.view(batch, nheads, 1, 1) * dist


def scores_ref(qc, kc, softmax_scale, wl, wr, softcap=0.0, alibi_slopes=None, block_mask=None,
               block_size=(128, 128), pos_offset=(0, 0)):
    """The scores of params.h, (B, H, sq, sk) in qc's dtype, -inf where not visible. qc (B, Sq,
    H, d), kc (B, Sk, H, d) (heads already repeated), window (wl, wr) as effective_window;
    pos_offset as attention_ref's."""
    B, sq, H, _ = qc.shape
    sk = kc.shape[1]
    s = torch.einsum("bihd,bjhd->bhij", qc, kc) * softmax_scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        s = s + alibi_bias(alibi_slopes, B, H, sq, sk, s.device, qc.dtype, pos_offset)
    vis = visible_mask(sq, sk, wl, wr, device=s.device, pos_offset=pos_offset)
    if block_mask is not None:
        vis = vis & block_mask_elements(block_mask.to(s.device), block_size, sq, sk)
    return s.masked_fill(~vis, float("-inf"))


def attn_probs_ref(q, k, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                   alibi_slopes=None, block_mask=None, block_size=(128, 128),
                   cu_seqlens=None, compute_dtype=torch.float64):
    """|S| of params.h (return_attn_probs): exp(s - m), m the row's max visible score (no
    sink), 0 where not visible; (B, H, max_sq, max_sk) in compute_dtype. Padded, or varlen
    with cu_seqlens = (cu_q, cu_k) (each sequence in its top-left corner)."""
    d, H, hk = q.shape[-1], q.shape[-2], k.shape[-2]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    wl, wr = effective_window(causal, window_size)

    def one(qb, kb, slopes):
        qc, kc = qb.to(compute_dtype), kb.to(compute_dtype).repeat_interleave(H // hk, dim=2)
        s = scores_ref(qc, kc, softmax_scale, wl, wr, softcap, slopes, block_mask, block_size)
        m = s.amax(dim=-1, keepdim=True) if s.shape[-1] > 0 else s[..., :1]
        return torch.exp(s - torch.where(torch.isinf(m), torch.zeros_like(m), m))

    if cu_seqlens is None:
        return one(q, k, alibi_slopes)
    cq, ck = ([int(x) for x in c.tolist()] for c in cu_seqlens)
    B = len(cq) - 1
    sq = max(cq[b + 1] - cq[b] for b in range(B))
    sk = max(ck[b + 1] - ck[b] for b in range(B))
    out = torch.zeros(B, H, sq, sk, dtype=compute_dtype, device=q.device)
    for b in range(B):
        slopes = alibi_slopes
        if slopes is not None and slopes.dim() == 2:
            slopes = slopes[b]
        pb = one(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], slopes)
        out[b, :, :pb.shape[2], :pb.shape[3]] = pb[0]
    return out


def attention_ref(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    compute_dtype=torch.float64,
    learnable_sink=None,
    dropout_keep=None,
    dropout_scale=1.0,
    block_mask=None,
    block_size=(128, 128),
    fp8_p=False,
    pos_offset=(0, 0),
):
    """Padded layout. q (B, Sq, H, d), k (B, Sk, Hk, d), v (B, Sk, Hk, dv); learnable_sink
    (H,); dropout_keep bool (B, H, >= Sq, >= Sk) (the top-left block is used); block_mask
    dense bool (B or 1, H or 1, n_qblocks, n_kblocks) of block_size tiles. fp8_p: the FP8
    emulation's P (module docstring): P V with P * 2^8 rounded to e4m3, over the unrounded sum.
    pos_offset: (q, k) ints, params.h's position offsets of every batch (mask and ALiBi; the
    caller gives dropout_keep of the shifted positions, dropout_keep_ref's row0 / col0).

    Returns out (B, Sq, H, dv) in compute_dtype and lse (B, H, Sq) in compute_dtype.
    Differentiable (autograd) in q, k, v.
    """
    B, sq, H, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    assert H % hk == 0
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    wl, wr = effective_window(causal, window_size)
    qc, kc, vc = (t.to(compute_dtype) for t in (q, k, v))
    if hk != H:
        kc = kc.repeat_interleave(H // hk, dim=2)
        vc = vc.repeat_interleave(H // hk, dim=2)
    s = scores_ref(qc, kc, softmax_scale, wl, wr, softcap, alibi_slopes, block_mask, block_size,
                   pos_offset)
    if learnable_sink is not None:  # the sink column, last
        sink = learnable_sink.to(compute_dtype).view(1, H, 1, 1).expand(B, H, sq, 1)
        s = torch.cat([s, sink], dim=-1)
    # Max subtraction only for range; detached (the result does not depend on it).
    m = s.detach().amax(dim=-1, keepdim=True) if s.shape[-1] > 0 else None
    if m is None:
        m = torch.zeros(B, H, sq, 1, dtype=compute_dtype, device=s.device)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)  # masked -> exp(-inf) = 0
    l = p.sum(dim=-1, keepdim=True)
    if fp8_p:  # l (and so the lse) from the unrounded P; exact power-of-two scaling
        p = round_e4m3(p * FP8_P_SCALE) / FP8_P_SCALE
    p = p / torch.where(l == 0, torch.ones_like(l), l)
    p = p[..., :sk]
    if dropout_keep is not None:
        p = p * dropout_keep[:, :, :sq, :sk].to(p.device, compute_dtype) * dropout_scale
    out = torch.einsum("bhij,bjhd->bihd", p, vc)
    lse = (m + torch.log(l)).squeeze(-1)  # log(0) = -inf for empty rows
    return out, lse


def attention_varlen_ref(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    compute_dtype=torch.float64,
    learnable_sink=None,
    dropout_keep=None,
    dropout_scale=1.0,
    fp8_p=False,
):
    """Varlen layout. q (total_q, H, d), k (total_k, Hk, d), v (total_k, Hk, dv).

    Returns out (total_q, H, dv) and lse (H, total_q), both in compute_dtype; rows not
    covered by any sequence stay 0 / -inf. A per-sequence loop over attention_ref.
    """
    cq = [int(x) for x in cu_seqlens_q.tolist()]
    ck = [int(x) for x in cu_seqlens_k.tolist()]
    H, dv = q.shape[1], v.shape[2]
    outs, lses = [], []
    covered = 0
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        assert q0 == covered, "reference expects sorted, gap-free cu_seqlens_q"
        covered = q1
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes[b] if alibi_slopes.dim() == 2 else alibi_slopes
        o, lse = attention_ref(
            q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], softmax_scale, causal,
            window_size, softcap, slopes, compute_dtype, learnable_sink,
            None if dropout_keep is None else dropout_keep[b:b + 1], dropout_scale,
            fp8_p=fp8_p,
        )
        outs.append(o[0])
        lses.append(lse[0])
    total_q = q.shape[0]
    if covered < total_q:  # trailing rows that belong to no sequence
        outs.append(torch.zeros(total_q - covered, H, dv, dtype=compute_dtype, device=q.device))
        lses.append(torch.full((H, total_q - covered), float("-inf"), dtype=compute_dtype,
                               device=q.device))
    return torch.cat(outs, 0), torch.cat(lses, 1)


def _with_grads(fn, q, k, v, dout, compute_dtype, **kw):
    qc, kc, vc = (t.detach().to(compute_dtype).requires_grad_() for t in (q, k, v))
    out, lse = fn(qc, kc, vc, compute_dtype=compute_dtype, **kw)
    res = {"out": out.detach(), "lse": lse.detach()}
    if dout is not None:
        dq, dk, dv = torch.autograd.grad(out, (qc, kc, vc), dout.to(compute_dtype))
        res.update(dq=dq, dk=dk, dv=dv)
    return res


def _lowp_dtype(dtype):
    return dtype  # PyTorch's own computation in the inputs' dtype (fp16/bf16/fp32)


def ref_and_lowp(q, k, v, dout=None, **kw):
    """(float64 reference, same computation in q.dtype): dicts with out, lse[, dq, dk, dv]."""
    ref = _with_grads(attention_ref, q, k, v, dout, torch.float64, **kw)
    low = _with_grads(attention_ref, q, k, v, dout, _lowp_dtype(q.dtype), **kw)
    return ref, low


def ref_and_lowp_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, dout=None, **kw):
    def fn(q, k, v, compute_dtype, **kw2):
        return attention_varlen_ref(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                    compute_dtype=compute_dtype, **kw2)

    ref = _with_grads(fn, q, k, v, dout, torch.float64, **kw)
    low = _with_grads(fn, q, k, v, dout, _lowp_dtype(q.dtype), **kw)
    return ref, low


# ---------------------------------------------------------------------------------------------
# flash_attn_with_kvcache and paged KV (params.h, KvAppendParams): flash-attn 2.8's semantics,
# sequence by sequence. Metadata is clamped as the contract says (seq_info, page_of), so the
# same function serves wrong metadata.
# ---------------------------------------------------------------------------------------------

def rotary_ref(x, cos, sin, pos, interleaved):
    """x (S, H, d) rotated over its first rotary_dim = 2 * cos.shape[1] dims at positions pos
    (S,) (clamped into the table), the rest unchanged; in x's dtype. Pairs (2j, 2j + 1)
    interleaved, else (j, j + rotary_dim / 2): x0' = x0 cos - x1 sin, x1' = x1 cos + x0 sin."""
    half = cos.shape[1]
    pos = pos.clamp(0, cos.shape[0] - 1)
    c, s = cos[pos].to(x.dtype)[:, None, :], sin[pos].to(x.dtype)[:, None, :]
    i0 = slice(0, 2 * half, 2) if interleaved else slice(0, half)
    i1 = slice(1, 2 * half, 2) if interleaved else slice(half, 2 * half)
    x0, x1 = x[..., i0], x[..., i1]
    y = x.clone()
    y[..., i0] = x0 * c - x1 * s
    y[..., i1] = x1 * c + x0 * s
    return y


def _cache_rows(b, k_cache, block_table, cache_batch_idx):
    """Row indices, into k_cache flattened to (rows, Hk, d), of sequence b's logical rows."""
    n0, n1 = k_cache.shape[0], k_cache.shape[1]
    if block_table is not None:
        pages = block_table[b].long().clamp(0, n0 - 1)
        return (pages[:, None] * n1 + torch.arange(n1, device=pages.device)).flatten()
    kb = b if cache_batch_idx is None else int(cache_batch_idx[b].clamp(0, n0 - 1))
    return kb * n1 + torch.arange(n1, device=k_cache.device)


def kvcache_ref(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                rotary_interleaved=True, alibi_slopes=None, compute_dtype=torch.float64):
    """flash_attn_with_kvcache in compute_dtype. Returns (out (B, Sq, H, dv), lse (B, H, Sq),
    k_cache, v_cache after the append). Appends run in batch order (the last sequence wins
    rows several share); the attention of sequence b sees cache rows [leftpad, seqlen + new)."""
    cd = compute_dtype
    B, sq, H, d = q.shape
    hk = k_cache.shape[2]
    paged = block_table is not None
    cap = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    kc, vc = (t.to(cd).clone(memory_format=torch.contiguous_format) for t in (k_cache, v_cache))
    kflat, vflat = kc.view(-1, hk, d), vc.view(-1, hk, vc.shape[-1])
    knew = 0 if k is None else k.shape[1]
    seqlens = (torch.full((B,), cap, dtype=torch.long) if cache_seqlens is None
               else cache_seqlens.long().cpu())
    # flash-attn: a window side at least the capacity wide is unbounded; causal is right = 0.
    wl, wr = effective_window(causal, window_size)
    wl, wr = (-1 if wl >= cap else wl), (-1 if not causal and wr >= cap else wr)
    per_row = wl >= 0 or wr >= 0
    dev = q.device
    rows = [_cache_rows(b, k_cache, block_table, cache_batch_idx) for b in range(B)]
    for b in range(B if k is not None else 0):
        r = seqlens[b] + torch.arange(knew, device=dev)
        keep = (r >= 0) & (r < cap)
        kb = k[b].to(cd)
        if rotary_cos is not None:
            kb = rotary_ref(kb, rotary_cos, rotary_sin, r, rotary_interleaved)
        kflat[rows[b][r[keep]]] = kb[keep]
        vflat[rows[b][r[keep]]] = v[b].to(cd)[keep]
    outs, lses = [], []
    for b in range(B):
        end = int(min(max(seqlens[b] + knew, 0), cap))
        start = 0 if cache_leftpad is None else int(min(max(int(cache_leftpad[b]), 0), end))
        idx = rows[b][start:end]
        qb = q[b].to(cd)
        if rotary_cos is not None:
            pos = seqlens[b] + (torch.arange(sq, device=dev) if per_row
                                else torch.zeros(sq, dtype=torch.long, device=dev))
            qb = rotary_ref(qb, rotary_cos, rotary_sin, pos, rotary_interleaved)
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes[b] if alibi_slopes.dim() == 2 else alibi_slopes
        o, lse = attention_ref(qb[None], kflat[idx][None], vflat[idx][None], softmax_scale,
                               False, (wl, wr), softcap, slopes, cd)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses), kc, vc


def ref_and_lowp_kvcache(q, k_cache, v_cache, *args, **kw):
    """(float64 reference, the same in q's dtype), each (out, lse, k_cache, v_cache)."""
    return tuple(kvcache_ref(q, k_cache, v_cache, *args, compute_dtype=cd, **kw)
                 for cd in (torch.float64, q.dtype))


def paged_varlen_ref(q, k_pages, v_pages, cu_seqlens_q, cu_seqlens_k, block_table,
                     compute_dtype=torch.float64, **kw):
    """flash_attn_varlen_func with block_table: sequence b's keys are its logical rows
    0 .. cu_seqlens_k[b + 1] - cu_seqlens_k[b] - 1 through the block table."""
    ck = [int(x) for x in cu_seqlens_k.tolist()]
    ks, vs, cu = [], [], [0]
    for b in range(len(ck) - 1):
        rows = _cache_rows(b, k_pages, block_table, None)[: ck[b + 1] - ck[b]]
        ks.append(k_pages.flatten(0, 1)[rows])
        vs.append(v_pages.flatten(0, 1)[rows])
        cu.append(cu[-1] + len(rows))
    return attention_varlen_ref(q, torch.cat(ks), torch.cat(vs), cu_seqlens_q,
                                torch.tensor(cu, dtype=torch.int32), compute_dtype=compute_dtype,
                                **kw)


# ---------------------------------------------------------------------------------------------
# Dropout (params.h, csrc/common/philox.h) and sinks: an independent Philox and the reference
# with both, gradients of q, k, v and the sink through autograd.
# ---------------------------------------------------------------------------------------------

_M32 = 0xFFFFFFFF


PHILOX_ROUNDS = 7  # the dropout mask's (csrc/common/philox.h's kPhiloxRounds)


def philox4x32_ref(c0, c1, c2, c3, k0, k1, rounds=PHILOX_ROUNDS):
    """Philox4x32 with `rounds` rounds on numpy uint64 arrays holding 32-bit values (products
    fit in 64 bits)."""
    c = [np.asarray(x, dtype=np.uint64) for x in (c0, c1, c2, c3)]
    k0, k1 = np.uint64(k0), np.uint64(k1)
    m0, m1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    w0, w1, mask, sh = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85), np.uint64(_M32), np.uint64(32)
    for _ in range(rounds):
        p0, p1 = m0 * c[0], m1 * c[2]
        c = [(p1 >> sh) ^ c[1] ^ k0, p1 & mask, (p0 >> sh) ^ c[3] ^ k1, p0 & mask]
        k0, k1 = (k0 + w0) & mask, (k1 + w1) & mask
    return c


def dropout_threshold_ref(p):
    """params.h's rule: threshold = max(1, round(p * 256)), at most 255; 0 without dropout.
    The effective dropout probability is threshold / 256."""
    if p <= 0:
        return 0
    return min(255, max(1, int(np.float32(p) * np.float32(256) + np.float32(0.5))))


def dropout_scale_ref(p):
    """params.h's scale of the kept entries: flash-attn's 1 / (1 - p) of the p asked for (float32
    as the kernels hold it); 1 without dropout."""
    return float(np.float32(1.0 / (1.0 - p))) if dropout_threshold_ref(p) else 1.0


def dropout_keep_ref(rng_state, batch, nheads, sq, sk, dropout_p, row0=0, col0=0):
    """Bool (batch, nheads, sq, sk): Z of params.h for the int64 (seed, offset) rng_state, of
    rows row0 + i and columns col0 + j (the position offsets of params.h)."""
    seed, offset = (int(x) & ((1 << 64) - 1) for x in rng_state.tolist())
    if batch * nheads * sq * sk == 0:
        return torch.zeros(batch, nheads, sq, sk, dtype=torch.bool)
    # 16 x 16 blocks (I, J); within one, cell (r, c) is in unit u = 4 ((r >> 1) & 3) + ((c >> 1)
    # & 3), word ((r & 1) << 1) | (r >> 3), byte ((c >> 3) << 1) | (c & 1) (philox.h). One
    # Philox call per (b, h, I, J, u) gives its unit's 16 cells (4 words x 4 bytes).
    I0, J0 = row0 >> 4, col0 >> 4
    nI, nJ = ((row0 + sq - 1) >> 4) - I0 + 1, ((col0 + sk - 1) >> 4) - J0 + 1
    b = np.arange(batch, dtype=np.uint64).reshape(batch, 1, 1, 1, 1)
    h = np.arange(nheads, dtype=np.uint64).reshape(1, nheads, 1, 1, 1)
    I = np.arange(I0, I0 + nI, dtype=np.uint64).reshape(1, 1, nI, 1, 1)
    J = np.arange(J0, J0 + nJ, dtype=np.uint64).reshape(1, 1, 1, nJ, 1)
    u = np.arange(16, dtype=np.uint64).reshape(1, 1, 1, 1, 16)
    shape = (batch, nheads, nI, nJ, 16)
    words = philox4x32_ref(np.broadcast_to(J, shape), np.broadcast_to(I * 16 + u, shape),
                           np.broadcast_to((((offset & _M32) + h) & _M32), shape),
                           np.broadcast_to((((offset >> 32) + b) & _M32), shape),
                           seed & _M32, seed >> 32)
    # kept[..., w, u, y]: byte y of word w of unit u kept.
    shifts = np.uint64(8) * np.arange(4, dtype=np.uint64)
    thr = np.uint64(dropout_threshold_ref(dropout_p))
    kept = np.stack([((w[..., None] >> shifts) & np.uint64(0xFF)) >= thr for w in words], -3)
    r, c = np.arange(16).reshape(16, 1), np.arange(16).reshape(1, 16)
    cell = (((r & 1) << 1) | (r >> 3)) * 64 + (4 * ((r >> 1) & 3) + ((c >> 1) & 3)) * 4 + \
        (((c >> 3) << 1) | (c & 1))  # (r, c) -> flat (w, u, y)
    z = kept.reshape(batch, nheads, nI, nJ, 256)[..., cell]  # (b, h, I, J, r, c)
    z = z.transpose(0, 1, 2, 4, 3, 5).reshape(batch, nheads, nI * 16, nJ * 16)
    i, j = row0 - 16 * I0, col0 - 16 * J0
    return torch.from_numpy(np.ascontiguousarray(z[:, :, i:i + sq, j:j + sk]))


def _ext_with_grads(fn, q, k, v, dout, sink, compute_dtype, out_used=None, **kw):
    qc, kc, vc = (t.detach().to(compute_dtype).requires_grad_() for t in (q, k, v))
    sc = None if sink is None else sink.detach().to(compute_dtype).requires_grad_()
    out, lse = fn(qc, kc, vc, compute_dtype=compute_dtype, learnable_sink=sc, **kw)
    res = {"out": out.detach(), "lse": lse.detach()}
    if dout is not None:
        leaves = (qc, kc, vc) + ((sc,) if sc is not None else ())
        loss = (out * dout.to(compute_dtype)).sum()
        if out_used is not None:
            # The backward's D = rowsum(dO * out) uses the stored out (q's dtype), as in
            # flash-attn: dS = P (dP - D) then carries -P dD, dD = dO . (out_used - out),
            # which is the gradient of -dD . lse (d lse_i / d s_ij = P_ij, also for the sink).
            # With dropout this no longer cancels where a row sees one key (out != v).
            d_d = ((out_used.to(compute_dtype) - out.detach()) * dout.to(compute_dtype)).sum(-1)
            d_d = d_d.transpose(0, 1) if d_d.dim() == 2 else d_d.transpose(1, 2)
            loss = loss - (d_d * torch.where(torch.isinf(lse), 0.0, lse)).sum()
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        res.update(zip(("dq", "dk", "dv", "dsink"), grads))
    return res


def ref_and_lowp_ext(q, k, v, dout=None, sink=None, cu_seqlens=None, out_used=None, **kw):
    """ref_and_lowp / ref_and_lowp_varlen (cu_seqlens = (cu_q, cu_k)) with learnable_sink and
    the dropout keywords of attention_ref; dicts also hold dsink with a sink. out_used: the
    forward output the backward under test was given (its D; see _ext_with_grads): the
    float64 gradients are then those exact at that D."""
    if cu_seqlens is None:
        fn = attention_ref
    else:
        def fn(q, k, v, **kw2):
            return attention_varlen_ref(q, k, v, *cu_seqlens, **kw2)
    ref = _ext_with_grads(fn, q, k, v, dout, sink, torch.float64, out_used, **kw)
    low = _ext_with_grads(fn, q, k, v, dout, sink, _lowp_dtype(q.dtype), **kw)
    return ref, low


# ---------------------------------------------------------------------------------------------
# FP8 (issue 14): dequantization, the float64 reference and the emulation (module docstring).
# ---------------------------------------------------------------------------------------------

def dequantize_fp8(x, descale, nheads, cu_seqlens=None, dtype=torch.float64):
    """x (float8_e4m3fn, padded (B, S, Hx, d) or varlen (T, Hx, d)) as `dtype` times its descale
    (None = 1, else (B, Hk) fp32) of (sequence b, kv head h // (Hx // Hk)); Hx = nheads is q's
    head count or k / v's (then the group is 1). Varlen rows outside every sequence get 1."""
    xf = x.to(dtype)
    if descale is None:
        return xf
    d = descale.to(dtype).repeat_interleave(nheads // descale.shape[1], dim=1)  # (B, Hx)
    if cu_seqlens is None:
        return xf * d[:, None, :, None]
    cu = [int(c) for c in cu_seqlens.tolist()]
    rows = torch.ones(x.shape[0], nheads, dtype=dtype)
    for b in range(len(cu) - 1):
        rows[cu[b]:cu[b + 1]] = d[b]
    return xf * rows.to(x.device)[:, :, None]


def ref_and_emul_fp8(q, k, v, q_descale=None, k_descale=None, v_descale=None,
                     cu_seqlens=None, out_dtype=torch.bfloat16, **kw):
    """(ref, emul, f32) dicts of out and lse for FP8 inputs: ref the float64 attention on the
    dequantized inputs; emul the emulation of the quantised computation (fp32, P rounded to
    e4m3 after the 2^8 scaling; out in out_dtype), the tolerance baseline of any FP8 kernel;
    f32 the same without rounding P (out in out_dtype), the tighter baseline of a backend that
    keeps P in fp32 (the CPU). cu_seqlens = (cu_q, cu_k) for varlen."""
    cu_q, cu_k = cu_seqlens if cu_seqlens is not None else (None, None)
    res = []
    for dtype, fp8_p in ((torch.float64, False), (torch.float32, True), (torch.float32, False)):
        qd = dequantize_fp8(q, q_descale, q.shape[-2], cu_q, dtype)
        kd = dequantize_fp8(k, k_descale, k.shape[-2], cu_k, dtype)
        vd = dequantize_fp8(v, v_descale, v.shape[-2], cu_k, dtype)
        if cu_seqlens is None:
            out, lse = attention_ref(qd, kd, vd, compute_dtype=dtype, fp8_p=fp8_p, **kw)
        else:
            out, lse = attention_varlen_ref(qd, kd, vd, cu_q, cu_k, compute_dtype=dtype,
                                            fp8_p=fp8_p, **kw)
        if dtype != torch.float64:
            out = out.to(out_dtype)
        res.append({"out": out, "lse": lse})
    return tuple(res)

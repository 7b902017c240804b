"""The exact merge of partial attention results over disjoint key sets through their
log-sum-exp (ring attention's per-step partials; the same merge as split-KV decoding)."""
import torch


def merge_attn_partials(outs, lses):
    """Merge attention results over disjoint key sets into the result over their union.

    outs: sequence of (batch, seqlen, nheads, headdim_v) tensors; lses: their softmax_lse,
    (batch, nheads, seqlen); or the varlen shapes (total, nheads, headdim_v) and
    (nheads, total). Returns (out, lse) in fp32, shaped as the inputs:
        lse = logsumexp_i lse_i,   out = sum_i exp(lse_i - lse) * out_i.
    Computed against the row maximum, so no exponent overflows; a row whose lse_i is -inf (no
    visible key in that set) contributes nothing, even if its out_i holds garbage, and a row
    that is -inf in every partial gives out 0 and lse -inf (never NaN).
    """
    if len(outs) != len(lses) or not outs:
        raise ValueError(f"flashattn: merge_attn_partials: need as many outs as lses (at least "
                         f"one), got {len(outs)} and {len(lses)}")
    if lses[0].dim() == 2:  # varlen: a batch of one
        out, lse = merge_attn_partials([o[None] for o in outs], [lse[None] for lse in lses])
        return out[0], lse[0]
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

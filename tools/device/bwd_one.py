"""Runs one backward benchmark cell a few times (for a profiler): ours, SDPA flash's, SDPA
cuDNN's, or FlashAttention-4's (`source .peers/b/env.sh` first); the forward runs once.
sparse:<mask> / flex:<mask>: ours block-sparse / FlexAttention with bench_sparse's mask
(random50, random25, local_global; 128 x 128 blocks, non-causal).
Usage: python tools/device/bwd_one.py ours|sdpa|cudnn|fa4|sparse:<mask>|flex:<mask> d N causal"""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

impl, d, N, causal = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), bool(int(sys.argv[4]))
B, H = max(1, 16384 // N), 2048 // d
q, k, v = (torch.randn(B, N, H, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
if impl == "ours":
    import flashattn
    out = flashattn.flash_attn_func(q, k, v, causal=causal)
elif impl.startswith(("sparse:", "flex:")):
    import flashattn
    from flashattn import bench_sparse as bs
    mask = bs.block_mask(impl.split(":")[1], H, N // 128, q.device)
    if impl.startswith("sparse:"):
        out = flashattn.block_sparse_attn_func(q, k, v, flashattn.block_sparse_mask(mask,
                                                                                    (128, 128)))
    else:
        flex = bs.flex_func(q.device)
        fmask = bs.flex_block_mask(mask, 128, N)
        out = flex(*(t.transpose(1, 2) for t in (q, k, v)), block_mask=fmask).transpose(1, 2)
elif impl == "fa4":
    from flash_attn.cute import flash_attn_func as fa4_func
    out = fa4_func(q, k, v, causal=causal)[0]
else:
    backend = SDPBackend.FLASH_ATTENTION if impl == "sdpa" else SDPBackend.CUDNN_ATTENTION
    with sdpa_kernel(backend):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            is_causal=causal).transpose(1, 2)
g = torch.randn_like(out)
for _ in range(5):
    torch.autograd.grad(out, (q, k, v), g, retain_graph=True)
torch.cuda.synchronize()

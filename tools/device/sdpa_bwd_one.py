"""Runs SDPA's flash backward on one benchmark cell a few times (for a profiler)."""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

d, N, causal = int(sys.argv[1]), int(sys.argv[2]), bool(int(sys.argv[3]))
B, H = 16384 // N, 2048 // d
q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    g = torch.randn_like(o)
    for _ in range(5):
        torch.autograd.grad(o, (q, k, v), g, retain_graph=True)
torch.cuda.synchronize()

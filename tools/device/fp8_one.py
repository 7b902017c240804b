"""One FP8 forward call per cell (d N causal given as argv triples), for Nsight Compute:
python3 tools/device/fp8_one.py 128 16384 0 64 1024 1 (B*N = 16k tokens, hidden 2048)."""
import sys

import torch

import flashattn

cells = [tuple(int(x) for x in sys.argv[i:i + 3]) for i in range(1, len(sys.argv), 3)]
for d, n, causal in cells:
    b, h = 16384 // n, 2048 // d
    q, k, v = (torch.randn(b, n, h, d, device="cuda").to(torch.float8_e4m3fn) for _ in range(3))
    ds = torch.rand(b, h, device="cuda") + 0.5
    out = flashattn.flash_attn_func(q, k, v, causal=bool(causal), q_descale=ds, k_descale=ds,
                                    v_descale=ds)
    torch.cuda.synchronize()
    print(d, n, causal, tuple(out.shape), out.dtype, flush=True)

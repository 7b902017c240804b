"""One decode call (flash_attn_with_kvcache, GQA 32/8, d128, bf16) run a few times, for a
profiler: `python3 tools/device/decode_one.py B N page` (page 0 = contiguous cache)."""
import sys

import torch

sys.path.insert(0, ".")
from flashattn.bench_decode import DecodeCell, _ours_call  # noqa: E402

B, N, page = (int(x) for x in sys.argv[1:4])
call = _ours_call(DecodeCell(B, N, page=page), torch.device("cuda"))
for _ in range(5):
    call()
torch.cuda.synchronize()

"""Context-parallel (ring) attention over torch.distributed: ring_flash_attn_func and its varlen
twin (ring.py), the zigzag and plain layout helpers (layout.py), and the exact log-sum-exp merge
of partial results (merge.py). Importing it creates no process-group state."""
from .layout import plain_gather, plain_shard, zigzag_gather, zigzag_shard
from .merge import merge_attn_partials
from .ring import ring_flash_attn_func, ring_flash_attn_varlen_func

__all__ = [
    "ring_flash_attn_func",
    "ring_flash_attn_varlen_func",
    "zigzag_shard",
    "zigzag_gather",
    "plain_shard",
    "plain_gather",
    "merge_attn_partials",
]

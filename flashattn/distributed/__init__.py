"""Context-parallel (ring) attention over torch.distributed: ring_flash_attn_func, the zigzag
and plain layout helpers, and the exact log-sum-exp merge of partial results (see ring.py).
Importing it creates no process-group state."""
from .ring import *  # noqa: F401,F403
from .ring import __all__  # noqa: F401

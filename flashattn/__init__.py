"""flashattn: exact FlashAttention for PyTorch (CPU backend + CUDA kernels).

Importing the package loads the compiled extension, which registers the dispatcher ops
`torch.ops.flashattn.{fwd,bwd,varlen_fwd,varlen_bwd}`; `ops` adds their fake kernels and
autograd; `interface` holds the flash-attn 2.x compatible functions.
"""
import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C  # noqa: F401  (registers the ops)
from . import ops  # noqa: F401
from . import distributed  # noqa: F401  (ring attention; no process-group state at import)
from ._build_config import BUILD_CONFIG
from .interface import *  # noqa: F401,F403
from .interface import __all__ as _interface_all

__version__ = "0.1.0"
__all__ = list(_interface_all) + ["BUILD_CONFIG"]

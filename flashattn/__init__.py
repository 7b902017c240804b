"""flashattn: exact FlashAttention for PyTorch (CPU backend + CUDA kernels).

Importing the package checks that this torch can load the build (torch >= the stable-ABI
target version recorded by setup.py; a CUDA build of torch for a build with CUDA kernels), then
loads the compiled extension, which registers the dispatcher ops
`torch.ops.flashattn.{fwd,bwd,varlen_fwd,varlen_bwd,fwd_kvcache,attn_probs}`; `ops` adds their fake
kernels and autograd; `interface` holds the flash-attn 2.x compatible functions, `block_sparse`
the block-sparse ones.
"""
import re
import warnings

import torch  # loads libtorch before the extension

from ._build_config import BUILD_CONFIG

__version__ = "0.1.0"


def _release(version):
    """(major, minor) of a version such as '2.10.0+cu130' or '2.11.0a0+git1234'; None if
    unreadable."""
    m = re.match(r"(\d+)\.(\d+)", str(version))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _check_torch():
    """Raises ImportError, naming both versions, when the running torch cannot load this build.
    Done before the extension loads: on an older torch the loader would report an undefined
    stable-ABI symbol, on a torch without CUDA a missing libtorch_cuda.so."""
    found, target = torch.__version__, BUILD_CONFIG.get("torch_target_version")
    if target and _release(found) and _release(found) < _release(target):
        raise ImportError(
            f"flashattn {__version__} needs torch >= {target} (it is built against the stable "
            f"ABI of torch {target}), but this is torch {found}; install torch >= {target}")
    cuda = BUILD_CONFIG.get("cuda_version")
    if cuda and torch.version.cuda is None and not BUILD_CONFIG.get("FLASHATTN_SPLIT_CUDA"):
        raise ImportError(
            f"flashattn {__version__} is built with CUDA {cuda} kernels and needs a CUDA "
            f"{cuda.split('.')[0]}.x build of torch, but this torch {found} has no CUDA; "
            "install such a torch, or build flashattn here from source for the CPU backend "
            "alone (pip install --no-build-isolation .)")


def _cuda_mismatch(e):
    """ImportError e, with the CUDA versions named when this build's and torch's differ."""
    cuda, torch_cuda = BUILD_CONFIG.get("cuda_version"), torch.version.cuda
    if cuda and torch_cuda and cuda.split(".")[0] != torch_cuda.split(".")[0]:
        return ImportError(
            f"{e} (flashattn {__version__} is built with CUDA {cuda}, this torch "
            f"{torch.__version__} with CUDA {torch_cuda}: install a CUDA "
            f"{cuda.split('.')[0]}.x build of torch)")
    return e


def _load_extension():
    """Loads _C (registers the ops). A split build (FLASHATTN_SPLIT_CUDA) keeps its kernels in
    _C_cuda, loaded here only when torch has CUDA and handed to _C; where it cannot load, the
    CPU backend still works and a CUDA call raises an error naming why (cuda_forward.cpp)."""
    try:
        from . import _C  # noqa: F401  (registers the ops)
    except ImportError as e:
        raise _cuda_mismatch(e) from e
    if not BUILD_CONFIG.get("FLASHATTN_SPLIT_CUDA"):
        return
    if torch.version.cuda is None:
        _C._set_cuda_table(0, f"this torch {torch.__version__} has no CUDA (a CPU-only build); "
                              "install a CUDA build of torch for the CUDA kernels")
        return
    try:
        from . import _C_cuda
    except ImportError as e:
        why = f"importing it failed: {_cuda_mismatch(e)}"
        _C._set_cuda_table(0, why)
        warnings.warn(f"flashattn: the CUDA kernels (flashattn._C_cuda) did not load ({why}); "
                      "the CPU backend works, CUDA calls raise this error", stacklevel=3)
        return
    _C._set_cuda_table(_C_cuda._table(), None)


_check_torch()
_load_extension()

from . import ops  # noqa: E402,F401
from . import distributed  # noqa: E402,F401  (ring attention; no process-group state at import)
from .interface import *  # noqa: E402,F401,F403
from .interface import __all__ as _interface_all  # noqa: E402
from .block_sparse import *  # noqa: E402,F401,F403
from .block_sparse import __all__ as _block_sparse_all  # noqa: E402

__all__ = list(_interface_all) + list(_block_sparse_all) + ["BUILD_CONFIG"]

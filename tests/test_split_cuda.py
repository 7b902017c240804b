"""The split build (setup.py's FLASHATTN_SPLIT_CUDA=1): the kernels in flashattn._C_cuda, loaded
at import only when torch has CUDA and handed to flashattn._C as a table of entry points
(csrc/common/cuda_table.h). On a CPU-only torch the package imports and the CPU backend runs;
on a CUDA torch _C_cuda is loaded and its table accepted. Other builds: the one-library layout
(no _C_cuda, no _set_cuda_table). CPU only: .ci/run builds a split wheel and runs this file on
a CPU-only torch and on a CUDA one (tools/wheel_check.sh)."""
import ctypes
import struct
import sys

import pytest
import torch

import flashattn
from flashattn import _C

SPLIT = bool(flashattn.BUILD_CONFIG.get("FLASHATTN_SPLIT_CUDA"))


def test_layout_matches_the_build():
    if not SPLIT:
        assert not hasattr(_C, "_set_cuda_table")
        assert "flashattn._C_cuda" not in sys.modules
        return
    assert hasattr(_C, "_set_cuda_table")
    loaded = "flashattn._C_cuda" in sys.modules
    assert loaded == (torch.version.cuda is not None), \
        f"_C_cuda loaded: {loaded}, torch.version.cuda: {torch.version.cuda}"


def test_cpu_backend_runs():
    q = torch.randn(1, 33, 2, 16)
    out = flashattn.flash_attn_func(q, q, q, causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2), is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert flashattn.kernel_path(q, q, q) == "cpu"


@pytest.mark.skipif(not SPLIT, reason="a one-library build (FLASHATTN_SPLIT_CUDA unset)")
def test_table_of_another_version_is_refused():
    """A table whose version or size is not this build's (a stale _C_cuda beside a new _C) is
    refused with an ImportError naming both; the table in use stays."""
    bad = ctypes.create_string_buffer(struct.pack("II", 999, 8) + bytes(256))
    with pytest.raises(ImportError, match="another build than flashattn._C"):
        _C._set_cuda_table(ctypes.addressof(bad), None)
    test_cpu_backend_runs()


@pytest.mark.skipif(not SPLIT or torch.version.cuda is not None,
                    reason="needs a split build on a CPU-only torch")
def test_cuda_only_parts_say_why():
    """On a CPU-only torch the CUDA entry points are absent, with the reason recorded; the
    package's CPU paths never reach them."""
    assert "flashattn._C_cuda" not in sys.modules
    assert flashattn.BUILD_CONFIG["cuda_version"]  # built with CUDA kernels all the same

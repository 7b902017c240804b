"""The import-time check of the running torch against the build (flashattn/__init__.py): an
older torch than the stable-ABI target setup.py recorded, or a torch without CUDA under a build
with CUDA kernels, gets an ImportError naming both versions before the extension loads."""
import os
import subprocess
import sys

import pytest
import torch

import flashattn

TARGET = flashattn.BUILD_CONFIG["torch_target_version"]


def older_than_target():
    major, minor = map(int, TARGET.split("."))
    return f"{major}.{minor - 1}.1+cu128" if minor else f"{major - 1}.99.0"


def test_target_recorded():
    """setup.py records the target it derives from TORCH_TARGET_VERSION; this torch meets it."""
    assert flashattn._release(TARGET) is not None
    assert flashattn._release(torch.__version__) >= flashattn._release(TARGET)
    flashattn._check_torch()


@pytest.mark.parametrize("version, ok", [
    (TARGET + ".0", True), (TARGET + ".0+cu130", True), (TARGET + ".1a0+git1234", True),
    (older_than_target(), False), ("1.13.1", False), ("2.0.0", False),
])
def test_older_torch_refused(monkeypatch, version, ok):
    monkeypatch.setattr(torch, "__version__", version)
    if ok:
        flashattn._check_torch()
        return
    with pytest.raises(ImportError) as e:
        flashattn._check_torch()
    assert f"torch >= {TARGET}" in str(e.value) and f"this is torch {version}" in str(e.value)


def test_cpu_only_torch(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    cuda = flashattn.BUILD_CONFIG["cuda_version"]
    if cuda is None or flashattn.BUILD_CONFIG.get("FLASHATTN_SPLIT_CUDA"):
        # a CPU-only build loads into any torch; a split build's _C too (its kernels are in
        # _C_cuda, loaded only with a CUDA torch: tests/test_split_cuda.py)
        flashattn._check_torch()
        return
    with pytest.raises(ImportError, match=f"CUDA {cuda} kernels and needs a CUDA "
                                          f"{cuda.split('.')[0]}.x build of torch"):
        flashattn._check_torch()


def test_import_stops_before_the_extension():
    """The real import path, in a fresh interpreter whose torch reports an older version: the
    error names both versions and the extension was never loaded."""
    code = ("import sys, torch\n"
            f"torch.__version__ = {older_than_target()!r}\n"
            "try:\n    import flashattn\nexcept ImportError as e:\n    print('ERR', e)\n"
            "print('LOADED' if 'flashattn._C' in sys.modules else 'NOT LOADED')\n")
    # Run beside the package under test, so that the child imports the same one.
    cwd = os.path.dirname(os.path.dirname(os.path.abspath(flashattn.__file__)))
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"ERR flashattn {flashattn.__version__} needs torch >= {TARGET}" in r.stdout, r.stdout
    assert older_than_target() in r.stdout and "NOT LOADED" in r.stdout, r.stdout

"""The extension is built against torch's stable C ABI and Python's limited API: it imports
no C++-mangled torch/c10/ATen symbol and is named *.abi3.so."""
import re
import shutil
import subprocess

import pytest

import flashattn

# A length-prefixed C++ identifier of a torch namespace anywhere in a mangled name
# (_ZN3c10..., _ZNK2at..., template arguments such as ...IN3c106SymIntE...).
_TORCH_NS = re.compile(r"(?<![0-9])(3c10|2at|5torch|6caffe2)(?=[A-Za-z_])")


def _so():
    return flashattn._C.__file__


def test_module_is_abi3():
    assert _so().endswith(".abi3.so"), _so()


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) not installed")
def test_no_cpp_torch_symbols_imported():
    res = subprocess.run(["nm", "-D", "--undefined-only", _so()], capture_output=True,
                         text=True, check=True)
    syms = [line.split()[-1] for line in res.stdout.splitlines() if line.strip()]
    assert syms, "nm listed no undefined symbols at all"
    bad = [s for s in syms if s.startswith("_Z") and _TORCH_NS.search(s)]
    if bad and shutil.which("c++filt"):
        bad = subprocess.run(["c++filt"], input="\n".join(bad), capture_output=True,
                             text=True).stdout.splitlines()
    assert not bad, f"{len(bad)} C++ torch symbols imported (not stable ABI):\n" + \
        "\n".join(bad[:30])
    # It does use the stable C shim.
    assert any(s.startswith(("aoti_torch_", "torch_")) for s in syms)



@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) not installed")
def test_cxx_runtime_is_shared():
    """The extension loads the shared libstdc++ (torch's) and defines no C++ runtime of its
    own: with a static copy, an error thrown into torch crashed the process (setup.py)."""
    dynamic = subprocess.run(["readelf", "-d", _so()], capture_output=True, text=True,
                             check=True).stdout
    assert "libstdc++.so" in dynamic, dynamic
    defined = subprocess.run(["nm", "-D", "--defined-only", _so()], capture_output=True,
                             text=True, check=True).stdout if shutil.which("nm") else ""
    own = [line.split()[-1] for line in defined.splitlines()
           if line.split() and line.split()[-1] in ("__cxa_throw", "__cxa_begin_catch")]
    assert not own, f"the extension defines {own}"

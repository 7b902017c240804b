"""The build flags' plumbing (setup.py FLAGS -> a C++ macro of the same name -> a
flashattn.BUILD_CONFIG key of the same name), read from the sources and from this build; and
what this build does with FLASHATTN_DISABLE_FP8 (issue 14): FP8 calls raise an error naming
the flag when it is set, run on the CPU when it is not. CPU only, no second build (a CPU build
with FLASHATTN_DISABLE_FP8=1 was made by hand: it compiles, and there this file passes with
the error branch while tests/test_fp8.py skips, naming the flag)."""
import ast
import pathlib
import re

import pytest
import torch

import flashattn

ROOT = pathlib.Path(__file__).resolve().parent.parent


def setup_flags():
    """setup.py's FLAGS list, read without running setup()."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FLAGS"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no FLAGS list")


def test_fp8_flag_is_a_build_flag():
    assert "FLASHATTN_DISABLE_FP8" in setup_flags()


@pytest.mark.parametrize("flag", setup_flags())
def test_flag_plumbing(flag):
    """Each flag is a BUILD_CONFIG key (a bool), is documented in setup.py's docstring and the
    README's flag table, and (the DISABLE ones) is a macro the C++ sources test."""
    assert isinstance(flashattn.BUILD_CONFIG.get(flag), bool), f"BUILD_CONFIG lacks {flag}"
    doc = ast.get_docstring(ast.parse((ROOT / "setup.py").read_text()))
    # (=1 turns a flag on; a flag on by default, FLASHATTN_SPLIT_CUDA, is documented as =0)
    assert re.search(rf"^\s*{flag}=[01]\s", doc, re.M), f"setup.py's docstring does not list {flag}"
    readme = (ROOT / "README.md").read_text()
    assert f"`{flag}=1`" in readme or f"`{flag}=0`" in readme, f"the README does not list {flag}"
    if flag.startswith("FLASHATTN_DISABLE_"):
        sources = [p.read_text() for p in (ROOT / "csrc").rglob("*") if p.suffix in
                   (".h", ".cpp", ".cu", ".cuh")]
        assert any(re.search(rf"#\s*if(n?def|\s+!?defined\()\s*\(?{flag}\b", s) for s in sources), \
            f"no C++ source tests the macro {flag}"


def test_this_build_fp8():
    """FLASHATTN_DISABLE_FP8 set: every FP8 entry raises the named error; unset: the CPU runs
    FP8 (the numbers: tests/test_fp8.py)."""
    q = torch.randn(1, 5, 2, 16).to(torch.float8_e4m3fn)
    if flashattn.BUILD_CONFIG["FLASHATTN_DISABLE_FP8"]:
        msg = r"disabled in this build \(FLASHATTN_DISABLE_FP8=1\): this build has no FP8"
        for call in (lambda: flashattn.flash_attn_func(q, q, q),
                     lambda: flashattn.kernel_path(q, q, q),
                     lambda: flashattn.flash_attn_varlen_func(
                         q[0], q[0], q[0], *[torch.tensor([0, 5], dtype=torch.int32)] * 2, 5, 5)):
            with pytest.raises(RuntimeError, match=msg):
                call()
    else:
        out = flashattn.flash_attn_func(q, q, q)
        assert out.dtype == torch.bfloat16 and not out.isnan().any()
        assert flashattn.kernel_path(q, q, q) == "cpu"

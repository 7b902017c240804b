"""The GPU jobs select the CUDA tests with `-k cuda` (tools/device/build_test_call.sh,
tools/gpu_job.sh). A CUDA-only test whose id has no "cuda" in it is silently left out: three
FP8 tests were, until 2026-12-06, so their kernels' paths had never been checked against the
reference on a GPU. This file checks, on the CPU, that every test that skips without CUDA is
one `-k cuda` selects: it carries @pytest.mark.cuda (conftest.py registers it; -k matches
marker names), has parametrize ids that all say "cuda", takes the `device` parameter (ids
"cuda-..."), or lives in a module whose name has "cuda" in it."""
import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _is_cuda_skip(dec, src):
    """A decorator `pytest.mark.skipif(<something about CUDA>, ...)`."""
    if not isinstance(dec, ast.Call):
        return False
    name = ast.get_source_segment(src, dec.func) or ""
    return name.endswith("mark.skipif") and dec.args and \
        "cuda" in (ast.get_source_segment(src, dec.args[0]) or "")


def _cuda_ids(dec, src):
    """A `pytest.mark.parametrize(..., ids=...)` whose every id has "cuda" in it (a list of
    strings that all do, or an expression that writes it, e.g. lambda c: f"cuda-{...}")."""
    if not isinstance(dec, ast.Call) or \
            not (ast.get_source_segment(src, dec.func) or "").endswith("mark.parametrize"):
        return False
    for kw in dec.keywords:
        if kw.arg != "ids":
            continue
        if isinstance(kw.value, (ast.List, ast.Tuple)):
            return all(isinstance(e, ast.Constant) and "cuda" in str(e.value)
                       for e in kw.value.elts)
        return "cuda" in (ast.get_source_segment(src, kw.value) or "")
    return False


def _has_cuda_mark(fn, src):
    return any((ast.get_source_segment(src, d) or "").endswith("mark.cuda") or _cuda_ids(d, src)
               for d in fn.decorator_list)


def _calls_sm90_skip(fn):
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
               and n.func.id == "skip_unless_sm90" for n in ast.walk(fn))


def unselected_cuda_tests(src, module):
    """Names of the module's CUDA-only tests that `-k cuda` would not select."""
    if "cuda" in module:
        return []
    out = []
    for fn in ast.parse(src).body:
        if not isinstance(fn, ast.FunctionDef) or not fn.name.startswith("test_"):
            continue
        cuda_only = any(_is_cuda_skip(d, src) for d in fn.decorator_list) or _calls_sm90_skip(fn)
        params = {a.arg for a in fn.args.args}
        if cuda_only and not _has_cuda_mark(fn, src) and "device" not in params \
                and "cuda" not in fn.name:
            out.append(fn.name)
    return out


def test_every_cuda_only_test_is_selected_by_k_cuda():
    missing = {}
    for path in sorted(TESTS.glob("test_*.py")):
        names = unselected_cuda_tests(path.read_text(), path.stem)
        if names:
            missing[path.name] = names
    assert not missing, (f"CUDA-only tests that `-k cuda` leaves out (add @pytest.mark.cuda): "
                         f"{missing}")


@pytest.mark.parametrize("src,want", [
    ('import pytest\n@pytest.mark.skipif("cuda" not in DEVICES, reason="x")\n'
     'def test_a(c):\n    pass\n', ["test_a"]),
    ('import pytest\n@pytest.mark.cuda\n@pytest.mark.skipif(not torch.cuda.is_available(), '
     'reason="x")\ndef test_a(c):\n    pass\n', []),
    ('def test_b(c, monkeypatch):\n    skip_unless_sm90()\n', ["test_b"]),
    ('def test_b(device, c):\n    skip_unless_sm90()\n', []),
    ('def test_cuda_b(c):\n    skip_unless_sm90()\n', []),
    ('import pytest\n@pytest.mark.skipif(sys.platform == "win32", reason="x")\n'
     'def test_c():\n    pass\n', []),
    ('import pytest\n@pytest.mark.parametrize("c", [1], ids=lambda c: f"cuda-{c}")\n'
     'def test_d(c):\n    skip_unless_sm90()\n', []),
    ('import pytest\n@pytest.mark.parametrize("v", ["0", "1"], ids=["cuda-a", "b"])\n'
     'def test_e(v):\n    skip_unless_sm90()\n', ["test_e"]),
], ids=["skipif-unmarked", "skipif-marked", "sm90-unmarked", "device-param", "cuda-name",
        "other-skipif", "cuda-ids", "some-ids-without-cuda"])
def test_checker_finds_what_it_should(src, want):
    """The checker itself: it must flag an unmarked CUDA-only test and pass the others."""
    assert unselected_cuda_tests(src, "test_x") == want
